//! Order across streams: kernels of consecutive submissions share the
//! connectors (FIFO counters), so they must never run concurrently. A
//! submission on another stream than the previous one first waits, on the
//! device, for the previous one. Also the checks of a caller's stream.

use super::driver::{self, CUstream, Capture};
use super::handles::Event;
use super::memory::DeviceCtx;
use crate::error::{Error, Result};

/// The stream of the last submission and the event that marks its end.
#[derive(Default)]
pub(super) struct Order {
    /// Raw handle of the last submission's stream.
    last: Option<u64>,
    /// Recorded after the last submission on a caller's stream (or, when
    /// switching away from our own stream, at the switch).
    event: Option<Event>,
}

impl Order {
    /// The end-of-work event, created on first use.
    fn event(&mut self) -> Result<&Event> {
        let e = match self.event.take() {
            Some(e) => e,
            None => Event::create()?,
        };
        Ok(self.event.insert(e))
    }

    /// Destroy the event (teardown, after the streams synchronized).
    pub(super) fn release(&mut self) {
        drop(self.event.take());
    }
}

/// Check a caller's stream: same context as `ctx`, not in a failed
/// capture. Returns its capture state.
pub(super) fn stream_mode(ctx: &DeviceCtx, s: CUstream) -> Result<Capture> {
    if driver::stream_context(s)? != ctx.ctx {
        return Err(Error::InvalidUsage(format!(
            "the CUDA stream belongs to another context than this communicator's \
             (the primary context of GPU {})",
            ctx.ordinal
        )));
    }
    match driver::stream_capture(s)? {
        Capture::Invalidated => Err(Error::InvalidUsage(
            "the CUDA stream is in an invalidated graph capture; end the capture first".into(),
        )),
        c => Ok(c),
    }
}

impl Order {
    /// Before queuing on `s` (`own`: the backend's stream): if the previous
    /// submission went to another stream, make `s` wait for it on the
    /// device (its kernels use the same connectors). Not used while `s` is
    /// being captured: a replay's order with other collectives of this
    /// communicator is the caller's to keep. Returns whether `s` now waits
    /// for another stream.
    pub(super) fn before(&mut self, s: CUstream, own: CUstream) -> Result<bool> {
        let key = s as usize as u64;
        match self.last {
            Some(prev) if prev != key => {
                let e = self.event()?.raw();
                // Our own stream holds only our work: mark its end now. A
                // caller's stream had the event recorded after our work.
                if prev == own as usize as u64 {
                    driver::event_record(e, own)?;
                }
                driver::stream_wait_event(s, e)?;
                self.last = Some(key);
                Ok(true)
            }
            _ => {
                self.last = Some(key);
                Ok(false)
            }
        }
    }

    /// After queuing on a caller's stream `s`: mark the end of our work
    /// there, for the next submission on another stream to wait on.
    pub(super) fn after(&mut self, s: CUstream) -> Result<()> {
        let e = self.event()?.raw();
        driver::event_record(e, s)
    }
}
