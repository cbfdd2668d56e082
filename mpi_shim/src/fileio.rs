//! MPI-IO data access: every `MPI_File_read*`, `MPI_File_write*`,
//! `MPI_File_iread*` and `MPI_File_iwrite*` call (explicit offsets,
//! individual and shared file pointers, collective, split collective, and
//! the MPI-4 `_c` forms of those with a count). A device buffer is refused
//! with `MPI_ERR_BUFFER` through the file's error handler (`refusal.rs`;
//! a request form leaves `MPI_REQUEST_NULL`); host buffers go to `PMPI_`
//! unchanged. A split collective's `_end` call has no count: its buffer is
//! checked as one element.

use crate::refusal::refused;
use mpi_sys::{MPI_Count, MPI_Datatype, MPI_File, MPI_Offset, MPI_Request, MPI_Status};
use std::ffi::{c_int, c_void};

/// `code`, raised on `fh`.
fn on_file(fh: MPI_File, code: u32) -> c_int {
    let code = code as c_int;
    // SAFETY: MPI validates the handle.
    unsafe { mpi_sys::PMPI_File_call_errhandler(fh, code) };
    code
}

/// The last argument of a data access call, as a refusal leaves it.
trait Tail {
    /// # Safety
    /// `self` is null or the program's writable argument.
    unsafe fn refused(self);
}

impl Tail for *mut MPI_Request {
    unsafe fn refused(self) {
        if !self.is_null() {
            // SAFETY: per the contract.
            unsafe { *self = mpi_sys::RSMPI_REQUEST_NULL };
        }
    }
}

impl Tail for *mut MPI_Status {
    unsafe fn refused(self) {}
}

/// Exports a data access call `(fh, [offset,] buf, count, datatype[, tail])`
/// and its large-count form.
macro_rules! access {
    ($name:ident => $pmpi:ident, $cname:ident; ($($off:ident)?) $buf:ty $(, $tail:ident: $tt:ty)?) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fh: MPI_File,
            $($off: MPI_Offset,)?
            buf: $buf,
            count: c_int,
            datatype: MPI_Datatype,
            $($tail: $tt)?
        ) -> c_int {
            if refused(stringify!($name), &[(buf as *const c_void, count.into())]) {
                // SAFETY: the program's argument.
                $(unsafe { Tail::refused($tail) };)?
                return on_file(fh, mpi_sys::MPI_ERR_BUFFER);
            }
            // SAFETY: forwarded unchanged.
            unsafe { mpi_sys::$pmpi(fh, $($off,)? buf, count, datatype, $($tail)?) }
        }

        #[doc = concat!("# Safety\nAs `", stringify!($cname), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $cname(
            fh: MPI_File,
            $($off: MPI_Offset,)?
            buf: $buf,
            count: MPI_Count,
            datatype: MPI_Datatype,
            $($tail: $tt)?
        ) -> c_int {
            let Ok(count) = c_int::try_from(count) else {
                tracing::warn!(target: "gpucoll_mpi::large_count", "a count does not fit a C int");
                // SAFETY: the program's argument.
                $(unsafe { Tail::refused($tail) };)?
                return on_file(fh, mpi_sys::MPI_ERR_COUNT);
            };
            // SAFETY: the program's arguments, the count narrowed losslessly.
            unsafe { $name(fh, $($off,)? buf, count, datatype, $($tail)?) }
        }
    };
}

type Rd = *mut c_void;
type Wr = *const c_void;
type St = *mut MPI_Status;
type Rq = *mut MPI_Request;

access!(MPI_File_read_at => PMPI_File_read_at, MPI_File_read_at_c; (offset) Rd, status: St);
access!(MPI_File_read_at_all => PMPI_File_read_at_all, MPI_File_read_at_all_c; (offset) Rd, status: St);
access!(MPI_File_write_at => PMPI_File_write_at, MPI_File_write_at_c; (offset) Wr, status: St);
access!(MPI_File_write_at_all => PMPI_File_write_at_all, MPI_File_write_at_all_c; (offset) Wr, status: St);
access!(MPI_File_iread_at => PMPI_File_iread_at, MPI_File_iread_at_c; (offset) Rd, request: Rq);
access!(MPI_File_iread_at_all => PMPI_File_iread_at_all, MPI_File_iread_at_all_c; (offset) Rd, request: Rq);
access!(MPI_File_iwrite_at => PMPI_File_iwrite_at, MPI_File_iwrite_at_c; (offset) Wr, request: Rq);
access!(MPI_File_iwrite_at_all => PMPI_File_iwrite_at_all, MPI_File_iwrite_at_all_c; (offset) Wr, request: Rq);
access!(MPI_File_read => PMPI_File_read, MPI_File_read_c; () Rd, status: St);
access!(MPI_File_read_all => PMPI_File_read_all, MPI_File_read_all_c; () Rd, status: St);
access!(MPI_File_write => PMPI_File_write, MPI_File_write_c; () Wr, status: St);
access!(MPI_File_write_all => PMPI_File_write_all, MPI_File_write_all_c; () Wr, status: St);
access!(MPI_File_iread => PMPI_File_iread, MPI_File_iread_c; () Rd, request: Rq);
access!(MPI_File_iread_all => PMPI_File_iread_all, MPI_File_iread_all_c; () Rd, request: Rq);
access!(MPI_File_iwrite => PMPI_File_iwrite, MPI_File_iwrite_c; () Wr, request: Rq);
access!(MPI_File_iwrite_all => PMPI_File_iwrite_all, MPI_File_iwrite_all_c; () Wr, request: Rq);
access!(MPI_File_read_shared => PMPI_File_read_shared, MPI_File_read_shared_c; () Rd, status: St);
access!(MPI_File_write_shared => PMPI_File_write_shared, MPI_File_write_shared_c; () Wr, status: St);
access!(MPI_File_iread_shared => PMPI_File_iread_shared, MPI_File_iread_shared_c; () Rd, request: Rq);
access!(MPI_File_iwrite_shared => PMPI_File_iwrite_shared, MPI_File_iwrite_shared_c; () Wr, request: Rq);
access!(MPI_File_read_ordered => PMPI_File_read_ordered, MPI_File_read_ordered_c; () Rd, status: St);
access!(MPI_File_write_ordered => PMPI_File_write_ordered, MPI_File_write_ordered_c; () Wr, status: St);
access!(MPI_File_read_at_all_begin => PMPI_File_read_at_all_begin, MPI_File_read_at_all_begin_c; (offset) Rd);
access!(MPI_File_write_at_all_begin => PMPI_File_write_at_all_begin, MPI_File_write_at_all_begin_c; (offset) Wr);
access!(MPI_File_read_all_begin => PMPI_File_read_all_begin, MPI_File_read_all_begin_c; () Rd);
access!(MPI_File_write_all_begin => PMPI_File_write_all_begin, MPI_File_write_all_begin_c; () Wr);
access!(MPI_File_read_ordered_begin => PMPI_File_read_ordered_begin, MPI_File_read_ordered_begin_c; () Rd);
access!(MPI_File_write_ordered_begin => PMPI_File_write_ordered_begin, MPI_File_write_ordered_begin_c; () Wr);

/// Exports the `_end` call of a split collective: `(fh, buf, status)`.
macro_rules! split_end {
    ($name:ident => $pmpi:ident, $buf:ty) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(fh: MPI_File, buf: $buf, status: St) -> c_int {
            if refused(stringify!($name), &[(buf as *const c_void, 1)]) {
                return on_file(fh, mpi_sys::MPI_ERR_BUFFER);
            }
            // SAFETY: forwarded unchanged.
            unsafe { mpi_sys::$pmpi(fh, buf, status) }
        }
    };
}

split_end!(MPI_File_read_at_all_end => PMPI_File_read_at_all_end, Rd);
split_end!(MPI_File_write_at_all_end => PMPI_File_write_at_all_end, Wr);
split_end!(MPI_File_read_all_end => PMPI_File_read_all_end, Rd);
split_end!(MPI_File_write_all_end => PMPI_File_write_all_end, Wr);
split_end!(MPI_File_read_ordered_end => PMPI_File_read_ordered_end, Rd);
split_end!(MPI_File_write_ordered_end => PMPI_File_write_ordered_end, Wr);
