//! `MPI_Alltoallw` and `MPI_Ialltoallw`: staged block by block, including
//! `MPI_BOTTOM` with absolute addresses in the datatypes (see `stage`).

use crate::handles::is_in_place;
use crate::misuse;
use crate::plans::rank_size;
use crate::settings;
use crate::stage::{self, stage_side, Displ, Scope, WSide};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request};
use std::ffi::{c_int, c_void};

/// Both sides of an all-to-all-w as MPI gets them.
pub struct Sides<D> {
    pub send: WSide<D>,
    pub recv: WSide<D>,
}

/// Stage both sides of a w-form with `nsend` send and `nrecv` receive
/// blocks (`MPI_IN_PLACE`: the receive side is read too, the send side
/// ignored).
///
/// # Safety
/// The non-null arrays of each side hold its number of entries.
pub unsafe fn stage_sides<D: Displ>(
    c: &mut stage::Copies,
    sides: Sides<D>,
    nsend: usize,
    nrecv: usize,
    recv_read: bool,
) -> Result<Sides<D>, c_int> {
    let in_place = is_in_place(sides.send.buf);
    let send = if in_place {
        sides.send
    } else {
        // SAFETY: `nsend` entries (the contract).
        unsafe { stage_side(c, sides.send, nsend, true, false)? }
    };
    // SAFETY: `nrecv` entries (the contract).
    let recv = unsafe { stage_side(c, sides.recv, nrecv, in_place || recv_read, true)? };
    Ok(Sides { send, recv })
}

#[allow(clippy::too_many_arguments)]
unsafe fn alltoallw(
    call: &'static str,
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const c_int,
    sendtypes: *const MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const c_int,
    recvtypes: *const MPI_Datatype,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |a: &Sides<c_int>, req: *mut MPI_Request| {
        let (s, r) = (&a.send, &a.recv);
        // SAFETY: the program's arguments, buffers (and, for blocks copied
        // apart, counts and datatypes) replaced by their staged forms.
        unsafe {
            match request {
                None => mpi_sys::PMPI_Alltoallw(
                    s.buf, s.counts, s.displs, s.types, r.buf, r.counts, r.displs, r.types, comm,
                ),
                Some(_) => mpi_sys::PMPI_Ialltoallw(
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
    let own = request.unwrap_or(std::ptr::null_mut());
    if !settings::active() || misuse::misplaced(call, &[recvbuf.cast_const()]) {
        return pmpi(&args, own);
    }
    let prepare = |c: &mut stage::Copies, a: Sides<c_int>| {
        let n = rank_size(comm).map_or(0, |(_, s)| s.max(0) as usize);
        // SAFETY: one entry per rank in each array (MPI's contract).
        unsafe { stage_sides(c, a, n, n, false) }
    };
    let bases = [sendbuf, recvbuf.cast_const()];
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

/// # Safety
/// As `MPI_Alltoallw`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallw(
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const c_int,
    sendtypes: *const MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const c_int,
    recvtypes: *const MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        alltoallw(
            "MPI_Alltoallw",
            sendbuf,
            sendcounts,
            sdispls,
            sendtypes,
            recvbuf,
            recvcounts,
            rdispls,
            recvtypes,
            comm,
            None,
        )
    }
}

/// # Safety
/// As `MPI_Ialltoallw`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallw(
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const c_int,
    sendtypes: *const MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const c_int,
    recvtypes: *const MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the program's arguments (MPI's contract).
    unsafe {
        alltoallw(
            "MPI_Ialltoallw",
            sendbuf,
            sendcounts,
            sdispls,
            sendtypes,
            recvbuf,
            recvcounts,
            rdispls,
            recvtypes,
            comm,
            Some(request),
        )
    }
}
