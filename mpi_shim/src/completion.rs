//! The completion family. For a shim request the call first makes the
//! generalized request complete once its work finished (waiting for it
//! where the call blocks), then hands everything to `PMPI_`; ordinary
//! requests go to `PMPI_` untouched. Calls that wait for "any" or "some" of
//! a mixed array poll both kinds until one completes. A handle the shim
//! does not hold as pending (an ordinary request, a stale or foreign
//! handle) is only compared, never used: `PMPI_` judges it. Each export
//! runs inside the panic net (`errors::guarded_exports!`), whose errors go
//! to `MPI_COMM_WORLD`'s handler. After each call,
//! `p2p::after_completion` copies back staged persistent receives that
//! finished (nothing to look up unless one is started).

use crate::errors::{self, guarded_exports};
use crate::p2p;
use crate::requests;
use crate::settings;
use mpi_sys::{MPI_Request, MPI_Status};
use std::ffi::c_int;

/// Whether the shim must look at the requests of this call.
#[inline]
fn watching() -> bool {
    settings::active() && requests::any_outstanding()
}

guarded_exports! {
    /// # Safety
    /// As `MPI_Wait`.
    fn MPI_Wait(request: *mut MPI_Request, status: *mut MPI_Status) on errors::world(), || () => {
        settings::maybe_panic("MPI_Wait");
        if watching() && !request.is_null() {
            // SAFETY: MPI's contract: `request` is readable.
            requests::progress(unsafe { *request }, true);
        }
        // SAFETY: forwarded unchanged; a persistent request keeps its handle.
        unsafe { p2p::after_completion(mpi_sys::PMPI_Wait(request, status), 1, request) }
    }

    /// # Safety
    /// As `MPI_Test`.
    fn MPI_Test(request: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status)
        on errors::world(), || () =>
    {
        if watching() && !request.is_null() {
            requests::reap_detached();
            // SAFETY: MPI's contract: `request` is readable.
            requests::progress(unsafe { *request }, false);
        }
        // SAFETY: forwarded unchanged; a persistent request keeps its handle.
        unsafe { p2p::after_completion(mpi_sys::PMPI_Test(request, flag, status), 1, request) }
    }

    /// # Safety
    /// As `MPI_Waitany`.
    fn MPI_Waitany(
        count: c_int,
        requests: *mut MPI_Request,
        index: *mut c_int,
        status: *mut MPI_Status,
    ) on errors::world(), || () => {
        let mut flag: c_int = 0;
        // SAFETY: forwarded unchanged (`flag` a valid out-pointer): MPI's contract.
        let rc = unsafe {
            wait_polling(
                count,
                requests,
                || mpi_sys::PMPI_Waitany(count, requests, index, status),
                || {
                    let rc = mpi_sys::PMPI_Testany(count, requests, index, &mut flag, status);
                    (rc != 0 || flag != 0).then_some(rc)
                },
            )
        };
        // SAFETY: as above.
        unsafe { p2p::after_completion(rc, count, requests) }
    }

    /// # Safety
    /// As `MPI_Waitsome`.
    fn MPI_Waitsome(
        incount: c_int,
        requests: *mut MPI_Request,
        outcount: *mut c_int,
        indices: *mut c_int,
        statuses: *mut MPI_Status,
    ) on errors::world(), || () => {
        // SAFETY: forwarded unchanged; MPI wrote `outcount` (a count, or
        // MPI_UNDEFINED) when it is read: MPI's contract.
        let rc = unsafe {
            wait_polling(
                incount,
                requests,
                || mpi_sys::PMPI_Waitsome(incount, requests, outcount, indices, statuses),
                || {
                    let rc = mpi_sys::PMPI_Testsome(incount, requests, outcount, indices, statuses);
                    (rc != 0 || outcount.is_null() || *outcount != 0).then_some(rc)
                },
            )
        };
        // SAFETY: as above.
        unsafe { p2p::after_completion(rc, incount, requests) }
    }

    /// # Safety
    /// As `MPI_Request_get_status`.
    fn MPI_Request_get_status(request: MPI_Request, flag: *mut c_int, status: *mut MPI_Status)
        on errors::world(), || () =>
    {
        if watching() {
            requests::progress(request, false);
        }
        // SAFETY: forwarded unchanged.
        let rc = unsafe { mpi_sys::PMPI_Request_get_status(request, flag, status) };
        // SAFETY: one handle, read only.
        unsafe { p2p::after_completion(rc, 1, &request) }
    }

    /// # Safety
    /// As `MPI_Request_free`.
    fn MPI_Request_free(request: *mut MPI_Request) on errors::world(), || () => {
        if watching() && !request.is_null() {
            // SAFETY: MPI's contract: `request` is readable.
            requests::detach(unsafe { *request });
        }
        let freed = if request.is_null() {
            // SAFETY: reading a link-time MPI constant.
            unsafe { mpi_sys::RSMPI_REQUEST_NULL }
        } else {
            // SAFETY: MPI's contract: `request` is readable.
            unsafe { *request }
        };
        // SAFETY: forwarded unchanged.
        let rc = unsafe { mpi_sys::PMPI_Request_free(request) };
        p2p::after_free(freed, rc);
        rc
    }

    /// Collectives cannot be cancelled; a shim request's cancel callback
    /// leaves it to complete normally, as MPI's own collective requests do,
    /// or, for a staged point-to-point transfer, cancels its inner request.
    ///
    /// # Safety
    /// As `MPI_Cancel`.
    fn MPI_Cancel(request: *mut MPI_Request) on errors::world(), || () => {
        // SAFETY: forwarded unchanged.
        unsafe { mpi_sys::PMPI_Cancel(request) }
    }
}

/// Exports completion calls on an array of requests that pass it to `PMPI_`
/// unchanged once the shim's requests in it are progressed (`$wait`: waiting
/// for their work): each takes `count` and `requests`, then the parameters
/// listed.
macro_rules! progress_then_pmpi {
    ($($name:ident => $pmpi:ident, wait: $wait:literal, ($($param:ident: $ty:ty),+);)+) => {$(
        guarded_exports! {
            #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
            fn $name(
                count: c_int,
                requests: *mut MPI_Request,
                $($param: $ty),+
            ) on errors::world(), || () => {
                if watching() {
                    // SAFETY: MPI's contract: `count` readable handles.
                    unsafe { requests::progress_all(count, requests, $wait) };
                }
                // SAFETY: forwarded unchanged; persistent requests keep
                // their handles.
                unsafe {
                    p2p::after_completion(mpi_sys::$pmpi(count, requests, $($param),+), count, requests)
                }
            }
        }
    )+};
}

progress_then_pmpi! {
    MPI_Waitall => PMPI_Waitall, wait: true, (statuses: *mut MPI_Status);
    MPI_Testall => PMPI_Testall, wait: false, (flag: *mut c_int, statuses: *mut MPI_Status);
    MPI_Testany => PMPI_Testany, wait: false,
        (index: *mut c_int, flag: *mut c_int, status: *mut MPI_Status);
    MPI_Testsome => PMPI_Testsome, wait: false,
        (outcount: *mut c_int, indices: *mut c_int, statuses: *mut MPI_Status);
}

/// `MPI_Waitany` and `MPI_Waitsome`: with shim requests in the array, poll
/// `test` (the `PMPI_Test*` form: `Some(code)` once done) and progress the
/// shim's requests in turn, so that either kind may complete first;
/// otherwise `wait` (the `PMPI_` call) as it is.
///
/// # Safety
/// `requests` holds `count` readable handles (MPI's contract).
unsafe fn wait_polling(
    count: c_int,
    requests: *mut MPI_Request,
    wait: impl FnOnce() -> c_int,
    mut test: impl FnMut() -> Option<c_int>,
) -> c_int {
    // SAFETY: per the function's contract.
    if !watching() || !unsafe { requests::progress_all(count, requests, false) } {
        return wait();
    }
    loop {
        if let Some(code) = test() {
            return code;
        }
        std::thread::yield_now();
        // SAFETY: as above.
        unsafe { requests::progress_all(count, requests, false) };
    }
}
