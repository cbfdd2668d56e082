//! The process-wide MPI runtime: who initialized MPI, the thread level it
//! provides, and finalization once nothing uses MPI any more. It lives with
//! the MPI layer so that everything holding an MPI handle (communicators,
//! backends) depends downward on it, never on the user-facing `env`.

use super::MpiComm;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, Once, Weak};

/// MPI thread-support levels (`MPI_THREAD_*`), in increasing order.
///
/// Request one with [`initialize_with_threading`](crate::initialize_with_threading);
/// the level MPI provides may be lower, and levels compare in order:
///
/// ```no_run
/// use gpucoll::Threading;
///
/// let universe = gpucoll::initialize_with_threading(Threading::Funneled)?;
/// if universe.threading() < Threading::Funneled {
///     eprintln!("MPI provides only {:?}: collectives from the main thread only", universe.threading());
/// }
/// # Ok::<(), gpucoll::Error>(())
/// ```
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

    /// The runtime for [`crate::initialize_with_threading`]: initialize MPI
    /// with `required` unless someone already has.
    pub(crate) fn initialized(required: Threading) -> Result<Arc<Runtime>> {
        Runtime::acquire(Acquire::Init(required))
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
            if super::is_usable() {
                return Ok(rt);
            }
            return Err(Error::MpiState(
                "MPI was finalized by the program while gpucoll still uses it".into(),
            ));
        }
        if global.initialized_by_us || super::is_finalized() {
            return Err(Error::MpiState(
                "MPI has already been finalized (it cannot be initialized twice in a process)"
                    .into(),
            ));
        }
        let (owns_mpi, threading) = if super::is_initialized() {
            (false, super::query_thread()?)
        } else {
            match mode {
                Acquire::Borrow => {
                    return Err(Error::MpiState(
                        "MPI is not initialized (call MPI_Init or gpucoll::initialize first)"
                            .into(),
                    ))
                }
                Acquire::Init(required) => {
                    let provided = super::init_thread(required)?;
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
        if self.owns_mpi && super::is_usable() {
            tracing::debug!("finalizing MPI");
            if let Err(e) = super::finalize() {
                tracing::debug!("MPI_Finalize failed: {e}");
            }
        }
    }
}

fn log_startup(required: Threading, provided: Threading) {
    let world = MpiComm::world();
    let version = super::version()
        .map(|(v, s)| format!("{v}.{s}"))
        .unwrap_or_else(|_| "?".into());
    let library = super::library_version().unwrap_or_else(|_| "?".into());
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
