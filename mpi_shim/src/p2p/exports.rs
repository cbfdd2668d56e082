//! The C entry points of point-to-point: each stages its device buffers
//! (`p2p::enter`/`leave`, `p2p::blocking_*`, `p2p::nonblocking` or
//! `persistent::init`) and makes the `PMPI_` call on the addresses it gets.
//! Probes (`MPI_Probe`, `MPI_Iprobe`, `MPI_Mprobe`, `MPI_Improbe`) touch no
//! buffer and stay MPI's own.

use super::persistent;
use super::{
    back_of, blocking_recv, blocking_send, empty_status, enter, leave, nonblocking, status_target,
    Back, Dir,
};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Message, MPI_Request, MPI_Status};
use std::ffi::{c_int, c_void};

/// Exports blocking sends: `(buf, count, datatype, dest, tag, comm)`.
macro_rules! blocking_send {
    ($($name:ident => $pmpi:ident;)+) => {$(
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buf: *const c_void,
            count: c_int,
            datatype: MPI_Datatype,
            dest: c_int,
            tag: c_int,
            comm: MPI_Comm,
        ) -> c_int {
            blocking_send(stringify!($name), buf, count.into(), datatype, dest, comm, |p| {
                // SAFETY: the program's arguments, the buffer possibly
                // replaced by a host copy of the same span.
                unsafe { mpi_sys::$pmpi(p, count, datatype, dest, tag, comm) }
            })
        }
    )+};
}

blocking_send! {
    MPI_Send => PMPI_Send;
    MPI_Ssend => PMPI_Ssend;
    MPI_Bsend => PMPI_Bsend;
    MPI_Rsend => PMPI_Rsend;
}

/// Exports nonblocking sends: `(buf, count, datatype, dest, tag, comm, request)`.
macro_rules! nonblocking_send {
    ($($name:ident => $pmpi:ident;)+) => {$(
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buf: *const c_void,
            count: c_int,
            datatype: MPI_Datatype,
            dest: c_int,
            tag: c_int,
            comm: MPI_Comm,
            request: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: the program's arguments (MPI's contract); the buffer
            // possibly replaced by a host copy of the same span.
            unsafe {
                nonblocking(
                    stringify!($name), buf, count.into(), datatype, dest, comm, Dir::Send, request,
                    |p, r| mpi_sys::$pmpi(p, count, datatype, dest, tag, comm, r),
                )
            }
        }
    )+};
}

nonblocking_send! {
    MPI_Isend => PMPI_Isend;
    MPI_Issend => PMPI_Issend;
    MPI_Ibsend => PMPI_Ibsend;
    MPI_Irsend => PMPI_Irsend;
}

/// # Safety
/// As `MPI_Recv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    blocking_recv(
        "MPI_Recv",
        buf,
        count.into(),
        datatype,
        source,
        comm,
        Dir::Recv,
        status,
        |p, st| {
            // SAFETY: as for the sends.
            unsafe { mpi_sys::PMPI_Recv(p, count, datatype, source, tag, comm, st) }
        },
    )
}

/// # Safety
/// As `MPI_Irecv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: as for the sends.
    unsafe {
        nonblocking(
            "MPI_Irecv",
            buf,
            count.into(),
            datatype,
            source,
            comm,
            Dir::Recv,
            request,
            |p, r| mpi_sys::PMPI_Irecv(p, count, datatype, source, tag, comm, r),
        )
    }
}

/// The communicator a matched message arrived on is not known here; errors
/// of the staging itself go to `MPI_COMM_WORLD`'s handler.
fn message_comm() -> MPI_Comm {
    // SAFETY: reading a link-time MPI constant.
    unsafe { mpi_sys::RSMPI_COMM_WORLD }
}

/// Not `MPI_PROC_NULL`: a matched message has a sender (or is
/// `MPI_MESSAGE_NO_PROC`, which MPI handles on the staged copy alike).
const MATCHED: c_int = 0;

/// # Safety
/// As `MPI_Mrecv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Mrecv(
    buf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    message: *mut MPI_Message,
    status: *mut MPI_Status,
) -> c_int {
    let comm = message_comm();
    blocking_recv(
        "MPI_Mrecv",
        buf,
        count.into(),
        datatype,
        MATCHED,
        comm,
        Dir::Recv,
        status,
        |p, st| {
            // SAFETY: as for the sends.
            unsafe { mpi_sys::PMPI_Mrecv(p, count, datatype, message, st) }
        },
    )
}

/// # Safety
/// As `MPI_Imrecv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Imrecv(
    buf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    message: *mut MPI_Message,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: as for the sends.
    unsafe {
        nonblocking(
            "MPI_Imrecv",
            buf,
            count.into(),
            datatype,
            MATCHED,
            message_comm(),
            Dir::Recv,
            request,
            |p, r| mpi_sys::PMPI_Imrecv(p, count, datatype, message, r),
        )
    }
}

/// # Safety
/// As `MPI_Sendrecv`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    const CALL: &str = "MPI_Sendrecv";
    crate::errors::guarded(
        CALL,
        comm,
        || (),
        || {
            crate::settings::maybe_panic(CALL);
            let (sp, sheld) = match enter(
                CALL,
                sendbuf,
                sendcount.into(),
                sendtype,
                dest,
                comm,
                Dir::Send,
            ) {
                Ok(x) => x,
                Err(code) => return code,
            };
            let (rp, rheld) = match enter(
                CALL,
                recvbuf,
                recvcount.into(),
                recvtype,
                source,
                comm,
                Dir::Recv,
            ) {
                Ok(x) => x,
                Err(code) => {
                    leave(CALL, comm, sheld, Back::Nothing);
                    return code;
                }
            };
            let mut local = empty_status();
            let target = status_target(status, &mut local);
            // SAFETY: as for the sends.
            let rc = unsafe {
                mpi_sys::PMPI_Sendrecv(
                    sp, sendcount, sendtype, dest, sendtag, rp, recvcount, recvtype, source,
                    recvtag, comm, target,
                )
            };
            // SAFETY: MPI wrote the status (the program's or `local`).
            let back = back_of(&rheld, rc, unsafe { &*target });
            let u1 = leave(CALL, comm, sheld, Back::Nothing);
            let u2 = leave(CALL, comm, rheld, back);
            super::first_error(&[rc, u1, u2])
        },
    )
}

/// # Safety
/// As `MPI_Sendrecv_replace`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv_replace(
    buf: *mut c_void,
    count: c_int,
    datatype: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    // The buffer is sent and received: PROC_NULL on one side only still
    // moves data on the other, so stage unless both are PROC_NULL.
    // SAFETY: reading a link-time MPI constant.
    let peer = if dest == unsafe { mpi_sys::RSMPI_PROC_NULL } {
        source
    } else {
        dest
    };
    let call = "MPI_Sendrecv_replace";
    blocking_recv(
        call,
        buf,
        count.into(),
        datatype,
        peer,
        comm,
        Dir::Both,
        status,
        |p, st| {
            // SAFETY: as for the sends.
            unsafe {
                mpi_sys::PMPI_Sendrecv_replace(
                    p, count, datatype, dest, sendtag, source, recvtag, comm, st,
                )
            }
        },
    )
}

/// Exports the persistent forms: `(buf, count, datatype, peer, tag, comm,
/// request)`, each moving the buffer's bytes `$dir`.
macro_rules! persistent_init {
    ($($name:ident => $pmpi:ident, $dir:ident;)+) => {$(
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buf: *const c_void,
            count: c_int,
            datatype: MPI_Datatype,
            peer: c_int,
            tag: c_int,
            comm: MPI_Comm,
            request: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: the program's arguments (MPI's contract); the buffer
            // possibly replaced by a host copy of the same span that lives
            // as long as the request.
            unsafe {
                persistent::init(
                    stringify!($name), buf, count.into(), datatype, peer, comm, Dir::$dir,
                    request,
                    |p, r| mpi_sys::$pmpi(p, count, datatype, peer, tag, comm, r),
                )
            }
        }
    )+};
}

persistent_init! {
    MPI_Send_init => PMPI_Send_init, Send;
    MPI_Bsend_init => PMPI_Bsend_init, Send;
    MPI_Ssend_init => PMPI_Ssend_init, Send;
    MPI_Rsend_init => PMPI_Rsend_init, Send;
    MPI_Recv_init => PMPI_Recv_init, Recv;
}

/// # Safety
/// As `MPI_Start`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Start(request: *mut MPI_Request) -> c_int {
    crate::errors::guarded(
        "MPI_Start",
        crate::errors::world(),
        || (),
        || {
            // SAFETY: the program's argument.
            unsafe { persistent::start(request) }
        },
    )
}

/// # Safety
/// As `MPI_Startall`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Startall(count: c_int, requests: *mut MPI_Request) -> c_int {
    crate::errors::guarded(
        "MPI_Startall",
        crate::errors::world(),
        || (),
        || {
            // SAFETY: the program's arguments.
            unsafe { persistent::start_all(count, requests) }
        },
    )
}
