//! See `ferry_fuzz::server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::server::run(data));
