//! Decoding of arbitrary bytes as randk messages (see README.md and `decode_family`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_compress_fuzz::{decode_family, RANDK};

fuzz_target!(|data: &[u8]| decode_family(data, RANDK));
