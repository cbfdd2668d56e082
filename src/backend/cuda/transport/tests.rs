use super::net::NetLayout;
use super::*;
use crate::backend::cuda::abi::{CONN_HEADER, CONN_META_OFF, CONN_TAIL_OFF};
use crate::backend::cuda::layout::{
    FifoAreas, FIFO_SLOTS, NET_CHANNELS, ONESHOT_MAX_BYTES, SLOT_BYTES_NET,
};
use crate::tune::caps::links;

/// Rank `rank` of ranks whose nodes are `keys` (equal keys: one node).
fn topo(rank: usize, keys: &[u64]) -> Topology {
    Topology::from_node_keys(rank, keys)
}

fn route(rank: usize, keys: &[u64], p2p: bool) -> Route {
    let t = topo(rank, keys);
    select(&Facts { topo: &t, p2p }).unwrap()
}

fn kinds(r: &Route, n: usize) -> Vec<Option<Kind>> {
    (0..n).map(|p| r.of(p)).collect()
}

use Kind::{Net, P2p, Shm};

#[test]
fn each_peer_gets_the_first_transport_that_accepts_it() {
    // 4 ranks on 2 nodes ({0, 1}, {2, 3}).
    let keys = [7, 7, 9, 9];
    let t = topo(0, &keys);
    let facts = Facts {
        topo: &t,
        p2p: true,
    };
    // SHM and P2P both accept rank 1; P2P comes first in the table.
    assert!(Shm.row().can_connect(&facts, 1) && P2p.row().can_connect(&facts, 1));
    assert!(!Net.row().can_connect(&facts, 1) && Net.row().can_connect(&facts, 2));
    let r = select(&facts).unwrap();
    assert_eq!(kinds(&r, 4), [None, Some(P2p), Some(Net), Some(Net)]);
    assert_eq!(r.node(), P2p);
    assert_eq!(r.in_use(), [P2p, Net]);
    assert_eq!(r.peers_of(Net), [2, 3]);
    // Seen from rank 3: its node is {2, 3}.
    let r = route(3, &keys, true);
    assert_eq!(kinds(&r, 4), [Some(Net), Some(Net), Some(P2p), None]);
    assert_eq!(r.peers_of(Net), [0, 1]);
}

#[test]
fn without_p2p_the_node_falls_back_to_shm() {
    let r = route(1, &[0, 0, 0], false);
    assert_eq!(kinds(&r, 3), [Some(Shm), None, Some(Shm)]);
    assert_eq!((r.node(), r.in_use()), (Shm, vec![Shm]));
    // With P2P on, the same node runs P2P only.
    let r = route(1, &[0, 0, 0], true);
    assert_eq!((r.node(), r.in_use()), (P2p, vec![P2p]));
    // Across nodes the node's peers fall back, the others stay on NET.
    let r = route(0, &[1, 2, 1, 2], false);
    assert_eq!(kinds(&r, 4), [None, Some(Net), Some(Shm), Some(Net)]);
    assert_eq!(r.in_use(), [Shm, Net]);
}

#[test]
fn peers_on_other_nodes_get_net_and_a_lone_rank_keeps_its_node_transport() {
    // Rank 0 alone on its node: every peer is on NET, yet its node's
    // transport still comes up (its stage is collective).
    let r = route(0, &[5, 6, 6], true);
    assert_eq!(kinds(&r, 3), [None, Some(Net), Some(Net)]);
    assert_eq!((r.node(), r.in_use()), (P2p, vec![P2p, Net]));
    let r = route(0, &[5, 6, 6], false);
    assert_eq!(r.in_use(), [Shm, Net]);
    // One rank per node everywhere.
    let r = route(2, &[1, 2, 3, 4], true);
    assert_eq!(kinds(&r, 4), [Some(Net), Some(Net), None, Some(Net)]);
    // A single rank: no peer, its node's transport only.
    let r = route(0, &[0], true);
    assert_eq!((kinds(&r, 1), r.in_use()), (vec![None], vec![P2p]));
}

#[test]
fn costs_are_each_transports_own() {
    let m = Measured {
        hop: LinkCost {
            latency_us: 3.0,
            bandwidth_gbs: 9.0,
        },
        rail: links::MPI_RAIL,
    };
    for measured in [None, Some(m)] {
        assert_eq!(P2p.row().cost(measured), links::CUDA_P2P);
        assert_eq!(Shm.row().cost(measured), links::CUDA_SHM);
    }
    assert_eq!(Net.row().cost(None), links::MPI_NET);
    assert_eq!(Net.row().cost(Some(m)), m.hop);
}

fn proposal(channels: u64, slot_bytes: u64, direct: bool) -> Layout {
    Layout {
        nranks: 4,
        channels,
        slots: FIFO_SLOTS as u64,
        slot_bytes,
        direct,
        oneshot_bytes: ONESHOT_MAX_BYTES,
    }
}

/// The layouts bring-up stage 2 chose before the seam: the request on P2P
/// (with the one-shot inboxes where proposed) and on several nodes; on a
/// single node with SHM, 4 channels (fewer if the GPU holds fewer) of 64
/// KiB, never the inboxes.
#[test]
fn the_node_transport_shapes_the_layout_as_before() {
    for single in [true, false] {
        for co in [None, Some(1), Some(3), Some(66)] {
            let p = proposal(64, 512 << 10, single);
            let got = P2p.row().shape(p, single, co);
            assert_eq!(
                (got.channels, got.slot_bytes, got.direct),
                (64, 512 << 10, single)
            );
            let got = Shm.row().shape(p, single, co);
            let want = if single {
                (co.unwrap_or(4).min(4) as u64, 64 << 10)
            } else {
                (64, 512 << 10)
            };
            assert_eq!(
                (got.channels, got.slot_bytes, got.direct),
                (want.0, want.1, false)
            );
            assert_eq!(
                (got.nranks, got.slots, got.oneshot_bytes),
                (4, 8, ONESHOT_MAX_BYTES)
            );
            // A transport without its own shape drops the inboxes.
            let got = Net.row().shape(p, single, co);
            assert_eq!(
                (got.channels, got.slot_bytes, got.direct),
                (64, 512 << 10, false)
            );
        }
    }
    let p = proposal(4, 128 << 10, false);
    assert_eq!(Shm.row().segment_bytes(&p) as u64, p.total());
    assert_eq!(P2p.row().segment_bytes(&p) + Net.row().segment_bytes(&p), 0);
}

/// The connector tables as `layout.rs` built them before the transport
/// seam (commit 5b2fc9b), kept verbatim as the oracle of the new ones.
fn before_the_seam(
    rank: usize,
    layout: &Layout,
    bases: &[u64],
    net: &NetLayout,
    net_dev: u64,
) -> (Vec<GcConn>, Vec<GcConn>) {
    let n = layout.nranks as usize;
    let me = rank as u64;
    let mut send = vec![GcConn::default(); layout.channels as usize * n];
    let mut recv = vec![GcConn::default(); layout.channels as usize * n];
    let conn = |base: u64, head: u64| GcConn {
        data: base + CONN_HEADER,
        meta: base + CONN_META_OFF,
        tail: base + CONN_TAIL_OFF,
        head,
        ..GcConn::default()
    };
    for c in 0..layout.channels {
        if let Some(i) = net.rail_index() {
            let k = c as usize * n + rank;
            recv[k] = conn(net_dev + net.recv_conn(c, i), net_dev + net.recv_head(c, i));
            send[k] = conn(net_dev + net.send_conn(c, i), net_dev + net.send_head(c, i));
        }
        for p in (0..n).filter(|&p| p != rank) {
            let k = c as usize * n + p;
            let pu = p as u64;
            if let Some(i) = net.index_of(p) {
                recv[k] = conn(net_dev + net.recv_conn(c, i), net_dev + net.recv_head(c, i));
                send[k] = conn(net_dev + net.send_conn(c, i), net_dev + net.send_head(c, i));
            } else {
                recv[k] = conn(
                    bases[rank] + layout.conn_off(c, pu),
                    bases[p] + layout.head_off(c, me),
                );
                send[k] = conn(
                    bases[p] + layout.conn_off(c, me),
                    bases[rank] + layout.head_off(c, pu),
                );
            }
        }
    }
    (send, recv)
}

/// A node's FIFO areas and a NET block as rank `rank` of `keys` sees
/// them: each rank of its node's area at a fake address common to all
/// ranks (as if mapped at the same place), its NET block its own.
struct Fake {
    route: Route,
    layout: Layout,
    areas: FifoAreas,
    net: NetLayout,
    dev: u64,
}

fn fake(rank: usize, keys: &[u64], p2p: bool) -> Fake {
    let t = topo(rank, keys);
    let multi = t.nnodes() > 1;
    let route = select(&Facts { topo: &t, p2p }).unwrap();
    let layout = Layout {
        nranks: keys.len() as u64,
        channels: NET_CHANNELS as u64,
        slots: FIFO_SLOTS as u64,
        slot_bytes: SLOT_BYTES_NET as u64,
        direct: false,
        oneshot_bytes: ONESHOT_MAX_BYTES,
    };
    let bases = (0..keys.len())
        .map(|r| {
            if t.same_node(r, rank) {
                (r as u64 + 1) << 40
            } else {
                0
            }
        })
        .collect();
    let net = NetLayout {
        peers: (0..keys.len()).filter(|&r| !t.same_node(r, rank)).collect(),
        channels: layout.channels,
        slots: layout.slots,
        slot_bytes: layout.slot_bytes,
        rail: multi,
    };
    let areas = FifoAreas {
        rank,
        layout,
        bases,
    };
    let dev = (rank as u64 + 10) << 40;
    Fake {
        route,
        layout,
        areas,
        net,
        dev,
    }
}

impl Fake {
    /// The tables through the seam: each transport's connectors from its
    /// own view (P2P and SHM: the node's areas; NET: its block).
    fn tables(&self) -> (Vec<GcConn>, Vec<GcConn>) {
        let rank = self.areas.rank;
        conn_tables(&self.route, self.layout.channels, |k, c, p| match k {
            P2p | Shm => self.areas.conns(c, p),
            Net => self.net.conns(c, p, rank, self.dev),
        })
        .unwrap()
    }
}

fn words(c: &GcConn) -> [u64; 8] {
    [
        c.data, c.meta, c.tail, c.head, c.step, c.pad[0], c.pad[1], c.pad[2],
    ]
}

#[test]
fn connector_tables_are_those_before_the_seam() {
    let layouts: [&[u64]; 6] = [
        &[0, 0, 0, 0],
        &[0, 0, 1, 1],
        &[0, 1, 0, 1],
        &[3, 4, 4, 4, 5],
        &[1, 2, 3],
        &[0],
    ];
    for keys in layouts {
        for p2p in [true, false] {
            for rank in 0..keys.len() {
                let f = fake(rank, keys, p2p);
                let (send, recv) = f.tables();
                let (s0, r0) = before_the_seam(rank, &f.layout, &f.areas.bases, &f.net, f.dev);
                let what = format!("nodes {keys:?}, rank {rank}, p2p {p2p}");
                assert_eq!(send.len(), s0.len(), "{what}");
                for k in 0..send.len() {
                    assert_eq!(words(&send[k]), words(&s0[k]), "{what}: send {k}");
                    assert_eq!(words(&recv[k]), words(&r0[k]), "{what}: recv {k}");
                }
            }
        }
    }
}

#[test]
fn a_route_its_transport_cannot_serve_is_refused() {
    let f = fake(0, &[0, 0, 1, 1], true);
    // NET answers nothing: rank 2's transport has no connector for it.
    let r = conn_tables(&f.route, f.layout.channels, |k, c, p| match k {
        P2p | Shm => f.areas.conns(c, p),
        Net => None,
    });
    assert!(r.is_err());
    // The FIFO areas have no connector to ranks of other nodes, nor to us.
    assert!(f.areas.conns(0, 2).is_none() && f.areas.conns(0, 0).is_none());
    assert!(f.net.conns(0, 1, 0, f.dev).is_none());
}

#[test]
fn intra_node_connectors_meet() {
    let t: Vec<_> = (0..4)
        .map(|r| fake(r, &[0, 0, 1, 1], true).tables())
        .collect();
    let n = 4;
    for (a, b) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
        for c in 0..NET_CHANNELS {
            let s = t[a].0[c * n + b];
            let r = t[b].1[c * n + a];
            assert_eq!(
                (s.data, s.meta, s.tail, s.head),
                (r.data, r.meta, r.tail, r.head)
            );
            // In the receiver's area, heads in the sender's.
            assert_eq!(r.tail >> 40, b as u64 + 1);
            assert_eq!(s.head >> 40, a as u64 + 1);
        }
    }
}

#[test]
fn inter_node_and_rail_connectors_stay_in_the_own_net_block() {
    for rank in 0..4 {
        let f = fake(rank, &[0, 0, 1, 1], true);
        let (send, recv) = f.tables();
        let (layout, net, dev) = (f.layout, &f.net, f.dev);
        let n = 4;
        let mut words = Vec::new();
        for c in 0..layout.channels as usize {
            // The NET peers' pairs and, at our own index, the rail's.
            for p in net.peers.iter().copied().chain([rank]) {
                for conn in [send[c * n + p], recv[c * n + p]] {
                    for a in [conn.data, conn.meta, conn.tail, conn.head] {
                        assert!(a >= dev && a < dev + net.total(), "rank {rank} peer {p}");
                    }
                    let last = conn.data + layout.slots * layout.slot_bytes;
                    assert!(last <= dev + net.total());
                    words.extend([conn.tail, conn.head, conn.data]);
                }
            }
        }
        words.sort_unstable();
        let len = words.len();
        words.dedup();
        assert_eq!(words.len(), len, "rank {rank}: NET connectors share words");
    }
}
