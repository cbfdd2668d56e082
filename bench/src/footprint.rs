//! gpucoll-footprint: what a communicator costs in GPU memory and start-up
//! time, measured from outside the library (issue 34's table).
//!
//! Run under MPI, every rank on the GPU of its local rank (one GPU shared
//! under MPS works): `mpirun -n 2 gpucoll-footprint [--dups N] [--bytes SIZE]
//! [--iters N] [--json FILE]`.
//!
//! Device memory is the whole GPU's, read after a barrier: `nvidia-smi`
//! for the points before and after the CUDA context (a context cannot be
//! queried before it exists), `cuMemGetInfo` after. Every figure is the
//! GPU's change divided by the ranks on it, so nothing else may run on the
//! GPU meanwhile. The barriers and the timing reductions go through a
//! communicator on the host backend, which holds no GPU memory.
//!
//! Printed (rank 0), in MiB per rank and seconds:
//! - `context`: the CUDA context alone;
//! - `world_idle`, `world_used`: the CUDA world communicator beyond the
//!   context and the benchmark's buffers, after creation and after one
//!   `--bytes` all_reduce;
//! - `dup_idle`, `dup_used`: each duplicate of it (the mean), likewise;
//! - `after_free`: what is left of all communicators once dropped;
//! - `world_create_s`, `dup_create_s`: the slowest rank's time;
//! - `busbw`: all_reduce of `--bytes` float32 on the world (blocking).
//!
//! The world's first call and each duplicate's calls (all alive, used in
//! turn, twice) go into a poisoned output and are checked element by
//! element; a wrong one ends the run with an error.

use gpucoll::{Communicator, Config, DeviceBuffer, ReduceOp};
use std::process::Command;
use std::time::Instant;

const USAGE: &str = "usage: gpucoll-footprint [--dups N (4)] [--bytes SIZE (256M)] \
[--iters N (20)] [--json FILE]";

struct Opts {
    dups: usize,
    bytes: u64,
    iters: usize,
    json: Option<String>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("not a size: {s:?}"))
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        dups: 4,
        bytes: 256 << 20,
        iters: 20,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--dups" => o.dups = value()?.parse().map_err(|e| format!("--dups: {e}"))?,
            "--bytes" => o.bytes = parse_size(&value()?)?,
            "--iters" => {
                o.iters = value()?.parse().map_err(|e| format!("--iters: {e}"))?;
            }
            "--json" => o.json = Some(value()?),
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        }
    }
    if o.bytes < 4 || o.iters == 0 {
        return Err("--bytes must be at least 4 and --iters at least 1".into());
    }
    Ok(o)
}

/// Used device memory of GPU `ordinal` in bytes, as `nvidia-smi` reports it
/// (MiB resolution); `None` when it cannot be run.
fn smi_used(ordinal: i32) -> Option<u64> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=memory.used",
            "--format=csv,noheader,nounits",
            &format!("--id={ordinal}"),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(mib << 20)
}

fn cuda_used(ordinal: i32) -> gpucoll::Result<u64> {
    let (free, total) = gpucoll::device_memory(ordinal)?;
    Ok(total - free)
}

/// The measuring side: barriers, reductions and rank-0 readings on a host
/// communicator.
struct Probe {
    host: Communicator,
    ordinal: i32,
    /// Ranks on this rank's GPU (the divisor of every memory figure).
    sharers: f64,
}

impl Probe {
    /// Used memory of the GPU once every rank got here; `smi` chooses
    /// nvidia-smi over cuMemGetInfo. `None`: it could not be read.
    fn used(&self, smi: bool) -> Result<Option<u64>, String> {
        self.host.barrier().map_err(|e| e.to_string())?;
        // Rank 0 reads its GPU (all ranks share it in the MPS setup this
        // tool is for) and tells the others.
        let mut out = [0u64];
        if self.host.rank() == 0 {
            let got = if smi {
                smi_used(self.ordinal)
            } else {
                cuda_used(self.ordinal).ok()
            };
            out[0] = got.unwrap_or(u64::MAX);
        }
        self.host
            .process_at_rank(0)
            .broadcast_into(&mut out[..])
            .map_err(|e| e.to_string())?;
        Ok((out[0] != u64::MAX).then_some(out[0]))
    }

    fn slowest(&self, secs: f64) -> Result<f64, String> {
        let mut v = [secs];
        self.host
            .all_reduce_in_place(&mut v[..], ReduceOp::Max)
            .map_err(|e| e.to_string())?;
        Ok(v[0])
    }

    fn per_rank_mib(&self, before: u64, after: u64) -> f64 {
        (after as f64 - before as f64) / self.sharers / (1u64 << 20) as f64
    }
}

struct Bufs {
    send: DeviceBuffer<f32>,
    recv: DeviceBuffer<f32>,
    /// What every element of `recv` must hold after a sum: 1 + 2 + .. + n.
    want: f32,
}

fn use_once(comm: &Communicator, b: &mut Bufs) -> Result<(), String> {
    comm.all_reduce_into(&b.send, &mut b.recv, ReduceOp::Sum)
        .map_err(|e| format!("all_reduce: {e}"))
}

/// One all_reduce into a poisoned output, every element checked, so that
/// a communicator whose budget or sharing went wrong cannot pass as cheap.
fn use_checked(comm: &Communicator, b: &mut Bufs, what: &str) -> Result<(), String> {
    let poison = vec![f32::NAN; b.recv.len()];
    b.recv
        .copy_from_host(&poison)
        .map_err(|e| format!("poison: {e}"))?;
    use_once(comm, b)?;
    let got = b.recv.to_vec().map_err(|e| format!("read back: {e}"))?;
    match got.iter().position(|&v| v != b.want) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: all_reduce element {i} is {}, not {}",
            got[i], b.want
        )),
    }
}

fn cuda_config() -> Result<Config, String> {
    Config::from_lookup(|name| match name {
        "GPUCOLL_BACKEND" => Some("cuda".into()),
        other => std::env::var(other).ok(),
    })
    .map_err(|e| format!("config: {e}"))
}

#[derive(Default)]
struct Figures {
    context_mib: Option<f64>,
    world_idle_mib: f64,
    world_used_mib: f64,
    dup_idle_mib: f64,
    dup_used_mib: f64,
    after_free_mib: f64,
    world_create_s: f64,
    dup_create_s: f64,
    busbw_gbs: f64,
    call_s: f64,
}

fn measure(p: &Probe, o: &Opts) -> Result<Figures, String> {
    let mut f = Figures::default();
    let smi_before = p.used(true)?;
    let smi_ctx = {
        // The primary context of the rank's GPU, as the CUDA world will use.
        gpucoll::device_memory(p.ordinal).map_err(|e| format!("CUDA context: {e}"))?;
        p.used(true)?
    };
    if let (Some(a), Some(b)) = (smi_before, smi_ctx) {
        f.context_mib = Some(p.per_rank_mib(a, b));
    }
    let len = (o.bytes / 4) as usize;
    let (rank, n) = (p.host.rank() as f32, p.host.size() as f32);
    let mut bufs = Bufs {
        send: DeviceBuffer::from_host(p.ordinal, &vec![rank + 1.0; len])
            .map_err(|e| format!("send buffer: {e}"))?,
        recv: DeviceBuffer::zeroed(p.ordinal, len).map_err(|e| format!("recv buffer: {e}"))?,
        want: n * (n + 1.0) / 2.0,
    };
    let base = p.used(false)?.unwrap_or(0);

    p.host.barrier().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let world = p
        .host
        .duplicate_with(cuda_config()?)
        .map_err(|e| format!("CUDA world: {e}"))?;
    f.world_create_s = p.slowest(t.elapsed().as_secs_f64())?;
    if world.backend_name() != "cuda" {
        return Err(format!(
            "the world runs on {}, not cuda",
            world.backend_name()
        ));
    }
    let idle = p.used(false)?.unwrap_or(0);
    f.world_idle_mib = p.per_rank_mib(base, idle);
    use_checked(&world, &mut bufs, "world")?;
    let used = p.used(false)?.unwrap_or(0);
    f.world_used_mib = p.per_rank_mib(base, used);

    // Bandwidth on the world (warm: the call above brought it up).
    for _ in 0..2 {
        use_once(&world, &mut bufs)?;
    }
    world.barrier().map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..o.iters {
        use_once(&world, &mut bufs)?;
    }
    f.call_s = p.slowest(t.elapsed().as_secs_f64())? / o.iters as f64;
    let n = world.size() as f64;
    f.busbw_gbs = o.bytes as f64 * 2.0 * (n - 1.0) / n / f.call_s / 1e9;

    let mut dups = Vec::new();
    let before_dups = p.used(false)?.unwrap_or(0);
    let mut create = 0.0;
    for _ in 0..o.dups {
        p.host.barrier().map_err(|e| e.to_string())?;
        let t = Instant::now();
        dups.push(world.duplicate().map_err(|e| format!("duplicate: {e}"))?);
        create += p.slowest(t.elapsed().as_secs_f64())?;
    }
    if o.dups > 0 {
        let idle = p.used(false)?.unwrap_or(0);
        f.dup_idle_mib = p.per_rank_mib(before_dups, idle) / o.dups as f64;
        f.dup_create_s = create / o.dups as f64;
        for (i, d) in dups.iter().enumerate() {
            use_checked(d, &mut bufs, &format!("duplicate {i}"))?;
        }
        // All alive at once, used in turn again: none disturbed another.
        for (i, d) in dups.iter().enumerate().rev() {
            use_checked(d, &mut bufs, &format!("duplicate {i}, second round"))?;
        }
        let used = p.used(false)?.unwrap_or(0);
        f.dup_used_mib = p.per_rank_mib(before_dups, used) / o.dups as f64;
    }
    drop(dups);
    drop(world);
    let left = p.used(false)?.unwrap_or(0);
    f.after_free_mib = p.per_rank_mib(base, left);
    Ok(f)
}

fn opt(v: Option<f64>) -> String {
    v.map_or("null".into(), |x| format!("{x:.1}"))
}

fn report(p: &Probe, o: &Opts, f: &Figures) -> Result<(), String> {
    if p.host.rank() != 0 {
        return Ok(());
    }
    let n = p.host.size();
    println!(
        "# gpucoll-footprint: {n} ranks, {} on the GPU of rank 0, {} dups, {} B calls",
        p.sharers, o.dups, o.bytes
    );
    println!("# MiB per rank (the GPU's change / ranks on it); seconds: the slowest rank");
    println!("context_mib        {}", opt(f.context_mib));
    println!("world_idle_mib     {:.1}", f.world_idle_mib);
    println!("world_used_mib     {:.1}", f.world_used_mib);
    println!("dup_idle_mib       {:.1}", f.dup_idle_mib);
    println!("dup_used_mib       {:.1}", f.dup_used_mib);
    println!("after_free_mib     {:.1}", f.after_free_mib);
    println!("world_create_s     {:.4}", f.world_create_s);
    println!("dup_create_s       {:.4}", f.dup_create_s);
    println!("call_us            {:.1}", f.call_s * 1e6);
    println!("busbw_GBs          {:.1}", f.busbw_gbs);
    println!("# every result exact: the world's first call, each duplicate's, twice");
    if let Some(path) = &o.json {
        let json = format!(
            "{{\"ranks\": {n}, \"sharers\": {}, \"dups\": {}, \"bytes\": {}, \
\"context_mib\": {}, \"world_mib_per_rank\": {:.1}, \"world_used_mib_per_rank\": {:.1}, \
\"dup_idle_mib_per_rank\": {:.1}, \"dup_used_mib_per_rank\": {:.1}, \
\"after_free_mib_per_rank\": {:.1}, \"world_create_s\": {:.4}, \"dup_create_s\": {:.4}, \
\"call_us\": {:.1}, \"busbw_GBs\": {:.1}}}\n",
            p.sharers,
            o.dups,
            o.bytes,
            opt(f.context_mib),
            f.world_idle_mib,
            f.world_used_mib,
            f.dup_idle_mib,
            f.dup_used_mib,
            f.after_free_mib,
            f.world_create_s,
            f.dup_create_s,
            f.call_s * 1e6,
            f.busbw_gbs
        );
        std::fs::write(path, json).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let o = parse_opts()?;
    // The measuring communicator must hold no GPU memory: the host
    // backend. Set before MPI or any thread starts.
    std::env::set_var("GPUCOLL_BACKEND", "host");
    let universe = gpucoll::initialize().map_err(|e| format!("initialize: {e}"))?;
    let host = universe.world().map_err(|e| format!("host world: {e}"))?;
    let gpus = gpucoll::device_count();
    if gpus == 0 {
        return Err("no GPU is visible".into());
    }
    let ordinal = (host.local_rank() % gpus) as i32;
    let sharers = host.local_size().div_ceil(gpus) as f64;
    let probe = Probe {
        host,
        ordinal,
        sharers,
    };
    let figures = measure(&probe, &o)?;
    report(&probe, &o, &figures)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gpucoll-footprint: {e}");
        std::process::exit(1);
    }
}
