//! dpflow's integration tests, in one test binary.
//!
//! Each file in `tests/` used to be its own binary. Every one linked all of
//! DataFusion (about 225 MB of code each at `opt-level = 1`), so 23 of them
//! cost about 5 GB of disk and 23 links, and a fresh CI machine ran out of room
//! while linking them. One binary links once. Filter as before with the module
//! name: `cargo test --test it sql_imputed::` (or a test's name).
//!
//! `tests/campaign.rs` stays a binary of its own: it sets S3 credentials in the
//! process environment, which must not leak into tests running beside it.

#[path = "../common/mod.rs"]
mod common;

mod analyze;
#[cfg(feature = "cluster")]
mod cluster;
mod dp_audit;
mod dp_audit_sql;
mod eval;
mod fuzz_corpus;
mod io;
mod kamino;
mod layering;
mod ledger;
mod missing_stability;
mod not_applicable_synth;
mod pipeline;
mod planner;
mod privacy_defects;
mod rdp_dp_accounting;
mod report;
mod serve;
mod sql;
mod sql_dp_tables;
mod sql_imputed;
mod sql_synthetic;
