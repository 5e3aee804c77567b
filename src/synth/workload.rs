//! Workloads: weighted marginal queries the synthetic data should preserve
//! (001 §2.1, Def. 2; §6.1 for the skewed workload).

use itertools::Itertools;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Result, SynthError};
use crate::domain::Domain;

/// A weighted marginal query (attribute ids sorted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadQuery {
    /// Attribute ids, sorted.
    pub attrs: Vec<usize>,
    /// Weight c ≥ 0.
    pub weight: f64,
}

/// A workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// The queries.
    pub queries: Vec<WorkloadQuery>,
    /// How it was specified.
    pub spec: String,
}

/// All k-subsets of `0..n` in lexicographic order (seeded runs depend on it).
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    (0..n).combinations(k).collect()
}

fn cells(domain: &Domain, attrs: &[usize]) -> f64 {
    attrs.iter().map(|&a| domain.columns()[a].cardinality() as f64).product()
}

#[derive(Deserialize)]
struct FileEntry {
    attrs: Vec<String>,
    #[serde(default = "one")]
    weight: f64,
}

fn one() -> f64 {
    1.0
}

impl Workload {
    /// Parses a workload spec:
    /// * `all-k` / `all-kway` (e.g. `all-3way`), optional `:max-cells=N`;
    /// * `target:COL` — every 3-way marginal containing COL;
    /// * `skewed[:seed=S]` — 001 §6.1: attribute weights from a squared exponential, 256 triples ∝ product of weights;
    /// * `file:PATH` — YAML/JSON list of `{attrs: [..], weight: w}`;
    /// * `marginals:a,b;b,c` — exactly these marginals (weight 1), as NAPSU-MQ
    ///   measures them; a column repeated in a marginal, or a marginal given
    ///   twice, is refused.
    pub fn parse(spec: &str, domain: &Domain) -> Result<Self> {
        let d = domain.len();
        let mut parts = spec.split(':');
        let head = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let option = |name: &str| -> Option<&str> {
            rest.iter().find_map(|r| r.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        let queries: Vec<WorkloadQuery> = if let Some(k) = head.strip_prefix("all-") {
            let k: usize = k
                .trim_end_matches("way")
                .parse()
                .map_err(|source| SynthError::WorkloadK { spec: spec.to_string(), source })?;
            if k == 0 || k > d {
                return Err(SynthError::WorkloadKRange { spec: spec.to_string(), columns: d });
            }
            let max_cells: f64 = match option("max-cells") {
                Some(v) => v.parse().map_err(|source| SynthError::MaxCells { spec: spec.to_string(), source })?,
                None => f64::INFINITY,
            };
            combinations(d, k)
                .into_iter()
                .filter(|c| cells(domain, c) <= max_cells)
                .map(|attrs| WorkloadQuery { attrs, weight: 1.0 })
                .collect()
        } else if head == "target" {
            let col = rest.first().ok_or(SynthError::TargetColumnMissing)?;
            let t = domain
                .position(col)
                .ok_or_else(|| SynthError::WorkloadColumn { spec: spec.to_string(), column: col.to_string() })?;
            if d < 3 {
                return Err(SynthError::TargetTooFewColumns);
            }
            combinations(d, 3)
                .into_iter()
                .filter(|c| c.contains(&t))
                .map(|attrs| WorkloadQuery { attrs, weight: 1.0 })
                .collect()
        } else if head == "skewed" {
            let seed: u64 = option("seed")
                .map_or(Ok(0), |s| s.parse())
                .map_err(|source| SynthError::WorkloadSeed { spec: spec.to_string(), source })?;
            skewed(d, seed)
        } else if head == "file" {
            let path = rest.join(":");
            let text = std::fs::read_to_string(&path)
                .map_err(|source| SynthError::ReadWorkload { path: path.clone(), source })?;
            let entries: Vec<FileEntry> = serde_saphyr::from_str(&text)
                .map_err(|e| SynthError::ParseWorkload { path: path.clone(), source: Box::new(e) })?;
            entries
                .into_iter()
                .enumerate()
                .map(|(i, e)| {
                    let mut attrs = e
                        .attrs
                        .iter()
                        .map(|a| {
                            domain.position(a).ok_or_else(|| SynthError::WorkloadEntryColumn {
                                path: path.clone(),
                                entry: i,
                                column: a.clone(),
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    attrs.sort_unstable();
                    attrs.dedup();
                    if attrs.is_empty() || !(e.weight >= 0.0 && e.weight.is_finite()) {
                        return Err(SynthError::WorkloadEntry { path: path.clone(), entry: i });
                    }
                    Ok(WorkloadQuery { attrs, weight: e.weight })
                })
                .collect::<Result<_>>()?
        } else if head == "marginals" {
            marginals(spec, &rest.join(":"), domain)?
        } else {
            return Err(SynthError::UnknownWorkload(spec.to_string()));
        };
        if queries.is_empty() {
            return Err(SynthError::EmptyWorkload(spec.to_string()));
        }
        Ok(Self { queries, spec: spec.to_string() })
    }

    /// The downward closure W₊ with AIM weights w_r = Σ_s c_s |r ∩ s| (001 Alg 4 line 8).
    pub fn downward_closure(&self) -> Vec<(Vec<usize>, f64)> {
        let mut set: std::collections::BTreeSet<Vec<usize>> = Default::default();
        for q in &self.queries {
            let k = q.attrs.len();
            for mask in 1u32..(1 << k) {
                set.insert((0..k).filter(|i| mask & (1 << i) != 0).map(|i| q.attrs[i]).collect());
            }
        }
        let mut out: Vec<(Vec<usize>, f64)> = set
            .into_iter()
            .map(|r| {
                let w = self
                    .queries
                    .iter()
                    .map(|s| s.weight * r.iter().filter(|a| s.attrs.contains(a)).count() as f64)
                    .sum();
                (r, w)
            })
            .collect();
        out.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then(a.0.cmp(&b.0)));
        out
    }
}

/// The marginals of `list` (`a,b; b,c`), each sorted, in the order given.
fn marginals(spec: &str, list: &str, domain: &Domain) -> Result<Vec<WorkloadQuery>> {
    let mut out: Vec<WorkloadQuery> = Vec::new();
    for part in list.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let mut attrs = Vec::new();
        for name in part.split(',').map(str::trim) {
            let a = domain
                .position(name)
                .ok_or_else(|| SynthError::WorkloadColumn { spec: spec.to_string(), column: name.to_string() })?;
            if attrs.contains(&a) {
                return Err(SynthError::WorkloadRepeat { spec: spec.to_string(), column: name.to_string() });
            }
            attrs.push(a);
        }
        attrs.sort_unstable();
        if out.iter().any(|q| q.attrs == attrs) {
            return Err(SynthError::WorkloadDuplicate { spec: spec.to_string(), marginal: part.to_string() });
        }
        out.push(WorkloadQuery { attrs, weight: 1.0 });
    }
    Ok(out)
}

/// 001 §6.1 skewed workload: weights w_i = exp(−(i/d·4)²/2)-style squared
/// exponential over a random attribute order, 256 triples sampled with
/// probability ∝ product of weights (without replacement), fixed seed.
fn skewed(d: usize, seed: u64) -> Vec<WorkloadQuery> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..d).collect();
    for i in (1..d).rev() {
        let j = rng.random_range(0..=i);
        order.swap(i, j);
    }
    let mut w = vec![0.0; d];
    for (rank, &a) in order.iter().enumerate() {
        let x = rank as f64 / d as f64 * 4.0;
        w[a] = (-x * x / 2.0).exp();
    }
    let triples = combinations(d, 3);
    let mut weights: Vec<f64> = triples.iter().map(|t| t.iter().map(|&a| w[a]).product()).collect();
    let take = triples.len().min(256);
    let mut out = Vec::with_capacity(take);
    for _ in 0..take {
        let total: f64 = weights.iter().sum();
        let mut u = rng.random::<f64>() * total;
        let mut k = 0;
        while k + 1 < weights.len() && (u >= weights[k] || weights[k] == 0.0) {
            u -= weights[k];
            k += 1;
        }
        out.push(WorkloadQuery { attrs: triples[k].clone(), weight: 1.0 });
        weights[k] = 0.0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DomainSpec;

    fn domain() -> Domain {
        DomainSpec::parse(r#"{"a": 2, "b": 3, "c": 4, "d": 5}"#, "t.json").unwrap().domain
    }

    #[test]
    fn all_kway_target_and_closure() {
        let d = domain();
        assert_eq!(Workload::parse("all-2way", &d).unwrap().queries.len(), 6);
        assert_eq!(Workload::parse("all-3way:max-cells=30", &d).unwrap().queries.len(), 2);
        let t = Workload::parse("target:a", &d).unwrap();
        assert_eq!(t.queries.len(), 3);
        assert!(t.queries.iter().all(|q| q.attrs.contains(&0)));
        let w = Workload::parse("all-2way", &d).unwrap();
        let closure = w.downward_closure();
        assert_eq!(closure.len(), 4 + 6);
        // w_{a} = Σ over the 3 pairs containing a of |{a} ∩ s| = 3; w_{a,b} = 2 + 1·4 = 6.
        assert_eq!(closure.iter().find(|(r, _)| r == &vec![0]).unwrap().1, 3.0);
        assert_eq!(closure.iter().find(|(r, _)| r == &vec![0, 1]).unwrap().1, 6.0);
        assert!(Workload::parse("nope", &d).is_err());
        assert!(Workload::parse("target:zzz", &d).is_err());
        let s = Workload::parse("skewed", &d).unwrap();
        assert_eq!(s.queries.len(), 4);
    }

    #[test]
    fn explicit_marginals_are_sorted_and_checked() {
        let d = domain();
        let w = Workload::parse("marginals:b,a; c,b ;d", &d).unwrap();
        let attrs: Vec<Vec<usize>> = w.queries.iter().map(|q| q.attrs.clone()).collect();
        assert_eq!(attrs, vec![vec![0, 1], vec![1, 2], vec![3]]);
        let e = Workload::parse("marginals:a,zz", &d).unwrap_err().to_string();
        assert!(e.contains("unknown column \"zz\""), "{e}");
        let e = Workload::parse("marginals:a,b,a", &d).unwrap_err().to_string();
        assert!(e.contains("\"a\" twice"), "{e}");
        let e = Workload::parse("marginals:a,b;b,a", &d).unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
        assert!(Workload::parse("marginals:", &d).is_err());
    }
}
