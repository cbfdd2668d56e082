//! The only place that calls `cudarc::driver::sys`: thin, `Result`-returning
//! wrappers over the CUDA driver API. Everything above works with these.
//!
//! Every entry point first checks [`available`], which dlopens libcuda once
//! (cudarc's loader panics when the library is missing, so nothing here may
//! touch `sys` before that check succeeded).

use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::OnceLock;

pub(crate) use sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream};

mod memops;
pub(crate) use memops::{
    allocation_of, batch_available, memcpy_async, memcpy_batch_async, memcpy_dtod_async,
    stream_wait_geq_u32, stream_write_u32, stream_write_u64, Allocation,
};
mod vmm;
pub(crate) use vmm::{vmm_retain, VmmMapping};

/// Bytes of a CUDA IPC memory handle.
pub(crate) const IPC_HANDLE_BYTES: usize = 64;

/// Name of a CUDA error code (`CUDA_ERROR_...`).
fn error_name(r: sys::CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it null.
    let rc = unsafe { sys::cuGetErrorName(r, &mut p) };
    if rc == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{r:?}")
    }
}

/// The error of a failed call: [`Error::OutOfMemory`] when an allocation of
/// `alloc_bytes` ran out of memory, else [`Error::Cuda`] with the code.
/// Pure (the name is looked up by the caller), so it is unit-tested.
fn status_error(call: &'static str, code: i32, name: String, alloc_bytes: Option<u64>) -> Error {
    match alloc_bytes {
        Some(bytes) if code == CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory { call, bytes },
        _ => Error::Cuda { call, code, name },
    }
}

/// Turn a driver status into a `Result` naming the call.
fn check(r: sys::CUresult, call: &'static str) -> Result<()> {
    checked(r, call, None)
}

/// As [`check`] for a call that allocates `bytes`: running out of memory is
/// [`Error::OutOfMemory`].
fn check_alloc(r: sys::CUresult, call: &'static str, bytes: usize) -> Result<()> {
    checked(r, call, Some(bytes as u64))
}

fn checked(r: sys::CUresult, call: &'static str, alloc_bytes: Option<u64>) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(status_error(call, r as i32, error_name(r), alloc_bytes))
    }
}

/// Whether the CUDA driver library loads and initializes (cached).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // SAFETY: only tries to dlopen the library; no symbol is used.
        if !unsafe { sys::is_culib_present() } {
            return false;
        }
        // SAFETY: cuInit takes flags 0 and may be called any number of times.
        let r = unsafe { sys::cuInit(0) };
        r == sys::CUresult::CUDA_SUCCESS
    })
}

fn ensure() -> Result<()> {
    if available() {
        Ok(())
    } else {
        Err(Error::Backend(
            "the CUDA driver (libcuda.so) is not available or has no usable GPU".into(),
        ))
    }
}

pub(crate) fn device_count() -> Result<usize> {
    ensure()?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// Free and total bytes of the current context's device.
pub(crate) fn mem_get_info() -> Result<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two size_t.
    check(
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )?;
    Ok((free as u64, total as u64))
}

pub(crate) fn device_get(ordinal: i32) -> Result<CUdevice> {
    ensure()?;
    let mut d = 0;
    // SAFETY: writes one CUdevice.
    check(unsafe { sys::cuDeviceGet(&mut d, ordinal) }, "cuDeviceGet")?;
    Ok(d)
}

/// Multiprocessors (SMs) of `dev`.
pub(crate) fn multiprocessor_count(dev: CUdevice) -> Result<usize> {
    let mut v = 0;
    // SAFETY: writes one int.
    check(
        unsafe {
            sys::cuDeviceGetAttribute(
                &mut v,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                dev,
            )
        },
        "cuDeviceGetAttribute",
    )?;
    Ok(v.max(0) as usize)
}

pub(crate) fn device_pci_bus_id(dev: CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: the buffer holds 64 bytes, as stated.
    check(
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "cuDeviceGetPCIBusId",
    )?;
    // SAFETY: the driver NUL-terminates within the stated length.
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

pub(crate) fn primary_ctx_retain(dev: CUdevice) -> Result<CUcontext> {
    ensure()?;
    let mut c = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    check(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut c, dev) },
        "cuDevicePrimaryCtxRetain",
    )?;
    Ok(c)
}

pub(crate) fn ctx_set_current(ctx: CUcontext) -> Result<()> {
    // SAFETY: ctx is a live (retained) context.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

/// The context current on the calling thread, if any.
pub(crate) fn ctx_get_current() -> Result<Option<CUcontext>> {
    ensure()?;
    let mut c = std::ptr::null_mut();
    // SAFETY: writes one context handle (null when none is current).
    check(unsafe { sys::cuCtxGetCurrent(&mut c) }, "cuCtxGetCurrent")?;
    Ok((!c.is_null()).then_some(c))
}

/// The device of the calling thread's current context.
pub(crate) fn ctx_get_device() -> Result<CUdevice> {
    ensure()?;
    let mut d = 0;
    // SAFETY: writes one CUdevice; fails cleanly when no context is current.
    check(unsafe { sys::cuCtxGetDevice(&mut d) }, "cuCtxGetDevice")?;
    Ok(d)
}

pub(crate) fn can_access_peer(dev: CUdevice, peer: CUdevice) -> Result<bool> {
    let mut v = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDeviceCanAccessPeer(&mut v, dev, peer) },
        "cuDeviceCanAccessPeer",
    )?;
    Ok(v != 0)
}

pub(crate) fn mem_alloc(bytes: usize) -> Result<CUdeviceptr> {
    ensure()?;
    let mut p = 0;
    // SAFETY: writes one device pointer; the current context is set by the caller.
    check_alloc(
        unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) },
        "cuMemAlloc",
        bytes,
    )?;
    Ok(p)
}

pub(crate) fn mem_free(p: CUdeviceptr) {
    // SAFETY: p came from mem_alloc and is freed once.
    let _ = unsafe { sys::cuMemFree_v2(p) };
}

/// # Safety
/// `src` must be readable for `bytes`; `dst` a device range of `bytes`.
pub(crate) unsafe fn memcpy_htod(dst: CUdeviceptr, src: *const u8, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: per the contract.
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src as *const c_void, bytes) },
        "cuMemcpyHtoD",
    )?;
    // From pageable memory the call may return before the DMA landed, and
    // kernels on non-blocking streams are not ordered after it: wait.
    legacy_sync()
}

/// Wait for everything issued on the legacy default stream (synchronous
/// memsets and copies, which are not ordered with non-blocking streams).
fn legacy_sync() -> Result<()> {
    // SAFETY: the null stream is the legacy default stream of the current context.
    check(
        unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
        "cuStreamSynchronize(legacy)",
    )
}

/// # Safety
/// `dst` must be writable for `bytes`; `src` a device range of `bytes`.
pub(crate) unsafe fn memcpy_dtoh(dst: *mut u8, src: CUdeviceptr, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: per the contract.
    check(
        unsafe { sys::cuMemcpyDtoH_v2(dst as *mut c_void, src, bytes) },
        "cuMemcpyDtoH",
    )
}

/// # Safety
/// As [`memcpy_htod`], and `src` must stay valid until the copy ran on `stream`.
pub(crate) unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const u8,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: per the contract.
    check(
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, stream) },
        "cuMemcpyHtoDAsync",
    )
}

/// # Safety
/// `dst` is a device range of `bytes`.
pub(crate) unsafe fn memset_d8(dst: CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: per the contract.
    check(
        unsafe { sys::cuMemsetD8_v2(dst, value, bytes) },
        "cuMemsetD8",
    )?;
    // cuMemsetD8 is asynchronous with respect to the host.
    legacy_sync()
}

pub(crate) fn ipc_get_handle(p: CUdeviceptr) -> Result<[u8; IPC_HANDLE_BYTES]> {
    let mut h = sys::CUipcMemHandle {
        reserved: [0; IPC_HANDLE_BYTES],
    };
    // SAFETY: writes one handle; p is the base of a cuMemAlloc block.
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut h, p) },
        "cuIpcGetMemHandle",
    )?;
    Ok(h.reserved.map(|c| c as u8))
}

pub(crate) fn ipc_open(handle: &[u8; IPC_HANDLE_BYTES]) -> Result<CUdeviceptr> {
    let h = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut p = 0;
    // SAFETY: writes one device pointer; the handle came from cuIpcGetMemHandle.
    check(
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        },
        "cuIpcOpenMemHandle",
    )?;
    Ok(p)
}

pub(crate) fn ipc_close(p: CUdeviceptr) {
    // SAFETY: p came from ipc_open and is closed once.
    let _ = unsafe { sys::cuIpcCloseMemHandle(p) };
}

/// `(memory type, device ordinal)` of an address, or None if the driver
/// does not know it (ordinary host memory).
pub(crate) fn pointer_info(addr: u64) -> Result<Option<(u32, i32)>> {
    ensure()?;
    let mut mt: u32 = 0;
    // SAFETY: MEMORY_TYPE writes one unsigned int.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut mt as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            addr,
        )
    };
    if r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(r, "cuPointerGetAttribute(MEMORY_TYPE)")?;
    let mut ord: i32 = -1;
    // SAFETY: DEVICE_ORDINAL writes one int.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut ord as *mut i32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    };
    check(r, "cuPointerGetAttribute(DEVICE_ORDINAL)")?;
    Ok(Some((mt, ord)))
}

/// `CU_MEMORYTYPE_DEVICE`.
pub(crate) const MEMORYTYPE_DEVICE: u32 = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;

/// Pinned, device-mapped, portable host memory.
pub(crate) fn host_alloc_mapped(bytes: usize) -> Result<*mut u8> {
    ensure()?;
    let mut p = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    check_alloc(
        unsafe {
            sys::cuMemHostAlloc(
                &mut p,
                bytes.max(1),
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        },
        "cuMemHostAlloc",
        bytes,
    )?;
    Ok(p as *mut u8)
}

pub(crate) fn host_free(p: *mut u8) {
    // SAFETY: p came from host_alloc_mapped and is freed once.
    let _ = unsafe { sys::cuMemFreeHost(p as *mut c_void) };
}

/// # Safety
/// `p` must be a page-aligned mapping of `bytes` that outlives the registration.
pub(crate) unsafe fn host_register(p: *mut u8, bytes: usize) -> Result<()> {
    // SAFETY: per the contract.
    check_alloc(
        unsafe {
            sys::cuMemHostRegister_v2(
                p as *mut c_void,
                bytes,
                sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        },
        "cuMemHostRegister",
        bytes,
    )
}

pub(crate) fn host_unregister(p: *mut u8) {
    // SAFETY: p was registered by host_register.
    let _ = unsafe { sys::cuMemHostUnregister(p as *mut c_void) };
}

pub(crate) fn host_device_pointer(p: *mut u8) -> Result<CUdeviceptr> {
    let mut d = 0;
    // SAFETY: p is pinned/registered with DEVICEMAP; writes one pointer.
    check(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p as *mut c_void, 0) },
        "cuMemHostGetDevicePointer",
    )?;
    Ok(d)
}

pub(crate) fn module_load(image: &[u8]) -> Result<CUmodule> {
    let mut m = std::ptr::null_mut();
    // SAFETY: image is a complete fatbin embedded in the binary.
    check(
        unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) },
        "cuModuleLoadData",
    )?;
    Ok(m)
}

pub(crate) fn module_unload(m: CUmodule) {
    // SAFETY: m came from module_load and is unloaded once.
    let _ = unsafe { sys::cuModuleUnload(m) };
}

pub(crate) fn module_function(m: CUmodule, name: &std::ffi::CStr) -> Result<CUfunction> {
    let mut f = std::ptr::null_mut();
    // SAFETY: m is a loaded module; name is NUL-terminated.
    check(
        unsafe { sys::cuModuleGetFunction(&mut f, m, name.as_ptr()) },
        "cuModuleGetFunction",
    )?;
    Ok(f)
}

/// # Safety
/// `params` must match the kernel's signature; everything it references must
/// stay valid until the kernel finished.
pub(crate) unsafe fn launch(
    f: CUfunction,
    grid: u32,
    block: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: per the contract.
    check(
        unsafe {
            sys::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    )
}

/// A new stream: non-blocking (never waits for the legacy default
/// stream), or with `after_legacy` a blocking one (work on it starts after
/// work queued before on the legacy default stream).
pub(crate) fn stream_create_ordered(after_legacy: bool) -> Result<CUstream> {
    let flags = if after_legacy {
        sys::CUstream_flags::CU_STREAM_DEFAULT
    } else {
        sys::CUstream_flags::CU_STREAM_NON_BLOCKING
    };
    let mut s = std::ptr::null_mut();
    // SAFETY: writes one stream handle.
    check(
        unsafe { sys::cuStreamCreate(&mut s, flags as u32) },
        "cuStreamCreate",
    )?;
    Ok(s)
}

/// A new non-blocking stream.
pub(crate) fn stream_create() -> Result<CUstream> {
    stream_create_ordered(false)
}

pub(crate) fn stream_destroy(s: CUstream) {
    // SAFETY: s came from stream_create and is destroyed once.
    let _ = unsafe { sys::cuStreamDestroy_v2(s) };
}

pub(crate) fn stream_synchronize(s: CUstream) -> Result<()> {
    // SAFETY: s is a live stream.
    check(
        unsafe { sys::cuStreamSynchronize(s) },
        "cuStreamSynchronize",
    )
}

/// Whether all work issued on `s` completed.
pub(crate) fn stream_query(s: CUstream) -> Result<bool> {
    // SAFETY: s is a live stream.
    let r = unsafe { sys::cuStreamQuery(s) };
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check(r, "cuStreamQuery")?;
    Ok(true)
}

/// Whether the legacy default stream has nothing queued or running.
pub(crate) fn legacy_stream_idle() -> Result<bool> {
    stream_query(std::ptr::null_mut())
}

pub(crate) fn event_create() -> Result<CUevent> {
    let mut e = std::ptr::null_mut();
    // SAFETY: writes one event handle.
    check(
        unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
        "cuEventCreate",
    )?;
    Ok(e)
}

pub(crate) fn event_record(e: CUevent, s: CUstream) -> Result<()> {
    // SAFETY: both handles are live.
    check(unsafe { sys::cuEventRecord(e, s) }, "cuEventRecord")
}

/// Whether the work before the event completed.
pub(crate) fn event_query(e: CUevent) -> Result<bool> {
    // SAFETY: e is a live event.
    let r = unsafe { sys::cuEventQuery(e) };
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check(r, "cuEventQuery")?;
    Ok(true)
}

pub(crate) fn event_destroy(e: CUevent) {
    // SAFETY: e came from event_create and is destroyed once.
    let _ = unsafe { sys::cuEventDestroy_v2(e) };
}

/// Make `s` wait (on the device) for the work captured by `e`'s last record.
pub(crate) fn stream_wait_event(s: CUstream, e: CUevent) -> Result<()> {
    // SAFETY: both handles are live; flags 0 (default wait).
    check(
        unsafe { sys::cuStreamWaitEvent(s, e, 0) },
        "cuStreamWaitEvent",
    )
}

/// The context a stream belongs to.
pub(crate) fn stream_context(s: CUstream) -> Result<CUcontext> {
    ensure()?;
    let mut c = std::ptr::null_mut();
    // SAFETY: writes one context handle; `s` is a stream handle of the caller.
    check(unsafe { sys::cuStreamGetCtx(s, &mut c) }, "cuStreamGetCtx")?;
    Ok(c)
}

/// Whether a stream is being captured into a CUDA graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Not capturing: work runs when it reaches the device.
    None,
    /// Capturing: work becomes graph nodes and runs at every replay.
    Active,
    /// The capture sequence failed; it must be ended by its owner.
    Invalidated,
}

/// Capture status of `s` (`cuStreamIsCapturing`; safe to call during capture).
pub(crate) fn stream_capture(s: CUstream) -> Result<Capture> {
    ensure()?;
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one status value; `s` is a stream handle of the caller.
    check(
        unsafe { sys::cuStreamIsCapturing(s, &mut st) },
        "cuStreamIsCapturing",
    )?;
    Ok(match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Capture::None,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Capture::Active,
        _ => Capture::Invalidated,
    })
}

/// While alive, this thread runs in `CU_STREAM_CAPTURE_MODE_RELAXED`, so
/// allocations (`cuMemAlloc`, `cuMemHostAlloc`) made while a stream is being
/// captured do not invalidate the capture; the previous mode comes back on drop.
pub(crate) struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    pub(crate) fn enter() -> Result<RelaxedCapture> {
        let mut m = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges this thread's mode through one valid pointer.
        check(
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) },
            "cuThreadExchangeStreamCaptureMode",
        )?;
        Ok(RelaxedCapture { previous: m })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut m = self.previous;
        // SAFETY: restores the mode saved by `enter` on this thread.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
    }
}

/// `(start, bytes)` of the allocation holding `addr`, or None if the driver
/// does not know the address.
pub(crate) fn pointer_range(addr: u64) -> Result<Option<(u64, u64)>> {
    ensure()?;
    let mut start: CUdeviceptr = 0;
    // SAFETY: RANGE_START_ADDR writes one CUdeviceptr.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut start as *mut CUdeviceptr as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            addr,
        )
    };
    if r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(r, "cuPointerGetAttribute(RANGE_START_ADDR)")?;
    let mut size: usize = 0;
    // SAFETY: RANGE_SIZE writes one size_t.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut size as *mut usize as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            addr,
        )
    };
    check(r, "cuPointerGetAttribute(RANGE_SIZE)")?;
    Ok(Some((start, size as u64)))
}

pub(crate) use sys::{CUgraph, CUgraphExec};

/// Start capturing `s` into a graph (`CU_STREAM_CAPTURE_MODE_GLOBAL`).
pub(crate) fn stream_begin_capture(s: CUstream) -> Result<()> {
    // SAFETY: `s` is a live, non-default stream of the current context.
    check(
        unsafe {
            sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        },
        "cuStreamBeginCapture",
    )
}

/// End the capture of `s` and return the captured graph.
pub(crate) fn stream_end_capture(s: CUstream) -> Result<CUgraph> {
    let mut g = std::ptr::null_mut();
    // SAFETY: writes one graph handle; `s` is the capturing stream.
    check(
        unsafe { sys::cuStreamEndCapture(s, &mut g) },
        "cuStreamEndCapture",
    )?;
    Ok(g)
}

pub(crate) fn graph_instantiate(g: CUgraph) -> Result<CUgraphExec> {
    let mut e = std::ptr::null_mut();
    // SAFETY: writes one executable graph handle; `g` is a live graph.
    check(
        unsafe { sys::cuGraphInstantiateWithFlags(&mut e, g, 0) },
        "cuGraphInstantiate",
    )?;
    Ok(e)
}

pub(crate) fn graph_launch(e: CUgraphExec, s: CUstream) -> Result<()> {
    // SAFETY: both handles are live.
    check(unsafe { sys::cuGraphLaunch(e, s) }, "cuGraphLaunch")
}

pub(crate) fn graph_exec_destroy(e: CUgraphExec) {
    // SAFETY: `e` came from graph_instantiate and is destroyed once.
    let _ = unsafe { sys::cuGraphExecDestroy(e) };
}

pub(crate) fn graph_destroy(g: CUgraph) {
    // SAFETY: `g` came from stream_end_capture and is destroyed once.
    let _ = unsafe { sys::cuGraphDestroy(g) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes_map_to_errors() {
        let oom = sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY as i32;
        assert_eq!(oom, CUDA_ERROR_OUT_OF_MEMORY);
        let e = status_error(
            "cuMemAlloc",
            oom,
            "CUDA_ERROR_OUT_OF_MEMORY".into(),
            Some(64),
        );
        assert_eq!(
            e,
            Error::OutOfMemory {
                call: "cuMemAlloc",
                bytes: 64
            }
        );
        assert!(!e.is_fatal());
        // Out of memory outside an allocation keeps its code and is fatal.
        let e = status_error(
            "cuLaunchKernel",
            oom,
            "CUDA_ERROR_OUT_OF_MEMORY".into(),
            None,
        );
        assert!(matches!(e, Error::Cuda { code, .. } if code == oom));
        assert!(e.is_out_of_memory() && e.is_fatal());
        let bad = sys::CUresult::CUDA_ERROR_INVALID_VALUE as i32;
        let e = status_error(
            "cuMemAlloc",
            bad,
            "CUDA_ERROR_INVALID_VALUE".into(),
            Some(64),
        );
        assert_eq!(
            e,
            Error::Cuda {
                call: "cuMemAlloc",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into()
            }
        );
        assert!(e.is_fatal() && !e.is_out_of_memory());
    }
}
