//! Decoding of arbitrary bytes as SparseLoCo messages (see README.md and `decode_family`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_compress_fuzz::{decode_family, SPARSELOCO};

fuzz_target!(|data: &[u8]| decode_family(data, SPARSELOCO));
