//! 002 §5's case study, with the same analysis shape on the shipped Palmer
//! penguins (`sample_data/penguins`, CC0; the UCI fertility data is in no
//! registry package): split the complete rows once into 80% training and
//! 20% test, synthesize the training set with the Laplace sanitizer and
//! with MODIPS (a saturated model on the full cross-tabulation, as 002 §5
//! ends up doing) at ε = e, one set each, train an SVM on the synthetic set
//! and report its accuracy on the real test set, over 100 repetitions.
//!
//! The table: species (the target, 3 levels), island (3), sex (2) and the
//! four measurements in 4 equal bins over the domain file's public bounds:
//! K = 4608 cells for about 266 training rows, as sparse as 002's fertility
//! table. Features for the SVM: island one-hot, sex, the measurements scaled
//! to [0, 1] by the public bounds (synthetic values uniform within their
//! bin). MODIPS's prior is α = 1/K per cell (a total prior weight of one
//! row; 002 does not state its α). The SVM: smartcore's one-vs-one SVC,
//! linear kernel, C = 1 (002 used an SVM without stating its settings).
//!
//! Simulation only: the noise is seeded.

use std::time::Instant;

use dpflow::measure::ReleaseAccountant;
use dpflow::privacy::{Budget, PrivacyFilter};
use dpflow::synth::dips::cells::{self, CellMechanism, CellOptions, Generate};
use dpflow_udfs::noise::DpRng;
use rand::RngExt;
use serde::Serialize;
use smartcore::linalg::basic::matrix::DenseMatrix;
use smartcore::svm::Kernels;
use smartcore::svm::svc::{MultiClassSVC, SVCParameters};

/// Public bounds of the four measurements (the domain file's).
const BOUNDS: [(f64, f64); 4] = [(25.0, 65.0), (10.0, 25.0), (160.0, 240.0), (2500.0, 6500.0)];
const BINS: usize = 4;
const SIZES: [usize; 7] = [3, 3, 2, BINS, BINS, BINS, BINS];

/// One complete penguin: species, island, sex codes and the measurements.
#[derive(Debug, Clone, Copy)]
struct Penguin {
    species: usize,
    island: usize,
    sex: usize,
    x: [f64; 4],
}

/// The study's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// Training and test rows.
    pub train: usize,
    /// Test rows.
    pub test: usize,
    /// Cells of the table.
    pub cells: usize,
    /// ε.
    pub epsilon: f64,
    /// Repetitions.
    pub repeats: usize,
    /// Test accuracy of the SVM trained on the original training set.
    pub original: f64,
    /// Mean and standard deviation of the accuracy over repetitions, per method.
    pub methods: Vec<(String, f64, f64)>,
    /// Accuracy of always predicting the training set's most common species.
    pub majority: f64,
    /// Seconds.
    pub seconds: f64,
}

fn read(path: &str) -> anyhow::Result<Vec<Penguin>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let level = |v: &str, levels: &[&str]| levels.iter().position(|l| *l == v);
        let (Some(species), Some(island), Some(sex)) = (
            level(f[0], &["Adelie", "Chinstrap", "Gentoo"]),
            level(f[1], &["Biscoe", "Dream", "Torgersen"]),
            level(f[6], &["female", "male"]),
        ) else {
            continue;
        };
        let x: Option<Vec<f64>> = f[2..6].iter().map(|v| v.parse::<f64>().ok()).collect();
        let Some(x) = x else { continue };
        out.push(Penguin { species, island, sex, x: [x[0], x[1], x[2], x[3]] });
    }
    Ok(out)
}

fn bin(x: f64, j: usize) -> usize {
    let (lo, hi) = BOUNDS[j];
    (((x.clamp(lo, hi) - lo) / (hi - lo) * BINS as f64) as usize).min(BINS - 1)
}

fn cell(p: &Penguin) -> usize {
    let codes = [p.species, p.island, p.sex, bin(p.x[0], 0), bin(p.x[1], 1), bin(p.x[2], 2), bin(p.x[3], 3)];
    codes.iter().zip(SIZES).fold(0, |k, (&c, s)| k * s + c)
}

/// A penguin from a cell, measurements uniform within their bins.
fn uncell(rng: &mut DpRng, mut k: usize) -> Penguin {
    let mut codes = [0usize; 7];
    for d in (0..7).rev() {
        codes[d] = k % SIZES[d];
        k /= SIZES[d];
    }
    let x = std::array::from_fn(|j| {
        let (lo, hi) = BOUNDS[j];
        lo + (hi - lo) * (codes[3 + j] as f64 + rng.random::<f64>()) / BINS as f64
    });
    Penguin { species: codes[0], island: codes[1], sex: codes[2], x }
}

fn features(ps: &[Penguin]) -> anyhow::Result<DenseMatrix<f64>> {
    let rows: Vec<Vec<f64>> = ps
        .iter()
        .map(|p| {
            let mut f = vec![0.0; 3];
            f[p.island] = 1.0;
            f.push(p.sex as f64);
            f.extend(
                (0..4).map(|j| (p.x[j].clamp(BOUNDS[j].0, BOUNDS[j].1) - BOUNDS[j].0) / (BOUNDS[j].1 - BOUNDS[j].0)),
            );
            f
        })
        .collect();
    let refs: Vec<&[f64]> = rows.iter().map(|r| r.as_slice()).collect();
    Ok(DenseMatrix::from_2d_array(&refs)?)
}

/// Test accuracy of an SVM trained on `train`; a training set with one
/// species predicts that species.
fn accuracy(train: &[Penguin], test: &[Penguin]) -> anyhow::Result<f64> {
    let y: Vec<i32> = train.iter().map(|p| p.species as i32).collect();
    let truth: Vec<i32> = test.iter().map(|p| p.species as i32).collect();
    let mut classes = y.clone();
    classes.sort_unstable();
    classes.dedup();
    let pred: Vec<i32> = if classes.len() < 2 {
        vec![classes.first().copied().unwrap_or(0); test.len()]
    } else {
        let x = features(train)?;
        let params = SVCParameters::default().with_c(1.0).with_kernel(Kernels::linear());
        let svc = MultiClassSVC::fit(&x, &y, &params)?;
        svc.predict(&features(test)?)?.iter().map(|&v| v.round() as i32).collect()
    };
    Ok(pred.iter().zip(&truth).filter(|(a, b)| a == b).count() as f64 / test.len() as f64)
}

/// Runs the case study.
pub fn run(path: &str, repeats: usize, epsilon: f64, seed: u64) -> anyhow::Result<CaseResult> {
    let t = Instant::now();
    let mut rng = DpRng::unsafe_seeded(seed);
    let mut all = read(path)?;
    // One random 80/20 split, kept for every repetition (as 002 §5).
    for i in (1..all.len()).rev() {
        let j = rng.random_range(0..=i);
        all.swap(i, j);
    }
    let n_train = all.len() * 4 / 5;
    let (train, test) = all.split_at(n_train);
    let k: usize = SIZES.iter().product();
    let mut counts = vec![0u64; k];
    for p in train {
        counts[cell(p)] += 1;
    }
    let original = accuracy(train, test)?;
    let mut by_species = [0usize; 3];
    train.iter().for_each(|p| by_species[p.species] += 1);
    let top = (0..3).max_by_key(|&s| by_species[s]).unwrap_or(0);
    let majority = test.iter().filter(|p| p.species == top).count() as f64 / test.len() as f64;
    let mut methods = Vec::new();
    for (name, mech) in [("LAP", CellMechanism::LaplaceSanitizer), ("MODIPS", CellMechanism::Modips)] {
        let mut acc = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let opts = CellOptions { sets: 1, rows: n_train as u64, prior: 1.0 / k as f64, generate: Generate::Sample };
            let mut a = ReleaseAccountant::new(PrivacyFilter::new(Budget::Pure { epsilon }));
            let rel = cells::synthesize(mech, &counts, "penguins", epsilon, &opts, &mut a, &mut rng)?;
            let mut syn = Vec::with_capacity(n_train);
            for (c, &m) in rel.sets[0].iter().enumerate() {
                for _ in 0..m {
                    syn.push(uncell(&mut rng, c));
                }
            }
            acc.push(accuracy(&syn, test)?);
        }
        let mean = acc.iter().sum::<f64>() / repeats as f64;
        let sd = (acc.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (repeats as f64 - 1.0).max(1.0)).sqrt();
        methods.push((name.to_string(), mean, sd));
    }
    Ok(CaseResult {
        train: train.len(),
        test: test.len(),
        cells: k,
        epsilon,
        repeats,
        original,
        methods,
        majority,
        seconds: t.elapsed().as_secs_f64(),
    })
}
