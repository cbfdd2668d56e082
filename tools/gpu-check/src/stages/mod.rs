//! The stages on the public API (`--stage NAME`) and what they share:
//! inputs, pending raw calls and their verification.

mod ce_churn;
mod ce_mixed;
mod churn;
mod dead_peer;
mod graph;
mod interop;
mod memkinds;
mod mismatch;
mod oom;
mod p2p;
mod raw;
mod register;
mod registered;
mod soak;
mod threads;
mod timeout;
mod vmm;

use ce_churn::stage_ce_churn;
use ce_mixed::stage_ce_mixed;
use churn::stage_churn;
pub(crate) use dead_peer::stage_dead_peer;
use gpucoll::mpi::MpiComm;
use gpucoll::{Communicator, DeviceBuffer};
use graph::stage_graph;
use interop::stage_interop;
use memkinds::stage_memkinds;
use mismatch::stage_mismatch;
use oom::stage_oom;
use p2p::stage_p2p;
use raw::stage_raw;
use register::stage_register;
use registered::stage_registered;
use soak::stage_soak;
use std::ffi::c_void;
use std::fmt::Write as _;
use threads::stage_threads;
use timeout::stage_timeout;
use vmm::stage_vmm;

/// Input value of rank `r` at index `j` in round `it`: small integers,
/// so f32 sums are exact.
pub(crate) fn gv(r: usize, j: u64, it: u64) -> f32 {
    ((r as u64 * 31 + j * 7 + it * 5) % 101) as f32
}

/// A cudarc result as gpucoll's (the stages report one error type).
pub(crate) fn cu<T>(r: std::result::Result<T, cudarc::driver::DriverError>) -> gpucoll::Result<T> {
    r.map_err(|e| gpucoll::Error::Backend(format!("cudarc: {e:?}")))
}

pub(crate) fn vp(b: &DeviceBuffer<f32>) -> *mut c_void {
    b.device_ptr() as usize as *mut c_void
}

/// A float sum all_reduce of `din` into `dout` (`count` elements) through
/// the raw entry point, on `stream` (None: blocking on the backend's own).
///
/// # Safety
/// Both buffers stay valid until the work on `stream` completed.
pub(crate) unsafe fn sum_raw(
    world: &Communicator,
    din: &DeviceBuffer<f32>,
    dout: &DeviceBuffer<f32>,
    count: usize,
    stream: Option<gpucoll::CudaStreamRaw>,
) -> gpucoll::Result<()> {
    // SAFETY: forwarded: the caller keeps the buffers alive for the work.
    unsafe {
        world.all_reduce_raw(
            vp(din),
            vp(dout),
            count as u64,
            gpucoll::Datatype::F32,
            gpucoll::ReduceOp::Sum,
            stream,
        )
    }
}

/// An argument check: what, the call's result, the error it expects.
pub(crate) type ErrCheck = (
    &'static str,
    gpucoll::Result<()>,
    fn(&gpucoll::Error) -> bool,
);

/// One raw collective in flight: its output buffer and expected contents.
pub(crate) struct Pending {
    pub(crate) what: String,
    pub(crate) out: DeviceBuffer<f32>,
    pub(crate) _keep: Option<DeviceBuffer<f32>>,
    pub(crate) want: Vec<(usize, f32)>,
}

/// Compare a synchronized Pending with its expected values.
pub(crate) fn verify(p: &Pending, rank: usize, log: &mut String) -> gpucoll::Result<usize> {
    let got = p.out.to_vec()?;
    let mut bad = 0usize;
    let mut first = None;
    for &(i, w) in &p.want {
        let g = got.get(i).copied();
        if g != Some(w) {
            bad += 1;
            first.get_or_insert((i, g, w));
        }
    }
    if let Some((i, g, w)) = first {
        let _ = writeln!(
            log,
            "rank {rank} WRONG {}: {bad} elements; first at {i}: got {g:?} want {w}",
            p.what
        );
    }
    Ok(bad)
}

pub(crate) fn run_stage(
    name: &str,
    world: &Communicator,
    mpi: &MpiComm,
    log: &mut String,
) -> usize {
    let r = match name {
        "raw" => stage_raw(world, log),
        "graph" => stage_graph(world, log),
        "timeout" => stage_timeout(world, mpi, log),
        "mismatch" => stage_mismatch(world, mpi, log),
        "churn" => stage_churn(world, log),
        "ce_churn" => stage_ce_churn(world, log),
        "register" => stage_register(world, log),
        "registered" => stage_registered(world, log),
        "ce_mixed" => stage_ce_mixed(world, log),
        "soak" => stage_soak(world, log),
        "oom" => stage_oom(world, log),
        "interop" => stage_interop(world, log),
        "memkinds" => stage_memkinds(world, log),
        "threads" => stage_threads(world, log),
        "vmm" => stage_vmm(world, log),
        "p2p" => stage_p2p(world, log),
        other => Err(gpucoll::Error::InvalidUsage(format!(
            "unknown stage {other}"
        ))),
    };
    match r {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(log, "rank {} ERROR stage {name}: {e}", world.rank());
            1
        }
    }
}
