//! Canonical features of NAPSU-MQ's maximum-entropy model (003 App. C;
//! `../shared/papers/NOTES.md` §6).
//!
//! The released queries a(x) are full marginals over scopes S₁ … S_k. The
//! maximum-entropy distribution that matches them in expectation is
//! p(x | θ) ∝ exp(θᵀ c(x)) for features c that span the same functions as
//! the marginal indicators. The indicators themselves are linearly
//! dependent (each marginal sums to one, and marginals of overlapping
//! scopes share their sub-marginals), which leaves θ unidentified and makes
//! NUTS slow. The canonical parametrisation (Abbeel et al. 2006, Thm 3;
//! 003 App. C) with reference assignment 0 for every attribute removes the
//! dependencies: for every non-empty subset T of a scope and every
//! assignment v_T with **no zero entry**, the feature 1[x_T = v_T]. With the
//! constant function these are a basis of {Σ_j f_j(x_{S_j})} — linearly
//! independent, and spanning every marginal indicator (tested by rank on
//! random scopes below). A subset shared by several scopes appears once.
//!
//! The number of features is Σ_T Π_{a ∈ T} (|A_a| − 1); [`CanonicalFeatures::new`]
//! refuses more than a cap, naming the count.

use itertools::Itertools;

use super::NapsuError;

/// The canonical features of a set of scopes.
#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalFeatures {
    /// Attribute sizes.
    pub sizes: Vec<usize>,
    /// The query scopes (sorted attribute ids), in the order given.
    pub scopes: Vec<Vec<usize>>,
    /// The distinct non-empty subsets T of the scopes, sorted by size then ids.
    pub subsets: Vec<Vec<usize>>,
    /// For each subset, the index of its first feature; features of a subset
    /// are its assignments with entries in 1..|A_a|, row-major.
    pub offsets: Vec<usize>,
    /// For each subset, a scope that contains it (where its potential goes).
    pub home: Vec<usize>,
    /// Total number of features.
    pub len: usize,
}

impl CanonicalFeatures {
    /// The features of `scopes` over attributes of `sizes`; at most `cap` of them.
    pub fn new(scopes: &[Vec<usize>], sizes: &[usize], cap: usize) -> Result<Self, NapsuError> {
        let mut clean = Vec::with_capacity(scopes.len());
        for s in scopes {
            let mut t = s.clone();
            t.sort_unstable();
            t.dedup();
            if t.len() != s.len() {
                return Err(NapsuError::Query(format!("the query {s:?} repeats an attribute")));
            }
            if t.is_empty() {
                return Err(NapsuError::Query("an empty query".into()));
            }
            if let Some(a) = t.iter().find(|&&a| a >= sizes.len()) {
                return Err(NapsuError::Query(format!("attribute {a} is not in the domain")));
            }
            if clean.contains(&t) {
                return Err(NapsuError::Query(format!("the query {s:?} is given twice")));
            }
            clean.push(t);
        }
        let mut subsets: Vec<Vec<usize>> = Vec::new();
        for s in &clean {
            for k in 1..=s.len() {
                for t in s.iter().copied().combinations(k) {
                    if !subsets.contains(&t) {
                        subsets.push(t);
                    }
                }
            }
        }
        subsets.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let mut offsets = Vec::with_capacity(subsets.len());
        let mut home = Vec::with_capacity(subsets.len());
        let mut len = 0usize;
        for t in &subsets {
            offsets.push(len);
            home.push(clean.iter().position(|s| t.iter().all(|a| s.contains(a))).unwrap_or_default());
            let n = t.iter().try_fold(1usize, |acc, &a| acc.checked_mul(sizes[a].saturating_sub(1)));
            len = n.and_then(|n| len.checked_add(n)).filter(|&l| l <= cap).ok_or_else(|| {
                NapsuError::Query(format!(
                    "the queries need more than {cap} canonical features (the cap); use fewer or smaller marginals, \
                     or coarser attributes"
                ))
            })?;
        }
        Ok(Self { sizes: sizes.to_vec(), scopes: clean, subsets, offsets, home, len })
    }

    /// The feature of subset `i` at `cell` (row-major over the subset's
    /// attributes), or `None` when the assignment has a 0 (the reference).
    pub fn feature_at(&self, i: usize, cell: usize) -> Option<usize> {
        let (mut rest, mut idx, mut mult) = (cell, 0usize, 1usize);
        for &a in self.subsets[i].iter().rev() {
            let s = self.sizes[a];
            let digit = rest % s;
            rest /= s;
            if digit == 0 {
                return None;
            }
            idx += (digit - 1) * mult;
            mult *= s - 1;
        }
        Some(self.offsets[i] + idx)
    }

    /// The feature indices that are 1 at the cell `x` (a full assignment).
    pub fn active(&self, x: &[usize]) -> Vec<usize> {
        let mut out = Vec::new();
        'subsets: for (i, t) in self.subsets.iter().enumerate() {
            let mut idx = 0usize;
            for &a in t {
                if x[a] == 0 {
                    continue 'subsets;
                }
                idx = idx * (self.sizes[a] - 1) + (x[a] - 1);
            }
            out.push(self.offsets[i] + idx);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;
    use rand::{RngExt, SeedableRng};

    /// Every cell of the joint domain, row-major.
    pub(crate) fn cells(sizes: &[usize]) -> Vec<Vec<usize>> {
        sizes.iter().map(|&s| 0..s).multi_cartesian_product().collect()
    }

    fn rank(m: &DMatrix<f64>) -> usize {
        m.clone().svd(false, false).rank(1e-9)
    }

    /// Columns: the constant, then each feature (features case) or each
    /// marginal indicator (marginals case), over all joint cells.
    fn feature_matrix(f: &CanonicalFeatures) -> DMatrix<f64> {
        let cells = cells(&f.sizes);
        let mut m = DMatrix::zeros(cells.len(), f.len + 1);
        for (r, x) in cells.iter().enumerate() {
            m[(r, 0)] = 1.0;
            for j in f.active(x) {
                m[(r, j + 1)] = 1.0;
            }
        }
        m
    }

    fn marginal_matrix(scopes: &[Vec<usize>], sizes: &[usize]) -> DMatrix<f64> {
        let cells = cells(sizes);
        let widths: Vec<usize> = scopes.iter().map(|s| s.iter().map(|&a| sizes[a]).product()).collect();
        let mut m = DMatrix::zeros(cells.len(), 1 + widths.iter().sum::<usize>());
        for (r, x) in cells.iter().enumerate() {
            m[(r, 0)] = 1.0;
            let mut base = 1;
            for (s, w) in scopes.iter().zip(&widths) {
                let idx = s.iter().fold(0, |acc, &a| acc * sizes[a] + x[a]);
                m[(r, base + idx)] = 1.0;
                base += w;
            }
        }
        m
    }

    #[test]
    fn features_are_independent_and_span_the_marginals_on_random_scopes() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(16);
        for case in 0..40 {
            let d = rng.random_range(2..=5);
            let sizes: Vec<usize> = (0..d).map(|_| rng.random_range(2..=4)).collect();
            let k = rng.random_range(1..=4);
            let mut scopes: Vec<Vec<usize>> = Vec::new();
            for _ in 0..k {
                let w = rng.random_range(1..=d.min(3));
                let mut s: Vec<usize> = (0..d).collect();
                for i in (1..s.len()).rev() {
                    s.swap(i, rng.random_range(0..=i));
                }
                let mut s = s[..w].to_vec();
                s.sort_unstable();
                if !scopes.contains(&s) {
                    scopes.push(s);
                }
            }
            let f = CanonicalFeatures::new(&scopes, &sizes, 10_000).unwrap();
            let fm = feature_matrix(&f);
            assert_eq!(rank(&fm), f.len + 1, "case {case}: features are not independent ({scopes:?}, {sizes:?})");
            let mm = marginal_matrix(&scopes, &sizes);
            let both = DMatrix::from_fn(fm.nrows(), fm.ncols() + mm.ncols(), |r, c| {
                if c < fm.ncols() { fm[(r, c)] } else { mm[(r, c - fm.ncols())] }
            });
            assert_eq!(rank(&mm), f.len + 1, "case {case}: the marginals span a different space");
            assert_eq!(rank(&both), f.len + 1, "case {case}: the spans differ");
        }
    }

    #[test]
    fn counts_and_refusals() {
        // Two binary 2-way queries sharing attribute 1: subsets {0},{1},{2},{0,1},{1,2}.
        let f = CanonicalFeatures::new(&[vec![0, 1], vec![1, 2]], &[2, 2, 2], 100).unwrap();
        assert_eq!(f.subsets, vec![vec![0], vec![1], vec![2], vec![0, 1], vec![1, 2]]);
        assert_eq!(f.len, 5);
        let f = CanonicalFeatures::new(&[vec![0, 1]], &[3, 4], 100).unwrap();
        assert_eq!(f.len, 2 + 3 + 2 * 3);
        for (scopes, want) in [
            (vec![vec![0, 0]], "repeats"),
            (vec![vec![0], vec![0]], "twice"),
            (vec![vec![7]], "not in the domain"),
            (vec![vec![]], "empty"),
        ] {
            let e = CanonicalFeatures::new(&scopes, &[2, 2], 100).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let e = CanonicalFeatures::new(&[vec![0, 1]], &[100, 100], 1000).unwrap_err().to_string();
        assert!(e.contains("more than 1000 canonical features"), "{e}");
    }
}
