//! Fortran entry points (mpif.h, `use mpi`, `use mpi_f08`) for every MPI function the
//! shim intercepts: the collectives, point-to-point (`p2p`), the completion calls and
//! the lifecycle.
//!
//! Open MPI's own Fortran wrappers (`ompi_allreduce_f` in libmpi_mpifh, which
//! `mpi_allreduce_f08_` in libmpi_usempif08 calls too) convert the handles and then call
//! `PMPI_Allreduce`, so a shim exporting only C symbols never sees a Fortran program.
//! This module exports the same Fortran symbols: preloaded or linked ahead of Open
//! MPI's libraries, the shim's definitions win the dynamic linker's lookup. Each one
//! converts its arguments (see `handles`) and calls the C `MPI_*` function through
//! mpi-sys's declaration, which inside this library binds to the shim's own C export,
//! so Fortran calls are routed exactly as C calls are.
//!
//! One implementation serves both bindings: `mpi_allreduce_f08_` takes the same
//! arguments as `mpi_allreduce_` (a `TYPE(MPI_Comm)` is one integer passed by
//! reference, buffers are plain addresses, a `TYPE(MPI_Status)` has the layout of the
//! integer status array), except that its `ierror` may be absent, i.e. null, which the
//! shared implementation accepts.

/// Defines one Fortran binding and exports it under every name Open MPI 4.1 gives it:
/// libmpi_mpifh's weak aliases `MPI_X`, `mpi_x`, `mpi_x_`, `mpi_x__`, `MPI_X_f`,
/// `MPI_X_f08`, and libmpi_usempif08's module procedure `mpi_x_f08_`.
macro_rules! fortran_binding {
    (
        $(#[doc = $doc:literal])*
        fn $name:ident $params:tt as $upper:literal, $lower:literal, $mixed:literal
        $body:block
    ) => {
        $(#[doc = $doc])*
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name $params $body

        export_symbols!($name $params as $upper, $lower, $mixed);
    };
}

/// Exports `$name` under the seven names of one Fortran binding (see
/// `fortran_binding!`); `$mixed` is the C name (`MPI_Allreduce`).
macro_rules! export_symbols {
    ($name:ident $params:tt as $upper:expr, $lower:expr, $mixed:expr) => {
        export_symbol!($upper, $name, $params);
        export_symbol!($lower, $name, $params);
        export_symbol!(concat!($lower, "_"), $name, $params);
        export_symbol!(concat!($lower, "__"), $name, $params);
        export_symbol!(concat!($mixed, "_f"), $name, $params);
        export_symbol!(concat!($mixed, "_f08"), $name, $params);
        export_symbol!(concat!($lower, "_f08_"), $name, $params);
    };
}

macro_rules! export_symbol {
    ($symbol:expr, $name:ident, ( $($arg:ident : $ty:ty),* $(,)? )) => {
        const _: () = {
            #[export_name = $symbol]
            #[allow(clippy::too_many_arguments)]
            unsafe extern "C" fn entry($($arg: $ty),*) {
                tracing::debug!(target: "gpucoll_mpi::fortran", "Fortran {}", $symbol);
                // A panic never unwinds into Fortran: it becomes MPI_ERR_INTERN
                // in IERROR (the binding's last argument, unless a hidden CHARACTER
                // length follows it) and through
                // MPI_COMM_WORLD's error handler.
                let code = $crate::errors::guarded(
                    $symbol,
                    $crate::errors::world(),
                    || (),
                    || {
                        // SAFETY: a Fortran caller passes the arguments this binding
                        // declares, each by reference to storage valid for the call.
                        unsafe { $name($($arg),*) };
                        0
                    },
                );
                if code != 0 {
                    // SAFETY: IERROR is null or a writable INTEGER.
                    unsafe {
                        $crate::fortran::handles::LastArg::store_error(last_arg!($($arg),*), code)
                    };
                }
            }
        };
    };
}

/// The last of a binding's arguments (its `IERROR`).
macro_rules! last_arg {
    ($a:ident) => {
        $a
    };
    ($a:ident, $($rest:ident),+) => {
        last_arg!($($rest),+)
    };
}

#[macro_use]
mod calls;
mod collectives;
mod completion;
pub(crate) mod handles;
mod lifecycle;
mod p2p;
mod refused;
mod staged;
