//! Waiting for the shim's device work without stalling MPI.
//!
//! A nonblocking gpucoll collective runs on the GPU and needs nothing from
//! MPI, but its peers may reach it only after an MPI operation that needs
//! this rank's MPI progress (an `MPI_Ibarrier` or an `MPI_Isend` this rank
//! started, on which a peer waits before it starts its part). MPI makes
//! progress only inside MPI calls, so a completion call that waits for
//! device work keeps MPI progressing meanwhile instead of blocking in the
//! driver: the wait cannot deadlock against this rank's other MPI work.

use crate::cuda::{CuResult, Event};
use std::ffi::c_int;

/// Give MPI a chance to progress outstanding operations (a probe matches
/// nothing and completes nothing the program started).
fn mpi_progress() {
    let mut flag: c_int = 0;
    // SAFETY: a valid out-pointer, MPI_STATUS_IGNORE, predefined handles;
    // called from inside a completion call, where the program's thread
    // may call MPI.
    unsafe {
        mpi_sys::PMPI_Iprobe(
            mpi_sys::RSMPI_ANY_SOURCE,
            mpi_sys::RSMPI_ANY_TAG,
            mpi_sys::RSMPI_COMM_WORLD,
            &mut flag,
            mpi_sys::RSMPI_STATUS_IGNORE,
        );
    }
}

/// Wait until the work before `ev` finished, making MPI progress.
pub fn wait_for(ev: &Event) -> CuResult<()> {
    while !ev.is_done()? {
        mpi_progress();
        std::thread::yield_now();
    }
    Ok(())
}
