//! μ(θ) and Σ(θ) of NAPSU-MQ's likelihood (003 §4 eqs. (5)–(6); NOTES §6).
//!
//! The noisy statistic is s̃ = Σ_i a(x_i) + N(0, σ²I), where a(x) stacks the
//! one-hot indicators of the query marginals. By the central limit theorem
//! s̃ | θ ≈ N(n·μ(θ), n·Σ(θ) + σ²I) with μ(θ) = E_θ[a(x)] and
//! Σ(θ) = Cov_θ[a(x)] under p(x | θ) ∝ exp(θᵀc(x)) (the canonical features,
//! [`super::canonical`]). Both come from the model as a graphical model on
//! the query scopes: μ is the scopes' marginals; a diagonal block of Σ is
//! diag(μ_k) − μ_k μ_kᵀ (one-hot within a marginal); an off-diagonal block
//! needs the joint marginal over S_k ∪ S_l, which belief propagation on the
//! calibrated junction tree gives by variable elimination
//! ([`crate::pgm::model::Beliefs::marginal_any`]). Tested against
//! enumeration of the joint distribution.

use nalgebra::{DMatrix, DVector};

use super::canonical::CanonicalFeatures;
use crate::pgm::factor::{Factor, for_each_triple, strides};
use crate::pgm::model::{Beliefs, GraphicalModel};

/// μ(θ), Σ(θ) and the model quantities behind them.
#[derive(Debug, Clone)]
pub struct Moments {
    /// E[a(x)].
    pub mu: DVector<f64>,
    /// Cov[a(x)].
    pub sigma: DMatrix<f64>,
    /// p(x | θ) as a graphical model.
    pub model: GraphicalModel,
    /// Its calibrated beliefs.
    pub beliefs: Beliefs,
    /// The marginal (probabilities) of each query scope.
    pub marginals: Vec<Factor>,
    /// The joint marginal over S_k ∪ S_l for k < l, in order (0,1), (0,2), …
    pub joints: Vec<Factor>,
}

/// The maximum-entropy model of a set of marginal queries.
#[derive(Debug, Clone, PartialEq)]
pub struct MaxEnt {
    /// Its canonical features (θ has one entry per feature).
    pub features: CanonicalFeatures,
    /// Offset of each query's block in a(x).
    pub offsets: Vec<usize>,
    /// Length of a(x): Σ_k |A_{S_k}|.
    pub width: usize,
}

impl MaxEnt {
    /// The model of `features`' queries.
    pub fn new(features: CanonicalFeatures) -> Self {
        let mut offsets = Vec::with_capacity(features.scopes.len());
        let mut width = 0;
        for s in &features.scopes {
            offsets.push(width);
            width += s.iter().map(|&a| features.sizes[a]).product::<usize>();
        }
        Self { features, offsets, width }
    }

    /// p(x | θ) as a graphical model on the query scopes, total mass 1.
    pub fn model(&self, theta: &[f64]) -> GraphicalModel {
        let f = &self.features;
        let mut m = GraphicalModel::uniform(&f.sizes, &f.scopes, 1.0);
        self.fill_potentials(&mut m, theta);
        m
    }

    /// Sets the potentials of `m`, a model from [`MaxEnt::model`] (its
    /// junction tree reused), to θ's.
    pub fn fill_potentials(&self, m: &mut GraphicalModel, theta: &[f64]) {
        let f = &self.features;
        for p in &mut m.potentials {
            p.values.iter_mut().for_each(|v| *v = 0.0);
        }
        for (i, t) in f.subsets.iter().enumerate() {
            let mut phi = Factor::zeros(t, &f.sizes);
            for (cell, v) in phi.values.iter_mut().enumerate() {
                // Only assignments without a 0 carry θ.
                if let Some(j) = f.feature_at(i, cell) {
                    *v = theta[j];
                }
            }
            m.potentials[f.home[i]].add_assign_sub(&phi);
        }
    }

    /// μ(θ) = E[a(x)] alone: the query marginals as probabilities, which fix
    /// p(x | θ) one-to-one (one belief propagation, no pairwise joints).
    pub fn mean_parameters(&self, theta: &[f64]) -> DVector<f64> {
        self.mean_parameters_in(&self.model(theta), theta)
    }

    /// [`MaxEnt::mean_parameters`] reusing `template`, a model from
    /// [`MaxEnt::model`], and its junction tree (built once for many θ).
    pub fn mean_parameters_in(&self, template: &GraphicalModel, theta: &[f64]) -> DVector<f64> {
        let mut model = template.clone();
        self.fill_potentials(&mut model, theta);
        self.query_marginals(&model.beliefs()).1
    }

    /// The marginal of each query scope and μ, their cells stacked.
    fn query_marginals(&self, beliefs: &Beliefs) -> (Vec<Factor>, DVector<f64>) {
        let f = &self.features;
        let marginals: Vec<Factor> = f.scopes.iter().map(|s| beliefs.marginal_any(s, &f.sizes)).collect();
        let mut mu = DVector::zeros(self.width);
        for (k, m) in marginals.iter().enumerate() {
            mu.rows_mut(self.offsets[k], m.len()).copy_from_slice(&m.values);
        }
        (marginals, mu)
    }

    /// μ(θ) = E[a(x)] and Σ(θ) = Cov[a(x)].
    pub fn moments(&self, theta: &[f64]) -> (DVector<f64>, DMatrix<f64>) {
        let m = self.moments_full(theta);
        (m.mu, m.sigma)
    }

    /// μ and Σ with what they were computed from (the calibrated model and
    /// the joint marginal of each pair of scopes), which the gradient reuses.
    pub fn moments_full(&self, theta: &[f64]) -> Moments {
        let f = &self.features;
        let model = self.model(theta);
        let beliefs = model.beliefs();
        let (marginals, mu) = self.query_marginals(&beliefs);
        let mut sigma = -(&mu * mu.transpose());
        for (k, m) in marginals.iter().enumerate() {
            for (i, p) in m.values.iter().enumerate() {
                sigma[(self.offsets[k] + i, self.offsets[k] + i)] += p;
            }
        }
        let mut joints = Vec::new();
        for k in 0..f.scopes.len() {
            for l in k + 1..f.scopes.len() {
                let (sk, sl) = (&f.scopes[k], &f.scopes[l]);
                let mut union: Vec<usize> = sk.iter().chain(sl).copied().collect();
                union.sort_unstable();
                union.dedup();
                let joint = beliefs.marginal_any(&union, &f.sizes);
                let shape_k: Vec<usize> = sk.iter().map(|&a| f.sizes[a]).collect();
                let shape_l: Vec<usize> = sl.iter().map(|&a| f.sizes[a]).collect();
                let strides_k = joint.sub_strides(sk, &shape_k);
                let strides_l = joint.sub_strides(sl, &shape_l);
                let (ok, ol) = (self.offsets[k], self.offsets[l]);
                for_each_triple(&joint.shape, &strides(&joint.shape), &strides_k, &strides_l, |u, i, j| {
                    sigma[(ok + i, ol + j)] += joint.values[u];
                });
                for i in 0..shape_k.iter().product::<usize>() {
                    for j in 0..shape_l.iter().product::<usize>() {
                        sigma[(ol + j, ok + i)] = sigma[(ok + i, ol + j)];
                    }
                }
                joints.push(joint);
            }
        }
        Moments { mu, sigma, model, beliefs, marginals, joints }
    }

    /// The matrix B with c(x) = B·a(x) (features × width): each canonical
    /// feature 1[x_T = v_T] is the sum of its home scope's indicators whose
    /// cells agree with v_T on T. So ∂μ/∂θ = Cov(a, c) = Σ(θ)·Bᵀ, which the
    /// mode search's Fisher scoring uses ([`super::likelihood::Posterior`]).
    pub fn feature_map(&self) -> DMatrix<f64> {
        let f = &self.features;
        let mut b = DMatrix::zeros(f.len, self.width);
        for (i, t) in f.subsets.iter().enumerate() {
            let k = f.home[i];
            let scope = &f.scopes[k];
            let shape: Vec<usize> = scope.iter().map(|&a| f.sizes[a]).collect();
            let cells: usize = shape.iter().product();
            for u in 0..cells {
                // The scope cell's digits, then the subset's cell (row-major).
                let (mut rest, mut digits) = (u, vec![0usize; scope.len()]);
                for (d, &s) in digits.iter_mut().zip(&shape).rev() {
                    *d = rest % s;
                    rest /= s;
                }
                let sub = t.iter().fold(0usize, |acc, a| {
                    let pos = scope.iter().position(|x| x == a).unwrap_or(0);
                    acc * f.sizes[*a] + digits[pos]
                });
                if let Some(j) = f.feature_at(i, sub) {
                    b[(j, self.offsets[k] + u)] = 1.0;
                }
            }
        }
        b
    }

    /// a(x) of one full assignment (the stacked one-hot marginal indicators).
    pub fn queries(&self, x: &[usize]) -> Vec<usize> {
        let f = &self.features;
        f.scopes
            .iter()
            .zip(&self.offsets)
            .map(|(s, o)| o + s.iter().fold(0, |acc, &a| acc * f.sizes[a] + x[a]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use itertools::Itertools;
    use rand::{RngExt, SeedableRng};

    /// μ and Σ by enumerating the joint distribution.
    fn brute_force(me: &MaxEnt, theta: &[f64]) -> (DVector<f64>, DMatrix<f64>) {
        let f = &me.features;
        let cells: Vec<Vec<usize>> = f.sizes.iter().map(|&s| 0..s).multi_cartesian_product().collect();
        let logits: Vec<f64> = cells.iter().map(|x| f.active(x).iter().map(|&j| theta[j]).sum()).collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let z: f64 = w.iter().sum();
        let mut mu = DVector::zeros(me.width);
        let mut second = DMatrix::zeros(me.width, me.width);
        for (x, wx) in cells.iter().zip(&w) {
            let p = wx / z;
            let q = me.queries(x);
            for &i in &q {
                mu[i] += p;
                for &j in &q {
                    second[(i, j)] += p;
                }
            }
        }
        let sigma = second - &mu * mu.transpose();
        (mu, sigma)
    }

    #[test]
    fn mu_and_sigma_equal_enumeration_of_the_joint_on_random_models() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
        let cases: Vec<(Vec<usize>, Vec<Vec<usize>>)> = vec![
            (vec![2, 2, 2], vec![vec![0, 1], vec![1, 2], vec![0, 2]]),
            (vec![3, 2, 4, 2], vec![vec![0, 1], vec![1, 2], vec![2, 3]]),
            (vec![2, 3, 2, 3, 2], vec![vec![0, 1, 2], vec![2, 3], vec![3, 4], vec![0, 4]]),
            (vec![4, 3], vec![vec![0], vec![1]]),
            (vec![5, 4, 3, 2], vec![vec![0, 1], vec![0, 2], vec![0, 3], vec![1, 3]]),
        ];
        for (sizes, scopes) in cases {
            let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &sizes, 10_000).unwrap());
            for _ in 0..3 {
                let theta: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-2.0..2.0)).collect();
                let (mu, sigma) = me.moments(&theta);
                let (mu_b, sigma_b) = brute_force(&me, &theta);
                assert!((&mu - &mu_b).amax() < 1e-9, "{scopes:?}: μ differs by {}", (&mu - &mu_b).amax());
                let alone = me.mean_parameters(&theta);
                assert!((&alone - &mu_b).amax() < 1e-9, "{scopes:?}: μ alone differs by {}", (&alone - &mu_b).amax());
                assert!((&sigma - &sigma_b).amax() < 1e-9, "{scopes:?}: Σ differs by {}", (&sigma - &sigma_b).amax());
            }
        }
    }

    #[test]
    fn the_feature_map_turns_query_indicators_into_canonical_features() {
        for (sizes, scopes) in [
            (vec![3, 2, 4, 2], vec![vec![0, 1], vec![1, 2], vec![2, 3]]),
            (vec![2, 3, 2, 3, 2], vec![vec![0, 1, 2], vec![2, 3], vec![3, 4], vec![0, 4]]),
        ] {
            let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &sizes, 10_000).unwrap());
            let b = me.feature_map();
            for x in sizes.iter().map(|&s| 0..s).multi_cartesian_product() {
                let mut a = DVector::zeros(me.width);
                for q in me.queries(&x) {
                    a[q] = 1.0;
                }
                let mut c = DVector::zeros(me.features.len);
                for j in me.features.active(&x) {
                    c[j] = 1.0;
                }
                assert_eq!(&b * a, c, "{scopes:?} at {x:?}");
            }
        }
    }

    #[test]
    fn theta_zero_is_the_uniform_distribution() {
        let me = MaxEnt::new(CanonicalFeatures::new(&[vec![0, 1]], &[2, 3], 100).unwrap());
        let (mu, sigma) = me.moments(&vec![0.0; me.features.len]);
        assert!(mu.iter().all(|&p| (p - 1.0 / 6.0).abs() < 1e-12));
        assert!((sigma[(0, 0)] - (1.0 / 6.0 - 1.0 / 36.0)).abs() < 1e-12 && (sigma[(0, 1)] + 1.0 / 36.0).abs() < 1e-12);
    }
}
