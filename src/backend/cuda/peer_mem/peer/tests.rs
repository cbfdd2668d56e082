//! CPU tests of the peer kernels' decisions (no driver calls).

use super::*;
use crate::datatype::Datatype;
use crate::op::Reduction;
use crate::task::Task;
use crate::tune::Protocol;

fn plan(kind: CollKind, op: ReduceOp, dtype: Datatype, count: u64, algorithm: Algorithm) -> Plan {
    let task = Task {
        kind,
        dtype,
        op,
        count,
        root: 0,
        in_place: false,
    };
    Plan {
        task,
        reduction: Reduction::lower(op, dtype, 2),
        algorithm,
        protocol: Protocol::Simple,
        chunk_elems: count.max(1),
        scratch_elems: 0,
        channels: Vec::new(),
    }
}

fn sum(kind: CollKind, count: u64) -> Plan {
    plan(kind, ReduceOp::Sum, Datatype::F32, count, Algorithm::Ring)
}

#[test]
fn forced_mode_asks_for_the_four_collectives_only() {
    let on = RegisteredMode::On;
    for kind in [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::Broadcast,
    ] {
        assert!(
            peer_candidate(&sum(kind, 1), false, 2, on, false),
            "{kind:?}"
        );
        // Not in a group, not empty, not on one rank or beyond 8.
        assert!(!peer_candidate(&sum(kind, 1), true, 2, on, false));
        assert!(!peer_candidate(&sum(kind, 0), false, 2, on, false));
        assert!(!peer_candidate(&sum(kind, 1), false, 1, on, false));
        assert!(!peer_candidate(&sum(kind, 1), false, 9, on, false));
    }
    for kind in [
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Reduce,
    ] {
        assert!(!peer_candidate(&sum(kind, 1 << 20), false, 2, on, true));
    }
    assert!(!peer_candidate(
        &sum(CollKind::AllReduce, 1 << 20),
        false,
        2,
        RegisteredMode::Off,
        true
    ));
}

#[test]
fn auto_mode_needs_a_registration_and_a_large_call() {
    let auto = RegisteredMode::Auto;
    let big = REGISTERED_AUTO_MIN_BYTES / 4;
    let p = sum(CollKind::AllReduce, big);
    assert!(peer_candidate(&p, false, 2, auto, true));
    assert!(!peer_candidate(&p, false, 2, auto, false));
    assert!(!peer_candidate(
        &sum(CollKind::AllReduce, big - 1),
        false,
        2,
        auto,
        true
    ));
    // all_gather's size is the whole output: n blocks.
    assert!(peer_candidate(
        &sum(CollKind::AllGather, big / 4),
        false,
        4,
        auto,
        true
    ));
    assert!(!peer_candidate(
        &sum(CollKind::AllGather, big / 4),
        false,
        2,
        auto,
        true
    ));
    // Absurd counts saturate instead of overflowing.
    assert!(peer_candidate(
        &sum(CollKind::ReduceScatter, u64::MAX),
        false,
        8,
        auto,
        true
    ));
}

#[test]
fn premulsum_copy_engines_and_collnet_keep_their_plans() {
    let on = RegisteredMode::On;
    let pre = plan(
        CollKind::AllReduce,
        ReduceOp::PreMulSum(0.5),
        Datatype::F32,
        64,
        Algorithm::Ring,
    );
    assert!(!peer_candidate(&pre, false, 2, on, true));
    // Float Avg scales every rank's input by the same 1/n.
    let avg = plan(
        CollKind::AllReduce,
        ReduceOp::Avg,
        Datatype::F32,
        64,
        Algorithm::Ring,
    );
    assert!(peer_candidate(&avg, false, 2, on, true));
    for a in [Algorithm::CopyEngine, Algorithm::CollNet] {
        let p = plan(CollKind::AllGather, ReduceOp::Sum, Datatype::F32, 64, a);
        assert!(!peer_candidate(&p, false, 2, on, true), "{a:?}");
    }
    for a in [Algorithm::Pairwise, Algorithm::OneShot, Algorithm::Tree] {
        let p = plan(CollKind::AllReduce, ReduceOp::Sum, Datatype::F32, 64, a);
        assert!(peer_candidate(&p, false, 2, on, true), "{a:?}");
    }
}

#[test]
fn shared_buffers_and_hand_shakes_match_between_ranks() {
    for n in 2..=8 {
        for kind in [
            CollKind::AllReduce,
            CollKind::ReduceScatter,
            CollKind::AllGather,
            CollKind::Broadcast,
        ] {
            for root in [0, n - 1] {
                for me in 0..n {
                    let (touch, touched_by) = touches(kind, n, me, root);
                    // Every rank I touch lists me among those touching it,
                    // so each ready has its wait and each done its wait.
                    for &p in &touch {
                        assert!(touches(kind, n, p, root).1.contains(&me));
                        // ... and what I touch of p is shared by p.
                        let (r, w) = shared(kind, p, root);
                        assert!(r || w || kind == CollKind::ReduceScatter);
                    }
                    for &p in &touched_by {
                        assert!(touches(kind, n, p, root).0.contains(&me));
                    }
                    assert!(!touch.contains(&me) && !touched_by.contains(&me));
                }
            }
        }
    }
    assert_eq!(shared(CollKind::Broadcast, 0, 0), (false, false));
    assert_eq!(shared(CollKind::Broadcast, 1, 0), (false, true));
    assert_eq!(shared(CollKind::ReduceScatter, 1, 0), (true, false));
}

#[test]
fn calls_agree_on_their_digest_and_buffer_extents() {
    let mem = Mem {
        addr: 0x1000,
        elems: 1 << 20,
    };
    let a = PeerCall::new(&sum(CollKind::AllReduce, 10), mem, mem, 3);
    let b = PeerCall::new(
        &plan(
            CollKind::AllReduce,
            ReduceOp::Max,
            Datatype::F32,
            10,
            Algorithm::Ring,
        ),
        mem,
        mem,
        3,
    );
    let c = PeerCall::new(&sum(CollKind::AllGather, 10), mem, mem, 3);
    assert_ne!(a.digest(), b.digest(), "the reduction is part of the call");
    assert_ne!(a.digest(), c.digest());
    assert_eq!(
        a.digest(),
        PeerCall {
            seq: 9,
            ..a.clone()
        }
        .digest()
    );
    assert_eq!(c.extents(4, 1), (10, 40));
    let rs = PeerCall::new(&sum(CollKind::ReduceScatter, 10), mem, mem, 3);
    assert_eq!(rs.extents(4, 1), (40, 10));
    let bc = PeerCall::new(&sum(CollKind::Broadcast, 10), mem, mem, 3);
    assert_eq!(bc.extents(4, 0), (10, 10));
    assert_eq!(bc.extents(4, 2), (0, 10));
}

#[test]
fn grids_grow_with_the_bytes_up_to_the_cap() {
    assert_eq!(grid(1), 1);
    assert_eq!(grid(16 * u64::from(THREADS) * UNROLL), 1);
    assert_eq!(grid(16 * u64::from(THREADS) * UNROLL + 1), 2);
    assert_eq!(grid(u64::MAX), MAX_BLOCKS as u32);
}

#[test]
fn overlap_is_shared_memory_of_both_ranges() {
    let m = |addr| Mem { addr, elems: 0 };
    assert!(overlaps(&m(100), 10, &m(105), 10));
    assert!(overlaps(&m(100), 40, &m(100), 10));
    assert!(!overlaps(&m(100), 10, &m(110), 10));
    assert!(!overlaps(&m(100), 0, &m(100), 10));
}
