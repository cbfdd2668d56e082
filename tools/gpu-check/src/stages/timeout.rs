//! `--stage timeout`: a rank skips an all_reduce (an all_gather with
//! `GPU_TIMEOUT_CE=1`, run with `GPUCOLL_CE=1`: a copy-engine collective;
//! with `GPUCOLL_REGISTERED=1` the all_reduce asks for the peer kernels);
//! every rank must get an error within the timeout and exit.

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
    let ce = std::env::var("GPU_TIMEOUT_CE").ok().as_deref() == Some("1");
    // Peer kernels (GPUCOLL_REGISTERED=1) meet on the host when queued too.
    let host_rendezvous = ce || std::env::var("GPUCOLL_REGISTERED").ok().as_deref() == Some("1");
    let din = DeviceBuffer::from_host(gpu, &vec![1f32; count])?;
    let out_len = if ce { count * n } else { count };
    let mut dout = DeviceBuffer::<f32>::zeroed(gpu, out_len)?;
    let what = if ce { "all_gather" } else { "all_reduce" };
    // The skipped collective, blocking on `comm` or queued on `stream`.
    let call = |comm: &Communicator,
                dout: &mut DeviceBuffer<f32>,
                stream: Option<gpucoll::CudaStreamRaw>|
     -> gpucoll::Result<()> {
        match (ce, stream) {
            (false, None) => comm.all_reduce_into(&din, dout, ReduceOp::Sum),
            (true, None) => comm.all_gather_into(&din, dout),
            // SAFETY: the buffers outlive the stream work (synchronized
            // before they are dropped).
            (false, Some(_)) => unsafe { sum_raw(comm, &din, dout, count, stream) },
            (true, Some(_)) => unsafe {
                comm.all_gather_raw(
                    super::vp(&din),
                    super::vp(dout),
                    count as u64,
                    gpucoll::Datatype::F32,
                    stream,
                )
            },
        }
    };
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
        let r = call(&dup, &mut dout, None);
        fails += judge(
            &format!("blocking {what} while rank 1 skips it"),
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
        let r = call(&dup, &mut dout, None);
        fails += judge(&format!("rank 1's late blocking {what}"), r, t, true, log);
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
        match call(world, &mut dout, Some(stream.raw())) {
            // A copy-engine collective, and a call that asks for the peer
            // kernels, meet their peers on the host when queued: the
            // queuing call itself times out.
            Err(e) if host_rendezvous => {
                fails += judge(&format!("queuing the stream {what}"), Err(e), t, false, log)
            }
            Err(e) => {
                fails += 1;
                let _ = writeln!(
                    log,
                    "rank {rank} WRONG queuing the stream {what} failed: {e}"
                );
            }
            Ok(()) => {
                fails += judge(
                    &format!("stream {what} while rank 1 skips it (async_error)"),
                    poll(t),
                    t,
                    false,
                    log,
                )
            }
        }
        say("phase B: stream synchronize");
        stream.synchronize()?;
        say("phase B: the next call");
        let t = Instant::now();
        let r = call(world, &mut dout, Some(stream.raw()));
        fails += judge("the next call after the stream timeout", r, t, true, log);
    }
    say("phase B: barrier");
    mpi.barrier()?;
    if rank == 1 {
        say("phase B: rank 1's late stream call");
        let t = Instant::now();
        let r = call(world, &mut dout, Some(stream.raw())).and_then(|_| poll(t));
        fails += judge(&format!("rank 1's late stream {what}"), r, t, true, log);
        say("phase B: rank 1's stream synchronize");
        stream.synchronize()?;
    }
    say("done; dropping the duplicate communicator");
    let _ = n;
    Ok(fails)
}
