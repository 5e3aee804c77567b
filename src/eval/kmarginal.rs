//! The NIST CRC k-marginal score (SDNist 2.x, `sdnist.metrics.kmarginal`;
//! the utility score of the NIST Collaborative Research Cycle, S16).
//!
//! **Definition.** For every pair of columns (SDNist leaves out `PUMA` and
//! `INDP`), the target's and the deidentified data's 2-way densities
//! (each cell's count over the file's rows; a null is a value of its own, as
//! SDNist sees the excerpts' `N` token) differ by an L1 distance d in
//! [0, 2]. With d̄ the mean over pairs,
//!
//! score = (2 − d̄) · 500 ∈ [0, 1000] (1000: every 2-way marginal equal).
//!
//! **Grouped** (SDNist's `group_features`, `PUMA` in the CRC report, used
//! here whenever the data have a `PUMA` column): the pairs' marginals are
//! taken with the group column, (PUMA, a, b), and the score is the same
//! formula over those. **Per group**: for
//! a group g of the group column with N_g of the target's N rows, each
//! pair's L1 over the cells of g is capped by the target's mass in g, then
//! scaled by N/N_g; with their mean d̄_g over pairs, score_g = (1 − d̄_g) ·
//! 1000. Groups absent from the target get no score.
//!
//! Densities are over the domain's codes, so numeric columns are compared
//! in their bins; SDNist compares whatever values it is given (the test
//! gives it columns that the domain does not bin).

use serde::Serialize;

/// Columns SDNist leaves out of the pairs.
pub const EXCLUDED: [&str; 2] = ["PUMA", "INDP"];

/// The column SDNist's CRC report groups by.
pub const GROUP_COLUMN: &str = "PUMA";

/// A k-marginal evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KMarginal {
    /// The score on SDNist's 0–1000 scale (over the (group, pair)
    /// marginals when there is a group column, as SDNist's CRC report).
    pub score: f64,
    /// Pairs of columns averaged over.
    pub pairs: usize,
    /// The group column, when the data have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_column: Option<String>,
    /// The score within each group present in the target, in code order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupScore>,
}

/// One group's score.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupScore {
    /// The group's label.
    pub group: String,
    /// Its score on the 0–1000 scale.
    pub score: f64,
}

/// L1 distance between the densities of two count vectors (each over its
/// own total; an empty vector's densities are 0).
pub fn density_l1(target: &[f64], synthetic: &[f64]) -> f64 {
    let (nt, ns) = (total(target), total(synthetic));
    target.iter().zip(synthetic).map(|(t, s)| (t / nt - s / ns).abs()).sum()
}

fn total(v: &[f64]) -> f64 {
    v.iter().sum::<f64>().max(f64::MIN_POSITIVE)
}

/// The score from each pair's (target, synthetic) counts.
pub fn score(pairs: &[(&[f64], &[f64])]) -> f64 {
    let mean = pairs.iter().map(|(t, s)| density_l1(t, s)).sum::<f64>() / pairs.len().max(1) as f64;
    (2.0 - mean) * 500.0
}

/// A 3-way marginal over a group column and a pair, row-major over
/// `shape` (the last axis fastest), with the group column on axis
/// `group_axis`.
#[derive(Debug, Clone, Copy)]
pub struct GroupedPair<'a> {
    /// The target's counts.
    pub target: &'a [f64],
    /// The synthetic data's counts.
    pub synthetic: &'a [f64],
    /// Cells per axis.
    pub shape: &'a [usize],
    /// Which axis is the group column.
    pub group_axis: usize,
}

/// Each group's score (`None` for a group absent from the target), over
/// the group column's `groups` codes.
pub fn group_scores(pairs: &[GroupedPair<'_>], groups: usize) -> Vec<Option<f64>> {
    let mut sum = vec![0.0; groups];
    let mut group_rows = vec![0.0; groups];
    for p in pairs {
        let (nt, ns) = (total(p.target), total(p.synthetic));
        let stride: usize = p.shape[p.group_axis + 1..].iter().product();
        let size = p.shape[p.group_axis];
        let (mut diff, mut mass) = (vec![0.0; size], vec![0.0; size]);
        for (i, (t, s)) in p.target.iter().zip(p.synthetic).enumerate() {
            let g = (i / stride) % size;
            diff[g] += (t / nt - s / ns).abs();
            mass[g] += t / nt;
        }
        for g in 0..size.min(groups) {
            // SDNist: min(target mass in g, L1 in g), scaled by N/N_g.
            if mass[g] > 0.0 {
                sum[g] += diff[g].min(mass[g]) / mass[g];
            }
        }
        group_rows = mass;
    }
    let n = pairs.len().max(1) as f64;
    (0..groups)
        .map(|g| (group_rows.get(g).copied().unwrap_or(0.0) > 0.0).then(|| (1.0 - sum[g] / n) * 1000.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand computation: target counts (3, 1) over 4 rows, synthetic (1, 1)
    /// over 2: densities (0.75, 0.25) and (0.5, 0.5), L1 0.5, score
    /// (2 − 0.5)·500 = 750; identical densities score 1000, disjoint 0.
    #[test]
    fn the_score_matches_a_hand_computation() {
        assert_eq!(score(&[(&[3.0, 1.0], &[1.0, 1.0])]), 750.0);
        assert_eq!(score(&[(&[3.0, 1.0], &[6.0, 2.0])]), 1000.0);
        assert_eq!(score(&[(&[1.0, 0.0], &[0.0, 5.0])]), 0.0);
        assert_eq!(score(&[(&[3.0, 1.0], &[1.0, 1.0]), (&[1.0, 0.0], &[0.0, 5.0])]), 375.0);
    }

    /// Two groups × a 2-cell pair. Target: g0 (2, 2), g1 (4, 0) over 8
    /// rows; synthetic: g0 (1, 0), g1 (0, 1) over 2 rows. Densities: target
    /// (.25, .25, .5, 0), synthetic (.5, 0, 0, .5). Group 0: L1 0.5, mass
    /// 0.5: min 0.5, scaled by 1/0.5 → 1, score 0. Group 1: L1 1.0, mass
    /// 0.5: min 0.5 → 1, score 0. With the synthetic (2, 2, 4, 0): 1000 each.
    #[test]
    fn group_scores_match_a_hand_computation() {
        let shape = [2, 2];
        let t = [2.0, 2.0, 4.0, 0.0];
        let p = |s: &'static [f64]| GroupedPair { target: &t, synthetic: s, shape: &shape, group_axis: 0 };
        assert_eq!(group_scores(&[p(&[1.0, 0.0, 0.0, 1.0])], 2), vec![Some(0.0), Some(0.0)]);
        assert_eq!(group_scores(&[p(&[2.0, 2.0, 4.0, 0.0])], 2), vec![Some(1000.0), Some(1000.0)]);
        // Group 0 off by a quarter of its mass: L1 in g0 = |.25 − .375| + |.25 − .125| = 0.25,
        // scaled 0.25/0.5 = 0.5 → 500; group 1 exact.
        assert_eq!(group_scores(&[p(&[3.0, 1.0, 4.0, 0.0])], 2), vec![Some(500.0), Some(1000.0)]);
        // The group axis last: the same numbers transposed.
        let tt = [2.0, 4.0, 2.0, 0.0];
        let q = GroupedPair { target: &tt, synthetic: &[3.0, 4.0, 1.0, 0.0], shape: &shape, group_axis: 1 };
        assert_eq!(group_scores(&[q], 2), vec![Some(500.0), Some(1000.0)]);
        // A group absent from the target gets no score.
        assert_eq!(group_scores(&[p(&[2.0, 2.0, 4.0, 0.0])], 3)[2], None);
    }
}
