//! AIM's error bounds (001 §5, App. B): for every workload marginal, a
//! high-probability upper bound on ‖M_r(D) − M_r(D̂)‖₁ computed only from
//! AIM's private outputs (no extra budget).
//!
//! * Supported r (r ⊆ some measured r_i): the weighted-average estimator ȳ_r
//!   (Thm 1) with σ̄_r² = [Σ_{i: r ⊆ r_i} n_r/(n_{r_i} σ_i²)]⁻¹ and, w.p. ≥ 1−e^{−λ²}
//!   (Thm 2, Cor 3): ‖M_r(D) − M_r(D̂)‖₁ ≤ ‖M_r(D̂) − ȳ_r‖₁ + √(2 ln 2)·σ̄_r·n_r + λ·σ̄_r·√(2n_r).
//! * Unsupported r, using the last round t where r was a candidate (Thm 4,
//!   Cor 5): w.p. ≥ 1 − e^{−λ₁²/2} − e^{−λ₂},
//!   ‖M_r(D) − M_r(D̂)‖₁ ≤ ‖M_r(D̂) − M_r(p̂_{t−1})‖₁ + w_r⁻¹(B_r + λ₁σ_t√n_{r_t} + λ₂·2Δ_t/ε_t),
//!   B_r = w_{r_t}‖M_{r_t}(p̂_{t−1}) − ỹ_t‖₁ + √(2/π)σ_t(w_r n_r − w_{r_t} n_{r_t}) + (2Δ_t/ε_t) ln|C_t|.
//!
//! For confidence 1 − β we take λ = √ln(1/β) (supported) and split β evenly
//! between the two failure events: λ₁ = √(2 ln(2/β)), λ₂ = ln(2/β)
//! (unsupported). D̂ is the final model p̂ (the synthetic rows are its
//! randomized rounding).

use serde::{Deserialize, Serialize};

use crate::pgm::{Factor, GraphicalModel};

/// One workload marginal's bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBound {
    /// Attribute names.
    pub attributes: Vec<String>,
    /// `supported` or `unsupported` (or `none` when r was never a candidate).
    pub kind: String,
    /// Upper bound on ‖M_r(D) − M_r(D̂)‖₁ in counts.
    pub l1_bound: Option<f64>,
    /// The same divided by the estimated total (an L1 distance between distributions; TVD bound = half).
    pub l1_bound_normalized: Option<f64>,
    /// Confidence level.
    pub confidence: f64,
    /// Round whose quantities were used (unsupported bounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<usize>,
}

/// What AIM records about a round for the unsupported bound.
#[derive(Debug, Clone)]
pub(crate) struct RoundInfo {
    pub sigma: f64,
    pub epsilon: f64,
    pub selected: Vec<usize>,
    pub selected_weight: f64,
    pub selected_cells: f64,
    /// ‖M_{r_t}(p̂_{t−1}) − ỹ_t‖₁.
    pub selected_error: f64,
    /// Δ_t = max w over C_t.
    pub delta: f64,
    /// |C_t|.
    pub candidates: usize,
}

/// A measurement as needed for the supported bound.
#[derive(Debug, Clone)]
pub(crate) struct MeasuredMarginal {
    pub attrs: Vec<usize>,
    pub values: Vec<f64>,
    pub sigma: f64,
}

/// Computes bounds for the workload marginals.
#[allow(clippy::too_many_arguments)]
pub(crate) fn workload_bounds(
    workload: &[(Vec<usize>, f64)],
    names: &dyn Fn(&[usize]) -> Vec<String>,
    sizes: &[usize],
    measured: &[MeasuredMarginal],
    rounds: &[RoundInfo],
    last_candidate: &std::collections::HashMap<Vec<usize>, (usize, Vec<f64>)>,
    final_model: &GraphicalModel,
    confidence: f64,
) -> Vec<ErrorBound> {
    let beta = (1.0 - confidence).clamp(1e-300, 1.0);
    let lambda = (1.0 / beta).ln().sqrt();
    let lambda1 = (2.0 * (2.0 / beta).ln()).sqrt();
    let lambda2 = (2.0 / beta).ln();
    let beliefs = final_model.beliefs();
    let messages = crate::pgm::MessageCache::default();
    let total = final_model.total.max(1.0);
    workload
        .iter()
        .map(|(r, w_r)| {
            let n_r: f64 = r.iter().map(|&a| sizes[a] as f64).product();
            let model_r = beliefs.marginal_any_cached(r, sizes, Some(&messages));
            let containing: Vec<&MeasuredMarginal> =
                measured.iter().filter(|m| r.iter().all(|a| m.attrs.contains(a))).collect();
            let (kind, bound, round) = if !containing.is_empty() {
                // Weighted-average estimator (Thm 1).
                let mut acc = vec![0.0; n_r as usize];
                let mut wsum = 0.0;
                for m in &containing {
                    let n_i: f64 = m.attrs.iter().map(|&a| sizes[a] as f64).product();
                    let f = Factor {
                        attrs: m.attrs.clone(),
                        shape: m.attrs.iter().map(|&a| sizes[a]).collect(),
                        values: m.values.clone(),
                    };
                    let proj = f.sum_to(r);
                    let v = n_r / (n_i * m.sigma * m.sigma);
                    for (a, p) in acc.iter_mut().zip(&proj.values) {
                        *a += v * p;
                    }
                    wsum += v;
                }
                let ybar: Vec<f64> = acc.iter().map(|a| a / wsum).collect();
                let sigma_bar = (1.0 / wsum).sqrt();
                let b = super::l1(&model_r.values, &ybar)
                    + (2.0 * 2f64.ln()).sqrt() * sigma_bar * n_r
                    + lambda * sigma_bar * (2.0 * n_r).sqrt();
                ("supported", Some(b), None)
            } else if let Some((t, prev)) = last_candidate.get(r) {
                let info = &rounds[*t];
                let em = 2.0 * info.delta / info.epsilon;
                let b_r = info.selected_weight * info.selected_error
                    + (2.0 / std::f64::consts::PI).sqrt()
                        * info.sigma
                        * (w_r * n_r - info.selected_weight * info.selected_cells)
                    + em * (info.candidates as f64).ln();
                let inner = (b_r + lambda1 * info.sigma * info.selected_cells.sqrt() + lambda2 * em) / w_r;
                let b = super::l1(&model_r.values, prev) + inner.max(0.0);
                let _ = &info.selected;
                ("unsupported", Some(b), Some(*t + 1))
            } else {
                ("none", None, None)
            };
            ErrorBound {
                attributes: names(r),
                kind: kind.to_string(),
                l1_bound: bound,
                l1_bound_normalized: bound.map(|b| b / total),
                confidence,
                round,
            }
        })
        .collect()
}
