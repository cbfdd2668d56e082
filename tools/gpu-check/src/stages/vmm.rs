//! `--stage vmm` (run with `GPUCOLL_CE=1`): registered VMM memory
//! (`cuMemCreate` exportable as a POSIX descriptor, as PyTorch's expandable
//! segments allocate), shared with peers through descriptors.
//!
//! 1. **Share limit**: every rank registers 70 outputs at once; the first
//!    64 may be direct (a rank shares at most 64 VMM allocations per
//!    communicator), the rest must not be; all_gathers into every one are
//!    checked either way.
//! 2. **Not exportable**: VMM memory created without a descriptor handle
//!    type registers, is not direct, and gives correct results.
//! 3. **Odd mappings**: in one reservation of twice the size, an
//!    allocation mapped at its second half (a buffer there may be direct),
//!    and two allocations mapped back to back (a buffer across both must
//!    not be: no single peer mapping holds it). all_gathers into each are
//!    checked.
//! 4. **Churn**: `GPU_CHURN_CYCLES` (default 300) times, a new input and
//!    output are created, registered, used by an all_gather (copy engines)
//!    and an all_reduce (the peer kernels on registered buffers), checked,
//!    deregistered and freed. After a warm-up the process's counters
//!    (device memory, mappings, fds) must not grow: peers release their
//!    imports once the owner stops sharing them.
//!
//! 5. **Unregistered churn**: the same cycles with outputs nobody
//!    registers (each used by three all_gathers): the copy-engine calls
//!    share them themselves, and stop when they are freed; no growth.
//!
//! `GPU_VMM_DIRECT=1` (scripts/gpu-check sets it) also fails the stage when
//! a registration that must be direct in parts 1 and 4 is not (the
//! descriptors could not be passed or imported). Part 3's allocation in
//! the middle of its reservation may be either (on CUDA 13 it is not: the
//! driver reports its range from the reservation's start).

use super::churn::{counters, grown};
use super::memkinds::{get, put, set_rw, vmm_alloc, vmm_prop, Mem};
use cudarc::driver::sys;
use gpucoll::{Communicator, Datatype, Error, ReduceOp, Registration, Result};
use std::ffi::c_void;
use std::fmt::Write as _;
use std::time::Instant;

/// Elements each rank contributes per call (2 MiB of f32: the all_reduce
/// of `COUNT * n` elements is past the peer kernels' 4 MiB threshold).
const COUNT: usize = 1 << 19;
/// Outputs registered at once in part 1: more than the 64 share slots.
const MANY: usize = 70;
/// Share slots a rank has per communicator.
const SLOTS: usize = 64;

fn value(r: usize, j: usize, i: usize) -> f32 {
    ((r * 131 + i * 17 + j % 251) % 4093) as f32
}

fn vp(m: &Mem) -> *mut c_void {
    m.ptr as usize as *mut c_void
}

/// An all_gather of this rank's values for round `i` into `out`, checked:
/// wrong elements.
fn gather(world: &Communicator, gpu: i32, out: &Mem, i: usize) -> Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let mine: Vec<f32> = (0..COUNT).map(|j| value(rank, j, i)).collect();
    let send = vmm_alloc(gpu, COUNT * 4, false)?;
    put(&send, &mine)?;
    put(out, &vec![-1.0; COUNT * n])?;
    // SAFETY: both buffers live until the blocking call returned.
    unsafe { world.all_gather_raw(vp(&send), vp(out), COUNT as u64, Datatype::F32, None)? };
    let got = get(out, COUNT * n)?;
    Ok(got
        .iter()
        .enumerate()
        .filter(|&(k, &x)| x != value(k / COUNT, k % COUNT, i))
        .count())
}

/// An all_reduce of `input` (this rank's values for round `i`) into
/// `out`, both `COUNT * n` elements, checked: wrong elements.
fn reduce(world: &Communicator, input: &Mem, out: &Mem, i: usize) -> Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let len = COUNT * n;
    put(
        input,
        &(0..len).map(|j| value(rank, j, i)).collect::<Vec<_>>(),
    )?;
    put(out, &vec![-1.0; len])?;
    // SAFETY: both buffers live until the blocking call returned.
    unsafe {
        world.all_reduce_raw(
            vp(input),
            vp(out),
            len as u64,
            Datatype::F32,
            ReduceOp::Sum,
            None,
        )?
    };
    let got = get(out, len)?;
    Ok(got
        .iter()
        .enumerate()
        .filter(|&(j, &x)| x != (0..n).map(|r| value(r, j, i)).sum::<f32>())
        .count())
}

fn register(world: &Communicator, m: &Mem, bytes: usize) -> Result<Registration> {
    world.register_raw(m.ptr as usize as *const c_void, bytes)
}

fn ck(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Backend(format!("{what}: {r:?}")))
    }
}

/// One reservation of `2 * half` bytes with allocations of `half` bytes
/// (exportable as descriptors) mapped into the halves `at` lists.
struct Reservation {
    base: u64,
    half: usize,
    maps: Vec<(u64, sys::CUmemGenericAllocationHandle)>,
}

impl Reservation {
    fn new(gpu: i32, half: usize, at: &[usize]) -> Result<Reservation> {
        let prop = vmm_prop(gpu, true);
        let mut base = 0;
        // SAFETY: writes one address; `half` is a multiple of 2 MiB.
        ck(
            unsafe { sys::cuMemAddressReserve(&mut base, 2 * half, 0, 0, 0) },
            "cuMemAddressReserve",
        )?;
        let mut r = Reservation {
            base,
            half,
            maps: Vec::new(),
        };
        for &k in at {
            let mut h = 0;
            // SAFETY: writes one handle; prop is initialized.
            ck(
                unsafe { sys::cuMemCreate(&mut h, half, &prop, 0) },
                "cuMemCreate",
            )?;
            let p = base + (k * half) as u64;
            // SAFETY: maps the new handle over one half of our reservation.
            let m = unsafe { sys::cuMemMap(p, half, 0, h, 0) };
            if let Err(e) = ck(m, "cuMemMap") {
                // SAFETY: the handle just created, not mapped.
                unsafe { sys::cuMemRelease(h) };
                return Err(e);
            }
            r.maps.push((p, h));
            set_rw(p, half, gpu)?;
        }
        Ok(r)
    }

    /// The memory at `off` (freed with the reservation).
    fn view(&self, off: usize) -> Mem {
        Mem::borrowed(self.base + off as u64)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: undoes `new`, once, after the calls on it returned.
        unsafe {
            for (p, h) in &self.maps {
                let _ = sys::cuMemUnmap(*p, self.half);
                let _ = sys::cuMemRelease(*h);
            }
            let _ = sys::cuMemAddressFree(self.base, 2 * self.half);
        }
    }
}

pub(crate) fn stage_vmm(world: &Communicator, log: &mut String) -> Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("vmm needs the CUDA backend".into()))?;
    let strict = std::env::var("GPU_VMM_DIRECT").ok().as_deref() == Some("1");
    let mut fails = 0usize;

    // 1. More registered outputs than share slots.
    let outs = (0..MANY)
        .map(|_| vmm_alloc(gpu, COUNT * 4 * n, true))
        .collect::<Result<Vec<_>>>()?;
    let regs = outs
        .iter()
        .map(|m| register(world, m, COUNT * 4 * n))
        .collect::<Result<Vec<_>>>()?;
    let direct: Vec<bool> = regs.iter().map(|r| r.is_direct()).collect();
    let first = direct.iter().take(SLOTS).filter(|d| **d).count();
    let beyond = direct.iter().skip(SLOTS).filter(|d| **d).count();
    let mut wrong = 0;
    for (k, out) in outs.iter().enumerate() {
        wrong += gather(world, gpu, out, k)?;
    }
    fails += usize::from(wrong > 0) + usize::from(beyond > 0);
    fails += usize::from(strict && first != SLOTS);
    let _ = writeln!(
        log,
        "rank {rank}: {MANY} VMM outputs registered at once: {first} of the first {SLOTS} \
         direct, {beyond} beyond them (0 allowed); all_gathers into each: {wrong} wrong elements"
    );
    drop(regs);
    drop(outs);

    // 2. VMM memory that cannot be exported.
    let plain = vmm_alloc(gpu, COUNT * 4 * n, false)?;
    let reg = register(world, &plain, COUNT * 4 * n)?;
    let bad = gather(world, gpu, &plain, 1000)?;
    fails += usize::from(bad > 0) + usize::from(reg.is_direct());
    let _ = writeln!(
        log,
        "rank {rank}: VMM memory without a descriptor handle: direct {} (false expected), \
         {bad} wrong elements",
        reg.is_direct()
    );
    drop(reg);
    drop(plain);

    // 3. Odd mappings.
    let bytes = COUNT * 4 * n;
    let half = bytes.div_ceil(2 << 20) * (2 << 20);
    let second = Reservation::new(gpu, half, &[1])?;
    let m = second.view(half);
    let reg = register(world, &m, bytes)?;
    let bad_second = gather(world, gpu, &m, 3000)?;
    let direct_second = reg.is_direct();
    drop(reg);
    let both = Reservation::new(gpu, half, &[0, 1])?;
    // Across the two allocations: from the last quarter of the first.
    let m = both.view(half - bytes / 2);
    let reg = register(world, &m, bytes)?;
    let bad_across = gather(world, gpu, &m, 3001)?;
    let direct_across = reg.is_direct();
    drop(reg);
    fails += usize::from(bad_second > 0) + usize::from(bad_across > 0);
    fails += usize::from(direct_across);
    let _ = writeln!(
        log,
        "rank {rank}: VMM allocation mapped at the second half of its reservation: direct \
         {direct_second}, {bad_second} wrong elements; a buffer across two allocations: \
         direct {direct_across} (false expected), {bad_across} wrong elements"
    );
    drop(second);
    drop(both);

    // 4. Create/register/use/deregister/free churn.
    let cycles: usize = std::env::var("GPU_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut directs = 0usize;
    let mut cycle = |i: usize| -> Result<usize> {
        let input = vmm_alloc(gpu, COUNT * 4 * n, true)?;
        let out = vmm_alloc(gpu, COUNT * 4 * n, true)?;
        let r_in = register(world, &input, COUNT * 4 * n)?;
        let r_out = register(world, &out, COUNT * 4 * n)?;
        directs += usize::from(r_in.is_direct()) + usize::from(r_out.is_direct());
        let bad = gather(world, gpu, &out, 2000 + i)? + reduce(world, &input, &out, 2000 + i)?;
        r_in.deregister();
        r_out.deregister();
        Ok(bad)
    };
    let mut wrong = 0;
    for i in 0..32 {
        wrong += cycle(i)?;
    }
    world.barrier()?;
    let before = counters(gpu)?;
    let t = Instant::now();
    for i in 0..cycles {
        wrong += cycle(32 + i)?;
    }
    world.barrier()?;
    let after = counters(gpu)?;
    fails += usize::from(wrong > 0);
    fails += usize::from(strict && directs != 2 * (cycles + 32));
    let _ = writeln!(
        log,
        "rank {rank}: {cycles} create/register/all_gather/all_reduce/deregister/free cycles of \
         VMM memory in {:.1} s ({:.2} ms each), {directs} of {} registrations direct, {wrong} \
         wrong elements",
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3 / cycles.max(1) as f64,
        2 * (cycles + 32)
    );
    // Imports are released once the work queued before completed, and
    // the GPU may be shared: a cycle's buffers of every rank, at most.
    let device_kib = (2 * COUNT * 4 * n * n / 1024) as i64 + 4096;
    fails += grown(rank, &before, &after, device_kib, log);

    // 5. Unregistered VMM outputs, shared by the copy-engine calls
    // themselves (the first call receives through a bounce buffer).
    let unreg = |i: usize| -> Result<usize> {
        let out = vmm_alloc(gpu, COUNT * 4 * n, true)?;
        Ok(gather(world, gpu, &out, i)?
            + gather(world, gpu, &out, i + 1)?
            + gather(world, gpu, &out, i + 2)?)
    };
    let mut wrong = 0;
    for i in 0..32 {
        wrong += unreg(5000 + 3 * i)?;
    }
    world.barrier()?;
    let before = counters(gpu)?;
    let t = Instant::now();
    for i in 0..cycles {
        wrong += unreg(6000 + 3 * i)?;
    }
    world.barrier()?;
    let after = counters(gpu)?;
    fails += usize::from(wrong > 0);
    let _ = writeln!(
        log,
        "rank {rank}: {cycles} create/all_gather x3/free cycles of unregistered VMM outputs \
         in {:.1} s ({:.2} ms each), {wrong} wrong elements",
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3 / cycles.max(1) as f64
    );
    // A freed share is noticed before the next one is made: the last
    // cycle's outputs of every rank, at most.
    let device_kib = (COUNT * 4 * n * n / 1024) as i64 + 4096;
    fails += grown(rank, &before, &after, device_kib, log);
    world.async_error()?;
    Ok(fails)
}
