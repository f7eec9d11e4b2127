//! See `ferry_fuzz::records`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::records::run(data));
