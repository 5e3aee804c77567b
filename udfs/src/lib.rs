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
pub mod cluster;
pub mod codec;
pub mod cost;
pub mod domain;
pub mod dp;
pub mod knn;
pub mod marginal;
pub mod neural;
pub mod noise;
pub mod rowsafe;
pub mod session;
pub mod synth;
pub mod unwind;

/// Implements `Debug` for a type holding exact (unnoised) statistics or
/// protected values as a placeholder, so that no log line or panic message
/// at any level can print them (docs/PRIVACY.md §1).
///
/// ```
/// struct Exact { n: u64 }
/// dpflow_udfs::protected_debug!(Exact);
/// assert_eq!(format!("{:?}", Exact { n: 42 }), "Exact(<protected>)");
/// ```
#[macro_export]
macro_rules! protected_debug {
    ($($t:ty),+ $(,)?) => {$(
        impl ::std::fmt::Debug for $t {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(concat!(stringify!($t), "(<protected>)"))
            }
        }
    )+};
}
