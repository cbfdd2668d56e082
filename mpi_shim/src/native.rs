//! Running a routed collective on gpucoll: MPI's argument conventions
//! (`MPI_IN_PLACE`, root-only buffers) mapped to gpucoll's raw entry points,
//! blocking or queued on the shim's stream; and the benchmark's direct
//! entry point `gpucoll_shim_allreduce_native`.

use crate::comms;
use crate::cuda::{self, CtxGuard};
use crate::errors;
use crate::handles;
use crate::requests;
use crate::route::Native;
use crate::settings::Inside;
use gpucoll::{CudaStreamRaw, Result};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use std::ffi::{c_int, c_void};

/// One collective in gpucoll's terms: in place is `send == recv`, with
/// gpucoll's in-place layouts (which are MPI's); buffers a rank does not
/// use are null.
#[derive(Clone, Copy)]
pub enum Coll {
    AllReduce {
        send: *const c_void,
        recv: *mut c_void,
    },
    Reduce {
        send: *const c_void,
        recv: *mut c_void,
        root: usize,
    },
    Bcast {
        buf: *mut c_void,
        root: usize,
    },
    AllGather {
        send: *const c_void,
        recv: *mut c_void,
    },
    ReduceScatterBlock {
        send: *const c_void,
        recv: *mut c_void,
    },
    AllToAll {
        send: *const c_void,
        recv: *mut c_void,
    },
    Gather {
        send: *const c_void,
        recv: *mut c_void,
        root: usize,
    },
    Scatter {
        send: *const c_void,
        recv: *mut c_void,
        root: usize,
    },
}

/// `sendbuf`, or `recvbuf` when it is `MPI_IN_PLACE`.
#[inline]
pub fn send_or_recv(send: *const c_void, recv: *mut c_void) -> *const c_void {
    if handles::is_in_place(send) {
        recv
    } else {
        send
    }
}

/// Run `coll` of `count` elements per rank on `n`'s communicator.
///
/// # Safety
/// The buffers are valid for the collective's lengths (the MPI caller's
/// promise) until it completed.
unsafe fn run(n: &Native, coll: Coll, count: u64, stream: Option<CudaStreamRaw>) -> Result<()> {
    let (c, t, op) = (&n.comm, n.dtype, n.op);
    // SAFETY (every arm): forwarded from this function's contract.
    unsafe {
        match coll {
            Coll::AllReduce { send, recv } => c.all_reduce_raw(send, recv, count, t, op, stream),
            Coll::Reduce { send, recv, root } => {
                c.reduce_raw(send, recv, count, t, op, root, stream)
            }
            Coll::Bcast { buf, root } => c.broadcast_raw(buf, count, t, root, stream),
            Coll::AllGather { send, recv } => c.all_gather_raw(send, recv, count, t, stream),
            Coll::ReduceScatterBlock { send, recv } => {
                c.reduce_scatter_block_raw(send, recv, count, t, op, stream)
            }
            Coll::AllToAll { send, recv } => c.all_to_all_raw(send, recv, count, t, stream),
            Coll::Gather { send, recv, root } => c.gather_raw(send, recv, count, t, root, stream),
            Coll::Scatter { send, recv, root } => c.scatter_raw(send, recv, count, t, root, stream),
        }
    }
}

/// Keep the caller's CUDA context current after the call.
fn context_guard(device: Option<i32>) -> std::result::Result<Option<CtxGuard>, String> {
    match device {
        Some(d) => CtxGuard::bind(d).map(Some),
        None => Ok(CtxGuard::save()),
    }
}

/// A blocking collective: returns when the data is in place.
///
/// # Safety
/// As for [`run`].
pub unsafe fn blocking(
    n: Native,
    call: &'static str,
    comm: MPI_Comm,
    coll: Coll,
    count: c_int,
) -> c_int {
    let _inside = Inside::enter();
    let _ctx = match context_guard(n.device) {
        Ok(g) => g,
        Err(e) => return errors::fail(comm, call, &gpucoll::Error::Backend(e)),
    };
    // The program's buffers may still be written on the legacy default
    // stream (cudaMemset, a pageable cudaMemcpy's last DMA): the shim's
    // communicators run on a stream ordered after it (comms.rs), so the
    // device waits for that work, not the host.
    // SAFETY: forwarded from this function's contract.
    match unsafe { run(&n, coll, count as u64, None) } {
        Ok(()) => 0,
        Err(e) => errors::fail(comm, call, &e),
    }
}

/// A nonblocking collective: on device memory it is queued on the shim's
/// stream and `request` completes when the stream passed it; host buffers
/// (host test mode) run at once and `request` is complete on return.
///
/// # Safety
/// As for [`run`], until the request completed; `request` is writable.
pub unsafe fn nonblocking(
    n: Native,
    call: &'static str,
    comm: MPI_Comm,
    coll: Coll,
    count: c_int,
    request: *mut MPI_Request,
) -> c_int {
    let _inside = Inside::enter();
    let _ctx = match context_guard(n.device) {
        Ok(g) => g,
        Err(e) => return errors::fail(comm, call, &gpucoll::Error::Backend(e)),
    };
    let Some(device) = n.device else {
        // Host buffers (test mode): gpucoll's host backend has no streams,
        // so the collective runs now; the request completes through the
        // completion calls like a device request.
        // SAFETY: forwarded from this function's contract.
        return match unsafe { run(&n, coll, count as u64, None) } {
            // SAFETY: `request` is writable (caller's contract).
            Ok(()) => unsafe { requests::start_pending(None, n.comm, call, request) },
            Err(e) => {
                // SAFETY: as above.
                unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
                errors::fail(comm, call, &e)
            }
        };
    };
    let queued = cuda::shim_stream(device)
        .map_err(gpucoll::Error::Backend)
        .and_then(|s| {
            // SAFETY: forwarded from this function's contract.
            unsafe { run(&n, coll, count as u64, Some(s as CudaStreamRaw))? };
            cuda::Event::record(s).map_err(gpucoll::Error::Backend)
        });
    match queued {
        // SAFETY: `request` is writable (caller's contract).
        Ok(event) => unsafe { requests::start_pending(Some(event), n.comm, call, request) },
        Err(e) => errors::fail(comm, call, &e),
    }
}

/// gpucoll's own blocking all_reduce on the communicator the shim caches
/// for `comm`, without routing: for the benchmark that compares the shim's
/// `MPI_Allreduce`, gpucoll and NCCL in one job. `MPI_IN_PLACE` works.
///
/// # Safety
/// As `MPI_Allreduce`: the buffers hold `count` elements of `datatype`.
#[no_mangle]
pub unsafe extern "C" fn gpucoll_shim_allreduce_native(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: i64,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "gpucoll_shim_allreduce_native";
    let Ok(count) = u64::try_from(count) else {
        return errors::raise(comm, mpi_sys::MPI_ERR_COUNT as c_int);
    };
    let entry = match comms::lookup(comm) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let Some(nt) = handles::native_type(datatype) else {
        return errors::raise(comm, mpi_sys::MPI_ERR_TYPE as c_int);
    };
    let Some(op) = handles::native_op(op, nt) else {
        return errors::raise(comm, mpi_sys::MPI_ERR_OP as c_int);
    };
    let send = send_or_recv(sendbuf, recvbuf);
    let device = cuda::device_of_any(&[send, recvbuf]);
    let comm_g = match entry.communicator(device) {
        Ok(c) => c,
        Err(e) => return errors::fail(comm, CALL, &e),
    };
    let _inside = Inside::enter();
    let _ctx = match context_guard(device) {
        Ok(g) => g,
        Err(e) => return errors::fail(comm, CALL, &gpucoll::Error::Backend(e)),
    };
    // SAFETY: the caller's promise on the buffers.
    match unsafe { comm_g.all_reduce_raw(send, recvbuf, count, nt.dtype, op, None) } {
        Ok(()) => 0,
        Err(e) => errors::fail(comm, CALL, &e),
    }
}
