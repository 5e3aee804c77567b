//! The curator report (`dpflow eval --report`, and beside a pipeline's
//! private evaluation output): real against synthetic data, so it is NOT
//! private and must never be published. It says so at the top, and it is
//! written owner-only to a place the caller names (never a release's output
//! location). Contents: the mean 1/2/3-way TVDs, a 1-way TVD per column,
//! heat maps of the pairwise 2-way TVD and of the mean 3-way TVD per pair,
//! the NIST CRC k-marginal score, and ML efficacy when measured.

use std::fmt::Write as _;

use super::{ReportError, esc, num, plots};
use crate::eval::EvalReport;
use crate::eval::ml::MlReport;

/// The banner every curator report starts with.
pub const NOT_PRIVATE: &str = "NOT PRIVATE — curator only. This report compares the synthetic data with the \
     real data: every number below depends on the real data without noise. Never publish it.";

fn matrix_table(h: &mut String, names: &[String], m: &[Vec<Option<f64>>]) {
    h.push_str("<table>\n<tr><th></th>");
    for n in names {
        let _ = write!(h, "<th>{}</th>", esc(n));
    }
    h.push_str("</tr>\n");
    for (n, row) in names.iter().zip(m) {
        let _ = write!(h, "<tr><th>{}</th>", esc(n));
        for v in row {
            let _ = write!(h, "<td>{}</td>", v.map_or("—".into(), |v| format!("{v:.4}")));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

/// Renders the curator report.
pub fn render(r: &EvalReport, ml: Option<&MlReport>, real: &str, synthetic: &str) -> Result<String, ReportError> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>NOT PRIVATE: curator \
         evaluation</title>\n<style>{}</style>\n</head>\n<body>\n<p class=\"warn\">{}</p>\n<h1>Synthetic against real \
         data</h1>\n<table>\n<tr><th>real data</th><td>{}</td></tr>\n<tr><th>synthetic data</th><td>{}</td></tr>\n\
         <tr><th>rows (real, synthetic)</th><td>{}, {}</td></tr>\n<tr><th>workload {}</th><td>error {:.4}</td></tr>\n\
         <tr><th>mean TVD 1-way</th><td>{:.4}</td></tr>\n<tr><th>mean TVD 2-way</th><td>{:.4}</td></tr>\n<tr><th>mean \
         TVD 3-way</th><td>{}</td></tr>\n</table>\n",
        super::STYLE,
        esc(NOT_PRIVATE),
        esc(real),
        esc(synthetic),
        num(r.rows_real),
        num(r.rows_synthetic),
        esc(&r.workload),
        r.workload_error,
        r.tvd_1way,
        r.tvd_2way,
        r.tvd_3way.map_or("—".into(), |v| format!("{v:.4}")),
    );
    if let Some(k) = &r.kmarginal {
        let _ = write!(
            h,
            "<h2>NIST CRC k-marginal score</h2>\n<p>{:.1} of 1000 over {} column pairs{}</p>\n",
            k.score,
            k.pairs,
            k.group_column.as_deref().map_or(String::new(), |c| format!("; by {}:", esc(c)))
        );
        if !k.groups.is_empty() {
            h.push_str("<table>\n<tr><th>group</th><th>score</th></tr>\n");
            for g in &k.groups {
                let _ = writeln!(h, "<tr><td>{}</td><td>{:.1}</td></tr>", esc(&g.group), g.score);
            }
            h.push_str("</table>\n");
        }
    }
    let det = &r.detail;
    h.push_str("<h2>1-way TVD per column</h2>\n<table>\n<tr><th>column</th><th>TVD</th></tr>\n");
    for (n, v) in det.columns.iter().zip(&det.one_way) {
        let _ = writeln!(h, "<tr><td>{}</td><td>{v:.4}</td></tr>", esc(n));
    }
    h.push_str("</table>\n");
    let max = det.two_way.iter().chain(&det.three_way).flatten().flatten().fold(0.0f64, |a, &b| a.max(b));
    for (title, m, what) in [
        ("2-way TVD per pair of columns", &det.two_way, "the TVD of each pair's 2-way marginal"),
        ("3-way TVD per pair of columns", &det.three_way, "the mean TVD of the 3-way marginals holding the pair"),
    ] {
        if m.iter().flatten().all(Option::is_none) {
            continue;
        }
        let _ = write!(
            h,
            "<h2>{title}</h2>\n<figure>{}<figcaption>Each cell: {what} (white 0, dark red {:.4}).</figcaption>\
             </figure>\n",
            plots::heatmap(&det.columns, m, max)?,
            max
        );
        matrix_table(&mut h, &det.columns, m);
    }
    if let Some(m) = ml {
        let _ = write!(
            h,
            "<h2>ML efficacy</h2>\n<p>Predicting {} ({}): trained on {} synthetic rows, tested on {} real rows.</p>\n\
             <table>\n<tr><th>model</th><th>trained on synthetic</th><th>trained on real</th></tr>\n<tr><td>logistic \
             regression</td><td>{:.4}</td><td>{:.4}</td></tr>\n<tr><td>decision tree</td><td>{:.4}</td><td>{:.4}</td>\
             </tr>\n</table>\n",
            esc(&m.target),
            esc(&m.metric),
            m.train_rows,
            m.test_rows,
            m.logistic_regression_f1,
            m.real_logistic_regression_f1,
            m.decision_tree_f1,
            m.real_decision_tree_f1
        );
    }
    let _ = write!(h, "<p class=\"warn\">{}</p>\n</body>\n</html>\n", esc(NOT_PRIVATE));
    Ok(h)
}
