//! Collectives on cudarc's device memory (feature `cudarc`).
//!
//! * Blocking and immediate calls take [`CudaSlice`], [`CudaView`] and
//!   [`CudaViewMut`] wherever they take a [`Buffer`]: the call first waits
//!   for the work cudarc has queued on the slice (its stream, and the
//!   writes it tracks on other streams), then runs like any device buffer.
//! * [`Communicator::on_stream`] queues collectives on a cudarc
//!   [`CudaStream`] instead, in stream order and without blocking the host,
//!   with cudarc's own read/write tracking: the stream first waits for
//!   pending writes of the buffers, and cudarc makes later users (and the
//!   buffer's free) wait for the collective.
//!
//! The memory must belong to the communicator's GPU (cudarc contexts are
//! the GPU's primary context, which is the one gpucoll uses).
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! use cudarc::driver::CudaContext;
//! # let universe = gpucoll::initialize()?; let world = universe.world()?;
//! let ctx = CudaContext::new(world.device().unwrap() as usize).unwrap();
//! let stream = ctx.new_stream().unwrap();
//! let grads = stream.clone_htod(&vec![1.0f32; 1 << 20]).unwrap();
//! let mut sum = stream.alloc_zeros::<f32>(1 << 20).unwrap();
//! world.on_stream(&stream)?.all_reduce_into(&grads, &mut sum, ReduceOp::Sum)?;
//! let host: Vec<f32> = stream.clone_dtoh(&sum).unwrap(); // after the collective
//! # Ok::<(), gpucoll::Error>(())
//! ```

use super::check::Args;
use super::CudaStreamRaw;
use crate::buffer::{Buffer, BufferMut, MemoryKind, RawBuffer};
use crate::comm::Communicator;
use crate::datatype::Equivalence;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::task::CollKind;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};

fn raw_of<T: Equivalence>(ptr: u64, len: usize, stream: &CudaStream) -> RawBuffer {
    RawBuffer {
        addr: ptr,
        len: len as u64,
        dtype: T::DATATYPE,
        memory: MemoryKind::Device {
            ordinal: stream.context().ordinal() as i32,
        },
    }
}

/// The buffer's address once the work queued on it is complete: a
/// blocking collective runs on gpucoll's own stream, which does not order
/// itself after cudarc's streams.
fn settled<T: Equivalence, B: DevicePtr<T>>(b: &B, stream: &CudaStream) -> RawBuffer {
    let (ptr, _read) = b.device_ptr(stream);
    // An error here is the context's sticky error; the collective that
    // follows reports it.
    let _ = stream.synchronize();
    raw_of::<T>(ptr, b.len(), stream)
}

fn settled_mut<T: Equivalence, B: DevicePtrMut<T>>(b: &mut B, stream: &CudaStream) -> RawBuffer {
    let len = b.len();
    let (ptr, _write) = b.device_ptr_mut(stream);
    let _ = stream.synchronize();
    raw_of::<T>(ptr, len, stream)
}

impl<T: Equivalence> Buffer for CudaSlice<T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        settled(self, &self.stream().clone())
    }
}

impl<T: Equivalence> BufferMut for CudaSlice<T> {
    fn raw_mut(&mut self) -> RawBuffer {
        let stream = self.stream().clone();
        settled_mut(self, &stream)
    }
}

impl<T: Equivalence> Buffer for CudaView<'_, T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        settled(self, &self.stream().clone())
    }
}

impl<T: Equivalence> Buffer for CudaViewMut<'_, T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        settled(self, &self.stream().clone())
    }
}

impl<T: Equivalence> BufferMut for CudaViewMut<'_, T> {
    fn raw_mut(&mut self) -> RawBuffer {
        let stream = self.stream().clone();
        settled_mut(self, &stream)
    }
}

impl Communicator {
    /// Collectives queued on the cudarc stream `stream` (of this
    /// communicator's GPU): see the [module](crate::coll::cudarc) docs.
    ///
    /// # Errors
    /// `WrongMemory` when the communicator has no GPU or the stream belongs
    /// to another GPU.
    pub fn on_stream<'s>(&self, stream: &'s CudaStream) -> Result<OnStream<'_, 's>> {
        let ordinal = stream.context().ordinal() as i32;
        match self.device() {
            Some(d) if d == ordinal => Ok(OnStream { comm: self, stream }),
            Some(d) => Err(Error::WrongMemory(format!(
                "the stream belongs to GPU {ordinal}, this communicator runs on GPU {d}"
            ))),
            None => Err(Error::WrongMemory(
                "this communicator runs on the host backend; streams need the CUDA backend".into(),
            )),
        }
    }
}

/// A communicator's collectives queued on a cudarc stream
/// ([`Communicator::on_stream`]). Each call returns once the collective is
/// queued; work queued on the stream afterwards sees its result. Every rank
/// queues the same collectives in the same order. Errors found on the
/// device (a peer that never arrives: `GPUCOLL_TIMEOUT`) come back from the
/// next call or [`Communicator::async_error`].
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// use cudarc::driver::CudaContext;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let ctx = CudaContext::new(world.device().expect("CUDA backend") as usize).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let mut grads = stream.alloc_zeros::<f32>(1 << 20).unwrap();
/// let on = world.on_stream(&stream)?;
/// // ... kernels on `stream` write `grads` ...
/// on.all_reduce_in_place(&mut grads, ReduceOp::Avg)?; // queued, returns at once
/// let averaged: Vec<f32> = stream.clone_dtoh(&grads).unwrap(); // after the collective
/// world.async_error()?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct OnStream<'c, 's> {
    comm: &'c Communicator,
    stream: &'s CudaStream,
}

/// One buffer's address for stream-ordered use, with cudarc's event that
/// marks the end of the collective's use (recorded when dropped, after the
/// collective is queued).
struct Use<'a> {
    raw: RawBuffer,
    _mark: SyncOnDrop<'a>,
}

impl<'c, 's> OnStream<'c, 's> {
    /// The root `rank` for rooted collectives on this stream.
    pub fn process_at_rank(&self, rank: usize) -> StreamProcess<'c, 's> {
        StreamProcess { on: *self, rank }
    }

    fn read<'a, T: Equivalence, B: DevicePtr<T>>(&'a self, b: &'a B) -> Use<'a> {
        let (ptr, mark) = b.device_ptr(self.stream);
        Use {
            raw: raw_of::<T>(ptr, b.len(), self.stream),
            _mark: mark,
        }
    }

    fn write<'a, T: Equivalence, B: DevicePtrMut<T>>(&'a self, b: &'a mut B) -> Use<'a> {
        let len = b.len();
        let (ptr, mark) = b.device_ptr_mut(self.stream);
        Use {
            raw: raw_of::<T>(ptr, len, self.stream),
            _mark: mark,
        }
    }

    fn queue(&self, kind: CollKind, args: Args, op: ReduceOp, root: usize) -> Result<()> {
        let s = self.stream.cu_stream() as CudaStreamRaw;
        self.comm.raw_call(kind, args, op, root, Some(s))
    }

    fn separate<T, S, R>(
        &self,
        kind: CollKind,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        root: usize,
    ) -> Result<()>
    where
        T: Equivalence,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let (s, r) = (self.read(send), self.write(recv));
        let args = Args::Separate {
            send: Some(s.raw),
            recv: Some(r.raw),
        };
        self.queue(kind, args, op, root)
    }

    fn in_place<T, B>(&self, kind: CollKind, buf: &mut B, op: ReduceOp, root: usize) -> Result<()>
    where
        T: Equivalence,
        B: DevicePtrMut<T>,
    {
        let b = self.write(buf);
        self.queue(kind, Args::InPlace(b.raw), op, root)
    }

    fn send_only<T: Equivalence, S: DevicePtr<T>>(
        &self,
        kind: CollKind,
        send: &S,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let s = self.read(send);
        let args = Args::Separate {
            send: Some(s.raw),
            recv: None,
        };
        self.queue(kind, args, op, root)
    }

    fn recv_only<T: Equivalence, R: DevicePtrMut<T>>(
        &self,
        kind: CollKind,
        recv: &mut R,
        root: usize,
    ) -> Result<()> {
        let r = self.write(recv);
        let args = Args::Separate {
            send: None,
            recv: Some(r.raw),
        };
        self.queue(kind, args, ReduceOp::Sum, root)
    }

    /// Stream-ordered [`Communicator::all_reduce_into`].
    pub fn all_reduce_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.separate(CollKind::AllReduce, send, recv, op, 0)
    }

    /// Stream-ordered [`Communicator::all_reduce_in_place`].
    pub fn all_reduce_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.in_place(CollKind::AllReduce, buf, op, 0)
    }

    /// Stream-ordered [`Communicator::all_gather_into`].
    pub fn all_gather_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.separate(CollKind::AllGather, send, recv, ReduceOp::Sum, 0)
    }

    /// Stream-ordered [`Communicator::all_gather_in_place`].
    pub fn all_gather_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.in_place(CollKind::AllGather, buf, ReduceOp::Sum, 0)
    }

    /// Stream-ordered [`Communicator::reduce_scatter_block_into`].
    pub fn reduce_scatter_block_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.separate(CollKind::ReduceScatter, send, recv, op, 0)
    }

    /// Stream-ordered [`Communicator::reduce_scatter_block_in_place`].
    pub fn reduce_scatter_block_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.in_place(CollKind::ReduceScatter, buf, op, 0)
    }

    /// Stream-ordered [`Communicator::all_to_all_into`].
    pub fn all_to_all_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.separate(CollKind::AllToAll, send, recv, ReduceOp::Sum, 0)
    }

    /// Stream-ordered [`Communicator::all_to_all_in_place`].
    pub fn all_to_all_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.in_place(CollKind::AllToAll, buf, ReduceOp::Sum, 0)
    }

    /// Stream-ordered [`Communicator::scan_into`].
    pub fn scan_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.separate(CollKind::Scan, send, recv, op, 0)
    }

    /// Stream-ordered [`Communicator::scan_in_place`].
    pub fn scan_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.in_place(CollKind::Scan, buf, op, 0)
    }

    /// Stream-ordered [`Communicator::exclusive_scan_into`] (rank 0's
    /// `recv` is not written).
    pub fn exclusive_scan_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.separate(CollKind::ExclusiveScan, send, recv, op, 0)
    }

    /// Stream-ordered [`Communicator::exclusive_scan_in_place`].
    pub fn exclusive_scan_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.in_place(CollKind::ExclusiveScan, buf, op, 0)
    }
}

/// A root rank for stream-ordered rooted collectives
/// ([`OnStream::process_at_rank`]); the methods mirror
/// [`Process`](crate::Process).
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// use cudarc::driver::CudaContext;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let ctx = CudaContext::new(world.device().expect("CUDA backend") as usize).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let mut weights = stream.clone_htod(&vec![world.rank() as f32; 4096]).unwrap();
/// let root = world.on_stream(&stream)?.process_at_rank(0);
/// root.broadcast_into(&mut weights)?; // every rank now holds rank 0's weights
/// let local = stream.clone_dtoh(&weights).unwrap();
/// assert!(local.iter().all(|&w| w == 0.0));
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct StreamProcess<'c, 's> {
    on: OnStream<'c, 's>,
    rank: usize,
}

impl StreamProcess<'_, '_> {
    /// The root's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Stream-ordered [`Process::broadcast_into`](crate::Process::broadcast_into).
    pub fn broadcast_into<T: Equivalence>(&self, buf: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.on
            .in_place(CollKind::Broadcast, buf, ReduceOp::Sum, self.rank)
    }

    /// Stream-ordered [`Process::reduce_into_root`](crate::Process::reduce_into_root).
    pub fn reduce_into_root<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.on
            .separate(CollKind::Reduce, send, recv, op, self.rank)
    }

    /// Stream-ordered [`Process::reduce_into`](crate::Process::reduce_into).
    pub fn reduce_into<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.on.send_only(CollKind::Reduce, send, op, self.rank)
    }

    /// Stream-ordered [`Process::reduce_into_root_in_place`](crate::Process::reduce_into_root_in_place).
    pub fn reduce_into_root_in_place<T: Equivalence>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.on.in_place(CollKind::Reduce, buf, op, self.rank)
    }

    /// Stream-ordered [`Process::gather_into_root`](crate::Process::gather_into_root).
    pub fn gather_into_root<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.on
            .separate(CollKind::Gather, send, recv, ReduceOp::Sum, self.rank)
    }

    /// Stream-ordered [`Process::gather_into`](crate::Process::gather_into).
    pub fn gather_into<T: Equivalence>(&self, send: &impl DevicePtr<T>) -> Result<()> {
        self.on
            .send_only(CollKind::Gather, send, ReduceOp::Sum, self.rank)
    }

    /// Stream-ordered [`Process::gather_into_root_in_place`](crate::Process::gather_into_root_in_place).
    pub fn gather_into_root_in_place<T: Equivalence>(
        &self,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.on
            .in_place(CollKind::Gather, recv, ReduceOp::Sum, self.rank)
    }

    /// Stream-ordered [`Process::scatter_into_root`](crate::Process::scatter_into_root).
    pub fn scatter_into_root<T: Equivalence>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.on
            .separate(CollKind::Scatter, send, recv, ReduceOp::Sum, self.rank)
    }

    /// Stream-ordered [`Process::scatter_into`](crate::Process::scatter_into).
    pub fn scatter_into<T: Equivalence>(&self, recv: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.on.recv_only(CollKind::Scatter, recv, self.rank)
    }

    /// Stream-ordered [`Process::scatter_into_root_in_place`](crate::Process::scatter_into_root_in_place).
    pub fn scatter_into_root_in_place<T: Equivalence>(
        &self,
        send: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.on
            .in_place(CollKind::Scatter, send, ReduceOp::Sum, self.rank)
    }
}
