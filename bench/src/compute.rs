//! The compute job of `--overlap` (feature `cuda`): a register-only FMA
//! kernel, given as PTX text that the driver compiles for the GPU at load
//! time (no nvcc or NVRTC on the GPU machine), launched several times in a
//! row on a non-blocking stream of its own, timed with CUDA events.
//!
//! Each launch has [`WAVES`] waves of short blocks that fill every SM
//! (SMs × resident blocks per SM, as the driver's occupancy query says).
//! Several short waves, rather than one long one, let a collective's
//! kernel take SMs between blocks and slow the job in proportion to what
//! it takes, as between the many tiles of a real GEMM; with one long wave
//! the collective's kernel would wait for the whole launch, or one block
//! pushed out would double it. The job touches memory once per thread (its
//! final store), so it measures contention for SMs, not for memory
//! bandwidth. Without the feature the type exists but no value of it can
//! be built.

pub use imp::*;

/// Waves of blocks per launch.
pub const WAVES: u32 = 8;

/// Threads per block.
pub const THREADS: u32 = 256;

/// A compute job on its own stream: launches of a kernel, timed on the GPU.
pub trait Compute {
    /// Queue `launches` launches of `iters` loops each between two timing
    /// events; returns once queued.
    fn start(&self, launches: usize, iters: u32) -> Result<(), String>;
    /// Whether the job started last is still running (does not wait).
    fn running(&self) -> Result<bool, String>;
    /// Wait for the job started last; its time on the GPU in seconds.
    fn finish(&self) -> Result<f64, String>;
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Compute;
    use super::{THREADS, WAVES};
    use crate::gpu::Gpu;
    use cudarc::driver::{
        sys, CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
    };
    use cudarc::nvrtc::Ptx;
    use gpucoll::DeviceBuffer;
    use std::sync::Arc;

    /// The kernel's name in [`PTX`].
    const KERNEL: &str = "gpucoll_bench_fma";

    /// `gpucoll_bench_fma(float *out, u32 iters)`: each thread runs 8
    /// independent chains `x = x * 0.999 + 0.001` (`iters` steps each, so
    /// the scheduler always has an FMA to issue) and stores their sum at
    /// `out[threadIdx.x]` (every block writes the same `THREADS` floats;
    /// the store only keeps the loop alive). The chains converge to 1, so
    /// no value becomes subnormal or infinite. PTX ISA 7.0 for sm_80: any
    /// driver of CUDA 11 or later JITs it for the GPU at hand (checked
    /// with ptxas 13.0 for sm_80 and sm_90: 20-22 registers, no spills).
    const PTX: &str = r"
.version 7.0
.target sm_80
.address_size 64

.visible .entry gpucoll_bench_fma(
	.param .u64 p_out,
	.param .u32 p_iters
)
{
	.reg .pred %p;
	.reg .b32 %t, %n;
	.reg .b64 %addr, %off;
	.reg .f32 %a<8>, %s<4>;

	ld.param.u64 %addr, [p_out];
	ld.param.u32 %n, [p_iters];
	mov.u32 %t, %tid.x;
	cvt.rn.f32.u32 %a0, %t;
	mul.f32 %a0, %a0, 0f3A83126F;
	add.f32 %a1, %a0, 0f3F800000;
	add.f32 %a2, %a0, 0f40000000;
	add.f32 %a3, %a0, 0f40400000;
	add.f32 %a4, %a0, 0f40800000;
	add.f32 %a5, %a0, 0f40A00000;
	add.f32 %a6, %a0, 0f40C00000;
	add.f32 %a7, %a0, 0f40E00000;
	setp.eq.u32 %p, %n, 0;
	@%p bra DONE;
LOOP:
	fma.rn.f32 %a0, %a0, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a1, %a1, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a2, %a2, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a3, %a3, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a4, %a4, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a5, %a5, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a6, %a6, 0f3F7FBE77, 0f3A83126F;
	fma.rn.f32 %a7, %a7, 0f3F7FBE77, 0f3A83126F;
	sub.u32 %n, %n, 1;
	setp.ne.u32 %p, %n, 0;
	@%p bra LOOP;
DONE:
	add.f32 %s0, %a0, %a1;
	add.f32 %s1, %a2, %a3;
	add.f32 %s2, %a4, %a5;
	add.f32 %s3, %a6, %a7;
	add.f32 %s0, %s0, %s1;
	add.f32 %s2, %s2, %s3;
	add.f32 %s0, %s0, %s2;
	cvta.to.global.u64 %addr, %addr;
	mul.wide.u32 %off, %t, 4;
	add.s64 %addr, %addr, %off;
	st.global.f32 [%addr], %s0;
	ret;
}
";

    /// The kernel, its stream, its output and two timing events on the
    /// rank's GPU (the primary context, which gpucoll and NCCL use too).
    pub struct ComputeJob {
        ordinal: i32,
        stream: Arc<CudaStream>,
        func: CudaFunction,
        out: DeviceBuffer<f32>,
        start: CudaEvent,
        end: CudaEvent,
        sms: u32,
        per_sm: u32,
        /// Kept so that the module outlives every launch.
        _ctx: Arc<CudaContext>,
    }

    impl ComputeJob {
        pub fn new(gpu: &Gpu) -> Result<ComputeJob, String> {
            let ordinal = gpu.ordinal;
            let on = |what: &str, e: cudarc::driver::DriverError| {
                format!("overlap compute kernel on GPU {ordinal}: {what}: {e:?}")
            };
            let ctx = CudaContext::new(ordinal as usize).map_err(|e| on("CUDA context", e))?;
            let module = ctx.load_module(Ptx::from_src(PTX)).map_err(|e| {
                on(
                    "loading its PTX (ISA 7.0, sm_80; the driver compiles it at load time)",
                    e,
                )
            })?;
            let func = module
                .load_function(KERNEL)
                .map_err(|e| on("finding the kernel", e))?;
            let sms = ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| on("SM count", e))?;
            let per_sm = func
                .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
                .map_err(|e| on("occupancy", e))?;
            if sms <= 0 || per_sm == 0 {
                return Err(format!(
                    "overlap compute kernel on GPU {ordinal}: {sms} SMs, {per_sm} resident \
                     blocks of {THREADS} threads per SM"
                ));
            }
            let stream = ctx.new_stream().map_err(|e| on("stream", e))?;
            let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
            let start = ctx.new_event(timing).map_err(|e| on("event", e))?;
            let end = ctx.new_event(timing).map_err(|e| on("event", e))?;
            let out = DeviceBuffer::<f32>::zeroed(ordinal, THREADS as usize)
                .map_err(|e| format!("overlap compute kernel on GPU {ordinal}: output: {e}"))?;
            Ok(ComputeJob {
                ordinal,
                stream,
                func,
                out,
                start,
                end,
                sms: sms as u32,
                per_sm,
                _ctx: ctx,
            })
        }

        /// SMs of the GPU and resident blocks of the kernel per SM.
        pub fn shape(&self) -> (u32, u32) {
            (self.sms, self.per_sm)
        }

        /// Blocks per launch.
        pub fn blocks(&self) -> u32 {
            WAVES.saturating_mul(self.sms).saturating_mul(self.per_sm)
        }

        fn err(&self, what: &str, e: cudarc::driver::DriverError) -> String {
            format!("overlap compute job on GPU {}: {what}: {e:?}", self.ordinal)
        }
    }

    impl Compute for ComputeJob {
        fn start(&self, launches: usize, iters: u32) -> Result<(), String> {
            let cfg = LaunchConfig {
                grid_dim: (self.blocks(), 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let out = self.out.device_ptr();
            self.start
                .record(&self.stream)
                .map_err(|e| self.err("recording an event", e))?;
            for _ in 0..launches {
                let mut b = self.stream.launch_builder(&self.func);
                b.arg(&out).arg(&iters);
                // SAFETY: the arguments match the PTX entry (.u64 pointer,
                // .u32 count); `out` holds THREADS floats and each thread
                // stores only at out[threadIdx.x] (blockDim.x == THREADS);
                // Drop waits for the stream before `out` is freed.
                unsafe { b.launch(cfg) }.map_err(|e| self.err("launching the kernel", e))?;
            }
            self.end
                .record(&self.stream)
                .map_err(|e| self.err("recording an event", e))
        }

        fn running(&self) -> Result<bool, String> {
            self.end
                .try_is_complete()
                .map(|done| !done)
                .map_err(|e| self.err("querying the end event", e))
        }

        fn finish(&self) -> Result<f64, String> {
            let ms = self
                .start
                .elapsed_ms(&self.end)
                .map_err(|e| self.err("waiting for the job", e))?;
            Ok(ms as f64 * 1e-3)
        }
    }

    impl Drop for ComputeJob {
        fn drop(&mut self) {
            // No launch may still write `out` when it is freed.
            let _ = self.stream.synchronize();
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    //! Without the feature no value of this type exists.
    use super::Compute;
    use crate::gpu::Gpu;

    pub enum ComputeJob {}

    impl ComputeJob {
        pub fn new(gpu: &Gpu) -> Result<ComputeJob, String> {
            match *gpu {}
        }
        pub fn shape(&self) -> (u32, u32) {
            match *self {}
        }
        pub fn blocks(&self) -> u32 {
            match *self {}
        }
    }

    impl Compute for ComputeJob {
        fn start(&self, _launches: usize, _iters: u32) -> Result<(), String> {
            match *self {}
        }
        fn running(&self) -> Result<bool, String> {
            match *self {}
        }
        fn finish(&self) -> Result<f64, String> {
            match *self {}
        }
    }
}
