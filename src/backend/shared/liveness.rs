//! Dead local peers: a process that dies (abort, kill -9, a segfault)
//! cannot raise its abort word, so without this the survivors of a node
//! would wait for `GPUCOLL_TIMEOUT` (300 s by default). Waiting loops of
//! both backends ask [`PeerLiveness::dead`], which looks at the processes of
//! the node's other ranks at most every [`CHECK_EVERY`], and fail the
//! communicator (publishing to the node) with `PeerFailed` naming the rank.
//!
//! A pid alone would miss a death whose pid was reused at once: each peer
//! is known by its pid and its start time too ([`super::process`]), and a
//! process of that pid with another start time means the peer is gone.

use super::process;
use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the peers' processes are looked at (a `kill(pid, 0)` and, for
/// a process that still exists, its state and start time in /proc: a few
/// microseconds).
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// A local peer as setup saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Its rank in the communicator.
    pub rank: usize,
    pub pid: u32,
    /// Its start time as it reported it (0: unknown).
    pub start: u64,
}

/// The processes of the node's other ranks.
pub(crate) struct PeerLiveness {
    /// (communicator rank, pid, start time: 0 when unknown) of every other
    /// rank on this node that can be watched.
    peers: Vec<(usize, u32, u64)>,
    start: Instant,
    /// Nanoseconds after `start` of the last look (0: never).
    last: AtomicU64,
}

impl PeerLiveness {
    /// `peers`: the other ranks of the node, with the pid and start time
    /// each reported (setup's exchange). A peer whose start time as seen
    /// here differs from its own report is not watched: its pid names
    /// another process here (another PID namespace, or another time
    /// namespace), and a death could not be told from a live stranger;
    /// failures then end in `GPUCOLL_TIMEOUT`, as without this check.
    pub(crate) fn new(peers: Vec<Peer>) -> PeerLiveness {
        let peers = peers
            .into_iter()
            .filter_map(|p| match process::start_time(p.pid) {
                Some(seen) if p.start != 0 && seen != p.start => {
                    tracing::debug!(
                        rank = p.rank,
                        pid = p.pid,
                        reported = p.start,
                        seen,
                        "local peer's pid names another process here: not watched"
                    );
                    None
                }
                // Unreadable /proc here: the pid alone.
                None => Some((p.rank, p.pid, 0)),
                Some(_) => Some((p.rank, p.pid, p.start)),
            })
            .collect();
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
            .filter(|&&(_, pid, start)| !process::same_process_running(pid, start))
            .map(|&(rank, pid, _)| format!("rank {rank} (pid {pid}, on this host)"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::shared::process::{own_start_time, process_running};

    fn peer(rank: usize, pid: u32) -> Peer {
        Peer {
            rank,
            pid,
            start: 0,
        }
    }

    #[test]
    fn a_dead_peer_is_named_a_live_one_is_not() {
        // A child that exits at once: a zombie until reaped, then gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let me = std::process::id();
        let w = PeerLiveness::new(vec![peer(1, me), peer(2, pid)]);
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
        let both = PeerLiveness::new(vec![peer(3, pa), peer(0, me), peer(5, pb)]);
        match both.dead() {
            Some(Error::PeerFailed(r)) => assert!(
                r.contains("rank 3") && r.contains("rank 5") && !r.contains("rank 0"),
                "{r}"
            ),
            other => panic!("expected PeerFailed naming ranks 3 and 5, got {other:?}"),
        }
        let alive = PeerLiveness::new(vec![peer(0, me)]);
        assert!(alive.dead().is_none());
        // Rate limited: a second look right after the first returns None.
        assert!(w.dead().is_none());
    }

    /// A peer whose pid now names a process that started at another time
    /// (the pid was reused after the peer died) is dead; one reporting its
    /// true start time is alive; one whose report this process cannot
    /// confirm (another PID namespace) is not watched at all.
    #[test]
    fn a_reused_pid_is_a_dead_peer() {
        let me = std::process::id();
        let start = own_start_time();
        assert!(start > 0);
        let same = PeerLiveness::new(vec![Peer {
            rank: 1,
            pid: me,
            start,
        }]);
        assert!(same.dead().is_none());
        // Setup saw the true start time; a later look sees another one.
        let w = PeerLiveness {
            peers: vec![(4, me, start + 17)],
            start: Instant::now(),
            last: AtomicU64::new(0),
        };
        match w.dead() {
            Some(Error::PeerFailed(r)) => assert!(r.contains("rank 4"), "{r}"),
            other => panic!("expected PeerFailed for the reused pid, got {other:?}"),
        }
        // A report this process cannot confirm: not watched (no false death).
        let foreign = PeerLiveness::new(vec![Peer {
            rank: 2,
            pid: me,
            start: start + 1,
        }]);
        assert!(foreign.peers.is_empty());
        assert!(foreign.dead().is_none());
    }
}
