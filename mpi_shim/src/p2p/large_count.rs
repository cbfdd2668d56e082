//! The MPI-4 large-count forms of point-to-point (`MPI_Send_c` ...), as for
//! the collectives (`crate::large_count`): Open MPI 4.1 has no `PMPI_*_c`,
//! so a count that fits a C `int` goes to the shim's C form (staged or
//! MPI's, as that decides) and a larger one is `MPI_ERR_COUNT`, raised
//! through the communicator's error handler (`MPI_COMM_WORLD`'s for the
//! matched receives, whose communicator is the message's).

use super::exports::*;
use crate::large_count::narrow;
use mpi_sys::{MPI_Comm, MPI_Count, MPI_Datatype, MPI_Message, MPI_Request, MPI_Status};
use std::ffi::{c_int, c_void};

/// Exports `$name`, taking the parameters listed (the `$count` ones as
/// `MPI_Count`) and calling the C form `$c` with the same arguments once
/// each count is narrowed on `$comm`.
macro_rules! narrowed {
    ($(
        $name:ident => $c:ident, counts [$($count:ident),+], on $comm:expr;
        ($($param:ident: $ty:ty),+ $(,)?)
    )+) => {$(
        #[doc = concat!("# Safety\nAs the MPI-4 standard requires of `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($param: $ty),+) -> c_int {
            $(
                let $count = match narrow($count, $comm) {
                    Ok(c) => c,
                    Err(code) => return code,
                };
            )+
            // SAFETY: the program's arguments, the counts narrowed
            // losslessly.
            unsafe { $c($($param),+) }
        }
    )+};
}

/// The communicator a matched message's errors go to.
fn world() -> MPI_Comm {
    // SAFETY: reading a link-time MPI constant.
    unsafe { mpi_sys::RSMPI_COMM_WORLD }
}

narrowed! {
    MPI_Send_c => MPI_Send, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm)
    MPI_Ssend_c => MPI_Ssend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm)
    MPI_Bsend_c => MPI_Bsend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm)
    MPI_Rsend_c => MPI_Rsend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm)
    MPI_Recv_c => MPI_Recv, counts [count], on comm;
    (buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int,
     comm: MPI_Comm, status: *mut MPI_Status)
    MPI_Isend_c => MPI_Isend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Issend_c => MPI_Issend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Ibsend_c => MPI_Ibsend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Irsend_c => MPI_Irsend, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Irecv_c => MPI_Irecv, counts [count], on comm;
    (buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Send_init_c => MPI_Send_init, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Bsend_init_c => MPI_Bsend_init, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Ssend_init_c => MPI_Ssend_init, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Rsend_init_c => MPI_Rsend_init, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Recv_init_c => MPI_Recv_init, counts [count], on comm;
    (buf: *const c_void, count: MPI_Count, datatype: MPI_Datatype, source: c_int, tag: c_int,
     comm: MPI_Comm, request: *mut MPI_Request)
    MPI_Sendrecv_c => MPI_Sendrecv, counts [sendcount, recvcount], on comm;
    (sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, dest: c_int,
     sendtag: c_int, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype,
     source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status)
    MPI_Sendrecv_replace_c => MPI_Sendrecv_replace, counts [count], on comm;
    (buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, dest: c_int, sendtag: c_int,
     source: c_int, recvtag: c_int, comm: MPI_Comm, status: *mut MPI_Status)
    MPI_Mrecv_c => MPI_Mrecv, counts [count], on world();
    (buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, message: *mut MPI_Message,
     status: *mut MPI_Status)
    MPI_Imrecv_c => MPI_Imrecv, counts [count], on world();
    (buf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, message: *mut MPI_Message,
     request: *mut MPI_Request)
}
