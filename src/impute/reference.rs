//! The in-memory kNN imputation: every column of the table held as
//! vectors, donors assigned by `dpflow_udfs::knn::Assignment`, L1_R(D) from
//! the rows. It is the reference the streaming pass ([`super::stream`]) is
//! tested against, and what the 004 experiments in `dpflow-bench` impute
//! with; no release path uses it.
#![cfg_attr(not(test), allow(dead_code))] // built for dpflow-bench, which uses part of it

use std::collections::HashMap;

use datafusion::execution::context::SessionContext;
use dpflow_udfs::knn::{Assignment, KnnConfig, KnnRecords, L1Report};

use super::relevance::parts;
use super::spec::{self, QuerySpec};
use super::summary::{Aggregates, Columns, CompiledQuery, QuerySummary, RowView, Summary};
use super::{ENUMERATE_LIMIT, Result, batch_values, read_in_order};
use crate::dataset::Dataset;

/// Reads the columns `needed` of a dataset as numbers (categorical → code).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) async fn load_columns(
    ctx: &SessionContext,
    ds: &Dataset,
    needed: &[String],
    as_codes: &[String],
) -> Result<HashMap<String, Vec<Option<f64>>>> {
    Ok(load_columns_with_na(ctx, ds, needed, as_codes).await?.0)
}

/// Column values (as [`load_columns`]) and, for each needed column with a
/// `not_applicable_when` rule, which rows hold a not-applicable null.
pub(crate) async fn load_columns_with_na(
    ctx: &SessionContext,
    ds: &Dataset,
    needed: &[String],
    as_codes: &[String],
) -> Result<(HashMap<String, Vec<Option<f64>>>, HashMap<String, Vec<bool>>)> {
    let domain = ds.domain();
    let mut out: HashMap<String, Vec<Option<f64>>> = needed.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut rules = Vec::new();
    for name in needed {
        if let Some(rule) = crate::domain::NotApplicable::compile(domain, name)? {
            rules.push((name.clone(), rule));
        }
    }
    let mut na: HashMap<String, Vec<bool>> = rules.iter().map(|(n, _)| (n.clone(), Vec::new())).collect();
    read_in_order(ctx, ds, |t, c| {
        for (name, rule) in &rules {
            na.get_mut(name).expect("inserted").extend(rule.mask(t)?);
        }
        for name in needed {
            let v = batch_values(domain, name, t, c, as_codes.contains(name))?;
            out.get_mut(name).expect("inserted").extend(v);
        }
        Ok(())
    })
    .await?;
    Ok((out, na))
}

/// The imputed data held in memory: never released (only the DP answers of
/// [`super::answer`] leave; its `Debug` prints no values).
#[derive(Clone)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Imputed {
    /// Column name → values (numbers, or category codes) after imputation.
    pub columns: HashMap<String, Vec<Option<f64>>>,
    /// Column name → values before imputation (for the ignore-missing baseline).
    pub observed: HashMap<String, Vec<Option<f64>>>,
    /// Which rows were imputed (donees: an unknown cell in an imputed column).
    pub imputed: Vec<bool>,
    /// The imputed columns.
    pub imputed_columns: Vec<String>,
    /// Imputed column → rows whose cell is unknown (imputed).
    pub missing: HashMap<String, Vec<bool>>,
    /// The donor search, for the per-statistic L1_R(D) (None when no row takes part).
    pub(crate) search: Option<Search>,
    /// L1(D) of the whole table (every donee).
    pub l1: L1Report,
    /// Rows.
    pub n: usize,
}

/// The donor search over the rows that take part in it (donors and donees).
#[derive(Clone)]
pub(crate) struct Search {
    pub cfg: KnnConfig,
    pub rec: KnnRecords,
    pub asg: Assignment,
    pub enumerate_limit: u64,
    /// Record → row.
    pub rows: Vec<usize>,
}

dpflow_udfs::protected_debug!(Imputed, Search);

/// The donor search and L1(D) of one imputation, each phase timed (for benchmarks).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))] // timings read by dpflow-bench
pub(crate) struct DonorSearch {
    /// Records (rows complete on `a` are donors).
    pub rec: KnnRecords,
    /// Donors of every donee.
    pub asg: Assignment,
    /// L1(D).
    pub l1: L1Report,
    /// Seconds spent in the donor search.
    pub seconds_search: f64,
    /// Seconds spent computing L1(D).
    pub seconds_l1: f64,
}

/// Donor search and L1(D) over the rows that take part: donors (every
/// imputed column observed) and donees (an unknown cell in an imputed
/// column); rows whose imputed cells are only observed or not applicable
/// take no part. Here every null is unknown (benchmarks); imputation with
/// not-applicable nulls goes through [`impute_columns_na`].
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))] // benchmarks only (dpflow-bench)
pub(crate) fn donor_search(
    columns: &HashMap<String, Vec<Option<f64>>>,
    a: &[String],
    match_codes: Vec<Vec<u32>>,
    cfg: &KnnConfig,
    enumerate_limit: u64,
) -> Result<DonorSearch> {
    let missing = unknown_cells(columns, &HashMap::new(), a);
    donor_search_on(columns, &missing, a, match_codes, cfg, enumerate_limit).map(|(d, _)| d)
}

/// Imputed column → rows whose cell is unknown: null, and not marked in
/// `not_applicable`.
fn unknown_cells(
    columns: &HashMap<String, Vec<Option<f64>>>,
    not_applicable: &HashMap<String, Vec<bool>>,
    a: &[String],
) -> HashMap<String, Vec<bool>> {
    a.iter()
        .map(|x| {
            let na = not_applicable.get(x);
            let unknown = columns[x].iter().enumerate().map(|(r, v)| v.is_none() && !na.is_some_and(|m| m[r]));
            (x.clone(), unknown.collect())
        })
        .collect()
}

/// [`donor_search`] given the unknown cells of each imputed column; also
/// returns record → row.
fn donor_search_on(
    columns: &HashMap<String, Vec<Option<f64>>>,
    missing: &HashMap<String, Vec<bool>>,
    a: &[String],
    match_codes: Vec<Vec<u32>>,
    cfg: &KnnConfig,
    enumerate_limit: u64,
) -> Result<(DonorSearch, Vec<usize>)> {
    let n = match_codes.len();
    let complete: Vec<bool> = (0..n).map(|r| a.iter().all(|x| columns[x][r].is_some())).collect();
    let takes_part: Vec<bool> = (0..n).map(|r| complete[r] || a.iter().any(|x| missing[x][r])).collect();
    let rows: Vec<usize> = (0..n).filter(|&r| takes_part[r]).collect();
    // Identifiers are row numbers: unique, and the cyclic tie-break is by position in the file.
    let rec = KnnRecords {
        keys: match_codes.into_iter().zip(&takes_part).filter_map(|(k, &t)| t.then_some(k)).collect(),
        rid: rows.iter().map(|&r| r as f64).collect(),
        complete: rows.iter().map(|&r| complete[r]).collect(),
    };
    let t = std::time::Instant::now();
    let asg = Assignment::build(cfg, &rec);
    let seconds_search = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let l1 = asg.l1(cfg, &rec, enumerate_limit)?;
    Ok((DonorSearch { rec, asg, l1, seconds_search, seconds_l1: t.elapsed().as_secs_f64() }, rows))
}

/// Imputes `a` in `columns` with kNN on the matching attributes (class codes
/// from `match_codes`), k = 1 copy by default; returns the imputed data and L1(D).
/// Every null is unknown (see [`impute_columns_na`]).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))] // benchmarks and tests
pub(crate) fn impute_columns(
    columns: HashMap<String, Vec<Option<f64>>>,
    a: &[String],
    match_codes: Vec<Vec<u32>>,
    cfg: &KnnConfig,
    enumerate_limit: u64,
) -> Result<Imputed> {
    impute_columns_na(columns, HashMap::new(), a, match_codes, cfg, enumerate_limit)
}

/// Imputes the unknown cells of `a` (nulls not marked in `not_applicable`)
/// from each donee's donor; observed and not-applicable cells are kept.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) fn impute_columns_na(
    columns: HashMap<String, Vec<Option<f64>>>,
    not_applicable: HashMap<String, Vec<bool>>,
    a: &[String],
    match_codes: Vec<Vec<u32>>,
    cfg: &KnnConfig,
    enumerate_limit: u64,
) -> Result<Imputed> {
    let n = match_codes.len();
    let missing = unknown_cells(&columns, &not_applicable, a);
    let (DonorSearch { rec, asg, l1, .. }, rows) =
        donor_search_on(&columns, &missing, a, match_codes, cfg, enumerate_limit)?;
    let observed = columns.clone();
    let mut cols = columns;
    let mut imputed = vec![false; n];
    for (i, &r) in rows.iter().enumerate() {
        if rec.complete[i] {
            continue;
        }
        imputed[r] = true;
        for x in a {
            if !missing[x][r] {
                continue;
            }
            // Mean of the donors' values (the value itself for k = 1); no donor stays null.
            let src = &observed[x];
            let (sum, k) =
                asg.donors[i].iter().filter_map(|&d| src[rows[d]]).fold((0.0, 0usize), |(s, k), v| (s + v, k + 1));
            cols.get_mut(x).expect("present")[r] = (k > 0).then(|| sum / k as f64);
        }
    }
    let search = Some(Search { cfg: cfg.clone(), rec, asg, enumerate_limit, rows });
    Ok(Imputed { columns: cols, observed, imputed, imputed_columns: a.to_vec(), missing, search, l1, n })
}

/// Loads and imputes the data of a spec in memory (the reference of the
/// streaming pass; tests and benchmarks).
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
pub(crate) async fn prepare(ctx: &SessionContext, spec: &spec::ImputeSpec) -> Result<Imputed> {
    let ds = Dataset::open("impute", &spec.input, None, &spec.domain)?;
    prepare_on(ctx, &ds, &spec.imputation, &spec.queries).await
}

/// Loads the columns `queries` read from an opened dataset and imputes them.
pub(crate) async fn prepare_on(
    ctx: &SessionContext,
    ds: &Dataset,
    imp: &spec::Imputation,
    queries: &[QuerySpec],
) -> Result<Imputed> {
    let needed = Columns::of(&imp.columns, queries).names;
    let match_cols: Vec<String> = imp.grouping.iter().map(|(c, _)| c.clone()).collect();
    let (mut cols, na) = load_columns_with_na(ctx, ds, &needed, &[]).await?;
    let codes = load_columns(ctx, ds, &match_cols, &match_cols).await?;
    let n = cols.values().next().map_or(0, |v| v.len());
    let match_codes: Vec<Vec<u32>> =
        (0..n).map(|r| imp.grouping.iter().map(|(c, g)| (codes[c][r].unwrap_or(0.0) as u32) / g).collect()).collect();
    cols.retain(|k, _| needed.contains(k));
    impute_columns_na(cols, na, &imp.columns, match_codes, &imp.knn, ENUMERATE_LIMIT)
}

impl Imputed {
    /// The summary of `queries` on the imputed data held in memory (the
    /// reference for the streaming pass, and what benchmarks answer from).
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn summarize(&self, queries: &[QuerySpec]) -> Result<Summary> {
        let cols = Columns::of(&self.imputed_columns, queries);
        let compiled: Vec<CompiledQuery<'_>> =
            queries.iter().map(|q| CompiledQuery::new(q, &cols, &self.imputed_columns)).collect();
        let mut aggs = vec![(Aggregates::default(), Aggregates::default()); queries.len()];
        let k = cols.names.len();
        let (mut after, mut observed, mut unknown) = (vec![None; k], vec![None; k], vec![false; k]);
        for r in 0..self.n {
            for (i, name) in cols.names.iter().enumerate() {
                after[i] = self.columns[name][r];
                observed[i] = self.observed[name][r];
                unknown[i] = self.missing.get(name).is_some_and(|m| m[r]);
            }
            let row = RowView { after: &after, observed: &observed, unknown: &unknown, donee: self.imputed[r] };
            for (q, (imp, ign)) in compiled.iter().zip(aggs.iter_mut()) {
                q.add(&row, imp, ign);
            }
        }
        let mut out = Vec::with_capacity(queries.len());
        for (q, (imputed, ignore)) in queries.iter().zip(aggs) {
            let mut l1 = Vec::new();
            let mut donees_inside = Vec::new();
            for p in parts(q) {
                l1.push(self.l1_of(&p)?);
                donees_inside.push(self.donees_in(&p) as u64);
            }
            out.push(QuerySummary { imputed, ignore, l1, donees_inside });
        }
        Ok(Summary { queries: out, donees: self.imputed.iter().filter(|x| **x).count() as u64 })
    }
}
