//! Plan lowering: a rank's `Plan` becomes device step tables (`GcStep`,
//! `GcChan`) and kernel arguments (`GcArgs`, `GcOneShotArgs`). Pure code: no
//! driver call, every address comes in through [`DeviceTargets`] and [`Mem`], so
//! the unit tests below run on machines without a GPU.

use super::abi::*;
use super::launch::THREADS;
use super::layout::{
    Layout, ONESHOT_BLOCK_BYTES, ONESHOT_LL_BLOCK_BYTES, ONESHOT_MAX_BLOCKS, ONESHOT_MAX_BYTES,
};
use super::net::RailJob;
use crate::backend::shared::validate::{self, plan_error, Limits};
use crate::datatype::Datatype;
use crate::error::Result;
use crate::op::{Combine, Reduction};
use crate::plan::{BufId, Plan, Region, Step};
use crate::task::CollKind;
use crate::tune::{Algorithm, Protocol};

/// A buffer as the kernel sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Mem {
    pub addr: u64,
    pub elems: u64,
}

/// The device addresses a rank's tables point at, fixed at bring-up.
#[derive(Debug, Clone)]
pub(super) struct DeviceTargets {
    pub rank: usize,
    pub nranks: usize,
    pub layout: Layout,
    /// Device connector tables (`[channel * nranks + peer]`).
    pub send_conns: u64,
    pub recv_conns: u64,
    /// Our abort word and per-channel status area (control segment).
    pub abort_word: u64,
    pub status: u64,
    /// Every rank's one-shot area in our address space; empty without the
    /// direct path.
    pub oneshot_bases: Vec<u64>,
    /// Our rail (local index) where the NET layout has rail pairs: collnet
    /// runs (`net/rail.rs`).
    pub rail: Option<u32>,
}

/// One kernel launch of a submission.
pub(super) enum Item {
    /// The step interpreter over `nchans` channel descriptors.
    Steps {
        first_chan: usize,
        nchans: usize,
        args: GcArgs,
        /// The kernel's datatype ([`kernel_dtype`] of the call's).
        dtype: Datatype,
    },
    /// The one-shot kernel (`gc_oneshot_<t>`).
    OneShot {
        args: Box<GcOneShotArgs>,
        /// The kernel's datatype ([`kernel_dtype`] of the call's).
        dtype: Datatype,
        grid: u32,
        /// Threads per block ([`oneshot_threads`]).
        threads: u32,
    },
    /// A copy-engine collective: no kernel.
    Copy(Box<CeCall>),
    /// A call that may run as a peer kernel on registered buffers
    /// (`peer_mem/peer.rs`), decided at its rendezvous; the item after it is
    /// the call's own launch, skipped when the peer kernel ran.
    Peer(Box<PeerCall>),
    /// A communicator of one rank: the collective is a copy of the input
    /// into the output (`(dst, src, bytes)`, coalesced), queued as driver
    /// copies instead of a kernel ([`local_copies`]).
    Local {
        copies: Vec<(u64, u64, u64)>,
        seq: u64,
    },
}

/// One copy-engine collective, as lowered.
#[derive(Debug, Clone)]
pub(super) struct CeCall {
    pub kind: CollKind,
    pub dtype: Datatype,
    pub count: u64,
    pub root: usize,
    pub in_place: bool,
    pub input: Mem,
    pub output: Mem,
    /// In-place all_to_all: room for a copy of the output.
    pub scratch: Mem,
    pub seq: u64,
}

/// One call as the peer kernels on registered buffers see it (`peer_mem/peer.rs`).
#[derive(Debug, Clone)]
pub(super) struct PeerCall {
    pub kind: CollKind,
    pub dtype: Datatype,
    /// Elements of the buffer (all_reduce, broadcast) or of one rank's block.
    pub count: u64,
    pub root: usize,
    pub reduction: Reduction,
    pub input: Mem,
    pub output: Mem,
    pub seq: u64,
}

impl PeerCall {
    /// The call of `plan` over `input` and `output`.
    pub(super) fn new(plan: &Plan, input: Mem, output: Mem, seq: u64) -> PeerCall {
        let t = &plan.task;
        PeerCall {
            kind: t.kind,
            dtype: t.dtype,
            count: t.count,
            root: t.root,
            reduction: plan.reduction,
            input,
            output,
            seq,
        }
    }

    pub(super) fn esize(&self) -> u64 {
        self.dtype.size() as u64
    }

    /// What every rank's post must agree on: the collective, root, count,
    /// datatype and reduction, and that it is a peer call.
    pub(super) fn digest(&self) -> u64 {
        let kind = CollKind::ALL
            .iter()
            .position(|k| *k == self.kind)
            .unwrap_or(99) as u64;
        let op = u64::from(op_code(self.reduction.combine, self.dtype));
        let mut h: u64 = 0x7065_6572_6b65_726e;
        for v in [kind, self.root as u64, self.count, self.esize(), op] {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }

    /// Elements of (input, output) this rank's buffers must hold.
    pub(super) fn extents(&self, nranks: usize, me: usize) -> (u64, u64) {
        let (c, n) = (self.count, nranks as u64);
        match self.kind {
            CollKind::ReduceScatter => (c.saturating_mul(n), c),
            CollKind::AllGather => (c, c.saturating_mul(n)),
            CollKind::Broadcast if me != self.root => (0, c),
            CollKind::AllReduce | CollKind::Broadcast => (c, c),
            // No peer kernel runs these (`peer::peer_candidate`): their
            // extents are the task's.
            CollKind::Reduce
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
            | CollKind::Scan
            | CollKind::ExclusiveScan => (c, c),
        }
    }
}

impl CeCall {
    pub(super) fn esize(&self) -> u64 {
        self.dtype.size() as u64
    }
    /// Bytes of one rank's share (the whole message of a broadcast).
    pub(super) fn block(&self) -> u64 {
        self.count.saturating_mul(self.esize())
    }
    /// What every rank's post must agree on (never the in-place flag:
    /// the root of gather and scatter may be in place alone).
    pub(super) fn digest(&self) -> u64 {
        let kind = CollKind::ALL
            .iter()
            .position(|k| *k == self.kind)
            .unwrap_or(99) as u64;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in [kind, self.root as u64, self.count, self.esize()] {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }
}

/// The step and channel tables of a submission and its launches.
#[derive(Default)]
pub(super) struct Lowered {
    pub steps: Vec<GcStep>,
    pub chans: Vec<GcChan>,
    pub items: Vec<Item>,
    /// The rail steps, `(channel, job)` in step order: the NET proxy's
    /// jobs, queued before the kernels are launched.
    pub rail_jobs: Vec<(usize, RailJob)>,
}

impl Lowered {
    /// How many launches run the step interpreter.
    pub(super) fn step_items(&self) -> usize {
        self.items
            .iter()
            .filter(|i| matches!(i, Item::Steps { .. }))
            .count()
    }
}

/// The op code of a launch: the combine function, with [`OP_SIGNED`] for
/// signed integer data (which runs on [`kernel_dtype`]'s kernel).
pub(super) fn op_code(c: Combine, dtype: Datatype) -> u32 {
    let code = match c {
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
    };
    debug_assert_eq!(code & !OP_MASK, 0);
    if dtype.is_signed_int() {
        code | OP_SIGNED
    } else {
        code
    }
}

/// The pre-scale of integer types, as the kernel applies it.
pub(super) fn int_scale(dtype: Datatype, s: f64) -> u64 {
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

/// The one-shot kernel's code for a collective, if it runs it (a new
/// collective with a one-shot form needs its code here and in
/// `kernels/oneshot.cuh`). The prefix chains of scan and exclusive_scan
/// have none: the planner never gives them a one-shot plan.
pub(super) fn oneshot_kind(kind: CollKind) -> Option<u32> {
    match kind {
        CollKind::AllReduce => Some(ONESHOT_ALL_REDUCE),
        CollKind::AllGather => Some(ONESHOT_ALL_GATHER),
        CollKind::ReduceScatter => Some(ONESHOT_REDUCE_SCATTER),
        CollKind::AllToAll => Some(ONESHOT_ALL_TO_ALL),
        CollKind::Broadcast => Some(ONESHOT_BROADCAST),
        CollKind::Reduce => Some(ONESHOT_REDUCE),
        CollKind::Gather => Some(ONESHOT_GATHER),
        CollKind::Scatter => Some(ONESHOT_SCATTER),
        CollKind::Scan | CollKind::ExclusiveScan => None,
    }
}

/// Threads per block of a one-shot launch of `grid` blocks over segments of
/// `bytes`. A single block that carries little gets fewer threads: its
/// start and its barriers cost less (one-GPU probe, graph replay: 8 B LL
/// 3.80 → 3.58 µs a call, 8 B Simple 5.33 → 5.10). An LL block keeps one
/// 8-byte unit per thread (fewer threads, each waiting for several lines in
/// turn, were slower: 4 KiB on 128 threads 6.76 µs against 4.09), and a
/// Simple block drops to 64 threads only up to 4 KiB (8 KiB on 64 threads
/// took 6.15 µs against 5.41). The kernel loops over its units with any
/// block size, so ranks may even differ.
pub(super) fn oneshot_threads(ll: bool, bytes: u64, grid: u32) -> u32 {
    const FEWEST: u64 = 64;
    let threads = if grid > 1 {
        THREADS as u64
    } else if ll {
        bytes.div_ceil(8).next_multiple_of(32)
    } else if bytes <= 4096 {
        FEWEST
    } else {
        THREADS as u64
    };
    threads.clamp(FEWEST, THREADS as u64) as u32
}

/// Whether this plan runs as the one-shot kernel instead of its steps: the
/// planner emits the one-shot as its own shape (`Algorithm::OneShot`, for
/// every collective), which this
/// backend runs as its kernel. The one place that decides it: it depends
/// only on the plan and on facts agreed at bring-up (`direct_path`: the
/// one-shot inboxes exist), so every rank decides alike and the inbox
/// epochs stay in step. A one-shot plan this backend cannot run (in a
/// group, without inboxes, a segment over the inbox size) is an error: the
/// tuner never chooses one.
pub(super) fn runs_as_oneshot(
    plan: &Plan,
    in_group: bool,
    direct_path: bool,
    seq: u64,
) -> Result<bool> {
    let task = &plan.task;
    if plan.algorithm != Algorithm::OneShot || task.count == 0 {
        return Ok(false);
    }
    let bytes = task.count.saturating_mul(task.dtype.size() as u64);
    if in_group || !direct_path || bytes > ONESHOT_MAX_BYTES {
        return Err(plan_error(
            seq,
            0,
            0,
            format!(
                "a one-shot {} of {bytes} bytes per rank (in a group: {in_group}), which needs \
                 the direct path outside a group and at most {ONESHOT_MAX_BYTES} bytes",
                task.kind.name()
            ),
        ));
    }
    Ok(true)
}

impl DeviceTargets {
    /// Whether the one-shot inboxes of every rank are mapped.
    pub(super) fn direct_path(&self) -> bool {
        self.layout.direct && self.oneshot_bases.len() == self.nranks
    }

    /// The one-shot kernel launch of a plan for which
    /// [`runs_as_oneshot`] holds.
    pub(super) fn oneshot(&self, plan: &Plan, input: Mem, output: Mem, seq: u64) -> Result<Item> {
        let task = &plan.task;
        let dtype = task.dtype;
        let kind = oneshot_kind(task.kind).ok_or_else(|| {
            plan_error(
                seq,
                0,
                0,
                format!(
                    "a one-shot {}, which has no one-shot kernel",
                    task.kind.name()
                ),
            )
        })?;
        let bytes = task.count.saturating_mul(dtype.size() as u64);
        let n = self.nranks as u64;
        // Segments of `count` elements this rank reads and writes: one per
        // rank on the side that holds every rank's; none where a rooted
        // collective has no buffer.
        let root = task.root == self.rank;
        let (in_segs, out_segs) = match task.kind {
            CollKind::AllGather => (1, n),
            CollKind::ReduceScatter => (n, 1),
            CollKind::AllToAll => (n, n),
            CollKind::Broadcast => (u64::from(root), 1),
            CollKind::Reduce => (1, u64::from(root)),
            CollKind::Gather => (1, if root { n } else { 0 }),
            CollKind::Scatter => (if root { n } else { 0 }, 1),
            // Refused above (no one-shot kernel).
            CollKind::AllReduce | CollKind::Scan | CollKind::ExclusiveScan => (1, 1),
        };
        let holds = |m: &Mem, segs: u64| {
            segs == 0 || (m.addr != 0 && m.elems >= task.count.saturating_mul(segs))
        };
        if !holds(&input, in_segs) || !holds(&output, out_segs) || task.root >= self.nranks {
            return Err(plan_error(
                seq,
                0,
                0,
                format!(
                    "one-shot {} of {} elements per rank over buffers of {} and {}",
                    task.kind.name(),
                    task.count,
                    input.elems,
                    output.elems
                ),
            ));
        }
        let (me, l) = (self.rank as u64, &self.layout);
        let red = plan.reduction;
        let ll = plan.protocol == Protocol::LL;
        if bytes
            > if ll {
                l.oneshot_ll_bytes()
            } else {
                l.oneshot_bytes
            }
        {
            return Err(plan_error(
                seq,
                0,
                0,
                format!(
                    "a one-shot of {bytes} bytes per rank (the inboxes hold {} with Simple, {} with LL)",
                    l.oneshot_bytes,
                    l.oneshot_ll_bytes()
                ),
            ));
        }
        let mut flags = kind << ONESHOT_KIND_SHIFT | (task.root as u32) << ONESHOT_ROOT_SHIFT;
        if red.pre_scale.is_some() {
            flags |= FLAG_PRE_OP;
        }
        if red.post_div.is_some() {
            flags |= FLAG_POST_OP;
        }
        if ll {
            flags |= FLAG_LL;
        }
        let bases = &self.oneshot_bases;
        let mut a = GcOneShotArgs {
            input: input.addr,
            output: output.addr,
            count: task.count,
            abort_word: self.abort_word,
            status: self.status,
            scale: red.pre_scale.unwrap_or(1.0),
            iscale: int_scale(dtype, red.pre_scale.unwrap_or(1.0)),
            div: red.post_div.unwrap_or(1).max(1),
            // The launch counter lives in device memory (advanced by the
            // kernels), so captured graphs replay with fresh epochs.
            ctl: bases[self.rank],
            meta: (seq << 32) | (bytes & 0xffff_ffff),
            parity_bytes: l.oneshot_parity_bytes(),
            ll_off: l.oneshot_bytes,
            nranks: self.nranks as u32,
            rank: self.rank as u32,
            op: op_code(red.combine, dtype),
            flags,
            ..GcOneShotArgs::default()
        };
        for p in 0..self.nranks {
            let pu = p as u64;
            a.put_data[p] = bases[p] + l.oneshot_inbox(me);
            a.put_flag[p] = bases[p] + l.oneshot_flags(me);
            a.get_data[p] = bases[self.rank] + l.oneshot_inbox(pu);
            a.get_flag[p] = bases[self.rank] + l.oneshot_flags(pu);
        }
        let per_block = if ll {
            ONESHOT_LL_BLOCK_BYTES
        } else {
            ONESHOT_BLOCK_BYTES
        };
        let grid = bytes
            .div_ceil(per_block)
            .clamp(1, ONESHOT_MAX_BLOCKS.min(l.channels)) as u32;
        Ok(Item::OneShot {
            args: Box::new(a),
            dtype: kernel_dtype(dtype),
            grid,
            threads: oneshot_threads(ll, bytes, grid),
        })
    }

    /// Append the steps of `plan` (collective `seq`) to `out` and its
    /// launch item, if any channel has work. Outside a group, leading
    /// local-only steps of a channel get a block of their own.
    pub(super) fn lower_steps(
        &self,
        plan: &Plan,
        bufs: [Mem; 3],
        seq: u64,
        in_group: bool,
        out: &mut Lowered,
    ) -> Result<()> {
        let [input, output, scratch] = bufs;
        let n = self.nranks;
        let dtype = plan.task.dtype;
        let esize = dtype.size() as u64;
        let mem = |b: BufId| match b {
            BufId::Input => input,
            BufId::Output => output,
            BufId::Scratch => scratch,
        };
        // An absent buffer (address 0) holds nothing a step may touch.
        let elems = |m: Mem| if m.addr == 0 { 0 } else { m.elems };
        let span = |m: Mem| (m.addr, m.addr.saturating_add(m.elems.saturating_mul(esize)));
        let ((i0, i1), (o0, o1)) = (span(input), span(output));
        validate::validate(
            plan,
            seq,
            &Limits {
                rank: self.rank,
                nranks: n,
                channels: self.layout.channels as usize,
                input_elems: elems(input),
                output_elems: elems(output),
                scratch_elems: elems(scratch),
                // In place (or overlapping), input and output are one memory.
                input_writable: plan.task.in_place || (i0 < o1 && o0 < i1),
                rail: self.rail,
            },
        )?;
        let red = plan.reduction;
        let (steps, chans, rail_jobs) = (&mut out.steps, &mut out.chans, &mut out.rail_jobs);
        let first_chan = chans.len();
        // Blocks for leading local-only steps split off their channel.
        let mut local_chans: Vec<GcChan> = Vec::new();
        for cw in &plan.channels {
            let ch = cw.channel;
            if cw.steps.iter().all(|s| s.count() == 0) {
                continue;
            }
            let first = steps.len();
            for (i, step) in cw.steps.iter().enumerate() {
                let count = step.count();
                if count == 0 {
                    continue;
                }
                // Bounds and peers were validated above.
                let region = |r: Region| mem(r.buf).addr + r.offset * esize;
                let peer = |p: usize| p as u32;
                let mut g = GcStep {
                    count,
                    ..GcStep::default()
                };
                match step {
                    Step::Flow(f) => {
                        if f.acc {
                            return Err(plan_error(
                                seq,
                                ch,
                                i,
                                "an accumulating flow (one-shot plans run as their kernel)",
                            ));
                        }
                        g.kind = STEP_FLOW;
                        g.src = f.src.map(region).unwrap_or(0);
                        g.dst = f.dst.map(region).unwrap_or(0);
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
                            g.recv[j] = peer(p);
                        }
                        for (j, p) in f.send.iter().enumerate() {
                            g.send[j] = peer(p);
                        }
                        g.nrecv = f.recv.len() as u32;
                        g.nsend = f.send.len() as u32;
                    }
                    Step::Exchange {
                        to, src, from, dst, ..
                    } => {
                        g.kind = STEP_EXCHANGE;
                        g.src = region(*src);
                        g.dst = region(*dst);
                        g.send[0] = peer(*to);
                        g.recv[0] = peer(*from);
                        g.nsend = 1;
                        g.nrecv = 1;
                    }
                    Step::Rail { region: r, .. } => {
                        // Send the shard into the rail pair (our own
                        // index), then receive its all-reduce in place.
                        g.kind = STEP_FLOW;
                        g.src = region(*r);
                        g.send[0] = peer(self.rank);
                        g.nsend = 1;
                        steps.push(g);
                        g = GcStep {
                            count,
                            kind: STEP_FLOW,
                            dst: region(*r),
                            nrecv: 1,
                            ..GcStep::default()
                        };
                        g.recv[0] = peer(self.rank);
                        rail_jobs.push((
                            ch,
                            RailJob {
                                bytes: count * esize,
                                dtype,
                                combine: red.combine,
                            },
                        ));
                    }
                }
                steps.push(g);
            }
            let k = if in_group {
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
            return Ok(());
        }
        let args = GcArgs {
            send: self.send_conns,
            recv: self.recv_conns,
            abort_word: self.abort_word,
            status: self.status,
            scale: red.pre_scale.unwrap_or(1.0),
            iscale: int_scale(dtype, red.pre_scale.unwrap_or(1.0)),
            div: red.post_div.unwrap_or(1).max(1),
            nranks: n as u32,
            rank: self.rank as u32,
            slot_bytes: self.layout.slot_bytes as u32,
            slots: self.layout.slots as u32,
            seq: seq as u32,
            op: op_code(red.combine, dtype),
            ..GcArgs::default()
        };
        out.items.push(Item::Steps {
            first_chan,
            nchans,
            args,
            dtype: kernel_dtype(dtype),
        });
        Ok(())
    }
}

/// How many leading steps of one channel's list may run in a block of their
/// own, concurrently with the rest: local-only flows (no peer; e.g. the own
/// block copy of all_to_all) when no later step of the channel reads what
/// they write or writes what they read or write. 0 when none may (or when
/// the whole list is local: nothing to overlap).
pub(super) fn local_prefix(steps: &[GcStep], esize: u64) -> usize {
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

/// A one-rank plan as plain copies: every step a flow with no peer from
/// the input or output to the output, with no scaling that changes a value
/// (a pre-scale of 1, a post-divisor of 1: a one-value reduction is that
/// value). None where a kernel must run: scaling, scratch, anything
/// outside the buffers (the kernel path's validation then reports it), or
/// nothing to copy (in place).
pub(super) fn local_copies(plan: &Plan, input: Mem, output: Mem) -> Option<Vec<(u64, u64, u64)>> {
    let red = plan.reduction;
    if red.pre_scale.is_some_and(|x| x != 1.0) || red.post_div.is_some_and(|d| d != 1) {
        return None;
    }
    let esize = plan.task.dtype.size() as u64;
    let at = |r: Region, count: u64| -> Option<u64> {
        let m = match r.buf {
            BufId::Input => input,
            BufId::Output => output,
            BufId::Scratch => return None,
        };
        (m.addr != 0 && r.offset.checked_add(count)? <= m.elems).then(|| m.addr + r.offset * esize)
    };
    let mut copies: Vec<(u64, u64, u64)> = Vec::new();
    for cw in &plan.channels {
        for step in &cw.steps {
            let Step::Flow(f) = step else {
                return None;
            };
            if !f.recv.is_empty() || !f.send.is_empty() || f.acc || f.count == 0 {
                if f.count == 0 {
                    continue;
                }
                return None;
            }
            let (src, dst) = (at(f.src?, f.count)?, at(f.dst?, f.count)?);
            if f.dst?.buf != BufId::Output {
                return None;
            }
            let bytes = f.count * esize;
            if src == dst {
                continue;
            }
            match copies.last_mut() {
                Some(last) if last.0 + last.2 == dst && last.1 + last.2 == src => last.2 += bytes,
                _ => copies.push((dst, src, bytes)),
            }
        }
    }
    (!copies.is_empty()).then_some(copies)
}

mod group;
pub(super) use group::{group_parts, group_rail_order};

#[cfg(test)]
mod tests;
