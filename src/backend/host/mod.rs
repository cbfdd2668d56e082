//! The host backend: executes plans on host memory.
//!
//! * Ranks on one node exchange through POSIX shared memory: every rank owns
//!   a segment with the FIFOs it receives in ([`shm`], [`fifo`]).
//! * Ranks on different (real or simulated) nodes exchange through MPI
//!   point-to-point messages ([`net`]).
//! * Plans are interpreted step by step ([`exec`]) with element-wise kernels
//!   ([`reduce`]), on a per-communicator worker thread when MPI provides
//!   `MPI_THREAD_MULTIPLE`, else inside `submit` ([`worker`]).
//!
//! Failures are shared: the first error of a launch marks the backend
//! failed, and raises the abort flag in every local peer's segment so the
//! whole node fails fast with `PeerFailed` instead of timing out.
//!
//! `GPUCOLL_HOST_CHANNEL_THREADS=0|1` (read at creation) forces the
//! channels of a launch onto one thread (round-robin) or one thread per
//! channel; by default channels get their own threads when the node has at
//! least two cores per local rank.
//!
//! A failed communicator abandons its MPI communicators instead of freeing
//! them: messages of the unfinished call may still arrive, and Open MPI
//! would hand them to the next communicator that reuses the freed context
//! id.

pub(crate) mod exchange;
pub(crate) mod exec;
pub(crate) mod fifo;
pub(crate) mod net;
pub(crate) mod reduce;
pub(crate) mod shm;
pub(crate) mod worker;

use crate::backend::shared::calibrate;
use crate::backend::shared::failure::{Failure, NodeSegments};
use crate::backend::shared::liveness::{Peer, PeerLiveness};
use crate::backend::shared::process;
use crate::backend::shared::setup::{self, agree};
use crate::backend::{Backend, Launch, PendingWork};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::topo::Topology;
use crate::tune::caps::{links, BackendCaps};
use crate::tune::Protocol;
use exec::Fabric;
use fifo::{FifoConn, FIFO_SLOTS};
use net::ChannelNet;
use shm::{SegLayout, Segment};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use worker::{Pending, Worker};

/// This machine's identity for the setup exchange: a hash of MPI's
/// processor name (the host name), the same for every process of the host
/// whatever node `GPUCOLL_SIM_NODES` or `GPUCOLL_NODE_ID` put it in.
fn host_key() -> Result<u64> {
    let name = crate::mpi::processor_name()?;
    // FNV-1a: stable across processes (std's hasher is randomly seeded).
    Ok(name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }))
}

/// Most channels a plan may use on this backend.
pub const MAX_CHANNELS: usize = 4;
/// Default bytes per FIFO slot (`GPUCOLL_HOST_SLOT_BYTES` overrides).
pub const DEFAULT_SLOT_BYTES: usize = 128 << 10;

/// State shared by the backend handle, its worker and channel threads.
struct HostShared {
    rank: usize,
    nranks: usize,
    local_rank: usize,
    /// Index within its node of every rank on this node, else None.
    local_of: Vec<Option<usize>>,
    /// The processes of this node's other ranks (a dead one fails us).
    liveness: PeerLiveness,
    layout: SegLayout,
    timeout: Duration,
    parallel: bool,
    /// Segments of this node by local rank (ours included).
    segs: Vec<Segment>,
    /// MPI connectors per channel; dropped before `comm`.
    net: Vec<Mutex<ChannelNet>>,
    /// Private duplicate of the communicator for point-to-point traffic
    /// (None on a single node).
    comm: Option<MpiComm>,
    /// Per channel, the communicator of this rank's rail (the ranks of its
    /// local index on every node) for collnet plans; empty on one node.
    rails: Vec<MpiComm>,
    failure: Failure,
    /// The sequence numbers of the launch being executed, each plus one
    /// (0: none): a failure is published as belonging to its first call,
    /// and a peer's failure of later calls does not fail it.
    running_first: AtomicU64,
    running_last: AtomicU64,
}

impl HostShared {
    fn own(&self) -> &Segment {
        &self.segs[self.local_rank]
    }

    /// This node's segments, whose abort words carry failures.
    fn node(&self) -> NodeSegments<'_, Segment> {
        NodeSegments {
            segs: &self.segs,
            local_rank: self.local_rank,
            rank: self.rank,
        }
    }

    /// The error every new submission gets once the backend failed.
    fn state_error(&self) -> Option<Error> {
        self.failure.error()
    }

    /// Mark failed (first reason wins) and tell local peers.
    fn mark_failed(&self, reason: String) -> bool {
        let at = self.running_first.load(Ordering::Relaxed).checked_sub(1);
        self.node().fail_at(&self.failure, reason, at)
    }

    fn run_launch(&self, launch: &Launch) -> Result<()> {
        if let Some(e) = self.state_error() {
            return Err(e);
        }
        let last = launch.first_seq + launch.items.len().saturating_sub(1) as u64;
        self.running_first
            .store(launch.first_seq.saturating_add(1), Ordering::Relaxed);
        self.running_last
            .store(last.saturating_add(1), Ordering::Relaxed);
        let result = exec::prepare(self, launch).and_then(|prep| {
            tracing::debug!(
                seq = launch.first_seq,
                items = launch.items.len(),
                channels = prep.channels().len(),
                "host backend launch"
            );
            exec::execute(self, &prep, self.parallel)
        });
        if let Err(e) = &result {
            self.fail(e);
        }
        self.running_first.store(0, Ordering::Relaxed);
        self.running_last.store(0, Ordering::Relaxed);
        result
    }
}

impl Fabric for HostShared {
    fn rank(&self) -> usize {
        self.rank
    }
    fn nranks(&self) -> usize {
        self.nranks
    }
    fn channels(&self) -> usize {
        self.layout.channels
    }
    fn slot_bytes(&self) -> usize {
        self.layout.slot_bytes
    }
    fn fifo_slots(&self) -> usize {
        self.layout.slots
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn shm_send(&self, channel: usize, peer: usize) -> Option<FifoConn<'_>> {
        let l = (*self.local_of.get(peer)?)?;
        let off = self.layout.connector_offset(channel, self.local_rank);
        Some(self.segs[l].connector(off, &self.layout))
    }

    fn shm_recv(&self, channel: usize, peer: usize) -> Option<FifoConn<'_>> {
        let l = (*self.local_of.get(peer)?)?;
        let off = self.layout.connector_offset(channel, l);
        Some(self.own().connector(off, &self.layout))
    }

    fn comm(&self) -> Option<&MpiComm> {
        self.comm.as_ref()
    }

    fn net(&self, channel: usize) -> &Mutex<ChannelNet> {
        &self.net[channel]
    }

    fn rail(&self) -> Option<u32> {
        (!self.rails.is_empty()).then_some(self.local_rank as u32)
    }

    fn rail_comm(&self, channel: usize) -> Option<&MpiComm> {
        self.rails.get(channel)
    }

    fn check_abort(&self) -> Result<()> {
        if self.failure.aborted() {
            return Err(Error::Aborted);
        }
        if let Some(e) = self.state_error() {
            return Err(e);
        }
        let peer = match self.running_last.load(Ordering::Relaxed).checked_sub(1) {
            Some(last) => self.node().peer_error_upto(last),
            None => self.node().peer_error(),
        };
        if let Some(e) = peer {
            return Err(e);
        }
        match self.liveness.dead() {
            Some(e) => {
                self.fail(&e);
                Err(e)
            }
            None => Ok(()),
        }
    }

    fn fail(&self, err: &Error) {
        if self.mark_failed(err.to_string()) {
            tracing::warn!(rank = self.rank, "host backend failed: {err}");
        }
    }
}

/// The host backend of one communicator.
pub struct HostBackend {
    inner: Arc<HostShared>,
    caps: BackendCaps,
    worker: Option<Worker>,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend")
            .field("rank", &self.inner.rank)
            .field("layout", &self.inner.layout)
            .field("threaded", &self.worker.is_some())
            .finish()
    }
}

/// The error of a setup stage that other ranks failed.
fn peers_could_not(what: &'static str) -> impl FnOnce(&[usize]) -> Error {
    move |failed| Error::System {
        call: "shm_open",
        message: format!("ranks {failed:?} could not {what}"),
    }
}

impl HostBackend {
    /// Set up shared memory with the local ranks and MPI connectors to the
    /// others. Collective over `mpi` (every rank must call it).
    ///
    /// `threaded`: MPI provides `MPI_THREAD_MULTIPLE`, so launches may run
    /// on a worker thread; otherwise they run inside `submit`.
    pub fn new(
        mpi: Arc<MpiComm>,
        topo: &Topology,
        config: &Config,
        threaded: bool,
    ) -> Result<HostBackend> {
        let (rank, nranks) = (topo.rank, topo.nranks);
        setup::check_topology(&mpi, topo)?;
        // Point-to-point traffic gets its own communicator so that its tags
        // never meet anyone else's messages.
        let comm = if topo.nnodes() > 1 {
            Some(mpi.dup()?)
        } else {
            None
        };

        // Agree on the layout: every rank proposes, all take the minimum, so
        // mismatched environments cannot produce mismatched FIFOs.
        let max_local = topo.nodes.iter().map(Vec::len).max().unwrap_or(1);
        let requested = config
            .host_slot_bytes
            .map_or(DEFAULT_SLOT_BYTES, |b| b.min(1 << 30) as usize);
        let slot = shm::choose_slot_bytes(requested, FIFO_SLOTS, MAX_CHANNELS, max_local);
        let pid = std::process::id();
        // Our segment's name is told over MPI only: nobody outside the job
        // can create it first or know it before it exists.
        let mine = (|| -> Result<exchange::RankSetup> {
            Ok(exchange::RankSetup {
                pid,
                nonce: process::random_nonce()?,
                slot_bytes: slot,
                channels: MAX_CHANNELS,
                host: host_key()?,
                start: process::own_start_time(),
            })
        })();
        let mine = agree(&mpi, mine, peers_could_not("identify themselves"))?;
        let all = mpi.allgather_bytes(&mine.encode())?;
        let ranks = exchange::parse(&all, nranks, 1 << 30, MAX_CHANNELS)?;
        let slot_bytes = ranks.iter().map(|r| r.slot_bytes).min().unwrap_or(slot);
        let channels = ranks.iter().map(|r| r.channels).min().unwrap_or(1);
        let pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();

        let node = &topo.nodes[topo.node()];
        let local_rank = topo.local_rank();
        let mut local_of = vec![None; nranks];
        for (l, &r) in node.iter().enumerate() {
            local_of[r] = Some(l);
        }
        let layout = SegLayout {
            slots: FIFO_SLOTS,
            slot_bytes,
            channels: channels.max(1),
            local_size: node.len(),
        };

        // Create ours; everyone checks everyone succeeded before mapping.
        let own = Segment::create(&shm::segment_name(pid, mine.nonce, local_rank), &layout);
        let mut own = agree(
            &mpi,
            own,
            peers_could_not("create their shared memory segment"),
        )?;
        let peers: Result<Vec<Option<Segment>>> = node
            .iter()
            .enumerate()
            .map(|(l, &r)| {
                if l == local_rank {
                    Ok(None)
                } else {
                    let name = shm::segment_name(pids[r], ranks[r].nonce, l);
                    Segment::open(&name, &layout, pids[r]).map(Some)
                }
            })
            .collect();
        let peers = agree(
            &mpi,
            peers,
            peers_could_not("map their peers' shared memory segments"),
        )?;
        // Everyone has mapped ours: drop the name so a crash leaves nothing.
        // A failed unlink only leaves the name for the stale cleanup: not
        // worth failing this rank alone, with the others already past.
        if let Err(e) = own.unlink() {
            tracing::warn!(rank, "host backend: {e}");
        }
        let mut own = Some(own);
        let segs: Vec<Segment> = peers
            .into_iter()
            .map(|s| s.or_else(|| own.take()).expect("own segment in its slot"))
            .collect();

        // The rails: split by local index, ordered by node; one duplicate
        // per channel so channels' rail calls never interleave on one
        // communicator.
        let rails = if topo.nnodes() > 1 {
            let rail = mpi
                .split(Some(local_rank as u32), topo.node() as i32)?
                .ok_or_else(|| Error::Backend("MPI_Comm_split gave no rail communicator".into()))?;
            (0..layout.channels)
                .map(|_| rail.dup())
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };

        // Several nodes: the NET hop and the rail measured, not guessed.
        let (inter, rail) = match rails.first() {
            Some(r) => {
                let t = std::time::Instant::now();
                // The executor calls MPI itself: nothing to add per hop.
                calibrate::agreed_costs(&mpi, calibrate::measure(r)?, topo.nnodes(), t, 0.0)?
            }
            None => (links::MPI_NET, links::MPI_RAIL),
        };
        let parallel = threaded
            && config.host_channel_threads.unwrap_or_else(|| {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                cores / node.len().max(1) >= 2
            });
        // Every rank on this machine is watched, not only this (possibly
        // simulated) node's: a process that dies on the same host is seen
        // at once, whichever node it is counted in.
        let host = ranks[rank].host;
        let peers = (0..nranks)
            .filter(|&r| r != rank && ranks[r].host == host)
            .map(|r| Peer {
                rank: r,
                pid: pids[r],
                start: ranks[r].start,
            })
            .collect();
        let inner = Arc::new(HostShared {
            rank,
            nranks,
            local_rank,
            local_of,
            liveness: PeerLiveness::new(peers),
            layout,
            timeout: config.timeout,
            parallel,
            segs,
            net: (0..layout.channels).map(|_| Mutex::default()).collect(),
            comm,
            rails,
            failure: Failure::default(),
            running_first: AtomicU64::new(0),
            running_last: AtomicU64::new(0),
        });
        let caps = BackendCaps {
            protocols: vec![Protocol::Simple],
            oneshot_protocols: vec![Protocol::Simple],
            max_channels: layout.channels,
            slot_bytes: slot_bytes as u64,
            fifo_slots: FIFO_SLOTS as u64,
            intra: links::HOST_SHM,
            inter,
            launch_us: links::HOST_LAUNCH_US,
            direct: false,
            oneshot_max_bytes: crate::tune::model::ONESHOT_MAX_BYTES,
            collnet: topo.nnodes() > 1,
            rail,
            copy_engine: None,
        };
        let worker = if threaded {
            let w = inner.clone();
            Some(Worker::spawn(format!("gpucoll-host-r{rank}"), move |l| {
                w.run_launch(l)
            })?)
        } else {
            None
        };
        tracing::info!(
            rank,
            segment_bytes = layout.total(),
            slot_bytes,
            channels = layout.channels,
            local_size = layout.local_size,
            nodes = topo.nnodes(),
            threaded,
            parallel_channels = parallel,
            "host backend ready"
        );
        Ok(HostBackend {
            inner,
            caps,
            worker,
        })
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn caps(&self) -> &BackendCaps {
        &self.caps
    }

    unsafe fn submit(&self, launch: Launch) -> Result<Box<dyn PendingWork>> {
        if let Some(e) = self.inner.state_error() {
            return Err(e);
        }
        if launch.stream.is_some() {
            return Err(Error::InvalidUsage(
                "the host backend does not execute on CUDA streams".into(),
            ));
        }
        let empty = launch.items.iter().all(|it| {
            it.plan
                .channels
                .iter()
                .all(|c| c.steps.iter().all(|s| s.count() == 0))
        });
        if empty {
            return Ok(Box::new(Pending::ready(Ok(()))));
        }
        match &self.worker {
            Some(w) => Ok(Box::new(w.submit(launch)?)),
            None => Ok(Box::new(Pending::ready(self.inner.run_launch(&launch)))),
        }
    }

    unsafe fn run(&self, launch: Launch) -> Result<()> {
        // A blocking call with nothing queued runs on the caller's thread:
        // handing it to the worker and waking the caller again costs more
        // than a small collective. Launches still run in issue order: the
        // engine submits one at a time, and the worker is idle.
        match &self.worker {
            Some(w) if !w.idle() => {
                // SAFETY: forwarded from the caller; we wait before returning.
                let mut work = unsafe { self.submit(launch)? };
                work.wait()
            }
            _ => {
                if let Some(e) = self.inner.state_error() {
                    return Err(e);
                }
                if launch.stream.is_some() {
                    return Err(Error::InvalidUsage(
                        "the host backend does not execute on CUDA streams".into(),
                    ));
                }
                self.inner.run_launch(&launch)
            }
        }
    }

    fn abort(&self, reason: &str) {
        self.inner.failure.abort();
        if self.inner.mark_failed(format!("aborted: {reason}")) {
            tracing::warn!(rank = self.inner.rank, "host backend aborted: {reason}");
        }
    }

    fn peer_failure(&self) -> Option<Error> {
        if let Some(e) = self.inner.node().peer_error() {
            return Some(e);
        }
        let e = self.inner.liveness.dead()?;
        self.inner.fail(&e);
        Some(e)
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        // Finish (or fail) the queued launches before unmapping anything.
        if let Some(mut w) = self.worker.take() {
            w.stop();
        }
    }
}

impl Drop for HostShared {
    fn drop(&mut self) {
        // A failed communicator's inter-node traffic may still be arriving:
        // its MPI communicators are abandoned, not freed (see `abandon`).
        if self.failure.is_set() {
            self.rails.drain(..).for_each(MpiComm::abandon);
            if let Some(c) = self.comm.take() {
                c.abandon();
            }
        }
    }
}
