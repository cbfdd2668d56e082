//! gpucoll-bench: nccl-tests-style timing of gpucoll's collectives.
//!
//! Run under MPI: `mpirun -n 4 gpucoll-bench -b 8 -e 64M -f 2 --coll all`.
//! `--help` lists the options; README.md describes the output.

mod args;
mod data;
mod report;
mod vsmpi;

use args::{Args, Placement};
use data::{Case, Elem};
use gpucoll::{bf16, f16, CollKind, Communicator, Datatype, MemoryKind, RawBuffer, ReduceOp};
use report::{Measure, Row};
use std::io::Write;

/// Whether this build has gpucoll's CUDA backend (and so NCCL to compare
/// with). It does not exist yet; `--vs-nccl` says so instead of faking it.
const HAVE_CUDA_BACKEND: bool = false;

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
    if args.vs_nccl && !HAVE_CUDA_BACKEND {
        if rank == 0 {
            eprintln!(
                "gpucoll-bench: --vs-nccl needs the CUDA backend, which this build does not have \
                 (backend: {})",
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

    let mut ctx = Ctx {
        world,
        args,
        rank,
        nranks,
        rows: Vec::new(),
    };
    let step = match args.step_bytes {
        Some(b) => format!("{b} bytes"),
        None => format!("{}(factor)", args.step_factor),
    };
    ctx.print(&format!(
        "# gpucoll-bench: ranks {}, nodes {}, backend {}, minBytes {}, maxBytes {}, step: {}, \
         warmup iters: {}, iters: {}, validation: {}, in-place: {}{}",
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
        if args.vs_mpi { ", vs-mpi" } else { "" }
    ));
    ctx.print(&format!(
        "# time: mean of {} calls after {} warmup calls, max over ranks; busbw factors as in \
         nccl-tests; size = largest buffer of a rank",
        args.iters, args.warmup
    ));

    for &kind in &args.colls {
        let show_oop = args.placement.out_of_place() && kind != CollKind::Broadcast;
        let show_ip = args.placement.in_place() || kind == CollKind::Broadcast;
        ctx.print("#");
        let mut title = format!("# Collective: {}", kind.name());
        if kind == CollKind::Broadcast && args.placement == Placement::OutOfPlace {
            title.push_str(" (one buffer: timed as in-place)");
        }
        ctx.print(&title);
        ctx.print(&report::header(show_oop, show_ip, args.vs_mpi));
        for &dtype in &args.dtypes {
            let ops: Vec<Option<ReduceOp>> = if kind.reduces() {
                args.ops.iter().copied().map(Some).collect()
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
    ctx.print("#");

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
            return Ok(1);
        }
    }
    Ok(if wrong == 0 { 0 } else { 1 })
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

/// Run `call` warmup times, then time `iters` calls; the mean per call in
/// seconds, max over ranks.
fn time_calls(
    world: &Communicator,
    args: &Args,
    call: &mut dyn FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..args.warmup {
        call()?;
    }
    gpucoll::reference::barrier(world).map_err(|e| format!("MPI barrier: {e}"))?;
    let t0 = gpucoll::mpi::wtime();
    for _ in 0..args.iters {
        call()?;
    }
    let dt = (gpucoll::mpi::wtime() - t0) / args.iters as f64;
    max_over_ranks(world, dt)
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
        };

        // Out of place.
        if show_oop {
            let s = &send[..case.input_len()];
            let r = &recv[..case.output_len()];
            let (sb, rb) = (host_buf(s), host_buf(r));
            let send_arg = (case.input_len() > 0).then_some(sb);
            let recv_arg = (case.output_len() > 0).then_some(rb);
            let mut call = || -> Result<(), String> {
                // SAFETY: sb/rb describe live, disjoint slices of `send` and
                // `recv`, which nothing else touches during the call.
                unsafe { world.raw_collective(kind, send_arg, recv_arg, case.op, case.root, false) }
                    .map_err(|e| e.to_string())
            };
            case.fill_input(&mut send[..case.input_len()]);
            let secs = time_calls(world, args, &mut call).map_err(fail)?;
            let wrong = if args.check {
                case.fill_input(&mut send[..case.input_len()]);
                recv[..case.output_len()].fill(Case::poison::<T>());
                call().map_err(fail)?;
                let local = case.check_output(&recv[..case.output_len()]);
                Some(sum_over_ranks(world, local).map_err(fail)?)
            } else {
                None
            };
            let (algbw, busbw) = report::bandwidths(kind, nranks, bytes, secs);
            row.out_of_place = Some(Measure {
                in_place: false,
                time_us: secs * 1e6,
                algbw,
                busbw,
                wrong,
            });
        }

        // In place (MPI_IN_PLACE layout; reduce/gather/scatter only at the root).
        if show_ip {
            let len = case.in_place_len();
            let b = host_buf(&recv[..len]);
            let (send_arg, recv_arg, in_place) = if case.rank_in_place() {
                (None, Some(b), true)
            } else if kind == CollKind::Scatter {
                (None, Some(b), false)
            } else {
                (Some(b), None, false)
            };
            let mut call = || -> Result<(), String> {
                // SAFETY: `b` describes a live slice of `recv`, which nothing
                // else touches during the call.
                unsafe {
                    world.raw_collective(kind, send_arg, recv_arg, case.op, case.root, in_place)
                }
                .map_err(|e| e.to_string())
            };
            case.fill_in_place(&mut recv[..len]);
            let secs = time_calls(world, args, &mut call).map_err(fail)?;
            let wrong = if args.check {
                case.fill_in_place(&mut recv[..len]);
                call().map_err(fail)?;
                let local = case.check_in_place(&recv[..len]);
                Some(sum_over_ranks(world, local).map_err(fail)?)
            } else {
                None
            };
            let (algbw, busbw) = report::bandwidths(kind, nranks, bytes, secs);
            row.in_place = Some(Measure {
                in_place: true,
                time_us: secs * 1e6,
                algbw,
                busbw,
                wrong,
            });
        }

        // MPI's own collective on the same data, out of place.
        if args.vs_mpi {
            case.fill_input(&mut send[..case.input_len()]);
            let m = vsmpi::measure(world, args, &case, &send, &mut recv).map_err(fail)?;
            row.mpi = Some(m);
        }

        ctx.print(&row.format(show_oop, show_ip, args.vs_mpi));
        ctx.rows.push(row);
    }
    Ok(())
}
