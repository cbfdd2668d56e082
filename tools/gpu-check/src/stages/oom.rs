//! `--stage oom`: every rank fills its GPU's memory first, then asks for
//! what needs more device memory: a new communicator (its FIFOs), a
//! collective on host buffers (staged through device memory) on a duplicate
//! made beforehand. Each must either succeed or fail with an error:
//! out-of-memory (`is_out_of_memory`) on a rank whose own allocation failed;
//! on the others a setup error naming that rank, or (for the collective,
//! whose peers had started) the error of a failed communicator within the
//! timeout; never a panic or a hang. After the memory is given back the
//! world communicator still works and a new duplicate can be made.

use gpucoll::{Communicator, DeviceBuffer, ReduceOp};
use std::fmt::Write as _;

/// Fill the GPU with allocations (1 GiB, then 16 MiB, then 1 MiB chunks).
fn hog(gpu: i32) -> gpucoll::Result<Vec<DeviceBuffer<u8>>> {
    let mut held = Vec::new();
    for chunk in [1usize << 30, 16 << 20, 1 << 20] {
        loop {
            match DeviceBuffer::<u8>::zeroed(gpu, chunk) {
                Ok(b) => held.push(b),
                Err(e) if e.is_out_of_memory() => break,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(held)
}

pub(crate) fn stage_oom(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = world
        .device()
        .ok_or_else(|| gpucoll::Error::Backend("oom needs the CUDA backend".into()))?;
    let mut fails = 0usize;
    // The communicator the pressure is applied to; `world` must not suffer.
    let victim = world.duplicate()?;
    let (free0, total) = gpucoll::device_memory(gpu)?;
    let held = hog(gpu)?;
    let (free1, _) = gpucoll::device_memory(gpu)?;
    let mut token = [0u8];
    gpucoll::reference::all_reduce(world, &[0u8], &mut token, ReduceOp::Max)?;
    let _ = writeln!(
        log,
        "rank {rank}: GPU {gpu} filled: {} MiB free of {} before, {} MiB after ({} allocations)",
        free0 >> 20,
        total >> 20,
        free1 >> 20,
        held.len()
    );
    let mut judge = |what: &str, r: gpucoll::Result<()>, log: &mut String| match r {
        Ok(()) => {
            let _ = writeln!(log, "rank {rank} ok: {what}: succeeded");
        }
        // A setup stage that failed on another rank names that rank; a
        // collective whose peer could not take part fails that communicator.
        Err(e)
            if e.is_out_of_memory()
                || e.to_string().contains("ranks [")
                || matches!(
                    e,
                    gpucoll::Error::Timeout { .. }
                        | gpucoll::Error::PeerFailed(_)
                        | gpucoll::Error::CommunicatorFailed(_)
                ) =>
        {
            let _ = writeln!(log, "rank {rank} ok: {what}: {e}");
        }
        Err(e) => {
            fails += 1;
            let _ = writeln!(log, "rank {rank} WRONG {what}: {e:?}");
        }
    };
    let dup = world.duplicate();
    let dup_ok = dup.is_ok();
    judge("duplicate with a full GPU", dup.map(drop), log);
    // 64 MiB of host memory each way: staged through device memory.
    let n = 16 << 20;
    let send = vec![1f32; n];
    let mut recv = vec![0f32; n];
    let t = std::time::Instant::now();
    let staged = victim.all_reduce_into(&send[..], &mut recv[..], ReduceOp::Sum);
    let staged_ok = staged.is_ok();
    // A rank whose staging allocation failed tells its peers at once: they
    // must not sit out GPUCOLL_TIMEOUT.
    let _ = writeln!(
        log,
        "rank {rank}: staged all_reduce under pressure returned after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    judge(
        "all_reduce of 64 MiB host buffers with a full GPU (on a duplicate)",
        staged,
        log,
    );
    if staged_ok && recv.iter().any(|&x| x != world.size() as f32) {
        fails += 1;
        let _ = writeln!(log, "rank {rank} WRONG staged all_reduce result");
    }
    drop(held);
    gpucoll::reference::all_reduce(world, &[0u8], &mut token, ReduceOp::Max)?;
    drop(victim);
    // Everything works again.
    let din = DeviceBuffer::from_host(gpu, &vec![2f32; 4096])?;
    let mut dout = DeviceBuffer::<f32>::zeroed(gpu, 4096)?;
    world.all_reduce_into(&din, &mut dout, ReduceOp::Sum)?;
    if dout
        .to_vec()?
        .iter()
        .any(|&x| x != 2.0 * world.size() as f32)
    {
        fails += 1;
        let _ = writeln!(
            log,
            "rank {rank} WRONG all_reduce after the memory came back"
        );
    }
    let again = world.duplicate()?;
    again.all_reduce_into(&din, &mut dout, ReduceOp::Sum)?;
    again.free()?;
    let _ = writeln!(
        log,
        "rank {rank}: after freeing: all_reduce and a new communicator work (duplicate under pressure {}, staged call {})",
        if dup_ok { "succeeded" } else { "failed cleanly" },
        if staged_ok { "succeeded" } else { "failed cleanly" }
    );
    Ok(fails)
}
