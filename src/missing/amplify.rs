//! Privacy amplification by MCAR missingness (000 §5.2): the privacy a
//! release gives the *complete ground truth* D̄ when the incomplete data D it
//! ran on came from an MCAR process with public per-attribute missing
//! probabilities φ_j.
//!
//! - Prop 5.4: a mechanism that only reads rows observed on the attribute set
//!   A is run on a subsample where each row is present with probability
//!   p_A = Π_{j∈A}(1 − φ_j); by the sampling theorem (000 Thm 5.3, Balle et
//!   al. 2018) an (ε, δ)-DP mechanism becomes (ln(1 + p(e^ε − 1)), pδ)-DP.
//! - Thm 5.6: mechanisms whose amplification sets are disjoint compose.
//! - Problem 3 / Alg 4: choose a partition of the attributes into
//!   amplification sets; every mechanism uses the best block contained in its
//!   marginal, and the mechanisms sharing a block are amplified as one group.
//!   Lemma 5.10 lets us drop partitions in which some mechanism has no block;
//!   we also only consider blocks contained in some marginal (a block that no
//!   marginal contains is never used, and splitting it into singletons only
//!   adds options), and search them by branch and bound, which returns the
//!   same optimum as the brute-force enumeration of Alg 4.
//! - Thm 5.12: column-wise learners (KaminoI-style) amplify one model.
//!
//! The paper reports the linearised cost Σ p·ε (Thm 5.3 "≈ pε for small ε");
//! `linear` reproduces it. Because ln(1 + p(e^ε − 1)) ≥ pε, the linear figure
//! is optimistic, so what dpflow puts in a release record is `epsilon`, the
//! exact Thm 5.3 value per group (never more than the unamplified ε).
//!
//! None of this holds for MAR or MNAR missingness (000 §5.2, "Discussion on
//! MAR and MNAR"): row inclusion then depends on the data, and
//! [`Missingness::require_mcar`] refuses to report an amplified ε̄.
//!
//! When is privacy for the incomplete data also privacy for the ground truth
//! at all? 000 Thm 5.2: when each ground-truth row is turned into its
//! incomplete version independently of the other rows (true of MCAR, MAR and
//! MNAR alike, as long as the mask of one person's row depends only on that
//! row), the release is at least as private for D̄ as for D; amplification is
//! the extra MCAR gives on top.

use std::collections::BTreeMap;

use super::{MissingError, Result};
use serde::{Deserialize, Serialize};

use crate::privacy::convert::cdp_eps;

/// The missingness mechanism a data owner declares for their data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Missingness {
    /// Not declared: no amplification is reported.
    #[default]
    Unknown,
    /// Missing completely at random.
    Mcar,
    /// Missing at random (depends on observed values).
    Mar,
    /// Missing not at random.
    Mnar,
}

impl Missingness {
    /// Ok for MCAR; a clear refusal otherwise (000 §5.2 discussion).
    pub fn require_mcar(&self) -> Result<()> {
        match self {
            Missingness::Mcar => Ok(()),
            Missingness::Mar | Missingness::Mnar => Err(MissingError::NotMcar(self.name())),
            Missingness::Unknown => Err(MissingError::UndeclaredMissingness),
        }
    }

    /// Lower-case name.
    pub fn name(&self) -> &'static str {
        match self {
            Missingness::Unknown => "unknown",
            Missingness::Mcar => "mcar",
            Missingness::Mar => "mar",
            Missingness::Mnar => "mnar",
        }
    }
}

/// Prop 5.4: probability that a row is observed on every attribute of `attrs`.
pub fn inclusion_probability(phi: &[f64], attrs: &[usize]) -> f64 {
    attrs.iter().map(|&a| 1.0 - phi[a]).product()
}

/// Thm 5.3 (Balle et al. 2018): ε of an ε-DP mechanism run on a subsample
/// where each row is present with probability at most `p`.
pub fn amplified_epsilon(p: f64, epsilon: f64) -> f64 {
    if p >= 1.0 {
        return epsilon;
    }
    // ln(1 + p(e^ε − 1)) without overflow for large ε.
    p.mul_add(epsilon.exp_m1(), 0.0).ln_1p().min(epsilon)
}

/// One DP sub-mechanism that reads the rows observed on `attrs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubMechanism {
    /// What it measures.
    pub name: String,
    /// The attributes it needs observed (its marginal).
    pub attrs: Vec<usize>,
    /// Its cost against the incomplete data.
    pub cost: SubCost,
}

/// Cost of a sub-mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubCost {
    /// (ε, δ)-DP (δ = 0 for pure DP).
    Approx {
        /// ε.
        epsilon: f64,
        /// δ.
        delta: f64,
    },
    /// ρ-zCDP.
    Zcdp {
        /// ρ.
        rho: f64,
    },
}

impl SubCost {
    fn linear_weight(&self) -> f64 {
        match *self {
            SubCost::Approx { epsilon, .. } => epsilon,
            SubCost::Zcdp { rho } => rho,
        }
    }
}

/// A group of mechanisms amplified by one block of attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The amplification attribute set (names).
    pub block: Vec<String>,
    /// p of the block (Prop 5.4).
    pub p: f64,
    /// Indices of the sub-mechanisms in the group.
    pub members: Vec<usize>,
    /// Their composed ε against D (before amplification).
    pub epsilon: f64,
    /// ε against the ground truth (Thm 5.3).
    pub amplified_epsilon: f64,
}

/// The ground-truth privacy of a release under MCAR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Amplification {
    /// Which result of 000 §5.2 was applied.
    pub method: String,
    /// Nominal ε against the incomplete data.
    pub nominal_epsilon: f64,
    /// δ of both guarantees.
    pub delta: f64,
    /// ε̄ against the complete ground truth (exact Thm 5.3, never above nominal).
    pub epsilon: f64,
    /// The paper's linearised factor Σ p_i w_i / Σ w_i (w = ε, or ρ for zCDP parts).
    pub linear_factor: f64,
    /// The same over the marginal measurements only (000 Table 2's convention,
    /// which leaves out structure selection and counts).
    pub marginal_linear_factor: f64,
    /// The amplification groups.
    pub groups: Vec<Group>,
    /// The public missing rates used.
    pub rates: BTreeMap<String, f64>,
    /// What ε̄ assumes and how far it holds (docs/PRIVACY.md §4, "What a
    /// reported ε̄ assumes").
    #[serde(default)]
    pub caveats: Vec<String>,
}

/// The assumption behind every ε̄: each cell missing independently.
pub const INDEPENDENT_CELLS: &str = "assumes every cell is missing independently of every other cell (MCAR \
    independent across columns and rows, at the declared rates); if columns tend to be missing together, \
    this ε̄ overstates privacy, so do not declare mcar then";

/// The caveat of every adaptive run's ε̄: its amplification sets follow the
/// measured marginals, which most adaptive mechanisms choose from DP output.
pub const EX_POST: &str = "ex post when the mechanism chose its marginals from DP output (PrivBayesE, AIME, \
    MST, MWEM): ε̄ is then computed for the marginals this run selected, so it describes this run's outcome \
    and is not a guarantee over runs; the ex-ante guarantee for the ground truth is the nominal ε";

/// Public per-attribute missing probabilities, indexed like the domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Rates {
    names: Vec<String>,
    phi: Vec<f64>,
}

impl Rates {
    /// Rates for `names`; attributes not in `given` have φ = 0.
    pub fn new(names: &[&str], given: &BTreeMap<String, f64>) -> Result<Self> {
        for (k, &v) in given {
            if !names.contains(&k.as_str()) {
                return Err(MissingError::RateColumn(k.clone()));
            }
            if !(0.0..1.0).contains(&v) {
                return Err(MissingError::RateRange { column: k.clone(), rate: v });
            }
        }
        Ok(Self {
            names: names.iter().map(|s| s.to_string()).collect(),
            phi: names.iter().map(|n| given.get(*n).copied().unwrap_or(0.0)).collect(),
        })
    }

    /// Rates from an `A=0.1,B=0.2` list.
    pub fn parse(names: &[&str], spec: &str) -> Result<Self> {
        let mut given = BTreeMap::new();
        for part in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                return Err(MissingError::RateSyntax(part.to_string()));
            };
            let v: f64 = v.trim().parse().map_err(|_| MissingError::RateNumber(part.to_string()))?;
            given.insert(k.trim().to_string(), v);
        }
        Self::new(names, &given)
    }

    /// The same rate for every attribute.
    pub fn uniform(names: &[&str], rate: f64) -> Result<Self> {
        Self::new(names, &names.iter().map(|n| (n.to_string(), rate)).collect())
    }

    /// φ per attribute.
    pub fn phi(&self) -> &[f64] {
        &self.phi
    }

    fn map(&self) -> BTreeMap<String, f64> {
        self.names.iter().cloned().zip(self.phi.iter().copied()).filter(|(_, v)| *v > 0.0).collect()
    }

    fn names_of(&self, attrs: &[usize]) -> Vec<String> {
        attrs.iter().map(|&a| self.names[a].clone()).collect()
    }
}

/// Total (ε, δ) of a set of sub-mechanisms against D, converting a zCDP part
/// at `delta_for_zcdp`.
fn compose(mechs: &[&SubMechanism], delta_for_zcdp: f64) -> (f64, f64) {
    let mut eps = 0.0;
    let mut delta = 0.0;
    let mut rho = 0.0;
    for m in mechs {
        match m.cost {
            SubCost::Approx { epsilon, delta: d } => {
                eps += epsilon;
                delta += d;
            }
            SubCost::Zcdp { rho: r } => rho += r,
        }
    }
    if rho > 0.0 {
        eps += cdp_eps(rho, delta_for_zcdp);
        delta += delta_for_zcdp;
    }
    (eps, delta)
}

/// Groups → an [`Amplification`]. `blocks[l]` amplifies the mechanisms with
/// `assign[i] == Some(l)`; the rest are unamplified. `delta` is the target δ
/// of the whole release when zCDP parts must be converted.
fn evaluate(
    method: &str,
    mechs: &[SubMechanism],
    rates: &Rates,
    blocks: &[Vec<usize>],
    assign: &[Option<usize>],
    delta: f64,
) -> Amplification {
    let all: Vec<&SubMechanism> = mechs.iter().collect();
    let (nominal_eps, nominal_delta) = compose(&all, delta);
    let phi = rates.phi();
    // The linearised (paper) factor.
    let total_w: f64 = mechs.iter().map(|m| m.cost.linear_weight()).sum();
    let lin: f64 = mechs
        .iter()
        .zip(assign)
        .map(|(m, a)| m.cost.linear_weight() * a.map_or(1.0, |l| inclusion_probability(phi, &blocks[l])))
        .sum();
    let linear_factor = if total_w > 0.0 { lin / total_w } else { 1.0 };
    let (mut mw, mut ml) = (0.0, 0.0);
    for (m, a) in mechs.iter().zip(assign).filter(|(m, _)| !m.attrs.is_empty()) {
        mw += m.cost.linear_weight();
        ml += m.cost.linear_weight() * a.map_or(1.0, |l| inclusion_probability(phi, &blocks[l]));
    }
    let marginal_linear_factor = if mw > 0.0 { ml / mw } else { 1.0 };

    // Exact: one (ε_G, δ_G) per group (δ of zCDP parts shared equally), amplified by Thm 5.3.
    let mut used: Vec<usize> = assign.iter().flatten().copied().collect();
    used.sort_unstable();
    used.dedup();
    let unamplified: Vec<&SubMechanism> =
        mechs.iter().zip(assign).filter(|(_, a)| a.is_none()).map(|(m, _)| m).collect();
    let parts = used.len() + usize::from(!unamplified.is_empty());
    let mut groups = Vec::new();
    let mut eps_bar = 0.0;
    let mut delta_bar = 0.0;
    for &l in &used {
        let members: Vec<usize> = (0..mechs.len()).filter(|&i| assign[i] == Some(l)).collect();
        let p = inclusion_probability(phi, &blocks[l]);
        let ms: Vec<&SubMechanism> = members.iter().map(|&i| &mechs[i]).collect();
        // Run the zCDP part at δ/(p·parts) so that the amplified δ is δ/parts.
        let (e, d) = compose(&ms, (delta / (p * parts as f64)).min(0.5));
        let ae = amplified_epsilon(p, e);
        eps_bar += ae;
        delta_bar += p * d;
        groups.push(Group { block: rates.names_of(&blocks[l]), p, members, epsilon: e, amplified_epsilon: ae });
    }
    if !unamplified.is_empty() {
        let (e, d) = compose(&unamplified, delta / parts as f64);
        eps_bar += e;
        delta_bar += d;
    }
    // zCDP parts: a group of Gaussian measurements on the rows observed on its
    // block is one Gaussian mechanism (σ_eff = 1/√(2ρ_G)) on a Poisson
    // subsample with rate p, so its RDP is the sampled Gaussian's (Mironov et
    // al. 2019); groups and unamplified parts compose in RDP. Usually much
    // tighter than converting each group to (ε, δ) first.
    let has_zcdp = mechs.iter().any(|m| matches!(m.cost, SubCost::Zcdp { .. }));
    if has_zcdp && delta > 0.0 {
        let rdp = rdp_amplified(mechs, phi, blocks, assign, delta);
        if rdp < eps_bar {
            eps_bar = rdp;
            delta_bar = nominal_delta;
        }
    }
    // Amplification never makes things worse: fall back to the nominal guarantee.
    let (epsilon, delta_out) = if eps_bar < nominal_eps && delta_bar <= nominal_delta * (1.0 + 1e-12) {
        (eps_bar, nominal_delta)
    } else {
        (nominal_eps, nominal_delta)
    };
    Amplification {
        method: method.to_string(),
        nominal_epsilon: nominal_eps,
        delta: delta_out,
        epsilon,
        linear_factor,
        marginal_linear_factor,
        groups,
        rates: rates.map(),
        caveats: vec![INDEPENDENT_CELLS.to_string()],
    }
}

/// ε at `delta` of the composition, in RDP, of each group's sampled Gaussian
/// (zCDP part) or amplified pure part and the unamplified parts; converted
/// with the conversion of Canonne, Kamath and Steinke (2020, Prop 12).
fn rdp_amplified(
    mechs: &[SubMechanism],
    phi: &[f64],
    blocks: &[Vec<usize>],
    assign: &[Option<usize>],
    delta: f64,
) -> f64 {
    let alphas: Vec<u32> = (2..=64).chain((72..=512).step_by(8)).collect();
    let mut curve = vec![0.0f64; alphas.len()];
    let mut pure_extra = 0.0;
    let mut groups: Vec<Option<usize>> = assign.to_vec();
    groups.sort_unstable();
    groups.dedup();
    for g in groups {
        let (mut rho, mut eps) = (0.0, 0.0);
        for (m, a) in mechs.iter().zip(assign) {
            if *a == g {
                match m.cost {
                    SubCost::Zcdp { rho: r } => rho += r,
                    SubCost::Approx { epsilon, delta: d } => {
                        if d > 0.0 {
                            return f64::INFINITY; // (ε, δ) parts do not compose in RDP
                        }
                        eps += epsilon;
                    }
                }
            }
        }
        let p = g.map_or(1.0, |l| inclusion_probability(phi, &blocks[l]));
        if p < 1.0 && rho > 0.0 && eps > 0.0 {
            // A group's pure and zCDP members read one subsample; amplifying
            // them apart would treat it as two independent ones (review
            // 2026-11-28). No synthesizer mixes them today: no RDP figure.
            return f64::INFINITY;
        }
        for (k, &a) in alphas.iter().enumerate() {
            if rho > 0.0 {
                curve[k] += if p < 1.0 {
                    crate::privacy::convert::sampled_gaussian_rdp(p, (1.0 / (2.0 * rho)).sqrt(), a)
                } else {
                    rho * a as f64
                };
            }
        }
        pure_extra += amplified_epsilon(p, eps);
    }
    alphas
        .iter()
        .zip(&curve)
        .map(|(&a, &e)| {
            let a = a as f64;
            e + pure_extra + ((a - 1.0) / a).ln() - (delta.ln() + a.ln()) / (a - 1.0)
        })
        .fold(f64::INFINITY, f64::min)
        .max(0.0)
}

/// Use case 1 (Prop 5.4): a complete-row method reads rows observed on every
/// attribute, so one block holds them all.
pub fn complete_row(mechs: &[SubMechanism], rates: &Rates, delta: f64) -> Amplification {
    let all: Vec<usize> = (0..rates.phi.len()).collect();
    evaluate("complete-row (000 Prop 5.4)", mechs, rates, &[all], &vec![Some(0); mechs.len()], delta)
}

/// Thm 5.6: each mechanism amplified by its whole marginal; the marginals
/// must be pairwise disjoint.
pub fn disjoint(mechs: &[SubMechanism], rates: &Rates, delta: f64) -> Result<Amplification> {
    for (i, a) in mechs.iter().enumerate() {
        for b in &mechs[i + 1..] {
            if a.attrs.iter().any(|x| b.attrs.contains(x)) {
                return Err(MissingError::Overlap(a.name.clone(), b.name.clone()));
            }
        }
    }
    let blocks: Vec<Vec<usize>> = mechs.iter().map(|m| m.attrs.clone()).collect();
    let assign: Vec<Option<usize>> = (0..mechs.len()).map(Some).collect();
    Ok(evaluate("disjoint marginals (000 Thm 5.6)", mechs, rates, &blocks, &assign, delta))
}

/// Naïve composition for overlapping marginals (000 Example 5.8, first
/// figure): greedily amplify mechanisms by their whole marginal, largest
/// saving first, skipping any that overlaps one already amplified.
pub fn naive(mechs: &[SubMechanism], rates: &Rates, delta: f64) -> Amplification {
    let phi = rates.phi();
    let mut order: Vec<usize> = (0..mechs.len()).collect();
    let saving = |i: usize| mechs[i].cost.linear_weight() * (1.0 - inclusion_probability(phi, &mechs[i].attrs));
    order.sort_by(|&a, &b| saving(b).total_cmp(&saving(a)));
    let mut taken: Vec<usize> = Vec::new();
    let mut blocks = Vec::new();
    let mut assign = vec![None; mechs.len()];
    for i in order {
        if mechs[i].attrs.iter().any(|a| taken.contains(a)) || saving(i) <= 0.0 {
            continue;
        }
        taken.extend(&mechs[i].attrs);
        assign[i] = Some(blocks.len());
        blocks.push(mechs[i].attrs.clone());
    }
    evaluate("naive disjoint subset (000 Example 5.8)", mechs, rates, &blocks, &assign, delta)
}

/// Problem 3 / Alg 4: the partition of the attributes into amplification
/// sets with the smallest linearised cost Σ_i ε_i·min_{A_l ⊆ S_i} p_{A_l},
/// found by branch and bound (same optimum as Alg 4's enumeration).
pub fn optimal(mechs: &[SubMechanism], rates: &Rates, delta: f64) -> Amplification {
    let phi = rates.phi();
    // Attributes with φ = 0 never help; leave them out of every block.
    let relevant: Vec<Vec<usize>> =
        mechs.iter().map(|m| m.attrs.iter().copied().filter(|&a| phi[a] > 0.0).collect()).collect();
    let mut attrs: Vec<usize> = relevant.iter().flatten().copied().collect();
    attrs.sort_unstable();
    attrs.dedup();
    let weights: Vec<f64> = mechs.iter().map(|m| m.cost.linear_weight()).collect();

    let mut search = Search {
        phi,
        sets: &relevant,
        weights: &weights,
        attrs: &attrs,
        blocks: Vec::new(),
        assigned: vec![false; phi.len()],
        best_cost: f64::INFINITY,
        best: Vec::new(),
        nodes: 0,
    };
    search.dfs();
    let blocks = search.best.clone();
    // Each mechanism takes its best contained block (Alg 4 line 7).
    let assign: Vec<Option<usize>> = relevant
        .iter()
        .map(|s| {
            blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| b.iter().all(|a| s.contains(a)))
                .min_by(|x, y| inclusion_probability(phi, x.1).total_cmp(&inclusion_probability(phi, y.1)))
                .map(|(l, _)| l)
        })
        .collect();
    evaluate("optimal valid partition (000 Alg 4)", mechs, rates, &blocks, &assign, delta)
}

struct Search<'a> {
    phi: &'a [f64],
    sets: &'a [Vec<usize>],
    weights: &'a [f64],
    attrs: &'a [usize],
    blocks: Vec<Vec<usize>>,
    assigned: Vec<bool>,
    best_cost: f64,
    best: Vec<Vec<usize>>,
    nodes: u64,
}

impl Search<'_> {
    /// Lower bound on the cost of any completion of the current blocks: a
    /// mechanism can at best use the product over its attributes not yet in
    /// a block, or a block already placed inside its marginal.
    fn bound(&self) -> f64 {
        self.sets
            .iter()
            .zip(self.weights)
            .map(|(s, w)| {
                let placed = self
                    .blocks
                    .iter()
                    .filter(|b| b.iter().all(|a| s.contains(a)))
                    .map(|b| inclusion_probability(self.phi, b))
                    .fold(1.0f64, f64::min);
                let free: Vec<usize> = s.iter().copied().filter(|&a| !self.assigned[a]).collect();
                let future = if free.is_empty() { 1.0 } else { inclusion_probability(self.phi, &free) };
                w * placed.min(future)
            })
            .sum()
    }

    fn dfs(&mut self) {
        self.nodes += 1;
        let lb = self.bound();
        if lb >= self.best_cost - 1e-15 || self.nodes > 5_000_000 {
            return;
        }
        let Some(&first) = self.attrs.iter().find(|&&a| !self.assigned[a]) else {
            // Complete partition: the bound is its exact cost.
            self.best_cost = lb;
            self.best = self.blocks.clone();
            return;
        };
        // Candidate blocks: {first} ∪ T with T ⊆ (unassigned attributes sharing a marginal with first),
        // and the block contained in some marginal.
        let mut cands: Vec<Vec<usize>> = Vec::new();
        for s in self.sets.iter().filter(|s| s.contains(&first)) {
            let others: Vec<usize> = s.iter().copied().filter(|&a| a != first && !self.assigned[a]).collect();
            for mask in 0u32..(1u32 << others.len().min(20)) {
                let mut b = vec![first];
                b.extend(others.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, &a)| a));
                b.sort_unstable();
                if !cands.contains(&b) {
                    cands.push(b);
                }
            }
        }
        // Larger blocks first: they tend to give good incumbents early.
        cands.sort_by_key(|b| std::cmp::Reverse(b.len()));
        for b in cands {
            for &a in &b {
                self.assigned[a] = true;
            }
            self.blocks.push(b);
            self.dfs();
            let b = self.blocks.pop().expect("pushed");
            for &a in &b {
                self.assigned[a] = false;
            }
        }
    }
}

/// Thm 5.12: a column-wise learner (model i learns attribute `order[i]` from
/// the earlier ones and imputes it) can amplify one model only; we amplify the
/// one with the largest saving ε_j(1 − p_j) (the theorem's choice, argmin p_j,
/// when budgets are equal).
///
/// The paper's arithmetic, for its examples only: dpflow's KaminoI reports no
/// amplification, because it is charged as one RDP filter with no
/// per-component (ε, δ) to put here (docs/PRIVACY.md §8).
pub fn column_wise(order: &[usize], costs: &[f64], rates: &Rates) -> Result<Amplification> {
    if order.len() != costs.len() {
        return Err(MissingError::CostCount { attributes: order.len(), costs: costs.len() });
    }
    let mechs: Vec<SubMechanism> = order
        .iter()
        .zip(costs)
        .map(|(&a, &e)| SubMechanism {
            name: format!("model for {}", rates.names[a]),
            attrs: vec![a],
            cost: SubCost::Approx { epsilon: e, delta: 0.0 },
        })
        .collect();
    let phi = rates.phi();
    let best = (0..order.len()).max_by(|&x, &y| (costs[x] * phi[order[x]]).total_cmp(&(costs[y] * phi[order[y]])));
    let mut assign = vec![None; order.len()];
    let mut blocks = Vec::new();
    if let Some(j) = best.filter(|&j| phi[order[j]] > 0.0) {
        assign[j] = Some(0);
        blocks.push(vec![order[j]]);
    }
    Ok(evaluate("column-wise (000 Thm 5.12)", &mechs, rates, &blocks, &assign, 0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running example of 000 (Figure 3, Example 5.5): State, Occupation,
    /// Gender, Income with φ = 1/4, 0, 1/4, 1/4 and four ε/4 sub-mechanisms
    /// M1 = State, M2 = Occupation, M3 = Gender, M4 = Gender × Income.
    fn example() -> (Rates, Vec<SubMechanism>) {
        let names = ["State", "Occupation", "Gender", "Income"];
        let rates = Rates::parse(&names, "State=0.25,Gender=0.25,Income=0.25").unwrap();
        let m = |name: &str, attrs: Vec<usize>| SubMechanism {
            name: name.into(),
            attrs,
            cost: SubCost::Approx { epsilon: 0.25, delta: 0.0 },
        };
        (rates, vec![m("M1", vec![0]), m("M2", vec![1]), m("M3", vec![2]), m("M4", vec![2, 3])])
    }

    #[test]
    fn example_5_5_complete_row() {
        let (rates, mechs) = example();
        let a = complete_row(&mechs, &rates, 0.0);
        // p = (3/4)^3 = 0.421875: "0.421ε".
        assert!((a.linear_factor - 0.421875).abs() < 1e-12);
        // Exact Thm 5.3 at ε = 1: ln(1 + 0.421875(e − 1)).
        assert!((a.epsilon - (0.421875 * (1f64.exp() - 1.0)).ln_1p()).abs() < 1e-12);
        assert!(a.epsilon > a.linear_factor && a.epsilon < 1.0);
    }

    #[test]
    fn example_5_7_disjoint() {
        let (rates, mechs) = example();
        let three = vec![mechs[0].clone(), mechs[1].clone(), mechs[3].clone()];
        let a = disjoint(&three, &rates, 0.0).unwrap();
        // (3/4·ε/4 + ε/4 + 9/16·ε/4) / (3ε/4) = 0.77.
        let expected = (0.75 * 0.25 + 0.25 + 0.5625 * 0.25) / 0.75;
        assert!((a.linear_factor - expected).abs() < 1e-12);
        assert_eq!(format!("{:.2}", a.linear_factor), "0.77");
        assert!(disjoint(&mechs, &rates, 0.0).is_err(), "M3 and M4 overlap");
    }

    #[test]
    fn example_5_8_naive_and_grouped() {
        let (rates, mechs) = example();
        let naive = naive(&mechs, &rates, 0.0);
        // 3/4·ε/4 + ε/4 + ε/4 + 9/16·ε/4 = 0.828ε ("0.83ε").
        assert!((naive.linear_factor - (0.75 * 0.25 + 0.25 + 0.25 + 0.5625 * 0.25)).abs() < 1e-12);
        assert_eq!(format!("{:.2}", naive.linear_factor), "0.83");
        let best = optimal(&mechs, &rates, 0.0);
        // Grouped by Gender: 3/4·ε/4 + ε/4 + 3/4·(ε/4 + ε/4) = 0.8125ε ("0.81ε").
        assert!((best.linear_factor - 0.8125).abs() < 1e-12);
        assert!(best.epsilon < naive.epsilon);
    }

    #[test]
    fn example_5_11_best_partition() {
        let (rates, mechs) = example();
        let best = optimal(&mechs, &rates, 0.0);
        assert_eq!(format!("{:.2}", best.linear_factor), "0.81");
        // M3 and M4 share the Gender block; M1 uses State; M2 is unamplified (φ = 0).
        let gender = best.groups.iter().find(|g| g.block == ["Gender"]).expect("a Gender group");
        assert_eq!(gender.members, vec![2, 3]);
        assert!(best.groups.iter().any(|g| g.block == ["State"] && g.members == vec![0]));
        // Brute force over all 15 partitions of the 4 attributes (Alg 4) agrees.
        assert!((brute_force(&mechs, rates.phi()) - best.linear_factor).abs() < 1e-12);
    }

    #[test]
    fn example_5_13_column_wise() {
        let (rates, _) = example();
        let a = column_wise(&[0, 1, 2, 3], &[0.25; 4], &rates).unwrap();
        assert!((a.linear_factor - 0.9375).abs() < 1e-12);
    }

    #[test]
    fn mar_and_mnar_are_refused() {
        assert!(Missingness::Mcar.require_mcar().is_ok());
        let e = Missingness::Mar.require_mcar().unwrap_err().to_string();
        assert!(e.contains("MAR") || e.contains("mar"), "{e}");
        assert!(Missingness::Mnar.require_mcar().is_err());
        assert!(Missingness::Unknown.require_mcar().is_err());
    }

    #[test]
    fn exact_never_exceeds_nominal_and_matches_theorem_5_3() {
        for &p in &[0.0, 0.1, 0.5, 0.99, 1.0] {
            for &e in &[0.01, 0.5, 1.0, 5.0, 50.0] {
                let a = amplified_epsilon(p, e);
                assert!(a <= e + 1e-15 && a >= p * e - 1e-12, "p={p} e={e} a={a}");
            }
        }
        assert!((amplified_epsilon(0.5, 1.0) - (1.0 + 0.5 * (1f64.exp() - 1.0)).ln()).abs() < 1e-15);
    }

    #[test]
    fn zcdp_parts_are_converted_and_never_worse_than_nominal() {
        let names = ["a", "b", "c"];
        let rates = Rates::uniform(&names, 0.3).unwrap();
        let mechs: Vec<SubMechanism> = [vec![0, 1], vec![1, 2], vec![0, 2]]
            .into_iter()
            .map(|attrs| SubMechanism { name: "g".into(), attrs, cost: SubCost::Zcdp { rho: 0.01 } })
            .collect();
        let a = optimal(&mechs, &rates, 1e-6);
        assert!((a.nominal_epsilon - cdp_eps(0.03, 1e-6)).abs() < 1e-9);
        assert!(a.epsilon <= a.nominal_epsilon);
        assert!(a.delta <= 1e-6 * (1.0 + 1e-9));
        // Heavy subsampling: the sampled-Gaussian RDP route gives a real gain.
        let rates = Rates::uniform(&names, 0.6).unwrap();
        let c = complete_row(&mechs, &rates, 1e-6);
        assert!(c.epsilon < 0.7 * c.nominal_epsilon, "{} vs {}", c.epsilon, c.nominal_epsilon);
        // And it is never better than subsampling at p applied to ε directly would allow at δ → 0.
        assert!(c.epsilon > 0.0);
    }

    /// Alg 4 by enumerating every set partition (for tests).
    fn brute_force(mechs: &[SubMechanism], phi: &[f64]) -> f64 {
        fn partitions(items: &[usize]) -> Vec<Vec<Vec<usize>>> {
            if items.is_empty() {
                return vec![vec![]];
            }
            let (first, rest) = (items[0], &items[1..]);
            let mut out = Vec::new();
            for p in partitions(rest) {
                for i in 0..p.len() {
                    let mut q = p.clone();
                    q[i].push(first);
                    out.push(q);
                }
                let mut q = p.clone();
                q.push(vec![first]);
                out.push(q);
            }
            out
        }
        let d = phi.len();
        let total: f64 = mechs.iter().map(|m| m.cost.linear_weight()).sum();
        let mut best = f64::INFINITY;
        for p in partitions(&(0..d).collect::<Vec<_>>()) {
            let mut cost = 0.0;
            for m in mechs {
                let c = p
                    .iter()
                    .filter(|b| b.iter().all(|a| m.attrs.contains(a)))
                    .map(|b| inclusion_probability(phi, b))
                    .fold(f64::INFINITY, f64::min);
                // No block inside the marginal: the mechanism is simply not amplified.
                cost += m.cost.linear_weight() * c.min(1.0);
            }
            best = best.min(cost);
        }
        best / total
    }

    #[test]
    fn branch_and_bound_matches_brute_force_on_random_cases() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..60 {
            let d = rng.random_range(2..=6);
            let names: Vec<String> = (0..d).map(|i| format!("c{i}")).collect();
            let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            let given = names.iter().map(|n| (n.clone(), rng.random_range(0.0..0.6))).collect();
            let rates = Rates::new(&refs, &given).unwrap();
            let m = rng.random_range(1..=5);
            let mechs: Vec<SubMechanism> = (0..m)
                .map(|i| {
                    let mut attrs: Vec<usize> = (0..d).filter(|_| rng.random_bool(0.5)).collect();
                    if attrs.is_empty() {
                        attrs.push(rng.random_range(0..d));
                    }
                    SubMechanism {
                        name: format!("m{i}"),
                        attrs,
                        cost: SubCost::Approx { epsilon: rng.random_range(0.1..1.0), delta: 0.0 },
                    }
                })
                .collect();
            let bb = optimal(&mechs, &rates, 0.0).linear_factor;
            let bf = brute_force(&mechs, rates.phi());
            assert!((bb - bf).abs() < 1e-9, "b&b {bb} vs brute force {bf} for {mechs:?}");
        }
    }

    /// Review 2026-11-28: a group whose pure and zCDP members read one
    /// subsample must not have the two parts amplified apart (that treats
    /// them as independent subsamples); it gets no RDP figure.
    #[test]
    fn a_group_mixing_pure_and_zcdp_members_gets_no_rdp_figure() {
        let rates = Rates::parse(&["a", "b"], "a=0.5").unwrap();
        let m = |cost| SubMechanism { name: "m".into(), attrs: vec![0], cost };
        let mechs = vec![m(SubCost::Zcdp { rho: 0.1 }), m(SubCost::Approx { epsilon: 0.5, delta: 0.0 })];
        let one_group = [Some(0), Some(0)];
        assert_eq!(rdp_amplified(&mechs, rates.phi(), &[vec![0]], &one_group, 1e-6), f64::INFINITY);
        // Apart (the zCDP member unamplified) the figure is finite.
        let apart = [None, Some(0)];
        assert!(rdp_amplified(&mechs, rates.phi(), &[vec![0]], &apart, 1e-6).is_finite());
    }
}
