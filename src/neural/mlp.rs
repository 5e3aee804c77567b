//! Multi-layer perceptrons on `ndarray` with explicit per-example gradients.
//!
//! DP-SGD needs each example's gradient separately, to clip it before the
//! sum (Abadi et al. 2016, Alg 1). For a dense layer y = a·W + b the gradient
//! of example i is the outer product a_iᵀ δ_i for W and δ_i for b, where
//! δ_i = ∂ℓ_i/∂y_i comes from one ordinary batched backward pass
//! (Goodfellow 2015, *Efficient per-example gradient computations*). So a
//! backward pass keeps, per layer, the layer inputs a and the deltas δ
//! (batch × width each), and per-example gradients are formed from them in
//! chunks, never as batch-many copies of the model.
//!
//! Layout of a flat parameter vector: layer by layer, W row-major
//! (inputs × outputs) then b. Hidden layers use one activation; the last
//! layer is linear (its outputs are logits or raw values for the caller's
//! loss).

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, s};
use rand::Rng;
use serde::{Deserialize, Serialize};

pub use dpflow_udfs::neural::{Activation, Dense};

/// A perceptron: dense layers, one activation between them, a linear output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mlp {
    /// The layers, input first.
    pub layers: Vec<Dense>,
    /// The activation after every layer but the last.
    pub hidden: Activation,
}

/// What a forward pass keeps for the backward pass.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The input of each layer (batch × layer inputs).
    pub inputs: Vec<Array2<f64>>,
    /// The pre-activation output of each layer (batch × layer outputs).
    pub pre: Vec<Array2<f64>>,
}

impl Trace {
    /// The network's output (the last layer is linear).
    pub fn output(&self) -> &Array2<f64> {
        self.pre.last().expect("a network has a layer")
    }
}

/// What a backward pass gives: per-layer deltas and the input gradient.
#[derive(Debug, Clone)]
pub struct Backward {
    /// ∂ℓ_i/∂(pre-activation) per layer (batch × layer outputs).
    pub deltas: Vec<Array2<f64>>,
    /// ∂ℓ_i/∂(input) (batch × network inputs), for chaining networks
    /// (a generator trained through a discriminator).
    pub d_input: Array2<f64>,
}

impl Mlp {
    /// A network with the given layer widths (input, hidden…, output) and
    /// Glorot-uniform weights, zero biases. The initial weights are drawn from
    /// `rng` and depend on no data.
    pub fn new<R: Rng + ?Sized>(widths: &[usize], hidden: Activation, rng: &mut R) -> Self {
        assert!(widths.len() >= 2 && widths.iter().all(|&w| w > 0), "an MLP needs ≥ 2 positive widths");
        let layers = widths
            .windows(2)
            .map(|io| {
                let limit = (6.0 / (io[0] + io[1]) as f64).sqrt();
                let w = Array2::from_shape_fn((io[0], io[1]), |_| (2.0 * unit(rng) - 1.0) * limit);
                Dense { w, b: Array1::zeros(io[1]) }
            })
            .collect();
        Self { layers, hidden }
    }

    /// Number of inputs.
    pub fn input_dim(&self) -> usize {
        self.layers[0].w.nrows()
    }

    /// Number of outputs.
    pub fn output_dim(&self) -> usize {
        self.layers.last().expect("a network has a layer").w.ncols()
    }

    /// Number of parameters.
    pub fn n_params(&self) -> usize {
        self.layers.iter().map(|l| l.w.len() + l.b.len()).sum()
    }

    /// Forward pass over a batch (rows × inputs).
    pub fn forward(&self, x: ArrayView2<f64>) -> Trace {
        assert_eq!(x.ncols(), self.input_dim(), "input width");
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut pre = Vec::with_capacity(self.layers.len());
        let mut a = x.to_owned();
        for (l, layer) in self.layers.iter().enumerate() {
            let z = a.dot(&layer.w) + &layer.b;
            let next = if l + 1 < self.layers.len() { z.mapv(|v| self.hidden.apply(v)) } else { z.clone() };
            inputs.push(a);
            pre.push(z);
            a = next;
        }
        Trace { inputs, pre }
    }

    /// The outputs for a batch.
    pub fn predict(&self, x: ArrayView2<f64>) -> Array2<f64> {
        dpflow_udfs::neural::predict(&self.layers, self.hidden, x)
    }

    /// Backward pass from ∂ℓ_i/∂(output) (batch × outputs), one row per
    /// example: each row is that example's own loss gradient (not averaged).
    pub fn backward(&self, trace: &Trace, d_out: ArrayView2<f64>) -> Backward {
        let n = self.layers.len();
        let mut deltas = vec![Array2::zeros((0, 0)); n];
        let mut delta = d_out.to_owned();
        for l in (0..n).rev() {
            let d_in = delta.dot(&self.layers[l].w.t());
            deltas[l] = delta;
            if l == 0 {
                return Backward { deltas, d_input: d_in };
            }
            // Through the activation of layer l − 1.
            let pre = &trace.pre[l - 1];
            delta = d_in;
            delta.zip_mut_with(pre, |d, &z| *d *= self.hidden.derivative(z));
        }
        unreachable!("the loop returns at layer 0")
    }

    /// Per-example gradients of rows `rows` of the batch, as a matrix
    /// (examples × parameters) in the flat layout (module docs).
    pub fn per_example_gradients(&self, trace: &Trace, back: &Backward, rows: std::ops::Range<usize>) -> Array2<f64> {
        let mut g = Array2::zeros((rows.len(), self.n_params()));
        for (i, mut row) in rows.zip(g.axis_iter_mut(Axis(0))) {
            self.example_gradient_into(trace, back, i, row.as_slice_mut().expect("a standard-layout row"));
        }
        g
    }

    /// Example `i`'s gradient written into `out` (length [`Self::n_params`],
    /// flat layout): per layer the outer product of its input and delta rows,
    /// then the delta row for the bias. No allocation, so a caller can reuse
    /// one buffer for a whole batch.
    pub fn example_gradient_into(&self, trace: &Trace, back: &Backward, i: usize, out: &mut [f64]) {
        assert_eq!(out.len(), self.n_params(), "gradient buffer length");
        let mut off = 0;
        for (l, layer) in self.layers.iter().enumerate() {
            let (fan_in, fan_out) = layer.w.dim();
            let (a, d) = (trace.inputs[l].row(i), back.deltas[l].row(i));
            write_outer(&mut out[off..off + fan_in * fan_out], a, d);
            for (o, &dv) in out[off + fan_in * fan_out..off + fan_in * fan_out + fan_out].iter_mut().zip(d.iter()) {
                *o = dv;
            }
            off += fan_in * fan_out + fan_out;
        }
    }

    /// Each example's squared gradient norm ‖g_i‖², without forming the
    /// gradients: a dense layer's weight gradient a_iδ_iᵀ has norm ‖a_i‖‖δ_i‖
    /// and its bias gradient is δ_i, so ‖g_i‖² = Σ_l (‖a_i^l‖² + 1)‖δ_i^l‖²
    /// (the per-example norm trick of Goodfellow 2015, "Efficient per-example
    /// gradient computations").
    pub fn per_example_sq_norms(&self, trace: &Trace, back: &Backward) -> Array1<f64> {
        let b = trace.inputs[0].nrows();
        let mut out = Array1::zeros(b);
        for l in 0..self.layers.len() {
            let (a, d) = (&trace.inputs[l], &back.deltas[l]);
            for (i, o) in out.iter_mut().enumerate() {
                let (ai, di) = (a.row(i), d.row(i));
                *o += (ai.dot(&ai) + 1.0) * di.dot(&di);
            }
        }
        out
    }

    /// The weighted sum Σ_i w_i g_i of the per-example gradients (flat
    /// layout), as one matrix product per layer: inputsᵀ·(w ⊙ deltas). An
    /// example of weight 0 contributes nothing, even if its values are not
    /// finite (0·NaN would otherwise poison the sum).
    pub fn weighted_gradient(&self, trace: &Trace, back: &Backward, w: ArrayView1<f64>) -> Array1<f64> {
        let keep = |m: &Array2<f64>, scale: bool| {
            let mut out = m.clone();
            for (mut row, &wi) in out.axis_iter_mut(Axis(0)).zip(w.iter()) {
                if wi == 0.0 {
                    row.fill(0.0);
                } else if scale {
                    row *= wi;
                }
            }
            out
        };
        let mut v = Vec::with_capacity(self.n_params());
        for l in 0..self.layers.len() {
            let d = keep(&back.deltas[l], true);
            v.extend(keep(&trace.inputs[l], false).t().dot(&d).iter());
            v.extend(d.sum_axis(Axis(0)).iter());
        }
        Array1::from(v)
    }

    /// The gradient summed over the batch's examples, in the flat layout:
    /// per layer, inputsᵀ·deltas for W and the column sums of the deltas
    /// for b (one matrix product instead of batch-many outer products).
    pub fn gradient(&self, trace: &Trace, back: &Backward) -> Array1<f64> {
        let mut v = Vec::with_capacity(self.n_params());
        for l in 0..self.layers.len() {
            v.extend(trace.inputs[l].t().dot(&back.deltas[l]).iter());
            v.extend(back.deltas[l].sum_axis(Axis(0)).iter());
        }
        Array1::from(v)
    }

    /// The WGAN-GP penalty (Gulrajani et al. 2017, eq. 3) of a critic with
    /// one output, per example x_i: P_i = λ(‖∇ₓD(x_i)‖ − 1)², with the
    /// gradient of their mean with respect to the parameters (flat layout).
    /// Returns (penalties, mean gradient).
    ///
    /// With a piecewise-linear activation (ReLU, leaky ReLU) the input
    /// gradient is g = r₁W₁ᵀ, where r_L = 1 and r_l = (r_{l+1}W_{l+1}ᵀ)⊙φ′(z_l)
    /// with the masks φ′ fixed almost everywhere. Back-propagating P through
    /// this linear chain: v₁ = ∂P/∂g = 2λ(‖g‖−1)g/‖g‖, ∂P/∂W_l = v_lᵀr_l and
    /// v_{l+1} = (v_lW_l)⊙φ′(z_l); the biases do not enter g, so their
    /// gradient is zero. (A zero input gradient gets a zero penalty gradient.)
    /// Summed over the batch, ∂ΣP/∂W_l = V_lᵀR_l: one matrix product per
    /// layer, never a per-example matrix.
    ///
    /// # Panics
    /// If the network has more than one output or a smooth activation (a
    /// programming error, not user input).
    pub fn gradient_penalty(&self, x: ArrayView2<f64>, lambda: f64) -> (Array1<f64>, Array1<f64>) {
        assert_eq!(self.output_dim(), 1, "a critic has one output");
        assert!(self.hidden != Activation::Tanh, "the penalty's gradient assumes a piecewise-linear activation");
        let n = self.layers.len();
        let trace = self.forward(x);
        let b = x.nrows();
        let masks: Vec<Array2<f64>> = (0..n - 1).map(|l| trace.pre[l].mapv(|z| self.hidden.derivative(z))).collect();
        // r_l, last layer first.
        let mut r = vec![Array2::zeros((0, 0)); n];
        r[n - 1] = Array2::ones((b, 1));
        for l in (0..n - 1).rev() {
            r[l] = r[l + 1].dot(&self.layers[l + 1].w.t()) * &masks[l];
        }
        let g = r[0].dot(&self.layers[0].w.t());
        let mut penalty = Array1::zeros(b);
        let mut v = Array2::zeros(g.raw_dim());
        for i in 0..b {
            let norm = g.row(i).dot(&g.row(i)).sqrt();
            penalty[i] = lambda * (norm - 1.0).powi(2);
            if norm > 0.0 {
                let k = 2.0 * lambda * (norm - 1.0) / norm;
                v.row_mut(i).assign(&(&g.row(i) * k));
            }
        }
        let mut grads = Vec::with_capacity(self.n_params());
        for (l, layer) in self.layers.iter().enumerate() {
            grads.extend((v.t().dot(&r[l]) / b as f64).iter());
            grads.extend(std::iter::repeat_n(0.0, layer.b.len()));
            if l + 1 < n {
                v = v.dot(&layer.w) * &masks[l];
            }
        }
        (penalty, Array1::from(grads))
    }

    /// The parameters as one flat vector (module docs).
    pub fn params(&self) -> Array1<f64> {
        let mut v = Vec::with_capacity(self.n_params());
        for l in &self.layers {
            v.extend(l.w.iter());
            v.extend(l.b.iter());
        }
        Array1::from(v)
    }

    /// Adds `scale · dir` to the parameters (dir in the flat layout).
    pub fn add_scaled(&mut self, dir: ArrayView1<f64>, scale: f64) {
        assert_eq!(dir.len(), self.n_params(), "direction length");
        let mut off = 0;
        for l in &mut self.layers {
            let nw = l.w.len();
            for (w, d) in l.w.iter_mut().zip(dir.slice(s![off..off + nw])) {
                *w += scale * d;
            }
            off += nw;
            let nb = l.b.len();
            l.b.scaled_add(scale, &dir.slice(s![off..off + nb]));
            off += nb;
        }
    }
}

/// Writes the outer product aᵀb into `out` row-major (a weight matrix's
/// slice of a flat gradient: inputs × outputs).
fn write_outer(out: &mut [f64], a: ArrayView1<f64>, b: ArrayView1<f64>) {
    let k = b.len();
    for (chunk, &ap) in out.chunks_exact_mut(k).zip(a.iter()) {
        if ap == 0.0 {
            // One-hot inputs: most rows of the outer product are zero.
            chunk.fill(0.0);
        } else {
            for (o, &bq) in chunk.iter_mut().zip(b.iter()) {
                *o = ap * bq;
            }
        }
    }
}

/// Softmax of each row of logits.
pub fn softmax(logits: ArrayView2<f64>) -> Array2<f64> {
    let mut p = logits.to_owned();
    for mut row in p.axis_iter_mut(Axis(0)) {
        let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        row.mapv_inplace(|v| (v - m).exp());
        let z = row.sum();
        row.mapv_inplace(|v| v / z);
    }
    p
}

/// Softmax cross-entropy per example, and its gradient with respect to the
/// logits (softmax − one-hot), one row per example.
pub fn softmax_cross_entropy(logits: ArrayView2<f64>, labels: &[usize]) -> (Array1<f64>, Array2<f64>) {
    assert_eq!(logits.nrows(), labels.len(), "one label per row");
    let mut p = softmax(logits);
    let loss = Array1::from_iter(labels.iter().enumerate().map(|(i, &y)| -p[[i, y]].max(f64::MIN_POSITIVE).ln()));
    for (i, &y) in labels.iter().enumerate() {
        p[[i, y]] -= 1.0;
    }
    (loss, p)
}

/// A uniform draw in [0, 1) with 53 random bits.
pub(crate) fn unit<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpflow_udfs::noise::DpRng;
    use ndarray::array;

    fn loss_of(m: &Mlp, x: ArrayView2<f64>, y: &[usize]) -> Array1<f64> {
        softmax_cross_entropy(m.predict(x).view(), y).0
    }

    #[test]
    fn per_example_gradients_equal_finite_differences() {
        let mut rng = DpRng::unsafe_seeded(3);
        for act in [Activation::Tanh, Activation::LeakyRelu] {
            let m = Mlp::new(&[4, 5, 3, 3], act, &mut rng);
            let x = Array2::from_shape_fn((6, 4), |_| 2.0 * unit(&mut rng) - 1.0);
            let y = [0usize, 2, 1, 1, 0, 2];
            let trace = m.forward(x.view());
            let (_, d) = softmax_cross_entropy(trace.output().view(), &y);
            let back = m.backward(&trace, d.view());
            let g = m.per_example_gradients(&trace, &back, 0..6);
            let base = m.params();
            let h = 1e-6;
            for p in 0..m.n_params() {
                let mut e = Array1::zeros(m.n_params());
                e[p] = 1.0;
                let (mut plus, mut minus) = (m.clone(), m.clone());
                plus.add_scaled(e.view(), h);
                minus.add_scaled(e.view(), -h);
                let fd = (loss_of(&plus, x.view(), &y) - loss_of(&minus, x.view(), &y)) / (2.0 * h);
                for i in 0..6 {
                    assert!(
                        (g[[i, p]] - fd[i]).abs() < 1e-6,
                        "{act:?} param {p} example {i}: {} vs {}",
                        g[[i, p]],
                        fd[i]
                    );
                }
            }
            assert_eq!(m.params(), base);
        }
    }

    #[test]
    fn the_input_gradient_equals_finite_differences() {
        // Needed to train a generator through a discriminator.
        let mut rng = DpRng::unsafe_seeded(4);
        let m = Mlp::new(&[3, 4, 1], Activation::LeakyRelu, &mut rng);
        let x = array![[0.3, -0.2, 0.9], [-0.5, 0.1, 0.4]];
        let trace = m.forward(x.view());
        let back = m.backward(&trace, Array2::ones((2, 1)).view());
        for i in 0..2 {
            for j in 0..3 {
                let h = 1e-6;
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[[i, j]] += h;
                xm[[i, j]] -= h;
                let fd = (m.predict(xp.view())[[i, 0]] - m.predict(xm.view())[[i, 0]]) / (2.0 * h);
                assert!((back.d_input[[i, j]] - fd).abs() < 1e-7);
            }
        }
    }

    #[test]
    fn batch_gradient_is_the_sum_of_per_example_gradients_and_rows_are_independent() {
        let mut rng = DpRng::unsafe_seeded(5);
        let m = Mlp::new(&[3, 8, 2], Activation::Relu, &mut rng);
        let x = Array2::from_shape_fn((5, 3), |_| unit(&mut rng));
        let y = [1usize, 0, 1, 1, 0];
        let trace = m.forward(x.view());
        let back = m.backward(&trace, softmax_cross_entropy(trace.output().view(), &y).1.view());
        let all = m.per_example_gradients(&trace, &back, 0..5);
        // Rows computed alone give the same per-example gradient.
        let one = m.forward(x.slice(s![2..3, ..]));
        let b1 = m.backward(&one, softmax_cross_entropy(one.output().view(), &y[2..3]).1.view());
        let g1 = m.per_example_gradients(&one, &b1, 0..1);
        for p in 0..m.n_params() {
            assert!((all[[2, p]] - g1[[0, p]]).abs() < 1e-12);
        }
        assert_eq!(m.per_example_gradients(&trace, &back, 1..4).row(1), all.row(2));
    }

    /// ‖∇ₓD(x)‖ by central differences.
    fn input_gradient_norm(m: &Mlp, x: ArrayView1<f64>) -> f64 {
        let h = 1e-6;
        let mut s = 0.0;
        for j in 0..x.len() {
            let (mut xp, mut xm) = (x.to_owned(), x.to_owned());
            xp[j] += h;
            xm[j] -= h;
            let d = (m.predict(xp.insert_axis(Axis(0)).view())[[0, 0]]
                - m.predict(xm.insert_axis(Axis(0)).view())[[0, 0]])
                / (2.0 * h);
            s += d * d;
        }
        s.sqrt()
    }

    #[test]
    fn the_gradient_penalty_and_its_parameter_gradient_equal_finite_differences() {
        let mut rng = DpRng::unsafe_seeded(8);
        for act in [Activation::LeakyRelu, Activation::Relu] {
            let m = Mlp::new(&[4, 6, 5, 1], act, &mut rng);
            let x = Array2::from_shape_fn((3, 4), |_| 2.0 * unit(&mut rng) - 1.0);
            let lambda = 10.0;
            let (pen, grads) = m.gradient_penalty(x.view(), lambda);
            for i in 0..3 {
                let norm = input_gradient_norm(&m, x.row(i));
                assert!((pen[i] - lambda * (norm - 1.0).powi(2)).abs() < 1e-6, "{act:?} {i}");
            }
            // Parameter gradient: second differences of the penalty (h small
            // enough that no unit changes side).
            let h = 1e-5;
            for p in 0..m.n_params() {
                let mut e = Array1::zeros(m.n_params());
                e[p] = 1.0;
                let (mut plus, mut minus) = (m.clone(), m.clone());
                plus.add_scaled(e.view(), h);
                minus.add_scaled(e.view(), -h);
                let (pp, _) = plus.gradient_penalty(x.view(), lambda);
                let (pm, _) = minus.gradient_penalty(x.view(), lambda);
                let fd = (pp.mean().expect("rows") - pm.mean().expect("rows")) / (2.0 * h);
                assert!((grads[p] - fd).abs() < 1e-5, "{act:?} param {p}: {} vs {fd}", grads[p]);
            }
        }
    }

    #[test]
    fn ghost_norms_and_weighted_sums_equal_the_per_example_gradients() {
        let mut rng = DpRng::unsafe_seeded(10);
        let m = Mlp::new(&[5, 6, 4, 1], Activation::LeakyRelu, &mut rng);
        // One-hot-like sparse inputs and dense ones.
        let x = Array2::from_shape_fn((7, 5), |(i, j)| if (i + j) % 3 == 0 { 0.0 } else { 2.0 * unit(&mut rng) - 1.0 });
        let trace = m.forward(x.view());
        let back = m.backward(&trace, Array2::from_shape_fn((7, 1), |_| unit(&mut rng) - 0.5).view());
        let g = m.per_example_gradients(&trace, &back, 0..7);
        let norms = m.per_example_sq_norms(&trace, &back);
        let w = Array1::from_shape_fn(7, |_| unit(&mut rng));
        let weighted = m.weighted_gradient(&trace, &back, w.view());
        for i in 0..7 {
            let exact = g.row(i).dot(&g.row(i));
            assert!((norms[i] - exact).abs() <= 1e-12 * exact.max(1.0), "example {i}: {} vs {exact}", norms[i]);
        }
        let expected = g.t().dot(&w);
        assert!(weighted.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-12));
        // A row of weight 0 adds nothing, even when its values are NaN.
        let mut bad = x.clone();
        bad.row_mut(3).fill(f64::NAN);
        let trace = m.forward(bad.view());
        let back = m.backward(&trace, Array2::from_elem((7, 1), 0.5).view());
        let mut w0 = w.clone();
        w0[3] = 0.0;
        let sum = m.weighted_gradient(&trace, &back, w0.view());
        let rows = m.per_example_gradients(&trace, &back, 0..7);
        for (p, v) in sum.iter().enumerate() {
            let direct: f64 = (0..7).filter(|&i| i != 3).map(|i| w0[i] * rows[[i, p]]).sum();
            assert!(v.is_finite() && (v - direct).abs() < 1e-12, "parameter {p}: {v} vs {direct}");
        }
    }

    #[test]
    fn the_batch_gradient_is_the_sum_of_per_example_gradients() {
        let mut rng = DpRng::unsafe_seeded(9);
        let m = Mlp::new(&[3, 7, 2], Activation::LeakyRelu, &mut rng);
        let x = Array2::from_shape_fn((9, 3), |_| unit(&mut rng));
        let trace = m.forward(x.view());
        let d = Array2::from_shape_fn((9, 2), |_| unit(&mut rng) - 0.5);
        let back = m.backward(&trace, d.view());
        let sum = m.per_example_gradients(&trace, &back, 0..9).sum_axis(Axis(0));
        let g = m.gradient(&trace, &back);
        assert!(sum.iter().zip(&g).all(|(a, b)| (a - b).abs() < 1e-12));
    }

    #[test]
    fn parameter_round_trip() {
        let mut rng = DpRng::unsafe_seeded(6);
        let mut m = Mlp::new(&[2, 3, 2], Activation::Tanh, &mut rng);
        let p = m.params();
        assert_eq!(p.len(), 2 * 3 + 3 + 3 * 2 + 2);
        m.add_scaled(p.view(), -1.0);
        assert!(m.params().iter().all(|&v| v == 0.0));
    }
}
