//! NET transport of the CUDA backend: connectors to ranks on other (real or
//! simulated) nodes, bridged over MPI point-to-point by a proxy thread.
//!
//! The kernels are unchanged. For every (channel, remote peer) pair both
//! connectors live in this rank's own NET block, pinned host memory mapped
//! into the GPU (`cuMemHostAlloc` with `DEVICEMAP`):
//!
//! * the **send** connector is a local staging FIFO: the kernel writes a
//!   piece, its meta word (`seq << 32 | bytes`) and bumps the tail exactly
//!   as it does for a peer's FIFO; the proxy sees the tail move, sends the
//!   piece, and once MPI completed the send it bumps the head, which gives
//!   the slot back to the kernel;
//! * the **receive** connector is a local FIFO the kernel reads; the proxy
//!   keeps a receive posted into each free slot (`posted - head < slots`)
//!   and, when one completes, stores the meta word then (Release) the tail.
//!
//! Each piece travels as two messages, the meta word (tag `2c`) and the data
//! (tag `2c + 1`), both sent from and received into the FIFO memory itself
//! (the meta words sit in their own array, apart from the slots, so a single
//! `[meta][data]` message would need a copy). MPI keeps the messages of one
//! (source, tag, communicator) in order, which makes each channel a FIFO.
//! A data message whose length differs from its meta word is published with
//! the received length in the meta word, so the kernel reports the mismatch.
//!
//! The proxy runs on its own thread over a private duplicate of the
//! communicator (so MPI must provide `MPI_THREAD_MULTIPLE`). It spins while
//! pieces move, yields while a launch is in flight, and otherwise sleeps
//! 50 µs between polls (parks up to 1 ms once idle for 100 ms). It stops touching the FIFOs once the backend's abort
//! word is raised; an MPI failure raises it (the kernels leave) and is
//! reported as `PeerFailed`. At teardown it cancels its posted receives; if
//! MPI might still use some buffer, the NET block is leaked, never freed.
//!
//! The proxy's state machine ([`Proxy`]) is generic over the [`Wire`] that
//! moves messages, so it is unit-tested over host memory without MPI or GPU.

use super::abi::{CONN_HEADER, CONN_META_OFF, CONN_TAIL_OFF, HEAD_STRIDE};
use super::memory::PinnedMem;
use super::shm::Segment;
use crate::error::{Error, Result};
use crate::mpi::{MpiComm, MpiRequest};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The proxy spins (no yield, no sleep) this long after the last piece moved.
const SPIN: Duration = Duration::from_micros(50);
/// While a launch is in flight, it then yields this long before it sleeps.
const YIELD: Duration = Duration::from_millis(20);
/// Sleep between polls when idle.
const IDLE_SLEEP: Duration = Duration::from_micros(50);
/// After this long with no launch in flight and no send pending, the proxy
/// parks up to [`DEEP_IDLE_SLEEP`] between polls (a new launch or `stop`
/// unparks it at once), so an idle communicator costs almost no CPU.
const DEEP_IDLE: Duration = Duration::from_millis(100);
const DEEP_IDLE_SLEEP: Duration = Duration::from_millis(1);
/// Sleep between checks of the stop flag once the backend failed.
const HALTED_SLEEP: Duration = Duration::from_millis(1);
/// At teardown, how long all cancellations together may take.
const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// Where the NET connectors live in a rank's NET block. Only this rank maps
/// the block; `channels`, `slots` and `slot_bytes` are the agreed layout
/// values of the communicator, so every message fits the slot its receiver
/// posted and both ends number pieces the same way.
///
/// Per (channel `c`, peer index `i`), at `pair_off(c, i)`: the send head
/// (written by the proxy, read by the kernel), the receive head (written by
/// the kernel), the send connector (staging FIFO) and the receive
/// connector, each laid out like a P2P/SHM connector (tail at 0, meta at
/// 128, slots from 256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetLayout {
    /// Ranks on other nodes, ascending: peer index `i` is `peers[i]`.
    pub peers: Vec<usize>,
    pub channels: u64,
    pub slots: u64,
    pub slot_bytes: u64,
}

impl NetLayout {
    fn conn_bytes(&self) -> u64 {
        CONN_HEADER + self.slots * self.slot_bytes
    }
    fn pair_bytes(&self) -> u64 {
        2 * HEAD_STRIDE + 2 * self.conn_bytes()
    }
    fn pair_off(&self, c: u64, i: usize) -> u64 {
        (c * self.peers.len() as u64 + i as u64) * self.pair_bytes()
    }
    /// The head of the send connector (kernel → peer).
    pub(crate) fn send_head(&self, c: u64, i: usize) -> u64 {
        self.pair_off(c, i)
    }
    /// The head of the receive connector (peer → kernel).
    pub(crate) fn recv_head(&self, c: u64, i: usize) -> u64 {
        self.pair_off(c, i) + HEAD_STRIDE
    }
    /// The send connector (staging FIFO).
    pub(crate) fn send_conn(&self, c: u64, i: usize) -> u64 {
        self.pair_off(c, i) + 2 * HEAD_STRIDE
    }
    /// The receive connector.
    pub(crate) fn recv_conn(&self, c: u64, i: usize) -> u64 {
        self.send_conn(c, i) + self.conn_bytes()
    }
    /// Bytes of the whole block.
    pub(crate) fn total(&self) -> u64 {
        self.channels * self.peers.len() as u64 * self.pair_bytes()
    }
    /// The peer index of `rank`, if it is a NET peer.
    pub(crate) fn index_of(&self, rank: usize) -> Option<usize> {
        self.peers.binary_search(&rank).ok()
    }
    fn pairs(&self) -> usize {
        self.channels as usize * self.peers.len()
    }
}

/// MPI tag of a channel's meta messages.
fn meta_tag(c: u64) -> i32 {
    (2 * c) as i32
}
/// MPI tag of a channel's data messages.
fn data_tag(c: u64) -> i32 {
    (2 * c + 1) as i32
}

/// What moves messages: MPI, or an in-memory fabric in the unit tests.
pub(crate) trait Wire {
    type Req;
    /// Start sending `len` bytes at `buf` to `peer`.
    ///
    /// # Safety
    /// `buf` must stay readable and unchanged until the request completed
    /// (`test` returned `Some`) or was retired with `true`.
    unsafe fn isend(&self, buf: *const u8, len: usize, peer: usize, tag: i32) -> Result<Self::Req>;
    /// Start receiving up to `cap` bytes from `peer` into `buf`.
    ///
    /// # Safety
    /// `buf` must stay writable and otherwise untouched until the request
    /// completed or was retired with `true`.
    unsafe fn irecv(&self, buf: *mut u8, cap: usize, peer: usize, tag: i32) -> Result<Self::Req>;
    /// `Some(bytes)` once complete (and on every later call).
    fn test(&self, req: &mut Self::Req) -> Result<Option<usize>>;
    /// Cancel within `wait`; `false` if the buffer may still be used.
    fn retire(&self, req: Self::Req, wait: Duration) -> bool;
}

impl Wire for MpiComm {
    type Req = MpiRequest;
    unsafe fn isend(
        &self,
        buf: *const u8,
        len: usize,
        peer: usize,
        tag: i32,
    ) -> Result<MpiRequest> {
        // SAFETY: forwarded contract.
        unsafe { MpiComm::isend(self, buf, len, peer, tag) }
    }
    unsafe fn irecv(&self, buf: *mut u8, cap: usize, peer: usize, tag: i32) -> Result<MpiRequest> {
        // SAFETY: forwarded contract.
        unsafe { MpiComm::irecv(self, buf, cap, peer, tag) }
    }
    fn test(&self, req: &mut MpiRequest) -> Result<Option<usize>> {
        req.test()
    }
    fn retire(&self, req: MpiRequest, wait: Duration) -> bool {
        req.cancel_within(wait)
    }
}

/// The host view of a NET block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NetMem {
    base: *mut u8,
    len: u64,
}

// SAFETY: plain memory whose owner outlives every user (the proxy thread is
// joined before the block is freed); shared words are accessed atomically.
unsafe impl Send for NetMem {}

impl NetMem {
    /// # Safety
    /// `base` must be 8-byte aligned, valid for reads and writes of `len`
    /// bytes, and outlive the value and its copies.
    pub(crate) unsafe fn new(base: *mut u8, len: u64) -> NetMem {
        NetMem { base, len }
    }

    fn word(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: 8-aligned offset inside the block (layout offsets are
        // multiples of 8 below `total`); the word is shared with the device
        // and only accessed atomically from the host.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }

    fn ptr(&self, off: u64) -> *mut u8 {
        debug_assert!(off <= self.len);
        // SAFETY: inside the block (or one past its end).
        unsafe { self.base.add(off as usize) }
    }
}

/// The proxy's side of one send connector.
#[derive(Debug)]
struct SendSide<R> {
    /// Pieces handed to MPI; the next one is in slot `posted % slots`.
    posted: u64,
    /// Pieces whose two messages completed (the value of the head word).
    done: u64,
    /// (meta, data) requests of the pieces in flight, oldest first.
    inflight: VecDeque<(R, R)>,
}

/// The proxy's side of one receive connector.
#[derive(Debug)]
struct RecvSide<R> {
    /// Pieces whose receives are posted; the next one into slot `posted % slots`.
    posted: u64,
    /// Pieces published to the kernel (the value of the tail word).
    tail: u64,
    /// Meta words as received, by slot (published into the FIFO on completion).
    metas: Box<[u64]>,
    /// (meta, data) requests posted, oldest first.
    inflight: VecDeque<(R, R)>,
}

/// The proxy state machine: every NET connector of one rank.
pub(crate) struct Proxy<W: Wire> {
    wire: W,
    layout: NetLayout,
    mem: NetMem,
    /// By pair `c * npeers + i`.
    sends: Vec<SendSide<W::Req>>,
    recvs: Vec<RecvSide<W::Req>>,
    /// Requests left over by a failed post, retired at shutdown.
    orphans: Vec<W::Req>,
}

fn counters(peer: usize, c: u64, what: &str) -> Error {
    Error::Backend(format!(
        "NET connector with rank {peer} on channel {c}: {what} (the counters are inconsistent)"
    ))
}

/// An MPI failure on the connection to `peer`.
fn link(peer: usize, c: u64, e: Error) -> Error {
    match e {
        e @ (Error::ProtocolMismatch { .. } | Error::Backend(_)) => e,
        e => Error::PeerFailed(format!("NET transport to rank {peer}, channel {c}: {e}")),
    }
}

impl<W: Wire> Proxy<W> {
    /// # Safety
    /// `mem` must hold `layout.total()` bytes, zeroed before any kernel or
    /// proxy used it.
    pub(crate) unsafe fn new(wire: W, layout: NetLayout, mem: NetMem) -> Proxy<W> {
        let pairs = layout.pairs();
        let slots = layout.slots as usize;
        Proxy {
            sends: (0..pairs)
                .map(|_| SendSide {
                    posted: 0,
                    done: 0,
                    inflight: VecDeque::with_capacity(slots),
                })
                .collect(),
            recvs: (0..pairs)
                .map(|_| RecvSide {
                    posted: 0,
                    tail: 0,
                    metas: vec![0u64; slots].into_boxed_slice(),
                    inflight: VecDeque::with_capacity(slots),
                })
                .collect(),
            orphans: Vec::new(),
            wire,
            layout,
            mem,
        }
    }

    /// One pass over every connector; `true` if anything moved.
    pub(crate) fn progress(&mut self) -> Result<bool> {
        let np = self.layout.peers.len();
        let mut moved = false;
        for c in 0..self.layout.channels {
            for i in 0..np {
                let k = c as usize * np + i;
                moved |= self.send_progress(c, i, k)?;
                moved |= self.recv_progress(c, i, k)?;
            }
        }
        Ok(moved)
    }

    fn send_progress(&mut self, c: u64, i: usize, k: usize) -> Result<bool> {
        let (l, mem, wire) = (&self.layout, self.mem, &self.wire);
        let peer = l.peers[i];
        let s = &mut self.sends[k];
        let mut moved = false;
        // Completed sends give their slots back, in order.
        while let Some((m, d)) = s.inflight.front_mut() {
            if wire.test(m).map_err(|e| link(peer, c, e))?.is_none()
                || wire.test(d).map_err(|e| link(peer, c, e))?.is_none()
            {
                break;
            }
            s.inflight.pop_front();
            s.done += 1;
            // MPI no longer reads the slot: the kernel may refill it.
            mem.word(l.send_head(c, i)).store(s.done, Ordering::Release);
            moved = true;
        }
        let conn = l.send_conn(c, i);
        // Acquire: the kernel fenced the slot and its meta before the tail.
        let tail = mem.word(conn + CONN_TAIL_OFF).load(Ordering::Acquire);
        if tail < s.posted || tail - s.done > l.slots {
            return Err(counters(
                peer,
                c,
                &format!(
                    "staging tail {tail}, {} pieces sent, {} completed",
                    s.posted, s.done
                ),
            ));
        }
        while s.posted < tail {
            let slot = s.posted % l.slots;
            let meta_off = conn + CONN_META_OFF + slot * 8;
            let meta = mem.word(meta_off).load(Ordering::Relaxed);
            let bytes = meta & 0xffff_ffff;
            if bytes > l.slot_bytes {
                return Err(counters(
                    peer,
                    c,
                    &format!("a staged piece claims {bytes} bytes"),
                ));
            }
            let data = mem.ptr(conn + CONN_HEADER + slot * l.slot_bytes);
            // SAFETY: the meta word and the slot's first `bytes` bytes lie in
            // the block; the kernel does not rewrite them before the head
            // passes this piece, which happens only once both sends completed
            // (or never, if they are retired at shutdown).
            let mr = unsafe { wire.isend(mem.ptr(meta_off), 8, peer, meta_tag(c)) }
                .map_err(|e| link(peer, c, e))?;
            // SAFETY: as above.
            match unsafe { wire.isend(data, bytes as usize, peer, data_tag(c)) } {
                Ok(dr) => s.inflight.push_back((mr, dr)),
                Err(e) => {
                    self.orphans.push(mr);
                    return Err(link(peer, c, e));
                }
            }
            s.posted += 1;
            moved = true;
        }
        Ok(moved)
    }

    fn recv_progress(&mut self, c: u64, i: usize, k: usize) -> Result<bool> {
        let (l, mem, wire) = (&self.layout, self.mem, &self.wire);
        let peer = l.peers[i];
        let r = &mut self.recvs[k];
        let conn = l.recv_conn(c, i);
        let mut moved = false;
        // Publish arrived pieces, in order.
        while let Some((m, d)) = r.inflight.front_mut() {
            let Some(mn) = wire.test(m).map_err(|e| link(peer, c, e))? else {
                break;
            };
            let Some(dn) = wire.test(d).map_err(|e| link(peer, c, e))? else {
                break;
            };
            r.inflight.pop_front();
            let slot = (r.tail % l.slots) as usize;
            if mn != 8 {
                return Err(Error::ProtocolMismatch {
                    peer,
                    detail: format!("a {mn} byte meta message on NET channel {c}"),
                });
            }
            // SAFETY: in bounds; MPI wrote it before the request completed.
            let mut meta = unsafe { std::ptr::read_volatile(r.metas.as_ptr().add(slot)) };
            if meta & 0xffff_ffff != dn as u64 {
                meta = (meta & !0xffff_ffff) | (dn as u64 & 0xffff_ffff);
            }
            mem.word(conn + CONN_META_OFF + slot as u64 * 8)
                .store(meta, Ordering::Relaxed);
            r.tail += 1;
            // Release: the data (written by MPI before completion) and the
            // meta are visible before the kernel sees the tail.
            mem.word(conn + CONN_TAIL_OFF)
                .store(r.tail, Ordering::Release);
            moved = true;
        }
        // Acquire: the kernel finished reading a slot before it moved the head.
        let head = mem.word(l.recv_head(c, i)).load(Ordering::Acquire);
        if head > r.tail {
            return Err(counters(
                peer,
                c,
                &format!("receive head {head} ahead of tail {}", r.tail),
            ));
        }
        while r.posted - head < l.slots {
            let slot = r.posted % l.slots;
            // SAFETY: the meta cell of this slot was published (copied out)
            // when its previous piece completed; nothing reads it until this
            // request completes. The box lives as long as the proxy, and
            // shutdown leaks it if a request could not be retired.
            let mr = unsafe {
                wire.irecv(
                    r.metas.as_mut_ptr().add(slot as usize) as *mut u8,
                    8,
                    peer,
                    meta_tag(c),
                )
            }
            .map_err(|e| link(peer, c, e))?;
            let data = mem.ptr(conn + CONN_HEADER + slot * l.slot_bytes);
            // SAFETY: the slot lies in the block; the kernel released its
            // previous piece (head > posted - slots) and reads it again only
            // after the tail passes this piece, i.e. after completion.
            match unsafe { wire.irecv(data, l.slot_bytes as usize, peer, data_tag(c)) } {
                Ok(dr) => r.inflight.push_back((mr, dr)),
                Err(e) => {
                    self.orphans.push(mr);
                    return Err(link(peer, c, e));
                }
            }
            r.posted += 1;
            moved = true;
        }
        Ok(moved)
    }

    /// Whether any piece is in MPI's hands (sends not yet completed).
    fn sending(&self) -> bool {
        self.sends.iter().any(|s| !s.inflight.is_empty())
    }

    /// Cancel every request. `true` if MPI no longer uses any buffer (the
    /// block may be freed); otherwise the meta cells are leaked and the
    /// caller must leak the block.
    pub(crate) fn shutdown(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut reqs: Vec<W::Req> = std::mem::take(&mut self.orphans);
        for s in &mut self.sends {
            reqs.extend(s.inflight.drain(..).flat_map(|(m, d)| [m, d]));
        }
        for r in &mut self.recvs {
            reqs.extend(r.inflight.drain(..).flat_map(|(m, d)| [m, d]));
        }
        let mut clean = true;
        for req in reqs {
            let left = deadline.saturating_duration_since(Instant::now());
            clean &= self.wire.retire(req, left);
        }
        if !clean {
            for r in &mut self.recvs {
                let metas = std::mem::take(&mut r.metas);
                Box::leak(metas);
            }
        }
        clean
    }
}

/// State shared by the proxy thread and the backend.
#[derive(Debug, Default)]
pub(crate) struct NetShared {
    stop: AtomicBool,
    /// Launches in flight: the proxy polls eagerly while any is.
    active: AtomicUsize,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// Counts a launch as in flight until dropped.
#[derive(Debug)]
pub(crate) struct ActiveGuard(Arc<NetShared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The memory of a NET block.
#[derive(Debug)]
pub(crate) enum NetBlock {
    /// Pinned and device-mapped (the backend).
    Pinned(PinnedMem),
    /// Plain host memory (tests on machines without a GPU).
    #[cfg(test)]
    Host(Vec<u64>),
}

impl NetBlock {
    fn host(&mut self) -> *mut u8 {
        match self {
            NetBlock::Pinned(m) => m.host,
            #[cfg(test)]
            NetBlock::Host(v) => v.as_mut_ptr() as *mut u8,
        }
    }
    fn bytes(&self) -> usize {
        match self {
            NetBlock::Pinned(m) => m.bytes,
            #[cfg(test)]
            NetBlock::Host(v) => v.len() * 8,
        }
    }
}

/// The NET transport of one backend: the block and the proxy thread.
pub(crate) struct NetProxy {
    shared: Arc<NetShared>,
    thread: Option<JoinHandle<bool>>,
    /// The NET block; `None` once freed or leaked.
    block: Option<NetBlock>,
    rank: usize,
}

impl std::fmt::Debug for NetProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetProxy")
            .field("rank", &self.rank)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

/// A zeroed NET block for `layout` and its device address.
pub(crate) fn alloc_block(layout: &NetLayout) -> Result<(NetBlock, u64)> {
    let bytes =
        usize::try_from(layout.total().max(8)).map_err(|_| Error::CountTooLarge(layout.total()))?;
    let mem = PinnedMem::alloc(bytes)?;
    // SAFETY: the allocation holds `bytes` bytes; nothing else uses it yet.
    unsafe { std::ptr::write_bytes(mem.host, 0, bytes) };
    let dev = super::driver::host_device_pointer(mem.host)?;
    Ok((NetBlock::Pinned(mem), dev))
}

impl NetProxy {
    /// Start the proxy thread over `comm` (a private duplicate). `segs` are
    /// the node's control segments, ours at `local_rank`.
    pub(crate) fn start(
        comm: MpiComm,
        layout: NetLayout,
        mut block: NetBlock,
        segs: Vec<Arc<Segment>>,
        local_rank: usize,
        rank: usize,
    ) -> Result<NetProxy> {
        let host = block.host();
        if (block.bytes() as u64) < layout.total() || host.align_offset(8) != 0 {
            return Err(Error::Backend("NET block smaller than its layout".into()));
        }
        // SAFETY: the block is 8-aligned, holds `total` bytes, was zeroed by
        // `alloc_block`, and outlives the thread (joined before it is freed;
        // moving a `NetBlock` does not move its memory).
        let mem = unsafe { NetMem::new(host, block.bytes() as u64) };
        // SAFETY: as above.
        let proxy = unsafe { Proxy::new(comm, layout, mem) };
        let shared = Arc::new(NetShared::default());
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gpucoll-net-{rank}"))
            .spawn(move || run(proxy, sh, segs, local_rank, rank))
            .map_err(|e| Error::System {
                call: "thread spawn",
                message: format!("NET proxy: {e}"),
            })?;
        Ok(NetProxy {
            shared,
            thread: Some(thread),
            block: Some(block),
            rank,
        })
    }

    /// The proxy's failure, if it failed.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        self.shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Mark a launch in flight until the guard drops.
    pub(crate) fn begin(&self) -> ActiveGuard {
        self.shared.active.fetch_add(1, Ordering::AcqRel);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        ActiveGuard(self.shared.clone())
    }

    /// Stop the thread and cancel its requests; free the block only if MPI
    /// no longer uses it (leak it otherwise), and say whether it was freed.
    /// Call after every rank's kernels are done (or the communicator
    /// failed). Idempotent.
    pub(crate) fn stop(&mut self) -> bool {
        self.shared.stop.store(true, Ordering::Release);
        let clean = match self.thread.take() {
            Some(t) => {
                t.thread().unpark();
                t.join().unwrap_or(false)
            }
            None => true,
        };
        if !clean {
            if let Some(b) = self.block.take() {
                tracing::warn!(
                    rank = self.rank,
                    bytes = b.bytes(),
                    "NET proxy: MPI requests could not be cancelled; leaking the NET block"
                );
                std::mem::forget(b);
            }
        }
        self.block = None;
        clean
    }
}

impl Drop for NetProxy {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The proxy thread; returns whether every request was retired cleanly.
fn run(
    mut proxy: Proxy<MpiComm>,
    shared: Arc<NetShared>,
    segs: Vec<Arc<Segment>>,
    local_rank: usize,
    rank: usize,
) -> bool {
    let Some(own) = segs.get(local_rank).cloned() else {
        return proxy.shutdown(CANCEL_WAIT);
    };
    let mut idle_since = Instant::now();
    let mut was_busy = false;
    let mut halted = false;
    while !shared.stop.load(Ordering::Acquire) {
        if !halted && own.abort_word() != 0 {
            // The backend failed or was aborted: leave the FIFOs alone.
            tracing::debug!(rank, "NET proxy: abort word raised; halting");
            halted = true;
        }
        if halted {
            std::thread::sleep(HALTED_SLEEP);
            continue;
        }
        match proxy.progress() {
            Ok(true) => {
                idle_since = Instant::now();
                continue;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(rank, "NET proxy failed: {e}");
                own.write_reason(&format!("rank {rank}: {e}"));
                {
                    let mut slot = shared.error.lock().unwrap_or_else(|p| p.into_inner());
                    if slot.is_none() {
                        *slot = Some(e);
                    }
                }
                shared.failed.store(true, Ordering::Release);
                // Make this node's kernels leave (they poll the abort word).
                for s in &segs {
                    s.raise_abort(local_rank);
                }
                halted = true;
                continue;
            }
        }
        // Busy: a launch is in flight or a send is pending; a launch that
        // just began restarts the spin and yield phases.
        let busy = shared.active.load(Ordering::Acquire) > 0 || proxy.sending();
        if busy && !was_busy {
            idle_since = Instant::now();
        }
        was_busy = busy;
        let idle = idle_since.elapsed();
        if idle < SPIN {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        } else if busy && idle < YIELD {
            std::thread::yield_now();
        } else if !busy && idle >= DEEP_IDLE {
            std::thread::park_timeout(DEEP_IDLE_SLEEP);
        } else {
            std::thread::sleep(IDLE_SLEEP);
        }
    }
    proxy.shutdown(CANCEL_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::rc::Rc;

    fn layout(peers: Vec<usize>) -> NetLayout {
        NetLayout {
            peers,
            channels: 3,
            slots: 4,
            slot_bytes: 64,
        }
    }

    #[test]
    fn layout_regions_are_disjoint_and_aligned() {
        let l = layout(vec![1, 4, 6]);
        let mut regions: Vec<(u64, u64)> = Vec::new();
        for c in 0..l.channels {
            for i in 0..l.peers.len() {
                regions.push((l.send_head(c, i), HEAD_STRIDE));
                regions.push((l.recv_head(c, i), HEAD_STRIDE));
                regions.push((l.send_conn(c, i), l.conn_bytes()));
                regions.push((l.recv_conn(c, i), l.conn_bytes()));
            }
        }
        regions.sort();
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
        let last = regions.last().unwrap();
        assert_eq!(last.0 + last.1, l.total());
        for (off, _) in &regions {
            assert_eq!(off % 64, 0);
        }
        assert_eq!(l.index_of(4), Some(1));
        assert_eq!(l.index_of(5), None);
        // The meta array fits the connector header.
        assert!(CONN_META_OFF + l.slots * 8 <= CONN_HEADER);
    }

    // ----- an in-memory fabric with MPI's matching order -----

    /// (source, destination, tag).
    type Lane = (usize, usize, i32);

    #[derive(Debug)]
    enum Req {
        Send {
            key: Lane,
            idx: usize,
            len: usize,
        },
        Recv {
            key: Lane,
            idx: usize,
            buf: *mut u8,
            cap: usize,
        },
    }

    #[derive(Default)]
    struct Fabric {
        /// Per (src, dst, tag): sends as (buffer, len), in order.
        sends: HashMap<Lane, Vec<(*const u8, usize)>>,
        /// Receives posted per lane.
        posted: HashMap<Lane, usize>,
        /// Delivered (lane, index) → bytes.
        delivered: HashMap<(Lane, usize), usize>,
        cancel_sends: bool,
    }

    #[derive(Clone)]
    struct LoopWire {
        rank: usize,
        fabric: Rc<RefCell<Fabric>>,
    }

    impl Wire for LoopWire {
        type Req = Req;
        unsafe fn isend(&self, buf: *const u8, len: usize, peer: usize, tag: i32) -> Result<Req> {
            let mut f = self.fabric.borrow_mut();
            let key = (self.rank, peer, tag);
            let lane = f.sends.entry(key).or_default();
            lane.push((buf, len));
            let idx = lane.len() - 1;
            Ok(Req::Send { key, idx, len })
        }
        unsafe fn irecv(&self, buf: *mut u8, cap: usize, peer: usize, tag: i32) -> Result<Req> {
            let mut f = self.fabric.borrow_mut();
            let key = (peer, self.rank, tag);
            let n = f.posted.entry(key).or_default();
            let idx = *n;
            *n += 1;
            Ok(Req::Recv { key, idx, buf, cap })
        }
        fn test(&self, req: &mut Req) -> Result<Option<usize>> {
            let mut f = self.fabric.borrow_mut();
            match *req {
                // Rendezvous: a send completes once its receive took the data,
                // so the sender's buffer must stay intact until then.
                Req::Send { key, idx, len } => Ok(f.delivered.get(&(key, idx)).map(|_| len)),
                Req::Recv { key, idx, buf, cap } => {
                    if let Some(&n) = f.delivered.get(&(key, idx)) {
                        return Ok(Some(n));
                    }
                    let Some(&(src, len)) = f.sends.get(&key).and_then(|l| l.get(idx)) else {
                        return Ok(None);
                    };
                    if len > cap {
                        return Err(Error::Backend("truncated".into()));
                    }
                    // SAFETY: both buffers are valid per the Wire contract.
                    unsafe { std::ptr::copy_nonoverlapping(src, buf, len) };
                    f.delivered.insert((key, idx), len);
                    Ok(Some(len))
                }
            }
        }
        fn retire(&self, req: Req, _wait: Duration) -> bool {
            let f = self.fabric.borrow();
            match req {
                Req::Send { key, idx, .. } => {
                    f.delivered.contains_key(&(key, idx)) || f.cancel_sends
                }
                Req::Recv { .. } => true,
            }
        }
    }

    /// Host code playing a rank's kernel on its NET connectors, with the
    /// kernel's protocol (meta, data, Release tail; Acquire head).
    struct KernelSim {
        mem: NetMem,
        layout: NetLayout,
        /// Step counters by pair: pieces sent, pieces received.
        sent: Vec<u64>,
        rcvd: Vec<u64>,
    }

    impl KernelSim {
        fn new(mem: NetMem, layout: NetLayout) -> KernelSim {
            let pairs = layout.pairs();
            KernelSim {
                mem,
                layout,
                sent: vec![0; pairs],
                rcvd: vec![0; pairs],
            }
        }

        /// The kernel's send: false while the FIFO is full.
        fn send(&mut self, c: u64, i: usize, meta: u64, payload: &[u8]) -> bool {
            let l = &self.layout;
            let k = c as usize * l.peers.len() + i;
            let head = self.mem.word(l.send_head(c, i)).load(Ordering::Acquire);
            let step = self.sent[k];
            if step - head >= l.slots {
                return false;
            }
            let conn = l.send_conn(c, i);
            let slot = step % l.slots;
            self.mem
                .word(conn + CONN_META_OFF + slot * 8)
                .store(meta, Ordering::Relaxed);
            let dst = self.mem.ptr(conn + CONN_HEADER + slot * l.slot_bytes);
            assert!(payload.len() as u64 <= l.slot_bytes);
            // SAFETY: the payload fits the slot (checked above).
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len()) };
            self.sent[k] = step + 1;
            self.mem
                .word(conn + CONN_TAIL_OFF)
                .store(step + 1, Ordering::Release);
            true
        }

        /// The kernel's receive: the next piece's meta and bytes, if any.
        fn recv(&mut self, c: u64, i: usize, len: usize) -> Option<(u64, Vec<u8>)> {
            let l = &self.layout;
            let k = c as usize * l.peers.len() + i;
            let conn = l.recv_conn(c, i);
            let tail = self.mem.word(conn + CONN_TAIL_OFF).load(Ordering::Acquire);
            let step = self.rcvd[k];
            assert!(tail - step <= l.slots, "tail ran past the free slots");
            if tail == step {
                return None;
            }
            let slot = step % l.slots;
            let meta = self
                .mem
                .word(conn + CONN_META_OFF + slot * 8)
                .load(Ordering::Relaxed);
            assert!(len as u64 <= l.slot_bytes);
            let mut out = vec![0u8; len];
            let src = self.mem.ptr(conn + CONN_HEADER + slot * l.slot_bytes);
            // SAFETY: len ≤ slot_bytes (checked above).
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
            self.rcvd[k] = step + 1;
            self.mem
                .word(l.recv_head(c, i))
                .store(step + 1, Ordering::Release);
            Some((meta, out))
        }
    }

    /// A rank: its NET block, its proxy over the in-memory fabric, and the
    /// host code playing its kernel.
    struct Rank {
        _block: Vec<u64>,
        mem: NetMem,
        layout: NetLayout,
        proxy: Proxy<LoopWire>,
        sim: KernelSim,
    }

    impl Rank {
        fn new(rank: usize, layout: NetLayout, fabric: &Rc<RefCell<Fabric>>) -> Rank {
            let mut block = vec![0u64; (layout.total() / 8) as usize];
            // SAFETY: the vector is 8-aligned, zeroed, and lives in `Rank`.
            let mem = unsafe { NetMem::new(block.as_mut_ptr() as *mut u8, layout.total()) };
            let wire = LoopWire {
                rank,
                fabric: fabric.clone(),
            };
            // SAFETY: as above.
            let proxy = unsafe { Proxy::new(wire, layout.clone(), mem) };
            Rank {
                _block: block,
                mem,
                sim: KernelSim::new(mem, layout.clone()),
                layout,
                proxy,
            }
        }

        fn kernel_send(&mut self, c: u64, i: usize, meta: u64, payload: &[u8]) -> bool {
            self.sim.send(c, i, meta, payload)
        }

        fn kernel_recv(&mut self, c: u64, i: usize, len: usize) -> Option<(u64, Vec<u8>)> {
            self.sim.recv(c, i, len)
        }
    }

    fn payload(seq: u64, c: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|j| (seq as usize * 31 + c as usize * 7 + j) as u8)
            .collect()
    }

    /// Rank 0 and rank 1 stream pieces to each other on every channel; every
    /// piece arrives once, in order, with its meta word and bytes, and the
    /// FIFOs never overrun.
    #[test]
    fn pieces_flow_both_ways_in_order() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut a = Rank::new(0, layout(vec![1]), &fabric);
        let mut b = Rank::new(1, layout(vec![0]), &fabric);
        const PIECES: u64 = 40;
        let len = |n: u64| (1 + (n * 13) % 64) as usize;
        let mut next_send = [[0u64; 3]; 2];
        let mut next_recv = [[0u64; 3]; 2];
        for _round in 0..10_000 {
            for (who, r) in [&mut a, &mut b].into_iter().enumerate() {
                for c in 0..3u64 {
                    let n = next_send[who][c as usize];
                    if n < PIECES {
                        let meta = (n << 32) | len(n) as u64;
                        if r.kernel_send(c, 0, meta, &payload(n, c, len(n))) {
                            next_send[who][c as usize] += 1;
                        }
                    }
                    let m = next_recv[who][c as usize];
                    if m < PIECES {
                        if let Some((meta, bytes)) = r.kernel_recv(c, 0, len(m)) {
                            assert_eq!(meta, (m << 32) | len(m) as u64);
                            assert_eq!(bytes, payload(m, c, len(m)));
                            next_recv[who][c as usize] += 1;
                        }
                    }
                }
                r.proxy.progress().unwrap();
            }
            if next_recv.iter().flatten().all(|&m| m == PIECES) {
                break;
            }
        }
        assert!(next_recv.iter().flatten().all(|&m| m == PIECES));
        // Every send completed: the heads caught up with the tails.
        for r in [&mut a, &mut b] {
            r.proxy.progress().unwrap();
            for c in 0..3 {
                let h = r.mem.word(r.layout.send_head(c, 0)).load(Ordering::Acquire);
                assert_eq!(h, PIECES);
            }
            assert!(!r.proxy.sending());
            // Only the posted receives remain, and they cancel cleanly.
            assert!(r.proxy.shutdown(Duration::ZERO));
        }
    }

    /// With more pieces than slots and a receiver that does not consume, the
    /// sender stalls once its FIFO and the receiver's are full, and nothing
    /// is overwritten.
    #[test]
    fn backpressure_without_overrun() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut a = Rank::new(0, layout(vec![1]), &fabric);
        let mut b = Rank::new(1, layout(vec![0]), &fabric);
        let mut sent = 0u64;
        for _ in 0..100 {
            if a.kernel_send(0, 0, (sent << 32) | 8, &payload(sent, 0, 8)) {
                sent += 1;
            }
            a.proxy.progress().unwrap();
            b.proxy.progress().unwrap();
        }
        // b's FIFO holds `slots` pieces; a's staging FIFO holds `slots` more.
        assert_eq!(sent, 2 * a.layout.slots);
        for m in 0..sent {
            let got = loop {
                if let Some(p) = b.kernel_recv(0, 0, 8) {
                    break p;
                }
                a.proxy.progress().unwrap();
                b.proxy.progress().unwrap();
            };
            assert_eq!(got, ((m << 32) | 8, payload(m, 0, 8)));
        }
        assert!(a.proxy.shutdown(Duration::ZERO));
        assert!(b.proxy.shutdown(Duration::ZERO));
    }

    /// A data message shorter than its meta word claims is published with
    /// the received length, so the kernel's meta check fails.
    #[test]
    fn short_data_is_visible_in_meta() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut b = Rank::new(1, layout(vec![0]), &fabric);
        b.proxy.progress().unwrap();
        // A peer whose meta word claims 48 bytes but whose data has 16
        // (the proxy always sends what the meta says, so forge it here).
        let wire = LoopWire {
            rank: 0,
            fabric: fabric.clone(),
        };
        let meta: u64 = (5 << 32) | 48;
        let data = [7u8; 16];
        // SAFETY: both buffers outlive the exchange below.
        let _m = unsafe { wire.isend(&meta as *const u64 as *const u8, 8, 1, meta_tag(0)) };
        // SAFETY: as above.
        let _d = unsafe { wire.isend(data.as_ptr(), data.len(), 1, data_tag(0)) };
        b.proxy.progress().unwrap();
        let (got, bytes) = b.kernel_recv(0, 0, 16).unwrap();
        assert_eq!(got, (5 << 32) | 16);
        assert_eq!(bytes, data.to_vec());
    }

    /// A staging tail that jumps past the free slots is an error, not a
    /// silent overrun.
    #[test]
    fn inconsistent_counters_are_errors() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut a = Rank::new(0, layout(vec![1]), &fabric);
        let conn = a.layout.send_conn(1, 0);
        a.mem
            .word(conn + CONN_TAIL_OFF)
            .store(a.layout.slots + 1, Ordering::Release);
        assert!(matches!(a.proxy.progress(), Err(Error::Backend(_))));
    }

    /// Sends MPI cannot cancel make shutdown report an unclean end (the
    /// caller then leaks the block).
    #[test]
    fn uncancellable_send_is_unclean() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut a = Rank::new(0, layout(vec![1]), &fabric);
        assert!(a.kernel_send(2, 0, 8, &[1; 8]));
        a.proxy.progress().unwrap();
        assert!(a.proxy.sending());
        assert!(!a.proxy.shutdown(Duration::ZERO));
        fabric.borrow_mut().cancel_sends = true;
        let mut b = Rank::new(0, layout(vec![1]), &fabric);
        assert!(b.kernel_send(2, 0, 8, &[1; 8]));
        b.proxy.progress().unwrap();
        assert!(b.proxy.shutdown(Duration::ZERO));
    }

    /// The proxy thread over real MPI between two processes, with host code
    /// playing both kernels: pieces of every size class (eager and
    /// rendezvous) on several channels both ways, then an abort word that
    /// halts the proxy, then a clean stop. Needs MPI, so `cargo test` skips
    /// it; run it as
    /// `mpirun -n 2 <lib test binary> --ignored --exact --test-threads 1
    /// backend::cuda::net::tests::mpi_proxy_streams`.
    #[test]
    #[ignore]
    fn mpi_proxy_streams() {
        let universe = crate::initialize().expect("MPI");
        let world = MpiComm::world();
        assert_eq!(world.size(), 2, "run with mpirun -n 2");
        let (rank, peer) = (world.rank(), 1 - world.rank());
        let layout = NetLayout {
            peers: vec![peer],
            channels: 3,
            slots: 8,
            slot_bytes: 64 << 10,
        };
        let mut block = vec![0u64; (layout.total() / 8) as usize];
        // SAFETY: the vector is 8-aligned and zeroed; its heap memory moves
        // into the proxy's `NetBlock` and lives until `stop` returned.
        let mem = unsafe { NetMem::new(block.as_mut_ptr() as *mut u8, layout.total()) };
        let name = format!("/gpucoll-nettest-{}-{rank}", std::process::id());
        let seg = Arc::new(Segment::create(&name, super::super::shm::CONTROL_BYTES).unwrap());
        let mut proxy = NetProxy::start(
            world.dup().unwrap(),
            layout.clone(),
            NetBlock::Host(block),
            vec![seg.clone()],
            0,
            rank,
        )
        .unwrap();
        let mut sim = KernelSim::new(mem, layout.clone());
        const PIECES: u64 = 400;
        let len = |n: u64, c: u64| -> usize {
            match n % 6 {
                0 => 64 << 10,
                1 => 1,
                2 => 4000,
                3 => 17_000 + c as usize,
                4 => 0,
                _ => 8,
            }
        };
        let id = |n: u64, r: usize| n + 1000 * r as u64;
        let (mut ns, mut nr) = ([0u64; 3], [0u64; 3]);
        let guard = proxy.begin();
        let start = Instant::now();
        while nr.iter().chain(ns.iter()).any(|&m| m < PIECES) {
            // A GPU kernel takes no host CPU: leave it to the proxies.
            std::thread::yield_now();
            if start.elapsed() > Duration::from_secs(20) {
                let w = |o: u64| mem.word(o).load(Ordering::Acquire);
                let st: Vec<_> = (0..3u64)
                    .map(|c| {
                        (
                            w(layout.send_conn(c, 0) + CONN_TAIL_OFF),
                            w(layout.send_head(c, 0)),
                            w(layout.recv_conn(c, 0) + CONN_TAIL_OFF),
                            w(layout.recv_head(c, 0)),
                        )
                    })
                    .collect();
                panic!("rank {rank} stalled: sent {ns:?}, received {nr:?}; (stail, shead, rtail, rhead) {st:?}");
            }
            for c in 0..3u64 {
                let n = ns[c as usize];
                if n < PIECES {
                    let l = len(n, c);
                    let meta = (id(n, rank) << 32) | l as u64;
                    if sim.send(c, 0, meta, &payload(id(n, rank), c, l)) {
                        ns[c as usize] += 1;
                    }
                }
                let m = nr[c as usize];
                if m < PIECES {
                    let l = len(m, c);
                    if let Some((meta, bytes)) = sim.recv(c, 0, l) {
                        assert_eq!(meta, (id(m, peer) << 32) | l as u64, "channel {c}");
                        assert!(bytes == payload(id(m, peer), c, l), "piece {m} channel {c}");
                        nr[c as usize] += 1;
                    }
                }
            }
        }
        // Our last sends complete (the heads catch up with the tails).
        let done = |c: u64| mem.word(layout.send_head(c, 0)).load(Ordering::Acquire);
        while (0..3).any(|c| done(c) < PIECES) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "rank {rank}: sends never completed: {:?}",
                (0..3).map(done).collect::<Vec<_>>()
            );
            std::thread::yield_now();
        }
        drop(guard);
        assert!(proxy.error().is_none());
        world.barrier().unwrap();
        // A raised abort word halts the proxy: a newly staged piece stays.
        if rank == 0 {
            seg.raise_abort(0);
            std::thread::sleep(Duration::from_millis(20));
            assert!(sim.send(1, 0, 8, &[9; 8]));
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(done(1), PIECES, "a halted proxy sent a piece");
        }
        world.barrier().unwrap();
        assert!(proxy.stop(), "rank {rank}: requests did not retire cleanly");
        drop(universe);
    }
}
