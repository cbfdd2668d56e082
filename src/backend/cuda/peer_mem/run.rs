//! The sequence of one copy-engine call (steps 1-4 of the module doc) and
//! the release of its waits after a failure: `impl CudaShared`, apart from the
//! state the backend owns (`mod.rs`), so that state does not depend on
//! the backend's own type.

use super::super::cache::Resources;
use super::super::driver::{self, CUstream};
use super::super::handles::{Event, Stream};
use super::super::lower::{CeCall, Mem};
use super::super::memory::DevMem;
use super::super::state::CudaShared;
use super::board::{self, Post, Target};
use super::registry::{Registry, BLOCK_BYTES};
use super::schedule::{self, incoming, schedule, Source};
use super::vmm::{fresh_offers, Fresh};
use super::State;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Streams the copies of a large call are spread over.
pub(crate) const LANES: usize = 4;
/// Calls moving at least this many bytes (all copies together) use the
/// lanes; smaller ones queue their copies on the submission's stream.
pub(crate) const LANE_MIN_BYTES: u64 = 8 << 20;
/// Batches the driver may refuse in a row before batch copies are turned
/// off for the communicator (each refused batch is copied piece by piece).
pub(crate) const BATCH_MAX_REFUSALS: u32 = 3;
/// Smallest piece a copy is split into for the lanes.
const LANE_PIECE_BYTES: u64 = 2 << 20;
/// Host waits for peers' posts spin this long before they sleep.
const POST_SPIN: Duration = Duration::from_micros(200);
/// How often a waiting host looks at abort words and peers' processes.
const CHECK_EVERY: Duration = Duration::from_millis(1);

impl CudaShared {
    /// Release every copy-engine wait of our stream after a failure (the
    /// peers will not raise our flags any more): called while failed work
    /// drains, as often as the waits go on.
    pub(in crate::backend::cuda) fn ce_release(&self) {
        if self.ce.used.load(Ordering::Acquire) {
            board::release(self.own().as_ref());
        }
    }

    /// Queue copy-engine call `call` on `stream`; `notify`: store
    /// `seq + 1` into channel 0's done word at the end (a blocking call's
    /// completion, as its last kernel would). Any error fails the node:
    /// the peers went ahead with this call (even an out-of-memory error,
    /// which the caller still gets as such).
    pub(in crate::backend::cuda) fn run_ce(
        &self,
        call: &CeCall,
        stream: CUstream,
        captured: bool,
        notify: bool,
        res: &mut Resources,
    ) -> Result<()> {
        let r = self.post_ce(call, stream, captured, notify, res);
        if let Err(e) = &r {
            self.mark_failed(e.to_string());
        }
        r
    }

    /// Step 1 up to our post, then [`queue_ce`](Self::queue_ce).
    fn post_ce(
        &self,
        call: &CeCall,
        stream: CUstream,
        captured: bool,
        notify: bool,
        res: &mut Resources,
    ) -> Result<()> {
        let (n, me) = (self.nranks, self.rank);
        if self.segs.len() != n || n > board::MAX_RANKS {
            return Err(Error::Backend(format!(
                "copy-engine collective on {n} ranks with {} local segments",
                self.segs.len()
            )));
        }
        let block = call.block();
        let sched = schedule(call.kind, n, me, call.root, block, call.in_place);
        self.check_ce_buffers(call, &sched)?;
        let mut st = self.ce.state.lock().unwrap_or_else(|p| p.into_inner());
        self.ce.used.store(true, Ordering::Release);
        st.registry.begin_call()?;
        self.vmm_check_gone(&mut st)?;
        let number = st.calls;
        st.calls += 1;

        // 1. Post where peers push, then read every peer's post.
        let out_bytes = call.output.elems.saturating_mul(call.esize());
        let mut bounce = None;
        let mut fresh = None;
        let target = if sched.receives_from.is_empty() {
            None
        } else {
            let alloc = driver::allocation_of(call.output.addr)?;
            let direct = alloc.and_then(|a| st.registry.share(&a, call.output.addr, out_bytes));
            if direct.is_none() && !captured {
                // A VMM output is received through a bounce buffer this
                // time and offered for the calls after it.
                fresh = self.offer_vmm(&mut st, alloc, call.output.addr, out_bytes)?;
            }
            match direct {
                Some(t) => Some(t),
                None => Some(self.bounce(out_bytes, &mut st.registry, res, &mut bounce)?),
            }
        };
        let post = Post {
            number,
            seq: call.seq,
            digest: call.digest(),
            target,
            source: None,
            note: 0,
            offer: fresh.as_ref().map(|f| f.target(call.output.addr)),
        };
        board::publish(self.own().as_ref(), &post);
        self.queue_ce(
            call, &sched, &post, &mut st, stream, captured, notify, bounce, fresh,
        )
    }

    /// Steps 1 (after our post) to 4 of the module doc.
    #[allow(clippy::too_many_arguments)]
    fn queue_ce(
        &self,
        call: &CeCall,
        sched: &schedule::Schedule,
        post: &Post,
        st: &mut State,
        stream: CUstream,
        captured: bool,
        notify: bool,
        bounce: Option<u64>,
        fresh: Option<Fresh>,
    ) -> Result<()> {
        let (n, me) = (self.nranks, self.rank);
        let block = call.block();
        let out_bytes = call.output.elems.saturating_mul(call.esize());
        let posts = self.await_posts(post)?;
        let offers = fresh_offers(&posts, me, |q| q.offer);
        if fresh.is_some() || !offers.is_empty() {
            // This call keeps its posted targets; what is agreed serves
            // the calls after it.
            self.vmm_exchange(st, call.seq, post.number, &offers, fresh.as_ref(), false)?;
        }
        let mut peer_out = vec![0u64; n];
        // Bytes from each peer's posted offset to the end of its allocation:
        // no push may land beyond them.
        let mut room = vec![0u64; n];
        for &p in &sched.sends_to {
            let t = posts[p].and_then(|q| q.target).ok_or_else(|| {
                Error::Backend(format!(
                    "rank {p} posted no receive buffer for copy-engine collective #{}",
                    call.seq
                ))
            })?;
            room[p] = t.alloc_bytes - t.offset;
            peer_out[p] = st.registry.open(p, &t, captured)? + t.offset;
        }
        if let Some(c) = sched
            .copies
            .iter()
            .find(|c| c.to != me && c.bytes > 0 && c.dst_off.saturating_add(c.bytes) > room[c.to])
        {
            return Err(Error::ProtocolMismatch {
                peer: c.to,
                detail: format!(
                    "copy-engine collective #{}: {} bytes at {} do not fit the {} bytes rank {} \
                     posted",
                    call.seq, c.bytes, c.dst_off, room[c.to], c.to
                ),
            });
        }
        self.ce_evict(st, stream, captured)?;
        tracing::debug!(
            rank = me,
            seq = call.seq,
            coll = call.kind.name(),
            bytes = block,
            bounce = bounce.is_some(),
            "copy-engine collective"
        );

        // 2-4. The stream's part. SAFETY (every block below): the buffers
        // stay valid until the work completed (Backend::submit), peers'
        // outputs are mapped by the registry until that work is done
        // (eviction waits for an event).
        if sched.stage_output {
            unsafe {
                driver::memcpy_dtod_async(
                    call.scratch.addr,
                    call.output.addr,
                    out_bytes as usize,
                    stream,
                )?
            };
        }
        self.hand_shake(
            stream,
            board::ready_flag,
            &sched.receives_from,
            &sched.sends_to,
        )?;
        let mut copies = Vec::with_capacity(sched.copies.len());
        for c in &sched.copies {
            let src = match c.source {
                Source::Input => call.input.addr,
                Source::Staged => call.scratch.addr,
            } + c.src_off;
            let dst = if c.to == me {
                call.output.addr
            } else {
                peer_out[c.to]
            } + c.dst_off;
            if c.bytes > 0 && src != dst {
                copies.push((dst, src, c.bytes));
            }
        }
        self.queue_copies(st, &copies, stream, captured)?;
        self.hand_shake(
            stream,
            board::done_flag,
            &sched.sends_to,
            &sched.receives_from,
        )?;
        if let Some(b) = bounce {
            for (off, bytes) in incoming(call.kind, n, me, call.root, block, call.in_place) {
                unsafe {
                    driver::memcpy_dtod_async(
                        call.output.addr + off,
                        b + off,
                        bytes as usize,
                        stream,
                    )?
                };
            }
        }
        if notify {
            self.notify_done(stream, call.seq)?;
        }
        Ok(())
    }

    /// Queue one hand-shake on `stream`: raise flag `flag` (ours, in
    /// their segments) for every rank of `raise`, then wait for the flag
    /// of every rank of `wait` in our segment and reset it (see
    /// `board.rs`: a flag rises again only after a causal chain through
    /// the reset).
    pub(super) fn hand_shake(
        &self,
        stream: CUstream,
        flag: fn(usize) -> usize,
        raise: &[usize],
        wait: &[usize],
    ) -> Result<()> {
        // SAFETY (each block): the flags live in the node's control
        // segments, mapped and registered with CUDA for the backend's life.
        for &p in raise {
            let word = self.segs[p].dev_at(flag(self.rank))?;
            unsafe { driver::stream_write_u32(stream, word, 1)? };
        }
        for &p in wait {
            let word = self.own().dev_at(flag(p))?;
            unsafe { driver::stream_wait_geq_u32(stream, word, 1)? };
            unsafe { driver::stream_write_u32(stream, word, 0)? };
        }
        Ok(())
    }

    /// Store `seq + 1` into channel 0's done word when `stream` gets here
    /// (a blocking call's end, as its last kernel would store it).
    pub(super) fn notify_done(&self, stream: CUstream, seq: u64) -> Result<()> {
        let done =
            self.target.status + std::mem::offset_of!(super::super::abi::GcChanStatus, done) as u64;
        // SAFETY: the status word lives in our control segment, mapped for
        // the backend's life.
        unsafe { driver::stream_write_u64(stream, done, seq + 1) }
    }

    /// The buffers hold what the schedule reads and writes.
    fn check_ce_buffers(&self, call: &CeCall, sched: &schedule::Schedule) -> Result<()> {
        let es = call.esize();
        let fits = |m: &Mem, end: u64| m.addr != 0 && m.elems.saturating_mul(es) >= end;
        for c in &sched.copies {
            let src = match c.source {
                Source::Input => &call.input,
                Source::Staged => &call.scratch,
            };
            let ok = fits(src, c.src_off + c.bytes)
                && (c.to != self.rank || fits(&call.output, c.dst_off + c.bytes));
            if !ok {
                return Err(Error::Backend(format!(
                    "copy-engine {} #{}: a copy of {} bytes does not fit the buffers",
                    call.kind.name(),
                    call.seq,
                    c.bytes
                )));
            }
        }
        if (sched.stage_output && !fits(&call.scratch, call.output.elems * es))
            || (!sched.receives_from.is_empty() && call.output.addr == 0)
        {
            return Err(Error::Backend(format!(
                "copy-engine {} #{}: no room to receive",
                call.kind.name(),
                call.seq
            )));
        }
        Ok(())
    }

    /// A bounce buffer of `bytes` for an output peers cannot reach, as
    /// peers find it (`bounce` keeps its address).
    fn bounce(
        &self,
        bytes: u64,
        registry: &mut Registry,
        res: &mut Resources,
        bounce: &mut Option<u64>,
    ) -> Result<Target> {
        // A block of its own, never packed with others (see `registry`).
        let m = DevMem::alloc(
            bytes
                .div_ceil(BLOCK_BYTES)
                .max(1)
                .saturating_mul(BLOCK_BYTES) as usize,
        )?;
        let alloc = driver::allocation_of(m.ptr)?
            .ok_or_else(|| Error::Backend("a new device allocation has no range".into()))?;
        let target = registry.share(&alloc, m.ptr, bytes).ok_or_else(|| {
            Error::Backend("cuIpcGetMemHandle failed on a cuMemAlloc block".into())
        })?;
        *bounce = Some(m.ptr);
        res.mems.push(m);
        Ok(target)
    }

    /// Every peer's post of the copy-engine call `mine` is ours of (ours
    /// at our rank).
    pub(super) fn await_posts(&self, mine: &Post) -> Result<Vec<Option<Post>>> {
        let n = self.nranks;
        let mut posts: Vec<Option<Post>> = vec![None; n];
        posts[self.rank] = Some(*mine);
        let start = Instant::now();
        let mut last_check = start;
        loop {
            let mut missing = None;
            for (p, slot) in posts.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                let read = board::read(self.segs[p].as_ref(), mine.number).map_err(|e| {
                    Error::ProtocolMismatch {
                        peer: p,
                        detail: format!("copy-engine call {}: {e}", mine.number),
                    }
                });
                let read = match read {
                    Ok(r) => r,
                    Err(e) => {
                        self.mark_failed(e.to_string());
                        return Err(e);
                    }
                };
                match read {
                    Some(q) => {
                        if q.seq != mine.seq || q.digest != mine.digest {
                            let e = Error::ProtocolMismatch {
                                peer: p,
                                detail: format!(
                                    "copy-engine call {}: {} here, {} on rank {p} (another \
                                     kind, root, count or datatype)",
                                    mine.number,
                                    describe(mine),
                                    describe(&q)
                                ),
                            };
                            self.mark_failed(e.to_string());
                            return Err(e);
                        }
                        *slot = Some(q);
                    }
                    None => missing = Some(p),
                }
            }
            let Some(p) = missing else {
                return Ok(posts);
            };
            let now = Instant::now();
            if now.duration_since(last_check) >= CHECK_EVERY {
                last_check = now;
                if let Some(e) = self.liveness.dead() {
                    self.mark_failed(e.to_string());
                    return Err(e);
                }
                if self.own().abort_word() != 0 {
                    return Err(self.state_error().unwrap_or(Error::Aborted));
                }
                if now.duration_since(start) >= self.timeout {
                    let e = Error::Timeout {
                        seq: mine.seq,
                        seconds: self.timeout.as_secs_f64(),
                        waiting_for: format!(
                            "rank {p} to reach the {} (rank {} is there)",
                            describe(mine),
                            self.rank
                        ),
                    };
                    self.mark_failed(e.to_string());
                    return Err(e);
                }
            }
            if now.duration_since(start) < POST_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Queue `copies` `(dst, src, bytes)` on `stream`: one
    /// `cuMemcpyBatchAsync` where the driver has it (not while capturing,
    /// not on the legacy default stream, not with `GPUCOLL_CE_BATCH=0`),
    /// else one copy each, from [`LANE_MIN_BYTES`] on in pieces over the
    /// lanes forked from `stream` and joined back into it. Large copies are
    /// split in pieces either way, so several copy engines can work at once.
    fn queue_copies(
        &self,
        st: &mut State,
        copies: &[(u64, u64, u64)],
        stream: CUstream,
        captured: bool,
    ) -> Result<()> {
        let total: u64 = copies.iter().map(|c| c.2).sum();
        let split = total >= LANE_MIN_BYTES;
        let mut pieces = Vec::with_capacity(copies.len() * LANES);
        for &(dst, src, bytes) in copies {
            let n = if split {
                bytes.div_ceil(LANE_PIECE_BYTES).clamp(1, LANES as u64)
            } else {
                1
            };
            // Piece boundaries on 4 KiB.
            let step = bytes.div_ceil(n).div_ceil(4096).max(1) * 4096;
            let mut off = 0;
            while off < bytes {
                let len = step.min(bytes - off);
                pieces.push((dst + off, src + off, len));
                off += len;
            }
        }
        if pieces.is_empty() {
            return Ok(());
        }
        if !captured
            && !stream.is_null()
            && self.ce.batch.load(Ordering::Relaxed)
            && driver::batch_available()
        {
            // SAFETY: see run_ce: every range is mapped until the work completed.
            match unsafe { driver::memcpy_batch_async(&pieces, stream) } {
                Ok(()) => {
                    self.ce.batch_refusals.store(0, Ordering::Relaxed);
                    tracing::debug!(
                        rank = self.rank,
                        pieces = pieces.len(),
                        "copy engines: one batch"
                    );
                    return Ok(());
                }
                Err(e) => {
                    // A refused batch queued nothing: copy this call's
                    // pieces one by one, and give up on batches only when
                    // the driver keeps refusing them.
                    let n = self.ce.batch_refusals.fetch_add(1, Ordering::Relaxed) + 1;
                    let off = n >= BATCH_MAX_REFUSALS;
                    if off {
                        self.ce.batch.store(false, Ordering::Relaxed);
                    }
                    tracing::warn!(
                        rank = self.rank,
                        pieces = pieces.len(),
                        first = ?pieces.first(),
                        refusals = n,
                        "copy engines: {e}; this call copies piece by piece{}",
                        if off { ", and every later one" } else { "" }
                    );
                }
            }
        }
        tracing::debug!(
            rank = self.rank,
            pieces = pieces.len(),
            lanes = split,
            "copy engines: one copy per piece"
        );
        if !split {
            for &(dst, src, bytes) in &pieces {
                // SAFETY: see run_ce: both ranges are mapped until the work completed.
                unsafe { driver::memcpy_dtod_async(dst, src, bytes as usize, stream)? };
            }
            return Ok(());
        }
        while st.lanes.len() < LANES {
            st.lanes.push(Stream::create(false)?);
            st.joins.push(Event::create()?);
        }
        if st.fork.is_none() {
            st.fork = Some(Event::create()?);
        }
        let fork = st
            .fork
            .as_ref()
            .map(|e| e.raw())
            .unwrap_or(std::ptr::null_mut());
        driver::event_record(fork, stream)?;
        for lane in &st.lanes {
            driver::stream_wait_event(lane.raw(), fork)?;
        }
        for (k, &(dst, src, len)) in pieces.iter().enumerate() {
            let lane = st.lanes[k % LANES].raw();
            // SAFETY: see run_ce; the lane is joined back into `stream`
            // below, so the copy completes before the work does.
            unsafe { driver::memcpy_dtod_async(dst, src, len as usize, lane)? };
        }
        for (lane, join) in st.lanes.iter().zip(&st.joins) {
            driver::event_record(join.raw(), lane.raw())?;
            driver::stream_wait_event(stream, join.raw())?;
        }
        Ok(())
    }
}

/// A post's call, in words.
fn describe(p: &Post) -> String {
    if p.digest == super::register::DIGEST {
        format!("buffer registration before collective #{}", p.seq)
    } else if p.digest == super::vmm::AGREE_DIGEST {
        format!(
            "agreement on VMM allocations of a buffer registration before collective #{}",
            p.seq
        )
    } else {
        format!("copy-engine collective #{}", p.seq)
    }
}
