//! Sensitivity that follows the query (issue 24; 004 §5, NOTES §9; proofs in
//! docs/PRIVACY.md §6): each released number is charged for the donees whose
//! imputed values can enter *it*, not for every donee of the table.
//!
//! A released number (a part of a query: a count, a numerator count, a mean,
//! a variance) *reads* the columns of its predicates and its value. Let A be
//! the imputed columns.
//! - It reads no column of A: no imputed value can enter it, so its global
//!   sensitivity holds (1 for a count, max(|a|, |b|)/s for a mean, m/(s − 1)
//!   for a variance) and it is released with discrete Laplace noise, decided
//!   from the spec alone (public) before any data is read.
//! - Otherwise its smooth bound uses L1_R(D) (`Assignment::l1_restricted`):
//!   R holds the donees with an unknown cell in the columns it reads and
//!   whose *other* cells (observed or not applicable, hence fixed by the
//!   tuple itself) pass its predicates. Whether a tuple is in R depends on
//!   that tuple alone, which is what keeps 1 + L1_R ln 2-smooth.

#[cfg(any(test, feature = "bench-internals"))]
use dpflow_udfs::knn::L1Report;

#[cfg(any(test, feature = "bench-internals"))]
use super::spec::Predicate;
#[cfg(test)]
use super::spec::{QueryKind, QuerySpec};
#[cfg(any(test, feature = "bench-internals"))]
use super::{Imputed, Result};

#[cfg(any(test, feature = "bench-internals"))]
use dpflow_udfs::knn::query::Part;
pub(crate) use dpflow_udfs::knn::query::parts;
pub use dpflow_udfs::knn::query::{PartNoise, part_noises};

#[cfg(any(test, feature = "bench-internals"))]
#[cfg_attr(not(test), allow(dead_code))]
/// A predicate with its column's observed values and, for an imputed column, its unknown cells.
type ResolvedPredicate<'a> = (&'a Predicate, &'a [Option<f64>], Option<&'a [bool]>);

#[cfg(any(test, feature = "bench-internals"))]
#[cfg_attr(not(test), allow(dead_code))]
impl Imputed {
    /// R of one released number, per donor-search record (see module docs):
    /// a donee with an unknown cell among the imputed columns the number
    /// reads, whose other cells pass its predicates. `None` when the number
    /// reads no imputed column.
    pub(crate) fn relevant(&self, part: &Part<'_>) -> Option<Vec<bool>> {
        if part.noise(&self.imputed_columns) == PartNoise::Global {
            return None;
        }
        let search = self.search.as_ref()?;
        // Columns resolved once, not per row: the unknown cells it reads, and each predicate
        // with its observed values and (for an imputed column) its unknown cells.
        let read_unknown: Vec<&[bool]> = part.reads().filter_map(|c| self.missing.get(c).map(Vec::as_slice)).collect();
        let predicates: Vec<ResolvedPredicate<'_>> = part
            .predicates
            .iter()
            .map(|p| (*p, self.observed[&p.column].as_slice(), self.missing.get(&p.column).map(Vec::as_slice)))
            .collect();
        Some(
            search
                .rows
                .iter()
                .map(|&r| {
                    self.imputed[r]
                        && read_unknown.iter().any(|m| m[r])
                        && predicates.iter().all(|(p, obs, unknown)| unknown.is_some_and(|m| m[r]) || p.matches(obs[r]))
                })
                .collect(),
        )
    }

    /// L1_R(D) of one released number (None: it reads no imputed column).
    pub(crate) fn l1_of(&self, part: &Part<'_>) -> Result<Option<L1Report>> {
        let Some(relevant) = self.relevant(part) else { return Ok(None) };
        let s = self.search.as_ref().expect("relevant() needs the search");
        // A relevant incomplete tuple can always be added: the number reads an imputed column.
        Ok(Some(s.asg.l1_restricted(&s.cfg, &s.rec, s.enumerate_limit, Some(&relevant), true)?))
    }

    /// How many donees can enter one released number (curator diagnostics only).
    pub(crate) fn donees_in(&self, part: &Part<'_>) -> usize {
        self.relevant(part).map_or(0, |r| r.iter().filter(|x| **x).count())
    }
}

#[cfg(test)]
mod tests {
    //! Brute force over every single addition and removal on random small
    //! tables with both kinds of null: L1_R(D) is exactly the largest number of
    //! donees of R whose donor changes (or that come or go), and each released
    //! number moves by no more than its bound.
    use std::collections::HashMap;

    use dpflow_udfs::knn::{AttrKind, KnnConfig, MatchAttr, Metric};
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::impute::{exact_parts, impute_columns_na};

    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Y {
        Value(f64),
        Unknown,
        NotApplicable,
    }

    #[derive(Clone, Copy, Debug)]
    struct Tuple {
        id: u32,
        x: u32,
        z: u32,
        y: Y,
        /// A second imputed column.
        v: Y,
    }

    fn impute(t: &[Tuple]) -> Imputed {
        let mut cols = HashMap::new();
        cols.insert("id".to_string(), t.iter().map(|r| Some(r.id as f64)).collect());
        cols.insert("z".to_string(), t.iter().map(|r| Some(r.z as f64)).collect());
        let val = |y: Y| if let Y::Value(v) = y { Some(v) } else { None };
        cols.insert("y".to_string(), t.iter().map(|r| val(r.y)).collect());
        cols.insert("v".to_string(), t.iter().map(|r| val(r.v)).collect());
        let na = HashMap::from([
            ("y".to_string(), t.iter().map(|r| r.y == Y::NotApplicable).collect()),
            ("v".to_string(), t.iter().map(|r| r.v == Y::NotApplicable).collect()),
        ]);
        let cfg = KnnConfig {
            attrs: vec![MatchAttr { name: "x".into(), kind: AttrKind::Ordinal, weight: 1.0, size: 3 }],
            metric: Metric::Euclidean,
            k: 1,
        };
        let codes = t.iter().map(|r| vec![r.x]).collect();
        impute_columns_na(cols, na, &["y".to_string(), "v".to_string()], codes, &cfg, u64::MAX).unwrap()
    }

    /// Donor id of every donee, keyed by the donee's id.
    fn donors(d: &Imputed, t: &[Tuple]) -> HashMap<u32, Option<u32>> {
        let s = d.search.as_ref().unwrap();
        (0..s.rows.len())
            .filter(|&i| !s.rec.complete[i])
            .map(|i| (t[s.rows[i]].id, s.asg.donors[i].first().map(|&j| t[s.rows[j]].id)))
            .collect()
    }

    fn pred(column: &str, lo: Option<f64>, hi: Option<f64>) -> Predicate {
        Predicate { column: column.into(), lo, hi, codes: None }
    }

    fn queries() -> Vec<QuerySpec> {
        vec![
            // Reads no imputed column: global sensitivity 1.
            QuerySpec { name: "n_z1".into(), kind: QueryKind::Count, predicate: vec![pred("z", Some(1.0), None)] },
            // Reads y in its predicate (numerator) only.
            QuerySpec {
                name: "share".into(),
                kind: QueryKind::Proportion { numerator: vec![pred("y", Some(50.0), None)] },
                predicate: vec![pred("z", Some(1.0), None)],
            },
            // Averages y over z = 0.
            QuerySpec {
                name: "mean".into(),
                kind: QueryKind::Mean { value: "y".into(), lo: 0.0, hi: 100.0 },
                predicate: vec![pred("z", None, Some(0.0))],
            },
            // Averages v over y ≥ 50: a donee with only v unknown enters by its observed y; one
            // with only y unknown is in R through the predicate.
            QuerySpec {
                name: "mean_v".into(),
                kind: QueryKind::Mean { value: "v".into(), lo: 0.0, hi: 100.0 },
                predicate: vec![pred("y", Some(50.0), None)],
            },
        ]
    }

    /// Whether a tuple is in R of a part: an unknown y (a donee) read by the
    /// part, its other cells passing the part's predicates (z here).
    fn in_r(t: &Tuple, part: &Part<'_>) -> bool {
        let cell = |c: &str| match c {
            "y" => t.y,
            "v" => t.v,
            _ => Y::Value(t.z as f64),
        };
        let val = |y: Y| if let Y::Value(v) = y { Some(v) } else { None };
        part.reads().any(|c| cell(c) == Y::Unknown)
            && part.predicates.iter().all(|p| cell(&p.column) == Y::Unknown || p.matches(val(cell(&p.column))))
    }

    fn random_table(rng: &mut SmallRng, n: usize) -> Vec<Tuple> {
        let cell = |rng: &mut SmallRng| match rng.random_range(0..10) {
            0..=2 => Y::Unknown,
            3 => Y::NotApplicable,
            _ => Y::Value(rng.random_range(0..=10) as f64 * 10.0),
        };
        (0..n)
            .map(|i| Tuple {
                id: i as u32,
                x: rng.random_range(0..3),
                z: rng.random_range(0..2),
                y: cell(rng),
                v: cell(rng),
            })
            .collect()
    }

    /// Every neighbour: each row removed, and each kind of tuple added at each position.
    fn neighbours(t: &[Tuple]) -> Vec<(Vec<Tuple>, Tuple)> {
        let mut out = Vec::new();
        for i in 0..t.len() {
            let mut d = t.to_vec();
            let gone = d.remove(i);
            out.push((d, gone));
        }
        let ys = [Y::Value(0.0), Y::Value(60.0), Y::Value(100.0), Y::Unknown, Y::NotApplicable];
        let vs = [Y::Value(40.0), Y::Unknown, Y::NotApplicable];
        for p in 0..=t.len() {
            for x in 0..3 {
                for z in 0..2 {
                    for y in ys {
                        for v in vs {
                            let mut d = t.to_vec();
                            let new = Tuple { id: 1000, x, z, y, v };
                            d.insert(p, new);
                            out.push((d, new));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn per_query_bound_equals_brute_force_and_bounds_every_neighbour() {
        let mut rng = SmallRng::seed_from_u64(2024);
        let qs = queries();
        for trial in 0..25 {
            let n = rng.random_range(3..11);
            let t = random_table(&mut rng, n);
            let d = impute(&t);
            // Not-applicable nulls are never imputed nor counted missing; a donee is a row
            // with an unknown cell.
            for (r, tu) in t.iter().enumerate() {
                for (c, cell) in [("y", tu.y), ("v", tu.v)] {
                    if cell == Y::NotApplicable {
                        assert!(d.columns[c][r].is_none() && !d.missing[c][r]);
                    }
                }
                assert_eq!(d.imputed[r], tu.y == Y::Unknown || tu.v == Y::Unknown);
            }
            let base = donors(&d, &t);
            let nbs: Vec<(Vec<Tuple>, Tuple, Imputed)> =
                neighbours(&t).into_iter().map(|(n, c)| (n.clone(), c, impute(&n))).collect();
            for q in &qs {
                let ex = exact_parts(q, &d.summarize(std::slice::from_ref(q)).unwrap().queries[0]);
                for (pi, part) in parts(q).iter().enumerate() {
                    let l1 = d.l1_of(part).unwrap();
                    let mut brute = u64::from(part.noise(&d.imputed_columns) == PartNoise::Smooth);
                    for (nt, changed, nd) in &nbs {
                        let after = donors(nd, nt);
                        let mut c = u64::from(in_r(changed, part));
                        c += t
                            .iter()
                            .filter(|u| in_r(u, part) && after.contains_key(&u.id) && after[&u.id] != base[&u.id])
                            .count() as u64;
                        brute = brute.max(c);
                        // The released number moves by no more than its bound (count/numerator
                        // by 1 + L1_R, the mean's sum by max(|a|, |b|) + L1_R·w).
                        let nex = exact_parts(q, &nd.summarize(std::slice::from_ref(q)).unwrap().queries[0]);
                        let l = l1.map_or(0.0, |r| r.value as f64);
                        let moved = match (&q.kind, pi) {
                            (QueryKind::Mean { .. }, 1) => {
                                let sum = |e: &[Option<f64>]| e[1].unwrap_or(0.0) * e[0].unwrap_or(0.0);
                                ((sum(&nex) - sum(&ex)).abs(), 100.0 + l * 100.0)
                            }
                            _ => ((nex[pi].unwrap_or(0.0) - ex[pi].unwrap_or(0.0)).abs(), 1.0 + l),
                        };
                        assert!(
                            moved.0 <= moved.1 + 1e-9,
                            "trial {trial} {} part {pi}: moved {} > bound {}",
                            q.name,
                            moved.0,
                            moved.1
                        );
                    }
                    match l1 {
                        None => assert_eq!(brute, 0, "trial {trial} {}: a global part reads no donee", q.name),
                        Some(r) => assert_eq!(r.value, brute, "trial {trial} {} part {pi}", q.name),
                    }
                }
            }
        }
    }
}
