//! What the backend tells the tuner: protocols, channels, FIFO geometry
//! and the per-channel link costs of each transport.

use super::layout::{Layout, Transport, FIFO_SLOTS};
use crate::tune::caps::links::{
    CUDA_LAUNCH_US as LAUNCH_US, CUDA_P2P as INTRA_P2P, CUDA_SHM as INTRA_SHM, MPI_NET as INTER,
};
use crate::tune::caps::BackendCaps;
use crate::tune::Protocol;

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
        // Rail steps (collnet) need a device-side bridge to MPI that this
        // backend does not have: its inter-node traffic is the NET proxy.
        collnet: false,
        rail: crate::tune::caps::links::MPI_RAIL,
        // Copy-engine collectives use the direct path's mapped peers.
        copy_engine: layout.direct.then_some(crate::tune::caps::links::CUDA_CE),
    }
}
