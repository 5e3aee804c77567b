//! Synthesizer tests: budget accounting to 1e-12, convergence at large ε,
//! and AIM error-bound coverage over repeated runs.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::run::{Mechanism, fit_with_answers};
use super::*;
use crate::domain::DomainSpec;

/// A small correlated dataset: rows of codes.
fn data(n: usize, seed: u64) -> (Domain, Vec<Vec<u32>>) {
    let domain = DomainSpec::parse(r#"{"a": 3, "b": 4, "c": 2, "d": 5}"#, "t.json").unwrap().domain;
    let mut rng = SmallRng::seed_from_u64(seed);
    let rows = (0..n)
        .map(|_| {
            let a = rng.random_range(0..3u32);
            let b = if rng.random::<f64>() < 0.7 { a } else { rng.random_range(0..4) };
            let c = u32::from(b >= 2 && rng.random::<f64>() < 0.8);
            let d = if rng.random::<f64>() < 0.6 { (a + c) % 5 } else { rng.random_range(0..5) };
            vec![a, b, c, d]
        })
        .collect();
    (domain, rows)
}

fn answers_for(domain: &Domain, rows: &[Vec<u32>], sets: &[Vec<usize>]) -> Answers {
    let sizes = domain.cardinalities();
    let mut a = Answers { sizes: sizes.clone(), map: Default::default() };
    for s in sets {
        let shape: Vec<usize> = s.iter().map(|&x| sizes[x]).collect();
        let st = crate::pgm::factor::strides(&shape);
        let mut v = vec![0.0; shape.iter().product()];
        for r in rows {
            let i: usize = s.iter().zip(&st).map(|(&x, k)| r[x] as usize * k).sum();
            v[i] += 1.0;
        }
        a.map.insert(s.clone(), v);
    }
    a
}

fn run(mech: Mechanism, rho: f64, seed: u64, n: usize, workload: &str) -> (Fitted, f64, Answers, Domain) {
    let (domain, rows) = data(n, seed);
    let w = Workload::parse(workload, &domain).unwrap();
    let s = mech.synthesizer(&SynthOptions::default());
    let mut req = s.required_marginals(&domain, &w);
    for q in &w.queries {
        if !req.contains(&q.attrs) {
            req.push(q.attrs.clone());
        }
    }
    let answers = answers_for(&domain, &rows, &req);
    let iters = if mech == Mechanism::PrivbayesPgm { 2000 } else { 300 };
    let opts = SynthOptions { iters, ..Default::default() };
    let mut rng = DpRng::unsafe_seeded(seed);
    let (fitted, acct) = fit_with_answers(s.as_ref(), &domain, &answers, &w, rho, &opts, &mut rng, &|_| {}).unwrap();
    (fitted, acct.filter().spent_amount(), answers, domain)
}

#[test]
fn every_mechanism_spends_exactly_its_budget() {
    for mech in crate::synth::run::FITTED_SYNTHESIZERS {
        // (ρ for zCDP synthesizers, ε for PrivBayes.)
        for rho in [0.01, 0.5] {
            let (_, spent, _, _) = run(mech, rho, 1, 2000, "all-2way");
            assert!(spent <= rho * (1.0 + 1e-12), "{mech:?} overspent: {spent} > {rho}");
            assert!((spent - rho).abs() <= 1e-12 * rho, "{mech:?}: spent {spent} of {rho}");
        }
    }
}

#[test]
fn large_epsilon_converges_to_the_real_marginals() {
    for mech in [Mechanism::Aim, Mechanism::Mst, Mechanism::Privbayes, Mechanism::PrivbayesPgm] {
        let (fitted, _, answers, _) = run(mech, 5000.0, 3, 3000, "all-2way");
        let b = fitted.model.beliefs();
        // AIM ends up measuring every 2-way marginal at this ε; MST and PrivBayes
        // measure a network, so only its measured marginals converge.
        let names = ["a", "b", "c", "d"];
        let measured: Vec<Vec<usize>> = fitted
            .metadata
            .measurements
            .iter()
            .map(|m| m.attributes.iter().map(|x| names.iter().position(|n| n == x).unwrap()).collect())
            .collect();
        let sets: Vec<Vec<usize>> = if mech == Mechanism::Aim { two_way(4) } else { measured };
        for s in sets {
            let mut est = b.marginal_any(&s, &fitted.model.sizes).values;
            if let Some(c) = &fitted.compression {
                assert!(c.is_trivial(), "no value is rare at this ε");
                est = c.compress_table(&s, &answers.sizes, &est);
            }
            let tvd = crate::eval::tvd(answers.get(&s).unwrap(), &est);
            assert!(tvd < 0.01, "{mech:?} {s:?}: TVD {tvd}");
        }
    }
}

#[test]
fn aim_error_bounds_hold_on_at_least_95_percent() {
    let mut held = 0;
    let mut total = 0;
    for seed in 0..12 {
        let (fitted, _, answers, _) = run(Mechanism::Aim, 0.05, 100 + seed, 2000, "all-2way");
        let b = fitted.model.beliefs();
        assert_eq!(fitted.metadata.error_bounds.len(), 6);
        for (eb, s) in fitted.metadata.error_bounds.iter().zip(two_way(4)) {
            let est = b.marginal_any(&s, &fitted.model.sizes).values;
            let err = l1(answers.get(&s).unwrap(), &est);
            let bound = eb.l1_bound.expect("every workload marginal gets a bound");
            total += 1;
            if err <= bound {
                held += 1;
            }
        }
    }
    assert!(held as f64 >= 0.95 * total as f64, "bounds held on {held}/{total}");
}

/// The 002 cell synthesizers behind the `Synthesizer` interface: the
/// noise-based ones fit one set as a one-clique model over every column
/// (at ε = 10⁶ the model's table is the data's), spending exactly ε; the
/// sampling ones refuse, since their ε depends on rows the interface cannot
/// be given.
#[test]
fn cell_synthesizers_fit_through_the_synthesizer_interface() {
    for mech in [Mechanism::LaplaceSanitizer, Mechanism::PerturbedHistogram, Mechanism::Modips] {
        let (fitted, spent, answers, _) = run(mech, 1e6, 3, 500, "all-2way");
        assert!((spent - 1e6).abs() <= 1e-6, "{mech:?}: {spent}");
        assert!(mech.pure_dp());
        let all = vec![0, 1, 2, 3];
        let model = fitted.model.marginal(&all);
        let exact = answers.get(&all).unwrap();
        if mech == Mechanism::Modips {
            // One posterior draw and 500 rows from it: close, not equal.
            assert!((model.values.iter().sum::<f64>() - 500.0).abs() < 1e-6);
        } else {
            let err: f64 = model.values.iter().zip(exact).map(|(a, b)| (a - b).abs()).sum();
            assert!(err < 1e-6 * 500.0, "{mech:?}: L1 {err}");
        }
    }
    let (domain, rows) = data(100, 1);
    let w = Workload::parse("all-2way", &domain).unwrap();
    let s = Mechanism::BinomialBeta.synthesizer(&SynthOptions::default());
    let answers = answers_for(&domain, &rows, &s.required_marginals(&domain, &w));
    let mut rng = DpRng::unsafe_seeded(1);
    let e = fit_with_answers(s.as_ref(), &domain, &answers, &w, 1.0, &SynthOptions::default(), &mut rng, &|_| {});
    assert!(matches!(e, Err(SynthError::Dips(dips::DipsError::NoRows))), "{:?}", e.err());
}

/// Every measured marginal's record carries its cells' interval (issue 20:
/// the noise scale is public): MST's discrete Gaussian ones z·σ, PrivBayes's
/// discrete Laplace ones b·ln(1/α), rounded up to whole counts (integer
/// noise: `integer_half_widths_cover_their_level`), at the run's confidence.
/// And those half-widths cover the exact samplers' noise at their level:
/// 20 000 draws each, within 4 standard errors (0.006) of 0.95.
#[test]
fn measurement_intervals_have_their_coverage() {
    let z = 1.959_963_984_540_054;
    let (fitted, ..) = run(Mechanism::Mst, 0.5, 1, 500, "all-2way");
    assert!(!fitted.metadata.measurements.is_empty());
    for m in &fitted.metadata.measurements {
        assert_eq!((m.noise.as_str(), m.level), ("gaussian", 0.95));
        assert_eq!(m.ci_half_width, (z * m.sigma).ceil(), "{m:?}");
    }
    let (fitted, ..) = run(Mechanism::Privbayes, 0.5, 1, 500, "all-2way");
    for m in &fitted.metadata.measurements {
        let b = m.sigma / std::f64::consts::SQRT_2;
        assert_eq!(m.noise, "laplace");
        assert!((m.ci_half_width - (b * 20f64.ln()).ceil()).abs() < 1e-9, "{m:?}");
    }
    let mut rng = DpRng::unsafe_seeded(17);
    for noise in [NoiseDistribution::Gaussian { sigma: 40.0 }, NoiseDistribution::Laplace { scale: 30.0 }] {
        let hw = noise.integer_ci_half_width(0.95);
        let k = 20_000;
        let inside = (0..k).filter(|_| (noise.sample_integer(&mut rng) as f64).abs() <= hw).count();
        let coverage = inside as f64 / k as f64;
        assert!((coverage - 0.95).abs() < 0.006, "{noise:?}: {coverage}");
    }
}
