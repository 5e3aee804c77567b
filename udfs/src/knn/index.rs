//! kNN donor search over equivalence classes and the donee-change bound
//! L1(D) (004 §4, §6.2).
//!
//! Records are grouped into classes by their (discretised) matching
//! attributes; the distance between records is the distance between their
//! classes (Euclidean over one-hot categorical + ordinal attributes as in
//! 004 §6.2, or Hamming), with attribute weights. The order f(x) over all
//! possible complete tuples is: distance to x, then the cyclic order of the
//! record identifier starting just after x's own identifier (a donee takes the
//! first donor "above" it, wrapping around). Identifiers are real numbers, so
//! a new record can take any identifier not in use.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// kNN imputation failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnnError {
    /// L1(D), hence the smooth sensitivity, is only derived for one donor.
    #[error("L1(D) is implemented for k = 1 (got k = {0}): DP imputation takes one donor per donee")]
    UnsupportedK(usize),
}

/// How an attribute contributes to the distance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttrKind {
    /// Unordered codes (one-hot: a mismatch contributes 2 to the squared Euclidean distance).
    Categorical,
    /// Ordered integer codes (|a − b|).
    Ordinal,
}

/// The distance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// √(Σ w·(2·[a≠b] or (a−b)²)) — 004 §6.2.
    #[default]
    Euclidean,
    /// Σ w·([a≠b] or |a−b|).
    Hamming,
}

/// One matching attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatchAttr {
    /// Column name.
    pub name: String,
    /// Kind.
    pub kind: AttrKind,
    /// Weight (≥ 0).
    pub weight: f64,
    /// Number of codes (for enumerating unseen classes in case (d)).
    pub size: u32,
}

/// Donor-search configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnnConfig {
    /// Matching attributes.
    pub attrs: Vec<MatchAttr>,
    /// Metric.
    pub metric: Metric,
    /// Donors per donee.
    pub k: usize,
}

impl KnnConfig {
    /// Whether every attribute weight is positive and finite: then distinct
    /// class keys are at a positive distance, so a class holding donors is its
    /// own donees' only nearest class (the shortcut of the class lookup and of the
    /// streaming assignment's levels).
    pub fn distinct_keys_apart(&self) -> bool {
        self.attrs.iter().all(|a| a.weight > 0.0 && a.weight.is_finite())
    }

    /// Distance between two class keys.
    pub fn distance(&self, a: &[u32], b: &[u32]) -> f64 {
        let mut s = 0.0;
        for (i, at) in self.attrs.iter().enumerate() {
            let (x, y) = (a[i] as f64, b[i] as f64);
            s += at.weight
                * match (self.metric, at.kind) {
                    (Metric::Euclidean, AttrKind::Categorical) => 2.0 * f64::from(u8::from(a[i] != b[i])),
                    (Metric::Euclidean, AttrKind::Ordinal) => (x - y) * (x - y),
                    (Metric::Hamming, AttrKind::Categorical) => f64::from(u8::from(a[i] != b[i])),
                    (Metric::Hamming, AttrKind::Ordinal) => (x - y).abs(),
                };
        }
        match self.metric {
            Metric::Euclidean => s.sqrt(),
            Metric::Hamming => s,
        }
    }
}

/// The records the index is built from (row-aligned).
#[derive(Clone, Default)]
pub struct KnnRecords {
    /// Class key of each row (codes of the matching attributes).
    pub keys: Vec<Vec<u32>>,
    /// Stable row identifier (unique).
    pub rid: Vec<f64>,
    /// Complete (potential donor) or incomplete (donee).
    pub complete: Vec<bool>,
}

/// Result of the donor search.
#[derive(Clone)]
pub struct Assignment {
    /// For each row: its donors (row indices), empty for complete rows or when there is no donor.
    pub donors: Vec<Vec<usize>>,
    /// For each row: how many donees it donates to.
    pub donee_count: Vec<u32>,
    /// Class of each row.
    pub class_of: Vec<u32>,
    /// Class keys.
    pub classes: Vec<Vec<u32>>,
    /// Per class: nearest donor distance (∞ if no donor anywhere).
    pub dmin: Vec<f64>,
}

/// L1(D) by cases (004 §6.2).
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct L1Report {
    /// (a) removing an existing donor.
    pub remove_donor: u64,
    /// (b) adding a donor to a class that has donors.
    pub add_to_donor_class: u64,
    /// (c) adding a donor to a class with donees but no donor.
    pub add_to_donee_class: u64,
    /// (d) adding a donor in a class absent from the data.
    pub add_new_class: u64,
    /// Whether (d) is exact (enumerated) or an upper bound.
    pub new_class_exact: bool,
    /// L1(D) = max(1, (a), (b), (c), (d)) (restricted: the 1 only when an incomplete relevant tuple is possible).
    pub value: u64,
}

// The donee counts and L1(D) are exact, data-dependent values.
crate::protected_debug!(KnnRecords, Assignment, L1Report);

struct ClassInfo {
    donors: Vec<(f64, usize)>, // (rid, row) sorted by rid
    donees: Vec<(f64, usize)>, // (rid, row)
}

/// Index of the first element with rid > x in a sorted list (cyclic: wraps to 0).
fn next_after(sorted: &[(f64, usize)], x: f64) -> usize {
    let i = sorted.partition_point(|(r, _)| *r <= x);
    if i == sorted.len() { 0 } else { i }
}

impl Assignment {
    /// Builds classes and assigns donors (any k).
    pub fn build(cfg: &KnnConfig, rec: &KnnRecords) -> Assignment {
        let n = rec.rid.len();
        let mut class_id: HashMap<&[u32], u32> = HashMap::new();
        let mut classes: Vec<Vec<u32>> = Vec::new();
        let mut class_of = Vec::with_capacity(n);
        for key in &rec.keys {
            let id = *class_id.entry(key.as_slice()).or_insert_with(|| {
                classes.push(key.clone());
                (classes.len() - 1) as u32
            });
            class_of.push(id);
        }
        let mut info: Vec<ClassInfo> =
            (0..classes.len()).map(|_| ClassInfo { donors: vec![], donees: vec![] }).collect();
        for i in 0..n {
            let c = &mut info[class_of[i] as usize];
            if rec.complete[i] {
                c.donors.push((rec.rid[i], i));
            } else {
                c.donees.push((rec.rid[i], i));
            }
        }
        for c in &mut info {
            c.donors.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let donor_classes: Vec<usize> = (0..classes.len()).filter(|&c| !info[c].donors.is_empty()).collect();
        let mut donors = vec![Vec::new(); n];
        let mut donee_count = vec![0u32; n];
        let mut dmin = vec![f64::INFINITY; classes.len()];
        for c in 0..classes.len() {
            if info[c].donees.is_empty() && info[c].donors.is_empty() {
                continue;
            }
            // Donor classes by distance, grouped into equal-distance levels; only the nearest
            // levels that hold k donors are built (the donees never look further).
            let mut by_dist: Vec<(f64, usize)> =
                donor_classes.iter().map(|&d| (cfg.distance(&classes[c], &classes[d]), d)).collect();
            let nearest = by_dist.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
            dmin[c] = nearest;
            if info[c].donees.is_empty() {
                continue;
            }
            let at_nearest: usize = by_dist.iter().filter(|x| x.0 == nearest).map(|&(_, d)| info[d].donors.len()).sum();
            if at_nearest >= cfg.k {
                // Common case (k = 1 always): one level, no sort of all classes.
                by_dist.retain(|x| x.0 == nearest);
            }
            by_dist.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut levels: Vec<Vec<(f64, usize)>> = Vec::new();
            let mut last = f64::NAN;
            let mut have = 0usize;
            for (d, dc) in by_dist {
                if d != last {
                    if have >= cfg.k {
                        break;
                    }
                    levels.push(Vec::new());
                    last = d;
                }
                levels.last_mut().expect("pushed").extend(info[dc].donors.iter().copied());
                have += info[dc].donors.len();
            }
            for l in &mut levels {
                l.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            for &(rid, row) in &info[c].donees {
                let mut chosen = Vec::with_capacity(cfg.k);
                'levels: for l in &levels {
                    if l.is_empty() {
                        continue;
                    }
                    let start = next_after(l, rid);
                    for j in 0..l.len() {
                        if chosen.len() == cfg.k {
                            break 'levels;
                        }
                        chosen.push(l[(start + j) % l.len()].1);
                    }
                    if chosen.len() == cfg.k {
                        break;
                    }
                }
                for &d in &chosen {
                    donee_count[d] += 1;
                }
                donors[row] = chosen;
            }
        }
        Assignment { donors, donee_count, class_of, classes, dmin }
    }

    /// L1(D) for k = 1 by the four cases of 004 §6.2; (a)–(c) exact; (d)
    /// exact by enumerating the class space when it has at most
    /// `enumerate_limit` keys, otherwise bounded from above.
    ///
    /// **The choice depends on public quantities only**: the size of the class
    /// space Π size(attr) (from the public domain and groupings) against
    /// `enumerate_limit`, never on the number of classes present in the data
    /// (issue 14 §2: otherwise whether the noise scale uses the exact value or
    /// a bound would itself depend on the data). The enumeration visits every
    /// key of the space anyway, so its cost is what the switch measures.
    ///
    /// The bound for (d), N₀(D) = Σ_{C: dmin(C) > 0} |donees(C)| (donees in
    /// classes with no donor at distance 0; all donees if some weight is 0),
    /// is a valid input to the smooth upper bounds of 004 §5, which need
    /// B(D) ≥ L1(D) **and** B(D) ≤ 2·B(D′) for neighbours (Thm 3.5 with
    /// U_k = 1 + 2^k·B, as in the proof of Thm 5.1; an arbitrary upper bound
    /// on L1 does not keep S = 1 + B ln 2-smooth). With B = max(1, a, b, c, N₀):
    /// - B ≥ L1: a donor added at an absent key x only changes donees of
    ///   classes C′ with d(x, C′) ≤ dmin(C′); with positive weights distinct
    ///   keys are at positive distance, so dmin(C′) > 0: (d) ≤ N₀. Hence
    ///   B = max(L1, N₀).
    /// - B(D) ≤ 2·B(D′): L1(D) ≤ 2·L1(D′) (004 Thm 4.6(b, c)). For N₀: adding a
    ///   donee raises N₀ by ≤ 1 ≤ L1(D′); removing a donee or adding a donor
    ///   does not raise it (dmin only falls); removing a donor t raises it by
    ///   the donees of t's class if t was its only donor, and all of those had
    ///   t as their donor in D′ (the only donor at distance 0), so case (a)
    ///   gives L1(D′) ≥ that number. So N₀(D) ≤ N₀(D′) + L1(D′) ≤ 2·B(D′).
    ///
    /// (The triangle-inequality bound max_C Σ_{C′: d(C,C′) ≤ dmin(C) + dmin(C′)}
    /// |donees(C′)| used before is ≥ (d) but not smooth: removing the only
    /// donor of one class can make every other class "close" to it, e.g.
    /// m one-hot classes with one donor and one donee each go from bound 1 to
    /// m — see the knn tests.)
    pub fn l1(&self, cfg: &KnnConfig, rec: &KnnRecords, enumerate_limit: u64) -> Result<L1Report, KnnError> {
        self.l1_restricted(cfg, rec, enumerate_limit, None, true)
    }

    /// L1(D) restricted to the donees a statistic can read (issue 24; proof in
    /// docs/PRIVACY.md §6): L1_R(D) = max over one added or removed record t
    /// of |c(D, D ± t) ∩ R|, where R is a set of tuples fixed by each tuple's
    /// own attributes (`relevant[i]` says whether row i's tuple is in R; rows
    /// that are not donees are ignored). `possible` says (from public
    /// information only) whether a tuple of R that is incomplete could be
    /// added at all; then adding one changes c by that tuple, so the value is
    /// at least 1, as 004's L1(D) is. With `relevant = None` and `possible`
    /// this is L1(D).
    ///
    /// Because membership in R depends on the tuple alone, never on the rest
    /// of the dataset, every step of 004 Thm 4.6 holds for c(·,·) ∩ R (each is
    /// an inclusion or a count of one tuple), and so does the N₀ argument for
    /// case (d) below restricted to R: S_R = 1 + L1_R stays ln 2-smooth.
    pub fn l1_restricted(
        &self,
        cfg: &KnnConfig,
        rec: &KnnRecords,
        enumerate_limit: u64,
        relevant: Option<&[bool]>,
        possible: bool,
    ) -> Result<L1Report, KnnError> {
        if cfg.k != 1 {
            return Err(KnnError::UnsupportedK(cfg.k));
        }
        let counts = |i: usize| relevant.is_none_or(|r| r[i]);
        let nclass = self.classes.len();
        let mut donees: Vec<Vec<(f64, f64)>> = vec![Vec::new(); nclass]; // (rid_x, rid of donor) per class
        let mut has_donor = vec![false; nclass];
        let mut relevant_donees = vec![0u64; rec.rid.len()];
        for i in 0..rec.rid.len() {
            let c = self.class_of[i] as usize;
            if rec.complete[i] {
                has_donor[c] = true;
            } else if counts(i) {
                let d = self.donors[i].first().map_or(f64::NAN, |&r| rec.rid[r]);
                donees[c].push((rec.rid[i], d));
                if let Some(&r) = self.donors[i].first() {
                    relevant_donees[r] += 1;
                }
            }
        }
        let view = ClassView { classes: &self.classes, has_donor: &has_donor, dmin: &self.dmin };
        // (a) Removing a donor changes the donor of each of its donees.
        let remove_donor = relevant_donees.iter().copied().max().unwrap_or(0);
        Ok(view.l1(cfg, &donees, remove_donor, enumerate_limit, possible))
    }
}

/// The classes of a donor search as L1(D) needs them: the keys present, which
/// hold a donor, and each class's nearest donor distance. Built by
/// [`Assignment`] from rows held in memory, or by a streaming search that
/// keeps only classes and donees. Keys are unique and have one code per
/// matching attribute of the [`KnnConfig`] they are scored with.
pub struct ClassView<'a> {
    /// Class keys (every class holding a donor or a donee).
    pub classes: &'a [Vec<u32>],
    /// Whether each class holds a donor.
    pub has_donor: &'a [bool],
    /// Each class's nearest donor distance (∞ without a donor anywhere; read for donee classes only).
    pub dmin: &'a [f64],
}

/// The donees of R of one released number, per class, as (identifier, donor
/// identifier or NaN without a donor), with case (a): the most donees of R
/// one donor serves.
pub struct PartDonees<'a> {
    /// Per class (indexed like [`ClassView::classes`]).
    pub donees: &'a [Vec<(f64, f64)>],
    /// Case (a) of L1_R(D).
    pub remove_donor: u64,
}

impl ClassView<'_> {
    /// L1_R(D) of one released number (see [`Self::l1_many`]).
    pub fn l1(
        &self,
        cfg: &KnnConfig,
        donees: &[Vec<(f64, f64)>],
        remove_donor: u64,
        enumerate_limit: u64,
        possible: bool,
    ) -> L1Report {
        self.l1_many(cfg, &[PartDonees { donees, remove_donor }], enumerate_limit, possible).remove(0)
    }

    /// L1_R(D) of several released numbers over the same classes (see
    /// [`Assignment::l1_restricted`] for the cases and their proofs; this is
    /// their shared computation). Each candidate key's distances to the donee
    /// classes are computed once for every number, and keys are scored on
    /// all cores.
    pub fn l1_many(
        &self,
        cfg: &KnnConfig,
        parts: &[PartDonees<'_>],
        enumerate_limit: u64,
        possible: bool,
    ) -> Vec<L1Report> {
        use rayon::prelude::*;
        let nclass = self.classes.len();
        let np = parts.len();
        if np == 0 {
            return Vec::new();
        }
        // Classes holding a donee of some number.
        let donee_classes: Vec<usize> =
            (0..nclass).filter(|&c| parts.iter().any(|p| !p.donees[c].is_empty())).collect();
        let near = Near::new(cfg, self, &donee_classes);
        // Per number, the donees a new donor at `key` (with the best identifier) changes.
        let changed_by = |key: &[u32]| -> Vec<u64> {
            // Only classes no farther than their nearest donor can change.
            let near = near.of(cfg, self, key);
            let mut intervals: Vec<(f64, f64)> = Vec::new();
            parts
                .iter()
                .map(|p| {
                    let mut full = 0u64;
                    intervals.clear();
                    for &(c, closer) in &near {
                        if closer {
                            full += p.donees[c].len() as u64;
                        } else {
                            intervals.extend(p.donees[c].iter().copied());
                        }
                    }
                    full + max_cyclic_coverage(&intervals)
                })
                .collect()
        };
        let max_into = |mut a: Vec<u64>, b: Vec<u64>| {
            a.iter_mut().zip(b).for_each(|(x, y)| *x = (*x).max(y));
            a
        };
        // (b) and (c): a donor added to a class present in the data.
        let (add_to_donor_class, add_to_donee_class) = (0..nclass)
            .into_par_iter()
            .map(|c| {
                let v = changed_by(&self.classes[c]);
                if self.has_donor[c] { (v, vec![0; np]) } else { (vec![0; np], v) }
            })
            .reduce(|| (vec![0; np], vec![0; np]), |a, b| (max_into(a.0, b.0), max_into(a.1, b.1)));
        // (d) classes absent from the data: exact or bounded by the public space size.
        let space: f64 = cfg.attrs.iter().map(|a| a.size as f64).product();
        let (add_new_class, exact) = if space <= enumerate_limit as f64 {
            let present: std::collections::HashSet<&[u32]> = self.classes.iter().map(|k| k.as_slice()).collect();
            let sizes: Vec<u64> = cfg.attrs.iter().map(|a| u64::from(a.size)).collect();
            let best = (0..space as u64)
                .into_par_iter()
                .map(|mut i| {
                    // The i-th key in mixed radix, the last attribute fastest.
                    let mut key = vec![0u32; sizes.len()];
                    for (k, &n) in key.iter_mut().zip(&sizes).rev() {
                        *k = (i % n) as u32;
                        i /= n;
                    }
                    if present.contains(key.as_slice()) { vec![0; np] } else { changed_by(&key) }
                })
                .reduce(|| vec![0; np], max_into);
            (best, true)
        } else {
            // N₀: donees of classes with no donor at distance 0 (see `Assignment::l1`).
            let positive = cfg.distinct_keys_apart();
            let bound = parts
                .iter()
                .map(|p| {
                    (0..nclass)
                        .filter(|&c| !positive || self.dmin[c] > 0.0)
                        .map(|c| p.donees[c].len() as u64)
                        .sum::<u64>()
                })
                .collect();
            (bound, false)
        };
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                finish(possible, p.remove_donor, add_to_donor_class[i], add_to_donee_class[i], add_new_class[i], exact)
            })
            .collect()
    }
}

/// The donee classes a donor added at a key can change: those no farther
/// from the key than their nearest donor, each with whether it is strictly
/// closer (the donee then moves whatever its identifier).
///
/// Scanning every donee class for every candidate key costs
/// keys × classes distances, which dominated a census-scale imputation (most
/// of the client's time at 10⁷ rows, whatever the row count, since it depends
/// on the classes only). With every weight positive (and finite, as the spec
/// requires), distinct keys are at a positive distance, so a donee class whose
/// own class holds a donor (`dmin = 0`) is reached by its own key alone: those
/// classes are looked up by key, and only the others are scanned. The set is
/// exactly the scan's (tested against it in `near_equals_the_scan`).
struct Near<'a> {
    /// Donee classes with `dmin = 0`, by key (empty unless every weight is positive).
    at_zero: HashMap<&'a [u32], usize>,
    /// The other donee classes, scanned.
    scanned: Vec<usize>,
}

impl<'a> Near<'a> {
    fn new(cfg: &KnnConfig, view: &ClassView<'a>, donee_classes: &[usize]) -> Self {
        let positive = cfg.distinct_keys_apart();
        let mut at_zero = HashMap::new();
        let mut scanned = Vec::new();
        for &c in donee_classes {
            // Both hold on every path that builds a `ClassView` (classes are
            // merged by key; keys have one code per matching attribute).
            debug_assert_eq!(view.classes[c].len(), cfg.attrs.len(), "a class key per matching attribute");
            if positive && view.dmin[c] == 0.0 {
                let earlier = at_zero.insert(view.classes[c].as_slice(), c);
                debug_assert!(earlier.is_none(), "class keys are unique");
            } else {
                scanned.push(c);
            }
        }
        Near { at_zero, scanned }
    }

    /// (class, strictly closer than its nearest donor), in no particular order.
    fn of(&self, cfg: &KnnConfig, view: &ClassView<'_>, key: &[u32]) -> Vec<(usize, bool)> {
        let mut near: Vec<(usize, bool)> = self
            .scanned
            .iter()
            .filter_map(|&c| {
                let d = cfg.distance(key, &view.classes[c]);
                (d <= view.dmin[c]).then_some((c, d < view.dmin[c]))
            })
            .collect();
        if let Some(&c) = self.at_zero.get(key) {
            near.push((c, false));
        }
        near
    }
}

fn finish(possible: bool, a: u64, b: u64, c: u64, d: u64, exact: bool) -> L1Report {
    L1Report {
        remove_donor: a,
        add_to_donor_class: b,
        add_to_donee_class: c,
        add_new_class: d,
        new_class_exact: exact,
        value: u64::from(possible).max(a).max(b).max(c).max(d),
    }
}

/// The largest number of open cyclic intervals (x, y) — "after x, before y,
/// wrapping" — that contain one common point. A NaN end (no donor) means the
/// whole circle except x.
pub fn max_cyclic_coverage(intervals: &[(f64, f64)]) -> u64 {
    if intervals.is_empty() {
        return 0;
    }
    // Events on the line; wrapping intervals are active from −∞.
    let mut events: Vec<(f64, i64)> = Vec::with_capacity(intervals.len() * 2);
    let mut active: i64 = 0;
    for &(x, y) in intervals {
        if y.is_nan() {
            // Everywhere except exactly x: any point works.
            active += 1;
            continue;
        }
        if y > x {
            events.push((x, 1));
            events.push((y, -1));
        } else {
            // (x, +∞) ∪ (−∞, y); y == x means the whole circle minus a point.
            active += 1;
            events.push((y, -1));
            events.push((x, 1));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best = active; // a point below every coordinate
    let mut i = 0;
    while i < events.len() {
        let c = events[i].0;
        while i < events.len() && events[i].0 == c {
            active += events[i].1;
            i += 1;
        }
        // Points just above c.
        best = best.max(active);
    }
    best.max(0) as u64
}

#[cfg(test)]
mod near_tests {
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// `Near` finds exactly the classes a scan of every donee class finds,
    /// for every key of the space (present or not), both metrics, zero and
    /// positive weights, and nearest-donor distances of 0, of a real distance
    /// (ties) and in between.
    #[test]
    fn near_equals_the_scan() {
        let mut rng = SmallRng::seed_from_u64(11);
        let mut shortcut_taken = false;
        let sizes = [3u32, 4, 2];
        let space: Vec<Vec<u32>> = (0..24u32).map(|i| vec![i / 8, (i / 2) % 4, i % 2]).collect();
        for trial in 0..400 {
            let metric = if trial % 2 == 0 { Metric::Euclidean } else { Metric::Hamming };
            let weight = |rng: &mut SmallRng| if rng.random::<f64>() < 0.15 { 0.0 } else { rng.random_range(0.1..3.0) };
            let cfg = KnnConfig {
                attrs: (0..3)
                    .map(|i| MatchAttr {
                        name: format!("a{i}"),
                        kind: if i == 1 { AttrKind::Ordinal } else { AttrKind::Categorical },
                        weight: weight(&mut rng),
                        size: sizes[i],
                    })
                    .collect(),
                metric,
                k: 1,
            };
            let classes: Vec<Vec<u32>> = space.iter().filter(|_| rng.random::<f64>() < 0.6).cloned().collect();
            let dmin: Vec<f64> = classes
                .iter()
                .map(|k| match rng.random_range(0..4) {
                    0 => 0.0,
                    1 => cfg.distance(k, &space[rng.random_range(0..space.len())]),
                    2 => rng.random_range(0.0..4.0),
                    _ => f64::INFINITY, // no donor anywhere
                })
                .collect();
            let has_donor = vec![true; classes.len()];
            let view = ClassView { classes: &classes, has_donor: &has_donor, dmin: &dmin };
            let donee_classes: Vec<usize> = (0..classes.len()).filter(|_| rng.random::<f64>() < 0.8).collect();
            let near = Near::new(&cfg, &view, &donee_classes);
            if cfg.distinct_keys_apart() {
                shortcut_taken |= !near.at_zero.is_empty();
            }
            for key in &space {
                let mut got = near.of(&cfg, &view, key);
                got.sort_unstable();
                let want: Vec<(usize, bool)> = donee_classes
                    .iter()
                    .filter_map(|&c| {
                        let d = cfg.distance(key, &classes[c]);
                        (d <= dmin[c]).then_some((c, d < dmin[c]))
                    })
                    .collect();
                assert_eq!(got, want, "trial {trial} key {key:?}");
            }
        }
        assert!(shortcut_taken, "no trial looked classes up by key");
    }
}
