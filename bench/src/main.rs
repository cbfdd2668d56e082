//! gpucoll-bench: nccl-tests-style timing of gpucoll's collectives.
//!
//! Run under MPI: `mpirun -n 4 gpucoll-bench -b 8 -e 64M -f 2 --coll all`.
//! `--help` lists the options; README.md describes the output.
//!
//! With the cargo feature `cuda` and a communicator on the CUDA backend,
//! the buffers are `DeviceBuffer`s on the backend's GPU (inputs are filled
//! on the host and copied in, results copied back to be checked), and
//! `--vs-nccl` times NCCL on the same data in the same run (gpu.rs).

mod args;
mod data;
mod gpu;
mod par;
mod report;
mod svg;
mod vsmpi;

use args::{Args, Placement};
use data::{Case, Elem};
use gpu::{DevBuf, Gpu, Nccl};
use gpucoll::{bf16, f16, CollKind, Communicator, Datatype, MemoryKind, RawBuffer, ReduceOp};
use report::{Measure, NcclMeasure, Row};
use std::io::Write;

/// How the run failed.
enum Fail {
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

struct Ctx<'a> {
    world: &'a Communicator,
    args: &'a Args,
    rank: usize,
    nranks: usize,
    rows: Vec<Row>,
    /// The backend's GPU when it is the CUDA backend (device buffers).
    gpu: Option<&'a Gpu>,
    /// NCCL over the same ranks (`--vs-nccl`).
    nccl: Option<&'a Nccl>,
}

impl Ctx<'_> {
    fn print(&self, line: &str) {
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
    let nccl = match (&gpu, args.vs_nccl) {
        (Some(g), true) => match Nccl::init(world, g) {
            Ok(n) => Some(n),
            Err(gpu::InitError::Unavailable(msg)) => {
                if rank == 0 {
                    eprintln!("gpucoll-bench: --vs-nccl: {msg}");
                }
                return Ok(2);
            }
            Err(gpu::InitError::Failed(msg)) => {
                return Err(Fail::Runtime(format!("setting up NCCL: {msg}")))
            }
        },
        _ => None,
    };

    let mut ctx = Ctx {
        world,
        args,
        rank,
        nranks,
        rows: Vec::new(),
        gpu: gpu.as_ref(),
        nccl: nccl.as_ref(),
    };
    let step = match args.step_bytes {
        Some(b) => format!("{b} bytes"),
        None => format!("{}(factor)", args.step_factor),
    };
    ctx.print(&format!(
        "# gpucoll-bench: ranks {}, nodes {}, backend {}, minBytes {}, maxBytes {}, step: {}, \
         warmup iters: {}, iters: {}, validation: {}, in-place: {}{}{}",
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
        if args.vs_mpi { ", vs-mpi" } else { "" },
        match &nccl {
            Some(n) => format!(", vs-nccl (NCCL {})", n.version_string()),
            None => String::new(),
        }
    ));
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
         over ranks; busbw factors as in nccl-tests; size = largest buffer of a rank",
        args.warmup, FIRST_SIZE_EXTRA_WARMUP
    ));
    ctx.print(&match &gpu {
        Some(g) => format!(
            "# buffers: device memory (rank 0 on GPU {}; inputs copied in, results copied back \
             to check){}",
            g.ordinal(),
            if nccl.is_some() {
                "; NCCL: same data, blocking = each call followed by a stream synchronize, async \
                 = one synchronize after the loop; NCCL_NVLS_ENABLE=0"
            } else {
                ""
            }
        ),
        None => "# buffers: host memory".to_string(),
    });

    for &kind in &args.colls {
        let show_oop = args.placement.out_of_place() && kind != CollKind::Broadcast;
        let show_ip = args.placement.in_place() || kind == CollKind::Broadcast;
        ctx.print("#");
        let mut title = format!("# Collective: {}", kind.name());
        if kind == CollKind::Broadcast && args.placement == Placement::OutOfPlace {
            title.push_str(" (one buffer: timed as in-place)");
        }
        ctx.print(&title);
        ctx.print(&report::header(
            show_oop,
            show_ip,
            args.vs_mpi,
            nccl.is_some(),
        ));
        for &dtype in &args.dtypes {
            let ops: Vec<Option<ReduceOp>> = if kind.reduces() {
                // `-o all` pairs the integer-only ops with integer types only.
                let ops = args.ops.iter().copied();
                ops.filter(|op| op.applies_to(dtype)).map(Some).collect()
            } else {
                vec![None]
            };
            for op in ops {
                macro_rules! go {
                    ($t:ty) => {
                        run_type::<$t>(&mut ctx, kind, op, show_oop, show_ip)?
                    };
                }
                match dtype {
                    Datatype::I8 => go!(i8),
                    Datatype::U8 => go!(u8),
                    Datatype::I32 => go!(i32),
                    Datatype::U32 => go!(u32),
                    Datatype::I64 => go!(i64),
                    Datatype::U64 => go!(u64),
                    Datatype::F16 => go!(f16),
                    Datatype::BF16 => go!(bf16),
                    Datatype::F32 => go!(f32),
                    Datatype::F64 => go!(f64),
                }
            }
        }
    }

    // Summary.
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
        let ns: Vec<(f64, Option<u64>)> = ctx
            .rows
            .iter()
            .filter_map(|r| match r.nccl {
                Some(NcclMeasure::Time { busbw, wrong, .. }) => Some((busbw, wrong)),
                _ => None,
            })
            .collect();
        nccl_wrong = ns.iter().filter_map(|x| x.1).sum();
        let avg = if ns.is_empty() {
            0.0
        } else {
            ns.iter().map(|x| x.0).sum::<f64>() / ns.len() as f64
        };
        ctx.print(&format!(
            "# NCCL out of bounds values : {} {}",
            nccl_wrong,
            if nccl_wrong == 0 { "OK" } else { "FAILED" }
        ));
        ctx.print(&format!("# NCCL avg bus bandwidth    : {avg:.6} "));
        ctx.print("#");
        for line in report::nccl_summary(&ctx.rows) {
            ctx.print(&line);
        }
    }
    ctx.print("#");

    let mut status = if wrong == 0 && nccl_wrong == 0 { 0 } else { 1 };
    if let (Some(path), 0) = (&args.json, rank) {
        let objs: Vec<String> = ctx
            .rows
            .iter()
            .flat_map(|r| r.json_objects(nranks, world.nnodes(), world.backend_name()))
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
        let title = format!(
            "gpucoll{} busbw, {} ranks, backend {}",
            match &nccl {
                Some(n) => format!(" vs NCCL {}", n.version_string()),
                None => String::new(),
            },
            nranks,
            world.backend_name()
        );
        if let Err(e) = std::fs::write(path, svg::plot(&ctx.rows, &title)) {
            eprintln!("gpucoll-bench: writing {}: {e}", path.display());
            status = 1;
        }
    }
    // `nccl` (ncclCommAbort: no collective teardown) drops here, before the
    // caller finalizes MPI.
    Ok(status)
}

/// A zeroed buffer, or a clean error when memory runs out (every rank
/// allocates the same sizes, so they fail alike).
fn alloc<T: Elem>(len: usize) -> Result<Vec<T>, Fail> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Fail::Usage(format!(
            "cannot allocate {} bytes for the buffers (lower --maxbytes)",
            len.saturating_mul(T::DATATYPE.size())
        ))
    })?;
    v.resize(len, T::default());
    Ok(v)
}

fn host_buf<T: Elem>(s: &[T]) -> RawBuffer {
    RawBuffer {
        addr: s.as_ptr() as u64,
        len: s.len() as u64,
        dtype: T::DATATYPE,
        memory: MemoryKind::Host,
    }
}

/// Max of `x` over the ranks (MPI's own allreduce, independent of gpucoll).
fn max_over_ranks(world: &Communicator, x: f64) -> Result<f64, String> {
    let mut out = [0f64];
    gpucoll::reference::all_reduce(world, &[x][..], &mut out[..], ReduceOp::Max)
        .map_err(|e| format!("MPI allreduce of the timings: {e}"))?;
    Ok(out[0])
}

/// Sum of `x` over the ranks (MPI's own allreduce).
fn sum_over_ranks(world: &Communicator, x: u64) -> Result<u64, String> {
    let mut out = [0u64];
    gpucoll::reference::all_reduce(world, &[x][..], &mut out[..], ReduceOp::Sum)
        .map_err(|e| format!("MPI allreduce of the error counts: {e}"))?;
    Ok(out[0])
}

/// The mean time of one call, and how many calls were timed.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub secs: f64,
    pub iters: usize,
}

/// Calls that fit `budget` seconds at `per_call` seconds each, within
/// `min..=max` (`max` wins when `min > max`).
pub fn budget_iters(budget: f64, per_call: f64, min: usize, max: usize) -> usize {
    if !(per_call > 0.0 && per_call.is_finite()) {
        return max;
    }
    let fit = (budget / per_call).floor();
    let fit = if fit.is_finite() && fit >= 0.0 {
        fit.min(max as f64) as usize
    } else {
        max
    };
    fit.clamp(min.min(max), max)
}

/// Extra warmup calls at the first size of each table: first calls pay
/// one-time costs (plan caches, NCCL's lazy connection setup) that several
/// warmup calls do not always absorb.
pub const FIRST_SIZE_EXTRA_WARMUP: usize = 10;

/// Run `call` warmup (+ `extra_warmup`) times, then time the calls; the
/// mean per call in seconds, max over ranks. With `--time-budget` the
/// fastest warmup call (max over ranks) sets how many calls fit the budget
/// (at least one warmup call is then made).
fn time_calls(
    world: &Communicator,
    args: &Args,
    extra_warmup: usize,
    call: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Timed, String> {
    let warmup = if args.time_budget.is_some() {
        args.warmup.max(1)
    } else {
        args.warmup
    } + extra_warmup;
    let mut fastest = f64::INFINITY;
    for _ in 0..warmup {
        let t = gpucoll::mpi::wtime();
        call()?;
        fastest = fastest.min(gpucoll::mpi::wtime() - t);
    }
    let iters = match args.time_budget {
        Some(budget) => {
            let per = max_over_ranks(world, fastest)?;
            budget_iters(budget, per, args.min_iters, args.iters)
        }
        None => args.iters,
    };
    gpucoll::reference::barrier(world).map_err(|e| format!("MPI barrier: {e}"))?;
    let t0 = gpucoll::mpi::wtime();
    for _ in 0..iters {
        call()?;
    }
    let dt = (gpucoll::mpi::wtime() - t0) / iters as f64;
    Ok(Timed {
        secs: max_over_ranks(world, dt)?,
        iters,
    })
}

/// Time `iters` launches followed by one `sync` (already warm); the mean
/// per call, max over ranks.
fn time_async(
    world: &Communicator,
    iters: usize,
    launch: &mut dyn FnMut() -> Result<(), String>,
    sync: &dyn Fn() -> Result<(), String>,
) -> Result<f64, String> {
    gpucoll::reference::barrier(world).map_err(|e| format!("MPI barrier: {e}"))?;
    let t0 = gpucoll::mpi::wtime();
    for _ in 0..iters {
        launch()?;
    }
    sync()?;
    let dt = (gpucoll::mpi::wtime() - t0) / iters.max(1) as f64;
    max_over_ranks(world, dt)
}

/// A device buffer of `len` elements when running on a GPU and `len > 0`.
fn dev_buf<T: Elem>(
    gpu: Option<&Gpu>,
    want: bool,
    len: usize,
) -> Result<Option<DevBuf<T>>, String> {
    match gpu {
        Some(g) if want && len > 0 => DevBuf::new(g, len).map(Some),
        _ => Ok(None),
    }
}

/// The buffer a collective gets: the device buffer when there is one, else
/// the host slice.
fn pick<T: Elem>(dev: &Option<DevBuf<T>>, host: &[T]) -> RawBuffer {
    match dev {
        Some(d) => d.raw(),
        None => host_buf(host),
    }
}

fn upload<T: Elem>(dev: &mut Option<DevBuf<T>>, host: &[T]) -> Result<(), String> {
    match dev {
        Some(d) => d.upload(host),
        None => Ok(()),
    }
}

fn download<T: Elem>(dev: &Option<DevBuf<T>>, host: &mut [T]) -> Result<(), String> {
    match dev {
        Some(d) => d.download(host),
        None => Ok(()),
    }
}

fn run_type<T: Elem>(
    ctx: &mut Ctx<'_>,
    kind: CollKind,
    op: Option<ReduceOp>,
    show_oop: bool,
    show_ip: bool,
) -> Result<(), Fail> {
    let (world, args, rank, nranks) = (ctx.world, ctx.args, ctx.rank, ctx.nranks);
    let elem = T::DATATYPE.size();
    let case_for = |count: usize| Case {
        kind,
        op: op.unwrap_or(ReduceOp::Sum),
        count,
        nranks,
        rank,
        root: if kind.rooted() { args.root } else { 0 },
    };
    let (max_count, _) = report::count_for(kind, args.max_bytes, elem, nranks);
    let big = case_for(max_count);
    let mut send: Vec<T> = alloc(big.input_len().max(1))?;
    let mut recv: Vec<T> = alloc(big.output_len().max(big.in_place_len()).max(1))?;
    let op_name = op.map_or("none".to_string(), |o| match o {
        ReduceOp::PreMulSum(s) if s != 2.0 => format!("premul:{s}"),
        o => o.name().to_string(),
    });

    let mut last_bytes = None;
    for size in args::sizes(args) {
        let (count, bytes) = report::count_for(kind, size, elem, nranks);
        if count == 0 || last_bytes == Some(bytes) {
            continue;
        }
        let extra = if last_bytes.is_none() {
            FIRST_SIZE_EXTRA_WARMUP
        } else {
            0
        };
        last_bytes = Some(bytes);
        let case = case_for(count);
        let what = || {
            format!(
                "rank {rank}: {} {} {} {} B",
                kind.name(),
                T::DATATYPE.name(),
                op_name,
                bytes
            )
        };
        let fail = |e: String| Fail::Runtime(format!("{}: {e}", what()));

        let mut row = Row {
            coll: kind,
            dtype: T::DATATYPE.name(),
            op: op_name.clone(),
            root: kind.rooted().then_some(args.root),
            bytes,
            count,
            out_of_place: None,
            in_place: None,
            mpi: None,
            nccl: None,
        };

        let (in_len, out_len, ip_len) = (case.input_len(), case.output_len(), case.in_place_len());
        let nccl = ctx.nccl.filter(|n| n.supports(kind));
        if ctx.nccl.is_some() && nccl.is_none() {
            row.nccl = Some(NcclMeasure::Unsupported);
        }
        // Device buffers (on the CUDA backend) of exactly this size: the
        // out-of-place pair (also NCCL's, except for broadcast) and the
        // in-place buffer (also NCCL's broadcast buffer).
        let gpu = ctx.gpu;
        let nccl_oop = nccl.is_some() && kind != CollKind::Broadcast;
        let mut d_send = dev_buf::<T>(gpu, show_oop || nccl_oop, in_len).map_err(fail)?;
        let mut d_recv = dev_buf::<T>(gpu, show_oop || nccl_oop, out_len).map_err(fail)?;
        let mut d_ip = dev_buf::<T>(gpu, show_ip || nccl.is_some(), ip_len).map_err(fail)?;

        // Out of place.
        if show_oop {
            case.fill_input(&mut send[..in_len]);
            upload(&mut d_send, &send[..in_len]).map_err(fail)?;
            let sb = pick(&d_send, &send[..in_len]);
            let rb = pick(&d_recv, &recv[..out_len]);
            let send_arg = (in_len > 0).then_some(sb);
            let recv_arg = (out_len > 0).then_some(rb);
            let mut call = || -> Result<(), String> {
                // SAFETY: sb/rb describe live, disjoint buffers (device
                // buffers, or slices of `send` and `recv`), which nothing
                // else touches during the call.
                unsafe { world.raw_collective(kind, send_arg, recv_arg, case.op, case.root, false) }
                    .map_err(|e| e.to_string())
            };
            let t = time_calls(world, args, extra, &mut call).map_err(fail)?;
            let wrong = if args.check {
                case.fill_input(&mut send[..in_len]);
                upload(&mut d_send, &send[..in_len]).map_err(fail)?;
                recv[..out_len].fill(Case::poison::<T>());
                upload(&mut d_recv, &recv[..out_len]).map_err(fail)?;
                call().map_err(fail)?;
                download(&d_recv, &mut recv[..out_len]).map_err(fail)?;
                let local = case.check_output(&recv[..out_len]);
                Some(sum_over_ranks(world, local).map_err(fail)?)
            } else {
                None
            };
            let (algbw, busbw) = report::bandwidths(kind, nranks, bytes, t.secs);
            row.out_of_place = Some(Measure {
                in_place: false,
                time_us: t.secs * 1e6,
                algbw,
                busbw,
                wrong,
                iters: t.iters,
            });
        }

        // In place (MPI_IN_PLACE layout; reduce/gather/scatter only at the root).
        if show_ip {
            case.fill_in_place(&mut recv[..ip_len]);
            upload(&mut d_ip, &recv[..ip_len]).map_err(fail)?;
            let b = pick(&d_ip, &recv[..ip_len]);
            let (send_arg, recv_arg, in_place) = if case.rank_in_place() {
                (None, Some(b), true)
            } else if kind == CollKind::Scatter {
                (None, Some(b), false)
            } else {
                (Some(b), None, false)
            };
            let mut call = || -> Result<(), String> {
                // SAFETY: `b` describes a live buffer (a device buffer or a
                // slice of `recv`), which nothing else touches during the call.
                unsafe {
                    world.raw_collective(kind, send_arg, recv_arg, case.op, case.root, in_place)
                }
                .map_err(|e| e.to_string())
            };
            let t = time_calls(world, args, extra, &mut call).map_err(fail)?;
            let wrong = if args.check {
                case.fill_in_place(&mut recv[..ip_len]);
                upload(&mut d_ip, &recv[..ip_len]).map_err(fail)?;
                call().map_err(fail)?;
                download(&d_ip, &mut recv[..ip_len]).map_err(fail)?;
                let local = case.check_in_place(&recv[..ip_len]);
                Some(sum_over_ranks(world, local).map_err(fail)?)
            } else {
                None
            };
            let (algbw, busbw) = report::bandwidths(kind, nranks, bytes, t.secs);
            row.in_place = Some(Measure {
                in_place: true,
                time_us: t.secs * 1e6,
                algbw,
                busbw,
                wrong,
                iters: t.iters,
            });
        }

        // MPI's own collective on the same data, out of place.
        if args.vs_mpi {
            case.fill_input(&mut send[..in_len]);
            let m = vsmpi::measure(world, args, &case, &send, &mut recv).map_err(fail)?;
            row.mpi = Some(m);
        }

        // NCCL on the same data: out of place, except broadcast (in place,
        // as gpucoll's broadcast is timed).
        if let Some(nccl) = nccl {
            let nop = nccl.op::<T>(case.op).map_err(fail)?;
            let ptr = |d: &Option<DevBuf<T>>| d.as_ref().map(|d| d.ptr());
            let bcast = kind == CollKind::Broadcast;
            let load = |send: &mut [T],
                        recv: &mut [T],
                        d_send: &mut Option<DevBuf<T>>,
                        d_recv: &mut Option<DevBuf<T>>,
                        d_ip: &mut Option<DevBuf<T>>|
             -> Result<(), String> {
                if bcast {
                    case.fill_in_place(&mut recv[..ip_len]);
                    upload(d_ip, &recv[..ip_len])
                } else {
                    case.fill_input(&mut send[..in_len]);
                    upload(d_send, &send[..in_len])?;
                    recv[..out_len].fill(Case::poison::<T>());
                    upload(d_recv, &recv[..out_len])
                }
            };
            load(&mut send, &mut recv, &mut d_send, &mut d_recv, &mut d_ip).map_err(fail)?;
            let (sp, rp) = if bcast {
                (ptr(&d_ip), ptr(&d_ip))
            } else {
                (ptr(&d_send), ptr(&d_recv))
            };
            let mut launch = || nccl.launch::<T>(&case, &nop, sp, rp);
            let mut blocking = || -> Result<(), String> {
                nccl.launch::<T>(&case, &nop, sp, rp)?;
                nccl.sync()
            };
            let t = time_calls(world, args, extra, &mut blocking).map_err(fail)?;
            let async_secs =
                time_async(world, t.iters, &mut launch, &|| nccl.sync()).map_err(fail)?;
            let wrong = if args.check {
                load(&mut send, &mut recv, &mut d_send, &mut d_recv, &mut d_ip).map_err(fail)?;
                blocking().map_err(fail)?;
                let local = if bcast {
                    download(&d_ip, &mut recv[..ip_len]).map_err(fail)?;
                    case.check_in_place(&recv[..ip_len])
                } else {
                    download(&d_recv, &mut recv[..out_len]).map_err(fail)?;
                    case.check_output(&recv[..out_len])
                };
                Some(sum_over_ranks(world, local).map_err(fail)?)
            } else {
                None
            };
            let (algbw, busbw) = report::bandwidths(kind, nranks, bytes, t.secs);
            row.nccl = Some(NcclMeasure::Time {
                time_us: t.secs * 1e6,
                algbw,
                busbw,
                async_time_us: async_secs * 1e6,
                iters: t.iters,
                wrong,
            });
        }

        ctx.print(&row.format(show_oop, show_ip, args.vs_mpi, ctx.nccl.is_some()));
        ctx.rows.push(row);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::budget_iters;

    #[test]
    fn budgeted_iteration_counts() {
        // 1 ms calls, 50 ms budget: 50 calls, capped by --iters.
        assert_eq!(budget_iters(0.05, 0.001, 5, 20), 20);
        assert_eq!(budget_iters(0.05, 0.001, 5, 100), 50);
        // 20 ms calls (1 GiB rows): never below --min-iters.
        assert_eq!(budget_iters(0.05, 0.02, 5, 20), 5);
        assert_eq!(budget_iters(0.05, 0.02, 30, 20), 20);
        // Unmeasurable or absurd estimates fall back to --iters.
        assert_eq!(budget_iters(0.05, 0.0, 5, 20), 20);
        assert_eq!(budget_iters(0.05, f64::INFINITY, 5, 20), 20);
        assert_eq!(budget_iters(0.05, f64::NAN, 5, 20), 20);
        assert_eq!(budget_iters(1e9, 1e-300, 5, 20), 20);
    }
}
