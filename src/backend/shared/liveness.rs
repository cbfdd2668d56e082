//! Dead local peers: a process that dies (abort, kill -9, a segfault)
//! cannot raise its abort word, so without this the survivors of a node
//! would wait for `GPUCOLL_TIMEOUT` (300 s by default). Waiting loops of
//! both backends ask [`PeerLiveness::dead`], which looks at the processes of
//! the node's other ranks at most every [`CHECK_EVERY`], and fail the
//! communicator (publishing to the node) with `PeerFailed` naming the rank.

use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the peers' processes are looked at (a `kill(pid, 0)` and, for
/// a process that still exists, its state in /proc: a few microseconds).
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The processes of the node's other ranks.
pub(crate) struct PeerLiveness {
    /// (communicator rank, pid) of every other rank on this node.
    peers: Vec<(usize, u32)>,
    start: Instant,
    /// Nanoseconds after `start` of the last look (0: never).
    last: AtomicU64,
}

impl PeerLiveness {
    /// `peers`: (communicator rank, pid) of the other ranks of the node.
    pub(crate) fn new(peers: Vec<(usize, u32)>) -> PeerLiveness {
        PeerLiveness {
            peers,
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// `PeerFailed` naming a local peer whose process is gone; looks at most
    /// every [`CHECK_EVERY`] (one caller at a time; the others get None).
    pub(crate) fn dead(&self) -> Option<Error> {
        if self.peers.is_empty() {
            return None;
        }
        let now = self.start.elapsed().as_nanos() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < CHECK_EVERY.as_nanos() as u64 {
            return None;
        }
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        // Every dead peer is named: when a survivor that saw the first
        // death has exited too by the time we look, the first stays named.
        let dead: Vec<String> = self
            .peers
            .iter()
            .filter(|&&(_, pid)| !process_running(pid))
            .map(|&(rank, pid)| format!("rank {rank} (pid {pid}, on this host)"))
            .collect();
        match dead.len() {
            0 => None,
            1 => Some(Error::PeerFailed(format!(
                "{} died: its process is gone",
                dead[0]
            ))),
            _ => Some(Error::PeerFailed(format!(
                "{} died: their processes are gone",
                dead.join(" and ")
            ))),
        }
    }
}

/// Whether process `pid` exists and is not a zombie (a dead child its
/// parent has not reaped yet still answers `kill(pid, 0)`).
pub(crate) fn process_running(pid: u32) -> bool {
    if !super::shm::pid_alive(pid) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .map_or(true, |state| state != "Z" && state != "X"),
        // No /proc (or not readable): trust kill(2).
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_peer_is_named_a_live_one_is_not() {
        // A child that exits at once: a zombie until reaped, then gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let me = std::process::id();
        let w = PeerLiveness::new(vec![(1, me), (2, pid)]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = None;
        while seen.is_none() && Instant::now() < deadline {
            seen = w.dead();
            std::thread::sleep(Duration::from_millis(20));
        }
        match seen {
            Some(Error::PeerFailed(r)) => {
                assert!(r.contains("rank 2") && r.contains(&pid.to_string()), "{r}")
            }
            other => panic!("expected PeerFailed for rank 2, got {other:?}"),
        }
        child.wait().unwrap();
        assert!(!process_running(pid));
        assert!(process_running(me));
        // Several dead peers are all named.
        let mut a = std::process::Command::new("true").spawn().unwrap();
        let mut b = std::process::Command::new("true").spawn().unwrap();
        let (pa, pb) = (a.id(), b.id());
        a.wait().unwrap();
        b.wait().unwrap();
        let both = PeerLiveness::new(vec![(3, pa), (0, me), (5, pb)]);
        match both.dead() {
            Some(Error::PeerFailed(r)) => assert!(
                r.contains("rank 3") && r.contains("rank 5") && !r.contains("rank 0"),
                "{r}"
            ),
            other => panic!("expected PeerFailed naming ranks 3 and 5, got {other:?}"),
        }
        let alive = PeerLiveness::new(vec![(0, me)]);
        assert!(alive.dead().is_none());
        // Rate limited: a second look right after the first returns None.
        assert!(w.dead().is_none());
    }
}
