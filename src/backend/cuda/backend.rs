//! [`CudaBackend`]: the `Backend` implementation. Every (channel, sender,
//! receiver) pair has a FIFO connector. Ranks of the same (real or
//! simulated) node use P2P (the receiver's FIFOs in a `cuMemAlloc` block
//! shared with CUDA IPC) or SHM (`/dev/shm` segments registered with CUDA);
//! ranks on other nodes use NET (both connectors in the rank's own pinned
//! host memory, moved over MPI by a proxy thread); `super::transport`
//! picks them. The kernels see the same `GcConn` for all three. The GPU is picked by the
//! rank's index among the processes of its host (`bringup`).

use super::driver::CUstream;
use super::guard::GraphGuard;
use super::memory::bind;
use super::order::stream_mode;
use super::pending::ABORT_GRACE;
use super::profile::Phase;
use super::state::CudaShared;
use super::watchdog::Watchdog;
use crate::backend::{Backend, BackendCaps, DeviceMoves, Launch, PendingWork, Registered};
use crate::buffer::{MemoryKind, RawBuffer};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The CUDA backend of one communicator: one GPU per process (the rank's
/// index among the processes of its host, modulo the GPU count; several
/// ranks may share a GPU).
pub struct CudaBackend {
    /// Work queued on callers' streams. Declared first: dropping it waits
    /// for that work (or leaks it) before `inner` can be torn down.
    watchdog: Watchdog,
    /// Watches the peers once work was captured into a graph; joined
    /// before `inner` is dropped.
    guard: GraphGuard,
    inner: Arc<CudaShared>,
    caps: BackendCaps,
}

impl CudaBackend {
    pub(super) fn from_parts(inner: Arc<CudaShared>, caps: BackendCaps) -> CudaBackend {
        CudaBackend {
            watchdog: Watchdog::default(),
            guard: GraphGuard::default(),
            inner,
            caps,
        }
    }

    /// The GPU this backend runs on.
    pub fn device_ordinal(&self) -> i32 {
        self.inner.ctx.ordinal
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        self.inner.profile.report(self.inner.rank);
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("rank", &self.inner.rank)
            .field("gpu", &self.inner.ctx.ordinal)
            .field("layout", &self.inner.target.layout)
            .finish()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn caps(&self) -> &BackendCaps {
        &self.caps
    }

    unsafe fn submit(&self, launch: Launch) -> Result<Box<dyn PendingWork>> {
        // SAFETY: forwarded contract: the buffers stay valid until completion.
        let p = unsafe { self.inner.submit(launch, false)? };
        Ok(Box::new(p))
    }

    /// Blocking: no event, no boxing; the caller's thread spins on the
    /// stream (see `CudaPending::wait`) with the same timeout and abort
    /// handling as `submit` + `wait`.
    unsafe fn run(&self, launch: Launch) -> Result<()> {
        let own_stream = launch.stream.is_none();
        // SAFETY: forwarded contract; we wait for completion before returning.
        let mut p = unsafe { self.inner.submit(launch, own_stream)? };
        let mut clock = self.inner.profile.clock();
        let r = p.wait();
        self.inner.profile.lap(&mut clock, Phase::Wait);
        r
    }

    /// On the caller's stream: queue, hand the work to the watchdog thread,
    /// return. Captured work (the stream is being captured into a graph) is
    /// not watched: it runs at each replay, which the backend cannot see.
    unsafe fn enqueue(&self, launch: Launch) -> Result<()> {
        if launch.stream.is_none() {
            return Err(Error::InvalidUsage(
                "Backend::enqueue needs a launch with a stream".into(),
            ));
        }
        // Start the watchdog first: a launch must not be queued unwatched.
        let inner = &self.inner;
        self.watchdog
            .start(inner.rank, inner.ctx.ordinal, inner.timeout + ABORT_GRACE)?;
        // SAFETY: forwarded contract: the buffers stay valid until the work
        // completed on the caller's stream.
        let p = unsafe { self.inner.submit(launch, false)? };
        if p.done.is_some() {
            // Captured into a graph: its replays are watched by the guard.
            self.guard.start(&self.inner)?;
            return Ok(());
        }
        let mut clock = self.inner.profile.clock();
        self.watchdog.push(p);
        self.inner.profile.lap(&mut clock, Phase::Watch);
        Ok(())
    }

    fn check_stream(&self, stream: u64) -> Result<()> {
        bind(self.inner.ctx.ordinal)?;
        stream_mode(&self.inner.ctx, stream as usize as CUstream).map(|_| ())
    }

    fn async_error(&self) -> Option<Error> {
        // The node's failure too: work the watchdog has not polled since
        // the abort word went up may already have left the stream.
        self.watchdog
            .error()
            .or_else(|| self.guard.error())
            .or_else(|| self.inner.state_error())
    }

    fn device(&self) -> Option<i32> {
        Some(self.inner.ctx.ordinal)
    }

    /// A copy-engine call without copies (`peer_mem/register.rs`), where the
    /// communicator has copy engines (one node, every peer mapped).
    fn register(&self, seq: u64, buf: &RawBuffer) -> Result<Option<Registered>> {
        if self.caps.copy_engine.is_none() {
            return self.check_memory(buf.memory).map(|()| None);
        }
        if let Some(e) = self.inner.state_error() {
            return Err(e);
        }
        bind(self.inner.ctx.ordinal)?;
        self.inner.ce_register(seq, buf).map(Some)
    }

    fn deregister(&self, id: u64) {
        self.inner.ce_deregister(id);
    }

    fn abort(&self, reason: &str) {
        self.inner.failure.abort();
        if self.inner.mark_failed(format!("aborted: {reason}")) {
            tracing::warn!(rank = self.inner.rank, "cuda backend aborted: {reason}");
        }
    }

    fn moves(&self) -> Option<Arc<dyn DeviceMoves>> {
        Some(self.inner.moves.clone())
    }

    fn peer_failure(&self) -> Option<Error> {
        if let Some(e) = self.inner.node().peer_error() {
            return Some(e);
        }
        let e = self.inner.liveness.dead()?;
        self.inner.mark_failed(e.to_string());
        Some(e)
    }

    fn check_memory(&self, kind: MemoryKind) -> Result<()> {
        match kind {
            MemoryKind::Host => Ok(()),
            MemoryKind::Device { ordinal } if ordinal == self.inner.ctx.ordinal => Ok(()),
            MemoryKind::Device { ordinal } => Err(Error::WrongMemory(format!(
                "the buffer is on GPU {ordinal}, but this rank's communicator runs on GPU {}",
                self.inner.ctx.ordinal
            ))),
        }
    }
}
