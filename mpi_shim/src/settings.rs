//! The shim's environment variables, read once at the first intercepted call.
//!
//! * `GPUCOLL_SHIM=0`: pure passthrough, every call goes to its `PMPI_` name.
//! * `GPUCOLL_SHIM_HOST=1`: host buffers are routed through gpucoll too (its
//!   host backend when there is no GPU): the test mode that exercises routing,
//!   communicator caching and requests on machines without a GPU.
//! * `GPUCOLL_SHIM_HOST_REFUSE=1` (with `GPUCOLL_SHIM_HOST=1`): one-sided and
//!   MPI-IO calls on host buffers are refused as on device memory, so the
//!   refusals are tested without a GPU. Off by default, so that a program
//!   in host test mode keeps MPI's one-sided and I/O calls, and behaves as
//!   without the shim (mpi4py's own test suite is compared that way).
//! * `GPUCOLL_SHIM_LOG=1`: one line per intercepted call on stderr saying
//!   where it went and why.
//! * `GPUCOLL_CHECK=1` (gpucoll's check mode): every routed collective first
//!   agrees across ranks on the route, so a rank on host memory and a peer on
//!   device memory both get an error instead of waiting on each other.
//! * `GPUCOLL_LEGACY_STREAM_ORDER` (on unless `0`): device collectives start
//!   after the program's work on the legacy default stream, as CUDA-aware
//!   MPI libraries order them (`Config::legacy_stream_order` for gpucoll's
//!   stream; the legacy stream of a context the program created itself is
//!   synchronized, `cuda::CtxGuard::bind`).
//! * `GPUCOLL_TIMEOUT` (gpucoll's, 300 s by default): also the longest the
//!   shim waits for a collective it hands to MPI on a communicator that
//!   has a gpucoll communicator (`deadline.rs`), and for the handshake that
//!   creates one (`comms.rs`).
//! * `GPUCOLL_SHIM_PANIC=MPI_Allreduce,MPI_Wait` (a test hook): the named
//!   calls panic inside the shim, so the tests can show that a panic
//!   becomes an MPI error (`MPI_ERR_INTERN`) and never unwinds into the
//!   program.

use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Settings {
    pub enabled: bool,
    pub host_mode: bool,
    /// `GPUCOLL_SHIM_HOST_REFUSE`: host test mode also refuses one-sided
    /// and MPI-IO calls on host buffers.
    pub host_refuse: bool,
    pub log: bool,
    pub check: bool,
    pub legacy_order: bool,
    /// `GPUCOLL_TIMEOUT`, as gpucoll reads it.
    pub timeout: Duration,
    /// `GPUCOLL_SHIM_PANIC`: the intercepted calls that panic on purpose.
    pub panic_in: Vec<String>,
}

fn flag(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => match v.trim() {
            "" => default,
            "0" | "false" | "off" | "no" => false,
            _ => true,
        },
        Err(_) => default,
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// The settings, decided once per process.
pub fn get() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        enabled: flag("GPUCOLL_SHIM", true),
        host_mode: flag("GPUCOLL_SHIM_HOST", false),
        host_refuse: flag("GPUCOLL_SHIM_HOST_REFUSE", false),
        log: flag("GPUCOLL_SHIM_LOG", false),
        check: flag("GPUCOLL_CHECK", false),
        legacy_order: flag("GPUCOLL_LEGACY_STREAM_ORDER", true),
        // A value gpucoll rejects fails its communicator's creation with a
        // message; the shim's own waits then use the default.
        timeout: gpucoll::Config::from_env()
            .map(|c| c.timeout)
            .unwrap_or(Duration::from_secs_f64(
                gpucoll::config::DEFAULT_TIMEOUT_SECS,
            )),
        panic_in: std::env::var("GPUCOLL_SHIM_PANIC")
            .map(|v| names(&v))
            .unwrap_or_default(),
    })
}

thread_local! {
    /// Set while this thread runs gpucoll code on the shim's behalf: MPI calls
    /// gpucoll makes then go straight to `PMPI_` (a shim export is never
    /// re-entered from inside itself).
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The names of a comma-separated list.
fn names(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The `GPUCOLL_SHIM_PANIC` test hook: panic if `call` is a named call.
#[inline]
pub fn maybe_panic(call: &str) {
    let named = &get().panic_in;
    if !named.is_empty() && named.iter().any(|n| n == call) {
        panic!("GPUCOLL_SHIM_PANIC names {call}: a panic inside it, on purpose");
    }
}

/// Whether this call should be looked at (shim enabled, not re-entered).
#[inline]
pub fn active() -> bool {
    get().enabled && !INSIDE.with(|c| c.get())
}

/// Marks the current thread as inside the shim until dropped.
pub struct Inside {
    was: bool,
}

impl Inside {
    pub fn enter() -> Inside {
        Inside {
            was: INSIDE.with(|c| c.replace(true)),
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let was = self.was;
        INSIDE.with(|c| c.set(was));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_hook_names_are_a_list() {
        assert_eq!(names(" MPI_Wait, MPI_Send ,,"), ["MPI_Wait", "MPI_Send"]);
        assert!(names("").is_empty());
    }

    #[test]
    fn inside_nests_and_restores() {
        assert!(!INSIDE.with(|c| c.get()));
        {
            let _a = Inside::enter();
            assert!(INSIDE.with(|c| c.get()));
            {
                let _b = Inside::enter();
            }
            assert!(INSIDE.with(|c| c.get()));
        }
        assert!(!INSIDE.with(|c| c.get()));
    }
}
