//! `MPI_Init`, `MPI_Init_thread` and `MPI_Finalize`.
//!
//! gpucoll's communicators that span several nodes (real or simulated) move
//! data from a proxy thread while the program calls MPI, so they need
//! `MPI_THREAD_MULTIPLE`; when the job spans nodes the shim asks MPI for it
//! and tells the program the level MPI provides (never below what it
//! asked for, when MPI has it). `MPI_Finalize` completes the shim's
//! outstanding requests and tears every gpucoll communicator down before
//! `PMPI_Finalize`.

use crate::errors::{self, guarded_exports};
use crate::{comms, cuda, requests, settings};
use std::ffi::{c_char, c_int};

/// Whether this job spans several (real or simulated) nodes, from what the
/// launcher and gpucoll's variables say before MPI starts.
fn spans_nodes() -> bool {
    let num = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let local_vs_world = match (
        num("OMPI_COMM_WORLD_LOCAL_SIZE"),
        num("OMPI_COMM_WORLD_SIZE"),
    ) {
        (Some(local), Some(world)) => local < world,
        _ => false,
    };
    let simulated = num("GPUCOLL_SIM_NODES").is_some_and(|k| k > 1)
        || std::env::var_os("GPUCOLL_NODE_ID").is_some();
    local_vs_world || simulated
}

fn wants_multiple() -> bool {
    settings::get().enabled && spans_nodes()
}

guarded_exports! {
    /// # Safety
    /// As `MPI_Init`.
    fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) on errors::world(), || () => {
        if !wants_multiple() {
            // SAFETY: forwarded unchanged.
            return unsafe { mpi_sys::PMPI_Init(argc, argv) };
        }
        let mut provided: c_int = 0;
        // SAFETY: forwarded arguments and a valid out-pointer.
        unsafe {
            mpi_sys::PMPI_Init_thread(argc, argv, mpi_sys::RSMPI_THREAD_MULTIPLE, &mut provided)
        }
    }

    /// # Safety
    /// As `MPI_Init_thread`.
    fn MPI_Init_thread(
        argc: *mut c_int,
        argv: *mut *mut *mut c_char,
        required: c_int,
        provided: *mut c_int,
    ) on errors::world(), || () => {
        let ask = if wants_multiple() {
            // SAFETY: reading an immutable constant.
            unsafe { mpi_sys::RSMPI_THREAD_MULTIPLE }.max(required)
        } else {
            required
        };
        // SAFETY: forwarded arguments; `provided` is the program's out-pointer.
        unsafe { mpi_sys::PMPI_Init_thread(argc, argv, ask, provided) }
    }

    /// # Safety
    /// As `MPI_Finalize`.
    fn MPI_Finalize() on errors::world(), || () => {
        if settings::get().enabled {
            let _inside = settings::Inside::enter();
            requests::finish_all();
            comms::teardown_all();
            cuda::teardown();
        }
        // SAFETY: no arguments.
        unsafe { mpi_sys::PMPI_Finalize() }
    }
}
