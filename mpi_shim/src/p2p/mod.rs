//! Point-to-point on device memory over an MPI that knows nothing about
//! GPUs: the message itself goes through MPI (so MPI's matching rules,
//! truncation, `MPI_PROC_NULL` and the wire format stay MPI's), and only its
//! bytes are staged through host memory: a send copies the type's true
//! extent span to pinned memory and sends from there; a receive posts into
//! a host copy of its span and copies it back once MPI completed it.
//!
//! The bytes a short (or truncated) message does not reach, and a derived
//! type's gaps, must come back unchanged. A receive whose bytes land as a
//! prefix of its span (a predefined type, no gaps: `Staged::prefix`) copies
//! back only the bytes that arrived, which the status says; any other
//! receive copies its span in before posting and all of it back. Host
//! buffers go to `PMPI_` untouched, except in host test mode
//! (`GPUCOLL_SHIM_HOST=1`), where they are staged through plain host memory
//! as if they were device memory, so the staging runs without a GPU.
//!
//! Nonblocking calls return a shim request (`transfer`); persistent
//! requests are MPI's own, made on a host copy that lives as long as the
//! request (`persistent`); the `_c` forms (`large_count`) narrow their
//! counts and call the C exports (`exports`).

mod exports;
mod large_count;
mod persistent;
mod transfer;

pub use persistent::{after_completion, after_free};
pub use transfer::nonblocking;

use crate::cuda::{self, CtxGuard};
use crate::errors;
use crate::route;
use crate::settings;
use crate::staging::{self, Span};
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Status};
use std::ffi::{c_int, c_void};

const TRUNCATE: c_int = mpi_sys::MPI_ERR_TRUNCATE as c_int;

/// Which way the bytes of a staged buffer move.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dir {
    /// MPI reads it (a send).
    Send,
    /// MPI writes it (a receive).
    Recv,
    /// MPI reads, then writes it (`MPI_Sendrecv_replace`).
    Both,
}

/// A buffer the shim stages: the program's address, the bytes its
/// (count, datatype) touch, and the GPU it lives on (`None`: host test mode).
pub struct Staged {
    base: usize,
    span: Span,
    device: Option<i32>,
    /// A message fills the span from its start, in address order, and the
    /// bytes that arrived are the status's byte count: a predefined type
    /// whose span has no gaps.
    prefix: bool,
}

/// The host copy of a staged buffer.
pub enum Buf {
    Pinned(cuda::Pinned),
    /// Host test mode; u64 words keep MPI's unpacking aligned.
    Host(Vec<u64>),
}

impl Buf {
    fn ptr(&self) -> *mut c_void {
        match self {
            Buf::Pinned(p) => p.ptr(),
            Buf::Host(v) => v.as_ptr() as *mut c_void,
        }
    }
}

/// What a finished receive leaves to copy back into the program's buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Back {
    /// Nothing: a send, a failed or a cancelled receive.
    Nothing,
    /// The whole span (the host copy holds the program's own bytes where no
    /// message byte landed).
    Span,
    /// The first bytes of the span: what arrived in a prefix buffer.
    Bytes(usize),
}

impl Staged {
    fn len(&self) -> usize {
        (self.span.hi - self.span.lo) as usize
    }

    fn user(&self) -> *mut c_void {
        (self.base as *mut c_void).wrapping_byte_offset(self.span.lo)
    }

    /// The address MPI gets: the host copy, shifted as the program's
    /// address is relative to its span.
    fn host(&self, b: &Buf) -> *mut c_void {
        b.ptr().wrapping_byte_offset(-self.span.lo)
    }

    fn bind(&self) -> cuda::CuResult<Option<CtxGuard>> {
        self.device.map(CtxGuard::bind).transpose()
    }

    /// A host copy of the span, not filled.
    fn hold(&self) -> cuda::CuResult<Buf> {
        match self.device {
            None => Ok(Buf::Host(vec![0u64; self.len().div_ceil(8)])),
            Some(_) => {
                let _g = self.bind()?;
                cuda::take_pinned(self.len()).map(Buf::Pinned)
            }
        }
    }

    /// Fill the host copy from the program's buffer.
    fn copy_in(&self, b: &Buf) -> cuda::CuResult<()> {
        let len = self.len();
        match b {
            // SAFETY: the program's buffer spans `len` bytes from `user()`
            // (MPI's contract); the host copy holds at least `len`.
            Buf::Host(v) => unsafe {
                std::ptr::copy_nonoverlapping(self.user() as *const u8, v.as_ptr() as *mut u8, len);
                Ok(())
            },
            Buf::Pinned(p) => {
                let _g = self.bind()?;
                // SAFETY: `user()` spans `len` device bytes (MPI's
                // contract), the pinned buffer at least `len` host bytes.
                unsafe { cuda::copy_to_host(p.ptr(), self.user(), len) }
            }
        }
    }

    /// A host copy for a call moving the bytes `dir`: filled unless MPI
    /// writes it and only what arrives is copied back.
    fn take_in(&self, dir: Dir) -> cuda::CuResult<Buf> {
        let b = self.hold()?;
        if dir == Dir::Recv && self.prefix {
            return Ok(b);
        }
        if let Err(e) = self.copy_in(&b) {
            self.give(b);
            return Err(e);
        }
        Ok(b)
    }

    /// Copy what `back` says from the host copy into the program's buffer.
    fn copy_out(&self, b: &Buf, back: Back) -> cuda::CuResult<()> {
        let len = match back {
            Back::Nothing => return Ok(()),
            Back::Span => self.len(),
            Back::Bytes(n) => n.min(self.len()),
        };
        if len == 0 {
            return Ok(());
        }
        match b {
            // SAFETY: as in `copy_in`, the other way.
            Buf::Host(v) => unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, self.user() as *mut u8, len);
                Ok(())
            },
            Buf::Pinned(p) => {
                let _g = self.bind()?;
                // SAFETY: as in `copy_in`, the other way.
                unsafe { cuda::copy_to_device(self.user(), p.ptr(), len) }
            }
        }
    }

    fn give(&self, b: Buf) {
        if let Buf::Pinned(p) = b {
            cuda::give_pinned(p);
        }
    }

    /// What to copy back after a receive into this buffer ended with MPI
    /// result `rc` and status `st`.
    fn back(&self, rc: c_int, st: &MPI_Status) -> Back {
        if rc == TRUNCATE {
            // MPI filled the whole buffer with the message's first bytes.
            return Back::Span;
        }
        if rc != 0 {
            return Back::Nothing;
        }
        if !self.prefix {
            return Back::Span;
        }
        let mut n: c_int = -1;
        // SAFETY: a status MPI wrote for this receive; a local out-pointer.
        let r = unsafe { mpi_sys::PMPI_Get_count(st, crate::handles::byte_type(), &mut n) };
        match usize::try_from(n) {
            Ok(n) if r == 0 => Back::Bytes(n),
            _ => Back::Span,
        }
    }
}

/// Where one buffer of a point-to-point call goes.
pub enum Plan {
    Pmpi,
    Staged(Staged),
    Failed(c_int),
}

/// Whether `dt` is a predefined datatype (its typemap is in address order).
fn predefined(dt: MPI_Datatype) -> bool {
    let (mut ni, mut na, mut nd, mut combiner): (c_int, c_int, c_int, c_int) = (0, 0, 0, -1);
    // SAFETY: valid out-pointers; MPI validates the handle (and `span`
    // already accepted it).
    let rc =
        unsafe { mpi_sys::PMPI_Type_get_envelope(dt, &mut ni, &mut na, &mut nd, &mut combiner) };
    rc == 0 && combiner == mpi_sys::MPI_COMBINER_NAMED as c_int
}

/// Decide for one buffer of `count` elements of `dt` exchanged with `peer`.
pub fn plan(
    call: &str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
) -> Plan {
    // SAFETY: reading a link-time MPI constant.
    let proc_null = unsafe { mpi_sys::RSMPI_PROC_NULL };
    if !settings::active() || buf.is_null() || count <= 0 || peer == proc_null {
        return Plan::Pmpi;
    }
    let device = cuda::device_of(buf);
    if device.is_none() && !settings::get().host_mode {
        return Plan::Pmpi;
    }
    match staging::span(count, dt) {
        Err(code) => Plan::Failed(errors::raise(comm, code)),
        Ok(span) if span.hi <= span.lo => Plan::Pmpi,
        Ok(span) => {
            if settings::get().log {
                let why = match device {
                    Some(d) => format!("device {d}"),
                    None => "host memory, test mode".into(),
                };
                route::log(call, "staged", &why);
            }
            Plan::Staged(Staged {
                base: buf as usize,
                span,
                device,
                prefix: span.dense && predefined(dt),
            })
        }
    }
}

/// A staged buffer and its host copy, for the duration of one call.
pub type Held = Option<(Staged, Buf)>;

/// Stage one buffer for a call moving its bytes `dir`: the address MPI
/// gets, and what to undo.
pub fn enter(
    call: &str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
    dir: Dir,
) -> Result<(*mut c_void, Held), c_int> {
    match plan(call, buf, count, dt, peer, comm) {
        Plan::Pmpi => Ok((buf.cast_mut(), None)),
        Plan::Failed(code) => Err(code),
        Plan::Staged(s) => match s.take_in(dir) {
            Ok(b) => Ok((s.host(&b), Some((s, b)))),
            Err(e) => Err(errors::fail(comm, call, &gpucoll::Error::Backend(e))),
        },
    }
}

/// What a receive into `held` that ended with `rc` and `st` copies back.
pub fn back_of(held: &Held, rc: c_int, st: &MPI_Status) -> Back {
    held.as_ref().map_or(Back::Nothing, |(s, _)| s.back(rc, st))
}

/// End a call's staging: copy back what `back` says, return the host copy.
/// 0, or the error raised.
pub fn leave(call: &str, comm: MPI_Comm, held: Held, back: Back) -> c_int {
    let Some((s, b)) = held else { return 0 };
    let r = s.copy_out(&b, back);
    s.give(b);
    match r {
        Ok(()) => 0,
        Err(e) => errors::fail(comm, call, &gpucoll::Error::Backend(e)),
    }
}

/// A zeroed status (MPI_Status is plain integers).
pub fn empty_status() -> MPI_Status {
    // SAFETY: MPI_Status is a C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The status a receive should write: the program's, or `local` where the
/// program passed `MPI_STATUS_IGNORE` (the shim still needs the count).
pub fn status_target(status: *mut MPI_Status, local: &mut MPI_Status) -> *mut MPI_Status {
    // SAFETY: reading a link-time MPI constant.
    let ignore = unsafe { mpi_sys::RSMPI_STATUS_IGNORE };
    if status.is_null() || status == ignore {
        local
    } else {
        status
    }
}

/// MPI's own error wins over the staging's.
pub(super) fn first_error(codes: &[c_int]) -> c_int {
    codes.iter().copied().find(|&c| c != 0).unwrap_or(0)
}

/// A blocking send on one buffer: [`enter`], the `PMPI_` call `pmpi` on
/// the address it gives, then [`leave`].
pub fn blocking_send(
    call: &'static str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
    pmpi: impl FnOnce(*mut c_void) -> c_int,
) -> c_int {
    errors::guarded(
        call,
        comm,
        || (),
        || {
            settings::maybe_panic(call);
            let (ptr, held) = match enter(call, buf, count, dt, peer, comm, Dir::Send) {
                Ok(x) => x,
                Err(code) => return code,
            };
            let rc = pmpi(ptr);
            let undo = leave(call, comm, held, Back::Nothing);
            first_error(&[rc, undo])
        },
    )
}

/// A blocking receive (`dir`: `Recv`, or `Both` for a buffer sent first)
/// on one buffer: `pmpi` gets the address and the status to write, then
/// what arrived is copied back.
#[allow(clippy::too_many_arguments)] // a C call's arguments, passed on
pub fn blocking_recv(
    call: &'static str,
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    comm: MPI_Comm,
    dir: Dir,
    status: *mut MPI_Status,
    pmpi: impl FnOnce(*mut c_void, *mut MPI_Status) -> c_int,
) -> c_int {
    errors::guarded(
        call,
        comm,
        || (),
        || {
            settings::maybe_panic(call);
            let (ptr, held) = match enter(call, buf, count, dt, peer, comm, dir) {
                Ok(x) => x,
                Err(code) => return code,
            };
            if held.is_none() {
                return pmpi(ptr, status);
            }
            let mut local = empty_status();
            let target = status_target(status, &mut local);
            let rc = pmpi(ptr, target);
            // SAFETY: MPI wrote the status (the program's or `local`).
            let back = back_of(&held, rc, unsafe { &*target });
            let undo = leave(call, comm, held, back);
            first_error(&[rc, undo])
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(prefix: bool) -> Staged {
        Staged {
            base: 0x1000,
            span: Span {
                lo: 8,
                hi: 48,
                dense: true,
            },
            device: None,
            prefix,
        }
    }

    #[test]
    fn host_copy_maps_the_program_address() {
        let s = staged(true);
        let b = s.hold().unwrap();
        assert_eq!(s.len(), 40);
        assert_eq!(s.host(&b) as usize + 8, b.ptr() as usize);
        assert_eq!(s.user() as usize, 0x1008);
    }

    #[test]
    fn errors_copy_nothing_back_and_truncation_everything() {
        let st = empty_status();
        let s = staged(true);
        assert_eq!(s.back(mpi_sys::MPI_ERR_OTHER as c_int, &st), Back::Nothing);
        assert_eq!(s.back(TRUNCATE, &st), Back::Span);
        assert_eq!(staged(false).back(0, &st), Back::Span);
    }

    #[test]
    fn first_error_prefers_mpi() {
        assert_eq!(first_error(&[0, 0]), 0);
        assert_eq!(first_error(&[3, 5]), 3);
        assert_eq!(first_error(&[0, 5]), 5);
    }
}
