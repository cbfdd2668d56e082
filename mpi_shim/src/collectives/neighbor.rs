//! The neighbourhood collectives, blocking and nonblocking:
//! `MPI_Neighbor_allgather`, `_allgatherv`, `_alltoall`, `_alltoallv`,
//! `_alltoallw` and their `MPI_Ineighbor_*` forms. gpucoll has no
//! topologies: device buffers are staged, with one block per source on the
//! receive side and one per destination on the send side (`topology.rs`).
//! Receive blocks are copied in first: MPI leaves the blocks of
//! `MPI_PROC_NULL` neighbours (a non-periodic Cartesian edge) alone.

use super::alltoallw::{stage_sides, Sides};
use super::topology::{degrees, Degrees};
use crate::misuse;
use crate::route;
use crate::settings;
use crate::stage::{self, Scope, WSide};
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Datatype, MPI_Request};
use std::ffi::{c_int, c_void};

type Bufs = [*mut c_void; 2];

/// The degrees of a call the shim may stage; `None`: it goes to `PMPI_` as
/// it is (the shim off; `MPI_IN_PLACE`, which MPI rejects in these calls;
/// a communicator without a topology, which MPI reports).
fn staged_degrees(call: &str, buffers: &[*const c_void], comm: MPI_Comm) -> Option<Degrees> {
    if !settings::active() || misuse::misplaced(call, buffers) {
        return None;
    }
    let d = degrees(comm);
    if d.is_none() {
        route::log(call, "pmpi", "no process topology");
    }
    d
}

/// `count` elements per block, `blocks` blocks, as one 64-bit count.
fn times(count: c_int, blocks: usize) -> i64 {
    i64::from(count).saturating_mul(blocks as i64)
}

/// Exports the blocking `$name` and nonblocking `$iname` (with `request`
/// last) of one collective, both calling `$imp` with the call's name, the
/// parameters listed, `comm`, and the request (`None`: blocking).
macro_rules! neighbor_pair {
    ($name:ident, $iname:ident => $imp:ident; ($($p:ident: $t:ty),+ $(,)?)) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($p: $t,)+ comm: MPI_Comm) -> c_int {
            // SAFETY: the program's arguments (MPI's contract).
            unsafe { $imp(stringify!($name), $($p,)+ comm, None) }
        }

        #[doc = concat!("# Safety\nAs `", stringify!($iname), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $iname(
            $($p: $t,)+
            comm: MPI_Comm,
            request: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: the program's arguments (MPI's contract).
            unsafe { $imp(stringify!($iname), $($p,)+ comm, Some(request)) }
        }
    };
}

#[allow(clippy::too_many_arguments)]
unsafe fn allgather(
    call: &'static str,
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: the program's arguments, the buffers possibly replaced by
        // host copies of the same spans.
        unsafe {
            match request {
                None => mpi_sys::PMPI_Neighbor_allgather(
                    *s, sendcount, sendtype, *r, recvcount, recvtype, comm,
                ),
                Some(_) => mpi_sys::PMPI_Ineighbor_allgather(
                    *s, sendcount, sendtype, *r, recvcount, recvtype, comm, req,
                ),
            }
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    let bases = [sendbuf, recvbuf.cast_const()];
    let Some(d) = staged_degrees(call, &bases, comm) else {
        return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
    };
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        let ss = c.type_span(sendcount.into(), sendtype)?;
        let rs = c.type_span(times(recvcount, d.sources), recvtype)?;
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, true, true)?])
    };
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            call,
            Scope::Collective(comm),
            &bases,
            request,
            args,
            prepare,
            pmpi,
        )
    }
}

neighbor_pair! {
    MPI_Neighbor_allgather, MPI_Ineighbor_allgather => allgather;
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe fn allgatherv(
    call: &'static str,
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    displs: *const c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: as for `allgather`.
        unsafe {
            match request {
                None => mpi_sys::PMPI_Neighbor_allgatherv(
                    *s, sendcount, sendtype, *r, recvcounts, displs, recvtype, comm,
                ),
                Some(_) => mpi_sys::PMPI_Ineighbor_allgatherv(
                    *s, sendcount, sendtype, *r, recvcounts, displs, recvtype, comm, req,
                ),
            }
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    let bases = [sendbuf, recvbuf.cast_const()];
    let Some(d) = staged_degrees(call, &bases, comm) else {
        return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
    };
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        let ss = c.type_span(sendcount.into(), sendtype)?;
        // SAFETY: one count and displacement per source (MPI's contract).
        let rs = unsafe { c.type_span_v(recvcounts, displs, d.sources, recvtype)? };
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, true, true)?])
    };
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            call,
            Scope::Collective(comm),
            &bases,
            request,
            args,
            prepare,
            pmpi,
        )
    }
}

neighbor_pair! {
    MPI_Neighbor_allgatherv, MPI_Ineighbor_allgatherv => allgatherv;
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int,
        recvtype: MPI_Datatype,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe fn alltoall(
    call: &'static str,
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: as for `allgather`.
        unsafe {
            match request {
                None => mpi_sys::PMPI_Neighbor_alltoall(
                    *s, sendcount, sendtype, *r, recvcount, recvtype, comm,
                ),
                Some(_) => mpi_sys::PMPI_Ineighbor_alltoall(
                    *s, sendcount, sendtype, *r, recvcount, recvtype, comm, req,
                ),
            }
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    let bases = [sendbuf, recvbuf.cast_const()];
    let Some(d) = staged_degrees(call, &bases, comm) else {
        return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
    };
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        let ss = c.type_span(times(sendcount, d.destinations), sendtype)?;
        let rs = c.type_span(times(recvcount, d.sources), recvtype)?;
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, true, true)?])
    };
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            call,
            Scope::Collective(comm),
            &bases,
            request,
            args,
            prepare,
            pmpi,
        )
    }
}

neighbor_pair! {
    MPI_Neighbor_alltoall, MPI_Ineighbor_alltoall => alltoall;
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe fn alltoallv(
    call: &'static str,
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |[s, r]: &Bufs, req: *mut MPI_Request| {
        // SAFETY: as for `allgather`.
        unsafe {
            match request {
                None => mpi_sys::PMPI_Neighbor_alltoallv(
                    *s, sendcounts, sdispls, sendtype, *r, recvcounts, rdispls, recvtype, comm,
                ),
                Some(_) => mpi_sys::PMPI_Ineighbor_alltoallv(
                    *s, sendcounts, sdispls, sendtype, *r, recvcounts, rdispls, recvtype, comm, req,
                ),
            }
        }
    };
    let args = [sendbuf.cast_mut(), recvbuf];
    let bases = [sendbuf, recvbuf.cast_const()];
    let Some(d) = staged_degrees(call, &bases, comm) else {
        return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
    };
    let prepare = |c: &mut stage::Copies, [s, r]: Bufs| {
        // SAFETY: one count and displacement per destination and per source.
        let (ss, rs) = unsafe {
            (
                c.type_span_v(sendcounts, sdispls, d.destinations, sendtype)?,
                c.type_span_v(recvcounts, rdispls, d.sources, recvtype)?,
            )
        };
        Ok([c.span(s, ss, true, false)?, c.span(r, rs, true, true)?])
    };
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            call,
            Scope::Collective(comm),
            &bases,
            request,
            args,
            prepare,
            pmpi,
        )
    }
}

neighbor_pair! {
    MPI_Neighbor_alltoallv, MPI_Ineighbor_alltoallv => alltoallv;
    (
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int,
        sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int,
        rdispls: *const c_int, recvtype: MPI_Datatype,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe fn alltoallw(
    call: &'static str,
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const MPI_Aint,
    sendtypes: *const MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const MPI_Aint,
    recvtypes: *const MPI_Datatype,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |a: &Sides<MPI_Aint>, req: *mut MPI_Request| {
        let (s, r) = (&a.send, &a.recv);
        // SAFETY: the program's arguments, buffers (and, for blocks copied
        // apart, counts and datatypes) replaced by their staged forms.
        unsafe {
            match request {
                None => mpi_sys::PMPI_Neighbor_alltoallw(
                    s.buf, s.counts, s.displs, s.types, r.buf, r.counts, r.displs, r.types, comm,
                ),
                Some(_) => mpi_sys::PMPI_Ineighbor_alltoallw(
                    s.buf, s.counts, s.displs, s.types, r.buf, r.counts, r.displs, r.types, comm,
                    req,
                ),
            }
        }
    };
    let args = Sides {
        send: WSide::new(sendbuf, sendcounts, sdispls, sendtypes),
        recv: WSide::new(recvbuf, recvcounts, rdispls, recvtypes),
    };
    let bases = [sendbuf, recvbuf.cast_const()];
    let Some(d) = staged_degrees(call, &bases, comm) else {
        return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
    };
    let prepare = |c: &mut stage::Copies, a: Sides<MPI_Aint>| {
        // SAFETY: one entry per destination and per source (MPI's contract).
        unsafe { stage_sides(c, a, d.destinations, d.sources, true) }
    };
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        stage::call(
            call,
            Scope::Collective(comm),
            &bases,
            request,
            args,
            prepare,
            pmpi,
        )
    }
}

neighbor_pair! {
    MPI_Neighbor_alltoallw, MPI_Ineighbor_alltoallw => alltoallw;
    (
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint,
        sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int,
        rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype,
    )
}
