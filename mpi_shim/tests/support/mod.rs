//! The shim's integration tests: ordinary MPI programs (C, Fortran, Python)
//! built here and run under `mpirun` in every way a user can meet the shim.
//!
//! * [`Mode`]: without the shim; preloaded (`-x LD_PRELOAD=libgpucoll_mpi.so`);
//!   preloaded with `GPUCOLL_SHIM=1` or `=0` (passthrough); preloaded with
//!   `GPUCOLL_SHIM_HOST=1`, which routes host buffers into gpucoll's host
//!   backend, checked through `GPUCOLL_SHIM_LOG=1` lines; and linked ahead of
//!   MPI (`-lgpucoll_mpi` + rpath) in the same routing mode.
//! * The shim library comes from this cargo build: the tests depend on the
//!   crate, whose cdylib lands in the profile directory next to `deps/`;
//!   when it is missing, `cargo build -p gpucoll-mpi-shim` builds it.
//! * One `mpirun` at a time in the whole test binary (a lock), each under a
//!   wall-clock limit that kills its process group, so a hang fails the test.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How a program meets the shim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Plain MPI: the reference every other mode must agree with.
    Plain,
    /// `LD_PRELOAD`, default settings (host buffers go straight to MPI).
    Preload,
    /// `LD_PRELOAD` with `GPUCOLL_SHIM=1` spelled out.
    ShimOn,
    /// `LD_PRELOAD` with `GPUCOLL_SHIM=0`: a pure passthrough, logging nothing.
    Passthrough,
    /// `LD_PRELOAD` with `GPUCOLL_SHIM_HOST=1`: host buffers through gpucoll.
    Host,
    /// Linked ahead of MPI (`-lgpucoll_mpi`), with `GPUCOLL_SHIM_HOST=1`.
    Linked,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Preload => "preload",
            Mode::ShimOn => "shim_on",
            Mode::Passthrough => "passthrough",
            Mode::Host => "host_routing",
            Mode::Linked => "linked",
        }
    }

    /// The mode sends host buffers through gpucoll (and logs each route).
    pub fn routes_host(self) -> bool {
        matches!(self, Mode::Host | Mode::Linked)
    }

    fn env(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Mode::Plain | Mode::Preload => vec![],
            Mode::ShimOn => vec![("GPUCOLL_SHIM", "1")],
            Mode::Passthrough => vec![("GPUCOLL_SHIM", "0"), ("GPUCOLL_SHIM_LOG", "1")],
            Mode::Host | Mode::Linked => {
                vec![("GPUCOLL_SHIM_HOST", "1"), ("GPUCOLL_SHIM_LOG", "1")]
            }
        }
    }
}

/// Every `mpirun` of this test binary runs alone (2-core CI machines, and
/// gpucoll's host backend spins while it waits).
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The workspace root (this crate is `mpi_shim/` in it).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("mpi_shim has a parent directory")
        .to_path_buf()
}

/// Where the test programs are built: target/<tmp>/shim-tests.
pub fn build_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shim-tests");
    std::fs::create_dir_all(&d).expect("create the shim test build directory");
    d
}

/// The profile directory of this build (target/release or target/debug).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in <profile>/deps")
        .to_path_buf()
}

/// libgpucoll_mpi.so of this build, built now if cargo has not.
pub fn shim_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = profile_dir();
        let candidates = [
            dir.join("libgpucoll_mpi.so"),
            dir.join("deps").join("libgpucoll_mpi.so"),
        ];
        let newest = |c: &[PathBuf]| {
            c.iter()
                .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p.clone())))
                .max()
                .map(|(_, p)| p)
        };
        if let Some(p) = newest(&candidates) {
            return p;
        }
        let release = dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace())
            .args(["build", "-p", "gpucoll-mpi-shim"]);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build -p gpucoll-mpi-shim");
        assert!(st.success(), "cargo build -p gpucoll-mpi-shim failed");
        newest(&candidates).unwrap_or_else(|| {
            panic!(
                "no libgpucoll_mpi.so in {} after building it",
                dir.display()
            )
        })
    })
    .clone()
}

/// Run a build command; panic with its output when it fails.
pub fn build(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", cmd.get_program()));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tool is on PATH and runs (`tool --version`).
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// What one `mpirun` gave.
pub struct Run {
    pub label: String,
    pub ok: bool,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Everything, for a failure message (the stderr tail only).
    pub fn report(&self) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        format!(
            "---- {} ({}) ----\n[stdout]\n{}\n[stderr, last 60 lines]\n{}\n",
            self.label,
            if self.timed_out {
                "TIMED OUT"
            } else if self.ok {
                "exit 0"
            } else {
                "FAILED"
            },
            self.stdout,
            tail
        )
    }

    /// The intercepted calls the shim's log says went to gpucoll.
    pub fn routed_to_gpucoll(&self) -> Vec<String> {
        self.routed_via("gpucoll")
    }

    /// The intercepted calls the shim's log says took `route` (`gpucoll`,
    /// `staged`, `pmpi`, `refused`).
    pub fn routed_via(&self, route: &str) -> Vec<String> {
        let arrow = format!("-> {route} ");
        let mut calls: Vec<String> = self
            .stderr
            .lines()
            .filter(|l| l.contains("gpucoll_mpi[") && l.contains(&arrow))
            .filter_map(|l| {
                let after = l.split_once("]: ")?.1;
                Some(after.split_once(" ->")?.0.trim().to_string())
            })
            .collect();
        calls.sort();
        calls.dedup();
        calls
    }

    /// The intercepted calls the shim's log says took `route` ("staged",
    /// "gpucoll", ...).
    pub fn routed(&self, route: &str) -> Vec<String> {
        let arrow = format!(" -> {route} ");
        let mut calls: Vec<String> = self
            .stderr
            .lines()
            .filter(|l| l.contains("gpucoll_mpi[") && l.contains(&arrow))
            .filter_map(|l| {
                Some(
                    l.split_once("]: ")?
                        .1
                        .split_once(" ->")?
                        .0
                        .trim()
                        .to_string(),
                )
            })
            .collect();
        calls.sort();
        calls.dedup();
        calls
    }

    /// Lines the shim logged at all.
    pub fn shim_log_lines(&self) -> usize {
        self.stderr
            .lines()
            .filter(|l| l.contains("gpucoll_mpi["))
            .count()
    }
}

/// `mpirun -n np <program args>` in `mode`, serialized, under `limit`.
pub fn mpirun(mode: Mode, np: usize, program: &[String], limit: Duration) -> Run {
    mpirun_env(mode, np, program, limit, &[])
}

/// [`mpirun`] with variables `extra` set for the ranks (over the defaults).
pub fn mpirun_env(
    mode: Mode,
    np: usize,
    program: &[String],
    limit: Duration,
    extra: &[(&str, &str)],
) -> Run {
    let _one_at_a_time = serial();
    let mut label = format!(
        "{} -n {np} {}",
        mode.name(),
        program
            .iter()
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (k, v) in extra {
        label.push_str(&format!(" {k}={v}"));
    }
    let dir = build_dir();
    let tag = format!("{}-{}", std::process::id(), unique());
    let out_path = dir.join(format!("run-{tag}.out"));
    let err_path = dir.join(format!("run-{tag}.err"));
    let out = std::fs::File::create(&out_path).expect("create stdout file");
    let err = std::fs::File::create(&err_path).expect("create stderr file");
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
    ])
    .arg(np.to_string());
    // A deterministic environment: no inherited shim or gpucoll settings.
    for (k, _) in std::env::vars() {
        if k.starts_with("GPUCOLL_") || k == "LD_PRELOAD" {
            cmd.env_remove(&k);
        }
    }
    let mut env: Vec<(String, String)> = vec![
        ("GPUCOLL_BACKEND".into(), "host".into()),
        ("GPUCOLL_TIMEOUT".into(), "60".into()),
    ];
    env.extend(mode.env().into_iter().map(|(k, v)| (k.into(), v.into())));
    for (k, v) in extra {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v.to_string()));
    }
    for (k, v) in &env {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    if matches!(
        mode,
        Mode::Preload | Mode::ShimOn | Mode::Passthrough | Mode::Host
    ) {
        // -x VAR=value reaches the ranks only, not mpirun and its daemons.
        cmd.arg("-x")
            .arg(format!("LD_PRELOAD={}", shim_library().display()));
    }
    cmd.args(program)
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0);
    let t0 = Instant::now();
    let (ok, timed_out) = match cmd.spawn() {
        Ok(mut child) => wait_or_kill(&mut child, limit),
        Err(e) => panic!("cannot start mpirun: {e} (install Open MPI: scripts/setup.sh)"),
    };
    let read = |p: &Path| {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(p) {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        let _ = std::fs::remove_file(p);
        s
    };
    let run = Run {
        label,
        ok,
        timed_out,
        stdout: read(&out_path),
        stderr: read(&err_path),
    };
    eprintln!(
        "    {} : {} in {:.1} s",
        run.label,
        if run.ok { "ok" } else { "FAILED" },
        t0.elapsed().as_secs_f64()
    );
    run
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// (exited 0, timed out)
fn wait_or_kill(child: &mut std::process::Child, limit: Duration) -> (bool, bool) {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return (st.success(), false),
            Ok(None) => {}
            Err(_) => return (false, false),
        }
        if Instant::now() > deadline {
            let group = child.id() as i32;
            // SAFETY: signals the process group this function's caller
            // created for mpirun (process_group(0)); no memory is involved.
            unsafe { libc::kill(-group, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(3));
            // SAFETY: as above.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
            return (false, true);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Collects failures across the runs of one test and panics once at the end.
#[derive(Default)]
pub struct Verdict {
    failures: Vec<String>,
}

impl Verdict {
    pub fn fail(&mut self, why: impl Into<String>) {
        self.failures.push(why.into());
    }

    pub fn check(&mut self, cond: bool, why: impl FnOnce() -> String) {
        if !cond {
            self.failures.push(why());
        }
    }

    pub fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{} failure(s):\n{}",
                self.failures.len(),
                self.failures.join("\n")
            );
        }
    }
}

/// The last line of a shim test program: "N passed, M failed".
pub fn summary(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.ends_with(" failed") && l.contains(" passed, "))?;
    let (p, f) = line.split_once(" passed, ")?;
    Some((
        p.trim().parse().ok()?,
        f.trim_end_matches(" failed").trim().parse().ok()?,
    ))
}

/// The blocking collectives whose calls the programs make on predefined
/// types and ops: in host routing mode, each must be logged as routed to
/// gpucoll.
pub const BLOCKING_ROUTED: &[&str] = &[
    "MPI_Allreduce",
    "MPI_Reduce",
    "MPI_Bcast",
    "MPI_Allgather",
    "MPI_Reduce_scatter_block",
    "MPI_Alltoall",
    "MPI_Gather",
    "MPI_Scatter",
];

/// In the host routing modes, each of `required` must be logged as taking
/// `route`.
pub fn check_routed(v: &mut Verdict, run: &Run, route: &str, required: &[&str]) {
    let routed = run.routed(route);
    let missing: Vec<&&str> = required
        .iter()
        .filter(|c| !routed.iter().any(|r| r == **c))
        .collect();
    if !missing.is_empty() {
        v.fail(format!(
            "{}: GPUCOLL_SHIM_LOG shows no '{route}' route for {missing:?} (those: {routed:?})\n{}",
            run.label,
            run.report()
        ));
    }
}

/// Checks every run of a self-checking program must pass: exit 0, a
/// summary with passes and no failures, and in the routing modes (with more
/// than one rank: a shim may leave single-rank communicators to MPI) the
/// `required` calls logged as sent to gpucoll; in passthrough, no shim log.
pub fn check_program_run(v: &mut Verdict, run: &Run, mode: Mode, np: usize, required: &[&str]) {
    let mut bad = Vec::new();
    if !run.ok {
        bad.push("did not exit 0".to_string());
    }
    match summary(&run.stdout) {
        Some((p, 0)) if p > 0 => {}
        Some((p, f)) => bad.push(format!("summary says {p} passed, {f} failed")),
        None => bad.push("no 'N passed, M failed' line".into()),
    }
    if mode.routes_host() && np > 1 {
        let routed = run.routed_to_gpucoll();
        let missing: Vec<&&str> = required
            .iter()
            .filter(|c| !routed.iter().any(|r| r == **c))
            .collect();
        if !missing.is_empty() {
            bad.push(format!(
                "GPUCOLL_SHIM_LOG shows no route to gpucoll for {missing:?} (routed: {routed:?})"
            ));
        }
    }
    if mode == Mode::Passthrough && run.shim_log_lines() > 0 {
        bad.push(format!(
            "GPUCOLL_SHIM=0 must be a passthrough, but the shim logged {} routing lines",
            run.shim_log_lines()
        ));
    }
    if !bad.is_empty() {
        v.fail(format!(
            "{}: {}\n{}",
            run.label,
            bad.join("; "),
            run.report()
        ));
    }
}

/// In the routing modes (with more than one rank), the shim's log must show
/// each of `calls` taking `route` at least once (`staged`: the host copies
/// of host test mode stand for device memory's).
pub fn check_routes(
    v: &mut Verdict,
    run: &Run,
    mode: Mode,
    np: usize,
    route: &str,
    calls: &[&str],
) {
    if !mode.routes_host() || np < 2 || calls.is_empty() {
        return;
    }
    let seen = run.routed_via(route);
    let missing: Vec<&&str> = calls
        .iter()
        .filter(|c| !seen.iter().any(|r| r == **c))
        .collect();
    if !missing.is_empty() {
        v.fail(format!(
            "{}: GPUCOLL_SHIM_LOG shows no '-> {route}' for {missing:?} (seen: {seen:?})",
            run.label
        ));
    }
}
