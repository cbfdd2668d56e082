//! Communicators: creation from MPI, split/duplicate, rank and node facts.
//!
//! Creating a communicator is collective over its ranks: they agree on the
//! `GPUCOLL_*` settings that steer planning (`config::agree`), discover
//! which ranks share a node (`topo::discover`), and set up the backend,
//! the engine and the point-to-point state (`p2p`).

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::mpi::Runtime;
use crate::p2p::state::P2pShared;
use crate::topo::Topology;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A group of ranks that run collectives together (like `MPI_Comm`).
///
/// Cheap to clone: clones share the same communicator. Dropping the last
/// clone releases its resources (shared memory, the MPI duplicate).
///
/// Get one from [`Universe::world`](crate::Universe::world),
/// [`from_raw_mpi`](Self::from_raw_mpi) or [`split`](Self::split); every
/// collective is a method on it (rooted ones on
/// [`process_at_rank`](Self::process_at_rank)):
///
/// ```no_run
/// use gpucoll::prelude::*;
///
/// let universe = gpucoll::initialize()?;
/// let world = universe.world()?;
/// println!(
///     "rank {} of {} on node {} of {} ({} backend)",
///     world.rank(), world.size(), world.node(), world.nnodes(), world.backend_name()
/// );
/// let mine = vec![world.rank() as u32; 4];
/// let mut all = vec![0u32; 4 * world.size()];
/// world.all_gather_into(&mine, &mut all)?;
/// assert_eq!(all[4 * (world.size() - 1)], world.size() as u32 - 1);
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<CommInner>,
}

pub(crate) struct CommInner {
    /// Keeps MPI initialized while the communicator lives.
    pub(crate) runtime: Arc<Runtime>,
    /// Point-to-point messages (dropped before the engine: its device
    /// side's copies finish before the backend goes).
    pub(crate) p2p: Arc<P2pShared>,
    /// gpucoll's private duplicate of the user's MPI communicator: bootstrap,
    /// check-mode signatures and the NET transport use it, never the user's.
    pub(crate) mpi: Arc<MpiComm>,
    pub(crate) topo: Topology,
    pub(crate) config: Config,
    pub(crate) engine: Engine,
    /// Set by `free()`.
    pub(crate) freed: AtomicBool,
}

/// Build a communicator over `mpi`, gpucoll's private MPI communicator
/// (collective over its ranks): agree on the configuration, discover the
/// nodes, create the backend and the engine.
///
/// Teardown order: `CommInner` drops its `runtime` first, but MPI stays
/// initialized because every `MpiComm` made here holds the runtime too, and
/// whatever still calls MPI (the backend) holds an `Arc<MpiComm>`. So MPI is
/// finalized only after the last MPI user is gone.
pub(crate) fn create(runtime: Arc<Runtime>, mpi: MpiComm) -> Result<Communicator> {
    create_on(runtime, mpi, None, Config::from_env())
}

/// [`create`] with this rank's GPU for the CUDA backend (`None`: the
/// default rule of [`crate::backend::create`]) and its settings.
fn create_on(
    runtime: Arc<Runtime>,
    mpi: MpiComm,
    device: Option<i32>,
    config: Result<Config>,
) -> Result<Communicator> {
    let mpi = mpi.with_runtime(runtime.clone());
    let config = crate::config::agree(&mpi, config)?;
    let topo = crate::topo::discover(&mpi, &config)?;
    crate::topo::log(&topo);
    let mpi = Arc::new(mpi);
    let backend = crate::backend::create(&runtime, mpi.clone(), &topo, &config, device)?;
    let engine = Engine::new(backend, topo.clone(), config.clone());
    // Two more duplicates, which nothing but messages uses: envelopes
    // (the user's tags, matched by MPI) and their data.
    let p2p = P2pShared::new(mpi.dup()?, mpi.dup()?, engine.moves(), config.p2p_eager)?;
    Ok(Communicator {
        inner: Arc::new(CommInner {
            runtime,
            p2p,
            mpi,
            topo,
            config,
            engine,
            freed: AtomicBool::new(false),
        }),
    })
}

impl Communicator {
    /// The shared state, or [`Error::CommunicatorFreed`] after [`free`](Self::free).
    pub(crate) fn inner_checked(&self) -> Result<&CommInner> {
        if self.inner.freed.load(Ordering::Acquire) {
            return Err(Error::CommunicatorFreed);
        }
        Ok(&self.inner)
    }

    /// Wrap a communicator created by the program (collective over it).
    ///
    /// MPI must already be initialized (by the program or by
    /// [`initialize`](crate::initialize)). gpucoll works on a private
    /// duplicate, so the program may free `raw` at any time afterwards; if
    /// the program initialized MPI, gpucoll never finalizes it.
    ///
    /// On the CUDA backend the communicator runs on the GPU of the calling
    /// thread's current CUDA context (the one `cudaSetDevice` selects) when
    /// one is current; otherwise on GPU (index of the process among those
    /// of its host) % (GPU count). Use
    /// [`from_raw_mpi_on_device`](Self::from_raw_mpi_on_device) to name it.
    ///
    /// ```no_run
    /// # fn f(raw: mpi_sys::MPI_Comm) -> gpucoll::Result<()> {
    /// // `raw` comes from the program's own MPI code (e.g. rsmpi's `as_raw()`).
    /// let comm = unsafe { gpucoll::Communicator::from_raw_mpi(raw)? };
    /// println!("rank {} of {}", comm.rank(), comm.size());
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `raw` must be a valid MPI communicator handle of the MPI library
    /// gpucoll is linked against, valid for the duration of this call.
    ///
    /// # Errors
    /// [`Error::MpiState`] if MPI is not initialized or already finalized.
    pub unsafe fn from_raw_mpi(raw: mpi_sys::MPI_Comm) -> Result<Communicator> {
        let runtime = Runtime::borrowed()?;
        // SAFETY: the caller guarantees `raw` is a valid communicator.
        let mpi = unsafe { MpiComm::from_raw(raw)? };
        create_on(
            runtime,
            mpi,
            crate::backend::current_device(),
            Config::from_env(),
        )
    }

    /// [`from_raw_mpi`](Self::from_raw_mpi) on GPU `device` of this rank
    /// (each rank names its own; collective over `raw`). The host backend
    /// ignores `device`: it moves host memory only, so there is nothing to
    /// place.
    ///
    /// # Safety
    /// As for [`from_raw_mpi`](Self::from_raw_mpi).
    ///
    /// # Errors
    /// As for [`from_raw_mpi`](Self::from_raw_mpi); on the CUDA backend,
    /// [`Error::Backend`] on every rank when some rank's `device` does not
    /// exist.
    pub unsafe fn from_raw_mpi_on_device(
        raw: mpi_sys::MPI_Comm,
        device: i32,
    ) -> Result<Communicator> {
        let runtime = Runtime::borrowed()?;
        // SAFETY: the caller guarantees `raw` is a valid communicator.
        let mpi = unsafe { MpiComm::from_raw(raw)? };
        create_on(runtime, mpi, Some(device), Config::from_env())
    }

    /// [`from_raw_mpi`](Self::from_raw_mpi) with settings given by the
    /// program instead of read from the `GPUCOLL_*` variables (start from
    /// [`Config::from_env`] to keep those). Every rank must pass the same
    /// settings (they are compared, as the variables are). `device`: as for
    /// [`from_raw_mpi_on_device`](Self::from_raw_mpi_on_device), `None` as
    /// for `from_raw_mpi`.
    ///
    /// ```no_run
    /// # fn f(raw: mpi_sys::MPI_Comm) -> gpucoll::Result<()> {
    /// let mut config = gpucoll::Config::from_env()?;
    /// config.legacy_stream_order = true;
    /// let comm = unsafe { gpucoll::Communicator::from_raw_mpi_with(raw, None, config)? };
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// As for [`from_raw_mpi`](Self::from_raw_mpi).
    ///
    /// # Errors
    /// As for [`from_raw_mpi_on_device`](Self::from_raw_mpi_on_device), and
    /// [`Error::Config`] when the ranks' settings differ.
    pub unsafe fn from_raw_mpi_with(
        raw: mpi_sys::MPI_Comm,
        device: Option<i32>,
        config: Config,
    ) -> Result<Communicator> {
        let runtime = Runtime::borrowed()?;
        // SAFETY: the caller guarantees `raw` is a valid communicator.
        let mpi = unsafe { MpiComm::from_raw(raw)? };
        let device = device.or_else(crate::backend::current_device);
        create_on(runtime, mpi, device, Ok(config))
    }

    /// The `GPUCOLL_*` settings this communicator runs with (agreed by all ranks).
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.topo.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.topo.nranks
    }

    /// Index of this rank's node (nodes are numbered by their lowest rank).
    pub fn node(&self) -> usize {
        self.inner.topo.node()
    }

    /// Number of nodes the ranks span.
    pub fn nnodes(&self) -> usize {
        self.inner.topo.nnodes()
    }

    /// This rank's index among the ranks of its node.
    pub fn local_rank(&self) -> usize {
        self.inner.topo.local_rank()
    }

    /// Number of ranks on this rank's node.
    pub fn local_size(&self) -> usize {
        self.inner.topo.local_size()
    }

    /// Placement of all ranks on nodes (identical on every rank).
    pub fn topology(&self) -> &Topology {
        &self.inner.topo
    }

    /// The GPU ordinal this communicator's collectives run on: `Some` with
    /// the CUDA backend, `None` with the host backend.
    pub fn device(&self) -> Option<i32> {
        self.inner.engine.device()
    }

    /// The backend that moves this communicator's data (`host` or `cuda`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.engine.backend_name()
    }

    /// A zeroed device buffer of `len` elements on this communicator's GPU,
    /// ready for its collectives: `world.alloc::<f32>(n)?`.
    ///
    /// An error (`WrongMemory`) when the communicator runs on the host
    /// backend (no GPU).
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let mut grads = world.alloc::<f32>(1 << 20)?;
    /// world.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn alloc<T: crate::Equivalence>(&self, len: usize) -> Result<crate::DeviceBuffer<T>> {
        crate::DeviceBuffer::zeroed(self.gpu_for("alloc")?, len)
    }

    /// A device buffer on this communicator's GPU holding a copy of `data`.
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let mut x = world.alloc_from(&[world.rank() as i64; 8])?;
    /// world.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    /// let total = x.to_vec()?;
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn alloc_from<T: crate::Equivalence>(&self, data: &[T]) -> Result<crate::DeviceBuffer<T>> {
        crate::DeviceBuffer::from_host(self.gpu_for("alloc_from")?, data)
    }

    #[cfg(feature = "cuda")]
    fn gpu_for(&self, call: &str) -> Result<i32> {
        self.device().ok_or_else(|| {
            Error::WrongMemory(format!(
                "{call}: this communicator runs on the host backend and has no GPU; \
                 use host vectors"
            ))
        })
    }

    /// Split into disjoint communicators, like `MPI_Comm_split` (collective).
    ///
    /// Ranks passing the same `color` end up together, ordered by `key`
    /// (ties by rank). `None` joins no communicator and returns `Ok(None)`.
    /// Each rank's new communicator runs on the same GPU as `self`, with
    /// its settings ([`config`](Self::config)).
    ///
    /// ```no_run
    /// let universe = gpucoll::initialize()?;
    /// let world = universe.world()?;
    /// let half = world
    ///     .split(Some((world.rank() % 2) as u32), world.rank() as i32)?
    ///     .expect("every rank passed a color");
    /// assert_eq!(half.rank(), world.rank() / 2);
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::CommunicatorFreed`] after [`free`](Self::free);
    /// [`Error::InvalidUsage`] for a color above `i32::MAX`.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let inner = self.inner_checked()?;
        match inner.mpi.split(color, key)? {
            None => Ok(None),
            Some(mpi) => create_on(
                inner.runtime.clone(),
                mpi,
                self.device(),
                Ok(inner.config.clone()),
            )
            .map(Some),
        }
    }

    /// A new communicator with the same ranks and its own resources
    /// (collective), like `MPI_Comm_dup`, on the same GPU and with the same
    /// settings as `self`.
    ///
    /// ```no_run
    /// let universe = gpucoll::initialize()?;
    /// let world = universe.world()?;
    /// let copy = world.duplicate()?;
    /// assert_eq!(copy.size(), world.size());
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn duplicate(&self) -> Result<Communicator> {
        self.duplicate_with(self.inner_checked()?.config.clone())
    }

    /// As [`duplicate`](Self::duplicate), with `config` instead of this
    /// communicator's settings (collective): for example one communicator
    /// with an algorithm forced beside the automatic one, or other
    /// simulated nodes. Every rank must pass the same settings (they are
    /// compared, as the variables are).
    ///
    /// ```no_run
    /// let universe = gpucoll::initialize()?;
    /// let world = universe.world()?;
    /// let ring = gpucoll::Config::from_lookup(|name| match name {
    ///     "GPUCOLL_ALGO" => Some("ring".into()),
    ///     other => std::env::var(other).ok(),
    /// })?;
    /// let forced = world.duplicate_with(ring)?;
    /// assert_eq!(forced.size(), world.size());
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::CommunicatorFreed`] if this communicator was freed,
    /// [`Error::Config`] when the ranks' settings differ, and what creating
    /// a communicator can return.
    pub fn duplicate_with(&self, config: Config) -> Result<Communicator> {
        let inner = self.inner_checked()?;
        let mpi = inner.mpi.dup()?;
        create_on(inner.runtime.clone(), mpi, self.device(), Ok(config))
    }

    /// Mark the communicator freed: every later collective (on any clone)
    /// fails with [`Error::CommunicatorFreed`]. Its resources are released
    /// when the last clone is dropped.
    ///
    /// ```no_run
    /// let universe = gpucoll::initialize()?;
    /// let comm = universe.world()?.duplicate()?;
    /// comm.free()?;
    /// assert!(comm.is_freed());
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::CommunicatorFreed`] if it was already freed.
    pub fn free(&self) -> Result<()> {
        if self.inner.freed.swap(true, Ordering::AcqRel) {
            return Err(Error::CommunicatorFreed);
        }
        tracing::debug!(rank = self.rank(), "communicator freed");
        Ok(())
    }

    /// Whether [`free`](Self::free) was called.
    pub fn is_freed(&self) -> bool {
        self.inner.freed.load(Ordering::Acquire)
    }

    /// Make every pending and future collective on this communicator fail
    /// quickly, on this rank and (as far as the backend can tell them) on its
    /// peers. Unlike `MPI_Abort`, the process keeps running.
    pub fn abort(&self) {
        self.inner.engine.abort("Communicator::abort called");
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("node", &self.node())
            .field("nnodes", &self.nnodes())
            .field("freed", &self.is_freed())
            .finish()
    }
}
