//! `MPI_IN_PLACE` where MPI does not allow it (as a receive buffer, at a
//! rank whose role has no in-place form, in a neighbourhood collective).
//!
//! Open MPI checks most such calls itself, before it touches a buffer
//! (`MPI_ERR_BUFFER` for `MPI_Allreduce`, `MPI_ERR_ARG` for the others):
//! those calls go to `PMPI_` unchanged, so the program gets Open MPI's own
//! error; gpucoll or staging would take the sentinel for an address (a
//! write to address 1). Where Open MPI has no check and dereferences the
//! sentinel itself (`MPI_Exscan`'s receive buffer, `MPI_Reduce_local`,
//! `MPI_Pack`, `MPI_Unpack` and their external forms), the shim returns
//! `MPI_ERR_BUFFER` instead.

use crate::errors;
use crate::handles::is_in_place;
use crate::route;
use mpi_sys::MPI_Comm;
use std::ffi::{c_int, c_void};

/// Whether one of `buffers` (the positions where MPI does not allow
/// `MPI_IN_PLACE` in this call, at this rank) is `MPI_IN_PLACE`: the call
/// then goes to `PMPI_`, whose argument check reports it.
pub fn misplaced(call: &str, buffers: &[*const c_void]) -> bool {
    let bad = buffers.iter().any(|&p| is_in_place(p));
    if bad {
        route::log(call, "pmpi", "MPI_IN_PLACE where MPI does not allow it");
    }
    bad
}

/// As [`misplaced`], for the calls Open MPI does not check: the error is
/// raised on `comm` here (`None`: a local call, `MPI_COMM_WORLD`).
pub fn refused(call: &str, comm: Option<MPI_Comm>, buffers: &[*const c_void]) -> Option<c_int> {
    if !buffers.iter().any(|&p| is_in_place(p)) {
        return None;
    }
    tracing::warn!(
        call,
        "MPI_IN_PLACE where MPI does not allow it: MPI_ERR_BUFFER"
    );
    route::log(call, "refused", "MPI_IN_PLACE where MPI does not allow it");
    // SAFETY: reading an immutable handle constant.
    let comm = comm.unwrap_or(unsafe { mpi_sys::RSMPI_COMM_WORLD });
    Some(errors::raise(comm, mpi_sys::MPI_ERR_BUFFER as c_int))
}
