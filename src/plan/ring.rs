//! Ring algorithms: all_reduce (reduce-scatter then all-gather), reduce,
//! broadcast, all_gather and reduce_scatter, all following the graph's ring.
//!
//! Every step receives from the ring predecessor and/or sends to the ring
//! successor, and each rank starts a chunk with at most one send before it
//! receives, so at most one chunk per rank is in flight beyond what has been
//! drained; with chunks of at most half a FIFO the ring never fills up.

use super::ctx::{flow, own_input, Ctx};
use super::{Flow, Peers, Region, Step};

/// Ring all_reduce over `[s, e)`: per block of `n × chunk` elements split
/// into `n` chunks (indexed by ring position), the NCCL step shape: send
/// chunk `ix-1`; receive-reduce-send `n-2` chunks; receive-reduce-copy-send
/// chunk `ix` (final, post-op); receive-copy-send `n-2` chunks; receive
/// chunk `ix+1`. The last block is split evenly (16-byte aligned); chunks
/// that end up empty are skipped on every rank alike, which keeps senders
/// and receivers matched.
pub(crate) fn all_reduce(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let n = cx.n;
    let ix = cx.graph.ring_index(cx.me);
    let next = Peers::one(cx.graph.ring_next(cx.me));
    let prev = Peers::one(cx.graph.ring_prev(cx.me));
    for block in cx.blocks(s, e) {
        let piece = |i: usize| block.piece(i);
        let pos = |back: usize| (ix + n - back % n) % n;
        let mut push = |(o, k): (u64, u64), f: &dyn Fn(u64, u64) -> Flow| {
            if k > 0 {
                steps.push(Step::Flow(f(o, k)));
            }
        };
        push(piece(pos(1)), &|o, k| Flow {
            send: next,
            ..own_input(k, Region::input(o))
        });
        for j in 2..n {
            push(piece(pos(j)), &|o, k| Flow {
                recv: prev,
                send: next,
                ..own_input(k, Region::input(o))
            });
        }
        push(piece(ix), &|o, k| Flow {
            recv: prev,
            send: next,
            dst: Some(Region::output(o)),
            post_op: true,
            ..own_input(k, Region::input(o))
        });
        for j in 1..n - 1 {
            push(piece(pos(j)), &|o, k| Flow {
                recv: prev,
                send: next,
                dst: Some(Region::output(o)),
                ..flow(k)
            });
        }
        push(piece((ix + 1) % n), &|o, k| Flow {
            recv: prev,
            dst: Some(Region::output(o)),
            ..flow(k)
        });
    }
}

/// Ring reduce to the root: a pipeline starting at the root's successor;
/// each rank adds its input and forwards, the root finishes (post-op) into
/// its output.
pub(crate) fn reduce(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let n = cx.n;
    let g = cx.graph;
    let rel = (g.ring_index(cx.me) + n - g.ring_index(cx.task.root)) % n;
    let next = Peers::one(g.ring_next(cx.me));
    let prev = Peers::one(g.ring_prev(cx.me));
    for (o, k) in cx.chunks(s, e) {
        let mut f = own_input(k, Region::input(o));
        if rel != 1 {
            f.recv = prev;
        }
        if rel == 0 {
            f.dst = Some(Region::output(o));
            f.post_op = true;
        } else {
            f.send = next;
        }
        steps.push(Step::Flow(f));
    }
}

/// Ring broadcast from the root to the root's predecessor. The root sends
/// from its input (also copying it to the output unless in place); the
/// others receive into their output and forward.
pub(crate) fn broadcast(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let n = cx.n;
    let g = cx.graph;
    let rel = (g.ring_index(cx.me) + n - g.ring_index(cx.task.root)) % n;
    let next = Peers::one(g.ring_next(cx.me));
    let prev = Peers::one(g.ring_prev(cx.me));
    for (o, k) in cx.chunks(s, e) {
        let mut f = flow(k);
        if rel == 0 {
            f.src = Some(Region::input(o));
            if !cx.task.in_place {
                f.dst = Some(Region::output(o));
            }
        } else {
            f.recv = prev;
            f.dst = Some(Region::output(o));
        }
        if rel != n - 1 {
            f.send = next;
        }
        steps.push(Step::Flow(f));
    }
}

/// Ring all_gather: per chunk, send my block (copying it into my slot of the
/// output unless in place, where it already is), then forward the `n-2`
/// blocks of my predecessors and keep the last.
pub(crate) fn all_gather(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let n = cx.n;
    let g = cx.graph;
    let next = Peers::one(g.ring_next(cx.me));
    let prev = Peers::one(g.ring_prev(cx.me));
    for (o, k) in cx.chunks(s, e) {
        let mine = cx.at(cx.me, o);
        let first = if cx.task.in_place {
            Flow {
                src: Some(Region::output(mine)),
                send: next,
                ..flow(k)
            }
        } else {
            Flow {
                src: Some(Region::input(o)),
                dst: Some(Region::output(mine)),
                send: next,
                ..flow(k)
            }
        };
        steps.push(Step::Flow(first));
        for j in 1..n {
            let owner = g.ring_offset(cx.me, n - j);
            steps.push(Step::Flow(Flow {
                recv: prev,
                send: if j < n - 1 { next } else { Peers::NONE },
                dst: Some(Region::output(cx.at(owner, o))),
                ..flow(k)
            }));
        }
    }
}

/// Ring reduce_scatter: per chunk, send my contribution to the block of my
/// predecessor, add mine to each block passing through, and finish my own
/// block (post-op) into output offset 0. In place the input is the output
/// buffer (`n` blocks) and the result overwrites block 0 of it; only this
/// rank reads its block 0, within the same chunk and before the final step,
/// so nothing still to be read is clobbered.
pub(crate) fn reduce_scatter(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let n = cx.n;
    let g = cx.graph;
    let next = Peers::one(g.ring_next(cx.me));
    let prev = Peers::one(g.ring_prev(cx.me));
    for (o, k) in cx.chunks(s, e) {
        for j in 1..n {
            let owner = g.ring_offset(cx.me, n - j);
            let mut f = Flow {
                send: next,
                ..own_input(k, Region::input(cx.at(owner, o)))
            };
            if j > 1 {
                f.recv = prev;
            }
            steps.push(Step::Flow(f));
        }
        steps.push(Step::Flow(Flow {
            recv: prev,
            dst: Some(Region::output(o)),
            post_op: true,
            ..own_input(k, Region::input(cx.at(cx.me, o)))
        }));
    }
}
