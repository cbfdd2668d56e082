//! `MPI_Iallreduce_c` ... : the nonblocking large-count forms.
//!
//! # Safety (every function)
//! The caller passes what the MPI-4 standard requires of the function's arguments.

use std::ffi::{c_int, c_void};

use mpi_sys as ffi;
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Count, MPI_Datatype, MPI_Op, MPI_Request};

use super::{
    all_counts, allgatherv_args, alltoallv_args, code, count, gather_counts, gatherv_args,
    reduce_scatter_counts, scatter_counts, scatterv_args,
};

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallreduce_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count_: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(count(count_, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Iallreduce(sendbuf, recvbuf, n, datatype, op, comm, request) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count_: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(count(count_, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Ireduce(sendbuf, recvbuf, n, datatype, op, root, comm, request) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ibcast_c(
    buffer: *mut c_void,
    count_: MPI_Count,
    datatype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(count(count_, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Ibcast(buffer, n, datatype, root, comm, request) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgather_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(
        all_counts(sendbuf, sendcount, recvcount, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe {
                ffi::MPI_Iallgather(sendbuf, sn, sendtype, recvbuf, rn, recvtype, comm, request)
            }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter_block_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(count(recvcount, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Ireduce_scatter_block(sendbuf, recvbuf, n, datatype, op, comm, request) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI requires one receive count per rank of the local group.
    let counts = unsafe { reduce_scatter_counts(recvcounts, comm) };
    code(counts.map(|counts| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly (count arrays:
        // see the module doc of `large_count`).
        unsafe {
            ffi::MPI_Ireduce_scatter(
                sendbuf,
                recvbuf,
                counts.counts(),
                datatype,
                op,
                comm,
                request,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoall_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(
        all_counts(sendbuf, sendcount, recvcount, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe {
                ffi::MPI_Ialltoall(sendbuf, sn, sendtype, recvbuf, rn, recvtype, comm, request)
            }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Igather_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(
        gather_counts(sendbuf, sendcount, recvcount, root, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe {
                ffi::MPI_Igather(
                    sendbuf, sn, sendtype, recvbuf, rn, recvtype, root, comm, request,
                )
            }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatter_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    code(
        scatter_counts(recvbuf, sendcount, recvcount, root, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe {
                ffi::MPI_Iscatter(
                    sendbuf, sn, sendtype, recvbuf, rn, recvtype, root, comm, request,
                )
            }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgatherv_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer.
    let args = unsafe { allgatherv_args(sendbuf, sendcount, recvcounts, displs, comm) };
    code(args.map(|(sn, recv)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly (count arrays:
        // see the module doc of `large_count`).
        unsafe {
            ffi::MPI_Iallgatherv(
                sendbuf,
                sn,
                sendtype,
                recvbuf,
                recv.counts(),
                recv.displs(),
                recvtype,
                comm,
                request,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallv_c(
    sendbuf: *const c_void,
    sendcounts: *const MPI_Count,
    sdispls: *const MPI_Aint,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    rdispls: *const MPI_Aint,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer in each array used.
    let args = unsafe { alltoallv_args(sendbuf, sendcounts, sdispls, recvcounts, rdispls, comm) };
    code(args.map(|(send, recv)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly (count arrays:
        // see the module doc of `large_count`).
        unsafe {
            ffi::MPI_Ialltoallv(
                sendbuf,
                send.counts(),
                send.displs(),
                sendtype,
                recvbuf,
                recv.counts(),
                recv.displs(),
                recvtype,
                comm,
                request,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Igatherv_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer at the root.
    let args = unsafe { gatherv_args(sendbuf, sendcount, recvcounts, displs, root, comm) };
    code(args.map(|(sn, recv)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly (count arrays:
        // see the module doc of `large_count`).
        unsafe {
            ffi::MPI_Igatherv(
                sendbuf,
                sn,
                sendtype,
                recvbuf,
                recv.counts(),
                recv.displs(),
                recvtype,
                root,
                comm,
                request,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatterv_c(
    sendbuf: *const c_void,
    sendcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer at the root.
    let args = unsafe { scatterv_args(recvbuf, sendcounts, displs, recvcount, root, comm) };
    code(args.map(|(send, rn)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly (count arrays:
        // see the module doc of `large_count`).
        unsafe {
            ffi::MPI_Iscatterv(
                sendbuf,
                send.counts(),
                send.displs(),
                sendtype,
                recvbuf,
                rn,
                recvtype,
                root,
                comm,
                request,
            )
        }
    }))
}
