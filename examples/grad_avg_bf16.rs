//! Data-parallel training's gradient averaging, in bf16, overlapped with
//! compute.
//!
//! The backward pass produces gradients bucket by bucket (last layer
//! first). As soon as a bucket is ready its average across ranks starts as
//! an immediate all_reduce, while the next bucket is being computed; the
//! optimizer waits for all of them at the end of the step. On the CUDA
//! backend the buckets live in GPU memory, on the host backend in `Vec`s.
//!
//! ```text
//! cargo build --release --example grad_avg_bf16
//! mpirun -n 4 target/release/examples/grad_avg_bf16
//! ```

use gpucoll::prelude::*;

/// Bucket sizes of a small model's layers (elements), last layer first.
const BUCKETS: [usize; 5] = [3 << 20, 1 << 20, 257, 4 << 20, 65_537];

/// A gradient bucket the "backward pass" writes and the optimizer reads.
trait Bucket: BufferMut<Elem = bf16> {
    fn store(&mut self, host: &[bf16]) -> Result<()>;
    fn load(&self) -> Result<Vec<bf16>>;
}

impl Bucket for Vec<bf16> {
    fn store(&mut self, host: &[bf16]) -> Result<()> {
        self.copy_from_slice(host);
        Ok(())
    }
    fn load(&self) -> Result<Vec<bf16>> {
        Ok(self.clone())
    }
}

#[cfg(feature = "cuda")]
impl Bucket for gpucoll::DeviceBuffer<bf16> {
    fn store(&mut self, host: &[bf16]) -> Result<()> {
        self.copy_from_host(host)
    }
    fn load(&self) -> Result<Vec<bf16>> {
        self.to_vec()
    }
}

/// This rank's gradient of layer `layer` at step `step`: small integers
/// (2·rank + (j + layer + step) mod 5), so the average is exact in bf16.
fn gradient(rank: usize, layer: usize, step: usize, len: usize) -> Vec<bf16> {
    (0..len)
        .map(|j| bf16::from_f32((2 * rank + (j + layer + step) % 5) as f32))
        .collect()
}

fn train<B: Bucket>(world: &Communicator, mut buckets: Vec<B>) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    for step in 0..3 {
        let t = std::time::Instant::now();
        gpucoll::scope(|s| {
            let mut pending = Vec::new();
            for (layer, bucket) in buckets.iter_mut().enumerate() {
                // "Backward" for this layer: runs while the previous
                // buckets' all_reduces are in flight.
                let g = gradient(rank, layer, step, BUCKETS[layer]);
                bucket.store(&g)?;
                pending.push(world.immediate_all_reduce_in_place(s, bucket, ReduceOp::Avg)?);
            }
            // The optimizer needs every bucket.
            pending.into_iter().try_for_each(|r| r.wait())
        })?;
        let secs = t.elapsed().as_secs_f64();
        // Average over ranks of 2·rank + k is (size - 1) + k.
        for (layer, bucket) in buckets.iter().enumerate() {
            let got = bucket.load()?;
            let wrong = got
                .iter()
                .enumerate()
                .filter(|&(j, v)| v.to_f32() != ((size - 1) + (j + layer + step) % 5) as f32)
                .count();
            if wrong > 0 {
                return Err(Error::InvalidUsage(format!(
                    "step {step} layer {layer}: {wrong} wrong averages"
                )));
            }
        }
        if rank == 0 {
            let elems: usize = BUCKETS.iter().sum();
            println!(
                "step {step}: averaged {elems} bf16 gradients in {} buckets on {size} ranks ({} backend) in {:.1} ms",
                BUCKETS.len(),
                world.backend_name(),
                secs * 1e3
            );
        }
    }
    Ok(())
}

fn run() -> Result<()> {
    let universe = gpucoll::initialize()?;
    let world = universe.world()?;
    #[cfg(feature = "cuda")]
    if world.device().is_some() {
        let buckets = BUCKETS
            .iter()
            .map(|&n| world.alloc::<bf16>(n))
            .collect::<Result<Vec<_>>>()?;
        return train(&world, buckets);
    }
    let buckets = BUCKETS.iter().map(|&n| vec![bf16::ZERO; n]).collect();
    train(&world, buckets)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("grad_avg_bf16: {e}");
        std::process::exit(1);
    }
}
