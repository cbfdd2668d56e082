//! Rooted collectives, called on the root's [`Process`] as in rsmpi
//! (its point-to-point methods are in `crate::p2p`).

use super::check::Args;
use super::separate;
use crate::buffer::{Buffer, BufferMut};
use crate::comm::Communicator;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::request::{Request, Scope};
use crate::task::CollKind;

/// A rank of a communicator: the root of a collective, or the other end
/// of a point-to-point message (`send`, `receive_into`, ... in
/// [`crate::p2p`]).
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let root = world.process_at_rank(0);
/// let mut x = vec![0f32; 16];
/// if world.rank() == 0 { x.fill(1.5); }
/// root.broadcast_into(&mut x)?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct Process<'c> {
    comm: &'c Communicator,
    rank: usize,
}

pub(super) fn send_only<S: Buffer + ?Sized>(send: &S) -> Args {
    Args::Separate {
        send: Some(send.raw()),
        recv: None,
    }
}

pub(super) fn recv_only<R: BufferMut + ?Sized>(recv: &mut R) -> Args {
    Args::Separate {
        send: None,
        recv: Some(recv.raw_mut()),
    }
}

impl<'c> Process<'c> {
    pub(crate) fn new(comm: &'c Communicator, rank: usize) -> Process<'c> {
        Process { comm, rank }
    }

    /// The process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The communicator it is a rank of.
    pub(crate) fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// Whether the calling process is this root.
    pub fn is_self(&self) -> bool {
        self.comm.rank() == self.rank
    }

    fn run(&self, kind: CollKind, args: Args, op: ReduceOp) -> Result<()> {
        let call = self.comm.prepare(kind, args, op, self.rank)?;
        self.comm.run_blocking(&[call])
    }

    fn start<'a>(
        &self,
        scope: &Scope<'a>,
        kind: CollKind,
        args: Args,
        op: ReduceOp,
    ) -> Result<Request<'a>> {
        let call = self.comm.prepare(kind, args, op, self.rank)?;
        self.comm.run_immediate(scope, call)
    }

    /// `MPI_Bcast`: the root's `buf` is copied into `buf` of every rank.
    pub fn broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        self.run(
            CollKind::Broadcast,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
        )
    }

    /// `MPI_Reduce`, called on the root: every rank's `send` combined into `recv`.
    pub fn reduce_into_root<S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.run(CollKind::Reduce, separate(send, recv), op)
    }

    /// `MPI_Reduce`, called on the other ranks: contribute `send`.
    pub fn reduce_into<S: Buffer + ?Sized>(&self, send: &S, op: ReduceOp) -> Result<()> {
        self.run(CollKind::Reduce, send_only(send), op)
    }

    /// `MPI_Reduce` with `MPI_IN_PLACE` on the root: `buf` is input and result.
    pub fn reduce_into_root_in_place<B: BufferMut + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(CollKind::Reduce, Args::InPlace(buf.raw_mut()), op)
    }

    /// `MPI_Gather`, called on the root: `recv` (size × `send.len()`)
    /// receives every rank's `send` in rank order.
    pub fn gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.run(CollKind::Gather, separate(send, recv), ReduceOp::Sum)
    }

    /// `MPI_Gather`, called on the other ranks.
    pub fn gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        self.run(CollKind::Gather, send_only(send), ReduceOp::Sum)
    }

    /// `MPI_Gather` in place on the root: its own block is already at
    /// `recv[root*count..]`.
    pub fn gather_into_root_in_place<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        self.run(
            CollKind::Gather,
            Args::InPlace(recv.raw_mut()),
            ReduceOp::Sum,
        )
    }

    /// `MPI_Scatter`, called on the root: block r of `send` goes to rank r.
    pub fn scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.run(CollKind::Scatter, separate(send, recv), ReduceOp::Sum)
    }

    /// `MPI_Scatter`, called on the other ranks.
    pub fn scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        self.run(CollKind::Scatter, recv_only(recv), ReduceOp::Sum)
    }

    /// `MPI_Scatter` in place on the root: its own block stays in `send`.
    pub fn scatter_into_root_in_place<B: BufferMut + ?Sized>(&self, send: &mut B) -> Result<()> {
        self.run(
            CollKind::Scatter,
            Args::InPlace(send.raw_mut()),
            ReduceOp::Sum,
        )
    }

    /// Immediate `broadcast_into`.
    pub fn immediate_broadcast_into<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
    ) -> Result<Request<'a>> {
        self.start(
            scope,
            CollKind::Broadcast,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
        )
    }

    /// Immediate `reduce_into_root`.
    pub fn immediate_reduce_into_root<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.start(scope, CollKind::Reduce, separate(send, recv), op)
    }

    /// Immediate `reduce_into`.
    pub fn immediate_reduce_into<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        op: ReduceOp,
    ) -> Result<Request<'a>> {
        self.start(scope, CollKind::Reduce, send_only(send), op)
    }

    /// Immediate `gather_into_root`.
    pub fn immediate_gather_into_root<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.start(scope, CollKind::Gather, separate(send, recv), ReduceOp::Sum)
    }

    /// Immediate `gather_into`.
    pub fn immediate_gather_into<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
    ) -> Result<Request<'a>> {
        self.start(scope, CollKind::Gather, send_only(send), ReduceOp::Sum)
    }

    /// Immediate `scatter_into_root`.
    pub fn immediate_scatter_into_root<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.start(
            scope,
            CollKind::Scatter,
            separate(send, recv),
            ReduceOp::Sum,
        )
    }

    /// Immediate `scatter_into`.
    pub fn immediate_scatter_into<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        self.start(scope, CollKind::Scatter, recv_only(recv), ReduceOp::Sum)
    }
}
