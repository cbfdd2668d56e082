//! The engine behind every collective call: check mode, tuning, planning and
//! submission to the backend, in issue order, with one sequence number per
//! collective that every rank counts the same way.
//!
//! Check mode (`GPUCOLL_CHECK=1`): before each launch the ranks allgather a
//! fixed-size signature of it, bounded by the timeout: the sequence number,
//! the number of calls, the first call's kind, dtype, op, count, root,
//! scalar and memory kind, and a digest of the rest. Ranks that differ fail
//! with `MismatchedCall`, naming what each called. The in-place flag is
//! sent but not compared, because ranks may mix the two forms. Without
//! check mode a mismatch shows later, as `ProtocolMismatch` or a timeout.
//!
//! Errors: an argument error leaves the communicator usable. A fatal one
//! (`Error::is_fatal`) is recorded in the engine's failure state, and every
//! later call returns `CommunicatorFailed`. Running out of memory after the
//! sequence number was taken is fatal too, and the node is told at once:
//! the peers went ahead with the call and would otherwise wait for the
//! timeout. The caller still gets the out-of-memory error.

use crate::backend::shared::failure::Failure;
use crate::backend::{Backend, BoundPlan, DeviceMoves, Launch, PendingWork, Registered};
use crate::buffer::{MemoryKind, RawBuffer};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::mpi::MpiComm;
use crate::plan::{self, Plan};
use crate::task::{CollKind, Task};
use crate::topo::Topology;
use crate::tune::Tuner;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Everything of a [`Task`] a plan depends on (the op's scalar as bits),
/// and whether it runs in a group launch.
type PlanKey = (u8, u8, u8, u64, u64, usize, bool, bool);

fn plan_key(t: &Task, grouped: bool) -> PlanKey {
    (
        kind_code(t.kind),
        t.dtype as u8,
        t.op.code(),
        t.op.scalar_bits(),
        t.count,
        t.root,
        t.in_place,
        grouped,
    )
}

/// Most plans the engine keeps; the cache is emptied when it is full.
const PLAN_CACHE_MAX: usize = 256;

/// Largest plan (in steps over all channels) the cache keeps.
const PLAN_CACHE_MAX_STEPS: usize = 4096;

/// One validated collective bound to its buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub task: Task,
    pub input: RawBuffer,
    pub output: RawBuffer,
}

/// Record `err` in the engine's failure state if it fails the communicator
/// (shared with pending work, so an error seen while waiting fails the
/// communicator for every later call).
fn record_fatal(failed: &Failure, err: &Error) {
    if err.is_fatal() {
        failed.record(err.to_string());
    }
}

/// The per-communicator engine.
pub(crate) struct Engine {
    backend: Box<dyn Backend>,
    tuner: Tuner,
    graph: Graph,
    topo: Topology,
    config: Config,
    /// Next sequence number; the lock also keeps submissions in issue order.
    next_seq: Mutex<u64>,
    failed: Arc<Failure>,
    /// Plans of recent tasks: tuning and planning depend only on the task
    /// (topology, graph, caps and config are fixed for the engine's life).
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
}

/// Size of the check-mode signature each rank contributes.
const SIGNATURE_BYTES: usize = 72;

impl Engine {
    pub(crate) fn new(backend: Box<dyn Backend>, topo: Topology, config: Config) -> Engine {
        let tuner = Tuner::new(&topo, backend.caps(), &config);
        let graph = Graph::new(&topo);
        let me = topo.rank;
        let trees: Vec<String> = (0..2)
            .map(|p| {
                let l = graph.tree_links(p, me);
                format!(
                    "tree{p}: root {} depth {} parent {:?} children {:?}",
                    graph.tree_root(p),
                    graph.tree_depth(p),
                    l.parent,
                    l.children
                )
            })
            .collect();
        tracing::info!(
            rank = me,
            ring = ?graph.ring_order(),
            ring_prev = graph.ring_prev(me),
            ring_next = graph.ring_next(me),
            trees = %trees.join("; "),
            max_channels = backend.caps().max_channels,
            slot_bytes = backend.caps().slot_bytes,
            "graph"
        );
        tracing::info!(
            backend = backend.name(),
            ranks = topo.nranks,
            nodes = topo.nnodes(),
            check = config.check,
            timeout_s = config.timeout.as_secs_f64(),
            "gpucoll engine ready"
        );
        Engine {
            backend,
            tuner,
            graph,
            topo,
            config,
            next_seq: Mutex::new(0),
            failed: Arc::new(Failure::default()),
            plans: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub(crate) fn check_memory(&self, kind: crate::buffer::MemoryKind) -> Result<()> {
        self.backend.check_memory(kind)
    }

    /// The GPU the backend runs on, if it is a GPU backend.
    pub(crate) fn device(&self) -> Option<i32> {
        self.backend.device()
    }

    /// The communicator's failure, if any: a failure recorded by a call, or
    /// one the backend found in work queued on a caller's stream.
    pub(crate) fn async_error(&self) -> Result<()> {
        self.failed.check()?;
        match self.backend.async_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The device side of point-to-point messages, if the backend has one.
    pub(crate) fn moves(&self) -> Option<Arc<dyn DeviceMoves>> {
        self.backend.moves()
    }

    /// Whether point-to-point messages may go on: not once the
    /// communicator failed (or was aborted), nor when the backend found a
    /// failure or a local peer died (recorded here, for every later call).
    pub(crate) fn p2p_check(&self) -> Result<()> {
        self.failed.check()?;
        let found = self
            .backend
            .async_error()
            .or_else(|| self.backend.peer_failure());
        if let Some(e) = found {
            record_fatal(&self.failed, &e);
            return Err(e);
        }
        Ok(())
    }

    /// Record a point-to-point error (a fatal one fails the communicator).
    pub(crate) fn record(&self, e: &Error) {
        record_fatal(&self.failed, e);
    }

    pub(crate) fn abort(&self, reason: &str) {
        record_fatal(&self.failed, &Error::Aborted);
        self.backend.abort(reason);
    }

    /// Plan one task for this rank (exposed for logging and tests).
    pub(crate) fn plan(&self, task: &Task, grouped: bool) -> Plan {
        let choice = self.tuner.choose_in(task, grouped);
        tracing::debug!(
            coll = task.kind.name(),
            count = task.count,
            dtype = %task.dtype,
            op = %task.op,
            algo = %choice.algorithm,
            proto = %choice.protocol,
            channels = choice.nchannels,
            chunk_bytes = choice.chunk_bytes,
            "plan"
        );
        plan::build(task, &self.topo, &self.graph, &choice, self.backend.caps())
    }

    /// The plan of `task`, from the cache when the same task was planned
    /// before (a blocking small call must not pay for tuning and planning).
    fn plan_shared(&self, task: &Task, grouped: bool) -> Arc<Plan> {
        let key = plan_key(task, grouped);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&key) {
            return p.clone();
        }
        let p = Arc::new(self.plan(task, grouped));
        // Only small plans: planning a large call costs little next to
        // moving its data, and its step lists are what would fill memory.
        let steps: usize = p.channels.iter().map(|c| c.steps.len()).sum();
        if steps > PLAN_CACHE_MAX_STEPS {
            return p;
        }
        if plans.len() >= PLAN_CACHE_MAX {
            plans.clear();
        }
        plans.insert(key, p.clone());
        p
    }

    /// Check, plan and submit `calls` as one launch.
    ///
    /// # Safety
    /// Every buffer of `calls` must stay valid and untouched by anything
    /// else until the returned work has completed (see [`Backend::submit`]).
    pub(crate) unsafe fn submit(
        &self,
        mpi: &MpiComm,
        calls: &[Call],
    ) -> Result<Box<dyn PendingWork>> {
        self.with_launch(mpi, calls, None, |backend, launch| {
            // SAFETY: the caller guarantees the buffers outlive the work.
            let inner = unsafe { backend.submit(launch)? };
            Ok(Box::new(TrackedWork {
                inner,
                failed: self.failed.clone(),
            }) as Box<dyn PendingWork>)
        })
    }

    /// Check, plan and run `calls` as one launch, returning when it is done.
    ///
    /// # Safety
    /// Every buffer of `calls` must be valid and untouched by anything else
    /// for the duration of this call.
    pub(crate) unsafe fn run(&self, mpi: &MpiComm, calls: &[Call]) -> Result<()> {
        self.with_launch(mpi, calls, None, |backend, launch| {
            // SAFETY: the buffers are valid for this whole (blocking) call.
            unsafe { backend.run(launch) }
        })
    }

    /// Check, plan and queue `calls` as one launch on the caller's CUDA
    /// `stream`; returns once queued (completion is stream-ordered). The
    /// stream is checked before the launch takes its sequence numbers, so a
    /// rejected stream leaves the communicator usable.
    ///
    /// # Safety
    /// Every buffer of `calls` must be device memory that stays valid and
    /// untouched by anything else until the work completed on `stream` (for
    /// every replay, when the stream is being captured into a graph).
    pub(crate) unsafe fn enqueue(&self, mpi: &MpiComm, calls: &[Call], stream: u64) -> Result<()> {
        self.failed.check()?;
        self.backend.check_stream(stream)?;
        self.with_launch(mpi, calls, Some(stream), |backend, launch| {
            // SAFETY: forwarded from the caller (stream-ordered lifetime).
            unsafe { backend.enqueue(launch) }
        })
    }

    /// Register `buf` with the peers, in call order (the backend's
    /// collective; see `Communicator::register`). None: the backend maps
    /// no peer memory. A fatal error fails the communicator.
    pub(crate) fn register(&self, buf: &RawBuffer) -> Result<Option<Registered>> {
        self.failed.check()?;
        if let Some(e) = self.backend.async_error() {
            record_fatal(&self.failed, &e);
            return Err(e);
        }
        let next = self.next_seq.lock().unwrap_or_else(|e| e.into_inner());
        let result = self.backend.register(*next, buf);
        drop(next);
        if let Err(e) = &result {
            record_fatal(&self.failed, e);
        }
        result
    }

    /// End registration `id` on this rank.
    pub(crate) fn deregister(&self, id: u64) {
        self.backend.deregister(id);
    }

    /// Number, check and plan `calls`, then hand the launch to `go` while
    /// still holding the sequence lock, so launches reach the backend in
    /// the order their numbers say. A fatal error fails the communicator.
    fn with_launch<T>(
        &self,
        mpi: &MpiComm,
        calls: &[Call],
        stream: Option<u64>,
        go: impl FnOnce(&dyn Backend, Launch) -> Result<T>,
    ) -> Result<T> {
        self.failed.check()?;
        // Work queued earlier on a caller's stream failed: this call reports
        // that error (and fails the communicator for every later one).
        if let Some(e) = self.backend.async_error() {
            record_fatal(&self.failed, &e);
            return Err(e);
        }
        let mut next = self.next_seq.lock().unwrap_or_else(|e| e.into_inner());
        let first_seq = *next;
        *next += calls.len() as u64;
        let result = (|| {
            if self.config.check {
                self.check_signatures(mpi, first_seq, calls)?;
            }
            let items = calls
                .iter()
                .map(|c| BoundPlan {
                    plan: self.plan_shared(&c.task, calls.len() > 1),
                    input: c.input,
                    output: c.output,
                })
                .collect();
            go(
                self.backend.as_ref(),
                Launch {
                    first_seq,
                    items,
                    stream,
                },
            )
        })();
        drop(next);
        if let Err(e) = &result {
            if e.is_out_of_memory() {
                // The peers took the same sequence number and went ahead
                // with this call; this rank's memory ran out before it
                // could join (a staging or scratch allocation). Fail the
                // communicator and tell them now, instead of letting them
                // wait for GPUCOLL_TIMEOUT. The caller still gets the
                // out-of-memory error it can match.
                let reason = format!(
                    "rank {} ran out of memory in collective #{first_seq}: {e}",
                    self.topo.rank
                );
                self.failed.record(reason.clone());
                self.backend.abort(&reason);
            }
            record_fatal(&self.failed, e);
        }
        result
    }

    /// Compare a fixed-size signature of this submission across ranks.
    fn check_signatures(&self, mpi: &MpiComm, seq: u64, calls: &[Call]) -> Result<()> {
        let mine = signature(seq, calls);
        let all = mpi
            .allgather_bytes_timeout(&mine, self.config.timeout)
            .map_err(|e| match e {
                Error::Timeout {
                    seconds,
                    waiting_for,
                    ..
                } => Error::Timeout {
                    seq,
                    seconds,
                    waiting_for,
                },
                other => other,
            })?;
        let mut differing = Vec::new();
        for (r, sig) in all.chunks_exact(SIGNATURE_BYTES).enumerate() {
            if !same_call(sig, &mine) {
                differing.push(r);
            }
        }
        if differing.is_empty() {
            return Ok(());
        }
        let describe = |sig: &[u8]| describe_signature(sig);
        let mut detail = format!("rank {} called {}", self.topo.rank, describe(&mine));
        for r in differing.iter().take(4) {
            let sig = &all[r * SIGNATURE_BYTES..(r + 1) * SIGNATURE_BYTES];
            detail.push_str(&format!("; rank {r} called {}", describe(sig)));
        }
        if differing.len() > 4 {
            detail.push_str(&format!("; and {} more ranks differ", differing.len() - 4));
        }
        Err(Error::MismatchedCall { seq, detail })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        tracing::debug!("engine dropped");
    }
}

/// Pending work that records a fatal failure in the communicator's state.
struct TrackedWork {
    inner: Box<dyn PendingWork>,
    failed: Arc<Failure>,
}

impl PendingWork for TrackedWork {
    fn wait(&mut self) -> Result<()> {
        let r = self.inner.wait();
        if let Err(e) = &r {
            record_fatal(&self.failed, e);
        }
        r
    }

    fn test(&mut self) -> Result<bool> {
        let r = self.inner.test();
        if let Err(e) = &r {
            record_fatal(&self.failed, e);
        }
        r
    }
}

fn kind_code(k: CollKind) -> u8 {
    CollKind::ALL.iter().position(|x| *x == k).unwrap_or(0) as u8
}

/// Where a call's data lives, for check mode: bit 0 host memory, bit 1
/// device memory, over its non-empty buffers (0: no data). Every rank of a
/// collective must agree: a rank on host memory while a peer is on device
/// memory is a mistake the MPI shim's users make (the CUDA backend would
/// stage the host side, but an MPI program expects either on all ranks).
fn memory_code(c: &Call) -> u8 {
    [c.input, c.output]
        .iter()
        .filter(|b| b.len > 0)
        .map(|b| match b.memory {
            MemoryKind::Host => 1,
            MemoryKind::Device { .. } => 2,
        })
        .fold(0, |a, m| a | m)
}

/// Fixed-size description of a submission: the first call in full (with
/// its [`memory_code`]), plus the number of calls and a digest of all of
/// them.
fn signature(seq: u64, calls: &[Call]) -> Vec<u8> {
    let mut s = Vec::with_capacity(SIGNATURE_BYTES);
    s.extend_from_slice(&seq.to_le_bytes());
    s.extend_from_slice(&(calls.len() as u64).to_le_bytes());
    let first = calls.first().map(|c| c.task);
    let (kind, dtype, op, in_place, count, root, scalar) = match first {
        Some(t) => (
            kind_code(t.kind),
            t.dtype as u8,
            if t.kind.reduces() { t.op.code() } else { 0 },
            t.in_place as u8,
            t.count,
            t.root as u64,
            if t.kind.reduces() {
                t.op.scalar_bits()
            } else {
                0
            },
        ),
        None => (0, 0, 0, 0, 0, 0, 0),
    };
    let memory = calls.first().map(memory_code).unwrap_or(0);
    s.extend_from_slice(&[
        kind,
        dtype,
        op,
        in_place,
        first.is_some() as u8,
        memory,
        0,
        0,
    ]);
    s.extend_from_slice(&count.to_le_bytes());
    s.extend_from_slice(&root.to_le_bytes());
    s.extend_from_slice(&scalar.to_le_bytes());
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for c in calls {
        let t = c.task;
        for word in [
            kind_code(t.kind) as u64,
            t.dtype as u64,
            if t.kind.reduces() {
                t.op.code() as u64
            } else {
                0
            },
            if t.kind.reduces() {
                t.op.scalar_bits()
            } else {
                0
            },
            t.count,
            t.root as u64,
            memory_code(c) as u64,
        ] {
            digest = (digest ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    s.extend_from_slice(&digest.to_le_bytes());
    s.resize(SIGNATURE_BYTES, 0);
    s
}

/// Whether two signatures describe the same call. Whether a rank works in
/// place is its own business (MPI lets only the root of a rooted collective
/// use `MPI_IN_PLACE`), so that byte is not compared.
fn same_call(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .enumerate()
            .all(|(i, (x, y))| i == IN_PLACE_BYTE || x == y)
}

/// Offset of the in-place flag in a signature.
const IN_PLACE_BYTE: usize = 19;
/// Offset of the first call's [`memory_code`] in a signature.
const MEMORY_BYTE: usize = 21;

fn describe_signature(sig: &[u8]) -> String {
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&sig[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let seq = u64_at(0);
    let ncalls = u64_at(8);
    let kind = CollKind::ALL
        .get(sig[16] as usize)
        .map(|k| k.name())
        .unwrap_or("?");
    let dtype = crate::datatype::Datatype::ALL
        .get(sig[17] as usize)
        .map(|d| d.rust_name())
        .unwrap_or("?");
    let op = crate::op::ReduceOp::ALL
        .get(sig[18] as usize)
        .map(|o| o.name())
        .unwrap_or("?");
    let in_place = sig[IN_PLACE_BYTE] != 0;
    let memory = match sig[MEMORY_BYTE] {
        1 => ", host memory",
        2 => ", device memory",
        3 => ", host and device memory",
        _ => "",
    };
    let count = u64_at(24);
    let root = u64_at(32);
    if sig[20] == 0 {
        return format!("an empty group (collective #{seq})");
    }
    let mut d = format!(
        "{kind}(count={count}, type={dtype}, op={op}, root={root}{}{memory})",
        if in_place { ", in place" } else { "" }
    );
    if ncalls > 1 {
        d.push_str(&format!(" first of a group of {ncalls}"));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::MemoryKind;
    use crate::datatype::Datatype;
    use crate::op::ReduceOp;

    fn call(kind: CollKind, count: u64) -> Call {
        let b = RawBuffer {
            addr: 0,
            len: 0,
            dtype: Datatype::F32,
            memory: MemoryKind::Host,
        };
        Call {
            task: Task {
                kind,
                dtype: Datatype::F32,
                op: ReduceOp::Sum,
                count,
                root: 0,
                in_place: false,
            },
            input: b,
            output: b,
        }
    }

    #[test]
    fn signatures_differ_on_count_and_kind() {
        let a = signature(3, &[call(CollKind::AllReduce, 10)]);
        let b = signature(3, &[call(CollKind::AllReduce, 11)]);
        let c = signature(3, &[call(CollKind::Broadcast, 10)]);
        assert_eq!(a.len(), SIGNATURE_BYTES);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, signature(3, &[call(CollKind::AllReduce, 10)]));
        let d = describe_signature(&a);
        assert!(d.contains("all_reduce(count=10"), "{d}");
    }

    #[test]
    fn memory_kind_is_compared_and_named() {
        let host = call(CollKind::AllReduce, 8);
        let mut dev = host;
        dev.input.len = 8;
        dev.output.len = 8;
        let mut on_host = dev;
        dev.input.memory = MemoryKind::Device { ordinal: 0 };
        dev.output.memory = MemoryKind::Device { ordinal: 1 };
        on_host.input.memory = MemoryKind::Host;
        let (h, d) = (signature(5, &[on_host]), signature(5, &[dev]));
        assert!(!same_call(&h, &d));
        assert!(
            describe_signature(&h).contains("host memory"),
            "{}",
            describe_signature(&h)
        );
        assert!(
            describe_signature(&d).ends_with(", device memory)"),
            "{}",
            describe_signature(&d)
        );
        // The GPU ordinal is each rank's own business.
        let mut other_gpu = dev;
        other_gpu.input.memory = MemoryKind::Device { ordinal: 3 };
        assert!(same_call(&d, &signature(5, &[other_gpu])));
        // Empty buffers (a non-root's receive side) do not count.
        let mut root_side = dev;
        root_side.output.len = 0;
        root_side.output.memory = MemoryKind::Host;
        assert!(same_call(&d, &signature(5, &[root_side])));
        // A mixed call, and a later call of a group, are seen too.
        let mut mixed = dev;
        mixed.output.memory = MemoryKind::Host;
        assert!(describe_signature(&signature(5, &[mixed])).contains("host and device memory"));
        assert!(!same_call(
            &signature(5, &[host, on_host]),
            &signature(5, &[host, dev])
        ));
    }

    #[test]
    fn in_place_is_not_compared() {
        let a = call(CollKind::Reduce, 4);
        let mut b = a;
        b.task.in_place = true;
        assert!(same_call(&signature(1, &[a]), &signature(1, &[b])));
        assert!(!same_call(
            &signature(1, &[a]),
            &signature(1, &[call(CollKind::Reduce, 5)])
        ));
    }

    #[test]
    fn group_digest_covers_later_calls() {
        let a = signature(
            0,
            &[call(CollKind::AllReduce, 1), call(CollKind::AllGather, 2)],
        );
        let b = signature(
            0,
            &[call(CollKind::AllReduce, 1), call(CollKind::AllGather, 3)],
        );
        assert_ne!(a, b);
        assert!(describe_signature(&a).contains("group of 2"));
    }
}
