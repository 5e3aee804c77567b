//! Dense networks at inference time, inside the engine: the layer and
//! activation types of dpflow's small MLPs (trained in the root crate's
//! `neural` module with DP-SGD) and their forward pass, so that an executor,
//! which links this crate only, can sample a released generator
//! ([`crate::synth::GeneratorPlan`]).
//!
//! A layer computes y = a·W + b (W is inputs × outputs); hidden layers share
//! one activation and the last layer is linear.

use ndarray::{Array1, Array2, ArrayView2};
use serde::{Deserialize, Serialize};

/// A hidden-layer activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// max(0, x).
    Relu,
    /// max(0.2x, x) (GAN discriminators).
    LeakyRelu,
    /// tanh(x).
    Tanh,
}

impl Activation {
    /// The activation at pre-activation x.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::LeakyRelu => {
                if x > 0.0 {
                    x
                } else {
                    0.2 * x
                }
            }
            Activation::Tanh => x.tanh(),
        }
    }

    /// The derivative at pre-activation x (0 at a ReLU's kink).
    pub fn derivative(self, x: f64) -> f64 {
        match self {
            Activation::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Activation::LeakyRelu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.2
                }
            }
            Activation::Tanh => 1.0 - x.tanh().powi(2),
        }
    }
}

/// One dense layer: y = a·W + b.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dense {
    /// Weights, inputs × outputs.
    pub w: Array2<f64>,
    /// Biases, one per output.
    pub b: Array1<f64>,
}

/// Checks that `layers` chain (each layer's inputs are the previous one's
/// outputs, biases match) and returns (inputs, outputs).
pub fn widths(layers: &[Dense]) -> Option<(usize, usize)> {
    let first = layers.first()?;
    let mut prev = first.w.nrows();
    for l in layers {
        if l.w.nrows() != prev || l.b.len() != l.w.ncols() || l.w.ncols() == 0 {
            return None;
        }
        prev = l.w.ncols();
    }
    Some((first.w.nrows(), prev))
}

/// The network's outputs for a batch (rows × inputs): hidden layers through
/// `hidden`, the last layer linear.
pub fn predict(layers: &[Dense], hidden: Activation, x: ArrayView2<f64>) -> Array2<f64> {
    let mut a = x.to_owned();
    for (l, layer) in layers.iter().enumerate() {
        let mut z = a.dot(&layer.w) + &layer.b;
        if l + 1 < layers.len() {
            z.mapv_inplace(|v| hidden.apply(v));
        }
        a = z;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn a_two_layer_network_by_hand() {
        let layers = vec![
            Dense { w: array![[1.0, -1.0], [2.0, 0.5]], b: array![0.0, -1.0] },
            Dense { w: array![[1.0], [3.0]], b: array![0.5] },
        ];
        assert_eq!(widths(&layers), Some((2, 1)));
        // x = (1, 1): z1 = (3, -1.5) → ReLU (3, 0) → 3 + 0 + 0.5.
        let y = predict(&layers, Activation::Relu, array![[1.0, 1.0]].view());
        assert_eq!(y, array![[3.5]]);
        // Leaky: (3, -0.3) → 3 − 0.9 + 0.5.
        let y = predict(&layers, Activation::LeakyRelu, array![[1.0, 1.0]].view());
        assert!((y[[0, 0]] - 2.6).abs() < 1e-12);
        let bad = vec![layers[0].clone(), Dense { w: array![[1.0]], b: array![0.0] }];
        assert_eq!(widths(&bad), None);
    }
}
