//! The connector protocol: a single-producer single-consumer FIFO of
//! `slots` fixed-size slots in memory both sides map (NCCL's Simple
//! protocol with `NCCL_STEPS` slots).
//!
//! Layout of one connector (64-byte aligned base):
//!
//! | offset            | content                                             |
//! |-------------------|-----------------------------------------------------|
//! | 0                 | `tail`: pieces published (written by the sender)    |
//! | 64                | `head`: pieces consumed (written by the receiver)   |
//! | 128               | `meta[slots]`: `seq << 32 \| bytes` of each slot     |
//! | `header_bytes()`  | `slots` data slots of `slot_bytes` each             |
//!
//! `tail` and `head` sit on their own cache lines so the two sides do not
//! false-share. Both counters are monotone `u64`s that persist across
//! collectives (connectors live as long as the communicator), so slot `i`
//! of the ring is `counter % slots`.
//!
//! * Sender: wait until `tail - head < slots` (Acquire load of `head`: the
//!   receiver finished reading the slot), write the piece into slot
//!   `tail % slots`, store its metadata, Release-store `tail + 1`.
//! * Receiver: wait until `tail > head` (Acquire load of `tail`: the data
//!   and metadata are visible), check the metadata, read the slot,
//!   Release-store `head + 1` (our reads happen before the sender reuses it).
//!
//! This module holds every raw access to connector memory; callers get
//! plain pointers to slots they own under the protocol.

use crate::task::{CollKind, Task};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cache-line size the layout pads to.
pub(crate) const LINE: usize = 64;

/// Slots per FIFO (NCCL's `NCCL_STEPS`).
pub(crate) const FIFO_SLOTS: usize = 8;

const TAIL_OFF: usize = 0;
const HEAD_OFF: usize = LINE;
const META_OFF: usize = 2 * LINE;

/// Round up to a multiple of [`LINE`].
pub(crate) const fn align_line(n: usize) -> usize {
    n.div_ceil(LINE) * LINE
}

/// Bytes before the first data slot.
pub(crate) const fn header_bytes(slots: usize) -> usize {
    align_line(META_OFF + slots * 8)
}

/// Bytes of one connector (a multiple of 64 when `slot_bytes` is).
pub(crate) const fn connector_bytes(slots: usize, slot_bytes: usize) -> usize {
    header_bytes(slots) + slots * slot_bytes
}

/// Identifies one collective on the wire: the low 24 bits of its sequence
/// number, then an 8-bit digest of what it is (kind, datatype, op, root), so
/// that a rank that issued a different collective of the same size is caught
/// at its first piece instead of reading the data as its own.
pub(crate) fn call_stamp(seq: u64, task: &Task) -> u64 {
    let kind = CollKind::ALL
        .iter()
        .position(|k| *k == task.kind)
        .unwrap_or(0) as u64;
    let op = if task.kind.reduces() {
        task.op.code() as u64 ^ task.op.scalar_bits()
    } else {
        0
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in [kind, task.dtype as u64, op, task.root as u64] {
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
    ((seq & 0xff_ffff) << 8) | ((h ^ (h >> 32) ^ (h >> 16) ^ (h >> 8)) & 0xff)
}

/// The metadata word stamped on every piece: which collective (its 32-bit
/// call stamp, see [`call_stamp`]) and how many bytes.
pub(crate) fn make_meta(stamp: u64, bytes: usize) -> u64 {
    ((stamp as u32 as u64) << 32) | (bytes as u32 as u64)
}

/// `None` if `got` is the metadata expected for a piece of `bytes` bytes of
/// the collective with `stamp`, otherwise a description of the mismatch.
pub(crate) fn meta_mismatch(stamp: u64, bytes: usize, got: u64) -> Option<String> {
    let want = make_meta(stamp, bytes);
    (got != want).then(|| {
        let (want_seq, got_seq) = ((stamp as u32) >> 8, (got >> 40) as u32);
        let kind = if want_seq == got_seq && (stamp as u8) != ((got >> 32) as u8) {
            " of a different collective (kind, type, op or root differ)"
        } else {
            ""
        };
        format!(
            "expected collective #{want_seq} with {bytes} bytes, got #{got_seq}{kind} with {} bytes",
            got & 0xffff_ffff
        )
    })
}

/// One side's view of a connector in mapped memory.
///
/// Copyable handle; the lifetime ties it to the mapping that holds it.
#[derive(Clone, Copy)]
pub(crate) struct FifoConn<'a> {
    base: NonNull<u8>,
    slots: u64,
    slot_bytes: usize,
    _mem: PhantomData<&'a [u8]>,
}

impl std::fmt::Debug for FifoConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FifoConn")
            .field("base", &self.base)
            .field("tail", &self.tail().load(Ordering::Relaxed))
            .field("head", &self.head().load(Ordering::Relaxed))
            .finish()
    }
}

// SAFETY: a FifoConn only points into shared memory whose concurrently
// mutated words are accessed atomically; slot contents are handed out as raw
// pointers whose exclusive use follows the head/tail protocol.
unsafe impl Send for FifoConn<'_> {}
// SAFETY: as above; every method takes `&self` and uses atomics for shared words.
unsafe impl Sync for FifoConn<'_> {}

impl<'a> FifoConn<'a> {
    /// A view of the connector at `base`.
    ///
    /// # Safety
    /// `base` must be 64-byte aligned and valid for reads and writes of
    /// `connector_bytes(slots, slot_bytes)` bytes for `'a`; the memory must
    /// have been zeroed before the first use of either side, and only this
    /// protocol may access it. At most one sender and one receiver may use
    /// the connector at a time.
    pub(crate) unsafe fn from_raw(base: *mut u8, slots: usize, slot_bytes: usize) -> FifoConn<'a> {
        debug_assert!(slots > 0 && base as usize % LINE == 0 && slot_bytes % 8 == 0);
        FifoConn {
            base: NonNull::new(base).expect("connector base is non-null"),
            slots: slots as u64,
            slot_bytes,
            _mem: PhantomData,
        }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off < header_bytes(self.slots as usize));
        // SAFETY: `off` is an 8-aligned offset inside the header (the base is
        // 64-aligned), valid for the lifetime of `self` per `from_raw`; the
        // word is only ever accessed atomically.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }

    fn tail(&self) -> &AtomicU64 {
        self.word(TAIL_OFF)
    }

    fn head(&self) -> &AtomicU64 {
        self.word(HEAD_OFF)
    }

    fn meta(&self, slot: usize) -> &AtomicU64 {
        self.word(META_OFF + slot * 8)
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!((slot as u64) < self.slots);
        // SAFETY: slot < slots, so the slot lies inside the connector's
        // `connector_bytes` (see `from_raw`).
        unsafe {
            self.base
                .as_ptr()
                .add(header_bytes(self.slots as usize) + slot * self.slot_bytes)
        }
    }

    /// Sender: the slot to fill next, if the receiver has freed one. The
    /// pointer is valid for `slot_bytes` bytes and owned by the sender until
    /// [`send_commit`](Self::send_commit).
    pub(crate) fn send_slot(&self) -> Option<*mut u8> {
        // Only the sender writes `tail`, so a relaxed load reads our own value.
        let tail = self.tail().load(Ordering::Relaxed);
        // Acquire: the receiver's reads of the slot we are about to reuse
        // happened before its head update.
        let head = self.head().load(Ordering::Acquire);
        (tail.wrapping_sub(head) < self.slots).then(|| self.slot_ptr((tail % self.slots) as usize))
    }

    /// Sender: publish the slot returned by [`send_slot`](Self::send_slot).
    pub(crate) fn send_commit(&self, meta: u64) {
        let tail = self.tail().load(Ordering::Relaxed);
        self.meta((tail % self.slots) as usize)
            .store(meta, Ordering::Relaxed);
        // Release: the slot's data and metadata become visible with the tail.
        self.tail().store(tail.wrapping_add(1), Ordering::Release);
    }

    /// Receiver: the next published piece as `(metadata, slot pointer)`, if
    /// any. The slot is readable for `slot_bytes` bytes and owned by the
    /// receiver until [`recv_release`](Self::recv_release). An error means
    /// the counters are inconsistent (memory corrupted by a peer).
    pub(crate) fn recv_peek(&self) -> Result<Option<(u64, *const u8)>, String> {
        let head = self.head().load(Ordering::Relaxed);
        // Acquire: pairs with the sender's Release store of tail.
        let tail = self.tail().load(Ordering::Acquire);
        if tail == head {
            return Ok(None);
        }
        let ahead = tail.wrapping_sub(head);
        if ahead > self.slots {
            return Err(format!(
                "connector counters are inconsistent (head {head}, tail {tail})"
            ));
        }
        let slot = (head % self.slots) as usize;
        let meta = self.meta(slot).load(Ordering::Relaxed);
        Ok(Some((meta, self.slot_ptr(slot) as *const u8)))
    }

    /// Receiver: hand the slot returned by [`recv_peek`](Self::recv_peek)
    /// back to the sender.
    pub(crate) fn recv_release(&self) {
        let head = self.head().load(Ordering::Relaxed);
        // Release: our reads of the slot happen before the sender reuses it.
        self.head().store(head.wrapping_add(1), Ordering::Release);
    }

    /// (tail, head), for tests.
    #[cfg(test)]
    pub(crate) fn counters(&self) -> (u64, u64) {
        (
            self.tail().load(Ordering::Relaxed),
            self.head().load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    /// A zeroed, 64-aligned heap region standing in for a shared segment.
    pub(crate) struct Region {
        ptr: *mut u8,
        layout: Layout,
    }

    // SAFETY: the region is plain memory; tests access it only through FifoConn.
    unsafe impl Send for Region {}
    // SAFETY: as above.
    unsafe impl Sync for Region {}

    impl Region {
        pub(crate) fn new(bytes: usize) -> Region {
            let layout = Layout::from_size_align(bytes, LINE).unwrap();
            // SAFETY: non-zero size (callers pass connector sizes).
            let ptr = unsafe { alloc_zeroed(layout) };
            assert!(!ptr.is_null());
            Region { ptr, layout }
        }

        pub(crate) fn conn(&self, slots: usize, slot_bytes: usize) -> FifoConn<'_> {
            self.conn_at(0, slots, slot_bytes)
        }

        /// The connector at byte offset `off` (a multiple of 64).
        pub(crate) fn conn_at(&self, off: usize, slots: usize, slot_bytes: usize) -> FifoConn<'_> {
            assert!(
                off % LINE == 0 && off + connector_bytes(slots, slot_bytes) <= self.layout.size()
            );
            // SAFETY: aligned, zeroed, in bounds, alive as long as the borrow.
            unsafe { FifoConn::from_raw(self.ptr.add(off), slots, slot_bytes) }
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr, self.layout) }
        }
    }

    #[test]
    fn layout_is_line_aligned() {
        assert_eq!(header_bytes(8), 192);
        assert_eq!(connector_bytes(8, 4096), 192 + 8 * 4096);
        assert_eq!(connector_bytes(8, 4096) % LINE, 0);
    }

    #[test]
    fn meta_encodes_seq_and_bytes() {
        assert_eq!(make_meta(5, 100), (5 << 32) | 100);
        assert_eq!(make_meta((1 << 32) + 7, 3), (7 << 32) | 3);
        assert!(meta_mismatch(5, 100, make_meta(5, 100)).is_none());
        let d = meta_mismatch(12 << 8, 64, make_meta(13 << 8, 32)).unwrap();
        assert_eq!(
            d,
            "expected collective #12 with 64 bytes, got #13 with 32 bytes"
        );
    }

    #[test]
    fn stamp_tells_collectives_apart() {
        use crate::datatype::Datatype;
        use crate::op::ReduceOp;
        let t = |kind| Task {
            kind,
            dtype: Datatype::U32,
            op: ReduceOp::Sum,
            count: 4096,
            root: 0,
            in_place: false,
        };
        let a = call_stamp(7, &t(CollKind::AllReduce));
        let b = call_stamp(7, &t(CollKind::AllGather));
        assert_eq!(a >> 8, 7);
        assert_ne!(a, b);
        let d = meta_mismatch(a, 64, make_meta(b, 64)).unwrap();
        assert!(d.contains("different collective"), "{d}");
    }

    #[test]
    fn sender_blocks_when_full_and_receiver_when_empty() {
        let region = Region::new(connector_bytes(FIFO_SLOTS, 256));
        let c = region.conn(FIFO_SLOTS, 256);
        assert!(c.recv_peek().unwrap().is_none());
        for i in 0..FIFO_SLOTS {
            let slot = c.send_slot().expect("free slot");
            // SAFETY: the slot is ours until commit and holds 256 bytes.
            unsafe { slot.write(i as u8) };
            c.send_commit(make_meta(1, 1));
        }
        assert!(c.send_slot().is_none(), "all slots in use");
        let (meta, p) = c.recv_peek().unwrap().unwrap();
        assert_eq!(meta, make_meta(1, 1));
        // SAFETY: the slot is ours until release.
        assert_eq!(unsafe { p.read() }, 0);
        c.recv_release();
        assert!(c.send_slot().is_some());
        assert_eq!(c.counters(), (8, 1));
    }

    #[test]
    fn corrupt_counters_are_reported() {
        let region = Region::new(connector_bytes(FIFO_SLOTS, 64));
        let c = region.conn(FIFO_SLOTS, 64);
        c.tail().store(100, Ordering::Relaxed);
        assert!(c.recv_peek().is_err());
    }

    /// Two threads stream pieces of varying size through one connector; the
    /// receiver checks every byte and every metadata word.
    #[test]
    fn two_threads_stream_through_a_connector() {
        const SLOT: usize = 512;
        const PIECES: usize = 5000;
        let region = Region::new(connector_bytes(FIFO_SLOTS, SLOT));
        let conn = region.conn(FIFO_SLOTS, SLOT);
        let len_of = |i: usize| 1 + (i * 37) % SLOT;
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..PIECES {
                    let slot = loop {
                        match conn.send_slot() {
                            Some(p) => break p,
                            None => std::thread::yield_now(),
                        }
                    };
                    let n = len_of(i);
                    // SAFETY: the slot is owned by the sender until commit; n <= SLOT.
                    let buf = unsafe { std::slice::from_raw_parts_mut(slot, n) };
                    for (k, b) in buf.iter_mut().enumerate() {
                        *b = (i + k) as u8;
                    }
                    conn.send_commit(make_meta(i as u64 / 100, n));
                }
            });
            s.spawn(move || {
                for i in 0..PIECES {
                    let (meta, p) = loop {
                        match conn.recv_peek().unwrap() {
                            Some(x) => break x,
                            None => std::thread::yield_now(),
                        }
                    };
                    let n = len_of(i);
                    assert_eq!(meta_mismatch(i as u64 / 100, n, meta), None);
                    // SAFETY: the slot is owned by the receiver until release.
                    let buf = unsafe { std::slice::from_raw_parts(p, n) };
                    for (k, b) in buf.iter().enumerate() {
                        assert_eq!(*b, (i + k) as u8, "piece {i} byte {k}");
                    }
                    conn.recv_release();
                }
            });
        });
        assert_eq!(conn.counters(), (PIECES as u64, PIECES as u64));
    }
}
