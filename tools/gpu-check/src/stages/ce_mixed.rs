//! `--stage ce_mixed` (run with `GPUCOLL_CE=1`): copy-engine all_gathers
//! and all_to_alls where some ranks call the in-place form and the others
//! the out-of-place form, the split changing every call. MPI allows the
//! mix; a copy-engine protocol whose handshakes depend on the form (as
//! NCCL's did for all_gather) leaves the ranks a handshake apart, and the
//! next call hangs or reads stale data. Every result is checked.

use gpucoll::{Communicator, DeviceBuffer, Error};
use std::fmt::Write as _;

/// Calls of each collective.
const CALLS: usize = 24;

/// Rank `r`'s element `j` of the block for rank `to` in call `i`.
fn value(r: usize, to: usize, j: usize, i: usize) -> f32 {
    ((r * 131 + to * 17 + i * 7 + j % 89) % 2039) as f32
}

/// Whether rank `r` calls the in-place form in call `i`.
fn in_place(r: usize, i: usize) -> bool {
    (r + i / 2) % 2 == 0
}

fn all_gather(world: &Communicator, gpu: i32, count: usize, i: usize) -> gpucoll::Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let mine: Vec<f32> = (0..count).map(|j| value(rank, 0, j, i)).collect();
    let mut init = vec![-1.0f32; count * n];
    let out = if in_place(rank, i) {
        init[rank * count..(rank + 1) * count].copy_from_slice(&mine);
        let mut b = DeviceBuffer::from_host(gpu, &init)?;
        world.all_gather_in_place(&mut b)?;
        b
    } else {
        let din = DeviceBuffer::from_host(gpu, &mine)?;
        let mut b = DeviceBuffer::from_host(gpu, &init)?;
        world.all_gather_into(&din, &mut b)?;
        b
    };
    let got = out.to_vec()?;
    Ok(got
        .iter()
        .enumerate()
        .filter(|&(k, &x)| x != value(k / count, 0, k % count, i))
        .count())
}

fn all_to_all(world: &Communicator, gpu: i32, count: usize, i: usize) -> gpucoll::Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let input: Vec<f32> = (0..count * n)
        .map(|k| value(rank, k / count, k % count, i))
        .collect();
    let out = if in_place(rank, i) {
        let mut b = DeviceBuffer::from_host(gpu, &input)?;
        world.all_to_all_in_place(&mut b)?;
        b
    } else {
        let din = DeviceBuffer::from_host(gpu, &input)?;
        let mut b = DeviceBuffer::from_host(gpu, &vec![-1.0f32; count * n])?;
        world.all_to_all_into(&din, &mut b)?;
        b
    };
    let got = out.to_vec()?;
    Ok(got
        .iter()
        .enumerate()
        .filter(|&(k, &x)| x != value(k / count, rank, k % count, i))
        .count())
}

/// Returns the number of failures.
pub(crate) fn stage_ce_mixed(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("ce_mixed needs the CUDA backend".into()))?;
    if std::env::var("GPUCOLL_CE").ok().as_deref() != Some("1") {
        let _ = writeln!(
            log,
            "rank {rank}: GPUCOLL_CE=1 is not set: the kernels would run"
        );
        return Ok(1);
    }
    let mut fails = 0;
    // 1 element, a prime, 1 MiB and 8 MiB per block (the last on the lanes).
    for count in [1usize, 4099, 1 << 18, 1 << 21] {
        let (mut ag, mut a2a) = (0, 0);
        for i in 0..CALLS {
            ag += all_gather(world, gpu, count, i)?;
            a2a += all_to_all(world, gpu, count, i)?;
        }
        fails += usize::from(ag > 0) + usize::from(a2a > 0);
        let _ = writeln!(
            log,
            "rank {rank}: {CALLS} all_gathers and {CALLS} all_to_alls of {count} floats per \
             block, in place on every other pair of calls: {ag} + {a2a} wrong elements"
        );
    }
    Ok(fails)
}
