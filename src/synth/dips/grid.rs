//! Noisy sums of bounded real values, exactly (docs/PRIVACY.md §0, §6):
//! each value is rounded to a public grid g = 2^k on its own and clamped to
//! the per-row bound in grid units, the sums are exact integers, and the
//! noise is discrete Laplace in grid units. One row then moves a sum by at
//! most ⌈bound/g⌉ units whatever the other rows are (a float running sum
//! would not: its rounding depends on them). Used by MODIPS's normal
//! ([`super::normal`]) and general location ([`super::glom`]) models, with
//! one sum per cell (a row lies in one cell: parallel composition).

use dpflow_udfs::noise::real::{grid_exponent, to_grid_units};
use dpflow_udfs::noise::{DpRng, NoiseDistribution};

use super::DipsError;
use crate::privacy::MechanismRecord;

/// Per-cell sums of one statistic on its grid.
#[derive(Clone)]
pub(crate) struct GridSum {
    target: String,
    bound: f64,
    k: i32,
    units: f64,
    pub(crate) sums: Vec<i128>,
}

// The exact sums are protected: Debug never shows them.
dpflow_udfs::protected_debug!(GridSum);

impl GridSum {
    /// Sums of values with |x| ≤ `bound` over `cells` cells, gridded for
    /// Laplace noise at ε (`eps`).
    pub(crate) fn new(target: String, bound: f64, eps: f64, cells: usize) -> Self {
        // Each value is clamped to the bound in grid units: no rounding slack.
        let (units, k) = grid_units(bound, 0, eps);
        Self { target, bound, k, units, sums: vec![0; cells] }
    }

    /// Row counts over `cells` cells (grid 1, one unit per row).
    pub(crate) fn count(target: String, cells: usize) -> Self {
        Self { target, bound: 1.0, k: 0, units: 1.0, sums: vec![0; cells] }
    }

    /// Adds one row's value to its cell.
    pub(crate) fn add(&mut self, cell: usize, x: f64) {
        let u = self.units as i128;
        self.sums[cell] += to_grid_units(x, self.k).clamp(-u, u);
    }

    /// The charge of one set's release of these sums at ε.
    pub(crate) fn record(&self, set: usize, eps: f64) -> MechanismRecord {
        grid_record(format!("{}, set {set}", self.target), self.units, self.k, eps)
            .with_params(serde_json::json!({ "per_row_bound": self.bound }))
    }

    /// One noisy release of the sums (the caller has charged [`GridSum::record`]).
    pub(crate) fn noisy(&self, rng: &mut DpRng, eps: f64) -> Vec<f64> {
        grid_noisy(rng, &self.sums, self.units, self.k, eps)
    }
}

/// The grid for a vector of values whose exact L1 sensitivity is `delta1`,
/// released with Laplace noise at ε: (sensitivity in grid units, grid
/// exponent k). `rounded` values are each rounded to the grid on their own
/// (at most one unit each); the units cover that too.
pub(crate) fn grid_units(delta1: f64, rounded: usize, eps: f64) -> (f64, i32) {
    let k = grid_exponent(&NoiseDistribution::Laplace { scale: delta1 / eps }, delta1);
    ((delta1 / 2f64.powi(k)).ceil() + rounded as f64, k)
}

/// The charge of releasing integer sums of L1 sensitivity `units` (grid
/// 2^k) with discrete Laplace noise at ε.
pub(crate) fn grid_record(target: String, units: f64, k: i32, eps: f64) -> MechanismRecord {
    let g = 2f64.powi(k);
    MechanismRecord::laplace(target, units * g, units * g / eps)
}

/// Integer sums in grid units plus discrete Laplace noise of scale units/ε,
/// as reals (the caller has charged [`grid_record`]).
pub(crate) fn grid_noisy(rng: &mut DpRng, sums: &[i128], units: f64, k: i32, eps: f64) -> Vec<f64> {
    let noise = NoiseDistribution::Laplace { scale: units / eps };
    let g = 2f64.powi(k);
    sums.iter().map(|&s| s.saturating_add(noise.sample_integer(rng)) as f64 * g).collect()
}

/// Public bounds a grid sum can use: finite, lo < hi, the half-width h
/// between 10⁻¹⁰⁰ and about 10¹⁵⁰ (so h², h²/ε and the grid are finite).
pub(crate) fn check_bounds(column: impl Fn() -> String, lo: f64, hi: f64) -> Result<(), DipsError> {
    let h = 0.5 * (hi - lo);
    if lo.is_finite() && hi.is_finite() && lo < hi && (h * h * 1e12).is_finite() && h >= 1e-100 {
        Ok(())
    } else {
        Err(DipsError::Bounds { column: column(), lo, hi })
    }
}
