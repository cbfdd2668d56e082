//! VMM allocations (`cuMemCreate` + `cuMemMap`) as peers' targets.
//! Legacy IPC refuses them; their physical allocation is exported as a
//! POSIX file descriptor instead (when it was created exportable as one),
//! passed to each peer over the links bring-up authenticated
//! (`fdmesh.rs`), and imported and mapped there.
//!
//! A descriptor can be imported once, not opened again at a later call as
//! an IPC handle can, so the rules differ from IPC's:
//!
//! * **Shared in a call every rank takes part in**: a registration
//!   (`register.rs`) posts the allocation as its target, a copy-engine
//!   call (`run.rs`) whose output could not be posted as a target offers
//!   it beside its bounce buffer; either way as [`Share::VmmFresh`]. The
//!   owner sends its descriptor to every peer, each peer imports it, and a
//!   second round of posts agrees on the outcome (a peer whose import
//!   failed, or whose descriptor did not come within [`FD_WAIT`], names
//!   the owner in its note). If any rank failed, every rank drops it
//!   alike and it is not offered again: calls use bounce buffers, as for
//!   any memory that cannot be exported.
//! * **Peers keep the import while the owner shares it**: later calls post
//!   it as [`Share::Vmm`], and every peer finds it mapped. At most
//!   [`VMM_SLOTS`] allocations are shared at once; the owner's share table
//!   (`board.rs`) says which. A share made by a registration ends with the
//!   owner's last registration of it; one made by a copy-engine call ends
//!   when the owner sees the allocation freed (every one is looked at
//!   before a new offer, and one in turn at each copy-engine call). A peer
//!   compares the table whenever its generation moved and releases the
//!   imports dropped from it once the work queued before is done; until
//!   then the owner's freed memory stays allocated.

use super::super::driver::Allocation;
use super::super::driver::CUstream;
use super::super::state::CudaShared;
use super::board::{self, vmm_key, Post, Share, Target, VMM_SLOTS};
use super::fdmesh::FdMesh;
use super::fdpass::Words;
use super::State;
use crate::backend::shared::shm::Mapping;
use crate::error::{Error, Result};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// The digest of the agreement round (no collective hashes to it).
pub(super) const AGREE_DIGEST: u64 = 0x564d_4d5f_4147_5245;
/// How long an importer waits for a descriptor its owner posted before it
/// names the owner as failed (the sends happen right after the posts were
/// read, so this only matters when the owner could not send).
const FD_WAIT: Duration = Duration::from_secs(10);

/// Our VMM allocation offered in a call: its slot, the allocation and
/// its descriptor.
pub(super) struct Fresh {
    pub slot: usize,
    pub alloc: Allocation,
    pub fd: OwnedFd,
}

impl Fresh {
    /// How peers find it in our post.
    pub fn target(&self, addr: u64) -> Target {
        Target {
            buffer_id: self.alloc.buffer_id,
            offset: addr - self.alloc.base,
            alloc_bytes: self.alloc.bytes,
            handle: vmm_key(self.alloc.buffer_id),
            share: Share::VmmFresh,
        }
    }
}

/// The peers' fresh offers among `posts` (`pick` says where a post
/// carries its offer).
pub(super) fn fresh_offers(
    posts: &[Option<Post>],
    me: usize,
    pick: impl Fn(&Post) -> Option<Target>,
) -> Vec<(usize, Target)> {
    posts
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != me)
        .filter_map(|(p, q)| q.as_ref().and_then(&pick).map(|t| (p, t)))
        .filter(|(_, t)| t.share == Share::VmmFresh)
        .collect()
}

impl CudaShared {
    /// The links descriptors pass over (None: VMM allocations are neither
    /// shared nor imported, on every rank alike).
    pub(super) fn fd_mesh(&self) -> Option<&FdMesh> {
        self.ce.mesh.as_ref()
    }

    /// After the posts of call `number` (every rank calls this when any
    /// post offered a VMM allocation): pass the descriptors (ours in
    /// `fresh`), import the peers' `offers`, and agree with every rank.
    /// Returns the ranks whose offer failed somewhere (a bit each): their
    /// imports are dropped here, and ours is shared (by a registration
    /// when `by_registration`) only if our bit is clear.
    pub(super) fn vmm_exchange(
        &self,
        st: &mut State,
        seq: u64,
        number: u64,
        offers: &[(usize, Target)],
        fresh: Option<&Fresh>,
        by_registration: bool,
    ) -> Result<u64> {
        let (n, me) = (self.nranks, self.rank);
        let mut failed = 0u64;
        let mesh = self.fd_mesh();
        let wait = FD_WAIT.min(self.timeout);
        if let Some(f) = fresh {
            // Listed before the agreement's post, so a peer that reads it
            // sees the slot when it looks at our table.
            board::vmm_set(self.own().as_ref(), f.slot, f.alloc.buffer_id);
            let words: Words = [number, me as u64, f.alloc.buffer_id];
            let deadline = Instant::now() + wait;
            for p in (0..n).filter(|&p| p != me) {
                let sent = match mesh {
                    Some(m) => m.send(p, &words, &f.fd, deadline),
                    None => Err(Error::Backend("no descriptor links".into())),
                };
                if let Err(e) = sent {
                    tracing::warn!(rank = me, peer = p, "VMM descriptor not sent: {e}");
                    failed |= 1 << me;
                }
            }
        }
        let deadline = Instant::now() + wait;
        for (p, t) in offers {
            let want: Words = [number, *p as u64, t.buffer_id];
            let imported = match mesh {
                Some(m) => m
                    .recv(*p, &want, deadline, &mut || self.exchange_check())
                    .and_then(|fd| st.registry.import_vmm(*p, t, &fd)),
                None => Err(Error::Backend("no descriptor links".into())),
            };
            if let Err(e) = imported {
                tracing::warn!(rank = me, peer = *p, "VMM allocation not imported: {e}");
                failed |= 1 << p;
            }
        }

        // Agree: every rank posts whom it failed with.
        let agree = Post {
            number: st.calls,
            seq,
            digest: AGREE_DIGEST,
            target: None,
            source: None,
            note: failed,
            offer: None,
        };
        st.calls += 1;
        board::publish(self.own().as_ref(), &agree);
        let all = self.await_posts(&agree)?;
        // Every peer sent what it sends in this exchange before its
        // agreement post: whatever still waits is late or unexpected.
        if let Some(m) = mesh {
            m.drain();
        }
        let failed = all.iter().flatten().fold(0, |acc, q| acc | q.note);
        for (p, t) in offers {
            if failed & 1 << p != 0 {
                st.registry.drop_import(*p, &t.handle);
            }
        }
        if let Some(f) = fresh {
            if failed & 1 << me == 0 {
                st.registry.vmm_commit(&f.alloc, f.slot, by_registration);
            } else {
                st.registry.vmm_refuse(f.alloc.buffer_id);
                board::vmm_set(self.own().as_ref(), f.slot, 0);
            }
        }
        tracing::debug!(
            rank = me,
            offered = fresh.is_some(),
            imported = offers.len(),
            failed = format!("{failed:#x}"),
            "VMM allocations exchanged"
        );
        Ok(failed)
    }

    /// Whether a wait for a descriptor may go on: not when the node
    /// failed or a local peer died.
    fn exchange_check(&self) -> Result<()> {
        if self.own().abort_word() != 0 {
            return Err(self.state_error().unwrap_or(Error::Aborted));
        }
        if let Some(e) = self.liveness.dead() {
            return Err(e);
        }
        Ok(())
    }

    /// Release the imports peers stopped sharing, then evict beyond the
    /// cache's limits (the registry's `evict`), after a call's mappings
    /// were opened.
    pub(super) fn ce_evict(&self, st: &mut State, stream: CUstream, captured: bool) -> Result<()> {
        if !captured {
            for p in st.registry.vmm_peers() {
                let seg: &Mapping = self.segs[p].as_ref();
                let generation = board::vmm_generation(seg);
                if st.registry.vmm_seen(p) != Some(generation)
                    && st
                        .registry
                        .retire_unshared(p, |b| board::vmm_shares(seg, b), stream)?
                {
                    st.registry.vmm_mark_seen(p, generation);
                }
            }
        }
        st.registry.evict(stream, captured)
    }

    /// A VMM allocation `alloc` (holding `bytes` at `addr`) that a
    /// copy-engine call may offer, if it is one, fits, and descriptors can
    /// pass.
    pub(super) fn offer_vmm(
        &self,
        st: &mut State,
        alloc: Option<Allocation>,
        addr: u64,
        bytes: u64,
    ) -> Result<Option<Fresh>> {
        let Some(a) = alloc else {
            return Ok(None);
        };
        let fits = addr.saturating_add(bytes) <= a.base.saturating_add(a.bytes);
        if !fits || !st.registry.vmm_may_offer(a.buffer_id) || self.fd_mesh().is_none() {
            return Ok(None);
        }
        // Before a new share: stop sharing every freed one, so that dead
        // allocations neither hold slots nor stay mapped by the peers.
        for slot in st.registry.vmm_gone(true)? {
            self.vmm_unshare(Some(slot));
        }
        Ok(st
            .registry
            .vmm_offer(&a)?
            .map(|(slot, fd)| Fresh { slot, alloc: a, fd }))
    }

    /// Stop sharing a VMM allocation a copy-engine call shared once it
    /// was freed (one looked at per call, in turn).
    pub(super) fn vmm_check_gone(&self, st: &mut State) -> Result<()> {
        for slot in st.registry.vmm_gone(false)? {
            self.vmm_unshare(Some(slot));
        }
        Ok(())
    }

    /// Stop sharing the VMM allocation in `slot` (peers then release
    /// their imports).
    pub(super) fn vmm_unshare(&self, slot: Option<usize>) {
        if let Some(slot) = slot.filter(|s| *s < VMM_SLOTS) {
            board::vmm_set(self.own().as_ref(), slot, 0);
        }
    }
}
