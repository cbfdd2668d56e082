//! Binary trees over `n` positions (node indices), and the pair of
//! complementary trees ("double binary tree") that the tree all_reduce uses.
//!
//! The first tree is built from the lowest set bit of each position, which
//! makes odd positions leaves and even positions interior. The second tree is
//! the first one relabelled (mirrored for even `n`, shifted by one for odd
//! `n`) so that a position interior in one tree is a leaf, or the root, in the
//! other: together the two trees use every node's send and receive bandwidth.

/// Parent of position `r` in the lowest-set-bit binary tree over `0..n`
/// rooted at 0 (`None` for the root, or for `r >= n`).
///
/// With `bit` the lowest set bit of `r`, the parent is `r` with that bit
/// cleared and the next one set; when that falls outside `0..n` the bit is
/// only cleared.
pub fn btree_parent(n: usize, r: usize) -> Option<usize> {
    if r == 0 || r >= n {
        return None;
    }
    let bit = r & r.wrapping_neg();
    let up = (r ^ bit) | (bit << 1);
    Some(if up < n { up } else { r ^ bit })
}

/// Parent of position `r` in tree `which` (0 or 1) of the double binary tree
/// over `0..n`.
pub fn dtree_parent(n: usize, which: usize, r: usize) -> Option<usize> {
    if which % 2 == 0 || n <= 1 {
        return btree_parent(n, r);
    }
    if r >= n {
        return None;
    }
    if n % 2 == 0 {
        // Mirror: r -> n-1-r (its own inverse).
        btree_parent(n, n - 1 - r).map(|p| n - 1 - p)
    } else {
        // Shift: r -> r-1 mod n, inverse v -> v+1 mod n.
        btree_parent(n, (r + n - 1) % n).map(|p| (p + 1) % n)
    }
}

/// Root position of tree `which` of the double binary tree over `0..n`.
pub fn dtree_root(n: usize, which: usize) -> usize {
    if which % 2 == 0 || n <= 1 {
        0
    } else if n % 2 == 0 {
        n - 1
    } else {
        1
    }
}

/// Parent and children (ascending) of every position of tree `which`.
/// Children are derived from the parents, so the links are symmetric by
/// construction.
pub fn dtree_links(n: usize, which: usize) -> (Vec<Option<usize>>, Vec<Vec<usize>>) {
    let parents: Vec<Option<usize>> = (0..n).map(|r| dtree_parent(n, which, r)).collect();
    let mut children = vec![Vec::new(); n];
    for (r, p) in parents.iter().enumerate() {
        if let Some(p) = *p {
            children[p].push(r);
        }
    }
    (parents, children)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(parents: &[Option<usize>], mut r: usize) -> usize {
        let mut d = 0;
        while let Some(p) = parents[r] {
            r = p;
            d += 1;
            assert!(d <= parents.len(), "cycle in tree");
        }
        d
    }

    #[test]
    fn small_btrees_match_the_construction() {
        // n = 4: 0 -> 2 -> {1, 3}.
        assert_eq!(btree_parent(4, 0), None);
        assert_eq!(btree_parent(4, 2), Some(0));
        assert_eq!(btree_parent(4, 1), Some(2));
        assert_eq!(btree_parent(4, 3), Some(2));
        // n = 5: 0 -> 4 -> 2 -> {1, 3}.
        assert_eq!(btree_parent(5, 4), Some(0));
        assert_eq!(btree_parent(5, 2), Some(4));
        assert_eq!(btree_parent(5, 3), Some(2));
        assert_eq!(dtree_root(4, 1), 3);
        assert_eq!(dtree_root(5, 1), 1);
    }

    #[test]
    fn double_tree_properties() {
        for n in 1..=130usize {
            let mut interior = vec![0usize; n];
            for which in 0..2 {
                let (parents, children) = dtree_links(n, which);
                let root = dtree_root(n, which);
                assert_eq!(parents[root], None, "n={n} tree {which}");
                let bound = if n <= 1 {
                    0
                } else {
                    (usize::BITS - (n - 1).leading_zeros()) as usize
                };
                for r in 0..n {
                    // Reachable from the root, with depth about log2(n).
                    let d = depth(&parents, r);
                    assert!(d <= bound, "n={n} tree {which} r={r} depth {d} > {bound}");
                    assert!(children[r].len() <= 2, "n={n} r={r} arity");
                    if r != root {
                        let p = parents[r].expect("non-root has a parent");
                        assert!(children[p].contains(&r), "symmetry");
                        if !children[r].is_empty() {
                            interior[r] += 1;
                        }
                    }
                    for &c in &children[r] {
                        assert_eq!(parents[c], Some(r), "symmetry");
                    }
                }
            }
            if n >= 2 {
                // A node forwards between parent and children in at most one
                // of the two trees.
                for (r, &k) in interior.iter().enumerate() {
                    assert!(k <= 1, "n={n}: position {r} interior in both trees");
                }
            }
        }
    }
}
