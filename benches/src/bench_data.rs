//! Census-like benchmark data from a known Bayesian network.
//!
//! `dpflow bench-data --rows N --out FILE.parquet [--seed S] [--domain-out F] [--columns W]`
//! writes 16 columns with domain sizes 2–100 (age, sex, race, education,
//! occupation, income bins, state, county, ...). Each column but the roots has
//! one parent (a tree-shaped network), its conditional table drawn from the
//! seed. `--columns W` (1–32) keeps the first W columns, or, above 16, adds a
//! spouse: `spouse_age`, `spouse_sex`, ... with the same structure, whose
//! roots depend on the person's (age on age, sex on sex, race on race, state
//! on state), so 32 columns are one connected tree. From 16 columns on, the
//! person's columns are the same, table and rows, whatever W (the spouse
//! draws from a random stream of its own); below 16 the rows differ. Nulls: MCAR in `industry` (5%) and `disability` (2%); MAR in
//! `occupation` (by its parent `education`) and `income` (by
//! its parent `occupation`). Because the model is known, exact population
//! marginals (1-way and parent–child) are available for tests.
//!
//! Generation streams: batches are generated in parallel and written in
//! order, so 100M rows never sit in memory.

use std::sync::Arc;

use anyhow::{Context, Result};
use datafusion::arrow::array::{ArrayRef, BooleanBuilder, Int64Builder, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use dpflow::io::{ParquetSink, session_context};

/// How a column is stored and what its codes mean.
#[derive(Debug, Clone)]
pub enum BenchKind {
    /// Labels (stored as strings).
    Categorical(Vec<String>),
    /// Integers: code c is stored as `lo + c·width + u`, u uniform in [0, width).
    Integer {
        /// Lowest value.
        lo: i64,
        /// Bin width.
        width: i64,
    },
    /// Boolean (codes 0/1).
    Boolean,
}

/// Missingness of a column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BenchNulls {
    /// Never null.
    Never,
    /// Missing completely at random with this rate.
    Mcar(f64),
    /// Missing at random given the parent's code: rate = base + slope·(parent code / parent size).
    MarOnParent {
        /// Rate at parent code 0.
        base: f64,
        /// Added rate at the top parent code.
        slope: f64,
    },
}

/// One column of the benchmark network.
#[derive(Debug, Clone)]
pub struct BenchColumn {
    /// Name.
    pub name: String,
    /// Number of codes (excluding null).
    pub size: usize,
    /// Storage kind.
    pub kind: BenchKind,
    /// Parent column index (None for roots).
    pub parent: Option<usize>,
    /// Missingness.
    pub nulls: BenchNulls,
}

/// The known generating model.
#[derive(Debug, Clone)]
pub struct BenchModel {
    /// Columns in topological order.
    pub columns: Vec<BenchColumn>,
    /// cpt[c][parent_code * size + code] (roots: one row).
    pub cpt: Vec<Vec<f64>>,
    /// Cumulative tables for sampling.
    cum: Vec<Vec<f64>>,
    /// The seed.
    pub seed: u64,
}

fn labels(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i:02}")).collect()
}

/// The widest table [`BenchModel::with_columns`] builds: a person and a spouse.
pub const MAX_COLUMNS: usize = 2 * PERSON;

/// The person's columns (the default width).
const PERSON: usize = 16;

/// The person's 16 columns.
fn person() -> Vec<BenchColumn> {
    use BenchKind::*;
    use BenchNulls::*;
    let cat = |v: &[&str]| Categorical(v.iter().map(|s| s.to_string()).collect());
    vec![
        BenchColumn { name: "age".into(), size: 100, kind: Integer { lo: 0, width: 1 }, parent: None, nulls: Never },
        BenchColumn { name: "sex".into(), size: 2, kind: cat(&["F", "M"]), parent: None, nulls: Never },
        BenchColumn { name: "race".into(), size: 9, kind: Categorical(labels("R", 9)), parent: None, nulls: Never },
        BenchColumn {
            name: "hispanic".into(),
            size: 5,
            kind: Categorical(labels("H", 5)),
            parent: Some(2),
            nulls: Never,
        },
        BenchColumn {
            name: "marital".into(),
            size: 6,
            kind: Categorical(labels("M", 6)),
            parent: Some(0),
            nulls: Never,
        },
        BenchColumn {
            name: "education".into(),
            size: 16,
            kind: Categorical(labels("E", 16)),
            parent: Some(0),
            nulls: Never,
        },
        BenchColumn {
            name: "employment".into(),
            size: 4,
            kind: cat(&["employed", "unemployed", "not-in-labor-force", "armed-forces"]),
            parent: Some(5),
            nulls: Never,
        },
        BenchColumn {
            name: "occupation".into(),
            size: 25,
            kind: Categorical(labels("O", 25)),
            parent: Some(5),
            nulls: MarOnParent { base: 0.02, slope: 0.10 },
        },
        BenchColumn {
            name: "industry".into(),
            size: 20,
            kind: Categorical(labels("I", 20)),
            parent: Some(7),
            nulls: Mcar(0.05),
        },
        BenchColumn {
            name: "hours".into(),
            size: 10,
            kind: Integer { lo: 0, width: 10 },
            parent: Some(6),
            nulls: Never,
        },
        BenchColumn {
            name: "income".into(),
            size: 50,
            kind: Integer { lo: 0, width: 4000 },
            parent: Some(7),
            nulls: MarOnParent { base: 0.05, slope: 0.15 },
        },
        BenchColumn {
            name: "household".into(),
            size: 10,
            kind: Integer { lo: 1, width: 1 },
            parent: Some(4),
            nulls: Never,
        },
        BenchColumn {
            name: "tenure".into(),
            size: 3,
            kind: cat(&["own", "rent", "other"]),
            parent: Some(10),
            nulls: Never,
        },
        BenchColumn { name: "state".into(), size: 50, kind: Categorical(labels("S", 50)), parent: None, nulls: Never },
        BenchColumn {
            name: "county".into(),
            size: 100,
            kind: Integer { lo: 0, width: 1 },
            parent: Some(13),
            nulls: Never,
        },
        BenchColumn { name: "disability".into(), size: 2, kind: Boolean, parent: Some(0), nulls: Mcar(0.02) },
    ]
}

/// The first `width` columns of the person and, past 16, the spouse (see the module doc).
fn columns(width: usize) -> Vec<BenchColumn> {
    let person = person();
    let n = person.len();
    // The spouse's roots hang off the person's: age, sex, race, state.
    let spouse: Vec<BenchColumn> = person
        .iter()
        .enumerate()
        .map(|(i, c)| BenchColumn {
            name: format!("spouse_{}", c.name),
            parent: Some(c.parent.map_or(i, |p| p + n)),
            ..c.clone()
        })
        .collect();
    person.into_iter().chain(spouse).take(width).collect()
}

impl BenchModel {
    /// The 16-column model for a seed (structure fixed, tables drawn from the seed).
    pub fn new(seed: u64) -> Self {
        Self::with_columns(seed, 16)
    }

    /// The model with `width` columns (1 to [`MAX_COLUMNS`]; see the module
    /// doc). The tables of the first columns do not depend on `width`.
    pub fn with_columns(seed: u64, width: usize) -> Self {
        let columns = columns(width.clamp(1, MAX_COLUMNS));
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x005E_ED0F_BE7C_0DA7);
        let mut cpt = Vec::new();
        for c in &columns {
            let rows = c.parent.map_or(1, |p| columns[p].size);
            let mut table = Vec::with_capacity(rows * c.size);
            for r in 0..rows {
                // A peaked, parent-dependent distribution: weights decay away from a
                // mode that moves with the parent code, plus noise.
                let mode = (r * c.size / rows.max(1) + rng.random_range(0..c.size.max(1))) % c.size;
                let mut w: Vec<f64> = (0..c.size)
                    .map(|v| {
                        let d = (v as f64 - mode as f64).abs() / c.size as f64;
                        (-(4.0 * d)).exp() * (0.2 + rng.random::<f64>())
                    })
                    .collect();
                let s: f64 = w.iter().sum();
                w.iter_mut().for_each(|x| *x /= s);
                table.extend(w);
            }
            cpt.push(table);
        }
        let cum = columns
            .iter()
            .zip(&cpt)
            .map(|(c, t)| {
                let mut out = Vec::with_capacity(t.len());
                for row in t.chunks(c.size) {
                    let mut acc = 0.0;
                    for &p in row {
                        acc += p;
                        out.push(acc);
                    }
                    *out.last_mut().unwrap() = 1.0;
                }
                out
            })
            .collect();
        Self { columns, cpt, cum, seed }
    }

    /// Probability that column `c` is null given its parent's code.
    pub fn null_rate(&self, c: usize, parent_code: usize) -> f64 {
        match self.columns[c].nulls {
            BenchNulls::Never => 0.0,
            BenchNulls::Mcar(r) => r,
            BenchNulls::MarOnParent { base, slope } => {
                let p = self.columns[c].parent.expect("MAR needs a parent");
                base + slope * parent_code as f64 / (self.columns[p].size - 1).max(1) as f64
            }
        }
    }

    /// Exact distribution of the latent (pre-masking) codes of every column.
    pub fn latent_marginals(&self) -> Vec<Vec<f64>> {
        let mut out: Vec<Vec<f64>> = Vec::with_capacity(self.columns.len());
        for (i, c) in self.columns.iter().enumerate() {
            let m = match c.parent {
                None => self.cpt[i].clone(),
                Some(p) => {
                    let mut v = vec![0.0; c.size];
                    for (pc, pp) in out[p].iter().enumerate() {
                        for (x, vx) in v.iter_mut().enumerate() {
                            *vx += pp * self.cpt[i][pc * c.size + x];
                        }
                    }
                    v
                }
            };
            out.push(m);
        }
        out
    }

    /// Exact 1-way marginal of the *observed* column `c` with null as its
    /// last cell (size + 1 cells).
    pub fn observed_marginal(&self, c: usize) -> Vec<f64> {
        let latent = self.latent_marginals();
        let col = &self.columns[c];
        let mut v = vec![0.0; col.size + 1];
        match (col.nulls, col.parent) {
            (BenchNulls::MarOnParent { .. }, Some(p)) => {
                for (pc, pp) in latent[p].iter().enumerate() {
                    let m = self.null_rate(c, pc);
                    for x in 0..col.size {
                        let joint = pp * self.cpt[c][pc * col.size + x];
                        v[x] += joint * (1.0 - m);
                        v[col.size] += joint * m;
                    }
                }
            }
            _ => {
                let m = self.null_rate(c, 0);
                for x in 0..col.size {
                    v[x] = latent[c][x] * (1.0 - m);
                }
                v[col.size] = m;
            }
        }
        v
    }

    /// Exact joint of (parent, child) latent codes for a non-root column.
    pub fn parent_child_joint(&self, c: usize) -> Option<Vec<f64>> {
        let p = self.columns[c].parent?;
        let latent = self.latent_marginals();
        let n = self.columns[c].size;
        let mut v = vec![0.0; self.columns[p].size * n];
        for (pc, pp) in latent[p].iter().enumerate() {
            for x in 0..n {
                v[pc * n + x] = pp * self.cpt[c][pc * n + x];
            }
        }
        Some(v)
    }

    /// The Arrow schema of generated files.
    pub fn schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| {
                    let t = match c.kind {
                        BenchKind::Categorical(_) => DataType::Utf8,
                        BenchKind::Integer { .. } => DataType::Int64,
                        BenchKind::Boolean => DataType::Boolean,
                    };
                    Field::new(&c.name, t, c.nulls != BenchNulls::Never)
                })
                .collect::<Vec<_>>(),
        ))
    }

    fn sample_code(&self, c: usize, parent_code: usize, u: f64) -> usize {
        let n = self.columns[c].size;
        let row = &self.cum[c][parent_code * n..(parent_code + 1) * n];
        row.partition_point(|&x| x < u).min(n - 1)
    }

    /// Generates batch number `index` of `rows` rows (deterministic in seed and index).
    pub fn batch(&self, index: u64, rows: usize) -> RecordBatch {
        let mut rng = SmallRng::seed_from_u64(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(index));
        // The spouse's columns draw from a stream of their own, so the person's
        // columns are the same whatever the width past 16.
        let mut spouse_rng =
            SmallRng::seed_from_u64(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(index) ^ 0x5B0_05E5);
        let d = self.columns.len();
        let mut codes = vec![vec![0u32; rows]; d];
        let mut nulls = vec![vec![false; rows]; d];
        for r in 0..rows {
            for c in 0..d {
                let rng = if c < PERSON { &mut rng } else { &mut spouse_rng };
                let pc = self.columns[c].parent.map_or(0, |p| codes[p][r] as usize);
                codes[c][r] = self.sample_code(c, pc, rng.random::<f64>()) as u32;
                let m = self.null_rate(c, pc);
                if m > 0.0 && rng.random::<f64>() < m {
                    nulls[c][r] = true;
                }
            }
        }
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter()
            .enumerate()
            .map(|(c, col)| -> ArrayRef {
                match &col.kind {
                    BenchKind::Categorical(l) => {
                        let mut b = StringBuilder::with_capacity(rows, rows * 4);
                        for r in 0..rows {
                            if nulls[c][r] { b.append_null() } else { b.append_value(&l[codes[c][r] as usize]) }
                        }
                        Arc::new(b.finish())
                    }
                    BenchKind::Integer { lo, width } => {
                        let rng = if c < PERSON { &mut rng } else { &mut spouse_rng };
                        let mut b = Int64Builder::with_capacity(rows);
                        for r in 0..rows {
                            if nulls[c][r] {
                                b.append_null()
                            } else {
                                let off = if *width > 1 { rng.random_range(0..*width) } else { 0 };
                                b.append_value(lo + codes[c][r] as i64 * width + off)
                            }
                        }
                        Arc::new(b.finish())
                    }
                    BenchKind::Boolean => {
                        let mut b = BooleanBuilder::with_capacity(rows);
                        for r in 0..rows {
                            if nulls[c][r] { b.append_null() } else { b.append_value(codes[c][r] == 1) }
                        }
                        Arc::new(b.finish())
                    }
                }
            })
            .collect();
        RecordBatch::try_new(self.schema(), arrays).expect("schema matches")
    }

    /// The matching public domain file (YAML).
    pub fn domain_yaml(&self) -> String {
        let mut s = String::from(
            "# Public domain of dpflow bench-data (a known Bayesian network; see src/bench_data.rs).\nname: bench\ncolumns:\n",
        );
        for c in &self.columns {
            let nullable = c.nulls != BenchNulls::Never;
            match &c.kind {
                BenchKind::Categorical(l) => {
                    s += &format!(
                        "  - {{name: {}, kind: categorical, values: [{}], nullable: {nullable}}}\n",
                        c.name,
                        l.join(", ")
                    )
                }
                BenchKind::Integer { lo, width } => {
                    let hi = lo + width * c.size as i64 - 1;
                    let bins = if *width > 1 { format!(", bins: {{width: {width}}}") } else { String::new() };
                    s += &format!(
                        "  - {{name: {}, kind: integer, bounds: [{lo}, {hi}]{bins}, nullable: {nullable}}}\n",
                        c.name
                    )
                }
                BenchKind::Boolean => s += &format!("  - {{name: {}, kind: boolean, nullable: {nullable}}}\n", c.name),
            }
        }
        s
    }
}

/// Writes `rows` rows of the 16-column model to `out` (Parquet, zstd),
/// streaming; optionally the domain file.
pub async fn write_bench_data(
    rows: u64,
    out: &str,
    seed: u64,
    domain_out: Option<&str>,
    batch_rows: usize,
) -> Result<u64> {
    write_model_data(BenchModel::new(seed), rows, out, domain_out, batch_rows).await
}

/// Writes `rows` rows of `model` to `out` (Parquet, zstd), streaming;
/// optionally the domain file.
pub async fn write_model_data(
    model: BenchModel,
    rows: u64,
    out: &str,
    domain_out: Option<&str>,
    batch_rows: usize,
) -> Result<u64> {
    let model = Arc::new(model);
    if let Some(d) = domain_out {
        std::fs::write(d, model.domain_yaml()).with_context(|| format!("writing {d}"))?;
    }
    let ctx = session_context();
    let mut sink = ParquetSink::create(&ctx, out, model.schema()).await?;
    let batches = rows.div_ceil(batch_rows as u64);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    // Generate `workers` batches at a time in parallel, write them in order.
    let mut next = 0u64;
    while next < batches {
        let end = (next + workers).min(batches);
        let handles: Vec<_> = (next..end)
            .map(|i| {
                let model = model.clone();
                let n = (rows - i * batch_rows as u64).min(batch_rows as u64) as usize;
                tokio::task::spawn_blocking(move || model.batch(i, n))
            })
            .collect();
        for h in handles {
            sink.write(&h.await?).await?;
        }
        next = end;
    }
    Ok(sink.finish().await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpflow::dataset::Dataset;
    use dpflow::domain::DomainSpec;
    use dpflow_udfs::marginal::NullMode;
    use dpflow_udfs::noise::testing::chi_square_test_counts;

    #[test]
    fn domain_file_parses_and_matches_schema() {
        for width in [1, 8, 16, 17, 32] {
            let m = BenchModel::with_columns(3, width);
            let spec = DomainSpec::parse(&m.domain_yaml(), "bench.yaml").unwrap();
            assert_eq!(spec.domain.len(), width);
            assert_eq!(m.schema().fields().len(), width);
            for (c, d) in m.columns.iter().zip(spec.domain.columns()) {
                assert_eq!(c.size, d.size(), "{}", c.name);
                assert_eq!(c.nulls != BenchNulls::Never, d.nullable);
                assert_eq!(c.name, d.name);
            }
            assert!(m.columns.iter().all(|c| (2..=100).contains(&c.size)));
        }
    }

    #[test]
    fn a_wider_model_keeps_the_narrower_ones_tables_and_adds_a_connected_spouse() {
        let narrow = BenchModel::new(5);
        let wide = BenchModel::with_columns(5, 32);
        assert_eq!(narrow.columns.len(), 16);
        assert_eq!(&wide.cpt[..16], &narrow.cpt[..]);
        // One tree: every column but the person's four roots has a parent before it.
        let roots: Vec<&str> = wide.columns.iter().filter(|c| c.parent.is_none()).map(|c| c.name.as_str()).collect();
        assert_eq!(roots, ["age", "sex", "race", "state"]);
        for (i, c) in wide.columns.iter().enumerate() {
            assert!(c.parent.is_none_or(|p| p < i), "{}", c.name);
        }
        assert_eq!(wide.columns[16].name, "spouse_age");
        assert_eq!(wide.columns[16].parent, Some(0));
        assert_eq!(wide.columns[16 + 7].parent, Some(16 + 5), "spouse_occupation on spouse_education");
        // The person's rows do not change when the spouse is added.
        let (p, w) = (narrow.batch(3, 100), wide.batch(3, 100));
        assert_eq!(w.num_columns(), 32);
        for c in 0..16 {
            assert_eq!(w.column(c), p.column(c), "{}", narrow.columns[c].name);
        }
    }

    #[tokio::test]
    async fn generated_marginals_match_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("b.parquet");
        let dom = dir.path().join("b.yaml");
        let rows = 200_000u64;
        // The widest model: the spouse's roots hang off the person's columns.
        let model = BenchModel::with_columns(11, MAX_COLUMNS);
        let n = write_model_data(model.clone(), rows, data.to_str().unwrap(), Some(dom.to_str().unwrap()), 30_000)
            .await
            .unwrap();
        assert_eq!(n, rows);
        let ds = Dataset::open("bench", data.to_str().unwrap(), None, dom.to_str().unwrap()).unwrap();
        let ctx = dpflow::io::session_context();
        let names: Vec<String> = model.columns.iter().map(|c| c.name.to_string()).collect();
        let sets: Vec<(Vec<String>, NullMode)> = names.iter().map(|n| (vec![n.clone()], NullMode::Cells)).collect();
        let got = dpflow::eval::inspect::exact_marginal_counts(&ds, &ctx, &sets).await.unwrap();
        for (i, m) in got.iter().enumerate() {
            let col = &model.columns[i];
            let mut truth = model.observed_marginal(i);
            if col.nulls == BenchNulls::Never {
                truth.pop();
            }
            let obs: Vec<f64> = m.iter().map(|&c| c as f64).collect();
            chi_square_test_counts(&obs, &truth, 1e-5);
        }
        // Parent–child joints of never-null pairs.
        let pairs: Vec<usize> = (0..model.columns.len())
            .filter(|&c| {
                model.columns[c].parent.is_some_and(|p| model.columns[p].nulls == BenchNulls::Never)
                    && model.columns[c].nulls == BenchNulls::Never
            })
            .collect();
        let sets: Vec<(Vec<String>, NullMode)> = pairs
            .iter()
            .map(|&c| (vec![names[model.columns[c].parent.unwrap()].clone(), names[c].clone()], NullMode::Cells))
            .collect();
        let got = dpflow::eval::inspect::exact_marginal_counts(&ds, &ctx, &sets).await.unwrap();
        for (k, &c) in pairs.iter().enumerate() {
            let truth = model.parent_child_joint(c).unwrap();
            let obs: Vec<f64> = got[k].iter().map(|&x| x as f64).collect();
            chi_square_test_counts(&obs, &truth, 1e-5);
        }
    }
}
