//! `MPI_Ireduce_scatter` (gpucoll's reduce_scatter_block when every rank
//! receives the same count, as for `MPI_Reduce_scatter`, else staged) and
//! `MPI_Reduce_local` (a local op: both buffers staged).

use super::engine::engine_or_staged;
use crate::handles::is_in_place;
use crate::misuse;
use crate::plans::{self, rank_size};
use crate::settings;
use crate::stage::{self, Scope};
use crate::staging::Span;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use std::ffi::{c_int, c_void};

/// # Safety
/// As `MPI_Ireduce_scatter`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    const CALL: &str = "MPI_Ireduce_scatter";
    let pmpi = |[s, r]: &[*mut c_void; 2], req: *mut MPI_Request| {
        // SAFETY: the program's arguments, the buffers possibly replaced by
        // host copies of the same spans.
        unsafe { mpi_sys::PMPI_Ireduce_scatter(*s, *r, recvcounts, datatype, op, comm, req) }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    if !settings::active() || misuse::misplaced(CALL, &[recvbuf.cast_const()]) {
        return pmpi(&args, request);
    }
    // SAFETY: one count per rank (MPI's contract).
    let plan =
        unsafe { plans::reduce_scatter(CALL, sendbuf, recvbuf, recvcounts, datatype, op, comm) };
    let in_place = is_in_place(sendbuf);
    let staged = || {
        let prepare = |c: &mut stage::Copies, [s, r]: [*mut c_void; 2]| {
            let Some((rank, size)) = rank_size(comm) else {
                return Ok([s, r]);
            };
            if recvcounts.is_null() {
                return Ok([s, r]);
            }
            // SAFETY: one count per rank (MPI's contract).
            let counts = unsafe { std::slice::from_raw_parts(recvcounts, size as usize) };
            let total: i64 = counts.iter().map(|&k| i64::from(k.max(0))).sum();
            let mine = counts.get(rank as usize).copied().unwrap_or(0);
            let all = c.type_span(total, datatype)?;
            if in_place {
                return Ok([s, c.span(r, all, true, true)?]);
            }
            let own = c.type_span(mine.into(), datatype)?;
            Ok([c.span(s, all, true, false)?, c.span(r, own, false, true)?])
        };
        // SAFETY: the program's arguments (MPI's contract).
        unsafe {
            stage::call(
                CALL,
                Scope::Collective(comm),
                &[sendbuf, recvbuf.cast_const()],
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
/// As `MPI_Reduce_local`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_local(
    inbuf: *const c_void,
    inoutbuf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    op: MPI_Op,
) -> c_int {
    const CALL: &str = "MPI_Reduce_local";
    let pmpi = |[i, io]: &[*mut c_void; 2], _: *mut MPI_Request| {
        // SAFETY: the program's arguments, the buffers possibly replaced by
        // host copies of the same spans.
        unsafe { mpi_sys::PMPI_Reduce_local(*i, *io, count, datatype, op) }
    };
    let args = [inbuf.cast_mut(), inoutbuf];
    if !settings::active() {
        return pmpi(&args, std::ptr::null_mut());
    }
    if let Some(code) = misuse::refused(CALL, None, &[inbuf, inoutbuf.cast_const()]) {
        return code;
    }
    let prepare = |c: &mut stage::Copies, [i, io]: [*mut c_void; 2]| {
        let span: Span = c.type_span(count.into(), datatype)?;
        Ok([c.span(i, span, true, false)?, c.span(io, span, true, true)?])
    };
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            CALL,
            Scope::world(),
            &[inbuf, inoutbuf.cast_const()],
            None,
            args,
            prepare,
            pmpi,
        )
    }
}
