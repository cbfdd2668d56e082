//! Fuzz of the argument checks: every rank draws the same random calls of
//! the raw entry points (host pointers, no stream) with random collectives,
//! datatypes, ops, counts (0, 1, primes, large), roots (some out of range),
//! null and misaligned pointers, in-place layouts and stray streams. Each
//! call must either fail with an `Error` (never a panic) or succeed with the
//! right result; no call may write outside its receive buffer (guard bytes
//! on both sides). The number of cases tried is printed.

mod common;

use common::*;
use gpucoll::{Communicator, Datatype, Error, ReduceOp};
use std::ffi::c_void;

const GUARD: usize = 64;
const POISON: u8 = 0xA5;

fn cases() -> Vec<Case> {
    vec![
        Case::new("fuzz::n3", 3, "fuzz").env("GPUCOLL_TEST_PARAMS", "cases=3000"),
        Case::new("fuzz::n4_sim2", 4, "fuzz")
            .env("GPUCOLL_SIM_NODES", "2")
            .env("GPUCOLL_TEST_PARAMS", "cases=800"),
    ]
}

fn main() {
    main_with(cases(), worker)
}

use gpucoll::CollKind as Kind;

const KINDS: [Kind; 10] = Kind::ALL;

/// A byte buffer with poisoned guards on both sides; `at(off)` is the
/// address `off` bytes into the payload.
struct Guarded {
    bytes: Vec<u8>,
    len: usize,
}

impl Guarded {
    /// The payload starts `misalign` bytes after an aligned address.
    fn new(len: usize, misalign: usize, fill: impl Fn(usize) -> u8) -> Guarded {
        let mut bytes = vec![POISON; len + 2 * GUARD + 16];
        for i in 0..len {
            bytes[GUARD + misalign + i] = fill(i);
        }
        Guarded { bytes, len }
    }
    fn ptr(&mut self, misalign: usize) -> *mut c_void {
        // SAFETY: GUARD + misalign stays inside the allocation.
        unsafe { self.bytes.as_mut_ptr().add(GUARD + misalign) as *mut c_void }
    }
    fn guards_intact(&self, misalign: usize) -> bool {
        let lo = &self.bytes[..GUARD + misalign];
        let hi = &self.bytes[GUARD + misalign + self.len..];
        lo.iter().all(|&b| b == POISON) && hi.iter().all(|&b| b == POISON)
    }
    fn payload(&self, misalign: usize) -> &[u8] {
        &self.bytes[GUARD + misalign..GUARD + misalign + self.len]
    }
}

/// Byte `i` of rank `r`'s send buffer.
fn input_byte(r: usize, i: usize) -> u8 {
    ((r * 37 + i * 11) % 7) as u8
}

fn worker(scenario: &str) -> std::result::Result<(), String> {
    if scenario != "fuzz" {
        return Err(format!("unknown scenario {scenario}"));
    }
    let universe = ok(gpucoll::initialize(), "initialize");
    let world = ok(universe.world(), "universe.world()");
    let cases: usize = param("cases").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let mut rng = Rng::new(0x00f0_22ed);
    let mut fails: Vec<String> = Vec::new();
    let (mut oks, mut errs) = (0usize, 0usize);
    for k in 0..cases {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            one_case(&world, &mut rng, k)
        })) {
            Ok(Ok(true)) => oks += 1,
            Ok(Ok(false)) => errs += 1,
            Ok(Err(msg)) => fails.push(msg),
            Err(_) => fails.push(format!("case {k}: PANIC")),
        }
    }
    for f in &fails {
        log(&format!("FAIL {f}"));
    }
    if world.rank() == 0 {
        println!(
            "fuzz: {} cases on {} ranks: {oks} completed and checked, {errs} clean errors, {} failures",
            oks + errs + fails.len(),
            world.size(),
            fails.len()
        );
    }
    drop(world);
    drop(universe);
    if fails.is_empty() {
        Ok(())
    } else {
        Err(format!("{} fuzz failures", fails.len()))
    }
}

/// One random call: Ok(true) completed and checked, Ok(false) a clean
/// error, Err a failure of the library (wrong result, guard overwritten).
fn one_case(world: &Communicator, rng: &mut Rng, k: usize) -> std::result::Result<bool, String> {
    let (rank, n) = (world.rank(), world.size());
    let kind = KINDS[(rng.next() % KINDS.len() as u64) as usize];
    let dtype = Datatype::ALL[(rng.next() % Datatype::ALL.len() as u64) as usize];
    let esize = dtype.size();
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::BitXor,
        ReduceOp::LogicalOr,
    ];
    let op = ops[(rng.next() % ops.len() as u64) as usize];
    let counts = [0u64, 1, 2, 7, 13, 97, 1000, 4099, 65_537];
    let count = counts[(rng.next() % counts.len() as u64) as usize];
    // Roots: mostly valid, sometimes just out of range or huge.
    let root = match rng.next() % 10 {
        0 => n,
        1 => usize::MAX,
        r => (r as usize) % n,
    };
    let misalign = if rng.next() % 8 == 0 { 1 } else { 0 };
    // (Not for scatter: its send buffer matters on the root only, so a null
    // one fails the root alone and the others would wait for it.)
    let null_send = rng.next() % 16 == 0 && kind != Kind::Scatter;
    let stray_stream = rng.next() % 32 == 0;
    let in_place = rng.next() % 4 == 0;
    let c = count as usize * esize;
    // Lengths of the send and receive buffers in bytes (correct for this
    // rank; the raw calls take counts, so lengths cannot disagree).
    let (slen, rlen) = match kind {
        Kind::AllReduce | Kind::Broadcast | Kind::Scan | Kind::ExclusiveScan => (c, c),
        Kind::Reduce => (c, c),
        Kind::AllGather | Kind::Gather => (c, c * n),
        Kind::ReduceScatter | Kind::AllToAll => {
            (c * n, if kind == Kind::AllToAll { c * n } else { c })
        }
        Kind::Scatter => (c * n, c),
    };
    let mut send = Guarded::new(slen, misalign, |i| input_byte(rank, i));
    // The broadcast buffer holds the root's data on the root.
    let bcast_root = kind == Kind::Broadcast && rank == root;
    let mut recv = Guarded::new(rlen, misalign, |i| {
        if bcast_root {
            input_byte(rank, i)
        } else {
            POISON
        }
    });
    let sp = if null_send {
        std::ptr::null_mut()
    } else {
        send.ptr(misalign)
    };
    let rp = recv.ptr(misalign);
    let stream = stray_stream.then_some(std::ptr::null_mut::<c_void>());
    let in_place_ok = in_place
        && matches!(
            kind,
            Kind::AllReduce | Kind::AllToAll | Kind::Scan | Kind::ExclusiveScan
        );
    if in_place_ok {
        // The in-place layout: the receive buffer holds this rank's input.
        for i in 0..rlen {
            recv.bytes[GUARD + misalign + i] = input_byte(rank, i);
        }
    }
    let (s, r) = if in_place_ok {
        (rp as *const c_void, rp)
    } else {
        (sp as *const c_void, rp)
    };
    // SAFETY: every non-null pointer addresses a buffer of the stated
    // length (count or count × size elements), held until the call returns.
    let res = unsafe {
        match kind {
            Kind::AllReduce => world.all_reduce_raw(s, r, count, dtype, op, stream),
            Kind::Reduce => world.reduce_raw(s, r, count, dtype, op, root, stream),
            Kind::Broadcast => world.broadcast_raw(r, count, dtype, root, stream),
            Kind::AllGather => world.all_gather_raw(s, r, count, dtype, stream),
            Kind::ReduceScatter => world.reduce_scatter_block_raw(s, r, count, dtype, op, stream),
            Kind::AllToAll => world.all_to_all_raw(s, r, count, dtype, stream),
            Kind::Gather => world.gather_raw(s, r, count, dtype, root, stream),
            Kind::Scatter => world.scatter_raw(s, r, count, dtype, root, stream),
            Kind::Scan => world.scan_raw(s, r, count, dtype, op, stream),
            Kind::ExclusiveScan => world.exclusive_scan_raw(s, r, count, dtype, op, stream),
        }
    };
    let what = format!(
        "case {k}: {kind:?} {dtype:?} {op:?} count {count} root {root} misalign {misalign} \
         null_send {null_send} stream {stray_stream} in_place {in_place_ok}"
    );
    if !recv.guards_intact(misalign) || !send.guards_intact(misalign) {
        return Err(format!("{what}: a guard byte was overwritten ({res:?})"));
    }
    match res {
        Err(e) => {
            // Every error is an Error value; a fatal one would fail the
            // communicator for the next cases, which the test then reports.
            if matches!(e, Error::CommunicatorFailed(_) | Error::Timeout { .. }) {
                return Err(format!("{what}: fatal error {e}"));
            }
            Ok(false)
        }
        Ok(()) => {
            check_result(
                kind,
                dtype,
                op,
                count as usize,
                root,
                rank,
                n,
                in_place_ok,
                recv.payload(misalign),
            )
            .map_err(|m| format!("{what}: {m}"))?;
            Ok(true)
        }
    }
}

/// The expected receive bytes for the data-movement collectives, for
/// sums of unsigned integers (wrapping, the same bits as the signed ones),
/// and for rank 0 of exclusive_scan (never written); other results are
/// only guard-checked.
#[allow(clippy::too_many_arguments)]
fn check_result(
    kind: Kind,
    dtype: Datatype,
    op: ReduceOp,
    count: usize,
    root: usize,
    rank: usize,
    n: usize,
    in_place: bool,
    got: &[u8],
) -> std::result::Result<(), String> {
    let es = dtype.size();
    let c = count * es;
    let want: Option<Vec<u8>> = match kind {
        Kind::Broadcast => Some((0..c).map(|i| input_byte(root, i)).collect()),
        Kind::AllGather => Some(
            (0..c * n)
                .map(|i| input_byte(i / c.max(1), i % c.max(1)))
                .collect(),
        ),
        Kind::Gather if rank == root => Some(
            (0..c * n)
                .map(|i| input_byte(i / c.max(1), i % c.max(1)))
                .collect(),
        ),
        Kind::AllToAll => Some(
            (0..c * n)
                .map(|i| {
                    let (from, j) = (i / c.max(1), i % c.max(1));
                    input_byte(from, rank * c + j)
                })
                .collect(),
        ),
        Kind::Scatter => Some((0..c).map(|i| input_byte(root, rank * c + i)).collect()),
        Kind::ExclusiveScan if rank == 0 => Some(if in_place {
            (0..c).map(|i| input_byte(rank, i)).collect()
        } else {
            vec![POISON; c]
        }),
        Kind::Scan | Kind::ExclusiveScan
            if op == ReduceOp::Sum && !dtype.is_float() && !dtype.is_signed_int() =>
        {
            let upto = if kind == Kind::Scan { rank + 1 } else { rank };
            Some(sum_bytes(es, c, input_byte, upto))
        }
        Kind::AllReduce | Kind::ReduceScatter
            if op == ReduceOp::Sum && !dtype.is_float() && !dtype.is_signed_int() =>
        {
            let base = if kind == Kind::ReduceScatter {
                rank * c
            } else {
                0
            };
            Some(sum_bytes(es, c, |r, i| input_byte(r, base + i), n))
        }
        _ => None,
    };
    match want {
        Some(w) if w.as_slice() != got => {
            let at = w.iter().zip(got).position(|(a, b)| a != b).unwrap_or(0);
            Err(format!("wrong result at byte {at}"))
        }
        _ => Ok(()),
    }
}

/// Little-endian element-wise wrapping sum over ranks of `c` bytes of
/// elements of `es` bytes.
fn sum_bytes(es: usize, c: usize, byte: impl Fn(usize, usize) -> u8, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; c];
    for e in 0..c / es {
        let mut acc: u64 = 0;
        for r in 0..n {
            let mut v: u64 = 0;
            for b in 0..es {
                v |= (byte(r, e * es + b) as u64) << (8 * b);
            }
            acc = acc.wrapping_add(v);
        }
        for b in 0..es {
            out[e * es + b] = (acc >> (8 * b)) as u8;
        }
    }
    out
}
