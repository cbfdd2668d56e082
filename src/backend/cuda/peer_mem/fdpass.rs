//! File descriptors passed between the ranks of one node: what a peer
//! needs to map a VMM allocation (`vmm.rs`). Each rank of a communicator
//! binds an abstract Unix datagram socket named after its control segment
//! (unique per communicator and rank, gone with the process); a message is
//! three words (the copy-engine call number, the sender's rank, the
//! allocation's buffer ID) with one descriptor attached (`SCM_RIGHTS`).
//!
//! `pidfd_getfd` would need no socket, but it needs ptrace rights that
//! Yama (`ptrace_scope=1`) and containers without `CAP_SYS_PTRACE` deny
//! between sibling MPI ranks; a socket of the same network namespace
//! always works.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The words of one message.
pub(crate) type Words = [u64; 3];

/// A bound, non-blocking datagram socket.
#[derive(Debug)]
pub(crate) struct FdSocket {
    fd: OwnedFd,
}

/// The abstract socket address named after `segment` (a leading NUL:
/// no file is created, nothing to clean up).
fn address(segment: &str) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: a plain C struct of integers and bytes; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("gpucoll-fd{segment}");
    if name.len() + 1 > a.sun_path.len() {
        return Err(Error::Backend(format!("socket name {name} is too long")));
    }
    for (dst, src) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((a, len as libc::socklen_t))
}

fn os_error(what: &str, name: &str) -> Error {
    Error::Backend(format!("{what} ({name}): {}", io::Error::last_os_error()))
}

impl FdSocket {
    /// Bind the socket of the rank whose control segment is `segment`.
    pub(crate) fn bind(segment: &str) -> Result<FdSocket> {
        let (a, len) = address(segment)?;
        // SAFETY: creates a socket; no pointers.
        let raw = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if raw < 0 {
            return Err(os_error("socket", segment));
        }
        // SAFETY: `raw` is a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `a` is a valid address of `len` bytes.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &a as *const libc::sockaddr_un as *const libc::sockaddr,
                len,
            )
        };
        if r != 0 {
            return Err(os_error("bind", segment));
        }
        Ok(FdSocket { fd })
    }

    /// Send `words` and a duplicate of `fd` to the socket of `segment`
    /// (false: its buffer is full, try again).
    pub(crate) fn send(&self, segment: &str, words: &Words, fd: &OwnedFd) -> Result<bool> {
        let (a, len) = address(segment)?;
        let mut data = *words;
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut libc::c_void,
            iov_len: std::mem::size_of::<Words>(),
        };
        let mut control = [0u64; 8];
        // SAFETY: a plain C struct; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = &a as *const libc::sockaddr_un as *mut libc::c_void;
        msg.msg_namelen = len;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: pure arithmetic on the size of one int.
        msg.msg_controllen =
            unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as _;
        // SAFETY: `control` (64 bytes, 8-aligned) holds one header with one
        // int; CMSG_FIRSTHDR points into it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, fd.as_raw_fd());
        }
        // SAFETY: every pointer in `msg` points at live locals above.
        let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(true);
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(false),
            _ => Err(os_error("sendmsg", segment)),
        }
    }

    /// One waiting message, if any. A message without a descriptor, or of
    /// another size, is dropped.
    pub(crate) fn try_recv(&self) -> Result<Option<(Words, OwnedFd)>> {
        loop {
            let mut data: Words = [0; 3];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr() as *mut libc::c_void,
                iov_len: std::mem::size_of::<Words>(),
            };
            let mut control = [0u64; 8];
            // SAFETY: a plain C struct; all-zero is valid.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: every pointer in `msg` points at live locals above.
            let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if r < 0 {
                return match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) => Ok(None),
                    Some(libc::EINTR) => continue,
                    _ => Err(os_error("recvmsg", "own socket")),
                };
            }
            let mut got = None;
            // SAFETY: the kernel filled `control` with `msg_controllen`
            // bytes of headers; the CMSG macros walk only inside them.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        if fd >= 0 && got.is_none() {
                            got = Some(OwnedFd::from_raw_fd(fd));
                        } else if fd >= 0 {
                            libc::close(fd);
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            match got {
                Some(fd) if r as usize == std::mem::size_of::<Words>() => {
                    return Ok(Some((data, fd)))
                }
                _ => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_and_its_words_arrive() {
        let a = format!("/gpucoll.test.fdpass.{}.a", std::process::id());
        let b = format!("/gpucoll.test.fdpass.{}.b", std::process::id());
        let sa = FdSocket::bind(&a).unwrap();
        let sb = FdSocket::bind(&b).unwrap();
        assert!(sb.try_recv().unwrap().is_none());
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = OwnedFd::from(file);
        assert!(sa.send(&b, &[7, 1, 99], &fd).unwrap());
        let (words, got) = sb.try_recv().unwrap().expect("a message");
        assert_eq!(words, [7, 1, 99]);
        assert_ne!(got.as_raw_fd(), fd.as_raw_fd());
        // The same file: same inode through both descriptors.
        let ino = |f: &OwnedFd| {
            // SAFETY: a plain C struct; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: a valid descriptor and a struct to fill.
            assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), &mut st) }, 0);
            st.st_ino
        };
        assert_eq!(ino(&got), ino(&fd));
        assert!(sb.try_recv().unwrap().is_none());
        // A second bind of the same name fails (names are per rank).
        assert!(FdSocket::bind(&a).is_err());
        // Nobody bound: an error, not a hang.
        let c = format!("/gpucoll.test.fdpass.{}.c", std::process::id());
        assert!(sa.send(&c, &[0; 3], &fd).is_err());
    }
}
