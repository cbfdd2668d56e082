//! NET's row of the transport table: it accepts every rank on another
//! node, and comes up in two stages around the connector tables. The
//! first (bring-up stages 4b and 4c) allocates the NET block, takes the
//! private MPI duplicate its proxy talks over and, with collnet's rails,
//! one rail communicator per channel, then measures a NET hop and the
//! rail's all-reduce so the tuner weighs ring, tree and collnet on this
//! cluster's figures. The second ([`Owner::start`], after the tables)
//! starts the proxy thread, last, so that nothing fails after it but its
//! own start.

use super::{alloc_block, ActiveGuard, NetBlock, NetLayout, NetProxy, RailJob};
use crate::backend::cuda::abi::GcConn;
use crate::backend::cuda::transport::{Facts, Kind, Measured, Owned, Owner, Stage, Transport};
use crate::backend::shared::calibrate;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::tune::caps::{links, LinkCost};

/// The NET row of the transport table.
pub(crate) struct Net;

impl Transport for Net {
    fn name(&self) -> &'static str {
        "net"
    }

    fn can_connect(&self, facts: &Facts<'_>, peer: usize) -> bool {
        !facts.on_our_node(peer)
    }

    /// The agreed measurement, else the MPI figure of the link tables.
    fn cost(&self, measured: Option<Measured>) -> LinkCost {
        measured.map_or(links::MPI_NET, |m| m.hop)
    }

    fn bring_up(&self, stage: &Stage<'_>) -> Result<Owned> {
        let (topo, mpi, l) = (stage.topo, stage.mpi, stage.layout);
        let layout = NetLayout {
            peers: stage.route.peers_of(Kind::Net),
            channels: l.channels,
            slots: l.slots,
            slot_bytes: l.slot_bytes,
            // collnet's rails wherever there are several nodes.
            rail: topo.nnodes() > 1,
        };
        // Stage 4b: the block (staging and receive FIFOs of every
        // inter-node pair, in pinned host memory mapped into the GPU) and
        // the communicators. The rails: one communicator per channel of the
        // ranks with our local index, ordered by node (as the host
        // backend's), so channels never interleave their all-reduces.
        let parts = mpi.dup().and_then(|comm| {
            let rails = if layout.rail {
                let rail = mpi
                    .split(Some(topo.local_rank() as u32), topo.node() as i32)?
                    .ok_or_else(|| {
                        Error::Backend("MPI_Comm_split gave no rail communicator".into())
                    })?;
                (0..layout.channels)
                    .map(|_| rail.dup())
                    .collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            alloc_block(&layout).map(|(m, d)| (m, d, comm, rails))
        });
        let (block, dev, comm, rails) = stage.agree(parts, "set up their NET connectors")?;
        // Stage 4c: every rank adopts the slowest rank's figures.
        let measured = match rails.first() {
            Some(r) => {
                let t = std::time::Instant::now();
                let m = stage.agree(calibrate::measure(r), "measure inter-node costs")?;
                let bridge = links::CUDA_NET_BRIDGE_US;
                let (hop, rail) = calibrate::agreed_costs(mpi, m, topo.nnodes(), t, bridge)?;
                Some(Measured { hop, rail })
            }
            None => None,
        };
        Ok(Owned::Net(NetOwner {
            rank: topo.rank,
            layout,
            dev,
            measured,
            parts: Some((block, comm, rails)),
            proxy: None,
        }))
    }
}

/// The NET connectors of one backend: the block, then its proxy.
pub(crate) struct NetOwner {
    rank: usize,
    pub layout: NetLayout,
    /// The block's device address.
    dev: u64,
    /// The agreed costs measured at bring-up (with rails).
    pub measured: Option<Measured>,
    /// Until the proxy starts: the block and the communicators it will
    /// talk over.
    parts: Option<(NetBlock, MpiComm, Vec<MpiComm>)>,
    /// The proxy thread, which owns the block once started.
    proxy: Option<NetProxy>,
}

impl NetOwner {
    /// See `Transports::begin`.
    pub(crate) fn begin(&self) -> Option<ActiveGuard> {
        self.proxy.as_ref().map(NetProxy::begin)
    }

    /// See `Transports::push_rail_jobs`.
    pub(crate) fn push_rail_jobs(&self, jobs: &[(usize, RailJob)]) -> Result<()> {
        match &self.proxy {
            Some(p) => p.push_rail_jobs(jobs),
            None => Err(Error::Backend("the NET proxy is not running".into())),
        }
    }
}

impl Owner for NetOwner {
    fn conns(&self, c: u64, peer: usize) -> Option<(GcConn, GcConn)> {
        self.layout.conns(c, peer, self.rank, self.dev)
    }

    fn start(&mut self, stage: &Stage<'_>) -> Result<()> {
        let Some((block, comm, rails)) = self.parts.take() else {
            return Ok(());
        };
        let topo = stage.topo;
        let started = NetProxy::start(
            comm,
            rails,
            self.layout.clone(),
            block,
            stage.segs.to_vec(),
            topo.local_rank(),
            topo.rank,
        );
        // A proxy that started where another rank failed is stopped
        // (joined, requests cancelled) inside `agree`.
        self.proxy = Some(stage.agree(started, "start their NET proxy thread")?);
        Ok(())
    }

    fn error(&self) -> Option<Error> {
        self.proxy.as_ref().and_then(NetProxy::error)
    }

    /// Our kernels may have finished with pieces still in our staging
    /// FIFOs that a peer's kernel waits for: the proxy runs until then.
    fn held_by_peers(&self) -> bool {
        self.proxy.is_some()
    }

    /// Stop the proxy and cancel its posted receives (it leaks the block
    /// if MPI might still write into it).
    fn release(&mut self, _: bool, _: usize) {
        if let Some(p) = self.proxy.as_mut() {
            let _ = p.stop();
        }
    }
}
