//! The NET proxy thread: runs the [`Proxy`] state machine over MPI, stops
//! touching the FIFOs once the abort word is raised, and at teardown
//! cancels what it posted (leaking the NET block if MPI might still use it).

use super::{MpiRails, NetLayout, NetMem, Proxy, RailJob, RailJobs, CANCEL_WAIT};
use crate::backend::cuda::memory::PinnedMem;
use crate::backend::cuda::shm::Segment;
use crate::backend::shared::failure::NodeSegments;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The proxy spins (no yield, no sleep) this long after the last piece moved.
const SPIN: Duration = Duration::from_micros(50);
/// While a launch is in flight, it then yields this long before it sleeps.
const YIELD: Duration = Duration::from_millis(20);
/// Sleep between polls when idle.
const IDLE_SLEEP: Duration = Duration::from_micros(50);
/// After this long with no launch in flight and no send pending, the proxy
/// parks up to [`DEEP_IDLE_SLEEP`] between polls (a new launch or `stop`
/// unparks it at once), so an idle communicator costs almost no CPU.
const DEEP_IDLE: Duration = Duration::from_millis(100);
const DEEP_IDLE_SLEEP: Duration = Duration::from_millis(1);
/// Sleep between checks of the stop flag once the backend failed.
const HALTED_SLEEP: Duration = Duration::from_millis(1);

/// State shared by the proxy thread and the backend.
#[derive(Debug, Default)]
pub(crate) struct NetShared {
    stop: AtomicBool,
    /// Launches in flight: the proxy polls eagerly while any is.
    active: AtomicUsize,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// Counts a launch as in flight until dropped.
#[derive(Debug)]
pub(crate) struct ActiveGuard(Arc<NetShared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The memory of a NET block.
#[derive(Debug)]
pub(crate) enum NetBlock {
    /// Pinned and device-mapped (the backend).
    Pinned(PinnedMem),
    /// Plain host memory (tests on machines without a GPU).
    #[cfg(test)]
    Host(Vec<u64>),
}

impl NetBlock {
    fn host(&mut self) -> *mut u8 {
        match self {
            NetBlock::Pinned(m) => m.host,
            #[cfg(test)]
            NetBlock::Host(v) => v.as_mut_ptr() as *mut u8,
        }
    }
    fn bytes(&self) -> usize {
        match self {
            NetBlock::Pinned(m) => m.bytes,
            #[cfg(test)]
            NetBlock::Host(v) => v.len() * 8,
        }
    }
}

/// The NET transport of one backend: the block and the proxy thread.
pub(crate) struct NetProxy {
    shared: Arc<NetShared>,
    thread: Option<JoinHandle<bool>>,
    /// The NET block; `None` once freed or leaked.
    block: Option<NetBlock>,
    /// The rails' jobs queue, when the layout has rails.
    rail_jobs: Option<Arc<RailJobs>>,
    rank: usize,
}

impl std::fmt::Debug for NetProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetProxy")
            .field("rank", &self.rank)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

/// A zeroed NET block for `layout` and its device address.
pub(crate) fn alloc_block(layout: &NetLayout) -> Result<(NetBlock, u64)> {
    let bytes =
        usize::try_from(layout.total().max(8)).map_err(|_| Error::CountTooLarge(layout.total()))?;
    let mem = PinnedMem::alloc(bytes)?;
    // SAFETY: the allocation holds `bytes` bytes; nothing else uses it yet.
    unsafe { std::ptr::write_bytes(mem.host, 0, bytes) };
    let dev = crate::backend::cuda::driver::host_device_pointer(mem.host)?;
    Ok((NetBlock::Pinned(mem), dev))
}

impl NetProxy {
    /// Start the proxy thread over `comm` (a private duplicate). `segs` are
    /// the node's control segments, ours at `local_rank`; `rails`: one
    /// rail communicator per channel when the layout has rails.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        comm: MpiComm,
        rails: Vec<MpiComm>,
        layout: NetLayout,
        mut block: NetBlock,
        segs: Vec<Arc<Segment>>,
        local_rank: usize,
        rank: usize,
    ) -> Result<NetProxy> {
        let host = block.host();
        if (block.bytes() as u64) < layout.total() || host.align_offset(8) != 0 {
            return Err(Error::Backend("NET block smaller than its layout".into()));
        }
        // SAFETY: the block is 8-aligned, holds `total` bytes, was zeroed by
        // `alloc_block`, and outlives the thread (joined before it is freed;
        // moving a `NetBlock` does not move its memory).
        let mem = unsafe { NetMem::new(host, block.bytes() as u64) };
        if layout.rail && rails.len() != layout.channels as usize {
            return Err(Error::Backend(format!(
                "{} rail communicators for {} channels",
                rails.len(),
                layout.channels
            )));
        }
        let rail_jobs = layout
            .rail
            .then(|| Arc::new(RailJobs::new(layout.channels as usize)));
        let net_rails = rail_jobs
            .clone()
            .map(|jobs| (Box::new(MpiRails(rails)) as Box<dyn super::RailNet>, jobs));
        // SAFETY: as above.
        let proxy = unsafe { Proxy::new(comm, layout, mem, net_rails) };
        let shared = Arc::new(NetShared::default());
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gpucoll-net-{rank}"))
            .spawn(move || run(proxy, sh, segs, local_rank, rank))
            .map_err(|e| Error::System {
                call: "thread spawn",
                message: format!("NET proxy: {e}"),
            })?;
        Ok(NetProxy {
            shared,
            thread: Some(thread),
            block: Some(block),
            rail_jobs,
            rank,
        })
    }

    /// The proxy's failure, if it failed.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        self.shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Queue a launch's rail steps, `(channel, job)` in step order, before
    /// its kernels are launched.
    pub(crate) fn push_rail_jobs(&self, jobs: &[(usize, RailJob)]) -> Result<()> {
        match &self.rail_jobs {
            Some(q) => q.push(jobs),
            None if jobs.is_empty() => Ok(()),
            None => Err(Error::Backend(
                "rail steps on a communicator without rails".into(),
            )),
        }
    }

    /// Mark a launch in flight until the guard drops.
    pub(crate) fn begin(&self) -> ActiveGuard {
        self.shared.active.fetch_add(1, Ordering::AcqRel);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        ActiveGuard(self.shared.clone())
    }

    /// Stop the thread and cancel its requests; free the block only if MPI
    /// no longer uses it (leak it otherwise), and say whether it was freed.
    /// Call after every rank's kernels are done (or the communicator
    /// failed). Idempotent.
    pub(crate) fn stop(&mut self) -> bool {
        self.shared.stop.store(true, Ordering::Release);
        let clean = match self.thread.take() {
            Some(t) => {
                t.thread().unpark();
                t.join().unwrap_or(false)
            }
            None => true,
        };
        if !clean {
            if let Some(b) = self.block.take() {
                tracing::warn!(
                    rank = self.rank,
                    bytes = b.bytes(),
                    "NET proxy: MPI requests could not be cancelled; leaking the NET block"
                );
                std::mem::forget(b);
            }
        }
        self.block = None;
        clean
    }
}

impl Drop for NetProxy {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The proxy thread; returns whether every request was retired cleanly.
fn run(
    mut proxy: Proxy<MpiComm>,
    shared: Arc<NetShared>,
    segs: Vec<Arc<Segment>>,
    local_rank: usize,
    rank: usize,
) -> bool {
    let Some(own) = segs.get(local_rank).cloned() else {
        return proxy.shutdown(CANCEL_WAIT);
    };
    let mut idle_since = Instant::now();
    let mut was_busy = false;
    let mut halted = false;
    while !shared.stop.load(Ordering::Acquire) {
        if !halted && own.abort_word() != 0 {
            // The backend failed or was aborted: leave the FIFOs alone.
            tracing::debug!(rank, "NET proxy: abort word raised; halting");
            halted = true;
        }
        if halted {
            std::thread::sleep(HALTED_SLEEP);
            continue;
        }
        match proxy.progress() {
            Ok(true) => {
                idle_since = Instant::now();
                continue;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(rank, "NET proxy failed: {e}");
                let reason = e.to_string();
                {
                    let mut slot = shared.error.lock().unwrap_or_else(|p| p.into_inner());
                    if slot.is_none() {
                        *slot = Some(e);
                    }
                }
                shared.failed.store(true, Ordering::Release);
                // Our reason, then every local abort word: this node's
                // kernels leave (they poll it).
                let node = NodeSegments {
                    segs: &segs,
                    local_rank,
                    rank,
                };
                node.publish(&reason);
                halted = true;
                continue;
            }
        }
        // Busy: a launch is in flight or a send is pending; a launch that
        // just began restarts the spin and yield phases.
        let busy = shared.active.load(Ordering::Acquire) > 0 || proxy.sending();
        if busy && !was_busy {
            idle_since = Instant::now();
        }
        was_busy = busy;
        let idle = idle_since.elapsed();
        if idle < SPIN {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        } else if busy && idle < YIELD {
            std::thread::yield_now();
        } else if !busy && idle >= DEEP_IDLE {
            std::thread::park_timeout(DEEP_IDLE_SLEEP);
        } else {
            std::thread::sleep(IDLE_SLEEP);
        }
    }
    proxy.shutdown(CANCEL_WAIT)
}
