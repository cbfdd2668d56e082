//! The collectives from Fortran, blocking and nonblocking: every argument
//! converted by its kind, then the C function; a nonblocking call hands its
//! request back as its Fortran index. (Those with datatype arrays, and
//! `MPI_Reduce_local` and the pack calls, are in `staged.rs`.)

use std::ffi::{c_int, c_void};

use mpi_sys as ffi;

use super::handles::{comm, request_c2f, set_ierror, Fint};

/// The Fortran type of an argument of a kind: `buffer` (an address),
/// `int` (a count or root), `ints` (a count or displacement array, the same
/// as C's `int` array), `datatype` and `op` (handles).
macro_rules! fortran_type {
    (buffer) => { *mut c_void };
    (int) => { *const Fint };
    (ints) => { *const Fint };
    (datatype) => { *const Fint };
    (op) => { *const Fint };
}

/// The C value of a Fortran argument of a kind (see `fortran_type!`).
macro_rules! to_c {
    (buffer, $arg:ident) => {
        $crate::fortran::handles::buffer($arg)
    };
    (int, $arg:ident) => {
        *$arg
    };
    (ints, $arg:ident) => {
        $arg
    };
    (datatype, $arg:ident) => {
        $crate::fortran::handles::datatype($arg)
    };
    (op, $arg:ident) => {
        $crate::fortran::handles::op($arg)
    };
}

/// Defines and exports (see `fortran_binding!`) the Fortran binding `$name`
/// of the C function `$c`: the arguments listed, then `COMM` and `IERROR`.
/// Given `$iname`, also the nonblocking `$ic`'s, which takes `REQUEST`
/// before `IERROR`.
macro_rules! fortran_collective {
    (
        $name:ident => $c:ident as $upper:literal, $lower:literal;
        $iname:ident => $ic:ident as $iupper:literal, $ilower:literal;
        ($($arg:ident: $kind:ident),* $(,)?)
    ) => {
        fortran_collective! {
            $name => $c as $upper, $lower;
            ($($arg: $kind),*)
        }

        fortran_collective! {
            nonblocking $iname => $ic as $iupper, $ilower;
            ($($arg: $kind),*)
        }
    };
    (
        nonblocking $iname:ident => $ic:ident as $iupper:literal, $ilower:literal;
        ($($arg:ident: $kind:ident),* $(,)?)
    ) => {
        #[allow(clippy::too_many_arguments)]
        unsafe fn $iname(
            $($arg: fortran_type!($kind),)*
            communicator: *const Fint,
            request: *mut Fint,
            ierror: *mut Fint,
        ) {
            // SAFETY: Fortran passes every scalar by reference (`request`
            // writable, `ierror` null or writable); buffers and arrays are
            // forwarded.
            unsafe {
                let mut c_request = ffi::RSMPI_REQUEST_NULL;
                let code = ffi::$ic($(to_c!($kind, $arg),)* comm(communicator), &mut c_request);
                finish(code, c_request, request, ierror);
            }
        }

        export_symbols!($iname (
            $($arg: fortran_type!($kind),)*
            communicator: *const Fint,
            request: *mut Fint,
            ierror: *mut Fint,
        ) as $iupper, $ilower, stringify!($ic));
    };
    (
        $name:ident => $c:ident as $upper:literal, $lower:literal;
        ($($arg:ident: $kind:ident),* $(,)?)
    ) => {
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            $($arg: fortran_type!($kind),)*
            communicator: *const Fint,
            ierror: *mut Fint,
        ) {
            // SAFETY: Fortran passes every scalar by reference (`ierror` null
            // or writable); buffers and arrays are forwarded.
            unsafe {
                let code = ffi::$c($(to_c!($kind, $arg),)* comm(communicator));
                set_ierror(ierror, code);
            }
        }

        export_symbols!($name (
            $($arg: fortran_type!($kind),)*
            communicator: *const Fint,
            ierror: *mut Fint,
        ) as $upper, $lower, stringify!($c));
    };
}

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

fortran_collective! {
    allreduce => MPI_Allreduce as "MPI_ALLREDUCE", "mpi_allreduce";
    iallreduce => MPI_Iallreduce as "MPI_IALLREDUCE", "mpi_iallreduce";
    (sendbuf: buffer, recvbuf: buffer, count: int, dtype: datatype, reduce_op: op)
}

fortran_collective! {
    reduce => MPI_Reduce as "MPI_REDUCE", "mpi_reduce";
    ireduce => MPI_Ireduce as "MPI_IREDUCE", "mpi_ireduce";
    (sendbuf: buffer, recvbuf: buffer, count: int, dtype: datatype, reduce_op: op, root: int)
}

fortran_collective! {
    bcast => MPI_Bcast as "MPI_BCAST", "mpi_bcast";
    ibcast => MPI_Ibcast as "MPI_IBCAST", "mpi_ibcast";
    (buf: buffer, count: int, dtype: datatype, root: int)
}

fortran_collective! {
    allgather => MPI_Allgather as "MPI_ALLGATHER", "mpi_allgather";
    iallgather => MPI_Iallgather as "MPI_IALLGATHER", "mpi_iallgather";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype,
    )
}

fortran_collective! {
    reduce_scatter_block => MPI_Reduce_scatter_block
        as "MPI_REDUCE_SCATTER_BLOCK", "mpi_reduce_scatter_block";
    ireduce_scatter_block => MPI_Ireduce_scatter_block
        as "MPI_IREDUCE_SCATTER_BLOCK", "mpi_ireduce_scatter_block";
    (sendbuf: buffer, recvbuf: buffer, recvcount: int, dtype: datatype, reduce_op: op)
}

fortran_collective! {
    reduce_scatter => MPI_Reduce_scatter as "MPI_REDUCE_SCATTER", "mpi_reduce_scatter";
    (sendbuf: buffer, recvbuf: buffer, recvcounts: ints, dtype: datatype, reduce_op: op)
}

fortran_collective! {
    alltoall => MPI_Alltoall as "MPI_ALLTOALL", "mpi_alltoall";
    ialltoall => MPI_Ialltoall as "MPI_IALLTOALL", "mpi_ialltoall";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype,
    )
}

fortran_collective! {
    gather => MPI_Gather as "MPI_GATHER", "mpi_gather";
    igather => MPI_Igather as "MPI_IGATHER", "mpi_igather";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype, root: int,
    )
}

fortran_collective! {
    scatter => MPI_Scatter as "MPI_SCATTER", "mpi_scatter";
    iscatter => MPI_Iscatter as "MPI_ISCATTER", "mpi_iscatter";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype, root: int,
    )
}

fortran_collective! {
    barrier => MPI_Barrier as "MPI_BARRIER", "mpi_barrier";
    ()
}

fortran_collective! {
    allgatherv => MPI_Allgatherv as "MPI_ALLGATHERV", "mpi_allgatherv";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, displs: ints, recvtype: datatype,
    )
}

fortran_collective! {
    alltoallv => MPI_Alltoallv as "MPI_ALLTOALLV", "mpi_alltoallv";
    (
        sendbuf: buffer, sendcounts: ints, sdispls: ints, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, rdispls: ints, recvtype: datatype,
    )
}

fortran_collective! {
    gatherv => MPI_Gatherv as "MPI_GATHERV", "mpi_gatherv";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, displs: ints, recvtype: datatype, root: int,
    )
}

fortran_collective! {
    scatterv => MPI_Scatterv as "MPI_SCATTERV", "mpi_scatterv";
    (
        sendbuf: buffer, sendcounts: ints, displs: ints, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype, root: int,
    )
}

fortran_collective! {
    scan => MPI_Scan as "MPI_SCAN", "mpi_scan";
    iscan => MPI_Iscan as "MPI_ISCAN", "mpi_iscan";
    (sendbuf: buffer, recvbuf: buffer, count: int, dtype: datatype, reduce_op: op)
}

fortran_collective! {
    exscan => MPI_Exscan as "MPI_EXSCAN", "mpi_exscan";
    iexscan => MPI_Iexscan as "MPI_IEXSCAN", "mpi_iexscan";
    (sendbuf: buffer, recvbuf: buffer, count: int, dtype: datatype, reduce_op: op)
}

fortran_collective! {
    nonblocking ireduce_scatter => MPI_Ireduce_scatter
        as "MPI_IREDUCE_SCATTER", "mpi_ireduce_scatter";
    (sendbuf: buffer, recvbuf: buffer, recvcounts: ints, dtype: datatype, reduce_op: op)
}

fortran_collective! {
    nonblocking iallgatherv => MPI_Iallgatherv as "MPI_IALLGATHERV", "mpi_iallgatherv";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, displs: ints, recvtype: datatype,
    )
}

fortran_collective! {
    nonblocking ialltoallv => MPI_Ialltoallv as "MPI_IALLTOALLV", "mpi_ialltoallv";
    (
        sendbuf: buffer, sendcounts: ints, sdispls: ints, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, rdispls: ints, recvtype: datatype,
    )
}

fortran_collective! {
    nonblocking igatherv => MPI_Igatherv as "MPI_IGATHERV", "mpi_igatherv";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, displs: ints, recvtype: datatype, root: int,
    )
}

fortran_collective! {
    nonblocking iscatterv => MPI_Iscatterv as "MPI_ISCATTERV", "mpi_iscatterv";
    (
        sendbuf: buffer, sendcounts: ints, displs: ints, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype, root: int,
    )
}

fortran_collective! {
    nonblocking ibarrier => MPI_Ibarrier as "MPI_IBARRIER", "mpi_ibarrier";
    ()
}

fortran_collective! {
    neighbor_allgather => MPI_Neighbor_allgather
        as "MPI_NEIGHBOR_ALLGATHER", "mpi_neighbor_allgather";
    ineighbor_allgather => MPI_Ineighbor_allgather
        as "MPI_INEIGHBOR_ALLGATHER", "mpi_ineighbor_allgather";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype,
    )
}

fortran_collective! {
    neighbor_allgatherv => MPI_Neighbor_allgatherv
        as "MPI_NEIGHBOR_ALLGATHERV", "mpi_neighbor_allgatherv";
    ineighbor_allgatherv => MPI_Ineighbor_allgatherv
        as "MPI_INEIGHBOR_ALLGATHERV", "mpi_ineighbor_allgatherv";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, displs: ints, recvtype: datatype,
    )
}

fortran_collective! {
    neighbor_alltoall => MPI_Neighbor_alltoall
        as "MPI_NEIGHBOR_ALLTOALL", "mpi_neighbor_alltoall";
    ineighbor_alltoall => MPI_Ineighbor_alltoall
        as "MPI_INEIGHBOR_ALLTOALL", "mpi_ineighbor_alltoall";
    (
        sendbuf: buffer, sendcount: int, sendtype: datatype,
        recvbuf: buffer, recvcount: int, recvtype: datatype,
    )
}

fortran_collective! {
    neighbor_alltoallv => MPI_Neighbor_alltoallv
        as "MPI_NEIGHBOR_ALLTOALLV", "mpi_neighbor_alltoallv";
    ineighbor_alltoallv => MPI_Ineighbor_alltoallv
        as "MPI_INEIGHBOR_ALLTOALLV", "mpi_ineighbor_alltoallv";
    (
        sendbuf: buffer, sendcounts: ints, sdispls: ints, sendtype: datatype,
        recvbuf: buffer, recvcounts: ints, rdispls: ints, recvtype: datatype,
    )
}
