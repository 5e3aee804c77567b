//! # dpflow-udfs
//!
//! The engine side of dpflow: everything that runs inside Apache DataFusion.
//! Noise samplers and calibration, public-domain encoding kernels, and the
//! DataFusion operators and functions (multi-marginal counting, DP aggregates,
//! kNN donor search, synthetic sampling). This crate depends on DataFusion and
//! not on the `dpflow` planning crate, so a distributed executor can link it
//! alone.
#![warn(missing_docs)]

pub mod calibrate;
pub mod codec;
pub mod cost;
pub mod domain;
pub mod dp;
pub mod knn;
pub mod marginal;
pub mod noise;
pub mod session;
pub mod synth;
