//! Failure state: "the first error wins" for a backend or an engine, and
//! the peer abort words that carry a rank's failure to its node.
//!
//! A failed backend raises the abort word in every local peer's segment
//! and leaves its reason in its own, so the whole node fails quickly with
//! `PeerFailed` naming the first failure instead of timing out.
//!
//! A published failure carries the sequence number of the first call it
//! belongs to. A rank still finishing an earlier call, whose part the
//! failed peer completed, finishes it; only calls from that number on fail.
//!
//! Across nodes nothing is published. Ranks on another node learn of a
//! failure by their own timeout, or by a dead process on their host
//! (`liveness`).

use super::shm::Mapping;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A failure recorded once: later reasons are dropped, so every caller
/// reports the first cause.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    /// Set (Release) after `reason` is stored: a cheap check on hot paths.
    failed: AtomicBool,
    /// Set by an explicit abort, even before (or without) a reason.
    aborted: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Failure {
    /// Record `reason` unless a failure is recorded already; whether this
    /// call recorded it.
    pub(crate) fn record(&self, reason: String) -> bool {
        self.record_then(reason, |_| ())
    }

    /// [`record`](Self::record), running `first` with the reason (under the
    /// lock, before the failure becomes visible) when this call records it.
    pub(crate) fn record_then(&self, reason: String, first: impl FnOnce(&str)) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_some() {
            return false;
        }
        first(&reason);
        *r = Some(reason);
        self.failed.store(true, Ordering::Release);
        true
    }

    /// Mark aborted on purpose (the reason is recorded separately).
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }

    pub(crate) fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Whether a failure was recorded or an abort requested.
    pub(crate) fn is_set(&self) -> bool {
        self.failed.load(Ordering::Acquire) || self.aborted()
    }

    /// The recorded reason, if any.
    pub(crate) fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The error every new operation gets once this failed:
    /// `CommunicatorFailed` with the first reason.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.is_set() {
            return None;
        }
        let reason = self.reason().unwrap_or_else(|| "aborted".into());
        Some(Error::CommunicatorFailed(reason))
    }

    /// `Err` of [`error`](Self::error), `Ok` while nothing failed.
    pub(crate) fn check(&self) -> Result<()> {
        self.error().map_or(Ok(()), Err)
    }
}

/// The segments of one node's ranks (by local rank), whose control blocks
/// carry the abort words.
pub(crate) struct NodeSegments<'a, S: AsRef<Mapping>> {
    pub segs: &'a [S],
    /// Our local rank (index of our own segment).
    pub local_rank: usize,
    /// Our communicator rank (named in the published reason).
    pub rank: usize,
}

impl<S: AsRef<Mapping>> NodeSegments<'_, S> {
    /// Record `reason` in `failure` and, if it is the first, publish it:
    /// our reason in our own segment, our abort word in every local
    /// segment. Whether this call recorded the failure.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn fail(&self, failure: &Failure, reason: String) -> bool {
        self.fail_at(failure, reason, None)
    }

    /// [`fail`](Self::fail) for a failure that belongs to the calls from
    /// sequence number `failed_at` on (None: to every call). Peers still
    /// finishing an earlier call finish it: we completed our part of it.
    pub(crate) fn fail_at(
        &self,
        failure: &Failure,
        reason: String,
        failed_at: Option<u64>,
    ) -> bool {
        failure.record_then(reason, |r| self.publish_at(r, failed_at))
    }

    /// Publish a failure of every call to the node (without recording it
    /// anywhere).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn publish(&self, reason: &str) {
        self.publish_at(reason, None)
    }

    fn publish_at(&self, reason: &str, failed_at: Option<u64>) {
        if let Some(own) = self.segs.get(self.local_rank) {
            own.as_ref()
                .write_reason(&format!("rank {}: {reason}", self.rank), failed_at);
        }
        for s in self.segs {
            s.as_ref().raise_abort(self.local_rank);
        }
    }

    /// The local rank (other than us) that raised an abort word of the
    /// node, if any. Every segment is checked, not only ours, which covers
    /// a peer that died halfway through raising them.
    pub(crate) fn raiser(&self) -> Option<usize> {
        self.segs
            .iter()
            .filter_map(|s| s.as_ref().abort_raiser())
            .find(|&w| w != self.local_rank)
    }

    /// The reason local rank `who` published (it names its global rank).
    pub(crate) fn reason_of(&self, who: usize) -> String {
        self.segs
            .get(who)
            .and_then(|s| s.as_ref().reason())
            .unwrap_or_else(|| format!("local rank {who} raised the abort flag without a reason"))
    }

    /// `PeerFailed` with the reason of a local peer that failed, if one did.
    pub(crate) fn peer_error(&self) -> Option<Error> {
        self.raiser()
            .map(|who| Error::PeerFailed(self.reason_of(who)))
    }

    /// [`peer_error`](Self::peer_error) for work whose calls end at
    /// sequence number `last`: a peer's failure that belongs to later calls
    /// only does not fail it (that peer finished its part of ours).
    pub(crate) fn peer_error_upto(&self, last: u64) -> Option<Error> {
        let raisers: Vec<usize> = self
            .segs
            .iter()
            .filter_map(|s| s.as_ref().abort_raiser())
            .collect();
        if raisers.is_empty() {
            return None;
        }
        (0..self.segs.len())
            .filter(|&l| l != self.local_rank)
            .filter(|&l| raisers.contains(&l) || self.segs[l].as_ref().has_reason())
            .find(|&l| {
                self.segs[l]
                    .as_ref()
                    .failed_at()
                    .map_or(true, |at| at <= last)
            })
            .map(|l| Error::PeerFailed(self.reason_of(l)))
    }

    /// Why no new work may start, if so: `pending` (a failure found
    /// elsewhere, e.g. a transport thread's) is recorded first; a recorded
    /// failure or abort gives `CommunicatorFailed`; a local peer's raised
    /// abort word gives `PeerFailed` and fails us too, so that no launch
    /// completes from what the failed peer had pushed before it gave up.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn start_error(&self, failure: &Failure, pending: Option<Error>) -> Option<Error> {
        if let Some(e) = pending {
            self.fail(failure, e.to_string());
        }
        if let Some(e) = failure.error() {
            return Some(e);
        }
        let reason = self.reason_of(self.raiser()?);
        self.fail(failure, format!("peer failed: {reason}"));
        Some(Error::PeerFailed(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::super::shm::{segment_name, Mapping, SegOwner, CONTROL_BYTES};
    use super::*;

    /// Three unlinked control blocks of one test node (`tag_hi` keeps the
    /// tests' names apart).
    fn segments(owner: SegOwner, tag_hi: u64) -> Vec<Mapping> {
        let tag = u128::from(tag_hi | std::process::id() as u64);
        (0..3)
            .map(|l| {
                let name = segment_name(owner, std::process::id(), tag, l);
                let mut m = Mapping::create(&name, CONTROL_BYTES).unwrap();
                m.unlink().unwrap();
                m
            })
            .collect()
    }

    #[test]
    fn first_failure_wins() {
        let f = Failure::default();
        assert!(f.error().is_none() && f.check().is_ok());
        assert!(f.record("first".into()));
        assert!(!f.record("second".into()));
        assert_eq!(f.reason().as_deref(), Some("first"));
        assert!(matches!(f.error(), Some(Error::CommunicatorFailed(r)) if r == "first"));
        let a = Failure::default();
        a.abort();
        assert!(matches!(a.check(), Err(Error::CommunicatorFailed(r)) if r == "aborted"));
    }

    #[test]
    fn a_failure_reaches_the_node() {
        let segs = segments(SegOwner::Host, 0xfa11_0000_0000_0000);
        let node = |local_rank| NodeSegments {
            segs: &segs,
            local_rank,
            rank: 10 + local_rank,
        };
        assert!(node(0).peer_error().is_none());
        let failure = Failure::default();
        assert!(node(1).fail(&failure, "boom".into()));
        assert!(!node(1).fail(&failure, "later".into()));
        assert!(node(1).peer_error().is_none(), "our own raise is no peer's");
        for l in [0, 2] {
            assert!(
                matches!(node(l).peer_error(), Some(Error::PeerFailed(r)) if r == "rank 11: boom")
            );
        }
    }

    #[test]
    fn a_failure_of_later_calls_lets_earlier_ones_finish() {
        let segs = segments(SegOwner::Host, 0xfa13_0000_0000_0000);
        let node = |local_rank| NodeSegments {
            segs: &segs,
            local_rank,
            rank: local_rank,
        };
        assert!(node(0).peer_error_upto(9).is_none());
        assert!(node(1).fail_at(&Failure::default(), "mismatch".into(), Some(5)));
        // Work ending before call #5 goes on; work reaching it fails.
        assert!(node(0).peer_error_upto(4).is_none());
        for last in [5, 6, u64::MAX] {
            assert!(
                matches!(node(0).peer_error_upto(last), Some(Error::PeerFailed(r)) if r == "rank 1: mismatch")
            );
        }
        // A failure tied to no call (an abort, a dead transport) fails
        // everything, even behind a raise that is tied to one.
        assert!(node(2).fail(&Failure::default(), "abort".into()));
        assert!(
            matches!(node(0).peer_error_upto(0), Some(Error::PeerFailed(r)) if r == "rank 2: abort")
        );
        assert!(node(1).peer_error_upto(0).is_some());
        assert!(
            node(2).peer_error_upto(4).is_none(),
            "our own failure is no peer's"
        );
    }

    #[test]
    fn new_work_stops_at_the_first_failure_of_the_node() {
        let segs = segments(SegOwner::Cuda, 0xfa12_0000_0000_0000);
        let node = |local_rank| NodeSegments {
            segs: &segs,
            local_rank,
            rank: local_rank,
        };
        let (me, peer, other) = (Failure::default(), Failure::default(), Failure::default());
        assert!(node(0).start_error(&me, None).is_none());
        // A transport failure is recorded before anything else.
        let e = node(2).start_error(&other, Some(Error::PeerFailed("link down".into())));
        assert!(matches!(e, Some(Error::CommunicatorFailed(r)) if r.contains("link down")));
        assert!(node(1).fail(&peer, "kernel error".into()));
        // Rank 2's raise came first and is what local rank 0 sees.
        let e = node(0).start_error(&me, None);
        assert!(
            matches!(&e, Some(Error::PeerFailed(r)) if r.contains("link down")),
            "{e:?}"
        );
        assert!(
            matches!(me.error(), Some(Error::CommunicatorFailed(r)) if r.starts_with("peer failed: "))
        );
        let aborted = Failure::default();
        aborted.abort();
        assert!(matches!(
            node(1).start_error(&aborted, None),
            Some(Error::CommunicatorFailed(r)) if r == "aborted"
        ));
    }
}
