//! The collectives, rsmpi style: methods on [`Communicator`] for the
//! collectives without a root, on [`Process`] (a root rank) for the rooted
//! ones, `immediate_*` forms returning a [`Request`], and [`Group`] for
//! aggregating several collectives into one launch.
//!
//! Every call checks its arguments on this rank first (`check`), then the
//! engine plans and submits it (`crate::enqueue`).
//!
//! # One element type per call
//!
//! The send and receive buffers of a call hold the same element type, so a
//! mismatch is caught by the compiler, not at run time:
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! # fn f(world: &Communicator) -> gpucoll::Result<()> {
//! let grads = vec![1.0f32; 4];
//! let mut sum = vec![0.0f32; 4];
//! world.all_reduce_into(&grads, &mut sum, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0271
//! # use gpucoll::prelude::*;
//! # fn f(world: &Communicator) -> gpucoll::Result<()> {
//! let grads = vec![1.0f32; 4];
//! let mut sum = vec![0i32; 4]; // f32 in, i32 out: does not compile
//! world.all_reduce_into(&grads, &mut sum, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! The same holds for rooted calls and calls in a group:
//!
//! ```compile_fail,E0271
//! # use gpucoll::prelude::*;
//! # fn f(world: &Communicator) -> gpucoll::Result<()> {
//! let mine = vec![1u8; 4];
//! let mut all = vec![0i8; 4 * world.size()];
//! world.process_at_rank(0).gather_into_root(&mine, &mut all)?;
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0271
//! # use gpucoll::prelude::*;
//! # fn f(world: &Communicator) -> gpucoll::Result<()> {
//! let x = vec![1.0f64; 4];
//! let mut y = vec![0u64; 4];
//! world.group(|g| g.all_reduce_into(&x, &mut y, ReduceOp::Sum))?;
//! # Ok(()) }
//! ```
//!
//! Only the raw entry points ([`Communicator::raw_collective`] and the
//! `*_raw` calls), which take a [`Datatype`](crate::Datatype) per buffer,
//! can disagree; they return [`Error::TypeMismatch`](crate::Error::TypeMismatch).

mod check;
#[cfg(feature = "cudarc")]
pub mod cudarc;
mod group;
mod process;
pub mod raw;
mod register;

pub use group::{Group, GroupProcess};
pub use process::Process;
pub use raw::CudaStreamRaw;
pub use register::Registration;

use crate::buffer::{Buffer, BufferMut, RawBuffer};
use crate::comm::Communicator;
use crate::engine::Call;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::request::{Request, Scope};
use crate::task::CollKind;
use check::Args;

pub(crate) fn separate<S, R>(send: &S, recv: &mut R) -> Args
where
    S: Buffer + ?Sized,
    R: BufferMut<Elem = S::Elem> + ?Sized,
{
    Args::Separate {
        send: Some(send.raw()),
        recv: Some(recv.raw_mut()),
    }
}

/// The [`Args`] of [`Communicator::raw_collective`] and its immediate form.
fn raw_args(send: Option<RawBuffer>, recv: Option<RawBuffer>, in_place: bool) -> Result<Args> {
    if !in_place {
        return Ok(Args::Separate { send, recv });
    }
    match recv.or(send) {
        Some(b) => Ok(Args::InPlace(b)),
        None => Err(crate::Error::InvalidUsage(
            "an in-place collective needs a buffer".into(),
        )),
    }
}

impl Communicator {
    /// Validate a call on this rank and bind it to its buffers.
    pub(crate) fn prepare(
        &self,
        kind: CollKind,
        args: Args,
        op: ReduceOp,
        root: usize,
    ) -> Result<Call> {
        let inner = self.inner_checked()?;
        let engine = &inner.engine;
        check::prepare(kind, args, op, root, self.rank(), self.size(), &|m| {
            engine.check_memory(m)
        })
    }

    /// Run calls as one launch and wait for them.
    pub(crate) fn run_blocking(&self, calls: &[Call]) -> Result<()> {
        let inner = self.inner_checked()?;
        // SAFETY: the buffers are borrowed by the caller for this whole call,
        // which returns only once the work has completed.
        unsafe { inner.engine.run(&inner.mpi, calls) }
    }

    /// Start one call whose buffers are borrowed for the scope's lifetime.
    pub(crate) fn run_immediate<'a>(&self, scope: &Scope<'a>, call: Call) -> Result<Request<'a>> {
        let inner = self.inner_checked()?;
        // SAFETY: the buffers are borrowed for 'a, and the scope of lifetime
        // 'a waits for this work before it ends.
        let work = unsafe { inner.engine.submit(&inner.mpi, &[call])? };
        Ok(scope.register(work))
    }

    fn blocking(&self, kind: CollKind, args: Args, op: ReduceOp, root: usize) -> Result<()> {
        let call = self.prepare(kind, args, op, root)?;
        self.run_blocking(&[call])
    }

    /// The process at `rank`, for rooted collectives. An out-of-range rank
    /// is reported (`Error::InvalidRoot`) by the collective called on it.
    pub fn process_at_rank(&self, rank: usize) -> Process<'_> {
        Process::new(self, rank)
    }

    /// Block until every rank has entered the barrier (through the engine,
    /// so it is ordered with the collectives and bounded by the timeout).
    pub fn barrier(&self) -> Result<()> {
        let mut token = [0u8; 1];
        self.all_reduce_in_place(&mut token[..], ReduceOp::Max)
    }

    /// `MPI_Allreduce`: combine `send` of every rank with `op` into `recv`
    /// of every rank. Both hold the same number of elements.
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let x = vec![world.rank() as i64; 4];
    /// let mut sum = vec![0i64; 4];
    /// world.all_reduce_into(&x, &mut sum, ReduceOp::Sum)?;
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn all_reduce_into<S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.blocking(CollKind::AllReduce, separate(send, recv), op, 0)
    }

    /// `MPI_Allreduce` with `MPI_IN_PLACE`: `buf` is both input and result.
    pub fn all_reduce_in_place<B: BufferMut + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.blocking(CollKind::AllReduce, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// `MPI_Allgather`: `recv` (size × `send.len()`) receives every rank's
    /// `send`, in rank order.
    pub fn all_gather_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.blocking(CollKind::AllGather, separate(send, recv), ReduceOp::Sum, 0)
    }

    /// `MPI_Allgather` in place: this rank's block is already at
    /// `buf[rank*count..(rank+1)*count]`.
    pub fn all_gather_in_place<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        self.blocking(
            CollKind::AllGather,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
            0,
        )
    }

    /// `MPI_Reduce_scatter_block`: `send` holds size × `recv.len()`
    /// elements; rank r receives the reduction of every rank's block r.
    pub fn reduce_scatter_block_into<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.blocking(CollKind::ReduceScatter, separate(send, recv), op, 0)
    }

    /// `MPI_Reduce_scatter_block` in place: `buf` holds size × count
    /// elements; the result lands in `buf[..count]`.
    pub fn reduce_scatter_block_in_place<B: BufferMut + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.blocking(CollKind::ReduceScatter, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// `MPI_Alltoall`: block j of `send` goes to rank j, which stores it as
    /// its block i (i = this rank) of `recv`.
    pub fn all_to_all_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.blocking(CollKind::AllToAll, separate(send, recv), ReduceOp::Sum, 0)
    }

    /// `MPI_Alltoall` in place.
    pub fn all_to_all_in_place<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        self.blocking(
            CollKind::AllToAll,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
            0,
        )
    }

    /// `MPI_Scan`: `recv` of rank r receives the inclusive prefix
    /// reduction of `send` over ranks 0..=r, element by element. Both hold
    /// the same number of elements. Every op but [`ReduceOp::Avg`] applies
    /// (it divides by the communicator's size; [`Error::InvalidOp`]);
    /// [`ReduceOp::PreMulSum`] scales each rank's input before the prefix
    /// sum.
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// // Each rank's count of items; the running total gives its offset.
    /// let mine = vec![world.rank() as u64 + 1];
    /// let mut upto = vec![0u64];
    /// world.scan_into(&mine, &mut upto, ReduceOp::Sum)?;
    /// let r = world.rank() as u64;
    /// assert_eq!(upto[0], (r + 1) * (r + 2) / 2);
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    ///
    /// [`Error::InvalidOp`]: crate::Error::InvalidOp
    pub fn scan_into<S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.blocking(CollKind::Scan, separate(send, recv), op, 0)
    }

    /// `MPI_Scan` with `MPI_IN_PLACE`: `buf` is this rank's input and
    /// receives its prefix.
    pub fn scan_in_place<B: BufferMut + ?Sized>(&self, buf: &mut B, op: ReduceOp) -> Result<()> {
        self.blocking(CollKind::Scan, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// `MPI_Exscan`: `recv` of rank r > 0 receives the exclusive prefix
    /// reduction of `send` over ranks 0..r. MPI leaves rank 0's `recv`
    /// undefined; gpucoll never writes it (it keeps what it held). Ops as
    /// for [`scan_into`](Self::scan_into).
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// // Where this rank's items start in a global array.
    /// let mine = vec![10u64];
    /// let mut start = vec![0u64]; // rank 0 keeps this 0
    /// world.exclusive_scan_into(&mine, &mut start, ReduceOp::Sum)?;
    /// assert_eq!(start[0], 10 * world.rank() as u64);
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn exclusive_scan_into<S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        self.blocking(CollKind::ExclusiveScan, separate(send, recv), op, 0)
    }

    /// `MPI_Exscan` with `MPI_IN_PLACE`: `buf` is this rank's input and
    /// receives its exclusive prefix; rank 0's `buf` is left as it was.
    pub fn exclusive_scan_in_place<B: BufferMut + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.blocking(CollKind::ExclusiveScan, Args::InPlace(buf.raw_mut()), op, 0)
    }

    /// Immediate `all_reduce_into`.
    pub fn immediate_all_reduce_into<'a, S, R>(
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
        let call = self.prepare(CollKind::AllReduce, separate(send, recv), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `all_reduce_in_place`.
    pub fn immediate_all_reduce_in_place<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<Request<'a>> {
        let call = self.prepare(CollKind::AllReduce, Args::InPlace(buf.raw_mut()), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `all_gather_into`.
    pub fn immediate_all_gather_into<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        let call = self.prepare(CollKind::AllGather, separate(send, recv), ReduceOp::Sum, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `all_gather_in_place`.
    pub fn immediate_all_gather_in_place<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
    ) -> Result<Request<'a>> {
        let call = self.prepare(
            CollKind::AllGather,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
            0,
        )?;
        self.run_immediate(scope, call)
    }

    /// Immediate `reduce_scatter_block_into`.
    pub fn immediate_reduce_scatter_block_into<'a, S, R>(
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
        let call = self.prepare(CollKind::ReduceScatter, separate(send, recv), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `reduce_scatter_block_in_place`.
    pub fn immediate_reduce_scatter_block_in_place<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<Request<'a>> {
        let call = self.prepare(CollKind::ReduceScatter, Args::InPlace(buf.raw_mut()), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `all_to_all_into`.
    pub fn immediate_all_to_all_into<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Elem = S::Elem> + ?Sized,
    {
        let call = self.prepare(CollKind::AllToAll, separate(send, recv), ReduceOp::Sum, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `all_to_all_in_place`.
    pub fn immediate_all_to_all_in_place<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
    ) -> Result<Request<'a>> {
        let call = self.prepare(
            CollKind::AllToAll,
            Args::InPlace(buf.raw_mut()),
            ReduceOp::Sum,
            0,
        )?;
        self.run_immediate(scope, call)
    }

    /// Immediate `scan_into`.
    pub fn immediate_scan_into<'a, S, R>(
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
        let call = self.prepare(CollKind::Scan, separate(send, recv), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `scan_in_place`.
    pub fn immediate_scan_in_place<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<Request<'a>> {
        let call = self.prepare(CollKind::Scan, Args::InPlace(buf.raw_mut()), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `exclusive_scan_into`.
    pub fn immediate_exclusive_scan_into<'a, S, R>(
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
        let call = self.prepare(CollKind::ExclusiveScan, separate(send, recv), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Immediate `exclusive_scan_in_place`.
    pub fn immediate_exclusive_scan_in_place<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<Request<'a>> {
        let call = self.prepare(CollKind::ExclusiveScan, Args::InPlace(buf.raw_mut()), op, 0)?;
        self.run_immediate(scope, call)
    }

    /// Run any collective on raw buffers (for generic drivers such as the
    /// bench and the MPI shim). Lengths follow [`Task`](crate::task::Task)'s
    /// conventions as seen from the buffers: `send`/`recv` are what the
    /// typed method of `kind` would take; with `in_place` only `recv` is used.
    ///
    /// # Safety
    /// `send` and `recv` must describe memory that is valid for reads
    /// (`send`) and writes (`recv`) of their stated lengths for the whole
    /// call, of the memory kind they claim, and not accessed concurrently.
    pub unsafe fn raw_collective(
        &self,
        kind: CollKind,
        send: Option<RawBuffer>,
        recv: Option<RawBuffer>,
        op: ReduceOp,
        root: usize,
        in_place: bool,
    ) -> Result<()> {
        let args = raw_args(send, recv, in_place)?;
        self.blocking(kind, args, op, root)
    }

    /// The immediate form of [`raw_collective`](Self::raw_collective): starts
    /// the collective and returns a [`RawRequest`](crate::RawRequest) to wait
    /// on or test (for the MPI shim's `MPI_I*` calls, on any backend). Every
    /// rank must start its collectives on this communicator in the same
    /// order, as with blocking calls.
    ///
    /// # Safety
    /// As for [`raw_collective`](Self::raw_collective), and the buffers stay
    /// valid and untouched until the request has completed (`wait`, a
    /// `test` that returned `Ok(true)` or an error, or its drop, which
    /// waits).
    pub unsafe fn immediate_raw_collective(
        &self,
        kind: CollKind,
        send: Option<RawBuffer>,
        recv: Option<RawBuffer>,
        op: ReduceOp,
        root: usize,
        in_place: bool,
    ) -> Result<crate::RawRequest> {
        let args = raw_args(send, recv, in_place)?;
        let call = self.prepare(kind, args, op, root)?;
        let inner = self.inner_checked()?;
        // SAFETY: the caller keeps the buffers valid until the request
        // completes (this function's contract).
        let work = unsafe { inner.engine.submit(&inner.mpi, &[call])? };
        Ok(crate::RawRequest::new(work))
    }

    /// Aggregate the collectives issued inside `f` into one launch, executed
    /// when `f` returns `Ok` (nothing runs if it returns an error).
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let (a, mut b) = (vec![1u32; 8], vec![0u32; 8]);
    /// let mut c = vec![0f64; 4];
    /// world.group(|g| {
    ///     g.all_reduce_into(&a, &mut b, ReduceOp::Sum)?;
    ///     g.process_at_rank(0).broadcast_into(&mut c)
    /// })?;
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn group<'a, F>(&self, f: F) -> Result<()>
    where
        F: FnOnce(&mut Group<'a>) -> Result<()>,
    {
        let mut g = Group::new(self);
        f(&mut g)?;
        let calls = g.into_calls();
        if calls.is_empty() {
            return Ok(());
        }
        self.run_blocking(&calls)
    }
}
