//! NAPSU-MQ's log-posterior and its exact gradient (003 §4 eq. (5);
//! NOTES §6).
//!
//! log p(θ | s̃) = −½ log det C − ½ rᵀC⁻¹r − ‖θ‖²/(2τ²) + const, with
//! C = nΣ(θ) + σ²I, r = s̃ − nμ(θ) and the prior θ ~ N(0, τ²I), τ = 10.
//!
//! **Gradient.** The paper differentiates variable elimination with JAX. We
//! use the exponential family instead: ∂μ/∂θ_j = Cov(a, c_j) and
//! ∂Σ/∂θ_j = E[(a − μ)(a − μ)ᵀ(c_j − E c_j)], so with w = C⁻¹r and
//! M = C⁻¹ − wwᵀ,
//!
//!   ∂ log p / ∂θ_j = n · Cov(g, c_j) − θ_j/τ²,
//!   g(x) = wᵀa(x) − ½ (a(x) − μ)ᵀ M (a(x) − μ).
//!
//! Because a(x) is one-hot within each marginal, g is a function linear in
//! a(x) (the linear part and the diagonal of M's blocks: vᵀa(x)) plus
//! functions of pairs of scopes (q_kl = −M_kl on S_k ∪ S_l). The linear part
//! needs no inference: c(x) = B·a(x) ([`MaxEnt::feature_map`]), so
//! Cov(vᵀa, c) = BΣ(θ)v. For a positive function f̃ = f + δ on a set U,
//! Cov(f, c) = E[f̃] · (E_p̃(c) − E_p(c)), where p̃ is the model tilted by f̃
//! (one more potential, on U), so each pair costs one belief propagation,
//! K(K − 1)/2 in all, on a junction tree extended by the pair's union
//! (built once). Checked against central finite differences.
//!
//! C's Cholesky factor and inverse come from `faer` (blocked; nalgebra's
//! column-by-column inverse was most of a gradient's time at Adult's width).

use faer::linalg::solvers::{DenseSolveCore, SolveCore};
use nalgebra::{DMatrix, DVector};

use super::NapsuError;
use super::moments::{MaxEnt, Moments};
use crate::pgm::factor::{Factor, for_each_triple, strides};
use crate::pgm::jtree::JunctionTree;
use crate::pgm::model::{Beliefs, GraphicalModel};

/// The prior's standard deviation τ (003 App. D).
pub const PRIOR_SD: f64 = 10.0;

/// The posterior of θ given the noisy statistics.
#[derive(Debug, Clone)]
pub struct Posterior {
    /// The model.
    pub me: MaxEnt,
    /// The noisy statistics s̃ (length `me.width`).
    pub stats: DVector<f64>,
    /// The number of records n (public, or from the noisy statistics).
    pub n: f64,
    /// The Gaussian noise's standard deviation σ.
    pub sigma: f64,
    /// The prior's standard deviation τ.
    pub prior_sd: f64,
    /// For each pair k < l: a junction tree over the scopes and S_k ∪ S_l.
    extended: Vec<JunctionTree>,
    /// c(x) = B·a(x) ([`MaxEnt::feature_map`]).
    feature_map: DMatrix<f64>,
}

impl Posterior {
    /// The posterior of `me`'s θ given `stats` from `n` records with noise σ.
    pub fn new(me: MaxEnt, stats: Vec<f64>, n: f64, sigma: f64) -> Result<Self, NapsuError> {
        if stats.len() != me.width {
            return Err(NapsuError::Query(format!(
                "{} noisy statistics for queries of width {}",
                stats.len(),
                me.width
            )));
        }
        if !(n > 0.0 && n.is_finite() && sigma > 0.0 && sigma.is_finite()) {
            return Err(NapsuError::Query(format!("n = {n} and σ = {sigma} must be positive and finite")));
        }
        let f = &me.features;
        let mut extended = Vec::new();
        for k in 0..f.scopes.len() {
            for l in k + 1..f.scopes.len() {
                let mut cliques = f.scopes.clone();
                cliques.push(union(&f.scopes[k], &f.scopes[l]));
                extended.push(JunctionTree::build(&f.sizes, &cliques));
            }
        }
        let feature_map = me.feature_map();
        Ok(Self { stats: DVector::from_vec(stats), me, n, sigma, prior_sd: PRIOR_SD, extended, feature_map })
    }

    /// Number of parameters.
    pub fn dim(&self) -> usize {
        self.me.features.len
    }

    /// The Cholesky factor of C(θ) = nΣ(θ) + σ²I and log det C(θ) (the
    /// covariance [`super::surrogate::FixedCovariance`] freezes).
    pub(super) fn covariance_factor(
        &self,
        theta: &[f64],
    ) -> Result<(faer::linalg::solvers::Llt<f64>, f64), NapsuError> {
        let parts = self.parts(&self.me.moments_full(theta))?;
        Ok((parts.llt, parts.log_det))
    }

    fn parts(&self, m: &Moments) -> Result<Parts, NapsuError> {
        let d = self.me.width;
        let s2 = self.sigma * self.sigma;
        let c = faer::Mat::from_fn(d, d, |i, j| self.n * m.sigma[(i, j)] + if i == j { s2 } else { 0.0 });
        let llt = c.llt(faer::Side::Lower).map_err(|_| {
            NapsuError::Numerical("the likelihood's covariance nΣ(θ) + σ²I is not positive definite".into())
        })?;
        let r = &self.stats - &m.mu * self.n;
        let mut w = faer::Mat::from_fn(d, 1, |i, _| r[i]);
        llt.solve_in_place_with_conj(faer::Conj::No, w.as_mut());
        let w = DVector::from_fn(d, |i, _| w[(i, 0)]);
        let l = llt.L();
        let log_det = 2.0 * (0..d).map(|i| l[(i, i)].ln()).sum::<f64>();
        let ll = -0.5 * log_det - 0.5 * r.dot(&w);
        Ok(Parts { ll, w, llt, log_det })
    }

    /// log p(θ | s̃) up to a constant.
    pub fn log_density(&self, theta: &[f64]) -> Result<f64, NapsuError> {
        let m = self.me.moments_full(theta);
        let ll = self.parts(&m)?.ll;
        Ok(ll - theta.iter().map(|t| t * t).sum::<f64>() / (2.0 * self.prior_sd * self.prior_sd))
    }

    /// log p(θ | s̃) up to a constant, and its gradient.
    pub fn log_density_and_gradient(&self, theta: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
        self.evaluate(theta, false).map(|(v, g, _)| (v, g))
    }

    /// log p(θ | s̃), its gradient, and the expected information
    /// F(θ) = n²·JᵀC⁻¹J + I/τ² with J = ∂μ/∂θ = Σ(θ)Bᵀ: the Fisher
    /// information of the mean n·μ(θ) plus the prior's. It leaves out the
    /// information in C(θ)'s dependence on θ (O(1) against n²) and the
    /// residual's curvature term (O(n^{3/2}) at the mode), so it is a
    /// positive definite stand-in for −∇² log p that costs one matrix
    /// product more than the gradient; the mode search steps with it
    /// (Fisher scoring) and checks its end point with the exact Hessian.
    pub fn log_density_gradient_and_fisher(&self, theta: &[f64]) -> Result<(f64, Vec<f64>, DMatrix<f64>), NapsuError> {
        match self.evaluate(theta, true)? {
            (v, g, Some(f)) => Ok((v, g, f)),
            (_, _, None) => Err(NapsuError::Numerical("no information matrix was computed".into())),
        }
    }

    fn evaluate(&self, theta: &[f64], fisher: bool) -> Result<Evaluation, NapsuError> {
        let me = &self.me;
        let f = &me.features;
        let m = me.moments_full(theta);
        let Parts { ll, w, llt, .. } = self.parts(&m)?;
        let tau2 = self.prior_sd * self.prior_sd;
        let cinv = {
            let inv = llt.inverse();
            DMatrix::from_fn(inv.nrows(), inv.ncols(), |i, j| inv[(i, j)])
        };
        let information = fisher.then(|| {
            let j = &m.sigma * self.feature_map.transpose();
            let mut info = j.transpose() * (&cinv * &j) * (self.n * self.n);
            for i in 0..info.nrows() {
                info[(i, i)] += 1.0 / tau2;
            }
            info
        });
        let mm = &cinv - &w * w.transpose();
        let m_mu = &mm * &m.mu;
        let base = feature_expectations(me, &m.beliefs);
        // Single scopes: the part of g linear in a(x), vᵀa(x) with
        // v_i = w_i + (Mμ)_i − ½ M_ii, has Cov(vᵀa, c) = BΣ(θ)v exactly
        // (c = Ba), with no belief propagation.
        let v = DVector::from_fn(me.width, |i, _| w[i] + m_mu[i] - 0.5 * mm[(i, i)]);
        let mut cov: Vec<f64> = (&self.feature_map * (&m.sigma * v)).iter().copied().collect();
        // Pairs: q_kl(x) = −M[(k, x_{S_k}), (l, x_{S_l})] on S_k ∪ S_l.
        let mut p = 0;
        for k in 0..f.scopes.len() {
            for l in k + 1..f.scopes.len() {
                let joint = &m.joints[p];
                let (sk, sl) = (&f.scopes[k], &f.scopes[l]);
                let shape_k: Vec<usize> = sk.iter().map(|&a| f.sizes[a]).collect();
                let shape_l: Vec<usize> = sl.iter().map(|&a| f.sizes[a]).collect();
                let (stk, stl) = (joint.sub_strides(sk, &shape_k), joint.sub_strides(sl, &shape_l));
                let (ok, ol) = (me.offsets[k], me.offsets[l]);
                let mut q = joint.clone();
                let vals = &mut q.values;
                for_each_triple(&joint.shape, &strides(&joint.shape), &stk, &stl, |u, i, j| {
                    vals[u] = -mm[(ok + i, ol + j)];
                });
                self.add_tilted_covariance(&m.model, Some(&self.extended[p]), &q, joint, &base, &mut cov);
                p += 1;
            }
        }
        let grad = cov.iter().zip(theta).map(|(c, t)| self.n * c - t / tau2).collect();
        Ok((ll - theta.iter().map(|t| t * t).sum::<f64>() / (2.0 * tau2), grad, information))
    }

    /// Adds Cov_p(f, c) for every feature to `cov`, where `f` is a function
    /// on the set `f.attrs` and `p_u` the model's marginal there.
    fn add_tilted_covariance(
        &self,
        model: &GraphicalModel,
        jtree: Option<&JunctionTree>,
        f: &Factor,
        p_u: &Factor,
        base: &[f64],
        cov: &mut [f64],
    ) {
        let min = f.values.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = f.values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        // f̃ = f + δ ≥ 1 (δ scaled to f's range keeps logs well conditioned).
        let delta = 1.0 + (max - min) - min;
        let mean_tilde: f64 = f.values.iter().zip(&p_u.values).map(|(v, p)| (v + delta) * p).sum();
        let mut log_f = f.clone();
        for v in &mut log_f.values {
            *v = (*v + delta).ln();
        }
        let mut tilted = model.clone();
        tilted.potentials.push(log_f);
        if let Some(jt) = jtree {
            tilted.jtree = jt.clone();
        }
        let e_tilted = feature_expectations(&self.me, &tilted.beliefs());
        for ((c, t), b) in cov.iter_mut().zip(&e_tilted).zip(base) {
            *c += mean_tilde * (t - b);
        }
    }
}

/// log p, ∇ log p and (when asked for) the information matrix.
type Evaluation = (f64, Vec<f64>, Option<DMatrix<f64>>);

/// The Gaussian likelihood's value, C⁻¹r and C's factorisation.
struct Parts {
    ll: f64,
    w: DVector<f64>,
    llt: faer::linalg::solvers::Llt<f64>,
    log_det: f64,
}

fn union(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut u: Vec<usize> = a.iter().chain(b).copied().collect();
    u.sort_unstable();
    u.dedup();
    u
}

/// E(c_j) for every canonical feature, from calibrated beliefs (each subset
/// lies inside a query scope, hence inside a clique).
pub fn feature_expectations(me: &MaxEnt, beliefs: &Beliefs) -> Vec<f64> {
    let f = &me.features;
    let mut out = vec![0.0; f.len];
    for (i, t) in f.subsets.iter().enumerate() {
        let marg = beliefs.marginal(t).unwrap_or_else(|| beliefs.marginal_any(t, &f.sizes));
        let total: f64 = marg.values.iter().sum();
        for (cell, p) in marg.values.iter().enumerate() {
            if let Some(j) = f.feature_at(i, cell) {
                out[j] = p / total;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::napsu::CanonicalFeatures;
    use rand::{RngExt, SeedableRng};

    fn posterior(sizes: &[usize], scopes: &[Vec<usize>], rng: &mut rand::rngs::SmallRng) -> (Posterior, Vec<f64>) {
        let me = MaxEnt::new(CanonicalFeatures::new(scopes, sizes, 10_000).unwrap());
        // Statistics from a random "true" θ, plus noise-like perturbation.
        let truth: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let n = 500.0;
        let (mu, _) = me.moments(&truth);
        let stats: Vec<f64> = mu.iter().map(|m| m * n + rng.random_range(-5.0..5.0)).collect();
        let at: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-1.5..1.5)).collect();
        (Posterior::new(me, stats, n, 3.0).unwrap(), at)
    }

    /// F = n²·JᵀC⁻¹J + I/τ² with J = ∂μ/∂θ by central differences of μ.
    #[test]
    fn the_information_matrix_uses_the_jacobian_of_the_mean() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
        for (sizes, scopes) in [
            (vec![3, 2, 2, 3], vec![vec![0, 1], vec![1, 2], vec![2, 3], vec![0, 3]]),
            (vec![2, 3, 2], vec![vec![0, 1, 2], vec![1]]),
        ] {
            let (post, theta) = posterior(&sizes, &scopes, &mut rng);
            let (lp, grad, info) = post.log_density_gradient_and_fisher(&theta).unwrap();
            let (lp2, grad2) = post.log_density_and_gradient(&theta).unwrap();
            assert_eq!((lp, grad), (lp2, grad2));
            let (d, w) = (theta.len(), post.me.width);
            let mut jac = DMatrix::zeros(w, d);
            let h = 1e-6;
            for j in 0..d {
                let mut plus = theta.clone();
                plus[j] += h;
                let mut minus = theta.clone();
                minus[j] -= h;
                let diff = (post.me.moments(&plus).0 - post.me.moments(&minus).0) / (2.0 * h);
                jac.set_column(j, &diff);
            }
            let (_, sigma) = post.me.moments(&theta);
            let c = sigma * post.n + DMatrix::identity(w, w) * (post.sigma * post.sigma);
            let want = jac.transpose() * c.try_inverse().unwrap() * &jac * (post.n * post.n)
                + DMatrix::identity(d, d) / (post.prior_sd * post.prior_sd);
            let err = (&info - &want).amax() / want.amax();
            assert!(err < 1e-6, "{scopes:?}: relative error {err}");
        }
    }

    #[test]
    fn the_gradient_equals_central_finite_differences() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        for (sizes, scopes) in [
            (vec![2, 2, 2], vec![vec![0, 1], vec![1, 2]]),
            (vec![3, 2, 2, 3], vec![vec![0, 1], vec![1, 2], vec![2, 3], vec![0, 3]]),
            (vec![2, 3, 2], vec![vec![0, 1, 2], vec![1]]),
            (vec![3, 3], vec![vec![0], vec![1]]),
        ] {
            let (post, theta) = posterior(&sizes, &scopes, &mut rng);
            let (lp, grad) = post.log_density_and_gradient(&theta).unwrap();
            assert!((lp - post.log_density(&theta).unwrap()).abs() < 1e-9 * lp.abs().max(1.0));
            let h = 1e-5;
            for j in 0..theta.len() {
                let mut plus = theta.clone();
                plus[j] += h;
                let mut minus = theta.clone();
                minus[j] -= h;
                let fd = (post.log_density(&plus).unwrap() - post.log_density(&minus).unwrap()) / (2.0 * h);
                assert!(
                    (grad[j] - fd).abs() <= 1e-5 * fd.abs().max(1.0),
                    "{scopes:?} θ_{j}: gradient {} vs finite difference {fd}",
                    grad[j]
                );
            }
        }
    }
}
