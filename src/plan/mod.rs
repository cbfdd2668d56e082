//! The planner: a validated [`Task`] plus the tuner's choice become per-channel
//! lists of [`Step`]s that every backend executes the same way.

mod build;
mod collnet;
mod ctx;
mod oneshot;
mod pairwise;
mod ring;
mod scan;
#[cfg(test)]
pub(crate) mod simulate;
pub(crate) mod step;
mod tree;

pub use build::build;

pub use step::{BufId, Flow, Peers, Region, Step, MAX_STEP_PEERS};

use crate::op::Reduction;
use crate::task::Task;
use crate::tune::{Algorithm, Protocol};

/// The work of one channel: its steps, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelWork {
    pub channel: usize,
    pub steps: Vec<Step>,
}

/// A planned collective: identical on all ranks in its shape (algorithm,
/// protocol, channels, chunking), each rank holding its own steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub task: Task,
    pub reduction: Reduction,
    pub algorithm: Algorithm,
    pub protocol: Protocol,
    /// Largest number of elements in one step (the chunk).
    pub chunk_elems: u64,
    /// Elements of scratch the backend must provide (0 for most plans).
    pub scratch_elems: u64,
    /// One entry per channel used, channel ids `0..channels.len()`.
    pub channels: Vec<ChannelWork>,
}
