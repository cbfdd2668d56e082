//! A staged nonblocking call in flight: the inner MPI request working on
//! the host copies, completed by the shim's completion calls
//! (`requests::Work`), which copy the results back before the
//! program's request completes.

use super::Copies;
use crate::errors;
use crate::requests::Work;
use mpi_sys::{MPI_Request, MPI_Status};
use std::any::Any;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

struct State {
    /// The inner MPI request (its handle's bits).
    inner: usize,
    copies: Option<Copies>,
    /// The arguments MPI got (arrays it may read until completion).
    args: Option<Box<dyn Any>>,
    status: MPI_Status,
    finished: bool,
}

impl Drop for State {
    fn drop(&mut self) {
        if !self.finished {
            // MPI may still use the copies and arrays: never free them
            // under MPI.
            std::mem::forget(self.copies.take());
            std::mem::forget(self.args.take());
        }
    }
}

/// The inner request and what it works on.
pub struct Pending {
    state: Mutex<State>,
    call: &'static str,
}

// SAFETY: the state (handles, host copies, argument arrays) is only used
// under the mutex, by whichever thread completes the request; MPI handles
// and host memory may be used from any thread the program's thread level
// allows to call MPI.
unsafe impl Send for Pending {}
// SAFETY: as above.
unsafe impl Sync for Pending {}

impl Pending {
    pub fn new<A: 'static>(
        inner: MPI_Request,
        copies: Copies,
        args: Box<A>,
        call: &'static str,
    ) -> Pending {
        Pending {
            state: Mutex::new(State {
                inner: inner.0 as usize,
                copies: Some(copies),
                args: Some(args),
                // SAFETY: MPI_Status is plain integers; zero is a valid value.
                status: unsafe { std::mem::zeroed() },
                finished: false,
            }),
            call,
        }
    }
}

impl Work for Pending {
    /// Whether the inner request completed (waiting for it with `wait`,
    /// which makes MPI progress); on completion the results are copied back
    /// and an error is stored in `code`.
    fn done(&self, wait: bool, code: &AtomicI32) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return true;
        }
        let mut req = MPI_Request(s.inner as *mut mpi_sys::ompi_request_t);
        // SAFETY: plain integers.
        let mut st: MPI_Status = unsafe { std::mem::zeroed() };
        let mut flag: c_int = 0;
        // SAFETY: the active request this call started, completed only
        // here (under the lock); valid out-pointers.
        let rc = unsafe {
            if wait {
                flag = 1;
                mpi_sys::PMPI_Wait(&mut req, &mut st)
            } else {
                mpi_sys::PMPI_Test(&mut req, &mut flag, &mut st)
            }
        };
        if rc != 0 {
            // An error completes the request.
            flag = 1;
        }
        if flag == 0 {
            return false;
        }
        s.finished = true;
        s.status = st;
        let mut result = rc;
        if let Some(mut copies) = s.copies.take() {
            if let Err(e) = copies.finish(rc == 0) {
                errors::log_failure(self.call, &e);
                if result == 0 {
                    result = mpi_sys::MPI_ERR_OTHER as c_int;
                }
            }
        }
        s.args = None;
        if result != 0 {
            code.store(result, Ordering::Relaxed);
        }
        true
    }

    /// Collectives cannot be cancelled: the request completes normally.
    fn cancel(&self) {}

    /// # Safety
    /// `status` is writable.
    unsafe fn fill(&self, status: *mut MPI_Status, code: c_int) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: writable per the contract.
        unsafe {
            *status = s.status;
            (*status).MPI_ERROR = code;
        }
    }
}
