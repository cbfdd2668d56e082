//! Communication graphs over a [`Topology`]: the ring every ring algorithm
//! follows, and the two trees (one per channel parity) of the tree
//! all_reduce.
//!
//! * Ring: ranks node by node (nodes in index order, ranks ascending within
//!   a node), so a ring crosses each node boundary exactly once. All channels
//!   share the same ring; channels differ in the data they carry.
//! * Trees: a double binary tree over node indices (see `tree.rs`) connects
//!   the nodes' heads (each node's first rank); within a node the ranks form
//!   a chain from the head through the other local ranks in order. A rank
//!   thus has at most three children: two node-tree children (their heads)
//!   and the next rank of its node's chain.

pub(crate) mod tree;

use crate::topo::Topology;

/// A rank's links in one tree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeLinks {
    /// The rank's parent (`None` at the root).
    pub parent: Option<usize>,
    /// The rank's children, at most [`crate::plan::MAX_STEP_PEERS`]: the heads
    /// of its node-tree children first (ascending node index), then the next
    /// rank of its node chain.
    pub children: Vec<usize>,
}

/// Ring and tree graphs of one communicator; identical on all ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    /// Ranks in ring order.
    ring: Vec<usize>,
    /// Position of each rank in `ring`.
    ring_pos: Vec<usize>,
    /// Per tree (0, 1), per rank, its links.
    trees: [Vec<TreeLinks>; 2],
    /// Root rank of each tree.
    roots: [usize; 2],
    /// Depth of each tree (edges on the longest root-to-leaf path).
    depths: [usize; 2],
    /// The ranks of each node, ascending, and the node of each rank.
    nodes: Vec<Vec<usize>>,
    node_of: Vec<usize>,
}

impl Graph {
    /// Build the ring and both trees of `topo`.
    pub fn new(topo: &Topology) -> Graph {
        let n = topo.nranks;
        let ring: Vec<usize> = topo.nodes.iter().flatten().copied().collect();
        debug_assert_eq!(ring.len(), n, "every rank on exactly one node");
        let mut ring_pos = vec![0; n];
        for (i, &r) in ring.iter().enumerate() {
            ring_pos[r] = i;
        }
        let nnodes = topo.nnodes();
        let build = |which: usize| -> (Vec<TreeLinks>, usize, usize) {
            let mut links = vec![TreeLinks::default(); n];
            if n == 0 {
                return (links, 0, 0);
            }
            let (node_parent, node_children) = tree::dtree_links(nnodes, which);
            for (node, ranks) in topo.nodes.iter().enumerate() {
                for (local, &r) in ranks.iter().enumerate() {
                    let l = &mut links[r];
                    if local == 0 {
                        l.parent = node_parent[node].map(|p| topo.nodes[p][0]);
                        l.children
                            .extend(node_children[node].iter().map(|&c| topo.nodes[c][0]));
                    } else {
                        l.parent = Some(ranks[local - 1]);
                    }
                    if let Some(&next) = ranks.get(local + 1) {
                        l.children.push(next);
                    }
                }
            }
            let root = topo.nodes[tree::dtree_root(nnodes, which)][0];
            // Depth by walking up from every rank (small graphs; done once).
            let mut depth = 0;
            for r in 0..n {
                let (mut d, mut x) = (0, r);
                while let Some(p) = links[x].parent {
                    x = p;
                    d += 1;
                }
                depth = depth.max(d);
            }
            (links, root, depth)
        };
        let (t0, r0, d0) = build(0);
        let (t1, r1, d1) = build(1);
        Graph {
            ring,
            ring_pos,
            trees: [t0, t1],
            roots: [r0, r1],
            depths: [d0, d1],
            nodes: topo.nodes.clone(),
            node_of: topo.node_of.clone(),
        }
    }

    /// The ranks of `rank`'s node, ascending (its local ring).
    pub fn node_members(&self, rank: usize) -> &[usize] {
        &self.nodes[self.node_of[rank]]
    }

    /// Ranks per node when every node has the same number (the rails of
    /// collnet need it), else None.
    pub fn uniform_ppn(&self) -> Option<usize> {
        let first = self.nodes.first()?.len();
        self.nodes.iter().all(|n| n.len() == first).then_some(first)
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.ring.len()
    }

    /// Ranks in ring order.
    pub fn ring_order(&self) -> &[usize] {
        &self.ring
    }

    /// Position of `rank` in the ring.
    pub fn ring_index(&self, rank: usize) -> usize {
        self.ring_pos[rank]
    }

    /// The rank `rank` sends to in the ring.
    pub fn ring_next(&self, rank: usize) -> usize {
        let n = self.ring.len();
        self.ring[(self.ring_pos[rank] + 1) % n]
    }

    /// The rank `rank` receives from in the ring.
    pub fn ring_prev(&self, rank: usize) -> usize {
        let n = self.ring.len();
        self.ring[(self.ring_pos[rank] + n - 1) % n]
    }

    /// The rank `steps` positions after `rank` in the ring (wrapping).
    pub fn ring_offset(&self, rank: usize, steps: usize) -> usize {
        let n = self.ring.len();
        self.ring[(self.ring_pos[rank] + steps % n) % n]
    }

    /// `rank`'s links in the tree used by channels of parity
    /// `channel_parity` (channel `c` uses tree `c % 2`).
    pub fn tree(&self, channel_parity: usize, rank: usize) -> TreeLinks {
        self.trees[channel_parity % 2][rank].clone()
    }

    /// Borrowing form of [`Graph::tree`].
    pub fn tree_links(&self, channel_parity: usize, rank: usize) -> &TreeLinks {
        &self.trees[channel_parity % 2][rank]
    }

    /// Root rank of the tree of channel parity `channel_parity`.
    pub fn tree_root(&self, channel_parity: usize) -> usize {
        self.roots[channel_parity % 2]
    }

    /// Depth (longest root-to-leaf path, in hops) of that tree.
    pub fn tree_depth(&self, channel_parity: usize) -> usize {
        self.depths[channel_parity % 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topologies() -> Vec<Topology> {
        let mut v = Vec::new();
        for n in 1..=12usize {
            v.push(Topology::single_node(0, n));
            for nodes in 2..=5usize {
                if nodes <= n {
                    // Contiguous blocks, and round-robin placement.
                    let block: Vec<u64> = (0..n).map(|r| (r * nodes / n) as u64).collect();
                    v.push(Topology::from_node_keys(0, &block));
                    let rr: Vec<u64> = (0..n).map(|r| (r % nodes) as u64).collect();
                    v.push(Topology::from_node_keys(0, &rr));
                }
            }
        }
        v
    }

    #[test]
    fn ring_is_node_major_permutation() {
        for t in topologies() {
            let g = Graph::new(&t);
            let n = t.nranks;
            let mut seen = vec![false; n];
            for &r in g.ring_order() {
                assert!(!seen[r]);
                seen[r] = true;
            }
            // Node indices never decrease along the ring.
            for w in g.ring_order().windows(2) {
                assert!(t.node_of[w[0]] <= t.node_of[w[1]]);
                if t.node_of[w[0]] == t.node_of[w[1]] {
                    assert!(w[0] < w[1]);
                }
            }
            for r in 0..n {
                assert_eq!(g.ring_prev(g.ring_next(r)), r);
                assert_eq!(g.ring_order()[g.ring_index(r)], r);
                assert_eq!(g.ring_offset(r, 1), g.ring_next(r));
                assert_eq!(g.ring_offset(r, n), r);
            }
        }
        let t = Topology::from_node_keys(0, &[5, 9, 5, 9, 5]);
        assert_eq!(Graph::new(&t).ring_order(), &[0, 2, 4, 1, 3]);
    }

    #[test]
    fn trees_span_all_ranks_symmetrically() {
        for t in topologies() {
            let g = Graph::new(&t);
            let n = t.nranks;
            let nnodes = t.nnodes();
            let mut interior = vec![0usize; n];
            for parity in 0..2 {
                let root = g.tree_root(parity);
                assert_eq!(g.tree(parity, root).parent, None);
                assert_eq!(t.local_rank_of(root), 0, "root is a node head");
                for (r, interior_r) in interior.iter_mut().enumerate() {
                    let l = g.tree(parity, r);
                    assert!(l.children.len() <= crate::plan::MAX_STEP_PEERS);
                    for &c in &l.children {
                        assert_eq!(g.tree(parity, c).parent, Some(r));
                    }
                    if let Some(p) = l.parent {
                        assert!(g.tree(parity, p).children.contains(&r));
                        // Cross-node links only between heads.
                        if !t.same_node(p, r) {
                            assert_eq!(t.local_rank_of(r), 0);
                            assert_eq!(t.local_rank_of(p), 0);
                        }
                    } else {
                        assert_eq!(r, root);
                    }
                    // Reachable from the root.
                    let (mut x, mut hops) = (r, 0);
                    while let Some(p) = g.tree(parity, x).parent {
                        x = p;
                        hops += 1;
                        assert!(hops <= n);
                    }
                    assert_eq!(x, root);
                    // Count node-level interior roles (heads with a node parent
                    // and node children).
                    let node_children = l.children.iter().filter(|&&c| !t.same_node(c, r)).count();
                    let node_parent = l.parent.is_some_and(|p| !t.same_node(p, r));
                    if node_children > 0 && node_parent {
                        *interior_r += 1;
                    }
                }
                // depth ~ (ranks per node - 1) + log2(nnodes)
                let ppn = t.nodes.iter().map(|v| v.len()).max().unwrap_or(1);
                let log = (usize::BITS - nnodes.saturating_sub(1).leading_zeros()) as usize;
                assert!(g.tree_depth(parity) <= ppn - 1 + log, "{t:?}");
            }
            if nnodes >= 2 {
                assert!(interior.iter().all(|&k| k <= 1), "{t:?}");
            }
        }
    }
}
