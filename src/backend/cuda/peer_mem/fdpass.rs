//! Unix sockets that pass file descriptors between the ranks of one node:
//! what a peer needs to map a VMM allocation (`vmm.rs`). The links between
//! the ranks are set up once, at bring-up (`fdmesh.rs`); this file holds
//! the socket calls and the parser of a message.
//!
//! Sockets are `SOCK_SEQPACKET` (connected, so the kernel tells each end
//! who the other is: `SO_PEERCRED`, which the sender cannot forge) in the
//! abstract namespace under a random name (no file to clean up, gone with
//! the socket). A message is three words (the copy-engine call number, the
//! sender's rank, the allocation's buffer ID) with exactly one descriptor
//! attached (`SCM_RIGHTS`). A receiver leaves room for one descriptor
//! only, so the kernel discards any more that a sender attached, and every
//! descriptor that does arrive is owned (closed on drop) at once; all are
//! received close-on-exec (`MSG_CMSG_CLOEXEC`).
//!
//! `pidfd_getfd` would need no socket, but it needs ptrace rights that
//! Yama (`ptrace_scope=1`) and containers without `CAP_SYS_PTRACE` deny
//! between sibling MPI ranks, so it would be a second path used on some
//! machines only; a socket of the same network namespace always works, and
//! with credentials checked it gives the same guarantee: only the rank the
//! MPI exchange named gets the descriptor.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The words of one message.
pub(crate) type Words = [u64; 3];
/// Bytes of one message's payload.
pub(crate) const MESSAGE_BYTES: usize = std::mem::size_of::<Words>();
/// Connections a listener queues before `connect` fails with `EAGAIN`.
const BACKLOG: libc::c_int = 64;

/// Who is at the other end of a connected socket (`SO_PEERCRED`: the
/// kernel's record of the process that connected, or that listened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The payload of a message as received: the words if it is well formed.
/// Well formed: exactly [`MESSAGE_BYTES`] bytes, not truncated, with
/// exactly one descriptor.
pub(crate) fn parse_message(data: &[u8], fds: usize, truncated: bool) -> Result<Words> {
    let bad = |why: String| Error::Backend(format!("descriptor message: {why}"));
    if truncated {
        return Err(bad("truncated (longer payload or more descriptors)".into()));
    }
    if fds != 1 {
        return Err(bad(format!("{fds} descriptors attached, expected 1")));
    }
    if data.len() != MESSAGE_BYTES {
        return Err(bad(format!(
            "{} bytes, expected {MESSAGE_BYTES}",
            data.len()
        )));
    }
    let mut w: Words = [0; 3];
    for (i, c) in data.chunks_exact(8).enumerate() {
        w[i] = u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
    }
    Ok(w)
}

/// The payload bytes of `words` (what [`parse_message`] reads).
pub(crate) fn encode_message(words: &Words) -> [u8; MESSAGE_BYTES] {
    let mut b = [0u8; MESSAGE_BYTES];
    for (i, w) in words.iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&w.to_ne_bytes());
    }
    b
}

/// The abstract socket address named after `nonce` (a leading NUL: no
/// file is created, nothing to clean up).
pub(crate) fn address(nonce: u128) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: a plain C struct of integers and bytes; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("gpucoll-fd/{nonce:032x}");
    // 11 + 32 bytes after the NUL: far below sun_path's 108.
    for (dst, src) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

fn os_error(what: &str) -> Error {
    Error::Backend(format!("{what}: {}", io::Error::last_os_error()))
}

fn errno() -> Option<i32> {
    io::Error::last_os_error().raw_os_error()
}

/// A new non-blocking, close-on-exec seqpacket socket.
fn new_socket() -> Result<OwnedFd> {
    // SAFETY: creates a socket; no pointers.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if raw < 0 {
        return Err(os_error("socket"));
    }
    // SAFETY: `raw` is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The kernel's credentials of the other end of `fd`.
fn peer_cred(fd: &OwnedFd) -> Result<Cred> {
    // SAFETY: a plain C struct; all-zero is valid.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` is writable and `len` says how big it is.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 || len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(os_error("getsockopt(SO_PEERCRED)"));
    }
    Ok(Cred {
        pid: c.pid as u32,
        uid: c.uid,
        gid: c.gid,
    })
}

/// `bind` or `connect`: a socket call taking an address.
type AddressCall =
    unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> libc::c_int;

/// A new socket and `op` on it with `nonce`'s address: the socket and the
/// call's result (errno tells the failure).
fn socket_at(nonce: u128, op: AddressCall) -> Result<(OwnedFd, libc::c_int)> {
    let fd = new_socket()?;
    let (a, len) = address(nonce);
    // SAFETY: `a` is a valid address of `len` bytes, which `op` (bind or
    // connect) only reads, on a socket of ours.
    let r = unsafe {
        op(
            fd.as_raw_fd(),
            &a as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    };
    Ok((fd, r))
}

/// A listening socket, bound under a random name until dropped.
#[derive(Debug)]
pub(crate) struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Bind and listen under `nonce`'s name; None when the name is taken.
    pub(crate) fn bind(nonce: u128) -> Result<Option<Listener>> {
        let (fd, r) = socket_at(nonce, libc::bind)?;
        if r != 0 {
            return match errno() {
                Some(libc::EADDRINUSE) => Ok(None),
                _ => Err(os_error("bind")),
            };
        }
        // SAFETY: a bound socket of ours; no pointers.
        if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } != 0 {
            return Err(os_error("listen"));
        }
        Ok(Some(Listener { fd }))
    }

    /// A connection waiting to be accepted, if any, with who made it.
    pub(crate) fn accept(&self) -> Result<Option<Conn>> {
        loop {
            // SAFETY: no address wanted (null pointers are allowed).
            let raw = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if raw >= 0 {
                // SAFETY: a new descriptor owned by nobody else.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                let peer = peer_cred(&fd)?;
                return Ok(Some(Conn { fd, peer }));
            }
            match errno() {
                Some(libc::EAGAIN) => return Ok(None),
                // The connecting side gave up before we took it: next.
                Some(libc::EINTR) | Some(libc::ECONNABORTED) => continue,
                _ => return Err(os_error("accept4")),
            }
        }
    }
}

/// Connect to the listener named after `nonce`; None while its queue is
/// full (try again).
pub(crate) fn connect(nonce: u128) -> Result<Option<Conn>> {
    let (fd, r) = socket_at(nonce, libc::connect)?;
    if r != 0 {
        return match errno() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(os_error("connect")),
        };
    }
    let peer = peer_cred(&fd)?;
    Ok(Some(Conn { fd, peer }))
}

/// What one receive found.
#[derive(Debug)]
pub(crate) enum Recv {
    /// Nothing waiting.
    Empty,
    /// The other end closed the connection.
    Closed,
    /// One message: its words if well formed, and its descriptor if one
    /// came (owned: dropping it closes it).
    Message(Result<Words>, Option<OwnedFd>),
}

/// One end of a connection, with the credentials of the other end.
#[derive(Debug)]
pub(crate) struct Conn {
    fd: OwnedFd,
    peer: Cred,
}

impl Conn {
    /// Who the other end is (as the kernel recorded at connect or listen).
    pub(crate) fn peer(&self) -> Cred {
        self.peer
    }

    /// Send `words` and a duplicate of `fd` (false: the other end's queue
    /// is full, try again).
    pub(crate) fn send(&self, words: &Words, fd: &OwnedFd) -> Result<bool> {
        let mut data = encode_message(words);
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut control = [0u64; 4];
        // SAFETY: a plain C struct; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: pure arithmetic on the size of one int.
        msg.msg_controllen =
            unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as _;
        // SAFETY: `control` (32 bytes, 8-aligned) holds one header with one
        // int (CMSG_SPACE(4) = 24 bytes); CMSG_FIRSTHDR points into it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, fd.as_raw_fd());
        }
        loop {
            // SAFETY: every pointer in `msg` points at live locals above.
            let r = unsafe {
                libc::sendmsg(
                    self.fd.as_raw_fd(),
                    &msg,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if r == MESSAGE_BYTES as isize {
                return Ok(true);
            }
            if r >= 0 {
                return Err(Error::Backend(format!(
                    "sendmsg sent {r} of {MESSAGE_BYTES} bytes"
                )));
            }
            match errno() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(false),
                _ => return Err(os_error("sendmsg")),
            }
        }
    }

    /// One waiting message, if any. Room is left for one descriptor: the
    /// kernel closes any further ones a sender attached (and flags the
    /// message truncated); whatever arrives is owned at once.
    pub(crate) fn try_recv(&self) -> Result<Recv> {
        loop {
            // One byte more than a message: a longer one is flagged too.
            let mut data = [0u8; MESSAGE_BYTES + 1];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            let mut control = [0u64; 4];
            // SAFETY: a plain C struct; all-zero is valid.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            // SAFETY: pure arithmetic on the size of one int.
            msg.msg_controllen =
                unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as _;
            // SAFETY: every pointer in `msg` points at live locals above;
            // the control length is within `control`'s 32 bytes.
            let r = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut msg,
                    libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                return match errno() {
                    Some(libc::EAGAIN) => Ok(Recv::Empty),
                    Some(libc::EINTR) => continue,
                    Some(libc::ECONNRESET) => Ok(Recv::Closed),
                    _ => Err(os_error("recvmsg")),
                };
            }
            let mut fds: Vec<OwnedFd> = Vec::new();
            // SAFETY: the kernel filled `control` with `msg_controllen`
            // bytes of headers; the CMSG macros walk only inside them, and
            // each SCM_RIGHTS header's length says how many ints it holds.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let body =
                            ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                        let first = libc::CMSG_DATA(c) as *const libc::c_int;
                        for i in 0..body / std::mem::size_of::<libc::c_int>() {
                            let fd = std::ptr::read_unaligned(first.add(i));
                            if fd >= 0 {
                                fds.push(OwnedFd::from_raw_fd(fd));
                            }
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
            if r == 0 && fds.is_empty() && !truncated {
                return Ok(Recv::Closed);
            }
            let words = parse_message(&data[..r as usize], fds.len(), truncated);
            // Extra descriptors close here, when `fds` drops.
            let fd = if words.is_ok() { fds.pop() } else { None };
            return Ok(Recv::Message(words, fd));
        }
    }

    /// Send raw bytes with `fds` attached, for tests that play a broken or
    /// hostile sender.
    #[cfg(test)]
    pub(crate) fn send_raw(&self, data: &[u8], fds: &[libc::c_int]) -> Result<bool> {
        let mut data = data.to_vec();
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut control = vec![0u64; 4 + fds.len()];
        // SAFETY: a plain C struct; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds) as u32;
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            // SAFETY: pure arithmetic.
            msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as _;
            // SAFETY: `control` holds CMSG_SPACE(bytes) (8 bytes a slot,
            // 4 + fds.len() slots); one header with `fds.len()` ints.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(c) as *mut libc::c_int,
                    fds.len(),
                );
            }
        }
        // SAFETY: every pointer in `msg` points at live locals above.
        let r = unsafe {
            libc::sendmsg(
                self.fd.as_raw_fd(),
                &msg,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            return Ok(true);
        }
        match errno() {
            Some(libc::EAGAIN) => Ok(false),
            _ => Err(os_error("sendmsg")),
        }
    }
}

#[cfg(test)]
mod tests;
