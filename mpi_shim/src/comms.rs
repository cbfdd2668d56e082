//! The gpucoll communicator behind each MPI communicator, and what the shim
//! knows of the communicator: its failure, its stream.
//!
//! Every MPI communicator the shim sees gets an entry, cached as an MPI
//! attribute (a keyval with `MPI_COMM_NULL_COPY_FN`, so duplicates start
//! without one, and a delete callback that releases it when the program
//! frees the communicator). The gpucoll communicator itself is created
//! lazily, at the first collective routed to gpucoll: every rank reaches
//! that call, so creation (which is collective) happens on all of them at
//! the same point. Creation starts with a handshake bounded by
//! `GPUCOLL_TIMEOUT` that compares the call's signature across ranks, so a
//! rank whose peers went elsewhere (to MPI with host memory) or made another
//! call fails instead of waiting in MPI forever. Nonblocking requests hold
//! clones, so a communicator freed with work in flight lives until the work
//! completed. `MPI_Finalize` tears every remaining one down, in creation
//! order, before `PMPI_Finalize`.
//!
//! A communicator that has a gpucoll communicator is *guarded*: every rank
//! knows it (creation is collective), so every rank hands its MPI-routed
//! collectives on it to MPI in the nonblocking form under a deadline
//! (`deadline.rs`), and a peer that went the other way gives an error on
//! both sides. A collective that fails that way (or any fatal gpucoll error)
//! marks the entry failed: every later collective on the communicator
//! reports why, through its error handler, and no other communicator is
//! touched.

use crate::cuda::{self, CtxGuard};
use crate::deadline::{self, Unfinished};
use crate::errors;
use crate::settings::{self, Inside};
use gpucoll::{Communicator, Error};
use mpi_sys::MPI_Comm;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Why a communicator can no longer be used, and the MPI error class its
/// collectives report.
#[derive(Debug, Clone)]
pub struct Failure {
    pub code: c_int,
    pub reason: String,
}

/// What the shim knows about one MPI communicator.
pub struct CommEntry {
    /// The MPI handle (stable while the communicator exists).
    raw: usize,
    pub rank: usize,
    /// Ranks of the local group.
    pub size: usize,
    /// An intracommunicator of more than one rank: gpucoll can take it.
    pub eligible: bool,
    /// An intercommunicator.
    pub inter: bool,
    gpucoll: Mutex<Slot>,
    /// Set once a gpucoll communicator exists (read without the lock on
    /// every MPI-routed call).
    guarded: AtomicBool,
    failure: OnceLock<Failure>,
    /// The stream this communicator's nonblocking device collectives are
    /// queued on (one per communicator, so collectives of communicators
    /// busy at once progress in any order the ranks issue them).
    stream: Mutex<Option<cuda::Stream>>,
}

enum Slot {
    NotYet,
    Ready(u64, Communicator),
    /// Torn down (freed by the program, or at finalize).
    Gone,
}

static FINALIZING: AtomicBool = AtomicBool::new(false);
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);
/// Some entry is guarded or failed: MPI-routed calls must look theirs up.
static ANY_GUARDED: AtomicBool = AtomicBool::new(false);
/// Bumped whenever an entry is detached from its communicator, so that a
/// cached lookup of a freed (and possibly reused) handle is never served.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last entry this thread looked up: (handle, generation, entry).
    static LAST: RefCell<Option<(usize, u64, Arc<CommEntry>)>> = const { RefCell::new(None) };
}

/// Whether any communicator of this process is guarded or failed; while
/// none is, host-memory calls skip the lookup of their communicator.
#[inline]
pub fn any_guarded() -> bool {
    ANY_GUARDED.load(Ordering::Acquire)
}

/// Entries that hold a gpucoll communicator, for the teardown at finalize.
fn live() -> &'static Mutex<Vec<Arc<CommEntry>>> {
    static LIVE: OnceLock<Mutex<Vec<Arc<CommEntry>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

/// The attribute's delete callback: the program freed the communicator (or
/// MPI is finalizing). Drops the shim's hold on the gpucoll communicator.
unsafe extern "C" fn delete_entry(
    _comm: MPI_Comm,
    _keyval: c_int,
    value: *mut c_void,
    _extra: *mut c_void,
) -> c_int {
    if value.is_null() {
        return 0;
    }
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // SAFETY: the attribute value is the pointer `Arc::into_raw` made in
    // `lookup`; MPI calls the delete callback once per set value.
    let entry = unsafe { Arc::from_raw(value as *const CommEntry) };
    errors::catch(|| {
        entry.release();
        live()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| !Arc::ptr_eq(e, &entry));
    })
    .map_or(mpi_sys::MPI_ERR_INTERN as c_int, |()| 0)
}

fn keyval() -> Option<c_int> {
    static KEYVAL: OnceLock<Option<c_int>> = OnceLock::new();
    *KEYVAL.get_or_init(|| {
        let mut kv: c_int = mpi_sys::MPI_KEYVAL_INVALID;
        // SAFETY: valid callbacks and out-pointer; MPI is initialized (this
        // runs inside an intercepted collective).
        let rc = unsafe {
            mpi_sys::PMPI_Comm_create_keyval(
                crate::handles::comm_null_copy_fn(),
                Some(delete_entry),
                &mut kv,
                std::ptr::null_mut(),
            )
        };
        (rc == 0).then_some(kv)
    })
}

/// The entry of `comm`, creating it at the first sight. `Err(code)` when MPI
/// rejects the communicator (null, freed): the caller hands the call to
/// `PMPI_`, which reports it as the program expects.
pub fn lookup(comm: MPI_Comm) -> Result<Arc<CommEntry>, c_int> {
    // SAFETY: reading an immutable handle constant.
    if comm == unsafe { mpi_sys::RSMPI_COMM_NULL } {
        return Err(mpi_sys::MPI_ERR_COMM as c_int);
    }
    let key = comm.0 as usize;
    let generation = GENERATION.load(Ordering::Acquire);
    let cached = LAST.with(|l| match &*l.borrow() {
        Some((k, g, e)) if *k == key && *g == generation => Some(e.clone()),
        _ => None,
    });
    if let Some(e) = cached {
        return Ok(e);
    }
    let (entry, attached) = lookup_attribute(comm)?;
    if attached {
        LAST.with(|l| *l.borrow_mut() = Some((key, generation, entry.clone())));
    }
    Ok(entry)
}

/// The entry in `comm`'s attribute (made now if it has none), and whether
/// it is attached to the communicator (the cache may keep only those: the
/// delete callback tells when they go).
fn lookup_attribute(comm: MPI_Comm) -> Result<(Arc<CommEntry>, bool), c_int> {
    let kv = keyval().ok_or(mpi_sys::MPI_ERR_INTERN as c_int)?;
    let mut value: *mut c_void = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: for a get, `attribute_val` receives a pointer-sized value.
    let rc = unsafe {
        mpi_sys::PMPI_Comm_get_attr(
            comm,
            kv,
            &mut value as *mut *mut c_void as *mut c_void,
            &mut flag,
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    if flag != 0 && !value.is_null() {
        let ptr = value as *const CommEntry;
        // SAFETY: the attribute holds one strong count made by `into_raw`
        // below; take another for the caller.
        unsafe { Arc::increment_strong_count(ptr) };
        // SAFETY: the count just taken is owned by this new Arc.
        return Ok((unsafe { Arc::from_raw(ptr) }, true));
    }
    let (mut size, mut rank, mut inter) = (0 as c_int, 0 as c_int, 0 as c_int);
    // SAFETY: a communicator MPI accepted above; valid out-pointers.
    unsafe {
        let rc = mpi_sys::PMPI_Comm_size(comm, &mut size);
        if rc != 0 {
            return Err(rc);
        }
        mpi_sys::PMPI_Comm_rank(comm, &mut rank);
        mpi_sys::PMPI_Comm_test_inter(comm, &mut inter);
    }
    let entry = Arc::new(CommEntry {
        raw: comm.0 as usize,
        rank: rank.max(0) as usize,
        size: size.max(0) as usize,
        eligible: inter == 0 && size > 1,
        inter: inter != 0,
        gpucoll: Mutex::new(Slot::NotYet),
        guarded: AtomicBool::new(false),
        failure: OnceLock::new(),
        stream: Mutex::new(None),
    });
    let value = Arc::into_raw(entry.clone()) as *mut c_void;
    // SAFETY: the value is released by `delete_entry`.
    let rc = unsafe { mpi_sys::PMPI_Comm_set_attr(comm, kv, value) };
    if rc != 0 {
        // SAFETY: MPI did not take the value; reclaim the count.
        drop(unsafe { Arc::from_raw(value as *const CommEntry) });
    }
    Ok((entry, rc == 0))
}

/// The first call routed to gpucoll on a communicator, as the creation
/// handshake compares it across ranks.
#[derive(Debug, Clone, Copy)]
pub struct Signature {
    pub call: &'static str,
    pub count: i64,
    pub dtype: &'static str,
    pub op: &'static str,
    /// `-1` for a call without a root.
    pub root: i64,
}

/// Marks the handshake's words, so that stray data never passes for it.
const MAGIC: u64 = 0x6763_7368_696d_3031; // "gcshim01"
const SIG_WORDS: usize = 6;

/// FNV-1a: the same on every rank, for the names in a signature.
fn digest(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Signature {
    fn words(&self) -> [u64; SIG_WORDS] {
        [
            MAGIC,
            digest(self.call),
            self.count as u64,
            digest(self.dtype),
            digest(self.op),
            self.root as u64,
        ]
    }

    /// What differs between this rank's call and `other` (another rank's
    /// words), or `None` when they agree.
    fn differences(&self, other: &[u64]) -> Option<String> {
        let mine = self.words();
        if other == mine {
            return None;
        }
        let mut d = Vec::new();
        if other[0] != MAGIC || other[1] != mine[1] {
            d.push("a different collective".to_string());
        }
        if other[2] != mine[2] {
            d.push(format!("count {}", other[2] as i64));
        }
        if other[3] != mine[3] {
            d.push("a different datatype".to_string());
        }
        if other[4] != mine[4] {
            d.push("a different op".to_string());
        }
        if other[5] != mine[5] {
            d.push(format!("root {}", other[5] as i64));
        }
        Some(d.join(", "))
    }

    fn describe(&self) -> String {
        let mut s = format!("{} of {} {}", self.call, self.count, self.dtype);
        if !self.op.is_empty() {
            s.push_str(&format!(", op {}", self.op));
        }
        if self.root >= 0 {
            s.push_str(&format!(", root {}", self.root));
        }
        s
    }
}

/// An error that ends the creation: its MPI class and message.
struct Refused(c_int, String);

impl CommEntry {
    fn handle(&self) -> MPI_Comm {
        MPI_Comm(self.raw as *mut mpi_sys::ompi_communicator_t)
    }

    /// Whether this communicator has a gpucoll communicator: its MPI-routed
    /// collectives then run under a deadline.
    #[inline]
    pub fn guarded(&self) -> bool {
        self.guarded.load(Ordering::Acquire)
    }

    /// The failure that ended this communicator, if any.
    #[inline]
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.get()
    }

    /// Record that the communicator failed (the first failure wins) and
    /// return the failure it now has.
    pub fn fail(&self, code: c_int, reason: String) -> &Failure {
        ANY_GUARDED.store(true, Ordering::Release);
        self.failure.get_or_init(|| Failure { code, reason })
    }

    /// Record a gpucoll error if it ends the communicator.
    pub fn note(&self, e: &Error) {
        if e.is_fatal() {
            self.fail(errors::code_of(e), e.to_string());
        }
    }

    /// `call` on a failed communicator: the reason on stderr, the error
    /// class through the communicator's error handler.
    pub fn report(&self, comm: MPI_Comm, call: &str, f: &Failure) -> c_int {
        errors::log_failure(
            call,
            &format!(
                "the communicator failed earlier and can no longer be used: {}",
                f.reason
            ),
        );
        errors::raise(comm, f.code)
    }

    /// The gpucoll communicator, created now if this is the first routed
    /// collective (collective over the communicator; `sig` is this rank's
    /// call, compared with the peers' first). With `device`, that GPU's
    /// primary context is current during creation, so the communicator runs
    /// on the GPU that owns the program's buffers. An error has been
    /// reported (logged, raised) when this returns one.
    pub fn communicator(
        self: &Arc<Self>,
        device: Option<i32>,
        sig: &Signature,
    ) -> Result<Communicator, c_int> {
        let comm = self.handle();
        if let Some(f) = self.failure() {
            return Err(self.report(comm, sig.call, f));
        }
        let mut slot = self.gpucoll.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Slot::Ready(_, c) => return Ok(c.clone()),
            Slot::Gone => return Err(errors::fail(comm, sig.call, &Error::CommunicatorFreed)),
            Slot::NotYet => {}
        }
        if FINALIZING.load(Ordering::Acquire) {
            let e = Error::MpiState("MPI_Finalize has started".into());
            return Err(errors::fail(comm, sig.call, &e));
        }
        match self.create(device, sig) {
            Ok(c) => {
                let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    seq,
                    rank = self.rank,
                    backend = c.backend_name(),
                    "gpucoll communicator created"
                );
                *slot = Slot::Ready(seq, c.clone());
                drop(slot);
                self.guarded.store(true, Ordering::Release);
                ANY_GUARDED.store(true, Ordering::Release);
                track(self);
                Ok(c)
            }
            Err(Refused(code, reason)) => {
                // Peers may be inside the creation or past it: nothing more
                // may happen on this communicator.
                let f = self.fail(code, reason);
                errors::log_failure(sig.call, &f.reason);
                Err(errors::raise(comm, f.code))
            }
        }
    }

    fn create(&self, device: Option<i32>, sig: &Signature) -> Result<Communicator, Refused> {
        let _inside = Inside::enter();
        self.handshake(sig)?;
        let _ctx = match device {
            Some(d) => Some(CtxGuard::bind(d).map_err(|e| refused(&Error::Backend(e)))?),
            None => None,
        };
        // Blocking calls then start after the program's work on the legacy
        // default stream (cudaMemset, kernels on stream 0) without a host
        // wait, as CUDA-aware MPI libraries order them. A program that
        // synchronizes before every MPI call may turn it off
        // (GPUCOLL_LEGACY_STREAM_ORDER=0): a resident-block call then skips
        // its query of that stream (~1.6 µs).
        let mut config = gpucoll::Config::from_env().map_err(|e| refused(&e))?;
        config.legacy_stream_order = settings::get().legacy_order;
        // SAFETY: `raw` is the live communicator this entry is attached to.
        unsafe { Communicator::from_raw_mpi_with(self.handle(), None, config) }
            .map_err(|e| refused(&e))
    }

    /// Every rank's signature, gathered under `GPUCOLL_TIMEOUT` on the
    /// program's communicator (in MPI's nonblocking collective space, so it
    /// never matches a blocking collective a peer made with host memory).
    fn handshake(&self, sig: &Signature) -> Result<(), Refused> {
        let n = self.size;
        let mine: Box<[u64; SIG_WORDS]> = Box::new(sig.words());
        let mut all: Box<[u64]> = vec![0u64; n * SIG_WORDS].into_boxed_slice();
        // SAFETY: reading a link-time MPI constant.
        let mut request = unsafe { mpi_sys::RSMPI_REQUEST_NULL };
        // SAFETY: both buffers are heap allocations that live until the
        // request completed, or forever (leaked) if it does not; the type is
        // a predefined handle; the communicator is live.
        let rc = unsafe {
            mpi_sys::PMPI_Iallgather(
                mine.as_ptr() as *const c_void,
                SIG_WORDS as c_int,
                mpi_sys::RSMPI_UINT64_T,
                all.as_mut_ptr() as *mut c_void,
                SIG_WORDS as c_int,
                mpi_sys::RSMPI_UINT64_T,
                self.handle(),
                &mut request,
            )
        };
        if rc != 0 {
            return Err(Refused(
                rc,
                format!("the handshake creating gpucoll's communicator failed with MPI error {rc}"),
            ));
        }
        // SAFETY: the request just started.
        match unsafe { deadline::wait(&mut request, settings::get().timeout) } {
            Ok(()) => {}
            Err(Unfinished::Mpi(rc)) => {
                std::mem::forget((mine, all));
                return Err(Refused(
                    rc,
                    format!(
                        "the handshake creating gpucoll's communicator failed with MPI error {rc}"
                    ),
                ));
            }
            Err(Unfinished::TimedOut(waited)) => {
                std::mem::forget((mine, all));
                return Err(Refused(
                    mpi_sys::MPI_ERR_OTHER as c_int,
                    format!(
                        "{} (at the first collective routed to gpucoll on this communicator, \
                         rank {}: {})",
                        deadline::timeout_message(sig.call, waited),
                        self.rank,
                        sig.describe()
                    ),
                ));
            }
        }
        let differing: Vec<String> = all
            .chunks_exact(SIG_WORDS)
            .enumerate()
            .filter_map(|(r, w)| sig.differences(w).map(|d| format!("rank {r}: {d}")))
            .take(4)
            .collect();
        if differing.is_empty() {
            return Ok(());
        }
        Err(Refused(
            mpi_sys::MPI_ERR_NOT_SAME as c_int,
            format!(
                "ranks disagree about their first collective routed to gpucoll on this \
                 communicator: rank {} called {}; {}",
                self.rank,
                sig.describe(),
                differing.join("; ")
            ),
        ))
    }

    /// The stream of this communicator's nonblocking collectives on
    /// `device` (created at the first; its primary context is current),
    /// ordered after the work on the legacy default stream so far unless
    /// `GPUCOLL_LEGACY_STREAM_ORDER=0`.
    pub fn stream(&self, device: i32) -> cuda::CuResult<usize> {
        let mut slot = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let st = match slot.take() {
            Some(st) => st,
            None => cuda::Stream::new(device)?,
        };
        let raw = st.raw();
        let ordered = if settings::get().legacy_order {
            st.after_legacy()
        } else {
            Ok(())
        };
        *slot = Some(st);
        ordered.map(|()| raw)
    }

    /// Drop the shim's reference (requests in flight keep theirs) and the
    /// stream (work queued on it still completes).
    fn release(&self) {
        // Goes at the end of this function, after the communicator.
        let _stream = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        let old = std::mem::replace(
            &mut *self.gpucoll.lock().unwrap_or_else(|p| p.into_inner()),
            Slot::Gone,
        );
        let _inside = Inside::enter();
        drop(old);
    }

    fn seq(&self) -> Option<u64> {
        match &*self.gpucoll.lock().unwrap_or_else(|p| p.into_inner()) {
            Slot::Ready(seq, _) => Some(*seq),
            _ => None,
        }
    }
}

fn refused(e: &Error) -> Refused {
    Refused(errors::code_of(e), e.to_string())
}

/// Remember an entry that now holds a gpucoll communicator.
fn track(entry: &Arc<CommEntry>) {
    let mut l = live().lock().unwrap_or_else(|p| p.into_inner());
    if !l.iter().any(|e| Arc::ptr_eq(e, entry)) {
        l.push(entry.clone());
    }
}

/// Tear down every gpucoll communicator, in creation order (the same on
/// every rank), and refuse new ones: called by `MPI_Finalize`.
pub fn teardown_all() {
    FINALIZING.store(true, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    LAST.with(|l| l.borrow_mut().take());
    let mut entries: Vec<Arc<CommEntry>> =
        std::mem::take(&mut *live().lock().unwrap_or_else(|p| p.into_inner()));
    entries.sort_by_key(|e| e.seq().unwrap_or(u64::MAX));
    for e in entries {
        e.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(count: i64, root: i64) -> Signature {
        Signature {
            call: "MPI_Bcast",
            count,
            dtype: "f32",
            op: "",
            root,
        }
    }

    #[test]
    fn signatures_name_what_differs() {
        let a = sig(8, 0);
        assert_eq!(a.differences(&a.words()), None);
        let d = a.differences(&sig(9, 1).words()).unwrap();
        assert!(d.contains("count 9") && d.contains("root 1"), "{d}");
        let mut other = Signature {
            call: "MPI_Allreduce",
            ..a
        }
        .words();
        assert!(a
            .differences(&other)
            .unwrap()
            .contains("different collective"));
        other = Signature { dtype: "f64", ..a }.words();
        assert_eq!(a.differences(&other).unwrap(), "a different datatype");
        // Stray words are never a match.
        assert!(a.differences(&[0; SIG_WORDS]).is_some());
        assert_eq!(digest("MPI_Bcast"), digest("MPI_Bcast"));
        assert_ne!(digest("MPI_Bcast"), digest("MPI_Ibcast"));
    }
}
