//! Fuzz target `pipeline`: see `harness::pipeline`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::pipeline(data));
