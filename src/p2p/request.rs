//! Waiting for messages: the loop every wait runs (pump, check the
//! communicator's failure and the node's peers, back off), and the
//! requests of immediate sends and receives in a [`Scope`].

use super::state::P2pShared;
use super::Status;
use crate::backend::PendingWork;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::request::{Request, Scope};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Poll back-off: spin first (a small message's answer takes
/// microseconds), then yield, then sleep in short steps.
pub(super) fn backoff(polls: u32) {
    if polls < 4096 {
        std::hint::spin_loop();
    } else if polls < 16384 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

impl Communicator {
    pub(crate) fn p2p(&self) -> Result<&Arc<P2pShared>> {
        Ok(&self.inner_checked()?.p2p)
    }

    /// Whether messages may go on: the communicator's failure (an abort,
    /// a failed collective), or a dead or failed local peer, recorded.
    pub(crate) fn p2p_check(&self) -> Result<()> {
        self.inner_checked()?.engine.p2p_check()
    }

    /// `e`, recorded: a fatal error fails the communicator.
    fn p2p_fail(&self, e: Error) -> Error {
        if let Ok(inner) = self.inner_checked() {
            inner.engine.record(&e);
        }
        e
    }

    /// An op's result; a fatal error fails the communicator.
    fn p2p_result(&self, r: Result<Status>) -> Result<Status> {
        r.map_err(|e| self.p2p_fail(e))
    }

    /// Poll `f` (which pumps) until it gives something, checking for
    /// failures as it goes.
    pub(crate) fn p2p_block<T>(
        &self,
        mut f: impl FnMut(&P2pShared) -> Result<Option<T>>,
    ) -> Result<T> {
        let shared = self.p2p()?.clone();
        let mut polls = 0u32;
        loop {
            match f(&shared) {
                Ok(Some(t)) => return Ok(t),
                Ok(None) => {}
                Err(e) => return Err(self.p2p_fail(e)),
            }
            polls = polls.wrapping_add(1);
            if polls % P2pShared::others_every() == 0 {
                shared.pump_others();
                self.p2p_check()?;
            }
            backoff(polls);
        }
    }

    /// Block until op `id` finished.
    pub(crate) fn p2p_wait(&self, id: u64) -> Result<Status> {
        let r = self.p2p_block(|s| s.poll(id))?;
        self.p2p_result(r)
    }

    /// One poll of op `id`: its result once it finished.
    pub(crate) fn p2p_test(&self, id: u64) -> Result<Option<Status>> {
        self.p2p_check()?;
        match self.p2p()?.poll(id) {
            Ok(None) => Ok(None),
            Ok(Some(r)) => self.p2p_result(r).map(Some),
            Err(e) => self.p2p_result(Err(e)).map(Some),
        }
    }
}

/// An op in a scope: the scope waits for it before it ends.
struct ScopedOp {
    comm: Communicator,
    id: u64,
    status: Arc<Mutex<Option<Status>>>,
    finished: bool,
}

impl ScopedOp {
    fn store(&mut self, r: Result<Status>) -> Result<()> {
        self.finished = true;
        let st = r?;
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = Some(st);
        Ok(())
    }
}

impl PendingWork for ScopedOp {
    fn wait(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        let r = self.comm.p2p_wait(self.id);
        self.store(r)
    }

    fn test(&mut self) -> Result<bool> {
        if self.finished {
            return Ok(true);
        }
        match self.comm.p2p_test(self.id) {
            Ok(None) => Ok(false),
            Ok(Some(st)) => self.store(Ok(st)).map(|()| true),
            Err(e) => self.store(Err(e)).map(|()| true),
        }
    }
}

/// Register op `id` in `scope`; the slot gets its status.
pub(super) fn scoped<'a>(
    comm: &Communicator,
    scope: &Scope<'a>,
    id: u64,
) -> (Request<'a>, Arc<Mutex<Option<Status>>>) {
    let status = Arc::new(Mutex::new(None));
    let op = ScopedOp {
        comm: comm.clone(),
        id,
        status: status.clone(),
        finished: false,
    };
    (scope.register(Box::new(op)), status)
}

/// An immediate receive in flight: [`wait`](Self::wait) gives its
/// [`Status`]. Turn it into a plain [`Request`] (`.into()`) to wait for it
/// among sends with [`wait_all`](crate::wait_all).
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut halo = vec![0f32; 256];
/// let status = gpucoll::scope(|s| {
///     let req = world.any_process().immediate_receive_into(s, &mut halo)?;
///     // ... compute the interior meanwhile ...
///     req.wait()
/// })?;
/// println!("{} bytes from rank {}", status.bytes(), status.source_rank());
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[must_use = "a request should be waited on or tested to see its result"]
pub struct ReceiveRequest<'a> {
    req: Request<'a>,
    status: Arc<Mutex<Option<Status>>>,
}

impl<'a> ReceiveRequest<'a> {
    pub(super) fn new(req: Request<'a>, status: Arc<Mutex<Option<Status>>>) -> ReceiveRequest<'a> {
        ReceiveRequest { req, status }
    }

    fn status(&self) -> Result<Status> {
        status_of(&self.status)
    }

    /// Block until the message arrived; its status. A message longer than
    /// the buffer ends in [`Error::Truncated`].
    pub fn wait(self) -> Result<Status> {
        let ReceiveRequest { req, status } = self;
        req.wait()?;
        status_of(&status)
    }

    /// The status once the message arrived (`Ok(Some)`, also on later
    /// calls), `Ok(None)` while it has not, or its error.
    pub fn test(&self) -> Result<Option<Status>> {
        if self.req.test()? {
            self.status().map(Some)
        } else {
            Ok(None)
        }
    }
}

fn status_of(slot: &Mutex<Option<Status>>) -> Result<Status> {
    slot.lock()
        .unwrap_or_else(|p| p.into_inner())
        .ok_or_else(|| {
            Error::InvalidUsage("the receive ended in an error, which was reported already".into())
        })
}

impl<'a> From<ReceiveRequest<'a>> for Request<'a> {
    fn from(r: ReceiveRequest<'a>) -> Request<'a> {
        r.req
    }
}
