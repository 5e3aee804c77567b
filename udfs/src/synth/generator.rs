//! A released neural data generator as a sampler (000 §4.2 Alg 1 line 20:
//! synthetic rows are drawn from the data generator G_x alone).
//!
//! G_x maps a standard normal latent vector to one block of logits per
//! column; a row takes, in each column, a level drawn from its block's
//! softmax (the distribution the Gumbel-softmax outputs seen in training
//! concentrate on as the temperature goes to 0). The latent draws and the
//! level draws use the caller's generator: sampling is post-processing of
//! the released network, so a seeded stream is allowed (it has no privacy
//! role), which is what makes [`crate::synth::SyntheticExec`]'s chunks
//! reproducible.

use ndarray::{Array2, Axis};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::plan::PlanError;
use crate::domain::{DecodeMode, Domain};
use crate::neural::{Activation, Dense, predict, widths};

/// Rows pushed through the network at once (memory: rows × widest layer).
const BLOCK_ROWS: usize = 4096;

/// A generator network over a public domain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeneratorPlan {
    /// The public domain (codes ↔ values).
    pub domain: Domain,
    /// The network, latent → Σ sizes logits.
    pub layers: Vec<Dense>,
    /// Its hidden activation.
    pub hidden: Activation,
    /// Levels generated per column (domain order): the logit blocks' widths,
    /// at most the column's cardinality (no null code is generated).
    pub sizes: Vec<usize>,
    /// How numeric bins are decoded.
    #[serde(default)]
    pub decode: DecodeMode,
}

/// A uniform draw in [0, 1) with 53 random bits.
fn unit<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Standard normal draws (Box–Muller), rows × cols: a generator's input,
/// which carries no privacy noise.
pub fn standard_normal_matrix<R: Rng + ?Sized>(rng: &mut R, rows: usize, cols: usize) -> Array2<f64> {
    Array2::from_shape_simple_fn((rows, cols), || {
        let u1 = 1.0 - unit(rng);
        let u2 = unit(rng);
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    })
}

/// Scales `p` to sum to 1; uniform if its sum is not positive (a
/// data-independent rule for weights that are all zero or not finite).
pub fn normalise(p: &mut [f64]) {
    let z: f64 = p.iter().sum();
    if z > 0.0 && z.is_finite() {
        p.iter_mut().for_each(|v| *v /= z);
    } else {
        let u = 1.0 / p.len() as f64;
        p.iter_mut().for_each(|v| *v = u);
    }
}

/// A draw from a vector of non-negative weights (post-processing: a float
/// uniform).
pub fn draw<R: Rng + ?Sized>(rng: &mut R, p: &[f64]) -> usize {
    let mut u = unit(rng) * p.iter().sum::<f64>();
    for (i, &v) in p.iter().enumerate() {
        if u < v {
            return i;
        }
        u -= v;
    }
    p.iter().rposition(|&v| v > 0.0).unwrap_or(0)
}

/// `rows` rows of levels per block from the network `layers` (latent →
/// Σ sizes logits), pushed through in blocks of rows: per row, a standard
/// normal latent vector, then in each block a level drawn from the softmax
/// of its logits (module docs).
pub fn sample_levels<R: Rng + ?Sized>(
    layers: &[Dense],
    hidden: Activation,
    sizes: &[usize],
    rows: usize,
    rng: &mut R,
) -> Vec<Vec<u32>> {
    let latent = layers[0].w.nrows();
    let mut cols: Vec<Vec<u32>> = sizes.iter().map(|_| Vec::with_capacity(rows)).collect();
    let mut w = Vec::new();
    let mut left = rows;
    while left > 0 {
        let n = left.min(BLOCK_ROWS);
        left -= n;
        let z = standard_normal_matrix(rng, n, latent);
        let logits = predict(layers, hidden, z.view());
        for row in logits.axis_iter(Axis(0)) {
            let mut off = 0;
            for (col, &k) in cols.iter_mut().zip(sizes) {
                let block = &row.as_slice().expect("a standard-layout row")[off..off + k];
                let m = block.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                w.clear();
                w.extend(block.iter().map(|&v| (v - m).exp()));
                normalise(&mut w);
                col.push(draw(rng, &w) as u32);
                off += k;
            }
        }
    }
    cols
}

impl GeneratorPlan {
    /// Checks the network against the domain: layers chain, the output width
    /// is Σ sizes, and every size is in 1..=the column's cardinality.
    pub fn validate(&self) -> Result<(), PlanError> {
        let cards = self.domain.cardinalities();
        if self.sizes.len() != cards.len() {
            return Err(PlanError::Generator(format!("{} blocks for {} columns", self.sizes.len(), cards.len())));
        }
        if let Some(c) = (0..cards.len()).find(|&c| self.sizes[c] == 0 || self.sizes[c] > cards[c]) {
            return Err(PlanError::Generator(format!("block {c} has {} levels of {}", self.sizes[c], cards[c])));
        }
        match widths(&self.layers) {
            Some((_, out)) if out == self.sizes.iter().sum::<usize>() => Ok(()),
            Some((_, out)) => {
                Err(PlanError::Generator(format!("{out} outputs for {} levels", self.sizes.iter().sum::<usize>())))
            }
            None => Err(PlanError::Generator("the layers do not chain".into())),
        }
    }

    /// `rows` rows of codes per column (no nulls).
    pub fn sample_codes<R: Rng + ?Sized>(&self, rows: usize, rng: &mut R) -> Vec<Vec<u32>> {
        sample_levels(&self.layers, self.hidden, &self.sizes, rows, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Column;
    use crate::noise::DpRng;
    use ndarray::{Array1, array};

    fn domain() -> Domain {
        let col = Column::categorical;
        Domain::new(vec![col("a", &["x", "y", "z"]), col("b", &["u", "v"])]).unwrap()
    }

    /// A network whose logits ignore the latent: softmax (ln 6, ln 3, ln 1)
    /// = (0.6, 0.3, 0.1) for a and (ln 1, ln 4) = (0.2, 0.8) for b.
    fn constant() -> GeneratorPlan {
        let b = array![6f64.ln(), 3f64.ln(), 0.0, 0.0, 4f64.ln()];
        GeneratorPlan {
            domain: domain(),
            layers: vec![Dense { w: Array2::zeros((2, 5)), b }],
            hidden: Activation::Relu,
            sizes: vec![3, 2],
            decode: DecodeMode::Uniform,
        }
    }

    #[test]
    fn levels_follow_each_blocks_softmax() {
        let plan = constant();
        plan.validate().unwrap();
        let mut rng = DpRng::unsafe_seeded(1);
        let n = 20_000;
        let codes = plan.sample_codes(n, &mut rng);
        let share = |c: usize, v: u32| codes[c].iter().filter(|&&x| x == v).count() as f64 / n as f64;
        // 4 standard errors of a proportion at n = 20,000 is at most 0.0142.
        for (c, v, p) in [(0, 0, 0.6), (0, 1, 0.3), (0, 2, 0.1), (1, 0, 0.2), (1, 1, 0.8)] {
            assert!((share(c, v) - p).abs() < 0.0142, "column {c} level {v}: {}", share(c, v));
        }
        let batch = crate::synth::Sampler::from(plan).sample_batch(10, &mut rng).unwrap();
        assert_eq!((batch.num_rows(), batch.num_columns()), (10, 2));
    }

    #[test]
    fn inconsistent_plans_are_refused() {
        let mut p = constant();
        p.sizes = vec![3, 3];
        assert!(p.validate().is_err(), "more levels than the column has");
        let mut p = constant();
        p.layers[0].b = Array1::zeros(4);
        assert!(p.validate().is_err(), "bias width");
        let mut p = constant();
        p.layers[0] = Dense { w: Array2::zeros((2, 4)), b: Array1::zeros(4) };
        assert!(p.validate().is_err(), "4 outputs for 5 levels");
    }
}
