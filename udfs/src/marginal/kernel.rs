//! The counting kernel: dense count vectors for many attribute sets, updated
//! batch by batch. Memory is proportional to the total number of cells, never
//! to the number of rows.

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt32Type;
use datafusion::common::{DataFusionError, Result};
use serde::{Deserialize, Serialize};

/// How a marginal treats nulls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NullMode {
    /// Null is a cell of its own (nullable columns have a null code).
    #[default]
    Cells,
    /// Count only rows observed on every attribute of the set (partial
    /// marginal observation, 000 §4.2); the number of such rows is reported.
    Observed,
}

impl NullMode {
    /// The spelling used in output and specs.
    pub fn as_str(&self) -> &'static str {
        match self {
            NullMode::Cells => "cells",
            NullMode::Observed => "observed",
        }
    }
}

/// One encoded input column: its name, number of codes, and null code.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EncodedColumn {
    /// Column name in the encoded input.
    pub name: String,
    /// Number of codes (including the null code).
    pub cardinality: u32,
    /// The null code, for nullable columns.
    pub null_code: Option<u32>,
}

/// One requested marginal: an attribute set (by column position) and its null mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MarginalSet {
    /// Positions into [`MarginalConfig::columns`], in the order of the cell index
    /// (the first attribute varies slowest).
    pub attrs: Vec<usize>,
    /// Null handling.
    pub mode: NullMode,
}

/// What a marginal operator computes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MarginalConfig {
    /// The encoded input columns that sets refer to.
    pub columns: Vec<EncodedColumn>,
    /// The marginals.
    pub sets: Vec<MarginalSet>,
}

/// Largest number of cells one marginal may have.
pub const MAX_CELLS: u64 = 1 << 31;

impl MarginalConfig {
    /// Number of cells of set `i` (with the null cell in `Cells` mode, without it in `Observed`).
    pub fn cells(&self, i: usize) -> u64 {
        let s = &self.sets[i];
        s.attrs
            .iter()
            .map(|&a| {
                let c = &self.columns[a];
                match (s.mode, c.null_code) {
                    (NullMode::Observed, Some(_)) => c.cardinality as u64 - 1,
                    _ => c.cardinality as u64,
                }
            })
            .product()
    }

    /// Comma-separated attribute names of set `i`.
    pub fn set_label(&self, i: usize) -> String {
        self.sets[i].attrs.iter().map(|&a| self.columns[a].name.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Checks positions, null codes and sizes.
    pub fn validate(&self) -> Result<()> {
        for c in &self.columns {
            if c.cardinality == 0 {
                return Err(DataFusionError::Plan(format!("column {} has an empty domain", c.name)));
            }
            if let Some(n) = c.null_code
                && n + 1 != c.cardinality
            {
                return Err(DataFusionError::Plan(format!("column {}: the null code must be the last code", c.name)));
            }
        }
        for (i, s) in self.sets.iter().enumerate() {
            let mut seen = std::collections::HashSet::new();
            for &a in &s.attrs {
                if a >= self.columns.len() {
                    return Err(DataFusionError::Plan(format!("marginal {i}: column position {a} out of range")));
                }
                if !seen.insert(a) {
                    return Err(DataFusionError::Plan(format!(
                        "marginal {i}: attribute {} repeated",
                        self.columns[a].name
                    )));
                }
            }
            let cells: f64 = s.attrs.iter().map(|&a| self.columns[a].cardinality as f64).product();
            if cells > MAX_CELLS as f64 {
                return Err(DataFusionError::Plan(format!(
                    "marginal ({}) has {cells} cells, more than the limit {MAX_CELLS}",
                    self.set_label(i)
                )));
            }
        }
        Ok(())
    }
}

/// Per-set state.
#[derive(Debug, Clone)]
struct SetCounts {
    cols: Vec<usize>,
    strides: Vec<u64>,
    /// For observed mode, the null code of each attribute (None = never null).
    nulls: Vec<Option<u32>>,
    /// Start of this set's cells + 1 counts in the accumulator's one
    /// buffer; the last of them is the overflow slot for unobserved rows.
    offset: usize,
    cells: u64,
    observed: u64,
}

/// Accumulates all marginals of a config over batches of encoded columns.
#[derive(Debug, Clone)]
pub struct MarginalAccumulator {
    config: MarginalConfig,
    /// For each config column, its position in the input batches.
    input_pos: Vec<usize>,
    sets: Vec<SetCounts>,
    /// All sets' counts in one buffer (issue 19: the output takes it over
    /// without a copy, so a wide configuration holds its cells once).
    counts: Vec<u64>,
    rows: u64,
    scratch: Vec<u64>,
    scratch32: Vec<u32>,
}

impl MarginalAccumulator {
    /// A zeroed accumulator; `input_pos[c]` is the batch column of config column `c`.
    pub fn new(config: MarginalConfig, input_pos: Vec<usize>) -> Result<Self> {
        config.validate()?;
        let mut total = 0usize;
        let sets: Vec<SetCounts> = (0..config.sets.len())
            .map(|i| {
                let s = &config.sets[i];
                let observed = s.mode == NullMode::Observed;
                // Cell sizes per attribute (observed mode drops the null code).
                let sizes: Vec<u64> = s
                    .attrs
                    .iter()
                    .map(|&a| {
                        let c = &config.columns[a];
                        if observed && c.null_code.is_some() { c.cardinality as u64 - 1 } else { c.cardinality as u64 }
                    })
                    .collect();
                let mut strides = vec![1u64; sizes.len()];
                for k in (0..sizes.len().saturating_sub(1)).rev() {
                    strides[k] = strides[k + 1] * sizes[k + 1];
                }
                let cells = config.cells(i);
                let offset = total;
                total += cells as usize + 1;
                SetCounts {
                    cols: s.attrs.clone(),
                    strides,
                    nulls: s.attrs.iter().map(|&a| if observed { config.columns[a].null_code } else { None }).collect(),
                    offset,
                    cells,
                    observed: 0,
                }
            })
            .collect();
        let counts = vec![0; total];
        Ok(Self { config, input_pos, sets, counts, rows: 0, scratch: Vec::new(), scratch32: Vec::new() })
    }

    /// The configuration.
    pub fn config(&self) -> &MarginalConfig {
        &self.config
    }

    /// Rows seen.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds one batch of encoded (UInt32, non-null) columns.
    pub fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let cols: Vec<&[u32]> = self
            .input_pos
            .iter()
            .map(|&p| {
                let a = batch.column(p);
                a.as_primitive_opt::<UInt32Type>()
                    .map(|a| a.values().as_ref())
                    .ok_or_else(|| DataFusionError::Execution(format!("marginal input column {p} is not UInt32 codes")))
            })
            .collect::<Result<_>>()?;
        // Codes must be inside the domain (never trust the input).
        for (ci, c) in cols.iter().enumerate() {
            let card = self.config.columns[ci].cardinality;
            if let Some(bad) = c.iter().find(|&&v| v >= card) {
                return Err(DataFusionError::Execution(format!(
                    "column {}: code {bad} outside its domain of {card} codes",
                    self.config.columns[ci].name
                )));
            }
        }
        self.scratch.resize(n, 0);
        self.scratch32.resize(n, 0);
        for set in &self.sets {
            let counts = &mut self.counts[set.offset..=set.offset + set.cells as usize];
            // Cells mode (the common case): every code is inside its domain,
            // so the index Σ code·stride is below `cells` < 2³¹ and fits a u32.
            // One pass per attribute builds the indices (vectorised), then one
            // counting pass. (Spreading rows over four count vectors, so rows
            // hitting one cell do not wait on each other's store, measured no
            // faster on bench data.)
            if set.nulls.iter().all(Option::is_none) {
                let idx = &mut self.scratch32[..n];
                for (k, &c) in set.cols.iter().enumerate() {
                    let s = set.strides[k] as u32;
                    if k == 0 {
                        idx.iter_mut().zip(cols[c]).for_each(|(x, &v)| *x = v * s);
                    } else {
                        idx.iter_mut().zip(cols[c]).for_each(|(x, &v)| *x += v * s);
                    }
                }
                idx.iter().for_each(|&i| counts[i as usize] += 1);
                continue;
            }
            let idx = &mut self.scratch[..n];
            let sentinel = set.cells;
            // Index of each row: Σ code·stride, or the overflow slot if unobserved.
            let first = cols[set.cols[0]];
            let s0 = set.strides[0];
            match set.nulls[0] {
                None => idx.iter_mut().zip(first).for_each(|(x, &c)| *x = c as u64 * s0),
                Some(nc) => {
                    idx.iter_mut().zip(first).for_each(|(x, &c)| *x = if c == nc { u64::MAX } else { c as u64 * s0 })
                }
            }
            for k in 1..set.cols.len() {
                let col = cols[set.cols[k]];
                let s = set.strides[k];
                match set.nulls[k] {
                    None => idx.iter_mut().zip(col).for_each(|(x, &c)| *x = x.saturating_add(c as u64 * s)),
                    Some(nc) => idx
                        .iter_mut()
                        .zip(col)
                        .for_each(|(x, &c)| *x = if c == nc { u64::MAX } else { x.saturating_add(c as u64 * s) }),
                }
            }
            if set.nulls.iter().any(Option::is_some) {
                // An unobserved row's index overflowed or became u64::MAX: route it to the overflow slot.
                for &i in idx.iter() {
                    let i = if i >= sentinel { sentinel } else { i };
                    counts[i as usize] += 1;
                }
            } else {
                for &i in idx.iter() {
                    counts[i as usize] += 1;
                }
            }
        }
        self.rows += n as u64;
        Ok(())
    }

    /// Adds another accumulator's counts (same config).
    pub fn merge_counts(&mut self, set: usize, counts: &[u64], observed: u64) -> Result<()> {
        let s = &self.sets[set];
        if counts.len() as u64 != s.cells {
            return Err(DataFusionError::Execution(format!(
                "partial marginal {set} has {} cells, expected {}",
                counts.len(),
                s.cells
            )));
        }
        for (a, b) in self.counts[s.offset..s.offset + counts.len()].iter_mut().zip(counts) {
            *a += b;
        }
        self.sets[set].observed += observed;
        Ok(())
    }

    /// Final counts of all sets in one buffer, without a copy: the overflow
    /// slots are compacted out in place.
    pub fn finish_flat(mut self) -> FinishedCounts {
        let rows = self.rows;
        let mut offsets = Vec::with_capacity(self.sets.len() + 1);
        let mut observed = Vec::with_capacity(self.sets.len());
        let mut end = 0usize;
        offsets.push(0);
        for s in &self.sets {
            let cells = s.cells as usize;
            let unobserved = self.counts[s.offset + cells];
            observed.push(s.observed + rows - unobserved);
            // Moves left (end ≤ offset), so nothing unread is overwritten.
            self.counts.copy_within(s.offset..s.offset + cells, end);
            end += cells;
            offsets.push(end);
        }
        self.counts.truncate(end);
        FinishedCounts { values: self.counts, offsets, observed }
    }

    /// Final counts and observed-row totals, one per set.
    pub fn finish(self) -> Vec<(Vec<u64>, u64)> {
        let f = self.finish_flat();
        f.offsets.windows(2).zip(&f.observed).map(|(w, &o)| (f.values[w[0]..w[1]].to_vec(), o)).collect()
    }
}

/// All sets' final counts, back to back (set `i` is
/// `values[offsets[i]..offsets[i + 1]]`), and each set's observed rows.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedCounts {
    /// The counts.
    pub values: Vec<u64>,
    /// Where each set starts, and the end (sets + 1 entries).
    pub offsets: Vec<usize>,
    /// Observed rows per set.
    pub observed: Vec<u64>,
}
