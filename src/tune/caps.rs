//! What the tuner knows about a backend: its capabilities and the cost of
//! its links. Both backends report a [`BackendCaps`] built from the link
//! tables here, so the tuner, the planner and the backends share one
//! vocabulary without importing each other.

use super::Protocol;

/// Transport costs a backend reports to the tuner: per channel, per hop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Fixed cost of one pipeline step (µs).
    pub latency_us: f64,
    /// Bandwidth one channel reaches on this link (GB/s).
    pub bandwidth_gbs: f64,
}

/// What a backend can do; agreed across ranks (min/max) before tuning.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendCaps {
    /// Protocols the backend implements.
    pub protocols: Vec<Protocol>,
    /// Most channels a plan may use.
    pub max_channels: usize,
    /// Bytes of one FIFO slot (per protocol the backend may scale this).
    pub slot_bytes: u64,
    /// Slots per FIFO (NCCL's STEPS).
    pub fifo_slots: u64,
    /// Cost of a hop within a node.
    pub intra: LinkCost,
    /// Cost of a hop between nodes. Unlike the links within a node, its
    /// bandwidth is what all channels reach together: they share MPI
    /// between the same two processes (`model::path_bandwidth`).
    pub inter: LinkCost,
    /// Fixed cost of launching one submission (µs).
    pub launch_us: f64,
    /// Whether a direct path (every peer mapped) exists within a node.
    pub direct: bool,
    /// Largest one-shot per rank (bytes) the direct path's inboxes hold
    /// (Simple; LL up to the smaller of this and
    /// `model::ONESHOT_LL_MAX_BYTES`). A memory budget may lower it.
    pub oneshot_max_bytes: u64,
    /// Protocols of the one-shot all_reduce (`protocols` applies to every
    /// other plan).
    pub oneshot_protocols: Vec<Protocol>,
    /// Whether the backend runs collnet's rail steps (an inter-node
    /// collective of its own: MPI's, on the host backend).
    pub collnet: bool,
    /// Cost of the rail all-reduce per byte and call, across all nodes
    /// (MPI's own collective on staged host memory), all channels' rails
    /// together.
    pub rail: LinkCost,
    /// Copy-engine collectives within a node, where the backend has them:
    /// the fixed cost of one (handshakes and copy setup) and the bandwidth
    /// of one rank's outgoing copies, all peers together.
    pub copy_engine: Option<LinkCost>,
}

/// The link costs of both backends, in one table so that a shared
/// transport (MPI between nodes) is costed the same by both.
pub(crate) mod links {
    use super::LinkCost;

    /// Host shared memory within a node; measured roughly on a 2-core VM
    /// (a memcpy-bound pipeline): the tuner only needs the order of
    /// magnitude.
    pub(crate) const HOST_SHM: LinkCost = LinkCost {
        latency_us: 2.0,
        bandwidth_gbs: 6.0,
    };

    /// Per channel (one block of 512 threads) over NVLink, measured on
    /// 2×H200 (NV18): 64 channels reach ≈ 330 GB/s on a 1 GiB ring
    /// all_reduce, so a channel's share is ≈ 5.2 GB/s; a piece costs ≈ 3 µs
    /// of flags.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const CUDA_P2P: LinkCost = LinkCost {
        latency_us: 3.0,
        bandwidth_gbs: 5.5,
    };

    /// GPU FIFOs in registered host shared memory (no peer access).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const CUDA_SHM: LinkCost = LinkCost {
        latency_us: 6.0,
        bandwidth_gbs: 5.0,
    };

    /// Copy-engine collectives on one node: the fixed cost is two flag
    /// handshakes of stream memory operations on host-mapped words and the
    /// host's rendezvous (an estimate until measured on 2×H200); the
    /// bandwidth is what copy engines pushing both ways at once reached on
    /// 2×H200 (NV18): 309 GB/s per direction (shared/ANCHORS.md).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const CUDA_CE: LinkCost = LinkCost {
        latency_us: 25.0,
        bandwidth_gbs: 300.0,
    };

    /// A hop between nodes over MPI point-to-point (the host backend's
    /// connectors, the CUDA backend's NET proxy), all channels together.
    /// The estimate before a communicator spanning nodes measures its own
    /// (`backend::shared::calibrate`), which replaces it.
    pub(crate) const MPI_NET: LinkCost = LinkCost {
        latency_us: 10.0,
        bandwidth_gbs: 3.0,
    };

    /// MPI's own all_reduce on host memory between nodes, per call (an
    /// estimate for Open MPI over TCP/shared memory; on this kind of
    /// machine it is slower than gpucoll's own NET rings, so collnet is
    /// not chosen unless forced). Not calibrated yet.
    pub(crate) const MPI_RAIL: LinkCost = LinkCost {
        latency_us: 30.0,
        bandwidth_gbs: 1.5,
    };

    /// What the CUDA backend's NET path adds to each MPI message or rail
    /// all-reduce (µs): the kernel's store of a piece into mapped host
    /// memory, the proxy thread noticing it, and the receiving kernel's
    /// poll. Measured on one H200 under MPS with two simulated nodes: a
    /// two-hop NET all_reduce of 8 B took 38 µs against 14 µs on one node,
    /// (38 - 14) / 2 - 1.3 (MPI's own latency) ≈ 11 per hop; collnet's one
    /// rail step 29 - 14 - 2.6 ≈ 12 (`bench/results/2026-12-02-h200x1-net`).
    /// The host backend's executor calls MPI itself: it adds nothing.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const CUDA_NET_BRIDGE_US: f64 = 11.0;

    /// Queueing a launch to the host backend's worker and waking it (µs).
    pub(crate) const HOST_LAUNCH_US: f64 = 5.0;

    /// Launching the CUDA backend's kernels for one submission (µs).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const CUDA_LAUNCH_US: f64 = 6.0;
}
