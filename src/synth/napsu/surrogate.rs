//! A cheap stand-in for NAPSU-MQ's posterior that NUTS runs on, corrected
//! to the exact posterior by importance weights ([`super::importance`]).
//!
//! **Why.** The exact log-posterior ([`super::likelihood`]) has the
//! covariance C(θ) = nΣ(θ) + σ²I inside the likelihood, and its gradient
//! needs ∂Σ/∂θ: a belief propagation per pair of query scopes (66 for
//! Adult's twelve queries, 8.6 ms). NUTS on Adult needs about 350 gradients
//! per iteration (the rare cells' walls force a small step:
//! `benches/results/napsu/twinify.md`), so 003's 4 × 2,800 iterations cost
//! hours. The walls come from the mean n·μ(θ), not from C(θ).
//!
//! **The surrogate.** C is frozen at the Laplace mode θ̂:
//!
//!   log π_s(θ) = −½ log det C₀ − ½ rᵀC₀⁻¹r − ‖θ‖²/(2τ²),
//!   r = s̃ − n·μ(θ), C₀ = nΣ(θ̂) + σ²I,
//!
//! and its gradient is exact: ∇ log π_s = n·Cov(wᵀa, c) − θ/τ² with
//! w = C₀⁻¹r. Writing f(x) = wᵀa(x) = Σ_k w_k(x_{S_k}) (one table per
//! query scope), Cov(f, c) = B·Σ(θ)w (c = B·a, [`MaxEnt::feature_map`]), and
//! the block k of Σ(θ)w is Σ_{x ∖ S_k} p(x)(E[f | x_{S_k}] − E f): the
//! conditional expectation of an additive function at every clique of the
//! junction tree, which two passes over the calibrated tree give
//! (`conditional_expectations`). So a gradient costs one belief
//! propagation, two passes of the same size and two triangular products,
//! with no joint marginal of a pair of scopes.
//!
//! π_s keeps the walls and the flat sides (they live in μ(θ)), so NUTS's
//! trees are as long as on the exact posterior; only each step is cheaper.
//! Where π_s and the exact posterior differ (C(θ) away from the mode, the
//! log-determinant's slope) the importance weights π/π_s correct the draws;
//! the Pareto k̂ of those weights says whether the correction is reliable.

use nalgebra::{DMatrix, DVector};

use super::NapsuError;
use super::laplace::LogDensity;
use super::likelihood::Posterior;
use super::moments::MaxEnt;
use super::packed::PackedLower;
use crate::pgm::factor::strides;
use crate::pgm::jtree::JunctionTree;
use crate::pgm::model::tree_order;

/// π_s: the posterior with the likelihood's covariance frozen at a point.
pub struct FixedCovariance<'a> {
    post: &'a Posterior,
    /// W = L⁻¹ for C₀ = LLᵀ: C₀⁻¹r = Wᵀ(W r) by two packed products, which
    /// took a fraction of faer's two triangular solves per step ([`PackedLower`]).
    inv_factor: PackedLower,
    /// log det C₀.
    log_det: f64,
    plan: Plan,
    feature_map: SparseRows,
}

/// B (canonical features × query cells) by rows, nonzeros only: a feature
/// touches the few cells that agree with it, so the dense product spent a
/// fifth of a NUTS step on Adult-reduced reading zeros (`perf`).
struct SparseRows {
    /// Row i's entries are `starts[i]..starts[i + 1]`.
    starts: Vec<usize>,
    cols: Vec<usize>,
    values: Vec<f64>,
}

impl SparseRows {
    fn new(dense: &DMatrix<f64>) -> Self {
        let (mut starts, mut cols, mut values) = (vec![0], Vec::new(), Vec::new());
        for i in 0..dense.nrows() {
            for j in 0..dense.ncols() {
                let v = dense[(i, j)];
                if v != 0.0 {
                    cols.push(j);
                    values.push(v);
                }
            }
            starts.push(cols.len());
        }
        Self { starts, cols, values }
    }

    /// B v.
    fn times(&self, v: &DVector<f64>) -> Vec<f64> {
        self.starts.windows(2).map(|r| (r[0]..r[1]).map(|k| self.values[k] * v[self.cols[k]]).sum()).collect()
    }
}

/// The junction tree of p(x | θ) compiled to index maps, so that a gradient
/// runs over flat arrays: no factor algebra, no attribute matching and a
/// few allocations per call (the factor operations spent most of a small
/// model's gradient allocating and comparing attribute lists).
struct Plan {
    /// Cliques, parents before children.
    order: Vec<usize>,
    parent: Vec<Option<usize>>,
    /// Cells of each clique.
    len: Vec<usize>,
    /// Each clique's cell → its separator cell with its parent (roots: empty).
    to_sep: Vec<Vec<usize>>,
    /// The parent's cell → the same separator's cell (roots: empty).
    parent_to_sep: Vec<Vec<usize>>,
    /// Cells of each separator.
    sep_len: Vec<usize>,
    /// The clique holding each query scope, and its cell → the scope's cell.
    home: Vec<usize>,
    to_scope: Vec<Vec<usize>>,
    /// Log-potential terms of each clique: (cell, feature) with θ_feature
    /// added at that cell (the canonical parametrisation, 003 App. C).
    terms: Vec<Vec<(usize, usize)>>,
}

impl Plan {
    fn new(me: &MaxEnt) -> Result<Self, NapsuError> {
        let f = &me.features;
        let jt = JunctionTree::build(&f.sizes, &f.scopes);
        let (order, parent) = tree_order(&jt);
        let cliques = &jt.cliques;
        let cells = |attrs: &[usize]| attrs.iter().map(|&a| f.sizes[a]).product::<usize>();
        let mut to_sep = Vec::with_capacity(cliques.len());
        let mut parent_to_sep = Vec::with_capacity(cliques.len());
        let mut sep_len = Vec::with_capacity(cliques.len());
        for (i, c) in cliques.iter().enumerate() {
            match parent[i] {
                Some(p) => {
                    let sep = intersect(c, &cliques[p]);
                    to_sep.push(project(c, &sep, &f.sizes));
                    parent_to_sep.push(project(&cliques[p], &sep, &f.sizes));
                    sep_len.push(cells(&sep));
                }
                None => {
                    to_sep.push(Vec::new());
                    parent_to_sep.push(Vec::new());
                    sep_len.push(1);
                }
            }
        }
        let home: Vec<usize> = f
            .scopes
            .iter()
            .map(|s| {
                jt.clique_containing(s)
                    .ok_or_else(|| NapsuError::Numerical("a query scope is in no clique of its junction tree".into()))
            })
            .collect::<Result<_, _>>()?;
        let to_scope = f.scopes.iter().zip(&home).map(|(s, &h)| project(&cliques[h], s, &f.sizes)).collect();
        let mut terms = vec![Vec::new(); cliques.len()];
        for (i, t) in f.subsets.iter().enumerate() {
            let h = home[f.home[i]];
            for (cell, sub) in project(&cliques[h], t, &f.sizes).into_iter().enumerate() {
                // Only assignments without a 0 carry θ.
                if let Some(j) = f.feature_at(i, sub) {
                    terms[h].push((cell, j));
                }
            }
        }
        Ok(Plan {
            order,
            parent,
            len: cliques.iter().map(|c| cells(c)).collect(),
            to_sep,
            parent_to_sep,
            sep_len,
            home,
            to_scope,
            terms,
        })
    }

    /// Calibrated clique marginals of p(x | θ) (each component of a forest
    /// sums to 1): sum–product in log space, leaves to root, then each child
    /// is its conditional given the separator times its parent's separator
    /// marginal (Hugin; Koller & Friedman §10.2).
    fn beliefs(&self, theta: &[f64]) -> Vec<Vec<f64>> {
        let mut psi: Vec<Vec<f64>> = self.len.iter().map(|&l| vec![0.0; l]).collect();
        for (table, terms) in psi.iter_mut().zip(&self.terms) {
            for &(cell, j) in terms {
                table[cell] += theta[j];
            }
        }
        // Collect: each clique's message is log Σ exp over its separator slices.
        let mut msg: Vec<Vec<f64>> = vec![Vec::new(); psi.len()];
        for &i in self.order.iter().rev() {
            let Some(p) = self.parent[i] else { continue };
            let m = log_sum_exp_to(&psi[i], &self.to_sep[i], self.sep_len[i]);
            for (v, &k) in psi[p].iter_mut().zip(&self.parent_to_sep[i]) {
                *v += m[k];
            }
            msg[i] = m;
        }
        // Distribute, parents first.
        for &i in &self.order {
            match self.parent[i] {
                None => {
                    let max = psi[i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    psi[i].iter_mut().for_each(|v| *v = (*v - max).exp());
                    let total: f64 = psi[i].iter().sum();
                    psi[i].iter_mut().for_each(|v| *v /= total);
                }
                Some(p) => {
                    let above = sum_to(&psi[p], &self.parent_to_sep[i], self.sep_len[i]);
                    let (m, to) = (&msg[i], &self.to_sep[i]);
                    for (v, &k) in psi[i].iter_mut().zip(to) {
                        *v = (*v - m[k]).exp() * above[k];
                    }
                }
            }
        }
        psi
    }

    /// E[f | x_C] for every clique C, where f = Σ_C `tables`[C] and `p` are
    /// calibrated marginals. Given a separator the two sides of its edge are
    /// independent, so with U_i = f_i + Σ_{children c} g_c and
    /// g_i(x_S) = E[U_i | x_S] (upward, leaves first),
    /// E[f | x_{C_i}] = U_i + E[E[f | x_{C_p}] − g_i | x_{S_i}] (downward,
    /// root first; the root's is U_root). Conditionals given a separator
    /// value of probability 0 are set to 0: they are multiplied by that
    /// probability wherever they are used.
    fn conditional_expectations(&self, p: &[Vec<f64>], mut up: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
        let conditional = |prob: &[f64], table: &[f64], to: &[usize], len: usize| -> Vec<f64> {
            let (mut num, mut den) = (vec![0.0; len], vec![0.0; len]);
            for ((&q, &t), &k) in prob.iter().zip(table).zip(to) {
                num[k] += q * t;
                den[k] += q;
            }
            num.iter_mut().zip(&den).for_each(|(x, d)| *x = if *d > 0.0 { *x / d } else { 0.0 });
            num
        };
        let mut g: Vec<Vec<f64>> = vec![Vec::new(); up.len()];
        for &i in self.order.iter().rev() {
            let Some(parent) = self.parent[i] else { continue };
            let gi = conditional(&p[i], &up[i], &self.to_sep[i], self.sep_len[i]);
            for (v, &k) in up[parent].iter_mut().zip(&self.parent_to_sep[i]) {
                *v += gi[k];
            }
            g[i] = gi;
        }
        for &i in &self.order {
            let Some(parent) = self.parent[i] else { continue };
            let mut above = conditional(&p[parent], &up[parent], &self.parent_to_sep[i], self.sep_len[i]);
            above.iter_mut().zip(&g[i]).for_each(|(a, b)| *a -= b);
            for (v, &k) in up[i].iter_mut().zip(&self.to_sep[i]) {
                *v += above[k];
            }
        }
        up
    }
}

/// The cell of `to` (a subset of `from`, both sorted attribute ids) that
/// each cell of `from` falls in; row-major, as [`crate::pgm::factor::Factor`].
fn project(from: &[usize], to: &[usize], sizes: &[usize]) -> Vec<usize> {
    let shape: Vec<usize> = from.iter().map(|&a| sizes[a]).collect();
    let to_strides = strides(&to.iter().map(|&a| sizes[a]).collect::<Vec<_>>());
    let step: Vec<usize> = from.iter().map(|a| to.iter().position(|b| b == a).map_or(0, |k| to_strides[k])).collect();
    let len: usize = shape.iter().product();
    let mut out = Vec::with_capacity(len);
    let (mut digit, mut at) = (vec![0usize; from.len()], 0usize);
    for _ in 0..len {
        out.push(at);
        for k in (0..from.len()).rev() {
            digit[k] += 1;
            at += step[k];
            if digit[k] < shape[k] {
                break;
            }
            at -= step[k] * shape[k];
            digit[k] = 0;
        }
    }
    out
}

/// Σ of `values` per target cell.
fn sum_to(values: &[f64], to: &[usize], len: usize) -> Vec<f64> {
    let mut out = vec![0.0; len];
    for (v, &k) in values.iter().zip(to) {
        out[k] += v;
    }
    out
}

/// log Σ exp of `values` per target cell (−∞ for a cell nothing falls in).
fn log_sum_exp_to(values: &[f64], to: &[usize], len: usize) -> Vec<f64> {
    let mut max = vec![f64::NEG_INFINITY; len];
    for (v, &k) in values.iter().zip(to) {
        max[k] = max[k].max(*v);
    }
    let mut sum = vec![0.0; len];
    for (v, &k) in values.iter().zip(to) {
        sum[k] += (v - max[k]).exp();
    }
    sum.iter().zip(&max).map(|(s, m)| m + s.ln()).collect()
}

impl<'a> FixedCovariance<'a> {
    /// π_s for `post` with C frozen at `at` (the Laplace mode).
    pub fn new(post: &'a Posterior, at: &[f64]) -> Result<Self, NapsuError> {
        let (llt, log_det) = post.covariance_factor(at)?;
        let inv_factor = PackedLower::inverse_of(llt.L()).ok_or_else(|| {
            NapsuError::Numerical(
                "the likelihood's covariance at the mode has a Cholesky factor that cannot be inverted; \
                 choose the laplace or nuts-exact inference (--inference, or the pipeline's inference key)"
                    .into(),
            )
        })?;
        let plan = Plan::new(&post.me)?;
        Ok(Self { post, inv_factor, log_det, plan, feature_map: SparseRows::new(&post.me.feature_map()) })
    }

    fn me(&self) -> &MaxEnt {
        &self.post.me
    }

    /// Calibrated clique marginals of p(x | θ) and μ(θ).
    fn beliefs(&self, theta: &[f64]) -> (Vec<Vec<f64>>, DVector<f64>) {
        let me = self.me();
        let beliefs = self.plan.beliefs(theta);
        let mut mu = DVector::zeros(me.width);
        for (k, to) in self.plan.to_scope.iter().enumerate() {
            let o = me.offsets[k];
            for (p, &c) in beliefs[self.plan.home[k]].iter().zip(to) {
                mu[o + c] += p;
            }
        }
        (beliefs, mu)
    }

    /// log π_s(θ) and w = C₀⁻¹r.
    fn value_parts(&self, theta: &[f64], mu: &DVector<f64>) -> (f64, DVector<f64>) {
        let p = self.post;
        let r = &p.stats - mu * p.n;
        // y = W r, rᵀC₀⁻¹r = ‖y‖², w = Wᵀ y.
        let mut y = vec![0.0; r.len()];
        self.inv_factor.add_times(r.as_slice(), &mut y);
        let mut w = DVector::zeros(r.len());
        self.inv_factor.transpose_times(&y, w.as_mut_slice());
        let tau2 = p.prior_sd * p.prior_sd;
        let quad: f64 = y.iter().map(|y| y * y).sum();
        let lp = -0.5 * self.log_det - 0.5 * quad - theta.iter().map(|t| t * t).sum::<f64>() / (2.0 * tau2);
        (lp, w)
    }

    /// Σ(θ)·v for any v over the query cells, from calibrated beliefs:
    /// block k is Σ_{x ∖ S_k} p(x)(E[f | x] − E f) with f = vᵀa(x).
    fn sigma_times(&self, beliefs: &[Vec<f64>], v: &DVector<f64>) -> DVector<f64> {
        let me = self.me();
        let plan = &self.plan;
        let mut tables: Vec<Vec<f64>> = plan.len.iter().map(|&l| vec![0.0; l]).collect();
        for (k, to) in plan.to_scope.iter().enumerate() {
            let o = me.offsets[k];
            for (t, &c) in tables[plan.home[k]].iter_mut().zip(to) {
                *t += v[o + c];
            }
        }
        let cond = plan.conditional_expectations(beliefs, tables);
        let mut out = DVector::zeros(me.width);
        for (k, to) in plan.to_scope.iter().enumerate() {
            let h = plan.home[k];
            let (p, e) = (&beliefs[h], &cond[h]);
            let mean: f64 = p.iter().zip(e).map(|(p, e)| p * e).sum();
            let o = me.offsets[k];
            for ((p, e), &c) in p.iter().zip(e).zip(to) {
                out[o + c] += p * (e - mean);
            }
        }
        out
    }
}

impl LogDensity for FixedCovariance<'_> {
    fn dim(&self) -> usize {
        self.post.dim()
    }

    fn value(&self, theta: &[f64]) -> Result<f64, NapsuError> {
        let (_, mu) = self.beliefs(theta);
        Ok(self.value_parts(theta, &mu).0)
    }

    fn value_and_gradient(&self, theta: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
        let (beliefs, mu) = self.beliefs(theta);
        let (lp, w) = self.value_parts(theta, &mu);
        let cov = self.feature_map.times(&self.sigma_times(&beliefs, &w));
        let p = self.post;
        let tau2 = p.prior_sd * p.prior_sd;
        Ok((lp, cov.iter().zip(theta).map(|(c, t)| p.n * c - t / tau2).collect()))
    }
}

fn intersect(a: &[usize], b: &[usize]) -> Vec<usize> {
    a.iter().filter(|x| b.contains(x)).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::napsu::CanonicalFeatures;
    use rand::{RngExt, SeedableRng};

    fn setup(sizes: &[usize], scopes: &[Vec<usize>], seed: u64) -> (Posterior, Vec<f64>, Vec<f64>) {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let me = MaxEnt::new(CanonicalFeatures::new(scopes, sizes, 10_000).unwrap());
        let truth: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let n = 500.0;
        let (mu, _) = me.moments(&truth);
        let stats: Vec<f64> = mu.iter().map(|m| m * n + rng.random_range(-5.0..5.0)).collect();
        let at: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-1.5..1.5)).collect();
        let frozen: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-1.0..1.0)).collect();
        (Posterior::new(me, stats, n, 3.0).unwrap(), at, frozen)
    }

    const CASES: [(&[usize], &[&[usize]]); 5] = [
        (&[2, 2, 2], &[&[0, 1], &[1, 2]]),
        (&[3, 2, 2, 3], &[&[0, 1], &[1, 2], &[2, 3], &[0, 3]]),
        (&[2, 3, 2], &[&[0, 1, 2], &[1]]),
        (&[3, 3], &[&[0], &[1]]),
        (&[2, 3, 2, 2, 3], &[&[0, 1], &[1, 2], &[3, 4], &[0, 2]]),
    ];

    fn scopes(s: &[&[usize]]) -> Vec<Vec<usize>> {
        s.iter().map(|x| x.to_vec()).collect()
    }

    /// A cell of a clique falls in the cell of a subset that has its digits
    /// of the subset's attributes (row-major, last attribute fastest).
    #[test]
    fn project_maps_each_cell_to_its_sub_assignment() {
        let sizes = [2, 3, 4];
        let from = [0, 1, 2];
        let to = [0, 2];
        let got = project(&from, &to, &sizes);
        let mut want = Vec::new();
        for a in 0..2 {
            for _b in 0..3 {
                for c in 0..4 {
                    want.push(a * 4 + c);
                }
            }
        }
        assert_eq!(got, want);
        assert_eq!(project(&from, &[], &sizes), vec![0; 24]);
        assert_eq!(project(&from, &from, &sizes), (0..24).collect::<Vec<_>>());
    }

    /// Σ(θ)v from the two passes equals Σ(θ) (itself checked against
    /// enumeration in `moments`) times v, forests included.
    #[test]
    fn two_passes_give_sigma_times_a_vector() {
        for (i, (sizes, sc)) in CASES.iter().enumerate() {
            let (post, theta, frozen) = setup(sizes, &scopes(sc), 10 + i as u64);
            let s = FixedCovariance::new(&post, &frozen).unwrap();
            let mut rng = rand::rngs::SmallRng::seed_from_u64(i as u64);
            let v = DVector::from_fn(post.me.width, |_, _| rng.random_range(-2.0..2.0));
            let (beliefs, mu) = s.beliefs(&theta);
            let (want_mu, sigma) = post.me.moments(&theta);
            assert!((&mu - &want_mu).amax() < 1e-12);
            let got = s.sigma_times(&beliefs, &v);
            let want = sigma * &v;
            assert!((&got - &want).amax() < 1e-12, "{sc:?}: {got} vs {want}");
        }
    }

    /// The value is the exact log-posterior's formula with C frozen, and at
    /// the freezing point both agree; the gradient equals central finite
    /// differences of the value.
    #[test]
    fn the_surrogate_is_the_exact_posterior_at_its_anchor_and_its_gradient_is_exact() {
        for (i, (sizes, sc)) in CASES.iter().enumerate() {
            let (post, theta, frozen) = setup(sizes, &scopes(sc), 20 + i as u64);
            let s = FixedCovariance::new(&post, &frozen).unwrap();
            let exact = post.log_density(&frozen).unwrap();
            let surrogate = s.value(&frozen).unwrap();
            // Both drop the same constant (−(width/2)·log 2π).
            assert!((exact - surrogate).abs() < 1e-9 * exact.abs().max(1.0), "{exact} vs {surrogate}");
            let (lp, grad) = s.value_and_gradient(&theta).unwrap();
            assert!((lp - s.value(&theta).unwrap()).abs() < 1e-12 * lp.abs().max(1.0));
            let h = 1e-5;
            for j in 0..theta.len() {
                let mut plus = theta.clone();
                plus[j] += h;
                let mut minus = theta.clone();
                minus[j] -= h;
                let fd = (s.value(&plus).unwrap() - s.value(&minus).unwrap()) / (2.0 * h);
                assert!((grad[j] - fd).abs() <= 1e-5 * fd.abs().max(1.0), "{sc:?} θ_{j}: {} vs {fd}", grad[j]);
            }
        }
    }
}
