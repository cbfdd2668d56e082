//! `--stage register` (run with `GPUCOLL_CE=1`): explicit buffer
//! registration (`Communicator::register`).
//!
//! 1. **More registered outputs than the mapping cache holds** (48 against
//!    32): every rank registers them all, then copy-engine all_gathers go
//!    round-robin into them for several rounds; each result is checked.
//!    The same rounds without registration are timed beside them (the
//!    cache then opens and closes peers' mappings all the time).
//! 2. **Churn**: `GPU_CHURN_CYCLES` (default 1000) times, a new output is
//!    allocated, registered, filled by an all_gather, checked,
//!    deregistered and freed. After a warm-up the process's counters
//!    (device memory, mappings, fds, threads, segments) must not grow.
//! 3. **Refused memory**: the last rank registers a host buffer and gets
//!    `WrongMemory`, the others succeed, and the communicator still works.

use super::churn::{counters, grown};
use gpucoll::{Communicator, DeviceBuffer, Error};
use std::fmt::Write as _;
use std::time::Instant;

/// Elements each rank contributes per call (1 MiB of f32).
const COUNT: usize = 1 << 18;
/// Registered outputs in part 1: more than the cache's 32 mappings.
const OUTPUTS: usize = 48;
/// Rounds over the outputs in part 1.
const ROUNDS: usize = 4;

/// Rank `r`'s value at `j` in call `i`.
fn value(r: usize, j: usize, i: usize) -> f32 {
    ((r * 31 + i * 7 + j % 97) % 1009) as f32
}

/// One all_gather into `out`, checked: (wrong elements, seconds the
/// collective itself took).
fn gather_into(
    world: &Communicator,
    gpu: i32,
    out: &mut DeviceBuffer<f32>,
    i: usize,
) -> gpucoll::Result<(usize, f64)> {
    let rank = world.rank();
    let mine: Vec<f32> = (0..COUNT).map(|j| value(rank, j, i)).collect();
    let din = DeviceBuffer::from_host(gpu, &mine)?;
    out.copy_from_host(&vec![-1.0; COUNT * world.size()])?;
    let t = Instant::now();
    world.all_gather_into(&din, out)?;
    let secs = t.elapsed().as_secs_f64();
    let got = out.to_vec()?;
    let wrong = got
        .iter()
        .enumerate()
        .filter(|&(k, &x)| x != value(k / COUNT, k % COUNT, i))
        .count();
    Ok((wrong, secs))
}

/// Part 1: rounds over `OUTPUTS` buffers, registered or not; (wrong
/// elements, mean seconds of a call, max over ranks).
fn rounds(
    world: &Communicator,
    gpu: i32,
    outs: &mut [DeviceBuffer<f32>],
    first: usize,
) -> gpucoll::Result<(usize, f64)> {
    let (mut wrong, mut secs) = (0, 0.0);
    for r in 0..ROUNDS {
        for (k, out) in outs.iter_mut().enumerate() {
            let (w, s) = gather_into(world, gpu, out, first + r * OUTPUTS + k)?;
            wrong += w;
            secs += s;
        }
    }
    let mut max = [0f64];
    gpucoll::reference::all_reduce(world, &[secs], &mut max, gpucoll::ReduceOp::Max)?;
    Ok((wrong, max[0] / (ROUNDS * OUTPUTS) as f64))
}

/// Returns the number of failures.
pub(crate) fn stage_register(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("register needs the CUDA backend".into()))?;
    if std::env::var("GPUCOLL_CE").ok().as_deref() != Some("1") {
        let _ = writeln!(
            log,
            "rank {rank}: GPUCOLL_CE=1 is not set: the kernels would run"
        );
        return Ok(1);
    }
    let mut fails = 0usize;

    // 1. Registered outputs beyond the cache, then the same unregistered.
    let mut outs = (0..OUTPUTS)
        .map(|_| DeviceBuffer::<f32>::from_host(gpu, &vec![0.0; COUNT * n]))
        .collect::<gpucoll::Result<Vec<_>>>()?;
    let regs = outs
        .iter()
        .map(|b| world.register(b))
        .collect::<gpucoll::Result<Vec<_>>>()?;
    let direct = regs.iter().filter(|r| r.is_direct()).count();
    if direct != OUTPUTS {
        fails += 1;
    }
    let (bad_reg, t_reg) = rounds(world, gpu, &mut outs, 0)?;
    drop(regs);
    let (bad_unreg, t_unreg) = rounds(world, gpu, &mut outs, 1 << 20)?;
    fails += usize::from(bad_reg > 0) + usize::from(bad_unreg > 0);
    let _ = writeln!(
        log,
        "rank {rank}: {OUTPUTS} outputs of {} MiB, {direct} registered directly; {ROUNDS} rounds \
         of all_gathers (the call alone, mean, max over ranks): registered {:.1} us per call \
         ({bad_reg} wrong), unregistered {:.1} us per call ({bad_unreg} wrong)",
        (COUNT * 4 * n) >> 20,
        t_reg * 1e6,
        t_unreg * 1e6
    );
    drop(outs);

    // 2. Register/use/deregister/free churn.
    let cycles: usize = std::env::var("GPU_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let cycle = |i: usize| -> gpucoll::Result<usize> {
        let mut out = DeviceBuffer::<f32>::from_host(gpu, &vec![0.0; COUNT * n])?;
        let reg = world.register(&out)?;
        let (bad, _) = gather_into(world, gpu, &mut out, i)?;
        reg.deregister();
        Ok(bad)
    };
    let mut wrong = 0;
    for i in 0..64 {
        wrong += cycle(i)?;
    }
    world.barrier()?;
    let before = counters(gpu)?;
    let t = Instant::now();
    for i in 0..cycles {
        wrong += cycle(64 + i)?;
    }
    world.barrier()?;
    let after = counters(gpu)?;
    fails += usize::from(wrong > 0);
    let _ = writeln!(
        log,
        "rank {rank}: {cycles} allocate/register/all_gather/deregister/free cycles in {:.1} s \
         ({:.2} ms each), {wrong} wrong elements",
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3 / cycles.max(1) as f64
    );
    // Device memory may move by the outputs evicted mappings keep alive
    // until their events completed (the GPU may be shared).
    let device_kib = (COUNT * 4 * n * n / 1024) as i64 + 4096;
    fails += grown(rank, &before, &after, device_kib, log);

    // 3. Host memory refused on one rank only; everyone goes on.
    let host = vec![0f32; COUNT];
    let dev = DeviceBuffer::<f32>::from_host(gpu, &host)?;
    let r = if rank == n - 1 {
        world.register(&host[..])
    } else {
        world.register(&dev)
    };
    let refused_ok = matches!(
        (&r, rank == n - 1),
        (Err(Error::WrongMemory(_)), true) | (Ok(_), false)
    );
    let _ = writeln!(
        log,
        "rank {rank}: register of {} memory: {}",
        if rank == n - 1 { "host" } else { "device" },
        match &r {
            Ok(reg) => format!("{reg:?}"),
            Err(e) => format!("error: {e}"),
        }
    );
    drop(r);
    fails += usize::from(!refused_ok);
    let mut out = DeviceBuffer::<f32>::from_host(gpu, &vec![0.0; COUNT * n])?;
    let (after_refusal, _) = gather_into(world, gpu, &mut out, 7)?;
    fails += usize::from(after_refusal > 0);
    let _ = writeln!(
        log,
        "rank {rank}: all_gather after the refusal: {after_refusal} wrong elements"
    );
    Ok(fails)
}
