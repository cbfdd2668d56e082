//! The copy-engine collectives' words in every rank's control segment
//! (host shared memory, mapped by every local rank and registered with
//! CUDA): the flags the streams hand-shake on, and the board where each
//! rank posts, per call, the receive buffer its peers push into.
//!
//! * **Flags**: `ready[p]` and `done[p]` (32-bit) in rank `r`'s segment are
//!   written by peer `p`'s stream (`cuStreamWriteValue32` through the
//!   peer's registration of the segment) and waited on by `r`'s stream
//!   (`cuStreamWaitValue32 ≥ 1`), which stores 0 again right after the
//!   wait. A flag is raised again only after a causal chain through that
//!   reset, so no value is ever missed, and replays of a captured graph
//!   (which repeat the same constant stores) work unchanged. A host that
//!   gives up on a call stores 1 into all of its own flags ([`release`])
//!   so its stream can drain.
//! * **Board**: two slots of [`Post`] per rank, used alternately by
//!   consecutive copy-engine calls (the same on every rank). Rank `r`
//!   posts call `c` in slot `c % 2` only after it read every peer's post
//!   of call `c - 1`, which each peer made after reading every post of
//!   call `c - 2`: a slot is never rewritten while a peer may still read it.
//!   A post names its copy-engine call number (the tag, written last) and
//!   the engine's sequence number: registrations (`register.rs`) are
//!   copy-engine calls too but take no sequence number of their own.
//! * **VMM shares** (`vmm.rs`): the buffer IDs of this rank's VMM
//!   allocations its peers may keep mapped, one per share slot, and a
//!   generation word raised at every change.

use super::super::shm::{CONTROL_BYTES, STATUS_OFF};
use crate::backend::shared::shm::Mapping;
use std::sync::atomic::Ordering;

/// Most ranks of a copy-engine communicator (the direct path's).
pub(crate) const MAX_RANKS: usize = 8;
/// The per-channel status area ends here (128 channels × 64 bytes).
const STATUS_END: usize = STATUS_OFF + 128 * 64;
/// `ready[MAX_RANKS]` (u32), on a cache line of its own.
pub(crate) const READY_OFF: usize = STATUS_END;
/// `done[MAX_RANKS]` (u32).
pub(crate) const DONE_OFF: usize = READY_OFF + 64;
/// Two slots of [`Post`].
const BOARD_OFF: usize = DONE_OFF + 64;
const SLOT_BYTES: usize = 512;
/// A slot's words: 0 the tag, 1 the digest, 2 the sequence number, 3 the
/// note, then the receive target, the source target and the VMM offer (a
/// kind word, buffer ID, offset, allocation bytes and the handle each).
const WORDS: usize = TARGET_AT + 3 * TARGET_WORDS;
const TARGET_AT: usize = 4;
const SOURCE_AT: usize = TARGET_AT + TARGET_WORDS;
const OFFER_AT: usize = SOURCE_AT + TARGET_WORDS;
const TARGET_WORDS: usize = 4 + HANDLE_WORDS;
const HANDLE_WORDS: usize = 8;
const _: () = assert!(WORDS * 8 <= SLOT_BYTES);
/// The VMM share table: the generation, then [`VMM_SLOTS`] buffer IDs.
const VMM_OFF: usize = BOARD_OFF + 2 * SLOT_BYTES;
/// VMM allocations a rank shares at once on one communicator.
pub(crate) const VMM_SLOTS: usize = 64;
const _: () = assert!(VMM_OFF + (1 + VMM_SLOTS) * 8 <= CONTROL_BYTES);
const _: () = assert!(MAX_RANKS * 4 <= 64);

/// Offset of the flag peer `p` raises in a rank's segment.
pub(crate) fn ready_flag(p: usize) -> usize {
    READY_OFF + 4 * p
}

/// As [`ready_flag`] for the "done" flag.
pub(crate) fn done_flag(p: usize) -> usize {
    DONE_OFF + 4 * p
}

/// Store 1 into every flag of this segment, releasing whatever wait its
/// stream is blocked in (after a failure: peers will not raise them).
pub(crate) fn release(own: &Mapping) {
    let ones = 1u64 | 1u64 << 32;
    for off in (READY_OFF..DONE_OFF + 64).step_by(8) {
        own.word(off).store(ones, Ordering::Release);
    }
}

/// What a rank posts for one copy-engine call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Post {
    /// The copy-engine call number (registrations included), the same on
    /// every rank: what a reader matches a post by.
    pub number: u64,
    /// The engine's sequence number: the call's own, or for a registration
    /// the next call's.
    pub seq: u64,
    /// The call's identity (kind, root, size, datatype): a peer that
    /// issued another call is a protocol mismatch, not a hang.
    pub digest: u64,
    /// Where peers push: `None` when nobody pushes into this rank.
    pub target: Option<Target>,
    /// Where peers read this rank's input (the peer kernels on registered
    /// buffers): `None` when nobody reads it.
    pub source: Option<Target>,
    /// A word of the call's own (a VMM agreement's failure bits).
    pub note: u64,
    /// A VMM allocation of this rank's offered for sharing in this call
    /// ([`Share::VmmFresh`]; a copy-engine call's output it could not
    /// post as its target): `vmm.rs`.
    pub offer: Option<Target>,
}

/// How peers reach a [`Target`]'s allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Share {
    /// Legacy IPC: the handle is a `cuIpcGetMemHandle` handle.
    #[default]
    Ipc,
    /// A VMM allocation every peer mapped already (`vmm.rs`): the handle
    /// is its key.
    Vmm,
    /// A VMM allocation shared in this registration: its descriptor follows
    /// through the sockets (`fdpass.rs`).
    VmmFresh,
}

impl Share {
    fn word(self) -> u64 {
        match self {
            Share::Ipc => 1,
            Share::Vmm => 2,
            Share::VmmFresh => 3,
        }
    }

    fn from_word(w: u64) -> Option<Share> {
        match w {
            1 => Some(Share::Ipc),
            2 => Some(Share::Vmm),
            3 => Some(Share::VmmFresh),
            _ => None,
        }
    }

    pub(crate) fn is_vmm(self) -> bool {
        self != Share::Ipc
    }
}

/// A receive buffer as peers find it: the IPC handle of its allocation
/// (opened once per allocation, keyed by its buffer ID) and the offset of
/// the buffer in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub buffer_id: u64,
    pub offset: u64,
    /// Bytes of the whole allocation (what a peer's mapping keeps alive).
    pub alloc_bytes: u64,
    pub handle: [u8; 64],
    pub share: Share,
}

fn slot(call: u64) -> usize {
    BOARD_OFF + (call % 2) as usize * SLOT_BYTES
}

/// Publish `post` in `own` (in the slot of its call number).
pub(crate) fn publish(own: &Mapping, post: &Post) {
    let s = slot(post.number);
    let w = |i: usize| own.word(s + 8 * i);
    w(1).store(post.digest, Ordering::Relaxed);
    w(2).store(post.seq, Ordering::Relaxed);
    w(3).store(post.note, Ordering::Relaxed);
    for (at, t) in [
        (TARGET_AT, &post.target),
        (SOURCE_AT, &post.source),
        (OFFER_AT, &post.offer),
    ] {
        match t {
            Some(t) => {
                w(at).store(t.share.word(), Ordering::Relaxed);
                w(at + 1).store(t.buffer_id, Ordering::Relaxed);
                w(at + 2).store(t.offset, Ordering::Relaxed);
                w(at + 3).store(t.alloc_bytes, Ordering::Relaxed);
                for (i, chunk) in t.handle.chunks_exact(8).enumerate() {
                    let v = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
                    w(at + 4 + i).store(v, Ordering::Relaxed);
                }
            }
            None => w(at).store(0, Ordering::Relaxed),
        }
    }
    // Published last: readers that see the tag see the rest.
    w(0).store(post.number + 1, Ordering::Release);
}

/// What a peer's slot for call number `call` holds, if anything: the post
/// of that call, or of the call two before it (a smaller number: not
/// posted yet). The caller compares sequence numbers and digests.
pub(crate) fn read(peer: &Mapping, call: u64) -> Option<Post> {
    let s = slot(call);
    let w = |i: usize| peer.word(s + 8 * i);
    let tag = w(0).load(Ordering::Acquire);
    if tag == 0 {
        return None;
    }
    let target_at = |at: usize| {
        Share::from_word(w(at).load(Ordering::Relaxed)).map(|share| {
            let mut handle = [0u8; 64];
            for (i, chunk) in handle.chunks_exact_mut(8).enumerate() {
                chunk.copy_from_slice(&w(at + 4 + i).load(Ordering::Relaxed).to_le_bytes());
            }
            Target {
                buffer_id: w(at + 1).load(Ordering::Relaxed),
                offset: w(at + 2).load(Ordering::Relaxed),
                alloc_bytes: w(at + 3).load(Ordering::Relaxed),
                handle,
                share,
            }
        })
    };
    Some(Post {
        number: tag - 1,
        seq: w(2).load(Ordering::Relaxed),
        digest: w(1).load(Ordering::Relaxed),
        target: target_at(TARGET_AT),
        source: target_at(SOURCE_AT),
        note: w(3).load(Ordering::Relaxed),
        offer: target_at(OFFER_AT),
    })
}

/// Share slot `slot` of `own`'s table names `buffer_id` now (0: free);
/// the generation rises after it, so a reader that sees the new generation
/// sees the slot.
pub(crate) fn vmm_set(own: &Mapping, slot: usize, buffer_id: u64) {
    own.word(VMM_OFF + 8 * (1 + slot))
        .store(buffer_id, Ordering::Relaxed);
    own.word(VMM_OFF).fetch_add(1, Ordering::Release);
}

/// The generation of `peer`'s share table.
pub(crate) fn vmm_generation(peer: &Mapping) -> u64 {
    peer.word(VMM_OFF).load(Ordering::Acquire)
}

/// Whether `peer` shares `buffer_id` (read after [`vmm_generation`]).
pub(crate) fn vmm_shares(peer: &Mapping, buffer_id: u64) -> bool {
    (0..VMM_SLOTS).any(|s| peer.word(VMM_OFF + 8 * (1 + s)).load(Ordering::Relaxed) == buffer_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_round_trip_and_alternate_slots() {
        let name = format!("/gpucoll.test.ceboard.{}", std::process::id());
        let mut m = Mapping::create(&name, CONTROL_BYTES).unwrap();
        m.unlink().unwrap();
        assert_eq!(read(&m, 0), None);
        let t = Target {
            buffer_id: 77,
            offset: 4096,
            alloc_bytes: 1 << 20,
            handle: std::array::from_fn(|i| i as u8 * 3),
            share: Share::Ipc,
        };
        let a = Post {
            number: 0,
            seq: 10,
            digest: 0xabc,
            target: Some(t),
            source: None,
            note: 0,
            offer: None,
        };
        publish(&m, &a);
        assert_eq!(read(&m, 0), Some(a));
        assert_eq!(read(&m, 1), None);
        let b = Post {
            number: 1,
            seq: 12,
            digest: 0xdef,
            target: None,
            source: Some(Target {
                offset: 8,
                share: Share::VmmFresh,
                ..t
            }),
            note: 0b101,
            offer: Some(Target {
                buffer_id: 9,
                share: Share::VmmFresh,
                ..t
            }),
        };
        publish(&m, &b);
        assert_eq!(read(&m, 1), Some(b));
        assert_eq!(read(&m, 0), Some(a));
        // Call 2 reuses slot 0: until posted, the slot shows call 0.
        assert_eq!(read(&m, 2), Some(a));
        // A registration takes the next call's sequence number.
        let c = Post {
            number: 2,
            seq: 12,
            ..b
        };
        publish(&m, &c);
        assert_eq!(read(&m, 2), Some(c));
    }

    #[test]
    fn vmm_table_tracks_shares() {
        let name = format!("/gpucoll.test.cevmm.{}", std::process::id());
        let mut m = Mapping::create(&name, CONTROL_BYTES).unwrap();
        m.unlink().unwrap();
        let g0 = vmm_generation(&m);
        assert!(!vmm_shares(&m, 42));
        vmm_set(&m, VMM_SLOTS - 1, 42);
        assert!(vmm_generation(&m) > g0);
        assert!(vmm_shares(&m, 42));
        vmm_set(&m, VMM_SLOTS - 1, 0);
        assert!(!vmm_shares(&m, 42));
        // The board's slots are untouched by the table.
        assert_eq!(read(&m, 0), None);
    }

    #[test]
    fn release_raises_every_flag() {
        let name = format!("/gpucoll.test.ceflags.{}", std::process::id());
        let mut m = Mapping::create(&name, CONTROL_BYTES).unwrap();
        m.unlink().unwrap();
        release(&m);
        for p in 0..MAX_RANKS {
            for off in [ready_flag(p), done_flag(p)] {
                let w = m.word(off & !7).load(Ordering::Acquire);
                let v = if off % 8 == 0 {
                    w as u32
                } else {
                    (w >> 32) as u32
                };
                assert_eq!(v, 1, "flag at {off}");
            }
        }
    }
}
