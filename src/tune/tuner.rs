//! [`Tuner`]: picks algorithm, protocol, channel count and chunk size per
//! call from the cost model, the backend's capabilities and the
//! `GPUCOLL_ALGO` / `GPUCOLL_PROTO` / `GPUCOLL_NCHANNELS` overrides.
//!
//! Candidates per call. all_reduce: the ring; the tree with several nodes;
//! collnet across nodes of equal size; the one-shot and the pairwise plan
//! where the backend offers the direct path (`BackendCaps::direct`, one
//! node). Every other collective: its base algorithm (the ring where data
//! passes along, pairwise for all_to_all, gather and scatter), and the
//! one-shot on the direct path. The model prices the one-shot up to
//! `model::ONESHOT_MAX_BYTES`, its LL protocol up to
//! `model::ONESHOT_LL_MAX_BYTES`.
//!
//! A grouped call never gets the one-shot: a group is one launch of step
//! plans, so it runs the pairwise plan instead. The copy engines
//! (`Algorithm::CopyEngine`, one node) are never taken in a group or for
//! an empty call. `GPUCOLL_CE=1` takes them wherever they run; `auto` only
//! where no algorithm is forced and `model::copy_engine_us` beats the
//! kernel plan.

use super::caps::BackendCaps;
use super::model::{self, Shape};
use super::{Algorithm, Choice, Protocol};
use crate::config::{CeMode, Config};
use crate::task::{CollKind, Task};
use crate::topo::Topology;
use std::sync::atomic::{AtomicU32, Ordering};

/// Warn-once bits.
const WARN_DIRECT_UNAVAILABLE: u32 = 1 << 0;
const WARN_PROTO: u32 = 1 << 1;
const WARN_COLLNET_UNAVAILABLE: u32 = 1 << 2;
/// One bit per collective kind (index in `CollKind::ALL`) for ignored
/// algorithm overrides.
const WARN_ALGO_SHIFT: u32 = 8;

/// Picks a [`Choice`] per call. Reads only the topology, the (agreed) backend
/// capabilities, the configuration and the task, so every rank computes the
/// same choice without communicating.
#[derive(Debug)]
pub struct Tuner {
    shape: Shape,
    caps: BackendCaps,
    config: Config,
    /// Largest chunk: half a connector FIFO (double buffering, as NCCL's
    /// CHUNKSTEPS), a multiple of 64 bytes, at least one slot.
    chunk_bytes: u64,
    /// Bytes a channel must carry before another channel is worth its fixed
    /// cost.
    min_channel_bytes: u64,
    /// Warnings already emitted (each misconfiguration is reported once).
    warned: AtomicU32,
}

impl Clone for Tuner {
    fn clone(&self) -> Tuner {
        Tuner {
            shape: self.shape,
            caps: self.caps.clone(),
            config: self.config.clone(),
            chunk_bytes: self.chunk_bytes,
            min_channel_bytes: self.min_channel_bytes,
            warned: AtomicU32::new(self.warned.load(Ordering::Relaxed)),
        }
    }
}

/// Half the FIFO of `caps`, rounded down to 64 bytes, but at least one slot.
pub fn max_chunk_bytes(caps: &BackendCaps) -> u64 {
    let slot = caps.slot_bytes.max(1);
    let half = slot.saturating_mul(caps.fifo_slots) / 2 / 64 * 64;
    half.max(slot)
}

impl Tuner {
    pub fn new(topo: &Topology, caps: &BackendCaps, config: &Config) -> Tuner {
        let shape = Shape {
            nranks: topo.nranks,
            nnodes: topo.nnodes(),
            ppn: topo.nodes.iter().map(|v| v.len()).max().unwrap_or(1),
            uniform: topo.nodes.windows(2).all(|w| w[0].len() == w[1].len()),
        };
        let chunk_bytes = max_chunk_bytes(caps);
        // A channel pays one step latency plus its share of the launch; it is
        // worth adding once it carries at least that many bytes' worth of
        // transfer time, and never less than one full chunk.
        let bw = model::path_bandwidth(&shape, caps, 1).max(0.0);
        let lat =
            caps.intra.latency_us.max(caps.inter.latency_us).max(0.0) + caps.launch_us.max(0.0);
        let break_even = (lat * bw * 1000.0).min(1e15) as u64;
        // Backends with a direct path (GPUs) run a channel as one more
        // thread block of the same launch: one slot per channel is enough.
        // Elsewhere (host threads) a channel should carry a whole chunk.
        let unit = if caps.direct {
            caps.slot_bytes.max(1)
        } else {
            chunk_bytes
        };
        let min_channel_bytes = unit.max(break_even).max(1);
        Tuner {
            shape,
            caps: caps.clone(),
            config: config.clone(),
            chunk_bytes,
            min_channel_bytes,
            warned: AtomicU32::new(0),
        }
    }

    /// Report `msg` at warn level the first time `bit` is raised.
    fn warn_once(&self, bit: u32, msg: std::fmt::Arguments<'_>) {
        if self.warned.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            tracing::warn!("{msg}");
        }
    }

    /// Algorithms able to run `kind` here (before overrides), in preference
    /// order for ties.
    fn candidates(&self, kind: CollKind) -> Vec<Algorithm> {
        match kind {
            CollKind::AllReduce => {
                let mut v = vec![Algorithm::Ring];
                if self.shape.nnodes > 1 {
                    v.push(Algorithm::Tree);
                }
                if self.collnet_available() {
                    v.push(Algorithm::CollNet);
                }
                if self.direct_available() {
                    v.extend([Algorithm::OneShot, Algorithm::Pairwise]);
                }
                v
            }
            // The prefix chain has no one-shot form.
            CollKind::Scan | CollKind::ExclusiveScan => vec![base_algorithm(kind)],
            CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => {
                let mut v = vec![base_algorithm(kind)];
                if self.direct_available() {
                    v.push(Algorithm::OneShot);
                }
                v
            }
        }
    }

    fn collnet_available(&self) -> bool {
        self.caps.collnet && self.shape.nnodes > 1 && self.shape.uniform
    }

    /// Whether copy engines may run this communicator's collectives.
    fn copy_engine_available(&self) -> bool {
        self.caps.copy_engine.is_some() && self.shape.nnodes == 1 && self.shape.nranks > 1
    }

    /// Whether `task` goes to the copy engines instead of the kernel plan
    /// costed at `kernel_us`: never in a group (one launch of step plans)
    /// or for an empty call; `GPUCOLL_CE=1` wherever they can run it;
    /// `auto` where the model says they are cheaper and no algorithm is
    /// forced.
    fn use_copy_engine(&self, task: &Task, grouped: bool, bytes: u64, kernel_us: f64) -> bool {
        if grouped
            || task.count == 0
            || !model::copy_engine_kind(task.kind)
            || !self.copy_engine_available()
        {
            return false;
        }
        match self.config.ce {
            CeMode::Off => false,
            CeMode::On => true,
            CeMode::Auto => {
                self.config.algo.is_none()
                    && model::copy_engine_us(task.kind, bytes as f64, &self.shape, &self.caps)
                        .is_some_and(|t| t < kernel_us)
            }
        }
    }

    fn direct_available(&self) -> bool {
        self.caps.direct && self.shape.nnodes == 1 && self.shape.nranks > 1
    }

    /// The algorithms to consider after `GPUCOLL_ALGO`, and whether they
    /// are a forced order (the first that can run the call is taken)
    /// rather than candidates compared by cost.
    fn algorithms(&self, kind: CollKind) -> (Vec<Algorithm>, bool) {
        let defaults = self.candidates(kind);
        let Some(forced) = self.config.algo else {
            return (defaults, false);
        };
        let forced_order = match kind {
            CollKind::AllReduce => self.forced_all_reduce(forced),
            CollKind::Scan | CollKind::ExclusiveScan => {
                defaults.contains(&forced).then(|| vec![forced])
            }
            CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => match forced {
                // Beyond the inboxes, the collective's own algorithm.
                Algorithm::OneShot if self.direct_available() => {
                    Some(vec![Algorithm::OneShot, base_algorithm(kind)])
                }
                _ if defaults.contains(&forced) => Some(vec![forced]),
                _ => None,
            },
        };
        match forced_order {
            Some(v) => (v, true),
            None => {
                let idx = CollKind::ALL.iter().position(|k| *k == kind).unwrap_or(0) as u32;
                self.warn_once(
                    1 << (WARN_ALGO_SHIFT + idx),
                    format_args!(
                        "GPUCOLL_ALGO={forced} does not apply to {}; ignored for it",
                        kind.name()
                    ),
                );
                (defaults, false)
            }
        }
    }

    /// The forced order for all_reduce under `GPUCOLL_ALGO=forced`.
    fn forced_all_reduce(&self, forced: Algorithm) -> Option<Vec<Algorithm>> {
        match forced {
            Algorithm::Ring | Algorithm::Tree => Some(vec![forced]),
            Algorithm::CollNet if self.collnet_available() => Some(vec![forced]),
            Algorithm::CollNet => {
                self.warn_once(
                    WARN_COLLNET_UNAVAILABLE,
                    format_args!(
                        "GPUCOLL_ALGO=collnet: needs several nodes with the same number of ranks \
                         and a backend with rails (backend collnet={}, {} nodes, uniform={}); \
                         using ring for all_reduce",
                        self.caps.collnet, self.shape.nnodes, self.shape.uniform
                    ),
                );
                Some(vec![Algorithm::Ring])
            }
            // Forced pairwise (`direct`, its former name) keeps that name's
            // meaning for all_reduce: the one-shot where it fits, the
            // pairwise rounds beyond.
            Algorithm::Pairwise if self.direct_available() => {
                Some(vec![Algorithm::OneShot, Algorithm::Pairwise])
            }
            Algorithm::OneShot if self.shape.nnodes == 1 => {
                let beyond = if self.direct_available() {
                    Algorithm::Pairwise
                } else {
                    Algorithm::Ring
                };
                Some(vec![Algorithm::OneShot, beyond])
            }
            Algorithm::Pairwise | Algorithm::OneShot => {
                self.warn_once(
                    WARN_DIRECT_UNAVAILABLE,
                    format_args!(
                        "GPUCOLL_ALGO={forced}: no direct path here (backend direct={}, {} nodes); using ring for all_reduce",
                        self.caps.direct, self.shape.nnodes
                    ),
                );
                Some(vec![Algorithm::Ring])
            }
            // Copy engines are not forced through GPUCOLL_ALGO (config
            // refuses it) and never run all_reduce.
            Algorithm::CopyEngine => None,
        }
    }

    /// The protocols the backend implements for `kind` run by `algo`.
    fn implemented(&self, kind: CollKind, algo: Algorithm) -> &[Protocol] {
        let direct = algo == Algorithm::OneShot
            || (kind == CollKind::AllReduce && algo == Algorithm::Pairwise);
        if direct && !self.caps.oneshot_protocols.is_empty() {
            &self.caps.oneshot_protocols
        } else {
            &self.caps.protocols
        }
    }

    /// The protocols to consider for `kind` run by `algo` after
    /// `GPUCOLL_PROTO`. A forced protocol applies where the algorithm
    /// implements it; the others keep their own (a warning when no
    /// algorithm implements it at all).
    fn protocols(&self, kind: CollKind, algo: Algorithm, forced: bool) -> Vec<Protocol> {
        let mut avail: Vec<Protocol> = Protocol::ALL
            .into_iter()
            .filter(|p| self.implemented(kind, algo).contains(p))
            .collect();
        if avail.is_empty() {
            avail.push(Protocol::Simple);
        }
        match self.config.proto.filter(|_| forced) {
            Some(p) if avail.contains(&p) => vec![p],
            Some(p) => {
                if !self.caps.protocols.contains(&p) && !self.caps.oneshot_protocols.contains(&p) {
                    self.warn_once(
                        WARN_PROTO,
                        format_args!(
                            "GPUCOLL_PROTO={p} is not implemented by this backend; ignored"
                        ),
                    );
                }
                avail
            }
            None => avail,
        }
    }

    /// Channels for a call moving `bytes`.
    fn channels(&self, bytes: u64) -> usize {
        let max = self.caps.max_channels.max(1);
        match self.config.nchannels {
            Some(n) => n.clamp(1, max),
            None => {
                let n = bytes / self.min_channel_bytes;
                (n.min(max as u64) as usize).max(1)
            }
        }
    }

    /// The cheapest (time, algorithm, protocol) among `algos` (the first
    /// that can run the call, when `forced_order`); `forced_proto`: honour
    /// `GPUCOLL_PROTO`.
    fn best(
        &self,
        task: &Task,
        algos: &[Algorithm],
        forced_order: bool,
        bytes: u64,
        nchannels: usize,
        forced_proto: bool,
    ) -> Option<(f64, Algorithm, Protocol)> {
        let mut best: Option<(f64, Algorithm, Protocol)> = None;
        for &a in algos {
            for p in self.protocols(task.kind, a, forced_proto) {
                let t = model::estimate_us(
                    task.kind,
                    a,
                    p,
                    nchannels,
                    bytes as f64,
                    &self.shape,
                    &self.caps,
                )
                .unwrap_or(f64::INFINITY);
                if t.is_finite() && best.map_or(true, |(bt, _, _)| t < bt) {
                    best = Some((t, a, p));
                }
            }
            if forced_order && best.is_some() {
                break;
            }
        }
        best
    }

    /// Decide how to run `task` as a launch of its own.
    pub fn choose(&self, task: &Task) -> Choice {
        self.choose_in(task, false)
    }

    /// Decide how to run `task`, `grouped` with other calls in one launch
    /// or not. A group is one launch of step plans, so where the one-shot
    /// would be chosen a grouped all_reduce runs the direct pairwise plan
    /// instead (what GPUs have always done with grouped direct calls).
    pub fn choose_in(&self, task: &Task, grouped: bool) -> Choice {
        let bytes = task.bytes(self.shape.nranks);
        let nchannels = self.channels(bytes);
        let (algos, forced_order) = self.algorithms(task.kind);
        // A forced protocol no candidate can run at this size (LL beyond the
        // LL one-shot) gives way to the protocols the algorithms have.
        let best = self
            .best(task, &algos, forced_order, bytes, nchannels, true)
            .or_else(|| self.best(task, &algos, forced_order, bytes, nchannels, false));
        let (mut time, mut algorithm, mut protocol) =
            best.unwrap_or((f64::INFINITY, algos[0], Protocol::Simple));
        if grouped && algorithm == Algorithm::OneShot {
            algorithm = Algorithm::Pairwise;
        }
        if self.use_copy_engine(task, grouped, bytes, time) {
            algorithm = Algorithm::CopyEngine;
            protocol = Protocol::Simple;
            time = model::copy_engine_us(task.kind, bytes as f64, &self.shape, &self.caps)
                .unwrap_or(time);
        }
        let choice = Choice {
            algorithm,
            protocol,
            nchannels,
            chunk_bytes: self.chunk_bytes,
        };
        tracing::debug!(
            coll = task.kind.name(),
            count = task.count,
            bytes,
            grouped,
            algo = %choice.algorithm,
            proto = %choice.protocol,
            nchannels = choice.nchannels,
            chunk_bytes = choice.chunk_bytes,
            est_us = time,
            "tuner choice"
        );
        choice
    }
}

/// [`Task::bytes`] without overflow (saturating for absurd counts).
/// The algorithm of collectives other than all_reduce where no one-shot
/// runs them: the ring for those that pass data along (for scan and
/// exclusive_scan, the chain in rank order that `plan/scan.rs` builds),
/// pairwise exchanges for the others.
fn base_algorithm(kind: CollKind) -> Algorithm {
    match kind {
        CollKind::AllReduce
        | CollKind::Reduce
        | CollKind::Broadcast
        | CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::Scan
        | CollKind::ExclusiveScan => Algorithm::Ring,
        CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => Algorithm::Pairwise,
    }
}

#[cfg(test)]
mod tests;
