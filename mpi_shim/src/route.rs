//! Where one intercepted collective goes: to `PMPI_` (host memory, or
//! arguments MPI should judge), to gpucoll (device memory, a predefined type
//! and op gpucoll has, an intracommunicator of more than one rank), or
//! staged through pinned host memory to `PMPI_` (device memory gpucoll
//! cannot take, intercommunicators). In host test mode host memory takes
//! the device memory's way (gpucoll's host backend, or staged through
//! plain host copies).

use crate::comms::{self, CommEntry, Signature};
use crate::cuda;
use crate::errors;
use crate::handles::{self, NativeType};
use crate::settings;
use gpucoll::{Communicator, Datatype, ReduceOp};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};

/// What one rank knows about its call.
pub struct Facts<'a> {
    pub call: &'static str,
    pub comm: MPI_Comm,
    /// The buffers significant on this rank (`MPI_IN_PLACE` and null
    /// allowed; gpucoll and MPI report null buffers that must hold data).
    pub buffers: &'a [*const c_void],
    /// Elements of the principal (per-rank) count; negative is an error MPI reports.
    pub count: i64,
    /// The datatype that decides whether gpucoll can move the data; `None`
    /// when the call has no native form (v-forms with uneven counts).
    pub dtype: Option<MPI_Datatype>,
    pub op: Option<MPI_Op>,
    pub root: Option<c_int>,
    /// Send and receive sides describe the same elements (same type and
    /// count, or in place), as gpucoll's layouts need.
    pub same_shape: bool,
}

pub struct Native {
    pub entry: Arc<CommEntry>,
    pub comm: Communicator,
    pub dtype: Datatype,
    pub op: ReduceOp,
    /// The GPU of the buffers (`None`: host buffers in host mode).
    pub device: Option<i32>,
}

pub enum Route {
    Pmpi,
    Native(Native),
    /// Through host copies: pinned ones of the buffers on this GPU, or
    /// (`None`, host test mode) plain ones of every buffer.
    Staged(Option<i32>),
    /// The call failed before reaching anyone; the code was raised already.
    Failed(c_int),
}

/// This process's rank in `MPI_COMM_WORLD`, for log lines.
fn world_rank() -> c_int {
    static RANK: OnceLock<c_int> = OnceLock::new();
    *RANK.get_or_init(|| {
        let mut r: c_int = -1;
        // SAFETY: MPI is initialized inside an intercepted call.
        unsafe { mpi_sys::PMPI_Comm_rank(mpi_sys::RSMPI_COMM_WORLD, &mut r) };
        r
    })
}

pub fn log(call: &str, route: &str, why: &str) {
    if settings::get().log {
        use std::io::Write;
        // One write per line, so lines of concurrent ranks do not interleave.
        let line = format!("gpucoll_mpi[{}]: {call} -> {route} ({why})\n", world_rank());
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

enum Tentative {
    Pmpi(&'static str),
    Staged(Option<i32>, &'static str),
    Native(Arc<CommEntry>, NativeType, ReduceOp),
}

/// A call gpucoll cannot take: device memory is staged; host memory goes
/// to MPI as it is, except in host test mode, where it is staged through
/// host copies as device memory would be.
fn fallback(device: Option<i32>, why: &'static str) -> Tentative {
    match device {
        Some(d) => Tentative::Staged(Some(d), why),
        None if settings::get().host_mode => Tentative::Staged(None, why),
        None => Tentative::Pmpi(why),
    }
}

fn tentative(f: &Facts, device: Option<i32>, entry: Option<&Arc<CommEntry>>) -> Tentative {
    let entry = match entry {
        Some(e) => e,
        None => return Tentative::Pmpi("communicator rejected by MPI"),
    };
    if entry.inter {
        // gpucoll has no intercommunicators; the plans stage what each
        // rank's part of the call (MPI_ROOT, MPI_PROC_NULL, remote-group
        // blocks) makes significant.
        return fallback(device, "intercommunicator");
    }
    if !entry.eligible {
        return fallback(device, "single-rank communicator");
    }
    if let Some(root) = f.root {
        if root < 0 || root as usize >= entry.size {
            return Tentative::Pmpi("root out of range");
        }
    }
    let Some(dtype) = f.dtype else {
        return fallback(device, "no native form (uneven blocks)");
    };
    let Some(nt) = handles::native_type(dtype) else {
        return fallback(device, "datatype gpucoll does not have");
    };
    let op = match f.op {
        None => ReduceOp::Sum,
        Some(op) => match handles::native_op(op, nt) {
            Some(o) => o,
            None => return fallback(device, "op gpucoll does not have for this type"),
        },
    };
    if !f.same_shape {
        return fallback(device, "send and receive layouts differ");
    }
    if f.count > i64::from(i32::MAX) {
        return fallback(device, "count");
    }
    if STARTING.with(|s| s.get()) && !entry.guarded() {
        // Creating gpucoll's communicator is collective and blocking: a
        // nonblocking call must not wait for its peers there (they may be
        // starting another communicator's call first, which MPI allows).
        // Until a blocking collective created it, nonblocking calls go to
        // MPI's nonblocking form, staged.
        return fallback(
            device,
            "nonblocking, before the communicator's first blocking collective",
        );
    }
    Tentative::Native(entry.clone(), nt, op)
}

thread_local! {
    /// Set while a nonblocking call is routed (`starting`).
    static STARTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Route the nonblocking call that `plan` plans.
pub fn starting<T>(plan: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            STARTING.with(|s| s.set(self.0));
        }
    }
    let _reset = Reset(STARTING.with(|s| s.replace(true)));
    plan()
}

/// From the element-wise maximum of every rank's `[native, -native]`
/// (native = 1 or 0): some rank chose gpucoll and some did not.
fn disagree(max: [c_int; 2]) -> bool {
    max[0] == 1 && max[1] == 0
}

/// Under `GPUCOLL_CHECK=1`: every rank of an eligible communicator learns
/// whether all ranks chose gpucoll, or all chose MPI, before anyone moves
/// data. Returns a message when they differ.
fn agree(comm: MPI_Comm, native: bool) -> Result<(), String> {
    let mine: [c_int; 2] = if native { [1, -1] } else { [0, 0] };
    let mut max: [c_int; 2] = [0; 2];
    // SAFETY: two ints each way on a communicator MPI accepted; the type
    // and op handles are predefined constants.
    let rc = unsafe {
        mpi_sys::PMPI_Allreduce(
            mine.as_ptr() as *const c_void,
            max.as_mut_ptr() as *mut c_void,
            2,
            mpi_sys::RSMPI_INT32_T,
            mpi_sys::RSMPI_MAX,
            comm,
        )
    };
    if rc != 0 {
        return Err(format!("the route agreement failed with MPI error {rc}"));
    }
    if disagree(max) {
        return Err(
            "ranks disagree on the route: some passed device memory gpucoll takes, others host \
             memory or a datatype/op it does not take (every rank must pass the same kind of \
             memory to a collective)"
                .into(),
        );
    }
    Ok(())
}

/// This rank's call as the handshake that creates the gpucoll
/// communicator compares it.
fn signature(f: &Facts, nt: NativeType, op: ReduceOp) -> Signature {
    Signature {
        call: f.call,
        count: f.count,
        dtype: nt.dtype.name(),
        op: if f.op.is_some() { op.name() } else { "" },
        root: f.root.map_or(-1, i64::from),
    }
}

/// Decide the route of one call (creating the gpucoll communicator if this
/// is its first routed collective).
pub fn decide(f: &Facts) -> Route {
    let s = settings::get();
    if f.count < 0 {
        log(f.call, "pmpi", "negative count");
        return Route::Pmpi;
    }
    let device = cuda::device_of_any(f.buffers);
    if device.is_none() && !s.host_mode && !s.check {
        // The hot path for host programs: one pointer check per buffer.
        log(f.call, "pmpi", "host memory");
        return Route::Pmpi;
    }
    let entry = comms::lookup(f.comm).ok();
    let mut t = tentative(f, device, entry.as_ref());
    if device.is_none() && !s.host_mode {
        if let Tentative::Native(..) = t {
            t = Tentative::Pmpi("host memory");
        }
    }
    if s.check && entry.as_ref().is_some_and(|e| e.eligible) {
        let native = matches!(t, Tentative::Native(..));
        if let Err(msg) = agree(f.comm, native) {
            errors::log_failure(f.call, &msg);
            return Route::Failed(errors::raise(f.comm, mpi_sys::MPI_ERR_NOT_SAME as c_int));
        }
    }
    match t {
        Tentative::Pmpi(why) => {
            log(f.call, "pmpi", why);
            Route::Pmpi
        }
        Tentative::Staged(d, why) => {
            log(f.call, "staged", why);
            Route::Staged(d)
        }
        Tentative::Native(entry, nt, op) => match entry.communicator(device, &signature(f, nt, op))
        {
            Ok(comm) => {
                if settings::get().log {
                    let where_ = match device {
                        Some(d) => format!("device {d}"),
                        None => "host memory, test mode".into(),
                    };
                    log(f.call, "gpucoll", &format!("{}, {where_}", nt.dtype.name()));
                }
                Route::Native(Native {
                    entry,
                    comm,
                    dtype: nt.dtype,
                    op,
                    device,
                })
            }
            Err(code) => Route::Failed(code),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_spots_mixed_routes() {
        let vote = |native: bool| if native { [1, -1] } else { [0, 0] };
        let max = |a: [c_int; 2], b: [c_int; 2]| [a[0].max(b[0]), a[1].max(b[1])];
        assert!(!disagree(max(vote(true), vote(true))));
        assert!(!disagree(max(vote(false), vote(false))));
        assert!(disagree(max(vote(true), vote(false))));
        assert!(disagree(max(vote(false), vote(true))));
    }
}
