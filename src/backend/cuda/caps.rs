//! What the backend tells the tuner: protocols, channels, FIFO geometry
//! and the per-channel link costs of each transport.

use super::layout::{Layout, Transport, FIFO_SLOTS};
use crate::tune::caps::links::{
    CUDA_LAUNCH_US as LAUNCH_US, CUDA_P2P as INTRA_P2P, CUDA_SHM as INTRA_SHM, MPI_NET as INTER,
};
use crate::tune::caps::BackendCaps;
use crate::tune::Protocol;

/// The capabilities of a backend with this agreed layout and transport;
/// `rails`: the NET layout has collnet's rail pairs (several nodes).
pub(super) fn caps(layout: &Layout, transport: Transport, rails: bool) -> BackendCaps {
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
        // Rail steps (collnet) go through the NET proxy to MPI's own
        // all-reduce (`net/rail.rs`). Its cost is not calibrated on this
        // backend yet: `MPI_RAIL` is pessimistic, so collnet is chosen
        // only when forced (`GPUCOLL_ALGO=collnet`).
        collnet: rails,
        rail: crate::tune::caps::links::MPI_RAIL,
        // Copy-engine collectives use the direct path's mapped peers.
        copy_engine: layout.direct.then_some(crate::tune::caps::links::CUDA_CE),
    }
}
