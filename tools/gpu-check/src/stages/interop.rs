//! `--stage interop`: the public API on cudarc's memory (gpucoll feature
//! `cudarc`). Every collective, out of place and in place (scan and
//! exclusive_scan included), queued on a
//! cudarc stream (`world.on_stream`), then blocking calls taking
//! `CudaSlice`/`CudaView` directly after cudarc work on another stream;
//! sizes 1, a prime and 1 Mi elements; every element compared with the
//! exact result.

use super::{cu, gv};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use gpucoll::{Communicator, Error, ReduceOp, Result};
use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::Arc;

struct Ctx<'a> {
    world: &'a Communicator,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    wrong: Cell<usize>,
}

impl Ctx<'_> {
    fn up(&self, v: &[f32]) -> Result<CudaSlice<f32>> {
        cu(self.stream.clone_htod(v))
    }

    fn check(
        &self,
        what: &str,
        got: &CudaSlice<f32>,
        want: &[f32],
        log: &mut String,
    ) -> Result<()> {
        let got: Vec<f32> = cu(self.stream.clone_dtoh(got))?;
        let bad =
            got.iter().zip(want).filter(|(g, w)| g != w).count() + want.len().abs_diff(got.len());
        if bad > 0 {
            let first = got.iter().zip(want).position(|(g, w)| g != w);
            let _ = writeln!(
                log,
                "rank {} WRONG interop {what}: {bad} elements (first at {first:?})",
                self.rank
            );
            self.wrong.set(self.wrong.get() + bad);
        }
        Ok(())
    }

    fn sum_of(&self, j: u64, it: u64) -> f32 {
        (0..self.size).map(|r| gv(r, j, it)).sum()
    }

    fn run(&self, n: u64, log: &mut String) -> Result<()> {
        let (rank, size, nu) = (self.rank, self.size, n as usize);
        let on = self.world.on_stream(&self.stream)?;
        let mine = |it: u64, len: u64| (0..len).map(|j| gv(rank, j, it)).collect::<Vec<f32>>();
        let root = 1 % size;

        // all_reduce, out of place and in place
        let send = self.up(&mine(0, n))?;
        let mut out = self.up(&vec![-1.0; nu])?;
        on.all_reduce_into(&send, &mut out, ReduceOp::Sum)?;
        let mut inplace = self.up(&mine(0, n))?;
        on.all_reduce_in_place(&mut inplace, ReduceOp::Sum)?;
        let want: Vec<f32> = (0..n).map(|j| self.sum_of(j, 0)).collect();
        self.check(&format!("all_reduce n={n}"), &out, &want, log)?;
        self.check(&format!("all_reduce in place n={n}"), &inplace, &want, log)?;

        // all_gather, out of place and in place
        let send = self.up(&mine(1, n))?;
        let mut out = self.up(&vec![-1.0; nu * size])?;
        on.all_gather_into(&send, &mut out)?;
        let mut ip = vec![-1.0; nu * size];
        ip[rank * nu..(rank + 1) * nu].copy_from_slice(&mine(1, n));
        let mut inplace = self.up(&ip)?;
        on.all_gather_in_place(&mut inplace)?;
        let want: Vec<f32> = (0..size)
            .flat_map(|r| (0..n).map(move |j| gv(r, j, 1)))
            .collect();
        self.check(&format!("all_gather n={n}"), &out, &want, log)?;
        self.check(&format!("all_gather in place n={n}"), &inplace, &want, log)?;

        // reduce_scatter_block and all_to_all on views of larger buffers
        let total = n * size as u64;
        let big = self.up(&mine(2, total + 3))?;
        let mut out = self.up(&vec![-1.0; nu + 5])?;
        {
            let mut view = out.slice_mut(2..2 + nu);
            on.reduce_scatter_block_into(&big.slice(3..), &mut view, ReduceOp::Sum)?;
        }
        let mut want = vec![-1.0; nu + 5];
        for j in 0..nu {
            want[2 + j] = self.sum_of(3 + (rank * nu + j) as u64, 2);
        }
        self.check(
            &format!("reduce_scatter_block views n={n}"),
            &out,
            &want,
            log,
        )?;
        let send = self.up(&mine(3, total))?;
        let mut out = self.up(&vec![-1.0; nu * size])?;
        on.all_to_all_into(&send, &mut out)?;
        let want: Vec<f32> = (0..size)
            .flat_map(|s| (0..n).map(move |j| gv(s, rank as u64 * n + j, 3)))
            .collect();
        self.check(&format!("all_to_all n={n}"), &out, &want, log)?;

        // scan and exclusive_scan, out of place and in place (rank 0's
        // exclusive prefix is never written: it keeps -1, or its input)
        let prefix = |j: u64, upto: usize| (0..upto).map(|r| gv(r, j, 9)).sum::<f32>();
        let send = self.up(&mine(9, n))?;
        let mut out = self.up(&vec![-1.0; nu])?;
        on.scan_into(&send, &mut out, ReduceOp::Sum)?;
        let mut inplace = self.up(&mine(9, n))?;
        on.scan_in_place(&mut inplace, ReduceOp::Sum)?;
        let want: Vec<f32> = (0..n).map(|j| prefix(j, rank + 1)).collect();
        self.check(&format!("scan n={n}"), &out, &want, log)?;
        self.check(&format!("scan in place n={n}"), &inplace, &want, log)?;
        let mut out = self.up(&vec![-1.0; nu])?;
        on.exclusive_scan_into(&send, &mut out, ReduceOp::Sum)?;
        let mut inplace = self.up(&mine(9, n))?;
        on.exclusive_scan_in_place(&mut inplace, ReduceOp::Sum)?;
        let (want, want_ip): (Vec<f32>, Vec<f32>) = if rank == 0 {
            (vec![-1.0; nu], mine(9, n))
        } else {
            let w: Vec<f32> = (0..n).map(|j| prefix(j, rank)).collect();
            (w.clone(), w)
        };
        self.check(&format!("exclusive_scan n={n}"), &out, &want, log)?;
        self.check(
            &format!("exclusive_scan in place n={n}"),
            &inplace,
            &want_ip,
            log,
        )?;

        // rooted: broadcast, reduce, gather, scatter
        let p = on.process_at_rank(root);
        let mut b = self.up(&if rank == root {
            mine(4, n)
        } else {
            vec![-1.0; nu]
        })?;
        p.broadcast_into(&mut b)?;
        let want: Vec<f32> = (0..n).map(|j| gv(root, j, 4)).collect();
        self.check(&format!("broadcast n={n}"), &b, &want, log)?;

        let send = self.up(&mine(5, n))?;
        let mut out = self.up(&vec![-1.0; nu])?;
        if rank == root {
            p.reduce_into_root(&send, &mut out, ReduceOp::Sum)?;
            let want: Vec<f32> = (0..n).map(|j| self.sum_of(j, 5)).collect();
            self.check(&format!("reduce n={n}"), &out, &want, log)?;
        } else {
            p.reduce_into(&send, ReduceOp::Sum)?;
        }

        let send = self.up(&mine(6, n))?;
        if rank == root {
            let mut out = self.up(&vec![-1.0; nu * size])?;
            p.gather_into_root(&send, &mut out)?;
            let want: Vec<f32> = (0..size)
                .flat_map(|r| (0..n).map(move |j| gv(r, j, 6)))
                .collect();
            self.check(&format!("gather n={n}"), &out, &want, log)?;
        } else {
            p.gather_into(&send)?;
        }

        let mut out = self.up(&vec![-1.0; nu])?;
        if rank == root {
            let send = self.up(&mine(7, total))?;
            p.scatter_into_root(&send, &mut out)?;
        } else {
            p.scatter_into(&mut out)?;
        }
        let want: Vec<f32> = (0..n).map(|j| gv(root, rank as u64 * n + j, 7)).collect();
        self.check(&format!("scatter n={n}"), &out, &want, log)?;

        // Blocking calls on cudarc slices written on another stream: the
        // call must see that stream's writes.
        let other = cu(self.stream.context().new_stream())?;
        let send: CudaSlice<f32> = cu(other.clone_htod(&mine(8, n)))?;
        let mut out: CudaSlice<f32> = cu(other.alloc_zeros(nu))?;
        self.world.all_reduce_into(&send, &mut out, ReduceOp::Sum)?;
        let want: Vec<f32> = (0..n).map(|j| self.sum_of(j, 8)).collect();
        self.check(
            &format!("blocking all_reduce on CudaSlice n={n}"),
            &out,
            &want,
            log,
        )?;
        let mut out: CudaSlice<f32> = cu(other.alloc_zeros(nu * size))?;
        self.world.all_gather_into(&send.slice(..), &mut out)?;
        let want: Vec<f32> = (0..size)
            .flat_map(|r| (0..n).map(move |j| gv(r, j, 8)))
            .collect();
        self.check(
            &format!("blocking all_gather on CudaView n={n}"),
            &out,
            &want,
            log,
        )?;
        self.world.async_error()
    }
}

pub(crate) fn stage_interop(world: &Communicator, log: &mut String) -> Result<usize> {
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("interop needs the CUDA backend".into()))?;
    let ctx = cu(CudaContext::new(gpu as usize))?;
    let c = Ctx {
        world,
        stream: cu(ctx.new_stream())?,
        rank: world.rank(),
        size: world.size(),
        wrong: Cell::new(0),
    };
    for n in [1u64, 4099, 1 << 20] {
        c.run(n, log)?;
    }
    // A stream of another GPU (when there is one) is refused.
    if let Ok(n) = CudaContext::device_count() {
        if n > 1 {
            let other = cu(CudaContext::new(((gpu + 1) % n) as usize))?;
            let s = cu(other.new_stream())?;
            if !matches!(world.on_stream(&s), Err(Error::WrongMemory(_))) {
                let _ = writeln!(
                    log,
                    "rank {} WRONG interop: a stream of another GPU was accepted",
                    c.rank
                );
                c.wrong.set(c.wrong.get() + 1);
            }
        }
    }
    let _ = writeln!(log, "rank {} interop: {} wrong", c.rank, c.wrong.get());
    Ok(c.wrong.get())
}
