//! Collects a report's inputs from a published release: its CSV outputs,
//! the synthetic data's one-way marginals (post-processing of the release)
//! and the dataset's ledger history. Reads only published outputs and the
//! ledger, never the protected input.

use std::collections::BTreeMap;

use datafusion::execution::context::SessionContext;
use dpflow_udfs::marginal::NullMode;
use serde_json::Value;
use sha2::Digest;

use super::{ReportError, ReportInput};
use crate::dataset::{CodeSource, Dataset};
use crate::privacy::{Budget, ChargeRow};

/// What [`gather`] read.
#[derive(Debug, Default)]
pub struct Gathered {
    /// CSV outputs by name.
    pub csv: BTreeMap<String, Vec<u8>>,
    /// Synthetic one-way counts per step and attribute.
    pub synthetic: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// napsu-mq's published noisy statistics per step.
    pub statistics: BTreeMap<String, Value>,
}

fn read_err(e: impl std::fmt::Display) -> ReportError {
    ReportError::Read(e.to_string())
}

/// Reads the published outputs `manifest` lists, from `base` (the release's
/// directory, where its manifest is) only: each output must be a safe name
/// relative to `base`, is read at `base/name` (never at a URL the manifest
/// gives), and its bytes must hash to the manifest's SHA-256 for it. An edited manifest therefore cannot point
/// the report at another file (e.g. the protected input). `dataset`: the
/// release's dataset (its domain decodes the synthetic outputs); without it
/// the synthetic marginals are not computed.
pub async fn gather(
    ctx: &SessionContext,
    manifest: &Value,
    base: &str,
    dataset: Option<&Dataset>,
) -> Result<Gathered, ReportError> {
    let mut g = Gathered::default();
    let outputs = manifest.get("outputs").and_then(Value::as_array).cloned().unwrap_or_default();
    let base = base.trim_end_matches('/');
    // The checked location and recorded hash of a step's output `name`.
    let located = |step: &str, name: &str| -> Result<Option<(String, String)>, ReportError> {
        if let Some(why) = crate::io::names::relative_name_problem(name) {
            return Err(ReportError::Read(format!("the manifest names output {name:?}: {why}")));
        }
        // Read from base/name whatever the record's URL says (a release may have been
        // published from another working directory, or moved); the record only
        // supplies the hash.
        let url = format!("{base}/{name}");
        Ok(outputs.iter().find_map(|o| {
            let recorded = o.get("url")?.as_str()?;
            let same = recorded == name || recorded.ends_with(&format!("/{name}"));
            if o.get("step")?.as_str()? != step || !same {
                return None;
            }
            Some((url.clone(), o.get("sha256")?.as_str()?.to_string()))
        }))
    };
    let checked_read = |url: String, sha: String| async move {
        let bytes = crate::io::read_bytes(ctx, &url).await.map_err(read_err)?;
        if hex::encode(sha2::Sha256::digest(&bytes)) != sha {
            return Err(ReportError::Read(format!(
                "{url} does not match the SHA-256 the manifest records for it: the release was changed after it \
                 was published"
            )));
        }
        Ok::<_, ReportError>(bytes)
    };
    let steps = manifest.get("steps").and_then(Value::as_array).cloned().unwrap_or_default();
    for s in &steps {
        let step = s.get("step").and_then(Value::as_str).unwrap_or_default();
        let names: Vec<String> = s
            .get("outputs")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
            .unwrap_or_default();
        for n in names.iter().filter(|n| n.ends_with(".csv")) {
            if let Some((url, sha)) = located(step, n)? {
                g.csv.insert(n.clone(), checked_read(url, sha).await?);
            }
        }
        for n in names.iter().filter(|n| n.ends_with(".napsu.json")) {
            if let Some((url, sha)) = located(step, n)? {
                let bytes = checked_read(url, sha).await?;
                let v: Value = serde_json::from_slice(&bytes).map_err(read_err)?;
                if let Some(st) = v.get("napsu").and_then(|x| x.get("statistics")) {
                    g.statistics.insert(step.to_string(), st.clone());
                }
            }
        }
        // The synthetic data's one-way marginals where the step logged noisy one-way counts.
        let (Some(ds), Some(first)) = (dataset, names.first()) else { continue };
        let Some((url, sha)) = located(step, first)? else { continue };
        let logs: Vec<crate::synth::MeasurementLog> =
            s.get("measurements").and_then(|v| serde_json::from_value(v.clone()).ok()).unwrap_or_default();
        let wanted: Vec<(String, usize)> = logs
            .iter()
            .filter(|l| l.attributes.len() == 1 && !l.values.is_empty())
            .map(|l| (l.attributes[0].clone(), l.values.len()))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        // The synthetic output is read through the domain below: check its hash first.
        checked_read(url.clone(), sha).await?;
        let mut syn = ds.clone();
        syn.location = url;
        syn.extra_locations = vec![];
        syn.format = None;
        let domain = ds.domain();
        let mut counts = BTreeMap::new();
        for mode in [NullMode::Cells, NullMode::Observed] {
            let sets: Vec<(String, Vec<usize>)> = wanted
                .iter()
                .filter_map(|(a, len)| {
                    let i = domain.position(a)?;
                    let c = &domain.columns()[i];
                    let size = if mode == NullMode::Cells { c.cardinality() } else { c.size() };
                    (size == *len && !counts.contains_key(a)).then(|| (a.clone(), vec![i]))
                })
                .collect();
            if sets.is_empty() {
                continue;
            }
            let idx: Vec<Vec<usize>> = sets.iter().map(|s| s.1.clone()).collect();
            let (answers, _) = crate::synth::run::exact_answers_from(ctx, &syn, &idx, mode, &CodeSource::Plain)
                .await
                .map_err(read_err)?;
            for (a, i) in sets {
                counts.insert(a, answers.get(&i).map_err(read_err)?.to_vec());
            }
        }
        g.synthetic.insert(step.to_string(), counts);
    }
    Ok(g)
}

/// Gathers and renders in one call.
pub async fn build(
    ctx: &SessionContext,
    manifest: &Value,
    base: &str,
    dataset: Option<&Dataset>,
    ledger: Option<(&Budget, &[ChargeRow])>,
) -> Result<String, ReportError> {
    let g = gather(ctx, manifest, base, dataset).await?;
    super::render(&ReportInput {
        manifest,
        csv: &g.csv,
        synthetic: &g.synthetic,
        statistics: &g.statistics,
        domain: dataset.map(|d| d.domain()),
        ledger,
    })
}
