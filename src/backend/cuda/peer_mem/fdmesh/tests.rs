//! The descriptor links against attackers, with real processes: the ranks
//! are this test binary run again (`rank_process`, one process each, each
//! counting its own descriptors), and this process stands in for MPI,
//! relaying each exchange round, and sees every name the ranks exchange (as
//! an attacker who could read MPI would). Attackers are forked children
//! that make raw system calls only; as root they first drop to uid 65534
//! (`setresuid`), and others are of our uid but no rank of the job.
//!
//! Every scenario ends with the job's links up (or setup refused on every
//! rank), no descriptor in an attacker's hands, every descriptor an
//! attacker planted closed (a pipe whose write ends it planted reads EOF
//! once the ranks are done), and each rank's descriptor count back to its
//! start.

use super::*;
use crate::testutil::XorShift;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;

const NOBODY: u32 = 65534;
const ROLE: &str = "GPUCOLL_TEST_MESH_SCENARIO";

// ---- the rank side (runs in the child processes) -------------------------

fn count_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}

/// One round through the parent: our bytes out, everyone's back.
fn relay(mine: &[u8]) -> Result<Vec<u8>> {
    {
        let mut out = std::io::stdout().lock();
        // A line of its own: libtest's "test NAME ... " has no newline.
        writeln!(out, "\nX {}", hex(mine)).ok();
        out.flush().ok();
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Error::Backend(format!("relay: {e}")))?;
    let body = line.trim().strip_prefix("Y ").unwrap_or("");
    Ok(unhex(body))
}

fn report(what: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nR {what}").ok();
    out.flush().ok();
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut p = [0 as libc::c_int; 2];
    // SAFETY: room for two descriptors.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: new descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

fn ino(f: &OwnedFd) -> u64 {
    // SAFETY: a plain C struct; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a struct to fill.
    unsafe { libc::fstat(f.as_raw_fd(), &mut st) };
    st.st_ino
}

/// Whether every write end of the pipe read at `r` is closed (EOF within
/// `ms`).
fn eof_within(r: &OwnedFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd: r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut b = [0u8; 16];
    loop {
        // SAFETY: one pollfd.
        if unsafe { libc::poll(&mut pfd, 1, ms) } != 1 {
            return false;
        }
        // SAFETY: a valid descriptor and a buffer of 16 bytes.
        match unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 16) } {
            0 => return true,
            n if n > 0 => continue,
            _ => return false,
        }
    }
}

/// A rank of a scenario (see the parent tests); does nothing unless the
/// parent started this process for it.
#[test]
#[ignore = "a rank process of the fdmesh tests, started by them"]
fn rank_process() {
    let Ok(scenario) = std::env::var(ROLE) else {
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let me: usize = env("GPUCOLL_TEST_MESH_RANK").parse().unwrap();
    let start_fds = count_fds();
    let mut forced: Vec<u128> = env("GPUCOLL_TEST_MESH_NONCES")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| u128::from_str_radix(s, 16).unwrap())
        .collect();
    forced.reverse();
    let mut nonce = move || match forced.pop() {
        Some(n) => Ok(n),
        None => process::random_nonce(),
    };
    // The bring-up allgather that gives every rank's pid.
    let all = relay(&std::process::id().to_le_bytes()).unwrap();
    let pids: Vec<u32> = all
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let n = pids.len();
    let mesh = match FdMesh::setup(me, &pids, Duration::from_secs(10), &mut relay, &mut nonce) {
        Ok(Some(m)) => m,
        Ok(None) => {
            report("setup none");
            return;
        }
        Err(e) => {
            report(format!("setup err {e}"));
            report(format!("fds {start_fds} {}", count_fds()));
            return;
        }
    };
    report(format!("setup ok refused={}", mesh.refused()));
    let linked_fds = count_fds();
    // A barrier, during which the parent squats the names set up freed.
    relay(&[1]).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(10);
    let mut check = || Ok(());
    // Rank 0 passes the write end of a pipe to every peer, naming its
    // inode in the words; each peer checks what it got against them.
    let (r, w) = pipe();
    if me == 0 {
        for p in 1..n {
            mesh.send(p, &[1, 0, ino(&w)], &w, deadline()).unwrap();
        }
    } else {
        let got = loop {
            match mesh.links[0].as_ref().unwrap().try_recv().unwrap() {
                Recv::Message(Ok(words), Some(fd)) => break (words, fd),
                Recv::Empty => std::thread::sleep(Duration::from_millis(1)),
                other => panic!("rank {me}: {other:?}"),
            }
        };
        report(format!(
            "got match={}",
            got.0[0] == 1 && got.0[1] == 0 && got.0[2] == ino(&got.1)
        ));
    }
    // A broken peer: rank 1 floods rank 0 with malformed and unexpected
    // messages (12 descriptors each) before the one rank 0 waits for, and
    // one more after it.
    let (fr, fw) = pipe();
    if me == 1 && scenario == "flood" {
        let c = mesh.links[0].as_ref().unwrap();
        let fake = fdpass::encode_message(&[u64::MAX, 1, 42]);
        for i in 0..20 {
            let body: &[u8] = if i % 2 == 0 { &fake } else { &fake[..20] };
            // A full queue (rank 0 busy): wait for it to take some.
            while !c.send_raw(body, &[fw.as_raw_fd(); 12]).unwrap() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        mesh.send(0, &[9, 1, 7], &fw, deadline()).unwrap();
        mesh.send(0, &[10, 1, 7], &fw, deadline()).unwrap();
    }
    drop(fw);
    if me == 0 && scenario == "flood" {
        let fd = mesh.recv(1, &[9, 1, 7], deadline(), &mut check).unwrap();
        drop(fd);
        report(format!("dropped={}", mesh.dropped()));
    }
    relay(&[2]).unwrap();
    // Every message of the exchange reached us: the late one is drained.
    report(format!("drained={}", mesh.drain()));
    report(format!(
        "linked fds {linked_fds} expected {}",
        start_fds + (n - 1)
    ));
    drop(w);
    relay(&[3]).unwrap();
    // Every peer closed what it got: only then do our pipes read EOF.
    if me == 0 {
        report(format!("eof={}", eof_within(&r, 2000)));
    }
    if me == 1 && scenario == "flood" {
        report(format!("flood eof={}", eof_within(&fr, 2000)));
    }
    drop((r, fr, mesh));
    report(format!("fds {start_fds} {}", count_fds()));
}

// ---- the parent side: relaying, attackers, checks ------------------------

struct Rank {
    child: Child,
    stdin: ChildStdin,
}

/// A job of `n` rank processes running `scenario`; `nonces[r]`: the names
/// rank `r` draws first.
struct Job {
    ranks: Vec<Rank>,
    lines: mpsc::Receiver<(usize, String)>,
    reports: Vec<Vec<String>>,
}

impl Job {
    fn start(n: usize, scenario: &str, nonces: &[Vec<u128>]) -> Job {
        let exe = std::env::current_exe().unwrap();
        let (tx, lines) = mpsc::channel();
        let ranks = (0..n)
            .map(|r| {
                let forced: Vec<String> = nonces
                    .get(r)
                    .map(|v| v.iter().map(|x| format!("{x:032x}")).collect())
                    .unwrap_or_default();
                let mut child = Command::new(&exe)
                    .args([
                        "--exact",
                        "backend::cuda::peer_mem::fdmesh::tests::rank_process",
                        "--ignored",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(ROLE, scenario)
                    .env("GPUCOLL_TEST_MESH_RANK", r.to_string())
                    .env("GPUCOLL_TEST_MESH_NONCES", forced.join(","))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("start a rank process");
                let out = child.stdout.take().unwrap();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                        if line.starts_with("X ") || line.starts_with("R ") {
                            let _ = tx.send((r, line));
                        }
                    }
                    let _ = tx.send((r, "EOF".into()));
                });
                let stdin = child.stdin.take().unwrap();
                Rank { child, stdin }
            })
            .collect();
        Job {
            ranks,
            lines,
            reports: vec![Vec::new(); n],
        }
    }

    /// Collect one round's contributions (reports seen meanwhile are kept);
    /// None when a rank ended instead.
    fn gather(&mut self) -> Option<Vec<Vec<u8>>> {
        let n = self.ranks.len();
        let mut got: Vec<Option<Vec<u8>>> = vec![None; n];
        while got.iter().any(Option::is_none) {
            let (r, line) = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .expect("a rank process stalled");
            if let Some(x) = line.strip_prefix("X ") {
                assert!(got[r].is_none(), "rank {r} sent two contributions");
                got[r] = Some(unhex(x));
            } else if let Some(rep) = line.strip_prefix("R ") {
                self.reports[r].push(rep.to_string());
            } else {
                return None;
            }
        }
        Some(got.into_iter().map(Option::unwrap_or_default).collect())
    }

    fn reply(&mut self, parts: &[Vec<u8>]) {
        let all: Vec<u8> = parts.concat();
        for r in &mut self.ranks {
            writeln!(r.stdin, "Y {}", hex(&all)).unwrap();
            r.stdin.flush().unwrap();
        }
    }

    /// One whole round.
    fn round(&mut self) -> Vec<Vec<u8>> {
        let parts = self.gather().expect("a rank ended early");
        self.reply(&parts);
        parts
    }

    /// Wait for every rank to exit successfully, keeping its reports.
    fn finish(mut self) -> Vec<Vec<String>> {
        let n = self.ranks.len();
        let mut ended = 0;
        while ended < n {
            let (r, line) = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .expect("a rank process stalled");
            match line.strip_prefix("R ") {
                Some(rep) => self.reports[r].push(rep.to_string()),
                None if line == "EOF" => ended += 1,
                None => panic!("rank {r} sent {line} after the last round"),
            }
        }
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            let st = rank.child.wait().unwrap();
            assert!(st.success(), "rank {r} failed: {st}");
        }
        self.reports
    }
}

/// Held by each scenario test for its whole run: a forked attacker keeps
/// a copy of every descriptor the test process has, so the pipes of a
/// scenario running beside it would never see their EOF.
static SCENARIO: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_scenario_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    SCENARIO.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_root() -> bool {
    process::euid() == 0
}

/// Forked attackers: raw system calls only (the test process has threads),
/// synchronised through pipes: each writes a byte to `ready` once in
/// place, and ends when `release` reads EOF (the test closes it).
struct Attackers {
    pids: Vec<libc::pid_t>,
    ready: OwnedFd,
    ready_w: OwnedFd,
    release: Option<OwnedFd>,
    release_r: OwnedFd,
}

impl Attackers {
    fn new() -> Attackers {
        let (ready, ready_w) = pipe();
        let (release_r, release) = pipe();
        Attackers {
            pids: Vec::new(),
            ready,
            ready_w,
            release: Some(release),
            release_r,
        }
    }

    /// Fork an attacker running `f` (as `uid` when given and we are root);
    /// returns once it is in place. The attacker keeps only the pipes it
    /// talks to us through and `uses` (descriptors `f` works with): every
    /// other one it inherited, sockets and pipes of the tests running
    /// beside this one in other threads among them, is closed at once, or
    /// those tests would see their peers' ends stay open while it lives.
    fn spawn(
        &mut self,
        uid: Option<u32>,
        uses: &[libc::c_int],
        f: impl FnOnce(libc::c_int, libc::c_int) -> i32,
    ) {
        let release = self.release_r.as_raw_fd();
        let ready = self.ready_w.as_raw_fd();
        // The descriptors to keep, sorted, on the stack (the child must not
        // allocate).
        let mut keep = [libc::c_int::MAX; 8];
        assert!(uses.len() + 2 <= keep.len(), "too many descriptors to keep");
        keep[0] = ready;
        keep[1] = release;
        keep[2..2 + uses.len()].copy_from_slice(uses);
        keep.sort_unstable();
        // SAFETY: the child makes raw system calls only until `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY (the whole child): system calls on descriptors and
            // stack memory; no allocation, no lock.
            unsafe {
                // Close every inherited descriptor above stderr but those
                // kept: the gaps between them, then all above the last.
                // Our copy of the release pipe's write end goes too (it
                // would keep that pipe open for ever).
                let mut lo: libc::c_uint = 3;
                for &k in keep.iter().filter(|&&k| k != libc::c_int::MAX) {
                    let k = k as libc::c_uint;
                    if k > lo {
                        libc::syscall(libc::SYS_close_range, lo, k - 1, 0);
                    }
                    lo = lo.max(k + 1);
                }
                libc::syscall(libc::SYS_close_range, lo, libc::c_uint::MAX, 0);
                if let Some(u) = uid {
                    if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                        || libc::syscall(libc::SYS_setresgid, u, u, u) != 0
                        || libc::syscall(libc::SYS_setresuid, u, u, u) != 0
                    {
                        libc::_exit(201);
                    }
                }
                let code = f(ready, release);
                // Stay (holding whatever we got) until released.
                let mut b = [0u8; 1];
                while libc::read(release, b.as_mut_ptr() as *mut libc::c_void, 1) > 0 {}
                libc::_exit(code);
            }
        }
        self.pids.push(pid);
        let mut pfd = libc::pollfd {
            fd: self.ready.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd; one byte read into a local.
        unsafe {
            assert_eq!(libc::poll(&mut pfd, 1, 10_000), 1, "attacker not in place");
            let mut b = [0u8; 1];
            libc::read(
                self.ready.as_raw_fd(),
                b.as_mut_ptr() as *mut libc::c_void,
                1,
            );
            assert_eq!(b[0], b'1', "attacker failed to get in place ({})", b[0]);
        }
    }

    /// Release every attacker; their exit codes.
    fn finish(mut self) -> Vec<i32> {
        self.release = None;
        self.pids
            .iter()
            .map(|&pid| {
                let mut st = 0;
                // SAFETY: our own child; `st` is writable.
                unsafe { libc::waitpid(pid, &mut st, 0) };
                if libc::WIFEXITED(st) {
                    libc::WEXITSTATUS(st)
                } else {
                    -1
                }
            })
            .collect()
    }
}

/// In an attacker: say whether we got in place.
fn say(ready: libc::c_int, ok: bool) {
    let b = [if ok { b'1' } else { b'0' }];
    // SAFETY: one byte from a local.
    unsafe { libc::write(ready, b.as_ptr() as *const libc::c_void, 1) };
}

/// Attacker: listen under `name` and take every connection and descriptor
/// that comes; exit code: how many came (0 expected), 100 if the name
/// could not be bound.
fn squat(name: u128) -> impl FnOnce(libc::c_int, libc::c_int) -> i32 {
    let (a, len) = fdpass::address(name);
    move |ready, release| {
        // SAFETY: raw calls on our own descriptors and stack buffers.
        unsafe {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK, 0);
            let bound = s >= 0
                && libc::bind(
                    s,
                    &a as *const libc::sockaddr_un as *const libc::sockaddr,
                    len,
                ) == 0
                && libc::listen(s, 64) == 0;
            say(ready, bound);
            if !bound {
                return 100;
            }
            let mut got = 0;
            // Until released (at most a minute), then one last look.
            for _ in 0..60_000 {
                let mut pfd = libc::pollfd {
                    fd: release,
                    events: libc::POLLIN,
                    revents: 0,
                };
                let released = libc::poll(&mut pfd, 1, 1) == 1;
                loop {
                    let c = libc::accept4(s, std::ptr::null_mut(), std::ptr::null_mut(), 0);
                    if c < 0 {
                        break;
                    }
                    got += 1;
                    let mut data = [0u8; 64];
                    let mut iov = libc::iovec {
                        iov_base: data.as_mut_ptr() as *mut libc::c_void,
                        iov_len: 64,
                    };
                    let mut control = [0u64; 64];
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = &mut iov;
                    msg.msg_iovlen = 1;
                    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
                    msg.msg_controllen = std::mem::size_of_val(&control) as _;
                    if libc::recvmsg(c, &mut msg, libc::MSG_DONTWAIT) >= 0 && msg.msg_controllen > 0
                    {
                        got += 1;
                    }
                    libc::close(c);
                }
                if released {
                    break;
                }
            }
            got.min(99)
        }
    }
}

/// Attacker: connect `k` times to `name` and send a forged message with 12
/// copies of `planted` on each connection, keeping them open; exit code:
/// how many connections the listener queued.
fn flood(
    name: u128,
    k: usize,
    planted: libc::c_int,
) -> impl FnOnce(libc::c_int, libc::c_int) -> i32 {
    let (a, len) = fdpass::address(name);
    move |ready, _| {
        let mut queued = 0;
        // SAFETY: raw calls on our own descriptors and stack buffers.
        unsafe {
            for i in 0..k {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK, 0);
                if s < 0 {
                    break;
                }
                if libc::connect(
                    s,
                    &a as *const libc::sockaddr_un as *const libc::sockaddr,
                    len,
                ) != 0
                {
                    libc::close(s);
                    continue;
                }
                queued += 1;
                let mut words = [0u64, 1, i as u64];
                let mut iov = libc::iovec {
                    iov_base: words.as_mut_ptr() as *mut libc::c_void,
                    iov_len: 24,
                };
                let mut control = [0u64; 16];
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
                msg.msg_controllen = libc::CMSG_SPACE(48) as _;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(48) as _;
                let data = libc::CMSG_DATA(c) as *mut libc::c_int;
                for j in 0..12 {
                    std::ptr::write_unaligned(data.add(j), planted);
                }
                libc::sendmsg(s, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
            }
            say(ready, true);
        }
        queued.min(200)
    }
}

fn nonce() -> u128 {
    process::random_nonce().unwrap()
}

fn reported<'a>(reports: &'a [Vec<String>], r: usize, prefix: &str) -> &'a str {
    reports[r]
        .iter()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("rank {r} did not report {prefix:?}: {:?}", reports[r]))
}

fn fds_back(reports: &[Vec<String>]) {
    for r in 0..reports.len() {
        let v: Vec<usize> = reported(reports, r, "fds ")
            .split(' ')
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(v[0], v[1], "rank {r}: descriptors at start and end");
    }
}

/// Names squatted before setup (by another user and by a same-uid process
/// outside the job), a connection flood during setup from both, names
/// squatted after setup, and a broken peer flooding its link: the links
/// come up, descriptors reach exactly the ranks meant, the intruders get
/// nothing and everything they planted is closed.
#[test]
fn links_survive_squatters_floods_and_a_broken_peer() {
    let _one = one_scenario_at_a_time();
    let other = is_root().then_some(NOBODY);
    if other.is_none() {
        eprintln!("not root: the other-uid attackers run as our uid");
    }
    let (first1, first2) = (nonce(), nonce());
    let mut attackers = Attackers::new();
    attackers.spawn(other, &[], squat(first1));
    attackers.spawn(None, &[], squat(first2));
    let mut job = Job::start(3, "flood", &[vec![], vec![first1], vec![first2]]);
    job.round(); // pids
                 // The names: the squatted ones were given up for fresh ones.
    let names_raw = job.gather().unwrap();
    let names = parse_names(&names_raw.concat(), 3).unwrap().unwrap();
    assert!(!names.contains(&first1) && !names.contains(&first2));
    // Before anyone connects: flood rank 0's listener from both kinds of
    // intruder, with descriptors of a pipe we watch.
    let (planted_r, planted_w) = pipe();
    attackers.spawn(
        None,
        &[planted_w.as_raw_fd()],
        flood(names[0], 5, planted_w.as_raw_fd()),
    );
    // More than the listener queues: the ranks' own connections then wait
    // for rank 0 to clear the queue.
    attackers.spawn(
        other,
        &[planted_w.as_raw_fd()],
        flood(names[0], 80, planted_w.as_raw_fd()),
    );
    drop(planted_w);
    job.reply(&names_raw);
    job.round(); // link agreement
                 // Setup is over: its listeners are gone, anyone may bind the names.
    let barrier = job.gather().unwrap();
    for &name in &names {
        attackers.spawn(other, &[], squat(name));
    }
    job.reply(&barrier);
    job.round(); // after the exchange
    job.round(); // after the drain
    let reports = job.finish();
    let codes = attackers.finish();
    for r in 0..3 {
        assert!(
            reported(&reports, r, "setup ").starts_with("ok"),
            "{:?}",
            reports[r]
        );
    }
    let refused: u64 = reported(&reports, 0, "setup ok refused=").parse().unwrap();
    // codes: squat, squat, flood (our uid), flood (other uid), squat x3.
    assert_eq!(codes.len(), 7, "{codes:?}");
    assert_eq!(&codes[..2], &[0, 0], "squatters before setup got nothing");
    assert_eq!(&codes[4..], &[0, 0, 0], "squatters after setup got nothing");
    let flooded = (codes[2] + codes[3]) as u64;
    assert!(codes[2] == 5 && (1..=80).contains(&codes[3]), "{codes:?}");
    assert_eq!(refused, flooded, "every intruding connection refused");
    for r in 1..3 {
        assert_eq!(reported(&reports, r, "got match="), "true");
    }
    assert_eq!(
        reported(&reports, 0, "dropped="),
        "20",
        "the broken peer's flood"
    );
    assert_eq!(reported(&reports, 0, "drained="), "1", "the late message");
    assert_eq!(reported(&reports, 1, "drained="), "0");
    assert_eq!(reported(&reports, 1, "flood eof="), "true");
    assert_eq!(
        reported(&reports, 0, "eof="),
        "true",
        "peers closed what they got"
    );
    for r in 0..3 {
        let v: Vec<&str> = reported(&reports, r, "linked fds ").split(' ').collect();
        assert_eq!(v[0], v[2], "rank {r}: one descriptor per link");
    }
    fds_back(&reports);
    assert!(
        eof_within(&planted_r, 2000),
        "every descriptor the intruders planted was closed"
    );
}

/// Both names a rank draws are taken: setup fails on every rank, with the
/// reason, and nothing is left open.
#[test]
fn setup_fails_everywhere_when_a_rank_cannot_bind() {
    let _one = one_scenario_at_a_time();
    let (a, b) = (nonce(), nonce());
    let mut attackers = Attackers::new();
    let other = is_root().then_some(NOBODY);
    attackers.spawn(other, &[], squat(a));
    attackers.spawn(None, &[], squat(b));
    let mut job = Job::start(2, "basic", &[vec![], vec![a, b]]);
    job.round();
    job.round();
    let reports = job.finish();
    assert_eq!(attackers.finish(), vec![0, 0]);
    let own = reported(&reports, 1, "setup err ");
    assert!(own.contains("both taken"), "{own}");
    let peer = reported(&reports, 0, "setup err ");
    assert!(peer.contains("ranks [1] could not bind"), "{peer}");
    fds_back(&reports);
}

#[test]
fn name_exchanges_are_checked() {
    let all: Vec<u8> = [encode_name(Some(5)), encode_name(Some(u128::MAX))].concat();
    assert_eq!(parse_names(&all, 2).unwrap().unwrap(), vec![5, u128::MAX]);
    let failed: Vec<u8> = [encode_name(None), encode_name(Some(1))].concat();
    assert_eq!(parse_names(&failed, 2).unwrap(), Err(vec![0]));
    assert!(parse_names(&all, 3).is_err());
    assert!(parse_names(&[], 0).is_err());
    let mut rng = XorShift::new(0x5a_3e5);
    for _ in 0..20_000 {
        let b = rng.mutate(&all);
        let n = (b.len() / NAME_BYTES).max(1);
        match parse_names(&b, n) {
            Ok(Ok(names)) => {
                let again: Vec<u8> = names.iter().flat_map(|&x| encode_name(Some(x))).collect();
                assert_eq!(again, b);
            }
            Ok(Err(failed)) => assert!(failed.iter().all(|&r| b[r * NAME_BYTES] == 0)),
            Err(_) => {}
        }
    }
}
