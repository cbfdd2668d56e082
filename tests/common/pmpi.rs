//! The `pmpi::` cases: run ordinary scenarios with `pmpi_trap.c` preloaded,
//! a library whose `MPI_*` functions (every one gpucoll uses) kill the
//! process. They pass only while gpucoll calls MPI through `PMPI_` names.

use std::process::Command;

/// The variable that tells a worker the trap must be loaded.
const TRAP_VAR: &str = "GPUCOLL_TEST_PMPI_TRAP";

/// The environment of a trapped case: `LD_PRELOAD` of the trap library,
/// compiled here with `cc` by the launcher (workers get it from mpirun).
/// When it cannot be built, the preload names a missing file and the
/// worker's [`check_trap`] fails the case.
pub fn trap_env() -> Vec<(String, String)> {
    let mut lib = String::from("/nonexistent/gpucoll-pmpi-trap.so");
    if std::env::var("GPUCOLL_TEST_WORKER").is_err() {
        let out = std::env::temp_dir().join(format!("gpucoll-pmpi-trap-{}.so", std::process::id()));
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/pmpi_trap.c");
        match Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&out)
            .arg(src)
            .status()
        {
            Ok(s) if s.success() => lib = out.display().to_string(),
            other => eprintln!("cannot build the PMPI trap library with cc: {other:?}"),
        }
    }
    vec![("LD_PRELOAD".into(), lib), (TRAP_VAR.into(), "1".into())]
}

/// In a worker of a trapped case: the trap library must really be loaded,
/// otherwise the case would pass without testing anything.
pub fn check_trap() -> Result<(), String> {
    if std::env::var(TRAP_VAR).is_err() {
        return Ok(());
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks
    // the symbol up; the pointer is compared with null, never called.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"gpucoll_pmpi_trap_loaded".as_ptr()) };
    if sym.is_null() {
        Err("the PMPI trap library is not preloaded (LD_PRELOAD did not take)".into())
    } else {
        Ok(())
    }
}
