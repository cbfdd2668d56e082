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
        "coll_staged" | "errors" | "failure" => &["MPI_Allreduce"],
        "crossed" => &["MPI_Allreduce", "MPI_Iallreduce"],
        "requests" => &["MPI_Iallreduce"],
        // Equal counts: gpucoll's reduce_scatter_block and all_gather.
        "coll_scan" => &["MPI_Ireduce_scatter"],
        "coll_nonblocking_v" => &["MPI_Iallgatherv"],
        _ => &[],
    }
}

/// The calls each program makes that the routing modes must log as staged
/// (host buffers staged as device buffers are, in host test mode) or, for
/// one-sided and MPI-IO calls, refused.
fn staged_calls(name: &str) -> (&'static str, &'static [&'static str]) {
    match name {
        "p2p" => (
            "staged",
            &[
                "MPI_Send",
                "MPI_Ssend",
                "MPI_Bsend",
                "MPI_Rsend",
                "MPI_Recv",
                "MPI_Isend",
                "MPI_Issend",
                "MPI_Ibsend",
                "MPI_Irecv",
                "MPI_Sendrecv",
                "MPI_Sendrecv_replace",
                "MPI_Mrecv",
                "MPI_Imrecv",
            ],
        ),
        "p2p_persistent" => (
            "staged",
            &[
                "MPI_Send_init",
                "MPI_Ssend_init",
                "MPI_Bsend_init",
                "MPI_Rsend_init",
                "MPI_Recv_init",
                "MPI_Start",
                "MPI_Irecv",
                "MPI_Isend",
                "MPI_Recv",
                "MPI_Mrecv",
                "MPI_Imrecv",
                "MPI_Sendrecv",
            ],
        ),
        // The _c forms log under the C name they narrow to.
        "p2p_large" => (
            "staged",
            &[
                "MPI_Send",
                "MPI_Ssend",
                "MPI_Bsend",
                "MPI_Rsend",
                "MPI_Recv",
                "MPI_Isend",
                "MPI_Issend",
                "MPI_Ibsend",
                "MPI_Irsend",
                "MPI_Irecv",
                "MPI_Send_init",
                "MPI_Ssend_init",
                "MPI_Bsend_init",
                "MPI_Rsend_init",
                "MPI_Recv_init",
                "MPI_Start",
                "MPI_Sendrecv",
                "MPI_Sendrecv_replace",
                "MPI_Mrecv",
                "MPI_Imrecv",
            ],
        ),
        "coll_scan" => (
            "staged",
            &[
                "MPI_Scan",
                "MPI_Exscan",
                "MPI_Iscan",
                "MPI_Iexscan",
                "MPI_Ireduce_scatter",
            ],
        ),
        "coll_alltoallw" => ("staged", &["MPI_Alltoallw", "MPI_Ialltoallw"]),
        "coll_neighbor" => (
            "staged",
            &[
                "MPI_Neighbor_allgather",
                "MPI_Neighbor_allgatherv",
                "MPI_Neighbor_alltoall",
                "MPI_Neighbor_alltoallv",
                "MPI_Neighbor_alltoallw",
                "MPI_Ineighbor_allgather",
                "MPI_Ineighbor_allgatherv",
                "MPI_Ineighbor_alltoall",
                "MPI_Ineighbor_alltoallv",
                "MPI_Ineighbor_alltoallw",
            ],
        ),
        "coll_nonblocking_v" => (
            "staged",
            &[
                "MPI_Iallgatherv",
                "MPI_Ialltoallv",
                "MPI_Igatherv",
                "MPI_Iscatterv",
            ],
        ),
        "local_ops" => (
            "staged",
            &[
                "MPI_Reduce_local",
                "MPI_Pack",
                "MPI_Unpack",
                "MPI_Pack_external",
                "MPI_Unpack_external",
            ],
        ),
        "onesided_io" => (
            "refused",
            &[
                "MPI_Win_create",
                "MPI_Win_attach",
                "MPI_Put",
                "MPI_Get",
                "MPI_Accumulate",
                "MPI_Get_accumulate",
                "MPI_Fetch_and_op",
                "MPI_Compare_and_swap",
                "MPI_Rput",
                "MPI_Rget",
                "MPI_Raccumulate",
                "MPI_Rget_accumulate",
                "MPI_File_write_at",
                "MPI_File_read_at",
                "MPI_File_iwrite_at",
                "MPI_File_iread_at",
                "MPI_File_write_all",
                "MPI_File_read_all",
                "MPI_File_write_ordered",
                "MPI_File_read_shared",
            ],
        ),
        _ => ("staged", &[]),
    }
}

/// Run `name` in each (mode, rank counts, extra arguments).
fn run_matrix(name: &str, runs: &[(Mode, &[usize], &[&str])], limit_s: u64) {
    run_matrix_env(name, runs, limit_s, &[]);
}

/// [`run_matrix`] with variables `env` set for the ranks.
fn run_matrix_env(
    name: &str,
    runs: &[(Mode, &[usize], &[&str])],
    limit_s: u64,
    env: &[(&str, &str)],
) {
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
            let run = mpirun_env(*mode, np, &cmd, Duration::from_secs(limit_s), env);
            check_program_run(&mut v, &run, *mode, np, routed_calls(name));
            let (route, calls) = staged_calls(name);
            check_routes(&mut v, &run, *mode, np, route, calls);
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

#[test]
fn p2p_persistent() {
    run_matrix(
        "p2p_persistent",
        &[
            (Mode::Plain, &[1, 2, 3], &["--large", "262144"]),
            (Mode::Host, &[1, 2, 3, 4], &["--large", "262144"]),
            (Mode::Preload, &[2], &[]),
            (Mode::Passthrough, &[3], &[]),
            (Mode::Linked, &[2], &[]),
        ],
        180,
    );
}

#[test]
fn intercomm() {
    run_matrix(
        "intercomm",
        &[
            (Mode::Plain, &[3], &[]),
            (Mode::Plain, &[2, 4], &["--quick"]),
            (Mode::Host, &[3, 4], &[]),
            (Mode::Host, &[2], &["--quick"]),
            (Mode::Preload, &[3], &["--quick"]),
            (Mode::ShimOn, &[4], &["--quick"]),
            (Mode::Passthrough, &[2], &["--quick"]),
            (Mode::Linked, &[3], &["--quick"]),
        ],
        180,
    );
}

// The large-count forms exist only with the shim (Open MPI 4.1 has none).

#[test]
fn p2p_large() {
    run_matrix(
        "p2p_large",
        &[
            (Mode::Host, &[1, 2, 3], &[]),
            (Mode::Preload, &[2], &[]),
            (Mode::ShimOn, &[3], &[]),
            (Mode::Linked, &[2], &[]),
        ],
        120,
    );
}

/// Disagreeing ranks under a short GPUCOLL_TIMEOUT (each case waits for it
/// once or twice): an error on every rank, never a hang.
#[test]
fn failure() {
    run_matrix_env(
        "failure",
        &[
            (Mode::Plain, &[2, 3], &[]),
            (Mode::Host, &[2, 3, 4], &[]),
            (Mode::Preload, &[2], &[]),
            (Mode::Linked, &[3], &[]),
        ],
        120,
        &[("GPUCOLL_TIMEOUT", "2")],
    );
}

/// A panic inside the shim is MPI_ERR_INTERN, never an unwind into C.
#[test]
fn panics_become_errors() {
    run_matrix_env(
        "failure",
        &[(Mode::Host, &[2], &[]), (Mode::Linked, &[3], &[])],
        60,
        &[(
            "GPUCOLL_SHIM_PANIC",
            "MPI_Bcast,MPI_Iallreduce,MPI_Send,MPI_Wait",
        )],
    );
}

#[test]
fn large_count_collectives() {
    run_matrix(
        "large_count",
        &[
            (Mode::Host, &[1, 2, 3, 4], &[]),
            (Mode::Preload, &[2], &[]),
            (Mode::Linked, &[3], &[]),
        ],
        120,
    );
}

#[test]
fn crossed() {
    run_matrix(
        "crossed",
        &[
            (Mode::Plain, &[2, 3, 4], FULL),
            (Mode::Host, &[2, 3, 4], FULL),
            (Mode::Preload, &[2], QUICK),
            (Mode::ShimOn, &[3], QUICK),
            (Mode::Linked, &[3], QUICK),
        ],
        180,
    );
}

#[test]
fn requests() {
    run_matrix(
        "requests",
        &[
            (Mode::Plain, &[2, 3], &[]),
            (Mode::Host, &[1, 2, 3, 4], &[]),
            (Mode::Preload, &[2], &[]),
            (Mode::Passthrough, &[2], &[]),
            (Mode::Linked, &[3], &[]),
        ],
        120,
    );
}

#[test]
fn coll_scan() {
    run_matrix(
        "coll_scan",
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
        180,
    );
}

#[test]
fn coll_alltoallw() {
    run_matrix(
        "coll_alltoallw",
        &[
            (Mode::Plain, &[1, 2, 3, 4], FULL),
            (Mode::Host, &[1, 2, 3, 4], FULL),
            (Mode::Preload, &[3], FULL),
            (Mode::ShimOn, &[2], FULL),
            (Mode::Passthrough, &[4], FULL),
            (Mode::Linked, &[3], FULL),
        ],
        180,
    );
}

#[test]
fn coll_neighbor() {
    run_matrix(
        "coll_neighbor",
        &[
            (Mode::Plain, &[1, 2, 3, 4], FULL),
            (Mode::Host, &[1, 2, 3, 4], FULL),
            (Mode::Preload, &[4], FULL),
            (Mode::ShimOn, &[3], FULL),
            (Mode::Passthrough, &[2], FULL),
            (Mode::Linked, &[3], FULL),
        ],
        180,
    );
}

/// `--host-test-mode`: in host test mode a nonblocking collective on gpucoll
/// runs at once, so the program leaves out its check that a rank waiting
/// for one lets a peer's barrier progress (that needs a GPU).
#[test]
fn coll_nonblocking_v() {
    const HOST_FULL: &[&str] = &["--large", "65536", "--host-test-mode"];
    const HOST_QUICK: &[&str] = &["--quick", "--large", "8192", "--host-test-mode"];
    run_matrix(
        "coll_nonblocking_v",
        &[
            (Mode::Plain, &[2, 3], FULL),
            (Mode::Plain, &[1, 4], QUICK),
            (Mode::Host, &[2, 3, 4], HOST_FULL),
            (Mode::Host, &[1], HOST_QUICK),
            (Mode::Preload, &[3], QUICK),
            (Mode::ShimOn, &[2], QUICK),
            (Mode::Passthrough, &[4], QUICK),
            (Mode::Linked, &[2], HOST_QUICK),
        ],
        180,
    );
}

#[test]
fn local_ops() {
    run_matrix(
        "local_ops",
        &[
            (Mode::Plain, &[1, 2], FULL),
            (Mode::Host, &[1, 2, 3], FULL),
            (Mode::Preload, &[2], QUICK),
            (Mode::ShimOn, &[1], QUICK),
            (Mode::Passthrough, &[2], QUICK),
            (Mode::Linked, &[3], QUICK),
        ],
        180,
    );
}

/// MPI_IN_PLACE where MPI does not allow it: Open MPI's own error in every
/// mode; where a shim runs, also the calls Open MPI would crash in.
#[test]
fn inplace_misuse() {
    let guards: &[&str] = &["--shim-guards"];
    run_matrix(
        "inplace_misuse",
        &[
            (Mode::Plain, &[1, 2, 3, 4], &[]),
            (Mode::Passthrough, &[2], &[]),
            (Mode::Host, &[1, 2, 3, 4], guards),
            (Mode::Preload, &[3], guards),
            (Mode::ShimOn, &[2], guards),
            (Mode::Linked, &[4], guards),
        ],
        120,
    );
}

/// One-sided and MPI-IO calls on the program's buffers: MPI's own on host
/// memory; refused in host test mode, where host buffers count as device
/// buffers (as on a GPU with --device).
#[test]
fn onesided_io() {
    let refused: &[&str] = &["--expect-refused"];
    run_matrix_env(
        "onesided_io",
        &[
            (Mode::Plain, &[1, 2, 3, 4], &[]),
            (Mode::Preload, &[2, 3], &[]),
            (Mode::ShimOn, &[4], &[]),
            (Mode::Passthrough, &[2], &[]),
            (Mode::Host, &[1, 2, 3, 4], refused),
            (Mode::Linked, &[3], refused),
        ],
        120,
        &[("GPUCOLL_SHIM_HOST_REFUSE", "1")],
    );
}
