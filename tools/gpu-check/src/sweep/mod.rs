//! The sweep: every collective, datatype, op, placement and size through
//! the engine's own pieces (tuner, graph, planner) and `CudaBackend`, host
//! buffers, one mixed group launch, then the optional timings.

mod cases;
mod env;
mod group;
mod perf;

use crate::report::report;
use crate::Options;
use cases::{all_cases, case};
use env::Env;
use gpucoll::backend::cuda::CudaBackend;
use gpucoll::backend::Backend;
use gpucoll::config::Config;
use gpucoll::graph::Graph;
use gpucoll::mpi::MpiComm;
use gpucoll::tune::Tuner;
use gpucoll::{bf16, f16, CollKind, Communicator, ReduceOp};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// Runs the sweep on `world`'s ranks with a backend of its own; the exit
/// status.
pub(crate) fn run(world: &Communicator, mpi: Arc<MpiComm>, opts: &Options) -> i32 {
    let large = opts.large;
    let check = opts.check;
    let topo = world.topology().clone();
    let config = Config::from_env().unwrap_or_default();
    let t0 = Instant::now();
    let backend = match CudaBackend::new(mpi.clone(), &topo, &config) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rank {}: CudaBackend::new: {e}", topo.rank);
            return 3;
        }
    };
    let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut env = Env {
        graph: Graph::new(&topo),
        tuner: Tuner::new(&topo, backend.caps(), &config),
        gpu: backend.device_ordinal(),
        rank: topo.rank,
        n: topo.nranks,
        seq: 0,
        detail: String::new(),
        topo,
        backend,
        mpi,
    };
    let mut log = String::new();
    let mut failures = 0usize;
    let sizes = [
        (0u64, false),
        (1, false),
        (7919, false),
        (1001, true),
        (large, false),
    ];
    let t1 = Instant::now();
    macro_rules! each { ($($t:ty),*) => {$(
        all_cases::<$t>(&mut env, &sizes, &mut log, &mut failures);
    )*}; }
    if check {
        each!(i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64);
    }
    // Host buffers (staged through device memory by the backend).
    for kind in CollKind::ALL.into_iter().filter(|_| check) {
        for ip in [false, true] {
            let root = if kind.rooted() { env.n - 1 } else { 0 };
            match case::<f32>(&mut env, kind, ReduceOp::Sum, 4099, ip, false, true, root) {
                Ok(0) => {}
                Ok(b) => {
                    failures += 1;
                    let _ = writeln!(
                        log,
                        "rank {} WRONG host {} ip={ip}: {b}",
                        env.rank,
                        kind.name()
                    );
                }
                Err(e) => {
                    failures += 1;
                    let _ = writeln!(
                        log,
                        "rank {} ERROR host {} ip={ip}: {e}",
                        env.rank,
                        kind.name()
                    );
                }
            }
        }
    }
    let group = if check {
        group::mixed_group(&mut env)
    } else {
        Ok(0)
    };
    match group {
        Ok(0) => {}
        Ok(b) => {
            failures += 1;
            let _ = writeln!(log, "rank {} WRONG group: {b}", env.rank);
        }
        Err(e) => {
            failures += 1;
            let _ = writeln!(log, "rank {} ERROR group: {e}", env.rank);
        }
    }
    let check_s = t1.elapsed().as_secs_f64();
    for line in env.detail.lines().take(12) {
        let _ = writeln!(log, "{line}");
    }
    let calls = env.seq;
    if let Some(spec) = opts.perf.as_deref().filter(|_| failures == 0) {
        if let Err(e) = perf::perf(&mut env, spec, &mut log) {
            failures += 1;
            let _ = writeln!(log, "rank {} ERROR perf: {e}", env.rank);
        }
    }
    let header = format!(
        "gpu_check: {} ranks, gpu of rank 0 = {}, large = {large}, setup {setup_ms:.0} ms, {calls} launches in {check_s:.1} s",
        env.n, env.gpu
    );
    let code = report(
        &env.mpi,
        env.rank,
        env.n,
        failures,
        &log,
        &header,
        opts.out.clone(),
    );
    drop(env);
    code
}
