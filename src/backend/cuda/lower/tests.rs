//! CPU tests of plan lowering (no driver calls).

use super::*;
use crate::backend::cuda::layout::ONESHOT_LL_MAX_BYTES;
use crate::error::Error;
use crate::op::ReduceOp;
use crate::plan::{ChannelWork, Flow, Peers};

fn layout(nranks: u64, direct: bool) -> Layout {
    Layout {
        nranks,
        channels: 4,
        slots: 8,
        slot_bytes: 64 << 10,
        direct,
        oneshot_bytes: ONESHOT_MAX_BYTES,
    }
}

fn target(rank: usize, nranks: usize, direct: bool) -> DeviceTargets {
    DeviceTargets {
        rank,
        nranks,
        layout: layout(nranks as u64, direct),
        send_conns: 0x1000,
        recv_conns: 0x2000,
        abort_word: 0x3000,
        status: 0x3400,
        oneshot_bases: if direct {
            (0..nranks as u64).map(|r| (r + 1) << 40).collect()
        } else {
            Vec::new()
        },
        rail: None,
    }
}

fn task(kind: CollKind, dtype: Datatype, count: u64) -> crate::task::Task {
    crate::task::Task {
        kind,
        dtype,
        op: ReduceOp::Sum,
        count,
        root: 0,
        in_place: false,
    }
}

/// A plan of this rank's `channels`, for `count` f32 elements.
fn plan(kind: CollKind, algorithm: Algorithm, count: u64, channels: Vec<ChannelWork>) -> Plan {
    let t = task(kind, Datatype::F32, count);
    Plan {
        task: t,
        reduction: crate::op::Reduction::lower(t.op, t.dtype, 2),
        algorithm,
        protocol: Protocol::Simple,
        chunk_elems: count.max(1),
        scratch_elems: 0,
        channels,
    }
}

/// A plan built by the planner for `rank` of `nranks` ranks on one node.
fn planned(kind: CollKind, algorithm: Algorithm, count: u64, rank: usize, nranks: usize) -> Plan {
    use crate::backend::{BackendCaps, LinkCost};
    let topo = crate::topo::Topology::from_node_keys(0, &vec![0; nranks]);
    let graph = crate::graph::Graph::new(&topo);
    let link = LinkCost {
        latency_us: 1.0,
        bandwidth_gbs: 1.0,
    };
    let caps = BackendCaps {
        protocols: vec![Protocol::Simple],
        oneshot_protocols: vec![Protocol::Simple],
        max_channels: 4,
        slot_bytes: 64 << 10,
        fifo_slots: 8,
        intra: link,
        inter: link,
        launch_us: 1.0,
        direct: true,
        oneshot_max_bytes: crate::tune::model::ONESHOT_MAX_BYTES,
        collnet: false,
        rail: crate::tune::caps::links::MPI_RAIL,
        copy_engine: None,
    };
    let choice = crate::tune::Choice {
        algorithm,
        protocol: Protocol::Simple,
        nchannels: 2,
        chunk_bytes: 1 << 20,
    };
    let t = task(kind, Datatype::F32, count);
    crate::plan::build(&t, &topo.as_rank(rank), &graph, &choice, &caps)
}

const IN: Mem = Mem {
    addr: 0x10_0000,
    elems: 1 << 20,
};
const OUT: Mem = Mem {
    addr: 0x100_0000,
    elems: 1 << 20,
};

fn local_copy(src: u64, dst: u64, count: u64) -> Step {
    Step::Flow(Flow {
        recv: Peers::default(),
        send: Peers::default(),
        src: Some(Region {
            buf: BufId::Input,
            offset: src,
        }),
        dst: Some(Region {
            buf: BufId::Output,
            offset: dst,
        }),
        count,
        reduce: false,
        pre_op: false,
        post_op: false,
        acc: false,
    })
}

fn send_to(peer: usize, src: u64, count: u64) -> Step {
    Step::Flow(Flow {
        recv: Peers::default(),
        send: Peers::one(peer),
        src: Some(Region {
            buf: BufId::Input,
            offset: src,
        }),
        dst: None,
        count,
        reduce: false,
        pre_op: false,
        post_op: false,
        acc: false,
    })
}

#[test]
fn the_oneshot_decision_depends_on_the_plan_alone() {
    let small = plan(CollKind::AllReduce, Algorithm::OneShot, 1024, Vec::new());
    assert!(runs_as_oneshot(&small, false, true, 1).unwrap());
    assert!(
        runs_as_oneshot(&small, true, true, 1).is_err(),
        "groups never get one-shot plans"
    );
    assert!(
        runs_as_oneshot(&small, false, false, 1).is_err(),
        "no inboxes"
    );
    let pairwise = plan(CollKind::AllReduce, Algorithm::Pairwise, 1024, Vec::new());
    assert!(!runs_as_oneshot(&pairwise, false, true, 1).unwrap());
    let ring = plan(CollKind::AllReduce, Algorithm::Ring, 1024, Vec::new());
    assert!(!runs_as_oneshot(&ring, false, true, 1).unwrap());
    let empty = plan(CollKind::AllReduce, Algorithm::OneShot, 0, Vec::new());
    assert!(!runs_as_oneshot(&empty, false, true, 1).unwrap());
    let big = plan(
        CollKind::AllReduce,
        Algorithm::OneShot,
        ONESHOT_MAX_BYTES / 4 + 1,
        Vec::new(),
    );
    assert!(runs_as_oneshot(&big, false, true, 1).is_err());
    let a2a = plan(CollKind::AllToAll, Algorithm::Pairwise, 1024, Vec::new());
    assert!(!runs_as_oneshot(&a2a, false, true, 1).unwrap());
    assert!(target(0, 2, true).direct_path());
    assert!(!target(0, 2, false).direct_path());
}

#[test]
fn small_one_block_launches_get_fewer_threads() {
    // LL: one 8-byte unit per thread, at least 64 threads.
    assert_eq!(oneshot_threads(true, 8, 1), 64);
    assert_eq!(oneshot_threads(true, 1000, 1), 128);
    assert_eq!(oneshot_threads(true, 4096, 1), THREADS);
    // Simple: 64 threads up to 4 KiB.
    assert_eq!(oneshot_threads(false, 4096, 1), 64);
    assert_eq!(oneshot_threads(false, 4097, 1), THREADS);
    // Several blocks: always full ones.
    assert_eq!(oneshot_threads(true, 8192, 2), THREADS);
    for bytes in [0, 1, 7, 8, 9, 255, 2049, 1 << 20] {
        for ll in [true, false] {
            let n = oneshot_threads(ll, bytes, 1);
            assert!((64..=THREADS).contains(&n) && n % 32 == 0);
            if ll {
                assert!(u64::from(n) * 8 >= bytes.min(THREADS as u64 * 8));
            }
        }
    }
}

#[test]
fn oneshot_arguments_address_every_inbox() {
    let t = target(1, 4, true);
    let p = plan(CollKind::AllReduce, Algorithm::OneShot, 1 << 16, Vec::new());
    let Item::OneShot {
        args,
        dtype,
        grid,
        threads,
    } = t.oneshot(&p, IN, OUT, 7).unwrap()
    else {
        panic!("not a one-shot item");
    };
    assert_eq!(dtype, Datatype::F32);
    // 256 KiB over 32 KiB blocks, within the channel count (4), each of
    // full size.
    assert_eq!((grid, threads), (4, THREADS));
    assert_eq!(
        (args.input, args.output, args.count),
        (IN.addr, OUT.addr, 1 << 16)
    );
    assert_eq!((args.rank, args.nranks), (1, 4));
    assert_eq!(args.meta, (7 << 32) | (1 << 18));
    assert_eq!(args.ctl, t.oneshot_bases[1]);
    let l = t.layout;
    for p in 0..4 {
        // We write our slot in every peer's area and read every peer's
        // slot in ours.
        assert_eq!(args.put_data[p], t.oneshot_bases[p] + l.oneshot_inbox(1));
        assert_eq!(
            args.get_data[p],
            t.oneshot_bases[1] + l.oneshot_inbox(p as u64)
        );
        assert_eq!(args.put_flag[p], t.oneshot_bases[p] + l.oneshot_flags(1));
    }
    assert_eq!(args.flags & FLAG_LL, 0);
}

#[test]
fn oneshot_rejects_short_buffers_and_oversized_ll() {
    let t = target(0, 2, true);
    let p = plan(CollKind::AllReduce, Algorithm::OneShot, 1024, Vec::new());
    let short = Mem {
        addr: IN.addr,
        elems: 10,
    };
    assert!(matches!(
        t.oneshot(&p, short, OUT, 1),
        Err(Error::Backend(m)) if m.contains("one-shot all_reduce of 1024")
    ));
    let mut ll = plan(
        CollKind::AllReduce,
        Algorithm::OneShot,
        ONESHOT_LL_MAX_BYTES / 4 + 16,
        Vec::new(),
    );
    ll.protocol = Protocol::LL;
    assert!(matches!(t.oneshot(&ll, IN, OUT, 1), Err(Error::Backend(m)) if m.contains("LL")));
}

#[test]
fn planned_ring_lowers_within_buffers_and_peers() {
    let n = 4;
    for rank in 0..n {
        let t = target(rank, n, false);
        let p = planned(CollKind::AllReduce, Algorithm::Ring, 10_000, rank, n);
        let mut out = Lowered::default();
        t.lower_steps(&p, [IN, OUT, Mem::default()], 3, false, &mut out)
            .unwrap();
        assert_eq!(out.items.len(), 1);
        let Item::Steps {
            first_chan,
            nchans,
            args,
            dtype,
        } = &out.items[0]
        else {
            panic!("not a step item");
        };
        assert_eq!((*first_chan, *nchans), (0, out.chans.len()));
        assert_eq!(*dtype, Datatype::F32);
        assert_eq!((args.send, args.recv), (t.send_conns, t.recv_conns));
        assert_eq!(
            (args.rank, args.nranks, args.seq),
            (rank as u32, n as u32, 3)
        );
        assert_eq!(args.slot_bytes as u64, t.layout.slot_bytes);
        // Every step is listed by exactly one channel descriptor.
        let mut listed: usize = out.chans.iter().map(|c| c.nsteps as usize).sum();
        assert_eq!(listed, out.steps.len());
        listed = 0;
        for c in &out.chans {
            assert!((c.channel as u64) < t.layout.channels);
            listed = listed.max((c.first + c.nsteps) as usize);
        }
        assert_eq!(listed, out.steps.len());
        let inside =
            |a: u64, count: u64, m: Mem| a >= m.addr && a + count * 4 <= m.addr + m.elems * 4;
        for s in &out.steps {
            assert!(s.count > 0);
            if s.src != 0 {
                assert!(inside(s.src, s.count, IN) || inside(s.src, s.count, OUT));
            }
            if s.dst != 0 {
                assert!(inside(s.dst, s.count, OUT));
            }
            for &p in s.recv.iter().take(s.nrecv as usize) {
                assert!((p as usize) < n && p as usize != rank);
            }
            for &p in s.send.iter().take(s.nsend as usize) {
                assert!((p as usize) < n && p as usize != rank);
            }
        }
    }
}

/// scan and exclusive_scan lower to plain step tables: a chain in rank
/// order (peers r-1 and r+1 only), no one-shot, no accumulating flow;
/// exclusive_scan never writes rank 0's output.
#[test]
fn scans_lower_to_a_chain_of_steps() {
    let n = 4;
    for kind in [CollKind::Scan, CollKind::ExclusiveScan] {
        for rank in 0..n {
            let t = target(rank, n, true);
            for algo in [Algorithm::Ring, Algorithm::OneShot, Algorithm::Tree] {
                let p = planned(kind, algo, 100_003, rank, n);
                assert_eq!(p.algorithm, Algorithm::Ring, "{}", kind.name());
                assert!(!runs_as_oneshot(&p, false, true, 1).unwrap());
                let mut out = Lowered::default();
                t.lower_steps(&p, [IN, OUT, Mem::default()], 5, false, &mut out)
                    .unwrap();
                assert_eq!(out.items.len(), 1, "{} rank {rank}", kind.name());
                assert!(matches!(out.items[0], Item::Steps { .. }));
                for s in &out.steps {
                    assert_eq!(s.kind, STEP_FLOW);
                    for &q in s.recv.iter().take(s.nrecv as usize) {
                        assert_eq!(q as usize + 1, rank);
                    }
                    for &q in s.send.iter().take(s.nsend as usize) {
                        assert_eq!(q as usize, rank + 1);
                    }
                    if kind == CollKind::ExclusiveScan && rank == 0 {
                        assert_eq!(s.dst, 0, "rank 0's output stays untouched");
                    }
                }
                let sends = out.steps.iter().filter(|s| s.nsend > 0).count();
                let recvs = out.steps.iter().filter(|s| s.nrecv > 0).count();
                // Per chunk: one message each way (scan), two (exclusive_scan).
                let per = if kind == CollKind::Scan { 1 } else { 2 };
                let chunks = out.steps.len().max(1);
                assert!(sends > 0 || rank == n - 1);
                assert!(recvs > 0 || rank == 0);
                assert!(sends <= per * chunks && recvs <= per * chunks);
            }
        }
    }
    // A one-shot plan of a scan (never built) is refused, not run.
    let p = plan(CollKind::Scan, Algorithm::OneShot, 64, Vec::new());
    assert!(target(0, 2, true).oneshot(&p, IN, OUT, 1).is_err());
}

#[test]
fn leading_local_steps_get_a_block_outside_groups() {
    let t = target(0, 2, false);
    let channels = vec![ChannelWork {
        channel: 1,
        steps: vec![local_copy(0, 0, 100), send_to(1, 100, 50)],
    }];
    let p = plan(CollKind::AllToAll, Algorithm::Pairwise, 150, channels);
    let mut out = Lowered::default();
    t.lower_steps(&p, [IN, OUT, Mem::default()], 9, false, &mut out)
        .unwrap();
    assert_eq!(out.steps.len(), 2);
    // The channel's remaining step first, then the split-off local block.
    let c: Vec<(u32, u32, u32)> = out
        .chans
        .iter()
        .map(|c| (c.channel, c.first, c.nsteps))
        .collect();
    assert_eq!(c, vec![(1, 1, 1), (1, 0, 1)]);
    assert_eq!(out.steps[0].src, IN.addr);
    assert_eq!(out.steps[0].dst, OUT.addr);
    assert_eq!(out.steps[1].src, IN.addr + 400);
    assert_eq!((out.steps[1].nsend, out.steps[1].send[0]), (1, 1));
    // In a group the channel stays whole.
    let mut grouped = Lowered::default();
    t.lower_steps(&p, [IN, OUT, Mem::default()], 9, true, &mut grouped)
        .unwrap();
    assert_eq!(grouped.chans.len(), 1);
    assert_eq!(grouped.chans[0].nsteps, 2);
}

#[test]
fn local_steps_that_overlap_later_ones_stay_in_their_channel() {
    let local = GcStep {
        src: 0x1000,
        dst: 0x2000,
        count: 16,
        kind: STEP_FLOW,
        ..GcStep::default()
    };
    let reads_it = GcStep {
        src: 0x2000 + 8,
        count: 4,
        kind: STEP_FLOW,
        nsend: 1,
        ..GcStep::default()
    };
    let elsewhere = GcStep {
        src: 0x9000,
        ..reads_it
    };
    assert_eq!(local_prefix(&[local, reads_it], 4), 0);
    assert_eq!(local_prefix(&[local, elsewhere], 4), 1);
    assert_eq!(local_prefix(&[local, local], 4), 0, "all local");
}

#[test]
fn bad_plans_are_errors_not_panics() {
    let t = target(0, 2, false);
    let lower = |channels: Vec<ChannelWork>| {
        let p = plan(CollKind::AllReduce, Algorithm::Ring, 100, channels);
        t.lower_steps(
            &p,
            [IN, OUT, Mem::default()],
            5,
            false,
            &mut Lowered::default(),
        )
    };
    let too_far = vec![ChannelWork {
        channel: 4,
        steps: vec![send_to(1, 0, 10)],
    }];
    assert!(matches!(lower(too_far), Err(Error::Backend(m)) if m.contains("only 4 channels")));
    let to_self = vec![ChannelWork {
        channel: 0,
        steps: vec![send_to(0, 0, 10)],
    }];
    assert!(matches!(lower(to_self), Err(Error::Backend(m)) if m.contains("itself")));
    let past_end = vec![ChannelWork {
        channel: 0,
        steps: vec![send_to(1, IN.elems - 5, 10)],
    }];
    assert!(matches!(lower(past_end), Err(Error::Backend(m)) if m.contains("Input")));
    let scratchless = vec![ChannelWork {
        channel: 0,
        steps: vec![Step::Exchange {
            to: 1,
            src: Region {
                buf: BufId::Scratch,
                offset: 0,
            },
            from: 1,
            dst: Region {
                buf: BufId::Output,
                offset: 0,
            },
            count: 4,
        }],
    }];
    assert!(matches!(lower(scratchless), Err(Error::Backend(m)) if m.contains("Scratch")));
    // Channels without work produce no launch.
    let idle = vec![ChannelWork {
        channel: 0,
        steps: vec![send_to(1, 0, 0)],
    }];
    let p = plan(CollKind::AllReduce, Algorithm::Ring, 100, idle);
    let mut out = Lowered::default();
    t.lower_steps(&p, [IN, OUT, Mem::default()], 5, false, &mut out)
        .unwrap();
    assert!(out.items.is_empty() && out.steps.is_empty());
}

#[test]
fn group_tables_split_by_datatype_and_keep_call_order() {
    let t = target(0, 2, false);
    let mut out = Lowered::default();
    let call = |channel: usize, count: u64| {
        plan(
            CollKind::AllReduce,
            Algorithm::Ring,
            count,
            vec![ChannelWork {
                channel,
                steps: vec![send_to(1, 0, count)],
            }],
        )
    };
    let mut as_i32 = call(0, 8);
    as_i32.task.dtype = Datatype::I32;
    for (k, p) in [call(0, 10), as_i32, call(1, 20), call(0, 30)]
        .iter()
        .enumerate()
    {
        t.lower_steps(p, [IN, OUT, Mem::default()], k as u64, true, &mut out)
            .unwrap();
    }
    assert_eq!(out.step_items(), 4);
    let parts = group_parts(&out.chans, &out.items).unwrap();
    assert_eq!(parts.len(), 2);
    let f32s = &parts[0];
    assert_eq!(f32s.dtype, Datatype::F32);
    assert_eq!(f32s.items.len(), 3);
    assert_eq!(
        f32s.items.iter().map(|a| a.seq).collect::<Vec<_>>(),
        vec![0, 2, 3]
    );
    // Channel 0 walks calls 0 and 2 (seq 0, 3) in order; channel 1 call 1.
    let blocks: Vec<(u32, u32, u32)> = f32s
        .blocks
        .iter()
        .map(|b| (b.channel, b.first, b.nsteps))
        .collect();
    assert_eq!(blocks, vec![(0, 0, 2), (1, 2, 1)]);
    let entries: Vec<(u32, u32)> = f32s.entries.iter().map(|e| (e.item, e.first)).collect();
    assert_eq!(entries, vec![(0, 0), (2, 3), (1, 2)]);
    // The i32 call runs on the u32 kernel, with the signed bit in its op.
    assert_eq!(parts[1].dtype, Datatype::U32);
    assert_eq!(parts[1].entries.len(), 1);
    assert_eq!(parts[1].items[0].op, OP_SUM | OP_SIGNED);
    // A one-shot item cannot join a group launch.
    let d = target(0, 2, true);
    let small = plan(CollKind::AllReduce, Algorithm::OneShot, 16, Vec::new());
    out.items.push(d.oneshot(&small, IN, OUT, 9).unwrap());
    assert!(group_parts(&out.chans, &out.items).is_err());
}

#[test]
fn signed_integers_run_on_unsigned_kernels_with_the_signed_bit() {
    assert_eq!(kernel_dtype(Datatype::I8), Datatype::U8);
    assert_eq!(kernel_dtype(Datatype::I32), Datatype::U32);
    assert_eq!(kernel_dtype(Datatype::I64), Datatype::U64);
    for d in Datatype::ALL {
        assert_eq!(kernel_dtype(d).size(), d.size());
        let code = op_code(Combine::Min, d);
        assert_eq!(code & OP_MASK, OP_MIN);
        assert_eq!(code & OP_SIGNED != 0, d.is_signed_int(), "{d:?}");
    }
    let t = target(0, 2, true);
    let mut p = plan(CollKind::AllReduce, Algorithm::OneShot, 1 << 10, Vec::new());
    p.task.dtype = Datatype::I64;
    let Item::OneShot { args, dtype, .. } = t.oneshot(&p, IN, OUT, 1).unwrap() else {
        panic!("not a one-shot item");
    };
    assert_eq!(dtype, Datatype::U64);
    assert_eq!(args.op, OP_SUM | OP_SIGNED);
}

#[test]
fn oneshot_of_the_other_collectives_sizes_its_segments() {
    let t = target(1, 4, true);
    let count = 1024u64;
    let buf = |elems: u64| Mem {
        addr: IN.addr,
        elems,
    };
    let out = |elems: u64| Mem {
        addr: OUT.addr,
        elems,
    };
    // (kind, input segments, output segments, code)
    for (kind, ins, outs, code) in [
        (CollKind::AllGather, 1, 4, ONESHOT_ALL_GATHER),
        (CollKind::ReduceScatter, 4, 1, ONESHOT_REDUCE_SCATTER),
        (CollKind::AllToAll, 4, 4, ONESHOT_ALL_TO_ALL),
    ] {
        let p = plan(kind, Algorithm::OneShot, count, Vec::new());
        assert!(runs_as_oneshot(&p, false, true, 1).unwrap(), "{kind:?}");
        let Item::OneShot { args, .. } = t
            .oneshot(&p, buf(count * ins), out(count * outs), 3)
            .unwrap()
        else {
            panic!("not a one-shot item");
        };
        assert_eq!(args.flags >> ONESHOT_KIND_SHIFT, code);
        // The meta and the inbox limits are per segment.
        assert_eq!(args.count, count);
        assert_eq!(args.meta, (3 << 32) | (count * 4));
        assert!(t
            .oneshot(&p, buf(count * ins - 1), out(count * outs), 3)
            .is_err());
        assert!(t
            .oneshot(&p, buf(count * ins), out(count * outs - 1), 3)
            .is_err());
        let big = plan(
            kind,
            Algorithm::OneShot,
            ONESHOT_MAX_BYTES / 4 + 1,
            Vec::new(),
        );
        assert!(runs_as_oneshot(&big, false, true, 1).is_err());
    }
    let ar = plan(CollKind::AllReduce, Algorithm::OneShot, count, Vec::new());
    let Item::OneShot { args, .. } = t.oneshot(&ar, IN, OUT, 3).unwrap() else {
        panic!("not a one-shot item");
    };
    assert_eq!(args.flags >> ONESHOT_KIND_SHIFT, ONESHOT_ALL_REDUCE);
    // The rooted collectives: rank 1 as the root and not; a buffer the
    // rank does not use may be absent.
    let none = Mem::default();
    for kind in [
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::Gather,
        CollKind::Scatter,
    ] {
        for root in [1usize, 2] {
            let me = root == 1;
            let (ins, outs) = match kind {
                CollKind::Broadcast => (u64::from(me), 1),
                CollKind::Reduce => (1, u64::from(me)),
                CollKind::Gather => (1, if me { 4 } else { 0 }),
                CollKind::Scatter => (if me { 4 } else { 0 }, 1),
                CollKind::AllReduce
                | CollKind::AllGather
                | CollKind::ReduceScatter
                | CollKind::AllToAll
                | CollKind::Scan
                | CollKind::ExclusiveScan => unreachable!("not rooted"),
            };
            let mut p = plan(kind, Algorithm::OneShot, count, Vec::new());
            p.task.root = root;
            assert!(runs_as_oneshot(&p, false, true, 1).unwrap(), "{kind:?}");
            let mem = |segs: u64, m: fn(u64) -> Mem| if segs == 0 { none } else { m(count * segs) };
            let bufs = (
                mem(ins, |e| Mem {
                    addr: IN.addr,
                    elems: e,
                }),
                mem(outs, |e| Mem {
                    addr: OUT.addr,
                    elems: e,
                }),
            );
            let Item::OneShot { args, .. } = t.oneshot(&p, bufs.0, bufs.1, 3).unwrap() else {
                panic!("not a one-shot item");
            };
            assert_eq!(
                Some((args.flags >> ONESHOT_KIND_SHIFT) & 15),
                oneshot_kind(kind)
            );
            assert_eq!(
                (args.flags >> ONESHOT_ROOT_SHIFT) & 15,
                root as u32,
                "{kind:?}"
            );
            assert_eq!(args.count, count);
            if ins > 0 {
                assert!(t.oneshot(&p, none, bufs.1, 3).is_err(), "{kind:?} {root}");
            }
            if outs > 0 {
                assert!(t.oneshot(&p, bufs.0, none, 3).is_err(), "{kind:?} {root}");
            }
        }
    }
}

/// One rank: collectives become one coalesced driver copy where no value
/// changes, and stay kernels where one does (or nothing is copied).
#[test]
fn one_rank_plans_become_plain_copies() {
    for kind in CollKind::ALL {
        let p = planned(kind, Algorithm::Ring, 300_000, 0, 1);
        let copies = local_copies(&p, IN, OUT);
        // exclusive_scan's only rank has no prefix: nothing at all runs.
        let want =
            (kind != CollKind::ExclusiveScan).then(|| vec![(OUT.addr, IN.addr, 300_000 * 4)]);
        assert_eq!(copies, want, "{}", kind.name());
    }
    let exscan = planned(CollKind::ExclusiveScan, Algorithm::Ring, 1000, 0, 1);
    assert!(exscan.channels.is_empty());
    let mut out = Lowered::default();
    target(0, 1, false)
        .lower_steps(&exscan, [IN, OUT, Mem::default()], 2, false, &mut out)
        .unwrap();
    assert!(out.items.is_empty() && out.steps.is_empty());
    // A pre-scale other than 1 (premulsum) needs the kernel.
    let mut p = planned(CollKind::AllReduce, Algorithm::Ring, 1000, 0, 1);
    p.reduction.pre_scale = Some(0.5);
    assert_eq!(local_copies(&p, IN, OUT), None);
    // Input and output the same memory: nothing to copy.
    let p1 = planned(CollKind::AllGather, Algorithm::Ring, 1000, 0, 1);
    assert_eq!(local_copies(&p1, IN, IN), None);
    // A copy that would leave the output: left to the kernel path's checks.
    let small = Mem {
        addr: OUT.addr,
        elems: 10,
    };
    assert_eq!(local_copies(&p1, IN, small), None);
}

/// A group whose calls alternate datatypes runs one launch per kernel
/// datatype: the rail jobs follow that order, call order within each.
#[test]
fn group_rail_jobs_follow_the_launches() {
    let steps = |dtype| Item::Steps {
        first_chan: 0,
        nchans: 1,
        args: GcArgs::default(),
        dtype: kernel_dtype(dtype),
    };
    let items = [
        steps(Datatype::F32),
        steps(Datatype::F64),
        steps(Datatype::F32),
    ];
    let job = |dtype, bytes| RailJob {
        bytes,
        dtype,
        combine: Combine::Sum,
    };
    let mut jobs = vec![
        (0, job(Datatype::F32, 1)),
        (1, job(Datatype::F32, 2)),
        (0, job(Datatype::F64, 3)),
        (0, job(Datatype::F32, 4)),
    ];
    group_rail_order(&mut jobs, &items);
    let order: Vec<u64> = jobs.iter().map(|(_, j)| j.bytes).collect();
    assert_eq!(order, [1, 2, 4, 3]);
}
