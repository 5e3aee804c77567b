//! The README tour's example on the bundled ACS excerpt (issue 24 acceptance):
//! ma2019, ε = 6 ln 2 per number, 100 seeded runs of the spec's two queries.
//! Every null income there is a child's (not applicable below 15), so the
//! adults' statistics carry no imputation and the noise of an ordinary DP
//! statistic (plus the one possible donee): within ±5% (mean) and ±0.05
//! (share) of the truth in ≥ 95 runs of 100.

use super::spec::ImputeSpec;
use super::*;

fn spec() -> ImputeSpec {
    ImputeSpec::load(concat!(env!("CARGO_MANIFEST_DIR"), "/sample_data/nist-acs/impute-income.yaml")).unwrap()
}

#[tokio::test]
async fn tour_example_is_accurate_on_the_bundled_ma2019() {
    let spec = spec();
    let ctx = SessionContext::new();
    let data = prepare(&ctx, &spec).await.unwrap();
    // Children's nulls are not applicable: nothing to impute in ma2019.
    assert_eq!(data.imputed.iter().filter(|x| **x).count(), 0);
    // Truth (curator): 78,554.69 over 3,768 people aged 20–59; 722/917 above 25,750 at 40–49.
    let truth = exact(&data.columns, data.n, &spec.queries);
    assert!((truth[0].unwrap() - 78_554.686_836).abs() < 1e-3, "{:?}", truth[0]);
    assert!((truth[1].unwrap() - 722.0 / 917.0).abs() < 1e-12);
    let eps = 6.0 * std::f64::consts::LN_2;
    let mut rng = DpRng::unsafe_seeded(24);
    let (mut mean_ok, mut share_ok) = (0, 0);
    let summary = data.summarize(&spec.queries).unwrap();
    for _ in 0..100 {
        let r = answer(&summary, &spec.queries, Estimator::Smooth, eps, None, &mut rng).unwrap();
        let m = r[0].value.unwrap();
        mean_ok += usize::from((m / truth[0].unwrap() - 1.0).abs() <= 0.05);
        let p = r[1].value.unwrap();
        share_ok += usize::from((p - truth[1].unwrap()).abs() <= 0.05);
    }
    eprintln!("ma2019 tour: mean within ±5% in {mean_ok}/100 runs, share within ±0.05 in {share_ok}/100");
    assert!(mean_ok >= 95, "mean within ±5% in {mean_ok}/100 runs");
    assert!(share_ok >= 95, "share within ±0.05 in {share_ok}/100 runs");
}

#[tokio::test]
async fn children_are_never_imputed_and_adults_with_unknown_income_are() {
    // The same data with 10% of adults' incomes made unknown (a deterministic pattern).
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sample_data/nist-acs/ma2019.csv")).unwrap();
    let mut out = String::new();
    let (mut made_unknown, mut children_null) = (0, 0);
    for (i, line) in src.lines().enumerate() {
        let mut f: Vec<&str> = line.split(',').collect();
        if i > 0 {
            let age: u32 = f[1].parse().unwrap();
            if age < 15 && f[14] == "N" {
                children_null += 1;
            }
            if age >= 15 && i % 10 == 0 {
                f[14] = "N";
                made_unknown += 1;
            }
        }
        out += &f.join(",");
        out.push('\n');
    }
    std::fs::write(dir.path().join("ma.csv"), out).unwrap();
    let mut spec = spec();
    spec.input = dir.path().join("ma.csv").display().to_string();
    let data = prepare(&SessionContext::new(), &spec).await.unwrap();
    assert_eq!(data.imputed.iter().filter(|x| **x).count(), made_unknown);
    let age = &data.observed["AGEP"];
    for (r, a) in age.iter().enumerate() {
        let child = a.unwrap() < 15.0;
        if child {
            assert!(!data.imputed[r] && data.columns["PINCP"][r].is_none(), "a child's income stays not applicable");
            assert!(!data.missing["PINCP"][r], "and is not counted missing");
        } else if data.imputed[r] {
            assert!(data.columns["PINCP"][r].is_some(), "an adult's unknown income is imputed");
        }
    }
    assert_eq!(data.missing["PINCP"].iter().filter(|x| **x).count(), made_unknown);
    assert!(children_null > 1000);
}
