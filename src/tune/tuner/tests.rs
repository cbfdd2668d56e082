//! The tuner's choices on fixed capabilities and topologies: which algorithm, protocol and chunk each kind of call gets.

use super::*;
use crate::datatype::Datatype;
use crate::op::ReduceOp;
use crate::tune::caps::LinkCost;

fn caps(direct: bool) -> BackendCaps {
    BackendCaps {
        protocols: vec![Protocol::Simple, Protocol::LL],
        oneshot_protocols: vec![Protocol::Simple, Protocol::LL],
        max_channels: 8,
        slot_bytes: 1 << 16,
        fifo_slots: 8,
        intra: LinkCost {
            latency_us: 1.0,
            bandwidth_gbs: 8.0,
        },
        inter: LinkCost {
            latency_us: 10.0,
            bandwidth_gbs: 4.0,
        },
        launch_us: 4.0,
        direct,
        oneshot_max_bytes: model::ONESHOT_MAX_BYTES,
        collnet: true,
        rail: crate::tune::caps::links::MPI_RAIL,
        copy_engine: None,
    }
}

fn task(kind: CollKind, count: u64) -> Task {
    Task {
        kind,
        dtype: Datatype::F32,
        op: ReduceOp::Sum,
        count,
        root: 0,
        in_place: false,
    }
}

fn multi_node() -> Topology {
    Topology::from_node_keys(0, &[0, 0, 1, 1, 2, 2, 3, 3])
}

#[test]
fn copy_engines_where_they_can_run() {
    let with_ce = BackendCaps {
        copy_engine: Some(crate::tune::caps::links::CUDA_CE),
        ..caps(true)
    };
    let cfg = |ce| Config {
        ce,
        ..Config::default()
    };
    let one_node = Topology::single_node(0, 4);
    let forced = Tuner::new(&one_node, &with_ce, &cfg(CeMode::On));
    for kind in CollKind::ALL {
        let moves_only = crate::tune::model::copy_engine_kind(kind);
        for count in [1u64, 1000, 1 << 24] {
            let ce = forced.choose(&task(kind, count)).algorithm == Algorithm::CopyEngine;
            assert_eq!(ce, moves_only, "{kind:?} {count}");
            // Never in a group launch.
            let grouped = forced.choose_in(&task(kind, count), true).algorithm;
            assert_ne!(grouped, Algorithm::CopyEngine, "{kind:?}");
        }
        assert_ne!(
            forced.choose(&task(kind, 0)).algorithm,
            Algorithm::CopyEngine
        );
    }
    // Off, several nodes, or a backend without copy engines: never.
    let off = Tuner::new(&one_node, &with_ce, &cfg(CeMode::Off));
    let nodes = Tuner::new(&multi_node(), &with_ce, &cfg(CeMode::On));
    let none = Tuner::new(&one_node, &caps(true), &cfg(CeMode::On));
    for t in [&off, &nodes, &none] {
        for kind in CollKind::ALL {
            assert_ne!(
                t.choose(&task(kind, 1 << 24)).algorithm,
                Algorithm::CopyEngine
            );
        }
    }
    // Automatic: small calls keep their kernels (the copy engines' fixed
    // cost); the choice follows the model.
    let auto = Tuner::new(&one_node, &with_ce, &cfg(CeMode::Auto));
    assert_ne!(
        auto.choose(&task(CollKind::AllGather, 16)).algorithm,
        Algorithm::CopyEngine
    );
}

#[test]
fn deterministic_and_valid() {
    let sizes = [0u64, 1, 7, 1000, 1 << 16, 1 << 20, 1 << 26, u64::MAX / 2];
    for topo in [
        Topology::single_node(0, 4),
        multi_node(),
        Topology::single_node(0, 1),
    ] {
        for direct in [false, true] {
            let c = caps(direct);
            let a = Tuner::new(&topo, &c, &Config::default());
            let b = Tuner::new(&topo.as_rank(topo.nranks - 1), &c, &Config::default());
            for kind in CollKind::ALL {
                for &n in &sizes {
                    let t = task(kind, n);
                    let ch = a.choose(&t);
                    assert_eq!(ch, b.choose(&t));
                    assert_eq!(ch, a.choose(&t));
                    assert!(ch.nchannels >= 1 && ch.nchannels <= c.max_channels);
                    assert!(ch.chunk_bytes <= c.slot_bytes * c.fifo_slots / 2);
                    assert!(ch.chunk_bytes >= c.slot_bytes);
                    assert_eq!(ch.chunk_bytes % 64, 0);
                    assert!(c.protocols.contains(&ch.protocol));
                    match kind {
                        k if k != CollKind::AllReduce && ch.algorithm == Algorithm::OneShot => {
                            // Segments of n elements in the inboxes.
                            assert!(direct && topo.nnodes() == 1);
                            assert!(n * 4 <= model::ONESHOT_MAX_BYTES);
                        }
                        CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => {
                            assert_eq!(ch.algorithm, Algorithm::Pairwise)
                        }
                        CollKind::AllReduce => {
                            if ch.algorithm == Algorithm::Tree {
                                assert!(topo.nnodes() > 1);
                            }
                            if matches!(ch.algorithm, Algorithm::Pairwise | Algorithm::OneShot) {
                                assert!(direct && topo.nnodes() == 1);
                            }
                            if ch.algorithm == Algorithm::OneShot {
                                assert!(n * 4 <= model::ONESHOT_MAX_BYTES);
                            }
                        }
                        CollKind::Reduce
                        | CollKind::Broadcast
                        | CollKind::AllGather
                        | CollKind::ReduceScatter
                        | CollKind::Scan
                        | CollKind::ExclusiveScan => assert_eq!(ch.algorithm, Algorithm::Ring),
                    }
                }
            }
        }
    }
}

#[test]
fn collnet_when_forced_or_clearly_cheaper() {
    let host_like = |collnet: bool| BackendCaps {
        intra: crate::tune::caps::links::HOST_SHM,
        inter: crate::tune::caps::links::MPI_NET,
        collnet,
        ..caps(false)
    };
    let even = Topology::from_node_keys(0, &[0, 0, 1, 1]);
    let uneven = Topology::from_node_keys(0, &[0, 0, 1]);
    // Uncalibrated, MPI's host all_reduce is costed above gpucoll's own
    // rings and trees: never chosen automatically.
    let auto = Tuner::new(&even, &host_like(true), &Config::default());
    for count in [1u64, 1000, 1 << 16, 1 << 20, 1 << 26] {
        assert_ne!(
            auto.choose(&task(CollKind::AllReduce, count)).algorithm,
            Algorithm::CollNet
        );
    }
    // An MPI whose all_reduce is far cheaper (offloaded) takes over
    // where the inter-node part dominates (one rank per node).
    let offloaded = BackendCaps {
        rail: LinkCost {
            latency_us: 2.0,
            bandwidth_gbs: 200.0,
        },
        ..host_like(true)
    };
    let one_per_node = Topology::from_node_keys(0, &[0, 1, 2, 3]);
    let t = Tuner::new(&one_per_node, &offloaded, &Config::default());
    assert_eq!(
        t.choose(&task(CollKind::AllReduce, 1 << 26)).algorithm,
        Algorithm::CollNet
    );
    let forced = Config {
        algo: Some(Algorithm::CollNet),
        ..Config::default()
    };
    let t = Tuner::new(&even, &host_like(true), &forced);
    assert_eq!(
        t.choose(&task(CollKind::AllReduce, 1 << 20)).algorithm,
        Algorithm::CollNet
    );
    // Other collectives ignore it; uneven nodes or no rails: the ring.
    assert_ne!(
        t.choose(&task(CollKind::AllGather, 1 << 20)).algorithm,
        Algorithm::CollNet
    );
    for (topo, rails) in [(&uneven, true), (&even, false)] {
        let t = Tuner::new(topo, &host_like(rails), &forced);
        assert_eq!(
            t.choose(&task(CollKind::AllReduce, 1 << 20)).algorithm,
            Algorithm::Ring
        );
    }
}

#[test]
fn small_messages_one_channel_large_many() {
    let t = Tuner::new(
        &Topology::single_node(0, 4),
        &caps(false),
        &Config::default(),
    );
    assert_eq!(t.choose(&task(CollKind::AllReduce, 1)).nchannels, 1);
    assert_eq!(t.choose(&task(CollKind::AllReduce, 1000)).nchannels, 1);
    assert_eq!(t.choose(&task(CollKind::AllReduce, 1 << 28)).nchannels, 8);
    // Small all_reduce across nodes prefers the tree, large the ring.
    let m = Tuner::new(&multi_node(), &caps(false), &Config::default());
    assert_eq!(
        m.choose(&task(CollKind::AllReduce, 2)).algorithm,
        Algorithm::Tree
    );
    assert_eq!(
        m.choose(&task(CollKind::AllReduce, 1 << 28)).algorithm,
        Algorithm::Ring
    );
    assert_eq!(
        m.choose(&task(CollKind::AllReduce, 2)).protocol,
        Protocol::LL
    );
    assert_eq!(
        m.choose(&task(CollKind::AllReduce, 1 << 28)).protocol,
        Protocol::Simple
    );
}

#[test]
fn oneshot_protocols_apply_to_the_oneshot_only() {
    // A GPU-like backend: step plans speak Simple only, the one-shot
    // speaks LL too.
    let topo = Topology::single_node(0, 2);
    let mut c = caps(true);
    c.protocols = vec![Protocol::Simple];
    let t = Tuner::new(&topo, &c, &Config::default());
    let small = t.choose(&task(CollKind::AllReduce, 2));
    assert_eq!(
        (small.algorithm, small.protocol),
        (Algorithm::OneShot, Protocol::LL)
    );
    // In a group the same call runs the direct step plan.
    assert_eq!(
        t.choose_in(&task(CollKind::AllReduce, 2), true).algorithm,
        Algorithm::Pairwise
    );
    let beyond_ll = t.choose(&task(
        CollKind::AllReduce,
        (model::ONESHOT_LL_MAX_BYTES / 4) * 2,
    ));
    assert_ne!(beyond_ll.protocol, Protocol::LL);
    for kind in CollKind::ALL {
        for n in [1u64, 1 << 10, 1 << 20, 1 << 26] {
            let ch = t.choose(&task(kind, n));
            if ch.protocol == Protocol::LL {
                assert_eq!(ch.algorithm, Algorithm::OneShot, "{kind:?}");
                assert!(n * 4 <= model::ONESHOT_LL_MAX_BYTES);
            }
        }
    }
    // Forcing LL where only the one-shot has it: large calls stay Simple.
    let cfg = Config {
        proto: Some(Protocol::LL),
        ..Config::default()
    };
    let t = Tuner::new(&topo, &c, &cfg);
    assert_eq!(
        t.choose(&task(CollKind::AllReduce, 8)).protocol,
        Protocol::LL
    );
    let big = t.choose(&task(CollKind::AllReduce, 1 << 26));
    assert_eq!(big.protocol, Protocol::Simple);
    // Forced direct and LL beyond the LL one-shot: the Simple one-shot.
    let cfg = Config {
        algo: Some(Algorithm::Pairwise),
        proto: Some(Protocol::LL),
        ..Config::default()
    };
    let t = Tuner::new(&topo, &c, &cfg);
    let c2 = t.choose(&task(CollKind::AllReduce, model::ONESHOT_LL_MAX_BYTES / 2));
    assert_eq!(
        (c2.algorithm, c2.protocol),
        (Algorithm::OneShot, Protocol::Simple)
    );
    let c1 = t.choose(&task(CollKind::AllReduce, 8));
    assert_eq!(
        (c1.algorithm, c1.protocol),
        (Algorithm::OneShot, Protocol::LL)
    );
    // Beyond the one-shot's inboxes, forced direct is the pairwise plan.
    let c3 = t.choose(&task(CollKind::AllReduce, model::ONESHOT_MAX_BYTES / 4 * 2));
    assert_eq!(
        (c3.algorithm, c3.protocol),
        (Algorithm::Pairwise, Protocol::Simple)
    );
    // all_gather has no pairwise plan (direct is ignored for it), but its
    // one-shot speaks LL; beyond the LL inboxes the ring runs Simple.
    let ag = t.choose(&task(CollKind::AllGather, 8));
    assert_eq!(
        (ag.algorithm, ag.protocol),
        (Algorithm::OneShot, Protocol::LL)
    );
    assert_eq!(
        t.choose(&task(CollKind::AllGather, 1 << 26)).protocol,
        Protocol::Simple
    );
    // Gather has no one-shot: Simple.
    assert_eq!(
        t.choose(&task(CollKind::Gather, 8)).protocol,
        Protocol::Simple
    );
}

#[test]
fn overrides_honoured_or_ignored() {
    let topo = Topology::single_node(0, 4);
    let cfg = Config {
        algo: Some(Algorithm::Tree),
        proto: Some(Protocol::LL),
        nchannels: Some(3),
        ..Config::default()
    };
    let t = Tuner::new(&topo, &caps(false), &cfg);
    let c = t.choose(&task(CollKind::AllReduce, 1 << 26));
    assert_eq!(
        (c.algorithm, c.protocol, c.nchannels),
        (Algorithm::Tree, Protocol::LL, 3)
    );
    // Tree does not apply to all_gather: ignored.
    assert_eq!(
        t.choose(&task(CollKind::AllGather, 10)).algorithm,
        Algorithm::Ring
    );
    // Unavailable protocol and too many channels.
    let cfg = Config {
        algo: Some(Algorithm::Pairwise),
        proto: Some(Protocol::LL128),
        nchannels: Some(1000),
        ..Config::default()
    };
    let t = Tuner::new(&topo, &caps(false), &cfg);
    let c = t.choose(&task(CollKind::AllReduce, 1 << 26));
    assert_eq!(
        c.algorithm,
        Algorithm::Ring,
        "direct unavailable on host caps"
    );
    assert_ne!(c.protocol, Protocol::LL128);
    assert_eq!(c.nchannels, 8);
    assert_eq!(
        t.choose(&task(CollKind::Gather, 10)).algorithm,
        Algorithm::Pairwise
    );
    // Direct available: `direct` is the one-shot where it fits.
    let t = Tuner::new(&topo, &caps(true), &cfg);
    assert_eq!(
        t.choose(&task(CollKind::AllReduce, 10)).algorithm,
        Algorithm::OneShot
    );
    // The one-shot forced where no direct path exists (host): through
    // FIFOs at any size; across nodes it does not apply.
    let cfg = Config {
        algo: Some(Algorithm::OneShot),
        ..Config::default()
    };
    let t = Tuner::new(&topo, &caps(false), &cfg);
    for n in [1u64, 1 << 26] {
        assert_eq!(
            t.choose(&task(CollKind::AllReduce, n)).algorithm,
            Algorithm::OneShot
        );
    }
    assert_eq!(
        t.choose(&task(CollKind::AllGather, 10)).algorithm,
        Algorithm::Ring
    );
    let t = Tuner::new(&multi_node(), &caps(false), &cfg);
    assert_ne!(
        t.choose(&task(CollKind::AllReduce, 10)).algorithm,
        Algorithm::OneShot
    );
    // Forced direct for a ring-only collective: ignored.
    assert_eq!(
        t.choose(&task(CollKind::Broadcast, 10)).algorithm,
        Algorithm::Ring
    );
}

#[test]
fn chunk_is_half_fifo_or_one_slot() {
    let mut c = caps(false);
    c.slot_bytes = 4096;
    c.fifo_slots = 2;
    assert_eq!(max_chunk_bytes(&c), 4096);
    c.fifo_slots = 1;
    assert_eq!(max_chunk_bytes(&c), 4096);
    c.fifo_slots = 5;
    assert_eq!(max_chunk_bytes(&c), 10240);
    c.slot_bytes = 100;
    c.fifo_slots = 3;
    assert_eq!(max_chunk_bytes(&c), 128);
}

/// The costs the CUDA backend agreed on one H200 under MPS with two
/// simulated nodes of one rank (`bench/results/2026-12-02-h200x1-net`:
/// MPI 1.28 µs / 3.76 GB/s point-to-point, 2.58 µs / 5.47 GB/s rail, plus
/// the NET bridge), and what `gpucoll-bench --algos` measured there: collnet
/// fastest up to 8 KiB (29-40 µs against 38-46 for ring and tree), ring
/// or tree within 4 % of each other from 32 KiB on, collnet 1.05-2× slower.
#[test]
fn net_choices_follow_the_measured_crossover() {
    let bridge = crate::tune::caps::links::CUDA_NET_BRIDGE_US;
    let cuda_net = BackendCaps {
        protocols: vec![Protocol::Simple],
        oneshot_protocols: Vec::new(),
        max_channels: 4,
        slot_bytes: 128 << 10,
        fifo_slots: 8,
        intra: crate::tune::caps::links::CUDA_P2P,
        inter: LinkCost {
            latency_us: 1.276 + bridge,
            bandwidth_gbs: 3.755,
        },
        launch_us: crate::tune::caps::links::CUDA_LAUNCH_US,
        direct: false,
        oneshot_max_bytes: crate::tune::model::ONESHOT_MAX_BYTES,
        collnet: true,
        rail: LinkCost {
            latency_us: 2.582 + bridge,
            bandwidth_gbs: 5.471,
        },
        copy_engine: None,
    };
    let two_nodes = Topology::from_node_keys(0, &[0, 1]);
    let t = Tuner::new(&two_nodes, &cuda_net, &Config::default());
    let algo = |bytes: u64| t.choose(&task(CollKind::AllReduce, bytes / 4)).algorithm;
    for bytes in [8u64, 512, 2048, 8192] {
        assert_eq!(algo(bytes), Algorithm::CollNet, "{bytes} B");
    }
    for bytes in [32u64 << 10, 128 << 10, 2 << 20, 32 << 20, 512 << 20] {
        assert!(
            matches!(algo(bytes), Algorithm::Ring | Algorithm::Tree),
            "{bytes} B: {:?}",
            algo(bytes)
        );
    }
}

/// scan and exclusive_scan have one algorithm, the chain: at every size,
/// on one node or several, forced or not, in a group or not, and channels
/// grow with the size as for every collective.
#[test]
fn scans_always_run_their_chain() {
    let sizes = [1u64, 1000, 1 << 16, 1 << 20, 1 << 26];
    for topo in [Topology::single_node(0, 4), multi_node()] {
        for direct in [false, true] {
            for algo in [
                None,
                Some(Algorithm::OneShot),
                Some(Algorithm::Tree),
                Some(Algorithm::Pairwise),
            ] {
                let cfg = Config {
                    algo,
                    ..Config::default()
                };
                let t = Tuner::new(&topo, &caps(direct), &cfg);
                for kind in [CollKind::Scan, CollKind::ExclusiveScan] {
                    for grouped in [false, true] {
                        let chosen: Vec<Choice> = sizes
                            .iter()
                            .map(|&n| t.choose_in(&task(kind, n), grouped))
                            .collect();
                        for c in &chosen {
                            assert_eq!(c.algorithm, Algorithm::Ring, "{kind:?} {algo:?}");
                        }
                        assert_eq!(chosen[0].nchannels, 1);
                        assert!(chosen[4].nchannels > 1, "{kind:?}");
                    }
                }
            }
        }
    }
    // The model: exclusive_scan moves twice scan's bytes over each link.
    let shape = model::Shape {
        nranks: 4,
        nnodes: 1,
        ppn: 4,
        uniform: true,
    };
    let est = |kind, bytes| {
        model::estimate_us(
            kind,
            Algorithm::Ring,
            Protocol::Simple,
            1,
            bytes,
            &shape,
            &caps(true),
        )
        .expect("the chain is priced")
    };
    let big = 1e9;
    assert!(est(CollKind::ExclusiveScan, big) > 1.9 * est(CollKind::Scan, big));
    assert!(est(CollKind::Scan, 8.0) < est(CollKind::Scan, big));
    for kind in [CollKind::Scan, CollKind::ExclusiveScan] {
        for a in [
            Algorithm::OneShot,
            Algorithm::Tree,
            Algorithm::Pairwise,
            Algorithm::CopyEngine,
        ] {
            assert_eq!(
                model::estimate_us(kind, a, Protocol::Simple, 1, 8.0, &shape, &caps(true)),
                None
            );
        }
    }
}
