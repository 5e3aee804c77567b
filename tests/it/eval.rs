//! `dpflow eval`'s NIST CRC k-marginal score against SDNist's own on three
//! synthetic files (tests/data/sdnist, written by benches/sdnist/make_files.sh;
//! expected values from benches/sdnist/kmarginal_reference.py with sdnist 2.4).

use std::path::Path;

fn dataset(name: &str, location: &str, domain: &str) -> dpflow::dataset::Dataset {
    dpflow::dataset::Dataset::open(name, location, None, domain).unwrap()
}

/// The score (grouped by PUMA, as SDNist's CRC report runs it), every
/// PUMA's score, and the ungrouped score of a domain without PUMA equal
/// SDNist's within 0.01 points (the issue asks for ±1 on 0–1000).
#[tokio::test]
async fn kmarginal_score_equals_sdnists() {
    let data = Path::new("tests/data/sdnist");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("expected.json")).unwrap()).unwrap();
    let domain = data.join("kmarginal.domain.yaml");
    let dir = tempfile::tempdir().unwrap();
    let without_puma = dir.path().join("no-puma.yaml");
    let text = std::fs::read_to_string(&domain).unwrap();
    std::fs::write(&without_puma, text.lines().filter(|l| !l.contains("name: PUMA")).collect::<Vec<_>>().join("\n"))
        .unwrap();
    let ctx = dpflow::io::session_context();
    let real_csv = "sample_data/nist-acs/ma2019.csv";
    for name in ["independent", "mst", "privbayes"] {
        let want = &expected[name];
        let syn_csv = data.join(format!("{name}.csv"));
        let d = domain.to_str().unwrap();
        let real = dataset("real", real_csv, d);
        let syn = dataset("synthetic", syn_csv.to_str().unwrap(), d);
        let report = dpflow::eval::evaluate(&ctx, &real, &syn, "all-2way").await.unwrap();
        let k = report.kmarginal.unwrap();
        assert_eq!((k.pairs, k.group_column.as_deref()), (136, Some("PUMA")));
        let close = |a: f64, b: &serde_json::Value| (a - b.as_f64().unwrap()).abs() < 0.01;
        assert!(close(k.score, &want["score"]), "{name}: {} against {}", k.score, want["score"]);
        assert_eq!(k.groups.len(), want["groups"].as_object().unwrap().len());
        for g in &k.groups {
            assert!(
                close(g.score, &want["groups"][&g.group]),
                "{name} {}: {} against {}",
                g.group,
                g.score,
                want["groups"]
            );
        }
        // Without a group column: SDNist's plain score over the 2-way marginals.
        let d = without_puma.to_str().unwrap();
        let report = dpflow::eval::evaluate(
            &ctx,
            &dataset("real", real_csv, d),
            &dataset("s", syn_csv.to_str().unwrap(), d),
            "all-2way",
        )
        .await
        .unwrap();
        let k = report.kmarginal.unwrap();
        assert!(k.group_column.is_none() && k.groups.is_empty());
        assert!(
            close(k.score, &want["score_without_groups"]),
            "{name}: {} against {}",
            k.score,
            want["score_without_groups"]
        );
    }
}
