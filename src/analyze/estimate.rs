//! The estimators `dpflow analyze` runs on each synthetic set, each with the
//! variance estimate the combining rules need (the squared standard error an
//! ordinary analysis of that one set reports, as statsmodels reports it).
//!
//! - **Mean** of a column: ȳ with s²/n, n − 1 degrees of freedom (an
//!   intercept-only linear model).
//! - **Proportion** of rows where a column equals a value: p̂ with
//!   p̂(1 − p̂)/n (002 §4.1), normal reference.
//! - **OLS**: β̂ = (XᵀX)⁻¹Xᵀy, Var = σ̂²(XᵀX)⁻¹ with σ̂² = RSS/(n − p), n − p
//!   degrees of freedom (statsmodels `OLS`, non-robust covariance).
//! - **Logistic regression**: the maximum-likelihood β̂ by Newton–Raphson
//!   with step halving, Var = (XᵀWX)⁻¹ at β̂, W = diag(p̂(1 − p̂)), normal
//!   reference (statsmodels `Logit`).
//!
//! Sums are accumulated block by block (XᵀX is p × p), and factorisations
//! are nalgebra's Cholesky on those small matrices.

use nalgebra::{DMatrix, DVector};
use ndarray::{Array1, Array2, Axis};

use super::AnalyzeError;
use super::design::Block;

/// Which estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EstimatorKind {
    /// Mean of a numeric column.
    Mean,
    /// Share of rows where a column equals a value.
    Proportion,
    /// Ordinary least squares.
    Ols,
    /// Logistic regression.
    Logistic,
}

impl EstimatorKind {
    /// The name the command line and the spec use.
    pub fn name(&self) -> &'static str {
        match self {
            EstimatorKind::Mean => "mean",
            EstimatorKind::Proportion => "proportion",
            EstimatorKind::Ols => "ols",
            EstimatorKind::Logistic => "logistic",
        }
    }
}

/// One set's estimates.
#[derive(Debug, Clone, PartialEq)]
pub struct SetEstimate {
    /// Point estimates, one per design column.
    pub estimates: Vec<f64>,
    /// Their variance estimates.
    pub variances: Vec<f64>,
    /// Rows used.
    pub rows: usize,
    /// Rows left out for a null.
    pub dropped: usize,
    /// The analysis's own degrees of freedom (`None`: normal reference).
    pub df: Option<f64>,
    /// Newton iterations (logistic regression only).
    pub iterations: usize,
}

/// Largest number of Newton iterations for a logistic regression.
pub const MAX_ITERATIONS: usize = 100;

/// Runs `kind` on a set's blocks (see [`super::design::Design::block`]).
pub fn estimate(kind: EstimatorKind, blocks: &[Block], set: &str) -> Result<SetEstimate, AnalyzeError> {
    let err = |problem: String| AnalyzeError::Estimate { set: set.to_string(), estimator: kind.name().into(), problem };
    let n: usize = blocks.iter().map(|b| b.y.len()).sum();
    let dropped = blocks.iter().map(|b| b.dropped).sum();
    let p = blocks.first().map_or(0, |b| b.x.ncols());
    if n <= p {
        return Err(err(format!(
            "{n} rows without nulls for {p} coefficients; it needs more rows than coefficients{}",
            if dropped > 0 { format!(" ({dropped} rows had a null)") } else { String::new() }
        )));
    }
    match kind {
        EstimatorKind::Mean | EstimatorKind::Ols => ols(blocks, n, dropped).map_err(err),
        EstimatorKind::Proportion => {
            let ones: f64 = blocks.iter().map(|b| b.y.sum()).sum();
            let ph = ones / n as f64;
            Ok(SetEstimate {
                estimates: vec![ph],
                variances: vec![ph * (1.0 - ph) / n as f64],
                rows: n,
                dropped,
                df: None,
                iterations: 0,
            })
        }
        EstimatorKind::Logistic => logistic(blocks, n, dropped).map_err(err),
    }
}

fn to_na(a: &Array2<f64>) -> DMatrix<f64> {
    DMatrix::from_fn(a.nrows(), a.ncols(), |i, j| a[[i, j]])
}

fn gram(blocks: &[Block], p: usize, weights: Option<&[Array1<f64>]>) -> Array2<f64> {
    let mut g = Array2::<f64>::zeros((p, p));
    for (k, b) in blocks.iter().enumerate() {
        match weights {
            None => g += &b.x.t().dot(&b.x),
            Some(w) => {
                let xw = &b.x * &w[k].mapv(f64::sqrt).insert_axis(Axis(1));
                g += &xw.t().dot(&xw);
            }
        }
    }
    g
}

const SINGULAR: &str = "the design is singular: a term is constant, two terms are collinear, or a level of a \
                        categorical term never occurs in this set; leave the term out or merge its rare levels";

const SEPARATION: &str = "a term or level separates the response perfectly in this set (the maximum-likelihood \
                          coefficient is infinite); leave the term out or merge its levels";

fn ols(blocks: &[Block], n: usize, dropped: usize) -> Result<SetEstimate, String> {
    let p = blocks[0].x.ncols();
    let xtx = gram(blocks, p, None);
    let mut xty = Array1::<f64>::zeros(p);
    for b in blocks {
        xty += &b.x.t().dot(&b.y);
    }
    let chol = to_na(&xtx).cholesky().ok_or(SINGULAR)?;
    let beta = chol.solve(&DVector::from_iterator(p, xty.iter().copied()));
    let beta_nd: Array1<f64> = beta.iter().copied().collect();
    let rss: f64 = blocks.iter().map(|b| (&b.y - &b.x.dot(&beta_nd)).mapv(|r| r * r).sum()).sum();
    let df = (n - p) as f64;
    let sigma2 = rss / df;
    let inv = chol.inverse();
    Ok(SetEstimate {
        estimates: beta.iter().copied().collect(),
        variances: (0..p).map(|i| sigma2 * inv[(i, i)]).collect(),
        rows: n,
        dropped,
        df: Some(df),
        iterations: 0,
    })
}

/// log(1 + e^η), without overflow.
fn log1pexp(eta: f64) -> f64 {
    if eta > 0.0 { eta + (-eta).exp().ln_1p() } else { eta.exp().ln_1p() }
}

fn log_likelihood(blocks: &[Block], beta: &Array1<f64>) -> f64 {
    blocks.iter().map(|b| b.x.dot(beta).iter().zip(&b.y).map(|(&e, &y)| y * e - log1pexp(e)).sum::<f64>()).sum()
}

fn logistic(blocks: &[Block], n: usize, dropped: usize) -> Result<SetEstimate, String> {
    let p = blocks[0].x.ncols();
    let mut beta = Array1::<f64>::zeros(p);
    let mut ll = log_likelihood(blocks, &beta);
    let sigmoid = |e: f64| 1.0 / (1.0 + (-e).exp());
    let mut iterations = 0;
    let mut converged = false;
    while iterations < MAX_ITERATIONS {
        iterations += 1;
        let mut grad = Array1::<f64>::zeros(p);
        let mut weights = Vec::with_capacity(blocks.len());
        for b in blocks {
            let mu = b.x.dot(&beta).mapv(sigmoid);
            grad += &b.x.t().dot(&(&b.y - &mu));
            weights.push(mu.mapv(|m| m * (1.0 - m)));
        }
        let h = gram(blocks, p, Some(&weights));
        let chol = match to_na(&h).cholesky() {
            Some(c) => c,
            // Weights collapse to 0 as fitted probabilities reach 0 or 1.
            None if iterations > 1 => return Err(SEPARATION.into()),
            None => return Err(SINGULAR.into()),
        };
        let step_full = chol.solve(&DVector::from_iterator(p, grad.iter().copied()));
        let step_full: Array1<f64> = step_full.iter().copied().collect();
        // Step halving: never accept a step that lowers the likelihood.
        let mut t = 1.0;
        let (next, next_ll) = loop {
            let cand = &beta + &(&step_full * t);
            let cand_ll = log_likelihood(blocks, &cand);
            if cand_ll >= ll - 1e-12 * ll.abs() || t < 1e-10 {
                break (cand, cand_ll);
            }
            t /= 2.0;
        };
        let change = (&next - &beta).iter().fold(0.0f64, |m, d| m.max(d.abs()));
        let scale = 1.0 + next.iter().fold(0.0f64, |m, b| m.max(b.abs()));
        beta = next;
        let ll_change = (next_ll - ll).abs();
        ll = next_ll;
        if change <= 1e-10 * scale || (ll_change <= 1e-14 * (1.0 + ll.abs()) && change <= 1e-6 * scale) {
            converged = true;
            break;
        }
    }
    if !converged {
        return Err(format!("no convergence in {MAX_ITERATIONS} Newton iterations: {SEPARATION}"));
    }
    let mut weights = Vec::with_capacity(blocks.len());
    let mut fitted_extreme = 0usize;
    for b in blocks {
        let mu = b.x.dot(&beta).mapv(sigmoid);
        fitted_extreme += mu.iter().filter(|&&m| !(1e-12..=1.0 - 1e-12).contains(&m)).count();
        weights.push(mu.mapv(|m| m * (1.0 - m)));
    }
    if fitted_extreme == n {
        return Err(SEPARATION.into());
    }
    let h = gram(blocks, p, Some(&weights));
    let inv = to_na(&h).cholesky().ok_or(SEPARATION)?.inverse();
    Ok(SetEstimate {
        estimates: beta.to_vec(),
        variances: (0..p).map(|i| inv[(i, i)]).collect(),
        rows: n,
        dropped,
        df: None,
        iterations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn block(x: Array2<f64>, y: Array1<f64>) -> Block {
        Block { x, y, dropped: 0 }
    }

    /// Simple regression by hand: x = (1, 2, 3, 4), y = (1, 3, 2, 5).
    /// x̄ = 2.5, ȳ = 2.75, Sxx = 5, Sxy = 5.5: slope 1.1, intercept 0.
    /// Residuals (−0.1, 0.8, −1.3, 0.6): RSS = 2.7, σ̂² = 1.35,
    /// Var(slope) = σ̂²/Sxx = 0.27, Var(intercept) = σ̂²(1/n + x̄²/Sxx) = 2.025.
    #[test]
    fn ols_matches_the_textbook_formulas_on_a_hand_example() {
        let x = array![[1.0, 1.0], [1.0, 2.0], [1.0, 3.0], [1.0, 4.0]];
        let y = array![1.0, 3.0, 2.0, 5.0];
        // Split over two blocks: the sums must not care.
        let blocks = [
            block(x.slice(ndarray::s![..1, ..]).to_owned(), y.slice(ndarray::s![..1]).to_owned()),
            block(x.slice(ndarray::s![1.., ..]).to_owned(), y.slice(ndarray::s![1..]).to_owned()),
        ];
        let e = estimate(EstimatorKind::Ols, &blocks, "s").unwrap();
        assert!((e.estimates[0] - 0.0).abs() < 1e-12 && (e.estimates[1] - 1.1).abs() < 1e-12, "{e:?}");
        assert!((e.variances[1] - 0.27).abs() < 1e-12 && (e.variances[0] - 2.025).abs() < 1e-12, "{e:?}");
        assert_eq!(e.df, Some(2.0));
    }

    #[test]
    fn mean_and_proportion_have_their_textbook_variances() {
        let y = array![1.0, 2.0, 3.0, 6.0];
        let e = estimate(EstimatorKind::Mean, &[block(Array2::ones((4, 1)), y)], "s").unwrap();
        // ȳ = 3, s² = (4 + 1 + 0 + 9)/3.
        assert!((e.estimates[0] - 3.0).abs() < 1e-12 && (e.variances[0] - 14.0 / 12.0).abs() < 1e-12);
        assert_eq!(e.df, Some(3.0));
        let y = array![1.0, 0.0, 0.0, 1.0, 1.0];
        let e = estimate(EstimatorKind::Proportion, &[block(Array2::ones((5, 1)), y)], "s").unwrap();
        assert!((e.estimates[0] - 0.6).abs() < 1e-12 && (e.variances[0] - 0.6 * 0.4 / 5.0).abs() < 1e-12);
    }

    /// With one binary predictor the logistic MLE is closed-form: the
    /// intercept is the log-odds in group 0 and the slope the log odds
    /// ratio; the variances are the sums of reciprocal cell counts.
    #[test]
    fn logistic_matches_the_closed_form_two_by_two_table() {
        // Group 0: 3 ones, 7 zeros; group 1: 6 ones, 4 zeros.
        let mut rows = Vec::new();
        for (g, ones, zeros) in [(0.0, 3, 7), (1.0, 6, 4)] {
            rows.extend(std::iter::repeat_n((g, 1.0), ones));
            rows.extend(std::iter::repeat_n((g, 0.0), zeros));
        }
        let x = Array2::from_shape_fn((rows.len(), 2), |(i, j)| if j == 0 { 1.0 } else { rows[i].0 });
        let y: Array1<f64> = rows.iter().map(|r| r.1).collect();
        let e = estimate(EstimatorKind::Logistic, &[block(x, y)], "s").unwrap();
        let b0 = (3.0f64 / 7.0).ln();
        let b1 = (6.0f64 / 4.0).ln() - b0;
        assert!((e.estimates[0] - b0).abs() < 1e-9 && (e.estimates[1] - b1).abs() < 1e-9, "{e:?}");
        let v0 = 1.0 / 3.0 + 1.0 / 7.0;
        let v1 = v0 + 1.0 / 6.0 + 1.0 / 4.0;
        assert!((e.variances[0] - v0).abs() < 1e-9 && (e.variances[1] - v1).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn separation_collinearity_and_too_few_rows_are_clear_errors() {
        // x separates y perfectly.
        let x = array![[1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]];
        let y = array![0.0, 0.0, 1.0, 1.0, 0.0];
        let e = estimate(EstimatorKind::Logistic, &[block(x, y)], "set 2").unwrap_err().to_string();
        assert!(e.contains("set 2") && e.contains("separat"), "{e}");
        // Two identical columns.
        let x = array![[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]];
        let e = estimate(EstimatorKind::Ols, &[block(x, array![1.0, 2.0, 3.0])], "s").unwrap_err().to_string();
        assert!(e.contains("singular"), "{e}");
        let x = array![[1.0, 1.0], [1.0, 2.0]];
        let e = estimate(EstimatorKind::Ols, &[block(x, array![1.0, 2.0])], "s").unwrap_err().to_string();
        assert!(e.contains("more rows than coefficients"), "{e}");
    }

    /// Quasi-complete separation: every row of one group has y = 0, the
    /// other group has both outcomes. The group's coefficient has no finite
    /// maximum-likelihood value (it runs off to −∞ while the fit of the
    /// other rows stays put), so the set has no estimate: it must be an
    /// error, not a finite number with an enormous variance that swamps
    /// Rubin's rules. (Complete separation is checked above.)
    #[test]
    fn quasi_complete_separation_is_an_error() {
        let n = 400;
        let x = Array2::from_shape_fn((n, 3), |(i, j)| match j {
            0 => 1.0,
            1 => (i % 2) as f64,
            _ => ((i * 37) % 23) as f64 / 10.0,
        });
        // Group 1 (odd rows): y = 1 on about a third; group 0: never.
        let y = Array1::from_shape_fn(n, |i| if i % 2 == 1 && (i * 7) % 3 == 0 { 1.0 } else { 0.0 });
        let e = estimate(EstimatorKind::Logistic, &[block(x, y)], "set 5").map(|e| format!("{e:?}"));
        let e = e.expect_err("a coefficient without a finite estimate").to_string();
        assert!(e.contains("set 5") && e.contains("separat"), "{e}");
    }
}
