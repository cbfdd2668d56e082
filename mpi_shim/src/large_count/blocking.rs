//! `MPI_Allreduce_c` ... : the blocking large-count forms.
//!
//! # Safety (every function)
//! The caller passes what the MPI-4 standard requires of the function's arguments.

use std::ffi::{c_int, c_void};

use mpi_sys as ffi;
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Count, MPI_Datatype, MPI_Op};

use super::{
    all_counts, allgatherv_args, alltoallv_args, code, count, gather_counts, gatherv_args,
    reduce_scatter_counts, scatter_counts, scatterv_args,
};

#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count_: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    code(count(count_, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Allreduce(sendbuf, recvbuf, n, datatype, op, comm) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count_: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    code(count(count_, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Reduce(sendbuf, recvbuf, n, datatype, op, root, comm) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Bcast_c(
    buffer: *mut c_void,
    count_: MPI_Count,
    datatype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    code(count(count_, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Bcast(buffer, n, datatype, root, comm) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    code(
        all_counts(sendbuf, sendcount, recvcount, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe { ffi::MPI_Allgather(sendbuf, sn, sendtype, recvbuf, rn, recvtype, comm) }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_block_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    code(count(recvcount, comm).map(|n| {
        // SAFETY: the caller's arguments, with the count narrowed losslessly.
        unsafe { ffi::MPI_Reduce_scatter_block(sendbuf, recvbuf, n, datatype, op, comm) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_c(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI requires one receive count per rank of the local group.
    let counts = unsafe { reduce_scatter_counts(recvcounts, comm) };
    code(counts.map(|counts| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly.
        unsafe { ffi::MPI_Reduce_scatter(sendbuf, recvbuf, counts.counts(), datatype, op, comm) }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoall_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    code(
        all_counts(sendbuf, sendcount, recvcount, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe { ffi::MPI_Alltoall(sendbuf, sn, sendtype, recvbuf, rn, recvtype, comm) }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Gather_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    code(
        gather_counts(sendbuf, sendcount, recvcount, root, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe { ffi::MPI_Gather(sendbuf, sn, sendtype, recvbuf, rn, recvtype, root, comm) }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Scatter_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    code(
        scatter_counts(recvbuf, sendcount, recvcount, root, comm).map(|(sn, rn)| {
            // SAFETY: the caller's arguments, with the counts narrowed losslessly.
            unsafe { ffi::MPI_Scatter(sendbuf, sn, sendtype, recvbuf, rn, recvtype, root, comm) }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allgatherv_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer.
    let args = unsafe { allgatherv_args(sendbuf, sendcount, recvcounts, displs, comm) };
    code(args.map(|(sn, recv)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly.
        unsafe {
            ffi::MPI_Allgatherv(
                sendbuf,
                sn,
                sendtype,
                recvbuf,
                recv.counts(),
                recv.displs(),
                recvtype,
                comm,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallv_c(
    sendbuf: *const c_void,
    sendcounts: *const MPI_Count,
    sdispls: *const MPI_Aint,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    rdispls: *const MPI_Aint,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer in each array used.
    let args = unsafe { alltoallv_args(sendbuf, sendcounts, sdispls, recvcounts, rdispls, comm) };
    code(args.map(|(send, recv)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly.
        unsafe {
            ffi::MPI_Alltoallv(
                sendbuf,
                send.counts(),
                send.displs(),
                sendtype,
                recvbuf,
                recv.counts(),
                recv.displs(),
                recvtype,
                comm,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Gatherv_c(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer at the root.
    let args = unsafe { gatherv_args(sendbuf, sendcount, recvcounts, displs, root, comm) };
    code(args.map(|(sn, recv)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly.
        unsafe {
            ffi::MPI_Gatherv(
                sendbuf,
                sn,
                sendtype,
                recvbuf,
                recv.counts(),
                recv.displs(),
                recvtype,
                root,
                comm,
            )
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Scatterv_c(
    sendbuf: *const c_void,
    sendcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: MPI_Count,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI requires one count and displacement per peer at the root.
    let args = unsafe { scatterv_args(recvbuf, sendcounts, displs, recvcount, root, comm) };
    code(args.map(|(send, rn)| {
        // SAFETY: the caller's arguments, with the counts narrowed losslessly.
        unsafe {
            ffi::MPI_Scatterv(
                sendbuf,
                send.counts(),
                send.displs(),
                sendtype,
                recvbuf,
                rn,
                recvtype,
                root,
                comm,
            )
        }
    }))
}
