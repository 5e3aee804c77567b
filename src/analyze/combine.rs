//! Combining one estimate from each of m synthetic sets into one inference.
//!
//! Each set j gives a point estimate q_j and its variance estimate u_j (the
//! squared standard error an ordinary analysis of that set reports). With
//! q̄ = Σ q_j / m, b = Σ (q_j − q̄)² / (m − 1) and ū = Σ u_j / m
//! (`../shared/papers/NOTES.md` §7):
//!
//! - **Fully synthetic data** (Raghunathan, Reiter & Rubin 2003; Reiter
//!   2002; the rule of NA+MI, 003 §2 and App. B, eqs. (11)–(13)):
//!   T = (1 + 1/m)·b − ū, with ν = (m − 1)(1 − m·ū / ((m + 1)·b))² degrees
//!   of freedom. T can be negative; then T* = max(0, T) + (n_syn/n)·ū
//!   (Reiter 2002), where n_syn is the size of a synthetic set and n that of
//!   the original data. The sources give no degrees of freedom for T*; we use
//!   the normal reference there (ν = ∞), since T* is ū scaled, the variance
//!   of an ordinary complete-data analysis.
//! - **DIPS / MODIPS** (002 §3.3, eqs. (9)–(11)): T = b/m + ū with
//!   ν = (m − 1)(1 + m·ū/b)². 002 uses it for every one of its synthesizers
//!   that releases several sets.
//! - **One set** (m = 1): T = u with the analysis's own degrees of freedom.
//!   This is what an analyst gets from AIM or MST: intervals that ignore the
//!   DP noise and the synthesis (003 Figs. 1 and 4 show them under-cover).
//!
//! The (1 − α) interval is q̄ ± t_{ν, 1−α/2}·√T. With b = 0 the degrees of
//! freedom of both multi-set rules are infinite.

use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

use super::AnalyzeError;

/// How estimates from several synthetic sets are combined.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "rule")]
pub enum Rule {
    /// Fully synthetic data (NA+MI, NAPSU-MQ): T = (1 + 1/m)b − ū.
    FullySynthetic {
        /// n_syn / n, used only when T ≤ 0 (1 when the sets have the
        /// original data's size, the default).
        syn_over_original: f64,
    },
    /// 002 eqs. (9)–(11) (MODIPS and the other DIPS synthesizers): T = b/m + ū.
    Dips,
    /// One set, ordinary inference (m must be 1).
    Single,
}

impl Rule {
    /// The rule's name as the command line and reports spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::FullySynthetic { .. } => "fully-synthetic",
            Rule::Dips => "dips",
            Rule::Single => "single",
        }
    }
}

/// One combined inference.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Combined {
    /// q̄.
    pub estimate: f64,
    /// T (or T* for the fully-synthetic rule when T ≤ 0).
    pub variance: f64,
    /// √T.
    pub std_error: f64,
    /// Degrees of freedom of the reference t distribution (`None`: normal).
    pub df: Option<f64>,
    /// Lower end of the interval.
    pub ci_low: f64,
    /// Upper end of the interval.
    pub ci_high: f64,
    /// Sets combined.
    pub m: usize,
    /// Between-set variance b (0 for one set).
    pub between: f64,
    /// Mean within-set variance ū.
    pub within: f64,
    /// Whether the fully-synthetic rule fell back to T* (T ≤ 0).
    pub fallback: bool,
}

/// Combines `(q_j, u_j)` from m sets under `rule` for a (1 − `alpha`)
/// interval. `single_df` is the analysis's own degrees of freedom (`None`:
/// normal), used by [`Rule::Single`].
pub fn combine(
    term: &str,
    q: &[f64],
    u: &[f64],
    rule: Rule,
    alpha: f64,
    single_df: Option<f64>,
) -> Result<Combined, AnalyzeError> {
    let err = |problem: String| AnalyzeError::Combine { term: term.to_string(), problem };
    let m = q.len();
    if m == 0 || u.len() != m {
        return Err(err("no estimates to combine".into()));
    }
    if let Some(bad) = q.iter().chain(u).find(|v| !v.is_finite()) {
        return Err(err(format!("an estimate or variance is not finite ({bad})")));
    }
    if u.iter().any(|&v| v < 0.0) {
        return Err(err("a variance is negative".into()));
    }
    let mf = m as f64;
    let qbar = q.iter().sum::<f64>() / mf;
    let ubar = u.iter().sum::<f64>() / mf;
    let b = if m > 1 { q.iter().map(|x| (x - qbar).powi(2)).sum::<f64>() / (mf - 1.0) } else { 0.0 };
    let (variance, df, fallback) = match rule {
        Rule::Single => {
            if m != 1 {
                return Err(err(format!(
                    "the single-set rule takes one set, not {m}; use `fully-synthetic` (NAPSU-MQ) or `dips` (002)"
                )));
            }
            (ubar, single_df, false)
        }
        Rule::FullySynthetic { syn_over_original } => {
            if m < 2 {
                return Err(err("the fully-synthetic rule needs at least 2 sets (b is undefined for one)".into()));
            }
            let t = (1.0 + 1.0 / mf) * b - ubar;
            if t > 0.0 {
                let r = 1.0 - mf * ubar / ((mf + 1.0) * b);
                (t, Some((mf - 1.0) * r * r), false)
            } else {
                (t.max(0.0) + syn_over_original * ubar, None, true)
            }
        }
        Rule::Dips => {
            if m < 2 {
                return Err(err("the 002 rule needs at least 2 sets (b is undefined for one)".into()));
            }
            let t = b / mf + ubar;
            let df = if b > 0.0 { Some((mf - 1.0) * (1.0 + mf * ubar / b).powi(2)) } else { None };
            (t, df, false)
        }
    };
    let z = quantile(1.0 - alpha / 2.0, df).map_err(err)?;
    let se = variance.sqrt();
    Ok(Combined {
        estimate: qbar,
        variance,
        std_error: se,
        df,
        ci_low: qbar - z * se,
        ci_high: qbar + z * se,
        m,
        between: b,
        within: ubar,
        fallback,
    })
}

/// Degrees of freedom above which the t quantile comes from its
/// Cornish–Fisher expansion in 1/ν around the normal quantile z (Abramowitz
/// & Stegun 26.7.5, three terms; error O(ν⁻⁴), below 10⁻⁹ at ν = 1000).
/// statrs's inverse incomplete beta loses accuracy above ν ≈ 10⁴ (10⁻⁴ off
/// at 10⁶) and takes minutes for ν ≫ 10⁶, which the 002 rule gives when b
/// is tiny against ū.
pub const EXPANSION_DF: f64 = 1000.0;

/// The `p` quantile of Student's t with `df` degrees of freedom (normal for
/// `None` or infinite ν).
pub fn quantile(p: f64, df: Option<f64>) -> Result<f64, String> {
    match df {
        Some(v) if v.is_finite() && v > 0.0 && v <= EXPANSION_DF => {
            Ok(StudentsT::new(0.0, 1.0, v).map_err(|e| format!("t distribution: {e}"))?.inverse_cdf(p))
        }
        Some(v) if v.is_finite() && v > 0.0 => {
            let z = Normal::standard().inverse_cdf(p);
            let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
            Ok(z + (z3 + z) / (4.0 * v)
                + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
                + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * v.powi(3)))
        }
        Some(v) if v.is_finite() => Err(format!("{v} degrees of freedom (more rows than terms are needed)")),
        _ => Ok(Normal::standard().inverse_cdf(p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    /// A hand computation: q = (1, 2, 3, 6), u = (0.5, 0.5, 1, 1), m = 4.
    /// q̄ = 3, b = (4 + 1 + 0 + 9)/3 = 14/3, ū = 0.75.
    #[test]
    fn fully_synthetic_rule_matches_a_hand_computation() {
        let c = combine(
            "x",
            &[1.0, 2.0, 3.0, 6.0],
            &[0.5, 0.5, 1.0, 1.0],
            Rule::FullySynthetic { syn_over_original: 1.0 },
            0.05,
            None,
        )
        .unwrap();
        let b = 14.0 / 3.0;
        let t = 1.25 * b - 0.75; // 5.0833…
        let nu = 3.0 * (1.0f64 - 4.0 * 0.75 / (5.0 * b)).powi(2); // 3·(1 − 0.128571…)² = 2.27816…
        assert!(close(c.estimate, 3.0, 1e-15) && close(c.between, b, 1e-15) && close(c.within, 0.75, 1e-15));
        assert!(close(c.variance, t, 1e-14) && !c.fallback);
        assert!(close(c.df.unwrap(), nu, 1e-14));
        // scipy.stats.t.ppf(0.975, 2.2781632653) = 3.836425.
        let half = c.ci_high - c.estimate;
        assert!(close(half / t.sqrt(), 3.836425, 1e-6), "{}", half / t.sqrt());
    }

    /// Large ν (the 002 rule with b ≪ ū) returns at once and accurately:
    /// t₀.₉₇₅ at ν = 10⁴ is 1.960201240 (statrs and the expansion agree to 10⁻⁹), at
    /// 10⁶ it is 1.959966357, and at 10¹² the normal's 1.959963985.
    #[test]
    fn large_degrees_of_freedom_use_the_expansion() {
        for (v, want) in [(1e4, 1.960_201_240), (1e6, 1.959_966_357), (1e12, 1.959_963_985)] {
            let t = quantile(0.975, Some(v)).unwrap();
            assert!((t - want).abs() < 2e-9, "ν = {v}: {t}");
        }
        // Both sides of the switch agree.
        let below = quantile(0.975, Some(EXPANSION_DF)).unwrap();
        let above = quantile(0.975, Some(EXPANSION_DF * (1.0 + 1e-12))).unwrap();
        assert!((below - above).abs() < 1e-8);
        assert!(quantile(0.975, Some(0.0)).is_err());
    }

    #[test]
    fn a_non_positive_t_falls_back_to_scaled_mean_variance_and_the_normal() {
        // b = 0.01, ū = 1: T = 1.25·0.01 − 1 < 0.
        let q = [1.0, 1.1, 1.0, 1.1];
        let c = combine("x", &q, &[1.0; 4], Rule::FullySynthetic { syn_over_original: 0.5 }, 0.05, None).unwrap();
        assert!(c.fallback && close(c.variance, 0.5, 1e-15) && c.df.is_none());
        assert!(close(c.ci_high - c.estimate, 1.959964 * 0.5f64.sqrt(), 1e-6));
    }

    #[test]
    fn dips_rule_matches_002_eqs_9_to_11() {
        let c = combine("x", &[1.0, 2.0, 3.0, 6.0], &[0.5, 0.5, 1.0, 1.0], Rule::Dips, 0.05, None).unwrap();
        let b = 14.0 / 3.0;
        assert!(close(c.variance, b / 4.0 + 0.75, 1e-15));
        assert!(close(c.df.unwrap(), 3.0 * (1.0 + 4.0 * 0.75 / b).powi(2), 1e-14));
        // Identical estimates: b = 0, normal reference.
        let c = combine("x", &[2.0; 3], &[0.25; 3], Rule::Dips, 0.05, None).unwrap();
        assert!(c.df.is_none() && close(c.variance, 0.25, 1e-15));
    }

    #[test]
    fn single_set_uses_the_analysis_degrees_of_freedom() {
        let c = combine("x", &[2.0], &[0.04], Rule::Single, 0.05, Some(10.0)).unwrap();
        // t_{10, 0.975} = 2.228139.
        assert!(close(c.ci_high - 2.0, 2.228139 * 0.2, 1e-6));
        let e = combine("x", &[2.0, 3.0], &[0.04, 0.04], Rule::Single, 0.05, None).unwrap_err().to_string();
        assert!(e.contains("takes one set"), "{e}");
        let e = combine("x", &[2.0], &[0.04], Rule::Dips, 0.05, None).unwrap_err().to_string();
        assert!(e.contains("at least 2 sets"), "{e}");
        let e = combine("x", &[f64::NAN, 1.0], &[0.04, 0.1], Rule::Dips, 0.05, None).unwrap_err().to_string();
        assert!(e.contains("not finite"), "{e}");
    }
}
