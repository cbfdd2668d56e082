//! Build script.
//!
//! Without the `cuda` feature it does nothing. With it, it puts the kernels
//! in `OUT_DIR/gpucoll_kernels.fatbin` (SASS for sm_80 and sm_90, PTX for
//! compute_90 so newer GPUs JIT it), which `src/backend/cuda` embeds with
//! `include_bytes!`, and the layout of every struct and the value of every
//! constant of `kernels/gpucoll.cuh` as nvcc sees them in
//! `OUT_DIR/abi_layout.rs`, which the tests of `src/backend/cuda/abi.rs`
//! compare field by field with the Rust mirrors (`build/abi_layout.rs`).
//!
//! The committed `kernels/prebuilt/` files are used when their stamp still
//! matches the sources (`build/prebuilt.rs`) and either no nvcc is found,
//! `GPUCOLL_PREBUILT_KERNELS=1` asks for them, or the nvcc found is the
//! release that made them (with the same flags and host compiler): then
//! compiling would make the same kernels, minutes later. Otherwise, or with
//! `GPUCOLL_PREBUILT_KERNELS=0`, it compiles every `kernels/*.cu` into ONE
//! fatbin with nvcc (`build/nvcc.rs` says where it looks) and runs the
//! layout probe. `scripts/update-prebuilt-kernels` regenerates the
//! committed files.

#[path = "build/abi_layout.rs"]
mod abi_layout;
#[path = "build/nvcc.rs"]
mod nvcc;
#[path = "build/prebuilt.rs"]
mod prebuilt;
#[path = "build/sha256.rs"]
mod sha256;

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for module in ["abi_layout", "nvcc", "prebuilt", "sha256"] {
        println!("cargo:rerun-if-changed=build/{module}.rs");
    }
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_CUDA");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    build_kernels();
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

    let choice = nvcc::prebuilt_choice();
    let forced = choice == Some(true);
    match if forced { None } else { nvcc::find(&root) } {
        Some(nvcc) if choice.is_none() && reuse_prebuilt(&root, &out, &nvcc) => {}
        Some(nvcc) => compile(&nvcc, &kdir, &sources, &out),
        None => use_prebuilt(&root, &out, forced),
    }
}

/// With nvcc found and nothing asked: the committed kernels, when they are
/// what this nvcc would make of the current sources (the stamp's digests,
/// flags, nvcc release and host compiler all match), so that every build
/// of an unchanged tree does not spend minutes in nvcc for the same code.
/// False (compile) when anything differs.
fn reuse_prebuilt(root: &Path, out: &Path, nvcc: &Path) -> bool {
    println!("cargo:rerun-if-env-changed=NVCC_CCBIN");
    let Ok(version) = nvcc::version(nvcc) else {
        return false;
    };
    let ccbin = std::env::var("NVCC_CCBIN").ok();
    if let Err(why) = prebuilt::made_the_same(root, nvcc::FATBIN_FLAGS, &version, ccbin.as_deref())
    {
        println!(
            "gpucoll-build: kernels: compiling with {}: the prebuilt ones differ ({why})",
            nvcc.display()
        );
        return false;
    }
    // Only a stamp written by compile() is what update-prebuilt-kernels
    // copies back into the tree.
    let _ = std::fs::remove_file(out.join(prebuilt::STAMP));
    if let Err(e) = prebuilt::install(root, out, nvcc::FATBIN_FLAGS) {
        println!(
            "gpucoll-build: kernels: compiling with {}: {e}",
            nvcc.display()
        );
        return false;
    }
    println!(
        "gpucoll-build: kernels: prebuilt from {} (made by {version} from these sources; \
         GPUCOLL_PREBUILT_KERNELS=0 compiles them)",
        prebuilt::DIR
    );
    true
}

/// The committed kernels, when no nvcc was found or they were asked for.
fn use_prebuilt(root: &Path, out: &Path, forced: bool) {
    // Only a stamp written by compile() is what update-prebuilt-kernels
    // copies back into the tree.
    let _ = std::fs::remove_file(out.join(prebuilt::STAMP));
    let why = if forced {
        "GPUCOLL_PREBUILT_KERNELS=1"
    } else {
        "no nvcc found"
    };
    if let Err(e) = prebuilt::install(root, out, nvcc::FATBIN_FLAGS) {
        let cause = if forced {
            "GPUCOLL_PREBUILT_KERNELS=1 asks for the prebuilt ones (unset it to use nvcc)"
        } else {
            "no nvcc was found (searched $GPUCOLL_NVCC, $NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, \
             PATH, /usr/local/cuda/bin, ./.cuda and python3's nvidia wheels)"
        };
        panic!(
            "\n\nfeature `cuda`: {e}.\n\
             The CUDA kernels must then be compiled from kernels/ with nvcc, but {cause}. \
             Either:\n  \
             * install nvcc 13.0: `./scripts/setup.sh` puts the pinned wheels in ./.cuda, or \
             point GPUCOLL_NVCC=/path/to/nvcc at a CUDA toolkit, or\n  \
             * regenerate the prebuilt kernels with `scripts/update-prebuilt-kernels` and commit \
             kernels/prebuilt/, or\n  \
             * build without the feature (`--no-default-features`: the host backend only).\n\n"
        );
    }
    // Not a directive: cargo keeps it in the build script's output (shown
    // by `cargo build -vv`), where CI checks which way the kernels came.
    println!(
        "gpucoll-build: kernels: prebuilt from {} ({why})",
        prebuilt::DIR
    );
}

/// Compiles `sources` into `out/gpucoll_kernels.fatbin` with `nvcc`, runs
/// the ABI probe, and writes the stamp that `update-prebuilt-kernels`
/// commits beside them.
fn compile(nvcc: &Path, kdir: &Path, sources: &[PathBuf], out: &Path) {
    // The digests of exactly the sources compiled, taken before nvcc starts.
    let digests = prebuilt::source_digests(kdir).unwrap_or_else(|e| panic!("feature `cuda`: {e}"));
    let fatbin = out.join(prebuilt::FATBIN);
    let mut cmd = Command::new(nvcc);
    // Run from the crate root with relative paths: the line info names
    // `kernels/coll.cu`, not the path of whoever built it, so the prebuilt
    // fatbin does not depend on where the tree was checked out.
    cmd.current_dir(kdir.parent().expect("kernels/ has a parent"))
        .args(nvcc::FATBIN_FLAGS)
        .args(["-I", "kernels"]);
    let ccbin = std::env::var("NVCC_CCBIN").ok();
    if let Some(ccbin) = &ccbin {
        cmd.arg("-ccbin").arg(ccbin);
    }
    println!("cargo:rerun-if-env-changed=NVCC_CCBIN");
    if sources.len() == 1 {
        let name = sources[0].file_name().expect("a kernel file has a name");
        cmd.arg("-o")
            .arg(&fatbin)
            .arg(Path::new("kernels").join(name));
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
    let probe = abi_layout::write_layout(nvcc, kdir, out);
    let version = nvcc::version(nvcc);
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
    // Only the stamp needs the version: a wrapper without --version still
    // builds, and update-prebuilt-kernels refuses its unknown version.
    let version = version.unwrap_or_else(|e| format!("unknown ({e})"));
    let stamp = prebuilt::stamp_text(&version, nvcc::FATBIN_FLAGS, ccbin.as_deref(), &digests);
    let stamp_path = out.join(prebuilt::STAMP);
    std::fs::write(&stamp_path, stamp)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", stamp_path.display()));
    println!("gpucoll-build: kernels: compiled by {}", nvcc.display());
}
