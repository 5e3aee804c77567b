//! The measurement API: noisy marginals, charged before they are computed.
//!
//! [`measure`] charges every marginal's privacy cost to an [`Accountant`]
//! first (a refused charge returns an error and touches no data), then counts
//! all marginals in one scan with `MarginalExec`, adds exact discrete Gaussian
//! or discrete Laplace noise to every cell, and returns only the noisy counts
//! with their noise scale and charge. The exact counts never leave.
//!
//! Sensitivity (add/remove-one neighbours, NOTES §1): one person changes one
//! cell of a marginal by 1 (or no cell, in observed-only mode), so each
//! marginal has L1 and L2 sensitivity 1.

use datafusion::execution::context::SessionContext;
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::{DpRng, NoiseDistribution};
use serde::{Deserialize, Serialize};

use crate::dataset::{Dataset, DatasetError};
use crate::privacy::{BudgetError, Ledger, LedgerError, MechanismRecord, PrivacyFilter};

/// A marginal to measure.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MarginalQuery {
    /// Attribute names (first varies slowest in the cell index).
    pub attrs: Vec<String>,
    /// Null handling.
    pub mode: NullMode,
}

impl MarginalQuery {
    /// Null-as-cell marginal.
    pub fn cells(attrs: &[&str]) -> Self {
        Self { attrs: attrs.iter().map(|s| s.to_string()).collect(), mode: NullMode::Cells }
    }

    /// Observed-only marginal.
    pub fn observed(attrs: &[&str]) -> Self {
        Self { attrs: attrs.iter().map(|s| s.to_string()).collect(), mode: NullMode::Observed }
    }

    /// `a,b` or `a,b[observed]`.
    pub fn label(&self) -> String {
        let a = self.attrs.join(",");
        match self.mode {
            NullMode::Cells => a,
            NullMode::Observed => format!("{a}[observed]"),
        }
    }
}

/// A noisy marginal: what leaves the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoisyMarginal {
    /// The query.
    pub query: MarginalQuery,
    /// Cells per attribute.
    pub shape: Vec<usize>,
    /// Noisy counts (integers, possibly negative).
    pub values: Vec<f64>,
    /// Noise added to each cell.
    pub noise: NoiseDistribution,
    /// The mechanism record charged for it.
    pub record: MechanismRecord,
}

impl NoisyMarginal {
    /// The noisy total (estimate of the rows counted, e.g. observed rows).
    pub fn total(&self) -> f64 {
        self.values.iter().sum()
    }
}

/// Anything that can be charged before a mechanism runs.
pub trait Accountant {
    /// Charges all records at once, or none (refusal leaves nothing spent).
    fn charge(&mut self, records: &[MechanismRecord]) -> Result<()>;
}

/// A refused charge, or a measurement that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The in-process filter refused.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The ledger refused or failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// No marginal asked for.
    #[error("nothing to measure: give at least one marginal")]
    NothingToMeasure,
    /// Noise distributions that do not pair with the marginals.
    #[error("give one noise distribution, or one per marginal ({noises} for {marginals} marginals)")]
    NoiseCount {
        /// Distributions given.
        noises: usize,
        /// Marginals asked for.
        marginals: usize,
    },
    /// A noise scale no release may use ([`NoiseDistribution::scale_refusal`]).
    #[error("marginal ({marginal}): {why}")]
    Noise {
        /// The marginal.
        marginal: String,
        /// Why.
        why: String,
    },
    /// A marginal over a column that is not in the domain.
    #[error("{dataset}: unknown column {column:?} in marginal ({marginal}); it is not in the domain")]
    UnknownColumn {
        /// Dataset.
        dataset: String,
        /// The column.
        column: String,
        /// The marginal.
        marginal: String,
    },
    /// Reading or counting the data.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
}

type Result<T, E = MeasureError> = std::result::Result<T, E>;

/// An in-process accountant: a privacy filter plus the list of mechanisms
/// charged (the release record's mechanism list).
#[derive(Debug, Clone)]
pub struct ReleaseAccountant {
    filter: PrivacyFilter,
    records: Vec<MechanismRecord>,
}

impl ReleaseAccountant {
    /// An accountant holding `filter` (e.g. the release's reserved budget).
    pub fn new(filter: PrivacyFilter) -> Self {
        Self { filter, records: Vec::new() }
    }

    /// The filter.
    pub fn filter(&self) -> &PrivacyFilter {
        &self.filter
    }

    /// Every mechanism charged so far.
    pub fn records(&self) -> &[MechanismRecord] {
        &self.records
    }

    /// Takes the records.
    pub fn into_records(self) -> Vec<MechanismRecord> {
        self.records
    }
}

impl Accountant for ReleaseAccountant {
    fn charge(&mut self, records: &[MechanismRecord]) -> Result<()> {
        let mut trial = self.filter.clone();
        for r in records {
            trial.charge(&r.loss)?;
        }
        self.filter = trial;
        self.records.extend_from_slice(records);
        Ok(())
    }
}

/// An accountant that reserves each charge in the persistent ledger (release
/// ids `{release_id}#{k}`); commit them once outputs are durably written.
pub struct LedgerAccountant<'a> {
    ledger: &'a mut Ledger,
    dataset: String,
    release_id: String,
    charges: Vec<i64>,
}

impl<'a> LedgerAccountant<'a> {
    /// Charges go to `dataset` under release id `release_id`.
    pub fn new(ledger: &'a mut Ledger, dataset: &str, release_id: &str) -> Self {
        Self { ledger, dataset: dataset.into(), release_id: release_id.into(), charges: Vec::new() }
    }

    /// Commits every reservation made.
    pub fn commit_all(self) -> Result<(), LedgerError> {
        for id in self.charges {
            self.ledger.commit(id)?;
        }
        Ok(())
    }
}

impl Accountant for LedgerAccountant<'_> {
    fn charge(&mut self, records: &[MechanismRecord]) -> Result<()> {
        let id = format!("{}#{}", self.release_id, self.charges.len() + 1);
        let r = self.ledger.reserve(&self.dataset, &id, records, None)?;
        self.charges.push(r.charge_id);
        Ok(())
    }
}

/// The record of one marginal measured with `noise` (sensitivity 1: one
/// person changes one cell by 1, or none).
pub fn marginal_record(q: &MarginalQuery, noise: NoiseDistribution) -> MechanismRecord {
    match noise {
        NoiseDistribution::Gaussian { sigma } => {
            MechanismRecord::gaussian(format!("marginal({})", q.label()), 1.0, sigma)
        }
        NoiseDistribution::Laplace { scale } => {
            MechanismRecord::laplace(format!("marginal({})", q.label()), 1.0, scale)
        }
    }
}

/// Measures marginals with per-marginal noise (`noise[i]` for `queries[i]`, or
/// one noise for all). Charges first; computes all marginals in one scan.
pub async fn measure(
    ctx: &SessionContext,
    dataset: &Dataset,
    queries: &[MarginalQuery],
    noise: &[NoiseDistribution],
    accountant: &mut (dyn Accountant + Send),
    rng: &mut DpRng,
) -> Result<Vec<NoisyMarginal>> {
    if queries.is_empty() {
        return Err(MeasureError::NothingToMeasure);
    }
    if noise.len() != 1 && noise.len() != queries.len() {
        return Err(MeasureError::NoiseCount { noises: noise.len(), marginals: queries.len() });
    }
    let noise_of = |i: usize| if noise.len() == 1 { noise[0] } else { noise[i] };
    // Validate names before charging anything.
    for q in queries {
        for a in &q.attrs {
            if dataset.domain().column(a).is_none() {
                return Err(MeasureError::UnknownColumn {
                    dataset: dataset.name.clone(),
                    column: a.clone(),
                    marginal: q.label(),
                });
            }
        }
    }
    for (i, q) in queries.iter().enumerate() {
        if let Some(why) = noise_of(i).scale_refusal() {
            return Err(MeasureError::Noise { marginal: q.label(), why });
        }
    }
    let records: Vec<MechanismRecord> =
        queries.iter().enumerate().map(|(i, q)| marginal_record(q, noise_of(i))).collect();
    // 1. Charge before touching data.
    accountant.charge(&records)?;
    // 2. Count exactly, in one scan.
    let sets: Vec<(Vec<String>, NullMode)> = queries.iter().map(|q| (q.attrs.clone(), q.mode)).collect();
    let exact = dataset.exact_marginals(ctx, &sets).await?;
    // 3. Add exact integer noise; only noisy values leave.
    let mut out = Vec::with_capacity(queries.len());
    for (i, m) in exact.into_iter().enumerate() {
        let dist = noise_of(i);
        let sampler = dist.integer_sampler();
        let values = m.counts.iter().map(|&c| (c as i128).saturating_add(sampler.sample(rng)) as f64).collect();
        out.push(NoisyMarginal {
            query: queries[i].clone(),
            shape: m.shape,
            values,
            noise: dist,
            record: records[i].clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Int64Type;
    use dpflow_udfs::noise::testing::chi_square_test_integer;

    use super::*;
    use crate::io::session_context;
    use crate::privacy::{Budget, PrivacyLoss};

    fn adult() -> Dataset {
        Dataset::open("adult", "sample_data/adult/adult.data", None, "sample_data/adult/adult.domain.yaml").unwrap()
    }

    /// Codes of a categorical or unit-integer column from GROUP BY keys.
    fn code_of(ds: &Dataset, col: &str, key: Option<&str>) -> usize {
        let c = ds.domain().column(col).unwrap();
        match key {
            None => c.null_code().unwrap() as usize,
            Some(k) => match &c.kind {
                crate::domain::ColumnKind::Categorical { values, aliases } => {
                    let k = aliases.get(k).map(|s| s.as_str()).unwrap_or(k);
                    values.iter().position(|v| v == k).unwrap()
                }
                crate::domain::ColumnKind::Integer { edges } => (k.parse::<i64>().unwrap() - edges[0]) as usize,
                _ => unreachable!(),
            },
        }
    }

    #[tokio::test]
    async fn exact_marginals_equal_group_by_on_adult_in_both_modes() {
        let ds = adult();
        let ctx = session_context();
        ctx.register_table("adult", ds.raw(&ctx).await.unwrap().into_view()).unwrap();
        let sets: Vec<Vec<&str>> = vec![
            vec!["workclass"],
            vec!["age"],
            vec!["occupation", "sex"],
            vec!["native-country", "workclass"],
            vec!["workclass", "occupation", "income"],
            vec!["race", "education-num", "native-country"],
        ];
        for mode in [NullMode::Cells, NullMode::Observed] {
            let q: Vec<(Vec<String>, NullMode)> =
                sets.iter().map(|s| (s.iter().map(|x| x.to_string()).collect(), mode)).collect();
            let got = ds.exact_marginals(&ctx, &q).await.unwrap();
            for (s, m) in sets.iter().zip(&got) {
                // GROUP BY over trimmed text, '?' as null.
                let cols: Vec<String> = s
                    .iter()
                    .map(|c| format!("CASE WHEN trim(\"{c}\") = '?' THEN NULL ELSE trim(\"{c}\") END AS \"{c}\""))
                    .collect();
                let names: Vec<String> = s.iter().map(|c| format!("\"{c}\"")).collect();
                let sql = format!(
                    "SELECT {}, count(*) AS n FROM (SELECT {} FROM adult) GROUP BY {}",
                    names.join(", "),
                    cols.join(", "),
                    names.join(", ")
                );
                let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
                let mut expect: HashMap<usize, u64> = HashMap::new();
                let mut observed = 0;
                for b in &batches {
                    let n = b.column(s.len()).as_primitive::<Int64Type>();
                    'row: for r in 0..b.num_rows() {
                        let mut idx = 0;
                        for (k, c) in s.iter().enumerate() {
                            let a = datafusion::arrow::compute::cast(
                                b.column(k),
                                &datafusion::arrow::datatypes::DataType::Utf8,
                            )
                            .unwrap();
                            let a = a.as_string::<i32>();
                            let key = a.is_valid(r).then(|| a.value(r));
                            if mode == NullMode::Observed && key.is_none() {
                                continue 'row;
                            }
                            idx = idx * m.shape[k] + code_of(&ds, c, key);
                        }
                        *expect.entry(idx).or_default() += n.value(r) as u64;
                        observed += n.value(r) as u64;
                    }
                }
                for (i, &c) in m.counts.iter().enumerate() {
                    assert_eq!(c, expect.get(&i).copied().unwrap_or(0), "{s:?} {mode:?} cell {i}");
                }
                assert_eq!(m.observed, observed, "{s:?} {mode:?}");
            }
        }
    }

    #[tokio::test]
    async fn noise_matches_the_charged_scale() {
        let ds = adult();
        let ctx = session_context();
        let mut acct = ReleaseAccountant::new(PrivacyFilter::new(Budget::Zcdp { rho: 1.0 }));
        let mut rng = DpRng::unsafe_seeded(7);
        let sigma = 3.0;
        let q = [MarginalQuery::cells(&["age", "occupation", "sex"])];
        let noisy =
            measure(&ctx, &ds, &q, &[NoiseDistribution::Gaussian { sigma }], &mut acct, &mut rng).await.unwrap();
        let exact = ds.exact_marginals(&ctx, &[(q[0].attrs.clone(), NullMode::Cells)]).await.unwrap();
        // The charge is exactly ρ = 1/(2σ²) for sensitivity 1.
        match &acct.records()[0].loss {
            PrivacyLoss::Zcdp { rho } => assert!((rho - 1.0 / (2.0 * sigma * sigma)).abs() < 1e-12),
            other => panic!("{other:?}"),
        }
        assert!((acct.filter().spent_amount() - 1.0 / 18.0).abs() < 1e-12);
        // Residuals are discrete Gaussian with σ² = 9: chi-square goodness of fit.
        let resid: Vec<i64> =
            noisy[0].values.iter().zip(&exact[0].counts).map(|(y, &c)| *y as i64 - c as i64).collect();
        assert_eq!(resid.len(), 74 * 15 * 2);
        let norm: f64 = (-200..=200).map(|y: i64| (-(y * y) as f64 / 18.0).exp()).sum();
        chi_square_test_integer(&resid, |y| (-(y * y) as f64 / 18.0).exp() / norm, 1e-4);
    }

    #[tokio::test]
    async fn charge_precedes_data_and_refusal_returns_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::create(dir.path().join("l.sqlite")).unwrap();
        ledger.add_dataset("adult", "row", Budget::Zcdp { rho: 0.01 }).unwrap();
        let ctx = session_context();
        let mut rng = DpRng::unsafe_seeded(1);
        // A dataset whose file does not exist: if the charge were made after
        // reading, we would see an I/O error instead of the budget refusal.
        let mut missing = adult();
        missing.location = dir.path().join("no-such-file.csv").display().to_string();
        let q = [MarginalQuery::cells(&["sex"])];
        let big = [NoiseDistribution::Gaussian { sigma: 1.0 }]; // ρ = 0.5 > 0.01
        let mut acct = LedgerAccountant::new(&mut ledger, "adult", "r1");
        let err = measure(&ctx, &missing, &q, &big, &mut acct, &mut rng).await.unwrap_err();
        assert!(format!("{err:#}").contains("budget exceeded"), "{err:#}");
        assert!(ledger.history(None).unwrap().is_empty(), "a refused charge records nothing");
        // A charge that fits is reserved before the (failing) read.
        let small = [NoiseDistribution::Gaussian { sigma: 10.0 }]; // ρ = 0.005
        let mut acct = LedgerAccountant::new(&mut ledger, "adult", "r2");
        let err = measure(&ctx, &missing, &q, &small, &mut acct, &mut rng).await.unwrap_err();
        assert!(!format!("{err:#}").contains("budget"), "{err:#}");
        let h = ledger.history(None).unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].status, crate::privacy::ChargeStatus::Reserved);
        // And on real data, results come back only with the reservation in place.
        let ds = adult();
        let mut acct = LedgerAccountant::new(&mut ledger, "adult", "r3");
        let out =
            measure(&ctx, &ds, &q, &[NoiseDistribution::Gaussian { sigma: 100.0 }], &mut acct, &mut rng).await.unwrap();
        acct.commit_all().unwrap();
        assert_eq!(out[0].values.len(), 2);
        assert!((out[0].total() - 32_561.0).abs() < 1000.0);
        assert_eq!(ledger.history(None).unwrap().len(), 2);
    }
}
