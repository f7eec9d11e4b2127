//! See `ferry_fuzz::dns`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::dns::run(data));
