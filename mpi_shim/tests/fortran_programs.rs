//! The Fortran test programs (`tests/fortran/*.f90`: mpif.h, `use mpi` and
//! `use mpi_f08` callers of the shim's Fortran entry points) built with
//! mpif90 and run like the C programs: without the shim, preloaded, with
//! GPUCOLL_SHIM_HOST=1 (their calls logged as routed to gpucoll) and linked
//! ahead of MPI. Each program prints "N passed, M failed" last. Built with
//! -fallow-argument-mismatch: gfortran >= 10 rejects mpif.h programs that
//! pass buffers of several types to one routine otherwise.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

/// (plain, linked) executables of every program, sorted by name.
fn programs() -> Vec<(String, String, String)> {
    assert!(
        have("mpif90"),
        "mpif90 does not run: install gfortran (scripts/setup.sh)"
    );
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fortran");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "f90"))
                .collect()
        })
        .unwrap_or_default();
    sources.sort();
    assert!(
        !sources.is_empty(),
        "no Fortran test programs in {}",
        dir.display()
    );
    let out = build_dir().join("fortran");
    std::fs::create_dir_all(&out).expect("create the Fortran build directory");
    let lib = shim_library();
    let libdir = lib.parent().expect("library directory");
    sources
        .iter()
        .map(|src| {
            let name = src.file_stem().unwrap().to_string_lossy().to_string();
            let plain = out.join(&name);
            let linked = out.join(format!("{name}-linked"));
            // Each program in its own module directory (use mpi_f08 modules).
            let mods = out.join(format!("{name}.mod.d"));
            std::fs::create_dir_all(&mods).expect("module directory");
            build(
                Command::new("mpif90")
                    .args(["-O1", "-fallow-argument-mismatch", "-o"])
                    .arg(&plain)
                    .arg(format!("-J{}", mods.display()))
                    .arg(src),
                &format!("mpif90 {name}.f90"),
            );
            build(
                Command::new("mpif90")
                    .args(["-O1", "-fallow-argument-mismatch", "-o"])
                    .arg(&linked)
                    .arg(format!("-J{}", mods.display()))
                    .arg(src)
                    .arg(format!("-L{}", libdir.display()))
                    .arg("-lgpucoll_mpi")
                    .arg(format!("-Wl,-rpath,{}", libdir.display())),
                &format!("mpif90 {name}.f90 -lgpucoll_mpi"),
            );
            (
                name,
                plain.display().to_string(),
                linked.display().to_string(),
            )
        })
        .collect()
}

/// The C calls the Fortran point-to-point programs' calls must reach (logged
/// as staged in host routing mode): Open MPI's own Fortran wrappers would
/// call `PMPI_` and bypass the shim.
fn staged_calls(name: &str) -> &'static [&'static str] {
    match name {
        "p2p" => &[
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
            "MPI_Sendrecv",
            "MPI_Sendrecv_replace",
            "MPI_Mrecv",
            "MPI_Imrecv",
            "MPI_Send_init",
            "MPI_Ssend_init",
            "MPI_Bsend_init",
            "MPI_Rsend_init",
            "MPI_Recv_init",
            "MPI_Start",
        ],
        "p2p_f08" => &[
            "MPI_Send",
            "MPI_Recv",
            "MPI_Isend",
            "MPI_Irecv",
            "MPI_Sendrecv",
            "MPI_Mrecv",
            "MPI_Send_init",
            "MPI_Recv_init",
            "MPI_Start",
        ],
        _ => &[],
    }
}

#[test]
fn fortran_programs() {
    let mut v = Verdict::default();
    let runs: &[(Mode, &[usize])] = &[
        (Mode::Plain, &[1, 2, 3]),
        (Mode::Preload, &[2]),
        (Mode::ShimOn, &[3]),
        (Mode::Passthrough, &[2]),
        (Mode::Host, &[1, 2, 3, 4]),
        (Mode::Linked, &[2, 3]),
    ];
    for (name, plain, linked) in programs() {
        for (mode, nps) in runs {
            for &np in nps.iter() {
                let exe = if *mode == Mode::Linked {
                    &linked
                } else {
                    &plain
                };
                // conformance.f90 expects the one-sided and MPI-IO refusals
                // in host test mode.
                let run = mpirun_env(
                    *mode,
                    np,
                    std::slice::from_ref(exe),
                    Duration::from_secs(180),
                    &[("GPUCOLL_SHIM_HOST_REFUSE", "1")],
                );
                // Fortran's calls are logged under their own names; any
                // collective routed to gpucoll shows the entry points work.
                check_program_run(&mut v, &run, *mode, np, &[]);
                if mode.routes_host() && np > 1 {
                    check_routed(&mut v, &run, "staged", staged_calls(&name));
                }
                if mode.routes_host() && np > 1 && run.routed_to_gpucoll().is_empty() {
                    v.fail(format!(
                        "{}: GPUCOLL_SHIM_HOST=1 but no call was routed to gpucoll\n{}",
                        run.label,
                        run.report()
                    ));
                }
            }
        }
    }
    v.finish();
}
