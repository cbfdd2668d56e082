//! Timed loops of every mode: blocking calls, calls queued on a stream with
//! one synchronize, and a captured CUDA graph replayed. The clock and the
//! agreement between ranks (barrier, max over ranks) come through [`Ranks`],
//! so the loops can be checked without MPI or a GPU.

use crate::args::{Args, Mode};
use gpucoll::{Communicator, ReduceOp};

/// What the loops need from the ranks: a barrier before timing, and the max
/// of a local figure over the ranks.
pub trait Ranks {
    fn barrier(&self) -> Result<(), String>;
    fn max(&self, x: f64) -> Result<f64, String>;
    /// Seconds from an arbitrary origin.
    fn now(&self) -> f64;
}

impl Ranks for Communicator {
    fn barrier(&self) -> Result<(), String> {
        gpucoll::reference::barrier(self).map_err(|e| format!("MPI barrier: {e}"))
    }
    fn max(&self, x: f64) -> Result<f64, String> {
        max_over_ranks(self, x)
    }
    fn now(&self) -> f64 {
        gpucoll::mpi::wtime()
    }
}

/// Max of `x` over the ranks (MPI's own allreduce, independent of gpucoll).
pub fn max_over_ranks(world: &Communicator, x: f64) -> Result<f64, String> {
    let mut out = [0f64];
    gpucoll::reference::all_reduce(world, &[x][..], &mut out[..], ReduceOp::Max)
        .map_err(|e| format!("MPI allreduce of the timings: {e}"))?;
    Ok(out[0])
}

/// Sum of `x` over the ranks (MPI's own allreduce).
pub fn sum_over_ranks(world: &Communicator, x: u64) -> Result<u64, String> {
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

/// Timed replays of a captured graph (after one untimed replay); each
/// replay runs the graph's n calls.
pub const GRAPH_REPLAYS: usize = 4;

/// Warmup calls to make: `--warmup` (at least one with `--time-budget`,
/// which estimates from them) plus `extra`.
fn warmups(args: &Args, extra: usize) -> usize {
    let w = if args.time_budget.is_some() {
        args.warmup.max(1)
    } else {
        args.warmup
    };
    w + extra
}

/// Timed calls for an estimated `per_call` seconds (max over ranks), each
/// timed call costing `calls_per_iter` calls.
fn iters_for(
    ranks: &dyn Ranks,
    args: &Args,
    per_call: f64,
    calls_per_iter: usize,
) -> Result<usize, String> {
    match args.time_budget {
        Some(budget) => {
            let per = ranks.max(per_call)?;
            let budget = budget / calls_per_iter.max(1) as f64;
            Ok(budget_iters(budget, per, args.min_iters, args.iters))
        }
        None => Ok(args.iters),
    }
}

/// Run `call` warmup (+ `extra_warmup`) times, then time the calls; the
/// mean per call in seconds, max over ranks. With `--time-budget` the
/// fastest warmup call (max over ranks) sets how many calls fit the budget
/// (at least one warmup call is then made).
pub fn time_calls(
    ranks: &dyn Ranks,
    args: &Args,
    extra_warmup: usize,
    call: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Timed, String> {
    let mut fastest = f64::INFINITY;
    for _ in 0..warmups(args, extra_warmup) {
        let t = ranks.now();
        call()?;
        fastest = fastest.min(ranks.now() - t);
    }
    let iters = iters_for(ranks, args, fastest, 1)?;
    ranks.barrier()?;
    let t0 = ranks.now();
    for _ in 0..iters {
        call()?;
    }
    let dt = (ranks.now() - t0) / iters as f64;
    Ok(Timed {
        secs: ranks.max(dt)?,
        iters,
    })
}

/// One side timed on a CUDA stream (gpucoll's raw entry points, or NCCL).
pub trait Queued {
    /// An instantiated graph of captured calls.
    type Graph;
    /// Queue one call on the stream (returns once queued).
    fn launch(&mut self) -> Result<(), String>;
    /// Wait for everything queued; report an asynchronous failure.
    fn sync(&mut self) -> Result<(), String>;
    fn begin_capture(&mut self) -> Result<(), String>;
    fn end_capture(&mut self) -> Result<Self::Graph, String>;
    /// Queue one replay of `graph` on the stream.
    fn replay(&mut self, graph: &Self::Graph) -> Result<(), String>;
}

/// Queue the warmup calls with one synchronize; the mean per call.
fn queued_warmup<Q: Queued>(
    ranks: &dyn Ranks,
    args: &Args,
    extra: usize,
    q: &mut Q,
) -> Result<f64, String> {
    let n = warmups(args, extra).max(1);
    let t = ranks.now();
    for _ in 0..n {
        q.launch()?;
    }
    q.sync()?;
    Ok((ranks.now() - t) / n as f64)
}

/// Async mode: n calls queued, one synchronize; time per call = total / n.
pub fn time_queued<Q: Queued>(
    ranks: &dyn Ranks,
    args: &Args,
    extra_warmup: usize,
    q: &mut Q,
) -> Result<Timed, String> {
    let per = queued_warmup(ranks, args, extra_warmup, q)?;
    let iters = iters_for(ranks, args, per, 1)?;
    ranks.barrier()?;
    let t0 = ranks.now();
    for _ in 0..iters {
        q.launch()?;
    }
    q.sync()?;
    let dt = (ranks.now() - t0) / iters as f64;
    Ok(Timed {
        secs: ranks.max(dt)?,
        iters,
    })
}

/// Capture `n` calls into a graph. A failed launch still ends the capture
/// (the stream leaves capture mode) before the error is returned.
pub fn capture<Q: Queued>(q: &mut Q, n: usize) -> Result<Q::Graph, String> {
    q.begin_capture()?;
    let mut launched = Ok(());
    for _ in 0..n {
        launched = q.launch();
        if launched.is_err() {
            break;
        }
    }
    let graph = q.end_capture();
    launched?;
    graph
}

/// Graph mode: warm up with queued calls (eager, so that lazy setup is not
/// captured), capture n calls once (at most `--graph-iters`: gpucoll keeps
/// what each captured call reads for the communicator's life), replay once
/// untimed, then time [`GRAPH_REPLAYS`] replays with one synchronize; time
/// per call = total / (replays × n). `Timed::iters` is n (calls per graph).
pub fn time_graph<Q: Queued>(
    ranks: &dyn Ranks,
    args: &Args,
    extra_warmup: usize,
    q: &mut Q,
) -> Result<Timed, String> {
    let per = queued_warmup(ranks, args, extra_warmup, q)?;
    let n = iters_for(ranks, args, per, GRAPH_REPLAYS)?.min(args.graph_iters);
    let graph = capture(q, n)?;
    q.replay(&graph)?;
    q.sync()?;
    ranks.barrier()?;
    let t0 = ranks.now();
    for _ in 0..GRAPH_REPLAYS {
        q.replay(&graph)?;
    }
    q.sync()?;
    let dt = (ranks.now() - t0) / (GRAPH_REPLAYS * n) as f64;
    Ok(Timed {
        secs: ranks.max(dt)?,
        iters: n,
    })
}

/// Time `q` in `mode` (blocking: each call followed by a synchronize).
pub fn time_mode<Q: Queued>(
    ranks: &dyn Ranks,
    args: &Args,
    mode: Mode,
    extra_warmup: usize,
    q: &mut Q,
) -> Result<Timed, String> {
    match mode {
        Mode::Blocking => time_calls(ranks, args, extra_warmup, &mut || {
            q.launch()?;
            q.sync()
        }),
        Mode::Async => time_queued(ranks, args, extra_warmup, q),
        Mode::Graph => time_graph(ranks, args, extra_warmup, q),
    }
}

/// One untimed call in `mode` whose result is then checked: launched and
/// synchronized, or (graph) captured alone into a graph that is replayed.
pub fn call_checked<Q: Queued>(mode: Mode, q: &mut Q) -> Result<(), String> {
    match mode {
        Mode::Blocking | Mode::Async => q.launch()?,
        Mode::Graph => {
            let g = capture(q, 1)?;
            q.replay(&g)?;
            // The graph may be dropped only after its replay completed.
            let done = q.sync();
            drop(g);
            return done;
        }
    }
    q.sync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

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

    /// One process, a clock that advances 1 µs per launch and 10 µs per
    /// synchronize, so that the loops' arithmetic is exact.
    struct Fake {
        clock: Cell<f64>,
        barriers: Cell<usize>,
    }

    impl Ranks for Fake {
        fn barrier(&self) -> Result<(), String> {
            self.barriers.set(self.barriers.get() + 1);
            Ok(())
        }
        fn max(&self, x: f64) -> Result<f64, String> {
            Ok(x)
        }
        fn now(&self) -> f64 {
            self.clock.get()
        }
    }

    /// Records what was done; `fail_at` makes that launch fail.
    struct Log<'a> {
        clock: &'a Cell<f64>,
        events: Vec<String>,
        capturing: bool,
        launches: usize,
        fail_at: Option<usize>,
    }

    impl Queued for Log<'_> {
        type Graph = usize;
        fn launch(&mut self) -> Result<(), String> {
            self.launches += 1;
            if Some(self.launches) == self.fail_at {
                return Err("launch failed".into());
            }
            self.events
                .push(if self.capturing { "cap" } else { "launch" }.into());
            self.clock.set(self.clock.get() + 1e-6);
            Ok(())
        }
        fn sync(&mut self) -> Result<(), String> {
            self.events.push("sync".into());
            self.clock.set(self.clock.get() + 10e-6);
            Ok(())
        }
        fn begin_capture(&mut self) -> Result<(), String> {
            self.capturing = true;
            self.events.push("begin".into());
            Ok(())
        }
        fn end_capture(&mut self) -> Result<usize, String> {
            self.capturing = false;
            let n = self.events.iter().filter(|e| *e == "cap").count();
            self.events.push("end".into());
            Ok(n)
        }
        fn replay(&mut self, g: &usize) -> Result<(), String> {
            self.events.push(format!("replay{g}"));
            self.clock.set(self.clock.get() + *g as f64 * 1e-6);
            Ok(())
        }
    }

    fn setup(argv: &str) -> (Args, Fake) {
        let args = crate::args::parse_args(argv.split_whitespace()).unwrap();
        let fake = Fake {
            clock: Cell::new(0.0),
            barriers: Cell::new(0),
        };
        (args, fake)
    }

    fn log(clock: &Cell<f64>, fail_at: Option<usize>) -> Log<'_> {
        Log {
            clock,
            events: Vec::new(),
            capturing: false,
            launches: 0,
            fail_at,
        }
    }

    fn count(events: &[String], what: &str) -> usize {
        events.iter().filter(|e| *e == what).count()
    }

    #[test]
    fn blocking_mode_synchronizes_every_call() {
        let (args, fake) = setup("-n 8 -w 2");
        let mut q = log(&fake.clock, None);
        let t = time_mode(&fake, &args, Mode::Blocking, 1, &mut q).unwrap();
        assert_eq!(t.iters, 8);
        assert_eq!(count(&q.events, "launch"), 11);
        assert_eq!(count(&q.events, "sync"), 11);
        assert!((t.secs - 11e-6).abs() < 1e-12, "{}", t.secs);
        assert_eq!(fake.barriers.get(), 1);
    }

    #[test]
    fn async_mode_synchronizes_once_per_loop() {
        let (args, fake) = setup("-n 10 -w 3");
        let mut q = log(&fake.clock, None);
        let t = time_mode(&fake, &args, Mode::Async, 0, &mut q).unwrap();
        assert_eq!(t.iters, 10);
        // Warmup loop and timed loop: one synchronize each.
        assert_eq!(count(&q.events, "launch"), 13);
        assert_eq!(count(&q.events, "sync"), 2);
        assert_eq!(q.events.last().map(String::as_str), Some("sync"));
        // (10 × 1 µs + 10 µs) / 10.
        assert!((t.secs - 2e-6).abs() < 1e-12, "{}", t.secs);
    }

    #[test]
    fn graph_mode_captures_once_and_replays() {
        let (args, fake) = setup("-n 6 -w 2");
        let mut q = log(&fake.clock, None);
        let t = time_mode(&fake, &args, Mode::Graph, 0, &mut q).unwrap();
        assert_eq!(t.iters, 6);
        assert_eq!(count(&q.events, "begin"), 1);
        assert_eq!(count(&q.events, "cap"), 6);
        assert_eq!(count(&q.events, "replay6"), GRAPH_REPLAYS + 1);
        // Eager warmup before the capture.
        let begin = q.events.iter().position(|e| e == "begin").unwrap();
        assert_eq!(count(&q.events[..begin], "launch"), 2);
        // (4 replays × 6 µs + 10 µs sync) / 24 calls.
        let want = (GRAPH_REPLAYS as f64 * 6e-6 + 10e-6) / (GRAPH_REPLAYS * 6) as f64;
        assert!((t.secs - want).abs() < 1e-12, "{} vs {want}", t.secs);
    }

    #[test]
    fn graph_calls_are_capped() {
        let (args, fake) = setup("-n 50 --graph-iters 7");
        let mut q = log(&fake.clock, None);
        let t = time_mode(&fake, &args, Mode::Graph, 0, &mut q).unwrap();
        assert_eq!((t.iters, count(&q.events, "cap")), (7, 7));
    }

    #[test]
    fn graph_budget_counts_every_replay() {
        // 11 µs per warmup call (1 launch + a 10 µs sync over one call);
        // 0.0001 s budget over 4 replays: 25 µs per graph -> 2 calls.
        let (args, fake) = setup("-n 50 -w 1 --time-budget 0.0001 --min-iters 1");
        let mut q = log(&fake.clock, None);
        let t = time_mode(&fake, &args, Mode::Graph, 0, &mut q).unwrap();
        assert_eq!(t.iters, 2);
        assert_eq!(count(&q.events, "cap"), 2);
    }

    #[test]
    fn checked_call_of_each_mode() {
        let (_, fake) = setup("");
        for (mode, want) in [
            (Mode::Blocking, vec!["launch", "sync"]),
            (Mode::Async, vec!["launch", "sync"]),
            (Mode::Graph, vec!["begin", "cap", "end", "replay1", "sync"]),
        ] {
            let mut q = log(&fake.clock, None);
            call_checked(mode, &mut q).unwrap();
            assert_eq!(q.events, want, "{mode:?}");
        }
    }

    #[test]
    fn failed_launch_in_capture_ends_the_capture() {
        let (_, fake) = setup("");
        let mut q = log(&fake.clock, Some(3));
        let err = capture(&mut q, 5).unwrap_err();
        assert_eq!(err, "launch failed");
        assert!(!q.capturing);
        assert_eq!(q.events.last().map(String::as_str), Some("end"));
    }
}
