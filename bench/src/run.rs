//! One table's rows: every size of one (collective, datatype, op) in one
//! mode, gpucoll out of place and in place, then MPI and NCCL on the same
//! data.

use crate::args::{self, Args, Mode};
use crate::bufs::{alloc, dev_buf, download, pick, ptr, queued, upload};
use crate::data::{Case, Elem};
use crate::overlap::{self, GcCall, NcclCall};
use crate::register::{self, Slot};
use crate::report::{self, Measure, Row};
use crate::timing::{self, sum_over_ranks, Timed, FIRST_SIZE_EXTRA_WARMUP};
use crate::{vsmpi, vsnccl, Ctx, Fail};
use gpucoll::{CollKind, RawBuffer, ReduceOp};

/// Time gpucoll on `send`/`recv` in `mode`: blocking through
/// `raw_collective` (host or device buffers), the stream modes through the
/// raw entry points on the context's stream.
#[allow(clippy::too_many_arguments)]
fn time_gpucoll<T: Elem>(
    ctx: &Ctx<'_>,
    mode: Mode,
    extra: usize,
    case: &Case,
    send: Option<RawBuffer>,
    recv: Option<RawBuffer>,
    in_place: bool,
) -> Result<Timed, String> {
    let (world, args) = (ctx.world, ctx.args);
    if mode == Mode::Blocking {
        let mut call = || -> Result<(), String> {
            // SAFETY: send/recv describe live, disjoint buffers (device
            // buffers, or slices of the host vectors), which nothing else
            // touches during the call.
            unsafe { world.raw_collective(case.kind, send, recv, case.op, case.root, in_place) }
                .map_err(|e| e.to_string())
        };
        return timing::time_calls(world, args, extra, &mut call);
    }
    let stream = ctx
        .stream
        .ok_or("the async and graph modes need the CUDA backend")?;
    let mut q = queued::<T>(ctx, stream, case, send, recv, in_place);
    timing::time_mode(world, args, mode, extra, &mut q)
}

/// One more call in `mode` for the correctness check (not timed).
fn call_once<T: Elem>(
    ctx: &Ctx<'_>,
    mode: Mode,
    case: &Case,
    send: Option<RawBuffer>,
    recv: Option<RawBuffer>,
    in_place: bool,
) -> Result<(), String> {
    let world = ctx.world;
    match (mode, ctx.stream) {
        (Mode::Blocking, _) | (_, None) => {
            // SAFETY: as in `time_gpucoll`.
            unsafe { world.raw_collective(case.kind, send, recv, case.op, case.root, in_place) }
                .map_err(|e| e.to_string())
        }
        (_, Some(stream)) => {
            let mut q = queued::<T>(ctx, stream, case, send, recv, in_place);
            timing::call_checked(mode, &mut q)
        }
    }
}

/// The rows of a table in `mode`: `(count, bytes, extra warmup calls)` for
/// every size that holds an element and differs from the one before (sizes
/// round down to whole elements per rank); the first row gets the extra
/// warmup of a table's first size.
pub fn row_sizes(
    args: &Args,
    mode: Mode,
    kind: CollKind,
    elem: usize,
    nranks: usize,
) -> Vec<(usize, u64, usize)> {
    let mut rows: Vec<(usize, u64, usize)> = Vec::new();
    for size in args::sizes(args, mode) {
        let (count, bytes) = report::count_for(kind, size, elem, nranks);
        if count == 0 || rows.last().is_some_and(|r| r.1 == bytes) {
            continue;
        }
        let extra = if rows.is_empty() {
            FIRST_SIZE_EXTRA_WARMUP
        } else {
            0
        };
        rows.push((count, bytes, extra));
    }
    rows
}

pub fn run_type<T: Elem>(
    ctx: &mut Ctx<'_>,
    mode: Mode,
    kind: CollKind,
    op: Option<ReduceOp>,
    show_oop: bool,
    show_ip: bool,
) -> Result<(), Fail> {
    let (world, args, rank, nranks) = (ctx.world, ctx.args, ctx.rank, ctx.nranks);
    let elem = T::DATATYPE.size();
    let case_for = |count: usize| Case::of_table(kind, op, count, (rank, nranks), args.root);
    let (max_count, _) = report::count_for(kind, args.max_bytes_of(mode), elem, nranks);
    let big = case_for(max_count);
    let mut send: Vec<T> = alloc(big.input_len().max(1))?;
    let mut recv: Vec<T> = alloc(big.output_len().max(big.in_place_len()).max(1))?;
    let op_name = op.map_or("none".to_string(), |o| match o {
        ReduceOp::PreMulSum(s) if s != 2.0 => format!("premul:{s}"),
        o => o.name().to_string(),
    });

    let first_row = ctx.rows.len();
    for (count, bytes, extra) in row_sizes(args, mode, kind, elem, nranks) {
        let case = case_for(count);
        let what = || {
            format!(
                "rank {rank}: {} {} {} {} B, mode {}",
                kind.name(),
                T::DATATYPE.name(),
                op_name,
                bytes,
                mode.name()
            )
        };
        let fail = |e: String| Fail::Runtime(format!("{}: {e}", what()));

        let mut row = Row {
            mode,
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
            registered: None,
        };

        let (in_len, out_len, ip_len) = (case.input_len(), case.output_len(), case.in_place_len());
        // NCCL has no bitwise or logical reductions.
        let nccl = ctx
            .nccl
            .filter(|n| n.supports(kind) && !(kind.reduces() && case.op.integer_only()));
        if ctx.nccl.is_some() && nccl.is_none() {
            row.nccl = Some(report::NcclMeasure::Unsupported);
        }
        // Device buffers (on the CUDA backend) of exactly this size: the
        // out-of-place pair (also NCCL's, except for broadcast) and the
        // in-place buffer (also NCCL's broadcast buffer).
        let gpu = ctx.gpu;
        let nccl_oop = nccl.is_some() && kind != CollKind::Broadcast;
        let mut d_send = dev_buf::<T>(gpu, show_oop || nccl_oop, in_len).map_err(fail)?;
        let mut d_recv = dev_buf::<T>(gpu, show_oop || nccl_oop, out_len).map_err(fail)?;
        let mut d_ip = dev_buf::<T>(gpu, show_ip || nccl.is_some(), ip_len).map_err(fail)?;
        // gpucoll's calls of the row's reference placement, for --overlap.
        let mut gc_call = None;
        // --register: the buffers gpucoll is given for this size (not the
        // out-of-place pair that only NCCL uses under --inplace 1),
        // registered once before the warmup calls and held until the row
        // is done. The slots depend on the placements only, so every rank
        // registers the same ones (register.rs).
        let held = if args.register {
            let mut slots = Vec::new();
            if show_oop {
                slots.push(Slot {
                    in_place: false,
                    buf: d_send.as_ref().map(|d| d.raw()),
                });
                slots.push(Slot {
                    in_place: false,
                    buf: d_recv.as_ref().map(|d| d.raw()),
                });
            }
            if show_ip {
                slots.push(Slot {
                    in_place: true,
                    buf: d_ip.as_ref().map(|d| d.raw()),
                });
            }
            let h = register::register_all(world, &slots)
                .map_err(|e| fail(format!("--register: {e}")))?;
            row.registered = Some(h.info);
            Some(h)
        } else {
            None
        };

        // Out of place.
        if show_oop {
            case.fill_input(&mut send[..in_len]);
            upload(&mut d_send, &send[..in_len]).map_err(fail)?;
            let sb = pick(&d_send, &send[..in_len]);
            let rb = pick(&d_recv, &recv[..out_len]);
            let send_arg = (in_len > 0).then_some(sb);
            let recv_arg = (out_len > 0).then_some(rb);
            let t = time_gpucoll::<T>(ctx, mode, extra, &case, send_arg, recv_arg, false)
                .map_err(fail)?;
            gc_call = Some(GcCall {
                send: send_arg,
                recv: recv_arg,
                in_place: false,
            });
            let wrong = if args.check {
                case.fill_input(&mut send[..in_len]);
                upload(&mut d_send, &send[..in_len]).map_err(fail)?;
                recv[..out_len].fill(Case::poison::<T>());
                upload(&mut d_recv, &recv[..out_len]).map_err(fail)?;
                call_once::<T>(ctx, mode, &case, send_arg, recv_arg, false).map_err(fail)?;
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
            let t = time_gpucoll::<T>(ctx, mode, extra, &case, send_arg, recv_arg, in_place)
                .map_err(fail)?;
            gc_call.get_or_insert(GcCall {
                send: send_arg,
                recv: recv_arg,
                in_place,
            });
            let wrong = if args.check {
                case.fill_in_place(&mut recv[..ip_len]);
                upload(&mut d_ip, &recv[..ip_len]).map_err(fail)?;
                call_once::<T>(ctx, mode, &case, send_arg, recv_arg, in_place).map_err(fail)?;
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

        // MPI's own collective on the same data, out of place (blocking).
        if args.vs_mpi && mode == Mode::Blocking {
            case.fill_input(&mut send[..in_len]);
            let m = vsmpi::measure(world, args, &case, &send, &mut recv).map_err(fail)?;
            row.mpi = Some(m);
        }

        // NCCL on the same data in the same mode.
        if let Some(nccl) = nccl {
            let mut bufs = vsnccl::Bufs {
                send: &mut send,
                recv: &mut recv,
                d_send: &mut d_send,
                d_recv: &mut d_recv,
                d_ip: &mut d_ip,
            };
            let m = vsnccl::measure::<T>(ctx, nccl, mode, extra, &case, bytes, &mut bufs)
                .map_err(fail)?;
            row.nccl = Some(m);
        }

        // The same calls again while a compute job runs (--overlap).
        if let (Some(job), Some(gc)) = (ctx.job, gc_call) {
            let nccl = nccl.map(|n| {
                let one = if kind == CollKind::Broadcast {
                    (ptr(&d_ip), ptr(&d_ip))
                } else {
                    (ptr(&d_send), ptr(&d_recv))
                };
                NcclCall {
                    nccl: n,
                    send: one.0,
                    recv: one.1,
                }
            });
            let rec =
                overlap::measure_row::<T>(ctx, job, mode, &case, &row, gc, nccl).map_err(fail)?;
            ctx.overlaps.push(rec);
        }

        let mut line = row.format(
            show_oop,
            show_ip,
            args.vs_mpi && mode == Mode::Blocking,
            ctx.nccl.is_some(),
        );
        if let Some(f) = ctx.floor_us {
            line.push_str(&report::floor_cell(&row, f));
        }
        ctx.print(&line);
        ctx.rows.push(row);
        // Every call on these buffers has completed (each mode ends with a
        // synchronize); end the registrations before the buffers go.
        if let Some(h) = held {
            h.release();
        }
    }
    let title = format!(
        "Overlap: {} {} {}, mode {}",
        kind.name(),
        T::DATATYPE.name(),
        op_name,
        mode.name()
    );
    overlap::print_table(ctx, first_row, &title);
    Ok(())
}
