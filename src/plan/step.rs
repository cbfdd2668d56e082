//! The unit of work every backend executes: a step on one channel.
//!
//! A plan is, per channel, a list of steps executed in order. Every backend
//! runs exactly these semantics (the host backend interprets them directly;
//! GPU kernels implement the same sequences), so the planner is tested once,
//! by simulation, for all backends.
//!
//! One `Flow` shape expresses the ring, tree, pairwise and one-shot
//! algorithms, so a new algorithm needs no new step. The GPU step
//! interpreter has no `acc`: GPUs run one-shot plans as their one-shot
//! kernel, and group launches never get one-shot plans.

/// Which of a call's buffers a [`Region`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufId {
    /// The caller's input (send) buffer.
    Input,
    /// The caller's output (receive) buffer.
    Output,
    /// A backend-provided scratch buffer of `Plan::scratch_elems` elements.
    Scratch,
}

/// A position in one of the call's buffers, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    pub buf: BufId,
    pub offset: u64,
}

impl Region {
    pub const fn input(offset: u64) -> Region {
        Region {
            buf: BufId::Input,
            offset,
        }
    }
    pub const fn output(offset: u64) -> Region {
        Region {
            buf: BufId::Output,
            offset,
        }
    }
    pub const fn scratch(offset: u64) -> Region {
        Region {
            buf: BufId::Scratch,
            offset,
        }
    }
}

/// Most peers one step receives from or sends to (tree arity: two children
/// across nodes plus one within the node, as in NCCL).
pub const MAX_STEP_PEERS: usize = 3;

/// Up to [`MAX_STEP_PEERS`] communicator ranks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Peers {
    len: u8,
    ranks: [u32; MAX_STEP_PEERS],
}

impl Peers {
    pub const NONE: Peers = Peers {
        len: 0,
        ranks: [0; MAX_STEP_PEERS],
    };

    /// One peer.
    pub fn one(rank: usize) -> Peers {
        let mut p = Peers::NONE;
        p.push(rank);
        p
    }

    /// Peers from a slice (at most [`MAX_STEP_PEERS`]).
    pub fn from_slice(ranks: &[usize]) -> Peers {
        assert!(ranks.len() <= MAX_STEP_PEERS, "too many step peers");
        let mut p = Peers::NONE;
        for &r in ranks {
            p.push(r);
        }
        p
    }

    /// Add a peer. Panics past capacity (a planner bug, never user input).
    pub fn push(&mut self, rank: usize) {
        assert!((self.len as usize) < MAX_STEP_PEERS, "too many step peers");
        self.ranks[self.len as usize] = rank as u32;
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.ranks[..self.len as usize].iter().map(|&r| r as usize)
    }

    pub fn get(&self, i: usize) -> Option<usize> {
        (i < self.len as usize).then(|| self.ranks[i] as usize)
    }
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The generic data-flow step: receive from `recv` peers (possibly none),
/// combine with the local `src` (possibly none), then write the value to
/// `dst` (possibly none) and send it to every `send` peer.
///
/// * `reduce == false`: at most one of `recv`/`src` is set and the value is
///   that input copied.
/// * `reduce == true`: the value is `src ⊕ recv[0] ⊕ recv[1] ...` with the
///   plan's reduction; `pre_op` scales `src` first (the local input's
///   Avg/PreMulSum factor); `post_op` applies the final division (integer
///   Avg) before writing and sending.
/// * `acc == true` (with `reduce`, a `dst` and no `send`): the value above
///   is folded into what `dst` holds, `dst ⊕ value` (the post-op after
///   that). The one-shot all_reduce uses it to add this rank's own input at
///   its rank's place in a fold every rank runs in the same order.
///
/// Backends move the `count` elements in pieces of one FIFO slot each and
/// pipeline the pieces: a piece is sent as soon as it is received and reduced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flow {
    pub recv: Peers,
    pub send: Peers,
    pub src: Option<Region>,
    pub dst: Option<Region>,
    pub count: u64,
    pub reduce: bool,
    pub pre_op: bool,
    pub post_op: bool,
    pub acc: bool,
}

/// One step of a channel's work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Receive/reduce/copy/send pipeline (see [`Flow`]).
    Flow(Flow),
    /// Send `count` elements from `src` to `to` while receiving `count`
    /// elements from `from` into `dst`, piece by piece interleaved, so that
    /// pairwise exchanges of any size cannot deadlock. `to` and `from` may be
    /// the same rank.
    Exchange {
        to: usize,
        src: Region,
        from: usize,
        dst: Region,
        count: u64,
    },
    /// All-reduce, in place, the `count` elements at `region` with the
    /// ranks of local index `rail` on every other node (this rank's rail),
    /// through the backend's inter-node collective: MPI's own all_reduce on
    /// the host backend. The value is the plain combine of every member's
    /// elements (no pre- or post-op), identical on every member. Members
    /// meet their rail steps in the same order on each channel.
    Rail {
        region: Region,
        count: u64,
        rail: u32,
    },
}

impl Step {
    /// Elements this step moves.
    pub fn count(&self) -> u64 {
        match self {
            Step::Flow(f) => f.count,
            Step::Exchange { count, .. } | Step::Rail { count, .. } => *count,
        }
    }
}
