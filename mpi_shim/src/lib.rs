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
//! `staging` (carrying a plan out), `deadline` (waits bounded by
//! `GPUCOLL_TIMEOUT`), `requests`, `pmpi_work` and `completion`
//! (generalized requests and the Wait/Test family), `collectives` and
//! `init` (the exported entry points), `errors` (error classes and the
//! panic net of every export); `stage` (host copies for the calls gpucoll
//! has no form of: the scans, w-forms, neighbourhood and nonblocking
//! v-forms in `collectives/`, and `pack`), `misuse` (`MPI_IN_PLACE` where
//! MPI does not allow it), `refusal` with `onesided` and `fileio` (refused
//! on device memory), `progress` (waits on device work that keep MPI
//! progressing), `p2p`;
//! `fortran` (Open MPI's Fortran entry points, calling the C exports) and
//! `large_count` (the MPI-4 `MPI_*_c` forms, calling the C exports).
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]

mod collectives;
mod comms;
mod completion;
mod cuda;
mod deadline;
mod errors;
mod exec;
mod fileio;
mod fortran;
mod handles;
// Only the CUDA build classifies pointers.
#[cfg(feature = "cuda")]
mod hostmem;
mod init;
mod large_count;
mod misuse;
mod native;
mod onesided;
mod p2p;
mod pack;
mod plans;
mod pmpi_work;
mod progress;
mod refusal;
mod requests;
mod route;
mod settings;
mod stage;
mod staging;
