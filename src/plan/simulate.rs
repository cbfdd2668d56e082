//! An in-memory multi-rank executor of plans, for tests: every rank's steps
//! run against bounded FIFOs (`fifo_slots` slots of `slot_elems` elements
//! per (channel, sender, receiver) connector), moving one slot-sized piece at
//! a time exactly as [`Flow`] and [`Step::Exchange`] document: a Flow piece
//! advances only when every receive peer has the piece and every send peer
//! has a free slot. Ranks and channels are visited in a seed-dependent
//! rotating order. The run fails on a deadlock (no progress possible), a
//! mismatched piece, an out-of-bounds region, a malformed step, or data left
//! in a FIFO at the end.

use super::{BufId, Flow, Plan, Region, Step};
use crate::op::Combine;
use std::collections::VecDeque;
use std::fmt::Debug;

/// An element type the simulator can reduce.
pub(crate) trait Elem: Copy + PartialEq + Debug {
    fn combine(self, other: Self, c: Combine) -> Self;
    /// The pre-op: multiply by the scalar.
    fn scale(self, s: f64) -> Self;
    /// The post-op: integer division truncating toward zero.
    fn div(self, d: u64) -> Self;
    /// A value that marks memory never written.
    fn poison() -> Self;
    /// A small deterministic test value (exact in every reduction used).
    fn gen(rank: usize, i: u64) -> Self;
}

impl Elem for i64 {
    fn combine(self, o: i64, c: Combine) -> i64 {
        match c {
            Combine::Sum => self.wrapping_add(o),
            Combine::Prod => self.wrapping_mul(o),
            Combine::Min => self.min(o),
            Combine::Max => self.max(o),
            Combine::BitAnd => self & o,
            Combine::BitOr => self | o,
            Combine::BitXor => self ^ o,
            Combine::LogicalAnd => ((self != 0) & (o != 0)) as i64,
            Combine::LogicalOr => ((self != 0) | (o != 0)) as i64,
            Combine::LogicalXor => ((self != 0) ^ (o != 0)) as i64,
        }
    }
    fn scale(self, s: f64) -> i64 {
        self.wrapping_mul(s as i64)
    }
    fn div(self, d: u64) -> i64 {
        self / d as i64
    }
    fn poison() -> i64 {
        -999_999_937
    }
    fn gen(rank: usize, i: u64) -> i64 {
        ((rank as i64 * 131 + i as i64 * 17 + 7) % 23) - 11
    }
}

impl Elem for f64 {
    fn combine(self, o: f64, c: Combine) -> f64 {
        match c {
            Combine::Sum => self + o,
            Combine::Prod => self * o,
            Combine::Min => self.min(o),
            Combine::Max => self.max(o),
            // Integer-only combines (the planner never looks at values).
            _ => f64::from_bits(i64::combine(self.to_bits() as i64, o.to_bits() as i64, c) as u64),
        }
    }
    fn scale(self, s: f64) -> f64 {
        self * s
    }
    fn div(self, d: u64) -> f64 {
        self / d as f64
    }
    fn poison() -> f64 {
        -1.0e300
    }
    fn gen(rank: usize, i: u64) -> f64 {
        i64::gen(rank, i) as f64
    }
}

/// One rank's memory. In place, `Input` regions address `output`.
#[derive(Debug, Clone)]
pub(crate) struct RankMem<T> {
    pub input: Vec<T>,
    pub output: Vec<T>,
    pub in_place: bool,
}

/// Connector FIFO geometry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fifo {
    pub slots: usize,
    pub slot_elems: u64,
}

struct Rank<T> {
    mem: RankMem<T>,
    scratch: Vec<T>,
}

impl<T: Elem> Rank<T> {
    fn buf(&mut self, b: BufId) -> &mut Vec<T> {
        match b {
            BufId::Input if !self.mem.in_place => &mut self.mem.input,
            BufId::Input | BufId::Output => &mut self.mem.output,
            BufId::Scratch => &mut self.scratch,
        }
    }

    fn read(&mut self, r: Region, at: u64, len: u64) -> Result<Vec<T>, String> {
        let buf = self.buf(r.buf);
        let lo = r.offset.checked_add(at).ok_or("offset overflow")?;
        let hi = lo.checked_add(len).ok_or("offset overflow")?;
        if hi > buf.len() as u64 {
            return Err(format!(
                "read {r:?}+{at} len {len} past {} elements",
                buf.len()
            ));
        }
        Ok(buf[lo as usize..hi as usize].to_vec())
    }

    fn write(&mut self, r: Region, at: u64, data: &[T]) -> Result<(), String> {
        let buf = self.buf(r.buf);
        let lo = r.offset.checked_add(at).ok_or("offset overflow")?;
        let hi = lo.checked_add(data.len() as u64).ok_or("offset overflow")?;
        if hi > buf.len() as u64 {
            return Err(format!(
                "write {r:?}+{at} len {} past {} elements",
                data.len(),
                buf.len()
            ));
        }
        buf[lo as usize..hi as usize].copy_from_slice(data);
        Ok(())
    }
}

/// Where one (rank, channel) stands.
#[derive(Default, Clone, Copy)]
struct Cursor {
    step: usize,
    /// Flow: elements done. Exchange: elements sent.
    a: u64,
    /// Exchange: elements received.
    b: u64,
}

/// Every connector's FIFO, indexed by (channel, sender, receiver).
struct Conns<T> {
    n: usize,
    fifos: Vec<VecDeque<Vec<T>>>,
}

impl<T> Conns<T> {
    fn new(nch: usize, n: usize) -> Conns<T> {
        Conns {
            n,
            fifos: (0..nch * n * n).map(|_| VecDeque::new()).collect(),
        }
    }

    fn at(&mut self, ch: usize, from: usize, to: usize) -> Result<&mut VecDeque<Vec<T>>, String> {
        if from >= self.n || to >= self.n {
            return Err(format!("peer out of range: {from} -> {to}"));
        }
        let i = (ch * self.n + from) * self.n + to;
        self.fifos
            .get_mut(i)
            .ok_or_else(|| format!("channel {ch} out of range"))
    }
}

fn check_flow(f: &Flow) -> Result<(), String> {
    let nsrc = usize::from(f.src.is_some()) + f.recv.len();
    if f.count == 0 {
        return Err("zero-count step".into());
    }
    if !f.reduce && nsrc != 1 {
        return Err(format!("copy flow needs exactly one input: {f:?}"));
    }
    if f.reduce && nsrc == 0 {
        return Err(format!("reduce flow without inputs: {f:?}"));
    }
    if f.pre_op && (!f.reduce || f.src.is_none()) {
        return Err(format!(
            "pre_op outside a reduction of a local source: {f:?}"
        ));
    }
    if f.post_op && !f.reduce {
        return Err(format!("post_op outside a reduction: {f:?}"));
    }
    if f.dst.is_none() && f.send.is_empty() {
        return Err(format!("flow without outputs: {f:?}"));
    }
    if f.acc && (!f.reduce || f.dst.is_none() || !f.send.is_empty()) {
        return Err(format!(
            "accumulating flow without a reduction into dst only: {f:?}"
        ));
    }
    Ok(())
}

/// Try to move one piece of rank `me`'s current step on channel slot `ci`.
/// Returns whether anything moved.
fn advance<T: Elem>(
    plans: &[Plan],
    ranks: &mut [Rank<T>],
    conns: &mut Conns<T>,
    cursors: &mut [Vec<Cursor>],
    fifo: Fifo,
    me: usize,
    ci: usize,
) -> Result<bool, String> {
    let plan = &plans[me];
    let work = &plan.channels[ci];
    let ch = work.channel;
    let cur = cursors[me][ci];
    let Some(step) = work.steps.get(cur.step) else {
        return Ok(false);
    };
    let ctx = |e: String| format!("rank {me} channel {ch} step {} {step:?}: {e}", cur.step);
    if step.count() > plan.chunk_elems {
        return Err(ctx(format!("count above chunk_elems {}", plan.chunk_elems)));
    }
    match *step {
        Step::Flow(f) => {
            check_flow(&f).map_err(ctx)?;
            let len = fifo.slot_elems.min(f.count - cur.a);
            for p in f.recv.iter() {
                match conns.at(ch, p, me).map_err(ctx)?.front() {
                    None => return Ok(false),
                    Some(piece) if piece.len() as u64 != len => {
                        return Err(ctx(format!(
                            "piece from {p} has {} elements, expected {len}",
                            piece.len()
                        )))
                    }
                    Some(_) => {}
                }
            }
            for q in f.send.iter() {
                if conns.at(ch, me, q).map_err(ctx)?.len() >= fifo.slots {
                    return Ok(false);
                }
            }
            let red = plan.reduction;
            let mut val: Option<Vec<T>> = match f.src {
                Some(r) => {
                    let mut v = ranks[me].read(r, cur.a, len).map_err(ctx)?;
                    if f.pre_op {
                        if let Some(s) = red.pre_scale {
                            v.iter_mut().for_each(|x| *x = x.scale(s));
                        }
                    }
                    Some(v)
                }
                None => None,
            };
            for p in f.recv.iter() {
                let piece = conns
                    .at(ch, p, me)
                    .map_err(ctx)?
                    .pop_front()
                    .expect("checked above");
                val = Some(match val {
                    None => piece,
                    Some(mut v) => {
                        for (x, y) in v.iter_mut().zip(piece) {
                            *x = x.combine(y, red.combine);
                        }
                        v
                    }
                });
            }
            let mut val = val.expect("checked: at least one input");
            if let (true, Some(d)) = (f.acc, f.dst) {
                let held = ranks[me].read(d, cur.a, len).map_err(ctx)?;
                for (x, h) in val.iter_mut().zip(held) {
                    *x = h.combine(*x, red.combine);
                }
            }
            if f.post_op {
                if let Some(d) = red.post_div {
                    val.iter_mut().for_each(|x| *x = x.div(d));
                }
            }
            if let Some(d) = f.dst {
                ranks[me].write(d, cur.a, &val).map_err(ctx)?;
            }
            for q in f.send.iter() {
                conns.at(ch, me, q).map_err(ctx)?.push_back(val.clone());
            }
            let c = &mut cursors[me][ci];
            c.a += len;
            if c.a == f.count {
                *c = Cursor {
                    step: c.step + 1,
                    ..Cursor::default()
                };
            }
            Ok(true)
        }
        Step::Exchange {
            to,
            src,
            from,
            dst,
            count,
        } => {
            if count == 0 {
                return Err(ctx("zero-count step".into()));
            }
            if to == me || from == me {
                return Err(ctx("exchange with self".into()));
            }
            let mut moved = false;
            let mut c = cur;
            if c.a < count && conns.at(ch, me, to).map_err(ctx)?.len() < fifo.slots {
                let len = fifo.slot_elems.min(count - c.a);
                let v = ranks[me].read(src, c.a, len).map_err(ctx)?;
                conns.at(ch, me, to).map_err(ctx)?.push_back(v);
                c.a += len;
                moved = true;
            }
            if c.b < count {
                let len = fifo.slot_elems.min(count - c.b);
                let q = conns.at(ch, from, me).map_err(ctx)?;
                if let Some(piece) = q.front() {
                    if piece.len() as u64 != len {
                        return Err(ctx(format!(
                            "piece from {from} has {} elements, expected {len}",
                            piece.len()
                        )));
                    }
                    let piece = q.pop_front().expect("front exists");
                    ranks[me].write(dst, c.b, &piece).map_err(ctx)?;
                    c.b += len;
                    moved = true;
                }
            }
            if c.a == count && c.b == count {
                c = Cursor {
                    step: c.step + 1,
                    ..Cursor::default()
                };
            }
            cursors[me][ci] = c;
            Ok(moved)
        }
        Step::Rail {
            region,
            count,
            rail,
        } => {
            if count == 0 {
                return Err(ctx("zero-count step".into()));
            }
            rail_step(plans, ranks, cursors, ci, (ch, region, count, rail)).map_err(ctx)
        }
    }
}

/// A rail step: runs once every member of the rail (the ranks whose plans
/// have rail steps of `rail` on this channel) stands at one; then the
/// members' regions are combined in rank order and written back to all.
fn rail_step<T: Elem>(
    plans: &[Plan],
    ranks: &mut [Rank<T>],
    cursors: &mut [Vec<Cursor>],
    ci: usize,
    (ch, _region, count, rail): (usize, Region, u64, u32),
) -> Result<bool, String> {
    let members: Vec<usize> = (0..plans.len())
        .filter(|&r| {
            plans[r].channels.get(ci).is_some_and(|cw| {
                cw.channel == ch
                    && cw
                        .steps
                        .iter()
                        .any(|s| matches!(s, Step::Rail { rail: x, .. } if *x == rail))
            })
        })
        .collect();
    let mut regions = Vec::with_capacity(members.len());
    for &m in &members {
        let cur = cursors[m][ci];
        match plans[m].channels[ci].steps.get(cur.step) {
            Some(&Step::Rail {
                region: r,
                count: k,
                rail: x,
            }) if x == rail => {
                if k != count {
                    return Err(format!(
                        "rail {rail}: rank {m} reduces {k} elements, another {count}"
                    ));
                }
                regions.push(r);
            }
            // Not there yet (or never: the deadlock check reports it).
            _ => return Ok(false),
        }
    }
    let red = plans[members[0]].reduction;
    let mut val: Option<Vec<T>> = None;
    for (&m, &r) in members.iter().zip(&regions) {
        let v = ranks[m].read(r, 0, count)?;
        val = Some(match val {
            None => v,
            Some(mut acc) => {
                for (x, y) in acc.iter_mut().zip(v) {
                    *x = x.combine(y, red.combine);
                }
                acc
            }
        });
    }
    let val = val.ok_or("a rail without members")?;
    for (&m, &r) in members.iter().zip(&regions) {
        ranks[m].write(r, 0, &val)?;
        cursors[m][ci] = Cursor {
            step: cursors[m][ci].step + 1,
            ..Cursor::default()
        };
    }
    Ok(true)
}

/// Run every rank's plan (`plans[r]` is rank `r`'s) and return each rank's
/// output buffer (for in-place ranks, the shared buffer).
pub(crate) fn simulate<T: Elem>(
    plans: &[Plan],
    mems: Vec<RankMem<T>>,
    fifo: Fifo,
    seed: u64,
) -> Result<Vec<Vec<T>>, String> {
    let n = plans.len();
    assert_eq!(mems.len(), n);
    let first = &plans[0];
    for (r, p) in plans.iter().enumerate() {
        let ids: Vec<usize> = p.channels.iter().map(|c| c.channel).collect();
        let want: Vec<usize> = (0..p.channels.len()).collect();
        if ids != want {
            return Err(format!("rank {r}: channel ids {ids:?}"));
        }
        if (
            p.channels.len(),
            p.algorithm,
            p.protocol,
            p.chunk_elems,
            p.scratch_elems,
        ) != (
            first.channels.len(),
            first.algorithm,
            first.protocol,
            first.chunk_elems,
            first.scratch_elems,
        ) {
            return Err(format!("rank {r}: plan shape differs from rank 0"));
        }
    }
    let mut ranks: Vec<Rank<T>> = mems
        .into_iter()
        .zip(plans)
        .map(|(mem, p)| Rank {
            mem,
            scratch: vec![T::poison(); p.scratch_elems as usize],
        })
        .collect();
    let mut cursors: Vec<Vec<Cursor>> = plans
        .iter()
        .map(|p| vec![Cursor::default(); p.channels.len()])
        .collect();
    let mut conns: Conns<T> = Conns::new(first.channels.len(), n);
    let units: Vec<(usize, usize)> = plans
        .iter()
        .enumerate()
        .flat_map(|(r, p)| (0..p.channels.len()).map(move |c| (r, c)))
        .collect();
    let mut rng = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        rng >> 33
    };
    loop {
        let done = units
            .iter()
            .all(|&(r, c)| cursors[r][c].step >= plans[r].channels[c].steps.len());
        if done {
            break;
        }
        let mut progress = false;
        let start = if units.is_empty() {
            0
        } else {
            next() as usize % units.len()
        };
        let reverse = next() % 2 == 0;
        for i in 0..units.len() {
            let j = if reverse {
                (start + units.len() - i) % units.len()
            } else {
                (start + i) % units.len()
            };
            let (r, c) = units[j];
            let burst = 1 + next() % 4;
            for _ in 0..burst {
                if advance(plans, &mut ranks, &mut conns, &mut cursors, fifo, r, c)? {
                    progress = true;
                } else {
                    break;
                }
            }
        }
        if !progress {
            let mut msg = String::from("deadlock:");
            for &(r, c) in &units {
                let cur = cursors[r][c];
                if let Some(s) = plans[r].channels[c].steps.get(cur.step) {
                    msg += &format!(
                        "\n  rank {r} ch {c} step {} (+{}/{}) {s:?}",
                        cur.step, cur.a, cur.b
                    );
                }
            }
            return Err(msg);
        }
    }
    for (i, q) in conns.fifos.iter().enumerate() {
        if !q.is_empty() {
            let (ch, from, to) = (i / (n * n), i / n % n, i % n);
            return Err(format!(
                "{} pieces left on channel {ch} from {from} to {to}",
                q.len()
            ));
        }
    }
    Ok(ranks.into_iter().map(|r| r.mem.output).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::Datatype;
    use crate::graph::Graph;
    use crate::op::{ReduceOp, Reduction};
    use crate::plan::build;
    use crate::task::{CollKind, Task};
    use crate::topo::Topology;
    use crate::tune::caps::{BackendCaps, LinkCost};
    use crate::tune::{Algorithm, Choice, Protocol};

    /// FIFO/chunk geometries (bytes): (nchannels, chunk, slot, fifo slots).
    const GEOMS: [(usize, u64, u64, u64); 3] = [
        (1, 16, 16, 2),      // chunk = one slot = half the FIFO: the tightest
        (3, 48, 32, 4),      // chunks of 1.5 slots, three channels
        (2, 1 << 20, 64, 8), // chunk clamped to half the FIFO
    ];

    fn caps(slot: u64, slots: u64) -> BackendCaps {
        BackendCaps {
            protocols: vec![Protocol::Simple],
            direct_protocols: vec![Protocol::Simple],
            max_channels: 8,
            slot_bytes: slot,
            fifo_slots: slots,
            intra: LinkCost {
                latency_us: 1.0,
                bandwidth_gbs: 1.0,
            },
            inter: LinkCost {
                latency_us: 1.0,
                bandwidth_gbs: 1.0,
            },
            launch_us: 1.0,
            direct: true,
            collnet: false,
            rail: crate::tune::caps::links::MPI_RAIL,
        }
    }

    struct Case {
        kind: CollKind,
        keys: Vec<u64>,
        count: u64,
        in_place: bool,
        geom: (usize, u64, u64, u64),
        op: ReduceOp,
        algo: Algorithm,
        root: usize,
        seed: u64,
    }

    /// Expected buffer of every rank, computed directly.
    fn expected<T: Elem>(c: &Case, n: usize, dtype: Datatype, mems: &[RankMem<T>]) -> Vec<Vec<T>> {
        let count = c.count as usize;
        let red = Reduction::lower(c.op, dtype, n);
        let input = |r: usize, i: usize| T::gen(r, i as u64);
        let reduce_at = |block: usize, i: usize| {
            let mut acc: Option<T> = None;
            for r in 0..n {
                let mut v = input(r, block * count + i);
                if let Some(s) = red.pre_scale {
                    v = v.scale(s);
                }
                acc = Some(match acc {
                    None => v,
                    Some(a) => a.combine(v, red.combine),
                });
            }
            let mut v = acc.unwrap();
            if let Some(d) = red.post_div {
                v = v.div(d);
            }
            v
        };
        (0..n)
            .map(|r| {
                let mut out = mems[r].output.clone();
                let root = r == c.root;
                match c.kind {
                    CollKind::AllReduce => (0..count).for_each(|i| out[i] = reduce_at(0, i)),
                    CollKind::Reduce if root => (0..count).for_each(|i| out[i] = reduce_at(0, i)),
                    CollKind::Reduce => {}
                    CollKind::Broadcast => (0..count).for_each(|i| out[i] = input(c.root, i)),
                    CollKind::AllGather => {
                        (0..n * count).for_each(|j| out[j] = input(j / count, j % count))
                    }
                    CollKind::ReduceScatter => (0..count).for_each(|i| out[i] = reduce_at(r, i)),
                    CollKind::AllToAll => (0..n * count)
                        .for_each(|j| out[j] = input(j / count, r * count + j % count)),
                    CollKind::Gather if root => {
                        (0..n * count).for_each(|j| out[j] = input(j / count, j % count))
                    }
                    CollKind::Gather => {}
                    CollKind::Scatter if root && c.in_place => {}
                    CollKind::Scatter => {
                        (0..count).for_each(|i| out[i] = input(c.root, r * count + i))
                    }
                }
                out
            })
            .collect()
    }

    fn run<T: Elem>(c: &Case, dtype: Datatype) -> Result<(), String> {
        let topo = Topology::from_node_keys(0, &c.keys);
        let n = topo.nranks;
        let graph = Graph::new(&topo);
        let (nch, chunk, slot, slots) = c.geom;
        let caps = caps(slot, slots);
        let choice = Choice {
            algorithm: c.algo,
            protocol: Protocol::Simple,
            nchannels: nch,
            chunk_bytes: chunk,
        };
        let mut plans = Vec::new();
        let mut mems = Vec::new();
        for r in 0..n {
            let rooted_only = matches!(c.kind, CollKind::Gather | CollKind::Scatter);
            let in_place = c.in_place && (!rooted_only || r == c.root);
            let task = Task {
                kind: c.kind,
                dtype,
                op: c.op,
                count: c.count,
                root: c.root,
                in_place,
            };
            plans.push(build(&task, &topo.as_rank(r), &graph, &choice, &caps));
            let ilen = task.input_len(r, n) as usize;
            let olen = task.output_len(r, n) as usize;
            let input: Vec<T> = (0..ilen as u64).map(|i| T::gen(r, i)).collect();
            let mem = if in_place {
                let mut buf = vec![T::poison(); ilen.max(olen)];
                match c.kind {
                    CollKind::AllGather | CollKind::Gather => {
                        let at = r * c.count as usize;
                        buf[at..at + ilen].copy_from_slice(&input);
                    }
                    _ => buf[..ilen].copy_from_slice(&input),
                }
                RankMem {
                    input: Vec::new(),
                    output: buf,
                    in_place,
                }
            } else {
                RankMem {
                    input,
                    output: vec![T::poison(); olen],
                    in_place,
                }
            };
            mems.push(mem);
        }
        let want = expected(c, n, dtype, &mems);
        let fifo = Fifo {
            slots: slots as usize,
            slot_elems: (slot / dtype.size() as u64).max(1),
        };
        let got = simulate(&plans, mems, fifo, c.seed)?;
        for r in 0..n {
            let (g, w) = if c.kind == CollKind::ReduceScatter && c.in_place {
                let k = c.count as usize;
                (&got[r][..k], &want[r][..k])
            } else {
                (&got[r][..], &want[r][..])
            };
            if g != w {
                let i = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "rank {r}: mismatch at {i}: got {:?} want {:?} (algo {})",
                    g.get(i),
                    w.get(i),
                    plans[r].algorithm
                ));
            }
        }
        Ok(())
    }

    fn topologies(n: usize) -> Vec<Vec<u64>> {
        let mut v = vec![vec![0; n]];
        if n >= 2 {
            v.push((0..n).map(|r| (r % 2) as u64).collect());
        }
        if n >= 3 {
            v.push((0..n).map(|r| (r * 3 / n) as u64).collect());
        }
        v
    }

    const COUNTS: [u64; 9] = [0, 1, 2, 3, 7, 13, 64, 1000, 4099];

    fn sweep(kind: CollKind, algos: &[Algorithm]) {
        let mut failures = Vec::new();
        let mut cases = 0usize;
        for n in 1..=8usize {
            let topos = topologies(n);
            for (ti, keys) in topos.iter().enumerate() {
                for &count in &COUNTS {
                    let big = count >= 1000;
                    // Large counts: only the most irregular placement.
                    if big && ti + 1 != topos.len() {
                        continue;
                    }
                    for in_place in [false, true] {
                        for (gi, &geom) in GEOMS.iter().enumerate() {
                            // Large counts: skip the one-slot geometry except
                            // on a few sizes to bound the runtime.
                            if big && gi == 0 && n % 3 != 1 {
                                continue;
                            }
                            for &algo in algos {
                                let ops: Vec<(ReduceOp, bool)> = if !kind.reduces() {
                                    vec![(ReduceOp::Sum, false)]
                                } else if big {
                                    // One op per case, alternating.
                                    if (n + usize::from(in_place)) % 2 == 0 {
                                        vec![(ReduceOp::Avg, false)]
                                    } else {
                                        vec![(ReduceOp::PreMulSum(2.0), true)]
                                    }
                                } else {
                                    vec![
                                        (ReduceOp::Sum, false),
                                        (ReduceOp::Max, false),
                                        (ReduceOp::Avg, false),
                                        (ReduceOp::PreMulSum(2.0), true),
                                    ]
                                };
                                for (op, float) in ops {
                                    cases += 1;
                                    let c = Case {
                                        kind,
                                        keys: keys.clone(),
                                        count,
                                        in_place,
                                        geom,
                                        op,
                                        algo,
                                        root: (count as usize + n / 2) % n,
                                        seed: cases as u64,
                                    };
                                    let res = if float || !kind.reduces() && count % 2 == 1 {
                                        run::<f64>(&c, Datatype::F64)
                                    } else {
                                        run::<i64>(&c, Datatype::I64)
                                    };
                                    if let Err(e) = res {
                                        failures.push(format!(
                                            "{} n={n} keys={keys:?} count={count} in_place={in_place} geom={geom:?} algo={algo} op={op}: {e}",
                                            kind.name()
                                        ));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {cases} cases failed:\n{}",
            failures.len(),
            failures
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn all_reduce_ring() {
        sweep(CollKind::AllReduce, &[Algorithm::Ring]);
    }

    #[test]
    fn all_reduce_tree() {
        sweep(CollKind::AllReduce, &[Algorithm::Tree]);
    }

    #[test]
    fn all_reduce_direct() {
        sweep(CollKind::AllReduce, &[Algorithm::Direct]);
    }

    #[test]
    fn all_reduce_collnet() {
        sweep(CollKind::AllReduce, &[Algorithm::CollNet]);
    }

    #[test]
    fn collnet_plans_have_rails_on_even_nodes_only() {
        let plan_of = |keys: &[u64]| {
            let topo = Topology::from_node_keys(0, keys);
            let task = Task {
                kind: CollKind::AllReduce,
                dtype: Datatype::F32,
                op: ReduceOp::Sum,
                count: 1000,
                root: 0,
                in_place: false,
            };
            let choice = Choice {
                algorithm: Algorithm::CollNet,
                protocol: Protocol::Simple,
                nchannels: 2,
                chunk_bytes: 256,
            };
            build(&task, &topo, &Graph::new(&topo), &choice, &caps(64, 8))
        };
        let rails = |p: &Plan| {
            p.channels
                .iter()
                .flat_map(|c| &c.steps)
                .filter(|s| matches!(s, Step::Rail { .. }))
                .count()
        };
        let even = plan_of(&[0, 0, 1, 1]);
        assert_eq!(even.algorithm, Algorithm::CollNet);
        assert!(rails(&even) > 0);
        for keys in [&[0u64, 0, 1][..], &[0, 0, 0, 0]] {
            let p = plan_of(keys);
            assert_eq!(p.algorithm, Algorithm::Ring, "{keys:?}");
            assert_eq!(rails(&p), 0);
        }
    }

    #[test]
    fn all_reduce_oneshot() {
        sweep(CollKind::AllReduce, &[Algorithm::OneShot]);
    }

    #[test]
    fn reduce() {
        sweep(CollKind::Reduce, &[Algorithm::Ring]);
    }

    #[test]
    fn broadcast() {
        sweep(CollKind::Broadcast, &[Algorithm::Ring]);
    }

    #[test]
    fn all_gather() {
        sweep(CollKind::AllGather, &[Algorithm::Ring]);
    }

    #[test]
    fn reduce_scatter() {
        sweep(CollKind::ReduceScatter, &[Algorithm::Ring]);
    }

    #[test]
    fn all_to_all() {
        sweep(CollKind::AllToAll, &[Algorithm::Direct]);
    }

    #[test]
    fn gather() {
        sweep(CollKind::Gather, &[Algorithm::Direct]);
    }

    #[test]
    fn scatter() {
        sweep(CollKind::Scatter, &[Algorithm::Direct]);
    }

    #[test]
    fn mismatched_algorithm_falls_back() {
        // A choice that does not apply to the collective is replaced.
        let topo = Topology::single_node(0, 4);
        let g = Graph::new(&topo);
        let c = caps(64, 8);
        let choice = Choice {
            algorithm: Algorithm::Tree,
            protocol: Protocol::Simple,
            nchannels: 2,
            chunk_bytes: 256,
        };
        let t = |kind| Task {
            kind,
            dtype: Datatype::F32,
            op: ReduceOp::Sum,
            count: 100,
            root: 1,
            in_place: false,
        };
        assert_eq!(
            build(&t(CollKind::AllGather), &topo, &g, &choice, &c).algorithm,
            Algorithm::Ring
        );
        assert_eq!(
            build(&t(CollKind::Gather), &topo, &g, &choice, &c).algorithm,
            Algorithm::Direct
        );
        let p = build(&t(CollKind::Broadcast), &topo, &g, &choice, &c);
        assert_eq!(p.chunk_elems, 64);
        assert_eq!(p.channels.len(), 2);
        let empty = build(
            &Task {
                count: 0,
                ..t(CollKind::AllReduce)
            },
            &topo,
            &g,
            &choice,
            &c,
        );
        assert!(empty.channels.is_empty());
    }

    #[test]
    fn simulator_detects_broken_plans() {
        use crate::plan::{ChannelWork, Peers};
        let task = Task {
            kind: CollKind::Broadcast,
            dtype: Datatype::I64,
            op: ReduceOp::Sum,
            count: 4,
            root: 0,
            in_place: false,
        };
        let plan = |steps: Vec<Step>| Plan {
            task,
            reduction: Reduction::lower(ReduceOp::Sum, Datatype::I64, 2),
            algorithm: Algorithm::Ring,
            protocol: Protocol::Simple,
            chunk_elems: 4,
            scratch_elems: 0,
            channels: vec![ChannelWork { channel: 0, steps }],
        };
        let recv = |from, count| {
            Step::Flow(Flow {
                recv: Peers::one(from),
                dst: Some(Region::output(0)),
                ..crate::plan::ctx::flow(count)
            })
        };
        let send = |to, count| {
            Step::Flow(Flow {
                send: Peers::one(to),
                src: Some(Region::input(0)),
                ..crate::plan::ctx::flow(count)
            })
        };
        let mems = || {
            (0..2)
                .map(|r| RankMem {
                    input: (0..4).map(|i| i64::gen(r, i)).collect(),
                    output: vec![0; 4],
                    in_place: false,
                })
                .collect::<Vec<_>>()
        };
        let fifo = Fifo {
            slots: 2,
            slot_elems: 1,
        };
        // Both receive first.
        let p = vec![
            plan(vec![recv(1, 4), send(1, 4)]),
            plan(vec![recv(0, 4), send(0, 4)]),
        ];
        assert!(simulate(&p, mems(), fifo, 1)
            .unwrap_err()
            .starts_with("deadlock"));
        // Both send first: fine while a message fits the FIFO, a deadlock
        // beyond.
        let p = vec![
            plan(vec![send(1, 2), recv(1, 2)]),
            plan(vec![send(0, 2), recv(0, 2)]),
        ];
        let out = simulate(&p, mems(), fifo, 1).unwrap();
        assert_eq!(out[0][..2], mems()[1].input[..2]);
        let p = vec![
            plan(vec![send(1, 4), recv(1, 4)]),
            plan(vec![send(0, 4), recv(0, 4)]),
        ];
        assert!(simulate(&p, mems(), fifo, 1)
            .unwrap_err()
            .starts_with("deadlock"));
        // Mismatched sizes and leftovers.
        let p = vec![plan(vec![send(1, 4)]), plan(vec![recv(0, 3)])];
        assert!(simulate(&p, mems(), fifo, 1).is_err());
        let p = vec![plan(vec![send(1, 2)]), plan(vec![])];
        assert!(simulate(&p, mems(), fifo, 1).unwrap_err().contains("left"));
        // Out of bounds.
        let p = vec![plan(vec![send(1, 5)]), plan(vec![recv(0, 5)])];
        assert!(simulate(&p, mems(), fifo, 1).is_err());
    }
}
