//! See `ferry_fuzz::binding`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::binding::run(data));
