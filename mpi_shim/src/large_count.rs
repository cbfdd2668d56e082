//! The MPI-4 large-count forms (`MPI_Allreduce_c` ...) of the collectives the shim
//! intercepts (`MPI_Pack_c` and the one-sided and MPI-IO `_c` forms are beside their
//! C forms, in `pack.rs`, `onesided.rs` and `fileio.rs`).
//!
//! Open MPI 4.1 has no `PMPI_*_c`, yet recent mpi4py calls `MPI_Allreduce_c` whenever
//! the symbol resolves (its wheels weak-call it), so the shim provides them: counts and
//! displacements that fit a C `int` go to the shim's C form (so routing is the same as
//! for `MPI_Allreduce`); a count that does not is `MPI_ERR_COUNT` and a displacement
//! that does not is `MPI_ERR_ARG`, raised through the communicator's error handler as
//! MPI does for any argument error.
//!
//! The nonblocking v-forms pass converted count arrays that live only for the call:
//! Open MPI 4.1 copies them into its schedule before `MPI_I*v` returns (libnbc builds
//! the whole schedule at the call), which the standard does not promise in general.

use std::ffi::{c_int, c_void};
use std::slice;

use mpi_sys as ffi;
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Count};

use crate::handles::is_in_place;

/// Raises `code` on `comm` (its error handler decides: abort, or return) and returns it.
fn raise(comm: MPI_Comm, code: u32, what: &str) -> c_int {
    let code = code as c_int;
    tracing::warn!(target: "gpucoll_mpi::large_count", "{what}");
    // SAFETY: calling a communicator's error handler has no precondition beyond a
    // communicator handle, which MPI validates itself.
    unsafe { ffi::PMPI_Comm_call_errhandler(comm, code) };
    code
}

/// A count as a C `int`, or `MPI_ERR_COUNT` raised on `comm`.
pub(crate) fn narrow(value: MPI_Count, comm: MPI_Comm) -> Result<c_int, c_int> {
    c_int::try_from(value)
        .map_err(|_| raise(comm, ffi::MPI_ERR_COUNT, "a count does not fit a C int"))
}

/// How many entries a count/displacement array of a v-collective has.
#[derive(Clone, Copy)]
enum Group {
    /// The local group (reduce_scatter's `recvcounts`).
    Local,
    /// The group the data comes from or goes to: the remote group of an
    /// intercommunicator, the communicator itself otherwise.
    Peers,
}

fn group_size(comm: MPI_Comm, group: Group) -> Result<usize, c_int> {
    let mut inter = 0;
    let mut size = 0;
    // SAFETY: both calls only write the out-parameters; MPI validates the handle and
    // returns an error code for a bad one.
    let code = unsafe {
        match ffi::PMPI_Comm_test_inter(comm, &mut inter) {
            code if code != ffi::MPI_SUCCESS as c_int => code,
            _ if inter != 0 && matches!(group, Group::Peers) => {
                ffi::PMPI_Comm_remote_size(comm, &mut size)
            }
            _ => ffi::PMPI_Comm_size(comm, &mut size),
        }
    };
    if code != ffi::MPI_SUCCESS as c_int {
        return Err(code);
    }
    Ok(usize::try_from(size).unwrap_or(0))
}

/// A C `int` copy of a `MPI_Count` array (counts) and of a `MPI_Aint` array
/// (displacements, when given) of `len` entries.
struct IntArrays {
    counts: Vec<c_int>,
    displs: Vec<c_int>,
}

impl IntArrays {
    /// # Safety
    /// `counts` (and `displs`, unless null) point to `len` readable entries, or are null.
    unsafe fn convert(
        counts: *const MPI_Count,
        displs: *const MPI_Aint,
        len: usize,
        comm: MPI_Comm,
    ) -> Result<Self, c_int> {
        if len > 0 && counts.is_null() {
            return Err(raise(comm, ffi::MPI_ERR_ARG, "null count array"));
        }
        let counts: &[MPI_Count] = if len == 0 {
            &[]
        } else {
            // SAFETY: non-null and `len` entries, per the function's contract.
            unsafe { slice::from_raw_parts(counts, len) }
        };
        let counts = counts
            .iter()
            .map(|&c| narrow(c, comm))
            .collect::<Result<Vec<_>, _>>()?;
        let displs = if displs.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: non-null and `len` entries, per the function's contract.
            unsafe { slice::from_raw_parts(displs, len) }
                .iter()
                .map(|&d| {
                    c_int::try_from(d).map_err(|_| {
                        raise(
                            comm,
                            ffi::MPI_ERR_ARG,
                            "a displacement does not fit a C int",
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(IntArrays { counts, displs })
    }

    /// Arrays that are not significant at this rank: MPI does not read them.
    fn unused() -> Self {
        IntArrays {
            counts: Vec::new(),
            displs: Vec::new(),
        }
    }

    /// The counts for C; null where they are not significant (MPI does not read them).
    fn counts(&self) -> *const c_int {
        non_empty(&self.counts)
    }

    fn displs(&self) -> *const c_int {
        non_empty(&self.displs)
    }
}

fn non_empty(values: &[c_int]) -> *const c_int {
    if values.is_empty() {
        std::ptr::null()
    } else {
        values.as_ptr()
    }
}

/// What a process does in a rooted collective.
#[derive(Clone, Copy)]
struct Role {
    /// It is the root (`root == rank`, or `MPI_ROOT` on an intercommunicator).
    root: bool,
    /// It contributes or receives a block of its own (every rank of an
    /// intracommunicator; the non-root group of an intercommunicator).
    member: bool,
}

impl Role {
    /// Whether MPI reads this process's own block in `buffer`: not where it
    /// takes no part, nor at a root whose block is in place.
    fn has_block(&self, buffer: *const c_void) -> bool {
        self.member && !(self.root && is_in_place(buffer))
    }
}

fn role(root: c_int, comm: MPI_Comm) -> Result<Role, c_int> {
    let mut inter = 0;
    let mut rank = -1;
    // SAFETY: both calls only write their out-parameter; MPI validates the handle.
    let code = unsafe {
        match ffi::PMPI_Comm_test_inter(comm, &mut inter) {
            code if code != ffi::MPI_SUCCESS as c_int => code,
            _ => ffi::PMPI_Comm_rank(comm, &mut rank),
        }
    };
    if code != ffi::MPI_SUCCESS as c_int {
        return Err(code);
    }
    Ok(if inter != 0 {
        Role {
            root: root == ffi::MPI_ROOT,
            member: root != ffi::MPI_ROOT && root != ffi::MPI_PROC_NULL,
        }
    } else {
        Role {
            root: rank == root,
            member: true,
        }
    })
}

/// A count MPI only reads when `significant`: out of range there is an error,
/// elsewhere it is ignored (0), since a caller may leave it unset.
fn count_if(value: MPI_Count, significant: bool, comm: MPI_Comm) -> Result<c_int, c_int> {
    if significant {
        narrow(value, comm)
    } else {
        Ok(c_int::try_from(value).unwrap_or(0))
    }
}

/// `(sendcount, recvcount)` of allgather and alltoall (the send count is ignored in place).
fn all_counts(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    recvcount: MPI_Count,
    comm: MPI_Comm,
) -> Result<(c_int, c_int), c_int> {
    Ok((
        count_if(sendcount, !is_in_place(sendbuf), comm)?,
        narrow(recvcount, comm)?,
    ))
}

/// The counts of a rooted collective: `(own, at_root)`, where `own` counts
/// this rank's block in `own_buf` (gather's send side, scatter's receive side;
/// not read at a root in place) and `at_root` the root's blocks.
fn rooted_counts(
    own_buf: *const c_void,
    own: MPI_Count,
    at_root: MPI_Count,
    root: c_int,
    comm: MPI_Comm,
) -> Result<(c_int, c_int), c_int> {
    let role = role(root, comm)?;
    Ok((
        count_if(own, role.has_block(own_buf), comm)?,
        count_if(at_root, role.root, comm)?,
    ))
}

/// The arguments of a rooted v-collective: `(own, root's arrays)`, `own` as
/// for [`rooted_counts`], the count and displacement arrays converted at the
/// root only.
///
/// # Safety
/// At the root, `counts` and `displs` have one entry per peer.
unsafe fn rooted_v_args(
    own_buf: *const c_void,
    own: MPI_Count,
    counts: *const MPI_Count,
    displs: *const MPI_Aint,
    root: c_int,
    comm: MPI_Comm,
) -> Result<(c_int, IntArrays), c_int> {
    let role = role(root, comm)?;
    let own = count_if(own, role.has_block(own_buf), comm)?;
    let arrays = if role.root {
        let peers = group_size(comm, Group::Peers)?;
        // SAFETY: the root's arrays have one entry per peer, per the contract.
        unsafe { IntArrays::convert(counts, displs, peers, comm)? }
    } else {
        IntArrays::unused()
    };
    Ok((own, arrays))
}

/// Allgatherv's send count and receive counts and displacements.
///
/// # Safety
/// `recvcounts` and `displs` have one entry per peer.
unsafe fn allgatherv_args(
    sendbuf: *const c_void,
    sendcount: MPI_Count,
    recvcounts: *const MPI_Count,
    displs: *const MPI_Aint,
    comm: MPI_Comm,
) -> Result<(c_int, IntArrays), c_int> {
    let sendcount = count_if(sendcount, !is_in_place(sendbuf), comm)?;
    let peers = group_size(comm, Group::Peers)?;
    // SAFETY: one entry per peer, per the contract.
    let arrays = unsafe { IntArrays::convert(recvcounts, displs, peers, comm)? };
    Ok((sendcount, arrays))
}

/// Alltoallv's send and receive arrays (the send ones are ignored in place).
///
/// # Safety
/// Every array has one entry per peer (the send ones unless `sendbuf` is in place).
unsafe fn alltoallv_args(
    sendbuf: *const c_void,
    sendcounts: *const MPI_Count,
    sdispls: *const MPI_Aint,
    recvcounts: *const MPI_Count,
    rdispls: *const MPI_Aint,
    comm: MPI_Comm,
) -> Result<(IntArrays, IntArrays), c_int> {
    let peers = group_size(comm, Group::Peers)?;
    let send = if is_in_place(sendbuf) {
        IntArrays::unused()
    } else {
        // SAFETY: one entry per peer, per the contract.
        unsafe { IntArrays::convert(sendcounts, sdispls, peers, comm)? }
    };
    // SAFETY: one entry per peer, per the contract.
    let recv = unsafe { IntArrays::convert(recvcounts, rdispls, peers, comm)? };
    Ok((send, recv))
}

/// Reduce_scatter's receive counts, one per rank of the local group.
///
/// # Safety
/// `recvcounts` has one entry per rank of the local group.
unsafe fn reduce_scatter_counts(
    recvcounts: *const MPI_Count,
    comm: MPI_Comm,
) -> Result<IntArrays, c_int> {
    let ranks = group_size(comm, Group::Local)?;
    // SAFETY: one entry per local rank, per the contract.
    unsafe { IntArrays::convert(recvcounts, std::ptr::null(), ranks, comm) }
}

/// The destinations and sources of `comm`'s topology: the lengths of a
/// neighbourhood collective's send and receive arrays (none without a topology,
/// which the C form then reports).
fn neighbors(comm: MPI_Comm) -> (usize, usize) {
    crate::collectives::degrees(comm).map_or((0, 0), |d| (d.destinations, d.sources))
}

/// A neighbourhood collective's send and receive arrays (either pair of pointers
/// may be null where the call has no such array; displacements null: counts only).
///
/// # Safety
/// The send arrays have one entry per destination, the receive arrays one per
/// source of `comm`'s topology, where non-null.
unsafe fn neighbor_args(
    sendcounts: *const MPI_Count,
    sdispls: *const MPI_Aint,
    recvcounts: *const MPI_Count,
    rdispls: *const MPI_Aint,
    comm: MPI_Comm,
) -> Result<(IntArrays, IntArrays), c_int> {
    let (destinations, sources) = neighbors(comm);
    let send = if sendcounts.is_null() {
        IntArrays::unused()
    } else {
        // SAFETY: one entry per destination, per the contract.
        unsafe { IntArrays::convert(sendcounts, sdispls, destinations, comm)? }
    };
    // SAFETY: one entry per source, per the contract.
    let recv = unsafe { IntArrays::convert(recvcounts, rdispls, sources, comm)? };
    Ok((send, recv))
}

/// A count of a call without a communicator (`MPI_Reduce_local_c`): its error
/// goes to `MPI_COMM_WORLD`, as Open MPI reports the C form's.
fn narrow_local(value: MPI_Count) -> Result<c_int, c_int> {
    // SAFETY: reading an immutable handle constant.
    narrow(value, unsafe { ffi::RSMPI_COMM_WORLD })
}

mod exports;
