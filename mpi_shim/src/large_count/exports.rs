//! `MPI_Allreduce_c`, `MPI_Iallreduce_c` ... : the exported large-count
//! forms, blocking and nonblocking, each calling the C form of its collective
//! (the shim's own export where it has one) once the counts fit.

use std::ffi::{c_int, c_void};

use mpi_sys as ffi;
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Count, MPI_Datatype, MPI_Op, MPI_Request};

use super::{
    all_counts, allgatherv_args, alltoallv_args, narrow, narrow_local, neighbor_args,
    reduce_scatter_counts, rooted_counts, rooted_v_args,
};

/// Exports the large-count forms of one collective: `$name` (blocking) and
/// `$iname` (nonblocking) take the parameters listed, then `comm` (then
/// `request`). `$convert`, given its arguments and `comm`, narrows what must
/// fit a C `int` (or raises the error) into `$narrowed`; the C forms `$c`
/// and `$ic` then get the arguments `$arg`, then `comm` (then `request`).
macro_rules! large_count {
    (
        $name:ident => $c:ident, $iname:ident => $ic:ident;
        ($($param:ident: $ty:ty),+ $(,)?)
        let $narrowed:pat_param = $convert:ident($($input:expr),+);
        ($($arg:expr),+ $(,)?)
    ) => {
        /// # Safety
        /// As the MPI-4 standard requires of the function's arguments.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($param: $ty,)+ comm: MPI_Comm) -> c_int {
            crate::errors::guarded(stringify!($name), comm, || (), || {
                // SAFETY: the caller's arguments (count arrays with one entry
                // per peer where MPI reads them), forwarded with the counts
                // narrowed losslessly.
                unsafe { $convert($($input,)+ comm).map(|$narrowed| ffi::$c($($arg,)+ comm)) }
                    .unwrap_or_else(|code| code)
            })
        }

        /// # Safety
        /// As the MPI-4 standard requires of the function's arguments.
        #[no_mangle]
        pub unsafe extern "C" fn $iname(
            $($param: $ty,)+
            comm: MPI_Comm,
            request: *mut MPI_Request,
        ) -> c_int {
            let null = || {
                if !request.is_null() {
                    // SAFETY: `request` is writable (MPI's contract).
                    unsafe { *request = ffi::RSMPI_REQUEST_NULL };
                }
            };
            let code = crate::errors::guarded(stringify!($iname), comm, null, || {
                // SAFETY: as for the blocking form; converted count arrays
                // live only for the call, which the module doc of
                // `large_count` allows.
                unsafe {
                    $convert($($input,)+ comm).map(|$narrowed| ffi::$ic($($arg,)+ comm, request))
                }
                .unwrap_or_else(|code| code)
            });
            // A failed start (a count that does not fit included) leaves no
            // request behind.
            if code != 0 {
                null();
            }
            code
        }
    };
}

large_count! {
    MPI_Allreduce_c => MPI_Allreduce, MPI_Iallreduce_c => MPI_Iallreduce;
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype,
        op: MPI_Op,
    )
    let count = narrow(count);
    (sendbuf, recvbuf, count, datatype, op)
}

large_count! {
    MPI_Reduce_c => MPI_Reduce, MPI_Ireduce_c => MPI_Ireduce;
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype,
        op: MPI_Op, root: c_int,
    )
    let count = narrow(count);
    (sendbuf, recvbuf, count, datatype, op, root)
}

large_count! {
    MPI_Bcast_c => MPI_Bcast, MPI_Ibcast_c => MPI_Ibcast;
    (buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int)
    let count = narrow(count);
    (buffer, count, datatype, root)
}

large_count! {
    MPI_Allgather_c => MPI_Allgather, MPI_Iallgather_c => MPI_Iallgather;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype,
    )
    let (sendcount, recvcount) = all_counts(sendbuf, sendcount, recvcount);
    (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype)
}

large_count! {
    MPI_Reduce_scatter_block_c => MPI_Reduce_scatter_block,
    MPI_Ireduce_scatter_block_c => MPI_Ireduce_scatter_block;
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count,
        datatype: MPI_Datatype, op: MPI_Op,
    )
    let recvcount = narrow(recvcount);
    (sendbuf, recvbuf, recvcount, datatype, op)
}

large_count! {
    MPI_Reduce_scatter_c => MPI_Reduce_scatter, MPI_Ireduce_scatter_c => MPI_Ireduce_scatter;
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const MPI_Count,
        datatype: MPI_Datatype, op: MPI_Op,
    )
    let recv = reduce_scatter_counts(recvcounts);
    (sendbuf, recvbuf, recv.counts(), datatype, op)
}

large_count! {
    MPI_Alltoall_c => MPI_Alltoall, MPI_Ialltoall_c => MPI_Ialltoall;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype,
    )
    let (sendcount, recvcount) = all_counts(sendbuf, sendcount, recvcount);
    (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype)
}

large_count! {
    MPI_Gather_c => MPI_Gather, MPI_Igather_c => MPI_Igather;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int,
    )
    let (sendcount, recvcount) = rooted_counts(sendbuf, sendcount, recvcount, root);
    (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root)
}

large_count! {
    MPI_Scatter_c => MPI_Scatter, MPI_Iscatter_c => MPI_Iscatter;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int,
    )
    let (recvcount, sendcount) = rooted_counts(recvbuf, recvcount, sendcount, root);
    (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root)
}

large_count! {
    MPI_Allgatherv_c => MPI_Allgatherv, MPI_Iallgatherv_c => MPI_Iallgatherv;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint,
        recvtype: MPI_Datatype,
    )
    let (sendcount, recv) = allgatherv_args(sendbuf, sendcount, recvcounts, displs);
    (sendbuf, sendcount, sendtype, recvbuf, recv.counts(), recv.displs(), recvtype)
}

large_count! {
    MPI_Alltoallv_c => MPI_Alltoallv, MPI_Ialltoallv_c => MPI_Ialltoallv;
    (
        sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint,
        sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count,
        rdispls: *const MPI_Aint, recvtype: MPI_Datatype,
    )
    let (send, recv) = alltoallv_args(sendbuf, sendcounts, sdispls, recvcounts, rdispls);
    (
        sendbuf, send.counts(), send.displs(), sendtype,
        recvbuf, recv.counts(), recv.displs(), recvtype,
    )
}

large_count! {
    MPI_Gatherv_c => MPI_Gatherv, MPI_Igatherv_c => MPI_Igatherv;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint,
        recvtype: MPI_Datatype, root: c_int,
    )
    let (sendcount, recv) = rooted_v_args(sendbuf, sendcount, recvcounts, displs, root);
    (sendbuf, sendcount, sendtype, recvbuf, recv.counts(), recv.displs(), recvtype, root)
}

large_count! {
    MPI_Scatterv_c => MPI_Scatterv, MPI_Iscatterv_c => MPI_Iscatterv;
    (
        sendbuf: *const c_void, sendcounts: *const MPI_Count, displs: *const MPI_Aint,
        sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count,
        recvtype: MPI_Datatype, root: c_int,
    )
    let (recvcount, send) = rooted_v_args(recvbuf, recvcount, sendcounts, displs, root);
    (sendbuf, send.counts(), send.displs(), sendtype, recvbuf, recvcount, recvtype, root)
}

large_count! {
    MPI_Scan_c => MPI_Scan, MPI_Iscan_c => MPI_Iscan;
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype,
        op: MPI_Op,
    )
    let count = narrow(count);
    (sendbuf, recvbuf, count, datatype, op)
}

large_count! {
    MPI_Exscan_c => MPI_Exscan, MPI_Iexscan_c => MPI_Iexscan;
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype,
        op: MPI_Op,
    )
    let count = narrow(count);
    (sendbuf, recvbuf, count, datatype, op)
}

/// # Safety
/// As the MPI-4 standard requires of the function's arguments.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_local_c(
    inbuf: *const c_void,
    inoutbuf: *mut c_void,
    count: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
) -> c_int {
    // SAFETY: the caller's arguments, the count narrowed losslessly.
    narrow_local(count)
        .map(|count| unsafe { ffi::MPI_Reduce_local(inbuf, inoutbuf, count, datatype, op) })
        .unwrap_or_else(|code| code)
}

large_count! {
    MPI_Alltoallw_c => MPI_Alltoallw, MPI_Ialltoallw_c => MPI_Ialltoallw;
    (
        sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint,
        sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count,
        rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype,
    )
    let (send, recv) = alltoallv_args(sendbuf, sendcounts, sdispls, recvcounts, rdispls);
    (
        sendbuf, send.counts(), send.displs(), sendtypes,
        recvbuf, recv.counts(), recv.displs(), recvtypes,
    )
}

large_count! {
    MPI_Neighbor_allgather_c => MPI_Neighbor_allgather,
    MPI_Ineighbor_allgather_c => MPI_Ineighbor_allgather;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype,
    )
    let (sendcount, recvcount) = all_counts(sendbuf, sendcount, recvcount);
    (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype)
}

large_count! {
    MPI_Neighbor_allgatherv_c => MPI_Neighbor_allgatherv,
    MPI_Ineighbor_allgatherv_c => MPI_Ineighbor_allgatherv;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint,
        recvtype: MPI_Datatype,
    )
    let (sendcount, (_, recv)) = neighbor_allgatherv_args(sendcount, recvcounts, displs);
    (sendbuf, sendcount, sendtype, recvbuf, recv.counts(), recv.displs(), recvtype)
}

/// Neighbor_allgatherv's send count and receive arrays (one entry per source).
///
/// # Safety
/// `recvcounts` and `displs` have one entry per source of `comm`'s topology.
unsafe fn neighbor_allgatherv_args(
    sendcount: MPI_Count,
    recvcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    comm: MPI_Comm,
) -> Result<(std::ffi::c_int, (super::IntArrays, super::IntArrays)), std::ffi::c_int> {
    let sendcount = narrow(sendcount, comm)?;
    // SAFETY: per the contract.
    let arrays =
        unsafe { neighbor_args(std::ptr::null(), std::ptr::null(), recvcounts, displs, comm)? };
    Ok((sendcount, arrays))
}

large_count! {
    MPI_Neighbor_alltoall_c => MPI_Neighbor_alltoall,
    MPI_Ineighbor_alltoall_c => MPI_Ineighbor_alltoall;
    (
        sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype,
    )
    let (sendcount, recvcount) = all_counts(sendbuf, sendcount, recvcount);
    (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype)
}

large_count! {
    MPI_Neighbor_alltoallv_c => MPI_Neighbor_alltoallv,
    MPI_Ineighbor_alltoallv_c => MPI_Ineighbor_alltoallv;
    (
        sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint,
        sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count,
        rdispls: *const MPI_Aint, recvtype: MPI_Datatype,
    )
    let (send, recv) = neighbor_args(sendcounts, sdispls, recvcounts, rdispls);
    (
        sendbuf, send.counts(), send.displs(), sendtype,
        recvbuf, recv.counts(), recv.displs(), recvtype,
    )
}

large_count! {
    MPI_Neighbor_alltoallw_c => MPI_Neighbor_alltoallw,
    MPI_Ineighbor_alltoallw_c => MPI_Ineighbor_alltoallw;
    (
        sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint,
        sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count,
        rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype,
    )
    // The C form's displacements are MPI_Aint already: counts only.
    let (send, recv) = neighbor_args(sendcounts, std::ptr::null(), recvcounts, std::ptr::null());
    (
        sendbuf, send.counts(), sdispls, sendtypes,
        recvbuf, recv.counts(), rdispls, recvtypes,
    )
}
