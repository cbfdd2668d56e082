//! The v-forms: `MPI_Allgatherv`, `MPI_Alltoallv`, `MPI_Gatherv`,
//! `MPI_Scatterv`. gpucoll has no uneven blocks, so device buffers are
//! staged; an `MPI_Allgatherv` whose blocks are all equal and packed in rank
//! order (the counts and displacements are the same on every rank, so every
//! rank sees it) is an all_gather and goes to gpucoll.
//!
//! On an intercommunicator the arrays have one entry per rank of the
//! remote group (where the blocks come from or go to), the root is
//! `MPI_ROOT` / `MPI_PROC_NULL` in its group, and every call is staged.
//!
//! # Safety (every function)
//! The count and displacement arrays hold one entry per peer (rank of the
//! communicator, or of the remote group of an intercommunicator) wherever
//! MPI reads them (MPI's contract).

use super::{facts, if_significant, peers, plan, rooted, send_recv, span_if, Plan};
use crate::handles::is_in_place;
use crate::misuse;
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
    let size = peers(comm);
    if size <= 0 {
        return Plan::Pmpi;
    }
    if misuse::misplaced(call, &[recv.cast_const()]) {
        return Plan::Pmpi;
    }
    // SAFETY: one count and displacement per peer.
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
    let size = peers(comm);
    if size <= 0 {
        return Plan::Pmpi;
    }
    if misuse::misplaced(call, &[recv.cast_const()]) {
        return Plan::Pmpi;
    }
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
    let Some(part) = rooted(comm, root, send) else {
        return Plan::Pmpi;
    };
    if misuse::misplaced(call, &[if part.root { recv.cast_const() } else { send }]) {
        return Plan::Pmpi;
    }
    let buffers = [
        if_significant(part.member, send),
        if_significant(part.root, recv.cast_const()),
    ];
    // The count MPI checks where it is significant (none at MPI_PROC_NULL).
    let count = if part.member { scount.into() } else { 0 };
    staged_only(call, comm, buffers, count, Some(root), || {
        let ss = span_if(part.member && !part.in_place, scount.into(), stype)?;
        // SAFETY: at the root, one count and displacement per peer.
        let rs = unsafe { span_v_if(part.root, rcounts, displs, part.peers, rtype)? };
        Ok(send_recv(send, ss, recv, rs, part.in_place))
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
    let Some(part) = rooted(comm, root, recv) else {
        return Plan::Pmpi;
    };
    if misuse::misplaced(call, &[if part.root { send } else { recv.cast_const() }]) {
        return Plan::Pmpi;
    }
    let buffers = [
        if_significant(part.root, send),
        if_significant(part.member, recv.cast_const()),
    ];
    let count = if part.member { rcount.into() } else { 0 };
    staged_only(call, comm, buffers, count, Some(root), || {
        // SAFETY: at the root, one count and displacement per peer.
        let ss = unsafe { span_v_if(part.root, scounts, displs, part.peers, stype)? };
        let rs = span_if(part.member && !part.in_place, rcount.into(), rtype)?;
        Ok(send_recv(send, ss, recv, rs, false))
    })
}
