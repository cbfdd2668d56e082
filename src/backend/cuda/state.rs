//! [`CudaShared`]: what one communicator's backend owns on the device and in
//! shared memory, shared by the backend and its work in flight, and its
//! teardown.

use super::cache::Resources;
use super::cache::StepStore;
use super::handles::{EventPool, Stream};
use super::lower::DeviceTargets;
use super::memory::{bind, DevMem, DeviceCtx, LiveOnDevice};
use super::module::Kernels;
use super::order::Order;
use super::peer_mem::{CopyEngines, PeerMoves};
use super::profile::HostProfile;
use super::resident::{Launcher, Resident};
use super::shm::Segment;
use super::transport::Transports;
use crate::backend::shared::failure::{Failure, NodeSegments};
use crate::backend::shared::liveness::PeerLiveness;
use crate::error::Error;
use crate::mpi::MpiComm;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One communicator's CUDA backend state, shared behind an `Arc` by the
/// backend handle and its threads.
///
/// Fields release in declaration order after [`CudaShared::drop`]'s body: the
/// copy engines' peer mappings and lanes, the context, our stream, the
/// module, the control segments, the transports (P2P: peers' IPC mappings,
/// then our block; SHM: its hold on the segments; NET: its block, the
/// proxy stopped in the body), the connector tables.
pub(super) struct CudaShared {
    pub rank: usize,
    pub nranks: usize,
    /// Copy-engine collectives: registration caches, lanes, call count
    /// (released before the context).
    pub ce: CopyEngines,
    /// Counts this communicator among the process's on its GPU.
    pub live: LiveOnDevice,
    pub ctx: DeviceCtx,
    /// Layout and the device addresses the lowered tables point at.
    pub target: DeviceTargets,
    pub timeout: Duration,
    pub stream: Stream,
    pub kernels: Kernels,
    pub local_rank: usize,
    /// Control segments of every local rank (ours at `local_rank`).
    pub segs: Vec<Arc<Segment>>,
    /// First error wins; published through the segments' abort words.
    pub failure: Failure,
    /// The memory and threads of the transports that reach our peers
    /// (P2P or SHM within the node, NET to other nodes). Released in `Drop`
    /// after the teardown barrier.
    pub transports: Transports,
    /// For the teardown barrier: peers write into our P2P block (head
    /// credits, FIFO slots, direct inboxes) and NET's proxy serves their
    /// kernels, so both go only once every rank's kernels are known to be
    /// done.
    pub mpi: Arc<MpiComm>,
    pub _send_conns: DevMem,
    pub _recv_conns: DevMem,
    /// Work buffers and uploaded step tables.
    pub store: StepStore,
    /// Completion events of finished submissions, for reuse.
    pub events: EventPool,
    /// Orders consecutive submissions that go to different streams.
    pub order: Mutex<Order>,
    /// The resident block of blocking one-shots (`GPUCOLL_RESIDENT`).
    pub resident: Option<Resident>,
    /// What the kernels of captured CUDA graphs read (step tables with their
    /// pinned staging, scratch memory): kept unchanged for the backend's
    /// life, since the graph may be replayed at any time.
    pub graph_keep: Mutex<Vec<Resources>>,
    /// Host time per phase of a submission (`GPUCOLL_PROFILE_HOST=1`).
    pub profile: HostProfile,
    /// The processes of this node's other ranks (a dead one fails us).
    pub liveness: PeerLiveness,
    /// The device side of point-to-point messages (`crate::p2p`).
    pub moves: Arc<PeerMoves>,
}

// SAFETY: the raw CUDA handles (functions in `kernels`, the context) are
// usable from any thread once the context is bound (every entry point
// binds it); the mutable state is behind atomics and mutexes.
unsafe impl Send for CudaShared {}
// SAFETY: as above.
unsafe impl Sync for CudaShared {}

impl CudaShared {
    /// What the resident block needs to launch a generation.
    pub(super) fn launcher(&self) -> Launcher<'_> {
        Launcher {
            kernels: &self.kernels,
            order: &self.order,
            own: self.stream.raw(),
            abort_word: self.target.abort_word,
        }
    }

    /// Send the resident block away before other work of this backend.
    pub(super) fn resident_quit(&self) {
        if let Some(r) = &self.resident {
            r.quit();
        }
    }

    /// A transport's failure (NET's proxy), if one failed.
    pub(super) fn transport_error(&self) -> Option<Error> {
        self.transports.error()
    }

    /// Our own control segment.
    pub(super) fn own(&self) -> &Segment {
        &self.segs[self.local_rank]
    }

    /// This node's segments, whose abort words carry failures.
    pub(super) fn node(&self) -> NodeSegments<'_, Arc<Segment>> {
        NodeSegments {
            segs: &self.segs,
            local_rank: self.local_rank,
            rank: self.rank,
        }
    }

    /// Why no new work may start, if so (a transport's failure first).
    pub(super) fn state_error(&self) -> Option<Error> {
        self.node()
            .start_error(&self.failure, self.transport_error())
    }

    /// Mark failed (first reason wins) and raise every local abort word.
    pub(super) fn mark_failed(&self, reason: String) -> bool {
        self.node().fail(&self.failure, reason)
    }
}

/// How long a failed communicator's teardown keeps releasing copy-engine
/// waits for its stream to drain before it synchronizes it anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// How long a dropped communicator waits for its peers to drop theirs
/// before it leaks its P2P block instead of freeing it under them.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(30);

impl Drop for CudaShared {
    fn drop(&mut self) {
        if bind(self.ctx.ordinal).is_err() {
            // No usable context: skip the barrier; the fields release what
            // they own (the driver calls take explicit handles).
            return;
        }
        if let Some(r) = &self.resident {
            r.stop(DRAIN_LIMIT);
        }
        if self.state_error().is_some() {
            // Failed work may wait in copy-engine handshakes that no peer
            // will complete: release them while the stream drains.
            let start = std::time::Instant::now();
            while start.elapsed() < DRAIN_LIMIT
                && !super::driver::stream_query(self.stream.raw()).unwrap_or(true)
            {
                self.ce_release();
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let _ = super::driver::stream_synchronize(self.stream.raw());
        // A peer's last kernel may still write a head credit or a slot
        // into our block after our own kernels finished. Free it only
        // after every rank has synchronized its stream (a barrier, which
        // makes dropping the communicator collective, like
        // MPI_Comm_free); a failed communicator or a peer that never
        // comes leaks it instead. The NET proxy must keep running until
        // then too: our kernels may have finished with pieces still in
        // our staging FIFOs that a peer's kernel waits for.
        let peers_idle = !self.transports.held_by_peers()
            || (self.state_error().is_none()
                && self
                    .mpi
                    .allgather_bytes_timeout(&[1], TEARDOWN_TIMEOUT)
                    .is_ok());
        // Then the proxy stops and cancels its posted receives (it leaks
        // the NET block if MPI might still write into it).
        self.transports.release(peers_idle, self.rank);
        self.store.clear();
        self.events.clear();
        self.graph_keep
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.order
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .release();
        // The peer mappings, our stream and the module go next (fields).
    }
}
