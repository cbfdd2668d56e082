//! What the backend tells the tuner: protocols, channels, FIFO geometry
//! and the per-channel link costs, which each transport gives for itself.

use super::layout::{Layout, FIFO_SLOTS};
use super::transport::{Kind, Transports};
use crate::tune::caps::links::CUDA_LAUNCH_US as LAUNCH_US;
use crate::tune::caps::BackendCaps;
use crate::tune::Protocol;

/// The capabilities of a backend with this agreed layout and these
/// transports; with several nodes, NET measured its hop and the rail's
/// all-reduce at creation (the NET layout then has collnet's rails).
pub(super) fn caps(layout: &Layout, transports: &Transports) -> BackendCaps {
    let measured = transports.measured();
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
        intra: transports.route().node().row().cost(measured),
        // NET is the one transport between nodes (on a single node, its
        // table figure).
        inter: Kind::Net.row().cost(measured),
        launch_us: LAUNCH_US,
        direct: layout.direct,
        oneshot_max_bytes: layout.oneshot_bytes,
        // Rail steps (collnet) go through the NET proxy to MPI's own
        // all-reduce (`net/rail.rs`); the tuner hands work to it only where
        // the measured rail is several times cheaper than the NET path.
        collnet: measured.is_some(),
        rail: measured.map_or(crate::tune::caps::links::MPI_RAIL, |m| m.rail),
        // Copy-engine collectives use the direct path's mapped peers.
        copy_engine: layout.direct.then_some(crate::tune::caps::links::CUDA_CE),
    }
}
