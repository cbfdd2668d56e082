//! The host backend's setup exchange: what each rank tells every other
//! over MPI before any segment exists (its identity, the nonce naming its
//! segment, its layout proposal), encoded as fixed little-endian words and
//! parsed with every field checked, so a truncated or corrupt exchange is
//! an error, never a panic or an absurd layout.

use super::fifo;
use crate::error::{Error, Result};

/// Words per rank.
pub(crate) const WORDS: usize = 7;

/// One rank's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RankSetup {
    pub pid: u32,
    /// Names its segment (128 random bits of its own).
    pub nonce: u128,
    /// Its FIFO slot size proposal (bytes, whole lines).
    pub slot_bytes: usize,
    /// Its channel count proposal.
    pub channels: usize,
    /// Which machine it runs on (`host_key`).
    pub host: u64,
    /// Its start time (`/proc/<pid>/stat` field 22; 0: unknown).
    pub start: u64,
}

impl RankSetup {
    pub(crate) fn encode(&self) -> Vec<u8> {
        [
            u64::from(self.pid),
            self.nonce as u64,
            (self.nonce >> 64) as u64,
            self.slot_bytes as u64,
            self.channels as u64,
            self.host,
            self.start,
        ]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
    }
}

/// Every rank's part from the allgathered bytes of `nranks` ranks, whose
/// proposals may not exceed `max_slot` bytes and `max_channels` channels.
pub(crate) fn parse(
    all: &[u8],
    nranks: usize,
    max_slot: usize,
    max_channels: usize,
) -> Result<Vec<RankSetup>> {
    let bad = |why: String| Error::Backend(format!("host backend setup exchange: {why}"));
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
            let pid = u32::try_from(w(0))
                .ok()
                .filter(|&p| p != 0 && p <= i32::MAX as u32)
                .ok_or_else(|| bad(format!("rank {r}: pid {}", w(0))))?;
            let slot_bytes = usize::try_from(w(3))
                .ok()
                .filter(|&s| s >= fifo::LINE && s <= max_slot && s % fifo::LINE == 0)
                .ok_or_else(|| bad(format!("rank {r}: slot bytes {}", w(3))))?;
            let channels = usize::try_from(w(4))
                .ok()
                .filter(|&c| c >= 1 && c <= max_channels)
                .ok_or_else(|| bad(format!("rank {r}: channels {}", w(4))))?;
            Ok(RankSetup {
                pid,
                nonce: u128::from(w(1)) | u128::from(w(2)) << 64,
                slot_bytes,
                channels,
                host: w(5),
                start: w(6),
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
            pid: 1000 + r,
            nonce: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210 ^ u128::from(r),
            slot_bytes: 128 << 10,
            channels: 4,
            host: 0xfeed,
            start: 77 + u64::from(r),
        }
    }

    #[test]
    fn exchanges_round_trip_and_bad_fields_are_refused() {
        let all: Vec<u8> = (0..3).flat_map(|r| sample(r).encode()).collect();
        let got = parse(&all, 3, 1 << 30, 4).unwrap();
        assert_eq!(got, (0..3).map(sample).collect::<Vec<_>>());
        assert!(parse(&all, 2, 1 << 30, 4).is_err(), "length for 2 ranks");
        assert!(parse(&all[..all.len() - 1], 3, 1 << 30, 4).is_err());
        assert!(parse(&[], 0, 1 << 30, 4).is_err());
        for bad in [
            RankSetup {
                pid: 0,
                ..sample(0)
            },
            RankSetup {
                pid: u32::MAX,
                ..sample(0)
            },
            RankSetup {
                slot_bytes: 0,
                ..sample(0)
            },
            RankSetup {
                slot_bytes: 100,
                ..sample(0)
            },
            RankSetup {
                slot_bytes: 2 << 30,
                ..sample(0)
            },
            RankSetup {
                channels: 0,
                ..sample(0)
            },
            RankSetup {
                channels: 5,
                ..sample(0)
            },
        ] {
            assert!(parse(&bad.encode(), 1, 1 << 30, 4).is_err(), "{bad:?}");
        }
    }

    /// Random and mutated exchanges: no panic; what is accepted encodes
    /// back to the same bytes and keeps every bound.
    #[test]
    fn random_exchanges_never_panic() {
        let mut rng = XorShift::new(0x0405_75e7);
        let valid: Vec<u8> = (0..2).flat_map(|r| sample(r).encode()).collect();
        for i in 0..20_000 {
            let b = if i % 5 == 0 {
                rng.bytes_below(200)
            } else {
                rng.mutate(&valid)
            };
            let n = (b.len() / (8 * WORDS)).max(1);
            if let Ok(ranks) = parse(&b, n, 1 << 30, 4) {
                let again: Vec<u8> = ranks.iter().flat_map(RankSetup::encode).collect();
                assert_eq!(again, b);
                assert!(ranks
                    .iter()
                    .all(|r| r.channels <= 4 && r.slot_bytes <= 1 << 30));
            }
        }
    }
}
