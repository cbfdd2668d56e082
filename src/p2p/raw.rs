//! Point-to-point on raw pointers, for the MPI shim and programs that
//! bring their own memory: the same messages as the typed API (a typed
//! receive takes a raw send and the other way round), on untyped
//! addresses with an element count and a [`Datatype`], checked as the
//! collectives' `*_raw` calls check theirs (null with a count, alignment,
//! memory kind and GPU, a device range running past its allocation).
//!
//! `source: None` is `MPI_ANY_SOURCE`, `tag: None` (receives and probes)
//! `MPI_ANY_TAG`. Host and device memory mix freely: either end of a
//! message may be either. The envelope of every message goes through
//! gpucoll's private duplicate of the communicator, so a program (or the
//! shim) that sends all its messages of a communicator through these
//! calls keeps MPI's matching and ordering across host and device buffers.
//!
//! # Safety contract (every `unsafe` method here)
//!
//! The buffer is valid for its `count` elements of `dtype` (readable for
//! a send, writable for a receive) and not written (send) or accessed
//! (receive) by anything else until the message completed: when the
//! blocking call returns, or the request's `wait`, a `test` that returned
//! `Some`, or its drop. Device memory must be of this communicator's GPU,
//! usable from its primary context.
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! # let universe = gpucoll::initialize()?; let world = universe.world()?;
//! let mut buf = vec![0i64; 8];
//! if world.rank() == 0 {
//!     buf.fill(7);
//!     // SAFETY: `buf` holds 8 i64 and outlives the blocking call.
//!     unsafe { world.send_raw(buf.as_ptr().cast(), 8, Datatype::I64, 1, 5)? };
//! } else if world.rank() == 1 {
//!     // SAFETY: as above, written by the call.
//!     let st = unsafe { world.receive_raw(buf.as_mut_ptr().cast(), 8, Datatype::I64, None, None)? };
//!     assert_eq!((st.source_rank(), st.tag(), buf[7]), (0, 5, 7));
//! }
//! # Ok::<(), gpucoll::Error>(())
//! ```

use super::api::Message;
use super::recv::Selector;
use super::Status;
use crate::buffer::RawBuffer;
use crate::comm::Communicator;
use crate::datatype::Datatype;
use crate::error::Result;
use std::ffi::c_void;

/// A message in flight on raw buffers, not tied to a scope: the unsafe
/// call that started it made the caller responsible for the buffer. Its
/// drop cancels a receive that has not matched a message yet, and waits
/// for anything else.
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut inbox = vec![0u8; 1 << 20];
/// // SAFETY: `inbox` outlives the request and is not touched before it
/// // completed.
/// let mut req = unsafe {
///     world.immediate_receive_raw(inbox.as_mut_ptr().cast(), 1 << 20, Datatype::U8, None, Some(3))?
/// };
/// while req.test()?.is_none() {
///     // ... other work ...
/// }
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[must_use = "a request should be waited on or tested to see its result"]
pub struct RawMessageRequest {
    comm: Communicator,
    id: u64,
    /// Set once the message completed.
    done: Option<Result<Status>>,
}

impl RawMessageRequest {
    fn new(comm: &Communicator, id: u64) -> RawMessageRequest {
        RawMessageRequest {
            comm: comm.clone(),
            id,
            done: None,
        }
    }

    /// Block until the message completed: a receive's status (a send's
    /// status says nothing), or its error.
    pub fn wait(mut self) -> Result<Status> {
        if let Some(r) = self.done.take() {
            self.done = Some(Ok(Status::sent()));
            return r;
        }
        let r = self.comm.p2p_wait(self.id);
        self.done = Some(Ok(Status::sent()));
        r
    }

    /// `Ok(Some(status))` once the message completed (on every later call
    /// too), `Ok(None)` while it has not, or its error (once).
    pub fn test(&mut self) -> Result<Option<Status>> {
        match &self.done {
            Some(Ok(st)) => return Ok(Some(*st)),
            Some(Err(_)) => {
                let e = self.done.replace(Ok(Status::sent()));
                return e.map_or(Ok(None), |r| r.map(Some));
            }
            None => {}
        }
        match self.comm.p2p_test(self.id) {
            Ok(None) => Ok(None),
            Ok(Some(st)) => {
                self.done = Some(Ok(st));
                Ok(Some(st))
            }
            Err(e) => {
                self.done = Some(Ok(Status::sent()));
                Err(e)
            }
        }
    }

    /// `MPI_Cancel` of a receive: true when it had not matched a message
    /// yet and never will (its buffer is free at once); false when it had
    /// (or is a send): it completes as usual.
    pub fn cancel(&mut self) -> bool {
        if self.done.is_some() {
            return false;
        }
        match self.comm.p2p() {
            Ok(s) if s.cancel_unmatched(self.id) => {
                self.done = Some(Ok(Status::sent()));
                true
            }
            _ => false,
        }
    }
}

impl Drop for RawMessageRequest {
    fn drop(&mut self) {
        if self.done.is_some() || self.cancel() {
            return;
        }
        if let Err(e) = self.comm.p2p_wait(self.id) {
            tracing::warn!(error = %e, "dropped point-to-point request failed");
        }
    }
}

impl std::fmt::Debug for RawMessageRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawMessageRequest")
            .field("id", &self.id)
            .field("done", &self.done.is_some())
            .finish()
    }
}

impl Communicator {
    fn raw_buffer(
        &self,
        ptr: *const c_void,
        count: u64,
        dtype: Datatype,
        what: &'static str,
    ) -> Result<RawBuffer> {
        crate::coll::raw::checked_buffer(self, ptr, count, dtype, what)
    }

    /// `MPI_Send` on a raw buffer: `count` elements of `dtype` at `buf`
    /// to `dest` with `tag`.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn send_raw(
        &self,
        buf: *const c_void,
        count: u64,
        dtype: Datatype,
        dest: usize,
        tag: i32,
    ) -> Result<()> {
        let b = self.raw_buffer(buf, count, dtype, "send")?;
        let id = self.start_send(b, dest, tag)?;
        self.p2p_wait(id).map(|_| ())
    }

    /// `MPI_Isend` on a raw buffer.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn immediate_send_raw(
        &self,
        buf: *const c_void,
        count: u64,
        dtype: Datatype,
        dest: usize,
        tag: i32,
    ) -> Result<RawMessageRequest> {
        let b = self.raw_buffer(buf, count, dtype, "send")?;
        let id = self.start_send(b, dest, tag)?;
        Ok(RawMessageRequest::new(self, id))
    }

    /// `MPI_Recv` into a raw buffer of `count` elements of `dtype`.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn receive_raw(
        &self,
        buf: *mut c_void,
        count: u64,
        dtype: Datatype,
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Status> {
        let b = self.raw_buffer(buf, count, dtype, "receive")?;
        let id = self.start_recv(b, Selector { source, tag })?;
        self.p2p_wait(id)
    }

    /// `MPI_Irecv` into a raw buffer.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn immediate_receive_raw(
        &self,
        buf: *mut c_void,
        count: u64,
        dtype: Datatype,
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<RawMessageRequest> {
        let b = self.raw_buffer(buf, count, dtype, "receive")?;
        let id = self.start_recv(b, Selector { source, tag })?;
        Ok(RawMessageRequest::new(self, id))
    }

    /// `MPI_Probe` (blocking) or, with `wait` false, `MPI_Iprobe`: the
    /// status of the first message `source` and `tag` match, left for a
    /// receive.
    pub fn probe_raw(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
        wait: bool,
    ) -> Result<Option<Status>> {
        let sel = Selector { source, tag };
        if wait {
            Ok(Some(self.probe_blocking(sel, false)?.status()))
        } else {
            Ok(self.probe_now(sel, false)?.map(|a| a.status()))
        }
    }

    /// `MPI_Mprobe` (blocking) or, with `wait` false, `MPI_Improbe`: the
    /// first message `source` and `tag` match, taken out of matching.
    pub fn matched_probe_raw(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
        wait: bool,
    ) -> Result<Option<(Message, Status)>> {
        let sel = Selector { source, tag };
        let found = if wait {
            Some(self.probe_blocking(sel, true)?)
        } else {
            self.probe_now(sel, true)?
        };
        Ok(found.map(|a| self.matched(a)))
    }
}

impl Message {
    /// `MPI_Mrecv` into a raw buffer.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn matched_receive_raw(
        mut self,
        buf: *mut c_void,
        count: u64,
        dtype: Datatype,
    ) -> Result<Status> {
        let b = self.comm().raw_buffer(buf, count, dtype, "receive")?;
        let id = self.start(b)?;
        self.comm().p2p_wait(id)
    }

    /// `MPI_Imrecv` into a raw buffer.
    ///
    /// # Safety
    /// See the [module's safety contract](self).
    pub unsafe fn immediate_matched_receive_raw(
        mut self,
        buf: *mut c_void,
        count: u64,
        dtype: Datatype,
    ) -> Result<RawMessageRequest> {
        let b = self.comm().raw_buffer(buf, count, dtype, "receive")?;
        let id = self.start(b)?;
        Ok(RawMessageRequest::new(self.comm(), id))
    }
}
