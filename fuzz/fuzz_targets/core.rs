//! See `ferry_fuzz::core`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::core::run(data));
