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
//! With collnet, each channel also has a rail pair, bridged to MPI's own
//! all-reduce (`net/rail.rs`).
//!
//! The proxy's state machine ([`Proxy`]) is generic over the [`Wire`] that
//! moves messages, so it is unit-tested over host memory without MPI or GPU
//! (`net/tests.rs`); the thread that drives it over MPI is in `net/thread.rs`;
//! NET's row of the transport table (the peers it accepts, its bring-up
//! stages and what they own) is `net/stage.rs`.

use crate::backend::cuda::abi::{GcConn, CONN_HEADER, CONN_META_OFF, CONN_TAIL_OFF, HEAD_STRIDE};
use crate::backend::cuda::layout::conn;
use crate::error::{Error, Result};
use crate::mpi::{MpiComm, MpiRequest};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Whether each channel also has a rail pair (collnet, `net/rail.rs`),
    /// at peer index `peers.len()`.
    pub rail: bool,
}

impl NetLayout {
    fn conn_bytes(&self) -> u64 {
        CONN_HEADER + self.slots * self.slot_bytes
    }
    fn pair_bytes(&self) -> u64 {
        2 * HEAD_STRIDE + 2 * self.conn_bytes()
    }
    /// Pairs per channel: one per NET peer, and the rail's.
    fn per_channel(&self) -> u64 {
        self.peers.len() as u64 + u64::from(self.rail)
    }
    fn pair_off(&self, c: u64, i: usize) -> u64 {
        (c * self.per_channel() + i as u64) * self.pair_bytes()
    }
    /// The peer index of the rail pair, if the layout has rails.
    pub(crate) fn rail_index(&self) -> Option<usize> {
        self.rail.then_some(self.peers.len())
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
        self.channels * self.per_channel() * self.pair_bytes()
    }
    /// The peer index of `rank`, if it is a NET peer.
    pub(crate) fn index_of(&self, rank: usize) -> Option<usize> {
        self.peers.binary_search(&rank).ok()
    }
    /// NET peer pairs (the rails apart).
    fn pairs(&self) -> usize {
        self.channels as usize * self.peers.len()
    }
    /// The connectors `(send, recv)` of channel `c` to `peer`, as rank
    /// `rank` with its block at device address `dev` sees them: both in
    /// that block, the proxy moving the pieces between our staging FIFO
    /// and the peer's receive FIFO. At our own index, the rail pair
    /// (collnet, bridged to MPI's all-reduce by `rail.rs`) if the layout
    /// has rails; `None` for ranks that are no NET peers.
    pub(crate) fn conns(
        &self,
        c: u64,
        peer: usize,
        rank: usize,
        dev: u64,
    ) -> Option<(GcConn, GcConn)> {
        let i = if peer == rank {
            self.rail_index()?
        } else {
            self.index_of(peer)?
        };
        let send = conn(dev + self.send_conn(c, i), dev + self.send_head(c, i));
        let recv = conn(dev + self.recv_conn(c, i), dev + self.recv_head(c, i));
        Some((send, recv))
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
    /// The rails, when the layout has them (`rail.rs`).
    rails: Option<Rails>,
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
    /// `rails`: the all-reduces and jobs queue of the rail pairs, which
    /// the layout has if and only if they are given.
    pub(crate) unsafe fn new(
        wire: W,
        layout: NetLayout,
        mem: NetMem,
        rails: Option<(Box<dyn RailNet>, Arc<RailJobs>)>,
    ) -> Proxy<W> {
        let pairs = layout.pairs();
        let slots = layout.slots as usize;
        let channels = layout.channels as usize;
        Proxy {
            rails: rails.filter(|_| layout.rail).map(|(net, jobs)| Rails {
                net,
                jobs,
                sides: (0..channels).map(|_| RailSide::new()).collect(),
            }),
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
            moved |= self.rail_progress(c)?;
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

    /// Whether any piece is in MPI's hands (sends or rail all-reduces not
    /// yet completed).
    fn sending(&self) -> bool {
        self.sends.iter().any(|s| !s.inflight.is_empty())
            || self
                .rails
                .as_ref()
                .is_some_and(|r| r.sides.iter().any(RailSide::busy))
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
        // An all-reduce in flight owns its buffers (leaked if it never
        // completes): nothing of the block is in MPI's hands.
        if let Some(r) = self.rails.take() {
            r.close();
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

mod rail;
mod stage;
mod thread;
pub(crate) use rail::{MpiRails, RailJob, RailJobs};
use rail::{RailNet, RailSide, Rails};
pub(crate) use stage::{Net, NetOwner};
use thread::NetBlock;
pub(crate) use thread::{alloc_block, ActiveGuard, NetProxy};

#[cfg(test)]
mod tests;
