//! How the interpreter fails: a missing peer times out with a useful
//! message, the abort flag stops a blocked channel, mismatched collectives
//! and out-of-bounds regions are refused.

use super::*;

#[test]
fn missing_peer_times_out_with_a_useful_message() {
    let w = World::new(2, 256);
    let fab = w.fabric(0, Duration::from_millis(150));
    let input = vec![1i32; 10];
    let mut output = vec![0i32; 10];
    let mut f = flow(
        Peers::one(1),
        Peers::NONE,
        Some(Region::input(0)),
        Some(Region::output(0)),
        10,
    );
    f.pre_op = false;
    let launch = Launch {
        first_seq: 12,
        stream: None,
        items: vec![BoundPlan {
            plan: plan(
                CollKind::AllReduce,
                Datatype::I32,
                ReduceOp::Sum,
                2,
                10,
                vec![vec![], vec![Step::Flow(f)]],
            ),
            input: input.raw(),
            output: output.raw_mut(),
        }],
    };
    let t0 = Instant::now();
    let err = prepare(&fab, &launch)
        .and_then(|p| execute(&fab, &p, false))
        .unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(150));
    match err {
        Error::Timeout {
            seq, waiting_for, ..
        } => {
            assert_eq!(seq, 12);
            assert_eq!(
                waiting_for,
                "recv from rank 1 on channel 1 (collective #12)"
            );
        }
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn abort_flag_stops_a_blocked_channel() {
    let w = World::new(2, 256);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            w.abort.store(true, Ordering::Release);
        });
        let fab = w.fabric(0, Duration::from_secs(30));
        let input = vec![1i32; 10];
        let mut output = vec![0i32; 10];
        let launch = Launch {
            first_seq: 1,
            stream: None,
            items: vec![BoundPlan {
                plan: plan(
                    CollKind::AllReduce,
                    Datatype::I32,
                    ReduceOp::Sum,
                    2,
                    10,
                    vec![ring_allreduce(0, 2, 0, 10)],
                ),
                input: input.raw(),
                output: output.raw_mut(),
            }],
        };
        let err = prepare(&fab, &launch)
            .and_then(|p| execute(&fab, &p, true))
            .unwrap_err();
        assert!(matches!(err, Error::PeerFailed(_)), "{err}");
    });
}

#[test]
fn mismatched_collectives_are_detected() {
    let n = 2;
    let w = World::new(n, 256);
    let inputs = vec![vec![5i64; 64]; 2];
    // Rank 0 thinks this is collective #7, rank 1 #8.
    let results = run_ranks(
        &w,
        Duration::from_secs(5),
        false,
        &inputs,
        64,
        false,
        |r| 7 + r as u64,
        |r| {
            plan(
                CollKind::AllReduce,
                Datatype::I64,
                ReduceOp::Sum,
                n,
                64,
                vec![ring_allreduce(r, n, 0, 64)],
            )
        },
    );
    let errs: Vec<String> = results
        .iter()
        .filter_map(|(r, _)| r.as_ref().err())
        .map(|e| e.to_string())
        .collect();
    assert!(
        results.iter().any(|(r, _)| matches!(
            r,
            Err(Error::ProtocolMismatch { detail, .. }) if detail.contains("expected collective #")
        )),
        "{errs:?}"
    );
    // Different sizes of the same collective are caught too.
    let w = World::new(n, 256);
    let results = run_ranks(
        &w,
        Duration::from_secs(5),
        false,
        &inputs,
        64,
        false,
        |_| 9,
        |r| {
            let count = if r == 0 { 64 } else { 60 };
            plan(
                CollKind::AllReduce,
                Datatype::I64,
                ReduceOp::Sum,
                n,
                count,
                vec![ring_allreduce(r, n, 0, count)],
            )
        },
    );
    assert!(results
        .iter()
        .any(|(r, _)| matches!(r, Err(Error::ProtocolMismatch { .. }))));
}

#[test]
fn out_of_bounds_regions_are_rejected() {
    let w = World::new(1, 256);
    let fab = w.fabric(0, Duration::from_secs(1));
    let input = vec![1i32; 10];
    let mut output = vec![0i32; 10];
    let launch = Launch {
        first_seq: 1,
        stream: None,
        items: vec![BoundPlan {
            plan: plan(
                CollKind::AllReduce,
                Datatype::I32,
                ReduceOp::Sum,
                1,
                11,
                vec![ring_allreduce(0, 1, 0, 11)],
            ),
            input: input.raw(),
            output: output.raw_mut(),
        }],
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        prepare(&fab, &launch).map(|_| ())
    }));
    match r {
        Err(_) => {
            #[cfg(not(debug_assertions))]
            panic!("only debug builds assert");
        }
        Ok(Err(Error::Backend(m))) => assert!(m.contains("holds 10"), "{m}"),
        Ok(other) => panic!("expected a plan error, got {other:?}"),
    }
}
