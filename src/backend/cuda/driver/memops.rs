//! Driver calls of the copy-engine collectives: stream memory operations
//! on flag words, asynchronous device-to-device copies, and the identity
//! of an allocation (its buffer ID and range), which keys the
//! registration caches.

use super::{check, ensure, sys, CUdeviceptr, CUstream};
use crate::error::Result;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Queue a store of `value` into the 32-bit word at `addr` (device memory,
/// or host memory registered with the device) on `s`, after everything
/// queued before it, with a memory barrier before the store.
///
/// # Safety
/// `addr` is a mapped, 4-byte aligned word that stays mapped until `s`
/// reached the store.
pub(crate) unsafe fn stream_write_u32(s: CUstream, addr: CUdeviceptr, value: u32) -> Result<()> {
    // SAFETY: the caller keeps `addr` mapped until the stream ran the store.
    check(
        unsafe {
            sys::cuStreamWriteValue32_v2(
                s,
                addr,
                value,
                sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        },
        "cuStreamWriteValue32",
    )
}

/// As [`stream_write_u32`] for a 64-bit word (8-byte aligned).
///
/// # Safety
/// As [`stream_write_u32`].
pub(crate) unsafe fn stream_write_u64(s: CUstream, addr: CUdeviceptr, value: u64) -> Result<()> {
    // SAFETY: the caller keeps `addr` mapped until the stream ran the store.
    check(
        unsafe {
            sys::cuStreamWriteValue64_v2(
                s,
                addr,
                value,
                sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        },
        "cuStreamWriteValue64",
    )
}

/// Queue a wait on `s` until the 32-bit word at `addr` is at least
/// `value` (unsigned comparison); later work on `s` starts after it.
///
/// # Safety
/// As [`stream_write_u32`].
pub(crate) unsafe fn stream_wait_geq_u32(s: CUstream, addr: CUdeviceptr, value: u32) -> Result<()> {
    // SAFETY: the caller keeps `addr` mapped until the stream passed the wait.
    check(
        unsafe {
            sys::cuStreamWaitValue32_v2(
                s,
                addr,
                value,
                sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        },
        "cuStreamWaitValue32",
    )
}

/// Queue a copy of `bytes` from `src` to `dst` on `s`; either may be a
/// peer's memory mapped into this context.
///
/// # Safety
/// Both ranges are mapped device memory of this address space and stay so
/// until `s` completed the copy; nothing else writes `dst` meanwhile.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    s: CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees both ranges for the copy's lifetime.
    check(
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s) },
        "cuMemcpyDtoDAsync",
    )
}

/// Queue a copy of `bytes` from `src` to `dst` on `s`, whatever memory
/// each lies in (unified addressing: device, pinned or pageable host
/// memory, a peer's mapped allocation). From or to pageable host memory
/// the driver stages the bytes and may return only once it has.
///
/// # Safety
/// Both ranges are addressable in this context for `bytes` and stay so
/// until `s` completed the copy; nothing else writes `dst` meanwhile.
pub(crate) unsafe fn memcpy_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    s: CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees both ranges for the copy's lifetime.
    check(
        unsafe { sys::cuMemcpyAsync(dst, src, bytes, s) },
        "cuMemcpyAsync",
    )
}

/// The allocation holding a device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// Unique per allocation for the process's life: a freed and
    /// reallocated range at the same address gets a new one.
    pub buffer_id: u64,
    pub base: CUdeviceptr,
    pub bytes: u64,
}

/// The allocation `addr` belongs to, or None if the driver does not know
/// the address (host memory that is not registered).
pub(crate) fn allocation_of(addr: u64) -> Result<Option<Allocation>> {
    ensure()?;
    let mut id: u64 = 0;
    let mut base: CUdeviceptr = 0;
    let mut bytes: usize = 0;
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data = [
        &mut id as *mut u64 as *mut c_void,
        &mut base as *mut CUdeviceptr as *mut c_void,
        &mut bytes as *mut usize as *mut c_void,
    ];
    // SAFETY: each data pointer points at a variable of the attribute's
    // type (u64, CUdeviceptr, size_t); three of each.
    let r = unsafe {
        sys::cuPointerGetAttributes(
            attrs.len() as u32,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            addr,
        )
    };
    if r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(r, "cuPointerGetAttributes")?;
    // An address the driver does not know leaves the range empty.
    if base == 0 || bytes == 0 {
        return Ok(None);
    }
    Ok(Some(Allocation {
        buffer_id: id,
        base,
        bytes: bytes as u64,
    }))
}

/// `cuMemcpyBatchAsync` in its CUDA 13 form (no failure index).
type BatchFn = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    CUstream,
) -> sys::CUresult;

/// The driver's batch copy, looked up once at run time: a driver older
/// than CUDA 13 (whose entry point has another signature) or without it
/// gives None, and the copies go one by one.
fn batch_fn() -> Option<BatchFn> {
    static BATCH: OnceLock<Option<BatchFn>> = OnceLock::new();
    *BATCH.get_or_init(|| {
        ensure().ok()?;
        let mut version = 0;
        // SAFETY: writes one int.
        let r = unsafe { sys::cuDriverGetVersion(&mut version) };
        if r != sys::CUresult::CUDA_SUCCESS || version < 13000 {
            return None;
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
        // SAFETY: the name is NUL-terminated; writes one pointer and a status.
        let r = unsafe {
            sys::cuGetProcAddress_v2(
                c"cuMemcpyBatchAsync".as_ptr(),
                &mut p,
                13000,
                0,
                &mut status,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS
            || status != sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
            || p.is_null()
        {
            return None;
        }
        // SAFETY: asked for the CUDA 13.0 version of the symbol, whose
        // signature `BatchFn` is.
        Some(unsafe { std::mem::transmute::<*mut c_void, BatchFn>(p) })
    })
}

/// Whether [`memcpy_batch_async`] is available.
pub(crate) fn batch_available() -> bool {
    batch_fn().is_some()
}

/// Queue `copies` `(dst, src, bytes)` as one batch on `s` (not the legacy
/// default stream, not while capturing: the driver refuses both). The
/// copies of a batch run in any order, the batch in stream order.
///
/// # Safety
/// As [`memcpy_dtod_async`] for every copy.
pub(crate) unsafe fn memcpy_batch_async(copies: &[(u64, u64, u64)], s: CUstream) -> Result<()> {
    let Some(f) = batch_fn() else {
        return Err(crate::error::Error::Backend(
            "cuMemcpyBatchAsync is not available".into(),
        ));
    };
    let mut dsts: Vec<CUdeviceptr> = copies.iter().map(|c| c.0).collect();
    let mut srcs: Vec<CUdeviceptr> = copies.iter().map(|c| c.1).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.2 as usize).collect();
    let invalid = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID,
        id: 0,
    };
    let mut attrs = [sys::CUmemcpyAttributes {
        srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: invalid,
        dstLocHint: invalid,
        flags: sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32,
    }];
    let mut idx = [0usize];
    // SAFETY: the arrays hold `copies.len()` entries (one attribute for
    // all, from index 0); the caller guarantees the ranges.
    check(
        unsafe {
            f(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                copies.len(),
                attrs.as_mut_ptr(),
                idx.as_mut_ptr(),
                1,
                s,
            )
        },
        "cuMemcpyBatchAsync",
    )
}
