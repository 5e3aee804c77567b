//! Graphical models in log space and exact belief propagation (sum-product on
//! a junction tree, 001 §2.3; NOTES §3).

use serde::{Deserialize, Serialize};

use super::factor::Factor;
use super::jtree::JunctionTree;

/// A Markov random field p(x) ∝ exp(Σ_r θ_r(x_r)) over attributes with
/// `sizes`, scaled to total mass `total`.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphicalModel {
    /// Attribute sizes.
    pub sizes: Vec<usize>,
    /// Potential cliques r (sorted attribute ids) with their log-potentials θ_r.
    pub potentials: Vec<Factor>,
    /// Total mass (number of records).
    pub total: f64,
    /// Junction tree covering every potential clique.
    pub jtree: JunctionTree,
}

/// Calibrated clique marginals of a model (counts, each summing to `total`).
#[derive(Debug, Clone, PartialEq)]
pub struct Beliefs {
    /// One factor per junction-tree clique, in counts.
    pub cliques: Vec<Factor>,
    /// The junction tree.
    pub jtree: JunctionTree,
    /// Total mass.
    pub total: f64,
}

fn intersect(a: &[usize], b: &[usize]) -> Vec<usize> {
    a.iter().copied().filter(|x| b.contains(x)).collect()
}

/// Root-first DFS order and parent of each clique.
pub(crate) fn tree_order(jt: &JunctionTree) -> (Vec<usize>, Vec<Option<usize>>) {
    let n = jt.cliques.len();
    let nb = jt.neighbours();
    let mut order = Vec::with_capacity(n);
    let mut parent = vec![None; n];
    let mut seen = vec![false; n];
    for root in 0..n {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        let mut stack = vec![root];
        while let Some(x) = stack.pop() {
            order.push(x);
            for &y in &nb[x] {
                if !seen[y] {
                    seen[y] = true;
                    parent[y] = Some(x);
                    stack.push(y);
                }
            }
        }
    }
    (order, parent)
}

/// Sum-product belief propagation in log space. `log_potentials[i]` is over
/// `jt.cliques[i]`. Returns normalised clique marginals with mass `total`.
pub fn belief_propagation(jt: &JunctionTree, log_potentials: &[Factor], total: f64) -> Vec<Factor> {
    let n = jt.cliques.len();
    let (order, parent) = tree_order(jt);
    let mut beliefs: Vec<Factor> = log_potentials.to_vec();
    // up[i] = message from i to its parent.
    let mut up: Vec<Option<Factor>> = vec![None; n];
    // Collect: leaves to root.
    for &i in order.iter().rev() {
        if let Some(p) = parent[i] {
            let sep = intersect(&jt.cliques[i], &jt.cliques[p]);
            let m = beliefs[i].logsumexp_to(&sep);
            beliefs[p].add_assign_sub(&m);
            up[i] = Some(m);
        }
    }
    // Distribute: root to leaves (parents are final before children).
    for &i in &order {
        if let Some(p) = parent[i] {
            let sep = intersect(&jt.cliques[i], &jt.cliques[p]);
            let mut tau = beliefs[p].clone();
            tau.sub_assign_sub(up[i].as_ref().expect("collected"));
            let m = tau.logsumexp_to(&sep);
            beliefs[i].add_assign_sub(&m);
        }
    }
    // Normalise each clique to total mass (components of a forest normalise separately,
    // which is exact because they are independent).
    for b in &mut beliefs {
        let z = b.logsumexp();
        for v in &mut b.values {
            *v = (*v - z).exp() * total;
        }
    }
    beliefs
}

impl GraphicalModel {
    /// A model with zero potentials on `cliques` (the uniform distribution).
    pub fn uniform(sizes: &[usize], cliques: &[Vec<usize>], total: f64) -> Self {
        let jtree = JunctionTree::build(sizes, cliques);
        let potentials = cliques.iter().map(|c| Factor::zeros(c, sizes)).collect();
        Self { sizes: sizes.to_vec(), potentials, total, jtree }
    }

    /// Log-potentials per junction-tree clique: ψ_C = Σ_{r assigned to C} θ_r.
    pub fn clique_potentials(&self) -> Vec<Factor> {
        let mut psi: Vec<Factor> = self.jtree.cliques.iter().map(|c| Factor::zeros(c, &self.sizes)).collect();
        for th in &self.potentials {
            let i = self.jtree.clique_containing(&th.attrs).expect("junction tree covers every potential");
            psi[i].add_assign_sub(th);
        }
        psi
    }

    /// Calibrated clique marginals.
    pub fn beliefs(&self) -> Beliefs {
        let cliques = belief_propagation(&self.jtree, &self.clique_potentials(), self.total);
        Beliefs { cliques, jtree: self.jtree.clone(), total: self.total }
    }

    /// The marginal (counts) over `attrs` (any set; sorted ids). Inside a
    /// clique it is a sum; otherwise the model is re-run on a junction tree that
    /// contains `attrs` as a clique (variable elimination).
    pub fn marginal(&self, attrs: &[usize]) -> Factor {
        self.beliefs().marginal_any(attrs, &self.sizes)
    }

    /// [`GraphicalModel::marginal`] by re-running belief propagation on a junction
    /// tree extended with `attrs` (a slower, independent path used in tests).
    pub fn marginal_by_extension(&self, attrs: &[usize]) -> Factor {
        let b = self.beliefs();
        if let Some(m) = b.marginal(attrs) {
            return m;
        }
        let mut cliques: Vec<Vec<usize>> = self.potentials.iter().map(|p| p.attrs.clone()).collect();
        cliques.push(attrs.to_vec());
        let extended = GraphicalModel {
            sizes: self.sizes.clone(),
            potentials: self.potentials.clone(),
            total: self.total,
            jtree: JunctionTree::build(&self.sizes, &cliques),
        };
        extended.beliefs().marginal(attrs).expect("attrs is inside a clique of the extended tree")
    }
}

impl Beliefs {
    /// The marginal over `attrs` if some clique contains them.
    pub fn marginal(&self, attrs: &[usize]) -> Option<Factor> {
        let i = self.jtree.clique_containing(attrs)?;
        Some(self.cliques[i].sum_to(attrs))
    }

    /// The marginal (counts) over any attribute set, by variable elimination on
    /// the smallest subtree of the calibrated junction tree that covers `attrs`:
    /// p = Π_C μ_C / Π_S μ_S on that subtree, summing out other attributes
    /// leaf to root.
    pub fn marginal_any(&self, attrs: &[usize], sizes: &[usize]) -> Factor {
        if let Some(m) = self.marginal(attrs) {
            return m;
        }
        let jt = &self.jtree;
        let n = jt.cliques.len();
        let nb = jt.neighbours();
        // Terminals: for each attribute, the clique holding most of `attrs`.
        let mut terminal = vec![false; n];
        for &a in attrs {
            let best = (0..n)
                .filter(|&i| jt.cliques[i].contains(&a))
                .max_by_key(|&i| attrs.iter().filter(|x| jt.cliques[i].contains(x)).count())
                .expect("every attribute is in a clique");
            terminal[best] = true;
        }
        // Steiner subtree: repeatedly prune non-terminal leaves.
        let mut alive = vec![true; n];
        let mut degree: Vec<usize> = nb.iter().map(|v| v.len()).collect();
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..n {
                if alive[i] && !terminal[i] && degree[i] <= 1 {
                    alive[i] = false;
                    changed = true;
                    for &j in &nb[i] {
                        if alive[j] {
                            degree[j] -= 1;
                        }
                    }
                }
            }
        }
        let root = (0..n).find(|&i| terminal[i]).expect("a terminal");
        // DFS order within the subtree.
        let mut order = vec![root];
        let mut parent = vec![usize::MAX; n];
        let mut k = 0;
        while k < order.len() {
            let x = order[k];
            for &y in &nb[x] {
                if alive[y] && y != parent[x] && parent[y] == usize::MAX && y != root {
                    parent[y] = x;
                    order.push(y);
                }
            }
            k += 1;
        }
        // Messages are contracted clique by clique with fused product-sums
        // (never the product of a clique with a message): a clique is first
        // summed down to the attributes still needed (its separator to the
        // parent, `attrs`, and those of incoming messages), so memory stays at
        // the size of the messages (separator × `attrs`), not clique × `attrs`.
        let mut msgs: Vec<Vec<Factor>> = vec![Vec::new(); n];
        for &i in order.iter().rev() {
            let incoming = std::mem::take(&mut msgs[i]);
            let sep: Vec<usize> = if i == root {
                Vec::new()
            } else {
                let p = parent[i];
                jt.cliques[i].iter().copied().filter(|a| jt.cliques[p].contains(a)).collect()
            };
            let wanted = |a: &usize, rest: &[Factor]| {
                sep.contains(a) || attrs.contains(a) || rest.iter().any(|m| m.attrs.contains(a))
            };
            let pre: Vec<usize> = jt.cliques[i].iter().copied().filter(|a| wanted(a, &incoming)).collect();
            let mut cur = self.cliques[i].sum_to(&pre);
            for (k, m) in incoming.iter().enumerate() {
                let rest = &incoming[k + 1..];
                let mut keep: Vec<usize> =
                    cur.attrs.iter().chain(&m.attrs).copied().filter(|a| wanted(a, rest)).collect();
                keep.sort_unstable();
                keep.dedup();
                cur = cur.product_sum_to(m, &keep, sizes);
            }
            if i == root {
                // Every attribute of `attrs` is in a terminal clique of the subtree.
                return cur.sum_to(attrs);
            }
            // μ_C / μ_S: the conditional of the clique given its separator.
            let sep_belief = self.cliques[parent[i]].sum_to(&sep);
            cur.div_assign_sub(&sep_belief);
            msgs[parent[i]].push(cur);
        }
        unreachable!("the root returns")
    }
}

/// A serialisable snapshot of a fitted model (post-processing of DP outputs,
/// safe to publish).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFile {
    /// Attribute sizes.
    pub sizes: Vec<usize>,
    /// Potential cliques.
    pub cliques: Vec<Vec<usize>>,
    /// Log-potentials, one vector per clique (row-major over the sorted attributes).
    pub potentials: Vec<Vec<f64>>,
    /// Total mass.
    pub total: f64,
}

impl From<&GraphicalModel> for ModelFile {
    fn from(m: &GraphicalModel) -> Self {
        Self {
            sizes: m.sizes.clone(),
            cliques: m.potentials.iter().map(|p| p.attrs.clone()).collect(),
            potentials: m.potentials.iter().map(|p| p.values.clone()).collect(),
            total: m.total,
        }
    }
}

/// A model that does not fit its file or its domain (a damaged or foreign
/// model file: refit it, or sample with the domain it was fitted on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgmError {
    /// Cliques and potentials do not pair up.
    #[error("model: one potential per clique expected ({cliques} cliques, {potentials} potentials)")]
    PotentialCount {
        /// Cliques.
        cliques: usize,
        /// Potentials.
        potentials: usize,
    },
    /// A clique that is unsorted or names an attribute out of range.
    #[error("model: bad clique {0:?}")]
    BadClique(Vec<usize>),
    /// A potential of the wrong size.
    #[error("model: clique {clique:?} has {values} values, expected {expected}")]
    CliqueSize {
        /// The clique.
        clique: Vec<usize>,
        /// Values in the file.
        values: usize,
        /// Cells of the clique.
        expected: usize,
    },
    /// The model's attribute sizes differ from the domain's.
    #[error(
        "model sizes {model:?} do not match the domain's cardinalities {domain:?}; sample with the domain the model \
         was fitted on"
    )]
    SizeMismatch {
        /// The model's sizes.
        model: Vec<usize>,
        /// The domain's cardinalities.
        domain: Vec<usize>,
    },
    /// The sampling plan is inconsistent (a bug).
    #[error(transparent)]
    Plan(#[from] dpflow_udfs::synth::PlanError),
}

impl ModelFile {
    /// Rebuilds the model (checks shapes).
    pub fn into_model(self) -> Result<GraphicalModel, PgmError> {
        if self.cliques.len() != self.potentials.len() {
            return Err(PgmError::PotentialCount { cliques: self.cliques.len(), potentials: self.potentials.len() });
        }
        let mut potentials = Vec::new();
        for (c, v) in self.cliques.iter().zip(self.potentials) {
            if c.windows(2).any(|w| w[0] >= w[1]) || c.iter().any(|&a| a >= self.sizes.len()) {
                return Err(PgmError::BadClique(c.clone()));
            }
            let f = Factor::zeros(c, &self.sizes);
            if f.len() != v.len() {
                return Err(PgmError::CliqueSize { clique: c.clone(), values: v.len(), expected: f.len() });
            }
            potentials.push(Factor { values: v, ..f });
        }
        let jtree = JunctionTree::build(&self.sizes, &self.cliques);
        Ok(GraphicalModel { sizes: self.sizes, potentials, total: self.total, jtree })
    }
}
