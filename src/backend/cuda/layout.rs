//! Memory layout of the connectors, identical on every rank: how many
//! channels and slots, how big a slot is, where each FIFO, head word and
//! one-shot inbox lives in a rank's block, and the connectors (`GcConn`)
//! between the ranks of one node built from those offsets ([`FifoAreas`],
//! for the P2P and SHM transports). Pure arithmetic, unit-tested; which
//! transport serves which peer is `transport/`'s.

use super::abi::*;
use super::launch::THREADS;
use super::shm;

/// Slots per FIFO (NCCL's `NCCL_STEPS`).
pub const FIFO_SLOTS: usize = 8;
/// P2P channels (one block each): 256 / nranks within 16..=128;
/// `GPUCOLL_CUDA_CHANNELS` overrides (the smallest value of all ranks is
/// used). At most [`MAX_CHANNELS`]. On 2×H200 a 256 MiB all_reduce reached
/// 309 / 316 / 331 GB/s with 64 / 96 / 128 channels (docs/CUDA_NOTES.md).
pub(super) fn p2p_channels(nranks: usize) -> usize {
    (256 / nranks.max(1)).clamp(16, 128)
}
/// P2P slot size for `channels` channels: 512 KiB up to 64 channels, then
/// smaller so that the FIFO memory (channels × nranks × 8 slots per rank)
/// stays near 512 MiB for 2 ranks; `GPUCOLL_CUDA_SLOT_KB` overrides
/// (smallest of all ranks) and `GPUCOLL_MAX_MEM` shrinks ([`fit_budget`]).
pub(super) fn p2p_slot_bytes(channels: usize) -> usize {
    if channels > 64 {
        256 << 10
    } else {
        512 << 10
    }
}
/// Most channels when `sharers` ranks (processes) share one GPU of `sms`
/// multiprocessors: a collective's blocks spin until their peers' blocks
/// arrive, so every rank's grid must be resident at once. Time-sliced
/// processes take turns, but under MPS they share the SMs, and the step
/// interpreter holds a whole SM per block (512 threads × 128 registers):
/// 4 ranks × 64 blocks on a GPU of 132 SMs never all start. `None`: no
/// limit (one rank per GPU, or the SM count is unknown).
pub(super) fn co_resident_channels(sharers: usize, sms: usize) -> Option<usize> {
    (sharers > 1 && sms > 0).then(|| (sms / sharers).max(1))
}
/// How many ranks share the busiest GPU, from every rank's GPU key (equal
/// keys: the same GPU); 1 for an empty job.
pub(super) fn busiest_gpu(keys: &[u64]) -> usize {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    sorted
        .chunk_by(|a, b| a == b)
        .map(<[u64]>::len)
        .max()
        .unwrap_or(1)
}
/// Most channels (`GPUCOLL_CUDA_CHANNELS`); the per-channel status area
/// holds them.
pub(super) const MAX_CHANNELS: usize = 128;
const _: () = assert!(
    shm::STATUS_OFF + MAX_CHANNELS * std::mem::size_of::<GcChanStatus>() <= shm::CONTROL_BYTES
);
/// Multi-node communicators (NET connectors between nodes; P2P or SHM
/// inside them): a few channels of moderate slots, as for SHM, since every
/// inter-node piece is an MPI message handled by the proxy thread.
/// `GPUCOLL_CUDA_CHANNELS` / `GPUCOLL_CUDA_SLOT_KB` override (smallest of
/// all ranks).
pub(super) const NET_CHANNELS: usize = 4;
pub(super) const SLOT_BYTES_NET: usize = 128 << 10;

/// Most ranks and blocks of the direct (one-shot) kernels (`GC_ONESHOT_MAX_*`).
pub(super) const ONESHOT_MAX_RANKS: usize = 8;
pub(super) const ONESHOT_MAX_BLOCKS: u64 = 64;
/// Bytes per block below which the one-shot kernel uses fewer blocks.
pub(super) const ONESHOT_BLOCK_BYTES: u64 = 32 << 10;
/// Largest one-shot all_reduce (bytes) by default; a memory budget may
/// size the inboxes for less ([`Layout::oneshot_bytes`]).
pub(super) const ONESHOT_MAX_BYTES: u64 = crate::tune::model::ONESHOT_MAX_BYTES;
/// Bytes of one parity's flags: `[sender][block]` of `GcFlag` (16 bytes).
pub(super) const ONESHOT_FLAGS_BYTES: u64 = ONESHOT_MAX_RANKS as u64 * ONESHOT_MAX_BLOCKS * 16;
/// Largest LL one-shot all_reduce (bytes).
pub(super) const ONESHOT_LL_MAX_BYTES: u64 = crate::tune::model::ONESHOT_LL_MAX_BYTES;
/// Bytes before the parities of the one-shot area: the launch counter
/// (`GcOneShotCtl`), on a page of its own.
pub(super) const ONESHOT_CTL_BYTES: u64 = 4096;
// The counter holds one epoch per block and fits its page.
const _: () = assert!(
    std::mem::size_of::<GcOneShotCtl>() as u64 == 8 + 8 * ONESHOT_MAX_BLOCKS
        && std::mem::size_of::<GcOneShotCtl>() as u64 <= ONESHOT_CTL_BYTES
);
/// Data bytes per block of the LL one-shot: one 8-byte unit per thread.
pub(super) const ONESHOT_LL_BLOCK_BYTES: u64 = THREADS as u64 * 8;

/// Slots are halved down to this before channels are given up: below it a
/// piece's fixed cost (one flag round trip per slot) starts to dominate.
const BUDGET_SLOT_FLOOR: u64 = 64 << 10;
/// The smallest slot a budget can ask for (the setup exchange's minimum).
const BUDGET_SLOT_MIN: u64 = 4 << 10;
/// One-shot inboxes are halved down to this first: above it the ring or
/// tree is about as fast on one node (the tuner's crossover on H200 lies
/// between 256 KiB and 1 MiB).
const BUDGET_ONESHOT_FLOOR: u64 = 1 << 20;
/// The smallest one-shot inbox a budget can ask for.
const BUDGET_ONESHOT_MIN: u64 = 64 << 10;

/// `layout` shrunk until its block fits `budget` bytes
/// (`GPUCOLL_MAX_MEM`), in this order: one-shot inboxes halved down to 1
/// MiB and slots down to 64 KiB (neither costs much speed); then the
/// inboxes halved further until the one-shot area takes at most a quarter
/// of the budget, since with many ranks (one inbox per sender and parity)
/// it would otherwise crowd out the channels that carry large messages;
/// then channels dropped one by one; last the inboxes down to 64 KiB and
/// slots down to 4 KiB. Whatever the budget, one channel of the smallest
/// slots remains, so no call fails for it; the caller reports a budget it
/// could not meet. A pure function of the agreed layout and budget, so
/// every rank computes the same.
pub(super) fn fit_budget(layout: Layout, budget: u64) -> Layout {
    let mut l = layout;
    let over = |l: &Layout| l.total() > budget;
    let halve = |v: u64, floor: u64| (v / 2).max(floor) / 64 * 64;
    while over(&l) && l.direct && l.oneshot_bytes > BUDGET_ONESHOT_FLOOR {
        l.oneshot_bytes = halve(l.oneshot_bytes, BUDGET_ONESHOT_FLOOR);
    }
    while over(&l) && l.slot_bytes > BUDGET_SLOT_FLOOR {
        l.slot_bytes = halve(l.slot_bytes, BUDGET_SLOT_FLOOR);
    }
    while over(&l)
        && l.direct
        && l.oneshot_bytes > BUDGET_ONESHOT_MIN
        && l.oneshot_area_bytes() > budget / 4
    {
        l.oneshot_bytes = halve(l.oneshot_bytes, BUDGET_ONESHOT_MIN);
    }
    while over(&l) && l.channels > 1 {
        l.channels -= 1;
    }
    while over(&l) && l.direct && l.oneshot_bytes > BUDGET_ONESHOT_MIN {
        l.oneshot_bytes = halve(l.oneshot_bytes, BUDGET_ONESHOT_MIN);
    }
    while over(&l) && l.slot_bytes > BUDGET_SLOT_MIN {
        l.slot_bytes = halve(l.slot_bytes, BUDGET_SLOT_MIN);
    }
    l
}

/// Where every connector lives, identical on all ranks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub nranks: u64,
    pub channels: u64,
    pub slots: u64,
    pub slot_bytes: u64,
    /// Whether the block ends with the one-shot area (P2P only).
    pub direct: bool,
    /// Largest one-shot per rank (bytes) the inboxes hold: Simple up to
    /// this, LL up to [`oneshot_ll_bytes`](Self::oneshot_ll_bytes).
    /// [`ONESHOT_MAX_BYTES`] unless a memory budget asks for less.
    pub oneshot_bytes: u64,
}

impl Layout {
    pub(super) fn conn_bytes(&self) -> u64 {
        CONN_HEADER + self.slots * self.slot_bytes
    }
    pub(super) fn heads_bytes(&self) -> u64 {
        self.channels * self.nranks * HEAD_STRIDE
    }
    /// The head word the receiver `receiver` writes, in the sender's area.
    pub(super) fn head_off(&self, c: u64, receiver: u64) -> u64 {
        (c * self.nranks + receiver) * HEAD_STRIDE
    }
    /// The connector from `sender`, in the receiver's area.
    pub(super) fn conn_off(&self, c: u64, sender: u64) -> u64 {
        self.heads_bytes() + (c * self.nranks + sender) * self.conn_bytes()
    }
    pub(super) fn fifo_total(&self) -> u64 {
        self.heads_bytes() + self.channels * self.nranks * self.conn_bytes()
    }
    /// Start of the one-shot area: the launch counter, then per parity, flags
    /// and one inbox per sender.
    pub(super) fn oneshot_off(&self) -> u64 {
        self.fifo_total().div_ceil(4096) * 4096
    }
    /// Largest LL one-shot per rank (bytes).
    pub(super) fn oneshot_ll_bytes(&self) -> u64 {
        self.oneshot_bytes.min(ONESHOT_LL_MAX_BYTES)
    }
    /// Bytes of one sender's inbox: Simple data, then the LL lines (a
    /// header line per block, then one 16-byte line per 8 data bytes).
    pub(super) fn oneshot_box_bytes(&self) -> u64 {
        self.oneshot_bytes + (LL_HEADER_LINES + self.oneshot_ll_bytes().div_ceil(8)) * 16
    }
    pub(super) fn oneshot_parity_bytes(&self) -> u64 {
        ONESHOT_FLAGS_BYTES + self.nranks * self.oneshot_box_bytes()
    }
    /// Flags `[sender][..]` of parity 0, relative to the one-shot area.
    pub(super) fn oneshot_flags(&self, sender: u64) -> u64 {
        ONESHOT_CTL_BYTES + sender * ONESHOT_MAX_BLOCKS * 16
    }
    /// Inbox of `sender` for parity 0, relative to the one-shot area.
    pub(super) fn oneshot_inbox(&self, sender: u64) -> u64 {
        ONESHOT_CTL_BYTES + ONESHOT_FLAGS_BYTES + sender * self.oneshot_box_bytes()
    }
    /// Bytes of the one-shot area: the counter and both parities.
    pub(super) fn oneshot_area_bytes(&self) -> u64 {
        ONESHOT_CTL_BYTES + 2 * self.oneshot_parity_bytes()
    }
    pub(super) fn total(&self) -> u64 {
        if self.direct {
            self.oneshot_off() + self.oneshot_area_bytes()
        } else {
            self.fifo_total()
        }
    }
}

/// A connector whose FIFO (tail word, meta words, slots) starts at `base`
/// and whose head word, written by the receiver, is at `head`.
pub(super) fn conn(base: u64, head: u64) -> GcConn {
    GcConn {
        data: base + CONN_HEADER,
        meta: base + CONN_META_OFF,
        tail: base + CONN_TAIL_OFF,
        head,
        ..GcConn::default()
    }
}

/// The FIFO areas of our node's ranks in our address space, as rank `rank`
/// sees them: `bases[r]` is rank `r`'s area (its P2P block mapped through
/// IPC, or its SHM segment's FIFOs), 0 for ranks on other nodes. Every
/// offset comes from the agreed layout, so a sender's connector and its
/// receiver's are the same memory.
#[derive(Debug, Clone)]
pub(super) struct FifoAreas {
    pub rank: usize,
    pub layout: Layout,
    pub bases: Vec<u64>,
}

impl FifoAreas {
    /// The connectors `(send, recv)` of channel `c` with `peer`: each FIFO
    /// in its receiver's area, its head word in its sender's. `None` for
    /// our own rank and ranks whose area is not mapped here.
    pub(super) fn conns(&self, c: u64, peer: usize) -> Option<(GcConn, GcConn)> {
        let (me, mine) = (self.rank as u64, *self.bases.get(self.rank)?);
        let theirs = *self.bases.get(peer)?;
        if peer == self.rank || mine == 0 || theirs == 0 {
            return None;
        }
        let (l, p) = (&self.layout, peer as u64);
        let send = conn(theirs + l.conn_off(c, me), mine + l.head_off(c, p));
        let recv = conn(mine + l.conn_off(c, p), theirs + l.head_off(c, me));
        Some((send, recv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_sharing_a_gpu_fit_on_its_multiprocessors() {
        assert_eq!(co_resident_channels(1, 132), None);
        assert_eq!(co_resident_channels(4, 0), None);
        assert_eq!(co_resident_channels(2, 132), Some(66));
        assert_eq!(co_resident_channels(4, 132), Some(33));
        // Never zero, even with more ranks than SMs.
        assert_eq!(co_resident_channels(200, 132), Some(1));
        // 8 ranks on 2 GPUs of one host, one GPU with 5 of them.
        assert_eq!(busiest_gpu(&[7, 9, 7, 7, 9, 7, 9, 7]), 5);
        assert_eq!(busiest_gpu(&[1, 2, 3]), 1);
        assert_eq!(busiest_gpu(&[]), 1);
        for sharers in 2..=16 {
            let c = co_resident_channels(sharers, 132).unwrap();
            assert!(c * sharers <= 132);
        }
    }

    #[test]
    fn a_memory_budget_shrinks_inboxes_and_slots_before_channels() {
        for nranks in [2u64, 4, 8] {
            let full = Layout {
                nranks,
                channels: 132 / nranks,
                slots: FIFO_SLOTS as u64,
                slot_bytes: 256 << 10,
                direct: true,
                oneshot_bytes: ONESHOT_MAX_BYTES,
            };
            // A budget the layout already fits changes nothing.
            let same = fit_budget(full, full.total());
            assert_eq!(
                (same.channels, same.slot_bytes),
                (full.channels, full.slot_bytes)
            );
            assert_eq!(same.oneshot_bytes, ONESHOT_MAX_BYTES);
            let smallest = Layout {
                channels: 1,
                slot_bytes: BUDGET_SLOT_MIN,
                oneshot_bytes: BUDGET_ONESHOT_MIN,
                ..full
            };
            for mib in [1u64, 8, 16, 32, 64, 128, 256, 300] {
                let budget = mib << 20;
                let f = fit_budget(full, budget);
                let what = format!("{nranks} ranks, {mib} MiB: {f:?} needs {}", f.total());
                assert!(f.channels >= 1 && f.slot_bytes >= BUDGET_SLOT_MIN, "{what}");
                assert!(
                    f.slot_bytes % 64 == 0 && f.oneshot_bytes % 64 == 0,
                    "{what}"
                );
                assert!(
                    f.total() <= budget || f.total() == smallest.total(),
                    "{what}"
                );
                // Inboxes shrink to their floor before slots, slots before
                // channels.
                if f.slot_bytes < full.slot_bytes {
                    assert!(f.oneshot_bytes <= BUDGET_ONESHOT_FLOOR, "{what}");
                }
                // Channels go only once slots are at their floor and the
                // one-shot area is within a quarter of the budget.
                if f.channels < full.channels {
                    assert!(f.slot_bytes <= BUDGET_SLOT_FLOOR, "{what}");
                    assert!(
                        f.oneshot_bytes == BUDGET_ONESHOT_MIN
                            || f.oneshot_area_bytes() <= budget / 4,
                        "{what}"
                    );
                }
                // One more channel would not have fitted.
                if f.slot_bytes == BUDGET_SLOT_FLOOR && f.channels > 1 && f.channels < full.channels
                {
                    let more = Layout {
                        channels: f.channels + 1,
                        ..f
                    };
                    assert!(more.total() > budget, "{what}");
                }
                // The LL inbox never outgrows the Simple one.
                assert!(f.oneshot_ll_bytes() <= f.oneshot_bytes, "{what}");
            }
            // A budget below the flags and headers alone gets the smallest.
            assert_eq!(fit_budget(full, 4096).total(), smallest.total());
        }
    }

    #[test]
    fn a_64_mib_budget_keeps_channels_at_two_ranks_and_eight() {
        // 64 MiB at 2 ranks keeps the 1 MiB one-shot and many channels.
        let two = Layout {
            nranks: 2,
            channels: 66,
            slots: FIFO_SLOTS as u64,
            slot_bytes: 256 << 10,
            direct: true,
            oneshot_bytes: ONESHOT_MAX_BYTES,
        };
        let f = fit_budget(two, 64 << 20);
        assert_eq!(
            (f.oneshot_bytes, f.slot_bytes),
            (1 << 20, BUDGET_SLOT_FLOOR)
        );
        assert!(f.channels >= 48, "{f:?}");
        // 64 MiB at 8 ranks: the one-shot area gives way to the channels.
        let eight = Layout {
            nranks: 8,
            channels: 16,
            ..two
        };
        let f = fit_budget(eight, 64 << 20);
        assert!(f.total() <= 64 << 20, "{f:?}");
        assert!(f.oneshot_area_bytes() <= 16 << 20, "{f:?}");
        assert!(f.channels >= 12, "{f:?}");
    }
}
