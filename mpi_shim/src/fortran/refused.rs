//! One-sided communication and MPI-IO from Fortran: the entry points that
//! take a user buffer (see `crate::onesided` and `crate::fileio`), each
//! converting its handles and calling the shim's C export, which refuses
//! device memory and passes host memory on.

use std::ffi::c_void;

use mpi_sys as ffi;

use super::handles::Fint;

fortran_call! {
    win_create => MPI_Win_create as "MPI_WIN_CREATE", "mpi_win_create";
    (base: buffer, size: aint, disp_unit: int, info: info, communicator: comm, win: win_out)
}

fortran_call! {
    win_attach => MPI_Win_attach as "MPI_WIN_ATTACH", "mpi_win_attach";
    (win: win, base: buffer, size: aint)
}

/// The transfers `(origin, count, type, target_rank, target_disp,
/// target_count, target_type, [op,] win[, request])`.
macro_rules! transfer {
    ($name:ident => $c:ident as $u:literal, $l:literal; $($op:ident)? ; $($req:ident)?) => {
        fortran_call! {
            $name => $c as $u, $l;
            (
                origin_addr: buffer, origin_count: int, origin_datatype: datatype,
                target_rank: int, target_disp: aint, target_count: int,
                target_datatype: datatype, $($op: op,)? win: win, $($req: request)?
            )
        }
    };
}

transfer!(put => MPI_Put as "MPI_PUT", "mpi_put"; ;);
transfer!(get => MPI_Get as "MPI_GET", "mpi_get"; ;);
transfer!(accumulate => MPI_Accumulate as "MPI_ACCUMULATE", "mpi_accumulate"; reduce_op;);
transfer!(rput => MPI_Rput as "MPI_RPUT", "mpi_rput"; ; request);
transfer!(rget => MPI_Rget as "MPI_RGET", "mpi_rget"; ; request);
transfer!(raccumulate => MPI_Raccumulate as "MPI_RACCUMULATE", "mpi_raccumulate";
    reduce_op; request);

fortran_call! {
    get_accumulate => MPI_Get_accumulate as "MPI_GET_ACCUMULATE", "mpi_get_accumulate";
    (
        origin_addr: buffer, origin_count: int, origin_datatype: datatype,
        result_addr: buffer, result_count: int, result_datatype: datatype,
        target_rank: int, target_disp: aint, target_count: int, target_datatype: datatype,
        reduce_op: op, win: win,
    )
}

fortran_call! {
    rget_accumulate => MPI_Rget_accumulate as "MPI_RGET_ACCUMULATE", "mpi_rget_accumulate";
    (
        origin_addr: buffer, origin_count: int, origin_datatype: datatype,
        result_addr: buffer, result_count: int, result_datatype: datatype,
        target_rank: int, target_disp: aint, target_count: int, target_datatype: datatype,
        reduce_op: op, win: win, request: request,
    )
}

fortran_call! {
    fetch_and_op => MPI_Fetch_and_op as "MPI_FETCH_AND_OP", "mpi_fetch_and_op";
    (
        origin_addr: buffer, result_addr: buffer, dtype: datatype, target_rank: int,
        target_disp: aint, reduce_op: op, win: win,
    )
}

fortran_call! {
    compare_and_swap => MPI_Compare_and_swap as "MPI_COMPARE_AND_SWAP", "mpi_compare_and_swap";
    (
        origin_addr: buffer, compare_addr: buffer, result_addr: buffer, dtype: datatype,
        target_rank: int, target_disp: aint, win: win,
    )
}

/// A data access call `(fh, [offset,] buf, count, datatype[, tail])`.
macro_rules! access {
    ($name:ident => $c:ident as $u:literal, $l:literal; $($off:ident)? ; $($tail:ident)?) => {
        fortran_call! {
            $name => $c as $u, $l;
            (
                fh: file, $($off: offset,)? buf: buffer, count: int, dtype: datatype,
                $($tail: $tail)?
            )
        }
    };
}

access!(file_read_at => MPI_File_read_at as "MPI_FILE_READ_AT", "mpi_file_read_at";
    offset; status);
access!(file_read_at_all => MPI_File_read_at_all
    as "MPI_FILE_READ_AT_ALL", "mpi_file_read_at_all"; offset; status);
access!(file_write_at => MPI_File_write_at as "MPI_FILE_WRITE_AT", "mpi_file_write_at";
    offset; status);
access!(file_write_at_all => MPI_File_write_at_all
    as "MPI_FILE_WRITE_AT_ALL", "mpi_file_write_at_all"; offset; status);
access!(file_iread_at => MPI_File_iread_at as "MPI_FILE_IREAD_AT", "mpi_file_iread_at";
    offset; request);
access!(file_iread_at_all => MPI_File_iread_at_all
    as "MPI_FILE_IREAD_AT_ALL", "mpi_file_iread_at_all"; offset; request);
access!(file_iwrite_at => MPI_File_iwrite_at as "MPI_FILE_IWRITE_AT", "mpi_file_iwrite_at";
    offset; request);
access!(file_iwrite_at_all => MPI_File_iwrite_at_all
    as "MPI_FILE_IWRITE_AT_ALL", "mpi_file_iwrite_at_all"; offset; request);
access!(file_read => MPI_File_read as "MPI_FILE_READ", "mpi_file_read"; ; status);
access!(file_read_all => MPI_File_read_all as "MPI_FILE_READ_ALL", "mpi_file_read_all";
    ; status);
access!(file_write => MPI_File_write as "MPI_FILE_WRITE", "mpi_file_write"; ; status);
access!(file_write_all => MPI_File_write_all as "MPI_FILE_WRITE_ALL", "mpi_file_write_all";
    ; status);
access!(file_iread => MPI_File_iread as "MPI_FILE_IREAD", "mpi_file_iread"; ; request);
access!(file_iread_all => MPI_File_iread_all as "MPI_FILE_IREAD_ALL", "mpi_file_iread_all";
    ; request);
access!(file_iwrite => MPI_File_iwrite as "MPI_FILE_IWRITE", "mpi_file_iwrite"; ; request);
access!(file_iwrite_all => MPI_File_iwrite_all
    as "MPI_FILE_IWRITE_ALL", "mpi_file_iwrite_all"; ; request);
access!(file_read_shared => MPI_File_read_shared
    as "MPI_FILE_READ_SHARED", "mpi_file_read_shared"; ; status);
access!(file_write_shared => MPI_File_write_shared
    as "MPI_FILE_WRITE_SHARED", "mpi_file_write_shared"; ; status);
access!(file_iread_shared => MPI_File_iread_shared
    as "MPI_FILE_IREAD_SHARED", "mpi_file_iread_shared"; ; request);
access!(file_iwrite_shared => MPI_File_iwrite_shared
    as "MPI_FILE_IWRITE_SHARED", "mpi_file_iwrite_shared"; ; request);
access!(file_read_ordered => MPI_File_read_ordered
    as "MPI_FILE_READ_ORDERED", "mpi_file_read_ordered"; ; status);
access!(file_write_ordered => MPI_File_write_ordered
    as "MPI_FILE_WRITE_ORDERED", "mpi_file_write_ordered"; ; status);
access!(file_read_at_all_begin => MPI_File_read_at_all_begin
    as "MPI_FILE_READ_AT_ALL_BEGIN", "mpi_file_read_at_all_begin"; offset;);
access!(file_write_at_all_begin => MPI_File_write_at_all_begin
    as "MPI_FILE_WRITE_AT_ALL_BEGIN", "mpi_file_write_at_all_begin"; offset;);
access!(file_read_all_begin => MPI_File_read_all_begin
    as "MPI_FILE_READ_ALL_BEGIN", "mpi_file_read_all_begin"; ;);
access!(file_write_all_begin => MPI_File_write_all_begin
    as "MPI_FILE_WRITE_ALL_BEGIN", "mpi_file_write_all_begin"; ;);
access!(file_read_ordered_begin => MPI_File_read_ordered_begin
    as "MPI_FILE_READ_ORDERED_BEGIN", "mpi_file_read_ordered_begin"; ;);
access!(file_write_ordered_begin => MPI_File_write_ordered_begin
    as "MPI_FILE_WRITE_ORDERED_BEGIN", "mpi_file_write_ordered_begin"; ;);

/// The `_end` call of a split collective: `(fh, buf, status)`.
macro_rules! split_end {
    ($name:ident => $c:ident as $u:literal, $l:literal) => {
        fortran_call! {
            $name => $c as $u, $l;
            (fh: file, buf: buffer, status: status)
        }
    };
}

split_end!(file_read_at_all_end => MPI_File_read_at_all_end
    as "MPI_FILE_READ_AT_ALL_END", "mpi_file_read_at_all_end");
split_end!(file_write_at_all_end => MPI_File_write_at_all_end
    as "MPI_FILE_WRITE_AT_ALL_END", "mpi_file_write_at_all_end");
split_end!(file_read_all_end => MPI_File_read_all_end
    as "MPI_FILE_READ_ALL_END", "mpi_file_read_all_end");
split_end!(file_write_all_end => MPI_File_write_all_end
    as "MPI_FILE_WRITE_ALL_END", "mpi_file_write_all_end");
split_end!(file_read_ordered_end => MPI_File_read_ordered_end
    as "MPI_FILE_READ_ORDERED_END", "mpi_file_read_ordered_end");
split_end!(file_write_ordered_end => MPI_File_write_ordered_end
    as "MPI_FILE_WRITE_ORDERED_END", "mpi_file_write_ordered_end");
