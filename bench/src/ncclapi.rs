//! NCCL's C entry points, resolved with `dlsym` from one libnccl that the
//! bench loads itself (feature `cuda`).
//!
//! cudarc's NCCL bindings open `libnccl.so` from the loader path and cannot
//! be pointed at another file (and never try `libnccl.so.2`), so the bench
//! keeps its own table: `--nccl-lib PATH` picks the library, the default is
//! the one the loader finds. Every symbol is looked up when the library is
//! opened, so a missing entry point is an error (or, for the optional ones,
//! `None`), never a panic at the first call. Results, data types and
//! reduction ops are plain C ints: NCCL returns custom op handles and
//! result codes that no Rust enum lists.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub type Comm = *mut c_void;
pub type Stream = *mut c_void;
pub type Window = *mut c_void;
/// `ncclResult_t`; 0 is success.
pub type NcclResult = c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

/// `NCCL_WIN_COLL_SYMMETRIC` (nccl.h, NCCL ≥ 2.27).
pub const WIN_COLL_SYMMETRIC: c_int = 0x01;
/// `ncclScalarHostImmediate`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

type Binary =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult;
type Reducing = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type Rooted = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type RootedReducing = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;

/// The entry points of one loaded libnccl. The library is never closed
/// (communicators and NCCL's threads may use it until the process exits).
pub struct NcclApi {
    /// The file the entry points come from (`dladdr`), or the name asked for.
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub get_last_error: unsafe extern "C" fn(Comm) -> *const c_char,
    pub all_reduce: Reducing,
    pub reduce: RootedReducing,
    pub broadcast: Rooted,
    pub all_gather: Binary,
    pub reduce_scatter: Reducing,
    /// NCCL ≥ 2.28.
    pub all_to_all: Option<Binary>,
    pub gather: Option<Rooted>,
    pub scatter: Option<Rooted>,
    pub red_op_create_pre_mul_sum:
        unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> NcclResult,
    pub red_op_destroy: unsafe extern "C" fn(c_int, Comm) -> NcclResult,
    /// Symmetric windows (NCCL ≥ 2.27): all three or none.
    pub windows: Option<WindowApi>,
}

/// `ncclMemAlloc`, `ncclMemFree`, `ncclCommWindowRegister`. Windows are
/// not deregistered: they end with the communicator (`ncclCommAbort`, no
/// collective teardown).
#[derive(Clone, Copy)]
pub struct WindowApi {
    pub mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> NcclResult,
    pub mem_free: unsafe extern "C" fn(*mut c_void) -> NcclResult,
    pub register: unsafe extern "C" fn(Comm, *mut c_void, usize, *mut Window, c_int) -> NcclResult,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local NUL-terminated string or null,
    // read at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Open one library name or path; `Err` with the loader's message.
fn open(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("invalid library path '{name}'"))?;
    // SAFETY: `c` is NUL-terminated; dlopen has no other precondition. The
    // handle is kept for the process lifetime.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        Err(dl_error())
    } else {
        Ok(h)
    }
}

/// The address of `name` in `handle`, or null.
fn sym(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: a live handle from dlopen and a NUL-terminated name.
    unsafe { libc::dlsym(handle, c.as_ptr()) }
}

/// `name` from `handle` as the fn-pointer type `F`, if present.
fn optional<F: Copy>(handle: *mut c_void, name: &str) -> Option<F> {
    // Only fn-pointer types are asked for: pointer sized.
    if std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
        return None;
    }
    let p = sym(handle, name);
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is the address of NCCL's `name`, whose C signature
    // (nccl.h) the fn-pointer type `F` spells out; the sizes match.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// As [`optional`], an error naming the library when absent.
fn required<F: Copy>(handle: *mut c_void, lib: &str, name: &str) -> Result<F, String> {
    optional(handle, name).ok_or_else(|| format!("{lib} has no symbol {name}"))
}

/// The file that holds the code at `addr` (`dladdr`), symlinks resolved:
/// the library actually in use, even if another libnccl is loaded too.
fn file_of(addr: *const c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data (pointers and integers); all-zero is a
    // valid value that dladdr overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and writes `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, owned by the loader while the
    // library stays loaded (it is never closed).
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some(
        std::fs::canonicalize(&name)
            .map(|p| p.display().to_string())
            .unwrap_or(name),
    )
}

impl NcclApi {
    /// Load libnccl: `path` when given, else `libnccl.so.2` then
    /// `libnccl.so` from the loader path. `Err` says why (no panic).
    pub fn load(path: Option<&str>) -> Result<&'static NcclApi, String> {
        let (handle, asked) = match path {
            Some(p) => (
                open(p).map_err(|e| format!("--nccl-lib {p}: {e}"))?,
                p.to_string(),
            ),
            None => {
                let mut errs = Vec::new();
                let mut found = None;
                for name in ["libnccl.so.2", "libnccl.so"] {
                    match open(name) {
                        Ok(h) => {
                            found = Some((h, name.to_string()));
                            break;
                        }
                        Err(e) => errs.push(e),
                    }
                }
                found.ok_or_else(|| {
                    format!(
                        "no libnccl.so.2 or libnccl.so on the loader path ({}); pass --nccl-lib PATH",
                        errs.join("; ")
                    )
                })?
            }
        };
        let h = handle;
        let p = asked.as_str();
        let get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult =
            required(h, p, "ncclGetVersion")?;
        let api = NcclApi {
            path: file_of(get_version as *const c_void).unwrap_or_else(|| asked.clone()),
            get_version,
            get_unique_id: required(h, p, "ncclGetUniqueId")?,
            comm_init_rank: required(h, p, "ncclCommInitRank")?,
            comm_abort: required(h, p, "ncclCommAbort")?,
            get_error_string: required(h, p, "ncclGetErrorString")?,
            get_last_error: required(h, p, "ncclGetLastError")?,
            all_reduce: required(h, p, "ncclAllReduce")?,
            reduce: required(h, p, "ncclReduce")?,
            broadcast: required(h, p, "ncclBroadcast")?,
            all_gather: required(h, p, "ncclAllGather")?,
            reduce_scatter: required(h, p, "ncclReduceScatter")?,
            all_to_all: optional(h, "ncclAlltoAll"),
            gather: optional(h, "ncclGather"),
            scatter: optional(h, "ncclScatter"),
            red_op_create_pre_mul_sum: required(h, p, "ncclRedOpCreatePreMulSum")?,
            red_op_destroy: required(h, p, "ncclRedOpDestroy")?,
            windows: match (
                optional(h, "ncclMemAlloc"),
                optional(h, "ncclMemFree"),
                optional(h, "ncclCommWindowRegister"),
            ) {
                (Some(mem_alloc), Some(mem_free), Some(register)) => Some(WindowApi {
                    mem_alloc,
                    mem_free,
                    register,
                }),
                _ => None,
            },
        };
        Ok(Box::leak(Box::new(api)))
    }

    /// NCCL's own message for a failed call (`comm` adds its last error).
    pub fn describe(&self, r: NcclResult, comm: Option<Comm>) -> String {
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns static or communicator-owned
                // NUL-terminated strings, read at once.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: takes any result code and returns a static string.
        let mut s = format!("error {r}: {}", text(unsafe { (self.get_error_string)(r) }));
        if let Some(c) = comm {
            // SAFETY: `c` is a live communicator of this library.
            let last = text(unsafe { (self.get_last_error)(c) });
            if !last.is_empty() {
                s.push_str(&format!(" ({last})"));
            }
        }
        s
    }

    /// `Ok` for `ncclSuccess`, else an error naming `what`.
    pub fn check(&self, r: NcclResult, what: &str, comm: Option<Comm>) -> Result<(), String> {
        if r == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed: {}", self.describe(r, comm)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_fails_with_clear_errors() {
        let e = NcclApi::load(Some("/nonexistent/libnccl.so.2"))
            .err()
            .unwrap();
        assert!(
            e.starts_with("--nccl-lib /nonexistent/libnccl.so.2: "),
            "{e}"
        );
        // A real library without NCCL's entry points.
        let e = NcclApi::load(Some("libc.so.6")).err().unwrap();
        assert_eq!(e, "libc.so.6 has no symbol ncclGetVersion");
    }

    #[test]
    fn symbols_resolve_to_their_file() {
        let h = open("libc.so.6").unwrap();
        let f: Option<unsafe extern "C" fn(usize) -> *mut c_void> = optional(h, "malloc");
        let path = file_of(f.unwrap() as *const c_void).unwrap();
        assert!(path.contains("libc"), "{path}");
        assert!(optional::<unsafe extern "C" fn()>(h, "ncclAllReduce").is_none());
        // A type that is not pointer sized is refused, not transmuted.
        assert!(optional::<[u64; 2]>(h, "malloc").is_none());
    }
}
