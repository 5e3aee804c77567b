//! Fuzz target `domain`: see `harness::domain`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::domain(data));
