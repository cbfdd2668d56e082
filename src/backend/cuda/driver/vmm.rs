//! Driver calls for memory of the virtual memory management API
//! (`cuMemCreate` + `cuMemMap`, as PyTorch's expandable segments allocate):
//! whether an address is such memory, exporting its physical allocation as
//! a POSIX file descriptor, and mapping a peer's exported allocation into
//! this process. Legacy IPC (`cuIpcGetMemHandle`) refuses this memory.

use super::{check, ensure, sys, CUdeviceptr};
use crate::error::Result;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// A physical allocation of this process, retained (released on drop).
#[derive(Debug)]
pub(crate) struct VmmHandle(sys::CUmemGenericAllocationHandle);

/// The VMM allocation mapped at `addr`, retained, or None for any other
/// memory (`cuMemAlloc`, a memory pool's, managed or host memory), and
/// None unless the allocation is mapped at exactly `[addr, addr + bytes)`:
/// a peer maps the whole handle from its first byte, so the range it
/// reaches must be the one we post offsets into.
pub(crate) fn vmm_retain(addr: CUdeviceptr, bytes: u64) -> Result<Option<VmmHandle>> {
    ensure()?;
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: writes one address and one size.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr) };
    if r != sys::CUresult::CUDA_SUCCESS || base != addr || size as u64 != bytes {
        return Ok(None);
    }
    // A pool's allocation sits at some offset of the pool's physical
    // memory, which a peer mapping the handle from offset 0 would miss.
    let mut pool: *mut c_void = std::ptr::null_mut();
    // SAFETY: MEMPOOL_HANDLE writes one pointer-sized handle.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut pool as *mut *mut c_void as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            addr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || !pool.is_null() {
        return Ok(None);
    }
    let Some(first) = retain(addr) else {
        return Ok(None);
    };
    // The same handle maps the last byte (the driver returns the value the
    // memory was mapped with): the range is one allocation, not several
    // mapped back to back.
    let last = retain(addr + bytes.max(1) - 1);
    Ok(last.is_some_and(|l| l.0 == first.0).then_some(first))
}

fn retain(addr: CUdeviceptr) -> Option<VmmHandle> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: writes one handle; the driver only reads the address.
    let r = unsafe { sys::cuMemRetainAllocationHandle(&mut h, addr as usize as *mut c_void) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(VmmHandle(h))
}

impl VmmHandle {
    /// A descriptor naming the allocation, or None when it was not created
    /// exportable as one (`requestedHandleTypes` without POSIX fds).
    pub(crate) fn export_fd(&self) -> Option<OwnedFd> {
        let mut fd: libc::c_int = -1;
        // SAFETY: a POSIX-fd export writes one int.
        let r = unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut libc::c_int as *mut c_void,
                self.0,
                POSIX_FD,
                0,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
            return None;
        }
        // SAFETY: on success the driver handed us a new descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // The driver does not document close-on-exec for it: without it a
        // concurrent fork + exec would hand our GPU memory to the child.
        // SAFETY: F_SETFD on a descriptor we own; no pointers.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            tracing::warn!(
                "VMM export: FD_CLOEXEC not set ({}); not shared",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(fd)
    }
}

impl Drop for VmmHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was retained once by `vmm_retain`.
        let _ = unsafe { sys::cuMemRelease(self.0) };
    }
}

/// A peer's physical allocation imported from its descriptor and mapped
/// read-write for one device; unmapped and released on drop (which keeps
/// the peer's memory alive until then, even after the peer freed it).
#[derive(Debug)]
pub(crate) struct VmmMapping {
    handle: sys::CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    bytes: usize,
    mapped: bool,
}

impl VmmMapping {
    /// Import `fd` and map its first `bytes` (the peer's mapping of it)
    /// for GPU `device`. The descriptor may be closed afterwards.
    pub(crate) fn import(fd: &OwnedFd, bytes: u64, device: i32) -> Result<VmmMapping> {
        ensure()?;
        let bytes = bytes as usize;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; a POSIX-fd import takes the descriptor
        // as the pointer-sized value and does not take ownership of it.
        check(
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as isize as *mut c_void,
                    POSIX_FD,
                )
            },
            "cuMemImportFromShareableHandle",
        )?;
        // From here on, dropping `m` undoes whatever succeeded.
        let mut m = VmmMapping {
            handle,
            ptr: 0,
            bytes,
            mapped: false,
        };
        // SAFETY: writes one address; the size is the exporter's mapping,
        // a multiple of the allocation granularity.
        check(
            unsafe { sys::cuMemAddressReserve(&mut m.ptr, bytes, 0, 0, 0) },
            "cuMemAddressReserve",
        )?;
        // SAFETY: maps the handle from offset 0 (the only offset the driver
        // allows) over the whole reserved range.
        check(
            unsafe { sys::cuMemMap(m.ptr, bytes, 0, handle, 0) },
            "cuMemMap",
        )?;
        m.mapped = true;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one descriptor for the range mapped just above.
        check(
            unsafe { sys::cuMemSetAccess(m.ptr, bytes, &desc, 1) },
            "cuMemSetAccess",
        )?;
        Ok(m)
    }

    /// The allocation's first byte in this process.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        // SAFETY: each call undoes one step `import` completed; the owner
        // drops a mapping only after the work using it completed.
        unsafe {
            if self.mapped {
                let _ = sys::cuMemUnmap(self.ptr, self.bytes);
            }
            if self.ptr != 0 {
                let _ = sys::cuMemAddressFree(self.ptr, self.bytes);
            }
            let _ = sys::cuMemRelease(self.handle);
        }
    }
}
