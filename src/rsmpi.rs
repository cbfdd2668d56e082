//! A gpucoll [`Communicator`] from an rsmpi (`mpi` crate) communicator
//! (feature `rsmpi`), for programs that initialize MPI through rsmpi.
//!
//! gpucoll duplicates the communicator (its traffic never mixes with the
//! program's) and leaves MPI's initialization and finalization to rsmpi:
//! drop every gpucoll communicator before rsmpi's `Universe`, which
//! finalizes MPI. A gpucoll call after that returns `Error::MpiState`.
//!
//! ```no_run
//! use gpucoll::prelude::*;
//! use mpi::traits::Communicator as _;
//!
//! let universe = mpi::initialize().unwrap();
//! let world = universe.world();
//! let gworld = gpucoll::Communicator::from_rsmpi(&world)?;
//! assert_eq!(gworld.rank() as i32, world.rank());
//! let mut x = vec![1.0f64; 8];
//! gworld.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
//! drop(gworld); // before `universe`
//! # Ok::<(), gpucoll::Error>(())
//! ```

use crate::comm::Communicator;
use crate::config::Config;
use crate::error::Result;
use mpi::raw::AsRaw;
use mpi::topology::Communicator as RsmpiCommunicator;

impl Communicator {
    /// A communicator over the ranks of the rsmpi communicator `comm`
    /// (collective over `comm`), on the GPU chosen as for
    /// [`from_raw_mpi`](Self::from_raw_mpi).
    ///
    /// # Errors
    /// As for [`from_raw_mpi`](Self::from_raw_mpi); `InvalidUsage` for an
    /// inter-communicator.
    pub fn from_rsmpi<C>(comm: &C) -> Result<Communicator>
    where
        C: RsmpiCommunicator + AsRaw<Raw = mpi_sys::MPI_Comm>,
    {
        // SAFETY: an rsmpi communicator holds a valid handle while it is
        // borrowed; MPI being initialized is checked inside.
        unsafe { Communicator::from_raw_mpi(comm.as_raw()) }
    }

    /// [`from_rsmpi`](Self::from_rsmpi) on GPU `device` of this rank, with
    /// settings `config` (None: the `GPUCOLL_*` variables), as
    /// [`from_raw_mpi_with`](Self::from_raw_mpi_with).
    pub fn from_rsmpi_with<C>(
        comm: &C,
        device: Option<i32>,
        config: Option<Config>,
    ) -> Result<Communicator>
    where
        C: RsmpiCommunicator + AsRaw<Raw = mpi_sys::MPI_Comm>,
    {
        let config = match config {
            Some(c) => c,
            None => Config::from_env()?,
        };
        // SAFETY: as in `from_rsmpi`.
        unsafe { Communicator::from_raw_mpi_with(comm.as_raw(), device, config) }
    }
}
