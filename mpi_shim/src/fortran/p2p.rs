//! Point-to-point from Fortran: every send and receive form the shim
//! intercepts in C, the persistent ones, `MPI_START` and `MPI_STARTALL`.
//! Each converts its handles, calls the C function (the shim's own export,
//! so device buffers are staged as from C) and stores statuses, requests
//! and matched-message handles back in Fortran form.

use std::ffi::{c_int, c_void};

use mpi_sys as ffi;

use super::handles::{
    buffer, comm, datatype, empty_status, invalid_count, invalid_request, is_status_ignore,
    request_c2f, request_f2c, set_ierror, store_status, Fint,
};

/// The C status for a Fortran status argument: `MPI_STATUS_IGNORE`, or
/// `local` (copied out by `store_status`).
fn c_status(f_status: *const Fint, local: &mut ffi::MPI_Status) -> *mut ffi::MPI_Status {
    if is_status_ignore(f_status) {
        // SAFETY: reading an immutable extern constant of mpi-sys.
        unsafe { ffi::RSMPI_STATUS_IGNORE }
    } else {
        local
    }
}

/// Stores a new request (on success) and the return code.
///
/// # Safety
/// `request` is a writable `INTEGER`; `ierror` null or one.
unsafe fn finish_request(
    code: c_int,
    c_request: ffi::MPI_Request,
    request: *mut Fint,
    ierror: *mut Fint,
) {
    // SAFETY: per the function's contract.
    unsafe {
        if code == ffi::MPI_SUCCESS as c_int {
            *request = request_c2f(c_request);
        }
        set_ierror(ierror, code);
    }
}

/// `MPI_SEND(BUF, COUNT, DATATYPE, DEST, TAG, COMM, IERROR)` and the other
/// blocking sends, each calling the C function `$c`.
macro_rules! fortran_send {
    ($($name:ident => $c:ident as $upper:literal, $lower:literal;)+) => {$(
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            buf: *mut c_void,
            count: *const Fint,
            dtype: *const Fint,
            dest: *const Fint,
            tag: *const Fint,
            communicator: *const Fint,
            ierror: *mut Fint,
        ) {
            // SAFETY: Fortran passes every scalar by reference (`ierror`
            // null or writable); the buffer is forwarded.
            unsafe {
                let code = ffi::$c(
                    buffer(buf), *count, datatype(dtype), *dest, *tag, comm(communicator),
                );
                set_ierror(ierror, code);
            }
        }

        export_symbols!($name (
            buf: *mut c_void,
            count: *const Fint,
            dtype: *const Fint,
            dest: *const Fint,
            tag: *const Fint,
            communicator: *const Fint,
            ierror: *mut Fint,
        ) as $upper, $lower, stringify!($c));
    )+};
}

fortran_send! {
    send => MPI_Send as "MPI_SEND", "mpi_send";
    ssend => MPI_Ssend as "MPI_SSEND", "mpi_ssend";
    bsend => MPI_Bsend as "MPI_BSEND", "mpi_bsend";
    rsend => MPI_Rsend as "MPI_RSEND", "mpi_rsend";
}

/// `MPI_ISEND(BUF, COUNT, DATATYPE, DEST, TAG, COMM, REQUEST, IERROR)` and
/// every other call of that shape (nonblocking sends and receive, the
/// persistent forms), each calling the C function `$c`.
macro_rules! fortran_with_request {
    ($($name:ident => $c:ident as $upper:literal, $lower:literal;)+) => {$(
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            buf: *mut c_void,
            count: *const Fint,
            dtype: *const Fint,
            peer: *const Fint,
            tag: *const Fint,
            communicator: *const Fint,
            request: *mut Fint,
            ierror: *mut Fint,
        ) {
            // SAFETY: Fortran passes every scalar by reference (`request`
            // writable, `ierror` null or writable); the buffer is forwarded.
            unsafe {
                let mut c_request = ffi::RSMPI_REQUEST_NULL;
                let code = ffi::$c(
                    buffer(buf), *count, datatype(dtype), *peer, *tag, comm(communicator),
                    &mut c_request,
                );
                finish_request(code, c_request, request, ierror);
            }
        }

        export_symbols!($name (
            buf: *mut c_void,
            count: *const Fint,
            dtype: *const Fint,
            peer: *const Fint,
            tag: *const Fint,
            communicator: *const Fint,
            request: *mut Fint,
            ierror: *mut Fint,
        ) as $upper, $lower, stringify!($c));
    )+};
}

fortran_with_request! {
    isend => MPI_Isend as "MPI_ISEND", "mpi_isend";
    issend => MPI_Issend as "MPI_ISSEND", "mpi_issend";
    ibsend => MPI_Ibsend as "MPI_IBSEND", "mpi_ibsend";
    irsend => MPI_Irsend as "MPI_IRSEND", "mpi_irsend";
    irecv => MPI_Irecv as "MPI_IRECV", "mpi_irecv";
    send_init => MPI_Send_init as "MPI_SEND_INIT", "mpi_send_init";
    bsend_init => MPI_Bsend_init as "MPI_BSEND_INIT", "mpi_bsend_init";
    ssend_init => MPI_Ssend_init as "MPI_SSEND_INIT", "mpi_ssend_init";
    rsend_init => MPI_Rsend_init as "MPI_RSEND_INIT", "mpi_rsend_init";
    recv_init => MPI_Recv_init as "MPI_RECV_INIT", "mpi_recv_init";
}

fortran_binding! {
    /// `MPI_RECV(BUF, COUNT, DATATYPE, SOURCE, TAG, COMM, STATUS, IERROR)`.
    fn recv(
        buf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        source: *const Fint,
        tag: *const Fint,
        communicator: *const Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_RECV", "mpi_recv", "MPI_Recv" {
        // SAFETY: the Fortran arguments of MPI_RECV, each by reference;
        // `status` is MPI_STATUS_IGNORE or MPI_STATUS_SIZE integers.
        unsafe {
            let mut local = empty_status();
            let code = ffi::MPI_Recv(
                buffer(buf), *count, datatype(dtype), *source, *tag, comm(communicator),
                c_status(status, &mut local),
            );
            store_status(&local, status);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_SENDRECV(SENDBUF, SENDCOUNT, SENDTYPE, DEST, SENDTAG, RECVBUF,
    /// RECVCOUNT, RECVTYPE, SOURCE, RECVTAG, COMM, STATUS, IERROR)`.
    fn sendrecv(
        sendbuf: *mut c_void,
        sendcount: *const Fint,
        sendtype: *const Fint,
        dest: *const Fint,
        sendtag: *const Fint,
        recvbuf: *mut c_void,
        recvcount: *const Fint,
        recvtype: *const Fint,
        source: *const Fint,
        recvtag: *const Fint,
        communicator: *const Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_SENDRECV", "mpi_sendrecv", "MPI_Sendrecv" {
        // SAFETY: the Fortran arguments of MPI_SENDRECV, as for `recv`.
        unsafe {
            let mut local = empty_status();
            let code = ffi::MPI_Sendrecv(
                buffer(sendbuf), *sendcount, datatype(sendtype), *dest, *sendtag,
                buffer(recvbuf), *recvcount, datatype(recvtype), *source, *recvtag,
                comm(communicator), c_status(status, &mut local),
            );
            store_status(&local, status);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_SENDRECV_REPLACE(BUF, COUNT, DATATYPE, DEST, SENDTAG, SOURCE,
    /// RECVTAG, COMM, STATUS, IERROR)`.
    fn sendrecv_replace(
        buf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        dest: *const Fint,
        sendtag: *const Fint,
        source: *const Fint,
        recvtag: *const Fint,
        communicator: *const Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_SENDRECV_REPLACE", "mpi_sendrecv_replace", "MPI_Sendrecv_replace" {
        // SAFETY: the Fortran arguments of MPI_SENDRECV_REPLACE, as for `recv`.
        unsafe {
            let mut local = empty_status();
            let code = ffi::MPI_Sendrecv_replace(
                buffer(buf), *count, datatype(dtype), *dest, *sendtag, *source, *recvtag,
                comm(communicator), c_status(status, &mut local),
            );
            store_status(&local, status);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_MRECV(BUF, COUNT, DATATYPE, MESSAGE, STATUS, IERROR)`: the
    /// message handle becomes `MPI_MESSAGE_NULL`.
    fn mrecv(
        buf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        message: *mut Fint,
        status: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_MRECV", "mpi_mrecv", "MPI_Mrecv" {
        // SAFETY: the Fortran arguments of MPI_MRECV, as for `recv`;
        // `message` a writable INTEGER.
        unsafe {
            let mut local = empty_status();
            let mut c_message = ffi::PMPI_Message_f2c(*message);
            let code = ffi::MPI_Mrecv(
                buffer(buf), *count, datatype(dtype), &mut c_message,
                c_status(status, &mut local),
            );
            *message = ffi::PMPI_Message_c2f(c_message);
            store_status(&local, status);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_IMRECV(BUF, COUNT, DATATYPE, MESSAGE, REQUEST, IERROR)`.
    fn imrecv(
        buf: *mut c_void,
        count: *const Fint,
        dtype: *const Fint,
        message: *mut Fint,
        request: *mut Fint,
        ierror: *mut Fint,
    ) as "MPI_IMRECV", "mpi_imrecv", "MPI_Imrecv" {
        // SAFETY: the Fortran arguments of MPI_IMRECV, as for `mrecv`.
        unsafe {
            let mut c_message = ffi::PMPI_Message_f2c(*message);
            let mut c_request = ffi::RSMPI_REQUEST_NULL;
            let code = ffi::MPI_Imrecv(
                buffer(buf), *count, datatype(dtype), &mut c_message, &mut c_request,
            );
            *message = ffi::PMPI_Message_c2f(c_message);
            finish_request(code, c_request, request, ierror);
        }
    }
}

fortran_binding! {
    /// `MPI_START(REQUEST, IERROR)`.
    fn start(request: *mut Fint, ierror: *mut Fint) as "MPI_START", "mpi_start", "MPI_Start" {
        // SAFETY: `request` a writable INTEGER, `ierror` null or one.
        unsafe {
            let Some(mut c_request) = request_f2c(*request) else {
                return set_ierror(ierror, invalid_request());
            };
            let code = ffi::MPI_Start(&mut c_request);
            *request = request_c2f(c_request);
            set_ierror(ierror, code);
        }
    }
}

fortran_binding! {
    /// `MPI_STARTALL(COUNT, ARRAY_OF_REQUESTS, IERROR)`.
    fn startall(count: *const Fint, requests: *mut Fint, ierror: *mut Fint)
        as "MPI_STARTALL", "mpi_startall", "MPI_Startall"
    {
        // SAFETY: `count` an INTEGER, `requests` that many INTEGERs,
        // `ierror` null or writable.
        unsafe {
            let Ok(n) = usize::try_from(*count) else {
                return set_ierror(ierror, invalid_count());
            };
            let fortran = if n == 0 {
                &mut [][..]
            } else {
                std::slice::from_raw_parts_mut(requests, n)
            };
            let c: Option<Vec<ffi::MPI_Request>> =
                fortran.iter().map(|&h| request_f2c(h)).collect();
            let Some(mut c) = c else {
                return set_ierror(ierror, invalid_request());
            };
            let code = ffi::MPI_Startall(*count, c.as_mut_ptr());
            for (f, r) in fortran.iter_mut().zip(&c) {
                *f = request_c2f(*r);
            }
            set_ierror(ierror, code);
        }
    }
}
