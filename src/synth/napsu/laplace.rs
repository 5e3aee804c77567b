//! The Laplace approximation of a posterior (003 §4 and App. D): a normal
//! distribution at the posterior mode with the inverse of the negative
//! Hessian there as its covariance.
//!
//! The mode is found by L-BFGS (`argmin`; 003 App. D runs it to a loss
//! change below a tolerance, at most 500 iterations, and restarts from
//! another point when it diverges or runs out of iterations). The Hessian is
//! the central difference of the exact gradient, symmetrised. A Hessian
//! that is not positive definite is an error: the approximation would not
//! be a distribution.

use argmin::core::{CostFunction, Executor, Gradient, State, TerminationReason, TerminationStatus};
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;
use nalgebra::DMatrix;

use super::NapsuError;

/// A log-density with its gradient (up to an additive constant).
pub trait LogDensity {
    /// Dimension.
    fn dim(&self) -> usize;
    /// log p(x) and ∇ log p(x).
    fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError>;
}

impl LogDensity for super::likelihood::Posterior {
    fn dim(&self) -> usize {
        self.dim()
    }
    fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
        self.log_density_and_gradient(x)
    }
}

/// Settings of the mode search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaplaceOptions {
    /// L-BFGS iterations per start (003 App. D: 500; 6,000 for Adult).
    pub max_iters: u64,
    /// Stop when the loss changes less than this in an iteration.
    pub tol_cost: f64,
    /// Stop when the gradient's norm is below this.
    pub tol_grad: f64,
    /// Starts tried before giving up (the first at 0, then at ±0.1·k).
    pub starts: usize,
}

impl Default for LaplaceOptions {
    fn default() -> Self {
        LaplaceOptions { max_iters: 500, tol_cost: 1e-10, tol_grad: 1e-6, starts: 4 }
    }
}

/// A fitted Laplace approximation.
#[derive(Debug, Clone, PartialEq)]
pub struct Laplace {
    /// The mode.
    pub mean: Vec<f64>,
    /// The covariance (inverse negative Hessian at the mode).
    pub cov: DMatrix<f64>,
    /// Lower Cholesky factor of `cov` (for draws).
    pub cov_chol: DMatrix<f64>,
    /// L-BFGS iterations of the start that converged.
    pub iterations: u64,
    /// Starts used.
    pub starts: usize,
}

struct Negated<'a, D: LogDensity>(&'a D);

fn to_argmin(e: NapsuError) -> argmin::core::Error {
    argmin::core::Error::msg(e.to_string())
}

impl<D: LogDensity> CostFunction for Negated<'_, D> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, x: &Vec<f64>) -> Result<f64, argmin::core::Error> {
        Ok(-self.0.value_and_gradient(x).map_err(to_argmin)?.0)
    }
}

impl<D: LogDensity> Gradient for Negated<'_, D> {
    type Param = Vec<f64>;
    type Gradient = Vec<f64>;
    fn gradient(&self, x: &Vec<f64>) -> Result<Vec<f64>, argmin::core::Error> {
        Ok(self.0.value_and_gradient(x).map_err(to_argmin)?.1.into_iter().map(|g| -g).collect())
    }
}

/// The mode of `density` by L-BFGS, restarting from other points when a run
/// fails or does not converge.
pub fn mode<D: LogDensity>(density: &D, opts: &LaplaceOptions) -> Result<(Vec<f64>, u64, usize), NapsuError> {
    let d = density.dim();
    let mut last = String::new();
    for start in 0..opts.starts.max(1) {
        let init: Vec<f64> = (0..d)
            .map(|i| if start == 0 { 0.0 } else { 0.1 * start as f64 * if i % 2 == 0 { 1.0 } else { -1.0 } })
            .collect();
        let solver = LBFGS::new(MoreThuenteLineSearch::new(), 10)
            .with_tolerance_cost(opts.tol_cost)
            .and_then(|s| s.with_tolerance_grad(opts.tol_grad))
            .map_err(|e| NapsuError::Numerical(e.to_string()))?;
        let run = Executor::new(Negated(density), solver).configure(|s| s.param(init).max_iters(opts.max_iters)).run();
        match run {
            Ok(res) => {
                let state = res.state();
                let converged = matches!(
                    state.get_termination_status(),
                    TerminationStatus::Terminated(
                        TerminationReason::SolverConverged | TerminationReason::TargetCostReached
                    )
                );
                if converged && let Some(p) = state.get_best_param() {
                    return Ok((p.clone(), state.get_iter(), start + 1));
                }
                last = format!("{:?} after {} iterations", state.get_termination_status(), state.get_iter());
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(NapsuError::Numerical(format!(
        "the posterior mode search (L-BFGS) did not converge from {} starting points (last: {last}); use fewer or \
         smaller queries, or more budget",
        opts.starts.max(1)
    )))
}

/// −∇² log p at `x` by central differences of the gradient, symmetrised.
pub fn negative_hessian<D: LogDensity>(density: &D, x: &[f64]) -> Result<DMatrix<f64>, NapsuError> {
    let d = x.len();
    let mut h = DMatrix::zeros(d, d);
    for j in 0..d {
        let step = 1e-5 * x[j].abs().max(1.0);
        let mut plus = x.to_vec();
        plus[j] += step;
        let mut minus = x.to_vec();
        minus[j] -= step;
        let (_, gp) = density.value_and_gradient(&plus)?;
        let (_, gm) = density.value_and_gradient(&minus)?;
        for i in 0..d {
            h[(i, j)] = -(gp[i] - gm[i]) / (2.0 * step);
        }
    }
    Ok((&h + h.transpose()) * 0.5)
}

/// The Laplace approximation of `density`.
pub fn laplace<D: LogDensity>(density: &D, opts: &LaplaceOptions) -> Result<Laplace, NapsuError> {
    let (mean, iterations, starts) = mode(density, opts)?;
    let h = negative_hessian(density, &mean)?;
    let chol = h.cholesky().ok_or_else(|| {
        NapsuError::Numerical(
            "the Hessian at the posterior mode is not positive definite, so the Laplace approximation is not a \
             distribution; use NUTS, or fewer or smaller queries"
                .into(),
        )
    })?;
    let cov = chol.inverse();
    let cov_chol = cov
        .clone()
        .cholesky()
        .ok_or_else(|| NapsuError::Numerical("the Laplace covariance is not positive definite".into()))?
        .l();
    Ok(Laplace { mean, cov, cov_chol, iterations, starts })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// y_i ~ N(θ, 1) with a N(0, 10²) prior: the posterior is normal with
    /// precision n + 1/100 and mean Σy / (n + 1/100), so the Laplace
    /// approximation is exact. In two dimensions with correlated data the
    /// same holds for a Gaussian log-density with a full precision matrix.
    struct Gaussian {
        precision: DMatrix<f64>,
        mean: Vec<f64>,
    }

    impl LogDensity for Gaussian {
        fn dim(&self) -> usize {
            self.mean.len()
        }
        fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
            let r = nalgebra::DVector::from_iterator(x.len(), x.iter().zip(&self.mean).map(|(a, b)| a - b));
            let pr = &self.precision * &r;
            Ok((-0.5 * r.dot(&pr), pr.iter().map(|v| -v).collect()))
        }
    }

    #[test]
    fn laplace_recovers_the_exact_posterior_of_a_conjugate_normal_model() {
        let y = [1.2, 0.7, 2.5, 1.9, 1.1];
        let n = y.len() as f64;
        let precision = n + 1.0 / 100.0;
        let post = Gaussian {
            precision: DMatrix::from_element(1, 1, precision),
            mean: vec![y.iter().sum::<f64>() / precision],
        };
        let l = laplace(&post, &LaplaceOptions::default()).unwrap();
        assert!((l.mean[0] - post.mean[0]).abs() < 1e-6, "{:?}", l.mean);
        assert!((l.cov[(0, 0)] - 1.0 / precision).abs() < 1e-8, "{}", l.cov);
        let p = DMatrix::from_row_slice(3, 3, &[4.0, 1.0, 0.5, 1.0, 3.0, -0.7, 0.5, -0.7, 2.0]);
        let g = Gaussian { precision: p.clone(), mean: vec![0.3, -1.2, 2.0] };
        let l = laplace(&g, &LaplaceOptions::default()).unwrap();
        let inv = p.try_inverse().unwrap();
        assert!((&l.cov - &inv).amax() < 1e-7, "{} vs {inv}", l.cov);
        for (a, b) in l.mean.iter().zip(&g.mean) {
            assert!((a - b).abs() < 1e-6);
        }
        assert!((&l.cov_chol * l.cov_chol.transpose() - &l.cov).amax() < 1e-12);
    }

    /// NAPSU-MQ's own posterior on 003 §5's toy shape (3 binary attributes,
    /// all 2-way marginals, n = 2000): with noiseless statistics the mode is
    /// the true θ (up to the weak prior), and it reproduces the marginals.
    #[test]
    fn the_napsu_mode_recovers_the_parameters_of_noiseless_statistics() {
        use crate::synth::napsu::{CanonicalFeatures, MaxEnt, likelihood::Posterior};
        let scopes = vec![vec![0, 1], vec![0, 2], vec![1, 2]];
        let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &[2, 2, 2], 100).unwrap());
        let truth = [0.4, -0.3, 0.8, 0.5, -0.6, 0.2];
        assert_eq!(me.features.len, truth.len());
        let n = 2000.0;
        let (mu, _) = me.moments(&truth);
        let stats: Vec<f64> = mu.iter().map(|m| m * n).collect();
        let post = Posterior::new(me.clone(), stats, n, 1.0).unwrap();
        let l = laplace(&post, &LaplaceOptions::default()).unwrap();
        for (a, b) in l.mean.iter().zip(&truth) {
            assert!((a - b).abs() < 0.02, "mode {:?} vs truth {truth:?}", l.mean);
        }
        let (fit, _) = me.moments(&l.mean);
        let gap = (&fit - &mu).amax();
        assert!(gap < 1e-3, "marginals of the mode differ by {gap}");
        // Posterior standard deviations shrink like 1/√n: all below 0.2 here.
        assert!((0..truth.len()).all(|i| l.cov[(i, i)].sqrt() < 0.2), "{}", l.cov);
    }

    #[test]
    fn a_density_without_a_mode_is_a_clear_error() {
        // A "Gaussian" with a negative-definite precision has no mode.
        let g = Gaussian { precision: DMatrix::from_element(1, 1, -1.0), mean: vec![0.0] };
        let e = laplace(&g, &LaplaceOptions { max_iters: 50, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("did not converge") || e.contains("not positive definite"), "{e}");
    }
}
