//! Writes a seed corpus for every fuzz target, made by the crate's own encoders, so that the
//! fuzzer starts from valid messages of every operator, parameter set and index coding.
//!
//! ```text
//! cd compress/fuzz && cargo run --example seed_corpus [CORPUS_DIR]    # default: corpus
//! ```
//!
//! Writes `CORPUS_DIR/<target>/seed-*` (existing files of the same names are replaced).
//! Re-run it after an operator's encoder changes.

use std::path::{Path, PathBuf};

use murmur_compress::{Compressor, OperatorId, HEADER_LEN};
use murmur_compress_fuzz::{
    operator, DENSE, NATURAL, QSGD, RANDK, RAW_CONTROL, SIGN, SPARSE, SPARSELOCO, TERNGRAD,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Dimensions of the seeds.
const DIMS: [usize; 6] = [0, 1, 3, 17, 100, 1000];
/// Parameter bytes (p1, p2) tried for every operator: small and large ratios, levels and
/// buckets, every index coding, layer-wise top-k, scaled random-k.
const PARAMS: [(u8, u8); 6] = [
    (0, 0),
    (2, 1),
    (25, 2),
    (127, 3),
    (255, 0x80 | 0x40 | 12),
    (7, 200),
];

/// A deterministic, varied test vector: mixed signs and magnitudes, some zeros.
fn vector(d: usize) -> Vec<f32> {
    (0..d)
        .map(|i| {
            if i % 11 == 5 {
                0.0
            } else {
                (i as f32 * 0.618).sin() * (1 + i % 7) as f32 * 10f32.powi(i as i32 % 5 - 2)
            }
        })
        .collect()
}

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).expect("create corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
}

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let families: [(&str, &[OperatorId]); 8] = [
        ("decode_dense", DENSE),
        ("decode_sparse", SPARSE),
        ("decode_randk", RANDK),
        ("decode_qsgd", QSGD),
        ("decode_sign", SIGN),
        ("decode_terngrad", TERNGRAD),
        ("decode_natural", NATURAL),
        ("decode_sparseloco", SPARSELOCO),
    ];
    let mut count = 0;
    for (target, family) in families {
        for (slot, &op) in family.iter().enumerate() {
            for d in DIMS {
                for (p1, p2) in PARAMS {
                    let x = vector(d);
                    let (mut c, _) = operator(op, p1, p2, d);
                    let mut msg = Vec::new();
                    c.compress(&x, &mut StdRng::seed_from_u64(7), &mut msg);
                    let name = format!("{}-d{d}-{p1}-{p2}", op.name());
                    // Header made by the target, payload from the encoder.
                    let mut input = (d as u16).to_le_bytes().to_vec();
                    input.push(slot as u8);
                    input.extend_from_slice(&msg[HEADER_LEN..]);
                    write(&root, target, &name, &input);
                    // The whole message, header included.
                    let mut raw = (d as u16).to_le_bytes().to_vec();
                    raw.push(RAW_CONTROL);
                    raw.extend_from_slice(&msg);
                    write(&root, target, &format!("{name}-raw"), &raw);
                    count += 2;
                }
            }
        }
    }
    for (sel, op) in OperatorId::ALL.iter().enumerate() {
        for d in [1, 7, 64, 300] {
            for (p1, p2) in PARAMS {
                let mut input = vec![sel as u8, p1, p2];
                input.extend_from_slice(&42u64.to_le_bytes());
                for v in vector(d) {
                    input.extend_from_slice(&v.to_le_bytes());
                }
                write(
                    &root,
                    "roundtrip",
                    &format!("{}-d{d}-{p1}-{p2}", op.name()),
                    &input,
                );
                count += 1;
            }
        }
    }
    eprintln!("wrote {count} seeds under {}", root.display());
}
