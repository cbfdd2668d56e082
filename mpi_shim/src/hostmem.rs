//! Host memory recognised without asking the CUDA driver: a pointer query
//! costs 110-250 ns on host memory (H200, driver 580), twice per collective,
//! which alone is most of what the shim may add to a host call. Two kinds
//! of address are host memory by construction, whatever the driver did:
//!
//! * the live part of the calling thread's stack, from the current stack
//!   pointer to the top of the stack (the caller's buffers live in frames
//!   above ours);
//! * the main arena's heap, from the start of the program break to its
//!   current end (`sbrk(0)`): the kernel never maps anything else inside it,
//!   and a pointer the program passes into it came from `malloc`.
//!
//! Anything else (mmap'd blocks of large allocations, other threads'
//! arenas, device memory) goes to the driver as before.

use std::cell::Cell;
use std::sync::OnceLock;

/// Whether `p` is host memory for sure (see the module's two cases).
#[inline]
pub fn surely_host(p: usize) -> bool {
    in_live_stack(p) || in_heap(p)
}

thread_local! {
    /// The top (highest address) of this thread's stack; 0 when unknown.
    static STACK_TOP: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn in_live_stack(p: usize) -> bool {
    let marker = 0u8;
    // Our own frame is below every frame of the caller.
    let sp = std::ptr::addr_of!(marker) as usize;
    let top = STACK_TOP.with(|t| {
        if t.get() == usize::MAX {
            t.set(stack_top().unwrap_or(0));
        }
        t.get()
    });
    sp <= p && p < top
}

/// The top of the calling thread's stack, from its pthread attributes.
fn stack_top() -> Option<usize> {
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and
    // destroyed once; the out-pointers are valid locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (rc == 0 && !addr.is_null()).then(|| addr as usize + size)
    }
}

/// The first address of the program break (`start_brk`, field 47 of
/// /proc/self/stat), read once; None when the kernel does not show it.
fn heap_start() -> Option<usize> {
    static START: OnceLock<Option<usize>> = OnceLock::new();
    *START.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        parse_start_brk(&stat)
    })
}

/// Field 47 of a /proc/pid/stat line (the command name, field 2, is in
/// parentheses and may hold spaces).
fn parse_start_brk(stat: &str) -> Option<usize> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; start_brk is field 47.
    let v: usize = after_comm.split_whitespace().nth(47 - 3)?.parse().ok()?;
    (v != 0).then_some(v)
}

fn in_heap(p: usize) -> bool {
    let Some(start) = heap_start() else {
        return false;
    };
    if p < start {
        return false;
    }
    // SAFETY: sbrk(0) only reads the current break.
    let end = unsafe { libc::sbrk(0) } as usize;
    end != usize::MAX && p < end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_buffers_of_callers_are_host() {
        let buf = [0u64; 4];
        assert!(surely_host(buf.as_ptr() as usize));
        let t = std::thread::spawn(|| {
            let b = [1u8; 64];
            surely_host(b.as_ptr() as usize)
        });
        assert!(t.join().unwrap());
    }

    #[test]
    fn the_main_heap_is_host() {
        let start = heap_start().expect("Linux shows start_brk");
        // SAFETY: sbrk(0) only reads the current break.
        let end = unsafe { libc::sbrk(0) } as usize;
        if end > start {
            assert!(surely_host(end - 8) && surely_host(start));
        }
        assert!(!surely_host(end) || in_live_stack(end));
    }

    #[test]
    fn mapped_and_null_addresses_go_to_the_driver() {
        assert!(!surely_host(0));
        // SAFETY: a fresh anonymous private mapping, unmapped below.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        assert!(!surely_host(m as usize));
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(m, 1 << 20) };
    }

    #[test]
    fn start_brk_is_field_47() {
        let mut fields: Vec<String> = (3..=52).map(|i| (i * 10).to_string()).collect();
        fields[47 - 3] = "94000000".into();
        let line = format!("1234 (a b) c) {}", fields.join(" "));
        assert_eq!(parse_start_brk(&line), Some(94000000));
        assert_eq!(parse_start_brk("1 (x) S 1 2"), None);
        assert!(heap_start().is_some(), "Linux shows start_brk");
    }
}
