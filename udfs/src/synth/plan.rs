//! Sampling plans: the conditional tables of a fitted model in generation
//! order, and the randomized-rounding sampler (NOTES §3; McKenna et al. 2021).
//!
//! Generation follows the reverse elimination order. The first attribute's
//! B values are the randomized rounding of B·p(x₁) (floors, then the remaining
//! rows go to values drawn without replacement ∝ fractional parts); each next
//! attribute is generated the same way inside every group of rows sharing the
//! values of its already-generated neighbours, from p(x_j | neighbours). Rows
//! are shuffled at the end. Sampling a synthetic table is post-processing of
//! DP outputs.

use datafusion::arrow::array::RecordBatch;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::domain::{DecodeError, DecodeMode, Domain, decode_columns};
use crate::noise::exact::uniform_below_u64;

/// An inconsistent sampling or fill plan (built by dpflow from a fitted
/// model, so one of these is a bug or a damaged model file: refit the model).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A step for a column out of range or generated twice.
    #[error("sampling plan: column {0} missing or repeated")]
    StepColumn(usize),
    /// A step whose parent comes later.
    #[error("sampling plan: parent {parent} of column {column} not generated before it")]
    ParentOrder {
        /// Parent column.
        parent: usize,
        /// Generated column.
        column: usize,
    },
    /// A conditional table of the wrong size.
    #[error("sampling plan: table of column {0} has the wrong size")]
    TableSize(usize),
    /// Some column has no step.
    #[error("sampling plan: not every column is generated")]
    Uncovered,
    /// A fill plan with one rule per column expected.
    #[error("fill plan: {rules} rules for {columns} columns")]
    FillRules {
        /// Rules.
        rules: usize,
        /// Columns.
        columns: usize,
    },
    /// A constant fill outside its column.
    #[error("fill plan: constant {code} outside column {column}")]
    FillConstant {
        /// The code.
        code: u32,
        /// Column name.
        column: String,
    },
    /// A model fill without a model.
    #[error("fill plan: a model rule needs a model")]
    FillModelMissing,
    /// A model over other columns.
    #[error("fill plan: the model's domain must be the data's without null codes")]
    FillModelDomain,
    /// A generator network that does not fit its domain.
    #[error("generator plan: {0}")]
    Generator(String),
}

/// One generation step: column `column` given `parents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingStep {
    /// Domain column position.
    pub column: usize,
    /// Already-generated parent columns (domain positions).
    pub parents: Vec<usize>,
    /// p(column | parents): for each parent combination (mixed radix over
    /// `parents`, first slowest), `size` probabilities.
    pub table: Vec<f64>,
}

/// A complete sampling plan over a domain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingPlan {
    /// The public domain (codes ↔ values).
    pub domain: Domain,
    /// Steps in generation order; every column appears once.
    pub steps: Vec<SamplingStep>,
    /// How numeric bins are decoded.
    #[serde(default)]
    pub decode: DecodeMode,
}

fn unit_f64<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Randomized rounding of `g·p` into integer counts summing to exactly `g`:
/// each count is ⌊g·p_k⌋ or ⌈g·p_k⌉ and its expectation is exactly g·p_k.
pub fn randomized_round<R: Rng + ?Sized>(rng: &mut R, p: &[f64], g: u64, out: &mut Vec<u64>) {
    out.clear();
    let total: f64 = p.iter().sum();
    if g == 0 {
        out.resize(p.len(), 0);
        return;
    }
    let norm = if total > 0.0 { total } else { 1.0 };
    let mut frac = Vec::with_capacity(p.len());
    let mut assigned = 0u64;
    for &pi in p {
        let x = if total > 0.0 { g as f64 * pi / norm } else { g as f64 / p.len() as f64 };
        let f = x.floor();
        out.push(f as u64);
        assigned += f as u64;
        frac.push(x - f);
    }
    // Rounding can overshoot by a few ulps' worth; fix by removing from the largest.
    while assigned > g {
        let k = (0..out.len()).max_by_key(|&k| out[k]).expect("non-empty");
        out[k] -= 1;
        assigned -= 1;
    }
    let extra = (g - assigned) as usize;
    if extra == 0 {
        return;
    }
    // Systematic sampling in a random cell order: cell k gets the extra row with
    // probability exactly frac_k (Σ frac = extra), and exactly `extra` cells are chosen.
    let mut cells: Vec<usize> = (0..p.len()).collect();
    shuffle(rng, &mut cells);
    let u = unit_f64(rng);
    let mut cum = 0.0f64;
    let mut chosen = vec![false; p.len()];
    let mut n_chosen = 0usize;
    for &k in &cells {
        let before = cum;
        cum += frac[k];
        if (cum - u).floor() > (before - u).floor() && n_chosen < extra {
            chosen[k] = true;
            n_chosen += 1;
        }
    }
    // Floating-point slack can leave one short: give it to the largest unchosen fraction.
    while n_chosen < extra {
        let k = (0..p.len()).filter(|&k| !chosen[k]).max_by(|&a, &b| frac[a].total_cmp(&frac[b])).unwrap_or(0);
        chosen[k] = true;
        n_chosen += 1;
    }
    for (k, c) in chosen.iter().enumerate() {
        if *c {
            out[k] += 1;
        }
    }
}

fn shuffle<T, R: Rng + ?Sized>(rng: &mut R, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = uniform_below_u64(rng, i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

impl SamplingPlan {
    /// Checks that steps cover every column once with consistent tables.
    pub fn validate(&self) -> Result<(), PlanError> {
        let cards = self.domain.cardinalities();
        let mut seen = vec![false; cards.len()];
        for s in &self.steps {
            if s.column >= cards.len() || seen[s.column] {
                return Err(PlanError::StepColumn(s.column));
            }
            for &p in &s.parents {
                if p >= cards.len() || !seen[p] {
                    return Err(PlanError::ParentOrder { parent: p, column: s.column });
                }
            }
            seen[s.column] = true;
            let combos: usize = s.parents.iter().map(|&p| cards[p]).product();
            if s.table.len() != combos * cards[s.column] {
                return Err(PlanError::TableSize(s.column));
            }
        }
        if seen.iter().any(|s| !s) {
            return Err(PlanError::Uncovered);
        }
        Ok(())
    }

    /// Generates `rows` rows of codes (one vector per domain column).
    pub fn sample_codes<R: Rng + ?Sized>(&self, rows: usize, rng: &mut R) -> Vec<Vec<u32>> {
        let cards = self.domain.cardinalities();
        let mut codes: Vec<Vec<u32>> = vec![Vec::new(); cards.len()];
        let mut counts = Vec::new();
        let mut key = vec![0usize; rows];
        let mut perm = vec![0usize; rows];
        for step in &self.steps {
            let size = cards[step.column];
            let mut col = vec![0u32; rows];
            if step.parents.is_empty() {
                randomized_round(rng, &step.table, rows as u64, &mut counts);
                let mut vals: Vec<u32> =
                    counts.iter().enumerate().flat_map(|(v, &c)| std::iter::repeat_n(v as u32, c as usize)).collect();
                shuffle(rng, &mut vals);
                col = vals;
            } else {
                // Group rows by parent combination (counting sort).
                let combos: usize = step.parents.iter().map(|&p| cards[p]).product();
                key.iter_mut().for_each(|k| *k = 0);
                for &p in &step.parents {
                    let c = &codes[p];
                    let card = cards[p];
                    for (k, &v) in key.iter_mut().zip(c) {
                        *k = *k * card + v as usize;
                    }
                }
                let mut offsets = vec![0usize; combos + 1];
                for &k in &key {
                    offsets[k + 1] += 1;
                }
                for i in 0..combos {
                    offsets[i + 1] += offsets[i];
                }
                let mut fill = offsets.clone();
                for (i, &k) in key.iter().enumerate() {
                    perm[fill[k]] = i;
                    fill[k] += 1;
                }
                let mut vals: Vec<u32> = Vec::new();
                for k in 0..combos {
                    let (lo, hi) = (offsets[k], offsets[k + 1]);
                    if lo == hi {
                        continue;
                    }
                    randomized_round(rng, &step.table[k * size..(k + 1) * size], (hi - lo) as u64, &mut counts);
                    vals.clear();
                    vals.extend(
                        counts.iter().enumerate().flat_map(|(v, &c)| std::iter::repeat_n(v as u32, c as usize)),
                    );
                    shuffle(rng, &mut vals);
                    for (slot, &v) in perm[lo..hi].iter().zip(&vals) {
                        col[*slot] = v;
                    }
                }
            }
            codes[step.column] = col;
        }
        // Final shuffle of rows.
        let mut order: Vec<usize> = (0..rows).collect();
        shuffle(rng, &mut order);
        codes.into_iter().map(|c| order.iter().map(|&i| c[i]).collect()).collect()
    }

    /// Generates and decodes `rows` rows.
    pub fn sample_batch<R: Rng + ?Sized>(&self, rows: usize, rng: &mut R) -> Result<RecordBatch, DecodeError> {
        let codes = self.sample_codes(rows, rng);
        let refs: Vec<&[u32]> = codes.iter().map(|c| c.as_slice()).collect();
        decode_columns(&self.domain, &refs, self.decode, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::DpRng;

    #[test]
    fn randomized_rounding_is_exact_in_total_and_unbiased() {
        let mut rng = DpRng::unsafe_seeded(3);
        let p = [0.155, 0.3, 0.545];
        let mut out = Vec::new();
        let mut sums = [0f64; 3];
        for _ in 0..20_000 {
            randomized_round(&mut rng, &p, 7, &mut out);
            assert_eq!(out.iter().sum::<u64>(), 7);
            for k in 0..3 {
                // floor(7p) ≤ out ≤ ceil(7p)
                assert!(out[k] as f64 >= (7.0 * p[k]).floor() && out[k] as f64 <= (7.0 * p[k]).ceil());
                sums[k] += out[k] as f64;
            }
        }
        for k in 0..3 {
            assert!((sums[k] / 20_000.0 - 7.0 * p[k]).abs() < 0.02, "{sums:?}");
        }
    }
}
