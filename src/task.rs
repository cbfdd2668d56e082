//! A collective call after argument checks: what the planner consumes.

use crate::datatype::Datatype;
use crate::op::ReduceOp;

/// The collective operations.
///
/// The generic entry points ([`Communicator::raw_collective`] and its
/// immediate form) take one; drivers such as the bench parse it from a name:
///
/// ```
/// use gpucoll::CollKind;
///
/// let kind = CollKind::parse("allreduce").expect("a collective");
/// assert_eq!(kind, CollKind::AllReduce);
/// assert_eq!(kind.name(), "all_reduce");
/// assert!(kind.reduces() && !kind.rooted());
/// assert_eq!(CollKind::parse("reduce-scatter"), Some(CollKind::ReduceScatter));
/// let rooted: Vec<_> = CollKind::ALL.into_iter().filter(|k| k.rooted()).collect();
/// assert_eq!(rooted.len(), 4);
/// // MPI's short name of the exclusive scan parses too.
/// assert_eq!(CollKind::parse("exscan"), Some(CollKind::ExclusiveScan));
/// ```
///
/// [`Communicator::raw_collective`]: crate::Communicator::raw_collective
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    /// Inclusive prefix reduction (`MPI_Scan`): rank r receives the
    /// reduction of the inputs of ranks 0..=r.
    Scan,
    /// Exclusive prefix reduction (`MPI_Exscan`): rank r > 0 receives the
    /// reduction of the inputs of ranks 0..r; rank 0's output is left
    /// untouched (MPI leaves it undefined).
    ExclusiveScan,
}

impl CollKind {
    /// Every collective, in a stable order.
    pub const ALL: [CollKind; 10] = [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::Broadcast,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Scan,
        CollKind::ExclusiveScan,
    ];

    /// nccl-tests style name (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::Reduce => "reduce",
            CollKind::Broadcast => "broadcast",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::Scan => "scan",
            CollKind::ExclusiveScan => "exclusive_scan",
        }
    }

    /// Parse a name as printed by [`CollKind::name`] (also without
    /// underscores), or MPI's `exscan` for [`CollKind::ExclusiveScan`].
    pub fn parse(s: &str) -> Option<CollKind> {
        let norm: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        if norm == "exscan" {
            return Some(CollKind::ExclusiveScan);
        }
        CollKind::ALL
            .into_iter()
            .find(|k| k.name().replace('_', "") == norm)
    }

    /// Whether the collective combines data with a reduction op.
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            CollKind::AllReduce
                | CollKind::Reduce
                | CollKind::ReduceScatter
                | CollKind::Scan
                | CollKind::ExclusiveScan
        )
    }

    /// Whether the collective is a prefix reduction ([`CollKind::Scan`],
    /// [`CollKind::ExclusiveScan`]): its result depends on the rank, so
    /// ops whose lowering depends on the communicator size (`Avg`) do not
    /// apply.
    pub const fn is_scan(self) -> bool {
        matches!(self, CollKind::Scan | CollKind::ExclusiveScan)
    }

    /// Whether the collective has a root rank.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            CollKind::Reduce | CollKind::Broadcast | CollKind::Gather | CollKind::Scatter
        )
    }
}

/// One collective call, validated, in the engine's terms.
///
/// `count` is the per-rank block size in elements, with the meaning NCCL
/// gives it: the full vector for all_reduce/reduce/broadcast; each rank's
/// contribution for all_gather and gather; each rank's result for
/// reduce_scatter and scatter; the block sent to each peer for all_to_all;
/// the whole vector for scan and exclusive_scan.
/// So the input buffer holds `count` elements except for reduce_scatter,
/// all_to_all and scatter (root) where it holds `count * size`; the output
/// holds `count` except for all_gather, all_to_all and gather (root) where it
/// holds `count * size`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Task {
    pub kind: CollKind,
    pub dtype: Datatype,
    /// The reduction (ignored by collectives that do not reduce; `Sum` there).
    pub op: ReduceOp,
    pub count: u64,
    /// Root rank of rooted collectives (0 otherwise).
    pub root: usize,
    /// Input and output are the same memory, laid out as MPI_IN_PLACE says.
    pub in_place: bool,
}

impl Task {
    /// Bytes of the larger of input and output on this rank (the tuner's size).
    pub fn bytes(&self, nranks: usize) -> u64 {
        let per = self.count.saturating_mul(self.dtype.size() as u64);
        match self.kind {
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter => per.saturating_mul(nranks as u64),
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::Scan
            | CollKind::ExclusiveScan => per,
        }
    }

    /// Elements the input buffer must hold on `rank`.
    pub fn input_len(&self, rank: usize, nranks: usize) -> u64 {
        let n = nranks as u64;
        match self.kind {
            CollKind::ReduceScatter | CollKind::AllToAll => self.count * n,
            CollKind::Scatter if rank == self.root => self.count * n,
            CollKind::Scatter => 0,
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::AllGather
            | CollKind::Gather
            | CollKind::Scan
            | CollKind::ExclusiveScan => self.count,
        }
    }

    /// Elements the output buffer must hold on `rank`.
    pub fn output_len(&self, rank: usize, nranks: usize) -> u64 {
        let n = nranks as u64;
        match self.kind {
            CollKind::AllGather | CollKind::AllToAll => self.count * n,
            CollKind::Gather if rank == self.root => self.count * n,
            CollKind::Gather => 0,
            CollKind::Reduce if rank != self.root => 0,
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::ReduceScatter
            | CollKind::Scatter
            | CollKind::Scan
            | CollKind::ExclusiveScan => self.count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        for k in CollKind::ALL {
            assert_eq!(CollKind::parse(k.name()), Some(k));
        }
        assert_eq!(CollKind::parse("allreduce"), Some(CollKind::AllReduce));
        assert_eq!(
            CollKind::parse("reducescatter"),
            Some(CollKind::ReduceScatter)
        );
        assert_eq!(CollKind::parse("Exscan"), Some(CollKind::ExclusiveScan));
        assert_eq!(CollKind::parse("scan"), Some(CollKind::Scan));
    }

    #[test]
    fn scans_reduce_whole_vectors() {
        for kind in [CollKind::Scan, CollKind::ExclusiveScan] {
            let t = Task {
                kind,
                dtype: Datatype::I32,
                op: ReduceOp::Sum,
                count: 7,
                root: 0,
                in_place: false,
            };
            assert!(kind.reduces() && kind.is_scan() && !kind.rooted());
            for rank in 0..3 {
                assert_eq!((t.input_len(rank, 3), t.output_len(rank, 3)), (7, 7));
            }
            assert_eq!(t.bytes(3), 28);
        }
    }

    #[test]
    fn lengths_follow_mpi() {
        let t = Task {
            kind: CollKind::Gather,
            dtype: Datatype::F32,
            op: ReduceOp::Sum,
            count: 5,
            root: 1,
            in_place: false,
        };
        assert_eq!(t.input_len(0, 4), 5);
        assert_eq!(t.output_len(1, 4), 20);
        assert_eq!(t.output_len(0, 4), 0);
        assert_eq!(t.bytes(4), 80);
    }
}
