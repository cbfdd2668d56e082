//! `--stage dead_peer` (3 ranks or more, under `mpirun --enable-recovery`):
//! the last rank aborts (SIGABRT) between blocking all_reduces on
//! device buffers; every survivor must get an error naming it within 2 s,
//! with the default `GPUCOLL_TIMEOUT`. No MPI verdict (a rank is gone):
//! each survivor prints one `DEADPEER ok` or `DEADPEER FAIL` line and exits
//! after freeing its communicator, without finalizing MPI.

use gpucoll::{Communicator, DeviceBuffer, ReduceOp};
use std::time::{Duration, Instant};

pub(crate) fn stage_dead_peer(world: Communicator) -> ! {
    let (rank, n) = (world.rank(), world.size());
    let victim = n - 1;
    let Some(gpu) = world.device() else {
        println!(
            "DEADPEER FAIL rank {rank}: no GPU ({} backend)",
            world.backend_name()
        );
        std::process::exit(1);
    };
    let count = 16_384usize;
    let run = || -> gpucoll::Result<DeviceBuffer<f32>> {
        let din = DeviceBuffer::from_host(gpu, &vec![1f32; count])?;
        let mut dout = DeviceBuffer::<f32>::zeroed(gpu, count)?;
        let mut last_ok = Instant::now();
        for i in 0u64.. {
            if rank == victim && i == 200 {
                std::process::abort();
            }
            if let Err(e) = world.all_reduce_into(&din, &mut dout, ReduceOp::Sum) {
                let after = last_ok.elapsed();
                let msg = e.to_string();
                let ok = msg.contains(&format!("rank {victim}"))
                    && matches!(
                        e,
                        gpucoll::Error::PeerFailed(_) | gpucoll::Error::CommunicatorFailed(_)
                    )
                    && after < Duration::from_secs(2);
                let verdict = if ok { "DEADPEER ok" } else { "DEADPEER FAIL" };
                println!(
                    "{verdict} rank {rank}: error after {:.3} s: {msg}",
                    after.as_secs_f64()
                );
                return Ok(dout);
            }
            last_ok = Instant::now();
            if i > 1_000_000 {
                println!("DEADPEER FAIL rank {rank}: no error after {i} calls");
                std::process::exit(1);
            }
        }
        unreachable!("the loop ends by returning")
    };
    let code = match run() {
        Ok(_) => 0,
        Err(e) => {
            println!("DEADPEER FAIL rank {rank}: setup: {e}");
            1
        }
    };
    drop(world);
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
