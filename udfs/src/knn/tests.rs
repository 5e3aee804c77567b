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

#[test]
fn l1_matches_brute_force_and_never_underestimates() {
    let mut rng = SmallRng::seed_from_u64(17);
    for trial in 0..60 {
        let metric = if trial % 2 == 0 { Metric::Euclidean } else { Metric::Hamming };
        let w = [rng.random_range(0.5..2.0), rng.random_range(0.2..1.5), rng.random_range(0.5..3.0)];
        let cfg = config(metric, w);
        // Use a random subset of classes so that absent classes exist.
        let keys: Vec<Vec<u32>> = all_keys().into_iter().filter(|_| rng.random::<f64>() < 0.4).collect();
        if keys.is_empty() {
            continue;
        }
        let n = rng.random_range(4..30);
        let rec = random_records(&mut rng, n, &keys);
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
