//! The Laplace approximation of a posterior (003 §4 and App. D): a normal
//! distribution at the posterior mode with the inverse of the negative
//! Hessian there as its covariance.
//!
//! 003 App. D finds the mode with L-BFGS (to a loss change below a
//! tolerance, at most 500 iterations, restarting from another point when it
//! diverges). We depart from it for speed, not for a different answer: the
//! mode is found by Fisher scoring with the likelihood's expected
//! information (NAPSU-MQ's posterior supplies it almost for free), with
//! `argmin`'s L-BFGS and restarts as the fallback, and either end point is
//! polished by Newton steps until the Newton decrement says it is within a
//! thousandth of a posterior standard deviation (see [`mode`]). The
//! Hessian is the central difference of the exact gradient, symmetrised,
//! its columns computed on all cores. A Hessian that is not positive
//! definite is an error: the approximation would not be a distribution.

use argmin::core::{CostFunction, Executor, Gradient, State, TerminationReason, TerminationStatus};
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nalgebra::DMatrix;

use super::NapsuError;
use super::packed::PackedLower;

/// A log-density with its gradient (up to an additive constant).
pub trait LogDensity {
    /// Dimension.
    fn dim(&self) -> usize;
    /// log p(x) and ∇ log p(x).
    fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError>;
    /// log p(x) alone (line searches); by default from
    /// [`LogDensity::value_and_gradient`].
    fn value(&self, x: &[f64]) -> Result<f64, NapsuError> {
        self.value_and_gradient(x).map(|(v, _)| v)
    }
    /// log p(x), ∇ log p(x) and a positive definite stand-in for −∇² log p
    /// (an expected information) when the density has a cheap one: the mode
    /// search then starts with Fisher scoring. `None` (the default): L-BFGS.
    fn with_information(&self, _x: &[f64]) -> Option<Result<Evaluated, NapsuError>> {
        None
    }
}

/// log p, ∇ log p and an information matrix at one point.
pub type Evaluated = (f64, Vec<f64>, DMatrix<f64>);

impl LogDensity for super::likelihood::Posterior {
    fn dim(&self) -> usize {
        self.dim()
    }
    fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
        self.log_density_and_gradient(x)
    }
    fn value(&self, x: &[f64]) -> Result<f64, NapsuError> {
        self.log_density(x)
    }
    fn with_information(&self, x: &[f64]) -> Option<Result<Evaluated, NapsuError>> {
        Some(self.log_density_gradient_and_fisher(x))
    }
}

/// Settings of the mode search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaplaceOptions {
    /// Iterations of Fisher scoring, and of L-BFGS per start (003 App. D:
    /// 500; 6,000 for Adult).
    pub max_iters: u64,
    /// L-BFGS stops when the loss changes less than this in an iteration.
    pub tol_cost: f64,
    /// L-BFGS stops when the gradient's norm is below this.
    pub tol_grad: f64,
    /// Starts tried before giving up (the first at 0, then at ±0.1·k).
    pub starts: usize,
    /// The mode is accepted when the Newton decrement gᵀH⁻¹g is below this:
    /// the remaining distance to the mode, in posterior standard deviations
    /// squared (1e-6: a thousandth of a standard deviation).
    pub tol_decrement: f64,
    /// Newton steps that polish L-BFGS's end point.
    pub newton_steps: usize,
}

impl Default for LaplaceOptions {
    fn default() -> Self {
        LaplaceOptions {
            max_iters: 500,
            tol_cost: 1e-10,
            tol_grad: 1e-6,
            starts: 4,
            tol_decrement: 1e-6,
            newton_steps: 20,
        }
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

/// −log p for argmin, remembering the last evaluation: L-BFGS asks for the
/// cost and the gradient at the same point, and one evaluation gives both.
impl Laplace {
    /// One draw θ = mean + L·z with z standard normal (post-processing of
    /// DP output, so floating-point sampling is fine here).
    pub fn draw<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> Vec<f64> {
        let d = self.mean.len();
        let z: Vec<f64> = (0..d).map(|_| standard_normal(rng)).collect();
        self.at(&z)
    }

    /// The point θ = mode + L z for normalised coordinates z (LLᵀ the
    /// covariance): the map NUTS samples through.
    pub fn at(&self, z: &[f64]) -> Vec<f64> {
        (0..z.len()).map(|i| self.mean[i] + (0..=i).map(|j| self.cov_chol[(i, j)] * z[j]).sum::<f64>()).collect()
    }
    /// The map z ↦ θ = m + L z and its adjoint, for a sampler's every step.
    pub fn normalisation(&self) -> Normalisation {
        let d = self.mean.len();
        Normalisation { mean: self.mean.clone(), chol: PackedLower::from_fn(d, |i, j| self.cov_chol[(i, j)]) }
    }
}

/// θ = m + L z and ∇_z = Lᵀ ∇_θ by the packed triangular products of
/// [`PackedLower`] (each column contiguous, SIMD). At 228 parameters the
/// row-wise strided sums took a third of a NUTS step on Adult-reduced
/// (`perf`); nalgebra's `gemv` did no better, and faer's general triangular
/// product copied the triangle on every call.
pub struct Normalisation {
    mean: Vec<f64>,
    chol: PackedLower,
}

impl Normalisation {
    /// θ = m + L z.
    pub fn theta(&self, z: &[f64]) -> Vec<f64> {
        let mut theta = self.mean.clone();
        self.chol.add_times(z, &mut theta);
        theta
    }
    /// Lᵀ g, written to `out`: a gradient in θ as one in z.
    pub fn gradient(&self, g: &[f64], out: &mut [f64]) {
        self.chol.transpose_times(g, out);
    }
}

/// A standard normal draw (Box–Muller).
pub fn standard_normal<R: rand::Rng + ?Sized>(rng: &mut R) -> f64 {
    use rand::RngExt;
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

struct Negated<'a, D: LogDensity> {
    density: &'a D,
    last: Mutex<Option<Evaluation>>,
    /// Evaluations left: a line search on a density without a mode can
    /// otherwise walk off forever.
    left: AtomicU64,
}

/// A point with −log p and −∇ log p there.
type Evaluation = (Vec<f64>, f64, Vec<f64>);

fn to_argmin(e: NapsuError) -> argmin::core::Error {
    argmin::core::Error::msg(e.to_string())
}

impl<D: LogDensity> Negated<'_, D> {
    fn eval(&self, x: &[f64]) -> Result<(f64, Vec<f64>), argmin::core::Error> {
        let mut last = self.last.lock().map_err(|_| argmin::core::Error::msg("cache poisoned"))?;
        if let Some((at, v, g)) = last.as_ref()
            && at.as_slice() == x
        {
            return Ok((*v, g.clone()));
        }
        if self.left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_err() {
            return Err(argmin::core::Error::msg("too many evaluations (the density may have no mode)"));
        }
        let (v, g) = self.density.value_and_gradient(x).map_err(to_argmin)?;
        if !v.is_finite() {
            return Err(argmin::core::Error::msg("the log-density is not finite"));
        }
        let out = (-v, g.into_iter().map(|g| -g).collect::<Vec<_>>());
        *last = Some((x.to_vec(), out.0, out.1.clone()));
        Ok(out)
    }
}

impl<D: LogDensity> CostFunction for Negated<'_, D> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, x: &Vec<f64>) -> Result<f64, argmin::core::Error> {
        Ok(self.eval(x)?.0)
    }
}

impl<D: LogDensity> Gradient for Negated<'_, D> {
    type Param = Vec<f64>;
    type Gradient = Vec<f64>;
    fn gradient(&self, x: &Vec<f64>) -> Result<Vec<f64>, argmin::core::Error> {
        Ok(self.eval(x)?.1)
    }
}

/// The mode of `density` and the negative Hessian there. When the density
/// has an information matrix, Fisher scoring from 0 first; otherwise, or
/// when that fails, L-BFGS from a start. Either end point is then polished
/// by Newton steps (FD Hessian, step halving) until the Newton decrement is
/// below `tol_decrement`; other L-BFGS starts when that fails.
///
/// Why Fisher scoring: on Adult-reduced (228 parameters, n = 30,162)
/// L-BFGS took its 500 iterations and ~6,000 evaluations (110 s) to come
/// near the mode; Fisher scoring's steps are Newton steps up to O(n^{-1/2})
/// relative terms, so it converges in a few dozen evaluations.
///
/// Why the decrement: L-BFGS's own tests are absolute (loss change,
/// gradient norm), and with n in the tens of thousands the log-density is
/// large and steep, so float noise in the loss outlasts any absolute
/// tolerance (runs end at the iteration cap next to the mode). gᵀH⁻¹g is
/// the squared distance to the mode in the posterior's own metric, so one
/// threshold serves every n.
pub fn mode<D: LogDensity + Sync>(
    density: &D,
    opts: &LaplaceOptions,
) -> Result<(Vec<f64>, DMatrix<f64>, u64, usize), NapsuError> {
    let d = density.dim();
    let mut last = String::new();
    if let Some(first) = density.with_information(&vec![0.0; d]) {
        match first.map_err(|e| e.to_string()).and_then(|at| fisher_scoring(density, vec![0.0; d], at, opts)) {
            Ok((x, iterations)) => match polish(density, x, opts) {
                Ok((x, h)) => return Ok((x, h, iterations, 1)),
                Err(e) => last = format!("Fisher scoring: {e}"),
            },
            Err(e) => last = format!("Fisher scoring: {e}"),
        }
    }
    for start in 0..opts.starts.max(1) {
        let init: Vec<f64> = (0..d)
            .map(|i| if start == 0 { 0.0 } else { 0.1 * start as f64 * if i % 2 == 0 { 1.0 } else { -1.0 } })
            .collect();
        let solver = LBFGS::new(MoreThuenteLineSearch::new(), 10)
            .with_tolerance_cost(opts.tol_cost)
            .and_then(|s| s.with_tolerance_grad(opts.tol_grad))
            .map_err(|e| NapsuError::Numerical(e.to_string()))?;
        let budget = opts.max_iters.saturating_mul(50).saturating_add(1000);
        let problem = Negated { density, last: Mutex::new(None), left: AtomicU64::new(budget) };
        let run = Executor::new(problem, solver).configure(|s| s.param(init).max_iters(opts.max_iters)).run();
        let (end, iterations) = match run {
            Ok(res) => {
                let state = res.state();
                let usable = matches!(
                    state.get_termination_status(),
                    TerminationStatus::Terminated(
                        TerminationReason::SolverConverged
                            | TerminationReason::TargetCostReached
                            | TerminationReason::MaxItersReached
                    )
                );
                match state.get_best_param() {
                    Some(p) if usable => (p.clone(), state.get_iter()),
                    _ => {
                        last = format!("{:?} after {} iterations", state.get_termination_status(), state.get_iter());
                        continue;
                    }
                }
            }
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        match polish(density, end, opts) {
            Ok((x, h)) => return Ok((x, h, iterations, start + 1)),
            Err(e) => last = e,
        }
    }
    Err(NapsuError::Numerical(format!(
        "the posterior mode search (L-BFGS, then Newton) did not converge from {} starting points (last: {last}); \
         use fewer or smaller queries, or more budget",
        opts.starts.max(1)
    )))
}

/// Fisher scoring from `x` (where `at` was evaluated): steps F⁻¹g with
/// backtracking (Armijo) until gᵀF⁻¹g is a hundredth of `tol_decrement`,
/// so that the exact-Hessian check in [`polish`] usually passes at once.
/// Returns the end point and the iterations taken.
fn fisher_scoring<D: LogDensity>(
    density: &D,
    mut x: Vec<f64>,
    at: Evaluated,
    opts: &LaplaceOptions,
) -> Result<(Vec<f64>, u64), String> {
    let (mut value, mut grad, mut info) = at;
    for iteration in 0..opts.max_iters {
        let chol = info.cholesky().ok_or("the information matrix is not positive definite")?;
        let step = chol.solve(&nalgebra::DVector::from_column_slice(&grad));
        let decrement: f64 = step.iter().zip(&grad).map(|(s, g)| s * g).sum();
        if !decrement.is_finite() {
            return Err("a step that is not finite".into());
        }
        if decrement <= opts.tol_decrement / 100.0 {
            return Ok((x, iteration));
        }
        let mut t = 1.0;
        let next = loop {
            let next: Vec<f64> = x.iter().zip(step.iter()).map(|(a, s)| a + t * s).collect();
            if let Ok(v) = density.value(&next)
                && v.is_finite()
                && v >= value + 1e-4 * t * decrement
            {
                break next;
            }
            t /= 2.0;
            if t < 1e-10 {
                // Float noise in log p can hide the last, tiny gains: close
                // enough is for Newton's exact Hessian to finish.
                if decrement <= opts.tol_decrement * 100.0 {
                    return Ok((x, iteration));
                }
                return Err(format!("no step increases the log-density (decrement {decrement:.3e})"));
            }
        };
        (value, grad, info) =
            density.with_information(&next).ok_or("no information matrix")?.map_err(|e| e.to_string())?;
        x = next;
    }
    Err(format!("{} iterations did not converge", opts.max_iters))
}

/// Newton steps from `x` until gᵀH⁻¹g ≤ `tol_decrement`.
fn polish<D: LogDensity + Sync>(
    density: &D,
    mut x: Vec<f64>,
    opts: &LaplaceOptions,
) -> Result<(Vec<f64>, DMatrix<f64>), String> {
    let (mut value, mut grad) = density.value_and_gradient(&x).map_err(|e| e.to_string())?;
    for _ in 0..=opts.newton_steps {
        let h = negative_hessian(density, &x).map_err(|e| e.to_string())?;
        let chol = h.clone().cholesky().ok_or("the Hessian is not positive definite at the end point")?;
        let step = chol.solve(&nalgebra::DVector::from_column_slice(&grad));
        let decrement: f64 = step.iter().zip(&grad).map(|(s, g)| s * g).sum();
        if !decrement.is_finite() {
            return Err("a Newton step that is not finite".into());
        }
        if decrement <= opts.tol_decrement {
            return Ok((x, h));
        }
        // Step halving until log p does not decrease.
        let mut t = 1.0;
        loop {
            let next: Vec<f64> = x.iter().zip(step.iter()).map(|(a, s)| a + t * s).collect();
            if let Ok((v, g)) = density.value_and_gradient(&next)
                && v >= value
            {
                (x, value, grad) = (next, v, g);
                break;
            }
            t /= 2.0;
            if t < 1e-10 {
                return Err(format!("no Newton step increases the log-density (decrement {decrement:.3e})"));
            }
        }
    }
    Err(format!("{} Newton steps did not reach a decrement of {:e}", opts.newton_steps, opts.tol_decrement))
}

/// −∇² log p at `x` by central differences of the gradient, symmetrised;
/// the columns are split over the machine's cores.
pub fn negative_hessian<D: LogDensity + Sync>(density: &D, x: &[f64]) -> Result<DMatrix<f64>, NapsuError> {
    let d = x.len();
    let column = |j: usize| -> Result<Vec<f64>, NapsuError> {
        let step = 1e-5 * x[j].abs().max(1.0);
        let mut plus = x.to_vec();
        plus[j] += step;
        let mut minus = x.to_vec();
        minus[j] -= step;
        let (_, gp) = density.value_and_gradient(&plus)?;
        let (_, gm) = density.value_and_gradient(&minus)?;
        Ok(gp.iter().zip(&gm).map(|(p, m)| -(p - m) / (2.0 * step)).collect())
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, d.max(1));
    type Columns = Vec<(usize, Vec<f64>)>;
    let columns: Vec<Result<Columns, NapsuError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let column = &column;
                s.spawn(move || (t..d).step_by(threads).map(|j| Ok((j, column(j)?))).collect())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(NapsuError::Numerical("a Hessian thread panicked".into()))))
            .collect()
    });
    let mut h = DMatrix::zeros(d, d);
    for part in columns {
        for (j, col) in part? {
            h.set_column(j, &nalgebra::DVector::from_vec(col));
        }
    }
    Ok((&h + h.transpose()) * 0.5)
}

/// The Laplace approximation of `density`.
pub fn laplace<D: LogDensity + Sync>(density: &D, opts: &LaplaceOptions) -> Result<Laplace, NapsuError> {
    let (mean, h, iterations, starts) = mode(density, opts)?;
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

    /// θ = m + L z and Lᵀ g by the packed triangular products equal the sums
    /// they replace, element by element (L lower triangular, 7 × 7; the
    /// entries above its diagonal are never read).
    #[test]
    fn normalised_coordinates_by_products_equal_the_triangular_sums() {
        let d = 7;
        let v = |i: usize, j: usize| ((i * 13 + j * 7) % 11) as f64 / 5.0 - 1.0;
        let l = DMatrix::from_fn(d, d, |i, j| if j <= i { v(i, j) } else { 0.0 });
        let mut fit = Laplace {
            mean: (0..d).map(|i| i as f64 - 3.0).collect(),
            cov: &l * l.transpose(),
            cov_chol: l.clone(),
            iterations: 0,
            starts: 1,
        };
        let z: Vec<f64> = (0..d).map(|i| v(i, 3)).collect();
        let want: Vec<f64> = (0..d).map(|i| fit.mean[i] + (0..=i).map(|j| l[(i, j)] * z[j]).sum::<f64>()).collect();
        // Garbage above the diagonal must not matter.
        fit.cov_chol = DMatrix::from_fn(d, d, |i, j| if j <= i { v(i, j) } else { 1e6 });
        let norm = fit.normalisation();
        let got = norm.theta(&z);
        let mut gz = vec![f64::NAN; d];
        norm.gradient(&z, &mut gz);
        for i in 0..d {
            assert!((got[i] - want[i]).abs() < 1e-12, "θ_{i}: {} vs {}", got[i], want[i]);
            let lt: f64 = (i..d).map(|k| l[(k, i)] * z[k]).sum();
            assert!((gz[i] - lt).abs() < 1e-12, "(Lᵀg)_{i}: {} vs {lt}", gz[i]);
        }
    }

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

    /// The posterior without its information matrix, so `mode` uses L-BFGS.
    struct WithoutInformation<'a>(&'a crate::synth::napsu::likelihood::Posterior);

    impl LogDensity for WithoutInformation<'_> {
        fn dim(&self) -> usize {
            self.0.dim()
        }
        fn value_and_gradient(&self, x: &[f64]) -> Result<(f64, Vec<f64>), NapsuError> {
            self.0.log_density_and_gradient(x)
        }
    }

    /// Fisher scoring and L-BFGS (both polished by Newton) reach the same
    /// mode and Hessian on a noisy NAPSU-MQ posterior with a 3-way query.
    #[test]
    fn fisher_scoring_and_lbfgs_find_the_same_napsu_mode() {
        use crate::synth::napsu::{CanonicalFeatures, MaxEnt, likelihood::Posterior};
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(8);
        let sizes = [3, 2, 4, 2];
        let scopes = vec![vec![0, 1, 2], vec![2, 3], vec![0, 3]];
        let me = MaxEnt::new(CanonicalFeatures::new(&scopes, &sizes, 1000).unwrap());
        let truth: Vec<f64> = (0..me.features.len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let n = 5000.0;
        let (mu, _) = me.moments(&truth);
        let stats: Vec<f64> = mu.iter().map(|m| m * n + rng.random_range(-20.0..20.0)).collect();
        let post = Posterior::new(me, stats, n, 12.0).unwrap();
        let opts = LaplaceOptions::default();
        let (fisher, h_fisher, iterations, _) = mode(&post, &opts).unwrap();
        let (lbfgs, h_lbfgs, _, _) = mode(&WithoutInformation(&post), &opts).unwrap();
        assert!(iterations < 50, "Fisher scoring took {iterations} iterations");
        // Both are within a thousandth of a posterior sd of the mode.
        let sd: Vec<f64> = h_fisher.clone().try_inverse().unwrap().diagonal().iter().map(|v| v.sqrt()).collect();
        for ((a, b), s) in fisher.iter().zip(&lbfgs).zip(&sd) {
            assert!((a - b).abs() < 5e-3 * s, "{a} vs {b} (sd {s})");
        }
        let rel = (&h_fisher - &h_lbfgs).amax() / h_lbfgs.amax();
        assert!(rel < 1e-4, "Hessians differ by {rel}");
    }

    #[test]
    fn a_density_without_a_mode_is_a_clear_error() {
        // A "Gaussian" with a negative-definite precision has no mode.
        let g = Gaussian { precision: DMatrix::from_element(1, 1, -1.0), mean: vec![0.0] };
        let e = laplace(&g, &LaplaceOptions { max_iters: 50, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("did not converge") || e.contains("not positive definite"), "{e}");
    }
}
