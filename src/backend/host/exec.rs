//! The step interpreter: executes the channels of a launch exactly as
//! [`crate::plan::step`] specifies.
//!
//! Every channel is a resumable state machine ([`ChannelRun`]): it knows its
//! current item, step and piece, and [`ChannelRun::poll`] advances it only as
//! far as it can without blocking. One thread can therefore multiplex all
//! channels of a launch (round-robin; the only deadlock-free way to run
//! several channels on one thread, and what the backend does when MPI lacks
//! `MPI_THREAD_MULTIPLE`), or each channel can get its own thread; the
//! interpreter is the same code either way.
//!
//! Pieces: a step of `count` elements moves in pieces of at most
//! `slot_bytes / elem_size` elements, piece `i` covering
//! `[i*pe, min(count, (i+1)*pe))` on both ends of every connector.
//!
//! * Flow: a piece is processed once every receive connector holds it and
//!   every send connector has a free slot (both conditions only ever become
//!   true and stay true until we act, so waiting for all of them at once
//!   cannot deadlock where waiting for them one by one would not). The
//!   value is computed straight into the first send slot (or `dst`), then
//!   copied to the other send slots and `dst`.
//! * Exchange: sends run up to a FIFO ahead; piece `i` is received only
//!   after piece `i` was sent, so an in-place exchange (same region for
//!   `src` and `dst`) never overwrites data it has not sent yet, and the
//!   two directions progress independently of each other.

use super::fifo::{self, FifoConn};
use super::net::{self, ChannelNet};
use crate::backend::shared::validate::plan_error;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::plan::{Flow, Region, Step, MAX_STEP_PEERS};
use compute::{compute_piece, Kernel};
use prepare::Item;
pub(crate) use prepare::{prepare, Prepared};
use rail::RailState;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Polls that spin before the driver starts yielding.
const SPIN_POLLS: u32 = 200;
/// Idle time after which the driver sleeps between polls.
const YIELD_PHASE: Duration = Duration::from_millis(1);
/// Sleep per idle poll once waiting is long (oversubscribed nodes must
/// still progress: 8 ranks on 2 cores).
const IDLE_SLEEP: Duration = Duration::from_micros(30);
/// Progressing polls between abort checks.
const BUSY_ABORT_CHECK: u32 = 256;
/// Pieces one channel may move per poll before the driver turns to the next.
const PIECES_PER_POLL: usize = 16;

/// What the interpreter needs from the backend: connectors, limits and
/// failure state. Implemented by the host backend and by tests.
pub(crate) trait Fabric: Sync {
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    fn channels(&self) -> usize;
    fn slot_bytes(&self) -> usize;
    fn fifo_slots(&self) -> usize;
    fn timeout(&self) -> Duration;
    /// The shared memory connector carrying `channel` from this rank to
    /// `peer`; `None` if the peer is on another node.
    fn shm_send(&self, channel: usize, peer: usize) -> Option<FifoConn<'_>>;
    /// The shared memory connector carrying `channel` from `peer` to this rank.
    fn shm_recv(&self, channel: usize, peer: usize) -> Option<FifoConn<'_>>;
    /// The communicator for MPI connectors (to other nodes).
    fn comm(&self) -> Option<&MpiComm>;
    /// The MPI connectors of `channel`.
    fn net(&self, channel: usize) -> &Mutex<ChannelNet>;
    /// This rank's rail (its local index) when collnet's rail steps can
    /// run here (several nodes), else None.
    fn rail(&self) -> Option<u32>;
    /// The communicator of this rank's rail for `channel`.
    fn rail_comm(&self, channel: usize) -> Option<&MpiComm>;
    /// Fail if this backend or a peer aborted or failed.
    fn check_abort(&self) -> Result<()>;
    /// Record a failure and tell the local peers (idempotent).
    fn fail(&self, err: &Error);
}

/// Run every channel of a prepared launch to completion: all on this thread
/// (round-robin) or, with `parallel`, one scoped thread per channel.
pub(crate) fn execute<F: Fabric>(fab: &F, prep: &Prepared, parallel: bool) -> Result<()> {
    let channels = prep.channels();
    if !parallel || channels.len() <= 1 {
        let mut runs: Vec<ChannelRun<'_, '_>> = channels
            .iter()
            .map(|&c| ChannelRun::new(fab, prep, c))
            .collect();
        return drive(fab, &mut runs);
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(channels.len());
        let mut results = Vec::new();
        for &c in channels {
            let spawned = std::thread::Builder::new()
                .name(format!("gpucoll-ch{c}"))
                .spawn_scoped(s, move || {
                    let mut run = [ChannelRun::new(fab, prep, c)];
                    let r = drive(fab, &mut run);
                    if let Err(e) = &r {
                        // Stop the other channels now rather than at their timeout.
                        fab.fail(e);
                    }
                    r
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    let err = Error::System {
                        call: "thread spawn",
                        message: e.to_string(),
                    };
                    fab.fail(&err);
                    results.push(Err(err));
                    break;
                }
            }
        }
        for h in handles {
            results.push(
                h.join()
                    .unwrap_or_else(|_| Err(Error::Backend("a channel thread panicked".into()))),
            );
        }
        results
    });
    first_error(results)
}

/// The most informative error: the root cause rather than the
/// `CommunicatorFailed` that other channels see after it.
fn first_error(results: Vec<Result<()>>) -> Result<()> {
    let mut errors: Vec<Error> = results.into_iter().filter_map(|r| r.err()).collect();
    if errors.is_empty() {
        return Ok(());
    }
    let pos = errors
        .iter()
        .position(|e| !matches!(e, Error::CommunicatorFailed(_)))
        .unwrap_or(0);
    Err(errors.swap_remove(pos))
}

/// Poll `runs` until all finish, backing off while none progresses, and
/// enforcing the timeout and abort flags.
fn drive<'f, F: Fabric>(fab: &'f F, runs: &mut [ChannelRun<'_, 'f>]) -> Result<()> {
    let mut idle_polls: u32 = 0;
    let mut idle_since: Option<Instant> = None;
    let mut busy_polls: u32 = 0;
    loop {
        let mut moved = false;
        let mut pending = false;
        for r in runs.iter_mut() {
            if !r.finished {
                moved |= r.poll(fab)?;
                pending |= !r.finished;
            }
        }
        if !pending {
            return Ok(());
        }
        if moved {
            idle_polls = 0;
            idle_since = None;
            busy_polls = busy_polls.wrapping_add(1);
            if busy_polls % BUSY_ABORT_CHECK == 0 {
                fab.check_abort()?;
            }
            continue;
        }
        fab.check_abort()?;
        for r in runs.iter_mut() {
            r.net.progress()?;
        }
        idle_polls = idle_polls.saturating_add(1);
        if idle_polls < SPIN_POLLS {
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert(now);
        for r in runs.iter() {
            r.check_timeout(now, fab.timeout())?;
        }
        if now.duration_since(since) < YIELD_PHASE {
            std::thread::yield_now();
        } else {
            std::thread::sleep(IDLE_SLEEP);
        }
    }
}

/// What a blocked channel waits for (for timeout messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    Nothing,
    Rail,
    Recv(usize),
    Send(usize),
    Drain(usize),
}

/// One end of a connector for the current step.
#[derive(Debug, Clone, Copy)]
enum Conn<'f> {
    Shm(FifoConn<'f>),
    Net,
}

#[derive(Debug)]
struct FlowState<'f> {
    /// (peer, connector); the first `nrecv` entries are used.
    recv: [(usize, Conn<'f>); MAX_STEP_PEERS],
    nrecv: usize,
    /// (peer, connector); the first `nsend` entries are used.
    send: [(usize, Conn<'f>); MAX_STEP_PEERS],
    nsend: usize,
    src: Option<*const u8>,
    dst: Option<*mut u8>,
    kern: Kernel,
    piece: u64,
    /// Net receives posted per receive peer.
    posted: [u64; MAX_STEP_PEERS],
}

#[derive(Debug)]
struct ExchState<'f> {
    to: usize,
    to_conn: Conn<'f>,
    from: usize,
    from_conn: Conn<'f>,
    src: *const u8,
    dst: *mut u8,
    sent: u64,
    rcvd: u64,
    posted: u64,
}

// One per running channel: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum StepKind<'f> {
    Flow(FlowState<'f>),
    Exch(ExchState<'f>),
    Rail(RailState<'f>),
}

#[derive(Debug)]
struct StepState<'f> {
    count: u64,
    /// Elements per piece.
    pe: u64,
    npieces: u64,
    kind: StepKind<'f>,
}

impl StepState<'_> {
    /// (element offset, elements) of piece `i`.
    fn piece(&self, i: u64) -> (u64, u64) {
        let off = i * self.pe;
        (off, self.pe.min(self.count - off))
    }
}

fn no_comm() -> Error {
    Error::Backend("no MPI connection for a peer on another node".into())
}

/// Per-call facts a piece operation needs.
struct PieceCtx<'a, 'f> {
    ch: usize,
    seq: u64,
    esize: usize,
    slots: usize,
    slot_bytes: usize,
    comm: Option<&'f MpiComm>,
    net: &'a mut ChannelNet,
}

impl<'f> PieceCtx<'_, 'f> {
    /// The MPI communicator (a copy of the reference: no borrow of `self`).
    fn comm(&self) -> Result<&'f MpiComm> {
        self.comm.ok_or_else(no_comm)
    }

    fn mismatch(&self, peer: usize, detail: String) -> Error {
        Error::ProtocolMismatch {
            peer,
            detail: format!("{detail} on channel {}", self.ch),
        }
    }

    /// The next piece from `peer`, checked against (seq, bytes).
    fn recv_peek(
        &mut self,
        peer: usize,
        conn: Conn<'_>,
        bytes: usize,
    ) -> Result<Option<*const u8>> {
        match conn {
            Conn::Shm(f) => match f.recv_peek().map_err(|d| self.mismatch(peer, d))? {
                None => Ok(None),
                Some((meta, p)) => match fifo::meta_mismatch(self.seq, bytes, meta) {
                    None => Ok(Some(p)),
                    Some(d) => Err(self.mismatch(peer, d)),
                },
            },
            Conn::Net => {
                let (ch, slots, sb) = (self.ch, self.slots, self.slot_bytes);
                match self.net.recv(ch, peer, slots, sb).try_acquire()? {
                    None => Ok(None),
                    Some(piece) => match net::check_piece(&piece, self.seq, bytes) {
                        None => Ok(Some(piece.data)),
                        Some(d) => Err(self.mismatch(peer, d)),
                    },
                }
            }
        }
    }

    fn recv_release(&mut self, peer: usize, conn: Conn<'_>) {
        match conn {
            Conn::Shm(f) => f.recv_release(),
            Conn::Net => self
                .net
                .recv(self.ch, peer, self.slots, self.slot_bytes)
                .release(),
        }
    }

    /// Post net receives for `peer` until `posted` reaches `npieces` or the
    /// staging buffers run out.
    fn post_ahead(&mut self, peer: usize, posted: &mut u64, npieces: u64) -> Result<()> {
        let (ch, slots, sb) = (self.ch, self.slots, self.slot_bytes);
        let comm = self.comm()?;
        let r = self.net.recv(ch, peer, slots, sb);
        while *posted < npieces && r.can_post() {
            r.post(comm)?;
            *posted += 1;
        }
        Ok(())
    }

    fn send_slot(&mut self, peer: usize, conn: Conn<'_>) -> Result<Option<*mut u8>> {
        match conn {
            Conn::Shm(f) => Ok(f.send_slot()),
            Conn::Net => self
                .net
                .send(self.ch, peer, self.slots, self.slot_bytes)
                .try_acquire(),
        }
    }

    fn send_commit(&mut self, peer: usize, conn: Conn<'_>, bytes: usize) -> Result<()> {
        let meta = fifo::make_meta(self.seq, bytes);
        match conn {
            Conn::Shm(f) => {
                f.send_commit(meta);
                Ok(())
            }
            Conn::Net => {
                let comm = self.comm()?;
                self.net
                    .send(self.ch, peer, self.slots, self.slot_bytes)
                    .commit(comm, meta, bytes)
            }
        }
    }
}

/// One channel of a launch as a resumable state machine.
pub(crate) struct ChannelRun<'p, 'f> {
    ch: usize,
    prep: &'p Prepared,
    /// (item index, steps) in execution order.
    work: Vec<(usize, &'p [Step])>,
    wi: usize,
    si: usize,
    st: Option<StepState<'f>>,
    net: MutexGuard<'f, ChannelNet>,
    comm: Option<&'f MpiComm>,
    slots: usize,
    slot_bytes: usize,
    last_progress: Instant,
    waiting: Waiting,
    finished: bool,
}

impl<'p, 'f> ChannelRun<'p, 'f> {
    fn new<F: Fabric>(fab: &'f F, prep: &'p Prepared, ch: usize) -> ChannelRun<'p, 'f> {
        let work = prep
            .items
            .iter()
            .enumerate()
            .flat_map(|(k, it)| {
                it.plan
                    .channels
                    .iter()
                    .filter(move |cw| cw.channel == ch)
                    .map(move |cw| (k, cw.steps.as_slice()))
            })
            .collect();
        // A poisoned lock only means another launch's thread panicked; the
        // connector state itself is consistent between pieces.
        let net = fab.net(ch).lock().unwrap_or_else(|p| p.into_inner());
        ChannelRun {
            ch,
            prep,
            work,
            wi: 0,
            si: 0,
            st: None,
            net,
            comm: fab.comm(),
            slots: fab.fifo_slots(),
            slot_bytes: fab.slot_bytes(),
            last_progress: Instant::now(),
            waiting: Waiting::Nothing,
            finished: false,
        }
    }

    fn item(&self) -> &'p Item {
        let k = self
            .work
            .get(self.wi)
            .map_or(self.prep.items.len() - 1, |w| w.0);
        &self.prep.items[k]
    }

    fn check_timeout(&self, now: Instant, timeout: Duration) -> Result<()> {
        if self.finished || now.duration_since(self.last_progress) < timeout {
            return Ok(());
        }
        let seq = self.item().seq;
        let ch = self.ch;
        let waiting_for = match self.waiting {
            Waiting::Recv(p) => format!("recv from rank {p} on channel {ch} (collective #{seq})"),
            Waiting::Send(p) => format!(
                "send to rank {p} on channel {ch} (collective #{seq}): the peer's FIFO stayed full"
            ),
            Waiting::Drain(p) => {
                format!("completion of MPI sends to rank {p} on channel {ch} (collective #{seq})")
            }
            Waiting::Rail => format!(
                "MPI's all_reduce with the other nodes (collnet rail) on channel {ch} (collective #{seq})"
            ),
            Waiting::Nothing => format!("channel {ch} (collective #{seq})"),
        };
        Err(Error::Timeout {
            seq,
            seconds: timeout.as_secs_f64(),
            waiting_for,
        })
    }

    /// Advance as far as possible without blocking; whether anything moved.
    fn poll<F: Fabric>(&mut self, fab: &'f F) -> Result<bool> {
        let mut moved = false;
        for _ in 0..PIECES_PER_POLL {
            if self.finished || !self.advance(fab)? {
                break;
            }
            moved = true;
        }
        if moved {
            self.last_progress = Instant::now();
        }
        Ok(moved)
    }

    /// One unit of progress (a piece, a step start, the end); false if blocked.
    fn advance<F: Fabric>(&mut self, fab: &'f F) -> Result<bool> {
        if self.st.is_none() {
            loop {
                let Some(&(k, steps)) = self.work.get(self.wi) else {
                    // All steps done: the launch ends once our MPI sends
                    // completed (nothing may stay in flight between launches).
                    if let Some(p) = self.net.undrained()? {
                        self.waiting = Waiting::Drain(p);
                        return Ok(false);
                    }
                    self.finished = true;
                    return Ok(true);
                };
                let Some(step) = steps.get(self.si) else {
                    self.wi += 1;
                    self.si = 0;
                    continue;
                };
                let st = self.start_step(fab, k, step)?;
                if st.npieces == 0 {
                    self.si += 1;
                    continue;
                }
                self.st = Some(st);
                break;
            }
        }
        let item = &self.prep.items[self.work[self.wi].0];
        let Some(st) = self.st.as_mut() else {
            return Ok(false);
        };
        let mut cx = PieceCtx {
            ch: self.ch,
            seq: item.stamp,
            esize: item.esize,
            slots: self.slots,
            slot_bytes: self.slot_bytes,
            comm: self.comm,
            net: &mut self.net,
        };
        let (moved, done) = match &mut st.kind {
            StepKind::Flow(_) => flow_piece(st, &mut cx, &mut self.waiting)?,
            StepKind::Exch(_) => exch_poll(st, &mut cx, &mut self.waiting)?,
            StepKind::Rail(r) => {
                let (moved, done) = r.poll()?;
                if !moved {
                    self.waiting = Waiting::Rail;
                }
                (moved, done)
            }
        };
        if done {
            self.st = None;
            self.si += 1;
        }
        Ok(moved || done)
    }

    fn start_step<F: Fabric>(&self, fab: &'f F, k: usize, step: &Step) -> Result<StepState<'f>> {
        let item = &self.prep.items[k];
        let count = step.count();
        let pe = (self.slot_bytes / item.esize).max(1) as u64;
        let npieces = count.div_ceil(pe);
        let ch = self.ch;
        let conn_send = |p: usize| fab.shm_send(ch, p).map_or(Conn::Net, Conn::Shm);
        let conn_recv = |p: usize| fab.shm_recv(ch, p).map_or(Conn::Net, Conn::Shm);
        // Validated in `prepare`: regions hold `count` elements.
        let ptr = |r: Region| {
            item.region_ptr(r, count)
                .ok_or_else(|| plan_error(item.seq, ch, self.si, "region out of bounds"))
        };
        let kind = match step {
            Step::Flow(f) => {
                let Flow {
                    recv,
                    send,
                    src,
                    dst,
                    pre_op,
                    post_op,
                    acc,
                    ..
                } = *f;
                let mut fs = FlowState {
                    recv: [(0, Conn::Net); MAX_STEP_PEERS],
                    nrecv: recv.len(),
                    send: [(0, Conn::Net); MAX_STEP_PEERS],
                    nsend: send.len(),
                    src: src.map(&ptr).transpose()?.map(|p| p as *const u8),
                    dst: dst.map(&ptr).transpose()?,
                    kern: Kernel {
                        dtype: item.dtype,
                        red: item.plan.reduction,
                        pre: if pre_op {
                            item.plan.reduction.pre_scale
                        } else {
                            None
                        },
                        post: if post_op {
                            item.plan.reduction.post_div
                        } else {
                            None
                        },
                        acc,
                    },
                    piece: 0,
                    posted: [0; MAX_STEP_PEERS],
                };
                for (i, p) in recv.iter().enumerate() {
                    fs.recv[i] = (p, conn_recv(p));
                }
                for (i, p) in send.iter().enumerate() {
                    fs.send[i] = (p, conn_send(p));
                }
                if (fs.recv[..fs.nrecv].iter().chain(&fs.send[..fs.nsend]))
                    .any(|(_, c)| matches!(c, Conn::Net))
                    && self.comm.is_none()
                {
                    return Err(no_comm());
                }
                StepKind::Flow(fs)
            }
            Step::Exchange {
                to, src, from, dst, ..
            } => {
                let es = ExchState {
                    to: *to,
                    to_conn: conn_send(*to),
                    from: *from,
                    from_conn: conn_recv(*from),
                    src: ptr(*src)? as *const u8,
                    dst: ptr(*dst)?,
                    sent: 0,
                    rcvd: 0,
                    posted: 0,
                };
                if (matches!(es.to_conn, Conn::Net) || matches!(es.from_conn, Conn::Net))
                    && self.comm.is_none()
                {
                    return Err(no_comm());
                }
                StepKind::Exch(es)
            }
            Step::Rail { region, .. } => {
                let comm = fab.rail_comm(ch).ok_or_else(|| {
                    plan_error(item.seq, ch, self.si, "a rail step without rails")
                })?;
                let bytes = count as usize * item.esize;
                let rail = RailState::new(
                    comm,
                    ptr(*region)?,
                    bytes,
                    item.dtype,
                    item.plan.reduction.combine,
                );
                // One unit of work: the whole region in one MPI call.
                return Ok(StepState {
                    count,
                    pe: count.max(1),
                    npieces: u64::from(count > 0),
                    kind: StepKind::Rail(rail),
                });
            }
        };
        Ok(StepState {
            count,
            pe,
            npieces,
            kind,
        })
    }
}

/// Process the next piece of a Flow if every connector is ready.
/// Returns (moved, step done).
fn flow_piece(
    st: &mut StepState<'_>,
    cx: &mut PieceCtx<'_, '_>,
    waiting: &mut Waiting,
) -> Result<(bool, bool)> {
    let npieces = st.npieces;
    let (off, n) = st.piece(match &st.kind {
        StepKind::Flow(fs) => fs.piece,
        StepKind::Exch(_) | StepKind::Rail(_) => unreachable!("flow_piece on another step"),
    });
    let StepKind::Flow(fs) = &mut st.kind else {
        unreachable!("checked above");
    };
    let bytes = n as usize * cx.esize;
    let boff = off as usize * cx.esize;

    // Keep MPI receives posted ahead for the rest of this step.
    for (&(peer, conn), posted) in fs.recv[..fs.nrecv].iter().zip(&mut fs.posted) {
        if matches!(conn, Conn::Net) {
            cx.post_ahead(peer, posted, npieces)?;
        }
    }
    let mut rptr = [std::ptr::null::<u8>(); MAX_STEP_PEERS];
    for (&(peer, conn), slot) in fs.recv[..fs.nrecv].iter().zip(&mut rptr) {
        match cx.recv_peek(peer, conn, bytes)? {
            Some(p) => *slot = p,
            None => {
                *waiting = Waiting::Recv(peer);
                return Ok((false, false));
            }
        }
    }
    let mut sptr = [std::ptr::null_mut::<u8>(); MAX_STEP_PEERS];
    for (&(peer, conn), slot) in fs.send[..fs.nsend].iter().zip(&mut sptr) {
        match cx.send_slot(peer, conn)? {
            Some(p) => *slot = p,
            None => {
                *waiting = Waiting::Send(peer);
                return Ok((false, false));
            }
        }
    }
    // SAFETY: src/dst were bounds-checked for the whole step at its start and
    // piece `off..off+n` lies inside it; receive slots hold `bytes` bytes
    // (metadata checked) and are ours until released; send slots hold
    // `slot_bytes >= bytes` and are ours until committed. Slots never overlap
    // user memory or each other.
    unsafe {
        compute_piece(
            &fs.kern,
            bytes,
            fs.src.map(|p| p.add(boff)),
            &rptr[..fs.nrecv],
            &sptr[..fs.nsend],
            fs.dst.map(|p| p.add(boff)),
        );
    }
    for &(peer, conn) in &fs.send[..fs.nsend] {
        cx.send_commit(peer, conn, bytes)?;
    }
    for &(peer, conn) in &fs.recv[..fs.nrecv] {
        cx.recv_release(peer, conn);
    }
    fs.piece += 1;
    *waiting = Waiting::Nothing;
    Ok((true, fs.piece == npieces))
}

/// Advance both directions of an Exchange. Returns (moved, step done).
fn exch_poll(
    st: &mut StepState<'_>,
    cx: &mut PieceCtx<'_, '_>,
    waiting: &mut Waiting,
) -> Result<(bool, bool)> {
    let npieces = st.npieces;
    let (count, pe) = (st.count, st.pe);
    let esize = cx.esize;
    let piece = |i: u64| {
        let off = i * pe;
        (off as usize * esize, (pe.min(count - off)) as usize * esize)
    };
    let StepKind::Exch(es) = &mut st.kind else {
        unreachable!("exch_poll on another step");
    };
    let mut moved = false;
    // Sends run ahead as far as the peer's FIFO allows.
    while es.sent < npieces {
        let (boff, bytes) = piece(es.sent);
        let Some(slot) = cx.send_slot(es.to, es.to_conn)? else {
            *waiting = Waiting::Send(es.to);
            break;
        };
        // SAFETY: the source piece lies inside the bounds-checked region;
        // the slot holds at least `bytes` and is ours until committed.
        unsafe { std::ptr::copy_nonoverlapping(es.src.add(boff), slot, bytes) };
        cx.send_commit(es.to, es.to_conn, bytes)?;
        es.sent += 1;
        moved = true;
    }
    if matches!(es.from_conn, Conn::Net) {
        cx.post_ahead(es.from, &mut es.posted, npieces)?;
    }
    // Piece i is received only after piece i was sent (in-place safety).
    while es.rcvd < es.sent {
        let (boff, bytes) = piece(es.rcvd);
        let Some(p) = cx.recv_peek(es.from, es.from_conn, bytes)? else {
            *waiting = Waiting::Recv(es.from);
            break;
        };
        // SAFETY: the destination piece lies inside the bounds-checked
        // region; the received slot holds `bytes` and is ours until
        // released; slots never overlap user memory.
        unsafe { std::ptr::copy_nonoverlapping(p, es.dst.add(boff), bytes) };
        cx.recv_release(es.from, es.from_conn);
        es.rcvd += 1;
        moved = true;
    }
    let done = es.sent == npieces && es.rcvd == npieces;
    if done {
        *waiting = Waiting::Nothing;
    }
    Ok((moved, done))
}

mod compute;
mod prepare;
mod rail;
#[cfg(test)]
mod tests;
