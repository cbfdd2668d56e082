//! Multi-rank error-path tests: argument errors are local and leave the
//! communicator usable; disagreements between ranks are reported (check
//! mode: MismatchedCall everywhere; otherwise Timeout / ProtocolMismatch /
//! PeerFailed within GPUCOLL_TIMEOUT) and never hang; a failed communicator
//! stays failed; bad configuration is rejected.

mod common;

use common::*;
use gpucoll::prelude::*;
use gpucoll::reference as mpi;
use gpucoll::CollKind;
use std::time::{Duration, Instant};

fn cases() -> Vec<Case> {
    let mut v = vec![
        Case::new("bad_root::n2", 2, "bad_root"),
        Case::new("bad_root::n4", 4, "bad_root"),
        Case::new("bad_args::n3", 3, "bad_args"),
        Case::new("bad_args::n4_check_mode", 4, "bad_args").env("GPUCOLL_CHECK", "1"),
        Case::new("freed::n2", 2, "freed"),
        Case::new("freed::n4", 4, "freed"),
        Case::new("mismatch_check::n3", 3, "mismatch_check").env("GPUCOLL_CHECK", "1"),
        Case::new("mismatch_check::n4_sim2", 4, "mismatch_check")
            .env("GPUCOLL_CHECK", "1")
            .env("GPUCOLL_SIM_NODES", "2"),
        Case::new("mismatch_nocheck::n2", 2, "mismatch_nocheck").env("GPUCOLL_TIMEOUT", "3"),
        Case::new("mismatch_nocheck::n4", 4, "mismatch_nocheck").env("GPUCOLL_TIMEOUT", "3"),
        Case::new("mismatch_nocheck::n4_sim2", 4, "mismatch_nocheck")
            .env("GPUCOLL_TIMEOUT", "3")
            .env("GPUCOLL_SIM_NODES", "2"),
        Case::new("skip::n2", 2, "skip").env("GPUCOLL_TIMEOUT", "3"),
        Case::new("skip::n4", 4, "skip").env("GPUCOLL_TIMEOUT", "3"),
        Case::new("skip::n4_sim2", 4, "skip")
            .env("GPUCOLL_TIMEOUT", "3")
            .env("GPUCOLL_SIM_NODES", "2"),
        Case::new("raw_host::n2", 2, "raw_host"),
        Case::new("raw_host::n3", 3, "raw_host"),
        // Rank 2 kills itself between all_reduces; ranks 0 and 1 must get an
        // error naming it within 2 s, with the default GPUCOLL_TIMEOUT.
        // A rank killed by SIGTERM in a collective loop, and a rank that
        // exits without freeing its communicators: nothing may be left in
        // /dev/shm, and no process behind.
        Case::new("interrupted::sigterm_n3", 3, "interrupted")
            .env("GPUCOLL_TEST_PARAMS", "mode=sigterm")
            .leaves_nothing()
            .timeout(90),
        Case::new("interrupted::exit_n3", 3, "interrupted")
            .env("GPUCOLL_TEST_PARAMS", "mode=exit")
            .leaves_nothing()
            .timeout(90),
        Case::new("dead_peer::n3", 3, "dead_peer")
            .env("GPUCOLL_TIMEOUT", "300")
            .survivors("DEADPEER ok", 2)
            .timeout(90),
        // The same with every rank on its own simulated node: the dead
        // rank is on "another node" but on this host, and is still seen.
        Case::new("dead_peer::n3_sim3", 3, "dead_peer")
            .env("GPUCOLL_TIMEOUT", "300")
            .env("GPUCOLL_SIM_NODES", "3")
            .survivors("DEADPEER ok", 2)
            .timeout(90),
    ];
    for (name, var, val) in [
        ("algo_bogus", "GPUCOLL_ALGO", "bogus"),
        ("nchannels_zero", "GPUCOLL_NCHANNELS", "0"),
        ("timeout_negative", "GPUCOLL_TIMEOUT", "-1"),
        ("check_maybe", "GPUCOLL_CHECK", "maybe"),
        ("sim_nodes_text", "GPUCOLL_SIM_NODES", "two"),
        ("p2p_disable_maybe", "GPUCOLL_P2P_DISABLE", "maybe"),
    ] {
        v.push(
            Case::new(format!("bad_env::{name}"), 2, "bad_env")
                .env(var, val)
                .env("GPUCOLL_TEST_PARAMS", format!("expect={var}"))
                .timeout(120),
        );
    }
    v
}

fn main() {
    main_with(cases(), worker)
}

fn worker(scenario: &str) -> std::result::Result<(), String> {
    if scenario == "bad_env" {
        return scenario_bad_env();
    }
    if scenario == "dead_peer" {
        scenario_dead_peer();
    }
    if scenario == "interrupted" {
        scenario_interrupted();
    }
    let universe = ok(gpucoll::initialize(), "initialize");
    let world = ok(universe.world(), "universe.world()");
    let mut fails = Vec::new();
    match scenario {
        "bad_root" => scenario_bad_root(&world, &mut fails),
        "bad_args" => scenario_bad_args(&world, &mut fails),
        "freed" => scenario_freed(&world, &mut fails),
        "mismatch_check" => scenario_mismatch_check(&world, &mut fails),
        "mismatch_nocheck" => scenario_mismatch_nocheck(&world, &mut fails),
        "skip" => scenario_skip(&world, &mut fails),
        "raw_host" => scenario_raw_host(&world, &mut fails),
        other => fails.push(format!("unknown scenario {other}")),
    }
    for f in &fails {
        log(&format!("FAIL {f}"));
    }
    // agree on the verdict with MPI itself (independent of gpucoll's state)
    let mine = [!fails.is_empty() as u32];
    let mut any = [0u32];
    ok(
        mpi::all_reduce(&world, &mine, &mut any, ReduceOp::Max),
        "reference::all_reduce(verdict)",
    );
    drop(world);
    drop(universe);
    if !fails.is_empty() {
        Err(format!("{} failed checks", fails.len()))
    } else if any[0] != 0 {
        Err("another rank failed (see its output)".into())
    } else {
        Ok(())
    }
}

/// Record a failure unless `r` is an error accepted by `pred`.
fn expect_err<T: std::fmt::Debug>(
    fails: &mut Vec<String>,
    what: &str,
    r: gpucoll::Result<T>,
    want: &str,
    pred: impl Fn(&Error) -> bool,
) -> Option<Error> {
    match r {
        Err(e) if pred(&e) => Some(e),
        Err(e) => {
            fails.push(format!("{what}: got error {e:?}, expected {want}"));
            Some(e)
        }
        Ok(v) => {
            fails.push(format!("{what}: succeeded ({v:?}), expected {want}"));
            None
        }
    }
}

/// A correct all_reduce on `comm` must work and be right.
fn still_works(comm: &Communicator, what: &str, fails: &mut Vec<String>) {
    let n = comm.size();
    let a = vec![comm.rank() as i64 + 1; 1031];
    let mut b = vec![-7i64; 1031];
    match comm.all_reduce_into(&a, &mut b, ReduceOp::Sum) {
        Ok(()) => check_exact(
            &format!("{what}: all_reduce result"),
            &b,
            &vec![(n * (n + 1) / 2) as i64; 1031],
            fails,
        ),
        Err(e) => fail_now(&format!("{what}: all_reduce failed: {e:?}")),
    };
}

// ---------------------------------------------------------------------------

fn scenario_bad_root(world: &Communicator, fails: &mut Vec<String>) {
    let (rank, n) = (world.rank(), world.size());
    for bad in [n, n + 100] {
        let p = world.process_at_rank(bad);
        let is_bad = |e: &Error| matches!(e, Error::InvalidRoot { root, size } if *root == bad && *size == n);
        let want = format!("InvalidRoot {{ root: {bad}, size: {n} }}");
        let send = vec![1.0f32; 8];
        let mut recv = vec![0.0f32; 8];
        let mut big = vec![0.0f32; 8 * n];
        let _ = rank;
        expect_err(
            fails,
            "broadcast_into",
            p.broadcast_into(&mut recv),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "reduce_into_root",
            p.reduce_into_root(&send, &mut recv, ReduceOp::Sum),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "reduce_into",
            p.reduce_into(&send, ReduceOp::Sum),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "reduce_into_root_in_place",
            p.reduce_into_root_in_place(&mut recv, ReduceOp::Sum),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "gather_into_root",
            p.gather_into_root(&send, &mut big),
            &want,
            is_bad,
        );
        expect_err(fails, "gather_into", p.gather_into(&send), &want, is_bad);
        expect_err(
            fails,
            "gather_into_root_in_place",
            p.gather_into_root_in_place(&mut big),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "scatter_into_root",
            p.scatter_into_root(&big, &mut recv),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "scatter_into",
            p.scatter_into(&mut recv),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "scatter_into_root_in_place",
            p.scatter_into_root_in_place(&mut big),
            &want,
            is_bad,
        );
        let r: gpucoll::Result<()> = gpucoll::scope(|s| {
            let req = p.immediate_broadcast_into(s, &mut recv)?;
            req.wait()
        });
        expect_err(fails, "immediate_broadcast_into", r, &want, is_bad);
        let r = world.group(|g| {
            g.all_reduce_into(&send, &mut big[..8], ReduceOp::Sum)?;
            g.process_at_rank(bad).broadcast_into(&mut recv)
        });
        expect_err(fails, "group broadcast_into(bad root)", r, &want, is_bad);
        // the communicator is still usable
        still_works(world, &format!("after bad root {bad}"), fails);
    }
}

fn scenario_bad_args(world: &Communicator, fails: &mut Vec<String>) {
    let n = world.size();
    let is_len = |e: &Error| matches!(e, Error::BufferLength { .. });
    let is_div = |e: &Error| matches!(e, Error::NotDivisible { .. });
    let is_len_or_div =
        |e: &Error| matches!(e, Error::BufferLength { .. } | Error::NotDivisible { .. });

    // lengths
    let send = vec![1u32; 10];
    let mut short = vec![0u32; 9];
    expect_err(
        fails,
        "all_reduce_into recv too short",
        world.all_reduce_into(&send, &mut short, ReduceOp::Sum),
        "BufferLength",
        is_len,
    );
    if let Some(Error::BufferLength {
        expected, actual, ..
    }) = world
        .all_reduce_into(&send, &mut short, ReduceOp::Sum)
        .err()
    {
        if expected != 10 || actual != 9 {
            fails.push(format!(
                "BufferLength fields: expected={expected} actual={actual}, want 10 and 9"
            ));
        }
    }
    let mut ag_short = vec![0u32; 10 * n - 1];
    expect_err(
        fails,
        "all_gather_into recv too short",
        world.all_gather_into(&send, &mut ag_short),
        "BufferLength",
        is_len,
    );
    let mut ag_long = vec![0u32; 10 * n + 1];
    expect_err(
        fails,
        "all_gather_into recv too long",
        world.all_gather_into(&send, &mut ag_long),
        "BufferLength",
        is_len,
    );
    let rs_send = vec![1u32; 10 * n + 1];
    let mut rs_recv = vec![0u32; 10];
    expect_err(
        fails,
        "reduce_scatter_block_into send not count*size",
        world.reduce_scatter_block_into(&rs_send, &mut rs_recv, ReduceOp::Sum),
        "BufferLength or NotDivisible",
        is_len_or_div,
    );
    let nd = 3 * n + 1;
    let mut nd_buf = vec![1u32; nd];
    expect_err(
        fails,
        "reduce_scatter_block_in_place len % size != 0",
        world.reduce_scatter_block_in_place(&mut nd_buf, ReduceOp::Sum),
        "NotDivisible",
        is_div,
    );
    let aa_send = vec![1u32; nd];
    let mut aa_recv = vec![0u32; nd];
    expect_err(
        fails,
        "all_to_all_into len % size != 0",
        world.all_to_all_into(&aa_send, &mut aa_recv),
        "NotDivisible",
        is_div,
    );
    if let Some(Error::NotDivisible { len, size, .. }) =
        world.all_to_all_into(&aa_send, &mut aa_recv).err()
    {
        if len != nd as u64 || size != n {
            fails.push(format!(
                "NotDivisible fields: len={len} size={size}, want {nd} and {n}"
            ));
        }
    }
    expect_err(
        fails,
        "all_to_all_in_place len % size != 0",
        world.all_to_all_in_place(&mut nd_buf),
        "NotDivisible",
        is_div,
    );
    expect_err(
        fails,
        "all_gather_in_place len % size != 0",
        world.all_gather_in_place(&mut nd_buf),
        "NotDivisible (or InPlace)",
        |e| matches!(e, Error::NotDivisible { .. } | Error::InPlace(_)),
    );
    let aa_recv_short = &mut vec![0u32; 3 * n - 1];
    let aa_send3 = vec![1u32; 3 * n];
    expect_err(
        fails,
        "all_to_all_into recv too short",
        world.all_to_all_into(&aa_send3, aa_recv_short),
        "BufferLength or NotDivisible",
        is_len_or_div,
    );
    // symmetric rooted errors (every rank's call is invalid the same way)
    let root = world.process_at_rank(n - 1);
    let nd_send = vec![1u32; nd];
    if world.rank() == n - 1 {
        let mut rr = vec![0u32; 3];
        expect_err(
            fails,
            "scatter_into_root send not count*size",
            root.scatter_into_root(&nd_send, &mut rr),
            "BufferLength or NotDivisible",
            is_len_or_div,
        );
    } else {
        // non-roots issue a valid-looking call only if the root's is valid; skip
    }
    still_works(world, "after length errors", fails);

    // element types: the typed methods take one element type per call (a
    // mismatch does not compile); raw buffers can still disagree
    let is_tm = |s: Datatype, r: Datatype| move |e: &Error| matches!(e, Error::TypeMismatch { send, recv } if *send == s && *recv == r);
    let fs = vec![1.0f32; 8];
    let mut ir = vec![0i32; 8];
    let us = vec![1u8; 8];
    let mut is = vec![0i8; 8 * n];
    let hs = vec![f16::ONE; 8 * n];
    let mut bs = vec![bf16::ZERO; 8];
    let ds = vec![1.0f64; 8 * n];
    let mut ls = vec![0u64; 8 * n];
    let mismatched = [
        (
            "all_reduce f32 -> i32",
            CollKind::AllReduce,
            fs.raw(),
            ir.raw_mut(),
            (Datatype::F32, Datatype::I32),
        ),
        (
            "all_gather u8 -> i8",
            CollKind::AllGather,
            us.raw(),
            is.raw_mut(),
            (Datatype::U8, Datatype::I8),
        ),
        (
            "reduce_scatter_block f16 -> bf16",
            CollKind::ReduceScatter,
            hs.raw(),
            bs.raw_mut(),
            (Datatype::F16, Datatype::BF16),
        ),
        (
            "all_to_all f64 -> u64",
            CollKind::AllToAll,
            ds.raw(),
            ls.raw_mut(),
            (Datatype::F64, Datatype::U64),
        ),
    ];
    for (what, kind, send, recv, (s, r)) in mismatched {
        // SAFETY: both raw buffers describe live host vectors of their
        // stated lengths, not touched elsewhere during the call.
        let res =
            unsafe { world.raw_collective(kind, Some(send), Some(recv), ReduceOp::Sum, 0, false) };
        expect_err(
            fails,
            what,
            res,
            &format!("TypeMismatch({s:?}, {r:?})"),
            is_tm(s, r),
        );
    }
    still_works(world, "after type errors", fails);

    // ops
    let is_op = |e: &Error| matches!(e, Error::InvalidOp { .. });
    let mut fr = vec![0f32; 8];
    expect_err(
        fails,
        "all_reduce PreMulSum(NaN)",
        world.all_reduce_into(&fs, &mut fr, ReduceOp::PreMulSum(f64::NAN)),
        "InvalidOp",
        is_op,
    );
    expect_err(
        fails,
        "all_reduce PreMulSum(inf)",
        world.all_reduce_into(&fs, &mut fr, ReduceOp::PreMulSum(f64::INFINITY)),
        "InvalidOp",
        is_op,
    );
    // the oracle refuses what MPI cannot do
    let h = vec![f16::ONE; 4];
    let mut hr = vec![f16::ZERO; 4];
    expect_err(
        fails,
        "reference::all_reduce on f16",
        mpi::all_reduce(world, &h, &mut hr, ReduceOp::Sum),
        "InvalidOp",
        is_op,
    );
    expect_err(
        fails,
        "reference::all_reduce Avg",
        mpi::all_reduce(world, &fs, &mut fr, ReduceOp::Avg),
        "InvalidOp",
        is_op,
    );
    still_works(world, "after op errors", fails);

    // zero-length calls are fine
    let e: Vec<f32> = vec![];
    let mut er: Vec<f32> = vec![];
    if let Err(err) = world.all_reduce_into(&e, &mut er, ReduceOp::Sum) {
        fails.push(format!("zero-length all_reduce failed: {err:?}"));
    }
    still_works(world, "after zero-length call", fails);
}

fn scenario_freed(world: &Communicator, fails: &mut Vec<String>) {
    let is_freed = |e: &Error| matches!(e, Error::CommunicatorFreed);
    let dup = ok(world.duplicate(), "duplicate");
    still_works(&dup, "dup before free", fails);
    let a = vec![1i32; 4];
    let mut b = vec![0i32; 4];
    // The host backend maps no peer memory: registering only checks it.
    let reg = ok(dup.register(&a), "register before free");
    if reg.is_direct() || reg.bytes() != 16 {
        fails.push(format!("host registration: {reg:?}, {} bytes", reg.bytes()));
    }
    let raw = ok(dup.register_raw(b.as_ptr().cast(), 16), "register_raw");
    ok(dup.free(), "free");
    drop(raw);
    let want = "CommunicatorFreed";
    expect_err(
        fails,
        "register after free",
        dup.register(&b).map(|_| ()),
        want,
        is_freed,
    );
    // A registration outlives the free; ending it later is harmless.
    reg.deregister();
    expect_err(fails, "barrier after free", dup.barrier(), want, is_freed);
    expect_err(
        fails,
        "all_reduce_into after free",
        dup.all_reduce_into(&a, &mut b, ReduceOp::Sum),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "all_reduce_in_place after free",
        dup.all_reduce_in_place(&mut b, ReduceOp::Sum),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "broadcast after free",
        dup.process_at_rank(0).broadcast_into(&mut b),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "duplicate after free",
        dup.duplicate().map(|_| ()),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "split after free",
        dup.split(Some(0), 0).map(|_| ()),
        want,
        is_freed,
    );
    let r: gpucoll::Result<()> = gpucoll::scope(|s| world_immediate(&dup, s, &a, &mut b));
    expect_err(fails, "immediate_all_reduce after free", r, want, is_freed);
    let r = dup.group(|g| g.all_reduce_into(&a, &mut b, ReduceOp::Sum));
    expect_err(fails, "group after free", r, want, is_freed);
    // a clone shares the freed state
    let clone = dup.clone();
    expect_err(
        fails,
        "clone of a freed communicator",
        clone.barrier(),
        want,
        is_freed,
    );
    // the world and other communicators are untouched
    still_works(world, "world after free of a dup", fails);
    let other = ok(world.duplicate(), "second duplicate");
    still_works(&other, "another dup after free", fails);
    // free a split communicator too
    let sub = ok(world.split(Some((world.rank() % 2) as u32), 0), "split").expect("color given");
    still_works(&sub, "split before free", fails);
    ok(sub.free(), "free split");
    expect_err(
        fails,
        "split comm after free",
        sub.barrier(),
        want,
        is_freed,
    );
    still_works(world, "world at the end", fails);
}

fn world_immediate<'a>(
    c: &Communicator,
    s: &gpucoll::Scope<'a>,
    a: &'a Vec<i32>,
    b: &'a mut Vec<i32>,
) -> gpucoll::Result<()> {
    c.immediate_all_reduce_into(s, a, b, ReduceOp::Sum)?.wait()
}

fn is_fatal_peer(e: &Error) -> bool {
    matches!(
        e,
        Error::Timeout { .. } | Error::ProtocolMismatch { .. } | Error::PeerFailed(_)
    )
}

fn scenario_mismatch_check(world: &Communicator, fails: &mut Vec<String>) {
    let (rank, n) = (world.rank(), world.size());
    let is_mm = |e: &Error| matches!(e, Error::MismatchedCall { .. });
    // each variant: (name, closure issuing a call that differs on rank 0)
    type Variant = (
        &'static str,
        fn(&Communicator, usize, usize) -> gpucoll::Result<()>,
    );
    let variants: Vec<Variant> = vec![
        ("count differs", |c, rank, _n| {
            let len = if rank == 0 { 10 } else { 12 };
            let a = vec![1f32; len];
            let mut b = vec![0f32; len];
            c.all_reduce_into(&a, &mut b, ReduceOp::Sum)
        }),
        ("op differs", |c, rank, _n| {
            let a = vec![1i32; 64];
            let mut b = vec![0i32; 64];
            c.all_reduce_into(
                &a,
                &mut b,
                if rank == 0 {
                    ReduceOp::Max
                } else {
                    ReduceOp::Sum
                },
            )
        }),
        ("dtype differs", |c, rank, _n| {
            if rank == 0 {
                let a = vec![1f32; 64];
                let mut b = vec![0f32; 64];
                c.all_reduce_into(&a, &mut b, ReduceOp::Sum)
            } else {
                let a = vec![1i32; 64];
                let mut b = vec![0i32; 64];
                c.all_reduce_into(&a, &mut b, ReduceOp::Sum)
            }
        }),
        ("collective differs", |c, rank, _n| {
            let mut b = vec![1u64; 64];
            if rank == 0 {
                c.process_at_rank(0).broadcast_into(&mut b)
            } else {
                c.all_reduce_in_place(&mut b, ReduceOp::Sum)
            }
        }),
        ("root differs", |c, rank, n| {
            let mut b = vec![1u8; 100];
            let root = if rank == 0 { 0 } else { n - 1 };
            c.process_at_rank(root).broadcast_into(&mut b)
        }),
        ("premulsum scalar differs", |c, rank, _n| {
            let a = vec![1f64; 100];
            let mut b = vec![0f64; 100];
            c.all_reduce_into(
                &a,
                &mut b,
                ReduceOp::PreMulSum(if rank == 0 { 2.0 } else { 3.0 }),
            )
        }),
        // (in-place vs out-of-place is deliberately not compared in the
        // signature: it does not change what the other ranks exchange)
    ];
    for (name, f) in variants {
        let dup = ok(world.duplicate(), "duplicate");
        // a first good call, so that the mismatch is not call #0
        still_works(&dup, &format!("{name}: warm-up"), fails);
        let t0 = Instant::now();
        let r = f(&dup, rank, n);
        let dt = t0.elapsed();
        let e = expect_err(
            fails,
            &format!("check mode, {name}"),
            r,
            "MismatchedCall",
            is_mm,
        );
        if dt > Duration::from_secs(30) {
            fails.push(format!(
                "{name}: MismatchedCall took {:.1}s",
                dt.as_secs_f64()
            ));
        }
        // every rank must name the same call
        let seq = match &e {
            Some(Error::MismatchedCall { seq, .. }) => *seq,
            _ => u64::MAX,
        };
        let mine = [seq];
        let mut all = vec![0u64; n];
        ok(
            mpi::all_gather(world, &mine, &mut all),
            "ref all_gather seq",
        );
        if all.iter().any(|&s| s != all[0]) {
            fails.push(format!(
                "{name}: ranks report different seq numbers {all:?}"
            ));
        }
        if rank == 0 {
            if let Some(e) = &e {
                log(&format!("{name}: {e}"));
            }
        }
        // the mismatch is fatal for that communicator ...
        let a = vec![1i64; 8];
        let mut b = vec![0i64; 8];
        expect_err(
            fails,
            &format!("{name}: call after MismatchedCall"),
            dup.all_reduce_into(&a, &mut b, ReduceOp::Sum),
            "CommunicatorFailed",
            |e| matches!(e, Error::CommunicatorFailed(_)),
        );
        // ... but not for the world
        still_works(world, &format!("world after {name}"), fails);
    }
}

fn scenario_mismatch_nocheck(world: &Communicator, fails: &mut Vec<String>) {
    let rank = world.rank();
    let want = "Timeout, ProtocolMismatch or PeerFailed";
    // (a) count differs a lot between rank 0 and the others
    {
        let dup = ok(world.duplicate(), "duplicate");
        still_works(&dup, "warm-up", fails);
        let len = if rank == 0 { 1000 } else { 200_000 };
        let a = vec![1f32; len];
        let mut b = vec![0f32; len];
        let t0 = Instant::now();
        let r = dup.all_reduce_into(&a, &mut b, ReduceOp::Sum);
        let dt = t0.elapsed().as_secs_f64();
        log(&format!(
            "count mismatch without check: {:?} after {dt:.1}s",
            r.as_ref().err()
        ));
        expect_err(
            fails,
            &format!("count mismatch (rank {rank}, len {len})"),
            r,
            want,
            is_fatal_peer,
        );
        if dt > 30.0 {
            fails.push(format!("count mismatch: error took {dt:.1}s (> 30 s)"));
        }
        let mut c = vec![0f32; 8];
        expect_err(
            fails,
            "call after failure",
            dup.all_reduce_in_place(&mut c, ReduceOp::Sum),
            "CommunicatorFailed",
            |e| matches!(e, Error::CommunicatorFailed(_)),
        );
    }
    // Ranks that only learn of the failure by their own timeout (those on
    // another simulated node) leave the call GPUCOLL_TIMEOUT later: MPI's
    // barrier (no timeout) lines everyone up before the world is used.
    ok(mpi::barrier(world), "ref barrier");
    still_works(world, "world after count mismatch", fails);
    // (b) different collectives with the same byte count
    {
        let dup = ok(world.duplicate(), "duplicate");
        still_works(&dup, "warm-up", fails);
        let n = dup.size();
        let t0 = Instant::now();
        let r = if rank == 0 {
            let a = vec![1u32; 4096];
            let mut b = vec![0u32; 4096 * n];
            dup.all_gather_into(&a, &mut b)
        } else {
            let a = vec![1u32; 4096 * n];
            let mut b = vec![0u32; 4096 * n];
            dup.all_reduce_into(&a, &mut b, ReduceOp::Sum)
        };
        let dt = t0.elapsed().as_secs_f64();
        log(&format!(
            "collective mismatch without check: {:?} after {dt:.1}s",
            r.as_ref().err()
        ));
        if dt > 30.0 {
            fails.push(format!("collective mismatch: error took {dt:.1}s (> 30 s)"));
        }
        // Without check mode a rank whose own byte stream happened to line up
        // may complete (with garbage); the others must fail, and a rank that
        // completed must fail on its next call (never hang or succeed again).
        let first_failed = r.is_err();
        match &r {
            Err(e) if !is_fatal_peer(e) => fails.push(format!(
                "collective mismatch (rank {rank}): got {e:?}, expected {want}"
            )),
            Err(_) => {}
            Ok(()) => log("NOTE: this rank's mismatched call returned Ok (garbage data)"),
        }
        let mut nfail = [0u32];
        let mine = [first_failed as u32];
        ok(
            mpi::all_reduce(world, &mine, &mut nfail, ReduceOp::Sum),
            "ref count failures",
        );
        if nfail[0] == 0 {
            fails.push("collective mismatch: no rank reported an error".into());
        }
        let want_after = if first_failed {
            "CommunicatorFailed"
        } else {
            "a fatal error"
        };
        expect_err(
            fails,
            "barrier after failure",
            dup.barrier(),
            want_after,
            |e| matches!(e, Error::CommunicatorFailed(_)) || (!first_failed && is_fatal_peer(e)),
        );
    }
    ok(mpi::barrier(world), "ref barrier");
    still_works(world, "world after collective mismatch", fails);
}

fn scenario_skip(world: &Communicator, fails: &mut Vec<String>) {
    let rank = world.rank();
    let dup = ok(world.duplicate(), "duplicate");
    still_works(&dup, "warm-up", fails);
    if rank != 1 {
        let a = vec![2.0f64; 50_000];
        let mut b = vec![0.0f64; 50_000];
        let t0 = Instant::now();
        let r = dup.all_reduce_into(&a, &mut b, ReduceOp::Sum);
        let dt = t0.elapsed().as_secs_f64();
        log(&format!(
            "rank 1 skipped: got {:?} after {dt:.1}s",
            r.as_ref().err()
        ));
        expect_err(
            fails,
            "all_reduce that rank 1 skipped",
            r,
            "Timeout, ProtocolMismatch or PeerFailed",
            is_fatal_peer,
        );
        if dt > 30.0 {
            fails.push(format!("error took {dt:.1}s (> 30 s)"));
        }
        expect_err(
            fails,
            "call after failure",
            dup.all_reduce_in_place(&mut b, ReduceOp::Sum),
            "CommunicatorFailed",
            |e| matches!(e, Error::CommunicatorFailed(_)),
        );
    }
    drop(dup);
    // then everyone leaves (the verdict all_reduce in `worker` uses MPI directly)
}

fn scenario_bad_env() -> std::result::Result<(), String> {
    let var = param("expect").unwrap_or_default();
    let universe = match gpucoll::initialize() {
        Ok(u) => u,
        Err(Error::Config { name, .. }) if name == var => {
            log(&format!("initialize() already rejected {var}"));
            return Ok(());
        }
        Err(e) => {
            return Err(format!(
                "initialize failed with {e:?}, expected Ok or Config({var})"
            ))
        }
    };
    let r = match universe.world() {
        Err(Error::Config {
            name,
            value,
            reason,
        }) if name == var => {
            log(&format!("world() -> Config {name}={value}: {reason}"));
            Ok(())
        }
        Err(e) => Err(format!(
            "world() returned {e:?}, expected Error::Config for {var}"
        )),
        Ok(w) => Err(format!(
            "world() succeeded (size {}) despite a bad {var}",
            w.size()
        )),
    };
    drop(universe);
    r
}

// ---------------------------------------------------------------------------

/// The raw pointer entry points on the host backend: without a stream they
/// run on host memory like the typed calls; a stream is rejected with a
/// clear, non-fatal error; bad pointers are rejected before anything runs.
fn scenario_raw_host(world: &Communicator, fails: &mut Vec<String>) {
    use std::ffi::c_void;
    let (rank, n) = (world.rank(), world.size());
    let c = 5usize;
    let nn = n as u64;
    let root = n - 1;
    let val = |r: usize, j: usize| (r * 100 + j) as i64;
    let cv = |p: *const i64| p as *const c_void;
    let mv = |p: *mut i64| p as *mut c_void;
    let dt = Datatype::I64;
    let tri = (n * (n - 1) / 2) as i64;

    // all_reduce, out of place and in place.
    let a: Vec<i64> = (0..c).map(|j| val(rank, j)).collect();
    let mut b = vec![-1i64; c];
    let want: Vec<i64> = (0..c).map(|j| tri * 100 + (n * j) as i64).collect();
    // SAFETY: host vectors of `c` elements, alive for the blocking call.
    let r = unsafe {
        world.all_reduce_raw(
            cv(a.as_ptr()),
            mv(b.as_mut_ptr()),
            c as u64,
            dt,
            ReduceOp::Sum,
            None,
        )
    };
    ok(r, "all_reduce_raw");
    check_exact("all_reduce_raw", &b, &want, fails);
    let mut ip = a.clone();
    // SAFETY: as above; send == recv is the in-place form.
    let r = unsafe {
        world.all_reduce_raw(
            cv(ip.as_ptr()),
            mv(ip.as_mut_ptr()),
            c as u64,
            dt,
            ReduceOp::Sum,
            None,
        )
    };
    ok(r, "all_reduce_raw in place");
    check_exact("all_reduce_raw in place", &ip, &want, fails);

    // reduce (recv ignored and null off the root).
    let mut rr = vec![-1i64; c];
    let recv = if rank == root {
        mv(rr.as_mut_ptr())
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: as above.
    ok(
        unsafe {
            world.reduce_raw(
                cv(a.as_ptr()),
                recv,
                c as u64,
                dt,
                ReduceOp::Sum,
                root,
                None,
            )
        },
        "reduce_raw",
    );
    if rank == root {
        check_exact("reduce_raw", &rr, &want, fails);
    }

    // broadcast.
    let mut bc: Vec<i64> = if rank == root {
        (0..c).map(|j| val(root, j)).collect()
    } else {
        vec![-1; c]
    };
    // SAFETY: as above.
    ok(
        unsafe { world.broadcast_raw(mv(bc.as_mut_ptr()), c as u64, dt, root, None) },
        "broadcast_raw",
    );
    check_exact(
        "broadcast_raw",
        &bc,
        &(0..c).map(|j| val(root, j)).collect::<Vec<_>>(),
        fails,
    );

    // all_gather: out of place, in place (send == recv), NCCL layout.
    let gathered: Vec<i64> = (0..n)
        .flat_map(|r| (0..c).map(move |j| val(r, j)))
        .collect();
    let mut g = vec![-1i64; c * n];
    // SAFETY: as above (recv holds c*n elements).
    ok(
        unsafe { world.all_gather_raw(cv(a.as_ptr()), mv(g.as_mut_ptr()), c as u64, dt, None) },
        "all_gather_raw",
    );
    check_exact("all_gather_raw", &g, &gathered, fails);
    for nccl in [false, true] {
        let mut g = vec![-1i64; c * n];
        g[rank * c..(rank + 1) * c].copy_from_slice(&a);
        let base = g.as_mut_ptr();
        // SAFETY: rank*c is within the buffer of c*n elements.
        let send = if nccl {
            unsafe { base.add(rank * c) }
        } else {
            base
        };
        // SAFETY: as above.
        ok(
            unsafe { world.all_gather_raw(cv(send), mv(base), c as u64, dt, None) },
            "all_gather_raw in place",
        );
        check_exact(
            &format!("all_gather_raw in place (nccl layout {nccl})"),
            &g,
            &gathered,
            fails,
        );
    }

    // reduce_scatter_block.
    let rs_in: Vec<i64> = (0..c * n).map(|j| val(rank, j)).collect();
    let rs_want: Vec<i64> = (0..c)
        .map(|j| tri * 100 + (n * (rank * c + j)) as i64)
        .collect();
    let mut rs = vec![-1i64; c];
    // SAFETY: as above.
    ok(
        unsafe {
            world.reduce_scatter_block_raw(
                cv(rs_in.as_ptr()),
                mv(rs.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                None,
            )
        },
        "reduce_scatter_block_raw",
    );
    check_exact("reduce_scatter_block_raw", &rs, &rs_want, fails);
    let mut rsi = rs_in.clone();
    // SAFETY: as above, in place.
    ok(
        unsafe {
            world.reduce_scatter_block_raw(
                cv(rsi.as_ptr()),
                mv(rsi.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                None,
            )
        },
        "reduce_scatter_block_raw in place",
    );
    check_exact(
        "reduce_scatter_block_raw in place",
        &rsi[..c],
        &rs_want,
        fails,
    );

    // all_to_all.
    let a2a_want: Vec<i64> = (0..n)
        .flat_map(|s| (0..c).map(move |j| val(s, rank * c + j)))
        .collect();
    let mut t = vec![-1i64; c * n];
    // SAFETY: as above.
    ok(
        unsafe { world.all_to_all_raw(cv(rs_in.as_ptr()), mv(t.as_mut_ptr()), c as u64, dt, None) },
        "all_to_all_raw",
    );
    check_exact("all_to_all_raw", &t, &a2a_want, fails);

    // gather and scatter (root only buffers).
    let mut gr = vec![-1i64; c * n];
    let recv = if rank == root {
        mv(gr.as_mut_ptr())
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: as above.
    ok(
        unsafe { world.gather_raw(cv(a.as_ptr()), recv, c as u64, dt, root, None) },
        "gather_raw",
    );
    if rank == root {
        check_exact("gather_raw", &gr, &gathered, fails);
    }
    let sc_src: Vec<i64> = (0..c * n).map(|j| val(root, j)).collect();
    let mut sc = vec![-1i64; c];
    let send = if rank == root {
        cv(sc_src.as_ptr())
    } else {
        std::ptr::null()
    };
    // SAFETY: as above.
    ok(
        unsafe { world.scatter_raw(send, mv(sc.as_mut_ptr()), c as u64, dt, root, None) },
        "scatter_raw",
    );
    check_exact(
        "scatter_raw",
        &sc,
        &(0..c).map(|j| val(root, rank * c + j)).collect::<Vec<_>>(),
        fails,
    );

    // Errors: local, before anything runs, leaving the communicator usable.
    #[cfg(feature = "cuda")]
    if world.device().is_none() {
        expect_err(
            fails,
            "alloc on the host backend",
            world.alloc::<f32>(4).map(|_| ()),
            "WrongMemory",
            |e| matches!(e, Error::WrongMemory(m) if m.contains("no GPU")),
        );
    }
    let stream = Some(std::ptr::null_mut::<c_void>());
    // SAFETY: the calls are rejected before touching memory.
    unsafe {
        expect_err(
            fails,
            "host pointer on a stream",
            world.all_reduce_raw(
                cv(a.as_ptr()),
                mv(b.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                stream,
            ),
            "WrongMemory",
            |e| matches!(e, Error::WrongMemory(_)),
        );
        expect_err(
            fails,
            "stream on the host backend",
            world.all_reduce_raw(
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
                dt,
                ReduceOp::Sum,
                stream,
            ),
            "InvalidUsage",
            |e| matches!(e, Error::InvalidUsage(m) if m.contains("stream")),
        );
        expect_err(
            fails,
            "null pointer",
            world.all_reduce_raw(
                std::ptr::null(),
                mv(b.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                None,
            ),
            "InvalidUsage",
            |e| matches!(e, Error::InvalidUsage(_)),
        );
        let odd = (a.as_ptr() as usize + 1) as *const c_void;
        expect_err(
            fails,
            "misaligned pointer",
            world.all_reduce_raw(odd, mv(b.as_mut_ptr()), 1, dt, ReduceOp::Sum, None),
            "InvalidUsage",
            |e| matches!(e, Error::InvalidUsage(_)),
        );
        expect_err(
            fails,
            "count overflow",
            world.all_gather_raw(cv(a.as_ptr()), mv(g.as_mut_ptr()), u64::MAX / 2, dt, None),
            "CountTooLarge",
            |e| matches!(e, Error::CountTooLarge(_)),
        );
        expect_err(
            fails,
            "bad op for the type",
            world.all_reduce_raw(
                cv(a.as_ptr()),
                mv(b.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::PreMulSum(f64::NAN),
                None,
            ),
            "InvalidOp",
            |e| matches!(e, Error::InvalidOp { .. }),
        );
    }
    if let Err(e) = world.async_error() {
        fails.push(format!("async_error() on a healthy communicator: {e:?}"));
    }
    if world.device().is_some() {
        fails.push(format!(
            "device() is {:?} on the host backend, expected None",
            world.device()
        ));
    }
    still_works(world, "after raw errors", fails);
    let _ = nn;
}

/// Rank 2 dies (SIGKILL to itself) after 200 all_reduces; the survivors keep
/// calling until one fails, and report how long after their last completed
/// call the error came and what it said. They exit without finalizing MPI
/// (a peer is gone), after freeing the communicator.
fn scenario_dead_peer() -> ! {
    let universe = ok(gpucoll::initialize(), "initialize");
    let world = ok(universe.world(), "universe.world()");
    let rank = world.rank();
    let mut x = [1.0f32; 16];
    let mut last_ok = Instant::now();
    for i in 0.. {
        if rank == 2 && i == 200 {
            // SAFETY: kill(2) on our own pid; the process ends here.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        match world.all_reduce_in_place(&mut x[..], ReduceOp::Max) {
            Ok(()) => last_ok = Instant::now(),
            Err(e) => {
                let after = last_ok.elapsed();
                let msg = e.to_string();
                let named = msg.contains("rank 2");
                let peer = matches!(e, gpucoll::Error::PeerFailed(_))
                    || matches!(e, gpucoll::Error::CommunicatorFailed(_));
                let verdict = if named && peer && after < Duration::from_secs(2) {
                    "DEADPEER ok"
                } else {
                    "DEADPEER FAIL"
                };
                println!(
                    "{verdict} rank {rank}: error after {:.3} s: {msg}",
                    after.as_secs_f64()
                );
                drop(world);
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::process::exit(0);
            }
        }
        if i > 2_000_000 {
            println!("DEADPEER FAIL rank {rank}: no error after {i} calls");
            std::process::exit(1);
        }
    }
    unreachable!("the loop only ends by exiting")
}

/// Rank 1 is interrupted in a loop of collectives on two communicators
/// (`mode=sigterm`: SIGTERM to itself; `mode=exit`: exit(0) without freeing
/// anything or finalizing MPI). The others stop with an error or are ended
/// by mpirun; the launcher checks what is left behind.
fn scenario_interrupted() -> ! {
    let universe = ok(gpucoll::initialize(), "initialize");
    let world = ok(universe.world(), "universe.world()");
    let dup = ok(world.duplicate(), "duplicate");
    let mode = param("mode").unwrap_or_default();
    let rank = world.rank();
    let mut x = vec![1u64; 4096];
    for i in 0..1_000_000u64 {
        if rank == 1 && i == 300 {
            if mode == "sigterm" {
                // SAFETY: kill(2) on our own pid.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
            } else {
                std::process::exit(0);
            }
        }
        let c = if i % 2 == 0 { &world } else { &dup };
        if c.all_reduce_in_place(&mut x[..], ReduceOp::Max).is_err() {
            // A peer is gone: leave without MPI (it cannot finish).
            std::process::exit(1);
        }
    }
    fail_now("rank 1 was never interrupted")
}
