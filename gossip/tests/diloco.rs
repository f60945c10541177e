//! DiLoCo: H inner steps, then an outer optimizer step on the averaged pseudo-gradient;
//! `diloco` averages by ring all-reduce, `diloco-gossip` mixes on W.

use std::time::Duration;

use murmur_compress::CompressorSpec;
use murmur_gossip::sim::Sim;
use murmur_gossip::{
    chunk_range, AlgorithmOptions, AlgorithmSpec, AllReduce, AllReduceConfig, DPsgd, DPsgdConfig,
    DiLoCo, Gossip, GossipError, OuterConfig, OuterOptimizer,
};

mod common;
use common::{
    build, build_for_tensors, drain_mixed, max_abs_diff, network, rebuild, ring, ring_mh, snapshot,
    uniform_vectors, Net,
};

fn options(h: u64, outer: OuterConfig) -> AlgorithmOptions {
    AlgorithmOptions {
        local_steps: Some(h),
        outer_optimizer: Some(outer.optimizer),
        outer_lr: Some(outer.lr),
        outer_momentum: Some(outer.momentum),
        ..Default::default()
    }
}

/// The inner directions of round t: n vectors `[d]`, the same for every network.
fn grads(n: usize, d: usize, t: u64) -> Vec<Vec<f32>> {
    uniform_vectors(n, d, 1.0, 1000 + t)
}

/// Gradients g_i = x_i − b_i of f_i(x) = ½‖x − b_i‖² at each peer's parameters.
fn quadratic_grads(sim: &Sim, b: &[Vec<f32>]) -> Vec<Vec<f32>> {
    (0..sim.n())
        .map(|i| {
            sim.peer(i)
                .params()
                .iter()
                .zip(&b[i])
                .map(|(x, bi)| x - bi)
                .collect()
        })
        .collect()
}

/// Peer i's anchor, from its state.
fn anchor(p: &dyn Gossip) -> Vec<f32> {
    let s = p.state();
    let (name, a) = &s.vectors[0];
    assert_eq!(name, "diloco.anchor");
    a.clone()
}

fn mean(xs: &[Vec<f32>]) -> Vec<f64> {
    common::serial_mean(xs)
}

#[test]
fn outer_sgd_with_unit_lr_is_local_sgd() {
    let (n, d, h, lr) = (5, 12, 3, 0.1);
    let x0 = vec![uniform_vectors(1, d, 1.0, 7).remove(0); n];
    let avg = options(h, OuterConfig::averaging());
    let plain = AlgorithmOptions {
        local_steps: Some(h),
        ..Default::default()
    };
    for (diloco, local) in [("diloco", "local-avg"), ("diloco-gossip", "local-sgd")] {
        // The gossip form from different starts, the all-reduce form from a shared one.
        let starts = if diloco == "diloco" {
            x0.clone()
        } else {
            uniform_vectors(n, d, 1.0, 8)
        };
        let mut a = Sim::new(network(diloco, &starts, lr, &avg));
        let mut b = Sim::new(network(local, &starts, lr, &plain));
        for t in 0..4 * h {
            let g = grads(n, d, t);
            a.run_round(Some(&g)).unwrap();
            b.run_round(Some(&g)).unwrap();
            for i in 0..n {
                let err = max_abs_diff(a.peer(i).params(), b.peer(i).params());
                assert!(
                    err < 1e-6,
                    "{diloco} vs {local}, round {t}, peer {i}: {err}"
                );
            }
        }
        assert_eq!(
            a.peer(0).stats(),
            b.peer(0).stats(),
            "{diloco}: same frames"
        );
    }
}

#[test]
fn allreduce_anchors_are_identical_and_the_nesterov_step_matches_a_hand_computation() {
    // n = 2, d = 3, H = 2, η = 0.5, x⁰ = 0; peer 0 steps along g₀ = (2, 0, 4), peer 1
    // along g₁ = (0, 2, 0). After two inner steps x₀ = a − (2, 0, 4), x₁ = a − (0, 2, 0),
    // so Δ̄ = a − mean x = (1, 1, 2) at every outer step.
    // Outer step 1: v = Δ̄, u = Δ̄ + 0.9 v = 1.9 Δ̄, a = −0.7 · 1.9 Δ̄ = −1.33 Δ̄.
    // Outer step 2: v = 0.9 Δ̄ + Δ̄ = 1.9 Δ̄, u = Δ̄ + 0.9 · 1.9 Δ̄ = 2.71 Δ̄,
    //               a = −1.33 Δ̄ − 0.7 · 2.71 Δ̄ = −3.227 Δ̄.
    let g = vec![vec![2.0, 0.0, 4.0], vec![0.0, 2.0, 0.0]];
    let mut sim = Sim::new(network(
        "diloco",
        &[vec![0.0; 3], vec![0.0; 3]],
        0.5,
        &options(2, OuterConfig::paper()),
    ));
    let delta = [1.0f32, 1.0, 2.0];
    sim.run_round(Some(&g)).unwrap();
    assert_eq!(sim.peer(0).params(), &[-1.0, 0.0, -2.0], "an inner step");
    assert_eq!(sim.peer(1).params(), &[0.0, -1.0, 0.0]);
    assert_eq!(
        sim.peer(0).stats().frames_sent,
        0,
        "inner steps send nothing"
    );
    for (t, factor) in [(1, -1.33f32), (3, -3.227)] {
        sim.run_round(Some(&g)).unwrap();
        assert_eq!(sim.peer(0).round(), t + 1);
        let want: Vec<f32> = delta.iter().map(|d| factor * d).collect();
        for i in 0..2 {
            let err = max_abs_diff(sim.peer(i).params(), &want);
            assert!(err < 1e-5, "outer step at round {t}, peer {i}: {err}");
            assert_eq!(anchor(sim.peer(i)), sim.peer(i).params(), "x ← a");
        }
        assert_eq!(anchor(sim.peer(0)), anchor(sim.peer(1)));
        if t == 1 {
            sim.run_round(Some(&g)).unwrap();
        }
    }
    // More peers, random directions: the anchors stay bit for bit the same.
    let (n, d) = (5, 17);
    let x0 = vec![uniform_vectors(1, d, 1.0, 3).remove(0); n];
    let mut sim = Sim::new(network(
        "diloco",
        &x0,
        0.05,
        &options(3, OuterConfig::paper()),
    ));
    for t in 0..30 {
        sim.run_round(Some(&grads(n, d, t))).unwrap();
        let a0 = anchor(sim.peer(0));
        for i in 1..n {
            assert_eq!(anchor(sim.peer(i)), a0, "round {t}, peer {i}");
            assert_eq!(sim.peer(i).state(), sim.peer(0).state(), "velocity too");
        }
    }
}

#[test]
fn independent_starts_are_pulled_together_by_the_allreduce_form() {
    // Mixing the models (not Δ alone) makes anchors that start apart agree.
    let (n, d) = (4, 9);
    let mut sim = Sim::new(network(
        "diloco",
        &uniform_vectors(n, d, 1.0, 5),
        0.0,
        &options(2, OuterConfig::paper()),
    ));
    let start = sim.consensus_distance();
    sim.run_rounds(200).unwrap();
    assert!(
        sim.consensus_distance() < 1e-10 * start,
        "Ξ²: {start} → {}",
        sim.consensus_distance()
    );
}

#[test]
fn the_gossip_form_keeps_the_anchor_average_and_reaches_consensus() {
    let (n, d, h) = (8, 10, 2);
    let x0 = uniform_vectors(n, d, 1.0, 21);
    let m0 = mean(&x0);
    for outer in [OuterConfig::averaging(), OuterConfig::paper()] {
        let mut sim = Sim::new(network("diloco-gossip", &x0, 0.1, &options(h, outer)));
        let start = sim.consensus_distance();
        for t in 0..400u64 {
            sim.run_round(None).unwrap();
            if (t + 1) % h == 0 {
                let anchors: Vec<Vec<f32>> = (0..n).map(|i| anchor(sim.peer(i))).collect();
                for (k, (a, b)) in mean(&anchors).iter().zip(&m0).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "{outer:?} round {t}: mean[{k}] {b} → {a}"
                    );
                }
            }
        }
        let end = sim.consensus_distance();
        assert!(end < 1e-8 * start, "{outer:?}: Ξ² {start} → {end}");
    }
    // With heterogeneous quadratics f_i = ½‖x − b_i‖² the peers' average reaches the
    // minimiser of the average loss, b̄ (the gradients are linear with one Hessian, so the
    // anchors' average follows the all-reduce form exactly). The outer step's fixed point
    // is Δ̄_i = 0 whatever the optimizer, a = W x(a): local-SGD gossip's, with its drift.
    let b = uniform_vectors(n, d, 1.0, 22);
    let b_mean = mean(&b);
    let h = 4;
    let mut sim = Sim::new(network(
        "diloco-gossip",
        &x0,
        0.1,
        &options(h, OuterConfig::paper()),
    ));
    let local_steps = AlgorithmOptions {
        local_steps: Some(h),
        ..Default::default()
    };
    let mut local = Sim::new(network("local-sgd", &x0, 0.1, &local_steps));
    for _ in 0..2000 {
        let g = quadratic_grads(&sim, &b);
        sim.run_round(Some(&g)).unwrap();
        let g = quadratic_grads(&local, &b);
        local.run_round(Some(&g)).unwrap();
    }
    let err = sim
        .average()
        .iter()
        .zip(&b_mean)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    assert!(err < 1e-3, "x̄ is {err} from the minimiser");
    for i in 0..n {
        let err = max_abs_diff(sim.peer(i).params(), local.peer(i).params());
        assert!(
            err < 1e-4,
            "peer {i}: {err} from local-SGD gossip's fixed point"
        );
    }
    let spread = murmur_gossip::consensus_distance(b.iter().map(|v| v.as_slice())).0;
    let xi = sim.consensus_distance();
    assert!(xi < 0.2 * spread, "Ξ² = {xi}, the b_i spread {spread}");
}

#[test]
fn bytes_per_inner_step_fall_by_h() {
    let (n, d, h, rounds) = (4, 40, 5, 20u64);
    let x0 = vec![vec![0.5; d]; n];
    for (diloco, every_round) in [("diloco", "allreduce"), ("diloco-gossip", "dpsgd")] {
        let mut a = Sim::new(network(diloco, &x0, 0.1, &options(h, OuterConfig::paper())));
        let mut b = Sim::new(network(every_round, &x0, 0.1, &AlgorithmOptions::default()));
        for t in 0..rounds {
            let g = grads(n, d, t);
            a.run_round(Some(&g)).unwrap();
            b.run_round(Some(&g)).unwrap();
        }
        for i in 0..n {
            let (sa, sb) = (a.peer(i).stats(), b.peer(i).stats());
            assert!(sa.bytes_sent > 0);
            assert_eq!(sa.bytes_sent * h, sb.bytes_sent, "{diloco}, peer {i}");
            assert_eq!(sa.frames_sent * h, sb.frames_sent, "{diloco}, peer {i}");
            assert_eq!(
                sa.bytes_received * h,
                sb.bytes_received,
                "{diloco}, peer {i}"
            );
        }
    }
}

#[test]
fn a_run_resumed_from_its_state_continues_bit_for_bit() {
    let (n, d, h) = (4, 11, 3);
    let opts = options(h, OuterConfig::paper());
    for name in ["diloco", "diloco-gossip"] {
        let x0 = vec![uniform_vectors(1, d, 1.0, 9).remove(0); n];
        let mut original = Sim::new(network(name, &x0, 0.1, &opts));
        // 7 rounds: two outer steps and one inner step into the third interval.
        for t in 0..7 {
            original.run_round(Some(&grads(n, d, t))).unwrap();
        }
        let saved = snapshot(&original);
        let names: Vec<&str> = saved[0].2.vectors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["diloco.anchor", "diloco.outer_velocity"], "{name}");
        assert_ne!(saved[0].0, saved[0].2.vectors[0].1, "mid-interval: x ≠ a");
        let (mut restored, mut forgetful) = (
            rebuild(name, &saved, 0.1, &opts, true),
            rebuild(name, &saved, 0.1, &opts, false),
        );
        for t in 7..15 {
            let g = grads(n, d, t);
            original.run_round(Some(&g)).unwrap();
            restored.run_round(Some(&g)).unwrap();
            forgetful.run_round(Some(&g)).unwrap();
        }
        for i in 0..n {
            assert_eq!(original.peer(i).round(), 15);
            assert_eq!(restored.peer(i).round(), 15);
            assert_eq!(
                original.peer(i).params(),
                restored.peer(i).params(),
                "{name}: peer {i}"
            );
            assert_eq!(original.peer(i).state(), restored.peer(i).state());
        }
        assert!(
            (0..n).any(|i| original.peer(i).params() != forgetful.peer(i).params()),
            "{name}: restoring changed nothing"
        );
    }
}

#[test]
fn a_state_that_does_not_fit_is_refused_and_changes_nothing() {
    let (n, d) = (3, 5);
    let opts = options(2, OuterConfig::paper());
    let x0 = vec![vec![1.0; d]; n];
    let mut sim = Sim::new(network("diloco-gossip", &x0, 0.1, &opts));
    for t in 0..3 {
        sim.run_round(Some(&grads(n, d, t))).unwrap();
    }
    let good = sim.peer(1).state();
    let mut p = build("diloco-gossip", &ring(n), 1, vec![1.0; d], 0.1, &opts).unwrap();
    let before = p.state();
    let mut short = good.clone();
    short.vectors[1].1.pop();
    let mut nan = good.clone();
    nan.vectors[0].1[2] = f32::NAN;
    let mut unnamed = good.clone();
    unnamed.vectors.remove(1);
    let mut foreign = good.clone();
    foreign.vectors.push(("x_hat".into(), vec![0.0; d]));
    for bad in [short, nan, unnamed, foreign] {
        assert!(p.restore_state(&bad).is_err(), "{bad:?}");
        assert_eq!(p.state(), before, "unchanged after a refusal");
    }
    p.restore_state(&good).unwrap();
    assert_eq!(p.state(), good);
}

#[test]
fn the_gossip_form_skipping_a_straggler_keeps_the_anchor_average() {
    let (n, d, h, straggler) = (6, 8, 2, 2);
    let w = ring_mh(n);
    let x0 = uniform_vectors(n, d, 1.0, 31);
    let skip = Duration::from_millis(5);
    let mut peers: Vec<DiLoCo> = (0..n)
        .map(|i| {
            let mut cfg = DPsgdConfig::from_matrix(&w, i, 0.0, d);
            cfg.round_timeout = Duration::from_secs(3600);
            cfg.skip_after = Some(skip);
            let inner = DPsgd::new(cfg, x0[i].clone());
            DiLoCo::new(Box::new(inner), h, 0.1, OuterConfig::paper()).unwrap()
        })
        .collect();
    let m0 = mean(&x0);
    let mut now = std::time::Instant::now();
    // (round due, from, to, frame)
    let mut queue: Vec<(u64, usize, usize, Vec<u8>)> = Vec::new();
    let mut dropped = 0;
    for t in 0..400u64 {
        // Peer 2's frames are a round late during the first 40 rounds.
        let late = if t < 40 { 1 } else { 0 };
        for (i, p) in peers.iter_mut().enumerate() {
            let x = p.params().to_vec();
            p.begin_round(now, &x, None);
            while let Some(tr) = p.poll_transmit() {
                let at = if i == straggler { t + late } else { t };
                queue.push((at, i, tr.to, tr.frame.to_vec()));
            }
        }
        let (due, rest): (Vec<_>, Vec<_>) = queue.drain(..).partition(|f| f.0 <= t);
        queue = rest;
        for (_, from, to, frame) in due {
            match peers[to].handle_message(now, from, &frame) {
                Ok(()) => {}
                // A straggler's frame of a round its neighbour mixed without it.
                Err(GossipError::Skipped { .. }) => dropped += 1,
                Err(e) => panic!("round {t}: peer {to} refused peer {from}: {e}"),
            }
        }
        for (i, p) in peers.iter_mut().enumerate() {
            p.handle_timeout(now + skip);
            assert!(drain_mixed(p), "peer {i} did not complete round {t}");
        }
        now += Duration::from_millis(10);
    }
    assert!(queue.is_empty());
    assert!(dropped > 0);
    assert!(peers.iter().map(|p| p.stats().skipped).sum::<u64>() > 0);
    let anchors: Vec<Vec<f32>> = peers.iter().map(|p| p.anchor().to_vec()).collect();
    for (k, (a, b)) in mean(&anchors).iter().zip(&m0).enumerate() {
        assert!((a - b).abs() < 1e-4, "mean[{k}]: {b} → {a}");
        for x in &anchors {
            assert!((f64::from(x[k]) - b).abs() < 1e-3, "consensus at {k}");
        }
    }
}

#[test]
fn a_model_that_is_not_finite_is_reported_at_the_outer_step() {
    let x0 = vec![vec![0.0; 3]; 2];
    let mut sim = Sim::new(network(
        "diloco",
        &x0,
        0.1,
        &options(2, OuterConfig::paper()),
    ));
    let bad = vec![vec![f32::NAN, 0.0, 0.0], vec![0.0; 3]];
    // An inner step sends nothing and checks nothing; the outer step refuses to send NaN.
    sim.run_round(Some(&bad)).unwrap();
    match sim.run_round(None) {
        Err(murmur_gossip::sim::SimError::Diverged(0, 1, reason)) => {
            assert!(reason.contains("x[0] = NaN"), "{reason}")
        }
        other => panic!("expected peer 0 to diverge in round 1, got {other:?}"),
    }
    assert_eq!(sim.peer(0).stats().frames_sent, 0);
}

#[test]
fn bad_options_are_refused_with_clear_messages_and_never_panic() {
    let diloco: AlgorithmSpec = "diloco".parse().unwrap();
    let gossip: AlgorithmSpec = "diloco-gossip".parse().unwrap();
    let dpsgd: AlgorithmSpec = "dpsgd".parse().unwrap();
    let cases: [(AlgorithmOptions, &str); 8] = [
        (
            AlgorithmOptions {
                outer_lr: Some(0.0),
                ..Default::default()
            },
            "--outer-lr must be a finite number > 0, got 0",
        ),
        (
            AlgorithmOptions {
                outer_lr: Some(-0.5),
                ..Default::default()
            },
            "--outer-lr",
        ),
        (
            AlgorithmOptions {
                outer_lr: Some(f32::NAN),
                ..Default::default()
            },
            "--outer-lr",
        ),
        (
            AlgorithmOptions {
                outer_lr: Some(f32::INFINITY),
                ..Default::default()
            },
            "--outer-lr",
        ),
        (
            AlgorithmOptions {
                outer_momentum: Some(1.0),
                ..Default::default()
            },
            "--outer-momentum must be in [0, 1), got 1",
        ),
        (
            AlgorithmOptions {
                outer_momentum: Some(-0.1),
                ..Default::default()
            },
            "--outer-momentum",
        ),
        (
            AlgorithmOptions {
                outer_momentum: Some(f32::NAN),
                ..Default::default()
            },
            "--outer-momentum",
        ),
        (
            AlgorithmOptions {
                local_steps: Some(0),
                ..Default::default()
            },
            "--local-steps must be at least 1",
        ),
    ];
    for (o, msg) in &cases {
        for spec in [diloco, gossip] {
            let err = o.validate(&[spec]).unwrap_err().to_string();
            assert!(err.contains(msg), "validate: {err}");
            // The registry's build refuses the same options unvalidated, with an error.
            let err = build(spec.name(), &ring(3), 0, vec![0.0; 4], 0.1, o)
                .err()
                .unwrap_or_else(|| panic!("{spec} built with {o:?}"));
            assert!(err.to_string().contains(&msg[..10]), "build: {err}");
        }
    }
    // The outer options belong to DiLoCo only.
    let o = AlgorithmOptions {
        outer_lr: Some(0.5),
        ..Default::default()
    };
    let err = o.validate(&[dpsgd]).unwrap_err().to_string();
    assert!(
        err.contains("--outer-lr") && err.contains("diloco or diloco-gossip"),
        "{err}"
    );
    assert!(o.validate(&[diloco]).is_ok());
    // Both forms take a compressor; the all-reduce form refuses the ones its compressed
    // ring cannot use (state of their own, layer-wise, or diverging under error feedback).
    let o = AlgorithmOptions {
        compressor: Some("topk:0.1".parse().unwrap()),
        ..Default::default()
    };
    assert!(o.validate(&[diloco]).is_ok());
    assert!(o.validate(&[gossip]).is_ok());
    for (c, msg) in [
        ("ef+topk:0.1", "own error-feedback residual"),
        ("dgc:0.01", "DGC"),
        ("topk:0.1,layerwise", "layerwise"),
        ("randk:0.1", "random-k"),
        ("terngrad", "sign"),
    ] {
        let o = AlgorithmOptions {
            compressor: Some(c.parse().unwrap()),
            ..Default::default()
        };
        let err = o.validate(&[diloco]).unwrap_err().to_string();
        assert!(err.contains(msg) && err.contains("diloco"), "{c}: {err}");
        let err = build("diloco", &ring(3), 0, vec![0.0; 4], 0.1, &o)
            .err()
            .unwrap_or_else(|| panic!("diloco built with {c}"));
        assert_eq!(
            err.to_string(),
            o.validate(&[diloco]).unwrap_err().to_string()
        );
        assert!(
            o.validate(&[gossip]).is_ok(),
            "{c}: diloco-gossip unchanged"
        );
    }
    let err = "adam".parse::<OuterOptimizer>().unwrap_err();
    assert!(err.contains("nesterov or sgd"), "{err}");
    assert!(DiLoCo::new(
        build(
            "dpsgd",
            &ring(3),
            0,
            vec![0.0; 2],
            0.0,
            &AlgorithmOptions::default()
        )
        .unwrap(),
        0,
        0.1,
        OuterConfig::paper()
    )
    .is_err());
}

#[test]
fn the_fingerprint_names_the_outer_step_with_its_defaults() {
    let spec = |s: &str| s.parse::<AlgorithmSpec>().unwrap();
    let o = AlgorithmOptions::default();
    assert_eq!(
        o.protocol_fingerprint(&[spec("diloco")]),
        "local_steps=50 outer_optimizer=nesterov outer_lr=0.7 outer_momentum=0.9"
    );
    let o = AlgorithmOptions {
        outer_optimizer: Some(OuterOptimizer::Sgd),
        ..Default::default()
    };
    assert_eq!(
        o.protocol_fingerprint(&[spec("diloco-gossip")]),
        "local_steps=50 outer_optimizer=sgd outer_lr=1 outer_momentum=0 robust=none"
    );
    assert_eq!(o.outer(), OuterConfig::averaging());
    for name in ["nesterov", "sgd"] {
        assert_eq!(name.parse::<OuterOptimizer>().unwrap().to_string(), name);
    }
    let d = spec("diloco");
    let dc = d.capabilities();
    assert!(dc.has_local_steps() && !dc.uses_topology());
    assert_eq!(
        dc.compresses,
        murmur_gossip::Compresses::PseudoGradients,
        "it compresses Δ with error feedback, not the models"
    );
    assert_eq!(o.local_steps(&*d), 50);
    assert_eq!(o.local_steps(&*spec("local-sgd")), 4, "unchanged");
    let g = spec("diloco-gossip").capabilities();
    assert!(g.uses_topology() && g.compresses.takes_compressor() && g.survives_departure());
    assert!(!dc.survives_departure());
}

// ---- Compressed pseudo-gradients: the INTELLECT-1 int8 ring all-reduce ------------------

/// "int8": QSGD with 127 levels is 1 sign bit + 7 level bits per value, plus one f32 norm
/// per bucket of 128 values.
const INT8: &str = "qsgd:127,bucket=128";

fn compressed_options(h: u64, outer: OuterConfig, compressor: &str) -> AlgorithmOptions {
    AlgorithmOptions {
        compressor: Some(compressor.parse().unwrap()),
        ..options(h, outer)
    }
}

/// n peers of compressed DiLoCo built directly (for the drivers that need `&mut` access),
/// peer i seeded with i as the registry does.
fn compressed_peers(
    x0: &[Vec<f32>],
    lr: f32,
    h: u64,
    outer: OuterConfig,
    compressor: &str,
) -> Vec<DiLoCo> {
    let n = x0.len();
    let spec: CompressorSpec = compressor.parse().unwrap();
    (0..n)
        .map(|i| {
            let cfg = AllReduceConfig::new(i, n, 0.0, x0[i].len());
            let ring = AllReduce::compressed(cfg, x0[i].clone(), spec.build(None).unwrap());
            DiLoCo::compressed(ring, h, lr, outer, i as u64).unwrap()
        })
        .collect()
}

/// (1/n) Σ_i ½‖x − b_i‖², in f64.
fn quadratic_loss(x: &[f32], b: &[Vec<f32>]) -> f64 {
    let total: f64 = b
        .iter()
        .map(|bi| {
            x.iter()
                .zip(bi)
                .map(|(x, b)| 0.5 * (f64::from(*x) - f64::from(*b)).powi(2))
                .sum::<f64>()
        })
        .sum();
    total / b.len() as f64
}

/// Gradients x_i − b_i at the parameters `xs`.
fn quadratic_grads_at(xs: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<Vec<f32>> {
    xs.iter()
        .zip(b)
        .map(|(x, bi)| x.iter().zip(bi).map(|(x, b)| x - b).collect())
        .collect()
}

#[test]
fn int8_pseudo_gradients_reach_the_uncompressed_loss_with_under_0_3_of_the_bytes() {
    let (qsgd, int8) = (
        compressed_against_plain(INT8),
        compressed_against_plain("int8"),
    );
    // The absmax scale is the finer step: a lower noise floor at the same bytes.
    assert!(
        int8 < qsgd,
        "f − f* after 30 outer steps: int8 {int8:e}, qsgd:127 {qsgd:e}"
    );
}

/// DiLoCo with pseudo-gradients compressed by `spec` (8 bits a value) against uncompressed
/// DiLoCo on quadratics: under 0.3 of the bytes per outer step, and within 1e-4 of the
/// initial gap of the uncompressed loss after 30 outer steps. Returns the compressed run's
/// final f − f*.
fn compressed_against_plain(spec: &str) -> f64 {
    let (n, d, h, lr, outer_steps) = (4, 2000, 5, 0.1, 30u64);
    let x0 = vec![uniform_vectors(1, d, 1.0, 40).remove(0); n];
    let b = uniform_vectors(n, d, 1.0, 41);
    let outer = OuterConfig::paper();
    let mut plain = Sim::new(network("diloco", &x0, lr, &options(h, outer)));
    let mut int8 = Sim::new(network(
        "diloco",
        &x0,
        lr,
        &compressed_options(h, outer, spec),
    ));
    let b_mean: Vec<f32> = mean(&b).iter().map(|v| *v as f32).collect();
    let (l0, l_star) = (quadratic_loss(&x0[0], &b), quadratic_loss(&b_mean, &b));
    // Bytes peer 0 sent in each outer step, (uncompressed, int8).
    let mut per_step = Vec::new();
    let mut losses = Vec::new();
    for t in 0..outer_steps * h {
        let before = (plain.peer(0).stats(), int8.peer(0).stats());
        let g = quadratic_grads(&plain, &b);
        plain.run_round(Some(&g)).unwrap();
        let g = quadratic_grads(&int8, &b);
        int8.run_round(Some(&g)).unwrap();
        if (t + 1) % h == 0 {
            per_step.push((
                plain.peer(0).stats().bytes_sent - before.0.bytes_sent,
                int8.peer(0).stats().bytes_sent - before.1.bytes_sent,
            ));
            losses.push((
                quadratic_loss(plain.peer(0).params(), &b) - l_star,
                quadratic_loss(int8.peer(0).params(), &b) - l_star,
            ));
        }
    }
    // The first outer step averages the models raw (the anchors align): the same bytes.
    assert_eq!(per_step[0].0, per_step[0].1);
    for (k, (raw, c)) in per_step.iter().enumerate().skip(1) {
        let ratio = *c as f64 / *raw as f64;
        assert!(ratio <= 0.3, "outer step {k}: {c} / {raw} bytes = {ratio}");
    }
    let (raw, c) = per_step[1];
    eprintln!(
        "bytes per outer step (peer 0): uncompressed {raw}, {spec} {c}, ratio {:.4}",
        c as f64 / raw as f64
    );
    for (k, (p, c)) in losses.iter().enumerate() {
        eprintln!("outer step {k}: f − f* uncompressed {p:.6e}, {spec} {c:.6e}");
    }
    let (p, c) = *losses.last().unwrap();
    let gap = l0 - l_star;
    eprintln!("f(x⁰) − f* = {gap:.3}; after {outer_steps} outer steps: uncompressed {p:.3e}, {spec} {c:.3e}");
    assert!(
        p < 1e-4 * gap,
        "uncompressed DiLoCo converged: {p} of {gap}"
    );
    assert!(
        (c - p).abs() < 1e-4 * gap,
        "{spec} within 1e-4 of the initial gap of uncompressed: {c} vs {p} (gap {gap})"
    );
    c
}

#[test]
fn compressed_outer_steps_leave_every_peer_bitwise_identical() {
    let (n, d, h, lr) = (5, 203, 3, 0.05);
    let b = uniform_vectors(n, d, 1.0, 51);
    let shared = vec![uniform_vectors(1, d, 1.0, 52).remove(0); n];
    let independent = uniform_vectors(n, d, 1.0, 53);
    for compressor in [INT8, "topk:0.1", "sign,bucket=64", "natural"] {
        for (starts, x0) in [("shared", &shared), ("independent", &independent)] {
            let peers = compressed_peers(x0, lr, h, OuterConfig::paper(), compressor);
            assert!(peers.iter().all(|p| p.compresses() && !p.aligned()));
            // Frames in send order, and in a random order: the same bits.
            let mut fifo = Net::fifo(peers);
            let peers = compressed_peers(x0, lr, h, OuterConfig::paper(), compressor);
            let mut shuffled = Net::shuffled(peers, 7);
            for t in 0..8 * h {
                let g = quadratic_grads_at(&fifo.params(), &b);
                fifo.round(Some(&g));
                shuffled.round(Some(&g));
                assert_eq!(fifo.params(), shuffled.params(), "{compressor}: round {t}");
                let xs = fifo.params();
                if (t + 1) % h == 0 {
                    for (i, p) in fifo.peers.iter().enumerate() {
                        let what = format!("{compressor}, {starts} starts, round {t}, peer {i}");
                        assert_eq!(xs[i], xs[0], "{what}: x");
                        assert_eq!(p.anchor(), fifo.peers[0].anchor(), "{what}: anchor");
                        assert_eq!(p.params(), p.anchor(), "{what}: x ← a");
                        assert!(p.aligned(), "{what}");
                    }
                } else if t < h && starts == "independent" {
                    assert_ne!(xs[0], xs[1], "apart before the first outer step");
                }
            }
            // The compressed steps did compress: a residual was left.
            assert!(fifo.peers[0].residual().unwrap().iter().any(|e| *e != 0.0));
        }
    }
}

#[test]
fn the_residual_carries_what_the_compressed_ring_did_not_send() {
    // Outer SGD without momentum: a ← a − η_out Δ̄, so the decoded Δ̄ of every outer step
    // is read off the anchors. Error feedback loses nothing: over the compressed outer
    // steps, n Σ_t Δ̄_t + Σ_i e_i = Σ_t Σ_j Δ_j,t (up to f32 rounding), with Δ_j = a − x_j
    // the models after the inner steps. Without the residual the identity fails by
    // Σ_i e_i, which is large for top-k 10%.
    let (n, d, h, lr, eta) = (4, 400, 4, 0.1, 0.3);
    let outer = OuterConfig {
        lr: eta,
        ..OuterConfig::averaging()
    };
    let b = uniform_vectors(n, d, 1.0, 61);
    let x0 = vec![uniform_vectors(1, d, 1.0, 62).remove(0); n];
    let topk = |x0: &[Vec<f32>]| Net::fifo(compressed_peers(x0, lr, h, outer, "topk:0.1"));
    // The same run with the residual dropped after every outer step: no error feedback.
    let (mut net, mut no_ef) = (topk(&x0), topk(&x0));
    let mut sent = vec![0.0f64; d]; // n Σ_t Δ̄_t
    let mut true_sum = vec![0.0f64; d]; // Σ_t Σ_j Δ_j,t
    for t in 0..200 * h {
        let xs = net.params();
        let g = quadratic_grads_at(&xs, &b);
        let a = net.peers[0].anchor().to_vec();
        let aligned = net.peers[0].aligned();
        net.round(Some(&g));
        no_ef.round(Some(&quadratic_grads_at(&no_ef.params(), &b)));
        if (t + 1) % h == 0 {
            for p in &mut no_ef.peers {
                let mut s = p.state();
                s.vectors[2].1.fill(0.0);
                p.restore_state(&s).unwrap();
            }
        }
        if (t + 1) % h == 0 && aligned {
            let a_new = net.peers[0].anchor();
            for k in 0..d {
                sent[k] += n as f64 * f64::from(a[k] - a_new[k]) / f64::from(eta);
                for j in 0..n {
                    let xj = xs[j][k] - lr * g[j][k]; // the last inner step
                    true_sum[k] += f64::from(a[k] - xj);
                }
            }
        }
    }
    let mut residuals = vec![0.0f64; d];
    for p in &net.peers {
        for (r, e) in residuals.iter_mut().zip(p.residual().unwrap()) {
            *r += f64::from(*e);
        }
    }
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let with_ef: Vec<f64> = (0..d)
        .map(|k| sent[k] + residuals[k] - true_sum[k])
        .collect();
    let without: Vec<f64> = (0..d).map(|k| sent[k] - true_sum[k]).collect();
    let (err, gap, scale) = (norm(&with_ef), norm(&without), norm(&true_sum));
    eprintln!("‖Σ sent + Σ e − Σ Δ‖ = {err:e}, ‖Σ e‖ = {gap:e}, ‖Σ Δ‖ = {scale:e}");
    assert!(err < 1e-5 * scale, "error feedback lost {err} of {scale}");
    assert!(
        gap > 1e4 * err,
        "the residual is what was not sent: {gap} vs {err}"
    );
    // Where it gets: near the minimiser b̄ of the average loss, within a floor set by the
    // residuals (the peers' Δ_j do not vanish there, only their sum). Without error
    // feedback the top-k of the partial sums is biased and stays further away.
    let b_mean = mean(&b);
    let dist = |a: &[f32]| {
        a.iter()
            .zip(&b_mean)
            .map(|(a, b)| (f64::from(*a) - b).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let (start, ef, plain) = (
        dist(&x0[0]),
        dist(net.peers[0].anchor()),
        dist(no_ef.peers[0].anchor()),
    );
    eprintln!("‖a − b̄‖: start {start}, error feedback {ef}, none {plain}");
    assert!(ef < 0.1 * start, "‖a − b̄‖: {start} → {ef}");
    assert!(ef < 0.5 * plain, "error feedback {ef}, none {plain}");
}

#[test]
fn a_compressed_run_resumed_from_its_state_continues_bit_for_bit() {
    let (n, d, h) = (4, 57, 3);
    for compressor in [INT8, "topk:0.1"] {
        for (starts, x0, stop) in [
            // Mid-interval after two outer steps: the anchors are aligned.
            (
                "shared",
                vec![uniform_vectors(1, d, 1.0, 9).remove(0); n],
                7u64,
            ),
            // Before the first outer step: not aligned yet, so the resumed run aligns.
            ("independent", uniform_vectors(n, d, 1.0, 10), 2),
        ] {
            let opts = compressed_options(h, OuterConfig::paper(), compressor);
            let mut original = Sim::new(network("diloco", &x0, 0.1, &opts));
            for t in 0..stop {
                original.run_round(Some(&grads(n, d, t))).unwrap();
            }
            let saved = snapshot(&original);
            let names: Vec<&str> = saved[0].2.vectors.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                ["diloco.anchor", "diloco.outer_velocity", "diloco.residual"]
            );
            let aligned = f64::from(u8::from(stop >= h));
            assert_eq!(saved[0].2.scalars, [("diloco.aligned".into(), aligned)]);
            if stop >= h {
                assert!(saved[0].2.vectors[2].1.iter().any(|e| *e != 0.0));
            }
            let (mut restored, mut forgetful) = (
                rebuild("diloco", &saved, 0.1, &opts, true),
                rebuild("diloco", &saved, 0.1, &opts, false),
            );
            for t in stop..stop + 4 * h {
                let g = grads(n, d, t);
                original.run_round(Some(&g)).unwrap();
                restored.run_round(Some(&g)).unwrap();
                forgetful.run_round(Some(&g)).unwrap();
            }
            for i in 0..n {
                let what = format!("{compressor}, {starts}: peer {i}");
                assert_eq!(
                    original.peer(i).params(),
                    restored.peer(i).params(),
                    "{what}"
                );
                assert_eq!(original.peer(i).state(), restored.peer(i).state(), "{what}");
            }
            if stop >= h {
                assert!(
                    (0..n).any(|i| original.peer(i).state() != forgetful.peer(i).state()),
                    "{compressor}, {starts}: restoring changed nothing"
                );
            } else {
                // Before the first outer step the state holds nothing that matters yet: the
                // alignment replaces the anchors, the velocity and the residual are 0.
                for i in 0..n {
                    assert_eq!(original.peer(i).params(), forgetful.peer(i).params());
                }
            }
        }
    }
}

#[test]
fn a_compressed_state_that_does_not_fit_is_refused_and_changes_nothing() {
    let (n, d, h) = (3, 10, 2);
    let opts = compressed_options(h, OuterConfig::paper(), "topk:0.2");
    let x0 = vec![vec![1.0; d]; n];
    let mut sim = Sim::new(network("diloco", &x0, 0.1, &opts));
    for t in 0..5 {
        sim.run_round(Some(&grads(n, d, t))).unwrap();
    }
    let good = sim.peer(1).state();
    let mut p = build("diloco", &ring(n), 1, vec![1.0; d], 0.1, &opts).unwrap();
    let before = p.state();
    let mut short = good.clone();
    short.vectors[2].1.pop();
    let mut nan = good.clone();
    nan.vectors[2].1[3] = f32::INFINITY;
    let mut no_residual = good.clone();
    no_residual.vectors.remove(2);
    let mut no_flag = good.clone();
    no_flag.scalars.clear();
    let mut half = good.clone();
    half.scalars[0].1 = 0.5;
    let cases = [
        (short, "\"diloco.residual\" has 9 values, expected d = 10"),
        (nan, "\"diloco.residual\"[3] = inf is not finite"),
        (no_residual, "diloco.residual"),
        (no_flag, "diloco.aligned"),
        (half, "diloco.aligned"),
    ];
    for (bad, msg) in cases {
        let err = p.restore_state(&bad).unwrap_err().to_string();
        assert!(err.contains(msg), "{err}");
        assert_eq!(p.state(), before, "unchanged after a refusal");
    }
    // Nor does an uncompressed run take the compressed state, or the reverse.
    let mut plain = build(
        "diloco",
        &ring(n),
        1,
        vec![1.0; d],
        0.1,
        &options(h, OuterConfig::paper()),
    )
    .unwrap();
    assert!(plain.restore_state(&good).is_err());
    p.restore_state(&good).unwrap();
    assert_eq!(p.state(), good);
}

#[test]
fn a_corrupted_compressed_frame_is_refused_without_a_panic() {
    use murmur_compress::DecodeError;
    use murmur_gossip::frame::{FrameHeader, FrameKind};
    let (n, d, h) = (3, 40, 2);
    let x0 = vec![uniform_vectors(1, d, 1.0, 71).remove(0); n];
    let g: Vec<Vec<f32>> = uniform_vectors(n, d, 1.0, 72);
    let mut net = Net::fifo(compressed_peers(&x0, 0.1, h, OuterConfig::paper(), INT8));
    let mut reference = Net::fifo(compressed_peers(&x0, 0.1, h, OuterConfig::paper(), INT8));
    // Through the raw first outer step into the inner step before the first compressed one.
    for _ in 0..h + 1 {
        net.round(Some(&g));
        reference.round(Some(&g));
    }
    // Round 2h − 1 is the first compressed outer step: peer 0's step-0 frame to peer 1.
    for (i, gi) in g.iter().enumerate() {
        let x = net.peers[i].params().to_vec();
        net.begin(i, &x, Some(gi));
    }
    let (from, to, good) = net.in_flight[0].clone();
    assert_eq!((from, to), (0, 1));
    let (hdr, payload) = FrameHeader::parse(&good, u32::MAX).unwrap();
    assert_eq!(hdr.kind, FrameKind::Reduce);
    let len = chunk_range(0, n, d).len(); // peer 0 sends chunk 0 at step 0
    let msg = &payload[4..];
    assert_eq!(
        msg.len(),
        12 + 8 + 4 + len,
        "int8: a byte per value, one norm"
    );
    let frame = |round: u64, dim: u32, payload: &[u8]| {
        common::kind_frame(FrameKind::Reduce, 0, round, dim, payload)
    };
    let with_msg = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut p = payload.to_vec();
        f(&mut p);
        frame(hdr.round, hdr.dim, &p)
    };
    let payload_err = |e: Result<(), GossipError>| match e {
        Err(GossipError::Payload { from: 0, cause }) => cause,
        other => panic!("expected a payload error, got {other:?}"),
    };
    let peer = &mut net.peers[1];
    // The message's operator, its dimension (a chunk of len values), a norm, its length.
    let cause = payload_err(peer.handle_message(net_now(), 0, &with_msg(&|p| p[4] = 200)));
    assert!(
        matches!(cause, DecodeError::UnknownOperator(200)),
        "{cause:?}"
    );
    let cause = payload_err(peer.handle_message(
        net_now(),
        0,
        &with_msg(&|p| p[4 + 4..4 + 8].copy_from_slice(&(len as u32 + 1).to_le_bytes())),
    ));
    assert!(
        matches!(cause, DecodeError::DimensionMismatch { expected, .. } if expected == len),
        "{cause:?}"
    );
    let nan = f32::NAN.to_le_bytes();
    let cause = payload_err(peer.handle_message(
        net_now(),
        0,
        &with_msg(&|p| p[4 + 20..4 + 24].copy_from_slice(&nan)),
    ));
    assert!(
        matches!(cause, DecodeError::NonFiniteScale { bucket: 0 }),
        "{cause:?}"
    );
    payload_err(peer.handle_message(
        net_now(),
        0,
        &with_msg(&|p| {
            p.pop();
        }),
    ));
    // A raw f32 chunk where a compressed one is due.
    let mut raw = payload[..4].to_vec();
    raw.extend(common::f32_bytes(&vec![0.0; len]));
    payload_err(peer.handle_message(net_now(), 0, &frame(hdr.round, hdr.dim, &raw)));
    // The step, the model's dimension, the round.
    let cause = payload_err(peer.handle_message(
        net_now(),
        0,
        &with_msg(&|p| p[..4].copy_from_slice(&99u32.to_le_bytes())),
    ));
    assert!(
        matches!(cause, DecodeError::BadParameter { name: "step", .. }),
        "{cause:?}"
    );
    assert!(matches!(
        peer.handle_message(net_now(), 0, &frame(hdr.round, hdr.dim + 1, payload)),
        Err(GossipError::DimensionMismatch { .. })
    ));
    assert!(matches!(
        peer.handle_message(net_now(), 0, &frame(hdr.round + 5, hdr.dim, payload)),
        Err(GossipError::RoundOutOfWindow { .. })
    ));
    // Nothing changed: the round completes as if none of them had come.
    net.deliver_all();
    for (i, gi) in g.iter().enumerate() {
        let x = reference.peers[i].params().to_vec();
        reference.begin(i, &x, Some(gi));
    }
    reference.deliver_all();
    assert_eq!(net.params(), reference.params());
    assert!(net.peers[1].aligned());
    for i in 0..n {
        assert_eq!(net.peers[i].state(), reference.peers[i].state());
    }
}

fn net_now() -> std::time::Instant {
    std::time::Instant::now()
}

// ---- SparseLoCo: the all-gather of each peer's compressed pseudo-gradient -----------------

/// SparseLoCo's options as a user gives them: H and the compressor, the outer step left
/// to its default.
fn sparseloco_options(h: u64, compressor: &str) -> AlgorithmOptions {
    AlgorithmOptions {
        local_steps: Some(h),
        compressor: Some(compressor.parse().unwrap()),
        ..Default::default()
    }
}

#[test]
fn sparseloco_compresses_every_outer_step_from_a_shared_start_and_gathers_n_minus_1_messages() {
    let (n, d, h, lr) = (4, 1000, 3, 0.1);
    let spec = "sparseloco:0.05,chunk=100";
    let opts = sparseloco_options(h, spec);
    // The paper's outer step: the decayed residual stands in for the momentum.
    assert_eq!(opts.outer(), OuterConfig::averaging());
    let x0 = vec![uniform_vectors(1, d, 1.0, 70).remove(0); n];
    let b = uniform_vectors(n, d, 1.0, 71);
    let mut sim = Sim::new(network("diloco", &x0, lr, &opts));
    // A message's size depends on where its kept values lie (Rice-coded positions): each
    // frame is 24 + 4 bytes of framing and one message of at most the operator's bound,
    // far below the raw 4d.
    let c: CompressorSpec = spec.parse().unwrap();
    let most = (24 + 4 + c.build(None).unwrap().max_encoded_len(d)) as u64;
    assert!(most < (4 * d / 5) as u64, "bound {most}");
    for t in 0..6 * h {
        let (bytes, frames) = (
            sim.peer(0).stats().bytes_sent,
            sim.peer(0).stats().frames_sent,
        );
        let g = quadratic_grads(&sim, &b);
        sim.run_round(Some(&g)).unwrap();
        let sent = sim.peer(0).stats().bytes_sent - bytes;
        let frames = sim.peer(0).stats().frames_sent - frames;
        if (t + 1) % h == 0 {
            // The first outer step too: the anchors are identical from the start.
            assert_eq!(frames, n as u64 - 1, "round {t}: frames");
            assert!(
                sent > 28 * frames && sent <= frames * most,
                "round {t}: {sent} bytes"
            );
            let a0 = anchor(sim.peer(0));
            for i in 1..n {
                assert_eq!(anchor(sim.peer(i)), a0, "round {t}, peer {i}");
            }
        } else {
            assert_eq!(sent, 0, "round {t}: an inner step sends nothing");
        }
    }
    let s = sim.peer(0).state();
    assert!(s
        .scalars
        .iter()
        .any(|(k, v)| k == "diloco.aligned" && *v == 1.0));
}

#[test]
fn sparseloco_s_gathered_mean_beats_a_ring_that_re_sparsifies_its_partial_sums() {
    // The same operator and outer step (SGD, η_out 1) with error feedback, on heterogeneous
    // quadratics: gathering each peer's message keeps the union of the n supports, the
    // compressed ring keeps k of each chunk of the whole sum.
    let (n, d, h, lr, outer_steps) = (8, 2048, 5, 0.1, 40u64);
    let spec = "sparseloco:0.03,chunk=256,decay=1";
    let x0 = vec![uniform_vectors(1, d, 1.0, 80).remove(0); n];
    let b = uniform_vectors(n, d, 1.0, 81);
    let b_mean: Vec<f32> = mean(&b).iter().map(|v| *v as f32).collect();
    let (l0, l_star) = (quadratic_loss(&x0[0], &b), quadratic_loss(&b_mean, &b));
    let mut gathered = Sim::new(network("diloco", &x0, lr, &sparseloco_options(h, spec)));
    let ring: Vec<Box<dyn Gossip>> = compressed_peers(&x0, lr, h, OuterConfig::averaging(), spec)
        .into_iter()
        .map(|p| Box::new(p) as Box<dyn Gossip>)
        .collect();
    let mut ring = Sim::new(ring);
    for _ in 0..outer_steps * h {
        let g = quadratic_grads(&gathered, &b);
        gathered.run_round(Some(&g)).unwrap();
        let g = quadratic_grads(&ring, &b);
        ring.run_round(Some(&g)).unwrap();
    }
    let fg = quadratic_loss(gathered.peer(0).params(), &b) - l_star;
    let fr = quadratic_loss(ring.peer(0).params(), &b) - l_star;
    eprintln!(
        "f(x⁰) − f* = {:.3}; after {outer_steps} outer steps: gathered {fg:.4e}, ring {fr:.4e}",
        l0 - l_star
    );
    assert!(
        fg < 0.75 * (l0 - l_star),
        "gathered made progress: {fg} of {}",
        l0 - l_star
    );
    assert!(fg < fr, "gathered {fg} against ring {fr}");
}

#[test]
fn a_sparseloco_run_resumed_from_its_state_continues_bit_for_bit() {
    let (n, d, h, stop) = (4, 300, 3, 7u64);
    let opts = sparseloco_options(h, "sparseloco:0.05,chunk=50,decay=0.9");
    let x0 = vec![uniform_vectors(1, d, 1.0, 90).remove(0); n];
    let mut original = Sim::new(network("diloco", &x0, 0.1, &opts));
    for t in 0..stop {
        original.run_round(Some(&grads(n, d, t))).unwrap();
    }
    let saved = snapshot(&original);
    assert_eq!(saved[0].2.scalars, [("diloco.aligned".into(), 1.0)]);
    assert!(
        saved[0].2.vectors[2].1.iter().any(|e| *e != 0.0),
        "a residual"
    );
    let mut restored = rebuild("diloco", &saved, 0.1, &opts, true);
    let mut forgetful = rebuild("diloco", &saved, 0.1, &opts, false);
    for t in stop..stop + 4 * h {
        let g = grads(n, d, t);
        original.run_round(Some(&g)).unwrap();
        restored.run_round(Some(&g)).unwrap();
        forgetful.run_round(Some(&g)).unwrap();
    }
    for i in 0..n {
        assert_eq!(
            original.peer(i).params(),
            restored.peer(i).params(),
            "peer {i}"
        );
        assert_eq!(
            original.peer(i).state(),
            restored.peer(i).state(),
            "peer {i}"
        );
    }
    assert!(
        (0..n).any(|i| original.peer(i).params() != forgetful.peer(i).params()),
        "restoring the residual changed nothing"
    );
}

#[test]
fn sparseloco_layerwise_chunks_follow_the_model_s_tensors() {
    // The registry gives the all-gather an operator whose chunks start at each tensor
    // (lengths 7, 0, 40, 13 in chunks of 16): the same run as DiLoCo put together by hand
    // with that operator, bit for bit, and another run than the flat chunks'.
    let (n, d, h) = (3, 60, 2);
    let layers = [7usize, 0, 40, 13];
    let x0 = vec![uniform_vectors(1, d, 1.0, 95).remove(0); n];
    let topo = ring(n);
    let registry = |text: &str| -> Sim {
        let opts = sparseloco_options(h, text);
        Sim::new(
            (0..n)
                .map(|i| {
                    let x = x0[i].clone();
                    build_for_tensors("diloco", &topo, i, x, 0.1, &opts, None, &layers).unwrap()
                })
                .collect(),
        )
    };
    let mut layerwise = registry("sparseloco:0.2,chunk=16,decay=0.9,layerwise");
    let mut flat = registry("sparseloco:0.2,chunk=16,decay=0.9");
    let mut by_hand = Sim::new(
        (0..n)
            .map(|i| {
                let c = murmur_compress::SparseLoco::layerwise(0.2, 16, layers.to_vec());
                let cfg = AllReduceConfig::new(i, n, 0.0, d);
                let ring = AllReduce::gathered(cfg, x0[i].clone(), Box::new(c), 0.9);
                let p = DiLoCo::gathered(ring, h, 0.1, OuterConfig::averaging(), i as u64, true);
                Box::new(p.unwrap()) as Box<dyn Gossip>
            })
            .collect(),
    );
    for t in 0..4 * h {
        let g = grads(n, d, t);
        layerwise.run_round(Some(&g)).unwrap();
        flat.run_round(Some(&g)).unwrap();
        by_hand.run_round(Some(&g)).unwrap();
    }
    for i in 0..n {
        assert_eq!(
            layerwise.peer(i).params(),
            by_hand.peer(i).params(),
            "peer {i}"
        );
    }
    assert_ne!(layerwise.peer(0).params(), flat.peer(0).params());
    // Streaming DiLoCo's fragments are ranges of the flat vector, not whole tensors.
    let o = sparseloco_options(h, "sparseloco:0.2,layerwise");
    let streaming: AlgorithmSpec = "streaming-diloco".parse().unwrap();
    let err = o.validate(&[streaming]).unwrap_err().to_string();
    assert!(
        err.contains("layerwise") && err.contains("for streaming-diloco:"),
        "{err}"
    );
    let diloco: AlgorithmSpec = "diloco".parse().unwrap();
    assert!(o.validate(&[diloco]).is_ok());
}

/// One inner step of the peers in `alive` (no gradient), their frames delivered to the live
/// destinations only: whether each produced `Mixed`.
fn step_among(peers: &mut [Box<dyn Gossip>], alive: &[bool]) -> Vec<bool> {
    common::round_among_by(peers, alive, |p| &mut **p)
}

/// A peer of the gossip form leaves and one restarted process comes back to the running
/// run: the survivors train on without it; it comes back at the next outer step
/// (`rejoin_round`), built afresh from its neighbours' mean, its frames carrying that outer
/// step (`frame_round`), its anchor and outer velocity its donor's (`take_catch_up_state`);
/// a neighbour already past that step refuses it; and all reach one model again, peer 3
/// hearing from it every outer step.
#[test]
fn a_gossip_form_peer_rejoins_a_running_run_at_an_outer_step() {
    let (n, d, h) = (6, 3, 4);
    let x0 = uniform_vectors(n, d, 1.0, 31);
    let opts = options(h, OuterConfig::paper());
    let mut peers = network("diloco-gossip", &x0, 0.1, &opts);
    let mut alive = vec![true; n];
    for _ in 0..8 {
        assert!(step_among(&mut peers, &alive).iter().all(|&m| m));
    }
    // Peer 4 dies after the second outer step; its neighbours re-weight.
    alive[4] = false;
    let w = ring_mh(n);
    let survivors = w.without_peers(&[4]).unwrap();
    for i in (0..n).filter(|&i| alive[i]) {
        peers[i].peer_left(4, &survivors.w).unwrap();
    }
    for _ in 0..8 {
        let mixed = step_among(&mut peers, &alive);
        assert!((0..n).all(|i| mixed[i] == alive[i]), "{mixed:?}");
    }
    // It comes back at the outer step after round 16: inner step 19, outer step 4.
    let earliest = peers[0].round();
    assert_eq!(earliest, 16);
    let at = peers[0].rejoin_round(earliest);
    assert_eq!((at, peers[0].frame_round(at)), (19, 4));
    assert_eq!(peers[0].rejoin_round(19), 19, "an outer step already");
    while peers[0].round() < at {
        step_among(&mut peers, &alive);
    }
    let x4: Vec<f32> = (0..d)
        .map(|k| (peers[3].params()[k] + peers[5].params()[k]) / 2.0)
        .collect();
    let mut back = build("diloco-gossip", &ring(n), 4, x4, 0.1, &opts).unwrap();
    back.start_at_round(at).unwrap();
    assert_eq!(back.round(), at);
    // It takes a donor's anchor and outer velocity (Nesterov: [d] each); a state of
    // another length is refused and changes nothing.
    let donor = peers[3].catch_up_state();
    assert_eq!(donor.len(), 2 * d);
    assert!(back.take_catch_up_state(&donor[..d]).is_err());
    assert_ne!(anchor(&*back), donor[..d]);
    back.take_catch_up_state(&donor).unwrap();
    assert_eq!(anchor(&*back), donor[..d]);
    assert_eq!(back.state().vectors[1].1, donor[d..]);
    assert_eq!(back.catch_up_state(), donor);
    // Too late for a neighbour past that outer step: refused, not silently mis-mixed.
    assert!(matches!(
        peers[3].peer_rejoined(4, &w, at - h),
        Err(murmur_gossip::MembershipError::TooLate { .. })
    ));
    for i in [0, 1, 2, 3, 5] {
        peers[i].peer_rejoined(4, &w, at).unwrap();
    }
    peers[4] = back;
    alive[4] = true;
    // Its first frames carry outer step 4, as the driver waits for them.
    let x = peers[4].params().to_vec();
    peers[4].begin_round(std::time::Instant::now(), &x, None);
    let mut first = Vec::new();
    while let Some(t) = peers[4].poll_transmit() {
        first.push(t);
    }
    assert_eq!(first.len(), 2, "one frame to each ring neighbour");
    for t in &first {
        let (header, _) = murmur_gossip::frame::FrameHeader::parse(&t.frame, u32::MAX).unwrap();
        assert_eq!((header.sender, header.round), (4, 4));
    }
    let now = std::time::Instant::now();
    let mut in_flight: Vec<(usize, usize, Vec<u8>)> = first
        .into_iter()
        .map(|t| (4, t.to, t.frame.to_vec()))
        .collect();
    for (i, p) in peers.iter_mut().enumerate().filter(|(i, _)| *i != 4) {
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while let Some(t) = p.poll_transmit() {
            in_flight.push((i, t.to, t.frame.to_vec()));
        }
    }
    for (from, to, frame) in in_flight {
        peers[to].handle_message(now, from, &frame).unwrap();
    }
    assert!(peers.iter_mut().all(|p| drain_mixed(&mut **p)));
    let received = peers[3].stats().frames_received;
    for _ in 0..400 {
        assert!(step_among(&mut peers, &alive).iter().all(|&m| m));
    }
    assert_eq!(
        peers[3].stats().frames_received - received,
        2 * 100,
        "two frames every outer step, peer 4's among them"
    );
    let xs: Vec<Vec<f32>> = peers.iter().map(|p| p.params().to_vec()).collect();
    let xi = murmur_gossip::consensus_distance(xs.iter().map(|v| v.as_slice())).0;
    assert!(xi < 1e-8, "Ξ² = {xi}");
}
