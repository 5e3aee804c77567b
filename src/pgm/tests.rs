//! Brute-force checks of the PGM engine on small domains (issue #5).

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::factor::{Factor, for_each_pair, strides};
use super::*;

/// The full joint (counts summing to `total`) of a model by enumeration.
fn brute_joint(sizes: &[usize], potentials: &[Factor], total: f64) -> Factor {
    let all: Vec<usize> = (0..sizes.len()).collect();
    let mut logp = Factor::zeros(&all, sizes);
    for p in potentials {
        logp.add_assign_sub(p);
    }
    let z = logp.logsumexp();
    Factor { values: logp.values.iter().map(|v| (v - z).exp() * total).collect(), ..logp }
}

fn random_potentials(rng: &mut SmallRng, sizes: &[usize], cliques: &[Vec<usize>], scale: f64) -> Vec<Factor> {
    cliques
        .iter()
        .map(|c| {
            let mut f = Factor::zeros(c, sizes);
            f.values.iter_mut().for_each(|v| *v = scale * (rng.random::<f64>() - 0.5));
            f
        })
        .collect()
}

#[test]
fn belief_propagation_matches_the_joint() {
    let mut rng = SmallRng::seed_from_u64(1);
    let sizes = vec![2, 3, 4, 2, 3, 2];
    let cliques = vec![vec![0, 1], vec![1, 2, 3], vec![2, 4], vec![3, 4], vec![5]];
    for trial in 0..5 {
        let potentials = random_potentials(&mut rng, &sizes, &cliques, 4.0 + trial as f64);
        let model = GraphicalModel {
            sizes: sizes.clone(),
            jtree: JunctionTree::build(&sizes, &cliques),
            potentials: potentials.clone(),
            total: 1000.0,
        };
        let joint = brute_joint(&sizes, &potentials, 1000.0);
        let beliefs = model.beliefs();
        for (c, b) in model.jtree.cliques.iter().zip(&beliefs.cliques) {
            let want = joint.sum_to(c);
            for (x, y) in want.values.iter().zip(&b.values) {
                assert!((x - y).abs() < 1e-9 * 1000.0, "clique {c:?}: {x} vs {y}");
            }
        }
        // Attribute sets outside every clique go through variable elimination
        // (both the re-built tree and the calibrated-subtree elimination).
        // A cache shared by every set (and one too small to keep anything)
        // gives the bits of the uncached elimination.
        let shared = MessageCache::new(1 << 30);
        let tiny = MessageCache::new(0);
        for q in [vec![0, 4], vec![0, 5], vec![0, 2, 5], vec![1, 4], vec![0, 3, 4, 5], vec![0, 4], vec![2, 4, 5]] {
            let want = joint.sum_to(&q);
            let got = model.marginal_by_extension(&q);
            let fast = beliefs.marginal_any(&q, &sizes);
            for cache in [&shared, &tiny] {
                let cached = beliefs.marginal_any_cached(&q, &sizes, Some(cache));
                let bits = |f: &Factor| f.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&cached), bits(&fast), "{q:?}: cached elimination");
            }
            for ((x, y), z) in want.values.iter().zip(&got.values).zip(&fast.values) {
                assert!((x - y).abs() < 1e-9 * 1000.0, "{q:?}: {x} vs {y}");
                assert!((x - z).abs() < 1e-9 * 1000.0, "{q:?}: {x} vs {z} (subtree elimination)");
            }
        }
    }
}

/// Messages of one level are added in a fixed order, so belief propagation
/// gives the same bits on one thread as on several.
#[test]
fn belief_propagation_does_not_depend_on_the_thread_count() {
    let mut rng = SmallRng::seed_from_u64(9);
    let sizes = vec![3, 4, 2, 5, 3, 4, 2, 3];
    // A star and a chain: levels of several cliques each.
    let cliques = vec![vec![0, 1, 2], vec![0, 3], vec![0, 4, 5], vec![1, 6], vec![2, 7], vec![5, 6]];
    let potentials = random_potentials(&mut rng, &sizes, &cliques, 6.0);
    let model = GraphicalModel {
        sizes: sizes.clone(),
        jtree: JunctionTree::build(&sizes, &cliques),
        potentials: potentials.clone(),
        total: 500.0,
    };
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool").install(|| model.beliefs())
    };
    let one = run(1);
    assert_eq!(one, run(2));
    assert_eq!(one, run(4));
    let joint = brute_joint(&sizes, &potentials, 500.0);
    for (c, b) in model.jtree.cliques.iter().zip(&one.cliques) {
        for (x, y) in joint.sum_to(c).values.iter().zip(&b.values) {
            assert!((x - y).abs() < 1e-9 * 500.0, "clique {c:?}: {x} vs {y}");
        }
    }
}

/// Minimises the same objective over the full joint by projected gradient
/// descent with exact Euclidean projection onto {p ≥ 0, Σp = n}.
fn dense_optimum(sizes: &[usize], ms: &[Measurement], total: f64, iters: usize) -> f64 {
    let all: Vec<usize> = (0..sizes.len()).collect();
    let cells: usize = sizes.iter().product();
    let mut p = vec![total / cells as f64; cells];
    // Lipschitz constant of the gradient: Σ_i (cells / cells_i) / σ_i bounds ‖AᵀWA‖.
    let lip: f64 = ms.iter().map(|m| cells as f64 / m.values.len() as f64 / m.sigma).sum();
    let step = 1.0 / lip;
    let project = |v: &mut Vec<f64>| {
        // Simplex projection (Duchi et al. 2008) scaled to `total`.
        let mut u = v.clone();
        u.sort_by(|a, b| b.total_cmp(a));
        let mut css = 0.0;
        let mut theta = 0.0;
        for (k, x) in u.iter().enumerate() {
            css += x;
            let t = (css - total) / (k + 1) as f64;
            if x - t > 0.0 {
                theta = t;
            }
        }
        v.iter_mut().for_each(|x| *x = (*x - theta).max(0.0));
    };
    let joint = |p: &Vec<f64>| Factor { attrs: all.clone(), shape: sizes.to_vec(), values: p.clone() };
    // FISTA.
    let mut y = p.clone();
    let mut t = 1.0f64;
    for _ in 0..iters {
        let f = joint(&y);
        let mut grad = vec![0.0; cells];
        for m in ms {
            let marg = f.sum_to(&m.attrs);
            let g: Vec<f64> = marg.values.iter().zip(&m.values).map(|(a, b)| (a - b) / m.sigma).collect();
            let ss = f.sub_strides(&m.attrs, &marg.shape);
            for_each_pair(&f.shape, &ss, |i, j| grad[i] += g[j]);
        }
        let mut next: Vec<f64> = y.iter().zip(&grad).map(|(a, g)| a - step * g).collect();
        project(&mut next);
        let t2 = (1.0 + (1.0 + 4.0 * t * t).sqrt()) / 2.0;
        y = next.iter().zip(&p).map(|(n, o)| n + (t - 1.0) / t2 * (n - o)).collect();
        p = next;
        t = t2;
    }
    let f = joint(&p);
    objective(ms, Norm::L2, |a| f.sum_to(a))
}

fn noisy_measurements(
    rng: &mut SmallRng,
    sizes: &[usize],
    joint: &Factor,
    sets: &[Vec<usize>],
    sigma: f64,
) -> Vec<Measurement> {
    sets.iter()
        .map(|s| {
            let m = joint.sum_to(s);
            let vals: Vec<f64> = m.values.iter().map(|v| v + sigma * 2.0 * (rng.random::<f64>() - 0.5) * 1.7).collect();
            Measurement::new(s, sizes, &vals, sigma)
        })
        .collect()
}

#[test]
fn estimator_matches_dense_optimisation() {
    let mut rng = SmallRng::seed_from_u64(5);
    let sizes = vec![3, 2, 4, 3];
    let truth_cliques = vec![vec![0, 1, 2], vec![2, 3]];
    let pots = random_potentials(&mut rng, &sizes, &truth_cliques, 3.0);
    let joint = brute_joint(&sizes, &pots, 500.0);
    let sets = vec![vec![0, 1], vec![1, 2], vec![2, 3], vec![0], vec![3]];
    let ms = noisy_measurements(&mut rng, &sizes, &joint, &sets, 4.0);
    let est = estimate(&sizes, &ms, &EstimateOptions { iters: 20_000, total: Some(500.0), ..Default::default() }, None);
    let dense = dense_optimum(&sizes, &ms, 500.0, 200_000);
    let rel = (est.loss - dense).abs() / dense;
    assert!(rel < 1e-6, "pgm objective {} vs dense {} (rel {rel:e})", est.loss, dense);
    // The reported loss is the model's objective.
    let b = est.model.beliefs();
    let check = objective(&ms, Norm::L2, |a| b.marginal(a).unwrap());
    assert!((check - est.loss).abs() <= 1e-9 * check);
}

#[test]
fn noiseless_decomposable_model_recovers_true_marginals() {
    let mut rng = SmallRng::seed_from_u64(9);
    let sizes = vec![4, 3, 5, 2, 3];
    let chain: Vec<Vec<usize>> = (0..4).map(|i| vec![i, i + 1]).collect();
    let pots = random_potentials(&mut rng, &sizes, &chain, 3.0);
    let joint = brute_joint(&sizes, &pots, 10_000.0);
    let ms: Vec<Measurement> =
        chain.iter().map(|c| Measurement::new(c, &sizes, &joint.sum_to(c).values, 1.0)).collect();
    let est = estimate(&sizes, &ms, &EstimateOptions { iters: 5000, ..Default::default() }, None);
    // Unbounded DP: n estimated from the measurements (exact here).
    assert!((est.model.total - 10_000.0).abs() < 1e-6);
    let b = est.model.beliefs();
    for c in &chain {
        let want = joint.sum_to(c);
        let got = b.marginal(c).unwrap();
        for (x, y) in want.values.iter().zip(&got.values) {
            assert!((x - y).abs() < 1e-3, "{c:?}: {x} vs {y}");
        }
    }
    // The full joint is recovered too (the chain is decomposable): compare a 3-way.
    let want = joint.sum_to(&[0, 2, 4]);
    let got = est.model.marginal(&[0, 2, 4]);
    for (x, y) in want.values.iter().zip(&got.values) {
        assert!((x - y).abs() < 1e-2, "{x} vs {y}");
    }
}

#[test]
fn warm_start_continues_from_previous_model() {
    let mut rng = SmallRng::seed_from_u64(2);
    let sizes = vec![3, 3, 3];
    let pots = random_potentials(&mut rng, &sizes, &[vec![0, 1], vec![1, 2]], 2.0);
    let joint = brute_joint(&sizes, &pots, 1000.0);
    let ms1 = noisy_measurements(&mut rng, &sizes, &joint, &[vec![0, 1]], 1.0);
    let e1 = estimate(&sizes, &ms1, &EstimateOptions { iters: 2000, total: Some(1000.0), ..Default::default() }, None);
    let mut ms2 = ms1.clone();
    ms2.extend(noisy_measurements(&mut rng, &sizes, &joint, &[vec![1, 2]], 1.0));
    let cold = estimate(&sizes, &ms2, &EstimateOptions { iters: 30, total: Some(1000.0), ..Default::default() }, None);
    let warm = estimate(
        &sizes,
        &ms2,
        &EstimateOptions { iters: 30, total: Some(1000.0), ..Default::default() },
        Some(&e1.model),
    );
    assert!(warm.loss < cold.loss, "warm start {} should beat cold start {} after 30 iterations", warm.loss, cold.loss);
    // The first fit ran to convergence, so its step collapsed (the Armijo
    // test fails at rounding level); the warm step is floored at the
    // Lipschitz step, so passing it never does worse than not passing it.
    assert!(e1.step < 1e-6, "a converged fit's step: {}", e1.step);
    let floored = estimate(
        &sizes,
        &ms2,
        &EstimateOptions { iters: 30, total: Some(1000.0), initial_step: Some(e1.step), ..Default::default() },
        Some(&e1.model),
    );
    assert_eq!(floored.loss, warm.loss);
    // A step far too long is capped and halved back within the iterations.
    let huge = estimate(
        &sizes,
        &ms2,
        &EstimateOptions { iters: 30, total: Some(1000.0), initial_step: Some(1e12), ..Default::default() },
        Some(&e1.model),
    );
    assert!(huge.loss < cold.loss, "a capped step {} should still beat the cold start {}", huge.loss, cold.loss);
}

/// The stopping rule ends a fit whose loss has stopped falling, and a looser
/// tolerance never runs longer than a tighter one.
#[test]
fn tolerance_stops_a_converged_fit() {
    let mut rng = SmallRng::seed_from_u64(4);
    let sizes = vec![3, 3, 3];
    let pots = random_potentials(&mut rng, &sizes, &[vec![0, 1], vec![1, 2]], 2.0);
    let joint = brute_joint(&sizes, &pots, 1000.0);
    let ms = noisy_measurements(&mut rng, &sizes, &joint, &[vec![0, 1], vec![1, 2]], 1.0);
    let fit = |tolerance: f64| {
        estimate(
            &sizes,
            &ms,
            &EstimateOptions { iters: 5000, total: Some(1000.0), tolerance, ..Default::default() },
            None,
        )
    };
    let (full, tight, loose) = (fit(0.0), fit(1e-6), fit(1e-3));
    assert_eq!(full.iterations, 5000);
    assert!(tight.iterations < 5000 && tight.iterations % 50 == 0, "{}", tight.iterations);
    assert!(loose.iterations <= tight.iterations);
    // Stopped near the optimum: within 0.1% of the full run's loss.
    assert!(loose.loss <= full.loss * 1.001 + 1e-9, "{} vs {}", loose.loss, full.loss);
}

#[test]
fn l1_and_observed_only_queries() {
    let mut rng = SmallRng::seed_from_u64(4);
    let sizes = vec![3, 4];
    let pots = random_potentials(&mut rng, &sizes, &[vec![0, 1]], 2.0);
    let joint = brute_joint(&sizes, &pots, 800.0);
    // Attribute 1's last code stands for null: an observed-only measurement
    // selects the non-null cells.
    let m01 = joint.sum_to(&[0, 1]);
    let sel: Vec<usize> = (0..12).filter(|i| i % 4 != 3).collect();
    let obs = Measurement {
        attrs: vec![0, 1],
        values: sel.iter().map(|&i| m01.values[i]).collect(),
        sigma: 1.0,
        query: Query::Select(sel.clone()),
    };
    let full1 = Measurement::new(&[1], &sizes, &joint.sum_to(&[1]).values, 1.0);
    for norm in [Norm::L2, Norm::L1] {
        let est = estimate(
            &sizes,
            &[obs.clone(), full1.clone()],
            &EstimateOptions { iters: 4000, norm, ..Default::default() },
            None,
        );
        assert!((est.model.total - 800.0).abs() < 1e-6, "total from the identity measurement only");
        let got = est.model.marginal(&[0, 1]);
        // L1 is fitted through a Huber smoothing (δ = σ/10): close, not exact.
        let tol = |v: f64| {
            if norm == Norm::L2 { 0.5 } else { 0.02 * v + 0.5 }
        };
        for &i in &sel {
            assert!(
                (got.values[i] - m01.values[i]).abs() < tol(m01.values[i]),
                "{norm:?} cell {i}: {} vs {}",
                got.values[i],
                m01.values[i]
            );
        }
    }
}

#[test]
fn synthetic_rows_match_model_marginals() {
    use dpflow_udfs::domain::{Column, ColumnKind, DecodeMode, Domain, OutOfDomain};
    use dpflow_udfs::noise::DpRng;
    use dpflow_udfs::noise::testing::chi_square_test_counts;
    let mut rng = SmallRng::seed_from_u64(6);
    let sizes = vec![3, 4, 2, 5];
    let cliques = vec![vec![0, 1], vec![1, 2], vec![1, 3], vec![2, 3]];
    let pots = random_potentials(&mut rng, &sizes, &cliques, 3.0);
    let model = GraphicalModel {
        sizes: sizes.clone(),
        jtree: JunctionTree::build(&sizes, &cliques),
        potentials: pots,
        total: 5000.0,
    };
    let domain = Domain::new(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| Column {
                name: format!("c{i}"),
                kind: ColumnKind::Integer { edges: (0..=s as i64).collect() },
                nullable: false,
                null_tokens: vec![],
                out_of_domain: OutOfDomain::Error,
                not_applicable_when: None,
            })
            .collect(),
    )
    .unwrap();
    let plan = sampling_plan(&model, &domain, DecodeMode::Midpoint).unwrap();
    let mut r = DpRng::unsafe_seeded(12);
    let n = 20_000;
    let codes = plan.sample_codes(n, &mut r);
    assert!(codes.iter().all(|c| c.len() == n), "exactly n rows");
    let all: Vec<usize> = (0..4).collect();
    let joint = brute_joint(&sizes, &model.potentials, 1.0);
    for q in [vec![0, 1], vec![1, 2, 3], vec![0, 3], vec![0, 1, 2, 3]] {
        let shape: Vec<usize> = q.iter().map(|&a| sizes[a]).collect();
        let st = strides(&shape);
        let mut obs = vec![0.0; shape.iter().product()];
        #[allow(clippy::needless_range_loop)]
        for row in 0..n {
            let idx: usize = q.iter().zip(&st).map(|(&a, s)| codes[a][row] as usize * s).sum();
            obs[idx] += 1.0;
        }
        let probs = joint.sum_to(&q).values;
        chi_square_test_counts(&obs, &probs, 1e-5);
    }
    let _ = all;
}
