//! The envelope: the one MPI message (on the envelope communicator, with
//! the user's tag) that every point-to-point message starts with. MPI
//! matches envelopes, so MPI's order and wildcards decide which receive
//! gets which message; the envelope then says where the bytes are.
//!
//! Little-endian 64-bit words:
//!
//! | word | field |
//! |---|---|
//! | 0 | magic (32 bits), version (8), kind (8), datatype (8) |
//! | 1 | message bytes |
//! | 2 | sequence number of the (sender, receiver) pair: the data and completion tags |
//! | 3 | bytes per data message (`Mpi`, and a refused `Pull`'s fallback); 0 otherwise |
//! | … | `Inline`: the payload; `Pull`: the IPC handle (8 words), offset, allocation bytes, buffer ID; `Local`: address, memory |
//!
//! Every field is checked against the others before anything is read
//! through it (SECURITY.md): lengths match the kind, an exported range lies
//! inside its allocation, chunk sizes are in range.

use crate::datatype::Datatype;
use crate::error::{Error, Result};

const MAGIC: u64 = 0x4743_504d; // "GCPM"
const VERSION: u64 = 1;
/// Header words before a kind's own fields.
const HEADER: usize = 4 * 8;
const HANDLE_BYTES: usize = 64;
const PULL_BYTES: usize = HEADER + HANDLE_BYTES + 3 * 8;
const LOCAL_BYTES: usize = HEADER + 2 * 8;
/// Largest data message (`MPI_Isend` counts are `int`s).
pub(crate) const MAX_CHUNK: u64 = 1 << 30;

/// Where a peer on the node finds the sender's device bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exported {
    pub handle: [u8; HANDLE_BYTES],
    /// Of the message's first byte from the allocation's start.
    pub offset: u64,
    pub alloc_bytes: u64,
    pub buffer_id: u64,
}

/// How the message's bytes travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body {
    /// In the envelope itself.
    Inline(Vec<u8>),
    /// In data messages of `chunk` bytes on the data communicator.
    Mpi,
    /// In the sender's device memory, which the receiver maps and copies
    /// from, then completes; or refuses, and the bytes come as `Mpi`.
    Pull(Exported),
    /// At `addr` of the receiver's own address space (a message to self).
    Local { addr: u64, device: bool },
}

/// A parsed envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub dtype: Datatype,
    pub bytes: u64,
    pub seq: u64,
    pub chunk: u64,
    pub body: Body,
}

fn kind_code(b: &Body) -> u64 {
    match b {
        Body::Inline(_) => 1,
        Body::Mpi => 2,
        Body::Pull(_) => 3,
        Body::Local { .. } => 4,
    }
}

fn word(data: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&data[i * 8..i * 8 + 8]);
    u64::from_le_bytes(w)
}

fn bad(detail: impl Into<String>) -> Error {
    Error::Backend(format!(
        "malformed point-to-point envelope: {}",
        detail.into()
    ))
}

impl Envelope {
    /// The bytes of the envelope, for `MPI_Isend`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let first = MAGIC | VERSION << 32 | kind_code(&self.body) << 40 | (self.dtype as u64) << 48;
        let mut out: Vec<u8> = [first, self.bytes, self.seq, self.chunk]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        match &self.body {
            Body::Inline(p) => out.extend_from_slice(p),
            Body::Mpi => {}
            Body::Pull(e) => {
                out.extend_from_slice(&e.handle);
                for w in [e.offset, e.alloc_bytes, e.buffer_id] {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
            Body::Local { addr, device } => {
                for w in [*addr, *device as u64] {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
        out
    }

    /// Read an envelope a peer sent (whatever the bytes).
    pub(crate) fn parse(data: &[u8]) -> Result<Envelope> {
        if data.len() < HEADER {
            return Err(bad(format!(
                "{} bytes, shorter than its header",
                data.len()
            )));
        }
        let first = word(data, 0);
        if first & 0xffff_ffff != MAGIC {
            return Err(bad("wrong magic number"));
        }
        if first >> 32 & 0xff != VERSION {
            return Err(bad(format!("version {}", first >> 32 & 0xff)));
        }
        let dtype = Datatype::ALL
            .get((first >> 48 & 0xff) as usize)
            .copied()
            .filter(|_| first >> 56 == 0)
            .ok_or_else(|| bad("unknown datatype"))?;
        let (bytes, seq, chunk) = (word(data, 1), word(data, 2), word(data, 3));
        let kind = first >> 40 & 0xff;
        let need = match kind {
            1 => usize::try_from(bytes)
                .ok()
                .and_then(|b| b.checked_add(HEADER))
                .ok_or_else(|| bad("inline payload too large"))?,
            2 => HEADER,
            3 => PULL_BYTES,
            4 => LOCAL_BYTES,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        if data.len() != need {
            return Err(bad(format!(
                "kind {kind} of {bytes} bytes in an envelope of {} bytes",
                data.len()
            )));
        }
        // Data messages exist for Mpi, and for Pull when it is refused.
        let chunked = matches!(kind, 2 | 3) && bytes > 0;
        if chunked && !(1..=MAX_CHUNK).contains(&chunk) {
            return Err(bad(format!("data messages of {chunk} bytes")));
        }
        if !chunked && chunk != 0 {
            return Err(bad("a chunk size without data messages"));
        }
        if bytes % dtype.size() as u64 != 0 {
            return Err(bad(format!("{bytes} bytes of {dtype}")));
        }
        let body = match kind {
            1 => Body::Inline(data[HEADER..].to_vec()),
            2 => Body::Mpi,
            3 => {
                let mut handle = [0u8; HANDLE_BYTES];
                handle.copy_from_slice(&data[HEADER..HEADER + HANDLE_BYTES]);
                let at = (HEADER + HANDLE_BYTES) / 8;
                let e = Exported {
                    handle,
                    offset: word(data, at),
                    alloc_bytes: word(data, at + 1),
                    buffer_id: word(data, at + 2),
                };
                let end = e.offset.checked_add(bytes);
                if end.map_or(true, |end| end > e.alloc_bytes) {
                    return Err(bad(format!(
                        "{bytes} bytes at offset {} of an allocation of {}",
                        e.offset, e.alloc_bytes
                    )));
                }
                Body::Pull(e)
            }
            _ => {
                let (addr, device) = (word(data, 4), word(data, 5));
                if device > 1 || (addr == 0 && bytes > 0) || addr.checked_add(bytes).is_none() {
                    return Err(bad("a local address range that cannot be"));
                }
                Body::Local {
                    addr,
                    device: device == 1,
                }
            }
        };
        Ok(Envelope {
            dtype,
            bytes,
            seq,
            chunk,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    fn samples() -> Vec<Envelope> {
        let e = Exported {
            handle: [7; 64],
            offset: 4096,
            alloc_bytes: 4 << 20,
            buffer_id: 99,
        };
        vec![
            Envelope {
                dtype: Datatype::F32,
                bytes: 8,
                seq: 3,
                chunk: 0,
                body: Body::Inline(vec![1, 2, 3, 4, 5, 6, 7, 8]),
            },
            Envelope {
                dtype: Datatype::U8,
                bytes: 0,
                seq: 0,
                chunk: 0,
                body: Body::Inline(Vec::new()),
            },
            Envelope {
                dtype: Datatype::I64,
                bytes: 1 << 20,
                seq: u64::MAX,
                chunk: 4 << 20,
                body: Body::Mpi,
            },
            Envelope {
                dtype: Datatype::BF16,
                bytes: 1 << 20,
                seq: 17,
                chunk: 4 << 20,
                body: Body::Pull(e),
            },
            Envelope {
                dtype: Datatype::F64,
                bytes: 64,
                seq: 1,
                chunk: 0,
                body: Body::Local {
                    addr: 0x1000,
                    device: true,
                },
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for e in samples() {
            assert_eq!(Envelope::parse(&e.encode()).unwrap(), e);
        }
    }

    #[test]
    fn inconsistent_fields_are_refused() {
        let s = samples();
        // An inline length that disagrees with the payload.
        let mut b = s[0].encode();
        b.pop();
        assert!(Envelope::parse(&b).is_err());
        // A pulled range past its allocation.
        let mut p = s[3].clone();
        if let Body::Pull(e) = &mut p.body {
            e.offset = e.alloc_bytes - 8;
        }
        assert!(Envelope::parse(&p.encode()).is_err());
        // Data messages of no bytes, or a chunk without data messages.
        let mut m = s[2].clone();
        m.chunk = 0;
        assert!(Envelope::parse(&m.encode()).is_err());
        let mut i = s[0].clone();
        i.chunk = 8;
        assert!(Envelope::parse(&i.encode()).is_err());
        // Bytes that are no whole number of elements.
        let mut f = s[4].clone();
        f.bytes = 63;
        assert!(Envelope::parse(&f.encode()).is_err());
        // A wrong version.
        let mut v = s[1].encode();
        v[4] = 9;
        assert!(Envelope::parse(&v).is_err());
    }

    /// Random bytes and random mutations of valid envelopes never panic,
    /// and whatever parses encodes back to the same bytes.
    #[test]
    fn random_bytes_never_panic() {
        let mut rng = XorShift::new(0x5eed_9292);
        let valid: Vec<Vec<u8>> = samples().iter().map(Envelope::encode).collect();
        for i in 0..20_000 {
            let b = if i % 2 == 0 {
                rng.mutate(&valid[i % valid.len()])
            } else {
                rng.bytes_below(200)
            };
            if let Ok(e) = Envelope::parse(&b) {
                assert_eq!(e.encode(), b);
            }
        }
    }
}
