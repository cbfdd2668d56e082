//! [`build`]: turn a task and the tuner's choice into this rank's steps.
//!
//! The data is split among channels in contiguous element ranges (aligned to
//! 16 bytes where possible; for collectives over per-rank blocks, the range
//! is within each block). Each algorithm then walks its channel's range in
//! chunks of at most `chunk_elems` elements. Every rank computes the same
//! partition and chunking, so a step that sends on one rank always meets the
//! step that receives on its peer, in the same order.

use super::ctx::{channel_ranges, flow, own_input, Ctx};
use super::{collnet, oneshot, pairwise, ring, scan, tree, ChannelWork, Flow, Plan, Region, Step};
use crate::graph::Graph;
use crate::op::Reduction;
use crate::task::{CollKind, Task};
use crate::topo::Topology;
use crate::tune::caps::BackendCaps;
use crate::tune::{max_chunk_bytes, Algorithm, Choice};

/// The algorithm actually used for `kind`: the chosen one if it is
/// implemented for the collective, else the collective's only one.
fn effective_algorithm(kind: CollKind, chosen: Algorithm) -> Algorithm {
    match kind {
        // Copy engines do not reduce (the tuner never offers them here).
        CollKind::AllReduce if chosen == Algorithm::CopyEngine => Algorithm::Ring,
        CollKind::AllReduce => chosen,
        // The prefix chain in rank order (`scan.rs`), labelled as the ring
        // it is without its closing hop; no one-shot or copy-engine form.
        CollKind::Scan | CollKind::ExclusiveScan => Algorithm::Ring,
        // A GPU backend runs these one-shot plans as its one-shot kernel; the
        // steps (ring or pairwise, below) are what others execute.
        _ if chosen == Algorithm::OneShot => Algorithm::OneShot,
        // A backend with copy engines runs these plans by DMA copies; the
        // steps (ring or pairwise, below) are what others execute.
        CollKind::AllGather
        | CollKind::AllToAll
        | CollKind::Broadcast
        | CollKind::Gather
        | CollKind::Scatter
            if chosen == Algorithm::CopyEngine =>
        {
            Algorithm::CopyEngine
        }
        CollKind::Reduce | CollKind::Broadcast | CollKind::AllGather | CollKind::ReduceScatter => {
            Algorithm::Ring
        }
        CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => Algorithm::Pairwise,
    }
}

/// Plan `task` for this rank (`topo.rank`).
///
/// The plan's shape (algorithm, protocol, chunking, channel count, scratch)
/// depends only on values identical on all ranks; the steps are this rank's.
/// `choice.chunk_bytes` is additionally capped at half the FIFO (at least
/// one slot), which the ring and tree pipelines rely on to be deadlock free.
pub fn build(
    task: &Task,
    topo: &Topology,
    graph: &Graph,
    choice: &Choice,
    caps: &BackendCaps,
) -> Plan {
    let n = topo.nranks.max(1);
    let elem = task.dtype.size() as u64;
    let chunk_bytes = choice.chunk_bytes.min(max_chunk_bytes(caps));
    let cx = Ctx {
        task,
        graph,
        n,
        me: topo.rank,
        chunk: (chunk_bytes / elem).max(1),
        align: (16 / elem).max(1),
        reduction: Reduction::lower(task.op, task.dtype, n),
    };
    let mut algorithm = effective_algorithm(task.kind, choice.algorithm);
    // collnet's rails need several nodes of equal size (the tuner offers
    // it only then); anything else runs the ring.
    if algorithm == Algorithm::CollNet && (topo.nnodes() < 2 || graph.uniform_ppn().is_none()) {
        algorithm = Algorithm::Ring;
    }
    let scratch_elems = match (task.kind, algorithm) {
        _ if n == 1 => 0,
        (CollKind::AllToAll, _) if task.in_place => task.count.saturating_mul(n as u64),
        (CollKind::AllReduce, Algorithm::OneShot) => {
            oneshot::scratch_elems(task.count, task.in_place)
        }
        (
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
            | CollKind::Scan
            | CollKind::ExclusiveScan,
            _,
        ) => 0,
    };
    let mut plan = Plan {
        task: *task,
        reduction: cx.reduction,
        algorithm,
        protocol: choice.protocol,
        chunk_elems: cx.chunk,
        scratch_elems,
        channels: Vec::new(),
    };
    if task.count == 0 {
        return plan;
    }
    let ranges = channel_ranges(task.count, choice.nchannels, cx.align);
    let mut channels: Vec<ChannelWork> = ranges
        .iter()
        .enumerate()
        .map(|(c, &(s, e))| {
            let mut steps = Vec::new();
            if n == 1 {
                local(&cx, s, e, &mut steps);
            } else {
                match (task.kind, algorithm) {
                    (CollKind::AllReduce, Algorithm::Ring | Algorithm::CopyEngine) => {
                        ring::all_reduce(&cx, s, e, &mut steps)
                    }
                    (CollKind::AllReduce, Algorithm::Tree) => {
                        tree::all_reduce(&cx, c, s, e, &mut steps)
                    }
                    (CollKind::AllReduce, Algorithm::Pairwise) => {
                        pairwise::all_reduce(&cx, s, e, &mut steps)
                    }
                    (CollKind::AllReduce, Algorithm::OneShot) => {
                        oneshot::all_reduce(&cx, s, e, &mut steps)
                    }
                    (CollKind::AllReduce, Algorithm::CollNet) => {
                        collnet::all_reduce(&cx, s, e, &mut steps)
                    }
                    (CollKind::Reduce, _) => ring::reduce(&cx, s, e, &mut steps),
                    (CollKind::Broadcast, _) => ring::broadcast(&cx, s, e, &mut steps),
                    (CollKind::AllGather, _) => ring::all_gather(&cx, s, e, &mut steps),
                    (CollKind::ReduceScatter, _) => ring::reduce_scatter(&cx, s, e, &mut steps),
                    (CollKind::AllToAll, _) => pairwise::all_to_all(&cx, s, e, &mut steps),
                    (CollKind::Gather, _) => pairwise::gather(&cx, s, e, &mut steps),
                    (CollKind::Scatter, _) => pairwise::scatter(&cx, s, e, &mut steps),
                    (CollKind::Scan, _) => scan::scan(&cx, s, e, &mut steps),
                    (CollKind::ExclusiveScan, _) => scan::exclusive_scan(&cx, s, e, &mut steps),
                }
            }
            ChannelWork { channel: c, steps }
        })
        .collect();
    // A single rank may have nothing to do at all (in place, no scaling);
    // with one rank there is no peer whose channel ids must agree.
    if n == 1 && channels.iter().all(|c| c.steps.is_empty()) {
        channels.clear();
    }
    plan.channels = channels;
    plan
}

/// One rank: every collective is a copy of the input to the output (block
/// 0), with the pre/post ops for reductions; nothing when in place and the
/// copy would change nothing. exclusive_scan has no prefix on its only
/// rank, 0, whose output stays untouched.
fn local(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let task = cx.task;
    let r = &cx.reduction;
    if task.kind == CollKind::ExclusiveScan {
        return;
    }
    if task.kind.reduces() {
        let scales = r.pre_scale.is_some_and(|x| x != 1.0) || r.post_div.is_some_and(|d| d != 1);
        if task.in_place && !scales {
            return;
        }
        for (o, k) in cx.chunks(s, e) {
            steps.push(Step::Flow(Flow {
                dst: Some(Region::output(o)),
                post_op: true,
                ..own_input(k, Region::input(o))
            }));
        }
    } else {
        if task.in_place {
            return;
        }
        for (o, k) in cx.chunks(s, e) {
            steps.push(Step::Flow(Flow {
                src: Some(Region::input(o)),
                dst: Some(Region::output(o)),
                ..flow(k)
            }));
        }
    }
}
