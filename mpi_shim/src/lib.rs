//! # gpucoll_mpi: MPI collectives on device memory for unmodified programs
//!
//! `libgpucoll_mpi.so` exports the MPI collectives (`MPI_Allreduce` and the
//! rest, blocking and nonblocking), the completion calls and
//! `MPI_Init`/`MPI_Finalize`. Preloaded (`LD_PRELOAD`) or linked ahead of
//! the MPI library, it takes those calls: device buffers go to gpucoll,
//! host buffers to MPI's own `PMPI_` entry points, and device buffers
//! gpucoll cannot take are staged through pinned host memory to MPI. See
//! `mpi_shim/README.md` for the routing table, the variables and the
//! stream rule.
//!
//! Layout: `settings` (variables), `handles` (MPI handles from the built-
//! against `mpi.h`), `cuda` (the only driver calls), `comms` (gpucoll
//! communicators cached as MPI attributes), `route` (the per-call
//! decision), `plans` (per-collective argument mapping), `exec`, `native`,
//! `staging` (carrying a plan out), `requests` and `completion`
//! (generalized requests and the Wait/Test family), `collectives` and
//! `init` (the exported entry points), `errors`;
//! `fortran` (Open MPI's Fortran entry points, calling the C exports) and
//! `large_count` (the MPI-4 `MPI_*_c` forms, calling the C exports).
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]

mod collectives;
mod comms;
mod completion;
mod cuda;
mod errors;
mod exec;
mod fortran;
mod handles;
// Only the CUDA build classifies pointers.
#[cfg(feature = "cuda")]
mod hostmem;
mod init;
mod large_count;
mod native;
mod p2p;
mod plans;
mod requests;
mod route;
mod settings;
mod staging;
