//! SHM: connectors between the ranks of one node in host shared memory,
//! for nodes where P2P is disabled (`GPUCOLL_P2P_DISABLE=1`) or a GPU
//! cannot reach its peers. Each rank's receive FIFOs and head words follow
//! the control area of its segment in `/dev/shm` (`cuda/shm.rs`), which
//! every rank of the node maps and registers with CUDA, so kernels reach
//! them as device addresses.
//!
//! Its memory is allocated by bring-up stage 3, which sizes every segment
//! for it ([`Transport::segment_bytes`]): its own stage only takes the
//! addresses. Host memory is slower for the kernels than a peer's device
//! memory, so a single-node communicator on SHM runs a few channels of
//! small slots ([`MAX_CHANNELS`], [`SLOT_BYTES`]); on several nodes NET's
//! geometry, which it shares, stands.

use super::{Facts, Measured, Owned, Owner, Stage, Transport};
use crate::backend::cuda::abi::GcConn;
use crate::backend::cuda::layout::{FifoAreas, Layout};
use crate::backend::cuda::shm::{Segment, CONTROL_BYTES};
use crate::error::Result;
use crate::tune::caps::{links, LinkCost};
use std::sync::Arc;

/// Channels of a single-node communicator on SHM (fewer if they would not
/// fit the busiest GPU together).
const MAX_CHANNELS: usize = 4;
/// Slot bytes of a single-node communicator on SHM.
const SLOT_BYTES: usize = 64 << 10;

/// The SHM row of the transport table.
pub(super) struct Shm;

impl Transport for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn can_connect(&self, facts: &Facts<'_>, peer: usize) -> bool {
        facts.on_our_node(peer)
    }

    fn cost(&self, _: Option<Measured>) -> LinkCost {
        links::CUDA_SHM
    }

    fn shape(&self, proposed: Layout, single_node: bool, co_resident: Option<usize>) -> Layout {
        let (channels, slot_bytes) = if single_node {
            (
                MAX_CHANNELS.min(co_resident.unwrap_or(MAX_CHANNELS)),
                SLOT_BYTES,
            )
        } else {
            (proposed.channels as usize, proposed.slot_bytes as usize)
        };
        Layout {
            channels: channels as u64,
            slot_bytes: slot_bytes as u64,
            direct: false,
            ..proposed
        }
    }

    fn segment_bytes(&self, layout: &Layout) -> usize {
        layout.total() as usize
    }

    fn bring_up(&self, stage: &Stage<'_>) -> Result<Owned> {
        let topo = stage.topo;
        let mut bases = vec![0u64; topo.nranks];
        // Stage 3 registered every segment (agreed), so this cannot fail
        // on one rank alone: no agreement needed.
        for (l, &r) in topo.nodes[topo.node()].iter().enumerate() {
            bases[r] = stage.segs[l].dev_at(CONTROL_BYTES)?;
        }
        Ok(Owned::Shm(ShmOwner {
            _segs: stage.segs.to_vec(),
            areas: FifoAreas {
                rank: topo.rank,
                layout: *stage.layout,
                bases,
            },
        }))
    }
}

/// The FIFOs of every rank of our node, in their segments.
pub(in crate::backend::cuda) struct ShmOwner {
    /// The segments that hold them, kept mapped as long as the connectors
    /// point into them.
    _segs: Vec<Arc<Segment>>,
    /// Every rank's FIFO area in our address space, 0 for ranks on other
    /// nodes.
    areas: FifoAreas,
}

impl Owner for ShmOwner {
    fn conns(&self, c: u64, peer: usize) -> Option<(GcConn, GcConn)> {
        self.areas.conns(c, peer)
    }
}
