//! A cudarc program averaging its gradients with gpucoll (feature `cudarc`).
//!
//! The buffers are cudarc `CudaSlice`s on a cudarc stream; the all_reduce
//! is queued on that stream (`world.on_stream`), in order with the
//! program's other work on it, without blocking the host. Needs the CUDA
//! backend (a GPU per rank, or ranks sharing GPUs).
//!
//! ```text
//! cargo build --release --example cudarc_allreduce --features cudarc
//! mpirun -n 2 target/release/examples/cudarc_allreduce
//! ```

use cudarc::driver::CudaContext;
use gpucoll::prelude::*;

fn main() {
    if let Err(e) = run() {
        eprintln!("cudarc_allreduce: {e}");
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
    let cu = |e: cudarc::driver::DriverError| Error::Backend(format!("cudarc: {e:?}"));
    let ctx = CudaContext::new(gpu as usize).map_err(cu)?;
    let stream = ctx.new_stream().map_err(cu)?;

    let n = 1 << 22;
    let (rank, size) = (world.rank(), world.size());
    // Each rank's "gradients": rank + j % 7, so the average is exact.
    let grads: Vec<f32> = (0..n).map(|j| (rank + j % 7) as f32).collect();
    let mut dgrads = stream.clone_htod(&grads).map_err(cu)?;

    let on = world.on_stream(&stream)?;
    for _step in 0..3 {
        // Queued behind the upload; the host goes on at once.
        on.all_reduce_in_place(&mut dgrads, ReduceOp::Sum)?;
    }
    let got: Vec<f32> = stream.clone_dtoh(&dgrads).map_err(cu)?;
    world.async_error()?;

    // After three sums every element is size^2 times (size^0 + ...):
    // sum_r (r + j%7), then multiplied by size, twice.
    let base = |j: usize| (0..size).map(|r| (r + j % 7) as f32).sum::<f32>();
    let scale = (size * size) as f32;
    let wrong = (0..n).filter(|&j| got[j] != base(j) * scale).count();
    if wrong > 0 {
        return Err(Error::InvalidUsage(format!("{wrong} wrong elements")));
    }
    if rank == 0 {
        println!("cudarc: 3 all_reduces of {n} f32 queued on a cudarc stream, {size} ranks, results exact");
    }
    Ok(())
}
