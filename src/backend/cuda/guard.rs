//! The guard of captured work: collectives captured into a CUDA graph run
//! at every replay, which the backend never sees, so no waiting loop looks
//! at the peers while they run. Once a communicator has captured work, a
//! thread looks at the node's other processes every `CHECK_EVERY`; when
//! one died it fails the communicator (the kernels of a replay in flight
//! see the raised abort word and leave) and keeps the error for
//! `async_error`, so a program that only replays graphs learns of it.
//! After a failure it keeps releasing the copy-engine handshakes of
//! replays (their waits have no abort word to see).

use super::state::CudaShared;
use crate::backend::shared::liveness::CHECK_EVERY;
use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

#[derive(Default)]
struct Shared {
    /// Set when the backend is dropped.
    stop: Mutex<bool>,
    wake: Condvar,
    error: Mutex<Option<Error>>,
}

/// The guard thread (started by the first captured submission). Dropping
/// it stops and joins the thread.
#[derive(Default)]
pub(super) struct GraphGuard {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GraphGuard {
    /// Start the thread, once.
    pub(super) fn start(&self, inner: &Arc<CudaShared>) -> Result<()> {
        let mut g = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let inner = inner.clone();
        let h = std::thread::Builder::new()
            .name(format!("gpucoll-cuda-guard-{}", inner.rank))
            .spawn(move || shared.run(&inner))
            .map_err(|e| Error::System {
                call: "thread spawn (CUDA graph guard)",
                message: e.to_string(),
            })?;
        *g = Some(h);
        tracing::debug!("captured work: the graph guard watches the node's peers");
        Ok(())
    }

    /// The failure the guard saw, if any.
    pub(super) fn error(&self) -> Option<Error> {
        self.shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Shared {
    fn run(&self, inner: &CudaShared) {
        let mut stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        while !*stop {
            stop = self
                .wake
                .wait_timeout(stop, CHECK_EVERY)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if *stop {
                return;
            }
            let mut error = self.error.lock().unwrap_or_else(|p| p.into_inner());
            if error.is_none() {
                if let Some(e) = inner.liveness.dead() {
                    // Raises the node's abort words: replayed kernels leave.
                    if inner.mark_failed(e.to_string()) {
                        tracing::warn!(rank = inner.rank, "graph guard: {e}");
                    }
                    *error = Some(e);
                }
            }
            drop(error);
            if inner.own().abort_word() != 0 {
                // Replayed copy-engine handshakes wait for peers that will
                // not come: keep releasing them while replays drain.
                inner.ce_release();
            }
        }
    }
}

impl Drop for GraphGuard {
    fn drop(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(h) = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = h.join();
        }
    }
}
