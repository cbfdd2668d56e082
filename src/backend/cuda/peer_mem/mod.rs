//! Peer memory: everything that reads or writes another rank's buffers
//! where they lie, without FIFOs. Exporting and importing allocations
//! (`registry.rs`, `register.rs`, `vmm.rs`, `fdpass.rs`), the per-call
//! rendezvous that names them (`board.rs`), the peer kernels on registered
//! buffers (`peer.rs`), the copy-engine collectives (`schedule.rs`,
//! `run.rs`), and the device side of point-to-point messages (`p2p.rs`).
//!
//! Copy-engine collectives: all_gather, all_to_all, broadcast, gather and
//! scatter on one node with every peer mapped, moved by the GPU's DMA
//! engines instead of a kernel, so they take no SMs from the program's
//! own kernels running beside them.
//!
//! One call, on the submission's stream (ours or the caller's):
//!
//! 1. **Rendezvous on the host** (`board.rs`): every rank posts the
//!    receive buffer its peers push into (its allocation's IPC handle, its
//!    buffer ID and the offset), then reads every peer's post of the same
//!    call. Its sequence number and a digest of the call must match (a
//!    peer that issued another call is `ProtocolMismatch`); a peer that
//!    never posts ends in `Timeout` after `GPUCOLL_TIMEOUT`, or at once in
//!    `PeerFailed` when the node's abort word rises or its process died.
//!    Peers' allocations are opened once and cached (`registry.rs`).
//!    An output that cannot be exported (a pool allocation, a VMM one not
//!    shared yet, or a small allocation the driver packed with others
//!    into a shared block) is received in a bounce buffer of ours and
//!    copied out afterwards; a VMM one is offered beside it (`vmm.rs`).
//! 2. **Ready** (stream memory operations on host-mapped flags): each rank
//!    raises `ready` in every sender's segment once its stream reached
//!    the call (its output may be overwritten), then waits for the
//!    `ready` of everyone it pushes to.
//! 3. **Copies** (`schedule.rs`, `run.rs`): the pushes into the peers' outputs and
//!    the local copy; from `LANE_MIN_BYTES` on split into pieces so that
//!    several copy engines run at once. One `cuMemcpyBatchAsync` (looked
//!    up at run time, CUDA 13 drivers) where it may be used; else one
//!    `cuMemcpyDtoDAsync` per piece, over `LANES` streams forked from and
//!    joined to the submission's stream (CUDA-graph capture, the legacy
//!    default stream, `GPUCOLL_CE_BATCH=0`).
//! 4. **Done**: each rank raises `done` in the segment of everyone it
//!    pushed to, then waits for the `done` of everyone pushing to it
//!    (which follows their copies in their streams' order).
//!
//! VMM allocations (`cuMemCreate`) cannot be exported as IPC handles: a
//! registration, or the copy-engine calls receiving into them, share them
//! as file descriptors instead (`vmm.rs`), over links between the ranks
//! that bring-up authenticated (`fdmesh.rs`, `fdpass.rs`).
//!
//! Every stream operation is captured into CUDA graphs like kernels are;
//! the flags are reset by the waiter, so replays repeat the same stores.
//! Registration (`register.rs`) is a copy-engine call without copies: it
//! posts a buffer and opens the peers' for as long as it lives.
//!
//! The peer kernels (`peer.rs`) share this machinery: all_reduce,
//! reduce_scatter, all_gather and broadcast on buffers every rank posted
//! (input and output) run as one kernel reading the peers' inputs and
//! writing their outputs, between the same two stream hand-shakes.
//!
//! When a call cannot complete (a failure of the node, a timeout), the
//! waits are released by the host storing into the flags
//! (`CudaShared::ce_release`, `run.rs`), and the communicator is failed.

mod board;
mod fdmesh;
mod fdpass;
mod p2p;
mod peer;
mod register;
mod registry;
mod run;
mod schedule;
mod vmm;

use super::handles::{Event, Stream};
use crate::config::RegisteredMode;
pub(super) use board::MAX_RANKS;
pub(super) use fdmesh::FdMesh;
pub(crate) use p2p::PeerMoves;
use registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Mutex;

/// The parsers of what peers write (board posts, descriptor messages, the
/// socket name exchange), for `crate::fuzzing`.
pub(crate) mod parsers {
    pub(crate) use super::board::parse_post;
    pub(crate) use super::fdmesh::parse_names as socket_names;
    pub(crate) use super::fdpass::parse_message as fd_message;
}

/// The copy-engine state of one communicator.
pub(super) struct CopyEngines {
    /// Whether any call ran: only then do failures release the flags.
    used: AtomicBool,
    /// Whether a registration ever completed on this communicator (the
    /// same on every rank: registration is collective): under
    /// `GPUCOLL_REGISTERED=auto` only then do calls look for registered
    /// buffers (`peer.rs`).
    registered_ever: AtomicBool,
    /// `GPUCOLL_REGISTERED` (agreed across ranks).
    peer_mode: RegisteredMode,
    /// Calls the peer kernels ran (the first is logged at info).
    peer_calls: AtomicU64,
    /// Batch copies allowed (`GPUCOLL_CE_BATCH`, default on; off after
    /// the driver refused one).
    batch: AtomicBool,
    /// Batches the driver refused in a row: at [`run::BATCH_MAX_REFUSALS`]
    /// batch copies are turned off.
    batch_refusals: AtomicU32,
    /// The links VMM descriptors pass over, set up at bring-up (None:
    /// not a single-node communicator, or the links did not come up on
    /// every rank; then no rank shares VMM memory directly).
    mesh: Option<FdMesh>,
    state: Mutex<State>,
}

pub(super) struct State {
    /// Copy-engine calls so far, the same count on every rank.
    calls: u64,
    registry: Registry,
    /// Created at the first call that uses them.
    lanes: Vec<Stream>,
    fork: Option<Event>,
    joins: Vec<Event>,
}

impl CopyEngines {
    /// Nothing set up yet but the descriptor links, for a backend on GPU
    /// `device`; `batch`: batched driver copies (`Config::ce_batch`).
    pub(super) fn new(
        device: i32,
        peer_mode: RegisteredMode,
        batch: bool,
        mesh: Option<FdMesh>,
    ) -> CopyEngines {
        CopyEngines {
            used: AtomicBool::new(false),
            registered_ever: AtomicBool::new(false),
            peer_mode,
            peer_calls: AtomicU64::new(0),
            batch: AtomicBool::new(batch),
            batch_refusals: AtomicU32::new(0),
            mesh,
            state: Mutex::new(State {
                calls: 0,
                registry: Registry::new(device),
                lanes: Vec::new(),
                fork: None,
                joins: Vec::new(),
            }),
        }
    }
}
