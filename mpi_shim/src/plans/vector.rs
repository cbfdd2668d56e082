//! The v-forms: `MPI_Allgatherv`, `MPI_Alltoallv`, `MPI_Gatherv`,
//! `MPI_Scatterv`. gpucoll has no uneven blocks, so device buffers are
//! staged; an `MPI_Allgatherv` whose blocks are all equal and packed in rank
//! order (the counts and displacements are the same on every rank, so every
//! rank sees it) is an all_gather and goes to gpucoll.
//!
//! # Safety (every function)
//! The count and displacement arrays hold one entry per rank wherever MPI
//! reads them (MPI's contract).

use super::{facts, plan, rank_size, rooted, send_recv, span_if, Plan};
use crate::handles::is_in_place;
use crate::native::{send_or_recv, Coll};
use crate::route::Facts;
use crate::staging::{self, Region, Span};
use mpi_sys::{MPI_Comm, MPI_Datatype};
use std::ffi::{c_int, c_void};

/// # Safety
/// `p` is null or points at `n` ints.
unsafe fn ints<'a>(p: *const c_int, n: c_int) -> &'a [c_int] {
    if p.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p, n as usize) }
}

/// The bytes of the blocks of a count and displacement array, where this
/// rank's buffer is significant.
///
/// # Safety
/// Where significant, both arrays hold `size` entries.
unsafe fn span_v_if(
    significant: bool,
    counts: *const c_int,
    displs: *const c_int,
    size: c_int,
    dt: MPI_Datatype,
) -> Result<Span, c_int> {
    if !significant {
        return Ok(Span::EMPTY);
    }
    // SAFETY: per the contract.
    unsafe { staging::span_v(counts, displs, size.max(0) as usize, dt) }
}

/// The plan of a v-form gpucoll has no form of: `PMPI_` for host memory,
/// staged for device memory (with `count` and `root`, MPI judges bad ones).
fn staged_only(
    call: &'static str,
    comm: MPI_Comm,
    buffers: [*const c_void; 2],
    count: i64,
    root: Option<c_int>,
    regions: impl FnOnce() -> Result<[Region; 2], c_int>,
) -> Plan<2> {
    let f = Facts {
        root,
        same_shape: false,
        ..facts(call, comm, &buffers, count, None)
    };
    plan(&f, || None, regions)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn allgatherv(
    call: &'static str,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Plan<2> {
    let Some((_, size)) = rank_size(comm) else {
        return Plan::Pmpi;
    };
    // SAFETY: one count and displacement per rank.
    let (counts, disp) = unsafe { (ints(rcounts, size), ints(displs, size)) };
    let in_place = is_in_place(send);
    let first = counts.first().copied().unwrap_or(0);
    let packed = counts.len() == size as usize
        && disp.len() == size as usize
        && counts.iter().all(|&c| c == first)
        && disp
            .iter()
            .enumerate()
            .all(|(i, &d)| i64::from(d) == i as i64 * i64::from(first));
    let same = in_place || (stype == rtype && scount == first);
    let dt = if in_place { rtype } else { stype };
    let count = if counts.iter().any(|&c| c < 0) {
        -1
    } else {
        first.into()
    };
    let buffers = [send, recv.cast_const()];
    let f = Facts {
        same_shape: same,
        ..facts(call, comm, &buffers, count, packed.then_some(dt))
    };
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            Some((Coll::AllGather { send, recv }, first))
        },
        || {
            let ss = span_if(!in_place, scount.into(), stype)?;
            // SAFETY: one count and displacement per rank.
            let rs = unsafe { span_v_if(true, rcounts, displs, size, rtype)? };
            Ok(send_recv(send, ss, recv, rs, in_place))
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn alltoallv(
    call: &'static str,
    send: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Plan<2> {
    let Some((_, size)) = rank_size(comm) else {
        return Plan::Pmpi;
    };
    let in_place = is_in_place(send);
    let buffers = [send, recv.cast_const()];
    staged_only(call, comm, buffers, 0, None, || {
        // SAFETY: one count and displacement per rank in each array used.
        let (ss, rs) = unsafe {
            (
                span_v_if(!in_place, scounts, sdispls, size, stype)?,
                span_v_if(true, rcounts, rdispls, size, rtype)?,
            )
        };
        Ok(send_recv(send, ss, recv, rs, in_place))
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn gatherv(
    call: &'static str,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> Plan<2> {
    let Some((size, is_root, in_place)) = rooted(comm, root, send) else {
        return Plan::Pmpi;
    };
    let buffers = [send, if is_root { recv } else { std::ptr::null_mut() }];
    staged_only(call, comm, buffers, scount.into(), Some(root), || {
        let ss = span_if(!in_place, scount.into(), stype)?;
        // SAFETY: at the root, one count and displacement per rank.
        let rs = unsafe { span_v_if(is_root, rcounts, displs, size, rtype)? };
        Ok(send_recv(send, ss, recv, rs, in_place))
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn scatterv(
    call: &'static str,
    send: *const c_void,
    scounts: *const c_int,
    displs: *const c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> Plan<2> {
    let Some((size, is_root, in_place)) = rooted(comm, root, recv) else {
        return Plan::Pmpi;
    };
    let buffers = [if is_root { send } else { std::ptr::null() }, recv];
    staged_only(call, comm, buffers, rcount.into(), Some(root), || {
        // SAFETY: at the root, one count and displacement per rank.
        let ss = unsafe { span_v_if(is_root, scounts, displs, size, stype)? };
        let rs = span_if(!in_place, rcount.into(), rtype)?;
        Ok(send_recv(send, ss, recv, rs, false))
    })
}
