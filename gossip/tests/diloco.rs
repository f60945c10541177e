//! DiLoCo: H inner steps, then an outer optimizer step on the averaged pseudo-gradient;
//! `diloco` averages by ring all-reduce, `diloco-gossip` mixes on W.

use std::time::Duration;

use murmur_gossip::sim::Sim;
use murmur_gossip::{
    AlgorithmOptions, AlgorithmSpec, AlgorithmState, BuildContext, BuildError, DPsgd, DPsgdConfig,
    DiLoCo, Gossip, GossipError, OuterConfig, OuterOptimizer,
};
use murmur_topology::{Topology, TopologySpec};

mod common;
use common::{drain_mixed, max_abs_diff, ring_mh, uniform_vectors};

fn ring(n: usize) -> Topology {
    TopologySpec::named("ring").unwrap().build(Some(n)).unwrap()
}

/// Peer `rank` of `algorithm` on `topology`, built by the registry.
fn build(
    algorithm: &str,
    topology: &Topology,
    rank: usize,
    x0: Vec<f32>,
    lr: f32,
    options: &AlgorithmOptions,
) -> Result<Box<dyn Gossip>, BuildError> {
    let spec: AlgorithmSpec = algorithm.parse().unwrap();
    let d = x0.len();
    spec.build(BuildContext {
        rank,
        topology,
        lr,
        x0,
        tensor_lengths: &[d],
        max_payload_bytes: u32::try_from(16 * d + 1024).unwrap(),
        round_timeout: Duration::from_secs(60),
        seed: rank as u64,
        skip_after: None,
        options,
    })
}

/// n peers of `algorithm` on the ring of n, peer i starting from `x0[i]`.
fn network(
    algorithm: &str,
    x0: &[Vec<f32>],
    lr: f32,
    options: &AlgorithmOptions,
) -> Vec<Box<dyn Gossip>> {
    let topo = ring(x0.len());
    (0..x0.len())
        .map(|i| build(algorithm, &topo, i, x0[i].clone(), lr, options).unwrap())
        .collect()
}

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
        let saved: Vec<(Vec<f32>, u64, AlgorithmState)> = (0..n)
            .map(|i| {
                let p = original.peer(i);
                (p.params().to_vec(), p.round(), p.state())
            })
            .collect();
        let names: Vec<&str> = saved[0].2.vectors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["diloco.anchor", "diloco.outer_velocity"], "{name}");
        assert_ne!(saved[0].0, saved[0].2.vectors[0].1, "mid-interval: x ≠ a");
        let rebuild = |restore: bool| {
            let topo = ring(n);
            let peers = saved
                .iter()
                .enumerate()
                .map(|(i, (x, round, state))| {
                    let mut p = build(name, &topo, i, x.clone(), 0.1, &opts).unwrap();
                    p.start_at_round(*round).unwrap();
                    if restore {
                        p.restore_state(state).unwrap();
                    }
                    p
                })
                .collect();
            Sim::new(peers)
        };
        let (mut restored, mut forgetful) = (rebuild(true), rebuild(false));
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
    let mut buf = Vec::new();
    // (round due, from, to, frame)
    let mut queue: Vec<(u64, usize, usize, Vec<u8>)> = Vec::new();
    let mut dropped = 0;
    for t in 0..400u64 {
        // Peer 2's frames are a round late during the first 40 rounds.
        let late = if t < 40 { 1 } else { 0 };
        for (i, p) in peers.iter_mut().enumerate() {
            let x = p.params().to_vec();
            p.begin_round(now, &x, None);
            while let Some(tr) = p.poll_transmit(&mut buf) {
                let at = if i == straggler { t + late } else { t };
                queue.push((at, i, tr.to, buf.clone()));
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
    // The outer options belong to DiLoCo only; the all-reduce form sends raw f32.
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
    let o = AlgorithmOptions {
        compressor: Some("topk:0.1".parse().unwrap()),
        ..Default::default()
    };
    assert!(o
        .validate(&[diloco])
        .unwrap_err()
        .to_string()
        .contains("raw f32"));
    assert!(o.validate(&[gossip]).is_ok());
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
        "local_steps=50 outer_optimizer=sgd outer_lr=1 outer_momentum=0"
    );
    assert_eq!(o.outer(), OuterConfig::averaging());
    for name in ["nesterov", "sgd"] {
        assert_eq!(name.parse::<OuterOptimizer>().unwrap().to_string(), name);
    }
    let d = spec("diloco");
    assert!(d.has_local_steps() && !d.uses_topology() && !d.compresses());
    assert_eq!(o.local_steps(&*d), 50);
    assert_eq!(o.local_steps(&*spec("local-sgd")), 4, "unchanged");
    let g = spec("diloco-gossip");
    assert!(g.uses_topology() && g.compresses() && g.survives_departure());
    assert!(!d.survives_departure());
}
