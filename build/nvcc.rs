//! Where the build script looks for nvcc, and the flags it compiles the
//! kernels with (recorded in the prebuilt kernels' stamp).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every nvcc flag of the kernel build except the output, the inputs, the
/// include directory and `-ccbin`. The prebuilt kernels' stamp records them,
/// so a change here makes the committed kernels stale.
pub const FATBIN_FLAGS: &[&str] = &[
    "-fatbin",
    // The three targets compile in parallel on every core.
    "--threads",
    "0",
    "-O3",
    "-std=c++17",
    "-lineinfo",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
    // Left to itself nvcc stores these images uncompressed (13.8 MB;
    // 2.7 MB compressed): every binary that embeds them grows by that.
    "-Xfatbin",
    "-compress-all",
];

fn env_flag(var: &str) -> Option<bool> {
    println!("cargo:rerun-if-env-changed={var}");
    match std::env::var(var).ok()?.as_str() {
        "" => None,
        "0" => Some(false),
        "1" => Some(true),
        other => panic!("{var}={other}: expected 0 or 1"),
    }
}

/// `GPUCOLL_PREBUILT_KERNELS`: `1` uses the committed kernels even when an
/// nvcc of another release is there (how CI and a developer test that path
/// on a machine with nvcc), `0` compiles them from source even when the
/// committed ones match (how `update-prebuilt-kernels` and CI's compile
/// check build), unset lets build.rs choose.
pub fn prebuilt_choice() -> Option<bool> {
    env_flag("GPUCOLL_PREBUILT_KERNELS")
}

/// nvcc of an installed `nvidia-cuda-nvcc` wheel: the CUDA 13 wheels put it
/// in `nvidia/cu13/bin`, the CUDA 12 ones in `nvidia/cuda_nvcc/bin`.
fn python_wheel_nvcc() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=PYTHONPATH");
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; print(os.pathsep.join(nvidia.__path__))",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dirs = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::env::split_paths(&dirs)
        .flat_map(|d| [d.join("cu13/bin/nvcc"), d.join("cuda_nvcc/bin/nvcc")])
        .find(|p| p.is_file())
}

/// The nvcc to compile the kernels with, or `None` when this machine has
/// none. Searched in `$GPUCOLL_NVCC`, `$NVCC`, `$CUDA_HOME/bin`,
/// `$CUDA_PATH/bin`, `PATH`, then (unless `GPUCOLL_NVCC_SEARCH=0`, which
/// CI sets to build as on a machine without a toolkit) the standard places:
/// `/usr/local/cuda/bin`, gpucoll's own `./.cuda` (the pinned wheels of
/// `scripts/setup.sh`) and the `nvidia` package of `python3`.
pub fn find(root: &Path) -> Option<PathBuf> {
    let search_standard = env_flag("GPUCOLL_NVCC_SEARCH").unwrap_or(true);
    for var in ["GPUCOLL_NVCC", "NVCC"] {
        println!("cargo:rerun-if-env-changed={var}");
        if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(p);
            if p.is_file() {
                return Some(p);
            }
            println!(
                "cargo:warning={var}={} does not exist; searching elsewhere",
                p.display()
            );
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
        if let Some(home) = std::env::var_os(var) {
            let p = PathBuf::from(home).join("bin").join("nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    println!("cargo:rerun-if-env-changed=PATH");
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path)
            .map(|dir| dir.join("nvcc"))
            .find(|p| p.is_file())
        {
            return Some(p);
        }
    }
    if !search_standard {
        return None;
    }
    [
        PathBuf::from("/usr/local/cuda/bin/nvcc"),
        root.join(".cuda/nvidia/cu13/bin/nvcc"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .or_else(python_wheel_nvcc)
}

/// The version line of `nvcc --version` ("Cuda compilation tools, release
/// 13.0, V13.0.88").
pub fn version(nvcc: &Path) -> Result<String, String> {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .map_err(|e| format!("could not run {} --version: {e}", nvcc.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("release"))
        .map(|l| l.trim().to_string())
        .ok_or_else(|| format!("{} --version printed no release line", nvcc.display()))
}
