//! `--stage ce_churn` (run with `GPUCOLL_CE=1`): receive buffers
//! allocated, filled by a copy-engine all_gather, checked, freed and
//! allocated again, `GPU_CHURN_CYCLES` times (default 1000). A freed
//! buffer usually comes back at the same address with a new buffer ID: a
//! peer writing through a stale mapping would leave the new buffer
//! unwritten. Then, once the peers' registration caches are full (after a
//! warm-up), the same counters as `churn` must not grow.

use super::churn::{counters, grown};
use gpucoll::{Communicator, DeviceBuffer};
use std::fmt::Write as _;
use std::time::Instant;

/// Elements each rank contributes (4 MiB of f32: every call also spreads
/// its copies over the copy-engine lanes).
const COUNT: usize = 1 << 20;

/// Rank `r`'s value at `j` in cycle `i`.
fn value(r: usize, j: usize, i: usize) -> f32 {
    ((r * 31 + i * 7 + j % 97) % 1009) as f32
}

fn cycle(world: &Communicator, gpu: i32, i: usize) -> gpucoll::Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let mine: Vec<f32> = (0..COUNT).map(|j| value(rank, j, i)).collect();
    let din = DeviceBuffer::from_host(gpu, &mine)?;
    let mut dout = DeviceBuffer::<f32>::from_host(gpu, &vec![-1.0; COUNT * n])?;
    world.all_gather_into(&din, &mut dout)?;
    let got = dout.to_vec()?;
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(k, &x)| x != value(k / COUNT, k % COUNT, i))
        .count();
    Ok(bad)
}

/// Returns the number of failures (a cycle with wrong elements counts
/// once, and each counter that grew).
pub(crate) fn stage_ce_churn(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = world
        .device()
        .ok_or_else(|| gpucoll::Error::Backend("ce_churn needs the CUDA backend".into()))?;
    if std::env::var("GPUCOLL_CE").ok().as_deref() != Some("1") {
        let _ = writeln!(
            log,
            "rank {rank}: GPUCOLL_CE=1 is not set: the kernels would run"
        );
        return Ok(1);
    }
    let cycles: usize = std::env::var("GPU_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut fails = 0usize;
    let mut wrong = 0usize;
    // Warm-up beyond the registration cache's size (32 mappings).
    for i in 0..64 {
        let b = cycle(world, gpu, i)?;
        wrong += b;
        fails += usize::from(b > 0);
    }
    world.barrier()?;
    let before = counters(gpu)?;
    let t = Instant::now();
    for i in 0..cycles {
        let b = cycle(world, gpu, 64 + i)?;
        wrong += b;
        fails += usize::from(b > 0);
    }
    world.barrier()?;
    let after = counters(gpu)?;
    let _ = writeln!(
        log,
        "rank {rank}: {cycles} allocate/all_gather/free cycles of {} MiB outputs in {:.1} s \
         ({:.2} ms each), {wrong} wrong elements",
        (COUNT * 4 * world.size()) >> 20,
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3 / cycles.max(1) as f64
    );
    // Device memory may move by what one evicted mapping keeps alive
    // until its event completed (one peer output).
    let device_kib = (COUNT * 4 * world.size() / 1024) as i64 + 2048;
    fails += grown(rank, &before, &after, device_kib, log);
    Ok(fails)
}
