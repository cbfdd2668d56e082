//! The C entry points of the collectives: blocking (`MPI_Allreduce`,
//! `MPI_Reduce`, `MPI_Bcast`, `MPI_Allgather`, `MPI_Reduce_scatter_block`,
//! `MPI_Reduce_scatter`, `MPI_Alltoall`, `MPI_Gather`, `MPI_Scatter`,
//! `MPI_Barrier`), the v-forms (`MPI_Allgatherv`, `MPI_Alltoallv`,
//! `MPI_Gatherv`, `MPI_Scatterv`) and nonblocking (`MPI_Iallreduce`,
//! `MPI_Ireduce`, `MPI_Ibcast`, `MPI_Iallgather`,
//! `MPI_Ireduce_scatter_block`, `MPI_Ialltoall`, `MPI_Igather`,
//! `MPI_Iscatter`).
//!
//! Blocking calls return once the data is in place. A nonblocking call on
//! host memory gets MPI's own request; on device memory routed to gpucoll a
//! shim request completed through the completion calls; a staged call runs
//! at once and returns a completed request.
//!
//! The submodules add the collectives gpucoll's engine has no form of (or
//! only some calls of), staged through `stage` with nonblocking forms that
//! complete through the shim's requests: `scan` (`MPI_Scan`, `MPI_Exscan`
//! and their I-forms), `reductions` (`MPI_Ireduce_scatter`,
//! `MPI_Reduce_local`), `alltoallw`, `vector_nb` (`MPI_Iallgatherv`,
//! `MPI_Ialltoallv`, `MPI_Igatherv`, `MPI_Iscatterv`), `neighbor` (the
//! neighbourhood collectives) and `MPI_Ibarrier` below.

mod alltoallw;
mod engine;
mod neighbor;
mod reductions;
mod scan;
mod topology;
mod vector_nb;

pub use topology::degrees;

use crate::exec;
use crate::plans::{self, AllRanks, Plan};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use std::ffi::{c_int, c_void};

/// A buffer argument as `exec` carries it (MPI never writes a send buffer).
fn mutable(buffer: *const c_void) -> *mut c_void {
    buffer.cast_mut()
}

/// Exports one collective: the blocking `$name` and, when given, the
/// nonblocking `$iname`, each taking the parameters listed, then `comm`
/// (then `request`). `plans::$plan` routes both: it gets the arguments given
/// with it, the call's name, the parameters and `comm`. The `PMPI_` calls get
/// the same arguments, except that the buffers named in `[..]` may be
/// staged copies. The blocking form also knows its `PMPI_I*` form (named
/// after `|` where there is no `$iname`), for the deadline a guarded
/// communicator's MPI-routed calls run under (`exec::blocking_or_start`).
macro_rules! collective {
    (
        $name:ident => $pmpi:ident, $iname:ident => $ipmpi:ident;
        $plan:ident $(($($with:expr),+))?, [$($buf:ident),+];
        ($($param:ident: $ty:ty),+ $(,)?)
    ) => {
        collective! {
            $name => $pmpi | $ipmpi;
            $plan $(($($with),+))?, [$($buf),+];
            ($($param: $ty),+)
        }

        #[doc = concat!("# Safety\nAs `", stringify!($iname), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $iname(
            $($param: $ty,)+
            comm: MPI_Comm,
            request: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: the program's arguments, valid as MPI requires; the
            // `PMPI_` calls get them, buffers possibly replaced by staged
            // copies of the same extent.
            unsafe {
                exec::nonblocking(
                    stringify!($iname),
                    comm,
                    [$(mutable($buf)),+],
                    request,
                    || plans::$plan($($($with,)+)? stringify!($iname), $($param,)+ comm),
                    |[$($buf),+]| mpi_sys::$ipmpi($($param,)+ comm, request),
                    |[$($buf),+]| mpi_sys::$pmpi($($param,)+ comm),
                )
            }
        }
    };
    (
        $name:ident => $pmpi:ident | $ipmpi:ident;
        $plan:ident $(($($with:expr),+))?, [$($buf:ident),+];
        ($($param:ident: $ty:ty),+ $(,)?)
    ) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($param: $ty,)+ comm: MPI_Comm) -> c_int {
            // SAFETY: the program's arguments, valid as MPI requires; the
            // `PMPI_` calls get them, buffers possibly replaced by staged
            // copies of the same extent.
            unsafe {
                exec::blocking_or_start(
                    stringify!($name),
                    comm,
                    [$(mutable($buf)),+],
                    || plans::$plan($($($with,)+)? stringify!($name), $($param,)+ comm),
                    |[$($buf),+]| mpi_sys::$pmpi($($param,)+ comm),
                    |[$($buf),+], request| mpi_sys::$ipmpi($($param,)+ comm, request),
                )
            }
        }
    };
}

collective! {
    MPI_Allreduce => PMPI_Allreduce, MPI_Iallreduce => PMPI_Iallreduce;
    allreduce, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype,
        op: MPI_Op,
    )
}

collective! {
    MPI_Reduce => PMPI_Reduce, MPI_Ireduce => PMPI_Ireduce;
    reduce, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype,
        op: MPI_Op, root: c_int,
    )
}

collective! {
    MPI_Bcast => PMPI_Bcast, MPI_Ibcast => PMPI_Ibcast;
    bcast, [buffer];
    (buffer: *mut c_void, count: c_int, datatype: MPI_Datatype, root: c_int)
}

collective! {
    MPI_Allgather => PMPI_Allgather, MPI_Iallgather => PMPI_Iallgather;
    all_ranks(AllRanks::Gather), [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype,
    )
}

collective! {
    MPI_Reduce_scatter_block => PMPI_Reduce_scatter_block,
    MPI_Ireduce_scatter_block => PMPI_Ireduce_scatter_block;
    reduce_scatter_block, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: c_int, datatype: MPI_Datatype,
        op: MPI_Op,
    )
}

collective! {
    MPI_Reduce_scatter => PMPI_Reduce_scatter | PMPI_Ireduce_scatter;
    reduce_scatter, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const c_int,
        datatype: MPI_Datatype, op: MPI_Op,
    )
}

collective! {
    MPI_Alltoall => PMPI_Alltoall, MPI_Ialltoall => PMPI_Ialltoall;
    all_ranks(AllRanks::Exchange), [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype,
    )
}

collective! {
    MPI_Gather => PMPI_Gather, MPI_Igather => PMPI_Igather;
    gather, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int,
    )
}

collective! {
    MPI_Scatter => PMPI_Scatter, MPI_Iscatter => PMPI_Iscatter;
    scatter, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int,
    )
}

collective! {
    MPI_Allgatherv => PMPI_Allgatherv | PMPI_Iallgatherv;
    allgatherv, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int,
        recvtype: MPI_Datatype,
    )
}

collective! {
    MPI_Alltoallv => PMPI_Alltoallv | PMPI_Ialltoallv;
    alltoallv, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int,
        sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int,
        rdispls: *const c_int, recvtype: MPI_Datatype,
    )
}

collective! {
    MPI_Gatherv => PMPI_Gatherv | PMPI_Igatherv;
    gatherv, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int,
        recvtype: MPI_Datatype, root: c_int,
    )
}

collective! {
    MPI_Scatterv => PMPI_Scatterv | PMPI_Iscatterv;
    scatterv, [sendbuf, recvbuf];
    (
        sendbuf: *const c_void, sendcounts: *const c_int, displs: *const c_int,
        sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, root: c_int,
    )
}

/// A barrier has no buffers: MPI's own (on a guarded communicator, under
/// the deadline, like every MPI-routed call there). It does not order the
/// shim's nonblocking requests, as MPI's barrier does not order MPI's: a
/// request still in flight completes through the completion calls.
/// gpucoll's blocking collectives have all completed when they returned.
///
/// # Safety
/// As `MPI_Barrier`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Barrier(comm: MPI_Comm) -> c_int {
    // SAFETY: no buffers; the communicator is the program's.
    unsafe {
        exec::blocking_or_start(
            "MPI_Barrier",
            comm,
            [],
            || {
                crate::route::log("MPI_Barrier", "pmpi", "no buffers");
                Plan::Pmpi
            },
            |[]| mpi_sys::PMPI_Barrier(comm),
            |[], request| mpi_sys::PMPI_Ibarrier(comm, request),
        )
    }
}

/// `MPI_Ibarrier` has no buffers: MPI's own, started at once. It orders the
/// calls, not the data: its completion says that every rank entered it,
/// nothing about the shim's device work in flight (a nonblocking gpucoll
/// collective runs on the GPU without MPI's progress, so the two cannot
/// wait for each other), and the completion calls make MPI progress while
/// they wait for that device work (`requests.rs`), so a barrier of the
/// peers completes meanwhile.
///
/// # Safety
/// As `MPI_Ibarrier`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ibarrier(comm: MPI_Comm, request: *mut MPI_Request) -> c_int {
    // SAFETY: no buffers; the communicator and `request` are the program's.
    unsafe {
        exec::nonblocking(
            "MPI_Ibarrier",
            comm,
            [],
            request,
            || {
                crate::route::log("MPI_Ibarrier", "pmpi", "no buffers");
                Plan::Pmpi
            },
            |[]| mpi_sys::PMPI_Ibarrier(comm, request),
            |[]| mpi_sys::PMPI_Barrier(comm),
        )
    }
}
