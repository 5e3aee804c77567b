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
//! propagation, two passes of the same size and two triangular solves,
//! with no joint marginal of a pair of scopes.
//!
//! π_s keeps the walls and the flat sides (they live in μ(θ)), so NUTS's
//! trees are as long as on the exact posterior; only each step is cheaper.
//! Where π_s and the exact posterior differ (C(θ) away from the mode, the
//! log-determinant's slope) the importance weights π/π_s correct the draws;
//! the Pareto k̂ of those weights says whether the correction is reliable.

use faer::linalg::solvers::SolveCore;
use nalgebra::{DMatrix, DVector};

use super::NapsuError;
use super::laplace::LogDensity;
use super::likelihood::Posterior;
use super::moments::MaxEnt;
use crate::pgm::factor::Factor;
use crate::pgm::model::{Beliefs, GraphicalModel, tree_order};

/// π_s: the posterior with the likelihood's covariance frozen at a point.
pub struct FixedCovariance<'a> {
    post: &'a Posterior,
    /// Cholesky factor of C₀.
    llt: faer::linalg::solvers::Llt<f64>,
    /// log det C₀.
    log_det: f64,
    /// The model template (its junction tree is built once).
    template: GraphicalModel,
    walk: TreeWalk,
    feature_map: DMatrix<f64>,
}

/// The junction tree's traversal and where each query scope lives.
struct TreeWalk {
    /// Cliques, parents before children.
    order: Vec<usize>,
    parent: Vec<Option<usize>>,
    /// Separator of each clique with its parent (sorted attributes).
    sep: Vec<Vec<usize>>,
    /// The clique holding each query scope.
    home: Vec<usize>,
}

impl<'a> FixedCovariance<'a> {
    /// π_s for `post` with C frozen at `at` (the Laplace mode).
    pub fn new(post: &'a Posterior, at: &[f64]) -> Result<Self, NapsuError> {
        let (llt, log_det) = post.covariance_factor(at)?;
        let me = &post.me;
        let template = me.model(&vec![0.0; me.features.len]);
        let jt = &template.jtree;
        let (order, parent) = tree_order(jt);
        let sep = (0..jt.cliques.len())
            .map(|i| parent[i].map_or_else(Vec::new, |p| intersect(&jt.cliques[i], &jt.cliques[p])))
            .collect();
        let home = me
            .features
            .scopes
            .iter()
            .map(|s| {
                jt.clique_containing(s)
                    .ok_or_else(|| NapsuError::Numerical("a query scope is in no clique of its junction tree".into()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            post,
            llt,
            log_det,
            template,
            walk: TreeWalk { order, parent, sep, home },
            feature_map: me.feature_map(),
        })
    }

    fn me(&self) -> &MaxEnt {
        &self.post.me
    }

    /// Calibrated beliefs of p(x | θ) and μ(θ).
    fn beliefs(&self, theta: &[f64]) -> (Beliefs, DVector<f64>) {
        let me = self.me();
        let mut model = self.template.clone();
        me.fill_potentials(&mut model, theta);
        let beliefs = model.beliefs();
        let mut mu = DVector::zeros(me.width);
        for (k, s) in me.features.scopes.iter().enumerate() {
            let m = beliefs.cliques[self.walk.home[k]].sum_to(s);
            mu.rows_mut(me.offsets[k], m.len()).copy_from_slice(&m.values);
        }
        (beliefs, mu)
    }

    /// log π_s(θ) and w = C₀⁻¹r.
    fn value_parts(&self, theta: &[f64], mu: &DVector<f64>) -> (f64, DVector<f64>) {
        let p = self.post;
        let r = &p.stats - mu * p.n;
        let mut w = faer::Mat::from_fn(r.len(), 1, |i, _| r[i]);
        self.llt.solve_in_place_with_conj(faer::Conj::No, w.as_mut());
        let w = DVector::from_fn(r.len(), |i, _| w[(i, 0)]);
        let tau2 = p.prior_sd * p.prior_sd;
        let lp = -0.5 * self.log_det - 0.5 * r.dot(&w) - theta.iter().map(|t| t * t).sum::<f64>() / (2.0 * tau2);
        (lp, w)
    }

    /// Σ(θ)·v for any v over the query cells, from calibrated beliefs:
    /// block k is Σ_{x ∖ S_k} p(x)(E[f | x] − E f) with f = vᵀa(x).
    fn sigma_times(&self, beliefs: &Beliefs, v: &DVector<f64>) -> DVector<f64> {
        let me = self.me();
        let f = &me.features;
        let jt = &beliefs.jtree;
        let mut tables: Vec<Factor> = jt.cliques.iter().map(|c| Factor::zeros(c, &f.sizes)).collect();
        for (k, s) in f.scopes.iter().enumerate() {
            let shape: Vec<usize> = s.iter().map(|&a| f.sizes[a]).collect();
            let len: usize = shape.iter().product();
            let block =
                Factor { attrs: s.clone(), shape, values: v.rows(me.offsets[k], len).iter().copied().collect() };
            tables[self.walk.home[k]].add_assign_sub(&block);
        }
        let cond = conditional_expectations(&beliefs.cliques, tables, &self.walk, &f.sizes);
        let mut out = DVector::zeros(me.width);
        for (k, s) in f.scopes.iter().enumerate() {
            let h = self.walk.home[k];
            let p = &beliefs.cliques[h];
            let mean: f64 = p.values.iter().zip(&cond[h].values).map(|(p, e)| p * e).sum();
            let mut d = cond[h].clone();
            d.values.iter_mut().zip(&p.values).for_each(|(e, p)| *e = p * (*e - mean));
            let block = d.sum_to(s);
            out.rows_mut(me.offsets[k], block.len()).copy_from_slice(&block.values);
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
        let cov = &self.feature_map * self.sigma_times(&beliefs, &w);
        let p = self.post;
        let tau2 = p.prior_sd * p.prior_sd;
        Ok((lp, cov.iter().zip(theta).map(|(c, t)| p.n * c - t / tau2).collect()))
    }
}

/// E[f | x_C] for every clique C of a calibrated junction tree, where f is
/// the sum of the clique tables `f` (each over its clique's attributes) and
/// `p` the cliques' calibrated marginals.
///
/// Given a separator, the two sides of its edge are independent, so with
/// U_i = f_i + Σ_{children c} g_c and g_i(x_S) = E[U_i | x_S] (upward, leaves
/// first), E[f | x_{C_i}] = U_i + E[E[f | x_{C_p}] − g_i | x_{S_i}] (downward,
/// root first; the root's is U_root). Conditionals given a separator value of
/// probability 0 are set to 0: they are multiplied by that probability
/// wherever they are used.
fn conditional_expectations(p: &[Factor], f: Vec<Factor>, walk: &TreeWalk, sizes: &[usize]) -> Vec<Factor> {
    let conditional = |prob: &Factor, table: &Factor, sep: &[usize]| -> Factor {
        let mut num = prob.product_sum_to(table, sep, sizes);
        num.div_assign_sub(&prob.sum_to(sep));
        num
    };
    let mut up = f;
    let mut g: Vec<Option<Factor>> = vec![None; up.len()];
    for &i in walk.order.iter().rev() {
        if let Some(parent) = walk.parent[i] {
            let gi = conditional(&p[i], &up[i], &walk.sep[i]);
            up[parent].add_assign_sub(&gi);
            g[i] = Some(gi);
        }
    }
    // Downward: `up` becomes E[f | x_C] in place, parents first.
    for &i in &walk.order {
        let (Some(parent), Some(gi)) = (walk.parent[i], g[i].as_ref()) else { continue };
        let mut above = conditional(&p[parent], &up[parent], &walk.sep[i]);
        above.sub_assign_sub(gi);
        up[i].add_assign_sub(&above);
    }
    up
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
