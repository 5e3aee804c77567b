//! Graphical models in log space and exact belief propagation (sum-product on
//! a junction tree, 001 §2.3; NOTES §3).

use rayon::prelude::*;
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

/// Work (in cells) below which a level of messages runs on the calling thread:
/// rayon's hand-off costs a few microseconds, more than small factors take.
/// Unit tests send every level through rayon, so the brute-force checks of
/// this module cover the parallel path.
const PARALLEL_CELLS: usize = if cfg!(test) { 1 } else { 1 << 14 };

/// `f` over `items`, in parallel when `cost` (cells touched) is large enough;
/// the results come back in the order of `items` either way.
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], cost: usize, f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    if items.len() > 1 && cost >= PARALLEL_CELLS {
        items.par_iter().map(f).collect()
    } else {
        items.iter().map(f).collect()
    }
}

/// [`par_map`] for owned items (each moved into `f`), in parallel when
/// `cost` is large enough; the results come back in the order of `items`.
fn par_map_owned<T: Send, R: Send>(items: Vec<T>, cost: usize, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
    if items.len() > 1 && cost >= PARALLEL_CELLS {
        items.into_par_iter().map(f).collect()
    } else {
        items.into_iter().map(f).collect()
    }
}

/// Sum-product belief propagation. `log_potentials[i]` is over
/// `jt.cliques[i]`. Returns normalised clique marginals with mass `total`.
///
/// Collect runs leaves to root. A clique's log-belief ψ_C (its potential
/// plus its children's messages) is turned, in place, into e_C(x) =
/// exp(ψ_C(x) − max_S(x_S)), where max_S is the largest log-belief among the
/// cells that share x's separator value, and the message up is
/// m_{C→P}(s) = max_S(s) + ln s_C(s) with s_C(s) = Σ_{x_S = s} e_C(x).
/// Distribute runs on probabilities, the Hugin way: the root is
/// exponentiated and normalised, and a child's counts are its conditional
/// given the separator times its parent's final separator marginal,
/// μ_C(x) = e_C(x) / s_C(x_S) · μ_P(x_S). So every cell costs one `exp`,
/// taken in collect. Relative to its own slice's maximum a cell underflows
/// only where its conditional probability given the separator is below
/// 1e-308 (it becomes exactly 0), whatever the parent sends down.
///
/// Messages go level by level (deepest cliques first, then root first): the
/// messages of one level are independent, so they are computed in parallel
/// when the level is big enough to pay for it, and then added into their
/// targets in a fixed order. The result therefore does not depend on the
/// number of threads.
///
/// `log_potentials` is consumed: each clique's table becomes its belief and
/// then its counts in place (issue 19: no clique-sized copies per call).
pub fn belief_propagation(jt: &JunctionTree, log_potentials: Vec<Factor>, total: f64) -> Vec<Factor> {
    let n = jt.cliques.len();
    let (order, parent) = tree_order(jt);
    let mut depth = vec![0usize; n];
    for &i in &order {
        if let Some(p) = parent[i] {
            depth[i] = depth[p] + 1;
        }
    }
    let mut levels: Vec<Vec<usize>> = vec![Vec::new(); depth.iter().max().map_or(0, |d| d + 1)];
    for &i in &order {
        levels[depth[i]].push(i);
    }
    let seps: Vec<Vec<usize>> =
        (0..n).map(|i| parent[i].map_or_else(Vec::new, |p| intersect(&jt.cliques[i], &jt.cliques[p]))).collect();
    let mut tables: Vec<Factor> = log_potentials;
    // slice_sums[i]: the sums s_j of clique i's exponentials per separator
    // value, once collect has turned its table into them.
    let mut slice_sums: Vec<Vec<f64>> = vec![Vec::new(); n];
    // Collect: leaves to root, a level at a time (a level's log-beliefs are
    // final once every deeper level has sent its messages). Each clique's
    // table becomes its exponentials relative to each separator slice's max,
    // and its message is the log of their sums.
    for level in levels.iter().skip(1).rev() {
        let cost: usize = level.iter().map(|&i| tables[i].len()).sum();
        let taken: Vec<(usize, Factor)> = level.iter().map(|&i| (i, std::mem::take(&mut tables[i]))).collect();
        let collect_one = |(i, mut f): (usize, Factor)| {
            let (msg, sums) = f.exp_slices_to(&seps[i]);
            (i, f, msg, sums)
        };
        for (i, f, msg, sums) in par_map_owned(taken, cost, collect_one) {
            let p = parent[i].expect("below the root");
            tables[p].add_assign_sub(&msg);
            tables[i] = f;
            slice_sums[i] = sums;
        }
    }
    // Distribute: root first. A root's log-belief is final after collect
    // and becomes counts (normalised per root, so each component of a forest
    // gets mass `total`). A child's counts are its conditional given the
    // separator times its parent's separator marginal (Hugin):
    // μ_C(x) = e_C(x) / s_C(x_S) · μ_P(x_S), with no further `exp`.
    for (d, level) in levels.iter().enumerate() {
        let cost: usize = level.iter().map(|&i| tables[i].len()).sum();
        if d == 0 {
            let taken: Vec<Factor> = level.iter().map(|&i| std::mem::take(&mut tables[i])).collect();
            for (&i, c) in level.iter().zip(par_map_owned(taken, cost, |f| to_counts(f, total))) {
                tables[i] = c;
            }
            continue;
        }
        let ratios = par_map(level, cost, |&i| {
            let p = parent[i].expect("below the root");
            let mut r = tables[p].sum_to(&seps[i]);
            r.values.iter_mut().zip(&slice_sums[i]).for_each(|(x, s)| *x = if *s > 0.0 { *x / s } else { 0.0 });
            r
        });
        for (&i, r) in level.iter().zip(ratios) {
            tables[i].mul_assign_sub(&r);
        }
    }
    tables
}

/// exp(values), normalised to sum to `total` (one `exp` per cell), in
/// place. The `exp` and the scaling of a large factor run on rayon; the max
/// and the sum stay sequential, so the bits do not depend on the threads.
fn to_counts(mut log: Factor, total: f64) -> Factor {
    let max = log.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        log.values.iter_mut().for_each(|v| *v = 0.0);
        return log;
    }
    let split = log.values.len() >= EXP_SPLIT_CELLS;
    if split {
        log.values.par_iter_mut().for_each(|v| *v = (*v - max).exp());
    } else {
        log.values.iter_mut().for_each(|v| *v = (*v - max).exp());
    }
    let scale = total / log.values.iter().sum::<f64>();
    if split {
        log.values.par_iter_mut().for_each(|v| *v *= scale);
    } else {
        log.values.iter_mut().for_each(|v| *v *= scale);
    }
    log
}

/// Cells from which [`to_counts`] runs its `exp` on rayon (all in unit tests).
const EXP_SPLIT_CELLS: usize = if cfg!(test) { 1 } else { 1 << 15 };

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
        let cliques = belief_propagation(&self.jtree, self.clique_potentials(), self.total);
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
        self.marginal_any_cached(attrs, sizes, None)
    }

    /// [`Beliefs::marginal_any`], sharing the messages it computes with other
    /// marginals of the same beliefs through `cache` (AIM scores thousands of
    /// candidates on one model; most share their messages). The result has
    /// the same bits with or without the cache.
    pub fn marginal_any_cached(&self, attrs: &[usize], sizes: &[usize], cache: Option<&MessageCache>) -> Factor {
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
        // Any terminal can be the root. The work (cells visited) depends on the
        // choice, by orders of magnitude when far-apart attributes would be
        // carried across big cliques, so every terminal is planned
        // symbolically and the cheapest runs.
        let plan = |root: usize| {
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
            (order, parent)
        };
        let (_, root) = (0..n)
            .filter(|&i| terminal[i])
            .map(|root| {
                let (order, parent) = plan(root);
                (self.elimination_cost(attrs, sizes, &order, &parent), root)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("a terminal");
        self.contract(root, None, attrs, sizes, cache)
    }

    /// The marginal of the attributes `want` (sorted) found in clique `i` and
    /// beyond it, away from its neighbour `towards`: at the root (`towards`
    /// = `None`) the marginal over `want`; otherwise the message
    /// μ(S ∪ want) / μ(S) over the separator S with `towards`, which is the
    /// conditional of `want` given S and so does not depend on which
    /// marginal asked for it (it is kept in `cache` under (i, towards, want)).
    ///
    /// A neighbour is visited only if an attribute of `want` lies beyond it
    /// and not in clique `i` (by the running intersection, such an attribute
    /// lies beyond exactly one neighbour). The clique is first summed down to
    /// what is still needed, then contracted with each incoming message in
    /// neighbour order by fused product-sums, so memory stays at the size of
    /// the messages, never clique × `want`. The computation depends only on
    /// (i, towards, want): a cached message has the bits it would have if
    /// computed again.
    fn contract(
        &self,
        i: usize,
        towards: Option<usize>,
        want: &[usize],
        sizes: &[usize],
        cache: Option<&MessageCache>,
    ) -> Factor {
        let jt = &self.jtree;
        let clique = &jt.cliques[i];
        let sep: Vec<usize> = towards.map_or_else(Vec::new, |p| intersect(clique, &jt.cliques[p]));
        let outside: Vec<usize> = want.iter().copied().filter(|a| !clique.contains(a)).collect();
        let mut incoming: Vec<std::sync::Arc<Factor>> = Vec::new();
        if !outside.is_empty() {
            for c in jt.neighbours_of(i) {
                if Some(c) == towards {
                    continue;
                }
                let beyond = jt.attributes_beyond(c, i);
                let carried: Vec<usize> = outside.iter().copied().filter(|a| beyond.contains(a)).collect();
                if carried.is_empty() {
                    continue;
                }
                incoming.push(self.message(c, i, &carried, sizes, cache));
            }
        }
        let wanted = |a: &usize, rest: &[std::sync::Arc<Factor>]| {
            sep.contains(a) || want.contains(a) || rest.iter().any(|m| m.attrs.contains(a))
        };
        let pre: Vec<usize> = clique.iter().copied().filter(|a| wanted(a, &incoming)).collect();
        let mut cur = self.cliques[i].sum_to(&pre);
        for (k, m) in incoming.iter().enumerate() {
            let rest = &incoming[k + 1..];
            let mut union: Vec<usize> = cur.attrs.iter().chain(&m.attrs).copied().collect();
            union.sort_unstable();
            union.dedup();
            let keep: Vec<usize> = union.into_iter().filter(|a| wanted(a, rest)).collect();
            cur = cur.product_sum_to(m, &keep, sizes);
        }
        match towards {
            None => {
                if cur.attrs == want {
                    cur
                } else {
                    cur.sum_to(want)
                }
            }
            Some(p) => {
                let sep_belief = self.cliques[p].sum_to(&sep);
                cur.div_assign_sub(&sep_belief);
                cur
            }
        }
    }

    /// The message from clique `i` to its neighbour `to` carrying `want`
    /// (see [`Beliefs::contract`]), from `cache` when it holds it.
    fn message(
        &self,
        i: usize,
        to: usize,
        want: &[usize],
        sizes: &[usize],
        cache: Option<&MessageCache>,
    ) -> std::sync::Arc<Factor> {
        let key = (i, to, want.to_vec());
        if let Some(hit) = cache.and_then(|c| c.get(&key)) {
            return hit;
        }
        let m = std::sync::Arc::new(self.contract(i, Some(to), want, sizes, cache));
        if let Some(c) = cache {
            c.put(key, &m);
        }
        m
    }

    /// The cells that variable elimination towards `order[0]` over the
    /// subtree in `order` (DFS order, `parent` links) visits, planned
    /// symbolically: each clique, summed down to what is still needed, then
    /// contracted with its incoming messages one at a time (the plan of
    /// [`Beliefs::contract`], which visits at most this subtree).
    fn elimination_cost(&self, attrs: &[usize], sizes: &[usize], order: &[usize], parent: &[usize]) -> f64 {
        let jt = &self.jtree;
        let root = order[0];
        let cells = |a: &[usize]| a.iter().map(|&x| sizes[x] as f64).product::<f64>();
        let mut cost = 0.0;
        // The attributes of each clique's incoming messages.
        let mut msgs: Vec<Vec<Vec<usize>>> = vec![Vec::new(); jt.cliques.len()];
        for &i in order.iter().rev() {
            let incoming = std::mem::take(&mut msgs[i]);
            let sep: Vec<usize> =
                if i == root { Vec::new() } else { intersect(&jt.cliques[i], &jt.cliques[parent[i]]) };
            let wanted = |a: &usize, rest: &[Vec<usize>]| {
                sep.contains(a) || attrs.contains(a) || rest.iter().any(|m| m.contains(a))
            };
            let mut cur: Vec<usize> = jt.cliques[i].iter().copied().filter(|a| wanted(a, &incoming)).collect();
            cost += cells(&jt.cliques[i]);
            for (k, m) in incoming.iter().enumerate() {
                let mut union: Vec<usize> = cur.iter().chain(m).copied().collect();
                union.sort_unstable();
                union.dedup();
                cost += cells(&union);
                cur = union.into_iter().filter(|a| wanted(a, &incoming[k + 1..])).collect();
            }
            if i == root {
                return cost;
            }
            msgs[parent[i]].push(cur);
        }
        unreachable!("the root returns")
    }
}

/// A message's key: (from clique, to clique, the attributes it carries).
type MessageKey = (usize, usize, Vec<usize>);

/// Messages of one calibrated junction tree, shared by the out-of-clique
/// marginals asked of it ([`Beliefs::marginal_any_cached`]), up to a byte
/// budget (past it, messages are computed and not kept). Valid for one set
/// of beliefs only: make a new cache when the model changes.
pub struct MessageCache {
    map: parking_lot::Mutex<std::collections::HashMap<MessageKey, std::sync::Arc<Factor>>>,
    bytes: std::sync::atomic::AtomicUsize,
    budget: usize,
}

impl MessageCache {
    /// An empty cache that keeps at most `budget` bytes of messages.
    pub fn new(budget: usize) -> Self {
        Self { map: Default::default(), bytes: Default::default(), budget }
    }

    /// The budget of [`MessageCache::default`]: 256 MB.
    pub const DEFAULT_BUDGET: usize = 256 << 20;

    fn get(&self, key: &MessageKey) -> Option<std::sync::Arc<Factor>> {
        self.map.lock().get(key).cloned()
    }

    fn put(&self, key: MessageKey, m: &std::sync::Arc<Factor>) {
        use std::sync::atomic::Ordering;
        let size = m.len() * std::mem::size_of::<f64>();
        if self.bytes.fetch_add(size, Ordering::Relaxed) + size > self.budget {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            return;
        }
        self.map.lock().entry(key).or_insert_with(|| m.clone());
    }
}

impl Default for MessageCache {
    /// An empty cache with [`MessageCache::DEFAULT_BUDGET`].
    fn default() -> Self {
        Self::new(Self::DEFAULT_BUDGET)
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
