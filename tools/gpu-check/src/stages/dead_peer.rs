//! `--stage dead_peer` (3 ranks or more, under `mpirun --enable-recovery`):
//! the last rank dies while the others keep issuing all_reduces on device
//! buffers; every survivor must get an error naming it within 2 s, with
//! the default `GPUCOLL_TIMEOUT`. No MPI verdict (a rank is gone): each
//! survivor prints one `DEADPEER ok` or `DEADPEER FAIL` line and exits
//! after freeing its communicator, without finalizing MPI.
//!
//! With `GPUCOLL_CE=1` the collective is a copy-engine all_gather instead.
//! `GPU_DEADPEER_MODE` picks what the survivors are doing when it dies:
//! `blocking` (blocking calls, the default), `immediate` (an immediate
//! request, then wait), `stream` (ten calls queued on a stream, then a
//! synchronize and `async_error`) or `graph` (a captured all_reduce
//! replayed, then a synchronize and `async_error`). `GPU_DEADPEER_KILL`
//! picks how it dies: `abort` (SIGABRT, the default), `kill9` (SIGKILL)
//! or `segv` (SIGSEGV).

use super::sum_raw;
use gpucoll::request::scope;
use gpucoll::{Communicator, CudaStream, DeviceBuffer, ReduceOp};
use std::time::{Duration, Instant};

/// How the victim dies.
fn die(kill: &str) -> ! {
    let sig = match kill {
        "kill9" => libc::SIGKILL,
        "segv" => libc::SIGSEGV,
        _ => std::process::abort(),
    };
    // SAFETY: raise only sends a signal to this process; both signals end it.
    unsafe { libc::raise(sig) };
    std::process::abort()
}

pub(crate) fn stage_dead_peer(world: Communicator) -> ! {
    let (rank, n) = (world.rank(), world.size());
    let victim = n - 1;
    let mode = std::env::var("GPU_DEADPEER_MODE").unwrap_or_else(|_| "blocking".into());
    let kill = std::env::var("GPU_DEADPEER_KILL").unwrap_or_else(|_| "abort".into());
    let Some(gpu) = world.device() else {
        println!(
            "DEADPEER FAIL rank {rank}: no GPU ({} backend)",
            world.backend_name()
        );
        std::process::exit(1);
    };
    let count = 16_384usize;
    // With GPUCOLL_CE=1 the survivors issue copy-engine all_gathers instead
    // (a peer dying while their streams wait in the copy engines' flags).
    let ce = std::env::var("GPUCOLL_CE").ok().as_deref() == Some("1");
    let run = || -> gpucoll::Result<()> {
        let din = DeviceBuffer::from_host(gpu, &vec![1f32; count])?;
        let mut dout = DeviceBuffer::<f32>::zeroed(gpu, if ce { count * n } else { count })?;
        let stream = CudaStream::new(gpu)?;
        let s = Some(stream.raw());
        // Queue one collective on `s`.
        let queue = |dout: &DeviceBuffer<f32>| -> gpucoll::Result<()> {
            if ce {
                // SAFETY: din and dout outlive the work: the stream is
                // synchronized before this closure's buffers drop.
                unsafe {
                    world.all_gather_raw(
                        super::vp(&din),
                        super::vp(dout),
                        count as u64,
                        gpucoll::Datatype::F32,
                        s,
                    )
                }
            } else {
                // SAFETY: as above.
                unsafe { sum_raw(&world, &din, dout, count, s) }
            }
        };
        let graph = if mode == "graph" {
            stream.begin_capture()?;
            // din and dout outlive the graph and every replay (all end
            // with this closure, after a synchronize).
            let captured = queue(&dout);
            let graph = stream.end_capture();
            captured?;
            Some(graph?)
        } else {
            None
        };
        // One step of the survivors' work: Ok(()) when it completed.
        let mut step = || -> gpucoll::Result<()> {
            match mode.as_str() {
                "immediate" if ce => {
                    scope(|sc| world.immediate_all_gather_into(sc, &din, &mut dout)?.wait())
                }
                "immediate" => scope(|sc| {
                    world
                        .immediate_all_reduce_into(sc, &din, &mut dout, ReduceOp::Sum)?
                        .wait()
                }),
                "stream" => {
                    for _ in 0..10 {
                        // As above; synchronized before returning.
                        queue(&dout)?;
                    }
                    stream.synchronize()?;
                    world.async_error()
                }
                "graph" => {
                    graph.as_ref().expect("captured above").launch(&stream)?;
                    stream.synchronize()?;
                    world.async_error()
                }
                _ if ce => world.all_gather_into(&din, &mut dout),
                _ => world.all_reduce_into(&din, &mut dout, ReduceOp::Sum),
            }
        };
        let mut last_ok = Instant::now();
        for i in 0u64.. {
            if rank == victim && i == 200 {
                die(&kill);
            }
            if let Err(e) = step() {
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
                    "{verdict} rank {rank} ({mode}, victim {kill}): error after {:.3} s: {msg}",
                    after.as_secs_f64()
                );
                // Whatever was queued is over (the kernels saw the abort).
                let _ = stream.synchronize();
                return Ok(());
            }
            last_ok = Instant::now();
            if i > 1_000_000 {
                println!("DEADPEER FAIL rank {rank} ({mode}): no error after {i} calls");
                std::process::exit(1);
            }
        }
        unreachable!("the loop ends by returning")
    };
    let code = match run() {
        Ok(()) => 0,
        Err(e) => {
            println!("DEADPEER FAIL rank {rank} ({mode}): setup: {e}");
            1
        }
    };
    drop(world);
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
