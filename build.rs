//! Build script.
//!
//! Without the `cuda` feature it does nothing. With it, it compiles every
//! `kernels/*.cu` into ONE fatbin (SASS for sm_80 and sm_90, PTX for
//! compute_90 so newer GPUs JIT it) in `OUT_DIR/gpucoll_kernels.fatbin`,
//! which `src/backend/cuda` embeds with `include_bytes!`.
//!
//! It also writes `OUT_DIR/abi_layout.rs`: the layout of every struct and
//! the value of every constant of `kernels/gpucoll.cuh` as nvcc sees them,
//! which the tests of `src/backend/cuda/abi.rs` compare field by field with
//! the Rust mirrors (`build/abi_layout.rs`).
//!
//! nvcc is searched in `$NVCC`, `$CUDA_HOME/bin`, `$CUDA_PATH/bin`, `PATH`,
//! then `./.cuda/nvidia/cu13/bin` (the pinned PyPI wheels that
//! `scripts/setup.sh --cuda` installs).

#[path = "build/abi_layout.rs"]
mod abi_layout;

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/abi_layout.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_CUDA");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    build_kernels();
}

fn is_file(p: &Path) -> bool {
    p.is_file()
}

fn find_nvcc(root: &Path) -> Option<PathBuf> {
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-env-changed=PATH");
    if let Some(p) = std::env::var_os("NVCC").map(PathBuf::from) {
        if is_file(&p) {
            return Some(p);
        }
        println!(
            "cargo:warning=NVCC={} does not exist; searching elsewhere",
            p.display()
        );
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            let p = PathBuf::from(home).join("bin").join("nvcc");
            if is_file(&p) {
                return Some(p);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if is_file(&p) {
                return Some(p);
            }
        }
    }
    let p = root.join(".cuda/nvidia/cu13/bin/nvcc");
    if is_file(&p) {
        return Some(p);
    }
    None
}

fn build_kernels() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kdir = root.join("kernels");
    println!("cargo:rerun-if-changed={}", kdir.display());

    let mut sources: Vec<PathBuf> = Vec::new();
    let entries = std::fs::read_dir(&kdir)
        .unwrap_or_else(|e| panic!("feature `cuda`: cannot read {}: {e}", kdir.display()));
    for e in entries.flatten() {
        let p = e.path();
        // Every file: a header included by another header must rebuild too.
        println!("cargo:rerun-if-changed={}", p.display());
        if p.extension().and_then(|x| x.to_str()) == Some("cu") {
            sources.push(p);
        }
    }
    sources.sort();
    if sources.is_empty() {
        panic!(
            "feature `cuda`: no kernels/*.cu found in {}",
            kdir.display()
        );
    }

    let Some(nvcc) = find_nvcc(&root) else {
        panic!(
            "\n\nfeature `cuda` needs nvcc (CUDA 13.0) to compile kernels/*.cu, and none was found \
             in $NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH or ./.cuda/nvidia/cu13/bin.\n\
             Either install the pinned PyPI wheels with `./scripts/setup.sh --cuda` (or by hand:\n  \
             pip install --no-deps --target .cuda nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 \\\n    \
             nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85)\n\
             or point NVCC=/path/to/nvcc at a CUDA toolkit, or build without the feature \
             (`cargo build` without `--features cuda`).\n\n"
        );
    };

    // One relocatable-free compile per .cu file into a fatbin, then merged:
    // with a single source file (the normal case) nvcc writes the fatbin
    // directly.
    let fatbin = out.join("gpucoll_kernels.fatbin");
    let mut cmd = Command::new(&nvcc);
    // --threads 0: the three targets compile in parallel on every core.
    cmd.arg("-fatbin")
        .args(["--threads", "0"])
        .arg("-O3")
        .arg("-std=c++17")
        .arg("-lineinfo")
        .arg("-I")
        .arg(&kdir)
        .args(["-gencode", "arch=compute_80,code=sm_80"])
        .args(["-gencode", "arch=compute_90,code=sm_90"])
        .args(["-gencode", "arch=compute_90,code=compute_90"])
        // Left to itself nvcc stores these images uncompressed (13.8 MB;
        // 2.7 MB compressed): every binary that embeds them grows by that.
        .args(["-Xfatbin", "-compress-all"]);
    if let Some(ccbin) = std::env::var_os("NVCC_CCBIN") {
        cmd.arg("-ccbin").arg(ccbin);
    }
    println!("cargo:rerun-if-env-changed=NVCC_CCBIN");
    if sources.len() == 1 {
        cmd.arg("-o").arg(&fatbin).arg(&sources[0]);
    } else {
        // Several translation units: compile them together as one through
        // a generated unit that includes them all.
        let all = out.join("gpucoll_all_kernels.cu");
        let text: String = sources
            .iter()
            .map(|s| format!("#include \"{}\"\n", s.display()))
            .collect();
        std::fs::write(&all, text).expect("write the combined kernel unit into OUT_DIR");
        cmd.arg("-o").arg(&fatbin).arg(&all);
    }
    let mut kernels = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("feature `cuda`: could not run {}: {e}", nvcc.display()));
    // The ABI probe (a few seconds) runs while the kernels compile.
    let probe = abi_layout::write_layout(&nvcc, &kdir, &out);
    let status = kernels
        .wait()
        .unwrap_or_else(|e| panic!("feature `cuda`: waiting for {}: {e}", nvcc.display()));
    if let Err(e) = probe {
        panic!("feature `cuda`: the Rust <-> CUDA ABI probe failed: {e}");
    }
    if !status.success() {
        panic!(
            "feature `cuda`: nvcc ({}) failed to compile kernels/: {status}",
            nvcc.display()
        );
    }
}
