//! Point-to-point on device memory over an MPI that knows nothing about
//! GPUs: the message itself goes through MPI (so MPI's matching rules,
//! truncation, `MPI_PROC_NULL` and the wire format stay MPI's), and only its
//! bytes are staged through host memory: a send copies the type's true
//! extent span to pinned memory and sends from there; a receive posts into
//! a staged copy of its span and copies it back once MPI completed it.
//!
//! A receive copies its span in before posting, so the bytes a short (or
//! truncated) message does not reach, and a derived type's gaps, come back
//! unchanged. Host buffers go to `PMPI_` untouched, except in host test
//! mode (`GPUCOLL_SHIM_HOST=1`), where they are staged through plain host
//! memory as if they were device memory, so the staging runs without a GPU.
//!
//! Nonblocking calls return a shim request (`requests::start_p2p`) that
//! wraps the inner MPI request; the completion calls finish it (copy back,
//! staging buffer returned) before MPI completes the shim request.

mod exports;

use crate::cuda::{self, CtxGuard};
use crate::errors;
use crate::requests::HostWork;
use crate::route;
use crate::settings;
use crate::staging::{self, Span};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request, MPI_Status};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

const TRUNCATE: c_int = mpi_sys::MPI_ERR_TRUNCATE as c_int;

/// A buffer the shim stages: the program's address, the bytes its
/// (count, datatype) touch, and the GPU it lives on (`None`: host test mode).
pub struct Staged {
    base: usize,
    span: Span,
    device: Option<i32>,
}

/// The host copy of a staged buffer.
pub enum Buf {
    Pinned(cuda::Pinned),
    /// Host test mode; u64 words keep MPI's unpacking aligned.
    Host(Vec<u64>),
}

impl Buf {
    fn ptr(&self) -> *mut c_void {
        match self {
            Buf::Pinned(p) => p.ptr(),
            Buf::Host(v) => v.as_ptr() as *mut c_void,
        }
    }
}

impl Staged {
    fn len(&self) -> usize {
        (self.span.hi - self.span.lo) as usize
    }

    fn user(&self) -> *mut c_void {
        (self.base as *mut c_void).wrapping_byte_offset(self.span.lo)
    }

    /// The address MPI gets: the host copy, shifted as the program's
    /// address is relative to its span.
    fn host(&self, b: &Buf) -> *mut c_void {
        b.ptr().wrapping_byte_offset(-self.span.lo)
    }

    fn bind(&self) -> cuda::CuResult<Option<CtxGuard>> {
        self.device.map(CtxGuard::bind).transpose()
    }

    /// A host copy of the span, filled from the program's buffer.
    fn take_in(&self) -> cuda::CuResult<Buf> {
        let len = self.len();
        match self.device {
            None => {
                let v = vec![0u64; len.div_ceil(8)];
                // SAFETY: the program's buffer spans `len` bytes from
                // `user()` (MPI's contract); `v` holds at least `len`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.user() as *const u8,
                        v.as_ptr() as *mut u8,
                        len,
                    )
                };
                Ok(Buf::Host(v))
            }
            Some(_) => {
                let _g = self.bind()?;
                let p = cuda::take_pinned(len)?;
                // SAFETY: `user()` spans `len` device bytes (MPI's contract),
                // the pinned buffer at least `len` host bytes.
                if let Err(e) = unsafe { cuda::copy_to_host(p.ptr(), self.user(), len) } {
                    cuda::give_pinned(p);
                    return Err(e);
                }
                Ok(Buf::Pinned(p))
            }
        }
    }

    /// Copy the host copy back into the program's buffer.
    fn copy_out(&self, b: &Buf) -> cuda::CuResult<()> {
        let len = self.len();
        match b {
            // SAFETY: as in `take_in`, the other way.
            Buf::Host(v) => unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, self.user() as *mut u8, len);
                Ok(())
            },
            Buf::Pinned(p) => {
                let _g = self.bind()?;
                // SAFETY: as in `take_in`, the other way.
                unsafe { cuda::copy_to_device(self.user(), p.ptr(), len) }
            }
        }
    }

    fn give(&self, b: Buf) {
        if let Buf::Pinned(p) = b {
            cuda::give_pinned(p);
        }
    }
}

/// Where one buffer of a point-to-point call goes.
pub enum Plan {
    Pmpi,
    Staged(Staged),
    Failed(c_int),
}

/// Decide for one buffer of `count` elements of `dt` exchanged with `peer`.
pub fn plan(
    call: &str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
) -> Plan {
    // SAFETY: reading a link-time MPI constant.
    let proc_null = unsafe { mpi_sys::RSMPI_PROC_NULL };
    if !settings::active() || buf.is_null() || count <= 0 || peer == proc_null {
        return Plan::Pmpi;
    }
    let device = cuda::device_of(buf);
    if device.is_none() && !settings::get().host_mode {
        return Plan::Pmpi;
    }
    match staging::span(count, dt) {
        Err(code) => Plan::Failed(errors::raise(comm, code)),
        Ok(span) if span.hi <= span.lo => Plan::Pmpi,
        Ok(span) => {
            if settings::get().log {
                let why = match device {
                    Some(d) => format!("device {d}"),
                    None => "host memory, test mode".into(),
                };
                route::log(call, "staged", &why);
            }
            Plan::Staged(Staged {
                base: buf as usize,
                span,
                device,
            })
        }
    }
}

/// A staged buffer and its host copy, for the duration of one call.
pub type Held = Option<(Staged, Buf)>;

/// Stage one buffer for a call: the address MPI gets, and what to undo.
pub fn enter(
    call: &str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
) -> Result<(*mut c_void, Held), c_int> {
    match plan(call, buf, count, dt, peer, comm) {
        Plan::Pmpi => Ok((buf.cast_mut(), None)),
        Plan::Failed(code) => Err(code),
        Plan::Staged(s) => match s.take_in() {
            Ok(b) => Ok((s.host(&b), Some((s, b)))),
            Err(e) => Err(errors::fail(comm, call, &gpucoll::Error::Backend(e))),
        },
    }
}

/// End a call's staging: copy back (`write_back`), return the host copy.
/// 0, or the error raised.
pub fn leave(call: &str, comm: MPI_Comm, held: Held, write_back: bool) -> c_int {
    let Some((s, b)) = held else { return 0 };
    let r = if write_back { s.copy_out(&b) } else { Ok(()) };
    s.give(b);
    match r {
        Ok(()) => 0,
        Err(e) => errors::fail(comm, call, &gpucoll::Error::Backend(e)),
    }
}

/// Whether a receive's MPI result leaves data to copy back.
pub fn received(rc: c_int) -> bool {
    rc == 0 || rc == TRUNCATE
}

struct State {
    /// The inner MPI request (its handle's bits).
    inner: usize,
    held: Held,
    write_back: bool,
    status: MPI_Status,
    finished: bool,
}

impl Drop for State {
    fn drop(&mut self) {
        if !self.finished {
            // MPI may still write the host copy: never free it under MPI.
            if let Some(h) = self.held.take() {
                std::mem::forget(h);
            }
        }
    }
}

/// A nonblocking staged transfer: the inner MPI request and the host copy
/// it works on.
pub struct Transfer {
    state: Mutex<State>,
    call: &'static str,
}

impl Transfer {
    fn new(inner: MPI_Request, held: Held, write_back: bool, call: &'static str) -> Transfer {
        Transfer {
            state: Mutex::new(State {
                inner: inner.0 as usize,
                held,
                write_back,
                // SAFETY: MPI_Status is plain integers; zero is a valid value.
                status: unsafe { std::mem::zeroed() },
                finished: false,
            }),
            call,
        }
    }
}

impl HostWork for Transfer {
    /// Whether the inner request completed (waiting for it with `wait`);
    /// on completion the data is copied back and an error stored in `code`.
    fn done(&self, wait: bool, code: &AtomicI32) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return true;
        }
        let mut req = MPI_Request(s.inner as *mut mpi_sys::ompi_request_t);
        // SAFETY: plain integers.
        let mut st: MPI_Status = unsafe { std::mem::zeroed() };
        let mut flag: c_int = 0;
        // SAFETY: an active request started by this transfer, completed
        // only here (under the lock); valid out-pointers.
        let rc = unsafe {
            if wait {
                flag = 1;
                mpi_sys::PMPI_Wait(&mut req, &mut st)
            } else {
                mpi_sys::PMPI_Test(&mut req, &mut flag, &mut st)
            }
        };
        if rc != 0 {
            // An error completes the request (MPI freed it or reported it).
            flag = 1;
        }
        if flag == 0 {
            return false;
        }
        s.finished = true;
        s.status = st;
        let mut cancelled: c_int = 0;
        // SAFETY: a status MPI just wrote; a local out-pointer.
        if rc == 0 && unsafe { mpi_sys::PMPI_Test_cancelled(&st, &mut cancelled) } != 0 {
            cancelled = 0;
        }
        let mut result = rc;
        if let Some((staged, b)) = s.held.take() {
            // A cancelled receive wrote nothing: the program's buffer stays
            // as it was.
            if s.write_back && received(rc) && cancelled == 0 {
                if let Err(e) = staged.copy_out(&b) {
                    errors::log_failure(self.call, &e);
                    if result == 0 {
                        result = mpi_sys::MPI_ERR_OTHER as c_int;
                    }
                }
            }
            staged.give(b);
        }
        if result != 0 {
            code.store(result, Ordering::Relaxed);
        }
        true
    }

    /// Cancel the inner request unless it completed. Under the state's
    /// lock, so the handle is never used after `done` released it (a
    /// thread blocked in `done` on the same request holds the lock until
    /// its wait ends).
    fn cancel(&self) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return;
        }
        let mut req = MPI_Request(s.inner as *mut mpi_sys::ompi_request_t);
        // SAFETY: the active inner request started by this transfer, not
        // completed (checked under the lock).
        let rc = unsafe { mpi_sys::PMPI_Cancel(&mut req) };
        if rc != 0 {
            errors::log_failure(
                self.call,
                &format!("MPI_Cancel of the staged request: error {rc}"),
            );
        }
    }

    /// The completed inner request's status, as the shim request's.
    ///
    /// # Safety
    /// `status` is writable.
    unsafe fn fill(&self, status: *mut MPI_Status, code: c_int) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: writable per the contract; the whole struct, so the
        // element count (Get_count/Get_elements) is MPI's own.
        unsafe {
            *status = s.status;
            (*status).MPI_ERROR = code;
        }
    }
}

/// Start a nonblocking staged call: `post` gets the address MPI should use
/// and the inner request to fill. `write_back`: a receive.
///
/// # Safety
/// The program's arguments are valid (MPI's contract); `request` writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn nonblocking(
    call: &'static str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
    write_back: bool,
    request: *mut MPI_Request,
    post: impl FnOnce(*mut c_void, *mut MPI_Request) -> c_int,
) -> c_int {
    let (ptr, held) = match enter(call, buf, count, dt, peer, comm) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if held.is_none() {
        return post(ptr, request);
    }
    let mut inner = MPI_Request(std::ptr::null_mut());
    let rc = post(ptr, &mut inner);
    if rc != 0 {
        leave(call, comm, held, false);
        return rc;
    }
    // SAFETY: `request` is writable (the caller's contract).
    unsafe {
        crate::requests::start_p2p(
            Box::new(Transfer::new(inner, held, write_back, call)),
            call,
            request,
        )
    }
}
