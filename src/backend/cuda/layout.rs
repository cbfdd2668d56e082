//! Memory layout of the connectors, identical on every rank: how many
//! channels and slots, how big a slot is, where each FIFO, head word and
//! one-shot inbox lives in a rank's block, and the connector tables
//! (`GcConn`) built from those offsets. Pure arithmetic, unit-tested.

use super::abi::*;
use super::launch::THREADS;
use super::net::NetLayout;
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
/// (smallest of all ranks).
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
pub(super) const MAX_CHANNELS_SHM: usize = 4;
pub(super) const SLOT_BYTES_SHM: usize = 64 << 10;
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
/// Largest one-shot all_reduce (bytes); the inboxes are sized for it.
pub(super) const ONESHOT_MAX_BYTES: u64 = crate::tune::model::ONESHOT_MAX_BYTES;
/// Bytes of one parity's flags: `[sender][block]` of `GcFlag` (16 bytes).
pub(super) const ONESHOT_FLAGS_BYTES: u64 = ONESHOT_MAX_RANKS as u64 * ONESHOT_MAX_BLOCKS * 16;
/// Largest LL one-shot all_reduce (bytes).
pub(super) const ONESHOT_LL_MAX_BYTES: u64 = crate::tune::model::ONESHOT_LL_MAX_BYTES;
/// Bytes of one LL inbox: a header line per block, then one 16-byte line
/// per 8 data bytes.
pub(super) const ONESHOT_LL_BOX_BYTES: u64 = (LL_HEADER_LINES + ONESHOT_LL_MAX_BYTES / 8) * 16;
/// Bytes of one sender's inbox: Simple data, then the LL lines.
pub(super) const ONESHOT_BOX_BYTES: u64 = ONESHOT_MAX_BYTES + ONESHOT_LL_BOX_BYTES;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    P2p,
    Shm,
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
    pub(super) fn oneshot_parity_bytes(&self) -> u64 {
        ONESHOT_FLAGS_BYTES + self.nranks * ONESHOT_BOX_BYTES
    }
    /// Flags `[sender][..]` of parity 0, relative to the one-shot area.
    pub(super) fn oneshot_flags(&self, sender: u64) -> u64 {
        ONESHOT_CTL_BYTES + sender * ONESHOT_MAX_BLOCKS * 16
    }
    /// Inbox of `sender` for parity 0, relative to the one-shot area.
    pub(super) fn oneshot_inbox(&self, sender: u64) -> u64 {
        ONESHOT_CTL_BYTES + ONESHOT_FLAGS_BYTES + sender * ONESHOT_BOX_BYTES
    }
    pub(super) fn total(&self) -> u64 {
        if self.direct {
            self.oneshot_off() + ONESHOT_CTL_BYTES + 2 * self.oneshot_parity_bytes()
        } else {
            self.fifo_total()
        }
    }
}

/// The connector tables `(send, recv)`, indexed `[channel * nranks + peer]`,
/// as rank `rank` sees them (at its own index: the rail pair, if any). `bases[r]`: rank `r`'s P2P/SHM area in our
/// address space (for ranks of our node); `net_dev`: our NET block. Every
/// offset comes from the agreed layouts, so a sender's connector and its
/// receiver's are the same memory.
pub(super) fn conn_tables(
    rank: usize,
    layout: &Layout,
    bases: &[u64],
    net: &NetLayout,
    net_dev: u64,
) -> (Vec<GcConn>, Vec<GcConn>) {
    let n = layout.nranks as usize;
    let me = rank as u64;
    let mut send = vec![GcConn::default(); layout.channels as usize * n];
    let mut recv = vec![GcConn::default(); layout.channels as usize * n];
    let conn = |base: u64, head: u64| GcConn {
        data: base + CONN_HEADER,
        meta: base + CONN_META_OFF,
        tail: base + CONN_TAIL_OFF,
        head,
        ..GcConn::default()
    };
    for c in 0..layout.channels {
        if let Some(i) = net.rail_index() {
            // Our own index: the channel's rail pair (collnet), bridged by
            // the proxy to MPI's all-reduce (`net/rail.rs`).
            let k = c as usize * n + rank;
            recv[k] = conn(net_dev + net.recv_conn(c, i), net_dev + net.recv_head(c, i));
            send[k] = conn(net_dev + net.send_conn(c, i), net_dev + net.send_head(c, i));
        }
        for p in (0..n).filter(|&p| p != rank) {
            let k = c as usize * n + p;
            let pu = p as u64;
            if let Some(i) = net.index_of(p) {
                // NET: both connectors in our NET block; the proxy moves the
                // pieces between our staging FIFO and the peer's receive FIFO.
                recv[k] = conn(net_dev + net.recv_conn(c, i), net_dev + net.recv_head(c, i));
                send[k] = conn(net_dev + net.send_conn(c, i), net_dev + net.send_head(c, i));
            } else {
                recv[k] = conn(
                    bases[rank] + layout.conn_off(c, pu),
                    bases[p] + layout.head_off(c, me),
                );
                send[k] = conn(
                    bases[p] + layout.conn_off(c, me),
                    bases[rank] + layout.head_off(c, pu),
                );
            }
        }
    }
    (send, recv)
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

    /// 4 ranks on 2 nodes ({0, 1}, {2, 3}); each rank's P2P area at a
    /// fake address common to all ranks (as if mapped at the same place),
    /// each NET block private to its rank.
    fn tables(rank: usize) -> (Vec<GcConn>, Vec<GcConn>, Layout, NetLayout, u64) {
        let layout = Layout {
            nranks: 4,
            channels: NET_CHANNELS as u64,
            slots: FIFO_SLOTS as u64,
            slot_bytes: SLOT_BYTES_NET as u64,
            direct: false,
        };
        let node = |r: usize| r / 2;
        let bases: Vec<u64> = (0..4)
            .map(|r| {
                if node(r) == node(rank) {
                    (r as u64 + 1) << 40
                } else {
                    0
                }
            })
            .collect();
        let net = NetLayout {
            peers: (0..4).filter(|&r| node(r) != node(rank)).collect(),
            channels: layout.channels,
            slots: layout.slots,
            slot_bytes: layout.slot_bytes,
            rail: true,
        };
        let net_dev = (rank as u64 + 10) << 40;
        let (s, r) = conn_tables(rank, &layout, &bases, &net, net_dev);
        (s, r, layout, net, net_dev)
    }

    #[test]
    fn intra_node_connectors_meet() {
        let t: Vec<_> = (0..4).map(tables).collect();
        let n = 4;
        for (a, b) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
            for c in 0..NET_CHANNELS {
                let s = t[a].0[c * n + b];
                let r = t[b].1[c * n + a];
                assert_eq!(
                    (s.data, s.meta, s.tail, s.head),
                    (r.data, r.meta, r.tail, r.head)
                );
                // In the receiver's area, heads in the sender's.
                assert_eq!(r.tail >> 40, b as u64 + 1);
                assert_eq!(s.head >> 40, a as u64 + 1);
            }
        }
    }

    #[test]
    fn inter_node_and_rail_connectors_stay_in_the_own_net_block() {
        for rank in 0..4 {
            let (send, recv, layout, net, dev) = tables(rank);
            let n = 4;
            let mut words = Vec::new();
            for c in 0..layout.channels as usize {
                // The NET peers' pairs and, at our own index, the rail's.
                for p in net.peers.iter().copied().chain([rank]) {
                    for conn in [send[c * n + p], recv[c * n + p]] {
                        for a in [conn.data, conn.meta, conn.tail, conn.head] {
                            assert!(a >= dev && a < dev + net.total(), "rank {rank} peer {p}");
                        }
                        let last = conn.data + layout.slots * layout.slot_bytes;
                        assert!(last <= dev + net.total());
                        words.extend([conn.tail, conn.head, conn.data]);
                    }
                }
            }
            words.sort_unstable();
            let len = words.len();
            words.dedup();
            assert_eq!(words.len(), len, "rank {rank}: NET connectors share words");
        }
    }
}
