//! What the backend tells the tuner: protocols, channels, FIFO geometry
//! and the per-channel link costs of each transport.

use super::layout::{Layout, Transport, FIFO_SLOTS};
use crate::tune::caps::links::{
    CUDA_LAUNCH_US as LAUNCH_US, CUDA_P2P as INTRA_P2P, CUDA_SHM as INTRA_SHM, MPI_NET as INTER,
};
use crate::tune::caps::{BackendCaps, LinkCost};
use crate::tune::Protocol;

/// The capabilities of a backend with this agreed layout and transport;
/// `measured`: with several nodes, the agreed (NET hop, rail all_reduce)
/// costs measured at creation (the NET layout then has collnet's rails).
pub(super) fn caps(
    layout: &Layout,
    transport: Transport,
    measured: Option<(LinkCost, LinkCost)>,
) -> BackendCaps {
    BackendCaps {
        protocols: vec![Protocol::Simple],
        oneshot_protocols: if layout.direct {
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
        inter: measured.map_or(INTER, |m| m.0),
        launch_us: LAUNCH_US,
        direct: layout.direct,
        // Rail steps (collnet) go through the NET proxy to MPI's own
        // all-reduce (`net/rail.rs`); the tuner hands work to it only where
        // the measured rail is several times cheaper than the NET path.
        collnet: measured.is_some(),
        rail: measured.map_or(crate::tune::caps::links::MPI_RAIL, |m| m.1),
        // Copy-engine collectives use the direct path's mapped peers.
        copy_engine: layout.direct.then_some(crate::tune::caps::links::CUDA_CE),
    }
}
