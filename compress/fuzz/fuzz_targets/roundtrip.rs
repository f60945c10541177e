//! Compress fuzzer-chosen finite vectors with a fuzzer-chosen operator, then decode (see
//! README.md and `roundtrip`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| murmur_compress_fuzz::roundtrip(data));
