//! Junction trees (001 §2.3; NOTES §3): greedy elimination (min-size as
//! private-pgm does, and min-fill), maximal cliques, a maximum spanning tree on
//! separator sizes, and JT-SIZE.

use std::collections::BTreeSet;

use itertools::Itertools;
use petgraph::unionfind::UnionFind;

/// A junction tree over attributes `0..sizes.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct JunctionTree {
    /// Maximal cliques (sorted attribute ids).
    pub cliques: Vec<Vec<usize>>,
    /// Tree edges (clique index pairs); a spanning tree over all cliques.
    pub edges: Vec<(usize, usize)>,
    /// The elimination order used.
    pub order: Vec<usize>,
}

/// Greedy elimination heuristic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heuristic {
    /// Eliminate the attribute whose new factor has the fewest cells (private-pgm's `greedy_order`).
    MinSize,
    /// Eliminate the attribute adding the fewest fill edges (ties: fewest cells).
    MinFill,
}

fn cells(sizes: &[usize], set: &BTreeSet<usize>) -> f64 {
    set.iter().map(|&a| sizes[a] as f64).product()
}

/// A greedy elimination order and its total cost (cells created).
pub fn greedy_order(sizes: &[usize], cliques: &[Vec<usize>], heuristic: Heuristic) -> (Vec<usize>, f64) {
    let d = sizes.len();
    // Adjacency of the interaction graph.
    let mut adj: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); d];
    for c in cliques {
        for &a in c {
            for &b in c {
                if a != b {
                    adj[a].insert(b);
                }
            }
        }
    }
    let mut alive = vec![true; d];
    let mut order = Vec::with_capacity(d);
    let mut total = 0.0;
    for _ in 0..d {
        let mut best: Option<(usize, (f64, f64))> = None;
        for v in (0..d).filter(|&v| alive[v]) {
            let mut fam: BTreeSet<usize> = adj[v].clone();
            fam.insert(v);
            let size = cells(sizes, &fam);
            let key = match heuristic {
                Heuristic::MinSize => (size, 0.0),
                Heuristic::MinFill => {
                    let fill = adj[v].iter().array_combinations().filter(|&[&a, b]| !adj[a].contains(b)).count();
                    (fill as f64, size)
                }
            };
            if best.is_none_or(|(_, k)| key < k) {
                best = Some((v, key));
            }
        }
        let (v, _) = best.expect("an attribute is alive");
        let nb: Vec<usize> = adj[v].iter().copied().collect();
        let mut fam: BTreeSet<usize> = adj[v].clone();
        fam.insert(v);
        total += cells(sizes, &fam);
        for i in 0..nb.len() {
            for j in 0..nb.len() {
                if i != j {
                    adj[nb[i]].insert(nb[j]);
                }
            }
        }
        for &u in &nb {
            adj[u].remove(&v);
        }
        adj[v].clear();
        alive[v] = false;
        order.push(v);
    }
    (order, total)
}

/// The maximal cliques produced by eliminating in `order`.
pub fn elimination_cliques(sizes: &[usize], cliques: &[Vec<usize>], order: &[usize]) -> Vec<Vec<usize>> {
    let d = sizes.len();
    let mut adj: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); d];
    for c in cliques {
        for &a in c {
            for &b in c {
                if a != b {
                    adj[a].insert(b);
                }
            }
        }
    }
    let mut out: Vec<BTreeSet<usize>> = Vec::new();
    for &v in order {
        let mut fam = adj[v].clone();
        fam.insert(v);
        let nb: Vec<usize> = adj[v].iter().copied().collect();
        for i in 0..nb.len() {
            for j in 0..nb.len() {
                if i != j {
                    adj[nb[i]].insert(nb[j]);
                }
            }
        }
        for &u in &nb {
            adj[u].remove(&v);
        }
        adj[v].clear();
        out.push(fam);
    }
    // Keep maximal ones.
    let mut maximal: Vec<Vec<usize>> = Vec::new();
    for (i, c) in out.iter().enumerate() {
        let dominated = out.iter().enumerate().any(|(j, o)| j != i && c.is_subset(o) && (c.len() < o.len() || j < i));
        if !dominated {
            maximal.push(c.iter().copied().collect());
        }
    }
    maximal.sort();
    maximal
}

/// Maximum spanning tree on separator size (Kruskal); disconnected parts are
/// joined with empty separators so the result is one tree.
pub fn max_spanning_tree(cliques: &[Vec<usize>]) -> Vec<(usize, usize)> {
    let n = cliques.len();
    let mut cand: Vec<(usize, usize, usize)> = (0..n)
        .array_combinations()
        .map(|[i, j]| (cliques[i].iter().filter(|a| cliques[j].contains(a)).count(), i, j))
        .collect();
    // Heaviest first; ties by index for determinism.
    cand.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut components = UnionFind::<usize>::new(n);
    let mut edges = Vec::new();
    for (_, i, j) in cand {
        if components.union(i, j) {
            edges.push((i, j));
        }
    }
    edges
}

impl JunctionTree {
    /// Builds a junction tree covering every attribute and every given clique,
    /// trying both heuristics and keeping the smaller tree.
    pub fn build(sizes: &[usize], cliques: &[Vec<usize>]) -> Self {
        let mut best: Option<(f64, JunctionTree)> = None;
        for h in [Heuristic::MinSize, Heuristic::MinFill] {
            let jt = Self::build_with(sizes, cliques, h);
            let cells = jt.cells(sizes);
            if best.as_ref().is_none_or(|(c, _)| cells < *c) {
                best = Some((cells, jt));
            }
        }
        best.expect("two candidates").1
    }

    /// Builds with one heuristic.
    pub fn build_with(sizes: &[usize], cliques: &[Vec<usize>], heuristic: Heuristic) -> Self {
        let (order, _) = greedy_order(sizes, cliques, heuristic);
        let max = elimination_cliques(sizes, cliques, &order);
        let edges = max_spanning_tree(&max);
        JunctionTree { cliques: max, edges, order }
    }

    /// Total cells of the maximal cliques.
    pub fn cells(&self, sizes: &[usize]) -> f64 {
        self.cliques.iter().map(|c| c.iter().map(|&a| sizes[a] as f64).product::<f64>()).sum()
    }

    /// JT-SIZE in MB (001 §2.3; cells × 8 bytes / 2^20, as private-pgm).
    pub fn size_mb(&self, sizes: &[usize]) -> f64 {
        self.cells(sizes) * 8.0 / (1u64 << 20) as f64
    }

    /// Index of a clique containing every attribute of `attrs`, if any.
    pub fn clique_containing(&self, attrs: &[usize]) -> Option<usize> {
        // The smallest such clique.
        self.cliques
            .iter()
            .enumerate()
            .filter(|(_, c)| attrs.iter().all(|a| c.contains(a)))
            .min_by_key(|(_, c)| c.len())
            .map(|(i, _)| i)
    }

    /// Neighbours of each clique.
    pub fn neighbours(&self) -> Vec<Vec<usize>> {
        let mut nb = vec![Vec::new(); self.cliques.len()];
        for &(a, b) in &self.edges {
            nb[a].push(b);
            nb[b].push(a);
        }
        nb
    }

    /// The neighbours of clique `i`, in edge order.
    pub fn neighbours_of(&self, i: usize) -> Vec<usize> {
        self.edges
            .iter()
            .filter_map(|&(a, b)| {
                if a == i {
                    Some(b)
                } else if b == i {
                    Some(a)
                } else {
                    None
                }
            })
            .collect()
    }

    /// The attributes of the cliques reached from clique `c` without passing
    /// through its neighbour `from` (the side of the edge (from, c) that holds c).
    pub fn attributes_beyond(&self, c: usize, from: usize) -> Vec<usize> {
        let mut seen = vec![false; self.cliques.len()];
        seen[from] = true;
        seen[c] = true;
        let nb = self.neighbours();
        let mut stack = vec![c];
        let mut attrs: Vec<usize> = Vec::new();
        while let Some(x) = stack.pop() {
            attrs.extend(&self.cliques[x]);
            for &y in &nb[x] {
                if !seen[y] {
                    seen[y] = true;
                    stack.push(y);
                }
            }
        }
        attrs.sort_unstable();
        attrs.dedup();
        attrs
    }

    /// Checks the running-intersection property (for tests).
    pub fn has_running_intersection(&self, d: usize) -> bool {
        let nb = self.neighbours();
        for a in 0..d {
            let holders: Vec<usize> = (0..self.cliques.len()).filter(|&i| self.cliques[i].contains(&a)).collect();
            if holders.is_empty() {
                return false;
            }
            // The holders must form a connected subtree.
            let mut seen = vec![false; self.cliques.len()];
            let mut stack = vec![holders[0]];
            seen[holders[0]] = true;
            while let Some(x) = stack.pop() {
                for &y in &nb[x] {
                    if !seen[y] && self.cliques[y].contains(&a) {
                        seen[y] = true;
                        stack.push(y);
                    }
                }
            }
            if holders.iter().any(|&h| !seen[h]) {
                return false;
            }
        }
        true
    }
}

/// JT-SIZE (MB) of the model for `cliques` plus `extra` (AIM's candidate filter).
pub fn hypothetical_size_mb(sizes: &[usize], cliques: &[Vec<usize>], extra: Option<&[usize]>) -> f64 {
    let mut all = cliques.to_vec();
    if let Some(e) = extra {
        all.push(e.to_vec());
    }
    JunctionTree::build(sizes, &all).size_mb(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_gives_pairwise_cliques() {
        let sizes = vec![3; 6];
        let cl: Vec<Vec<usize>> = (0..5).map(|i| vec![i, i + 1]).collect();
        let jt = JunctionTree::build(&sizes, &cl);
        assert_eq!(jt.cliques.len(), 5);
        assert!(jt.cliques.iter().all(|c| c.len() == 2));
        assert_eq!(jt.edges.len(), 4);
        assert!(jt.has_running_intersection(6));
        assert!((jt.size_mb(&sizes) - 5.0 * 9.0 * 8.0 / 1048576.0).abs() < 1e-15);
    }

    #[test]
    fn cycle_is_triangulated() {
        let sizes = vec![2; 4];
        let cl = vec![vec![0, 1], vec![1, 2], vec![2, 3], vec![0, 3]];
        let jt = JunctionTree::build(&sizes, &cl);
        assert!(jt.cliques.iter().all(|c| c.len() == 3));
        assert_eq!(jt.cliques.len(), 2);
        assert!(jt.has_running_intersection(4));
        for c in &cl {
            assert!(jt.clique_containing(c).is_some());
        }
    }

    #[test]
    fn isolated_attributes_get_cliques_and_tree_is_connected() {
        let sizes = vec![2, 3, 4, 5];
        let jt = JunctionTree::build(&sizes, &[vec![0, 1]]);
        assert!(jt.has_running_intersection(4));
        assert_eq!(jt.edges.len(), jt.cliques.len() - 1);
        let bigger = hypothetical_size_mb(&sizes, &[vec![0, 1]], Some(&[1, 2, 3]));
        assert!(bigger > jt.size_mb(&sizes));
    }
}
