//! [`Tuner`]: picks algorithm, protocol, channel count and chunk size per
//! call from the cost model, the backend's capabilities and the
//! `GPUCOLL_ALGO` / `GPUCOLL_PROTO` / `GPUCOLL_NCHANNELS` overrides.

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
        let bw = model::path_bandwidth(&shape, caps).max(0.0);
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
                    v.extend([Algorithm::OneShot, Algorithm::Direct]);
                }
                v
            }
            _ => {
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
        let forced_order = match (kind, forced) {
            (CollKind::AllReduce, Algorithm::Ring | Algorithm::Tree) => Some(vec![forced]),
            (CollKind::AllReduce, Algorithm::CollNet) if self.collnet_available() => {
                Some(vec![forced])
            }
            (CollKind::AllReduce, Algorithm::CollNet) => {
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
            // `direct` keeps its meaning for all_reduce: the one-shot where
            // it fits, the pairwise rounds beyond.
            (CollKind::AllReduce, Algorithm::Direct) if self.direct_available() => {
                Some(vec![Algorithm::OneShot, Algorithm::Direct])
            }
            (CollKind::AllReduce, Algorithm::OneShot) if self.shape.nnodes == 1 => {
                let beyond = if self.direct_available() {
                    Algorithm::Direct
                } else {
                    Algorithm::Ring
                };
                Some(vec![Algorithm::OneShot, beyond])
            }
            // Beyond the inboxes, the collective's own algorithm.
            (_, Algorithm::OneShot) if kind != CollKind::AllReduce && self.direct_available() => {
                Some(vec![Algorithm::OneShot, base_algorithm(kind)])
            }
            (CollKind::AllReduce, Algorithm::Direct | Algorithm::OneShot) => {
                self.warn_once(
                    WARN_DIRECT_UNAVAILABLE,
                    format_args!(
                        "GPUCOLL_ALGO={forced}: no direct path here (backend direct={}, {} nodes); using ring for all_reduce",
                        self.caps.direct, self.shape.nnodes
                    ),
                );
                Some(vec![Algorithm::Ring])
            }
            _ if defaults.contains(&forced) => Some(vec![forced]),
            _ => None,
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

    /// The protocols the backend implements for `kind` run by `algo`.
    fn implemented(&self, kind: CollKind, algo: Algorithm) -> &[Protocol] {
        let direct = algo == Algorithm::OneShot
            || (kind == CollKind::AllReduce && algo == Algorithm::Direct);
        if direct && !self.caps.direct_protocols.is_empty() {
            &self.caps.direct_protocols
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
                if !self.caps.protocols.contains(&p) && !self.caps.direct_protocols.contains(&p) {
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
        let bytes = task_bytes(task, self.shape.nranks);
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
            algorithm = Algorithm::Direct;
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
/// runs them: the ring for those that pass data along, pairwise exchanges
/// for the others.
fn base_algorithm(kind: CollKind) -> Algorithm {
    match kind {
        CollKind::AllReduce
        | CollKind::Reduce
        | CollKind::Broadcast
        | CollKind::AllGather
        | CollKind::ReduceScatter => Algorithm::Ring,
        CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => Algorithm::Direct,
    }
}

fn task_bytes(task: &Task, nranks: usize) -> u64 {
    let per = task.count.saturating_mul(task.dtype.size() as u64);
    match task.kind {
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => per.saturating_mul(nranks as u64),
        _ => per,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::Datatype;
    use crate::op::ReduceOp;
    use crate::tune::caps::LinkCost;

    fn caps(direct: bool) -> BackendCaps {
        BackendCaps {
            protocols: vec![Protocol::Simple, Protocol::LL],
            direct_protocols: vec![Protocol::Simple, Protocol::LL],
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
                                assert!(n * 4 <= model::DIRECT_ONESHOT_MAX_BYTES);
                            }
                            CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => {
                                assert_eq!(ch.algorithm, Algorithm::Direct)
                            }
                            CollKind::AllReduce => {
                                if ch.algorithm == Algorithm::Tree {
                                    assert!(topo.nnodes() > 1);
                                }
                                if matches!(ch.algorithm, Algorithm::Direct | Algorithm::OneShot) {
                                    assert!(direct && topo.nnodes() == 1);
                                }
                                if ch.algorithm == Algorithm::OneShot {
                                    assert!(n * 4 <= model::DIRECT_ONESHOT_MAX_BYTES);
                                }
                            }
                            _ => assert_eq!(ch.algorithm, Algorithm::Ring),
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
    fn direct_protocols_apply_to_the_one_shot_only() {
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
            Algorithm::Direct
        );
        let beyond_ll = t.choose(&task(
            CollKind::AllReduce,
            (model::DIRECT_LL_MAX_BYTES / 4) * 2,
        ));
        assert_ne!(beyond_ll.protocol, Protocol::LL);
        for kind in CollKind::ALL {
            for n in [1u64, 1 << 10, 1 << 20, 1 << 26] {
                let ch = t.choose(&task(kind, n));
                if ch.protocol == Protocol::LL {
                    assert_eq!(ch.algorithm, Algorithm::OneShot, "{kind:?}");
                    assert!(n * 4 <= model::DIRECT_LL_MAX_BYTES);
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
            algo: Some(Algorithm::Direct),
            proto: Some(Protocol::LL),
            ..Config::default()
        };
        let t = Tuner::new(&topo, &c, &cfg);
        let c2 = t.choose(&task(CollKind::AllReduce, model::DIRECT_LL_MAX_BYTES / 2));
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
        let c3 = t.choose(&task(
            CollKind::AllReduce,
            model::DIRECT_ONESHOT_MAX_BYTES / 4 * 2,
        ));
        assert_eq!(
            (c3.algorithm, c3.protocol),
            (Algorithm::Direct, Protocol::Simple)
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
            algo: Some(Algorithm::Direct),
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
            Algorithm::Direct
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
}
