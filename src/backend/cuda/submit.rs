//! Submission of one launch: lower every call's plan, upload the tables,
//! launch the kernels on our stream or the caller's, and hand back the
//! [`CudaPending`] that completes it.

use super::abi::FLAG_NOTIFY;
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
use crate::error::{Error, Result};
use crate::tune::Algorithm;
use std::sync::Arc;

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
        bind(self.ctx.ordinal)?;
        let user = launch.stream.is_some();
        let stream: CUstream = match launch.stream {
            Some(s) => s as usize as CUstream,
            None => self.stream.raw(),
        };
        let captured = user && stream_mode(&self.ctx, stream)? == Capture::Active;
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
        let mut res = Resources::default();
        let mut lowered = self.lower(&launch, &mut res)?;
        if captured && !lowered.rail_jobs.is_empty() {
            // The proxy learns each rail step's datatype and op from a
            // queue filled per submission, which graph replays would skip.
            return Err(Error::InvalidUsage(
                "a collnet all_reduce (GPUCOLL_ALGO=collnet) cannot be captured into a CUDA \
                 graph: its inter-node step is MPI's all-reduce, driven from the host"
                    .into(),
            ));
        }
        self.profile.lap(&mut clock, Phase::Lower);
        if blocking && !user {
            if let Some(p) = self.try_resident(&mut lowered, &mut res, launch.first_seq)? {
                self.profile.lap(&mut clock, Phase::Launch);
                return Ok(p);
            }
        }
        // Anything else runs after the resident block left.
        self.resident_quit();
        let event = if blocking || captured {
            None
        } else {
            Some(self.events.take()?)
        };
        let mut pending = CudaPending::new(self.clone(), event, launch.first_seq, stream as usize);
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
        self.profile.lap(&mut clock, Phase::Prepare);
        let group = launch.items.len() > 1;
        let group_launch = if group && lowered.step_items() > 1 {
            Some(self.upload_group(
                &lowered.steps,
                &lowered.chans,
                &lowered.items,
                &mut res,
                stream,
                captured,
            )?)
        } else {
            None
        };
        if group_launch.is_none() && !lowered.steps.is_empty() {
            self.upload_steps(&mut lowered, &mut res, stream, captured)?;
        }
        pending.res = Some(res);
        self.profile.lap(&mut clock, Phase::Upload);
        if !lowered.rail_jobs.is_empty() {
            // Before the kernels: the proxy needs each piece's job when the
            // piece appears.
            let net = self.net.as_ref().ok_or_else(|| {
                Error::Backend("rail steps on a backend without a NET proxy".into())
            })?;
            if group_launch.is_some() {
                group_rail_order(&mut lowered.rail_jobs, &lowered.items);
            }
            net.push_rail_jobs(&lowered.rail_jobs)?;
        }
        // A blocking call on our own stream waits for its last kernel by
        // reading host memory: that kernel stores `done_tag` when all its
        // blocks finished (`notify`; other launches skip the store and its
        // fences).
        let notify = blocking && !user;
        let mut tag = None;
        if let Some(parts) = group_launch {
            let last = parts.len().saturating_sub(1);
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
            lowered.items.clear();
        }
        let last = lowered.items.len().saturating_sub(1);
        // Set when a peer kernel ran: the fallback after it is skipped.
        let mut skip = false;
        for (k, item) in lowered.items.into_iter().enumerate() {
            if std::mem::take(&mut skip) {
                continue;
            }
            let tell = notify && k == last;
            match item {
                Item::Peer(call) => {
                    // Its fallback is the next item: the last one, when
                    // the peer kernel is the call's end.
                    let tell = notify && k + 1 == last;
                    skip = self.run_peer(&call, stream, captured, tell)?;
                    if skip && tell {
                        tag = Some(call.seq + 1);
                    }
                }
                Item::Steps {
                    nchans,
                    mut args,
                    dtype,
                    ..
                } => {
                    if tell {
                        args.notify = 1;
                        tag = Some(u64::from(args.seq) + 1);
                    }
                    // SAFETY: every address in `args` stays valid until the
                    // event recorded below completed (owned by `pending` or
                    // by the backend).
                    unsafe { launch::steps(&self.kernels, dtype, nchans as u32, args, stream)? };
                }
                Item::OneShot {
                    mut args,
                    dtype,
                    grid,
                    threads,
                } => {
                    if tell {
                        args.flags |= FLAG_NOTIFY;
                        tag = Some((args.meta >> 32) + 1);
                    }
                    // SAFETY: the buffers stay valid until the event below
                    // completed, the one-shot areas for the backend's life.
                    unsafe {
                        launch::direct(&self.kernels, dtype, grid, threads, &mut args, stream)?
                    };
                }
                Item::Local { copies, seq } => {
                    for (dst, src, bytes) in copies {
                        // SAFETY: both ranges lie in the call's buffers
                        // (`local_copies` checked them), valid until the
                        // work completed.
                        unsafe { driver::memcpy_dtod_async(dst, src, bytes as usize, stream)? };
                    }
                    if tell {
                        tag = Some(seq + 1);
                        let done = self.target.status
                            + std::mem::offset_of!(super::abi::GcChanStatus, done) as u64;
                        // SAFETY: the status word lives in our control
                        // segment, mapped for the backend's life.
                        unsafe { driver::stream_write_u64(stream, done, seq + 1)? };
                    }
                }
                Item::Copy(call) => {
                    if tell {
                        tag = Some(call.seq + 1);
                    }
                    let res = pending.res.get_or_insert_with(Resources::default);
                    self.run_ce(&call, stream, captured, tell, res)?;
                }
            }
        }
        self.profile.lap(&mut clock, Phase::Launch);
        if let Some(e) = &pending.event {
            driver::event_record(e.raw(), stream)?;
        }
        pending.done_tag = tag;
        if user && !captured {
            self.order().after(stream)?;
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
        self.profile.lap(&mut clock, Phase::Record);
        Ok(pending)
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
