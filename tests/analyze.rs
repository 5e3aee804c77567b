//! `dpflow analyze` against statsmodels (tests/data/analyze, written by
//! benches/analyze/statsmodels_reference.py) and the combining rules across
//! sets given as files or as a set column.

use std::path::Path;
use std::process::Command;

use dpflow::analyze::{AnalysisSpec, EstimatorKind, Options, Rule, Sets, analyze};

fn data() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/analyze/data.csv").to_string()
}

fn expected() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/analyze/expected.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn spec(estimator: EstimatorKind, formula: Option<&str>, column: Option<&str>, value: Option<&str>) -> AnalysisSpec {
    AnalysisSpec {
        estimator,
        formula: formula.map(str::to_string),
        column: column.map(str::to_string),
        value: value.map(str::to_string),
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-12)
}

#[tokio::test]
async fn ols_logistic_mean_and_proportion_match_statsmodels() {
    let e = expected();
    let analyses = [
        spec(EstimatorKind::Ols, e["ols"]["formula"].as_str(), None, None),
        spec(EstimatorKind::Logistic, e["logistic"]["formula"].as_str(), None, None),
        spec(EstimatorKind::Mean, None, Some("y"), None),
        spec(EstimatorKind::Proportion, None, Some("b"), Some("yes")),
    ];
    let out = analyze(&Sets::Locations(vec![data()]), &analyses, &Options::default()).await.unwrap();
    for (r, key) in out[..2].iter().zip(["ols", "logistic"]) {
        let params = e[key]["params"].as_object().unwrap();
        assert_eq!(r.terms.len(), params.len(), "{key}: {:?}", r.terms.iter().map(|t| &t.term).collect::<Vec<_>>());
        assert_eq!(r.sets[0].rows as u64, e[key]["nobs"].as_u64().unwrap(), "{key}: rows after dropping nulls");
        for t in &r.terms {
            let want = params[&t.term].as_f64().unwrap_or_else(|| panic!("{key}: no {}", t.term));
            let se = e[key]["bse"][&t.term].as_f64().unwrap();
            assert!(close(t.combined.estimate, want, 1e-8), "{key} {}: {} vs {want}", t.term, t.combined.estimate);
            assert!(close(t.combined.std_error, se, 1e-7), "{key} {}: {} vs {se}", t.term, t.combined.std_error);
        }
    }
    let mean = &out[2].terms[0].combined;
    assert!(close(mean.estimate, e["mean"]["estimate"].as_f64().unwrap(), 1e-12));
    assert!(close(mean.std_error, e["mean"]["se"].as_f64().unwrap(), 1e-10));
    let prop = &out[3].terms[0].combined;
    assert!(close(prop.estimate, e["proportion"]["estimate"].as_f64().unwrap(), 1e-12));
    assert!(close(prop.std_error, e["proportion"]["se"].as_f64().unwrap(), 1e-10));
    // One set: the single-set rule with the analysis's own reference
    // distribution (t with n − p for OLS, normal for the logistic).
    assert_eq!(out[0].rule, Rule::Single);
    assert_eq!(out[0].terms[0].combined.df, Some(384.0 - 5.0));
    assert_eq!(out[1].terms[0].combined.df, None);
}

/// Three sets as a set column of one table and as three files give the same
/// combined inference, and it is the rule applied to each set's own fit.
#[tokio::test]
async fn sets_from_a_column_or_from_files_combine_by_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(data()).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let rows: Vec<&str> = lines.collect();
    let mut all = format!("{header},set\n");
    let mut files = Vec::new();
    for s in 0..3 {
        let part: Vec<&str> = rows.iter().enumerate().filter(|(i, _)| i % 3 == s).map(|(_, r)| *r).collect();
        let f = dir.path().join(format!("set{s}.csv"));
        std::fs::write(&f, format!("{header}\n{}\n", part.join("\n"))).unwrap();
        files.push(f.to_str().unwrap().to_string());
        for r in part {
            all += &format!("{r},{}\n", s + 1);
        }
    }
    let table = dir.path().join("all.csv");
    std::fs::write(&table, all).unwrap();
    let ols = [spec(EstimatorKind::Ols, Some("y ~ x1 + g"), None, None)];
    for rule in [Rule::FullySynthetic { syn_over_original: 1.0 }, Rule::Dips] {
        let opts = Options { rule: Some(rule), ..Options::default() };
        let by_files = analyze(&Sets::Locations(files.clone()), &ols, &opts).await.unwrap();
        let by_column =
            analyze(&Sets::Column { location: table.to_str().unwrap().into(), column: "set".into() }, &ols, &opts)
                .await
                .unwrap();
        assert_eq!(by_column[0].sets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["set=1", "set=2", "set=3"]);
        for (a, b) in by_files[0].terms.iter().zip(&by_column[0].terms) {
            assert_eq!(a.term, b.term);
            assert!(
                close(a.combined.estimate, b.combined.estimate, 1e-12)
                    && close(a.combined.variance, b.combined.variance, 1e-10)
            );
        }
        // Each set alone, then the rule by hand.
        let mut q = vec![vec![]; by_files[0].terms.len()];
        let mut u = q.clone();
        for f in &files {
            let one = analyze(&Sets::Locations(vec![f.clone()]), &ols, &Options::default()).await.unwrap();
            for (k, t) in one[0].terms.iter().enumerate() {
                q[k].push(t.combined.estimate);
                u[k].push(t.combined.variance);
            }
        }
        for (k, t) in by_files[0].terms.iter().enumerate() {
            let qbar = q[k].iter().sum::<f64>() / 3.0;
            let b = q[k].iter().map(|x| (x - qbar).powi(2)).sum::<f64>() / 2.0;
            let ubar = u[k].iter().sum::<f64>() / 3.0;
            let want = match rule {
                Rule::Dips => b / 3.0 + ubar,
                _ => {
                    let t = (1.0 + 1.0 / 3.0) * b - ubar;
                    if t > 0.0 { t } else { ubar }
                }
            };
            assert!(close(t.combined.estimate, qbar, 1e-12) && close(t.combined.variance, want, 1e-10), "{}", t.term);
        }
    }
}

fn dpflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dpflow"))
}

#[test]
fn the_command_prints_tables_json_and_csv_and_explains_bad_requests() {
    let out = dpflow().args(["analyze", &data(), "--ols", "y ~ x1 + g", "--format", "csv"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(csv.starts_with("analysis,term,estimate,std_error,ci_low,ci_high,df,m,rule,level\n"), "{csv}");
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let out = dpflow().args(["analyze", &data(), "--proportion", "b=yes", "--format", "json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["terms"][0]["term"], "P(b == yes)");
    assert_eq!(v[0]["sets"][0]["rows"], 400);
    let spec = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        spec.path(),
        "analyses:\n  - {estimator: mean, column: x1}\n  - {estimator: logistic, formula: \"b == 'yes' ~ x1\"}\n",
    )
    .unwrap();
    let out = dpflow().args(["analyze", &data(), "--spec", spec.path().to_str().unwrap()]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && table.contains("mean(x1)") && table.contains("logistic b == 'yes' ~ x1"),
        "{table}"
    );
    for (args, want) in [
        (vec!["--ols", "y ~ nope"], "column `nope` is not in the set"),
        (vec!["--ols", "y ~ x1 +"], "ends with"),
        (vec!["--ols", "g ~ x1"], "is text"),
        (vec!["--logistic", "y ~ x1"], "needs 0/1"),
        (vec!["--proportion", "b"], "COLUMN=VALUE"),
        (vec![], "say what to estimate"),
        (vec!["--mean", "y", "--rule", "fully-synthetic"], "at least 2 sets"),
    ] {
        let out = dpflow().args(["analyze", &data()]).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = dpflow().args(["analyze", "/nonexistent/set.parquet", "--mean", "y"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/set.parquet"));
}
