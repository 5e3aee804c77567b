//! The sequential regression synthesizer (002 §3.2.3; the MODIPS of
//! §4.3.2's SLOMAG model is one instance).
//!
//! **Model.** f(X₁, …, X_p) = f(X₁) f(X₂ | X₁) ⋯ f(X_p | X₁ … X_{p−1}) in
//! a public order: a categorical X_t is a multinomial (binary: logistic)
//! regression on its predecessors, a bounded numeric X_t a normal linear
//! regression on them. The first column is a regression on the intercept
//! alone, so X₁ needs no special case.
//!
//! **Design.** The predictors of X_t are an intercept, each categorical
//! predecessor one-hot with its level 0 as reference, each numeric one
//! centred and scaled into [−1, 1] by its public bounds; all divided by
//! R_t = √(1 + t), so every row has ‖x‖ ≤ 1 (one unit per predecessor
//! group and the intercept). A numeric target is mapped into [−1, 1] by
//! its bounds (not divided by R_t).
//! Everything here is public (levels, bounds, the order), so the design is
//! a row-wise map.
//!
//! **Privacy under add/remove-one neighbours.** Rows with a missing or
//! out-of-domain value are dropped and numeric values are clamped to their
//! bounds (row-wise, 1-stable). Each set gets ε/m and each of the p
//! regressions ε/(m·p) of it (002 §3.2.3: "the total privacy budget needs
//! to be divided into p portions"); [`super::regression`] gives each
//! mechanism and its proof. Every regression is fit on the *original*
//! predecessors once; each set releases its own noisy copy (sequential
//! composition over m·p releases). The rest is post-processing: each set
//! draws its parameters around its noisy estimate and generates its r rows
//! column by column from the *synthetic* predecessors.

use super::DipsError;
use super::cells::per_set_epsilon;
use super::grid::check_bounds;
use super::regression::{
    ColumnRows, Design, Encoded, LinearMechanism, LogisticMechanism, OneHot, RIDGE_RANGE, column_row, gaussian_draw,
    logistic_hessian_rows, logistic_posterior_draw, one_hot_row, probabilities, sample_class,
};
use crate::measure::Accountant;
use crate::privacy::MechanismRecord;
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::cauchy::standard_normal_sample;

type Result<T, E = DipsError> = std::result::Result<T, E>;

/// The most coefficients one regression may have: the Newton solver holds
/// a D×D Hessian and each row costs D² to add to it.
pub const MAX_PARAMETERS: usize = 2048;

/// One column of the sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqColumn {
    /// Codes 0..levels (as f64 in the data).
    Categorical {
        /// Name.
        name: String,
        /// Levels (at least 2).
        levels: u32,
    },
    /// A numeric value with public bounds.
    Numeric {
        /// Name.
        name: String,
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
}

impl SeqColumn {
    fn name(&self) -> &str {
        match self {
            SeqColumn::Categorical { name, .. } | SeqColumn::Numeric { name, .. } => name,
        }
    }

    /// Predictors this column adds to its successors' designs.
    fn width(&self) -> usize {
        match self {
            SeqColumn::Categorical { levels, .. } => *levels as usize - 1,
            SeqColumn::Numeric { .. } => 1,
        }
    }

    /// Whether a value is in the domain (a NaN never is).
    fn valid(&self, v: f64) -> bool {
        match self {
            SeqColumn::Categorical { levels, .. } => v >= 0.0 && v < f64::from(*levels) && v.fract() == 0.0,
            SeqColumn::Numeric { .. } => !v.is_nan(),
        }
    }

    /// A numeric value scaled into [−1, 1].
    fn unit(&self, v: f64) -> f64 {
        match self {
            SeqColumn::Numeric { lo, hi, .. } => {
                let h = 0.5 * (hi - lo);
                ((v - (lo + h)) / h).clamp(-1.0, 1.0)
            }
            SeqColumn::Categorical { .. } => v,
        }
    }
}

/// How `dpflow synth --mechanism sequential-regression` models the
/// domain's numeric (integer or float) columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum NumericModel {
    /// As categorical columns over the domain's bins (the table form:
    /// memory ∝ cells, no row-level data).
    #[default]
    Bins,
    /// As linear regressions on the raw values, over rows (the row form:
    /// memory ∝ rows × columns).
    Linear,
}

/// Public inputs of a sequential regression release.
#[derive(Debug, Clone, PartialEq)]
pub struct SequentialSpec {
    /// The columns in synthesis order.
    pub columns: Vec<SeqColumn>,
    /// m, synthetic sets (each gets ε/m).
    pub sets: usize,
    /// r, rows per set.
    pub rows: u64,
    /// Λ, every logistic regression's prior precision (module docs of
    /// [`super::regression`]): the noise scale is ∝ 1/Λ and the shrinkage
    /// toward 0 grows with Λ, both in the scaled design's units.
    pub ridge: f64,
    /// The linear regressions' prior precision (relative to σ²). It only
    /// regularizes the noisy moments (their privacy does not depend on
    /// it); 1 is weak next to the n/R² a column's rows carry.
    pub linear_ridge: f64,
}

/// What a release produced.
#[derive(Debug, Clone, PartialEq)]
pub struct SequentialRelease {
    /// Per set, per column, the r synthetic values (codes as f64).
    pub sets: Vec<Vec<Vec<f64>>>,
    /// Per set, per column, the sanitized coefficients (logistic: β*,
    /// class-major; linear: the noisy moments). DP output.
    pub coefficients: Vec<Vec<Vec<f64>>>,
}

enum Mechanism {
    Logistic(LogisticMechanism),
    Linear(LinearMechanism),
}

impl Mechanism {
    fn record(&self, set: usize, eps: f64) -> MechanismRecord {
        match self {
            Mechanism::Logistic(m) => m.record(set, eps),
            Mechanism::Linear(m) => m.record(set, eps),
        }
    }
}

impl SequentialSpec {
    /// Predictors of column t's regression (the intercept included).
    pub fn dim(&self, t: usize) -> usize {
        1 + self.columns[..t].iter().map(SeqColumn::width).sum::<usize>()
    }

    /// The public checks, before anything is charged.
    pub fn check(&self, epsilon: f64) -> Result<()> {
        per_set_epsilon(epsilon, self.sets, true)?;
        if self.columns.is_empty() {
            return Err(DipsError::NoCells);
        }
        if self.rows == 0 {
            return Err(DipsError::NoRows);
        }
        let (lo, hi) = RIDGE_RANGE;
        for ridge in [self.ridge, self.linear_ridge] {
            if !(lo..=hi).contains(&ridge) {
                return Err(DipsError::Ridge(ridge));
            }
        }
        for (t, c) in self.columns.iter().enumerate() {
            let parameters = match c {
                SeqColumn::Categorical { name, levels } => {
                    if *levels < 2 {
                        return Err(DipsError::Levels { column: name.clone(), levels: *levels });
                    }
                    (*levels as usize - 1) * self.dim(t)
                }
                SeqColumn::Numeric { name, lo, hi } => {
                    check_bounds(|| name.clone(), *lo, *hi)?;
                    self.dim(t) + 1
                }
            };
            if parameters > MAX_PARAMETERS {
                return Err(DipsError::TooManyParameters {
                    column: c.name().to_string(),
                    parameters,
                    max: MAX_PARAMETERS,
                });
            }
        }
        Ok(())
    }

    fn mechanism(&self, t: usize) -> Mechanism {
        let dim = self.dim(t);
        match &self.columns[t] {
            SeqColumn::Categorical { name, levels } => Mechanism::Logistic(LogisticMechanism {
                name: format!("sequential-regression {name} | predecessors"),
                classes: *levels as usize,
                dim,
                ridge: self.ridge,
            }),
            SeqColumn::Numeric { name, .. } => Mechanism::Linear(LinearMechanism {
                name: format!("sequential-regression {name} | predecessors"),
                dim,
                ridge: self.linear_ridge,
            }),
        }
    }

    /// Column t's design over `cols` (column-major, complete rows, numeric
    /// values already in unit scale, [`SeqColumn::unit`]), dense: for the
    /// synthetic rows, whose number is public.
    fn design(&self, t: usize, cols: &[Vec<f64>], n: usize) -> Design {
        let dim = self.dim(t);
        let levels = self.column_levels(t);
        let scale = (1.0 + t as f64).sqrt().recip();
        let mut x = vec![0.0; n * dim];
        for (i, row) in x.chunks_exact_mut(dim).enumerate() {
            column_row(&levels, scale, cols, i, row);
        }
        Design { dim, x, weights: None, encoded: None }
    }

    /// Column t's design over the protected columns `cols` (all p of them,
    /// as [`SequentialSpec::design`]), its rows decoded on the fly: memory
    /// independent of the design's width, so the fit holds n·p values
    /// whatever the data (a dense design would hold n·dim).
    fn encoded_design(&self, t: usize, cols: &std::sync::Arc<Vec<Vec<f64>>>) -> Design {
        let rows = ColumnRows {
            levels: self.column_levels(t),
            columns: std::sync::Arc::clone(cols),
            scale: (1.0 + t as f64).sqrt().recip(),
        };
        Design { dim: self.dim(t), x: Vec::new(), weights: None, encoded: Some(Encoded::Columns(rows)) }
    }

    /// Levels (categorical) or `None` (numeric) of the columns before t.
    fn column_levels(&self, t: usize) -> Vec<Option<usize>> {
        self.columns[..t]
            .iter()
            .map(|c| match c {
                SeqColumn::Categorical { levels, .. } => Some(*levels as usize),
                SeqColumn::Numeric { .. } => None,
            })
            .collect()
    }
}

/// Fits the sequence on `data` (protected; column-major in the spec's
/// order, NaN for missing, categorical codes as f64), then releases m sets
/// of r synthetic rows (module docs).
pub fn sequential_regression(
    data: &[Vec<f64>],
    spec: &SequentialSpec,
    epsilon: f64,
    accountant: &mut dyn Accountant,
    rng: &mut DpRng,
) -> Result<SequentialRelease> {
    spec.check(epsilon)?;
    if data.len() != spec.columns.len() {
        return Err(DipsError::Columns { given: data.len(), expected: spec.columns.len() });
    }
    if data.windows(2).any(|w| w[0].len() != w[1].len()) {
        return Err(DipsError::RaggedColumns);
    }
    let p = spec.columns.len();
    let eps = epsilon / spec.sets as f64 / p as f64;
    let mechanisms: Vec<Mechanism> = (0..p).map(|t| spec.mechanism(t)).collect();
    // Every set's charge at once, before the data is looked at.
    let records: Vec<MechanismRecord> =
        (1..=spec.sets).flat_map(|set| mechanisms.iter().map(move |m| m.record(set, eps))).collect();
    accountant.charge(&records)?;
    // Complete rows, numeric values clamped (row-wise maps).
    let rows = data.first().map_or(0, Vec::len);
    let keep: Vec<usize> =
        (0..rows).filter(|&i| spec.columns.iter().zip(data).all(|(c, col)| c.valid(col[i]))).collect();
    let cols: Vec<Vec<f64>> = spec
        .columns
        .iter()
        .zip(data)
        .map(|(c, col)| {
            keep.iter().map(|&i| if let SeqColumn::Numeric { .. } = c { c.unit(col[i]) } else { col[i] }).collect()
        })
        .collect();
    let cols = std::sync::Arc::new(cols);
    let mut estimates = Vec::with_capacity(p);
    for (t, m) in mechanisms.iter().enumerate() {
        let design = spec.encoded_design(t, &cols);
        estimates.push(match m {
            Mechanism::Logistic(m) => {
                let y: Vec<u32> = cols[t].iter().map(|&v| v as u32).collect();
                m.estimate(&design, &y, eps)
            }
            Mechanism::Linear(m) => m.estimate(&design, &cols[t], eps),
        });
    }
    drop(cols);
    let r = spec.rows as usize;
    let mut release = SequentialRelease { sets: Vec::with_capacity(spec.sets), coefficients: Vec::new() };
    for _ in 0..spec.sets {
        let mut synth: Vec<Vec<f64>> = Vec::with_capacity(p);
        let mut coefficients = Vec::with_capacity(p);
        for (t, (m, est)) in mechanisms.iter().zip(&estimates).enumerate() {
            // Post-processing from here on.
            let design = spec.design(t, &synth, r);
            let column = match m {
                Mechanism::Logistic(m) => {
                    let noisy = m.noisy(rng, est, eps);
                    let beta = logistic_posterior_draw(rng, &design, m.classes, m.ridge, &noisy);
                    coefficients.push(noisy);
                    let mut prob = vec![0.0; m.classes];
                    (0..r)
                        .map(|i| {
                            probabilities(&beta, &design.x[i * m.dim..(i + 1) * m.dim], &mut prob);
                            sample_class(rng, &prob) as f64
                        })
                        .collect()
                }
                Mechanism::Linear(m) => {
                    let noisy = m.noisy(rng, est, eps);
                    let (beta, sigma) = m.posterior(&noisy, 1.0 + t as f64).draw(rng);
                    coefficients.push(noisy);
                    (0..r)
                        .map(|i| {
                            let x = &design.x[i * m.dim..(i + 1) * m.dim];
                            let mean: f64 = x.iter().zip(&beta).map(|(a, b)| a * b).sum();
                            (mean + sigma * standard_normal_sample(rng)).clamp(-1.0, 1.0)
                        })
                        .collect()
                }
            };
            synth.push(column);
        }
        // Back to the columns' own scales.
        for (c, col) in spec.columns.iter().zip(&mut synth) {
            if let SeqColumn::Numeric { lo, hi, .. } = c {
                let h = 0.5 * (hi - lo);
                col.iter_mut().for_each(|v| *v = (lo + h + h * *v).clamp(*lo, *hi));
            }
        }
        release.sets.push(synth);
        release.coefficients.push(coefficients);
    }
    Ok(release)
}

impl SequentialSpec {
    /// The spec of the table form: every column categorical with the
    /// table's sizes, in the table's order.
    pub fn categorical(names: &[String], sizes: &[usize], sets: usize, rows: u64, ridge: f64) -> Self {
        let columns = names
            .iter()
            .zip(sizes)
            .map(|(n, &k)| SeqColumn::Categorical { name: n.clone(), levels: u32::try_from(k).unwrap_or(u32::MAX) })
            .collect();
        Self { columns, sets, rows, ridge, linear_ridge: 1.0 }
    }

    /// Decodes pattern q of columns 0..t (row-major, the last fastest) into
    /// column t's design row.
    fn pattern_row(&self, t: usize, q: usize, out: &mut [f64]) {
        one_hot_row(&self.levels(t), (1.0 + t as f64).sqrt().recip(), q, out);
    }

    /// Levels of the columns before t (categorical columns only).
    fn levels(&self, t: usize) -> Vec<usize> {
        self.columns[..t].iter().map(|c| c.width() + 1).collect()
    }
}

/// The sequential synthesizer over the full cross-tabulation of categorical
/// columns (`dpflow synth --mechanism sequential-regression`,
/// [`super::release`]): `counts` (protected) is the table, row-major with
/// the last column fastest.
///
/// A categorical regression's loss is a sum over rows that only depends on
/// each row's cell, so it is the same sum weighted by the counts of the
/// prefix marginal (columns 0..=t): the fit needs no row-level data and one
/// row still moves one count by 1 (module docs). Instead of drawing rows
/// column by column, each set returns its joint distribution
/// P(x) = Π_t P(x_t | x_<t) over the cells, from which the caller draws r
/// rows: the same distribution. The posterior draws use the expected
/// synthetic predictors, r·P(x_<t), for the Hessian; with `spec.rows` = 0
/// there is no draw and each set plugs in its noisy β* (one set: the
/// synthesizer interface, which has no row count).
pub fn sequential_table(
    counts: &[u64],
    spec: &SequentialSpec,
    epsilon: f64,
    accountant: &mut dyn Accountant,
    rng: &mut DpRng,
) -> Result<Vec<Vec<f64>>> {
    let check = SequentialSpec { rows: spec.rows.max(1), ..spec.clone() };
    check.check(epsilon)?;
    let mut sizes = Vec::with_capacity(spec.columns.len());
    for c in &spec.columns {
        match c {
            SeqColumn::Categorical { levels, .. } => sizes.push(*levels as usize),
            SeqColumn::Numeric { name, .. } => return Err(DipsError::NotCategorical(name.clone())),
        }
    }
    let cells: usize = sizes.iter().product();
    if counts.len() != cells {
        return Err(DipsError::Columns { given: counts.len(), expected: cells });
    }
    let p = sizes.len();
    let eps = epsilon / spec.sets as f64 / p as f64;
    let mechanisms: Vec<LogisticMechanism> = (0..p)
        .map(|t| match spec.mechanism(t) {
            Mechanism::Logistic(m) => m,
            Mechanism::Linear(_) => unreachable!("every column is categorical"),
        })
        .collect();
    let records: Vec<MechanismRecord> =
        (1..=spec.sets).flat_map(|set| mechanisms.iter().map(move |m| m.record(set, eps))).collect();
    accountant.charge(&records)?;
    // Designs over the predecessor patterns: one row per (pattern, level).
    let mut estimates = Vec::with_capacity(p);
    let mut prefix = 1usize;
    for (t, m) in mechanisms.iter().enumerate() {
        let k = sizes[t];
        let block = cells / (prefix * k);
        // One (pattern, level) row per occupied prefix cell: an index, a
        // label and a count, decoded on the fly (memory independent of dim).
        let (mut patterns, mut y, mut w) = (Vec::new(), Vec::new(), Vec::new());
        for q in 0..prefix {
            for level in 0..k {
                let j = q * k + level;
                let c: u64 = counts[j * block..(j + 1) * block].iter().sum();
                if c > 0 {
                    patterns.push(q);
                    y.push(level as u32);
                    w.push(c as f64);
                }
            }
        }
        let one_hot = OneHot { levels: spec.levels(t), scale: (1.0 + t as f64).sqrt().recip(), patterns };
        let design = Design { dim: m.dim, x: Vec::new(), weights: Some(w), encoded: Some(Encoded::OneHot(one_hot)) };
        estimates.push(m.estimate(&design, &y, eps));
        prefix *= k;
    }
    let mut out = Vec::with_capacity(spec.sets);
    for _ in 0..spec.sets {
        // Post-processing from here on.
        let mut joint = vec![1.0];
        for (t, (m, est)) in mechanisms.iter().zip(&estimates).enumerate() {
            let k = sizes[t];
            let noisy = m.noisy(rng, est, eps);
            let beta = if spec.rows > 0 {
                // The expected synthetic predictors r·P(x_<t), row by row.
                let r = spec.rows as f64;
                let h = logistic_hessian_rows(m.dim, joint.len(), m.classes, m.ridge, &noisy, |q, row| {
                    spec.pattern_row(t, q, row);
                    joint[q] * r
                });
                gaussian_draw(rng, &noisy, &h)
            } else {
                noisy
            };
            let mut next = vec![0.0; joint.len() * k];
            let mut prob = vec![0.0; k];
            let mut row = vec![0.0; m.dim];
            for (q, &pq) in joint.iter().enumerate() {
                spec.pattern_row(t, q, &mut row);
                probabilities(&beta, &row, &mut prob);
                next[q * k..(q + 1) * k].iter_mut().zip(&prob).for_each(|(n, &p)| *n = pq * p);
            }
            joint = next;
        }
        out.push(joint);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rand::RngExt;

    use super::*;
    use crate::measure::ReleaseAccountant;
    use crate::privacy::{Budget, PrivacyFilter, PrivacyLoss};

    fn spec() -> SequentialSpec {
        SequentialSpec {
            columns: vec![
                SeqColumn::Numeric { name: "z".into(), lo: -4.0, hi: 4.0 },
                SeqColumn::Categorical { name: "w1".into(), levels: 2 },
                SeqColumn::Categorical { name: "w2".into(), levels: 3 },
            ],
            sets: 4,
            rows: 300,
            ridge: 5.0,
            linear_ridge: 1.0,
        }
    }

    fn data(rng: &mut DpRng, n: usize) -> Vec<Vec<f64>> {
        let z: Vec<f64> = (0..n).map(|_| standard_normal_sample(rng)).collect();
        // w1 = 1 when z > 0.5; w2 = w1 + 1 when z > 1, else 0.
        let w1: Vec<f64> = z.iter().map(|&v| f64::from(u8::from(v > 0.5))).collect();
        let w2: Vec<f64> = z.iter().zip(&w1).map(|(&v, &w)| if v > 1.0 { w + 1.0 } else { 0.0 }).collect();
        vec![z, w1, w2]
    }

    #[test]
    fn it_spends_exactly_its_budget_and_stays_in_the_domain() {
        let mut rng = DpRng::unsafe_seeded(1);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 2.0 }));
        let mut d = data(&mut rng, 500);
        d[0][3] = f64::NAN;
        d[2][4] = 7.0;
        let rel = sequential_regression(&d, &spec(), 2.0, &mut acc, &mut rng).unwrap();
        let spent: f64 =
            acc.records().iter().map(|r| if let PrivacyLoss::Pure { epsilon } = r.loss { epsilon } else { 0.0 }).sum();
        assert!((spent - 2.0).abs() < 1e-12, "{spent}");
        assert_eq!(acc.records().len(), 12);
        assert_eq!(rel.sets.len(), 4);
        for s in &rel.sets {
            assert!(s.iter().all(|c| c.len() == 300));
            assert!(s[0].iter().all(|v| (-4.0..=4.0).contains(v)));
            assert!(s[1].iter().all(|&v| v == 0.0 || v == 1.0));
            assert!(s[2].iter().all(|&v| v == 0.0 || v == 1.0 || v == 2.0));
        }
    }

    /// With negligible noise and a weak prior the synthetic data keep the
    /// structure: the mean of z, P(w1 = 1) and the z–w1 association
    /// (w1 = 1 rows have larger z), within stated tolerances.
    #[test]
    fn with_little_noise_the_synthetic_data_keep_the_structure() {
        let mut rng = DpRng::unsafe_seeded(2);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1e9 }));
        let d = data(&mut rng, 4000);
        let s = SequentialSpec { sets: 1, rows: 4000, ridge: 1e-3, linear_ridge: 1e-3, ..spec() };
        let rel = sequential_regression(&d, &s, 1e8, &mut acc, &mut rng).unwrap();
        let set = &rel.sets[0];
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let p1 = mean(&set[1]);
        let truth = mean(&d[1]);
        assert!((mean(&set[0]) - mean(&d[0])).abs() < 0.1, "{} vs {}", mean(&set[0]), mean(&d[0]));
        // P(z > 0.5) ≈ 0.31; the logistic fit of a step is smooth but its
        // marginal matches (binomial sd ≈ 0.007 on 4000 rows plus the draw).
        assert!((p1 - truth).abs() < 0.04, "{p1} vs {truth}");
        let z_by = |w: f64| {
            let v: Vec<f64> = set[0].iter().zip(&set[1]).filter(|(_, b)| **b == w).map(|(a, _)| *a).collect();
            mean(&v)
        };
        assert!(z_by(1.0) - z_by(0.0) > 1.0, "{} vs {}", z_by(1.0), z_by(0.0));
    }

    #[test]
    fn bad_public_inputs_are_refused_before_any_charge() {
        let mut rng = DpRng::unsafe_seeded(1);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1.0 }));
        let d = data(&mut rng, 10);
        let wide = SeqColumn::Categorical { name: "wide".into(), levels: 600 };
        for s in [
            SequentialSpec { columns: vec![], ..spec() },
            SequentialSpec { sets: 0, ..spec() },
            SequentialSpec { rows: 0, ..spec() },
            SequentialSpec { ridge: 0.0, ..spec() },
            SequentialSpec { linear_ridge: f64::NAN, ..spec() },
            SequentialSpec { columns: vec![SeqColumn::Categorical { name: "c".into(), levels: 1 }], ..spec() },
            SequentialSpec { columns: vec![SeqColumn::Numeric { name: "x".into(), lo: 1.0, hi: 1.0 }], ..spec() },
            SequentialSpec { columns: vec![wide.clone(), wide], ..spec() },
        ] {
            assert!(sequential_regression(&d, &s, 1.0, &mut acc, &mut rng).is_err(), "{s:?}");
        }
        assert!(sequential_regression(&d[..2], &spec(), 1.0, &mut acc, &mut rng).is_err());
        let mut ragged = d.clone();
        ragged[1].pop();
        assert!(sequential_regression(&ragged, &spec(), 1.0, &mut acc, &mut rng).is_err());
        let tiny = SequentialSpec { ridge: 1e-310, ..spec() };
        assert!(sequential_regression(&d, &tiny, 1.0, &mut acc, &mut rng).is_err(), "a subnormal ridge");
        assert!(acc.records().is_empty());
    }

    /// The table form fits what the row form fits: with negligible noise,
    /// its P(a, b) is the empirical joint (b on one-hot a is saturated) and
    /// its P(c | a, b) the main-effects logistic fit on the rows themselves
    /// (ridge 10⁻⁴, 2000 rows of three categorical columns).
    #[test]
    fn the_table_form_matches_the_rows() {
        let mut rng = DpRng::unsafe_seeded(4);
        let sizes = [3usize, 2, 4];
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let mut counts = vec![0u64; 24];
        let mut cols = vec![Vec::new(); 3];
        for _ in 0..2000 {
            let a = rng.random_range(0..3usize);
            let b = usize::from(rng.random::<f64>() < 0.2 + 0.3 * a as f64);
            let c = (a + b + rng.random_range(0..2usize)) % 4;
            counts[(a * 2 + b) * 4 + c] += 1;
            for (col, v) in cols.iter_mut().zip([a, b, c]) {
                col.push(v as f64);
            }
        }
        let spec = SequentialSpec::categorical(&names, &sizes, 1, 0, 1e-4);
        let mut acc = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1e9 }));
        let joint = sequential_table(&counts, &spec, 1e8, &mut acc, &mut rng).unwrap().remove(0);
        assert!((joint.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // (a, b): b's regression on one-hot a is saturated, so P(a, b) is
        // the empirical joint up to the ridge and the grid noise.
        for ab in 0..6 {
            let p: f64 = joint[ab * 4..(ab + 1) * 4].iter().sum();
            let e = counts[ab * 4..(ab + 1) * 4].iter().sum::<u64>() as f64 / 2000.0;
            assert!((p - e).abs() < 1e-3, "(a, b) = {ab}: {p} vs {e}");
        }
        // c | a, b: the main-effects fit on the rows themselves.
        let r = 3f64.sqrt().recip();
        let x: Vec<f64> = (0..2000)
            .flat_map(|i| {
                let (a, b) = (cols[0][i] as usize, cols[1][i]);
                [r, if a == 1 { r } else { 0.0 }, if a == 2 { r } else { 0.0 }, b * r]
            })
            .collect();
        let y: Vec<u32> = cols[2].iter().map(|&v| v as u32).collect();
        let design = Design { dim: 4, x, weights: None, encoded: None };
        let beta = crate::synth::dips::regression::fit_logistic(&design, &y, 4, 1e-4, 1e-10).unwrap();
        let mut prob = vec![0.0; 4];
        for ab in 0..6 {
            let mut row = vec![0.0; 4];
            spec.pattern_row(2, ab, &mut row);
            probabilities(&beta, &row, &mut prob);
            let pab: f64 = joint[ab * 4..(ab + 1) * 4].iter().sum();
            for c in 0..4 {
                let got = joint[ab * 4 + c] / pab;
                assert!((got - prob[c]).abs() < 1e-3, "c = {c} | {ab}: {got} vs {}", prob[c]);
            }
        }
        // Rows with the same public inputs charge the same.
        let mut acc2 = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon: 1e9 }));
        let row_spec = SequentialSpec { rows: 10, ..spec.clone() };
        sequential_regression(&cols, &row_spec, 1e8, &mut acc2, &mut rng).unwrap();
        assert_eq!(acc.records().len(), acc2.records().len());
    }

    /// Pattern rows decode the predecessors' cell index (row-major, the
    /// last column fastest) into one-hot blocks after the intercept.
    #[test]
    fn pattern_rows_decode_the_cell_index() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let spec = SequentialSpec::categorical(&names, &[3, 2, 4], 1, 0, 1.0);
        let mut row = vec![0.0; spec.dim(2)];
        // Pattern (a = 2, b = 1) = 2·2 + 1 = 5: [1, a=1?0, a=2?1, b=1?1] / √3.
        spec.pattern_row(2, 5, &mut row);
        let r = 3f64.sqrt().recip();
        assert_eq!(row, vec![r, 0.0, r, r]);
        spec.pattern_row(2, 0, &mut row);
        assert_eq!(row, vec![r, 0.0, 0.0, 0.0]);
    }
}
