//! [`CudaBackend`]: connectors, launches and completion.
//!
//! Every (channel, sender, receiver) pair has a FIFO connector. Ranks of the
//! same (real or simulated) node use P2P (the receiver's FIFOs in a
//! `cuMemAlloc` block shared with CUDA IPC) or SHM (`/dev/shm` segments
//! registered with CUDA); ranks on other nodes use NET (`super::net`: both
//! connectors in the rank's own pinned host memory, moved over MPI by a
//! proxy thread). The kernels see the same `GcConn` for all three. The GPU
//! is picked by the rank's index among the processes of its host.

use super::abi::*;
use super::driver::{self, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream, Capture};
use super::memory::{bind, DevMem, DeviceCtx, PinnedMem};
use super::net::{self, NetLayout, NetProxy};
use super::shm::{self, Segment};
use crate::backend::{Backend, BackendCaps, Launch, LinkCost, PendingWork};
use crate::buffer::{MemoryKind, RawBuffer};
use crate::config::Config;
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::op::Combine;
use crate::plan::{BufId, Region, Step};
use crate::topo::Topology;
use crate::tune::Protocol;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Slots per FIFO (NCCL's `NCCL_STEPS`).
pub const FIFO_SLOTS: usize = 8;
/// P2P channels (one block each): 256 / nranks within 16..=128;
/// `GPUCOLL_CUDA_CHANNELS` overrides (the smallest value of all ranks is
/// used). At most [`MAX_CHANNELS`]. On 2×H200 a 256 MiB all_reduce reached
/// 309 / 316 / 331 GB/s with 64 / 96 / 128 channels (docs/CUDA_NOTES.md).
fn p2p_channels(nranks: usize) -> usize {
    (256 / nranks.max(1)).clamp(16, 128)
}
/// P2P slot size for `channels` channels: 512 KiB up to 64 channels, then
/// smaller so that the FIFO memory (channels × nranks × 8 slots per rank)
/// stays near 512 MiB for 2 ranks; `GPUCOLL_CUDA_SLOT_KB` overrides
/// (smallest of all ranks).
fn p2p_slot_bytes(channels: usize) -> usize {
    if channels > 64 {
        256 << 10
    } else {
        512 << 10
    }
}
/// Most channels (`GPUCOLL_CUDA_CHANNELS`); the per-channel status area
/// holds them.
const MAX_CHANNELS: usize = 128;
const _: () = assert!(
    shm::STATUS_OFF + MAX_CHANNELS * std::mem::size_of::<GcChanStatus>() <= shm::CONTROL_BYTES
);
const MAX_CHANNELS_SHM: usize = 4;
const SLOT_BYTES_SHM: usize = 64 << 10;
/// Multi-node communicators (NET connectors between nodes; P2P or SHM
/// inside them): a few channels of moderate slots, as for SHM, since every
/// inter-node piece is an MPI message handled by the proxy thread.
/// `GPUCOLL_CUDA_CHANNELS` / `GPUCOLL_CUDA_SLOT_KB` override (smallest of
/// all ranks).
const NET_CHANNELS: usize = 4;
const SLOT_BYTES_NET: usize = 128 << 10;
/// Threads per block (must match `GC_THREADS` in the kernel).
const THREADS: u32 = 512;
/// How long a kernel may take to leave after its abort word was raised
/// before `wait` gives up on it (and leaks its memory).
const ABORT_GRACE: Duration = Duration::from_secs(10);
/// `wait` spins (no yield, no sleep) this long before it yields, then sleeps:
/// a small collective completes in ~10 µs, and a sleep costs ≥ 50 µs.
const WAIT_SPIN: Duration = Duration::from_micros(200);
/// After the spin, `wait` yields this long before it sleeps between polls.
const WAIT_YIELD: Duration = Duration::from_millis(2);
/// While the work is not complete, progress, abort and timeout are checked
/// at most this often (the completion query itself runs on every poll).
const CHECK_EVERY: Duration = Duration::from_micros(100);
/// Uploaded step tables kept for reuse (identical plan and buffers).
const STEP_CACHE_ENTRIES: usize = 16;
/// Largest step table (bytes) the cache keeps.
const STEP_CACHE_MAX_BYTES: usize = 64 << 10;
/// Completion events kept for reuse.
const EVENT_POOL_MAX: usize = 256;

/// Per channel (one block of 512 threads) over NVLink, measured on 2×H200
/// (NV18): 64 channels reach ≈ 330 GB/s on a 1 GiB ring all_reduce, so a
/// channel's share is ≈ 5.2 GB/s; a piece costs ≈ 3 µs of flags.
const INTRA_P2P: LinkCost = LinkCost {
    latency_us: 3.0,
    bandwidth_gbs: 5.5,
};
const INTRA_SHM: LinkCost = LinkCost {
    latency_us: 6.0,
    bandwidth_gbs: 5.0,
};
/// Per channel and inter-node hop (NET: proxy thread + MPI message pair).
/// An estimate, not calibrated yet.
const INTER: LinkCost = LinkCost {
    latency_us: 10.0,
    bandwidth_gbs: 3.0,
};
const LAUNCH_US: f64 = 6.0;

/// Most ranks and blocks of the direct (one-shot) kernels (`GC_DIRECT_MAX_*`).
const DIRECT_MAX_RANKS: usize = 8;
const DIRECT_MAX_BLOCKS: u64 = 64;
/// Bytes per block below which the one-shot kernel uses fewer blocks.
const DIRECT_BLOCK_BYTES: u64 = 32 << 10;
/// Largest one-shot all_reduce (bytes); the inboxes are sized for it.
const DIRECT_MAX_BYTES: u64 = crate::tune::model::DIRECT_ONESHOT_MAX_BYTES;
/// Bytes of one parity's flags: `[sender][block]` of `GcFlag` (16 bytes).
const DIRECT_FLAGS_BYTES: u64 = DIRECT_MAX_RANKS as u64 * DIRECT_MAX_BLOCKS * 16;
/// Largest LL one-shot all_reduce (bytes).
const DIRECT_LL_MAX_BYTES: u64 = crate::tune::model::DIRECT_LL_MAX_BYTES;
/// Bytes of one LL inbox: a header line per block, then one 16-byte line
/// per 8 data bytes.
const DIRECT_LL_BOX_BYTES: u64 = (LL_HEADER_LINES + DIRECT_LL_MAX_BYTES / 8) * 16;
/// Bytes of one sender's inbox: Simple data, then the LL lines.
const DIRECT_BOX_BYTES: u64 = DIRECT_MAX_BYTES + DIRECT_LL_BOX_BYTES;
/// Bytes before the parities of the direct area: the launch counter
/// (`GcDirectCtl`), on a page of its own.
const DIRECT_CTL_BYTES: u64 = 4096;
/// Data bytes per block of the LL one-shot: one 8-byte unit per thread.
const DIRECT_LL_BLOCK_BYTES: u64 = THREADS as u64 * 8;

/// A positive integer from the environment, if set and valid.
fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&v| v > 0)
}

static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpucoll_kernels.fatbin"));

/// `GPUCOLL_P2P_DISABLE=1` (parsed, validated and agreed across ranks in
/// [`Config`]): connectors in host shared memory instead of peer device
/// memory.
pub fn p2p_disabled(config: &Config) -> bool {
    config.p2p_disable
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    P2p,
    Shm,
}

/// Where every connector lives, identical on all ranks.
#[derive(Debug, Clone, Copy)]
struct Layout {
    nranks: u64,
    channels: u64,
    slots: u64,
    slot_bytes: u64,
    /// Whether the block ends with the direct area (P2P only).
    direct: bool,
}

impl Layout {
    fn conn_bytes(&self) -> u64 {
        CONN_HEADER + self.slots * self.slot_bytes
    }
    fn heads_bytes(&self) -> u64 {
        self.channels * self.nranks * HEAD_STRIDE
    }
    /// The head word the receiver `receiver` writes, in the sender's area.
    fn head_off(&self, c: u64, receiver: u64) -> u64 {
        (c * self.nranks + receiver) * HEAD_STRIDE
    }
    /// The connector from `sender`, in the receiver's area.
    fn conn_off(&self, c: u64, sender: u64) -> u64 {
        self.heads_bytes() + (c * self.nranks + sender) * self.conn_bytes()
    }
    fn fifo_total(&self) -> u64 {
        self.heads_bytes() + self.channels * self.nranks * self.conn_bytes()
    }
    /// Start of the direct area: the launch counter, then per parity, flags
    /// and one inbox per sender.
    fn direct_off(&self) -> u64 {
        self.fifo_total().div_ceil(4096) * 4096
    }
    fn direct_parity_bytes(&self) -> u64 {
        DIRECT_FLAGS_BYTES + self.nranks * DIRECT_BOX_BYTES
    }
    /// Flags `[sender][..]` of parity 0, relative to the direct area.
    fn direct_flags(&self, sender: u64) -> u64 {
        DIRECT_CTL_BYTES + sender * DIRECT_MAX_BLOCKS * 16
    }
    /// Inbox of `sender` for parity 0, relative to the direct area.
    fn direct_inbox(&self, sender: u64) -> u64 {
        DIRECT_CTL_BYTES + DIRECT_FLAGS_BYTES + sender * DIRECT_BOX_BYTES
    }
    fn total(&self) -> u64 {
        if self.direct {
            self.direct_off() + DIRECT_CTL_BYTES + 2 * self.direct_parity_bytes()
        } else {
            self.fifo_total()
        }
    }
}

/// A pinned host + device pair for uploading a launch's steps.
struct WorkBuf {
    host: PinnedMem,
    dev: DevMem,
}

/// A step table already on the device: `work.host[..len]` holds the bytes
/// that were uploaded to `work.dev`, which kernels only read. Submissions
/// with byte-identical tables (same plan, same buffers) reuse it.
struct CachedSteps {
    work: WorkBuf,
    len: usize,
}

impl CachedSteps {
    fn holds(&self, bytes: &[u8]) -> bool {
        // SAFETY: the pinned buffer holds at least `len` initialized bytes and
        // is never written after the upload (the entry is immutable).
        self.len == bytes.len()
            && unsafe { std::slice::from_raw_parts(self.work.host.host, self.len) } == bytes
    }
}

struct Inner {
    rank: usize,
    nranks: usize,
    local_rank: usize,
    ctx: DeviceCtx,
    module: CUmodule,
    funcs: [CUfunction; 10],
    /// One-shot all_reduce kernels (`gc_direct_ar_*`), by datatype.
    direct_funcs: [CUfunction; 10],
    stream: CUstream,
    layout: Layout,
    /// Device address (in our context) of every rank's direct area (the
    /// end of its P2P block); empty without the direct path.
    bases: Vec<u64>,
    timeout: Duration,
    /// Connectors to ranks on other nodes and their proxy thread (multi-node
    /// communicators only). Stopped in `Drop` after the teardown barrier
    /// (declared before `segs`: the thread holds clones of them).
    net: Option<NetProxy>,
    /// Control segments of every local rank (ours at `local_rank`).
    segs: Vec<Arc<Segment>>,
    /// Our P2P block (heads + receive FIFOs).
    _fifo: Option<DevMem>,
    /// For the teardown barrier: peers write into our P2P block (head
    /// credits, FIFO slots, direct inboxes), so it is freed only once every
    /// rank's kernels are known to be done.
    mpi: Arc<MpiComm>,
    /// Peers' P2P blocks opened through IPC.
    peer_blocks: Vec<CUdeviceptr>,
    send_conns: DevMem,
    recv_conns: DevMem,
    pool: Mutex<Vec<WorkBuf>>,
    /// Recently uploaded step tables, most recent last.
    step_cache: Mutex<VecDeque<Arc<CachedSteps>>>,
    /// Completion events of finished submissions, for reuse.
    events: Mutex<Vec<CUevent>>,
    aborted: AtomicBool,
    failed_flag: AtomicBool,
    failed: Mutex<Option<String>>,
    /// Orders consecutive submissions that go to different streams.
    order: Mutex<Order>,
    /// What the kernels of captured CUDA graphs read (step tables with their
    /// pinned staging, scratch memory): kept unchanged for the backend's
    /// life, since the graph may be replayed at any time.
    graph_keep: Mutex<Vec<Resources>>,
}

/// The stream of the last submission and the event that marks its end.
///
/// Kernels of consecutive submissions share connectors (FIFO counters), so
/// they must never run concurrently: a submission on another stream than
/// the previous one first waits (on the device) for the previous one.
#[derive(Default)]
struct Order {
    /// Raw handle of the last submission's stream.
    last: Option<u64>,
    /// Recorded after the last submission on a caller's stream (or, when
    /// switching away from our own stream, at the switch).
    event: Option<CUevent>,
}

// SAFETY: the raw CUDA handles (module, functions, stream) are usable from
// any thread once the context is bound (every entry point binds it); the
// mutable state is behind atomics and mutexes.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Inner {
    fn own(&self) -> &Segment {
        &self.segs[self.local_rank]
    }

    /// The NET proxy's failure, if it failed.
    fn net_error(&self) -> Option<Error> {
        self.net.as_ref().and_then(|n| n.error())
    }

    fn state_error(&self) -> Option<Error> {
        if let Some(e) = self.net_error() {
            self.mark_failed(e.to_string());
        }
        if !self.failed_flag.load(Ordering::Acquire) && !self.aborted.load(Ordering::Acquire) {
            // A local peer that failed raised our abort word: fail before
            // launching, or a kernel could complete from what the failed
            // peer had already pushed before it gave up.
            let w = self.peer_raiser()?;
            let reason = self.peer_reason(w);
            self.mark_failed(format!("peer failed: {reason}"));
            return Some(Error::PeerFailed(reason));
        }
        let reason = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "aborted".into());
        Some(Error::CommunicatorFailed(reason))
    }

    /// Mark failed (first reason wins) and raise every local abort word.
    fn mark_failed(&self, reason: String) -> bool {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some() {
            return false;
        }
        self.own()
            .write_reason(&format!("rank {}: {reason}", self.rank));
        for s in &self.segs {
            s.raise_abort(self.local_rank);
        }
        *f = Some(reason);
        self.failed_flag.store(true, Ordering::Release);
        true
    }

    /// The local rank (other than us) that raised our abort word, if any.
    fn peer_raiser(&self) -> Option<usize> {
        let w = self.own().abort_word() & 0xffff_ffff;
        (w != 0 && w - 1 != self.local_rank as u64).then(|| (w - 1) as usize)
    }

    fn peer_reason(&self, who: usize) -> String {
        self.segs
            .get(who)
            .and_then(|s| s.reason())
            .unwrap_or_else(|| format!("local rank {who} raised the abort flag without a reason"))
    }

    fn status_word(&self, c: usize, off: usize) -> u64 {
        self.own()
            .read_u64(shm::STATUS_OFF + c * std::mem::size_of::<GcChanStatus>() + off)
    }

    fn progress_sum(&self) -> u64 {
        (0..self.layout.channels as usize)
            .map(|c| self.status_word(c, 24))
            .fold(0u64, u64::wrapping_add)
    }

    fn take_work(&self, bytes: usize) -> Result<WorkBuf> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = pool.iter().position(|w| w.host.bytes >= bytes) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        let cap = bytes.next_power_of_two().max(64 << 10);
        Ok(WorkBuf {
            host: PinnedMem::alloc(cap)?,
            dev: DevMem::alloc(cap)?,
        })
    }

    /// A completion event, from the pool when one is free.
    fn take_event(&self) -> Result<CUevent> {
        let e = self.events.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match e {
            Some(e) => Ok(e),
            None => driver::event_create(),
        }
    }

    /// Return the event of a completed submission (context bound).
    fn give_event(&self, e: CUevent) {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < EVENT_POOL_MAX {
            pool.push(e);
        } else {
            drop(pool);
            driver::event_destroy(e);
        }
    }

    /// A cached step table whose bytes equal `bytes`, made most recent.
    fn cached_steps(&self, bytes: &[u8]) -> Option<Arc<CachedSteps>> {
        let mut cache = self.step_cache.lock().unwrap_or_else(|p| p.into_inner());
        let i = cache.iter().rposition(|c| c.holds(bytes))?;
        let hit = cache.remove(i)?;
        cache.push_back(hit.clone());
        Some(hit)
    }

    /// Keep an uploaded table; the evicted one goes back to the pool once no
    /// submission in flight holds it (else its last holder returns it).
    fn cache_steps(&self, entry: Arc<CachedSteps>) {
        let mut cache = self.step_cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.push_back(entry);
        let old = if cache.len() > STEP_CACHE_ENTRIES {
            cache.pop_front()
        } else {
            None
        };
        drop(cache);
        if let Some(old) = old {
            self.release_cached(old);
        }
    }

    fn release_cached(&self, c: Arc<CachedSteps>) {
        if let Ok(c) = Arc::try_unwrap(c) {
            self.give_work(c.work);
        }
    }

    fn give_work(&self, w: WorkBuf) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        // Enough for a deep queue of back-to-back launches (each holds one
        // until it completes); re-allocating pinned memory costs ~100 µs.
        if pool.len() < 256 {
            pool.push(w);
        }
    }
}

/// How long a dropped communicator waits for its peers to drop theirs
/// before it leaks its P2P block instead of freeing it under them.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(30);

impl Drop for Inner {
    fn drop(&mut self) {
        if bind(self.ctx.ordinal).is_ok() {
            let _ = driver::stream_synchronize(self.stream);
            // A peer's last kernel may still write a head credit or a slot
            // into our block after our own kernels finished. Free it only
            // after every rank has synchronized its stream (a barrier, which
            // makes dropping the communicator collective, like
            // MPI_Comm_free); a failed communicator or a peer that never
            // comes leaks it instead. The NET proxy must keep running until
            // then too: our kernels may have finished with pieces still in
            // our staging FIFOs that a peer's kernel waits for.
            if self._fifo.is_some() || self.net.is_some() {
                let healthy = self.state_error().is_none()
                    && self
                        .mpi
                        .allgather_bytes_timeout(&[1], TEARDOWN_TIMEOUT)
                        .is_ok();
                if !healthy && self._fifo.is_some() {
                    tracing::warn!(
                        rank = self.rank,
                        "CUDA backend teardown: peers not confirmed idle; leaking the P2P block"
                    );
                    std::mem::forget(self._fifo.take());
                }
            }
            // Stop the proxy and cancel its posted receives (it leaks the
            // NET block if MPI might still write into it).
            if let Some(n) = self.net.as_mut() {
                let _ = n.stop();
            }
            self.pool
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            self.step_cache
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            for e in self
                .events
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
            {
                driver::event_destroy(e);
            }
            self.graph_keep
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            if let Some(e) = self
                .order
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .event
                .take()
            {
                driver::event_destroy(e);
            }
            for &p in &self.peer_blocks {
                if p != 0 {
                    driver::ipc_close(p);
                }
            }
            driver::stream_destroy(self.stream);
            driver::module_unload(self.module);
        }
    }
}

/// The CUDA backend of one communicator: one GPU per process (the rank's
/// index among the processes of its host, modulo the GPU count; several
/// ranks may share a GPU).
pub struct CudaBackend {
    inner: Arc<Inner>,
    caps: BackendCaps,
    /// Work queued on callers' streams, watched by a background thread.
    watch: Arc<Watch>,
    watcher: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The watchdog of work queued on callers' streams (`Backend::enqueue`):
/// a thread (started with the first such launch) polls each one, as `wait`
/// would, until it completed: it releases its resources then, and turns "no
/// progress for `GPUCOLL_TIMEOUT` once the stream reached the work" into a
/// timeout that raises the abort word (so the kernels leave) and fails the
/// communicator. The first error is kept for `async_error`.
#[derive(Default)]
struct Watch {
    queue: Mutex<Vec<CudaPending>>,
    wake: Condvar,
    stop: AtomicBool,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// Sleep between rounds of polls while stream work is in flight.
const WATCH_POLL: Duration = Duration::from_micros(500);

impl Watch {
    fn record(&self, e: Error) {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            tracing::error!("collective queued on a CUDA stream failed: {e}");
            *g = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn run(&self, ordinal: i32, give_up_after: Duration) {
        // This thread frees memory and queries events while the program may
        // be capturing a stream in global mode on another thread: in relaxed
        // mode those calls neither fail nor invalidate that capture.
        let _relaxed = driver::RelaxedCapture::enter().ok();
        let mut bound = false;
        let mut stopping: Option<Instant> = None;
        loop {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            while q.is_empty() && !self.stop.load(Ordering::Acquire) {
                q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.is_empty() {
                return;
            }
            if !bound {
                bound = bind(ordinal).is_ok();
            }
            let mut first = None;
            q.retain_mut(|p| match p.poll(bound) {
                None => true,
                Some(Ok(())) => false,
                Some(Err(e)) => {
                    first.get_or_insert(e);
                    false
                }
            });
            if let Some(e) = first {
                self.record(e);
            }
            if self.stop.load(Ordering::Acquire) && !q.is_empty() {
                let t = *stopping.get_or_insert_with(Instant::now);
                if t.elapsed() > give_up_after {
                    // The caller's stream never reached (or never finished)
                    // this work: leak it rather than free memory under it.
                    tracing::warn!(
                        pending = q.len(),
                        "CUDA backend dropped with stream work that never completed; leaking it"
                    );
                    for p in q.drain(..) {
                        std::mem::forget(p);
                    }
                    return;
                }
            }
            let busy = !q.is_empty();
            drop(q);
            if busy {
                std::thread::sleep(WATCH_POLL);
            }
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        {
            let _q = self.watch.queue.lock().unwrap_or_else(|p| p.into_inner());
            self.watch.stop.store(true, Ordering::Release);
        }
        self.watch.wake.notify_all();
        if let Some(h) = self
            .watcher
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("rank", &self.inner.rank)
            .field("gpu", &self.inner.ctx.ordinal)
            .field("layout", &self.inner.layout)
            .finish()
    }
}

/// Whether every rank succeeded; the first local error wins, else a
/// description of the ranks that failed. Collective over `mpi`.
fn agree<T>(mpi: &MpiComm, mine: Result<T>, what: &str) -> Result<T> {
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

fn random_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i * 8..i * 8 + 8]);
    u64::from_le_bytes(w)
}

/// What stage 1 produces on each rank.
struct Local {
    ctx: DeviceCtx,
    module: CUmodule,
    funcs: [CUfunction; 10],
    direct_funcs: [CUfunction; 10],
    stream: CUstream,
}

fn load_local(ordinal: i32) -> Result<Local> {
    let ctx = bind(ordinal)?;
    // cuModuleLoadData wants an aligned image; the embedded bytes are not.
    let mut image = vec![0u64; FATBIN.len().div_ceil(8) + 1];
    // SAFETY: the vector holds at least FATBIN.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(FATBIN.as_ptr(), image.as_mut_ptr() as *mut u8, FATBIN.len())
    };
    // SAFETY: u64 storage viewed as bytes, same allocation and length.
    let bytes = unsafe { std::slice::from_raw_parts(image.as_ptr() as *const u8, FATBIN.len()) };
    let module = driver::module_load(bytes)?;
    let mut funcs = [std::ptr::null_mut(); 10];
    let mut direct_funcs = [std::ptr::null_mut(); 10];
    for d in Datatype::ALL {
        for (name, table) in [
            (format!("gc_run_{}", d.rust_name()), &mut funcs),
            (format!("gc_direct_ar_{}", d.rust_name()), &mut direct_funcs),
        ] {
            let name =
                std::ffi::CString::new(name).map_err(|_| Error::Backend("kernel name".into()))?;
            match driver::module_function(module, &name) {
                Ok(f) => table[d as usize] = f,
                Err(e) => {
                    driver::module_unload(module);
                    return Err(e);
                }
            }
        }
    }
    let stream = match driver::stream_create() {
        Ok(s) => s,
        Err(e) => {
            driver::module_unload(module);
            return Err(e);
        }
    };
    Ok(Local {
        ctx,
        module,
        funcs,
        direct_funcs,
        stream,
    })
}

/// The connector tables `(send, recv)`, indexed `[channel * nranks + peer]`,
/// as rank `rank` sees them. `bases[r]`: rank `r`'s P2P/SHM area in our
/// address space (for ranks of our node); `net_dev`: our NET block. Every
/// offset comes from the agreed layouts, so a sender's connector and its
/// receiver's are the same memory.
fn conn_tables(
    rank: usize,
    layout: &Layout,
    bases: &[u64],
    net: &NetLayout,
    net_dev: u64,
) -> (Vec<GcConn>, Vec<GcConn>) {
    let n = layout.nranks as usize;
    let me = rank as u64;
    let mut send = vec![GcConn::default(); layout.channels as usize * n];
    let mut recv = vec![GcConn::default(); layout.channels as usize * n];
    let conn = |base: u64, head: u64| GcConn {
        data: base + CONN_HEADER,
        meta: base + CONN_META_OFF,
        tail: base + CONN_TAIL_OFF,
        head,
        ..GcConn::default()
    };
    for c in 0..layout.channels {
        for p in (0..n).filter(|&p| p != rank) {
            let k = c as usize * n + p;
            let pu = p as u64;
            if let Some(i) = net.index_of(p) {
                // NET: both connectors in our NET block; the proxy moves the
                // pieces between our staging FIFO and the peer's receive FIFO.
                recv[k] = conn(net_dev + net.recv_conn(c, i), net_dev + net.recv_head(c, i));
                send[k] = conn(net_dev + net.send_conn(c, i), net_dev + net.send_head(c, i));
            } else {
                recv[k] = conn(
                    bases[rank] + layout.conn_off(c, pu),
                    bases[p] + layout.head_off(c, me),
                );
                send[k] = conn(
                    bases[p] + layout.conn_off(c, me),
                    bases[rank] + layout.head_off(c, pu),
                );
            }
        }
    }
    (send, recv)
}

impl CudaBackend {
    /// Set up connectors with every rank of the communicator. Collective
    /// over `mpi`: every rank must call it.
    pub fn new(mpi: Arc<MpiComm>, topo: &Topology, config: &Config) -> Result<CudaBackend> {
        let (rank, nranks) = (topo.rank, topo.nranks);
        if mpi.rank() != rank || mpi.size() != nranks {
            return Err(Error::Backend(format!(
                "topology (rank {rank} of {nranks}) does not match the MPI communicator \
                 (rank {} of {})",
                mpi.rank(),
                mpi.size()
            )));
        }
        // Ranks on other (real or simulated) nodes are reached through NET
        // connectors: every rank agrees on this from the topology.
        let multi = topo.nnodes() > 1;
        let local_rank = topo.local_rank();
        let local_size = topo.local_size();
        let p2p_off = p2p_disabled(config);
        // GPUs are picked by the rank's index among the processes of its
        // host, not of its node: simulated nodes split a host's ranks, not
        // its GPUs. Collective (every rank calls it).
        let host_rank = mpi.split_shared().map(|s| s.rank());
        // The NET proxy thread calls MPI while the caller's thread may too.
        let threads = if multi {
            match crate::mpi::query_thread() {
                Ok(crate::env::Threading::Multiple) => Ok(()),
                Ok(t) => Err(Error::Backend(format!(
                    "the CUDA backend needs MPI_THREAD_MULTIPLE for a communicator that spans \
                     {} nodes (its NET proxy thread calls MPI), but MPI provides {t:?}; \
                     initialize MPI with gpucoll::initialize() or MPI_THREAD_MULTIPLE, or use \
                     GPUCOLL_BACKEND=host",
                    topo.nnodes()
                ))),
                Err(e) => Err(e),
            }
        } else {
            Ok(())
        };

        // Stage 1: driver, device, module, stream.
        let local = threads.and_then(|_| {
            let host_rank = host_rank?;
            if !driver::available() {
                return Err(Error::Backend(
                    "the CUDA backend needs the CUDA driver (libcuda.so), which is not \
                     available on this machine; use GPUCOLL_BACKEND=host"
                        .into(),
                ));
            }
            let n = driver::device_count()?;
            if n == 0 {
                return Err(Error::Backend("the CUDA driver shows no GPU".into()));
            }
            load_local((host_rank % n) as i32)
        });
        let local = agree(&mpi, local, "initialize CUDA")?;
        let Local {
            ctx,
            module,
            funcs,
            direct_funcs,
            stream,
        } = local;
        // From here on, failures must release what stage 1 created.
        let cleanup = |e: Error| {
            driver::stream_destroy(stream);
            driver::module_unload(module);
            e
        };

        // Stage 2: identities, device ordinals, P2P feasibility.
        let tag = random_tag();
        let def_channels = if multi {
            NET_CHANNELS
        } else {
            p2p_channels(nranks)
        };
        let want_channels = env_usize("GPUCOLL_CUDA_CHANNELS")
            .unwrap_or(def_channels)
            .min(MAX_CHANNELS);
        // 0: no preference (the default for the agreed channel count).
        let want_slot = env_usize("GPUCOLL_CUDA_SLOT_KB")
            .map(|k| (k << 10).clamp(4 << 10, 4 << 20))
            .unwrap_or(0);
        let mine: Vec<u8> = [
            std::process::id() as u64,
            tag,
            ctx.ordinal as u64,
            p2p_off as u64,
            want_channels as u64,
            want_slot as u64,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        let all = mpi.allgather_bytes(&mine).map_err(cleanup)?;
        if all.len() != 48 * nranks {
            return Err(cleanup(Error::Backend(
                "CUDA backend setup exchange was truncated".into(),
            )));
        }
        let pids: Vec<u32> = (0..nranks).map(|r| u64_at(&all, r * 6) as u32).collect();
        let tag = u64_at(&all, 1);
        let ords: Vec<i32> = (0..nranks)
            .map(|r| u64_at(&all, r * 6 + 2) as i32)
            .collect();
        let any_off = (0..nranks).any(|r| u64_at(&all, r * 6 + 3) != 0);
        // Every rank must use the same layout: the smallest request wins.
        let req_channels = (0..nranks)
            .map(|r| u64_at(&all, r * 6 + 4) as usize)
            .min()
            .unwrap_or(def_channels)
            .max(1);
        let req_slot = (0..nranks)
            .map(|r| u64_at(&all, r * 6 + 5) as usize)
            .filter(|&s| s > 0)
            .min()
            .unwrap_or(if multi {
                SLOT_BYTES_NET
            } else {
                p2p_slot_bytes(req_channels)
            })
            / 64
            * 64;
        // P2P (CUDA IPC) only within a node: every rank must reach the GPUs
        // of the ranks on its node.
        let can_p2p = (|| -> Result<bool> {
            for (r, &o) in ords.iter().enumerate() {
                if topo.same_node(r, rank) && o != ctx.ordinal {
                    let peer = driver::device_get(o)?;
                    if !driver::can_access_peer(ctx.dev, peer)? {
                        return Ok(false);
                    }
                }
            }
            Ok(true)
        })()
        .unwrap_or(false);
        let oks = mpi.allgather_bytes(&[can_p2p as u8]).map_err(cleanup)?;
        let transport = if any_off || oks.contains(&0) {
            Transport::Shm
        } else {
            Transport::P2p
        };
        let (channels, slot_bytes) = match (multi, transport) {
            (true, _) | (false, Transport::P2p) => (req_channels, req_slot),
            (false, Transport::Shm) => (MAX_CHANNELS_SHM, SLOT_BYTES_SHM),
        };
        let layout = Layout {
            nranks: nranks as u64,
            channels: channels as u64,
            slots: FIFO_SLOTS as u64,
            slot_bytes: slot_bytes as u64,
            // The one-shot path needs every peer mapped: single node only.
            direct: !multi
                && transport == Transport::P2p
                && nranks > 1
                && nranks <= DIRECT_MAX_RANKS,
        };
        // Ranks on other nodes, reached through NET connectors.
        let net_layout = NetLayout {
            peers: (0..nranks).filter(|&r| !topo.same_node(r, rank)).collect(),
            channels: layout.channels,
            slots: layout.slots,
            slot_bytes: layout.slot_bytes,
        };

        // Stage 3: control segments (plus the FIFOs for SHM).
        let seg_bytes = shm::CONTROL_BYTES
            + match transport {
                Transport::Shm => layout.total() as usize,
                Transport::P2p => 0,
            };
        let seg_bytes = seg_bytes.div_ceil(4096) * 4096;
        let node: Vec<usize> = topo.nodes[topo.node()].clone();
        let own = Segment::create(&shm::segment_name(pids[rank], tag, local_rank), seg_bytes);
        let own = agree(&mpi, own, "create their shared memory segment").map_err(cleanup)?;
        let mut own = Some(own);
        let segs: Result<Vec<Segment>> = node
            .iter()
            .enumerate()
            .map(|(l, &r)| {
                if l == local_rank {
                    own.take()
                        .ok_or_else(|| Error::Backend("own segment taken twice".into()))
                } else {
                    Segment::open(&shm::segment_name(pids[r], tag, l), seg_bytes)
                }
            })
            .collect();
        let mut segs =
            agree(&mpi, segs, "map their peers' shared memory segments").map_err(cleanup)?;
        segs[local_rank].unlink();
        let reg = (|| -> Result<()> {
            for (l, s) in segs.iter_mut().enumerate() {
                if l == local_rank || transport == Transport::Shm {
                    s.register()?;
                }
            }
            Ok(())
        })();
        if let Err(e) = agree(&mpi, reg, "register shared memory with CUDA") {
            drop(segs);
            return Err(cleanup(e));
        }
        let segs: Vec<Arc<Segment>> = segs.into_iter().map(Arc::new).collect();

        // Stage 4: FIFO memory of every rank of our node, as device
        // addresses by rank (0 for ranks on other nodes).
        let mut fifo: Option<DevMem> = None;
        let mut peer_blocks = vec![0u64; nranks];
        let bases: Result<Vec<u64>> = match transport {
            Transport::Shm => {
                let mut b = vec![0u64; nranks];
                node.iter()
                    .enumerate()
                    .try_for_each(|(l, &r)| {
                        b[r] = segs[l].dev_at(shm::CONTROL_BYTES)?;
                        Ok(())
                    })
                    .map(|()| b)
            }
            Transport::P2p => {
                let block = DevMem::zeroed(layout.total() as usize)
                    .and_then(|m| driver::ipc_get_handle(m.ptr).map(|h| (m, h)));
                agree(&mpi, block, "allocate and export their FIFO memory").and_then(|(m, h)| {
                    let handles = mpi.allgather_bytes(&h)?;
                    if handles.len() != nranks * driver::IPC_HANDLE_BYTES {
                        return Err(Error::Backend(
                            "CUDA IPC handle exchange was truncated".into(),
                        ));
                    }
                    let own_ptr = m.ptr;
                    fifo = Some(m);
                    let opened: Result<()> = (|| {
                        for r in 0..nranks {
                            if r == rank || !topo.same_node(r, rank) {
                                peer_blocks[r] = 0;
                                continue;
                            }
                            let mut hh = [0u8; driver::IPC_HANDLE_BYTES];
                            hh.copy_from_slice(
                                &handles[r * driver::IPC_HANDLE_BYTES
                                    ..(r + 1) * driver::IPC_HANDLE_BYTES],
                            );
                            peer_blocks[r] = driver::ipc_open(&hh)?;
                        }
                        Ok(())
                    })();
                    agree(&mpi, opened, "open their peers' FIFO memory (CUDA IPC)")?;
                    Ok((0..nranks)
                        .map(|r| if r == rank { own_ptr } else { peer_blocks[r] })
                        .collect())
                })
            }
        };
        let close_ipc = |blocks: &[u64]| {
            for &p in blocks {
                if p != 0 {
                    driver::ipc_close(p);
                }
            }
        };
        let bases = match bases {
            Ok(b) => b,
            Err(e) => {
                close_ipc(&peer_blocks);
                drop(fifo);
                drop(segs);
                return Err(cleanup(e));
            }
        };

        // Stage 4b (multi-node): our NET block (staging and receive FIFOs
        // of every inter-node pair, in pinned host memory mapped into the
        // GPU) and the private MPI duplicate its proxy talks over.
        let net_parts = if multi {
            let parts = mpi
                .dup()
                .and_then(|comm| net::alloc_block(&net_layout).map(|(m, d)| (m, d, comm)));
            match agree(&mpi, parts, "set up their NET connectors") {
                Ok(p) => Some(p),
                Err(e) => {
                    close_ipc(&peer_blocks);
                    drop(fifo);
                    drop(segs);
                    return Err(cleanup(e));
                }
            }
        } else {
            None
        };
        let net_dev = net_parts.as_ref().map(|p| p.1).unwrap_or(0);

        // Stage 5: connector tables.
        let (send, recv) = conn_tables(rank, &layout, &bases, &net_layout, net_dev);
        let tables = (|| -> Result<(DevMem, DevMem)> {
            let bytes = std::mem::size_of_val(send.as_slice());
            let s = DevMem::alloc(bytes)?;
            let r = DevMem::alloc(bytes)?;
            // SAFETY: both device blocks and host vectors hold `bytes` bytes.
            unsafe {
                driver::memcpy_htod(s.ptr, send.as_ptr() as *const u8, bytes)?;
                driver::memcpy_htod(r.ptr, recv.as_ptr() as *const u8, bytes)?;
            }
            Ok((s, r))
        })();
        let (send_conns, recv_conns) = match agree(&mpi, tables, "upload their connector tables") {
            Ok(t) => t,
            Err(e) => {
                close_ipc(&peer_blocks);
                drop(fifo);
                drop(segs);
                return Err(cleanup(e));
            }
        };

        // Start the proxy last: from here on nothing fails but its start.
        let net = match net_parts {
            None => None,
            Some((block, _, comm)) => {
                let started = NetProxy::start(
                    comm,
                    net_layout.clone(),
                    block,
                    segs.clone(),
                    local_rank,
                    rank,
                );
                // A proxy that started where another rank failed is stopped
                // (joined, requests cancelled) inside `agree`.
                match agree(&mpi, started, "start their NET proxy thread") {
                    Ok(p) => Some(p),
                    Err(e) => {
                        close_ipc(&peer_blocks);
                        drop(fifo);
                        drop(segs);
                        return Err(cleanup(e));
                    }
                }
            }
        };
        let direct_bases = if layout.direct {
            bases.iter().map(|b| b + layout.direct_off()).collect()
        } else {
            Vec::new()
        };
        let inner = Arc::new(Inner {
            rank,
            nranks,
            local_rank,
            ctx,
            module,
            funcs,
            direct_funcs,
            stream,
            layout,
            bases: direct_bases,
            timeout: config.timeout,
            net,
            segs,
            _fifo: fifo,
            mpi: mpi.clone(),
            peer_blocks,
            send_conns,
            recv_conns,
            pool: Mutex::new(Vec::new()),
            step_cache: Mutex::new(VecDeque::new()),
            events: Mutex::new(Vec::new()),
            aborted: AtomicBool::new(false),
            failed_flag: AtomicBool::new(false),
            failed: Mutex::new(None),
            order: Mutex::new(Order::default()),
            graph_keep: Mutex::new(Vec::new()),
        });
        let caps = BackendCaps {
            protocols: vec![Protocol::Simple],
            direct_protocols: if layout.direct {
                vec![Protocol::Simple, Protocol::LL]
            } else {
                Vec::new()
            },
            max_channels: channels,
            slot_bytes: slot_bytes as u64,
            fifo_slots: FIFO_SLOTS as u64,
            intra: match transport {
                Transport::P2p => INTRA_P2P,
                Transport::Shm => INTRA_SHM,
            },
            inter: INTER,
            launch_us: LAUNCH_US,
            direct: layout.direct,
        };
        // Which transport reaches each peer, e.g. "1:p2p 2:net 3:net".
        let intra_name = match transport {
            Transport::P2p => "p2p",
            Transport::Shm => "shm",
        };
        let peers = (0..nranks)
            .filter(|&p| p != rank)
            .map(|p| {
                let t = if net_layout.index_of(p).is_some() {
                    "net"
                } else {
                    intra_name
                };
                format!("{p}:{t}")
            })
            .collect::<Vec<_>>()
            .join(" ");
        tracing::info!(
            rank,
            gpu = ctx.ordinal,
            pci = driver::device_pci_bus_id(ctx.dev).unwrap_or_default(),
            transport = ?transport,
            nodes = topo.nnodes(),
            channels,
            slot_bytes,
            local_size,
            fifo_bytes = layout.total(),
            net_bytes = if multi { net_layout.total() } else { 0 },
            peers = %peers,
            "cuda backend ready"
        );
        Ok(CudaBackend {
            inner,
            caps,
            watch: Arc::new(Watch::default()),
            watcher: Mutex::new(None),
        })
    }

    /// The GPU this backend runs on.
    pub fn device_ordinal(&self) -> i32 {
        self.inner.ctx.ordinal
    }

    /// Start the watchdog thread of stream work, once.
    fn start_watcher(&self) -> Result<()> {
        let mut g = self.watcher.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some() {
            return Ok(());
        }
        let w = self.watch.clone();
        let ordinal = self.inner.ctx.ordinal;
        let give_up = self.inner.timeout + ABORT_GRACE;
        let h = std::thread::Builder::new()
            .name(format!("gpucoll-cuda-watch-{}", self.inner.rank))
            .spawn(move || w.run(ordinal, give_up))
            .map_err(|e| Error::System {
                call: "thread spawn (CUDA stream watchdog)",
                message: e.to_string(),
            })?;
        *g = Some(h);
        Ok(())
    }
}

/// Resources of one submission, released when it completed.
struct Resources {
    mems: Vec<DevMem>,
    /// (host destination, device source, bytes) copied after completion.
    copy_back: Vec<(u64, u64, usize)>,
    work: Option<WorkBuf>,
    /// The cached step table this submission's kernels read.
    cached: Option<Arc<CachedSteps>>,
}

/// How many leading steps of one channel's list may run in a block of their
/// own, concurrently with the rest: local-only flows (no peer; e.g. the own
/// block copy of all_to_all) when no later step of the channel reads what
/// they write or writes what they read or write. 0 when none may (or when
/// the whole list is local: nothing to overlap).
fn local_prefix(steps: &[GcStep], esize: u64) -> usize {
    let k = steps
        .iter()
        .take_while(|s| s.kind == STEP_FLOW && s.nrecv == 0 && s.nsend == 0)
        .count();
    if k == 0 || k == steps.len() {
        return 0;
    }
    let range = |a: u64, s: &GcStep| (a, a + s.count * esize);
    let meet = |a: (u64, u64), b: (u64, u64)| a.0 != 0 && b.0 != 0 && a.0 < b.1 && b.0 < a.1;
    for p in &steps[..k] {
        let (ps, pd) = (range(p.src, p), range(p.dst, p));
        for l in &steps[k..] {
            let (ls, ld) = (range(l.src, l), range(l.dst, l));
            if meet(pd, ls) || meet(pd, ld) || meet(ps, ld) {
                return 0;
            }
        }
    }
    k
}

/// One kernel launch of a submission.
enum Item {
    /// The step interpreter over `nchans` channel descriptors.
    Steps {
        first_chan: usize,
        nchans: usize,
        args: GcArgs,
        dtype: Datatype,
    },
    /// A one-shot direct kernel.
    Direct {
        args: Box<GcDirectArgs>,
        dtype: Datatype,
        grid: u32,
    },
}

fn op_code(c: Combine) -> u32 {
    match c {
        Combine::Sum => OP_SUM,
        Combine::Prod => OP_PROD,
        Combine::Min => OP_MIN,
        Combine::Max => OP_MAX,
        Combine::BitAnd => OP_BAND,
        Combine::BitOr => OP_BOR,
        Combine::BitXor => OP_BXOR,
        Combine::LogicalAnd => OP_LAND,
        Combine::LogicalOr => OP_LOR,
        Combine::LogicalXor => OP_LXOR,
    }
}

/// A buffer as the kernel sees it.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    addr: u64,
    elems: u64,
}

fn plan_error(seq: u64, ch: usize, step: usize, msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!(
        "invalid plan for collective #{seq}, channel {ch}, step {step}: {msg}"
    ))
}

fn int_scale(dtype: Datatype, s: f64) -> u64 {
    match dtype {
        Datatype::I8 => s as i8 as i64 as u64,
        Datatype::U8 => s as u8 as u64,
        Datatype::I32 => s as i32 as i64 as u64,
        Datatype::U32 => s as u32 as u64,
        Datatype::I64 => s as i64 as u64,
        Datatype::U64 => s as u64,
        _ => 0,
    }
}

impl Inner {
    fn check_kind(&self, b: &RawBuffer, what: &str, seq: u64) -> Result<()> {
        match b.memory {
            MemoryKind::Device { ordinal } if ordinal != self.ctx.ordinal && b.len > 0 => {
                Err(Error::WrongMemory(format!(
                    "the {what} buffer of collective #{seq} is on GPU {ordinal}, but this \
                     communicator's rank runs on GPU {}",
                    self.ctx.ordinal
                )))
            }
            _ => Ok(()),
        }
    }

    /// Stage host memory into device memory; device buffers pass through.
    fn resolve(
        &self,
        input: &RawBuffer,
        output: &RawBuffer,
        seq: u64,
        res: &mut Resources,
    ) -> Result<(Mem, Mem)> {
        self.check_kind(input, "input", seq)?;
        self.check_kind(output, "output", seq)?;
        let empty = |b: &RawBuffer| b.len == 0 || b.addr == 0;
        let bytes = |b: &RawBuffer| -> Result<usize> {
            usize::try_from(b.bytes()).map_err(|_| Error::CountTooLarge(b.len))
        };
        let host = |b: &RawBuffer| !empty(b) && b.memory == MemoryKind::Host;
        let direct = |b: &RawBuffer| {
            if empty(b) {
                Mem::default()
            } else {
                Mem {
                    addr: b.addr,
                    elems: b.len,
                }
            }
        };
        let stage = |lo: u64, n: usize, res: &mut Resources| -> Result<u64> {
            let m = DevMem::alloc(n)?;
            // SAFETY: the caller's host range [lo, lo+n) is valid for reads
            // (Backend::submit contract); the block holds n bytes.
            unsafe { driver::memcpy_htod(m.ptr, lo as usize as *const u8, n)? };
            let p = m.ptr;
            res.mems.push(m);
            Ok(p)
        };
        match (host(input), host(output)) {
            (false, false) => Ok((direct(input), direct(output))),
            (true, true) if input.overlaps(output) || input.addr == output.addr => {
                let lo = input.addr.min(output.addr);
                let hi = (input.addr + input.bytes()).max(output.addr + output.bytes());
                let n = usize::try_from(hi - lo).map_err(|_| Error::CountTooLarge(hi - lo))?;
                let d = stage(lo, n, res)?;
                res.copy_back
                    .push((output.addr, d + (output.addr - lo), bytes(output)?));
                Ok((
                    Mem {
                        addr: d + (input.addr - lo),
                        elems: input.len,
                    },
                    Mem {
                        addr: d + (output.addr - lo),
                        elems: output.len,
                    },
                ))
            }
            (hi, ho) => {
                let i = if hi {
                    Mem {
                        addr: stage(input.addr, bytes(input)?, res)?,
                        elems: input.len,
                    }
                } else {
                    direct(input)
                };
                let o = if ho {
                    let d = stage(output.addr, bytes(output)?, res)?;
                    res.copy_back.push((output.addr, d, bytes(output)?));
                    Mem {
                        addr: d,
                        elems: output.len,
                    }
                } else {
                    direct(output)
                };
                Ok((i, o))
            }
        }
    }

    /// The one-shot kernel launch for a direct all_reduce that fits the
    /// inboxes; None for every other plan (run from its steps). The choice
    /// depends only on the plan, so every rank makes the same one and the
    /// epochs stay in step.
    fn direct_item(
        &self,
        plan: &crate::plan::Plan,
        input: Mem,
        output: Mem,
        seq: u64,
    ) -> Result<Option<Item>> {
        let task = &plan.task;
        let dtype = task.dtype;
        let bytes = task.count.saturating_mul(dtype.size() as u64);
        if !self.layout.direct
            || plan.algorithm != crate::tune::Algorithm::Direct
            || task.kind != crate::coll::task::CollKind::AllReduce
            || task.count == 0
            || bytes > DIRECT_MAX_BYTES
            || self.bases.len() != self.nranks
        {
            return Ok(None);
        }
        if input.addr == 0
            || output.addr == 0
            || input.elems < task.count
            || output.elems < task.count
        {
            return Err(plan_error(
                seq,
                0,
                0,
                format!(
                    "direct all_reduce of {} elements over buffers of {} and {}",
                    task.count, input.elems, output.elems
                ),
            ));
        }
        let (me, l) = (self.rank as u64, &self.layout);
        let red = plan.reduction;
        let ll = plan.protocol == Protocol::LL;
        if ll && bytes > DIRECT_LL_MAX_BYTES {
            return Err(plan_error(
                seq,
                0,
                0,
                format!("an LL one-shot of {bytes} bytes (at most {DIRECT_LL_MAX_BYTES})"),
            ));
        }
        let mut flags = 0;
        if red.pre_scale.is_some() {
            flags |= FLAG_PRE_OP;
        }
        if red.post_div.is_some() {
            flags |= FLAG_POST_OP;
        }
        if ll {
            flags |= FLAG_LL;
        }
        let mut a = GcDirectArgs {
            input: input.addr,
            output: output.addr,
            count: task.count,
            abort_word: self.own().dev_at(0)?,
            status: self.own().dev_at(shm::STATUS_OFF)?,
            scale: red.pre_scale.unwrap_or(1.0),
            iscale: int_scale(dtype, red.pre_scale.unwrap_or(1.0)),
            div: red.post_div.unwrap_or(1).max(1),
            // The launch counter lives in device memory (advanced by the
            // kernels), so captured graphs replay with fresh epochs.
            ctl: self.bases[self.rank],
            meta: (seq << 32) | (bytes & 0xffff_ffff),
            parity_bytes: l.direct_parity_bytes(),
            ll_off: DIRECT_MAX_BYTES,
            nranks: self.nranks as u32,
            rank: self.rank as u32,
            op: op_code(red.combine),
            flags,
            ..GcDirectArgs::default()
        };
        for p in 0..self.nranks {
            let pu = p as u64;
            a.put_data[p] = self.bases[p] + l.direct_inbox(me);
            a.put_flag[p] = self.bases[p] + l.direct_flags(me);
            a.get_data[p] = self.bases[self.rank] + l.direct_inbox(pu);
            a.get_flag[p] = self.bases[self.rank] + l.direct_flags(pu);
        }
        let per_block = if ll {
            DIRECT_LL_BLOCK_BYTES
        } else {
            DIRECT_BLOCK_BYTES
        };
        let grid = bytes
            .div_ceil(per_block)
            .clamp(1, DIRECT_MAX_BLOCKS.min(l.channels)) as u32;
        Ok(Some(Item::Direct {
            args: Box::new(a),
            dtype,
            grid,
        }))
    }

    /// Upload the tables of a group launch in one work buffer held by
    /// `res`: the steps, then per datatype (in order of first appearance)
    /// the per-block descriptors, the entries and the calls' arguments. One
    /// launch per datatype: the step interpreter of that datatype with
    /// `items`/`entries` set. Every item of `launches` is a step-plan item;
    /// the calls of one channel keep their order within a datatype, and
    /// every rank orders them alike.
    fn upload_group(
        &self,
        steps: &[GcStep],
        chans: &[GcChan],
        launches: &[Item],
        res: &mut Resources,
        stream: CUstream,
    ) -> Result<Vec<(Datatype, GcArgs, u32)>> {
        struct Part {
            dtype: Datatype,
            items: Vec<GcArgs>,
            blocks: Vec<GcChan>,
            entries: Vec<GcGroupEntry>,
        }
        let mut parts: Vec<Part> = Vec::new();
        for dt in launches.iter().filter_map(|i| match i {
            Item::Steps { dtype, .. } => Some(*dtype),
            Item::Direct { .. } => None,
        }) {
            if parts.iter().any(|p| p.dtype == dt) {
                continue;
            }
            let mut per_channel: std::collections::BTreeMap<u32, Vec<GcGroupEntry>> =
                std::collections::BTreeMap::new();
            let mut items: Vec<GcArgs> = Vec::new();
            for item in launches {
                let Item::Steps {
                    first_chan,
                    nchans,
                    args,
                    dtype,
                } = item
                else {
                    return Err(Error::Backend(
                        "a group launch holds a one-shot item".into(),
                    ));
                };
                if *dtype != dt {
                    continue;
                }
                let idx = items.len() as u32;
                items.push(*args);
                for c in &chans[*first_chan..*first_chan + *nchans] {
                    per_channel
                        .entry(c.channel)
                        .or_default()
                        .push(GcGroupEntry {
                            item: idx,
                            pad: 0,
                            first: c.first,
                            nsteps: c.nsteps,
                        });
                }
            }
            let mut entries: Vec<GcGroupEntry> = Vec::new();
            let mut blocks: Vec<GcChan> = Vec::new();
            for (channel, list) in per_channel {
                blocks.push(GcChan {
                    channel,
                    first: entries.len() as u32,
                    nsteps: list.len() as u32,
                    pad: 0,
                });
                entries.extend(list);
            }
            parts.push(Part {
                dtype: dt,
                items,
                blocks,
                entries,
            });
        }
        let sbytes = std::mem::size_of_val(steps);
        let total = sbytes
            + parts
                .iter()
                .map(|p| {
                    std::mem::size_of_val(p.blocks.as_slice())
                        + std::mem::size_of_val(p.entries.as_slice())
                        + std::mem::size_of_val(p.items.as_slice())
                })
                .sum::<usize>();
        let work = self.take_work(total)?;
        let dbase = work.dev.ptr;
        let mut at = 0usize;
        let mut put = |src: *const u8, len: usize| -> u64 {
            // SAFETY: `src` is a live repr(C) slice of `len` bytes (no
            // padding: sizes asserted in abi.rs); the pinned buffer holds
            // `total` bytes, the sum of every part, and is ours until this
            // submission completed.
            unsafe { std::ptr::copy_nonoverlapping(src, work.host.host.add(at), len) };
            let dev = dbase + at as u64;
            at += len;
            dev
        };
        put(steps.as_ptr() as *const u8, sbytes);
        let mut out = Vec::with_capacity(parts.len());
        for p in parts.iter_mut() {
            for a in p.items.iter_mut() {
                a.steps = dbase;
                a.chans = 0;
                a.items = 0;
                a.entries = 0;
            }
            let dblocks = put(
                p.blocks.as_ptr() as *const u8,
                std::mem::size_of_val(p.blocks.as_slice()),
            );
            let dentries = put(
                p.entries.as_ptr() as *const u8,
                std::mem::size_of_val(p.entries.as_slice()),
            );
            let ditems = put(
                p.items.as_ptr() as *const u8,
                std::mem::size_of_val(p.items.as_slice()),
            );
            let mut head = p.items[0];
            head.chans = dblocks;
            head.entries = dentries;
            head.items = ditems;
            out.push((p.dtype, head, p.blocks.len() as u32));
        }
        // SAFETY: device and pinned buffers hold `total` bytes; kernels that
        // read the copy are queued after it on the same stream.
        unsafe { driver::memcpy_htod_async(dbase, work.host.host, total, stream)? };
        res.work = Some(work);
        Ok(out)
    }

    /// Queue `launch`. A `blocking` submission records no event: its caller
    /// waits for the whole stream at once (holding the engine's sequence
    /// lock, so nothing is queued after it meanwhile).
    ///
    /// With `launch.stream` the work goes to the caller's stream: host
    /// buffers are refused (staging needs host waits), and while that stream
    /// is being captured into a CUDA graph nothing waits on the host or
    /// queries an event, the step-table cache is bypassed, and everything
    /// the captured kernels read is kept for the backend's life
    /// (`graph_keep`); the returned work is then already `done`.
    unsafe fn submit(self: &Arc<Self>, launch: Launch, blocking: bool) -> Result<CudaPending> {
        if let Some(e) = self.state_error() {
            return Err(e);
        }
        bind(self.ctx.ordinal)?;
        let user = launch.stream.is_some();
        let stream: CUstream = match launch.stream {
            Some(s) => s as usize as CUstream,
            None => self.stream,
        };
        let captured = user && self.stream_mode(stream)? == Capture::Active;
        // Allocations while a stream is captured must not invalidate it.
        let _relaxed = if captured {
            Some(driver::RelaxedCapture::enter()?)
        } else {
            None
        };
        if user {
            for bp in &launch.items {
                for b in [&bp.input, &bp.output] {
                    if b.len > 0 && b.addr != 0 && b.memory == MemoryKind::Host {
                        return Err(Error::WrongMemory(
                            "work queued on a CUDA stream needs device memory of this \
                             communicator's GPU (host buffers are staged with host waits)"
                                .into(),
                        ));
                    }
                }
            }
        }
        let mut res = Resources {
            mems: Vec::new(),
            copy_back: Vec::new(),
            work: None,
            cached: None,
        };
        let mut steps: Vec<GcStep> = Vec::new();
        let mut chans: Vec<GcChan> = Vec::new();
        let mut launches: Vec<Item> = Vec::new();
        let n = self.nranks;
        // A group runs as one launch of the step interpreter: no one-shot
        // kernels, no split-off local blocks.
        let group = launch.items.len() > 1;
        for (k, bp) in launch.items.iter().enumerate() {
            let seq = launch.first_seq + k as u64;
            let plan = &bp.plan;
            let dtype = plan.task.dtype;
            let esize = dtype.size() as u64;
            let (input, output) = self.resolve(&bp.input, &bp.output, seq, &mut res)?;
            if group {
                // The group kernel runs every item's step plan.
            } else if let Some(item) = self.direct_item(plan, input, output, seq)? {
                launches.push(item);
                continue;
            }
            let scratch = if plan.scratch_elems > 0 {
                let b = plan
                    .scratch_elems
                    .checked_mul(esize)
                    .and_then(|b| usize::try_from(b).ok())
                    .ok_or(Error::CountTooLarge(plan.scratch_elems))?;
                let m = DevMem::alloc(b)?;
                let s = Mem {
                    addr: m.ptr,
                    elems: plan.scratch_elems,
                };
                res.mems.push(m);
                s
            } else {
                Mem::default()
            };
            let mem = |b: BufId| match b {
                BufId::Input => input,
                BufId::Output => output,
                BufId::Scratch => scratch,
            };
            let red = plan.reduction;
            let first_chan = chans.len();
            // Blocks for leading local-only steps split off their channel.
            let mut local_chans: Vec<GcChan> = Vec::new();
            for cw in &plan.channels {
                let ch = cw.channel;
                if cw.steps.iter().all(|s| s.count() == 0) {
                    continue;
                }
                if ch >= self.layout.channels as usize {
                    return Err(plan_error(
                        seq,
                        ch,
                        0,
                        format!("only {} channels", self.layout.channels),
                    ));
                }
                let first = steps.len();
                for (i, step) in cw.steps.iter().enumerate() {
                    let count = step.count();
                    if count == 0 {
                        continue;
                    }
                    let region = |r: Region| -> Result<u64> {
                        let m = mem(r.buf);
                        match r.offset.checked_add(count) {
                            Some(end) if end <= m.elems && m.addr != 0 => {
                                Ok(m.addr + r.offset * esize)
                            }
                            _ => Err(plan_error(
                                seq,
                                ch,
                                i,
                                format!(
                                    "elements {}..+{count} of the {:?} buffer, which holds {}",
                                    r.offset, r.buf, m.elems
                                ),
                            )),
                        }
                    };
                    let peer = |p: usize, flow: bool| -> Result<u32> {
                        if p >= n || (flow && p == self.rank) {
                            return Err(plan_error(seq, ch, i, format!("peer {p} of {n} ranks")));
                        }
                        Ok(p as u32)
                    };
                    let mut g = GcStep {
                        count,
                        ..GcStep::default()
                    };
                    match step {
                        Step::Flow(f) => {
                            let inputs = f.recv.len() + f.src.is_some() as usize;
                            if (!f.reduce && inputs > 1) || inputs == 0 {
                                return Err(plan_error(
                                    seq,
                                    ch,
                                    i,
                                    "flow with a bad number of inputs",
                                ));
                            }
                            g.kind = STEP_FLOW;
                            g.src = f.src.map(region).transpose()?.unwrap_or(0);
                            g.dst = f.dst.map(region).transpose()?.unwrap_or(0);
                            if f.reduce {
                                g.flags |= FLAG_REDUCE;
                                if f.pre_op && red.pre_scale.is_some() {
                                    g.flags |= FLAG_PRE_OP;
                                }
                                if f.post_op && red.post_div.is_some() {
                                    g.flags |= FLAG_POST_OP;
                                }
                            }
                            for (j, p) in f.recv.iter().enumerate() {
                                g.recv[j] = peer(p, true)?;
                            }
                            for (j, p) in f.send.iter().enumerate() {
                                g.send[j] = peer(p, true)?;
                            }
                            g.nrecv = f.recv.len() as u32;
                            g.nsend = f.send.len() as u32;
                        }
                        Step::Exchange {
                            to, src, from, dst, ..
                        } => {
                            g.kind = STEP_EXCHANGE;
                            g.src = region(*src)?;
                            g.dst = region(*dst)?;
                            g.send[0] = peer(*to, false)?;
                            g.recv[0] = peer(*from, false)?;
                            g.nsend = 1;
                            g.nrecv = 1;
                        }
                    }
                    steps.push(g);
                }
                let k = if group {
                    0
                } else {
                    local_prefix(&steps[first..], esize)
                };
                chans.push(GcChan {
                    channel: ch as u32,
                    first: (first + k) as u32,
                    nsteps: (steps.len() - first - k) as u32,
                    pad: 0,
                });
                if k > 0 {
                    local_chans.push(GcChan {
                        channel: ch as u32,
                        first: first as u32,
                        nsteps: k as u32,
                        pad: 0,
                    });
                }
            }
            chans.append(&mut local_chans);
            let nchans = chans.len() - first_chan;
            if nchans == 0 {
                continue;
            }
            let args = GcArgs {
                send: self.send_conns.ptr,
                recv: self.recv_conns.ptr,
                abort_word: self.own().dev_at(0)?,
                status: self.own().dev_at(shm::STATUS_OFF)?,
                scale: red.pre_scale.unwrap_or(1.0),
                iscale: int_scale(dtype, red.pre_scale.unwrap_or(1.0)),
                div: red.post_div.unwrap_or(1).max(1),
                nranks: n as u32,
                rank: self.rank as u32,
                slot_bytes: self.layout.slot_bytes as u32,
                slots: self.layout.slots as u32,
                seq: seq as u32,
                op: op_code(red.combine),
                ..GcArgs::default()
            };
            launches.push(Item::Steps {
                first_chan,
                nchans,
                args,
                dtype,
            });
        }
        let event = if blocking || captured {
            None
        } else {
            Some(self.take_event()?)
        };
        let now = Instant::now();
        let mut pending = CudaPending {
            inner: self.clone(),
            event,
            started: None,
            res: None,
            seq: launch.first_seq,
            done: None,
            // The first check (after CHECK_EVERY) sees a change and restarts
            // the clock: no per-submission read of every channel's counter.
            last_sum: u64::MAX,
            last_progress: now,
            last_check: now,
            abort_seen: None,
            timed_out: false,
            active: self.net.as_ref().map(|n| n.begin()),
        };
        if user && !captured {
            // The timeout clock starts when the caller's stream reaches our
            // work, not when it was queued behind the caller's own kernels.
            let s = self.take_event()?;
            pending.started = Some(s);
        }
        if !captured && self.order_before(stream)? && pending.started.is_none() {
            // Our own stream now waits for work on a caller's stream, which
            // may still be queued behind the caller's kernels: start the
            // timeout clock only when that wait is over.
            let s = self.take_event()?;
            pending.started = Some(s);
        }
        if let Some(s) = pending.started {
            driver::event_record(s, stream)?;
        }
        let steps_items = launches
            .iter()
            .filter(|i| matches!(i, Item::Steps { .. }))
            .count();
        let group_launch = if group && steps_items > 1 {
            Some(self.upload_group(&steps, &chans, &launches, &mut res, stream)?)
        } else {
            None
        };
        if group_launch.is_none() && !steps.is_empty() {
            let sbytes = std::mem::size_of_val(steps.as_slice());
            let cbytes = std::mem::size_of_val(chans.as_slice());
            let total = sbytes + cbytes;
            // SAFETY: repr(C) structs without padding (sizes asserted in abi.rs,
            // every field initialized), viewed as bytes within their lengths.
            let (sb, cb) = unsafe {
                (
                    std::slice::from_raw_parts(steps.as_ptr() as *const u8, sbytes),
                    std::slice::from_raw_parts(chans.as_ptr() as *const u8, cbytes),
                )
            };
            // A captured kernel reads its table at every replay: it gets its
            // own upload, kept for the backend's life, never a cache entry
            // that could be evicted and reused.
            let hit = if total <= STEP_CACHE_MAX_BYTES && !captured {
                let mut bytes = Vec::with_capacity(total);
                bytes.extend_from_slice(sb);
                bytes.extend_from_slice(cb);
                match self.cached_steps(&bytes) {
                    Some(c) => Some(c),
                    None => {
                        let work = self.take_work(total)?;
                        // SAFETY: the pinned buffer holds at least `total` bytes;
                        // the device copy is read only by kernels queued after
                        // this copy on the same stream; the entry is never
                        // written again.
                        unsafe {
                            std::ptr::copy_nonoverlapping(bytes.as_ptr(), work.host.host, total);
                            driver::memcpy_htod_async(work.dev.ptr, work.host.host, total, stream)?;
                        }
                        let c = Arc::new(CachedSteps { work, len: total });
                        self.cache_steps(c.clone());
                        Some(c)
                    }
                }
            } else {
                None
            };
            let dbase = match hit {
                Some(c) => {
                    let p = c.work.dev.ptr;
                    res.cached = Some(c);
                    p
                }
                None => {
                    let work = self.take_work(total)?;
                    // SAFETY: the pinned buffer holds at least `total` bytes and
                    // is ours until this submission completed (it returns to
                    // the pool then).
                    unsafe {
                        std::ptr::copy_nonoverlapping(sb.as_ptr(), work.host.host, sbytes);
                        std::ptr::copy_nonoverlapping(
                            cb.as_ptr(),
                            work.host.host.add(sbytes),
                            cbytes,
                        );
                        driver::memcpy_htod_async(work.dev.ptr, work.host.host, total, stream)?;
                    }
                    let p = work.dev.ptr;
                    res.work = Some(work);
                    p
                }
            };
            let (dsteps, dchans) = (dbase, dbase + sbytes as u64);
            for item in launches.iter_mut() {
                if let Item::Steps {
                    first_chan, args, ..
                } = item
                {
                    args.steps = dsteps;
                    args.chans = dchans + (*first_chan * std::mem::size_of::<GcChan>()) as u64;
                }
            }
        }
        pending.res = Some(res);
        if let Some(parts) = group_launch {
            for (dtype, mut args, grid) in parts {
                let mut params = [&mut args as *mut GcArgs as *mut c_void];
                // SAFETY: one GcArgs by value as the kernel expects; the
                // tables it points to belong to this submission's work
                // buffer (held by `pending` until completion, or kept for a
                // captured graph), the buffers of every call stay valid
                // until the work completed.
                unsafe {
                    driver::launch(
                        self.funcs[dtype as usize],
                        grid,
                        THREADS,
                        stream,
                        &mut params,
                    )?
                };
            }
            launches.clear();
        }
        for item in launches {
            match item {
                Item::Steps {
                    nchans,
                    mut args,
                    dtype,
                    ..
                } => {
                    let mut params = [&mut args as *mut GcArgs as *mut c_void];
                    // SAFETY: one GcArgs by value as the kernel expects; every
                    // address in it stays valid until the event recorded below
                    // completed (owned by `pending` or by the backend).
                    unsafe {
                        driver::launch(
                            self.funcs[dtype as usize],
                            nchans as u32,
                            THREADS,
                            stream,
                            &mut params,
                        )?
                    };
                }
                Item::Direct {
                    mut args,
                    dtype,
                    grid,
                } => {
                    let mut params = [&mut *args as *mut GcDirectArgs as *mut c_void];
                    // SAFETY: one GcDirectArgs by value as the kernel expects; the
                    // buffers stay valid until the event below completed, the
                    // direct areas for the backend's life.
                    unsafe {
                        driver::launch(
                            self.direct_funcs[dtype as usize],
                            grid,
                            THREADS,
                            stream,
                            &mut params,
                        )?
                    };
                }
            }
        }
        if let Some(e) = pending.event {
            driver::event_record(e, stream)?;
        }
        if user && !captured {
            self.order_after(stream)?;
        }
        if captured {
            if let Some(r) = pending.res.take() {
                self.graph_keep
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(r);
            }
            tracing::debug!(
                rank = self.rank,
                seq = launch.first_seq,
                "collective captured into a CUDA graph"
            );
            pending.done = Some(Ok(()));
        }
        Ok(pending)
    }

    /// Check a caller's stream: same context as ours, not in a failed
    /// capture. Returns its capture state.
    fn stream_mode(&self, s: CUstream) -> Result<Capture> {
        let ctx = driver::stream_context(s)?;
        if ctx != self.ctx.ctx {
            return Err(Error::InvalidUsage(format!(
                "the CUDA stream belongs to another context than this communicator's \
                 (the primary context of GPU {})",
                self.ctx.ordinal
            )));
        }
        match driver::stream_capture(s)? {
            Capture::Invalidated => Err(Error::InvalidUsage(
                "the CUDA stream is in an invalidated graph capture; end the capture first".into(),
            )),
            c => Ok(c),
        }
    }

    /// Before queuing on `s`: if the previous submission went to another
    /// stream, make `s` wait for it on the device (its kernels use the same
    /// connectors). Not used while `s` is being captured: a replay's order
    /// with other collectives of this communicator is the caller's to keep.
    /// Returns whether `s` now waits for another stream.
    fn order_before(&self, s: CUstream) -> Result<bool> {
        let key = s as usize as u64;
        let mut o = self.order.lock().unwrap_or_else(|p| p.into_inner());
        match o.last {
            Some(prev) if prev != key => {
                let e = match o.event {
                    Some(e) => e,
                    None => {
                        let e = driver::event_create()?;
                        o.event = Some(e);
                        e
                    }
                };
                // Our own stream holds only our work: mark its end now. A
                // caller's stream had the event recorded after our work.
                if prev == self.stream as usize as u64 {
                    driver::event_record(e, self.stream)?;
                }
                driver::stream_wait_event(s, e)?;
                o.last = Some(key);
                Ok(true)
            }
            _ => {
                o.last = Some(key);
                Ok(false)
            }
        }
    }

    /// After queuing on a caller's stream `s`: mark the end of our work
    /// there, for the next submission on another stream to wait on.
    fn order_after(&self, s: CUstream) -> Result<()> {
        let mut o = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let e = match o.event {
            Some(e) => e,
            None => {
                let e = driver::event_create()?;
                o.event = Some(e);
                e
            }
        };
        driver::event_record(e, s)
    }
}

/// One submission in flight.
struct CudaPending {
    inner: Arc<Inner>,
    /// Recorded after the last kernel; None for a blocking submission,
    /// which waits for the whole stream instead.
    event: Option<CUevent>,
    /// On a caller's stream: recorded before our work; until it completed
    /// the work has not started (the caller's earlier work runs), so the
    /// timeout clock does not run.
    started: Option<CUevent>,
    res: Option<Resources>,
    seq: u64,
    done: Option<Result<()>>,
    last_sum: u64,
    last_progress: Instant,
    /// When progress, abort and timeout were last checked.
    last_check: Instant,
    abort_seen: Option<Instant>,
    timed_out: bool,
    /// Tells the NET proxy a launch is in flight (it then polls eagerly).
    active: Option<net::ActiveGuard>,
}

// SAFETY: the event handle may be queried from any thread (context bound
// first); the resources are owned.
unsafe impl Send for CudaPending {}

impl CudaPending {
    /// The error recorded by the kernel, if any.
    fn kernel_error(&self) -> Option<Error> {
        let inner = &self.inner;
        let mut aborted_only = false;
        for c in 0..inner.layout.channels as usize {
            let w0 = inner.status_word(c, 0);
            let code = (w0 & 0xffff_ffff) as u32;
            let peer = (w0 >> 32) as usize;
            match code {
                ERR_NONE => {}
                ERR_ABORTED => aborted_only = true,
                ERR_META => {
                    let (got, want) = (inner.status_word(c, 8), inner.status_word(c, 16));
                    return Some(Error::ProtocolMismatch {
                        peer,
                        detail: format!(
                            "expected collective #{} with {} bytes, got #{} with {} bytes on channel {c}",
                            want >> 32,
                            want & 0xffff_ffff,
                            got >> 32,
                            got & 0xffff_ffff
                        ),
                    });
                }
                ERR_COUNTERS => {
                    return Some(Error::Backend(format!(
                        "connector counters from rank {peer} are inconsistent on channel {c}"
                    )))
                }
                ERR_BAD_STEP => {
                    return Some(Error::Backend(format!(
                        "the kernel rejected a step on channel {c} (peer {peer})"
                    )))
                }
                other => {
                    return Some(Error::Backend(format!(
                        "the kernel reported error code {other} on channel {c}"
                    )))
                }
            }
        }
        if !aborted_only {
            return None;
        }
        Some(self.abort_error())
    }

    fn abort_error(&self) -> Error {
        let inner = &self.inner;
        // The NET proxy raised the abort word: its error says why.
        if let Some(e) = inner.net_error() {
            return e;
        }
        if self.timed_out {
            return Error::Timeout {
                seq: self.seq,
                seconds: inner.timeout.as_secs_f64(),
                waiting_for: format!(
                    "the GPU kernel on rank {} made no progress (a peer is dead, slow, or \
                     issued a different call)",
                    inner.rank
                ),
            };
        }
        if let Some(w) = inner.peer_raiser() {
            return Error::PeerFailed(inner.peer_reason(w));
        }
        if inner.aborted.load(Ordering::Acquire) {
            return Error::Aborted;
        }
        inner
            .state_error()
            .unwrap_or_else(|| Error::Backend("the kernel was aborted".into()))
    }

    fn finish(&mut self) -> Result<()> {
        let res = self.res.take();
        if let Some(e) = self.kernel_error() {
            self.inner.mark_failed(e.to_string());
            if let Some(r) = res {
                self.release(r);
            }
            return Err(e);
        }
        let mut out = Ok(());
        if let Some(r) = res {
            for &(host, dev, bytes) in &r.copy_back {
                // SAFETY: the host range is the caller's output buffer, valid for
                // writes until this work completed (Backend::submit contract).
                if let Err(e) = unsafe { driver::memcpy_dtoh(host as usize as *mut u8, dev, bytes) }
                {
                    out = Err(e);
                    break;
                }
            }
            self.release(r);
        }
        out
    }

    fn release(&self, mut r: Resources) {
        if let Some(w) = r.work.take() {
            self.inner.give_work(w);
        }
        if let Some(c) = r.cached.take() {
            self.inner.release_cached(c);
        }
        drop(r);
    }

    /// Whether the submission's kernels completed.
    fn complete(&self) -> Result<bool> {
        match self.event {
            Some(e) => driver::event_query(e),
            None => driver::stream_query(self.inner.stream),
        }
    }

    /// One step of progress; Some(result) once finished. `bound`: the
    /// context is already current on this thread.
    fn poll(&mut self, bound: bool) -> Option<Result<()>> {
        if let Some(d) = &self.done {
            return Some(d.clone());
        }
        let r = (|| -> Result<Option<()>> {
            if !bound {
                bind(self.inner.ctx.ordinal)?;
            }
            if self.complete()? {
                return self.finish().map(Some);
            }
            let now = Instant::now();
            if now.duration_since(self.last_check) < CHECK_EVERY {
                return Ok(None);
            }
            self.last_check = now;
            if let Some(s) = self.started {
                if !driver::event_query(s)? {
                    self.last_progress = now;
                    return Ok(None);
                }
                self.started = None;
                self.inner.give_event(s);
                self.last_progress = now;
            }
            let sum = self.inner.progress_sum();
            if sum != self.last_sum {
                self.last_sum = sum;
                self.last_progress = now;
            }
            if self.abort_seen.is_none() && self.inner.own().abort_word() != 0 {
                self.abort_seen = Some(now);
            }
            if self.abort_seen.is_none()
                && now.duration_since(self.last_progress) >= self.inner.timeout
            {
                self.timed_out = true;
                let e = self.abort_error();
                self.inner.mark_failed(e.to_string());
                self.abort_seen = Some(now);
            }
            if let Some(t) = self.abort_seen {
                if now.duration_since(t) > ABORT_GRACE {
                    // The kernel does not leave: give up on it and leak its
                    // memory rather than free it under a running kernel.
                    if let Some(r) = self.res.take() {
                        std::mem::forget(r);
                    }
                    let e = self.abort_error();
                    self.inner.mark_failed(e.to_string());
                    return Err(e);
                }
            }
            Ok(None)
        })();
        match r {
            Ok(None) => None,
            Ok(Some(())) => {
                self.done = Some(Ok(()));
                self.active = None;
                Some(Ok(()))
            }
            Err(e) => {
                if e.is_fatal() {
                    self.inner.mark_failed(e.to_string());
                }
                self.done = Some(Err(e.clone()));
                self.active = None;
                Some(Err(e))
            }
        }
    }
}

impl PendingWork for CudaPending {
    /// Spin on the completion query for [`WAIT_SPIN`], then yield until
    /// [`WAIT_YIELD`], then sleep 50 µs between polls. Progress, abort and
    /// timeout are checked every [`CHECK_EVERY`] throughout.
    fn wait(&mut self) -> Result<()> {
        if self.done.is_none() {
            if let Err(e) = bind(self.inner.ctx.ordinal) {
                return self.poll(false).unwrap_or(Err(e));
            }
        }
        let start = Instant::now();
        loop {
            // Nothing else runs on this thread between polls: the context
            // bound above stays current.
            if let Some(r) = self.poll(true) {
                return r;
            }
            let waited = start.elapsed();
            if waited < WAIT_SPIN {
                for _ in 0..16 {
                    std::hint::spin_loop();
                }
            } else if waited < WAIT_YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn test(&mut self) -> Result<bool> {
        match self.poll(false) {
            None => Ok(false),
            Some(r) => r.map(|_| true),
        }
    }
}

impl Drop for CudaPending {
    fn drop(&mut self) {
        if self.done.is_none() {
            let _ = self.wait();
        }
        let events = [self.event.take(), self.started.take()];
        if events.iter().any(Option::is_some) && bind(self.inner.ctx.ordinal).is_ok() {
            for e in events.into_iter().flatten() {
                // A completed event may be recorded again; any other is
                // destroyed (a kernel that never left may still hold it).
                if matches!(self.done, Some(Ok(()))) {
                    self.inner.give_event(e);
                } else {
                    driver::event_destroy(e);
                }
            }
        }
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
        p.wait()
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
        self.start_watcher()?;
        // SAFETY: forwarded contract: the buffers stay valid until the work
        // completed on the caller's stream.
        let p = unsafe { self.inner.submit(launch, false)? };
        if p.done.is_some() {
            return Ok(());
        }
        self.watch
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(p);
        self.watch.wake.notify_one();
        Ok(())
    }

    fn check_stream(&self, stream: u64) -> Result<()> {
        bind(self.inner.ctx.ordinal)?;
        self.inner
            .stream_mode(stream as usize as CUstream)
            .map(|_| ())
    }

    fn async_error(&self) -> Option<Error> {
        if !self.watch.failed.load(Ordering::Acquire) {
            return None;
        }
        self.watch
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn device(&self) -> Option<i32> {
        Some(self.inner.ctx.ordinal)
    }

    fn abort(&self, reason: &str) {
        self.inner.aborted.store(true, Ordering::Release);
        if self.inner.mark_failed(format!("aborted: {reason}")) {
            tracing::warn!(rank = self.inner.rank, "cuda backend aborted: {reason}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 ranks on 2 nodes ({0, 1}, {2, 3}); each rank's P2P area at a
    /// fake address common to all ranks (as if mapped at the same place),
    /// each NET block private to its rank.
    fn tables(rank: usize) -> (Vec<GcConn>, Vec<GcConn>, Layout, NetLayout, u64) {
        let layout = Layout {
            nranks: 4,
            channels: NET_CHANNELS as u64,
            slots: FIFO_SLOTS as u64,
            slot_bytes: SLOT_BYTES_NET as u64,
            direct: false,
        };
        let node = |r: usize| r / 2;
        let bases: Vec<u64> = (0..4)
            .map(|r| {
                if node(r) == node(rank) {
                    (r as u64 + 1) << 40
                } else {
                    0
                }
            })
            .collect();
        let net = NetLayout {
            peers: (0..4).filter(|&r| node(r) != node(rank)).collect(),
            channels: layout.channels,
            slots: layout.slots,
            slot_bytes: layout.slot_bytes,
        };
        let net_dev = (rank as u64 + 10) << 40;
        let (s, r) = conn_tables(rank, &layout, &bases, &net, net_dev);
        (s, r, layout, net, net_dev)
    }

    #[test]
    fn intra_node_connectors_meet() {
        let t: Vec<_> = (0..4).map(tables).collect();
        let n = 4;
        for (a, b) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
            for c in 0..NET_CHANNELS {
                let s = t[a].0[c * n + b];
                let r = t[b].1[c * n + a];
                assert_eq!(
                    (s.data, s.meta, s.tail, s.head),
                    (r.data, r.meta, r.tail, r.head)
                );
                // In the receiver's area, heads in the sender's.
                assert_eq!(r.tail >> 40, b as u64 + 1);
                assert_eq!(s.head >> 40, a as u64 + 1);
            }
        }
    }

    #[test]
    fn inter_node_connectors_stay_in_the_own_net_block() {
        for rank in 0..4 {
            let (send, recv, layout, net, dev) = tables(rank);
            let n = 4;
            let mut words = Vec::new();
            for c in 0..layout.channels as usize {
                for p in net.peers.iter().copied() {
                    for conn in [send[c * n + p], recv[c * n + p]] {
                        for a in [conn.data, conn.meta, conn.tail, conn.head] {
                            assert!(a >= dev && a < dev + net.total(), "rank {rank} peer {p}");
                        }
                        let last = conn.data + layout.slots * layout.slot_bytes;
                        assert!(last <= dev + net.total());
                        words.extend([conn.tail, conn.head, conn.data]);
                    }
                }
            }
            words.sort_unstable();
            let len = words.len();
            words.dedup();
            assert_eq!(words.len(), len, "rank {rank}: NET connectors share words");
            // No connector to ourselves.
            for c in 0..layout.channels as usize {
                assert_eq!(send[c * n + rank].data, 0);
                assert_eq!(recv[c * n + rank].data, 0);
            }
        }
    }
}
