//! gpucoll errors as MPI error codes, reported the way MPI reports errors:
//! through the communicator's error handler, with gpucoll's message on
//! stderr (and in the `tracing` log).

use gpucoll::Error;
use mpi_sys::MPI_Comm;
use std::ffi::c_int;

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

#[cfg(test)]
mod tests {
    use super::*;

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
