//! Tree all_reduce: per chunk, reduce up the tree (leaves send their input,
//! interior ranks add their children's partial sums to their input and pass
//! them on, the root finishes the value) and broadcast it back down.
//!
//! Channel `c` uses tree `c % 2`, so with two or more channels both trees of
//! the double binary tree carry data. Non-root ranks run the reduction of
//! chunk `i + 1` before the broadcast of chunk `i`, so the up and down
//! directions overlap; this needs one chunk of buffering on each link, which
//! a chunk of at most half a FIFO provides.

use super::ctx::{flow, own_input, Ctx};
use super::{Flow, Peers, Region, Step};

pub(crate) fn all_reduce(cx: &Ctx<'_>, channel: usize, s: u64, e: u64, steps: &mut Vec<Step>) {
    let links = cx.graph.tree_links(channel, cx.me);
    let children = Peers::from_slice(&links.children);
    let chunks: Vec<(u64, u64)> = cx.chunks(s, e).collect();
    let Some(parent) = links.parent else {
        // Root: receive the children's sums, add mine, finish, write and
        // send the result down, in one step per chunk.
        for &(o, k) in &chunks {
            steps.push(Step::Flow(Flow {
                recv: children,
                send: children,
                dst: Some(Region::output(o)),
                post_op: true,
                ..own_input(k, Region::input(o))
            }));
        }
        return;
    };
    let parent = Peers::one(parent);
    let up = |(o, k): (u64, u64)| {
        Step::Flow(Flow {
            recv: children,
            send: parent,
            ..own_input(k, Region::input(o))
        })
    };
    let down = |(o, k): (u64, u64)| {
        Step::Flow(Flow {
            recv: parent,
            send: children,
            dst: Some(Region::output(o)),
            ..flow(k)
        })
    };
    for (i, &c) in chunks.iter().enumerate() {
        steps.push(up(c));
        if i > 0 {
            steps.push(down(chunks[i - 1]));
        }
    }
    if let Some(&last) = chunks.last() {
        steps.push(down(last));
    }
}
