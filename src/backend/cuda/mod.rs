//! The CUDA backend (feature `cuda`): plans executed by one generic
//! step-interpreter kernel per datatype (`kernels/coll.cu`), one block per
//! channel, over FIFO connectors in device memory shared with CUDA IPC (or,
//! with `GPUCOLL_P2P_DISABLE=1`, in host shared memory mapped into every
//! GPU).
//!
//! Layering: [`driver`] is the only module that calls `cudarc::driver::sys`;
//! [`memory`] (contexts, RAII allocations, [`DeviceBuffer`]), `shm` (the
//! per-rank control segments) and `backend` ([`CudaBackend`]) build on it.
//! Nothing here panics or touches the driver before checking that
//! `libcuda.so` is present ([`available`]).
//!
//! With P2P and 2..=8 ranks on one node the backend also offers the direct
//! path (`BackendCaps::direct`): all_reduce up to
//! [`crate::tune::model::DIRECT_ONESHOT_MAX_BYTES`] runs as a one-shot
//! kernel over IPC-mapped inboxes (`gc_direct_ar_*`).
//!
//! Multi-node communicators (real nodes, or `GPUCOLL_SIM_NODES`): peers on
//! the rank's own node use P2P or SHM as above; peers on other nodes use
//! NET connectors (`net`): FIFOs in the rank's own pinned host memory,
//! bridged over MPI point-to-point by a proxy thread (needs
//! `MPI_THREAD_MULTIPLE`). No direct path there.
//!
//! Limits: Simple protocol only.

mod abi;
mod backend;
pub(crate) mod driver;
#[allow(dead_code)] // the backend split (next commit) uses the rest
mod handles;
mod memory;
mod net;
mod shm;
mod stream;

pub use backend::{p2p_disabled, CudaBackend, FIFO_SLOTS};
pub(crate) use memory::bind;
pub use memory::{
    allocation_range, device_count, memory_kind_of, DeviceBuffer, DeviceView, DeviceViewMut,
};
pub use stream::{CudaGraph, CudaStream};

/// Whether a CUDA driver is loadable and shows at least one GPU.
pub fn available() -> bool {
    driver::available() && device_count() > 0
}
