//! `--stage mismatch`: the ranks issue the same all_reduce with different
//! counts (a program bug); every rank must get an error, not a hang and
//! not a crash, within GPUCOLL_TIMEOUT (5 s in the script) + 15 s. The
//! counts are small (LL one-shots) and then a few KiB (Simple one-shots),
//! so the one-shot kernels' header and flag checks meet the mismatch.

use gpucoll::mpi::MpiComm;
use gpucoll::{Communicator, DeviceBuffer, ReduceOp};
use std::fmt::Write as _;
use std::time::Instant;

pub(crate) fn stage_mismatch(
    world: &Communicator,
    mpi: &MpiComm,
    log: &mut String,
) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = world.device().ok_or_else(|| {
        gpucoll::Error::Backend(format!("no GPU ({} backend)", world.backend_name()))
    })?;
    let limit = world.config().timeout + std::time::Duration::from_secs(15);
    let mut fails = 0usize;
    // (count on even ranks, count on odd ranks)
    for (even, odd) in [(2usize, 3usize), (1, 2), (2048, 2052), (8192, 8196)] {
        let count = if rank % 2 == 0 { even } else { odd };
        // A communicator per case: a failed collective may leave its
        // communicator unusable.
        let comm = world.duplicate()?;
        let din = DeviceBuffer::from_host(gpu, &vec![1f32; count])?;
        let mut dout = DeviceBuffer::<f32>::zeroed(gpu, count)?;
        let t = Instant::now();
        let r = comm.all_reduce_into(&din, &mut dout, ReduceOp::Sum);
        let el = t.elapsed();
        let what = format!("all_reduce of {count} floats against {even}/{odd}");
        match r {
            Err(
                e @ (gpucoll::Error::ProtocolMismatch { .. }
                | gpucoll::Error::Timeout { .. }
                | gpucoll::Error::PeerFailed(_)
                | gpucoll::Error::CommunicatorFailed(_)
                | gpucoll::Error::Aborted),
            ) if el <= limit => {
                let _ = writeln!(
                    log,
                    "rank {rank} ok: {what}: {e} after {:.2} s",
                    el.as_secs_f64()
                );
            }
            other => {
                fails += 1;
                let _ = writeln!(
                    log,
                    "rank {rank} WRONG {what}: {other:?} after {:.2} s (limit {:.0} s)",
                    el.as_secs_f64(),
                    limit.as_secs_f64()
                );
            }
        }
        drop(comm);
        mpi.barrier()?;
    }
    Ok(fails)
}
