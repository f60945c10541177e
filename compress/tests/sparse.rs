//! Sparsifiers and dense casts through the public API: exact round trips against reference
//! implementations, the contraction and unbiasedness bounds, and one error per defect.

use murmur_compress::rng::randk_bitset;
use murmur_compress::{
    decode_add, decode_into, validate, ApproxTopK, Bf16, Compressor, DecodeError, Fp16, Identity,
    IndexCoding, OperatorId, RandK, TopK, HEADER_LEN, WIRE_VERSION,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn encode(c: &mut dyn Compressor, x: &[f32], seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = vec![0xAB; 3]; // messages are appended: earlier bytes stay
    let n = c.compress(x, &mut rng, &mut out);
    assert_eq!(&out[..3], &[0xAB; 3]);
    assert_eq!(n, out.len() - 3);
    out.drain(..3);
    if let Some(len) = c.encoded_len(x.len()) {
        assert_eq!(len, n, "encoded_len must be exact");
    }
    assert!(n <= c.max_encoded_len(x.len()));
    out
}

fn decode(msg: &[u8], d: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; d];
    decode_into(msg, &mut out).unwrap();
    out
}

/// Reference top-k: the k largest |x_i|, ties to lower indices.
fn reference_top_k(x: &[f32], k: usize) -> Vec<f32> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
    let mut y = vec![0.0; x.len()];
    for &i in &order[..k] {
        y[i] = x[i];
    }
    y
}

fn norm2(x: &[f32]) -> f64 {
    x.iter().map(|&v| (v as f64).powi(2)).sum()
}

fn dist2(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&u, &v)| (u as f64 - v as f64).powi(2))
        .sum()
}

fn values() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -1e3f32..1e3,
        1 => Just(0.0f32),
        1 => Just(-2.5f32),
        1 => -1e-30f32..1e-30,
        1 => -1e30f32..1e30,
    ]
}

proptest! {
    #[test]
    fn top_k_round_trip_is_exact(
        x in proptest::collection::vec(values(), 0..400),
        ratio in 0.001f64..=1.0,
        coding in prop_oneof![Just(IndexCoding::Auto), Just(IndexCoding::Fixed), Just(IndexCoding::Delta)],
    ) {
        let mut c = TopK::new(ratio).with_coding(coding);
        let k = c.k(x.len());
        let msg = encode(&mut c, &x, 0);
        prop_assert_eq!(validate(&msg, x.len()).unwrap().nnz, k);
        prop_assert_eq!(decode(&msg, x.len()), reference_top_k(&x, k));
    }

    #[test]
    fn layerwise_top_k_selects_within_each_tensor(
        layers in proptest::collection::vec(0usize..60, 1..6),
        ratio in 0.01f64..=1.0,
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let d: usize = layers.iter().sum();
        let x: Vec<f32> = (0..d).map(|_| rng.random_range(-5.0f32..5.0)).collect();
        let mut c = TopK::layerwise(ratio, layers.clone());
        let y = decode(&encode(&mut c, &x, 0), d);
        let mut expected = Vec::new();
        let mut base = 0;
        for &l in &layers {
            let k = murmur_compress::k_for_ratio(ratio, l);
            expected.extend(reference_top_k(&x[base..base + l], k));
            base += l;
        }
        prop_assert_eq!(y, expected);
    }

    #[test]
    fn top_k_is_a_contraction(x in proptest::collection::vec(-1e3f32..1e3, 1..300), ratio in 0.001f64..=1.0) {
        let mut c = TopK::new(ratio);
        let k = c.k(x.len());
        let y = decode(&encode(&mut c, &x, 0), x.len());
        let bound = (1.0 - k as f64 / x.len() as f64) * norm2(&x);
        prop_assert!(dist2(&x, &y) <= bound * (1.0 + 1e-9) + 1e-12, "{} > {}", dist2(&x, &y), bound);
    }

    #[test]
    fn random_k_round_trip_matches_the_seeded_indices(
        x in proptest::collection::vec(values(), 0..400),
        ratio in 0.001f64..=1.0,
        scaled in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut c = RandK::new(ratio, scaled);
        let d = x.len();
        let k = c.k(d);
        let msg = encode(&mut c, &x, seed);
        // The operator draws its index seed as the first u64 of the caller's RNG.
        let index_seed = StdRng::seed_from_u64(seed).next_u64();
        let bits = randk_bitset(index_seed, k, d);
        let scale = if scaled && k > 0 { (d as f64 / k as f64) as f32 } else { 1.0 };
        let expected: Vec<f32> = (0..d)
            .map(|i| if bits[i / 64] >> (i % 64) & 1 == 1 { scale * x[i] } else { 0.0 })
            .collect();
        prop_assert_eq!(decode(&msg, d), expected);
    }

    #[test]
    fn approx_top_k_keeps_the_largest_of_what_it_keeps(x in proptest::collection::vec(-1e3f32..1e3, 1..3000), seed in any::<u64>()) {
        let mut c = ApproxTopK::new(0.05);
        let msg = encode(&mut c, &x, seed);
        let y = decode(&msg, x.len());
        let kept = y.iter().filter(|v| **v != 0.0).count();
        prop_assert!(c.last_k() >= kept && c.last_k() <= 2 * c.k(x.len()));
        // Every kept |x_i| is ≥ every dropped one (it is a threshold selection).
        let min_kept = x.iter().zip(&y).filter(|(_, y)| **y != 0.0).map(|(x, _)| x.abs()).fold(f32::INFINITY, f32::min);
        let max_dropped = x.iter().zip(&y).filter(|(_, y)| **y == 0.0).map(|(x, _)| x.abs()).fold(0.0, f32::max);
        prop_assert!(kept == 0 || min_kept >= max_dropped);
        for (a, b) in x.iter().zip(&y) {
            prop_assert!(*b == 0.0 || a == b);
        }
    }

    #[test]
    fn layerwise_approx_top_k_thresholds_each_tensor(
        layers in proptest::collection::vec(0usize..3000, 1..5),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let d: usize = layers.iter().sum();
        // Tensors of very different scales: a whole-vector threshold would starve the small ones.
        let mut x = Vec::with_capacity(d);
        for (l, &len) in layers.iter().enumerate() {
            let scale = 10f32.powi(l as i32 - 2);
            x.extend((0..len).map(|_| scale * rng.random_range(-1.0f32..1.0)));
        }
        let mut c = ApproxTopK::layerwise(0.05, layers.clone());
        let y = decode(&encode(&mut c, &x, seed), d);
        let mut base = 0;
        for &len in &layers {
            let (xs, ys) = (&x[base..base + len], &y[base..base + len]);
            let kept = ys.iter().filter(|v| **v != 0.0).count();
            let k = murmur_compress::k_for_ratio(0.05, len);
            prop_assert!(kept <= 2 * k, "tensor of {len}: kept {kept} > 2k = {}", 2 * k);
            let min_kept = xs.iter().zip(ys).filter(|(_, y)| **y != 0.0).map(|(x, _)| x.abs()).fold(f32::INFINITY, f32::min);
            let max_dropped = xs.iter().zip(ys).filter(|(_, y)| **y == 0.0).map(|(x, _)| x.abs()).fold(0.0, f32::max);
            prop_assert!(kept == 0 || min_kept >= max_dropped);
            base += len;
        }
    }

    #[test]
    fn casts_round_trip_through_the_half_crate(x in proptest::collection::vec(values(), 0..300)) {
        let y16 = decode(&encode(&mut Fp16::default(), &x, 0), x.len());
        let yb = decode(&encode(&mut Bf16::default(), &x, 0), x.len());
        for ((&v, &a), &b) in x.iter().zip(&y16).zip(&yb) {
            let h = half::f16::from_f32(v);
            let h = if h.is_infinite() { if v > 0.0 { half::f16::MAX } else { half::f16::MIN } } else { h };
            prop_assert_eq!(a, h.to_f32());
            prop_assert_eq!(b, half::bf16::from_f32(v).to_f32());
        }
    }

    #[test]
    fn plausible_sparse_payloads_are_checked_before_use(
        d in 1u32..400,
        kfrac in 0.0f64..=1.0,
        coding in 0u8..3,
        indices in proptest::collection::vec(any::<u8>(), 0..800),
        values in proptest::collection::vec(prop_oneof![8 => -10f32..10.0, 1 => Just(f32::NAN)], 0..400),
    ) {
        // k ≤ d and a valid coding, so the checks of the indices and values are reached.
        let k = ((kfrac * d as f64) as u32).min(values.len() as u32);
        let msg = sparse_msg(d, k, coding, &indices, &values[..k as usize]);
        let mut acc = vec![1.0f32; d as usize];
        let checked = validate(&msg, d as usize);
        let added = decode_add(&msg, 1.0, &mut acc);
        prop_assert_eq!(checked.is_ok(), added.is_ok());
        if added.is_err() {
            prop_assert!(acc.iter().all(|&v| v == 1.0), "a refused message touched acc");
        } else {
            prop_assert!(acc.iter().all(|v| v.is_finite()));
            prop_assert_eq!(checked.unwrap().nnz, k as usize);
        }
    }

    #[test]
    fn decoding_arbitrary_payloads_never_panics(
        op in 0u8..11,
        d in 0u32..300,
        payload in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut msg = vec![op, WIRE_VERSION, 0, 0];
        msg.extend_from_slice(&d.to_le_bytes());
        msg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        msg.extend_from_slice(&payload);
        let mut acc = vec![1.0f32; d as usize];
        let checked = validate(&msg, d as usize);
        let added = decode_add(&msg, 1.0, &mut acc);
        prop_assert_eq!(checked.is_ok(), added.is_ok());
        if added.is_err() {
            prop_assert!(acc.iter().all(|&v| v == 1.0));
        } else {
            prop_assert!(acc.iter().all(|v| v.is_finite()));
        }
    }
}

#[test]
fn random_k_unscaled_contracts_and_scaled_is_unbiased() {
    // x fixed, many seeds: E‖x − C(x)‖² = (1 − k/d)‖x‖² unscaled; E[C(x)] = x scaled.
    let d = 40;
    let x: Vec<f32> = (0..d).map(|i| (i as f32 - 17.0) * 0.37).collect();
    let trials = 20_000;
    let (mut err, mut mean) = (0.0f64, vec![0.0f64; d]);
    let mut unscaled = RandK::new(0.1, false);
    let mut scaled = RandK::new(0.1, true);
    let k = scaled.k(d);
    for seed in 0..trials {
        let y = decode(&encode(&mut unscaled, &x, seed), d);
        err += dist2(&x, &y);
        let z = decode(&encode(&mut scaled, &x, seed), d);
        for (m, v) in mean.iter_mut().zip(z) {
            *m += v as f64;
        }
    }
    let expected = (1.0 - k as f64 / d as f64) * norm2(&x);
    let err = err / trials as f64;
    assert!(
        (err - expected).abs() < 0.02 * expected,
        "E‖x − C(x)‖² = {err}, expected {expected}"
    );
    // Scaled: each coordinate is (d/k)·x_i with probability k/d, so the standard error of
    // the mean is |x_i|·√(d/k − 1)/√trials; allow 5 of them.
    let sd = ((d as f64 / k as f64) - 1.0).sqrt() / (trials as f64).sqrt();
    for (i, m) in mean.iter().enumerate() {
        let m = m / trials as f64;
        let tol = 5.0 * sd * (x[i].abs() as f64) + 1e-6;
        assert!(
            (m - x[i] as f64).abs() <= tol,
            "coordinate {i}: mean {m} vs {}",
            x[i]
        );
    }
}

#[test]
fn auto_coding_picks_the_shortest() {
    // Dense selection: deltas of 0 are one byte each, shorter than u16 indices.
    let x: Vec<f32> = (0..1000)
        .map(|i| if i < 500 { 10.0 } else { 1.0 })
        .collect();
    let auto = encode(&mut TopK::new(0.5), &x, 0);
    let delta = encode(&mut TopK::new(0.5).with_coding(IndexCoding::Delta), &x, 0);
    let fixed = encode(&mut TopK::new(0.5).with_coding(IndexCoding::Fixed), &x, 0);
    assert_eq!(auto, delta);
    assert_eq!(fixed.len(), HEADER_LEN + 8 + 500 * 6);
    assert_eq!(delta.len(), HEADER_LEN + 8 + 500 * 5);
    // Gaps of 20,000 need 3-byte varints: u16 indices are shorter.
    let mut x = vec![0.0f32; 60_001];
    for i in [20_000, 40_000, 60_000] {
        x[i] = 1.0;
    }
    let auto = encode(&mut TopK::new(3.0 / 60_001.0), &x, 0);
    assert_eq!(auto[HEADER_LEN + 4], 0, "u16 coding");
}

#[test]
fn sparse_wire_layout_is_byte_exact() {
    let x = [0.0, -3.0, 0.5, 2.0, 0.0];
    let msg = encode(&mut TopK::new(0.4).with_coding(IndexCoding::Fixed), &x, 0);
    let mut expected = vec![OperatorId::TopK as u8, WIRE_VERSION, 0, 0, 5, 0, 0, 0];
    expected.extend_from_slice(&(8u32 + 2 * 2 + 2 * 4).to_le_bytes());
    expected.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]); // k = 2, u16 coding
    expected.extend_from_slice(&[1, 0, 3, 0]); // indices 1, 3
    expected.extend_from_slice(&(-3.0f32).to_le_bytes());
    expected.extend_from_slice(&2.0f32.to_le_bytes());
    assert_eq!(msg, expected);
    let delta = encode(&mut TopK::new(0.4).with_coding(IndexCoding::Delta), &x, 0);
    assert_eq!(&delta[HEADER_LEN + 4..HEADER_LEN + 10], &[2, 0, 0, 0, 1, 1]); // 1, then 3 − 1 − 1
}

/// A sparse message with hand-written parts.
fn sparse_msg(d: u32, k: u32, coding: u8, indices: &[u8], values: &[f32]) -> Vec<u8> {
    let mut payload = k.to_le_bytes().to_vec();
    payload.extend_from_slice(&[coding, 0, 0, 0]);
    payload.extend_from_slice(indices);
    for v in values {
        payload.extend_from_slice(&v.to_le_bytes());
    }
    let mut msg = vec![OperatorId::TopK as u8, WIRE_VERSION, 0, 0];
    msg.extend_from_slice(&d.to_le_bytes());
    msg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    msg.extend_from_slice(&payload);
    msg
}

#[test]
fn each_sparse_defect_has_its_error() {
    let check = |msg: Vec<u8>, d: usize, expected: DecodeError| {
        let mut acc = vec![7.0f32; d];
        assert_eq!(decode_add(&msg, 1.0, &mut acc), Err(expected));
        assert!(acc.iter().all(|&v| v == 7.0), "acc touched");
    };
    let ok = sparse_msg(10, 2, 0, &[1, 0, 9, 0], &[1.0, 2.0]);
    let mut acc = vec![0.0; 10];
    decode_add(&ok, 2.0, &mut acc).unwrap();
    assert_eq!((acc[1], acc[9]), (2.0, 4.0));

    check(
        sparse_msg(10, 2, 0, &[1, 0, 10, 0], &[1.0, 2.0]),
        10,
        DecodeError::IndexOutOfRange { index: 10, dim: 10 },
    );
    check(
        sparse_msg(10, 2, 0, &[4, 0, 4, 0], &[1.0, 2.0]),
        10,
        DecodeError::IndicesNotIncreasing { position: 1 },
    );
    check(
        sparse_msg(10, 2, 2, &[3, 6], &[1.0, 2.0]),
        10,
        DecodeError::IndexOutOfRange { index: 10, dim: 10 },
    );
    check(
        sparse_msg(10, 1, 2, &[0x80, 0x80, 0x80, 0x80, 0x80], &[1.0]),
        10,
        DecodeError::MalformedVarint { offset: 8 },
    );
    check(
        sparse_msg(10, 11, 1, &[], &[]),
        10,
        DecodeError::BadParameter {
            operator: "topk",
            name: "k",
            value: 11,
        },
    );
    check(
        sparse_msg(70_000, 1, 0, &[0, 0], &[1.0]),
        70_000,
        DecodeError::BadParameter {
            operator: "topk",
            name: "coding",
            value: 0,
        },
    );
    check(
        sparse_msg(10, 1, 3, &[0], &[1.0]),
        10,
        DecodeError::BadParameter {
            operator: "topk",
            name: "coding",
            value: 3,
        },
    );
    check(
        sparse_msg(10, 2, 0, &[1, 0, 2, 0], &[1.0, f32::INFINITY]),
        10,
        DecodeError::NonFinite { index: 2 },
    );
    check(
        sparse_msg(10, 2, 0, &[1, 0, 2, 0], &[1.0]),
        10,
        DecodeError::Truncated {
            needed: HEADER_LEN + 8 + 4 + 8,
            got: HEADER_LEN + 8 + 4 + 4,
        },
    );
    check(
        sparse_msg(10, 1, 0, &[1, 0], &[1.0, 2.0]),
        10,
        DecodeError::TrailingBytes { extra: 4 },
    );
    let mut reserved = ok.clone();
    reserved[HEADER_LEN + 6] = 1;
    check(
        reserved,
        10,
        DecodeError::BadParameter {
            operator: "topk",
            name: "reserved",
            value: 1,
        },
    );
    check(
        ok.clone(),
        11,
        DecodeError::DimensionMismatch {
            expected: 11,
            got: 10,
        },
    );
}

#[test]
fn each_random_k_defect_has_its_error() {
    let x: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let good = encode(&mut RandK::new(0.25, false), &x, 5);
    assert_eq!(validate(&good, 20).unwrap().nnz, 5);
    let mut acc = vec![0.0; 20];
    decode_add(&good, 1.0, &mut acc).unwrap();
    assert!(acc.iter().zip(&x).all(|(a, x)| *a == 0.0 || a == x));

    let mut big_k = good.clone();
    big_k[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&21u32.to_le_bytes());
    assert_eq!(
        validate(&big_k, 20),
        Err(DecodeError::BadParameter {
            operator: "randk",
            name: "k",
            value: 21
        })
    );
    let mut short_k = good.clone();
    short_k[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&4u32.to_le_bytes());
    assert_eq!(
        validate(&short_k, 20),
        Err(DecodeError::PayloadLength {
            operator: "randk",
            declared: 16 + 20,
            expected: 16 + 16
        })
    );
    let mut nan = good.clone();
    let last = nan.len() - 4;
    nan[last..].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(matches!(
        validate(&nan, 20),
        Err(DecodeError::NonFinite { .. })
    ));
}

#[test]
fn identity_and_header_layout_are_byte_exact() {
    let msg = encode(&mut Identity, &[1.0, -2.0], 0);
    assert_eq!(
        &msg[..HEADER_LEN],
        &[0, WIRE_VERSION, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0]
    );
    assert_eq!(&msg[HEADER_LEN..HEADER_LEN + 4], &1.0f32.to_le_bytes());
    let mut acc = [10.0, 10.0];
    decode_add(&msg, 0.5, &mut acc).unwrap();
    assert_eq!(acc, [10.5, 9.0]);
}

#[test]
fn each_header_defect_has_its_error() {
    let good = encode(&mut Identity, &[1.0, 2.0], 0);
    let mut out = [0.0; 2];
    assert_eq!(
        decode_into(&good[..5], &mut out),
        Err(DecodeError::Truncated { needed: 12, got: 5 })
    );
    assert_eq!(
        decode_into(&good[..good.len() - 1], &mut out),
        Err(DecodeError::Truncated {
            needed: 20,
            got: 19
        })
    );
    let mut bad = good.clone();
    bad[1] = 9;
    assert_eq!(
        decode_into(&bad, &mut out),
        Err(DecodeError::UnknownVersion(9))
    );
    let mut bad = good.clone();
    bad[0] = 200;
    assert_eq!(
        decode_into(&bad, &mut out),
        Err(DecodeError::UnknownOperator(200))
    );
    let mut bad = good.clone();
    bad[2] = 1;
    assert_eq!(
        decode_into(&bad, &mut out),
        Err(DecodeError::ReservedFlags(1))
    );
    let mut bad = good.clone();
    bad.push(0);
    assert_eq!(
        decode_into(&bad, &mut out),
        Err(DecodeError::TrailingBytes { extra: 1 })
    );
    let nan = encode(&mut Identity, &[1.0, f32::NAN], 0);
    let mut acc = [7.0, 7.0];
    assert_eq!(
        decode_add(&nan, 1.0, &mut acc),
        Err(DecodeError::NonFinite { index: 1 })
    );
    assert_eq!(acc, [7.0, 7.0]);
    let mut inf16 = encode(&mut Fp16::default(), &[1.0, 2.0], 0);
    inf16[HEADER_LEN + 2..].copy_from_slice(&half::f16::INFINITY.to_bits().to_le_bytes());
    assert_eq!(
        decode_into(&inf16, &mut out),
        Err(DecodeError::NonFinite { index: 1 })
    );
    let mut bad = good[..HEADER_LEN].to_vec();
    bad[8] = 12;
    bad.extend_from_slice(&[0u8; 12]);
    assert!(matches!(
        decode_into(&bad, &mut out),
        Err(DecodeError::PayloadLength {
            declared: 12,
            expected: 8,
            ..
        })
    ));
}

#[test]
fn casts_saturate_instead_of_overflowing() {
    let y = decode(&encode(&mut Fp16::default(), &[1e6, -1e6, 3.0], 0), 3);
    assert_eq!(y, [65504.0, -65504.0, 3.0]);
    let y = decode(&encode(&mut Bf16::default(), &[f32::MAX, 1.0], 0), 2);
    assert_eq!(y, [half::bf16::MAX.to_f32(), 1.0]);
}

#[test]
fn scaled_random_k_saturates_instead_of_overflowing() {
    // Found by the `roundtrip` fuzz target: 3e38 · d/k overflows f32.
    let x = [3e38f32, 3e38];
    let msg = encode(&mut RandK::new(0.5, true), &x, 0);
    let y = decode(&msg, 2);
    assert_eq!(y.iter().filter(|&&v| v == f32::MAX).count(), 1, "{y:?}");
}
