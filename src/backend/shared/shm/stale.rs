//! Removal of the segments that jobs which died during setup left in
//! `/dev/shm` (after setup every name is unlinked at once).
//!
//! `/dev/shm` is shared by every user and, through `--ipc=host` or a
//! pod's memory volume, by containers whose PID namespaces differ, so a
//! name alone proves nothing: its pid may be another namespace's, or
//! reused. A segment is removed only when all of these hold:
//!
//! * it is a regular file of our effective uid (as root, other users'
//!   files are never touched, though the sticky bit would let us);
//! * its creator header ([`super::creator`]) is gpucoll's and names the
//!   pid in the file name;
//! * its creator lived in our PID namespace (the header's namespace inode
//!   is ours), so that pid means the same process here;
//! * that process is gone: no such pid, a zombie, or a pid whose start
//!   time is not the recorded one (reused by another process).
//!
//! Segments without a header (older builds, or a creator that died
//! between `shm_open` and writing it) are left alone: nothing proves their
//! creator dead.

use super::creator::{self, Creator, HEADER_BYTES};
use super::{c_name, unlink, SHM_DIR};
use crate::backend::shared::process;

/// Why a gpucoll segment name is kept, or that it may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its creator is dead in our namespace: remove it.
    Stale,
    NotOurs,
    NoHeader,
    OtherNamespace,
    Alive,
}

/// Unlink the gpucoll segments in `/dev/shm` whose creator is dead (left
/// by a job that crashed during setup), of both backends. Returns how many
/// were removed.
pub(crate) fn cleanup_stale() -> usize {
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let (uid, pidns) = (process::euid(), process::pid_namespace());
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((pid, _, _)) = super::parse_segment_name(name) else {
            continue;
        };
        let path = format!("/{name}");
        let verdict = match read_creator(&path, uid) {
            Ok(c) => judge(pid, &c, uid, pidns),
            Err(v) => v,
        };
        if verdict != Verdict::Stale {
            tracing::trace!(segment = name, ?verdict, "gpucoll segment kept");
            continue;
        }
        if unlink(&path).is_ok() {
            tracing::debug!("removed stale shared memory segment {name}");
            removed += 1;
        }
    }
    removed
}

/// Whether a segment named for `pid`, of creator `c`, may go, seen by a
/// process of uid `uid` in PID namespace `pidns`.
pub(crate) fn judge(pid: u32, c: &Creator, uid: u32, pidns: u64) -> Verdict {
    if c.uid != uid {
        return Verdict::NotOurs;
    }
    if c.pid != pid {
        // A header that contradicts its name is not one we wrote.
        return Verdict::NoHeader;
    }
    if c.pidns == 0 || c.pidns != pidns {
        return Verdict::OtherNamespace;
    }
    if process::same_process_running(c.pid, c.start) {
        Verdict::Alive
    } else {
        Verdict::Stale
    }
}

/// The creator header of segment `path`, read without mapping it; only
/// for a regular file of uid `uid` (the verdict otherwise).
fn read_creator(path: &str, uid: u32) -> Result<Creator, Verdict> {
    let c = c_name(path).map_err(|_| Verdict::NoHeader)?;
    // SAFETY: valid C string. Read-only: nothing is written to a file that
    // may not be ours (glibc adds O_NOFOLLOW and O_CLOEXEC).
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK, 0) };
    if fd < 0 {
        // Another user's 0600 file, or gone meanwhile.
        return Err(Verdict::NotOurs);
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: an all-zero `stat` is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is valid while `fd` lives; `st` is writable.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(Verdict::NoHeader);
    }
    if st.st_uid != uid {
        return Err(Verdict::NotOurs);
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < HEADER_BYTES as u64 {
        return Err(Verdict::NoHeader);
    }
    let mut head = [0u8; HEADER_BYTES];
    // SAFETY: reads at most HEADER_BYTES into `head`.
    let n = unsafe { libc::pread(raw, head.as_mut_ptr() as *mut libc::c_void, head.len(), 0) };
    if n != HEADER_BYTES as isize {
        return Err(Verdict::NoHeader);
    }
    creator::parse(&head).map_err(|_| Verdict::NoHeader)
}
