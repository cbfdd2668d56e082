//! The planner swept through the simulator: every collective and
//! algorithm over rank counts, placements, sizes, geometries and ops.
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
        oneshot_protocols: vec![Protocol::Simple],
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
        oneshot_max_bytes: crate::tune::model::ONESHOT_MAX_BYTES,
        collnet: false,
        rail: crate::tune::caps::links::MPI_RAIL,
        copy_engine: None,
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
    // The reduction of element `i` of `block` over ranks `0..upto`.
    let reduce_upto = |block: usize, i: usize, upto: usize| {
        let mut acc: Option<T> = None;
        for r in 0..upto {
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
    let reduce_at = |block: usize, i: usize| reduce_upto(block, i, n);
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
                CollKind::AllToAll => {
                    (0..n * count).for_each(|j| out[j] = input(j / count, r * count + j % count))
                }
                CollKind::Gather if root => {
                    (0..n * count).for_each(|j| out[j] = input(j / count, j % count))
                }
                CollKind::Gather => {}
                CollKind::Scatter if root && c.in_place => {}
                CollKind::Scatter => (0..count).for_each(|i| out[i] = input(c.root, r * count + i)),
                CollKind::Scan => (0..count).for_each(|i| out[i] = reduce_upto(0, i, r + 1)),
                // Rank 0's output keeps what it held (poison, or its input
                // in place).
                CollKind::ExclusiveScan if r == 0 => {}
                CollKind::ExclusiveScan => (0..count).for_each(|i| out[i] = reduce_upto(0, i, r)),
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
                CollKind::AllReduce
                | CollKind::Reduce
                | CollKind::Broadcast
                | CollKind::ReduceScatter
                | CollKind::AllToAll
                | CollKind::Scatter
                | CollKind::Scan
                | CollKind::ExclusiveScan => buf[..ilen].copy_from_slice(&input),
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
                            } else if kind.is_scan() {
                                // Avg is refused for prefixes (coll/check.rs).
                                if big {
                                    vec![if (n + usize::from(in_place)) % 2 == 0 {
                                        (ReduceOp::Prod, false)
                                    } else {
                                        (ReduceOp::PreMulSum(2.0), true)
                                    }]
                                } else {
                                    vec![
                                        (ReduceOp::Sum, false),
                                        (ReduceOp::Max, false),
                                        (ReduceOp::Prod, false),
                                        (ReduceOp::PreMulSum(2.0), true),
                                        (ReduceOp::PreMulSum(-3.0), false),
                                    ]
                                }
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
    sweep(CollKind::AllReduce, &[Algorithm::Pairwise]);
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
    sweep(CollKind::AllToAll, &[Algorithm::Pairwise]);
}

#[test]
fn gather() {
    sweep(CollKind::Gather, &[Algorithm::Pairwise]);
}

#[test]
fn scatter() {
    sweep(CollKind::Scatter, &[Algorithm::Pairwise]);
}

#[test]
fn scan() {
    sweep(
        CollKind::Scan,
        &[Algorithm::Ring, Algorithm::OneShot, Algorithm::Tree],
    );
}

#[test]
fn exclusive_scan() {
    sweep(
        CollKind::ExclusiveScan,
        &[Algorithm::Ring, Algorithm::OneShot, Algorithm::Pairwise],
    );
}

/// The chain's cost: exclusive_scan moves at most twice scan's messages,
/// rank 0 of exclusive_scan never writes its output, and in place rank 0
/// of an unscaled scan writes nothing either.
#[test]
fn scan_chains_move_what_they_must() {
    let topo = Topology::single_node(0, 5);
    let g = Graph::new(&topo);
    let choice = Choice {
        algorithm: Algorithm::Ring,
        protocol: Protocol::Simple,
        nchannels: 2,
        chunk_bytes: 64,
    };
    let c = caps(32, 4);
    let steps = |kind, rank: usize, in_place, op| {
        let t = Task {
            kind,
            dtype: Datatype::I64,
            op,
            count: 100,
            root: 0,
            in_place,
        };
        build(&t, &topo.as_rank(rank), &g, &choice, &c)
            .channels
            .into_iter()
            .flat_map(|cw| cw.steps)
            .map(|s| match s {
                Step::Flow(f) => f,
                other => panic!("not a flow: {other:?}"),
            })
            .collect::<Vec<Flow>>()
    };
    let sent = |fl: &[Flow]| {
        fl.iter()
            .filter(|f| !f.send.is_empty())
            .map(|f| f.count)
            .sum::<u64>()
    };
    for r in 0..5 {
        let scan = steps(CollKind::Scan, r, false, ReduceOp::Sum);
        let ex = steps(CollKind::ExclusiveScan, r, false, ReduceOp::Sum);
        // scan: P_r once; exclusive_scan: x_r, then P_r (rank 0: x_0 only).
        let (want, want_ex) = match r {
            0 => (100, 100),
            4 => (0, 0),
            _ => (100, 200),
        };
        assert_eq!(sent(&scan), want, "rank {r}");
        assert_eq!(sent(&ex), want_ex, "rank {r}");
        for f in scan.iter().chain(&ex) {
            assert!(f.recv.iter().all(|p| p + 1 == r) && f.send.iter().all(|p| p == r + 1));
        }
    }
    assert!(steps(CollKind::ExclusiveScan, 0, false, ReduceOp::Sum)
        .iter()
        .chain(&steps(CollKind::ExclusiveScan, 0, true, ReduceOp::Sum))
        .all(|f| f.dst.is_none()));
    assert!(steps(CollKind::Scan, 0, true, ReduceOp::Sum)
        .iter()
        .all(|f| f.dst.is_none()));
    assert!(steps(CollKind::Scan, 0, true, ReduceOp::PreMulSum(2.0))
        .iter()
        .all(|f| f.dst.is_some()));
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
        Algorithm::Pairwise
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
