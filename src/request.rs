//! Immediate (nonblocking) collectives: [`scope`], [`Scope`] and [`Request`];
//! [`RawRequest`] for the unscoped raw form
//! ([`Communicator::immediate_raw_collective`](crate::Communicator::immediate_raw_collective)).
//!
//! As in rsmpi, an immediate collective borrows its buffers for the lifetime
//! of a scope, and the scope does not end before every request started in it
//! has completed. So a buffer can neither be freed nor touched while the
//! engine still works on it, even if a `Request` is leaked with
//! `std::mem::forget`.
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! # let universe = gpucoll::initialize()?; let world = universe.world()?;
//! # fn backward(layer: usize) -> Vec<f32> { vec![layer as f32; 1024] }
//! // Start each layer's gradient average as soon as backward produced it.
//! let grads: Vec<Vec<f32>> = (0..4).map(backward).collect();
//! let mut avg = vec![vec![0f32; 1024]; 4];
//! gpucoll::scope(|s| {
//!     let reqs = grads
//!         .iter()
//!         .zip(avg.iter_mut())
//!         .map(|(g, a)| world.immediate_all_reduce_into(s, g, a, ReduceOp::Avg))
//!         .collect::<Result<Vec<_>>>()?;
//!     reqs.into_iter().try_for_each(|r| r.wait())
//! })?;
//! # Ok::<(), gpucoll::Error>(())
//! ```

use crate::backend::PendingWork;
use crate::error::Result;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

type Slot = Rc<RefCell<Option<Box<dyn PendingWork>>>>;

/// The region in which immediate collectives may borrow buffers for `'a`.
///
/// Made by [`scope`]; every `immediate_*` method takes one. Buffers
/// borrowed by a request stay borrowed until the scope ends, so they can be
/// read only after it:
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let (grads, mut avg) = (vec![1.0f32; 4096], vec![0.0f32; 4096]);
/// let (step, mut last) = (vec![world.rank() as u64], vec![0u64]);
/// gpucoll::scope(|s| {
///     let a = world.immediate_all_reduce_into(s, &grads, &mut avg, ReduceOp::Avg)?;
///     let b = world.immediate_all_reduce_into(s, &step, &mut last, ReduceOp::Max)?;
///     a.wait()?;
///     b.wait()
/// })?;
/// println!("{} {}", avg[0], last[0]);
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub struct Scope<'a> {
    outstanding: RefCell<Vec<Slot>>,
    // Invariant in 'a, so requests cannot be moved to a scope that ends later.
    _marker: PhantomData<&'a mut &'a ()>,
}

/// Run `f` with a scope for immediate collectives; waits for every request
/// started in the scope before returning (also when `f` panics).
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?;
/// # let world = universe.world()?;
/// let a = vec![1.0f32; 1024];
/// let mut b = vec![0.0f32; 1024];
/// gpucoll::scope(|s| {
///     let req = world.immediate_all_reduce_into(s, &a, &mut b, ReduceOp::Sum)?;
///     // ... other work overlaps the collective ...
///     req.wait()
/// })?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn scope<'a, F, T>(f: F) -> T
where
    F: FnOnce(&Scope<'a>) -> T,
{
    let s = Scope {
        outstanding: RefCell::new(Vec::new()),
        _marker: PhantomData,
    };
    f(&s)
    // `s` drops here and waits for whatever is still outstanding.
}

impl<'a> Scope<'a> {
    pub(crate) fn register(&self, work: Box<dyn PendingWork>) -> Request<'a> {
        let slot: Slot = Rc::new(RefCell::new(Some(work)));
        self.outstanding.borrow_mut().push(slot.clone());
        Request {
            slot,
            _marker: PhantomData,
        }
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        for slot in self.outstanding.borrow_mut().drain(..) {
            if let Some(mut work) = slot.borrow_mut().take() {
                if let Err(e) = work.wait() {
                    tracing::warn!(error = %e, "immediate collective failed and was never waited on");
                }
            }
        }
    }
}

/// An immediate collective in flight.
///
/// Returned by the `immediate_*` methods; [`wait`](Request::wait) for it,
/// or poll it with [`test`](Request::test) while doing other work:
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// # fn compute_next_layer() {}
/// let mut weights = vec![0.0f32; 1 << 20];
/// gpucoll::scope(|s| {
///     let req = world.process_at_rank(0).immediate_broadcast_into(s, &mut weights)?;
///     while !req.test()? {
///         compute_next_layer();
///     }
///     Ok::<(), gpucoll::Error>(())
/// })?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[must_use = "a request should be waited on or tested to see its result"]
pub struct Request<'a> {
    slot: Slot,
    _marker: PhantomData<&'a ()>,
}

impl Request<'_> {
    /// Block until the collective completes and return its result.
    pub fn wait(self) -> Result<()> {
        let work = self.slot.borrow_mut().take();
        match work {
            Some(mut w) => w.wait(),
            None => Ok(()),
        }
    }

    /// Whether the collective has completed (`Ok(true)`), is still running
    /// (`Ok(false)`), or failed (`Err`).
    pub fn test(&self) -> Result<bool> {
        let mut guard = self.slot.borrow_mut();
        let done = match guard.as_mut() {
            Some(w) => w.test()?,
            None => return Ok(true),
        };
        if done {
            *guard = None;
        }
        Ok(done)
    }
}

/// Wait for every request (immediate collectives, sends, and receives
/// turned into a [`Request`] with `.into()`), in any order: the first
/// error, after all of them completed.
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let (rank, size) = (world.rank(), world.size());
/// let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
/// let edge = vec![rank as f64; 512];
/// let (mut from_left, mut from_right) = (vec![0f64; 512], vec![0f64; 512]);
/// gpucoll::scope(|s| {
///     let reqs = vec![
///         world.process_at_rank(left).immediate_receive_into(s, &mut from_left)?.into(),
///         world.process_at_rank(right).immediate_receive_into(s, &mut from_right)?.into(),
///         world.process_at_rank(left).immediate_send(s, &edge)?,
///         world.process_at_rank(right).immediate_send(s, &edge)?,
///     ];
///     gpucoll::wait_all(reqs)
/// })?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn wait_all<'a>(requests: impl IntoIterator<Item = Request<'a>>) -> Result<()> {
    let mut first = Ok(());
    for r in requests {
        if let Err(e) = r.wait() {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// An immediate collective on raw buffers, in flight. Not tied to a scope:
/// the unsafe call that started it made the caller responsible for the
/// buffers until it completes. Dropping it waits for the collective.
///
/// Returned by [`Communicator::immediate_raw_collective`](crate::Communicator::immediate_raw_collective):
///
/// ```no_run
/// use gpucoll::{Buffer, BufferMut, CollKind, ReduceOp};
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let send = vec![1i32; 256];
/// let mut recv = vec![0i32; 256];
/// // SAFETY: both vectors outlive the request, which is waited on below,
/// // and neither is touched before that.
/// let req = unsafe {
///     world.immediate_raw_collective(
///         CollKind::AllReduce,
///         Some(send.raw()),
///         Some(recv.raw_mut()),
///         ReduceOp::Sum,
///         0,
///         false,
///     )?
/// };
/// // ... work that touches neither vector ...
/// req.wait()?;
/// assert_eq!(recv[0], world.size() as i32);
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[must_use = "a request should be waited on or tested to see its result"]
pub struct RawRequest {
    work: Option<Box<dyn PendingWork>>,
}

impl RawRequest {
    pub(crate) fn new(work: Box<dyn PendingWork>) -> RawRequest {
        RawRequest { work: Some(work) }
    }

    /// Block until the collective completes and return its result.
    pub fn wait(mut self) -> Result<()> {
        match self.work.take() {
            Some(mut w) => w.wait(),
            None => Ok(()),
        }
    }

    /// Whether the collective has completed (`Ok(true)`, also on every later
    /// call), is still running (`Ok(false)`), or failed (`Err`, once).
    pub fn test(&mut self) -> Result<bool> {
        let done = match self.work.as_mut() {
            Some(w) => w.test(),
            None => return Ok(true),
        };
        if !matches!(done, Ok(false)) {
            self.work = None;
        }
        done
    }
}

impl Drop for RawRequest {
    fn drop(&mut self) {
        if let Some(mut w) = self.work.take() {
            if let Err(e) = w.wait() {
                tracing::warn!(error = %e, "dropped raw request's collective failed");
            }
        }
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if let Some(mut w) = self.slot.borrow_mut().take() {
            if let Err(e) = w.wait() {
                tracing::warn!(error = %e, "dropped request's collective failed");
            }
        }
    }
}
