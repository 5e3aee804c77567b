//! Goodness-of-fit helpers for sampler tests (chi-square and Kolmogorov–Smirnov).
//! Public so integration tests and benchmarks can reuse them.

use statrs::distribution::{ChiSquared, ContinuousCDF};
use std::collections::BTreeMap;

/// Chi-square goodness-of-fit of integer draws against a pmf; panics (test
/// failure) if the p-value is below `alpha`. Cells with expected count < 5 are
/// pooled into the two tails. Returns (statistic, degrees of freedom, p-value).
pub fn chi_square_test_integer(draws: &[i64], pmf: impl Fn(i64) -> f64, alpha: f64) -> (f64, usize, f64) {
    let n = draws.len() as f64;
    let mut counts: BTreeMap<i64, f64> = BTreeMap::new();
    for &d in draws {
        *counts.entry(d).or_default() += 1.0;
    }
    // Central cells with expected count >= 5, found by walking out from the mode.
    let mode = draws.iter().copied().fold(0i64, |m, d| if pmf(d) > pmf(m) { d } else { m });
    let mut lo = mode;
    while n * pmf(lo - 1) >= 5.0 {
        lo -= 1;
    }
    let mut hi = mode;
    while n * pmf(hi + 1) >= 5.0 {
        hi += 1;
    }
    let mut cells: Vec<(f64, f64)> = Vec::new(); // (observed, expected)
    let mut central_p = 0.0;
    for y in lo..=hi {
        let p = pmf(y);
        central_p += p;
        cells.push((counts.get(&y).copied().unwrap_or(0.0), n * p));
    }
    let obs_low: f64 = counts.range(..lo).map(|(_, c)| c).sum();
    let obs_high: f64 = counts.range(hi + 1..).map(|(_, c)| c).sum();
    let tail_p = (1.0 - central_p).max(0.0);
    // Split the tail mass by symmetry when the pmf is symmetric around the mode.
    let low_p: f64 = (1..=2000).map(|k| pmf(lo - k)).sum();
    let high_p = (tail_p - low_p).max(0.0);
    if n * low_p >= 1.0 || obs_low > 0.0 {
        cells.push((obs_low, (n * low_p).max(1e-9)));
    }
    if n * high_p >= 1.0 || obs_high > 0.0 {
        cells.push((obs_high, (n * high_p).max(1e-9)));
    }
    let stat: f64 = cells.iter().map(|(o, e)| (o - e).powi(2) / e).sum();
    let dof = cells.len().saturating_sub(1).max(1);
    let p_value = 1.0 - ChiSquared::new(dof as f64).unwrap().cdf(stat);
    assert!(
        p_value >= alpha,
        "chi-square goodness of fit failed: statistic {stat:.2} on {dof} dof, p = {p_value:.2e} < {alpha}"
    );
    (stat, dof, p_value)
}

/// Chi-square goodness-of-fit of category counts against probabilities.
pub fn chi_square_test_counts(observed: &[f64], probs: &[f64], alpha: f64) -> (f64, usize, f64) {
    assert_eq!(observed.len(), probs.len());
    let n: f64 = observed.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0usize;
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (o, p) in observed.iter().zip(probs) {
        let e = n * p;
        if e < 5.0 {
            pool_o += o;
            pool_e += e;
        } else {
            stat += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e;
        cells += 1;
    } else {
        assert_eq!(pool_o, 0.0, "observed a zero-probability category");
    }
    let dof = cells.saturating_sub(1).max(1);
    let p_value = 1.0 - ChiSquared::new(dof as f64).unwrap().cdf(stat);
    assert!(
        p_value >= alpha,
        "chi-square goodness of fit failed: statistic {stat:.2} on {dof} dof, p = {p_value:.2e} < {alpha}"
    );
    (stat, dof, p_value)
}

/// One-sample Kolmogorov–Smirnov test against a continuous cdf; panics if the
/// statistic exceeds the asymptotic critical value at level `alpha`.
/// Returns the KS statistic D.
pub fn ks_test(draws: &mut [f64], cdf: impl Fn(f64) -> f64, alpha: f64) -> f64 {
    draws.sort_by(f64::total_cmp);
    let n = draws.len() as f64;
    let mut d: f64 = 0.0;
    for (i, &x) in draws.iter().enumerate() {
        let f = cdf(x);
        d = d.max((i as f64 + 1.0) / n - f).max(f - i as f64 / n);
    }
    // Asymptotic critical value: sqrt(-ln(alpha/2)/2) / sqrt(n).
    let crit = (-(alpha / 2.0).ln() / 2.0).sqrt() / n.sqrt();
    assert!(d <= crit, "KS test failed: D = {d:.5} > critical {crit:.5} (alpha {alpha})");
    d
}
