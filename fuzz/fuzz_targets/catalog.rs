//! Fuzz target `catalog`: see `harness::catalog`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::catalog(data));
