//! The calls of `collectives/` that gpucoll's engine may take: gpucoll's
//! plan first (made by `plans`, as for the blocking forms), and whatever it
//! leaves to MPI staged where the buffers need it (`stage::call`), so a
//! nonblocking staged call completes through the shim's requests.

use crate::native;
use crate::plans::Plan;
use mpi_sys::{MPI_Comm, MPI_Request};
use std::ffi::c_int;

/// Run `plan` (`None`: the call has no engine form) on gpucoll when it is
/// native; otherwise `staged()`. `request`: the program's request of a
/// nonblocking call.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract); `request`, when
/// given, is writable.
pub unsafe fn engine_or_staged(
    call: &'static str,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
    plan: Option<Plan<2>>,
    staged: impl FnOnce() -> c_int,
) -> c_int {
    match plan {
        Some(Plan::Native(n, coll, count)) => match request {
            // SAFETY: forwarded from this function's contract.
            None => unsafe { native::blocking(n, call, comm, coll, count) },
            // SAFETY: forwarded from this function's contract.
            Some(r) => unsafe { native::nonblocking(n, call, comm, coll, count, r) },
        },
        Some(Plan::Failed(code)) => no_request(request, code),
        _ => staged(),
    }
}

/// A call that failed before it started leaves no request (MPI's rule
/// for an erroneous call under a returning error handler): `code`.
pub fn no_request(request: Option<*mut MPI_Request>, code: c_int) -> c_int {
    if let Some(r) = request.filter(|r| !r.is_null()) {
        // SAFETY: the program's request argument, writable (MPI's contract).
        unsafe { *r = mpi_sys::RSMPI_REQUEST_NULL };
    }
    code
}
