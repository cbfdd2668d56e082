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

/// The name of `local_rank`'s segment in a communicator tagged `tag`.
pub(crate) fn segment_name(pid: u32, tag: u64, local_rank: usize) -> String {
    shared::segment_name(SegOwner::Host, pid, tag, local_rank)
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

    /// Map a peer's segment and check that its layout is the expected one.
    pub(crate) fn open(name: &str, layout: &SegLayout) -> Result<Segment> {
        let map = Mapping::open(name, layout.total())?;
        let params: Vec<u64> = (0..4)
            .map(|i| map.word(PARAMS_OFF + 8 * i).load(Ordering::Relaxed))
            .collect();
        if map.word(MAGIC_OFF).load(Ordering::Acquire) != MAGIC || params != layout.params() {
            return Err(Error::Backend(format!(
                "shared memory segment {name} has layout {params:?}, expected {:?}",
                layout.params()
            )));
        }
        Ok(Segment { map })
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
        let peer = Segment::open(&name, &layout).unwrap();
        let other = SegLayout {
            slot_bytes: 512,
            ..layout
        };
        assert!(Segment::open(&name, &other).is_err());
        own.unlink().unwrap();
        assert!(Segment::open(&name, &layout).is_err());

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
}
