//! Aggregation: several collectives planned together and executed as one
//! launch (NCCL's group calls).

use super::check::Args;
use super::separate;
use crate::buffer::{Buffer, BufferMut};
use crate::comm::Communicator;
use crate::enqueue::Call;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::task::CollKind;
use std::marker::PhantomData;

/// Collects the collectives of [`Communicator::group`]. Buffers are
/// borrowed for `'a`, which outlives the whole `group` call, and the group
/// executes before `group` returns.
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
        R: BufferMut + ?Sized,
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
        R: BufferMut + ?Sized,
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
        R: BufferMut + ?Sized,
    {
        self.push(CollKind::ReduceScatter, separate(send, recv), op, 0)
    }

    /// Grouped [`Communicator::all_to_all_into`].
    pub fn all_to_all_into<S, R>(&mut self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.push(CollKind::AllToAll, separate(send, recv), ReduceOp::Sum, 0)
    }

    /// Grouped broadcast from `root`.
    pub fn broadcast_into<B: BufferMut + ?Sized>(
        &mut self,
        root: usize,
        buf: &'a mut B,
    ) -> Result<()> {
        self.push(
            CollKind::Broadcast,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
            root,
        )
    }

    /// Grouped reduce, on the root.
    pub fn reduce_into_root<S, R>(
        &mut self,
        root: usize,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.push(CollKind::Reduce, separate(send, recv), op, root)
    }

    /// Grouped reduce, on the other ranks.
    pub fn reduce_into<S: Buffer + ?Sized>(
        &mut self,
        root: usize,
        send: &'a S,
        op: ReduceOp,
    ) -> Result<()> {
        let args = Args::Separate {
            send: Some(send.raw()),
            recv: None,
        };
        self.push(CollKind::Reduce, args, op, root)
    }

    /// Grouped gather, on the root.
    pub fn gather_into_root<S, R>(
        &mut self,
        root: usize,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.push(CollKind::Gather, separate(send, recv), ReduceOp::Sum, root)
    }

    /// Grouped gather, on the other ranks.
    pub fn gather_into<S: Buffer + ?Sized>(&mut self, root: usize, send: &'a S) -> Result<()> {
        let args = Args::Separate {
            send: Some(send.raw()),
            recv: None,
        };
        self.push(CollKind::Gather, args, ReduceOp::Sum, root)
    }

    /// Grouped scatter, on the root.
    pub fn scatter_into_root<S, R>(
        &mut self,
        root: usize,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.push(CollKind::Scatter, separate(send, recv), ReduceOp::Sum, root)
    }

    /// Grouped scatter, on the other ranks.
    pub fn scatter_into<R: BufferMut + ?Sized>(
        &mut self,
        root: usize,
        recv: &'a mut R,
    ) -> Result<()> {
        let args = Args::Separate {
            send: None,
            recv: Some(recv.raw_mut()),
        };
        self.push(CollKind::Scatter, args, ReduceOp::Sum, root)
    }
}
