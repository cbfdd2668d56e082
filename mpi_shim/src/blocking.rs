//! The blocking collectives of fixed-size blocks: `MPI_Allreduce`,
//! `MPI_Reduce`, `MPI_Bcast`, `MPI_Allgather`, `MPI_Reduce_scatter_block`,
//! `MPI_Reduce_scatter`, `MPI_Alltoall`, `MPI_Gather`, `MPI_Scatter` and
//! `MPI_Barrier`. Each returns once the data is in place.

use crate::exec;
use crate::plans;
use crate::settings;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op};
use std::ffi::{c_int, c_void};

/// # Safety
/// As `MPI_Allreduce`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Allreduce";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe { mpi_sys::PMPI_Allreduce(b[0], b[1], count, datatype, op, comm) }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::allreduce(CALL, sendbuf, recvbuf, count, datatype, op, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Reduce`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Reduce";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe { mpi_sys::PMPI_Reduce(b[0], b[1], count, datatype, op, root, comm) }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::reduce(CALL, sendbuf, recvbuf, count, datatype, op, root, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Bcast`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Bcast(
    buffer: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Bcast";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffer possibly a staged copy).
        unsafe { mpi_sys::PMPI_Bcast(b[0], count, datatype, root, comm) }
    };
    let bufs = [buffer];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::bcast(CALL, buffer, count, datatype, root, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Allgather`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Allgather";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Allgather(b[0], sendcount, sendtype, b[1], recvcount, recvtype, comm)
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::allgather(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Reduce_scatter_block`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_block(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Reduce_scatter_block";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe { mpi_sys::PMPI_Reduce_scatter_block(b[0], b[1], recvcount, datatype, op, comm) }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::reduce_scatter_block(CALL, sendbuf, recvbuf, recvcount, datatype, op, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Reduce_scatter`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Reduce_scatter";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe { mpi_sys::PMPI_Reduce_scatter(b[0], b[1], recvcounts, datatype, op, comm) }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    // SAFETY: MPI's contract: one count per rank.
    let plan =
        unsafe { plans::reduce_scatter(CALL, sendbuf, recvbuf, recvcounts, datatype, op, comm) };
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Alltoall`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoall(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Alltoall";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Alltoall(b[0], sendcount, sendtype, b[1], recvcount, recvtype, comm)
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::alltoall(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Gather`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Gather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Gather";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Gather(
                b[0], sendcount, sendtype, b[1], recvcount, recvtype, root, comm,
            )
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::gather(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Scatter`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Scatter(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Scatter";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Scatter(
                b[0], sendcount, sendtype, b[1], recvcount, recvtype, root, comm,
            )
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let plan = plans::scatter(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// A barrier has no buffers: MPI's own. (gpucoll's blocking collectives have
/// all completed when they returned, so nothing of the shim is in flight
/// except nonblocking requests, which a barrier does not order.)
///
/// # Safety
/// As `MPI_Barrier`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Barrier(comm: MPI_Comm) -> c_int {
    if settings::active() && settings::get().log {
        crate::route::log("MPI_Barrier", "pmpi", "no buffers");
    }
    // SAFETY: forwarded unchanged.
    unsafe { mpi_sys::PMPI_Barrier(comm) }
}
