//! The release report (issue 20, item 1): one self-contained HTML file
//! (inline CSS and SVG, no scripts, no network fetches) written beside every
//! pipeline release's `manifest.json`, and by `dpflow report`.
//!
//! It shows only what is public: the manifest (mechanisms, noise scales,
//! losses, measurement logs, AIM's error bounds, the ground-truth
//! amplification), the release's published outputs, the dataset's budget
//! history from the ledger, and the synthetic data's one-way marginals
//! (post-processing of the release) against the noisy one-way measurements.
//! Every released number whose noise does not depend on the data gets its
//! interval (counts and sums: the value ± the half-width the release states,
//! see `Prediction::stated_half_width`; noisy marginal cells: ± their
//! `ci_half_width`); a number whose interval depends on the data says where
//! to find it or why there is none.

pub mod curator;
pub mod gather;
pub mod plots;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::domain::Domain;
use crate::privacy::budget::spent_in_unit;
use crate::privacy::{Budget, ChargeRow, ChargeStatus, MechanismRecord, Normalized, Prediction};

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The manifest lacks a field or has one of the wrong shape.
    #[error("the manifest's {field} is missing or malformed: {why} (is it a dpflow-release-v1 manifest?)")]
    Manifest {
        /// The field.
        field: String,
        /// Why.
        why: String,
    },
    /// A published CSV output cannot be parsed.
    #[error("output {file}: not a CSV table: {source}")]
    Csv {
        /// The output.
        file: String,
        /// Why.
        source: csv::Error,
    },
    /// A plot failed.
    #[error(transparent)]
    Plot(#[from] plots::PlotError),
    /// Reading an output or the synthetic data failed.
    #[error("reading the release's outputs: {0}")]
    Read(String),
}

type Result<T> = std::result::Result<T, ReportError>;

/// Everything a report shows (all public).
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    /// The release's manifest.
    pub manifest: &'a Value,
    /// Published CSV outputs by their name in the manifest.
    pub csv: &'a BTreeMap<String, Vec<u8>>,
    /// Per synthesize step, per attribute: the synthetic data's one-way
    /// counts, in the layout of the step's noisy one-way measurement.
    pub synthetic: &'a BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// Per napsu-mq step: its published noisy statistics (the
    /// `dpflow-napsu-statistics-v1` object of its `.napsu.json` output).
    pub statistics: &'a BTreeMap<String, Value>,
    /// The dataset's domain (cell labels), when known.
    pub domain: Option<&'a Domain>,
    /// The dataset's total budget and its ledger charges, when the ledger is at hand.
    pub ledger: Option<(&'a Budget, &'a [ChargeRow])>,
}

/// HTML-escapes text.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A number as the report prints it: integers without a fraction, else six
/// significant digits.
pub fn num(x: f64) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        crate::privacy::accuracy::fmt_sig(x, 6)
    }
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value> {
    v.get(name).ok_or_else(|| ReportError::Manifest { field: name.into(), why: "missing".into() })
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value, name: &str) -> Result<T> {
    serde_json::from_value(field(v, name)?.clone())
        .map_err(|e| ReportError::Manifest { field: name.into(), why: e.to_string() })
}

fn text(v: &Value, name: &str) -> String {
    match v.get(name) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}\
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}h3{font-size:1.05em}\
table{border-collapse:collapse;margin:.6em 0 1.2em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;\
font-variant-numeric:tabular-nums}th{background:#f3f3f3}.warn{background:#fde2e1;border:2px solid #c00;padding:.8em;\
font-weight:bold}.note{color:#555;font-size:.92em}pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}\
figure{margin:.5em 0}figcaption{font-size:.9em;color:#444}.key{font-size:.9em}";

/// Renders the report.
pub fn render(input: &ReportInput<'_>) -> Result<String> {
    let m = input.manifest;
    let release = text(m, "release_id");
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>dpflow release {}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>Release {}</h1>\n",
        esc(&release),
        esc(&release)
    );
    if m.get("unsafe_seed").is_some_and(|s| !s.is_null()) {
        h += "<p class=\"warn\">NOT PRIVATE: this release was made with a fixed seed (--unsafe-seed), so its noise \
              can be reproduced and removed. Do not publish it.</p>\n";
    }
    let _ = write!(
        h,
        "<table>\n<tr><th>pipeline</th><td>{}</td></tr>\n<tr><th>dataset</th><td>{}</td></tr>\n<tr><th>privacy \
         unit</th><td>{}</td></tr>\n<tr><th>made</th><td>{} to {}</td></tr>\n<tr><th>dpflow</th><td>{}</td></tr>\n\
         </table>\n",
        esc(&text(m, "pipeline")),
        esc(&text(m, "dataset")),
        esc(&text(m, "privacy_unit")),
        esc(&text(m, "started_at")),
        esc(&text(m, "finished_at")),
        esc(&text(m, "dpflow_version")),
    );
    budget_section(&mut h, input)?;
    let steps: Vec<Value> = typed(m, "steps")?;
    for s in &steps {
        step_section(&mut h, s, input)?;
    }
    h += "<p class=\"note\">Every number in this report comes from the release's differentially private outputs, \
          their public noise scales, and public inputs (the domain, the bounds, the budget ledger). Intervals are \
          for the noise only: they do not include the error of clamping values to their bounds or of a \
          synthesizer's model.</p>\n</body>\n</html>\n";
    Ok(h)
}

fn budget_section(h: &mut String, input: &ReportInput<'_>) -> Result<()> {
    let m = input.manifest;
    let budget: Budget = typed(m, "budget")?;
    let spent: f64 = typed(m, "spent")?;
    let remaining: f64 = typed(m, "remaining")?;
    let _ = write!(
        h,
        "<h2>Privacy budget</h2>\n<table>\n<tr><th>this release's budget</th><td>{}</td></tr>\n<tr><th>spent by \
         this release</th><td>{}</td></tr>\n<tr><th>left on the dataset after it</th><td>{}</td></tr>\n<tr><th>ledger \
         charge</th><td>#{}</td></tr>\n</table>\n",
        esc(&budget.describe()),
        num(spent),
        num(remaining),
        esc(&text(m, "ledger_charge"))
    );
    let Some((total, charges)) = input.ledger else {
        h.push_str("<p class=\"note\">No ledger was given: the budget timeline is not shown.</p>\n");
        return Ok(());
    };
    let mut acc = Normalized::default();
    let mut points = Vec::new();
    let mut rows = String::new();
    // Every charge that counts as spent (committed, failed after a read, or
    // reserved), without what tells them apart: whether a run failed can
    // depend on the data (docs/PRIVACY.md §1, §7). Analysts' queries are not
    // named.
    for (i, c) in charges.iter().filter(|c| c.status != ChargeStatus::Released).enumerate() {
        acc = acc + c.normalized;
        let y = spent_in_unit(total, &acc);
        points.push(((i + 1) as f64, y));
        let what = if c.analyst.is_some() {
            "an analyst's query".to_string()
        } else {
            c.release_id.split("#failed-").next().unwrap_or_default().to_string()
        };
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            i + 1,
            esc(&what),
            esc(&c.reserved_at),
            num(c.cost),
            num(y)
        );
    }
    let unit = total.unit_name();
    let _ = write!(
        h,
        "<h3>The dataset's budget over time</h3>\n<figure>{}<figcaption>Cumulative spending of every charge on the \
         dataset (blue) against its total budget {} (red).</figcaption></figure>\n<table>\n<tr><th>#</th><th>release \
         or query</th><th>reserved</th><th>cost ({unit})</th><th>cumulative ({unit})</th></tr>\n{rows}\
         </table>\n",
        plots::budget_timeline(&points, total.amount(), unit)?,
        esc(&total.describe())
    );
    Ok(())
}

/// A loss with its numbers as the report prints them.
fn loss_text(l: &crate::privacy::PrivacyLoss) -> String {
    use crate::privacy::PrivacyLoss as L;
    match l {
        L::Pure { epsilon } => format!("ε = {}", num(*epsilon)),
        L::Approx { epsilon, delta } => format!("ε = {}, δ = {delta:e}", num(*epsilon)),
        L::Zcdp { rho } => format!("ρ = {}", num(*rho)),
        other => other.describe(),
    }
}

fn noise_text(r: &MechanismRecord) -> String {
    match &r.noise {
        Some(dpflow_udfs::noise::NoiseDistribution::Laplace { scale }) => format!("Laplace b = {}", num(*scale)),
        Some(dpflow_udfs::noise::NoiseDistribution::Gaussian { sigma }) => format!("Gaussian σ = {}", num(*sigma)),
        None => "—".into(),
    }
}

fn mechanisms_table(h: &mut String, recs: &[MechanismRecord]) {
    if recs.is_empty() {
        return;
    }
    h.push_str(
        "<table>\n<tr><th>mechanism</th><th>measures</th><th>sensitivity</th><th>noise</th><th>privacy \
         loss</th></tr>\n",
    );
    for r in recs {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.mechanism),
            esc(&r.target),
            r.sensitivity.map_or("—".into(), num),
            esc(&noise_text(r)),
            esc(&loss_text(&r.loss))
        );
    }
    h.push_str("</table>\n");
}

fn step_section(h: &mut String, s: &Value, input: &ReportInput<'_>) -> Result<()> {
    let name = text(s, "step");
    let kind = text(s, "kind");
    let _ = writeln!(h, "<h2>Step {} ({})</h2>", esc(&name), esc(&kind));
    let recs: Vec<MechanismRecord> = match s.get("mechanisms") {
        Some(v) if !v.is_null() => serde_json::from_value(v.clone())
            .map_err(|e| ReportError::Manifest { field: format!("steps.{name}.mechanisms"), why: e.to_string() })?,
        _ => vec![],
    };
    mechanisms_table(h, &recs);
    for key in ["note", "amplification_note"] {
        if let Some(Value::String(n)) = s.get(key) {
            let _ = writeln!(h, "<p class=\"note\">{}</p>", esc(n));
        }
    }
    match kind.as_str() {
        "sql" => sql_step(h, s, input)?,
        "synthesize" => synth_step(h, s, &name, input)?,
        _ => {
            for o in outputs_of(s) {
                if let Some(bytes) = input.csv.get(&o) {
                    csv_table(h, &o, bytes, &[])?;
                }
            }
        }
    }
    Ok(())
}

fn outputs_of(s: &Value) -> Vec<String> {
    s.get("outputs")
        .and_then(|o| o.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn sql_step(h: &mut String, s: &Value, input: &ReportInput<'_>) -> Result<()> {
    let _ = writeln!(h, "<pre>{}</pre>", esc(&text(s, "query")));
    let columns: Vec<Prediction> = match s.get("columns") {
        Some(v) if !v.is_null() => serde_json::from_value(v.clone()).map_err(|e| ReportError::Manifest {
            field: format!("steps.{}.columns", text(s, "step")),
            why: e.to_string(),
        })?,
        _ => vec![],
    };
    for o in outputs_of(s) {
        if let Some(bytes) = input.csv.get(&o) {
            csv_table(h, &o, bytes, &columns)?;
        }
    }
    let mut notes = Vec::new();
    for c in &columns {
        let why = match (c.stated_half_width, c.statistic.as_str()) {
            (Some(w), _) => format!(
                "{}: {} ± {} at {}% (the noise does not depend on the data)",
                c.target,
                c.statistic,
                num(w),
                num(c.level * 100.0)
            ),
            (None, "mean" | "variance") => format!(
                "{}: a {}'s interval depends on its released noisy count; the query's dp_ci_low/dp_ci_high columns \
                 publish it (add them where absent)",
                c.target, c.statistic
            ),
            (None, "quantile") => format!(
                "{}: the exponential mechanism's error in value depends on how dense the data is near the \
                 quantile{}; the query's dp_ci_low/dp_ci_high columns publish an interval holding the exact sample \
                 quantile (each end is a selection of its own, at a share of the budget; add them where absent)",
                c.target,
                c.rank_error.map_or(String::new(), |r| format!(" (its rank error is at most {} rows at 95%)", num(r)))
            ),
            (None, _) => format!("{}: {}", c.target, c.basis),
        };
        notes.push(format!("<li>{}</li>", esc(&why)));
    }
    if !notes.is_empty() {
        let _ = writeln!(h, "<ul class=\"key\">{}</ul>", notes.join(""));
    }
    Ok(())
}

/// A published CSV as a table; a column with a stated interval gets one more
/// column with it.
fn csv_table(h: &mut String, file: &str, bytes: &[u8], columns: &[Prediction]) -> Result<()> {
    let csv_err = |source| ReportError::Csv { file: file.to_string(), source };
    let mut r = csv::ReaderBuilder::new().has_headers(true).from_reader(bytes);
    let headers: Vec<String> = r.headers().map_err(csv_err)?.iter().map(String::from).collect();
    let hw: Vec<Option<f64>> =
        headers.iter().map(|c| columns.iter().find(|p| &p.target == c).and_then(|p| p.stated_half_width)).collect();
    let level = columns.first().map_or(0.95, |p| p.level);
    let _ = write!(h, "<h3>{}</h3>\n<table>\n<tr>", esc(file));
    for (c, w) in headers.iter().zip(&hw) {
        let _ = write!(h, "<th>{}</th>", esc(c));
        if w.is_some() {
            let _ = write!(h, "<th>{} {}% interval</th>", esc(c), num(level * 100.0));
        }
    }
    h.push_str("</tr>\n");
    for rec in r.records() {
        let rec = rec.map_err(csv_err)?;
        h.push_str("<tr>");
        for (i, v) in rec.iter().enumerate() {
            let _ = write!(h, "<td>{}</td>", esc(v));
            if let Some(Some(w)) = hw.get(i) {
                let cell = match v.trim().parse::<f64>() {
                    Ok(x) => format!("[{}, {}]", num(x - w), num(x + w)),
                    Err(_) => "—".into(),
                };
                let _ = write!(h, "<td>{cell}</td>");
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    Ok(())
}

fn synth_step(h: &mut String, s: &Value, name: &str, input: &ReportInput<'_>) -> Result<()> {
    let _ = write!(
        h,
        "<table>\n<tr><th>mechanism</th><td>{}</td></tr>\n<tr><th>synthetic rows</th><td>{}</td></tr>\n\
         <tr><th>ρ of the fit</th><td>{}</td></tr>\n<tr><th>synthetic sets</th><td>{}</td></tr>\n</table>\n",
        esc(&text(s, "mechanism")),
        esc(&text(s, "rows")),
        esc(&text(s, "rho_spent")),
        esc(&text(s, "multiple")),
    );
    if let Some(a) = s.get("amplification").filter(|a| !a.is_null()) {
        let _ = writeln!(
            h,
            "<p>Ground-truth amplification by the declared missingness ({}): nominal ε = {}, amplified ε̄ = {} at δ = \
             {}. {}</p>",
            esc(&text(a, "method")),
            esc(&text(a, "nominal_epsilon")),
            esc(&text(a, "epsilon")),
            esc(&text(a, "delta")),
            esc(&text(s, "amplification_scope")),
        );
        for c in a.get("caveats").and_then(|c| c.as_array()).into_iter().flatten() {
            let _ = writeln!(h, "<p>ε̄ {}</p>", esc(c.as_str().unwrap_or_default()));
        }
    }
    let ms: Vec<crate::synth::MeasurementLog> = match s.get("measurements") {
        Some(v) if !v.is_null() => serde_json::from_value(v.clone())
            .map_err(|e| ReportError::Manifest { field: format!("steps.{name}.measurements"), why: e.to_string() })?,
        _ => vec![],
    };
    if !ms.is_empty() {
        let _ = write!(
            h,
            "<h3>Noisy measurements</h3>\n<table>\n<tr><th>marginal</th><th>round</th><th>noise</th><th>σ</th>\
             <th>each cell's {}% interval</th></tr>\n",
            num(ms[0].level * 100.0)
        );
        for x in &ms {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>± {}</td></tr>",
                esc(&x.attributes.join(", ")),
                x.round,
                esc(&x.noise),
                num(x.sigma),
                num(x.ci_half_width),
            );
        }
        h.push_str("</table>\n");
    }
    let bounds: Vec<crate::synth::bounds::ErrorBound> = match s.get("error_bounds") {
        Some(v) if !v.is_null() => serde_json::from_value(v.clone()).unwrap_or_default(),
        _ => vec![],
    };
    if !bounds.is_empty() {
        h.push_str(
            "<h3>AIM's error bounds per workload marginal</h3>\n<table>\n<tr><th>marginal</th><th>kind</th><th>L1 \
             bound (counts)</th><th>TVD bound</th><th>confidence</th></tr>\n",
        );
        for b in &bounds {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&b.attributes.join(", ")),
                esc(&b.kind),
                b.l1_bound.map_or("—".into(), num),
                b.l1_bound_normalized.map_or("—".into(), |x| num(x / 2.0)),
                num(b.confidence)
            );
        }
        h.push_str("</table>\n");
    }
    if let Some(st) = input.statistics.get(name) {
        statistics_tables(h, st, &ms, input.domain);
    }
    let synthetic = input.synthetic.get(name);
    let mut figures = String::new();
    for x in ms.iter().filter(|x| x.attributes.len() == 1 && !x.values.is_empty()) {
        let attr = &x.attributes[0];
        let Some(syn) = synthetic.and_then(|m| m.get(attr)).filter(|v| v.len() == x.values.len()) else {
            continue;
        };
        let total: f64 = x.values.iter().map(|v| v.max(0.0)).sum::<f64>().max(1.0);
        let syn_total: f64 = syn.iter().sum::<f64>().max(1.0);
        let labels: Vec<String> = (0..x.values.len())
            .map(|c| input.domain.and_then(|d| d.column(attr)).map_or_else(|| c.to_string(), |col| col.label(c as u32)))
            .collect();
        let noisy: Vec<(f64, f64)> = x.values.iter().map(|v| (v / total, x.ci_half_width / total)).collect();
        let shares: Vec<f64> = syn.iter().map(|v| v / syn_total).collect();
        let _ = writeln!(
            figures,
            "<figure>{}<figcaption>{}: the synthetic data's shares (bars) and the noisy measurement's shares with \
             their {}% intervals (points).</figcaption></figure>",
            plots::marginal(&labels, &shares, &noisy)?,
            esc(attr),
            num(x.level * 100.0)
        );
        let mut t = String::from(
            "<table>\n<tr><th>cell</th><th>noisy count</th><th>interval</th><th>synthetic count</th></tr>\n",
        );
        for (i, l) in labels.iter().enumerate() {
            let v = x.values[i];
            let _ = writeln!(
                t,
                "<tr><td>{}</td><td>{}</td><td>[{}, {}]</td><td>{}</td></tr>",
                esc(l),
                num(v),
                num(v - x.ci_half_width),
                num(v + x.ci_half_width),
                num(syn[i])
            );
        }
        t.push_str("</table>\n");
        figures += &t;
    }
    if !figures.is_empty() {
        let _ = write!(h, "<h3>One-way marginals: noisy measurements and the synthetic data</h3>\n{figures}");
    }
    Ok(())
}

/// The labels of a marginal's cells over `attrs` (first varies slowest),
/// when the domain knows every attribute.
fn cell_labels(attrs: &[String], domain: Option<&Domain>, cells: usize) -> Vec<String> {
    let cols: Option<Vec<_>> = domain.and_then(|d| attrs.iter().map(|a| d.column(a)).collect::<Option<Vec<_>>>());
    let Some(cols) = cols.filter(|c| c.iter().map(|c| c.cardinality()).product::<usize>() == cells) else {
        return (0..cells).map(|i| format!("cell {i}")).collect();
    };
    (0..cells)
        .map(|mut i| {
            let mut parts = vec![String::new(); cols.len()];
            for (k, c) in cols.iter().enumerate().rev() {
                let size = c.cardinality();
                parts[k] = format!("{}={}", attrs[k], c.label((i % size) as u32));
                i /= size;
            }
            parts.join(", ")
        })
        .collect()
}

/// napsu-mq's published noisy statistics, one table per query, each cell
/// with its interval (the measurement's half-width).
fn statistics_tables(h: &mut String, st: &Value, ms: &[crate::synth::MeasurementLog], domain: Option<&Domain>) {
    let queries: Vec<Vec<String>> =
        st.get("queries").and_then(|q| serde_json::from_value(q.clone()).ok()).unwrap_or_default();
    let values: Vec<f64> =
        st.get("statistics").and_then(|q| serde_json::from_value(q.clone()).ok()).unwrap_or_default();
    let cells: Vec<usize> = queries
        .iter()
        .map(|q| match domain {
            Some(d) => q.iter().filter_map(|a| d.column(a)).map(|c| c.cardinality()).product(),
            None => 0,
        })
        .collect();
    if queries.is_empty() || cells.iter().sum::<usize>() != values.len() {
        let _ = writeln!(
            h,
            "<p class=\"note\">The step's {} published noisy statistics are in its .napsu.json output{}.</p>",
            values.len(),
            if domain.is_none() { " (give the domain to lay them out here)" } else { "" }
        );
        return;
    }
    h.push_str("<h3>Published noisy statistics</h3>\n");
    let mut at = 0;
    for (q, &n) in queries.iter().zip(&cells) {
        let hw = ms.iter().find(|m| &m.attributes == q).map(|m| (m.ci_half_width, m.level));
        let _ = write!(h, "<table>\n<tr><th>{}</th><th>noisy count</th>", esc(&q.join(" × ")));
        if let Some((_, level)) = hw {
            let _ = write!(h, "<th>{}% interval</th>", num(level * 100.0));
        }
        h.push_str("</tr>\n");
        for (label, v) in cell_labels(q, domain, n).iter().zip(&values[at..at + n]) {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td>", esc(label), num(*v));
            if let Some((w, _)) = hw {
                let _ = write!(h, "<td>[{}, {}]</td>", num(v - w), num(v + w));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Value {
        serde_json::json!({
            "release_id": "r<1>", "pipeline": "p", "dataset": "d", "privacy_unit": "row",
            "budget": {"unit": "pure", "epsilon": 1.0}, "spent": 0.5, "remaining": 9.5, "ledger_charge": 3,
            "steps": [{
                "step": "s", "kind": "sql", "query": "SELECT 1",
                "mechanisms": [],
                "columns": [{"target": "n", "statistic": "count", "level": 0.95, "stated_half_width": 4.0,
                             "basis": "exact"}],
                "outputs": ["s.csv"],
            }],
        })
    }

    #[test]
    fn released_text_is_escaped_and_counts_get_their_interval() {
        let m = manifest();
        let csv: BTreeMap<String, Vec<u8>> =
            [("s.csv".to_string(), b"k,n\n<script>x</script>,10\n\"a,b\",-3\n".to_vec())].into();
        let html = render(&ReportInput {
            manifest: &m,
            csv: &csv,
            synthetic: &BTreeMap::new(),
            statistics: &BTreeMap::new(),
            domain: None,
            ledger: None,
        })
        .unwrap();
        assert!(!html.contains("<script>") && html.contains("&lt;script&gt;x&lt;/script&gt;"));
        assert!(html.contains("<title>dpflow release r&lt;1&gt;</title>"));
        assert!(html.contains("<td>10</td><td>[6, 14]</td>"), "{html}");
        assert!(html.contains("<td>a,b</td><td>-3</td><td>[-7, 1]</td>"));
    }

    #[test]
    fn a_manifest_without_steps_is_a_clear_error() {
        let mut m = manifest();
        m.as_object_mut().unwrap().remove("steps");
        let e = render(&ReportInput {
            manifest: &m,
            csv: &BTreeMap::new(),
            synthetic: &BTreeMap::new(),
            statistics: &BTreeMap::new(),
            domain: None,
            ledger: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("manifest's steps is missing"), "{e}");
    }

    #[test]
    fn the_budget_timeline_does_not_tell_failed_charges_or_analysts_apart() {
        let m = manifest();
        let charge = |id: i64, release: &str, status: ChargeStatus, analyst: Option<&str>| ChargeRow {
            id,
            dataset: "d".into(),
            release_id: release.into(),
            status,
            mechanisms: vec![],
            normalized: Normalized { rho: 0.0, eps: 0.5, delta: 0.0 },
            cost: 0.5,
            reserved_at: format!("2026-11-2{id}T00:00:00Z"),
            resolved_at: None,
            note: Some("why it failed".into()),
            analyst: analyst.map(String::from),
        };
        let charges = vec![
            charge(1, "nightly-1", ChargeStatus::Committed, None),
            charge(2, "nightly-2#failed-2", ChargeStatus::Failed, None),
            charge(3, "q-17-secret", ChargeStatus::Committed, Some("alice")),
            charge(4, "nightly-3", ChargeStatus::Released, None),
        ];
        let total = Budget::Pure { epsilon: 10.0 };
        let html = render(&ReportInput {
            manifest: &m,
            csv: &BTreeMap::new(),
            synthetic: &BTreeMap::new(),
            statistics: &BTreeMap::new(),
            domain: None,
            ledger: Some((&total, &charges)),
        })
        .unwrap();
        for hidden in ["failed", "committed", "alice", "q-17-secret", "why it failed", "nightly-3"] {
            assert!(!html.to_lowercase().contains(hidden), "{hidden} shown");
        }
        assert!(html.contains("<td>2</td><td>nightly-2</td>") && html.contains("an analyst&#39;s query"));
        // Cumulative spending counts the failed charge and the query, not the returned reservation.
        assert!(html.contains("<td>0.5</td><td>1.5</td>"), "{html}");
    }

    #[test]
    fn plot_labels_are_escaped() {
        let svg = plots::marginal(&["<script>x</script>".into(), "a&b".into()], &[0.5, 0.5], &[(0.5, 0.1), (0.5, 0.1)])
            .unwrap();
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"));
        let svg =
            plots::heatmap(&["<b>".into(), "c".into()], &[vec![None, Some(0.1)], vec![Some(0.1), None]], 0.1).unwrap();
        assert!(!svg.contains("<b>"));
    }

    #[test]
    fn numbers_print_plainly() {
        assert_eq!(num(12.0), "12");
        assert_eq!(num(-3.0), "-3");
        assert_eq!(num(0.123456789), "0.123457");
        assert_eq!(num(38.90759178772761), "38.9076");
    }
}
