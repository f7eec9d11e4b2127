//! See `ferry_fuzz::modules`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::modules::run(data));
