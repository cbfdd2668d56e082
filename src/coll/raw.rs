//! Raw device-pointer entry points, optionally on the caller's CUDA stream:
//! for the MPI shim and for programs that use other CUDA libraries (their
//! own allocators, streams and graphs), in the style of NCCL.
//!
//! Every collective has one `*_raw` method on [`Communicator`]. Buffers are
//! untyped addresses with an element count and a [`Datatype`]; `count` is
//! the per-rank block as everywhere in gpucoll (see the README's table).
//! In-place calls pass the same address as send and receive buffer, with the
//! `MPI_IN_PLACE` layouts of the typed `*_in_place` methods; all_gather and
//! gather also accept NCCL's layout (send = this rank's block inside the
//! receive buffer).
//!
//! # Streams
//!
//! * `stream = None`: the call blocks until the collective completed, like
//!   the typed methods. Host pointers are accepted (the CUDA backend stages
//!   them through device memory); device pointers need the CUDA backend.
//!   The collective runs on the backend's own stream, which does not wait
//!   for the legacy default stream unless `GPUCOLL_LEGACY_STREAM_ORDER=1`:
//!   a `cudaMemcpy` from pageable host memory returns once the data is
//!   staged, before its DMA into device memory finished, so synchronize it
//!   (`cudaStreamSynchronize(0)`) before the call. Any memory of the GPU
//!   works: `cudaMalloc`, managed, `cudaMallocAsync` pools, VMM mappings.
//! * `stream = Some(s)` (CUDA backend only): the collective is queued on the
//!   caller's stream `s` (a `CUstream`/`cudaStream_t` of the communicator's
//!   GPU, primary context; the legacy default stream `0` is allowed) and the
//!   call returns once it is queued. It runs after the work queued on `s`
//!   before it, and work queued on `s` afterwards sees its result. Every
//!   buffer must be device memory of the communicator's GPU. The
//!   communicator orders its own collectives across streams (a collective
//!   on another stream waits, on the device, for the previous one).
//!   A background watchdog enforces `GPUCOLL_TIMEOUT` from the moment the
//!   stream reaches the collective: on a timeout it raises the abort word
//!   the kernels poll (they leave, the stream moves on, the results are
//!   undefined) and fails the communicator; the next call (or
//!   [`Communicator::async_error`]) returns the error (`Timeout`,
//!   `PeerFailed`, ...), every call after that `CommunicatorFailed`.
//!   The host backend rejects streams with `Error::InvalidUsage`.
//!
//! # CUDA graphs
//!
//! A collective queued on a stream that is being captured
//! (`cuStreamBeginCapture`) becomes part of the graph and runs at every
//! replay. Capture does no host waits and queries no events. What the
//! captured kernels read (step tables and their pinned staging, scratch
//! memory) is kept unchanged for the communicator's lifetime, so replays
//! are valid until the communicator is dropped (replaying afterwards is
//! undefined behaviour). Host buffers are refused. Every rank must capture
//! the same collectives in the same order, and replay them in the same
//! order relative to its other collectives on this communicator; keeping a
//! replay from running concurrently with the communicator's other
//! collectives (e.g. by replaying on the stream the communicator's other
//! stream work uses, or synchronizing before a blocking call) is the
//! caller's job. Replays are not watched by the timeout (the backend cannot
//! see them); [`Communicator::abort`] still makes their kernels leave.
//!
//! # Safety contract (every `*_raw` method)
//!
//! * Each non-null pointer addresses memory valid for its stated length
//!   (`count` or `count × size` elements of `dtype`, per collective):
//!   readable for send buffers, writable for receive buffers. With a
//!   stream, it is device memory of this communicator's GPU usable from
//!   its primary context (what the CUDA runtime allocates); without one,
//!   host memory or such device memory.
//! * The memory stays allocated and is not written (send) or accessed
//!   (receive) by anything else until the collective completed: when the
//!   call returns without a stream; on the stream with one (after the
//!   stream work queued before the next dependent operation); and, when
//!   captured, during every replay of the graph.
//! * Send and receive buffers do not overlap except as the in-place layout.
//! * The stream is a live stream of this communicator's GPU's primary
//!   context, and outlives the queued work.
//!
//! What can be checked is checked and reported as an `Error` (never a
//! panic): null pointers with a nonzero count, misaligned addresses, the
//! memory kind and GPU of each buffer (`memory_kind_of`), device buffers
//! that run past the end of their CUDA allocation into memory that is not
//! device memory of the same GPU, lengths, datatype and op, the
//! stream's context and capture state. These errors leave the communicator
//! usable.
//!
//! # Example
//!
//! Blocking raw calls accept host memory on either backend:
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! # let universe = gpucoll::initialize()?; let world = universe.world()?;
//! let send = vec![world.rank() as f64; 1000];
//! let mut recv = vec![0f64; 1000];
//! // SAFETY: both vectors hold 1000 f64, do not overlap, and outlive the
//! // blocking call.
//! unsafe {
//!     world.all_reduce_raw(
//!         send.as_ptr().cast(), recv.as_mut_ptr().cast(), 1000, Datatype::F64,
//!         ReduceOp::Max, None,
//!     )?;
//! }
//! assert_eq!(recv[0], (world.size() - 1) as f64);
//! # Ok::<(), gpucoll::Error>(())
//! ```

use super::check::Args;
use crate::buffer::{MemoryKind, RawBuffer};
use crate::comm::Communicator;
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::CollKind;
use std::ffi::c_void;

/// A caller's CUDA stream handle (`CUstream` / `cudaStream_t`); null is the
/// legacy default stream.
///
/// The handle a CUDA library hands out (`CudaStream::raw`, cudarc's
/// `cu_stream()`, a `cudaStream_t` from C) is passed as is:
///
/// ```no_run
/// use gpucoll::{Communicator, CudaStreamRaw, Datatype, ReduceOp};
///
/// /// Queue the sum of `n` f32 gradients at `grads` (device memory of the
/// /// communicator's GPU) on the training loop's stream.
/// ///
/// /// # Safety
/// /// `grads` holds `n` f32 and stays allocated until the stream ran the call.
/// unsafe fn sum_on_stream(
///     comm: &Communicator,
///     grads: *mut std::ffi::c_void,
///     n: u64,
///     stream: CudaStreamRaw,
/// ) -> gpucoll::Result<()> {
///     // SAFETY: the caller's promise; in place, so send == recv.
///     unsafe { comm.all_reduce_raw(grads, grads, n, Datatype::F32, ReduceOp::Sum, Some(stream)) }
/// }
/// ```
pub type CudaStreamRaw = *mut c_void;

/// Where the memory at `addr` (of `bytes`) lives; an error for device
/// memory that ends before `addr + bytes`: the buffer runs past its CUDA
/// allocation and its last byte is not device memory of the same GPU (a
/// buffer over several contiguous mappings, as virtual-memory allocators
/// make, passes; one that overruns into a neighbouring allocation cannot be
/// told apart).
pub(super) fn classify(addr: u64, bytes: u64, what: &str) -> Result<MemoryKind> {
    #[cfg(feature = "cuda")]
    {
        use crate::backend::cuda::{allocation_range, memory_kind_of};
        let kind = memory_kind_of(addr);
        if let MemoryKind::Device { .. } = kind {
            if let Some((start, len)) = allocation_range(addr) {
                let end = start.saturating_add(len);
                let last = addr.saturating_add(bytes.saturating_sub(1));
                if addr.saturating_add(bytes) > end && memory_kind_of(last) != kind {
                    return Err(Error::InvalidUsage(format!(
                        "the {what} buffer ({bytes} bytes at {addr:#x}) runs past the end of \
                         its CUDA allocation ({len} bytes at {start:#x})"
                    )));
                }
            }
        }
        Ok(kind)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (addr, bytes, what);
        Ok(MemoryKind::Host)
    }
}

/// Build and check one raw buffer of `len` elements.
fn buffer(
    ptr: *const c_void,
    len: u64,
    dtype: Datatype,
    what: &'static str,
    on_stream: bool,
) -> Result<RawBuffer> {
    let addr = ptr as usize as u64;
    let esize = dtype.size() as u64;
    let bytes = len.checked_mul(esize).ok_or(Error::CountTooLarge(len))?;
    if len == 0 {
        return Ok(RawBuffer {
            addr,
            len,
            dtype,
            memory: MemoryKind::Host,
        });
    }
    if addr == 0 {
        return Err(Error::InvalidUsage(format!(
            "the {what} buffer is a null pointer but holds {len} elements"
        )));
    }
    if addr % esize != 0 {
        return Err(Error::InvalidUsage(format!(
            "the {what} buffer at {addr:#x} is not aligned to its {esize}-byte elements ({dtype})"
        )));
    }
    let memory = classify(addr, bytes, what)?;
    if on_stream && memory == MemoryKind::Host {
        return Err(Error::WrongMemory(format!(
            "the {what} buffer at {addr:#x} is host memory; collectives queued on a CUDA \
             stream need device memory of the communicator's GPU"
        )));
    }
    Ok(RawBuffer {
        addr,
        len,
        dtype,
        memory,
    })
}

/// One buffer of a point-to-point call on raw pointers (`crate::p2p`),
/// checked as the collectives' are (no stream: host or device memory).
pub(crate) fn checked_buffer(
    comm: &Communicator,
    ptr: *const c_void,
    count: u64,
    dtype: Datatype,
    what: &'static str,
) -> Result<RawBuffer> {
    let on_stream = comm.raw_mode(false);
    buffer(ptr, count, dtype, what, on_stream)
}

/// The buffers of one call: in place (`recv`, holding the larger of the two
/// lengths), or separate; a side whose length is `None` does not exist on
/// this rank (a non-root's receive buffer of reduce, say).
fn layout(
    in_place: bool,
    send: *const c_void,
    send_len: Option<u64>,
    recv: *mut c_void,
    recv_len: Option<u64>,
    dtype: Datatype,
    on_stream: bool,
) -> Result<Args> {
    if in_place {
        let len = send_len.unwrap_or(0).max(recv_len.unwrap_or(0));
        return Ok(Args::InPlace(buffer(
            recv, len, dtype, "in-place", on_stream,
        )?));
    }
    Ok(Args::Separate {
        send: send_len
            .map(|n| buffer(send, n, dtype, "send", on_stream))
            .transpose()?,
        recv: recv_len
            .map(|n| buffer(recv, n, dtype, "receive", on_stream))
            .transpose()?,
    })
}

fn times(count: u64, size: usize) -> Result<u64> {
    count
        .checked_mul(size as u64)
        .ok_or(Error::CountTooLarge(count))
}

/// Whether `send` is the block `block` (of `count` elements) of `recv`.
fn is_block_of(
    send: *const c_void,
    recv: *const c_void,
    block: usize,
    count: u64,
    dtype: Datatype,
) -> bool {
    let off = (block as u64)
        .checked_mul(count)
        .and_then(|e| e.checked_mul(dtype.size() as u64));
    match off {
        Some(off) => (recv as usize as u64).checked_add(off) == Some(send as usize as u64),
        None => false,
    }
}

impl Communicator {
    /// Make the communicator's GPU context current on this thread (the
    /// driver classifies pointers in the current context), and pass
    /// `on_stream` through.
    fn raw_mode(&self, on_stream: bool) -> bool {
        #[cfg(feature = "cuda")]
        if let Some(d) = self.device() {
            if let Err(e) = crate::backend::cuda::bind(d) {
                tracing::debug!("binding GPU {d} before classifying pointers failed: {e}");
            }
        }
        on_stream
    }

    /// Check the arguments, then run (no stream) or queue (stream) one call.
    pub(super) fn raw_call(
        &self,
        kind: CollKind,
        args: Args,
        op: ReduceOp,
        root: usize,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let call = self.prepare(kind, args, op, root)?;
        match stream {
            None => self.run_blocking(&[call]),
            Some(s) => {
                let inner = self.inner_checked()?;
                // SAFETY: the caller of the `*_raw` method guarantees the
                // buffers stay valid until the work completed on the stream
                // (see the module's safety contract).
                unsafe { inner.engine.enqueue(&inner.mpi, &[call], s as usize as u64) }
            }
        }
    }

    /// `MPI_Allreduce` / `ncclAllReduce` on raw pointers: `send` and `recv`
    /// hold `count` elements; `send == recv` works in place.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        op: ReduceOp,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let in_place = std::ptr::eq(send, recv);
        let args = layout(in_place, send, Some(count), recv, Some(count), dtype, s)?;
        self.raw_call(CollKind::AllReduce, args, op, 0, stream)
    }

    /// `MPI_Reduce` on raw pointers: every rank's `send` (`count` elements)
    /// is combined into the root's `recv` (`count`; ignored elsewhere, may
    /// be null). On the root, `send == recv` works in place.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        op: ReduceOp,
        root: usize,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let is_root = root == self.rank();
        let in_place = is_root && std::ptr::eq(send, recv);
        let recv_len = is_root.then_some(count);
        let args = layout(in_place, send, Some(count), recv, recv_len, dtype, s)?;
        self.raw_call(CollKind::Reduce, args, op, root, stream)
    }

    /// `MPI_Bcast` on a raw pointer: `buf` (`count` elements) of the root
    /// is copied into `buf` of every rank.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn broadcast_raw(
        &self,
        buf: *mut c_void,
        count: u64,
        dtype: Datatype,
        root: usize,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let b = buffer(
            buf,
            count,
            dtype,
            "broadcast",
            self.raw_mode(stream.is_some()),
        )?;
        self.raw_call(
            CollKind::Broadcast,
            Args::InPlace(b),
            ReduceOp::Sum,
            root,
            stream,
        )
    }

    /// `MPI_Allgather` on raw pointers: `recv` (`count × size` elements)
    /// receives every rank's `send` (`count`) in rank order. In place:
    /// `send == recv` (this rank's block already at `recv[rank*count..]`) or
    /// `send` pointing at that block (NCCL's layout).
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn all_gather_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let total = times(count, self.size())?;
        let recv_c = recv as *const c_void;
        let in_place =
            count > 0 && (send == recv_c || is_block_of(send, recv_c, self.rank(), count, dtype));
        let args = layout(in_place, send, Some(count), recv, Some(total), dtype, s)?;
        self.raw_call(CollKind::AllGather, args, ReduceOp::Sum, 0, stream)
    }

    /// `MPI_Reduce_scatter_block` on raw pointers: `send` holds `count ×
    /// size` elements; rank r receives in `recv` (`count`) the reduction of
    /// every rank's block r. In place: `send == recv` (result in the first
    /// `count` elements).
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter_block_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        op: ReduceOp,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let total = times(count, self.size())?;
        let in_place = std::ptr::eq(send, recv);
        let args = layout(in_place, send, Some(total), recv, Some(count), dtype, s)?;
        self.raw_call(CollKind::ReduceScatter, args, op, 0, stream)
    }

    /// `MPI_Alltoall` on raw pointers: block j (`count` elements) of `send`
    /// goes to rank j, which stores it as block i (this rank) of `recv`;
    /// both hold `count × size` elements. `send == recv` works in place.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn all_to_all_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let total = times(count, self.size())?;
        let in_place = std::ptr::eq(send, recv);
        let args = layout(in_place, send, Some(total), recv, Some(total), dtype, s)?;
        self.raw_call(CollKind::AllToAll, args, ReduceOp::Sum, 0, stream)
    }

    /// `MPI_Gather` on raw pointers: every rank's `send` (`count` elements)
    /// lands as its block of the root's `recv` (`count × size`; ignored
    /// elsewhere, may be null). In place on the root: `send == recv` (its
    /// block already at `recv[root*count..]`) or `send` pointing at that
    /// block.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        root: usize,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let is_root = root == self.rank();
        let total = times(count, self.size())?;
        let recv_c = recv as *const c_void;
        let in_place = is_root
            && count > 0
            && (send == recv_c || is_block_of(send, recv_c, root, count, dtype));
        let recv_len = is_root.then_some(total);
        let args = layout(in_place, send, Some(count), recv, recv_len, dtype, s)?;
        self.raw_call(CollKind::Gather, args, ReduceOp::Sum, root, stream)
    }

    /// `MPI_Scatter` on raw pointers: block r (`count` elements) of the
    /// root's `send` (`count × size`; ignored elsewhere, may be null) lands
    /// in `recv` (`count`) of rank r. In place on the root: `send == recv`
    /// (its own block stays at `send[root*count..]`).
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scatter_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        root: usize,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let is_root = root == self.rank();
        let total = times(count, self.size())?;
        let in_place = is_root && std::ptr::eq(send, recv);
        let send_len = is_root.then_some(total);
        let args = layout(in_place, send, send_len, recv, Some(count), dtype, s)?;
        self.raw_call(CollKind::Scatter, args, ReduceOp::Sum, root, stream)
    }

    /// `MPI_Scan` on raw pointers: `recv` (`count` elements) of rank r
    /// receives the reduction of `send` (`count`) over ranks 0..=r;
    /// `send == recv` works in place (MPI_IN_PLACE). `Avg` is refused
    /// (`Error::InvalidOp`), see [`Communicator::scan_into`].
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scan_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        op: ReduceOp,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let in_place = std::ptr::eq(send, recv);
        let args = layout(in_place, send, Some(count), recv, Some(count), dtype, s)?;
        self.raw_call(CollKind::Scan, args, op, 0, stream)
    }

    /// `MPI_Exscan` on raw pointers: `recv` (`count` elements) of rank
    /// r > 0 receives the reduction of `send` (`count`) over ranks 0..r;
    /// rank 0's `recv` is never written (MPI leaves it undefined and not
    /// significant: it may be null there). `send == recv` works in place
    /// (MPI_IN_PLACE).
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn exclusive_scan_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: u64,
        dtype: Datatype,
        op: ReduceOp,
        stream: Option<CudaStreamRaw>,
    ) -> Result<()> {
        let s = self.raw_mode(stream.is_some());
        let in_place = std::ptr::eq(send, recv);
        let recv_len = (self.rank() != 0 || !recv.is_null()).then_some(count);
        let args = layout(in_place, send, Some(count), recv, recv_len, dtype, s)?;
        self.raw_call(CollKind::ExclusiveScan, args, op, 0, stream)
    }

    /// The communicator's failure, if it has one: an error of a collective
    /// queued on a CUDA stream that the watchdog found (a timeout, a peer's
    /// failure, a protocol mismatch), a peer process of this node that died
    /// while collectives captured into a CUDA graph may be replaying (looked
    /// at every 100 ms once the communicator captured work), or
    /// `CommunicatorFailed` after any fatal error (like
    /// `ncclCommGetAsyncError`). `Ok(())` while healthy.
    pub fn async_error(&self) -> Result<()> {
        self.inner_checked()?.engine.async_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_buffer_checks() {
        let v = [0f32; 8];
        let p = v.as_ptr() as *const c_void;
        let b = buffer(p, 8, Datatype::F32, "send", false).unwrap();
        assert_eq!(b.memory, MemoryKind::Host);
        assert_eq!(b.len, 8);
        // Null with elements, misaligned, host memory on a stream.
        assert!(matches!(
            buffer(std::ptr::null(), 4, Datatype::F32, "send", false),
            Err(Error::InvalidUsage(_))
        ));
        let odd = (p as usize + 1) as *const c_void;
        assert!(matches!(
            buffer(odd, 4, Datatype::F32, "send", false),
            Err(Error::InvalidUsage(_))
        ));
        assert!(matches!(
            buffer(p, 8, Datatype::F32, "send", true),
            Err(Error::WrongMemory(_))
        ));
        // Empty buffers are fine anywhere, null included.
        assert!(buffer(std::ptr::null(), 0, Datatype::F64, "send", true).is_ok());
        assert!(matches!(
            buffer(p, u64::MAX, Datatype::F64, "send", false),
            Err(Error::CountTooLarge(_))
        ));
    }

    #[test]
    fn block_layouts() {
        let v = [0u64; 12];
        let base = v.as_ptr() as *const c_void;
        let block2 = v[8..].as_ptr() as *const c_void;
        assert!(is_block_of(block2, base, 2, 4, Datatype::U64));
        assert!(!is_block_of(block2, base, 1, 4, Datatype::U64));
        assert!(!is_block_of(
            block2,
            base,
            usize::MAX,
            u64::MAX,
            Datatype::U64
        ));
    }
}
