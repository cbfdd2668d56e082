//! `MPI_WAIT*`, `MPI_TEST*`, `MPI_REQUEST_FREE` and `MPI_CANCEL` from Fortran.
//!
//! They go through the shim's C completion functions, which complete the shim's own
//! requests and pass ordinary ones to `PMPI_*`. Request arrays are converted to C
//! handles before the call and every handle is written back after it (a completed
//! request becomes `MPI_REQUEST_NULL`); returned indices are 1-based in Fortran.

use std::ffi::c_int;
use std::slice;

use mpi_sys as ffi;

use super::handles::{
    empty_status, invalid_count, invalid_request, is_status_ignore, is_statuses_ignore, logical,
    request_c2f, request_f2c, set_ierror, store_status, Fint, F_STATUS_SIZE,
};

/// A Fortran request array and the C requests made of it.
struct Requests {
    fortran: *mut Fint,
    c: Vec<ffi::MPI_Request>,
}

impl Requests {
    /// # Safety
    /// `count` points to an `INTEGER`; `requests` to that many `INTEGER`s when it is
    /// positive.
    unsafe fn new(count: *const Fint, requests: *mut Fint) -> Result<Self, c_int> {
        // SAFETY: per the function's contract.
        let count = unsafe { *count };
        let Ok(len) = usize::try_from(count) else {
            return Err(invalid_count());
        };
        let fortran: &[Fint] = if len == 0 {
            &[]
        } else {
            // SAFETY: a positive count means the array has `len` INTEGERs.
            unsafe { slice::from_raw_parts(requests, len) }
        };
        let c = fortran
            .iter()
            .map(|&handle| request_f2c(handle).ok_or_else(invalid_request))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Requests {
            fortran: requests,
            c,
        })
    }

    fn count(&self) -> c_int {
        // The length came from a non-negative c_int.
        self.c.len() as c_int
    }

    /// Stores every C request's Fortran handle back into the Fortran array.
    fn write_back(&self) {
        for (i, &request) in self.c.iter().enumerate() {
            // SAFETY: `new` read `c.len()` handles from this array, so it has room.
            unsafe { *self.fortran.add(i) = request_c2f(request) };
        }
    }
}

/// A Fortran status array (or `MPI_STATUSES_IGNORE`) and the C statuses for it.
struct Statuses {
    fortran: *mut Fint,
    c: Option<Vec<ffi::MPI_Status>>,
}

impl Statuses {
    fn new(statuses: *mut Fint, count: usize) -> Self {
        let c = (!is_statuses_ignore(statuses) && !statuses.is_null())
            .then(|| vec![empty_status(); count]);
        Statuses {
            fortran: statuses,
            c,
        }
    }

    fn as_c(&mut self) -> *mut ffi::MPI_Status {
        match &mut self.c {
            Some(statuses) => statuses.as_mut_ptr(),
            // SAFETY: reading an immutable extern constant of mpi-sys.
            None => unsafe { ffi::RSMPI_STATUSES_IGNORE },
        }
    }

    /// Copies the first `count` C statuses into the Fortran array.
    ///
    /// # Safety
    /// The Fortran array holds at least `count` statuses (`count` ≤ the request count).
    unsafe fn store(&self, count: usize) {
        let Some(statuses) = &self.c else {
            return;
        };
        for (i, status) in statuses.iter().take(count).enumerate() {
            // SAFETY: status i of the Fortran array starts F_STATUS_SIZE * i integers in.
            unsafe { ffi::PMPI_Status_c2f(status, self.fortran.add(i * F_STATUS_SIZE)) };
        }
    }
}

/// The C pointer for a single Fortran status argument.
fn status_target(f_status: *const Fint, local: &mut ffi::MPI_Status) -> *mut ffi::MPI_Status {
    if is_status_ignore(f_status) {
        // SAFETY: reading an immutable extern constant of mpi-sys.
        unsafe { ffi::RSMPI_STATUS_IGNORE }
    } else {
        local
    }
}

/// A C index (0-based or `MPI_UNDEFINED`) as Fortran's (1-based or `MPI_UNDEFINED`).
fn fortran_index(index: c_int) -> Fint {
    if index == ffi::MPI_UNDEFINED || index < 0 {
        index
    } else {
        index + 1
    }
}

fortran_binding! {
    /// `MPI_WAIT(REQUEST, STATUS, IERROR)`.
    fn wait(request: *mut Fint, status: *mut Fint, ierror: *mut Fint)
        as "MPI_WAIT", "mpi_wait", "MPI_Wait"
    {
        // SAFETY: Fortran passes request and status by reference; ierror is null or an
        // INTEGER.
        unsafe {
            let Some(mut c_request) = request_f2c(*request) else {
                return set_ierror(ierror, invalid_request());
            };
            let mut c_status = empty_status();
            let code = ffi::MPI_Wait(&mut c_request, status_target(status, &mut c_status));
            *request = request_c2f(c_request);
            store_status(&c_status, status);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_TEST(REQUEST, FLAG, STATUS, IERROR)`.
    fn test(request: *mut Fint, flag: *mut Fint, status: *mut Fint, ierror: *mut Fint)
        as "MPI_TEST", "mpi_test", "MPI_Test"
    {
        // SAFETY: Fortran passes request, flag and status by reference; ierror is null
        // or an INTEGER.
        unsafe {
            let Some(mut c_request) = request_f2c(*request) else {
                return set_ierror(ierror, invalid_request());
            };
            let mut c_flag = 0;
            let mut c_status = empty_status();
            let code =
                ffi::MPI_Test(&mut c_request, &mut c_flag, status_target(status, &mut c_status));
            *request = request_c2f(c_request);
            *flag = logical(c_flag);
            if c_flag != 0 {
                store_status(&c_status, status);
            }
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_WAITALL(COUNT, ARRAY_OF_REQUESTS, ARRAY_OF_STATUSES, IERROR)`.
    fn waitall(count: *const Fint, requests: *mut Fint, statuses: *mut Fint, ierror: *mut Fint)
        as "MPI_WAITALL", "mpi_waitall", "MPI_Waitall"
    {
        // SAFETY: Fortran passes count by reference and arrays of `count` entries.
        unsafe {
            let mut c_requests = match Requests::new(count, requests) {
                Ok(c_requests) => c_requests,
                Err(code) => return set_ierror(ierror, code),
            };
            let mut c_statuses = Statuses::new(statuses, c_requests.c.len());
            let code = ffi::MPI_Waitall(
                c_requests.count(),
                c_requests.c.as_mut_ptr(),
                c_statuses.as_c(),
            );
            c_requests.write_back();
            c_statuses.store(c_requests.c.len());
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_TESTALL(COUNT, ARRAY_OF_REQUESTS, FLAG, ARRAY_OF_STATUSES, IERROR)`.
    fn testall(
        count: *const Fint,
        requests: *mut Fint,
        flag: *mut Fint,
        statuses: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_TESTALL", "mpi_testall", "MPI_Testall" {
        // SAFETY: Fortran passes count and flag by reference and arrays of `count`
        // entries.
        unsafe {
            let mut c_requests = match Requests::new(count, requests) {
                Ok(c_requests) => c_requests,
                Err(code) => return set_ierror(ierror, code),
            };
            let mut c_statuses = Statuses::new(statuses, c_requests.c.len());
            let mut c_flag = 0;
            let code = ffi::MPI_Testall(
                c_requests.count(),
                c_requests.c.as_mut_ptr(),
                &mut c_flag,
                c_statuses.as_c(),
            );
            c_requests.write_back();
            *flag = logical(c_flag);
            if c_flag != 0 {
                c_statuses.store(c_requests.c.len());
            }
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_WAITANY(COUNT, ARRAY_OF_REQUESTS, INDEX, STATUS, IERROR)`.
    fn waitany(
        count: *const Fint,
        requests: *mut Fint,
        index: *mut Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_WAITANY", "mpi_waitany", "MPI_Waitany" {
        // SAFETY: Fortran passes count, index and status by reference and an array of
        // `count` requests.
        unsafe {
            let mut c_requests = match Requests::new(count, requests) {
                Ok(c_requests) => c_requests,
                Err(code) => return set_ierror(ierror, code),
            };
            let mut c_index = ffi::MPI_UNDEFINED;
            let mut c_status = empty_status();
            let code = ffi::MPI_Waitany(
                c_requests.count(),
                c_requests.c.as_mut_ptr(),
                &mut c_index,
                status_target(status, &mut c_status),
            );
            c_requests.write_back();
            *index = fortran_index(c_index);
            store_status(&c_status, status);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_TESTANY(COUNT, ARRAY_OF_REQUESTS, INDEX, FLAG, STATUS, IERROR)`.
    fn testany(
        count: *const Fint,
        requests: *mut Fint,
        index: *mut Fint,
        flag: *mut Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_TESTANY", "mpi_testany", "MPI_Testany" {
        // SAFETY: Fortran passes count, index, flag and status by reference and an
        // array of `count` requests.
        unsafe {
            let mut c_requests = match Requests::new(count, requests) {
                Ok(c_requests) => c_requests,
                Err(code) => return set_ierror(ierror, code),
            };
            let mut c_index = ffi::MPI_UNDEFINED;
            let mut c_flag = 0;
            let mut c_status = empty_status();
            let code = ffi::MPI_Testany(
                c_requests.count(),
                c_requests.c.as_mut_ptr(),
                &mut c_index,
                &mut c_flag,
                status_target(status, &mut c_status),
            );
            c_requests.write_back();
            *index = fortran_index(c_index);
            *flag = logical(c_flag);
            if c_flag != 0 {
                store_status(&c_status, status);
            }
            set_ierror(ierror, code);
        }
    }
}

/// The shared body of `MPI_WAITSOME` and `MPI_TESTSOME`, which differ only in the C
/// function called.
///
/// # Safety
/// Fortran arguments of either function: `incount` and `outcount` by reference, arrays
/// of `incount` requests, indices and statuses (or `MPI_STATUSES_IGNORE`).
unsafe fn some(
    c_function: unsafe extern "C" fn(
        c_int,
        *mut ffi::MPI_Request,
        *mut c_int,
        *mut c_int,
        *mut ffi::MPI_Status,
    ) -> c_int,
    incount: *const Fint,
    requests: *mut Fint,
    outcount: *mut Fint,
    indices: *mut Fint,
    statuses: *mut Fint,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        let mut c_requests = match Requests::new(incount, requests) {
            Ok(c_requests) => c_requests,
            Err(code) => return set_ierror(ierror, code),
        };
        let len = c_requests.c.len();
        let mut c_statuses = Statuses::new(statuses, len);
        let mut c_indices: Vec<c_int> = vec![0; len];
        let mut c_outcount = ffi::MPI_UNDEFINED;
        let code = c_function(
            c_requests.count(),
            c_requests.c.as_mut_ptr(),
            &mut c_outcount,
            c_indices.as_mut_ptr(),
            c_statuses.as_c(),
        );
        c_requests.write_back();
        *outcount = c_outcount;
        let done = usize::try_from(c_outcount).unwrap_or(0).min(len);
        for (i, &c_index) in c_indices.iter().take(done).enumerate() {
            *indices.add(i) = fortran_index(c_index);
        }
        c_statuses.store(done);
        set_ierror(ierror, code);
    }
}

fortran_binding! {
    /// `MPI_WAITSOME(INCOUNT, ARRAY_OF_REQUESTS, OUTCOUNT, ARRAY_OF_INDICES,
    /// ARRAY_OF_STATUSES, IERROR)`.
    fn waitsome(
        incount: *const Fint,
        requests: *mut Fint,
        outcount: *mut Fint,
        indices: *mut Fint,
        statuses: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_WAITSOME", "mpi_waitsome", "MPI_Waitsome" {
        // SAFETY: the Fortran arguments of MPI_WAITSOME, as `some` requires.
        unsafe { some(ffi::MPI_Waitsome, incount, requests, outcount, indices, statuses, ierror) }
    }
}

fortran_binding! {
    /// `MPI_TESTSOME(INCOUNT, ARRAY_OF_REQUESTS, OUTCOUNT, ARRAY_OF_INDICES,
    /// ARRAY_OF_STATUSES, IERROR)`.
    fn testsome(
        incount: *const Fint,
        requests: *mut Fint,
        outcount: *mut Fint,
        indices: *mut Fint,
        statuses: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_TESTSOME", "mpi_testsome", "MPI_Testsome" {
        // SAFETY: the Fortran arguments of MPI_TESTSOME, as `some` requires.
        unsafe { some(ffi::MPI_Testsome, incount, requests, outcount, indices, statuses, ierror) }
    }
}

fortran_binding! {
    /// `MPI_REQUEST_FREE(REQUEST, IERROR)`.
    fn request_free(request: *mut Fint, ierror: *mut Fint)
        as "MPI_REQUEST_FREE", "mpi_request_free", "MPI_Request_free"
    {
        // SAFETY: Fortran passes the request by reference; ierror is null or an INTEGER.
        unsafe {
            let Some(mut c_request) = request_f2c(*request) else {
                return set_ierror(ierror, invalid_request());
            };
            let code = ffi::MPI_Request_free(&mut c_request);
            *request = request_c2f(c_request);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_CANCEL(REQUEST, IERROR)`: the request stays valid until completed or freed.
    fn cancel(request: *const Fint, ierror: *mut Fint)
        as "MPI_CANCEL", "mpi_cancel", "MPI_Cancel"
    {
        // SAFETY: Fortran passes the request by reference; ierror is null or an INTEGER.
        unsafe {
            let Some(mut c_request) = request_f2c(*request) else {
                return set_ierror(ierror, invalid_request());
            };
            let code = ffi::MPI_Cancel(&mut c_request);
            set_ierror(ierror, code);
        }
    }
}
