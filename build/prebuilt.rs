//! The prebuilt kernels committed in `kernels/prebuilt/`, for machines
//! without nvcc: the fatbin, the ABI layout tables, and a stamp that records
//! what they were made from (the nvcc version, its flags, and the sha256 of
//! every `kernels/*.cu` and `*.cuh`). nvcc's output is not byte-for-byte
//! reproducible across machines, so staleness is judged by the sources'
//! digests and the flags, never by rebuilding and comparing bytes.
//!
//! `scripts/update-prebuilt-kernels` builds with the pinned nvcc, which
//! leaves the stamp in `OUT_DIR` beside the fatbin, and copies the three
//! files here.

use std::fmt::Write as _;
use std::path::Path;

/// The directory of the committed files, relative to the crate root.
pub const DIR: &str = "kernels/prebuilt";
/// The file names, the same in `kernels/prebuilt/` and in `OUT_DIR`.
pub const FATBIN: &str = "gpucoll_kernels.fatbin";
pub const LAYOUT: &str = "abi_layout.rs";
pub const STAMP: &str = "gpucoll_kernels.stamp";

const HEADER: &str = "\
# gpucoll's prebuilt CUDA kernels: written by scripts/update-prebuilt-kernels.
# build.rs uses the fatbin and ABI layout beside this file when it finds no
# nvcc, and only while every source below still has this sha256 and the
# flags are still build.rs's; `.ci/run` checks the digests with sha256sum.
";

/// (file name, sha256) of every `*.cu` and `*.cuh` of `kdir`, sorted by name.
pub fn source_digests(kdir: &Path) -> Result<Vec<(String, String)>, String> {
    let entries =
        std::fs::read_dir(kdir).map_err(|e| format!("cannot read {}: {e}", kdir.display()))?;
    let mut digests = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let ext = path.extension().and_then(|x| x.to_str());
        if !matches!(ext, Some("cu" | "cuh")) || !path.is_file() {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: kernel file names must be UTF-8", path.display()))?
            .to_string();
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        digests.push((name, crate::sha256::hex_digest(&bytes)));
    }
    digests.sort();
    Ok(digests)
}

/// The stamp of kernels made by `nvcc_version` with `flags` (and `ccbin`,
/// when `NVCC_CCBIN` chose the host compiler) from sources with `digests`.
pub fn stamp_text(
    nvcc_version: &str,
    flags: &[&str],
    ccbin: Option<&str>,
    digests: &[(String, String)],
) -> String {
    let mut s = String::from(HEADER);
    writeln!(s, "nvcc-version {nvcc_version}").unwrap();
    writeln!(s, "nvcc-flags {}", flags_line(flags)).unwrap();
    if let Some(ccbin) = ccbin {
        writeln!(s, "nvcc-ccbin {ccbin}").unwrap();
    }
    for (name, digest) in digests {
        // `sha256sum`'s own line format after the keyword.
        writeln!(s, "sha256 {digest}  {name}").unwrap();
    }
    s
}

/// The flags as the stamp records them: build.rs's own, then the include
/// directory (the output and input paths follow them on nvcc's command line).
fn flags_line(flags: &[&str]) -> String {
    format!("{} -I kernels", flags.join(" "))
}

/// What a stamp says: the nvcc version, the flags line, the host compiler
/// and the source digests.
struct Stamp {
    version: Option<String>,
    flags: String,
    ccbin: Option<String>,
    digests: Vec<(String, String)>,
}

fn parse(text: &str) -> Result<Stamp, String> {
    let mut version = None;
    let mut flags = None;
    let mut ccbin = None;
    let mut digests = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "nvcc-version" => version = Some(value.to_string()),
            "nvcc-ccbin" => ccbin = Some(value.to_string()),
            "nvcc-flags" => flags = Some(value.to_string()),
            "sha256" => {
                let (digest, name) = value
                    .split_once("  ")
                    .ok_or_else(|| format!("bad line `{line}`"))?;
                digests.push((name.to_string(), digest.to_string()));
            }
            _ => return Err(format!("unknown line `{line}`")),
        }
    }
    let flags = flags.ok_or("no nvcc-flags line")?;
    Ok(Stamp {
        version,
        flags,
        ccbin,
        digests,
    })
}

/// How the current sources differ from the stamped ones, file by file.
fn source_changes(stamped: &[(String, String)], current: &[(String, String)]) -> Vec<String> {
    let mut changes = Vec::new();
    for (name, digest) in current {
        match stamped.iter().find(|(n, _)| n == name) {
            None => changes.push(format!("{name} is new")),
            Some((_, d)) if d != digest => changes.push(format!("{name} changed")),
            Some(_) => {}
        }
    }
    for (name, _) in stamped {
        if !current.iter().any(|(n, _)| n == name) {
            changes.push(format!("{name} is gone"));
        }
    }
    changes
}

/// The committed stamp, checked against the current `kernels/` sources and
/// `flags`; the error says what differs.
fn current_stamp(root: &Path, flags: &[&str]) -> Result<Stamp, String> {
    let stamp_path = root.join(DIR).join(STAMP);
    let text = std::fs::read_to_string(&stamp_path).map_err(|e| {
        format!(
            "the prebuilt kernels' stamp {} cannot be read: {e}",
            stamp_path.display()
        )
    })?;
    let stamp = parse(&text).map_err(|e| format!("{}: {e}", stamp_path.display()))?;
    let current = source_digests(&root.join("kernels"))?;
    let changes = source_changes(&stamp.digests, &current);
    if !changes.is_empty() {
        return Err(format!(
            "the kernel sources changed since the prebuilt kernels in {DIR} were made ({})",
            changes.join(", ")
        ));
    }
    if stamp.flags != flags_line(flags) {
        return Err(format!(
            "the prebuilt kernels in {DIR} were made with other nvcc flags than build.rs \
             uses now (stamp: `{}`)",
            stamp.flags
        ));
    }
    Ok(stamp)
}

/// Whether compiling the current sources with `flags` by an nvcc of
/// `nvcc_version` (and the host compiler `ccbin`, if one was chosen) would
/// make what is committed: the same sources, flags, nvcc release and host
/// compiler. Then the build copies the committed kernels instead of
/// spending minutes in nvcc for the same code.
pub fn made_the_same(
    root: &Path,
    flags: &[&str],
    nvcc_version: &str,
    ccbin: Option<&str>,
) -> Result<(), String> {
    let stamp = current_stamp(root, flags)?;
    if stamp.version.as_deref() != Some(nvcc_version) {
        return Err(format!(
            "they were made by another nvcc ({})",
            stamp.version.as_deref().unwrap_or("none recorded")
        ));
    }
    if stamp.ccbin.as_deref() != ccbin {
        return Err("they were made with another host compiler (NVCC_CCBIN)".to_string());
    }
    Ok(())
}

/// Copies the committed kernels into `out` after checking that they were
/// made from the current `kernels/` sources with the current flags; the
/// error says what differs.
pub fn install(root: &Path, out: &Path, flags: &[&str]) -> Result<(), String> {
    current_stamp(root, flags)?;
    let dir = root.join(DIR);
    for name in [FATBIN, LAYOUT] {
        let from = dir.join(name);
        println!("cargo:rerun-if-changed={}", from.display());
        std::fs::copy(&from, out.join(name))
            .map_err(|e| format!("cannot copy {} into OUT_DIR: {e}", from.display()))?;
    }
    Ok(())
}
