//! Error feedback and DGC through the public API: conservation of what is sent and what is
//! kept, hand-worked examples, the warm-up schedule.

use murmur_compress::{
    decode_into, ApproxTopK, Bf16, Compressor, Dgc, DgcConfig, ErrorFeedback, Fp16, Identity,
    OperatorId, RandK, TopK,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Compresses `x` with `c`, checks the returned length, and decodes the message.
fn step(c: &mut dyn Compressor, x: &[f32], rng: &mut StdRng) -> (Vec<u8>, Vec<f32>) {
    let mut out = vec![0xAA; 3]; // the message is appended, not written at 0
    let n = c.compress(x, rng, &mut out);
    assert_eq!(n, out.len() - 3);
    let msg = out.split_off(3);
    let mut decoded = vec![f32::NAN; x.len()];
    decode_into(&msg, &mut decoded).expect("message decodes");
    (msg, decoded)
}

/// The inner operators of the conservation property.
fn inner(which: usize) -> Box<dyn Compressor> {
    match which {
        0 => Box::new(TopK::new(0.01)),
        1 => Box::new(TopK::new(0.1)),
        2 => Box::new(TopK::new(0.5)),
        3 => Box::new(TopK::new(1.0)),
        4 => Box::new(ApproxTopK::new(0.2)),
        5 => Box::new(RandK::new(0.1, true)),
        6 => Box::new(RandK::new(0.3, false)),
        7 => Box::new(Fp16::default()),
        8 => Box::new(Bf16::default()),
        _ => Box::new(Identity),
    }
}

/// Unit roundoff of `f32` (round to nearest).
const U: f64 = f32::EPSILON as f64 / 2.0;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Σ_t c_t + e_T = Σ_t x_t per coordinate. Each call rounds twice in `f32`,
    /// `p = fl(x + e)` and `e = fl(p − c)`, each off by at most U·|result|, so the error is
    /// at most U·Σ_t (|p_t| + |e_t|) (scaled random-k makes e larger than Σ|x|, hence a
    /// bound from the values actually added rather than from Σ|x| alone).
    #[test]
    fn error_feedback_conserves_the_sum(
        which in 0usize..10,
        xs in (1usize..200).prop_flat_map(|d| {
            proptest::collection::vec(proptest::collection::vec(-100f32..100.0, d), 1..=20)
        }),
        seed in any::<u64>(),
    ) {
        let d = xs[0].len();
        let mut ef = ErrorFeedback::new(inner(which));
        let id = ef.inner().id();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut sent = vec![0f64; d];
        let mut sum_x = vec![0f64; d];
        let mut rounding = vec![0f64; d];
        for x in &xs {
            let before: Vec<f32> = if ef.residual().is_empty() {
                vec![0.0; d]
            } else {
                ef.residual().to_vec()
            };
            let (msg, c) = step(&mut ef, x, &mut rng);
            prop_assert_eq!(msg[0], id as u8);
            prop_assert!(msg.len() <= ef.max_encoded_len(d));
            if let Some(len) = ef.encoded_len(d) {
                prop_assert_eq!(msg.len(), len);
            }
            let e = ef.residual();
            prop_assert_eq!(e.len(), d);
            for i in 0..d {
                sent[i] += c[i] as f64;
                sum_x[i] += x[i] as f64;
                rounding[i] += U * ((x[i] as f64 + before[i] as f64).abs() + (e[i] as f64).abs());
            }
        }
        for i in 0..d {
            let total = sent[i] + ef.residual()[i] as f64;
            prop_assert!(
                (total - sum_x[i]).abs() <= 1.01 * rounding[i] + 1e-30,
                "coordinate {}: sent + residual = {}, Σx = {}, bound {}",
                i, total, sum_x[i], rounding[i]
            );
        }
    }

    /// DGC loses nothing: Σ_t sent_t + v_T = Σ_t u_t, where u_t = m·u_{t−1} + g_t is the
    /// momentum-corrected velocity before masking (u_{t−1} read back after masking). Only
    /// `v ← v + u` rounds (sending and masking copy and zero values), so the error is at
    /// most U·Σ_t |v_t| before masking.
    #[test]
    fn dgc_conserves_the_accumulation(
        gs in (1usize..200).prop_flat_map(|d| {
            proptest::collection::vec(proptest::collection::vec(-10f32..10.0, d), 1..=20)
        }),
        ratio in prop_oneof![Just(1.0f64), 0.001f64..1.0],
        momentum in 0f32..0.99,
        approximate in any::<bool>(),
        warmup_epochs in 0usize..3,
        seed in any::<u64>(),
    ) {
        let d = gs[0].len();
        let cfg = DgcConfig { ratio, momentum, warmup_epochs, approximate };
        let mut dgc = Dgc::new(cfg);
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut u, mut v) = (vec![0f32; d], vec![0f32; d]);
        let mut sent = vec![0f64; d];
        let mut sum_u = vec![0f64; d];
        let mut rounding = vec![0f64; d];
        for (epoch, g) in gs.iter().enumerate() {
            dgc.set_epoch(epoch);
            let u_t: Vec<f32> = (0..d).map(|i| momentum * u[i] + g[i]).collect();
            let (msg, c) = step(&mut dgc, g, &mut rng);
            prop_assert_eq!(msg[0], dgc.id() as u8);
            prop_assert!(msg.len() <= dgc.max_encoded_len(d));
            let k = murmur_compress::k_for_ratio(cfg.density(epoch), d);
            let nnz = c.iter().filter(|&&ci| ci != 0.0).count();
            prop_assert!(nnz <= dgc.last_k());
            if approximate {
                prop_assert!(dgc.last_k() <= 2 * k);
            } else {
                prop_assert_eq!(dgc.last_k(), k);
            }
            for i in 0..d {
                let v_t = v[i] as f64 + u_t[i] as f64;
                sent[i] += c[i] as f64;
                sum_u[i] += u_t[i] as f64;
                rounding[i] += U * v_t.abs();
                if c[i] != 0.0 {
                    // Momentum-factor masking at the sent coordinates.
                    prop_assert_eq!(dgc.u()[i], 0.0);
                    prop_assert_eq!(dgc.v()[i], 0.0);
                }
            }
            u.copy_from_slice(dgc.u());
            v.copy_from_slice(dgc.v());
        }
        for i in 0..d {
            let total = sent[i] + v[i] as f64;
            prop_assert!(
                (total - sum_u[i]).abs() <= 1.01 * rounding[i] + 1e-30,
                "coordinate {}: sent + v = {}, Σu = {}, bound {}",
                i, total, sum_u[i], rounding[i]
            );
        }
    }
}

#[test]
fn error_feedback_top1_accumulates_what_it_does_not_send() {
    // k = ⌈0.3·3⌉ = 1. Worked by hand (p = x + e; send top-1 of p; e = p − sent):
    //   t=1: p = [3, 1, 0] → send [3, 0, 0], e = [0, 1, 0]
    //   t=2: p = [3, 2, 0] → send [3, 0, 0], e = [0, 2, 0]
    //   t=3: p = [3, 3, 0] → tie, the lower index wins: send [3, 0, 0], e = [0, 3, 0]
    //   t=4: p = [3, 4, 0] → send [0, 4, 0], e = [3, 0, 0]
    let x = [3.0f32, 1.0, 0.0];
    let expected = [
        ([3.0, 0.0, 0.0], [0.0, 1.0, 0.0]),
        ([3.0, 0.0, 0.0], [0.0, 2.0, 0.0]),
        ([3.0, 0.0, 0.0], [0.0, 3.0, 0.0]),
        ([0.0, 4.0, 0.0], [3.0, 0.0, 0.0]),
    ];
    let mut ef = ErrorFeedback::new(Box::new(TopK::new(0.3)));
    assert!(ef.residual().is_empty());
    let mut rng = StdRng::seed_from_u64(1);
    let mut residual = [0.0f32; 3];
    for (t, (sent, e)) in expected.iter().enumerate() {
        let p: Vec<f32> = x.iter().zip(&residual).map(|(a, b)| a + b).collect();
        let (msg, c) = step(&mut ef, &x, &mut rng);
        assert_eq!(&c, sent, "message at t = {}", t + 1);
        assert_eq!(ef.residual(), e, "residual at t = {}", t + 1);
        // The message is exactly top-k's message of p.
        let (plain, _) = step(&mut TopK::new(0.3), &p, &mut rng);
        assert_eq!(msg, plain);
        residual.copy_from_slice(ef.residual());
    }
}

#[test]
fn error_feedback_reports_the_inner_operator() {
    let ef = ErrorFeedback::new(Box::new(RandK::new(0.25, true)));
    assert_eq!(ef.id(), OperatorId::RandK);
    assert!(
        !ef.unbiased(),
        "error feedback is biased even around scaled random-k"
    );
    let inner = RandK::new(0.25, true);
    assert_eq!(ef.encoded_len(1000), inner.encoded_len(1000));
    assert_eq!(ef.max_encoded_len(1000), inner.max_encoded_len(1000));
    let ef = ErrorFeedback::new(Box::new(Fp16::default()));
    assert_eq!(ef.id(), OperatorId::Fp16);
    assert_eq!(ef.encoded_len(10), Some(12 + 20));
}

#[test]
#[should_panic(expected = "error feedback: called with d = 4, but its state holds d = 3")]
fn error_feedback_panics_on_another_dimension() {
    let mut ef = ErrorFeedback::new(Box::new(Identity));
    let mut rng = StdRng::seed_from_u64(0);
    let mut out = Vec::new();
    ef.compress(&[1.0, 2.0, 3.0], &mut rng, &mut out);
    ef.compress(&[1.0, 2.0, 3.0, 4.0], &mut rng, &mut out);
}

#[test]
fn error_feedback_reset_forgets_the_residual_and_its_dimension() {
    let mut ef = ErrorFeedback::new(Box::new(TopK::new(0.3)));
    let mut rng = StdRng::seed_from_u64(0);
    step(&mut ef, &[3.0, 1.0, 0.0], &mut rng);
    assert_eq!(ef.residual(), [0.0, 1.0, 0.0]);
    ef.reset();
    assert!(ef.residual().is_empty());
    let (_, c) = step(&mut ef, &[0.0, 1.0, 5.0, 2.0], &mut rng);
    // k = ⌈0.3·4⌉ = 2.
    assert_eq!(c, [0.0, 0.0, 5.0, 2.0]);
    assert_eq!(ef.residual(), [0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn error_feedback_keeps_all_of_a_message_the_receiver_would_refuse() {
    // A NaN in x makes the message undecodable: nothing counts as sent, e = p.
    let mut ef = ErrorFeedback::new(Box::new(Identity));
    let mut rng = StdRng::seed_from_u64(0);
    let mut out = Vec::new();
    ef.compress(&[1.0, f32::NAN], &mut rng, &mut out);
    assert_eq!(ef.residual()[0], 1.0);
    assert!(ef.residual()[1].is_nan());
    ef.reset();
    step(&mut ef, &[1.0, 2.0], &mut rng);
    assert_eq!(ef.residual(), [0.0, 0.0]);
}

#[test]
fn dgc_with_momentum_one_half_by_hand() {
    // d = 4, density 0.25 → k = 1, exact selection, m = 0.5. By hand:
    //   t=1: g = [1, −2, 0.5, 0]
    //        u = [1, −2, 0.5, 0], v = [1, −2, 0.5, 0]      → send index 1: −2
    //        masked: u = [1, 0, 0.5, 0], v = [1, 0, 0.5, 0]
    //   t=2: g = [1, 1, 1, 1]
    //        u = 0.5·[1, 0, 0.5, 0] + g = [1.5, 1, 1.25, 1]
    //        v = [1, 0, 0.5, 0] + u = [2.5, 1, 1.75, 1]     → send index 0: 2.5
    //        masked: u = [0, 1, 1.25, 1], v = [0, 1, 1.75, 1]
    //   t=3: g = [0, 0, −1, 2]
    //        u = 0.5·[0, 1, 1.25, 1] + g = [0, 0.5, −0.375, 2.5]
    //        v = [0, 1, 1.75, 1] + u = [0, 1.5, 1.375, 3.5] → send index 3: 3.5
    //        masked: u = [0, 0.5, −0.375, 0], v = [0, 1.5, 1.375, 0]
    let cfg = DgcConfig {
        ratio: 0.25,
        momentum: 0.5,
        warmup_epochs: 0,
        approximate: false,
    };
    let mut dgc = Dgc::new(cfg);
    assert_eq!(dgc.id(), OperatorId::TopK);
    assert_eq!(dgc.density(), 0.25);
    let mut rng = StdRng::seed_from_u64(0);
    // (g, sent, u after masking, v after masking)
    type Step = ([f32; 4], [f32; 4], [f32; 4], [f32; 4]);
    let steps: [Step; 3] = [
        (
            [1.0, -2.0, 0.5, 0.0],
            [0.0, -2.0, 0.0, 0.0],
            [1.0, 0.0, 0.5, 0.0],
            [1.0, 0.0, 0.5, 0.0],
        ),
        (
            [1.0, 1.0, 1.0, 1.0],
            [2.5, 0.0, 0.0, 0.0],
            [0.0, 1.0, 1.25, 1.0],
            [0.0, 1.0, 1.75, 1.0],
        ),
        (
            [0.0, 0.0, -1.0, 2.0],
            [0.0, 0.0, 0.0, 3.5],
            [0.0, 0.5, -0.375, 0.0],
            [0.0, 1.5, 1.375, 0.0],
        ),
    ];
    for (t, (g, sent, u, v)) in steps.iter().enumerate() {
        let (msg, c) = step(&mut dgc, g, &mut rng);
        assert_eq!(msg[0], OperatorId::TopK as u8);
        assert_eq!(&c, sent, "message at t = {}", t + 1);
        assert_eq!(dgc.u(), u, "u at t = {}", t + 1);
        assert_eq!(dgc.v(), v, "v at t = {}", t + 1);
        assert_eq!(dgc.last_k(), 1);
    }
}

#[test]
fn dgc_warm_up_densities() {
    let cfg = DgcConfig {
        ratio: 0.001,
        warmup_epochs: 4,
        ..DgcConfig::default()
    };
    assert_eq!(cfg, DgcConfig::default());
    let expected = [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001];
    let mut dgc = Dgc::new(DgcConfig {
        approximate: false,
        ..cfg
    });
    let mut rng = StdRng::seed_from_u64(0);
    let g: Vec<f32> = (0..10_000).map(|i| (i % 97) as f32 - 48.0).collect();
    for (epoch, &density) in expected.iter().enumerate() {
        assert_eq!(cfg.density(epoch), density, "epoch {epoch}");
        dgc.set_epoch(epoch);
        assert_eq!(dgc.density(), density, "epoch {epoch}");
        step(&mut dgc, &g, &mut rng);
        assert_eq!(
            dgc.last_k(),
            (density * 10_000.0).ceil() as usize,
            "epoch {epoch}"
        );
    }
    // A ratio above the warm-up's density wins; no warm-up means the ratio from epoch 0.
    let coarse = DgcConfig { ratio: 0.1, ..cfg };
    assert_eq!(
        (0..6).map(|e| coarse.density(e)).collect::<Vec<_>>(),
        [0.25, 0.1, 0.1, 0.1, 0.1, 0.1]
    );
    let none = DgcConfig {
        warmup_epochs: 0,
        ..cfg
    };
    assert_eq!(none.density(0), 0.001);
    assert_eq!(Dgc::new(none).density(), 0.001);
}

#[test]
fn dgc_approximate_sends_about_k_as_approx_top_k() {
    let mut dgc = Dgc::new(DgcConfig {
        ratio: 0.01,
        warmup_epochs: 0,
        ..DgcConfig::default()
    });
    assert_eq!(dgc.id(), OperatorId::ApproxTopK);
    assert!(!dgc.unbiased());
    assert_eq!(dgc.encoded_len(100_000), None);
    let mut rng = StdRng::seed_from_u64(5);
    let g: Vec<f32> = (0..100_000)
        .map(|i| ((i * 7919) % 10_007) as f32 / 10_007.0 - 0.5)
        .collect();
    let (msg, _) = step(&mut dgc, &g, &mut rng);
    assert_eq!(msg[0], OperatorId::ApproxTopK as u8);
    assert!(msg.len() <= dgc.max_encoded_len(100_000));
    // k = 1000; 256 sampled hits put the achieved k well within ±30%.
    assert!((700..1300).contains(&dgc.last_k()), "{}", dgc.last_k());
}

#[test]
#[should_panic(expected = "DGC: called with d = 2, but its state holds d = 3")]
fn dgc_panics_on_another_dimension() {
    let mut dgc = Dgc::new(DgcConfig::default());
    let mut rng = StdRng::seed_from_u64(0);
    let mut out = Vec::new();
    dgc.compress(&[1.0, 2.0, 3.0], &mut rng, &mut out);
    dgc.compress(&[1.0, 2.0], &mut rng, &mut out);
}

#[test]
#[should_panic(expected = "DGC momentum must be in [0, 1)")]
fn dgc_refuses_momentum_one() {
    Dgc::new(DgcConfig {
        momentum: 1.0,
        ..DgcConfig::default()
    });
}

/// A saved state restored into a fresh operator continues exactly as the original: error
/// feedback around top-k and DGC, five calls, save, three more calls on both.
#[test]
fn a_restored_state_continues_like_the_saved_operator() {
    let make: [fn() -> Box<dyn Compressor>; 2] = [
        || Box::new(ErrorFeedback::new(Box::new(TopK::new(0.2)))),
        || {
            Box::new(Dgc::new(DgcConfig {
                ratio: 0.2,
                warmup_epochs: 0,
                approximate: false,
                ..DgcConfig::default()
            }))
        },
    ];
    for make in make {
        let mut a = make();
        assert!(a.state().is_empty(), "no state before the first call");
        let mut rng = StdRng::seed_from_u64(3);
        let xs: Vec<Vec<f32>> = (0..8)
            .map(|t| {
                (0..20)
                    .map(|k| ((t * 13 + k * 7) % 9) as f32 - 4.0)
                    .collect()
            })
            .collect();
        for x in &xs[..5] {
            step(&mut *a, x, &mut rng);
        }
        let saved: Vec<(String, Vec<f32>)> = a
            .state()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        assert!(!saved.is_empty());
        let mut b = make();
        b.restore_state(20, &saved).unwrap();
        for (t, x) in xs[5..].iter().enumerate() {
            // Top-k and exact DGC draw nothing; one seed per call keeps both streams equal.
            let mut ra = StdRng::seed_from_u64(100 + t as u64);
            let mut rb = StdRng::seed_from_u64(100 + t as u64);
            assert_eq!(step(&mut *a, x, &mut ra), step(&mut *b, x, &mut rb));
        }
        // A state of another length, another name or a NaN is refused, nothing changed.
        let mut bad = saved.clone();
        bad[0].1.pop();
        let mut c = make();
        assert!(c.restore_state(20, &bad).is_err());
        assert!(c.state().is_empty());
        let mut nan = saved.clone();
        nan[0].1[3] = f32::NAN;
        assert!(c.restore_state(20, &nan).is_err());
        let renamed = vec![("momentum".to_string(), saved[0].1.clone())];
        assert!(c.restore_state(20, &renamed).is_err());
    }
    // A stateless operator refuses a non-empty state and accepts an empty one.
    let mut t = TopK::new(0.5);
    assert!(t.restore_state(4, &[]).is_ok());
    assert!(t
        .restore_state(4, &[("residual".to_string(), vec![0.0; 4])])
        .is_err());
}
