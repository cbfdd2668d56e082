//! Device memory gpucoll cannot take (derived datatypes, pair types,
//! MAXLOC/MINLOC, user ops, single-rank communicators,
//! uneven v-forms): copied to pinned host memory, handed to `PMPI_` as host
//! buffers, and the results copied back. Correct on an MPI that knows
//! nothing about GPUs.
//!
//! Each staged buffer covers the bytes its (counts, displacements,
//! datatype) can touch, gaps included, so a receive buffer with gaps is
//! copied in first and its gaps come back unchanged.

use crate::cuda::{self, CtxGuard};
use crate::errors;
use crate::handles;
use gpucoll::Error;
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Datatype};
use std::ffi::{c_int, c_void};

/// The byte range `[lo, hi)` a buffer of `count` elements of `dt` touches,
/// relative to its address, and whether those bytes are all data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub lo: isize,
    pub hi: isize,
    pub dense: bool,
}

impl Span {
    pub const EMPTY: Span = Span {
        lo: 0,
        hi: 0,
        dense: true,
    };

    fn union(self, o: Span) -> Span {
        if self.hi <= self.lo {
            return o;
        }
        if o.hi <= o.lo {
            return self;
        }
        Span {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
            dense: false,
        }
    }
}

struct Layout {
    extent: isize,
    true_lb: isize,
    true_extent: isize,
    size: isize,
}

fn layout(dt: MPI_Datatype) -> Result<Layout, c_int> {
    let (mut lb, mut ext, mut tlb, mut text): (MPI_Aint, MPI_Aint, MPI_Aint, MPI_Aint) =
        (0, 0, 0, 0);
    let mut size: c_int = 0;
    // SAFETY: valid out-pointers; MPI validates the handle.
    unsafe {
        let rc = mpi_sys::PMPI_Type_get_extent(dt, &mut lb, &mut ext);
        if rc != 0 {
            return Err(rc);
        }
        let rc = mpi_sys::PMPI_Type_get_true_extent(dt, &mut tlb, &mut text);
        if rc != 0 {
            return Err(rc);
        }
        let rc = mpi_sys::PMPI_Type_size(dt, &mut size);
        if rc != 0 {
            return Err(rc);
        }
    }
    Ok(Layout {
        extent: ext,
        true_lb: tlb,
        true_extent: text,
        size: size as isize,
    })
}

const OVERFLOW: c_int = mpi_sys::MPI_ERR_COUNT as c_int;

/// Bytes touched by `count` elements of `dt` starting `displ` elements in.
fn span_at(l: &Layout, displ: isize, count: isize) -> Result<Span, c_int> {
    if count <= 0 {
        return Ok(Span::EMPTY);
    }
    let start = displ.checked_mul(l.extent).ok_or(OVERFLOW)?;
    let last = (count - 1).checked_mul(l.extent).ok_or(OVERFLOW)?;
    let base = start.checked_add(l.true_lb).ok_or(OVERFLOW)?;
    let lo = base.checked_add(last.min(0)).ok_or(OVERFLOW)?;
    let hi = base
        .checked_add(last.max(0))
        .and_then(|h| h.checked_add(l.true_extent))
        .ok_or(OVERFLOW)?;
    let dense = hi - lo == count.checked_mul(l.size).ok_or(OVERFLOW)?;
    Ok(Span { lo, hi, dense })
}

/// The bytes of `count` elements of `dt`.
pub fn span(count: i64, dt: MPI_Datatype) -> Result<Span, c_int> {
    if count <= 0 {
        return Ok(Span::EMPTY);
    }
    let count = isize::try_from(count).map_err(|_| OVERFLOW)?;
    span_at(&layout(dt)?, 0, count)
}

/// The bytes of blocks `counts[i]` at element displacements `displs[i]`.
///
/// # Safety
/// `counts` and `displs` hold `n` entries each.
pub unsafe fn span_v(
    counts: *const c_int,
    displs: *const c_int,
    n: usize,
    dt: MPI_Datatype,
) -> Result<Span, c_int> {
    if counts.is_null() || displs.is_null() || n == 0 {
        return Ok(Span::EMPTY);
    }
    let l = layout(dt)?;
    // SAFETY: `n` entries each per the contract.
    let (c, d) = unsafe {
        (
            std::slice::from_raw_parts(counts, n),
            std::slice::from_raw_parts(displs, n),
        )
    };
    let mut s = Span::EMPTY;
    for (&count, &displ) in c.iter().zip(d) {
        s = s.union(span_at(&l, displ as isize, count as isize)?);
    }
    Ok(s)
}

/// One buffer of a staged call.
pub struct Region {
    pub ptr: *const c_void,
    pub span: Span,
    /// MPI reads it (send buffers, in-place buffers).
    pub read: bool,
    /// MPI writes it (receive buffers).
    pub write: bool,
}

/// Stage the device regions through pinned memory, run `call_pmpi` with the
/// host addresses (in region order; host, null and `MPI_IN_PLACE` regions
/// pass unchanged), then copy written regions back.
///
/// # Safety
/// Each region is valid for its span (the MPI caller's promise).
pub unsafe fn run<const N: usize>(
    device: i32,
    comm: MPI_Comm,
    call: &str,
    regions: &[Region; N],
    call_pmpi: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    let fail = |msg: String| errors::fail(comm, call, &Error::Backend(msg));
    let _ctx = match CtxGuard::bind(device) {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    let mut stages = Vec::with_capacity(N);
    let mut ptrs = [std::ptr::null_mut(); N];
    for (r, ptr) in regions.iter().zip(ptrs.iter_mut()) {
        let len = (r.span.hi - r.span.lo).max(0) as usize;
        let on_device = len > 0 && !handles::is_in_place(r.ptr) && cuda::device_of(r.ptr).is_some();
        if !on_device {
            stages.push(None);
            *ptr = r.ptr.cast_mut();
            continue;
        }
        let pinned = match cuda::take_pinned(len) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let dev = r.ptr.wrapping_byte_offset(r.span.lo);
        if r.read || (r.write && !r.span.dense) {
            // SAFETY: `dev` spans `len` device bytes (caller), the pinned
            // buffer at least `len` host bytes.
            if let Err(e) = unsafe { cuda::copy_to_host(pinned.ptr(), dev, len) } {
                cuda::give_pinned(pinned);
                return fail(e);
            }
        }
        *ptr = pinned.ptr().wrapping_byte_offset(-r.span.lo);
        stages.push(Some(pinned));
    }
    let rc = call_pmpi(ptrs);
    let mut result = rc;
    for (r, stage) in regions.iter().zip(stages) {
        let Some(pinned) = stage else { continue };
        if rc == 0 && r.write {
            let len = (r.span.hi - r.span.lo) as usize;
            let dev = r.ptr.wrapping_byte_offset(r.span.lo) as *mut c_void;
            // SAFETY: as for the copy in.
            if let Err(e) = unsafe { cuda::copy_to_device(dev, pinned.ptr(), len) } {
                result = fail(e);
            }
        }
        cuda::give_pinned(pinned);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(size: isize) -> Layout {
        Layout {
            extent: size,
            true_lb: 0,
            true_extent: size,
            size,
        }
    }

    #[test]
    fn contiguous_spans_are_dense() {
        let l = contiguous(4);
        assert_eq!(
            span_at(&l, 0, 10).unwrap(),
            Span {
                lo: 0,
                hi: 40,
                dense: true
            }
        );
        assert_eq!(
            span_at(&l, 3, 2).unwrap(),
            Span {
                lo: 12,
                hi: 20,
                dense: true
            }
        );
        assert_eq!(span_at(&l, 0, 0).unwrap(), Span::EMPTY);
    }

    #[test]
    fn strided_types_have_gaps() {
        // A vector of 2 ints with stride 3: extent 20 (5 ints), size 8, true extent 20.
        let l = Layout {
            extent: 20,
            true_lb: 0,
            true_extent: 20,
            size: 8,
        };
        let s = span_at(&l, 0, 2).unwrap();
        assert_eq!((s.lo, s.hi, s.dense), (0, 40, false));
    }

    #[test]
    fn unions_cover_blocks() {
        let l = contiguous(8);
        let a = span_at(&l, 4, 1).unwrap();
        let b = span_at(&l, 0, 2).unwrap();
        let u = a.union(b);
        assert_eq!((u.lo, u.hi), (0, 40));
        assert_eq!(Span::EMPTY.union(a), a);
        assert!(span_at(&l, isize::MAX, 2).is_err());
    }
}
