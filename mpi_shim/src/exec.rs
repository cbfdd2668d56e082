//! Carrying out a [`Plan`]: the `PMPI_` call on the program's buffers or on
//! staged copies, or gpucoll's call, blocking or as a request.

use crate::native;
use crate::plans::Plan;
use crate::requests;
use crate::staging;
use mpi_sys::{MPI_Comm, MPI_Request};
use std::ffi::{c_int, c_void};

/// Run a blocking collective. `pmpi` makes the `PMPI_` call on the buffers
/// it is given, in the order of `buffers` (the program's buffers).
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract).
pub unsafe fn blocking(
    call: &'static str,
    comm: MPI_Comm,
    plan: Plan,
    buffers: &[*mut c_void],
    pmpi: impl FnOnce(&[*mut c_void]) -> c_int,
) -> c_int {
    match plan {
        Plan::Pmpi => pmpi(buffers),
        Plan::Failed(code) => code,
        // SAFETY: forwarded from this function's contract.
        Plan::Native(n, coll, count) => unsafe { native::blocking(n, call, comm, coll, count) },
        // SAFETY: forwarded from this function's contract.
        Plan::Staged(device, regions) => unsafe {
            staging::run(device, comm, call, &regions, pmpi)
        },
    }
}

/// Start a nonblocking collective: `ipmpi` is the `PMPI_I*` call (host
/// memory), `pmpi` the blocking `PMPI_` call a staged call makes before
/// returning a completed request.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract), `request` writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn nonblocking(
    call: &'static str,
    comm: MPI_Comm,
    plan: Plan,
    buffers: &[*mut c_void],
    request: *mut MPI_Request,
    ipmpi: impl FnOnce(&[*mut c_void]) -> c_int,
    pmpi: impl FnOnce(&[*mut c_void]) -> c_int,
) -> c_int {
    match plan {
        Plan::Pmpi => ipmpi(buffers),
        Plan::Failed(code) => code,
        Plan::Native(n, coll, count) => {
            // SAFETY: forwarded from this function's contract.
            unsafe { native::nonblocking(n, call, comm, coll, count, request) }
        }
        Plan::Staged(device, regions) => {
            // SAFETY: forwarded from this function's contract.
            let code = unsafe { staging::run(device, comm, call, &regions, pmpi) };
            // SAFETY: `request` is writable.
            unsafe { requests::start_done(code, request) }
        }
    }
}
