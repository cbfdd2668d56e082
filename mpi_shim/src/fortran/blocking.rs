//! The blocking collectives from Fortran.

use std::ffi::c_void;

use mpi_sys as ffi;

use super::handles::{buffer, comm, datatype, op, set_ierror, Fint};

fortran_binding! {
    /// `MPI_ALLREDUCE(SENDBUF, RECVBUF, COUNT, DATATYPE, OP, COMM, IERROR)`.
    fn allreduce(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_ALLREDUCE", "mpi_allreduce", "MPI_Allreduce" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Allreduce(
                buffer(sendbuf),
                buffer(recvbuf),
                *count,
                datatype(dtype),
                op(reduce_op),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_REDUCE(SENDBUF, RECVBUF, COUNT, DATATYPE, OP, ROOT, COMM, IERROR)`.
    fn reduce(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_REDUCE", "mpi_reduce", "MPI_Reduce" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Reduce(
                buffer(sendbuf),
                buffer(recvbuf),
                *count,
                datatype(dtype),
                op(reduce_op),
                *root,
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_BCAST(BUFFER, COUNT, DATATYPE, ROOT, COMM, IERROR)`.
    fn bcast(
        buf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_BCAST", "mpi_bcast", "MPI_Bcast" {
        // SAFETY: Fortran passes every scalar by reference; the buffer is forwarded.
        unsafe {
            let code = ffi::MPI_Bcast(
                buffer(buf),
                *count,
                datatype(dtype),
                *root,
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_ALLGATHER(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, COMM,
    /// IERROR)`.
    fn allgather(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_ALLGATHER", "mpi_allgather", "MPI_Allgather" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Allgather(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_REDUCE_SCATTER_BLOCK(SENDBUF, RECVBUF, RECVCOUNT, DATATYPE, OP, COMM, IERROR)`.
    fn reduce_scatter_block(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_REDUCE_SCATTER_BLOCK", "mpi_reduce_scatter_block", "MPI_Reduce_scatter_block" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Reduce_scatter_block(
                buffer(sendbuf),
                buffer(recvbuf),
                *recvcount,
                datatype(dtype),
                op(reduce_op),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_REDUCE_SCATTER(SENDBUF, RECVBUF, RECVCOUNTS, DATATYPE, OP, COMM, IERROR)`:
    /// the count array is an `INTEGER` array, the same as C's `int` array.
    fn reduce_scatter(
        sendbuf: *mut c_void,
        recvbuf: *mut c_void,
        recvcounts: *const Fint,
        dtype: *const Fint,
        reduce_op: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_REDUCE_SCATTER", "mpi_reduce_scatter", "MPI_Reduce_scatter" {
        // SAFETY: Fortran passes every scalar by reference; buffers and arrays are
        // forwarded.
        unsafe {
            let code = ffi::MPI_Reduce_scatter(
                buffer(sendbuf),
                buffer(recvbuf),
                recvcounts,
                datatype(dtype),
                op(reduce_op),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_ALLTOALL(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, COMM,
    /// IERROR)`.
    fn alltoall(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_ALLTOALL", "mpi_alltoall", "MPI_Alltoall" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Alltoall(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_GATHER(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, ROOT, COMM,
    /// IERROR)`.
    fn gather(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_GATHER", "mpi_gather", "MPI_Gather" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Gather(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                *root,
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_SCATTER(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE, ROOT, COMM,
    /// IERROR)`.
    fn scatter(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_SCATTER", "mpi_scatter", "MPI_Scatter" {
        // SAFETY: Fortran passes every scalar by reference; the buffers are forwarded.
        unsafe {
            let code = ffi::MPI_Scatter(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                *root,
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_BARRIER(COMM, IERROR)`.
    fn barrier(communicator: *const Fint, ierror: *mut Fint)
        as "MPI_BARRIER", "mpi_barrier", "MPI_Barrier"
    {
        // SAFETY: Fortran passes the handle by reference.
        unsafe {
            let code = ffi::MPI_Barrier(comm(communicator));
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_ALLGATHERV(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNTS, DISPLS, RECVTYPE,
    /// COMM, IERROR)`.
    fn allgatherv(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcounts: *const Fint,
        displs: *const Fint,
        recvtype: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_ALLGATHERV", "mpi_allgatherv", "MPI_Allgatherv" {
        // SAFETY: Fortran passes every scalar by reference; buffers and arrays are
        // forwarded.
        unsafe {
            let code = ffi::MPI_Allgatherv(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                recvcounts,
                displs,
                datatype(recvtype),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_ALLTOALLV(SENDBUF, SENDCOUNTS, SDISPLS, SENDTYPE, RECVBUF, RECVCOUNTS, RDISPLS,
    /// RECVTYPE, COMM, IERROR)`.
    fn alltoallv(
        sendbuf: *mut c_void,
        sendcounts: *const Fint,
        sdispls: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcounts: *const Fint,
        rdispls: *const Fint,
        recvtype: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_ALLTOALLV", "mpi_alltoallv", "MPI_Alltoallv" {
        // SAFETY: Fortran passes every scalar by reference; buffers and arrays are
        // forwarded.
        unsafe {
            let code = ffi::MPI_Alltoallv(
                buffer(sendbuf),
                sendcounts,
                sdispls,
                datatype(sendtype),
                buffer(recvbuf),
                recvcounts,
                rdispls,
                datatype(recvtype),
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_GATHERV(SENDBUF, SENDCOUNT, SENDTYPE, RECVBUF, RECVCOUNTS, DISPLS, RECVTYPE,
    /// ROOT, COMM, IERROR)`.
    fn gatherv(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcounts: *const Fint,
        displs: *const Fint,
        recvtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_GATHERV", "mpi_gatherv", "MPI_Gatherv" {
        // SAFETY: Fortran passes every scalar by reference; buffers and arrays are
        // forwarded.
        unsafe {
            let code = ffi::MPI_Gatherv(
                buffer(sendbuf),
                *sendcount,
                datatype(sendtype),
                buffer(recvbuf),
                recvcounts,
                displs,
                datatype(recvtype),
                *root,
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_SCATTERV(SENDBUF, SENDCOUNTS, DISPLS, SENDTYPE, RECVBUF, RECVCOUNT, RECVTYPE,
    /// ROOT, COMM, IERROR)`.
    fn scatterv(
        sendbuf: *mut c_void,
        sendcounts: *const Fint,
        displs: *const Fint,
        sendtype: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        root: *const Fint,
        communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_SCATTERV", "mpi_scatterv", "MPI_Scatterv" {
        // SAFETY: Fortran passes every scalar by reference; buffers and arrays are
        // forwarded.
        unsafe {
            let code = ffi::MPI_Scatterv(
                buffer(sendbuf),
                sendcounts,
                displs,
                datatype(sendtype),
                buffer(recvbuf),
                *recvcount,
                datatype(recvtype),
                *root,
                comm(communicator),
            );
            set_ierror(ierror, code);
        }
    }
}
