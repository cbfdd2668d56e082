//! The tuner: a cost model that picks algorithm, protocol, channel count and
//! chunk size for each call. Every input is agreed across ranks at
//! communicator creation, so all ranks compute the same choice without
//! talking to each other.

pub(crate) mod caps;
pub(crate) mod model;
mod tuner;

pub use tuner::{max_chunk_bytes, Tuner};

use std::fmt;

/// How the data moves between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring pipelines (reduce-scatter + all-gather phases for all_reduce).
    Ring,
    /// Double binary trees across nodes, chains within a node (all_reduce).
    Tree,
    /// Every rank exchanges with every peer in pairwise rounds (all_to_all,
    /// gather, scatter; all_reduce as pairwise reduce-scatter + all-gather
    /// rounds where every peer is one hop away). `GPUCOLL_ALGO=direct`, its
    /// former name, still parses to it.
    Pairwise,
    /// all_reduce in one exchange: every rank sends its whole input to every
    /// peer and reduces all inputs itself, in rank order (identical results
    /// on every rank). GPUs run it as a kernel of its own
    /// (`GPUCOLL_ALGO=oneshot`).
    OneShot,
    /// all_reduce across nodes with the inter-node part handed to the
    /// backend's inter-node collective (MPI's own): reduce-scatter within
    /// each node, every shard all-reduced across nodes among the ranks of
    /// its local index (the rails), all-gather within each node. Needs the
    /// same number of ranks on every node.
    CollNet,
    /// all_gather, all_to_all, broadcast, gather and scatter on one node
    /// by the GPUs' copy engines: no kernel, the data pushed by DMA copies
    /// straight into the peers' receive buffers between two flag
    /// handshakes (`GPUCOLL_CE`). Its plan carries the collective's ring or
    /// pairwise steps, which backends without copy engines run.
    CopyEngine,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::Pairwise,
        Algorithm::OneShot,
        Algorithm::CollNet,
        Algorithm::CopyEngine,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Pairwise => "pairwise",
            Algorithm::OneShot => "oneshot",
            Algorithm::CollNet => "collnet",
            Algorithm::CopyEngine => "ce",
        }
    }

    /// Parse a name as printed by [`Algorithm::name`] (`one_shot` and
    /// `one-shot` also name the one-shot; `direct`, the pairwise rounds'
    /// former name, names them).
    pub fn parse(s: &str) -> Option<Algorithm> {
        let norm: String = s
            .trim()
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect();
        if norm.eq_ignore_ascii_case("direct") {
            return Some(Algorithm::Pairwise);
        }
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(&norm))
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The FIFO slot format between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Data then a fenced tail update: highest bandwidth.
    Simple,
    /// 8-byte data + flag lines, no fence: lowest latency, half the bandwidth.
    LL,
    /// 128-byte lines with a flag word, relying on NVLink ordering.
    LL128,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Simple, Protocol::LL, Protocol::LL128];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Simple => "simple",
            Protocol::LL => "ll",
            Protocol::LL128 => "ll128",
        }
    }

    pub fn parse(s: &str) -> Option<Protocol> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the tuner decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub algorithm: Algorithm,
    pub protocol: Protocol,
    pub nchannels: usize,
    /// Largest step size in bytes (at most half a connector's FIFO).
    pub chunk_bytes: u64,
}
