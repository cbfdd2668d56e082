//! `MPI_WAIT*`, `MPI_TEST*`, `MPI_REQUEST_FREE` and `MPI_CANCEL` from Fortran.
//!
//! They go through the shim's C completion functions, which complete the shim's own
//! requests and pass ordinary ones to `PMPI_*`. Request arrays are converted to C
//! handles before the call and every handle is written back after it (a completed
//! request becomes `MPI_REQUEST_NULL`); returned indices are 1-based in Fortran.

use std::ffi::c_int;
use std::slice;

use mpi_sys as ffi;

use super::handles::{
    empty_status, invalid_count, invalid_request, is_status_ignore, is_statuses_ignore, logical,
    request_c2f, request_f2c, set_ierror, store_status, Fint, F_STATUS_SIZE,
};

/// A Fortran request array and the C requests made of it.
struct Requests {
    fortran: *mut Fint,
    c: Vec<ffi::MPI_Request>,
}

impl Requests {
    /// # Safety
    /// `count` points to an `INTEGER`; `requests` to that many `INTEGER`s when it is
    /// positive.
    unsafe fn new(count: *const Fint, requests: *mut Fint) -> Result<Self, c_int> {
        // SAFETY: per the function's contract.
        let count = unsafe { *count };
        let Ok(len) = usize::try_from(count) else {
            return Err(invalid_count());
        };
        let fortran: &[Fint] = if len == 0 {
            &[]
        } else {
            // SAFETY: a positive count means the array has `len` INTEGERs.
            unsafe { slice::from_raw_parts(requests, len) }
        };
        let c = fortran
            .iter()
            .map(|&handle| request_f2c(handle).ok_or_else(invalid_request))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Requests {
            fortran: requests,
            c,
        })
    }

    /// Runs `c_call` on the C requests of a Fortran request array (their
    /// count and address), then stores every handle back into the array (a
    /// completed request becomes `MPI_REQUEST_NULL`). Returns the call's code,
    /// or the error of an invalid array.
    ///
    /// # Safety
    /// As for [`Requests::new`].
    unsafe fn around(
        count: *const Fint,
        requests: *mut Fint,
        c_call: impl FnOnce(c_int, *mut ffi::MPI_Request) -> c_int,
    ) -> c_int {
        // SAFETY: per the function's contract.
        let mut c_requests = match unsafe { Self::new(count, requests) } {
            Ok(c_requests) => c_requests,
            Err(code) => return code,
        };
        // The length came from a non-negative c_int.
        let code = c_call(c_requests.c.len() as c_int, c_requests.c.as_mut_ptr());
        for (i, &request) in c_requests.c.iter().enumerate() {
            // SAFETY: `new` read `c.len()` handles from this array, so it has room.
            unsafe { *c_requests.fortran.add(i) = request_c2f(request) };
        }
        code
    }
}

/// A Fortran status array (or `MPI_STATUSES_IGNORE`) and the C statuses for it.
struct Statuses {
    fortran: *mut Fint,
    c: Option<Vec<ffi::MPI_Status>>,
}

impl Statuses {
    fn new(statuses: *mut Fint, count: usize) -> Self {
        let c = (!is_statuses_ignore(statuses) && !statuses.is_null())
            .then(|| vec![empty_status(); count]);
        Statuses {
            fortran: statuses,
            c,
        }
    }

    fn as_c(&mut self) -> *mut ffi::MPI_Status {
        match &mut self.c {
            Some(statuses) => statuses.as_mut_ptr(),
            // SAFETY: reading an immutable extern constant of mpi-sys.
            None => unsafe { ffi::RSMPI_STATUSES_IGNORE },
        }
    }

    /// Copies the first `count` C statuses into the Fortran array.
    ///
    /// # Safety
    /// The Fortran array holds at least `count` statuses (`count` ≤ the request count).
    unsafe fn store(&self, count: usize) {
        let Some(statuses) = &self.c else {
            return;
        };
        for (i, status) in statuses.iter().take(count).enumerate() {
            // SAFETY: status i of the Fortran array starts F_STATUS_SIZE * i integers in.
            unsafe { ffi::PMPI_Status_c2f(status, self.fortran.add(i * F_STATUS_SIZE)) };
        }
    }
}

/// The C pointer for a single Fortran status argument.
fn status_target(f_status: *const Fint, local: &mut ffi::MPI_Status) -> *mut ffi::MPI_Status {
    if is_status_ignore(f_status) {
        // SAFETY: reading an immutable extern constant of mpi-sys.
        unsafe { ffi::RSMPI_STATUS_IGNORE }
    } else {
        local
    }
}

/// A C index (0-based or `MPI_UNDEFINED`) as Fortran's (1-based or `MPI_UNDEFINED`).
fn fortran_index(index: c_int) -> Fint {
    if index == ffi::MPI_UNDEFINED || index < 0 {
        index
    } else {
        index + 1
    }
}

/// Where a call reports whether it completed: `MPI_TEST*` into the Fortran
/// `FLAG`; `MPI_WAIT*` (`None`) has no flag, its call completes.
type Flag = Option<*mut Fint>;

/// Stores the C flag into `flag` (a test) and says whether the call
/// completed, so that statuses are stored.
///
/// # Safety
/// `flag`, if given, points to a writable `LOGICAL`.
unsafe fn completed(flag: Flag, c_flag: c_int) -> bool {
    if let Some(flag) = flag {
        // SAFETY: per the function's contract.
        unsafe { *flag = logical(c_flag) };
    }
    c_flag != 0
}

/// The shared body of `MPI_WAIT` and `MPI_TEST` (`c_call` gets the C
/// request, flag and status).
///
/// # Safety
/// Fortran arguments of either function: request, flag and status by
/// reference; `ierror` null or an `INTEGER`.
unsafe fn one(
    c_call: impl FnOnce(*mut ffi::MPI_Request, *mut c_int, *mut ffi::MPI_Status) -> c_int,
    request: *mut Fint,
    flag: Flag,
    status: *mut Fint,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        let Some(mut c_request) = request_f2c(*request) else {
            return set_ierror(ierror, invalid_request());
        };
        // A wait leaves the flag set: it returns once the request completed.
        let mut c_flag = 1;
        let mut c_status = empty_status();
        let code = c_call(
            &mut c_request,
            &mut c_flag,
            status_target(status, &mut c_status),
        );
        *request = request_c2f(c_request);
        if completed(flag, c_flag) {
            store_status(&c_status, status);
        }
        set_ierror(ierror, code);
    }
}

/// The shared body of `MPI_WAITALL` and `MPI_TESTALL` (`c_call` gets the
/// count, the C requests, the flag and the statuses).
///
/// # Safety
/// Fortran arguments of either function: count (and flag) by reference,
/// arrays of `count` requests and statuses (or `MPI_STATUSES_IGNORE`).
unsafe fn all(
    c_call: impl FnOnce(c_int, *mut ffi::MPI_Request, *mut c_int, *mut ffi::MPI_Status) -> c_int,
    count: *const Fint,
    requests: *mut Fint,
    flag: Flag,
    statuses: *mut Fint,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        let code = Requests::around(count, requests, |n, c_requests| {
            let mut c_statuses = Statuses::new(statuses, n as usize);
            let mut c_flag = 1;
            let code = c_call(n, c_requests, &mut c_flag, c_statuses.as_c());
            if completed(flag, c_flag) {
                c_statuses.store(n as usize);
            }
            code
        });
        set_ierror(ierror, code);
    }
}

/// The shared body of `MPI_WAITANY` and `MPI_TESTANY` (`c_call` gets the
/// count, the C requests, the index, the flag and the status).
///
/// # Safety
/// Fortran arguments of either function: count, index (flag) and status by
/// reference and an array of `count` requests.
unsafe fn any(
    c_call: impl FnOnce(
        c_int,
        *mut ffi::MPI_Request,
        *mut c_int,
        *mut c_int,
        *mut ffi::MPI_Status,
    ) -> c_int,
    count: *const Fint,
    requests: *mut Fint,
    index: *mut Fint,
    flag: Flag,
    status: *mut Fint,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        let code = Requests::around(count, requests, |n, c_requests| {
            let mut c_index = ffi::MPI_UNDEFINED;
            let mut c_flag = 1;
            let mut c_status = empty_status();
            let target = status_target(status, &mut c_status);
            let code = c_call(n, c_requests, &mut c_index, &mut c_flag, target);
            *index = fortran_index(c_index);
            if completed(flag, c_flag) {
                store_status(&c_status, status);
            }
            code
        });
        set_ierror(ierror, code);
    }
}

fortran_binding! {
    /// `MPI_WAIT(REQUEST, STATUS, IERROR)`.
    fn wait(request: *mut Fint, status: *mut Fint, ierror: *mut Fint)
        as "MPI_WAIT", "mpi_wait", "MPI_Wait"
    {
        // SAFETY: the Fortran arguments of MPI_WAIT, as `one` requires.
        unsafe { one(|r, _, s| ffi::MPI_Wait(r, s), request, None, status, ierror) }
    }
}

fortran_binding! {
    /// `MPI_TEST(REQUEST, FLAG, STATUS, IERROR)`.
    fn test(request: *mut Fint, flag: *mut Fint, status: *mut Fint, ierror: *mut Fint)
        as "MPI_TEST", "mpi_test", "MPI_Test"
    {
        // SAFETY: the Fortran arguments of MPI_TEST, as `one` requires.
        unsafe { one(|r, f, s| ffi::MPI_Test(r, f, s), request, Some(flag), status, ierror) }
    }
}

fortran_binding! {
    /// `MPI_WAITALL(COUNT, ARRAY_OF_REQUESTS, ARRAY_OF_STATUSES, IERROR)`.
    fn waitall(count: *const Fint, requests: *mut Fint, statuses: *mut Fint, ierror: *mut Fint)
        as "MPI_WAITALL", "mpi_waitall", "MPI_Waitall"
    {
        // SAFETY: the Fortran arguments of MPI_WAITALL, as `all` requires.
        unsafe {
            let waitall = |n, r, _, s| ffi::MPI_Waitall(n, r, s);
            all(waitall, count, requests, None, statuses, ierror)
        }
    }
}

fortran_binding! {
    /// `MPI_TESTALL(COUNT, ARRAY_OF_REQUESTS, FLAG, ARRAY_OF_STATUSES, IERROR)`.
    fn testall(
        count: *const Fint,
        requests: *mut Fint,
        flag: *mut Fint,
        statuses: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_TESTALL", "mpi_testall", "MPI_Testall" {
        // SAFETY: the Fortran arguments of MPI_TESTALL, as `all` requires.
        unsafe {
            let testall = |n, r, f, s| ffi::MPI_Testall(n, r, f, s);
            all(testall, count, requests, Some(flag), statuses, ierror)
        }
    }
}

fortran_binding! {
    /// `MPI_WAITANY(COUNT, ARRAY_OF_REQUESTS, INDEX, STATUS, IERROR)`.
    fn waitany(
        count: *const Fint,
        requests: *mut Fint,
        index: *mut Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_WAITANY", "mpi_waitany", "MPI_Waitany" {
        // SAFETY: the Fortran arguments of MPI_WAITANY, as `any` requires.
        unsafe {
            let waitany = |n, r, i, _, s| ffi::MPI_Waitany(n, r, i, s);
            any(waitany, count, requests, index, None, status, ierror)
        }
    }
}

fortran_binding! {
    /// `MPI_TESTANY(COUNT, ARRAY_OF_REQUESTS, INDEX, FLAG, STATUS, IERROR)`.
    fn testany(
        count: *const Fint,
        requests: *mut Fint,
        index: *mut Fint,
        flag: *mut Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_TESTANY", "mpi_testany", "MPI_Testany" {
        // SAFETY: the Fortran arguments of MPI_TESTANY, as `any` requires.
        unsafe {
            let testany = |n, r, i, f, s| ffi::MPI_Testany(n, r, i, f, s);
            any(testany, count, requests, index, Some(flag), status, ierror)
        }
    }
}

/// The shared body of `MPI_WAITSOME` and `MPI_TESTSOME`, which differ only in the C
/// function called.
///
/// # Safety
/// Fortran arguments of either function: `incount` and `outcount` by reference, arrays
/// of `incount` requests, indices and statuses (or `MPI_STATUSES_IGNORE`).
unsafe fn some(
    c_function: unsafe extern "C" fn(
        c_int,
        *mut ffi::MPI_Request,
        *mut c_int,
        *mut c_int,
        *mut ffi::MPI_Status,
    ) -> c_int,
    incount: *const Fint,
    requests: *mut Fint,
    outcount: *mut Fint,
    indices: *mut Fint,
    statuses: *mut Fint,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        let code = Requests::around(incount, requests, |n, c_requests| {
            let len = n as usize;
            let mut c_statuses = Statuses::new(statuses, len);
            let mut c_indices: Vec<c_int> = vec![0; len];
            let mut c_outcount = ffi::MPI_UNDEFINED;
            let code = c_function(
                n,
                c_requests,
                &mut c_outcount,
                c_indices.as_mut_ptr(),
                c_statuses.as_c(),
            );
            *outcount = c_outcount;
            let done = usize::try_from(c_outcount).unwrap_or(0).min(len);
            for (i, &c_index) in c_indices.iter().take(done).enumerate() {
                *indices.add(i) = fortran_index(c_index);
            }
            c_statuses.store(done);
            code
        });
        set_ierror(ierror, code);
    }
}

/// `MPI_WAITSOME` and `MPI_TESTSOME`, each `(INCOUNT, ARRAY_OF_REQUESTS,
/// OUTCOUNT, ARRAY_OF_INDICES, ARRAY_OF_STATUSES, IERROR)`: `some` with the
/// C function `$c`.
macro_rules! some_bindings {
    ($($name:ident => $c:ident as $upper:literal, $lower:literal, $mixed:literal;)+) => {$(
        fortran_binding! {
            fn $name(
                incount: *const Fint,
                requests: *mut Fint,
                outcount: *mut Fint,
                indices: *mut Fint,
                statuses: *mut Fint,
                ierror: *mut Fint,
            ) as $upper, $lower, $mixed {
                // SAFETY: the Fortran arguments of the function, as `some` requires.
                unsafe { some(ffi::$c, incount, requests, outcount, indices, statuses, ierror) }
            }
        }
    )+};
}

some_bindings! {
    waitsome => MPI_Waitsome as "MPI_WAITSOME", "mpi_waitsome", "MPI_Waitsome";
    testsome => MPI_Testsome as "MPI_TESTSOME", "mpi_testsome", "MPI_Testsome";
}

/// The shared body of `MPI_REQUEST_FREE` and `MPI_CANCEL`: `c_call` on the
/// C request, whose handle is stored back where `write_back` (a freed request
/// becomes `MPI_REQUEST_NULL`; a cancelled one stays as it is).
///
/// # Safety
/// `request` points to an `INTEGER`, writable where `write_back`; `ierror`
/// is null or a writable `INTEGER`.
unsafe fn on_request(
    c_call: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    request: *mut Fint,
    write_back: bool,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        let Some(mut c_request) = request_f2c(*request) else {
            return set_ierror(ierror, invalid_request());
        };
        let code = c_call(&mut c_request);
        if write_back {
            *request = request_c2f(c_request);
        }
        set_ierror(ierror, code);
    }
}

fortran_binding! {
    /// `MPI_REQUEST_FREE(REQUEST, IERROR)`.
    fn request_free(request: *mut Fint, ierror: *mut Fint)
        as "MPI_REQUEST_FREE", "mpi_request_free", "MPI_Request_free"
    {
        // SAFETY: the Fortran arguments of MPI_REQUEST_FREE, as `on_request` requires.
        unsafe { on_request(|r| ffi::MPI_Request_free(r), request, true, ierror) }
    }
}

fortran_binding! {
    /// `MPI_CANCEL(REQUEST, IERROR)`: the request stays valid until completed or freed.
    fn cancel(request: *const Fint, ierror: *mut Fint)
        as "MPI_CANCEL", "mpi_cancel", "MPI_Cancel"
    {
        // SAFETY: the Fortran arguments of MPI_CANCEL, as `on_request` requires (the
        // request is only read).
        unsafe { on_request(|r| ffi::MPI_Cancel(r), request.cast_mut(), false, ierror) }
    }
}
