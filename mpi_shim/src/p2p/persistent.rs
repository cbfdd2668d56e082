//! Persistent point-to-point requests (`MPI_Send_init` ... `MPI_Recv_init`,
//! `MPI_Start`, `MPI_Startall`) on device memory.
//!
//! The program's handle is MPI's own persistent request, made on a host
//! copy of the buffer's span that lives as long as the request, so MPI's
//! persistent semantics (inactive after completion, restartable,
//! `MPI_Request_free`, `MPI_Cancel`) hold unchanged. The shim only moves
//! bytes: at each start it copies the span in (a send's data; a receive's
//! own bytes, which a short message leaves as they were), and once a
//! started receive is complete it copies the span back. Completion is seen
//! after each completion call (`after_completion`): for every started
//! staged request in its array, `MPI_Request_get_status` says whether the
//! operation finished (an inactive persistent request reports finished).
//! Persistent receives copy the whole span back: after completion MPI no
//! longer has the status's byte count for the shim to look at.
//!
//! A request freed while started keeps its host copy forever: MPI may still
//! use it and nothing says when it stops.

use super::{plan, Back, Buf, Dir, Plan, Staged};
use crate::errors;
use crate::route;
use crate::settings;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

struct Entry {
    staged: Staged,
    buf: Buf,
    dir: Dir,
    call: &'static str,
    /// The communicator (its handle's bits), for errors of later copies.
    comm: usize,
    /// Started, and its receive not copied back yet.
    started: bool,
}

impl Entry {
    fn comm(&self) -> MPI_Comm {
        MPI_Comm(self.comm as *mut mpi_sys::ompi_communicator_t)
    }
}

/// Staged persistent requests, by handle.
fn table() -> MutexGuard<'static, HashMap<usize, Entry>> {
    static T: OnceLock<Mutex<HashMap<usize, Entry>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Entries in the table: `MPI_Start` looks nothing up while it is zero.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Started entries: the completion calls look nothing up while it is zero.
static STARTED: AtomicUsize = AtomicUsize::new(0);

fn key(r: MPI_Request) -> usize {
    r.0 as usize
}

/// Make a persistent request for one buffer moving its bytes `dir`:
/// `init` (the `PMPI_*_init` call) gets the address MPI should use and the
/// request to fill.
///
/// # Safety
/// The program's arguments are valid (MPI's contract); `request` writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn init(
    call: &'static str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
    dir: Dir,
    request: *mut MPI_Request,
    init: impl FnOnce(*mut c_void, *mut MPI_Request) -> c_int,
) -> c_int {
    let null = || {
        if !request.is_null() {
            // SAFETY: `request` is writable (the caller's contract).
            unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        }
    };
    crate::errors::guarded(call, comm, null, || {
        settings::maybe_panic(call);
        let staged = match plan(call, buf, count, dt, peer, comm) {
            Plan::Pmpi => return init(buf.cast_mut(), request),
            Plan::Failed(code) => return code,
            Plan::Staged(s) => s,
        };
        let b = match staged.hold() {
            Ok(b) => b,
            Err(e) => return errors::fail(comm, call, &gpucoll::Error::Backend(e)),
        };
        let rc = init(staged.host(&b), request);
        if rc != 0 {
            staged.give(b);
            return rc;
        }
        // SAFETY: MPI just wrote the new request.
        let k = key(unsafe { *request });
        table().insert(
            k,
            Entry {
                staged,
                buf: b,
                dir,
                call,
                comm: comm.0 as usize,
                started: false,
            },
        );
        ENTRIES.fetch_add(1, Ordering::AcqRel);
        0
    })
}

/// A failed copy, raised once the table's lock is released (a program's
/// error handler may call MPI).
struct CopyFailed {
    comm: MPI_Comm,
    call: &'static str,
    message: String,
}

impl CopyFailed {
    fn raise(self) -> c_int {
        errors::fail(self.comm, self.call, &gpucoll::Error::Backend(self.message))
    }
}

/// Before `PMPI_Start` of `r`: fill the host copy of a staged request that
/// is not started. Ok(true): it is staged and now counts as started (undo
/// with `unstart` if MPI refuses to start it).
fn prepare(t: &mut HashMap<usize, Entry>, r: MPI_Request) -> Result<bool, CopyFailed> {
    let Some(e) = t.get_mut(&key(r)) else {
        return Ok(false);
    };
    if e.started {
        // Started twice without completing: MPI reports the error, and the
        // host copy MPI may be writing is left alone.
        return Ok(false);
    }
    if let Err(message) = e.staged.copy_in(&e.buf) {
        return Err(CopyFailed {
            comm: e.comm(),
            call: "MPI_Start",
            message,
        });
    }
    if settings::get().log {
        route::log("MPI_Start", "staged", e.call);
    }
    e.started = true;
    STARTED.fetch_add(1, Ordering::AcqRel);
    Ok(true)
}

fn unstart(t: &mut HashMap<usize, Entry>, r: MPI_Request) {
    if let Some(e) = t.get_mut(&key(r)) {
        if e.started {
            e.started = false;
            STARTED.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// `MPI_Start`.
///
/// # Safety
/// As `MPI_Start`.
pub unsafe fn start(request: *mut MPI_Request) -> c_int {
    if ENTRIES.load(Ordering::Acquire) == 0 || request.is_null() || !settings::active() {
        // SAFETY: forwarded unchanged.
        return unsafe { mpi_sys::PMPI_Start(request) };
    }
    // SAFETY: readable per MPI's contract.
    let r = unsafe { *request };
    let mut t = table();
    let staged = match prepare(&mut t, r) {
        Ok(s) => s,
        Err(failed) => {
            drop(t);
            return failed.raise();
        }
    };
    // SAFETY: forwarded unchanged (the request is bound to the host copy).
    let rc = unsafe { mpi_sys::PMPI_Start(request) };
    if rc != 0 && staged {
        unstart(&mut t, r);
    }
    rc
}

/// `MPI_Startall`.
///
/// # Safety
/// As `MPI_Startall`.
pub unsafe fn start_all(count: c_int, requests: *mut MPI_Request) -> c_int {
    let n = usize::try_from(count).unwrap_or(0);
    if ENTRIES.load(Ordering::Acquire) == 0 || requests.is_null() || n == 0 || !settings::active() {
        // SAFETY: forwarded unchanged.
        return unsafe { mpi_sys::PMPI_Startall(count, requests) };
    }
    // SAFETY: `count` readable handles per MPI's contract.
    let reqs: Vec<MPI_Request> = unsafe { std::slice::from_raw_parts(requests, n) }.to_vec();
    let mut t = table();
    let mut started = Vec::new();
    for &r in &reqs {
        match prepare(&mut t, r) {
            Ok(true) => started.push(r),
            Ok(false) => {}
            Err(failed) => {
                for &s in &started {
                    unstart(&mut t, s);
                }
                drop(t);
                return failed.raise();
            }
        }
    }
    // SAFETY: forwarded unchanged.
    let rc = unsafe { mpi_sys::PMPI_Startall(count, requests) };
    if rc != 0 {
        // Open MPI checks every request before starting any.
        for &s in &started {
            unstart(&mut t, s);
        }
    }
    rc
}

/// After a completion call on `n` requests (`rc` its result): copy back
/// every started staged receive among them whose operation finished, and
/// mark started staged requests that finished as no longer started.
/// Returns `rc`, or an error of the copy when `rc` was 0.
///
/// # Safety
/// `requests` holds `n` readable handles (or is null).
pub unsafe fn after_completion(rc: c_int, n: c_int, requests: *const MPI_Request) -> c_int {
    if STARTED.load(Ordering::Acquire) == 0 || requests.is_null() || n <= 0 {
        return rc;
    }
    // SAFETY: `n` readable handles per the contract.
    let reqs = unsafe { std::slice::from_raw_parts(requests, n as usize) };
    let mut t = table();
    let mut failed = None;
    for r in reqs {
        let Some(e) = t.get_mut(&key(*r)) else {
            continue;
        };
        if !e.started {
            continue;
        }
        let mut flag: c_int = 0;
        let mut st = super::empty_status();
        // SAFETY: a live persistent request (it is in the table until
        // freed); local out-pointers. It does not complete the request.
        if unsafe { mpi_sys::PMPI_Request_get_status(*r, &mut flag, &mut st) } != 0 || flag == 0 {
            continue;
        }
        e.started = false;
        STARTED.fetch_sub(1, Ordering::AcqRel);
        if e.dir == Dir::Send {
            continue;
        }
        // The host copy holds the message where one landed and the
        // program's own bytes elsewhere (copied in at the start); a
        // cancelled receive left it as it was.
        if let Err(message) = e.staged.copy_out(&e.buf, Back::Span) {
            failed.get_or_insert(CopyFailed {
                comm: e.comm(),
                call: e.call,
                message,
            });
        }
    }
    drop(t);
    match failed {
        Some(f) => {
            let code = f.raise();
            if rc == 0 {
                code
            } else {
                rc
            }
        }
        None => rc,
    }
}

/// After `MPI_Request_free` of `freed` (the handle before the call) ended
/// with `rc`: forget a staged persistent request, returning its host copy
/// unless MPI may still be using it.
pub fn after_free(freed: MPI_Request, rc: c_int) {
    if rc != 0 || ENTRIES.load(Ordering::Acquire) == 0 {
        return;
    }
    let Some(e) = table().remove(&key(freed)) else {
        return;
    };
    ENTRIES.fetch_sub(1, Ordering::AcqRel);
    if e.started {
        STARTED.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(
            target: "gpucoll_mpi::p2p",
            "{} request freed while started: its host copy is kept",
            e.call
        );
        std::mem::forget(e.buf);
    } else {
        e.staged.give(e.buf);
    }
}
