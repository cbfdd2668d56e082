//! From Fortran, the staged calls whose arguments the generic macros do
//! not cover: `MPI_Reduce_local` (no communicator), the pack calls (the
//! external forms take a `CHARACTER` data representation), and the w-forms
//! (`MPI_Alltoallw`, `MPI_Neighbor_alltoallw` and their I-forms: arrays of
//! datatype handles, converted for as many peers as MPI reads).

use std::ffi::{c_char, c_int, c_void, CString};
use std::slice;

use mpi_sys as ffi;

use super::handles::{buffer, comm, datatype, request_c2f, set_ierror, Fint};
use crate::handles::is_in_place;

fortran_call! {
    reduce_local => MPI_Reduce_local as "MPI_REDUCE_LOCAL", "mpi_reduce_local";
    (inbuf: buffer, inoutbuf: buffer, count: int, dtype: datatype, reduce_op: op)
}

fortran_call! {
    pack => MPI_Pack as "MPI_PACK", "mpi_pack";
    (
        inbuf: buffer, incount: int, dtype: datatype, outbuf: buffer, outsize: int,
        position: position, communicator: comm,
    )
}

fortran_call! {
    unpack => MPI_Unpack as "MPI_UNPACK", "mpi_unpack";
    (
        inbuf: buffer, insize: int, position: position, outbuf: buffer, outcount: int,
        dtype: datatype, communicator: comm,
    )
}

/// A Fortran `CHARACTER(*)` argument (its length passed after the others)
/// as a C string: trailing blanks dropped, as Fortran pads.
///
/// # Safety
/// `text` points to `len` readable bytes.
unsafe fn fortran_string(text: *const c_char, len: usize) -> CString {
    let bytes: &[u8] = if text.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { slice::from_raw_parts(text as *const u8, len) }
    };
    let end = bytes.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    let trimmed: Vec<u8> = bytes[..end]
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .collect();
    CString::new(trimmed).unwrap_or_default()
}

fortran_binding! {
    /// `MPI_PACK_EXTERNAL(DATAREP, INBUF, INCOUNT, DATATYPE, OUTBUF, OUTSIZE, POSITION,
    /// IERROR)`.
    fn pack_external(
        datarep: *const c_char, inbuf: *mut c_void, incount: *const Fint,
        dtype: *const Fint, outbuf: *mut c_void, outsize: *const ffi::MPI_Aint,
        position: *mut ffi::MPI_Aint, ierror: *mut Fint, datarep_len: usize,
    ) as "MPI_PACK_EXTERNAL", "mpi_pack_external", "MPI_Pack_external"
    {
        // SAFETY: Fortran passes every scalar by reference and the string's
        // length last; buffers are forwarded.
        unsafe {
            let rep = fortran_string(datarep, datarep_len);
            let code = ffi::MPI_Pack_external(
                rep.as_ptr(), buffer(inbuf), *incount, datatype(dtype), buffer(outbuf), *outsize,
                position,
            );
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_UNPACK_EXTERNAL(DATAREP, INBUF, INSIZE, POSITION, OUTBUF, OUTCOUNT, DATATYPE,
    /// IERROR)`.
    fn unpack_external(
        datarep: *const c_char, inbuf: *mut c_void, insize: *const ffi::MPI_Aint,
        position: *mut ffi::MPI_Aint, outbuf: *mut c_void, outcount: *const Fint,
        dtype: *const Fint, ierror: *mut Fint, datarep_len: usize,
    ) as "MPI_UNPACK_EXTERNAL", "mpi_unpack_external", "MPI_Unpack_external"
    {
        // SAFETY: as for `pack_external`.
        unsafe {
            let rep = fortran_string(datarep, datarep_len);
            let code = ffi::MPI_Unpack_external(
                rep.as_ptr(), buffer(inbuf), *insize, position, buffer(outbuf), *outcount,
                datatype(dtype),
            );
            set_ierror(ierror, code);
        }
    }
}

/// The C handles of `n` Fortran datatype handles (none for a null array).
///
/// # Safety
/// `handles` is null or holds `n` readable integers.
unsafe fn datatypes(handles: *const Fint, n: usize) -> Vec<ffi::MPI_Datatype> {
    if handles.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract.
    let f = unsafe { slice::from_raw_parts(handles, n) };
    // SAFETY: f2c only looks the index up.
    f.iter()
        .map(|&h| unsafe { ffi::PMPI_Type_f2c(h) })
        .collect()
}

fn or_null(v: &[ffi::MPI_Datatype]) -> *const ffi::MPI_Datatype {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr()
    }
}

/// The number of blocks on each side of an all-to-all-w on `comm`: its size,
/// or the remote group's on an intercommunicator (0 when MPI rejects it).
fn peers(comm: ffi::MPI_Comm) -> usize {
    let (mut inter, mut n): (c_int, c_int) = (0, 0);
    // SAFETY: valid out-pointers; MPI validates the handle.
    let ok = unsafe {
        ffi::PMPI_Comm_test_inter(comm, &mut inter) == 0
            && if inter != 0 {
                ffi::PMPI_Comm_remote_size(comm, &mut n) == 0
            } else {
                ffi::PMPI_Comm_size(comm, &mut n) == 0
            }
    };
    if ok {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// Runs `call` with the C datatype arrays of a w-form (`nsend` send handles,
/// unless the send side is in place, and `nrecv` receive handles).
///
/// # Safety
/// The Fortran arrays hold the numbers of handles given.
unsafe fn with_types(
    sendbuf: *mut c_void,
    sendtypes: *const Fint,
    nsend: usize,
    recvtypes: *const Fint,
    nrecv: usize,
    call: impl FnOnce(*const ffi::MPI_Datatype, *const ffi::MPI_Datatype) -> c_int,
) -> c_int {
    let send = if is_in_place(sendbuf) {
        Vec::new()
    } else {
        // SAFETY: per the contract.
        unsafe { datatypes(sendtypes, nsend) }
    };
    // SAFETY: per the contract.
    let recv = unsafe { datatypes(recvtypes, nrecv) };
    call(or_null(&send), or_null(&recv))
}

/// Stores a nonblocking call's request and code.
///
/// # Safety
/// `request` is writable, `ierror` null or writable.
unsafe fn finish(code: c_int, c_request: ffi::MPI_Request, request: *mut Fint, ierror: *mut Fint) {
    // SAFETY: per the contract.
    unsafe {
        if code == ffi::MPI_SUCCESS as c_int {
            *request = request_c2f(c_request);
        }
        set_ierror(ierror, code);
    }
}

fortran_binding! {
    /// `MPI_ALLTOALLW(SENDBUF, SENDCOUNTS, SDISPLS, SENDTYPES, RECVBUF, RECVCOUNTS,
    /// RDISPLS, RECVTYPES, COMM, IERROR)`.
    fn alltoallw(
        sendbuf: *mut c_void, sendcounts: *const Fint, sdispls: *const Fint,
        sendtypes: *const Fint, recvbuf: *mut c_void, recvcounts: *const Fint,
        rdispls: *const Fint, recvtypes: *const Fint, communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_ALLTOALLW", "mpi_alltoallw", "MPI_Alltoallw"
    {
        // SAFETY: Fortran passes every scalar by reference; the arrays have
        // one entry per peer (MPI's contract).
        unsafe {
            let (c, s, r) = (comm(communicator), buffer(sendbuf), buffer(recvbuf));
            let n = peers(c);
            let code = with_types(s, sendtypes, n, recvtypes, n, |st, rt| {
                ffi::MPI_Alltoallw(s, sendcounts, sdispls, st, r, recvcounts, rdispls, rt, c)
            });
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_IALLTOALLW(..., COMM, REQUEST, IERROR)`: Open MPI 4.1 builds the
    /// whole schedule at the call, so the converted datatype arrays may end
    /// with it (as `large_count`'s converted arrays do).
    fn ialltoallw(
        sendbuf: *mut c_void, sendcounts: *const Fint, sdispls: *const Fint,
        sendtypes: *const Fint, recvbuf: *mut c_void, recvcounts: *const Fint,
        rdispls: *const Fint, recvtypes: *const Fint, communicator: *const Fint,
        request: *mut Fint, ierror: *mut Fint,
    ) as "MPI_IALLTOALLW", "mpi_ialltoallw", "MPI_Ialltoallw"
    {
        // SAFETY: as for `alltoallw`; `request` is writable.
        unsafe {
            let (c, s, r) = (comm(communicator), buffer(sendbuf), buffer(recvbuf));
            let n = peers(c);
            let mut q = ffi::RSMPI_REQUEST_NULL;
            let code = with_types(s, sendtypes, n, recvtypes, n, |st, rt| {
                ffi::MPI_Ialltoallw(
                    s, sendcounts, sdispls, st, r, recvcounts, rdispls, rt, c, &mut q,
                )
            });
            finish(code, q, request, ierror);
        }
    }
}

/// The destinations and sources of `comm`'s topology (none without one:
/// the C call reports that).
fn neighbors(comm: ffi::MPI_Comm) -> (usize, usize) {
    crate::collectives::degrees(comm).map_or((0, 0), |d| (d.destinations, d.sources))
}

fortran_binding! {
    /// `MPI_NEIGHBOR_ALLTOALLW(SENDBUF, SENDCOUNTS, SDISPLS, SENDTYPES, RECVBUF,
    /// RECVCOUNTS, RDISPLS, RECVTYPES, COMM, IERROR)`, displacements of
    /// `MPI_ADDRESS_KIND`.
    fn neighbor_alltoallw(
        sendbuf: *mut c_void, sendcounts: *const Fint, sdispls: *const ffi::MPI_Aint,
        sendtypes: *const Fint, recvbuf: *mut c_void, recvcounts: *const Fint,
        rdispls: *const ffi::MPI_Aint, recvtypes: *const Fint, communicator: *const Fint,
        ierror: *mut Fint,
    ) as "MPI_NEIGHBOR_ALLTOALLW", "mpi_neighbor_alltoallw", "MPI_Neighbor_alltoallw"
    {
        // SAFETY: Fortran passes every scalar by reference; the arrays have
        // one entry per destination and per source (MPI's contract).
        unsafe {
            let (c, s, r) = (comm(communicator), buffer(sendbuf), buffer(recvbuf));
            let (nd, ns) = neighbors(c);
            let code = with_types(s, sendtypes, nd, recvtypes, ns, |st, rt| {
                ffi::MPI_Neighbor_alltoallw(
                    s, sendcounts, sdispls, st, r, recvcounts, rdispls, rt, c,
                )
            });
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_INEIGHBOR_ALLTOALLW(..., COMM, REQUEST, IERROR)`.
    fn ineighbor_alltoallw(
        sendbuf: *mut c_void, sendcounts: *const Fint, sdispls: *const ffi::MPI_Aint,
        sendtypes: *const Fint, recvbuf: *mut c_void, recvcounts: *const Fint,
        rdispls: *const ffi::MPI_Aint, recvtypes: *const Fint, communicator: *const Fint,
        request: *mut Fint, ierror: *mut Fint,
    ) as "MPI_INEIGHBOR_ALLTOALLW", "mpi_ineighbor_alltoallw", "MPI_Ineighbor_alltoallw"
    {
        // SAFETY: as for `neighbor_alltoallw`; `request` is writable.
        unsafe {
            let (c, s, r) = (comm(communicator), buffer(sendbuf), buffer(recvbuf));
            let (nd, ns) = neighbors(c);
            let mut q = ffi::RSMPI_REQUEST_NULL;
            let code = with_types(s, sendtypes, nd, recvtypes, ns, |st, rt| {
                ffi::MPI_Ineighbor_alltoallw(
                    s, sendcounts, sdispls, st, r, recvcounts, rdispls, rt, c, &mut q,
                )
            });
            finish(code, q, request, ierror);
        }
    }
}
