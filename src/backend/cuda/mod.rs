//! The CUDA backend (feature `cuda`): plans executed by one generic
//! step-interpreter kernel per datatype (`kernels/coll.cu`), one block per
//! channel, over FIFO connectors in device memory shared with CUDA IPC (or,
//! with `GPUCOLL_P2P_DISABLE=1`, in host shared memory mapped into every
//! GPU).
//!
//! Layering: `driver` is the only module that calls `cudarc::driver::sys`;
//! everything else builds on it. Nothing here panics or touches the driver
//! before checking that `libcuda.so` is present ([`available`]).
//!
//! Where one call goes: `backend` (`Backend::submit`) → `submit` →
//! `staging` (host buffers) → `lower` (plan to step tables) → `upload` →
//! `launch` → `pending` (awaited by `wait`, or by `watchdog` for work on a
//! caller's stream).
//!
//! | file | concern |
//! |---|---|
//! | `backend.rs` | [`CudaBackend`] and its `Backend` implementation |
//! | `bringup.rs` | `CudaBackend::new`/`new_on_device`: the collective bring-up stages, each ending in `agree` so all ranks fail together; it asks `transport/` what each transport does in them |
//! | `exchange.rs` | the setup exchange of bring-up stage 2 (identity, segment nonce, device and layout proposals); `agree` |
//! | `caps.rs` | `BackendCaps` offered to the tuner, with each transport's link cost |
//! | `layout.rs` | connector memory layout, channel/slot sizing, the connectors between a node's FIFO areas |
//! | `state.rs` | `CudaShared`, what a backend owns (the transports' owners among it), its failure state (the shared `Failure` over the node's segments) and its teardown |
//! | `submit.rs` | one submission in phases: open (lower), prepare, upload, launch, record |
//! | `staging.rs` | host buffers staged through device memory |
//! | `lower.rs`, `lower/group.rs` | plan lowering to `GcStep`/`GcChan`/`GcArgs` (pure; CPU tests); the one-shot decision; a group's launches, one per datatype |
//! | `upload.rs` | step tables and group tables copied to the device |
//! | `cache.rs` | pooled work buffers, the step-table cache, a submission's `Resources` |
//! | `launch.rs` | kernel launches |
//! | `module.rs` | the embedded fatbin and its kernels |
//! | `order.rs` | order of submissions across streams; caller-stream checks |
//! | `pending.rs` | `CudaPending`: completion, progress, timeout, abort |
//! | `profile.rs` | `GPUCOLL_PROFILE_HOST=1`: host time per submission phase |
//! | `resident.rs` | the resident block: blocking one-shots posted to a block that stays on the GPU (`GPUCOLL_RESIDENT`) |
//! | `watchdog.rs` | the thread that completes work queued on callers' streams |
//! | `guard.rs` | the thread that watches the node's peers once work was captured into a graph |
//! | `handles.rs` | owning driver handles (module, stream, event, IPC mapping, host registration) |
//! | `driver.rs` | the driver API wrappers; result codes to `Error::Cuda`/`Error::OutOfMemory` |
//! | `memory.rs` | contexts, device/pinned memory, [`DeviceBuffer`] |
//! | `shm.rs` | the per-rank control segments in `/dev/shm` (on `shared::shm::Mapping`) |
//! | `transport/` | the transport seam: the table in priority order, `select`, each transport's bring-up and owner, the connector tables; `p2p.rs`, `shm.rs`, `net/` (NET: `stage.rs` its bring-up, `mod.rs` layout and the proxy's state machine, `thread.rs` the proxy thread and NET block, `rail.rs` collnet's rail pairs) |
//! | `stream.rs` | [`CudaStream`], [`CudaGraph`] |
//! | `abi.rs` | the structs and constants shared with `kernels/coll.cu` |
//! | `peer_mem/` | peer memory: allocation export/import (IPC handles, VMM descriptors), peer kernels on registered buffers, copy-engine collectives: the schedule of copies, the flags and the per-call board in the control segments, the registration caches, the stream sequence |
//!
//! With P2P and 2..=8 ranks on one node the backend also offers the direct
//! path (`BackendCaps::direct`): all_reduce up to
//! `tune::model::ONESHOT_MAX_BYTES` runs as a one-shot
//! kernel over IPC-mapped inboxes (`gc_oneshot_*`), and all_gather,
//! all_to_all, broadcast, gather and scatter may run on the copy engines
//! (`peer_mem/`, `GPUCOLL_CE`): no kernel at all.
//!
//! Multi-node communicators (real nodes, or `GPUCOLL_SIM_NODES`): peers on
//! the rank's own node use P2P or SHM as above; peers on other nodes use
//! NET connectors (`transport/net/`): FIFOs in the rank's own pinned host memory,
//! bridged over MPI point-to-point by a proxy thread (needs
//! `MPI_THREAD_MULTIPLE`). No direct path there.
//!
//! Device choice: the world communicator takes GPU (index among the
//! processes of its host) % (GPU count), so simulated nodes on one host
//! still spread over its GPUs; `split` and `duplicate` stay on the parent's
//! GPU; `from_raw_mpi` takes the device of the calling thread's current
//! CUDA context when one is current, `from_raw_mpi_on_device` the GPU it
//! is given.
//!
//! The backend's own stream is non-blocking. With
//! `Config::legacy_stream_order` (the MPI shim's communicators) it is a
//! blocking stream instead, so its work is ordered after the program's
//! legacy default stream, as an MPI program expects.
//!
//! Limits: step plans run the Simple protocol only (the one-shot kernel
//! also has an LL variant). NET moves pieces through host memory and MPI
//! (no RDMA or GPUDirect). Managed and pool memory reach peers through
//! bounce buffers, not peer mappings. `docs/CUDA_NOTES.md` has the design
//! notes and the measured figures.

mod abi;
mod backend;
mod bringup;
mod cache;
mod caps;
pub(crate) mod driver;
pub(crate) mod exchange;
mod guard;
mod handles;
mod launch;
mod layout;
mod lower;
mod memory;
mod module;
mod order;
mod peer_mem;
mod pending;
mod profile;
mod resident;
mod shm;
mod staging;
mod state;
mod stream;
mod submit;
mod transport;
mod upload;
mod watchdog;

// NET's nouns (the rail's `RailJob`, `NetLayout`) as `super::net` for the
// files that lower and run its steps.
use transport::net;

/// The parsers of bytes that other processes wrote, for `crate::fuzzing`.
pub(crate) mod parsers {
    pub(crate) use super::exchange::parse as setup_exchange;
    pub(crate) use super::peer_mem::parsers::*;
}

pub use backend::CudaBackend;
pub use bringup::p2p_disabled;
pub use layout::FIFO_SLOTS;
pub use memory::{
    allocation_range, device_count, device_memory, memory_kind_of, DeviceBuffer, DeviceView,
    DeviceViewMut,
};
pub(crate) use memory::{bind, current_device};
pub use stream::{CudaGraph, CudaStream};

/// Whether a CUDA driver is loadable and shows at least one GPU.
pub fn available() -> bool {
    driver::available() && device_count() > 0
}
