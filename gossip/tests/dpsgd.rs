//! D-PSGD state machine and simulator tests.

use std::time::{Duration, Instant};

use murmur_compress::Compressor;
use murmur_gossip::sim::Sim;
use murmur_gossip::{DPsgd, DPsgdConfig, Gossip, GossipError, GossipEvent, MembershipError};
use murmur_topology::MixingMatrix;

mod common;
use common::{drain_mixed, raw_frame, ring_mh, round_among};

/// A gossip frame from `sender` for `round` carrying `x` identity-compressed.
fn gossip_frame(sender: usize, round: u64, x: &[f32]) -> Vec<u8> {
    let mut payload = Vec::new();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    murmur_compress::Identity.compress(x, &mut rng, &mut payload);
    raw_frame(sender, round, x.len() as u32, &payload)
}

#[test]
fn a_mixing_step_preserves_the_network_average() {
    let w = ring_mh(8);
    let mut sim = Sim::dpsgd_consensus(&w, 100, 3);
    let before = sim.average();
    let xi0 = sim.consensus_distance();
    sim.run_rounds(1).unwrap();
    let after = sim.average();
    for (a, b) in before.iter().zip(&after) {
        assert!((a - b).abs() < 1e-6, "average moved from {a} to {b}");
    }
    assert!(
        sim.consensus_distance() < xi0,
        "one mixing step must reduce Ξ²"
    );
}

#[test]
fn exact_gossip_on_ring16_contracts_at_lambda2() {
    let w = ring_mh(16);
    let lambda2 = w.second_eigenvalue_modulus();
    // Closed form for the ring with 1/3 weights: λ₁ = (1 + 2cos(2π/16))/3.
    let closed = (1.0 + 2.0 * (2.0 * std::f64::consts::PI / 16.0).cos()) / 3.0;
    assert!((lambda2 - closed).abs() < 1e-9);

    let mut sim = Sim::dpsgd_consensus(&w, 1_000, 7);
    let xi0 = sim.consensus_distance();
    sim.run_rounds(50).unwrap();
    let xi50 = sim.consensus_distance();
    let bound = lambda2.powi(2 * 50);
    assert!(
        xi50 <= 2.0 * bound * xi0,
        "Ξ²(50)/Ξ²(0) = {} > 2·|λ₂|^100 = {}",
        xi50 / xi0,
        2.0 * bound
    );

    // The asymptotic per-round contraction equals |λ₂|² (the slowest mode dominates).
    sim.run_rounds(50).unwrap();
    let xi100 = sim.consensus_distance();
    sim.run_rounds(50).unwrap();
    let xi150 = sim.consensus_distance();
    let rate = (xi150 / xi100).powf(1.0 / 50.0);
    assert!(
        (rate - lambda2 * lambda2).abs() < 0.01,
        "per-round contraction {rate}, expected |λ₂|² = {}",
        lambda2 * lambda2
    );
}

fn two_peer(rank: usize, x0: Vec<f32>, lr: f32) -> DPsgd {
    let w = MixingMatrix::from_dense(vec![vec![0.5, 0.5], vec![0.5, 0.5]]).unwrap();
    DPsgd::new(DPsgdConfig::from_matrix(&w, rank, lr, x0.len()), x0)
}

fn drain(p: &mut DPsgd) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(t) = p.poll_transmit() {
        assert_eq!(t.to, 1 - p.config().rank);
        out.push(t.frame.to_vec());
    }
    out
}

#[test]
fn update_is_mix_minus_lr_times_gradient() {
    let now = Instant::now();
    let mut a = two_peer(0, vec![1.0, 3.0], 0.1);
    let mut b = two_peer(1, vec![5.0, 7.0], 0.1);
    a.begin_round(now, &[1.0, 3.0], Some(&[1.0, 2.0]));
    b.begin_round(now, &[5.0, 7.0], Some(&[0.0, 0.0]));
    let fa = drain(&mut a);
    let fb = drain(&mut b);
    assert_eq!(fa.len(), 1);
    a.handle_message(now, 1, &fb[0]).unwrap();
    b.handle_message(now, 0, &fa[0]).unwrap();
    assert_eq!(a.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(b.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    // x0' = ½(1,3) + ½(5,7) − 0.1·(1,2) = (2.9, 4.8); x1' = (3, 5).
    assert!((a.params()[0] - 2.9).abs() < 1e-6 && (a.params()[1] - 4.8).abs() < 1e-6);
    assert_eq!(b.params(), &[3.0, 5.0]);
    assert_eq!(a.round(), 1);
    assert_eq!(a.stats().frames_sent, 1);
    assert_eq!(a.stats().bytes_sent, fa[0].len() as u64);
}

#[test]
fn a_neighbour_one_round_ahead_is_buffered() {
    let now = Instant::now();
    let mut a = two_peer(0, vec![0.0], 0.0);
    let mut b = two_peer(1, vec![4.0], 0.0);
    a.begin_round(now, &[0.0], None);
    b.begin_round(now, &[4.0], None);
    let fa0 = drain(&mut a);
    let fb0 = drain(&mut b);
    b.handle_message(now, 0, &fa0[0]).unwrap();
    // b finished round 0 and starts round 1 before a has heard from it.
    assert!(matches!(
        b.poll_event(),
        Some(GossipEvent::Mixed { round: 0 })
    ));
    let xb = b.params().to_vec();
    b.begin_round(now, &xb, None);
    let fb1 = drain(&mut b);
    a.handle_message(now, 1, &fb1[0]).unwrap(); // round 1 while a mixes round 0: buffered
    assert_eq!(a.poll_event(), None);
    a.handle_message(now, 1, &fb0[0]).unwrap();
    assert_eq!(a.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(a.params(), &[2.0]);
    let xa = a.params().to_vec();
    a.begin_round(now, &xa, None); // absorbs the buffered frame at once
    assert_eq!(a.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    assert_eq!(a.params(), &[2.0]);
}

#[test]
fn bad_frames_are_refused_and_change_nothing() {
    let now = Instant::now();
    let mut a = two_peer(0, vec![1.0, 1.0], 0.0);
    let mut b = two_peer(1, vec![3.0, 3.0], 0.0);
    a.begin_round(now, &[1.0, 1.0], None);
    b.begin_round(now, &[3.0, 3.0], None);
    let _ = drain(&mut a);
    let good = drain(&mut b).remove(0);

    let mut wrong_sender = good.clone();
    wrong_sender[4] = 7;
    assert!(matches!(
        a.handle_message(now, 1, &wrong_sender),
        Err(GossipError::SenderMismatch {
            from: 1,
            claimed: 7
        })
    ));
    assert!(matches!(
        a.handle_message(now, 0, &good),
        Err(GossipError::SenderMismatch { .. })
    ));

    assert!(matches!(
        a.handle_message(now, 1, &gossip_frame(1, 5, &[1.0, 1.0])),
        Err(GossipError::RoundOutOfWindow {
            round: 5,
            lo: 0,
            hi: 1,
            ..
        })
    ));
    assert!(matches!(
        a.handle_message(now, 1, &gossip_frame(1, 0, &[1.0, 1.0, 1.0])),
        Err(GossipError::DimensionMismatch {
            expected: 2,
            got: 3,
            ..
        })
    ));
    assert!(matches!(
        a.handle_message(now, 1, &gossip_frame(1, 0, &[1.0, f32::NAN])),
        Err(GossipError::Payload { from: 1, .. })
    ));
    assert!(matches!(
        a.handle_message(now, 1, &gossip_frame(1, 1, &[f32::INFINITY, 1.0])),
        Err(GossipError::Payload { from: 1, .. })
    ));
    assert!(matches!(
        a.handle_message(now, 1, &good[..30]),
        Err(GossipError::Frame(_))
    ));
    assert_eq!(
        a.poll_event(),
        None,
        "no refused frame may complete the round"
    );

    a.handle_message(now, 1, &good).unwrap();
    assert_eq!(a.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(
        a.params(),
        &[2.0, 2.0],
        "refused frames must not have touched the model"
    );
    assert!(matches!(
        a.handle_message(now, 1, &good),
        Err(GossipError::RoundOutOfWindow { .. })
    ));
}

#[test]
fn frames_from_a_non_neighbour_are_refused() {
    let w = ring_mh(6);
    let now = Instant::now();
    let mut p = DPsgd::new(DPsgdConfig::from_matrix(&w, 0, 0.0, 1), vec![0.0]);
    p.begin_round(now, &[0.0], None);
    let f = raw_frame(3, 0, 1, &[]);
    assert_eq!(
        p.handle_message(now, 3, &f),
        Err(GossipError::NotANeighbour(3))
    );
}

#[test]
fn a_missing_neighbour_times_the_round_out_once() {
    let w = ring_mh(6);
    let t0 = Instant::now();
    let mut cfg = DPsgdConfig::from_matrix(&w, 0, 0.0, 1);
    cfg.round_timeout = Duration::from_secs(5);
    let mut p = DPsgd::new(cfg, vec![0.0]);
    p.begin_round(t0, &[0.0], None);
    assert_eq!(p.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    p.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(
        p.poll_event(),
        None,
        "a call before the deadline is a no-op"
    );
    p.handle_timeout(t0 + Duration::from_secs(5));
    assert_eq!(
        p.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 0,
            missing: vec![1, 5]
        })
    );
    p.handle_timeout(t0 + Duration::from_secs(6));
    assert_eq!(p.poll_event(), None);
}

/// On a directed graph an in-neighbour can run several rounds ahead: on the 3-cycle
/// 0 → 1 → 2 → 0, peer 2 (which sends to 0) is two hops downstream of 0 and can be two
/// rounds ahead of it. Those frames must be buffered, not refused.
#[test]
fn on_a_directed_cycle_frames_two_rounds_ahead_are_buffered() {
    let w = MixingMatrix::from_dense(vec![
        vec![0.5, 0.0, 0.5],
        vec![0.5, 0.5, 0.0],
        vec![0.0, 0.5, 0.5],
    ])
    .unwrap();
    let now = Instant::now();
    let cfg = DPsgdConfig::from_matrix(&w, 0, 0.0, 1);
    assert_eq!(cfg.max_lead_rounds, 2);
    assert_eq!(
        DPsgdConfig::from_matrix(&ring_mh(5), 0, 0.0, 1).max_lead_rounds,
        1
    );
    let mut p0 = DPsgd::new(cfg, vec![0.0]);
    let frame_from_2 = |round: u64, v: f32| gossip_frame(2, round, &[v]);
    p0.begin_round(now, &[0.0], None);
    p0.handle_message(now, 2, &frame_from_2(2, 8.0)).unwrap();
    p0.handle_message(now, 2, &frame_from_2(1, 4.0)).unwrap();
    assert!(matches!(
        p0.handle_message(now, 2, &frame_from_2(3, 0.0)),
        Err(GossipError::RoundOutOfWindow {
            round: 3,
            lo: 0,
            hi: 2,
            ..
        })
    ));
    assert!(matches!(
        p0.handle_message(now, 2, &frame_from_2(1, 4.0)),
        Err(GossipError::Duplicate { round: 1, .. })
    ));
    assert_eq!(p0.poll_event(), None);
    p0.handle_message(now, 2, &frame_from_2(0, 2.0)).unwrap();
    assert_eq!(p0.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(p0.params(), &[1.0]); // ½·0 + ½·2
    p0.begin_round(now, &[1.0], None);
    assert_eq!(p0.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    assert_eq!(p0.params(), &[2.5]); // ½·1 + ½·4
    p0.begin_round(now, &[2.5], None);
    assert_eq!(p0.poll_event(), Some(GossipEvent::Mixed { round: 2 }));
    assert_eq!(p0.params(), &[5.25]); // ½·2.5 + ½·8
}

#[test]
fn set_epoch_reaches_the_compressor_schedule() {
    // DGC's warm-up keeps 25% in epoch 0 and the final 1% from epoch 4 on: the frame of
    // a 10,000-parameter model shrinks accordingly once the epoch is passed on.
    let w = MixingMatrix::from_dense(vec![vec![0.5, 0.5], vec![0.5, 0.5]]).unwrap();
    let d = 10_000;
    let x: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
    let dgc = murmur_compress::Dgc::new(murmur_compress::DgcConfig {
        ratio: 0.01,
        approximate: false,
        ..Default::default()
    });
    let mut p = DPsgd::with_compressor(
        DPsgdConfig::from_matrix(&w, 0, 0.1, d),
        x.clone(),
        Box::new(dgc),
    );
    let mut sizes = Vec::new();
    for epoch in [0, 4] {
        p.set_epoch(epoch);
        p.begin_round(Instant::now(), &x, Some(&x));
        sizes.push(drain(&mut p)[0].len());
        // Complete the round with the neighbour's frame so that the next one can begin.
        p.handle_message(Instant::now(), 1, &gossip_frame(1, p.round(), &x))
            .unwrap();
        while p.poll_event().is_some() {}
    }
    // Frame: 24 + 12 + 8 bytes of headers, then k indices (1-byte varint deltas at these
    // densities or u16) and k values.
    assert!(sizes[0] > 2_500 * 4, "epoch 0 keeps 2,500: {sizes:?}");
    assert!(sizes[1] < 100 * 7 + 44, "epoch 4 keeps 100: {sizes:?}");
}

#[test]
fn survivors_of_a_departure_finish_the_round_and_reach_their_own_average() {
    let n = 6;
    let w = ring_mh(n);
    let mut peers: Vec<DPsgd> = (0..n)
        .map(|i| {
            let mut cfg = DPsgdConfig::from_matrix(&w, i, 0.1, 2);
            cfg.round_timeout = Duration::from_secs(3600);
            DPsgd::new(cfg, vec![i as f32, (i * i) as f32])
        })
        .collect();
    let mut alive = vec![true; n];
    assert!(round_among(&mut peers, &alive).iter().all(|&m| m));

    // Peer 4 dies before round 1: its neighbours 3 and 5 wait for it.
    alive[4] = false;
    let before: Vec<Vec<f32>> = peers.iter().map(|p| p.params().to_vec()).collect();
    let mixed = round_among(&mut peers, &alive);
    assert_eq!(mixed, vec![true, true, true, false, false, false]);
    let survivors = w.without_peers(&[4]).unwrap();
    for i in (0..n).filter(|&i| alive[i]) {
        peers[i].peer_left(4, &survivors.w).unwrap();
    }
    assert!(drain_mixed(&mut peers[3]) && drain_mixed(&mut peers[5]));
    // Peer 3 mixed its own x in place of peer 4's: (x₂ + x₃ + x₃)/3.
    let expect = (before[2][0] + 2.0 * before[3][0]) / 3.0;
    assert!((peers[3].params()[0] - expect).abs() < 1e-6);
    // Frames from the departed peer are refused.
    let frame = gossip_frame(4, 2, &[0.0, 0.0]);
    assert_eq!(
        peers[3].handle_message(Instant::now(), 4, &frame),
        Err(GossipError::Departed(4))
    );

    // From round 2 on the survivors' W' is doubly stochastic: their average is kept and
    // they reach it.
    let mean = |ps: &[DPsgd], alive: &[bool]| -> Vec<f64> {
        let live: Vec<&DPsgd> = ps
            .iter()
            .enumerate()
            .filter(|(i, _)| alive[*i])
            .map(|(_, p)| p)
            .collect();
        (0..2)
            .map(|k| live.iter().map(|p| p.params()[k] as f64).sum::<f64>() / live.len() as f64)
            .collect()
    };
    let m2 = mean(&peers, &alive);
    for _ in 0..200 {
        assert!(round_among(&mut peers, &alive)
            .iter()
            .zip(&alive)
            .all(|(&m, &a)| m == a));
    }
    let m = mean(&peers, &alive);
    for k in 0..2 {
        assert!(
            (m[k] - m2[k]).abs() < 1e-4,
            "average moved: {m:?} vs {m2:?}"
        );
        for i in (0..n).filter(|&i| alive[i]) {
            assert!(
                (peers[i].params()[k] as f64 - m2[k]).abs() < 1e-3,
                "peer {i} at {} instead of {}",
                peers[i].params()[k],
                m2[k]
            );
        }
    }
    // A matrix that still weighs the departed peer is refused.
    assert!(peers[3].peer_left(4, &w).is_err());

    // Peer 4 returns at the survivors' next round, starting from its neighbours' mean.
    let at = peers[0].round();
    assert!(peers
        .iter()
        .enumerate()
        .all(|(i, p)| !alive[i] || p.round() == at));
    let x4: Vec<f32> = (0..2)
        .map(|k| (peers[3].params()[k] + peers[5].params()[k]) / 2.0)
        .collect();
    let mut back = DPsgd::new(
        {
            let mut cfg = DPsgdConfig::from_matrix(&w, 4, 0.1, 2);
            cfg.round_timeout = Duration::from_secs(3600);
            cfg
        },
        x4,
    );
    back.start_at_round(at).unwrap();
    assert_eq!(back.round(), at);
    peers[4] = back;
    alive[4] = true;
    // Too late for a neighbour that is past the round: refused, not silently mis-mixed.
    assert_eq!(
        peers[3].peer_rejoined(4, &w, at - 1),
        Err(MembershipError::TooLate {
            at: at - 1,
            round: at
        })
    );
    for i in [0, 1, 2, 3, 5] {
        peers[i].peer_rejoined(4, &w, at).unwrap();
    }
    // Everyone, peer 4 included, mixes with the full W again and reaches one value.
    let received = peers[3].stats().frames_received;
    for _ in 0..200 {
        assert!(round_among(&mut peers, &alive).iter().all(|&m| m));
    }
    let m = mean(&peers, &alive);
    for p in &peers {
        for (v, mk) in p.params().iter().zip(&m) {
            assert!((*v as f64 - mk).abs() < 1e-3);
        }
    }
    // Peer 3 hears from both neighbours again, peer 4 included: 2 frames a round.
    assert_eq!(peers[3].stats().frames_received - received, 400);
}

/// D-PSGD peers on the MH ring of `n`, x_i = (i, i²), with the skip policy after 10 ms.
fn skipping_ring(n: usize) -> Vec<DPsgd> {
    let w = ring_mh(n);
    (0..n)
        .map(|i| {
            let mut cfg = DPsgdConfig::from_matrix(&w, i, 0.1, 2);
            cfg.round_timeout = Duration::from_secs(3600);
            cfg.skip_after = Some(Duration::from_millis(10));
            DPsgd::new(cfg, vec![i as f32, (i * i) as f32])
        })
        .collect()
}

/// Σ_i x_i, per coordinate.
fn total(peers: &[DPsgd]) -> Vec<f64> {
    (0..2)
        .map(|k| peers.iter().map(|p| p.params()[k] as f64).sum())
        .collect()
}

/// Begins peer `i`'s round from its own parameters; returns its frames as (from, to, frame).
fn begin(p: &mut DPsgd, i: usize, now: Instant) -> Vec<(usize, usize, Vec<u8>)> {
    let x = p.params().to_vec();
    p.begin_round(now, &x, None);
    frames_of(p, i)
}

fn frames_of(p: &mut DPsgd, i: usize) -> Vec<(usize, usize, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(t) = p.poll_transmit() {
        out.push((i, t.to, t.frame.to_vec()));
    }
    out
}

/// One round of every peer with every frame delivered; each must mix.
fn full_round(peers: &mut [DPsgd], now: Instant) {
    let mut frames = Vec::new();
    for (i, p) in peers.iter_mut().enumerate() {
        frames.extend(begin(p, i, now));
    }
    for (from, to, f) in frames {
        peers[to].handle_message(now, from, &f).unwrap();
    }
    assert!(peers.iter_mut().all(drain_mixed));
}

#[test]
fn a_skipped_straggler_mixes_without_its_skippers_and_the_average_is_kept() {
    let mut peers = skipping_ring(4);
    let before = total(&peers);
    let t0 = Instant::now();
    // Peer 2 is late for round 0: 0, 1 and 3 begin and exchange; frames to 2 wait there.
    let mut frames = Vec::new();
    for i in [0, 1, 3] {
        frames.extend(begin(&mut peers[i], i, t0));
    }
    for (from, to, f) in frames {
        peers[to].handle_message(t0, from, &f).unwrap();
    }
    assert!(drain_mixed(&mut peers[0]), "peer 0 has all its neighbours");
    // Peers 1 and 3 wait for 2 until the deadline, then mix without it and tell it.
    let later = t0 + Duration::from_millis(20);
    let mut notices = Vec::new();
    for i in [1, 3] {
        assert!(peers[i].poll_timeout().unwrap() <= later);
        peers[i].handle_timeout(later);
        assert!(drain_mixed(&mut peers[i]));
        notices.extend(frames_of(&mut peers[i], i));
    }
    assert_eq!(notices.len(), 2);
    for (from, to, f) in notices {
        assert_eq!(to, 2);
        peers[2].handle_message(later, from, &f).unwrap();
    }
    // Peer 2 begins round 0 at last: both its neighbours dropped it, so it mixes alone.
    let x2 = peers[2].params().to_vec();
    let late = begin(&mut peers[2], 2, later);
    assert!(drain_mixed(&mut peers[2]));
    for (a, b) in peers[2].params().iter().zip(&x2) {
        assert!((a - b).abs() < 1e-5, "peer 2 mixed only itself: {a} vs {b}");
    }
    // Its frames of round 0 arrive late and are dropped, not refused as bad.
    for (from, to, f) in late {
        assert!(matches!(
            peers[to].handle_message(later, from, &f),
            Err(GossipError::Skipped { from: 2, round: 0 })
        ));
    }
    // W of round 0 was doubly stochastic: the network's sum is what it was.
    let after = total(&peers);
    for k in 0..2 {
        assert!(
            (after[k] - before[k]).abs() < 1e-5,
            "{after:?} vs {before:?}"
        );
    }
    assert_eq!(peers[1].stats().skipped, 1);
    assert_eq!(peers[2].stats().skipped, 2);
    // The next round runs as usual.
    full_round(&mut peers, later);
}

#[test]
fn a_straggler_that_already_mixed_the_skippers_frame_corrects_afterwards() {
    let mut peers = skipping_ring(4);
    let before = total(&peers);
    let t0 = Instant::now();
    // Round 0: every frame arrives except peer 2's to peer 1.
    let mut frames = Vec::new();
    for (i, p) in peers.iter_mut().enumerate() {
        frames.extend(begin(p, i, t0));
    }
    let mut delayed = None;
    for (from, to, f) in frames {
        if (from, to) == (2, 1) {
            delayed = Some(f);
        } else {
            peers[to].handle_message(t0, from, &f).unwrap();
        }
    }
    assert!(
        drain_mixed(&mut peers[2]),
        "peer 2 got both frames and mixed"
    );
    // Peer 1 gives up on peer 2 and tells it; peer 2 has mixed peer 1's x already.
    let later = t0 + Duration::from_millis(20);
    peers[1].handle_timeout(later);
    assert!(drain_mixed(&mut peers[1]));
    for (from, to, f) in frames_of(&mut peers[1], 1) {
        peers[to].handle_message(later, from, &f).unwrap();
    }
    assert!(matches!(
        peers[1].handle_message(later, 2, &delayed.unwrap()),
        Err(GossipError::Skipped { from: 2, round: 0 })
    ));
    // Peer 2 takes peer 1's contribution back when round 1 begins: after round 1 the
    // network's sum is what it was.
    full_round(&mut peers, later);
    let after = total(&peers);
    for k in 0..2 {
        assert!(
            (after[k] - before[k]).abs() < 1e-5,
            "{after:?} vs {before:?}"
        );
    }
}

/// The parameters after each step of a run with a straggler skipped (stand-in and
/// correction), a gradient round, and a departure in the middle of a round, on a ring of
/// 5 with the skip policy; `in_place` as [`DPsgdConfig::in_place`].
fn trajectory(in_place: bool) -> Vec<Vec<Vec<f32>>> {
    let n = 5;
    let w = ring_mh(n);
    let mut peers: Vec<DPsgd> = (0..n)
        .map(|i| {
            let mut cfg = DPsgdConfig::from_matrix(&w, i, 0.1, 3);
            cfg.round_timeout = Duration::from_secs(3600);
            cfg.skip_after = Some(Duration::from_millis(10));
            cfg.in_place = in_place;
            DPsgd::new(cfg, vec![i as f32, (i * i) as f32, 1.0 / (1 + i) as f32])
        })
        .collect();
    let snapshot = |ps: &[DPsgd]| ps.iter().map(|p| p.params().to_vec()).collect::<Vec<_>>();
    let mut seen = Vec::new();
    let t0 = Instant::now();
    // Round 0: peer 2's frame to peer 1 is late; peer 1 stands in for it, peer 2 corrects.
    let mut frames = Vec::new();
    for (i, p) in peers.iter_mut().enumerate() {
        frames.extend(begin(p, i, t0));
    }
    let mut delayed = None;
    for (from, to, f) in frames {
        if (from, to) == (2, 1) {
            delayed = Some(f);
        } else {
            peers[to].handle_message(t0, from, &f).unwrap();
        }
    }
    let later = t0 + Duration::from_millis(20);
    peers[1].handle_timeout(later);
    assert!(drain_mixed(&mut peers[1]));
    for (from, to, f) in frames_of(&mut peers[1], 1) {
        peers[to].handle_message(later, from, &f).unwrap();
    }
    let _ = peers[1].handle_message(later, 2, &delayed.unwrap());
    for p in peers.iter_mut() {
        drain_mixed(p);
    }
    seen.push(snapshot(&peers));
    full_round(&mut peers, later);
    seen.push(snapshot(&peers));
    // A round with gradients.
    let mut frames = Vec::new();
    for (i, p) in peers.iter_mut().enumerate() {
        let x = p.params().to_vec();
        let g: Vec<f32> = x.iter().map(|v| 0.5 * v - i as f32).collect();
        p.begin_round(later, &x, Some(&g));
        frames.extend(frames_of(p, i));
    }
    for (from, to, f) in frames {
        peers[to].handle_message(later, from, &f).unwrap();
    }
    assert!(peers.iter_mut().all(drain_mixed));
    seen.push(snapshot(&peers));
    // Peer 4 is gone during the next round: 3 and 0 stand in for it when told.
    let mut alive = vec![true; n];
    alive[4] = false;
    round_among(&mut peers, &alive);
    let survivors = w.without_peers(&[4]).unwrap();
    for p in &mut peers[..4] {
        p.peer_left(4, &survivors.w).unwrap();
        drain_mixed(p);
    }
    seen.push(snapshot(&peers[..4]));
    round_among(&mut peers, &alive);
    seen.push(snapshot(&peers[..4]));
    seen
}

#[test]
fn mixing_in_place_gives_the_same_parameters_bit_for_bit() {
    let apart = trajectory(false);
    let in_place = trajectory(true);
    assert_eq!(apart.len(), 5);
    for (step, (a, b)) in apart.iter().zip(&in_place).enumerate() {
        for (i, (xa, xb)) in a.iter().zip(b).enumerate() {
            let (ba, bb): (Vec<u32>, Vec<u32>) = (
                xa.iter().map(|v| v.to_bits()).collect(),
                xb.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(
                ba, bb,
                "step {step}, peer {i}: {xa:?} apart, {xb:?} in place"
            );
        }
    }
    // The run did move the parameters (the comparison is not between two copies of x⁰).
    assert_ne!(apart[0][0], apart[4][0]);
}
