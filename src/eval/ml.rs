//! Machine-learning efficacy (000 §6.1): train a classifier on the synthetic
//! data, test it on the real data, report F1. Logistic regression on one-hot
//! codes and a CART decision tree on codes, both from `smartcore`. A
//! curator-side evaluation (it reads the real data), not a private release.

use anyhow::{Context, Result, bail};
use datafusion::arrow::array::UInt32Array;
use datafusion::execution::context::SessionContext;
use datafusion::physical_plan::collect;
use serde::Serialize;
use smartcore::linalg::basic::matrix::DenseMatrix;
use smartcore::linear::logistic_regression::{LogisticRegression, LogisticRegressionParameters};
use smartcore::tree::decision_tree_classifier::{DecisionTreeClassifier, DecisionTreeClassifierParameters};

use crate::dataset::Dataset;

/// ML efficacy of synthetic data for predicting one column.
#[derive(Debug, Clone, Serialize)]
pub struct MlReport {
    /// Target column.
    pub target: String,
    /// F1 of the positive class (code 1) for a binary target, macro-F1 otherwise.
    pub metric: String,
    /// Logistic regression (one-hot features) trained on synthetic, tested on real.
    pub logistic_regression_f1: f64,
    /// Decision tree (codes as features, depth ≤ 12) trained on synthetic, tested on real.
    pub decision_tree_f1: f64,
    /// The same two trained on the real data itself (reference, train = test).
    pub real_logistic_regression_f1: f64,
    /// Decision tree trained on real (reference).
    pub real_decision_tree_f1: f64,
    /// Rows used for training (synthetic, capped) and testing (real).
    pub train_rows: usize,
    /// Test rows.
    pub test_rows: usize,
}

/// Codes of every domain column, row-major by column.
async fn codes(ctx: &SessionContext, d: &Dataset) -> Result<Vec<Vec<u32>>> {
    let plan = d.encoded_plan(ctx, &[]).await?;
    let batches = collect(plan, ctx.task_ctx()).await.with_context(|| format!("reading {}", d.location))?;
    let ncols = d.domain().len();
    let mut cols = vec![Vec::new(); ncols];
    for b in &batches {
        for (c, col) in cols.iter_mut().enumerate() {
            let a = b.column(c).as_any().downcast_ref::<UInt32Array>().context("codes")?;
            col.extend_from_slice(a.values());
        }
    }
    Ok(cols)
}

/// Binary F1 of class 1, or macro-F1 over `k` classes.
pub fn f1(truth: &[u32], pred: &[u32], k: usize) -> f64 {
    let per_class = |c: u32| {
        let tp = truth.iter().zip(pred).filter(|(t, p)| **t == c && **p == c).count() as f64;
        let fp = truth.iter().zip(pred).filter(|(t, p)| **t != c && **p == c).count() as f64;
        let fn_ = truth.iter().zip(pred).filter(|(t, p)| **t == c && **p != c).count() as f64;
        if tp == 0.0 { 0.0 } else { 2.0 * tp / (2.0 * tp + fp + fn_) }
    };
    if k == 2 { per_class(1) } else { (0..k as u32).map(per_class).sum::<f64>() / k as f64 }
}

struct Features {
    onehot: DenseMatrix<f64>,
    codes: DenseMatrix<f64>,
    y: Vec<u32>,
}

fn features(cols: &[Vec<u32>], sizes: &[usize], target: usize, rows: &[usize]) -> Result<Features> {
    let feats: Vec<usize> = (0..cols.len()).filter(|&c| c != target).collect();
    let width: usize = feats.iter().map(|&c| sizes[c]).sum();
    let n = rows.len();
    // Column-major buffers.
    let mut onehot = vec![0.0; n * width];
    let mut codes = vec![0.0; n * feats.len()];
    let mut offset = 0;
    for (j, &c) in feats.iter().enumerate() {
        for (i, &r) in rows.iter().enumerate() {
            let v = cols[c][r] as usize;
            codes[j * n + i] = v as f64;
            onehot[(offset + v.min(sizes[c] - 1)) * n + i] = 1.0;
        }
        offset += sizes[c];
    }
    let y: Vec<u32> = rows.iter().map(|&r| cols[target][r]).collect();
    Ok(Features {
        onehot: DenseMatrix::new(n, width, onehot, true).map_err(|e| anyhow::anyhow!("{e}"))?,
        codes: DenseMatrix::new(n, feats.len(), codes, true).map_err(|e| anyhow::anyhow!("{e}"))?,
        y,
    })
}

fn train_and_score(train: &Features, test: &Features, k: usize) -> Result<(f64, f64)> {
    let distinct = {
        let mut v = train.y.clone();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    if distinct < 2 {
        // A constant training target: every model predicts that constant.
        let c = train.y.first().copied().unwrap_or(0);
        let pred = vec![c; test.y.len()];
        let f = f1(&test.y, &pred, k);
        return Ok((f, f));
    }
    let lr = LogisticRegression::fit(&train.onehot, &train.y, LogisticRegressionParameters::default().with_alpha(1.0))
        .map_err(|e| anyhow::anyhow!("logistic regression: {e}"))?;
    let lr_pred: Vec<u32> = lr.predict(&test.onehot).map_err(|e| anyhow::anyhow!("{e}"))?;
    let tree = DecisionTreeClassifier::fit(
        &train.codes,
        &train.y,
        DecisionTreeClassifierParameters::default().with_max_depth(12).with_min_samples_leaf(5),
    )
    .map_err(|e| anyhow::anyhow!("decision tree: {e}"))?;
    let dt_pred: Vec<u32> = tree.predict(&test.codes).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((f1(&test.y, &lr_pred, k), f1(&test.y, &dt_pred, k)))
}

/// Trains on `synth` (at most `max_train` rows, evenly spaced), tests on `real`.
pub async fn ml_efficacy(
    ctx: &SessionContext,
    real: &Dataset,
    synth: &Dataset,
    target: &str,
    max_train: usize,
) -> Result<MlReport> {
    let domain = real.domain();
    let t = domain.position(target).with_context(|| format!("--ml-target: unknown column {target:?}"))?;
    let sizes = domain.cardinalities();
    let k = domain.columns()[t].size();
    if k < 2 {
        bail!("--ml-target {target:?} has fewer than two values");
    }
    let real_cols = codes(ctx, real).await?;
    let synth_cols = codes(ctx, synth).await?;
    let pick = |n: usize| -> Vec<usize> {
        if n <= max_train { (0..n).collect() } else { (0..max_train).map(|i| i * n / max_train).collect() }
    };
    // Rows whose target is null cannot be scored; drop them on both sides.
    let observed = |cols: &[Vec<u32>], rows: Vec<usize>| -> Vec<usize> {
        rows.into_iter().filter(|&r| (cols[t][r] as usize) < k).collect()
    };
    let n_real = real_cols[0].len();
    let n_synth = synth_cols.first().map_or(0, Vec::len);
    let test_rows = observed(&real_cols, (0..n_real).collect());
    let train_rows = observed(&synth_cols, pick(n_synth));
    let real_train = observed(&real_cols, pick(n_real));
    let test = features(&real_cols, &sizes, t, &test_rows)?;
    let train = features(&synth_cols, &sizes, t, &train_rows)?;
    let (lr, dt) = train_and_score(&train, &test, k)?;
    let real_train = features(&real_cols, &sizes, t, &real_train)?;
    let (rlr, rdt) = train_and_score(&real_train, &test, k)?;
    Ok(MlReport {
        target: target.to_string(),
        metric: if k == 2 { "F1 (class 1)".into() } else { "macro-F1".into() },
        logistic_regression_f1: lr,
        decision_tree_f1: dt,
        real_logistic_regression_f1: rlr,
        real_decision_tree_f1: rdt,
        train_rows: train_rows.len(),
        test_rows: test_rows.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f1_by_hand() {
        // tp = 2, fp = 1, fn = 1 → 4/6.
        assert!((f1(&[1, 1, 1, 0, 0], &[1, 1, 0, 1, 0], 2) - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(f1(&[0, 0], &[0, 0], 2), 0.0);
        // Macro over 3 classes, all right.
        assert!((f1(&[0, 1, 2], &[0, 1, 2], 3) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn learnable_target_is_learned() {
        // y = x0 xor-free rule: y = 1 iff x0 ≥ 2; x1 noise.
        let n = 600;
        let x0: Vec<u32> = (0..n).map(|i| (i % 4) as u32).collect();
        let x1: Vec<u32> = (0..n).map(|i| ((i * 7) % 3) as u32).collect();
        let y: Vec<u32> = x0.iter().map(|&v| u32::from(v >= 2)).collect();
        let cols = vec![x0, x1, y];
        let rows: Vec<usize> = (0..n).collect();
        let f = features(&cols, &[4, 3, 2], 2, &rows).unwrap();
        let (lr, dt) = train_and_score(&f, &f, 2).unwrap();
        assert!(lr > 0.99 && dt > 0.99, "lr {lr} dt {dt}");
    }
}
