//! `MPI_Scan`, `MPI_Exscan`, `MPI_Iscan`, `MPI_Iexscan`. gpucoll's engine
//! has both scans (`Communicator::scan_raw`, `exclusive_scan_raw`), but
//! their device path has not yet run on a GPU, so the shim still stages
//! device buffers; `engine_plan` is the one place that hands them to the
//! engine once it has.

use super::engine::{engine_or_staged, no_request};
use crate::misuse;
use crate::plans::Plan;
use crate::settings;
use crate::stage::{self, Scope};
use crate::staging;
use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use std::ffi::{c_int, c_void};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Inclusive: rank i gets the reduction over ranks 0..=i.
    Scan,
    /// Exclusive: ranks 0..i; rank 0's receive buffer is left alone.
    Exscan,
}

/// gpucoll's plan for a scan (`None`: every call is staged). To hand them
/// to the engine, this returns `Some(plans::scan(..))` (a `Facts` with
/// the op, and `Coll::Scan`/`Coll::Exscan` in `native.rs`); nothing else
/// here changes.
fn engine_plan(_kind: Kind) -> Option<Plan<2>> {
    None
}

#[allow(clippy::too_many_arguments)]
unsafe fn scan(
    kind: Kind,
    call: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: Option<*mut MPI_Request>,
) -> c_int {
    let pmpi = |[s, r]: &[*mut c_void; 2], req: *mut MPI_Request| {
        // SAFETY: the program's arguments, the buffers possibly replaced by
        // host copies of the same spans.
        unsafe {
            match (kind, request.is_some()) {
                (Kind::Scan, false) => mpi_sys::PMPI_Scan(*s, *r, count, dt, op, comm),
                (Kind::Exscan, false) => mpi_sys::PMPI_Exscan(*s, *r, count, dt, op, comm),
                (Kind::Scan, true) => mpi_sys::PMPI_Iscan(*s, *r, count, dt, op, comm, req),
                (Kind::Exscan, true) => mpi_sys::PMPI_Iexscan(*s, *r, count, dt, op, comm, req),
            }
        }
    };
    let args = [send.cast_mut(), recv];
    if !settings::active() {
        return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
    }
    let recv_only = [recv.cast_const()];
    match kind {
        Kind::Scan if misuse::misplaced(call, &recv_only) => {
            return pmpi(&args, request.unwrap_or(std::ptr::null_mut()));
        }
        Kind::Exscan => {
            if let Some(code) = misuse::refused(call, Some(comm), &recv_only) {
                return no_request(request, code);
            }
        }
        _ => {}
    }
    let in_place = crate::handles::is_in_place(send);
    let staged = || {
        let prepare = |c: &mut stage::Copies, [s, r]: [*mut c_void; 2]| {
            let span = staging::span(count.into(), dt)?;
            // Exscan leaves rank 0's receive buffer alone: copied in, so it
            // comes back as it was.
            let rank0 = kind == Kind::Exscan && rank(comm) == Some(0);
            Ok([
                c.span(s, span, true, false)?,
                c.span(r, span, in_place || rank0, true)?,
            ])
        };
        // SAFETY: the program's arguments (MPI's contract).
        unsafe {
            stage::call(
                call,
                Scope::Collective(comm),
                &[send, recv.cast_const()],
                request,
                args,
                prepare,
                pmpi,
            )
        }
    };
    // SAFETY: as above.
    unsafe { engine_or_staged(call, comm, request, engine_plan(kind), staged) }
}

fn rank(comm: MPI_Comm) -> Option<c_int> {
    let mut r: c_int = -1;
    // SAFETY: a valid out-pointer; MPI validates the handle.
    (unsafe { mpi_sys::PMPI_Comm_rank(comm, &mut r) } == 0).then_some(r)
}

/// Exports a scan: blocking, or nonblocking with `request` last.
macro_rules! scan_export {
    ($name:ident, $kind:expr) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            sendbuf: *const c_void,
            recvbuf: *mut c_void,
            count: c_int,
            datatype: MPI_Datatype,
            op: MPI_Op,
            comm: MPI_Comm,
        ) -> c_int {
            // SAFETY: the program's arguments (MPI's contract).
            unsafe {
                scan(
                    $kind,
                    stringify!($name),
                    sendbuf,
                    recvbuf,
                    count,
                    datatype,
                    op,
                    comm,
                    None,
                )
            }
        }
    };
    ($name:ident, $kind:expr, request) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            sendbuf: *const c_void,
            recvbuf: *mut c_void,
            count: c_int,
            datatype: MPI_Datatype,
            op: MPI_Op,
            comm: MPI_Comm,
            request: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: the program's arguments (MPI's contract).
            unsafe {
                scan(
                    $kind,
                    stringify!($name),
                    sendbuf,
                    recvbuf,
                    count,
                    datatype,
                    op,
                    comm,
                    Some(request),
                )
            }
        }
    };
}

scan_export!(MPI_Scan, Kind::Scan);
scan_export!(MPI_Exscan, Kind::Exscan);
scan_export!(MPI_Iscan, Kind::Scan, request);
scan_export!(MPI_Iexscan, Kind::Exscan, request);
