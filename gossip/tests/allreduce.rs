//! Ring all-reduce state machine tests.

use std::time::{Duration, Instant};

use murmur_gossip::frame::FrameKind;
use murmur_gossip::{
    chunk_range, AllReduce, AllReduceConfig, Gossip, GossipError, GossipEvent, GossipStats, Rank,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::{f32_bytes, kind_frame, max_abs_diff, serial_mean, uniform_vectors, Net};

fn ring(n: usize, lr: f32, x0: &[f32]) -> Vec<AllReduce> {
    (0..n)
        .map(|i| AllReduce::new(AllReduceConfig::new(i, n, lr, x0.len()), x0.to_vec()))
        .collect()
}

/// Sizes that cover d < n, d = n, d not divisible by n and a larger vector.
fn dims(n: usize) -> Vec<usize> {
    vec![1, n - 1, n, n + 1, 2 * n + 3, 1000]
}

#[test]
fn averaging_equals_the_serial_mean_for_every_n_and_d() {
    for n in 2..=9 {
        for d in dims(n) {
            let xs = uniform_vectors(n, d, 3.0, (n * 1000 + d) as u64);
            let mut net = Net::fifo(ring(n, 0.0, &vec![0.0; d]));
            for (i, x) in xs.iter().enumerate() {
                net.begin(i, x, None);
            }
            net.deliver_all();
            let mean = serial_mean(&xs);
            let scale = xs.iter().flatten().fold(0.0f32, |m, v| m.max(v.abs()));
            for (i, p) in net.peers.iter().enumerate() {
                assert_eq!(p.round(), 1, "n = {n}, d = {d}, peer {i}");
                let worst = p
                    .params()
                    .iter()
                    .zip(&mean)
                    .map(|(a, b)| (*a as f64 - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst <= 1e-6 * scale as f64,
                    "n = {n}, d = {d}, peer {i}: max |x − mean| = {worst:e}"
                );
                assert_eq!(
                    p.params(),
                    net.peers[0].params(),
                    "peers must agree bit for bit (n = {n}, d = {d})"
                );
            }
        }
    }
}

#[test]
fn gradient_step_uses_the_serial_mean_gradient_for_every_n_and_d() {
    let lr = 0.5;
    for n in 2..=9 {
        for d in dims(n) {
            let x0 = uniform_vectors(1, d, 1.0, 99).remove(0);
            let grads = uniform_vectors(n, d, 2.0, (n * 31 + d) as u64);
            let mut net = Net::fifo(ring(n, lr, &x0));
            net.round(Some(&grads));
            let mean = serial_mean(&grads);
            let expected: Vec<f32> = x0
                .iter()
                .zip(&mean)
                .map(|(x, g)| (*x as f64 - lr as f64 * g) as f32)
                .collect();
            for (i, p) in net.peers.iter().enumerate() {
                let diff = max_abs_diff(p.params(), &expected);
                // 1e-6 of the gradients' scale times η, plus the rounding of x itself.
                assert!(
                    diff <= 1e-6 * 2.0 * lr + 1e-7,
                    "n = {n}, d = {d}, peer {i}: max diff {diff:e}"
                );
                assert_eq!(p.params(), net.peers[0].params(), "n = {n}, d = {d}");
            }
        }
    }
}

#[test]
fn traffic_is_two_n_minus_one_chunks_per_peer() {
    let (n, d) = (4, 10); // chunks of 3, 3, 2, 2
    let mut net = Net::fifo(ring(n, 0.1, &vec![0.0; d]));
    net.round(Some(&uniform_vectors(n, d, 1.0, 1)));
    for (i, p) in net.peers.iter().enumerate() {
        let s = p.stats();
        assert_eq!(s.frames_sent, 2 * (n as u64 - 1), "peer {i}");
        assert_eq!(s.frames_received, 2 * (n as u64 - 1), "peer {i}");
        // 6 frames of 24 header + 4 step bytes, each carrying a chunk of 2 or 3 values.
        assert!(s.bytes_sent >= 6 * 28 + 4 * 2 * 6 && s.bytes_sent <= 6 * 28 + 4 * 3 * 6);
    }
    let total: u64 = net.peers.iter().map(|p| p.stats().bytes_sent).sum();
    // Every chunk travels 2(n − 1) hops: 2·3·(4·10) value bytes + 24 frames × 28 bytes.
    assert_eq!(total, 2 * 3 * 40 + 24 * 28);
    assert_eq!(
        chunk_range(3, n, d),
        8..10,
        "the first d mod n chunks are longer"
    );
}

#[test]
fn a_single_peer_completes_at_once_without_frames() {
    let mut p = AllReduce::new(AllReduceConfig::new(0, 1, 0.5, 2), vec![1.0, 2.0]);
    p.begin_round(Instant::now(), &[1.0, 2.0], Some(&[2.0, -4.0]));
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(p.poll_transmit(), None);
    assert_eq!(p.poll_timeout(), None);
    assert_eq!(p.params(), &[0.0, 4.0]);
    p.begin_round(Instant::now(), &[3.0, 5.0], None);
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    assert_eq!(p.params(), &[3.0, 5.0]);
    assert!(p.out_peers().is_empty() && p.in_peers().is_empty());
}

#[test]
fn neighbours_are_the_ring_successor_and_predecessor() {
    let peers = ring(5, 0.0, &[0.0]);
    assert_eq!(peers[0].out_peers(), vec![1]);
    assert_eq!(peers[0].in_peers(), vec![4]);
    assert_eq!(peers[4].out_peers(), vec![0]);
    assert_eq!(peers[4].in_peers(), vec![3]);
    let two = ring(2, 0.0, &[0.0]);
    assert_eq!((two[1].out_peers(), two[1].in_peers()), (vec![0], vec![0]));
}

/// Gradient of peer i in round t, identical in every run.
fn grad(i: usize, t: u64, d: usize) -> Vec<f32> {
    uniform_vectors(1, d, 1.0, 7919 * t + i as u64).remove(0)
}

/// Runs `rounds` rounds of `n` peers where every peer begins its next round as soon as
/// it finished the last, the order of actions and deliveries drawn from `seed` (`None`:
/// lock-step, in send order). Returns every peer's parameters after each round.
/// Odd rounds average `x + grad(i, t)`, even rounds take a gradient step. Also returns how
/// many frames arrived for a round the receiver had not begun yet, and how many arrived
/// with a lower step than the one before them on the same link and round.
fn run(n: usize, d: usize, rounds: u64, seed: Option<u64>) -> (Vec<Vec<Vec<f32>>>, usize, usize) {
    let x0 = uniform_vectors(1, d, 1.0, 5).remove(0);
    let peers = ring(n, 0.25, &x0);
    let mut net = match seed {
        Some(s) => Net::shuffled(peers, s),
        None => Net::fifo(peers),
    };
    let mut rng = StdRng::seed_from_u64(seed.unwrap_or(0));
    let mut history = vec![Vec::new(); n];
    let mut mixing = vec![false; n];
    let begin = |net: &mut Net<AllReduce>, i: usize, mixing: &mut [bool]| {
        let t = net.peers[i].round();
        let g = grad(i, t, d);
        mixing[i] = true;
        if t % 2 == 1 {
            let x: Vec<f32> = net.peers[i]
                .params()
                .iter()
                .zip(&g)
                .map(|(a, b)| a + b)
                .collect();
            net.begin(i, &x, None)
        } else {
            let x = net.peers[i].params().to_vec();
            net.begin(i, &x, Some(&g))
        }
    };
    loop {
        let idle: Vec<usize> = (0..n)
            .filter(|&i| !mixing[i] && net.peers[i].round() < rounds)
            .collect();
        if idle.is_empty() && net.in_flight.is_empty() {
            break;
        }
        // In shuffled runs, start idle peers at random moments.
        let start = !idle.is_empty()
            && (net.in_flight.is_empty() || (seed.is_some() && rng.random_bool(0.3)));
        let (who, done) = if start {
            let i = if seed.is_some() {
                idle[rng.random_range(0..idle.len())]
            } else {
                idle[0]
            };
            (i, begin(&mut net, i, &mut mixing))
        } else {
            net.deliver_one().unwrap()
        };
        for t in done {
            assert_eq!(t as usize, history[who].len());
            history[who].push(net.peers[who].params().to_vec());
            mixing[who] = false;
        }
    }
    for (i, h) in history.iter().enumerate() {
        assert_eq!(h.len() as u64, rounds, "peer {i} finished every round");
    }
    let header_round = |f: &[u8]| u64::from_le_bytes(f[8..16].try_into().unwrap());
    let step = |f: &[u8]| u32::from_le_bytes(f[24..28].try_into().unwrap());
    let next_round = net
        .log
        .iter()
        .filter(|(_, _, f, before)| header_round(f) > *before)
        .count();
    let mut last = vec![(u64::MAX, 0u32); n];
    let mut reordered = 0;
    for (_, to, f, _) in &net.log {
        let key = (header_round(f), step(f));
        if last[*to].0 == key.0 && key.1 < last[*to].1 {
            reordered += 1;
        }
        last[*to] = key;
    }
    (history, next_round, reordered)
}

#[test]
fn shuffled_and_early_deliveries_give_bitwise_the_same_result() {
    for (n, d) in [(2, 5), (3, 7), (5, 3), (6, 100), (9, 40)] {
        let (reference, _, _) = run(n, d, 6, None);
        // The reference itself: all peers agree after each round.
        for t in 0..6 {
            for h in &reference {
                assert_eq!(h[t], reference[0][t], "n = {n}, d = {d}, round {t}");
            }
        }
        let (mut early, mut reordered) = (0, 0);
        for seed in 1..=5 {
            let (history, e, r) = run(n, d, 6, Some(seed));
            assert_eq!(history, reference, "n = {n}, d = {d}, seed {seed}");
            early += e;
            reordered += r;
        }
        // The schedules did exercise the buffer.
        assert!(
            early > 0,
            "n = {n}: no frame for a later round arrived early"
        );
        if n > 2 {
            assert!(reordered > 0, "n = {n}: no step overtook an earlier one");
        }
    }
}

/// Delivers the first frame in flight from `from` to `to`; returns the rounds `to` completed.
fn deliver(net: &mut Net<AllReduce>, from: Rank, to: Rank) -> Vec<u64> {
    let k = net
        .in_flight
        .iter()
        .position(|f| (f.0, f.1) == (from, to))
        .expect("a frame in flight");
    let f = net.in_flight.remove(k);
    net.in_flight.insert(0, f);
    let (_, done) = net.deliver_one().unwrap();
    done
}

#[test]
fn frames_for_the_next_round_are_buffered_while_mixing() {
    // n = 2, d = 3 (chunks 0..2 and 2..3): peer 1 finishes round 0 and begins round 1
    // before peer 0 has received peer 1's last step of round 0.
    let now = Instant::now();
    let mut net = Net::fifo(ring(2, 0.0, &[0.0, 0.0, 0.0]));
    net.begin(0, &[0.0, 0.0, 0.0], None);
    net.begin(1, &[6.0, 6.0, 6.0], None);
    assert!(deliver(&mut net, 0, 1).is_empty()); // reduce-scatter
    assert!(deliver(&mut net, 1, 0).is_empty());
    assert_eq!(deliver(&mut net, 0, 1), vec![0]); // all-gather: peer 1 is done
    assert_eq!(net.peers[1].params(), &[3.0, 3.0, 3.0]);
    net.begin(1, &[1.0, 1.0, 1.0], None);
    // In flight towards peer 0: peer 1's step 1 of round 0, then step 0 of round 1.
    let frames: Vec<_> = net.in_flight.drain(..).collect();
    assert_eq!(frames.len(), 2);
    assert!(frames.iter().all(|f| (f.0, f.1) == (1, 0)));
    let p0 = &mut net.peers[0];
    p0.handle_message(now, 1, &frames[1].2).unwrap(); // round 1 while mixing round 0
    assert_eq!(p0.poll_event(), None);
    assert!(matches!(
        p0.handle_message(now, 1, &frames[1].2),
        Err(GossipError::Duplicate { round: 1, .. })
    ));
    p0.handle_message(now, 1, &frames[0].2).unwrap();
    assert_eq!(p0.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(p0.params(), &[3.0, 3.0, 3.0]);
    while p0.poll_transmit().is_some() {}
    // Beginning round 1 absorbs the buffered step 0 at once and sends steps 0 and 1.
    p0.begin_round(now, &[5.0, 5.0, 5.0], None);
    assert!(p0.poll_transmit().is_some());
    let last = p0.poll_transmit().expect("the all-gather step 1");
    assert_eq!(p0.poll_transmit(), None);
    assert_eq!(p0.poll_event(), None);
    // The all-gather step 1 carries the complete sum of chunk 1: 5 + 1.
    assert_eq!(
        last.frame[24..],
        [1u32.to_le_bytes(), 6.0f32.to_le_bytes()].concat()[..]
    );
}

/// State visible from outside, compared before and after a refused frame.
fn snapshot(p: &AllReduce) -> (Vec<f32>, GossipStats, u64, Option<Instant>) {
    (p.params().to_vec(), p.stats(), p.round(), p.poll_timeout())
}

#[test]
fn refused_frames_change_nothing() {
    // n = 3, d = 7: chunks 0..3, 3..5, 5..7. Peer 1 receives from peer 0: step 0 carries
    // chunk 0 (3 values), step 1 chunk 2 (2 values), step 2 chunk 1, step 3 chunk 0.
    let now = Instant::now();
    let (n, d) = (3, 7);
    let mut net = Net::fifo(ring(n, 0.0, &vec![0.0; d]));
    let xs = uniform_vectors(n, d, 1.0, 11);
    for (i, x) in xs.iter().enumerate() {
        net.begin(i, x, None);
    }
    let step0 = net
        .in_flight
        .iter()
        .find(|f| f.0 == 0)
        .map(|f| f.2.clone())
        .unwrap();
    let chunk0 = &xs[0][0..3];
    let reduce = |step: u32, values: &[f32]| {
        let mut payload = step.to_le_bytes().to_vec();
        payload.extend(f32_bytes(values));
        payload
    };
    assert_eq!(step0[24..], reduce(0, chunk0)[..], "payload layout");

    let p1 = &mut net.peers[1];
    let before = snapshot(p1);
    let cases: Vec<(&str, Rank, Vec<u8>)> = vec![
        (
            "wrong kind",
            0,
            kind_frame(FrameKind::Gossip, 0, 0, d as u32, &reduce(0, chunk0)),
        ),
        (
            "push kind",
            0,
            kind_frame(FrameKind::Push, 0, 0, d as u32, &reduce(0, chunk0)),
        ),
        (
            "non-neighbour",
            2,
            kind_frame(FrameKind::Reduce, 2, 0, d as u32, &reduce(0, chunk0)),
        ),
        (
            "sender mismatch",
            0,
            kind_frame(FrameKind::Reduce, 2, 0, d as u32, &reduce(0, chunk0)),
        ),
        (
            "bad step",
            0,
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &reduce(4, chunk0)),
        ),
        (
            "no step",
            0,
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &[1, 0]),
        ),
        (
            "truncated chunk",
            0,
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &reduce(0, &chunk0[..2])),
        ),
        (
            "oversized chunk (over the limit)",
            0,
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &reduce(0, &[0.0; 4])),
        ),
        (
            "oversized chunk (within the limit)",
            0,
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &reduce(1, &[0.0; 3])),
        ),
        (
            "NaN",
            0,
            kind_frame(
                FrameKind::Reduce,
                0,
                0,
                d as u32,
                &reduce(0, &[1.0, f32::NAN, 0.0]),
            ),
        ),
        (
            "infinity in a later step",
            0,
            kind_frame(
                FrameKind::Reduce,
                0,
                0,
                d as u32,
                &reduce(1, &[f32::INFINITY, 0.0]),
            ),
        ),
        (
            "dimension",
            0,
            kind_frame(FrameKind::Reduce, 0, 0, 8, &reduce(0, chunk0)),
        ),
        (
            "round too far ahead",
            0,
            kind_frame(FrameKind::Reduce, 0, 2, d as u32, &reduce(0, chunk0)),
        ),
        ("truncated frame", 0, step0[..30].to_vec()),
    ];
    for (what, from, frame) in &cases {
        let err = p1.handle_message(now, *from, frame).unwrap_err();
        let ok = match *what {
            "wrong kind" | "push kind" => matches!(err, GossipError::WrongKind(_)),
            "non-neighbour" => err == GossipError::NotANeighbour(2),
            "sender mismatch" => matches!(err, GossipError::SenderMismatch { .. }),
            "dimension" => matches!(err, GossipError::DimensionMismatch { got: 8, .. }),
            "round too far ahead" => matches!(
                err,
                GossipError::RoundOutOfWindow {
                    round: 2,
                    lo: 0,
                    hi: 1,
                    ..
                }
            ),
            "oversized chunk (over the limit)" | "truncated frame" => {
                matches!(err, GossipError::Frame(_))
            }
            _ => matches!(err, GossipError::Payload { from: 0, .. }),
        };
        assert!(ok, "{what}: unexpected {err:?}");
        assert_eq!(snapshot(p1), before, "{what} changed the state");
        assert_eq!(p1.poll_event(), None, "{what}");
    }
    // The real step 0 is accepted once; the copy is a duplicate and changes nothing.
    p1.handle_message(now, 0, &step0).unwrap();
    let after_one = snapshot(p1);
    assert_eq!(
        p1.handle_message(now, 0, &step0),
        Err(GossipError::Duplicate { from: 0, round: 0 })
    );
    assert_eq!(snapshot(p1), after_one);
    // A later step buffered early is a duplicate too when it comes again.
    let step3 = kind_frame(FrameKind::Reduce, 0, 0, d as u32, &reduce(3, &[0.0; 3]));
    p1.handle_message(now, 0, &step3).unwrap();
    let buffered = snapshot(p1);
    assert!(matches!(
        p1.handle_message(now, 0, &step3),
        Err(GossipError::Duplicate { .. })
    ));
    assert_eq!(snapshot(p1), buffered);
}

#[test]
fn after_refusals_the_round_still_computes_the_exact_mean() {
    // Every peer is offered garbage before each real frame; the result is unaffected.
    let now = Instant::now();
    let (n, d) = (4, 9);
    let xs = uniform_vectors(n, d, 1.0, 21);
    let mut clean = Net::fifo(ring(n, 0.0, &vec![0.0; d]));
    let mut dirty = Net::fifo(ring(n, 0.0, &vec![0.0; d]));
    for (i, x) in xs.iter().enumerate() {
        clean.begin(i, x, None);
        dirty.begin(i, x, None);
    }
    clean.deliver_all();
    while let Some((from, to, frame)) = dirty.in_flight.first().cloned() {
        let mut nan = frame.clone();
        let len = nan.len();
        if len >= 32 {
            nan[len - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
            assert!(dirty.peers[to].handle_message(now, from, &nan).is_err());
        }
        let mut short = frame.clone();
        short.truncate(len.saturating_sub(4));
        assert!(dirty.peers[to].handle_message(now, from, &short).is_err());
        dirty.deliver_one().unwrap();
    }
    assert_eq!(dirty.params(), clean.params());
}

#[test]
fn a_missing_predecessor_times_the_round_out_once() {
    let t0 = Instant::now();
    let mut cfg = AllReduceConfig::new(2, 4, 0.1, 8);
    cfg.round_timeout = Duration::from_secs(3);
    let mut p = AllReduce::new(cfg, vec![0.0; 8]);
    p.begin_round(t0, &[0.0; 8], None);
    assert_eq!(p.poll_timeout(), Some(t0 + Duration::from_secs(3)));
    p.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(p.poll_event(), None);
    p.handle_timeout(t0 + Duration::from_secs(3));
    assert_eq!(
        p.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 0,
            missing: vec![1]
        })
    );
    p.handle_timeout(t0 + Duration::from_secs(9));
    assert_eq!(p.poll_event(), None);
    assert_eq!(p.poll_timeout(), None);
}

// ---- Compressed rounds -----------------------------------------------------------------

fn compressed_ring(n: usize, d: usize, compressor: &str) -> Vec<AllReduce> {
    let spec: murmur_compress::CompressorSpec = compressor.parse().unwrap();
    (0..n)
        .map(|i| {
            AllReduce::compressed(
                AllReduceConfig::new(i, n, 0.0, d),
                vec![0.0; d],
                spec.build(None).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_compressed_ring_with_the_identity_sums_bit_for_bit_like_the_raw_ring() {
    // The identity decodes to exactly what was sent: the same sums in the same order, a
    // zero residual, and d < n (empty chunks, no message) works.
    for n in 2..=6 {
        for d in dims(n) {
            let xs = uniform_vectors(n, d, 3.0, (n * 77 + d) as u64);
            let mut raw = Net::shuffled(ring(n, 0.0, &vec![0.0; d]), 3);
            let mut ident = Net::shuffled(compressed_ring(n, d, "identity"), 4);
            for (i, x) in xs.iter().enumerate() {
                raw.begin(i, x, None);
                ident.begin(i, x, None);
            }
            raw.deliver_all();
            ident.deliver_all();
            assert_eq!(raw.params(), ident.params(), "n = {n}, d = {d}");
            for p in &ident.peers {
                assert!(p.compresses_round(0));
                assert!(p.residual().unwrap().iter().all(|e| *e == 0.0));
            }
        }
    }
}

#[test]
fn a_compressed_ring_ends_bitwise_identical_and_its_residuals_hold_what_was_not_sent() {
    // Top-k 10% over 10 rounds: every peer ends each round with the same mean, and
    // n Σ_t mean_t + Σ_i e_i = Σ_t Σ_i v_i,t.
    let (n, d, rounds) = (5, 97, 10u64);
    let mut net = Net::shuffled(compressed_ring(n, d, "topk:0.1"), 11);
    let mut sent = vec![0.0f64; d];
    let mut total = vec![0.0f64; d];
    for t in 0..rounds {
        let vs = uniform_vectors(n, d, 1.0, 500 + t);
        for (i, v) in vs.iter().enumerate() {
            net.begin(i, v, None);
            for (s, x) in total.iter_mut().zip(v) {
                *s += f64::from(*x);
            }
        }
        net.deliver_all();
        let xs = net.params();
        for (i, x) in xs.iter().enumerate() {
            assert_eq!(x, &xs[0], "round {t}, peer {i}");
        }
        for (s, x) in sent.iter_mut().zip(&xs[0]) {
            *s += n as f64 * f64::from(*x);
        }
    }
    let mut lost = 0.0f64;
    let mut residual = 0.0f64;
    for k in 0..d {
        let e: f64 = net
            .peers
            .iter()
            .map(|p| f64::from(p.residual().unwrap()[k]))
            .sum();
        lost = lost.max((sent[k] + e - total[k]).abs());
        residual = residual.max(e.abs());
    }
    assert!(lost < 1e-4, "error feedback lost {lost}");
    assert!(residual > 0.1, "top-k 10% leaves a residual: {residual}");
    // Raw rounds before the compressed ones: set_compressed_from(1) makes round 0 raw.
    let mut peers = compressed_ring(n, d, "topk:0.1");
    for p in &mut peers {
        p.set_compressed_from(1);
        assert!(!p.compresses_round(0) && p.compresses_round(1));
    }
    let mut net = Net::fifo(peers);
    let mut raw = Net::fifo(ring(n, 0.0, &vec![0.0; d]));
    let vs = uniform_vectors(n, d, 1.0, 9);
    for (i, v) in vs.iter().enumerate() {
        net.begin(i, v, None);
        raw.begin(i, v, None);
    }
    net.deliver_all();
    raw.deliver_all();
    assert_eq!(net.params(), raw.params(), "round 0 is raw");
    assert_eq!(net.peers[0].stats(), raw.peers[0].stats(), "raw frames");
}

// ---- Gathered rounds (SparseLoCo's all-gather) --------------------------------------------

fn gathered_ring(n: usize, d: usize, compressor: &str, decay: f32) -> Vec<AllReduce> {
    let spec: murmur_compress::CompressorSpec = compressor.parse().unwrap();
    (0..n)
        .map(|i| {
            AllReduce::gathered(
                AllReduceConfig::new(i, n, 0.0, d),
                vec![0.0; d],
                spec.build(None).unwrap(),
                decay,
            )
        })
        .collect()
}

/// C(p) decoded, with a fresh operator of `compressor` (these operators draw no randomness).
fn compress_decode(compressor: &str, p: &[f32]) -> Vec<f32> {
    let spec: murmur_compress::CompressorSpec = compressor.parse().unwrap();
    let mut c = spec.build(None).unwrap();
    let mut msg = Vec::new();
    c.compress(p, &mut StdRng::seed_from_u64(0), &mut msg);
    let mut out = vec![0.0; p.len()];
    murmur_compress::decode_into(&msg, &mut out).unwrap();
    out
}

#[test]
fn a_gathered_ring_averages_every_peer_s_own_message_bitwise_alike_in_n_minus_1_steps() {
    // Each round: p_i = v_i + β e_i, e_i ← p_i − C(p_i), and every peer ends with
    // (1/n) Σ_r C(p_r) summed in rank order, after n − 1 frames of one whole message each.
    let compressor = "sparseloco:0.1,chunk=32";
    for n in [2usize, 3, 5] {
        let d = 301;
        let decay = 0.5f32;
        let mut net = Net::shuffled(gathered_ring(n, d, compressor, decay), n as u64);
        let mut e = vec![vec![0.0f32; d]; n];
        for t in 0..4u64 {
            let vs = uniform_vectors(n, d, 1.0, 700 + t);
            let before: Vec<GossipStats> = net.peers.iter().map(|p| p.stats()).collect();
            for (i, v) in vs.iter().enumerate() {
                net.begin(i, v, None);
            }
            net.deliver_all();
            // By hand, in f32 and in the ring's order.
            let mut sum = vec![0.0f32; d];
            for i in 0..n {
                let p: Vec<f32> = vs[i]
                    .iter()
                    .zip(&e[i])
                    .map(|(v, e)| v + decay * e)
                    .collect();
                let c = compress_decode(compressor, &p);
                for ((e, p), c) in e[i].iter_mut().zip(&p).zip(&c) {
                    *e = p - c;
                }
                for (s, c) in sum.iter_mut().zip(&c) {
                    *s += c;
                }
            }
            let mean: Vec<f32> = sum.iter().map(|s| s / n as f32).collect();
            for (i, p) in net.peers.iter().enumerate() {
                let what = format!("n = {n}, round {t}, peer {i}");
                assert!(p.gathers_round(t), "{what}");
                assert_eq!(p.params(), &mean[..], "{what}: the mean");
                assert_eq!(p.residual().unwrap(), &e[i][..], "{what}: the residual");
                let sent = p.stats().frames_sent - before[i].frames_sent;
                assert_eq!(sent, n as u64 - 1, "{what}: frames");
            }
            // Sparse supports add up: the mean has more non-zeros than one message.
            let nnz = |v: &[f32]| v.iter().filter(|x| **x != 0.0).count();
            let one = nnz(&compress_decode(compressor, &vs[0]));
            assert!(
                nnz(&mean) > one,
                "n = {n}: union of supports {} > {one}",
                nnz(&mean)
            );
        }
    }
    // A lone peer: its own vector, no frame.
    let mut p = gathered_ring(1, 5, compressor, 0.95).remove(0);
    p.begin_round(Instant::now(), &[1.0, 2.0, 3.0, 4.0, 5.0], None);
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(p.params(), &[1.0, 2.0, 3.0, 4.0, 5.0]);
    assert!(p.poll_transmit().is_none());
}

#[test]
fn a_gathered_frame_out_of_place_is_refused_and_changes_nothing() {
    let (n, d) = (3, 64);
    let compressor = "sparseloco:0.1,chunk=16";
    let mut net = Net::fifo(gathered_ring(n, d, compressor, 0.95));
    let xs = uniform_vectors(n, d, 1.0, 5);
    for (i, x) in xs.iter().enumerate() {
        net.begin(i, x, None);
    }
    let step0 = net
        .in_flight
        .iter()
        .find(|f| f.0 == 0)
        .map(|f| f.2.clone())
        .unwrap();
    let msg = step0[28..].to_vec();
    let payload = |step: u32, msg: &[u8]| {
        let mut p = step.to_le_bytes().to_vec();
        p.extend_from_slice(msg);
        p
    };
    // A message of another dimension.
    let mut short = Vec::new();
    let spec: murmur_compress::CompressorSpec = compressor.parse().unwrap();
    spec.build(None)
        .unwrap()
        .compress(&[1.0; 16], &mut StdRng::seed_from_u64(0), &mut short);
    let p1 = &mut net.peers[1];
    let before = snapshot(p1);
    for (what, frame) in [
        (
            "step n − 1 (a reduced ring's step)",
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &payload(2, &msg)),
        ),
        (
            "a message of dimension 16",
            kind_frame(FrameKind::Reduce, 0, 0, d as u32, &payload(0, &short)),
        ),
        (
            "a truncated message",
            kind_frame(
                FrameKind::Reduce,
                0,
                0,
                d as u32,
                &payload(0, &msg[..msg.len() - 3]),
            ),
        ),
    ] {
        let r = p1.handle_message(Instant::now(), 0, &frame);
        assert!(
            matches!(r, Err(GossipError::Payload { .. })),
            "{what}: {r:?}"
        );
        assert_eq!(snapshot(p1), before, "{what}");
    }
    // The real frames still complete the round.
    net.deliver_all();
    let xs = net.params();
    assert!(xs.iter().all(|x| x == &xs[0]));
}
