//! Running a routed collective on gpucoll: MPI's argument conventions
//! (`MPI_IN_PLACE`, root-only buffers) mapped to gpucoll's raw entry points,
//! blocking or queued on the communicator's stream (or, on host memory in
//! host test mode, started on gpucoll's host backend); and the benchmark's
//! direct entry point `gpucoll_shim_allreduce_native`.

use crate::comms::{self, CommEntry, Signature};
use crate::cuda::{self, CtxGuard, Event};
use crate::errors;
use crate::handles;
use crate::requests::{self, Work};
use crate::route::Native;
use crate::settings::Inside;
use gpucoll::{
    CollKind, Communicator, CudaStreamRaw, Datatype, MemoryKind, RawBuffer, RawRequest, Result,
};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

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
        Err(e) => {
            n.entry.note(&e);
            errors::fail(comm, call, &e)
        }
    }
}

/// A collective queued on a stream: done when the event recorded after it
/// has passed; then gpucoll's asynchronous error (a timeout the watchdog
/// found) is picked up and the communicator released.
struct DeviceWork {
    event: Event,
    comm: Mutex<Option<Communicator>>,
    entry: Arc<CommEntry>,
    call: &'static str,
}

impl Work for DeviceWork {
    fn done(&self, wait: bool, code: &AtomicI32) -> bool {
        let mut comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = comm.as_ref() else {
            return true;
        };
        let r = if wait {
            crate::progress::wait_for(&self.event).map(|()| true)
        } else {
            self.event.is_done()
        };
        match r {
            Ok(false) => return false,
            Ok(true) => {
                if let Err(e) = c.async_error() {
                    self.entry.note(&e);
                    errors::log_failure(self.call, &e.to_string());
                    code.store(errors::code_of(&e), Ordering::Relaxed);
                }
            }
            Err(e) => {
                errors::log_failure(self.call, &e);
                code.store(mpi_sys::MPI_ERR_OTHER as c_int, Ordering::Relaxed);
            }
        }
        let c = comm.take();
        let _inside = Inside::enter();
        drop(c);
        true
    }
}

/// A collective running on gpucoll's host backend (host test mode).
struct HostWork {
    request: Mutex<Option<RawRequest>>,
    entry: Arc<CommEntry>,
    call: &'static str,
}

impl Work for HostWork {
    fn done(&self, wait: bool, code: &AtomicI32) -> bool {
        let mut slot = self.request.lock().unwrap_or_else(|p| p.into_inner());
        let Some(r) = slot.as_mut() else {
            return true;
        };
        let _inside = Inside::enter();
        let result = if wait {
            slot.take().map_or(Ok(()), RawRequest::wait)
        } else {
            match r.test() {
                Ok(false) => return false,
                Ok(true) => Ok(()),
                Err(e) => Err(e),
            }
        };
        *slot = None;
        if let Err(e) = result {
            self.entry.note(&e);
            errors::log_failure(self.call, &e.to_string());
            code.store(errors::code_of(&e), Ordering::Relaxed);
        }
        true
    }
}

/// `coll` in the terms of `immediate_raw_collective` on host memory: its
/// kind, send and receive buffers, root and whether it is in place (the
/// layouts of the `*_raw` methods).
fn host_call(
    coll: Coll,
    count: u64,
    dtype: Datatype,
    rank: usize,
    size: usize,
) -> (CollKind, Option<RawBuffer>, Option<RawBuffer>, usize, bool) {
    let total = count.saturating_mul(size as u64);
    let (kind, send, recv, send_len, recv_len, root) = match coll {
        Coll::AllReduce { send, recv } => {
            (CollKind::AllReduce, send, recv, Some(count), Some(count), 0)
        }
        Coll::Reduce { send, recv, root } => {
            let r = (root == rank).then_some(count);
            (CollKind::Reduce, send, recv, Some(count), r, root)
        }
        Coll::Bcast { buf, root } => (
            CollKind::Broadcast,
            buf.cast_const(),
            buf,
            Some(count),
            Some(count),
            root,
        ),
        Coll::AllGather { send, recv } => {
            (CollKind::AllGather, send, recv, Some(count), Some(total), 0)
        }
        Coll::ReduceScatterBlock { send, recv } => (
            CollKind::ReduceScatter,
            send,
            recv,
            Some(total),
            Some(count),
            0,
        ),
        Coll::AllToAll { send, recv } => {
            (CollKind::AllToAll, send, recv, Some(total), Some(total), 0)
        }
        Coll::Gather { send, recv, root } => {
            let r = (root == rank).then_some(total);
            (CollKind::Gather, send, recv, Some(count), r, root)
        }
        Coll::Scatter { send, recv, root } => {
            let s = (root == rank).then_some(total);
            (CollKind::Scatter, send, recv, s, Some(count), root)
        }
    };
    let buf = |p: *const c_void, len: u64| RawBuffer {
        addr: p as usize as u64,
        len,
        dtype,
        memory: MemoryKind::Host,
    };
    // MPI_IN_PLACE arrived as send == recv (`send_or_recv`), as the
    // `*_raw` methods take it: a broadcast is always in place; rooted calls
    // only at the root; the gathers only with data.
    let same = std::ptr::eq(send, recv.cast_const());
    let in_place = match kind {
        CollKind::Broadcast => true,
        CollKind::Reduce | CollKind::Scatter => same && root == rank,
        CollKind::Gather => same && root == rank && count > 0,
        CollKind::AllGather => same && count > 0,
        _ => same,
    };
    if in_place {
        let len = send_len.unwrap_or(0).max(recv_len.unwrap_or(0));
        return (kind, None, Some(buf(recv, len)), root, true);
    }
    (
        kind,
        send_len.map(|n| buf(send, n)),
        recv_len.map(|n| buf(recv, n)),
        root,
        false,
    )
}

/// A nonblocking collective: on device memory it is queued on the
/// communicator's stream and `request` completes when the stream passed it;
/// host buffers (host test mode) start on gpucoll's host backend (which
/// runs them on its worker thread under `MPI_THREAD_MULTIPLE`, or at once)
/// and `request` completes when they finished.
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
    let work: Box<dyn Work> = match n.device {
        None => {
            let (kind, send, recv, root, in_place) =
                host_call(coll, count as u64, n.dtype, n.comm.rank(), n.comm.size());
            // SAFETY: the buffers stay valid until the request completed
            // (this function's contract).
            let started = unsafe {
                n.comm
                    .immediate_raw_collective(kind, send, recv, n.op, root, in_place)
            };
            match started {
                Ok(r) => Box::new(HostWork {
                    request: Mutex::new(Some(r)),
                    entry: n.entry.clone(),
                    call,
                }),
                Err(e) => {
                    n.entry.note(&e);
                    return errors::fail(comm, call, &e);
                }
            }
        }
        Some(device) => {
            let queued = n
                .entry
                .stream(device)
                .map_err(gpucoll::Error::Backend)
                .and_then(|s| {
                    // SAFETY: forwarded from this function's contract.
                    unsafe { run(&n, coll, count as u64, Some(s as CudaStreamRaw))? };
                    Event::record(s).map_err(gpucoll::Error::Backend)
                });
            match queued {
                Ok(event) => Box::new(DeviceWork {
                    event,
                    comm: Mutex::new(Some(n.comm.clone())),
                    entry: n.entry.clone(),
                    call,
                }),
                Err(e) => {
                    n.entry.note(&e);
                    return errors::fail(comm, call, &e);
                }
            }
        }
    };
    // SAFETY: `request` is writable (the caller's contract).
    unsafe { requests::start_work(work, request) }
}

errors::guarded_exports! {
    /// gpucoll's own blocking all_reduce on the communicator the shim caches
    /// for `comm`, without routing: for the benchmark that compares the shim's
    /// `MPI_Allreduce`, gpucoll and NCCL in one job. `MPI_IN_PLACE` works.
    ///
    /// # Safety
    /// As `MPI_Allreduce`: the buffers hold `count` elements of `datatype`.
    fn gpucoll_shim_allreduce_native(
        sendbuf: *const c_void,
        recvbuf: *mut c_void,
        count: i64,
        datatype: MPI_Datatype,
        op: MPI_Op,
        comm: MPI_Comm,
    ) on comm, || () => {
        // SAFETY: the caller's promise on the buffers.
        unsafe { allreduce_native(sendbuf, recvbuf, count, datatype, op, comm) }
    }
}

/// The body of `gpucoll_shim_allreduce_native`.
///
/// # Safety
/// As `MPI_Allreduce`: the buffers hold `count` elements of `datatype`.
unsafe fn allreduce_native(
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
    let sig = Signature {
        call: CALL,
        count: count as i64,
        dtype: nt.dtype.name(),
        op: op.name(),
        root: -1,
    };
    let comm_g = match entry.communicator(device, &sig) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let _inside = Inside::enter();
    let _ctx = match context_guard(device) {
        Ok(g) => g,
        Err(e) => return errors::fail(comm, CALL, &gpucoll::Error::Backend(e)),
    };
    // SAFETY: the caller's promise on the buffers.
    match unsafe { comm_g.all_reduce_raw(send, recvbuf, count, nt.dtype, op, None) } {
        Ok(()) => 0,
        Err(e) => {
            entry.note(&e);
            errors::fail(comm, CALL, &e)
        }
    }
}
