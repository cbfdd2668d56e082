//! `--perf`: blocking and pipelined timings of collectives on f32 device
//! buffers, with the bus bandwidth and the tuner's choice.

use super::env::Env;
use gpucoll::backend::{Backend, BoundPlan, Launch};
use gpucoll::task::Task;
use gpucoll::{Buffer, BufferMut, CollKind, Datatype, DeviceBuffer, RawBuffer, ReduceOp};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// Time `iters` calls of `task`: (submit + wait each, back to back then
/// one wait), in µs per call.
pub(crate) fn time_task(
    env: &mut Env,
    task: Task,
    i: RawBuffer,
    o: RawBuffer,
    iters: usize,
) -> gpucoll::Result<(f64, f64)> {
    for _ in 0..3 {
        env.run(vec![(task, i, o)])?;
    }
    env.mpi.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        env.run(vec![(task, i, o)])?;
    }
    let sync_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let plan = Arc::new(env.plan(&task));
    // Twice: the first pass fills the backend's pool of launch buffers.
    let mut async_us = 0.0;
    for _ in 0..2 {
        env.mpi.barrier()?;
        let t = Instant::now();
        let mut pend = Vec::with_capacity(iters);
        for _ in 0..iters {
            let launch = Launch {
                first_seq: env.seq,
                stream: None,
                items: vec![BoundPlan {
                    plan: plan.clone(),
                    input: i,
                    output: o,
                }],
            };
            env.seq += 1;
            // SAFETY: the buffers outlive every pending call (all waited below).
            pend.push(unsafe { env.backend.submit(launch)? });
        }
        for mut w in pend {
            w.wait()?;
        }
        async_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    }
    Ok((sync_us, async_us))
}

/// `--perf SPEC`: SPEC is a comma list of `coll:bytes` (bytes with an
/// optional k/m/g suffix; the nccl-tests size: the larger buffer).
pub(crate) fn perf(env: &mut Env, spec: &str, log: &mut String) -> gpucoll::Result<()> {
    let n = env.n as u64;
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let (coll, size) = item.split_once(':').unwrap_or(("all_reduce", item));
        let kind = CollKind::parse(coll).unwrap_or(CollKind::AllReduce);
        let size = size.trim().to_ascii_lowercase();
        let (num, mul) = match size.chars().last() {
            Some('k') => (&size[..size.len() - 1], 1u64 << 10),
            Some('m') => (&size[..size.len() - 1], 1 << 20),
            Some('g') => (&size[..size.len() - 1], 1 << 30),
            _ => (&size[..], 1),
        };
        let bytes = num.parse::<u64>().unwrap_or(0) * mul;
        let total = (bytes / 4).max(1);
        let per = match kind {
            CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => {
                (total / n).max(1)
            }
            _ => total,
        };
        let (in_len, out_len) = match kind {
            CollKind::AllGather => (per, per * n),
            CollKind::ReduceScatter => (per * n, per),
            CollKind::AllToAll => (per * n, per * n),
            _ => (per, per),
        };
        let src = DeviceBuffer::<f32>::zeroed(env.gpu, in_len as usize)?;
        let mut dst = DeviceBuffer::<f32>::zeroed(env.gpu, out_len as usize)?;
        let task = Task {
            kind,
            dtype: Datatype::F32,
            op: ReduceOp::Sum,
            count: per,
            root: 0,
            in_place: false,
        };
        let b = in_len.max(out_len) * 4;
        let iters = if b >= 256 << 20 {
            10
        } else if b >= 16 << 20 {
            30
        } else {
            200
        };
        let (sync_us, async_us) = time_task(env, task, src.raw(), dst.raw_mut(), iters)?;
        let nf = env.n as f64;
        let factor = match kind {
            CollKind::AllReduce => 2.0 * (nf - 1.0) / nf,
            CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => (nf - 1.0) / nf,
            _ => 1.0,
        };
        let busbw = b as f64 / async_us / 1e3 * factor;
        let choice = env.tuner.choose(&task);
        let _ = writeln!(
            log,
            "perf {:<14} {:>11} B  sync {:>9.1} us  async {:>9.1} us  busbw {:>7.1} GB/s  {} {}ch",
            kind.name(),
            b,
            sync_us,
            async_us,
            busbw,
            choice.algorithm,
            choice.nchannels
        );
    }
    Ok(())
}
