//! Who copies what in a copy-engine collective: every copy is a push from
//! a rank's own memory into a receiver's output (or its own), so only
//! receive buffers need to be reachable by peers. Pure arithmetic, the
//! same on every rank, unit-tested against the collectives' definitions.

use crate::task::CollKind;

/// Where a copy reads on the rank that issues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The call's input.
    Input,
    /// A copy of the output taken before anything arrives (in-place
    /// all_to_all, whose blocks are overwritten by the peers' pushes).
    Staged,
}

/// One copy issued by a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copy {
    /// The receiving rank (the issuing rank itself for a local copy).
    pub to: usize,
    pub source: Source,
    /// Byte offset in the source.
    pub src_off: u64,
    /// Byte offset in the receiver's output.
    pub dst_off: u64,
    pub bytes: u64,
}

/// One rank's part of a copy-engine collective.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// Peers this rank pushes into (it waits for their "ready" first).
    pub sends_to: Vec<usize>,
    /// Peers that push into this rank's output (it tells them "ready",
    /// then waits for their "done").
    pub receives_from: Vec<usize>,
    /// Pushes to peers (staggered: peer `me+1` first) and the local copy.
    pub copies: Vec<Copy>,
    /// The output must be staged before peers may write into it.
    pub stage_output: bool,
}

/// Every peer of `me`, starting after it, so that ranks do not all push to
/// the same peer first.
fn peers(n: usize, me: usize) -> Vec<usize> {
    (1..n).map(|k| (me + k) % n).collect()
}

/// `me`'s schedule of `kind` among `n` ranks, `block` bytes per rank's
/// share (the whole message of a broadcast).
pub(crate) fn schedule(
    kind: CollKind,
    n: usize,
    me: usize,
    root: usize,
    block: u64,
    in_place: bool,
) -> Schedule {
    let mut s = Schedule::default();
    if n < 2 || block == 0 {
        return s;
    }
    let others = peers(n, me);
    let at = |r: usize| r as u64 * block;
    let copy = |to: usize, source: Source, src_off: u64, dst_off: u64| Copy {
        to,
        source,
        src_off,
        dst_off,
        bytes: block,
    };
    match kind {
        CollKind::AllGather => {
            s.sends_to = others.clone();
            s.receives_from = others.clone();
            s.copies = others
                .iter()
                .map(|&p| copy(p, Source::Input, 0, at(me)))
                .collect();
            s.copies.push(copy(me, Source::Input, 0, at(me)));
        }
        CollKind::AllToAll => {
            let source = if in_place {
                Source::Staged
            } else {
                Source::Input
            };
            s.stage_output = in_place;
            s.sends_to = others.clone();
            s.receives_from = others.clone();
            s.copies = others
                .iter()
                .map(|&p| copy(p, source, at(p), at(me)))
                .collect();
            // In place, my own block is already where it belongs.
            if !in_place {
                s.copies.push(copy(me, Source::Input, at(me), at(me)));
            }
        }
        CollKind::Broadcast => {
            if me == root {
                s.sends_to = others.clone();
                s.copies = others
                    .iter()
                    .map(|&p| copy(p, Source::Input, 0, 0))
                    .collect();
                s.copies.push(copy(me, Source::Input, 0, 0));
            } else {
                s.receives_from = vec![root];
            }
        }
        CollKind::Gather => {
            if me == root {
                s.receives_from = others;
                s.copies.push(copy(me, Source::Input, 0, at(me)));
            } else {
                s.sends_to = vec![root];
                s.copies.push(copy(root, Source::Input, 0, at(me)));
            }
        }
        CollKind::Scatter => {
            if me == root {
                s.sends_to = others.clone();
                s.copies = others
                    .iter()
                    .map(|&p| copy(p, Source::Input, at(p), 0))
                    .collect();
                s.copies.push(copy(me, Source::Input, at(me), 0));
            } else {
                s.receives_from = vec![root];
            }
        }
        // Reductions never reach the copy engines (the tuner's rule).
        CollKind::AllReduce
        | CollKind::Reduce
        | CollKind::ReduceScatter
        | CollKind::Scan
        | CollKind::ExclusiveScan => {}
    }
    s
}

/// The byte ranges `(offset, bytes)` of `me`'s output that its peers write,
/// in the order of [`Schedule::receives_from`].
pub(crate) fn incoming(
    kind: CollKind,
    n: usize,
    me: usize,
    root: usize,
    block: u64,
    in_place: bool,
) -> Vec<(u64, u64)> {
    schedule(kind, n, me, root, block, in_place)
        .receives_from
        .iter()
        .flat_map(|&p| {
            schedule(kind, n, p, root, block, in_place)
                .copies
                .into_iter()
                .filter(move |c| c.to == me)
                .map(|c| (c.dst_off, c.bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run every rank's schedule on byte vectors, the handshakes implied
    /// (stage, then every push), and return the outputs.
    fn run(
        kind: CollKind,
        n: usize,
        root: usize,
        block: u64,
        in_place: bool,
        inputs: &[Vec<u8>],
        outputs: &mut [Vec<u8>],
    ) {
        let scheds: Vec<Schedule> = (0..n)
            .map(|me| schedule(kind, n, me, root, block, in_place))
            .collect();
        let staged: Vec<Vec<u8>> = (0..n)
            .map(|me| {
                if scheds[me].stage_output {
                    outputs[me].clone()
                } else {
                    Vec::new()
                }
            })
            .collect();
        for (me, s) in scheds.iter().enumerate() {
            for c in &s.copies {
                let src = match c.source {
                    Source::Input => &inputs[me],
                    Source::Staged => &staged[me],
                };
                let (a, b) = (c.src_off as usize, (c.src_off + c.bytes) as usize);
                let data = src[a..b].to_vec();
                let d = c.dst_off as usize;
                outputs[c.to][d..d + data.len()].copy_from_slice(&data);
            }
        }
        // Handshakes pair up: whoever sends to p is in p's receive list.
        for (me, s) in scheds.iter().enumerate() {
            for &p in &s.sends_to {
                assert!(scheds[p].receives_from.contains(&me), "{kind:?} {me}->{p}");
            }
            for &p in &s.receives_from {
                assert!(scheds[p].sends_to.contains(&me), "{kind:?} {p}->{me}");
            }
        }
    }

    fn pattern(rank: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (rank * 37 + i * 11 + 1) as u8).collect()
    }

    #[test]
    fn every_collective_matches_its_definition() {
        for n in 1..=5 {
            for root in 0..n {
                for block in [0u64, 1, 3, 16] {
                    let b = block as usize;
                    for in_place in [false, true] {
                        check(CollKind::AllGather, n, root, b, in_place);
                        check(CollKind::AllToAll, n, root, b, in_place);
                        check(CollKind::Broadcast, n, root, b, in_place);
                        check(CollKind::Gather, n, root, b, in_place);
                        check(CollKind::Scatter, n, root, b, in_place);
                    }
                }
            }
        }
    }

    fn check(kind: CollKind, n: usize, root: usize, b: usize, in_place: bool) {
        let block = b as u64;
        // Input and output sizes per rank, and what each rank's output
        // must hold afterwards.
        let all = |me: usize| pattern(me, b * n);
        let (mut inputs, mut outputs, expected): (Vec<_>, Vec<_>, Vec<Vec<u8>>) = match kind {
            CollKind::AllGather => {
                let inputs: Vec<_> = (0..n).map(|r| pattern(r, b)).collect();
                let want: Vec<u8> = inputs.concat();
                (inputs, vec![vec![0xEE; b * n]; n], vec![want; n])
            }
            CollKind::AllToAll => {
                let inputs: Vec<_> = (0..n).map(all).collect();
                let want = (0..n)
                    .map(|me| {
                        (0..n)
                            .flat_map(|p| inputs[p][me * b..(me + 1) * b].to_vec())
                            .collect()
                    })
                    .collect();
                (inputs, vec![vec![0xEE; b * n]; n], want)
            }
            CollKind::Broadcast => {
                let inputs: Vec<_> = (0..n).map(|r| pattern(r, b)).collect();
                let want = vec![inputs[root].clone(); n];
                (inputs, vec![vec![0xEE; b]; n], want)
            }
            CollKind::Gather => {
                let inputs: Vec<_> = (0..n).map(|r| pattern(r, b)).collect();
                let mut outs = vec![vec![0xEE; b]; n];
                outs[root] = vec![0xEE; b * n];
                let mut want = outs.clone();
                want[root] = inputs.concat();
                (inputs, outs, want)
            }
            CollKind::Scatter => {
                let inputs: Vec<_> = (0..n).map(all).collect();
                let want = (0..n)
                    .map(|me| inputs[root][me * b..(me + 1) * b].to_vec())
                    .collect();
                (inputs, vec![vec![0xEE; b]; n], want)
            }
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::ReduceScatter
            | CollKind::Scan
            | CollKind::ExclusiveScan => {
                panic!("{kind:?} does not run on copy engines")
            }
        };
        if in_place && kind == CollKind::AllToAll {
            // In place the output holds the input.
            outputs = inputs.clone();
            inputs = vec![Vec::new(); n];
        }
        run(kind, n, root, block, in_place, &inputs, &mut outputs);
        if n == 1 || b == 0 {
            return;
        }
        assert_eq!(
            outputs, expected,
            "{kind:?} n={n} root={root} b={b} {in_place}"
        );
        // `incoming` lists exactly what peers write into each rank.
        for me in 0..n {
            let ranges = incoming(kind, n, me, root, block, in_place);
            assert_eq!(
                ranges.len(),
                schedule(kind, n, me, root, block, in_place)
                    .receives_from
                    .len()
            );
        }
    }
}
