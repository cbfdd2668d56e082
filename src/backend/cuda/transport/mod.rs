//! The transports of the CUDA backend: how this rank's connectors reach
//! each peer. Every transport answers the same questions ([`Transport`]),
//! and each peer is served by the first transport of [`TABLE`] that
//! accepts it ([`select`]), as in NCCL's transport table:
//!
//! | transport | file | accepts | its memory |
//! |---|---|---|---|
//! | P2P | `p2p.rs` | ranks of our node, when every rank reaches its node's GPUs and none set `GPUCOLL_P2P_DISABLE` | each rank's device block, mapped into its node's peers through CUDA IPC |
//! | SHM | `shm.rs` | ranks of our node | host FIFOs in the node's control segments, registered with CUDA |
//! | NET | `net/` | ranks on other nodes | this rank's pinned host block, bridged over MPI by a proxy thread |
//!
//! A transport decides from facts every rank agreed in bring-up stage 2
//! ([`Facts`]), never from what one rank sees alone, so all ranks select
//! alike and run the same collective stages. Its bring-up stage allocates,
//! exports and maps its memory and returns what owns it ([`Owner`]); the
//! owner gives the connectors per channel and peer that the kernels use
//! (`GcConn`), and its `Drop` releases what was built, so a stage that
//! fails on another rank leaves nothing behind. The transports in use come
//! up in table order (P2P or SHM, then NET), each stage ending in `agree`.
//!
//! The peers of our node share one transport: the node's FIFOs have one
//! layout (channels, slot size, one-shot inboxes), which the transport
//! shapes ([`Transport::shape`]), and P2P's feasibility is agreed for the
//! whole communicator. So the node's transport is the one that accepts our
//! own rank, which stands for any peer of our node: a rank alone on its
//! node still lays out and brings up its node's FIFOs, whose stages are
//! collective.
//!
//! Why a trait with two enums rather than trait objects alone: the rows
//! are unit types behind `&dyn Transport`, as NCCL's table holds structs of
//! function pointers, but the set is closed and compiled in (no plugins),
//! and the submission path needs NET's own calls (the rail queue, the count
//! of launches in flight), which a boxed owner would hide behind a
//! downcast. So [`Kind`] names a transport and [`Owned`] holds an owner;
//! every `match` on them is exhaustive, and a new transport's variant makes
//! the compiler list the places that must answer for it.

use super::abi::GcConn;
use super::exchange::agree;
use super::layout::Layout;
use super::shm::Segment;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::topo::Topology;
use crate::tune::caps::LinkCost;
use std::sync::Arc;

pub(super) mod net;
mod p2p;
mod shm;

use net::{ActiveGuard, NetOwner, RailJob};
pub(super) use p2p::reaches_node_gpus;

/// The transports in priority order: a peer is served by the first that
/// accepts it.
pub(super) const TABLE: [Kind; 3] = [Kind::P2p, Kind::Shm, Kind::Net];

/// A transport's name in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    P2p,
    Shm,
    Net,
}

impl Kind {
    /// What it answers.
    pub(super) fn row(self) -> &'static dyn Transport {
        match self {
            Kind::P2p => &p2p::P2p,
            Kind::Shm => &shm::Shm,
            Kind::Net => &net::Net,
        }
    }
}

/// What every rank agreed that the choice of transports depends on.
pub(super) struct Facts<'a> {
    pub topo: &'a Topology,
    /// No rank set `GPUCOLL_P2P_DISABLE`, and every rank reaches the GPUs
    /// of its node's ranks ([`reaches_node_gpus`], agreed in stage 2).
    pub p2p: bool,
}

impl Facts<'_> {
    /// Whether `peer` is on our node.
    pub(super) fn on_our_node(&self, peer: usize) -> bool {
        self.topo.same_node(self.topo.rank, peer)
    }
}

/// Costs measured at bring-up and agreed by every rank (several nodes
/// only): a NET hop and the rail's all-reduce.
#[derive(Debug, Clone, Copy)]
pub(super) struct Measured {
    pub hop: LinkCost,
    pub rail: LinkCost,
}

/// A row of the table (NCCL's `ncclTransport`).
pub(super) trait Transport: Sync {
    /// Its name in logs.
    fn name(&self) -> &'static str;
    /// Whether it can carry this rank's connectors to `peer`. `peer` may
    /// be our own rank, standing for any peer of our node (the module
    /// header says why).
    fn can_connect(&self, facts: &Facts<'_>, peer: usize) -> bool;
    /// Its cost per channel, for the tuner.
    fn cost(&self, measured: Option<Measured>) -> LinkCost;
    /// The node's FIFO layout when it serves our node: `proposed` is what
    /// the ranks asked for, with the one-shot inboxes where the node and
    /// rank count allow them; `co_resident`: the most channels that fit
    /// the busiest GPU. By default the proposal without the inboxes, which
    /// the one-shot kernels can only write where peers' device memory is
    /// mapped.
    fn shape(&self, proposed: Layout, single_node: bool, co_resident: Option<usize>) -> Layout {
        let _ = (single_node, co_resident);
        Layout {
            direct: false,
            ..proposed
        }
    }
    /// Bytes it keeps in every control segment of our node, after
    /// `shm::CONTROL_BYTES` (stage 3 sizes the segments). Where it keeps
    /// any, the kernels write into peers' segments, so stage 3 registers
    /// them all with CUDA.
    fn segment_bytes(&self, layout: &Layout) -> usize {
        let _ = layout;
        0
    }
    /// Its bring-up stage: allocate, export and map its memory. Collective
    /// over the communicator and ending in `agree` wherever it can fail,
    /// so all ranks fail together; what it built is released before an
    /// error returns.
    fn bring_up(&self, stage: &Stage<'_>) -> Result<Owned>;
}

/// What a transport's bring-up built: it owns the memory (released on
/// drop) and gives the connectors.
pub(super) trait Owner {
    /// The connectors `(send, recv)` of channel `c` to `peer`; `None`
    /// where it has none.
    fn conns(&self, c: u64, peer: usize) -> Option<(GcConn, GcConn)>;
    /// The last bring-up stage, after the connector tables: start what
    /// runs beside the kernels (NET's proxy thread). Collective where it
    /// does anything.
    fn start(&mut self, stage: &Stage<'_>) -> Result<()> {
        let _ = stage;
        Ok(())
    }
    /// Its failure (its thread's), if it failed.
    fn error(&self) -> Option<Error> {
        None
    }
    /// Whether peers' kernels write into its memory, or its thread serves
    /// them, until they finish: teardown then waits for every rank first.
    fn held_by_peers(&self) -> bool {
        false
    }
    /// Teardown, once our own kernels are done: stop what runs, and leak
    /// what peers may still write into unless `peers_idle` (every rank
    /// confirmed its kernels done).
    fn release(&mut self, peers_idle: bool, rank: usize) {
        let _ = (peers_idle, rank);
    }
}

/// An owner, by transport.
pub(super) enum Owned {
    P2p(p2p::P2pOwner),
    Shm(shm::ShmOwner),
    Net(NetOwner),
}

impl Owned {
    fn kind(&self) -> Kind {
        match self {
            Owned::P2p(_) => Kind::P2p,
            Owned::Shm(_) => Kind::Shm,
            Owned::Net(_) => Kind::Net,
        }
    }
    fn owner(&self) -> &dyn Owner {
        match self {
            Owned::P2p(o) => o,
            Owned::Shm(o) => o,
            Owned::Net(o) => o,
        }
    }
    fn owner_mut(&mut self) -> &mut dyn Owner {
        match self {
            Owned::P2p(o) => o,
            Owned::Shm(o) => o,
            Owned::Net(o) => o,
        }
    }
}

/// What a bring-up stage gets: the communicator and what was agreed and
/// built before it.
pub(super) struct Stage<'a> {
    pub mpi: &'a MpiComm,
    pub topo: &'a Topology,
    pub route: &'a Route,
    /// The node's FIFO layout (NET's connectors share its geometry).
    pub layout: &'a Layout,
    /// The control segments of our node's ranks, ours at our local rank.
    pub segs: &'a [Arc<Segment>],
}

impl Stage<'_> {
    /// Whether every rank succeeded `what` (collective).
    pub(super) fn agree<T>(&self, mine: Result<T>, what: &str) -> Result<T> {
        agree(self.mpi, mine, what)
    }
}

/// Which transport serves each peer, and our node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Route {
    rank: usize,
    /// By rank; `None` at our own.
    peers: Vec<Option<Kind>>,
    /// The transport of our node's FIFOs.
    node: Kind,
}

impl Route {
    /// The transport that serves `peer` (`None` for our own rank).
    pub(super) fn of(&self, peer: usize) -> Option<Kind> {
        self.peers.get(peer).copied().flatten()
    }
    /// The transport of our node's FIFOs.
    pub(super) fn node(&self) -> Kind {
        self.node
    }
    /// The peers `kind` serves, ascending.
    pub(super) fn peers_of(&self, kind: Kind) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| self.of(p) == Some(kind))
            .collect()
    }
    /// The transports in use, in table order: our node's, and any that
    /// serves a peer.
    pub(super) fn in_use(&self) -> Vec<Kind> {
        TABLE
            .into_iter()
            .filter(|&k| k == self.node || self.peers.contains(&Some(k)))
            .collect()
    }
}

/// Each peer's transport: the first of [`TABLE`] that accepts it; our
/// node's: the first that accepts our own rank.
pub(super) fn select(facts: &Facts<'_>) -> Result<Route> {
    let first = |peer: usize| {
        TABLE
            .into_iter()
            .find(|k| k.row().can_connect(facts, peer))
            .ok_or_else(|| {
                Error::Backend(format!(
                    "no transport of the CUDA backend reaches rank {peer}"
                ))
            })
    };
    let rank = facts.topo.rank;
    let peers = (0..facts.topo.nranks)
        .map(|p| {
            if p == rank {
                Ok(None)
            } else {
                first(p).map(Some)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Route {
        rank,
        peers,
        node: first(rank)?,
    })
}

/// The connector tables `(send, recv)` of `channels` channels, indexed
/// `[channel * nranks + peer]`: each peer's from the transport `route`
/// gives it (`conns(kind, channel, peer)`), and at our own index the first
/// transport in use that has a connector there (NET's rail pair, for
/// collnet).
pub(super) fn conn_tables(
    route: &Route,
    channels: u64,
    conns: impl Fn(Kind, u64, usize) -> Option<(GcConn, GcConn)>,
) -> Result<(Vec<GcConn>, Vec<GcConn>)> {
    let n = route.peers.len();
    let mut send = vec![GcConn::default(); channels as usize * n];
    let mut recv = vec![GcConn::default(); channels as usize * n];
    let in_use = route.in_use();
    for c in 0..channels {
        for p in 0..n {
            let pair = match route.of(p) {
                Some(k) => Some(conns(k, c, p).ok_or_else(|| {
                    Error::Backend(format!(
                        "the {} transport has no connector to rank {p}",
                        k.row().name()
                    ))
                })?),
                None => in_use.iter().find_map(|&k| conns(k, c, p)),
            };
            if let Some((s, r)) = pair {
                send[c as usize * n + p] = s;
                recv[c as usize * n + p] = r;
            }
        }
    }
    Ok((send, recv))
}

/// The transports of one backend: the route and the owner of each
/// transport in use, in table order.
pub(super) struct Transports {
    route: Route,
    owned: Vec<Owned>,
}

impl Transports {
    /// Bring up every transport in use, in table order; a failure releases
    /// those already up.
    pub(super) fn bring_up(stage: &Stage<'_>) -> Result<Transports> {
        let mut owned = Vec::new();
        for k in stage.route.in_use() {
            owned.push(k.row().bring_up(stage)?);
        }
        Ok(Transports {
            route: stage.route.clone(),
            owned,
        })
    }

    pub(super) fn route(&self) -> &Route {
        &self.route
    }

    fn get(&self, kind: Kind) -> Option<&dyn Owner> {
        self.owned
            .iter()
            .find(|o| o.kind() == kind)
            .map(Owned::owner)
    }

    /// The connector tables (see [`conn_tables`]).
    pub(super) fn tables(&self, channels: u64) -> Result<(Vec<GcConn>, Vec<GcConn>)> {
        conn_tables(&self.route, channels, |k, c, p| self.get(k)?.conns(c, p))
    }

    /// The last bring-up stage, in table order ([`Owner::start`]).
    pub(super) fn start(&mut self, stage: &Stage<'_>) -> Result<()> {
        for o in &mut self.owned {
            o.owner_mut().start(stage)?;
        }
        Ok(())
    }

    /// The first transport's failure, if any failed.
    pub(super) fn error(&self) -> Option<Error> {
        self.owned.iter().find_map(|o| o.owner().error())
    }

    /// Whether teardown must wait for every rank ([`Owner::held_by_peers`]).
    pub(super) fn held_by_peers(&self) -> bool {
        self.owned.iter().any(|o| o.owner().held_by_peers())
    }

    /// Teardown, in table order ([`Owner::release`]).
    pub(super) fn release(&mut self, peers_idle: bool, rank: usize) {
        for o in &mut self.owned {
            o.owner_mut().release(peers_idle, rank);
        }
    }

    /// Every rank's block in our address space where our node's transport
    /// maps peers' device memory (P2P), which the one-shot kernels write
    /// into.
    pub(super) fn mapped_blocks(&self) -> Option<&[u64]> {
        self.owned.iter().find_map(|o| match o {
            Owned::P2p(p) => Some(p.bases()),
            _ => None,
        })
    }

    /// NET's owner, on a communicator of several nodes.
    pub(super) fn net(&self) -> Option<&NetOwner> {
        self.owned.iter().find_map(|o| match o {
            Owned::Net(n) => Some(n),
            _ => None,
        })
    }

    /// The costs NET measured at bring-up, if it did.
    pub(super) fn measured(&self) -> Option<Measured> {
        self.net().and_then(|n| n.measured)
    }

    /// Tell the transports with a thread (NET's proxy) that a launch is in
    /// flight until the guard drops; they then poll eagerly.
    pub(super) fn begin(&self) -> Option<ActiveGuard> {
        self.net().and_then(NetOwner::begin)
    }

    /// Queue a launch's rail steps, `(channel, job)` in step order, before
    /// its kernels are launched.
    pub(super) fn push_rail_jobs(&self, jobs: &[(usize, RailJob)]) -> Result<()> {
        match self.net() {
            Some(n) => n.push_rail_jobs(jobs),
            None => Err(Error::Backend(
                "rail steps on a backend without a NET proxy".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
