use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::*;

fn config(metric: Metric, w: [f64; 3]) -> KnnConfig {
    KnnConfig {
        attrs: vec![
            MatchAttr { name: "a".into(), kind: AttrKind::Categorical, weight: w[0], size: 3 },
            MatchAttr { name: "b".into(), kind: AttrKind::Ordinal, weight: w[1], size: 4 },
            MatchAttr { name: "c".into(), kind: AttrKind::Categorical, weight: w[2], size: 2 },
        ],
        metric,
        k: 1,
    }
}

fn random_records(rng: &mut SmallRng, n: usize, classes: &[Vec<u32>]) -> KnnRecords {
    let mut rid: Vec<f64> = (0..n).map(|i| (i * 10) as f64).collect();
    for i in (1..n).rev() {
        let j = rng.random_range(0..=i);
        rid.swap(i, j);
    }
    KnnRecords {
        keys: (0..n).map(|_| classes[rng.random_range(0..classes.len())].clone()).collect(),
        rid,
        complete: (0..n).map(|_| rng.random::<f64>() < 0.55).collect(),
    }
}

/// Donor rid of every incomplete row, keyed by rid.
fn donor_map(cfg: &KnnConfig, rec: &KnnRecords) -> std::collections::HashMap<u64, Option<u64>> {
    let a = Assignment::build(cfg, rec);
    (0..rec.rid.len())
        .filter(|&i| !rec.complete[i])
        .map(|i| (rec.rid[i].to_bits(), a.donors[i].first().map(|&d| rec.rid[d].to_bits())))
        .collect()
}

fn changed(
    before: &std::collections::HashMap<u64, Option<u64>>,
    after: &std::collections::HashMap<u64, Option<u64>>,
) -> u64 {
    before.iter().filter(|(k, v)| after.get(k).is_some_and(|w| w != *v)).count() as u64
}

fn all_keys() -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for a in 0..3 {
        for b in 0..4 {
            for c in 0..2 {
                out.push(vec![a, b, c]);
            }
        }
    }
    out
}

/// Brute force: (removals, additions to donor classes, to donee-only classes, to absent classes).
fn brute(cfg: &KnnConfig, rec: &KnnRecords) -> [u64; 4] {
    let base = donor_map(cfg, rec);
    let mut out = [0u64; 4];
    for y in 0..rec.rid.len() {
        if !rec.complete[y] {
            continue;
        }
        let mut r = rec.clone();
        r.keys.remove(y);
        r.rid.remove(y);
        r.complete.remove(y);
        out[0] = out[0].max(changed(&base, &donor_map(cfg, &r)));
    }
    let mut rids: Vec<f64> = rec.rid.clone();
    rids.sort_by(f64::total_cmp);
    let mut cands = vec![rids[0] - 1.0, rids[rids.len() - 1] + 1.0];
    cands.extend(rids.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    for key in all_keys() {
        let present: Vec<usize> = (0..rec.rid.len()).filter(|&i| rec.keys[i] == key).collect();
        let case = if present.is_empty() {
            3
        } else if present.iter().any(|&i| rec.complete[i]) {
            1
        } else {
            2
        };
        for &r in &cands {
            let mut x = rec.clone();
            x.keys.push(key.clone());
            x.rid.push(r);
            x.complete.push(true);
            out[case] = out[case].max(changed(&base, &donor_map(cfg, &x)));
        }
    }
    out
}

/// A random metric, weights and table over a random subset of the keys (each
/// kept with probability `keep`, so that absent classes exist); None if no key is kept.
fn random_trial(rng: &mut SmallRng, trial: usize, keep: f64) -> Option<(KnnConfig, KnnRecords)> {
    let metric = if trial.is_multiple_of(2) { Metric::Euclidean } else { Metric::Hamming };
    let w = [rng.random_range(0.5..2.0), rng.random_range(0.2..1.5), rng.random_range(0.5..3.0)];
    let keys: Vec<Vec<u32>> = all_keys().into_iter().filter(|_| rng.random::<f64>() < keep).collect();
    if keys.is_empty() {
        return None;
    }
    let n = rng.random_range(4..30);
    Some((config(metric, w), random_records(rng, n, &keys)))
}

#[test]
fn l1_matches_brute_force_and_never_underestimates() {
    let mut rng = SmallRng::seed_from_u64(17);
    for trial in 0..60 {
        let Some((cfg, rec)) = random_trial(&mut rng, trial, 0.4) else { continue };
        let asg = Assignment::build(&cfg, &rec);
        let exact = asg.l1(&cfg, &rec, u64::MAX).unwrap();
        let b = brute(&cfg, &rec);
        assert_eq!(exact.remove_donor, b[0], "trial {trial}: case (a)");
        assert_eq!(exact.add_to_donor_class, b[1], "trial {trial}: case (b)");
        assert_eq!(exact.add_to_donee_class, b[2], "trial {trial}: case (c)");
        assert_eq!(exact.add_new_class, b[3], "trial {trial}: case (d) enumerated");
        let brute_l1 = 1.max(b[0]).max(b[1]).max(b[2]).max(b[3]);
        assert_eq!(exact.value, brute_l1, "trial {trial}");
        // Without enumeration, (d) is an upper bound: L1 never under-estimates.
        let bound = asg.l1(&cfg, &rec, 0).unwrap();
        assert!(bound.add_new_class >= b[3], "trial {trial}: (d) bound {} < {}", bound.add_new_class, b[3]);
        assert!(bound.value >= brute_l1);
    }
}

/// A random add/remove neighbour of `rec`: remove a record, or add one at a key of `keys`.
fn random_neighbour(rng: &mut SmallRng, rec: &KnnRecords, keys: &[Vec<u32>]) -> KnnRecords {
    let mut nb = rec.clone();
    if rng.random::<bool>() && nb.rid.len() > 1 {
        let i = rng.random_range(0..nb.rid.len());
        nb.keys.remove(i);
        nb.rid.remove(i);
        nb.complete.remove(i);
    } else {
        nb.keys.push(keys[rng.random_range(0..keys.len())].clone());
        nb.rid.push(rng.random_range(0.0..300.0) + 0.5);
        nb.complete.push(rng.random::<bool>());
    }
    nb
}

#[test]
fn smooth_bound_is_ln2_smooth_on_sampled_neighbours() {
    // S(D) = 1 + L1(D) must satisfy S(D) ≤ 2·S(D') for neighbours D' (β = ln 2).
    let mut rng = SmallRng::seed_from_u64(5);
    for _ in 0..30 {
        let cfg = config(Metric::Euclidean, [1.0, 1.0, 1.0]);
        let keys = all_keys();
        let n = rng.random_range(5..25);
        let rec = random_records(&mut rng, n, &keys);
        let s = |r: &KnnRecords| 1 + Assignment::build(&cfg, r).l1(&cfg, r, u64::MAX).unwrap().value;
        let sd = s(&rec);
        for _ in 0..8 {
            let nb = random_neighbour(&mut rng, &rec, &keys);
            let sn = s(&nb);
            assert!(sd <= 2 * sn && sn <= 2 * sd, "S(D) = {sd}, S(D') = {sn}");
        }
    }
}

#[test]
fn cyclic_coverage() {
    assert_eq!(max_cyclic_coverage(&[]), 0);
    assert_eq!(max_cyclic_coverage(&[(1.0, 5.0), (2.0, 3.0), (4.0, 6.0)]), 2);
    // Wrapping intervals (9, 2) and (8, 1) overlap near 0 and above 9.
    assert_eq!(max_cyclic_coverage(&[(9.0, 2.0), (8.0, 1.0), (3.0, 4.0)]), 2);
    assert_eq!(max_cyclic_coverage(&[(1.0, f64::NAN), (2.0, 3.0)]), 2);
}

#[test]
fn donors_follow_distance_then_cyclic_identifier() {
    let cfg = config(Metric::Euclidean, [1.0, 1.0, 1.0]);
    let rec = KnnRecords {
        keys: vec![vec![0, 0, 0], vec![0, 0, 0], vec![0, 0, 0], vec![0, 1, 0], vec![0, 0, 0]],
        rid: vec![10.0, 20.0, 30.0, 40.0, 25.0],
        complete: vec![true, true, false, true, false],
    };
    let a = Assignment::build(&cfg, &rec);
    // Donee rid 30: same class donors 10, 20 → next after 30 wraps to 10.
    assert_eq!(a.donors[2], vec![0]);
    // Donee rid 25: next donor after 25 in its class is... none above → wraps to 10.
    assert_eq!(a.donors[4], vec![0]);
    assert_eq!(a.donee_count[0], 2);
    let k2 = KnnConfig { k: 2, ..cfg };
    let a2 = Assignment::build(&k2, &rec);
    assert_eq!(a2.donors[2], vec![0, 1]);
}

/// One categorical attribute with `size` codes (one-hot Euclidean, weight 1).
fn one_hot(size: u32) -> KnnConfig {
    KnnConfig {
        attrs: vec![MatchAttr { name: "a".into(), kind: AttrKind::Categorical, weight: 1.0, size }],
        metric: Metric::Euclidean,
        k: 1,
    }
}

#[test]
fn case_d_method_depends_on_the_public_space_not_on_the_classes_present() {
    // Space of 10 keys; one dataset uses 3 classes (7 absent), the other 8 (2 absent).
    let cfg = one_hot(10);
    let data = |classes: u32| KnnRecords {
        keys: (0..2 * classes).map(|i| vec![i / 2]).collect(),
        rid: (0..2 * classes).map(|i| i as f64).collect(),
        complete: (0..2 * classes).map(|i| i % 2 == 0 || i == 1).collect(),
    };
    for limit in [0u64, 5, 9, 10, 100] {
        let exact: Vec<bool> = [3, 8]
            .into_iter()
            .map(|c| {
                let rec = data(c);
                Assignment::build(&cfg, &rec).l1(&cfg, &rec, limit).unwrap().new_class_exact
            })
            .collect();
        // Enumerated iff the public space (10 keys) fits the limit, for both datasets.
        assert_eq!(exact, vec![limit >= 10; 2], "limit {limit}");
    }
}

#[test]
fn case_d_fallback_keeps_the_smooth_bound_smooth_where_the_triangle_bound_does_not() {
    // D′: m one-hot classes, each with one donor and one donee; D: D′ without class 0's donor.
    let m = 6u32;
    let cfg = one_hot(m + 4);
    let with = KnnRecords {
        keys: (0..2 * m).map(|i| vec![i / 2]).collect(),
        rid: (0..2 * m).map(|i| (10 * (i / 2) + 5 * (i % 2)) as f64).collect(),
        complete: (0..2 * m).map(|i| i % 2 == 0).collect(),
    };
    let mut without = with.clone();
    without.keys.remove(0);
    without.rid.remove(0);
    without.complete.remove(0);
    let bound = |r: &KnnRecords| Assignment::build(&cfg, r).l1(&cfg, r, 0).unwrap();
    let exact = |r: &KnnRecords| Assignment::build(&cfg, r).l1(&cfg, r, u64::MAX).unwrap();
    let (b_with, b_without) = (bound(&with), bound(&without));
    assert!(!b_with.new_class_exact && !b_without.new_class_exact);
    // An upper bound on L1, and 2-smooth: 1 + B(D) ≤ 2·(1 + B(D′)) needs B(D) ≤ 2·B(D′).
    assert!(b_with.value >= exact(&with).value && b_without.value >= exact(&without).value);
    assert!(b_without.value <= 2 * b_with.value, "B(D) = {}, B(D′) = {}", b_without.value, b_with.value);
    assert!(b_with.value <= 2 * b_without.value);
    // The old triangle bound of (d) jumps from 1 to m on the same neighbours.
    let triangle = |r: &KnnRecords| {
        let a = Assignment::build(&cfg, r);
        let mut donees = vec![0u64; a.classes.len()];
        for i in 0..r.rid.len() {
            if !r.complete[i] {
                donees[a.class_of[i] as usize] += 1;
            }
        }
        let cls: Vec<usize> = (0..a.classes.len()).filter(|&c| donees[c] > 0).collect();
        cls.iter()
            .map(|&c| {
                cls.iter()
                    .filter(|&&c2| cfg.distance(&a.classes[c], &a.classes[c2]) <= a.dmin[c] + a.dmin[c2])
                    .map(|&c2| donees[c2])
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    };
    assert_eq!((triangle(&with), triangle(&without)), (1, u64::from(m)));
    assert!(1.max(triangle(&without)) > 2 * 1.max(triangle(&with)), "the triangle bound is not 2-smooth");
}

#[test]
fn case_d_fallback_is_an_upper_bound_and_2_smooth_on_random_neighbours() {
    let mut rng = SmallRng::seed_from_u64(23);
    for trial in 0..80 {
        let metric = if trial % 2 == 0 { Metric::Euclidean } else { Metric::Hamming };
        // Some trials have a zero weight (then the bound counts every donee).
        let zero = trial % 5 == 4;
        let w = [if zero { 0.0 } else { rng.random_range(0.5..2.0) }, rng.random_range(0.2..1.5), 1.0];
        let cfg = config(metric, w);
        let keys: Vec<Vec<u32>> = all_keys().into_iter().filter(|_| rng.random::<f64>() < 0.5).collect();
        if keys.is_empty() {
            continue;
        }
        let n = rng.random_range(4..25);
        let rec = random_records(&mut rng, n, &keys);
        let b = |r: &KnnRecords| Assignment::build(&cfg, r).l1(&cfg, r, 0).unwrap().value;
        let exact = |r: &KnnRecords| Assignment::build(&cfg, r).l1(&cfg, r, u64::MAX).unwrap().value;
        let bd = b(&rec);
        assert!(bd >= exact(&rec), "trial {trial}: the bound is below L1(D)");
        for _ in 0..10 {
            let nb = random_neighbour(&mut rng, &rec, &all_keys());
            let bn = b(&nb);
            assert!(bd <= 2 * bn && bn <= 2 * bd, "trial {trial}: B(D) = {bd}, B(D′) = {bn}");
        }
    }
}

/// Membership in R as a property of the tuple alone (here: of its identifier).
fn in_r(rid: f64) -> bool {
    (rid.floor() as i64).rem_euclid(3) != 0
}

/// Brute force of L1_R(D): every removal and every addition of one record
/// (complete at every key and identifier gap, or a relevant incomplete one),
/// counting the relevant donees whose donor changes plus an added or removed
/// relevant donee itself.
fn brute_restricted(cfg: &KnnConfig, rec: &KnnRecords) -> u64 {
    let base = donor_map(cfg, rec);
    let changed_r = |after: &std::collections::HashMap<u64, Option<u64>>| -> u64 {
        base.iter().filter(|(k, v)| in_r(f64::from_bits(**k)) && after.get(k).is_some_and(|w| w != *v)).count() as u64
    };
    let mut best = 0u64;
    for y in 0..rec.rid.len() {
        if !rec.complete[y] {
            // Removing a donee changes no other donor: c = {y}.
            best = best.max(u64::from(in_r(rec.rid[y])));
            continue;
        }
        let mut r = rec.clone();
        r.keys.remove(y);
        r.rid.remove(y);
        r.complete.remove(y);
        best = best.max(changed_r(&donor_map(cfg, &r)));
    }
    let mut rids: Vec<f64> = rec.rid.clone();
    rids.sort_by(f64::total_cmp);
    let mut cands = vec![rids[0] - 1.0, rids[rids.len() - 1] + 1.0];
    cands.extend(rids.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    for key in all_keys() {
        for &r in &cands {
            let mut x = rec.clone();
            x.keys.push(key.clone());
            x.rid.push(r);
            x.complete.push(true);
            best = best.max(changed_r(&donor_map(cfg, &x)));
        }
    }
    // Adding a relevant incomplete tuple (identifiers are free: one always exists).
    best.max(1)
}

#[test]
fn restricted_l1_matches_brute_force_on_every_addition_and_removal() {
    let mut rng = SmallRng::seed_from_u64(24);
    for trial in 0..60 {
        let Some((cfg, rec)) = random_trial(&mut rng, trial, 0.5) else { continue };
        let n = rec.rid.len();
        let relevant: Vec<bool> = rec.rid.iter().map(|&r| in_r(r)).collect();
        let asg = Assignment::build(&cfg, &rec);
        let exact = asg.l1_restricted(&cfg, &rec, u64::MAX, Some(&relevant), true).unwrap();
        assert_eq!(exact.value, brute_restricted(&cfg, &rec), "trial {trial}");
        // Never above the unrestricted L1, and the (d) fallback stays an upper bound.
        assert!(exact.value <= asg.l1(&cfg, &rec, u64::MAX).unwrap().value);
        let bound = asg.l1_restricted(&cfg, &rec, 0, Some(&relevant), true).unwrap();
        assert!(bound.value >= exact.value, "trial {trial}");
        // Nothing relevant and nothing possible: 0 (the statistic reads no imputed value).
        let none = vec![false; n];
        assert_eq!(asg.l1_restricted(&cfg, &rec, u64::MAX, Some(&none), false).unwrap().value, 0);
    }
}

#[test]
fn restricted_smooth_bound_is_ln2_smooth_on_sampled_neighbours() {
    // S_R(D) = 1 + L1_R(D) ≤ 2·S_R(D′), exact (d) and the N₀ fallback alike.
    let mut rng = SmallRng::seed_from_u64(240);
    for trial in 0..40 {
        let cfg = config(Metric::Euclidean, [1.0, 1.0, 1.0]);
        let keys = all_keys();
        let n = rng.random_range(5..25);
        let rec = random_records(&mut rng, n, &keys);
        let limit = if trial % 2 == 0 { u64::MAX } else { 0 };
        let s = |r: &KnnRecords| {
            let rel: Vec<bool> = r.rid.iter().map(|&x| in_r(x)).collect();
            1 + Assignment::build(&cfg, r).l1_restricted(&cfg, r, limit, Some(&rel), true).unwrap().value
        };
        let sd = s(&rec);
        for _ in 0..8 {
            let nb = random_neighbour(&mut rng, &rec, &keys);
            let sn = s(&nb);
            assert!(sd <= 2 * sn && sn <= 2 * sd, "trial {trial}: S(D) = {sd}, S(D') = {sn}");
        }
    }
}
