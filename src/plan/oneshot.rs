//! The one-shot all_reduce: every rank sends its whole input to every peer
//! and reduces all inputs itself. One exchange instead of the 2(n-1) steps
//! of a ring, for calls small enough that latency dominates.
//!
//! Every rank folds the inputs in rank order, `((x0 ⊕ x1) ⊕ x2) ⊕ ...`,
//! with its own (pre-scaled) input at its rank's place, so the result is
//! identical on every rank. Chunk by chunk: send this chunk of my input to
//! every peer, then fold this chunk of every input into my output. A chunk
//! is at most half a FIFO, so sends never wait on a receiver (a connector
//! holds at most this chunk and the next one), as in `pairwise::all_to_all`.
//!
//! GPU backends with a direct path run this shape as a kernel of their own
//! (inboxes in every peer's memory instead of FIFOs); the steps here are
//! what the host backend executes and the simulator checks.

use super::ctx::{flow, own_input, Ctx};
use super::{Flow, Peers, Region, Step, MAX_STEP_PEERS};

/// Elements of scratch the one-shot needs: in place, my input is staged
/// there before my output (the same memory) becomes the accumulator.
pub(crate) fn scratch_elems(count: u64, in_place: bool) -> u64 {
    if in_place {
        count
    } else {
        0
    }
}

/// The one-shot all_reduce of elements `[s, e)`.
pub(crate) fn all_reduce(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (n, me) = (cx.n, cx.me);
    let in_place = cx.task.in_place;
    let peers: Vec<usize> = (1..n).map(|d| (me + d) % n).collect();
    for (o, k) in cx.chunks(s, e) {
        // My contribution: the scaled input, staged in scratch when the
        // output is the input's memory.
        let mine = if in_place {
            steps.push(Step::Flow(Flow {
                dst: Some(Region::scratch(o)),
                ..own_input(k, Region::input(o))
            }));
            Flow {
                src: Some(Region::scratch(o)),
                ..flow(k)
            }
        } else {
            own_input(k, Region::input(o))
        };
        for to in peers.chunks(MAX_STEP_PEERS) {
            steps.push(Step::Flow(Flow {
                send: Peers::from_slice(to),
                ..mine
            }));
        }
        fold(cx, o, k, mine, steps);
    }
}

/// Fold chunk `(o, k)` of every rank's input into my output, in rank order;
/// `mine` is the flow reading my contribution.
fn fold(cx: &Ctx<'_>, o: u64, k: u64, mine: Flow, steps: &mut Vec<Step>) {
    let (n, me) = (cx.n, cx.me);
    let out = Region::output(o);
    let first = steps.len();
    let mut started = false;
    let mut p = 0;
    while p < n {
        if p == me {
            steps.push(Step::Flow(Flow {
                dst: Some(out),
                // Into what the lower ranks folded, if any.
                acc: started,
                reduce: mine.reduce || started,
                ..mine
            }));
            p += 1;
        } else {
            // Up to three consecutive lower- or higher-ranked peers per step.
            let end = (p + MAX_STEP_PEERS).min(if p < me { me } else { n });
            let from: Vec<usize> = (p..end).collect();
            let src = started.then_some(out);
            steps.push(Step::Flow(Flow {
                recv: Peers::from_slice(&from),
                src,
                dst: Some(out),
                reduce: src.is_some() || from.len() > 1,
                ..flow(k)
            }));
            p = end;
        }
        started = true;
    }
    if let Some(Step::Flow(last)) = steps[first..].last_mut() {
        if last.reduce {
            last.post_op = true;
        }
    }
}
