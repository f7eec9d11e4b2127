//! See `ferry_fuzz::cmsg`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fuzz::cmsg::run(data));
