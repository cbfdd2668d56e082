//! What the sweep drives: the engine's pieces for this communicator and a
//! `CudaBackend` of its own, with the sequence numbers it stamps launches with.

use gpucoll::backend::cuda::CudaBackend;
use gpucoll::backend::{Backend, BoundPlan, Launch};
use gpucoll::graph::Graph;
use gpucoll::mpi::MpiComm;
use gpucoll::task::Task;
use gpucoll::topo::Topology;
use gpucoll::tune::Tuner;
use gpucoll::RawBuffer;
use std::sync::Arc;

pub(crate) struct Env {
    pub(crate) mpi: Arc<MpiComm>,
    pub(crate) topo: Topology,
    pub(crate) graph: Graph,
    pub(crate) tuner: Tuner,
    pub(crate) backend: CudaBackend,
    pub(crate) gpu: i32,
    pub(crate) seq: u64,
    pub(crate) rank: usize,
    pub(crate) n: usize,
    pub(crate) detail: String,
}

impl Env {
    pub(crate) fn plan(&self, task: &Task) -> gpucoll::plan::Plan {
        self.plan_in(task, false)
    }

    /// The plan of `task`, alone or in a group launch (where the one-shot
    /// gives way to the direct step plan, as in the engine).
    pub(crate) fn plan_in(&self, task: &Task, grouped: bool) -> gpucoll::plan::Plan {
        let choice = self.tuner.choose_in(task, grouped);
        gpucoll::plan::build(task, &self.topo, &self.graph, &choice, self.backend.caps())
    }

    pub(crate) fn run(&mut self, items: Vec<(Task, RawBuffer, RawBuffer)>) -> gpucoll::Result<()> {
        let grouped = items.len() > 1;
        let items: Vec<BoundPlan> = items
            .into_iter()
            .map(|(t, i, o)| BoundPlan {
                plan: Arc::new(self.plan_in(&t, grouped)),
                input: i,
                output: o,
            })
            .collect();
        let launch = Launch {
            first_seq: self.seq,
            stream: None,
            items,
        };
        self.seq += launch.items.len() as u64;
        // SAFETY: the buffers outlive the call and nothing else touches
        // them before run() returns (the blocking path under test).
        unsafe { self.backend.run(launch) }
    }
}
