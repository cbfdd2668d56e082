//! The interpreter run by several "ranks" as threads of this process, over
//! heap regions laid out like the shared memory segments.

use super::*;
use crate::backend::host::fifo::tests::Region as HeapRegion;
use crate::backend::host::shm::SegLayout;
use crate::backend::{BoundPlan, Launch};
use crate::buffer::{Buffer, BufferMut};
use crate::datatype::Datatype;
use crate::op::ReduceOp;
use crate::op::Reduction;
use crate::plan::Plan;
use crate::plan::{ChannelWork, Peers};
use crate::task::{CollKind, Task};
use crate::tune::{Algorithm, Protocol};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

struct World {
    n: usize,
    layout: SegLayout,
    /// One "segment" per rank: the connectors it receives in.
    regions: Vec<HeapRegion>,
    abort: AtomicBool,
}

impl World {
    fn new(n: usize, slot_bytes: usize) -> World {
        let layout = SegLayout {
            slots: fifo::FIFO_SLOTS,
            slot_bytes,
            channels: 2,
            local_size: n,
        };
        World {
            n,
            layout,
            regions: (0..n).map(|_| HeapRegion::new(layout.total())).collect(),
            abort: AtomicBool::new(false),
        }
    }

    fn fabric(&self, rank: usize, timeout: Duration) -> MockFab<'_> {
        MockFab {
            w: self,
            rank,
            timeout,
            net: (0..self.layout.channels)
                .map(|_| Mutex::default())
                .collect(),
            failed: Mutex::new(None),
        }
    }
}

struct MockFab<'w> {
    w: &'w World,
    rank: usize,
    timeout: Duration,
    net: Vec<Mutex<ChannelNet>>,
    failed: Mutex<Option<String>>,
}

impl Fabric for MockFab<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn nranks(&self) -> usize {
        self.w.n
    }
    fn channels(&self) -> usize {
        self.w.layout.channels
    }
    fn slot_bytes(&self) -> usize {
        self.w.layout.slot_bytes
    }
    fn fifo_slots(&self) -> usize {
        self.w.layout.slots
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn shm_send(&self, channel: usize, peer: usize) -> Option<FifoConn<'_>> {
        let l = &self.w.layout;
        Some(self.w.regions[peer].conn_at(
            l.connector_offset(channel, self.rank),
            l.slots,
            l.slot_bytes,
        ))
    }
    fn shm_recv(&self, channel: usize, peer: usize) -> Option<FifoConn<'_>> {
        let l = &self.w.layout;
        Some(self.w.regions[self.rank].conn_at(
            l.connector_offset(channel, peer),
            l.slots,
            l.slot_bytes,
        ))
    }
    fn comm(&self) -> Option<&MpiComm> {
        None
    }
    fn net(&self, channel: usize) -> &Mutex<ChannelNet> {
        &self.net[channel]
    }
    fn rail(&self) -> Option<u32> {
        None
    }
    fn rail_comm(&self, _channel: usize) -> Option<&MpiComm> {
        None
    }
    fn check_abort(&self) -> Result<()> {
        if let Some(r) = self.failed.lock().unwrap().clone() {
            return Err(Error::CommunicatorFailed(r));
        }
        if self.w.abort.load(Ordering::Acquire) {
            return Err(Error::PeerFailed("test abort".into()));
        }
        Ok(())
    }
    fn fail(&self, err: &Error) {
        self.failed
            .lock()
            .unwrap()
            .get_or_insert_with(|| err.to_string());
        self.w.abort.store(true, Ordering::Release);
    }
}

fn plan(
    kind: CollKind,
    dtype: Datatype,
    op: ReduceOp,
    n: usize,
    count: u64,
    channels: Vec<Vec<Step>>,
) -> Arc<Plan> {
    Arc::new(Plan {
        task: Task {
            kind,
            dtype,
            op,
            count,
            root: 0,
            in_place: false,
        },
        reduction: Reduction::lower(op, dtype, n),
        algorithm: Algorithm::Ring,
        protocol: Protocol::Simple,
        chunk_elems: count,
        scratch_elems: 0,
        channels: channels
            .into_iter()
            .enumerate()
            .map(|(channel, steps)| ChannelWork { channel, steps })
            .collect(),
    })
}

fn flow(recv: Peers, send: Peers, src: Option<Region>, dst: Option<Region>, count: u64) -> Flow {
    Flow {
        recv,
        send,
        src,
        dst,
        count,
        reduce: true,
        pre_op: src.is_some(),
        post_op: false,
        acc: false,
    }
}

/// Ring all_reduce of elements `[base, base+len)` for rank `r` of `n`, in
/// chunks whose blocks fit half a FIFO (as the planner guarantees: a
/// send-only step must complete before the peer starts receiving).
fn ring_allreduce(r: usize, n: usize, base: u64, len: u64) -> Vec<Step> {
    // Blocks of at most 32 elements: 4 slots of 64 bytes for any dtype.
    let chunk = 32 * n as u64;
    let mut steps = Vec::new();
    let mut c = base;
    while c < base + len {
        let clen = chunk.min(base + len - c);
        steps.extend(ring_chunk(r, n, c, clen));
        c += clen;
    }
    steps
}

/// One chunk of a ring all_reduce.
fn ring_chunk(r: usize, n: usize, base: u64, len: u64) -> Vec<Step> {
    let blk = |b: usize| {
        let lo = base + b as u64 * len / n as u64;
        let hi = base + (b as u64 + 1) * len / n as u64;
        (lo, hi - lo)
    };
    if n == 1 {
        let mut f = flow(
            Peers::NONE,
            Peers::NONE,
            Some(Region::input(base)),
            Some(Region::output(base)),
            len,
        );
        f.post_op = true;
        return vec![Step::Flow(f)];
    }
    let (next, prev) = (Peers::one((r + 1) % n), Peers::one((r + n - 1) % n));
    let mut steps = Vec::new();
    let (o, c) = blk(r);
    steps.push(Step::Flow(flow(
        Peers::NONE,
        next,
        Some(Region::input(o)),
        None,
        c,
    )));
    for s in 1..n - 1 {
        let (o, c) = blk((r + n - s) % n);
        steps.push(Step::Flow(flow(
            prev,
            next,
            Some(Region::input(o)),
            None,
            c,
        )));
    }
    let (o, c) = blk((r + 1) % n);
    let mut last = flow(
        prev,
        next,
        Some(Region::input(o)),
        Some(Region::output(o)),
        c,
    );
    last.post_op = true;
    steps.push(Step::Flow(last));
    for s in 0..n - 1 {
        let (o, c) = blk((r + n - s) % n);
        let send = if s < n - 2 { next } else { Peers::NONE };
        let mut f = flow(prev, send, None, Some(Region::output(o)), c);
        f.reduce = false;
        steps.push(Step::Flow(f));
    }
    steps
}

/// Run one launch per rank on threads; per-rank results.
#[allow(clippy::too_many_arguments)]
fn run_ranks<T: crate::datatype::Equivalence + Default>(
    w: &World,
    timeout: Duration,
    parallel: bool,
    inputs: &[Vec<T>],
    out_len: usize,
    in_place: bool,
    seq_of: impl Fn(usize) -> u64 + Sync,
    plan_of: impl Fn(usize) -> Arc<Plan> + Sync,
) -> Vec<(Result<()>, Vec<T>)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..w.n)
            .map(|r| {
                let (seq_of, plan_of) = (&seq_of, &plan_of);
                let input = inputs[r].clone();
                s.spawn(move || {
                    let fab = w.fabric(r, timeout);
                    let mut input = input;
                    let mut output = if in_place {
                        Vec::new()
                    } else {
                        vec![T::default(); out_len]
                    };
                    let (ib, ob) = if in_place {
                        (input.raw_mut(), input.raw_mut())
                    } else {
                        (input.raw(), output.raw_mut())
                    };
                    let launch = Launch {
                        first_seq: seq_of(r),
                        stream: None,
                        items: vec![BoundPlan {
                            plan: plan_of(r),
                            input: ib,
                            output: ob,
                        }],
                    };
                    let res = prepare(&fab, &launch).and_then(|p| execute(&fab, &p, parallel));
                    if let Err(e) = &res {
                        fab.fail(e);
                    }
                    (res, if in_place { input } else { output })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn check_allreduce(n: usize, count: u64, slot_bytes: usize, parallel: bool, in_place: bool) {
    let w = World::new(n, slot_bytes);
    let inputs: Vec<Vec<i64>> = (0..n)
        .map(|r| {
            (0..count as i64)
                .map(|i| (r as i64 + 1) * i - 3 * r as i64)
                .collect()
        })
        .collect();
    let half = count / 2;
    let results = run_ranks(
        &w,
        Duration::from_secs(20),
        parallel,
        &inputs,
        count as usize,
        in_place,
        |_| 7,
        |r| {
            plan(
                CollKind::AllReduce,
                Datatype::I64,
                ReduceOp::Sum,
                n,
                count,
                vec![
                    ring_allreduce(r, n, 0, half),
                    ring_allreduce(r, n, half, count - half),
                ],
            )
        },
    );
    let want: Vec<i64> = (0..count as usize)
        .map(|i| (0..n).map(|r| inputs[r][i]).sum())
        .collect();
    for (r, (res, out)) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(
            out, want,
            "rank {r} (n={n} count={count} parallel={parallel})"
        );
    }
}

#[test]
fn ring_allreduce_round_robin() {
    for n in [1, 2, 3, 4] {
        for count in [0, 1, 7, 100, 1001] {
            for slot in [64, 256] {
                check_allreduce(n, count, slot, false, false);
            }
        }
    }
}

#[test]
fn ring_allreduce_thread_per_channel() {
    check_allreduce(4, 5000, 256, true, false);
    check_allreduce(3, 777, 512, true, false);
}

#[test]
fn ring_allreduce_in_place() {
    check_allreduce(3, 1000, 256, false, true);
    check_allreduce(2, 64, 4096, true, true);
}

#[test]
fn averages_scale_and_divide() {
    let n = 3;
    let count = 300u64;
    let w = World::new(n, 128);
    let inputs: Vec<Vec<i32>> = (0..n)
        .map(|r| (0..count as i32).map(|i| i * (r as i32 * 2 - 1)).collect())
        .collect();
    let results = run_ranks(
        &w,
        Duration::from_secs(20),
        false,
        &inputs,
        count as usize,
        false,
        |_| 1,
        |r| {
            plan(
                CollKind::AllReduce,
                Datatype::I32,
                ReduceOp::Avg,
                n,
                count,
                vec![ring_allreduce(r, n, 0, count)],
            )
        },
    );
    // i*(-1) + i*1 + i*3 = 3i, divided by 3 with truncation.
    let want: Vec<i32> = (0..count as i32).map(|i| 3 * i / 3).collect();
    for (res, out) in results {
        res.unwrap();
        assert_eq!(out, want);
    }
    let w = World::new(n, 128);
    let inputs: Vec<Vec<f64>> = (0..n)
        .map(|r| (0..count).map(|i| (i + r as u64) as f64).collect())
        .collect();
    let results = run_ranks(
        &w,
        Duration::from_secs(20),
        true,
        &inputs,
        count as usize,
        false,
        |_| 1,
        |r| {
            plan(
                CollKind::AllReduce,
                Datatype::F64,
                ReduceOp::PreMulSum(0.5),
                n,
                count,
                vec![ring_allreduce(r, n, 0, count)],
            )
        },
    );
    let want: Vec<f64> = (0..count).map(|i| (3 * i + 3) as f64 * 0.5).collect();
    for (res, out) in results {
        res.unwrap();
        assert_eq!(out, want);
    }
}

/// all_to_all: the own block is copied, the others exchanged pairwise.
fn alltoall_steps(r: usize, n: usize, blk: u64) -> Vec<Step> {
    let mut own = flow(
        Peers::NONE,
        Peers::NONE,
        Some(Region::input(r as u64 * blk)),
        Some(Region::output(r as u64 * blk)),
        blk,
    );
    own.reduce = false;
    own.pre_op = false;
    let mut steps = vec![Step::Flow(own)];
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        steps.push(Step::Exchange {
            to,
            src: Region::input(to as u64 * blk),
            from,
            dst: Region::output(from as u64 * blk),
            count: blk,
        });
    }
    steps
}

#[test]
fn all_to_all_exchanges() {
    for (n, blk) in [(1usize, 10u64), (2, 1000), (3, 33), (4, 257)] {
        for parallel in [false, true] {
            let w = World::new(n, 256);
            let inputs: Vec<Vec<u32>> = (0..n)
                .map(|r| {
                    (0..n as u32 * blk as u32)
                        .map(|i| r as u32 * 1_000_000 + i)
                        .collect()
                })
                .collect();
            let results = run_ranks(
                &w,
                Duration::from_secs(20),
                parallel,
                &inputs,
                n * blk as usize,
                false,
                |_| 3,
                |r| {
                    plan(
                        CollKind::AllToAll,
                        Datatype::U32,
                        ReduceOp::Sum,
                        n,
                        blk,
                        vec![alltoall_steps(r, n, blk)],
                    )
                },
            );
            for (r, (res, out)) in results.into_iter().enumerate() {
                res.unwrap();
                for p in 0..n {
                    let b = blk as usize;
                    assert_eq!(
                        &out[p * b..(p + 1) * b],
                        &inputs[p][r * b..(r + 1) * b],
                        "rank {r} block {p}"
                    );
                }
            }
        }
    }
}

#[test]
fn self_exchange_in_place() {
    let w = World::new(1, 64);
    let inputs = vec![(0..100u8).collect::<Vec<u8>>()];
    let results = run_ranks(
        &w,
        Duration::from_secs(5),
        false,
        &inputs,
        100,
        true,
        |_| 0,
        |_| {
            plan(
                CollKind::AllToAll,
                Datatype::U8,
                ReduceOp::Sum,
                1,
                100,
                vec![vec![Step::Exchange {
                    to: 0,
                    src: Region::input(0),
                    from: 0,
                    dst: Region::output(0),
                    count: 100,
                }]],
            )
        },
    );
    let (res, out) = &results[0];
    res.as_ref().unwrap();
    assert_eq!(out, &inputs[0]);
}

/// scan and exclusive_scan as the planner builds them (the rank-order
/// chain), run by the interpreter on 1 to 5 threads: both channels, FIFOs
/// of a few slots, in place and not, a scaled op.
#[test]
fn planned_scans_run_the_chain() {
    use crate::graph::Graph;
    use crate::plan::build;
    use crate::topo::Topology;
    use crate::tune::caps::{BackendCaps, LinkCost};
    use crate::tune::Choice;
    let slot = 64usize;
    let link = LinkCost {
        latency_us: 1.0,
        bandwidth_gbs: 1.0,
    };
    let caps = BackendCaps {
        protocols: vec![Protocol::Simple],
        oneshot_protocols: Vec::new(),
        max_channels: 2,
        slot_bytes: slot as u64,
        fifo_slots: fifo::FIFO_SLOTS as u64,
        intra: link,
        inter: link,
        launch_us: 1.0,
        direct: false,
        oneshot_max_bytes: 0,
        collnet: false,
        rail: crate::tune::caps::links::MPI_RAIL,
        copy_engine: None,
    };
    for kind in [CollKind::Scan, CollKind::ExclusiveScan] {
        for n in 1..=5usize {
            for (count, op) in [
                (0u64, ReduceOp::Sum),
                (1, ReduceOp::Max),
                (97, ReduceOp::Sum),
                (1031, ReduceOp::PreMulSum(-2.0)),
                (700, ReduceOp::BitXor),
            ] {
                for in_place in [false, true] {
                    let topo = Topology::single_node(0, n);
                    let graph = Graph::new(&topo);
                    let choice = Choice {
                        algorithm: Algorithm::Ring,
                        protocol: Protocol::Simple,
                        nchannels: 2,
                        chunk_bytes: 4 * slot as u64,
                    };
                    let task = Task {
                        kind,
                        dtype: Datatype::I64,
                        op,
                        count,
                        root: 0,
                        in_place,
                    };
                    let inputs: Vec<Vec<i64>> = (0..n)
                        .map(|r| {
                            (0..count as i64)
                                .map(|i| (i * 7 + r as i64 * 13) % 19 - 9)
                                .collect()
                        })
                        .collect();
                    let w = World::new(n, slot);
                    let results = run_ranks(
                        &w,
                        Duration::from_secs(20),
                        n % 2 == 0,
                        &inputs,
                        count as usize,
                        in_place,
                        |_| 4,
                        |r| Arc::new(build(&task, &topo.as_rank(r), &graph, &choice, &caps)),
                    );
                    let red = Reduction::lower(op, Datatype::I64, n);
                    let scale = red.pre_scale.map_or(1, |s| s as i64);
                    let fold = |upto: usize, i: usize| {
                        (0..upto).map(|r| inputs[r][i].wrapping_mul(scale)).reduce(
                            |a, b| match op {
                                ReduceOp::Max => a.max(b),
                                ReduceOp::BitXor => a ^ b,
                                _ => a.wrapping_add(b),
                            },
                        )
                    };
                    for (r, (res, out)) in results.into_iter().enumerate() {
                        res.unwrap_or_else(|e| panic!("{kind:?} n={n} rank {r}: {e}"));
                        let upto = if kind == CollKind::Scan { r + 1 } else { r };
                        let want: Vec<i64> = (0..count as usize)
                            .map(|i| match fold(upto, i) {
                                Some(v) => v,
                                // rank 0 of exclusive_scan: never written
                                None if in_place => inputs[r][i],
                                None => 0,
                            })
                            .collect();
                        assert_eq!(
                            out, want,
                            "{kind:?} n={n} rank {r} count={count} op={op} in_place={in_place}"
                        );
                    }
                }
            }
        }
    }
}

mod failures;
