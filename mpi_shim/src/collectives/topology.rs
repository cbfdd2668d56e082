//! The neighbours of a process topology: how many blocks the send and
//! receive buffers of a neighbourhood collective hold.

use mpi_sys::MPI_Comm;
use std::ffi::c_int;

/// Blocks of a neighbourhood collective: one per source (receive side) and
/// one per destination (send side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Degrees {
    pub sources: usize,
    pub destinations: usize,
}

/// The degrees of `comm`'s topology; `None` when it has none or MPI rejects
/// it (the call then goes to `PMPI_`, which reports it).
pub fn degrees(comm: MPI_Comm) -> Option<Degrees> {
    // SAFETY: reading an immutable handle constant.
    if comm == unsafe { mpi_sys::RSMPI_COMM_NULL } {
        return None;
    }
    let mut kind: c_int = 0;
    // SAFETY: a valid out-pointer; MPI validates the handle.
    if unsafe { mpi_sys::PMPI_Topo_test(comm, &mut kind) } != 0 {
        return None;
    }
    let both = |n: c_int| {
        let n = usize::try_from(n).ok()?;
        Some(Degrees {
            sources: n,
            destinations: n,
        })
    };
    // SAFETY (every arm): valid out-pointers on a communicator MPI accepted.
    unsafe {
        if kind == mpi_sys::RSMPI_CART {
            // Two neighbours per dimension (MPI_PROC_NULL ones included).
            let mut ndims: c_int = 0;
            if mpi_sys::PMPI_Cartdim_get(comm, &mut ndims) != 0 {
                return None;
            }
            both(ndims.checked_mul(2)?)
        } else if kind == mpi_sys::RSMPI_GRAPH {
            let (mut rank, mut n): (c_int, c_int) = (0, 0);
            if mpi_sys::PMPI_Comm_rank(comm, &mut rank) != 0
                || mpi_sys::PMPI_Graph_neighbors_count(comm, rank, &mut n) != 0
            {
                return None;
            }
            both(n)
        } else if kind == mpi_sys::RSMPI_DIST_GRAPH {
            let (mut sources, mut destinations, mut weighted): (c_int, c_int, c_int) = (0, 0, 0);
            if mpi_sys::PMPI_Dist_graph_neighbors_count(
                comm,
                &mut sources,
                &mut destinations,
                &mut weighted,
            ) != 0
            {
                return None;
            }
            Some(Degrees {
                sources: usize::try_from(sources).ok()?,
                destinations: usize::try_from(destinations).ok()?,
            })
        } else {
            None
        }
    }
}
