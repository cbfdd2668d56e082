//! Compiles `csrc/handles.c` with the MPI compiler wrapper (`$MPICC` or
//! `mpicc`) into a static archive: the MPI handles, `MPI_IN_PLACE` and
//! `MPI_COMM_NULL_COPY_FN` of the `mpi.h` the shim is built against
//! (mpi-sys exports neither the sentinels nor most predefined datatypes).

use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{shown} failed with {s}"),
        Err(e) => panic!("cannot run {shown}: {e} (is the MPI compiler wrapper installed?)"),
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/handles.c");
    println!("cargo:rerun-if-env-changed=MPICC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".into());
    let obj = out.join("handles.o");
    run(Command::new(&mpicc)
        .args(["-c", "-fPIC", "-O2", "-o"])
        .arg(&obj)
        .arg("csrc/handles.c"));
    let lib = out.join("libgcshim_handles.a");
    let _ = std::fs::remove_file(&lib);
    run(Command::new("ar").arg("crs").arg(&lib).arg(&obj));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=gcshim_handles");
}
