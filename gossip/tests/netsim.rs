//! Discrete-event network simulator tests: timing against closed forms, overlap,
//! stragglers, loss, determinism, and agreement with the lock-step simulator.
//!
//! Run with `--nocapture` to see the simulated times.

use murmur_compress::Identity;
use murmur_gossip::sim::Sim;
use murmur_gossip::{
    Choco, ChocoConfig, Compute, DPsgd, DPsgdConfig, Gossip, NetSim, NetSimError, NetworkModel,
    Rank,
};
use murmur_topology::{Graph, MixingMatrix};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::ring_mh;

/// n start vectors of d values uniform in [−1, 1) from `seed`.
fn starts(n: usize, d: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect()
}

fn dpsgd_peers(w: &MixingMatrix, lr: f32, xs: &[Vec<f32>]) -> Vec<Box<dyn Gossip>> {
    xs.iter()
        .enumerate()
        .map(|(i, x0)| {
            let cfg = DPsgdConfig::from_matrix(w, i, lr, x0.len());
            Box::new(DPsgd::new(cfg, x0.clone())) as Box<dyn Gossip>
        })
        .collect()
}

fn choco_peers(w: &MixingMatrix, lr: f32, gamma: f32, xs: &[Vec<f32>]) -> Vec<Box<dyn Gossip>> {
    xs.iter()
        .enumerate()
        .map(|(i, x0)| {
            let cfg = ChocoConfig::from_matrix(w, i, lr, gamma, x0.len());
            Box::new(Choco::new(cfg, x0.clone(), Box::new(Identity))) as Box<dyn Gossip>
        })
        .collect()
}

/// A deterministic pseudo-gradient: 0.1·x plus a (rank, round)-dependent offset.
fn pseudo_grad(rank: Rank, round: u64, x: &[f32]) -> Vec<f32> {
    let offset = ((rank as f32) - 3.5) * 0.01 + (round as f32) * 1e-3;
    x.iter().map(|v| 0.1 * v + offset).collect()
}

/// Bytes of one frame of peer 0 (every peer sends the same size), from its counters.
fn frame_bytes(sim: &NetSim) -> f64 {
    let s = sim.peer(0).unwrap().stats();
    s.bytes_sent as f64 / s.frames_sent as f64
}

/// Largest |x_i[k] − y_i[k]| over the peers and coordinates of two simulations.
fn max_abs_diff(a: &NetSim, b: &NetSim) -> f32 {
    (0..a.n())
        .flat_map(|i| {
            let (x, y) = (a.peer(i).unwrap().params(), b.peer(i).unwrap().params());
            x.iter()
                .zip(y)
                .map(|(u, v)| (u - v).abs())
                .collect::<Vec<_>>()
        })
        .fold(0.0, f32::max)
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn ideal_network_matches_the_lock_step_simulator() {
    let (n, d, rounds) = (8, 64, 25);
    let w = ring_mh(n);
    let xs = starts(n, d, 5);

    let mut lock = Sim::new(dpsgd_peers(&w, 0.0, &xs));
    let mut expected = Vec::new();
    for _ in 0..rounds {
        lock.run_round(None).unwrap();
        expected.push(lock.consensus_distance());
    }

    let mut net = NetSim::new(dpsgd_peers(&w, 0.0, &xs), NetworkModel::ideal()).unwrap();
    let report = net.run_consensus(rounds as u64).unwrap();
    assert_eq!(report.wall_secs(), 0.0, "an ideal network takes no time");
    let got: Vec<f64> = net.consensus().iter().map(|p| p.xi2).collect();
    assert_eq!(got.len(), rounds);
    for (t, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (g - e).abs() <= 1e-12 * e.abs(),
            "round {t}: NetSim Ξ² = {g:e}, Sim Ξ² = {e:e}"
        );
        assert_eq!(net.consensus()[t].round, t as u64);
    }
    assert!(got[rounds - 1] < 0.5 * got[0], "gossip must contract Ξ²");
    // Same frames in the same order: the parameters are bitwise equal.
    for i in 0..n {
        assert_eq!(net.peer(i).unwrap().params(), lock.peer(i).params());
    }

    // CHOCO (no overlap, so it takes the other path through a round) agrees too.
    let mut lock = Sim::new(choco_peers(&w, 0.0, 0.5, &xs));
    let mut net = NetSim::new(choco_peers(&w, 0.0, 0.5, &xs), NetworkModel::ideal()).unwrap();
    net.run_consensus(10).unwrap();
    for t in 0..10 {
        lock.run_round(None).unwrap();
        let (g, e) = (net.consensus()[t].xi2, lock.consensus_distance());
        assert!(
            (g - e).abs() <= 1e-12 * e.abs(),
            "CHOCO round {t}: {g:e} vs {e:e}"
        );
    }
}

#[test]
fn a_round_without_compute_takes_two_serializations_plus_latency() {
    let (n, d) = (8, 10_000);
    let (bandwidth, latency) = (1.25e8, 50e-6); // 1 Gb/s, 50 µs
    let w = ring_mh(n);
    let model = NetworkModel::ideal()
        .with_bandwidth(bandwidth)
        .with_latency(latency);
    let mut sim = NetSim::new(dpsgd_peers(&w, 0.0, &starts(n, d, 1)), model).unwrap();
    let report = sim.run_consensus(1).unwrap();

    let s = frame_bytes(&sim);
    assert!(
        s > 4.0 * d as f64,
        "a frame carries d f32 and headers: {s} bytes"
    );
    let expected = 2.0 * s / bandwidth + latency;
    println!(
        "ring {n}, d = {d}: frame {s} bytes, round {} s",
        report.wall_secs()
    );
    assert!(
        close(report.wall_secs(), expected, 1e-9),
        "round took {} s, closed form 2·{s}/{bandwidth} + {latency} = {expected} s",
        report.wall_secs()
    );
    // A peer whose two in-neighbours both send to it first is done after one serialization.
    for i in 0..n {
        let r = sim.history(i)[0];
        let one = s / bandwidth + latency;
        assert!(
            close(r.end_secs, expected, 1e-9) || close(r.end_secs, one, 1e-9),
            "peer {i} ended at {} s",
            r.end_secs
        );
        assert_eq!(r.bytes_sent as f64, 2.0 * s);
        assert_eq!(r.bytes_received as f64, 2.0 * s);
        assert_eq!(r.wait_secs, r.communicate_secs);
    }
}

#[test]
fn ingress_serialization_makes_an_incast_slower() {
    // Complete graph of 4: each peer sends 3 frames to peers in ascending order, so peer 3
    // is everyone's last destination: the first bytes of its three frames arrive together
    // at 2S/B + L and its NIC drains them one after another, the last done at 5S/B + L.
    let (n, d) = (4, 5_000);
    let (bandwidth, latency) = (1.25e9, 20e-6); // 10 Gb/s
    let w = MixingMatrix::metropolis_hastings(&Graph::complete(n).unwrap()).unwrap();
    let xs = starts(n, d, 2);
    let model = NetworkModel::ideal()
        .with_bandwidth(bandwidth)
        .with_latency(latency);

    let mut egress_only = NetSim::new(dpsgd_peers(&w, 0.0, &xs), model.clone()).unwrap();
    let a = egress_only.run_consensus(1).unwrap();
    let s = frame_bytes(&egress_only);
    assert!(close(a.wall_secs(), 3.0 * s / bandwidth + latency, 1e-9));

    let mut ingress = NetSim::new(dpsgd_peers(&w, 0.0, &xs), model.with_ingress(true)).unwrap();
    let b = ingress.run_consensus(1).unwrap();
    assert!(
        close(b.wall_secs(), 5.0 * s / bandwidth + latency, 1e-9),
        "with ingress: {} s, expected 5S/B + L = {} s",
        b.wall_secs(),
        5.0 * s / bandwidth + latency
    );
    // Same bytes, same result: only the time differs.
    for i in 0..n {
        assert_eq!(
            egress_only.peer(i).unwrap().params(),
            ingress.peer(i).unwrap().params()
        );
    }
}

#[test]
fn dpsgd_hides_communication_behind_compute_and_choco_does_not() {
    let (n, d, rounds) = (8, 10_000, 10u64);
    let (bandwidth, latency) = (1.25e8, 50e-6);
    let compute = 0.01; // 10 ms, against about 0.7 ms of communication
    let w = ring_mh(n);
    let xs = starts(n, d, 3);
    let model = NetworkModel::ideal()
        .with_bandwidth(bandwidth)
        .with_latency(latency);
    let step = |rank, round, x: &[f32]| Compute {
        grad: Some(pseudo_grad(rank, round, x)),
        seconds: compute,
    };

    let mut dpsgd = NetSim::new(dpsgd_peers(&w, 0.1, &xs), model.clone()).unwrap();
    let report = dpsgd.run_rounds(rounds, step).unwrap();
    let s = frame_bytes(&dpsgd);
    let comm = 2.0 * s / bandwidth + latency;
    assert!(comm < compute);
    println!(
        "D-PSGD: {} s per round (compute {compute} s, communication {comm} s)",
        report.mean_round_secs()
    );
    assert!(close(report.wall_secs(), rounds as f64 * compute, 1e-9));
    for i in 0..n {
        for r in dpsgd.history(i) {
            assert!(close(r.duration_secs(), compute, 1e-9), "{r:?}");
            assert!(r.wait_secs < 1e-12, "peer {i} waited: {r:?}");
            assert!(r.communicate_secs > 0.0 && r.communicate_secs <= comm + 1e-12);
        }
    }

    let mut choco = NetSim::new(choco_peers(&w, 0.1, 0.5, &xs), model).unwrap();
    let report = choco.run_rounds(rounds, step).unwrap();
    assert_eq!(
        frame_bytes(&choco),
        s,
        "identity CHOCO frames have D-PSGD's size"
    );
    let one = s / bandwidth + latency;
    println!(
        "CHOCO: {} s per round (compute + communication = {} s)",
        report.mean_round_secs(),
        compute + comm
    );
    // Each round costs compute plus the communication of the slowest neighbourhood (two
    // serializations and a latency); the faster peers wait for it.
    assert!(
        close(report.mean_round_secs(), compute + comm, 1e-9),
        "CHOCO round {} s, expected C + comm = {} s",
        report.mean_round_secs(),
        compute + comm
    );
    for i in 0..n {
        for r in choco.history(i) {
            assert!(close(r.compute_secs, compute, 1e-15));
            assert!(r.wait_secs >= one - 1e-9, "peer {i}: {r:?}");
            assert!(close(r.wait_secs, r.communicate_secs, 1e-12));
            assert!(close(
                r.duration_secs(),
                r.compute_secs + r.communicate_secs,
                1e-12
            ));
        }
    }
}

#[test]
fn a_straggler_slows_the_whole_ring_but_not_its_bytes() {
    let (n, d, rounds) = (6, 1_000, 30u64);
    let compute = 0.01;
    let factor = 3.0;
    let w = ring_mh(n);
    let xs = starts(n, d, 4);
    let step = |rank, round, x: &[f32]| Compute {
        grad: Some(pseudo_grad(rank, round, x)),
        seconds: compute,
    };
    let model = NetworkModel::gbps(10.0);

    let mut even = NetSim::new(dpsgd_peers(&w, 0.1, &xs), model.clone()).unwrap();
    let base = even.run_rounds(rounds, step).unwrap();
    let mut slow = NetSim::new(dpsgd_peers(&w, 0.1, &xs), model.with_straggler(0, factor)).unwrap();
    let report = slow.run_rounds(rounds, step).unwrap();
    println!(
        "ring {n}: {} s per round without a straggler, {} s with one (factor {factor})",
        base.mean_round_secs(),
        report.mean_round_secs()
    );
    assert!(close(base.mean_round_secs(), compute, 1e-9));
    // The straggler computes for 3C every round and never waits (its neighbours are
    // ahead), so the run takes 3C per round.
    assert!(close(report.mean_round_secs(), factor * compute, 1e-9));
    // Past the start-up (a peer k hops from the straggler runs ahead of it at full speed
    // for up to 2k rounds until the frames it needs pace it), every peer's round takes 3C:
    // the ring waits for it.
    let diameter = n / 2;
    for i in 0..n {
        let h = slow.history(i);
        for r in &h[2 * diameter..] {
            assert!(
                close(r.duration_secs(), factor * compute, 1e-6),
                "peer {i}: {r:?}"
            );
            if i != 0 {
                assert!(close(r.wait_secs, (factor - 1.0) * compute, 1e-6), "{r:?}");
            }
        }
    }
    // Stragglers cost time, not bytes.
    for (a, b) in base.peers.iter().zip(&report.peers) {
        assert_eq!(a.bytes_sent, b.bytes_sent);
        assert_eq!(a.bytes_received, b.bytes_received);
    }
    // Same arithmetic up to the order in which frames were summed.
    let diff = max_abs_diff(&slow, &even);
    assert!(diff <= 1e-5, "parameters differ by {diff}");
}

#[test]
fn dropped_frames_cost_time_not_data() {
    let (n, d, rounds) = (8, 1_000, 20u64);
    let w = ring_mh(n);
    let xs = starts(n, d, 6);
    // No compute time: communication is the critical path, so retransmissions show.
    let step = |rank, round, x: &[f32]| Compute {
        grad: Some(pseudo_grad(rank, round, x)),
        seconds: 0.0,
    };
    let model = NetworkModel::gbps(1.0).with_seed(9);

    let mut clean = NetSim::new(dpsgd_peers(&w, 0.1, &xs), model.clone()).unwrap();
    let a = clean.run_rounds(rounds, step).unwrap();
    let mut lossy = NetSim::new(dpsgd_peers(&w, 0.1, &xs), model.with_drop(0.1)).unwrap();
    let b = lossy.run_rounds(rounds, step).unwrap();

    let dropped: u64 = b.peers.iter().map(|t| t.frames_dropped).sum();
    let frames = (n as u64) * 2 * rounds;
    println!(
        "{dropped} attempts lost sending {frames} frames; {} s without loss, {} s with",
        a.wall_secs(),
        b.wall_secs()
    );
    assert!(
        dropped >= frames / 20 && dropped <= frames / 5,
        "{dropped} losses of {frames} at p = 0.1"
    );
    assert_eq!(a.peers.iter().map(|t| t.frames_dropped).sum::<u64>(), 0);
    assert!(b.wall_secs() > a.wall_secs());
    // Reliable transport: every frame arrives, the algorithm's bytes are the same, and the
    // parameters agree up to the order in which a peer summed its neighbours' frames.
    for i in 0..n {
        assert_eq!(a.peers[i].bytes_sent, b.peers[i].bytes_sent);
        assert_eq!(a.peers[i].bytes_received, b.peers[i].bytes_received);
    }
    let diff = max_abs_diff(&clean, &lossy);
    assert!(diff <= 1e-5, "parameters differ by {diff}");
}

/// A run with every random element switched on.
fn noisy_run() -> (NetSim, Vec<Vec<f32>>) {
    let (n, d) = (8, 500);
    let w = ring_mh(n);
    let model = NetworkModel::gbps(1.0)
        .with_drop(0.2)
        .with_random_stragglers(0.3, 4.0)
        .with_straggler(2, 1.5)
        .with_ingress(true)
        .with_seed(42);
    let mut sim = NetSim::new(dpsgd_peers(&w, 0.05, &starts(n, d, 8)), model).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let step = |rank, round, x: &[f32]| Compute {
        grad: Some(pseudo_grad(rank, round, x)),
        seconds: 1e-3 * (1.0 + rank as f64 / 8.0),
    };
    sim.run_rounds(10, step).unwrap();
    // A second call continues where each peer stopped; compute times from an RNG.
    sim.run_rounds(5, |rank, round, x| Compute {
        grad: Some(pseudo_grad(rank, round, x)),
        seconds: rng.random_range(1e-4..2e-3),
    })
    .unwrap();
    let params = (0..n)
        .map(|i| sim.peer(i).unwrap().params().to_vec())
        .collect();
    (sim, params)
}

#[test]
fn runs_are_bitwise_deterministic() {
    let (a, pa) = noisy_run();
    let (b, pb) = noisy_run();
    for i in 0..a.n() {
        assert_eq!(a.history(i).len(), 15);
        assert_eq!(a.history(i), b.history(i), "peer {i}");
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&pa[i]), bits(&pb[i]), "peer {i}");
    }
    assert_eq!(a.consensus().len(), 15);
    assert_eq!(a.consensus(), b.consensus());
    assert_eq!(a.now_secs().to_bits(), b.now_secs().to_bits());
    assert!(a.totals(0).frames_dropped > 0);
}

#[test]
fn sixty_four_peers_with_the_mlp_size() {
    let (n, d, rounds) = (64, 203_530, 2u64);
    let compute = 0.05;
    let w = ring_mh(n);
    let xs = starts(n, d, 10);
    let mut sim = NetSim::new(dpsgd_peers(&w, 0.01, &xs), NetworkModel::gbps(1.0)).unwrap();
    sim.set_track_consensus(false);
    let report = sim
        .run_rounds(rounds, |_, _, x| Compute {
            grad: Some(x.to_vec()),
            seconds: compute,
        })
        .unwrap();
    let s = frame_bytes(&sim);
    let comm = 2.0 * s / 1.25e8 + 50e-6;
    println!(
        "64 × {d}: frame {s} bytes, communication {comm} s, {} s per round",
        report.mean_round_secs()
    );
    assert!(comm < compute);
    assert!(close(report.wall_secs(), rounds as f64 * compute, 1e-9));
    for t in &report.peers {
        assert_eq!(t.rounds, rounds);
        assert_eq!(t.bytes_sent as f64, 2.0 * s * rounds as f64);
    }
    assert!(sim.consensus().is_empty());
}

#[test]
fn a_silent_neighbour_times_the_round_out() {
    let (n, d) = (4, 10);
    let w = ring_mh(n);
    let mut peers = dpsgd_peers(&w, 0.0, &starts(n, d, 0));
    let mut cfg = DPsgdConfig::from_matrix(&w, 0, 0.0, d);
    cfg.out_neighbors.clear(); // peer 0 receives but never sends
    peers[0] = Box::new(DPsgd::new(cfg, vec![0.0; d]));
    let mut sim = NetSim::new(peers, NetworkModel::gbps(1.0)).unwrap();
    match sim.run_consensus(1) {
        Err(NetSimError::RoundTimedOut {
            rank,
            round,
            missing,
            at_secs,
        }) => {
            assert!(rank == 1 || rank == 3, "rank {rank}");
            assert_eq!((round, missing), (0, vec![0]));
            assert!(close(at_secs, 60.0, 1e-6), "timed out at {at_secs} s");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn bad_models_and_bad_compute_are_errors() {
    let w = ring_mh(4);
    let xs = starts(4, 8, 0);
    let new = |m: NetworkModel| NetSim::new(dpsgd_peers(&w, 0.1, &xs), m);
    for model in [
        NetworkModel::ideal().with_drop(1.0),
        NetworkModel::ideal().with_bandwidth(0.0),
        NetworkModel::ideal().with_latency(-1.0),
        NetworkModel::ideal().with_straggler(4, 2.0),
        NetworkModel::ideal().with_random_stragglers(0.5, f64::NAN),
    ] {
        assert!(matches!(new(model), Err(NetSimError::InvalidModel(_))));
    }
    assert!(matches!(
        NetSim::new(Vec::new(), NetworkModel::ideal()),
        Err(NetSimError::InvalidPeers(_))
    ));

    let mut sim = new(NetworkModel::ideal()).unwrap();
    let short = sim.run_rounds(1, |_, _, _| Compute {
        grad: Some(vec![0.0; 7]),
        seconds: 0.0,
    });
    assert!(matches!(short, Err(NetSimError::InvalidCompute { .. })));
    let mut sim = new(NetworkModel::ideal()).unwrap();
    let negative = sim.run_rounds(1, |_, _, _| Compute {
        grad: None,
        seconds: -1.0,
    });
    assert!(matches!(negative, Err(NetSimError::InvalidCompute { .. })));
}
