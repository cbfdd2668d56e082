//! The socket calls within one process: what arrives, what is refused,
//! and that no descriptor is left behind (a pipe whose every write end is
//! closed reads EOF: a leaked duplicate anywhere in the process, or queued
//! in a socket, would keep it open).

use super::*;
use crate::backend::shared::process;
use crate::testutil::XorShift;

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut p = [0 as libc::c_int; 2];
    // SAFETY: `p` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are new descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

/// Whether every write end of the pipe whose read end is `r` is closed.
fn write_ends_closed(r: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a valid descriptor and a one-byte buffer. Blocks only while a
    // write end is open, which a poll below avoids.
    let mut pfd = libc::pollfd {
        fd: r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 200) };
    // SAFETY: as above.
    ready == 1 && unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 1) } == 0
}

fn fd_flags(fd: &OwnedFd) -> libc::c_int {
    // SAFETY: F_GETFD on a valid descriptor.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) }
}

fn ino(f: &OwnedFd) -> u64 {
    // SAFETY: a plain C struct; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a struct to fill.
    assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), &mut st) }, 0);
    st.st_ino
}

/// Whether `b` reports its peer gone within 5 s, reading nothing else.
fn closed_soon(b: &Conn) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match b.try_recv().unwrap() {
            Recv::Closed => return true,
            Recv::Empty if std::time::Instant::now() < end => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            _ => return false,
        }
    }
}

fn pair() -> (Listener, u128, Conn, Conn) {
    let name = process::random_nonce().unwrap();
    let l = Listener::bind(name).unwrap().expect("a fresh name is free");
    let a = connect(name).unwrap().expect("queued");
    let b = l.accept().unwrap().expect("accepted");
    (l, name, a, b)
}

#[test]
fn a_descriptor_and_its_words_arrive_with_credentials() {
    let (_l, name, a, b) = pair();
    let me = std::process::id();
    assert_eq!(a.peer().pid, me, "the listener's credentials");
    assert_eq!(b.peer().pid, me, "the connecting process's credentials");
    assert_eq!(b.peer().uid, process::euid());
    assert!(matches!(b.try_recv().unwrap(), Recv::Empty));
    let (r, w) = pipe();
    assert!(a.send(&[7, 1, 99], &w).unwrap());
    match b.try_recv().unwrap() {
        Recv::Message(Ok(words), Some(got)) => {
            assert_eq!(words, [7, 1, 99]);
            assert_ne!(got.as_raw_fd(), w.as_raw_fd());
            assert_eq!(ino(&got), ino(&w));
            assert!(
                fd_flags(&got) & libc::FD_CLOEXEC != 0,
                "received close-on-exec"
            );
        }
        other => panic!("expected a message, got {other:?}"),
    }
    assert!(matches!(b.try_recv().unwrap(), Recv::Empty));
    drop(w);
    assert!(write_ends_closed(&r));
    // The name is taken while the listener lives.
    assert!(Listener::bind(name).unwrap().is_none());
    drop(a);
    // Closed once no process holds `a`: a child that another test's thread
    // is starting holds a copy of our descriptors until its exec.
    assert!(closed_soon(&b), "the peer's end was closed");
    // Nobody listening: an error, not a hang.
    assert!(connect(process::random_nonce().unwrap()).is_err());
}

/// A sender that attaches many descriptors, none, or sends the wrong
/// payload: the message is refused and every descriptor it carried is
/// closed (the pipe reads EOF once our own write end is gone).
#[test]
fn malformed_messages_leave_no_descriptor() {
    let (_l, _, a, b) = pair();
    let (r, w) = pipe();
    let raw = w.as_raw_fd();
    let good = encode_message(&[1, 2, 3]);
    // 12 copies in one message: room for one only; the kernel closes the
    // rest and flags the message, which is refused as a whole.
    assert!(a.send_raw(&good, &[raw; 12]).unwrap());
    // The right payload without a descriptor, a short one, a long one.
    assert!(a.send_raw(&good, &[]).unwrap());
    assert!(a.send_raw(&good[..16], &[raw]).unwrap());
    let mut long = good.to_vec();
    long.extend([0u8; 9]);
    assert!(a.send_raw(&long, &[raw]).unwrap());
    assert!(a.send_raw(&[], &[raw, raw]).unwrap());
    let mut refused = 0;
    loop {
        match b.try_recv().unwrap() {
            Recv::Message(Err(_), None) => refused += 1,
            Recv::Empty => break,
            other => panic!("a malformed message was taken: {other:?}"),
        }
    }
    assert_eq!(refused, 5);
    drop(w);
    assert!(
        write_ends_closed(&r),
        "no copy of the descriptor is left open"
    );
}

#[test]
fn message_parser_checks_everything() {
    let m = encode_message(&[u64::MAX, 0, 42]);
    assert_eq!(parse_message(&m, 1, false).unwrap(), [u64::MAX, 0, 42]);
    assert!(parse_message(&m, 0, false).is_err());
    assert!(parse_message(&m, 2, false).is_err());
    assert!(parse_message(&m, 1, true).is_err());
    assert!(parse_message(&m[..23], 1, false).is_err());
    let mut rng = XorShift::new(0xfd_9a55);
    for _ in 0..20_000 {
        let b = rng.mutate(&m);
        let fds = rng.below(3) as usize;
        let truncated = rng.below(4) == 0;
        match parse_message(&b, fds, truncated) {
            Ok(w) => {
                assert!(fds == 1 && !truncated && b.len() == MESSAGE_BYTES);
                assert_eq!(encode_message(&w)[..], b[..]);
            }
            Err(_) => assert!(fds != 1 || truncated || b.len() != MESSAGE_BYTES),
        }
    }
}
