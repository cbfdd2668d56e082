//! The cost model: estimated time of one collective for a given algorithm,
//! protocol and channel count, in NCCL's spirit:
//!
//! `time = launch + latency_per_step × steps + bytes / bandwidth`
//!
//! where the step latencies and per-channel bandwidths come from the
//! backend's [`LinkCost`]s (a hop within a node, a hop between nodes) and the
//! bandwidth is converted from the "bus" bandwidth every link reaches to the
//! algorithm bandwidth the caller sees (a ring all_reduce moves
//! `2(n-1)/n` of the buffer over every link, a tree all_reduce the whole
//! buffer up and down).

use super::caps::{BackendCaps, LinkCost};
use crate::task::CollKind;
use crate::tune::{Algorithm, Protocol};

/// The topology facts the model needs (agreed on all ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub nranks: usize,
    pub nnodes: usize,
    /// Most ranks on one node.
    pub ppn: usize,
    /// Whether every node has `ppn` ranks (collnet's rails need it).
    pub uniform: bool,
}

/// Latency and bandwidth multipliers of a protocol relative to Simple: LL
/// skips the fence and the flag round trip (lower latency) but carries 8
/// payload bytes per 16; LL128 carries 120 of every 128 bytes with a latency
/// between the two.
pub fn protocol_factors(p: Protocol) -> (f64, f64) {
    match p {
        Protocol::Simple => (1.0, 1.0),
        Protocol::LL128 => (0.7, 0.92),
        Protocol::LL => (0.5, 0.5),
    }
}

/// Largest all_reduce (bytes per rank) that a backend with
/// [`BackendCaps::direct`] runs as a one-shot: every rank pushes its whole
/// input into every peer's mapped inbox, one flag barrier, then every rank
/// reduces locally. Larger all_reduces over the direct path run the pairwise step plan.
pub const ONESHOT_MAX_BYTES: u64 = 16 << 20;

/// Largest one-shot all_reduce (bytes per rank) that may use the LL
/// protocol (the LL inboxes are sized for it).
pub const ONESHOT_LL_MAX_BYTES: u64 = 1 << 20;

/// Bandwidth factor of the LL one-shot relative to the Simple one-shot.
const ONESHOT_LL_BANDWIDTH: f64 = 0.7;

/// Efficiency of the tree all_reduce's pipelining relative to the ideal
/// (NCCL measures 0.5..0.9 depending on size; up and down share a channel).
const TREE_EFFICIENCY: f64 = 0.8;

/// The bus bandwidth of a path over `nchannels` channels, limited by its
/// slowest link. Links within a node scale with the channels (each its own
/// block or thread and FIFO); the NET between nodes does not: every
/// channel's pieces go through MPI between the same two processes, which
/// moved no more with several streams than with one
/// (`bench/results/2026-12-02-h200x1-net/mpi-p2p.txt`).
pub fn path_bandwidth(shape: &Shape, caps: &BackendCaps, nchannels: usize) -> f64 {
    let intra = caps.intra.bandwidth_gbs * nchannels.max(1) as f64;
    if shape.nnodes > 1 {
        intra.min(caps.inter.bandwidth_gbs)
    } else {
        intra
    }
}

fn positive(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        1e-9
    }
}

/// Latency of `intra` hops within a node plus `inter` hops between nodes.
fn hops(intra: usize, inter: usize, caps: &BackendCaps) -> f64 {
    let lat = |l: &LinkCost| l.latency_us.max(0.0);
    intra as f64 * lat(&caps.intra) + inter as f64 * lat(&caps.inter)
}

/// Ceiling of log2(n) (0 for n <= 1).
fn log2_ceil(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}

/// Estimated time in µs of `kind` over `bytes` (the larger of the input and
/// output buffers), or `None` when the algorithm cannot run the collective.
pub fn estimate_us(
    kind: CollKind,
    algo: Algorithm,
    proto: Protocol,
    nchannels: usize,
    bytes: f64,
    shape: &Shape,
    caps: &BackendCaps,
) -> Option<f64> {
    let n = shape.nranks.max(1);
    let nnodes = shape.nnodes.max(1);
    let (lat_f, bw_f) = protocol_factors(proto);
    let bus = positive(path_bandwidth(shape, caps, nchannels) * bw_f);
    let (latency, alg_bw) = match (kind, algo) {
        (CollKind::AllReduce, Algorithm::Ring) => {
            let steps = 2 * (n - 1);
            let inter = 2 * (nnodes - 1);
            let lat = hops(steps - inter, inter, caps);
            (lat, bus * n as f64 / steps.max(1) as f64)
        }
        (CollKind::AllReduce, Algorithm::Tree) => {
            // Up the chain and node tree, then down again.
            let intra = shape.ppn.max(1) - 1;
            let inter = log2_ceil(nnodes);
            let lat = 2.0 * hops(intra, inter, caps);
            (lat, bus * 0.5 * TREE_EFFICIENCY)
        }
        (CollKind::AllReduce, Algorithm::OneShot) => {
            return oneshot_us(proto, bytes, shape, caps);
        }
        // Every rank sends one segment (a rank's share) to each peer; the
        // root of a broadcast or reduce moves its whole buffer to or from
        // every peer, of a gather or scatter one share each.
        (
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter,
            Algorithm::OneShot,
        ) if caps.direct => {
            return oneshot_us(proto, bytes / n as f64, shape, caps);
        }
        (CollKind::Broadcast | CollKind::Reduce, Algorithm::OneShot) if caps.direct => {
            return oneshot_us(proto, bytes, shape, caps);
        }
        (CollKind::AllReduce, Algorithm::CollNet) => {
            return collnet_us(proto, nchannels, bytes, shape, caps);
        }
        (_, Algorithm::CopyEngine) if proto == Protocol::Simple => {
            return copy_engine_us(kind, bytes, shape, caps);
        }
        (CollKind::AllReduce, Algorithm::Pairwise) => {
            if nnodes > 1 || proto != Protocol::Simple {
                return None;
            }
            if caps.direct && bytes <= caps.oneshot_max_bytes as f64 {
                // Where the one-shot fits a direct path, it runs instead.
                return None;
            }
            // Two phases of n-1 pairwise rounds; rounds do not wait on a
            // chain of hops, so each costs about half a pipelined hop. A
            // round's send and receive are serialized on a channel.
            let lat = hops(n - 1, 0, caps);
            (lat, 0.5 * bus * n as f64 / (2 * (n - 1)).max(1) as f64)
        }
        (CollKind::AllGather | CollKind::ReduceScatter, Algorithm::Ring) => {
            let steps = n - 1;
            let inter = nnodes - 1;
            let lat = hops(steps - inter, inter, caps);
            (lat, bus * n as f64 / steps.max(1) as f64)
        }
        (CollKind::Broadcast | CollKind::Reduce, Algorithm::Ring) => {
            let steps = n - 1;
            let inter = nnodes - 1;
            (hops(steps - inter, inter, caps), bus)
        }
        // A chain in rank order: n-1 pipelined hops, every link carrying
        // the buffer once (scan) or twice (exclusive_scan: each rank's input,
        // then its prefix, one hop behind). Rank order crosses nodes at
        // least nnodes-1 times.
        (CollKind::Scan, Algorithm::Ring) => {
            let steps = n - 1;
            let inter = nnodes - 1;
            (hops(steps - inter, inter, caps), bus)
        }
        (CollKind::ExclusiveScan, Algorithm::Ring) => {
            let steps = n;
            let inter = nnodes - 1;
            (hops(steps - inter, inter, caps), bus / 2.0)
        }
        (CollKind::AllToAll | CollKind::Gather | CollKind::Scatter, Algorithm::Pairwise) => {
            let inter = if nnodes > 1 { 1 } else { 0 };
            let lat = hops(1 - inter, inter, caps) * (n - 1) as f64;
            (lat, bus)
        }
        // Every other pairing of a collective and an algorithm does not run.
        (
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
            | CollKind::Scan
            | CollKind::ExclusiveScan,
            _,
        ) => return None,
    };
    Some(caps.launch_us.max(0.0) + latency * lat_f + bytes / (1000.0 * positive(alg_bw)))
}

/// Whether copy engines can run `kind`: collectives that only move data.
pub fn copy_engine_kind(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllGather
            | CollKind::AllToAll
            | CollKind::Broadcast
            | CollKind::Gather
            | CollKind::Scatter
    )
}

/// Estimated time in µs of a copy-engine collective over `bytes` (the
/// larger buffer), or `None` where it cannot run (several nodes, one rank,
/// a backend without copy engines, a collective that reduces): the fixed
/// cost, then the busiest rank's copies (every peer's share from or to the
/// root of a rooted collective; its own pushes otherwise).
pub fn copy_engine_us(
    kind: CollKind,
    bytes: f64,
    shape: &Shape,
    caps: &BackendCaps,
) -> Option<f64> {
    let ce = caps.copy_engine?;
    let n = shape.nranks;
    if shape.nnodes > 1 || n < 2 || !copy_engine_kind(kind) {
        return None;
    }
    let peers = (n - 1) as f64;
    let moved = match kind {
        CollKind::Broadcast => bytes * peers,
        CollKind::AllGather | CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => {
            bytes / n as f64 * peers
        }
        // Refused above (`copy_engine_kind`).
        CollKind::AllReduce
        | CollKind::Reduce
        | CollKind::ReduceScatter
        | CollKind::Scan
        | CollKind::ExclusiveScan => return None,
    };
    Some(ce.latency_us.max(0.0) + moved / (1000.0 * positive(ce.bandwidth_gbs)))
}

/// Estimated time in µs of a collnet all_reduce of `bytes`, or `None`
/// where it cannot run (one node, uneven nodes, a backend without rails):
/// a reduce-scatter and an all-gather within the node, and the rail
/// all-reduce of each rank's shard (a `1/ppn` share), channel by channel.
fn collnet_us(
    proto: Protocol,
    nchannels: usize,
    bytes: f64,
    shape: &Shape,
    caps: &BackendCaps,
) -> Option<f64> {
    if !caps.collnet || shape.nnodes < 2 || !shape.uniform || proto != Protocol::Simple {
        return None;
    }
    let l = shape.ppn.max(1);
    let intra_bus = positive(caps.intra.bandwidth_gbs * nchannels.max(1) as f64);
    // MPI's all_reduce of the shard moves about twice its bytes; the rails
    // of all channels share MPI between the same processes, as NET hops do.
    let shard = bytes / l as f64;
    let rail_bw = positive(caps.rail.bandwidth_gbs);
    let rail_lat = caps.rail.latency_us.max(0.0) * log2_ceil(shape.nnodes).max(1) as f64;
    let fixed = caps.launch_us.max(0.0)
        + (if l > 1 {
            2.0 * hops(l - 1, 0, caps)
        } else {
            0.0
        });
    let moved = if l > 1 {
        2.0 * bytes * (l - 1) as f64 / l as f64 / (1000.0 * intra_bus)
    } else {
        0.0
    } + 2.0 * shard / (1000.0 * rail_bw);
    Some((fixed + rail_lat) * COLLNET_LATENCY_MARGIN + moved * COLLNET_BYTES_MARGIN)
}

/// collnet's per-byte estimate is raised by this factor: its phases do not
/// overlap within a channel (reduce-scatter, then MPI, then all-gather),
/// which the model does not see, and each piece also crosses the NET
/// bridge twice. On one H200 with two simulated nodes collnet's time per
/// byte was 2.1× what the rail's measured bandwidth (at 256 KiB) gives
/// between 8 and 32 KiB and 1.4× at 512 MiB; MPI's own all_reduce of
/// 512 MiB in one call, out of cache, 2.9×. So the bytes go to MPI only
/// where its all_reduce measures at least twice as fast as gpucoll's own
/// path, which is what offloaded collectives deliver.
const COLLNET_BYTES_MARGIN: f64 = 2.0;

/// collnet's fixed costs are raised by this factor: they are measured at
/// creation (one rail step against the NET hops of a ring or tree), so a
/// small margin keeps the ring or tree where the two are about equal, and
/// collnet's one MPI call wins small messages where it is clearly cheaper
/// than two or more NET hops (on one H200 with two simulated nodes: 29 µs
/// against 38-40 for ring and tree up to 2 KiB, 40 against 44 at 8 KiB).
const COLLNET_LATENCY_MARGIN: f64 = 1.25;

/// Estimated time in µs of a one-shot that sends `bytes` to every peer (an
/// all_reduce of `bytes`, or one segment of the others), or `None`
/// where it cannot run: across nodes, in a protocol it does not speak, or
/// beyond the inboxes of a direct path.
fn oneshot_us(proto: Protocol, bytes: f64, shape: &Shape, caps: &BackendCaps) -> Option<f64> {
    let n = shape.nranks.max(1);
    if shape.nnodes > 1 {
        return None;
    }
    let ll_max = caps.oneshot_max_bytes.min(ONESHOT_LL_MAX_BYTES);
    if proto != Protocol::Simple && (proto != Protocol::LL || bytes > ll_max as f64) {
        // Only the one-shot kernel speaks LL, and only up to its inbox size.
        return None;
    }
    let (lat_f, bw_f) = protocol_factors(proto);
    if caps.direct {
        if bytes > caps.oneshot_max_bytes as f64 {
            return None;
        }
        // One barrier; every rank sends its whole input to each of n-1 peers
        // over all the backend's channels at once. LL lines carry 8 of 16
        // bytes, but the one-shot spreads them over more blocks than Simple
        // and skips its fences: measured on 2×H200 it stays ahead of Simple
        // up to 1 MiB.
        let bw_f = if proto == Protocol::LL {
            ONESHOT_LL_BANDWIDTH
        } else {
            bw_f
        };
        let all = positive(caps.intra.bandwidth_gbs * caps.max_channels.max(1) as f64 * bw_f);
        return Some(
            caps.launch_us.max(0.0)
                + hops(1, 0, caps) * lat_f
                + bytes * (n - 1) as f64 / (1000.0 * all),
        );
    }
    // Through FIFOs (no direct path): one channel's share of the n-1 copies
    // every rank sends, one hop of latency per peer.
    let bus = positive(caps.intra.bandwidth_gbs * bw_f);
    Some(
        caps.launch_us.max(0.0)
            + hops(n - 1, 0, caps) * lat_f
            + bytes * (n - 1) as f64 / (1000.0 * bus),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> BackendCaps {
        BackendCaps {
            protocols: vec![Protocol::Simple, Protocol::LL],
            oneshot_protocols: vec![Protocol::Simple, Protocol::LL],
            max_channels: 4,
            slot_bytes: 1 << 16,
            fifo_slots: 8,
            intra: LinkCost {
                latency_us: 1.0,
                bandwidth_gbs: 10.0,
            },
            inter: LinkCost {
                latency_us: 10.0,
                bandwidth_gbs: 5.0,
            },
            launch_us: 5.0,
            direct: false,
            oneshot_max_bytes: crate::tune::model::ONESHOT_MAX_BYTES,
            collnet: false,
            rail: crate::tune::caps::links::MPI_RAIL,
            copy_engine: None,
        }
    }

    #[test]
    fn model_orders_as_expected() {
        let c = caps();
        let multi = Shape {
            nranks: 64,
            nnodes: 16,
            ppn: 4,
            uniform: true,
        };
        let est = |a, p, bytes| estimate_us(CollKind::AllReduce, a, p, 1, bytes, &multi, &c);
        // Tree wins small multi-node messages (log latency), ring large ones.
        assert!(
            est(Algorithm::Tree, Protocol::Simple, 8.0)
                < est(Algorithm::Ring, Protocol::Simple, 8.0)
        );
        assert!(
            est(Algorithm::Ring, Protocol::Simple, 1e9)
                < est(Algorithm::Tree, Protocol::Simple, 1e9)
        );
        // LL wins small, Simple large.
        assert!(
            est(Algorithm::Ring, Protocol::LL, 8.0) < est(Algorithm::Ring, Protocol::Simple, 8.0)
        );
        assert!(
            est(Algorithm::Ring, Protocol::Simple, 1e9) < est(Algorithm::Ring, Protocol::LL, 1e9)
        );
        assert_eq!(
            estimate_us(
                CollKind::Broadcast,
                Algorithm::Tree,
                Protocol::Simple,
                1,
                8.0,
                &multi,
                &c
            ),
            None
        );
        assert_eq!(est(Algorithm::Pairwise, Protocol::Simple, 8.0), None);
    }
}
