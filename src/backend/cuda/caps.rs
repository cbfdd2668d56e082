//! What the backend tells the tuner: protocols, channels, FIFO geometry
//! and the per-channel link costs of each transport.

use super::layout::{Layout, Transport, FIFO_SLOTS};
use crate::backend::{BackendCaps, LinkCost};
use crate::tune::Protocol;

/// Per channel (one block of 512 threads) over NVLink, measured on 2×H200
/// (NV18): 64 channels reach ≈ 330 GB/s on a 1 GiB ring all_reduce, so a
/// channel's share is ≈ 5.2 GB/s; a piece costs ≈ 3 µs of flags.
const INTRA_P2P: LinkCost = LinkCost {
    latency_us: 3.0,
    bandwidth_gbs: 5.5,
};
const INTRA_SHM: LinkCost = LinkCost {
    latency_us: 6.0,
    bandwidth_gbs: 5.0,
};
/// Per channel and inter-node hop (NET: proxy thread + MPI message pair).
/// An estimate, not calibrated yet.
const INTER: LinkCost = LinkCost {
    latency_us: 10.0,
    bandwidth_gbs: 3.0,
};
const LAUNCH_US: f64 = 6.0;

/// The capabilities of a backend with this agreed layout and transport.
pub(super) fn caps(layout: &Layout, transport: Transport) -> BackendCaps {
    BackendCaps {
        protocols: vec![Protocol::Simple],
        direct_protocols: if layout.direct {
            vec![Protocol::Simple, Protocol::LL]
        } else {
            Vec::new()
        },
        max_channels: layout.channels as usize,
        slot_bytes: layout.slot_bytes,
        fifo_slots: FIFO_SLOTS as u64,
        intra: match transport {
            Transport::P2p => INTRA_P2P,
            Transport::Shm => INTRA_SHM,
        },
        inter: INTER,
        launch_us: LAUNCH_US,
        direct: layout.direct,
    }
}
