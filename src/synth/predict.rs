//! Predicted noise of a synthesizer's measurements, and the workload-error
//! floor that noise alone sets, from public inputs only (issue 20, item 4;
//! see `privacy::accuracy`).
//!
//! The marginal-based synthesizers measure counts with discrete Gaussian
//! noise whose σ follows from ρ and the number of measurements, not from
//! the data:
//! - independent: the d one-way marginals at σ = √(d/2ρ);
//! - MST (NOTES §4; McKenna et al. 2021 §3): a third of ρ for the d one-way
//!   marginals, σ₁ = √(3d/2ρ), a third for the d − 1 tree edges,
//!   σ₃ = √(3(d−1)/2ρ), a third for selecting them;
//! - MWEM+PGM (001 Alg 1): T rounds (default d), each measured at σ = √(T/ρ);
//! - AIM (001 Alg 2–4): the one-way marginals at σ₀ = √(T/2αρ), T = 16d,
//!   α = 0.9; later rounds anneal σ down as the data demands, never below
//!   √(1/2αρ) (one round spending every measurement share);
//! - NAPSU-MQ (003 Alg 1): the k workload marginals once, σ = √(k/2ρ).
//!
//! Each noisy cell's error is that discrete Gaussian's, exactly. The floor:
//! a k-cell marginal measured directly once at σ has expected total
//! variation distance E|Z|·k/(2n) = σ·√(2/π)·k/(2n) from the truth (capped at
//! 1); the forecast averages it over the workload's marginals at the
//! smallest σ the mechanism measures with. Private-PGM pools overlapping
//! measurements and can beat it on a marginal; marginals the mechanism
//! never measures are worse (model error on top). It is a floor from noise
//! alone, as the issue asks, not a prediction of the final error.

use crate::domain::Domain;
use crate::missing::{Strategy, StrategyOptions};
use crate::privacy::accuracy::{fmt_num, integer_abs_quantile};
use crate::privacy::{Budget, Prediction};
use crate::synth::SynthOptions;
use crate::synth::run::Mechanism;
use crate::synth::workload::Workload;
use dpflow_udfs::noise::NoiseDistribution;

/// Public inputs of a synthesizer forecast.
#[derive(Debug, Clone, Copy)]
pub struct SynthForecastInput<'a> {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// The dataset's domain.
    pub domain: &'a Domain,
    /// The workload.
    pub workload: &'a Workload,
    /// The step's budget.
    pub budget: Budget,
    /// Synthesizer options (MWEM rounds).
    pub options: &'a SynthOptions,
    /// Missing-data strategy and its options.
    pub missing: Strategy,
    /// The strategy's budget shares.
    pub missing_options: &'a StrategyOptions,
    /// A public estimate of the row count (for the floor).
    pub rows: Option<f64>,
    /// Confidence level.
    pub level: f64,
}

/// The forecast: one prediction per group of equally noisy marginals, then
/// the workload floor (when `rows` is given).
pub fn predict(input: &SynthForecastInput<'_>) -> Vec<Prediction> {
    let level = input.level;
    let none = |why: String| vec![Prediction::new("synthetic data", "marginal", level, why)];
    let Some(rho_total) = input.budget.as_rho() else {
        return none("the budget has no zCDP equivalent".into());
    };
    // Budget the fit itself gets, and the marginals' cell counts.
    let (rho, sizes, strategy_note) = match input.missing {
        Strategy::Reproduce => (rho_total, input.domain.cardinalities(), String::new()),
        Strategy::CompleteRow => (rho_total, input.domain.columns().iter().map(|c| c.size()).collect(), String::new()),
        Strategy::Adaptive => (
            rho_total * (1.0 - input.missing_options.total_share),
            input.domain.columns().iter().map(|c| c.size()).collect(),
            format!("; {}% of ρ goes to the noisy row count", fmt_num(input.missing_options.total_share * 100.0)),
        ),
        Strategy::ImputeFirst(_) => (
            rho_total,
            input.domain.columns().iter().map(|c| c.size()).collect(),
            "; impute-first spends part of the budget on its imputation statistics, not deducted here: the \
             fit's noise is larger than shown"
                .to_string(),
        ),
    };
    let d = sizes.len();
    let df = d as f64;
    let cells = |r: &[usize]| -> f64 { r.iter().map(|&a| sizes[a] as f64).product() };
    let ones: Vec<Vec<usize>> = (0..d).map(|a| vec![a]).collect();
    // (what, σ, the marginals measured at σ (for the cell count shown)).
    let groups: Vec<(String, f64, Vec<Vec<usize>>)> = match input.mechanism {
        Mechanism::Independent => vec![("one-way marginals".into(), (df / (2.0 * rho)).sqrt(), ones)],
        Mechanism::Mst => {
            let s = (3.0 / (2.0 * rho)).sqrt();
            let pairs: Vec<Vec<usize>> = (0..d).flat_map(|a| (a + 1..d).map(move |b| vec![a, b])).collect();
            vec![
                ("one-way marginals".into(), s * df.sqrt(), ones),
                (
                    format!("{} two-way marginals of the tree", d.saturating_sub(1)),
                    s * (df - 1.0).max(1.0).sqrt(),
                    pairs,
                ),
            ]
        }
        Mechanism::Mwem => {
            let t = input.options.rounds.unwrap_or(d).max(1);
            let w = input.workload.queries.iter().map(|q| q.attrs.clone()).collect();
            vec![(format!("{t} workload marginals (one per round)"), (t as f64 / rho).sqrt(), w)]
        }
        Mechanism::Aim => {
            let (alpha, t) = (0.9, 16.0 * df);
            let w: Vec<Vec<usize>> = input.workload.downward_closure().into_iter().map(|(r, _)| r).collect();
            vec![
                ("one-way marginals (initialisation)".into(), (t / (2.0 * alpha * rho)).sqrt(), ones),
                (
                    "adaptively chosen marginals (best case: σ after annealing can go no lower)".into(),
                    (1.0 / (2.0 * alpha * rho)).sqrt(),
                    w,
                ),
            ]
        }
        Mechanism::NapsuMq => {
            let w: Vec<Vec<usize>> = input.workload.queries.iter().map(|q| q.attrs.clone()).collect();
            let k = w.len().max(1) as f64;
            vec![(format!("{} workload marginals", w.len()), (k / (2.0 * rho)).sqrt(), w)]
        }
        Mechanism::Kamino | Mechanism::Kaminoi | Mechanism::DpMisgan | Mechanism::DpGan => {
            return none(
                "no forecast for kamino/kaminoi/dp-misgan/dp-gan yet: their noise is a DP-SGD noise multiplier on \
                 network gradients, calibrated when the run has its noisy row counts; the release record lists it"
                    .into(),
            );
        }
        other => {
            return none(format!(
                "no forecast for {} yet: it is pure ε-DP with data-dependent structure (PrivBayes's network, the \
                 002 synthesizers' cross-tabulations and regressions); its noisy measurements and their scales \
                 are listed in the release manifest",
                other.synthesizer(input.options).name()
            ));
        }
    };
    let mut out = Vec::new();
    for (what, sigma, sets) in &groups {
        let noise = NoiseDistribution::Gaussian { sigma: *sigma };
        let mut p = Prediction::new(
            format!("{what}: each cell"),
            "marginal",
            level,
            format!(
                "exact: discrete Gaussian σ = {} on every cell (up to {} cells per marginal){strategy_note}",
                fmt_num(*sigma),
                fmt_num(sets.iter().map(|r| cells(r)).fold(0.0, f64::max))
            ),
        );
        p.half_width = Some(integer_abs_quantile(&noise, level));
        p.rmse = Some(*sigma);
        out.push(p);
    }
    if let Some(n) = input.rows.filter(|n| *n > 0.0) {
        let sigma = groups.iter().map(|g| g.1).fold(f64::INFINITY, f64::min);
        let w = &input.workload.queries;
        if !w.is_empty() {
            let tvd: f64 = w
                .iter()
                .map(|q| (sigma * (2.0 / std::f64::consts::PI).sqrt() * cells(&q.attrs) / (2.0 * n)).min(1.0))
                .sum::<f64>()
                / w.len() as f64;
            let mut p = Prediction::new(
                format!("workload {} ({} marginals)", input.workload.spec, w.len()),
                "workload error floor",
                level,
                format!(
                    "mean over the workload of a direct measurement's expected total variation distance at σ = {} \
                     and {} rows: a floor from noise alone (module docs)",
                    fmt_num(sigma),
                    fmt_num(n)
                ),
            );
            p.expected_tvd = Some(tvd);
            p.rows = Some(n);
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DomainSpec;

    fn domain() -> Domain {
        DomainSpec::parse(
            "columns:\n  - {name: a, kind: categorical, values: [x, y, z]}\n  - {name: b, kind: categorical, values: \
             [u, v]}\n  - {name: c, kind: categorical, values: [p, q, r, s]}\n",
            "test.yaml",
        )
        .unwrap()
        .domain
    }

    fn input<'a>(
        m: Mechanism,
        d: &'a Domain,
        w: &'a Workload,
        o: &'a SynthOptions,
        mo: &'a StrategyOptions,
    ) -> SynthForecastInput<'a> {
        SynthForecastInput {
            mechanism: m,
            domain: d,
            workload: w,
            budget: Budget::Zcdp { rho: 0.5 },
            options: o,
            missing: Strategy::Reproduce,
            missing_options: mo,
            rows: Some(1000.0),
            level: 0.95,
        }
    }

    #[test]
    fn mst_sigmas_spend_each_third_of_rho() {
        let d = domain();
        let w = Workload::parse("all-2way", &d).unwrap();
        let (o, mo) = (SynthOptions::default(), StrategyOptions::default());
        let p = predict(&input(Mechanism::Mst, &d, &w, &o, &mo));
        // d/(2σ₁²) = ρ/3 and (d − 1)/(2σ₃²) = ρ/3.
        let (s1, s3) = (p[0].rmse.unwrap(), p[1].rmse.unwrap());
        assert!((3.0 / (2.0 * s1 * s1) - 0.5 / 3.0).abs() < 1e-12);
        assert!((2.0 / (2.0 * s3 * s3) - 0.5 / 3.0).abs() < 1e-12);
        // The floor: σ₃ on the 2-way marginals' 6, 12 and 8 cells at n = 1000.
        let want =
            [6.0, 12.0, 8.0].iter().map(|k| s3 * (2.0 / std::f64::consts::PI).sqrt() * k / 2000.0).sum::<f64>() / 3.0;
        assert!((p[2].expected_tvd.unwrap() - want).abs() < 1e-12);
    }

    #[test]
    fn the_gaussian_mechanisms_spend_rho_in_their_measurements() {
        let d = domain();
        let w = Workload::parse("all-2way", &d).unwrap();
        let (o, mo) = (SynthOptions::default(), StrategyOptions::default());
        // independent: d/(2σ²) = ρ; napsu-mq: k/(2σ²) = ρ; mwem (T = d): per round 1/(2σ²) + ε²/8 = ρ/T with σ² = T/ρ.
        let ind = predict(&input(Mechanism::Independent, &d, &w, &o, &mo))[0].rmse.unwrap();
        assert!((3.0 / (2.0 * ind * ind) - 0.5).abs() < 1e-12);
        let napsu = predict(&input(Mechanism::NapsuMq, &d, &w, &o, &mo))[0].rmse.unwrap();
        assert!((3.0 / (2.0 * napsu * napsu) - 0.5).abs() < 1e-12);
        let mwem = predict(&input(Mechanism::Mwem, &d, &w, &o, &mo))[0].rmse.unwrap();
        assert!((mwem * mwem - 3.0 / 0.5).abs() < 1e-9);
        // A pure-DP synthesizer says why it has no forecast.
        let pb = predict(&input(Mechanism::Privbayes, &d, &w, &o, &mo));
        assert!(pb[0].half_width.is_none() && pb[0].basis.contains("no forecast"));
    }
}
