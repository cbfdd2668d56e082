//! Communicators: creation from MPI, split/duplicate, rank and node facts.
//!
//! OWNERSHIP NOTE (remove when filled): the struct definitions below are
//! fixed; the helper for `mpi`/`env`/`comm` implements construction,
//! `split`, `duplicate`, `from_raw_mpi`, `free`, node discovery.

use crate::config::Config;
use crate::enqueue::Engine;
use crate::env::Runtime;
use crate::mpi::MpiComm;
use crate::topo::Topology;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A group of ranks that run collectives together (like `MPI_Comm`).
///
/// Cheap to clone: clones share the same communicator. Dropping the last
/// clone releases its resources (shared memory, the MPI duplicate).
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<CommInner>,
}

pub(crate) struct CommInner {
    /// Keeps MPI initialized while the communicator lives.
    pub(crate) runtime: Arc<Runtime>,
    /// gpucoll's private duplicate of the user's MPI communicator: bootstrap,
    /// check-mode signatures and the NET transport use it, never the user's.
    pub(crate) mpi: Arc<MpiComm>,
    pub(crate) topo: Topology,
    pub(crate) config: Config,
    pub(crate) engine: Engine,
    /// Set by `free()`.
    pub(crate) freed: AtomicBool,
}
