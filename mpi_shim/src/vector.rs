//! The v-forms: `MPI_Allgatherv`, `MPI_Alltoallv`, `MPI_Gatherv`,
//! `MPI_Scatterv`. gpucoll has no uneven blocks, so device buffers are
//! staged; an `MPI_Allgatherv` whose blocks are all equal and packed in rank
//! order (the counts and displacements are the same on every rank, so every
//! rank sees it) is an all_gather and goes to gpucoll.

use crate::exec;
use crate::handles::is_in_place;
use crate::native::{send_or_recv, Coll};
use crate::plans::{rank_size, Plan};
use crate::route::{self, Facts, Route};
use crate::settings;
use crate::staging::{self, Region, Span};
use mpi_sys::{MPI_Comm, MPI_Datatype};
use std::ffi::{c_int, c_void};

fn region(ptr: *const c_void, span: Span, read: bool, write: bool) -> Region {
    Region {
        ptr,
        span,
        read,
        write,
    }
}

/// Route a v-form: gpucoll only with `native` (an all_gather of `count`).
fn plan(
    f: &Facts,
    native: Option<Coll>,
    count: c_int,
    regions: impl FnOnce() -> Result<Vec<Region>, c_int>,
) -> Plan {
    match route::decide(f) {
        Route::Pmpi => Plan::Pmpi,
        Route::Failed(c) => Plan::Failed(c),
        Route::Native(n) => match native {
            Some(coll) => Plan::Native(n, coll, count),
            None => Plan::Pmpi,
        },
        Route::Staged(d) => match regions() {
            Ok(r) => Plan::Staged(d, r),
            Err(code) => Plan::Failed(crate::errors::raise(f.comm, code)),
        },
    }
}

/// # Safety
/// `p` is null or points at `n` ints.
unsafe fn ints<'a>(p: *const c_int, n: c_int) -> &'a [c_int] {
    if p.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p, n as usize) }
}

/// # Safety
/// As `MPI_Allgatherv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allgatherv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    displs: *const c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Allgatherv";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Allgatherv(
                b[0], sendcount, sendtype, b[1], recvcounts, displs, recvtype, comm,
            )
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let Some((_, size)) = rank_size(comm) else {
        return pmpi(&bufs);
    };
    // SAFETY: MPI's contract: one count and displacement per rank.
    let (counts, disp) = unsafe { (ints(recvcounts, size), ints(displs, size)) };
    let in_place = is_in_place(sendbuf);
    let first = counts.first().copied().unwrap_or(0);
    let packed = counts.len() == size as usize
        && disp.len() == size as usize
        && counts.iter().all(|&c| c == first)
        && disp
            .iter()
            .enumerate()
            .all(|(i, &d)| i64::from(d) == i as i64 * i64::from(first));
    let same = in_place || (sendtype == recvtype && sendcount == first);
    let dt = if in_place { recvtype } else { sendtype };
    let f = Facts {
        call: CALL,
        comm,
        buffers: &[sendbuf, recvbuf],
        count: if counts.iter().any(|&c| c < 0) {
            -1
        } else {
            first.into()
        },
        dtype: packed.then_some(dt),
        op: None,
        root: None,
        same_shape: same,
    };
    let native = Coll::AllGather {
        send: send_or_recv(sendbuf, recvbuf),
        recv: recvbuf,
    };
    let plan = plan(&f, Some(native), first, || {
        let ss = if in_place {
            Span::EMPTY
        } else {
            staging::span(sendcount.into(), sendtype)?
        };
        // SAFETY: one count and displacement per rank.
        let rs = unsafe { staging::span_v(recvcounts, displs, size as usize, recvtype)? };
        Ok(vec![
            region(sendbuf, ss, true, false),
            region(recvbuf, rs, in_place, true),
        ])
    });
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Alltoallv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallv(
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    sdispls: *const c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    rdispls: *const c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Alltoallv";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Alltoallv(
                b[0], sendcounts, sdispls, sendtype, b[1], recvcounts, rdispls, recvtype, comm,
            )
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let Some((_, size)) = rank_size(comm) else {
        return pmpi(&bufs);
    };
    let in_place = is_in_place(sendbuf);
    let f = Facts {
        call: CALL,
        comm,
        buffers: &[sendbuf, recvbuf],
        count: 0,
        dtype: None,
        op: None,
        root: None,
        same_shape: false,
    };
    let plan = plan(&f, None, 0, || {
        let n = size as usize;
        let ss = if in_place {
            Span::EMPTY
        } else {
            // SAFETY: one count and displacement per rank.
            unsafe { staging::span_v(sendcounts, sdispls, n, sendtype)? }
        };
        // SAFETY: one count and displacement per rank.
        let rs = unsafe { staging::span_v(recvcounts, rdispls, n, recvtype)? };
        Ok(vec![
            region(sendbuf, ss, true, false),
            region(recvbuf, rs, in_place, true),
        ])
    });
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Gatherv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Gatherv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    displs: *const c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Gatherv";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Gatherv(
                b[0], sendcount, sendtype, b[1], recvcounts, displs, recvtype, root, comm,
            )
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let Some((rank, size)) = rank_size(comm) else {
        return pmpi(&bufs);
    };
    let is_root = rank == root;
    let in_place = is_root && is_in_place(sendbuf);
    let recv_sig: *const c_void = if is_root { recvbuf } else { std::ptr::null() };
    let f = Facts {
        call: CALL,
        comm,
        buffers: &[sendbuf, recv_sig],
        count: sendcount.into(),
        dtype: None,
        op: None,
        root: Some(root),
        same_shape: false,
    };
    let plan = plan(&f, None, 0, || {
        let ss = if in_place {
            Span::EMPTY
        } else {
            staging::span(sendcount.into(), sendtype)?
        };
        let rs = if is_root {
            // SAFETY: at the root, one count and displacement per rank.
            unsafe { staging::span_v(recvcounts, displs, size as usize, recvtype)? }
        } else {
            Span::EMPTY
        };
        Ok(vec![
            region(sendbuf, ss, true, false),
            region(recvbuf, rs, in_place, true),
        ])
    });
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}

/// # Safety
/// As `MPI_Scatterv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Scatterv(
    sendbuf: *const c_void,
    sendcounts: *const c_int,
    displs: *const c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Scatterv";
    let pmpi = |b: &[*mut c_void]| {
        // SAFETY: the program's arguments (buffers possibly staged copies).
        unsafe {
            mpi_sys::PMPI_Scatterv(
                b[0], sendcounts, displs, sendtype, b[1], recvcount, recvtype, root, comm,
            )
        }
    };
    let bufs = [sendbuf as *mut c_void, recvbuf];
    if !settings::active() {
        return pmpi(&bufs);
    }
    let Some((rank, size)) = rank_size(comm) else {
        return pmpi(&bufs);
    };
    let is_root = rank == root;
    let in_place = is_root && is_in_place(recvbuf);
    let send_sig: *const c_void = if is_root { sendbuf } else { std::ptr::null() };
    let f = Facts {
        call: CALL,
        comm,
        buffers: &[send_sig, recvbuf],
        count: recvcount.into(),
        dtype: None,
        op: None,
        root: Some(root),
        same_shape: false,
    };
    let plan = plan(&f, None, 0, || {
        let ss = if is_root {
            // SAFETY: at the root, one count and displacement per rank.
            unsafe { staging::span_v(sendcounts, displs, size as usize, sendtype)? }
        } else {
            Span::EMPTY
        };
        let rs = if in_place {
            Span::EMPTY
        } else {
            staging::span(recvcount.into(), recvtype)?
        };
        Ok(vec![
            region(sendbuf, ss, true, false),
            region(recvbuf, rs, false, true),
        ])
    });
    // SAFETY: MPI's contract on the arguments.
    unsafe { exec::blocking(CALL, comm, plan, &bufs, pmpi) }
}
