//! `--stage churn`: communicators created and freed in a loop (duplicate
//! and split alternating, each doing a checked all_reduce on device
//! buffers), then the growth of everything a leak would show: free device
//! memory, mappings (IPC and pinned memory appear there), open file
//! descriptors, threads, locked/pinned host memory and gpucoll's /dev/shm
//! entries. `GPU_CHURN_CYCLES` (default 1000) sets the loop length.

use gpucoll::{Communicator, DeviceBuffer, ReduceOp};
use std::fmt::Write as _;
use std::time::Instant;

/// Lines `/proc/self/maps` may gain over a churn stage without a leak:
/// the host heap maps or splits a region now and then (seen once: +1 over
/// 1,000 copy-engine cycles), while a leak per cycle adds hundreds.
pub(crate) const MAPPINGS_SLACK: i64 = 8;

/// Compare counters taken before and after a churn loop, a line each in
/// `log`: the number that grew by more than allowed. Device memory may
/// grow by `device_kib` (what mappings released later still hold, the
/// driver's granularity); `/proc/self/maps` by [`MAPPINGS_SLACK`]; the
/// rest not at all.
pub(crate) fn grown(
    rank: usize,
    before: &[(&str, i64)],
    after: &[(&str, i64)],
    device_kib: i64,
    log: &mut String,
) -> usize {
    let mut fails = 0;
    for ((name, b), (_, a)) in before.iter().zip(after.iter()) {
        let growth = a - b;
        let allowed = match *name {
            n if n.starts_with("device") => device_kib,
            "mappings" => MAPPINGS_SLACK,
            _ => 0,
        };
        let verdict = if growth <= allowed { "ok" } else { "GREW" };
        fails += usize::from(growth > allowed);
        let _ = writeln!(
            log,
            "rank {rank} {verdict}: {name}: {b} -> {a} (growth {growth})"
        );
    }
    fails
}

/// What one process holds, by counter name.
pub(crate) fn counters(gpu: i32) -> gpucoll::Result<Vec<(&'static str, i64)>> {
    let count = |dir: &str| {
        std::fs::read_dir(dir)
            .map(|d| d.count() as i64)
            .unwrap_or(-1)
    };
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map(|s| s.lines().count() as i64)
        .unwrap_or(-1);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(-1)
    };
    let shm = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("gpucoll"))
                .count() as i64
        })
        .unwrap_or(-1);
    let (free, total) = gpucoll::device_memory(gpu)?;
    Ok(vec![
        ("device memory in use (KiB)", ((total - free) / 1024) as i64),
        ("mappings", maps),
        ("open fds", count("/proc/self/fd")),
        ("threads", count("/proc/self/task")),
        ("VmLck (KiB)", kib("VmLck:")),
        ("VmPin (KiB)", kib("VmPin:")),
        ("gpucoll /dev/shm entries", shm),
    ])
}

fn cycle(world: &Communicator, gpu: i32, i: usize) -> gpucoll::Result<usize> {
    let c = if i % 2 == 0 {
        world.duplicate()?
    } else {
        // One color for all: a split that keeps every rank, in reverse order.
        match world.split(Some(7), -(world.rank() as i32))? {
            Some(c) => c,
            None => {
                return Err(gpucoll::Error::Backend(
                    "split returned no communicator".into(),
                ))
            }
        }
    };
    let n = 1000 + (i % 7) * 131;
    let din = DeviceBuffer::from_host(gpu, &vec![(c.rank() + 1) as f32; n])?;
    let mut dout = DeviceBuffer::<f32>::zeroed(gpu, n)?;
    c.all_reduce_into(&din, &mut dout, ReduceOp::Sum)?;
    let want = (c.size() * (c.size() + 1) / 2) as f32;
    let bad = dout.to_vec()?.iter().filter(|&&x| x != want).count();
    c.free()?;
    drop(c);
    Ok(bad)
}

/// Returns the number of failures (wrong elements count as one each cycle,
/// and any counter that grew).
pub(crate) fn stage_churn(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = world
        .device()
        .ok_or_else(|| gpucoll::Error::Backend("churn needs the CUDA backend".into()))?;
    let cycles: usize = std::env::var("GPU_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut fails = 0usize;
    // Warm-up: pools, the module, threads that live as long as the process.
    for i in 0..20 {
        fails += usize::from(cycle(world, gpu, i)? > 0);
    }
    world.barrier()?;
    let before = counters(gpu)?;
    let t = Instant::now();
    for i in 0..cycles {
        fails += usize::from(cycle(world, gpu, i)? > 0);
    }
    world.barrier()?;
    let after = counters(gpu)?;
    let _ = writeln!(
        log,
        "rank {rank}: {cycles} create/collective/free cycles in {:.1} s ({:.1} ms each)",
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3 / cycles.max(1) as f64
    );
    // Device memory may move by the driver's allocation granularity.
    fails += grown(rank, &before, &after, 1024, log);
    Ok(fails)
}
