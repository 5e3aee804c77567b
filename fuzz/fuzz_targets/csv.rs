//! Fuzz target `csv`: see `harness::csv`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::csv(data));
