//! The nonblocking collectives from Fortran: as the blocking ones, plus the request
//! handed back as its Fortran index.

use std::ffi::{c_int, c_void};

use mpi_sys as ffi;

use super::handles::{buffer, comm, datatype, op, request_c2f, set_ierror, Fint};

/// Stores the new request (on success) and the return code.
///
/// # Safety
/// `request` points to a writable `INTEGER`; `ierror` is null or one.
unsafe fn finish(code: c_int, c_request: ffi::MPI_Request, request: *mut Fint, ierror: *mut Fint) {
    // SAFETY: per the function's contract.
    unsafe {
        if code == ffi::MPI_SUCCESS as c_int {
            *request = request_c2f(c_request);
        }
        set_ierror(ierror, code);
    }
}

fortran_binding! {
    /// `MPI_IALLREDUCE(SENDBUF, RECVBUF, COUNT, DATATYPE, OP, COMM, REQUEST, IERROR)`.
    fn iallreduce(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IALLREDUCE", "mpi_iallreduce", "MPI_Iallreduce" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Iallreduce(
                buffer(sendbuf),
                buffer(recvbuf),
                *count,
                datatype(dtype),
                op(reduce_op),
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_IREDUCE(SENDBUF, RECVBUF, COUNT, DATATYPE, OP, ROOT, COMM, REQUEST, IERROR)`.
    fn ireduce(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IREDUCE", "mpi_ireduce", "MPI_Ireduce" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Ireduce(
                buffer(sendbuf),
                buffer(recvbuf),
                *count,
                datatype(dtype),
                op(reduce_op),
                *root,
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_IBCAST(BUFFER, COUNT, DATATYPE, ROOT, COMM, REQUEST, IERROR)`.
    fn ibcast(
        buf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IBCAST", "mpi_ibcast", "MPI_Ibcast" {
        // SAFETY: Fortran passes every scalar by reference; the buffer is forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Ibcast(
                buffer(buf),
                *count,
                datatype(dtype),
                *root,
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_IALLGATHER(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, COMM,
    /// REQUEST, IERROR)`.
    fn iallgather(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IALLGATHER", "mpi_iallgather", "MPI_Iallgather" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Iallgather(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_IREDUCE_SCATTER_BLOCK(SENDBUF, RECVBUF, RECVCOUNT, DATATYPE, OP, COMM, REQUEST,
    /// IERROR)`.
    fn ireduce_scatter_block(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IREDUCE_SCATTER_BLOCK", "mpi_ireduce_scatter_block", "MPI_Ireduce_scatter_block" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Ireduce_scatter_block(
                buffer(sendbuf),
                buffer(recvbuf),
                *recvcount,
                datatype(dtype),
                op(reduce_op),
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_IALLTOALL(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, COMM,
    /// REQUEST, IERROR)`.
    fn ialltoall(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IALLTOALL", "mpi_ialltoall", "MPI_Ialltoall" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Ialltoall(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_IGATHER(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, ROOT, COMM,
    /// REQUEST, IERROR)`.
    fn igather(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IGATHER", "mpi_igather", "MPI_Igather" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Igather(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                *root,
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_ISCATTER(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, ROOT, COMM,
    /// REQUEST, IERROR)`.
    fn iscatter(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_ISCATTER", "mpi_iscatter", "MPI_Iscatter" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Iscatter(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                *root,
                comm(communicator),
                &mut c_request,
            );
            finish(code, c_request, request, ierror);
        }
    }
}
