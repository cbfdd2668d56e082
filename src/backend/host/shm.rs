//! POSIX shared memory segments of the host backend.
//!
//! Each rank creates one segment that holds every FIFO it *receives* in
//! (one connector per channel and sending local rank, itself included), and
//! maps the segments of the other ranks of its node to send to them. A
//! segment starts with a control block that carries the abort flag and the
//! abort reason of its owner.
//!
//! Names, creation (mode 0600), unlinking once every peer mapped a
//! segment, the abort control block and the removal of stale segments are
//! the shared layer's ([`crate::backend::shared::shm`]); this module adds
//! the host's layout after the control block.

use super::fifo::{self, FifoConn};
use crate::backend::shared::shm::{self as shared, Mapping, SegOwner};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// "GPUCOLL" + layout version 1.
const MAGIC: u64 = 0x4750_5543_4f4c_4c01;

/// Bytes in front of the connectors: the shared control block, then the
/// host's magic and layout parameters.
pub(crate) const CONTROL_BYTES: usize = 4096;
const MAGIC_OFF: usize = shared::CONTROL_BYTES;
const PARAMS_OFF: usize = MAGIC_OFF + 8;

/// Largest segment the backend creates (bytes).
pub(crate) const MAX_SEGMENT_BYTES: usize = 64 << 20;
/// Smallest slot the backend scales down to.
pub(crate) const MIN_SLOT_BYTES: usize = 4 << 10;

/// The shape of one rank's segment; identical on all ranks of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegLayout {
    pub slots: usize,
    pub slot_bytes: usize,
    pub channels: usize,
    pub local_size: usize,
}

impl SegLayout {
    /// Bytes between consecutive connectors.
    pub(crate) fn stride(&self) -> usize {
        fifo::connector_bytes(self.slots, self.slot_bytes)
    }

    /// Total segment size.
    pub(crate) fn total(&self) -> usize {
        CONTROL_BYTES + self.channels * self.local_size * self.stride()
    }

    /// Offset of the connector carrying `channel` from local rank `sender`.
    pub(crate) fn connector_offset(&self, channel: usize, sender: usize) -> usize {
        debug_assert!(channel < self.channels && sender < self.local_size);
        CONTROL_BYTES + (channel * self.local_size + sender) * self.stride()
    }

    fn params(&self) -> [u64; 4] {
        [
            self.slots as u64,
            self.slot_bytes as u64,
            self.channels as u64,
            self.local_size as u64,
        ]
    }
}

/// The slot size every rank derives from agreed inputs: the configured (or
/// default) size, scaled down (by powers of two, at least
/// [`MIN_SLOT_BYTES`]) until the segment of the largest node fits
/// [`MAX_SEGMENT_BYTES`].
pub(crate) fn choose_slot_bytes(
    requested: usize,
    slots: usize,
    channels: usize,
    max_local_size: usize,
) -> usize {
    let mut slot = (requested / fifo::LINE).max(1) * fifo::LINE;
    let fits = |slot: usize| {
        SegLayout {
            slots,
            slot_bytes: slot,
            channels,
            local_size: max_local_size.max(1),
        }
        .total()
            <= MAX_SEGMENT_BYTES
    };
    while slot > MIN_SLOT_BYTES && !fits(slot) {
        slot = (slot / 2).max(MIN_SLOT_BYTES) / fifo::LINE * fifo::LINE;
    }
    slot
}

/// Bytes of the magic and the layout parameters after the control block.
pub(crate) const LAYOUT_BYTES: usize = 8 + 4 * 8;

/// The layout a segment's header bytes (at least [`LAYOUT_BYTES`], from
/// the magic on) describe; refused when the magic is not this version's,
/// or the parameters could not describe a segment this backend makes
/// (zero counts, slots that are not whole lines, a total beyond
/// [`MAX_SEGMENT_BYTES`] or overflowing).
pub(crate) fn parse_layout(bytes: &[u8]) -> Result<SegLayout> {
    let bad = |why: String| Error::Backend(format!("host segment header: {why}"));
    let head = bytes
        .get(..LAYOUT_BYTES)
        .ok_or_else(|| bad(format!("{} bytes, need {LAYOUT_BYTES}", bytes.len())))?;
    let w = |i: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&head[8 * i..8 * i + 8]);
        u64::from_le_bytes(v)
    };
    if w(0) != MAGIC {
        return Err(bad(format!("magic {:#018x}", w(0))));
    }
    let small = |i: usize, what: &str| {
        usize::try_from(w(i))
            .ok()
            .filter(|&v| v > 0 && v <= MAX_SEGMENT_BYTES)
            .ok_or_else(|| bad(format!("{what} {}", w(i))))
    };
    let layout = SegLayout {
        slots: small(1, "slots")?,
        slot_bytes: small(2, "slot bytes")?,
        channels: small(3, "channels")?,
        local_size: small(4, "local size")?,
    };
    if layout.slot_bytes % fifo::LINE != 0 {
        return Err(bad(format!(
            "slot bytes {} not whole lines",
            layout.slot_bytes
        )));
    }
    // The same sum as `total`, checked: every factor came from outside.
    // (`header_bytes` cannot overflow: slots <= MAX_SEGMENT_BYTES.)
    let total = (layout.slots.checked_mul(layout.slot_bytes))
        .and_then(|d| d.checked_add(fifo::header_bytes(layout.slots)))
        .and_then(|c| c.checked_mul(layout.channels))
        .and_then(|c| c.checked_mul(layout.local_size))
        .and_then(|c| c.checked_add(CONTROL_BYTES))
        .filter(|&t| t <= MAX_SEGMENT_BYTES)
        .ok_or_else(|| {
            bad(format!(
                "layout {:?} exceeds {MAX_SEGMENT_BYTES} bytes",
                layout.params()
            ))
        })?;
    debug_assert_eq!(total, layout.total());
    Ok(layout)
}

/// The name of `local_rank`'s segment, created by `pid` with its `nonce`.
pub(crate) fn segment_name(pid: u32, nonce: u128, local_rank: usize) -> String {
    shared::segment_name(SegOwner::Host, pid, nonce, local_rank)
}

/// A rank's mapped segment: the shared control block, the layout check,
/// and its connectors.
#[derive(Debug)]
pub(crate) struct Segment {
    map: Mapping,
}

impl AsRef<Mapping> for Segment {
    fn as_ref(&self) -> &Mapping {
        &self.map
    }
}

impl Segment {
    /// Create, size and map a new segment, and initialize its control block.
    pub(crate) fn create(name: &str, layout: &SegLayout) -> Result<Segment> {
        let map = Mapping::create(name, layout.total())?;
        // ftruncate zero-filled the memory: counters and flags start at 0.
        for (i, p) in layout.params().iter().enumerate() {
            map.word(PARAMS_OFF + 8 * i).store(*p, Ordering::Relaxed);
        }
        map.word(MAGIC_OFF).store(MAGIC, Ordering::Release);
        Ok(Segment { map })
    }

    /// Map a peer's segment, made by process `creator`, and check that its
    /// layout is the expected one.
    pub(crate) fn open(name: &str, layout: &SegLayout, creator: u32) -> Result<Segment> {
        let map = Mapping::open(name, layout.total(), creator)?;
        let mut head = [0u8; LAYOUT_BYTES];
        for (i, chunk) in head.chunks_exact_mut(8).enumerate() {
            let w = map.word(MAGIC_OFF + 8 * i).load(Ordering::Acquire);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        match parse_layout(&head) {
            Ok(found) if found == *layout => Ok(Segment { map }),
            found => Err(Error::Backend(format!(
                "shared memory segment {name} has layout {found:?}, expected {:?}",
                layout.params()
            ))),
        }
    }

    /// Remove the name (the mapping stays usable).
    pub(crate) fn unlink(&mut self) -> Result<()> {
        self.map.unlink()
    }

    /// The connector at `offset` (from [`SegLayout::connector_offset`]).
    pub(crate) fn connector(&self, offset: usize, layout: &SegLayout) -> FifoConn<'_> {
        assert!(
            offset % fifo::LINE == 0 && offset + layout.stride() <= self.map.len(),
            "connector out of range"
        );
        // SAFETY: the range is inside the mapping (checked above), 64-aligned,
        // zero-initialized by ftruncate, and used only through FifoConn; each
        // connector has exactly one sending and one receiving rank.
        unsafe { FifoConn::from_raw(self.map.ptr().add(offset), layout.slots, layout.slot_bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_map_and_share_abort_state() {
        let layout = SegLayout {
            slots: 8,
            slot_bytes: 1024,
            channels: 2,
            local_size: 3,
        };
        let name = segment_name(std::process::id(), 0xabcd, 7);
        let mut own = Segment::create(&name, &layout).unwrap();
        let me = std::process::id();
        let peer = Segment::open(&name, &layout, me).unwrap();
        let other = SegLayout {
            slot_bytes: 512,
            ..layout
        };
        assert!(Segment::open(&name, &other, me).is_err());
        assert!(
            Segment::open(&name, &layout, me + 1).is_err(),
            "another creator"
        );
        own.unlink().unwrap();
        assert!(Segment::open(&name, &layout, me).is_err());

        // A piece sent through the peer's view arrives in the owner's view.
        let off = layout.connector_offset(1, 2);
        let tx = peer.connector(off, &layout);
        let rx = own.connector(off, &layout);
        let slot = tx.send_slot().unwrap();
        // SAFETY: the slot is owned by the sender until commit.
        unsafe { slot.write(42) };
        tx.send_commit(fifo::make_meta(3, 1));
        let (meta, p) = rx.recv_peek().unwrap().unwrap();
        assert_eq!(meta, fifo::make_meta(3, 1));
        // SAFETY: owned by the receiver until release.
        assert_eq!(unsafe { p.read() }, 42);
        rx.recv_release();

        // The control block is shared by both views.
        assert_eq!(peer.as_ref().abort_raiser(), None);
        own.as_ref().raise_abort(2);
        assert_eq!(peer.as_ref().abort_raiser(), Some(2));
    }

    #[test]
    fn slot_size_scales_with_node_size() {
        assert_eq!(choose_slot_bytes(128 << 10, 8, 4, 8), 128 << 10);
        let big = choose_slot_bytes(128 << 10, 8, 4, 64);
        assert!((MIN_SLOT_BYTES..128 << 10).contains(&big));
        let l = SegLayout {
            slots: 8,
            slot_bytes: big,
            channels: 4,
            local_size: 64,
        };
        assert!(l.total() <= MAX_SEGMENT_BYTES);
        assert_eq!(choose_slot_bytes(128 << 10, 8, 4, 100_000), MIN_SLOT_BYTES);
        assert_eq!(choose_slot_bytes(1000, 8, 4, 2), 960);
    }

    fn header_of(l: &SegLayout) -> Vec<u8> {
        std::iter::once(MAGIC)
            .chain(l.params())
            .flat_map(u64::to_le_bytes)
            .collect()
    }

    /// Random and mutated layout headers: no panic, and whatever is
    /// accepted describes a segment within the size limit whose header
    /// bytes are the input's.
    #[test]
    fn layout_headers_are_checked() {
        let l = SegLayout {
            slots: 8,
            slot_bytes: 4096,
            channels: 4,
            local_size: 3,
        };
        assert_eq!(parse_layout(&header_of(&l)).unwrap(), l);
        assert!(parse_layout(&header_of(&l)[..LAYOUT_BYTES - 1]).is_err());
        for bad in [
            SegLayout { slots: 0, ..l },
            SegLayout {
                slot_bytes: 100,
                ..l
            },
            SegLayout { channels: 0, ..l },
            SegLayout {
                local_size: 1 << 40,
                ..l
            },
            SegLayout {
                slots: usize::MAX,
                ..l
            },
        ] {
            assert!(parse_layout(&header_of(&bad)).is_err(), "{bad:?}");
        }
        let mut rng = crate::testutil::XorShift::new(0x001a_700c);
        let valid = header_of(&l);
        for i in 0..20_000 {
            let b = if i % 4 == 0 {
                rng.bytes_below(64)
            } else {
                rng.mutate(&valid)
            };
            if let Ok(found) = parse_layout(&b) {
                assert!(found.total() <= MAX_SEGMENT_BYTES);
                assert_eq!(header_of(&found)[..], b[..LAYOUT_BYTES]);
            }
        }
    }
}
