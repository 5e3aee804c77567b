//! kNN donor imputation (004): donor search over equivalence classes with
//! deterministic tie-breaking, the donee-change quantity L1(D), and the
//! `KnnDonorExec` operator.

mod exec;
mod index;
pub mod pass;
mod pass_exec;
pub mod query;
#[cfg(test)]
mod tests;

pub use exec::{ImputeScheme, KnnDonorExec, KnnSpec};
pub use index::{
    Assignment, AttrKind, ClassView, KnnConfig, KnnError, KnnRecords, L1Report, MatchAttr, Metric, PartDonees,
    max_cyclic_coverage,
};
pub use pass::GroupId;
pub use pass_exec::{KnnPassExec, KnnPassOutput, KnnStage, file_groups};
