//! The overlap loop against a fake clock, job and collective (no MPI, no
//! GPU), and the table and JSON figures.

use super::*;
use std::cell::{Cell, RefCell};

/// One process; `max` returns its argument, so a run's figures are exact.
struct Clock {
    now: Cell<f64>,
    barriers: Cell<usize>,
    agreements: RefCell<Vec<f64>>,
}

impl Ranks for Clock {
    fn barrier(&self) -> Result<(), String> {
        self.barriers.set(self.barriers.get() + 1);
        Ok(())
    }
    fn max(&self, x: f64) -> Result<f64, String> {
        self.agreements.borrow_mut().push(x);
        Ok(x)
    }
    fn now(&self) -> f64 {
        self.now.get()
    }
}

fn clock() -> Clock {
    Clock {
        now: Cell::new(0.0),
        barriers: Cell::new(0),
        agreements: RefCell::new(Vec::new()),
    }
}

/// A job of `per_launch_s × launches × iters / 100` seconds, slowed by
/// `slow` while it runs; it ends when the clock passes its end.
struct FakeJob<'a> {
    clock: &'a Clock,
    per_launch_s: f64,
    slow: f64,
    began: Cell<f64>,
    end: Cell<f64>,
    starts: Cell<usize>,
}

impl Compute for FakeJob<'_> {
    fn start(&self, launches: usize, iters: u32) -> Result<(), String> {
        let t = self.clock.now();
        let len = self.per_launch_s * launches as f64 * iters as f64 / 100.0 * self.slow;
        self.began.set(t);
        self.end.set(t + len);
        self.starts.set(self.starts.get() + 1);
        Ok(())
    }
    fn running(&self) -> Result<bool, String> {
        Ok(self.clock.now() < self.end.get())
    }
    fn finish(&self) -> Result<f64, String> {
        if self.clock.now() < self.end.get() {
            self.clock.now.set(self.end.get());
        }
        Ok(self.end.get() - self.began.get())
    }
}

fn job(clock: &Clock, per_launch_s: f64, slow: f64) -> FakeJob<'_> {
    FakeJob {
        clock,
        per_launch_s,
        slow,
        began: Cell::new(0.0),
        end: Cell::new(0.0),
        starts: Cell::new(0),
    }
}

/// A collective of `call_s` per call; `waits`: blocking (the clock moves
/// at each call) or queued (it moves at `finish`).
struct FakeColl<'a> {
    clock: &'a Clock,
    call_s: f64,
    waits: bool,
    queued: usize,
    calls: usize,
}

impl Issue for FakeColl<'_> {
    fn call(&mut self) -> Result<(), String> {
        self.calls += 1;
        if self.waits {
            self.clock.now.set(self.clock.now() + self.call_s);
        } else {
            self.queued += 1;
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), String> {
        let t = self.clock.now() + self.queued as f64 * self.call_s;
        self.clock.now.set(t);
        self.queued = 0;
        Ok(())
    }
    fn each_waits(&self) -> bool {
        self.waits
    }
}

fn coll(clock: &Clock, call_s: f64, waits: bool) -> FakeColl<'_> {
    FakeColl {
        clock,
        call_s,
        waits,
        queued: 0,
        calls: 0,
    }
}

#[test]
fn slowdown_and_scaling_arithmetic() {
    assert_eq!(slowdown_pct(1000.0, 1250.0), Some(25.0));
    assert_eq!(slowdown_pct(1000.0, 1000.0), Some(0.0));
    assert!(slowdown_pct(1000.0, 990.0).unwrap() < 0.0);
    assert_eq!(slowdown_pct(0.0, 10.0), None);
    assert_eq!(slowdown_pct(f64::NAN, 10.0), None);
    // 256 loops took 100 µs: 512 reach 200 µs.
    assert_eq!(scale_iters(256, 100e-6, 200e-6), 512);
    assert_eq!(scale_iters(256, 0.0, 200e-6), 256);
    assert_eq!(scale_iters(256, f64::INFINITY, 200e-6), 256);
    assert_eq!(scale_iters(1, 1.0, 1e-12), 1);
    assert_eq!(
        scale_iters(1 << 20, 1e-9, 1.0),
        crate::args::MAX_OVERLAP_ITERS
    );
    // A 4 ms job, 100 µs calls: 10 calls a round (4 rounds per job).
    assert_eq!(round_calls(4e-3, 100e-6), 10);
    assert_eq!(round_calls(4e-3, 10e-3), 1);
    assert_eq!(round_calls(4e-3, 0.0), 1);
    assert_eq!(round_calls(4.0, 1e-12), MAX_ROUND_CALLS);
}

#[test]
fn calibration_reaches_the_target() {
    let c = clock();
    // 100 loops take 50 µs per launch.
    let j = job(&c, 50e-6, 1.0);
    let (iters, per) = calibrate(&c, &j, None, 200e-6).unwrap();
    assert_eq!(iters, 400);
    assert!((per - 200e-6).abs() < 1e-12, "{per}");
    let (fixed, per) = calibrate(&c, &j, Some(1000), 200e-6).unwrap();
    assert_eq!(fixed, 1000);
    assert!((per - 500e-6).abs() < 1e-12, "{per}");
}

#[test]
fn blocking_calls_cover_the_job_and_time_only_the_covered_calls() {
    let c = clock();
    // 4 launches of 1 ms alone, 1.5 ms with the collective.
    let j = job(&c, 1e-3, 1.5);
    let alone = 4e-3;
    let round = round_calls(alone, 100e-6);
    assert_eq!(round, 10);
    // Slowed to 130 µs per call while the job runs.
    let mut k = coll(&c, 130e-6, true);
    let s = overlapped(&c, &j, &mut k, 4, 100, round, 1.0, 100.0).unwrap();
    assert_eq!(c.barriers.get(), 1);
    assert!((s.job_us - 6000.0).abs() < 1e-6, "{}", s.job_us);
    assert_eq!(
        slowdown_pct(alone * 1e6, s.job_us).map(|p| p.round()),
        Some(50.0)
    );
    // The job ends at 6 ms: 46 calls ended before (5.98 ms); the loop
    // goes on to the end of its round (50 calls, 6.5 ms).
    assert_eq!((s.calls, s.timed_calls), (50, 46));
    assert!((s.coll_us - 130.0).abs() < 1e-6, "{}", s.coll_us);
    assert_eq!(s.coll_alone_us, 100.0);
    assert_eq!(k.calls, s.calls);
}

#[test]
fn queued_calls_are_timed_by_whole_rounds() {
    let c = clock();
    let j = job(&c, 0.95e-3, 1.0);
    let mut k = coll(&c, 100e-6, false);
    let s = overlapped(&c, &j, &mut k, 4, 100, 10, 1.0, 100.0).unwrap();
    // Rounds of 1 ms end at 1, 2, 3 ms while the 3.8 ms job runs; the 4th
    // ends after it: 30 timed calls, 40 made.
    assert_eq!((s.calls, s.timed_calls), (40, 30));
    assert!((s.coll_us - 100.0).abs() < 1e-6);
    assert!((s.job_us - 3800.0).abs() < 1e-6);
}

#[test]
fn a_call_longer_than_the_job_is_marked() {
    let c = clock();
    let j = job(&c, 1e-3, 1.0);
    let mut k = coll(&c, 10e-3, true);
    let s = overlapped(&c, &j, &mut k, 1, 100, 1, 1.0, 9000.0).unwrap();
    assert_eq!((s.calls, s.timed_calls), (1, 0));
    assert!((s.coll_us - 10000.0).abs() < 1e-6);
    let rec = record(s, None);
    assert!(line(&rec, false).ends_with('*'), "{}", line(&rec, false));
}

#[test]
fn a_job_that_never_ends_fails_on_every_rank() {
    let c = clock();
    let j = job(&c, 1e9, 1.0);
    let mut k = coll(&c, 1e-3, true);
    let e = overlapped(&c, &j, &mut k, 1, 100, 10, 0.05, 1000.0).unwrap_err();
    assert!(e.contains("still ran"), "{e}");
    // Agreed through the max: 2 = out of time.
    assert_eq!(c.agreements.borrow().last(), Some(&2.0));
}

#[test]
fn alone_is_the_mean_of_the_jobs() {
    let c = clock();
    let j = job(&c, 1e-3, 1.0);
    let t = time_alone(&c, &j, 3, 100, 2).unwrap();
    assert!((t - 3e-3).abs() < 1e-12);
    assert_eq!(j.starts.get(), 2);
}

fn side(job_us: f64, alone_us: f64, coll_us: f64) -> Side {
    Side {
        job_us,
        coll_alone_us: alone_us,
        coll_us,
        calls: 40,
        timed_calls: 30,
    }
}

fn record(gc: Side, nccl: Option<Side>) -> Record {
    Record {
        row: 0,
        bytes: 1 << 20,
        in_place: false,
        job_alone_us: 4000.0,
        gc,
        nccl,
        launches: 16,
        blocks: 8448,
        iters: 300,
    }
}

#[test]
fn table_lines_line_up_with_the_header() {
    let r = record(side(4040.0, 20.0, 21.5), Some(side(5200.0, 18.0, 150.0)));
    let h = header("Overlap: all_gather float none, mode blocking", true);
    let l = line(&r, true);
    let cols: Vec<&str> = l.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "1048576", "4000.0", "4040.0", "+1.0", "20.00", "21.50", "5200.0", "+30.0", "18.00",
            "150.0"
        ]
    );
    let rows: Vec<&str> = h.lines().collect();
    assert_eq!(rows.len(), 5);
    assert_eq!(rows[0], "#");
    // Right edges of the header's last line match the row's.
    assert_eq!(rows[4].len(), l.len(), "\n{h}\n{l}");
    assert_eq!(rows[3].len(), l.len());
    // Without NCCL, or NCCL lacking the collective.
    let short = line(&r, false);
    assert_eq!(short.split_whitespace().count(), 6);
    let none = line(&record(side(4040.0, 20.0, 21.5), None), true);
    assert!(none.ends_with("n/a"));
    assert_eq!(none.len(), l.len());
}

#[test]
fn json_fields_are_added_to_each_object() {
    let r = record(side(4040.0, 20.0, 21.5), None);
    let f = json_fields(&r);
    let obj = with_fields("{\"collective\":\"all_gather\"}".to_string(), &f);
    assert!(obj.starts_with("{\"collective\":\"all_gather\",\"overlap\":true,"));
    assert!(obj.contains("\"overlap_slowdown_gpucoll_pct\":1"));
    assert!(obj.contains("\"overlap_gpucoll_us\":21.5"));
    assert!(obj.contains("\"overlap_nccl_us\":null"));
    assert!(obj.contains("\"overlap_gpucoll_timed_calls\":30"));
    assert!(obj.ends_with('}'));
    assert_eq!(
        with_fields("{}".to_string(), &f).matches(",\"").count(),
        f.len() - 1
    );
    assert_eq!(with_fields("{\"a\":1}".to_string(), &[]), "{\"a\":1}");
}
