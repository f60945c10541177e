//! Shared code of the murmur-compress fuzz targets: the input layouts, the decoders'
//! contract, and the reference checks of the round trip. See README.md.
//!
//! # Decode targets (`decode_*`)
//!
//! ```text
//! byte 0..2  d = u16 LE mod 4097            (d ≤ MAX_DIM: allocations stay small)
//! byte 2     control: ≥ 0xF0 → the rest is the whole message (header parsing);
//!                     else operator = family[(control & 0x0F) mod len],
//!                          decode_add scale = −1 if control & 0x10 else +1
//! byte 3..   the payload, behind a valid header for that operator, d and length
//! ```
//!
//! [`check_decode`] asserts the contract: `validate` Ok ⇔ `decode_into` Ok ⇔ `decode_add`
//! Ok, with the same error; on Err both output buffers are untouched (filled with sentinels
//! first); on Ok the header is the message's, every decoded value is finite, `decode_into`
//! overwrote every coordinate, and `decode_add` added exactly `±1 ·` the decoded vector.
//!
//! # Round trip (`roundtrip`)
//!
//! ```text
//! byte 0     operator = ops[byte mod len] (ops: every operator, or $MURMUR_FUZZ_OPS)
//! byte 1, 2  p1, p2: the operator's parameters (see `operator`)
//! byte 3..11 seed of the encoder's RNG (u64 LE)
//! byte 11..  x: f32 LE, at most MAX_DIM; NaN and ±∞ become finite (exponent 254)
//! ```
//!
//! The message must be well formed (length, `encoded_len`, `max_encoded_len`, appended
//! after what `out` held) and must decode (contract as above); the decoded vector must
//! equal a reference for identity (x), top-k (x at the kept indices, 0 elsewhere, kept
//! |x| ≥ every dropped |x|, per tensor when layer-wise) and random-k (x or d/k·x at the
//! indices regenerated from the message's seed). The other operators' outputs are checked
//! against the bounds their docs state: approximate top-k keeps a top set of at most 2k;
//! fp16/bf16 are within their rounding error (fp16 saturating at ±65504); natural gives 0 or
//! one of the two powers of two around |x| with x's sign; TernGrad gives 0 or ±max|x| of
//! the bucket with x's sign; Sign gives ±(mean |x| of the bucket) with x's sign; QSGD gives
//! values within one level (‖x_b‖/s) of x with x's sign; SparseLoCo keeps in each chunk the
//! `min(k, c)` largest magnitudes but exact zeros, at no more than two levels with x's sign.
//!
//! `MURMUR_FUZZ_OPS=topk,randk` (names as `OperatorId::name`) restricts the round trip to
//! some operators, e.g. to focus a run, or to leave out placeholders.

use std::sync::OnceLock;

use murmur_compress::rng::randk_bitset;
use murmur_compress::{
    decode_add, decode_into, k_for_ratio, validate, ApproxTopK, Bf16, Compressor, DecodeError,
    Fp16, Identity, IndexCoding, MessageInfo, Natural, OperatorId, Qsgd, RandK, Sign, SparseLoco,
    TernGrad, TopK, HEADER_LEN, WIRE_VERSION,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Largest d a fuzz input makes.
pub const MAX_DIM: usize = 4096;
/// Control bytes from this value up make the rest of a decode input the whole message.
pub const RAW_CONTROL: u8 = 0xF0;

/// Decoder families, one per decode target.
pub const DENSE: &[OperatorId] = &[OperatorId::Identity, OperatorId::Fp16, OperatorId::Bf16];
/// Top-k, exact and approximate: the sparse payload.
pub const SPARSE: &[OperatorId] = &[OperatorId::TopK, OperatorId::ApproxTopK];
/// Random-k.
pub const RANDK: &[OperatorId] = &[OperatorId::RandK];
/// QSGD.
pub const QSGD: &[OperatorId] = &[OperatorId::Qsgd];
/// Scaled sign.
pub const SIGN: &[OperatorId] = &[OperatorId::Sign];
/// TernGrad.
pub const TERNGRAD: &[OperatorId] = &[OperatorId::TernGrad];
/// Natural compression.
pub const NATURAL: &[OperatorId] = &[OperatorId::Natural];
/// SparseLoCo: chunked top-k, 2-bit values, Rice-coded positions.
pub const SPARSELOCO: &[OperatorId] = &[OperatorId::SparseLoco];

/// Sentinel of `decode_into`'s output: a NaN, so a coordinate left unwritten on Ok shows.
const OUT_SENTINEL: u32 = 0x7fc0_0bad;
/// Sentinel of `decode_add`'s accumulator: finite, so the sum can be checked exactly.
const ACC_SENTINEL: f32 = 0.75;

/// A message with a valid header for `op`, `d` and the payload.
pub fn message(op: OperatorId, d: usize, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER_LEN + payload.len());
    m.push(op as u8);
    m.push(WIRE_VERSION);
    m.extend_from_slice(&0u16.to_le_bytes());
    m.extend_from_slice(&(d as u32).to_le_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    m.extend_from_slice(payload);
    m
}

/// The body of a decode target for one decoder family (layout in the crate docs).
pub fn decode_family(data: &[u8], family: &[OperatorId]) {
    let [d0, d1, control, rest @ ..] = data else {
        return;
    };
    let d = u16::from_le_bytes([*d0, *d1]) as usize % (MAX_DIM + 1);
    if *control >= RAW_CONTROL {
        let _ = check_decode(rest, d, 1.0);
    } else {
        let op = family[(control & 0x0F) as usize % family.len()];
        let scale = if control & 0x10 != 0 { -1.0 } else { 1.0 };
        let _ = check_decode(&message(op, d, rest), d, scale);
    }
}

/// Runs `validate`, `decode_into` and `decode_add` (with `scale` = ±1) on `msg` for a
/// receiver of dimension `d`, asserts their contract, and returns the decoded vector.
pub fn check_decode(
    msg: &[u8],
    d: usize,
    scale: f32,
) -> Result<(MessageInfo, Vec<f32>), DecodeError> {
    assert!(
        scale == 1.0 || scale == -1.0,
        "sums are checked exactly for ±1 only"
    );
    let checked = validate(msg, d);
    let mut out = vec![f32::from_bits(OUT_SENTINEL); d];
    let into = decode_into(msg, &mut out);
    let mut acc = vec![ACC_SENTINEL; d];
    let added = decode_add(msg, scale, &mut acc);
    match (checked, into, added) {
        (Ok(info), Ok(()), Ok(())) => {
            assert_eq!(info.header.operator as u8, msg[0], "operator of {info:?}");
            assert_eq!(info.header.dim, d, "dim of {info:?}");
            assert_eq!(info.header.payload_len, msg.len() - HEADER_LEN, "{info:?}");
            assert!(info.nnz <= d, "nnz {} > d = {d}", info.nnz);
            for (i, (&y, &a)) in out.iter().zip(&acc).enumerate() {
                assert!(
                    y.is_finite(),
                    "decode_into: coordinate {i} = {y} ({:#x})",
                    y.to_bits()
                );
                let want = ACC_SENTINEL + scale * y;
                assert!(
                    a == want,
                    "decode_add(scale {scale}) coordinate {i}: {a}, expected {ACC_SENTINEL} + {scale}·{y} = {want}"
                );
            }
            let nonzero = out.iter().filter(|&&y| y != 0.0).count();
            assert!(
                nonzero <= info.nnz,
                "{nonzero} non-zero values, nnz = {}",
                info.nnz
            );
            Ok((info, out))
        }
        (Err(e1), Err(e2), Err(e3)) => {
            assert_eq!(e1, e2, "validate and decode_into disagree on the error");
            assert_eq!(e1, e3, "validate and decode_add disagree on the error");
            assert!(
                out.iter().all(|y| y.to_bits() == OUT_SENTINEL),
                "decode_into wrote its output before refusing: {e1}"
            );
            assert!(
                acc.iter().all(|a| a.to_bits() == ACC_SENTINEL.to_bits()),
                "decode_add wrote its accumulator before refusing: {e1}"
            );
            Err(e1)
        }
        (checked, into, added) => {
            panic!("validate {checked:?}, decode_into {into:?}, decode_add {added:?} disagree")
        }
    }
}

/// An operator's parameters, as the round trip's reference checks need them.
#[derive(Debug, Clone)]
pub enum Spec {
    /// Identity.
    Identity,
    /// Exact top-k per tensor (one tensor of length d when not layer-wise).
    TopK { ratio: f64, layers: Vec<usize> },
    /// Approximate top-k.
    ApproxTopK { ratio: f64 },
    /// Random-k.
    RandK { ratio: f64, scaled: bool },
    /// QSGD.
    Qsgd { levels: u16, bucket: usize },
    /// Scaled sign (bucket = d for the whole vector).
    Sign { bucket: usize },
    /// TernGrad (bucket = d for the whole vector).
    TernGrad { bucket: usize },
    /// Natural compression.
    Natural,
    /// IEEE binary16.
    Fp16,
    /// bfloat16.
    Bf16,
    /// SparseLoCo: top `⌈ratio·chunk⌉` of each chunk, 2-bit values.
    SparseLoco { ratio: f64, chunk: usize },
}

/// A bucket size from a byte: 1 … 4065, small and larger than most fuzzed d.
fn bucket(p: u8) -> usize {
    1 + (p as usize * p as usize) / 16
}

/// The operator `op` with parameters from the bytes `p1`, `p2`, for vectors of length `d`:
///
/// - top-k: ratio (p1+1)/256; p2 bits 0–1 index coding (auto, fixed, delta, auto);
///   bit 7 layer-wise with tensors of 1 + (bits 2–6) coordinates, bit 6 of those an
///   empty tensor first;
/// - approximate top-k: ratio (p1+1)/256; p2 bits 0–1 coding, bits 2–7 sample hits − 1;
/// - random-k: ratio (p1+1)/256; scaled if p2 is odd;
/// - QSGD: s = p1 + 1 levels, bucket from p2;
/// - sign, TernGrad: the whole vector if p2 = 0, else a bucket from p2;
/// - SparseLoCo: ratio (p1+1)/256, chunk from p2 (as a bucket).
pub fn operator(op: OperatorId, p1: u8, p2: u8, d: usize) -> (Box<dyn Compressor>, Spec) {
    let ratio = (p1 as f64 + 1.0) / 256.0;
    let coding = [
        IndexCoding::Auto,
        IndexCoding::Fixed,
        IndexCoding::Delta,
        IndexCoding::Auto,
    ][(p2 & 3) as usize];
    match op {
        OperatorId::Identity => (Box::new(Identity), Spec::Identity),
        OperatorId::TopK if p2 & 0x80 != 0 => {
            let len = 1 + ((p2 >> 2) & 0x1f) as usize;
            let mut layers = Vec::new();
            if p2 & 0x40 != 0 {
                layers.push(0);
            }
            let mut left = d;
            while left > 0 {
                layers.push(len.min(left));
                left -= len.min(left);
            }
            let c = TopK::layerwise(ratio, layers.clone()).with_coding(coding);
            (Box::new(c), Spec::TopK { ratio, layers })
        }
        OperatorId::TopK => (
            Box::new(TopK::new(ratio).with_coding(coding)),
            Spec::TopK {
                ratio,
                layers: vec![d],
            },
        ),
        OperatorId::ApproxTopK => {
            let hits = 1 + (p2 >> 2) as usize;
            let c = ApproxTopK::new(ratio)
                .with_coding(coding)
                .with_sample_hits(hits);
            (Box::new(c), Spec::ApproxTopK { ratio })
        }
        OperatorId::RandK => {
            let scaled = p2 & 1 == 1;
            (
                Box::new(RandK::new(ratio, scaled)),
                Spec::RandK { ratio, scaled },
            )
        }
        OperatorId::Qsgd => {
            let (levels, bucket) = (p1 as u16 + 1, bucket(p2));
            (
                Box::new(Qsgd::new(levels, bucket)),
                Spec::Qsgd { levels, bucket },
            )
        }
        OperatorId::Sign => {
            let b = (p2 != 0).then(|| bucket(p2));
            (
                Box::new(Sign::new(b)),
                Spec::Sign {
                    bucket: b.unwrap_or(d),
                },
            )
        }
        OperatorId::TernGrad => {
            let b = (p2 != 0).then(|| bucket(p2));
            (
                Box::new(TernGrad::new(b)),
                Spec::TernGrad {
                    bucket: b.unwrap_or(d),
                },
            )
        }
        OperatorId::Natural => (Box::new(Natural::new()), Spec::Natural),
        OperatorId::Fp16 => (Box::new(Fp16::default()), Spec::Fp16),
        OperatorId::Bf16 => (Box::new(Bf16::default()), Spec::Bf16),
        OperatorId::SparseLoco => {
            let chunk = bucket(p2);
            (
                Box::new(SparseLoco::new(ratio, chunk)),
                Spec::SparseLoco { ratio, chunk },
            )
        }
        other => panic!("no fuzz operator for {other:?}"),
    }
}

/// The operators the round trip picks from: `$MURMUR_FUZZ_OPS` (comma-separated names) or
/// all of them.
pub fn roundtrip_ops() -> &'static [OperatorId] {
    static OPS: OnceLock<Vec<OperatorId>> = OnceLock::new();
    OPS.get_or_init(|| match std::env::var("MURMUR_FUZZ_OPS") {
        Ok(names) if !names.trim().is_empty() => names
            .split(',')
            .map(|n| {
                let n = n.trim();
                *OperatorId::ALL
                    .iter()
                    .find(|op| op.name() == n)
                    .unwrap_or_else(|| panic!("MURMUR_FUZZ_OPS: unknown operator {n:?}"))
            })
            .collect(),
        _ => OperatorId::ALL.to_vec(),
    })
}

/// `v` if finite, else the finite value with the same sign and mantissa and exponent 254.
pub fn finite(v: f32) -> f32 {
    if v.is_finite() {
        v
    } else {
        f32::from_bits(v.to_bits() & !(1 << 23))
    }
}

/// The body of the round-trip target (layout in the crate docs).
pub fn roundtrip(data: &[u8]) {
    let [sel, p1, p2, rest @ ..] = data else {
        return;
    };
    let Some((seed, values)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let x: Vec<f32> = values
        .chunks_exact(4)
        .take(MAX_DIM)
        .map(|c| finite(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    let d = x.len();
    let ops = roundtrip_ops();
    let op = ops[*sel as usize % ops.len()];
    let (mut c, spec) = operator(op, *p1, *p2, d);
    assert_eq!(c.id(), op);

    // Appends after what `out` already holds.
    const PREFIX: [u8; 3] = [0xA5; 3];
    let mut out = PREFIX.to_vec();
    let mut rng = StdRng::seed_from_u64(u64::from_le_bytes(*seed));
    let n = c.compress(&x, &mut rng, &mut out);
    assert_eq!(out[..3], PREFIX, "compress overwrote what out held");
    assert_eq!(n, out.len() - PREFIX.len(), "compress returned {n}");
    if let Some(len) = c.encoded_len(d) {
        assert_eq!(n, len, "{spec:?}: message of {n} bytes, encoded_len {len}");
    }
    let max = c.max_encoded_len(d);
    assert!(
        n <= max,
        "{spec:?}: message of {n} bytes > max_encoded_len {max}"
    );
    let msg = &out[PREFIX.len()..];

    // The one documented refusal of a finite x: a QSGD bucket whose ‖x_b‖₂ exceeds
    // f32::MAX has no finite norm to send (murmur_compress::Qsgd, "Non-finite input").
    // Within rounding of f32::MAX either outcome is right (the encoder's f64 sum order and
    // its rounding to f32 decide); clearly beyond it, the message must be refused.
    if let Spec::Qsgd { bucket, .. } = spec {
        let largest = x
            .chunks(bucket.max(1))
            .map(|b| b.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt())
            .fold(0.0, f64::max);
        if largest > f32::MAX as f64 * (1.0 - 1e-6) {
            match check_decode(msg, d, 1.0) {
                Err(DecodeError::NonFiniteScale { .. }) => return,
                Ok(_) if largest < f32::MAX as f64 * (1.0 + 1e-6) => {}
                other => panic!(
                    "{spec:?}: a bucket norm of {largest:e} must be refused, got {:?}",
                    other.map(|_| ())
                ),
            }
        }
    }

    let (info, y) = check_decode(msg, d, 1.0).unwrap_or_else(|e| {
        panic!("{spec:?}: message of a finite x of d = {d} does not decode: {e}")
    });
    assert_eq!(info.header.operator, op);
    check_reference(&spec, &x, &y, msg, info.nnz);
}

/// Compares the decoded `y` with what the operator `spec` may produce from `x`.
fn check_reference(spec: &Spec, x: &[f32], y: &[f32], msg: &[u8], nnz: usize) {
    let d = x.len();
    match spec {
        Spec::SparseLoco { ratio, chunk } => {
            // Per chunk: the min(k, c) largest magnitudes but exact zeros, each ±low or
            // ±high with x's sign; every dropped |x| at most the smallest kept one.
            let k = k_for_ratio(*ratio, *chunk);
            let mut total = 0;
            for (at, (xc, yc)) in x.chunks(*chunk).zip(y.chunks(*chunk)).enumerate() {
                let kept: Vec<usize> = (0..xc.len()).filter(|&i| yc[i] != 0.0).collect();
                let nonzero = xc.iter().filter(|v| **v != 0.0).count();
                assert_eq!(
                    kept.len(),
                    nonzero.min(k.min(xc.len())),
                    "sparseloco: chunk {at} kept {kept:?}, k = {k}"
                );
                let mut levels: Vec<u32> = kept.iter().map(|&i| yc[i].abs().to_bits()).collect();
                levels.sort_unstable();
                levels.dedup();
                assert!(
                    levels.len() <= 2,
                    "sparseloco: chunk {at}, levels {levels:?}"
                );
                let least = kept
                    .iter()
                    .map(|&i| xc[i].abs())
                    .fold(f32::INFINITY, f32::min);
                for i in 0..xc.len() {
                    if yc[i] != 0.0 {
                        assert_eq!(
                            yc[i] < 0.0,
                            xc[i] < 0.0,
                            "sparseloco: x = {} → {}, sign",
                            xc[i],
                            yc[i]
                        );
                    } else {
                        assert!(
                            xc[i].abs() <= least,
                            "sparseloco: dropped {} over kept {least}",
                            xc[i]
                        );
                    }
                }
                total += kept.len();
            }
            assert_eq!(total, nnz, "sparseloco: nnz");
        }
        Spec::Identity => {
            for i in 0..d {
                assert!(y[i] == x[i], "identity: y[{i}] = {} ≠ x = {}", y[i], x[i]);
            }
        }
        Spec::TopK { ratio, layers } => {
            let idx = sparse_indices(msg, d);
            assert_eq!(idx.len(), nnz);
            let mut base = 0;
            for &l in layers {
                let k = k_for_ratio(*ratio, l);
                let kept = check_top_set(x, y, &idx, base, base + l);
                assert_eq!(kept, k, "top-k of a tensor of {l} at {base}, ratio {ratio}");
                base += l;
            }
            assert_eq!(base, d);
        }
        Spec::ApproxTopK { ratio } => {
            let idx = sparse_indices(msg, d);
            assert_eq!(idx.len(), nnz);
            let k = k_for_ratio(*ratio, d);
            let kept = check_top_set(x, y, &idx, 0, d);
            assert!(
                kept <= (2 * k).min(d),
                "approximate top-k kept {kept} > 2k, k = {k}"
            );
        }
        Spec::RandK { ratio, scaled } => {
            let p = &msg[HEADER_LEN..];
            let k = u32::from_le_bytes(p[0..4].try_into().unwrap()) as usize;
            let seed = u64::from_le_bytes(p[8..16].try_into().unwrap());
            assert_eq!(k, k_for_ratio(*ratio, d), "random-k: k for ratio {ratio}");
            assert_eq!(nnz, k);
            let bits = randk_bitset(seed, k, d);
            let ones: u32 = bits.iter().map(|w| w.count_ones()).sum();
            assert_eq!(ones as usize, k, "random-k: {ones} indices of k = {k}");
            let scale = if *scaled && k > 0 {
                (d as f64 / k as f64) as f32
            } else {
                1.0
            };
            for i in 0..d {
                let want = if bits[i / 64] >> (i % 64) & 1 == 1 {
                    // Scaled values saturate at ±f32::MAX (see `RandK`).
                    (scale * x[i]).clamp(-f32::MAX, f32::MAX)
                } else {
                    0.0
                };
                assert!(y[i] == want, "random-k: y[{i}] = {}, expected {want}", y[i]);
            }
        }
        Spec::Fp16 => {
            for i in 0..d {
                let (x, y) = (x[i], y[i]);
                if x.abs() >= 65504.0 {
                    assert!(
                        y == 65504f32.copysign(x),
                        "fp16: x = {x} must saturate, got {y}"
                    );
                } else {
                    let err = (y - x).abs();
                    assert!(
                        err <= x.abs() * 2f32.powi(-11) + 2f32.powi(-24),
                        "fp16: x = {x} → {y}"
                    );
                }
            }
        }
        Spec::Bf16 => {
            for i in 0..d {
                let (x, y) = (x[i], y[i]);
                let err = (y as f64 - x as f64).abs();
                assert!(
                    err <= x.abs() as f64 * 2f64.powi(-8) + 2f64.powi(-133),
                    "bf16: x = {x} → {y}"
                );
            }
        }
        Spec::Natural => {
            for i in 0..d {
                let (x, y) = (x[i], y[i]);
                let (ax, ay) = (x.abs(), y.abs());
                if ay != 0.0 {
                    let bits = ay.to_bits();
                    assert!(
                        bits & 0x007f_ffff == 0 && bits >> 23 >= 1,
                        "natural: x = {x} → {y}, not a normal power of two"
                    );
                    if x != 0.0 {
                        assert_eq!(y < 0.0, x < 0.0, "natural: x = {x} → {y}, sign");
                    }
                }
                if ax >= f32::MIN_POSITIVE {
                    let lo = f32::from_bits(ax.to_bits() & 0x7f80_0000);
                    assert!(
                        ay == lo || ay == 2.0 * lo,
                        "natural: x = {x} → {y}, not {lo} or {}",
                        2.0 * lo
                    );
                } else {
                    assert!(
                        ay == 0.0 || ay == f32::MIN_POSITIVE,
                        "natural: x = {x} → {y}"
                    );
                }
            }
        }
        Spec::TernGrad { bucket } => {
            for (xb, yb) in x.chunks((*bucket).max(1)).zip(y.chunks((*bucket).max(1))) {
                let s = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (&x, &y) in xb.iter().zip(yb) {
                    let ok =
                        y == 0.0 || (x != 0.0 && y == s.copysign(x)) || (x == 0.0 && y.abs() == s);
                    assert!(ok, "terngrad: x = {x} → {y}, bucket max |x| = {s}");
                }
            }
        }
        Spec::Sign { bucket } => {
            for (xb, yb) in x.chunks((*bucket).max(1)).zip(y.chunks((*bucket).max(1))) {
                let mean = xb.iter().map(|v| v.abs() as f64).sum::<f64>() / xb.len() as f64;
                let c = yb[0].abs();
                for (&x, &y) in xb.iter().zip(yb) {
                    assert!(
                        y.abs() == c,
                        "sign: |y| not constant in its bucket ({y}, {c})"
                    );
                    assert!(
                        x == 0.0 || y == 0.0 || (x < 0.0) == (y < 0.0),
                        "sign: {x} → {y}"
                    );
                }
                assert!(
                    (c as f64 - mean).abs() <= 1e-3 * mean + f32::MIN_POSITIVE as f64,
                    "sign: scale {c}, mean |x| of the bucket {mean}"
                );
            }
        }
        Spec::Qsgd { levels, bucket } => {
            for (xb, yb) in x.chunks((*bucket).max(1)).zip(y.chunks((*bucket).max(1))) {
                let norm = xb.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
                let step = norm / *levels as f64;
                let slack = 1e-3 * step + f32::MIN_POSITIVE as f64;
                for (&x, &y) in xb.iter().zip(yb) {
                    let (ax, ay) = (x.abs() as f64, y.abs() as f64);
                    assert!(ay <= norm + slack, "qsgd: {x} → {y}, bucket norm {norm}");
                    assert!(
                        (ay - ax).abs() <= step + slack,
                        "qsgd: {x} → {y}, level {step}"
                    );
                    if x != 0.0 && y != 0.0 {
                        assert_eq!(y < 0.0, x < 0.0, "qsgd: {x} → {y}, sign");
                    }
                }
            }
        }
    }
}

/// The indices of a (validated) top-k message, parsed independently of the crate.
fn sparse_indices(msg: &[u8], d: usize) -> Vec<usize> {
    let p = &msg[HEADER_LEN..];
    let k = u32::from_le_bytes(p[0..4].try_into().unwrap()) as usize;
    let coding = p[4];
    let mut at = 8;
    let mut idx: Vec<usize> = Vec::with_capacity(k);
    for _ in 0..k {
        let i = match coding {
            0 => {
                at += 2;
                u16::from_le_bytes([p[at - 2], p[at - 1]]) as usize
            }
            1 => {
                at += 4;
                u32::from_le_bytes(p[at - 4..at].try_into().unwrap()) as usize
            }
            2 => {
                let (mut v, mut shift) = (0usize, 0);
                loop {
                    let b = p[at];
                    at += 1;
                    v |= ((b & 0x7f) as usize) << shift;
                    if b & 0x80 == 0 {
                        break;
                    }
                    shift += 7;
                }
                idx.last().map_or(v, |&prev| prev + v + 1)
            }
            c => panic!("top-k: coding {c} in a validated message"),
        };
        assert!(
            i < d && idx.last().is_none_or(|&prev| prev < i),
            "index {i}"
        );
        idx.push(i);
    }
    assert_eq!(p.len(), at + 4 * k, "top-k payload length");
    idx
}

/// Checks that on `lo..hi`, `y` is `x` at the kept indices and 0 elsewhere, and that every
/// kept |x| is at least every dropped |x|. Returns the number kept there.
fn check_top_set(x: &[f32], y: &[f32], idx: &[usize], lo: usize, hi: usize) -> usize {
    let mut kept = vec![false; hi - lo];
    for &i in idx.iter().filter(|&&i| (lo..hi).contains(&i)) {
        kept[i - lo] = true;
    }
    let (mut min_kept, mut max_dropped) = (f32::INFINITY, 0f32);
    for i in lo..hi {
        if kept[i - lo] {
            assert!(y[i] == x[i], "top-k: kept y[{i}] = {} ≠ x = {}", y[i], x[i]);
            min_kept = min_kept.min(x[i].abs());
        } else {
            assert!(y[i] == 0.0, "top-k: dropped y[{i}] = {}", y[i]);
            max_dropped = max_dropped.max(x[i].abs());
        }
    }
    assert!(
        min_kept >= max_dropped,
        "top-k on {lo}..{hi}: kept |x| down to {min_kept}, dropped |x| up to {max_dropped}"
    );
    kept.iter().filter(|&&k| k).count()
}
