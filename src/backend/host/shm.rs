//! POSIX shared memory segments of the host backend.
//!
//! Each rank creates one segment that holds every FIFO it *receives* in
//! (one connector per channel and sending local rank, itself included), and
//! maps the segments of the other ranks of its node to send to them. A
//! segment starts with a control block that carries the abort flag and the
//! abort reason of its owner.
//!
//! Names are `/gpucoll.<creator pid>.<comm tag hex>.<local rank>`. Every
//! segment is unlinked as soon as all local peers mapped it, so nothing is
//! left in `/dev/shm` when a job dies later; leftovers of a job that died
//! during setup are removed by the next job on the node
//! ([`cleanup_stale`]), recognised by a creator pid that no longer exists.

use super::fifo::{self, FifoConn};
use crate::error::{Error, Result};
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// "GPUCOLL" + layout version 1.
const MAGIC: u64 = 0x4750_5543_4f4c_4c01;

/// Bytes of the control block in front of the connectors.
pub(crate) const CONTROL_BYTES: usize = 4096;
const MAGIC_OFF: usize = 0;
const PARAMS_OFF: usize = 8;
const ABORT_OFF: usize = 64;
const REASON_CLAIM_OFF: usize = 128;
const REASON_LEN_OFF: usize = 136;
const REASON_OFF: usize = 192;
/// Longest abort reason kept (bytes).
pub(crate) const REASON_MAX: usize = 512;

/// Largest segment the backend creates (bytes).
pub(crate) const MAX_SEGMENT_BYTES: usize = 64 << 20;
/// Smallest slot the backend scales down to.
pub(crate) const MIN_SLOT_BYTES: usize = 4 << 10;

/// The shape of one rank's segment; identical on all ranks of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegLayout {
    pub slots: usize,
    pub slot_bytes: usize,
    pub channels: usize,
    pub local_size: usize,
}

impl SegLayout {
    /// Bytes between consecutive connectors.
    pub(crate) fn stride(&self) -> usize {
        fifo::connector_bytes(self.slots, self.slot_bytes)
    }

    /// Total segment size.
    pub(crate) fn total(&self) -> usize {
        CONTROL_BYTES + self.channels * self.local_size * self.stride()
    }

    /// Offset of the connector carrying `channel` from local rank `sender`.
    pub(crate) fn connector_offset(&self, channel: usize, sender: usize) -> usize {
        debug_assert!(channel < self.channels && sender < self.local_size);
        CONTROL_BYTES + (channel * self.local_size + sender) * self.stride()
    }

    fn params(&self) -> [u64; 4] {
        [
            self.slots as u64,
            self.slot_bytes as u64,
            self.channels as u64,
            self.local_size as u64,
        ]
    }
}

/// The slot size every rank derives from agreed inputs: the configured (or
/// default) size, scaled down (by powers of two, at least
/// [`MIN_SLOT_BYTES`]) until the segment of the largest node fits
/// [`MAX_SEGMENT_BYTES`].
pub(crate) fn choose_slot_bytes(
    requested: usize,
    slots: usize,
    channels: usize,
    max_local_size: usize,
) -> usize {
    let mut slot = (requested / fifo::LINE).max(1) * fifo::LINE;
    let fits = |slot: usize| {
        SegLayout {
            slots,
            slot_bytes: slot,
            channels,
            local_size: max_local_size.max(1),
        }
        .total()
            <= MAX_SEGMENT_BYTES
    };
    while slot > MIN_SLOT_BYTES && !fits(slot) {
        slot = (slot / 2).max(MIN_SLOT_BYTES) / fifo::LINE * fifo::LINE;
    }
    slot
}

/// `/gpucoll.<pid>.<tag hex>.<local rank>`.
pub(crate) fn segment_name(pid: u32, tag: u64, local_rank: usize) -> String {
    format!("/gpucoll.{pid}.{tag:016x}.{local_rank}")
}

/// Parse a `/dev/shm` entry (without the leading slash) written by
/// [`segment_name`]: `(pid, tag, local rank)`.
pub(crate) fn parse_segment_name(file: &str) -> Option<(u32, u64, usize)> {
    let rest = file.strip_prefix("gpucoll.")?;
    let mut parts = rest.split('.');
    let (pid, tag, local) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(local) || tag.len() != 16 {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    // pid 0 and negative pids name process groups for kill(2): never valid.
    if pid == 0 || pid > i32::MAX as u32 {
        return None;
    }
    Some((pid, u64::from_str_radix(tag, 16).ok()?, local.parse().ok()?))
}

/// Whether a process with this pid exists (EPERM: it exists, owned by
/// someone else).
pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return true; // never treat an invalid pid as dead
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Unlink `/dev/shm/gpucoll.*` segments whose creator is dead (left by a
/// job that crashed during setup). Returns how many were removed.
pub(crate) fn cleanup_stale() -> usize {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((pid, _, _)) = parse_segment_name(name) else {
            continue;
        };
        if pid_alive(pid) {
            continue;
        }
        if unlink(&format!("/{name}")).is_ok() {
            tracing::debug!("removed stale shared memory segment /dev/shm/{name}");
            removed += 1;
        }
    }
    removed
}

fn sys_err(call: &'static str, what: &str) -> Error {
    Error::System {
        call,
        message: format!("{what}: {}", std::io::Error::last_os_error()),
    }
}

fn unlink(name: &str) -> Result<()> {
    let c = CString::new(name).map_err(|_| Error::Backend(format!("bad segment name {name}")))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
        return Err(sys_err("shm_unlink", name));
    }
    Ok(())
}

/// A mapped shared memory segment.
pub(crate) struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    /// We created it and have not unlinked it yet.
    linked: bool,
}

// SAFETY: the mapping is process-wide; concurrently mutated words are
// accessed atomically and slot data follows the FIFO protocol.
unsafe impl Send for Segment {}
// SAFETY: as above; all methods take `&self` and use atomics for shared words.
unsafe impl Sync for Segment {}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

impl Segment {
    /// Create, size and map a new segment, and initialize its control block.
    pub(crate) fn create(name: &str, layout: &SegLayout) -> Result<Segment> {
        let len = layout.total();
        let c =
            CString::new(name).map_err(|_| Error::Backend(format!("bad segment name {name}")))?;
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
        // SAFETY: `fd` is a valid descriptor we own.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(fail(sys_err("ftruncate", name)));
        }
        // Reserve the pages now: on a full /dev/shm a later first touch of a
        // page would kill the process with SIGBUS instead of failing here.
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `fd` is a valid descriptor we own.
            let rc = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
            if rc == libc::ENOSPC || rc == libc::ENOMEM || rc == libc::EFBIG {
                return Err(fail(Error::System {
                    call: "posix_fallocate",
                    message: format!(
                        "{name}: no room for {len} bytes in /dev/shm ({}); enlarge /dev/shm \
                         or lower GPUCOLL_HOST_SLOT_BYTES",
                        std::io::Error::from_raw_os_error(rc)
                    ),
                }));
            }
            // Other errors (file systems without fallocate) are harmless.
        }
        let ptr = map(fd, len).map_err(|e| fail(e.with_name(name)))?;
        // SAFETY: `fd` is ours; the mapping stays valid after closing it.
        unsafe { libc::close(fd) };
        let seg = Segment {
            ptr,
            len,
            name: name.to_string(),
            linked: true,
        };
        // ftruncate zero-filled the memory: counters and flags start at 0.
        for (i, p) in layout.params().iter().enumerate() {
            seg.word(PARAMS_OFF + 8 * i).store(*p, Ordering::Relaxed);
        }
        seg.word(MAGIC_OFF).store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Map a peer's segment and check that its layout is the expected one.
    pub(crate) fn open(name: &str, layout: &SegLayout) -> Result<Segment> {
        let len = layout.total();
        let c =
            CString::new(name).map_err(|_| Error::Backend(format!("bad segment name {name}")))?;
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
        if st.st_size as u64 != len as u64 {
            // SAFETY: `fd` is ours.
            unsafe { libc::close(fd) };
            return Err(Error::Backend(format!(
                "shared memory segment {name} holds {} bytes, expected {len}: the ranks \
                 disagree about the host backend's layout",
                st.st_size
            )));
        }
        let mapped = map(fd, len);
        // SAFETY: `fd` is ours; a mapping stays valid after closing it.
        unsafe { libc::close(fd) };
        let seg = Segment {
            ptr: mapped.map_err(|e| e.with_name(name))?,
            len,
            name: name.to_string(),
            linked: false,
        };
        let params: Vec<u64> = (0..4)
            .map(|i| seg.word(PARAMS_OFF + 8 * i).load(Ordering::Relaxed))
            .collect();
        if seg.word(MAGIC_OFF).load(Ordering::Acquire) != MAGIC || params != layout.params() {
            return Err(Error::Backend(format!(
                "shared memory segment {name} has layout {params:?}, expected {:?}",
                layout.params()
            )));
        }
        Ok(seg)
    }

    /// Remove the name (the mapping stays usable).
    pub(crate) fn unlink(&mut self) -> Result<()> {
        if self.linked {
            self.linked = false;
            unlink(&self.name)?;
        }
        Ok(())
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(
            off % 8 == 0 && off + 8 <= self.len,
            "segment word out of range"
        );
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); the
        // mapping lives as long as `self`; shared words are only accessed
        // atomically.
        unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The connector at `offset` (from [`SegLayout::connector_offset`]).
    pub(crate) fn connector(&self, offset: usize, layout: &SegLayout) -> FifoConn<'_> {
        assert!(
            offset % fifo::LINE == 0 && offset + layout.stride() <= self.len,
            "connector out of range"
        );
        // SAFETY: the range is inside the mapping (checked above), 64-aligned,
        // zero-initialized by ftruncate, and used only through FifoConn; each
        // connector has exactly one sending and one receiving rank.
        unsafe {
            FifoConn::from_raw(
                self.ptr.as_ptr().add(offset),
                layout.slots,
                layout.slot_bytes,
            )
        }
    }

    /// The abort word: 0, or 1 + the local rank that raised it.
    pub(crate) fn abort_word(&self) -> u64 {
        self.word(ABORT_OFF).load(Ordering::Acquire)
    }

    /// Raise the abort flag on behalf of `local_rank` (first raiser wins).
    pub(crate) fn raise_abort(&self, local_rank: usize) {
        let _ = self.word(ABORT_OFF).compare_exchange(
            0,
            local_rank as u64 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Store the owner's abort reason, once. Returns whether this call wrote it.
    pub(crate) fn write_reason(&self, reason: &str) -> bool {
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
        // SAFETY: REASON_OFF + n <= CONTROL_BYTES <= len; this thread won the
        // claim above, so it is the only writer of these bytes, and readers
        // only read them after the Release store of the length below.
        unsafe {
            std::ptr::copy_nonoverlapping(reason.as_ptr(), self.ptr.as_ptr().add(REASON_OFF), n);
        }
        self.word(REASON_LEN_OFF)
            .store(n as u64 + 1, Ordering::Release);
        true
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

impl Drop for Segment {
    fn drop(&mut self) {
        if self.linked {
            let _ = unlink(&self.name);
        }
        // SAFETY: `ptr`/`len` describe a mapping created by `map` that no
        // borrowed FifoConn outlives (they borrow `self`).
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
mod tests {
    use super::*;
    use std::path::Path;

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn names_round_trip() {
        let n = segment_name(4242, 0xdead_beef_0000_0001, 3);
        assert_eq!(n, "/gpucoll.4242.deadbeef00000001.3");
        assert_eq!(
            parse_segment_name(&n[1..]),
            Some((4242, 0xdead_beef_0000_0001, 3))
        );
    }

    #[test]
    fn foreign_names_are_ignored() {
        for bad in [
            "gpucoll.0.deadbeef00000001.3",
            "gpucoll.-1.deadbeef00000001.3",
            "gpucoll.4294967295.deadbeef00000001.3",
            "gpucoll.12.deadbeef.3",
            "gpucoll.12.deadbeef00000001",
            "gpucoll.12.deadbeef00000001.3.4",
            "gpucoll.12.zzzzzzzzzzzzzzzz.3",
            "gpucoll.+12.deadbeef00000001.3",
            "nccl.12.deadbeef00000001.3",
            "sem.gpucoll.12.deadbeef00000001.3",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn liveness() {
        assert!(pid_alive(std::process::id()));
        assert!(pid_alive(1), "init exists (possibly owned by root: EPERM)");
        assert!(!pid_alive(dead_pid()));
        assert!(pid_alive(0), "invalid pids are never 'dead'");
    }

    #[test]
    fn stale_segments_are_removed_live_ones_kept() {
        let layout = SegLayout {
            slots: 8,
            slot_bytes: 256,
            channels: 1,
            local_size: 1,
        };
        let tag = 0x5eed_0000_0000_0000 | std::process::id() as u64;
        let stale_name = segment_name(dead_pid(), tag, 0);
        let live_name = segment_name(std::process::id(), tag, 1);
        let stale = Segment::create(&stale_name, &layout).unwrap();
        let mut live = Segment::create(&live_name, &layout).unwrap();
        // Simulate a crash: the stale segment's name must outlive its owner.
        let mut stale = std::mem::ManuallyDrop::new(stale);
        stale.linked = false;
        assert!(Path::new(&format!("/dev/shm{stale_name}")).exists());
        assert!(cleanup_stale() >= 1);
        assert!(!Path::new(&format!("/dev/shm{stale_name}")).exists());
        assert!(Path::new(&format!("/dev/shm{live_name}")).exists());
        live.unlink().unwrap();
        assert!(!Path::new(&format!("/dev/shm{live_name}")).exists());
        // SAFETY: unmap the leaked stale mapping (its name is already gone).
        unsafe { std::mem::ManuallyDrop::drop(&mut stale) };
    }

    #[test]
    fn peers_map_and_share_abort_state() {
        let layout = SegLayout {
            slots: 8,
            slot_bytes: 1024,
            channels: 2,
            local_size: 3,
        };
        let name = segment_name(std::process::id(), 0xabcd, 7);
        let mut own = Segment::create(&name, &layout).unwrap();
        let peer = Segment::open(&name, &layout).unwrap();
        let other = SegLayout {
            slot_bytes: 512,
            ..layout
        };
        assert!(Segment::open(&name, &other).is_err());
        own.unlink().unwrap();
        assert!(Segment::open(&name, &layout).is_err());

        // A piece sent through the peer's view arrives in the owner's view.
        let off = layout.connector_offset(1, 2);
        let tx = peer.connector(off, &layout);
        let rx = own.connector(off, &layout);
        let slot = tx.send_slot().unwrap();
        // SAFETY: the slot is owned by the sender until commit.
        unsafe { slot.write(42) };
        tx.send_commit(fifo::make_meta(3, 1));
        let (meta, p) = rx.recv_peek().unwrap().unwrap();
        assert_eq!(meta, fifo::make_meta(3, 1));
        // SAFETY: owned by the receiver until release.
        assert_eq!(unsafe { p.read() }, 42);
        rx.recv_release();

        assert_eq!(peer.abort_word(), 0);
        assert!(own.write_reason("rank 5: boom"));
        assert!(!own.write_reason("second"));
        own.raise_abort(2);
        own.raise_abort(1);
        assert_eq!(peer.abort_word(), 3);
        assert_eq!(peer.reason().as_deref(), Some("rank 5: boom"));
    }

    #[test]
    fn slot_size_scales_with_node_size() {
        assert_eq!(choose_slot_bytes(128 << 10, 8, 4, 8), 128 << 10);
        let big = choose_slot_bytes(128 << 10, 8, 4, 64);
        assert!((MIN_SLOT_BYTES..128 << 10).contains(&big));
        let l = SegLayout {
            slots: 8,
            slot_bytes: big,
            channels: 4,
            local_size: 64,
        };
        assert!(l.total() <= MAX_SEGMENT_BYTES);
        assert_eq!(choose_slot_bytes(128 << 10, 8, 4, 100_000), MIN_SLOT_BYTES);
        assert_eq!(choose_slot_bytes(1000, 8, 4, 2), 960);
    }
}
