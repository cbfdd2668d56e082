//! Open MPI's Fortran argument conventions, turned into C ones.
//!
//! Every Fortran argument arrives by reference. Handles are `MPI_Fint` indices that
//! `PMPI_*_f2c` turns into C handles (`use mpi_f08` passes `TYPE(MPI_Comm)` etc., one
//! integer each, so the same pointer works); `ierror` is `OPTIONAL` in `use mpi_f08`
//! and then a null pointer; a `LOGICAL` is a 4-byte integer with `.TRUE.` = 1 (Open
//! MPI's `Fort logical value true`); a status is `MPI_F_STATUS_SIZE` integers in both
//! bindings. The Fortran sentinels (`MPI_IN_PLACE`, `MPI_BOTTOM`,
//! `MPI_STATUS_IGNORE`, `MPI_STATUSES_IGNORE`) are the addresses of symbols that libmpi
//! defines (`mpi_fortran_in_place_` ...). They are looked up at run time, once, instead
//! of being linked against, so the shim still loads into C and Python programs.
//!
//! This module follows Open MPI's ABI only: MPICH's Fortran wrappers call the C
//! `MPI_*` functions themselves, so there the C layer already sees Fortran calls.

use std::ffi::{c_int, c_void, CString};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::OnceLock;

use mpi_sys as ffi;

/// Fortran's default `INTEGER`, the type of every Fortran handle and count.
pub(crate) type Fint = ffi::RSMPI_Fint;

/// The C `MPI_BOTTOM` of Open MPI and MPICH alike.
const C_BOTTOM: *mut c_void = ptr::null_mut();

/// `MPI_STATUS_SIZE` of the Fortran bindings: Open MPI lays a C status out as
/// whole `int`s, and `PMPI_Status_c2f` copies exactly that many.
pub(crate) const F_STATUS_SIZE: usize =
    std::mem::size_of::<ffi::MPI_Status>() / std::mem::size_of::<Fint>();

/// Fortran `.TRUE.` of Open MPI built with gfortran (`ompi_info`: "Fort logical value
/// true: 1").
const F_TRUE: Fint = 1;

/// The addresses of the Fortran sentinel symbols, each under every mangling the
/// Fortran compiler may have given it (usually one of them exists).
struct Sentinels {
    in_place: Vec<usize>,
    bottom: Vec<usize>,
    status_ignore: Vec<usize>,
    statuses_ignore: Vec<usize>,
}

impl Sentinels {
    fn lookup() -> Self {
        let found = Sentinels {
            in_place: symbol_addresses("mpi_fortran_in_place"),
            bottom: symbol_addresses("mpi_fortran_bottom"),
            status_ignore: symbol_addresses("mpi_fortran_status_ignore"),
            statuses_ignore: symbol_addresses("mpi_fortran_statuses_ignore"),
        };
        if found.in_place.is_empty() || found.status_ignore.is_empty() {
            tracing::warn!(
                target: "gpucoll_mpi::fortran",
                "Open MPI's Fortran sentinel symbols (mpi_fortran_in_place_ ...) are not \
                 loaded: Fortran MPI_IN_PLACE and MPI_STATUS_IGNORE will not be recognised"
            );
        }
        found
    }
}

/// Where the dynamic linker resolved `base` (with `_`, without, with `__`, and in
/// upper case): the definition every library and the program itself bind to.
fn symbol_addresses(base: &str) -> Vec<usize> {
    let names = [
        format!("{base}_"),
        base.to_owned(),
        format!("{base}__"),
        base.to_uppercase(),
    ];
    let mut found = Vec::new();
    for name in names {
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the
        // symbol tables of the objects already loaded.
        let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, cname.as_ptr()) } as usize;
        if address != 0 && !found.contains(&address) {
            found.push(address);
        }
    }
    found
}

fn sentinels() -> &'static Sentinels {
    static SENTINELS: OnceLock<Sentinels> = OnceLock::new();
    SENTINELS.get_or_init(Sentinels::lookup)
}

/// A Fortran buffer argument as C sees it: the sentinels become C's `MPI_IN_PLACE`
/// and `MPI_BOTTOM`, every other address is passed on unchanged.
pub(crate) fn buffer(address: *mut c_void) -> *mut c_void {
    let sentinels = sentinels();
    let key = address as usize;
    if sentinels.in_place.contains(&key) {
        crate::handles::in_place()
    } else if sentinels.bottom.contains(&key) {
        C_BOTTOM
    } else {
        address
    }
}

/// Whether a Fortran status argument is `MPI_STATUS_IGNORE`.
pub(crate) fn is_status_ignore(status: *const Fint) -> bool {
    sentinels().status_ignore.contains(&(status as usize))
}

/// Whether a Fortran status array argument is `MPI_STATUSES_IGNORE`.
pub(crate) fn is_statuses_ignore(statuses: *const Fint) -> bool {
    sentinels().statuses_ignore.contains(&(statuses as usize))
}

/// Stores a return code in the optional `ierror` argument.
///
/// # Safety
/// `ierror` is null or points to a writable Fortran `INTEGER`.
pub(crate) unsafe fn set_ierror(ierror: *mut Fint, code: c_int) {
    if !ierror.is_null() {
        // SAFETY: non-null, and the caller guarantees it is a writable INTEGER.
        unsafe { *ierror = code };
    }
}

/// A binding's last argument, where a caught panic stores its error code:
/// `IERROR` (an `INTEGER`), or, for bindings with `CHARACTER` arguments,
/// the hidden length Fortran passes after `IERROR`, which has no room for a
/// code (the error still goes to `MPI_COMM_WORLD`'s handler).
pub(crate) trait LastArg {
    /// # Safety
    /// An `IERROR` pointer is null or points to a writable `INTEGER`.
    unsafe fn store_error(self, code: c_int);
}

impl LastArg for *mut Fint {
    unsafe fn store_error(self, code: c_int) {
        // SAFETY: forwarded from this function's contract.
        unsafe { set_ierror(self, code) }
    }
}

impl LastArg for usize {
    unsafe fn store_error(self, _code: c_int) {}
}

/// A Fortran `LOGICAL` from a C flag.
pub(crate) fn logical(flag: c_int) -> Fint {
    if flag != 0 {
        F_TRUE
    } else {
        0
    }
}

/// A C status to fill in (all fields zero until MPI writes them).
pub(crate) fn empty_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers, for which all-zero is valid.
    unsafe { MaybeUninit::<ffi::MPI_Status>::zeroed().assume_init() }
}

/// Copies a C status into a Fortran status unless that is `MPI_STATUS_IGNORE`.
///
/// # Safety
/// `f_status` is `MPI_STATUS_IGNORE` or points to `F_STATUS_SIZE` writable integers.
pub(crate) unsafe fn store_status(c_status: &ffi::MPI_Status, f_status: *mut Fint) {
    if !f_status.is_null() && !is_status_ignore(f_status) {
        // SAFETY: the caller guarantees F_STATUS_SIZE writable integers, exactly what
        // PMPI_Status_c2f writes.
        unsafe { ffi::PMPI_Status_c2f(c_status, f_status) };
    }
}

/// Reports an invalid Fortran request handle the way MPI reports argument errors
/// outside a communicator: through `MPI_COMM_WORLD`'s error handler.
pub(crate) fn invalid_request() -> c_int {
    let code = ffi::MPI_ERR_REQUEST as c_int;
    tracing::warn!(target: "gpucoll_mpi::fortran", "invalid Fortran request handle");
    // SAFETY: RSMPI_COMM_WORLD is a valid communicator after MPI_Init; calling its error
    // handler with a predefined class has no other precondition.
    unsafe { ffi::PMPI_Comm_call_errhandler(ffi::RSMPI_COMM_WORLD, code) };
    code
}

/// Reports a negative request count (Fortran passes it as given).
pub(crate) fn invalid_count() -> c_int {
    let code = ffi::MPI_ERR_ARG as c_int;
    tracing::warn!(target: "gpucoll_mpi::fortran", "negative request count");
    // SAFETY: as in `invalid_request`.
    unsafe { ffi::PMPI_Comm_call_errhandler(ffi::RSMPI_COMM_WORLD, code) };
    code
}

/// The C request of a Fortran request handle; `None` for an index Open MPI does not
/// know (its `PMPI_Request_f2c` returns a null pointer then).
pub(crate) fn request_f2c(handle: Fint) -> Option<ffi::MPI_Request> {
    // SAFETY: PMPI_Request_f2c only looks the index up in Open MPI's table.
    let request = unsafe { ffi::PMPI_Request_f2c(handle) };
    (!request.0.is_null()).then_some(request)
}

/// The Fortran handle of a C request (`MPI_REQUEST_NULL` maps to Fortran's).
pub(crate) fn request_c2f(request: ffi::MPI_Request) -> Fint {
    // SAFETY: `request` came from MPI (a live request or MPI_REQUEST_NULL).
    unsafe { ffi::PMPI_Request_c2f(request) }
}

/// C handles of Fortran handle arguments.
///
/// # Safety
/// Each pointer points to a readable Fortran `INTEGER` (Fortran passes every
/// argument by reference).
pub(crate) unsafe fn comm(handle: *const Fint) -> ffi::MPI_Comm {
    // SAFETY: per the function's contract; f2c only looks the index up.
    unsafe { ffi::PMPI_Comm_f2c(*handle) }
}

/// # Safety
/// As for [`comm`].
pub(crate) unsafe fn datatype(handle: *const Fint) -> ffi::MPI_Datatype {
    // SAFETY: per the function's contract; f2c only looks the index up.
    unsafe { ffi::PMPI_Type_f2c(*handle) }
}

/// # Safety
/// As for [`comm`].
pub(crate) unsafe fn op(handle: *const Fint) -> ffi::MPI_Op {
    // SAFETY: per the function's contract; f2c only looks the index up.
    unsafe { ffi::PMPI_Op_f2c(*handle) }
}
