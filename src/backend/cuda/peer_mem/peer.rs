//! The peer kernels: all_reduce, reduce_scatter, all_gather and broadcast
//! on buffers every rank shares with its peers, run by one kernel that
//! reads the peers' inputs and writes straight into their outputs
//! (`kernels/peer.cuh`): no FIFO, no staging slot, no receive copy.
//!
//! Which calls ask, every rank alike ([`peer_candidate`]): one node with a
//! direct path, one call (not a group), a count above 0, no per-rank
//! pre-multiplier (`PreMulSum`), and `GPUCOLL_REGISTERED`: `1` always,
//! `auto` from [`REGISTERED_AUTO_MIN_BYTES`] on once a registration was
//! made on the communicator (registration is collective, so every rank
//! knows alike). A call that asks costs one copy-engine call number:
//!
//! 1. **Rendezvous** on the copy engines' board (`board.rs`): each rank
//!    posts the input peers read (all_reduce, reduce_scatter) and the
//!    output peers write (all_reduce, all_gather; broadcast but at the
//!    root), each only if the driver can export its allocation, and under
//!    `auto` only if this rank registered it (an in-place reduce_scatter
//!    offers no input: its result overwrites a block a peer reads). Every
//!    rank then reads the
//!    same posts, so every rank decides alike: if any buffer that must be
//!    shared was not posted, the call runs its plan's kernels as usual
//!    (the lowered fallback right after this item).
//! 2. **Ready**, the kernel, **done**: the copy engines' stream
//!    hand-shakes around one launch. Ranks whose memory we touch must be
//!    ready before the kernel (their inputs written, their outputs free);
//!    ranks touching ours wait for our done before their stream goes on
//!    (our input no longer read, our output complete).
//!
//! Failures are the copy engines': the waits are stream memory operations
//! on host flags, released by the host when a call fails or times out.

use super::super::abi::{
    kernel_dtype, GcPeerArgs, FLAG_POST_OP, FLAG_PRE_OP, ONESHOT_KIND_SHIFT, ONESHOT_RANKS,
    ONESHOT_ROOT_SHIFT,
};
use super::super::driver::{self, CUstream};
use super::super::launch::{self, THREADS};
use super::super::lower::{int_scale, oneshot_kind, op_code, Mem, PeerCall};
use super::super::state::CudaShared;
use super::board::{self, Post, Target};
use super::registry::Registry;
use crate::config::{RegisteredMode, REGISTERED_AUTO_MIN_BYTES};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::plan::Plan;
use crate::task::CollKind;
use crate::tune::Algorithm;
use std::sync::atomic::Ordering;

/// Most blocks of a peer kernel: enough 16-byte loads in flight to keep
/// NVLink busy, while leaving most SMs to the program's own kernels.
const MAX_BLOCKS: u64 = 64;
/// 16-byte packs each thread moves per round (`GC_PEER_UNROLL`).
const UNROLL: u64 = 4;

/// Whether rank `p`'s input is read by its peers, and whether its output
/// is written by them, in collective `kind` with root `root`.
fn shared(kind: CollKind, p: usize, root: usize) -> (bool, bool) {
    match kind {
        CollKind::AllReduce => (true, true),
        CollKind::ReduceScatter => (true, false),
        CollKind::AllGather => (false, true),
        CollKind::Broadcast => (false, p != root),
        // No peer kernel runs these (`peer_candidate`).
        CollKind::Reduce
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter
        | CollKind::Scan
        | CollKind::ExclusiveScan => (false, false),
    }
}

/// The peers whose memory rank `me` touches, and those touching its own.
fn touches(kind: CollKind, n: usize, me: usize, root: usize) -> (Vec<usize>, Vec<usize>) {
    let others: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    match kind {
        CollKind::Broadcast if me == root => (others, Vec::new()),
        CollKind::Broadcast => (Vec::new(), vec![root]),
        CollKind::AllReduce | CollKind::ReduceScatter | CollKind::AllGather => {
            (others.clone(), others)
        }
        // No peer kernel runs these (`peer_candidate`).
        CollKind::Reduce
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter
        | CollKind::Scan
        | CollKind::ExclusiveScan => (Vec::new(), Vec::new()),
    }
}

/// Whether a call asks for the peer kernels: the same answer on every
/// rank (it reads only the plan, agreed settings and collective history).
/// `registered_ever`: a registration was made on the communicator.
pub(in crate::backend::cuda) fn peer_candidate(
    plan: &Plan,
    group: bool,
    nranks: usize,
    mode: RegisteredMode,
    registered_ever: bool,
) -> bool {
    let t = &plan.task;
    let kind_ok = matches!(
        t.kind,
        CollKind::AllReduce | CollKind::ReduceScatter | CollKind::AllGather | CollKind::Broadcast
    );
    // A pre-multiplier may differ between ranks; the kernel applies one
    // scale to every rank's input (float Avg's 1/n is the same everywhere).
    let scale_ok = !matches!(t.op, ReduceOp::PreMulSum(_)) || !reduces(t.kind);
    let plan_ok = !matches!(plan.algorithm, Algorithm::CopyEngine | Algorithm::CollNet);
    if group
        || !kind_ok
        || !scale_ok
        || !plan_ok
        || t.count == 0
        || !(2..=ONESHOT_RANKS).contains(&nranks)
    {
        return false;
    }
    match mode {
        RegisteredMode::Off => false,
        RegisteredMode::On => true,
        RegisteredMode::Auto => registered_ever && t.bytes(nranks) >= REGISTERED_AUTO_MIN_BYTES,
    }
}

/// Whether `kind` folds values (its reduction applies).
fn reduces(kind: CollKind) -> bool {
    matches!(kind, CollKind::AllReduce | CollKind::ReduceScatter)
}

/// Blocks for a kernel moving `bytes` on this rank.
fn grid(bytes: u64) -> u32 {
    let packs = bytes.div_ceil(16);
    packs
        .div_ceil(u64::from(THREADS) * UNROLL)
        .clamp(1, MAX_BLOCKS) as u32
}

impl CudaShared {
    /// Whether `plan` asks for the peer kernels on this backend.
    pub(in crate::backend::cuda) fn peer_asks(&self, plan: &Plan, group: bool) -> bool {
        self.target.direct_path()
            && self.segs.len() == self.nranks
            && peer_candidate(
                plan,
                group,
                self.nranks,
                self.ce.peer_mode,
                self.ce.registered_ever.load(Ordering::Acquire),
            )
    }

    /// Rendezvous for `call` and, when every buffer it shares was posted,
    /// queue it on `stream` (true); false: the peers agreed to run the
    /// plan's kernels instead. `notify`: a blocking call's end is stored
    /// for the waiting thread. Any error fails the node: the peers went
    /// ahead with this call.
    pub(in crate::backend::cuda) fn run_peer(
        &self,
        call: &PeerCall,
        stream: CUstream,
        captured: bool,
        notify: bool,
    ) -> Result<bool> {
        let r = self.post_peer(call, stream, captured, notify);
        if let Err(e) = &r {
            self.mark_failed(e.to_string());
        }
        r
    }

    fn post_peer(
        &self,
        call: &PeerCall,
        stream: CUstream,
        captured: bool,
        notify: bool,
    ) -> Result<bool> {
        let (n, me) = (self.nranks, self.rank);
        let es = call.esize();
        let (in_elems, out_elems) = call.extents(n, me);
        let fits = |m: &Mem, elems: u64| elems == 0 || (m.addr != 0 && m.elems >= elems);
        if !fits(&call.input, in_elems) || !fits(&call.output, out_elems) {
            return Err(Error::Backend(format!(
                "peer {} #{}: buffers of {} and {} elements, {in_elems} and {out_elems} needed",
                call.kind.name(),
                call.seq,
                call.input.elems,
                call.output.elems
            )));
        }
        let mut st = self.ce.state.lock().unwrap_or_else(|p| p.into_inner());
        self.ce.used.store(true, Ordering::Release);
        st.registry.begin_call()?;
        let number = st.calls;
        st.calls += 1;

        // 1. Post what peers read and write, then read every peer's post.
        let auto = self.ce.peer_mode == RegisteredMode::Auto;
        let (reads, writes) = shared(call.kind, me, call.root);
        // An in-place reduce_scatter writes its result over block 0 of its
        // input, which rank 0 reads: such a rank offers no input, and the
        // call keeps its plan on every rank.
        let overwrites = call.kind == CollKind::ReduceScatter
            && overlaps(&call.input, in_elems * es, &call.output, out_elems * es);
        let source = if reads && !overwrites {
            offer(&mut st.registry, &call.input, in_elems * es, auto)?
        } else {
            None
        };
        let target = if writes {
            offer(&mut st.registry, &call.output, out_elems * es, auto)?
        } else {
            None
        };
        let post = Post {
            number,
            seq: call.seq,
            digest: call.digest(),
            target,
            source,
            note: 0,
            offer: None,
        };
        board::publish(self.own().as_ref(), &post);
        let posts = self.await_posts(&post)?;
        let complete = posts.iter().enumerate().all(|(p, q)| {
            let (r, w) = shared(call.kind, p, call.root);
            q.is_some_and(|q| (!r || q.source.is_some()) && (!w || q.target.is_some()))
        });
        if !complete {
            tracing::debug!(
                rank = me,
                seq = call.seq,
                coll = call.kind.name(),
                "peer kernel: a rank's buffers are not shared; the plan's kernels run"
            );
            return Ok(false);
        }
        let mut args = GcPeerArgs {
            count: call.count,
            nranks: n as u32,
            rank: me as u32,
            ..GcPeerArgs::default()
        };
        for (p, q) in posts.iter().enumerate() {
            if p == me {
                args.input[p] = call.input.addr;
                args.output[p] = call.output.addr;
                continue;
            }
            let q = q.ok_or_else(|| Error::Backend(format!("no post of rank {p}")))?;
            if let Some(t) = q.source {
                args.input[p] = st.registry.open(p, &t, captured)? + t.offset;
            }
            if let Some(t) = q.target {
                args.output[p] = st.registry.open(p, &t, captured)? + t.offset;
            }
        }
        self.ce_evict(&mut st, stream, captured)?;
        drop(st);
        self.fill_kernel_args(call, &mut args)?;

        // 2. Ready, the kernel, done.
        let (touch, touched_by) = touches(call.kind, n, me, call.root);
        self.hand_shake(stream, board::ready_flag, &touched_by, &touch)?;
        let moved = match call.kind {
            CollKind::AllReduce => call.count.div_ceil(n as u64),
            CollKind::Broadcast if me != call.root => 0,
            CollKind::Broadcast | CollKind::ReduceScatter | CollKind::AllGather => call.count,
            // No peer kernel runs these (`peer_candidate`).
            CollKind::Reduce
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
            | CollKind::Scan
            | CollKind::ExclusiveScan => 0,
        } * es;
        if moved > 0 {
            // SAFETY: our buffers stay valid until the work completed
            // (Backend::submit); the peers' are mapped by the registry
            // until the work queued before an eviction is done, and
            // written or read only between the two hand-shakes, while
            // their owners' streams wait.
            unsafe {
                launch::peer(
                    &self.kernels,
                    kernel_dtype(call.dtype),
                    grid(moved),
                    &mut args,
                    stream,
                )?
            };
        }
        self.hand_shake(stream, board::done_flag, &touch, &touched_by)?;
        if notify {
            self.notify_done(stream, call.seq)?;
        }
        let first = self.ce.peer_calls.fetch_add(1, Ordering::Relaxed) == 0;
        if first {
            tracing::info!(
                rank = me,
                seq = call.seq,
                coll = call.kind.name(),
                "registered buffers: peer kernels in use (peers' inputs read and outputs written in place)"
            );
        }
        tracing::debug!(
            rank = me,
            seq = call.seq,
            coll = call.kind.name(),
            bytes = moved,
            grid = grid(moved),
            "peer kernel"
        );
        Ok(true)
    }

    /// The collective, op and scaling of `call` in `args`.
    fn fill_kernel_args(&self, call: &PeerCall, args: &mut GcPeerArgs) -> Result<()> {
        let kind = oneshot_kind(call.kind)
            .ok_or_else(|| Error::Backend(format!("no peer kernel runs {}", call.kind.name())))?;
        let red = call.reduction;
        let reduces = reduces(call.kind);
        let mut flags = kind << ONESHOT_KIND_SHIFT | (call.root as u32) << ONESHOT_ROOT_SHIFT;
        if reduces && red.pre_scale.is_some() {
            flags |= FLAG_PRE_OP;
        }
        if reduces && red.post_div.is_some() {
            flags |= FLAG_POST_OP;
        }
        args.flags = flags;
        args.op = op_code(red.combine, call.dtype);
        args.scale = red.pre_scale.unwrap_or(1.0);
        args.iscale = int_scale(call.dtype, args.scale);
        args.div = red.post_div.unwrap_or(1).max(1);
        Ok(())
    }
}

/// Whether `bytes_a` of `a` and `bytes_b` of `b` share memory.
fn overlaps(a: &Mem, bytes_a: u64, b: &Mem, bytes_b: u64) -> bool {
    bytes_a > 0
        && bytes_b > 0
        && a.addr < b.addr.saturating_add(bytes_b)
        && b.addr < a.addr.saturating_add(bytes_a)
}

/// What this rank posts for `bytes` of `mem`: its allocation's handle
/// where the driver can export it (and, under `auto`, this rank
/// registered it), else nothing.
fn offer(registry: &mut Registry, mem: &Mem, bytes: u64, auto: bool) -> Result<Option<Target>> {
    if mem.addr == 0 || bytes == 0 {
        return Ok(None);
    }
    let Some(a) = driver::allocation_of(mem.addr)? else {
        return Ok(None);
    };
    if auto && !registry.is_registered(a.buffer_id) {
        return Ok(None);
    }
    Ok(registry.share(&a, mem.addr, bytes))
}

#[cfg(test)]
mod tests;
