//! See `ferry_fuzz::ring`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::ring::run(data));
