use super::*;
use crate::backend::shared::process::pid_alive;
use std::path::Path;

fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn exists(name: &str) -> bool {
    Path::new(&format!("{SHM_DIR}{name}")).exists()
}

/// Create `name` and forget it as a crashed process would: the name stays
/// in /dev/shm, the mapping is released.
fn leave_behind(name: &str) {
    let mut m = Mapping::create(name, CONTROL_BYTES).unwrap();
    m.linked = false;
}

#[test]
fn names_round_trip() {
    let n = segment_name(SegOwner::Host, 4242, 0xdead_beef_0000_0001, 3);
    assert_eq!(n, "/gpucoll.host.4242.0000000000000000deadbeef00000001.3");
    assert_eq!(
        parse_segment_name(&n[1..]),
        Some((4242, 0xdead_beef_0000_0001, 3))
    );
    let c = segment_name(SegOwner::Cuda, 7, 0xabc, 0);
    assert_eq!(c, "/gpucoll.cuda.7.00000000000000000000000000000abc.0");
    assert_eq!(parse_segment_name(&c[1..]), Some((7, 0xabc, 0)));
    // Names of earlier builds of both backends.
    assert_eq!(
        parse_segment_name("gpucoll.12.deadbeef00000001.3"),
        Some((12, 0xdead_beef_0000_0001, 3))
    );
    assert_eq!(
        parse_segment_name("gpucoll-cuda-12-deadbeef00000001-3"),
        Some((12, 0xdead_beef_0000_0001, 3))
    );
}

#[test]
fn foreign_names_are_ignored() {
    for bad in [
        "gpucoll.0.deadbeef00000001.3",
        "gpucoll.-1.deadbeef00000001.3",
        "gpucoll.4294967295.deadbeef00000001.3",
        "gpucoll.12.deadbeef.3",
        "gpucoll.12.deadbeef00000001",
        "gpucoll.12.deadbeef00000001.3.4",
        "gpucoll.12.zzzzzzzzzzzzzzzz.3",
        "gpucoll.+12.deadbeef00000001.3",
        "gpucoll.gpu.12.deadbeef00000001.3",
        "gpucoll.cuda.12.deadbeef00000001",
        "gpucoll-cuda-12-deadbeef00000001",
        "gpucoll-cuda-12.deadbeef00000001.3",
        "gpucoll-host-12-deadbeef00000001-3",
        "nccl.12.deadbeef00000001.3",
        "sem.gpucoll.12.deadbeef00000001.3",
    ] {
        assert_eq!(parse_segment_name(bad), None, "{bad}");
    }
}

#[test]
fn liveness() {
    assert!(pid_alive(std::process::id()));
    assert!(pid_alive(1), "init exists (possibly owned by root: EPERM)");
    assert!(!pid_alive(dead_pid()));
    assert!(pid_alive(0), "invalid pids are never 'dead'");
}

/// Create `name` as process `creator` would have, and forget it as a
/// crashed process would: the name stays in /dev/shm, the mapping goes.
fn leave_behind_as(name: &str, creator: Creator) {
    let mut m = Mapping::create(name, CONTROL_BYTES).unwrap();
    for (i, w) in creator.words().iter().enumerate() {
        m.word(creator::CREATOR_OFF + 8 * i)
            .store(*w, Ordering::Relaxed);
    }
    m.linked = false;
}

/// A job that died during setup left its segments; the start-up cleanup
/// every backend runs removes them, and keeps a live process's, a segment
/// whose pid was reused (start time differs is stale, same is alive), one
/// of another PID namespace and one without a header.
#[test]
fn stale_segments_are_removed_live_ones_kept() {
    let nonce = 0xc0da_0000_0000_0000_0000_0000_0000_0000u128 | u128::from(std::process::id());
    let me = Creator::current();
    let dead = Creator {
        pid: dead_pid(),
        ..me
    };
    let stale = segment_name(SegOwner::Cuda, dead.pid, nonce, 1);
    leave_behind_as(&stale, dead);
    // Our pid, but a start time that is not ours: the pid was reused.
    let reused = segment_name(SegOwner::Host, me.pid, nonce, 2);
    leave_behind_as(
        &reused,
        Creator {
            start: me.start + 1,
            ..me
        },
    );
    let other_ns = segment_name(SegOwner::Host, dead.pid, nonce, 3);
    leave_behind_as(
        &other_ns,
        Creator {
            pidns: me.pidns ^ 1,
            ..dead
        },
    );
    let headerless = segment_name(SegOwner::Host, dead.pid, nonce, 4);
    leave_behind(&headerless);
    let live = segment_name(SegOwner::Cuda, me.pid, nonce, 5);
    let mut live_seg = Mapping::create(&live, CONTROL_BYTES).unwrap();
    for n in [&stale, &reused, &other_ns, &headerless, &live] {
        assert!(exists(n), "{n}");
    }
    assert!(cleanup_stale() >= 2);
    assert!(!exists(&stale), "stale segment of a dead pid removed");
    assert!(!exists(&reused), "segment of a reused pid removed");
    assert!(exists(&other_ns), "another PID namespace's segment is kept");
    assert!(exists(&headerless), "a segment without a header is kept");
    assert!(exists(&live), "a live process's segment is kept");
    unlink(&other_ns).unwrap();
    unlink(&headerless).unwrap();
    live_seg.unlink().unwrap();
    assert!(!exists(&live));
}

#[test]
fn created_with_mode_0600_and_checked_on_open() {
    use std::os::unix::fs::PermissionsExt;
    let me = std::process::id();
    let name = segment_name(SegOwner::Host, me, 0x0600, 9);
    let mut own = Mapping::create(&name, 4 * CONTROL_BYTES).unwrap();
    let mode = std::fs::metadata(format!("{SHM_DIR}{name}"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        Mapping::open(&name, CONTROL_BYTES, me).is_err(),
        "size checked"
    );
    assert!(
        Mapping::open(&name, 4 * CONTROL_BYTES, me + 1).is_err(),
        "creator pid checked"
    );
    let peer = Mapping::open(&name, 4 * CONTROL_BYTES, me).unwrap();
    own.unlink().unwrap();
    assert!(Mapping::open(&name, 4 * CONTROL_BYTES, me).is_err());
    assert!(!exists(&name));

    assert_eq!(peer.abort_raiser(), None);
    assert_eq!(peer.failed_at(), None);
    assert!(own.write_reason("rank 5: boom", Some(41)));
    assert!(!own.write_reason("second", None));
    assert_eq!(peer.failed_at(), Some(41));
    // A device-side failure in the high half does not hide the host half.
    own.word(ABORT_OFF).fetch_or(7 << 32, Ordering::AcqRel);
    assert_eq!(peer.abort_raiser(), None);
    own.raise_abort(2);
    own.raise_abort(1);
    assert_eq!(peer.abort_raiser(), Some(2));
    assert_eq!(peer.abort_word() >> 32, 7);
    assert_eq!(peer.reason().as_deref(), Some("rank 5: boom"));
}

/// A name made by someone else (a co-tenant guessing it, or planting a
/// file for a peer to map) is refused on both sides: creating over it
/// fails cleanly, and opening a file of another uid, of another mode or
/// of another creator is an error before anything is mapped.
#[test]
fn planted_and_squatted_segments_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let me = std::process::id();
    let path = |n: &str| format!("{SHM_DIR}{n}");

    // A squatter took the name first: create fails, the file is untouched.
    let squatted = segment_name(SegOwner::Cuda, me, 0x5a7, 1);
    std::fs::write(path(&squatted), b"squatter").unwrap();
    let Err(e) = Mapping::create(&squatted, CONTROL_BYTES) else {
        panic!("not refused")
    };
    assert!(e.to_string().contains(&squatted), "{e}");
    assert_eq!(std::fs::read(path(&squatted)).unwrap(), b"squatter");
    unlink(&squatted).unwrap();

    // Our uid, but readable by others: refused on open.
    let loose = segment_name(SegOwner::Host, me, 0x5a7, 2);
    let mut own = Mapping::create(&loose, CONTROL_BYTES).unwrap();
    std::fs::set_permissions(path(&loose), std::fs::Permissions::from_mode(0o644)).unwrap();
    let Err(e) = Mapping::open(&loose, CONTROL_BYTES, me) else {
        panic!("not refused")
    };
    assert!(e.to_string().contains("mode 644"), "{e}");
    own.unlink().unwrap();

    // Another uid's file (root can make one; as another user the kernel
    // already keeps us from owning a file for someone else).
    if process::euid() != 0 {
        println!("planted_and_squatted_segments_are_refused: not root, another uid's file skipped");
        return;
    }
    let planted = segment_name(SegOwner::Cuda, me, 0x5a7, 3);
    let mut own = Mapping::create(&planted, CONTROL_BYTES).unwrap();
    let c = std::ffi::CString::new(path(&planted)).unwrap();
    // SAFETY: a valid C string; nobody (65534) is not us.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    let Err(e) = Mapping::open(&planted, CONTROL_BYTES, me) else {
        panic!("not refused")
    };
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    own.unlink().unwrap();
    assert!(!exists(&planted));
}

/// The creator of a segment in another PID namespace (the parent test
/// starts this under `unshare -p -f`, where it is pid 1): make a segment,
/// print its name, keep it until stdin closes.
#[test]
#[ignore = "the creator process of pidns_stale_cleanup_keeps_a_live_job, started by it"]
fn pidns_creator_process() {
    if std::env::var_os("GPUCOLL_TEST_PIDNS_CREATOR").is_none() {
        return;
    }
    let nonce = process::random_nonce().unwrap();
    let name = segment_name(SegOwner::Host, std::process::id(), nonce, 0);
    let mut m = Mapping::create(&name, CONTROL_BYTES).unwrap();
    println!("SEGMENT {name}");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    m.unlink().unwrap();
}

/// Stale cleanup run beside a live job in another PID namespace (a
/// container sharing /dev/shm): the job's segment names a pid that means
/// another process here (pid 1, alive, started at another time), which a
/// pid-and-start-time check alone would take for a reused pid. The
/// namespace in its header keeps it.
#[test]
fn pidns_stale_cleanup_keeps_a_live_job() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let probe = Command::new("unshare")
        .args(["-p", "-f", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|st| st.success()) {
        println!(
            "pidns_stale_cleanup_keeps_a_live_job: no new PID namespace here (unshare -p): skipped"
        );
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("unshare")
        .args(["-p", "-f", "--kill-child"])
        .arg(&exe)
        .args([
            "--exact",
            "backend::shared::shm::tests::pidns_creator_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GPUCOLL_TEST_PIDNS_CREATOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the creator under unshare");
    // Read to the end (the creator still prints after its name), and
    // hand the name over.
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in out.lines().map_while(|l| l.ok()) {
            // The harness's "test ... " may precede it on the line.
            if let Some((_, n)) = line.split_once("SEGMENT ") {
                let _ = tx.send(n.trim().to_string());
            }
        }
    });
    let name = rx.recv_timeout(std::time::Duration::from_secs(60)).ok();
    let name = name.expect("the creator printed its segment's name");
    let (pid, _, _) = parse_segment_name(&name[1..]).unwrap();
    assert_eq!(pid, 1, "the creator is its namespace's first process");
    assert!(exists(&name));
    cleanup_stale();
    assert!(
        exists(&name),
        "a live job of another PID namespace keeps its segment"
    );
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert!(child.wait().unwrap().success());
    reader.join().unwrap();
    assert!(!exists(&name), "its creator unlinked it");
}
