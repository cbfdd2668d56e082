//! Staging for the calls gpucoll's engine has no form of (`MPI_Scan`,
//! `MPI_Alltoallw`, the neighbourhood collectives, the nonblocking v-forms,
//! `MPI_Reduce_local`, `MPI_Pack` ...): the bytes each buffer argument may
//! touch are copied to host memory, the `PMPI_` call gets addresses rebased
//! into the copies, and what MPI wrote is copied back, after a blocking
//! call returns or when a nonblocking one completes (`work.rs`, through the
//! shim's request machinery).
//!
//! A buffer is staged when it is device memory, and in host test mode
//! (`GPUCOLL_SHIM_HOST=1`) when it is host memory too (through plain host
//! memory), so every staged path runs without a GPU.
//!
//! What is copied: the span of a buffer's true extent (`staging::Span`),
//! gaps included. A receive span is copied in first unless MPI writes every
//! byte of it, so that the gaps of a derived type, and blocks MPI leaves
//! alone, come back unchanged. A buffer with blocks at byte displacements
//! of their own datatypes (the w-forms) at `MPI_BOTTOM` is copied block by
//! block (blocks whose spans overlap or touch share one copy), since its
//! blocks may lie in different allocations; a block whose copy is not at
//! the same shift as the others is handed to MPI as a struct datatype that
//! places it there (`Copies::wrap`).

mod wform;
mod work;

pub use wform::{stage_side, Displ, WSide};

use crate::cuda::{self, CtxGuard};
use crate::errors;
use crate::handles::is_in_place;
use crate::requests;
use crate::route;
use crate::settings;
use crate::staging::{self, Span};
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Datatype, MPI_Request};
use std::ffi::{c_int, c_void};

/// Copies keep the program's alignment modulo this many bytes.
const ALIGN: usize = 64;

/// The host memory of one copy.
enum Buf {
    Pinned(cuda::Pinned),
    /// Host test mode.
    Host(Vec<u64>),
}

impl Buf {
    fn base(&self) -> *mut c_void {
        match self {
            Buf::Pinned(p) => p.ptr(),
            Buf::Host(v) => v.as_ptr() as *mut c_void,
        }
    }
}

/// One contiguous range of the program's memory and its host copy.
struct Copy {
    /// The range's first byte in the program's memory.
    user: usize,
    len: usize,
    /// Its GPU (`None`: host memory, host test mode).
    device: Option<i32>,
    buf: Option<Buf>,
    /// MPI writes it: copied back.
    write: bool,
}

impl Copy {
    /// Where the range's first byte is in the copy (same alignment modulo
    /// [`ALIGN`] as in the program's memory).
    fn host(&self) -> usize {
        let b = self.buf.as_ref().map_or(0, |b| b.base() as usize);
        b + self.user % ALIGN
    }

    fn bind(&self) -> Result<Option<CtxGuard>, String> {
        self.device.map(CtxGuard::bind).transpose()
    }

    /// Allocate the copy, filled from the program's memory when `fill`.
    fn make(user: usize, len: usize, device: Option<i32>, fill: bool) -> Result<Copy, String> {
        let mut c = Copy {
            user,
            len,
            device,
            buf: None,
            write: false,
        };
        let room = len + ALIGN;
        match device {
            None => {
                c.buf = Some(Buf::Host(vec![0u64; room.div_ceil(8)]));
                if fill {
                    // SAFETY: the program's range spans `len` bytes (MPI's
                    // contract on the call's buffers); the copy holds
                    // `len + ALIGN` bytes from its base.
                    unsafe {
                        std::ptr::copy_nonoverlapping(user as *const u8, c.host() as *mut u8, len)
                    };
                }
            }
            Some(_) => {
                let _g = c.bind()?;
                c.buf = Some(Buf::Pinned(cuda::take_pinned(room)?));
                if fill {
                    // SAFETY: as above, the range in device memory.
                    unsafe {
                        cuda::copy_to_host(c.host() as *mut c_void, user as *const c_void, len)?
                    };
                }
            }
        }
        Ok(c)
    }

    /// Copy the host copy back into the program's memory.
    fn copy_back(&self) -> Result<(), String> {
        match self.device {
            None => {
                // SAFETY: as in `make`, the other way.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.host() as *const u8,
                        self.user as *mut u8,
                        self.len,
                    )
                };
                Ok(())
            }
            Some(_) => {
                let _g = self.bind()?;
                // SAFETY: as in `make`, the other way.
                unsafe {
                    cuda::copy_to_device(
                        self.user as *mut c_void,
                        self.host() as *const c_void,
                        self.len,
                    )
                }
            }
        }
    }

    fn release(&mut self) {
        if let Some(Buf::Pinned(p)) = self.buf.take() {
            cuda::give_pinned(p);
        }
    }
}

/// `MPI_DATATYPE_NULL` has no layout to ask MPI for (the question alone
/// raises an error on `MPI_COMM_WORLD`): its buffer is not staged, and the
/// `PMPI_` call reports the type on the call's communicator.
fn is_null_type(dt: MPI_Datatype) -> bool {
    // SAFETY: reading an immutable handle constant.
    dt == unsafe { mpi_sys::RSMPI_DATATYPE_NULL }
}

/// Whether the memory at `p` is staged, and where: `Some(Some(gpu))` device
/// memory, `Some(None)` host memory in host test mode, `None` not staged.
fn target(p: usize) -> Option<Option<i32>> {
    if let Some(d) = cuda::device_of(p as *const c_void) {
        return Some(Some(d));
    }
    settings::get().host_mode.then_some(None)
}

/// A block of a buffer at a byte displacement with its own datatype (the
/// w-forms): its span relative to `base + displ`.
#[derive(Clone, Copy)]
pub struct Block {
    pub displ: isize,
    pub span: Span,
}

impl Block {
    fn lo(&self) -> isize {
        self.displ.wrapping_add(self.span.lo)
    }
    fn hi(&self) -> isize {
        self.displ.wrapping_add(self.span.hi)
    }
    fn is_empty(&self) -> bool {
        self.span.hi <= self.span.lo
    }
}

/// Where the blocks of a w-form buffer are for MPI.
pub enum Rebase {
    /// The program's buffer (nothing staged).
    Same,
    /// Every block at one shift: MPI gets this base address instead.
    Base(*mut c_void),
    /// An `MPI_BOTTOM` buffer whose blocks were copied apart: the shift of
    /// each block's copy (`None`: left in place), see [`Copies::wrap`].
    PerBlock(Vec<Option<isize>>),
}

/// The host copies of one call, and the datatypes made for it.
pub struct Copies {
    call: &'static str,
    /// Where staging errors are raised (a communicator handle's bits).
    comm: usize,
    list: Vec<Copy>,
    /// Datatypes made by [`Copies::wrap`], freed at the end.
    types: Vec<usize>,
}

impl Copies {
    fn new(call: &'static str, comm: MPI_Comm) -> Copies {
        Copies {
            call,
            comm: comm.0 as usize,
            list: Vec::new(),
            types: Vec::new(),
        }
    }

    fn comm(&self) -> MPI_Comm {
        MPI_Comm(self.comm as *mut mpi_sys::ompi_communicator_t)
    }

    /// The error of a failed copy, raised on the call's communicator.
    fn fail(&self, msg: String) -> c_int {
        errors::fail(self.comm(), self.call, &gpucoll::Error::Backend(msg))
    }

    fn add(
        &mut self,
        user: usize,
        len: usize,
        device: Option<i32>,
        fill: bool,
        write: bool,
    ) -> Result<usize, c_int> {
        match Copy::make(user, len, device, fill) {
            Ok(mut c) => {
                c.write = write;
                let host = c.host();
                self.list.push(c);
                Ok(host)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Stage the bytes `span` of a buffer at `base` (a program address,
    /// `MPI_BOTTOM` with absolute spans, or `MPI_IN_PLACE`): the address MPI
    /// gets for `base`. MPI reads the buffer when `read`, writes it when
    /// `write`. Empty spans, `MPI_IN_PLACE` and memory that is not staged
    /// pass unchanged.
    pub fn span(
        &mut self,
        base: *const c_void,
        span: Span,
        read: bool,
        write: bool,
    ) -> Result<*mut c_void, c_int> {
        if span.hi <= span.lo || is_in_place(base) {
            return Ok(base.cast_mut());
        }
        let first = (base as usize).wrapping_add_signed(span.lo);
        // A program pointer is classified itself (a span may start before
        // it, a negative lower bound); MPI_BOTTOM by the span's first byte.
        let probe = if base.is_null() { first } else { base as usize };
        let Some(device) = target(probe) else {
            return Ok(base.cast_mut());
        };
        let len = (span.hi - span.lo) as usize;
        let fill = read || (write && !span.dense);
        let host = self.add(first, len, device, fill, write)?;
        Ok((host as *mut c_void).wrapping_byte_offset(-span.lo))
    }

    /// Stage the blocks of a w-form buffer at `base`: a program buffer as
    /// one span over all its blocks, an `MPI_BOTTOM` buffer block by block
    /// (see the module's doc). `dense`: MPI writes every byte of a block
    /// whose own span is dense.
    pub fn blocks(
        &mut self,
        base: *const c_void,
        blocks: &[Block],
        read: bool,
        write: bool,
    ) -> Result<Rebase, c_int> {
        let used: Vec<&Block> = blocks.iter().filter(|b| !b.is_empty()).collect();
        if used.is_empty() || is_in_place(base) {
            return Ok(Rebase::Same);
        }
        if !base.is_null() {
            let lo = used.iter().map(|b| b.lo()).min().unwrap_or(0);
            let hi = used.iter().map(|b| b.hi()).max().unwrap_or(0);
            let dense = used.len() == 1 && used[0].span.dense;
            let p = self.span(base, Span { lo, hi, dense }, read, write)?;
            return Ok(if std::ptr::eq(p, base) {
                Rebase::Same
            } else {
                Rebase::Base(p)
            });
        }
        // MPI_BOTTOM: clusters of overlapping or touching blocks.
        let mut order: Vec<usize> = (0..blocks.len())
            .filter(|&i| !blocks[i].is_empty())
            .collect();
        order.sort_by_key(|&i| blocks[i].lo());
        let mut shifts: Vec<Option<isize>> = vec![None; blocks.len()];
        let mut clusters = 0usize;
        let mut staged_all = true;
        let mut k = 0;
        while k < order.len() {
            let (lo, mut hi) = (blocks[order[k]].lo(), blocks[order[k]].hi());
            let mut end = k + 1;
            while end < order.len() && blocks[order[end]].lo() <= hi {
                hi = hi.max(blocks[order[end]].hi());
                end += 1;
            }
            clusters += 1;
            let members = &order[k..end];
            let dense = members.len() == 1 && blocks[members[0]].span.dense;
            if let Some(device) = target(lo as usize) {
                let fill = read || (write && !dense);
                let host = self.add(lo as usize, (hi - lo) as usize, device, fill, write)?;
                let shift = (host as isize).wrapping_sub(lo);
                for &i in members {
                    shifts[i] = Some(shift);
                }
            } else {
                staged_all = false;
            }
            k = end;
        }
        let first = shifts.iter().flatten().next().copied();
        Ok(match first {
            None => Rebase::Same,
            Some(shift) if clusters == 1 && staged_all => {
                Rebase::Base(std::ptr::null_mut::<c_void>().wrapping_byte_offset(shift))
            }
            Some(_) => Rebase::PerBlock(shifts),
        })
    }

    /// A datatype that is `count` elements of `dt` moved by `shift` bytes
    /// (a struct of one block), committed, freed when the call ends: a
    /// block whose copy is elsewhere than the buffer's other blocks is sent
    /// or received as one element of it (the same type signature).
    pub fn wrap(
        &mut self,
        count: c_int,
        dt: MPI_Datatype,
        shift: isize,
    ) -> Result<MPI_Datatype, c_int> {
        let mut t = MPI_Datatype(std::ptr::null_mut());
        let lens = [count];
        let displs: [MPI_Aint; 1] = [shift as MPI_Aint];
        let types = [dt];
        // SAFETY: one-entry arrays and a valid out-pointer; `dt` is a type
        // MPI accepted for the span computation.
        let rc = unsafe {
            match mpi_sys::PMPI_Type_create_struct(
                1,
                lens.as_ptr(),
                displs.as_ptr(),
                types.as_ptr(),
                &mut t,
            ) {
                0 => mpi_sys::PMPI_Type_commit(&mut t),
                rc => rc,
            }
        };
        if rc != 0 {
            return Err(errors::raise(self.comm(), rc));
        }
        self.types.push(t.0 as usize);
        Ok(t)
    }

    /// The bytes of `count` elements of `dt` (errors raised on the call's
    /// communicator).
    pub fn type_span(&self, count: i64, dt: MPI_Datatype) -> Result<Span, c_int> {
        if is_null_type(dt) {
            return Ok(Span::EMPTY);
        }
        staging::span(count, dt).map_err(|code| errors::raise(self.comm(), code))
    }

    /// The bytes of blocks `counts[i]` at element displacements `displs[i]`
    /// of `dt`, `n` of each (null arrays: none).
    ///
    /// # Safety
    /// Non-null arrays hold `n` entries.
    pub unsafe fn type_span_v(
        &self,
        counts: *const c_int,
        displs: *const c_int,
        n: usize,
        dt: MPI_Datatype,
    ) -> Result<Span, c_int> {
        if is_null_type(dt) {
            return Ok(Span::EMPTY);
        }
        // SAFETY: per the contract.
        unsafe { staging::span_v(counts, displs, n, dt) }
            .map_err(|code| errors::raise(self.comm(), code))
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The GPU of the copies, for the log (`None`: host test mode).
    fn device(&self) -> Option<i32> {
        self.list.iter().find_map(|c| c.device)
    }

    /// End the call: copy back what MPI wrote (when `ok`), return the host
    /// memory and free the datatypes made for it. The first failure.
    fn finish(&mut self, ok: bool) -> Result<(), String> {
        let mut result = Ok(());
        for c in &mut self.list {
            if ok && c.write {
                if let Err(e) = c.copy_back() {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
            c.release();
        }
        self.list.clear();
        for t in self.types.drain(..) {
            let mut t = MPI_Datatype(t as *mut mpi_sys::ompi_datatype_t);
            // SAFETY: a datatype this call made and committed, freed once.
            unsafe { mpi_sys::PMPI_Type_free(&mut t) };
        }
        result
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        // A failed preparation: nothing was handed to MPI.
        let _ = self.finish(false);
    }
}

/// How a call the shim may stage starts.
enum Start {
    Pmpi,
    Stage,
    Failed(c_int),
}

/// Whether any of `bases` may need staging: device memory, host test mode,
/// or `MPI_BOTTOM` (whose blocks are found from the datatypes).
fn wanted(bases: &[*const c_void]) -> bool {
    settings::get().host_mode
        || bases
            .iter()
            .any(|&p| p.is_null() || (!is_in_place(p) && cuda::device_of(p).is_some()))
}

/// What a staged call runs on.
#[derive(Clone, Copy)]
pub enum Scope {
    /// A collective on this communicator: a null one goes to MPI as it is,
    /// an intercommunicator with device buffers is refused (staging would
    /// need the remote group's layouts).
    Collective(MPI_Comm),
    /// A local call; staging errors are raised on this communicator.
    Local(MPI_Comm),
}

impl Scope {
    /// A local call without a communicator of its own (`MPI_Reduce_local`,
    /// the external pack calls): errors go to `MPI_COMM_WORLD`, as Open MPI
    /// reports theirs.
    pub fn world() -> Scope {
        // SAFETY: reading an immutable handle constant.
        Scope::Local(unsafe { mpi_sys::RSMPI_COMM_WORLD })
    }

    fn comm(self) -> MPI_Comm {
        match self {
            Scope::Collective(c) | Scope::Local(c) => c,
        }
    }
}

fn start(call: &'static str, scope: Scope, bases: &[*const c_void]) -> Start {
    let comm = match scope {
        Scope::Collective(c) => Some(c),
        Scope::Local(_) => None,
    };
    if let Some(c) = comm {
        // SAFETY: reading an immutable handle constant.
        if c == unsafe { mpi_sys::RSMPI_COMM_NULL } {
            route::log(call, "pmpi", "null communicator");
            return Start::Pmpi;
        }
    }
    if !wanted(bases) {
        route::log(call, "pmpi", "host memory");
        return Start::Pmpi;
    }
    if let Some(c) = comm {
        let mut inter: c_int = 0;
        // SAFETY: a valid out-pointer; MPI validates the handle.
        if unsafe { mpi_sys::PMPI_Comm_test_inter(c, &mut inter) } != 0 {
            route::log(call, "pmpi", "communicator rejected by MPI");
            return Start::Pmpi;
        }
        if inter != 0 {
            let device = bases
                .iter()
                .any(|&p| !is_in_place(p) && cuda::device_of(p).is_some());
            if !device {
                route::log(call, "pmpi", "intercommunicator");
                return Start::Pmpi;
            }
            errors::log_failure(
                call,
                "device buffers on an intercommunicator are not supported by gpucoll_mpi",
            );
            return Start::Failed(errors::raise(c, mpi_sys::MPI_ERR_COMM as c_int));
        }
    }
    Start::Stage
}

/// Run a call that is staged wherever its buffers need it: `bases` are its
/// buffer arguments (for the quick look at where they are), `scope` what
/// it runs on,
/// `request` the program's request (`None`: a blocking call). `args` are
/// the `PMPI_` call's arguments as the program gave them; `prepare` stages
/// the buffers into `Copies` and returns the arguments with the staged
/// addresses; `pmpi` makes the call (with the inner request of a
/// nonblocking one). Nothing staged: the `PMPI_` call gets the program's
/// arguments and request.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract); `request`, when
/// given, is writable. Pointers in what `prepare` returns that point into
/// it point into heap memory it owns (it is moved into the request of a
/// nonblocking call).
pub unsafe fn call<A: 'static>(
    name: &'static str,
    scope: Scope,
    bases: &[*const c_void],
    request: Option<*mut MPI_Request>,
    args: A,
    prepare: impl FnOnce(&mut Copies, A) -> Result<A, c_int>,
    pmpi: impl FnOnce(&A, *mut MPI_Request) -> c_int,
) -> c_int {
    let fail = |code: c_int| {
        if let Some(r) = request.filter(|r| !r.is_null()) {
            // SAFETY: writable per the contract.
            unsafe { *r = mpi_sys::RSMPI_REQUEST_NULL };
        }
        code
    };
    let own = request.unwrap_or(std::ptr::null_mut());
    match start(name, scope, bases) {
        Start::Failed(code) => return fail(code),
        Start::Pmpi => return pmpi(&args, own),
        Start::Stage => {}
    }
    let mut copies = Copies::new(name, scope.comm());
    let args = match prepare(&mut copies, args) {
        Ok(a) => Box::new(a),
        Err(code) => return fail(code),
    };
    if copies.is_empty() {
        let why = if settings::get().host_mode {
            "nothing to stage"
        } else {
            "host memory"
        };
        route::log(name, "pmpi", why);
        return pmpi(&args, own);
    }
    if settings::get().log {
        let why = match copies.device() {
            Some(d) => format!("device {d}"),
            None => "host memory, test mode".into(),
        };
        route::log(name, "staged", &why);
    }
    let Some(request) = request else {
        let rc = pmpi(&args, std::ptr::null_mut());
        let undo = match copies.finish(rc == 0) {
            Ok(()) => 0,
            Err(e) => copies.fail(e),
        };
        return if rc != 0 { rc } else { undo };
    };
    // SAFETY: reading an immutable handle constant.
    let mut inner = unsafe { mpi_sys::RSMPI_REQUEST_NULL };
    let rc = pmpi(&args, &mut inner);
    if rc != 0 {
        let _ = copies.finish(false);
        return fail(rc);
    }
    let work = work::Pending::new(inner, copies, args, name);
    // SAFETY: `request` is writable (the contract).
    unsafe { requests::start_work(Box::new(work), request) }
}
