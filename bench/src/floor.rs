//! `--floor`: the host↔GPU signalling floor, measured in the same job as
//! the tables and by every rank at once, so that it shares their process
//! layout (ranks sharing a GPU under MPS contend for it as the
//! collectives do). Every latency below this floor would need a different
//! signalling mechanism, so the tables quote their times as multiples of it
//! (`x floor`).
//!
//! Two figures, each the median of many round trips on each rank, then the
//! slowest rank's:
//! * **resident**: one GPU thread of a kernel launched once spins on a word
//!   of mapped pinned host memory; the host writes a number there and spins
//!   until the thread has echoed it into a second word (another cache line).
//!   This is the least a blocking call that hands work to a resident GPU
//!   worker and sees its completion in host memory can cost.
//! * **launch+sync**: an empty kernel launched on a stream, then a stream
//!   synchronize: what a call that launches a kernel and waits costs before
//!   it moves any data.
//!
//! The kernels are PTX text that the driver compiles at load time, as the
//! `--overlap` job's (no nvcc or NVRTC on the GPU machine).

/// The floor figures of one job, in microseconds (slowest rank's median).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    pub resident_us: f64,
    pub launch_sync_us: f64,
}

impl Floor {
    /// The figure the tables divide by: the resident round trip.
    pub fn us(&self) -> f64 {
        self.resident_us
    }

    /// The `#` lines printed before the tables.
    pub fn lines(&self, nranks: usize) -> Vec<String> {
        vec![
            format!(
                "# floor (--floor, all {nranks} ranks at once, median of {ROUND_TRIPS} round trips \
                 each, slowest rank): host -> resident GPU thread -> host through mapped memory \
                 {:.2} us; empty kernel launch + stream synchronize {:.2} us",
                self.resident_us, self.launch_sync_us
            ),
            "# x floor = time / the resident round trip".to_string(),
        ]
    }
}

/// Round trips timed per figure (after [`WARMUP`] untimed ones).
pub const ROUND_TRIPS: usize = 20_000;
/// Untimed round trips first.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const WARMUP: usize = 2_000;

/// The median of `samples` (sorted in place); 0 for none.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

pub use imp::measure;

#[cfg(feature = "cuda")]
mod imp {
    use super::{median, Floor, ROUND_TRIPS, WARMUP};
    use crate::gpu::Gpu;
    use crate::timing::Ranks;
    use cudarc::driver::{result, sys, CudaContext, LaunchConfig, PushKernelArg};
    use cudarc::nvrtc::Ptx;
    use gpucoll::Communicator;
    use std::ffi::c_void;
    use std::time::{Duration, Instant};

    /// `gpucoll_floor_echo(u64 *box)`: one thread waits until `box[0]`
    /// changes, stops when it reads `u64::MAX`, else copies it to `box[8]`
    /// (the next 64-byte line) and waits again. `gpucoll_floor_empty()`
    /// does nothing. Volatile accesses: each poll reads host memory anew,
    /// each echo is written through to it.
    const PTX: &str = r"
.version 7.0
.target sm_80
.address_size 64

.visible .entry gpucoll_floor_echo(
	.param .u64 p_box
)
{
	.reg .pred %p;
	.reg .b64 %box, %post, %taken;

	ld.param.u64 %box, [p_box];
	cvta.to.global.u64 %box, %box;
	mov.u64 %taken, 0;
WAIT:
	ld.volatile.global.u64 %post, [%box];
	setp.eq.u64 %p, %post, %taken;
	@%p bra WAIT;
	setp.eq.u64 %p, %post, -1;
	@%p bra DONE;
	mov.u64 %taken, %post;
	st.volatile.global.u64 [%box+64], %post;
	membar.sys;
	bra WAIT;
DONE:
	ret;
}

.visible .entry gpucoll_floor_empty()
{
	ret;
}
";

    /// Longest wait for one echo before the probe gives up (the kernel
    /// did not start, or the GPU is stuck): an error, never a hang.
    const ECHO_TIMEOUT: Duration = Duration::from_secs(10);

    /// Mapped pinned host memory of 128 bytes: `post` at word 0, `done` at
    /// word 8 (the next 64-byte line). Freed on drop.
    struct Mailbox {
        host: *mut u64,
        device: sys::CUdeviceptr,
    }

    impl Mailbox {
        fn new() -> Result<Mailbox, String> {
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: a plain allocation of 128 bytes in the current
            // (primary) context, which the caller made current.
            let host = unsafe { result::malloc_host(128, flags) }
                .map_err(|e| format!("cuMemHostAlloc(128, DEVICEMAP): {e:?}"))?
                as *mut u64;
            // SAFETY: `host` is 128 writable bytes just allocated.
            unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, 128) };
            let mut device: sys::CUdeviceptr = 0;
            // SAFETY: `host` was allocated with DEVICEMAP above; the out
            // pointer is a local.
            let rc =
                unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast::<c_void>(), 0) };
            let mb = Mailbox { host, device };
            if rc != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuMemHostGetDevicePointer: {rc:?}"));
            }
            Ok(mb)
        }

        fn post(&self, v: u64) {
            // SAFETY: word 0 of the live 128-byte mailbox; the GPU only
            // reads it.
            unsafe { std::ptr::write_volatile(self.host, v) }
        }

        fn done(&self) -> u64 {
            // SAFETY: word 8 of the live 128-byte mailbox, written by the
            // GPU thread; a volatile read sees each new value.
            unsafe { std::ptr::read_volatile(self.host.add(8)) }
        }
    }

    impl Drop for Mailbox {
        fn drop(&mut self) {
            // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; the
            // echo kernel has ended (its stream was synchronized) first.
            let _ = unsafe { result::free_host(self.host.cast::<c_void>()) };
        }
    }

    /// Both figures on this rank (medians, microseconds), with every rank
    /// measuring at the same time; then the slowest rank's.
    pub fn measure(world: &Communicator, gpu: &Gpu) -> Result<Floor, String> {
        let ordinal = gpu.ordinal();
        let on = |what: &str, e: cudarc::driver::DriverError| {
            format!("floor probe on GPU {ordinal}: {what}: {e:?}")
        };
        let ctx = CudaContext::new(ordinal as usize).map_err(|e| on("CUDA context", e))?;
        ctx.bind_to_thread()
            .map_err(|e| on("making the context current", e))?;
        let module = ctx
            .load_module(Ptx::from_src(PTX))
            .map_err(|e| on("loading its PTX", e))?;
        let echo = module
            .load_function("gpucoll_floor_echo")
            .map_err(|e| on("finding the echo kernel", e))?;
        let empty = module
            .load_function("gpucoll_floor_empty")
            .map_err(|e| on("finding the empty kernel", e))?;
        let stream = ctx.new_stream().map_err(|e| on("stream", e))?;
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };

        Ranks::barrier(world)?;
        let mb = Mailbox::new().map_err(|e| format!("floor probe on GPU {ordinal}: {e}"))?;
        let mut b = stream.launch_builder(&echo);
        b.arg(&mb.device);
        // SAFETY: the argument matches the PTX entry (.u64 pointer to 128
        // mapped bytes, of which the kernel touches words 0 and 8); the
        // mailbox outlives the kernel: `stop` below ends it and the stream
        // is synchronized before `mb` drops.
        unsafe { b.launch(one) }.map_err(|e| on("launching the echo kernel", e))?;
        let stop = |mb: &Mailbox| {
            mb.post(u64::MAX);
            stream.synchronize()
        };
        let mut samples = Vec::with_capacity(ROUND_TRIPS);
        let mut failed = None;
        for i in 1..=(WARMUP + ROUND_TRIPS) as u64 {
            let t0 = Instant::now();
            mb.post(i);
            while mb.done() != i {
                if t0.elapsed() > ECHO_TIMEOUT {
                    failed = Some(format!(
                        "floor probe on GPU {ordinal}: no echo of round trip {i} within {} s \
                         (the resident kernel did not run)",
                        ECHO_TIMEOUT.as_secs()
                    ));
                    break;
                }
                std::hint::spin_loop();
            }
            if failed.is_some() {
                break;
            }
            if i as usize > WARMUP {
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        stop(&mb).map_err(|e| on("ending the echo kernel", e))?;
        drop(mb);
        if let Some(msg) = failed {
            return Err(msg);
        }
        let resident = median(&mut samples);

        Ranks::barrier(world)?;
        samples.clear();
        for i in 0..WARMUP + ROUND_TRIPS {
            let t0 = Instant::now();
            let mut b = stream.launch_builder(&empty);
            // SAFETY: the entry takes no parameters and touches no memory.
            unsafe { b.launch(one) }.map_err(|e| on("launching the empty kernel", e))?;
            stream
                .synchronize()
                .map_err(|e| on("synchronizing the stream", e))?;
            if i >= WARMUP {
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let launch_sync = median(&mut samples);
        Ok(Floor {
            resident_us: crate::timing::max_over_ranks(world, resident)?,
            launch_sync_us: crate::timing::max_over_ranks(world, launch_sync)?,
        })
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Floor;
    use crate::gpu::Gpu;
    use gpucoll::Communicator;

    /// Without the feature no `Gpu` exists, so this is never reached.
    pub fn measure(_world: &Communicator, gpu: &Gpu) -> Result<Floor, String> {
        match *gpu {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn lines_name_both_figures() {
        let f = Floor {
            resident_us: 5.04,
            launch_sync_us: 11.2,
        };
        let l = f.lines(2).join("\n");
        assert!(l.contains("5.04 us") && l.contains("11.20 us"), "{l}");
        assert_eq!(f.us(), 5.04);
    }
}
