//! The "outside" check: `outside/dft_heat.c`, an MPI program written
//! without the shim in mind (a modular 2D DFT with MPI_Alltoall transposes
//! and an exact heat equation, on host buffers), must print byte-identical
//! output without the shim, preloaded, with GPUCOLL_SHIM=1 and =0, with
//! GPUCOLL_SHIM_HOST=1 (its collectives then run on gpucoll) and linked.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

fn build_program() -> (String, String) {
    assert!(have("mpicc"), "mpicc not found (scripts/setup.sh)");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/outside/dft_heat.c");
    let dir = build_dir();
    let plain = dir.join("dft_heat");
    let linked = dir.join("dft_heat-linked");
    build(
        Command::new("mpicc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&plain)
            .arg(&src),
        "mpicc dft_heat.c",
    );
    let lib = shim_library();
    let libdir = lib.parent().expect("library directory");
    build(
        Command::new("mpicc")
            .args(["-O2", "-o"])
            .arg(&linked)
            .arg(&src)
            .arg(format!("-L{}", libdir.display()))
            .arg("-lgpucoll_mpi")
            .arg(format!("-Wl,-rpath,{}", libdir.display())),
        "mpicc dft_heat.c -lgpucoll_mpi",
    );
    (plain.display().to_string(), linked.display().to_string())
}

#[test]
fn same_output_in_every_mode() {
    let (plain, linked) = build_program();
    let mut v = Verdict::default();
    for np in [1usize, 2, 3, 4] {
        let reference = mpirun(
            Mode::Plain,
            np,
            std::slice::from_ref(&plain),
            Duration::from_secs(120),
        );
        if !reference.ok
            || !reference
                .stdout
                .contains("inverse gives the input back: yes")
        {
            v.fail(format!(
                "the program fails without the shim:\n{}",
                reference.report()
            ));
            continue;
        }
        let modes: &[Mode] = if np == 1 || np == 3 {
            &[Mode::Host, Mode::Linked]
        } else {
            &[
                Mode::Preload,
                Mode::ShimOn,
                Mode::Passthrough,
                Mode::Host,
                Mode::Linked,
            ]
        };
        for &mode in modes {
            let exe = if mode == Mode::Linked {
                &linked
            } else {
                &plain
            };
            let run = mpirun(
                mode,
                np,
                std::slice::from_ref(exe),
                Duration::from_secs(120),
            );
            if !run.ok || run.stdout != reference.stdout {
                v.fail(format!(
                    "{}: output differs from the run without the shim\n[without]\n{}\n{}",
                    run.label,
                    reference.stdout,
                    run.report()
                ));
            }
            if mode.routes_host() && np > 1 {
                let routed = run.routed_to_gpucoll();
                for call in ["MPI_Alltoall", "MPI_Allreduce", "MPI_Bcast"] {
                    v.check(routed.iter().any(|r| r == call), || {
                        format!(
                            "{}: {call} never went to gpucoll (routed: {routed:?})",
                            run.label
                        )
                    });
                }
            }
        }
    }
    v.finish();
}
