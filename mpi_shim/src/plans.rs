//! Per collective: MPI's arguments turned into a route and what the route
//! needs (gpucoll's call, or the regions to stage). Each function takes the
//! C arguments of its collective in MPI's order (after the call's name), so
//! the blocking, nonblocking and v-form exports (`collectives.rs`) share it
//! and differ only in the `PMPI_` call they make. The v-forms are in
//! `plans/vector.rs`.

use crate::errors;
use crate::handles::is_in_place;
use crate::misuse;
use crate::native::{send_or_recv, Coll};
use crate::route::{self, Facts, Native, Route};
use crate::staging::{self, Region, Span};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op};
use std::ffi::{c_int, c_void};

mod vector;
pub use vector::{allgatherv, alltoallv, gatherv, scatterv};

/// How one call of a collective with `N` buffers is carried out.
pub enum Plan<const N: usize> {
    Pmpi,
    Failed(c_int),
    Native(Native, Coll, c_int),
    /// Through host copies (pinned ones of the buffers on this GPU; with
    /// `None`, host test mode, plain ones): one region per buffer, in
    /// argument order.
    Staged(Option<i32>, [Region; N]),
}

/// The plan for the route of `f`: gpucoll's call from `native` (`None`: the
/// call has no native form), the staging regions from `regions`.
fn plan<const N: usize>(
    f: &Facts,
    native: impl FnOnce() -> Option<(Coll, c_int)>,
    regions: impl FnOnce() -> Result<[Region; N], c_int>,
) -> Plan<N> {
    match route::decide(f) {
        Route::Pmpi => Plan::Pmpi,
        Route::Failed(c) => Plan::Failed(c),
        Route::Native(n) => match native() {
            Some((coll, count)) => Plan::Native(n, coll, count),
            None => Plan::Pmpi,
        },
        Route::Staged(d) => match regions() {
            Ok(r) => Plan::Staged(d, r),
            Err(code) => Plan::Failed(errors::raise(f.comm, code)),
        },
    }
}

/// The facts of a call without an op or a root whose sides have the same
/// shape; collectives that differ say so with struct update syntax.
fn facts<'a>(
    call: &'static str,
    comm: MPI_Comm,
    buffers: &'a [*const c_void],
    count: i64,
    dtype: Option<MPI_Datatype>,
) -> Facts<'a> {
    Facts {
        call,
        comm,
        buffers,
        count,
        dtype,
        op: None,
        root: None,
        same_shape: true,
    }
}

/// The regions of a call with a send and a receive buffer: MPI reads the
/// send side and writes the receive side, which it reads too in place.
fn send_recv(
    send: *const c_void,
    send_span: Span,
    recv: *mut c_void,
    recv_span: Span,
    in_place: bool,
) -> [Region; 2] {
    [
        Region {
            ptr: send,
            span: send_span,
            read: true,
            write: false,
        },
        Region {
            ptr: recv,
            span: recv_span,
            read: in_place,
            write: true,
        },
    ]
}

/// The bytes of `count` elements of `dt` where this rank's buffer is
/// significant, nothing elsewhere.
fn span_if(significant: bool, count: i64, dt: MPI_Datatype) -> Result<Span, c_int> {
    if significant {
        staging::span(count, dt)
    } else {
        Ok(Span::EMPTY)
    }
}

/// This process's rank and the size of `comm` (`None` if MPI rejects it:
/// the call then goes to `PMPI_`, which reports it).
pub fn rank_size(comm: MPI_Comm) -> Option<(c_int, c_int)> {
    let (mut rank, mut size) = (0, 0);
    // SAFETY: valid out-pointers; MPI validates the handle.
    let ok = unsafe {
        mpi_sys::PMPI_Comm_rank(comm, &mut rank) == 0
            && mpi_sys::PMPI_Comm_size(comm, &mut size) == 0
    };
    ok.then_some((rank, size))
}

/// How many ranks the blocks of a collective on `comm` come from or go
/// to: the remote group of an intercommunicator, else the communicator's
/// size (0 if MPI rejects `comm`; MPI then reports it).
pub fn peers(comm: MPI_Comm) -> c_int {
    let (mut inter, mut n) = (0, 0);
    // SAFETY: valid out-pointers; MPI validates the handle.
    let ok = unsafe {
        mpi_sys::PMPI_Comm_test_inter(comm, &mut inter) == 0
            && if inter != 0 {
                mpi_sys::PMPI_Comm_remote_size(comm, &mut n) == 0
            } else {
                mpi_sys::PMPI_Comm_size(comm, &mut n) == 0
            }
    };
    if ok {
        n
    } else {
        0
    }
}

/// This rank's part in a collective with a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rooted {
    /// The blocks the root sends or receives: one per rank of the
    /// communicator, or of the remote group of an intercommunicator.
    pub peers: c_int,
    /// The root's buffers (all blocks) are significant here: the root of
    /// an intracommunicator, the `MPI_ROOT` rank of an intercommunicator.
    pub root: bool,
    /// This rank's own block is significant: every rank of an
    /// intracommunicator, the ranks of an intercommunicator's other group
    /// (not the root's group, whose other ranks pass `MPI_PROC_NULL`).
    pub member: bool,
    /// The root's own block is in place (intracommunicators only).
    pub in_place: bool,
}

/// This rank's part in a collective rooted at `root` whose root's own block
/// is `own_buffer`; `None` if MPI rejects `comm`.
pub fn rooted(comm: MPI_Comm, root: c_int, own_buffer: *const c_void) -> Option<Rooted> {
    let (rank, _) = rank_size(comm)?;
    let mut inter = 0;
    // SAFETY: a valid out-pointer; MPI accepted the handle above.
    unsafe { mpi_sys::PMPI_Comm_test_inter(comm, &mut inter) };
    // SAFETY: reading a link-time MPI constant.
    let proc_null = unsafe { mpi_sys::RSMPI_PROC_NULL };
    let mpi_root = mpi_sys::MPI_ROOT as c_int;
    Some(rooted_part(
        rank,
        inter != 0,
        root,
        mpi_root,
        proc_null,
        peers(comm),
        || is_in_place(own_buffer),
    ))
}

/// [`rooted`] without MPI: this rank, whether the communicator is an
/// intercommunicator, the root argument, MPI's `MPI_ROOT` and
/// `MPI_PROC_NULL`, the peer count, and whether the own block is in place.
fn rooted_part(
    rank: c_int,
    inter: bool,
    root: c_int,
    mpi_root: c_int,
    proc_null: c_int,
    peers: c_int,
    in_place: impl FnOnce() -> bool,
) -> Rooted {
    if inter {
        return Rooted {
            peers,
            root: root == mpi_root,
            member: root != mpi_root && root != proc_null,
            in_place: false,
        };
    }
    let is_root = rank == root;
    Rooted {
        peers,
        root: is_root,
        member: true,
        in_place: is_root && in_place(),
    }
}

/// The null pointer where a buffer is not significant on this rank.
fn if_significant<T>(significant: bool, p: *const T) -> *const T {
    if significant {
        p
    } else {
        std::ptr::null()
    }
}

/// Blocks of `count` for each of `size` ranks, as a 64-bit count.
fn times(count: c_int, size: c_int) -> i64 {
    i64::from(count) * i64::from(size.max(0))
}

pub fn allreduce(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Plan<2> {
    if misuse::misplaced(call, &[recv.cast_const()]) {
        return Plan::Pmpi;
    }
    let buffers = [send, recv.cast_const()];
    let f = Facts {
        op: Some(op),
        ..facts(call, comm, &buffers, count.into(), Some(dt))
    };
    let in_place = is_in_place(send);
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            Some((Coll::AllReduce { send, recv }, count))
        },
        || {
            let s = staging::span(count.into(), dt)?;
            Ok(send_recv(send, s, recv, s, in_place))
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub fn reduce(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
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
    let f = Facts {
        op: Some(op),
        root: Some(root),
        ..facts(call, comm, &buffers, count.into(), Some(dt))
    };
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            let root = root as usize;
            Some((Coll::Reduce { send, recv, root }, count))
        },
        || {
            let s = span_if(part.member, count.into(), dt)?;
            let r = span_if(part.root, count.into(), dt)?;
            Ok(send_recv(send, s, recv, r, part.in_place))
        },
    )
}

pub fn bcast(
    call: &'static str,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> Plan<1> {
    let Some(part) = rooted(comm, root, std::ptr::null()) else {
        return Plan::Pmpi;
    };
    if misuse::misplaced(call, &[buf.cast_const()]) {
        return Plan::Pmpi;
    }
    let buffers = [if_significant(part.root || part.member, buf.cast_const())];
    let f = Facts {
        root: Some(root),
        ..facts(call, comm, &buffers, count.into(), Some(dt))
    };
    plan(
        &f,
        || {
            Some((
                Coll::Bcast {
                    buf,
                    root: root as usize,
                },
                count,
            ))
        },
        || {
            let span = span_if(part.root || part.member, count.into(), dt)?;
            // On an intercommunicator the MPI_ROOT rank only sends and the
            // other group only receives.
            Ok([Region {
                ptr: buf,
                span,
                read: part.root,
                write: part.member,
            }])
        },
    )
}

/// The native element count and type of an all_gather / all_to_all: the
/// receive side in place, else the send side (native only when both agree).
fn sides(
    in_place: bool,
    scount: c_int,
    stype: MPI_Datatype,
    rcount: c_int,
    rtype: MPI_Datatype,
) -> (c_int, MPI_Datatype, bool) {
    if in_place {
        (rcount, rtype, true)
    } else {
        (scount, stype, scount == rcount && stype == rtype)
    }
}

/// The collectives in which every rank receives a block from every rank.
#[derive(Clone, Copy)]
pub enum AllRanks {
    /// `MPI_Allgather`: one block sent, the same to every rank.
    Gather,
    /// `MPI_Alltoall`: one block sent to each rank.
    Exchange,
}

/// `MPI_Allgather` and `MPI_Alltoall` (after `kind`, their C arguments).
#[allow(clippy::too_many_arguments)]
pub fn all_ranks(
    kind: AllRanks,
    call: &'static str,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Plan<2> {
    if misuse::misplaced(call, &[recv.cast_const()]) {
        return Plan::Pmpi;
    }
    let in_place = is_in_place(send);
    let (count, dt, same) = sides(in_place, scount, stype, rcount, rtype);
    let buffers = [send, recv.cast_const()];
    let f = Facts {
        same_shape: same,
        ..facts(call, comm, &buffers, count.into(), Some(dt))
    };
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            let coll = match kind {
                AllRanks::Gather => Coll::AllGather { send, recv },
                AllRanks::Exchange => Coll::AllToAll { send, recv },
            };
            Some((coll, count))
        },
        || {
            let size = peers(comm);
            let send_blocks = match kind {
                AllRanks::Gather => 1,
                AllRanks::Exchange => size,
            };
            let ss = span_if(!in_place, times(scount, send_blocks), stype)?;
            let rs = staging::span(times(rcount, size), rtype)?;
            Ok(send_recv(send, ss, recv, rs, in_place))
        },
    )
}

/// A reduce_scatter_block of `count` elements per rank whose staging spans
/// cover `(total, mine)` elements: all ranks' blocks on the send side, this
/// rank's on the receive side.
fn reduce_scatter_plan(
    f: &Facts,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    totals: impl FnOnce() -> (i64, i64),
) -> Plan<2> {
    let in_place = is_in_place(send);
    plan(
        f,
        || {
            let send = send_or_recv(send, recv);
            Some((Coll::ReduceScatterBlock { send, recv }, count))
        },
        || {
            let (total, mine) = totals();
            let all = staging::span(total, dt)?;
            if in_place {
                return Ok(send_recv(send, Span::EMPTY, recv, all, true));
            }
            let r = staging::span(mine, dt)?;
            Ok(send_recv(send, all, recv, r, false))
        },
    )
}

pub fn reduce_scatter_block(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    rcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Plan<2> {
    if misuse::misplaced(call, &[recv.cast_const()]) {
        return Plan::Pmpi;
    }
    let buffers = [send, recv.cast_const()];
    let f = Facts {
        op: Some(op),
        ..facts(call, comm, &buffers, rcount.into(), Some(dt))
    };
    // An intercommunicator's send vector has one block per rank of the
    // local group (the group the result is scattered over is the other).
    let local = rank_size(comm).map_or(0, |(_, s)| s);
    let totals = || (times(rcount, local), rcount.into());
    reduce_scatter_plan(&f, send, recv, rcount, dt, totals)
}

/// `MPI_Reduce_scatter`: native when every rank receives the same count
/// (then it is reduce_scatter_block; the counts are the same on every rank).
///
/// # Safety
/// `rcounts` holds one count per rank of `comm`.
pub unsafe fn reduce_scatter(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    rcounts: *const c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Plan<2> {
    if misuse::misplaced(call, &[recv.cast_const()]) {
        return Plan::Pmpi;
    }
    let Some((rank, size)) = rank_size(comm) else {
        return Plan::Pmpi;
    };
    if rcounts.is_null() || size <= 0 {
        return Plan::Pmpi;
    }
    // SAFETY: one count per rank (MPI's contract).
    let counts = unsafe { std::slice::from_raw_parts(rcounts, size as usize) };
    let uniform = counts.iter().all(|&c| c == counts[0]);
    let total: i64 = counts.iter().map(|&c| i64::from(c.max(0))).sum();
    let mine = counts.get(rank as usize).copied().unwrap_or(0);
    let bad = counts.iter().any(|&c| c < 0);
    let buffers = [send, recv.cast_const()];
    let count = if bad { -1 } else { counts[0].into() };
    let f = Facts {
        op: Some(op),
        ..facts(call, comm, &buffers, count, uniform.then_some(dt))
    };
    reduce_scatter_plan(&f, send, recv, counts[0], dt, || (total, mine.into()))
}

#[allow(clippy::too_many_arguments)]
pub fn gather(
    call: &'static str,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcount: c_int,
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
    let (count, dt, same) = match (part.root, part.member) {
        (true, true) => sides(part.in_place, scount, stype, rcount, rtype),
        (false, true) => (scount, stype, true),
        // An intercommunicator's MPI_ROOT only receives; its group's other
        // ranks take no part.
        (true, false) => (rcount, rtype, true),
        (false, false) => (0, stype, true),
    };
    let buffers = [
        if_significant(part.member, send),
        if_significant(part.root, recv.cast_const()),
    ];
    let f = Facts {
        root: Some(root),
        same_shape: same,
        ..facts(call, comm, &buffers, count.into(), Some(dt))
    };
    plan(
        &f,
        || {
            let (send, root) = (send_or_recv(send, recv), root as usize);
            Some((Coll::Gather { send, recv, root }, count))
        },
        || {
            let ss = span_if(part.member && !part.in_place, scount.into(), stype)?;
            let rs = span_if(part.root, times(rcount, part.peers), rtype)?;
            Ok(send_recv(send, ss, recv, rs, part.in_place))
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub fn scatter(
    call: &'static str,
    send: *const c_void,
    scount: c_int,
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
    let in_place = part.in_place;
    let (count, dt, same) = match (part.root, part.member) {
        _ if in_place => (scount, stype, true),
        (true, true) => (rcount, rtype, scount == rcount && stype == rtype),
        (false, true) => (rcount, rtype, true),
        // An intercommunicator's MPI_ROOT only sends.
        (true, false) => (scount, stype, true),
        (false, false) => (0, rtype, true),
    };
    let buffers = [
        if_significant(part.root, send),
        if_significant(part.member, recv.cast_const()),
    ];
    let f = Facts {
        root: Some(root),
        same_shape: same,
        ..facts(call, comm, &buffers, count.into(), Some(dt))
    };
    plan(
        &f,
        || {
            let recv = if in_place { send.cast_mut() } else { recv };
            let root = root as usize;
            Some((Coll::Scatter { send, recv, root }, count))
        },
        || {
            let ss = span_if(part.root, times(scount, part.peers), stype)?;
            let rs = span_if(part.member && !in_place, rcount.into(), rtype)?;
            Ok(send_recv(send, ss, recv, rs, false))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_decide_native_layouts() {
        // SAFETY: reading immutable predefined handles.
        let (f, d) = unsafe { (mpi_sys::RSMPI_FLOAT, mpi_sys::RSMPI_DOUBLE) };
        assert_eq!(sides(false, 4, f, 4, f), (4, f, true));
        assert_eq!(sides(false, 4, f, 2, d), (4, f, false));
        assert_eq!(sides(false, 4, f, 8, f), (4, f, false));
        // In place, the receive side describes the data.
        assert_eq!(sides(true, 0, f, 3, d), (3, d, true));
        assert_eq!(times(3, 4), 12);
        assert_eq!(times(i32::MAX, 4), 4 * i64::from(i32::MAX));
        assert_eq!(times(5, -1), 0);
    }

    #[test]
    fn roots_of_intercommunicators() {
        let (root, null) = (-4, -2);
        let part = |rank, inter, r| rooted_part(rank, inter, r, root, null, 5, || true);
        // Intracommunicator: every rank is a member, the root also the root.
        assert_eq!(
            part(1, false, 1),
            Rooted {
                peers: 5,
                root: true,
                member: true,
                in_place: true
            }
        );
        assert!(!part(0, false, 1).root && part(0, false, 1).member);
        assert!(!part(0, false, 1).in_place);
        // Intercommunicator: MPI_ROOT holds all remote blocks, MPI_PROC_NULL
        // nothing, the other group its own block; never in place.
        let r = part(0, true, root);
        assert!(r.root && !r.member && !r.in_place && r.peers == 5);
        let n = part(0, true, null);
        assert!(!n.root && !n.member);
        let m = part(3, true, 0);
        assert!(!m.root && m.member && !m.in_place);
        assert!(if_significant(false, 8usize as *const u8).is_null());
    }

    #[test]
    fn receive_side_is_read_only_in_place() {
        let (s, r) = (std::ptr::null(), std::ptr::null_mut());
        let [send, recv] = send_recv(s, Span::EMPTY, r, Span::EMPTY, true);
        assert!(send.read && !send.write && recv.read && recv.write);
        let [_, recv] = send_recv(s, Span::EMPTY, r, Span::EMPTY, false);
        assert!(!recv.read && recv.write);
    }
}
