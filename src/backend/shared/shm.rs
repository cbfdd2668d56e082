//! POSIX shared memory for both backends: one naming scheme, one mapping
//! type, the control block every rank's segment starts with, and the
//! removal of segments that crashed jobs left behind.
//!
//! Names are `/gpucoll.<backend>.<creator pid>.<nonce hex>.<local rank>`
//! (`backend` is `host` or `cuda`; the nonce is 128 random bits of the
//! creator's own, told to its peers over MPI only, so nobody outside the
//! job can know a name before its segment exists). Segments are created
//! with mode 0600 and unlinked by their creator once every local peer
//! mapped them, so a job that dies later leaves nothing in `/dev/shm`.
//! The creator records itself in the control block ([`creator`]); a peer
//! maps only a segment of its own uid, mode 0600, made by the process it
//! expects. A job that dies during setup can leave names behind;
//! [`cleanup_stale`] (run when any backend is created) removes those of
//! our uid whose creator is dead ([`stale`]).
//!
//! The control block (the first [`CONTROL_BYTES`] of every segment) holds
//! the owner's abort word, the creator header and the abort reason; see
//! [`Mapping::raise_abort`].

mod creator;
mod stale;

use crate::backend::shared::process;
use crate::error::{Error, Result};
pub(crate) use creator::{parse as parse_creator, Creator, HEADER_BYTES};
pub(crate) use stale::cleanup_stale;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which backend created a segment (part of its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegOwner {
    Host,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda,
}

impl SegOwner {
    fn label(self) -> &'static str {
        match self {
            SegOwner::Host => "host",
            SegOwner::Cuda => "cuda",
        }
    }
}

/// Where `shm_open` names live.
const SHM_DIR: &str = "/dev/shm";

/// Bytes of the shared control block at the start of every segment;
/// backends put their own data after it.
pub(crate) const CONTROL_BYTES: usize = 1024;
/// The abort word. Low 32 bits: 0, or 1 + the local rank that raised it
/// from the host. High 32 bits: reserved for a device-side failure (the
/// CUDA kernels write it), kept when the host raises its half.
const ABORT_OFF: usize = 0;
// The creator header (`creator.rs`) is at bytes 8..HEADER_BYTES.
const REASON_CLAIM_OFF: usize = 64;
const _: () = assert!(HEADER_BYTES <= REASON_CLAIM_OFF);
const REASON_LEN_OFF: usize = 72;
/// 0, or 1 + the communicator sequence number of the first call the
/// failure belongs to (written with the reason, before its length).
const FAILED_AT_OFF: usize = 80;
const REASON_OFF: usize = 128;
/// Longest abort reason kept (bytes).
pub(crate) const REASON_MAX: usize = CONTROL_BYTES - REASON_OFF;

/// The name of `local_rank`'s segment, created by process `pid` with its
/// random `nonce`.
pub(crate) fn segment_name(owner: SegOwner, pid: u32, nonce: u128, local_rank: usize) -> String {
    format!("/gpucoll.{}.{pid}.{nonce:032x}.{local_rank}", owner.label())
}

/// What a `/dev/shm` entry name (without the leading slash) says about the
/// segment: `(creator pid, nonce or tag, local rank)`, for every name
/// gpucoll ever wrote (16 hex digits of a tag in older builds); None for
/// anything else.
pub(crate) fn parse_segment_name(file: &str) -> Option<(u32, u128, usize)> {
    let fields: Vec<&str> = if let Some(rest) = file.strip_prefix("gpucoll-cuda-") {
        rest.split('-').collect()
    } else {
        let rest = file.strip_prefix("gpucoll.")?;
        let rest = ["host.", "cuda."]
            .iter()
            .find_map(|p| rest.strip_prefix(p))
            .unwrap_or(rest);
        rest.split('.').collect()
    };
    let [pid, tag, local] = fields[..] else {
        return None;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    let hex = (tag.len() == 16 || tag.len() == 32) && tag.bytes().all(|b| b.is_ascii_hexdigit());
    if !digits(pid) || !digits(local) || !hex {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    // pid 0 and negative pids name process groups for kill(2): never valid.
    if pid == 0 || pid > i32::MAX as u32 {
        return None;
    }
    Some((
        pid,
        u128::from_str_radix(tag, 16).ok()?,
        local.parse().ok()?,
    ))
}

fn sys_err(call: &'static str, what: &str) -> Error {
    Error::System {
        call,
        message: format!("{what}: {}", std::io::Error::last_os_error()),
    }
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::Backend(format!("bad segment name {name:?}")))
}

fn unlink(name: &str) -> Result<()> {
    let c = c_name(name)?;
    // SAFETY: `c` is a valid NUL-terminated string.
    if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
        return Err(sys_err("shm_unlink", name));
    }
    Ok(())
}

/// What `fstat` must say of a peer's segment: a regular file of our
/// uid, mode 0600 exactly (as [`Mapping::create`] sets it), `len` bytes.
fn check_stat(name: &str, st: &libc::stat, len: usize) -> Result<()> {
    let refused = |why: String| {
        Err(Error::Backend(format!(
            "shared memory segment {name}: {why}: refused"
        )))
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return refused(format!("not a regular file (mode {:o})", st.st_mode));
    }
    if st.st_uid != process::euid() {
        return refused(format!(
            "owned by uid {}, not ours ({})",
            st.st_uid,
            process::euid()
        ));
    }
    if st.st_mode & 0o7777 != 0o600 {
        return refused(format!("mode {:o}, not 600", st.st_mode & 0o7777));
    }
    if st.st_size as u64 != len as u64 {
        return Err(Error::Backend(format!(
            "shared memory segment {name} holds {} bytes, expected {len}: the ranks \
             disagree about the segment layout",
            st.st_size
        )));
    }
    Ok(())
}

/// A mapped shared memory segment, created (mode 0600) or opened by name.
/// The creator's name is removed by [`Mapping::unlink`] or, at the latest,
/// on drop; the mapping itself is released on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    /// We created it and have not unlinked it yet.
    linked: bool,
}

// SAFETY: the mapping is process-wide; concurrently mutated words are
// accessed atomically and bulk data follows the owners' protocols.
unsafe impl Send for Mapping {}
// SAFETY: as above; all methods take `&self` and use atomics for shared words.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

impl AsRef<Mapping> for Mapping {
    fn as_ref(&self) -> &Mapping {
        self
    }
}

impl Mapping {
    /// Create, size (zero-filled) and map a new segment of `len` bytes.
    /// The pages are reserved now: on a full `/dev/shm` a later first touch
    /// would kill the process with SIGBUS instead of failing here.
    pub(crate) fn create(name: &str, len: usize) -> Result<Mapping> {
        let c = c_name(name)?;
        // SAFETY: valid C string; flags and mode are plain integers.
        let fd = unsafe {
            libc::shm_open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600 as libc::mode_t,
            )
        };
        if fd < 0 {
            return Err(sys_err("shm_open", name));
        }
        let fail = |e: Error| {
            // SAFETY: `fd` is ours; the name was created by us just above.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
            }
            e
        };
        // Exactly 0600 whatever the umask: peers refuse any other mode.
        // SAFETY: `fd` is a valid descriptor we own.
        if unsafe { libc::fchmod(fd, 0o600) } != 0 {
            return Err(fail(sys_err("fchmod", name)));
        }
        // SAFETY: `fd` is a valid descriptor we own.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(fail(sys_err("ftruncate", name)));
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `fd` is a valid descriptor we own.
            let rc = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
            if rc == libc::ENOSPC || rc == libc::ENOMEM || rc == libc::EFBIG {
                return Err(fail(Error::System {
                    call: "posix_fallocate",
                    message: format!(
                        "{name}: no room for {len} bytes in /dev/shm ({}); enlarge /dev/shm \
                         or use smaller FIFO slots",
                        std::io::Error::from_raw_os_error(rc)
                    ),
                }));
            }
            // Other errors (file systems without fallocate) are harmless.
        }
        if len < CONTROL_BYTES {
            return Err(fail(Error::Backend(format!(
                "segment {name} of {len} bytes cannot hold the control block"
            ))));
        }
        let ptr = map(fd, len).map_err(|e| fail(e.with_name(name)))?;
        // SAFETY: `fd` is ours; the mapping stays valid after closing it.
        unsafe { libc::close(fd) };
        let m = Mapping {
            ptr,
            len,
            name: name.to_string(),
            linked: true,
        };
        // Peers open the segment only after an MPI round that follows this.
        for (i, w) in Creator::current().words().iter().enumerate() {
            m.word(creator::CREATOR_OFF + 8 * i)
                .store(*w, Ordering::Relaxed);
        }
        Ok(m)
    }

    /// Map a peer's segment, which must hold exactly `len` bytes and be
    /// what process `creator` (its pid as it reported it) made: a regular
    /// file of our uid, mode 0600, whose header names `creator`. Anything
    /// else (a name planted by another user, a segment of another process)
    /// is refused before it is used.
    pub(crate) fn open(name: &str, len: usize, creator: u32) -> Result<Mapping> {
        let c = c_name(name)?;
        // SAFETY: valid C string.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(sys_err("shm_open", name));
        }
        // SAFETY: an all-zero `stat` is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is valid, `st` is writable.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = sys_err("fstat", name);
            // SAFETY: `fd` is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        if let Err(e) = check_stat(name, &st, len) {
            // SAFETY: `fd` is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mapped = map(fd, len);
        // SAFETY: `fd` is ours; a mapping stays valid after closing it.
        unsafe { libc::close(fd) };
        let m = Mapping {
            ptr: mapped.map_err(|e| e.with_name(name))?,
            len,
            name: name.to_string(),
            linked: false,
        };
        let head = m.header_bytes();
        let found = parse_creator(&head)
            .map_err(|e| Error::Backend(format!("shared memory segment {name}: {e}")))?;
        if found.pid != creator || found.uid != process::euid() {
            return Err(Error::Backend(format!(
                "shared memory segment {name} was made by pid {} (uid {}), expected pid \
                 {creator} (uid {}): refused",
                found.pid,
                found.uid,
                process::euid()
            )));
        }
        Ok(m)
    }

    /// A copy of the abort word and the creator header.
    fn header_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        for (i, chunk) in b.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&self.word(8 * i).load(Ordering::Acquire).to_le_bytes());
        }
        b
    }

    /// Remove the name (the mapping stays usable): once every peer mapped it.
    pub(crate) fn unlink(&mut self) -> Result<()> {
        if self.linked {
            self.linked = false;
            unlink(&self.name)?;
        }
        Ok(())
    }

    /// Start of the mapping (page aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The 64-bit word at byte `off`.
    pub(crate) fn word(&self, off: usize) -> &AtomicU64 {
        assert!(
            off % 8 == 0 && off + 8 <= self.len,
            "segment word out of range"
        );
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); the
        // mapping lives as long as `self`; shared words are only accessed
        // atomically (devices use volatile accesses of the same word).
        unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The abort word (see [`ABORT_OFF`]'s layout).
    pub(crate) fn abort_word(&self) -> u64 {
        self.word(ABORT_OFF).load(Ordering::Acquire)
    }

    /// The local rank that raised the host half of the abort word, if any.
    pub(crate) fn abort_raiser(&self) -> Option<usize> {
        match self.abort_word() & 0xffff_ffff {
            0 => None,
            w => Some((w - 1) as usize),
        }
    }

    /// Raise the host half of the abort word on behalf of `local_rank`
    /// (first raiser wins; a device-written high half is kept).
    pub(crate) fn raise_abort(&self, local_rank: usize) {
        let _ = self
            .word(ABORT_OFF)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & 0xffff_ffff == 0).then_some(w | (local_rank as u64 + 1))
            });
    }

    /// Store the owner's abort reason, once, with the sequence number of
    /// the first call it belongs to (None: every call). Returns whether
    /// this call wrote it.
    pub(crate) fn write_reason(&self, reason: &str, failed_at: Option<u64>) -> bool {
        if self
            .word(REASON_CLAIM_OFF)
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let mut n = reason.len().min(REASON_MAX);
        while !reason.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: REASON_OFF + n <= CONTROL_BYTES <= len (every segment
        // holds the control block); this thread won the claim above, so it
        // is the only writer of these bytes, and readers only read them
        // after the Release store of the length below.
        unsafe {
            std::ptr::copy_nonoverlapping(reason.as_ptr(), self.ptr.as_ptr().add(REASON_OFF), n);
        }
        self.word(FAILED_AT_OFF).store(
            failed_at.map_or(0, |s| s.saturating_add(1)),
            Ordering::Relaxed,
        );
        self.word(REASON_LEN_OFF)
            .store(n as u64 + 1, Ordering::Release);
        true
    }

    /// Whether the owner's abort reason has been written.
    pub(crate) fn has_reason(&self) -> bool {
        self.word(REASON_LEN_OFF).load(Ordering::Acquire) != 0
    }

    /// The sequence number of the first call the owner's failure belongs
    /// to; None when it belongs to every call or no reason was written.
    pub(crate) fn failed_at(&self) -> Option<u64> {
        if !self.has_reason() {
            return None;
        }
        self.word(FAILED_AT_OFF)
            .load(Ordering::Relaxed)
            .checked_sub(1)
    }

    /// The owner's abort reason, once it has been written.
    pub(crate) fn reason(&self) -> Option<String> {
        let stored = self.word(REASON_LEN_OFF).load(Ordering::Acquire);
        if stored == 0 {
            return None;
        }
        // Clamp: the word may be garbage written by a broken peer.
        let n = ((stored - 1) as usize).min(REASON_MAX);
        let mut bytes = vec![0u8; n];
        // SAFETY: REASON_OFF + n <= CONTROL_BYTES <= len; the bytes were
        // written once before the length was published (Acquire above).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(REASON_OFF), bytes.as_mut_ptr(), n);
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.linked {
            let _ = unlink(&self.name);
        }
        // SAFETY: `ptr`/`len` describe a mapping created by `map` that no
        // borrower outlives (views borrow the owning segment).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// An mmap error before the segment name is known to the message.
struct MapError(std::io::Error);

impl MapError {
    fn with_name(self, name: &str) -> Error {
        Error::System {
            call: "mmap",
            message: format!("{name}: {}", self.0),
        }
    }
}

fn map(fd: libc::c_int, len: usize) -> std::result::Result<NonNull<u8>, MapError> {
    // SAFETY: mapping a shared memory object we hold a descriptor to.
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
    if p == libc::MAP_FAILED {
        return Err(MapError(std::io::Error::last_os_error()));
    }
    NonNull::new(p as *mut u8).ok_or_else(|| MapError(std::io::Error::other("mmap returned null")))
}

#[cfg(test)]
mod tests;
