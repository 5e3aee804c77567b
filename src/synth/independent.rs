//! Independent: all 1-way marginals with Gaussian noise (ρ split evenly),
//! and the product of the fitted 1-way marginals.

use super::{FitContext, FitMetadata, Fitted, MeasurementLog, Result, Synthesizer, gauss, one_way};
use crate::domain::Domain;
use crate::synth::workload::Workload;

/// The Independent baseline.
#[derive(Debug, Clone, Default)]
pub struct Independent;

impl Synthesizer for Independent {
    fn name(&self) -> &'static str {
        "independent"
    }

    fn required_marginals(&self, domain: &Domain, _workload: &Workload) -> Vec<Vec<usize>> {
        one_way(domain.len())
    }

    #[allow(private_interfaces)]
    fn fit(&self, ctx: &mut FitContext<'_>) -> Result<Fitted> {
        let d = ctx.sizes.len();
        // d marginals with σ each: ρ = d/(2σ²).
        let sigma = (d as f64 / (2.0 * ctx.rho)).sqrt();
        let mut ms = Vec::with_capacity(d);
        let mut log = Vec::with_capacity(d);
        for a in 0..d {
            let m = ctx.measure(&[a], sigma)?;
            log.push(
                MeasurementLog::new(ctx.names(&[a]), gauss(sigma), 1, ctx.options.confidence).with_values(&m.values),
            );
            ms.push(m);
        }
        let model = ctx.estimate(&ms, None, ctx.options.iters);
        Ok(Fitted {
            model,
            compression: None,
            metadata: FitMetadata { measurements: log, rounds: 1, ..Default::default() },
        })
    }
}
