//! `--stage threads`: communicators used at the same time from several
//! threads of every rank, as a program with a data-parallel and a
//! pipeline communicator (or one thread per model replica) does. Each of
//! `GPU_THREADS` threads (default 3) gets its own duplicate of the world
//! and runs `GPU_THREAD_ROUNDS` rounds (default 40) of all_reduce,
//! all_gather and broadcast, blocking and queued on a stream of its own,
//! at sizes from one element to 1 Mi; every element is compared with the
//! exact result. The threads' collectives overlap freely in time; each
//! communicator's own calls keep one thread's order, as MPI requires.
//! As the README's "Threads" section asks: each communicator's channels are
//! capped (`Config::cuda_channels`) so that all of them fit on the GPU at
//! once (threads × ranks per GPU × channels ≤ SMs; `GPU_THREADS_UNCAPPED=1`
//! leaves the default, which can deadlock the ranks until the timeout),
//! and every buffer is allocated before the threads start (a `cuMemFree`,
//! or any call that waits for the whole device, in one thread while
//! another thread's collective waits for its peers deadlocks the same way).

use super::{cu, gv, sum_raw, vp};
use cudarc::driver::{sys, CudaContext};
use gpucoll::{Communicator, CudaStreamRaw, Datatype, DeviceBuffer, Error, Result};
use std::fmt::Write as _;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Counts the rounds walk through: one-shots, the resident block's sizes,
/// ring plans.
const COUNTS: [usize; 5] = [1, 1031, 8192, 65537, 1 << 20];

/// One thread's buffers for one count: input, blocking and queued
/// all_reduce outputs, all_gather output, broadcast buffer.
struct Bufs {
    din: DeviceBuffer<f32>,
    out: DeviceBuffer<f32>,
    qout: DeviceBuffer<f32>,
    all: DeviceBuffer<f32>,
    b: DeviceBuffer<f32>,
}

fn bufs(gpu: i32, size: usize) -> Result<Vec<Bufs>> {
    COUNTS
        .iter()
        .map(|&n| {
            Ok(Bufs {
                din: DeviceBuffer::from_host(gpu, &vec![0.0f32; n])?,
                out: DeviceBuffer::from_host(gpu, &vec![0.0f32; n])?,
                qout: DeviceBuffer::from_host(gpu, &vec![0.0f32; n])?,
                all: DeviceBuffer::from_host(gpu, &vec![0.0f32; n * size])?,
                b: DeviceBuffer::from_host(gpu, &vec![0.0f32; n])?,
            })
        })
        .collect()
}

/// One thread's work on its own communicator: (calls, wrong elements, log).
fn worker(
    comm: &Communicator,
    t: usize,
    rounds: usize,
    sets: &mut [Bufs],
) -> Result<(usize, usize, String)> {
    let mut log = String::new();
    let gpu = comm
        .device()
        .ok_or_else(|| Error::Backend("threads needs the CUDA backend".into()))?;
    let ctx = cu(CudaContext::new(gpu as usize))?;
    cu(ctx.bind_to_thread())?;
    let stream = cu(ctx.new_stream())?;
    let (rank, size) = (comm.rank(), comm.size());
    // GPU_THREAD_MAX_COUNT: only the counts up to it.
    let max = env_usize("GPU_THREAD_MAX_COUNT", usize::MAX);
    let ncounts = COUNTS.iter().filter(|&&c| c <= max).count().max(1);
    let (mut calls, mut wrong) = (0usize, 0usize);
    let mut check = |what: String, got: Vec<f32>, want: &dyn Fn(usize) -> f32| {
        let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want(i)).collect();
        if let Some(&i) = bad.first() {
            let _ = writeln!(
                log,
                "rank {rank} WRONG threads t{t} {what}: {} elements; first at {i}: got {} want {}",
                bad.len(),
                got[i],
                want(i)
            );
        }
        wrong += bad.len();
    };
    for round in 0..rounds {
        let k = (round + t) % ncounts;
        let n = COUNTS[k];
        let Bufs {
            din,
            out,
            qout,
            all,
            b,
        } = &mut sets[k];
        // Distinct values per thread and round: a result of another
        // thread's call landing here would not match.
        let it = (t * 1000 + round) as u64;
        let mine: Vec<f32> = (0..n as u64).map(|j| gv(rank, j, it)).collect();
        let sum = |j: usize| (0..size).map(|r| gv(r, j as u64, it)).sum::<f32>();
        din.copy_from_host(&mine)?;

        // blocking all_reduce
        out.copy_from_host(&vec![-1.0f32; n])?;
        comm.all_reduce_into(&*din, out, gpucoll::ReduceOp::Sum)?;
        check(
            format!("all_reduce n={n} round {round}"),
            out.to_vec()?,
            &sum,
        );

        // all_reduce queued on this thread's stream
        qout.copy_from_host(&vec![-1.0f32; n])?;
        let s = stream.cu_stream() as CudaStreamRaw;
        // SAFETY: both buffers live until the stream is synchronized below.
        unsafe { sum_raw(comm, din, qout, n, Some(s))? };
        // SAFETY: this thread's live stream.
        let r = unsafe { sys::cuStreamSynchronize(stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Backend(format!("cuStreamSynchronize: {r:?}")));
        }
        check(
            format!("queued all_reduce n={n} round {round}"),
            qout.to_vec()?,
            &sum,
        );

        // blocking all_gather
        all.copy_from_host(&vec![-1.0f32; n * size])?;
        comm.all_gather_into(&*din, all)?;
        check(
            format!("all_gather n={n} round {round}"),
            all.to_vec()?,
            &|i| gv(i / n, (i % n) as u64, it),
        );

        // broadcast from a root that moves with the round
        let root = (round + t) % size;
        let init = if rank == root {
            mine.clone()
        } else {
            vec![-1.0; n]
        };
        b.copy_from_host(&init)?;
        // SAFETY: `b` holds n floats and outlives the blocking call.
        unsafe { comm.broadcast_raw(vp(b), n as u64, Datatype::F32, root, None)? };
        let got = b.to_vec()?;
        check(
            format!("broadcast n={n} root {root} round {round}"),
            got,
            &|j| gv(root, j as u64, it),
        );
        calls += 4;
    }
    comm.async_error()?;
    Ok((calls, wrong, log))
}

pub(crate) fn stage_threads(world: &Communicator, log: &mut String) -> Result<usize> {
    let nthreads = env_usize("GPU_THREADS", 3).max(1);
    let rounds = env_usize("GPU_THREAD_ROUNDS", 40);
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("threads needs the CUDA backend".into()))?;
    let mut config = gpucoll::Config::from_env()?;
    if std::env::var_os("GPU_THREADS_UNCAPPED").is_none() {
        let ctx = cu(CudaContext::new(gpu as usize))?;
        let sms =
            cu(ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT))?
                as usize;
        let gpus = cu(CudaContext::device_count())?.max(1) as usize;
        let per_gpu = world.size().div_ceil(gpus);
        let cap = (sms / (nthreads * per_gpu)).max(1);
        config.cuda_channels = Some(config.cuda_channels.map_or(cap, |c| c.min(cap)));
        let _ = writeln!(
            log,
            "rank {} threads: {sms} SMs, {per_gpu} ranks per GPU, {nthreads} communicators: \
             {cap} channels each",
            world.rank()
        );
    }
    // Duplicates are collective: made here, in the same order on every rank.
    let comms: Vec<Communicator> = (0..nthreads)
        .map(|_| world.duplicate_with(config.clone()))
        .collect::<Result<_>>()?;
    // Freed after every thread joined (a free waits for the whole device).
    let mut sets: Vec<Vec<Bufs>> = (0..nthreads)
        .map(|_| bufs(gpu, world.size()))
        .collect::<Result<_>>()?;
    let results: Vec<Result<(usize, usize, String)>> = std::thread::scope(|sc| {
        let handles: Vec<_> = comms
            .iter()
            .zip(sets.iter_mut())
            .enumerate()
            .map(|(t, (c, set))| sc.spawn(move || worker(c, t, rounds, set)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Backend("a worker thread panicked".into())))
            })
            .collect()
    });
    let (mut calls, mut wrong) = (0, 0);
    for (t, r) in results.into_iter().enumerate() {
        match r {
            Ok((c, w, l)) => {
                calls += c;
                wrong += w;
                log.push_str(&l);
            }
            Err(e) => {
                let _ = writeln!(log, "rank {} ERROR threads t{t}: {e}", world.rank());
                wrong += 1;
            }
        }
    }
    let _ = writeln!(
        log,
        "rank {} threads: {nthreads} threads, {calls} calls, {wrong} wrong",
        world.rank()
    );
    Ok(wrong)
}
