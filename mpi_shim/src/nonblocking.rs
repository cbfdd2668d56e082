//! The nonblocking collectives: `MPI_Iallreduce`, `MPI_Ireduce`,
//! `MPI_Ibcast`, `MPI_Iallgather`, `MPI_Ireduce_scatter_block`,
//! `MPI_Ialltoall`, `MPI_Igather`, `MPI_Iscatter`. Host memory gets MPI's own
//! request; device memory routed to gpucoll gets a shim request completed
//! through the completion calls; staged calls run at once and return a
//! completed request.

use crate::exec;
use crate::plans;
use crate::settings;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use std::ffi::{c_int, c_void};

/// # Safety
/// As `MPI_Iallreduce`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Iallreduce";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Iallreduce(b[0], b[1], count, datatype, op, comm, request)
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Allreduce(b[0], b[1], count, datatype, op, comm)
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::allreduce(CALL, sendbuf, recvbuf, count, datatype, op, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Ireduce`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Ireduce";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Ireduce(b[0], b[1], count, datatype, op, root, comm, request)
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Reduce(b[0], b[1], count, datatype, op, root, comm)
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::reduce(CALL, sendbuf, recvbuf, count, datatype, op, root, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Ibcast`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ibcast(
    buffer: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Ibcast";
    // SAFETY (both closures): the program's arguments (buffer possibly a staged copy).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Ibcast(b[0], count, datatype, root, comm, request)
    };
    let pmpi =
        |b: &[*mut c_void]| unsafe { mpi_sys::PMPI_Bcast(b[0], count, datatype, root, comm) };
    let bufs = [buffer];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::bcast(CALL, buffer, count, datatype, root, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Iallgather`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Iallgather";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Iallgather(
            b[0], sendcount, sendtype, b[1], recvcount, recvtype, comm, request,
        )
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Allgather(b[0], sendcount, sendtype, b[1], recvcount, recvtype, comm)
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::allgather(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Ireduce_scatter_block`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter_block(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Ireduce_scatter_block";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Ireduce_scatter_block(b[0], b[1], recvcount, datatype, op, comm, request)
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Reduce_scatter_block(b[0], b[1], recvcount, datatype, op, comm)
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::reduce_scatter_block(CALL, sendbuf, recvbuf, recvcount, datatype, op, comm);
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Ialltoall`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoall(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Ialltoall";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Ialltoall(
            b[0], sendcount, sendtype, b[1], recvcount, recvtype, comm, request,
        )
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Alltoall(b[0], sendcount, sendtype, b[1], recvcount, recvtype, comm)
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::alltoall(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Igather`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Igather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Igather";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Igather(
            b[0], sendcount, sendtype, b[1], recvcount, recvtype, root, comm, request,
        )
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Gather(
            b[0], sendcount, sendtype, b[1], recvcount, recvtype, root, comm,
        )
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::gather(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}

/// # Safety
/// As `MPI_Iscatter`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatter(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Iscatter";
    // SAFETY (both closures): the program's arguments (buffers possibly staged copies).
    let ipmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Iscatter(
            b[0], sendcount, sendtype, b[1], recvcount, recvtype, root, comm, request,
        )
    };
    let pmpi = |b: &[*mut c_void]| unsafe {
        mpi_sys::PMPI_Scatter(
            b[0], sendcount, sendtype, b[1], recvcount, recvtype, root, comm,
        )
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return ipmpi(&bufs);
    }
    let plan = plans::scatter(
        CALL, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm,
    );
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::nonblocking(CALL, comm, plan, &bufs, request, ipmpi, pmpi) }
}
