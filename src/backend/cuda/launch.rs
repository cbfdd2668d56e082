//! Kernel launches: one block of [`THREADS`] threads per channel for the
//! step interpreter, `grid` blocks for a one-shot or a peer kernel.

use super::abi::{GcArgs, GcOneShotArgs, GcPeerArgs, GcResidentArgs};
use super::driver::{self, CUstream};
use super::module::Kernels;
use crate::datatype::Datatype;
use crate::error::Result;
use std::ffi::c_void;

/// Threads per block (must match `GC_THREADS` in the kernel).
pub(super) const THREADS: u32 = 512;

/// Launch the step interpreter of `dtype` on `grid` blocks.
///
/// # Safety
/// Every address in `args` (step and channel tables, connectors, the
/// calls' buffers) stays valid until the kernel finished.
pub(super) unsafe fn steps(
    kernels: &Kernels,
    dtype: Datatype,
    grid: u32,
    mut args: GcArgs,
    stream: CUstream,
) -> Result<()> {
    let mut params = [&mut args as *mut GcArgs as *mut c_void];
    // SAFETY: one GcArgs by value as the kernel expects; what it points to
    // stays valid until the kernel finished (this function's contract).
    unsafe {
        driver::launch(
            kernels.steps[dtype as usize],
            grid,
            THREADS,
            stream,
            &mut params,
        )
    }
}

/// Launch the one-shot kernel of `dtype` on `grid` blocks of `threads`
/// (at most [`THREADS`], the kernel's launch bound).
///
/// # Safety
/// The buffers in `args` stay valid until the kernel finished; the direct
/// areas it names live as long as the backend.
pub(super) unsafe fn direct(
    kernels: &Kernels,
    dtype: Datatype,
    grid: u32,
    threads: u32,
    args: &mut GcOneShotArgs,
    stream: CUstream,
) -> Result<()> {
    let mut params = [args as *mut GcOneShotArgs as *mut c_void];
    // SAFETY: one GcOneShotArgs by value as the kernel expects; the buffers
    // stay valid until it finished (this function's contract).
    unsafe {
        driver::launch(
            kernels.direct[dtype as usize],
            grid,
            threads,
            stream,
            &mut params,
        )
    }
}

/// Launch the peer kernel of `dtype` (registered buffers) on `grid` blocks.
///
/// # Safety
/// Every buffer in `args` (ours, and the peers' mapped here) stays valid
/// and mapped until the kernel finished.
pub(super) unsafe fn peer(
    kernels: &Kernels,
    dtype: Datatype,
    grid: u32,
    args: &mut GcPeerArgs,
    stream: CUstream,
) -> Result<()> {
    let mut params = [args as *mut GcPeerArgs as *mut c_void];
    // SAFETY: one GcPeerArgs by value as the kernel expects; the buffers
    // stay valid and mapped until it finished (this function's contract).
    unsafe {
        driver::launch(
            kernels.peer[dtype as usize],
            grid,
            THREADS,
            stream,
            &mut params,
        )
    }
}

/// Launch the resident block (`gc_resident`, one block).
///
/// # Safety
/// The mailbox in `args` stays mapped until the kernel left, and every
/// call posted to it meets the contract of [`direct`].
pub(super) unsafe fn resident(
    kernels: &Kernels,
    mut args: GcResidentArgs,
    stream: CUstream,
) -> Result<()> {
    let mut params = [&mut args as *mut GcResidentArgs as *mut c_void];
    // SAFETY: one GcResidentArgs by value as the kernel expects; the
    // mailbox outlives the kernel (this function's contract).
    unsafe { driver::launch(kernels.resident, 1, THREADS, stream, &mut params) }
}
