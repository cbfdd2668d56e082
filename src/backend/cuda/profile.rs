//! Host time per phase of a submission, to find where the microseconds of
//! a small collective go: with `GPUCOLL_PROFILE_HOST=1` every submission
//! adds the time between its marks to a per-phase sum, and the backend logs
//! the table (`info`, target `gpucoll::profile`) when it is dropped. Off
//! (the default), a mark is one branch on a field.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The phases of one submission, in the order they run.
#[derive(Clone, Copy, Debug)]
pub(super) enum Phase {
    /// Checks of the stream and buffers, plan lowering, staging.
    Lower,
    /// Events, the order across streams, the start marker.
    Prepare,
    /// Step tables to the device.
    Upload,
    /// `cuLaunchKernel` of every kernel.
    Launch,
    /// The end event and the order marker.
    Record,
    /// Handing the work to the watchdog (work on a caller's stream).
    Watch,
    /// A blocking call's wait for completion.
    Wait,
}

const PHASES: [Phase; 7] = [
    Phase::Lower,
    Phase::Prepare,
    Phase::Upload,
    Phase::Launch,
    Phase::Record,
    Phase::Watch,
    Phase::Wait,
];

/// Per-phase sums (nanoseconds and count) of one backend.
pub(super) struct HostProfile {
    on: bool,
    ns: [AtomicU64; 7],
    count: [AtomicU64; 7],
}

impl HostProfile {
    /// Profiling when `on` (`Config::profile_host`).
    pub(super) fn new(on: bool) -> HostProfile {
        HostProfile {
            on,
            ns: Default::default(),
            count: Default::default(),
        }
    }

    /// The start of a measured stretch (None when profiling is off).
    #[inline]
    pub(super) fn clock(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    /// Add the time since `*t` to `phase` and restart the clock there.
    #[inline]
    pub(super) fn lap(&self, t: &mut Option<Instant>, phase: Phase) {
        if let Some(t0) = *t {
            let now = Instant::now();
            let i = phase as usize;
            self.ns[i].fetch_add((now - t0).as_nanos() as u64, Ordering::Relaxed);
            self.count[i].fetch_add(1, Ordering::Relaxed);
            *t = Some(now);
        }
    }

    /// Log the mean time per phase.
    pub(super) fn report(&self, rank: usize) {
        if !self.on {
            return;
        }
        let mut line = String::new();
        for p in PHASES {
            let n = self.count[p as usize].load(Ordering::Relaxed);
            if n > 0 {
                let us = self.ns[p as usize].load(Ordering::Relaxed) as f64 / n as f64 / 1e3;
                line.push_str(&format!(" {p:?} {us:.3} us ({n});"));
            }
        }
        tracing::info!(target: "gpucoll::profile", rank, "host time per submission:{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_only_when_on() {
        let mut p = HostProfile::new(false);
        let mut t = p.clock();
        p.lap(&mut t, Phase::Launch);
        assert_eq!(p.count[Phase::Launch as usize].load(Ordering::Relaxed), 0);
        p.on = true;
        let mut t = p.clock();
        p.lap(&mut t, Phase::Launch);
        p.lap(&mut t, Phase::Wait);
        assert_eq!(p.count[Phase::Launch as usize].load(Ordering::Relaxed), 1);
        assert_eq!(p.count[Phase::Wait as usize].load(Ordering::Relaxed), 1);
        p.report(0);
    }
}
