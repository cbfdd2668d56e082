//! `python/mpi4py_colls.py` (every collective through mpi4py on NumPy
//! arrays) under `mpirun`, without the shim and in the ways a Python user
//! meets it (preloaded; linking does not apply to an interpreter).
//!
//! The interpreter is `/usr/bin/python3` (Debian's, where `scripts/setup.sh`
//! installs python3-mpi4py and python3-numpy), or `$SHIM_TEST_PYTHON`.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

fn python() -> String {
    let py = std::env::var("SHIM_TEST_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
    let probe = Command::new(&py)
        .args(["-c", "import mpi4py.MPI, numpy"])
        .output();
    match probe {
        Ok(o) if o.status.success() => py,
        Ok(o) => panic!(
            "{py} cannot import mpi4py and numpy ({}): run scripts/setup.sh \
             (python3-mpi4py python3-numpy) or set SHIM_TEST_PYTHON",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run {py}: {e}; run scripts/setup.sh or set SHIM_TEST_PYTHON"),
    }
}

/// The nonblocking calls the program makes on top of [`BLOCKING_ROUTED`].
const NONBLOCKING_ROUTED: &[&str] = &["MPI_Iallreduce", "MPI_Ialltoall"];

#[test]
fn mpi4py_numpy() {
    let py = python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/mpi4py_colls.py");
    let script = script.display().to_string();
    let full = vec![py.clone(), script.clone(), "--large".into(), "65536".into()];
    let quick = vec![py, script, "--quick".into(), "--large".into(), "0".into()];
    let runs: &[(Mode, &[usize], &Vec<String>)] = &[
        (Mode::Plain, &[1, 3], &quick),
        (Mode::Plain, &[2], &full),
        (Mode::Host, &[1, 2, 3, 4], &full),
        (Mode::Preload, &[2], &quick),
        (Mode::ShimOn, &[4], &quick),
        (Mode::Passthrough, &[3], &quick),
    ];
    let routed = [BLOCKING_ROUTED, NONBLOCKING_ROUTED].concat();
    let mut v = Verdict::default();
    for (mode, nps, cmd) in runs {
        for &np in nps.iter() {
            let run = mpirun(*mode, np, cmd, Duration::from_secs(240));
            check_program_run(&mut v, &run, *mode, np, &routed);
        }
    }
    v.finish();
}
