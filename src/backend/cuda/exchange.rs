//! The CUDA backend's setup exchange (bring-up stage 2): what each rank
//! tells every other over MPI (its identity, the nonce naming its control
//! segment, its device and layout proposals), encoded as fixed
//! little-endian words and parsed with every field checked against the
//! bounds the bring-up relies on, so a truncated or corrupt exchange is an
//! error, never a panic or an absurd layout. Also [`agree`], which ends
//! every bring-up stage (`bringup.rs` and the transports' stages).

use crate::backend::shared::setup;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;

/// Whether every rank succeeded a bring-up stage (collective): our own
/// error wins, else the ranks that failed `what` are named.
pub(super) fn agree<T>(mpi: &MpiComm, mine: Result<T>, what: &str) -> Result<T> {
    setup::agree(mpi, mine, |failed| {
        Error::Backend(format!(
            "CUDA backend setup: ranks {failed:?} could not {what}"
        ))
    })
}

/// Words per rank.
pub(crate) const WORDS: usize = 11;
/// Most channels a rank may propose (the status area's limit).
const MAX_CHANNELS: u64 = super::layout::MAX_CHANNELS as u64;
/// Largest slot a rank may propose (`GPUCOLL_CUDA_SLOT_KB` is clamped to it).
const MAX_SLOT: u64 = 4 << 20;

/// One rank's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RankSetup {
    pub pid: u32,
    /// Names its control segment (128 random bits of its own).
    pub nonce: u128,
    /// Its device ordinal.
    pub ordinal: i32,
    /// `GPUCOLL_P2P_DISABLE` on this rank.
    pub p2p_off: bool,
    /// Channels it asks for (1..=MAX_CHANNELS).
    pub channels: usize,
    /// Slot bytes it asks for (0: no preference).
    pub slot: usize,
    /// Names its physical GPU across the job.
    pub gpu: u64,
    /// Its GPU's multiprocessors (0: unknown).
    pub sms: usize,
    /// Its start time (`/proc/<pid>/stat` field 22; 0: unknown).
    pub start: u64,
    /// Connector memory it allows (`GPUCOLL_MAX_MEM` bytes; 0: no limit).
    pub budget: u64,
}

impl RankSetup {
    pub(crate) fn encode(&self) -> Vec<u8> {
        [
            u64::from(self.pid),
            self.nonce as u64,
            (self.nonce >> 64) as u64,
            self.ordinal as u64,
            u64::from(self.p2p_off),
            self.channels as u64,
            self.slot as u64,
            self.gpu,
            self.sms as u64,
            self.start,
            self.budget,
        ]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
    }
}

/// Every rank's part from the allgathered bytes of `nranks` ranks.
pub(crate) fn parse(all: &[u8], nranks: usize) -> Result<Vec<RankSetup>> {
    let bad = |why: String| Error::Backend(format!("CUDA backend setup exchange: {why}"));
    if nranks == 0 || all.len() != 8 * WORDS * nranks {
        return Err(bad(format!(
            "{} bytes for {nranks} ranks, expected {}",
            all.len(),
            8 * WORDS * nranks
        )));
    }
    all.chunks_exact(8 * WORDS)
        .enumerate()
        .map(|(r, b)| {
            let w = |i: usize| {
                let mut v = [0u8; 8];
                v.copy_from_slice(&b[8 * i..8 * i + 8]);
                u64::from_le_bytes(v)
            };
            let field = |i: usize, what: &str, ok: &dyn Fn(u64) -> bool| {
                if ok(w(i)) {
                    Ok(w(i))
                } else {
                    Err(bad(format!("rank {r}: {what} {}", w(i))))
                }
            };
            Ok(RankSetup {
                pid: field(0, "pid", &|v| v != 0 && v <= i32::MAX as u64)? as u32,
                nonce: u128::from(w(1)) | u128::from(w(2)) << 64,
                ordinal: field(3, "device ordinal", &|v| v <= i32::MAX as u64)? as i32,
                p2p_off: field(4, "P2P switch", &|v| v <= 1)? == 1,
                channels: field(5, "channels", &|v| (1..=MAX_CHANNELS).contains(&v))? as usize,
                slot: field(6, "slot bytes", &|v| {
                    v == 0 || (4096..=MAX_SLOT).contains(&v)
                })? as usize,
                gpu: w(7),
                sms: field(8, "multiprocessors", &|v| v <= 1 << 20)? as usize,
                start: w(9),
                budget: w(10),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    fn sample(r: u32) -> RankSetup {
        RankSetup {
            pid: 4000 + r,
            nonce: u128::MAX / 3 - u128::from(r),
            ordinal: r as i32,
            p2p_off: r % 2 == 1,
            channels: 64,
            slot: if r == 0 { 0 } else { 512 << 10 },
            gpu: 0xabc + u64::from(r),
            sms: 132,
            start: 9 + u64::from(r),
            budget: u64::from(r) << 20,
        }
    }

    #[test]
    fn exchanges_round_trip_and_bad_fields_are_refused() {
        let all: Vec<u8> = (0..4).flat_map(|r| sample(r).encode()).collect();
        assert_eq!(
            parse(&all, 4).unwrap(),
            (0..4).map(sample).collect::<Vec<_>>()
        );
        assert!(parse(&all, 3).is_err());
        assert!(parse(&all[8..], 4).is_err());
        assert!(parse(&[], 0).is_err());
        let base = sample(0);
        for bad in [
            RankSetup { pid: 0, ..base },
            RankSetup {
                ordinal: -1,
                ..base
            },
            RankSetup {
                channels: 0,
                ..base
            },
            RankSetup {
                channels: 129,
                ..base
            },
            RankSetup { slot: 100, ..base },
            RankSetup {
                slot: 8 << 20,
                ..base
            },
            RankSetup {
                sms: 1 << 21,
                ..base
            },
        ] {
            assert!(parse(&bad.encode(), 1).is_err(), "{bad:?}");
        }
        let mut two = base.encode();
        two[32] = 2;
        assert!(parse(&two, 1).is_err(), "P2P switch of 2");
    }

    /// Random and mutated exchanges: no panic; what is accepted encodes
    /// back to the same bytes.
    #[test]
    fn random_exchanges_never_panic() {
        let mut rng = XorShift::new(0x0c0d_a5e7);
        let valid: Vec<u8> = (0..2).flat_map(|r| sample(r).encode()).collect();
        for i in 0..20_000 {
            let b = if i % 5 == 0 {
                rng.bytes_below(240)
            } else {
                rng.mutate(&valid)
            };
            let n = (b.len() / (8 * WORDS)).max(1);
            if let Ok(ranks) = parse(&b, n) {
                let again: Vec<u8> = ranks.iter().flat_map(RankSetup::encode).collect();
                assert_eq!(again, b);
            }
        }
    }
}
