//! Prefix reductions, scan and exclusive_scan: a pipelined chain in rank
//! order (MPI defines the prefix by rank, whatever the graph's ring order).
//!
//! Rank `r` holds `x_r` (its input, pre-scaled) and wants `P_r = x_0 ⊕ … ⊕
//! x_r` (scan) or `P_{r-1}` (exclusive_scan). Every step receives only from
//! `r - 1` and sends only to `r + 1`, so the chain has no cycle and cannot
//! deadlock, whatever the FIFO depth: rank `n - 1` only drains.
//!
//! scan is one flow per chunk: receive `P_{r-1}`, add `x_r`, write `P_r`
//! and send it on.
//!
//! exclusive_scan has to write `P_{r-1}` and send `P_r`, two different
//! values, and a [`Flow`](super::Flow) writes and sends the same one with
//! at most one local source. So each rank sends its neighbour two messages
//! per chunk: `x_r` first (it depends on nothing, so every rank sends it at
//! once), then `P_r`. Rank `r ≥ 2` receives `x_{r-1}` into its output, then
//! receives `P_{r-2}` and adds the output to it, which gives `P_{r-1}` in
//! place; rank 1's `P_0` is `x_0` alone. That is twice scan's bytes per
//! link, the least the step vocabulary allows (each rank needs both
//! values), with no scratch. Rank 0's output is never written (MPI leaves
//! it undefined).
//!
//! Ops whose lowering depends on the communicator size (Avg) are refused
//! before planning (`coll/check.rs`); PreMulSum scales each `x_r` once, at
//! its own rank.

use super::ctx::{flow, own_input, Ctx};
use super::{Flow, Peers, Region, Step};

/// The neighbours of this rank in the chain: (previous, next), NONE at the
/// ends.
fn neighbours(cx: &Ctx<'_>) -> (Peers, Peers) {
    let prev = if cx.me > 0 {
        Peers::one(cx.me - 1)
    } else {
        Peers::NONE
    };
    let next = if cx.me + 1 < cx.n {
        Peers::one(cx.me + 1)
    } else {
        Peers::NONE
    };
    (prev, next)
}

/// Whether the pre-op changes a value (PreMulSum other than 1).
fn scales(cx: &Ctx<'_>) -> bool {
    cx.reduction.pre_scale.is_some_and(|s| s != 1.0)
}

/// Inclusive scan over `[s, e)` for `n ≥ 2` ranks. Rank 0 in place without
/// scaling has nothing to write: its output already is `P_0`.
pub(crate) fn scan(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (prev, next) = neighbours(cx);
    let keep = cx.me == 0 && cx.task.in_place && !scales(cx);
    for (o, k) in cx.chunks(s, e) {
        steps.push(Step::Flow(Flow {
            recv: prev,
            send: next,
            dst: (!keep).then_some(Region::output(o)),
            ..own_input(k, Region::input(o))
        }));
    }
}

/// Exclusive scan over `[s, e)` for `n ≥ 2` ranks (see the module's
/// schedule). In place, `x_r` is sent before the output (the same memory)
/// is written, within each chunk.
pub(crate) fn exclusive_scan(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let (prev, next) = neighbours(cx);
    for (o, k) in cx.chunks(s, e) {
        if !next.is_empty() {
            steps.push(Step::Flow(Flow {
                send: next,
                ..own_input(k, Region::input(o))
            }));
        }
        match cx.me {
            0 => {}
            // P_0 = x_0: write it and pass it on as is.
            1 => steps.push(Step::Flow(Flow {
                recv: prev,
                send: next,
                dst: Some(Region::output(o)),
                ..flow(k)
            })),
            _ => {
                steps.push(Step::Flow(Flow {
                    recv: prev,
                    dst: Some(Region::output(o)),
                    ..flow(k)
                }));
                steps.push(Step::Flow(Flow {
                    recv: prev,
                    send: next,
                    src: Some(Region::output(o)),
                    dst: Some(Region::output(o)),
                    reduce: true,
                    ..flow(k)
                }));
            }
        }
    }
}
