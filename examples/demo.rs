//! gpucoll's tour: every collective, a few datatypes, out-of-place and
//! in-place, a group and an immediate call, each checked against exact
//! values computed locally.
//!
//! ```text
//! cargo build --release --examples
//! mpirun --allow-run-as-root --oversubscribe -n 4 target/release/examples/demo
//! ```
//!
//! Every rank fills its inputs from `(rank, index)` with small integers, so
//! each rank knows every rank's input and the exact result (sums, minima,
//! maxima and products of them are exact in every type; `avg` is exact
//! whenever the rank count is a power of two and is compared with a tiny
//! tolerance otherwise). Rank 0 prints one line per call; the exit status is
//! nonzero if any element on any rank is wrong.

use gpucoll::prelude::*;
use gpucoll::reference;
use std::fmt::Debug;

/// The element types the demo uses, built from small integers.
trait Elem: Equivalence + Copy + PartialEq + Debug + Default {
    fn of(v: i64) -> Self;
    fn f(self) -> f64;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn of(v: i64) -> Self { v as $t }
            fn f(self) -> f64 { self as f64 }
        }
    )*};
}
elem!(i8, u8, i32, u32, i64, u64, f32, f64);

impl Elem for f16 {
    fn of(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}

impl Elem for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}

/// Rank `r`'s input element `i`: 0..=6 (signed types and floats: -3..=3).
fn val<T: Elem>(r: usize, i: usize) -> T {
    let v = ((r * 5 + i * 3 + 1) % 7) as i64;
    let signed = T::DATATYPE.is_float() || T::DATATYPE.is_signed_int();
    T::of(if signed { v - 3 } else { v })
}

/// Factors for products: 1 or 2, so the product stays exact.
fn factor<T: Elem>(r: usize, i: usize) -> T {
    T::of(if (r + i) % 3 == 0 { 2 } else { 1 })
}

/// Input of rank `r` of `len` elements.
fn input<T: Elem>(r: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| val(r, i)).collect()
}

/// The exact reduction over `n` ranks of element `i` of `inputs(r)`.
fn reduce_exact<T: Elem>(n: usize, op: ReduceOp, x: impl Fn(usize) -> T) -> f64 {
    let xs = (0..n).map(|r| x(r).f());
    match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Prod => xs.product(),
        ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => xs.sum::<f64>() / n as f64,
        ReduceOp::PreMulSum(s) => xs.map(|v| v * s).sum(),
        // Integer ops on the small integer inputs (exact in f64).
        ReduceOp::BitAnd => xs.fold(-1, |a, v| a & v as i64) as f64,
        ReduceOp::BitOr => xs.fold(0, |a, v| a | v as i64) as f64,
        ReduceOp::BitXor => xs.fold(0, |a, v| a ^ v as i64) as f64,
        _ if n == 1 => xs.sum(),
        ReduceOp::LogicalAnd => xs.fold(1.0, |a, v| if v != 0.0 { a } else { 0.0 }),
        ReduceOp::LogicalOr => xs.fold(0.0, |a, v| if v != 0.0 { 1.0 } else { a }),
        ReduceOp::LogicalXor => (xs.filter(|&v| v != 0.0).count() % 2) as f64,
    }
}

/// Number of elements of `got` that differ from `want` by more than `tol`.
fn wrong<T: Elem>(got: &[T], want: &[f64], tol: f64) -> u64 {
    if got.len() != want.len() {
        return got.len().max(want.len()) as u64;
    }
    got.iter()
        .zip(want)
        .filter(|(g, w)| (g.f() - **w).abs() > tol)
        .count() as u64
}

/// One line of the table.
struct Line {
    coll: &'static str,
    dtype: &'static str,
    op: &'static str,
    count: usize,
    wrong: u64,
    time_us: f64,
}

struct Demo<'a> {
    world: &'a Communicator,
    n: usize,
    r: usize,
    lines: Vec<Line>,
}

impl Demo<'_> {
    /// Run `f` (which returns this rank's wrong-element count), time it, and
    /// record the result summed / maxed over ranks with MPI's own allreduce.
    fn run<T: Elem>(
        &mut self,
        coll: &'static str,
        op: &'static str,
        count: usize,
        f: impl FnOnce() -> Result<u64>,
    ) -> Result<()> {
        reference::barrier(self.world)?;
        let t0 = gpucoll::mpi::wtime();
        let bad = f()?;
        let dt = (gpucoll::mpi::wtime() - t0) * 1e6;
        let (mut bad_all, mut dt_max) = ([0u64], [0f64]);
        reference::all_reduce(self.world, &[bad], &mut bad_all, ReduceOp::Sum)?;
        reference::all_reduce(self.world, &[dt], &mut dt_max, ReduceOp::Max)?;
        self.lines.push(Line {
            coll,
            dtype: T::DATATYPE.name(),
            op,
            count,
            wrong: bad_all[0],
            time_us: dt_max[0],
        });
        Ok(())
    }

    fn all_reduce<T: Elem>(&mut self, op: ReduceOp, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        let tol = if op == ReduceOp::Avg { 1e-2 } else { 0.0 };
        self.run::<T>("all_reduce", op.name(), count, || {
            let send: Vec<T> = input(r, count);
            let mut recv = vec![T::default(); count];
            world.all_reduce_into(&send, &mut recv, op)?;
            let want: Vec<f64> = (0..count)
                .map(|i| reduce_exact(n, op, |q| val::<T>(q, i)))
                .collect();
            Ok(wrong(&recv, &want, tol))
        })
    }

    fn all_reduce_prod_in_place<T: Elem>(&mut self, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        self.run::<T>("all_reduce (in place)", "prod", count, || {
            let mut buf: Vec<T> = (0..count).map(|i| factor(r, i)).collect();
            world.all_reduce_in_place(&mut buf, ReduceOp::Prod)?;
            let want: Vec<f64> = (0..count)
                .map(|i| reduce_exact(n, ReduceOp::Prod, |q| factor::<T>(q, i)))
                .collect();
            Ok(wrong(&buf, &want, 0.0))
        })
    }

    fn reduce<T: Elem>(&mut self, op: ReduceOp, root: usize, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        self.run::<T>("reduce", op.name(), count, || {
            let send: Vec<T> = input(r, count);
            let p = world.process_at_rank(root);
            if r == root {
                let mut recv = vec![T::default(); count];
                p.reduce_into_root(&send, &mut recv, op)?;
                let want: Vec<f64> = (0..count)
                    .map(|i| reduce_exact(n, op, |q| val::<T>(q, i)))
                    .collect();
                Ok(wrong(&recv, &want, 0.0))
            } else {
                p.reduce_into(&send, op)?;
                Ok(0)
            }
        })
    }

    fn broadcast<T: Elem>(&mut self, root: usize, count: usize) -> Result<()> {
        let (world, r) = (self.world, self.r);
        self.run::<T>("broadcast", "-", count, || {
            let mut buf: Vec<T> = if r == root {
                input(root, count)
            } else {
                vec![T::of(99); count]
            };
            world.process_at_rank(root).broadcast_into(&mut buf)?;
            let want: Vec<f64> = input::<T>(root, count).iter().map(|x| x.f()).collect();
            Ok(wrong(&buf, &want, 0.0))
        })
    }

    fn gathered<T: Elem>(&self, count: usize) -> Vec<f64> {
        (0..self.n)
            .flat_map(|q| input::<T>(q, count))
            .map(|x| x.f())
            .collect()
    }

    fn all_gather<T: Elem>(&mut self, count: usize, in_place: bool) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        let want = self.gathered::<T>(count);
        let name = if in_place {
            "all_gather (in place)"
        } else {
            "all_gather"
        };
        self.run::<T>(name, "-", count, || {
            let mut recv = vec![T::of(99); count * n];
            if in_place {
                recv[r * count..(r + 1) * count].copy_from_slice(&input::<T>(r, count));
                world.all_gather_in_place(&mut recv)?;
            } else {
                world.all_gather_into(&input::<T>(r, count), &mut recv)?;
            }
            Ok(wrong(&recv, &want, 0.0))
        })
    }

    fn reduce_scatter<T: Elem>(&mut self, count: usize, in_place: bool) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        let name = if in_place {
            "reduce_scatter (in place)"
        } else {
            "reduce_scatter"
        };
        self.run::<T>(name, "sum", count, || {
            let send: Vec<T> = input(r, count * n);
            let want: Vec<f64> = (0..count)
                .map(|i| reduce_exact(n, ReduceOp::Sum, |q| val::<T>(q, r * count + i)))
                .collect();
            if in_place {
                // MPI_IN_PLACE: the result lands in the first `count` elements.
                let mut buf = send;
                world.reduce_scatter_block_in_place(&mut buf, ReduceOp::Sum)?;
                Ok(wrong(&buf[..count], &want, 0.0))
            } else {
                let mut recv = vec![T::default(); count];
                world.reduce_scatter_block_into(&send, &mut recv, ReduceOp::Sum)?;
                Ok(wrong(&recv, &want, 0.0))
            }
        })
    }

    fn all_to_all<T: Elem>(&mut self, count: usize, in_place: bool) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        let name = if in_place {
            "all_to_all (in place)"
        } else {
            "all_to_all"
        };
        self.run::<T>(name, "-", count, || {
            let send: Vec<T> = input(r, count * n);
            // Block q of the result is block r of rank q's input.
            let want: Vec<f64> = (0..n)
                .flat_map(|q| (0..count).map(move |i| val::<T>(q, r * count + i).f()))
                .collect();
            if in_place {
                let mut buf = send;
                world.all_to_all_in_place(&mut buf)?;
                Ok(wrong(&buf, &want, 0.0))
            } else {
                let mut recv = vec![T::default(); count * n];
                world.all_to_all_into(&send, &mut recv)?;
                Ok(wrong(&recv, &want, 0.0))
            }
        })
    }

    fn gather<T: Elem>(&mut self, root: usize, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        let want = self.gathered::<T>(count);
        self.run::<T>("gather", "-", count, || {
            let send: Vec<T> = input(r, count);
            let p = world.process_at_rank(root);
            if r == root {
                let mut recv = vec![T::of(99); count * n];
                p.gather_into_root(&send, &mut recv)?;
                Ok(wrong(&recv, &want, 0.0))
            } else {
                p.gather_into(&send)?;
                Ok(0)
            }
        })
    }

    fn scatter<T: Elem>(&mut self, root: usize, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        self.run::<T>("scatter", "-", count, || {
            let p = world.process_at_rank(root);
            let mut recv = vec![T::of(99); count];
            if r == root {
                let send: Vec<T> = input(root, count * n);
                p.scatter_into_root(&send, &mut recv)?;
            } else {
                p.scatter_into(&mut recv)?;
            }
            let want: Vec<f64> = (0..count)
                .map(|i| val::<T>(root, r * count + i).f())
                .collect();
            Ok(wrong(&recv, &want, 0.0))
        })
    }

    /// Two collectives issued as one group (one launch).
    fn group<T: Elem>(&mut self, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        self.run::<T>("group(all_reduce+broadcast)", "sum", count, || {
            let a: Vec<T> = input(r, count);
            let mut b = vec![T::default(); count];
            let mut c: Vec<T> = if r == 0 {
                input(0, count)
            } else {
                vec![T::of(99); count]
            };
            world.group(|g| {
                g.all_reduce_into(&a, &mut b, ReduceOp::Sum)?;
                g.process_at_rank(0).broadcast_into(&mut c)?;
                Ok(())
            })?;
            let want_b: Vec<f64> = (0..count)
                .map(|i| reduce_exact(n, ReduceOp::Sum, |q| val::<T>(q, i)))
                .collect();
            let want_c: Vec<f64> = input::<T>(0, count).iter().map(|x| x.f()).collect();
            Ok(wrong(&b, &want_b, 0.0) + wrong(&c, &want_c, 0.0))
        })
    }

    /// A nonblocking all_reduce inside a scope.
    fn immediate<T: Elem>(&mut self, count: usize) -> Result<()> {
        let (world, n, r) = (self.world, self.n, self.r);
        self.run::<T>("immediate all_reduce", "max", count, || {
            let a: Vec<T> = input(r, count);
            let mut b = vec![T::default(); count];
            gpucoll::scope(|s| {
                let req = world.immediate_all_reduce_into(s, &a, &mut b, ReduceOp::Max)?;
                req.wait()
            })?;
            let want: Vec<f64> = (0..count)
                .map(|i| reduce_exact(n, ReduceOp::Max, |q| val::<T>(q, i)))
                .collect();
            Ok(wrong(&b, &want, 0.0))
        })
    }
}

fn run(world: &Communicator) -> Result<u64> {
    let n = world.size();
    let r = world.rank();
    let last = n - 1;
    let mut d = Demo {
        world,
        n,
        r,
        lines: Vec::new(),
    };
    d.all_reduce::<f32>(ReduceOp::Sum, 1000)?;
    d.all_reduce::<i32>(ReduceOp::Max, 257)?;
    d.all_reduce::<bf16>(ReduceOp::Sum, 64)?;
    d.all_reduce::<f64>(ReduceOp::Avg, 100)?;
    d.all_reduce::<u8>(ReduceOp::Min, 50)?;
    d.all_reduce_prod_in_place::<u64>(33)?;
    d.reduce::<i64>(ReduceOp::Sum, 0, 500)?;
    d.reduce::<f32>(ReduceOp::Min, last, 10)?;
    d.broadcast::<u8>(1 % n, 100)?;
    d.broadcast::<f16>(0, 31)?;
    d.all_gather::<i32>(10, false)?;
    d.all_gather::<f64>(7, true)?;
    d.reduce_scatter::<f32>(16, false)?;
    d.reduce_scatter::<i32>(5, true)?;
    d.all_to_all::<u32>(3, false)?;
    d.all_to_all::<i8>(4, true)?;
    d.gather::<f64>(0, 12)?;
    d.scatter::<i64>(last, 9)?;
    d.group::<f32>(40)?;
    d.immediate::<i64>(24)?;

    let total: u64 = d.lines.iter().map(|l| l.wrong).sum();
    if r == 0 {
        println!(
            "gpucoll demo: {} ranks on {} node(s), backend {}",
            n,
            world.nnodes(),
            world.backend_name()
        );
        println!(
            "{:<28} | {:<8} | {:<4} | {:>5} | {:<6} | {:>9}",
            "collective", "dtype", "op", "count", "result", "time (µs)"
        );
        println!("{}", "-".repeat(28 + 8 + 4 + 5 + 6 + 9 + 15));
        for l in &d.lines {
            let verdict = if l.wrong == 0 {
                "OK".to_string()
            } else {
                format!("WRONG ({})", l.wrong)
            };
            println!(
                "{:<28} | {:<8} | {:<4} | {:>5} | {:<6} | {:>9.1}",
                l.coll, l.dtype, l.op, l.count, verdict, l.time_us
            );
        }
        if total == 0 {
            println!("all {} checks OK", d.lines.len());
        } else {
            println!("{total} wrong elements in total");
        }
    }
    Ok(total)
}

fn main() {
    let universe = match gpucoll::initialize() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("demo: initialize failed: {e}");
            std::process::exit(1);
        }
    };
    let world = match universe.world() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("demo: creating the world communicator failed: {e}");
            std::process::exit(1);
        }
    };
    match run(&world) {
        Ok(0) => {
            drop(world);
            drop(universe);
        }
        Ok(_) => {
            drop(world);
            drop(universe);
            std::process::exit(1);
        }
        Err(e) => {
            // Peers may be blocked in a collective: exit without finalizing
            // and let mpirun end the job.
            eprintln!("demo: rank {}: {e}", world.rank());
            std::process::exit(1);
        }
    }
}
