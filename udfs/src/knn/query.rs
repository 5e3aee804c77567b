//! The statistics of a kNN imputation release (issue 19, 24) as the engine
//! evaluates them: the queries (a count, a proportion, a mean, a variance
//! of a subpopulation), the numbers each releases and whether each reads an
//! imputed column, and their exact aggregates on a public fixed-point grid.
//!
//! They live here, beside the donor search, so that a cluster executor (which
//! links this crate alone) can impute and aggregate its share of the rows
//! ([`super::pass`]); `dpflow::impute` plans and noises them.

use serde::{Deserialize, Serialize};

use crate::noise::cauchy::public_grid_exponent;

/// A row filter on one column: a closed numeric range or a set of labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Predicate {
    /// Column.
    pub column: String,
    /// Lower bound (inclusive).
    pub lo: Option<f64>,
    /// Upper bound (inclusive).
    pub hi: Option<f64>,
    /// Accepted category codes.
    pub codes: Option<Vec<f64>>,
}

impl Predicate {
    /// Whether a value passes (null never does).
    pub fn matches(&self, v: Option<f64>) -> bool {
        let Some(v) = v else { return false };
        if let Some(c) = &self.codes {
            return c.contains(&v);
        }
        self.lo.is_none_or(|l| v >= l) && self.hi.is_none_or(|h| v <= h)
    }
}

/// The statistic of a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum QueryKind {
    /// Number of rows in the subpopulation.
    Count,
    /// Share of the subpopulation also matching `numerator`.
    Proportion {
        /// The numerator's filter.
        numerator: Vec<Predicate>,
    },
    /// Mean of a clamped value.
    Mean {
        /// Column.
        value: String,
        /// Public lower bound.
        lo: f64,
        /// Public upper bound.
        hi: f64,
    },
    /// Sample variance of a clamped value.
    Variance {
        /// Column.
        value: String,
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
}

impl QueryKind {
    /// The numbers a query of this kind releases, in order (the count of the
    /// subpopulation comes first: 004 Cor 5.2/5.5/5.7 divide by it).
    pub fn part_names(&self) -> &'static [&'static str] {
        match self {
            QueryKind::Count => &["count"],
            QueryKind::Proportion { .. } => &["count", "numerator count"],
            QueryKind::Mean { .. } => &["count", "mean"],
            QueryKind::Variance { .. } => &["count", "mean", "variance"],
        }
    }

    /// How many numbers a query of this kind releases.
    pub fn released_numbers(&self) -> usize {
        self.part_names().len()
    }
}

/// One query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuerySpec {
    /// Name.
    pub name: String,
    /// Statistic.
    pub kind: QueryKind,
    /// Subpopulation.
    pub predicate: Vec<Predicate>,
}

/// How one released number is noised (a public decision: from the spec and
/// the imputed columns only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartNoise {
    /// Reads an imputed column: smooth sensitivity, generalized Cauchy.
    Smooth,
    /// Reads no imputed column: global sensitivity, discrete Laplace.
    Global,
}

/// One released number of a query: the predicates that decide membership
/// and the value it reads.
pub struct Part<'a> {
    /// Conjunctions of predicates a row must pass to count (or be averaged).
    pub predicates: Vec<&'a Predicate>,
    /// The column averaged (means and variances).
    pub value: Option<&'a str>,
}

impl Part<'_> {
    /// The columns this number reads.
    pub fn reads(&self) -> impl Iterator<Item = &str> {
        self.predicates.iter().map(|p| p.column.as_str()).chain(self.value)
    }

    /// Smooth when it reads an imputed column.
    pub fn noise(&self, imputed: &[String]) -> PartNoise {
        if self.reads().any(|c| imputed.iter().any(|a| a == c)) { PartNoise::Smooth } else { PartNoise::Global }
    }
}

/// The released numbers of a query, in release order (`QueryKind::part_names`).
pub fn parts(q: &QuerySpec) -> Vec<Part<'_>> {
    let base: Vec<&Predicate> = q.predicate.iter().collect();
    match &q.kind {
        QueryKind::Count => vec![Part { predicates: base, value: None }],
        QueryKind::Proportion { numerator } => {
            let num = base.iter().copied().chain(numerator).collect();
            vec![Part { predicates: base, value: None }, Part { predicates: num, value: None }]
        }
        QueryKind::Mean { value, .. } => {
            vec![Part { predicates: base.clone(), value: None }, Part { predicates: base, value: Some(value) }]
        }
        QueryKind::Variance { value, .. } => vec![
            Part { predicates: base.clone(), value: None },
            Part { predicates: base.clone(), value: Some(value) },
            Part { predicates: base, value: Some(value) },
        ],
    }
}

/// The noise of each released number of `q` (public: spec and imputed columns).
pub fn part_noises(q: &QuerySpec, imputed: &[String]) -> Vec<PartNoise> {
    parts(q).iter().map(|p| p.noise(imputed)).collect()
}

/// The public fixed-point grid a query's values are summed on: each clamped
/// value v becomes the integer u = round((v − c)/g), kept within
/// [⌈(lo − c)/g⌉, ⌊(hi − c)/g⌋] so that c + u·g stays in [lo, hi], with
/// c = lo + (hi − lo)/2 and g = 2^k ≤ max(|lo|, |hi|, hi − lo)·2⁻³² (all
/// public). Sums of u and u² are exact in i128 whatever the row order (a
/// float running sum is not: its rounding can move it by more than one
/// row's bound on large tables, docs/PRIVACY.md), and |u| ≤ 2³³, so u²
/// summed over 2⁶⁰ rows still fits.
#[derive(Clone, Copy, PartialEq)]
pub struct ValueGrid {
    /// The middle of the public range.
    pub c: f64,
    /// The grid step g.
    pub g: f64,
    lo_units: i64,
    hi_units: i64,
}

impl ValueGrid {
    /// The grid of values clamped to the public [lo, hi] (finite, lo < hi).
    pub fn new(lo: f64, hi: f64) -> ValueGrid {
        let c = lo + (hi - lo) / 2.0;
        let g = 2f64.powi(public_grid_exponent(lo.abs().max(hi.abs()).max(hi - lo)));
        ValueGrid { c, g, lo_units: ((lo - c) / g).ceil() as i64, hi_units: ((hi - c) / g).floor() as i64 }
    }

    /// The units of a value.
    pub fn units(&self, v: f64) -> i64 {
        (((v - self.c) / self.g).round() as i64).clamp(self.lo_units, self.hi_units)
    }
}

/// Exact aggregates of one query's population, read one way (imputed, or
/// the ignore-missing baseline).
#[derive(Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Aggregates {
    /// Rows of the population.
    pub count: u64,
    /// Rows of the population that pass a proportion's numerator.
    pub numerator: u64,
    /// Rows of the population with a value (means, variances).
    pub values: u64,
    /// Σ u over those rows ([`ValueGrid`]).
    pub units: i128,
    /// Σ u².
    pub units_sq: i128,
}

impl Aggregates {
    /// Σ v over the population's values (v = c + u·g).
    pub fn sum(&self, grid: &ValueGrid) -> f64 {
        self.values as f64 * grid.c + grid.g * self.units as f64
    }

    /// Σ (v − m)² over the population's values.
    pub fn sum_sq_about(&self, m: f64, grid: &ValueGrid) -> f64 {
        let d = (m - grid.c) / grid.g;
        let s = self.units_sq as f64 - 2.0 * d * self.units as f64 + self.values as f64 * d * d;
        (s * grid.g * grid.g).max(0.0)
    }

    /// Adds one value of the population.
    pub fn add_value(&mut self, v: f64, grid: &ValueGrid) {
        let u = grid.units(v);
        self.values += 1;
        self.units += i128::from(u);
        self.units_sq += i128::from(u) * i128::from(u);
    }
}

crate::protected_debug!(Aggregates);

/// One row as a query reads it, by the positions of [`Columns`].
pub struct RowView<'a> {
    /// Values after imputation (an unknown cell holds its donor's value, or null without a donor).
    pub after: &'a [Option<f64>],
    /// Values as read (every null a null).
    pub observed: &'a [Option<f64>],
    /// Whether each cell is unknown (null, not not-applicable, in an imputed column).
    pub unknown: &'a [bool],
    /// Whether the row is a donee.
    pub donee: bool,
}

/// The columns the queries read, by position.
pub struct Columns {
    /// Column names (the positions of a [`RowView`]).
    pub names: Vec<String>,
}

impl Columns {
    /// Every column the queries and the imputation read, sorted.
    pub fn of(imputed: &[String], queries: &[QuerySpec]) -> Columns {
        let mut names: Vec<String> = imputed.to_vec();
        for q in queries {
            names.extend(q.predicate.iter().map(|p| p.column.clone()));
            match &q.kind {
                QueryKind::Mean { value, .. } | QueryKind::Variance { value, .. } => names.push(value.clone()),
                QueryKind::Proportion { numerator } => names.extend(numerator.iter().map(|p| p.column.clone())),
                QueryKind::Count => {}
            }
        }
        names.sort();
        names.dedup();
        Columns { names }
    }

    /// Position of a column.
    pub fn position(&self, name: &str) -> usize {
        self.names.iter().position(|n| n == name).expect("every column a query reads is listed")
    }
}

type Resolved<'a> = Vec<(usize, &'a Predicate)>;

/// A query with its columns resolved to positions.
pub struct CompiledQuery<'a> {
    predicate: Resolved<'a>,
    numerator: Resolved<'a>,
    /// Position and grid of a mean's or variance's value.
    value: Option<(usize, ValueGrid)>,
    /// Per released number that reads an imputed column: (its index, predicates, positions it reads).
    smooth_parts: Vec<(usize, Resolved<'a>, Vec<usize>)>,
    parts: usize,
}

impl<'a> CompiledQuery<'a> {
    /// Resolves `q` against `cols`; `imputed` decides which numbers are smooth.
    pub fn new(q: &'a QuerySpec, cols: &Columns, imputed: &[String]) -> Self {
        let resolve = |ps: &[&'a Predicate]| ps.iter().map(|p| (cols.position(&p.column), *p)).collect();
        let predicate = resolve(&q.predicate.iter().collect::<Vec<_>>());
        let (numerator, value) = match &q.kind {
            QueryKind::Proportion { numerator } => (resolve(&numerator.iter().collect::<Vec<_>>()), None),
            QueryKind::Mean { value, lo, hi } | QueryKind::Variance { value, lo, hi } => {
                (Vec::new(), Some((cols.position(value), ValueGrid::new(*lo, *hi))))
            }
            QueryKind::Count => (Vec::new(), None),
        };
        let all = parts(q);
        let smooth_parts = all
            .iter()
            .enumerate()
            .filter(|(_, p)| p.noise(imputed) == PartNoise::Smooth)
            .map(|(i, p)| {
                let reads = p.predicates.iter().map(|x| x.column.as_str()).chain(p.value).map(|c| cols.position(c));
                (i, resolve(&p.predicates), reads.collect())
            })
            .collect();
        CompiledQuery { predicate, numerator, value, smooth_parts, parts: all.len() }
    }

    /// How many numbers the query releases.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// The indices of its numbers that read an imputed column.
    pub fn smooth_parts(&self) -> impl Iterator<Item = usize> + '_ {
        self.smooth_parts.iter().map(|(i, _, _)| *i)
    }

    /// Adds one row to both readings.
    pub fn add(&self, row: &RowView<'_>, imputed: &mut Aggregates, ignore: &mut Aggregates) {
        let pass = |ps: &Resolved<'_>, vals: &[Option<f64>]| ps.iter().all(|(i, p)| p.matches(vals[*i]));
        // Imputed: predicates on the values after imputation; a mean's row has a value or an unknown cell.
        let mut pop = pass(&self.predicate, row.after);
        if let Some((v, ..)) = self.value {
            pop &= row.after[v].is_some() || row.unknown[v];
        }
        self.count(pop, row.after, imputed);
        // Ignore-missing: complete rows (no donee), observed values only.
        let mut pop = !row.donee && pass(&self.predicate, row.observed);
        if let Some((v, ..)) = self.value {
            pop &= row.observed[v].is_some();
        }
        self.count(pop, row.observed, ignore);
    }

    fn count(&self, pop: bool, vals: &[Option<f64>], acc: &mut Aggregates) {
        if !pop {
            return;
        }
        acc.count += 1;
        if !self.numerator.is_empty() && self.numerator.iter().all(|(i, p)| p.matches(vals[*i])) {
            acc.numerator += 1;
        }
        if let Some((v, grid)) = &self.value
            && let Some(x) = vals[*v]
        {
            acc.add_value(x, grid);
        }
    }

    /// Whether a donee is in R of the smooth number `k` (an index into
    /// [`Self::smooth_parts`]): an unknown cell among the columns it reads,
    /// and every *other* cell passes its predicates (relevance.rs module docs).
    pub fn relevant(&self, k: usize, row: &RowView<'_>) -> bool {
        let (_, preds, reads) = &self.smooth_parts[k];
        row.donee
            && reads.iter().any(|&i| row.unknown[i])
            && preds.iter().all(|(i, p)| row.unknown[*i] || p.matches(row.observed[*i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_on_the_grid_are_exact_and_stay_in_range() {
        let vals = [3.0, 7.5, 10.0, 0.0, 4.25, -1.0, 12.0];
        let (lo, hi) = (0.0, 10.0);
        let grid = ValueGrid::new(lo, hi);
        let mut a = Aggregates::default();
        for v in vals {
            a.add_value(v, &grid);
        }
        let clamped: Vec<f64> = vals.iter().map(|v| v.clamp(lo, hi)).collect();
        assert_eq!(a.values, 7);
        // These values are on the grid: the sums are exact.
        assert_eq!(a.sum(&grid), clamped.iter().sum::<f64>());
        for m in [0.0, 4.95, 10.0, -3.0] {
            let want: f64 = clamped.iter().map(|v| (v - m) * (v - m)).sum();
            assert!((a.sum_sq_about(m, &grid) - want).abs() < 1e-9, "m = {m}");
        }
        // Any value, rounded to the grid, stays within [lo, hi] (one row's bound holds).
        for (lo, hi) in [(0.1f64, 0.3f64), (-7.3, 1e6), (190.0, 200.0), (-50.0, -10.0)] {
            let g = ValueGrid::new(lo, hi);
            for v in [lo, hi, lo - 1.0, hi + 1.0, (lo + hi) / 2.0, lo + 1e-12, hi - 1e-12] {
                let x = g.c + g.units(v) as f64 * g.g;
                assert!(lo <= x && x <= hi, "[{lo}, {hi}]: {v} → {x}");
                assert!((x - v.clamp(lo, hi)).abs() <= g.g, "[{lo}, {hi}]: {v} → {x}");
            }
        }
        // Row order does not change an exact sum (a float running sum would).
        let mut b = Aggregates::default();
        for v in vals.iter().rev() {
            b.add_value(*v, &grid);
        }
        assert!(a == b);
    }
}
