//! Kamino and KaminoI through `dpflow synth`'s library path (issue 18 item
//! 3): the ledger is charged exactly the (ε, δ) budget, the record's curve
//! converts to at most it, KaminoI writes complete rows, Kamino refuses
//! budgets it cannot account, and a pipeline refuses them at load.

use datafusion::arrow::array::Array;
use dpflow::dataset::Dataset;
use dpflow::missing::{AmplificationRequest, Missingness, Strategy, StrategyOptions};
use dpflow::privacy::{Budget, Ledger, PrivacyLoss};
use dpflow::synth::SynthOptions;
use dpflow::synth::run::{Mechanism, SynthRequest, run_synth};
use dpflow::udfs::domain::DecodeMode;

/// 2,000 rows: a ∈ {x, y, z}; b = "odd" for y, else "even" (95%); c copies b (90%); a fifth of
/// b's and c's cells missing.
fn world(dir: &std::path::Path) -> Dataset {
    let mut s = String::from("a,b,c\n");
    let mut state = 12345u64;
    let mut u = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    for i in 0..2000u64 {
        let a = ["x", "y", "z"][(i % 3) as usize];
        let odd = (a == "y") ^ (u() < 0.05);
        let b = if odd { "odd" } else { "even" };
        let c = if u() < 0.9 {
            b
        } else if odd {
            "even"
        } else {
            "odd"
        };
        let b = if u() < 0.2 { "NA" } else { b };
        let c = if u() < 0.2 { "NA" } else { c };
        s += &format!("{a},{b},{c}\n");
    }
    std::fs::write(dir.join("d.csv"), s).unwrap();
    std::fs::write(
        dir.join("d.yaml"),
        "null_tokens: [NA]\ncolumns:\n  - {name: a, kind: categorical, values: [x, y, z]}\n  - {name: b, kind: categorical, values: [even, odd], nullable: true}\n  - {name: c, kind: categorical, values: [even, odd], nullable: true}\n",
    )
    .unwrap();
    Dataset::open("toy", dir.join("d.csv").to_str().unwrap(), None, dir.join("d.yaml").to_str().unwrap()).unwrap()
}

fn request(dir: &std::path::Path, mechanism: Mechanism, budget: Budget) -> SynthRequest {
    let mut options = SynthOptions::default();
    options.kamino.hidden = 8;
    options.kamino.batch = 200.0;
    SynthRequest {
        dataset: world(dir),
        mechanism,
        budget,
        workload: "all-2way".into(),
        rows: Some(1000),
        out: dir.join("syn.parquet").display().to_string(),
        model_out: None,
        record_out: Some(dir.join("rec.json").display().to_string()),
        ledger: Some((dir.join("ledger.db").display().to_string(), "toy".into())),
        release_id: Some("r1".into()),
        unsafe_seed: None,
        options,
        decode: DecodeMode::Uniform,
        missing: Strategy::Reproduce,
        missing_options: StrategyOptions::default(),
        amplification: None,
    }
}

fn ledger(dir: &std::path::Path) -> Ledger {
    let l = Ledger::create(dir.join("ledger.db")).unwrap();
    l.add_dataset("toy", "row", Budget::Approx { epsilon: 10.0, delta: 1e-6 }).unwrap();
    l
}

#[tokio::test]
async fn kaminoi_charges_its_budget_once_and_writes_complete_rows() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path());
    let mut req = request(dir.path(), Mechanism::Kaminoi, Budget::Approx { epsilon: 2.0, delta: 1e-7 });
    // Declared MCAR: no amplified ε̄, and the record says why (docs/PRIVACY.md §8).
    req.amplification = Some(AmplificationRequest { missingness: Missingness::Mcar, rates: "0.2".into(), delta: 1e-7 });
    let ctx = dpflow::io::session_context();
    let record = run_synth(&ctx, &req, &|_| {}).await.unwrap();
    assert!(record.amplification.is_none());
    let note = record.amplification_note.as_deref().unwrap();
    assert!(note.contains("no MCAR amplification") && note.contains("PRIVACY.md §8"), "{note}");
    // The ledger: one committed charge of exactly (2, 1e-7).
    let status = l.status("toy").unwrap();
    assert_eq!(status.open_reservations, 0);
    assert!((status.normalized.eps - 2.0).abs() < 1e-12 && (status.normalized.delta - 1e-7).abs() < 1e-20);
    // The record: its components' curves compose to at most the budget.
    let spent = record.epsilon_spent.unwrap();
    assert!(spent <= 2.0 && spent > 2.0 * (1.0 - 1e-4), "{spent}");
    let curves: Vec<Vec<(f64, f64)>> = record
        .mechanisms
        .iter()
        .map(|m| match &m.loss {
            PrivacyLoss::Rdp { curve } => curve.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(curves.len(), 2 + 2, "counts, histogram, two classifiers");
    let total = dpflow::privacy::rdp::compose(&curves).unwrap();
    assert!(dpflow::privacy::rdp::epsilon(&total, 1e-7).0 <= 2.0);
    // KaminoI fills every null: the synthetic data has none.
    let df = ctx.read_parquet(&req.out, Default::default()).await.unwrap();
    let batches = df.collect().await.unwrap();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 1000);
    assert!(batches.iter().all(|b| b.columns().iter().all(|c| c.null_count() == 0)));
}

#[tokio::test]
async fn kamino_refuses_a_zcdp_budget_and_a_model_file_before_reserving() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path());
    let ctx = dpflow::io::session_context();
    let req = request(dir.path(), Mechanism::Kamino, Budget::Zcdp { rho: 0.5 });
    let e = run_synth(&ctx, &req, &|_| {}).await.unwrap_err();
    assert!(e.to_string().contains("(ε, δ) budget"), "{e}");
    let mut req = request(dir.path(), Mechanism::Kamino, Budget::Approx { epsilon: 1.0, delta: 1e-7 });
    req.model_out = Some(dir.path().join("m.json").display().to_string());
    let e = run_synth(&ctx, &req, &|_| {}).await.unwrap_err();
    assert!(e.to_string().contains("drop --model-out"), "{e}");
    let mut req = request(dir.path(), Mechanism::Kaminoi, Budget::Approx { epsilon: 1.0, delta: 1e-7 });
    req.missing = Strategy::CompleteRow;
    let e = run_synth(&ctx, &req, &|_| {}).await.unwrap_err();
    assert!(e.to_string().contains("fixes its own missing-data strategy"), "{e}");
    // Nothing was reserved.
    assert!(l.history(Some("toy")).unwrap().is_empty());
}

#[tokio::test]
async fn kamino_on_complete_rows_spends_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let _l = ledger(dir.path());
    let req = request(dir.path(), Mechanism::Kamino, Budget::Approx { epsilon: 1.0, delta: 1e-7 });
    let record = run_synth(&dpflow::io::session_context(), &req, &|_| {}).await.unwrap();
    assert!(record.epsilon_spent.unwrap() <= 1.0);
    assert_eq!(record.missing, "complete-row");
    assert!(record.fit.notes.iter().any(|n| n.contains("complete-row baseline")));
}
