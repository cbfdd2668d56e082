//! Safe wrappers over the few MPI calls gpucoll needs: communicator
//! management, bootstrap exchanges, point-to-point for the NET transport and
//! MPI's own collectives for [`crate::reference`].
//!
//! This is the only module that calls `mpi-sys`. It is layered like cudarc:
//! `ffi` turns return codes into [`Error::Mpi`]; the types here own handles
//! and check arguments. Every communicator gpucoll creates has
//! `MPI_ERRORS_RETURN` set, so MPI failures come back as errors instead of
//! aborting the job.
//!
//! Every MPI function is called through its `PMPI_` name (the MPI profiling
//! interface), never `MPI_`: a library that intercepts `MPI_*` by
//! `LD_PRELOAD` or by being linked ahead of MPI (gpucoll's own MPI shim, a
//! tracing tool) therefore never sees, nor re-enters through, gpucoll's
//! bootstrap exchanges, its NET proxy's point-to-point traffic or the
//! reference collectives. Only the link-time constants (`RSMPI_*` handles)
//! come from mpi-sys's C helper. Error messages still name the `MPI_` call,
//! as users know it.

pub(crate) mod ffi;
mod p2p;
mod rail;
mod runtime;
mod typed;
pub(crate) mod words;

pub use p2p::Received;
pub use rail::RailAllReduce;
pub(crate) use runtime::Runtime;
pub use runtime::Threading;

pub(crate) use typed::set_piece_limit;

use crate::error::{Error, Result};
use ffi::{MPI_Comm, MPI_Request};
use std::fmt;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether `MPI_Init`/`MPI_Init_thread` has been called.
pub fn is_initialized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Initialized may be called at any time, from any thread.
    let rc = unsafe { ffi::PMPI_Initialized(&mut flag) };
    rc == 0 && flag != 0
}

/// Whether `MPI_Finalize` has completed.
pub fn is_finalized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time, from any thread.
    let rc = unsafe { ffi::PMPI_Finalized(&mut flag) };
    rc == 0 && flag != 0
}

/// Whether MPI calls may be made now (initialized and not finalized).
pub(crate) fn is_usable() -> bool {
    is_initialized() && !is_finalized()
}

fn require_usable(what: &str) -> Result<()> {
    if !is_initialized() {
        return Err(Error::MpiState(format!(
            "{what}: MPI is not initialized (call gpucoll::initialize first)"
        )));
    }
    if is_finalized() {
        return Err(Error::MpiState(format!(
            "{what}: MPI has already been finalized"
        )));
    }
    Ok(())
}

/// Wall-clock time in seconds (`MPI_Wtime`).
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut x = vec![1.0f32; 1 << 24];
/// world.barrier()?;
/// let t0 = gpucoll::wtime();
/// world.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
/// let secs = gpucoll::wtime() - t0;
/// println!("all_reduce of 64 MiB: {:.3} ms", secs * 1e3);
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn wtime() -> f64 {
    // SAFETY: MPI_Wtime takes no arguments and only reads a clock.
    unsafe { ffi::PMPI_Wtime() }
}

fn threading_to_raw(t: Threading) -> c_int {
    match t {
        Threading::Single => ffi::thread_single(),
        Threading::Funneled => ffi::thread_funneled(),
        Threading::Serialized => ffi::thread_serialized(),
        Threading::Multiple => ffi::thread_multiple(),
    }
}

fn threading_from_raw(raw: c_int) -> Threading {
    if raw == ffi::thread_multiple() {
        Threading::Multiple
    } else if raw == ffi::thread_serialized() {
        Threading::Serialized
    } else if raw == ffi::thread_funneled() {
        Threading::Funneled
    } else {
        Threading::Single
    }
}

/// `MPI_Init_thread(NULL, NULL, required, &provided)`.
pub(crate) fn init_thread(required: Threading) -> Result<Threading> {
    let mut provided: c_int = 0;
    // SAFETY: NULL argc/argv are allowed since MPI-2; the caller checked that
    // MPI is neither initialized nor finalized.
    let rc = unsafe {
        ffi::PMPI_Init_thread(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            threading_to_raw(required),
            &mut provided,
        )
    };
    ffi::check("MPI_Init_thread", rc)?;
    Ok(threading_from_raw(provided))
}

/// `MPI_Query_thread`.
pub(crate) fn query_thread() -> Result<Threading> {
    require_usable("MPI_Query_thread")?;
    let mut provided: c_int = 0;
    // SAFETY: MPI is initialized (checked above); `provided` is a valid out pointer.
    let rc = unsafe { ffi::PMPI_Query_thread(&mut provided) };
    ffi::check("MPI_Query_thread", rc)?;
    Ok(threading_from_raw(provided))
}

/// `MPI_Finalize`.
pub(crate) fn finalize() -> Result<()> {
    require_usable("MPI_Finalize")?;
    // SAFETY: MPI is initialized and not finalized (checked above).
    let rc = unsafe { ffi::PMPI_Finalize() };
    ffi::check("MPI_Finalize", rc)
}

/// The MPI standard version the library implements.
pub(crate) fn version() -> Result<(i32, i32)> {
    let (mut v, mut s): (c_int, c_int) = (0, 0);
    // SAFETY: valid out pointers; MPI_Get_version may be called at any time.
    let rc = unsafe { ffi::PMPI_Get_version(&mut v, &mut s) };
    ffi::check("MPI_Get_version", rc)?;
    Ok((v, s))
}

fn c_string(buf: &[c_char], len: c_int) -> String {
    let len = (len.max(0) as usize).min(buf.len());
    let bytes: Vec<u8> = buf[..len]
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// The first line of `MPI_Get_library_version`.
pub(crate) fn library_version() -> Result<String> {
    let mut buf = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: `buf` is larger than MPI_MAX_LIBRARY_VERSION_STRING; valid out pointers.
    let rc = unsafe { ffi::PMPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
    ffi::check("MPI_Get_library_version", rc)?;
    let s = c_string(&buf, len);
    Ok(s.lines().next().unwrap_or("").trim().to_string())
}

/// `MPI_Get_processor_name` (usually the host name).
pub(crate) fn processor_name() -> Result<String> {
    require_usable("MPI_Get_processor_name")?;
    let mut buf = vec![0 as c_char; 4096];
    let mut len: c_int = 0;
    // SAFETY: `buf` is larger than MPI_MAX_PROCESSOR_NAME; MPI is initialized.
    let rc = unsafe { ffi::PMPI_Get_processor_name(buf.as_mut_ptr(), &mut len) };
    ffi::check("MPI_Get_processor_name", rc)?;
    Ok(c_string(&buf, len))
}

/// Convert a count to MPI's `int`.
pub(crate) fn count_i32(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::CountTooLarge(n as u64))
}

/// An MPI communicator handle: owned (freed on drop) or borrowed (`MPI_COMM_WORLD`).
pub struct MpiComm {
    raw: MPI_Comm,
    owned: bool,
    rank: usize,
    size: usize,
    /// Keeps MPI initialized while this handle lives (see [`Runtime`]):
    /// the comm is freed before MPI can be finalized.
    keep_alive: Option<Arc<Runtime>>,
}

// SAFETY: MPI handles are process-global values, not tied to a thread;
// concurrent use from several threads only happens when MPI provides
// MPI_THREAD_MULTIPLE, which the engine checks.
unsafe impl Send for MpiComm {}
// SAFETY: as for Send: shared use from several threads requires
// MPI_THREAD_MULTIPLE, which the engine checks before doing it.
unsafe impl Sync for MpiComm {}

impl fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("owned", &self.owned)
            .finish()
    }
}

impl MpiComm {
    /// `MPI_COMM_WORLD`, borrowed (never freed).
    ///
    /// MPI must be initialized; otherwise the handle reports size 0 and every
    /// call on it fails.
    pub fn world() -> MpiComm {
        let raw = ffi::comm_world();
        let (rank, size) = if is_usable() {
            Self::query_rank_size(raw).unwrap_or((0, 0))
        } else {
            (0, 0)
        };
        MpiComm {
            raw,
            owned: false,
            rank,
            size,
            keep_alive: None,
        }
    }

    /// Attach a runtime that stays alive (MPI stays initialized) as long as
    /// this communicator, and every communicator derived from it, lives.
    pub(crate) fn with_runtime(mut self, runtime: Arc<Runtime>) -> MpiComm {
        self.keep_alive = Some(runtime);
        self
    }

    fn query_rank_size(raw: MPI_Comm) -> Result<(usize, usize)> {
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `raw` is a valid communicator and MPI is initialized (callers check).
        let rc = unsafe { ffi::PMPI_Comm_rank(raw, &mut rank) };
        ffi::check("MPI_Comm_rank", rc)?;
        // SAFETY: as above.
        let rc = unsafe { ffi::PMPI_Comm_size(raw, &mut size) };
        ffi::check("MPI_Comm_size", rc)?;
        Ok((rank.max(0) as usize, size.max(0) as usize))
    }

    /// Take ownership of a freshly created communicator: set
    /// `MPI_ERRORS_RETURN` and cache rank and size. Frees it on failure.
    fn adopt(raw: MPI_Comm, keep_alive: Option<Arc<Runtime>>) -> Result<MpiComm> {
        let mut comm = MpiComm {
            raw,
            owned: true,
            rank: 0,
            size: 0,
            keep_alive,
        };
        // SAFETY: `raw` is a valid communicator we own; MPI is initialized.
        let rc = unsafe { ffi::PMPI_Comm_set_errhandler(raw, ffi::errors_return()) };
        ffi::check("MPI_Comm_set_errhandler", rc)?;
        let (rank, size) = Self::query_rank_size(raw)?;
        comm.rank = rank;
        comm.size = size;
        Ok(comm)
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in the communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The raw handle (still owned by `self`).
    pub fn raw(&self) -> mpi_sys::MPI_Comm {
        self.raw
    }

    /// `MPI_Comm_dup` (collective).
    pub fn dup(&self) -> Result<MpiComm> {
        require_usable("MPI_Comm_dup")?;
        let mut new = ffi::comm_null();
        // SAFETY: `self.raw` is valid for the lifetime of `self`; `new` is an out pointer.
        let rc = unsafe { ffi::PMPI_Comm_dup(self.raw, &mut new) };
        ffi::check("MPI_Comm_dup", rc)?;
        Self::adopt(new, self.keep_alive.clone())
    }

    /// `MPI_Comm_split` (collective). `None` is `MPI_UNDEFINED`: this rank
    /// joins no new communicator and gets `None`.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<MpiComm>> {
        require_usable("MPI_Comm_split")?;
        let color = match color {
            None => ffi::undefined(),
            Some(c) => c_int::try_from(c).map_err(|_| {
                Error::InvalidUsage(format!("split color {c} is larger than {}", i32::MAX))
            })?,
        };
        let mut new = ffi::comm_null();
        // SAFETY: `self.raw` is valid; `new` is an out pointer.
        let rc = unsafe { ffi::PMPI_Comm_split(self.raw, color, key, &mut new) };
        ffi::check("MPI_Comm_split", rc)?;
        if new == ffi::comm_null() {
            return Ok(None);
        }
        Self::adopt(new, self.keep_alive.clone()).map(Some)
    }

    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)` keyed by rank (collective):
    /// the ranks that share this rank's node, in the order of their rank here.
    pub fn split_shared(&self) -> Result<MpiComm> {
        require_usable("MPI_Comm_split_type")?;
        let key = count_i32(self.rank)?;
        let mut new = ffi::comm_null();
        // SAFETY: `self.raw` is valid; `new` is an out pointer.
        let rc = unsafe {
            ffi::PMPI_Comm_split_type(
                self.raw,
                ffi::comm_type_shared(),
                key,
                ffi::info_null(),
                &mut new,
            )
        };
        ffi::check("MPI_Comm_split_type", rc)?;
        if new == ffi::comm_null() {
            return Err(Error::Mpi {
                call: "MPI_Comm_split_type",
                code: 0,
                message: "returned MPI_COMM_NULL for MPI_COMM_TYPE_SHARED".into(),
            });
        }
        Self::adopt(new, self.keep_alive.clone())
    }

    /// Duplicate a communicator the caller owns (collective over it).
    ///
    /// # Safety
    /// `raw` must be a valid communicator handle (not `MPI_COMM_NULL`
    /// unless MPI reports that as an error), usable for the duration of this
    /// call. The caller keeps ownership of `raw`; the duplicate is
    /// independent of it.
    pub unsafe fn from_raw(raw: mpi_sys::MPI_Comm) -> Result<MpiComm> {
        require_usable("Communicator::from_raw_mpi")?;
        if raw == ffi::comm_null() {
            return Err(Error::InvalidUsage(
                "from_raw_mpi called with MPI_COMM_NULL".into(),
            ));
        }
        let mut inter: std::os::raw::c_int = 0;
        // SAFETY: the caller guarantees `raw` is a valid communicator;
        // `inter` is a live out-parameter.
        let rc = unsafe { ffi::PMPI_Comm_test_inter(raw, &mut inter) };
        ffi::check("MPI_Comm_test_inter", rc)?;
        if inter != 0 {
            return Err(Error::InvalidUsage(
                "from_raw_mpi needs an intra-communicator; collectives over an \
                 inter-communicator are not supported"
                    .into(),
            ));
        }
        let borrowed = MpiComm {
            raw,
            owned: false,
            rank: 0,
            size: 0,
            keep_alive: None,
        };
        borrowed.dup()
    }

    /// `MPI_Barrier` (collective).
    pub fn barrier(&self) -> Result<()> {
        require_usable("MPI_Barrier")?;
        // SAFETY: `self.raw` is a valid communicator.
        let rc = unsafe { ffi::PMPI_Barrier(self.raw) };
        ffi::check("MPI_Barrier", rc)
    }

    fn gathered_len(&self, len: usize) -> Result<usize> {
        len.checked_mul(self.size)
            .ok_or(Error::CountTooLarge(len as u64))
    }

    /// `MPI_Allgather` of bytes (collective). Every rank must pass the same
    /// length; the result holds `size * mine.len()` bytes in rank order.
    pub fn allgather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        require_usable("MPI_Allgather")?;
        let n = count_i32(mine.len())?;
        let mut recv = vec![0u8; self.gathered_len(mine.len())?];
        // SAFETY: `mine` holds n bytes, `recv` holds size*n bytes; both live
        // across this blocking call; `self.raw` is valid.
        let rc = unsafe {
            ffi::PMPI_Allgather(
                mine.as_ptr() as *const c_void,
                n,
                ffi::byte_type(),
                recv.as_mut_ptr() as *mut c_void,
                n,
                ffi::byte_type(),
                self.raw,
            )
        };
        ffi::check("MPI_Allgather", rc)?;
        Ok(recv)
    }

    /// Like [`allgather_bytes`](Self::allgather_bytes) but gives up after
    /// `timeout` with [`Error::Timeout`] (`MPI_Iallgather` + `MPI_Test` polling).
    ///
    /// On timeout the MPI request is left pending, and its send and receive
    /// buffers are leaked on purpose so that MPI may still complete into them
    /// safely. The communicator is unusable after that (the caller marks it
    /// failed); the leak is bounded by one exchange per failed communicator.
    pub fn allgather_bytes_timeout(&self, mine: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        require_usable("MPI_Iallgather")?;
        let n = count_i32(mine.len())?;
        let send: Box<[u8]> = mine.into();
        let mut recv: Box<[u8]> = vec![0u8; self.gathered_len(mine.len())?].into_boxed_slice();
        let mut req = ffi::request_null();
        // SAFETY: both buffers are heap allocations that stay alive until the
        // request completes, or forever (leaked) if it does not.
        let rc = unsafe {
            ffi::PMPI_Iallgather(
                send.as_ptr() as *const c_void,
                n,
                ffi::byte_type(),
                recv.as_mut_ptr() as *mut c_void,
                n,
                ffi::byte_type(),
                self.raw,
                &mut req,
            )
        };
        ffi::check("MPI_Iallgather", rc)?;
        let start = Instant::now();
        let mut polls: u32 = 0;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `req` is the active request started above.
            let rc = unsafe { ffi::PMPI_Test(&mut req, &mut flag, ffi::status_ignore()) };
            if let Err(e) = ffi::check("MPI_Test", rc) {
                // The request's state is unknown: keep its buffers alive.
                std::mem::forget(send);
                std::mem::forget(recv);
                return Err(e);
            }
            if flag != 0 {
                return Ok(recv.into_vec());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                std::mem::forget(send);
                std::mem::forget(recv);
                tracing::debug!(
                    seconds = waited.as_secs_f64(),
                    "MPI_Iallgather timed out; request leaked"
                );
                return Err(Error::Timeout {
                    seq: 0,
                    seconds: waited.as_secs_f64(),
                    waiting_for: "signature exchange (MPI_Iallgather over all ranks of the \
                                  communicator)"
                        .into(),
                });
            }
            backoff(&mut polls);
        }
    }

    /// `MPI_Bcast` of bytes from `root` (collective).
    pub fn bcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<()> {
        require_usable("MPI_Bcast")?;
        self.check_root(root)?;
        let n = count_i32(buf.len())?;
        // SAFETY: `buf` holds n bytes and lives across this blocking call.
        let rc = unsafe {
            ffi::PMPI_Bcast(
                buf.as_mut_ptr() as *mut c_void,
                n,
                ffi::byte_type(),
                root as c_int,
                self.raw,
            )
        };
        ffi::check("MPI_Bcast", rc)
    }

    pub(crate) fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::InvalidRoot {
                root,
                size: self.size,
            });
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size {
            return Err(Error::InvalidRank {
                rank: peer,
                size: self.size,
            });
        }
        Ok(())
    }

    /// `MPI_Isend` of `len` bytes to `dest`.
    ///
    /// # Safety
    /// `buf` must be valid for reads of `len` bytes and must not be modified
    /// or freed until the returned request completed (`test` returned
    /// `Some`) or was cancelled with [`MpiRequest::cancel_within`] returning
    /// `true`.
    pub unsafe fn isend(
        &self,
        buf: *const u8,
        len: usize,
        dest: usize,
        tag: i32,
    ) -> Result<MpiRequest> {
        require_usable("MPI_Isend")?;
        self.check_peer(dest)?;
        let n = count_i32(len)?;
        let mut req = ffi::request_null();
        // SAFETY: the caller guarantees `buf` is readable for `len` bytes until completion.
        let rc = unsafe {
            ffi::PMPI_Isend(
                buf as *const c_void,
                n,
                ffi::byte_type(),
                dest as c_int,
                tag,
                self.raw,
                &mut req,
            )
        };
        ffi::check("MPI_Isend", rc)?;
        Ok(MpiRequest::new(req))
    }

    /// `MPI_Irecv` of up to `cap` bytes from `src`.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `cap` bytes and must not be read,
    /// modified or freed until the returned request completed (`test`
    /// returned `Some`) or was cancelled with [`MpiRequest::cancel_within`]
    /// returning `true`.
    pub unsafe fn irecv(
        &self,
        buf: *mut u8,
        cap: usize,
        src: usize,
        tag: i32,
    ) -> Result<MpiRequest> {
        require_usable("MPI_Irecv")?;
        self.check_peer(src)?;
        let n = count_i32(cap)?;
        let mut req = ffi::request_null();
        // SAFETY: the caller guarantees `buf` is writable for `cap` bytes until completion.
        let rc = unsafe {
            ffi::PMPI_Irecv(
                buf as *mut c_void,
                n,
                ffi::byte_type(),
                src as c_int,
                tag,
                self.raw,
                &mut req,
            )
        };
        ffi::check("MPI_Irecv", rc)?;
        Ok(MpiRequest::new(req))
    }
}

impl MpiComm {
    /// Let go of the handle without freeing the communicator. After a
    /// failed collective, peers' messages may still be on their way to it;
    /// freed, its context id can be given to the next communicator created,
    /// and Open MPI then matches those stale messages into it (a crash in
    /// `mca_pml_ob1_add_comm` was seen). The MPI runtime is still released.
    pub(crate) fn abandon(mut self) {
        self.owned = false;
    }

    /// [`abandon`](Self::abandon) in place: the handle is not freed when
    /// it drops.
    pub(crate) fn disown(&mut self) {
        self.owned = false;
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if !self.owned || !is_usable() {
            return;
        }
        let mut raw = self.raw;
        // SAFETY: we own `raw`, MPI is initialized and not finalized; after
        // this call the handle is never used again.
        let rc = unsafe { ffi::PMPI_Comm_free(&mut raw) };
        if let Err(e) = ffi::check("MPI_Comm_free", rc) {
            tracing::debug!("freeing an MPI communicator failed: {e}");
        }
        // `keep_alive` drops after this, possibly finalizing MPI.
    }
}

/// Poll back-off: spin briefly, then yield, then sleep in short steps.
fn backoff(polls: &mut u32) {
    *polls = polls.saturating_add(1);
    if *polls < 200 {
        std::hint::spin_loop();
    } else if *polls < 1000 {
        std::thread::yield_now();
    } else {
        let us = (*polls as u64 / 1000).min(1000);
        std::thread::sleep(Duration::from_micros(us.max(50)));
    }
}

/// A nonblocking point-to-point operation in flight.
///
/// Dropping an incomplete request cancels it, waits a short while for the
/// cancellation to take effect, then frees it.
pub struct MpiRequest {
    raw: MPI_Request,
    completed: Option<usize>,
}

// SAFETY: MPI request handles are process-global values, not tied to a
// thread; concurrent MPI calls from several threads only happen when MPI
// provides MPI_THREAD_MULTIPLE, which the engine checks.
unsafe impl Send for MpiRequest {}
// SAFETY: every method that touches the handle takes `&mut self` or `self`.
unsafe impl Sync for MpiRequest {}

impl fmt::Debug for MpiRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiRequest")
            .field("completed", &self.completed)
            .finish()
    }
}

/// How long dropping an incomplete request waits for its cancellation.
const CANCEL_WAIT: Duration = Duration::from_millis(100);

impl MpiRequest {
    fn new(raw: MPI_Request) -> MpiRequest {
        MpiRequest {
            raw,
            completed: None,
        }
    }

    fn is_null(&self) -> bool {
        self.raw == ffi::request_null()
    }

    /// `MPI_Test`: `Some(bytes transferred)` once complete (and on every
    /// later call), `None` while in flight.
    pub fn test(&mut self) -> Result<Option<usize>> {
        if let Some(n) = self.completed {
            return Ok(Some(n));
        }
        if self.is_null() {
            self.completed = Some(0);
            return Ok(Some(0));
        }
        require_usable("MPI_Test")?;
        let mut flag: c_int = 0;
        let mut status = ffi::empty_status();
        // SAFETY: `self.raw` is an active request owned by `self`; `status` is a valid out pointer.
        let rc = unsafe { ffi::PMPI_Test(&mut self.raw, &mut flag, &mut status) };
        ffi::check("MPI_Test", rc)?;
        if flag == 0 {
            return Ok(None);
        }
        let mut count: c_int = 0;
        // SAFETY: `status` was filled in by the successful MPI_Test above.
        let rc = unsafe { ffi::PMPI_Get_count(&status, ffi::byte_type(), &mut count) };
        ffi::check("MPI_Get_count", rc)?;
        let n = count.max(0) as usize;
        self.completed = Some(n);
        Ok(Some(n))
    }

    /// Cancel the request (if still in flight) and free it.
    pub fn cancel(self) {
        drop(self)
    }

    /// Cancel and wait up to `timeout` for the cancellation (or completion)
    /// to take effect. Returns `true` if MPI no longer uses the buffer;
    /// `false` means the request was freed while MPI may still access it, so
    /// the caller must keep the buffer alive (leak it).
    pub fn cancel_within(mut self, timeout: Duration) -> bool {
        self.cancel_inner(timeout)
    }

    fn cancel_inner(&mut self, timeout: Duration) -> bool {
        if self.completed.is_some() || self.is_null() || !is_usable() {
            return true;
        }
        // SAFETY: `self.raw` is an active request owned by `self`.
        let rc = unsafe { ffi::PMPI_Cancel(&mut self.raw) };
        if let Err(e) = ffi::check("MPI_Cancel", rc) {
            tracing::debug!("cancelling an MPI request failed: {e}");
        }
        let start = Instant::now();
        let mut polls = 0u32;
        while !self.is_null() {
            let mut flag: c_int = 0;
            // SAFETY: `self.raw` is still an active request owned by `self`.
            let rc = unsafe { ffi::PMPI_Test(&mut self.raw, &mut flag, ffi::status_ignore()) };
            if rc != 0 || flag != 0 {
                break;
            }
            if start.elapsed() >= timeout {
                // SAFETY: `self.raw` is active; freeing it lets MPI finish it
                // in the background; the handle is not used afterwards.
                let rc = unsafe { ffi::PMPI_Request_free(&mut self.raw) };
                if let Err(e) = ffi::check("MPI_Request_free", rc) {
                    tracing::debug!("freeing an MPI request failed: {e}");
                }
                self.raw = ffi::request_null();
                self.completed = Some(0);
                return false;
            }
            backoff(&mut polls);
        }
        self.raw = ffi::request_null();
        self.completed = Some(0);
        true
    }
}

impl Drop for MpiRequest {
    fn drop(&mut self) {
        self.cancel_inner(CANCEL_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_above_int_max_rejected() {
        assert_eq!(count_i32(5).unwrap(), 5);
        assert!(matches!(
            count_i32(i32::MAX as usize + 1),
            Err(Error::CountTooLarge(_))
        ));
    }

    #[test]
    fn c_string_stops_at_nul() {
        let buf: Vec<c_char> = b"host\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_string(&buf, 9), "host");
        assert_eq!(c_string(&buf, -1), "");
    }
}
