//! The thin layer over `mpi-sys`: return codes become [`Error::Mpi`], and the
//! `RSMPI_*` link-time constants become plain functions. Every function
//! called is a `PMPI_` entry point (see the re-export at the end).
//!
//! Nothing here knows about communicators' lifetimes; the safe wrappers in
//! the parent module do.

use crate::error::{Error, Result};
use mpi_sys as sys;
use std::os::raw::{c_char, c_int};

/// The handle types, re-exported for the wrappers.
pub(crate) use sys::{MPI_Comm, MPI_Datatype, MPI_Message, MPI_Op, MPI_Request, MPI_Status};

/// `MPI_SUCCESS` (0 in every implementation).
const SUCCESS: c_int = sys::MPI_SUCCESS as c_int;

/// The text MPI gives for an error code.
pub(crate) fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; sys::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING chars as the standard requires;
    // MPI_Error_string may be called at any time.
    let rc = unsafe { sys::PMPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != SUCCESS {
        return format!("unknown MPI error {code}");
    }
    let len = (len.max(0) as usize).min(buf.len());
    let bytes: Vec<u8> = buf[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).trim_end().to_string()
}

/// Turn an MPI return code into a `Result`.
#[inline]
pub(crate) fn check(call: &'static str, code: c_int) -> Result<()> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(Error::Mpi {
            call,
            code,
            message: error_string(code),
        })
    }
}

/// `MPI_COMM_WORLD`.
pub(crate) fn comm_world() -> MPI_Comm {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_COMM_WORLD }
}

/// `MPI_COMM_NULL`.
pub(crate) fn comm_null() -> MPI_Comm {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_COMM_NULL }
}

/// `MPI_UNDEFINED`.
pub(crate) fn undefined() -> c_int {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_UNDEFINED }
}

/// `MPI_COMM_TYPE_SHARED`.
pub(crate) fn comm_type_shared() -> c_int {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_COMM_TYPE_SHARED }
}

/// `MPI_INFO_NULL`.
pub(crate) fn info_null() -> sys::MPI_Info {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_INFO_NULL }
}

/// `MPI_ERRORS_RETURN`.
pub(crate) fn errors_return() -> sys::MPI_Errhandler {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_ERRORS_RETURN }
}

/// `MPI_REQUEST_NULL`.
pub(crate) fn request_null() -> MPI_Request {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_REQUEST_NULL }
}

/// `MPI_STATUS_IGNORE`.
pub(crate) fn status_ignore() -> *mut MPI_Status {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_STATUS_IGNORE }
}

/// `MPI_ANY_SOURCE`.
pub(crate) fn any_source() -> c_int {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_ANY_SOURCE }
}

/// `MPI_ANY_TAG`.
pub(crate) fn any_tag() -> c_int {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_ANY_TAG }
}

/// `MPI_MESSAGE_NULL`.
pub(crate) fn message_null() -> MPI_Message {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_MESSAGE_NULL }
}

/// The `MPI_TAG_UB` attribute key.
pub(crate) fn tag_ub_keyval() -> c_int {
    sys::MPI_TAG_UB as c_int
}

/// The byte type used for every untyped transfer (`MPI_UINT8_T`).
pub(crate) fn byte_type() -> MPI_Datatype {
    // SAFETY: a link-time constant initialized by the rsmpi C shim.
    unsafe { sys::RSMPI_UINT8_T }
}

macro_rules! consts {
    ($($fn:ident => $name:ident : $ty:ty),* $(,)?) => {$(
        pub(crate) fn $fn() -> $ty {
            // SAFETY: a link-time constant initialized by the rsmpi C shim.
            unsafe { sys::$name }
        }
    )*};
}

consts! {
    dt_i8 => RSMPI_INT8_T: MPI_Datatype,
    dt_u8 => RSMPI_UINT8_T: MPI_Datatype,
    dt_u16 => RSMPI_UINT16_T: MPI_Datatype,
    dt_i32 => RSMPI_INT32_T: MPI_Datatype,
    dt_u32 => RSMPI_UINT32_T: MPI_Datatype,
    dt_i64 => RSMPI_INT64_T: MPI_Datatype,
    dt_u64 => RSMPI_UINT64_T: MPI_Datatype,
    dt_f32 => RSMPI_FLOAT: MPI_Datatype,
    dt_f64 => RSMPI_DOUBLE: MPI_Datatype,
    op_sum => RSMPI_SUM: MPI_Op,
    op_prod => RSMPI_PROD: MPI_Op,
    op_min => RSMPI_MIN: MPI_Op,
    op_max => RSMPI_MAX: MPI_Op,
    op_band => RSMPI_BAND: MPI_Op,
    op_bor => RSMPI_BOR: MPI_Op,
    op_bxor => RSMPI_BXOR: MPI_Op,
    op_land => RSMPI_LAND: MPI_Op,
    op_lor => RSMPI_LOR: MPI_Op,
    op_lxor => RSMPI_LXOR: MPI_Op,
    thread_single => RSMPI_THREAD_SINGLE: c_int,
    thread_funneled => RSMPI_THREAD_FUNNELED: c_int,
    thread_serialized => RSMPI_THREAD_SERIALIZED: c_int,
    thread_multiple => RSMPI_THREAD_MULTIPLE: c_int,
}

/// A zeroed status for calls that fill one in.
pub(crate) fn empty_status() -> MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// Re-export of the raw functions the wrappers call (one place to audit).
///
/// Only the `PMPI_` profiling entry points: a library preloaded to intercept
/// `MPI_*` (the gpucoll MPI shim, a tracer) must never see gpucoll's own
/// bootstrap, NET proxy or reference traffic, or it would call back into
/// itself. `tests/mpi_collectives.rs` (`pmpi::*`) preloads a library whose
/// `MPI_*` of these names abort, to keep it that way.
pub(crate) use sys::{
    PMPI_Allgather, PMPI_Allreduce, PMPI_Alltoall, PMPI_Barrier, PMPI_Bcast, PMPI_Cancel,
    PMPI_Comm_dup, PMPI_Comm_free, PMPI_Comm_get_attr, PMPI_Comm_rank, PMPI_Comm_set_errhandler,
    PMPI_Comm_size, PMPI_Comm_split, PMPI_Comm_split_type, PMPI_Comm_test_inter, PMPI_Exscan,
    PMPI_Finalize, PMPI_Finalized, PMPI_Gather, PMPI_Get_count, PMPI_Get_library_version,
    PMPI_Get_processor_name, PMPI_Get_version, PMPI_Iallgather, PMPI_Iallreduce, PMPI_Improbe,
    PMPI_Init_thread, PMPI_Initialized, PMPI_Irecv, PMPI_Isend, PMPI_Mrecv, PMPI_Op_create,
    PMPI_Query_thread, PMPI_Recv, PMPI_Reduce, PMPI_Reduce_scatter_block, PMPI_Request_free,
    PMPI_Scan, PMPI_Scatter, PMPI_Send, PMPI_Sendrecv, PMPI_Test, PMPI_Type_commit,
    PMPI_Type_contiguous, PMPI_Wtime,
};
