//! `--stage registered` (run with `GPUCOLL_REGISTERED=1`): all_reduce,
//! reduce_scatter, all_gather and broadcast as the kernels that read the
//! peers' inputs and write straight into the peers' outputs after a host
//! rendezvous, on device allocations the driver can share (2 MiB and more).
//!
//! 1. Two device buffers of at least 32 MiB per rank, registered
//!    (`Communicator::register`, every rank in the same order); both must
//!    be direct.
//! 2. Blocking calls through the raw entry points on sub-ranges of those
//!    two allocations: every collective (broadcast from rank 0 and from the
//!    last rank) × f32, f64, i32, bf16 × op (sum, max, min; avg for floats
//!    on a power-of-two number of ranks; bxor for integers) × count per
//!    rank 1, 7, 4099, 2^20+3 × element offset 0, 1 of both pointers (1:
//!    addresses not 16-byte aligned, the kernels' scalar path) × out of
//!    place, in place (all_gather: MPI's layout and NCCL's, send = this
//!    rank's block). Inputs are small integers, so every result and every
//!    partial sum is exact in every type, bf16 included; each output
//!    element is compared with the exact result, and the element just
//!    before and just after the output (where inside the allocation) must
//!    keep its poison.
//! 3. A few of those queued back to back on a caller's stream, in disjoint
//!    parts of the same allocations, checked after one synchronization.
//! 4. Churn: 200 times a fresh 4 MiB pair is allocated, registered,
//!    summed into (f32 all_reduce), checked, deregistered and freed.

use cudarc::driver::{result as cu, CudaContext, DriverError};
use gpucoll::{
    bf16, Communicator, CudaStream, CudaStreamRaw, Datatype, DeviceBuffer, Equivalence, Error,
    ReduceOp, Registration, Result,
};
use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// Elements per rank of the blocking calls.
const COUNTS: [usize; 4] = [1, 7, 4099, (1 << 20) + 3];
/// Element offsets of both pointers from the start of their allocation.
const OFFSETS: [usize; 2] = [0, 1];
/// Elements per rank of the calls queued on a stream.
const STREAM_COUNTS: [usize; 2] = [7, 65_537];
/// Smallest size of each of the two registered buffers.
const MIN_BYTES: usize = 32 << 20;
/// What every element outside the inputs holds before a call: no result
/// (all within ±255) can be it, and it is exact in bf16.
const POISON: i64 = -1000;
/// Allocate/register/all_reduce/deregister/free cycles.
const CHURN: usize = 200;
/// f32 elements of each churn buffer (4 MiB).
const CHURN_COUNT: usize = 1 << 20;
/// Failure lines logged per (collective, datatype); the rest are counted.
const MAX_LINES: usize = 3;

/// An element type of the sweep: small integers convert exactly.
trait Elem: Equivalence + PartialEq + std::fmt::Debug {
    fn of(v: i64) -> Self;
}

impl Elem for f32 {
    fn of(v: i64) -> f32 {
        v as f32
    }
}

impl Elem for f64 {
    fn of(v: i64) -> f64 {
        v as f64
    }
}

impl Elem for i32 {
    fn of(v: i64) -> i32 {
        v as i32
    }
}

impl Elem for bf16 {
    fn of(v: i64) -> bf16 {
        bf16::from_f32(v as f32)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast(usize),
}

impl Coll {
    fn name(self) -> String {
        match self {
            Coll::AllReduce => "all_reduce".into(),
            Coll::ReduceScatter => "reduce_scatter".into(),
            Coll::AllGather => "all_gather".into(),
            Coll::Broadcast(root) => format!("broadcast(root {root})"),
        }
    }

    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter)
    }
}

/// Where input and output are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    /// Input in the first allocation, output in the second.
    Out,
    /// Both in the second allocation, send == recv (MPI_IN_PLACE's layout).
    InPlace,
    /// all_gather in the second allocation, send = this rank's block of
    /// recv (NCCL's in-place layout).
    Nccl,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Out => "out of place",
            Form::InPlace => "in place",
            Form::Nccl => "in place (NCCL layout)",
        }
    }
}

/// One call: `at` is the element index, in both allocations, of the send
/// (first allocation, out of place) and receive pointers.
#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Coll,
    op: ReduceOp,
    count: usize,
    form: Form,
    at: usize,
    salt: u64,
}

impl Case {
    fn what(&self, dt: Datatype) -> String {
        let op = if self.coll.reduces() {
            format!(" op={}", self.op.name())
        } else {
            String::new()
        };
        format!(
            "{} {dt}{op} count={} offset={} {} (call {})",
            self.coll.name(),
            self.count,
            self.at,
            self.form.name(),
            self.salt
        )
    }

    /// (input elements of this rank, output elements, output elements
    /// that hold a result).
    fn lens(&self, n: usize) -> (usize, usize, usize) {
        let (c, cn) = (self.count, self.count * n);
        match (self.coll, self.form) {
            (Coll::AllReduce, _) | (Coll::Broadcast(_), _) => (c, c, c),
            (Coll::ReduceScatter, Form::Out) => (cn, c, c),
            // In place the result is the first block; the rest is scratch.
            (Coll::ReduceScatter, _) => (cn, cn, c),
            (Coll::AllGather, _) => (c, cn, cn),
        }
    }

    /// Largest magnitude of an input: every partial sum stays within
    /// ±240, exact in bf16 (8 significant bits) whatever the order.
    fn amplitude(&self, n: usize) -> i64 {
        let n = n as i64;
        match (self.coll.reduces(), self.op) {
            (true, ReduceOp::Sum) => (240 / n).max(1),
            // Inputs are n × w: scaled first or summed first, both exact.
            (true, ReduceOp::Avg) => (240 / (n * n)).max(1),
            _ => 120,
        }
    }

    /// Rank `r`'s input element `k` (of its send layout).
    fn input(&self, n: usize, r: usize, k: usize) -> i64 {
        let h = self.amplitude(n);
        let mut x = (r as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((k as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93))
            .wrapping_add(self.salt.wrapping_mul(0xA076_1D64_78BD_642F));
        x ^= x >> 31;
        x = x.wrapping_mul(0xE703_7ED1_A0B4_28DB);
        x ^= x >> 29;
        let w = (x % (2 * h as u64 + 1)) as i64 - h;
        if self.coll.reduces() && self.op == ReduceOp::Avg {
            w * n as i64
        } else {
            w
        }
    }

    /// The exact result at output element `k` of rank `rank`.
    fn expected(&self, n: usize, rank: usize, k: usize) -> i64 {
        let c = self.count;
        let fold = |idx: usize| {
            let mut it = (0..n).map(|r| self.input(n, r, idx));
            let first = it.next().unwrap_or(0);
            let acc = it.fold(first, |a, v| match self.op {
                ReduceOp::Max => a.max(v),
                ReduceOp::Min => a.min(v),
                ReduceOp::BitXor => a ^ v,
                _ => a + v,
            });
            if self.op == ReduceOp::Avg {
                acc / n as i64
            } else {
                acc
            }
        };
        match self.coll {
            Coll::AllReduce => fold(k),
            Coll::ReduceScatter => fold(rank * c + k),
            Coll::AllGather => self.input(n, k / c, k % c),
            Coll::Broadcast(root) => self.input(n, root, k),
        }
    }
}

/// The ops of the sweep for `dt` on `n` ranks.
fn ops_for(dt: Datatype, n: usize) -> Vec<ReduceOp> {
    let mut ops = vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    if !dt.is_float() {
        ops.push(ReduceOp::BitXor);
    } else if n.is_power_of_two() {
        // 1/n is exact only for a power of two.
        ops.push(ReduceOp::Avg);
    }
    ops
}

fn cuda_err(e: DriverError) -> Error {
    Error::Backend(format!("cudarc: {e:?}"))
}

/// Two device allocations: `a` (out-of-place inputs) and `b` (outputs,
/// in-place buffers), `bytes` each.
#[derive(Clone, Copy)]
struct Pair {
    a: u64,
    b: u64,
    bytes: usize,
}

/// What one collective's check found.
struct Outcome {
    wrong: usize,
    /// (index relative to the receive pointer, got, want) of the first.
    first: Option<(i64, String, String)>,
}

/// Counts of one (collective, datatype).
#[derive(Default)]
struct Tally {
    calls: usize,
    failed: usize,
    wrong: usize,
    lines: Vec<String>,
}

impl Tally {
    fn add(&mut self, rank: usize, what: String, o: &Outcome) {
        self.calls += 1;
        if o.wrong == 0 {
            return;
        }
        self.failed += 1;
        self.wrong += o.wrong;
        if let Some((i, g, w)) = &o.first {
            self.lines.push(format!(
                "rank {rank} WRONG registered {what}: {} wrong; first at index {i}: got {g} \
                 want {w}",
                o.wrong
            ));
        }
    }

    /// The summary line, then the first failures.
    fn log(&self, log: &mut String, rank: usize, what: &str) {
        let _ = writeln!(
            log,
            "rank {rank}: registered {what}: {} calls, {} failed, {} wrong elements",
            self.calls, self.failed, self.wrong
        );
        for l in self.lines.iter().take(MAX_LINES) {
            let _ = writeln!(log, "{l}");
        }
        if self.lines.len() > MAX_LINES {
            let _ = writeln!(
                log,
                "rank {rank}: ... and {} more failed {what} calls",
                self.lines.len() - MAX_LINES
            );
        }
    }
}

struct Ctx<'a> {
    world: &'a Communicator,
    /// The GPU's primary context (gpucoll's too), for copies of sub-ranges.
    cuda: Arc<CudaContext>,
    rank: usize,
    n: usize,
    salt: u64,
}

impl Ctx<'_> {
    /// Copy `data` to device address `addr`, landed when this returns.
    fn up<T: Elem>(&self, addr: u64, data: &[T]) -> Result<()> {
        self.cuda.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: `addr` is inside one of the stage's allocations with room
        // for `data` (the callers compute it from the allocation's size).
        unsafe { cu::memcpy_htod_sync(addr, data) }.map_err(cuda_err)?;
        // From pageable memory the copy may still be in flight when the
        // call returns, and kernels on non-blocking streams are not ordered
        // after the legacy stream: wait for it.
        // SAFETY: the null stream is the current context's legacy stream.
        unsafe { cu::stream::synchronize(std::ptr::null_mut()) }.map_err(cuda_err)
    }

    /// `len` elements at device address `addr`.
    fn down<T: Elem>(&self, addr: u64, len: usize) -> Result<Vec<T>> {
        let mut v = vec![T::of(0); len];
        self.cuda.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: as in `up`; every bit pattern is a valid T.
        unsafe { cu::memcpy_dtoh_sync(&mut v, addr) }.map_err(cuda_err)?;
        Ok(v)
    }

    fn next_salt(&mut self) -> u64 {
        self.salt += 1;
        self.salt
    }

    /// The element range of the second allocation a case writes or
    /// checks: the output and the element on each side inside it.
    fn window<T: Elem>(&self, case: &Case, pair: Pair) -> (usize, usize) {
        let (_, out_len, _) = case.lens(self.n);
        let elems = pair.bytes / std::mem::size_of::<T>();
        let lo = case.at.saturating_sub(1);
        let hi = (case.at + out_len + 1).min(elems);
        (lo, hi)
    }

    /// Write the case's inputs and poison (output and its neighbours).
    fn prepare<T: Elem>(&self, case: &Case, pair: Pair) -> Result<()> {
        let (rank, n, c) = (self.rank, self.n, case.count);
        let es = std::mem::size_of::<T>();
        let (in_len, out_len, _) = case.lens(n);
        let elems = pair.bytes / es;
        if case.at + in_len.max(out_len) > elems {
            return Err(Error::InvalidUsage(format!(
                "registered stage: {} does not fit {} bytes",
                case.what(T::DATATYPE),
                pair.bytes
            )));
        }
        let (lo, hi) = self.window::<T>(case, pair);
        let o = case.at - lo;
        let mine = |k: usize| T::of(case.input(n, rank, k));
        let mut win = vec![T::of(POISON); hi - lo];
        match (case.form, case.coll) {
            (Form::Out, _) => {
                let send: Vec<T> = (0..in_len).map(mine).collect();
                self.up(pair.a + (case.at * es) as u64, &send)?;
            }
            (_, Coll::AllGather) => {
                for k in 0..c {
                    win[o + rank * c + k] = mine(k);
                }
            }
            (_, Coll::Broadcast(root)) => {
                if rank == root {
                    for k in 0..c {
                        win[o + k] = mine(k);
                    }
                }
            }
            _ => {
                for k in 0..in_len {
                    win[o + k] = mine(k);
                }
            }
        }
        self.up(pair.b + (lo * es) as u64, &win)
    }

    /// Run (no stream) or queue the case's collective.
    fn launch<T: Elem>(
        &self,
        case: &Case,
        pair: Pair,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let addr = |base: u64, idx: usize| (base + (idx * es) as u64) as usize as *mut c_void;
        let recv = addr(pair.b, case.at);
        let send = match case.form {
            Form::Out => addr(pair.a, case.at),
            Form::InPlace => recv,
            Form::Nccl => addr(pair.b, case.at + self.rank * case.count),
        } as *const c_void;
        let (w, count, dt, op) = (self.world, case.count as u64, T::DATATYPE, case.op);
        // SAFETY: both pointers are inside the two live allocations with
        // room for the call's lengths (checked in `prepare`); send and
        // receive ranges do not overlap except as the in-place layout; the
        // allocations outlive the call (blocking) or the stream's work (the
        // caller synchronizes before they are freed).
        unsafe {
            match case.coll {
                Coll::AllReduce => w.all_reduce_raw(send, recv, count, dt, op, stream),
                Coll::ReduceScatter => {
                    w.reduce_scatter_block_raw(send, recv, count, dt, op, stream)
                }
                Coll::AllGather => w.all_gather_raw(send, recv, count, dt, stream),
                Coll::Broadcast(root) => w.broadcast_raw(recv, count, dt, root, stream),
            }
        }
    }

    /// Compare the output (and its neighbours) with the exact results.
    fn check<T: Elem>(&self, case: &Case, pair: Pair) -> Result<Outcome> {
        let (rank, n) = (self.rank, self.n);
        let es = std::mem::size_of::<T>();
        let (_, out_len, checked) = case.lens(n);
        let (lo, hi) = self.window::<T>(case, pair);
        let got: Vec<T> = self.down(pair.b + (lo * es) as u64, hi - lo)?;
        let o = case.at - lo;
        let poison = T::of(POISON);
        let mut out = Outcome {
            wrong: 0,
            first: None,
        };
        let mut bad = |i: i64, g: &T, w: &T| {
            out.wrong += 1;
            out.first
                .get_or_insert_with(|| (i, format!("{g:?}"), format!("{w:?}")));
        };
        if o == 1 && got[0] != poison {
            bad(-1, &got[0], &poison);
        }
        for (k, g) in got[o..o + checked].iter().enumerate() {
            let w = T::of(case.expected(n, rank, k));
            if *g != w {
                bad(k as i64, g, &w);
            }
        }
        if let Some(g) = got.get(o + out_len) {
            if *g != poison {
                bad(out_len as i64, g, &poison);
            }
        }
        Ok(out)
    }

    /// One blocking call, checked.
    fn blocking<T: Elem>(&self, case: &Case, pair: Pair, log: &mut String) -> Result<Outcome> {
        let r = self
            .prepare::<T>(case, pair)
            .and_then(|_| self.launch::<T>(case, pair, None))
            .and_then(|_| self.check::<T>(case, pair));
        if let Err(e) = &r {
            let _ = writeln!(
                log,
                "rank {} ERROR registered {}: {e}",
                self.rank,
                case.what(T::DATATYPE)
            );
        }
        r
    }

    /// Part 2 for one datatype: the number of failed calls.
    fn sweep<T: Elem>(&mut self, pair: Pair, log: &mut String) -> Result<usize> {
        let (rank, n) = (self.rank, self.n);
        let dt = T::DATATYPE;
        let ops = ops_for(dt, n);
        let mut roots = vec![0, n - 1];
        roots.dedup();
        let mut fails = 0;
        let kinds: [(&str, Vec<(Coll, ReduceOp)>); 4] = [
            (
                "all_reduce",
                ops.iter().map(|&o| (Coll::AllReduce, o)).collect(),
            ),
            (
                "reduce_scatter",
                ops.iter().map(|&o| (Coll::ReduceScatter, o)).collect(),
            ),
            ("all_gather", vec![(Coll::AllGather, ReduceOp::Sum)]),
            (
                "broadcast",
                roots
                    .iter()
                    .map(|&r| (Coll::Broadcast(r), ReduceOp::Sum))
                    .collect(),
            ),
        ];
        for (name, variants) in kinds {
            let mut tally = Tally::default();
            for &(coll, op) in &variants {
                let forms: &[Form] = match coll {
                    Coll::Broadcast(_) => &[Form::InPlace],
                    Coll::AllGather => &[Form::Out, Form::InPlace, Form::Nccl],
                    _ => &[Form::Out, Form::InPlace],
                };
                for count in COUNTS {
                    for at in OFFSETS {
                        for &form in forms {
                            let case = Case {
                                coll,
                                op,
                                count,
                                form,
                                at,
                                salt: self.next_salt(),
                            };
                            let o = self.blocking::<T>(&case, pair, log)?;
                            tally.add(rank, case.what(dt), &o);
                        }
                    }
                }
            }
            tally.log(log, rank, &format!("{name} {dt}"));
            fails += tally.failed;
        }
        Ok(fails)
    }

    /// Part 3 for one datatype: batches queued on `stream`, each call in a
    /// part of the allocations of its own; the number of failed calls.
    fn queued<T: Elem>(
        &mut self,
        pair: Pair,
        stream: &CudaStream,
        log: &mut String,
    ) -> Result<usize> {
        let (rank, n) = (self.rank, self.n);
        let dt = T::DATATYPE;
        let mut tally = Tally::default();
        let plan = [
            (Coll::AllReduce, ReduceOp::Sum, Form::Out),
            (Coll::AllReduce, ReduceOp::Max, Form::InPlace),
            (Coll::ReduceScatter, ReduceOp::Min, Form::Out),
            (Coll::ReduceScatter, ReduceOp::Sum, Form::InPlace),
            (Coll::AllGather, ReduceOp::Sum, Form::Out),
            (Coll::AllGather, ReduceOp::Sum, Form::Nccl),
            (Coll::Broadcast(n - 1), ReduceOp::Sum, Form::InPlace),
        ];
        for count in STREAM_COUNTS {
            // Slots 64-element aligned, so offset 0 stays 128-byte aligned.
            let stride = (count * n + 4).div_ceil(64) * 64;
            let mut cases = Vec::new();
            for (slot, &(coll, op, form)) in plan.iter().enumerate() {
                cases.push(Case {
                    coll,
                    op,
                    count,
                    form,
                    at: slot * stride + slot % 2,
                    salt: self.next_salt(),
                });
            }
            let r = (|| {
                for c in &cases {
                    self.prepare::<T>(c, pair)?;
                }
                for c in &cases {
                    self.launch::<T>(c, pair, Some(stream.raw()))?;
                }
                stream.synchronize()?;
                self.world.async_error()
            })();
            if let Err(e) = r {
                let _ = writeln!(
                    log,
                    "rank {rank} ERROR registered {dt} count={count}, {} calls queued on a \
                     stream: {e}",
                    cases.len()
                );
                return Err(e);
            }
            for c in &cases {
                let o = self.check::<T>(c, pair)?;
                tally.add(rank, format!("{} on a stream", c.what(dt)), &o);
            }
        }
        tally.log(log, rank, &format!("{dt} queued on a stream"));
        Ok(tally.failed)
    }

    /// Part 4: the number of failures (wrong results, indirect
    /// registrations).
    fn churn(&mut self, gpu: i32, log: &mut String) -> Result<usize> {
        let rank = self.rank;
        let t = Instant::now();
        let (mut wrong, mut failed, mut indirect) = (0usize, 0usize, 0usize);
        let mut first: Option<String> = None;
        for i in 0..CHURN {
            let a = DeviceBuffer::<f32>::zeroed(gpu, CHURN_COUNT)?;
            let b = DeviceBuffer::<f32>::zeroed(gpu, CHURN_COUNT)?;
            let ra = self.world.register(&a)?;
            let rb = self.world.register(&b)?;
            indirect += usize::from(!ra.is_direct()) + usize::from(!rb.is_direct());
            let pair = Pair {
                a: a.device_ptr(),
                b: b.device_ptr(),
                bytes: CHURN_COUNT * 4,
            };
            let case = Case {
                coll: Coll::AllReduce,
                op: ReduceOp::Sum,
                count: CHURN_COUNT,
                form: Form::Out,
                at: 0,
                salt: self.next_salt(),
            };
            let o = self.blocking::<f32>(&case, pair, log)?;
            if o.wrong > 0 {
                failed += 1;
                wrong += o.wrong;
                if let (None, Some((k, g, w))) = (&first, &o.first) {
                    first = Some(format!(
                        "cycle {i}: {} wrong; first at index {k}: got {g} want {w}",
                        o.wrong
                    ));
                }
            }
            drop(ra);
            drop(rb);
            drop(a);
            drop(b);
        }
        self.world.barrier()?;
        let _ = writeln!(
            log,
            "rank {rank}: registered churn: {CHURN} cycles of 2 fresh 4 MiB buffers allocated, \
             registered, f32 sum all_reduce, deregistered, freed in {:.1} s: {failed} wrong \
             cycles ({wrong} elements), {indirect} registrations not direct",
            t.elapsed().as_secs_f64()
        );
        if let Some(f) = first {
            let _ = writeln!(log, "rank {rank} WRONG registered churn {f}");
        }
        if indirect > 0 {
            let _ = writeln!(
                log,
                "rank {rank} WRONG registered churn: {indirect} registrations of 4 MiB \
                 buffers not direct"
            );
        }
        Ok(usize::from(failed > 0) + usize::from(indirect > 0))
    }
}

/// Returns the number of failures.
pub(crate) fn stage_registered(world: &Communicator, log: &mut String) -> Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("registered needs the CUDA backend".into()))?;
    if std::env::var("GPUCOLL_REGISTERED").ok().as_deref() != Some("1") {
        let _ = writeln!(
            log,
            "rank {rank}: GPUCOLL_REGISTERED=1 is not set: the usual kernels would run"
        );
        return Ok(1);
    }
    let cuda = CudaContext::new(gpu as usize).map_err(cuda_err)?;
    let mut ctx = Ctx {
        world,
        cuda,
        rank,
        n,
        salt: 0,
    };
    let mut fails = 0usize;

    // 1. Two large allocations, registered in the same order everywhere.
    // The largest call: all_gather of 2^20+3 f64 per rank, offset 1, and
    // the element after it.
    let need = ((COUNTS[3] * n + 2) * 8).div_ceil(2 << 20) * (2 << 20);
    let bytes = need.max(MIN_BYTES);
    let buf_a = DeviceBuffer::<u64>::zeroed(gpu, bytes / 8)?;
    let buf_b = DeviceBuffer::<u64>::zeroed(gpu, bytes / 8)?;
    let regs: Vec<Registration> = vec![world.register(&buf_a)?, world.register(&buf_b)?];
    for (name, r) in ["first", "second"].iter().zip(&regs) {
        if !r.is_direct() {
            fails += 1;
            let _ = writeln!(
                log,
                "rank {rank} WRONG registered: the {name} buffer ({} MiB) is not direct: {r:?}",
                bytes >> 20
            );
        }
    }
    let _ = writeln!(
        log,
        "rank {rank}: registered two {} MiB device buffers: direct {} and {}",
        bytes >> 20,
        regs[0].is_direct(),
        regs[1].is_direct()
    );
    if !n.is_power_of_two() {
        let _ = writeln!(
            log,
            "rank {rank}: {n} ranks (not a power of two): avg left out (1/{n} is inexact)"
        );
    }
    let pair = Pair {
        a: buf_a.device_ptr(),
        b: buf_b.device_ptr(),
        bytes,
    };

    // 2. Every combination, blocking.
    let t = Instant::now();
    fails += ctx.sweep::<f32>(pair, log)?;
    fails += ctx.sweep::<f64>(pair, log)?;
    fails += ctx.sweep::<i32>(pair, log)?;
    fails += ctx.sweep::<bf16>(pair, log)?;
    let _ = writeln!(
        log,
        "rank {rank}: registered blocking sweep: {} calls in {:.1} s",
        ctx.salt,
        t.elapsed().as_secs_f64()
    );

    // 3. Batches queued on a caller's stream.
    let stream = CudaStream::new(gpu)?;
    fails += ctx.queued::<f32>(pair, &stream, log)?;
    fails += ctx.queued::<f64>(pair, &stream, log)?;
    fails += ctx.queued::<i32>(pair, &stream, log)?;
    fails += ctx.queued::<bf16>(pair, &stream, log)?;
    drop(stream);
    drop(regs);
    drop(buf_a);
    drop(buf_b);

    // 4. Churn of fresh registered pairs.
    fails += ctx.churn(gpu, log)?;
    Ok(fails)
}
