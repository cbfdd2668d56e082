//! Per collective: MPI's arguments turned into a route and what the route
//! needs (gpucoll's call, or the regions to stage). Shared by the blocking
//! and nonblocking exports, which differ only in the `PMPI_` call they make.

use crate::errors;
use crate::handles::is_in_place;
use crate::native::{send_or_recv, Coll};
use crate::route::{self, Facts, Native, Route};
use crate::staging::{self, Region, Span};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op};
use std::ffi::{c_int, c_void};

pub enum Plan {
    Pmpi,
    Failed(c_int),
    Native(Native, Coll, c_int),
    Staged(i32, Vec<Region>),
}

fn region(ptr: *const c_void, span: Span, read: bool, write: bool) -> Region {
    Region {
        ptr,
        span,
        read,
        write,
    }
}

/// The plan for a route whose staging regions come from `regions`.
fn plan(
    f: &Facts,
    native: impl FnOnce() -> (Coll, c_int),
    regions: impl FnOnce() -> Result<Vec<Region>, c_int>,
) -> Plan {
    match route::decide(f) {
        Route::Pmpi => Plan::Pmpi,
        Route::Failed(c) => Plan::Failed(c),
        Route::Native(n) => {
            let (coll, count) = native();
            Plan::Native(n, coll, count)
        }
        Route::Staged(d) => match regions() {
            Ok(r) => Plan::Staged(d, r),
            Err(code) => Plan::Failed(errors::raise(f.comm, code)),
        },
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

/// Blocks of `count` for each of `size` ranks, as a 64-bit count.
fn times(count: c_int, size: c_int) -> i64 {
    i64::from(count) * i64::from(size.max(0))
}

#[allow(clippy::too_many_arguments)]
pub fn allreduce(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Plan {
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv],
        count: count.into(),
        dtype: Some(dt),
        op: Some(op),
        root: None,
        same_shape: true,
    };
    let in_place = is_in_place(send);
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (Coll::AllReduce { send, recv }, count)
        },
        || {
            let s = staging::span(count.into(), dt)?;
            Ok(vec![
                region(send, s, true, false),
                region(recv, s, in_place, true),
            ])
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
) -> Plan {
    let Some((rank, _)) = rank_size(comm) else {
        return Plan::Pmpi;
    };
    let is_root = rank == root;
    let recv_sig: *const c_void = if is_root { recv } else { std::ptr::null() };
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv_sig],
        count: count.into(),
        dtype: Some(dt),
        op: Some(op),
        root: Some(root),
        same_shape: true,
    };
    let in_place = is_in_place(send);
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (
                Coll::Reduce {
                    send,
                    recv,
                    root: root as usize,
                },
                count,
            )
        },
        || {
            let s = staging::span(count.into(), dt)?;
            let mut r = vec![region(send, s, true, false)];
            r.push(region(
                recv,
                if is_root { s } else { Span::EMPTY },
                in_place,
                true,
            ));
            Ok(r)
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
) -> Plan {
    let f = Facts {
        call,
        comm,
        buffers: &[buf],
        count: count.into(),
        dtype: Some(dt),
        op: None,
        root: Some(root),
        same_shape: true,
    };
    plan(
        &f,
        || {
            (
                Coll::Bcast {
                    buf,
                    root: root as usize,
                },
                count,
            )
        },
        || {
            let s = staging::span(count.into(), dt)?;
            Ok(vec![region(buf, s, true, true)])
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

#[allow(clippy::too_many_arguments)]
pub fn allgather(
    call: &'static str,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Plan {
    let in_place = is_in_place(send);
    let (count, dt, same) = sides(in_place, scount, stype, rcount, rtype);
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv],
        count: count.into(),
        dtype: Some(dt),
        op: None,
        root: None,
        same_shape: same,
    };
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (Coll::AllGather { send, recv }, count)
        },
        || {
            let size = rank_size(comm).map_or(0, |(_, s)| s);
            let ss = if in_place {
                Span::EMPTY
            } else {
                staging::span(scount.into(), stype)?
            };
            let rs = staging::span(times(rcount, size), rtype)?;
            Ok(vec![
                region(send, ss, true, false),
                region(recv, rs, in_place, true),
            ])
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub fn alltoall(
    call: &'static str,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Plan {
    let in_place = is_in_place(send);
    let (count, dt, same) = sides(in_place, scount, stype, rcount, rtype);
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv],
        count: count.into(),
        dtype: Some(dt),
        op: None,
        root: None,
        same_shape: same,
    };
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (Coll::AllToAll { send, recv }, count)
        },
        || {
            let size = rank_size(comm).map_or(0, |(_, s)| s);
            let ss = if in_place {
                Span::EMPTY
            } else {
                staging::span(times(scount, size), stype)?
            };
            let rs = staging::span(times(rcount, size), rtype)?;
            Ok(vec![
                region(send, ss, true, false),
                region(recv, rs, in_place, true),
            ])
        },
    )
}

#[allow(clippy::too_many_arguments)]
pub fn reduce_scatter_block(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    rcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Plan {
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv],
        count: rcount.into(),
        dtype: Some(dt),
        op: Some(op),
        root: None,
        same_shape: true,
    };
    let in_place = is_in_place(send);
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (Coll::ReduceScatterBlock { send, recv }, rcount)
        },
        || {
            let size = rank_size(comm).map_or(0, |(_, s)| s);
            let all = staging::span(times(rcount, size), dt)?;
            if in_place {
                return Ok(vec![
                    region(send, Span::EMPTY, false, false),
                    region(recv, all, true, true),
                ]);
            }
            let mine = staging::span(rcount.into(), dt)?;
            Ok(vec![
                region(send, all, true, false),
                region(recv, mine, false, true),
            ])
        },
    )
}

/// `MPI_Reduce_scatter`: native when every rank receives the same count
/// (then it is reduce_scatter_block; the counts are the same on every rank).
///
/// # Safety
/// `rcounts` holds one count per rank of `comm`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter(
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    rcounts: *const c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Plan {
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
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv],
        count: if bad { -1 } else { counts[0].into() },
        dtype: uniform.then_some(dt),
        op: Some(op),
        root: None,
        same_shape: true,
    };
    let in_place = is_in_place(send);
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (Coll::ReduceScatterBlock { send, recv }, counts[0])
        },
        || {
            let all = staging::span(total, dt)?;
            if in_place {
                return Ok(vec![
                    region(send, Span::EMPTY, false, false),
                    region(recv, all, true, true),
                ]);
            }
            let r = staging::span(mine.into(), dt)?;
            Ok(vec![
                region(send, all, true, false),
                region(recv, r, false, true),
            ])
        },
    )
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
) -> Plan {
    let Some((rank, size)) = rank_size(comm) else {
        return Plan::Pmpi;
    };
    let is_root = rank == root;
    let in_place = is_root && is_in_place(send);
    let (count, dt, same) = if is_root {
        sides(in_place, scount, stype, rcount, rtype)
    } else {
        (scount, stype, true)
    };
    let recv_sig: *const c_void = if is_root { recv } else { std::ptr::null() };
    let f = Facts {
        call,
        comm,
        buffers: &[send, recv_sig],
        count: count.into(),
        dtype: Some(dt),
        op: None,
        root: Some(root),
        same_shape: same,
    };
    plan(
        &f,
        || {
            let send = send_or_recv(send, recv);
            (
                Coll::Gather {
                    send,
                    recv,
                    root: root as usize,
                },
                count,
            )
        },
        || {
            let ss = if in_place {
                Span::EMPTY
            } else {
                staging::span(scount.into(), stype)?
            };
            let rs = if is_root {
                staging::span(times(rcount, size), rtype)?
            } else {
                Span::EMPTY
            };
            Ok(vec![
                region(send, ss, true, false),
                region(recv, rs, in_place, true),
            ])
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
) -> Plan {
    let Some((rank, size)) = rank_size(comm) else {
        return Plan::Pmpi;
    };
    let is_root = rank == root;
    let in_place = is_root && is_in_place(recv);
    let (count, dt, same) = if in_place {
        (scount, stype, true)
    } else if is_root {
        (rcount, rtype, scount == rcount && stype == rtype)
    } else {
        (rcount, rtype, true)
    };
    let send_sig: *const c_void = if is_root { send } else { std::ptr::null() };
    let f = Facts {
        call,
        comm,
        buffers: &[send_sig, recv],
        count: count.into(),
        dtype: Some(dt),
        op: None,
        root: Some(root),
        same_shape: same,
    };
    plan(
        &f,
        || {
            let recv = if in_place { send as *mut c_void } else { recv };
            (
                Coll::Scatter {
                    send,
                    recv,
                    root: root as usize,
                },
                count,
            )
        },
        || {
            let ss = if is_root {
                staging::span(times(scount, size), stype)?
            } else {
                Span::EMPTY
            };
            let rs = if in_place {
                Span::EMPTY
            } else {
                staging::span(rcount.into(), rtype)?
            };
            Ok(vec![
                region(send, ss, true, false),
                region(recv, rs, false, true),
            ])
        },
    )
}
