//! Failure and abort of one backend: the first reason wins, is published in
//! our control segment and raises the abort word of every local rank, so
//! their kernels leave and their next calls fail with `PeerFailed`. To be
//! replaced by the shared failure type of both backends.

use super::shm::Segment;
use crate::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(super) struct Failure {
    rank: usize,
    local_rank: usize,
    /// Control segments of every local rank (ours at `local_rank`).
    segs: Vec<Arc<Segment>>,
    /// `Communicator::abort` was called.
    aborted: AtomicBool,
    /// Set once `failed` holds a reason (read without the lock).
    failed_flag: AtomicBool,
    failed: Mutex<Option<String>>,
}

impl Failure {
    pub(super) fn new(rank: usize, local_rank: usize, segs: Vec<Arc<Segment>>) -> Failure {
        Failure {
            rank,
            local_rank,
            segs,
            aborted: AtomicBool::new(false),
            failed_flag: AtomicBool::new(false),
            failed: Mutex::new(None),
        }
    }

    /// Our own control segment.
    pub(super) fn own(&self) -> &Segment {
        &self.segs[self.local_rank]
    }

    pub(super) fn set_aborted(&self) {
        self.aborted.store(true, Ordering::Release);
    }

    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Why no new work may start, if so. `net_error`: the NET proxy's
    /// failure, recorded first.
    pub(super) fn state_error(&self, net_error: Option<Error>) -> Option<Error> {
        if let Some(e) = net_error {
            self.mark_failed(e.to_string());
        }
        if !self.failed_flag.load(Ordering::Acquire) && !self.aborted.load(Ordering::Acquire) {
            // A local peer that failed raised our abort word: fail before
            // launching, or a kernel could complete from what the failed
            // peer had already pushed before it gave up.
            let w = self.peer_raiser()?;
            let reason = self.peer_reason(w);
            self.mark_failed(format!("peer failed: {reason}"));
            return Some(Error::PeerFailed(reason));
        }
        let reason = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "aborted".into());
        Some(Error::CommunicatorFailed(reason))
    }

    /// Mark failed (first reason wins) and raise every local abort word.
    pub(super) fn mark_failed(&self, reason: String) -> bool {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some() {
            return false;
        }
        self.own()
            .write_reason(&format!("rank {}: {reason}", self.rank));
        for s in &self.segs {
            s.raise_abort(self.local_rank);
        }
        *f = Some(reason);
        self.failed_flag.store(true, Ordering::Release);
        true
    }

    /// The local rank (other than us) that raised our abort word, if any.
    pub(super) fn peer_raiser(&self) -> Option<usize> {
        let w = self.own().abort_word() & 0xffff_ffff;
        (w != 0 && w - 1 != self.local_rank as u64).then(|| (w - 1) as usize)
    }

    pub(super) fn peer_reason(&self, who: usize) -> String {
        self.segs
            .get(who)
            .and_then(|s| s.reason())
            .unwrap_or_else(|| format!("local rank {who} raised the abort flag without a reason"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::shm::CONTROL_BYTES;

    /// Three local ranks' segments as rank `me` maps them.
    fn node(tag: &str) -> Vec<Arc<Segment>> {
        (0..3)
            .map(|l| {
                let name = format!("/gpucoll-failtest-{}-{tag}-{l}", std::process::id());
                let mut s = Segment::create(&name, CONTROL_BYTES).unwrap();
                s.unlink();
                Arc::new(s)
            })
            .collect()
    }

    #[test]
    fn first_failure_wins_and_raises_every_abort_word() {
        let segs = node("first");
        let f = Failure::new(5, 1, segs.clone());
        assert!(f.state_error(None).is_none());
        assert!(f.mark_failed("out of luck".into()));
        assert!(!f.mark_failed("second".into()), "first reason wins");
        for s in &segs {
            assert_eq!(s.abort_word() & 0xffff_ffff, 2, "raised by local rank 1");
        }
        assert_eq!(segs[1].reason().as_deref(), Some("rank 5: out of luck"));
        // Our own raise is not a peer's.
        assert_eq!(f.peer_raiser(), None);
        assert!(matches!(
            f.state_error(None),
            Some(Error::CommunicatorFailed(r)) if r == "out of luck"
        ));
    }

    #[test]
    fn a_peer_that_raised_our_word_fails_us_with_its_reason() {
        let segs = node("peer");
        let me = Failure::new(0, 0, segs.clone());
        let peer = Failure::new(2, 2, segs.clone());
        peer.mark_failed("kernel error".into());
        assert_eq!(me.peer_raiser(), Some(2));
        assert!(matches!(
            me.state_error(None),
            Some(Error::PeerFailed(r)) if r == "rank 2: kernel error"
        ));
        // The NET proxy's error is recorded before anything else.
        let other = Failure::new(1, 1, node("net"));
        let e = other.state_error(Some(Error::PeerFailed("link down".into())));
        assert!(matches!(e, Some(Error::CommunicatorFailed(r)) if r.contains("link down")));
    }

    #[test]
    fn abort_without_reason_reads_as_aborted() {
        let f = Failure::new(0, 0, node("abort"));
        f.set_aborted();
        assert!(f.is_aborted());
        assert!(matches!(
            f.state_error(None),
            Some(Error::CommunicatorFailed(r)) if r == "aborted"
        ));
    }
}
