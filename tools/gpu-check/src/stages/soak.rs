//! `--stage soak`: random collectives for a fixed time (`GPU_SOAK_SECONDS`,
//! default 60): every kind, sizes from 0 to 4 Mi elements, in place or not,
//! batches queued on two callers' streams alternating with blocking calls
//! on the communicator's own stream; every result checked. Every rank
//! draws the same sequence; after each round the ranks agree (over MPI)
//! whether rank 0's time is up. Prints calls, bytes and time.

use super::raw::raw_case;
use super::verify;
use gpucoll::{CollKind, Communicator, CudaStream, ReduceOp};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// A small deterministic generator (xorshift), the same on every rank.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub(crate) fn stage_soak(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = world
        .device()
        .ok_or_else(|| gpucoll::Error::Backend("soak needs the CUDA backend".into()))?;
    let budget = Duration::from_secs(
        std::env::var("GPU_SOAK_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let streams = [CudaStream::new(gpu)?, CudaStream::new(gpu)?];
    let sizes = [
        0u64,
        1,
        2,
        31,
        1001,
        4099,
        65_536,
        262_144,
        1 << 20,
        4 << 20,
    ];
    let mut draw = Draw(0x50a7_5eed_1234_5678);
    let (mut calls, mut bytes, mut wrong, mut round) = (0u64, 0u64, 0usize, 0u64);
    let t0 = Instant::now();
    loop {
        round += 1;
        let mut pend = Vec::new();
        let batch = 1 + draw.below(8);
        for _ in 0..batch {
            let kind = CollKind::ALL[draw.below(CollKind::ALL.len() as u64) as usize];
            let count = sizes[draw.below(sizes.len() as u64) as usize];
            let in_place = kind != CollKind::Broadcast && draw.below(3) == 0;
            let stream = match draw.below(3) {
                0 => None,
                s => Some(streams[s as usize - 1].raw()),
            };
            let p = raw_case(world, gpu, kind, count, in_place, round, stream)?;
            calls += 1;
            bytes += 4 * count * world.size() as u64;
            pend.push(p);
        }
        for s in &streams {
            s.synchronize()?;
        }
        world.async_error()?;
        for p in &pend {
            wrong += verify(p, rank, log)?;
        }
        // Agree on going on: rank 0's clock decides.
        let mine = [u8::from(t0.elapsed() < budget && rank == 0)];
        let mut go = [0u8];
        gpucoll::reference::all_reduce(world, &mine, &mut go, ReduceOp::Max)?;
        if go[0] == 0 {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let _ = writeln!(
        log,
        "rank {rank}: soak {calls} calls in {round} rounds, {:.1} GiB moved, {secs:.1} s, {wrong} wrong elements",
        bytes as f64 / (1u64 << 30) as f64
    );
    Ok(usize::from(wrong > 0))
}
