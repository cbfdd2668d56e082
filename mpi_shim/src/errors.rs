//! gpucoll errors as MPI error codes, reported the way MPI reports errors:
//! through the communicator's error handler, with gpucoll's message on
//! stderr (and in the `tracing` log).
//!
//! [`guarded`] is the C boundary's net: every `extern "C"` function of the
//! shim runs its body inside it (through `exec::blocking`/`nonblocking`,
//! the export macros, or by hand where a function has no macro), so a Rust
//! panic becomes `MPI_ERR_INTERN` through the communicator's error handler
//! instead of unwinding into the program (which Rust turns into an abort).

use gpucoll::Error;
use mpi_sys::MPI_Comm;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The MPI error class closest to a gpucoll error.
pub fn code_of(e: &Error) -> c_int {
    let code = match e {
        Error::Mpi { code, .. } => return *code,
        Error::InvalidRoot { .. } => mpi_sys::MPI_ERR_ROOT,
        Error::InvalidRank { .. } => mpi_sys::MPI_ERR_RANK,
        Error::BufferLength { .. } | Error::NotDivisible { .. } | Error::CountTooLarge(_) => {
            mpi_sys::MPI_ERR_COUNT
        }
        Error::TypeMismatch { .. } => mpi_sys::MPI_ERR_TYPE,
        Error::InvalidOp { .. } => mpi_sys::MPI_ERR_OP,
        Error::Aliasing | Error::InPlace(_) | Error::WrongMemory(_) => mpi_sys::MPI_ERR_BUFFER,
        Error::CommunicatorFreed => mpi_sys::MPI_ERR_COMM,
        Error::InvalidUsage(m) if m.contains("null pointer") => mpi_sys::MPI_ERR_BUFFER,
        Error::InvalidUsage(_) | Error::Config { .. } => mpi_sys::MPI_ERR_ARG,
        Error::MismatchedCall { .. } | Error::ProtocolMismatch { .. } => mpi_sys::MPI_ERR_NOT_SAME,
        _ => mpi_sys::MPI_ERR_OTHER,
    };
    code as c_int
}

/// Log `message` for `call` on stderr.
pub fn log_failure(call: &str, message: &str) {
    use std::io::Write;
    tracing::error!(call, "{message}");
    // One write, so lines of concurrent ranks do not interleave.
    let line = format!("gpucoll_mpi: {call} failed: {message}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Report `code` on `comm` as MPI does (its error handler decides whether
/// the program goes on) and return it.
pub fn raise(comm: MPI_Comm, code: c_int) -> c_int {
    // SAFETY: `comm` is a communicator MPI accepted for this call.
    unsafe { mpi_sys::PMPI_Comm_call_errhandler(comm, code) };
    code
}

/// A gpucoll failure of `call` on `comm`: logged, then raised.
pub fn fail(comm: MPI_Comm, call: &str, e: &Error) -> c_int {
    log_failure(call, &e.to_string());
    raise(comm, code_of(e))
}

/// `f`'s result, or the panic's message when it panicked.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    // Unwind safety: after a panic the shim's shared state is only read
    // through locks that tolerate poisoning, and the call reports failure.
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic without a message".to_string()
        }
    })
}

/// The message of a panic caught in `call`.
pub fn panic_message(call: &str, what: &str) -> String {
    format!("internal error in gpucoll_mpi's {call} (a Rust panic, caught): {what}")
}

/// Run the body `f` of the C export `call` on `comm`: its result, or, when
/// it panicked, `MPI_ERR_INTERN` raised on `comm` (`on_panic` runs first,
/// for what the export must leave behind, like a null request).
pub fn guarded(
    call: &'static str,
    comm: MPI_Comm,
    on_panic: impl FnOnce(),
    f: impl FnOnce() -> c_int,
) -> c_int {
    match catch(f) {
        Ok(code) => code,
        Err(what) => {
            log_failure(call, &panic_message(call, &what));
            // The clean-up and the raise are guarded too: nothing may
            // unwind from here.
            let _ = catch(on_panic);
            catch(|| raise(comm, mpi_sys::MPI_ERR_INTERN as c_int))
                .unwrap_or(mpi_sys::MPI_ERR_INTERN as c_int)
        }
    }
}

/// Defines C exports whose bodies run inside [`guarded`]:
/// `fn NAME(params) on COMM, ON_PANIC => { body }` exports `NAME`
/// returning the body's `c_int`; a panic raises `MPI_ERR_INTERN` on `COMM`
/// after `ON_PANIC` (a closure) ran.
macro_rules! guarded_exports {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($p:ident: $t:ty),* $(,)?) on $comm:expr, $on_panic:expr => $body:block
    )+) => {$(
        $(#[$meta])*
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($p: $t),*) -> std::ffi::c_int {
            $crate::errors::guarded(stringify!($name), $comm, $on_panic, || $body)
        }
    )+};
}
pub(crate) use guarded_exports;

/// `MPI_COMM_WORLD`, whose error handler reports errors of calls without a
/// communicator (the completion calls).
pub fn world() -> MPI_Comm {
    // SAFETY: reading a link-time MPI constant.
    unsafe { mpi_sys::RSMPI_COMM_WORLD }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_are_caught_with_their_message() {
        assert_eq!(catch(|| 7), Ok(7));
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let a = catch(|| -> i32 { panic!("boom {}", 3) });
        let b = catch(|| -> i32 { panic!("static") });
        std::panic::set_hook(hook);
        assert_eq!(a, Err("boom 3".to_string()));
        assert_eq!(b, Err("static".to_string()));
        assert!(panic_message("MPI_Wait", "x").contains("MPI_Wait"));
    }

    #[test]
    fn errors_map_to_classes() {
        assert_eq!(
            code_of(&Error::InvalidRoot { root: 5, size: 2 }),
            mpi_sys::MPI_ERR_ROOT as c_int
        );
        assert_eq!(
            code_of(&Error::CountTooLarge(7)),
            mpi_sys::MPI_ERR_COUNT as c_int
        );
        assert_eq!(
            code_of(&Error::CommunicatorFreed),
            mpi_sys::MPI_ERR_COMM as c_int
        );
        assert_eq!(code_of(&Error::Aborted), mpi_sys::MPI_ERR_OTHER as c_int);
        assert_eq!(
            code_of(&Error::InvalidUsage("x".into())),
            mpi_sys::MPI_ERR_ARG as c_int
        );
        assert_eq!(
            code_of(&Error::InvalidUsage(
                "the send buffer is a null pointer".into()
            )),
            mpi_sys::MPI_ERR_BUFFER as c_int
        );
    }
}
