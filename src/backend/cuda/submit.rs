//! Submission of one launch, in named phases: `open` (the stream, checked,
//! and every call's plan lowered), `prepare` (the pending work, its events
//! and the order across streams), `upload` (the step tables), `launch`
//! (every kernel, copy and peer call) and `record` (the end event, the
//! stream order, a captured graph's resources), as NCCL's launch has
//! prepare, launch and finish. Each phase is one profile lap
//! (`GPUCOLL_PROFILE_HOST=1`). The result is the [`CudaPending`] that
//! completes it.

use super::abi::{GcArgs, FLAG_NOTIFY};
use super::cache::Resources;

use super::driver::{self, CUstream, Capture};
use super::launch;
use super::lower::{
    group_rail_order, local_copies, runs_as_oneshot, CeCall, Item, Lowered, Mem, PeerCall,
};
use super::memory::{bind, DevMem};
use super::order::{stream_mode, Order};
use super::pending::CudaPending;
use super::profile::Phase;
use super::state::CudaShared;
use crate::backend::Launch;
use crate::buffer::MemoryKind;
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::tune::Algorithm;
use std::sync::Arc;

/// One submission between its phases.
struct Submission {
    /// The stream its work goes to.
    stream: CUstream,
    /// That stream is the caller's.
    user: bool,
    /// That stream is being captured into a CUDA graph.
    captured: bool,
    /// Allocations while a stream is captured must not invalidate it
    /// (held until the submission ends).
    _relaxed: Option<driver::RelaxedCapture>,
    lowered: Lowered,
    /// What the work reads and writes besides the callers' buffers.
    res: Resources,
    /// A group's launches, their tables uploaded together (`upload`).
    group: Option<Vec<(Datatype, GcArgs, u32)>>,
}

impl CudaShared {
    /// The order of submissions across streams.
    fn order(&self) -> std::sync::MutexGuard<'_, Order> {
        self.order.lock().unwrap_or_else(|p| p.into_inner())
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
    ///
    /// # Safety
    /// The buffers of `launch` stay valid until the work completed
    /// (`Backend::submit`).
    pub(super) unsafe fn submit(
        self: &Arc<Self>,
        launch: Launch,
        blocking: bool,
    ) -> Result<CudaPending> {
        if let Some(e) = self.state_error() {
            return Err(e);
        }
        let mut clock = self.profile.clock();
        let mut sub = self.open(&launch)?;
        self.profile.lap(&mut clock, Phase::Lower);
        if blocking && !sub.user {
            if let Some(p) = self.try_resident(&mut sub.lowered, &mut sub.res, launch.first_seq)? {
                self.profile.lap(&mut clock, Phase::Launch);
                return Ok(p);
            }
        }
        // Anything else runs after the resident block left.
        self.resident_quit();
        let mut pending = self.prepare(&sub, blocking, launch.first_seq)?;
        self.profile.lap(&mut clock, Phase::Prepare);
        self.upload(&mut sub, launch.items.len() > 1)?;
        pending.res = Some(std::mem::take(&mut sub.res));
        self.profile.lap(&mut clock, Phase::Upload);
        // SAFETY: the buffers stay valid until the work completed (our
        // caller's contract).
        unsafe { self.launch(&mut sub, blocking, &mut pending)? };
        self.profile.lap(&mut clock, Phase::Launch);
        self.record(&sub, &mut pending, launch.first_seq)?;
        self.profile.lap(&mut clock, Phase::Record);
        Ok(pending)
    }

    /// Open a submission: the stream its work goes to (a caller's stream
    /// takes no host buffers; while it is captured, allocations are
    /// relaxed) and every call lowered.
    fn open(&self, launch: &Launch) -> Result<Submission> {
        bind(self.ctx.ordinal)?;
        let user = launch.stream.is_some();
        let stream: CUstream = match launch.stream {
            Some(s) => s as usize as CUstream,
            None => self.stream.raw(),
        };
        let captured = user && stream_mode(&self.ctx, stream)? == Capture::Active;
        let relaxed = if captured {
            Some(driver::RelaxedCapture::enter()?)
        } else {
            None
        };
        if user {
            refuse_host_buffers(launch)?;
        }
        let mut res = Resources::default();
        let lowered = self.lower(launch, &mut res)?;
        if captured && !lowered.rail_jobs.is_empty() {
            // The proxy learns each rail step's datatype and op from a
            // queue filled per submission, which graph replays would skip.
            return Err(Error::InvalidUsage(
                "a collnet all_reduce (GPUCOLL_ALGO=collnet) cannot be captured into a CUDA \
                 graph: its inter-node step is MPI's all-reduce, driven from the host"
                    .into(),
            ));
        }
        Ok(Submission {
            stream,
            user,
            captured,
            _relaxed: relaxed,
            lowered,
            res,
            group: None,
        })
    }

    /// Prepare: the pending work with its completion event and, where the
    /// work may wait behind other work, its start marker; and the order
    /// after earlier work on other streams.
    fn prepare(
        self: &Arc<Self>,
        sub: &Submission,
        blocking: bool,
        seq: u64,
    ) -> Result<CudaPending> {
        let (stream, user, captured) = (sub.stream, sub.user, sub.captured);
        let event = if blocking || captured {
            None
        } else {
            Some(self.events.take()?)
        };
        let mut pending = CudaPending::new(self.clone(), event, seq, stream as usize);
        if user && !captured {
            // The timeout clock starts when the caller's stream reaches our
            // work, not when it was queued behind the caller's own kernels.
            pending.started = Some(self.events.take()?);
        }
        let waits = !captured && self.order().before(stream, self.stream.raw())?;
        if waits && pending.started.is_none() {
            // Our own stream now waits for work on a caller's stream, which
            // may still be queued behind the caller's kernels: start the
            // timeout clock only when that wait is over.
            pending.started = Some(self.events.take()?);
        }
        if let Some(s) = &pending.started {
            driver::event_record(s.raw(), stream)?;
        }
        Ok(pending)
    }

    /// Upload: the step tables ahead of the kernels, a `group`'s step
    /// launches together.
    fn upload(&self, sub: &mut Submission, group: bool) -> Result<()> {
        let (stream, captured) = (sub.stream, sub.captured);
        let l = &mut sub.lowered;
        if group && l.step_items() > 1 {
            let parts =
                self.upload_group(&l.steps, &l.chans, &l.items, &mut sub.res, stream, captured)?;
            sub.group = Some(parts);
        } else if !l.steps.is_empty() {
            self.upload_steps(l, &mut sub.res, stream, captured)?;
        }
        Ok(())
    }

    /// Launch: the rail steps' jobs to NET's proxy, then every kernel, copy
    /// and peer call. A blocking call on our own stream waits for its last
    /// kernel by reading host memory: that kernel stores the pending
    /// work's `done_tag` when all its blocks finished (`notify`; other
    /// launches skip the store and its fences).
    ///
    /// # Safety
    /// The buffers of every call stay valid until the work completed.
    unsafe fn launch(
        &self,
        sub: &mut Submission,
        blocking: bool,
        pending: &mut CudaPending,
    ) -> Result<()> {
        let lowered = &mut sub.lowered;
        if !lowered.rail_jobs.is_empty() {
            // Before the kernels: the proxy needs each piece's job when the
            // piece appears.
            if sub.group.is_some() {
                group_rail_order(&mut lowered.rail_jobs, &lowered.items);
            }
            self.transports.push_rail_jobs(&lowered.rail_jobs)?;
        }
        let notify = blocking && !sub.user;
        let items = std::mem::take(&mut lowered.items);
        if let Some(parts) = sub.group.take() {
            // SAFETY: as for this function.
            pending.done_tag = unsafe { self.launch_group(parts, notify, sub.stream)? };
            return Ok(());
        }
        let last = items.len().saturating_sub(1);
        // Set when a peer kernel ran: the fallback after it is skipped.
        let mut skip = false;
        for (k, item) in items.into_iter().enumerate() {
            if std::mem::take(&mut skip) {
                continue;
            }
            let tell = [notify && k == last, notify && k + 1 == last];
            // SAFETY: as for this function.
            let (tag, ran) = unsafe { self.launch_item(sub, item, tell, pending)? };
            skip = ran;
            if tag.is_some() {
                pending.done_tag = tag;
            }
        }
        Ok(())
    }

    /// A group's step launches, the last one storing the done tag
    /// (returned) if `notify`.
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    unsafe fn launch_group(
        &self,
        parts: Vec<(Datatype, GcArgs, u32)>,
        notify: bool,
        stream: CUstream,
    ) -> Result<Option<u64>> {
        let last = parts.len().saturating_sub(1);
        let mut tag = None;
        for (k, (dtype, mut args, grid)) in parts.into_iter().enumerate() {
            if notify && k == last {
                args.notify = 1;
                tag = Some(u64::from(args.seq) + 1);
            }
            // SAFETY: the tables `args` points to belong to this
            // submission's work buffer (held by `pending` until
            // completion, or kept for a captured graph); the buffers of
            // every call stay valid until the work completed.
            unsafe { launch::steps(&self.kernels, dtype, grid, args, stream)? };
        }
        Ok(tag)
    }

    /// One item of a launch. `tell`: whether this item, or the one after
    /// it, is the last (a peer kernel that runs makes the call's fallback,
    /// the next item, skipped). Returns the done tag it stores, if it
    /// does, and whether the next item is skipped.
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    unsafe fn launch_item(
        &self,
        sub: &Submission,
        item: Item,
        tell: [bool; 2],
        pending: &mut CudaPending,
    ) -> Result<(Option<u64>, bool)> {
        let (stream, captured) = (sub.stream, sub.captured);
        let [tell, tell_next] = tell;
        match item {
            Item::Peer(call) => {
                let skip = self.run_peer(&call, stream, captured, tell_next)?;
                Ok(((skip && tell_next).then_some(call.seq + 1), skip))
            }
            Item::Steps {
                nchans,
                mut args,
                dtype,
                ..
            } => {
                let tag = tell.then(|| {
                    args.notify = 1;
                    u64::from(args.seq) + 1
                });
                // SAFETY: every address in `args` stays valid until the
                // event recorded by `record` completed (owned by `pending`
                // or by the backend).
                unsafe { launch::steps(&self.kernels, dtype, nchans as u32, args, stream)? };
                Ok((tag, false))
            }
            Item::OneShot {
                mut args,
                dtype,
                grid,
                threads,
            } => {
                let tag = tell.then(|| {
                    args.flags |= FLAG_NOTIFY;
                    (args.meta >> 32) + 1
                });
                // SAFETY: the buffers stay valid until the event recorded by
                // `record` completed, the one-shot areas for the backend's
                // life.
                unsafe { launch::direct(&self.kernels, dtype, grid, threads, &mut args, stream)? };
                Ok((tag, false))
            }
            Item::Local { copies, seq } => {
                // SAFETY: as for this function.
                unsafe { self.launch_copies(&copies, seq, tell, stream)? };
                Ok((tell.then_some(seq + 1), false))
            }
            Item::Copy(call) => {
                let res = pending.res.get_or_insert_with(Resources::default);
                self.run_ce(&call, stream, captured, tell, res)?;
                Ok((tell.then_some(call.seq + 1), false))
            }
        }
    }

    /// A one-rank call's driver copies; the last call of a blocking launch
    /// then stores its done tag (`seq + 1`) itself, as a kernel would.
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    unsafe fn launch_copies(
        &self,
        copies: &[(u64, u64, u64)],
        seq: u64,
        tell: bool,
        stream: CUstream,
    ) -> Result<()> {
        for &(dst, src, bytes) in copies {
            // SAFETY: both ranges lie in the call's buffers (`local_copies`
            // checked them), valid until the work completed.
            unsafe { driver::memcpy_dtod_async(dst, src, bytes as usize, stream)? };
        }
        if tell {
            let done =
                self.target.status + std::mem::offset_of!(super::abi::GcChanStatus, done) as u64;
            // SAFETY: the status word lives in our control segment, mapped
            // for the backend's life.
            unsafe { driver::stream_write_u64(stream, done, seq + 1)? };
        }
        Ok(())
    }

    /// Record: the end event, the caller's stream as the last one used,
    /// and, for a captured graph, what its kernels read kept for the
    /// backend's life (the work is then done).
    fn record(&self, sub: &Submission, pending: &mut CudaPending, seq: u64) -> Result<()> {
        if let Some(e) = &pending.event {
            driver::event_record(e.raw(), sub.stream)?;
        }
        if sub.user && !sub.captured {
            self.order().after(sub.stream)?;
        }
        if sub.captured {
            if let Some(r) = pending.res.take() {
                self.graph_keep
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(r);
            }
            tracing::debug!(
                rank = self.rank,
                seq,
                "collective captured into a CUDA graph"
            );
            pending.done = Some(Ok(()));
        }
        Ok(())
    }

    /// Post a blocking call that lowered to one one-shot to the resident
    /// block, if there is one and it takes the call (the pending call then
    /// holds `res`); `Ok(None)` leaves everything for a launch.
    fn try_resident(
        self: &Arc<Self>,
        lowered: &mut Lowered,
        res: &mut Resources,
        first_seq: u64,
    ) -> Result<Option<CudaPending>> {
        let Some(r) = &self.resident else {
            return Ok(None);
        };
        let plain = lowered.steps.is_empty() && lowered.rail_jobs.is_empty();
        let (args, dtype, grid) = match lowered.items.as_mut_slice() {
            [Item::OneShot {
                args, dtype, grid, ..
            }] if plain => (args, *dtype, *grid),
            _ => return Ok(None),
        };
        if !r.takes(grid)? {
            return Ok(None);
        }
        args.flags |= FLAG_NOTIFY;
        let tag = (args.meta >> 32) + 1;
        let mut pending = CudaPending::new(self.clone(), None, first_seq, r.stream() as usize);
        pending.res = Some(std::mem::take(res));
        // SAFETY: the call's buffers stay valid until it completed
        // (`submit`'s contract); the one-shot areas live as long as the backend.
        let n = unsafe { r.post(args, dtype, grid, &self.launcher())? };
        pending.done_tag = Some(tag);
        pending.resident = Some(n);
        lowered.items.clear();
        Ok(Some(pending))
    }

    /// Resolve every call's buffers (staging host memory into `res`) and
    /// lower its plan: the one-shot kernel where [`runs_as_oneshot`] says
    /// so, else its steps (with device scratch memory if it needs some).
    fn lower(&self, launch: &Launch, res: &mut Resources) -> Result<Lowered> {
        let mut lowered = Lowered::default();
        // A group runs as one launch of the step interpreter: no one-shot
        // kernels, no split-off local blocks.
        let group = launch.items.len() > 1;
        let target = &self.target;
        for (k, bp) in launch.items.iter().enumerate() {
            let seq = launch.first_seq + k as u64;
            let plan = &bp.plan;
            let esize = plan.task.dtype.size() as u64;
            let (input, output) = self.resolve(&bp.input, &bp.output, seq, res)?;
            if plan.algorithm == Algorithm::CopyEngine && !group && target.direct_path() {
                let scratch = scratch(plan.scratch_elems, esize, res)?;
                let t = &plan.task;
                lowered.items.push(Item::Copy(Box::new(CeCall {
                    kind: t.kind,
                    dtype: t.dtype,
                    count: t.count,
                    root: t.root,
                    in_place: t.in_place,
                    input,
                    output,
                    scratch,
                    seq,
                })));
                continue;
            }
            // One rank: a driver copy (a kernel of one or two blocks
            // copied 1 MiB in ~35 µs on H200).
            if !group && self.nranks == 1 {
                if let Some(copies) = local_copies(plan, input, output) {
                    lowered.items.push(Item::Local { copies, seq });
                    continue;
                }
            }
            // Registered buffers: the peer kernel, decided at the
            // rendezvous; the plan's own launch follows it as the fallback.
            let at = lowered.items.len();
            let peer = self
                .peer_asks(plan, group)
                .then(|| PeerCall::new(plan, input, output, seq));
            if runs_as_oneshot(plan, group, target.direct_path(), seq)? {
                lowered
                    .items
                    .push(target.oneshot(plan, input, output, seq)?);
            } else {
                let scratch = scratch(plan.scratch_elems, esize, res)?;
                target.lower_steps(plan, [input, output, scratch], seq, group, &mut lowered)?;
            }
            if let Some(call) = peer {
                if lowered.items.len() != at + 1 {
                    return Err(Error::Backend(format!(
                        "collective #{seq}: {} launches lowered where one was expected",
                        lowered.items.len() - at
                    )));
                }
                lowered.items.insert(at, Item::Peer(Box::new(call)));
            }
        }
        Ok(lowered)
    }
}

/// Work on a caller's stream takes device memory only: staging host
/// buffers needs host waits.
fn refuse_host_buffers(launch: &Launch) -> Result<()> {
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
    Ok(())
}

/// Device scratch of `elems` elements of `esize` bytes, kept in `res`
/// until the work completed (none for 0 elements).
fn scratch(elems: u64, esize: u64, res: &mut Resources) -> Result<Mem> {
    if elems == 0 {
        return Ok(Mem::default());
    }
    let bytes = elems
        .checked_mul(esize)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or(Error::CountTooLarge(elems))?;
    let m = DevMem::alloc(bytes)?;
    let s = Mem { addr: m.ptr, elems };
    res.mems.push(m);
    Ok(s)
}
