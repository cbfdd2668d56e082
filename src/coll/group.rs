//! Aggregation: several collectives planned together and executed as one
//! launch (NCCL's group calls).

use super::check::Args;
use super::process::{recv_only, send_only};
use super::separate;
use crate::buffer::{Buffer, BufferMut};
use crate::comm::Communicator;
use crate::engine::Call;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::task::CollKind;
use std::marker::PhantomData;

/// Collects the collectives of [`Communicator::group`]. Buffers are
/// borrowed for `'a`, which outlives the whole `group` call, and the group
/// executes before `group` returns.
///
/// Small collectives issued together cost about one launch:
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut layers = vec![vec![1.0f32; 256]; 8];
/// let mut loss = vec![0.5f64];
/// world.group(|g| {
///     for layer in layers.iter_mut() {
///         g.all_reduce_in_place(layer, ReduceOp::Avg)?;
///     }
///     g.all_reduce_in_place(&mut loss, ReduceOp::Sum)?;
///     assert_eq!(g.len(), 9);
///     Ok(())
/// })?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub struct Group<'a> {
    comm: Communicator,
    calls: Vec<Call>,
    _marker: PhantomData<&'a mut &'a ()>,
}

impl<'a> Group<'a> {
    pub(crate) fn new(comm: &Communicator) -> Group<'a> {
        Group {
            comm: comm.clone(),
            calls: Vec::new(),
            _marker: PhantomData,
        }
    }

    pub(crate) fn into_calls(self) -> Vec<Call> {
        self.calls
    }

    fn push(&mut self, kind: CollKind, args: Args, op: ReduceOp, root: usize) -> Result<()> {
        let call = self.comm.prepare(kind, args, op, root)?;
        self.calls.push(call);
        Ok(())
    }

    /// Number of collectives collected so far.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no collective was collected yet.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Grouped [`Communicator::all_reduce_into`].
    pub fn all_reduce_into<S, R>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::AllReduce, separate(send, recv), op, 0)
    }

    /// Grouped [`Communicator::all_reduce_in_place`].
    pub fn all_reduce_in_place<B: BufferMut + ?Sized>(
        &mut self,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.push(CollKind::AllReduce, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// Grouped [`Communicator::all_gather_into`].
    pub fn all_gather_into<S, R>(&mut self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::AllGather, separate(send, recv), ReduceOp::Sum, 0)
    }

    /// Grouped [`Communicator::all_gather_in_place`].
    pub fn all_gather_in_place<B: BufferMut + ?Sized>(&mut self, buf: &'a mut B) -> Result<()> {
        self.push(
            CollKind::AllGather,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
            0,
        )
    }

    /// Grouped [`Communicator::reduce_scatter_block_into`].
    pub fn reduce_scatter_block_into<S, R>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::ReduceScatter, separate(send, recv), op, 0)
    }

    /// Grouped [`Communicator::all_to_all_into`].
    pub fn all_to_all_into<S, R>(&mut self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::AllToAll, separate(send, recv), ReduceOp::Sum, 0)
    }

    /// Grouped [`Communicator::scan_into`].
    pub fn scan_into<S, R>(&mut self, send: &'a S, recv: &'a mut R, op: ReduceOp) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::Scan, separate(send, recv), op, 0)
    }

    /// Grouped [`Communicator::scan_in_place`].
    pub fn scan_in_place<B: BufferMut + ?Sized>(
        &mut self,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.push(CollKind::Scan, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// Grouped [`Communicator::exclusive_scan_into`].
    pub fn exclusive_scan_into<S, R>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::ExclusiveScan, separate(send, recv), op, 0)
    }

    /// Grouped [`Communicator::exclusive_scan_in_place`].
    pub fn exclusive_scan_in_place<B: BufferMut + ?Sized>(
        &mut self,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.push(CollKind::ExclusiveScan, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// The rank `rank` as the root of grouped rooted collectives, as
    /// [`Communicator::process_at_rank`] is for single calls:
    /// `g.process_at_rank(0).broadcast_into(&mut buf)?`.
    pub fn process_at_rank<'g>(&'g mut self, rank: usize) -> GroupProcess<'g, 'a> {
        GroupProcess { group: self, rank }
    }
}

/// A root rank inside a [`Group`]: the rooted collectives of [`Process`],
/// collected into the group instead of run at once.
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut weights = vec![0f32; 1024];
/// let grads = vec![1f32; 1024];
/// let mut total = vec![0f32; 1024];
/// world.group(|g| {
///     g.process_at_rank(0).broadcast_into(&mut weights)?;
///     if world.rank() == 0 {
///         g.process_at_rank(0).reduce_into_root(&grads, &mut total, ReduceOp::Sum)
///     } else {
///         g.process_at_rank(0).reduce_into(&grads, ReduceOp::Sum)
///     }
/// })?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
///
/// [`Process`]: crate::Process
pub struct GroupProcess<'g, 'a> {
    group: &'g mut Group<'a>,
    rank: usize,
}

impl<'a> GroupProcess<'_, 'a> {
    /// The root's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn push(self, kind: CollKind, args: Args, op: ReduceOp) -> Result<()> {
        self.group.push(kind, args, op, self.rank)
    }

    /// Grouped [`Process::broadcast_into`](crate::Process::broadcast_into).
    pub fn broadcast_into<B: BufferMut + ?Sized>(self, buf: &'a mut B) -> Result<()> {
        self.push(
            CollKind::Broadcast,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
        )
    }

    /// Grouped [`Process::reduce_into_root`](crate::Process::reduce_into_root).
    pub fn reduce_into_root<S, R>(self, send: &'a S, recv: &'a mut R, op: ReduceOp) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::Reduce, separate(send, recv), op)
    }

    /// Grouped [`Process::reduce_into`](crate::Process::reduce_into).
    pub fn reduce_into<S: Buffer + ?Sized>(self, send: &'a S, op: ReduceOp) -> Result<()> {
        self.push(CollKind::Reduce, send_only(send), op)
    }

    /// Grouped [`Process::reduce_into_root_in_place`](crate::Process::reduce_into_root_in_place).
    pub fn reduce_into_root_in_place<B: BufferMut + ?Sized>(
        self,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.push(CollKind::Reduce, Args::InPlace(buf.raw_mut()), op)
    }

    /// Grouped [`Process::gather_into_root`](crate::Process::gather_into_root).
    pub fn gather_into_root<S, R>(self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::Gather, separate(send, recv), ReduceOp::Sum)
    }

    /// Grouped [`Process::gather_into`](crate::Process::gather_into).
    pub fn gather_into<S: Buffer + ?Sized>(self, send: &'a S) -> Result<()> {
        self.push(CollKind::Gather, send_only(send), ReduceOp::Sum)
    }

    /// Grouped [`Process::gather_into_root_in_place`](crate::Process::gather_into_root_in_place).
    pub fn gather_into_root_in_place<R: BufferMut + ?Sized>(self, recv: &'a mut R) -> Result<()> {
        self.push(
            CollKind::Gather,
            Args::InPlace(recv.raw_mut()),
            ReduceOp::Sum,
        )
    }

    /// Grouped [`Process::scatter_into_root`](crate::Process::scatter_into_root).
    pub fn scatter_into_root<S, R>(self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.push(CollKind::Scatter, separate(send, recv), ReduceOp::Sum)
    }

    /// Grouped [`Process::scatter_into`](crate::Process::scatter_into).
    pub fn scatter_into<R: BufferMut + ?Sized>(self, recv: &'a mut R) -> Result<()> {
        self.push(CollKind::Scatter, recv_only(recv), ReduceOp::Sum)
    }

    /// Grouped [`Process::scatter_into_root_in_place`](crate::Process::scatter_into_root_in_place).
    pub fn scatter_into_root_in_place<B: BufferMut + ?Sized>(self, send: &'a mut B) -> Result<()> {
        self.push(
            CollKind::Scatter,
            Args::InPlace(send.raw_mut()),
            ReduceOp::Sum,
        )
    }
}
