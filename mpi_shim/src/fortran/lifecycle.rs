//! `MPI_INIT`, `MPI_INIT_THREAD` and `MPI_FINALIZE` from Fortran.
//!
//! They must reach the shim's C `MPI_Init*`/`MPI_Finalize`, not `PMPI_*` as Open MPI's
//! wrappers do, so that the shim sets itself up and tears gpucoll down (a collective
//! step) before MPI is finalized.

use std::ptr;

use mpi_sys as ffi;

use super::handles::{set_ierror, Fint};

fortran_binding! {
    /// `MPI_INIT(IERROR)`: Fortran has no argc/argv to pass, which MPI allows as nulls.
    fn init(ierror: *mut Fint) as "MPI_INIT", "mpi_init", "MPI_Init" {
        // SAFETY: null argc/argv are valid for MPI_Init; ierror is null or an INTEGER.
        unsafe {
            let code = ffi::MPI_Init(ptr::null_mut(), ptr::null_mut());
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_INIT_THREAD(REQUIRED, PROVIDED, IERROR)`.
    fn init_thread(required: *const Fint, provided: *mut Fint, ierror: *mut Fint)
        as "MPI_INIT_THREAD", "mpi_init_thread", "MPI_Init_thread"
    {
        // SAFETY: required and provided are INTEGERs passed by reference; ierror is
        // null or an INTEGER.
        unsafe {
            let mut c_provided = 0;
            let code = ffi::MPI_Init_thread(
                ptr::null_mut(),
                ptr::null_mut(),
                *required,
                &mut c_provided,
            );
            if code == ffi::MPI_SUCCESS as i32 {
                *provided = c_provided;
            }
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_FINALIZE(IERROR)`.
    fn finalize(ierror: *mut Fint) as "MPI_FINALIZE", "mpi_finalize", "MPI_Finalize" {
        // SAFETY: MPI_Finalize takes no pointers; ierror is null or an INTEGER.
        unsafe {
            let code = ffi::MPI_Finalize();
            set_ierror(ierror, code);
        }
    }
}
