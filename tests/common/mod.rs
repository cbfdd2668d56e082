//! Shared pieces of the multi-rank integration tests (no extra crates).
//!
//! * The launcher: each test binary is both the launcher and the rank
//!   program. Without `GPUCOLL_TEST_WORKER` it runs every selected case as
//!   `mpirun -n N <this binary>` with `GPUCOLL_TEST_WORKER=<scenario>`, one at
//!   a time, under a wall-clock guard, and prints libtest-style lines.
//! * Data helpers: a seeded PRNG (splitmix64), typed element helpers for the
//!   ten datatypes, poisoning, exact/tolerant comparison, a local reduction
//!   oracle for what MPI cannot reduce (f16/bf16, Avg, PreMulSum).
#![allow(dead_code)]

pub mod pmpi;

use gpucoll::prelude::*;
use std::fmt::Debug;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Launcher
// ---------------------------------------------------------------------------

/// One launcher case: `mpirun -n np` running `scenario` with extra env vars.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub np: usize,
    pub scenario: String,
    pub env: Vec<(String, String)>,
    pub timeout_s: u64,
    /// Extra `mpirun` options (e.g. `--enable-recovery`).
    pub mpirun_args: Vec<String>,
    /// Judge by the output instead of mpirun's exit status (for cases where
    /// a rank dies on purpose): this line must appear this many times.
    pub expect_lines: Option<(String, usize)>,
    /// A rank is interrupted on purpose: the verdict is that nothing is
    /// left behind (no new gpucoll entry in /dev/shm, no process of this
    /// test still running), whatever mpirun's exit status.
    pub leaves_nothing: bool,
}

impl Case {
    pub fn new(name: impl Into<String>, np: usize, scenario: impl Into<String>) -> Case {
        Case {
            name: name.into(),
            np,
            scenario: scenario.into(),
            env: Vec::new(),
            timeout_s: 300,
            mpirun_args: Vec::new(),
            expect_lines: None,
            leaves_nothing: false,
        }
    }
    /// See [`Case::leaves_nothing`].
    pub fn leaves_nothing(mut self) -> Case {
        self.leaves_nothing = true;
        self
    }
    /// A case in which a rank dies on purpose: mpirun keeps the others
    /// (`--enable-recovery`) and the verdict is `n` lines starting with
    /// `marker` in the output.
    pub fn survivors(mut self, marker: &str, n: usize) -> Case {
        self.mpirun_args.push("--enable-recovery".into());
        self.expect_lines = Some((marker.to_string(), n));
        self
    }
    pub fn env(mut self, k: &str, v: impl ToString) -> Case {
        self.env.push((k.to_string(), v.to_string()));
        self
    }
    pub fn timeout(mut self, s: u64) -> Case {
        self.timeout_s = s;
        self
    }
}

/// Entry point of both test binaries.
pub fn main_with(cases: Vec<Case>, worker: fn(&str) -> std::result::Result<(), String>) -> ! {
    if let Ok(scenario) = std::env::var("GPUCOLL_TEST_WORKER") {
        // One write: eprintln! writes its pieces apart, and the ranks' lines
        // interleaved mid-line ("[worker] pid[worker] pid 4857\n 4860").
        let line = format!("{WORKER_PID} {}\n", std::process::id());
        let _ = std::io::stderr().write_all(line.as_bytes());
        let guard: u64 = std::env::var("GPUCOLL_TEST_GUARD")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(280);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(guard));
            eprintln!("[worker] outer guard: scenario still running after {guard} s; exiting");
            std::process::exit(3);
        });
        let t0 = Instant::now();
        let r = worker(&scenario);
        let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
        match r {
            Ok(()) => {
                eprintln!(
                    "[rank {rank}] scenario {scenario} ok in {:.2}s",
                    t0.elapsed().as_secs_f64()
                );
                std::process::exit(0)
            }
            Err(e) => {
                eprintln!("[rank {rank}] scenario {scenario} FAILED: {e}");
                std::process::exit(1)
            }
        }
    }
    std::process::exit(launch(cases))
}

struct Args {
    filters: Vec<String>,
    skips: Vec<String>,
    exact: bool,
    list: bool,
    nocapture: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        filters: vec![],
        skips: vec![],
        exact: false,
        list: false,
        nocapture: std::env::var("GPUCOLL_TEST_VERBOSE").is_ok(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        match s.as_str() {
            "--exact" => a.exact = true,
            "--list" => a.list = true,
            "--nocapture" | "--show-output" => a.nocapture = true,
            "--skip" => {
                if let Some(v) = it.next() {
                    a.skips.push(v)
                }
            }
            "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" | "--report-time" => {
                // options with a separate value (report-time has none in
                // newer libtest, but swallowing one filter is harmless)
                if s != "--report-time" {
                    it.next();
                }
            }
            _ if s.starts_with('-') => {}
            _ => a.filters.push(s),
        }
    }
    a
}

fn selected(a: &Args, name: &str) -> bool {
    let hit = |f: &String| {
        if a.exact {
            name == f
        } else {
            name.contains(f.as_str())
        }
    };
    (a.filters.is_empty() || a.filters.iter().any(hit))
        && !a.skips.iter().any(|s| name.contains(s.as_str()))
}

fn launch(cases: Vec<Case>) -> i32 {
    let args = parse_args();
    let cases: Vec<Case> = cases
        .into_iter()
        .filter(|c| selected(&args, &c.name))
        .collect();
    if args.list {
        for c in &cases {
            println!("{}: test", c.name);
        }
        println!("\n{} tests, 0 benchmarks", cases.len());
        return 0;
    }
    let t_all = Instant::now();
    println!("\nrunning {} tests", cases.len());
    let mpirun_ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mpirun_ok && !cases.is_empty() {
        println!(
            "error: `mpirun` is not on PATH (or does not run). These tests launch \
             `mpirun -n N`; install Open MPI (see README: apt-get install openmpi-bin libopenmpi-dev)."
        );
        println!("\ntest result: FAILED. 0 passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n", cases.len());
        return 1;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut failed: Vec<(String, String)> = vec![];
    let mut passed = 0;
    for c in &cases {
        print!("test {} ... ", c.name);
        let _ = std::io::stdout().flush();
        let t0 = Instant::now();
        let (ok, out) = run_case(&exe, c);
        let dt = t0.elapsed().as_secs_f64();
        if ok {
            passed += 1;
            println!("ok");
            if args.nocapture {
                println!("{out}");
            }
            eprintln!("    ({} took {dt:.1}s)", c.name);
        } else {
            println!("FAILED");
            eprintln!("    ({} took {dt:.1}s)", c.name);
            failed.push((c.name.clone(), out));
        }
    }
    if !failed.is_empty() {
        println!("\nfailures:\n");
        for (n, out) in &failed {
            println!("---- {n} stdout ----");
            let lines: Vec<&str> = out.lines().collect();
            let start = lines.len().saturating_sub(300);
            if start > 0 {
                println!("[... {start} earlier lines omitted ...]");
            }
            for l in &lines[start..] {
                println!("{l}");
            }
            println!();
        }
        println!("\nfailures:");
        for (n, _) in &failed {
            println!("    {n}");
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        passed,
        failed.len(),
        t_all.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        0
    } else {
        1
    }
}

fn run_case(exe: &std::path::Path, c: &Case) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let log = std::env::temp_dir().join(format!(
        "gpucoll-test-{}-{}.log",
        std::process::id(),
        c.name.replace(['/', ' '], "_")
    ));
    let file = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(e) => return (false, format!("cannot create {}: {e}", log.display())),
    };
    let file2 = file.try_clone().expect("clone log handle");
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--mca",
        "btl",
        "^openib",
        "--mca",
        "btl_vader_single_copy_mechanism",
        "none",
        "-n",
    ]);
    cmd.arg(c.np.to_string());
    cmd.args(&c.mpirun_args);
    // A deterministic environment: drop inherited GPUCOLL_* settings except
    // logging and an explicit backend choice.
    for (k, _) in std::env::vars() {
        if k.starts_with("GPUCOLL_") && k != "GPUCOLL_LOG" && k != "GPUCOLL_BACKEND" {
            cmd.env_remove(&k);
        }
    }
    let mut env: Vec<(String, String)> = vec![
        ("GPUCOLL_TEST_WORKER".into(), c.scenario.clone()),
        (
            "GPUCOLL_TEST_GUARD".into(),
            c.timeout_s.saturating_sub(15).max(10).to_string(),
        ),
        ("GPUCOLL_TEST_CASE".into(), c.name.clone()),
    ];
    if std::env::var("GPUCOLL_BACKEND").is_err()
        && !c.env.iter().any(|(k, _)| k == "GPUCOLL_BACKEND")
    {
        env.push(("GPUCOLL_BACKEND".into(), "host".into()));
    }
    if !c.env.iter().any(|(k, _)| k == "GPUCOLL_TIMEOUT") {
        env.push(("GPUCOLL_TIMEOUT".into(), "60".into()));
    }
    env.extend(c.env.iter().cloned());
    for (k, v) in &env {
        cmd.env(k, v);
        cmd.arg("-x").arg(k);
    }
    for (k, _) in std::env::vars() {
        if k == "GPUCOLL_LOG" || k == "GPUCOLL_BACKEND" || k == "RUST_BACKTRACE" {
            cmd.arg("-x").arg(&k);
        }
    }
    cmd.env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        // Open MPI 4.1's op/avx component adds 8-bit integers with
        // saturation (MPI_SUM on int8/uint8 gives 127/255 instead of
        // wrapping), which breaks the MPI oracle; use the scalar ops.
        .env("OMPI_MCA_op", "^avx")
        .arg(exe)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(file2))
        .process_group(0);
    let shm_before = gpucoll_shm_entries();
    let mut child = match cmd.spawn() {
        Ok(ch) => ch,
        Err(e) => return (false, format!("cannot spawn mpirun: {e}")),
    };
    let deadline = Instant::now() + Duration::from_secs(c.timeout_s);
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(_) => break None,
        }
        if Instant::now() > deadline {
            timed_out = true;
            let pg = child.id() as i32;
            unsafe {
                libc::kill(-pg, libc::SIGTERM);
            }
            let grace = Instant::now() + Duration::from_secs(5);
            while Instant::now() < grace {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            unsafe {
                libc::kill(-pg, libc::SIGKILL);
            }
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let envs: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    out.insert_str(
        0,
        &format!(
            "[launcher] mpirun -n {} scenario={} {}\n",
            c.np,
            c.scenario,
            envs.join(" ")
        ),
    );
    if timed_out {
        out.push_str(&format!(
            "\n[launcher] TIMEOUT: killed mpirun after {} s (wall-clock guard)\n",
            c.timeout_s
        ));
        return (false, out);
    }
    if c.leaves_nothing {
        let mut problems = Vec::new();
        // Ranks killed by mpirun may take a moment to be gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut stray = running_copies(exe);
        while !stray.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            stray = running_copies(exe);
        }
        if !stray.is_empty() {
            problems.push(format!("processes still running: {stray:?}"));
        }
        // A segment's name carries its creator's pid (`shm::segment_name`):
        // those of this job's ranks count, and any name that says no pid;
        // other test binaries may run beside this one (`scripts/run-tests`).
        let ranks = worker_pids(&out);
        if ranks.len() != c.np {
            problems.push(format!(
                "{} of {} ranks said their pid: cannot tell their segments",
                ranks.len(),
                c.np
            ));
        }
        let left: Vec<String> = gpucoll_shm_entries()
            .into_iter()
            .filter(|e| !shm_before.contains(e))
            .filter(|e| match segment_creator(e) {
                Some(pid) => ranks.contains(&pid),
                None => true,
            })
            .collect();
        if !left.is_empty() {
            problems.push(format!("left in /dev/shm: {left:?}"));
        }
        out.push_str(&format!(
            "\n[launcher] after the interrupted job: {}\n",
            if problems.is_empty() {
                "nothing left behind".to_string()
            } else {
                problems.join("; ")
            }
        ));
        return (problems.is_empty(), out);
    }
    if let Some((marker, n)) = &c.expect_lines {
        let seen = out
            .lines()
            .filter(|l| l.trim_start().starts_with(marker.as_str()))
            .count();
        let ok = seen == *n;
        if !ok {
            out.push_str(&format!(
                "\n[launcher] expected {n} lines starting with {marker:?}, saw {seen}\n"
            ));
        }
        return (ok, out);
    }
    match status {
        Some(st) if st.success() => (true, out),
        Some(st) => {
            out.push_str(&format!("\n[launcher] mpirun exited with {st}\n"));
            (false, out)
        }
        None => {
            out.push_str("\n[launcher] could not wait for mpirun\n");
            (false, out)
        }
    }
}

/// gpucoll's entries in /dev/shm.
fn gpucoll_shm_entries() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("gpucoll"))
                .collect()
        })
        .unwrap_or_default()
}

/// The pids the job's ranks printed as they started (`main_with`),
/// wherever another rank's output cut into a line.
fn worker_pids(out: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = out
        .match_indices(WORKER_PID)
        .filter_map(|(i, _)| {
            let rest = out[i + WORKER_PID.len()..].trim_start_matches(' ');
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..digits].parse().ok()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The line each rank prints first: this, then its pid.
const WORKER_PID: &str = "[worker] pid";

/// The creator pid in a segment name `gpucoll.<owner>.<pid>.<nonce>.<rank>`.
fn segment_creator(name: &str) -> Option<u32> {
    name.split('.').nth(2)?.parse().ok()
}

/// Pids of processes running `exe`, other than this one.
fn running_copies(exe: &std::path::Path) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| pid != me)
                .filter(|pid| {
                    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe)
                })
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Worker helpers
// ---------------------------------------------------------------------------

/// Print and exit at once (without MPI_Finalize, so that mpirun tears the
/// job down instead of the other ranks waiting for this one).
pub fn fail_now(msg: &str) -> ! {
    let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
    eprintln!("[rank {rank}] FATAL: {msg}");
    let _ = std::io::stderr().flush();
    std::process::exit(1)
}

/// Unwrap a gpucoll result or fail the rank at once.
pub fn ok<T>(r: gpucoll::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => fail_now(&format!("{what}: unexpected error: {e} ({e:?})")),
    }
}

/// A named parameter from `GPUCOLL_TEST_PARAMS` (`k=v;k=v`).
pub fn param(name: &str) -> Option<String> {
    let p = std::env::var("GPUCOLL_TEST_PARAMS").ok()?;
    p.split(';').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then(|| v.trim().to_string())
    })
}

pub fn log(msg: &str) {
    let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
    eprintln!("[rank {rank}] {msg}");
}

// ---------------------------------------------------------------------------
// PRNG and element types
// ---------------------------------------------------------------------------

pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Mix several numbers into one seed.
pub fn seed_of(parts: &[u64]) -> u64 {
    let mut r = Rng::new(0x1234_5678);
    let mut h = 0u64;
    for &p in parts {
        r.0 ^= p.wrapping_mul(0x2545_F491_4F6C_DD1D);
        h ^= r.next();
    }
    h
}

/// What values a test feeds a collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Data {
    /// Arbitrary bit patterns (data movement: compared bit for bit).
    Bits,
    /// Values for Sum/Min/Max/Avg/PreMulSum: ints full range (wrapping);
    /// floats small multiples of a power of two so that sums are exact.
    Reduce,
    /// Values for Prod: ints full range; floats in {1, -1, 2, 0.5}.
    Prod,
    /// Values for the logical ops (integers): 40% zeros, else any bits.
    Logic,
}

/// The ten element types, with what the tests need to know about each.
pub trait El: Equivalence + Copy + PartialEq + Debug + Default + Send + Sync + 'static {
    const FLOAT: bool;
    const HALF: bool;
    /// Unit roundoff (floats).
    const U: f64;
    const SIZE: usize;
    fn from_bits64(b: u64) -> Self;
    fn bits64(self) -> u64;
    fn small(r: u64) -> Self;
    fn prod_val(r: u64) -> Self;
    fn to_f64(self) -> f64;
    fn wadd(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wmin(self, o: Self) -> Self;
    fn wmax(self, o: Self) -> Self;
    fn div_n(self, n: usize) -> Self;
    fn from_scalar(s: f64) -> Self;
    fn poison() -> Self {
        Self::from_bits64(0x5A5A_5A5A_5A5A_5A5A)
    }
    fn gen(r: u64, d: Data) -> Self {
        match d {
            Data::Bits => Self::from_bits64(r),
            Data::Reduce => Self::small(r),
            Data::Prod => Self::prod_val(r),
            Data::Logic => Self::from_bits64(if r % 5 < 2 { 0 } else { r >> 3 }),
        }
    }
}

macro_rules! int_el {
    ($($t:ty),*) => {$(
        impl El for $t {
            const FLOAT: bool = false;
            const HALF: bool = false;
            const U: f64 = 0.0;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_bits64(b: u64) -> Self { b as $t }
            fn bits64(self) -> u64 { (self as u64) & (u64::MAX >> (64 - 8 * Self::SIZE)) }
            fn small(r: u64) -> Self { r as $t }
            fn prod_val(r: u64) -> Self { r as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn wmin(self, o: Self) -> Self { self.min(o) }
            fn wmax(self, o: Self) -> Self { self.max(o) }
            fn div_n(self, n: usize) -> Self { self / (n as $t) }
            fn from_scalar(s: f64) -> Self { s as $t }
        }
    )*};
}
int_el!(i8, u8, i32, u32, i64, u64);

macro_rules! float_el {
    ($t:ty, $half:expr, $u:expr, $bits:ty, $from_bits:expr, $to_bits:expr, $from_f64:expr, $to_f64:expr, $range:expr, $scale:expr) => {
        impl El for $t {
            const FLOAT: bool = true;
            const HALF: bool = $half;
            const U: f64 = $u;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_bits64(b: u64) -> Self {
                ($from_bits)(b as $bits)
            }
            fn bits64(self) -> u64 {
                ($to_bits)(self) as u64
            }
            fn small(r: u64) -> Self {
                let k = (r % (2 * $range + 1)) as i64 - $range as i64;
                ($from_f64)(k as f64 * $scale)
            }
            fn prod_val(r: u64) -> Self {
                ($from_f64)([1.0, -1.0, 2.0, 0.5][(r % 4) as usize])
            }
            fn to_f64(self) -> f64 {
                ($to_f64)(self)
            }
            fn wadd(self, o: Self) -> Self {
                ($from_f64)(self.to_f64() + o.to_f64())
            }
            fn wmul(self, o: Self) -> Self {
                ($from_f64)(self.to_f64() * o.to_f64())
            }
            fn wmin(self, o: Self) -> Self {
                if o.to_f64() < self.to_f64() {
                    o
                } else {
                    self
                }
            }
            fn wmax(self, o: Self) -> Self {
                if o.to_f64() > self.to_f64() {
                    o
                } else {
                    self
                }
            }
            fn div_n(self, n: usize) -> Self {
                ($from_f64)(self.to_f64() / n as f64)
            }
            fn from_scalar(s: f64) -> Self {
                ($from_f64)(s)
            }
        }
    };
}
float_el!(
    f32,
    false,
    5.960464477539063e-8,
    u32,
    f32::from_bits,
    f32::to_bits,
    |v: f64| v as f32,
    |v: f32| v as f64,
    1024u64,
    0.25
);
float_el!(
    f64,
    false,
    1.1102230246251565e-16,
    u64,
    f64::from_bits,
    f64::to_bits,
    |v: f64| v,
    |v: f64| v,
    1024u64,
    0.25
);
float_el!(
    f16,
    true,
    4.8828125e-4,
    u16,
    f16::from_bits,
    f16::to_bits,
    f16::from_f64,
    f16::to_f64,
    16u64,
    1.0
);
float_el!(
    bf16,
    true,
    3.90625e-3,
    u16,
    bf16::from_bits,
    bf16::to_bits,
    bf16::from_f64,
    bf16::to_f64,
    8u64,
    1.0
);

/// `len` seeded values.
pub fn gen_vec<T: El>(seed: u64, len: usize, d: Data) -> Vec<T> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| T::gen(r.next(), d)).collect()
}

pub fn poisoned<T: El>(len: usize) -> Vec<T> {
    vec![T::poison(); len]
}

/// Little-endian bytes of a slice (for gathering raw inputs with MPI as u8).
pub fn to_bytes<T: El>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    for x in v {
        out.extend_from_slice(&x.bits64().to_le_bytes()[..T::SIZE]);
    }
    out
}

pub fn from_bytes<T: El>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(T::SIZE)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..T::SIZE].copy_from_slice(c);
            T::from_bits64(u64::from_le_bytes(w))
        })
        .collect()
}

/// Every rank's `mine`, gathered with MPI's own allgather (as bytes).
pub fn gather_inputs<T: El>(comm: &Communicator, mine: &[T]) -> Vec<Vec<T>> {
    let n = comm.size();
    if mine.is_empty() {
        // reference::* with two empty slices: see docs/TEST_FINDINGS.md (MPI_ERR_ARG)
        return vec![Vec::new(); n];
    }
    let b = to_bytes(mine);
    let mut all = vec![0u8; b.len() * n];
    ok(
        gpucoll::reference::all_gather(comm, &b, &mut all),
        "reference::all_gather(bytes)",
    );
    if b.is_empty() {
        return vec![Vec::new(); n];
    }
    all.chunks_exact(b.len()).map(from_bytes::<T>).collect()
}

/// The expected result of a reduction.
pub enum Expect<T> {
    Exact(Vec<T>),
    /// Floating point: expected value and allowed absolute error per element.
    Approx {
        exp: Vec<f64>,
        tol: Vec<f64>,
    },
}

impl<T: El> Expect<T> {
    pub fn len(&self) -> usize {
        match self {
            Expect::Exact(v) => v.len(),
            Expect::Approx { exp, .. } => exp.len(),
        }
    }
    pub fn slice(&self, lo: usize, hi: usize) -> Expect<T> {
        match self {
            Expect::Exact(v) => Expect::Exact(v[lo..hi].to_vec()),
            Expect::Approx { exp, tol } => Expect::Approx {
                exp: exp[lo..hi].to_vec(),
                tol: tol[lo..hi].to_vec(),
            },
        }
    }
}

/// Reduce every rank's input locally with gpucoll's documented semantics:
/// integers wrap; integer Avg = wrapping sum / n (truncating); integer
/// PreMulSum = wrapping sum of x * (scalar as T); floats in f64 with an error
/// bound for the scaled ops (inputs are chosen so that Sum/Prod/Min/Max are
/// exact in every order).
pub fn local_reduce<T: El>(inputs: &[Vec<T>], op: ReduceOp) -> Expect<T> {
    let n = inputs.len();
    let len = inputs[0].len();
    if !T::FLOAT {
        let out = (0..len)
            .map(|i| {
                let col = inputs.iter().map(|v| v[i]);
                match op {
                    ReduceOp::Sum => col.reduce(|a, b| a.wadd(b)).unwrap(),
                    ReduceOp::Prod => col.reduce(|a, b| a.wmul(b)).unwrap(),
                    ReduceOp::Min => col.reduce(|a, b| a.wmin(b)).unwrap(),
                    ReduceOp::Max => col.reduce(|a, b| a.wmax(b)).unwrap(),
                    ReduceOp::Avg => col.reduce(|a, b| a.wadd(b)).unwrap().div_n(n),
                    ReduceOp::PreMulSum(s) => {
                        let k = T::from_scalar(s);
                        col.map(|x| x.wmul(k)).reduce(|a, b| a.wadd(b)).unwrap()
                    }
                    _ => bitwise_reduce(col, op),
                }
            })
            .collect();
        return Expect::Exact(out);
    }
    let mut exp = Vec::with_capacity(len);
    let mut tol = Vec::with_capacity(len);
    for i in 0..len {
        let col = inputs.iter().map(|v| v[i].to_f64());
        let (e, t) = match op {
            ReduceOp::Sum => (col.sum::<f64>(), 0.0),
            ReduceOp::Prod => (col.product::<f64>(), 0.0),
            ReduceOp::Min => (col.fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (col.fold(f64::NEG_INFINITY, f64::max), 0.0),
            ReduceOp::BitAnd
            | ReduceOp::BitOr
            | ReduceOp::BitXor
            | ReduceOp::LogicalAnd
            | ReduceOp::LogicalOr
            | ReduceOp::LogicalXor => panic!("{op} is for integer types only"),
            ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
                let s = match op {
                    ReduceOp::PreMulSum(s) => s,
                    _ => 1.0 / n as f64,
                };
                let terms: Vec<f64> = col.map(|x| x * s).collect();
                let mag: f64 = terms.iter().map(|t| t.abs()).sum();
                // first-order bound: n-1 additions, n scalings, scalar rounding
                (terms.iter().sum(), (n as f64 + 3.0) * T::U * mag + 1e-300)
            }
        };
        exp.push(e);
        tol.push(t);
    }
    Expect::Approx { exp, tol }
}

/// The bitwise and logical ops over one element of every rank (integers;
/// MPI's convention: a lone input is returned as is).
fn bitwise_reduce<T: El>(col: impl Iterator<Item = T>, op: ReduceOp) -> T {
    let truth = |x: u64| (x != 0) as u64;
    let f = |a: u64, b: u64| match op {
        ReduceOp::BitAnd => a & b,
        ReduceOp::BitOr => a | b,
        ReduceOp::BitXor => a ^ b,
        ReduceOp::LogicalAnd => truth(a) & truth(b),
        ReduceOp::LogicalOr => truth(a) | truth(b),
        ReduceOp::LogicalXor => truth(a) ^ truth(b),
        other => panic!("{other} is not a bitwise or logical op"),
    };
    T::from_bits64(col.map(T::bits64).reduce(f).unwrap())
}

/// Compare `got` with `exp`; record a failure line (with the first
/// mismatches) in `fails`. Returns whether it matched.
pub fn check<T: El>(label: &str, got: &[T], exp: &Expect<T>, fails: &mut Vec<String>) -> bool {
    if got.len() != exp.len() {
        fails.push(format!(
            "{label}: length {} != expected {}",
            got.len(),
            exp.len()
        ));
        return false;
    }
    let mut bad = 0usize;
    let mut first = Vec::new();
    match exp {
        Expect::Exact(e) => {
            for (i, (g, x)) in got.iter().zip(e).enumerate() {
                let same = g.bits64() == x.bits64() || (T::FLOAT && g.to_f64() == x.to_f64());
                if !same {
                    bad += 1;
                    if first.len() < 5 {
                        first.push(format!(
                            "[{i}] expected {x:?} (0x{:x}) got {g:?} (0x{:x})",
                            x.bits64(),
                            g.bits64()
                        ));
                    }
                }
            }
        }
        Expect::Approx { exp, tol } => {
            for (i, g) in got.iter().enumerate() {
                let gv = g.to_f64();
                let err = (gv - exp[i]).abs();
                // NaN must fail too, so test for "within" and negate.
                if err.is_nan() || err > tol[i] {
                    bad += 1;
                    if first.len() < 5 {
                        first.push(format!(
                            "[{i}] expected {} (±{:.3e}) got {gv}",
                            exp[i], tol[i]
                        ));
                    }
                }
            }
        }
    }
    if bad > 0 {
        fails.push(format!(
            "{label}: {bad} of {} elements wrong; first: {}",
            got.len(),
            first.join("; ")
        ));
        return false;
    }
    true
}

/// Bit-exact comparison helper.
pub fn check_exact<T: El>(label: &str, got: &[T], exp: &[T], fails: &mut Vec<String>) -> bool {
    check(label, got, &Expect::Exact(exp.to_vec()), fails)
}
