//! Who is where: ranks, nodes and local ranks of a communicator.

mod discover;

pub(crate) use discover::{discover, log};

/// The placement of a communicator's ranks on nodes. Identical on all ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// Node index of each rank. Nodes are numbered 0.. in the order of their
    /// lowest rank.
    pub node_of: Vec<usize>,
    /// Ranks of each node, ascending.
    pub nodes: Vec<Vec<usize>>,
}

impl Topology {
    /// Build from each rank's node key (any value equal for ranks that share
    /// a node). Nodes are numbered by first appearance.
    pub fn from_node_keys(rank: usize, keys: &[u64]) -> Topology {
        let mut first_seen: Vec<u64> = Vec::new();
        let mut node_of = Vec::with_capacity(keys.len());
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        for (r, k) in keys.iter().enumerate() {
            let idx = match first_seen.iter().position(|x| x == k) {
                Some(i) => i,
                None => {
                    first_seen.push(*k);
                    nodes.push(Vec::new());
                    first_seen.len() - 1
                }
            };
            node_of.push(idx);
            nodes[idx].push(r);
        }
        Topology {
            rank,
            nranks: keys.len(),
            node_of,
            nodes,
        }
    }

    /// A single-node topology of `nranks` (tests, and the trivial case).
    pub fn single_node(rank: usize, nranks: usize) -> Topology {
        Topology::from_node_keys(rank, &vec![0; nranks])
    }

    /// Number of nodes.
    pub fn nnodes(&self) -> usize {
        self.nodes.len()
    }

    /// This rank's node index.
    pub fn node(&self) -> usize {
        self.node_of[self.rank]
    }

    /// This rank's index within its node.
    pub fn local_rank(&self) -> usize {
        self.local_rank_of(self.rank)
    }

    /// Number of ranks on this rank's node.
    pub fn local_size(&self) -> usize {
        self.nodes[self.node()].len()
    }

    /// Index of `rank` within its node.
    pub fn local_rank_of(&self, rank: usize) -> usize {
        let node = self.node_of[rank];
        self.nodes[node]
            .iter()
            .position(|&r| r == rank)
            .expect("rank listed in its node")
    }

    /// Whether two ranks share a node (and so can use shared memory).
    pub fn same_node(&self, a: usize, b: usize) -> bool {
        self.node_of[a] == self.node_of[b]
    }

    /// The same placement seen from another rank (for simulations and tests).
    pub fn as_rank(&self, rank: usize) -> Topology {
        Topology {
            rank,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_numbered_by_first_rank() {
        let t = Topology::from_node_keys(3, &[7, 7, 9, 9, 7]);
        assert_eq!(t.nnodes(), 2);
        assert_eq!(t.nodes, vec![vec![0, 1, 4], vec![2, 3]]);
        assert_eq!(t.node(), 1);
        assert_eq!(t.local_rank(), 1);
        assert_eq!(t.local_size(), 2);
        assert_eq!(t.local_rank_of(4), 2);
        assert!(t.same_node(0, 4));
        assert!(!t.same_node(0, 2));
    }
}
