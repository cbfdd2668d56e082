//! Device memory gpucoll cannot take (derived datatypes, pair types,
//! MAXLOC/MINLOC, user ops, single-rank communicators, intercommunicators,
//! uneven v-forms): copied to pinned host memory, handed to `PMPI_` as host
//! buffers, and the results copied back (at once for a blocking call; at
//! completion for a nonblocking one, `pmpi_work.rs`). Correct on an MPI
//! that knows nothing about GPUs. In host test mode (`GPUCOLL_SHIM_HOST=1`)
//! host buffers take the same path through plain host copies, so the spans
//! are tested without a GPU.
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
#[derive(Clone, Copy)]
pub struct Region {
    pub ptr: *const c_void,
    pub span: Span,
    /// MPI reads it (send buffers, in-place buffers).
    pub read: bool,
    /// MPI writes it (receive buffers).
    pub write: bool,
}

/// The host copy of one region.
enum Copy {
    Pinned(cuda::Pinned),
    /// Host test mode: plain host memory (u64 words keep MPI's unpacking
    /// aligned).
    Host(Vec<u64>),
}

impl Copy {
    fn ptr(&self) -> *mut c_void {
        match self {
            Copy::Pinned(p) => p.ptr(),
            Copy::Host(v) => v.as_ptr() as *mut c_void,
        }
    }
}

/// The regions of one call and their host copies, from [`stage_in`] until
/// [`Staged::finish`] (or [`Staged::leak`] when MPI may still use them).
pub struct Staged<const N: usize> {
    /// The GPU of the device regions (`None`: host test mode, every region
    /// copied through plain host memory).
    device: Option<i32>,
    regions: [Region; N],
    copies: Vec<Option<Copy>>,
    /// What MPI gets: the copies, shifted as the program's addresses are
    /// relative to their spans; regions not copied as they are.
    ptrs: [*mut c_void; N],
}

// SAFETY: the raw pointers are addresses of the program's buffers and of
// host copies owned by this value; moving it to another thread moves that
// ownership (a request completed on another thread).
unsafe impl<const N: usize> Send for Staged<N> {}
// SAFETY: shared access only reads the addresses.
unsafe impl<const N: usize> Sync for Staged<N> {}

fn len_of(r: &Region) -> usize {
    (r.span.hi - r.span.lo).max(0) as usize
}

/// Copy the regions MPI will read (and those it writes only in part) to
/// host memory: pinned memory from the pool for device regions (host
/// regions stay as they are), plain host memory for every region in host
/// test mode (`device` `None`). Null and `MPI_IN_PLACE` regions pass.
///
/// # Safety
/// Each region is valid for its span (the MPI caller's promise).
pub unsafe fn stage_in<const N: usize>(
    device: Option<i32>,
    regions: [Region; N],
) -> Result<Staged<N>, String> {
    let _ctx = device.map(CtxGuard::bind).transpose()?;
    let mut staged = Staged {
        device,
        regions,
        copies: Vec::with_capacity(N),
        ptrs: [std::ptr::null_mut(); N],
    };
    for (k, r) in regions.iter().enumerate() {
        let len = len_of(r);
        let copy = len > 0
            && !r.ptr.is_null()
            && !handles::is_in_place(r.ptr)
            && (device.is_none() || cuda::device_of(r.ptr).is_some());
        if !copy {
            staged.copies.push(None);
            staged.ptrs[k] = r.ptr.cast_mut();
            continue;
        }
        let src = r.ptr.wrapping_byte_offset(r.span.lo);
        let fill = r.read || (r.write && !r.span.dense);
        let c = match device {
            None => {
                let v = vec![0u64; len.div_ceil(8)];
                if fill {
                    // SAFETY: the program's buffer spans `len` bytes from
                    // `src` (the caller's contract); `v` holds at least `len`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src as *const u8, v.as_ptr() as *mut u8, len)
                    };
                }
                Copy::Host(v)
            }
            Some(_) => {
                let pinned = cuda::take_pinned(len)?;
                if fill {
                    // SAFETY: `src` spans `len` device bytes (the caller's
                    // contract), the pinned buffer at least `len` host bytes.
                    if let Err(e) = unsafe { cuda::copy_to_host(pinned.ptr(), src, len) } {
                        cuda::give_pinned(pinned);
                        staged.finish(false).ok();
                        return Err(e);
                    }
                }
                Copy::Pinned(pinned)
            }
        };
        staged.ptrs[k] = c.ptr().wrapping_byte_offset(-r.span.lo);
        staged.copies.push(Some(c));
    }
    Ok(staged)
}

impl<const N: usize> Staged<N> {
    /// The buffers to hand to MPI, in region order.
    pub fn ptrs(&self) -> [*mut c_void; N] {
        self.ptrs
    }

    /// MPI is done with the copies: copy the regions it wrote back into the
    /// program's buffers (`write_back`: the call succeeded) and return the
    /// copies to the pool.
    pub fn finish(mut self, write_back: bool) -> Result<(), String> {
        let _ctx = match self.device.map(CtxGuard::bind).transpose() {
            Ok(g) => g,
            Err(e) => {
                // Without the context the pinned memory cannot go back.
                self.leak();
                return Err(e);
            }
        };
        let mut result = Ok(());
        for (r, c) in self.regions.iter().zip(std::mem::take(&mut self.copies)) {
            let Some(c) = c else { continue };
            if write_back && r.write {
                let len = len_of(r);
                let dst = r.ptr.wrapping_byte_offset(r.span.lo) as *mut c_void;
                match &c {
                    // SAFETY: as in `stage_in`, the other way.
                    Copy::Host(v) => unsafe {
                        std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, dst as *mut u8, len)
                    },
                    Copy::Pinned(p) => {
                        // SAFETY: as in `stage_in`, the other way.
                        if let Err(e) = unsafe { cuda::copy_to_device(dst, p.ptr(), len) } {
                            result = Err(e);
                        }
                    }
                }
            }
            if let Copy::Pinned(p) = c {
                cuda::give_pinned(p);
            }
        }
        result
    }

    /// MPI may still write the copies (a request that never completed):
    /// they are never freed or reused.
    pub fn leak(mut self) {
        std::mem::forget(std::mem::take(&mut self.copies));
    }
}

/// A failed staging step of `call`: logged, raised on `comm`.
pub fn fail(comm: MPI_Comm, call: &str, msg: String) -> c_int {
    errors::fail(comm, call, &Error::Backend(msg))
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
