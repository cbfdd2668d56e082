//! The shim's C test programs (`tests/c/*.c`, ordinary MPI programs that
//! check themselves) under `mpirun -n 1..4`, without the shim and in every
//! way of using it; see `support/mod.rs` for the modes.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use support::*;

const SUPPORT_SOURCES: [&str; 3] = ["shimtest.c", "shimtest_vals.c", "shimtest_dev.c"];

/// Build `tests/c/<name>.c` twice: plain, and linked ahead of MPI.
fn program(name: &str) -> (String, String) {
    static BUILT: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let dir = build_dir();
    let plain = dir.join(name);
    let linked = dir.join(format!("{name}-linked"));
    let done = BUILT.get_or_init(Default::default);
    let mut done = done.lock().unwrap_or_else(|p| p.into_inner());
    if !done.iter().any(|d| d == name) {
        assert!(
            have("mpicc"),
            "mpicc not found: install Open MPI's development package (scripts/setup.sh)"
        );
        let sources: Vec<PathBuf> = std::iter::once(format!("{name}.c"))
            .chain(SUPPORT_SOURCES.iter().map(|s| s.to_string()))
            .map(|s| src.join(s))
            .collect();
        let mut cc = Command::new("mpicc");
        cc.args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&plain)
            .args(&sources);
        build(&mut cc, &format!("mpicc {name}.c"));
        let lib = shim_library();
        let libdir = lib.parent().expect("library directory");
        let mut cc = Command::new("mpicc");
        cc.args(["-O2", "-o"])
            .arg(&linked)
            .args(&sources)
            .arg(format!("-L{}", libdir.display()))
            .arg("-lgpucoll_mpi")
            .arg(format!("-Wl,-rpath,{}", libdir.display()));
        build(&mut cc, &format!("mpicc {name}.c -lgpucoll_mpi"));
        done.push(name.to_string());
    }
    (plain.display().to_string(), linked.display().to_string())
}

/// The calls each program makes that the routing modes must log as sent to
/// gpucoll.
fn routed_calls(name: &str) -> &'static [&'static str] {
    match name {
        "coll_blocking" => BLOCKING_ROUTED,
        "coll_nonblocking" => &[
            "MPI_Iallreduce",
            "MPI_Ireduce",
            "MPI_Ibcast",
            "MPI_Iallgather",
            "MPI_Ireduce_scatter_block",
            "MPI_Ialltoall",
            "MPI_Igather",
            "MPI_Iscatter",
        ],
        "coll_staged" | "errors" => &["MPI_Allreduce"],
        _ => &[],
    }
}

/// Run `name` in each (mode, rank counts, extra arguments).
fn run_matrix(name: &str, runs: &[(Mode, &[usize], &[&str])], limit_s: u64) {
    let (plain, linked) = program(name);
    let mut v = Verdict::default();
    for (mode, nps, args) in runs {
        for &np in nps.iter() {
            let exe = if *mode == Mode::Linked {
                &linked
            } else {
                &plain
            };
            let mut cmd = vec![exe.clone()];
            cmd.extend(args.iter().map(|a| a.to_string()));
            let run = mpirun(*mode, np, &cmd, Duration::from_secs(limit_s));
            check_program_run(&mut v, &run, *mode, np, routed_calls(name));
        }
    }
    v.finish();
}

const FULL: &[&str] = &["--large", "65536"];
const QUICK: &[&str] = &["--quick", "--large", "8192"];

// Each program runs on 1..4 ranks without the shim and with host routing
// (the modes that exercise gpucoll), and once or twice in each other mode;
// the full datatype x op matrix where it matters, `--quick` elsewhere, so
// that the whole shim suite stays within a few minutes on 2 cores.

#[test]
fn coll_blocking() {
    run_matrix(
        "coll_blocking",
        &[
            (Mode::Plain, &[3], FULL),
            (Mode::Plain, &[1, 2, 4], QUICK),
            (Mode::Host, &[2, 3], FULL),
            (Mode::Host, &[1, 4], QUICK),
            (Mode::Preload, &[2], QUICK),
            (Mode::ShimOn, &[3], QUICK),
            (Mode::Passthrough, &[2], QUICK),
            (Mode::Linked, &[4], QUICK),
        ],
        240,
    );
}

#[test]
fn coll_nonblocking() {
    run_matrix(
        "coll_nonblocking",
        &[
            (Mode::Plain, &[1, 2, 3, 4], FULL),
            (Mode::Host, &[1, 2, 3, 4], FULL),
            (Mode::Preload, &[2], FULL),
            (Mode::ShimOn, &[4], FULL),
            (Mode::Passthrough, &[3], FULL),
            (Mode::Linked, &[2], FULL),
        ],
        180,
    );
}

#[test]
fn coll_vector() {
    run_matrix(
        "coll_vector",
        &[
            (Mode::Plain, &[2, 3], FULL),
            (Mode::Plain, &[1, 4], QUICK),
            (Mode::Host, &[2, 3], FULL),
            (Mode::Host, &[1, 4], QUICK),
            (Mode::Preload, &[3], QUICK),
            (Mode::ShimOn, &[2], QUICK),
            (Mode::Passthrough, &[4], QUICK),
            (Mode::Linked, &[3], QUICK),
        ],
        180,
    );
}

#[test]
fn coll_staged() {
    run_matrix(
        "coll_staged",
        &[
            (Mode::Plain, &[1, 2, 3, 4], FULL),
            (Mode::Host, &[1, 2, 3, 4], FULL),
            (Mode::Preload, &[2], FULL),
            (Mode::ShimOn, &[3], FULL),
            (Mode::Passthrough, &[2], FULL),
            (Mode::Linked, &[4], FULL),
        ],
        180,
    );
}

#[test]
fn errors() {
    run_matrix(
        "errors",
        &[
            (Mode::Plain, &[1, 3], &[]),
            (Mode::Host, &[1, 2, 3, 4], &[]),
            (Mode::Preload, &[2], &[]),
            (Mode::ShimOn, &[2], &[]),
            (Mode::Passthrough, &[2], &[]),
            (Mode::Linked, &[3], &[]),
        ],
        120,
    );
}

#[test]
fn finalize_with_pending_requests() {
    let args: &[&str] = &["--finalize-pending"];
    run_matrix(
        "errors",
        &[
            (Mode::Plain, &[2], args),
            (Mode::Host, &[1, 2, 4], args),
            (Mode::Preload, &[3], args),
            (Mode::Linked, &[2], args),
        ],
        120,
    );
}

#[test]
fn p2p() {
    run_matrix(
        "p2p",
        &[
            (Mode::Plain, &[1, 2, 3], &["--large", "2097152"]),
            (Mode::Host, &[1, 2, 3, 4], &["--large", "2097152"]),
            (Mode::Preload, &[2], &[]),
            (Mode::Passthrough, &[2], &[]),
            (Mode::Linked, &[3], &[]),
        ],
        180,
    );
}
