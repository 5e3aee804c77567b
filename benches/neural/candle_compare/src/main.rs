//! DP-SGD per-example gradient benchmark: hand-written ndarray vs candle (CPU, f64).
//!
//! Model: MLP [280, 128, 128, 1], leaky-ReLU(0.2) between layers, linear output.
//! Loss per example = critic output. Per-example gradient (52,609 params) -> L2 norm ->
//! scale to norm <= CLIP -> sum over the batch.
//!
//! Canonical flat parameter order (used to compare variants):
//!   [W1 (128x280, row-major, out x in), b1 (128), W2 (128x128), b2, W3 (1x128), b3 (1)]
//! i.e. the same (out, in) weight layout as `candle_nn::Linear`.
//!
//! Build without candle: `cargo build --release --no-default-features` (ndarray only).

use ndarray::{Array1, Array2, Axis};
use std::time::Instant;

const B: usize = 256;
const WIDTHS: [usize; 4] = [280, 128, 128, 1];
const N_BLOCKS: usize = 15;
const SLOPE: f64 = 0.2;
/// DP-SGD clipping bound C (default 1.0; env CLIP overrides, used only for a correctness check
/// of the un-clipped branch: with C = 1 every example is clipped because the output-bias
/// gradient alone is 1).
fn clip() -> f64 {
    static C: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *C.get_or_init(|| std::env::var("CLIP").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0))
}
const N_PARAMS: usize = 280 * 128 + 128 + 128 * 128 + 128 + 128 + 1; // 52,609

// ---------------------------------------------------------------- data + init

/// splitmix64: small deterministic PRNG, enough for test data.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// B x 280 one-hot matrix: 15 blocks covering the 280 columns, one random 1 per block.
fn make_batch(rng: &mut Rng) -> Vec<f64> {
    let d = WIDTHS[0];
    let mut x = vec![0.0; B * d];
    for r in 0..B {
        for k in 0..N_BLOCKS {
            let lo = k * d / N_BLOCKS;
            let hi = (k + 1) * d / N_BLOCKS;
            let c = lo + (rng.next_u64() as usize) % (hi - lo);
            x[r * d + c] = 1.0;
        }
    }
    x
}

/// Weights (out x in, row-major) and biases, uniform(-s/sqrt(in), s/sqrt(in)).
fn make_params(rng: &mut Rng, scale: f64) -> Vec<(Vec<f64>, Vec<f64>)> {
    (0..3)
        .map(|l| {
            let (i, o) = (WIDTHS[l], WIDTHS[l + 1]);
            let s = scale / (i as f64).sqrt();
            let w = (0..o * i).map(|_| s * (2.0 * rng.uniform() - 1.0)).collect();
            let b = (0..o).map(|_| s * (2.0 * rng.uniform() - 1.0)).collect();
            (w, b)
        })
        .collect()
}

#[inline]
fn lrelu(z: f64) -> f64 {
    if z > 0.0 { z } else { SLOPE * z }
}
#[inline]
fn lrelu_d(z: f64) -> f64 {
    if z > 0.0 { 1.0 } else { SLOPE }
}

// ---------------------------------------------------------------- ndarray

struct NdModel {
    w: Vec<Array2<f64>>, // out x in
    b: Vec<Array1<f64>>,
}

impl NdModel {
    fn new(p: &[(Vec<f64>, Vec<f64>)]) -> Self {
        let w = (0..3)
            .map(|l| Array2::from_shape_vec((WIDTHS[l + 1], WIDTHS[l]), p[l].0.clone()).unwrap())
            .collect();
        let b = (0..3).map(|l| Array1::from(p[l].1.clone())).collect();
        NdModel { w, b }
    }

    /// Batched forward + backward. Returns (layer inputs a_0..a_2, deltas d_1..d_3),
    /// each B x width, where d_l = dLoss_i / dz_l for example i in row i.
    fn forward_backward(&self, x: &Array2<f64>) -> (Vec<Array2<f64>>, Vec<Array2<f64>>) {
        let mut inputs = vec![x.clone()];
        let mut zs = Vec::new();
        for l in 0..3 {
            let z = inputs[l].dot(&self.w[l].t()) + &self.b[l];
            if l < 2 {
                inputs.push(z.mapv(lrelu));
            }
            zs.push(z);
        }
        // d loss_i / d out_i = 1
        let mut deltas = vec![Array2::<f64>::ones((x.nrows(), 1))];
        for l in (0..2).rev() {
            let upstream = deltas[0].dot(&self.w[l + 1]); // B x width_{l+1}
            let mut d = upstream;
            d.zip_mut_with(&zs[l], |dv, &z| *dv *= lrelu_d(z));
            deltas.insert(0, d);
        }
        (inputs, deltas)
    }
}

/// Variant 1: per example, write the full gradient into one reused buffer, norm, clip, add.
fn nd_step(m: &NdModel, x: &Array2<f64>, buf: &mut [f64], sum: &mut [f64]) -> usize {
    let (inputs, deltas) = m.forward_backward(x);
    sum.iter_mut().for_each(|v| *v = 0.0);
    let mut n_clipped = 0;
    for i in 0..x.nrows() {
        let mut off = 0;
        let mut sq = 0.0;
        for l in 0..3 {
            let a = inputs[l].row(i);
            let a = a.as_slice().unwrap();
            let d = deltas[l].row(i);
            let d = d.as_slice().unwrap();
            let n_in = a.len();
            // weight gradient (out x in): row j = d[j] * a
            for (j, &dj) in d.iter().enumerate() {
                let dst = &mut buf[off + j * n_in..off + (j + 1) * n_in];
                for (g, &av) in dst.iter_mut().zip(a) {
                    let v = dj * av;
                    *g = v;
                    sq += v * v;
                }
            }
            off += d.len() * n_in;
            // bias gradient
            for (g, &dj) in buf[off..off + d.len()].iter_mut().zip(d) {
                *g = dj;
                sq += dj * dj;
            }
            off += d.len();
        }
        debug_assert_eq!(off, N_PARAMS);
        let norm = sq.sqrt();
        let s = if norm > clip() { n_clipped += 1; clip() / norm } else { 1.0 };
        for (acc, &g) in sum.iter_mut().zip(buf.iter()) {
            *acc += s * g;
        }
    }
    n_clipped
}

/// Extra (not requested): same result without materialising any per-example gradient.
/// ||g_i||^2 = sum_l (||a_i||^2 + 1) ||d_i||^2 ;  clipped sum of W_l = (s*D_l)^T A_l.
fn nd_ghost_step(m: &NdModel, x: &Array2<f64>, sum: &mut [f64]) {
    let (inputs, deltas) = m.forward_backward(x);
    let mut sq = Array1::<f64>::zeros(x.nrows());
    for l in 0..3 {
        let an = inputs[l].mapv(|v| v * v).sum_axis(Axis(1));
        let dn = deltas[l].mapv(|v| v * v).sum_axis(Axis(1));
        sq = sq + (an + 1.0) * dn;
    }
    let s = sq.mapv(|q| {
        let n = q.sqrt();
        if n > clip() { clip() / n } else { 1.0 }
    });
    let mut off = 0;
    for l in 0..3 {
        let sd = &deltas[l] * &s.view().insert_axis(Axis(1)); // B x out
        let gw = sd.t().dot(&inputs[l]); // out x in
        let gb = sd.sum_axis(Axis(0));
        let n = gw.len();
        sum[off..off + n].copy_from_slice(gw.as_slice().unwrap());
        off += n;
        sum[off..off + gb.len()].copy_from_slice(gb.as_slice().unwrap());
        off += gb.len();
    }
}

// ---------------------------------------------------------------- candle

#[cfg(feature = "candle")]
mod cnd {
    use super::*;
    use candle_core::{DType, Device, Result, Tensor, Var};
    use candle_nn::{Linear, Module};

    pub struct CModel {
        pub wv: Vec<Var>,
        pub bv: Vec<Var>,
        pub lin: Vec<Linear>,
    }

    impl CModel {
        pub fn new(p: &[(Vec<f64>, Vec<f64>)], dev: &Device) -> Result<Self> {
            let mut wv = Vec::new();
            let mut bv = Vec::new();
            let mut lin = Vec::new();
            for l in 0..3 {
                let w = Var::from_slice(&p[l].0, (WIDTHS[l + 1], WIDTHS[l]), dev)?;
                let b = Var::from_slice(&p[l].1, WIDTHS[l + 1], dev)?;
                lin.push(Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone())));
                wv.push(w);
                bv.push(b);
            }
            Ok(CModel { wv, bv, lin })
        }

        /// Forward with autograd; optional zero-valued probe Vars added to each pre-activation
        /// so that their gradients are the per-example deltas. Returns (output, layer inputs).
        pub fn forward(&self, x: &Tensor, probes: Option<&[Var]>) -> Result<(Tensor, Vec<Tensor>)> {
            let mut h = x.clone();
            let mut inputs = Vec::new();
            for l in 0..3 {
                inputs.push(h.clone());
                let mut z = self.lin[l].forward(&h)?;
                if let Some(p) = probes {
                    z = (z + p[l].as_tensor())?;
                }
                h = if l < 2 { candle_nn::ops::leaky_relu(&z, SLOPE)? } else { z };
            }
            Ok((h, inputs))
        }

        fn params(&self) -> Vec<&Tensor> {
            let mut v = Vec::new();
            for l in 0..3 {
                v.push(self.wv[l].as_tensor());
                v.push(self.bv[l].as_tensor());
            }
            v
        }
    }

    /// Variant 2a: one forward+backward per example; norm and clipped sum kept in candle tensors.
    pub fn per_example_autograd_tensors(m: &CModel, x: &Tensor) -> Result<Vec<f64>> {
        let params = m.params();
        let mut acc: Vec<Tensor> = params.iter().map(|p| p.zeros_like()).collect::<Result<_>>()?;
        for i in 0..x.dim(0)? {
            let xi = x.narrow(0, i, 1)?;
            let (out, _) = m.forward(&xi, None)?;
            let grads = out.backward()?;
            let gs: Vec<&Tensor> = params.iter().map(|p| grads.get(p).unwrap()).collect();
            let mut sq = 0.0;
            for g in &gs {
                sq += g.sqr()?.sum_all()?.to_scalar::<f64>()?;
            }
            let norm = sq.sqrt();
            let s = if norm > clip() { clip() / norm } else { 1.0 };
            for (a, g) in acc.iter_mut().zip(&gs) {
                *a = (&*a + g.affine(s, 0.0)?)?;
            }
        }
        let mut out = Vec::with_capacity(N_PARAMS);
        for a in acc {
            out.extend(a.flatten_all()?.to_vec1::<f64>()?);
        }
        Ok(out)
    }

    /// Variant 2b: one forward+backward per example; gradients copied out into one reused
    /// Vec, norm and clipped sum in plain Rust.
    pub fn per_example_autograd_copyout(m: &CModel, x: &Tensor) -> Result<Vec<f64>> {
        let params = m.params();
        let mut buf = vec![0.0f64; N_PARAMS];
        let mut sum = vec![0.0f64; N_PARAMS];
        for i in 0..x.dim(0)? {
            let xi = x.narrow(0, i, 1)?;
            let (out, _) = m.forward(&xi, None)?;
            let grads = out.backward()?;
            let mut off = 0;
            for p in &params {
                let g = grads.get(p).unwrap().flatten_all()?.to_vec1::<f64>()?;
                buf[off..off + g.len()].copy_from_slice(&g);
                off += g.len();
            }
            let norm = buf.iter().map(|v| v * v).sum::<f64>().sqrt();
            let s = if norm > clip() { clip() / norm } else { 1.0 };
            for (a, &g) in sum.iter_mut().zip(&buf) {
                *a += s * g;
            }
        }
        Ok(sum)
    }

    #[derive(Clone, Copy)]
    pub enum Outer {
        Matmul,
        BroadcastMul,
    }

    /// Given batched layer inputs a_l (B x in) and deltas d_l (B x out), materialise
    /// per-example weight gradients (B x out x in), compute norms, clip, sum; all in candle ops.
    pub fn clip_sum_materialised(inputs: &[Tensor], deltas: &[Tensor], outer: Outer) -> Result<Vec<f64>> {
        let bsz = inputs[0].dim(0)?;
        let mut gws = Vec::new();
        let mut sq: Option<Tensor> = None;
        for l in 0..3 {
            let gw = match outer {
                Outer::Matmul => deltas[l].unsqueeze(2)?.matmul(&inputs[l].unsqueeze(1)?)?,
                Outer::BroadcastMul => deltas[l].unsqueeze(2)?.broadcast_mul(&inputs[l].unsqueeze(1)?)?,
            }; // B x out x in
            let q = (gw.sqr()?.sum((1, 2))? + deltas[l].sqr()?.sum(1)?)?;
            sq = Some(match sq {
                None => q,
                Some(s) => (s + q)?,
            });
            gws.push(gw);
        }
        let norm = sq.unwrap().sqrt()?;
        let scale = (norm.maximum(clip())?.recip()? * clip())?; // clip() / max(norm, clip())
        let mut out = Vec::with_capacity(N_PARAMS);
        for l in 0..3 {
            let w = gws[l].broadcast_mul(&scale.reshape((bsz, 1, 1))?)?.sum(0)?;
            let b = deltas[l].broadcast_mul(&scale.reshape((bsz, 1))?)?.sum(0)?;
            out.extend(w.flatten_all()?.to_vec1::<f64>()?);
            out.extend(b.to_vec1::<f64>()?);
        }
        Ok(out)
    }

    /// Extra: no materialisation (norms from ||a||*||d||, sums as one matmul per layer).
    pub fn clip_sum_ghost(inputs: &[Tensor], deltas: &[Tensor]) -> Result<Vec<f64>> {
        let bsz = inputs[0].dim(0)?;
        let mut sq: Option<Tensor> = None;
        for l in 0..3 {
            let q = ((inputs[l].sqr()?.sum(1)? + 1.0)? * deltas[l].sqr()?.sum(1)?)?;
            sq = Some(match sq {
                None => q,
                Some(s) => (s + q)?,
            });
        }
        let norm = sq.unwrap().sqrt()?;
        let scale = (norm.maximum(clip())?.recip()? * clip())?.reshape((bsz, 1))?;
        let mut out = Vec::with_capacity(N_PARAMS);
        for l in 0..3 {
            let sd = deltas[l].broadcast_mul(&scale)?;
            let w = sd.t()?.matmul(&inputs[l])?;
            out.extend(w.flatten_all()?.to_vec1::<f64>()?);
            out.extend(sd.sum(0)?.to_vec1::<f64>()?);
        }
        Ok(out)
    }

    /// Variant 3a: ONE autograd backward of the summed loss; deltas read from zero-valued probe
    /// Vars added to each pre-activation (candle drops non-leaf grads and has no hooks).
    pub fn deltas_autograd_probe(m: &CModel, x: &Tensor, probes: &[Var]) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let (out, inputs) = m.forward(x, Some(probes))?;
        let grads = out.sum_all()?.backward()?;
        let deltas = probes.iter().map(|p| grads.get(p.as_tensor()).unwrap().detach()).collect();
        let inputs = inputs.iter().map(|t| t.detach()).collect();
        Ok((inputs, deltas))
    }

    /// Variant 3b: manual batched backward pass written with candle ops (no autograd).
    pub fn deltas_manual(m: &CModel, x: &Tensor) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let ws: Vec<Tensor> = m.wv.iter().map(|v| v.as_detached_tensor()).collect();
        let bs: Vec<Tensor> = m.bv.iter().map(|v| v.as_detached_tensor()).collect();
        let mut inputs = vec![x.clone()];
        let mut derivs = Vec::new();
        let mut h = x.clone();
        for l in 0..3 {
            let z = h.matmul(&ws[l].t()?)?.broadcast_add(&bs[l])?;
            if l < 2 {
                // lrelu'(z) = 1 if z > 0 else SLOPE
                let dz = z.gt(0.0)?.to_dtype(DType::F64)?.affine(1.0 - SLOPE, SLOPE)?;
                h = candle_nn::ops::leaky_relu(&z, SLOPE)?;
                inputs.push(h.clone());
                derivs.push(dz);
            }
        }
        let bsz = x.dim(0)?;
        let d3 = Tensor::ones((bsz, 1), DType::F64, x.device())?;
        let d2 = (d3.matmul(&ws[2])? * &derivs[1])?;
        let d1 = (d2.matmul(&ws[1])? * &derivs[0])?;
        Ok((inputs, vec![d1, d2, d3]))
    }

    /// Diagnostic only (env PROFILE3=1): time the stages of clip_sum_materialised for layer 1
    /// (B x 128 x 280), the largest layer, to see where candle spends its time.
    pub fn profile_materialised(inputs: &[Tensor], deltas: &[Tensor]) -> Result<()> {
        let bsz = inputs[0].dim(0)?;
        let mut st: Vec<Vec<f64>> = vec![Vec::new(); 6];
        for _ in 0..7 {
            let t = Instant::now();
            let gw = deltas[0].unsqueeze(2)?.matmul(&inputs[0].unsqueeze(1)?)?;
            st[0].push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let sq = gw.sqr()?;
            st[1].push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let q = sq.sum((1, 2))?;
            st[2].push(t.elapsed().as_secs_f64() * 1e3);
            let scale = (q.sqrt()?.maximum(clip())?.recip()? * clip())?;
            let t = Instant::now();
            let scaled = gw.broadcast_mul(&scale.reshape((bsz, 1, 1))?)?;
            st[3].push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let w = scaled.sum(0)?;
            st[4].push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let w2 = deltas[0].broadcast_mul(&scale.reshape((bsz, 1))?)?.t()?.matmul(&inputs[0])?;
            st[5].push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box((w, w2));
        }
        let names = ["bmm outer (B,128,280)", "sqr", "sum((1,2))", "broadcast_mul scale", "sum(0) over batch", "alt: (s*D)^T A matmul"];
        for (n, mut v) in names.iter().zip(st) {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!("  layer-1 stage {:<26} median {:>8.2} ms", n, v[3]);
        }
        Ok(())
    }

    pub fn probes(dev: &Device) -> Result<Vec<Var>> {
        (0..3).map(|l| Var::zeros((B, WIDTHS[l + 1]), DType::F64, dev)).collect()
    }
}

// ---------------------------------------------------------------- harness

fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let den: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    num / den
}

fn max_rel_elem(a: &[f64], b: &[f64]) -> f64 {
    let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

struct Stats {
    median: f64,
    min: f64,
    p25: f64,
    p75: f64,
}

fn bench<F: FnMut() -> Vec<f64>>(warmup: usize, reps: usize, mut f: F) -> (Stats, Vec<f64>) {
    let mut out = Vec::new();
    for _ in 0..warmup {
        out = f();
    }
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let o = f();
        ts.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(&o);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| ts[((reps - 1) as f64 * p).round() as usize];
    (Stats { median: q(0.5), min: ts[0], p25: q(0.25), p75: q(0.75) }, out)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let warmup: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let init_scale: f64 = std::env::var("INIT_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);

    let mut rng = Rng(42);
    let xv = make_batch(&mut rng);
    let params = make_params(&mut rng, init_scale);
    let n_params: usize = params.iter().map(|(w, b)| w.len() + b.len()).sum();
    assert_eq!(n_params, N_PARAMS);
    println!("B={B} widths={WIDTHS:?} params={n_params} clip={} reps={reps} warmup={warmup} dtype=f64", clip());
    println!(
        "threads: RAYON_NUM_THREADS={:?} (ndarray/matrixmultiply is single-threaded)",
        std::env::var("RAYON_NUM_THREADS").ok()
    );

    let x = Array2::from_shape_vec((B, WIDTHS[0]), xv.clone()).unwrap();
    let nd = NdModel::new(&params);

    // norm distribution (for information: clipping must be exercised)
    {
        let (inputs, deltas) = nd.forward_backward(&x);
        let mut norms: Vec<f64> = (0..B)
            .map(|i| {
                (0..3)
                    .map(|l| {
                        let a2: f64 = inputs[l].row(i).iter().map(|v| v * v).sum();
                        let d2: f64 = deltas[l].row(i).iter().map(|v| v * v).sum();
                        (a2 + 1.0) * d2
                    })
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        norms.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let clipped = norms.iter().filter(|&&n| n > clip()).count();
        println!(
            "per-example grad norms: min {:.4} median {:.4} max {:.4}; clipped {clipped}/{B}",
            norms[0],
            norms[B / 2],
            norms[B - 1]
        );
    }

    let mut results: Vec<(&str, Stats, Vec<f64>)> = Vec::new();

    let mut buf = vec![0.0; N_PARAMS];
    let (s, o) = bench(warmup, reps, || {
        let mut sum = vec![0.0; N_PARAMS];
        nd_step(&nd, &x, &mut buf, &mut sum);
        sum
    });
    results.push(("1  ndarray per-example buffer (baseline)", s, o));

    let (s, o) = bench(warmup, reps, || {
        let mut sum = vec![0.0; N_PARAMS];
        nd_ghost_step(&nd, &x, &mut sum);
        sum
    });
    results.push(("x1 ndarray ghost-norm, no per-ex grads (extra)", s, o));

    #[cfg(feature = "candle")]
    {
        use candle_core::{Device, Tensor};
        use cnd::*;
        let dev = Device::Cpu;
        let xt = Tensor::from_slice(&xv, (B, WIDTHS[0]), &dev).unwrap();
        let cm = CModel::new(&params, &dev).unwrap();
        let probes = probes(&dev).unwrap();

        if std::env::var("PROFILE3").is_ok() {
            let (a, d) = deltas_manual(&cm, &xt).unwrap();
            profile_materialised(&a, &d).unwrap();
        }
        let r2 = reps.min(std::env::var("REPS2").ok().and_then(|s| s.parse().ok()).unwrap_or(reps));
        let (s, o) = bench(warmup.min(2), r2, || per_example_autograd_tensors(&cm, &xt).unwrap());
        results.push(("2a candle autograd x256, accumulate in tensors", s, o));
        let (s, o) = bench(warmup.min(2), r2, || per_example_autograd_copyout(&cm, &xt).unwrap());
        results.push(("2b candle autograd x256, copy out to Vec", s, o));

        let (s, o) = bench(warmup, reps, || {
            let (a, d) = deltas_autograd_probe(&cm, &xt, &probes).unwrap();
            clip_sum_materialised(&a, &d, Outer::Matmul).unwrap()
        });
        results.push(("3a candle 1 backward + probe-Var deltas, bmm outer", s, o));
        let (s, o) = bench(warmup, reps, || {
            let (a, d) = deltas_manual(&cm, &xt).unwrap();
            clip_sum_materialised(&a, &d, Outer::Matmul).unwrap()
        });
        results.push(("3b candle manual backward, bmm outer", s, o));
        let (s, o) = bench(warmup, reps, || {
            let (a, d) = deltas_manual(&cm, &xt).unwrap();
            clip_sum_materialised(&a, &d, Outer::BroadcastMul).unwrap()
        });
        results.push(("3c candle manual backward, broadcast_mul outer", s, o));
        let (s, o) = bench(warmup, reps, || {
            let (a, d) = deltas_autograd_probe(&cm, &xt, &probes).unwrap();
            clip_sum_ghost(&a, &d).unwrap()
        });
        results.push(("x3 candle probe deltas + ghost-norm (extra)", s, o));
    }

    let base = results[0].1.median;
    let ref_out = results[0].2.clone();
    println!(
        "\n{:<52} {:>9} {:>9} {:>9} {:>9} {:>7}  {:>10} {:>10}",
        "variant", "median ms", "min", "p25", "p75", "ratio", "rel L2 diff", "max el diff"
    );
    for (name, s, o) in &results {
        println!(
            "{:<52} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7.2}  {:>10.2e} {:>10.2e}",
            name,
            s.median,
            s.min,
            s.p25,
            s.p75,
            s.median / base,
            rel_diff(&ref_out, o),
            max_rel_elem(&ref_out, o)
        );
    }
    let worst = results.iter().map(|(_, _, o)| rel_diff(&ref_out, o)).fold(0.0f64, f64::max);
    println!("\nagreement: worst relative L2 diff vs ndarray = {worst:.3e} -> {}", if worst < 1e-9 { "OK (<1e-9)" } else { "MISMATCH" });
    println!("checksum sum(clipped sum) = {:.12}", ref_out.iter().sum::<f64>());
}
