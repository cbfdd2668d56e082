//! Per-rank host shared memory segments of the CUDA backend (`/dev/shm`):
//! the control block (abort word, failure reason, per-channel kernel
//! status) and, when P2P is disabled, the rank's receive FIFOs and head
//! words. Every rank of a node maps every local segment and registers it
//! with CUDA (`cuMemHostRegister`, device-mapped) so kernels reach it.

use super::driver::CUdeviceptr;
use super::handles::HostRegistration;
use crate::backend::shared::shm::SegOwner;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the control block at the start of every segment.
pub(crate) const CONTROL_BYTES: usize = 16384;
const ABORT_OFF: usize = 0;
const REASON_LEN_OFF: usize = 64;
const REASON_OFF: usize = 128;
const REASON_MAX: usize = 896;
/// Per-channel kernel status (`GcChanStatus`, 64 bytes each).
pub(crate) const STATUS_OFF: usize = 1024;

/// One mapped (and CUDA-registered) segment.
#[derive(Debug)]
pub(crate) struct Segment {
    name: String,
    ptr: *mut u8,
    len: usize,
    linked: bool,
    /// The CUDA registration, released before the mapping (in `Drop`).
    reg: Option<HostRegistration>,
}

// SAFETY: the mapping is process-wide; shared words are accessed atomically
// or through the device, never through Rust references.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn sys_err(call: &'static str, name: &str) -> Error {
    Error::System {
        call,
        message: format!("{name}: {}", std::io::Error::last_os_error()),
    }
}

impl Segment {
    fn map(name: &str, len: usize, create: bool) -> Result<Segment> {
        let cname = CString::new(name).map_err(|_| Error::Backend("bad segment name".into()))?;
        let flags = if create {
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR
        } else {
            libc::O_RDWR
        };
        // SAFETY: cname is NUL-terminated.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(sys_err("shm_open", name));
        }
        if create {
            // SAFETY: fd is our open descriptor.
            if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
                let e = sys_err("ftruncate", name);
                // SAFETY: fd is open; the name was created by us.
                unsafe {
                    libc::close(fd);
                    libc::shm_unlink(cname.as_ptr());
                }
                return Err(e);
            }
        }
        // SAFETY: maps `len` bytes of the descriptor; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        // SAFETY: fd is open; the mapping keeps the memory alive.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            if create {
                // SAFETY: the name was created by us.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
            }
            return Err(sys_err("mmap", name));
        }
        Ok(Segment {
            name: name.to_string(),
            ptr: p as *mut u8,
            len,
            linked: create,
            reg: None,
        })
    }

    /// Create (zero-filled by the kernel) a new segment.
    pub(crate) fn create(name: &str, len: usize) -> Result<Segment> {
        Segment::map(name, len, true)
    }

    /// Map a peer's segment.
    pub(crate) fn open(name: &str, len: usize) -> Result<Segment> {
        let mut s = Segment::map(name, len, false)?;
        s.linked = false;
        Ok(s)
    }

    /// Remove the name (the mappings stay).
    pub(crate) fn unlink(&mut self) {
        if self.linked {
            if let Ok(c) = CString::new(self.name.as_str()) {
                // SAFETY: c is NUL-terminated.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
            self.linked = false;
        }
    }

    /// Register with CUDA (current context) and return the device address.
    pub(crate) fn register(&mut self) -> Result<CUdeviceptr> {
        if let Some(r) = &self.reg {
            return Ok(r.dev());
        }
        // SAFETY: the mapping is page aligned, `len` long, and outlives the
        // registration (dropped in Drop before munmap).
        let r = unsafe { HostRegistration::new(self.ptr, self.len)? };
        let d = r.dev();
        self.reg = Some(r);
        Ok(d)
    }

    /// Device address of byte `off`.
    pub(crate) fn dev_at(&self, off: usize) -> Result<CUdeviceptr> {
        self.reg
            .as_ref()
            .map(|r| r.dev() + off as u64)
            .ok_or_else(|| Error::Backend("segment not registered with CUDA".into()))
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: 8-aligned offset inside the mapping, only accessed atomically
        // from the host (the device uses volatile accesses of the same word).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    /// The abort word: 0, or 1 + the local rank that raised it.
    pub(crate) fn abort_word(&self) -> u64 {
        self.word(ABORT_OFF).load(Ordering::Acquire)
    }

    /// Raise the abort word's host half (first raiser wins; the kernel
    /// half, written by a failing kernel, is kept).
    pub(crate) fn raise_abort(&self, local_rank: usize) {
        let _ = self
            .word(ABORT_OFF)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & 0xffff_ffff == 0).then_some(w | (local_rank as u64 + 1))
            });
    }

    /// Publish why this rank failed (first reason wins).
    pub(crate) fn write_reason(&self, reason: &str) {
        let len = self.word(REASON_LEN_OFF);
        if len.load(Ordering::Acquire) != 0 {
            return;
        }
        let b = reason.as_bytes();
        let n = b.len().min(REASON_MAX);
        // SAFETY: the reason area holds REASON_MAX bytes inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.ptr.add(REASON_OFF), n) };
        len.store(n as u64, Ordering::Release);
    }

    pub(crate) fn reason(&self) -> Option<String> {
        let n = self.word(REASON_LEN_OFF).load(Ordering::Acquire) as usize;
        if n == 0 {
            return None;
        }
        let n = n.min(REASON_MAX);
        // SAFETY: written once before the length was published (Acquire above).
        let b = unsafe { std::slice::from_raw_parts(self.ptr.add(REASON_OFF), n) };
        Some(String::from_utf8_lossy(b).into_owned())
    }

    /// A 64-bit word of the status area, read racily with the device.
    pub(crate) fn read_u64(&self, off: usize) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        drop(self.reg.take());
        self.unlink();
        // SAFETY: unmaps exactly our mapping.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The segment name of `local_rank` in a communicator tagged `tag`.
pub(crate) fn segment_name(pid: u32, tag: u64, local_rank: usize) -> String {
    crate::backend::shared::shm::segment_name(SegOwner::Cuda, pid, tag, local_rank)
}
