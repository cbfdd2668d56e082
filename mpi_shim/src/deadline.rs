//! Waiting for an MPI request no longer than `GPUCOLL_TIMEOUT`.
//!
//! MPI has no timeouts: a rank whose peers never make the matching call
//! waits in `MPI_Wait` forever. Where the shim hands a collective to MPI on
//! a communicator whose peers may have gone to gpucoll instead (and the
//! handshake that creates a gpucoll communicator), it starts the
//! nonblocking form and polls it here, so that a mismatch ends in an error
//! on this rank too, as it does on the gpucoll side.

use mpi_sys::MPI_Request;
use std::ffi::c_int;
use std::time::{Duration, Instant};

/// How a wait ended without the request completing normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfinished {
    /// MPI returned this error code (the request completed with it).
    Mpi(c_int),
    /// The deadline passed: the request is still active and was leaked,
    /// with whatever memory MPI may still write.
    TimedOut(Duration),
}

/// Poll back-off by how long the wait has lasted: busy-poll first, as MPI's
/// own blocking waits do (yielding the core there loses it to other
/// processes for far longer than a small collective takes), then yield,
/// and sleep in short steps only once the wait has lasted a second (a slow
/// peer: no core burnt for minutes).
pub fn backoff(waited: Duration) {
    if waited < Duration::from_millis(10) {
        std::hint::spin_loop();
    } else if waited < Duration::from_secs(1) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Test `request` once: `Some(Ok)` when it completed, `Some(Err)` on an
/// MPI error, `None` while it runs.
///
/// # Safety
/// `request` is an active request of this process.
pub unsafe fn test(request: &mut MPI_Request) -> Option<Result<(), Unfinished>> {
    let mut flag: c_int = 0;
    // SAFETY: an active request (the caller's contract); valid out-pointers.
    let rc = unsafe { mpi_sys::PMPI_Test(request, &mut flag, mpi_sys::RSMPI_STATUS_IGNORE) };
    if rc != 0 {
        return Some(Err(Unfinished::Mpi(rc)));
    }
    (flag != 0).then_some(Ok(()))
}

/// Wait for `request` at most `timeout`. On `TimedOut` the request stays
/// active: the caller must keep every buffer it uses alive forever.
///
/// # Safety
/// `request` is an active request of this process.
pub unsafe fn wait(request: &mut MPI_Request, timeout: Duration) -> Result<(), Unfinished> {
    let start = Instant::now();
    loop {
        // SAFETY: still active (the caller's contract; not completed yet).
        if let Some(r) = unsafe { test(request) } {
            return r;
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Unfinished::TimedOut(waited));
        }
        backoff(waited);
    }
}

/// Why a collective did not complete in time, for the error message.
pub fn timeout_message(call: &str, waited: Duration) -> String {
    format!(
        "{call} did not complete within GPUCOLL_TIMEOUT ({:.1} s): not every rank of the \
         communicator made a matching call. Ranks that pass host memory where others pass \
         device memory (or a type, count, root or op gpucoll takes where others pass one it \
         does not) go different ways; every rank must make the same call",
        waited.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_say_what_to_fix() {
        let m = timeout_message("MPI_Bcast", Duration::from_millis(3040));
        assert!(m.starts_with("MPI_Bcast did not complete"));
        assert!(m.contains("(3.0 s)") && m.contains("host memory"));
    }
}
