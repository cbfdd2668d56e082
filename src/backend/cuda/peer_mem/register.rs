//! Buffer registration (`Communicator::register`): a copy-engine call
//! without copies. Every rank posts its buffer's allocation on the board,
//! as a receive buffer would be posted, and opens every peer's; those
//! mappings then stay open, outside the registry's limits, until the rank
//! drops the registration. A later call pushing into a registered buffer
//! finds its mapping open and pays no `cuIpcOpenMemHandle`, however many
//! other buffers came and went in between.
//!
//! Being a copy-engine call, it is collective and ordered with the
//! copy-engine collectives: every rank registers at the same point of its
//! sequence of calls (a rank that calls another collective there ends in
//! `ProtocolMismatch` or `Timeout`, as any mismatched call does). Dropping
//! a registration is local: it closes what this rank opened, and a
//! peer's memory is released once every rank dropped its own.
//!
//! A VMM allocation (`cuMemCreate`, exportable as a POSIX descriptor) not
//! shared yet is shared by its registration, with one more round of posts
//! (`vmm.rs`); peers keep it mapped until no registration of its owner
//! holds it.

use super::super::driver;
use super::super::state::CudaShared;
use super::board::{self, Post};
use super::vmm::{fresh_offers, Fresh};
use crate::backend::Registered;
use crate::buffer::{MemoryKind, RawBuffer};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// The digest a registration posts (no collective hashes to it: theirs
/// start from the FNV offset basis).
pub(crate) const DIGEST: u64 = 0x5245_4749_5354_4552;

impl CudaShared {
    /// Register `buf` with every peer (collective; `seq`: the engine's
    /// next sequence number, not consumed). A buffer this rank cannot
    /// register (not device memory of this GPU) still takes part, posting
    /// nothing, so the peers are not left waiting; this rank then gets
    /// the error.
    pub(in crate::backend::cuda) fn ce_register(
        &self,
        seq: u64,
        buf: &RawBuffer,
    ) -> Result<Registered> {
        let (n, me) = (self.nranks, self.rank);
        if self.segs.len() != n || n > board::MAX_RANKS {
            return Err(Error::Backend(format!(
                "buffer registration on {n} ranks with {} local segments",
                self.segs.len()
            )));
        }
        let refused = match buf.memory {
            MemoryKind::Device { ordinal } if ordinal == self.ctx.ordinal => None,
            MemoryKind::Device { ordinal } => Some(format!(
                "cannot register memory of GPU {ordinal} with a communicator on GPU {}",
                self.ctx.ordinal
            )),
            MemoryKind::Host => Some(format!(
                "cannot register host memory ({} bytes at {:#x}): only device memory of \
                 GPU {} can be registered",
                buf.bytes(),
                buf.addr,
                self.ctx.ordinal
            )),
        };
        let mut st = self.ce.state.lock().unwrap_or_else(|p| p.into_inner());
        st.registry.begin_call()?;
        let number = st.calls;
        st.calls += 1;
        let mut target = None;
        let mut fresh = None;
        // Descriptor links (set up at bring-up, the same on every rank).
        let socket = self.fd_mesh().is_some();
        if refused.is_none() && buf.bytes() > 0 {
            if let Some(a) = driver::allocation_of(buf.addr)? {
                let bytes = buf.bytes();
                target = st.registry.share(&a, buf.addr, bytes);
                let fits = buf.addr.saturating_add(bytes) <= a.base.saturating_add(a.bytes);
                if target.is_none() && fits && socket {
                    if let Some((slot, fd)) = st.registry.vmm_offer(&a)? {
                        let f = Fresh { slot, alloc: a, fd };
                        target = Some(f.target(buf.addr));
                        fresh = Some(f);
                    }
                }
            }
        }
        let post = Post {
            number,
            seq,
            digest: DIGEST,
            target,
            source: None,
            note: 0,
            offer: None,
        };
        board::publish(self.own().as_ref(), &post);
        // A rendezvous that fails leaves the peers' calls out of step:
        // like a copy-engine collective's, it fails the node.
        let mut posts = self.await_posts(&post).inspect_err(|e| {
            self.mark_failed(e.to_string());
        })?;
        let offers = fresh_offers(&posts, me, |q| q.target);
        if fresh.is_some() || !offers.is_empty() {
            let failed = self
                .vmm_exchange(&mut st, seq, number, &offers, fresh.as_ref(), true)
                .inspect_err(|e| {
                    self.mark_failed(e.to_string());
                })?;
            // Offers that failed anywhere are dropped by every rank alike.
            for (p, q) in posts.iter_mut().enumerate() {
                if failed & 1 << p != 0 {
                    if let Some(q) = q {
                        q.target = None;
                    }
                }
            }
            if failed & 1 << me != 0 {
                target = None;
            }
        }
        // Every rank got here for this registration (the rendezvous
        // matched it): from now on each considers the peer kernels for
        // registered buffers (`peer.rs`), alike.
        self.ce.registered_ever.store(true, Ordering::Release);
        if let Some(reason) = refused {
            return Err(Error::WrongMemory(reason));
        }
        let opened = posts
            .iter()
            .enumerate()
            .filter(|(p, _)| *p != me)
            .filter_map(|(p, q)| q.and_then(|q| q.target).map(|t| (p, t)))
            .try_for_each(|(p, t)| st.registry.open_registered(number, p, &t));
        if let Err(e) = opened {
            st.registry.deregister(number);
            return Err(e);
        }
        if let Some(t) = &target {
            st.registry.register_own(number, t.buffer_id);
        }
        // Mappings registrations left behind age out here too, once the
        // work queued so far (on any stream: `before` joins the last one
        // into ours) is done.
        let own = self.stream.raw();
        self.resident_quit();
        self.order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .before(own, own)?;
        self.ce_evict(&mut st, own, false)?;
        tracing::info!(
            rank = me,
            id = number,
            bytes = buf.bytes(),
            direct = target.is_some(),
            live = st.registry.registrations(),
            "buffer registered"
        );
        // The id is the call number; `direct` is false for memory the
        // driver cannot export (a small allocation packed into a shared
        // block, a pool or VMM allocation): received through a bounce
        // buffer as before.
        Ok(Registered {
            id: number,
            direct: target.is_some(),
        })
    }

    /// End registration `id` on this rank (local).
    pub(in crate::backend::cuda) fn ce_deregister(&self, id: u64) {
        let mut st = self.ce.state.lock().unwrap_or_else(|p| p.into_inner());
        let unshared = st.registry.deregister(id);
        self.vmm_unshare(unshared);
        tracing::debug!(rank = self.rank, id, "buffer deregistered");
    }
}
