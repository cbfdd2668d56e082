//! Which ranks share a node, found at communicator creation (collective):
//! the host name plus the lowest rank of the shared-memory group, so that
//! hosts with equal names are not merged; then the `GPUCOLL_NODE_ID` and
//! `GPUCOLL_SIM_NODES` overrides of [`Config`].

use super::Topology;
use crate::config::Config;
use crate::error::Result;
use crate::mpi::words::{decode_u64s, fnv1a};
use crate::mpi::{self, MpiComm};
use std::collections::HashMap;

/// The simulated node (block) of a rank: `local_rank * k / local_size`.
fn sim_block(local_rank: usize, local_size: usize, k: usize) -> usize {
    if local_size == 0 {
        return 0;
    }
    ((local_rank as u128 * k as u128) / local_size as u128) as usize
}

/// Split every node (ranks with equal keys) into `k` simulated nodes of
/// contiguous local ranks.
fn apply_sim_nodes(keys: &[u64], k: usize) -> Vec<u64> {
    if k <= 1 {
        return keys.to_vec();
    }
    let mut members: HashMap<u64, Vec<usize>> = HashMap::new();
    for (r, &key) in keys.iter().enumerate() {
        members.entry(key).or_default().push(r);
    }
    keys.iter()
        .enumerate()
        .map(|(r, &key)| {
            let group = &members[&key];
            let local_rank = group.iter().position(|&x| x == r).unwrap_or(0);
            let block = sim_block(local_rank, group.len(), k) as u64;
            fnv1a(&[&key.to_le_bytes(), b"sim", &block.to_le_bytes()])
        })
        .collect()
}

/// Which ranks share a node: the host name plus the lowest rank (in this
/// communicator) of the shared-memory group, so hosts with equal names are
/// not merged; then the `GPUCOLL_NODE_ID` / `GPUCOLL_SIM_NODES` overrides.
pub(crate) fn discover(mpi: &MpiComm, config: &Config) -> Result<Topology> {
    // Always collective on every rank, whatever the overrides.
    let shared = mpi.split_shared()?;
    let mut leader = (mpi.rank() as u64).to_le_bytes();
    shared.bcast_bytes(&mut leader, 0)?;
    drop(shared);
    let host = mpi::processor_name().unwrap_or_default();
    let discovered = fnv1a(&[host.as_bytes(), &leader]);
    let key = config.node_id.unwrap_or(discovered);
    let keys = decode_u64s(&mpi.allgather_bytes(&key.to_le_bytes())?);
    let keys = match config.sim_nodes {
        Some(k) => apply_sim_nodes(&keys, k),
        None => keys,
    };
    Ok(Topology::from_node_keys(mpi.rank(), &keys))
}

pub(crate) fn log(topo: &Topology) {
    if topo.rank == 0 {
        let sizes: Vec<usize> = topo.nodes.iter().map(Vec::len).collect();
        tracing::info!(
            ranks = topo.nranks,
            nodes = topo.nnodes(),
            ranks_per_node = ?sizes,
            "communicator topology"
        );
    }
    tracing::debug!(
        rank = topo.rank,
        node = topo.node(),
        local_rank = topo.local_rank(),
        local_size = topo.local_size(),
        "rank placement"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_blocks_are_contiguous() {
        let blocks: Vec<usize> = (0..8).map(|lr| sim_block(lr, 8, 2)).collect();
        assert_eq!(blocks, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        let blocks: Vec<usize> = (0..5).map(|lr| sim_block(lr, 5, 2)).collect();
        assert_eq!(blocks, vec![0, 0, 0, 1, 1]);
        assert_eq!(sim_block(0, 0, 3), 0);
    }

    #[test]
    fn sim_nodes_split_each_real_node() {
        // Two real nodes of four ranks each, interleaved ranks.
        let keys = [1, 2, 1, 2, 1, 2, 1, 2];
        let sim = apply_sim_nodes(&keys, 2);
        let t = Topology::from_node_keys(0, &sim);
        assert_eq!(t.nnodes(), 4);
        assert_eq!(
            t.nodes,
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert_eq!(apply_sim_nodes(&keys, 1), keys.to_vec());
        // More simulated nodes than ranks: one rank per node.
        let t = Topology::from_node_keys(0, &apply_sim_nodes(&[7, 7, 7], 8));
        assert_eq!(t.nnodes(), 3);
    }
}
