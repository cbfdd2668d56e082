//! One communicator's point-to-point state: its two MPI communicators,
//! the envelopes taken out of MPI but not matched yet, the receives
//! waiting for a match (in the order they were posted), the messages in
//! flight, and the progress that moves them all.
//!
//! Everything happens under one lock, in [`P2pShared::pump`]: take every
//! envelope that arrived out of MPI (in MPI's order: a source's envelopes
//! in the order it sent them), give each posted receive, in post order,
//! the first queued envelope it matches, then advance every message.
//! Whoever waits pumps: the waiter of any request of this communicator,
//! and, now and then, the waiters of other communicators (a message
//! staged through host memory moves only when its sender pumps, as MPI's
//! own rendezvous needs the sender inside MPI).

use super::ctx::{Arrived, Ctx, Wire};
use super::envelope::Envelope;
use super::recv::{RecvOp, Selector, Sink};
use super::send::SendOp;
use super::Status;
use crate::backend::DeviceMoves;
use crate::buffer::RawBuffer;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

pub(crate) enum Op {
    Send(SendOp),
    Recv(RecvOp),
}

/// What the lock protects.
#[derive(Default)]
pub(crate) struct Progress {
    /// Per destination, the sequence number of the next message.
    next_seq: Vec<u64>,
    /// Envelopes taken out of MPI and not matched yet, in MPI's order.
    queue: VecDeque<Arrived>,
    /// Receives waiting for a match, in post order.
    posted: VecDeque<u64>,
    ops: BTreeMap<u64, Op>,
    /// Ops nobody waits for (a dropped message's discarding receive).
    detached: Vec<u64>,
    next_id: u64,
    finished: HashMap<u64, Result<Status>>,
}

/// One communicator's point-to-point state (see the module header).
pub(crate) struct P2pShared {
    /// Dropped first: messages still in flight cancel their MPI requests
    /// while the communicators exist.
    progress: Mutex<Progress>,
    pub ctx: Ctx,
    /// The first failure of the machinery itself (an MPI error, an
    /// envelope that does not parse): every later wait returns it.
    broken: OnceLock<Error>,
}

/// Every live state, so that a waiter can move other communicators'
/// messages too.
static LIVE: Mutex<Vec<Weak<P2pShared>>> = Mutex::new(Vec::new());

/// How many polls of its own a waiter makes between pumps of the other
/// communicators.
const OTHERS_EVERY: u32 = 64;

impl P2pShared {
    /// Over `env` and `data`, two communicators of the same ranks that
    /// nothing else uses; `eager`: `Config::p2p_eager`.
    pub(crate) fn new(
        env: MpiComm,
        data: MpiComm,
        moves: Option<Arc<dyn DeviceMoves>>,
        eager: u64,
    ) -> Result<Arc<P2pShared>> {
        let (rank, size) = (env.rank(), env.size());
        let wire = Wire::new(env, data)?;
        let shared = Arc::new(P2pShared {
            progress: Mutex::new(Progress {
                next_seq: vec![0; size],
                ..Progress::default()
            }),
            ctx: Ctx {
                rank,
                wire,
                eager,
                moves,
            },
            broken: OnceLock::new(),
        });
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
        Ok(shared)
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_broken(&self) -> Result<()> {
        match self.broken.get() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Start a send of `buf` to `dest` with `tag` (checked by the caller).
    pub(crate) fn start_send(&self, buf: RawBuffer, dest: usize, tag: i32) -> Result<u64> {
        self.check_broken()?;
        let mut p = self.lock();
        let seq = p.next_seq[dest];
        let op = SendOp::start(&self.ctx, buf, dest, tag, seq)?;
        p.next_seq[dest] += 1;
        let id = p.add(Op::Send(op));
        // Move it (and everything else) along at once: an inline message
        // may be complete already.
        self.pump_locked(&mut p)?;
        Ok(id)
    }

    /// Post a receive into `sink` of the first message `sel` matches.
    pub(crate) fn post_recv(&self, sel: Selector, sink: Sink) -> Result<u64> {
        self.check_broken()?;
        let mut p = self.lock();
        let id = p.add(Op::Recv(RecvOp::posted(sel, sink)));
        p.posted.push_back(id);
        self.pump_locked(&mut p)?;
        Ok(id)
    }

    /// Receive the already matched `arrived` into `sink`.
    pub(crate) fn start_matched(&self, arrived: Arrived, sink: Sink) -> Result<u64> {
        self.check_broken()?;
        let mut p = self.lock();
        let mut op = RecvOp::posted(Selector::of(&arrived), sink);
        let id = p.next_id;
        match op.begin(&self.ctx, arrived) {
            Ok(()) => {
                p.add(Op::Recv(op));
            }
            Err(e) => {
                p.next_id += 1;
                p.finished.insert(id, Err(e));
            }
        }
        self.pump_locked(&mut p)?;
        Ok(id)
    }

    /// Receive `arrived` into nothing, for nobody: a matched message that
    /// was dropped (its sender still completes).
    pub(crate) fn discard(&self, arrived: Arrived) {
        if let Ok(id) = self.start_matched(arrived, Sink::discard()) {
            let mut p = self.lock();
            if p.finished.remove(&id).is_none() {
                p.detached.push(id);
            }
        }
    }

    /// The first queued envelope `sel` matches, after a pump: removed
    /// from the queue (a matched probe) or left there.
    pub(crate) fn probe(&self, sel: Selector, take: bool) -> Result<Option<Arrived>> {
        self.check_broken()?;
        let mut p = self.lock();
        self.pump_locked(&mut p)?;
        let pos = p.queue.iter().position(|a| sel.matches(a));
        Ok(match (pos, take) {
            (Some(i), true) => p.queue.remove(i),
            (Some(i), false) => p.queue.get(i).cloned(),
            (None, _) => None,
        })
    }

    /// One pump, then the result of op `id` if it finished (taken).
    pub(crate) fn poll(&self, id: u64) -> Result<Option<Result<Status>>> {
        self.check_broken()?;
        let mut p = self.lock();
        if let Some(r) = p.finished.remove(&id) {
            return Ok(Some(r));
        }
        self.pump_locked(&mut p)?;
        Ok(p.finished.remove(&id))
    }

    /// Whether op `id` is a receive still waiting for its match.
    pub(crate) fn cancel_unmatched(&self, id: u64) -> bool {
        let mut p = self.lock();
        let Some(i) = p.posted.iter().position(|&x| x == id) else {
            return false;
        };
        p.posted.remove(i);
        p.ops.remove(&id);
        true
    }

    /// Pump the other live communicators (those not busy right now).
    pub(crate) fn pump_others(&self) {
        let others: Vec<Arc<P2pShared>> = {
            let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
            live.iter()
                .filter_map(Weak::upgrade)
                .filter(|s| !std::ptr::eq(s.as_ref(), self))
                .collect()
        };
        for s in others {
            if s.broken.get().is_some() {
                continue;
            }
            if let Ok(mut p) = s.progress.try_lock() {
                if p.ops.is_empty() {
                    continue;
                }
                let _ = s.pump_locked(&mut p);
            }
        }
    }

    /// See the module header. A failure of the machinery itself breaks
    /// the state for good.
    fn pump_locked(&self, p: &mut Progress) -> Result<()> {
        let r = p.pump(&self.ctx);
        if let Err(e) = &r {
            let _ = self.broken.set(e.clone());
            tracing::warn!(rank = self.ctx.rank, "point-to-point messages failed: {e}");
        }
        r
    }

    /// How many polls between pumps of the other communicators.
    pub(crate) fn others_every() -> u32 {
        OTHERS_EVERY
    }
}

impl Drop for P2pShared {
    /// Messages still in flight (requests nobody waited for, a failed
    /// communicator) cancel their requests; their communicators are then
    /// abandoned, not freed, as the backends do after a failure: a peer's
    /// message still on its way would otherwise be matched into the next
    /// communicator that reuses the context id.
    fn drop(&mut self) {
        let p = self.progress.get_mut().unwrap_or_else(|e| e.into_inner());
        let unfinished = !p.ops.is_empty() || self.broken.get().is_some();
        p.ops.clear();
        if unfinished {
            tracing::debug!(
                rank = self.ctx.rank,
                "point-to-point communicators abandoned"
            );
            self.ctx.wire.env.disown();
            self.ctx.wire.data.disown();
        }
    }
}

impl Progress {
    fn add(&mut self, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.ops.insert(id, op);
        id
    }

    fn finish(&mut self, id: u64, r: Result<Status>) {
        self.ops.remove(&id);
        if let Some(i) = self.detached.iter().position(|&d| d == id) {
            self.detached.swap_remove(i);
            if let Err(e) = r {
                tracing::debug!("a discarded message failed: {e}");
            }
            return;
        }
        self.finished.insert(id, r);
    }

    fn pump(&mut self, ctx: &Ctx) -> Result<()> {
        while let Some((r, bytes)) = ctx.wire.env.take_next()? {
            let env = Envelope::parse(&bytes).map_err(|e| Error::ProtocolMismatch {
                peer: r.source,
                detail: e.to_string(),
            })?;
            self.queue.push_back(Arrived {
                source: r.source,
                tag: r.tag,
                env,
            });
        }
        let mut i = 0;
        while i < self.posted.len() && !self.queue.is_empty() {
            let id = self.posted[i];
            let Some(Op::Recv(op)) = self.ops.get_mut(&id) else {
                self.posted.remove(i);
                continue;
            };
            let Some(pos) = self.queue.iter().position(|a| op.sel.matches(a)) else {
                i += 1;
                continue;
            };
            let Some(arrived) = self.queue.remove(pos) else {
                i += 1;
                continue;
            };
            self.posted.remove(i);
            if let Err(e) = op.begin(ctx, arrived) {
                self.finish(id, Err(e));
            }
        }
        let ids: Vec<u64> = self.ops.keys().copied().collect();
        for id in ids {
            let step = match self.ops.get_mut(&id) {
                Some(Op::Send(s)) => s.advance(ctx).map(|d| d.then(Status::sent)),
                Some(Op::Recv(r)) => r.advance(ctx),
                None => continue,
            };
            match step {
                Ok(None) => {}
                Ok(Some(st)) => self.finish(id, Ok(st)),
                Err(e) => self.finish(id, Err(e)),
            }
        }
        Ok(())
    }
}
