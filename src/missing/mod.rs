//! Missing data (000): simulators to inject MCAR/MAR/MNAR missingness for
//! evaluation, the strategies a marginal-based synthesizer can take when the
//! input has nulls (complete-row, imputation-first, adaptive partial-marginal
//! observation), and MCAR privacy amplification for the complete ground truth.

pub mod amplify;
mod error;
pub mod inject;
pub mod strategy;

pub use amplify::{Amplification, Missingness, Rates};
pub use error::MissingError;
pub use strategy::{AmplificationRequest, ImputeMethod, Strategy, StrategyOptions};

type Result<T, E = MissingError> = std::result::Result<T, E>;
