//! One-sided communication: the entry points that take a user buffer
//! (`MPI_Win_create`, `MPI_Win_attach`, the origin and result buffers of
//! `MPI_Put`, `MPI_Get`, `MPI_Accumulate`, `MPI_Get_accumulate`,
//! `MPI_Fetch_and_op`, `MPI_Compare_and_swap` and the request forms
//! `MPI_Rput`, `MPI_Rget`, `MPI_Raccumulate`, `MPI_Rget_accumulate`), and
//! the MPI-4 `_c` forms that have counts. Device buffers are refused
//! (`refusal.rs`); host buffers go to `PMPI_` unchanged.

use crate::refusal::refused;
use mpi_sys::{
    MPI_Aint, MPI_Comm, MPI_Count, MPI_Datatype, MPI_Info, MPI_Op, MPI_Request, MPI_Win,
};
use std::ffi::{c_int, c_void};

/// `MPI_ERR_BUFFER`, raised on `win`.
fn on_win(win: MPI_Win) -> c_int {
    let code = mpi_sys::MPI_ERR_BUFFER as c_int;
    // SAFETY: MPI validates the handle.
    unsafe { mpi_sys::PMPI_Win_call_errhandler(win, code) };
    code
}

/// `MPI_ERR_BUFFER` for a refused request call: raised on `win`, and the
/// request is `MPI_REQUEST_NULL`.
///
/// # Safety
/// `request` is null or writable.
unsafe fn on_win_request(win: MPI_Win, request: *mut MPI_Request) -> c_int {
    if !request.is_null() {
        // SAFETY: per the contract.
        unsafe { *request = mpi_sys::RSMPI_REQUEST_NULL };
    }
    on_win(win)
}

/// # Safety
/// As `MPI_Win_create`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_create(
    base: *mut c_void,
    size: MPI_Aint,
    disp_unit: c_int,
    info: MPI_Info,
    comm: MPI_Comm,
    win: *mut MPI_Win,
) -> c_int {
    if refused("MPI_Win_create", &[(base, size as i64)]) {
        if !win.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *win = mpi_sys::RSMPI_WIN_NULL };
        }
        return crate::errors::raise(comm, mpi_sys::MPI_ERR_BUFFER as c_int);
    }
    // SAFETY: forwarded unchanged.
    unsafe { mpi_sys::PMPI_Win_create(base, size, disp_unit, info, comm, win) }
}

/// # Safety
/// As `MPI_Win_attach`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_attach(win: MPI_Win, base: *mut c_void, size: MPI_Aint) -> c_int {
    if refused("MPI_Win_attach", &[(base, size as i64)]) {
        return on_win(win);
    }
    // SAFETY: forwarded unchanged.
    unsafe { mpi_sys::PMPI_Win_attach(win, base, size) }
}

/// Exports the transfers `(origin, origin_count, origin_type, target_rank,
/// target_disp, target_count, target_type, [op,] win)` and their request
/// forms; the origin buffer is checked.
macro_rules! transfer {
    ($name:ident => $pmpi:ident, $rname:ident => $rpmpi:ident; $($op:ident)?) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            origin_addr: *const c_void,
            origin_count: c_int,
            origin_datatype: MPI_Datatype,
            target_rank: c_int,
            target_disp: MPI_Aint,
            target_count: c_int,
            target_datatype: MPI_Datatype,
            $($op: MPI_Op,)?
            win: MPI_Win,
        ) -> c_int {
            if refused(stringify!($name), &[(origin_addr, origin_count.into())]) {
                return on_win(win);
            }
            // SAFETY: forwarded unchanged.
            unsafe {
                mpi_sys::$pmpi(
                    origin_addr.cast_mut(), origin_count, origin_datatype, target_rank,
                    target_disp, target_count, target_datatype, $($op,)? win,
                )
            }
        }

        #[doc = concat!("# Safety\nAs `", stringify!($rname), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $rname(
            origin_addr: *const c_void,
            origin_count: c_int,
            origin_datatype: MPI_Datatype,
            target_rank: c_int,
            target_disp: MPI_Aint,
            target_count: c_int,
            target_datatype: MPI_Datatype,
            $($op: MPI_Op,)?
            win: MPI_Win,
            request: *mut MPI_Request,
        ) -> c_int {
            if refused(stringify!($rname), &[(origin_addr, origin_count.into())]) {
                // SAFETY: the program's request.
                return unsafe { on_win_request(win, request) };
            }
            // SAFETY: forwarded unchanged.
            unsafe {
                mpi_sys::$rpmpi(
                    origin_addr.cast_mut(), origin_count, origin_datatype, target_rank,
                    target_disp, target_count, target_datatype, $($op,)? win, request,
                )
            }
        }
    };
}

transfer!(MPI_Put => PMPI_Put, MPI_Rput => PMPI_Rput;);
transfer!(MPI_Get => PMPI_Get, MPI_Rget => PMPI_Rget;);
transfer!(MPI_Accumulate => PMPI_Accumulate, MPI_Raccumulate => PMPI_Raccumulate; op);

/// # Safety
/// As `MPI_Get_accumulate`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Get_accumulate(
    origin_addr: *const c_void,
    origin_count: c_int,
    origin_datatype: MPI_Datatype,
    result_addr: *mut c_void,
    result_count: c_int,
    result_datatype: MPI_Datatype,
    target_rank: c_int,
    target_disp: MPI_Aint,
    target_count: c_int,
    target_datatype: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
) -> c_int {
    let bufs = [
        (origin_addr, origin_count.into()),
        (result_addr.cast_const(), result_count.into()),
    ];
    if refused("MPI_Get_accumulate", &bufs) {
        return on_win(win);
    }
    // SAFETY: forwarded unchanged.
    unsafe {
        mpi_sys::PMPI_Get_accumulate(
            origin_addr,
            origin_count,
            origin_datatype,
            result_addr,
            result_count,
            result_datatype,
            target_rank,
            target_disp,
            target_count,
            target_datatype,
            op,
            win,
        )
    }
}

/// # Safety
/// As `MPI_Rget_accumulate`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Rget_accumulate(
    origin_addr: *const c_void,
    origin_count: c_int,
    origin_datatype: MPI_Datatype,
    result_addr: *mut c_void,
    result_count: c_int,
    result_datatype: MPI_Datatype,
    target_rank: c_int,
    target_disp: MPI_Aint,
    target_count: c_int,
    target_datatype: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
    request: *mut MPI_Request,
) -> c_int {
    let bufs = [
        (origin_addr, origin_count.into()),
        (result_addr.cast_const(), result_count.into()),
    ];
    if refused("MPI_Rget_accumulate", &bufs) {
        // SAFETY: the program's request.
        return unsafe { on_win_request(win, request) };
    }
    // SAFETY: forwarded unchanged.
    unsafe {
        mpi_sys::PMPI_Rget_accumulate(
            origin_addr,
            origin_count,
            origin_datatype,
            result_addr,
            result_count,
            result_datatype,
            target_rank,
            target_disp,
            target_count,
            target_datatype,
            op,
            win,
            request,
        )
    }
}

/// # Safety
/// As `MPI_Fetch_and_op`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Fetch_and_op(
    origin_addr: *const c_void,
    result_addr: *mut c_void,
    datatype: MPI_Datatype,
    target_rank: c_int,
    target_disp: MPI_Aint,
    op: MPI_Op,
    win: MPI_Win,
) -> c_int {
    if refused(
        "MPI_Fetch_and_op",
        &[(origin_addr, 1), (result_addr.cast_const(), 1)],
    ) {
        return on_win(win);
    }
    // SAFETY: forwarded unchanged.
    unsafe {
        mpi_sys::PMPI_Fetch_and_op(
            origin_addr,
            result_addr,
            datatype,
            target_rank,
            target_disp,
            op,
            win,
        )
    }
}

/// # Safety
/// As `MPI_Compare_and_swap`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Compare_and_swap(
    origin_addr: *const c_void,
    compare_addr: *const c_void,
    result_addr: *mut c_void,
    datatype: MPI_Datatype,
    target_rank: c_int,
    target_disp: MPI_Aint,
    win: MPI_Win,
) -> c_int {
    let bufs = [
        (origin_addr, 1),
        (compare_addr, 1),
        (result_addr.cast_const(), 1),
    ];
    if refused("MPI_Compare_and_swap", &bufs) {
        return on_win(win);
    }
    // SAFETY: forwarded unchanged.
    unsafe {
        mpi_sys::PMPI_Compare_and_swap(
            origin_addr,
            compare_addr,
            result_addr,
            datatype,
            target_rank,
            target_disp,
            win,
        )
    }
}

/// A large count as a C one, or `MPI_ERR_COUNT` raised on `win`.
fn narrow(value: MPI_Count, win: MPI_Win) -> Result<c_int, c_int> {
    c_int::try_from(value).map_err(|_| {
        tracing::warn!(target: "gpucoll_mpi::large_count", "a count does not fit a C int");
        let code = mpi_sys::MPI_ERR_COUNT as c_int;
        // SAFETY: MPI validates the handle.
        unsafe { mpi_sys::PMPI_Win_call_errhandler(win, code) };
        code
    })
}

/// # Safety
/// As `MPI_Win_create_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_create_c(
    base: *mut c_void,
    size: MPI_Aint,
    disp_unit: MPI_Aint,
    info: MPI_Info,
    comm: MPI_Comm,
    win: *mut MPI_Win,
) -> c_int {
    let Ok(disp_unit) = c_int::try_from(disp_unit) else {
        tracing::warn!(target: "gpucoll_mpi::large_count", "a displacement unit does not fit a C int");
        return crate::errors::raise(comm, mpi_sys::MPI_ERR_ARG as c_int);
    };
    // SAFETY: the program's arguments, the unit narrowed losslessly.
    unsafe { MPI_Win_create(base, size, disp_unit, info, comm, win) }
}

/// Exports the large-count transfers, calling the C forms above.
macro_rules! transfer_c {
    ($name:ident => $c:ident, $rname:ident => $rc:ident; $($op:ident)?) => {
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            origin_addr: *const c_void,
            origin_count: MPI_Count,
            origin_datatype: MPI_Datatype,
            target_rank: c_int,
            target_disp: MPI_Aint,
            target_count: MPI_Count,
            target_datatype: MPI_Datatype,
            $($op: MPI_Op,)?
            win: MPI_Win,
        ) -> c_int {
            let (oc, tc) = match (narrow(origin_count, win), narrow(target_count, win)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(code), _) | (_, Err(code)) => return code,
            };
            // SAFETY: the program's arguments, the counts narrowed losslessly.
            unsafe {
                $c(
                    origin_addr, oc, origin_datatype, target_rank, target_disp, tc,
                    target_datatype, $($op,)? win,
                )
            }
        }

        #[doc = concat!("# Safety\nAs `", stringify!($rname), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $rname(
            origin_addr: *const c_void,
            origin_count: MPI_Count,
            origin_datatype: MPI_Datatype,
            target_rank: c_int,
            target_disp: MPI_Aint,
            target_count: MPI_Count,
            target_datatype: MPI_Datatype,
            $($op: MPI_Op,)?
            win: MPI_Win,
            request: *mut MPI_Request,
        ) -> c_int {
            let (oc, tc) = match (narrow(origin_count, win), narrow(target_count, win)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(code), _) | (_, Err(code)) => return code,
            };
            // SAFETY: the program's arguments, the counts narrowed losslessly.
            unsafe {
                $rc(
                    origin_addr, oc, origin_datatype, target_rank, target_disp, tc,
                    target_datatype, $($op,)? win, request,
                )
            }
        }
    };
}

transfer_c!(MPI_Put_c => MPI_Put, MPI_Rput_c => MPI_Rput;);
transfer_c!(MPI_Get_c => MPI_Get, MPI_Rget_c => MPI_Rget;);
transfer_c!(MPI_Accumulate_c => MPI_Accumulate, MPI_Raccumulate_c => MPI_Raccumulate; op);

/// The three counts of a large-count get-accumulate, narrowed.
fn narrow3(a: MPI_Count, b: MPI_Count, c: MPI_Count, win: MPI_Win) -> Result<[c_int; 3], c_int> {
    Ok([narrow(a, win)?, narrow(b, win)?, narrow(c, win)?])
}

/// # Safety
/// As `MPI_Get_accumulate_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Get_accumulate_c(
    origin_addr: *const c_void,
    origin_count: MPI_Count,
    origin_datatype: MPI_Datatype,
    result_addr: *mut c_void,
    result_count: MPI_Count,
    result_datatype: MPI_Datatype,
    target_rank: c_int,
    target_disp: MPI_Aint,
    target_count: MPI_Count,
    target_datatype: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
) -> c_int {
    let [oc, rc, tc] = match narrow3(origin_count, result_count, target_count, win) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // SAFETY: the program's arguments, the counts narrowed losslessly.
    unsafe {
        MPI_Get_accumulate(
            origin_addr,
            oc,
            origin_datatype,
            result_addr,
            rc,
            result_datatype,
            target_rank,
            target_disp,
            tc,
            target_datatype,
            op,
            win,
        )
    }
}

/// # Safety
/// As `MPI_Rget_accumulate_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Rget_accumulate_c(
    origin_addr: *const c_void,
    origin_count: MPI_Count,
    origin_datatype: MPI_Datatype,
    result_addr: *mut c_void,
    result_count: MPI_Count,
    result_datatype: MPI_Datatype,
    target_rank: c_int,
    target_disp: MPI_Aint,
    target_count: MPI_Count,
    target_datatype: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
    request: *mut MPI_Request,
) -> c_int {
    let [oc, rc, tc] = match narrow3(origin_count, result_count, target_count, win) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // SAFETY: the program's arguments, the counts narrowed losslessly.
    unsafe {
        MPI_Rget_accumulate(
            origin_addr,
            oc,
            origin_datatype,
            result_addr,
            rc,
            result_datatype,
            target_rank,
            target_disp,
            tc,
            target_datatype,
            op,
            win,
            request,
        )
    }
}
