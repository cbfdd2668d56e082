//! `--overlap`: each size's collective runs while a compute job (compute.rs)
//! runs on a stream of its own, for gpucoll and, with `--vs-nccl`, for NCCL.
//! Per size: the job alone (CUDA events), then for each library the job
//! started and at once a loop of the collective's calls in the row's mode
//! until the job has ended on every rank; the job's time under overlap
//! against alone is its slowdown, and the calls that ended while the job
//! still ran give the collective's time under overlap (its time alone is
//! the row's own figure). Every rank makes the same calls: the loop goes on
//! in rounds of a fixed count, and after each round the ranks agree (MPI)
//! whether any job still runs.

use crate::args::Mode;
use crate::bufs::queued;
use crate::compute::{Compute, ComputeJob, THREADS, WAVES};
use crate::data::{Case, Elem};
use crate::nccl::{Nccl, NcclOp};
use crate::report::{fmt_time, json_num, NcclMeasure, Row};
use crate::timing::{Queued, Ranks};
use crate::Ctx;
use gpucoll::{Communicator, RawBuffer};

/// One library's collective, issued as the row's mode issues it.
pub trait Issue {
    /// One call: blocking modes return when it is done, queued ones once
    /// it is queued.
    fn call(&mut self) -> Result<(), String>;
    /// Wait for every call issued (nothing to do when each call waits).
    fn finish(&mut self) -> Result<(), String>;
    /// Whether `call` returns only once the call is done.
    fn each_waits(&self) -> bool;
}

/// Loops per launch of the first calibration launch.
const CALIBRATION_ITERS: u32 = 256;
/// Launches timed per calibration step.
const CALIBRATION_LAUNCHES: usize = 4;
/// The time of one launch that calibration aims at, in seconds: short
/// enough that a collective's kernel waits little for SMs to free up,
/// long enough that 16 launches (the default job) run for milliseconds.
pub const LAUNCH_TARGET_S: f64 = 200e-6;
/// Jobs timed alone per size (their mean is the baseline).
const ALONE_JOBS: usize = 2;
/// Rounds of calls planned per job from the times alone: the ranks agree
/// between rounds (an MPI allreduce, when no collective runs), so few.
const ROUNDS_PER_JOB: f64 = 4.0;
const MAX_ROUND_CALLS: usize = 100_000;

/// The job every size uses: the kernel, its launches and loop count.
pub struct Job<'a> {
    pub compute: &'a ComputeJob,
    pub launches: usize,
    pub iters: u32,
    /// One launch alone at the start, in seconds (max over ranks).
    pub launch_s: f64,
}

/// One library's figures for one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Side {
    /// The job's time while the collective ran (µs, max over ranks).
    pub job_us: f64,
    /// The collective's mean per call alone (the row's figure) and under
    /// overlap (µs, max over ranks).
    pub coll_alone_us: f64,
    pub coll_us: f64,
    /// Calls made, and those of them that ended while the job still ran
    /// (min over ranks): `coll_us` is their mean, or with none the mean of
    /// every call.
    pub calls: usize,
    pub timed_calls: usize,
}

/// The overlap figures of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Index of the row in `Ctx::rows`.
    pub row: usize,
    pub bytes: u64,
    /// Whether gpucoll's calls are the in-place ones (the row's reference).
    pub in_place: bool,
    /// The job alone (µs, mean of a few jobs, max over ranks).
    pub job_alone_us: f64,
    pub gc: Side,
    /// `None`: no NCCL in this run, or NCCL lacks this collective or op.
    pub nccl: Option<Side>,
    /// The job's shape, for the JSON records.
    pub launches: usize,
    pub blocks: u32,
    pub iters: u32,
}

/// (job - alone) / alone in percent; `None` without a baseline.
pub fn slowdown_pct(alone_us: f64, with_us: f64) -> Option<f64> {
    (alone_us > 0.0 && alone_us.is_finite() && with_us.is_finite())
        .then(|| (with_us / alone_us - 1.0) * 100.0)
}

/// `iters` scaled so that a launch that took `secs` takes `target`.
pub fn scale_iters(iters: u32, secs: f64, target: f64) -> u32 {
    if !(secs > 0.0 && secs.is_finite() && target > 0.0) {
        return iters;
    }
    let n = (iters as f64 * target / secs).round();
    n.clamp(1.0, crate::args::MAX_OVERLAP_ITERS as f64) as u32
}

/// Calls per round: a [`ROUNDS_PER_JOB`]th of the job at the time alone.
pub fn round_calls(job_s: f64, call_s: f64) -> usize {
    let per_round = job_s / ROUNDS_PER_JOB;
    if !(call_s > 0.0 && call_s.is_finite() && per_round > 0.0 && per_round.is_finite()) {
        return 1;
    }
    ((per_round / call_s).floor() as usize).clamp(1, MAX_ROUND_CALLS)
}

/// The mean time of `jobs` jobs alone, in seconds (max over ranks).
pub fn time_alone(
    ranks: &dyn Ranks,
    c: &dyn Compute,
    launches: usize,
    iters: u32,
    jobs: usize,
) -> Result<f64, String> {
    let mut sum = 0.0;
    for _ in 0..jobs.max(1) {
        c.start(launches, iters)?;
        sum += c.finish()?;
    }
    ranks.max(sum / jobs.max(1) as f64)
}

/// The loop count per launch: `fixed`, or scaled in two steps from a
/// short launch until one launch takes about `target` seconds (the same
/// on every rank: each step scales by the slowest rank). Returns it and
/// one launch's time alone with it.
pub fn calibrate(
    ranks: &dyn Ranks,
    c: &dyn Compute,
    fixed: Option<u32>,
    target: f64,
) -> Result<(u32, f64), String> {
    // The first launch pays the module's first use and the clock ramp.
    c.start(1, fixed.unwrap_or(CALIBRATION_ITERS))?;
    c.finish()?;
    let mut iters = fixed.unwrap_or(CALIBRATION_ITERS);
    if fixed.is_none() {
        for _ in 0..2 {
            let per = time_alone(ranks, c, CALIBRATION_LAUNCHES, iters, 1)?;
            iters = scale_iters(iters, per / CALIBRATION_LAUNCHES as f64, target);
        }
    }
    let per = time_alone(ranks, c, CALIBRATION_LAUNCHES, iters, 1)?;
    Ok((iters, per / CALIBRATION_LAUNCHES as f64))
}

/// Start the job, then call the collective in rounds of `round` calls until
/// the job has ended on every rank. `limit_s`: give up (on every rank)
/// when the loop runs longer.
#[allow(clippy::too_many_arguments)]
pub fn overlapped(
    ranks: &dyn Ranks,
    c: &dyn Compute,
    side: &mut dyn Issue,
    launches: usize,
    iters: u32,
    round: usize,
    limit_s: f64,
    coll_alone_us: f64,
) -> Result<Side, String> {
    ranks.barrier()?;
    c.start(launches, iters)?;
    let t0 = ranks.now();
    // Only the calls' own time counts (not the checks or the agreement
    // between rounds), as when the row timed them alone.
    let (mut calls, mut busy) = (0usize, 0.0f64);
    let mut timed = (0usize, 0.0f64);
    loop {
        for _ in 0..round {
            let t = ranks.now();
            side.call()?;
            busy += ranks.now() - t;
            calls += 1;
            if side.each_waits() && c.running()? {
                timed = (calls, busy);
            }
        }
        let t = ranks.now();
        side.finish()?;
        busy += ranks.now() - t;
        let running = c.running()?;
        if running {
            timed = (calls, busy);
        }
        // 0: this rank's job is over; 1: it runs; 2: out of time.
        let state = if ranks.now() - t0 > limit_s {
            2.0
        } else if running {
            1.0
        } else {
            0.0
        };
        match ranks.max(state)? {
            s if s > 1.5 => {
                return Err(format!(
                    "the overlap compute job still ran after {limit_s:.1} s of collective calls"
                ))
            }
            s if s > 0.5 => continue,
            _ => break,
        }
    }
    let job_s = c.finish()?;
    let fewest_timed = -ranks.max(-(timed.0 as f64))?;
    let coll_s = match timed {
        (n, s) if n > 0 => s / n as f64,
        _ => busy / calls.max(1) as f64,
    };
    Ok(Side {
        job_us: ranks.max(job_s)? * 1e6,
        coll_alone_us,
        coll_us: ranks.max(coll_s)? * 1e6,
        calls,
        timed_calls: fewest_timed as usize,
    })
}

/// gpucoll's blocking calls (`raw_collective`, on gpucoll's own stream).
struct GcBlocking<'a> {
    world: &'a Communicator,
    case: &'a Case,
    send: Option<RawBuffer>,
    recv: Option<RawBuffer>,
    in_place: bool,
}

impl Issue for GcBlocking<'_> {
    fn call(&mut self) -> Result<(), String> {
        let c = self.case;
        // SAFETY: the row's buffers of this case (run.rs timed the same
        // call on them), alive and untouched by the host during the call.
        unsafe {
            self.world
                .raw_collective(c.kind, self.send, self.recv, c.op, c.root, self.in_place)
        }
        .map_err(|e| e.to_string())
    }
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn each_waits(&self) -> bool {
        true
    }
}

/// Calls queued on a stream: the async mode (one synchronize per round).
struct OnStream<Q: Queued>(Q);

impl<Q: Queued> Issue for OnStream<Q> {
    fn call(&mut self) -> Result<(), String> {
        self.0.launch()
    }
    fn finish(&mut self) -> Result<(), String> {
        self.0.sync()
    }
    fn each_waits(&self) -> bool {
        false
    }
}

/// NCCL's calls on its stream, on ordinary buffers; blocking mode
/// synchronizes after each call, as vsnccl.rs times it.
struct NcclIssue<'a, 'o, T: Elem> {
    nccl: &'a Nccl,
    op: &'a NcclOp<'o>,
    case: &'a Case,
    send: Option<u64>,
    recv: Option<u64>,
    blocking: bool,
    _t: std::marker::PhantomData<T>,
}

impl<T: Elem> Issue for NcclIssue<'_, '_, T> {
    fn call(&mut self) -> Result<(), String> {
        self.nccl
            .launch::<T>(self.case, self.op, self.send, self.recv)?;
        if self.blocking {
            self.nccl.sync()?;
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), String> {
        self.nccl.sync()
    }
    fn each_waits(&self) -> bool {
        self.blocking
    }
}

/// gpucoll's calls of the row's reference placement.
pub struct GcCall {
    pub send: Option<RawBuffer>,
    pub recv: Option<RawBuffer>,
    pub in_place: bool,
}

/// NCCL's ordinary buffers for the row (broadcast: one buffer as both).
pub struct NcclCall<'a> {
    pub nccl: &'a Nccl,
    pub send: Option<u64>,
    pub recv: Option<u64>,
}

/// The overlap figures of `row` (already timed alone, gpucoll and NCCL).
pub fn measure_row<T: Elem>(
    ctx: &Ctx<'_>,
    job: &Job<'_>,
    mode: Mode,
    case: &Case,
    row: &Row,
    gc: GcCall,
    nccl: Option<NcclCall<'_>>,
) -> Result<Record, String> {
    let world = ctx.world;
    let c: &dyn Compute = job.compute;
    let (launches, iters) = (job.launches, job.iters);
    let alone = time_alone(world, c, launches, iters, ALONE_JOBS)?;
    // Generous: a slowed job, and a last call that started just before
    // the job ended; only a job that never ends reaches it.
    let limit = (50.0 * alone).max(2.0);
    let gc_alone = row
        .reference()
        .map(|m| m.time_us)
        .ok_or("the overlap mode needs the row's gpucoll time")?;
    let round = round_calls(alone, gc_alone * 1e-6);
    let gc_side = if mode == Mode::Blocking {
        let mut issue = GcBlocking {
            world,
            case,
            send: gc.send,
            recv: gc.recv,
            in_place: gc.in_place,
        };
        overlapped(
            world, c, &mut issue, launches, iters, round, limit, gc_alone,
        )?
    } else {
        let stream = ctx
            .stream
            .ok_or("the async mode needs the CUDA backend's stream")?;
        let q = queued::<T>(ctx, stream, case, gc.send, gc.recv, gc.in_place);
        let mut issue = OnStream(q);
        overlapped(
            world, c, &mut issue, launches, iters, round, limit, gc_alone,
        )?
    };
    let nccl_alone = match &row.nccl {
        Some(NcclMeasure::Time { time_us, .. }) => Some(*time_us),
        _ => None,
    };
    let nccl_side = match (nccl, nccl_alone) {
        (Some(n), Some(alone_us)) => {
            let op = n.nccl.op::<T>(case.op)?;
            let mut issue = NcclIssue::<T> {
                nccl: n.nccl,
                op: &op,
                case,
                send: n.send,
                recv: n.recv,
                blocking: mode == Mode::Blocking,
                _t: std::marker::PhantomData,
            };
            let round = round_calls(alone, alone_us * 1e-6);
            Some(overlapped(
                world, c, &mut issue, launches, iters, round, limit, alone_us,
            )?)
        }
        _ => None,
    };
    Ok(Record {
        row: ctx.rows.len(),
        bytes: row.bytes,
        in_place: row.out_of_place.is_none(),
        job_alone_us: alone * 1e6,
        gc: gc_side,
        nccl: nccl_side,
        launches,
        blocks: job.compute.blocks(),
        iters,
    })
}

/// The run's header line for the overlap mode.
pub fn describe(job: &Job<'_>, fixed: bool) -> String {
    let (sms, per_sm) = job.compute.shape();
    format!(
        "# overlap: compute job = {} launches of {} blocks ({WAVES} waves x {sms} SMs x {per_sm} \
         resident) x {THREADS} threads x {} loops of 8 FMA chains ({}; {:.1} us per launch \
         alone), on its own non-blocking stream; the collective loops from the job's start to \
         its end; slowdown = job time overlapped / alone - 1; coll overlapped = mean of the \
         calls that ended while the job ran (*: none did, mean of all calls)",
        job.launches,
        job.compute.blocks(),
        job.iters,
        if fixed {
            "--overlap-iters"
        } else {
            "calibrated; repeat with --overlap-iters"
        },
        job.launch_s * 1e6
    )
}

const W: usize = 10;

/// The overlap table's header (after a table's rows).
pub fn header(title: &str, vs_nccl: bool) -> String {
    let group = 2 + W + 2 + 9 + 2 + W + 2 + W;
    let mut l1 = format!("#{:>12}  {:>w$}", "", "", w = W);
    let mut l2 = format!("#{:>12}  {:>w$}", "size", "compute", w = W);
    let mut l3 = format!("#{:>12}  {:>w$}", "(B)", "alone(us)", w = W);
    let mut side = |name: &str, with: &str| {
        l1.push_str(&format!("  {name:^w$}", w = group - 2));
        l2.push_str(&format!(
            "  {:>W$}  {:>9}  {:>W$}  {:>W$}",
            "compute", "slowdown", "coll", "coll"
        ));
        l3.push_str(&format!(
            "  {with:>W$}  {:>9}  {:>W$}  {:>W$}",
            "(%)", "alone(us)", "overl.(us)"
        ));
    };
    side("gpucoll", "w/ gc(us)");
    if vs_nccl {
        side("NCCL", "w/nccl(us)");
    }
    format!("#\n# {title}\n{}\n{l2}\n{l3}", l1.trim_end())
}

fn fmt_side(s: Option<&Side>, alone_us: f64) -> String {
    let Some(s) = s else {
        return format!("  {:>w$}", "n/a", w = W + 2 + 9 + 2 + W + 2 + W);
    };
    let pct = slowdown_pct(alone_us, s.job_us).map_or("-".to_string(), |p| format!("{p:+.1}"));
    let mark = if s.timed_calls == 0 { "*" } else { "" };
    format!(
        "  {:>W$}  {:>9}  {:>W$}  {:>W$}",
        fmt_time(s.job_us).trim(),
        pct,
        fmt_time(s.coll_alone_us).trim(),
        format!("{}{mark}", fmt_time(s.coll_us).trim()),
    )
}

/// One line of the overlap table.
pub fn line(r: &Record, vs_nccl: bool) -> String {
    let mut s = format!(" {:>12}  {:>W$}", r.bytes, fmt_time(r.job_alone_us).trim());
    s.push_str(&fmt_side(Some(&r.gc), r.job_alone_us));
    if vs_nccl {
        s.push_str(&fmt_side(r.nccl.as_ref(), r.job_alone_us));
    }
    s
}

/// Print the overlap table of the records from `first` on (one run of
/// run.rs's sizes).
pub fn print_table(ctx: &Ctx<'_>, first: usize, title: &str) {
    let recs: Vec<&Record> = ctx.overlaps.iter().filter(|r| r.row >= first).collect();
    if recs.is_empty() {
        return;
    }
    let vs_nccl = ctx.nccl.is_some();
    ctx.print(&header(title, vs_nccl));
    for r in recs {
        ctx.print(&line(r, vs_nccl));
    }
}

/// The JSON fields of a row's overlap figures (every object of the row).
pub fn json_fields(r: &Record) -> Vec<String> {
    let mut f = vec![
        "\"overlap\":true".to_string(),
        format!("\"overlap_in_place\":{}", r.in_place),
        format!("\"overlap_launches\":{}", r.launches),
        format!("\"overlap_blocks\":{}", r.blocks),
        format!("\"overlap_threads\":{THREADS}"),
        format!("\"overlap_iters\":{}", r.iters),
        format!("\"overlap_compute_alone_us\":{}", json_num(r.job_alone_us)),
    ];
    let opt = |x: Option<f64>| x.map_or("null".to_string(), json_num);
    for (name, s) in [("gpucoll", Some(&r.gc)), ("nccl", r.nccl.as_ref())] {
        let pct = s.and_then(|s| slowdown_pct(r.job_alone_us, s.job_us));
        f.push(format!(
            "\"overlap_compute_{name}_us\":{}",
            opt(s.map(|s| s.job_us))
        ));
        f.push(format!("\"overlap_slowdown_{name}_pct\":{}", opt(pct)));
        f.push(format!(
            "\"overlap_{name}_alone_us\":{}",
            opt(s.map(|s| s.coll_alone_us))
        ));
        f.push(format!(
            "\"overlap_{name}_us\":{}",
            opt(s.map(|s| s.coll_us))
        ));
        f.push(format!(
            "\"overlap_{name}_calls\":{}",
            s.map_or("null".to_string(), |s| s.calls.to_string())
        ));
        f.push(format!(
            "\"overlap_{name}_timed_calls\":{}",
            s.map_or("null".to_string(), |s| s.timed_calls.to_string())
        ));
    }
    f
}

/// `obj` (one JSON object) with `fields` appended.
pub fn with_fields(obj: String, fields: &[String]) -> String {
    match obj.strip_suffix('}') {
        Some(body) if !fields.is_empty() => {
            let sep = if body.ends_with('{') { "" } else { "," };
            format!("{body}{sep}{}}}", fields.join(","))
        }
        _ => obj,
    }
}

#[cfg(test)]
mod tests;
