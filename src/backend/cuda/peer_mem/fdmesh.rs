//! The authenticated links a communicator's ranks pass VMM descriptors
//! over (`vmm.rs`), set up at bring-up and private afterwards.
//!
//! Setup (collective, every rank of a single-node communicator):
//!
//! 1. Each rank binds a listening socket (`fdpass.rs`) under a name of 128
//!    random bits of its own: nobody outside the job can know it before it
//!    is bound, so nobody can take it first (a name found taken is drawn
//!    again, once). A rank that cannot bind fails the setup, on every rank
//!    alike: the names and the outcome are exchanged over MPI only.
//! 2. Each rank connects to the listeners of the lower ranks and accepts
//!    the higher ranks' connections. Both ends check the kernel's
//!    credentials of the other (`SO_PEERCRED`): our uid, and the pid the
//!    MPI exchange gave for that rank. A connection from anyone else is
//!    closed at once, counted and logged with its credentials.
//! 3. The listeners close: after setup nothing is reachable by name, and a
//!    name bound later by someone else is never connected to.
//! 4. Every rank says whether all its links came up; if any did not (ranks
//!    in different network or PID namespaces), no rank passes descriptors
//!    and VMM memory goes through bounce buffers, as memory that cannot be
//!    exported does.
//!
//! Intake (each exchange of `vmm.rs`): from each peer at most the one
//! message the exchange expects is taken; any other is closed and counted
//! at once, and after the exchange's agreement (every send of it has
//! reached our queues by then) every link is drained and whatever is left
//! is closed, so nothing accumulates and no late descriptor keeps a peer's
//! freed memory alive.

use super::fdpass::{self, Conn, Cred, Listener, Recv, Words};
use crate::backend::shared::process;
use crate::error::{Error, Result};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes each rank contributes to the name exchange: whether it bound,
/// and its name's nonce.
pub(crate) const NAME_BYTES: usize = 17;

/// The names every rank bound, from the allgathered name exchange of
/// `nranks` ranks: `Err` when the exchange is malformed, `Ok(Err(ranks))`
/// naming the ranks that could not bind.
pub(crate) fn parse_names(
    all: &[u8],
    nranks: usize,
) -> Result<std::result::Result<Vec<u128>, Vec<usize>>> {
    if nranks == 0 || all.len() != NAME_BYTES * nranks {
        return Err(Error::Backend(format!(
            "descriptor socket name exchange: {} bytes for {nranks} ranks",
            all.len()
        )));
    }
    let mut names = Vec::with_capacity(nranks);
    let mut failed = Vec::new();
    for (r, b) in all.chunks_exact(NAME_BYTES).enumerate() {
        let mut n = [0u8; 16];
        n.copy_from_slice(&b[1..]);
        match b[0] {
            1 => names.push(u128::from_le_bytes(n)),
            0 => failed.push(r),
            f => {
                return Err(Error::Backend(format!(
                    "descriptor socket name exchange: rank {r} says {f}"
                )))
            }
        }
    }
    Ok(if failed.is_empty() {
        Ok(names)
    } else {
        Err(failed)
    })
}

/// What one rank adds to the name exchange.
pub(crate) fn encode_name(bound: Option<u128>) -> [u8; NAME_BYTES] {
    let mut b = [0u8; NAME_BYTES];
    if let Some(n) = bound {
        b[0] = 1;
        b[1..].copy_from_slice(&n.to_le_bytes());
    }
    b
}

/// The links of one rank to every other rank of its communicator.
#[derive(Debug)]
pub(crate) struct FdMesh {
    me: usize,
    /// By rank; None at our own.
    links: Vec<Option<Conn>>,
    /// Messages closed unread: unexpected, malformed, or left over.
    dropped: AtomicU64,
    /// Connections refused at setup (not a rank of ours).
    refused: u64,
}

/// An allgather over the communicator (MPI's, or a test's stand-in).
pub(crate) type Exchange<'a> = &'a mut dyn FnMut(&[u8]) -> Result<Vec<u8>>;

impl FdMesh {
    /// Set up the links of rank `me` among ranks whose processes are
    /// `pids` (collective over `exchange`; see the module doc). `nonce`
    /// draws names; `wait` bounds the connecting. Ok(None): the links did
    /// not all come up somewhere, and every rank goes without.
    pub(crate) fn setup(
        me: usize,
        pids: &[u32],
        wait: Duration,
        exchange: Exchange<'_>,
        nonce: &mut dyn FnMut() -> Result<u128>,
    ) -> Result<Option<FdMesh>> {
        let n = pids.len();
        let bound = bind_fresh(nonce);
        let mine = encode_name(bound.as_ref().ok().map(|(_, name)| *name));
        let names = parse_names(&exchange(&mine)?, n)?;
        let (listener, _) = bound?;
        let names = names.map_err(|failed| {
            Error::Backend(format!(
                "CUDA backend setup: ranks {failed:?} could not bind their descriptor socket"
            ))
        })?;
        let mut mesh = FdMesh {
            me,
            links: (0..n).map(|_| None).collect(),
            dropped: AtomicU64::new(0),
            refused: 0,
        };
        let linked = mesh.link(&listener, &names, pids, wait);
        drop(listener);
        if let Err(e) = &linked {
            tracing::warn!(rank = me, "descriptor links: {e}");
        }
        let all = exchange(&[linked.is_ok() as u8])?;
        if all.len() != n || all.iter().any(|&b| b > 1) {
            return Err(Error::Backend(format!(
                "descriptor link agreement: {} bytes for {n} ranks",
                all.len()
            )));
        }
        if all.contains(&0) {
            let failed: Vec<usize> = (0..n).filter(|&r| all[r] == 0).collect();
            tracing::warn!(
                rank = me,
                ?failed,
                "descriptor links between the ranks did not all come up: VMM memory \
                 is not shared directly on this communicator"
            );
            return Ok(None);
        }
        Ok(Some(mesh))
    }

    /// Step 2: connect to the lower ranks, accept the higher ones, until
    /// every link is up or `wait` passed.
    fn link(
        &mut self,
        listener: &Listener,
        names: &[u128],
        pids: &[u32],
        wait: Duration,
    ) -> Result<()> {
        let (me, n) = (self.me, pids.len());
        let uid = process::euid();
        let start = Instant::now();
        loop {
            for (j, &name) in names.iter().enumerate().take(me) {
                if self.links[j].is_some() {
                    continue;
                }
                if let Some(c) = fdpass::connect(name)? {
                    let p = c.peer();
                    if p.uid != uid || p.pid != pids[j] {
                        return Err(Error::Backend(format!(
                            "rank {j}'s descriptor socket is held by pid {} uid {}, not by \
                             pid {} uid {uid}",
                            p.pid, p.uid, pids[j]
                        )));
                    }
                    self.links[j] = Some(c);
                }
            }
            while let Some(c) = listener.accept()? {
                let p = c.peer();
                let rank = (me + 1..n).find(|&k| pids[k] == p.pid && self.links[k].is_none());
                match rank {
                    Some(k) if p.uid == uid => self.links[k] = Some(c),
                    _ => {
                        self.refused += 1;
                        tracing::warn!(
                            rank = me,
                            pid = p.pid,
                            uid = p.uid,
                            gid = p.gid,
                            "descriptor socket: refused a connection from a process that \
                             is no rank of this communicator"
                        );
                    }
                }
            }
            let missing: Vec<usize> = (0..n)
                .filter(|&r| r != me && self.links[r].is_none())
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() >= wait {
                return Err(Error::Backend(format!(
                    "no descriptor link with ranks {missing:?} within {wait:?}"
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Connections refused at setup.
    #[cfg(test)]
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }

    /// Messages closed unread so far.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn conn(&self, p: usize) -> Result<&Conn> {
        self.links
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Backend(format!("no descriptor link with rank {p}")))
    }

    /// Send `words` and `fd` to rank `p`, retrying while its queue is
    /// full, until `deadline`.
    pub(crate) fn send(
        &self,
        p: usize,
        words: &Words,
        fd: &OwnedFd,
        deadline: Instant,
    ) -> Result<()> {
        let c = self.conn(p)?;
        while !c.send(words, fd)? {
            if Instant::now() >= deadline {
                return Err(Error::Backend(format!(
                    "rank {p}'s descriptor queue stayed full"
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// The descriptor rank `p` sends with `want`, by `deadline`; `check`
    /// is asked between looks (a failure of the node ends the wait). Any
    /// other message from `p` is closed and counted.
    pub(crate) fn recv(
        &self,
        p: usize,
        want: &Words,
        deadline: Instant,
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<OwnedFd> {
        let c = self.conn(p)?;
        loop {
            match c.try_recv()? {
                Recv::Message(Ok(w), Some(fd)) if w == *want => return Ok(fd),
                Recv::Message(w, _) => self.drop_message(p, c.peer(), &w, "unexpected"),
                Recv::Closed => {
                    return Err(Error::Backend(format!(
                        "rank {p} closed its descriptor link"
                    )))
                }
                Recv::Empty => {
                    check()?;
                    if Instant::now() >= deadline {
                        return Err(Error::Backend(format!(
                            "no descriptor from rank {p} in time"
                        )));
                    }
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }

    /// Close whatever waits on any link (the end of an exchange: nothing
    /// more is due). Returns how many messages were closed.
    pub(crate) fn drain(&self) -> usize {
        let mut closed = 0;
        for (p, c) in self.links.iter().enumerate() {
            let Some(c) = c else { continue };
            // Bounded: a link's queue holds a few messages at most.
            for _ in 0..1024 {
                match c.try_recv() {
                    Ok(Recv::Message(w, _)) => {
                        self.drop_message(p, c.peer(), &w, "left over");
                        closed += 1;
                    }
                    _ => break,
                }
            }
        }
        closed
    }

    fn drop_message(&self, p: usize, from: Cred, w: &Result<Words>, why: &str) {
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            rank = self.me,
            peer = p,
            pid = from.pid,
            uid = from.uid,
            dropped = n,
            words = ?w.as_ref().ok(),
            "descriptor message {why}: closed unread{}",
            w.as_ref().err().map(|e| format!(" ({e})")).unwrap_or_default()
        );
    }
}

/// Bind under a fresh name, and once more under another if that one was
/// taken: (the listener, its name).
fn bind_fresh(nonce: &mut dyn FnMut() -> Result<u128>) -> Result<(Listener, u128)> {
    for attempt in 0..2 {
        let name = nonce()?;
        match Listener::bind(name)? {
            Some(l) => return Ok((l, name)),
            None => tracing::warn!(attempt, "descriptor socket name {name:032x} was taken"),
        }
    }
    Err(Error::Backend(
        "descriptor socket: two fresh random names were both taken".into(),
    ))
}

#[cfg(test)]
mod tests;
