//! What the algorithm builders share: the context of one plan ([`Ctx`]),
//! the split of a channel's range into blocks and chunks, and the basic
//! step shapes. Every rank computes the same split, so a step that sends on
//! one rank always meets the step that receives on its peer, in order.

use super::{Flow, Peers, Region};
use crate::graph::Graph;
use crate::op::Reduction;
use crate::task::Task;

/// What every algorithm builder needs.
pub(crate) struct Ctx<'a> {
    pub task: &'a Task,
    pub graph: &'a Graph,
    /// Number of ranks.
    pub n: usize,
    /// This rank.
    pub me: usize,
    /// Largest step, in elements (at least 1).
    pub chunk: u64,
    /// Elements in 16 bytes (at least 1): the alignment of channel and
    /// uneven-chunk boundaries.
    pub align: u64,
    pub reduction: Reduction,
}

impl Ctx<'_> {
    /// Element offset of `off` within rank `block`'s block of `task.count`
    /// elements (saturating: absurd sizes are never materialized).
    pub fn at(&self, block: usize, off: u64) -> u64 {
        (block as u64)
            .saturating_mul(self.task.count)
            .saturating_add(off)
    }

    /// The blocks of `[start, end)` for algorithms that give each of the
    /// `n` ranks one chunk per block (ring and pairwise all_reduce). The last
    /// block may be short: its chunk shrinks to an even, aligned share, and
    /// ranks past its end get empty chunks, which senders and receivers
    /// skip alike.
    pub fn blocks(&self, start: u64, end: u64) -> impl Iterator<Item = Block> {
        self.blocks_of(start, end, self.n)
    }

    /// [`blocks`](Self::blocks) with `parts` chunks per block instead of
    /// one per rank (collnet: one per rank of a node).
    pub fn blocks_of(&self, start: u64, end: u64, parts: usize) -> impl Iterator<Item = Block> {
        let (chunk, n, align) = (self.chunk, parts.max(1) as u64, self.align);
        let full = chunk.saturating_mul(n);
        let mut base = start;
        std::iter::from_fn(move || {
            if base >= end {
                return None;
            }
            let rem = full.min(end - base);
            let cs = if rem == full {
                chunk
            } else {
                chunk.min(round_up(div_ceil(rem, n), align))
            };
            let b = Block { base, rem, cs };
            base += rem;
            Some(b)
        })
    }

    /// `(offset, count)` of the chunks of `[start, end)`.
    pub fn chunks(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> {
        let chunk = self.chunk;
        let mut off = start;
        std::iter::from_fn(move || {
            if off >= end {
                return None;
            }
            let k = chunk.min(end - off);
            let item = (off, k);
            off += k;
            Some(item)
        })
    }
}

/// One block of [`Ctx::blocks`]: `rem` elements from `base`, cut into
/// chunks of `cs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    base: u64,
    rem: u64,
    cs: u64,
}

impl Block {
    /// `(offset, count)` of chunk `i` of this block (count 0 past its end).
    pub fn piece(&self, i: usize) -> (u64, u64) {
        let lo = (i as u64).saturating_mul(self.cs);
        if lo >= self.rem {
            (self.base, 0)
        } else {
            (self.base + lo, self.cs.min(self.rem - lo))
        }
    }
}

/// A Flow moving `count` elements with no peers, source or destination yet.
pub(crate) fn flow(count: u64) -> Flow {
    Flow {
        recv: Peers::NONE,
        send: Peers::NONE,
        src: None,
        dst: None,
        count,
        reduce: false,
        pre_op: false,
        post_op: false,
        acc: false,
    }
}

/// A Flow contributing this rank's own input at `src`: a reduction with the
/// pre-op (scaling of the local input) applied. With no receive peers the
/// value is the scaled input alone.
pub(crate) fn own_input(count: u64, src: Region) -> Flow {
    Flow {
        src: Some(src),
        reduce: true,
        pre_op: true,
        ..flow(count)
    }
}

/// Ceiling division.
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    a / b + u64::from(a % b != 0)
}

/// Round `a` up to a multiple of `m` (saturating).
pub(crate) fn round_up(a: u64, m: u64) -> u64 {
    div_ceil(a, m).saturating_mul(m)
}

/// Split `[0, total)` into at most `nch` contiguous non-empty ranges whose
/// boundaries are multiples of `align` (except the end).
pub(crate) fn channel_ranges(total: u64, nch: usize, align: u64) -> Vec<(u64, u64)> {
    let nch = nch.max(1) as u64;
    let share = round_up(div_ceil(total, nch), align.max(1)).max(1);
    let mut v = Vec::new();
    let mut start = 0u64;
    while start < total && (v.len() as u64) < nch {
        let end = start.saturating_add(share).min(total);
        v.push((start, end));
        start = end;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_ranges_cover_and_align() {
        for total in [0u64, 1, 2, 3, 7, 13, 64, 1000, 4099] {
            for nch in 1..=5 {
                for align in [1u64, 2, 4, 16] {
                    let v = channel_ranges(total, nch, align);
                    assert!(v.len() <= nch);
                    let mut at = 0;
                    for &(s, e) in &v {
                        assert_eq!(s, at);
                        assert!(e > s);
                        assert!(s % align == 0);
                        at = e;
                    }
                    assert_eq!(at, total);
                }
            }
        }
        assert_eq!(channel_ranges(u64::MAX, 3, 16).last().unwrap().1, u64::MAX);
    }
}
