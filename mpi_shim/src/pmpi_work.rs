//! A collective the shim handed to MPI in its nonblocking form, completed
//! through a shim request: its inner MPI request, the staged copies it
//! works on (copied back when it completes), and, on a guarded
//! communicator (`comms.rs`), the deadline its wait runs under.
//!
//! The deadline counts from the moment the program waits for the request
//! (`MPI_Wait` and the other blocking completion calls), as a blocking
//! call's does from its start: a program may legitimately leave a request
//! unfinished for as long as it likes before it waits.

use crate::comms::CommEntry;
use crate::deadline::{self, Unfinished};
use crate::errors;
use crate::requests::Work;
use crate::settings;
use crate::staging::Staged;
use mpi_sys::MPI_Request;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

struct State<const N: usize> {
    /// The inner MPI request (its handle's bits).
    inner: usize,
    staged: Option<Staged<N>>,
    finished: bool,
}

pub struct PmpiWork<const N: usize> {
    state: Mutex<State<N>>,
    call: &'static str,
    /// The communicator, when it is guarded.
    guard: Option<Arc<CommEntry>>,
}

impl<const N: usize> PmpiWork<N> {
    pub fn new(
        call: &'static str,
        inner: MPI_Request,
        staged: Option<Staged<N>>,
        guard: Option<Arc<CommEntry>>,
    ) -> PmpiWork<N> {
        PmpiWork {
            state: Mutex::new(State {
                inner: inner.0 as usize,
                staged,
                finished: false,
            }),
            call,
            guard,
        }
    }
}

impl<const N: usize> Drop for State<N> {
    fn drop(&mut self) {
        if !self.finished {
            // MPI may still write the copies: never free them under MPI.
            if let Some(s) = self.staged.take() {
                s.leak();
            }
        }
    }
}

impl<const N: usize> Work for PmpiWork<N> {
    fn done(&self, wait: bool, code: &AtomicI32) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return true;
        }
        let mut req = MPI_Request(s.inner as *mut mpi_sys::ompi_request_t);
        // SAFETY (each arm): the active inner request this work started,
        // completed only here, under the lock.
        let r = match (wait, &self.guard) {
            (false, _) => unsafe { deadline::test(&mut req) },
            (true, Some(_)) => Some(unsafe { deadline::wait(&mut req, settings::get().timeout) }),
            (true, None) => {
                let rc = unsafe { mpi_sys::PMPI_Wait(&mut req, mpi_sys::RSMPI_STATUS_IGNORE) };
                Some(if rc == 0 {
                    Ok(())
                } else {
                    Err(Unfinished::Mpi(rc))
                })
            }
        };
        let Some(r) = r else { return false };
        s.finished = true;
        let staged = s.staged.take();
        let result = match r {
            Ok(()) => match staged.map(|st| st.finish(true)) {
                Some(Err(e)) => {
                    errors::log_failure(self.call, &e);
                    mpi_sys::MPI_ERR_OTHER as c_int
                }
                _ => 0,
            },
            // A request that completed with an error no longer uses its
            // buffers.
            Err(Unfinished::Mpi(rc)) => {
                if let Some(st) = staged {
                    st.finish(false).ok();
                }
                rc
            }
            Err(Unfinished::TimedOut(waited)) => {
                if let Some(st) = staged {
                    st.leak();
                }
                let msg = deadline::timeout_message(self.call, waited);
                errors::log_failure(self.call, &msg);
                let code = mpi_sys::MPI_ERR_OTHER as c_int;
                match &self.guard {
                    Some(entry) => entry.fail(code, msg).code,
                    None => code,
                }
            }
        };
        if result != 0 {
            code.store(result, Ordering::Relaxed);
        }
        true
    }
}
