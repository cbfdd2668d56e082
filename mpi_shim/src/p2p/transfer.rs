//! A nonblocking staged transfer: the inner MPI request works on the host
//! copy; the program holds a shim request (`requests::start_work`) that the
//! completion calls finish (inner request completed, data copied back, host
//! copy returned) before MPI completes it. `MPI_Cancel` of the shim request
//! cancels the inner one; its status, the shim request's, says whether MPI
//! could.

use super::{back_of, enter, leave, Back, Dir, Held};
use crate::errors;
use crate::requests::Work;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request, MPI_Status};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

struct State {
    /// The inner MPI request (its handle's bits).
    inner: usize,
    held: Held,
    dir: Dir,
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

pub struct Transfer {
    state: Mutex<State>,
    call: &'static str,
}

impl Transfer {
    fn new(inner: MPI_Request, held: Held, dir: Dir, call: &'static str) -> Transfer {
        Transfer {
            state: Mutex::new(State {
                inner: inner.0 as usize,
                held,
                dir,
                status: super::empty_status(),
                finished: false,
            }),
            call,
        }
    }
}

impl Work for Transfer {
    /// Whether the inner request completed (waiting for it with `wait`);
    /// on completion the data is copied back and an error stored in `code`.
    fn done(&self, wait: bool, code: &AtomicI32) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return true;
        }
        let mut req = MPI_Request(s.inner as *mut mpi_sys::ompi_request_t);
        let mut st = super::empty_status();
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
        // A cancelled receive wrote nothing: the program's buffer stays as
        // it was.
        let back = if s.dir == Dir::Send || cancelled != 0 {
            Back::Nothing
        } else {
            back_of(&s.held, rc, &st)
        };
        let mut result = rc;
        if let Some((staged, b)) = s.held.take() {
            if let Err(e) = staged.copy_out(&b, back) {
                errors::log_failure(self.call, &e);
                if result == 0 {
                    result = mpi_sys::MPI_ERR_OTHER as c_int;
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
        // element count (Get_count/Get_elements) and the cancelled flag are
        // MPI's own.
        unsafe {
            *status = s.status;
            (*status).MPI_ERROR = code;
        }
    }
}

/// Start a nonblocking staged call moving the buffer's bytes `dir`: `post`
/// gets the address MPI should use and the inner request to fill.
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
    dir: Dir,
    request: *mut MPI_Request,
    post: impl FnOnce(*mut c_void, *mut MPI_Request) -> c_int,
) -> c_int {
    let null = || {
        if !request.is_null() {
            // SAFETY: `request` is writable (the caller's contract).
            unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        }
    };
    crate::errors::guarded(call, comm, null, || {
        crate::settings::maybe_panic(call);
        let rc = match enter(call, buf, count, dt, peer, comm, dir) {
            Err(code) => code,
            Ok((ptr, None)) => post(ptr, request),
            Ok((ptr, held)) => {
                let mut inner = MPI_Request(std::ptr::null_mut());
                let rc = post(ptr, &mut inner);
                if rc != 0 {
                    leave(call, comm, held, Back::Nothing);
                    rc
                } else {
                    // SAFETY: `request` is writable (the caller's contract).
                    unsafe {
                        crate::requests::start_work(
                            Box::new(Transfer::new(inner, held, dir, call)),
                            request,
                        )
                    }
                }
            }
        };
        // A failed start leaves no request behind (MPI's rule for an
        // erroneous call under a returning error handler).
        if rc != 0 && !request.is_null() {
            // SAFETY: `request` is writable (the caller's contract).
            unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        }
        rc
    })
}
