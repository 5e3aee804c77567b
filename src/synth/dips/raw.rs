//! `dpflow synth --mechanism modips-normal | modips-glom`, and
//! `sequential-regression --dips-numeric linear`: the 002 models that need a
//! dataset's raw numeric values, end to end. MODIPS's normal model
//! ([`super::normal`], 002 §4.2), its general location model
//! ([`super::glom`], 002 §4.3.1) and the sequential regression synthesizer
//! over rows ([`super::sequential::sequential_regression`], 002 §3.2.3).
//!
//! **The table.** `modips-normal` models the one numeric column of the
//! domain. `modips-glom` models exactly two numeric columns z within the
//! cells of the other columns (categorical or boolean: their full
//! cross-tabulation, row-major, nulls a cell of their own under
//! `--missing reproduce`). The sequence takes every column in the domain's
//! order, numeric ones as linear regressions. The numeric columns' public
//! bounds are the domain's (`[edges₀, edges_last]`; 002 used μ ± 4σ,
//! data-dependent), the same box in every cell. The models have no missing
//! numeric value: a nullable numeric column needs `--missing complete-row`,
//! which leaves out every row with a null (a row-wise filter, 1-stable).
//!
//! **The read.** The data are typed through the domain (aliases, null
//! tokens, out-of-domain policies) in one streaming pass. For the MODIPS
//! models each row adds to exact grid sums (module `grid`) and nothing else
//! is kept, so memory is ∝ cells, not rows; the sequence holds the rows
//! (codes and values, n × p floats) for its regressions. Privacy is the
//! modules' own proofs (add/remove-one neighbours, ε/m per set, split
//! equally over the sanitized statistics or the p regressions), charged in
//! full in the ledger before the read.
//!
//! **The output.** Each set is one posterior draw and r public rows from it
//! (post-processing): for MODIPS, cells drawn from π (exactly the
//! multinomial counts, in a uniformly random order), z ~ N(μ_k, Σ) cut into
//! the box; for the sequence, column by column from the set's regressions.
//! Integer columns are rounded to the nearest integer inside their bounds.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use dpflow_udfs::domain::{BatchEncoder, Column, ColumnKind, DecodeMode, EncodeExec, decoded_schema};
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::cauchy::standard_normal_sample;
use futures::StreamExt;

use super::DipsError;
use super::cells::multinomial;
use super::glom::{GlomPosterior, GlomSpec, GlomSums};
use super::normal::{NormalSpec, NormalSums, posterior_draw};
use super::release::{
    BATCH, CellShuffle, MAX_CELLS, MAX_CELLS_TIMES_SETS, Released, record, settle, split_cells, table_domain,
};
use super::sequential::{NumericModel, SeqColumn, SequentialSpec, sequential_regression};
use crate::domain::Domain;
use crate::measure::ReleaseAccountant;
use crate::missing::Strategy;
use crate::pgm::factor::strides;
use crate::privacy::{PrivacyFilter, Share};
use crate::synth::run::{SynthRecord, SynthRequest, TimingRecord, begin_release, budget_check, write_streams};
use crate::synth::{DipsOptions, Result, SynthError};

/// A 002 model over raw numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawMechanism {
    /// One bounded normal column (002 §4.2).
    Normal,
    /// Two numeric columns, bivariate normal within the cells of the others
    /// (002 §4.3.1).
    Glom,
    /// The sequential regression synthesizer over rows (002 §3.2.3):
    /// numeric columns are linear regressions on the raw values
    /// ([`super::sequential::sequential_regression`]).
    Sequential,
}

impl RawMechanism {
    /// Name in records.
    pub fn name(&self) -> &'static str {
        match self {
            RawMechanism::Normal => "modips-normal",
            RawMechanism::Glom => "modips-glom",
            RawMechanism::Sequential => "sequential-regression",
        }
    }
}

/// The raw-value model a mechanism runs as under `options`, if any:
/// modips-normal, modips-glom, and sequential-regression with
/// `--dips-numeric linear`.
pub fn raw_mechanism(mechanism: crate::synth::run::Mechanism, options: &DipsOptions) -> Option<RawMechanism> {
    use crate::synth::run::Mechanism as M;
    match mechanism {
        M::SequentialRegression if options.numeric == NumericModel::Linear => Some(RawMechanism::Sequential),
        other => other.raw(),
    }
}

/// The public layout of a raw MODIPS run, from the domain alone.
#[derive(Debug, Clone)]
pub struct RawTable {
    /// The domain read (without nulls under complete-row).
    pub domain: Domain,
    /// Positions of the numeric columns (one, or z₁ and z₂).
    pub numeric: Vec<usize>,
    /// Positions of the cell columns (GLOM).
    pub cells_of: Vec<usize>,
    /// Their cardinalities (nulls included under reproduce).
    pub sizes: Vec<usize>,
    /// Cells K (1 without cell columns).
    pub cells: usize,
    /// The public bounds of each numeric column.
    pub bounds: Vec<(f64, f64)>,
}

/// The public checks of a raw MODIPS run (also made by the pipeline spec
/// check, at load): the columns the model needs, the missing-data strategy,
/// the table's size, `--model-out`, and the model's own checks. Nothing
/// here reads data.
#[allow(clippy::too_many_arguments)]
pub fn check_public_raw(
    mechanism: RawMechanism,
    domain: &Domain,
    missing: Strategy,
    epsilon: f64,
    sets: usize,
    rows: u64,
    options: &DipsOptions,
    model_out: bool,
) -> Result<RawTable, DipsError> {
    let table = table_domain(domain, missing)?;
    let numeric: Vec<usize> =
        (0..table.columns().len()).filter(|&i| table.columns()[i].numeric_bounds().is_some()).collect();
    let named = |idx: &[usize]| idx.iter().map(|&i| table.columns()[i].name.clone()).collect::<Vec<_>>().join(", ");
    let all: Vec<usize> = (0..table.columns().len()).collect();
    match mechanism {
        RawMechanism::Normal if numeric.len() != 1 || all.len() != 1 => {
            return Err(DipsError::NormalColumns(named(&all)));
        }
        RawMechanism::Glom if numeric.len() != 2 => return Err(DipsError::GlomColumns(named(&numeric))),
        _ => {}
    }
    if let Some(&i) = numeric.iter().find(|&&i| table.columns()[i].nullable) {
        return Err(DipsError::NullableNumeric(table.columns()[i].name.clone()));
    }
    let cells_of: Vec<usize> = (0..table.columns().len()).filter(|i| !numeric.contains(i)).collect();
    let sizes: Vec<usize> = cells_of.iter().map(|&i| table.columns()[i].cardinality()).collect();
    // The sequence has no table: its cells are not counted.
    let cells = match mechanism {
        RawMechanism::Sequential => Some(0),
        _ => sizes.iter().try_fold(1usize, |a, &s| a.checked_mul(s)).filter(|&c| c <= MAX_CELLS),
    };
    let Some(cells) = cells else {
        let shown = sizes.iter().map(|&s| s as f64).product::<f64>();
        return Err(DipsError::TooManyCells { cells: shown, max: MAX_CELLS });
    };
    if cells.saturating_mul(sets) > MAX_CELLS_TIMES_SETS {
        return Err(DipsError::TooManyCellSets { cells, sets, max: MAX_CELLS_TIMES_SETS });
    }
    let bounds: Vec<(f64, f64)> =
        numeric.iter().map(|&i| table.columns()[i].numeric_bounds().expect("a numeric column")).collect();
    let layout = RawTable { domain: table, numeric, cells_of, sizes, cells, bounds };
    match mechanism {
        RawMechanism::Normal => normal_spec(&layout, sets, rows).check(epsilon)?,
        RawMechanism::Glom => glom_spec(&layout, sets, rows, options.prior).check(epsilon)?,
        RawMechanism::Sequential => sequential_spec(&layout, sets, rows, options.ridge).check(epsilon)?,
    }
    if model_out {
        return Err(DipsError::ModelOut(mechanism.name()));
    }
    Ok(layout)
}

fn normal_spec(t: &RawTable, sets: usize, rows: u64) -> NormalSpec {
    let (lo, hi) = t.bounds[0];
    NormalSpec { column: t.domain.columns()[t.numeric[0]].name.clone(), lo, hi, sets, rows, public_n: None }
}

fn glom_spec(t: &RawTable, sets: usize, rows: u64, prior: f64) -> GlomSpec {
    GlomSpec { bounds: vec![[t.bounds[0], t.bounds[1]]; t.cells], sets, rows, prior }
}

fn sequential_spec(t: &RawTable, sets: usize, rows: u64, ridge: f64) -> SequentialSpec {
    let columns = t
        .domain
        .columns()
        .iter()
        .map(|c| match c.numeric_bounds() {
            Some((lo, hi)) => SeqColumn::Numeric { name: c.name.clone(), lo, hi },
            None => SeqColumn::Categorical {
                name: c.name.clone(),
                levels: u32::try_from(c.cardinality()).unwrap_or(u32::MAX),
            },
        })
        .collect();
    SequentialSpec { columns, sets, rows, ridge, linear_ridge: 1.0 }
}

/// The exact statistics of a model (protected): sums, or the rows.
enum Sums {
    Normal(NormalSums, NormalSpec),
    Glom(GlomSums, GlomSpec),
    /// Column-major rows in the domain's order (codes as f64).
    Rows(Vec<Vec<f64>>, SequentialSpec),
}

/// Runs `mechanism` for `req` (the caller has checked the budget and `--multiple`).
pub(crate) async fn run(
    ctx: &SessionContext,
    req: &SynthRequest,
    mechanism: RawMechanism,
    progress: &dyn Fn(&str),
) -> Result<SynthRecord> {
    budget_check(&req.budget)?;
    let epsilon = crate::synth::run::pure_epsilon(&req.budget);
    // Every public input is checked before anything is charged or read.
    let sets = req.options.multiple;
    let rows = req.rows.unwrap_or(0);
    let options = &req.options.dips;
    let prior = options.prior;
    let model_out = req.model_out.is_some();
    let layout =
        check_public_raw(mechanism, req.dataset.domain(), req.missing, epsilon, sets, rows, options, model_out)?;
    let na_rules = crate::synth::structure::rules(&layout.domain)?;
    let mut sums = match mechanism {
        RawMechanism::Normal => {
            let spec = normal_spec(&layout, sets, rows);
            Sums::Normal(NormalSums::new(&spec, epsilon)?, spec)
        }
        RawMechanism::Glom => {
            let spec = glom_spec(&layout, sets, rows, prior);
            Sums::Glom(GlomSums::new(&spec, epsilon)?, spec)
        }
        RawMechanism::Sequential => Sums::Rows(
            vec![Vec::new(); layout.domain.columns().len()],
            sequential_spec(&layout, sets, rows, options.ridge),
        ),
    };
    // GLOM's cell strides (its cells are at most 2²⁴); the others index no
    // cells (the sequence's columns may have more than an index holds).
    let strides = if mechanism == RawMechanism::Glom { strides(&layout.sizes) } else { Vec::new() };
    let (mut rng, ledger_state) = begin_release(req, mechanism.name(), Share::Epsilon(epsilon), progress)?;

    // Protected data is read from here on: a failure is charged and
    // reported without its cause (docs/PRIVACY.md §1).
    let released = async {
        let t0 = Instant::now();
        let complete = req.missing == Strategy::CompleteRow;
        read_rows(ctx, req, &layout, complete, |codes, z| match &mut sums {
            Sums::Normal(s, _) => s.add(z[0]),
            Sums::Glom(s, spec) => {
                let cell: usize = codes.iter().zip(&strides).map(|(&c, s)| c as usize * s).sum();
                s.add(spec, cell as u32, [z[0], z[1]]);
            }
            Sums::Rows(columns, _) => {
                for (&i, &c) in layout.cells_of.iter().zip(codes) {
                    columns[i].push(f64::from(c));
                }
                for (&i, &v) in layout.numeric.iter().zip(z) {
                    columns[i].push(v);
                }
            }
        })
        .await?;
        let t_read = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut accountant = ReleaseAccountant::new(PrivacyFilter::new(Share::Epsilon(epsilon).as_budget()));
        let mut streams = Vec::with_capacity(sets);
        // The charge, then post-processing: one posterior draw per set and r rows from it.
        match sums {
            Sums::Normal(s, spec) => {
                for st in s.release(&spec, &mut accountant, &mut rng)? {
                    let (var, mu) = posterior_draw(&mut rng, &st);
                    let set_rng = DpRng::new(req.unsafe_seed.map(|_| rand::Rng::next_u64(&mut rng)))?;
                    let draw = Draw::Normal { mu, sd: var.sqrt(), lo: spec.lo, hi: spec.hi };
                    streams.push(set_stream(&layout, draw, vec![rows], set_rng));
                }
            }
            Sums::Rows(columns, spec) => {
                let release = sequential_regression(&columns, &spec, epsilon, &mut accountant, &mut rng)?;
                drop(columns);
                for set in release.sets {
                    let set_rng = DpRng::new(req.unsafe_seed.map(|_| rand::Rng::next_u64(&mut rng)))?;
                    streams.push(rows_stream(&layout, set, set_rng));
                }
            }
            Sums::Glom(s, spec) => {
                for st in s.release(&spec, &mut accountant, &mut rng)? {
                    let post = GlomPosterior::draw(&mut rng, &spec, &st);
                    let counts = multinomial(&mut rng, &post.pi, rows);
                    let set_rng = DpRng::new(req.unsafe_seed.map(|_| rand::Rng::next_u64(&mut rng)))?;
                    streams.push(set_stream(&layout, Draw::Glom(post, spec.clone()), counts, set_rng));
                }
            }
        }
        let t_fit = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let streams: Vec<_> =
            streams.into_iter().map(|s| crate::synth::structure::enforce_stream(na_rules.clone(), s)).collect();
        let written = write_streams(ctx, streams, &req.out).await? / sets as u64;
        let seconds = TimingRecord { answers: t_read, fit: t_fit, generate: t2.elapsed().as_secs_f64() };
        Ok::<_, SynthError>((accountant, written, seconds))
    }
    .await;
    let (accountant, written, seconds) = settle(ledger_state.as_ref(), released)?;
    let names =
        |idx: &[usize]| idx.iter().map(|&i| layout.domain.columns()[i].name.clone()).collect::<Vec<_>>().join(", ");
    let bounds = layout.bounds.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect::<Vec<_>>().join(" and ");
    let mut notes = vec![match mechanism {
        RawMechanism::Normal => format!(
            "modips-normal: {} ~ N(μ, σ²) with the prior ∝ σ⁻² (002 §4.2); n, Σ(x − c) and Σ(x − c)² sanitized with \
             ε/(3m) each over the public bounds {bounds}; ε = {epsilon} over {sets} set(s), add/remove-one neighbours",
            names(&layout.numeric)
        ),
        RawMechanism::Glom => format!(
            "modips-glom: ({}) bivariate normal with a mean per cell and one covariance, within the {} cell(s) of ({}) \
             (002 §4.3.1, Dirichlet prior {prior}); six per-cell sums sanitized with ε/(6m) each over the public \
             bounds {bounds} in every cell; ε = {epsilon} over {sets} set(s), add/remove-one neighbours",
            names(&layout.numeric),
            layout.cells,
            names(&layout.cells_of)
        ),
        RawMechanism::Sequential => format!(
            "sequential-regression over rows (002 §3.2.3): each column in the domain's order a regression on the \
             ones before it, numeric ones ({}) linear by sufficient-statistic perturbation on the raw values within \
             their public bounds {bounds}, categorical ones multinomial logistic by output perturbation with ridge \
             Λ = {}; ε/(m·{}) each, ε = {epsilon} over {sets} set(s), add/remove-one neighbours",
            names(&layout.numeric),
            options.ridge,
            layout.domain.columns().len()
        ),
    }];
    if req.missing == Strategy::CompleteRow {
        notes.push(format!("{}: rows with a null in any column were left out", mechanism.name()));
    }
    let done = Released { accountant, written, seconds, notes };
    record(ctx, req, ledger_state, mechanism.name(), true, epsilon, done).await
}

/// Streams the dataset typed through the table's domain and calls `each`
/// with every kept row's codes of the cell columns and its numeric values. A row with a null in a numeric column (possible only after an
/// out-of-domain policy) is passed as NaN, which the sums drop; under
/// `complete`, rows with any null are left out. Nothing is kept.
async fn read_rows(
    ctx: &SessionContext,
    req: &SynthRequest,
    layout: &RawTable,
    complete: bool,
    mut each: impl FnMut(&[u32], &[f64]),
) -> Result<()> {
    let ds = &req.dataset;
    // The dataset's own domain types the input (the table's may lack null codes).
    let domain = Arc::new(ds.domain().clone());
    let names: Vec<&str> = domain.names();
    let read_err = |source| crate::dataset::DatasetError::Plan { location: ds.location.clone(), source };
    let df = ds.raw(ctx).await?.select_columns(&names).map_err(read_err)?;
    let plan = dpflow_udfs::unwind::catch_unwind_future(df.create_physical_plan()).await.map_err(read_err)?;
    let typed: Arc<dyn ExecutionPlan> = Arc::new(EncodeExec::typed(plan, domain.clone()).map_err(read_err)?);
    let mut encoder = BatchEncoder::new(domain.clone(), &typed.schema()).map_err(|_| SynthError::RawRead)?;
    let mut stream = dpflow_udfs::cluster::execute_stream(typed, ctx).await.map_err(read_err)?;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(read_err)?;
        // Codes of the cell columns, from the typed values (already in the
        // domain); none to encode when every column is numeric.
        let codes = if layout.cells_of.is_empty() {
            None
        } else {
            let codes = encoder.encode(&batch).map_err(|_| SynthError::RawRead)?;
            if codes.num_rows() != batch.num_rows() {
                return Err(SynthError::RawRead);
            }
            Some(codes)
        };
        let numeric: Vec<Float64Array> = layout
            .numeric
            .iter()
            .map(|&i| cast(batch.column(i), &DataType::Float64).map(|a| a.as_primitive::<Float64Type>().clone()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| SynthError::RawRead)?;
        let cell_codes: Vec<&[u32]> = match &codes {
            Some(codes) => layout
                .cells_of
                .iter()
                .map(|&i| codes.column(i).as_primitive::<datafusion::arrow::datatypes::UInt32Type>().values().as_ref())
                .collect(),
            None => Vec::new(),
        };
        let nulls: Vec<Option<u32>> = layout.cells_of.iter().map(|&i| domain.columns()[i].null_code()).collect();
        let mut z = vec![0.0; numeric.len()];
        let mut row_codes = vec![0u32; cell_codes.len()];
        'rows: for r in 0..batch.num_rows() {
            for (d, c) in cell_codes.iter().enumerate() {
                if complete && Some(c[r]) == nulls[d] {
                    continue 'rows;
                }
                row_codes[d] = c[r];
            }
            for (j, a) in numeric.iter().enumerate() {
                if a.is_null(r) {
                    if complete {
                        continue 'rows;
                    }
                    z[j] = f64::NAN;
                } else {
                    z[j] = a.value(r);
                }
            }
            each(&row_codes, &z);
        }
    }
    Ok(())
}

/// One set of the sequential synthesizer (column-major, codes as f64 and
/// numeric values inside their bounds) as batches in the domain's schema.
fn rows_stream(layout: &RawTable, set: Vec<Vec<f64>>, mut rng: DpRng) -> SendableRecordBatchStream {
    let domain = layout.domain.clone();
    let schema = decoded_schema(&domain);
    let out_schema = schema.clone();
    let rows = set.first().map_or(0, Vec::len);
    let mut start = 0;
    let batches = std::iter::from_fn(move || {
        if start >= rows {
            return None;
        }
        let end = (start + BATCH).min(rows);
        let mut arrays = Vec::with_capacity(set.len());
        for (c, values) in domain.columns().iter().zip(&set) {
            let part = &values[start..end];
            if c.numeric_bounds().is_some() {
                arrays.push(numeric_array(c, part.to_vec()));
            } else {
                let codes: Vec<u32> = part.iter().map(|&v| v as u32).collect();
                match c.decode(&codes, DecodeMode::Uniform, &mut rng) {
                    Ok(a) => arrays.push(a),
                    Err(e) => return Some(Err(datafusion::error::DataFusionError::External(Box::new(e)))),
                }
            }
        }
        start = end;
        Some(
            RecordBatch::try_new(out_schema.clone(), arrays)
                .map_err(|e| datafusion::error::DataFusionError::ArrowError(Box::new(e), None)),
        )
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::iter(batches)))
}

/// What a set's rows are drawn from (DP output).
enum Draw {
    Normal { mu: f64, sd: f64, lo: f64, hi: f64 },
    Glom(GlomPosterior, GlomSpec),
}

/// One set's rows: `counts[k]` rows in cell k in a uniformly random order,
/// the numeric values drawn from `draw`, in the table domain's schema.
fn set_stream(layout: &RawTable, draw: Draw, counts: Vec<u64>, mut rng: DpRng) -> SendableRecordBatchStream {
    let domain = layout.domain.clone();
    let schema = decoded_schema(&domain);
    let numeric: Vec<Column> = layout.numeric.iter().map(|&i| domain.columns()[i].clone()).collect();
    let (cells_of, numeric_at, sizes) = (layout.cells_of.clone(), layout.numeric.clone(), layout.sizes.clone());
    let mut shuffle = CellShuffle::new(&counts);
    let out_schema = schema.clone();
    let batches = std::iter::from_fn(move || {
        let cells = shuffle.next_batch(&mut rng)?;
        let mut values: Vec<Vec<f64>> = vec![Vec::with_capacity(cells.len()); numeric.len()];
        for &k in &cells {
            match &draw {
                Draw::Normal { mu, sd, lo, hi } => {
                    values[0].push((mu + sd * standard_normal_sample(&mut rng)).clamp(*lo, *hi));
                }
                Draw::Glom(post, spec) => {
                    let z = post.z(&mut rng, spec, k);
                    values[0].push(z[0]);
                    values[1].push(z[1]);
                }
            }
        }
        let mut arrays: Vec<Option<ArrayRef>> = vec![None; domain.columns().len()];
        // Each cell column decoded on its own (no sub-domain is built: the
        // table domain's columns need not validate as a domain of their own,
        // e.g. `out_of_domain: null` once complete-row made them not nullable).
        let codes = split_cells(&cells, &sizes);
        for (&i, codes) in cells_of.iter().zip(&codes) {
            match domain.columns()[i].decode(codes, DecodeMode::Uniform, &mut rng) {
                Ok(a) => arrays[i] = Some(a),
                Err(e) => return Some(Err(datafusion::error::DataFusionError::External(Box::new(e)))),
            }
        }
        for (j, &i) in numeric_at.iter().enumerate() {
            arrays[i] = Some(numeric_array(&numeric[j], std::mem::take(&mut values[j])));
        }
        let arrays: Vec<ArrayRef> = arrays.into_iter().map(|a| a.expect("every column filled")).collect();
        Some(
            RecordBatch::try_new(out_schema.clone(), arrays)
                .map_err(|e| datafusion::error::DataFusionError::ArrowError(Box::new(e), None)),
        )
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::iter(batches)))
}

/// Synthetic values of a numeric column: integers rounded to the nearest
/// integer inside the bounds, reals as they are (already inside).
fn numeric_array(column: &Column, values: Vec<f64>) -> ArrayRef {
    match &column.kind {
        ColumnKind::Integer { .. } => {
            let (lo, hi) = column.numeric_bounds().expect("numeric");
            Arc::new(Int64Array::from_iter_values(values.into_iter().map(|v| v.round().clamp(lo, hi) as i64)))
        }
        _ => Arc::new(Float64Array::from(values)),
    }
}
