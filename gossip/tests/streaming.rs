//! Streaming DiLoCo: fragments synchronised at staggered inner steps, applied τ steps later.

use murmur_compress::CompressorSpec;
use murmur_gossip::sim::Sim;
use murmur_gossip::{
    AlgorithmOptions, AlgorithmSpec, AlgorithmState, Compute, NetSim, NetworkModel, OuterConfig,
    StreamingSchedule,
};

mod common;
use common::{build, network, rebuild, ring, snapshot, uniform_vectors};

/// Streaming options: H, P, τ, α, the outer step and the compressor.
fn streaming(
    h: u64,
    p: u64,
    tau: u64,
    alpha: f32,
    outer: OuterConfig,
    compressor: &str,
) -> AlgorithmOptions {
    AlgorithmOptions {
        local_steps: Some(h),
        fragments: Some(p),
        tau: Some(tau),
        merge_alpha: Some(alpha),
        outer_optimizer: Some(outer.optimizer),
        outer_lr: Some(outer.lr),
        outer_momentum: Some(outer.momentum),
        compressor: Some(compressor.parse::<CompressorSpec>().unwrap()),
        ..Default::default()
    }
}

fn grads(n: usize, d: usize, t: u64) -> Vec<Vec<f32>> {
    uniform_vectors(n, d, 1.0, 1000 + t)
}

/// Gradients g_i = x_i − b_i of f_i(x) = ½‖x − b_i‖².
fn quadratic_grads(xs: &[&[f32]], b: &[Vec<f32>]) -> Vec<Vec<f32>> {
    xs.iter()
        .zip(b)
        .map(|(x, b)| x.iter().zip(b).map(|(x, b)| x - b).collect())
        .collect()
}

/// f(x) − f* for f = (1/n) Σ_i ½‖x − b_i‖², at the peers' mean.
fn gap(sim: &Sim, b: &[Vec<f32>]) -> f64 {
    let n = sim.n();
    let d = b[0].len();
    let xbar = sim.average();
    let bbar: Vec<f64> = (0..d)
        .map(|k| b.iter().map(|bi| f64::from(bi[k])).sum::<f64>() / n as f64)
        .collect();
    0.5 * xbar
        .iter()
        .zip(&bbar)
        .map(|(x, m)| (f64::from(*x) - m).powi(2))
        .sum::<f64>()
}

#[test]
fn the_schedule_spreads_one_sync_per_fragment_over_each_outer_step() {
    for (p, h, tau) in [
        (1, 1, 0),
        (1, 5, 3),
        (4, 50, 1),
        (3, 10, 3),
        (7, 7, 1),
        (4, 6, 1),
    ] {
        let s = StreamingSchedule::new(p, h, tau).unwrap();
        let mut count = 0;
        for t in 0..5 * h {
            assert_eq!(s.syncs_before(t), count, "P={p} H={h} t={t}");
            if let Some(k) = s.sync_at(t) {
                assert_eq!(k, count, "syncs come in order");
                assert_eq!(s.sync_round(k), t);
                count += 1;
            }
        }
        assert_eq!(count, 5 * p, "each fragment once per H rounds");
        // The last fragment syncs at the end of each outer step, as DiLoCo does.
        assert_eq!(s.sync_round(p - 1), h - 1);
        // A sync is applied before the next one begins.
        for k in 0..5 * p {
            assert!(s.sync_round(k) + tau <= s.sync_round(k + 1));
        }
    }
}

#[test]
fn one_fragment_without_overlap_is_diloco_bit_for_bit() {
    let (n, d, h) = (4, 13, 3);
    let x0 = vec![uniform_vectors(1, d, 1.0, 5).remove(0); n];
    // SparseLoCo: the all-gather of each peer's own message, every sync compressed from the
    // shared start, as diloco's SparseLoCo form.
    for compressor in [
        "identity",
        "int8,bucket=4",
        "topk:0.3",
        "sparseloco:0.3,chunk=4",
    ] {
        let outer = if compressor.starts_with("sparseloco") {
            OuterConfig::averaging()
        } else if compressor.starts_with("topk") {
            OuterConfig {
                lr: 0.3,
                ..OuterConfig::averaging()
            }
        } else {
            OuterConfig::paper()
        };
        let opts = streaming(h, 1, 0, 0.0, outer, compressor);
        let diloco_opts = AlgorithmOptions {
            fragments: None,
            tau: None,
            merge_alpha: None,
            ..opts.clone()
        };
        let mut a = Sim::new(network("streaming-diloco", &x0, 0.1, &opts));
        let mut b = Sim::new(network("diloco", &x0, 0.1, &diloco_opts));
        for t in 0..5 * h {
            let g = grads(n, d, t);
            a.run_round(Some(&g)).unwrap();
            b.run_round(Some(&g)).unwrap();
            for i in 0..n {
                assert_eq!(
                    a.peer(i).params(),
                    b.peer(i).params(),
                    "{compressor}: round {t}, peer {i}"
                );
            }
        }
        assert_eq!(
            a.peer(0).stats(),
            b.peer(0).stats(),
            "{compressor}: same frames"
        );
    }
}

/// Runs `opts` on the quadratics f_i = ½‖x − b_i‖² for `rounds` rounds; returns the gap.
fn quadratic_run(algorithm: &str, opts: &AlgorithmOptions, rounds: u64) -> (f64, f64, u64, u64) {
    let (n, d) = (4, 40);
    let b = uniform_vectors(n, d, 3.0, 21);
    let x0 = vec![vec![0.0f32; d]; n];
    let mut sim = Sim::new(network(algorithm, &x0, 0.05, opts));
    let start = gap(&sim, &b);
    for _ in 0..rounds {
        let xs: Vec<&[f32]> = (0..n).map(|i| sim.peer(i).params()).collect();
        let g = quadratic_grads(&xs, &b);
        sim.run_round(Some(&g)).unwrap();
    }
    let stats = sim.peer(0).stats();
    (start, gap(&sim, &b), stats.bytes_sent, stats.frames_sent)
}

#[test]
fn streaming_reaches_diloco_on_quadratics_with_the_same_values_sent() {
    let rounds = 400;
    let plain = AlgorithmOptions {
        local_steps: Some(8),
        ..Default::default()
    };
    let (start, diloco, diloco_bytes, diloco_frames) = quadratic_run("diloco", &plain, rounds);
    for (p, tau, alpha) in [(4, 0, 0.0), (4, 1, 0.5), (4, 2, 0.5), (2, 4, 0.5)] {
        for compressor in ["identity", "int8"] {
            let opts = streaming(8, p, tau, alpha, OuterConfig::paper(), compressor);
            let (_, end, bytes, frames) = quadratic_run("streaming-diloco", &opts, rounds);
            println!("P={p} τ={tau} α={alpha} {compressor}: {start:.3} → {end:.3e} (diloco {diloco:.3e}), {bytes} bytes (diloco {diloco_bytes})");
            assert!(
                end < 1e-3 * start,
                "P={p} τ={tau} α={alpha} {compressor}: f − f* from {start} to {end}"
            );
            if compressor == "identity" {
                // The same values in P times as many frames (24-byte header and 4-byte step
                // each): P rings of d/P values instead of one of d.
                let (frames, diloco_frames) = (frames, diloco_frames);
                assert_eq!(frames, p * diloco_frames);
                assert_eq!(bytes - 28 * frames, diloco_bytes - 28 * diloco_frames);
            }
        }
    }
}

/// Rounds `rounds` of `sim` with the seeded random directions of [`grads`].
fn run_with_grads(sim: &mut Sim, rounds: std::ops::Range<u64>, d: usize) {
    let n = sim.n();
    for t in rounds {
        sim.run_round(Some(&grads(n, d, t))).unwrap();
    }
}

#[test]
fn a_run_resumed_mid_sync_continues_bit_for_bit() {
    let (n, d, h) = (4, 23, 8);
    for compressor in ["identity", "int8,bucket=4", "sparseloco:0.4,chunk=3"] {
        // P = 4: fragment p of outer step k syncs in round 8k + 2p + 1. With τ = 2 a sync is
        // always in flight between rounds: after round 10, sync 4 (begun in round 9,
        // applied in 11); after round 11, sync 5 (begun in 11). With τ = 1, sync 5 is
        // applied in round 12, so after it none is.
        for (tau, stop, expected) in [(2, 11u64, 4.0), (2, 12, 5.0), (1, 13, -1.0)] {
            let opts = streaming(h, 4, tau, 0.5, OuterConfig::paper(), compressor);
            let x0 = vec![uniform_vectors(1, d, 1.0, 9).remove(0); n];
            let mut original = Sim::new(network("streaming-diloco", &x0, 0.1, &opts));
            run_with_grads(&mut original, 0..stop, d);
            let saved = snapshot(&original);
            let in_flight = saved[0].2.scalars[0].1;
            assert_eq!(in_flight, expected, "{compressor}, τ {tau}, stop {stop}");
            let (mut restored, mut forgetful) = (
                rebuild("streaming-diloco", &saved, 0.1, &opts, true),
                rebuild("streaming-diloco", &saved, 0.1, &opts, false),
            );
            run_with_grads(&mut original, stop..4 * h, d);
            run_with_grads(&mut restored, stop..4 * h, d);
            run_with_grads(&mut forgetful, stop..4 * h, d);
            for i in 0..n {
                assert_eq!(
                    original.peer(i).params(),
                    restored.peer(i).params(),
                    "{compressor}, τ {tau}, stop {stop}: peer {i}"
                );
                assert_eq!(original.peer(i).state(), restored.peer(i).state());
            }
            assert!(
                (0..n).any(|i| original.peer(i).params() != forgetful.peer(i).params()),
                "{compressor}: restoring changed nothing"
            );
        }
    }
}

#[test]
fn a_state_that_does_not_fit_is_refused_and_changes_nothing() {
    let (n, d) = (3, 10);
    let opts = streaming(8, 4, 2, 0.5, OuterConfig::paper(), "int8");
    let x0 = vec![uniform_vectors(1, d, 1.0, 2).remove(0); n];
    let mut sim = Sim::new(network("streaming-diloco", &x0, 0.1, &opts));
    run_with_grads(&mut sim, 0..11, d);
    let good = sim.peer(1).state();
    let topo = ring(n);
    let fresh = || {
        let mut p = build("streaming-diloco", &topo, 1, x0[1].clone(), 0.1, &opts).unwrap();
        p.start_at_round(11).unwrap();
        p
    };
    let mut bad_cases: Vec<(&str, AlgorithmState)> = Vec::new();
    let mut s = good.clone();
    s.vectors[0].1.pop();
    bad_cases.push(("short anchor", s));
    let mut s = good.clone();
    s.vectors.remove(2);
    bad_cases.push(("no residual", s));
    let mut s = good.clone();
    s.scalars[0].1 = 3.0;
    bad_cases.push(("another sync in flight", s));
    let mut s = good.clone();
    s.scalars[0].1 = -1.0;
    bad_cases.push(("no sync in flight", s));
    let mut s = good.clone();
    s.scalars[0].1 = 4.5;
    bad_cases.push(("a fractional sync", s));
    let mut s = good.clone();
    s.vectors[1].1[3] = f32::NAN;
    bad_cases.push(("a NaN velocity", s));
    for (what, state) in bad_cases {
        let mut p = fresh();
        let before = p.state();
        assert!(p.restore_state(&state).is_err(), "{what} was accepted");
        assert_eq!(p.state(), before, "{what} changed the state");
    }
    // The uncompressed form refuses the compressed form's state.
    let plain = streaming(8, 4, 2, 0.5, OuterConfig::paper(), "identity");
    let mut p = build("streaming-diloco", &topo, 1, x0[1].clone(), 0.1, &plain).unwrap();
    p.start_at_round(11).unwrap();
    assert!(p.restore_state(&good).is_err());
    let mut p = fresh();
    p.restore_state(&good).unwrap();
}

#[test]
fn bad_options_are_refused_with_clear_messages() {
    let topo = ring(3);
    let x0 = vec![0.0f32; 10];
    let err = |opts: AlgorithmOptions| match build(
        "streaming-diloco",
        &topo,
        0,
        x0.clone(),
        0.1,
        &opts,
    ) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted {opts:?}"),
    };
    let base = streaming(8, 4, 1, 0.5, OuterConfig::paper(), "identity");
    let e = err(AlgorithmOptions {
        fragments: Some(9),
        ..base.clone()
    });
    assert!(e.contains("--fragments must be in 1..=8"), "{e}");
    let e = err(AlgorithmOptions {
        tau: Some(3),
        ..base.clone()
    });
    assert!(e.contains("--tau must be at most H/P = 8/4 = 2"), "{e}");
    let e = err(AlgorithmOptions {
        merge_alpha: Some(1.5),
        ..base.clone()
    });
    assert!(e.contains("--merge-alpha must be in [0, 1]"), "{e}");
    let e = err(AlgorithmOptions {
        local_steps: Some(16),
        fragments: Some(11),
        ..base.clone()
    });
    assert!(e.contains("more than the model's 10 parameters"), "{e}");
    let e = err(AlgorithmOptions {
        compressor: Some("ef+topk:0.1".parse().unwrap()),
        ..base.clone()
    });
    assert!(e.contains("without ef+"), "{e}");
    // Streaming's options on another algorithm.
    let diloco: AlgorithmSpec = "diloco".parse().unwrap();
    let e = AlgorithmOptions {
        fragments: Some(2),
        ..Default::default()
    }
    .validate(&[diloco])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--fragments") && e.contains("streaming-diloco"),
        "{e}"
    );
    let e = AlgorithmOptions {
        merge_alpha: Some(-0.1),
        ..Default::default()
    }
    .validate(&["streaming-diloco".parse().unwrap()])
    .unwrap_err()
    .to_string();
    assert!(e.contains("--merge-alpha"), "{e}");
}

/// Mean over peers of (wait, communicate, wall) of a timed run of `algorithm`.
fn timed(algorithm: &str, opts: &AlgorithmOptions, rounds: u64) -> (f64, f64, f64) {
    let (n, d) = (8, 100_000);
    let x0 = vec![uniform_vectors(1, d, 1.0, 3).remove(0); n];
    // 100 Mbit/s, 1 ms: a fragment of 25,000 values (100 kB raw) takes about 14 × (12.5 kB
    // / 12.5 MB/s + 1 ms) ≈ 28 ms around the ring, against 100 ms of compute a step.
    let model = NetworkModel::ideal()
        .with_bandwidth(12.5e6)
        .with_latency(1e-3);
    let mut net = NetSim::new(network(algorithm, &x0, 0.01, opts), model).unwrap();
    let g = uniform_vectors(1, d, 1.0, 4).remove(0);
    let report = net
        .run_rounds(rounds, |_, _, _| Compute {
            grad: Some(g.clone()),
            seconds: 0.1,
        })
        .unwrap();
    let totals: Vec<_> = (0..n).map(|r| net.totals(r)).collect();
    let mean =
        |f: &dyn Fn(&murmur_gossip::Totals) -> f64| totals.iter().map(f).sum::<f64>() / n as f64;
    (
        mean(&|t| t.wait_secs),
        mean(&|t| t.communicate_secs),
        report.wall_secs(),
    )
}

#[test]
fn overlap_hides_the_fragments_all_reduce_behind_compute_in_the_simulator() {
    let (h, rounds) = (20, 80);
    let plain = AlgorithmOptions {
        local_steps: Some(h),
        ..Default::default()
    };
    let (w0, c0, wall0) = timed("diloco", &plain, rounds);
    let blocking = streaming(h, 4, 0, 0.0, OuterConfig::paper(), "identity");
    let (w1, c1, wall1) = timed("streaming-diloco", &blocking, rounds);
    let overlapped = streaming(h, 4, 1, 0.5, OuterConfig::paper(), "identity");
    let (w2, c2, wall2) = timed("streaming-diloco", &overlapped, rounds);
    println!("diloco: wait {w0:.4} s of {c0:.4} s communicating, wall {wall0:.3} s");
    println!("streaming τ=0: wait {w1:.4} s of {c1:.4} s, wall {wall1:.3} s");
    println!("streaming τ=1: wait {w2:.4} s of {c2:.4} s, wall {wall2:.3} s");
    let compute = rounds as f64 * 0.1;
    // DiLoCo and streaming without overlap wait for all of their communication.
    assert!(c0 > 0.0 && (w0 / c0) > 0.99, "diloco hid {}", 1.0 - w0 / c0);
    assert!(c1 > 0.0 && (w1 / c1) > 0.99, "τ = 0 hid {}", 1.0 - w1 / c1);
    // With τ = 1 the fragments' all-reduces run behind the next inner step: ≥ 90% hidden.
    assert!(
        c2 > 0.5 * c1,
        "the same communication is counted: {c2} vs {c1}"
    );
    assert!(
        w2 <= 0.1 * c2,
        "τ = 1 hid only {:.3} of {c2} s",
        1.0 - w2 / c2
    );
    assert!(
        wall2 < compute + 0.1 * (wall0 - compute),
        "{wall2} vs {wall0}"
    );
}

#[test]
fn sparseloco_fragments_are_all_gathered_and_compressed_from_the_shared_start() {
    // P = 4 fragments of m = 16, H = 8, τ = 0: every sync, each fragment's first included,
    // is n − 1 frames of one compressed message (the all-gather), never the 2(n − 1)
    // frames of a ring nor a raw average; the anchors stay identical on every peer.
    let (n, d, h, p) = (4, 64, 8u64, 4u64);
    let opts = streaming(
        h,
        p,
        0,
        0.5,
        OuterConfig::averaging(),
        "sparseloco:0.25,chunk=8",
    );
    let x0 = vec![uniform_vectors(1, d, 1.0, 31).remove(0); n];
    let mut sim = Sim::new(network("streaming-diloco", &x0, 0.1, &opts));
    let spec: CompressorSpec = "sparseloco:0.25,chunk=8".parse().unwrap();
    let most = (24 + 4 + spec.build(None).unwrap().max_encoded_len(16)) as u64;
    let raw = (24 + 4 + 12 + 4 * 16) as u64;
    assert!(most < raw);
    let schedule = StreamingSchedule::new(p, h, 0).unwrap();
    for t in 0..2 * h {
        let before = sim.peer(0).stats();
        sim.run_round(Some(&grads(n, d, t))).unwrap();
        let after = sim.peer(0).stats();
        let (frames, bytes) = (
            after.frames_sent - before.frames_sent,
            after.bytes_sent - before.bytes_sent,
        );
        if schedule.sync_at(t).is_some() {
            assert_eq!(frames, n as u64 - 1, "round {t}");
            assert!(bytes <= frames * most, "round {t}: {bytes} bytes");
        } else {
            assert_eq!(frames, 0, "round {t}");
        }
        let state = sim.peer(0).state();
        assert_eq!(state.vectors[0].0, "streaming.anchor");
        let a0 = state.vectors[0].1.clone();
        for i in 1..n {
            assert_eq!(sim.peer(i).state().vectors[0].1, a0, "round {t}: anchors");
        }
    }
}
