//! `impute-first:mode-stability` (issue 14 §4): the stability is c = 1 + 2M
//! under add/remove neighbours, and data over the public bound M on missing
//! cells get a public constant instead of the modes (no failure, no bit about
//! the count).

use dpflow::dataset::Dataset;
use dpflow::missing::{ImputeMethod, Strategy, StrategyOptions};
use dpflow::privacy::{Budget, Ledger};
use dpflow::synth::SynthOptions;
use dpflow::synth::run::{Mechanism, SynthRequest, run_synth};
use dpflow::udfs::domain::DecodeMode;

/// 60 rows; `b` is missing in 7 of them (7 missing cells).
fn world(dir: &std::path::Path) -> Dataset {
    let mut s = String::from("a,b\n");
    for i in 0..60 {
        let a = if i % 3 == 0 { "p" } else { "q" };
        if i % 9 == 4 {
            s += &format!("{a},\n");
        } else {
            s += &format!("{a},{}\n", i % 4);
        }
    }
    std::fs::write(dir.join("d.csv"), s).unwrap();
    std::fs::write(
        dir.join("d.yaml"),
        "columns:\n  - {name: a, kind: categorical, values: [p, q]}\n  - {name: b, kind: integer, bounds: [0, 3], nullable: true}\n",
    )
    .unwrap();
    Dataset::open("survey", dir.join("d.csv").to_str().unwrap(), None, dir.join("d.yaml").to_str().unwrap()).unwrap()
}

fn request(dir: &std::path::Path, max_missing_cells: u64, ledger: Option<(String, String)>) -> SynthRequest {
    SynthRequest {
        dataset: world(dir),
        mechanism: Mechanism::Independent,
        budget: Budget::Zcdp { rho: 1.0 },
        workload: "all-1way".into(),
        rows: Some(20),
        out: dir.join(format!("out-{max_missing_cells}.csv")).display().to_string(),
        model_out: None,
        record_out: Some(dir.join(format!("rec-{max_missing_cells}.json")).display().to_string()),
        ledger,
        release_id: None,
        unsafe_seed: None,
        options: SynthOptions { iters: 50, ..Default::default() },
        decode: DecodeMode::Midpoint,
        missing: Strategy::ImputeFirst(ImputeMethod::ModeStability),
        missing_options: StrategyOptions { max_missing_cells: Some(max_missing_cells), ..Default::default() },
        amplification: None,
    }
}

#[tokio::test]
async fn mode_stability_charges_with_c_equal_one_plus_two_m() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = dpflow::io::session_context();
    let rec = run_synth(&ctx, &request(dir.path(), 10, None), &|_| {}).await.unwrap();
    let stability: Vec<f64> = rec
        .mechanisms
        .iter()
        .filter(|m| m.mechanism == "stability")
        .map(|m| m.params["stability"].as_f64().unwrap())
        .collect();
    assert_eq!(stability, vec![21.0], "c = 1 + 2M with M = 10 (000's 1 + M would be 11)");
    // Everything charged (synthesizer at ρ/c² plus the surcharge) stays within ρ = 1.
    let spent = rec.rho_spent.unwrap();
    assert!(spent <= 1.0 + 1e-9, "{spent}");
}

#[tokio::test]
async fn more_missing_cells_than_the_public_bound_run_the_same_way_without_failing() {
    // Over the bound the nulls get a public constant: the run succeeds like any other,
    // charges the same, and its record does not say which fill was used (that would
    // reveal whether the data exceeded M).
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("l.sqlite");
    let ledger = Ledger::create(&ledger_path).unwrap();
    ledger.add_dataset("survey", "row", Budget::Zcdp { rho: 5.0 }).unwrap();
    drop(ledger);
    let ctx = dpflow::io::session_context();
    // 7 missing cells, bound 2.
    let over =
        run_synth(&ctx, &request(dir.path(), 2, Some((ledger_path.display().to_string(), "survey".into()))), &|_| {})
            .await
            .unwrap();
    let spent = Ledger::open(&ledger_path).unwrap().status("survey").unwrap().spent;
    assert!((spent - 1.0).abs() < 1e-9, "charged once: spent {spent}");
    let within = run_synth(&ctx, &request(dir.path(), 7, None), &|_| {}).await.unwrap();
    let shape =
        |r: &dpflow::synth::run::SynthRecord| r.mechanisms.iter().map(|m| m.mechanism.clone()).collect::<Vec<_>>();
    assert_eq!(shape(&over), shape(&within), "the same mechanisms either way");
    assert_eq!(over.fit.notes.len(), within.fit.notes.len());
}
