//! Correctness check of the CUDA backend on a GPU machine (feature `cuda`).
//!
//! The sweep (default) runs every collective × datatype × op ×
//! (out-of-place, in-place) × size (0, 1, a prime, an unaligned view, large)
//! on `DeviceBuffer`s, through the real engine (tuner, graph, planner) and
//! `CudaBackend`, and compares every element with the exact result computed
//! locally (inputs are small integers derived from (rank, index), so every
//! rank knows every input). A few calls use host buffers (staged by the
//! backend) and one group launch mixes datatypes. `--perf` then times
//! collectives.
//!
//! `--stage raw|graph|timeout|mismatch|dead_peer|churn|ce_churn|register|registered|ce_mixed|soak|oom|interop|memkinds|threads|vmm|p2p` runs one stage on the public API instead:
//! raw pointers on callers' streams, CUDA-graph capture and replay, a
//! forced timeout, cudarc slices and streams (`interop`), the kernels on
//! registered peers' buffers (`registered`, with `GPUCOLL_REGISTERED=1`),
//! point-to-point messages on every kind of memory (`p2p`).
//!
//! ```text
//! cargo build --release -p gpucoll-gpu-check
//! mpirun -n 2 target/release/gpu_check [--large N] [--perf [SPEC]] [--perf-only] [--out FILE]
//! mpirun -n 2 target/release/gpu_check --stage raw|graph|timeout [--out FILE]
//! ```
//! Exit status 0 when everything matched.

#[cfg(feature = "cuda")]
mod report;
#[cfg(feature = "cuda")]
mod stages;
#[cfg(feature = "cuda")]
mod sweep;
#[cfg(feature = "cuda")]
mod values;

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("gpu_check needs the `cuda` feature: cargo build -p gpucoll-gpu-check");
    std::process::exit(2);
}

#[cfg(feature = "cuda")]
fn main() {
    std::process::exit(run());
}

/// The command line.
#[cfg(feature = "cuda")]
struct Options {
    /// `--large N`: the large size of the sweep (elements).
    large: u64,
    /// `--perf [SPEC]`: timings after the sweep (see `sweep::perf`).
    perf: Option<String>,
    /// `--perf-only`: skip the correctness sweep.
    check: bool,
    /// `--out FILE`: rank 0 also writes the summary there.
    out: Option<String>,
    /// `--stage NAME`: one of the public-API stages instead of the sweep.
    stage: Option<String>,
}

#[cfg(feature = "cuda")]
impl Options {
    fn parse(args: &[String]) -> Options {
        let arg = |k: &str| {
            args.iter()
                .position(|a| a == k)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        // `--perf` alone: the default sizes.
        let perf = args.iter().position(|a| a == "--perf").map(|i| {
            args.get(i + 1)
                .filter(|v| !v.starts_with("--"))
                .cloned()
                .unwrap_or_else(|| {
                    "all_reduce:1m,all_reduce:8m,all_reduce:64m,all_reduce:256m".into()
                })
        });
        Options {
            large: arg("--large")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1 << 20),
            perf,
            check: !args.iter().any(|a| a == "--perf-only"),
            out: arg("--out"),
            stage: arg("--stage"),
        }
    }
}

#[cfg(feature = "cuda")]
fn run() -> i32 {
    use gpucoll::mpi::MpiComm;
    use std::sync::Arc;
    use std::time::Instant;

    let args: Vec<String> = std::env::args().collect();
    let opts = Options::parse(&args);
    let universe = match gpucoll::initialize() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("initialize: {e}");
            return 2;
        }
    };
    let world = match universe.world() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("world: {e}");
            return 2;
        }
    };
    if opts.stage.as_deref() == Some("dead_peer") {
        stages::stage_dead_peer(world);
    }
    let mpi = Arc::new(MpiComm::world());
    let code = if let Some(name) = &opts.stage {
        let t = Instant::now();
        let mut log = String::new();
        let failures = stages::run_stage(name, &world, &mpi, &mut log);
        let header = format!(
            "gpu_check: stage {name}, {} ranks, backend {}, gpu of rank 0 = {:?}, {:.1} s",
            world.size(),
            world.backend_name(),
            world.device(),
            t.elapsed().as_secs_f64()
        );
        report::report(
            &mpi,
            world.rank(),
            world.size(),
            failures,
            &log,
            &header,
            opts.out,
        )
    } else {
        sweep::run(&world, mpi, &opts)
    };
    drop(world);
    drop(universe);
    code
}
