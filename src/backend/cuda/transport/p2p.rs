//! P2P: connectors between the ranks of one node in device memory. Each
//! rank allocates one block (head words, receive FIFOs and, on a single
//! node, the one-shot inboxes), exports it through CUDA IPC, and maps its
//! node's peers' blocks, so a kernel writes pieces straight into its
//! peer's receive FIFO.
//!
//! Whether P2P works is decided for the whole communicator, not per peer:
//! the node's FIFOs have one layout, so every rank probes the GPUs of its
//! node's ranks ([`reaches_node_gpus`]) and bring-up stage 2 agrees on
//! the result. A rank alone on its node brings up its block too, since
//! the IPC handle exchange is collective.
//!
//! Teardown: peers' kernels write into our block (head credits, FIFO
//! slots, one-shot inboxes) until they finish, so the block is freed only
//! once every rank confirmed its kernels done; otherwise it is leaked.

use super::{Facts, Owned, Owner, Stage, Transport};
use crate::backend::cuda::abi::GcConn;
use crate::backend::cuda::driver;
use crate::backend::cuda::handles::IpcMapping;
use crate::backend::cuda::layout::{FifoAreas, Layout};
use crate::backend::cuda::memory::{DevMem, DeviceCtx};
use crate::error::{Error, Result};
use crate::topo::Topology;
use crate::tune::caps::{links, LinkCost};

/// The P2P row of the transport table.
pub(super) struct P2p;

impl Transport for P2p {
    fn name(&self) -> &'static str {
        "p2p"
    }

    fn can_connect(&self, facts: &Facts<'_>, peer: usize) -> bool {
        facts.p2p && facts.on_our_node(peer)
    }

    fn cost(&self, _: Option<super::Measured>) -> LinkCost {
        links::CUDA_P2P
    }

    /// As proposed, with the one-shot inboxes: peers' blocks are mapped.
    fn shape(&self, proposed: Layout, _: bool, _: Option<usize>) -> Layout {
        proposed
    }

    fn bring_up(&self, stage: &Stage<'_>) -> Result<Owned> {
        let (rank, nranks) = (stage.topo.rank, stage.topo.nranks);
        let block = DevMem::zeroed(stage.layout.total() as usize)
            .and_then(|m| driver::ipc_get_handle(m.ptr).map(|h| (m, h)));
        let (block, handle) = stage.agree(block, "allocate and export their FIFO memory")?;
        let handles = stage.mpi.allgather_bytes(&handle)?;
        if handles.len() != nranks * driver::IPC_HANDLE_BYTES {
            return Err(Error::Backend(
                "CUDA IPC handle exchange was truncated".into(),
            ));
        }
        let mut bases = vec![0u64; nranks];
        bases[rank] = block.ptr;
        let mut peers = Vec::new();
        let opened: Result<()> = (|| {
            for r in 0..nranks {
                if r == rank || !stage.topo.same_node(r, rank) {
                    continue;
                }
                let mut hh = [0u8; driver::IPC_HANDLE_BYTES];
                hh.copy_from_slice(
                    &handles[r * driver::IPC_HANDLE_BYTES..(r + 1) * driver::IPC_HANDLE_BYTES],
                );
                let m = IpcMapping::open(&hh)?;
                bases[r] = m.ptr();
                peers.push(m);
            }
            Ok(())
        })();
        // On failure the mappings opened so far close, then the block is freed.
        let owner = P2pOwner {
            _peers: peers,
            block: Some(block),
            areas: FifoAreas {
                rank,
                layout: *stage.layout,
                bases,
            },
        };
        stage.agree(opened, "open their peers' FIFO memory (CUDA IPC)")?;
        Ok(Owned::P2p(owner))
    }
}

/// Whether this rank reaches the GPU of every rank of its node (`ords`:
/// every rank's device ordinal); a failed query counts as no.
pub(in crate::backend::cuda) fn reaches_node_gpus(
    ctx: &DeviceCtx,
    topo: &Topology,
    ords: &[i32],
) -> bool {
    (|| -> Result<bool> {
        for (r, &o) in ords.iter().enumerate() {
            if topo.same_node(r, topo.rank) && o != ctx.ordinal {
                let peer = driver::device_get(o)?;
                if !driver::can_access_peer(ctx.dev, peer)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    })()
    .unwrap_or(false)
}

/// The FIFO memory of every rank of our node. Fields drop in order: the
/// peers' mappings, then our block.
pub(in crate::backend::cuda) struct P2pOwner {
    /// Peers' blocks opened through IPC.
    _peers: Vec<IpcMapping>,
    /// Our block; `None` once leaked.
    block: Option<DevMem>,
    /// Every rank's block in our address space, 0 for ranks on other nodes.
    areas: FifoAreas,
}

impl P2pOwner {
    /// Every rank's block in our address space, 0 for ranks on other nodes.
    pub(super) fn bases(&self) -> &[u64] {
        &self.areas.bases
    }
}

impl Owner for P2pOwner {
    fn conns(&self, c: u64, peer: usize) -> Option<(GcConn, GcConn)> {
        self.areas.conns(c, peer)
    }

    fn held_by_peers(&self) -> bool {
        self.block.is_some()
    }

    fn release(&mut self, peers_idle: bool, rank: usize) {
        if !peers_idle && self.block.is_some() {
            tracing::warn!(
                rank,
                "CUDA backend teardown: peers not confirmed idle; leaking the P2P block"
            );
            std::mem::forget(self.block.take());
        }
    }
}
