//! A training step captured into a CUDA graph and replayed.
//!
//! The step (scale the gradients, all_reduce them, broadcast a flag from
//! rank 0) is recorded once on a stream with `begin_capture`; each
//! iteration then replays the whole step with one graph launch, with no
//! per-call host work. Needs the CUDA backend.
//!
//! ```text
//! cargo build --release --example graph_step
//! mpirun -n 2 target/release/examples/graph_step
//! ```

use gpucoll::prelude::*;
use gpucoll::{CudaStream, DeviceBuffer};

fn main() {
    if let Err(e) = run() {
        eprintln!("graph_step: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let universe = gpucoll::initialize()?;
    let world = universe.world()?;
    let Some(gpu) = world.device() else {
        return Err(Error::InvalidUsage(
            "this example needs the CUDA backend (no GPU found)".into(),
        ));
    };
    let (rank, size) = (world.rank(), world.size());
    let n = 1 << 20;
    let stream = CudaStream::new(gpu)?;
    let mut grads: DeviceBuffer<f32> = world.alloc(n)?;
    let mut flag: DeviceBuffer<i32> = world.alloc(1)?;

    // Record the step once. The captured collectives keep their buffers'
    // addresses: refill the same buffers before each replay.
    stream.begin_capture()?;
    let captured = (|| {
        // SAFETY: both buffers are device memory of this GPU that outlives
        // the graph and its replays (they are dropped after the loop, and
        // every replay is synchronized before anything else touches them).
        unsafe {
            world.all_reduce_raw(
                grads.as_ptr(),
                grads.as_mut_ptr(),
                n as u64,
                Datatype::F32,
                ReduceOp::Avg,
                Some(stream.raw()),
            )?;
            world.broadcast_raw(flag.as_mut_ptr(), 1, Datatype::I32, 0, Some(stream.raw()))
        }
    })();
    let graph = stream.end_capture()?;
    captured?;

    for step in 0..5i32 {
        let host: Vec<f32> = (0..n)
            .map(|j| (rank as i32 * 2 + step + (j % 3) as i32) as f32)
            .collect();
        grads.copy_from_host(&host)?;
        flag.copy_from_host(&[if rank == 0 { step + 100 } else { -1 }])?;
        graph.launch(&stream)?;
        stream.synchronize()?;
        world.async_error()?;
        let got = grads.to_vec()?;
        // The average of rank*2 + step + j%3 over ranks: (size-1) + step + j%3.
        let wrong = (0..n)
            .filter(|&j| got[j] != ((size as i32 - 1) + step + (j % 3) as i32) as f32)
            .count();
        let f = flag.to_vec()?[0];
        if wrong > 0 || f != step + 100 {
            return Err(Error::InvalidUsage(format!(
                "step {step}: {wrong} wrong gradients, flag {f}"
            )));
        }
    }
    if rank == 0 {
        println!("graph_step: 5 replays of a captured all_reduce(avg) + broadcast on {size} ranks, exact");
    }
    Ok(())
}
