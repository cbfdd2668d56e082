//! `--stage timeout`: a rank skips an all_reduce; every rank must get an
//! error within the timeout and exit.

use super::sum_raw;
use gpucoll::mpi::MpiComm;
use gpucoll::{Communicator, CudaStream, DeviceBuffer, ReduceOp};
use std::fmt::Write as _;
use std::time::Instant;

/// (c) GPUCOLL_TIMEOUT (5 s in the script): rank 1 skips one all_reduce,
/// first blocking (on a duplicate), then on a stream (on the world);
/// every rank must report Timeout/PeerFailed (or, for rank 1 afterwards,
/// any fatal error) within timeout + 15 s, and exit.
pub(crate) fn stage_timeout(
    world: &Communicator,
    mpi: &MpiComm,
    log: &mut String,
) -> gpucoll::Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let gpu = world.device().ok_or_else(|| {
        gpucoll::Error::Backend(format!("no GPU ({} backend)", world.backend_name()))
    })?;
    let limit = world.config().timeout + std::time::Duration::from_secs(15);
    // Progress on stderr as it happens: if the stage is killed at its
    // time limit, the log shows how far each rank got.
    let t0 = Instant::now();
    let say = |what: &str| {
        eprintln!(
            "gpu_check: rank {rank} +{:.1} s: {what}",
            t0.elapsed().as_secs_f64()
        )
    };
    let mut fails = 0usize;
    let dup = world.duplicate()?;
    let count = 262_144usize;
    let din = DeviceBuffer::from_host(gpu, &vec![1f32; count])?;
    let mut dout = DeviceBuffer::<f32>::zeroed(gpu, count)?;
    let expected = |e: &gpucoll::Error, late: bool| match e {
        gpucoll::Error::Timeout { .. } | gpucoll::Error::PeerFailed(_) => true,
        gpucoll::Error::CommunicatorFailed(_) | gpucoll::Error::Aborted => late,
        _ => false,
    };
    let judge = |what: &str, r: gpucoll::Result<()>, t: Instant, late: bool, log: &mut String| {
        let el = t.elapsed();
        match r {
            Err(e) if expected(&e, late) && el <= limit => {
                let _ = writeln!(
                    log,
                    "rank {rank} ok: {what}: {e} after {:.1} s",
                    el.as_secs_f64()
                );
                0usize
            }
            other => {
                let _ = writeln!(
                    log,
                    "rank {rank} WRONG {what}: {other:?} after {:.1} s (limit {:.0} s)",
                    el.as_secs_f64(),
                    limit.as_secs_f64()
                );
                1
            }
        }
    };
    // Phase A: blocking call, rank 1 skips it.
    say("phase A (blocking, rank 1 skips)");
    if rank != 1 {
        let t = Instant::now();
        let r = dup.all_reduce_into(&din, &mut dout, ReduceOp::Sum);
        fails += judge(
            "blocking all_reduce while rank 1 skips it",
            r,
            t,
            false,
            log,
        );
    }
    say("phase A: first barrier");
    mpi.barrier()?;
    if rank == 1 {
        say("phase A: rank 1's late call");
        let t = Instant::now();
        let r = dup.all_reduce_into(&din, &mut dout, ReduceOp::Sum);
        fails += judge("rank 1's late blocking all_reduce", r, t, true, log);
    }
    say("phase A: second barrier");
    mpi.barrier()?;
    say("phase B (stream, rank 1 skips)");
    // Phase B: on a stream, rank 1 skips it; the error arrives through
    // the watchdog (async_error) and the next call.
    let stream = CudaStream::new(gpu)?;
    let poll = |t: Instant| -> gpucoll::Result<()> {
        loop {
            world.async_error()?;
            if t.elapsed() > limit {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    if rank != 1 {
        let t = Instant::now();
        // SAFETY: the buffers outlive the stream work (synchronized below).
        let q = unsafe { sum_raw(world, &din, &dout, count, Some(stream.raw())) };
        if let Err(e) = q {
            fails += 1;
            let _ = writeln!(
                log,
                "rank {rank} WRONG queuing the stream all_reduce failed: {e}"
            );
        }
        fails += judge(
            "stream all_reduce while rank 1 skips it (async_error)",
            poll(t),
            t,
            false,
            log,
        );
        say("phase B: stream synchronize");
        stream.synchronize()?;
        say("phase B: the next call");
        let t = Instant::now();
        let r = unsafe { sum_raw(world, &din, &dout, count, Some(stream.raw())) };
        fails += judge("the next call after the stream timeout", r, t, true, log);
    }
    say("phase B: barrier");
    mpi.barrier()?;
    if rank == 1 {
        say("phase B: rank 1's late stream call");
        let t = Instant::now();
        // SAFETY: as above.
        let q = unsafe { sum_raw(world, &din, &dout, count, Some(stream.raw())) };
        let r = q.and_then(|_| poll(t));
        fails += judge("rank 1's late stream all_reduce", r, t, true, log);
        say("phase B: rank 1's stream synchronize");
        stream.synchronize()?;
    }
    say("done; dropping the duplicate communicator");
    let _ = n;
    Ok(fails)
}
