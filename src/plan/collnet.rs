//! collnet all_reduce: the inter-node part handed to the backend's
//! inter-node collective.
//!
//! Per block of `L × chunk` elements (`L` ranks per node, one chunk per
//! local rank): a ring reduce-scatter within the node leaves local rank
//! `i` with chunk `i` reduced over its node (pre-op applied to each input);
//! a [`Step::Rail`] all-reduces that chunk with local rank `i` of every
//! other node; the post-op (integer average) follows; a ring all-gather
//! within the node then gives every local rank every chunk. Every node has
//! the same `L` (the tuner offers collnet only then), so the chunks line
//! up across nodes and every rail member meets the same rail steps.

use super::ctx::{flow, own_input, Ctx};
use super::{Flow, Peers, Region, Step};

pub(crate) fn all_reduce(cx: &Ctx<'_>, s: u64, e: u64, steps: &mut Vec<Step>) {
    let members = cx.graph.node_members(cx.me);
    let l = members.len();
    let li = members
        .iter()
        .position(|&r| r == cx.me)
        .expect("a rank is a member of its node");
    let next = Peers::one(members[(li + 1) % l]);
    let prev = Peers::one(members[(li + l - 1) % l]);
    let post_div = cx.reduction.post_div.is_some();
    for block in cx.blocks_of(s, e, l) {
        let piece = |i: usize| block.piece(i);
        let pos = |back: usize| (li + l - back % l) % l;
        let mut push = |(o, k): (u64, u64), f: &dyn Fn(u64, u64) -> Step| {
            if k > 0 {
                steps.push(f(o, k));
            }
        };
        // Reduce-scatter within the node.
        if l > 1 {
            push(piece(pos(1)), &|o, k| {
                Step::Flow(Flow {
                    send: next,
                    ..own_input(k, Region::input(o))
                })
            });
            for j in 2..l {
                push(piece(pos(j)), &|o, k| {
                    Step::Flow(Flow {
                        recv: prev,
                        send: next,
                        ..own_input(k, Region::input(o))
                    })
                });
            }
        }
        push(piece(li), &|o, k| {
            Step::Flow(Flow {
                recv: if l > 1 { prev } else { Peers::NONE },
                dst: Some(Region::output(o)),
                ..own_input(k, Region::input(o))
            })
        });
        // Across nodes, then the post-op on the node's shard.
        push(piece(li), &|o, k| Step::Rail {
            region: Region::output(o),
            count: k,
            rail: li as u32,
        });
        if post_div {
            push(piece(li), &|o, k| {
                Step::Flow(Flow {
                    src: Some(Region::output(o)),
                    dst: Some(Region::output(o)),
                    reduce: true,
                    post_op: true,
                    ..flow(k)
                })
            });
        }
        // All-gather within the node.
        if l > 1 {
            push(piece(li), &|o, k| {
                Step::Flow(Flow {
                    src: Some(Region::output(o)),
                    send: next,
                    ..flow(k)
                })
            });
            for j in 1..l - 1 {
                push(piece(pos(j)), &|o, k| {
                    Step::Flow(Flow {
                        recv: prev,
                        send: next,
                        dst: Some(Region::output(o)),
                        ..flow(k)
                    })
                });
            }
            push(piece((li + 1) % l), &|o, k| {
                Step::Flow(Flow {
                    recv: prev,
                    dst: Some(Region::output(o)),
                    ..flow(k)
                })
            });
        }
    }
}
