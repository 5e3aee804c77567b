//! kNN imputation streamed over record batches (issue 19 item 3): two
//! passes over the input in file order, with memory bounded by the donor
//! classes and the donees, never by the rows.
//!
//! The donor rule is 004 Def. 4.1 with the cyclic tie-break of
//! `dpflow_udfs::knn` (k = 1): a donee x takes, among the donors of the
//! nearest donor classes (its *level*), the first whose identifier follows
//! x's, wrapping around. Identifiers are row numbers, so in a pass in file
//! order a donee's donor is the first donor of its level that arrives after
//! it, or, if none does, the first donor of its level in the file.
//!
//! - **Pass 1** builds the class index: the key of every row that takes
//!   part (a donor, complete on the imputed columns, or a donee, with an
//!   unknown cell), and per class its donors, donees and first donor row.
//!   Then each donee class gets its level and nearest donor distance dmin.
//! - **Pass 2** streams the rows again. A donee waits in its class's queue;
//!   a donor resolves the queues of every class whose level it is in; a
//!   donee still waiting at the end takes its level's first donor (whose
//!   values were kept: one row per class). Every row is added to the
//!   queries' aggregates as soon as its values are known, and each donee
//!   leaves (identifier, donor identifier) in its class for the L1_R(D) of
//!   every number whose R it is in.
//!
//! Memory: the class index, one row per class, 16 bytes per donee per
//! released number that reads an imputed column (004 §6.2's cases (b)–(c)
//! need every donee's interval), and the donees waiting for a donor.
//!
//! The result is the same [`Summary`] as the in-memory imputation's
//! (`Imputed::summarize` in `reference.rs`), exactly: sums are exact
//! integers on a public grid, so the order in which donees are added does
//! not matter (tested).

use std::collections::HashMap;

use dpflow_udfs::knn::{ClassView, KnnConfig, KnnError, PartDonees};
use rayon::prelude::*;

use super::spec::{Imputation, QuerySpec};
use super::summary::{Aggregates, Columns, CompiledQuery, QuerySummary, RowView, Summary};
use super::{ImputeError, Result, batch_values, read_in_order};
use crate::dataset::Dataset;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt32Type;
use datafusion::execution::context::SessionContext;

/// No row: the first donor of a class without donors.
const NONE: u64 = u64::MAX;

/// What pass 1 learns of one class.
#[derive(Clone)]
struct Class {
    donors: u64,
    donees: u64,
    /// Row of its first donor ([`NONE`] without donors).
    first_donor: u64,
}

/// The class index: keys, per-class counts, and each donee class's level.
struct Index {
    id: HashMap<Vec<u32>, u32>,
    keys: Vec<Vec<u32>>,
    classes: Vec<Class>,
    /// Nearest donor distance per class (∞ without a donor anywhere; set for donee classes).
    dmin: Vec<f64>,
    /// Per donor class: the donee classes whose level holds it.
    watchers: Vec<Vec<u32>>,
    /// Per donee class: the class of its level's first donor (None: no donor anywhere).
    wrap: Vec<Option<u32>>,
}

/// How one row of a batch takes part.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Donor,
    Donee,
    None,
}

/// Reads what the donor search needs of a batch: the match keys, and which
/// rows are donors and donees.
struct Roles<'a> {
    imp: &'a Imputation,
    /// Positions of the matching columns in the domain.
    match_pos: Vec<usize>,
}

impl Roles<'_> {
    /// The grouped key of row `r`.
    fn key(&self, codes: &RecordBatch, r: usize, key: &mut [u32]) {
        for ((k, &p), (_, g)) in key.iter_mut().zip(&self.match_pos).zip(&self.imp.grouping) {
            *k = codes.column(p).as_primitive::<UInt32Type>().value(r) / g;
        }
    }

    /// Each row's role, from the imputed columns' values and unknown cells.
    fn roles(&self, a_observed: &[&[Option<f64>]], a_unknown: &[&[bool]], rows: usize) -> Vec<Role> {
        (0..rows)
            .map(|r| {
                if a_observed.iter().all(|c| c[r].is_some()) {
                    Role::Donor
                } else if a_unknown.iter().any(|c| c[r]) {
                    Role::Donee
                } else {
                    Role::None
                }
            })
            .collect()
    }
}

/// One batch's columns as numbers, with unknown cells marked.
struct BatchColumns {
    observed: Vec<Vec<Option<f64>>>,
    unknown: Vec<Vec<bool>>,
}

/// Reads `names` of a batch; a cell is unknown when it is null, in an
/// imputed column, and not not-applicable.
fn read_columns(
    ds: &Dataset,
    names: &[String],
    imputed: &[String],
    rules: &HashMap<String, crate::domain::NotApplicable>,
    t: &RecordBatch,
    c: &RecordBatch,
) -> Result<BatchColumns> {
    let mut observed = Vec::with_capacity(names.len());
    let mut unknown = Vec::with_capacity(names.len());
    for name in names {
        let v = batch_values(ds.domain(), name, t, c, false)?;
        let u = if imputed.contains(name) {
            let na = rules.get(name).map(|rule| rule.mask(t)).transpose()?;
            v.iter().enumerate().map(|(r, x)| x.is_none() && !na.as_ref().is_some_and(|m| m[r])).collect()
        } else {
            vec![false; v.len()]
        };
        observed.push(v);
        unknown.push(u);
    }
    Ok(BatchColumns { observed, unknown })
}

/// A donee waiting for its donor.
struct Waiting {
    row: u64,
    observed: Box<[Option<f64>]>,
    unknown: Box<[bool]>,
}

/// The L1 bookkeeping of pass 2, per flat part: the smooth numbers of every
/// query in order.
struct Donees {
    /// Per flat part, per class: the donees of R as (identifier, donor identifier or NaN).
    per_part: Vec<Vec<Vec<(f64, f64)>>>,
    /// Per flat part: |R|.
    inside: Vec<u64>,
    /// Donees seen.
    seen: u64,
    /// Per flat part: the most donees of R one donor serves, over donors whose count is final.
    remove_donor: Vec<u64>,
    /// Per class: the donees served by its first donor, per flat part (wrap-around donees arrive last).
    first_load: Vec<Option<Vec<u64>>>,
}

/// The streamed imputation's summary of `queries` (the release paths' entry).
pub(crate) async fn summarize(
    ctx: &SessionContext,
    ds: &Dataset,
    imp: &Imputation,
    queries: &[QuerySpec],
    enumerate_limit: u64,
) -> Result<Summary> {
    if imp.knn.k != 1 {
        return Err(KnnError::UnsupportedK(imp.knn.k).into());
    }
    let domain = ds.domain();
    let cols = Columns::of(&imp.columns, queries);
    let a_pos: Vec<usize> = imp.columns.iter().map(|a| cols.position(a)).collect();
    let mut rules = HashMap::new();
    for name in &imp.columns {
        if let Some(rule) = crate::domain::NotApplicable::compile(domain, name)? {
            rules.insert(name.clone(), rule);
        }
    }
    let match_pos = imp
        .grouping
        .iter()
        .map(|(c, _)| domain.position(c).ok_or_else(|| crate::dataset::DatasetError::UnknownColumn(c.clone())))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let roles = Roles { imp, match_pos };

    let (index, rows) = class_index(ctx, ds, imp, &rules, &roles).await?;
    let mut key = vec![0u32; imp.grouping.len()];

    // Pass 2: stream, impute, aggregate.
    let compiled: Vec<CompiledQuery<'_>> = queries.iter().map(|q| CompiledQuery::new(q, &cols, &imp.columns)).collect();
    let flat: Vec<(usize, usize)> =
        compiled.iter().enumerate().flat_map(|(qi, q)| (0..q.smooth_parts().count()).map(move |k| (qi, k))).collect();
    let nflat = flat.len();
    let nclass = index.keys.len();
    let mut aggs = vec![(Aggregates::default(), Aggregates::default()); queries.len()];
    let mut donees = Donees {
        per_part: vec![vec![Vec::new(); nclass]; nflat],
        inside: vec![0; nflat],
        seen: 0,
        remove_donor: vec![0; nflat],
        first_load: vec![None; nclass],
    };
    let mut waiting: Vec<Vec<Waiting>> = (0..nclass).map(|_| Vec::new()).collect();
    let mut first_values: Vec<Option<Box<[f64]>>> = vec![None; nclass];
    let mut load = vec![0u64; nflat];
    let mut after = vec![None; cols.names.len()];
    let mut observed = vec![None; cols.names.len()];
    let mut unknown = vec![false; cols.names.len()];
    let mut row = 0u64;
    // A donee's values once its donor is known (None: no donor anywhere), added to every aggregate.
    let finish = |w: &Waiting,
                  class: u32,
                  donor: Option<(u64, &[f64])>,
                  load: &mut [u64],
                  aggs: &mut [(Aggregates, Aggregates)],
                  donees: &mut Donees| {
        let mut after = w.observed.to_vec();
        for (j, &p) in a_pos.iter().enumerate() {
            if w.unknown[p] {
                after[p] = donor.map(|(_, v)| v[j]);
            }
        }
        let view = RowView { after: &after, observed: &w.observed, unknown: &w.unknown, donee: true };
        for (q, (imp_agg, ign)) in compiled.iter().zip(aggs.iter_mut()) {
            q.add(&view, imp_agg, ign);
        }
        let interval = (w.row as f64, donor.map_or(f64::NAN, |(r, _)| r as f64));
        let served = u64::from(donor.is_some());
        let mut enter = |f: usize| {
            donees.per_part[f][class as usize].push(interval);
            donees.inside[f] += 1;
            load[f] += served;
        };
        for (f, &(qi, k)) in flat.iter().enumerate() {
            if compiled[qi].relevant(k, &view) {
                enter(f);
            }
        }
        donees.seen += 1;
    };
    read_in_order(ctx, ds, |t, c| {
        let b = read_columns(ds, &cols.names, &imp.columns, &rules, t, c)?;
        let a_obs: Vec<&[Option<f64>]> = a_pos.iter().map(|&p| b.observed[p].as_slice()).collect();
        let a_unk: Vec<&[bool]> = a_pos.iter().map(|&p| b.unknown[p].as_slice()).collect();
        for (r, role) in roles.roles(&a_obs, &a_unk, t.num_rows()).into_iter().enumerate() {
            let this = row + r as u64;
            if this >= rows {
                return Err(ImputeError::Internal("the imputation input changed between its two reads"));
            }
            for i in 0..cols.names.len() {
                observed[i] = b.observed[i][r];
                unknown[i] = b.unknown[i][r];
            }
            let class = if role == Role::None {
                None
            } else {
                roles.key(c, r, &mut key);
                let k = *index
                    .id
                    .get(key.as_slice())
                    .ok_or(ImputeError::Internal("the imputation input changed between its two reads"))?;
                Some(k)
            };
            match (role, class) {
                (Role::Donor, Some(k)) => {
                    let values: Box<[f64]> = a_pos.iter().map(|&p| observed[p].expect("a donor is complete")).collect();
                    load.iter_mut().for_each(|l| *l = 0);
                    for &w in &index.watchers[k as usize] {
                        for d in std::mem::take(&mut waiting[w as usize]) {
                            finish(&d, w, Some((this, &*values)), &mut load, &mut aggs, &mut donees);
                        }
                    }
                    if index.classes[k as usize].first_donor == this {
                        first_values[k as usize] = Some(values);
                        donees.first_load[k as usize] = Some(load.clone());
                    } else {
                        donees.remove_donor.iter_mut().zip(&load).for_each(|(m, l)| *m = (*m).max(*l));
                    }
                }
                (Role::Donee, Some(k)) => {
                    let w = Waiting { row: this, observed: observed.clone().into(), unknown: unknown.clone().into() };
                    if index.wrap[k as usize].is_some() {
                        waiting[k as usize].push(w);
                    } else {
                        // No donor anywhere: its unknown cells stay null.
                        finish(&w, k, None, &mut load, &mut aggs, &mut donees);
                    }
                    continue;
                }
                _ => {}
            }
            // A donor or a row that takes no part: its values as read.
            after.copy_from_slice(&observed);
            let view = RowView { after: &after, observed: &observed, unknown: &unknown, donee: false };
            for (q, (imp_agg, ign)) in compiled.iter().zip(aggs.iter_mut()) {
                q.add(&view, imp_agg, ign);
            }
        }
        row += t.num_rows() as u64;
        Ok(())
    })
    .await?;
    if row != rows {
        return Err(ImputeError::Internal("the imputation input changed between its two reads"));
    }
    // Donees still waiting wrap around to their level's first donor.
    for (k, queue) in waiting.iter_mut().enumerate() {
        let Some(d) = index.wrap[k] else { continue };
        let d = d as usize;
        let mut load = donees.first_load[d].take().unwrap_or_else(|| vec![0; nflat]);
        let values = first_values[d].clone().ok_or(ImputeError::Internal("a first donor was not seen again"))?;
        for w in std::mem::take(queue) {
            finish(&w, k as u32, Some((index.classes[d].first_donor, &values)), &mut load, &mut aggs, &mut donees);
        }
        donees.first_load[d] = Some(load);
    }
    for load in donees.first_load.iter().flatten() {
        donees.remove_donor.iter_mut().zip(load).for_each(|(m, l)| *m = (*m).max(*l));
    }
    // L1_R(D) of every smooth number.
    let has_donor: Vec<bool> = index.classes.iter().map(|c| c.donors > 0).collect();
    let view = ClassView { classes: &index.keys, has_donor: &has_donor, dmin: &index.dmin };
    let asked: Vec<PartDonees<'_>> = donees
        .per_part
        .iter()
        .zip(&donees.remove_donor)
        .map(|(d, &remove_donor)| PartDonees { donees: d, remove_donor })
        .collect();
    let l1s = view.l1_many(&imp.knn, &asked, enumerate_limit, true);
    let mut out = Vec::with_capacity(queries.len());
    let mut f = 0;
    for (q, (imputed, ignore)) in compiled.iter().zip(aggs) {
        let mut l1 = vec![None; q.parts()];
        let mut donees_inside = vec![0u64; q.parts()];
        for i in q.smooth_parts() {
            l1[i] = Some(l1s[f]);
            donees_inside[i] = donees.inside[f];
            f += 1;
        }
        out.push(QuerySummary { imputed, ignore, l1, donees_inside });
    }
    let total: u64 = index.classes.iter().map(|c| c.donees).sum();
    if total != donees.seen {
        return Err(ImputeError::Internal("the imputation input changed between its two reads"));
    }
    Ok(Summary { queries: out, donees: total })
}

/// Pass 1: the class index of the rows that take part, and the number of rows.
async fn class_index(
    ctx: &SessionContext,
    ds: &Dataset,
    imp: &Imputation,
    rules: &HashMap<String, crate::domain::NotApplicable>,
    roles: &Roles<'_>,
) -> Result<(Index, u64)> {
    let mut id: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut keys: Vec<Vec<u32>> = Vec::new();
    let mut classes: Vec<Class> = Vec::new();
    let mut row = 0u64;
    let mut key = vec![0u32; imp.grouping.len()];
    read_in_order(ctx, ds, |t, c| {
        let b = read_columns(ds, &imp.columns, &imp.columns, rules, t, c)?;
        let obs: Vec<&[Option<f64>]> = b.observed.iter().map(Vec::as_slice).collect();
        let unk: Vec<&[bool]> = b.unknown.iter().map(Vec::as_slice).collect();
        for (r, role) in roles.roles(&obs, &unk, t.num_rows()).into_iter().enumerate() {
            if role != Role::None {
                roles.key(c, r, &mut key);
                let k = match id.get(key.as_slice()) {
                    Some(&k) => k as usize,
                    None => {
                        id.insert(key.clone(), classes.len() as u32);
                        keys.push(key.clone());
                        classes.push(Class { donors: 0, donees: 0, first_donor: NONE });
                        classes.len() - 1
                    }
                };
                let class = &mut classes[k];
                if role == Role::Donor {
                    class.donors += 1;
                    if class.first_donor == NONE {
                        class.first_donor = row + r as u64;
                    }
                } else {
                    class.donees += 1;
                }
            }
        }
        row += t.num_rows() as u64;
        Ok(())
    })
    .await?;
    Ok((levels(&imp.knn, id, keys, classes), row))
}

/// Each donee class's level and dmin, and the index's watcher lists (k = 1).
fn levels(cfg: &KnnConfig, id: HashMap<Vec<u32>, u32>, keys: Vec<Vec<u32>>, classes: Vec<Class>) -> Index {
    let donor_classes: Vec<usize> = (0..classes.len()).filter(|&c| classes[c].donors > 0).collect();
    // Per class with donees: (dmin, level); the distances of all pairs, on all cores.
    let found: Vec<(f64, Vec<u32>)> = (0..classes.len())
        .into_par_iter()
        .map(|c| {
            if classes[c].donees == 0 {
                return (f64::INFINITY, Vec::new());
            }
            let mut nearest = f64::INFINITY;
            let mut level = Vec::new();
            for &d in &donor_classes {
                let x = cfg.distance(&keys[c], &keys[d]);
                if x < nearest {
                    nearest = x;
                    level.clear();
                }
                if x == nearest {
                    level.push(d as u32);
                }
            }
            (nearest, level)
        })
        .collect();
    let mut watchers = vec![Vec::new(); classes.len()];
    let mut wrap = vec![None; classes.len()];
    let mut dmin = vec![f64::INFINITY; classes.len()];
    for (c, (d, level)) in found.into_iter().enumerate() {
        dmin[c] = d;
        wrap[c] = level.iter().copied().min_by_key(|&l| classes[l as usize].first_donor);
        for l in level {
            watchers[l as usize].push(c as u32);
        }
    }
    Index { id, keys, classes, dmin, watchers, wrap }
}

#[cfg(test)]
mod tests {
    //! The streamed summary equals the in-memory imputation's on random
    //! tables with both kinds of null, donor-less classes, predicates on
    //! imputed and observed columns, every kind of query, small batches (so
    //! donees wait across batches and wrap around), and both ways of bounding
    //! case (d) of L1(D).
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::impute::spec::ImputeSpec;

    const DOMAIN: &str = "columns:
  - {name: a, kind: integer, bounds: [0, 9]}
  - {name: s, kind: categorical, values: [p, q, r], nullable: true}
  - {name: y, kind: integer, bounds: [0, 100], nullable: true}
  - {name: v, kind: float, bins: {edges: [0, 10, 25, 50]}, nullable: true, not_applicable_when: \"a < 2\"}
  - {name: z, kind: integer, bounds: [0, 9], nullable: true}
";

    const SPEC: &str = "input: t.csv
domain: d.yaml
impute: [y, v]
match:
  - {column: a, kind: ordinal, group: 3}
  - {column: s}
metric: euclidean
budget: {epsilon: 4.2}
queries:
  - {name: all, count: {}}
  - {name: mid_y, count: {}, where: {y: [20, 80]}}
  - {name: v_share, proportion: {numerator: {v: [10, null]}}, where: {z: [0, 5]}}
  - {name: y_mean, mean: {value: y, lo: 0, hi: 100}, where: {a: [3, 9]}}
  - {name: v_var, variance: {value: v, lo: 0, hi: 50}, where: {y: [0, 60]}}
  - {name: z_mean, mean: {value: z, lo: 0, hi: 9}, where: {a: [0, 4]}}
";

    fn table(rng: &mut SmallRng, n: usize) -> String {
        let (py, pv, pz, ps) = (rng.random::<f64>() * 0.9, rng.random::<f64>() * 0.5, 0.2, 0.1);
        let mut s = String::from("a,s,y,v,z\n");
        for _ in 0..n {
            let a = rng.random_range(0..10u32);
            let cell = |rng: &mut SmallRng, p: f64, x: String| if rng.random::<f64>() < p { String::new() } else { x };
            let (sv, y) = (["p", "q", "r"][rng.random_range(0..3usize)].to_string(), rng.random_range(0..=100u32));
            let (v, z) = (rng.random::<f64>() * 50.0, rng.random_range(0..10u32));
            let sv = cell(rng, ps, sv);
            let y = cell(rng, py, y.to_string());
            let v = cell(rng, pv, format!("{v:.3}"));
            let z = cell(rng, pz, z.to_string());
            s += &format!("{a},{sv},{y},{v},{z}\n");
        }
        s
    }

    fn assert_same(trial: usize, got: &Summary, want: &Summary) {
        assert_eq!(got.donees, want.donees, "trial {trial}: donees");
        for (i, (g, w)) in got.queries.iter().zip(&want.queries).enumerate() {
            assert!(g.l1 == w.l1, "trial {trial} query {i}: L1_R");
            assert_eq!(g.donees_inside, w.donees_inside, "trial {trial} query {i}: |R|");
            for (x, y) in [(&g.imputed, &w.imputed), (&g.ignore, &w.ignore)] {
                // Exact: counts, and sums in integer grid units whatever the row order.
                assert!(x == y, "trial {trial} query {i}");
            }
        }
    }

    #[tokio::test]
    async fn the_streamed_summary_equals_the_in_memory_imputation() {
        let mut rng = SmallRng::seed_from_u64(19);
        for trial in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let n = rng.random_range(1..400);
            std::fs::write(dir.path().join("t.csv"), table(&mut rng, n)).unwrap();
            std::fs::write(dir.path().join("d.yaml"), DOMAIN).unwrap();
            std::fs::write(dir.path().join("spec.yaml"), SPEC).unwrap();
            let spec = ImputeSpec::load(dir.path().join("spec.yaml").to_str().unwrap()).unwrap();
            let ds = Dataset::open("t", &spec.input, None, &spec.domain).unwrap();
            let batch = [3, 17, 8192][trial % 3];
            let ctx = SessionContext::new_with_config(datafusion::prelude::SessionConfig::new().with_batch_size(batch));
            // 4 × 3 keys: enumerated exactly, or bounded by N₀ (a limit below the space size).
            for limit in [u64::MAX, 5] {
                let want = crate::impute::prepare_on(&ctx, &ds, &spec.imputation, &spec.queries).await.unwrap();
                let want = {
                    let mut w = want;
                    if let Some(s) = &mut w.search {
                        s.enumerate_limit = limit;
                    }
                    w.l1 = w.search.as_ref().map_or(w.l1, |s| s.asg.l1(&s.cfg, &s.rec, limit).unwrap());
                    w.summarize(&spec.queries).unwrap()
                };
                let got = summarize(&ctx, &ds, &spec.imputation, &spec.queries, limit).await.unwrap();
                assert_same(trial, &got, &want);
            }
        }
    }
}
