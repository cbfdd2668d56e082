//! Inter-node costs measured when a communicator spanning nodes is created,
//! so that the tuner compares ring, tree and collnet on this cluster's
//! figures instead of guesses: MPI point-to-point between neighbouring
//! nodes (the NET hops of rings and trees) and MPI's own all_reduce on the
//! rail (collnet), each at a small and a large size. Every rank measures;
//! the slowest rank's figures (which bound any collective) are agreed by
//! all, so every rank's tuner makes the same choices.

use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::op::Combine;
use crate::tune::caps::LinkCost;
use std::time::Instant;

/// Sizes measured: the latency and the bandwidth points.
const SMALL: usize = 8;
const LARGE: usize = 256 << 10;
/// Timed repetitions per point (after one warm-up); the fastest is kept:
/// noise (a descheduled peer on an oversubscribed node) only adds time.
const REPS: usize = 5;
/// Tag of the point-to-point measurement on the rail communicator, where
/// nothing else sends point-to-point messages.
const TAG: i32 = 0x6361;

/// Measured times (µs): point-to-point exchange small/large, rail
/// all_reduce small/large.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measured {
    pub p2p_small_us: f64,
    pub p2p_large_us: f64,
    pub rail_small_us: f64,
    pub rail_large_us: f64,
}

/// Measure on `rail` (this rank's rail communicator: one rank per node,
/// ranked by node): an exchange with the neighbouring nodes, then MPI's
/// all_reduce. Collective over `rail`.
pub(crate) fn measure(rail: &MpiComm) -> Result<Measured> {
    let nodes = rail.size();
    let me = rail.rank();
    let (to, from) = ((me + 1) % nodes, (me + nodes - 1) % nodes);
    let exchange = |bytes: usize| -> Result<f64> {
        let send = vec![1u8; bytes];
        let mut recv = vec![0u8; bytes];
        let t = Instant::now();
        // SAFETY: both vectors outlive the requests, which are waited for
        // below before they are dropped.
        let (mut r, mut s) = unsafe {
            (
                rail.irecv(recv.as_mut_ptr(), bytes, from, TAG)?,
                rail.isend(send.as_ptr(), bytes, to, TAG)?,
            )
        };
        while r.test()?.is_none() || s.test()?.is_none() {
            // Yield: on an oversubscribed node the peer needs the core.
            std::thread::yield_now();
        }
        Ok(t.elapsed().as_secs_f64() * 1e6)
    };
    let reduce = |bytes: usize| -> Result<f64> {
        let data = vec![0u8; bytes];
        let t = Instant::now();
        let mut req = rail.rail_all_reduce(&data, crate::datatype::Datatype::F32, Combine::Sum)?;
        while req.test()?.is_none() {
            // Yield: on an oversubscribed node the peer needs the core.
            std::thread::yield_now();
        }
        Ok(t.elapsed().as_secs_f64() * 1e6)
    };
    Ok(Measured {
        p2p_small_us: fastest_of(|| exchange(SMALL))?,
        p2p_large_us: fastest_of(|| exchange(LARGE))?,
        rail_small_us: fastest_of(|| reduce(SMALL))?,
        rail_large_us: fastest_of(|| reduce(LARGE))?,
    })
}

fn fastest_of(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    f()?;
    (0..REPS).try_fold(f64::INFINITY, |best, _| Ok(best.min(f()?)))
}

/// The slowest rank's figures, agreed over `comm` (collective).
pub(crate) fn agree(comm: &MpiComm, mine: Measured) -> Result<Measured> {
    let words = [
        mine.p2p_small_us,
        mine.p2p_large_us,
        mine.rail_small_us,
        mine.rail_large_us,
    ];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let all = comm.allgather_bytes(&bytes)?;
    if all.len() != bytes.len() * comm.size() {
        return Err(Error::Backend("calibration exchange was truncated".into()));
    }
    let mut worst = [0f64; 4];
    for rank in all.chunks_exact(32) {
        for (i, w) in rank.chunks_exact(8).enumerate() {
            let v = f64::from_le_bytes(w.try_into().expect("8 bytes"));
            if v.is_finite() {
                worst[i] = worst[i].max(v);
            }
        }
    }
    Ok(Measured {
        p2p_small_us: worst[0],
        p2p_large_us: worst[1],
        rail_small_us: worst[2],
        rail_large_us: worst[3],
    })
}

/// `mine` (this rank's measurement, started at `started`) agreed across
/// `comm` and turned into the tuner's link costs over `nodes` nodes,
/// logged at info: what both backends do at creation with several nodes.
/// `bridge_us`: what the backend's own NET path adds to each MPI message
/// or rail all-reduce (see [`costs`]).
pub(crate) fn agreed_costs(
    comm: &MpiComm,
    mine: Measured,
    nodes: usize,
    started: Instant,
    bridge_us: f64,
) -> Result<(LinkCost, LinkCost)> {
    let m = agree(comm, mine)?;
    let c = costs(&m, nodes, bridge_us);
    tracing::info!(
        rank = comm.rank(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        ?m,
        inter = ?c.0,
        rail = ?c.1,
        "inter-node costs measured"
    );
    Ok(c)
}

/// The link costs the tuner uses, from agreed measurements over `nodes`
/// nodes: (NET hop, rail all_reduce per call). Latency comes from the small
/// size, bandwidth from the large one alone (a difference of two noisy
/// times can even be negative). The bandwidths are what two processes
/// move through MPI, however many channels share it (MPI point-to-point
/// between two processes measured no faster with more streams:
/// `bench/results/2026-12-02-h200x1-net/mpi-p2p.txt`). The rail's latency
/// is per tree level (log2 of the nodes, as the model counts it); its
/// bandwidth is in the model's units (about twice the shard's bytes move
/// per all_reduce). `bridge_us` is added once to a hop and to a rail step:
/// the measurement times MPI alone, while the backend's path also carries
/// every piece between its buffers and MPI (the CUDA backend: a kernel's
/// store into mapped host memory, the proxy thread noticing it, and the
/// receiving kernel's poll). Figures are clamped to a sane range so that a
/// disturbed measurement cannot produce an absurd plan.
pub(crate) fn costs(m: &Measured, nodes: usize, bridge_us: f64) -> (LinkCost, LinkCost) {
    let levels = (usize::BITS - nodes.max(2).saturating_sub(1).leading_zeros()) as f64;
    let gbs = |bytes: f64, us: f64| (bytes / (us.max(0.01) * 1000.0)).clamp(0.01, 1000.0);
    let p2p_bw = gbs(LARGE as f64, m.p2p_large_us);
    let rail_bw = gbs(2.0 * LARGE as f64, m.rail_large_us);
    let bridge = if bridge_us.is_finite() {
        bridge_us.max(0.0)
    } else {
        0.0
    };
    (
        LinkCost {
            latency_us: (m.p2p_small_us + bridge).clamp(0.1, 10_000.0),
            bandwidth_gbs: p2p_bw,
        },
        LinkCost {
            latency_us: ((m.rail_small_us + bridge) / levels).clamp(0.1, 10_000.0),
            bandwidth_gbs: rail_bw,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_from_measurements() {
        let m = Measured {
            p2p_small_us: 5.0,
            p2p_large_us: 262.144, // 256 KiB at 1 GB/s
            rail_small_us: 40.0,
            rail_large_us: 262.144, // 2 x 256 KiB at 2 GB/s
        };
        let (inter, rail) = costs(&m, 4, 0.0);
        assert!((inter.latency_us - 5.0).abs() < 1e-9);
        assert!((inter.bandwidth_gbs - 1.0).abs() < 1e-6);
        assert!(
            (rail.latency_us - 20.0).abs() < 1e-9,
            "two levels for 4 nodes"
        );
        assert!((rail.bandwidth_gbs - 2.0).abs() < 1e-6);
        // Absurd figures (a zero time, a huge one) stay in range.
        let odd = Measured {
            p2p_large_us: 0.0,
            rail_small_us: 1e12,
            ..m
        };
        let (inter, rail) = costs(&odd, 2, f64::NAN);
        assert!(inter.bandwidth_gbs > 0.0 && inter.bandwidth_gbs <= 1000.0);
        assert!(rail.latency_us <= 10_000.0);
        // The backend's bridge: once per hop, once per rail step (spread
        // over the levels as the latency is).
        let (inter, rail) = costs(&m, 4, 10.0);
        assert!((inter.latency_us - 15.0).abs() < 1e-9);
        assert!((rail.latency_us - 25.0).abs() < 1e-9);
        assert!((inter.bandwidth_gbs - 1.0).abs() < 1e-6);
    }
}
