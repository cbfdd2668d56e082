//! Who a process is, beyond its pid: pids are reused, and a pid seen in
//! another PID namespace names another process (or none). A process is
//! identified by its pid, its start time (field 22 of `/proc/<pid>/stat`,
//! clock ticks since boot: a reused pid gets a later one) and the PID
//! namespace it was seen in. Also the random nonces that name a job's
//! segments and sockets, which nobody outside the job may predict.

use crate::error::{Error, Result};
use std::os::unix::fs::MetadataExt;

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

/// Whether process `pid` exists and is not a zombie (a dead child its
/// parent has not reaped yet still answers `kill(pid, 0)`).
pub(crate) fn process_running(pid: u32) -> bool {
    if !pid_alive(pid) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_fields(&stat)
            .and_then(|mut f| f.next())
            .map_or(true, |state| state != "Z" && state != "X"),
        // No /proc (or not readable): trust kill(2).
        Err(_) => true,
    }
}

/// The fields of a `/proc/<pid>/stat` line from the third (the state) on:
/// the command name before them is in parentheses and may itself hold
/// spaces and parentheses, so the split starts after the last `)`.
fn stat_fields(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    let close = stat.rfind(')')?;
    Some(stat[close + 1..].split_whitespace())
}

/// The start time (field 22) in a `/proc/<pid>/stat` line.
pub(crate) fn parse_start_time(stat: &str) -> Option<u64> {
    // Field 3 is the first after the command name: field 22 is the 20th.
    stat_fields(stat)?.nth(19)?.parse().ok()
}

/// The start time of process `pid` as this process sees it (None: no such
/// process, or /proc not readable).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    if pid == 0 || pid > i32::MAX as u32 {
        return None;
    }
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// This process's start time (0 when /proc cannot tell).
pub(crate) fn own_start_time() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_start_time(&s))
        .unwrap_or(0)
}

/// The inode of this process's PID namespace (0 when unknown). Pids
/// compare only between processes of one namespace.
pub(crate) fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The effective uid.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and takes no pointers.
    unsafe { libc::geteuid() }
}

/// Whether process `pid`, started at `start` (0: unknown), still runs
/// here: a pid whose start time differs was reused by another process.
pub(crate) fn same_process_running(pid: u32, start: u64) -> bool {
    if !process_running(pid) {
        return false;
    }
    match (start, start_time(pid)) {
        (0, _) | (_, None) => true,
        (want, Some(now)) => want == now,
    }
}

/// 128 random bits from the kernel (`getrandom`, else `/dev/urandom`).
pub(crate) fn random_nonce() -> Result<u128> {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most `len - got` bytes into `b[got..]`.
        let r = unsafe {
            libc::getrandom(b[got..].as_mut_ptr() as *mut libc::c_void, b.len() - got, 0)
        };
        if r > 0 {
            got += r as usize;
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        // Kernels before 3.17: the device file gives the same bits.
        use std::io::Read;
        let mut f = std::fs::File::open("/dev/urandom").map_err(|e2| Error::System {
            call: "getrandom",
            message: format!("{e}; /dev/urandom: {e2}"),
        })?;
        f.read_exact(&mut b).map_err(|e2| Error::System {
            call: "getrandom",
            message: format!("{e}; /dev/urandom: {e2}"),
        })?;
        break;
    }
    Ok(u128::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_parse_past_odd_command_names() {
        let line = |comm: &str| {
            let mut f = vec!["S".to_string()];
            f.extend((4..=52).map(|i| i.to_string()));
            format!("4242 ({comm}) {}\n", f.join(" "))
        };
        for comm in ["sleep", "a b", "x) (y", ")", "((", ""] {
            assert_eq!(parse_start_time(&line(comm)), Some(22), "{comm:?}");
        }
        assert_eq!(parse_start_time("4242 (x) S 1 2"), None);
        assert_eq!(parse_start_time("no parenthesis at all"), None);
        assert_eq!(parse_start_time(""), None);
        let mut bad = line("x");
        bad = bad.replace(" 22 ", " 2x2 ");
        assert_eq!(parse_start_time(&bad), None);
    }

    #[test]
    fn this_process_is_identified() {
        let me = std::process::id();
        let start = own_start_time();
        assert!(start > 0, "/proc/self/stat gives a start time");
        assert_eq!(start_time(me), Some(start));
        assert!(same_process_running(me, start));
        assert!(
            !same_process_running(me, start + 1),
            "another start: reused"
        );
        assert!(same_process_running(me, 0), "unknown start: pid only");
        assert!(pid_namespace() != 0);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!process_running(pid));
        assert!(!same_process_running(pid, 0));
        assert_eq!(start_time(0), None);
        assert!(pid_alive(0), "invalid pids are never 'dead'");
    }

    #[test]
    fn nonces_differ() {
        let a = random_nonce().unwrap();
        let b = random_nonce().unwrap();
        assert_ne!(a, b);
        assert_ne!(a, 0);
    }
}
