//! Multi-rank tests of point-to-point messages (`gpucoll::p2p`) on the
//! host backend, each checked against the same exchange done with MPI's
//! own point-to-point (`gpucoll::reference::{send, receive,
//! send_receive}`) on host copies: random data, poisoned receive buffers,
//! sizes 0, 1, primes, both sides of the 16 KiB inline limit and several
//! MiB (data messages in chunks).
//!
//! `cargo test --release --test mpi_p2p [FILTER]`; each case is one
//! `mpirun -n N` (tests/common/mod.rs).

mod common;

use common::*;
use gpucoll::prelude::*;
use gpucoll::reference as mpi;
use std::time::{Duration, Instant};

/// Element counts of the exchanges (per dtype): empty, one, primes, the
/// inline limit's neighbourhood in bytes, several data messages.
const SIZES: [usize; 9] = [0, 1, 7, 1031, 4093, 4096, 4099, 100_003, 1_300_021];

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for n in [2usize, 3, 4] {
        for s in [
            "pairs",
            "any_source",
            "order",
            "truncate",
            "probe",
            "ring",
            "random",
            "errors",
            "raw",
            "comms",
        ] {
            v.push(Case::new(format!("{s}::n{n}"), n, s));
        }
    }
    v.push(
        Case::new("pairs::n4_sim2", 4, "pairs")
            .env("GPUCOLL_SIM_NODES", "2")
            .env("GPUCOLL_TEST_PARAMS", "dtypes=u8,f64"),
    );
    let mut trapped =
        Case::new("pmpi::pairs_n2", 2, "pairs").env("GPUCOLL_TEST_PARAMS", "dtypes=i32");
    for (k, val) in pmpi::trap_env() {
        trapped = trapped.env(&k, val);
    }
    v.push(trapped);
    // Rank 2 dies while ranks 0 and 1 wait for its message (one from it,
    // one from any source): both must fail naming it, well within the
    // default GPUCOLL_TIMEOUT.
    v.push(
        Case::new("dead_peer::n3", 3, "dead_peer")
            .env("GPUCOLL_TIMEOUT", "300")
            .survivors("P2PDEAD ok", 2)
            .timeout(90),
    );
    v
}

fn main() {
    main_with(cases(), worker);
}

fn worker(scenario: &str) -> std::result::Result<(), String> {
    pmpi::check_trap()?;
    if scenario == "dead_peer" {
        scenario_dead_peer();
    }
    let universe = gpucoll::initialize().map_err(|e| e.to_string())?;
    let world = universe.world().map_err(|e| e.to_string())?;
    let mut fails = Vec::new();
    match scenario {
        "pairs" => {
            let dtypes = param("dtypes").unwrap_or_else(|| "u8,i32,bf16,f64".into());
            for d in dtypes.split(',') {
                match d {
                    "u8" => pairs::<u8>(&world, &mut fails),
                    "i32" => pairs::<i32>(&world, &mut fails),
                    "bf16" => pairs::<bf16>(&world, &mut fails),
                    "f64" => pairs::<f64>(&world, &mut fails),
                    other => fails.push(format!("unknown dtype {other}")),
                }
            }
        }
        "any_source" => any_source(&world, &mut fails),
        "order" => order(&world, &mut fails),
        "truncate" => truncate(&world, &mut fails),
        "probe" => probe(&world, &mut fails),
        "ring" => {
            ring::<f32>(&world, &mut fails);
            ring::<i64>(&world, &mut fails);
        }
        "random" => random(&world, &mut fails),
        "errors" => errors(&world, &mut fails),
        "raw" => raw(&world, &mut fails),
        "comms" => comms(&world, &mut fails),
        other => return Err(format!("unknown scenario {other}")),
    }
    // Every rank reaches the end before any reports: a failure on one
    // rank must not leave the others waiting for its messages.
    ok(mpi::barrier(&world), "final barrier");
    if fails.is_empty() {
        Ok(())
    } else {
        Err(fails.join("\n"))
    }
}

fn same<T: El>(got: &[T], want: &[T]) -> bool {
    to_bytes(got) == to_bytes(want)
}

/// The message `src` sends `dst` in exchange `round` of case `case`.
fn data<T: El>(case: u64, round: u64, src: usize, dst: usize, len: usize) -> Vec<T> {
    gen_vec(
        seed_of(&[case, round, src as u64, dst as u64, T::SIZE as u64]),
        len,
        Data::Bits,
    )
}

/// Every rank sends every rank (itself too) a message of each size at
/// once (immediate sends and receives, waited for in reverse order),
/// then the same exchange through MPI; results and statuses must agree.
fn pairs<T: El>(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    for (si, &len) in SIZES.iter().enumerate() {
        let tag = 100 + si as i32;
        let sends: Vec<Vec<T>> = (0..n).map(|p| data(1, si as u64, me, p, len)).collect();
        let mut got: Vec<Vec<T>> = (0..n).map(|_| poisoned(len)).collect();
        let statuses = gpucoll::scope(|s| {
            let mut recvs = Vec::new();
            for (p, buf) in got.iter_mut().enumerate() {
                recvs.push(
                    world
                        .process_at_rank(p)
                        .immediate_receive_into_with_tag(s, buf, tag)?,
                );
            }
            let mut sent = Vec::new();
            for (p, buf) in sends.iter().enumerate() {
                sent.push(
                    world
                        .process_at_rank(p)
                        .immediate_send_with_tag(s, buf, tag)?,
                );
            }
            let mut st = Vec::new();
            for r in recvs.into_iter().rev() {
                st.push(r.wait()?);
            }
            gpucoll::wait_all(sent)?;
            st.reverse();
            Ok::<_, Error>(st)
        });
        let statuses = ok(
            statuses,
            &format!("pairs<{}> exchange of {len}", T::DATATYPE),
        );
        let mut want: Vec<Vec<T>> = (0..n).map(|_| poisoned(len)).collect();
        for shift in 0..n {
            let (dst, src) = ((me + shift) % n, (me + n - shift) % n);
            let r = ok(
                mpi::send_receive(
                    world,
                    &sends[dst],
                    dst,
                    tag,
                    &mut want[src],
                    Some(src),
                    Some(tag),
                ),
                "MPI oracle",
            );
            let st = statuses[src];
            if (st.source_rank(), st.tag(), st.bytes() as usize) != (r.source, r.tag, r.bytes) {
                fails.push(format!(
                    "pairs<{}> len {len} from {src}: status {st:?}, MPI says {r:?}",
                    T::DATATYPE
                ));
            }
        }
        for p in 0..n {
            if !same(&got[p], &want[p]) {
                fails.push(format!(
                    "pairs<{}> len {len}: message from {p} differs from MPI's",
                    T::DATATYPE
                ));
            }
        }
    }
}

/// Rank 0 receives everyone's messages with any source and any tag;
/// each source's must come in the order it sent them, and the set must
/// be MPI's.
fn any_source(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let lens = [3usize, 40_000, 0, 9_001, 1];
    let max = *lens.iter().max().unwrap();
    let collect = |use_mpi: bool, fails: &mut Vec<String>| -> Vec<(usize, i32, Vec<u32>)> {
        let mut out = Vec::new();
        if me == 0 {
            for _ in 0..(n - 1) * lens.len() {
                let mut buf = poisoned::<u32>(max);
                let (source, tag, bytes) = if use_mpi {
                    let r = ok(mpi::receive(world, &mut buf, None, None), "MPI receive");
                    (r.source, r.tag, r.bytes)
                } else {
                    let st = ok(
                        world.any_process().receive_into(&mut buf),
                        "any-source receive",
                    );
                    (st.source_rank(), st.tag(), st.bytes() as usize)
                };
                buf.truncate(bytes / 4);
                out.push((source, tag, buf));
            }
            // Per source, tags in the order sent.
            for src in 1..n {
                let tags: Vec<i32> = out.iter().filter(|m| m.0 == src).map(|m| m.1).collect();
                let want: Vec<i32> = (0..lens.len() as i32)
                    .map(|j| src as i32 * 10 + j)
                    .collect();
                if tags != want {
                    fails.push(format!(
                        "any_source ({}): from {src} tags came as {tags:?}, sent {want:?}",
                        if use_mpi { "MPI" } else { "gpucoll" }
                    ));
                }
            }
        } else {
            for (j, &len) in lens.iter().enumerate() {
                let msg = data::<u32>(2, j as u64, me, 0, len);
                let tag = me as i32 * 10 + j as i32;
                if use_mpi {
                    ok(mpi::send(world, &msg, 0, tag), "MPI send");
                } else {
                    ok(world.process_at_rank(0).send_with_tag(&msg, tag), "send");
                }
            }
        }
        out
    };
    let mut got = collect(false, fails);
    let mut want = collect(true, fails);
    got.sort_by_key(|m| (m.0, m.1));
    want.sort_by_key(|m| (m.0, m.1));
    if got != want {
        fails.push("any_source: messages differ from MPI's".into());
    }
}

/// Non-overtaking across the ways a message travels: rank 0 sends rank 1
/// inline and chunked messages on one tag (and one on another tag in
/// between); rank 1 posts its receives ahead, any source, and must get
/// them in order; then blocking receives of a second burst, any tag.
fn order(world: &Communicator, fails: &mut Vec<String>) {
    let me = world.rank();
    let lens = [5usize, 200_000, 3, 786_433, 0, 4_250, 1, 4_096, 4_097];
    let max = *lens.iter().max().unwrap();
    let msgs: Vec<Vec<i32>> = lens
        .iter()
        .enumerate()
        .map(|(j, &l)| data(3, j as u64, 0, 1, l))
        .collect();
    let odd = data::<i32>(3, 99, 0, 1, 50_000);
    if me == 0 {
        let r = gpucoll::scope(|s| {
            let mut reqs = Vec::new();
            for (j, m) in msgs.iter().enumerate() {
                reqs.push(world.process_at_rank(1).immediate_send_with_tag(s, m, 7)?);
                if j == 2 {
                    reqs.push(
                        world
                            .process_at_rank(1)
                            .immediate_send_with_tag(s, &odd, 8)?,
                    );
                }
            }
            gpucoll::wait_all(reqs)
        });
        ok(r, "order: immediate sends");
        for m in &msgs {
            ok(
                world.process_at_rank(1).send_with_tag(m, 9),
                "order: blocking sends",
            );
        }
        for m in &msgs {
            ok(mpi::send(world, m, 1, 7), "order: MPI sends");
        }
    } else if me == 1 {
        let mut bufs: Vec<Vec<i32>> = lens.iter().map(|_| poisoned(max)).collect();
        let mut other = poisoned::<i32>(60_000);
        let r = gpucoll::scope(|s| {
            let mut reqs = Vec::new();
            for b in bufs.iter_mut() {
                reqs.push(
                    world
                        .any_process()
                        .immediate_receive_into_with_tag(s, b, 7)?,
                );
            }
            let o = world
                .process_at_rank(0)
                .immediate_receive_into_with_tag(s, &mut other, 8)?;
            // Completed out of order: the last first.
            let mut st = Vec::new();
            for r in reqs.into_iter().rev() {
                st.push(r.wait()?);
            }
            st.reverse();
            Ok::<_, Error>((st, o.wait()?))
        });
        let (st, ost) = ok(r, "order: immediate receives");
        for (j, s) in st.iter().enumerate() {
            if s.bytes() as usize != lens[j] * 4 || !same(&bufs[j][..lens[j]], &msgs[j]) {
                fails.push(format!("order: receive {j} got {s:?}, not message {j}"));
            }
            if bufs[j][lens[j]..].iter().any(|&x| x != i32::poison()) {
                fails.push(format!("order: receive {j} wrote past its message"));
            }
        }
        if ost.bytes() != 200_000 || !same(&other[..50_000], &odd) {
            fails.push(format!("order: the tag-8 message came as {ost:?}"));
        }
        for (j, m) in msgs.iter().enumerate() {
            let mut b = poisoned::<i32>(max);
            let s = ok(
                world.any_process().receive_into(&mut b),
                "order: blocking any-tag receive",
            );
            if s.tag() != 9 || s.bytes() as usize != lens[j] * 4 || !same(&b[..lens[j]], m) {
                fails.push(format!("order: blocking receive {j} got {s:?}"));
            }
        }
        // The oracle: MPI's own order for the same burst.
        for (j, b) in bufs.iter().enumerate() {
            let mut w = poisoned::<i32>(max);
            let r = ok(
                mpi::receive(world, &mut w, None, Some(7)),
                "order: MPI receive",
            );
            if r.bytes != lens[j] * 4 || !same(&w, b) {
                fails.push(format!("order: MPI's receive {j} differs from gpucoll's"));
            }
        }
    }
}

/// A message longer than the buffer: the first bytes land, the error says
/// how long it was, and the next message is received as usual; inline,
/// chunked and to self.
fn truncate(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    for (k, (len, cap)) in [(100usize, 60usize), (300_000, 200_001), (5, 0)]
        .into_iter()
        .enumerate()
    {
        let out = data::<i32>(4, k as u64, me, to, len);
        let follow = data::<i32>(4, 100 + k as u64, me, to, 33);
        let mut got = poisoned::<i32>(cap);
        let mut next = poisoned::<i32>(33);
        let r = gpucoll::scope(|s| {
            let r1 = world
                .process_at_rank(from)
                .immediate_receive_into_with_tag(s, &mut got, 5)?;
            let r2 = world
                .process_at_rank(from)
                .immediate_receive_into_with_tag(s, &mut next, 5)?;
            let a = world
                .process_at_rank(to)
                .immediate_send_with_tag(s, &out, 5)?;
            let b = world
                .process_at_rank(to)
                .immediate_send_with_tag(s, &follow, 5)?;
            a.wait()?;
            b.wait()?;
            Ok::<_, Error>((r1.wait(), r2.wait()))
        });
        let (first, second) = ok(r, "truncate: sends");
        match first {
            Err(Error::Truncated {
                source_rank,
                tag: 5,
                bytes,
                capacity,
            }) if source_rank == from && bytes == len as u64 * 4 && capacity == cap as u64 * 4 => {}
            other => fails.push(format!("truncate {len}->{cap}: got {other:?}")),
        }
        let want = data::<i32>(4, k as u64, from, me, len);
        if !same(&got, &want[..cap]) {
            fails.push(format!("truncate {len}->{cap}: the first elements differ"));
        }
        let want_next = data::<i32>(4, 100 + k as u64, from, me, 33);
        match second {
            Ok(st) if st.bytes() == 132 && same(&next, &want_next) => {}
            other => fails.push(format!(
                "truncate {len}->{cap}: the next message: {other:?}"
            )),
        }
    }
    // To itself, through the local path.
    let big = data::<u8>(4, 7, me, me, 70_000);
    let mut small = poisoned::<u8>(1000);
    let r = gpucoll::scope(|s| {
        let r = world
            .process_at_rank(me)
            .immediate_receive_into(s, &mut small)?;
        world.process_at_rank(me).immediate_send(s, &big)?.wait()?;
        Ok::<_, Error>(r.wait())
    });
    match ok(r, "truncate: to self") {
        Err(Error::Truncated {
            bytes: 70_000,
            capacity: 1000,
            ..
        }) if small[..] == big[..1000] => {}
        other => fails.push(format!("truncate to self: {other:?}")),
    }
}

/// Probes leave messages in place; matched probes take them; a dropped
/// matched message is consumed and its sender completes.
fn probe(world: &Communicator, fails: &mut Vec<String>) {
    let me = world.rank();
    let a = data::<f32>(5, 0, 0, 1, 1000);
    let b = data::<f32>(5, 1, 0, 1, 100_000);
    let c = data::<u8>(5, 2, 0, 1, 10);
    let d = data::<f32>(5, 3, 0, 1, 17);
    if me == 0 {
        ok(
            world.process_at_rank(1).send_with_tag(&a, 3),
            "probe: send a",
        );
        gpucoll::scope(|s| {
            let rb = ok(
                world.process_at_rank(1).immediate_send_with_tag(s, &b, 4),
                "send b",
            );
            ok(
                world.process_at_rank(1).send_with_tag(&c, 5),
                "probe: send c",
            );
            ok(
                world.process_at_rank(1).send_with_tag(&d, 4),
                "probe: send d",
            );
            ok(rb.wait(), "probe: b completes after being dropped");
        });
    } else if me == 1 {
        match world.process_at_rank(0).immediate_probe_with_tag(9) {
            Ok(None) => {}
            other => fails.push(format!("probe: tag 9 is there: {other:?}")),
        }
        let st = ok(world.process_at_rank(0).probe_with_tag(4), "probe tag 4");
        if st.bytes() != 400_000 || st.tag() != 4 || st.source_rank() != 0 {
            fails.push(format!("probe: tag 4 status {st:?}"));
        }
        // Any tag: the first message sent, though tag 4 was probed.
        let (msg, st) = ok(world.any_process().matched_probe(), "matched probe");
        if st.tag() != 3 || st.bytes() != 4000 {
            fails.push(format!(
                "probe: matched probe took {st:?}, not the first message"
            ));
        }
        let mut buf = poisoned::<f32>(1000);
        let st2 = ok(msg.matched_receive_into(&mut buf), "matched receive");
        if st2 != st || !same(&buf, &a) {
            fails.push("probe: the matched receive got other bytes".into());
        }
        // Take b and drop it: its bytes are consumed.
        let (dropped, st) = ok(
            world.process_at_rank(0).matched_probe_with_tag(4),
            "mprobe 4",
        );
        if st.bytes() != 400_000 {
            fails.push(format!("probe: mprobe tag 4 gave {st:?}"));
        }
        drop(dropped);
        let st = ok(world.any_process().probe(), "probe any");
        if st.tag() != 5 || st.bytes() != 10 {
            fails.push(format!("probe: after the dropped message, {st:?}"));
        }
        let mut cb = poisoned::<u8>(10);
        ok(world.process_at_rank(0).receive_into(&mut cb), "receive c");
        let mut db = poisoned::<f32>(17);
        let st = ok(
            world.process_at_rank(0).receive_into_with_tag(&mut db, 4),
            "receive d",
        );
        if cb != c || !same(&db, &d) || st.bytes() != 68 {
            fails.push(format!("probe: c and d came wrong ({st:?})"));
        }
        // An immediate matched probe finds nothing more.
        match world.any_process().immediate_matched_probe() {
            Ok(None) => {}
            other => fails.push(format!("probe: a message was left: {other:?}")),
        }
    }
}

/// `send_receive_into` as a ring shift, against MPI_Sendrecv.
fn ring<T: El>(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let right = world.process_at_rank((me + 1) % n);
    let left = world.process_at_rank((me + n - 1) % n);
    for (k, &len) in [0usize, 1, 1031, 100_003, 1_048_583].iter().enumerate() {
        let out = data::<T>(6, k as u64, me, right.rank(), len);
        let mut got = poisoned::<T>(len);
        let st = ok(
            world.send_receive_into(&out, &right, &mut got, &left),
            "ring",
        );
        let mut want = poisoned::<T>(len);
        let r = ok(
            mpi::send_receive(
                world,
                &out,
                right.rank(),
                0,
                &mut want,
                Some(left.rank()),
                None,
            ),
            "MPI sendrecv",
        );
        if !same(&got, &want) || st.bytes() as usize != r.bytes || st.source_rank() != r.source {
            fails.push(format!(
                "ring<{}> {len}: differs from MPI_Sendrecv",
                T::DATATYPE
            ));
        }
        // With tags, from any source.
        let mut got2 = poisoned::<T>(len);
        let st = ok(
            world.send_receive_into_with_tags(
                &out,
                &right,
                11,
                &mut got2,
                &world.any_process(),
                11,
            ),
            "ring with tags",
        );
        if !same(&got2, &want) || st.tag() != 11 || st.source_rank() != left.rank() {
            fails.push(format!("ring<{}> {len} with tags: {st:?}", T::DATATYPE));
        }
    }
}

/// One message of a random plan every rank knows.
struct Planned {
    src: usize,
    dst: usize,
    tag: i32,
    len: usize,
}

/// A random plan of messages between random pairs (self included), sent
/// and received all at once, completed in a random order by `test` and
/// `wait`; then each replayed through MPI in the plan's order.
fn random(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let mut rng = Rng::new(seed_of(&[7, n as u64]));
    let plan: Vec<Planned> = (0..60)
        .map(|_| {
            let len = match rng.next() % 4 {
                0 => 0,
                1 => (rng.next() % 64) as usize,
                2 => (rng.next() % 20_000) as usize,
                _ => (rng.next() % 600_000) as usize,
            };
            Planned {
                src: (rng.next() % n as u64) as usize,
                dst: (rng.next() % n as u64) as usize,
                tag: (rng.next() % 3) as i32,
                len,
            }
        })
        .collect();
    let out: Vec<Vec<u64>> = plan
        .iter()
        .enumerate()
        .map(|(i, m)| data(8, i as u64, m.src, m.dst, m.len))
        .collect();
    let mine: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].dst == me).collect();
    let mut got: Vec<Vec<u64>> = mine.iter().map(|&i| poisoned(plan[i].len)).collect();
    let r = gpucoll::scope(|s| {
        // Receives name their source and tag; messages of one (source,
        // tag) match in order, so each receive gets its own message.
        let mut recvs: Vec<Option<gpucoll::ReceiveRequest<'_>>> = Vec::new();
        for (k, buf) in got.iter_mut().enumerate() {
            let m = &plan[mine[k]];
            recvs.push(Some(
                world
                    .process_at_rank(m.src)
                    .immediate_receive_into_with_tag(s, buf, m.tag)?,
            ));
        }
        let mut sends = Vec::new();
        for (i, m) in plan.iter().enumerate().filter(|(_, m)| m.src == me) {
            sends.push(
                world
                    .process_at_rank(m.dst)
                    .immediate_send_with_tag(s, &out[i], m.tag)?,
            );
        }
        let mut order = Rng::new(seed_of(&[9, me as u64]));
        let mut left = recvs.len();
        let t0 = Instant::now();
        while left > 0 {
            let k = (order.next() % recvs.len() as u64) as usize;
            let done = match &recvs[k] {
                Some(r) => r.test()?.is_some(),
                None => false,
            };
            if done {
                recvs[k] = None;
                left -= 1;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                return Err(Error::InvalidUsage(
                    "random: receives never completed".into(),
                ));
            }
        }
        gpucoll::wait_all(sends)
    });
    ok(r, "random exchange");
    for (i, m) in plan.iter().enumerate() {
        let tag = 1000 + i as i32;
        if m.src == me && m.dst == me {
            let mut w = poisoned::<u64>(m.len);
            ok(
                mpi::send_receive(world, &out[i], me, tag, &mut w, Some(me), Some(tag)),
                "MPI self",
            );
            check_random(&mine, &got, i, &w, fails);
        } else if m.src == me {
            ok(mpi::send(world, &out[i], m.dst, tag), "MPI send");
        } else if m.dst == me {
            let mut w = poisoned::<u64>(m.len);
            ok(
                mpi::receive(world, &mut w, Some(m.src), Some(tag)),
                "MPI receive",
            );
            check_random(&mine, &got, i, &w, fails);
        }
    }
}

fn check_random(mine: &[usize], got: &[Vec<u64>], i: usize, want: &[u64], fails: &mut Vec<String>) {
    match mine.iter().position(|&x| x == i) {
        Some(k) if got[k] == want => {}
        _ => fails.push(format!("random: message {i} differs from MPI's")),
    }
}

/// Bad arguments are errors that leave the communicator usable.
fn errors(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let x = [1u32; 4];
    let mut y = [0u32; 4];
    let expect = |what: &str,
                  r: gpucoll::Result<()>,
                  good: fn(&Error) -> bool,
                  fails: &mut Vec<String>| match r {
        Err(e) if good(&e) && !e.is_fatal() => {}
        other => fails.push(format!("errors: {what} gave {other:?}")),
    };
    expect(
        "a send to rank size",
        world.process_at_rank(n).send(&x),
        |e| matches!(e, Error::InvalidRank { .. }),
        fails,
    );
    expect(
        "a receive from rank size",
        world
            .process_at_rank(n + 3)
            .receive_into(&mut y)
            .map(|_| ()),
        |e| matches!(e, Error::InvalidRank { .. }),
        fails,
    );
    expect(
        "tag -1",
        world.process_at_rank(me).send_with_tag(&x, -1),
        |e| matches!(e, Error::InvalidTag { tag: -1, .. }),
        fails,
    );
    expect(
        "a receive of tag -7",
        world
            .any_process()
            .receive_into_with_tag(&mut y, -7)
            .map(|_| ()),
        |e| matches!(e, Error::InvalidTag { tag: -7, .. }),
        fails,
    );
    expect(
        "a probe of tag -2",
        world.any_process().immediate_probe_with_tag(-2).map(|_| ()),
        |e| matches!(e, Error::InvalidTag { .. }),
        fails,
    );
    // SAFETY: a null pointer with a count is refused before it is used.
    let r = unsafe { world.send_raw(std::ptr::null(), 4, Datatype::U32, me, 0) };
    expect(
        "a null raw send",
        r,
        |e| matches!(e, Error::InvalidUsage(_)),
        fails,
    );
    // The communicator still works.
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    let mut got = [0u32; 4];
    let st = ok(
        world.send_receive_into(
            &[me as u32; 4],
            &world.process_at_rank(to),
            &mut got,
            &world.process_at_rank(from),
        ),
        "errors: an exchange after the errors",
    );
    if got != [from as u32; 4] || st.source_rank() != from {
        fails.push(format!("errors: the exchange after the errors got {got:?}"));
    }
    // A freed communicator refuses messages.
    let dup = ok(world.duplicate(), "duplicate");
    ok(dup.free(), "free");
    expect(
        "a send on a freed communicator",
        dup.process_at_rank(me).send(&x),
        |e| matches!(e, Error::CommunicatorFreed),
        fails,
    );
}

/// The raw entry points: mixed with typed calls, requests tested,
/// cancelled and dropped, matched probes.
fn raw(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    // An unmatched receive is cancelled; its buffer is free at once.
    let mut spare = vec![0u8; 64];
    // SAFETY: `spare` outlives the request, which is cancelled before use.
    let mut req = ok(
        unsafe {
            world.immediate_receive_raw(
                spare.as_mut_ptr().cast(),
                64,
                Datatype::U8,
                Some(from),
                Some(77),
            )
        },
        "raw: receive to cancel",
    );
    if !req.cancel() {
        fails.push("raw: an unmatched receive could not be cancelled".into());
    }
    drop(req);
    spare[0] = 1;
    for (k, len) in [0u64, 1, 4097, 250_001].into_iter().enumerate() {
        let out = data::<f64>(10, k as u64, me, to, len as usize);
        let mut got = poisoned::<f64>(len as usize + 3);
        // SAFETY: `got` outlives the request (waited below) and holds
        // `len + 3` elements; `out` outlives the blocking send.
        let mut rr = ok(
            unsafe {
                world.immediate_receive_raw(
                    got.as_mut_ptr().cast(),
                    len + 3,
                    Datatype::F64,
                    None,
                    None,
                )
            },
            "raw receive",
        );
        let sent = if k % 2 == 0 {
            // SAFETY: `out` holds `len` f64 and outlives the blocking call.
            unsafe { world.send_raw(out.as_ptr().cast(), len, Datatype::F64, to, k as i32) }
        } else {
            world.process_at_rank(to).send_with_tag(&out, k as i32)
        };
        ok(sent, "raw send");
        let st = loop {
            if let Some(st) = ok(rr.test(), "raw test") {
                break st;
            }
        };
        let st2 = ok(rr.wait(), "raw wait after test");
        let want = data::<f64>(10, k as u64, from, me, len as usize);
        if st != st2
            || st.source_rank() != from
            || st.tag() != k as i32
            || st.count(Datatype::F64) != Some(len)
            || !same(&got[..len as usize], &want)
            || got[len as usize..]
                .iter()
                .any(|x| x.to_bits() != f64::poison().to_bits())
        {
            fails.push(format!("raw {len}: got {st:?}"));
        }
    }
    // A matched probe through the raw form, received raw.
    let out = data::<i32>(11, 0, me, to, 5000);
    let r = gpucoll::scope(|s| {
        let w = world
            .process_at_rank(to)
            .immediate_send_with_tag(s, &out, 3)?;
        let (msg, st) = loop {
            if let Some(found) = world.matched_probe_raw(Some(from), Some(3), false)? {
                break found;
            }
        };
        let mut buf = poisoned::<i32>(5000);
        // SAFETY: `buf` holds 5000 i32 and outlives the blocking receive.
        let st2 = unsafe { msg.matched_receive_raw(buf.as_mut_ptr().cast(), 5000, Datatype::I32)? };
        w.wait()?;
        Ok::<_, Error>((st, st2, buf))
    });
    let (st, st2, buf) = ok(r, "raw matched probe");
    if st != st2 || st.bytes() != 20_000 || !same(&buf, &data::<i32>(11, 0, from, me, 5000)) {
        fails.push(format!("raw: matched probe {st:?} / {st2:?}"));
    }
    match world.probe_raw(None, None, false) {
        Ok(None) => {}
        other => fails.push(format!("raw: a message was left: {other:?}")),
    }
}

/// Messages of two communicators of the same ranks, same tags, never mix.
fn comms(world: &Communicator, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    let dup = ok(world.duplicate(), "duplicate");
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    let on_dup = data::<u32>(12, 0, me, to, 30_000);
    let on_world = data::<u32>(12, 1, me, to, 10);
    let mut a = poisoned::<u32>(30_000);
    let mut b = poisoned::<u32>(30_000);
    let r = gpucoll::scope(|s| {
        let w1 = dup
            .process_at_rank(to)
            .immediate_send_with_tag(s, &on_dup, 1)?;
        let w2 = world
            .process_at_rank(to)
            .immediate_send_with_tag(s, &on_world, 1)?;
        // World first, though its message was sent second.
        let sw = world.any_process().receive_into(&mut b)?;
        let sd = dup.any_process().receive_into(&mut a)?;
        w1.wait()?;
        w2.wait()?;
        Ok::<_, Error>((sw, sd))
    });
    let (sw, sd) = ok(r, "comms");
    if sw.bytes() != 40
        || sd.bytes() != 120_000
        || !same(&b[..10], &data::<u32>(12, 1, from, me, 10))
        || !same(&a, &data::<u32>(12, 0, from, me, 30_000))
    {
        fails.push(format!("comms: world got {sw:?}, the duplicate {sd:?}"));
    }
}

/// Rank 2 dies after a barrier; ranks 0 and 1 wait for messages it will
/// never send (rank 0 from it, rank 1 from any source) and must fail with
/// an error naming it within 2 s.
fn scenario_dead_peer() -> ! {
    let universe = ok(gpucoll::initialize(), "initialize");
    let world = ok(universe.world(), "universe.world()");
    let rank = world.rank();
    ok(mpi::barrier(&world), "barrier");
    if rank == 2 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on our own pid; the process ends here.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let mut buf = [0u8; 16];
    let t0 = Instant::now();
    let r = if rank == 0 {
        world.process_at_rank(2).receive_into(&mut buf)
    } else {
        world.any_process().receive_into(&mut buf)
    };
    let died = Duration::from_millis(300);
    let after = t0.elapsed().saturating_sub(died);
    let verdict = match &r {
        Err(e)
            if e.to_string().contains("rank 2")
                && e.is_fatal()
                && after < Duration::from_secs(2) =>
        {
            "P2PDEAD ok"
        }
        _ => "P2PDEAD FAIL",
    };
    println!(
        "{verdict} rank {rank}: {r:?} after {:.3} s",
        after.as_secs_f64()
    );
    drop(world);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(0);
}
