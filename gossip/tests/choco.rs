//! CHOCO-SGD / CHOCO-Gossip state machine and simulator tests.
//!
//! Run with `--nocapture` to see the measured rounds and bits.

use std::time::{Duration, Instant};

use murmur_compress::{Compressor, Identity, TopK};
use murmur_gossip::sim::Sim;
use murmur_gossip::{Choco, ChocoConfig, Gossip, GossipError, GossipEvent, Rank};
use murmur_topology::{Graph, MixingMatrix};

mod common;
use common::{raw_frame, ring_mh, round_among, skip_round};

/// Runs `sim` until Ξ² ≤ `target` · Ξ²(0), at most `max_rounds` rounds. Returns the rounds
/// taken and the largest deviation |x̄_k(t) − x̄_k(0)| of the network average seen on the way.
fn rounds_to(sim: &mut Sim, target: f64, max_rounds: usize) -> (usize, f32) {
    let xi0 = sim.consensus_distance();
    let avg0 = sim.average();
    let mut max_dev = 0.0f32;
    let mut rounds = 0;
    while sim.consensus_distance() > target * xi0 {
        assert!(
            rounds < max_rounds,
            "Ξ²/Ξ²(0) = {:e} after {max_rounds} rounds",
            sim.consensus_distance() / xi0
        );
        sim.run_round(None).unwrap();
        rounds += 1;
        let dev = sim
            .average()
            .iter()
            .zip(&avg0)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        max_dev = max_dev.max(dev);
    }
    (rounds, max_dev)
}

/// Mean over peers of the bits they handed to the transport (whole frames).
fn bits_per_peer(sim: &Sim) -> f64 {
    (0..sim.n())
        .map(|i| sim.peer(i).stats().bytes_sent as f64 * 8.0)
        .sum::<f64>()
        / sim.n() as f64
}

/// The acceptance bar: CHOCO-Gossip with top-k 1% on the 9-ring reaches Ξ² ≤ 10⁻⁶ Ξ²(0)
/// within 2,000 rounds, keeps the average, and sends fewer bits than exact gossip needs for
/// the same precision.
#[test]
fn choco_gossip_topk_on_ring9_beats_exact_gossip_in_bits() {
    let (n, d, target) = (9, 2_000, 1e-6);
    let w = ring_mh(n);

    let mut choco = Sim::choco_consensus(&w, d, |_| Box::new(TopK::new(0.01)), 0.04, 11);
    let (choco_rounds, max_dev) = rounds_to(&mut choco, target, 2_000);
    let choco_bits = bits_per_peer(&choco);

    let mut exact = Sim::dpsgd_consensus(&w, d, 11);
    let (exact_rounds, exact_dev) = rounds_to(&mut exact, target, 2_000);
    let exact_bits = bits_per_peer(&exact);

    // Message sizes: each round a peer sends the same frame to its 2 neighbours.
    let frames = choco.peer(0).stats().frames_sent;
    let choco_frame_bytes = choco.peer(0).stats().bytes_sent as f64 / frames as f64;
    let exact_frame_bytes = (24 + 12 + 4 * d) as f64;
    eprintln!(
        "CHOCO top-k 1%, γ = 0.04: {choco_rounds} rounds, {:.3} Mbit per peer \
         ({choco_frame_bytes:.1} B per frame, {:.3} Mbit counting one message per round), \
         max |x̄ − x̄(0)| = {max_dev:e}",
        choco_bits / 1e6,
        choco_bits / 2e6,
    );
    eprintln!(
        "exact gossip: {exact_rounds} rounds, {:.3} Mbit per peer ({exact_frame_bytes} B per \
         frame, {:.3} Mbit counting one message per round), max |x̄ − x̄(0)| = {exact_dev:e}",
        exact_bits / 1e6,
        exact_bits / 2e6,
    );

    assert_eq!(
        exact.peer(0).stats().bytes_sent as f64,
        2.0 * exact_rounds as f64 * exact_frame_bytes
    );
    assert!(max_dev < 1e-4, "the average moved by {max_dev}");
    assert!(
        choco_bits < exact_bits,
        "CHOCO sent {choco_bits} bits per peer, exact gossip {exact_bits}"
    );
    // Top-k 1% of 2,000: 20 indices (1–2 bytes each) + 20 f32 + 20 B of message headers.
    assert!(choco_frame_bytes <= (24 + 12 + 8 + 20 * 2 + 20 * 4) as f64);
}

/// With the identity and γ = 1, CHOCO is exact gossip: after round 0 x̂_i = x_i, so
/// x_i + (Σ_j w_ij x̂_j − x̂_i) = Σ_j w_ij x_j, and from then on q = x − x̂ is exact.
#[test]
fn identity_with_gamma_one_is_dpsgd() {
    let w = ring_mh(7);
    let mut choco = Sim::choco_consensus(&w, 64, |_| Box::new(Identity), 1.0, 5);
    let mut exact = Sim::dpsgd_consensus(&w, 64, 5);
    for round in 0..6 {
        choco.run_round(None).unwrap();
        exact.run_round(None).unwrap();
        for i in 0..w.n() {
            for (a, b) in choco.peer(i).params().iter().zip(exact.peer(i).params()) {
                assert!(
                    (a - b).abs() < 1e-6,
                    "round {round}, peer {i}: CHOCO {a}, D-PSGD {b}"
                );
            }
        }
    }
}

/// The path 0 – 1 – 2 with Metropolis–Hastings weights: w_00 = w_22 = 2/3, w_11 = 1/3, and
/// 1/3 on each edge. Top-k 50% of d = 4 (k = 2).
fn path3() -> MixingMatrix {
    MixingMatrix::metropolis_hastings(&Graph::from_edges(3, &[(0, 1), (1, 2)], false).unwrap())
        .unwrap()
}

fn path3_peer(rank: Rank, x0: &[f32], lr: f32, gamma: f32) -> Choco {
    let cfg = ChocoConfig::from_matrix(&path3(), rank, lr, gamma, x0.len());
    Choco::new(cfg, x0.to_vec(), Box::new(TopK::new(0.5)))
}

const X0: [[f32; 4]; 3] = [
    [4.0, -1.0, 0.5, 2.0],
    [0.0, 3.0, -2.0, 1.0],
    [1.0, -5.0, 0.25, 0.5],
];

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() < 1e-6,
            "{what}[{k}] = {g}, expected {w}"
        );
    }
}

/// One round of CHOCO-SGD worked out by hand (η = 0.5, γ = 0.5, x̂ = 0 at the start, so
/// q_i = top-2(x_i^(t+½))):
///
/// ```text
/// x_1^(½) = (0, 3, −2, 1) − 0.5·(2, 0, 0, −4) = (−1, 3, −2, 3)
/// q_0 = (4, 0, 0, 2)   q_1 = (0, 3, 0, 3)   q_2 = (1, −5, 0, 0)
/// s_0 = ⅔q_0 + ⅓q_1 = (8/3, 1, 0, 7/3)          x_0' = x_0 + ½(s_0 − q_0) = (10/3, −½, ½, 13/6)
/// s_1 = ⅓(q_0 + q_1 + q_2) = (5/3, −2/3, 0, 5/3)  x_1' = x_1^(½) + ½(s_1 − q_1) = (−1/6, 7/6, −2, 7/3)
/// s_2 = ⅔q_2 + ⅓q_1 = (2/3, −7/3, 0, 1)          x_2' = x_2 + ½(s_2 − q_2) = (5/6, −11/3, ¼, 1)
/// ```
#[test]
fn one_round_by_hand_on_three_peers() {
    let peers: Vec<Box<dyn Gossip>> = (0..3)
        .map(|i| Box::new(path3_peer(i, &X0[i], 0.5, 0.5)) as Box<dyn Gossip>)
        .collect();
    let mut sim = Sim::new(peers);
    let grads = vec![vec![0.0; 4], vec![2.0, 0.0, 0.0, -4.0], vec![0.0; 4]];
    sim.run_round(Some(&grads)).unwrap();
    let third = 1.0 / 3.0;
    assert_close(
        sim.peer(0).params(),
        &[10.0 * third, -0.5, 0.5, 13.0 / 6.0],
        "x_0",
    );
    assert_close(
        sim.peer(1).params(),
        &[-1.0 / 6.0, 7.0 / 6.0, -2.0, 7.0 * third],
        "x_1",
    );
    assert_close(
        sim.peer(2).params(),
        &[5.0 / 6.0, -11.0 * third, 0.25, 1.0],
        "x_2",
    );
    // Frame: 24 B header + 12 B message header + 8 B sparse parameters + 2 one-byte varint
    // indices + 2 f32 = 54 bytes, once per out-neighbour.
    assert_eq!(sim.peer(0).stats().bytes_sent, 54);
    assert_eq!(sim.peer(1).stats().bytes_sent, 2 * 54);
    assert_eq!(sim.peer(1).stats().bytes_received, 2 * 54);

    // The same round on bare state machines, to read x̂ and s.
    let now = Instant::now();
    let mut p: Vec<Choco> = (0..3).map(|i| path3_peer(i, &X0[i], 0.5, 0.5)).collect();
    let frames = begin_all(&mut p, now, &grads);
    deliver(&mut p, now, frames);
    assert_close(p[1].x_hat(), &[0.0, 3.0, 0.0, 3.0], "x̂_1");
    assert_close(
        &p[1].s(),
        &[5.0 * third, -2.0 * third, 0.0, 5.0 * third],
        "s_1",
    );
    assert_close(&p[0].s(), &[8.0 * third, 1.0, 0.0, 7.0 * third], "s_0");
    assert_close(&p[2].s(), &[2.0 * third, -7.0 * third, 0.0, 1.0], "s_2");
}

/// Begins a round on every peer; returns (from, to, frame) in sending order.
fn begin_all(p: &mut [Choco], now: Instant, grads: &[Vec<f32>]) -> Vec<(Rank, Rank, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, peer) in p.iter_mut().enumerate() {
        let x = peer.params().to_vec();
        peer.begin_round(now, &x, Some(&grads[i]));
        while let Some(t) = peer.poll_transmit() {
            out.push((i, t.to, t.frame.to_vec()));
        }
    }
    out
}

fn deliver(p: &mut [Choco], now: Instant, frames: Vec<(Rank, Rank, Vec<u8>)>) {
    for (from, to, f) in frames {
        p[to].handle_message(now, from, &f).unwrap();
    }
    for (i, peer) in p.iter_mut().enumerate() {
        assert!(
            matches!(peer.poll_event(), Some(GossipEvent::Mixed { .. })),
            "peer {i} did not mix"
        );
    }
}

fn identity_message(x: &[f32]) -> Vec<u8> {
    let mut payload = Vec::new();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    Identity.compress(x, &mut rng, &mut payload);
    payload
}

/// (x, x̂, s) of a peer, to compare bit for bit.
fn state(p: &Choco) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (p.params().to_vec(), p.x_hat().to_vec(), p.s())
}

/// Bad frames — malformed payloads, wrong dimensions, a non-neighbour, duplicates, on the
/// current round and on a buffered later round — are refused, and two rounds later every
/// peer's x, x̂ and s are bit for bit those of a run that never saw them.
#[test]
fn refused_frames_leave_the_state_untouched() {
    let now = Instant::now();
    let grads = vec![vec![0.0f32; 4]; 3];
    let fresh = || -> Vec<Choco> { (0..3).map(|i| path3_peer(i, &X0[i], 0.0, 0.5)).collect() };

    // Reference: two clean rounds.
    let mut clean = fresh();
    for _ in 0..2 {
        let frames = begin_all(&mut clean, now, &grads);
        deliver(&mut clean, now, frames);
    }

    let mut p = fresh();
    let frames = begin_all(&mut p, now, &grads);
    let frame = |from: Rank, to: Rank| {
        frames
            .iter()
            .find(|(f, t, _)| (*f, *t) == (from, to))
            .unwrap()
            .2
            .clone()
    };
    let good_01 = frame(0, 1);
    let refuse = |p: &mut Choco, from: Rank, f: &[u8], check: &dyn Fn(&GossipError) -> bool| {
        let before = state(p);
        let err = p.handle_message(now, from, f).unwrap_err();
        assert!(check(&err), "unexpected refusal: {err}");
        assert_eq!(state(p), before, "refused frame ({err}) changed the state");
        assert_eq!(p.poll_event(), None);
    };

    // Peer 0 hears from peer 2, which is not its neighbour on the path.
    let from_2 = raw_frame(2, 0, 4, &identity_message(&[1.0; 4]));
    refuse(&mut p[0], 2, &from_2, &|e| {
        *e == GossipError::NotANeighbour(2)
    });

    // Peer 1, mixing round 0, with nothing received yet.
    let wrong_dim = raw_frame(0, 0, 5, &identity_message(&[1.0; 5]));
    refuse(&mut p[1], 0, &wrong_dim, &|e| {
        matches!(
            e,
            GossipError::DimensionMismatch {
                expected: 4,
                got: 5,
                ..
            }
        )
    });
    let inner_dim = raw_frame(0, 0, 4, &identity_message(&[1.0; 5]));
    refuse(&mut p[1], 0, &inner_dim, &|e| {
        matches!(e, GossipError::Payload { from: 0, .. })
    });
    let mut nan_value = good_01.clone();
    let len = nan_value.len();
    nan_value[len - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    refuse(&mut p[1], 0, &nan_value, &|e| {
        matches!(e, GossipError::Payload { from: 0, .. })
    });
    let mut bad_index = good_01.clone();
    bad_index[24 + 12 + 8] = 200; // first varint index far beyond d = 4
    refuse(&mut p[1], 0, &bad_index, &|e| {
        matches!(e, GossipError::Payload { from: 0, .. })
    });
    let garbage = raw_frame(0, 0, 4, &[0xAB; 30]);
    refuse(&mut p[1], 0, &garbage, &|e| {
        matches!(e, GossipError::Payload { from: 0, .. })
    });
    refuse(&mut p[1], 0, &good_01[..40], &|e| {
        matches!(e, GossipError::Frame(_))
    });
    refuse(&mut p[1], 2, &good_01, &|e| {
        matches!(e, GossipError::SenderMismatch { .. })
    });

    // The good frame from 0, then a duplicate of it.
    p[1].handle_message(now, 0, &good_01).unwrap();
    refuse(&mut p[1], 0, &good_01, &|e| {
        matches!(e, GossipError::Duplicate { from: 0, round: 0 })
    });

    // Peers 0 and 2 finish round 0; peer 0 starts round 1 while peer 1 still mixes round 0,
    // so its round-1 frame is buffered by peer 1 — once.
    p[0].handle_message(now, 1, &frame(1, 0)).unwrap();
    p[2].handle_message(now, 1, &frame(1, 2)).unwrap();
    for i in [0, 2] {
        assert_eq!(p[i].poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    }
    let x = p[0].params().to_vec();
    p[0].begin_round(now, &x, Some(&grads[0]));
    let t = p[0].poll_transmit().unwrap();
    assert_eq!(t.to, 1);
    let early_01 = t.frame.to_vec();
    let mut nan_early = early_01.clone();
    let len = nan_early.len();
    nan_early[len - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    refuse(&mut p[1], 0, &nan_early, &|e| {
        matches!(e, GossipError::Payload { from: 0, .. })
    });
    p[1].handle_message(now, 0, &early_01).unwrap();
    refuse(&mut p[1], 0, &early_01, &|e| {
        matches!(e, GossipError::Duplicate { from: 0, round: 1 })
    });
    p[1].handle_message(now, 2, &frame(2, 1)).unwrap();
    assert_eq!(p[1].poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert!(p.iter().all(|peer| peer.round() == 1));

    // Round 1 for peers 1 and 2 (peer 0 already began it and sent its frame).
    let mut rest = Vec::new();
    for i in [1, 2] {
        let x = p[i].params().to_vec();
        p[i].begin_round(now, &x, Some(&grads[i]));
        while let Some(t) = p[i].poll_transmit() {
            rest.push((i, t.to, t.frame.to_vec()));
        }
    }
    rest.push((0, 1, early_01.clone())); // already absorbed by peer 1: now a duplicate
    for (from, to, f) in rest {
        let r = p[to].handle_message(now, from, &f);
        if (from, to) == (0, 1) {
            assert!(
                matches!(r, Err(GossipError::RoundOutOfWindow { .. })),
                "{r:?}"
            );
        } else {
            r.unwrap();
        }
    }
    for (i, peer) in p.iter_mut().enumerate() {
        assert_eq!(
            peer.poll_event(),
            Some(GossipEvent::Mixed { round: 1 }),
            "peer {i}"
        );
        assert_eq!(
            state(peer),
            state(&clean[i]),
            "peer {i} differs from the clean run"
        );
    }
}

/// CHOCO-SGD on a least-squares problem: peer i minimises f_i(x) = ‖x − b_i‖²/2 (gradient
/// x − b_i); the minimiser of Σ_i f_i is b̄ = (1/n) Σ_i b_i. Ring of 8, top-k 10%, d = 100,
/// γ = 0.3 and the decreasing step η_t = 4/(μ(a + t)) of the paper's Theorem 4 with μ = 1
/// and a = 40 (η = 0.1 in the config, the driver scales the gradient by 40/(40 + t)).
///
/// With a constant η the peers stop at a distance O(η) from b̄ (the local gradients differ
/// at the optimum; the average still converges exactly); with η_t ∝ 1/t that distance
/// shrinks like 1/t, and the average x̄ evolves as x̄ − η_t (x̄ − b̄) exactly.
#[test]
fn choco_sgd_solves_distributed_least_squares() {
    use rand::{RngExt, SeedableRng};
    let (n, d) = (8, 100);
    let (lr, gamma, a) = (0.1f32, 0.3f32, 40.0f32);
    let w = ring_mh(n);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let b: Vec<Vec<f32>> = (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect();
    let b_bar: Vec<f64> = (0..d)
        .map(|k| b.iter().map(|bi| bi[k] as f64).sum::<f64>() / n as f64)
        .collect();
    let dist = |x: &[f32]| -> f64 {
        x.iter()
            .zip(&b_bar)
            .map(|(a, m)| (*a as f64 - m).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let peers: Vec<Box<dyn Gossip>> = (0..n)
        .map(|i| {
            let cfg = ChocoConfig::from_matrix(&w, i, lr, gamma, d);
            Box::new(Choco::new(cfg, vec![0.0; d], Box::new(TopK::new(0.1)))) as Box<dyn Gossip>
        })
        .collect();
    let mut sim = Sim::new(peers);
    let start = dist(&vec![0.0; d]);
    let spread = b.iter().map(|bi| dist(bi)).fold(0.0, f64::max);
    let mut worst = Vec::new();
    for t in 0..2_000 {
        let scale = a / (a + t as f32);
        let grads: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                sim.peer(i)
                    .params()
                    .iter()
                    .zip(&b[i])
                    .map(|(x, bi)| scale * (x - bi))
                    .collect()
            })
            .collect();
        sim.run_round(Some(&grads)).unwrap();
        if t + 1 == 1_000 || t + 1 == 2_000 {
            worst.push(
                (0..n)
                    .map(|i| dist(sim.peer(i).params()))
                    .fold(0.0, f64::max),
            );
        }
    }
    let avg = dist(&sim.average());
    eprintln!(
        "least squares: ‖b̄‖ = {start:.3}, max_i ‖b_i − b̄‖ = {spread:.3}; max_i ‖x_i − b̄‖ = \
         {:.3e} after 1,000 rounds, {:.3e} after 2,000; ‖x̄ − b̄‖ = {avg:.2e}",
        worst[0], worst[1]
    );
    assert!(
        worst[1] < 0.12,
        "max_i ‖x_i − b̄‖ = {} after 2,000 rounds",
        worst[1]
    );
    assert!(
        worst[1] < 0.6 * worst[0],
        "the distance must shrink like 1/t: {} → {}",
        worst[0],
        worst[1]
    );
    assert!(avg < 1e-3, "‖x̄ − b̄‖ = {avg}");
}

#[test]
fn a_non_finite_state_is_reported_as_divergence_not_a_panic() {
    let now = Instant::now();
    let mut p = path3_peer(0, &[1.0, 2.0], 0.1, 0.5);
    p.begin_round(now, &[f32::INFINITY, 2.0], None);
    let ev =
        std::iter::from_fn(|| p.poll_event()).find(|e| matches!(e, GossipEvent::Diverged { .. }));
    match ev {
        Some(GossipEvent::Diverged { round, reason }) => {
            assert_eq!(round, 0);
            assert!(reason.contains("not finite"), "{reason}");
        }
        other => panic!("expected Diverged, got {other:?}"),
    }
}

#[test]
fn choco_survivors_of_a_departure_reweight_from_their_copies_and_agree() {
    let (n, d) = (6, 40);
    let w = ring_mh(n);
    let mut peers: Vec<Choco> = (0..n)
        .map(|i| {
            let x0: Vec<f32> = (0..d).map(|k| ((i * 7 + k * 3) % 11) as f32).collect();
            let cfg = ChocoConfig::from_matrix(&w, i, 0.0, 0.3, d);
            Choco::new(cfg, x0, Box::new(TopK::new(0.25)))
        })
        .collect();
    let mut alive = vec![true; n];
    for _ in 0..5 {
        assert!(round_among(&mut peers, &alive).iter().all(|&m| m));
    }
    // The copies are what the neighbours hold: peer 3's copy of peer 4 is peer 4's x̂.
    assert_eq!(peers[3].copies()[1], peers[4].x_hat());
    // Peer 4 dies before round 5: peers 3 and 5 wait for it until told.
    alive[4] = false;
    let m = round_among(&mut peers, &alive);
    assert_eq!(m, vec![true, true, true, false, false, false]);
    let survivors = w.without_peers(&[4]).unwrap();
    for i in (0..n).filter(|&i| alive[i]) {
        peers[i].peer_left(4, &survivors.w).unwrap();
    }
    let mean = |ps: &[Choco]| -> Vec<f64> {
        (0..d)
            .map(|k| {
                (0..n)
                    .filter(|&i| alive[i])
                    .map(|i| f64::from(ps[i].params()[k]))
                    .sum::<f64>()
                    / (n - 1) as f64
            })
            .collect()
    };
    // Peer 3 and 5 finish round 5 without peer 4's q; from round 6 the survivors mix with
    // W' (symmetric, doubly stochastic), so their average is kept and they reach it.
    let m = round_among(&mut peers, &alive);
    assert!((0..n).all(|i| m[i] == alive[i]), "{m:?}");
    let avg = mean(&peers);
    for _ in 0..2000 {
        let m = round_among(&mut peers, &alive);
        assert!((0..n).all(|i| m[i] == alive[i]));
    }
    let end = mean(&peers);
    for k in 0..d {
        assert!((end[k] - avg[k]).abs() < 1e-3, "average moved at {k}");
        for i in (0..n).filter(|&i| alive[i]) {
            let v = f64::from(peers[i].params()[k]);
            assert!(
                (v - avg[k]).abs() < 1e-3,
                "peer {i}[{k}] = {v} vs {}",
                avg[k]
            );
        }
    }
    // Frames of the departed peer are refused; a matrix still weighing it too.
    let frame = raw_frame(4, 700, d as u32, &identity_message(&vec![0.0; d]));
    assert_eq!(
        peers[3].handle_message(Instant::now(), 4, &frame),
        Err(GossipError::Departed(4))
    );
    assert!(peers[3].peer_left(4, &w).is_err());
}
#[test]
fn a_returning_choco_peer_gets_the_copies_in_full_and_the_network_agrees_again() {
    let (n, d) = (6, 40);
    let w = ring_mh(n);
    let make = |i: Rank, x0: Vec<f32>| {
        let cfg = ChocoConfig::from_matrix(&w, i, 0.0, 0.3, d);
        Choco::new(cfg, x0, Box::new(TopK::new(0.25)))
    };
    let mut peers: Vec<Choco> = (0..n)
        .map(|i| make(i, (0..d).map(|k| ((i * 7 + k * 3) % 11) as f32).collect()))
        .collect();
    let mut alive = vec![true; n];
    for _ in 0..20 {
        assert!(round_among(&mut peers, &alive).iter().all(|&m| m));
    }
    // Peer 2 crashes; the survivors re-weight and mix on without it.
    alive[2] = false;
    round_among(&mut peers, &alive);
    let survivors = w.without_peers(&[2]).unwrap();
    for i in (0..n).filter(|&i| alive[i]) {
        peers[i].peer_left(2, &survivors.w).unwrap();
    }
    for _ in 0..30 {
        round_among(&mut peers, &alive);
    }
    // A new process of peer 2 (fresh state, x from its neighbours' mean) returns at round
    // `at`; every peer is told before it begins that round.
    let at = peers[0].round();
    let x0: Vec<f32> = (0..d)
        .map(|k| (peers[1].params()[k] + peers[3].params()[k]) / 2.0)
        .collect();
    peers[2] = make(2, x0);
    peers[2].start_at_round(at).unwrap();
    for i in (0..n).filter(|&i| i != 2) {
        peers[i].peer_rejoined(2, &w, at).unwrap();
    }
    alive[2] = true;
    let total = |ps: &[Choco]| -> Vec<f64> {
        (0..d)
            .map(|k| ps.iter().map(|p| f64::from(p.params()[k])).sum::<f64>())
            .collect()
    };
    let start = total(&peers);
    assert!(round_among(&mut peers, &alive).iter().all(|&m| m));
    // After round `at` every copy is what its owner holds, bit for bit: peer 2's of its
    // neighbours (sent in full), its neighbours' of it, and the others' (unchanged).
    for i in 0..n {
        for ((j, _), copy) in peers[i].config().in_weights.iter().zip(peers[i].copies()) {
            assert_eq!(copy.as_slice(), peers[*j].x_hat(), "peer {i}'s copy of {j}");
        }
    }
    for _ in 0..2000 {
        assert!(round_among(&mut peers, &alive).iter().all(|&m| m));
    }
    // Mixing kept the sum from round `at` on, and all six agree on its mean.
    let end = total(&peers);
    for k in 0..d {
        assert!(
            (end[k] - start[k]).abs() < 1e-3,
            "sum[{k}]: {} → {}",
            start[k],
            end[k]
        );
        for (i, p) in peers.iter().enumerate() {
            let v = f64::from(p.params()[k]);
            let mean = start[k] / n as f64;
            assert!((v - mean).abs() < 1e-3, "peer {i}[{k}] = {v} vs {mean}");
        }
    }
}

/// The mix is formed from the copies every round, so f32 rounding does not pile up into a
/// force that moves the network average after consensus (the memory-efficient form moved
/// the mean of coordinate 0 here by 2.1·10⁻³ over 1,600 rounds; see the module docs).
#[test]
fn choco_gossip_keeps_the_average_after_consensus() {
    let (n, d) = (6, 40);
    let w = ring_mh(n);
    let x0: Vec<Vec<f32>> = (0..n)
        .map(|i| (0..d).map(|k| ((i * 7 + k * 3) % 11) as f32).collect())
        .collect();
    let mut peers: Vec<Choco> = (0..n)
        .map(|i| {
            let cfg = ChocoConfig::from_matrix(&w, i, 0.0, 0.3, d);
            Choco::new(cfg, x0[i].clone(), Box::new(TopK::new(0.25)))
        })
        .collect();
    let alive = vec![true; n];
    for _ in 0..2000 {
        assert!(round_among(&mut peers, &alive).iter().all(|&m| m));
    }
    for k in 0..d {
        let start = x0.iter().map(|x| f64::from(x[k])).sum::<f64>() / n as f64;
        let end = peers.iter().map(|p| f64::from(p.params()[k])).sum::<f64>() / n as f64;
        assert!((end - start).abs() < 1e-5, "mean[{k}]: {start} → {end}");
        for p in &peers {
            assert!((f64::from(p.params()[k]) - start).abs() < 1e-4);
        }
    }
}

/// CHOCO-Gossip on the 6-ring (top-k 25%, γ = 0.3, d = 40) under the skip policy
/// (Δ = 5 ms): peer 2's messages arrive `delay` rounds late for the first 60 rounds. Every
/// round completes at its skip deadline; once the late messages are in, the network
/// average is the starting one and the peers reach it. Returns the skipped count.
fn choco_skipping_keeps_the_average(delay: u64) -> u64 {
    let (n, d, straggler) = (6, 40, 2);
    let w = ring_mh(n);
    let x0: Vec<Vec<f32>> = (0..n)
        .map(|i| (0..d).map(|k| ((i * 7 + k * 3) % 11) as f32).collect())
        .collect();
    let skip = Duration::from_millis(5);
    let mut peers: Vec<Choco> = (0..n)
        .map(|i| {
            let mut cfg = ChocoConfig::from_matrix(&w, i, 0.0, 0.3, d);
            cfg.skip_after = Some(skip);
            Choco::new(cfg, x0[i].clone(), Box::new(TopK::new(0.25)))
        })
        .collect();
    let mean = |peers: &[Choco], k: usize| {
        peers.iter().map(|p| f64::from(p.params()[k])).sum::<f64>() / n as f64
    };
    let start: Vec<f64> = (0..d)
        .map(|k| x0.iter().map(|x| f64::from(x[k])).sum::<f64>() / n as f64)
        .collect();
    let mut now = Instant::now();
    let mut queue = Vec::new();
    let mut moved = 0.0f64;
    for t in 0..1500u64 {
        let late = if t < 60 { delay } else { 0 };
        skip_round(&mut peers, &mut queue, t, (now, skip), (straggler, late));
        if t < 60 {
            moved = moved.max((mean(&peers, 0) - start[0]).abs());
        }
        now += Duration::from_millis(10);
    }
    assert!(queue.is_empty());
    assert!(
        moved > 1e-3,
        "while messages are late the average moves ({moved}); the make-up brings it back"
    );
    for (k, &s) in start.iter().enumerate() {
        let end = mean(&peers, k);
        assert!((end - s).abs() < 1e-4, "mean[{k}]: {s} → {end}");
        for p in &peers {
            assert!((f64::from(p.params()[k]) - s).abs() < 1e-3);
        }
    }
    peers.iter().map(|p| p.stats().skipped).sum()
}

#[test]
fn choco_skipping_a_straggler_keeps_the_average() {
    // Each of peer 2's 60 late messages is skipped by its two neighbours.
    assert_eq!(choco_skipping_keeps_the_average(3), 120);
    assert_eq!(
        choco_skipping_keeps_the_average(murmur_gossip::SKIP_STALENESS),
        120
    );
}

#[test]
fn choco_waits_for_a_message_later_than_the_staleness_bound() {
    // Path 0 – 1 – 2; peer 1 hears from nobody: rounds 0..8 complete at the skip deadline,
    // round 8 waits for peer 0's and peer 2's messages of round 0.
    let w = path3();
    let skip = Duration::from_millis(5);
    let mut cfg = ChocoConfig::from_matrix(&w, 1, 0.0, 0.5, 4);
    cfg.skip_after = Some(skip);
    cfg.round_timeout = Duration::from_secs(5);
    let mut p = Choco::new(cfg, vec![1.0; 4], Box::new(Identity));
    let mut now = Instant::now();
    for t in 0..=murmur_gossip::SKIP_STALENESS {
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while p.poll_transmit().is_some() {}
        p.handle_timeout(now + skip);
        if t < murmur_gossip::SKIP_STALENESS {
            assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: t }));
            now += Duration::from_millis(10);
        }
    }
    assert_eq!(
        p.poll_event(),
        None,
        "round 8 waits for the messages of round 0"
    );
    p.handle_timeout(now + Duration::from_secs(5));
    assert_eq!(
        p.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 8,
            missing: vec![0, 2]
        })
    );
    // Peer 0's x̂ after round 0 is q = x = [3; 4]: peer 1 takes it into its copy and makes
    // up 8 mixes of γ w_10 q = 0.5 · (1/3) · 3 per coordinate, plus round 8's own mix.
    let before = p.params().to_vec();
    let late = raw_frame(0, 0, 4, &identity_message(&[3.0; 4]));
    p.handle_message(now, 0, &late).unwrap();
    assert_eq!(p.poll_event(), None, "still waiting for peer 2");
    assert!(
        p.handle_message(now, 0, &late).is_err(),
        "a late message counts once"
    );
    let late2 = raw_frame(2, 0, 4, &identity_message(&[0.0; 4]));
    p.handle_message(now, 2, &late2).unwrap();
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 8 }));
    let w10 = w.get(1, 0);
    // make-up 8 · γ w10 · 3, then round 8 mixes γ w10 (x̂_0 − x̂_1) + γ w12 (x̂_2 − x̂_1).
    let x_hat_1 = p.x_hat()[0];
    let w12 = w.get(1, 2);
    let want = f64::from(before[0])
        + 8.0 * 0.5 * w10 * 3.0
        + 0.5 * (w10 * (3.0 - f64::from(x_hat_1)) + w12 * (0.0 - f64::from(x_hat_1)));
    assert!(
        (f64::from(p.params()[0]) - want).abs() < 1e-5,
        "x_1 = {} want {want}",
        p.params()[0]
    );
}
