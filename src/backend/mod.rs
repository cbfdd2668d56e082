//! The boundary between the engine (topology, tuning, planning) and the code
//! that moves bytes. A backend executes [`Plan`]s; it never decides them.
//!
//! * `host` (always built): processes on one node exchange through POSIX
//!   shared memory, nodes through MPI point-to-point; channels run on threads.
//! * `cuda` (feature `cuda`): the same plans as GPU kernels.

#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod host;
pub(crate) mod shared;

use crate::buffer::{MemoryKind, RawBuffer};
use crate::error::{Error, Result};
use crate::plan::Plan;
pub use crate::tune::caps::{BackendCaps, LinkCost};
use std::sync::Arc;

/// A plan bound to the buffers of one call.
#[derive(Debug, Clone)]
pub struct BoundPlan {
    pub plan: Arc<Plan>,
    /// Input buffer (for in-place calls, the same memory as `output`).
    pub input: RawBuffer,
    /// Output buffer.
    pub output: RawBuffer,
}

/// One submission: a single collective, or a whole group executed as one
/// launch. Items run in order on every channel.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The communicator's sequence number of the first item (each item
    /// consumes one number). Transports stamp it on their slots so that a
    /// rank that issued a different call is detected, not misread.
    pub first_seq: u64,
    pub items: Vec<BoundPlan>,
    /// The caller's CUDA stream (`CUstream` as an integer; 0 is the legacy
    /// default stream) for [`Backend::enqueue`]; None: the backend's own
    /// execution (its stream or threads), as for `submit` and `run`.
    pub stream: Option<u64>,
}

/// A buffer registered with the peers ([`Backend::register`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// Names it to [`Backend::deregister`].
    pub id: u64,
    /// Whether peers write into it directly (false: the backend cannot
    /// export that memory, and receives into it through a bounce buffer).
    pub direct: bool,
}

/// Where a peer on this node finds bytes of our device memory: an
/// allocation's IPC handle, the offset of the first byte in it, its size
/// and its buffer ID (for point-to-point messages, `crate::p2p`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    pub handle: [u8; 64],
    pub offset: u64,
    pub alloc_bytes: u64,
    pub buffer_id: u64,
}

/// The completion of one copy queued by [`DeviceMoves::copy`].
pub trait Fence: Send {
    /// Whether the copy has completed (an error if it failed).
    fn done(&mut self) -> Result<bool>;
}

/// Pinned host memory lent by [`DeviceMoves::pinned`] (given back on drop).
pub trait HostStage: Send {
    /// The first byte (the block holds at least the bytes asked for).
    fn ptr(&self) -> *mut u8;
}

/// Exportable device memory lent by [`DeviceMoves::bounce`] (given back on
/// drop).
pub trait DeviceStage: Send {
    fn addr(&self) -> u64;
    /// How peers map its first byte.
    fn exported(&self) -> Exported;
}

/// The device side of point-to-point messages on a GPU backend: copies on
/// a stream of their own (never behind the collectives' stream), peer
/// memory exported and mapped, and pooled staging memory. Every method
/// binds the backend's GPU to the calling thread first.
pub trait DeviceMoves: Send + Sync {
    /// Whether rank `peer`'s device memory can be mapped here (the same
    /// node, and CUDA IPC between the two GPUs).
    fn maps_peer(&self, peer: usize) -> bool;

    /// How a peer maps the `bytes` at `addr` of our device memory; None
    /// where the driver cannot export it (pool, managed or VMM memory, or a
    /// small allocation sharing a block with others).
    fn export(&self, addr: u64, bytes: u64) -> Result<Option<Exported>>;

    /// The address here of the first byte `peer` exported.
    fn open(&self, peer: usize, exported: &Exported) -> Result<u64>;

    /// Queue a copy of `bytes` from `src` to `dst` (device, pinned or
    /// pageable host memory, or a mapped peer's) on the point-to-point
    /// stream.
    ///
    /// # Safety
    /// Both ranges are valid for the copy and stay so, unused by anything
    /// else, until the fence reports it done.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: u64) -> Result<Box<dyn Fence>>;

    /// Pinned host memory of at least `bytes`.
    fn pinned(&self, bytes: usize) -> Result<Box<dyn HostStage>>;

    /// Exportable device memory of at least `bytes`; None when none can be
    /// had (out of memory), and the message goes through host memory.
    fn bounce(&self, bytes: u64) -> Result<Option<Box<dyn DeviceStage>>>;
}

/// Work in flight on a backend.
pub trait PendingWork: Send {
    /// Block until the work completes (or fails, or times out).
    fn wait(&mut self) -> Result<()>;
    /// Whether the work has completed; an error if it failed.
    fn test(&mut self) -> Result<bool>;
}

/// A backend instance bound to one communicator.
pub trait Backend: Send + Sync {
    /// Short name for logs (`host`, `cuda`).
    fn name(&self) -> &'static str;

    /// Capabilities and costs, already agreed across the communicator's ranks.
    fn caps(&self) -> &BackendCaps;

    /// Queue a launch. Launches execute in submission order.
    ///
    /// # Safety
    /// Every buffer in `launch` must stay valid (allocated, of at least the
    /// stated length) and must not be accessed by anything else until the
    /// returned work has completed: `wait` or `test` returned `Ok(true)`,
    /// or any error.
    unsafe fn submit(&self, launch: Launch) -> Result<Box<dyn PendingWork>>;

    /// Execute a launch and return when it has completed: what a blocking
    /// collective does. Backends may override this with a faster path (the
    /// host backend runs it on the caller's thread when nothing is queued).
    ///
    /// # Safety
    /// As for [`submit`](Self::submit), for the duration of this call.
    unsafe fn run(&self, launch: Launch) -> Result<()> {
        // SAFETY: forwarded from the caller; we wait before returning.
        let mut work = unsafe { self.submit(launch)? };
        work.wait()
    }

    /// Queue a launch on the caller's CUDA stream (`launch.stream`) and
    /// return once it is queued: completion is ordered on that stream, as
    /// with NCCL. Failures found later (a timeout, a peer's failure) fail the
    /// communicator and are reported by [`async_error`](Self::async_error).
    /// The default (host backend) rejects streams with
    /// `Error::InvalidUsage`.
    ///
    /// # Safety
    /// Every buffer in `launch` must be device memory that stays valid and
    /// is not accessed by anything else until the work completed on the
    /// stream (or, when the stream is being captured, for every replay of
    /// the graph).
    unsafe fn enqueue(&self, launch: Launch) -> Result<()> {
        let _ = launch;
        Err(no_streams(self.name()))
    }

    /// Check a caller's stream before a launch is numbered: it must belong
    /// to this backend's GPU context and not be in an invalidated capture.
    /// The default (host backend) rejects every stream.
    fn check_stream(&self, stream: u64) -> Result<()> {
        let _ = stream;
        Err(no_streams(self.name()))
    }

    /// The first error of work queued with [`enqueue`](Self::enqueue), once
    /// the backend found it (None while everything is fine).
    fn async_error(&self) -> Option<Error> {
        None
    }

    /// The GPU ordinal this backend runs on (None: not a GPU backend).
    fn device(&self) -> Option<i32> {
        None
    }

    /// Make every pending and future operation fail quickly; tells peers.
    fn abort(&self, reason: &str);

    /// Register `buf` with the peers (collective, in call order; `seq`: the
    /// engine's next sequence number, which it does not consume). Returns
    /// the registration, or None where the backend maps no peer memory
    /// (the default: the host backend, which only checks the memory).
    fn register(&self, seq: u64, buf: &RawBuffer) -> Result<Option<Registered>> {
        let _ = seq;
        self.check_memory(buf.memory).map(|()| None)
    }

    /// End registration `id` on this rank (local; never fails).
    fn deregister(&self, id: u64) {
        let _ = id;
    }

    /// The device side of point-to-point messages (None: the backend moves
    /// host memory only, and messages are plain MPI messages).
    fn moves(&self) -> Option<Arc<dyn DeviceMoves>> {
        None
    }

    /// A failure of the node that fails every operation now: a local peer
    /// whose process died, or one that raised the node's abort word. Cheap
    /// enough to ask in a polling loop (the process check is rate-limited).
    fn peer_failure(&self) -> Option<Error> {
        None
    }

    /// Whether this backend can use memory of `kind` (default: host only).
    fn check_memory(&self, kind: MemoryKind) -> Result<()> {
        match kind {
            MemoryKind::Host => Ok(()),
            MemoryKind::Device { ordinal } => Err(Error::WrongMemory(format!(
                "the {} backend cannot access device memory (GPU {ordinal}); \
                 use a host buffer or a build with the CUDA backend",
                self.name()
            ))),
        }
    }
}

/// The error of a backend that cannot run work on a caller's CUDA stream.
fn no_streams(backend: &str) -> Error {
    Error::InvalidUsage(format!(
        "the {backend} backend does not execute on CUDA streams; pass no stream (a blocking \
         call) or use a communicator on the CUDA backend"
    ))
}

/// The backend for a new communicator. Collective over `mpi`.
///
/// `GPUCOLL_BACKEND` decides when set. Otherwise the CUDA backend (in builds
/// with the `cuda` feature) is used when every rank has a usable GPU and,
/// for a communicator that spans several nodes, MPI provides
/// `MPI_THREAD_MULTIPLE` (its NET proxy thread needs it); the host backend
/// everywhere else. The ranks agree on the choice first: a communicator
/// whose ranks picked different backends would deadlock.
///
/// `device`: this rank's GPU for the CUDA backend (each rank its own; an
/// ordinal that does not exist fails creation on every rank). `None` picks
/// the rank's index among its host's processes modulo the GPU count. The
/// host backend ignores it: it moves host memory only.
pub(crate) fn create(
    runtime: &crate::mpi::Runtime,
    mpi: Arc<crate::mpi::MpiComm>,
    topo: &crate::topo::Topology,
    config: &crate::config::Config,
    device: Option<i32>,
) -> Result<Box<dyn Backend>> {
    // Whichever backend runs, segments that crashed jobs of either backend
    // left in /dev/shm go now.
    let removed = shared::shm::cleanup_stale();
    if removed > 0 {
        tracing::info!("removed {removed} stale gpucoll shared memory segments");
    }
    #[cfg(feature = "cuda")]
    {
        let use_cuda = match config.backend.as_deref() {
            Some("cuda") => true,
            Some(_) => false,
            None => all_ranks(
                &mpi,
                (topo.nnodes() == 1 || runtime.thread_multiple()) && cuda::available(),
            )?,
        };
        if use_cuda {
            let backend = cuda::CudaBackend::new_on_device(mpi, topo, config, device)?;
            return Ok(Box::new(backend));
        }
    }
    #[cfg(not(feature = "cuda"))]
    if config.backend.as_deref() == Some("cuda") {
        return Err(Error::Backend(
            "this build has no CUDA backend; build with --features cuda".into(),
        ));
    }
    let _ = device; // the host backend has no GPU to place
    let backend = host::HostBackend::new(mpi, topo, config, runtime.thread_multiple())?;
    Ok(Box::new(backend))
}

/// The GPU whose CUDA context is current on the calling thread, if any
/// (always `None` without the `cuda` feature or a driver).
pub(crate) fn current_device() -> Option<i32> {
    #[cfg(feature = "cuda")]
    {
        cuda::current_device()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// Whether `mine` holds on every rank.
#[cfg(feature = "cuda")]
fn all_ranks(mpi: &crate::mpi::MpiComm, mine: bool) -> Result<bool> {
    let all = mpi.allgather_bytes(&[mine as u8])?;
    Ok(all.iter().all(|&b| b == 1))
}
