//! Starting and stopping MPI: [`initialize`], the [`Universe`] and the
//! process-wide runtime that keeps MPI alive while anything uses it.
//!
//! MPI is finalized (when gpucoll initialized it) only after the
//! [`Universe`] *and* every [`Communicator`] and internal MPI handle are
//! dropped, so communicator resources are always released before MPI goes.

use crate::comm::{self, Communicator};
use crate::error::{Error, Result};
use crate::mpi::{self, MpiComm};
use std::sync::{Arc, Mutex, Once, Weak};

/// MPI thread-support levels (`MPI_THREAD_*`), in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Threading {
    /// Only one thread will execute.
    Single,
    /// Only the main thread makes MPI calls.
    Funneled,
    /// Only one thread at a time makes MPI calls.
    Serialized,
    /// Any thread may make MPI calls at any time.
    Multiple,
}

/// The process-wide MPI state gpucoll relies on. Shared (through `Arc`) by
/// the [`Universe`], every communicator and every `MpiComm` gpucoll creates;
/// the last one dropped finalizes MPI (if gpucoll initialized it). Code that
/// calls MPI must hold an `Arc<MpiComm>` (or this runtime) while it does.
pub(crate) struct Runtime {
    /// gpucoll called `MPI_Init_thread` and so must call `MPI_Finalize`.
    owns_mpi: bool,
    /// The thread level MPI provides.
    threading: Threading,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("owns_mpi", &self.owns_mpi)
            .field("threading", &self.threading)
            .finish()
    }
}

struct Global {
    current: Weak<Runtime>,
    /// gpucoll initialized MPI at some point in this process (so, once the
    /// runtime is gone, MPI is finalized or about to be).
    initialized_by_us: bool,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    current: Weak::new(),
    initialized_by_us: false,
});

fn lock_global() -> std::sync::MutexGuard<'static, Global> {
    GLOBAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

enum Acquire {
    /// Initialize MPI with this level if nobody has.
    Init(Threading),
    /// MPI must already be initialized (by the program); never initialize.
    Borrow,
}

impl Runtime {
    /// Whether MPI provides `MPI_THREAD_MULTIPLE` (channels may call MPI
    /// from several threads at once).
    pub(crate) fn thread_multiple(&self) -> bool {
        self.threading == Threading::Multiple
    }

    /// The thread level MPI provides.
    pub(crate) fn threading(&self) -> Threading {
        self.threading
    }

    /// The runtime for a communicator made from a user's MPI communicator:
    /// the existing one, or a new one that never finalizes MPI.
    pub(crate) fn borrowed() -> Result<Arc<Runtime>> {
        Runtime::acquire(Acquire::Borrow)
    }

    fn acquire(mode: Acquire) -> Result<Arc<Runtime>> {
        install_tracing();
        let mut global = lock_global();
        if let Some(rt) = global.current.upgrade() {
            if mpi::is_usable() {
                return Ok(rt);
            }
            return Err(Error::MpiState(
                "MPI was finalized by the program while gpucoll still uses it".into(),
            ));
        }
        if global.initialized_by_us || mpi::is_finalized() {
            return Err(Error::MpiState(
                "MPI has already been finalized (it cannot be initialized twice in a process)"
                    .into(),
            ));
        }
        let (owns_mpi, threading) = if mpi::is_initialized() {
            (false, mpi::query_thread()?)
        } else {
            match mode {
                Acquire::Borrow => {
                    return Err(Error::MpiState(
                        "MPI is not initialized (call MPI_Init or gpucoll::initialize first)"
                            .into(),
                    ))
                }
                Acquire::Init(required) => {
                    let provided = mpi::init_thread(required)?;
                    global.initialized_by_us = true;
                    log_startup(required, provided);
                    (true, provided)
                }
            }
        };
        if !owns_mpi {
            tracing::debug!(?threading, "using MPI initialized by the program");
        }
        let rt = Arc::new(Runtime {
            owns_mpi,
            threading,
        });
        global.current = Arc::downgrade(&rt);
        Ok(rt)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Serialize with `acquire`, which must not observe a half-finalized MPI.
        let _global = lock_global();
        if self.owns_mpi && mpi::is_usable() {
            tracing::debug!("finalizing MPI");
            if let Err(e) = mpi::finalize() {
                tracing::debug!("MPI_Finalize failed: {e}");
            }
        }
    }
}

fn log_startup(required: Threading, provided: Threading) {
    let world = MpiComm::world();
    let version = mpi::version()
        .map(|(v, s)| format!("{v}.{s}"))
        .unwrap_or_else(|_| "?".into());
    let library = mpi::library_version().unwrap_or_else(|_| "?".into());
    if world.rank() == 0 {
        tracing::info!(
            ranks = world.size(),
            mpi = %version,
            %library,
            ?required,
            ?provided,
            "MPI initialized"
        );
    } else {
        tracing::debug!(rank = world.rank(), ?provided, "MPI initialized");
    }
    if provided < required {
        tracing::info!(
            ?required,
            ?provided,
            "MPI provides a lower thread level than requested; channels will not call MPI concurrently"
        );
    }
}

/// Install the `tracing` subscriber once per process, if `GPUCOLL_LOG` is set
/// (a filter such as `info`, `debug` or `gpucoll=debug`). Logs go to stderr.
fn install_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let spec = match std::env::var("GPUCOLL_LOG") {
            Ok(s) if !s.trim().is_empty() => s,
            _ => return,
        };
        let (filter, bad) = match tracing_subscriber::EnvFilter::try_new(spec.trim()) {
            Ok(f) => (f, false),
            Err(_) => (tracing_subscriber::EnvFilter::new("warn"), true),
        };
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        // An error means the program installed its own subscriber: keep it.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .try_init();
        if bad {
            tracing::warn!("GPUCOLL_LOG={spec:?} is not a valid filter; using \"warn\"");
        }
    });
}

/// Initialize MPI with `MPI_THREAD_MULTIPLE` (or use it, if the program
/// already initialized it) and return the [`Universe`].
///
/// Calling it again while a `Universe` or communicator is alive returns a
/// `Universe` sharing the same state. MPI is finalized when the last
/// `Universe` and communicator are dropped, if gpucoll initialized it.
///
/// ```no_run
/// let universe = gpucoll::initialize()?;
/// let world = universe.world()?;
/// println!("rank {} of {}", world.rank(), world.size());
/// # Ok::<(), gpucoll::Error>(())
/// ```
///
/// # Errors
/// [`Error::MpiState`] if MPI was already finalized; [`Error::Mpi`] if
/// `MPI_Init_thread` fails.
pub fn initialize() -> Result<Universe> {
    initialize_with_threading(Threading::Multiple)
}

/// Like [`initialize`] but requests the thread level `threading`.
///
/// The level MPI actually provides is [`Universe::threading`]. Below
/// [`Threading::Multiple`], gpucoll never calls MPI from several threads
/// at once (the host backend's channels then funnel their MPI traffic).
///
/// ```no_run
/// use gpucoll::Threading;
/// let universe = gpucoll::initialize_with_threading(Threading::Serialized)?;
/// assert!(universe.threading() <= Threading::Multiple);
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn initialize_with_threading(threading: Threading) -> Result<Universe> {
    let runtime = Runtime::acquire(Acquire::Init(threading))?;
    Ok(Universe { runtime })
}

/// The MPI environment, as returned by [`initialize`].
///
/// Dropping it does not invalidate live communicators: MPI stays
/// initialized until they are dropped too.
#[derive(Clone, Debug)]
pub struct Universe {
    runtime: Arc<Runtime>,
}

impl Universe {
    /// A communicator of all processes (a private duplicate of
    /// `MPI_COMM_WORLD`; collective over it).
    ///
    /// ```no_run
    /// let universe = gpucoll::initialize()?;
    /// let world = universe.world()?;
    /// assert!(world.rank() < world.size());
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn world(&self) -> Result<Communicator> {
        if !mpi::is_usable() {
            return Err(Error::MpiState(
                "MPI was finalized by the program while the Universe is alive".into(),
            ));
        }
        let runtime = self.runtime();
        let mpi = MpiComm::world().with_runtime(runtime.clone()).dup()?;
        comm::create(runtime, mpi)
    }

    /// The thread level MPI provides.
    pub fn threading(&self) -> Threading {
        self.runtime.threading()
    }

    pub(crate) fn runtime(&self) -> Arc<Runtime> {
        self.runtime.clone()
    }
}
