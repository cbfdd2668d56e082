//! The shim's environment variables, read once at the first intercepted call.
//!
//! * `GPUCOLL_SHIM=0`: pure passthrough, every call goes to its `PMPI_` name.
//! * `GPUCOLL_SHIM_HOST=1`: host buffers are routed through gpucoll too (its
//!   host backend when there is no GPU): the test mode that exercises routing,
//!   communicator caching and requests on machines without a GPU.
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

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub enabled: bool,
    pub host_mode: bool,
    pub log: bool,
    pub check: bool,
    pub legacy_order: bool,
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
        log: flag("GPUCOLL_SHIM_LOG", false),
        check: flag("GPUCOLL_CHECK", false),
        legacy_order: flag("GPUCOLL_LEGACY_STREAM_ORDER", true),
    })
}

thread_local! {
    /// Set while this thread runs gpucoll code on the shim's behalf: MPI calls
    /// gpucoll makes then go straight to `PMPI_` (a shim export is never
    /// re-entered from inside itself).
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
