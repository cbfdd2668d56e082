//! `fortran_call!`: Fortran bindings of C functions whose arguments are
//! converted one by one by their kind, including output handles (a status,
//! a request, a window) and the handle kinds of one-sided communication
//! and MPI-IO. Used by `staged.rs` and `refused.rs`.

use std::ffi::c_int;

use mpi_sys as ffi;

use super::handles::{is_status_ignore, request_c2f, store_status, Fint};

/// The Fortran type of an argument of a kind: `buffer` (an address),
/// `int`, `aint`, `offset` (integers of their kinds, by reference), `ints`
/// (an integer array), handles (`datatype`, `op`, `comm`, `win`, `file`,
/// `info`), in-out positions (`position`, `aint_position`), and outputs
/// (`status`, `request`, `win_out`).
macro_rules! call_type {
    (buffer) => { *mut c_void };
    (int) => { *const Fint };
    (aint) => { *const ffi::MPI_Aint };
    (offset) => { *const ffi::MPI_Offset };
    (ints) => { *const Fint };
    (datatype) => { *const Fint };
    (op) => { *const Fint };
    (comm) => { *const Fint };
    (win) => { *const Fint };
    (file) => { *const Fint };
    (info) => { *const Fint };
    (position) => { *mut Fint };
    (aint_position) => { *mut ffi::MPI_Aint };
    (status) => { *mut Fint };
    (request) => { *mut Fint };
    (win_out) => { *mut Fint };
}

/// What a kind's argument is held as during the call (outputs need a C
/// value to be written into, then stored back).
macro_rules! call_hold {
    (status, $a:ident) => {
        $crate::fortran::calls::Out::new($a, $crate::fortran::handles::empty_status())
    };
    (request, $a:ident) => {
        $crate::fortran::calls::Out::new($a, ffi::RSMPI_REQUEST_NULL)
    };
    (win_out, $a:ident) => {
        $crate::fortran::calls::Out::new($a, ffi::RSMPI_WIN_NULL)
    };
    ($other:ident, $a:ident) => {
        $a
    };
}

/// The C value of a held argument.
macro_rules! call_c {
    (buffer, $a:ident) => {
        $crate::fortran::handles::buffer($a)
    };
    (int, $a:ident) => {
        *$a
    };
    (aint, $a:ident) => {
        *$a
    };
    (offset, $a:ident) => {
        *$a
    };
    (ints, $a:ident) => {
        $a
    };
    (datatype, $a:ident) => {
        $crate::fortran::handles::datatype($a)
    };
    (op, $a:ident) => {
        $crate::fortran::handles::op($a)
    };
    (comm, $a:ident) => {
        $crate::fortran::handles::comm($a)
    };
    (win, $a:ident) => {
        ffi::PMPI_Win_f2c(*$a)
    };
    (file, $a:ident) => {
        ffi::PMPI_File_f2c(*$a)
    };
    (info, $a:ident) => {
        ffi::PMPI_Info_f2c(*$a)
    };
    (position, $a:ident) => {
        $a
    };
    (aint_position, $a:ident) => {
        $a
    };
    (status, $a:ident) => {
        $a.status_target()
    };
    (request, $a:ident) => {
        &mut $a.c
    };
    (win_out, $a:ident) => {
        &mut $a.c
    };
}

/// Store an output back (after the call returned `code`).
macro_rules! call_store {
    (status, $a:ident, $code:ident) => {
        $a.store_status()
    };
    (request, $a:ident, $code:ident) => {
        $a.store_request($code)
    };
    (win_out, $a:ident, $code:ident) => {
        $a.store_win($code)
    };
    ($other:ident, $a:ident, $code:ident) => {};
}

/// Defines and exports (see `fortran_binding!`) the Fortran binding `$name`
/// of the C function `$c`: the arguments listed (converted by kind), then
/// `IERROR`.
macro_rules! fortran_call {
    ($name:ident => $c:ident as $upper:literal, $lower:literal; ($($arg:ident: $kind:ident),* $(,)?)) => {
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name($($arg: call_type!($kind),)* ierror: *mut Fint) {
            // SAFETY: Fortran passes every scalar by reference (outputs
            // writable, `ierror` null or writable); buffers and arrays are
            // forwarded.
            unsafe {
                $(#[allow(unused_mut)] let mut $arg = call_hold!($kind, $arg);)*
                let code = ffi::$c($(call_c!($kind, $arg)),*);
                $(call_store!($kind, $arg, code);)*
                $crate::fortran::handles::set_ierror(ierror, code);
            }
        }

        export_symbols!($name ($($arg: call_type!($kind),)* ierror: *mut Fint)
            as $upper, $lower, stringify!($c));
    };
}

/// A Fortran output argument and the C value the call writes.
pub(crate) struct Out<T> {
    fortran: *mut Fint,
    pub(crate) c: T,
}

impl<T> Out<T> {
    pub(crate) fn new(fortran: *mut Fint, c: T) -> Self {
        Out { fortran, c }
    }
}

impl Out<ffi::MPI_Status> {
    /// The C status pointer: `MPI_STATUS_IGNORE` for Fortran's.
    pub(crate) fn status_target(&mut self) -> *mut ffi::MPI_Status {
        if is_status_ignore(self.fortran) {
            // SAFETY: reading an immutable extern constant of mpi-sys.
            unsafe { ffi::RSMPI_STATUS_IGNORE }
        } else {
            &mut self.c
        }
    }

    /// # Safety
    /// The Fortran status is `MPI_STATUS_IGNORE` or writable.
    pub(crate) unsafe fn store_status(&self) {
        // SAFETY: per the contract.
        unsafe { store_status(&self.c, self.fortran) };
    }
}

impl Out<ffi::MPI_Request> {
    /// # Safety
    /// The Fortran request is writable.
    pub(crate) unsafe fn store_request(&self, code: c_int) {
        if code == ffi::MPI_SUCCESS as c_int {
            // SAFETY: per the contract.
            unsafe { *self.fortran = request_c2f(self.c) };
        }
    }
}

impl Out<ffi::MPI_Win> {
    /// # Safety
    /// The Fortran window is writable.
    pub(crate) unsafe fn store_win(&self, code: c_int) {
        if code == ffi::MPI_SUCCESS as c_int {
            // SAFETY: per the contract; c2f only looks the handle up.
            unsafe { *self.fortran = ffi::PMPI_Win_c2f(self.c) };
        }
    }
}
