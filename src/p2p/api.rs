//! The typed API: sends and receives on [`Process`], receives from any
//! source on [`AnyProcess`], matched probes ([`Message`]) and
//! [`Communicator::send_receive_into`], in rsmpi's shape. Sends without a
//! tag use tag 0; receives and probes without one take any tag.

use super::ctx::Arrived;
use super::recv::{Selector, Sink};
use super::request::{scoped, ReceiveRequest};
use super::Status;
use crate::buffer::{Buffer, BufferMut, RawBuffer};
use crate::coll::Process;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::request::{Request, Scope};

impl Communicator {
    /// Every rank of the communicator as the source of a receive or probe
    /// (`MPI_ANY_SOURCE`).
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// if world.rank() == 0 {
    ///     for _ in 1..world.size() {
    ///         let mut report = [0u64; 4];
    ///         let status = world.any_process().receive_into(&mut report)?;
    ///         println!("rank {} reported {:?}", status.source_rank(), report);
    ///     }
    /// } else {
    ///     world.process_at_rank(0).send(&[world.rank() as u64; 4])?;
    /// }
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn any_process(&self) -> AnyProcess<'_> {
        AnyProcess { comm: self }
    }

    /// `MPI_Sendrecv`: send `send` to `dest` (tag 0) and receive into
    /// `recv` from `source` (any tag), both at once, so that a ring of
    /// ranks exchanging this way never deadlocks.
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let n = world.size();
    /// let right = world.process_at_rank((world.rank() + 1) % n);
    /// let left = world.process_at_rank((world.rank() + n - 1) % n);
    /// let mut got = 0u32;
    /// world.send_receive_into(&(world.rank() as u32), &right, &mut got, &left)?;
    /// assert_eq!(got as usize, left.rank());
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn send_receive_into<S, R>(
        &self,
        send: &S,
        dest: &Process<'_>,
        recv: &mut R,
        source: &impl Source,
    ) -> Result<Status>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.exchange(
            send.raw(),
            dest.rank(),
            0,
            recv.raw_mut(),
            selector_of(source, None),
        )
    }

    /// [`send_receive_into`](Self::send_receive_into) with the send's tag
    /// and the tag the receive takes.
    pub fn send_receive_into_with_tags<S, R>(
        &self,
        send: &S,
        dest: &Process<'_>,
        send_tag: i32,
        recv: &mut R,
        source: &impl Source,
        recv_tag: i32,
    ) -> Result<Status>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let sel = selector_of(source, Some(recv_tag));
        self.exchange(send.raw(), dest.rank(), send_tag, recv.raw_mut(), sel)
    }

    /// Post the receive, start the send, wait for both.
    pub(super) fn exchange(
        &self,
        send: RawBuffer,
        dest: usize,
        send_tag: i32,
        recv: RawBuffer,
        sel: Selector,
    ) -> Result<Status> {
        let rid = self.start_recv(recv, sel)?;
        let sid = match self.start_send(send, dest, send_tag) {
            Ok(id) => id,
            Err(e) => {
                // Nothing was sent: the receive must not stay posted.
                if !self.p2p()?.cancel_unmatched(rid) {
                    let _ = self.p2p_wait(rid);
                }
                return Err(e);
            }
        };
        let sent = self.p2p_wait(sid);
        let received = self.p2p_wait(rid);
        sent?;
        received
    }

    /// Check a send's arguments and start it.
    pub(crate) fn start_send(&self, buf: RawBuffer, dest: usize, tag: i32) -> Result<u64> {
        let shared = self.p2p()?;
        self.check_rank(dest)?;
        check_tag(tag, shared.ctx.wire.tag_ub)?;
        self.check_buffer(&buf)?;
        self.p2p_check()?;
        shared.start_send(buf, dest, tag)
    }

    /// Check a receive's arguments and post it.
    pub(crate) fn start_recv(&self, buf: RawBuffer, sel: Selector) -> Result<u64> {
        let shared = self.p2p()?;
        self.check_selector(sel)?;
        self.check_buffer(&buf)?;
        self.p2p_check()?;
        shared.post_recv(sel, Sink::of(&buf))
    }

    pub(crate) fn check_selector(&self, sel: Selector) -> Result<()> {
        if let Some(s) = sel.source {
            self.check_rank(s)?;
        }
        if let Some(t) = sel.tag {
            check_tag(t, self.p2p()?.ctx.wire.tag_ub)?;
        }
        Ok(())
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::InvalidRank {
                rank,
                size: self.size(),
            });
        }
        Ok(())
    }

    fn check_buffer(&self, buf: &RawBuffer) -> Result<()> {
        if buf.len == 0 {
            return Ok(());
        }
        self.inner_checked()?.engine.check_memory(buf.memory)
    }

    /// A blocking probe for `sel` (matched: the envelope is taken).
    pub(crate) fn probe_blocking(&self, sel: Selector, take: bool) -> Result<Arrived> {
        self.check_selector(sel)?;
        self.p2p_block(|s| s.probe(sel, take))
    }

    /// A probe for `sel` that does not wait.
    pub(crate) fn probe_now(&self, sel: Selector, take: bool) -> Result<Option<Arrived>> {
        self.check_selector(sel)?;
        self.p2p_check()?;
        self.p2p()?.probe(sel, take)
    }

    pub(super) fn matched(&self, a: Arrived) -> (Message, Status) {
        let st = a.status();
        (
            Message {
                comm: self.clone(),
                arrived: Some(a),
            },
            st,
        )
    }
}

fn check_tag(tag: i32, max: i32) -> Result<()> {
    if !(0..=max).contains(&tag) {
        return Err(Error::InvalidTag { tag, max });
    }
    Ok(())
}

/// Where a receive takes messages from: a [`Process`] (one rank) or the
/// [`AnyProcess`] (any rank), for
/// [`Communicator::send_receive_into`].
pub trait Source: sealed::Sealed {
    /// The rank messages are taken from (None: any rank).
    #[doc(hidden)]
    fn source_rank_or_any(&self) -> Option<usize>;
}

/// The selector of `source` with `tag` (None: any tag).
fn selector_of<S: Source + ?Sized>(source: &S, tag: Option<i32>) -> Selector {
    Selector {
        source: source.source_rank_or_any(),
        tag,
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::coll::Process<'_> {}
    impl Sealed for super::AnyProcess<'_> {}
}

impl Source for Process<'_> {
    fn source_rank_or_any(&self) -> Option<usize> {
        Some(self.rank())
    }
}

impl Source for AnyProcess<'_> {
    fn source_rank_or_any(&self) -> Option<usize> {
        None
    }
}

/// Receives and probes shared by [`Process`] and [`AnyProcess`].
macro_rules! receives {
    () => {
        /// `MPI_Recv` with any tag: block until a message arrived in `buf`.
        /// A longer message ends in [`Error::Truncated`] after its first
        /// bytes; a shorter one fills the start of `buf` (see the status).
        pub fn receive_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<Status> {
            self.receive_raw_sel(buf.raw_mut(), selector_of(self, None))
        }

        /// [`receive_into`](Self::receive_into) of a message with `tag`.
        pub fn receive_into_with_tag<B: BufferMut + ?Sized>(
            &self,
            buf: &mut B,
            tag: i32,
        ) -> Result<Status> {
            self.receive_raw_sel(buf.raw_mut(), selector_of(self, Some(tag)))
        }

        /// `MPI_Irecv` with any tag: `buf` is borrowed until the scope ends.
        pub fn immediate_receive_into<'a, B: BufferMut + ?Sized>(
            &self,
            scope: &Scope<'a>,
            buf: &'a mut B,
        ) -> Result<ReceiveRequest<'a>> {
            self.immediate_sel(scope, buf.raw_mut(), selector_of(self, None))
        }

        /// [`immediate_receive_into`](Self::immediate_receive_into) of a
        /// message with `tag`.
        pub fn immediate_receive_into_with_tag<'a, B: BufferMut + ?Sized>(
            &self,
            scope: &Scope<'a>,
            buf: &'a mut B,
            tag: i32,
        ) -> Result<ReceiveRequest<'a>> {
            self.immediate_sel(scope, buf.raw_mut(), selector_of(self, Some(tag)))
        }

        /// `MPI_Probe` with any tag: block until a message is there; it
        /// stays there for a receive.
        pub fn probe(&self) -> Result<Status> {
            let comm = self.comm();
            Ok(comm
                .probe_blocking(selector_of(self, None), false)?
                .status())
        }

        /// [`probe`](Self::probe) for a message with `tag`.
        pub fn probe_with_tag(&self, tag: i32) -> Result<Status> {
            let comm = self.comm();
            Ok(comm
                .probe_blocking(selector_of(self, Some(tag)), false)?
                .status())
        }

        /// `MPI_Iprobe` with any tag: a message's status if one is there.
        pub fn immediate_probe(&self) -> Result<Option<Status>> {
            let comm = self.comm();
            Ok(comm
                .probe_now(selector_of(self, None), false)?
                .map(|a| a.status()))
        }

        /// [`immediate_probe`](Self::immediate_probe) for a message with `tag`.
        pub fn immediate_probe_with_tag(&self, tag: i32) -> Result<Option<Status>> {
            let comm = self.comm();
            Ok(comm
                .probe_now(selector_of(self, Some(tag)), false)?
                .map(|a| a.status()))
        }

        /// `MPI_Mprobe` with any tag: block until a message is there and
        /// take it out of matching; only its [`Message`] receives it.
        pub fn matched_probe(&self) -> Result<(Message, Status)> {
            let comm = self.comm();
            let a = comm.probe_blocking(selector_of(self, None), true)?;
            Ok(comm.matched(a))
        }

        /// [`matched_probe`](Self::matched_probe) for a message with `tag`.
        pub fn matched_probe_with_tag(&self, tag: i32) -> Result<(Message, Status)> {
            let comm = self.comm();
            let a = comm.probe_blocking(selector_of(self, Some(tag)), true)?;
            Ok(comm.matched(a))
        }

        /// `MPI_Improbe` with any tag.
        pub fn immediate_matched_probe(&self) -> Result<Option<(Message, Status)>> {
            let comm = self.comm();
            Ok(comm
                .probe_now(selector_of(self, None), true)?
                .map(|a| comm.matched(a)))
        }

        /// [`immediate_matched_probe`](Self::immediate_matched_probe) for a
        /// message with `tag`.
        pub fn immediate_matched_probe_with_tag(
            &self,
            tag: i32,
        ) -> Result<Option<(Message, Status)>> {
            let comm = self.comm();
            Ok(comm
                .probe_now(selector_of(self, Some(tag)), true)?
                .map(|a| comm.matched(a)))
        }

        fn receive_raw_sel(&self, buf: RawBuffer, sel: Selector) -> Result<Status> {
            let comm = self.comm();
            let id = comm.start_recv(buf, sel)?;
            comm.p2p_wait(id)
        }

        fn immediate_sel<'a>(
            &self,
            scope: &Scope<'a>,
            buf: RawBuffer,
            sel: Selector,
        ) -> Result<ReceiveRequest<'a>> {
            let comm = self.comm();
            let id = comm.start_recv(buf, sel)?;
            let (req, status) = scoped(comm, scope, id);
            Ok(ReceiveRequest::new(req, status))
        }
    };
}

impl<'c> Process<'c> {
    /// `MPI_Send` with tag 0: send `buf` to this rank. Returns once `buf`
    /// may be reused: at once for host messages up to 16 KiB (and device
    /// ones up to `GPUCOLL_P2P_EAGER`), else once the receiver took it or
    /// MPI buffered it (the [module's](crate::p2p) design says which).
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// // Device buffers too, on the CUDA backend:
    /// let field = world.alloc_from(&vec![1.5f32; 1 << 20])?;
    /// if world.rank() == 0 {
    ///     world.process_at_rank(1).send(&field)?;
    /// } else if world.rank() == 1 {
    ///     let mut copy = world.alloc::<f32>(1 << 20)?;
    ///     world.process_at_rank(0).receive_into(&mut copy)?;
    /// }
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn send<B: Buffer + ?Sized>(&self, buf: &B) -> Result<()> {
        self.send_with_tag(buf, 0)
    }

    /// [`send`](Self::send) with `tag` (`0..=MPI_TAG_UB`).
    pub fn send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: i32) -> Result<()> {
        let comm = self.comm();
        let id = comm.start_send(buf.raw(), self.rank(), tag)?;
        comm.p2p_wait(id).map(|_| ())
    }

    /// `MPI_Isend` with tag 0: `buf` is borrowed until the scope ends.
    ///
    /// ```no_run
    /// # use gpucoll::prelude::*;
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let next = world.process_at_rank((world.rank() + 1) % world.size());
    /// let prev = world.process_at_rank((world.rank() + world.size() - 1) % world.size());
    /// let out = vec![world.rank() as i32; 100];
    /// let mut inb = vec![0i32; 100];
    /// gpucoll::scope(|s| {
    ///     let r = prev.immediate_receive_into(s, &mut inb)?;
    ///     let w = next.immediate_send(s, &out)?;
    ///     w.wait()?;
    ///     r.wait().map(|_| ())
    /// })?;
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn immediate_send<'a, B: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a B,
    ) -> Result<Request<'a>> {
        self.immediate_send_with_tag(scope, buf, 0)
    }

    /// [`immediate_send`](Self::immediate_send) with `tag`.
    pub fn immediate_send_with_tag<'a, B: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a B,
        tag: i32,
    ) -> Result<Request<'a>> {
        let comm = self.comm();
        let id = comm.start_send(buf.raw(), self.rank(), tag)?;
        Ok(scoped(comm, scope, id).0)
    }

    receives!();
}

/// Any rank of a communicator as the source of receives and probes
/// (`MPI_ANY_SOURCE`), from [`Communicator::any_process`].
#[derive(Clone, Copy)]
pub struct AnyProcess<'c> {
    comm: &'c Communicator,
}

impl<'c> AnyProcess<'c> {
    fn comm(&self) -> &'c Communicator {
        self.comm
    }

    receives!();
}

/// A message taken out of matching by a matched probe (`MPI_Mprobe`):
/// only this value can receive it, so another thread's receive cannot
/// take it between the probe and the receive. Dropping it unreceived
/// takes and drops its bytes (its sender completes).
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// // Receive a message of unknown length.
/// let (msg, status) = world.any_process().matched_probe()?;
/// let mut buf = vec![0f32; status.count(Datatype::F32).unwrap_or(0) as usize];
/// msg.matched_receive_into(&mut buf)?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub struct Message {
    comm: Communicator,
    arrived: Option<Arrived>,
}

impl Message {
    /// The message's status.
    pub fn status(&self) -> Status {
        self.arrived
            .as_ref()
            .map_or_else(Status::sent, Arrived::status)
    }

    fn take(&mut self) -> Result<Arrived> {
        self.arrived
            .take()
            .ok_or_else(|| Error::InvalidUsage("the message was received already".into()))
    }

    /// Start receiving it into `buf` (checked first; an error leaves the
    /// message to this value).
    pub(super) fn start(&mut self, buf: RawBuffer) -> Result<u64> {
        if buf.len > 0 {
            self.comm.inner_checked()?.engine.check_memory(buf.memory)?;
        }
        self.comm.p2p_check()?;
        let a = self.take()?;
        self.comm.p2p()?.start_matched(a, Sink::of(&buf))
    }

    pub(super) fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// `MPI_Mrecv`: receive the message into `buf`.
    pub fn matched_receive_into<B: BufferMut + ?Sized>(mut self, buf: &mut B) -> Result<Status> {
        let id = self.start(buf.raw_mut())?;
        self.comm.p2p_wait(id)
    }

    /// `MPI_Imrecv`: `buf` is borrowed until the scope ends.
    pub fn immediate_matched_receive_into<'a, B: BufferMut + ?Sized>(
        mut self,
        scope: &Scope<'a>,
        buf: &'a mut B,
    ) -> Result<ReceiveRequest<'a>> {
        let id = self.start(buf.raw_mut())?;
        let (req, status) = scoped(&self.comm, scope, id);
        Ok(ReceiveRequest::new(req, status))
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        if let Some(a) = self.arrived.take() {
            if let Ok(shared) = self.comm.p2p() {
                shared.discard(a);
            }
        }
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("status", &self.status())
            .finish()
    }
}
