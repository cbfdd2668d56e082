//! The nonblocking v-forms: `MPI_Iallgatherv` (gpucoll's all_gather when
//! its blocks are equal and packed in rank order, as for
//! `MPI_Allgatherv`), `MPI_Ialltoallv`, `MPI_Igatherv` and `MPI_Iscatterv`
//! (gpucoll has no uneven blocks: staged). A staged call's results are
//! copied back when its request completes.

use super::engine::engine_or_staged;
use crate::handles::is_in_place;
use crate::misuse;
use crate::plans::{self, rank_size};
use crate::settings;
use crate::stage::{self, Scope};
use crate::staging::Span;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request};
use std::ffi::{c_int, c_void};

type Bufs = [*mut c_void; 2];

/// This rank, and the size of `comm` (0 when MPI rejects it: nothing is
/// staged and the `PMPI_` call reports it).
fn me(comm: MPI_Comm) -> (c_int, usize) {
    // SAFETY: reading an immutable handle constant.
    if comm == unsafe { mpi_sys::RSMPI_COMM_NULL } {
        return (-1, 0);
    }
    rank_size(comm).map_or((-1, 0), |(r, s)| (r, s.max(0) as usize))
}

/// # Safety
/// As `MPI_Iallgatherv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgatherv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    displs: *const c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Iallgatherv";
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: the program's arguments, the buffers possibly replaced by
        // host copies of the same spans.
        unsafe {
            mpi_sys::PMPI_Iallgatherv(
                *s, sendcount, sendtype, *r, recvcounts, displs, recvtype, comm, req,
            )
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    if !settings::active() || misuse::misplaced(CALL, &[recvbuf.cast_const()]) {
        return pmpi(&args, request);
    }
    // SAFETY: one count and displacement per rank (MPI's contract).
    let plan = unsafe {
        plans::allgatherv(
            CALL, sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
        )
    };
    let in_place = is_in_place(sendbuf);
    let staged = || {
        let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
            let (_, n) = me(comm);
            let ss = c.type_span(sendcount.into(), sendtype)?;
            // SAFETY: one count and displacement per rank.
            let rs = unsafe { c.type_span_v(recvcounts, displs, n, recvtype)? };
            Ok([c.span(s, ss, true, false)?, c.span(r, rs, in_place, true)?])
        };
        let bases = [sendbuf, recvbuf.cast_const()];
        // SAFETY: the program's arguments (MPI's contract).
        unsafe {
            stage::call(
                CALL,
                Scope::Collective(comm),
                &bases,
                Some(request),
                args,
                prepare,
                pmpi,
            )
        }
    };
    // SAFETY: as above.
    unsafe { engine_or_staged(CALL, comm, Some(request), Some(plan), staged) }
}

/// # Safety
/// As `MPI_Ialltoallv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallv(
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Ialltoallv";
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: as for MPI_Iallgatherv.
        unsafe {
            mpi_sys::PMPI_Ialltoallv(
                *s, sendcounts, sdispls, sendtype, *r, recvcounts, rdispls, recvtype, comm, req,
            )
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    if !settings::active() || misuse::misplaced(CALL, &[recvbuf.cast_const()]) {
        return pmpi(&args, request);
    }
    let in_place = is_in_place(sendbuf);
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        let (_, n) = me(comm);
        let ss = if in_place {
            Span::EMPTY
        } else {
            // SAFETY: one count and displacement per rank.
            unsafe { c.type_span_v(sendcounts, sdispls, n, sendtype)? }
        };
        // SAFETY: as above.
        let rs = unsafe { c.type_span_v(recvcounts, rdispls, n, recvtype)? };
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, in_place, true)?])
    };
    let bases = [sendbuf, recvbuf.cast_const()];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            CALL,
            Scope::Collective(comm),
            &bases,
            Some(request),
            args,
            prepare,
            pmpi,
        )
    }
}

/// # Safety
/// As `MPI_Igatherv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Igatherv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    displs: *const c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Igatherv";
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: as for MPI_Iallgatherv.
        unsafe {
            mpi_sys::PMPI_Igatherv(
                *s, sendcount, sendtype, *r, recvcounts, displs, recvtype, root, comm, req,
            )
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    if !settings::active() {
        return pmpi(&args, request);
    }
    let (rank, n) = me(comm);
    let is_root = rank == root;
    let misplaced = if is_root {
        recvbuf.cast_const()
    } else {
        sendbuf
    };
    if misuse::misplaced(CALL, &[misplaced]) {
        return pmpi(&args, request);
    }
    let in_place = is_root && is_in_place(sendbuf);
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        let ss = c.type_span(sendcount.into(), sendtype)?;
        let rs = if is_root {
            // SAFETY: at the root, one count and displacement per rank.
            unsafe { c.type_span_v(recvcounts, displs, n, recvtype)? }
        } else {
            Span::EMPTY
        };
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, in_place, true)?])
    };
    let bases = [
        sendbuf,
        if is_root {
            recvbuf.cast_const()
        } else {
            sendbuf
        },
    ];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            CALL,
            Scope::Collective(comm),
            &bases,
            Some(request),
            args,
            prepare,
            pmpi,
        )
    }
}

/// # Safety
/// As `MPI_Iscatterv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatterv(
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    displs: *const c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Iscatterv";
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: as for MPI_Iallgatherv.
        unsafe {
            mpi_sys::PMPI_Iscatterv(
                *s, sendcounts, displs, sendtype, *r, recvcount, recvtype, root, comm, req,
            )
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    if !settings::active() {
        return pmpi(&args, request);
    }
    let (rank, n) = me(comm);
    let is_root = rank == root;
    let misplaced = if is_root {
        sendbuf
    } else {
        recvbuf.cast_const()
    };
    if misuse::misplaced(CALL, &[misplaced]) {
        return pmpi(&args, request);
    }
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        let ss = if is_root {
            // SAFETY: at the root, one count and displacement per rank.
            unsafe { c.type_span_v(sendcounts, displs, n, sendtype)? }
        } else {
            Span::EMPTY
        };
        let rs = c.type_span(recvcount.into(), recvtype)?;
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, false, true)?])
    };
    let bases = [
        if is_root {
            sendbuf
        } else {
            recvbuf.cast_const()
        },
        recvbuf.cast_const(),
    ];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            CALL,
            Scope::Collective(comm),
            &bases,
            Some(request),
            args,
            prepare,
            pmpi,
        )
    }
}
