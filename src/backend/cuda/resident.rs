//! The resident block (`GPUCOLL_RESIDENT`): blocking one-shot calls posted
//! to one block that stays on the GPU between calls, instead of a kernel
//! launched per call.
//!
//! A launch costs 3.2-3.8 µs of host time on H200 and the wait for a
//! launched kernel's end 6.9 µs at best (`bench/results/2026-12-01-h200x2-b180702`);
//! a post is a few stores to pinned host memory that the block polls. The
//! block runs on a non-blocking stream of its own (so the legacy default
//! stream never waits for it), ordered after the communicator's earlier
//! work through [`Order`]; any other submission first asks it to leave
//! ([`Resident::quit`]) and then waits for its end the same way. It also
//! leaves by itself after the linger time without a call, on the abort
//! word, and after a call that stopped. A call posted as it left is taken
//! by a new generation ([`Resident::recover`]): the mailbox records how
//! many calls the last generation took.

use super::abi::{
    resident_dtype, GcOneShotArgs, GcResidentArgs, GcResidentBox, RESIDENT_ARGS_OFF, RESIDENT_LINES,
};
use super::driver::{self, CUstream};
use super::handles::Stream;
use super::launch;
use super::memory::PinnedMem;
use super::module::Kernels;
use super::order::Order;
use crate::datatype::Datatype;
use crate::error::Result;
use std::mem::{offset_of, ManuallyDrop};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Calls split into more logical blocks than this keep their launch: the
/// resident block runs them one after another, which cost more than the
/// launch saves (one H200, 2 ranks under MPS: all_reduce of 8 KiB, 2
/// blocks, 16.4 µs against 14.2 launched; 32 KiB, 8 blocks, 35.0 against
/// 14.3).
const RESIDENT_MAX_GRID: u32 = 1;

/// What the host knows of the generations it launched.
#[derive(Default)]
struct State {
    /// The latest generation launched (0: none yet).
    gen: u64,
    /// Whether that generation may still be waiting for calls.
    running: bool,
    /// Calls posted so far (the last one's number is in its lines).
    posted: u64,
    /// Generations launched for a call found lost (`recover`).
    recovered: u64,
    /// When the last call that could have been posted was submitted.
    last_call: Option<Instant>,
}

/// What launching a generation needs from the backend.
pub(super) struct Launcher<'a> {
    pub kernels: &'a Kernels,
    pub order: &'a Mutex<Order>,
    /// The backend's own stream (its earlier work comes first).
    pub own: CUstream,
    pub abort_word: u64,
}

/// The mailbox, the block's stream and the host's view of it.
pub(super) struct Resident {
    /// Freed in `Drop` unless a block that never left may still read it.
    mailbox: ManuallyDrop<PinnedMem>,
    abandoned: AtomicBool,
    /// The mailbox as the device sees it.
    dev: u64,
    stream: Stream,
    linger: Duration,
    linger_ns: u64,
    /// Whether a post must first find the legacy default stream idle
    /// (`GPUCOLL_LEGACY_STREAM_ORDER`: our calls come after the program's
    /// work there, which a running block would not wait for).
    legacy_order: bool,
    state: Mutex<State>,
}

// SAFETY: the mailbox is plain pinned memory written through volatile
// stores under `state`'s lock; the stream handle is usable from any thread.
unsafe impl Send for Resident {}
// SAFETY: as above.
unsafe impl Sync for Resident {}

impl Resident {
    /// Allocate the mailbox and the stream (in the current context).
    pub(super) fn create(linger: Duration, legacy_order: bool) -> Result<Resident> {
        let bytes = (RESIDENT_ARGS_OFF + RESIDENT_LINES * 16) as usize;
        let mailbox = PinnedMem::alloc(bytes)?;
        // SAFETY: `mailbox` is `bytes` of pinned memory owned here.
        unsafe { std::ptr::write_bytes(mailbox.host, 0, bytes) };
        let dev = driver::host_device_pointer(mailbox.host)?;
        Ok(Resident {
            mailbox: ManuallyDrop::new(mailbox),
            abandoned: AtomicBool::new(false),
            dev,
            stream: Stream::create(false)?,
            linger,
            linger_ns: u64::try_from(linger.as_nanos()).unwrap_or(u64::MAX),
            legacy_order,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The block's stream (a pending call's end, when the block left).
    pub(super) fn stream(&self) -> CUstream {
        self.stream.raw()
    }

    /// Whether a blocking one-shot of `grid` logical blocks is posted now:
    /// while a block waits, or when the previous such call came within the
    /// linger time (a burst: a block launched now serves the calls after
    /// it). A lone call keeps its launch, which costs less than a block's
    /// start (one H200: 14 µs launched, 20 when the block had to start
    /// for it).
    pub(super) fn takes(&self, grid: u32) -> Result<bool> {
        if grid > RESIDENT_MAX_GRID {
            return Ok(false);
        }
        {
            let mut st = self.state();
            let now = Instant::now();
            let recent = st
                .last_call
                .is_some_and(|t| now.duration_since(t) < self.linger);
            st.last_call = Some(now);
            if st.running && self.left(st.gen) {
                st.running = false;
            }
            if !st.running && !recent {
                return Ok(false);
            }
        }
        // The program's work on the legacy stream must be over: a running
        // block starts the call at once.
        if self.legacy_order && !driver::legacy_stream_idle()? {
            return Ok(false);
        }
        Ok(true)
    }

    fn word(&self, off: usize) -> *mut u64 {
        // In bounds: `off` is a field offset of GcResidentBox or a word of
        // the lines after it.
        self.mailbox.host.wrapping_add(off) as *mut u64
    }

    fn read(&self, off: usize) -> u64 {
        // SAFETY: an aligned u64 of the mailbox, which lives as long as self.
        unsafe { std::ptr::read_volatile(self.word(off)) }
    }

    fn write(&self, off: usize, v: u64) {
        // SAFETY: as in `read`; the device only reads the host's words.
        unsafe { std::ptr::write_volatile(self.word(off), v) }
    }

    /// Whether generation `gen` left (by itself, or asked to).
    fn left(&self, gen: u64) -> bool {
        self.read(offset_of!(GcResidentBox, left_gen)) >= gen
    }

    /// Calls the last generation to leave had taken.
    fn left_taken(&self) -> u64 {
        fence(Ordering::Acquire);
        self.read(offset_of!(GcResidentBox, left_taken))
    }

    /// Post one call; launch a generation for it if none waits. Returns
    /// the call's number (for [`recover`](Self::recover)).
    ///
    /// # Safety
    /// As [`launch::direct`] for `args`: its buffers stay valid until the
    /// call completed.
    pub(super) unsafe fn post(
        &self,
        args: &GcOneShotArgs,
        dtype: Datatype,
        grid: u32,
        l: &Launcher,
    ) -> Result<u64> {
        let mut st = self.state();
        if st.running && self.left(st.gen) {
            st.running = false;
        }
        st.posted += 1;
        let n = st.posted;
        // SAFETY: GcOneShotArgs is plain data of RESIDENT_LINES - 1 aligned
        // words (asserted in abi.rs).
        let words: [u64; RESIDENT_LINES as usize - 1] =
            unsafe { std::mem::transmute::<GcOneShotArgs, _>(*args) };
        let last = resident_dtype(dtype) as u64 | (grid as u64) << 32;
        // Each line holds 4 bytes of the call's word, the call number's low
        // 32 bits, the word's other 4 bytes and the number again: a line
        // whose two halves carry the number is this call's, whatever order
        // the block's read sees the stores in.
        let tag = (n as u32 as u64) << 32;
        let base = RESIDENT_ARGS_OFF as usize;
        for (i, w) in words.iter().chain(std::iter::once(&last)).enumerate() {
            self.write(base + 16 * i, (w & 0xffff_ffff) | tag);
            self.write(base + 16 * i + 8, (w >> 32) | tag);
        }
        if !st.running {
            self.launch(&mut st, n - 1, l)?;
        }
        Ok(n)
    }

    /// Launch the next generation, having taken `taken` calls.
    fn launch(&self, st: &mut State, taken: u64, l: &Launcher) -> Result<()> {
        let gen = st.gen + 1;
        let args = GcResidentArgs {
            mailbox: self.dev,
            gen,
            taken,
            linger_ns: self.linger_ns,
            abort_word: l.abort_word,
        };
        let s = self.stream.raw();
        let mut order = l.order.lock().unwrap_or_else(|p| p.into_inner());
        order.before(s, l.own)?;
        // SAFETY: the mailbox lives as long as the backend, which asks the
        // block to leave and waits for it before it is freed (`quit`,
        // `CudaShared`'s drop); posted calls meet `post`'s contract.
        unsafe { launch::resident(l.kernels, args, s)? };
        // Later work on any other stream waits for this generation's end.
        order.after(s)?;
        st.gen = gen;
        st.running = true;
        tracing::debug!(gen, taken, "resident block launched");
        Ok(())
    }

    /// Ask the waiting generation to leave (before other work of the
    /// backend; it leaves within one poll of the mailbox).
    pub(super) fn quit(&self) {
        let mut st = self.state();
        if st.running {
            self.write(offset_of!(GcResidentBox, quit), st.gen);
            st.running = false;
        }
    }

    /// Whether call `n` was lost: its generation left without taking it.
    pub(super) fn lost(&self, n: u64) -> bool {
        let st = self.state();
        st.posted == n && self.left(st.gen) && self.left_taken() < n
    }

    /// If call `n` was lost, launch a generation that takes it.
    pub(super) fn recover(&self, n: u64, l: &Launcher) -> Result<()> {
        let mut st = self.state();
        if st.posted == n && self.left(st.gen) && self.left_taken() < n {
            tracing::debug!(
                call = n,
                "resident block left before the call: launched again"
            );
            st.recovered += 1;
            self.launch(&mut st, n - 1, l)?;
        }
        Ok(())
    }

    /// Ask the block to leave and wait for its end (teardown), at most
    /// `limit`: a block stuck in a call whose peer is gone leaves on the
    /// abort word, which a failed communicator has raised.
    pub(super) fn stop(&self, limit: Duration) {
        self.quit();
        let start = std::time::Instant::now();
        while !driver::stream_query(self.stream.raw()).unwrap_or(true) {
            if start.elapsed() > limit {
                tracing::warn!("resident block did not leave; its mailbox is leaked");
                self.abandoned.store(true, Ordering::Release);
                return;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let st = self.state();
        tracing::info!(
            calls = st.posted,
            launches = st.gen,
            after_a_miss = st.recovered,
            "resident block: calls posted, generations launched (some for a call posted as the block left)"
        );
        drop(st);
        if !self.abandoned.load(Ordering::Acquire) {
            // SAFETY: dropped once, here; no block reads it any more (it
            // left: `stop` saw its stream idle, or none was launched).
            unsafe { ManuallyDrop::drop(&mut self.mailbox) };
        }
    }
}
