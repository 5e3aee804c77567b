//! Private-PGM estimation (001 §2.3; McKenna et al. 2019, Alg. 1): find the
//! graphical model whose marginals best explain noisy measurements,
//!
//!   L(μ) = Σ_i ‖Q_i M_{r_i}(μ) − ỹ_i‖² / (2σ_i)      (L2)
//!   L(μ) = Σ_i ‖Q_i M_{r_i}(μ) − ỹ_i‖₁ / σ_i         (L1)
//!
//! over distributions with total mass n, by mirror descent on the
//! log-potentials θ with marginals from belief propagation and an Armijo line
//! search (step 2/n initially, ×1.01 after a sufficient decrease, ×½ otherwise),
//! exactly the update private-pgm (mbi 2.0) uses. The weights are 1/σ_i as in
//! 001 §2.3 and the issue (up to the constant ½); `Weighting::InverseVariance`
//! gives the Gaussian maximum-likelihood weights 1/σ_i² that mbi 2.0.0 (PyPI)
//! uses, for side-by-side comparisons.

use serde::{Deserialize, Serialize};

use super::factor::Factor;
use super::jtree::JunctionTree;
use super::model::{GraphicalModel, belief_propagation, par_map};

/// How a measurement reads the marginal of its attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Query {
    /// The full marginal.
    Identity,
    /// A subset of its cells (indices into the sorted-attribute layout), e.g.
    /// the non-null block of an observed-only marginal when the model has null codes.
    Select(Vec<usize>),
    /// The marginal scaled by a known factor (e.g. observed-only marginals of a
    /// model without null codes: ≈ n_obs/n of the full marginal).
    Scaled(f64),
    /// Each cell multiplied by its own public weight (e.g. MST's compressed
    /// domains re-express a merged cell as its sum/√k).
    Weighted(Vec<f64>),
}

/// One noisy measurement ỹ = Q·M_r(D) + noise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Attribute ids, sorted.
    pub attrs: Vec<usize>,
    /// Noisy values in the query's layout.
    pub values: Vec<f64>,
    /// Noise standard deviation (the weight is 1/σ).
    pub sigma: f64,
    /// The linear query.
    pub query: Query,
}

impl Measurement {
    /// A full-marginal measurement given in attribute order `attrs` (any order).
    pub fn new(attrs: &[usize], sizes: &[usize], values: &[f64], sigma: f64) -> Self {
        let shape: Vec<usize> = attrs.iter().map(|&a| sizes[a]).collect();
        let f = Factor::from_unsorted(attrs, &shape, values);
        Self { attrs: f.attrs, values: f.values, sigma, query: Query::Identity }
    }

    fn apply(&self, marginal: &Factor) -> Vec<f64> {
        match &self.query {
            Query::Identity => marginal.values.clone(),
            Query::Select(idx) => idx.iter().map(|&i| marginal.values[i]).collect(),
            Query::Scaled(c) => marginal.values.iter().map(|v| v * c).collect(),
            Query::Weighted(w) => marginal.values.iter().zip(w).map(|(v, c)| v * c).collect(),
        }
    }

    /// Adds Qᵀ g into a factor over this measurement's attributes.
    fn scatter(&self, g: &[f64], into: &mut Factor) {
        match &self.query {
            Query::Identity => into.values.iter_mut().zip(g).for_each(|(a, b)| *a += b),
            Query::Select(idx) => idx.iter().zip(g).for_each(|(&i, b)| into.values[i] += b),
            Query::Scaled(c) => into.values.iter_mut().zip(g).for_each(|(a, b)| *a += c * b),
            Query::Weighted(w) => into.values.iter_mut().zip(g).zip(w).for_each(|((a, b), c)| *a += c * b),
        }
    }
}

/// Loss norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// Squared L2 (Gaussian noise).
    #[default]
    L2,
    /// L1 (Laplace noise).
    L1,
}

/// Weights of the L2 loss terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weighting {
    /// 1/σ (001 §2.3, the objective).
    #[default]
    InverseSigma,
    /// 1/σ² (Gaussian likelihood; mbi 2.0.0).
    InverseVariance,
}

impl Weighting {
    fn weight(&self, sigma: f64) -> f64 {
        match self {
            Weighting::InverseSigma => 1.0 / sigma,
            Weighting::InverseVariance => 1.0 / (sigma * sigma),
        }
    }
}

/// Estimation options.
#[derive(Debug, Clone)]
pub struct EstimateOptions {
    /// Mirror-descent iterations.
    pub iters: usize,
    /// Loss.
    pub norm: Norm,
    /// Known total; estimated from the measurements when `None` (unbounded DP).
    pub total: Option<f64>,
    /// Stop early when the loss improves by less than this (relative) over 50 iterations.
    pub tolerance: f64,
    /// L2 weights.
    pub weighting: Weighting,
    /// Initial mirror-descent step; the Lipschitz step 2/(L·n) when `None`.
    /// A warm-started fit passes the step its predecessor ended with.
    pub initial_step: Option<f64>,
}

impl Default for EstimateOptions {
    fn default() -> Self {
        Self {
            iters: 1000,
            norm: Norm::L2,
            total: None,
            tolerance: 0.0,
            weighting: Weighting::InverseSigma,
            initial_step: None,
        }
    }
}

/// Result of estimation.
#[derive(Debug, Clone)]
pub struct Estimate {
    /// The fitted model.
    pub model: GraphicalModel,
    /// Final objective value.
    pub loss: f64,
    /// Iterations run.
    pub iterations: usize,
    /// The step size the line search ended with.
    pub step: f64,
}

/// Minimum-variance unbiased estimate of the total from full-marginal
/// measurements (001 §3.2, unbounded DP; as mbi's `minimum_variance_unbiased_total`).
pub fn estimate_total(measurements: &[Measurement]) -> f64 {
    let mut num = 0.0;
    let mut den = 0.0;
    for m in measurements.iter().filter(|m| m.query == Query::Identity) {
        let var = m.sigma * m.sigma * m.values.len() as f64;
        num += m.values.iter().sum::<f64>() / var;
        den += 1.0 / var;
    }
    if den == 0.0 { 1.0 } else { (num / den).max(1.0) }
}

/// The maximal sets among `sets`.
fn maximal(sets: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut sorted = sets.to_vec();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in sorted {
        if !out.iter().any(|o| s.iter().all(|a| o.contains(a))) {
            out.push(s);
        }
    }
    out
}

/// The largest warm-started step, as a multiple of the Lipschitz step (the
/// smallest is the Lipschitz step itself).
const WARM_STEP_CAP: f64 = 1024.0;

/// Huber smoothing width for the L1 loss, relative to σ.
const HUBER: f64 = 0.1;

struct Problem<'a> {
    sizes: &'a [usize],
    measurements: &'a [Measurement],
    norm: Norm,
    weighting: Weighting,
    /// Potential cliques (maximal measured sets ∪ warm-start cliques).
    cliques: Vec<Vec<usize>>,
    /// Measurement → potential clique.
    assign: Vec<usize>,
    jt: JunctionTree,
    /// Junction-tree clique → the potential cliques it holds.
    held: Vec<Vec<usize>>,
    /// Junction-tree clique → the measurements read from its marginal.
    answered: Vec<Vec<usize>>,
    /// Potential clique → its measurements.
    measured: Vec<Vec<usize>>,
    total: f64,
}

/// The model's answers at one point of the descent, and the loss and its
/// gradient there, all in measurement space: `answers[i]` is the model's
/// marginal over measurement i's attributes, `grads[i]` the loss's gradient
/// with respect to it (Qᵀ applied). The gradient with respect to a potential
/// clique's marginal is the sum of its measurements' `grads`, broadcast, so
/// it is never materialised.
struct Point {
    answers: Vec<Factor>,
    loss: f64,
    grads: Vec<Factor>,
}

impl Problem<'_> {
    /// Evaluates the model with log-potentials θ. `pool` holds the clique
    /// tables of the previous evaluation and lends them to this one (issue
    /// 19: no clique-sized allocation per iteration).
    fn evaluate(&self, theta: &[Factor], pool: &mut Vec<Factor>) -> Point {
        let mut psi: Vec<Factor> = if pool.len() == self.jt.cliques.len() {
            std::mem::take(pool)
        } else {
            self.jt.cliques.iter().map(|c| Factor::zeros(c, self.sizes)).collect()
        };
        for (c, table) in psi.iter_mut().enumerate() {
            let terms: Vec<(&Factor, f64)> = self.held[c].iter().map(|&k| (&theta[k], 1.0)).collect();
            table.set_broadcast_sum(None, &terms);
        }
        let counts = belief_propagation(&self.jt, psi, self.total);
        // Every measurement's marginal, read off its junction-tree clique in
        // one pass per clique.
        let cs: Vec<usize> = (0..counts.len()).collect();
        let cost = counts.iter().map(Factor::len).sum();
        let per_clique = par_map(&cs, cost, |&c| {
            let keeps: Vec<&[usize]> =
                self.answered[c].iter().map(|&i| self.measurements[i].attrs.as_slice()).collect();
            counts[c].sums_to(&keeps)
        });
        let mut answers: Vec<Factor> = vec![Factor::default(); self.measurements.len()];
        for (c, sums) in per_clique.into_iter().enumerate() {
            for (&i, f) in self.answered[c].iter().zip(sums) {
                answers[i] = f;
            }
        }
        *pool = counts;
        let (loss, grads) = self.loss_grad(&answers);
        Point { answers, loss, grads }
    }

    /// Loss and its gradient with respect to each measurement's marginal.
    fn loss_grad(&self, answers: &[Factor]) -> (f64, Vec<Factor>) {
        let mut loss = 0.0;
        let mut grads = Vec::with_capacity(self.measurements.len());
        for (m, marg) in self.measurements.iter().zip(answers) {
            let fitted = m.apply(marg);
            let g: Vec<f64> = match self.norm {
                Norm::L2 => {
                    let w = self.weighting.weight(m.sigma);
                    fitted
                        .iter()
                        .zip(&m.values)
                        .map(|(f, y)| {
                            let d = f - y;
                            loss += 0.5 * w * d * d;
                            w * d
                        })
                        .collect()
                }
                // L1 is minimised through its Huber smoothing with δ = σ/10 (the
                // plain subgradient stalls the Armijo line search); the smoothed
                // loss is within δ/2 per cell of the L1 loss.
                Norm::L1 => fitted
                    .iter()
                    .zip(&m.values)
                    .map(|(f, y)| {
                        let d = f - y;
                        let delta = m.sigma * HUBER;
                        if d.abs() <= delta {
                            loss += d * d / (2.0 * delta) / m.sigma;
                            d / delta / m.sigma
                        } else {
                            loss += (d.abs() - delta / 2.0) / m.sigma;
                            d.signum() / m.sigma
                        }
                    })
                    .collect(),
            };
            let mut gm = Factor::zeros(&m.attrs, self.sizes);
            m.scatter(&g, &mut gm);
            grads.push(gm);
        }
        (loss, grads)
    }

    /// The mirror-descent step θ' = θ − α·∇: each potential clique minus α
    /// times its measurements' gradients, broadcast, in one pass.
    fn step(&self, theta: &[Factor], grads: &[Factor], alpha: f64, into: &mut [Factor]) {
        for (k, out) in into.iter_mut().enumerate() {
            let terms: Vec<(&Factor, f64)> = self.measured[k].iter().map(|&i| (&grads[i], -alpha)).collect();
            out.set_broadcast_sum(Some(&theta[k]), &terms);
        }
    }
}

fn lipschitz(p: &Problem<'_>) -> f64 {
    let mut blocks = vec![0.0f64; p.cliques.len()];
    for (i, m) in p.measurements.iter().enumerate() {
        let k = p.assign[i];
        let big: f64 = p.cliques[k].iter().map(|&a| p.sizes[a] as f64).product();
        let small: f64 = m.attrs.iter().map(|&a| p.sizes[a] as f64).product();
        let q = match &m.query {
            Query::Scaled(c) => c * c,
            Query::Weighted(w) => w.iter().fold(0.0f64, |a, c| a.max(c * c)),
            _ => 1.0,
        };
        let w = match p.norm {
            Norm::L2 => p.weighting.weight(m.sigma),
            Norm::L1 => 1.0 / (m.sigma * m.sigma * HUBER),
        };
        blocks[k] += q * w * big / small;
    }
    blocks.into_iter().fold(0.0, f64::max).max(1e-12)
}

/// ⟨∇L(μ), μ − μ'⟩, in measurement space: the gradient with respect to a
/// clique's marginal is a sum of broadcast measurement gradients, and
/// broadcasting is the adjoint of summing out, so the inner product over the
/// cliques equals Σ_i ⟨g_i, M_i(μ) − M_i(μ')⟩ over the measurements.
fn dot(grads: &[Factor], a: &[Factor], b: &[Factor]) -> f64 {
    grads
        .iter()
        .zip(a.iter().zip(b))
        .map(|(g, (x, y))| {
            g.values.iter().zip(x.values.iter().zip(&y.values)).map(|(p, (q, r))| p * (q - r)).sum::<f64>()
        })
        .sum()
}

/// Fits a graphical model to `measurements`, optionally warm-started from a
/// previous model (its potentials on cliques still present are reused).
pub fn estimate(
    sizes: &[usize],
    measurements: &[Measurement],
    options: &EstimateOptions,
    warm_start: Option<&GraphicalModel>,
) -> Estimate {
    let total = options.total.unwrap_or_else(|| estimate_total(measurements));
    let mut sets: Vec<Vec<usize>> = measurements.iter().map(|m| m.attrs.clone()).collect();
    if let Some(w) = warm_start {
        sets.extend(w.potentials.iter().map(|p| p.attrs.clone()));
    }
    let cliques = maximal(&sets);
    let assign: Vec<usize> = measurements
        .iter()
        .map(|m| cliques.iter().position(|c| m.attrs.iter().all(|a| c.contains(a))).expect("maximal covers"))
        .collect();
    let jt = JunctionTree::build(sizes, &cliques);
    let to_jt: Vec<usize> = cliques.iter().map(|c| jt.clique_containing(c).expect("jt covers")).collect();
    let mut held = vec![Vec::new(); jt.cliques.len()];
    let mut measured = vec![Vec::new(); cliques.len()];
    let mut answered = vec![Vec::new(); jt.cliques.len()];
    for (k, &c) in to_jt.iter().enumerate() {
        held[c].push(k);
    }
    for (i, &k) in assign.iter().enumerate() {
        measured[k].push(i);
        answered[to_jt[k]].push(i);
    }
    let problem = Problem {
        sizes,
        measurements,
        norm: options.norm,
        weighting: options.weighting,
        cliques,
        assign,
        jt,
        held,
        answered,
        measured,
        total,
    };

    // θ: zeros, plus the warm start's potentials moved onto the new cliques.
    let mut theta: Vec<Factor> = problem.cliques.iter().map(|c| Factor::zeros(c, sizes)).collect();
    if let Some(w) = warm_start {
        for p in &w.potentials {
            let k = problem.cliques.iter().position(|c| p.attrs.iter().all(|a| c.contains(a))).expect("covered");
            theta[k].add_assign_sub(p);
        }
    }

    // Initial step 2/(L·n) with L the Lipschitz constant of ∇L (exact for
    // identity queries: max over cliques of Σ w·|C|/|r|), as mbi 2.0 does.
    let lipschitz = lipschitz(&problem);
    // A warm step is kept between that and 2¹⁰ times it: a fit run to
    // convergence ends with its step halved to nothing (the Armijo test fails
    // at rounding level), and a long fit can grow it by 1% per iteration;
    // either extreme would cost the next fit dozens of iterations to undo.
    let lipschitz_step = 2.0 / (lipschitz * total);
    let mut alpha = options
        .initial_step
        .filter(|s| s.is_finite())
        .map_or(lipschitz_step, |s| s.clamp(lipschitz_step, WARM_STEP_CAP * lipschitz_step));
    let mut pool = Vec::new();
    let mut cur = problem.evaluate(&theta, &mut pool);
    let mut iterations = 0;
    let mut window_start_loss = cur.loss;
    // The trial point's buffer, kept across iterations (swapped with θ on an
    // accepted step) instead of a fresh clone of θ per step.
    let mut theta2: Vec<Factor> = theta.clone();
    for t in 0..options.iters {
        iterations = t + 1;
        problem.step(&theta, &cur.grads, alpha, &mut theta2);
        let next = problem.evaluate(&theta2, &mut pool);
        if cur.loss - next.loss >= 0.5 * alpha * dot(&cur.grads, &cur.answers, &next.answers) {
            std::mem::swap(&mut theta, &mut theta2);
            cur = next;
            alpha *= 1.01;
        } else {
            alpha *= 0.5;
        }
        if options.tolerance > 0.0 && (t + 1) % 50 == 0 {
            if window_start_loss - cur.loss <= options.tolerance * window_start_loss.abs().max(1e-300) {
                break;
            }
            window_start_loss = cur.loss;
        }
    }
    let mut loss = cur.loss;
    if options.norm == Norm::L1 {
        // The answers come in measurement order, as `objective` asks for them.
        let mut answers = cur.answers.into_iter();
        loss = objective(measurements, Norm::L1, |_| answers.next().expect("one answer per measurement"));
    }
    let model = GraphicalModel { sizes: sizes.to_vec(), potentials: theta, total, jtree: problem.jt };
    Estimate { model, loss, iterations, step: alpha }
}

/// The objective value (1/σ weights) of any marginal oracle: `marginal(attrs)` → counts.
pub fn objective(measurements: &[Measurement], norm: Norm, marginal: impl FnMut(&[usize]) -> Factor) -> f64 {
    objective_weighted(measurements, norm, Weighting::InverseSigma, marginal)
}

/// The objective value under a given L2 weighting.
pub fn objective_weighted(
    measurements: &[Measurement],
    norm: Norm,
    weighting: Weighting,
    mut marginal: impl FnMut(&[usize]) -> Factor,
) -> f64 {
    measurements
        .iter()
        .map(|m| {
            let fitted = m.apply(&marginal(&m.attrs));
            fitted
                .iter()
                .zip(&m.values)
                .map(|(f, y)| match norm {
                    Norm::L2 => 0.5 * weighting.weight(m.sigma) * (f - y) * (f - y),
                    Norm::L1 => (f - y).abs() / m.sigma,
                })
                .sum::<f64>()
        })
        .sum()
}
