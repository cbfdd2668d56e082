//! The rail pair over host memory: a fake rail whose all-reduce sums this
//! rank's piece with `others` copies of it (as if every member held the
//! same data), and host code playing the kernel's side of the FIFOs.

use super::super::{NetLayout, NetMem, Proxy, Wire};
use super::*;
use crate::backend::cuda::abi::{CONN_HEADER, CONN_META_OFF, CONN_TAIL_OFF};
use std::sync::Arc;
use std::time::Duration;

/// No NET peers: the wire is never used.
struct NoWire;

impl Wire for NoWire {
    type Req = ();
    unsafe fn isend(&self, _: *const u8, _: usize, _: usize, _: i32) -> Result<()> {
        Err(Error::Backend("no NET peers".into()))
    }
    unsafe fn irecv(&self, _: *mut u8, _: usize, _: usize, _: i32) -> Result<()> {
        Err(Error::Backend("no NET peers".into()))
    }
    fn test(&self, _: &mut ()) -> Result<Option<usize>> {
        Ok(None)
    }
    fn retire(&self, _: (), _: Duration) -> bool {
        true
    }
}

/// An all-reduce of i32 sums over `members` ranks holding the same data,
/// complete at its second test (so results queue up in the proxy).
struct FakeOp {
    out: Vec<u8>,
    tests: u32,
}

impl RailOp for FakeOp {
    fn test(&mut self) -> Result<Option<&[u8]>> {
        self.tests += 1;
        Ok((self.tests >= 2).then_some(&self.out[..]))
    }
}

/// The all-reduces started: (channel, bytes, datatype, combine).
type Started = Arc<Mutex<Vec<(usize, usize, Datatype, Combine)>>>;

struct FakeRails {
    members: i32,
    started: Started,
}

impl RailNet for FakeRails {
    fn start(
        &self,
        channel: usize,
        data: &[u8],
        dtype: Datatype,
        combine: Combine,
    ) -> Result<Box<dyn RailOp>> {
        self.started
            .lock()
            .unwrap()
            .push((channel, data.len(), dtype, combine));
        let out = data
            .chunks_exact(4)
            .flat_map(|b| (i32::from_le_bytes(b.try_into().unwrap()) * self.members).to_le_bytes())
            .collect();
        Ok(Box::new(FakeOp { out, tests: 0 }))
    }
}

fn layout() -> NetLayout {
    NetLayout {
        peers: Vec::new(),
        channels: 2,
        slots: 4,
        slot_bytes: 64,
        rail: true,
    }
}

struct Setup {
    _block: Vec<u64>,
    mem: NetMem,
    l: NetLayout,
    proxy: Proxy<NoWire>,
    jobs: Arc<RailJobs>,
    started: Started,
}

fn setup() -> Setup {
    let l = layout();
    let mut block = vec![0u64; (l.total() / 8) as usize];
    // SAFETY: 8-aligned, zeroed, kept alive in `Setup`.
    let mem = unsafe { NetMem::new(block.as_mut_ptr() as *mut u8, l.total()) };
    let jobs = Arc::new(RailJobs::new(l.channels as usize));
    let started = Arc::new(Mutex::new(Vec::new()));
    let net = Box::new(FakeRails {
        members: 3,
        started: started.clone(),
    });
    // SAFETY: as above.
    let proxy = unsafe { Proxy::new(NoWire, l.clone(), mem, Some((net, jobs.clone()))) };
    Setup {
        _block: block,
        mem,
        l,
        proxy,
        jobs,
        started,
    }
}

impl Setup {
    /// The kernel stages piece `n` of channel `c` if a slot is free.
    fn stage(&self, c: u64, n: u64, piece: &[i32]) -> bool {
        let i = self.l.rail_index().unwrap();
        let head = self
            .mem
            .word(self.l.send_head(c, i))
            .load(Ordering::Acquire);
        if n >= head + self.l.slots {
            return false;
        }
        let conn = self.l.send_conn(c, i);
        let slot = n % self.l.slots;
        let bytes: Vec<u8> = piece.iter().flat_map(|v| v.to_le_bytes()).collect();
        // SAFETY: inside the block; the proxy does not read a slot the head passed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.mem.ptr(conn + CONN_HEADER + slot * self.l.slot_bytes),
                bytes.len(),
            )
        };
        let meta = (7u64 << 32) | bytes.len() as u64;
        self.mem
            .word(conn + CONN_META_OFF + slot * 8)
            .store(meta, Ordering::Relaxed);
        self.mem
            .word(conn + CONN_TAIL_OFF)
            .store(n + 1, Ordering::Release);
        true
    }

    /// The kernel takes result `n` of channel `c` if it arrived.
    fn take(&self, c: u64, n: u64, len: usize) -> Option<(u64, Vec<i32>)> {
        let i = self.l.rail_index().unwrap();
        let conn = self.l.recv_conn(c, i);
        if self.mem.word(conn + CONN_TAIL_OFF).load(Ordering::Acquire) <= n {
            return None;
        }
        let slot = n % self.l.slots;
        let meta = self
            .mem
            .word(conn + CONN_META_OFF + slot * 8)
            .load(Ordering::Relaxed);
        let mut bytes = vec![0u8; len * 4];
        // SAFETY: inside the block; published by the proxy before the tail.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.ptr(conn + CONN_HEADER + slot * self.l.slot_bytes),
                bytes.as_mut_ptr(),
                bytes.len(),
            )
        };
        self.mem
            .word(self.l.recv_head(c, i))
            .store(n + 1, Ordering::Release);
        let vals = bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Some((meta, vals))
    }
}

/// Two channels, each a rail step of 10 pieces of 16 i32 (more than the
/// 4 slots): every piece is all-reduced once, with the job's datatype
/// and op, and comes back in order with its meta word.
#[test]
fn rail_pieces_are_all_reduced_in_order() {
    let mut s = setup();
    const PIECES: u64 = 10;
    const LEN: usize = 16;
    let job = |combine| RailJob {
        bytes: PIECES * LEN as u64 * 4,
        dtype: Datatype::I32,
        combine,
    };
    s.jobs
        .push(&[(0, job(Combine::Sum)), (1, job(Combine::Max))])
        .unwrap();
    let value = |c: u64, n: u64, j: usize| (c * 1000 + n * 20 + j as u64) as i32;
    let mut sent = [0u64; 2];
    let mut got = [0u64; 2];
    for _ in 0..1000 {
        for c in 0..2u64 {
            let k = c as usize;
            if sent[k] < PIECES {
                let piece: Vec<i32> = (0..LEN).map(|j| value(c, sent[k], j)).collect();
                if s.stage(c, sent[k], &piece) {
                    sent[k] += 1;
                }
            }
            if let Some((meta, vals)) = s.take(c, got[k], LEN) {
                assert_eq!(meta, (7u64 << 32) | (LEN as u64 * 4));
                let want: Vec<i32> = (0..LEN).map(|j| 3 * value(c, got[k], j)).collect();
                assert_eq!(vals, want, "channel {c} piece {}", got[k]);
                got[k] += 1;
            }
        }
        s.proxy.progress().unwrap();
        if got == [PIECES; 2] {
            break;
        }
    }
    assert_eq!(got, [PIECES; 2]);
    assert!(!s.proxy.sending());
    let started = s.started.lock().unwrap();
    assert_eq!(started.len(), 2 * PIECES as usize);
    assert!(started.iter().all(|&(c, len, dt, op)| len == LEN * 4
        && dt == Datatype::I32
        && op == if c == 0 { Combine::Sum } else { Combine::Max }));
    // The jobs were used up exactly.
    assert_eq!(s.jobs.take(0, 4), None);
}

/// A piece no queued rail step expects is an error, not a guess.
#[test]
fn a_piece_without_a_job_fails() {
    let mut s = setup();
    assert!(s.stage(0, 0, &[1, 2, 3, 4]));
    let e = s.proxy.progress().unwrap_err();
    assert!(e.to_string().contains("no queued rail step"), "{e}");
    // A job of other elements (8 bytes each) does not take 6 bytes either.
    let s = setup();
    s.jobs
        .push(&[(
            0,
            RailJob {
                bytes: 64,
                dtype: Datatype::F64,
                combine: Combine::Sum,
            },
        )])
        .unwrap();
    assert_eq!(s.jobs.take(0, 12), None);
    assert_eq!(s.jobs.take(0, 16), Some((Datatype::F64, Combine::Sum)));
    assert_eq!(s.jobs.take(1, 8), None);
}
