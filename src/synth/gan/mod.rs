//! DP-MisGAN (000 §4.2, Alg 1; MisGAN, Li, Jiang & Marlin 2019) and its
//! complete-row baseline DP-GAN: Wasserstein GANs with gradient penalty
//! (Gulrajani et al. 2017) over one-hot coded columns.
//!
//! **DP-MisGAN** learns from every row, incomplete ones included. A data
//! generator G_x and a mask generator G_m each map Gaussian noise to a row:
//! G_x to one block of probabilities per column (Gumbel-softmax, temperature
//! τ), G_m to one observation probability per column (sigmoid). Two critics
//! compare them with the real rows: D_m sees the real mask m (1 = observed)
//! against G_m's, and D_x sees the *masked* real row x⊙m (a missing column is
//! all zeros, MisGAN's f_τ with τ = 0) against G_x's row masked by G_m's mask.
//! So G_x is only ever compared on cells that are observed, and learns the
//! full distribution from incomplete rows; G_m learns the missingness
//! pattern (its loss adds α·D_x's, MisGAN eq. 5). Only G_x is released (Alg 1
//! line 20): synthetic rows are drawn from it, without nulls.
//!
//! **DP-GAN** (the complete-row baseline of 000 §6, in the DPautoGAN family)
//! is the same data GAN trained on the rows with no null, without masks.
//!
//! **Privacy** (add/remove-one neighbours; docs/PRIVACY.md §9). *This departs
//! from 000 Alg 1 and Thm 4.7*, which noise the generators' gradients and
//! charge each generator step as a subsampled Gaussian with sensitivity 2
//! at rate B/|D|. Thm 4.7 understates the loss: the critics are trained on
//! the data without noise and kept from step to step, and every epoch
//! passes over every row, so from then on the critics — hence every later
//! generator gradient — depend on each row (rate 1, not B/|D|), and all B
//! per-sample gradients of a step change with it (sensitivity 2√B, not 2).
//! With rate 1 and sensitivity 2√B the approach is valid but useless.
//! Here the critics are trained with DP-SGD instead (Abadi et al. 2016; the
//! DP-GAN / DPautoGAN construction 000 compares against): each critic step
//! Poisson-samples the rows at rate q, and each sampled row's gradient of
//! −D_x(x⊙m) − D_m(m) — *one vector for both critics* — is clipped to norm
//! C, rounded and summed exactly, and discrete Gaussian noise is added
//! ([`crate::neural::dpsgd::NoisySum`]). The rest of the critic loss reads
//! no data given the current (released) networks and is added without
//! noise: the generated rows' term (each row's vector clipped to C too, so
//! the halves stay balanced) and the gradient penalty, taken at
//! interpolates between generated rows and uniformly random rows rather
//! than real ones (a data-free variant of WGAN-GP's, which keeps the real
//! rows' clipping budget for their own term). One critic step is therefore one
//! Poisson-subsampled discrete Gaussian mechanism, and T steps cost T times
//! its RDP (Zhu & Wang 2019 Thm 6, as in Kamino). The generators only ever
//! see the critics, so their training is post-processing and free: they
//! take a step after every `critic_steps` critic steps. The counts that set
//! q and T (rows, complete rows; L2 sensitivity √2) are a Gaussian
//! mechanism first (L2 sensitivity 1 for DP-MisGAN, which counts only the
//! rows); since T and q follow them, the run is a Rényi filter at
//! one order α* fixed from (ε, δ) before the read, and the critics' σ is
//! the smallest for which the total at α* stays within τ(α*) (the rule of
//! [`crate::synth::kamino`]): a run spends its budget exactly, never more.

pub mod release;

use ndarray::{Array1, Array2, ArrayView2, Axis, s};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::neural::dpsgd::{Adam, CHUNK, NoisySum, par_noisy_sum, poisson_sample};
use crate::neural::mlp::{Activation, Mlp, Trace, unit};
use crate::privacy::convert::{cdp_rho, public_order};
use crate::privacy::rdp::{
    RdpError, calibrate_noise_multiplier, compose, epsilon, gaussian_curve, sampled_discrete_gaussian_curve,
};
use crate::synth::kamino::CodedTable;
use dpflow_udfs::noise::DpRng;
use dpflow_udfs::noise::discrete::DiscreteGaussian;

use crate::synth::kamino::{COUNTS_SHARE, MAX_PARAMETERS, sigma_for_rho};
use dpflow_udfs::domain::{DecodeMode, Domain};
use dpflow_udfs::synth::GeneratorPlan;
use dpflow_udfs::synth::generator::{self, standard_normal_matrix};

/// Public settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GanOptions {
    /// DP-MisGAN (every row, with the mask GAN) rather than DP-GAN on complete rows.
    pub missing_aware: bool,
    /// Passes of the critics over the (noisy) eligible rows.
    pub epochs: f64,
    /// Expected real rows per critic step (q times the noisy eligible rows).
    pub batch: f64,
    /// Hidden units of each layer (two hidden layers per network; the mask
    /// networks use half).
    pub hidden: usize,
    /// Dimension of the generators' Gaussian input.
    pub latent: usize,
    /// Critic steps per generator step.
    pub critic_steps: usize,
    /// Clipping norm of one row's critic gradient.
    pub clip: f64,
    /// Adam learning rate (critics and generators).
    pub learning_rate: f64,
    /// Gradient-penalty weight λ.
    pub penalty: f64,
    /// Weight α of the data critic in the mask generator's loss (MisGAN).
    pub mask_weight: f64,
    /// Gumbel-softmax temperature of the data generator's columns.
    pub temperature: f64,
}

impl Default for GanOptions {
    fn default() -> Self {
        Self {
            missing_aware: true,
            epochs: 5.0,
            batch: 256.0,
            hidden: 128,
            latent: 32,
            critic_steps: 2,
            clip: 1.0,
            learning_rate: 1e-3,
            penalty: 10.0,
            mask_weight: 0.2,
            temperature: 0.5,
        }
    }
}

/// Why a GAN run cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GanError {
    /// A setting out of range.
    #[error("GAN setting {name} = {value} is out of range: {hint}")]
    Setting {
        /// Which.
        name: &'static str,
        /// Its value.
        value: f64,
        /// What to give.
        hint: &'static str,
    },
    /// A network above the cap.
    #[error(
        "the GAN's networks would have {params} parameters, above the cap of {max}: coarsen the domain's bins or \
         lower --gan-hidden"
    )]
    TooLarge {
        /// Its parameters.
        params: usize,
        /// The cap.
        max: usize,
    },
    /// A budget too small for the counts and the critics.
    #[error(
        "a budget of ε = {epsilon}, δ = {delta} is too small for the GAN: the row counts would leave the critics \
         almost nothing; give a larger ε (or δ)"
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
}

impl GanOptions {
    /// Checks the settings and the networks' sizes (public: the domain's sizes).
    pub fn check(&self, sizes: &[usize]) -> Result<(), GanError> {
        let bad = |name, value, hint| Err(GanError::Setting { name, value, hint });
        if sizes.is_empty() || sizes.contains(&0) {
            return bad("columns", sizes.len() as f64, "give a domain with at least one column, each with a level");
        }
        if self.hidden < 2 || self.hidden > 4096 {
            return bad("hidden", self.hidden as f64, "give 2–4096 hidden units (128 is usual)");
        }
        if self.latent == 0 || self.latent > 4096 {
            return bad("latent", self.latent as f64, "give a latent dimension of 1–4096 (32 is usual)");
        }
        if self.critic_steps == 0 || self.critic_steps > 100 {
            return bad("critic_steps", self.critic_steps as f64, "give 1–100 critic steps per generator step");
        }
        if !(self.epochs > 0.0 && self.epochs <= 1000.0) {
            return bad("epochs", self.epochs, "give a positive number of passes up to 1000");
        }
        if !(self.batch >= 1.0 && self.batch <= 1e6) {
            return bad("batch", self.batch, "give an expected batch size between 1 and 10⁶");
        }
        if !(1e-6..=1e6).contains(&self.clip) {
            return bad("clip", self.clip, "give a clipping norm between 1e-6 and 1e6 (1 is usual)");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate <= 1.0) {
            return bad("learning_rate", self.learning_rate, "give a learning rate in (0, 1] (1e-3 is usual)");
        }
        if !(self.penalty >= 0.0 && self.penalty <= 1e4) {
            return bad("penalty", self.penalty, "give a gradient-penalty weight in [0, 10⁴] (10 is usual)");
        }
        if !(self.mask_weight >= 0.0 && self.mask_weight <= 100.0) {
            return bad("mask_weight", self.mask_weight, "give a weight in [0, 100] (0.2 is usual)");
        }
        if !(self.temperature >= 0.05 && self.temperature <= 10.0) {
            return bad("temperature", self.temperature, "give a temperature in [0.05, 10] (0.5 is usual)");
        }
        let d: usize = sizes.iter().sum();
        let h = self.hidden;
        let params = critic_widths(d, h).windows(2).map(|w| w[0] * w[1] + w[1]).sum::<usize>()
            + generator_widths(self.latent, h, d).windows(2).map(|w| w[0] * w[1] + w[1]).sum::<usize>();
        if params > MAX_PARAMETERS {
            return Err(GanError::TooLarge { params, max: MAX_PARAMETERS });
        }
        Ok(())
    }
}

fn critic_widths(inputs: usize, hidden: usize) -> [usize; 4] {
    [inputs, hidden, hidden, 1]
}

fn generator_widths(latent: usize, hidden: usize, outputs: usize) -> [usize; 4] {
    [latent, hidden, hidden, outputs]
}

/// Refuses a budget whose counts alone would use more than 90% of τ(α*)
/// (public inputs only; the rule of [`crate::synth::kamino::check_budget`]).
pub fn check_budget(epsilon_budget: f64, delta: f64) -> Result<(), GanError> {
    if !crate::synth::kamino::leaves_room(epsilon_budget, delta, COUNTS_SHARE) {
        return Err(GanError::BudgetTooSmall { epsilon: epsilon_budget, delta });
    }
    Ok(())
}

/// The released model: the data generator (post-processing of DP output).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GanModel {
    /// The data generator: latent → one block of logits per column.
    pub generator: Mlp,
    /// Non-null levels per column (domain order): the blocks' widths.
    pub sizes: Vec<usize>,
    /// Noisy number of rows (the default output size).
    pub rows: f64,
}

impl GanModel {
    /// The released generator as a sampler over `domain` (what
    /// `SyntheticExec` streams from, in this process or on a cluster).
    pub fn plan(&self, domain: Domain, decode: DecodeMode) -> GeneratorPlan {
        GeneratorPlan {
            domain,
            layers: self.generator.layers.clone(),
            hidden: self.generator.hidden,
            sizes: self.sizes.clone(),
            decode,
        }
    }

    /// `rows` synthetic rows (codes per column, no nulls): each column drawn
    /// from its block's softmax ([`dpflow_udfs::synth::generator`]).
    pub fn sample<R: Rng + ?Sized>(&self, rows: usize, rng: &mut R) -> Vec<Vec<u32>> {
        generator::sample_levels(&self.generator.layers, self.generator.hidden, &self.sizes, rows, rng)
    }
}

/// A uniform draw in the open interval (0, 1): (k + ½)/2⁵² for a 52-bit k,
/// exact in f64, so neither 0 nor 1.
fn open_unit<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    ((rng.next_u64() >> 12) as f64 + 0.5) / (1u64 << 52) as f64
}

/// What a fit spent and how (all DP output or public).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GanFit {
    /// The released model.
    pub model: GanModel,
    /// The whole run's RDP at the order α* it is charged at: one point.
    pub curve: Vec<(f64, f64)>,
    /// ε of that point at the budget's δ (≤ the budget's ε).
    pub epsilon: f64,
    /// Noise multiplier of the counts.
    pub counts_sigma: f64,
    /// The critics' noise multiplier.
    pub sigma: f64,
    /// Poisson sampling rate of a critic step.
    pub rate: f64,
    /// Critic steps.
    pub steps: u64,
    /// Expected real rows per critic step.
    pub batch: f64,
    /// Parameters of the critics' joint gradient (the noised vector's length).
    pub critic_parameters: usize,
}

/// The networks in training.
struct Nets {
    gx: Mlp,
    dx: Mlp,
    /// G_m and D_m (DP-MisGAN only).
    mask: Option<(Mlp, Mlp)>,
}

/// One batch of generated rows with what the generator step needs.
struct Fake {
    /// G_x's Gumbel-softmax output (rows × d).
    y: Array2<f64>,
    /// G_m's output (rows × p), if any.
    m: Option<Array2<f64>>,
    /// The row the data critic sees: y masked by m (or y).
    shown: Array2<f64>,
    /// The generators' forward passes, for back-propagation.
    trace_x: Trace,
    trace_m: Option<Trace>,
}

struct Layout {
    sizes: Vec<usize>,
    offsets: Vec<usize>,
    d: usize,
}

impl Layout {
    fn new(sizes: &[usize]) -> Self {
        let mut offsets = Vec::with_capacity(sizes.len());
        let mut d = 0;
        for &k in sizes {
            offsets.push(d);
            d += k;
        }
        Self { sizes: sizes.to_vec(), offsets, d }
    }

    fn p(&self) -> usize {
        self.sizes.len()
    }

    /// Real rows: x⊙m (one-hot of observed cells) and m.
    fn encode(&self, table: &CodedTable, rows: &[usize]) -> (Array2<f64>, Array2<f64>) {
        let mut x = Array2::zeros((rows.len(), self.d));
        let mut m = Array2::zeros((rows.len(), self.p()));
        for (i, &r) in rows.iter().enumerate() {
            for c in 0..self.p() {
                let v = table.columns[c][r] as usize;
                if v < self.sizes[c] {
                    x[[i, self.offsets[c] + v]] = 1.0;
                    m[[i, c]] = 1.0;
                }
            }
        }
        (x, m)
    }

    /// Expands a per-column matrix (rows × p) to per-level (rows × d).
    fn expand(&self, m: ArrayView2<f64>) -> Array2<f64> {
        let mut out = Array2::zeros((m.nrows(), self.d));
        for c in 0..self.p() {
            let col = m.column(c);
            for j in self.offsets[c]..self.offsets[c] + self.sizes[c] {
                out.column_mut(j).assign(&col);
            }
        }
        out
    }

    /// Sums a per-level matrix over each column's levels (rows × p).
    fn collapse(&self, v: ArrayView2<f64>) -> Array2<f64> {
        let mut out = Array2::zeros((v.nrows(), self.p()));
        for c in 0..self.p() {
            let block = v.slice(s![.., self.offsets[c]..self.offsets[c] + self.sizes[c]]);
            out.column_mut(c).assign(&block.sum_axis(Axis(1)));
        }
        out
    }
}

impl Nets {
    fn generate<R: Rng + ?Sized>(&self, lay: &Layout, n: usize, tau: f64, rng: &mut R) -> Fake {
        let trace_x = self.gx.forward(standard_normal_matrix(rng, n, self.gx.input_dim()).view());
        let mut y = trace_x.output().clone();
        // Gumbel-softmax per column block.
        for mut row in y.axis_iter_mut(Axis(0)) {
            for c in 0..lay.p() {
                let mut block = row.slice_mut(s![lay.offsets[c]..lay.offsets[c] + lay.sizes[c]]);
                // Gumbel noise −ln(−ln u), u in (0, 1) strictly.
                block.mapv_inplace(|l| (l - (-(open_unit(rng).ln())).ln()) / tau);
                let mx = block.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                block.mapv_inplace(|v| (v - mx).exp());
                let sum = block.sum();
                block.mapv_inplace(|v| v / sum);
            }
        }
        let (m, trace_m, shown) = match &self.mask {
            Some((gm, _)) => {
                let trace_m = gm.forward(standard_normal_matrix(rng, n, gm.input_dim()).view());
                let m = trace_m.output().mapv(|o| 1.0 / (1.0 + (-o).exp()));
                let shown = &y * &lay.expand(m.view());
                (Some(m), Some(trace_m), shown)
            }
            None => (None, None, y.clone()),
        };
        Fake { y, m, shown, trace_x, trace_m }
    }
}

/// Adds the per-row critic gradients of rows `rows` of the eligible set to
/// `sum`: ∇(−D_x(x⊙m)) and, for DP-MisGAN, ∇(−D_m(m)), one vector per
/// sampled row (concatenated), each from that row alone (module docs).
/// `row` is a reused buffer of the critics' parameter count.
fn add_real_gradients(
    nets: &Nets,
    lay: &Layout,
    table: &CodedTable,
    rows: &[usize],
    sum: &mut NoisySum,
    row: &mut [f64],
) {
    let n = rows.len();
    let (x, m) = lay.encode(table, rows);
    let pass = |d: &Mlp, real: &Array2<f64>| {
        let trace = d.forward(real.view());
        let back = d.backward(&trace, Array2::from_elem((n, 1), -1.0).view());
        (trace, back)
    };
    let px = pass(&nets.dx, &x);
    let pm = nets.mask.as_ref().map(|(_, dm)| (dm, pass(dm, &m)));
    let nx = nets.dx.n_params();
    for i in 0..n {
        nets.dx.example_gradient_into(&px.0, &px.1, i, &mut row[..nx]);
        if let Some((dm, (trace, back))) = &pm {
            dm.example_gradient_into(trace, back, i, &mut row[nx..]);
        }
        sum.add_row(row);
    }
}

/// The data-independent half of the critic gradient, given the networks:
/// the mean over generated rows of ∇D(fake) for both critics (flat,
/// concatenated; each row's vector clipped to `clip` like a real row's, so
/// the halves stay balanced), plus the gradient penalty. The penalty is
/// taken at points that read no data — interpolates between generated rows
/// and uniformly random rows (random levels under the generated mask for
/// D_x, random 0/1 masks for D_m) — so it needs no noise and leaves the real
/// rows' clipping budget to their own term.
fn fake_gradient(nets: &Nets, lay: &Layout, fake: &Fake, o: &GanOptions, rng: &mut DpRng) -> Array1<f64> {
    let n = fake.shown.nrows();
    // Each generated row's vector for both critics, clipped to C, averaged:
    // norms from the per-example norm trick, the sum as one weighted matrix
    // product per layer (no per-example gradients are formed).
    let pass = |d: &Mlp, x: &Array2<f64>| {
        let trace = d.forward(x.view());
        let back = d.backward(&trace, Array2::ones((n, 1)).view());
        (trace, back)
    };
    let px = pass(&nets.dx, &fake.shown);
    let pm = match (&nets.mask, &fake.m) {
        (Some((_, dm)), Some(fm)) => Some((dm, pass(dm, fm))),
        _ => None,
    };
    let mut sq = nets.dx.per_example_sq_norms(&px.0, &px.1);
    if let Some((dm, (trace, back))) = &pm {
        sq += &dm.per_example_sq_norms(trace, back);
    }
    // Weight 1/n, times C/‖g_i‖ above the clip; a non-finite row counts zero.
    let w = sq.mapv(|s| {
        let norm = s.sqrt();
        if !norm.is_finite() {
            0.0
        } else if norm > o.clip {
            o.clip / norm / n as f64
        } else {
            1.0 / n as f64
        }
    });
    let mut total = nets.dx.weighted_gradient(&px.0, &px.1, w.view());
    if let Some((dm, (trace, back))) = &pm {
        let gm = dm.weighted_gradient(trace, back, w.view());
        total = ndarray::concatenate(Axis(0), &[total.view(), gm.view()]).expect("1-d");
    }
    if o.penalty > 0.0 {
        let mut random = Array2::zeros((n, lay.d));
        for mut row in random.axis_iter_mut(Axis(0)) {
            for c in 0..lay.p() {
                let level = ((unit(rng) * lay.sizes[c] as f64) as usize).min(lay.sizes[c] - 1);
                row[lay.offsets[c] + level] = 1.0;
            }
        }
        if let Some(fm) = &fake.m {
            random *= &lay.expand(fm.view());
        }
        let mix = |a: &Array2<f64>, b: &Array2<f64>, rng: &mut DpRng| {
            let mut out = b.clone();
            for (i, mut row) in out.axis_iter_mut(Axis(0)).enumerate() {
                let t = unit(rng);
                row.mapv_inplace(|v| v * (1.0 - t));
                row.scaled_add(t, &a.row(i));
            }
            out
        };
        let points = mix(&random, &fake.shown, rng);
        let mut gp = nets.dx.gradient_penalty(points.view(), o.penalty).1;
        if let (Some((_, dm)), Some(fm)) = (&nets.mask, &fake.m) {
            let coins = Array2::from_shape_simple_fn(fm.raw_dim(), || f64::from(u8::from(unit(rng) < 0.5)));
            let points = mix(&coins, fm, rng);
            let gpm = dm.gradient_penalty(points.view(), o.penalty).1;
            gp = ndarray::concatenate(Axis(0), &[gp.view(), gpm.view()]).expect("1-d");
        }
        total += &gp;
    }
    total
}

/// One generator step (post-processing: reads only the critics).
fn generator_step(
    nets: &mut Nets,
    lay: &Layout,
    o: &GanOptions,
    n: usize,
    adam_x: &mut Adam,
    adam_m: &mut Option<Adam>,
    rng: &mut DpRng,
) {
    let fake = nets.generate(lay, n, o.temperature, rng);
    let scale = Array2::from_elem((n, 1), -1.0 / n as f64);
    let tr = nets.dx.forward(fake.shown.view());
    let d_shown = nets.dx.backward(&tr, scale.view()).d_input;
    let d_y = match &fake.m {
        Some(m) => &d_shown * &lay.expand(m.view()),
        None => d_shown.clone(),
    };
    // Through the Gumbel-softmax: ∂/∂l = (1/τ)·y⊙(u − ⟨u, y⟩) per block.
    let mut d_logits = Array2::zeros(d_y.raw_dim());
    for i in 0..n {
        for c in 0..lay.p() {
            let r = lay.offsets[c]..lay.offsets[c] + lay.sizes[c];
            let y = fake.y.slice(s![i, r.clone()]);
            let u = d_y.slice(s![i, r.clone()]);
            let dot = y.dot(&u);
            let mut out = d_logits.slice_mut(s![i, r]);
            ndarray::Zip::from(&mut out).and(&y).and(&u).for_each(|o_, &yv, &uv| *o_ = yv * (uv - dot) / o.temperature);
        }
    }
    let trace_x = &fake.trace_x;
    let gx = nets.gx.gradient(trace_x, &nets.gx.backward(trace_x, d_logits.view()));
    let dir = adam_x.step(&gx);
    if let (Some((gm, dm)), Some(m), Some(trace_m), Some(adam)) =
        (&mut nets.mask, &fake.m, &fake.trace_m, adam_m.as_mut())
    {
        let trm = dm.forward(m.view());
        let mut d_m = dm.backward(&trm, scale.view()).d_input;
        // The data critic's pull on the mask, weighted α (MisGAN eq. 5).
        d_m.scaled_add(o.mask_weight, &lay.collapse((&d_shown * &fake.y).view()));
        let d_o = &d_m * &m.mapv(|v| v * (1.0 - v));
        let g = gm.gradient(trace_m, &gm.backward(trace_m, d_o.view()));
        let dir_m = adam.step(&g);
        gm.add_scaled(dir_m.view(), 1.0);
    }
    nets.gx.add_scaled(dir.view(), 1.0);
}

/// L2 sensitivity of the counts: rows (DP-MisGAN), or rows and complete
/// rows (DP-GAN).
pub fn counts_sensitivity(o: &GanOptions) -> f64 {
    if o.missing_aware { 1.0 } else { 2f64.sqrt() }
}

/// Fits DP-MisGAN or DP-GAN on `table` within (ε, δ) (module docs).
/// `progress` hears public lines (steps, ε spent so far).
pub fn fit(
    table: &CodedTable,
    options: &GanOptions,
    epsilon_budget: f64,
    delta: f64,
    rng: &mut DpRng,
    progress: &dyn Fn(&str),
) -> Result<GanFit, GanError> {
    options.check(&table.sizes)?;
    check_budget(epsilon_budget, delta)?;
    let o = options;
    let lay = Layout::new(&table.sizes);
    let n = table.rows();
    let rho = cdp_rho(epsilon_budget, delta);
    let counts_sigma = sigma_for_rho(COUNTS_SHARE * rho);
    let alpha_star = public_order(epsilon_budget, delta);
    let at = [alpha_star];
    let counts_curve = gaussian_curve(counts_sigma, &at)?;

    // 1. Counts: the rows and, for DP-GAN, the complete rows; a row adds 1
    // to the first and at most 1 to the second: L2 sensitivity √2 (1 for
    // DP-MisGAN, which counts only the rows).
    // Rows without a null (DP-GAN's training rows; DP-MisGAN trains on all).
    let complete: Vec<usize> = if o.missing_aware {
        Vec::new()
    } else {
        (0..n).filter(|&r| (0..lay.p()).all(|c| !table.is_null(c, r))).collect()
    };
    let noise = DiscreteGaussian::from_sigma(counts_sigma * counts_sensitivity(o) * (1.0 + 1e-12)).expect("positive σ");
    let rows_hat = (n as i128 + noise.sample(rng)).max(1) as f64;
    let complete_hat = if o.missing_aware {
        rows_hat
    } else {
        ((complete.len() as i128 + noise.sample(rng)) as f64).clamp(1.0, rows_hat)
    };

    // 2. The critics' schedule from the noisy counts, then their σ.
    let eligible_hat = if o.missing_aware { rows_hat } else { complete_hat };
    let batch = o.batch.min(eligible_hat);
    let rate = batch / eligible_hat;
    let steps = (o.epochs * eligible_hat / batch).ceil().clamp(1.0, 1e6) as u64;
    let curve_at = |s: f64, t: u64| compose(&[counts_curve.clone(), sampled_discrete_gaussian_curve(rate, s, t, &at)?]);
    let sigma = calibrate_noise_multiplier(epsilon_budget, delta, |s| curve_at(s, steps))?;
    let curve = curve_at(sigma, steps)?;
    let spent = epsilon(&curve, delta).0;
    let name = if o.missing_aware { "dp-misgan" } else { "dp-gan" };
    progress(&format!("{name}: {steps} critic steps at rate {rate:.5}, noise multiplier {sigma:.4}"));

    // 3. Training.
    let eligible: Vec<usize> = if o.missing_aware { (0..n).collect() } else { complete };
    let h = o.hidden;
    let mut nets = Nets {
        gx: Mlp::new(&generator_widths(o.latent, h, lay.d), Activation::Relu, rng),
        dx: Mlp::new(&critic_widths(lay.d, h), Activation::LeakyRelu, rng),
        mask: o.missing_aware.then(|| {
            let hm = (h / 2).max(1);
            (
                Mlp::new(&generator_widths(o.latent, hm, lay.p()), Activation::Relu, rng),
                Mlp::new(&critic_widths(lay.p(), hm), Activation::LeakyRelu, rng),
            )
        }),
    };
    let critic_parameters = nets.dx.n_params() + nets.mask.as_ref().map_or(0, |(_, dm)| dm.n_params());
    // WGAN-GP's Adam (Gulrajani et al. 2017, Alg 1: β = (0.5, 0.9)).
    let betas = (0.5, 0.9);
    let mut adam_d = Adam::with_betas(critic_parameters, o.learning_rate, betas);
    let mut adam_x = Adam::with_betas(nets.gx.n_params(), o.learning_rate, betas);
    let mut adam_m = nets.mask.as_ref().map(|(gm, _)| Adam::with_betas(gm.n_params(), o.learning_rate, betas));
    let fake_rows = batch.round().max(1.0) as usize;
    let report_every = (steps / 20).max(1);
    for step in 1..=steps {
        // The critics: real half with DP-SGD, generated half exact.
        let sample = poisson_sample(rng, eligible.len(), rate);
        let chunks: Vec<Vec<usize>> = sample.chunks(CHUNK).map(|c| c.iter().map(|&i| eligible[i]).collect()).collect();
        let sum = par_noisy_sum(&chunks, critic_parameters, o.clip, sigma, |rows, part, row| {
            add_real_gradients(&nets, &lay, table, rows, part, row)
        });
        let mut g = sum.release(rng) / batch;
        let fake = nets.generate(&lay, fake_rows, o.temperature, rng);
        g += &fake_gradient(&nets, &lay, &fake, o, rng);
        let dir = adam_d.step(&g);
        let nx = nets.dx.n_params();
        nets.dx.add_scaled(dir.slice(s![..nx]), 1.0);
        if let Some((_, dm)) = &mut nets.mask {
            dm.add_scaled(dir.slice(s![nx..]), 1.0);
        }
        if step % o.critic_steps as u64 == 0 || step == steps {
            generator_step(&mut nets, &lay, o, fake_rows, &mut adam_x, &mut adam_m, rng);
        }
        if step % report_every == 0 || step == steps {
            let so_far = epsilon(&curve_at(sigma, step)?, delta).0;
            progress(&format!("{name}: critic step {step}/{steps}, ε spent {so_far:.4} of {epsilon_budget}"));
        }
    }
    Ok(GanFit {
        model: GanModel { generator: nets.gx, sizes: lay.sizes, rows: rows_hat },
        curve,
        epsilon: spent,
        counts_sigma,
        sigma,
        rate,
        steps,
        batch,
        critic_parameters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::rdp::tau_at;

    /// Two columns: a ∈ {0,1,2} with P = (0.6, 0.3, 0.1); b = a mod 2 with
    /// probability 0.9. `null_rate` of b's cells are masked, MCAR or (if
    /// `mnar`) only where b = 1.
    fn pair(rng: &mut DpRng, n: usize, null_rate: f64, mnar: bool) -> CodedTable {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let u = unit(rng);
            let x = if u < 0.6 {
                0
            } else if u < 0.9 {
                1
            } else {
                2
            };
            let y = if unit(rng) < 0.9 { x % 2 } else { 1 - x % 2 };
            a.push(x);
            let hide = unit(rng) < null_rate && (!mnar || y == 1);
            b.push(if hide { 2 } else { y });
        }
        CodedTable { names: vec!["a".into(), "b".into()], sizes: vec![3, 2], columns: vec![a, b] }
    }

    #[test]
    fn both_gans_spend_exactly_their_budget_at_the_public_order() {
        let mut rng = DpRng::unsafe_seeded(11);
        let table = pair(&mut rng, 3000, 0.3, false);
        let (eps, delta) = (2.0, 1e-6);
        for missing_aware in [true, false] {
            let o = GanOptions { missing_aware, epochs: 1.0, batch: 200.0, hidden: 8, latent: 4, ..Default::default() };
            let f = fit(&table, &o, eps, delta, &mut rng, &|_| {}).unwrap();
            assert!(f.epsilon <= eps && f.epsilon > eps * (1.0 - 1e-4), "{}", f.epsilon);
            let alpha = public_order(eps, delta);
            assert_eq!(f.curve.len(), 1);
            assert_eq!(f.curve[0].0, alpha);
            let again = compose(&[
                gaussian_curve(f.counts_sigma, &[alpha]).unwrap(),
                sampled_discrete_gaussian_curve(f.rate, f.sigma, f.steps, &[alpha]).unwrap(),
            ])
            .unwrap();
            assert!(again[0].1 <= tau_at(eps, delta, alpha) * (1.0 + 1e-9));
            // DP-GAN's schedule follows the (noisy) complete rows: 70% of 3000.
            let eligible = f.batch / f.rate;
            let expect = if missing_aware { 3000.0 } else { 2100.0 };
            assert!((eligible - expect).abs() < 150.0, "{eligible}");
            assert!(f.critic_parameters > 0);
        }
    }

    #[test]
    fn a_seeded_fit_repeats_exactly() {
        // --unsafe-seed: the parallel integer sums and forked noise streams
        // make the whole run a function of the seed.
        let o = GanOptions { epochs: 1.0, batch: 150.0, hidden: 8, latent: 4, ..Default::default() };
        let run = || {
            let mut rng = DpRng::unsafe_seeded(21);
            let table = pair(&mut rng, 1500, 0.2, true);
            fit(&table, &o, 3.0, 1e-6, &mut rng, &|_| {}).unwrap().model.generator.params()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn settings_and_budgets_are_refused_with_what_to_change() {
        let sizes = [3, 2];
        let ok = GanOptions::default();
        assert!(ok.check(&sizes).is_ok());
        let e = GanOptions { temperature: 0.0, ..ok }.check(&sizes).unwrap_err();
        assert!(e.to_string().contains("temperature"), "{e}");
        assert!(GanOptions { batch: f64::NAN, ..ok }.check(&sizes).is_err());
        assert!(GanOptions { critic_steps: 0, ..ok }.check(&sizes).is_err());
        assert!(ok.check(&[3, 0]).is_err() && ok.check(&[]).is_err());
        assert!(matches!(GanOptions { hidden: 4096, ..ok }.check(&[5000]), Err(GanError::TooLarge { .. })));
        assert!(matches!(check_budget(1e-6, 1e-12), Err(GanError::BudgetTooSmall { .. })));
        assert!(check_budget(1.0, 1e-6).is_ok());
    }
}

#[cfg(test)]
mod training_tests {
    use super::*;

    /// The generator step climbs the critic: against a fixed critic
    /// D(x) = x_{a=0} + x_{b=1}, the generator ends on a = 0, b = 1.
    #[test]
    fn the_generator_follows_a_fixed_critic() {
        let mut rng = DpRng::unsafe_seeded(3);
        let lay = Layout::new(&[3, 2]);
        let o = GanOptions { missing_aware: false, hidden: 16, latent: 4, ..Default::default() };
        let mut dx = Mlp::new(&[5, 4, 4, 1], Activation::LeakyRelu, &mut rng);
        // D(x) = x[0] + x[4]: prefers a = 0 and b = 1.
        for l in &mut dx.layers {
            l.w.fill(0.0);
            l.b.fill(0.0);
        }
        dx.layers[0].w[[0, 0]] = 1.0;
        dx.layers[0].w[[4, 0]] = 1.0;
        dx.layers[1].w[[0, 0]] = 1.0;
        dx.layers[2].w[[0, 0]] = 1.0;
        let mut nets = Nets { gx: Mlp::new(&[4, 16, 16, 5], Activation::Relu, &mut rng), dx, mask: None };
        let mut ax = Adam::new(nets.gx.n_params(), 1e-2);
        let mut am = None;
        for _ in 0..200 {
            generator_step(&mut nets, &lay, &o, 64, &mut ax, &mut am, &mut rng);
        }
        let model = GanModel { generator: nets.gx.clone(), sizes: vec![3, 2], rows: 0.0 };
        let syn = model.sample(2000, &mut rng);
        let a0 = syn[0].iter().filter(|&&v| v == 0).count();
        let b1 = syn[1].iter().filter(|&&v| v == 1).count();
        assert!(a0 > 1900 && b1 > 1900, "a = 0: {a0}, b = 1: {b1} of 2000");
    }

    /// The critic step (real half through `NoisySum` at negligible noise,
    /// generated half and data-free penalty exact) learns to score the real
    /// rows' most frequent cell above the untrained generator's rows and
    /// above the rarest cell.
    #[test]
    fn the_critic_scores_real_rows_above_generated_ones() {
        let mut rng = DpRng::unsafe_seeded(4);
        let lay = Layout::new(&[3, 2]);
        let o = GanOptions { missing_aware: false, hidden: 16, latent: 4, ..Default::default() };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..3000 {
            let u = unit(&mut rng);
            let x: u32 = if u < 0.6 {
                0
            } else if u < 0.9 {
                1
            } else {
                2
            };
            a.push(x);
            b.push(if unit(&mut rng) < 0.9 { x % 2 } else { 1 - x % 2 });
        }
        let table = CodedTable { names: vec!["a".into(), "b".into()], sizes: vec![3, 2], columns: vec![a, b] };
        let mut nets = Nets {
            gx: Mlp::new(&[4, 16, 16, 5], Activation::Relu, &mut rng),
            dx: Mlp::new(&[5, 16, 16, 1], Activation::LeakyRelu, &mut rng),
            mask: None,
        };
        let np = nets.dx.n_params();
        let mut adam = Adam::new(np, 1e-3);
        for _ in 0..100 {
            let sample = poisson_sample(&mut rng, 3000, 0.1);
            let mut sum = NoisySum::new(np, 1.0, 1e-3);
            add_real_gradients(&nets, &lay, &table, &sample, &mut sum, &mut vec![0.0; np]);
            let mut g = sum.release(&mut rng) / 300.0;
            let fake = nets.generate(&lay, 300, 0.5, &mut rng);
            g += &fake_gradient(&nets, &lay, &fake, &o, &mut rng);
            let dir = adam.step(&g);
            nets.dx.add_scaled(dir.view(), 1.0);
        }
        let d = |x: usize, y: usize| {
            let mut v = Array2::zeros((1, 5));
            v[[0, x]] = 1.0;
            v[[0, 3 + y]] = 1.0;
            nets.dx.predict(v.view())[[0, 0]]
        };
        let fake = nets.generate(&lay, 2000, 0.5, &mut rng);
        let fake_mean = nets.dx.predict(fake.shown.view()).mean().unwrap();
        // Real cells: (0,0) 54%, (1,1) 27%, (0,1) 6%, (2,0) 9%, (1,0) 3%, (2,1) 1%.
        assert!(d(0, 0) > fake_mean && d(0, 0) > d(2, 1), "{} {} {}", d(0, 0), fake_mean, d(2, 1));
    }
}
