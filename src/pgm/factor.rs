//! Dense factors over discrete attribute sets (flat row-major vectors with
//! strides; attributes kept sorted so that sub-factor indexing is one pass).
//!
//! Large factors split their cell loops over rayon (issue 19: AIM at width
//! spends its time in a few cliques of millions of cells, one at a time).
//! The split is along one dimension of the table that is *written*, so every
//! output cell is computed by one task, from the same inputs, in the same
//! order as the sequential loop: results are bit-identical on any number of
//! threads (tested against the sequential loops).

use rayon::prelude::*;

/// Cells from which a factor operation splits its loop over rayon (a split
/// costs a few microseconds). Unit tests split every factor, so the
/// brute-force checks of the PGM engine cover the split loops.
const SPLIT_CELLS: usize = if cfg!(test) { 1 } else { 1 << 16 };

/// Row groups of a split reduction that sums out a factor's leading
/// attribute (each group keeps its own partial sums, added in group order).
const SUM_GROUPS: usize = 8;

/// A dense table over a sorted set of attributes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Factor {
    /// Attribute ids, strictly increasing.
    pub attrs: Vec<usize>,
    /// Size of each attribute (same order).
    pub shape: Vec<usize>,
    /// Row-major values (the last attribute varies fastest).
    pub values: Vec<f64>,
}

/// Calls `f(big_index, small_index)` for every cell of a table of `shape`,
/// where the small index advances by `sub_strides[d]` along dimension `d`
/// (0 for dimensions the small table does not have).
#[inline]
pub fn for_each_pair(shape: &[usize], sub_strides: &[usize], mut f: impl FnMut(usize, usize)) {
    // The big table's own row-major strides; the third index is unused.
    let zeros = vec![0usize; shape.len()];
    for_each_triple(shape, &strides(shape), sub_strides, &zeros, |big, small, _| f(big, small));
}

/// Calls `f(a, b, out)` for every cell of a table of `shape`, with three
/// strided indices (each advances by its `*_strides[d]` along dimension `d`;
/// 0 for dimensions that table lacks). Used to contract two factors into a
/// third without materialising their product.
#[inline]
pub fn for_each_triple(
    shape: &[usize],
    a_strides: &[usize],
    b_strides: &[usize],
    o_strides: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    let nd = shape.len();
    if nd == 0 {
        f(0, 0, 0);
        return;
    }
    if shape.contains(&0) {
        return;
    }
    let last = nd - 1;
    let (inner, sa, sb, so) = (shape[last], a_strides[last], b_strides[last], o_strides[last]);
    let mut counter = vec![0usize; nd];
    let (mut a, mut b, mut o) = (0usize, 0usize, 0usize);
    loop {
        let (mut x, mut y, mut z) = (a, b, o);
        for _ in 0..inner {
            f(x, y, z);
            x += sa;
            y += sb;
            z += so;
        }
        let mut d = last;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            counter[d] += 1;
            a += a_strides[d];
            b += b_strides[d];
            o += o_strides[d];
            if counter[d] < shape[d] {
                break;
            }
            a -= a_strides[d] * shape[d];
            b -= b_strides[d] * shape[d];
            o -= o_strides[d] * shape[d];
            counter[d] = 0;
        }
    }
}

/// Calls `f(a, bs)` once per innermost run of a table of `shape` (the
/// `shape[last]` cells that differ only in the last coordinate): `a` is the
/// run's first index by `a_strides`, and `bs[r]` its first index by
/// `b_strides[r]` (0 along dimensions that table lacks).
fn for_each_run(shape: &[usize], a_strides: &[usize], b_strides: &[Vec<usize>], mut f: impl FnMut(usize, &[usize])) {
    let mut bs = vec![0usize; b_strides.len()];
    if shape.contains(&0) {
        return;
    }
    if shape.len() <= 1 {
        f(0, &bs);
        return;
    }
    let outer = shape.len() - 1;
    let mut counter = vec![0usize; outer];
    let mut a = 0usize;
    loop {
        f(a, &bs);
        let mut d = outer;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            counter[d] += 1;
            a += a_strides[d];
            bs.iter_mut().zip(b_strides).for_each(|(b, s)| *b += s[d]);
            if counter[d] < shape[d] {
                break;
            }
            a -= a_strides[d] * shape[d];
            bs.iter_mut().zip(b_strides).for_each(|(b, s)| *b -= s[d] * shape[d]);
            counter[d] = 0;
        }
    }
}

/// The parallel form of [`for_each_pair`] for a loop that writes cells of a
/// table whose leading dimension is dimension `p` of `shape`: `out` is split
/// into `shape[p]` blocks of `block` cells, and `f(block, a, b)` gets the
/// k-th block with the indices `a` (by `a_strides`, absolute) and `b` (by
/// `b_strides`, relative to the block: `b_strides[p]` is the block length)
/// of every cell whose coordinate p is k, in row-major order.
fn split_pairs(
    shape: &[usize],
    p: usize,
    a_strides: &[usize],
    b_strides: &[usize],
    out: &mut [f64],
    f: impl Fn(&mut [f64], usize, usize) + Sync + Send,
) {
    let mut sub = shape.to_vec();
    sub[p] = 1;
    let zeros = vec![0usize; shape.len()];
    let block = out.len() / shape[p].max(1);
    out.par_chunks_mut(block.max(1)).enumerate().for_each(|(k, o)| {
        let base = k * a_strides[p];
        for_each_triple(&sub, a_strides, b_strides, &zeros, |a, b, _| f(o, base + a, b));
    });
}

/// `m += ln(sum)` where the max `m` is finite (the last step of log-sum-exp).
fn finish_logsumexp(max: &mut [f64], sum: &[f64]) {
    for (m, s) in max.iter_mut().zip(sum) {
        if *m > f64::NEG_INFINITY {
            *m += s.ln();
        }
    }
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

impl Factor {
    /// A factor filled with `value`.
    pub fn filled(attrs: Vec<usize>, shape: Vec<usize>, value: f64) -> Self {
        debug_assert!(attrs.windows(2).all(|w| w[0] < w[1]), "attributes must be sorted");
        let n = shape.iter().product();
        Self { attrs, shape, values: vec![value; n] }
    }

    /// Zeros over `attrs` with sizes looked up in `sizes`.
    pub fn zeros(attrs: &[usize], sizes: &[usize]) -> Self {
        Self::filled(attrs.to_vec(), attrs.iter().map(|&a| sizes[a]).collect(), 0.0)
    }

    /// Number of cells.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the factor has no cells.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// For each of this factor's dimensions, the stride of that attribute in
    /// `sub` (0 if `sub` lacks it). `sub.attrs` must be a subset of `self.attrs`.
    pub fn sub_strides(&self, sub_attrs: &[usize], sub_shape: &[usize]) -> Vec<usize> {
        let st = strides(sub_shape);
        self.attrs
            .iter()
            .map(|a| match sub_attrs.iter().position(|b| b == a) {
                Some(k) => st[k],
                None => 0,
            })
            .collect()
    }

    fn sub_shape(&self, keep: &[usize]) -> Vec<usize> {
        keep.iter()
            .map(|a| {
                let k = self.attrs.iter().position(|b| b == a).expect("attribute of the factor");
                self.shape[k]
            })
            .collect()
    }

    /// Sums out every attribute not in `keep` (sorted subset of `attrs`).
    pub fn sum_to(&self, keep: &[usize]) -> Factor {
        let shape = self.sub_shape(keep);
        let mut out = Factor::filled(keep.to_vec(), shape, 0.0);
        if keep.len() == self.attrs.len() {
            out.values.copy_from_slice(&self.values);
            return out;
        }
        let ss = self.sub_strides(keep, &out.shape);
        let v = &self.values;
        if let Some(p) = self.split_on(keep) {
            // Each block of the output (one value of its first attribute)
            // sums its own cells in row-major order, as the loop below does.
            split_pairs(&self.shape, p, &strides(&self.shape), &ss, &mut out.values, |o, i, j| o[j] += v[i]);
            return out;
        }
        let o = &mut out.values;
        for_each_pair(&self.shape, &ss, |i, j| o[j] += v[i]);
        out
    }

    /// The dimension a reduction onto `keep` splits on: that of `keep`'s
    /// first attribute (the output's leading dimension), when the factor is
    /// large and `keep` is neither empty nor everything.
    fn split_on(&self, keep: &[usize]) -> Option<usize> {
        if self.values.len() < SPLIT_CELLS || keep.is_empty() || keep.len() == self.attrs.len() {
            return None;
        }
        let p = self.attrs.iter().position(|a| *a == keep[0])?;
        (self.shape[p] > 1).then_some(p)
    }

    /// The largest value of each slice of cells that agree on `keep` (−∞ for
    /// an empty or all −∞ slice), split over the output's leading dimension
    /// when large (each output cell read in the sequential order).
    fn slice_max(&self, keep: &[usize], ss: &[usize]) -> Factor {
        let mut max = Factor::filled(keep.to_vec(), self.sub_shape(keep), f64::NEG_INFINITY);
        let v = &self.values;
        if let Some(p) = self.split_on(keep) {
            split_pairs(&self.shape, p, &strides(&self.shape), ss, &mut max.values, |m, i, j| {
                if v[i] > m[j] {
                    m[j] = v[i]
                }
            });
        } else {
            let m = &mut max.values;
            for_each_pair(&self.shape, ss, |i, j| {
                if v[i] > m[j] {
                    m[j] = v[i]
                }
            });
        }
        max
    }

    /// Log-sum-exp over every attribute not in `keep` (values are logs).
    pub fn logsumexp_to(&self, keep: &[usize]) -> Factor {
        if keep.len() == self.attrs.len() {
            return Factor { attrs: keep.to_vec(), shape: self.sub_shape(keep), values: self.values.clone() };
        }
        let ss = self.sub_strides(keep, &self.sub_shape(keep));
        let mut max = self.slice_max(keep, &ss);
        let v = &self.values;
        if let Some(p) = self.split_on(keep) {
            // Per block of the output, the same pass as below.
            let st = strides(&self.shape);
            let mut sub = self.shape.clone();
            sub[p] = 1;
            let zeros = vec![0usize; sub.len()];
            let block = max.values.len() / self.shape[p];
            max.values.par_chunks_mut(block).enumerate().for_each(|(k, m)| {
                let base = k * st[p];
                let mut sum = vec![0.0; m.len()];
                for_each_triple(&sub, &st, &ss, &zeros, |i, j, _| {
                    if m[j] > f64::NEG_INFINITY {
                        sum[j] += (v[base + i] - m[j]).exp();
                    }
                });
                finish_logsumexp(m, &sum);
            });
            return max;
        }
        let mut sum = vec![0.0; max.values.len()];
        {
            let m = &max.values;
            for_each_pair(&self.shape, &ss, |i, j| {
                if m[j] > f64::NEG_INFINITY {
                    sum[j] += (v[i] - m[j]).exp();
                }
            });
        }
        finish_logsumexp(&mut max.values, &sum);
        max
    }

    /// Turns this factor of logs into the exponentials of each value relative
    /// to the largest value of its slice (the cells that agree on `keep`), in
    /// place, and returns the log-sum-exp onto `keep` together with the sums
    /// s_j of those exponentials: afterwards `self[i] / s[j]` is the
    /// conditional distribution given the slice j, with one `exp` per cell.
    /// Slices that are all −∞ become zeros, with s_j = 0 and a −∞ message.
    /// Large factors split their passes over rayon in blocks fixed by the
    /// shape (never by the thread count), so the bits do not depend on the
    /// threads.
    pub fn exp_slices_to(&mut self, keep: &[usize]) -> (Factor, Vec<f64>) {
        let ss = self.sub_strides(keep, &self.sub_shape(keep));
        let st = strides(&self.shape);
        let mut max = self.slice_max(keep, &ss);
        // Exponentials in place, summed per slice.
        let m = &max.values;
        let exp_cell = |x: &mut f64, mj: f64| -> f64 {
            *x = if mj > f64::NEG_INFINITY { (*x - mj).exp() } else { 0.0 };
            *x
        };
        let big = self.values.len() >= SPLIT_CELLS && self.shape.first().is_some_and(|&n| n > 1);
        let mut sum = vec![0.0; m.len()];
        if big {
            let mut sub = self.shape.clone();
            sub[0] = 1;
            let zeros = vec![0usize; sub.len()];
            if keep.first() == self.attrs.first() {
                // The leading attribute is kept: block k of the table sums
                // into block k of the slices, and nothing else does.
                let block = sum.len() / self.shape[0];
                self.values.par_chunks_mut(st[0]).zip(sum.par_chunks_mut(block)).enumerate().for_each(|(k, (v, s))| {
                    let base = k * block;
                    for_each_triple(&sub, &st, &ss, &zeros, |i, j, _| s[j] += exp_cell(&mut v[i], m[base + j]));
                });
            } else {
                // The leading attribute is summed out: a fixed number of
                // row groups sum into their own partial sums, added in order.
                let groups = self.shape[0].min(SUM_GROUPS);
                let rows_per = self.shape[0].div_ceil(groups);
                let partials: Vec<Vec<f64>> = self
                    .values
                    .par_chunks_mut(st[0] * rows_per)
                    .map(|v| {
                        let mut s = vec![0.0; m.len()];
                        let mut rows = sub.clone();
                        rows[0] = v.len() / st[0];
                        for_each_triple(&rows, &st, &ss, &zeros, |i, j, _| s[j] += exp_cell(&mut v[i], m[j]));
                        s
                    })
                    .collect();
                for part in partials {
                    sum.iter_mut().zip(part).for_each(|(a, b)| *a += b);
                }
            }
        } else {
            let v = &mut self.values;
            for_each_pair(&self.shape, &ss, |i, j| sum[j] += exp_cell(&mut v[i], m[j]));
        }
        finish_logsumexp(&mut max.values, &sum);
        (max, sum)
    }

    /// The sums of this factor onto each of `keeps` (sorted subsets of its
    /// attributes) in one pass over its cells, where [`Factor::sum_to`] would
    /// take one pass per set. Large factors split the pass into row groups
    /// of the leading attribute (fixed by the shape, not by the threads),
    /// whose partial sums are added in group order.
    pub fn sums_to(&self, keeps: &[&[usize]]) -> Vec<Factor> {
        let mut outs: Vec<Factor> = keeps.iter().map(|k| Factor::filled(k.to_vec(), self.sub_shape(k), 0.0)).collect();
        if self.attrs.is_empty() || self.values.is_empty() {
            outs.iter_mut().for_each(|o| o.values.iter_mut().for_each(|x| *x = self.values.iter().sum()));
            return outs;
        }
        let subs: Vec<Vec<usize>> = outs.iter().map(|o| self.sub_strides(&o.attrs, &o.shape)).collect();
        let st = strides(&self.shape);
        let last = self.shape.len() - 1;
        // Adds the cells of rows `rows` (of the leading attribute) into `acc`.
        let pass = |v: &[f64], rows: usize, acc: &mut [Vec<f64>]| {
            let mut shape = self.shape.clone();
            shape[0] = rows;
            let inner = shape[last];
            for_each_run(&shape, &st, &subs, |a, bs| {
                let run = &v[a..a + inner];
                for ((out, s), &b) in acc.iter_mut().zip(&subs).zip(bs) {
                    let step = s[last];
                    if step == 0 {
                        out[b] += run.iter().sum::<f64>();
                    } else {
                        run.iter().enumerate().for_each(|(t, x)| out[b + t * step] += x);
                    }
                }
            });
        };
        let groups = self.shape[0].min(SUM_GROUPS);
        if self.values.len() >= SPLIT_CELLS && groups > 1 {
            let rows_per = self.shape[0].div_ceil(groups);
            let partials: Vec<Vec<Vec<f64>>> = self
                .values
                .par_chunks(st[0] * rows_per)
                .map(|v| {
                    let mut acc: Vec<Vec<f64>> = outs.iter().map(|o| vec![0.0; o.len()]).collect();
                    pass(v, v.len() / st[0], &mut acc);
                    acc
                })
                .collect();
            // Each group's indices started at its own row 0: shift by the
            // group's first row along outputs that keep the leading attribute.
            for (g, part) in partials.into_iter().enumerate() {
                for ((o, s), p) in outs.iter_mut().zip(&subs).zip(part) {
                    let shift = g * rows_per * s[0];
                    let n = p.len() - shift;
                    o.values[shift..].iter_mut().zip(&p[..n]).for_each(|(a, b)| *a += b);
                }
            }
        } else {
            let mut acc: Vec<Vec<f64>> = outs.iter().map(|o| vec![0.0; o.len()]).collect();
            pass(&self.values, self.shape[0], &mut acc);
            outs.iter_mut().zip(acc).for_each(|(o, a)| o.values = a);
        }
        outs
    }

    /// Sets this factor to `base` (or zeros) plus Σ_r c_r · `terms[r]`, each
    /// term broadcast over the attributes it lacks (a subset of this
    /// factor's), in one pass over the cells. Large factors split the pass
    /// over the leading attribute; every cell is computed by one task in the
    /// same order, so the bits do not depend on the threads.
    pub fn set_broadcast_sum(&mut self, base: Option<&Factor>, terms: &[(&Factor, f64)]) {
        if let Some(b) = base {
            debug_assert_eq!(b.attrs, self.attrs);
        }
        if self.attrs.is_empty() {
            let v = base.map_or(0.0, |b| b.values[0]) + terms.iter().map(|(t, c)| c * t.values[0]).sum::<f64>();
            self.values.iter_mut().for_each(|x| *x = v);
            return;
        }
        let subs: Vec<Vec<usize>> = terms.iter().map(|(t, _)| self.sub_strides(&t.attrs, &t.shape)).collect();
        let st = strides(&self.shape);
        let last = self.shape.len() - 1;
        // Fills the block of rows starting at `row0` (its cells in `out`).
        let fill = |out: &mut [f64], row0: usize| {
            let mut shape = self.shape.clone();
            shape[0] = out.len() / st[0];
            let inner = shape[last];
            let offset = row0 * st[0];
            let starts: Vec<usize> = subs.iter().map(|s| row0 * s[0]).collect();
            for_each_run(&shape, &st, &subs, |a, bs| {
                let run = &mut out[a..a + inner];
                match base {
                    Some(b) => run.copy_from_slice(&b.values[offset + a..offset + a + inner]),
                    None => run.iter_mut().for_each(|x| *x = 0.0),
                }
                for (((term, c), s), (&b, &start)) in terms.iter().zip(&subs).zip(bs.iter().zip(&starts)) {
                    let step = s[last];
                    let g = &term.values;
                    if step == 0 {
                        let add = c * g[start + b];
                        run.iter_mut().for_each(|x| *x += add);
                    } else {
                        run.iter_mut().enumerate().for_each(|(t, x)| *x += c * g[start + b + t * step]);
                    }
                }
            });
        };
        if self.values.len() >= SPLIT_CELLS && self.shape[0] > 1 {
            self.values.par_chunks_mut(st[0]).enumerate().for_each(|(k, out)| fill(out, k));
        } else {
            let values = &mut self.values;
            fill(values, 0);
        }
    }

    /// `self[i] = op(self[i], other[j])` for every cell, `other` broadcast
    /// (over a subset of the attributes); split over the leading dimension
    /// when large.
    fn broadcast_assign(&mut self, other: &Factor, op: impl Fn(f64, f64) -> f64 + Sync + Send) {
        let big = self.values.len() >= SPLIT_CELLS;
        if other.attrs == self.attrs {
            if big {
                self.values.par_iter_mut().zip(other.values.par_iter()).for_each(|(a, &b)| *a = op(*a, b));
            } else {
                self.values.iter_mut().zip(&other.values).for_each(|(a, &b)| *a = op(*a, b));
            }
            return;
        }
        let ss = self.sub_strides(&other.attrs, &other.shape);
        let o = &other.values;
        if big && self.shape.first().is_some_and(|&n| n > 1) {
            // Split on this factor's leading dimension: block k holds its cells with coordinate 0 = k.
            let st = strides(&self.shape);
            let mut sub = self.shape.clone();
            sub[0] = 1;
            let zeros = vec![0usize; sub.len()];
            self.values.par_chunks_mut(st[0]).enumerate().for_each(|(k, v)| {
                let base = k * ss[0];
                for_each_triple(&sub, &st, &ss, &zeros, |i, j, _| v[i] = op(v[i], o[base + j]));
            });
            return;
        }
        let v = &mut self.values;
        for_each_pair(&self.shape, &ss, |i, j| v[i] = op(v[i], o[j]));
    }

    /// Adds `other` (over a subset of attributes) broadcast into this factor.
    pub fn add_assign_sub(&mut self, other: &Factor) {
        self.broadcast_assign(other, |a, b| a + b);
    }

    /// Subtracts `other` (over a subset of attributes) broadcast from this factor.
    pub fn sub_assign_sub(&mut self, other: &Factor) {
        self.broadcast_assign(other, |a, b| a - b);
    }

    /// Multiplies by `other` (over a subset of attributes), broadcast.
    pub fn mul_assign_sub(&mut self, other: &Factor) {
        self.broadcast_assign(other, |a, b| a * b);
    }

    /// Divides by `other` (over a subset of attributes), broadcast; 0/0 = 0.
    pub fn div_assign_sub(&mut self, other: &Factor) {
        self.broadcast_assign(other, |a, b| if b == 0.0 { 0.0 } else { a / b });
    }

    /// This factor broadcast onto `attrs` ⊇ its attributes (sizes from `sizes`).
    pub fn expand(&self, attrs: &[usize], sizes: &[usize]) -> Factor {
        let mut out = Factor::zeros(attrs, sizes);
        out.add_assign_sub(self);
        out
    }

    /// The product with `other`, over the union of attributes.
    pub fn product(&self, other: &Factor, sizes: &[usize]) -> Factor {
        let mut union: Vec<usize> = self.attrs.iter().chain(&other.attrs).copied().collect();
        union.sort_unstable();
        union.dedup();
        let mut out = self.expand(&union, sizes);
        out.mul_assign_sub(other);
        out
    }

    /// Σ over the attributes not in `keep` of `self · other`, without
    /// materialising the product: memory is the output's size, however large
    /// the union of the two factors is. `keep` (sorted) must be a subset of
    /// the union.
    pub fn product_sum_to(&self, other: &Factor, keep: &[usize], sizes: &[usize]) -> Factor {
        let mut union: Vec<usize> = self.attrs.iter().chain(&other.attrs).copied().collect();
        union.sort_unstable();
        union.dedup();
        let shape: Vec<usize> = union.iter().map(|&a| sizes[a]).collect();
        let on = |attrs: &[usize], sh: &[usize]| -> Vec<usize> {
            let st = strides(sh);
            union.iter().map(|a| attrs.iter().position(|b| b == a).map_or(0, |k| st[k])).collect()
        };
        let mut out = Factor::zeros(keep, sizes);
        let (sa, sb, so) = (on(&self.attrs, &self.shape), on(&other.attrs, &other.shape), on(keep, &out.shape));
        let (x, y, o) = (&self.values, &other.values, &mut out.values);
        for_each_triple(&shape, &sa, &sb, &so, |i, j, k| o[k] += x[i] * y[j]);
        out
    }

    /// log Σ exp(values).
    pub fn logsumexp(&self) -> f64 {
        let m = self.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return m;
        }
        m + self.values.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    }

    /// Total of the values.
    pub fn sum(&self) -> f64 {
        self.values.iter().sum()
    }

    /// Transposes values given in `order` (any permutation of `attrs`) into
    /// this factor's sorted layout.
    pub fn from_unsorted(order: &[usize], sizes_in_order: &[usize], values: &[f64]) -> Factor {
        let mut perm: Vec<usize> = (0..order.len()).collect();
        perm.sort_by_key(|&k| order[k]);
        let attrs: Vec<usize> = perm.iter().map(|&k| order[k]).collect();
        let shape: Vec<usize> = perm.iter().map(|&k| sizes_in_order[k]).collect();
        let src_strides = strides(sizes_in_order);
        // Stride in the source for each sorted dimension.
        let ss: Vec<usize> = perm.iter().map(|&k| src_strides[k]).collect();
        let mut out = Factor::filled(attrs, shape.clone(), 0.0);
        let o = &mut out.values;
        for_each_pair(&shape, &ss, |i, j| o[i] = values[j]);
        out
    }

    /// The values laid out in attribute order `order` (inverse of [`Factor::from_unsorted`]).
    pub fn to_order(&self, order: &[usize]) -> Vec<f64> {
        let sizes: Vec<usize> =
            order.iter().map(|a| self.shape[self.attrs.iter().position(|b| b == a).expect("attribute")]).collect();
        let dst = strides(&sizes);
        let ss: Vec<usize> = self.attrs.iter().map(|a| dst[order.iter().position(|b| b == a).unwrap()]).collect();
        let mut out = vec![0.0; self.values.len()];
        for_each_pair(&self.shape, &ss, |i, j| out[j] = self.values[i]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(attrs: &[usize], shape: &[usize]) -> Factor {
        let n: usize = shape.iter().product();
        Factor { attrs: attrs.to_vec(), shape: shape.to_vec(), values: (0..n).map(|x| x as f64).collect() }
    }

    #[test]
    fn product_sum_to_equals_product_then_sum() {
        let sizes = [2, 3, 4, 2];
        let a = Factor { values: (0..24).map(|x| x as f64 * 0.5 + 1.0).collect(), ..Factor::zeros(&[0, 1, 2], &sizes) };
        let b = Factor { values: (0..24).map(|x| (x % 5) as f64 - 1.5).collect(), ..Factor::zeros(&[1, 2, 3], &sizes) };
        for keep in [vec![], vec![0], vec![3], vec![0, 3], vec![1, 3], vec![0, 1, 2, 3], vec![2]] {
            let fused = a.product_sum_to(&b, &keep, &sizes);
            let direct = a.product(&b, &sizes).sum_to(&keep);
            assert_eq!(fused.attrs, direct.attrs);
            for (x, y) in fused.values.iter().zip(&direct.values) {
                assert!((x - y).abs() < 1e-9, "keep {keep:?}: {x} vs {y}");
            }
        }
    }

    /// Values with no pattern (so that a change of summation order would
    /// show in the last bits), some −∞ for the log-space loops.
    fn scrambled(attrs: &[usize], shape: &[usize], neg_inf: bool) -> Factor {
        let n: usize = shape.iter().product();
        let values = (0..n)
            .map(|i| {
                let x = ((i as f64 + 0.5) * 0.618_033_988_749_895).fract() * 7.0 - 3.0;
                if neg_inf && i % 11 == 3 { f64::NEG_INFINITY } else { x }
            })
            .collect();
        Factor { attrs: attrs.to_vec(), shape: shape.to_vec(), values }
    }

    fn bits(f: &Factor) -> Vec<u64> {
        f.values.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn split_loops_give_the_bits_of_the_sequential_loops() {
        // Unit tests split every factor (SPLIT_CELLS = 1): compare with the
        // one-thread loops written out here.
        let shape = [3, 1, 5, 4, 2];
        let attrs = [0, 2, 3, 5, 7];
        let x = scrambled(&attrs, &shape, false);
        let lx = scrambled(&attrs, &shape, true);
        let subsets: Vec<Vec<usize>> = (0u32..32)
            .map(|m| attrs.iter().enumerate().filter(|(k, _)| m >> k & 1 == 1).map(|(_, &a)| a).collect())
            .collect();
        for keep in &subsets {
            let sh: Vec<usize> = keep.iter().map(|a| shape[attrs.iter().position(|b| b == a).unwrap()]).collect();
            let ss = x.sub_strides(keep, &sh);
            let mut want = Factor::filled(keep.clone(), sh.clone(), 0.0);
            for_each_pair(&shape, &ss, |i, j| want.values[j] += x.values[i]);
            assert_eq!(bits(&x.sum_to(keep)), bits(&want), "sum_to {keep:?}");

            let mut m = vec![f64::NEG_INFINITY; want.len()];
            for_each_pair(&shape, &ss, |i, j| m[j] = m[j].max(lx.values[i]));
            let mut s = vec![0.0; m.len()];
            for_each_pair(&shape, &ss, |i, j| {
                if m[j] > f64::NEG_INFINITY {
                    s[j] += (lx.values[i] - m[j]).exp()
                }
            });
            finish_logsumexp(&mut m, &s);
            let got = lx.logsumexp_to(keep);
            assert_eq!(
                got.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                m.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "logsumexp_to {keep:?}"
            );

            let small = scrambled(keep, &sh, false);
            type Op = fn(&mut Factor, &Factor);
            type Scalar = fn(f64, f64) -> f64;
            let ops: [(Op, Scalar); 4] = [
                (Factor::add_assign_sub, |a, b| a + b),
                (Factor::sub_assign_sub, |a, b| a - b),
                (Factor::mul_assign_sub, |a, b| a * b),
                (Factor::div_assign_sub, |a, b| if b == 0.0 { 0.0 } else { a / b }),
            ];
            for (k, (op, scalar)) in ops.iter().enumerate() {
                let mut got = x.clone();
                op(&mut got, &small);
                let mut want = x.clone();
                for_each_pair(&shape, &ss, |i, j| want.values[i] = scalar(want.values[i], small.values[j]));
                assert_eq!(bits(&got), bits(&want), "op {k} with {keep:?}");
            }
        }
    }

    fn close(a: &[f64], b: &[f64], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            assert!(x == y || (x - y).abs() <= 1e-12 * (1.0 + x.abs().max(y.abs())), "{what}: {x} vs {y}");
        }
    }

    /// Every subset of the attributes of a 5-way factor (with a size-1
    /// dimension), as in the test above.
    fn subsets(attrs: &[usize], shape: &[usize]) -> Vec<(Vec<usize>, Vec<usize>)> {
        (0u32..1 << attrs.len())
            .map(|m| {
                let keep: Vec<usize> = (0..attrs.len()).filter(|k| m >> k & 1 == 1).collect();
                (keep.iter().map(|&k| attrs[k]).collect(), keep.iter().map(|&k| shape[k]).collect())
            })
            .collect()
    }

    /// Leading sizes 3 and 9 (fewer and more rows than SUM_GROUPS), and a
    /// one-attribute factor.
    fn one_pass_shapes() -> [(Vec<usize>, Vec<usize>); 3] {
        [(vec![0, 2, 3, 5, 7], vec![3, 1, 5, 4, 2]), (vec![1, 4, 6], vec![9, 2, 3]), (vec![3], vec![11])]
    }

    #[test]
    fn one_pass_sums_equal_one_sum_per_set() {
        for (attrs, shape) in one_pass_shapes() {
            let x = scrambled(&attrs, &shape, false);
            let sets = subsets(&attrs, &shape);
            let keeps: Vec<&[usize]> = sets.iter().map(|(k, _)| k.as_slice()).collect();
            let sums = x.sums_to(&keeps);
            for (keep, got) in keeps.iter().zip(&sums) {
                let want = x.sum_to(keep);
                assert_eq!(got.attrs, want.attrs);
                assert_eq!(got.shape, want.shape);
                close(&got.values, &want.values, &format!("sums_to {keep:?} of {attrs:?}"));
            }
        }
    }

    #[test]
    fn one_pass_broadcast_sum_equals_adds_one_at_a_time() {
        for (attrs, shape) in one_pass_shapes() {
            let base = scrambled(&attrs, &shape, false);
            let sets = subsets(&attrs, &shape);
            let terms: Vec<Factor> = sets.iter().map(|(k, sh)| scrambled(k, sh, false)).collect();
            let coefs: Vec<f64> = (0..terms.len()).map(|r| r as f64 * 0.37 - 2.0).collect();
            let pairs: Vec<(&Factor, f64)> = terms.iter().zip(&coefs).map(|(t, &c)| (t, c)).collect();
            for with_base in [false, true] {
                // Starts from garbage: every cell must be written.
                let mut got = Factor { values: vec![f64::NAN; base.len()], ..base.clone() };
                got.set_broadcast_sum(with_base.then_some(&base), &pairs);
                let mut want = if with_base { base.clone() } else { Factor::filled(attrs.clone(), shape.clone(), 0.0) };
                for (t, c) in &pairs {
                    let scaled = Factor { values: t.values.iter().map(|v| v * c).collect(), ..(*t).clone() };
                    want.add_assign_sub(&scaled);
                }
                close(&got.values, &want.values, &format!("set_broadcast_sum of {attrs:?}, base {with_base}"));
            }
        }
    }

    #[test]
    fn slice_exponentials_are_the_conditionals_and_their_log_sums() {
        let attrs = [0, 2, 3, 5, 7];
        let shape = [3, 1, 5, 4, 2];
        let mut lx = scrambled(&attrs, &shape, true);
        // Slices that are all −∞ onto any set holding attributes 0 and 5:
        // the cells whose coordinates 0 and 3 are (2, 0).
        let st = strides(&shape);
        for (i, v) in lx.values.iter_mut().enumerate() {
            if i / st[0] == 2 && (i / st[3]).is_multiple_of(shape[3]) {
                *v = f64::NEG_INFINITY;
            }
        }
        for (keep, sh) in subsets(&attrs, &shape) {
            let want_msg = lx.logsumexp_to(&keep);
            let mut e = lx.clone();
            let (msg, sums) = e.exp_slices_to(&keep);
            close(&msg.values, &want_msg.values, &format!("message onto {keep:?}"));
            assert_eq!(sums.len(), want_msg.len());
            // e / s is the conditional exp(v − lse) of each cell given its slice.
            let ss = lx.sub_strides(&keep, &sh);
            for_each_pair(&shape, &ss, |i, j| {
                let want = if want_msg.values[j] == f64::NEG_INFINITY {
                    0.0
                } else {
                    (lx.values[i] - want_msg.values[j]).exp()
                };
                let got = if sums[j] > 0.0 { e.values[i] / sums[j] } else { e.values[i] };
                assert!((got - want).abs() <= 1e-12, "conditional onto {keep:?} at {i}: {got} vs {want}");
            });
        }
    }

    #[test]
    fn sum_to_matches_manual() {
        let x = f(&[0, 1, 2], &[2, 3, 4]);
        let s = x.sum_to(&[1]);
        // Σ over i, k of (i*12 + j*4 + k)
        let want: Vec<f64> =
            (0..3).map(|j| (0..2).flat_map(|i| (0..4).map(move |k| (i * 12 + j * 4 + k) as f64)).sum()).collect();
        assert_eq!(s.values, want);
        let s = x.sum_to(&[0, 2]);
        assert_eq!(s.shape, vec![2, 4]);
        assert_eq!(s.values[4 + 3], (0..3).map(|j| (12 + j * 4 + 3) as f64).sum::<f64>());
        assert_eq!(x.sum_to(&[]).values, vec![(0..24).sum::<usize>() as f64]);
    }

    #[test]
    fn logsumexp_to_is_stable() {
        let mut x = f(&[3, 5], &[2, 2]);
        x.values = vec![1000.0, 1000.0, -1e300, f64::NEG_INFINITY];
        let l = x.logsumexp_to(&[3]);
        assert!((l.values[0] - (1000.0 + 2f64.ln())).abs() < 1e-12);
        assert_eq!(l.values[1], -1e300);
    }

    #[test]
    fn broadcast_and_transpose_round_trip() {
        let mut x = Factor::filled(vec![0, 1, 2], vec![2, 3, 2], 0.0);
        let y = f(&[0, 2], &[2, 2]);
        x.add_assign_sub(&y);
        assert_eq!(x.sum_to(&[0, 2]).values, y.values.iter().map(|v| v * 3.0).collect::<Vec<_>>());
        let vals: Vec<f64> = (0..6).map(|v| v as f64).collect();
        // Given in order (2, 0) with sizes (3, 2).
        let t = Factor::from_unsorted(&[2, 0], &[3, 2], &vals);
        assert_eq!(t.attrs, vec![0, 2]);
        // t[a0, a2] = vals[a2*2 + a0]
        assert_eq!(t.values, vec![0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
        assert_eq!(t.to_order(&[2, 0]), vals);
    }
}
