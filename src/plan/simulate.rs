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
mod tests;
