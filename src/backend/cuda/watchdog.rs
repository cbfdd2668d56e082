//! The watchdog of work queued on callers' streams (`Backend::enqueue`):
//! a thread (started with the first such launch) polls each one, as `wait`
//! would, until it completed: it releases its resources then, and turns "no
//! progress for `GPUCOLL_TIMEOUT` once the stream reached the work" into a
//! timeout that raises the abort word (so the kernels leave) and fails the
//! communicator. The first error is kept for `async_error`.

use super::driver;
use super::memory::bind;
use super::pending::CudaPending;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Sleep between rounds of polls while stream work is in flight.
const WATCH_POLL: Duration = Duration::from_micros(500);

#[derive(Default)]
struct Watch {
    queue: Mutex<Vec<CudaPending>>,
    wake: Condvar,
    /// Whether the thread waits on `wake` (read and written under the
    /// queue lock): a push wakes it only then, since a notify costs a
    /// system call on every queued call otherwise.
    idle: AtomicBool,
    stop: AtomicBool,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// The watchdog thread and its queue. Dropping it stops the thread once the
/// queue drained (or leaks what never completes) and joins it.
#[derive(Default)]
pub(super) struct Watchdog {
    watch: Arc<Watch>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watch {
    fn record(&self, e: Error) {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            tracing::error!("collective queued on a CUDA stream failed: {e}");
            *g = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn run(&self, ordinal: i32, give_up_after: Duration) {
        // This thread frees memory and queries events while the program may
        // be capturing a stream in global mode on another thread: in relaxed
        // mode those calls neither fail nor invalidate that capture.
        let _relaxed = driver::RelaxedCapture::enter().ok();
        let mut bound = false;
        let mut stopping: Option<Instant> = None;
        // Work taken off the queue, oldest first; polled without the queue
        // lock, so that queuing more (the program's launching thread) never
        // waits for a round of event queries (1.3 µs each).
        let mut work: Vec<CudaPending> = Vec::new();
        loop {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            while work.is_empty() && q.is_empty() && !self.stop.load(Ordering::Acquire) {
                self.idle.store(true, Ordering::Relaxed);
                q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                self.idle.store(false, Ordering::Relaxed);
            }
            work.append(&mut q);
            drop(q);
            if work.is_empty() {
                return;
            }
            if !bound {
                bound = bind(ordinal).is_ok();
            }
            if let Some(e) = poll_in_order(&mut work, bound) {
                self.record(e);
            }
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if self.stop.load(Ordering::Acquire) && !(q.is_empty() && work.is_empty()) {
                let t = *stopping.get_or_insert_with(Instant::now);
                if t.elapsed() > give_up_after {
                    // The caller's stream never reached (or never finished)
                    // this work: leak it rather than free memory under it.
                    tracing::warn!(
                        pending = q.len() + work.len(),
                        "CUDA backend dropped with stream work that never completed; leaking it"
                    );
                    for p in work.drain(..).chain(q.drain(..)) {
                        std::mem::forget(p);
                    }
                    return;
                }
            }
            let busy = !(q.is_empty() && work.is_empty());
            drop(q);
            if busy {
                std::thread::sleep(WATCH_POLL);
            }
        }
    }
}

/// Poll `work` (oldest first), dropping what finished; returns the first
/// error. Work on one stream finishes in queue order, so once an item of a
/// stream is still running the later ones of that stream are not queried
/// (one event query per stream and round instead of one per item).
fn poll_in_order(work: &mut Vec<CudaPending>, bound: bool) -> Option<Error> {
    let mut running: Vec<usize> = Vec::new();
    let mut first = None;
    work.retain_mut(|p| {
        if running.contains(&p.stream) {
            return true;
        }
        match p.poll(bound) {
            None => {
                running.push(p.stream);
                true
            }
            Some(Ok(())) => false,
            Some(Err(e)) => {
                first.get_or_insert(e);
                false
            }
        }
    });
    first
}

impl Watchdog {
    /// Start the thread, once. `give_up_after`: how long, once the backend
    /// is dropped, it waits for work that never completes.
    pub(super) fn start(&self, rank: usize, ordinal: i32, give_up_after: Duration) -> Result<()> {
        let mut g = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some() {
            return Ok(());
        }
        let w = self.watch.clone();
        let h = std::thread::Builder::new()
            .name(format!("gpucoll-cuda-watch-{rank}"))
            .spawn(move || w.run(ordinal, give_up_after))
            .map_err(|e| Error::System {
                call: "thread spawn (CUDA stream watchdog)",
                message: e.to_string(),
            })?;
        *g = Some(h);
        Ok(())
    }

    /// Watch `p` until it completed.
    pub(super) fn push(&self, p: CudaPending) {
        let mut q = self.watch.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.push(p);
        let idle = self.watch.idle.load(Ordering::Relaxed);
        drop(q);
        if idle {
            self.watch.wake.notify_one();
        }
    }

    /// The first failure of watched work, if any.
    pub(super) fn error(&self) -> Option<Error> {
        if !self.watch.failed.load(Ordering::Acquire) {
            return None;
        }
        self.watch
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let _q = self.watch.queue.lock().unwrap_or_else(|p| p.into_inner());
            self.watch.stop.store(true, Ordering::Release);
        }
        self.watch.wake.notify_all();
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
