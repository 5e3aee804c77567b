//! From a fitted model to a sampling plan (NOTES §3): the reverse elimination
//! order of the model's junction tree, and for each attribute the conditional
//! table given its already-generated neighbours (read from a clique belief).

use dpflow_udfs::domain::{DecodeMode, Domain};
use dpflow_udfs::synth::{SamplingPlan, SamplingStep};

use super::model::{GraphicalModel, PgmError};

/// Builds the sampling plan of `model` over `domain` (sizes must match the
/// domain's cardinalities).
pub fn sampling_plan(model: &GraphicalModel, domain: &Domain, decode: DecodeMode) -> Result<SamplingPlan, PgmError> {
    if domain.cardinalities() != model.sizes {
        return Err(PgmError::SizeMismatch { model: model.sizes.clone(), domain: domain.cardinalities() });
    }
    let beliefs = model.beliefs();
    let cliques: Vec<&Vec<usize>> = model.potentials.iter().map(|p| &p.attrs).collect();
    let order: Vec<usize> = model.jtree.order.iter().rev().copied().collect();
    let mut used: Vec<usize> = Vec::new();
    let mut steps = Vec::with_capacity(order.len());
    for &col in &order {
        // Neighbours of col in the model already generated.
        let mut parents: Vec<usize> = cliques
            .iter()
            .filter(|c| c.contains(&col))
            .flat_map(|c| c.iter().copied())
            .filter(|a| *a != col && used.contains(a))
            .collect();
        parents.sort_unstable();
        parents.dedup();
        let mut scope = parents.clone();
        scope.push(col);
        scope.sort_unstable();
        let marg = match beliefs.marginal(&scope) {
            Some(m) => m,
            None => model.marginal(&scope),
        };
        let mut layout = parents.clone();
        layout.push(col);
        let joint = marg.to_order(&layout);
        let size = model.sizes[col];
        let mut table = joint;
        for row in table.chunks_mut(size) {
            let s: f64 = row.iter().sum();
            if s > 0.0 && s.is_finite() {
                row.iter_mut().for_each(|v| *v /= s);
            } else {
                row.iter_mut().for_each(|v| *v = 1.0 / size as f64);
            }
        }
        steps.push(SamplingStep { column: col, parents, table });
        used.push(col);
    }
    let plan = SamplingPlan { domain: domain.clone(), steps, decode };
    plan.validate()?;
    Ok(plan)
}
