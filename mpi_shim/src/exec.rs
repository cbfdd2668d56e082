//! Carrying out a [`Plan`]: the `PMPI_` call on the program's buffers or on
//! staged copies, or gpucoll's call, blocking or as a request.
//!
//! `pmpi` (and `ipmpi`) make the `PMPI_` call on the `N` buffers they are
//! given, in the order of `buffers` (the program's buffers, or their staged
//! copies). With the shim off (`GPUCOLL_SHIM=0`) no plan is made.

use crate::native;
use crate::plans::Plan;
use crate::requests;
use crate::settings;
use crate::staging;
use mpi_sys::{MPI_Comm, MPI_Request};
use std::ffi::{c_int, c_void};

/// Run a blocking collective.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract).
pub unsafe fn blocking<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*mut c_void; N],
    plan: impl FnOnce() -> Plan<N>,
    pmpi: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    if !settings::active() {
        return pmpi(buffers);
    }
    match plan() {
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
pub unsafe fn nonblocking<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*mut c_void; N],
    request: *mut MPI_Request,
    plan: impl FnOnce() -> Plan<N>,
    ipmpi: impl FnOnce([*mut c_void; N]) -> c_int,
    pmpi: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    if !settings::active() {
        return ipmpi(buffers);
    }
    let code = match plan() {
        Plan::Pmpi => return ipmpi(buffers),
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
    };
    // A failed start leaves no request behind (MPI's rule for an erroneous
    // call under a returning error handler); a program that waits on it
    // then waits on MPI_REQUEST_NULL instead of an unset handle.
    if code != 0 && !request.is_null() {
        // SAFETY: `request` is writable (this function's contract).
        unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
    }
    code
}
