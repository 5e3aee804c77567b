//! Public domains: the data owner's spec (YAML/JSON, private-pgm JSON) and its
//! compiled form. The compiled types and the encode/decode kernels live in
//! `dpflow_udfs::domain` so that engine-side operators can use them without
//! this crate; this module parses and validates the user-facing files.

mod not_applicable;
mod spec;
mod write;

pub use dpflow_udfs::domain::*;
pub use not_applicable::{NotApplicable, RuleError};
pub(crate) use spec::from_yaml_with_path;
pub use spec::{DomainSpec, SpecError, TextFormat};
pub use write::{to_yaml, with_all_nullable};
