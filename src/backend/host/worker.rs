//! The per-communicator executor thread and launch completion.
//!
//! With `MPI_THREAD_MULTIPLE`, launches are queued to one worker thread per
//! communicator that runs them in submission order; the caller gets a
//! [`Pending`] it can wait on or test. Without it, launches run inside
//! `submit` on the caller's thread and complete before it returns.

use crate::backend::{Launch, PendingWork};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// The outcome of one launch, set once.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    state: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl Completion {
    fn lock(&self) -> MutexGuard<'_, Option<Result<()>>> {
        // The state is a plain Option: still meaningful after a panic elsewhere.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record the result (the first one wins) and wake waiters.
    pub(crate) fn finish(&self, result: Result<()>) {
        let mut g = self.lock();
        if g.is_none() {
            *g = Some(result);
            self.cv.notify_all();
        }
    }
}

/// A handle on a launch's completion.
#[derive(Debug)]
pub(crate) struct Pending(Arc<Completion>);

impl Pending {
    /// Work that has already completed with `result`.
    pub(crate) fn ready(result: Result<()>) -> Pending {
        let c = Completion::default();
        c.finish(result);
        Pending(Arc::new(c))
    }
}

impl PendingWork for Pending {
    fn wait(&mut self) -> Result<()> {
        let mut g = self.0.lock();
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.0.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn test(&mut self) -> Result<bool> {
        match self.0.lock().as_ref() {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e.clone()),
        }
    }
}

/// A queued launch. Dropping it unfinished (the worker died) completes it
/// with an error so no waiter hangs.
struct Job {
    launch: Launch,
    done: Arc<Completion>,
}

impl Drop for Job {
    fn drop(&mut self) {
        self.done.finish(Err(Error::Backend(
            "the host backend's worker thread stopped before running this launch".into(),
        )));
    }
}

/// The executor thread of one communicator.
pub(crate) struct Worker {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    handle: Option<JoinHandle<()>>,
    /// Launches queued or running on the thread.
    inflight: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

impl Worker {
    /// Start a thread that runs every submitted launch with `run`, in order.
    pub(crate) fn spawn<R>(name: String, run: R) -> Result<Worker>
    where
        R: Fn(&Launch) -> Result<()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job>();
        let inflight = Arc::new(AtomicUsize::new(0));
        let counter = inflight.clone();
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&job.launch)))
                            .unwrap_or_else(|_| {
                                Err(Error::Backend(
                                    "the host backend's executor panicked".into(),
                                ))
                            });
                    job.done.finish(r);
                    counter.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| Error::System {
                call: "thread spawn",
                message: e.to_string(),
            })?;
        Ok(Worker {
            tx: Mutex::new(Some(tx)),
            handle: Some(handle),
            inflight,
        })
    }

    /// Whether nothing is queued or running (so the caller may run a
    /// launch itself without overtaking earlier ones).
    pub(crate) fn idle(&self) -> bool {
        self.inflight.load(Ordering::Acquire) == 0
    }

    /// Queue a launch.
    pub(crate) fn submit(&self, launch: Launch) -> Result<Pending> {
        let done = Arc::new(Completion::default());
        let job = Job {
            launch,
            done: done.clone(),
        };
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        match tx.as_ref() {
            Some(tx) => {
                self.inflight.fetch_add(1, Ordering::AcqRel);
                tx.send(job).map_err(|_| {
                    Error::Backend("the host backend's worker thread has stopped".into())
                })?
            }
            None => return Err(Error::Backend("the host backend is shutting down".into())),
        }
        Ok(Pending(done))
    }

    /// Let the worker finish the queued launches, then join it.
    pub(crate) fn stop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(h) = self.handle.take() {
            if h.join().is_err() {
                tracing::warn!("the host backend's worker thread panicked");
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn empty_launch(seq: u64) -> Launch {
        Launch {
            first_seq: seq,
            stream: None,
            items: Vec::new(),
        }
    }

    #[test]
    fn launches_run_in_order_and_complete() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let w = Worker::spawn("test-worker".into(), move |l: &Launch| {
            std::thread::sleep(Duration::from_millis(2));
            o.lock().unwrap().push(l.first_seq);
            if l.first_seq == 3 {
                Err(Error::Aborted)
            } else {
                Ok(())
            }
        })
        .unwrap();
        let mut pend: Vec<Pending> = (0..5).map(|s| w.submit(empty_launch(s)).unwrap()).collect();
        for (s, p) in pend.iter_mut().enumerate() {
            let r = p.wait();
            assert_eq!(r.is_err(), s == 3);
            assert_eq!(p.test().is_err(), s == 3);
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn test_is_nonblocking_and_panics_become_errors() {
        let gate = Arc::new(AtomicUsize::new(0));
        let g = gate.clone();
        let mut w = Worker::spawn("test-worker".into(), move |l: &Launch| {
            while g.load(Ordering::Acquire) == 0 {
                std::thread::yield_now();
            }
            if l.first_seq == 1 {
                panic!("boom");
            }
            Ok(())
        })
        .unwrap();
        let mut a = w.submit(empty_launch(0)).unwrap();
        let mut b = w.submit(empty_launch(1)).unwrap();
        assert!(!a.test().unwrap());
        gate.store(1, Ordering::Release);
        a.wait().unwrap();
        assert!(matches!(b.wait(), Err(Error::Backend(_))));
        w.stop();
        assert!(w.submit(empty_launch(2)).is_err());
        assert!(Pending::ready(Ok(())).test().unwrap());
    }
}
