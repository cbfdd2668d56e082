//! The shim's nonblocking requests: real MPI handles from
//! `MPI_Grequest_start`, completed by the shim (`MPI_Grequest_complete`)
//! once their [`Work`] finished: a collective queued on a stream, one
//! running on gpucoll's host backend, or an inner MPI request on staged
//! copies (a staged collective or point-to-point transfer). The completion
//! calls (`completion.rs`) drive that, then hand the handles to `PMPI_`,
//! so arrays mixing shim and ordinary requests work.
//!
//! Handles are never dereferenced here: a handle the program passes is only
//! a key. A request is *pending* (its handle a key of the pending map) from
//! its start until the shim completes it towards MPI; MPI's free callback
//! forgets it for good, so a handle MPI freed (and may hand out again for
//! another request) is never taken for a shim request, and the callbacks
//! find their request by an id, never by a pointer MPI keeps. A stale or
//! foreign handle is not the shim's: it goes to `PMPI_`, which judges it.
//! A freed request (`MPI_Request_free`) moves to the detached list, which
//! keeps its work alive until it finished.

use mpi_sys::{MPI_Request, MPI_Status};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// What a request waits for. A trait, so that this file needs nothing of
/// the modules whose requests it keeps.
pub trait Work: Send + Sync {
    /// Whether the work finished (waiting for it with `wait`). On
    /// completion an error code is stored in `code`. Called again after it
    /// said true, it says true again.
    fn done(&self, wait: bool, code: &AtomicI32) -> bool;
    /// `MPI_Cancel` of the request (collectives cannot be cancelled: by
    /// default nothing happens and the request completes normally).
    fn cancel(&self) {}
    /// Write the finished work's status as the request's (by default the
    /// status says nothing beyond its error code).
    ///
    /// # Safety
    /// `status` is writable.
    unsafe fn fill(&self, _status: *mut MPI_Status, _code: c_int) {}
}

struct ShimRequest {
    code: AtomicI32,
    work: Box<dyn Work>,
}

impl ShimRequest {
    fn done(&self, wait: bool) -> bool {
        self.work.done(wait, &self.code)
    }
}

#[derive(Default)]
struct Registry {
    /// Every request MPI still holds, by the id its callbacks get.
    by_id: HashMap<u64, Arc<ShimRequest>>,
    /// Requests not completed towards MPI yet: handle -> id.
    pending: HashMap<usize, u64>,
    /// Freed by the program (`MPI_Request_free`) before their work
    /// finished.
    detached: Vec<Arc<ShimRequest>>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Pending plus detached requests: the completion calls skip every lookup
/// while it is zero.
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);

#[inline]
pub fn any_outstanding() -> bool {
    OUTSTANDING.load(Ordering::Acquire) != 0
}

fn by_id(extra: *mut c_void) -> Option<Arc<ShimRequest>> {
    registry().by_id.get(&(extra as usize as u64)).cloned()
}

unsafe extern "C" fn query(extra: *mut c_void, status: *mut MPI_Status) -> c_int {
    crate::errors::catch(|| {
        let Some(req) = by_id(extra) else {
            return mpi_sys::MPI_ERR_REQUEST as c_int;
        };
        let code = req.code.load(Ordering::Relaxed);
        if !status.is_null() {
            // SAFETY: MPI passes a writable status.
            unsafe {
                (*status).MPI_SOURCE = mpi_sys::RSMPI_ANY_SOURCE;
                (*status).MPI_TAG = mpi_sys::RSMPI_ANY_TAG;
                (*status).MPI_ERROR = code;
                mpi_sys::PMPI_Status_set_elements(status, crate::handles::byte_type(), 0);
                mpi_sys::PMPI_Status_set_cancelled(status, 0);
                req.work.fill(status, code);
            }
        }
        code
    })
    .unwrap_or(mpi_sys::MPI_ERR_INTERN as c_int)
}

/// MPI frees the request: forget it, so its handle (which MPI may give to
/// another request now) is never taken for it again.
unsafe extern "C" fn free(extra: *mut c_void) -> c_int {
    crate::errors::catch(|| {
        let id = extra as usize as u64;
        let mut r = registry();
        if r.by_id.remove(&id).is_none() {
            return mpi_sys::MPI_ERR_REQUEST as c_int;
        }
        let before = r.pending.len();
        r.pending.retain(|_, v| *v != id);
        let forgotten = before - r.pending.len();
        drop(r);
        if forgotten > 0 {
            // Freed by MPI without the shim completing it (the program
            // called PMPI_ directly): nothing waits for it any more.
            OUTSTANDING.fetch_sub(forgotten, Ordering::AcqRel);
        }
        0
    })
    .unwrap_or(mpi_sys::MPI_ERR_INTERN as c_int)
}

/// `MPI_Cancel`: passed to the work (a staged receive cancels its inner
/// request; collectives complete normally and `MPI_Test_cancelled` says
/// false).
unsafe extern "C" fn cancel(extra: *mut c_void, complete: c_int) -> c_int {
    crate::errors::catch(|| {
        if complete == 0 {
            if let Some(req) = by_id(extra) {
                req.work.cancel();
            }
        }
        0
    })
    .unwrap_or(mpi_sys::MPI_ERR_INTERN as c_int)
}

/// Start a generalized request for `req` in `*request`, pending until its
/// work finished. Writes `MPI_REQUEST_NULL` when MPI refuses.
///
/// # Safety
/// `request` is writable.
unsafe fn start(req: ShimRequest, request: *mut MPI_Request) -> c_int {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut reg = registry();
    reg.by_id.insert(id, Arc::new(req));
    // SAFETY: valid callbacks; `extra` is an id, not a pointer; `request`
    // is writable. No callback runs inside the start (the lock is held).
    let rc = unsafe {
        mpi_sys::PMPI_Grequest_start(
            Some(query),
            Some(free),
            Some(cancel),
            id as usize as *mut c_void,
            request,
        )
    };
    if rc != 0 {
        reg.by_id.remove(&id);
        // SAFETY: writable per the contract.
        unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
        return rc;
    }
    // SAFETY: the handle just started.
    reg.pending.insert(unsafe { (*request).0 } as usize, id);
    OUTSTANDING.fetch_add(1, Ordering::AcqRel);
    0
}

/// A request done when `work` is.
///
/// # Safety
/// `request` is writable.
pub unsafe fn start_work(work: Box<dyn Work>, request: *mut MPI_Request) -> c_int {
    let req = ShimRequest {
        code: AtomicI32::new(0),
        work,
    };
    // SAFETY: writable per the contract.
    unsafe { start(req, request) }
}

fn find(request: MPI_Request) -> Option<Arc<ShimRequest>> {
    let r = registry();
    let id = r.pending.get(&(request.0 as usize))?;
    r.by_id.get(id).cloned()
}

/// Take `request` out of the pending map if it is still there (only one
/// thread completes a request towards MPI).
fn unpend(request: MPI_Request) -> bool {
    let removed = registry().pending.remove(&(request.0 as usize)).is_some();
    if removed {
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
    }
    removed
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
    if unpend(request) {
        // SAFETY: a started generalized request MPI still holds (its free
        // callback forgets it), not completed before (it left the pending
        // map here, once).
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
/// still completes (what it uses stays alive until then).
pub fn detach(request: MPI_Request) {
    let Some(req) = find(request) else { return };
    let mut r = registry();
    if r.pending.remove(&(request.0 as usize)).is_none() {
        return;
    }
    // It stays outstanding (counted) while detached.
    r.detached.push(req);
    drop(r);
    // SAFETY: a started generalized request MPI still holds, completed
    // once (it left the pending map here).
    unsafe { mpi_sys::PMPI_Grequest_complete(request) };
}

/// Drop detached requests whose work finished.
pub fn reap_detached() {
    let detached = std::mem::take(&mut registry().detached);
    if detached.is_empty() {
        return;
    }
    let before = detached.len();
    let running: Vec<_> = detached.into_iter().filter(|r| !r.done(false)).collect();
    OUTSTANDING.fetch_sub(before - running.len(), Ordering::AcqRel);
    registry().detached.extend(running);
}

/// At `MPI_Finalize`: wait for every outstanding request's work and complete
/// it towards MPI (the program never waited for it).
pub fn finish_all() {
    let pending: Vec<(usize, u64)> = registry().pending.drain().collect();
    for (key, id) in pending {
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
        let Some(req) = registry().by_id.get(&id).cloned() else {
            continue;
        };
        req.done(true);
        let handle = MPI_Request(key as *mut mpi_sys::ompi_request_t);
        // SAFETY: a started generalized request MPI still holds (it was
        // pending), completed once.
        unsafe { mpi_sys::PMPI_Grequest_complete(handle) };
    }
    let freed = std::mem::take(&mut registry().detached);
    for req in freed {
        req.done(true);
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
    }
}
