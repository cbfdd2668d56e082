//! Correctness check of the CUDA backend on a GPU machine (feature `cuda`).
//!
//! Runs every collective × datatype × op × (out-of-place, in-place) × size
//! (0, 1, a prime, an unaligned view, large) on `DeviceBuffer`s, through the
//! real engine (tuner, graph, planner) and `CudaBackend`, and compares every
//! element with the exact result computed locally (inputs are small integers
//! derived from (rank, index), so every rank knows every input). A few calls
//! use host buffers (staged by the backend) and one group launch mixes
//! datatypes. Then times all_reduce on float at a few sizes.
//!
//! ```text
//! cargo build --release --features cuda --example gpu_check
//! mpirun -n 2 target/release/examples/gpu_check [--large N] [--perf] [--out FILE]
//! ```
//! Exit status 0 when everything matched.

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!(
        "gpu_check needs the `cuda` feature: cargo build --features cuda --example gpu_check"
    );
    std::process::exit(2);
}

#[cfg(feature = "cuda")]
fn main() {
    std::process::exit(imp::main());
}

#[cfg(feature = "cuda")]
mod imp {
    use gpucoll::backend::cuda::{CudaBackend, CudaStream, DeviceBuffer};
    use gpucoll::backend::{Backend, BoundPlan, Launch};
    use gpucoll::coll::task::Task;
    use gpucoll::config::Config;
    use gpucoll::graph::Graph;
    use gpucoll::mpi::MpiComm;
    use gpucoll::topo::Topology;
    use gpucoll::tune::Tuner;
    use gpucoll::{
        bf16, f16, Buffer, BufferMut, CollKind, Communicator, CudaStreamRaw, Datatype, Equivalence,
        RawBuffer, ReduceOp,
    };
    use std::ffi::c_void;
    use std::fmt::Write as _;
    use std::sync::Arc;
    use std::time::Instant;

    trait Elem: Equivalence + Copy + Default {
        fn of(v: i64) -> Self;
        fn f(self) -> f64;
    }
    macro_rules! elem_int { ($($t:ty),*) => {$(
        impl Elem for $t { fn of(v: i64) -> Self { v as $t } fn f(self) -> f64 { self as f64 } }
    )*}; }
    elem_int!(i8, u8, i32, u32, i64, u64, f32, f64);
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

    struct Env {
        mpi: Arc<MpiComm>,
        topo: Topology,
        graph: Graph,
        tuner: Tuner,
        backend: CudaBackend,
        gpu: i32,
        seq: u64,
        rank: usize,
        n: usize,
        detail: String,
    }

    impl Env {
        fn plan(&self, task: &Task) -> gpucoll::plan::Plan {
            let choice = self.tuner.choose(task);
            gpucoll::plan::build(task, &self.topo, &self.graph, &choice, self.backend.caps())
        }

        fn run(&mut self, items: Vec<(Task, RawBuffer, RawBuffer)>) -> gpucoll::Result<()> {
            let items: Vec<BoundPlan> = items
                .into_iter()
                .map(|(t, i, o)| BoundPlan {
                    plan: Arc::new(self.plan(&t)),
                    input: i,
                    output: o,
                })
                .collect();
            let launch = Launch {
                first_seq: self.seq,
                stream: None,
                items,
            };
            self.seq += launch.items.len() as u64;
            // SAFETY: the buffers outlive the call and nothing else touches
            // them before run() returns (the blocking path under test).
            unsafe { self.backend.run(launch) }
        }
    }

    /// Input value of rank `r` at index `j`.
    fn val(r: usize, j: u64, red: bool) -> i64 {
        if red {
            ((r as u64 * 7 + j * 3) % 3 + 1) as i64
        } else {
            ((r as u64 * 31 + j * 7) % 101) as i64
        }
    }

    /// The exact result as f64 (small integers; float Avg is exact for
    /// power-of-two rank counts, which the runs use).
    fn reduce_exact(op: ReduceOp, xs: impl Iterator<Item = i64>, n: usize, float: bool) -> f64 {
        let xs: Vec<i64> = xs.collect();
        match op {
            ReduceOp::Sum => xs.iter().sum::<i64>() as f64,
            ReduceOp::Prod => xs.iter().product::<i64>() as f64,
            ReduceOp::Min => *xs.iter().min().unwrap_or(&0) as f64,
            ReduceOp::Max => *xs.iter().max().unwrap_or(&0) as f64,
            ReduceOp::Avg if float => xs.iter().sum::<i64>() as f64 / n as f64,
            ReduceOp::Avg => (xs.iter().sum::<i64>() / n as i64) as f64,
            ReduceOp::PreMulSum(s) => xs.iter().map(|x| x * s as i64).sum::<i64>() as f64,
            ReduceOp::BitAnd => xs.iter().fold(-1, |a, x| a & x) as f64,
            ReduceOp::BitOr => xs.iter().fold(0, |a, x| a | x) as f64,
            ReduceOp::BitXor => xs.iter().fold(0, |a, x| a ^ x) as f64,
            // A lone input is returned as is (as MPI does).
            _ if xs.len() == 1 => xs[0] as f64,
            ReduceOp::LogicalAnd => xs.iter().all(|&x| x != 0) as i64 as f64,
            ReduceOp::LogicalOr => xs.iter().any(|&x| x != 0) as i64 as f64,
            ReduceOp::LogicalXor => (xs.iter().filter(|&&x| x != 0).count() % 2) as f64,
        }
    }

    /// `v` converted to the element type, as f64 (wrapping like the type does).
    fn as_elem<T: Elem>(v: f64) -> f64 {
        if T::DATATYPE.is_float() {
            conv::<T>(v)
        } else {
            T::of(v as i64).f()
        }
    }

    fn conv<T: Elem>(v: f64) -> f64 {
        match T::DATATYPE {
            Datatype::F16 => f16::from_f64(v).to_f64(),
            Datatype::BF16 => bf16::from_f64(v).to_f64(),
            Datatype::F32 => v as f32 as f64,
            _ => v,
        }
    }

    fn sub(b: RawBuffer, off: u64, len: u64) -> RawBuffer {
        RawBuffer {
            addr: b.addr + off * b.dtype.size() as u64,
            len,
            ..b
        }
    }
    fn empty_at(b: RawBuffer) -> RawBuffer {
        RawBuffer { len: 0, ..b }
    }

    /// One collective call: returns the number of wrong elements.
    #[allow(clippy::too_many_arguments)]
    fn case<T: Elem>(
        env: &mut Env,
        kind: CollKind,
        op: ReduceOp,
        count: u64,
        in_place: bool,
        unaligned: bool,
        host: bool,
        root: usize,
    ) -> gpucoll::Result<usize> {
        let (rank, n) = (env.rank, env.n);
        let nn = n as u64;
        let red = kind.reduces();
        let float = T::DATATYPE.is_float();
        let is_root = rank == root;
        let poison = T::of(-1);
        // Buffer lengths (elements).
        let (in_len, out_len) = match kind {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => (count, count),
            CollKind::AllGather => (count, count * nn),
            CollKind::ReduceScatter => (count * nn, count),
            CollKind::AllToAll => (count * nn, count * nn),
            CollKind::Gather => (count, if is_root { count * nn } else { 0 }),
            CollKind::Scatter => (if is_root { count * nn } else { 0 }, count),
        };
        let ip = in_place
            && match kind {
                CollKind::Reduce | CollKind::Gather | CollKind::Scatter => is_root,
                _ => true,
            };
        let ip = ip || kind == CollKind::Broadcast;
        let task_ip = ip;
        // Host images of the buffers.
        let input: Vec<T> = (0..in_len)
            .map(|j| {
                let owner_src = match kind {
                    CollKind::Broadcast if !is_root => return poison,
                    _ => rank,
                };
                T::of(val(owner_src, j, red))
            })
            .collect();
        let big_len = in_len.max(out_len);
        let mut buf: Vec<T> = vec![poison; big_len as usize];
        if ip {
            match kind {
                CollKind::AllGather => {
                    for i in 0..count {
                        buf[(rank as u64 * count + i) as usize] = T::of(val(rank, i, red));
                    }
                }
                CollKind::Gather => {
                    for i in 0..count {
                        buf[(root as u64 * count + i) as usize] = T::of(val(rank, i, red));
                    }
                }
                _ => buf[..in_len as usize].copy_from_slice(&input),
            }
        }
        let shift = if unaligned { 1 } else { 0 };
        let mk = |data: &[T]| -> gpucoll::Result<DeviceBuffer<T>> {
            let mut v = vec![poison; data.len() + shift];
            v[shift..].copy_from_slice(data);
            DeviceBuffer::from_host(env.gpu, &v)
        };
        // Device (or host) buffers.
        let d_in = mk(&input)?;
        let out_init = vec![poison; out_len as usize];
        let mut d_out = mk(if ip { &buf } else { &out_init })?;
        let mut h_in = input.clone();
        let mut h_out: Vec<T> = if ip { buf.clone() } else { out_init.clone() };
        let (raw_in, raw_out) = if host {
            (h_in.as_mut_slice().raw(), h_out.as_mut_slice().raw_mut())
        } else {
            let ri = d_in.view(shift..shift + in_len as usize)?.raw();
            let len = if ip { big_len } else { out_len } as usize;
            let ro = d_out.view_mut(shift..shift + len)?.raw_mut();
            (ri, ro)
        };
        let (task_count, i_raw, o_raw) = if ip {
            let b = raw_out;
            match kind {
                CollKind::AllGather => (count, sub(b, rank as u64 * count, count), b),
                CollKind::Gather => (count, sub(b, root as u64 * count, count), b),
                CollKind::Scatter => (count, b, sub(b, root as u64 * count, count)),
                _ => (count, b, b),
            }
        } else {
            let o = match kind {
                CollKind::Reduce | CollKind::Gather if !is_root => empty_at(raw_in),
                CollKind::Scatter if !is_root => raw_out,
                _ => raw_out,
            };
            let i = match kind {
                CollKind::Scatter if !is_root => empty_at(raw_out),
                _ => raw_in,
            };
            (count, i, o)
        };
        let task = Task {
            kind,
            dtype: T::DATATYPE,
            op: if red { op } else { ReduceOp::Sum },
            count: task_count,
            root: if kind.rooted() { root } else { 0 },
            in_place: task_ip,
        };
        env.run(vec![(task, i_raw, o_raw)])?;
        // Fetch the result.
        let got: Vec<T> = if host {
            h_out.clone()
        } else {
            let all = d_out.to_vec()?;
            all[shift..].to_vec()
        };
        drop(d_in);
        // Expected values where defined.
        let mut wrong = 0usize;
        let mut first_bad: Option<(u64, Option<f64>, f64)> = None;
        let mut check = |idx: u64, want: f64| {
            let g = got.get(idx as usize).map(|x| x.f());
            let w = as_elem::<T>(want);
            if g != Some(w) {
                wrong += 1;
                if first_bad.is_none() {
                    first_bad = Some((idx, g, w));
                }
            }
        };
        let red_at = |idx_of: &dyn Fn(usize) -> u64| {
            reduce_exact(op, (0..n).map(|r| val(r, idx_of(r), true)), n, float)
        };
        match kind {
            CollKind::AllReduce => {
                for i in 0..count {
                    check(i, red_at(&|_| i));
                }
            }
            CollKind::Reduce if is_root => {
                for i in 0..count {
                    check(i, red_at(&|_| i));
                }
            }
            CollKind::Broadcast => {
                for i in 0..count {
                    check(i, val(root, i, false) as f64);
                }
            }
            CollKind::AllGather => {
                for r in 0..n {
                    for i in 0..count {
                        check(r as u64 * count + i, val(r, i, false) as f64);
                    }
                }
            }
            CollKind::ReduceScatter => {
                for i in 0..count {
                    check(i, red_at(&|_| rank as u64 * count + i));
                }
            }
            CollKind::AllToAll => {
                for s in 0..n {
                    for i in 0..count {
                        check(
                            s as u64 * count + i,
                            val(s, rank as u64 * count + i, false) as f64,
                        );
                    }
                }
            }
            CollKind::Gather if is_root => {
                for r in 0..n {
                    for i in 0..count {
                        check(r as u64 * count + i, val(r, i, false) as f64);
                    }
                }
            }
            CollKind::Scatter => {
                let base = if ip { root as u64 * count } else { 0 };
                for i in 0..count {
                    check(base + i, val(root, rank as u64 * count + i, false) as f64);
                }
            }
            _ => {}
        }
        if let Some((idx, g, w)) = first_bad {
            let choice = env.tuner.choose(&task);
            let plan = env.plan(&task);
            let nsteps: Vec<usize> = plan.channels.iter().map(|c| c.steps.len()).collect();
            let _ = writeln!(
                env.detail,
                "    rank {rank} {} {} first wrong index {idx}: got {g:?} want {w}; {} ch={} chunk={} steps/ch={nsteps:?}",
                kind.name(), T::DATATYPE, choice.algorithm, choice.nchannels, choice.chunk_bytes
            );
        }
        Ok(wrong)
    }

    fn all_cases<T: Elem>(
        env: &mut Env,
        sizes: &[(u64, bool)],
        log: &mut String,
        failures: &mut usize,
    ) {
        for kind in CollKind::ALL {
            let ops: Vec<ReduceOp> = if kind.reduces() {
                let all = ReduceOp::ALL.into_iter();
                all.filter(|op| op.applies_to(T::DATATYPE)).collect()
            } else {
                vec![ReduceOp::Sum]
            };
            for op in ops {
                for in_place in [false, true] {
                    for &(count, unaligned) in sizes {
                        let host = false;
                        let root = if kind.rooted() { env.n - 1 } else { 0 };
                        let r = case::<T>(env, kind, op, count, in_place, unaligned, host, root);
                        let bad = match r {
                            Ok(w) => w,
                            Err(e) => {
                                let _ = writeln!(
                                    log,
                                    "rank {} ERROR {} {} {} ip={} n={}: {e}",
                                    env.rank,
                                    kind.name(),
                                    T::DATATYPE,
                                    op,
                                    in_place,
                                    count
                                );
                                *failures += 1;
                                return;
                            }
                        };
                        if bad > 0 {
                            *failures += 1;
                            let _ = writeln!(
                                log,
                                "rank {} WRONG {} {} {} ip={} count={} unaligned={}: {bad} elements",
                                env.rank, kind.name(), T::DATATYPE, op, in_place, count, unaligned
                            );
                        }
                    }
                }
            }
        }
    }

    /// Time `iters` calls of `task`: (submit + wait each, back to back then
    /// one wait), in µs per call.
    fn time_task(
        env: &mut Env,
        task: Task,
        i: RawBuffer,
        o: RawBuffer,
        iters: usize,
    ) -> gpucoll::Result<(f64, f64)> {
        for _ in 0..3 {
            env.run(vec![(task, i, o)])?;
        }
        env.mpi.barrier()?;
        let t = Instant::now();
        for _ in 0..iters {
            env.run(vec![(task, i, o)])?;
        }
        let sync_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let plan = Arc::new(env.plan(&task));
        // Twice: the first pass fills the backend's pool of launch buffers.
        let mut async_us = 0.0;
        for _ in 0..2 {
            env.mpi.barrier()?;
            let t = Instant::now();
            let mut pend = Vec::with_capacity(iters);
            for _ in 0..iters {
                let launch = Launch {
                    first_seq: env.seq,
                    stream: None,
                    items: vec![BoundPlan {
                        plan: plan.clone(),
                        input: i,
                        output: o,
                    }],
                };
                env.seq += 1;
                // SAFETY: the buffers outlive every pending call (all waited below).
                pend.push(unsafe { env.backend.submit(launch)? });
            }
            for mut w in pend {
                w.wait()?;
            }
            async_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        }
        Ok((sync_us, async_us))
    }

    /// `--perf SPEC`: SPEC is a comma list of `coll:bytes` (bytes with an
    /// optional k/m/g suffix; the nccl-tests size: the larger buffer).
    fn perf(env: &mut Env, spec: &str, log: &mut String) -> gpucoll::Result<()> {
        let n = env.n as u64;
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let (coll, size) = item.split_once(':').unwrap_or(("all_reduce", item));
            let kind = CollKind::parse(coll).unwrap_or(CollKind::AllReduce);
            let size = size.trim().to_ascii_lowercase();
            let (num, mul) = match size.chars().last() {
                Some('k') => (&size[..size.len() - 1], 1u64 << 10),
                Some('m') => (&size[..size.len() - 1], 1 << 20),
                Some('g') => (&size[..size.len() - 1], 1 << 30),
                _ => (&size[..], 1),
            };
            let bytes = num.parse::<u64>().unwrap_or(0) * mul;
            let total = (bytes / 4).max(1);
            let per = match kind {
                CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => {
                    (total / n).max(1)
                }
                _ => total,
            };
            let (in_len, out_len) = match kind {
                CollKind::AllGather => (per, per * n),
                CollKind::ReduceScatter => (per * n, per),
                CollKind::AllToAll => (per * n, per * n),
                _ => (per, per),
            };
            let src = DeviceBuffer::<f32>::zeroed(env.gpu, in_len as usize)?;
            let mut dst = DeviceBuffer::<f32>::zeroed(env.gpu, out_len as usize)?;
            let task = Task {
                kind,
                dtype: Datatype::F32,
                op: ReduceOp::Sum,
                count: per,
                root: 0,
                in_place: false,
            };
            let b = in_len.max(out_len) * 4;
            let iters = if b >= 256 << 20 {
                10
            } else if b >= 16 << 20 {
                30
            } else {
                200
            };
            let (sync_us, async_us) = time_task(env, task, src.raw(), dst.raw_mut(), iters)?;
            let nf = env.n as f64;
            let factor = match kind {
                CollKind::AllReduce => 2.0 * (nf - 1.0) / nf,
                CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => {
                    (nf - 1.0) / nf
                }
                _ => 1.0,
            };
            let busbw = b as f64 / async_us / 1e3 * factor;
            let choice = env.tuner.choose(&task);
            let _ = writeln!(
                log,
                "perf {:<14} {:>11} B  sync {:>9.1} us  async {:>9.1} us  busbw {:>7.1} GB/s  {} {}ch",
                kind.name(),
                b,
                sync_us,
                async_us,
                busbw,
                choice.algorithm,
                choice.nchannels
            );
        }
        Ok(())
    }

    // ---------------------------------------------------------------------
    // Stages on the public API (`--stage raw|graph|timeout`): raw pointers
    // on callers' streams, CUDA-graph capture and replay, a forced timeout.

    /// Input value of rank `r` at index `j` in round `it`: small integers,
    /// so f32 sums are exact.
    fn gv(r: usize, j: u64, it: u64) -> f32 {
        ((r as u64 * 31 + j * 7 + it * 5) % 101) as f32
    }

    fn vp(b: &DeviceBuffer<f32>) -> *mut c_void {
        b.device_ptr() as usize as *mut c_void
    }

    /// An argument check: what, the call's result, the error it expects.
    type ErrCheck = (
        &'static str,
        gpucoll::Result<()>,
        fn(&gpucoll::Error) -> bool,
    );

    /// One raw collective in flight: its output buffer and expected contents.
    struct Pending {
        what: String,
        out: DeviceBuffer<f32>,
        _keep: Option<DeviceBuffer<f32>>,
        want: Vec<(usize, f32)>,
    }

    /// Queue collective `kind` (f32, Sum) of `count` on `stream` with the raw
    /// entry points; returns what to verify after the stream synchronized.
    fn raw_case(
        world: &Communicator,
        gpu: i32,
        kind: CollKind,
        count: u64,
        in_place: bool,
        it: u64,
        stream: Option<CudaStreamRaw>,
    ) -> gpucoll::Result<Pending> {
        let (rank, n) = (world.rank(), world.size());
        let nn = n as u64;
        let root = n - 1;
        let is_root = rank == root;
        let c = count as usize;
        let cn = c * n;
        let poison = -1.0f32;
        let v = |r: usize, j: u64| gv(r, j, it);
        let sum = |f: &dyn Fn(usize) -> u64| (0..n).map(|r| v(r, f(r))).sum::<f32>();
        let dt = Datatype::F32;
        let op = ReduceOp::Sum;
        let what = format!(
            "{} count={count} in_place={in_place} round={it}",
            kind.name()
        );
        let own: Vec<f32> = (0..count).map(|j| v(rank, j)).collect();
        let own_n: Vec<f32> = (0..count * nn).map(|j| v(rank, j)).collect();
        let mut want = Vec::new();
        // SAFETY (for every raw call below): the device buffers live in the
        // returned Pending until the caller synchronized the stream.
        let p = match kind {
            CollKind::AllReduce | CollKind::Reduce => {
                for i in 0..c {
                    want.push((i, sum(&|_| i as u64)));
                }
                let reduce = kind == CollKind::Reduce;
                if reduce && !is_root {
                    want.clear();
                }
                if in_place && (!reduce || is_root) {
                    let b = DeviceBuffer::from_host(gpu, &own)?;
                    unsafe {
                        if reduce {
                            world.reduce_raw(vp(&b), vp(&b), count, dt, op, root, stream)?
                        } else {
                            world.all_reduce_raw(vp(&b), vp(&b), count, dt, op, stream)?
                        }
                    };
                    Pending {
                        what,
                        out: b,
                        _keep: None,
                        want,
                    }
                } else {
                    let s = DeviceBuffer::from_host(gpu, &own)?;
                    let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                    unsafe {
                        if reduce {
                            let recv = if is_root {
                                vp(&o)
                            } else {
                                std::ptr::null_mut()
                            };
                            world.reduce_raw(vp(&s), recv, count, dt, op, root, stream)?
                        } else {
                            world.all_reduce_raw(vp(&s), vp(&o), count, dt, op, stream)?
                        }
                    };
                    Pending {
                        what,
                        out: o,
                        _keep: Some(s),
                        want,
                    }
                }
            }
            CollKind::Broadcast => {
                let init: Vec<f32> = if is_root {
                    own.clone()
                } else {
                    vec![poison; c]
                };
                let b = DeviceBuffer::from_host(gpu, &init)?;
                unsafe { world.broadcast_raw(vp(&b), count, dt, root, stream)? };
                want = (0..c).map(|i| (i, v(root, i as u64))).collect();
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            }
            CollKind::AllGather | CollKind::Gather => {
                let gather = kind == CollKind::Gather;
                let at = if gather { root } else { rank };
                if !gather || is_root {
                    for r in 0..n {
                        for i in 0..c {
                            want.push((r * c + i, v(r, i as u64)));
                        }
                    }
                }
                if in_place && (!gather || is_root) {
                    let mut init = vec![poison; cn];
                    init[at * c..(at + 1) * c].copy_from_slice(&own);
                    let b = DeviceBuffer::from_host(gpu, &init)?;
                    // Odd counts use NCCL's layout (send = own block).
                    let send = if count % 2 == 1 {
                        (b.device_ptr() + (at * c * 4) as u64) as usize as *const c_void
                    } else {
                        vp(&b) as *const c_void
                    };
                    unsafe {
                        if gather {
                            world.gather_raw(send, vp(&b), count, dt, root, stream)?
                        } else {
                            world.all_gather_raw(send, vp(&b), count, dt, stream)?
                        }
                    };
                    Pending {
                        what,
                        out: b,
                        _keep: None,
                        want,
                    }
                } else {
                    let s = DeviceBuffer::from_host(gpu, &own)?;
                    let o = DeviceBuffer::from_host(gpu, &vec![poison; cn])?;
                    unsafe {
                        if gather {
                            let recv = if is_root {
                                vp(&o)
                            } else {
                                std::ptr::null_mut()
                            };
                            world.gather_raw(vp(&s), recv, count, dt, root, stream)?
                        } else {
                            world.all_gather_raw(vp(&s), vp(&o), count, dt, stream)?
                        }
                    };
                    Pending {
                        what,
                        out: o,
                        _keep: Some(s),
                        want,
                    }
                }
            }
            CollKind::ReduceScatter => {
                want = (0..c)
                    .map(|i| (i, sum(&|_| (rank * c + i) as u64)))
                    .collect();
                if in_place {
                    let b = DeviceBuffer::from_host(gpu, &own_n)?;
                    unsafe {
                        world.reduce_scatter_block_raw(vp(&b), vp(&b), count, dt, op, stream)?
                    };
                    Pending {
                        what,
                        out: b,
                        _keep: None,
                        want,
                    }
                } else {
                    let s = DeviceBuffer::from_host(gpu, &own_n)?;
                    let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                    unsafe {
                        world.reduce_scatter_block_raw(vp(&s), vp(&o), count, dt, op, stream)?
                    };
                    Pending {
                        what,
                        out: o,
                        _keep: Some(s),
                        want,
                    }
                }
            }
            CollKind::AllToAll => {
                for s in 0..n {
                    for i in 0..c {
                        want.push((s * c + i, v(s, (rank * c + i) as u64)));
                    }
                }
                if in_place {
                    let b = DeviceBuffer::from_host(gpu, &own_n)?;
                    unsafe { world.all_to_all_raw(vp(&b), vp(&b), count, dt, stream)? };
                    Pending {
                        what,
                        out: b,
                        _keep: None,
                        want,
                    }
                } else {
                    let s = DeviceBuffer::from_host(gpu, &own_n)?;
                    let o = DeviceBuffer::from_host(gpu, &vec![poison; cn])?;
                    unsafe { world.all_to_all_raw(vp(&s), vp(&o), count, dt, stream)? };
                    Pending {
                        what,
                        out: o,
                        _keep: Some(s),
                        want,
                    }
                }
            }
            CollKind::Scatter => {
                let base = if in_place && is_root { root * c } else { 0 };
                want = (0..c)
                    .map(|i| (base + i, v(root, (rank * c + i) as u64)))
                    .collect();
                if in_place && is_root {
                    let b = DeviceBuffer::from_host(gpu, &own_n)?;
                    unsafe { world.scatter_raw(vp(&b), vp(&b), count, dt, root, stream)? };
                    Pending {
                        what,
                        out: b,
                        _keep: None,
                        want,
                    }
                } else {
                    let s = DeviceBuffer::from_host(gpu, &own_n)?;
                    let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                    let send = if is_root {
                        vp(&s) as *const c_void
                    } else {
                        std::ptr::null()
                    };
                    unsafe { world.scatter_raw(send, vp(&o), count, dt, root, stream)? };
                    Pending {
                        what,
                        out: o,
                        _keep: Some(s),
                        want,
                    }
                }
            }
        };
        Ok(p)
    }

    /// Compare a synchronized Pending with its expected values.
    fn verify(p: &Pending, rank: usize, log: &mut String) -> gpucoll::Result<usize> {
        let got = p.out.to_vec()?;
        let mut bad = 0usize;
        let mut first = None;
        for &(i, w) in &p.want {
            let g = got.get(i).copied();
            if g != Some(w) {
                bad += 1;
                first.get_or_insert((i, g, w));
            }
        }
        if let Some((i, g, w)) = first {
            let _ = writeln!(
                log,
                "rank {rank} WRONG {}: {bad} elements; first at {i}: got {g:?} want {w}",
                p.what
            );
        }
        Ok(bad)
    }

    /// (a) every collective through the raw entry points on callers'
    /// streams (two streams, alternating, plus blocking calls in between),
    /// many queued before one synchronization; argument errors on the GPU.
    fn stage_raw(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
        let rank = world.rank();
        let gpu = match world.device() {
            Some(g) => g,
            None => {
                let _ = writeln!(
                    log,
                    "rank {rank} ERROR the communicator has no GPU ({})",
                    world.backend_name()
                );
                return Ok(1);
            }
        };
        let mut fails = 0usize;
        let (sa, sb) = (CudaStream::new(gpu)?, CudaStream::new(gpu)?);
        // 262144 f32 = 1 MiB (direct all_reduce), 4 Mi f32 = 16 MiB (the
        // largest direct all_reduce), 1001 (unaligned tails), 0.
        for (round, &count) in [0u64, 1, 1001, 262_144, 4 << 20].iter().enumerate() {
            let mut pend = Vec::new();
            let mut k = 0usize;
            for kind in CollKind::ALL {
                for in_place in [false, true] {
                    if kind == CollKind::Broadcast && in_place {
                        continue;
                    }
                    let s = if k % 2 == 0 { &sa } else { &sb };
                    k += 1;
                    pend.push(raw_case(
                        world,
                        gpu,
                        kind,
                        count,
                        in_place,
                        round as u64,
                        Some(s.raw()),
                    )?);
                }
                // A blocking call (the communicator's own stream) in between.
                if kind == CollKind::AllGather {
                    pend.push(raw_case(
                        world,
                        gpu,
                        CollKind::AllReduce,
                        count,
                        false,
                        7,
                        None,
                    )?);
                }
            }
            sa.synchronize()?;
            sb.synchronize()?;
            for p in &pend {
                fails += (verify(p, rank, log)? > 0) as usize;
            }
            world.async_error()?;
        }
        // Errors checked before anything runs; the communicator stays usable.
        let dev = DeviceBuffer::<f32>::zeroed(gpu, 100)?;
        let host = vec![0f32; 100];
        let s = Some(sa.raw());
        let dt = Datatype::F32;
        let checks: Vec<ErrCheck> = unsafe {
            vec![
                (
                    "host pointer on a stream",
                    world.all_reduce_raw(
                        host.as_ptr() as *const c_void,
                        vp(&dev),
                        100,
                        dt,
                        ReduceOp::Sum,
                        s,
                    ),
                    |e| matches!(e, gpucoll::Error::WrongMemory(_)),
                ),
                (
                    "misaligned device pointer",
                    world.all_reduce_raw(
                        (dev.device_ptr() + 2) as usize as *const c_void,
                        vp(&dev),
                        10,
                        dt,
                        ReduceOp::Sum,
                        s,
                    ),
                    |e| matches!(e, gpucoll::Error::InvalidUsage(_)),
                ),
                (
                    // 4 TiB: far past anything mapped, so never accepted.
                    "past the end of the allocation",
                    world.broadcast_raw(vp(&dev), 1 << 40, dt, 0, s),
                    |e| matches!(e, gpucoll::Error::InvalidUsage(_)),
                ),
            ]
        };
        for (what, r, pred) in checks {
            match r {
                Err(e) if pred(&e) => {}
                other => {
                    fails += 1;
                    let _ = writeln!(log, "rank {rank} WRONG error check '{what}': got {other:?}");
                }
            }
        }
        let p = raw_case(
            world,
            gpu,
            CollKind::AllReduce,
            4099,
            false,
            9,
            Some(sa.raw()),
        )?;
        sa.synchronize()?;
        fails += (verify(&p, rank, log)? > 0) as usize;
        world.async_error()?;
        Ok(fails)
    }

    /// (b) capture all_reduce (1 MiB: direct one-shot; 64 MiB: ring),
    /// all_gather and reduce_scatter into a CUDA graph, replay it 5 times
    /// with new inputs each time, interleaved with eager calls.
    fn stage_graph(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
        let (rank, n) = (world.rank(), world.size());
        let gpu = world.device().ok_or_else(|| {
            gpucoll::Error::Backend(format!("no GPU ({} backend)", world.backend_name()))
        })?;
        let nn = n as u64;
        let stream = CudaStream::new(gpu)?;
        let s = Some(stream.raw());
        let dt = Datatype::F32;
        let sum = ReduceOp::Sum;
        let (c1, c2, cg, cr) = (262_144u64, 16u64 << 20, 65_536u64, 262_144u64);
        let z = |len: u64| DeviceBuffer::<f32>::zeroed(gpu, len as usize);
        let (a1, o1) = (z(c1)?, z(c1)?);
        let (a2, o2) = (z(c2)?, z(c2)?);
        let (ga, go) = (z(cg)?, z(cg * nn)?);
        let (ra, ro) = (z(cr * nn)?, z(cr)?);
        let fill = |b: &mut DeviceBuffer<f32>, len: u64, it: u64| {
            let v: Vec<f32> = (0..len).map(|j| gv(rank, j, it)).collect();
            b.copy_from_host(&v)
        };
        // Warm-up: one eager call on the stream (starts the watchdog).
        let p = raw_case(world, gpu, CollKind::AllReduce, 1000, false, 0, s)?;
        stream.synchronize()?;
        let mut fails = (verify(&p, rank, log)? > 0) as usize;
        stream.begin_capture()?;
        // SAFETY: the buffers outlive the graph and its replays (dropped at
        // the end of this function, after the last synchronize).
        let captured = unsafe {
            world
                .all_reduce_raw(vp(&a1), vp(&o1), c1, dt, sum, s)
                .and_then(|_| world.all_reduce_raw(vp(&a2), vp(&o2), c2, dt, sum, s))
                .and_then(|_| world.all_gather_raw(vp(&ga), vp(&go), cg, dt, s))
                .and_then(|_| world.reduce_scatter_block_raw(vp(&ra), vp(&ro), cr, dt, sum, s))
        };
        let graph = stream.end_capture();
        captured?;
        let graph = graph?;
        let (mut a1, mut a2, mut ga, mut ra) = (a1, a2, ga, ra);
        let check = |what: &str,
                     out: &DeviceBuffer<f32>,
                     want: &dyn Fn(u64) -> f32,
                     log: &mut String|
         -> gpucoll::Result<usize> {
            let got = out.to_vec()?;
            let bad = got
                .iter()
                .enumerate()
                .filter(|(j, g)| **g != want(*j as u64))
                .count();
            if bad > 0 {
                let j = got
                    .iter()
                    .enumerate()
                    .position(|(j, g)| *g != want(j as u64))
                    .unwrap_or(0);
                let _ = writeln!(
                    log,
                    "rank {rank} WRONG {what}: {bad} elements; first at {j}: got {} want {}",
                    got[j],
                    want(j as u64)
                );
            }
            Ok((bad > 0) as usize)
        };
        for it in 1..=5u64 {
            fill(&mut a1, c1, it)?;
            fill(&mut a2, c2, it)?;
            fill(&mut ga, cg, it)?;
            fill(&mut ra, cr * nn, it)?;
            graph.launch(&stream)?;
            stream.synchronize()?;
            let all = |j: u64| (0..n).map(|r| gv(r, j, it)).sum::<f32>();
            fails += check(&format!("replay {it} all_reduce 1 MiB"), &o1, &all, log)?;
            fails += check(&format!("replay {it} all_reduce 64 MiB"), &o2, &all, log)?;
            fails += check(
                &format!("replay {it} all_gather"),
                &go,
                &|j| gv((j / cg) as usize, j % cg, it),
                log,
            )?;
            fails += check(
                &format!("replay {it} reduce_scatter"),
                &ro,
                &|j| all(rank as u64 * cr + j),
                log,
            )?;
            // Eager calls between replays: blocking typed, then on the stream.
            let e_in: Vec<f32> = (0..5000).map(|j| gv(rank, j, it + 100)).collect();
            let e_in = DeviceBuffer::from_host(gpu, &e_in)?;
            let mut e_out = z(5000)?;
            world.all_reduce_into(&e_in, &mut e_out, sum)?;
            fails += check(
                &format!("eager all_reduce after replay {it}"),
                &e_out,
                &|j| (0..n).map(|r| gv(r, j, it + 100)).sum::<f32>(),
                log,
            )?;
            let p = raw_case(world, gpu, CollKind::AllGather, 3001, false, it, s)?;
            stream.synchronize()?;
            fails += (verify(&p, rank, log)? > 0) as usize;
        }
        world.async_error()?;
        drop(graph);
        Ok(fails)
    }

    /// (c) GPUCOLL_TIMEOUT (5 s in the script): rank 1 skips one all_reduce,
    /// first blocking (on a duplicate), then on a stream (on the world);
    /// every rank must report Timeout/PeerFailed (or, for rank 1 afterwards,
    /// any fatal error) within timeout + 15 s, and exit.
    fn stage_timeout(
        world: &Communicator,
        mpi: &MpiComm,
        log: &mut String,
    ) -> gpucoll::Result<usize> {
        let (rank, n) = (world.rank(), world.size());
        let gpu = world.device().ok_or_else(|| {
            gpucoll::Error::Backend(format!("no GPU ({} backend)", world.backend_name()))
        })?;
        let limit = world.config().timeout + std::time::Duration::from_secs(15);
        // Progress on stderr as it happens: if the stage is killed at its
        // time limit, the log shows how far each rank got.
        let t0 = Instant::now();
        let say = |what: &str| {
            eprintln!(
                "gpu_check: rank {rank} +{:.1} s: {what}",
                t0.elapsed().as_secs_f64()
            )
        };
        let mut fails = 0usize;
        let dup = world.duplicate()?;
        let count = 262_144usize;
        let din = DeviceBuffer::from_host(gpu, &vec![1f32; count])?;
        let mut dout = DeviceBuffer::<f32>::zeroed(gpu, count)?;
        let expected = |e: &gpucoll::Error, late: bool| match e {
            gpucoll::Error::Timeout { .. } | gpucoll::Error::PeerFailed(_) => true,
            gpucoll::Error::CommunicatorFailed(_) | gpucoll::Error::Aborted => late,
            _ => false,
        };
        let judge =
            |what: &str, r: gpucoll::Result<()>, t: Instant, late: bool, log: &mut String| {
                let el = t.elapsed();
                match r {
                    Err(e) if expected(&e, late) && el <= limit => {
                        let _ = writeln!(
                            log,
                            "rank {rank} ok: {what}: {e} after {:.1} s",
                            el.as_secs_f64()
                        );
                        0usize
                    }
                    other => {
                        let _ = writeln!(
                            log,
                            "rank {rank} WRONG {what}: {other:?} after {:.1} s (limit {:.0} s)",
                            el.as_secs_f64(),
                            limit.as_secs_f64()
                        );
                        1
                    }
                }
            };
        // Phase A: blocking call, rank 1 skips it.
        say("phase A (blocking, rank 1 skips)");
        if rank != 1 {
            let t = Instant::now();
            let r = dup.all_reduce_into(&din, &mut dout, ReduceOp::Sum);
            fails += judge(
                "blocking all_reduce while rank 1 skips it",
                r,
                t,
                false,
                log,
            );
        }
        say("phase A: first barrier");
        mpi.barrier()?;
        if rank == 1 {
            say("phase A: rank 1's late call");
            let t = Instant::now();
            let r = dup.all_reduce_into(&din, &mut dout, ReduceOp::Sum);
            fails += judge("rank 1's late blocking all_reduce", r, t, true, log);
        }
        say("phase A: second barrier");
        mpi.barrier()?;
        say("phase B (stream, rank 1 skips)");
        // Phase B: on a stream, rank 1 skips it; the error arrives through
        // the watchdog (async_error) and the next call.
        let stream = CudaStream::new(gpu)?;
        let poll = |t: Instant| -> gpucoll::Result<()> {
            loop {
                world.async_error()?;
                if t.elapsed() > limit {
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        if rank != 1 {
            let t = Instant::now();
            // SAFETY: the buffers outlive the stream work (synchronized below).
            let q = unsafe {
                world.all_reduce_raw(
                    vp(&din),
                    vp(&dout),
                    count as u64,
                    Datatype::F32,
                    ReduceOp::Sum,
                    Some(stream.raw()),
                )
            };
            if let Err(e) = q {
                fails += 1;
                let _ = writeln!(
                    log,
                    "rank {rank} WRONG queuing the stream all_reduce failed: {e}"
                );
            }
            fails += judge(
                "stream all_reduce while rank 1 skips it (async_error)",
                poll(t),
                t,
                false,
                log,
            );
            say("phase B: stream synchronize");
            stream.synchronize()?;
            say("phase B: the next call");
            let t = Instant::now();
            let r = unsafe {
                world.all_reduce_raw(
                    vp(&din),
                    vp(&dout),
                    count as u64,
                    Datatype::F32,
                    ReduceOp::Sum,
                    Some(stream.raw()),
                )
            };
            fails += judge("the next call after the stream timeout", r, t, true, log);
        }
        say("phase B: barrier");
        mpi.barrier()?;
        if rank == 1 {
            say("phase B: rank 1's late stream call");
            let t = Instant::now();
            // SAFETY: as above.
            let q = unsafe {
                world.all_reduce_raw(
                    vp(&din),
                    vp(&dout),
                    count as u64,
                    Datatype::F32,
                    ReduceOp::Sum,
                    Some(stream.raw()),
                )
            };
            let r = q.and_then(|_| poll(t));
            fails += judge("rank 1's late stream all_reduce", r, t, true, log);
            say("phase B: rank 1's stream synchronize");
            stream.synchronize()?;
        }
        say("done; dropping the duplicate communicator");
        let _ = n;
        Ok(fails)
    }

    fn run_stage(name: &str, world: &Communicator, mpi: &MpiComm, log: &mut String) -> usize {
        let r = match name {
            "raw" => stage_raw(world, log),
            "graph" => stage_graph(world, log),
            "timeout" => stage_timeout(world, mpi, log),
            other => Err(gpucoll::Error::InvalidUsage(format!(
                "unknown stage {other}"
            ))),
        };
        match r {
            Ok(f) => f,
            Err(e) => {
                let _ = writeln!(log, "rank {} ERROR stage {name}: {e}", world.rank());
                1
            }
        }
    }

    /// Gather every rank's failure count and log at rank 0, print the
    /// summary there (and write it to `out`); the exit status.
    fn report(
        mpi: &MpiComm,
        rank: usize,
        n: usize,
        failures: usize,
        log: &str,
        header: &str,
        out: Option<String>,
    ) -> i32 {
        let mine = format!("{failures}\n{log}");
        let lens = (mine.len() as u64).to_le_bytes().to_vec();
        let all_lens = mpi.allgather_bytes(&lens).unwrap_or_default();
        let maxlen = all_lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .max()
            .unwrap_or(0) as usize;
        let mut padded = mine.into_bytes();
        padded.resize(maxlen, b' ');
        let all = mpi.allgather_bytes(&padded).unwrap_or_default();
        let mut total_fail = 0usize;
        let mut summary = String::new();
        let _ = writeln!(summary, "{header}");
        for r in 0..n {
            let chunk = all.get(r * maxlen..(r + 1) * maxlen).unwrap_or(&[]);
            let text = String::from_utf8_lossy(chunk);
            let text = text.trim_end();
            let (f, rest) = text.split_once('\n').unwrap_or((text, ""));
            total_fail += f.trim().parse::<usize>().unwrap_or(1);
            for line in rest.lines().take(80) {
                let _ = writeln!(summary, "{line}");
            }
        }
        let _ = writeln!(
            summary,
            "gpu_check: {}",
            if total_fail == 0 {
                "ALL PASSED".to_string()
            } else {
                format!("{total_fail} FAILURES")
            }
        );
        if rank == 0 {
            print!("{summary}");
            if let Some(p) = out {
                let _ = std::fs::write(p, &summary);
            }
        }
        if total_fail == 0 {
            0
        } else {
            1
        }
    }

    pub fn main() -> i32 {
        let args: Vec<String> = std::env::args().collect();
        let arg = |k: &str| {
            args.iter()
                .position(|a| a == k)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        let large: u64 = arg("--large")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1 << 20);
        // `--perf` alone: the default sizes; `--perf SPEC`: see perf().
        let perf_spec = args.iter().position(|a| a == "--perf").map(|i| {
            args.get(i + 1)
                .filter(|v| !v.starts_with("--"))
                .cloned()
                .unwrap_or_else(|| {
                    "all_reduce:1m,all_reduce:8m,all_reduce:64m,all_reduce:256m".into()
                })
        });
        // `--perf-only`: skip the correctness sweep.
        let check = !args.iter().any(|a| a == "--perf-only");
        let out = arg("--out");

        let universe = match gpucoll::initialize() {
            Ok(u) => u,
            Err(e) => {
                eprintln!("initialize: {e}");
                return 2;
            }
        };
        let world = match universe.world() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("world: {e}");
                return 2;
            }
        };
        let mpi = Arc::new(MpiComm::world());
        // `--stage NAME`: one of the public-API stages instead of the sweep.
        if let Some(name) = arg("--stage") {
            let t = Instant::now();
            let mut log = String::new();
            let failures = run_stage(&name, &world, &mpi, &mut log);
            let header = format!(
                "gpu_check: stage {name}, {} ranks, backend {}, gpu of rank 0 = {:?}, {:.1} s",
                world.size(),
                world.backend_name(),
                world.device(),
                t.elapsed().as_secs_f64()
            );
            let code = report(
                &mpi,
                world.rank(),
                world.size(),
                failures,
                &log,
                &header,
                out,
            );
            drop(world);
            drop(universe);
            return code;
        }
        let topo = world.topology().clone();
        let config = Config::from_env().unwrap_or_default();
        let t0 = Instant::now();
        let backend = match CudaBackend::new(mpi.clone(), &topo, &config) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("rank {}: CudaBackend::new: {e}", topo.rank);
                return 3;
            }
        };
        let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut env = Env {
            graph: Graph::new(&topo),
            tuner: Tuner::new(&topo, backend.caps(), &config),
            gpu: backend.device_ordinal(),
            rank: topo.rank,
            n: topo.nranks,
            seq: 0,
            detail: String::new(),
            topo,
            backend,
            mpi,
        };
        let mut log = String::new();
        let mut failures = 0usize;
        let sizes = [
            (0u64, false),
            (1, false),
            (7919, false),
            (1001, true),
            (large, false),
        ];
        let t1 = Instant::now();
        macro_rules! each { ($($t:ty),*) => {$(
            all_cases::<$t>(&mut env, &sizes, &mut log, &mut failures);
        )*}; }
        if check {
            each!(i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64);
        }
        // Host buffers (staged through device memory by the backend).
        for kind in CollKind::ALL.into_iter().filter(|_| check) {
            for ip in [false, true] {
                let root = if kind.rooted() { env.n - 1 } else { 0 };
                match case::<f32>(&mut env, kind, ReduceOp::Sum, 4099, ip, false, true, root) {
                    Ok(0) => {}
                    Ok(b) => {
                        failures += 1;
                        let _ = writeln!(
                            log,
                            "rank {} WRONG host {} ip={ip}: {b}",
                            env.rank,
                            kind.name()
                        );
                    }
                    Err(e) => {
                        failures += 1;
                        let _ = writeln!(
                            log,
                            "rank {} ERROR host {} ip={ip}: {e}",
                            env.rank,
                            kind.name()
                        );
                    }
                }
            }
        }
        // A group in one launch: two all_reduces of different types, an
        // all_gather and a broadcast (four datatypes, three kinds).
        let group = (|| -> gpucoll::Result<usize> {
            if !check {
                return Ok(0);
            }
            let a: Vec<i32> = (0..3000).map(|j| val(env.rank, j, true) as i32).collect();
            let b: Vec<f64> = (0..5000).map(|j| val(env.rank, j, true) as f64).collect();
            let da = DeviceBuffer::from_host(env.gpu, &a)?;
            let db = DeviceBuffer::from_host(env.gpu, &b)?;
            let mut oa = DeviceBuffer::<i32>::zeroed(env.gpu, a.len())?;
            let mut ob = DeviceBuffer::<f64>::zeroed(env.gpu, b.len())?;
            let n = env.n;
            let c: Vec<i64> = (0..1001).map(|j| val(env.rank, j, false)).collect();
            let dc = DeviceBuffer::from_host(env.gpu, &c)?;
            let mut oc = DeviceBuffer::<i64>::zeroed(env.gpu, c.len() * n)?;
            let root = 1 % n;
            let d: Vec<f32> = (0..777)
                .map(|j| {
                    if env.rank == root {
                        val(root, j, false) as f32
                    } else {
                        -1.0
                    }
                })
                .collect();
            let mut od = DeviceBuffer::from_host(env.gpu, &d)?;
            let ta = Task {
                kind: CollKind::AllReduce,
                dtype: Datatype::I32,
                op: ReduceOp::Sum,
                count: 3000,
                root: 0,
                in_place: false,
            };
            let tb = Task {
                dtype: Datatype::F64,
                count: 5000,
                op: ReduceOp::Max,
                ..ta
            };
            let tc = Task {
                kind: CollKind::AllGather,
                dtype: Datatype::I64,
                count: 1001,
                ..ta
            };
            let td = Task {
                kind: CollKind::Broadcast,
                dtype: Datatype::F32,
                count: 777,
                root,
                in_place: true,
                ..ta
            };
            let od_in = od.raw();
            env.run(vec![
                (ta, da.raw(), oa.raw_mut()),
                (tb, db.raw(), ob.raw_mut()),
                (tc, dc.raw(), oc.raw_mut()),
                (td, od_in, od.raw_mut()),
            ])?;
            let (ga, gb) = (oa.to_vec()?, ob.to_vec()?);
            let (gc, gd) = (oc.to_vec()?, od.to_vec()?);
            let mut bad = 0;
            for (k, g) in gc.iter().enumerate() {
                bad += (*g != val(k / 1001, (k % 1001) as u64, false)) as usize;
            }
            for (j, g) in gd.iter().enumerate() {
                bad += (*g != val(root, j as u64, false) as f32) as usize;
            }
            for (j, g) in ga.iter().enumerate() {
                bad += (*g as f64
                    != reduce_exact(
                        ReduceOp::Sum,
                        (0..n).map(|r| val(r, j as u64, true)),
                        n,
                        false,
                    )) as usize;
            }
            for (j, g) in gb.iter().enumerate() {
                bad += (*g
                    != reduce_exact(
                        ReduceOp::Max,
                        (0..n).map(|r| val(r, j as u64, true)),
                        n,
                        true,
                    )) as usize;
            }
            Ok(bad)
        })();
        match group {
            Ok(0) => {}
            Ok(b) => {
                failures += 1;
                let _ = writeln!(log, "rank {} WRONG group: {b}", env.rank);
            }
            Err(e) => {
                failures += 1;
                let _ = writeln!(log, "rank {} ERROR group: {e}", env.rank);
            }
        }
        let check_s = t1.elapsed().as_secs_f64();
        for line in env.detail.lines().take(12) {
            let _ = writeln!(log, "{line}");
        }
        let calls = env.seq;
        if let Some(spec) = perf_spec.filter(|_| failures == 0) {
            if let Err(e) = perf(&mut env, &spec, &mut log) {
                failures += 1;
                let _ = writeln!(log, "rank {} ERROR perf: {e}", env.rank);
            }
        }
        let header = format!(
            "gpu_check: {} ranks, gpu of rank 0 = {}, large = {large}, setup {setup_ms:.0} ms, {calls} launches in {check_s:.1} s",
            env.n, env.gpu
        );
        let code = report(&env.mpi, env.rank, env.n, failures, &log, &header, out);
        drop(env);
        drop(world);
        drop(universe);
        code
    }
}
