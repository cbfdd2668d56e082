//! The shim's only CUDA driver calls: classifying pointers, binding and
//! restoring contexts, the streams of the shim's communicators, events,
//! pinned staging memory and copies.
//!
//! CUDA is never initialised here: a pointer query on a process whose driver
//! nobody initialised fails with `CUDA_ERROR_NOT_INITIALIZED`, which means
//! host memory (the program has no device memory to pass). The driver
//! library is looked up once, at the first intercepted call.

use std::ffi::c_void;

pub type CuResult<T> = std::result::Result<T, String>;

#[cfg(feature = "cuda")]
mod imp {
    use super::CuResult;
    use cudarc::driver::sys;
    use std::collections::HashMap;
    use std::ffi::c_void;
    use std::sync::{Mutex, OnceLock};

    fn check(r: sys::CUresult, what: &str) -> CuResult<()> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what} failed: {r:?}"))
        }
    }

    /// Whether libcuda can be loaded (looked up once).
    fn driver_present() -> bool {
        static PRESENT: OnceLock<bool> = OnceLock::new();
        // SAFETY: only tries to dlopen the driver library.
        *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
    }

    /// The GPU whose device memory `p` points into, or `None` for host
    /// memory (pageable or pinned), null, or no CUDA. No driver call for the
    /// stack and heap addresses `hostmem` recognises, else one: for an
    /// address the driver does not know, `cuPointerGetAttributes` succeeds
    /// and leaves the memory type 0.
    #[inline]
    pub fn device_of(p: *const c_void) -> Option<i32> {
        if p.is_null() || !driver_present() || crate::hostmem::surely_host(p as usize) {
            return None;
        }
        let mut mt: u32 = 0;
        let mut ord: i32 = -1;
        let mut attrs = [
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data = [
            &mut mt as *mut u32 as *mut c_void,
            &mut ord as *mut i32 as *mut c_void,
        ];
        // SAFETY: two attributes, each written to a variable of its type
        // (unsigned int, int); any address may be queried.
        let r = unsafe {
            sys::cuPointerGetAttributes(
                2,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                p as usize as sys::CUdeviceptr,
            )
        };
        (r == sys::CUresult::CUDA_SUCCESS
            && mt == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
            && ord >= 0)
            .then_some(ord)
    }

    /// Primary contexts retained by the shim, by device ordinal.
    fn primary_contexts() -> &'static Mutex<HashMap<i32, usize>> {
        static CTX: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();
        CTX.get_or_init(|| Mutex::new(HashMap::new()))
    }

    fn primary_context(device: i32) -> CuResult<sys::CUcontext> {
        let mut map = primary_contexts().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&c) = map.get(&device) {
            return Ok(c as sys::CUcontext);
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: out-pointer to one CUdevice; the driver is initialised
        // because a pointer of this device was classified.
        check(unsafe { sys::cuDeviceGet(&mut dev, device) }, "cuDeviceGet")?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to one context handle.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        map.insert(device, ctx as usize);
        Ok(ctx)
    }

    /// Restores the thread's current context when dropped.
    pub struct CtxGuard {
        saved: sys::CUcontext,
    }

    impl CtxGuard {
        /// Remember the caller's context, to restore it when dropped (`None`
        /// without a CUDA driver).
        pub fn save() -> Option<CtxGuard> {
            if !driver_present() {
                return None;
            }
            let mut saved: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointer to one context handle.
            let r = unsafe { sys::cuCtxGetCurrent(&mut saved) };
            (r == sys::CUresult::CUDA_SUCCESS).then_some(CtxGuard { saved })
        }

        /// Make `device`'s primary context current (the one the CUDA runtime
        /// and gpucoll use), remembering the caller's. A caller with another
        /// context current (one it created, or another GPU's) has that
        /// context's legacy stream synchronized first, unless
        /// `GPUCOLL_LEGACY_STREAM_ORDER=0`.
        pub fn bind(device: i32) -> CuResult<CtxGuard> {
            let mut saved: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointer to one context handle.
            check(
                unsafe { sys::cuCtxGetCurrent(&mut saved) },
                "cuCtxGetCurrent",
            )?;
            let ctx = primary_context(device)?;
            if ctx != saved {
                if !saved.is_null() && crate::settings::get().legacy_order {
                    // A context of the program's own (cuCtxCreate, as the
                    // OSU benchmarks make before MPI_Init): its legacy stream
                    // is not the one gpucoll's stream is ordered after, and a
                    // cudaMemcpy from pageable memory may still be writing
                    // the buffers there. Wait for it while it is current.
                    // SAFETY: the null stream is the current context's
                    // legacy default stream.
                    check(
                        unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
                        "cuStreamSynchronize (the program's context)",
                    )?;
                }
                // SAFETY: a retained primary context.
                check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
            }
            Ok(CtxGuard { saved })
        }
    }

    impl Drop for CtxGuard {
        fn drop(&mut self) {
            let mut now: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointer to one context handle.
            let r = unsafe { sys::cuCtxGetCurrent(&mut now) };
            if r != sys::CUresult::CUDA_SUCCESS || now != self.saved {
                // SAFETY: the context the caller had current (or null).
                unsafe { sys::cuCtxSetCurrent(self.saved) };
            }
        }
    }

    /// A stream the shim created on a GPU (one per communicator), for
    /// nonblocking collectives that may wait for their peers as long as
    /// the program likes. A non-blocking stream: work the program (or
    /// another communicator's blocking call) queues on the legacy default
    /// stream later must not wait for it, or ranks that start communicators
    /// in crossed orders deadlock. It is ordered after the legacy stream's
    /// earlier work explicitly ([`Stream::after_legacy`]).
    pub struct Stream {
        device: i32,
        raw: sys::CUstream,
        /// Recorded on the legacy stream for [`Stream::after_legacy`].
        legacy: sys::CUevent,
    }

    // SAFETY: CUstream and CUevent handles may be used from any thread;
    // the owner serializes `after_legacy` (the communicator's lock).
    unsafe impl Send for Stream {}

    impl Stream {
        /// Create one on `device` (its primary context is made current for
        /// the call).
        pub fn new(device: i32) -> CuResult<Stream> {
            let _g = CtxGuard::bind(device)?;
            let mut s: sys::CUstream = std::ptr::null_mut();
            let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
            // SAFETY: out-pointer to one stream handle.
            check(
                unsafe { sys::cuStreamCreate(&mut s, flags) },
                "cuStreamCreate",
            )?;
            let mut ev: sys::CUevent = std::ptr::null_mut();
            let ev_flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: out-pointer to one event handle.
            if let Err(e) = check(
                unsafe { sys::cuEventCreate(&mut ev, ev_flags) },
                "cuEventCreate",
            ) {
                // SAFETY: the stream just created, destroyed once.
                unsafe { sys::cuStreamDestroy_v2(s) };
                return Err(e);
            }
            Ok(Stream {
                device,
                raw: s,
                legacy: ev,
            })
        }

        pub fn raw(&self) -> usize {
            self.raw as usize
        }

        /// Make work queued on this stream from now on wait, on the device,
        /// for what is queued on the legacy default stream of the current
        /// context (the device's primary context) so far.
        pub fn after_legacy(&self) -> CuResult<()> {
            // SAFETY: a live event of the current context; the null stream
            // is the current context's legacy stream.
            check(
                unsafe { sys::cuEventRecord(self.legacy, std::ptr::null_mut()) },
                "cuEventRecord (legacy stream)",
            )?;
            // SAFETY: a live stream and event of the current context.
            check(
                unsafe { sys::cuStreamWaitEvent(self.raw, self.legacy, 0) },
                "cuStreamWaitEvent",
            )
        }
    }

    impl Drop for Stream {
        fn drop(&mut self) {
            // Work still queued completes first; the driver frees the
            // stream and the event afterwards.
            if let Ok(_g) = CtxGuard::bind(self.device) {
                // SAFETY: a stream and an event this value created,
                // destroyed once.
                unsafe {
                    sys::cuStreamDestroy_v2(self.raw);
                    sys::cuEventDestroy_v2(self.legacy);
                }
            }
        }
    }

    /// A CUDA event marking the end of a nonblocking collective.
    pub struct Event {
        ev: sys::CUevent,
    }

    // SAFETY: a CUevent handle may be used from any thread.
    unsafe impl Send for Event {}
    // SAFETY: the driver synchronizes concurrent use of an event handle.
    unsafe impl Sync for Event {}

    impl Event {
        /// Record a new event on `stream` (its context current).
        pub fn record(stream: usize) -> CuResult<Event> {
            let mut ev: sys::CUevent = std::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: out-pointer to one event handle.
            check(
                unsafe { sys::cuEventCreate(&mut ev, flags) },
                "cuEventCreate",
            )?;
            let event = Event { ev };
            // SAFETY: a live event and a live stream of the current context.
            check(
                unsafe { sys::cuEventRecord(event.ev, stream as sys::CUstream) },
                "cuEventRecord",
            )?;
            Ok(event)
        }

        /// Whether the work before the event finished.
        pub fn is_done(&self) -> CuResult<bool> {
            // SAFETY: a live event.
            match unsafe { sys::cuEventQuery(self.ev) } {
                sys::CUresult::CUDA_SUCCESS => Ok(true),
                sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                r => Err(format!("cuEventQuery failed: {r:?}")),
            }
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            // SAFETY: a live event, destroyed once.
            unsafe { sys::cuEventDestroy_v2(self.ev) };
        }
    }

    /// Page-locked host memory for staging.
    pub struct Pinned {
        ptr: *mut c_void,
        bytes: usize,
    }

    // SAFETY: plain host memory owned by this value.
    unsafe impl Send for Pinned {}

    impl Pinned {
        pub fn ptr(&self) -> *mut c_void {
            self.ptr
        }
        /// Allocate (a context must be current).
        fn alloc(bytes: usize) -> CuResult<Pinned> {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: out-pointer to one host pointer.
            check(
                unsafe { sys::cuMemHostAlloc(&mut ptr, bytes.max(1), flags) },
                "cuMemHostAlloc",
            )?;
            Ok(Pinned { ptr, bytes })
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            unsafe { sys::cuMemFreeHost(self.ptr) };
        }
    }

    fn pool() -> &'static Mutex<Vec<Pinned>> {
        static POOL: OnceLock<Mutex<Vec<Pinned>>> = OnceLock::new();
        POOL.get_or_init(|| Mutex::new(Vec::new()))
    }

    /// A pinned buffer of at least `bytes` (reused from earlier calls when one
    /// is large enough; sizes grow in powers of two).
    pub fn take_pinned(bytes: usize) -> CuResult<Pinned> {
        let mut p = pool().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = p.iter().position(|b| b.bytes >= bytes) {
            return Ok(p.swap_remove(i));
        }
        drop(p);
        Pinned::alloc(bytes.max(4096).next_power_of_two())
    }

    /// Return a buffer to the pool.
    pub fn give_pinned(b: Pinned) {
        pool().lock().unwrap_or_else(|p| p.into_inner()).push(b);
    }

    /// Copy device memory to host memory (synchronous, a context current).
    ///
    /// # Safety
    /// `src` is device memory and `dst` host memory, both valid for `bytes`.
    pub unsafe fn copy_to_host(dst: *mut c_void, src: *const c_void, bytes: usize) -> CuResult<()> {
        // SAFETY: the caller guarantees both ranges.
        check(
            unsafe { sys::cuMemcpyDtoH_v2(dst, src as usize as sys::CUdeviceptr, bytes) },
            "cuMemcpyDtoH",
        )
    }

    /// Copy host memory to device memory (synchronous, a context current).
    ///
    /// # Safety
    /// `dst` is device memory and `src` host memory, both valid for `bytes`.
    pub unsafe fn copy_to_device(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
    ) -> CuResult<()> {
        // SAFETY: the caller guarantees both ranges.
        check(
            unsafe { sys::cuMemcpyHtoD_v2(dst as usize as sys::CUdeviceptr, src, bytes) },
            "cuMemcpyHtoD",
        )
    }

    /// Release everything the shim created (at `MPI_Finalize`, after every
    /// collective on the shim streams completed).
    pub fn teardown() {
        let ctxs = primary_contexts()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(&device) = ctxs.keys().next() {
            // Freeing pinned memory needs a context current.
            if let Ok(_g) = CtxGuard::bind(device) {
                pool().lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
        }
        let mut map = primary_contexts().lock().unwrap_or_else(|p| p.into_inner());
        for (device, _) in ctxs {
            let mut dev: sys::CUdevice = 0;
            // SAFETY: releases the retain taken in `primary_context`.
            unsafe {
                if sys::cuDeviceGet(&mut dev, device) == sys::CUresult::CUDA_SUCCESS {
                    sys::cuDevicePrimaryCtxRelease_v2(dev);
                }
            }
            map.remove(&device);
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    //! Built without CUDA: every buffer is host memory, so nothing below is
    //! reached; the functions report that instead of doing anything.
    use super::CuResult;
    use std::ffi::c_void;

    const NO_CUDA: &str = "gpucoll_mpi was built without the cuda feature";

    #[inline]
    pub fn device_of(_p: *const c_void) -> Option<i32> {
        None
    }

    pub struct CtxGuard;

    impl CtxGuard {
        pub fn save() -> Option<CtxGuard> {
            None
        }

        pub fn bind(_device: i32) -> CuResult<CtxGuard> {
            Err(NO_CUDA.into())
        }
    }

    pub struct Stream;

    impl Stream {
        pub fn new(_device: i32) -> CuResult<Stream> {
            Err(NO_CUDA.into())
        }
        pub fn raw(&self) -> usize {
            0
        }
        pub fn after_legacy(&self) -> CuResult<()> {
            Err(NO_CUDA.into())
        }
    }

    pub struct Event;

    impl Event {
        pub fn record(_stream: usize) -> CuResult<Event> {
            Err(NO_CUDA.into())
        }
        pub fn is_done(&self) -> CuResult<bool> {
            Ok(true)
        }
    }

    pub struct Pinned;

    impl Pinned {
        pub fn ptr(&self) -> *mut c_void {
            std::ptr::null_mut()
        }
    }

    pub fn take_pinned(_bytes: usize) -> CuResult<Pinned> {
        Err(NO_CUDA.into())
    }

    pub fn give_pinned(_b: Pinned) {}

    /// # Safety
    /// Never copies.
    pub unsafe fn copy_to_host(_d: *mut c_void, _s: *const c_void, _n: usize) -> CuResult<()> {
        Err(NO_CUDA.into())
    }

    /// # Safety
    /// Never copies.
    pub unsafe fn copy_to_device(_d: *mut c_void, _s: *const c_void, _n: usize) -> CuResult<()> {
        Err(NO_CUDA.into())
    }

    pub fn teardown() {}
}

pub use imp::*;

/// The first GPU any of `ptrs` points into (`MPI_IN_PLACE` and null skipped).
#[inline]
pub fn device_of_any(ptrs: &[*const c_void]) -> Option<i32> {
    ptrs.iter()
        .filter(|p| !crate::handles::is_in_place(**p))
        .find_map(|p| device_of(*p))
}
