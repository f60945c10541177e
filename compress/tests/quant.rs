//! Quantisers through the public API: exact round trips against a reference written from
//! the documented formulas, the wire bytes of hand-computed messages, unbiasedness and
//! variance, every decoder defect, accumulation, and arbitrary bytes.

use murmur_compress::rng::{Dither, SplitMix64};
use murmur_compress::{
    decode_add, decode_into, validate, Compressor, DecodeError, Int8, Natural, Qsgd, Sign,
    TernGrad, HEADER_LEN,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------
// Reference implementations (straightforward, from the module docs)
// ---------------------------------------------------------------------------------------

/// u_i for i < d: output i of Dither(seed) as a 24-bit uniform.
fn uniforms(seed: u64, d: usize) -> Vec<f32> {
    let mut raw = vec![0u32; d];
    Dither::new(seed).fill(&mut raw);
    raw.iter()
        .map(|&r| (r >> 8) as f32 / (1u32 << 24) as f32)
        .collect()
}

/// f64 sum over eight interleaved lanes, combined ((0+1)+(2+3))+((4+5)+(6+7)).
fn lane_sum(values: impl Iterator<Item = f64>) -> f64 {
    let mut l = [0f64; 8];
    for (j, v) in values.enumerate() {
        l[j % 8] += v;
    }
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

fn qsgd_norm(xb: &[f32]) -> f32 {
    lane_sum(xb.iter().map(|&v| v as f64 * v as f64)).sqrt() as f32
}

/// QSGD levels (signed) and decoded values.
fn ref_qsgd(x: &[f32], s: u16, bucket: usize, seed: u64) -> Vec<f32> {
    let u = uniforms(seed, x.len());
    let mut out = Vec::with_capacity(x.len());
    for (b, xb) in x.chunks(bucket).enumerate() {
        let norm = qsgd_norm(xb);
        for (k, &v) in xb.iter().enumerate() {
            let i = b * bucket + k;
            if norm == 0.0 {
                out.push(0.0);
                continue;
            }
            let inv = s as f32 / norm;
            let r = if inv.is_finite() {
                v.abs() * inv
            } else {
                (v.abs() / norm) * s as f32
            };
            let l = (r + u[i]).min(s as f32).floor() as u32;
            let q = norm * (l as f32 / s as f32);
            out.push(if v < 0.0 { -q } else { q });
        }
    }
    out
}

fn sign_bucket(bucket: Option<usize>, d: usize) -> usize {
    bucket.unwrap_or(d).max(1)
}

fn ref_sign(x: &[f32], bucket: Option<usize>) -> Vec<f32> {
    let mut out = Vec::new();
    for xb in x.chunks(sign_bucket(bucket, x.len())) {
        let scale = (lane_sum(xb.iter().map(|v| v.abs() as f64)) / xb.len() as f64) as f32;
        out.extend(xb.iter().map(|&v| if v < 0.0 { -scale } else { scale }));
    }
    out
}

fn ref_terngrad(x: &[f32], bucket: Option<usize>, seed: u64) -> Vec<f32> {
    let u = uniforms(seed, x.len());
    let bucket = sign_bucket(bucket, x.len());
    let mut out = Vec::new();
    for (b, xb) in x.chunks(bucket).enumerate() {
        let scale = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (k, &v) in xb.iter().enumerate() {
            let keep = scale > 0.0 && u[b * bucket + k] < v.abs() / scale;
            out.push(match (keep, v < 0.0) {
                (false, _) => 0.0,
                (true, false) => scale,
                (true, true) => -scale,
            });
        }
    }
    out
}

fn ref_natural(x: &[f32], seed: u64) -> Vec<f32> {
    let u = uniforms(seed, x.len());
    x.iter()
        .zip(u)
        .map(|(&v, u)| {
            let a = v.abs();
            let q = if a < f32::MIN_POSITIVE {
                if u < a / f32::MIN_POSITIVE {
                    f32::MIN_POSITIVE
                } else {
                    0.0
                }
            } else {
                let e = a.to_bits() >> 23;
                let low = f32::from_bits(e << 23);
                if u < (a - low) / low && e < 254 {
                    2.0 * low
                } else {
                    low
                }
            };
            if v < 0.0 {
                -q
            } else {
                q
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Compresses `x` after a 3-byte prefix, checks the returned size against the slice
/// appended and against `encoded_len`/`max_encoded_len`, and returns the message.
fn encode(op: &mut dyn Compressor, x: &[f32], seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = vec![0xAA; 3];
    let n = op.compress(x, &mut rng, &mut out);
    assert_eq!(&out[..3], &[0xAA; 3], "compress must append");
    let msg = out.split_off(3);
    assert_eq!(n, msg.len());
    match op.encoded_len(x.len()) {
        // Fixed-size codes: exactly the size stated, which is also the bound.
        Some(len) => {
            assert_eq!(len, n);
            assert_eq!(op.max_encoded_len(x.len()), n);
        }
        // SparseLoCo's Rice-coded positions: within the bound.
        None => assert!(n <= op.max_encoded_len(x.len())),
    }
    assert_eq!(msg[0], op.id() as u8);
    assert_eq!(msg[1], 1);
    assert_eq!(
        u32::from_le_bytes(msg[4..8].try_into().unwrap()) as usize,
        x.len()
    );
    assert_eq!(
        u32::from_le_bytes(msg[8..12].try_into().unwrap()) as usize,
        n - HEADER_LEN
    );
    msg
}

/// The seed an operator draws from `StdRng::seed_from_u64(seed)`.
fn drawn_seed(seed: u64) -> u64 {
    StdRng::seed_from_u64(seed).next_u64()
}

fn decoded(msg: &[u8], d: usize) -> Vec<f32> {
    let info = validate(msg, d).expect("valid message");
    assert_eq!(info.nnz, d);
    let mut out = vec![f32::NAN; d];
    decode_into(msg, &mut out).expect("decodes");
    out
}

/// `decode_into` of `C(x)` is `0.0 + C(x)_i` (which only turns −0.0 into +0.0), bit for bit.
fn assert_exact(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            (0.0 + w).to_bits(),
            "coordinate {i}: got {g:e}, want {w:e}"
        );
    }
}

/// The message with its payload replaced (header length patched).
fn with_payload(msg: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut m = msg[..HEADER_LEN].to_vec();
    m[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    m.extend_from_slice(payload);
    m
}

/// Asserts that `msg` is refused with `want` by every entry point, leaving buffers as
/// they were.
fn assert_refused(msg: &[u8], d: usize, want: DecodeError) {
    assert_eq!(validate(msg, d).map(|_| ()), Err(want.clone()));
    let sentinel: Vec<f32> = (0..d).map(|i| 7.25 + i as f32).collect();
    let mut acc = sentinel.clone();
    assert_eq!(decode_add(msg, 0.5, &mut acc), Err(want.clone()));
    assert_eq!(acc, sentinel, "acc touched by a refused message");
    assert_eq!(decode_into(msg, &mut acc), Err(want));
    assert_eq!(acc, sentinel, "out touched by a refused message");
}

/// Sets payload byte `at` of `msg` (after the header).
fn poke(msg: &[u8], at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut m = msg.to_vec();
    m[HEADER_LEN + at..HEADER_LEN + at + bytes.len()].copy_from_slice(bytes);
    m
}

// ---------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------

/// Values with zeros, both signs, and magnitudes 2^lo ..= 2^hi (subnormals when lo < −126).
fn value(lo: i32, hi: i32) -> impl Strategy<Value = f32> {
    prop_oneof![
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        2 => -10.0f32..10.0,
        6 => (any::<bool>(), lo..=hi, 1.0f64..2.0).prop_map(|(neg, e, m)| {
            let v = (m * 2f64.powi(e)) as f32;
            if neg { -v } else { v }
        }),
    ]
}

/// Vectors of length 0..300 whose bucket norms stay finite.
fn vector() -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        3 => proptest::collection::vec(value(-140, 100), 0..300),
        1 => proptest::collection::vec(Just(0.0f32), 0..40),
    ]
}

fn bucket() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), 2usize..20, 20usize..400, Just(usize::MAX)]
}

fn levels() -> impl Strategy<Value = u16> {
    prop_oneof![
        1u16..=20,
        Just(127u16),
        Just(255u16),
        Just(256u16),
        256u16..=u16::MAX,
        Just(u16::MAX)
    ]
}

// ---------------------------------------------------------------------------------------
// 1. Exact round trips
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn qsgd_round_trip_is_exact(x in vector(), s in levels(), b in bucket(), seed in any::<u64>()) {
        let mut op = Qsgd::new(s, b);
        let msg = encode(&mut op, &x, seed);
        assert_exact(&decoded(&msg, x.len()), &ref_qsgd(&x, s, b, drawn_seed(seed)));
    }

    #[test]
    fn sign_round_trip_is_exact(x in vector(), b in proptest::option::of(bucket()), seed in any::<u64>()) {
        let mut op = Sign::new(b);
        let msg = encode(&mut op, &x, seed);
        assert_exact(&decoded(&msg, x.len()), &ref_sign(&x, b));
    }

    #[test]
    fn terngrad_round_trip_is_exact(x in vector(), b in proptest::option::of(bucket()), seed in any::<u64>()) {
        let mut op = TernGrad::new(b);
        let msg = encode(&mut op, &x, seed);
        assert_exact(&decoded(&msg, x.len()), &ref_terngrad(&x, b, drawn_seed(seed)));
    }

    #[test]
    fn natural_round_trip_is_exact(
        x in proptest::collection::vec(
            prop_oneof![4 => value(-149, 127), 1 => Just(f32::MAX), 1 => Just(-f32::MAX)], 0..300),
        seed in any::<u64>(),
    ) {
        let mut op = Natural::new();
        let msg = encode(&mut op, &x, seed);
        assert_exact(&decoded(&msg, x.len()), &ref_natural(&x, drawn_seed(seed)));
    }
}

#[test]
fn round_trips_across_block_boundaries() {
    // Lengths around the internal block size and byte/group boundaries.
    let mut g = SplitMix64::new(3);
    for d in [1023usize, 1024, 1025, 2047, 2048, 2049, 3001, 5000] {
        let x: Vec<f32> = (0..d)
            .map(|_| {
                let (a, b) = g.unit_pair();
                (a - 0.5) * 2f32.powi((b * 20.0) as i32 - 10)
            })
            .collect();
        for (s, b) in [
            (1u16, 512usize),
            (7, 100),
            (255, 1000),
            (300, 4096),
            (65535, 77),
        ] {
            let msg = encode(&mut Qsgd::new(s, b), &x, d as u64);
            assert_exact(&decoded(&msg, d), &ref_qsgd(&x, s, b, drawn_seed(d as u64)));
        }
        for b in [None, Some(1000), Some(333)] {
            let msg = encode(&mut Sign::new(b), &x, 1);
            assert_exact(&decoded(&msg, d), &ref_sign(&x, b));
            let msg = encode(&mut TernGrad::new(b), &x, 2);
            assert_exact(&decoded(&msg, d), &ref_terngrad(&x, b, drawn_seed(2)));
        }
        let msg = encode(&mut Natural::new(), &x, 4);
        assert_exact(&decoded(&msg, d), &ref_natural(&x, drawn_seed(4)));
    }
}

#[test]
fn random_operators_draw_one_seed_and_sign_none() {
    let x = [0.5f32, -1.0, 2.0];
    let ops: Vec<(Box<dyn Compressor>, usize)> = vec![
        (Box::new(Qsgd::new(4, 2)), 1),
        (Box::new(TernGrad::new(None)), 1),
        (Box::new(Natural::new()), 1),
        (Box::new(Sign::new(None)), 0),
    ];
    for (mut op, draws) in ops {
        for d in [0, 3] {
            let mut rng = StdRng::seed_from_u64(9);
            op.compress(&x[..d], &mut rng, &mut Vec::new());
            let mut replay = StdRng::seed_from_u64(9);
            for _ in 0..draws {
                replay.next_u64();
            }
            assert_eq!(rng.next_u64(), replay.next_u64(), "{:?}", op.id());
        }
    }
}

#[test]
fn operator_flags_and_accessors() {
    let q = Qsgd::new(255, 512);
    assert_eq!((q.levels(), q.bucket(), q.code_bits()), (255, 512, 9));
    assert_eq!(Qsgd::new(1, 1).code_bits(), 2);
    assert_eq!(Qsgd::new(256, 1).code_bits(), 10);
    assert_eq!(Qsgd::new(u16::MAX, 1).code_bits(), 17);
    assert!(q.unbiased() && TernGrad::new(None).unbiased() && Natural::new().unbiased());
    assert!(!Sign::new(None).unbiased());
    assert_eq!(Sign::new(Some(8)).bucket(), Some(8));
    assert_eq!(TernGrad::default().bucket(), None);
    assert_eq!(Natural::default(), Natural::new());
    // Message sizes: header + parameters + scales + packed codes.
    assert_eq!(q.encoded_len(1000), Some(12 + 8 + 4 * 2 + 1125));
    assert_eq!(Sign::new(None).encoded_len(1000), Some(12 + 4 + 4 + 125));
    assert_eq!(
        Sign::new(Some(300)).encoded_len(1000),
        Some(12 + 4 + 16 + 125)
    );
    assert_eq!(
        TernGrad::new(Some(10)).encoded_len(1001),
        Some(12 + 4 + 404 + 251)
    );
    assert_eq!(Natural::new().encoded_len(1001), Some(12 + 1001 + 126));
    assert_eq!(Sign::new(None).encoded_len(0), Some(16));
}

#[test]
#[should_panic(expected = "at least one level")]
fn qsgd_zero_levels_panics() {
    Qsgd::new(0, 8);
}

#[test]
#[should_panic(expected = "bucket size must be at least 1")]
fn qsgd_zero_bucket_panics() {
    Qsgd::new(4, 0);
}

#[test]
#[should_panic(expected = "bucket size must be at least 1")]
fn sign_zero_bucket_panics() {
    Sign::new(Some(0));
}

#[test]
#[should_panic(expected = "bucket size must be at least 1")]
fn terngrad_zero_bucket_panics() {
    TernGrad::new(Some(0));
}

// ---------------------------------------------------------------------------------------
// Wire bytes of hand-computed messages
// ---------------------------------------------------------------------------------------

fn header(op: u8, d: u32, payload: u32) -> Vec<u8> {
    let mut h = vec![op, 1, 0, 0];
    h.extend_from_slice(&d.to_le_bytes());
    h.extend_from_slice(&payload.to_le_bytes());
    h
}

#[test]
fn qsgd_wire_bytes() {
    // x = [0, −5], s = 2: norm 5, r = [0, 2] (no fraction, so no randomness).
    // Codes of 3 bits: 0b000, (2 << 1) | 1 = 0b101 → byte 0b101_000.
    let msg = encode(&mut Qsgd::new(2, 2), &[0.0, -5.0], 1);
    let mut want = header(4, 2, 13);
    want.extend_from_slice(&[2, 0, 2, 0, 2, 0, 0, 0]);
    want.extend_from_slice(&5.0f32.to_le_bytes());
    want.push(0b0010_1000);
    assert_eq!(msg, want);
    assert_eq!(decoded(&msg, 2), vec![0.0, -5.0]);
}

#[test]
fn sign_wire_bytes() {
    // ‖x‖₁/d = 10/5 = 2; negative at 1 and 3 (0 counts as positive).
    let msg = encode(&mut Sign::new(None), &[1.0, -2.0, 3.0, -4.0, 0.0], 1);
    let mut want = header(5, 5, 9);
    want.extend_from_slice(&5u32.to_le_bytes());
    want.extend_from_slice(&2.0f32.to_le_bytes());
    want.push(0b0000_1010);
    assert_eq!(msg, want);
    assert_eq!(decoded(&msg, 5), vec![2.0, -2.0, 2.0, -2.0, 2.0]);
}

#[test]
fn terngrad_wire_bytes() {
    // max |x| = 2 and every |x_i| ∈ {0, 2}: deterministic codes 1, 2, 0, 1, 1.
    let msg = encode(&mut TernGrad::new(None), &[2.0, -2.0, 0.0, 2.0, 2.0], 1);
    let mut want = header(6, 5, 10);
    want.extend_from_slice(&5u32.to_le_bytes());
    want.extend_from_slice(&2.0f32.to_le_bytes());
    want.extend_from_slice(&[0b01_00_10_01, 0b01]);
    assert_eq!(msg, want);
}

#[test]
fn natural_wire_bytes() {
    // Powers of two are exact: exponents 127, 126, 0, 129; sign bit 1 for −0.5.
    let x = [1.0f32, -0.5, 0.0, 4.0];
    let msg = encode(&mut Natural::new(), &x, 1);
    let mut want = header(7, 4, 5);
    want.extend_from_slice(&[127, 126, 0, 129, 0b0010]);
    assert_eq!(msg, want);
    assert_eq!(decoded(&msg, 4), x.to_vec());
}

#[test]
fn natural_saturates_at_2_pow_127() {
    let big = f32::from_bits(254 << 23) * 1.75; // 1.75 · 2^127
    for seed in 0..64 {
        let msg = encode(&mut Natural::new(), &[big, -f32::MAX], seed);
        assert_eq!(decoded(&msg, 2), vec![2f32.powi(127), -(2f32.powi(127))]);
    }
}

// ---------------------------------------------------------------------------------------
// 2. Unbiasedness and 3. variance
// ---------------------------------------------------------------------------------------

/// A fixed x: 50 coordinates over ten orders of magnitude, both signs, a zero, and a few
/// exact powers of two.
fn fixed_x() -> Vec<f32> {
    let mut g = SplitMix64::new(77);
    let mut x: Vec<f32> = (0..50)
        .map(|i| {
            let (a, b) = g.unit_pair();
            let sign = if b < 0.5 { -1.0 } else { 1.0 };
            sign * (1.0 + a) * 10f32.powi(i % 10 - 5)
        })
        .collect();
    x[7] = 0.0;
    x[13] = 0.25;
    x[31] = -8.0;
    x
}

/// Mean of C(x) and of ‖C(x) − x‖² (with the standard error of the latter) over `n` draws.
fn moments(op: &mut dyn Compressor, x: &[f32], n: usize) -> (Vec<f64>, f64, f64) {
    let d = x.len();
    let mut rng = StdRng::seed_from_u64(2024);
    let mut msg = Vec::new();
    let mut out = vec![0f32; d];
    let mut mean = vec![0f64; d];
    let (mut e, mut e2) = (0f64, 0f64);
    for _ in 0..n {
        msg.clear();
        op.compress(x, &mut rng, &mut msg);
        decode_into(&msg, &mut out).unwrap();
        let mut err = 0f64;
        for i in 0..d {
            mean[i] += out[i] as f64;
            let diff = out[i] as f64 - x[i] as f64;
            err += diff * diff;
        }
        e += err;
        e2 += err * err;
    }
    let n = n as f64;
    mean.iter_mut().for_each(|m| *m /= n);
    let (e, e2) = (e / n, e2 / n);
    (mean, e, ((e2 - e * e).max(0.0) / n).sqrt())
}

/// Asserts that every mean_i is x_i within a Bernstein bound. C(x)_i takes one of two
/// values `step_i` apart, so n·mean_i is a binomial count (shifted and scaled) of variance
/// n·var_i/step_i²; Bernstein's inequality gives |mean_i − x_i| ≤ (step_i·t/3 +
/// √((step_i·t/3)² + 2t·n·var_i))/n except with probability 2e^(−t). With t = 22 that is
/// below 10⁻⁷ over all coordinates of all calls, about 6.6 σ_i/√n where the counts are
/// large, yet wide enough for rare events (the normal approximation is not). Added: the
/// rounding of the `f32` arithmetic (10⁻⁶|x_i|) and the 24-bit resolution of the uniforms
/// (≤ 2⁻²⁴·step_i).
fn assert_unbiased(mean: &[f64], x: &[f32], var: &[f64], step: &[f64], n: usize) {
    let t = 22.0;
    let n_f = n as f64;
    for i in 0..x.len() {
        let xi = x[i] as f64;
        let a = step[i] * t / 3.0;
        let tol = (a + (a * a + 2.0 * t * n_f * var[i]).sqrt()) / n_f
            + 1e-6 * xi.abs()
            + step[i] * 2f64.powi(-22);
        assert!(
            (mean[i] - xi).abs() <= tol,
            "coordinate {i}: mean {} vs x {xi}, tolerance {tol}",
            mean[i]
        );
    }
}

const DRAWS: usize = 20_000;

/// Per coordinate: (exact variance, step) of QSGD with s levels and buckets of `b`.
fn qsgd_var(x: &[f32], s: u16, b: usize) -> (Vec<f64>, Vec<f64>) {
    let mut var = Vec::new();
    let mut step = Vec::new();
    for xb in x.chunks(b) {
        let norm = xb.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        for &v in xb {
            let h = norm / s as f64;
            let r = v.abs() as f64 / h;
            let f = r - r.floor();
            var.push(h * h * f * (1.0 - f));
            step.push(h);
        }
    }
    (var, step)
}

#[test]
fn qsgd_is_unbiased() {
    let x = fixed_x();
    for (s, b) in [(1u16, 50usize), (4, 16), (255, 7)] {
        let (mean, _, _) = moments(&mut Qsgd::new(s, b), &x, DRAWS);
        let (var, step) = qsgd_var(&x, s, b);
        assert_unbiased(&mean, &x, &var, &step, DRAWS);
    }
}

#[test]
fn terngrad_is_unbiased() {
    let x = fixed_x();
    for b in [None, Some(8)] {
        let (mean, _, _) = moments(&mut TernGrad::new(b), &x, DRAWS);
        let (var, step) = terngrad_var(&x, b);
        assert_unbiased(&mean, &x, &var, &step, DRAWS);
    }
}

/// Per coordinate: (exact variance s_b|x| − x², step s_b) of TernGrad.
fn terngrad_var(x: &[f32], b: Option<usize>) -> (Vec<f64>, Vec<f64>) {
    let mut var = Vec::new();
    let mut step = Vec::new();
    for xb in x.chunks(sign_bucket(b, x.len())) {
        let m = xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        for &v in xb {
            let a = v.abs() as f64;
            var.push(m * a - a * a);
            step.push(m);
        }
    }
    (var, step)
}

/// Per coordinate: (exact variance (2^(e+1) − |x|)(|x| − 2^e), step 2^e) of natural
/// compression.
fn natural_var(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    x.iter()
        .map(|&v| {
            let a = v.abs() as f64;
            if a == 0.0 {
                return (0.0, 0.0);
            }
            let low = 2f64.powi(a.log2().floor() as i32);
            ((2.0 * low - a) * (a - low), low)
        })
        .unzip()
}

#[test]
fn natural_is_unbiased() {
    let x = fixed_x();
    let (mean, _, _) = moments(&mut Natural::new(), &x, DRAWS);
    let (var, step) = natural_var(&x);
    assert_unbiased(&mean, &x, &var, &step, DRAWS);
}

fn norm_sq(x: &[f32]) -> f64 {
    x.iter().map(|&v| v as f64 * v as f64).sum()
}

#[test]
fn qsgd_variance_is_within_its_bound() {
    let x = fixed_x();
    let n = 4000;
    for (s, b) in [(1u16, 50usize), (2, 50), (4, 16), (15, 50), (255, 7)] {
        let op = Qsgd::new(s, b);
        let (_, e, se) = moments(&mut op.clone(), &x, n);
        let (var, _) = qsgd_var(&x, s, b);
        let exact: f64 = var.iter().sum();
        let bound = op.variance_factor(x.len()) * norm_sq(&x);
        assert!(
            (e - exact).abs() <= 5.0 * se + 1e-9 * bound,
            "s={s} b={b}: {e} vs {exact}"
        );
        assert!(e <= bound + 4.0 * se, "s={s} b={b}: {e} > {bound}");
        assert!(exact <= bound, "s={s} b={b}: exact {exact} > {bound}");
    }
}

#[test]
fn terngrad_variance_matches_its_formula() {
    let x = fixed_x();
    for b in [None, Some(8)] {
        let (_, e, se) = moments(&mut TernGrad::new(b), &x, 4000);
        let (var, _) = terngrad_var(&x, b);
        let exact: f64 = var.iter().sum();
        assert!(
            (e - exact).abs() <= 5.0 * se + 1e-9,
            "{b:?}: {e} vs {exact}"
        );
    }
}

#[test]
fn natural_variance_is_within_its_bound() {
    // |x| = (4/3)·2^e attains the bound ω = 1/8 exactly; the fixed x is well inside it.
    let tight: Vec<f32> = (0..40)
        .map(|i| (4.0 / 3.0) * 2f32.powi(i - 20) * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    for x in [fixed_x(), tight] {
        let (_, e, se) = moments(&mut Natural::new(), &x, 4000);
        let (var, _) = natural_var(&x);
        let exact: f64 = var.iter().sum();
        let bound = norm_sq(&x) / 8.0;
        assert!(
            (e - exact).abs() <= 5.0 * se + 1e-9 * bound,
            "{e} vs {exact}"
        );
        assert!(e <= bound + 4.0 * se, "{e} > {bound}");
        assert!(exact <= bound * (1.0 + 1e-6), "exact {exact} > {bound}");
    }
}

/// Per bucket: ‖x_b − C(x)_b‖² = (1 − δ_b)‖x_b‖² with δ_b = ‖x_b‖₁²/(|b|‖x_b‖²), up to
/// the rounding of the scale to `f32`: with m = ‖x_b‖₁/|b| and c the scale sent,
/// Σ(|x_i| − c)² = Σ(|x_i| − m)² + |b|(c − m)² exactly, and |c − m| is at most half an
/// ulp of m (2⁻¹⁵⁰ for subnormal scales).
fn assert_sign_contraction(x: &[f32], b: Option<usize>) {
    let msg = encode(&mut Sign::new(b), x, 0);
    let c = decoded(&msg, x.len());
    let bucket = sign_bucket(b, x.len());
    for (xb, cb) in x.chunks(bucket).zip(c.chunks(bucket)) {
        let n = xb.len() as f64;
        let nsq = norm_sq(xb);
        let l1: f64 = xb.iter().map(|v| v.abs() as f64).sum();
        let err: f64 = xb
            .iter()
            .zip(cb)
            .map(|(&a, &c)| (a as f64 - c as f64).powi(2))
            .sum();
        let (m, sent) = (l1 / n, cb[0].abs() as f64);
        let half_ulp = (m * 2f64.powi(-24)).max(2f64.powi(-150));
        assert!(
            (sent - m).abs() <= half_ulp * (1.0 + 1e-9),
            "scale {sent} vs mean {m}"
        );
        if nsq == 0.0 {
            assert_eq!(err, 0.0);
            continue;
        }
        let delta = l1 * l1 / (n * nsq);
        assert!(delta > 0.0 && delta <= 1.0 + 1e-12, "δ = {delta}");
        let bound = (1.0 - delta) * nsq + n * (sent - m).powi(2);
        assert!(err <= bound + 1e-9 * nsq, "{err} > {bound} (x = {xb:?})");
    }
}

proptest! {
    #[test]
    fn sign_is_a_contraction(x in vector(), b in proptest::option::of(bucket())) {
        assert_sign_contraction(&x, b);
    }
}

#[test]
fn sign_contraction_with_a_subnormal_scale() {
    // Found by proptest: the mean of one subnormal over 21 coordinates is subnormal, and
    // its rounding error dominates the (tiny) contraction error.
    let mut x = vec![0.0f32; 21];
    x[18] = 7.17e-43;
    assert_sign_contraction(&x, None);
}

// ---------------------------------------------------------------------------------------
// 4. Decoder defects
// ---------------------------------------------------------------------------------------

/// The framing defects every operator shares: cut, extended, payload too short for the
/// parameters (when there are any) and payload one byte short.
fn assert_framing_errors(msg: &[u8], d: usize, params: usize, name: &'static str) {
    assert_refused(
        &msg[..msg.len() - 1],
        d,
        DecodeError::Truncated {
            needed: msg.len(),
            got: msg.len() - 1,
        },
    );
    let mut long = msg.to_vec();
    long.push(0);
    assert_refused(&long, d, DecodeError::TrailingBytes { extra: 1 });
    let payload = &msg[HEADER_LEN..];
    if params > 0 {
        assert_refused(
            &with_payload(msg, &payload[..params - 1]),
            d,
            DecodeError::Truncated {
                needed: HEADER_LEN + params,
                got: HEADER_LEN + params - 1,
            },
        );
    }
    let short = &payload[..payload.len() - 1];
    assert_refused(
        &with_payload(msg, short),
        d,
        DecodeError::PayloadLength {
            operator: name,
            declared: short.len(),
            expected: payload.len(),
        },
    );
    let mut extra = payload.to_vec();
    extra.push(0);
    assert_refused(
        &with_payload(msg, &extra),
        d,
        DecodeError::PayloadLength {
            operator: name,
            declared: extra.len(),
            expected: payload.len(),
        },
    );
}

fn bad_parameter(operator: &'static str, name: &'static str, value: u64) -> DecodeError {
    DecodeError::BadParameter {
        operator,
        name,
        value,
    }
}

/// Scale `b` (at payload offset `at + 4b`) set to NaN, ∞, −∞ and −1 is refused.
fn assert_scale_errors(msg: &[u8], d: usize, at: usize, b: usize) {
    for bad in [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -1.0,
        -f32::MIN_POSITIVE,
    ] {
        let m = poke(msg, at + 4 * b, &bad.to_le_bytes());
        assert_refused(&m, d, DecodeError::NonFiniteScale { bucket: b });
    }
    // −0.0 is ≥ 0: accepted.
    let m = poke(msg, at + 4 * b, &(-0.0f32).to_le_bytes());
    assert!(validate(&m, d).is_ok());
}

#[test]
fn qsgd_decoder_defects() {
    let x: Vec<f32> = (0..21).map(|i| i as f32 - 10.0).collect();
    let d = x.len();
    let msg = encode(&mut Qsgd::new(5, 8), &x, 1);
    assert_framing_errors(&msg, d, 8, "qsgd");
    assert_refused(&poke(&msg, 0, &[0, 0]), d, bad_parameter("qsgd", "s", 0));
    assert_refused(&poke(&msg, 2, &[4]), d, bad_parameter("qsgd", "width", 4));
    assert_refused(&poke(&msg, 2, &[0]), d, bad_parameter("qsgd", "width", 0));
    assert_refused(
        &poke(&msg, 3, &[9]),
        d,
        bad_parameter("qsgd", "reserved", 9),
    );
    assert_refused(
        &poke(&msg, 4, &[0, 0, 0, 0]),
        d,
        bad_parameter("qsgd", "bucket", 0),
    );
    // Another bucket size means another number of norms.
    assert_refused(
        &poke(&msg, 4, &[5, 0, 0, 0]),
        d,
        DecodeError::PayloadLength {
            operator: "qsgd",
            declared: msg.len() - HEADER_LEN,
            expected: msg.len() - HEADER_LEN + 8,
        },
    );
    assert_scale_errors(&msg, d, 8, 0);
    assert_scale_errors(&msg, d, 8, 2);
    // Codes of 4 bits (w = 3): code 17 at nibble 17; levels 6 and 7 exceed s = 5.
    let codes_at = 8 + 3 * 4;
    for (level, sign) in [(6u8, 0u8), (7, 1)] {
        let mut m = msg.clone();
        let byte = HEADER_LEN + codes_at + 17 / 2;
        m[byte] = (m[byte] & 0x0f) | ((level << 1 | sign) << 4);
        assert_refused(
            &m,
            d,
            DecodeError::BadCode {
                operator: "qsgd",
                index: 17,
            },
        );
    }
    // Level 5 with either sign is fine; so are set padding bits (d = 21: 84 bits, 4 pad).
    let mut m = msg.clone();
    m[HEADER_LEN + codes_at] = 5 << 1 | 1;
    *m.last_mut().unwrap() |= 0xf0;
    assert!(validate(&m, d).is_ok());
    // s = 2^w − 1 has no invalid level.
    let msg = encode(&mut Qsgd::new(7, 8), &x, 1);
    let mut m = msg.clone();
    m[HEADER_LEN + codes_at] = 0xff;
    assert!(validate(&m, d).is_ok());
}

#[test]
fn sign_decoder_defects() {
    let x: Vec<f32> = (0..21).map(|i| i as f32 - 10.0).collect();
    let d = x.len();
    let msg = encode(&mut Sign::new(Some(8)), &x, 1);
    assert_framing_errors(&msg, d, 4, "sign");
    assert_refused(
        &poke(&msg, 0, &[0, 0, 0, 0]),
        d,
        bad_parameter("sign", "bucket", 0),
    );
    assert_scale_errors(&msg, d, 4, 0);
    assert_scale_errors(&msg, d, 4, 2);
    // A bucket of 2^32 − 1 is one bucket: a whole-vector message with 3 scales is too long.
    assert_refused(
        &poke(&msg, 0, &u32::MAX.to_le_bytes()),
        d,
        DecodeError::PayloadLength {
            operator: "sign",
            declared: msg.len() - HEADER_LEN,
            expected: msg.len() - HEADER_LEN - 8,
        },
    );
}

#[test]
fn terngrad_decoder_defects() {
    let x: Vec<f32> = (0..21).map(|i| i as f32 - 10.0).collect();
    let d = x.len();
    let msg = encode(&mut TernGrad::new(Some(8)), &x, 1);
    assert_framing_errors(&msg, d, 4, "terngrad");
    assert_refused(
        &poke(&msg, 0, &[0, 0, 0, 0]),
        d,
        bad_parameter("terngrad", "bucket", 0),
    );
    assert_scale_errors(&msg, d, 4, 1);
    let codes_at = HEADER_LEN + 4 + 12;
    for index in [0usize, 5, 19, 20] {
        let mut m = msg.clone();
        m[codes_at + index / 4] |= 3 << (2 * (index % 4));
        assert_refused(
            &m,
            d,
            DecodeError::BadCode {
                operator: "terngrad",
                index,
            },
        );
    }
    // Padding bits (d = 21: the top 6 bits of the last byte) are ignored.
    let mut m = msg.clone();
    *m.last_mut().unwrap() |= 0b1111_1100;
    assert!(validate(&m, d).is_ok());
    // A code 3 beyond the first 8-byte word, in a long vector.
    let x = vec![1.0f32; 300];
    let msg = encode(&mut TernGrad::new(None), &x, 1);
    let mut m = msg.clone();
    m[HEADER_LEN + 8 + 250 / 4] = 0b0000_1100;
    assert_refused(
        &m,
        300,
        DecodeError::BadCode {
            operator: "terngrad",
            index: 249,
        },
    );
}

#[test]
fn natural_decoder_defects() {
    let x: Vec<f32> = (0..21).map(|i| i as f32 - 10.0).collect();
    let d = x.len();
    let msg = encode(&mut Natural::new(), &x, 1);
    assert_framing_errors(&msg, d, 0, "natural");
    for index in [0usize, 20] {
        assert_refused(
            &poke(&msg, index, &[255]),
            d,
            DecodeError::BadCode {
                operator: "natural",
                index,
            },
        );
    }
    let mut m = msg.clone();
    *m.last_mut().unwrap() |= 0b1110_0000; // padding
    assert!(validate(&m, d).is_ok());
    // d = 0: an empty payload; one byte too many is refused.
    let empty = encode(&mut Natural::new(), &[], 1);
    assert_eq!(empty.len(), HEADER_LEN);
    assert!(decode_into(&empty, &mut []).is_ok());
    assert_refused(
        &with_payload(&empty, &[0]),
        0,
        DecodeError::PayloadLength {
            operator: "natural",
            declared: 1,
            expected: 0,
        },
    );
}

#[test]
fn non_finite_input_is_refused_by_the_receiver() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let x = [1.0f32, -2.0, bad, 0.5, 3.0];
        for b in [None, Some(2)] {
            let bucket = if b.is_some() { 1 } else { 0 };
            let q = encode(&mut Qsgd::new(3, b.unwrap_or(8)), &x, 1);
            assert_refused(&q, 5, DecodeError::NonFiniteScale { bucket });
            let s = encode(&mut Sign::new(b), &x, 1);
            assert_refused(&s, 5, DecodeError::NonFiniteScale { bucket });
            let t = encode(&mut TernGrad::new(b), &x, 1);
            assert_refused(&t, 5, DecodeError::NonFiniteScale { bucket });
        }
        let n = encode(&mut Natural::new(), &x, 1);
        assert_refused(
            &n,
            5,
            DecodeError::BadCode {
                operator: "natural",
                index: 2,
            },
        );
    }
    // Finite values whose bucket norm exceeds f32::MAX.
    let q = encode(&mut Qsgd::new(3, 8), &[f32::MAX, f32::MAX], 1);
    assert_refused(&q, 2, DecodeError::NonFiniteScale { bucket: 0 });
}

// ---------------------------------------------------------------------------------------
// 5. decode_add accumulates scale · C(x)
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn decode_add_accumulates_scaled(
        x in vector(),
        s in levels(),
        b in bucket(),
        scale in prop_oneof![Just(1.0f32), Just(-1.0f32), Just(0.0f32), -3.0f32..3.0],
        seed in any::<u64>(),
    ) {
        let d = x.len();
        let acc0: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
        let bb = if b == usize::MAX { None } else { Some(b) };
        let cases: Vec<(Box<dyn Compressor>, Vec<f32>)> = vec![
            (Box::new(Qsgd::new(s, b)), ref_qsgd(&x, s, b, drawn_seed(seed))),
            (Box::new(Sign::new(bb)), ref_sign(&x, bb)),
            (Box::new(TernGrad::new(bb)), ref_terngrad(&x, bb, drawn_seed(seed))),
            (Box::new(Natural::new()), ref_natural(&x, drawn_seed(seed))),
        ];
        for (mut op, c) in cases {
            let msg = encode(&mut *op, &x, seed);
            let mut acc = acc0.clone();
            decode_add(&msg, scale, &mut acc).unwrap();
            for i in 0..d {
                prop_assert_eq!(acc[i].to_bits(), (acc0[i] + scale * c[i]).to_bits(), "{:?} at {}", op.id(), i);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 6. Arbitrary bytes never panic
// ---------------------------------------------------------------------------------------

/// Decodes `msg` every way; a message that is accepted decodes to finite values.
fn decode_anyhow(msg: &[u8], d: usize) {
    let mut acc = vec![0f32; d];
    let ok = validate(msg, d).is_ok();
    assert_eq!(decode_add(msg, 1.0, &mut acc).is_ok(), ok);
    assert_eq!(decode_into(msg, &mut acc).is_ok(), ok);
    if ok {
        assert!(acc.iter().all(|v| v.is_finite()));
    } else {
        assert!(acc.iter().all(|&v| v == 0.0));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn arbitrary_payloads_never_panic(
        op in prop_oneof![4u8..=7, Just(10u8)],
        d in prop_oneof![0u32..80, Just(1000u32)],
        declared_d in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        payload in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let dim = declared_d.unwrap_or(d);
        let mut msg = header(op, dim, payload.len() as u32);
        msg.extend_from_slice(&payload);
        decode_anyhow(&msg, d as usize);
    }

    #[test]
    fn plausible_payloads_never_panic(
        op in 4u8..=7,
        d in 0usize..80,
        s in any::<u16>(),
        bucket in prop_oneof![0u32..10, any::<u32>()],
        fill in any::<u64>(),
        pick in any::<u8>(),
    ) {
        // Right parameters and length (when s and bucket are valid), random contents.
        let mut g = SplitMix64::new(fill);
        let mut payload = Vec::new();
        let (n_scales, code_bits) = match op {
            4 => {
                let w = 16 - s.leading_zeros();
                payload.extend_from_slice(&s.to_le_bytes());
                payload.extend_from_slice(&[w as u8, 0]);
                payload.extend_from_slice(&bucket.to_le_bytes());
                (d.div_ceil(bucket.max(1) as usize), d * (1 + w as usize))
            }
            5 | 6 => {
                payload.extend_from_slice(&bucket.to_le_bytes());
                (d.div_ceil(bucket.max(1) as usize), d * (op as usize - 4))
            }
            _ => (0, 9 * d),
        };
        for _ in 0..n_scales {
            let v = if pick % 4 == 0 { f32::from_bits(g.next_u64() as u32) } else { g.unit_pair().0 * 1e3 };
            payload.extend_from_slice(&v.to_le_bytes());
        }
        let code_bytes = if op == 7 { d + d.div_ceil(8) } else { code_bits.div_ceil(8) };
        for _ in 0..code_bytes {
            payload.push(g.next_u64() as u8);
        }
        let mut msg = header(op, d as u32, payload.len() as u32);
        msg.extend_from_slice(&payload);
        decode_anyhow(&msg, d);
    }

    #[test]
    fn mutated_messages_never_panic(
        x in proptest::collection::vec(-100f32..100.0, 0..100),
        which in 0usize..5,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut op: Box<dyn Compressor> = match which {
            0 => Box::new(Qsgd::new(6, 16)),
            1 => Box::new(Sign::new(Some(10))),
            2 => Box::new(TernGrad::new(None)),
            3 => Box::new(murmur_compress::SparseLoco::new(0.25, 8)),
            _ => Box::new(Natural::new()),
        };
        let mut msg = encode(&mut *op, &x, 5);
        for (at, v) in flips {
            let i = at.index(msg.len());
            msg[i] ^= v;
        }
        decode_anyhow(&msg, x.len());
    }
}

// ---------------------------------------------------------------------------------------
// int8: QSGD's code with the bucket's largest magnitude as its scale
// ---------------------------------------------------------------------------------------

/// Int8's decoded values from the formulas of its doc: scale m_b = max |x_i|, level
/// l_i = ⌊min(127·|x_i|/m_b + u_i, 127)⌋ (as QSGD's, with m_b for the norm).
fn ref_int8(x: &[f32], bucket: usize, seed: u64) -> Vec<f32> {
    let u = uniforms(seed, x.len());
    let s = 127f32;
    let mut out = Vec::with_capacity(x.len());
    for (b, xb) in x.chunks(bucket).enumerate() {
        let m = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (k, &v) in xb.iter().enumerate() {
            if m == 0.0 {
                out.push(0.0);
                continue;
            }
            let r = v.abs() * (s / m);
            let l = (r + u[b * bucket + k]).min(s).floor();
            let q = m * (l / s);
            out.push(if v < 0.0 { -q } else { q });
        }
    }
    out
}

#[test]
fn int8_messages_are_qsgd_messages_with_the_absmax_scale() {
    let d: usize = 3000;
    let mut rng = StdRng::seed_from_u64(11);
    let x: Vec<f32> = (0..d).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    for bucket in [1, 7, 128, 5000] {
        let mut op = Int8::new(bucket);
        let msg = encode(&mut op, &x, 5);
        // A QSGD message: s = 127, w = 7, one byte per code, a scale per bucket.
        assert_eq!(msg[0], 4, "qsgd's operator id");
        let p = &msg[HEADER_LEN..];
        assert_eq!(u16::from_le_bytes([p[0], p[1]]), 127);
        assert_eq!(p[2], 7);
        let nb = d.div_ceil(bucket.min(d));
        assert_eq!(msg.len(), HEADER_LEN + 8 + 4 * nb + d);
        let first_scale = f32::from_le_bytes(p[8..12].try_into().unwrap());
        let m = x[..bucket.min(d)].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(
            first_scale, m,
            "the scale is the bucket's largest magnitude"
        );
        assert_exact(&decoded(&msg, d), &ref_int8(&x, bucket, drawn_seed(5)));
    }
    // Zeros encode to zeros; a non-finite value is refused by the receiver, as for QSGD.
    let zeros = encode(&mut Int8::new(128), &[0.0; 300], 1);
    assert_eq!(decoded(&zeros, 300), vec![0.0; 300]);
    let mut bad = x.clone();
    bad[10] = f32::INFINITY;
    let msg = encode(&mut Int8::new(128), &bad, 1);
    assert!(validate(&msg, d).is_err());
}

#[test]
fn int8_is_unbiased_and_finer_than_qsgd_with_the_same_bits() {
    // Gaussian-like data (sum of uniforms), d = 4096, buckets of 128: both messages are
    // 8 bits a value plus a scale per bucket.
    let d = 4096;
    let mut rng = StdRng::seed_from_u64(3);
    let x: Vec<f32> = (0..d)
        .map(|_| (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum())
        .collect();
    let norm2: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let trials = 400;
    let (mut mean, mut err_int8, mut err_qsgd) = (vec![0f64; d], 0f64, 0f64);
    for t in 0..trials {
        let a = decoded(&encode(&mut Int8::new(128), &x, t), d);
        let b = decoded(&encode(&mut Qsgd::new(127, 128), &x, t), d);
        assert_eq!(
            encode(&mut Int8::new(128), &x, t).len(),
            encode(&mut Qsgd::new(127, 128), &x, t).len()
        );
        for i in 0..d {
            mean[i] += a[i] as f64 / trials as f64;
            err_int8 += ((a[i] - x[i]) as f64).powi(2) / trials as f64;
            err_qsgd += ((b[i] - x[i]) as f64).powi(2) / trials as f64;
        }
    }
    // Unbiased: the mean over trials is within 4 standard errors of x everywhere (one step
    // m/127 bounds each draw's error, so the standard error is below step/(2√trials)).
    for (b, xb) in x.chunks(128).enumerate() {
        let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
        for (k, &v) in xb.iter().enumerate() {
            let i = b * 128 + k;
            let se = step / (2.0 * (trials as f64).sqrt());
            assert!(
                (mean[i] - v as f64).abs() <= 4.0 * se + 1e-7,
                "coordinate {i}: mean {} vs {v}",
                mean[i]
            );
        }
    }
    // Within the documented bound, and several times finer than QSGD's.
    let omega = Int8::new(128).variance_factor(d);
    assert!(err_int8 <= omega * norm2, "{err_int8} > {omega}·{norm2}");
    assert!(
        err_qsgd > 10.0 * err_int8,
        "QSGD's error {err_qsgd:e} is not 10× int8's {err_int8:e}"
    );
}

// ---------------------------------------------------------------------------------------
// SparseLoCo: chunked top-k, 2-bit values, Rice-coded positions
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Against the module doc, chunk by chunk: the kept values are the `min(k, c)` largest
    /// magnitudes (every decoded coordinate at least as large in |x| as every dropped
    /// non-zero one), each decoded as ±low or ±high with x's sign, with low ≤ high; zero
    /// elsewhere; the message within its bound.
    #[test]
    fn sparseloco_round_trip_keeps_the_chunks_largest_at_two_levels(
        x in proptest::collection::vec(prop_oneof![Just(0f32), -100f32..100.0], 0..600),
        ratio in (1u32..=256).prop_map(|r| f64::from(r) / 256.0),
        chunk in prop_oneof![1usize..70, Just(4096usize), Just(65536usize)],
    ) {
        let mut c = murmur_compress::SparseLoco::new(ratio, chunk);
        let k = c.k();
        let msg = encode(&mut c, &x, 0);
        let mut y = vec![f32::NAN; x.len()];
        decode_into(&msg, &mut y).unwrap();
        for (xs, ys) in x.chunks(chunk).zip(y.chunks(chunk)) {
            let kept: Vec<usize> = (0..xs.len()).filter(|&i| ys[i] != 0.0).collect();
            let nonzero = xs.iter().filter(|v| **v != 0.0).count();
            prop_assert_eq!(kept.len(), nonzero.min(k.min(xs.len())));
            let mut levels: Vec<f32> = kept.iter().map(|&i| ys[i].abs()).collect();
            levels.sort_by(f32::total_cmp);
            levels.dedup();
            prop_assert!(levels.len() <= 2, "levels {:?}", levels);
            let smallest_kept = kept.iter().map(|&i| xs[i].abs()).fold(f32::INFINITY, f32::min);
            for i in 0..xs.len() {
                if ys[i] != 0.0 {
                    prop_assert_eq!(ys[i].is_sign_negative(), xs[i].is_sign_negative());
                } else {
                    prop_assert!(xs[i].abs() <= smallest_kept, "dropped {} over kept {}", xs[i], smallest_kept);
                }
            }
        }
    }

    /// Right chunk and k, then random bytes: refused or decoded to finite values, never a
    /// panic (the positions' code is read bit by bit up to the payload's end).
    #[test]
    fn sparseloco_plausible_payloads_never_panic(
        d in 0usize..300,
        chunk in 1u32..80,
        k in 1u32..80,
        body in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut payload = chunk.to_le_bytes().to_vec();
        payload.extend_from_slice(&k.to_le_bytes());
        payload.extend_from_slice(&body);
        let mut msg = header(10, d as u32, payload.len() as u32);
        msg.extend_from_slice(&payload);
        decode_anyhow(&msg, d);
    }
}
