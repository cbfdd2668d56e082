//! gpucoll-bench: nccl-tests-style timing of gpucoll's collectives.
//!
//! Run under MPI: `mpirun -n 4 gpucoll-bench -b 8 -e 64M -f 2 --coll all`.
//! `--help` lists the options; README.md describes the output.
//!
//! With the cargo feature `cuda` and a communicator on the CUDA backend,
//! the buffers are `DeviceBuffer`s on the backend's GPU (inputs are filled
//! on the host and copied in, results copied back to be checked), and
//! `--vs-nccl` times NCCL on the same data in the same run (gpu.rs).
//! `--overlap` runs each size's collective again while a compute job runs
//! on another stream (overlap.rs, compute.rs; bench/README.md).
//! `--register` registers gpucoll's device buffers of each size with the
//! peers before timing it (register.rs).

/// `$body` with the type name `$t` standing for the element type of the
/// `Datatype` `$dtype` (every table runs generic code per datatype).
macro_rules! with_elem_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            gpucoll::Datatype::I8 => {
                type $t = i8;
                $body
            }
            gpucoll::Datatype::U8 => {
                type $t = u8;
                $body
            }
            gpucoll::Datatype::I32 => {
                type $t = i32;
                $body
            }
            gpucoll::Datatype::U32 => {
                type $t = u32;
                $body
            }
            gpucoll::Datatype::I64 => {
                type $t = i64;
                $body
            }
            gpucoll::Datatype::U64 => {
                type $t = u64;
                $body
            }
            gpucoll::Datatype::F16 => {
                type $t = gpucoll::f16;
                $body
            }
            gpucoll::Datatype::BF16 => {
                type $t = gpucoll::bf16;
                $body
            }
            gpucoll::Datatype::F32 => {
                type $t = f32;
                $body
            }
            gpucoll::Datatype::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}

mod algos;
mod args;
mod bufs;
mod compute;
mod data;
mod floor;
mod gpu;
mod nccl;
#[cfg(feature = "cuda")]
mod ncclapi;
mod overlap;
mod par;
mod register;
mod report;
mod run;
mod summary;
mod svg;
mod timing;
mod vsmpi;
mod vsnccl;

use args::{Args, Mode, Placement};
use gpu::{GcStream, Gpu};
use gpucoll::{CollKind, Communicator};
use nccl::Nccl;
use report::{Measure, Row};
use std::io::Write;

/// How the run failed.
pub enum Fail {
    /// Every rank saw the same problem (bad option): finalize MPI, exit 2.
    Usage(String),
    /// A collective failed on this rank; peers may be stuck in a call, so
    /// exit at once without finalizing (mpirun then ends the job).
    Runtime(String),
}

fn main() {
    let code = match real_main() {
        Ok(code) => code,
        Err(Fail::Usage(msg)) => {
            eprintln!("gpucoll-bench: {msg}");
            2
        }
        Err(Fail::Runtime(msg)) => {
            eprintln!("gpucoll-bench: error: {msg}");
            let _ = std::io::stdout().flush();
            std::process::exit(1);
        }
    };
    std::process::exit(code);
}

/// The rank as the launcher tells it, before MPI is initialized (so that a
/// bad option is reported once, not once per rank).
fn launcher_rank() -> usize {
    [
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(0)
}

fn real_main() -> Result<i32, Fail> {
    let args = match args::parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if launcher_rank() == 0 {
                eprintln!("gpucoll-bench: {e}\n(run with --help for the options)");
            }
            return Ok(2);
        }
    };
    if args.help {
        if launcher_rank() == 0 {
            println!("{}", args::USAGE);
        }
        return Ok(0);
    }

    if args.vs_nccl && gpu::COMPILED {
        // NVLink multicast (NVLS) stays off on the lent machines: NCCL must
        // never create multicast objects there. Set before MPI and NCCL
        // start (no other thread exists yet), for every NCCL call below.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }

    if let Some(ce) = &args.ce {
        // Read when the world communicator is created (same on every rank).
        std::env::set_var("GPUCOLL_CE", ce);
    }
    let universe = gpucoll::initialize().map_err(|e| Fail::Usage(format!("initialize: {e}")))?;
    let world = universe
        .world()
        .map_err(|e| Fail::Usage(format!("creating the world communicator: {e}")))?;
    let code = match bench(&world, &args) {
        Ok(code) => code,
        Err(Fail::Runtime(msg)) => {
            // Exit here, while the communicator and MPI are still alive:
            // dropping them would finalize MPI, which can hang when a peer
            // is stuck in a collective. mpirun ends the other ranks.
            eprintln!("gpucoll-bench: error: {msg}");
            let _ = std::io::stdout().flush();
            std::process::exit(1);
        }
        Err(e) => return Err(e),
    };
    drop(world);
    drop(universe);
    Ok(code)
}

pub struct Ctx<'a> {
    pub world: &'a Communicator,
    pub args: &'a Args,
    pub rank: usize,
    pub nranks: usize,
    pub rows: Vec<Row>,
    /// The backend's GPU when it is the CUDA backend (device buffers).
    pub gpu: Option<&'a Gpu>,
    /// gpucoll's stream for the async and graph modes (CUDA backend).
    pub stream: Option<&'a GcStream>,
    /// NCCL over the same ranks (`--vs-nccl`).
    pub nccl: Option<&'a Nccl>,
    /// The compute job of `--overlap`, and its figures per row.
    pub job: Option<&'a overlap::Job<'a>>,
    pub overlaps: Vec<overlap::Record>,
    /// The signalling floor of `--floor`, in microseconds.
    pub floor_us: Option<f64>,
}

impl Ctx<'_> {
    pub fn print(&self, line: &str) {
        if self.rank == 0 {
            println!("{line}");
            let _ = std::io::stdout().flush();
        }
    }
}

fn bench(world: &Communicator, args: &Args) -> Result<i32, Fail> {
    let rank = world.rank();
    let nranks = world.size();
    if args.vs_nccl && !gpu::COMPILED {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --vs-nccl needs a build with the cuda feature \
                 (cargo build --release --features cuda -p gpucoll-bench); this build has \
                 backend: {}",
                world.backend_name()
            );
        }
        return Ok(2);
    }
    if args.vs_nccl && world.backend_name() != "cuda" {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --vs-nccl needs the CUDA backend, but this communicator uses \
                 '{}' (no GPU visible to every rank, a multi-node job, or GPUCOLL_BACKEND set)",
                world.backend_name()
            );
        }
        return Ok(2);
    }
    if args.overlap && (!gpu::COMPILED || world.backend_name() != "cuda") {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --overlap needs the CUDA backend (a build with the cuda feature, \
                 a GPU for every rank), but this communicator uses '{}'",
                world.backend_name()
            );
        }
        return Ok(2);
    }
    if args.register && (!gpu::COMPILED || world.backend_name() != "cuda") {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --register needs the CUDA backend (a build with the cuda \
                 feature, a GPU for every rank): it registers gpucoll's device buffers with the \
                 peers, but this communicator uses '{}', which has no device buffers",
                world.backend_name()
            );
        }
        return Ok(2);
    }
    if args.floor && (!gpu::COMPILED || world.backend_name() != "cuda") {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --floor needs the CUDA backend (a build with the cuda feature, a \
                 GPU for every rank): it times a GPU thread answering the host, but this \
                 communicator uses '{}'",
                world.backend_name()
            );
        }
        return Ok(2);
    }
    if args.colls.iter().any(|k| k.rooted()) && args.root >= nranks {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --root {} is out of range for {} ranks",
                args.root, nranks
            );
        }
        return Ok(2);
    }
    par::set_threads(par::share_of_cores(world.local_size()));
    let gpu = Gpu::for_world(world).map_err(Fail::Runtime)?;
    // The async and graph modes queue work on a CUDA stream: without the
    // CUDA backend they are skipped next to blocking, else a usage error.
    let mut skipped = Vec::new();
    let modes: Vec<Mode> = if gpu.is_some() {
        args.modes.clone()
    } else {
        let (keep, skip): (Vec<Mode>, Vec<Mode>) = args.modes.iter().partition(|m| !m.on_stream());
        if keep.is_empty() {
            if rank == 0 {
                eprintln!(
                    "gpucoll-bench: --mode {} needs the CUDA backend (build with --features \
                     cuda and run on GPUs), but this communicator uses '{}'",
                    skip.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
                    world.backend_name()
                );
            }
            return Ok(2);
        }
        skipped = skip;
        keep
    };
    if !args.algos.is_empty() {
        return compare_algos(world, args, gpu.as_ref());
    }
    let stream = match &gpu {
        Some(g) if modes.iter().any(|m| m.on_stream()) => {
            Some(GcStream::new(g).map_err(Fail::Runtime)?)
        }
        _ => None,
    };
    let nccl = match (&gpu, args.vs_nccl) {
        (Some(g), true) => match Nccl::init(world, g, args.nccl_lib.as_deref(), args.max_bytes) {
            Ok(n) => Some(n),
            Err(nccl::InitError::Unavailable(msg)) => {
                if rank == 0 {
                    eprintln!("gpucoll-bench: --vs-nccl: {msg}");
                }
                return Ok(2);
            }
            Err(nccl::InitError::Failed(msg)) => {
                return Err(Fail::Runtime(format!("setting up NCCL: {msg}")))
            }
        },
        _ => None,
    };

    let compute = match (&gpu, args.overlap) {
        (Some(g), true) => Some(overlap_compute(world, g)?),
        _ => None,
    };
    let job = match &compute {
        Some(c) => {
            let target = overlap::LAUNCH_TARGET_S;
            let (iters, launch_s) = overlap::calibrate(world, c, args.overlap_iters, target)
                .map_err(|e| Fail::Runtime(format!("rank {rank}: {e}")))?;
            Some(overlap::Job {
                compute: c,
                launches: args.overlap_launches,
                iters,
                launch_s,
            })
        }
        None => None,
    };

    // Before the tables and before any collective's resident worker
    // exists, so the floor is the mechanism's own cost on this layout.
    let floor = match (&gpu, args.floor) {
        (Some(g), true) => {
            Some(floor::measure(world, g).map_err(|e| Fail::Runtime(format!("rank {rank}: {e}")))?)
        }
        _ => None,
    };

    let mut ctx = Ctx {
        world,
        args,
        rank,
        nranks,
        rows: Vec::new(),
        gpu: gpu.as_ref(),
        stream: stream.as_ref(),
        nccl: nccl.as_ref(),
        job: job.as_ref(),
        overlaps: Vec::new(),
        floor_us: floor.map(|f| f.us()),
    };
    if let Some(f) = &floor {
        for line in f.lines(nranks) {
            ctx.print(&line);
        }
    }
    let step = match args.step_bytes {
        Some(b) => format!("{b} bytes"),
        None => format!("{}(factor)", args.step_factor),
    };
    ctx.print(&format!(
        "# gpucoll-bench: ranks {}, nodes {}, backend {}, minBytes {}, maxBytes {}, step: {}, \
         warmup iters: {}, iters: {}, validation: {}, in-place: {}, modes: {}{}{}{}",
        nranks,
        world.nnodes(),
        world.backend_name(),
        args.min_bytes,
        args.max_bytes,
        step,
        args.warmup,
        args.iters,
        args.check as u8,
        args.placement.code(),
        modes
            .iter()
            .map(|m| match (m.on_stream(), args.stream_max_bytes) {
                (true, Some(_)) => format!("{} (maxBytes {})", m.name(), args.max_bytes_of(*m)),
                _ => m.name().to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        if args.vs_mpi { ", vs-mpi" } else { "" },
        if args.register { ", registered" } else { "" },
        match &nccl {
            Some(n) => format!(
                ", vs-nccl (NCCL {} from {}; symmetric windows: {})",
                n.version_string(),
                n.lib_path(),
                n.sym_note().unwrap_or("yes")
            ),
            None => String::new(),
        }
    ));
    if !skipped.is_empty() {
        ctx.print(&format!(
            "# skipped modes (they need the CUDA backend): {}",
            skipped
                .iter()
                .map(|m| m.name())
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    let iters = match args.time_budget {
        Some(b) => format!(
            "up to {} calls (cut to about {b} s per loop, at least {})",
            args.iters,
            args.min_iters.min(args.iters)
        ),
        None => format!("{} calls", args.iters),
    };
    ctx.print(&format!(
        "# time: mean of {iters} after {} warmup calls ({} more at a table's first size), max \
         over ranks; busbw factors as in nccl-tests; size = largest buffer of a rank; modes: \
         blocking = each call waits, async = n calls queued on one stream then one synchronize \
         (time / n), graph = n (at most {}) calls captured once into a CUDA graph, {} timed \
         replays (time / (replays x n), iters = n)",
        args.warmup,
        timing::FIRST_SIZE_EXTRA_WARMUP,
        args.graph_iters,
        timing::GRAPH_REPLAYS
    ));
    ctx.print(&match &gpu {
        Some(g) => format!(
            "# buffers: device memory (rank 0 on GPU {}; inputs copied in, results copied back \
             to check){}",
            g.ordinal(),
            if nccl.is_some() {
                "; NCCL: same data in the same mode, blocking = each call followed by a stream \
                 synchronize (its async column: one synchronize after the loop), on gpucoll's \
                 device buffers and on symmetric windows (ncclMemAlloc + \
                 ncclCommWindowRegister), best = the faster; NCCL_NVLS_ENABLE=0"
            } else {
                ""
            }
        ),
        None => "# buffers: host memory".to_string(),
    });

    if args.register {
        ctx.print(&register_note());
    }
    if let Some(j) = &job {
        ctx.print(&overlap::describe(j, args.overlap_iters.is_some()));
    }

    for &mode in &modes {
        for &kind in &args.colls {
            table(&mut ctx, mode, kind)?;
        }
    }
    summary(&mut ctx, &modes, nccl.as_ref())
}

/// `--algos`: blocking and out of place only, without NCCL, overlap or
/// registration (every rank sees the same options, so all exit alike).
fn compare_algos(world: &Communicator, args: &Args, gpu: Option<&Gpu>) -> Result<i32, Fail> {
    let clash = [
        (args.vs_nccl, "--vs-nccl"),
        (args.overlap, "--overlap"),
        (args.register, "--register"),
        (args.modes != [Mode::Blocking], "--mode other than blocking"),
        (args.placement == Placement::InPlace, "--inplace 1"),
    ];
    if let Some((_, what)) = clash.iter().find(|(on, _)| *on) {
        if world.rank() == 0 {
            eprintln!(
                "gpucoll-bench: --algos times blocking, out-of-place calls of each algorithm;                  it does not combine with {what}"
            );
        }
        return Ok(2);
    }
    let mut ctx = Ctx {
        world,
        args,
        rank: world.rank(),
        nranks: world.size(),
        rows: Vec::new(),
        gpu,
        stream: None,
        nccl: None,
        job: None,
        overlaps: Vec::new(),
        floor_us: None,
    };
    algos::run(&mut ctx)
}

/// The header's words on `--register`: what is registered, and the
/// `GPUCOLL_REGISTERED` in effect (the communicator checks that every rank
/// has the same).
fn register_note() -> String {
    let mode = match std::env::var("GPUCOLL_REGISTERED") {
        Ok(v) => format!("GPUCOLL_REGISTERED={v}"),
        Err(_) => "GPUCOLL_REGISTERED unset: auto".to_string(),
    };
    format!(
        "# registered: gpucoll's input and output device buffers of each size (in place: the one \
         buffer) registered with every peer before its warmup calls, dropped after it; last \
         column: whether the peers map every rank's buffers directly (yes/no per placement); \
         NCCL's buffers unchanged; {mode}"
    )
}

/// The compute job of `--overlap` on every rank, or a clean exit on every
/// rank when it cannot be set up on one (the PTX did not load, say).
fn overlap_compute(world: &Communicator, gpu: &Gpu) -> Result<compute::ComputeJob, Fail> {
    let made = compute::ComputeJob::new(gpu);
    let ok = timing::sum_over_ranks(world, made.is_ok() as u64).map_err(Fail::Runtime)?;
    match made {
        Ok(c) if ok as usize == world.size() => Ok(c),
        Ok(_) => Err(Fail::Usage(
            "--overlap: the compute kernel could not be set up on another rank".into(),
        )),
        Err(e) => Err(Fail::Usage(format!("--overlap: {e}"))),
    }
}

/// One collective's table in one mode (every datatype and op).
fn table(ctx: &mut Ctx<'_>, mode: Mode, kind: CollKind) -> Result<(), Fail> {
    let args = ctx.args;
    let show_oop = args.placement.out_of_place() && kind != CollKind::Broadcast;
    let show_ip = args.placement.in_place() || kind == CollKind::Broadcast;
    ctx.print("#");
    let mut title = format!("# Collective: {}, mode {}", kind.name(), mode.name());
    if kind == CollKind::Broadcast && args.placement == Placement::OutOfPlace {
        title.push_str(" (one buffer: timed as in-place)");
    }
    if args.register {
        title.push_str(", gpucoll on registered buffers");
    }
    ctx.print(&title);
    let header = report::header(
        mode,
        show_oop,
        show_ip,
        args.vs_mpi && mode == Mode::Blocking,
        ctx.nccl.is_some(),
        args.register,
    );
    ctx.print(&match ctx.floor_us {
        Some(_) => report::with_floor_header(&header),
        None => header,
    });
    for &dtype in &args.dtypes {
        for op in args.ops_for(kind, dtype) {
            with_elem_type!(dtype, T => run::run_type::<T>(ctx, mode, kind, op, show_oop, show_ip)?);
        }
    }

    Ok(())
}

/// The totals, the per-mode NCCL tables, and the JSON and SVG files.
fn summary(ctx: &mut Ctx<'_>, modes: &[Mode], nccl: Option<&Nccl>) -> Result<i32, Fail> {
    let (world, args, rank, nranks) = (ctx.world, ctx.args, ctx.rank, ctx.nranks);
    let measures: Vec<&Measure> = ctx
        .rows
        .iter()
        .flat_map(|r| [r.out_of_place.as_ref(), r.in_place.as_ref()])
        .flatten()
        .collect();
    let wrong: u64 = measures.iter().filter_map(|m| m.wrong).sum();
    let avg_bus = if measures.is_empty() {
        0.0
    } else {
        measures.iter().map(|m| m.busbw).sum::<f64>() / measures.len() as f64
    };
    ctx.print(&format!(
        "# Out of bounds values : {} {}",
        wrong,
        if wrong == 0 { "OK" } else { "FAILED" }
    ));
    ctx.print(&format!("# Avg bus bandwidth    : {avg_bus:.6} "));
    let mut nccl_wrong = 0;
    if nccl.is_some() {
        let ns: Vec<(f64, u64)> = ctx
            .rows
            .iter()
            .filter_map(|r| {
                let n = r.nccl.as_ref()?;
                Some((n.best()?.busbw, n.wrong()))
            })
            .collect();
        nccl_wrong = ns.iter().map(|x| x.1).sum();
        let avg = if ns.is_empty() {
            0.0
        } else {
            ns.iter().map(|x| x.0).sum::<f64>() / ns.len() as f64
        };
        ctx.print(&format!(
            "# NCCL out of bounds values : {} {}",
            nccl_wrong,
            if nccl_wrong == 0 {
                "OK"
            } else {
                "FAILED (NCCL's own results: those runs never count as NCCL's best)"
            }
        ));
        ctx.print(&format!(
            "# NCCL avg bus bandwidth    : {avg:.6} (best of ordinary and symmetric)"
        ));
        for &mode in modes {
            ctx.print("#");
            for line in summary::nccl_summary(&ctx.rows, mode) {
                ctx.print(&line);
            }
        }
    }
    ctx.print("#");

    // gpucoll's results decide the exit status; NCCL's wrong results are
    // reported above and kept out of the comparison.
    let _ = nccl_wrong;
    let mut status = if wrong == 0 { 0 } else { 1 };
    if let (Some(path), 0) = (&args.json, rank) {
        let floor_us = ctx.floor_us;
        let objs: Vec<String> = ctx
            .rows
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                let lib = nccl.map(|n| (n.version_string(), n.lib_path().to_string()));
                let extra = ctx
                    .overlaps
                    .iter()
                    .find(|o| o.row == i)
                    .map(overlap::json_fields)
                    .unwrap_or_default();
                r.json_objects(
                    nranks,
                    world.nnodes(),
                    world.backend_name(),
                    lib.as_ref().map(|(v, p)| (v.as_str(), p.as_str())),
                )
                .into_iter()
                .map(move |o| overlap::with_fields(o, &extra))
                .map(move |o| report::with_floor_json(o, floor_us))
            })
            .collect();
        let text = if objs.is_empty() {
            "[]\n".to_string()
        } else {
            format!("[\n{}\n]\n", objs.join(",\n"))
        };
        if let Err(e) = std::fs::write(path, text) {
            // Every rank must agree on the exit status; rank 0 alone knows.
            eprintln!("gpucoll-bench: writing {}: {e}", path.display());
            status = 1;
        }
    }
    if let (Some(path), 0) = (&args.svg, rank) {
        // One mode per plot: the first one run (blocking by default).
        let first = modes.first().copied().unwrap_or(Mode::Blocking);
        let rows: Vec<Row> = ctx
            .rows
            .iter()
            .filter(|r| r.mode == first)
            .cloned()
            .collect();
        let title = format!(
            "gpucoll{}{} busbw, {} ranks, backend {}, mode {}",
            if args.register {
                " (registered buffers)"
            } else {
                ""
            },
            match &nccl {
                Some(n) => format!(" vs NCCL {}", n.version_string()),
                None => String::new(),
            },
            nranks,
            world.backend_name(),
            first.name()
        );
        if let Err(e) = std::fs::write(path, svg::plot(&rows, &title)) {
            eprintln!("gpucoll-bench: writing {}: {e}", path.display());
            status = 1;
        }
    }
    // `nccl` (ncclCommAbort: no collective teardown) drops here, before the
    // caller finalizes MPI.
    Ok(status)
}
