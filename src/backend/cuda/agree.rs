//! Bring-up consensus helpers: every rank learns whether all succeeded,
//! and a random tag that names this communicator's segments. To be
//! replaced by the shared `agree`/tag helper of both backends.

use crate::error::{Error, Result};
use crate::mpi::MpiComm;

/// Whether every rank succeeded; the first local error wins, else a
/// description of the ranks that failed. Collective over `mpi`.
pub(super) fn agree<T>(mpi: &MpiComm, mine: Result<T>, what: &str) -> Result<T> {
    let all = mpi.allgather_bytes(&[mine.is_ok() as u8])?;
    let failed: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == 0)
        .map(|(r, _)| r)
        .collect();
    match mine {
        Err(e) => Err(e),
        Ok(_) if !failed.is_empty() => Err(Error::Backend(format!(
            "CUDA backend setup: ranks {failed:?} could not {what}"
        ))),
        Ok(v) => Ok(v),
    }
}

/// A tag unlikely to repeat across processes and communicators.
pub(super) fn random_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}
