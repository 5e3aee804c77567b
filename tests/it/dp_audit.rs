//! Empirical DP audit (issue #3): a counting query on neighbouring datasets
//! (n and n + 1 rows) released with discrete Laplace noise of scale 1/ε. We
//! estimate the privacy loss as the largest log-ratio of the two output
//! distributions over the events {Y ≥ t} and {Y ≤ t} with enough mass to be
//! estimated (each event ≥ 2,000 of the 10^5 draws per side, so each log-ratio
//! has standard error ≤ 0.032). The estimate must stay within ε + 0.15; the
//! same test must flag a broken mechanism that uses half the noise (true loss 2ε).

use dpflow::udfs::noise::{DiscreteLaplace, DpRng};

const RUNS: usize = 100_000;
const MIN_EVENT: usize = 2_000;
const MARGIN: f64 = 0.15;

fn estimate_loss(release: impl Fn(i64, &mut DpRng) -> i64, n: i64) -> f64 {
    let mut rng_a = DpRng::unsafe_seeded(2024);
    let mut rng_b = DpRng::unsafe_seeded(4048);
    let mut a: Vec<i64> = (0..RUNS).map(|_| release(n, &mut rng_a)).collect();
    let mut b: Vec<i64> = (0..RUNS).map(|_| release(n + 1, &mut rng_b)).collect();
    a.sort_unstable();
    b.sort_unstable();
    let lo = a[0].min(b[0]);
    let hi = a[RUNS - 1].max(b[RUNS - 1]);
    let count_ge = |v: &[i64], t: i64| v.len() - v.partition_point(|&x| x < t);
    let count_le = |v: &[i64], t: i64| v.partition_point(|&x| x <= t);
    let mut worst: f64 = 0.0;
    for t in lo..=hi {
        for (ca, cb) in [(count_ge(&a, t), count_ge(&b, t)), (count_le(&a, t), count_le(&b, t))] {
            if ca >= MIN_EVENT && cb >= MIN_EVENT {
                worst = worst.max(((ca as f64) / (cb as f64)).ln().abs());
            }
        }
    }
    worst
}

#[test]
fn discrete_laplace_count_passes_audit_and_broken_mechanism_is_caught() {
    let eps = 1.0;
    let correct = DiscreteLaplace::from_f64(1.0 / eps).unwrap();
    let est = estimate_loss(|n, rng| n + correct.sample(rng) as i64, 1000);
    assert!(est <= eps + MARGIN, "correct mechanism: estimated loss {est} > ε + margin");
    assert!(est >= eps - MARGIN, "the audit is too weak to see the true loss: {est}");

    // Broken: half the noise (scale 1/(2ε)) has true loss 2ε.
    let broken = DiscreteLaplace::from_f64(0.5 / eps).unwrap();
    let est_broken = estimate_loss(|n, rng| n + broken.sample(rng) as i64, 1000);
    assert!(est_broken > eps + MARGIN, "the audit failed to catch a mechanism with half the noise: {est_broken}");
}
