//! The arithmetic of one piece of a Flow: scaling, reducing and copying
//! between the caller's buffers and FIFO slots.

use super::super::reduce;
use crate::datatype::Datatype;
use crate::op::Reduction;

/// The reduction a flow applies, for one datatype.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kernel {
    pub dtype: Datatype,
    pub red: Reduction,
    pub pre: Option<f64>,
    pub post: Option<u64>,
    /// Fold the value into what `dst` holds ([`Flow::acc`]).
    pub acc: bool,
}

/// Whether `[a, a+n)` and `[b, b+n)` overlap.
fn overlaps(a: *const u8, b: *const u8, n: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    n > 0 && a < b + n && b < a + n
}

/// Compute one piece of a Flow: the value `pre(src) ⊕ recv[0] ⊕ ...`, with
/// the post-op, written into the first send slot (or `dst`), then copied to
/// the other send slots and `dst`.
///
/// # Safety
/// Every pointer is valid for `bytes` bytes; `recvs` are readable, `sends`
/// and `dst` writable. Receive and send slots overlap nothing else; `src`
/// and `dst` may overlap each other (in-place calls) but nothing else.
pub(super) unsafe fn compute_piece(
    k: &Kernel,
    bytes: usize,
    src: Option<*const u8>,
    recvs: &[*const u8],
    sends: &[*mut u8],
    dst: Option<*mut u8>,
) {
    if let (true, Some(d)) = (k.acc, dst) {
        // SAFETY: forwarded contract; validated: no sends, `d` is the target.
        unsafe { accumulate_piece(k, bytes, src, recvs, d) };
        return;
    }
    let target = match (sends.first(), dst) {
        (Some(&s), _) => s,
        (None, Some(d)) => d,
        // Nothing to write (a receive that only drains a peer).
        (None, None) => return,
    };
    let mut src = src;
    let mut _copy: Vec<u64> = Vec::new();
    if let Some(s) = src {
        if !std::ptr::eq(s, target) && overlaps(s, target, bytes) {
            // Partial overlap of src and dst: read src from a copy.
            _copy = vec![0u64; bytes.div_ceil(8)];
            // SAFETY: `s` is readable for `bytes`; the copy is a fresh allocation.
            unsafe { std::ptr::copy_nonoverlapping(s, _copy.as_mut_ptr() as *mut u8, bytes) };
            src = Some(_copy.as_ptr() as *const u8);
        }
    }
    // SAFETY (for every slice below): pointers are valid for `bytes` per the
    // contract; `t` is the only live reference to the target's bytes, and no
    // other slice aliases it (src == target is handled without a second slice).
    let t = unsafe { std::slice::from_raw_parts_mut(target, bytes) };
    let view = |p: *const u8| unsafe { std::slice::from_raw_parts(p, bytes) };
    let (dtype, combine) = (k.dtype, k.red.combine);
    let rest: &[*const u8] = match src {
        Some(s) if std::ptr::eq(s, target) => {
            if let Some(f) = k.pre {
                reduce::pre_scale_inplace(dtype, f, t);
            }
            recvs
        }
        Some(s) => {
            if let Some(f) = k.pre {
                reduce::pre_scale(dtype, f, t, view(s));
                recvs
            } else if let Some((&r0, rest)) = recvs.split_first() {
                reduce::reduce(dtype, combine, t, view(s), view(r0));
                rest
            } else {
                t.copy_from_slice(view(s));
                recvs
            }
        }
        None => match recvs {
            [r0, r1, rest @ ..] => {
                reduce::reduce(dtype, combine, t, view(*r0), view(*r1));
                rest
            }
            [r0] => {
                t.copy_from_slice(view(*r0));
                &[]
            }
            [] => &[],
        },
    };
    for &r in rest {
        reduce::reduce_inplace(dtype, combine, t, view(r));
    }
    if let Some(d) = k.post {
        reduce::post_div(dtype, d, t);
    }
    for &o in sends.iter().skip(1) {
        // SAFETY: distinct send slots, each writable for `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(target as *const u8, o, bytes) };
    }
    if let Some(d) = dst {
        if d != target {
            // SAFETY: `d` is writable for `bytes`; `target` is a send slot here,
            // which never overlaps user memory.
            unsafe { std::ptr::copy_nonoverlapping(target as *const u8, d, bytes) };
        }
    }
}

/// [`compute_piece`] of an accumulating flow: `dst = dst ⊕ value`.
///
/// # Safety
/// As for [`compute_piece`]; `dst` is the flow's only output.
unsafe fn accumulate_piece(
    k: &Kernel,
    bytes: usize,
    src: Option<*const u8>,
    recvs: &[*const u8],
    dst: *mut u8,
) {
    let mut held = vec![0u64; bytes.div_ceil(8)];
    let mut value = vec![0u64; bytes.div_ceil(8)];
    let value_ptr = value.as_mut_ptr() as *mut u8;
    // SAFETY: `dst` is readable for `bytes`; `held` is a fresh allocation.
    unsafe { std::ptr::copy_nonoverlapping(dst, held.as_mut_ptr() as *mut u8, bytes) };
    let plain = Kernel {
        post: None,
        acc: false,
        ..*k
    };
    // SAFETY: the value goes to a fresh buffer of `bytes`; inputs as the
    // caller guarantees.
    unsafe { compute_piece(&plain, bytes, src, recvs, &[], Some(value_ptr)) };
    // SAFETY: `dst` is writable for `bytes` and aliases neither copy.
    let t = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
    let as_bytes = |v: &[u64]| {
        // SAFETY: a u64 buffer of at least `bytes` bytes, read as bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, bytes) }
    };
    reduce::reduce(k.dtype, k.red.combine, t, as_bytes(&held), as_bytes(&value));
    if let Some(d) = k.post {
        reduce::post_div(k.dtype, d, t);
    }
}
