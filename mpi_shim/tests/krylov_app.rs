//! The Krylov mini-app (`bench/krylov/`) without a GPU: its `--host` mode
//! (host memory, the kernels as CPU loops) in both builds (device pointers
//! straight to MPI, and staged by hand with `-DSTAGE`), plain and under the
//! shim in host test mode, where its halo exchange goes through the shim's
//! staging and its allreduces through gpucoll's host backend. The residual
//! history's hash must be the same in every mode and build: the dot
//! products' cross-rank sums are exact (README.md of the app), although
//! MPI and gpucoll add the partials in different orders.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

/// The app built without GPU kernels: (direct, staged).
fn build_app() -> (String, String) {
    assert!(
        have("mpicc"),
        "mpicc not found: install Open MPI's development package (scripts/setup.sh)"
    );
    let bench = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench");
    let src = bench.join("krylov");
    let sources = [
        src.join("krylov.c"),
        src.join("cpu.c"),
        src.join("gpu.c"),
        bench.join("cudrv.c"),
    ];
    let dir = build_dir();
    let mut out = Vec::new();
    for (name, defs) in [("krylov", &[][..]), ("krylov_staged", &["-DSTAGE"][..])] {
        let exe = dir.join(name);
        let mut cc = Command::new("mpicc");
        cc.args(["-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"])
            .args(defs)
            .arg("-o")
            .arg(&exe)
            .args(&sources)
            .args(["-lm", "-ldl"]);
        build(&mut cc, &format!("mpicc {name}"));
        out.push(exe.display().to_string());
    }
    (out[0].clone(), out[1].clone())
}

/// One size's result, from the app's JSON line.
#[derive(Debug, Clone, PartialEq)]
struct Solve {
    n: u64,
    iters: u64,
    retries: u64,
    converged: bool,
    hash: String,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[start..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim_matches('"'))
}

fn solves(stdout: &str) -> Vec<Solve> {
    stdout
        .lines()
        .filter(|l| l.starts_with("{\"app\":\"krylov\""))
        .filter_map(|l| {
            Some(Solve {
                n: field(l, "n")?.parse().ok()?,
                iters: field(l, "iters")?.parse().ok()?,
                retries: field(l, "retries")?.parse().ok()?,
                converged: field(l, "converged")? == "true",
                hash: field(l, "hash")?.to_string(),
            })
        })
        .collect()
}

#[test]
fn same_history_in_every_mode() {
    let (direct, staged) = build_app();
    let mut v = Verdict::default();
    // --headroom 0 makes the agreed-exponent retry of the global sums
    // happen (a residual that grows at all), at 3 ranks.
    let cases: &[(usize, &[&str])] = &[
        (2, &["--sizes", "8,12"]),
        (3, &["--sizes", "12", "--headroom", "0"]),
        (4, &["--sizes", "8"]),
    ];
    for &(np, args) in cases {
        let mut reference: Option<(String, Vec<Solve>)> = None;
        for (mode, exe) in [
            (Mode::Plain, &direct),
            (Mode::Host, &direct),
            (Mode::Plain, &staged),
            (Mode::Host, &staged),
        ] {
            let mut cmd = vec![exe.clone(), "--host".to_string()];
            cmd.extend(args.iter().map(|a| a.to_string()));
            let run = mpirun(mode, np, &cmd, Duration::from_secs(120));
            let got = solves(&run.stdout);
            let label = run.label.clone();
            if !run.ok || got.is_empty() {
                v.fail(format!("{label}: no result\n{}", run.report()));
                continue;
            }
            for s in &got {
                v.check(s.converged && s.iters > 10, || {
                    format!("{label}: n={} did not converge: {s:?}", s.n)
                });
            }
            if args.contains(&"--headroom") {
                v.check(got.iter().any(|s| s.retries > 0), || {
                    format!("{label}: --headroom 0 but no sum was redone: {got:?}")
                });
            }
            if mode == Mode::Host && exe == &direct {
                check_routed(&mut v, &run, "staged", &["MPI_Isend", "MPI_Irecv"]);
                check_routed(&mut v, &run, "gpucoll", &["MPI_Allreduce"]);
            }
            match &reference {
                None => reference = Some((label, got)),
                Some((first, want)) => v.check(&got == want, || {
                    format!("{label} differs from {first}:\n  {got:?}\n  {want:?}")
                }),
            }
        }
    }
    v.finish();
}
