//! The shim's nonblocking requests: real MPI handles from
//! `MPI_Grequest_start`, completed by the shim (`MPI_Grequest_complete`)
//! once the CUDA event recorded after the collective has passed. The
//! completion calls (`completion.rs`) drive that, then hand the handles to
//! `PMPI_`, so arrays mixing shim and ordinary requests work.
//!
//! A request lives in the registry, keyed by its handle, from its start to
//! its completion; a freed one (`MPI_Request_free`) moves to the detached
//! list, which keeps its communicator alive until its work finished.

use crate::cuda::Event;
use crate::errors;
use crate::settings::Inside;
use gpucoll::Communicator;
use mpi_sys::{MPI_Request, MPI_Status};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What a request may wait for besides GPU work: a transfer staged
/// through host memory whose inner MPI request the shim completes
/// (`p2p::Transfer`). A trait, so that this file needs nothing of the
/// modules whose requests it keeps.
pub trait HostWork: Send + Sync {
    /// Whether the work finished (waiting for it with `wait`). On
    /// completion an error code is stored in `code`.
    fn done(&self, wait: bool, code: &AtomicI32) -> bool;
    /// `MPI_Cancel` of the request: ask MPI to cancel the inner request
    /// (it still completes, cancelled or not, through `done`).
    fn cancel(&self);
    /// Write the finished work's status as the request's.
    ///
    /// # Safety
    /// `status` is writable.
    unsafe fn fill(&self, status: *mut MPI_Status, code: c_int);
}

pub struct ShimRequest {
    event: Option<Event>,
    comm: Mutex<Option<Communicator>>,
    call: &'static str,
    code: AtomicI32,
    /// Host-side work (a staged point-to-point transfer): the request is
    /// done when it is, and its status is the request's.
    host: Option<Box<dyn HostWork>>,
}

impl ShimRequest {
    /// Whether the GPU work finished (waiting for it with `wait`).
    fn done(&self, wait: bool) -> bool {
        if let Some(t) = &self.host {
            return t.done(wait, &self.code);
        }
        let Some(ev) = &self.event else { return true };
        let r = if wait {
            ev.wait().map(|_| true)
        } else {
            ev.is_done()
        };
        match r {
            Ok(done) => done,
            Err(e) => {
                errors::log_failure(self.call, &e);
                self.code
                    .store(mpi_sys::MPI_ERR_OTHER as c_int, Ordering::Relaxed);
                true
            }
        }
    }

    /// After the work finished: pick up an asynchronous gpucoll error and
    /// release the communicator.
    fn settle(&self) {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(c) = comm {
            if let Err(e) = c.async_error() {
                errors::log_failure(self.call, &e.to_string());
                self.code.store(errors::code_of(&e), Ordering::Relaxed);
            }
            let _inside = Inside::enter();
            drop(c);
        }
    }
}

/// Requests not completed yet, by handle.
fn registry() -> &'static Mutex<HashMap<usize, Arc<ShimRequest>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<ShimRequest>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Freed requests whose work may still run.
fn detached() -> &'static Mutex<Vec<Arc<ShimRequest>>> {
    static D: OnceLock<Mutex<Vec<Arc<ShimRequest>>>> = OnceLock::new();
    D.get_or_init(|| Mutex::new(Vec::new()))
}

/// Registered plus detached requests: the completion calls skip every
/// lookup while it is zero.
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);

#[inline]
pub fn any_outstanding() -> bool {
    OUTSTANDING.load(Ordering::Acquire) != 0
}

unsafe extern "C" fn query(extra: *mut c_void, status: *mut MPI_Status) -> c_int {
    // SAFETY: `extra` is the `Box<Arc<ShimRequest>>` made in `start`, alive
    // until `free` runs (MPI calls query before free).
    let req = unsafe { &*(extra as *const Arc<ShimRequest>) };
    let code = req.code.load(Ordering::Relaxed);
    if !status.is_null() {
        // SAFETY: MPI passes a writable status.
        unsafe {
            (*status).MPI_SOURCE = mpi_sys::RSMPI_ANY_SOURCE;
            (*status).MPI_TAG = mpi_sys::RSMPI_ANY_TAG;
            (*status).MPI_ERROR = code;
            mpi_sys::PMPI_Status_set_elements(status, crate::handles::byte_type(), 0);
            mpi_sys::PMPI_Status_set_cancelled(status, 0);
        }
        if let Some(t) = &req.host {
            // SAFETY: as above.
            unsafe { t.fill(status, code) };
        }
    }
    code
}

unsafe extern "C" fn free(extra: *mut c_void) -> c_int {
    // SAFETY: the box made in `start`; MPI calls free once.
    drop(unsafe { Box::from_raw(extra as *mut Arc<ShimRequest>) });
    0
}

/// Collectives cannot be cancelled: the request completes normally and
/// `MPI_Test_cancelled` says false. Host work (a staged receive or send)
/// passes the cancel on to its inner MPI request, whose status then says
/// whether it was cancelled.
unsafe extern "C" fn cancel(extra: *mut c_void, complete: c_int) -> c_int {
    // SAFETY: `extra` is the `Box<Arc<ShimRequest>>` made in `start`, alive
    // until `free` runs.
    let req = unsafe { &*(extra as *const Arc<ShimRequest>) };
    if complete == 0 {
        if let Some(t) = &req.host {
            t.cancel();
        }
    }
    0
}

/// # Safety
/// `request` is writable.
unsafe fn start(req: Arc<ShimRequest>, request: *mut MPI_Request) -> c_int {
    let extra = Box::into_raw(Box::new(req)) as *mut c_void;
    // SAFETY: valid callbacks; `extra` is released by `free`; `request` is writable.
    let rc = unsafe {
        mpi_sys::PMPI_Grequest_start(Some(query), Some(free), Some(cancel), extra, request)
    };
    if rc != 0 {
        // SAFETY: MPI did not take `extra`.
        drop(unsafe { Box::from_raw(extra as *mut Arc<ShimRequest>) });
    }
    rc
}

/// A request for work that already ended with `code` (0 or an error already
/// raised): complete at once. On error no request is made.
///
/// # Safety
/// `request` is writable.
pub unsafe fn start_done(code: c_int, request: *mut MPI_Request) -> c_int {
    if code != 0 {
        // SAFETY: writable per the contract.
        unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        return code;
    }
    let req = Arc::new(ShimRequest {
        event: None,
        comm: Mutex::new(None),
        call: "",
        code: AtomicI32::new(0),
        host: None,
    });
    // SAFETY: writable per the contract.
    let rc = unsafe { start(req, request) };
    if rc != 0 {
        // SAFETY: writable per the contract.
        unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        return rc;
    }
    // SAFETY: the handle just started.
    unsafe { mpi_sys::PMPI_Grequest_complete(*request) }
}

/// A request for work queued on a stream, done when `event` has passed
/// (`None`: work that already ran, in host test mode; the request still
/// completes through the completion calls, as a device request does).
///
/// # Safety
/// `request` is writable.
pub unsafe fn start_pending(
    event: Option<Event>,
    comm: Communicator,
    call: &'static str,
    request: *mut MPI_Request,
) -> c_int {
    let req = Arc::new(ShimRequest {
        event,
        comm: Mutex::new(Some(comm)),
        call,
        code: AtomicI32::new(0),
        host: None,
    });
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: writable per the contract.
    let rc = unsafe { start(req.clone(), request) };
    if rc == 0 {
        // SAFETY: the handle just started.
        reg.insert(unsafe { (*request).0 } as usize, req);
        OUTSTANDING.fetch_add(1, Ordering::AcqRel);
    }
    rc
}

/// A request for host-side work `t` (a staged point-to-point transfer),
/// done when `t` is.
///
/// # Safety
/// `request` is writable.
pub unsafe fn start_p2p(
    t: Box<dyn HostWork>,
    call: &'static str,
    request: *mut MPI_Request,
) -> c_int {
    let req = Arc::new(ShimRequest {
        event: None,
        comm: Mutex::new(None),
        call,
        code: AtomicI32::new(0),
        host: Some(t),
    });
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: writable per the contract.
    let rc = unsafe { start(req.clone(), request) };
    if rc != 0 {
        // SAFETY: writable per the contract.
        unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
    } else {
        // SAFETY: the handle just started.
        reg.insert(unsafe { (*request).0 } as usize, req);
        OUTSTANDING.fetch_add(1, Ordering::AcqRel);
    }
    rc
}

fn find(request: MPI_Request) -> Option<Arc<ShimRequest>> {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(request.0 as usize))
        .cloned()
}

/// Whether `request` is one of the shim's pending requests.
pub fn is_shim(request: MPI_Request) -> bool {
    any_outstanding() && find(request).is_some()
}

/// Complete `request` towards MPI if it is a shim request whose work
/// finished (waiting for the work with `wait`). Returns false only for a
/// shim request still running.
pub fn progress(request: MPI_Request, wait: bool) -> bool {
    let Some(req) = find(request) else {
        return true;
    };
    if !req.done(wait) {
        return false;
    }
    let key = request.0 as usize;
    let mine = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key)
        .is_some();
    if mine {
        req.settle();
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: a started generalized request not completed before (only
        // the thread that removed it from the registry gets here).
        unsafe { mpi_sys::PMPI_Grequest_complete(request) };
    }
    true
}

/// Progress every shim request in `requests` (waiting for each with `wait`);
/// true if the array holds any shim request.
///
/// # Safety
/// `requests` points at `n` handles.
pub unsafe fn progress_all(n: c_int, requests: *const MPI_Request, wait: bool) -> bool {
    if !any_outstanding() || requests.is_null() || n <= 0 {
        return false;
    }
    reap_detached();
    // SAFETY: `n` readable handles per the contract.
    let reqs = unsafe { std::slice::from_raw_parts(requests, n as usize) };
    let mut any = false;
    for r in reqs {
        if find(*r).is_some() {
            any = true;
            progress(*r, wait);
        }
    }
    any
}

/// `MPI_Request_free` of a shim request: MPI forgets the handle, the work
/// still completes (its communicator stays alive until then).
pub fn detach(request: MPI_Request) {
    let removed = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(request.0 as usize));
    if let Some(req) = removed {
        // It stays outstanding (counted) while detached.
        detached()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(req);
        // SAFETY: a started generalized request, completed once (it left the registry).
        unsafe { mpi_sys::PMPI_Grequest_complete(request) };
    }
}

/// Drop detached requests whose work finished.
pub fn reap_detached() {
    let mut d = detached().lock().unwrap_or_else(|p| p.into_inner());
    let before = d.len();
    d.retain(|r| {
        if r.done(false) {
            r.settle();
            false
        } else {
            true
        }
    });
    OUTSTANDING.fetch_sub(before - d.len(), Ordering::AcqRel);
}

/// At `MPI_Finalize`: wait for every outstanding request's work and complete
/// it towards MPI (the program never waited for it).
pub fn finish_all() {
    let pending: Vec<(usize, Arc<ShimRequest>)> = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .collect();
    for (key, req) in pending {
        req.done(true);
        req.settle();
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        let handle = MPI_Request(key as *mut mpi_sys::ompi_request_t);
        // SAFETY: a started generalized request not completed before.
        unsafe { mpi_sys::PMPI_Grequest_complete(handle) };
    }
    let freed: Vec<Arc<ShimRequest>> =
        std::mem::take(&mut *detached().lock().unwrap_or_else(|p| p.into_inner()));
    for req in freed {
        req.done(true);
        req.settle();
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
    }
}
