//! # dpflow
//!
//! Differentially private releases of census-scale data on Apache DataFusion:
//! DP SQL, private imputation and DP synthetic data, declared as YAML release
//! pipelines with a privacy budget that is never overspent.
//!
//! This crate holds planning and policy; everything that runs inside the
//! engine (samplers, operators, UDFs) is in [`dpflow_udfs`].
#![warn(missing_docs)]

pub mod analyze;
pub mod dataset;
pub mod domain;
pub mod eval;
pub mod impute;
pub mod io;
pub mod measure;
pub mod missing;
pub mod neural;
pub mod pgm;
pub mod pipeline;
pub mod privacy;
pub mod report;
pub mod serve;
pub mod sql;
pub mod synth;

pub use dpflow_udfs as udfs;
