//! Synthesizers reproduce not-applicable structure (issue 24): where a
//! column's public `not_applicable_when` rule holds, synthetic rows have a
//! null there (exactly: the rule is enforced on output, post-processing);
//! where it does not, the model has learned that the column is observed.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Int64Type;
use dpflow::dataset::Dataset;
use dpflow::missing::{Strategy, StrategyOptions};
use dpflow::privacy::Budget;
use dpflow::synth::SynthOptions;
use dpflow::synth::run::{Mechanism, SynthRequest, run_synth};
use dpflow::udfs::domain::DecodeMode;

/// 800 people aged 0–59; income (0–99) is not applicable below 20 and observed otherwise.
fn world(dir: &std::path::Path) -> Dataset {
    let mut s = String::from("age,sex,income\n");
    for i in 0..800u64 {
        let age = (i * 37) % 60;
        let sex = if i % 3 == 0 { "f" } else { "m" };
        if age < 20 {
            s += &format!("{age},{sex},N\n");
        } else {
            s += &format!("{age},{sex},{}\n", (age + i) % 100);
        }
    }
    std::fs::write(dir.join("d.csv"), s).unwrap();
    std::fs::write(
        dir.join("d.yaml"),
        "null_tokens: [N]\ncolumns:\n  - {name: age, kind: integer, bounds: [0, 59], bins: {width: 10}}\n  - {name: sex, kind: categorical, values: [f, m]}\n  - {name: income, kind: integer, bounds: [0, 99], bins: {width: 10}, nullable: true, not_applicable_when: \"age < 20\"}\n",
    )
    .unwrap();
    Dataset::open("people", dir.join("d.csv").to_str().unwrap(), None, dir.join("d.yaml").to_str().unwrap()).unwrap()
}

/// One synthesis of `world` to `syn.parquet` in `dir`.
fn request(dir: &std::path::Path, mechanism: Mechanism, missing: Strategy, rows: u64, seed: u64) -> SynthRequest {
    SynthRequest {
        dataset: world(dir),
        mechanism,
        budget: Budget::Zcdp { rho: 1.0 },
        workload: "all-2way".into(),
        rows: Some(rows),
        out: dir.join("syn.parquet").display().to_string(),
        model_out: None,
        record_out: Some(dir.join("rec.json").display().to_string()),
        ledger: None,
        release_id: None,
        unsafe_seed: Some(seed),
        options: SynthOptions { iters: 200, ..Default::default() },
        decode: DecodeMode::Uniform,
        missing,
        missing_options: StrategyOptions::default(),
        amplification: None,
    }
}

#[tokio::test]
async fn strategies_without_nulls_still_synthesize() {
    // complete-row models no nulls: the output column is not nullable and its rule is not
    // enforced there (no failure after the charge).
    let dir = tempfile::tempdir().unwrap();
    let req = request(dir.path(), Mechanism::Mst, Strategy::CompleteRow, 500, 5);
    let ctx = dpflow::io::session_context();
    run_synth(&ctx, &req, &|_| {}).await.unwrap();
    let n: usize = ctx.read_parquet(&req.out, Default::default()).await.unwrap().count().await.unwrap();
    assert_eq!(n, 500);
}

#[tokio::test]
async fn mst_and_aim_output_keeps_not_applicable_structure() {
    for mechanism in [Mechanism::Mst, Mechanism::Aim] {
        let dir = tempfile::tempdir().unwrap();
        let req = request(dir.path(), mechanism, Strategy::Reproduce, 3000, 24);
        let out = req.out.clone();
        let ctx = dpflow::io::session_context();
        run_synth(&ctx, &req, &|_| {}).await.unwrap();
        let df = ctx.read_parquet(&out, Default::default()).await.unwrap();
        let (mut child, mut child_null, mut adult, mut adult_null) = (0, 0, 0, 0);
        for b in df.collect().await.unwrap() {
            let age = b.column_by_name("age").unwrap().as_primitive::<Int64Type>();
            let income = b.column_by_name("income").unwrap();
            for r in 0..b.num_rows() {
                if age.value(r) < 20 {
                    child += 1;
                    child_null += usize::from(income.is_null(r));
                } else {
                    adult += 1;
                    adult_null += usize::from(income.is_null(r));
                }
            }
        }
        assert!(child > 500 && adult > 1000, "{mechanism:?}: {child} children, {adult} adults");
        assert_eq!(child_null, child, "{mechanism:?}: every child's income is not applicable");
        // Learned, not enforced: the real data has none; noise at ρ = 1 leaves a few.
        assert!((adult_null as f64) < 0.05 * adult as f64, "{mechanism:?}: {adult_null} of {adult} adults null");
    }
}
