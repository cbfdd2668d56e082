//! Work in flight and its completion: [`CudaPending`] polls the completion
//! event (or the stream), watches progress, abort and timeout, copies
//! staged host outputs back and releases the submission's resources.

use super::abi::*;
use super::cache::Resources;
use super::driver;
use super::handles::Event;
use super::memory::bind;
use super::net;
use super::shm;
use super::state::CudaShared;
use crate::backend::PendingWork;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a kernel may take to leave after its abort word was raised
/// before `wait` gives up on it (and leaks its memory).
pub(super) const ABORT_GRACE: Duration = Duration::from_secs(10);
/// `wait` spins (no yield, no sleep) this long before it yields, then sleeps:
/// a small collective completes in ~10 µs, and a sleep costs ≥ 50 µs.
const WAIT_SPIN: Duration = Duration::from_micros(200);
/// After the spin, `wait` yields this long before it sleeps between polls.
const WAIT_YIELD: Duration = Duration::from_millis(2);
/// While the work is not complete, progress, abort and timeout are checked
/// at most this often (the completion query itself runs on every poll).
const CHECK_EVERY: Duration = Duration::from_micros(100);

impl CudaShared {
    fn status_word(&self, c: usize, off: usize) -> u64 {
        self.own()
            .read_u64(shm::STATUS_OFF + c * std::mem::size_of::<GcChanStatus>() + off)
    }

    fn progress_sum(&self) -> u64 {
        (0..self.target.layout.channels as usize)
            .map(|c| self.status_word(c, 24))
            .fold(0u64, u64::wrapping_add)
    }
}

/// One submission in flight.
pub(super) struct CudaPending {
    pub inner: Arc<CudaShared>,
    /// Recorded after the last kernel; None for a blocking submission,
    /// which waits for the whole stream instead.
    pub event: Option<Event>,
    /// On a caller's stream: recorded before our work; until it completed
    /// the work has not started (the caller's earlier work runs), so the
    /// timeout clock does not run.
    pub started: Option<Event>,
    /// A blocking submission on our own stream: the value its last kernel
    /// stores into channel 0's `GcChanStatus::done` when all its blocks
    /// finished. Polling that host word replaces the stream query (1.3 µs
    /// a call, and the end seen ~2 µs later), which then runs only every
    /// [`CHECK_EVERY`], for a launch that stopped without storing it.
    pub done_tag: Option<u64>,
    /// The stream the work was queued on (raw handle).
    pub stream: usize,
    /// Posted to the resident block as its call number `n`: the block's
    /// stream ends only when the block leaves, and a block that left
    /// without taking the call is launched again.
    pub resident: Option<u64>,
    pub res: Option<Resources>,
    pub seq: u64,
    pub done: Option<Result<()>>,
    last_sum: u64,
    last_progress: Instant,
    /// When progress, abort and timeout were last checked.
    last_check: Instant,
    abort_seen: Option<Instant>,
    timed_out: bool,
    /// A local peer's process died while this work waited (it fails the
    /// communicator and is the error this work reports).
    peer_dead: Option<Error>,
    /// Tells the transports with a thread (NET's proxy) that a launch is in
    /// flight (they then poll eagerly).
    active: Option<net::ActiveGuard>,
}

// SAFETY: the event handles may be queried from any thread (context bound
// first); the resources are owned.
unsafe impl Send for CudaPending {}

impl CudaPending {
    /// Work of collective `seq` about to be queued; `event` marks its end.
    pub(super) fn new(
        inner: Arc<CudaShared>,
        event: Option<Event>,
        seq: u64,
        stream: usize,
    ) -> CudaPending {
        let now = Instant::now();
        let active = inner.transports.begin();
        CudaPending {
            inner,
            event,
            started: None,
            done_tag: None,
            stream,
            resident: None,
            res: None,
            seq,
            done: None,
            // The first check (after CHECK_EVERY) sees a change and restarts
            // the clock: no per-submission read of every channel's counter.
            last_sum: u64::MAX,
            last_progress: now,
            last_check: now,
            abort_seen: None,
            timed_out: false,
            peer_dead: None,
            active,
        }
    }

    /// The error recorded by the kernel, if any.
    fn kernel_error(&self) -> Option<Error> {
        let inner = &self.inner;
        let mut aborted_only = false;
        for c in 0..inner.target.layout.channels as usize {
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
        if let Some(e) = &self.peer_dead {
            return e.clone();
        }
        // A transport's thread (NET's proxy) raised the abort word: its
        // error says why.
        if let Some(e) = inner.transport_error() {
            return e;
        }
        if self.timed_out {
            return Error::Timeout {
                seq: self.seq,
                seconds: inner.timeout.as_secs_f64(),
                waiting_for: format!(
                    "the GPU kernel on rank {} made no progress (a peer is dead, slow, or \
                     issued a different call){}",
                    inner.rank,
                    match inner.live.others() {
                        0 => String::new(),
                        n => format!(
                            "; {n} other communicator(s) of this process use this GPU: \
                             collectives of communicators busy at the same time must fit on \
                             the GPU together (Config::cuda_channels) or be issued in the \
                             same order on every rank (README, \"Threads\")"
                        ),
                    }
                ),
            };
        }
        if let Some(e) = inner.node().peer_error() {
            return e;
        }
        if inner.failure.aborted() {
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
            self.inner.store.give_work(w);
        }
        if let Some(c) = r.cached.take() {
            self.inner.store.release_cached(c);
        }
        drop(r);
    }

    /// Whether the last kernel stored `done_tag` (its blocks all finished).
    fn done_stored(&self) -> bool {
        self.done_tag.is_some_and(|tag| {
            self.inner
                .status_word(0, std::mem::offset_of!(GcChanStatus, done))
                == tag
        })
    }

    /// Whether the submission's kernels completed (for a resident call:
    /// the block left, having taken it).
    fn complete(&self) -> Result<bool> {
        if let (Some(n), Some(r)) = (self.resident, &self.inner.resident) {
            if !driver::stream_query(r.stream())? {
                return Ok(false);
            }
            // The block left: it took the call (and stopped in it), or it
            // left before the call, which a new launch then takes.
            if r.lost(n) {
                self.recover_resident()?;
                return Ok(false);
            }
            return Ok(true);
        }
        match &self.event {
            Some(e) => driver::event_query(e.raw()),
            None => driver::stream_query(self.inner.stream.raw()),
        }
    }

    /// A resident call whose block left before taking it goes to a new
    /// launch at once (a host word read; the stream is queried only every
    /// [`CHECK_EVERY`]).
    /// After the abort word went up, a block left without the call and a
    /// new one would leave at once: the call fails instead.
    fn recover_resident(&self) -> Result<()> {
        if let (Some(n), Some(r)) = (self.resident, &self.inner.resident) {
            if r.lost(n) {
                if self.inner.own().abort_word() != 0 {
                    return Err(self.abort_error());
                }
                r.recover(n, &self.inner.launcher())?;
            }
        }
        Ok(())
    }

    /// Progress, a dead local peer, the abort word and the timeout, checked
    /// at `now` while the work is not complete: `Err` once it is given up.
    fn watch(&mut self, now: Instant) -> Result<()> {
        let sum = self.inner.progress_sum();
        if sum != self.last_sum {
            self.last_sum = sum;
            self.last_progress = now;
        }
        if self.peer_dead.is_none() {
            if let Some(e) = self.inner.liveness.dead() {
                // Raises the node's abort words: our kernels leave.
                self.inner.mark_failed(e.to_string());
                self.peer_dead = Some(e);
            }
        }
        if self.abort_seen.is_none() && self.inner.own().abort_word() != 0 {
            self.abort_seen = Some(now);
        }
        if self.abort_seen.is_none() && now.duration_since(self.last_progress) >= self.inner.timeout
        {
            self.timed_out = true;
            let e = self.abort_error();
            self.inner.mark_failed(e.to_string());
            self.abort_seen = Some(now);
        }
        if let Some(t) = self.abort_seen {
            // Copy-engine waits no peer will complete any more.
            self.inner.ce_release();
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
        Ok(())
    }

    /// One step of progress; Some(result) once finished. `bound`: the
    /// context is already current on this thread.
    pub(super) fn poll(&mut self, bound: bool) -> Option<Result<()>> {
        if let Some(d) = &self.done {
            return Some(d.clone());
        }
        let r = (|| -> Result<Option<()>> {
            if !bound {
                bind(self.inner.ctx.ordinal)?;
            }
            if self.done_stored() {
                return self.finish().map(Some);
            }
            self.recover_resident()?;
            if self.done_tag.is_none() && self.complete()? {
                return self.finish().map(Some);
            }
            let now = Instant::now();
            if now.duration_since(self.last_check) < CHECK_EVERY {
                return Ok(None);
            }
            self.last_check = now;
            if self.done_tag.is_some() && self.complete()? {
                return self.finish().map(Some);
            }
            if let Some(s) = &self.started {
                if !driver::event_query(s.raw())? {
                    self.last_progress = now;
                    return Ok(None);
                }
                if let Some(s) = self.started.take() {
                    self.inner.events.give(s);
                }
                self.last_progress = now;
            }
            self.watch(now)?;
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
        if events.iter().any(Option::is_some) {
            if bind(self.inner.ctx.ordinal).is_err() {
                // No usable context: leave the events alone.
                std::mem::forget(events);
                return;
            }
            for e in events.into_iter().flatten() {
                // A completed event may be recorded again; any other is
                // destroyed (a kernel that never left may still hold it).
                if matches!(self.done, Some(Ok(()))) {
                    self.inner.events.give(e);
                } else {
                    drop(e);
                }
            }
        }
    }
}
