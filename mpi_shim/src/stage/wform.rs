//! One side of a w-form (`MPI_Alltoallw`, `MPI_Neighbor_alltoallw`): a
//! buffer with a block per peer, each at a byte displacement and of its
//! own datatype, staged block by block (`Copies::blocks`).

use super::{Block, Copies, Rebase};
use mpi_sys::{MPI_Aint, MPI_Datatype};
use std::ffi::{c_int, c_void};

/// A byte displacement as the w-forms take it: `int` (`MPI_Alltoallw`) or
/// `MPI_Aint` (`MPI_Neighbor_alltoallw`).
pub trait Displ: Copy {
    fn bytes(self) -> isize;
}

impl Displ for c_int {
    fn bytes(self) -> isize {
        self as isize
    }
}

impl Displ for MPI_Aint {
    fn bytes(self) -> isize {
        self
    }
}

/// The arguments of one side as MPI gets them: the program's, or a staged
/// base address, or (blocks copied apart) counts and datatypes of its own.
pub struct WSide<D> {
    pub buf: *mut c_void,
    pub counts: *const c_int,
    pub displs: *const D,
    pub types: *const MPI_Datatype,
    own_counts: Vec<c_int>,
    own_types: Vec<MPI_Datatype>,
}

impl<D> WSide<D> {
    pub fn new(
        buf: *const c_void,
        counts: *const c_int,
        displs: *const D,
        types: *const MPI_Datatype,
    ) -> Self {
        WSide {
            buf: buf.cast_mut(),
            counts,
            displs,
            types,
            own_counts: Vec::new(),
            own_types: Vec::new(),
        }
    }
}

/// Stage the `n` blocks of `side` (MPI reads them when `read`, writes them
/// when `write`); a side whose arrays are null, or with a null datatype
/// where a count is positive, passes unchanged (MPI reports it).
///
/// # Safety
/// The side's non-null arrays hold `n` entries.
pub unsafe fn stage_side<D: Displ>(
    c: &mut Copies,
    mut side: WSide<D>,
    n: usize,
    read: bool,
    write: bool,
) -> Result<WSide<D>, c_int> {
    if n == 0 || side.counts.is_null() || side.displs.is_null() || side.types.is_null() {
        return Ok(side);
    }
    // SAFETY: `n` entries each (the contract).
    let (counts, displs, types) = unsafe {
        (
            std::slice::from_raw_parts(side.counts, n),
            std::slice::from_raw_parts(side.displs, n),
            std::slice::from_raw_parts(side.types, n),
        )
    };
    // SAFETY: reading an immutable handle constant.
    let null = unsafe { mpi_sys::RSMPI_DATATYPE_NULL };
    if counts.iter().zip(types).any(|(&k, &t)| k > 0 && t == null) {
        return Ok(side);
    }
    let mut blocks = Vec::with_capacity(n);
    for i in 0..n {
        blocks.push(Block {
            displ: displs[i].bytes(),
            span: c.type_span(counts[i].into(), types[i])?,
        });
    }
    match c.blocks(side.buf, &blocks, read, write)? {
        Rebase::Same => {}
        Rebase::Base(p) => side.buf = p,
        Rebase::PerBlock(shifts) => {
            side.own_counts = counts.to_vec();
            side.own_types = types.to_vec();
            for (i, shift) in shifts.iter().enumerate() {
                if let (Some(s), true) = (shift, counts[i] > 0) {
                    side.own_types[i] = c.wrap(counts[i], types[i], *s)?;
                    side.own_counts[i] = 1;
                }
            }
            side.counts = side.own_counts.as_ptr();
            side.types = side.own_types.as_ptr();
        }
    }
    Ok(side)
}
