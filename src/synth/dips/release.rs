//! `dpflow synth --mechanism laplace-sanitizer | perturbed-histogram |
//! smoothed-histogram | multinomial-dirichlet | binomial-beta | modips |
//! sequential-regression`: the 002 cell synthesizers ([`super::cells`])
//! and the sequential regression synthesizer in its table form
//! ([`super::sequential::sequential_table`]) on a dataset, end to end.
//!
//! The table is the full cross-tabulation of the domain's columns (nulls
//! are cells of their own under `--missing reproduce`; `complete-row`
//! drops rows with a null first), counted in one scan. Numeric columns are
//! binned by the domain's public edges, so `perturbed-histogram` and
//! `smoothed-histogram` are the histograms of 002 §3.1.2 with the
//! domain's bins, multivariate when several columns are numeric. The
//! number of bins is the domain's (a public input); 002 chose it with
//! Scott's rule on the private data, which DP does not allow for free.
//!
//! The budget is pure ε (a ρ budget gives ε = √(2ρ), since ε-DP implies
//! ε²/2-zCDP), m sets get ε/m each, and the whole charge is reserved in
//! the ledger before the data is read. Each set's synthetic counts are the
//! release; its rows are those counts exactly, in a uniformly random
//! order (post-processing), with numeric values decoded in their bins.

use std::sync::Arc;
use std::time::Instant;

use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use dpflow_udfs::domain::{DecodeMode, decode_columns, decoded_schema};
use dpflow_udfs::marginal::NullMode;
use dpflow_udfs::noise::DpRng;

use super::DipsError;
use super::cells::{CellMechanism, CellOptions, check, multinomial, synthesize};
use super::exact::{Fenwick, uniform_below_u128};
use super::sequential::{SequentialSpec, sequential_table};
use crate::dataset::CodeSource;
use crate::domain::Domain;
use crate::measure::ReleaseAccountant;
use crate::missing::Strategy;
use crate::privacy::{PrivacyFilter, Share};
use crate::synth::run::{
    SET_COLUMN, SynthRecord, SynthRequest, TimingRecord, begin_release, budget_check, exact_answers_from, save_record,
    write_streams,
};
use crate::synth::{FitMetadata, Result, SynthError};

/// A synthesizer over the full cross-tabulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TableMechanism {
    /// One of the 002 cell synthesizers.
    Cells(CellMechanism),
    /// The sequential regression synthesizer (002 §3.2.3), each column a
    /// multinomial logistic regression on the one-hot columns before it.
    SequentialRegression,
}

impl TableMechanism {
    /// Name in records.
    pub fn name(&self) -> &'static str {
        match self {
            TableMechanism::Cells(c) => c.name(),
            TableMechanism::SequentialRegression => "sequential-regression",
        }
    }

    /// Whether each set comes from its own noisy release and posterior draw.
    pub fn noise_aware(&self) -> bool {
        match self {
            TableMechanism::Cells(c) => c.noise_aware(),
            TableMechanism::SequentialRegression => true,
        }
    }
}

/// The public checks of a sequential-regression run on the table
/// `domain` (cells caps, the spec's own checks, `--model-out`), also made
/// by the pipeline spec check. Returns the number of cells.
pub fn check_public_sequential(
    domain: &Domain,
    epsilon: f64,
    sets: usize,
    rows: u64,
    ridge: f64,
    model_out: bool,
) -> Result<usize, DipsError> {
    let cells = check_public(
        CellMechanism::LaplaceSanitizer,
        domain,
        epsilon,
        &CellOptions { sets, ..Default::default() },
        false,
    )?;
    sequential_spec(domain, sets, rows, ridge).check(epsilon)?;
    if model_out {
        return Err(DipsError::ModelOut("sequential-regression"));
    }
    Ok(cells)
}

fn sequential_spec(domain: &Domain, sets: usize, rows: u64, ridge: f64) -> SequentialSpec {
    let names: Vec<String> = domain.names().iter().map(|n| n.to_string()).collect();
    SequentialSpec::categorical(&names, &domain.cardinalities(), sets, rows, ridge)
}

/// Largest table (cells of the full cross-tabulation) a run accepts.
pub const MAX_CELLS: usize = 1 << 24;

/// Rows per generated batch.
pub(crate) const BATCH: usize = 1 << 16;

/// The table's domain and how it is read under `missing`.
fn table_view(req: &SynthRequest) -> Result<(Domain, NullMode, CodeSource)> {
    let domain = table_domain(req.dataset.domain(), req.missing)?;
    Ok(match req.missing {
        Strategy::CompleteRow => (domain, NullMode::Observed, CodeSource::CompleteRows),
        _ => (domain, NullMode::Cells, CodeSource::Plain),
    })
}

/// Largest cells × sets a run accepts: every set's table is held at once
/// (about 32 bytes a cell), so this keeps a run under about 4 GiB.
pub const MAX_CELLS_TIMES_SETS: usize = 1 << 27;

/// The public checks of a cell synthesizer run on the table `domain`, also
/// made by the pipeline spec check: the table's size (cells, and cells × m),
/// the mechanism's own checks ([`check`]) and `--model-out`. Returns the
/// number of cells.
pub fn check_public(
    mechanism: CellMechanism,
    domain: &Domain,
    epsilon: f64,
    options: &CellOptions,
    model_out: bool,
) -> Result<usize, DipsError> {
    let sizes = domain.cardinalities();
    let cells = sizes.iter().try_fold(1usize, |a, &s| a.checked_mul(s)).filter(|&c| c <= MAX_CELLS);
    let Some(cells) = cells else {
        let shown = sizes.iter().map(|&s| s as f64).product::<f64>();
        return Err(DipsError::TooManyCells { cells: shown, max: MAX_CELLS });
    };
    if cells.saturating_mul(options.sets) > MAX_CELLS_TIMES_SETS {
        return Err(DipsError::TooManyCellSets { cells, sets: options.sets, max: MAX_CELLS_TIMES_SETS });
    }
    check(mechanism, cells, epsilon, options)?;
    if model_out {
        return Err(DipsError::ModelOut(mechanism.name()));
    }
    Ok(cells)
}

/// The table's domain under a missing-data strategy (public).
pub fn table_domain(domain: &Domain, missing: Strategy) -> Result<Domain, DipsError> {
    match missing {
        Strategy::Reproduce => Ok(domain.clone()),
        Strategy::CompleteRow => Ok(domain.without_nulls()),
        other => Err(DipsError::Missing(other.to_string())),
    }
}

/// Runs `mechanism` for `req` (the caller has checked the budget and `--multiple`).
pub(crate) async fn run(
    ctx: &SessionContext,
    req: &SynthRequest,
    mechanism: TableMechanism,
    progress: &dyn Fn(&str),
) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    let epsilon = crate::synth::run::pure_epsilon(&req.budget);
    // Every public input is checked before anything is charged or read.
    let (domain, mode, source) = table_view(req)?;
    let na_rules = crate::synth::structure::rules(&domain)?;
    let sizes = domain.cardinalities();
    let options = CellOptions {
        sets: req.options.multiple,
        rows: req.rows.unwrap_or(0),
        prior: req.options.dips.prior,
        generate: req.options.dips.generate,
    };
    let ridge = req.options.dips.ridge;
    let cells = match mechanism {
        TableMechanism::Cells(c) => check_public(c, &domain, epsilon, &options, req.model_out.is_some())?,
        TableMechanism::SequentialRegression => {
            check_public_sequential(&domain, epsilon, options.sets, options.rows, ridge, req.model_out.is_some())?
        }
    };
    let (mut rng, ledger_state) = begin_release(req, mechanism.name(), Share::Epsilon(epsilon), progress)?;

    // Protected data is read from here on: a failure is charged and
    // reported without its cause (docs/PRIVACY.md §1).
    let released = async {
        let t0 = Instant::now();
        let all: Vec<usize> = (0..sizes.len()).collect();
        let (answers, _) = exact_answers_from(ctx, &req.dataset, std::slice::from_ref(&all), mode, &source).await?;
        let exact: Vec<u64> = answers.get(&all)?.iter().map(|&c| c as u64).collect();
        drop(answers);
        let t_answers = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(Share::Epsilon(epsilon).as_budget()));
        let target = domain.names().join(",");
        let sets: Vec<Vec<u64>> = match mechanism {
            TableMechanism::Cells(c) => {
                synthesize(c, &exact, &target, epsilon, &options, &mut accountant, &mut rng)?.sets
            }
            TableMechanism::SequentialRegression => {
                let spec = sequential_spec(&domain, options.sets, options.rows, ridge);
                let joints = sequential_table(&exact, &spec, epsilon, &mut accountant, &mut rng)?;
                // Post-processing: r rows from each set's joint distribution.
                joints.iter().map(|p| multinomial(&mut rng, p, options.rows)).collect()
            }
        };
        drop(exact);
        let t_fit = t1.elapsed().as_secs_f64();
        // Post-processing from here on: the counts are the release.
        let t2 = Instant::now();
        let streams = sets
            .into_iter()
            .map(|counts| {
                let set_rng = DpRng::new(req.unsafe_seed.map(|_| rand::Rng::next_u64(&mut rng)))?;
                let stream = count_stream(domain.clone(), sizes.clone(), counts, req.decode, set_rng);
                Ok(crate::synth::structure::enforce_stream(na_rules.clone(), stream))
            })
            .collect::<Result<Vec<_>>>()?;
        let m = streams.len() as u64;
        let written = write_streams(ctx, streams, &req.out).await? / m;
        let seconds = TimingRecord { answers: t_answers, fit: t_fit, generate: t2.elapsed().as_secs_f64() };
        Ok::<_, SynthError>((accountant, written, seconds))
    }
    .await;
    let (accountant, written, seconds) = settle(ledger_state.as_ref(), released)?;
    let m = req.options.multiple;
    let mut notes = vec![format!(
        "{}: the full cross-tabulation of {} columns ({cells} cells), ε = {epsilon} over {m} set(s) (ε/m each), \
         add/remove-one neighbours",
        mechanism.name(),
        sizes.len()
    )];
    if mechanism == TableMechanism::SequentialRegression {
        notes.push(format!(
            "sequential-regression: one multinomial logistic regression per column on the one-hot columns before it, \
             in the domain's order, ε/(m·{}) each, output perturbation with ridge Λ = {ridge}",
            sizes.len()
        ));
    }
    if !mechanism.noise_aware() && m > 1 {
        notes.push(format!("{}: every set is drawn with its own ε/m; 002 releases one set", mechanism.name()));
    }
    let done = Released { accountant, written, seconds, notes };
    record(ctx, req, ledger_state, mechanism.name(), mechanism.noise_aware(), epsilon, done).await
}

/// What a 002 run produced, for its record.
pub(crate) struct Released {
    /// The run's charges.
    pub accountant: ReleaseAccountant,
    /// Rows written per set.
    pub written: u64,
    /// Timings.
    pub seconds: TimingRecord,
    /// Notes for the record.
    pub notes: Vec<String>,
}

/// A 002 run's outcome after the protected read: a failure is charged
/// (the ledger's `failed`) and reported without its cause.
pub(crate) fn settle<T>(ledger_state: Option<&(crate::privacy::Ledger, i64)>, released: Result<T>) -> Result<T> {
    released.map_err(|e| crate::privacy::charge_failure("synthesis run", ledger_state.map(|(l, id)| (l, *id)), e))
}

/// Commits the ledger charge and writes the release record of a 002 run
/// of `name` at pure ε.
pub(crate) async fn record(
    ctx: &SessionContext,
    req: &SynthRequest,
    ledger_state: Option<(crate::privacy::Ledger, i64)>,
    name: &str,
    noise_aware: bool,
    epsilon: f64,
    done: Released,
) -> Result<SynthRecord> {
    let ledger_charge = crate::synth::run::commit_release(ledger_state)?;
    let m = req.options.multiple;
    let spent = done.accountant.filter().spent_amount();
    let record = SynthRecord {
        dpflow_version: env!("CARGO_PKG_VERSION").into(),
        mechanism: name.into(),
        dataset: req.dataset.name.clone(),
        budget: req.budget,
        rho: Some(epsilon * epsilon / 2.0),
        rho_spent: Some(spent * spent / 2.0),
        epsilon: Some(epsilon),
        epsilon_spent: Some(spent),
        missing: req.missing.to_string(),
        amplification: None,
        amplification_note: req
            .amplification
            .as_ref()
            .map(|_| format!("{name}: MCAR amplification is not computed for this mechanism")),
        workload: req.workload.clone(),
        rows: done.written,
        mechanisms: done.accountant.into_records(),
        fit: FitMetadata { notes: done.notes, ..Default::default() },
        outputs: vec![req.out.clone()],
        seconds: done.seconds,
        unsafe_seed: req.unsafe_seed,
        ledger_charge,
        multiple: (m > 1).then_some(m),
        noise_aware: (m > 1).then_some(noise_aware),
        set_column: (m > 1).then(|| SET_COLUMN.to_string()),
        napsu: None,
    };
    save_record(ctx, req, &record).await?;
    Ok(record)
}

/// The rows of one set: exactly `counts[k]` rows in cell k (row-major over
/// `sizes`, the last column fastest), in a uniformly random order (draws
/// without replacement), decoded through `domain`, in batches.
pub(crate) fn count_stream(
    domain: Domain,
    sizes: Vec<usize>,
    counts: Vec<u64>,
    decode: DecodeMode,
    mut rng: DpRng,
) -> SendableRecordBatchStream {
    let schema = decoded_schema(&domain);
    let mut cells = CellShuffle::new(&counts);
    let batches = std::iter::from_fn(move || {
        let batch = cells.next_batch(&mut rng)?;
        let codes = split_cells(&batch, &sizes);
        let refs: Vec<&[u32]> = codes.iter().map(|c| c.as_slice()).collect();
        Some(
            decode_columns(&domain, &refs, decode, &mut rng)
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e))),
        )
    });
    Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), futures::stream::iter(batches)))
}

/// Cell indices of rows drawn without replacement from cell counts: every
/// order of the rows equally likely, in batches.
pub(crate) struct CellShuffle {
    tree: Fenwick,
    left: u128,
}

impl CellShuffle {
    /// The rows of `counts` (counts[k] rows in cell k).
    pub(crate) fn new(counts: &[u64]) -> Self {
        let left = counts.iter().map(|&c| c as u128).sum();
        Self { tree: Fenwick::new(&counts.iter().map(|&c| c as u128).collect::<Vec<_>>()), left }
    }

    /// The cells of the next batch of at most [`BATCH`] rows; `None` when
    /// every row has been drawn.
    pub(crate) fn next_batch(&mut self, rng: &mut DpRng) -> Option<Vec<usize>> {
        if self.left == 0 {
            return None;
        }
        let rows = (self.left.min(BATCH as u128)) as usize;
        let mut out = Vec::with_capacity(rows);
        for _ in 0..rows {
            let k = self.tree.find(uniform_below_u128(rng, self.left));
            self.tree.sub(k, 1);
            self.left -= 1;
            out.push(k);
        }
        Some(out)
    }
}

/// Each column's codes of row-major cell indices over `sizes` (the last
/// column fastest).
pub(crate) fn split_cells(cells: &[usize], sizes: &[usize]) -> Vec<Vec<u32>> {
    let mut codes: Vec<Vec<u32>> = vec![Vec::with_capacity(cells.len()); sizes.len()];
    for &cell in cells {
        let mut k = cell;
        for (d, &s) in sizes.iter().enumerate().rev() {
            codes[d].push((k % s) as u32);
            k /= s;
        }
    }
    codes
}

/// A 002 cell synthesizer behind the [`crate::synth::Synthesizer`]
/// interface: one set (m = 1) as a model with one clique over every column.
/// The Laplace sanitizer's and perturbed histogram's table is the sanitized
/// counts themselves (sampling rows from them is the model's job, not the
/// fit's); MODIPS's is its posterior-predictive set. Only the noise-based
/// mechanisms run this way; the sampling ones need the public number of
/// rows, which `dpflow synth --rows` gives.
#[derive(Debug, Clone, Copy)]
pub struct CellSynth(pub CellMechanism);

impl crate::synth::Synthesizer for CellSynth {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn required_marginals(&self, domain: &Domain, _workload: &crate::synth::Workload) -> Vec<Vec<usize>> {
        every_column(domain)
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut crate::synth::FitContext<'_>) -> Result<crate::synth::Fitted> {
        let (all, exact) = full_table(ctx)?;
        let options = CellOptions { sets: 1, rows: 0, ..Default::default() };
        let target = ctx.names(&all).join(",");
        let release = synthesize(self.0, &exact, &target, ctx.epsilon, &options, ctx.accountant, ctx.rng)?;
        let table: Vec<f64> = match (self.0, release.sanitized.first()) {
            (CellMechanism::Modips, _) | (_, None) => release.sets[0].iter().map(|&c| c as f64).collect(),
            (_, Some(sanitized)) => sanitized.clone(),
        };
        let total: f64 = table.iter().sum();
        Ok(one_clique(&ctx.sizes, &table, total))
    }

    fn pure_dp(&self) -> bool {
        true
    }
}

/// The one attribute set the table synthesizers read: every column.
fn every_column(domain: &Domain) -> Vec<Vec<usize>> {
    vec![(0..domain.columns().len()).collect()]
}

/// Every column's ids and the exact full table (protected).
fn full_table(ctx: &crate::synth::FitContext<'_>) -> Result<(Vec<usize>, Vec<u64>)> {
    let all: Vec<usize> = (0..ctx.sizes.len()).collect();
    let exact = ctx.answers.get(&all)?.iter().map(|&c| c as u64).collect();
    Ok((all, exact))
}

/// A model with one clique over every column holding `table` (weights ∝
/// probabilities; DP output) and `total` rows; uniform when the total is 0.
fn one_clique(sizes: &[usize], table: &[f64], total: f64) -> crate::synth::Fitted {
    let all: Vec<usize> = (0..sizes.len()).collect();
    let mut model = crate::pgm::GraphicalModel::uniform(sizes, std::slice::from_ref(&all), total);
    if total > 0.0 {
        // ln 0 as a finite floor: exp underflows to exactly 0 in belief propagation.
        model.potentials[0].values = table.iter().map(|&c| if c > 0.0 { c.ln() } else { -1e300 }).collect();
    }
    crate::synth::Fitted { model, compression: None, metadata: FitMetadata::default() }
}

/// The MODIPS models over raw numeric values behind the
/// [`crate::synth::Synthesizer`] interface, which hands a fit marginals of
/// binned codes only: the fit refuses, before any charge. `dpflow synth`
/// and pipelines run them through [`super::raw`].
#[derive(Debug, Clone, Copy)]
pub struct RawSynth(pub super::raw::RawMechanism);

impl crate::synth::Synthesizer for RawSynth {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn required_marginals(&self, _domain: &Domain, _workload: &crate::synth::Workload) -> Vec<Vec<usize>> {
        vec![]
    }

    #[allow(private_interfaces)]
    fn fit(&self, _ctx: &mut crate::synth::FitContext<'_>) -> Result<crate::synth::Fitted> {
        Err(DipsError::RawValues(self.0.name()).into())
    }

    fn pure_dp(&self) -> bool {
        true
    }
}

/// The sequential regression synthesizer behind the
/// [`crate::synth::Synthesizer`] interface: one set, no posterior draw (the
/// interface has no row count), the model one clique over every column
/// holding the set's joint distribution (total 1: give the rows to sample).
#[derive(Debug, Clone, Copy)]
pub struct SequentialSynth {
    /// The logistic regressions' ridge Λ.
    pub ridge: f64,
}

impl crate::synth::Synthesizer for SequentialSynth {
    fn name(&self) -> &'static str {
        "sequential-regression"
    }

    fn required_marginals(&self, domain: &Domain, _workload: &crate::synth::Workload) -> Vec<Vec<usize>> {
        every_column(domain)
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut crate::synth::FitContext<'_>) -> Result<crate::synth::Fitted> {
        let (all, exact) = full_table(ctx)?;
        let spec = SequentialSpec::categorical(&ctx.names(&all), &ctx.sizes, 1, 0, self.ridge);
        let joint = sequential_table(&exact, &spec, ctx.epsilon, ctx.accountant, ctx.rng)?.remove(0);
        Ok(one_clique(&ctx.sizes, &joint, 1.0))
    }

    fn pure_dp(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use dpflow_udfs::domain::{Column, ColumnKind, OutOfDomain};
    use futures::StreamExt;

    use super::*;

    fn column(name: &str, values: &[&str]) -> Column {
        Column {
            name: name.into(),
            kind: ColumnKind::Categorical {
                values: values.iter().map(|v| v.to_string()).collect(),
                aliases: Default::default(),
            },
            nullable: false,
            null_tokens: vec![],
            out_of_domain: OutOfDomain::Error,
            not_applicable_when: None,
        }
    }

    /// The rows are the released counts exactly (cell k row-major, the last
    /// column fastest), across batch boundaries.
    #[tokio::test]
    async fn count_streams_emit_exactly_the_counts() {
        let domain = Domain::new(vec![column("a", &["a0", "a1"]), column("b", &["b0", "b1", "b2"])]).unwrap();
        let counts = vec![70_000u64, 0, 3, 1, 0, 5];
        let stream =
            count_stream(domain.clone(), vec![2, 3], counts.clone(), DecodeMode::Uniform, DpRng::unsafe_seeded(1));
        let batches: Vec<_> = stream.collect::<Vec<_>>().await.into_iter().map(|b| b.unwrap()).collect();
        assert!(batches.len() >= 2, "crosses a batch boundary");
        let mut seen = vec![0u64; 6];
        use datafusion::arrow::array::AsArray;
        for b in &batches {
            let a = b.column(0).as_string::<i32>();
            let c = b.column(1).as_string::<i32>();
            for i in 0..b.num_rows() {
                let ai = (a.value(i) == "a1") as usize;
                let bi = c.value(i)[1..].parse::<usize>().unwrap();
                seen[ai * 3 + bi] += 1;
            }
        }
        assert_eq!(seen, counts);
    }
}
