//! # gpucoll
//!
//! MPI-style collectives (all_reduce, reduce, broadcast, all_gather,
//! reduce_scatter, all_to_all, gather, scatter, scan, exclusive_scan;
//! blocking, immediate and grouped) and point-to-point messages ([`p2p`]:
//! send, receive, probe; device memory moved GPU to GPU) with an rsmpi-like
//! API. MPI launches the job and bootstraps the
//! communicators; gpucoll moves the data itself with its own engine:
//! topology, ring/tree graphs, a cost-model tuner, a planner, and backends
//! that execute the plans (the host backend over shared memory and MPI
//! point-to-point; the CUDA backend on GPU memory).
//!
//! ```no_run
//! use gpucoll::prelude::*;
//!
//! let universe = gpucoll::initialize()?;
//! let world = universe.world()?;
//! let send = vec![world.rank() as f32; 1024];
//! let mut sum = vec![0f32; 1024];
//! world.all_reduce_into(&send, &mut sum, ReduceOp::Sum)?;
//! world.process_at_rank(0).broadcast_into(&mut sum)?;
//! # Ok::<(), gpucoll::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

// The user's API: these modules and the re-exports below.
pub mod buffer;
pub mod coll;
pub mod config;
pub mod datatype;
pub mod env;
pub mod error;
pub mod op;
pub mod p2p;
pub mod request;
#[cfg(feature = "rsmpi")]
pub mod rsmpi;

// The engine. Hidden from the API documentation; public only where a
// sibling crate needs them (the GPU check suite drives backends and plans
// directly; the tests and the bench use `reference` as their oracle).
#[doc(hidden)]
pub mod backend;
#[doc(hidden)]
pub mod comm;
pub(crate) mod engine;
#[doc(hidden)]
pub mod graph;
#[doc(hidden)]
pub mod mpi;
#[doc(hidden)]
pub mod plan;
#[doc(hidden)]
pub mod reference;
#[doc(hidden)]
pub mod task;
#[doc(hidden)]
pub mod topo;
#[doc(hidden)]
pub mod tune;
// Every parser of bytes that cross a process boundary, for fuzz targets
// outside the workspace (SECURITY.md).
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod testutil;

#[cfg(feature = "cuda")]
pub use backend::cuda::{
    device_count, device_memory, memory_kind_of, CudaGraph, CudaStream, DeviceBuffer, DeviceView,
    DeviceViewMut,
};
pub use buffer::{Buffer, BufferMut, MemoryKind, RawBuffer};
pub use coll::{CudaStreamRaw, Group, GroupProcess, Process, Registration};
pub use comm::Communicator;
pub use config::{CeMode, Config, RegisteredMode, ResidentMode};
pub use datatype::{Datatype, Equivalence};
pub use env::{initialize, initialize_with_threading, Threading, Universe};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use mpi::wtime;
/// The MPI bindings gpucoll is built on, so that a program can name
/// `gpucoll::mpi_sys::MPI_Comm` for [`Communicator::from_raw_mpi`] without
/// depending on `mpi-sys` itself.
pub use mpi_sys;
pub use op::ReduceOp;
pub use p2p::{AnyProcess, Message, RawMessageRequest, ReceiveRequest, Source, Status};
pub use request::{scope, wait_all, RawRequest, Request, Scope};
pub use task::CollKind;

/// Everything a typical program needs.
///
/// ```no_run
/// use gpucoll::prelude::*;
///
/// fn average(world: &Communicator, grads: &mut [bf16]) -> Result<()> {
///     world.all_reduce_in_place(grads, ReduceOp::Avg)
/// }
/// let universe = initialize()?;
/// let world = universe.world()?;
/// let mut grads = vec![bf16::from_f32(world.rank() as f32); 4096];
/// average(&world, &mut grads)?;
/// # Ok::<(), Error>(())
/// ```
pub mod prelude {
    pub use crate::{
        bf16, f16, initialize, Buffer, BufferMut, Communicator, Datatype, Equivalence, Error,
        Process, ReduceOp, Result, Status,
    };
}
