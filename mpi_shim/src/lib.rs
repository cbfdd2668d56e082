//! `libgpucoll_mpi.so`: an MPI shim that routes collectives on device memory to gpucoll.
//!
//! This file only holds the module lines until the crate's C interposition layer is merged.

mod fortran;
mod large_count;
