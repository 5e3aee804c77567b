//! Domain compression for MST (NOTES §4; McKenna, Miklau, Sheldon 2021):
//! values whose noisy 1-way count is below 3σ are merged into one code, and
//! generated codes of the merged bin are mapped back uniformly to its members.
//! Everything here is post-processing of noisy counts.

use serde::{Deserialize, Serialize};

use crate::pgm::{Factor, Measurement, Query};
use dpflow_udfs::synth::{SamplingPlan, SamplingStep};

/// Per-column compression: model code → domain codes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compression {
    /// For each column, `members[c][k]` = the domain codes merged into model code k.
    pub members: Vec<Vec<Vec<u32>>>,
}

impl Compression {
    /// Builds the compression from noisy 1-way measurements (one per column, in order).
    pub fn from_one_way(one_way: &[Measurement]) -> Self {
        let members = one_way
            .iter()
            .map(|m| {
                let keep: Vec<u32> =
                    (0..m.values.len() as u32).filter(|&v| m.values[v as usize] >= 3.0 * m.sigma).collect();
                let rest: Vec<u32> =
                    (0..m.values.len() as u32).filter(|&v| m.values[v as usize] < 3.0 * m.sigma).collect();
                let mut groups: Vec<Vec<u32>> = keep.into_iter().map(|v| vec![v]).collect();
                if !rest.is_empty() {
                    groups.push(rest);
                }
                groups
            })
            .collect();
        Self { members }
    }

    /// Model sizes after compression.
    pub fn sizes(&self) -> Vec<usize> {
        self.members.iter().map(|g| g.len()).collect()
    }

    /// Whether anything was merged.
    pub fn is_trivial(&self) -> bool {
        self.members.iter().all(|g| g.iter().all(|m| m.len() == 1))
    }

    /// Domain code → model code, per column.
    fn forward(&self, col: usize, domain_size: usize) -> Vec<usize> {
        let mut f = vec![0usize; domain_size];
        for (k, g) in self.members[col].iter().enumerate() {
            for &v in g {
                f[v as usize] = k;
            }
        }
        f
    }

    /// Sums a domain-coded table (sorted attrs) into the compressed layout.
    pub fn compress_table(&self, attrs: &[usize], domain_sizes: &[usize], values: &[f64]) -> Vec<f64> {
        let csizes = self.sizes();
        let src = Factor {
            attrs: attrs.to_vec(),
            shape: attrs.iter().map(|&a| domain_sizes[a]).collect(),
            values: values.to_vec(),
        };
        let maps: Vec<Vec<usize>> = attrs.iter().map(|&a| self.forward(a, domain_sizes[a])).collect();
        let dst_shape: Vec<usize> = attrs.iter().map(|&a| csizes[a]).collect();
        let dst_strides = crate::pgm::factor::strides(&dst_shape);
        let mut out = vec![0.0; dst_shape.iter().product()];
        let mut idx = vec![0usize; attrs.len()];
        for &v in &src.values {
            let j: usize = idx.iter().enumerate().map(|(k, &c)| maps[k][c] * dst_strides[k]).sum();
            out[j] += v;
            // advance the odometer
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < src.shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    }

    /// Re-expresses a noisy 1-way measurement over the compressed column as
    /// private-pgm does: kept cells as they are; the merged cell as its sum
    /// divided by √k, with the query weighting that cell by 1/√k (so the noise
    /// stays σ per cell).
    pub fn compress_one_way(&self, m: &Measurement) -> Measurement {
        let col = m.attrs[0];
        let groups = &self.members[col];
        let mut values = Vec::with_capacity(groups.len());
        let mut weights = Vec::with_capacity(groups.len());
        for g in groups {
            let s: f64 = g.iter().map(|&v| m.values[v as usize]).sum();
            let k = (g.len() as f64).sqrt();
            values.push(s / k);
            weights.push(1.0 / k);
        }
        // An observed-only measurement estimates c·M(p): keep the factor.
        let c = match m.query {
            Query::Scaled(c) => c,
            _ => 1.0,
        };
        let query = if weights.iter().all(|w| *w == 1.0) {
            if c == 1.0 { Query::Identity } else { Query::Scaled(c) }
        } else {
            Query::Weighted(weights.iter().map(|w| w * c).collect())
        };
        Measurement { attrs: m.attrs.clone(), values, sigma: m.sigma, query }
    }

    /// Expands a sampling plan over compressed codes into one over domain
    /// codes: a merged code's probability is split uniformly among its members,
    /// and a parent's domain code reads the row of its compressed code.
    pub fn expand_plan(
        &self,
        plan: SamplingPlan,
        domain_sizes: &[usize],
        domain: dpflow_udfs::domain::Domain,
    ) -> SamplingPlan {
        let csizes = self.sizes();
        let steps = plan
            .steps
            .into_iter()
            .map(|s| {
                let parent_maps: Vec<Vec<usize>> =
                    s.parents.iter().map(|&p| self.forward(p, domain_sizes[p])).collect();
                let parent_dsizes: Vec<usize> = s.parents.iter().map(|&p| domain_sizes[p]).collect();
                let parent_csizes: Vec<usize> = s.parents.iter().map(|&p| csizes[p]).collect();
                let cstrides = crate::pgm::factor::strides(&parent_csizes);
                let combos: usize = parent_dsizes.iter().product();
                let dsize = domain_sizes[s.column];
                let csize = csizes[s.column];
                let fwd = self.forward(s.column, dsize);
                let group_len: Vec<usize> = self.members[s.column].iter().map(|g| g.len()).collect();
                let mut table = Vec::with_capacity(combos * dsize);
                let mut idx = vec![0usize; s.parents.len()];
                for _ in 0..combos {
                    let crow: usize = idx.iter().enumerate().map(|(k, &c)| parent_maps[k][c] * cstrides[k]).sum();
                    let row = &s.table[crow * csize..(crow + 1) * csize];
                    for &k in fwd.iter().take(dsize) {
                        table.push(row[k] / group_len[k] as f64);
                    }
                    for k in (0..idx.len()).rev() {
                        idx[k] += 1;
                        if idx[k] < parent_dsizes[k] {
                            break;
                        }
                        idx[k] = 0;
                    }
                }
                SamplingStep { column: s.column, parents: s.parents, table }
            })
            .collect();
        SamplingPlan { domain, steps, decode: plan.decode }
    }
}
