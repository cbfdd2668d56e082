//! The gpucoll communicator behind each MPI communicator.
//!
//! Every MPI communicator the shim sees gets an entry, cached as an MPI
//! attribute (a keyval with `MPI_COMM_NULL_COPY_FN`, so duplicates start
//! without one, and a delete callback that releases it when the program
//! frees the communicator). The gpucoll communicator itself is created
//! lazily, at the first collective routed to gpucoll: every rank reaches
//! that call, so creation (which is collective) happens on all of them at
//! the same point. Nonblocking requests hold clones, so a communicator
//! freed with work in flight lives until the work completed. `MPI_Finalize`
//! tears every remaining one down, in creation order, before `PMPI_Finalize`.

use crate::cuda::CtxGuard;
use crate::settings::Inside;
use gpucoll::{Communicator, Error};
use mpi_sys::MPI_Comm;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What the shim knows about one MPI communicator.
pub struct CommEntry {
    /// The MPI handle (stable while the communicator exists).
    raw: usize,
    pub rank: usize,
    pub size: usize,
    /// An intracommunicator of more than one rank: gpucoll can take it.
    pub eligible: bool,
    /// An intercommunicator.
    pub inter: bool,
    gpucoll: Mutex<Slot>,
}

enum Slot {
    NotYet,
    Ready(u64, Communicator),
    /// Torn down (freed by the program, or at finalize).
    Gone,
}

static FINALIZING: AtomicBool = AtomicBool::new(false);
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

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
    // SAFETY: the attribute value is the pointer `Arc::into_raw` made in
    // `lookup`; MPI calls the delete callback once per set value.
    let entry = unsafe { Arc::from_raw(value as *const CommEntry) };
    entry.release();
    live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|e| !Arc::ptr_eq(e, &entry));
    0
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
        return Ok(unsafe { Arc::from_raw(ptr) });
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
    });
    let value = Arc::into_raw(entry.clone()) as *mut c_void;
    // SAFETY: the value is released by `delete_entry`.
    let rc = unsafe { mpi_sys::PMPI_Comm_set_attr(comm, kv, value) };
    if rc != 0 {
        // SAFETY: MPI did not take the value; reclaim the count.
        drop(unsafe { Arc::from_raw(value as *const CommEntry) });
    }
    Ok(entry)
}

impl CommEntry {
    /// The gpucoll communicator, created now if this is the first routed
    /// collective (collective over the communicator). With `device`, that
    /// GPU's primary context is current during creation, so the
    /// communicator runs on the GPU that owns the program's buffers.
    pub fn communicator(self: &Arc<Self>, device: Option<i32>) -> Result<Communicator, Error> {
        let mut slot = self.gpucoll.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Slot::Ready(_, c) => return Ok(c.clone()),
            Slot::Gone => return Err(Error::CommunicatorFreed),
            Slot::NotYet => {}
        }
        if FINALIZING.load(Ordering::Acquire) {
            return Err(Error::MpiState("MPI_Finalize has started".into()));
        }
        let _inside = Inside::enter();
        let _ctx = match device {
            Some(d) => Some(CtxGuard::bind(d).map_err(Error::Backend)?),
            None => None,
        };
        let raw = MPI_Comm(self.raw as *mut mpi_sys::ompi_communicator_t);
        // Blocking calls then start after the program's work on the legacy
        // default stream (cudaMemset, kernels on stream 0) without a host
        // wait, as CUDA-aware MPI libraries order them. A program that
        // synchronizes before every MPI call may turn it off
        // (GPUCOLL_LEGACY_STREAM_ORDER=0): a resident-block call then skips
        // its query of that stream (~1.6 µs).
        let mut config = gpucoll::Config::from_env()?;
        config.legacy_stream_order = crate::settings::get().legacy_order;
        // SAFETY: `raw` is the live communicator this entry is attached to.
        let comm = unsafe { Communicator::from_raw_mpi_with(raw, None, config)? };
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            seq,
            rank = self.rank,
            backend = comm.backend_name(),
            "gpucoll communicator created"
        );
        *slot = Slot::Ready(seq, comm.clone());
        drop(slot);
        track(self);
        Ok(comm)
    }

    /// Drop the shim's reference (requests in flight keep theirs).
    fn release(&self) {
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
    let mut entries: Vec<Arc<CommEntry>> =
        std::mem::take(&mut *live().lock().unwrap_or_else(|p| p.into_inner()));
    entries.sort_by_key(|e| e.seq().unwrap_or(u64::MAX));
    for e in entries {
        e.release();
    }
}
