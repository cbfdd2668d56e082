//! Communicators: creation from MPI, split/duplicate, rank and node facts.
//!
//! Creating a communicator is collective over its ranks: they agree on the
//! `GPUCOLL_*` settings that steer planning, discover which ranks share a
//! node, and set up the backend and the engine.

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::mpi::Runtime;
use crate::mpi::{self, MpiComm};
use crate::topo::Topology;
use std::collections::HashMap;
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
    let config = agree_config(&mpi, config)?;
    let topo = discover_topology(&mpi, &config)?;
    log_topology(&topo);
    let mpi = Arc::new(mpi);
    let backend = crate::backend::create(&runtime, mpi.clone(), &topo, &config, device)?;
    let engine = Engine::new(backend, topo.clone(), config.clone());
    Ok(Communicator {
        inner: Arc::new(CommInner {
            runtime,
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

/// 64-bit FNV-1a: a hash that is the same in every process and Rust version.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate parts so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The settings that must be equal on all ranks, by variable name.
fn config_fields(c: &Config) -> Vec<(&'static str, String)> {
    fn shown<T: ToString>(v: Option<T>) -> String {
        v.map(|v| v.to_string()).unwrap_or_else(|| "(unset)".into())
    }
    vec![
        ("GPUCOLL_ALGO", shown(c.algo.map(|a| a.name()))),
        ("GPUCOLL_PROTO", shown(c.proto.map(|p| p.name()))),
        ("GPUCOLL_NCHANNELS", shown(c.nchannels)),
        ("GPUCOLL_CHECK", u8::from(c.check).to_string()),
        ("GPUCOLL_SIM_NODES", shown(c.sim_nodes)),
        ("GPUCOLL_TIMEOUT", c.timeout.as_secs_f64().to_string()),
        ("GPUCOLL_BACKEND", shown(c.backend.as_ref())),
        ("GPUCOLL_HOST_SLOT_BYTES", shown(c.host_slot_bytes)),
        ("GPUCOLL_P2P_DISABLE", u8::from(c.p2p_disable).to_string()),
        ("GPUCOLL_CE", c.ce.name().to_string()),
        ("GPUCOLL_REGISTERED", c.registered.name().to_string()),
        (
            "GPUCOLL_LEGACY_STREAM_ORDER",
            u8::from(c.legacy_stream_order).to_string(),
        ),
        // The id itself is per rank; whether it is set must agree.
        (
            "GPUCOLL_NODE_ID",
            if c.node_id.is_some() {
                "(set)"
            } else {
                "(unset)"
            }
            .to_string(),
        ),
    ]
}

const CONFIG_FIELDS: usize = 13;
/// Per-rank record of the config exchange: a status word, then one digest per field.
const CONFIG_RECORD: usize = 8 * (1 + CONFIG_FIELDS);

fn config_digest(c: &Config) -> Vec<u64> {
    config_fields(c)
        .iter()
        .map(|(name, value)| fnv1a(&[name.as_bytes(), value.as_bytes()]))
        .collect()
}

/// The first field (index) on which some rank differs from rank 0, and that rank.
fn find_mismatch(digests: &[Vec<u64>]) -> Option<(usize, usize)> {
    let first = digests.first()?;
    (0..first.len()).find_map(|field| {
        digests
            .iter()
            .position(|d| d.get(field) != first.get(field))
            .map(|rank| (field, rank))
    })
}

fn encode_u64s(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn decode_u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Exchange the planning-relevant settings and fail on every rank if any
/// rank could not parse its variables or if ranks disagree. Always takes
/// part in the exchange, so no rank is left waiting.
fn agree_config(mpi: &MpiComm, mine: Result<Config>) -> Result<Config> {
    let mut record = Vec::with_capacity(1 + CONFIG_FIELDS);
    match &mine {
        Ok(c) => {
            record.push(0);
            record.extend(config_digest(c));
        }
        Err(_) => {
            record.push(1);
            record.extend(std::iter::repeat(0).take(CONFIG_FIELDS));
        }
    }
    let all = mpi.allgather_bytes(&encode_u64s(&record))?;
    let config = mine?;
    let records: Vec<Vec<u64>> = all.chunks_exact(CONFIG_RECORD).map(decode_u64s).collect();
    if let Some(bad) = records.iter().position(|r| r.first() != Some(&0)) {
        return Err(Error::Config {
            name: "GPUCOLL_*",
            value: "?".into(),
            reason: format!("rank {bad} has an invalid GPUCOLL_* variable (see its error)"),
        });
    }
    let digests: Vec<Vec<u64>> = records.into_iter().map(|r| r[1..].to_vec()).collect();
    if let Some((field, rank)) = find_mismatch(&digests) {
        let (name, value) = config_fields(&config).swap_remove(field);
        return Err(Error::Config {
            name,
            value,
            reason: format!(
                "ranks 0 and {rank} disagree on this setting; every rank must use the same value"
            ),
        });
    }
    Ok(config)
}

/// The simulated node (block) of a rank: `local_rank * k / local_size`.
fn sim_block(local_rank: usize, local_size: usize, k: usize) -> usize {
    if local_size == 0 {
        return 0;
    }
    ((local_rank as u128 * k as u128) / local_size as u128) as usize
}

/// Split every node (ranks with equal keys) into `k` simulated nodes of
/// contiguous local ranks.
fn apply_sim_nodes(keys: &[u64], k: usize) -> Vec<u64> {
    if k <= 1 {
        return keys.to_vec();
    }
    let mut members: HashMap<u64, Vec<usize>> = HashMap::new();
    for (r, &key) in keys.iter().enumerate() {
        members.entry(key).or_default().push(r);
    }
    keys.iter()
        .enumerate()
        .map(|(r, &key)| {
            let group = &members[&key];
            let local_rank = group.iter().position(|&x| x == r).unwrap_or(0);
            let block = sim_block(local_rank, group.len(), k) as u64;
            fnv1a(&[&key.to_le_bytes(), b"sim", &block.to_le_bytes()])
        })
        .collect()
}

/// Which ranks share a node: the host name plus the lowest rank (in this
/// communicator) of the shared-memory group, so hosts with equal names are
/// not merged; then the `GPUCOLL_NODE_ID` / `GPUCOLL_SIM_NODES` overrides.
fn discover_topology(mpi: &MpiComm, config: &Config) -> Result<Topology> {
    // Always collective on every rank, whatever the overrides.
    let shared = mpi.split_shared()?;
    let mut leader = (mpi.rank() as u64).to_le_bytes();
    shared.bcast_bytes(&mut leader, 0)?;
    drop(shared);
    let host = mpi::processor_name().unwrap_or_default();
    let discovered = fnv1a(&[host.as_bytes(), &leader]);
    let key = config.node_id.unwrap_or(discovered);
    let keys = decode_u64s(&mpi.allgather_bytes(&key.to_le_bytes())?);
    let keys = match config.sim_nodes {
        Some(k) => apply_sim_nodes(&keys, k),
        None => keys,
    };
    Ok(Topology::from_node_keys(mpi.rank(), &keys))
}

fn log_topology(topo: &Topology) {
    if topo.rank == 0 {
        let sizes: Vec<usize> = topo.nodes.iter().map(Vec::len).collect();
        tracing::info!(
            ranks = topo.nranks,
            nodes = topo.nnodes(),
            ranks_per_node = ?sizes,
            "communicator topology"
        );
    }
    tracing::debug!(
        rank = topo.rank,
        node = topo.node(),
        local_rank = topo.local_rank(),
        local_size = topo.local_size(),
        "rank placement"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sim_blocks_are_contiguous() {
        let blocks: Vec<usize> = (0..8).map(|lr| sim_block(lr, 8, 2)).collect();
        assert_eq!(blocks, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        let blocks: Vec<usize> = (0..5).map(|lr| sim_block(lr, 5, 2)).collect();
        assert_eq!(blocks, vec![0, 0, 0, 1, 1]);
        assert_eq!(sim_block(0, 0, 3), 0);
    }

    #[test]
    fn sim_nodes_split_each_real_node() {
        // Two real nodes of four ranks each, interleaved ranks.
        let keys = [1, 2, 1, 2, 1, 2, 1, 2];
        let sim = apply_sim_nodes(&keys, 2);
        let t = Topology::from_node_keys(0, &sim);
        assert_eq!(t.nnodes(), 4);
        assert_eq!(
            t.nodes,
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert_eq!(apply_sim_nodes(&keys, 1), keys.to_vec());
        // More simulated nodes than ranks: one rank per node.
        let t = Topology::from_node_keys(0, &apply_sim_nodes(&[7, 7, 7], 8));
        assert_eq!(t.nnodes(), 3);
    }

    #[test]
    fn config_digest_names_the_variable() {
        let a = Config::default();
        let mut b = a.clone();
        b.nchannels = Some(4);
        let same = vec![config_digest(&a), config_digest(&a)];
        assert_eq!(find_mismatch(&same), None);
        let diff = vec![config_digest(&a), config_digest(&a), config_digest(&b)];
        let (field, rank) = find_mismatch(&diff).unwrap();
        assert_eq!(config_fields(&a)[field].0, "GPUCOLL_NCHANNELS");
        assert_eq!(rank, 2);
        let mut c = a.clone();
        c.timeout = Duration::from_secs(5);
        let (field, _) = find_mismatch(&[config_digest(&a), config_digest(&c)]).unwrap();
        assert_eq!(config_fields(&a)[field].0, "GPUCOLL_TIMEOUT");
        // The node id itself may differ per rank.
        let mut d = a.clone();
        d.node_id = Some(1);
        let mut e = a.clone();
        e.node_id = Some(2);
        assert_eq!(find_mismatch(&[config_digest(&d), config_digest(&e)]), None);
        assert_eq!(config_digest(&a).len(), CONFIG_FIELDS);
        let mut p = a.clone();
        p.p2p_disable = true;
        let (field, _) = find_mismatch(&[config_digest(&a), config_digest(&p)]).unwrap();
        assert_eq!(config_fields(&a)[field].0, "GPUCOLL_P2P_DISABLE");
    }

    #[test]
    fn u64_codec_round_trips() {
        let w = [0, 1, u64::MAX, 0x0123_4567_89ab_cdef];
        assert_eq!(decode_u64s(&encode_u64s(&w)), w.to_vec());
    }

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }
}
