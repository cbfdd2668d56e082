//! Driver calls of the copy-engine collectives: stream memory operations
//! on flag words, asynchronous device-to-device copies, and the identity
//! of an allocation (its buffer ID and range), which keys the
//! registration caches.

use super::{check, ensure, sys, CUdeviceptr, CUstream};
use crate::error::Result;
use std::ffi::c_void;

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
