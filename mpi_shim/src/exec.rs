//! Carrying out a [`Plan`]: the `PMPI_` call on the program's buffers or on
//! staged copies, or gpucoll's call, blocking or as a request.
//!
//! `pmpi` (and `ipmpi`) make the `PMPI_` call on the `N` buffers they are
//! given, in the order of `buffers` (the program's buffers, or their staged
//! copies). With the shim off (`GPUCOLL_SHIM=0`) no plan is made.
//!
//! Every export that goes through here gets, without code of its own:
//! * the panic net ([`errors::guarded`]): a panic is `MPI_ERR_INTERN`, and a
//!   nonblocking call leaves `MPI_REQUEST_NULL`;
//! * the failed-communicator check: once a collective on a communicator
//!   failed (`comms.rs`), every later one reports why;
//! * on a guarded communicator (one with a gpucoll communicator), the
//!   deadline on what goes to MPI: the nonblocking `PMPI_I*` form, polled
//!   for at most `GPUCOLL_TIMEOUT`, so that a peer that went to gpucoll
//!   instead gives an error here too, not a hang;
//! * staged nonblocking calls that stay nonblocking: the `PMPI_I*` form on
//!   the staged copies, copied back when the request completes
//!   (`pmpi_work.rs`).

use crate::comms::{self, CommEntry};
use crate::deadline::{self, Unfinished};
use crate::errors;
use crate::native;
use crate::plans::Plan;
use crate::pmpi_work::PmpiWork;
use crate::requests;
use crate::route;
use crate::settings;
use crate::staging::{self, Region};
use mpi_sys::{MPI_Comm, MPI_Request};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The `PMPI_I*` form of a blocking collective: the buffers, then where to
/// put the request.
pub type Start<'a, const N: usize> = &'a mut dyn FnMut([*mut c_void; N], *mut MPI_Request) -> c_int;

/// The entry of `comm` if the shim must look at it: it failed, or it is
/// guarded (`None` quickly while no communicator of the process is either).
fn watched(comm: MPI_Comm) -> Option<Arc<CommEntry>> {
    if !comms::any_guarded() {
        return None;
    }
    comms::lookup(comm)
        .ok()
        .filter(|e| e.guarded() || e.failure().is_some())
}

/// Run a blocking collective. Its MPI-routed form waits without a
/// deadline; [`blocking_or_start`] is the form that can have one (every
/// export of `collectives.rs` uses it). This one serves exports that have
/// no `PMPI_I*` form at hand; they still get the panic net and the
/// failed-communicator check.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract).
#[allow(dead_code)]
pub unsafe fn blocking<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*mut c_void; N],
    plan: impl FnOnce() -> Plan<N>,
    pmpi: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    let mut pmpi = Some(pmpi);
    let mut once = |b: [*mut c_void; N]| {
        pmpi.take()
            .map_or(mpi_sys::MPI_ERR_INTERN as c_int, |f| f(b))
    };
    // SAFETY: forwarded from this function's contract.
    unsafe { run_blocking(call, comm, buffers, plan, &mut once, None) }
}

/// Run a blocking collective whose nonblocking `PMPI_I*` form is `ipmpi`:
/// on a guarded communicator, what goes to MPI goes there as `ipmpi`, and
/// waits at most `GPUCOLL_TIMEOUT`.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract).
pub unsafe fn blocking_or_start<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*mut c_void; N],
    plan: impl FnOnce() -> Plan<N>,
    pmpi: impl FnOnce([*mut c_void; N]) -> c_int,
    mut ipmpi: impl FnMut([*mut c_void; N], *mut MPI_Request) -> c_int,
) -> c_int {
    let mut pmpi = Some(pmpi);
    let mut once = |b: [*mut c_void; N]| {
        pmpi.take()
            .map_or(mpi_sys::MPI_ERR_INTERN as c_int, |f| f(b))
    };
    // SAFETY: forwarded from this function's contract.
    unsafe { run_blocking(call, comm, buffers, plan, &mut once, Some(&mut ipmpi)) }
}

/// # Safety
/// As for [`blocking`].
unsafe fn run_blocking<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*mut c_void; N],
    plan: impl FnOnce() -> Plan<N>,
    pmpi: &mut dyn FnMut([*mut c_void; N]) -> c_int,
    ipmpi: Option<Start<'_, N>>,
) -> c_int {
    errors::guarded(
        call,
        comm,
        || (),
        || {
            if !settings::active() {
                return pmpi(buffers);
            }
            settings::maybe_panic(call);
            let watched = watched(comm);
            if let Some(e) = &watched {
                if let Some(f) = e.failure() {
                    return e.report(comm, call, f);
                }
            }
            // The communicator whose MPI-routed calls run under a deadline.
            let guard = watched.filter(|e| e.guarded());
            let mut ipmpi = ipmpi;
            let mut to_mpi = |b: [*mut c_void; N]| match (&guard, ipmpi.as_deref_mut()) {
                // SAFETY: forwarded from this function's contract.
                (Some(e), Some(start)) => unsafe { with_deadline(call, comm, e, b, start) },
                _ => Outcome::Done(pmpi(b)),
            };
            match plan() {
                Plan::Pmpi => to_mpi(buffers).code(),
                Plan::Failed(code) => code,
                // SAFETY: forwarded from this function's contract.
                Plan::Native(n, coll, count) => unsafe {
                    native::blocking(n, call, comm, coll, count)
                },
                // SAFETY: forwarded from this function's contract.
                Plan::Staged(device, regions) => unsafe {
                    staged_blocking(call, comm, device, regions, &mut to_mpi)
                },
            }
        },
    )
}

/// How an MPI-routed call ended.
enum Outcome {
    /// MPI returned this code (0: the data is in place).
    Done(c_int),
    /// The deadline passed: the communicator failed (this code was raised)
    /// and MPI may still write the buffers.
    Abandoned(c_int),
}

impl Outcome {
    fn code(&self) -> c_int {
        match self {
            Outcome::Done(c) | Outcome::Abandoned(c) => *c,
        }
    }
}

/// `start` the nonblocking form and wait for it at most `GPUCOLL_TIMEOUT`;
/// past that, `entry` fails and the request is abandoned.
///
/// # Safety
/// As for [`blocking`].
unsafe fn with_deadline<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    entry: &CommEntry,
    buffers: [*mut c_void; N],
    start: Start<'_, N>,
) -> Outcome {
    // SAFETY: reading a link-time MPI constant.
    let mut request = unsafe { mpi_sys::RSMPI_REQUEST_NULL };
    let rc = start(buffers, &mut request);
    if rc != 0 {
        return Outcome::Done(rc);
    }
    // SAFETY: the request just started.
    match unsafe { deadline::wait(&mut request, settings::get().timeout) } {
        Ok(()) => Outcome::Done(0),
        Err(Unfinished::Mpi(rc)) => Outcome::Done(rc),
        Err(Unfinished::TimedOut(waited)) => {
            let msg = deadline::timeout_message(call, waited);
            errors::log_failure(call, &msg);
            let f = entry.fail(mpi_sys::MPI_ERR_OTHER as c_int, msg);
            Outcome::Abandoned(errors::raise(comm, f.code))
        }
    }
}

/// A staged blocking call: copies in, `to_mpi` on the copies, copies back.
///
/// # Safety
/// As for [`blocking`].
unsafe fn staged_blocking<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    device: Option<i32>,
    regions: [Region; N],
    to_mpi: &mut dyn FnMut([*mut c_void; N]) -> Outcome,
) -> c_int {
    // SAFETY: the regions are the program's buffers (this function's contract).
    let staged = match unsafe { staging::stage_in(device, regions) } {
        Ok(s) => s,
        Err(e) => return staging::fail(comm, call, e),
    };
    match to_mpi(staged.ptrs()) {
        Outcome::Abandoned(code) => {
            staged.leak();
            code
        }
        Outcome::Done(rc) => match staged.finish(rc == 0) {
            Err(e) if rc == 0 => staging::fail(comm, call, e),
            _ => rc,
        },
    }
}

/// Start a nonblocking collective: `ipmpi` is the `PMPI_I*` call (host
/// memory, or staged copies); it writes its request into `*request`. `pmpi`
/// (the blocking `PMPI_` call) is no longer used: a staged call runs as
/// `ipmpi` on the staged copies, copied back at completion.
///
/// # Safety
/// The program's MPI arguments are valid (MPI's contract), `request` writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn nonblocking<const N: usize>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*mut c_void; N],
    request: *mut MPI_Request,
    plan: impl FnOnce() -> Plan<N>,
    ipmpi: impl FnOnce([*mut c_void; N]) -> c_int,
    _pmpi: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    let null = || {
        if !request.is_null() {
            // SAFETY: `request` is writable (this function's contract).
            unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        }
    };
    let code = errors::guarded(call, comm, null, || {
        if !settings::active() {
            return ipmpi(buffers);
        }
        settings::maybe_panic(call);
        let watched = watched(comm);
        if let Some(e) = &watched {
            if let Some(f) = e.failure() {
                return e.report(comm, call, f);
            }
        }
        match route::starting(plan) {
            Plan::Pmpi => match watched {
                // SAFETY: forwarded from this function's contract.
                Some(e) => unsafe { wrapped(call, Some(e), buffers, None, request, ipmpi) },
                None => ipmpi(buffers),
            },
            Plan::Failed(code) => code,
            Plan::Native(n, coll, count) => {
                // SAFETY: forwarded from this function's contract.
                unsafe { native::nonblocking(n, call, comm, coll, count, request) }
            }
            Plan::Staged(device, regions) => {
                // SAFETY: the regions are the program's buffers.
                let staged = match unsafe { staging::stage_in(device, regions) } {
                    Ok(s) => s,
                    Err(e) => return staging::fail(comm, call, e),
                };
                // SAFETY: forwarded from this function's contract.
                unsafe { wrapped(call, watched, buffers, Some(staged), request, ipmpi) }
            }
        }
    });
    // A failed start leaves no request behind (MPI's rule for an erroneous
    // call under a returning error handler); a program that waits on it
    // then waits on MPI_REQUEST_NULL instead of an unset handle.
    if code != 0 {
        null();
    }
    code
}

/// Start `ipmpi` on the program's `buffers` or on the `staged` copies, and
/// give the program a shim request that completes with it (copying back,
/// and waiting under the deadline on a guarded communicator, `guard`).
/// `ipmpi` writes its request into `*request`, which is then replaced by
/// the shim's.
///
/// # Safety
/// As for [`nonblocking`].
unsafe fn wrapped<const N: usize>(
    call: &'static str,
    guard: Option<Arc<CommEntry>>,
    buffers: [*mut c_void; N],
    staged: Option<staging::Staged<N>>,
    request: *mut MPI_Request,
    ipmpi: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    let ptrs = staged.as_ref().map_or(buffers, |s| s.ptrs());
    let rc = ipmpi(ptrs);
    if rc != 0 {
        if let Some(s) = staged {
            s.finish(false).ok();
        }
        return rc;
    }
    // SAFETY: `ipmpi` just wrote the inner request there.
    let inner = unsafe { *request };
    let guard = guard.filter(|e| e.guarded());
    let work = PmpiWork::new(call, inner, staged, guard);
    // SAFETY: `request` is writable (the caller's contract).
    unsafe { requests::start_work(Box::new(work), request) }
}
