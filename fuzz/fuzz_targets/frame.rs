//! See `ferry_fuzz::frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::frame::run(data));
