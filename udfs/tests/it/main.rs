//! dpflow-udfs' integration tests (plans round-tripped through the codec), in
//! one test binary: each linked all of DataFusion on its own (see
//! `tests/it/main.rs` of the root crate).

mod knn_plans;
mod marginal_plans;
mod synthetic_plans;
