//! `--algos LIST`: the tuner's automatic choice against forced algorithms
//! in one job. Each entry gets a communicator of its own, the world's
//! duplicate with `GPUCOLL_ALGO` set to the entry (`auto`: unset) and the
//! entry's `+VAR=VALUE` settings (`auto+RESIDENT=0`). For every
//! size, each of `--algo-rounds` rounds times every entry's calls in turn,
//! so drift over the job (separate runs on simulated nodes differ by
//! 10-25 %) falls on every entry alike; an entry's time is the median of
//! its rounds. Blocking calls, out of place; each entry's result is checked
//! once per size against the exact expected values.

use crate::args::{Args, Mode};
use crate::bufs::{alloc, dev_buf, download, pick, upload};
use crate::data::{Case, Elem};
use crate::gpu::{DevBuf, Gpu};
use crate::report::{self, MpiMeasure};
use crate::run::row_sizes;
use crate::timing::{self, sum_over_ranks};
use crate::{vsmpi, Ctx, Fail};
use gpucoll::{CollKind, Communicator, Config, RawBuffer, ReduceOp};
use std::fmt::Write as _;

/// One entry of `--algos` and its communicator.
struct Entry {
    name: String,
    comm: Communicator,
}

/// One entry's figures at one size.
struct Cell {
    time_us: f64,
    busbw: f64,
    wrong: Option<u64>,
}

/// The comparison: header, one table per collective, datatype and op, and
/// the JSON file. Returns the exit code (1 if any result was wrong).
pub fn run(ctx: &mut Ctx<'_>) -> Result<i32, Fail> {
    let (world, args) = (ctx.world, ctx.args);
    let entries = communicators(world, args)?;
    ctx.print(&format!(
        "# gpucoll-bench --algos: ranks {}, nodes {}, backend {}, sizes {}..{}, {} rounds per \
         size, each round every entry in turn ({} warmup calls, then up to {} timed, max over \
         ranks); time = median of the rounds' means; blocking, out of place; a forced \
         algorithm that does not apply to a call leaves the tuner's choice{}",
        ctx.nranks,
        world.nnodes(),
        world.backend_name(),
        args.min_bytes,
        args.max_bytes,
        args.algo_rounds,
        args.warmup,
        args.iters,
        if args.vs_mpi {
            "; MPI = MPI's own collective on the same data in host memory"
        } else {
            ""
        }
    ));
    let mut json = Vec::new();
    let mut wrong = 0u64;
    for &kind in &args.colls {
        for &dtype in &args.dtypes {
            for op in args.ops_for(kind, dtype) {
                with_elem_type!(dtype, T => table::<T>(ctx, &entries, kind, op, &mut json, &mut wrong)?);
            }
        }
    }
    ctx.print(&format!("# wrong elements: {wrong}"));
    if let (Some(path), 0) = (&args.json, ctx.rank) {
        let text = format!("[\n{}\n]\n", json.join(",\n"));
        std::fs::write(path, text)
            .map_err(|e| Fail::Runtime(format!("writing {}: {e}", path.display())))?;
    }
    Ok(i32::from(wrong > 0))
}

/// A communicator per entry, created in list order on every rank.
fn communicators(world: &Communicator, args: &Args) -> Result<Vec<Entry>, Fail> {
    args.algos
        .iter()
        .map(|name| {
            let vars = crate::args::entry_vars(name).map_err(Fail::Usage)?;
            let config = Config::from_lookup(|var| {
                match vars.iter().find(|(k, _)| k == var) {
                    Some((_, v)) => Some(v.clone()),
                    // `auto` leaves GPUCOLL_ALGO unset whatever the job sets.
                    None if var == "GPUCOLL_ALGO" => None,
                    None => std::env::var(var).ok(),
                }
            })
            .map_err(|e| Fail::Usage(format!("--algos {name}: {e}")))?;
            let comm = world
                .duplicate_with(config)
                .map_err(|e| Fail::Runtime(format!("--algos {name}: communicator: {e}")))?;
            Ok(Entry {
                name: name.clone(),
                comm,
            })
        })
        .collect()
}

/// One size's buffers: host vectors of exactly its lengths, and their
/// device copies on the CUDA backend (`None` on the host backend, where the
/// host vectors are the collective's buffers).
struct Bufs<'a, T: Elem> {
    send: &'a mut [T],
    recv: &'a mut [T],
    d_send: &'a mut Option<DevBuf<T>>,
    d_recv: &'a mut Option<DevBuf<T>>,
}

impl<T: Elem> Bufs<'_, T> {
    /// The inputs (for broadcast: the root's data in the one buffer) and,
    /// before a checked call, a poisoned output, on the device too.
    fn prepare(&mut self, case: &Case, one_buffer: bool, poison: bool) -> Result<(), String> {
        if one_buffer {
            case.fill_in_place(self.recv);
        } else {
            case.fill_input(self.send);
            upload(self.d_send, self.send)?;
            if poison {
                self.recv.fill(Case::poison::<T>());
            }
        }
        upload(self.d_recv, self.recv)
    }

    /// The collective's send and receive buffers (none when empty).
    fn args(&self) -> (Option<RawBuffer>, Option<RawBuffer>) {
        (
            (!self.send.is_empty()).then(|| pick(self.d_send, self.send)),
            (!self.recv.is_empty()).then(|| pick(self.d_recv, self.recv)),
        )
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The index of the fastest forced entry (not `auto`), if any.
fn fastest_forced(names: &[&str], times: &[f64]) -> Option<usize> {
    (0..names.len())
        .filter(|&i| names[i] != "auto")
        .min_by(|&a, &b| times[a].total_cmp(&times[b]))
}

fn table<T: Elem>(
    ctx: &mut Ctx<'_>,
    entries: &[Entry],
    kind: CollKind,
    op: Option<ReduceOp>,
    json: &mut Vec<String>,
    wrong_total: &mut u64,
) -> Result<(), Fail> {
    let (world, args, rank, nranks) = (ctx.world, ctx.args, ctx.rank, ctx.nranks);
    let gpu: Option<&Gpu> = ctx.gpu;
    let elem = T::DATATYPE.size();
    let op_name = op.map_or("none".to_string(), |o| o.name().to_string());
    let case_for = |count: usize| Case::of_table(kind, op, count, (rank, nranks), args.root);
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    ctx.print("#");
    ctx.print(&format!(
        "# Algorithms: {} {} {}",
        kind.name(),
        T::DATATYPE.name(),
        op_name
    ));
    let mut head = format!("# {:>12} {:>12}", "size (B)", "count");
    for n in &names {
        head.push_str(&format!(" {:>12}", format!("{n} (us)")));
    }
    head.push_str(&format!(
        " {:>10} {:>12} {:>11}",
        "fastest", "auto/fastest", "busbw auto"
    ));
    if args.vs_mpi {
        head.push_str(&format!(" {:>11}", "MPI (us)"));
    }
    head.push_str(&format!(" {:>7}", "#wrong"));
    ctx.print(&head);

    let (max_count, _) = report::count_for(kind, args.max_bytes, elem, nranks);
    let big = case_for(max_count);
    let mut send: Vec<T> = alloc(big.input_len().max(1))?;
    let mut recv: Vec<T> = alloc(big.output_len().max(big.in_place_len()).max(1))?;
    // Broadcast has one buffer: timed in place, as the ordinary tables do.
    let one_buffer = kind == CollKind::Broadcast;
    for (count, bytes, extra) in row_sizes(args, Mode::Blocking, kind, elem, nranks) {
        let case = case_for(count);
        let fail = |e: String| {
            Fail::Runtime(format!(
                "rank {rank}: --algos {} {} {bytes} B: {e}",
                kind.name(),
                T::DATATYPE.name()
            ))
        };
        let (in_len, out_len) = if one_buffer {
            (0, case.in_place_len())
        } else {
            (case.input_len(), case.output_len())
        };
        let mut d_send = dev_buf::<T>(gpu, true, in_len).map_err(fail)?;
        let mut d_recv = dev_buf::<T>(gpu, true, out_len).map_err(fail)?;
        let mut bufs = Bufs {
            send: &mut send[..in_len],
            recv: &mut recv[..out_len],
            d_send: &mut d_send,
            d_recv: &mut d_recv,
        };
        bufs.prepare(&case, one_buffer, false).map_err(fail)?;
        let (send_arg, recv_arg) = bufs.args();

        let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); entries.len()];
        for round in 0..args.algo_rounds {
            for (i, e) in entries.iter().enumerate() {
                let comm = &e.comm;
                let mut call = || -> Result<(), String> {
                    // SAFETY: send/recv describe live, disjoint buffers of
                    // this case's lengths (device buffers, or slices of the
                    // host vectors) that nothing else touches during the call.
                    unsafe {
                        comm.raw_collective(
                            case.kind, send_arg, recv_arg, case.op, case.root, one_buffer,
                        )
                    }
                    .map_err(|err| format!("{}: {err}", e.name))
                };
                let warm = if round == 0 { extra } else { 0 };
                let t = timing::time_calls(comm, args, warm, &mut call).map_err(fail)?;
                rounds[i].push(t.secs);
            }
        }
        let mut cells = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let secs = median(std::mem::take(&mut rounds[i]));
            let wrong = if args.check {
                bufs.prepare(&case, one_buffer, true).map_err(fail)?;
                // SAFETY: as for the timed calls.
                unsafe {
                    e.comm.raw_collective(
                        case.kind, send_arg, recv_arg, case.op, case.root, one_buffer,
                    )
                }
                .map_err(|err| fail(format!("{}: {err}", e.name)))?;
                download(bufs.d_recv, bufs.recv).map_err(fail)?;
                let local = if one_buffer {
                    case.check_in_place(bufs.recv)
                } else {
                    case.check_output(bufs.recv)
                };
                Some(sum_over_ranks(&e.comm, local).map_err(fail)?)
            } else {
                None
            };
            let (_, busbw) = report::bandwidths(kind, nranks, bytes, secs);
            cells.push(Cell {
                time_us: secs * 1e6,
                busbw,
                wrong,
            });
        }
        let mpi = if args.vs_mpi {
            case.fill_input(&mut send[..case.input_len()]);
            Some(vsmpi::measure(world, args, &case, &send, &mut recv).map_err(fail)?)
        } else {
            None
        };

        let times: Vec<f64> = cells.iter().map(|c| c.time_us).collect();
        let best = fastest_forced(&names, &times);
        let auto = names.iter().position(|n| *n == "auto");
        let row_wrong: u64 = cells.iter().filter_map(|c| c.wrong).sum();
        *wrong_total += row_wrong;
        let mut line = format!("  {bytes:>12} {count:>12}");
        for c in &cells {
            line.push_str(&format!(" {:>12}", report::fmt_time(c.time_us)));
        }
        let ratio = match (auto, best) {
            (Some(a), Some(b)) => format!("{:.3}", times[a] / times[b]),
            _ => "-".into(),
        };
        line.push_str(&format!(
            " {:>10} {:>12} {:>11}",
            best.map_or("-", |b| names[b]),
            ratio,
            auto.map_or("-".to_string(), |a| format!("{:.2}", cells[a].busbw))
        ));
        if let Some(m) = &mpi {
            line.push_str(&format!(
                " {:>11}",
                match m {
                    MpiMeasure::Time(us) => report::fmt_time(*us),
                    MpiMeasure::Unsupported => "n/a".into(),
                }
            ));
        }
        line.push_str(&format!(
            " {:>7}",
            if args.check {
                row_wrong.to_string()
            } else {
                "N/A".into()
            }
        ));
        ctx.print(&line);
        for (name, c) in names.iter().zip(&cells) {
            let mut o = String::new();
            let _ = write!(
                o,
                "  {{\"collective\": \"{}\", \"datatype\": \"{}\", \"op\": \"{}\", \"bytes\": {}, \
                 \"count\": {}, \"algo\": \"{}\", \"time_us\": {:.3}, \"busbw\": {:.3}, \
                 \"rounds\": {}, \"wrong\": {}",
                kind.name(),
                T::DATATYPE.name(),
                op_name,
                bytes,
                count,
                name,
                c.time_us,
                c.busbw,
                args.algo_rounds,
                c.wrong.map_or("null".to_string(), |w| w.to_string())
            );
            if let Some(MpiMeasure::Time(us)) = &mpi {
                let _ = write!(o, ", \"mpi_time_us\": {us:.3}");
            }
            o.push('}');
            json.push(o);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_rounds() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![7.0]), 7.0);
    }

    #[test]
    fn auto_is_never_the_fastest_forced() {
        let names = ["auto", "ring", "tree"];
        assert_eq!(fastest_forced(&names, &[1.0, 3.0, 2.0]), Some(2));
        assert_eq!(fastest_forced(&names, &[5.0, 3.0, 4.0]), Some(1));
        assert_eq!(fastest_forced(&["auto"], &[1.0]), None);
    }
}
