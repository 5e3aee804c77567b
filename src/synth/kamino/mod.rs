//! Kamino and KaminoI: column-wise synthesis with one private classifier per
//! attribute, and (KaminoI) imputation of each attribute's missing cells with
//! its own classifier before the next one learns (000 §4.2 Alg 3; Ge et al.
//! 2021 for Kamino's sequence of intermediate models).
//!
//! **Algorithm** (000 Alg 3, without denial constraints).
//! 1. *Counts.* The number of rows, of complete rows and of nulls per
//!    column are measured once with discrete Gaussian noise (one vector; a
//!    row adds 1 to the rows and 1 to the complete rows or to each of its
//!    null columns, so its L2 sensitivity is √(p+1)).
//!    They fix the sequence and the batch sizes; nothing else reads them.
//! 2. *Sequence S.* By the noisy missing share, most complete first
//!    ([`KaminoOrder::CompleteFirst`], the default), or most missing first, or
//!    the domain's order. 000 §4.2 says "decreasing percentage of missing
//!    values" but argues that "an attribute with many missing values
//!    positioned early" imputes badly; most-complete-first follows the
//!    argument, and `--kamino-order missing-first` the words.
//! 3. *First attribute* (Alg 3 lines 3–5): its histogram over the non-null
//!    cells with discrete Gaussian noise, clamped at 0 and normalised: H*.
//!    KaminoI fills the first attribute's nulls by draws from H*.
//! 4. *Each next attribute* Y = S_j (lines 6–10): an MLP (one-hot of
//!    S_1..S_{j−1} → hidden ReLU layer → softmax over Y's levels) trained
//!    with DP-SGD ([`crate::neural::dpsgd`]) on the rows where Y is observed
//!    (KaminoI; the earlier attributes are complete by then) or on the
//!    complete rows (Kamino, the complete-row baseline). KaminoI then fills
//!    Y's nulls with draws from the classifier's predicted distribution
//!    (line 9; a draw rather than the most likely level, so the filled cells
//!    keep the conditional spread).
//! 5. *Synthesis* (post-processing): S_1 from H*, each next attribute drawn
//!    from its classifier given the synthetic attributes before it.
//!
//! **Privacy** (add/remove-one neighbours). Steps 1, 3 and each DP-SGD run
//! are Gaussian mechanisms, the last ones Poisson-subsampled. The DP-SGD
//! schedules (q, T) and the classifiers' σ depend on the noisy counts, so
//! the composition is a Rényi filter at one order α* fixed from (ε, δ)
//! alone before anything is read ([`crate::privacy::convert::public_order`];
//! Feldman & Zrnic 2021: mechanisms chosen adaptively whose RDP at α* always
//! sums to at most τ(α*) are together (α*, τ)-RDP), and τ(α*) is the RDP
//! that converts to exactly (ε, δ) at α* ([`crate::privacy::rdp::tau_at`]).
//! Imputation and synthesis read only the
//! released models, public settings and each row's own cells, so after any
//! imputation two neighbouring tables still differ in one row: every later
//! DP-SGD run sees neighbouring inputs. The noisy counts and the sequence are
//! released already and may drive the batch sizes and step counts. Budget
//! split: the counts get 2% and the first histogram 1/p of the budget's
//! zCDP equivalent ρ(ε, δ) (Alg 3's ε₁); the classifiers share one noise
//! multiplier σ, the smallest for which the total at α* stays within τ(α*)
//! — so a run spends its budget exactly, never more.

pub mod release;

use ndarray::{Array2, Axis};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::neural::dpsgd::{DpSgdConfig, DpSgdError, train_classifier};
use crate::neural::mlp::{Activation, Mlp, softmax};
use crate::privacy::convert::{cdp_rho, public_order};
use crate::privacy::rdp::{
    RdpError, calibrate_noise_multiplier, compose, epsilon, gaussian_curve, sampled_discrete_gaussian_curve, tau_at,
};
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::discrete::DiscreteGaussian;

/// Share of ρ(ε, δ) for the counts (step 1).
pub const COUNTS_SHARE: f64 = 0.02;

/// The largest classifier (parameters) a run accepts: a step holds
/// [`crate::neural::dpsgd::CHUNK`] per-example gradients of this size.
pub const MAX_PARAMETERS: usize = 1 << 20;

/// The order of the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum KaminoOrder {
    /// By noisy missing share, most complete first (module docs).
    #[default]
    CompleteFirst,
    /// By noisy missing share, most missing first (000 §4.2's wording).
    MissingFirst,
    /// The domain's column order.
    Domain,
}

/// Public settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KaminoOptions {
    /// KaminoI (impute each attribute's nulls) rather than Kamino on complete rows.
    pub impute: bool,
    /// Attribute order.
    pub order: KaminoOrder,
    /// Hidden units of each classifier.
    pub hidden: usize,
    /// Passes over the (noisy) eligible rows per classifier.
    pub epochs: f64,
    /// Expected batch size.
    pub batch: f64,
    /// Clipping norm.
    pub clip: f64,
    /// Adam learning rate.
    pub learning_rate: f64,
}

impl Default for KaminoOptions {
    fn default() -> Self {
        Self {
            impute: true,
            order: KaminoOrder::CompleteFirst,
            hidden: 64,
            epochs: 2.0,
            batch: 512.0,
            clip: 1.0,
            learning_rate: 0.01,
        }
    }
}

/// Why a Kamino run cannot start or failed.
#[derive(Debug, thiserror::Error)]
pub enum KaminoError {
    /// A setting out of range.
    #[error("kamino setting {name} = {value} is out of range: {hint}")]
    Setting {
        /// Which.
        name: &'static str,
        /// Its value.
        value: f64,
        /// What to give.
        hint: &'static str,
    },
    /// Fewer than two columns.
    #[error("kamino needs at least two columns (got {0}): for one column use a histogram mechanism")]
    Columns(usize),
    /// A classifier above the cap.
    #[error(
        "the classifier for column {column} would have {params} parameters, above the cap of {max}: \
         coarsen the domain's bins or lower --kamino-hidden"
    )]
    TooLarge {
        /// Column name.
        column: String,
        /// Its parameters.
        params: usize,
        /// The cap.
        max: usize,
    },
    /// A budget too small for the counts, the histogram and the classifiers.
    #[error(
        "a budget of ε = {epsilon}, δ = {delta} is too small for kamino: the row counts and the first histogram \
         would leave the classifiers almost nothing; give a larger ε (or δ)"
    )]
    BudgetTooSmall {
        /// ε.
        epsilon: f64,
        /// δ.
        delta: f64,
    },
    /// The accountant refused.
    #[error(transparent)]
    Accounting(#[from] RdpError),
    /// DP-SGD refused a setting.
    #[error(transparent)]
    Training(#[from] DpSgdError),
}

/// The protected input: codes per column (column-major, `sizes[c]`
/// non-null levels, `size` itself the null code of a nullable column).
#[derive(Debug, Clone)]
pub struct CodedTable {
    /// Column names (for messages).
    pub names: Vec<String>,
    /// Non-null levels per column.
    pub sizes: Vec<usize>,
    /// Codes, one vector per column.
    pub columns: Vec<Vec<u32>>,
}

impl CodedTable {
    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.columns.first().map_or(0, Vec::len)
    }

    /// Whether cell (column c, row r) is null.
    pub(crate) fn is_null(&self, c: usize, r: usize) -> bool {
        self.columns[c][r] as usize >= self.sizes[c]
    }
}

/// The released model: post-processing of DP output, safe to publish.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KaminoModel {
    /// The attribute sequence (column indices).
    pub order: Vec<usize>,
    /// Non-null levels per column (domain order).
    pub sizes: Vec<usize>,
    /// H*: the first attribute's noisy distribution.
    pub first: Vec<f64>,
    /// The classifiers of order[1..], in order.
    pub models: Vec<Mlp>,
    /// Noisy number of rows.
    pub rows: f64,
}

/// What a fit spent and how (all DP output or public).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KaminoFit {
    /// The model.
    pub model: KaminoModel,
    /// The whole run's RDP at the order α* it is charged at: one point.
    pub curve: Vec<(f64, f64)>,
    /// ε of that point at the budget's δ (≤ the budget's ε).
    pub epsilon: f64,
    /// Noise multiplier of the counts.
    pub counts_sigma: f64,
    /// Noise multiplier of the first histogram.
    pub first_sigma: f64,
    /// The classifiers' common noise multiplier.
    pub sgd_sigma: f64,
    /// Per classifier: its DP-SGD schedule.
    pub schedule: Vec<Schedule>,
}

/// One classifier's DP-SGD schedule (from public settings and noisy counts).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Poisson sampling rate q.
    pub rate: f64,
    /// Steps.
    pub steps: u64,
    /// Expected batch size (q times the noisy eligible rows).
    pub batch: f64,
}

/// Refuses a budget whose counts and first histogram alone would use more
/// than 90% of τ(α*) (module docs, Privacy; τ ≤ 0 when ε·δ is so small that
/// the best order passes 2²⁰): the classifiers could not be calibrated, and
/// the run would fail after the read (public inputs only).
pub fn check_budget(epsilon_budget: f64, delta: f64, columns: usize) -> Result<(), KaminoError> {
    if !leaves_room(epsilon_budget, delta, COUNTS_SHARE + 1.0 / columns as f64) {
        return Err(KaminoError::BudgetTooSmall { epsilon: epsilon_budget, delta });
    }
    Ok(())
}

/// Whether Gaussian mechanisms taking `share` of ρ(ε, δ) before the DP-SGD
/// runs leave them room: at most 90% of τ(α*) (public inputs only; also the
/// GANs' rule, [`crate::synth::gan::check_budget`]).
pub(crate) fn leaves_room(epsilon_budget: f64, delta: f64, share: f64) -> bool {
    let rho = cdp_rho(epsilon_budget, delta);
    let alpha = public_order(epsilon_budget, delta);
    let fixed = alpha * rho * share;
    let tau = tau_at(epsilon_budget, delta, alpha);
    !(fixed.is_nan() || tau.is_nan() || fixed > 0.9 * tau)
}

impl KaminoOptions {
    /// Checks the settings and the classifiers' sizes (public).
    pub fn check(&self, names: &[String], sizes: &[usize]) -> Result<(), KaminoError> {
        let bad = |name, value, hint| Err(KaminoError::Setting { name, value, hint });
        if sizes.len() < 2 {
            return Err(KaminoError::Columns(sizes.len()));
        }
        if self.hidden == 0 || self.hidden > 4096 {
            return bad("hidden", self.hidden as f64, "give 1–4096 hidden units (64 is usual)");
        }
        if !(self.epochs > 0.0 && self.epochs <= 1000.0) {
            return bad("epochs", self.epochs, "give a positive number of passes up to 1000");
        }
        if !(self.batch >= 1.0 && self.batch.is_finite()) {
            return bad("batch", self.batch, "give an expected batch size of at least 1");
        }
        if !(1e-6..=1e6).contains(&self.clip) {
            return bad("clip", self.clip, "give a clipping norm between 1e-6 and 1e6 (1 is usual)");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad("learning_rate", self.learning_rate, "give a positive learning rate");
        }
        // The largest classifier whatever the order: the widest target on all other inputs.
        let total: usize = sizes.iter().sum();
        for (c, &k) in sizes.iter().enumerate() {
            let params = (total - k) * self.hidden + self.hidden + self.hidden * k + k;
            if params > MAX_PARAMETERS {
                return Err(KaminoError::TooLarge { column: names[c].clone(), params, max: MAX_PARAMETERS });
            }
        }
        Ok(())
    }
}

/// Noise multiplier of a standalone Gaussian mechanism with zCDP ρ.
pub(crate) fn sigma_for_rho(rho: f64) -> f64 {
    (1.0 / (2.0 * rho)).sqrt()
}

/// Fits the model on `table` within (ε, δ) (module docs). `progress`
/// hears public lines (column names, steps).
pub fn fit(
    mut table: CodedTable,
    options: &KaminoOptions,
    epsilon_budget: f64,
    delta: f64,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
) -> Result<KaminoFit, KaminoError> {
    options.check(&table.names, &table.sizes)?;
    check_budget(epsilon_budget, delta, table.sizes.len())?;
    let p = table.sizes.len();
    let n = table.rows();
    let rho = cdp_rho(epsilon_budget, delta);
    let counts_sigma = sigma_for_rho(COUNTS_SHARE * rho);
    let first_sigma = sigma_for_rho(rho / p as f64);
    // The one order the run is charged at, fixed before anything is read
    // (module docs, Privacy): the classifiers' schedules depend on the noisy
    // counts, so their σ is calibrated against a Rényi filter at α*.
    let alpha_star = public_order(epsilon_budget, delta);
    let at = [alpha_star];
    let fixed = compose(&[gaussian_curve(counts_sigma, &at)?, gaussian_curve(first_sigma, &at)?])?;

    // 1. Counts: rows, complete rows, nulls per column. A row adds 1 to the
    // rows and either 1 to the complete rows or 1 to each of its k ≥ 1 null
    // columns: L2 sensitivity √(p+1).
    let mut exact = vec![0i128; p + 2];
    exact[0] = n as i128;
    for r in 0..n {
        let mut complete = true;
        for c in 0..p {
            if table.is_null(c, r) {
                exact[2 + c] += 1;
                complete = false;
            }
        }
        exact[1] += i128::from(complete);
    }
    // (Rounded up past the product's float error: never less noise.)
    let counts_noise =
        DiscreteGaussian::from_sigma(counts_sigma * ((p + 1) as f64).sqrt() * (1.0 + 1e-12)).expect("positive σ");
    let noisy: Vec<f64> = exact.iter().map(|&v| (v + counts_noise.sample(rng)) as f64).collect();
    drop(exact);
    let rows_hat = noisy[0].max(1.0);
    let complete_hat = noisy[1].clamp(1.0, rows_hat);
    let missing: Vec<f64> = (0..p).map(|c| (noisy[2 + c] / rows_hat).clamp(0.0, 1.0)).collect();

    // 2. Sequence.
    let mut order: Vec<usize> = (0..p).collect();
    match options.order {
        KaminoOrder::Domain => {}
        KaminoOrder::CompleteFirst => order.sort_by(|&a, &b| missing[a].total_cmp(&missing[b]).then(a.cmp(&b))),
        KaminoOrder::MissingFirst => order.sort_by(|&a, &b| missing[b].total_cmp(&missing[a]).then(a.cmp(&b))),
    }

    // The classifiers' schedule from the noisy counts, then one σ for all.
    let schedule: Vec<Schedule> = order[1..]
        .iter()
        .map(|&c| {
            let eligible = if options.impute { (rows_hat * (1.0 - missing[c])).max(1.0) } else { complete_hat };
            let batch = options.batch.min(eligible);
            let steps = (options.epochs * eligible / batch).ceil().clamp(1.0, 1e6) as u64;
            Schedule { rate: batch / eligible, steps, batch }
        })
        .collect();
    let models_curve = |s: f64| -> Result<Vec<(f64, f64)>, RdpError> {
        let mut parts = vec![fixed.clone()];
        for sch in &schedule {
            parts.push(sampled_discrete_gaussian_curve(sch.rate, s, sch.steps, &at)?);
        }
        compose(&parts)
    };
    // At the single order α*, "converts to at most ε" is "total ≤ τ(α*)".
    let sgd_sigma = calibrate_noise_multiplier(epsilon_budget, delta, models_curve)?;
    let curve = models_curve(sgd_sigma)?;
    let spent = epsilon(&curve, delta).0;
    debug_assert!(curve[0].1 <= tau_at(epsilon_budget, delta, alpha_star) * (1.0 + 1e-9) || spent <= epsilon_budget);
    progress(&format!(
        "kamino: order {}; classifiers with noise multiplier {sgd_sigma:.3}",
        order.iter().map(|&c| table.names[c].as_str()).collect::<Vec<_>>().join(", ")
    ));

    let complete_rows: Vec<u32> = if options.impute {
        Vec::new()
    } else {
        (0..n).filter(|&r| (0..p).all(|c| !table.is_null(c, r))).map(|r| r as u32).collect()
    };

    // 3. The first attribute's histogram.
    let s1 = order[0];
    let mut hist = vec![0i128; table.sizes[s1]];
    let count_row = |r: usize, hist: &mut Vec<i128>| {
        if !table.is_null(s1, r) {
            hist[table.columns[s1][r] as usize] += 1;
        }
    };
    if options.impute {
        (0..n).for_each(|r| count_row(r, &mut hist));
    } else {
        complete_rows.iter().for_each(|&r| count_row(r as usize, &mut hist));
    }
    let first_noise = DiscreteGaussian::from_sigma(first_sigma).expect("positive σ");
    let mut first: Vec<f64> = hist.iter().map(|&v| ((v + first_noise.sample(rng)) as f64).max(0.0)).collect();
    drop(hist);
    normalise(&mut first);
    if options.impute {
        for r in 0..n {
            if table.is_null(s1, r) {
                table.columns[s1][r] = draw(rng, &first) as u32;
            }
        }
    }

    // 4. The classifiers.
    let mut models = Vec::with_capacity(p - 1);
    for (j, sch) in schedule.iter().enumerate() {
        let steps = sch.steps;
        let target = order[j + 1];
        let prev = &order[..=j];
        // Complete rows are the same for every classifier: borrowed, not copied.
        let eligible: std::borrow::Cow<[u32]> = if options.impute {
            (0..n).filter(|&r| !table.is_null(target, r)).map(|r| r as u32).collect::<Vec<u32>>().into()
        } else {
            complete_rows.as_slice().into()
        };
        let width: usize = prev.iter().map(|&c| table.sizes[c]).sum();
        let mut model = Mlp::new(&[width, options.hidden, table.sizes[target]], Activation::Relu, rng);
        let cfg = DpSgdConfig {
            clip: options.clip,
            noise_multiplier: sgd_sigma,
            sampling_rate: sch.rate,
            expected_batch: sch.batch,
            steps,
            learning_rate: options.learning_rate,
        };
        let tab = &table;
        let batch_of = |rows: &[usize]| {
            let rows: Vec<usize> = rows.iter().map(|&i| eligible[i] as usize).collect();
            let x = features(tab, prev, &rows);
            let y = rows.iter().map(|&r| tab.columns[target][r] as usize).collect();
            (x, y)
        };
        let name = &table.names[target];
        let report = (steps / 4).max(1);
        train_classifier(&mut model, eligible.len(), batch_of, &cfg, rng, |s| {
            if s % report == 0 || s == steps {
                progress(&format!("kamino: column {} of {} ({name}): step {s}/{steps}", j + 2, p));
            }
        })?;
        drop(eligible);
        if options.impute {
            let prev = prev.to_vec();
            impute_with(&mut table, target, &prev, &model, rng);
        }
        models.push(model);
    }
    Ok(KaminoFit {
        model: KaminoModel { order, sizes: table.sizes.clone(), first, models, rows: rows_hat },
        curve,
        epsilon: spent,
        counts_sigma,
        first_sigma,
        sgd_sigma,
        schedule,
    })
}

/// KaminoI's line 9: fills the null cells of column `target` with draws from
/// `model`'s predicted distribution given the (complete) columns `prev`;
/// observed cells are never touched.
fn impute_with<R: Rng + ?Sized>(table: &mut CodedTable, target: usize, prev: &[usize], model: &Mlp, rng: &mut R) {
    let nulls: Vec<usize> = (0..table.rows()).filter(|&r| table.is_null(target, r)).collect();
    for chunk in nulls.chunks(8192) {
        let probs = softmax(model.predict(features(table, prev, chunk).view()).view());
        for (row, &r) in probs.axis_iter(Axis(0)).zip(chunk) {
            table.columns[target][r] = draw(rng, row.as_slice().expect("contiguous")) as u32;
        }
    }
}

/// One-hot features of `rows` over the columns `prev` (all non-null).
fn features(table: &CodedTable, prev: &[usize], rows: &[usize]) -> Array2<f64> {
    let width: usize = prev.iter().map(|&c| table.sizes[c]).sum();
    let mut x = Array2::zeros((rows.len(), width));
    for (i, &r) in rows.iter().enumerate() {
        let mut off = 0;
        for &c in prev {
            x[[i, off + table.columns[c][r] as usize]] = 1.0;
            off += table.sizes[c];
        }
    }
    x
}

pub(crate) use dpflow_udfs::synth::generator::{draw, normalise};

impl KaminoModel {
    /// `rows` synthetic rows, column-major codes in the domain's order
    /// (post-processing: no data).
    pub fn sample<R: Rng + ?Sized>(&self, rows: usize, rng: &mut R) -> Vec<Vec<u32>> {
        let p = self.sizes.len();
        let mut cols = vec![Vec::new(); p];
        cols[self.order[0]] = (0..rows).map(|_| draw(rng, &self.first) as u32).collect();
        let mut table = CodedTable { names: Vec::new(), sizes: self.sizes.clone(), columns: cols };
        for (j, model) in self.models.iter().enumerate() {
            let target = self.order[j + 1];
            let prev = &self.order[..=j];
            let mut out = Vec::with_capacity(rows);
            let all: Vec<usize> = (0..rows).collect();
            for chunk in all.chunks(8192) {
                let probs = softmax(model.predict(features(&table, prev, chunk).view()).view());
                out.extend(probs.axis_iter(Axis(0)).map(|row| draw(rng, row.as_slice().expect("contiguous")) as u32));
            }
            table.columns[target] = out;
        }
        table.columns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neural::mlp::unit;
    use dpflow_udfs::noise::DpRng;

    /// Three columns: a ∈ {0,1,2}; b = a mod 2 with prob. 0.95; c = b with
    /// prob. 0.9. `null_rate` of b's and c's cells are masked (MCAR).
    fn chain(rng: &mut DpRng, n: usize, null_rate: f64) -> CodedTable {
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let x = (unit(rng) * 3.0) as u32;
            let y = if unit(rng) < 0.95 { x % 2 } else { 1 - x % 2 };
            let z = if unit(rng) < 0.9 { y } else { 1 - y };
            a.push(x);
            b.push(if unit(rng) < null_rate { 2 } else { y });
            c.push(if unit(rng) < null_rate { 2 } else { z });
        }
        CodedTable { names: vec!["a".into(), "b".into(), "c".into()], sizes: vec![3, 2, 2], columns: vec![a, b, c] }
    }

    fn agreement(cols: &[Vec<u32>]) -> (f64, f64) {
        let n = cols[0].len() as f64;
        let ab = cols[0].iter().zip(&cols[1]).filter(|&(&x, &y)| x % 2 == y).count() as f64 / n;
        let bc = cols[1].iter().zip(&cols[2]).filter(|&(&y, &z)| y == z).count() as f64 / n;
        (ab, bc)
    }

    #[test]
    fn kaminoi_spends_exactly_its_budget_and_learns_the_chain() {
        let mut rng = DpRng::unsafe_seeded(7);
        let table = chain(&mut rng, 6000, 0.2);
        let opts = KaminoOptions { epochs: 3.0, batch: 256.0, hidden: 16, ..Default::default() };
        let fit = fit(table, &opts, 4.0, 1e-6, &mut rng, &|_| {}).unwrap();
        assert!(fit.epsilon <= 4.0 && fit.epsilon > 4.0 * (1.0 - 1e-4), "{}", fit.epsilon);
        // Most complete first: a (no nulls) leads.
        assert_eq!(fit.model.order[0], 0);
        let syn = fit.model.sample(20_000, &mut rng);
        let (ab, bc) = agreement(&syn);
        assert!(ab > 0.85 && bc > 0.8, "ab {ab}, bc {bc}");
        assert!(syn.iter().zip(&fit.model.sizes).all(|(c, &k)| c.iter().all(|&v| (v as usize) < k)));
    }

    /// The schedules depend on the noisy counts, so the run is a Rényi filter
    /// at the one order α* fixed from (ε, δ) (module docs, Privacy): the
    /// charged curve is that single point, and recomputing it from the
    /// recorded σs and schedules gives at most τ(α*), for tables whose counts
    /// (hence schedules) differ.
    #[test]
    fn the_run_is_a_renyi_filter_at_the_public_order() {
        let (eps, delta) = (2.0, 1e-6);
        let alpha = public_order(eps, delta);
        let tau = tau_at(eps, delta, alpha);
        for (n, nulls) in [(1500, 0.05), (4000, 0.4)] {
            let mut rng = DpRng::unsafe_seeded(n as u64);
            let table = chain(&mut rng, n, nulls);
            let p = table.sizes.len();
            let opts = KaminoOptions { epochs: 1.0, batch: 128.0, hidden: 8, ..Default::default() };
            let fit = fit(table, &opts, eps, delta, &mut rng, &|_| {}).unwrap();
            assert_eq!(fit.curve.len(), 1, "{:?}", fit.curve);
            assert_eq!(fit.curve[0].0, alpha);
            let at = [alpha];
            let mut parts =
                vec![gaussian_curve(fit.counts_sigma, &at).unwrap(), gaussian_curve(fit.first_sigma, &at).unwrap()];
            assert_eq!(fit.schedule.len(), p - 1);
            for s in &fit.schedule {
                parts.push(sampled_discrete_gaussian_curve(s.rate, fit.sgd_sigma, s.steps, &at).unwrap());
            }
            let total = compose(&parts).unwrap()[0].1;
            assert!(total <= tau * (1.0 + 1e-9), "n {n}: {total} > τ {tau}");
            assert!((total - fit.curve[0].1).abs() <= 1e-9 * tau, "{total} vs {:?}", fit.curve);
            assert!(fit.epsilon <= eps);
        }
    }

    #[test]
    fn kaminoi_fills_only_the_missing_cells() {
        // A classifier of b from a that puts all its mass on a mod 2: the
        // filled cells follow it, the observed cells (including those that
        // break the rule) stay as they were.
        let mut rng = DpRng::unsafe_seeded(8);
        let table = chain(&mut rng, 3000, 0.3);
        let mut model = Mlp::new(&[3, 2], Activation::Relu, &mut rng);
        model.layers[0].w.fill(0.0);
        for a in 0..3 {
            model.layers[0].w[[a, a % 2]] = 60.0;
        }
        let mut t = table.clone();
        impute_with(&mut t, 1, &[0], &model, &mut rng);
        let mut filled = 0;
        for r in 0..3000 {
            if table.columns[1][r] == 2 {
                assert_eq!(t.columns[1][r], table.columns[0][r] % 2, "row {r}");
                filled += 1;
            } else {
                assert_eq!(t.columns[1][r], table.columns[1][r]);
            }
        }
        assert!(filled > 700, "{filled}");
        assert_eq!(t.columns[0], table.columns[0]);
        assert_eq!(t.columns[2], table.columns[2]);
    }

    #[test]
    fn kamino_on_complete_rows_and_bad_settings() {
        let mut rng = DpRng::unsafe_seeded(9);
        let table = chain(&mut rng, 3000, 0.2);
        let opts = KaminoOptions { impute: false, epochs: 1.0, batch: 128.0, hidden: 8, ..Default::default() };
        let fit = fit(table, &opts, 2.0, 1e-6, &mut rng, &|_| {}).unwrap();
        assert!(fit.epsilon <= 2.0);
        let e = KaminoOptions { hidden: 0, ..opts }.check(&["a".into(), "b".into()], &[2, 2]).unwrap_err();
        assert!(e.to_string().contains("hidden units"), "{e}");
        assert!(matches!(check_budget(1e-6, 1e-12, 3), Err(KaminoError::BudgetTooSmall { .. })));
        assert!(check_budget(0.01, 1e-10, 2).is_ok());
        assert!(check_budget(1.0, 1e-9, 3).is_ok());
        let e = opts.check(&["a".into()], &[2]).unwrap_err();
        assert!(matches!(e, KaminoError::Columns(1)));
        let e = KaminoOptions { hidden: 4096, ..opts }.check(&["a".into(), "b".into()], &[500, 500]).unwrap_err();
        assert!(e.to_string().contains("coarsen"), "{e}");
    }
}
