//! Who created a segment, written by the creator into its control block
//! before any peer may open it: what peers check on open and what the
//! stale-segment cleanup needs to tell a dead creator from a live one
//! (a pid alone cannot: it may be reused, or seen from another PID
//! namespace). The words sit between the abort word and the reason claim.

use crate::backend::shared::process;
use crate::error::{Error, Result};

/// "GPUCSEG" + header version 1.
pub(crate) const CREATOR_MAGIC: u64 = 0x4750_5543_5345_4701;
/// Byte offset of the header in the control block (after the abort word).
pub(crate) const CREATOR_OFF: usize = 8;
/// Words: magic, pid, start time, PID namespace inode, uid.
pub(crate) const CREATOR_WORDS: usize = 5;
/// Bytes of a segment's start that hold the abort word and the header.
pub(crate) const HEADER_BYTES: usize = CREATOR_OFF + 8 * CREATOR_WORDS;

/// A segment's creator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Creator {
    pub pid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22; 0: unknown).
    pub start: u64,
    /// The inode of its PID namespace (0: unknown).
    pub pidns: u64,
    pub uid: u32,
}

impl Creator {
    /// This process.
    pub(crate) fn current() -> Creator {
        Creator {
            pid: std::process::id(),
            start: process::own_start_time(),
            pidns: process::pid_namespace(),
            uid: process::euid(),
        }
    }

    /// The header's words, in order.
    pub(crate) fn words(&self) -> [u64; CREATOR_WORDS] {
        [
            CREATOR_MAGIC,
            u64::from(self.pid),
            self.start,
            self.pidns,
            u64::from(self.uid),
        ]
    }

    /// The bytes `0..HEADER_BYTES` of a segment holding this header (the
    /// abort word zero).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        for (i, w) in self.words().iter().enumerate() {
            let at = CREATOR_OFF + 8 * i;
            b[at..at + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }
}

/// The creator recorded in a segment's first bytes (at least
/// [`HEADER_BYTES`]; more are ignored). Refuses a missing or foreign
/// magic, a pid that cannot name a process (0, above `i32::MAX`), and a
/// uid that does not fit a `uid_t`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Creator> {
    let bad = |why: &str| Error::Backend(format!("segment header: {why}"));
    let head = bytes
        .get(..HEADER_BYTES)
        .ok_or_else(|| bad(&format!("{} bytes, need {HEADER_BYTES}", bytes.len())))?;
    let w = |i: usize| {
        let at = CREATOR_OFF + 8 * i;
        let mut v = [0u8; 8];
        v.copy_from_slice(&head[at..at + 8]);
        u64::from_le_bytes(v)
    };
    if w(0) != CREATOR_MAGIC {
        return Err(bad(&format!("magic {:#018x}, not gpucoll's", w(0))));
    }
    let pid = w(1);
    if pid == 0 || pid > i32::MAX as u64 {
        return Err(bad(&format!("creator pid {pid}")));
    }
    let uid = u32::try_from(w(4)).map_err(|_| bad(&format!("creator uid {}", w(4))))?;
    Ok(Creator {
        pid: pid as u32,
        start: w(2),
        pidns: w(3),
        uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    #[test]
    fn headers_round_trip() {
        let c = Creator::current();
        assert_eq!(c.pid, std::process::id());
        assert_eq!(parse(&c.encode()), Ok(c));
        let mut longer = c.encode().to_vec();
        longer.extend([0xff; 100]);
        assert_eq!(parse(&longer), Ok(c));
        assert!(parse(&c.encode()[..HEADER_BYTES - 1]).is_err());
        assert!(parse(&[0u8; HEADER_BYTES]).is_err(), "no magic: refused");
        for pid in [0u32, i32::MAX as u32 + 1, u32::MAX] {
            let b = Creator { pid, ..c }.encode();
            assert!(parse(&b).is_err(), "pid {pid}");
        }
        let mut b = c.encode();
        b[CREATOR_OFF + 32..CREATOR_OFF + 40].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(parse(&b).is_err(), "uid beyond uid_t");
    }

    /// Random and mutated headers: no panic; whatever is accepted encodes
    /// back to the same header bytes (every field checked, none ignored).
    #[test]
    fn random_headers_never_panic() {
        let mut rng = XorShift::new(0x5e6_4ead);
        let valid = Creator::current().encode();
        for i in 0..20_000 {
            let bytes = if i % 2 == 0 {
                rng.mutate(&valid)
            } else {
                rng.bytes_below(2 * HEADER_BYTES as u64)
            };
            if let Ok(c) = parse(&bytes) {
                assert_eq!(c.encode()[CREATOR_OFF..], bytes[CREATOR_OFF..HEADER_BYTES]);
                assert!(c.pid > 0 && c.pid <= i32::MAX as u32);
            }
        }
    }
}
