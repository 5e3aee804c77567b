//! Dense factors over discrete attribute sets (flat row-major vectors with
//! strides; attributes kept sorted so that sub-factor indexing is one pass).

/// A dense table over a sorted set of attributes.
#[derive(Debug, Clone, PartialEq)]
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
        let o = &mut out.values;
        for_each_pair(&self.shape, &ss, |i, j| o[j] += v[i]);
        out
    }

    /// Log-sum-exp over every attribute not in `keep` (values are logs).
    pub fn logsumexp_to(&self, keep: &[usize]) -> Factor {
        let shape = self.sub_shape(keep);
        let mut max = Factor::filled(keep.to_vec(), shape, f64::NEG_INFINITY);
        if keep.len() == self.attrs.len() {
            max.values.copy_from_slice(&self.values);
            return max;
        }
        let ss = self.sub_strides(keep, &max.shape);
        let v = &self.values;
        {
            let m = &mut max.values;
            for_each_pair(&self.shape, &ss, |i, j| {
                if v[i] > m[j] {
                    m[j] = v[i]
                }
            });
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
        for (m, s) in max.values.iter_mut().zip(sum) {
            if *m > f64::NEG_INFINITY {
                *m += s.ln();
            }
        }
        max
    }

    /// Adds `other` (over a subset of attributes) broadcast into this factor.
    pub fn add_assign_sub(&mut self, other: &Factor) {
        if other.attrs == self.attrs {
            for (a, b) in self.values.iter_mut().zip(&other.values) {
                *a += b;
            }
            return;
        }
        let ss = self.sub_strides(&other.attrs, &other.shape);
        let v = &mut self.values;
        let o = &other.values;
        for_each_pair(&self.shape, &ss, |i, j| v[i] += o[j]);
    }

    /// Subtracts `other` (over a subset of attributes) broadcast from this factor.
    pub fn sub_assign_sub(&mut self, other: &Factor) {
        let ss = self.sub_strides(&other.attrs, &other.shape);
        let v = &mut self.values;
        let o = &other.values;
        for_each_pair(&self.shape, &ss, |i, j| v[i] -= o[j]);
    }

    /// Multiplies by `other` (over a subset of attributes), broadcast.
    pub fn mul_assign_sub(&mut self, other: &Factor) {
        let ss = self.sub_strides(&other.attrs, &other.shape);
        let v = &mut self.values;
        let o = &other.values;
        for_each_pair(&self.shape, &ss, |i, j| v[i] *= o[j]);
    }

    /// Divides by `other` (over a subset of attributes), broadcast; 0/0 = 0.
    pub fn div_assign_sub(&mut self, other: &Factor) {
        let ss = self.sub_strides(&other.attrs, &other.shape);
        let v = &mut self.values;
        let o = &other.values;
        for_each_pair(&self.shape, &ss, |i, j| v[i] = if o[j] == 0.0 { 0.0 } else { v[i] / o[j] });
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
