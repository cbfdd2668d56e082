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

use super::super::driver::IPC_HANDLE_BYTES;
use super::super::shm::{CONTROL_BYTES, STATUS_OFF};
use crate::backend::shared::shm::Mapping;
use crate::error::{Error, Result};
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

/// Bytes of one post as [`encode_post`] lays it out and [`parse_post`]
/// reads it: [`WORDS`] little-endian words.
pub(crate) const POST_BYTES: usize = WORDS * 8;

/// The words of `post`, in slot order (the tag first).
pub(crate) fn encode_post(post: &Post) -> [u8; POST_BYTES] {
    let mut w = [0u64; WORDS];
    w[0] = post.number.wrapping_add(1);
    w[1] = post.digest;
    w[2] = post.seq;
    w[3] = post.note;
    for (at, t) in [
        (TARGET_AT, &post.target),
        (SOURCE_AT, &post.source),
        (OFFER_AT, &post.offer),
    ] {
        if let Some(t) = t {
            w[at] = t.share.word();
            w[at + 1] = t.buffer_id;
            w[at + 2] = t.offset;
            w[at + 3] = t.alloc_bytes;
            for (i, chunk) in t.handle.chunks_exact(8).enumerate() {
                w[at + 4 + i] = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            }
        }
    }
    let mut b = [0u8; POST_BYTES];
    for (i, v) in w.iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The post in a slot's bytes (at least [`POST_BYTES`]), checked: a tag
/// (0 is an empty slot), known share kinds, every target's offset inside
/// its allocation, and a VMM target's key naming its own buffer ID. Peers
/// are trusted, but what they post is used as addresses into mappings, so
/// it is checked against itself before any use.
pub(crate) fn parse_post(bytes: &[u8]) -> Result<Post> {
    let bad = |why: String| Error::Backend(format!("copy-engine post: {why}"));
    let b = bytes
        .get(..POST_BYTES)
        .ok_or_else(|| bad(format!("{} bytes, need {POST_BYTES}", bytes.len())))?;
    let w = |i: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(v)
    };
    let number = w(0)
        .checked_sub(1)
        .ok_or_else(|| bad("empty slot".into()))?;
    let target_at = |at: usize, what: &str| -> Result<Option<Target>> {
        if w(at) == 0 {
            // Absent: written as zeros throughout (`encode_post`).
            if (at + 1..at + TARGET_WORDS).any(|i| w(i) != 0) {
                return Err(bad(format!("{what}: absent but not cleared")));
            }
            return Ok(None);
        }
        let share =
            Share::from_word(w(at)).ok_or_else(|| bad(format!("{what}: kind {}", w(at))))?;
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[8 * (at + 4)..8 * (at + 4 + HANDLE_WORDS)]);
        let t = Target {
            buffer_id: w(at + 1),
            offset: w(at + 2),
            alloc_bytes: w(at + 3),
            handle,
            share,
        };
        if t.alloc_bytes == 0 || t.offset > t.alloc_bytes {
            return Err(bad(format!(
                "{what}: offset {} in an allocation of {} bytes",
                t.offset, t.alloc_bytes
            )));
        }
        if share.is_vmm()
            && (u64::from_le_bytes(handle[..8].try_into().unwrap_or([0; 8])) != VMM_KEY_MAGIC
                || vmm_key_buffer(&handle) != t.buffer_id)
        {
            return Err(bad(format!(
                "{what}: VMM key does not name buffer {}",
                t.buffer_id
            )));
        }
        Ok(Some(t))
    };
    Ok(Post {
        number,
        seq: w(2),
        digest: w(1),
        target: target_at(TARGET_AT, "target")?,
        source: target_at(SOURCE_AT, "source")?,
        note: w(3),
        offer: target_at(OFFER_AT, "offer")?,
    })
}

/// Publish `post` in `own` (in the slot of its call number).
pub(crate) fn publish(own: &Mapping, post: &Post) {
    let s = slot(post.number);
    let b = encode_post(post);
    let word = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
    for i in 1..WORDS {
        own.word(s + 8 * i).store(word(i), Ordering::Relaxed);
    }
    // Published last: readers that see the tag see the rest.
    own.word(s).store(word(0), Ordering::Release);
}

/// A peer's post of call number `call`: None while its slot holds another
/// call (not posted yet: the call two before), an error if the post is
/// malformed. The caller compares sequence numbers and digests.
pub(crate) fn read(peer: &Mapping, call: u64) -> Result<Option<Post>> {
    let s = slot(call);
    let tag = peer.word(s).load(Ordering::Acquire);
    if tag.checked_sub(1) != Some(call) {
        return Ok(None);
    }
    // The peer rewrites this slot only after reading our post of the call
    // after this one: its words are stable while we copy them.
    let mut b = [0u8; POST_BYTES];
    b[..8].copy_from_slice(&tag.to_le_bytes());
    for i in 1..WORDS {
        let v = peer.word(s + 8 * i).load(Ordering::Relaxed);
        b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    parse_post(&b).map(Some)
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

/// The first word of a VMM allocation's key (the rest: the owner's process
/// ID and the allocation's buffer ID), never the start of an IPC handle
/// we post: those carry the driver's own layout.
pub(crate) const VMM_KEY_MAGIC: u64 = 0x6763_766d_6d5f_6664;

/// The key a VMM allocation is known by in posts and caches: unique per
/// allocation of a process, and the same for every communicator.
pub(crate) fn vmm_key(buffer_id: u64) -> [u8; IPC_HANDLE_BYTES] {
    let mut h = [0u8; IPC_HANDLE_BYTES];
    h[..8].copy_from_slice(&VMM_KEY_MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    h[16..24].copy_from_slice(&buffer_id.to_le_bytes());
    h
}

/// The owner's buffer ID in a VMM key.
pub(crate) fn vmm_key_buffer(h: &[u8; IPC_HANDLE_BYTES]) -> u64 {
    u64::from_le_bytes(h[16..24].try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    fn sample() -> Post {
        let t = Target {
            buffer_id: 5,
            offset: 256,
            alloc_bytes: 2 << 20,
            handle: std::array::from_fn(|i| 200 - i as u8),
            share: Share::Ipc,
        };
        Post {
            number: 41,
            seq: 17,
            digest: 0xfeed_f00d,
            target: Some(t),
            source: Some(Target {
                buffer_id: 6,
                share: Share::Vmm,
                handle: vmm_key(6),
                ..t
            }),
            note: 3,
            offer: Some(Target {
                buffer_id: 8,
                offset: 0,
                share: Share::VmmFresh,
                handle: vmm_key(8),
                ..t
            }),
        }
    }

    #[test]
    fn malformed_posts_are_refused() {
        let p = sample();
        assert_eq!(parse_post(&encode_post(&p)).unwrap(), p);
        assert!(parse_post(&encode_post(&p)[..POST_BYTES - 8]).is_err());
        assert!(parse_post(&[0u8; POST_BYTES]).is_err(), "empty slot");
        let t = p.target.unwrap();
        for bad in [
            Target {
                offset: t.alloc_bytes + 1,
                ..t
            },
            Target {
                alloc_bytes: 0,
                offset: 0,
                ..t
            },
            Target {
                share: Share::Vmm,
                ..t
            },
            Target {
                share: Share::VmmFresh,
                handle: vmm_key(t.buffer_id + 1),
                ..t
            },
        ] {
            let q = Post {
                target: Some(bad),
                ..p
            };
            assert!(parse_post(&encode_post(&q)).is_err(), "{bad:?}");
        }
        let mut b = encode_post(&p);
        b[8 * TARGET_AT] = 4;
        assert!(parse_post(&b).is_err(), "unknown share kind");
        // A target that ends its allocation (an empty buffer) is fine.
        let edge = Post {
            target: Some(Target {
                offset: t.alloc_bytes,
                ..t
            }),
            ..p
        };
        assert!(parse_post(&encode_post(&edge)).is_ok());
    }

    /// Random and mutated posts: no panic; every accepted one keeps its
    /// targets inside their allocations and encodes back to the input.
    #[test]
    fn random_posts_never_panic() {
        let mut rng = XorShift::new(0xb0a2d);
        let valid = encode_post(&sample());
        for i in 0..30_000 {
            let b = if i % 6 == 0 {
                rng.bytes_below(POST_BYTES as u64 + 16)
            } else {
                rng.mutate(&valid)
            };
            if let Ok(p) = parse_post(&b) {
                for t in [p.target, p.source, p.offer].into_iter().flatten() {
                    assert!(t.offset <= t.alloc_bytes && t.alloc_bytes > 0);
                }
                assert_eq!(encode_post(&p)[..], b[..POST_BYTES]);
            }
        }
    }

    #[test]
    fn posts_round_trip_and_alternate_slots() {
        let name = format!("/gpucoll.test.ceboard.{}", std::process::id());
        let mut m = Mapping::create(&name, CONTROL_BYTES).unwrap();
        m.unlink().unwrap();
        assert_eq!(read(&m, 0).unwrap(), None);
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
        assert_eq!(read(&m, 0).unwrap(), Some(a));
        assert_eq!(read(&m, 1).unwrap(), None);
        let b = Post {
            number: 1,
            seq: 12,
            digest: 0xdef,
            target: None,
            source: Some(Target {
                offset: 8,
                share: Share::VmmFresh,
                handle: vmm_key(77),
                ..t
            }),
            note: 0b101,
            offer: Some(Target {
                buffer_id: 9,
                share: Share::VmmFresh,
                handle: vmm_key(9),
                ..t
            }),
        };
        publish(&m, &b);
        assert_eq!(read(&m, 1).unwrap(), Some(b));
        assert_eq!(read(&m, 0).unwrap(), Some(a));
        // Call 2 reuses slot 0: until posted, the slot holds call 0's.
        assert_eq!(read(&m, 2).unwrap(), None);
        // A registration takes the next call's sequence number.
        let c = Post {
            number: 2,
            seq: 12,
            ..b
        };
        publish(&m, &c);
        assert_eq!(read(&m, 2).unwrap(), Some(c));
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
        assert_eq!(read(&m, 0).unwrap(), None);
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

    #[test]
    fn vmm_keys_name_the_owner_and_the_allocation() {
        let k = vmm_key(42);
        assert_eq!(vmm_key_buffer(&k), 42);
        assert_ne!(vmm_key(42), vmm_key(43));
        assert_eq!(
            u64::from_le_bytes(k[..8].try_into().unwrap()),
            VMM_KEY_MAGIC
        );
    }
}
