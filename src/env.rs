//! Starting and stopping MPI: [`initialize`], the [`Universe`] and the
//! process-wide runtime (`mpi::Runtime`) that keeps MPI alive while
//! anything uses it.
//!
//! MPI is finalized (when gpucoll initialized it) only after the
//! [`Universe`] *and* every [`Communicator`] and internal MPI handle are
//! dropped, so communicator resources are always released before MPI goes.
//!
//! ```no_run
//! fn main() -> gpucoll::Result<()> {
//!     let universe = gpucoll::initialize()?;
//!     let world = universe.world()?;
//!     let node = world.split(Some(world.node() as u32), world.rank() as i32)?;
//!     // ... collectives on `world` and `node` ...
//!     Ok(())
//!     // `node`, `world` and `universe` drop here; then MPI is finalized.
//! }
//! ```

use crate::comm::{self, Communicator};
use crate::error::{Error, Result};
use crate::mpi::{self, MpiComm, Runtime};
use std::sync::Arc;

pub use crate::mpi::Threading;

/// Initialize MPI with `MPI_THREAD_MULTIPLE` (or use it, if the program
/// already initialized it) and return the [`Universe`].
///
/// Calling it again while a `Universe` or communicator is alive returns a
/// `Universe` sharing the same state. MPI is finalized when the last
/// `Universe` and communicator are dropped, if gpucoll initialized it.
///
/// ```no_run
/// let universe = gpucoll::initialize()?;
/// let world = universe.world()?;
/// println!("rank {} of {}", world.rank(), world.size());
/// # Ok::<(), gpucoll::Error>(())
/// ```
///
/// # Errors
/// [`Error::MpiState`] if MPI was already finalized; [`Error::Mpi`] if
/// `MPI_Init_thread` fails.
pub fn initialize() -> Result<Universe> {
    initialize_with_threading(Threading::Multiple)
}

/// Like [`initialize`] but requests the thread level `threading`.
///
/// The level MPI actually provides is [`Universe::threading`]. Below
/// [`Threading::Multiple`], gpucoll never calls MPI from several threads
/// at once (the host backend's channels then funnel their MPI traffic).
///
/// ```no_run
/// use gpucoll::Threading;
/// let universe = gpucoll::initialize_with_threading(Threading::Serialized)?;
/// assert!(universe.threading() <= Threading::Multiple);
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn initialize_with_threading(threading: Threading) -> Result<Universe> {
    let runtime = Runtime::initialized(threading)?;
    Ok(Universe { runtime })
}

/// The MPI environment, as returned by [`initialize`].
///
/// Dropping it does not invalidate live communicators: MPI stays
/// initialized until they are dropped too.
///
/// ```no_run
/// use gpucoll::prelude::*;
///
/// let universe = gpucoll::initialize()?;
/// let world = universe.world()?;
/// // One communicator per pair of ranks, beside the world.
/// let pair = world.split(Some((world.rank() / 2) as u32), 0)?.expect("a color");
/// let mut x = vec![1u64; 4];
/// pair.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
/// drop(universe); // `world` and `pair` keep MPI alive
/// world.process_at_rank(0).broadcast_into(&mut x)?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Universe {
    runtime: Arc<Runtime>,
}

impl Universe {
    /// A communicator of all processes (a private duplicate of
    /// `MPI_COMM_WORLD`; collective over it).
    ///
    /// ```no_run
    /// let universe = gpucoll::initialize()?;
    /// let world = universe.world()?;
    /// assert!(world.rank() < world.size());
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn world(&self) -> Result<Communicator> {
        if !mpi::is_usable() {
            return Err(Error::MpiState(
                "MPI was finalized by the program while the Universe is alive".into(),
            ));
        }
        let runtime = self.runtime();
        let mpi = MpiComm::world().with_runtime(runtime.clone()).dup()?;
        comm::create(runtime, mpi)
    }

    /// The thread level MPI provides.
    pub fn threading(&self) -> Threading {
        self.runtime.threading()
    }

    pub(crate) fn runtime(&self) -> Arc<Runtime> {
        self.runtime.clone()
    }
}
