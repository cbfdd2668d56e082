//! Pairwise algorithms: every rank talks to every peer itself. all_to_all,
//! gather and scatter, and the one-hop all_reduce used where every peer is
//! directly reachable.
//!
//! Pairwise rounds are ordered by distance `d`: in round `d` a rank sends to
//! `me + d` and receives from `me - d`, so every send meets a receive in the
//! peer's round of the same number and no cycle of waits can form.

use super::ctx::{flow, own_input, Ctx};
use super::{Flow, Peers, Region, Step};

/// all_to_all: copy my own block, then, chunk by chunk, send to every peer
/// and receive from every peer (`to = me + d`, `from = me - d` for `d` in
/// `1..n`). In place the input blocks would be
/// overwritten by incoming ones before being sent, so they are first copied
/// to scratch and sent from there.
pub(crate) fn all_to_all(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (n, me) = (cx.n, cx.me);
    let in_place = cx.task.in_place;
    if in_place {
        for b in (0..n).filter(|&b| b != me) {
            for (o, k) in cx.chunks(s, e) {
                let at = cx.at(b, o);
                steps.push(Step::Flow(Flow {
                    src: Some(Region::input(at)),
                    dst: Some(Region::scratch(at)),
                    ..flow(k)
                }));
            }
        }
    } else {
        for (o, k) in cx.chunks(s, e) {
            let at = cx.at(me, o);
            steps.push(Step::Flow(Flow {
                src: Some(Region::input(at)),
                dst: Some(Region::output(at)),
                ..flow(k)
            }));
        }
    }
    // Chunk by chunk: send this chunk of every peer's block, then receive
    // this chunk from every peer. A chunk is at most half a FIFO, so the
    // sends never wait for a receiver (a connector holds at most this chunk
    // and the next one), and ranks need not meet pairwise round by round,
    // which costs dearly when ranks outnumber cores.
    for (o, k) in cx.chunks(s, e) {
        for d in 1..n {
            let to = (me + d) % n;
            let at = cx.at(to, o);
            steps.push(Step::Flow(Flow {
                src: Some(if in_place {
                    Region::scratch(at)
                } else {
                    Region::input(at)
                }),
                send: Peers::one(to),
                ..flow(k)
            }));
        }
        for d in 1..n {
            let from = (me + n - d) % n;
            steps.push(Step::Flow(Flow {
                recv: Peers::one(from),
                dst: Some(Region::output(cx.at(from, o))),
                ..flow(k)
            }));
        }
    }
}

/// gather: non-roots send their input to the root; the root copies its own
/// block (already in place when in place) and receives each peer's block
/// into its slot, peers in ascending order.
pub(crate) fn gather(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (n, me, root) = (cx.n, cx.me, cx.task.root);
    for (o, k) in cx.chunks(s, e) {
        if me != root {
            steps.push(Step::Flow(Flow {
                src: Some(Region::input(o)),
                send: Peers::one(root),
                ..flow(k)
            }));
            continue;
        }
        if !cx.task.in_place {
            steps.push(Step::Flow(Flow {
                src: Some(Region::input(o)),
                dst: Some(Region::output(cx.at(me, o))),
                ..flow(k)
            }));
        }
        for p in (0..n).filter(|&p| p != root) {
            steps.push(Step::Flow(Flow {
                recv: Peers::one(p),
                dst: Some(Region::output(cx.at(p, o))),
                ..flow(k)
            }));
        }
    }
}

/// scatter: the root sends each peer its block (ascending) and copies its
/// own (left where it is when in place); the others receive into output.
pub(crate) fn scatter(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (n, me, root) = (cx.n, cx.me, cx.task.root);
    for (o, k) in cx.chunks(s, e) {
        if me != root {
            steps.push(Step::Flow(Flow {
                recv: Peers::one(root),
                dst: Some(Region::output(o)),
                ..flow(k)
            }));
            continue;
        }
        for p in (0..n).filter(|&p| p != root) {
            steps.push(Step::Flow(Flow {
                src: Some(Region::input(cx.at(p, o))),
                send: Peers::one(p),
                ..flow(k)
            }));
        }
        if !cx.task.in_place {
            steps.push(Step::Flow(Flow {
                src: Some(Region::input(cx.at(me, o))),
                dst: Some(Region::output(o)),
                ..flow(k)
            }));
        }
    }
}

/// One-hop all_reduce: per block of `n × chunk` elements, chunk `r` is owned
/// by rank `r`. Reduce-scatter phase: in round `d` send my input's chunk of
/// `me + d` to it and fold the chunk `me - d` sent me into my accumulator
/// (my output chunk; the first fold starts from my input, the last applies
/// the post-op). All-gather phase: in round `d` send my finished chunk to
/// `me + d` and receive the chunk of `me - d` into my output. Empty chunks
/// (uneven last block) are skipped by sender and receiver alike.
pub(crate) fn all_reduce(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (n, me) = (cx.n, cx.me);
    for block in cx.blocks(s, e) {
        let piece = |i: usize| block.piece(i);
        let (mo, mk) = piece(me);
        for d in 1..n {
            let to = (me + d) % n;
            let from = (me + n - d) % n;
            let (to_o, to_k) = piece(to);
            if to_k > 0 {
                steps.push(Step::Flow(Flow {
                    send: Peers::one(to),
                    ..own_input(to_k, Region::input(to_o))
                }));
            }
            if mk > 0 {
                let src = if d == 1 {
                    own_input(mk, Region::input(mo))
                } else {
                    Flow {
                        src: Some(Region::output(mo)),
                        reduce: true,
                        ..flow(mk)
                    }
                };
                steps.push(Step::Flow(Flow {
                    recv: Peers::one(from),
                    dst: Some(Region::output(mo)),
                    post_op: d == n - 1,
                    ..src
                }));
            }
        }
        for d in 1..n {
            let to = (me + d) % n;
            let from = (me + n - d) % n;
            if mk > 0 {
                steps.push(Step::Flow(Flow {
                    src: Some(Region::output(mo)),
                    send: Peers::one(to),
                    ..flow(mk)
                }));
            }
            let (fo, fk) = piece(from);
            if fk > 0 {
                steps.push(Step::Flow(Flow {
                    recv: Peers::one(from),
                    dst: Some(Region::output(fo)),
                    ..flow(fk)
                }));
            }
        }
    }
}
