//! The MPI calls of point-to-point messages (`crate::p2p`) and of their
//! oracle (`crate::reference`): matched probes that take whole messages out
//! of MPI's matching in MPI's order, blocking sends and receives with their
//! status, and the tag bound.

use super::{count_i32, ffi, require_usable, MpiComm};
use crate::error::Result;
use std::os::raw::{c_int, c_void};

/// Who sent a message and how long it is, as MPI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub source: usize,
    pub tag: i32,
    pub bytes: usize,
}

/// A source or tag selector: `None` is `MPI_ANY_SOURCE` / `MPI_ANY_TAG`.
fn source_arg(source: Option<usize>) -> Result<c_int> {
    match source {
        None => Ok(ffi::any_source()),
        Some(s) => count_i32(s),
    }
}

fn tag_arg(tag: Option<i32>) -> c_int {
    tag.unwrap_or_else(ffi::any_tag)
}

fn received(status: &ffi::MPI_Status) -> Result<Received> {
    let mut count: c_int = 0;
    // SAFETY: `status` was filled in by a successful receive or probe.
    let rc = unsafe { ffi::PMPI_Get_count(status, ffi::byte_type(), &mut count) };
    ffi::check("MPI_Get_count", rc)?;
    Ok(Received {
        source: status.MPI_SOURCE.max(0) as usize,
        tag: status.MPI_TAG,
        bytes: count.max(0) as usize,
    })
}

impl MpiComm {
    /// The largest tag MPI accepts on this communicator (`MPI_TAG_UB`, at
    /// least 32767 by the standard).
    pub fn tag_ub(&self) -> Result<i32> {
        require_usable("MPI_Comm_get_attr")?;
        let mut value: *mut c_int = std::ptr::null_mut();
        let mut flag: c_int = 0;
        // SAFETY: MPI_TAG_UB's value is a pointer to an int that MPI owns;
        // `value` receives that pointer, `flag` whether it is set.
        let rc = unsafe {
            ffi::PMPI_Comm_get_attr(
                self.raw,
                ffi::tag_ub_keyval(),
                &mut value as *mut *mut c_int as *mut c_void,
                &mut flag,
            )
        };
        ffi::check("MPI_Comm_get_attr", rc)?;
        if flag == 0 || value.is_null() {
            return Ok(32767);
        }
        // SAFETY: MPI set the attribute: `value` points at its int.
        Ok(unsafe { *value }.max(32767))
    }

    /// Take the next message (from any source, any tag) out of MPI's
    /// matching, if one has arrived, and receive it whole (`MPI_Improbe`,
    /// then `MPI_Mrecv` into a buffer of its size). Messages of one source
    /// come out in the order it sent them.
    pub fn take_next(&self) -> Result<Option<(Received, Vec<u8>)>> {
        require_usable("MPI_Improbe")?;
        let mut flag: c_int = 0;
        let mut message = ffi::message_null();
        let mut status = ffi::empty_status();
        // SAFETY: valid out pointers; the selectors are MPI's wildcards.
        let rc = unsafe {
            ffi::PMPI_Improbe(
                ffi::any_source(),
                ffi::any_tag(),
                self.raw,
                &mut flag,
                &mut message,
                &mut status,
            )
        };
        ffi::check("MPI_Improbe", rc)?;
        if flag == 0 {
            return Ok(None);
        }
        let r = received(&status)?;
        let mut buf = vec![0u8; r.bytes];
        let n = count_i32(r.bytes)?;
        // SAFETY: `message` was matched above and is received exactly once;
        // `buf` holds the message's size in bytes.
        let rc = unsafe {
            ffi::PMPI_Mrecv(
                buf.as_mut_ptr() as *mut c_void,
                n,
                ffi::byte_type(),
                &mut message,
                ffi::status_ignore(),
            )
        };
        ffi::check("MPI_Mrecv", rc)?;
        Ok(Some((r, buf)))
    }

    /// `MPI_Send` of bytes (blocking).
    pub fn send_bytes(&self, buf: &[u8], dest: usize, tag: i32) -> Result<()> {
        require_usable("MPI_Send")?;
        self.check_peer(dest)?;
        let n = count_i32(buf.len())?;
        // SAFETY: `buf` holds n bytes and outlives this blocking call.
        let rc = unsafe {
            ffi::PMPI_Send(
                buf.as_ptr() as *const c_void,
                n,
                ffi::byte_type(),
                dest as c_int,
                tag,
                self.raw,
            )
        };
        ffi::check("MPI_Send", rc)
    }

    /// `MPI_Recv` of up to `buf.len()` bytes (blocking); `None` selectors
    /// are MPI's wildcards. A longer message is MPI's truncation error.
    pub fn recv_bytes(
        &self,
        buf: &mut [u8],
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Received> {
        require_usable("MPI_Recv")?;
        if let Some(s) = source {
            self.check_peer(s)?;
        }
        let n = count_i32(buf.len())?;
        let mut status = ffi::empty_status();
        // SAFETY: `buf` holds n writable bytes and outlives this blocking
        // call; `status` is a valid out pointer.
        let rc = unsafe {
            ffi::PMPI_Recv(
                buf.as_mut_ptr() as *mut c_void,
                n,
                ffi::byte_type(),
                source_arg(source)?,
                tag_arg(tag),
                self.raw,
                &mut status,
            )
        };
        ffi::check("MPI_Recv", rc)?;
        received(&status)
    }

    /// `MPI_Sendrecv` of bytes (blocking).
    pub fn sendrecv_bytes(
        &self,
        send: &[u8],
        dest: usize,
        send_tag: i32,
        recv: &mut [u8],
        source: Option<usize>,
        recv_tag: Option<i32>,
    ) -> Result<Received> {
        require_usable("MPI_Sendrecv")?;
        self.check_peer(dest)?;
        if let Some(s) = source {
            self.check_peer(s)?;
        }
        let (ns, nr) = (count_i32(send.len())?, count_i32(recv.len())?);
        let mut status = ffi::empty_status();
        // SAFETY: both buffers hold their stated bytes and outlive this
        // blocking call; `status` is a valid out pointer.
        let rc = unsafe {
            ffi::PMPI_Sendrecv(
                send.as_ptr() as *const c_void,
                ns,
                ffi::byte_type(),
                dest as c_int,
                send_tag,
                recv.as_mut_ptr() as *mut c_void,
                nr,
                ffi::byte_type(),
                source_arg(source)?,
                tag_arg(recv_tag),
                self.raw,
                &mut status,
            )
        };
        ffi::check("MPI_Sendrecv", rc)?;
        received(&status)
    }
}
