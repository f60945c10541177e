//! Decoding of arbitrary bytes as sign messages (see README.md and `decode_family`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_compress_fuzz::{decode_family, SIGN};

fuzz_target!(|data: &[u8]| decode_family(data, SIGN));
