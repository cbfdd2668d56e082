//! Helpers of collective backend setup: a communicator tag every rank
//! shares, and agreement on whether every rank succeeded a setup stage (a
//! rank that failed alone must not leave the others waiting for it).

use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::topo::Topology;

/// A backend is built for the communicator its topology describes.
pub(crate) fn check_topology(mpi: &MpiComm, topo: &Topology) -> Result<()> {
    if mpi.rank() != topo.rank || mpi.size() != topo.nranks {
        return Err(Error::Backend(format!(
            "topology (rank {} of {}) does not match the MPI communicator (rank {} of {})",
            topo.rank,
            topo.nranks,
            mpi.rank(),
            mpi.size()
        )));
    }
    Ok(())
}

/// Whether every rank succeeded a setup stage; collective over `mpi`. This
/// rank's own error wins; else, when other ranks failed, `others` turns
/// their ranks into this rank's error.
pub(crate) fn agree<T>(
    mpi: &MpiComm,
    mine: Result<T>,
    others: impl FnOnce(&[usize]) -> Error,
) -> Result<T> {
    let all = mpi.allgather_bytes(&[mine.is_ok() as u8])?;
    let failed = failed_ranks(&all);
    match mine {
        Err(e) => Err(e),
        Ok(_) if !failed.is_empty() => Err(others(&failed)),
        Ok(v) => Ok(v),
    }
}

/// The ranks whose byte is not 1 in an allgathered success vector.
fn failed_ranks(all: &[u8]) -> Vec<usize> {
    all.iter()
        .enumerate()
        .filter(|(_, &b)| b != 1)
        .map(|(r, _)| r)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_ranks_are_named() {
        assert_eq!(failed_ranks(&[1, 0, 1, 0]), vec![1, 3]);
        assert!(failed_ranks(&[1, 1]).is_empty());
    }
}
