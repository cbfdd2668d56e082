//! Multi-rank error-path tests: argument errors are local and leave the
//! communicator usable; disagreements between ranks are reported (check
//! mode: MismatchedCall everywhere; otherwise Timeout / ProtocolMismatch /
//! PeerFailed within GPUCOLL_TIMEOUT) and never hang; a failed communicator
//! stays failed; bad configuration is rejected.

#[path = "mpi_errors/args.rs"]
mod args;
mod common;
#[path = "mpi_errors/raw_host.rs"]
mod raw_host;

use args::{scenario_bad_args, scenario_bad_root, scenario_freed};
use common::*;
use gpucoll::prelude::*;
use gpucoll::reference as mpi;
use gpucoll::CollKind;
use raw_host::scenario_raw_host;
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
