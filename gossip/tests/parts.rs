//! D-PSGD's message streamed in parts (`murmur_gossip::mixing::streaming`): the same result
//! as whole messages, parts of the next round sent before the round has mixed,
//! and frames of other parts refused.

use std::time::Instant;

use murmur_gossip::frame::{FrameHeader, FrameKind};
use murmur_gossip::{AlgorithmOptions, Gossip, GossipError, GossipEvent, Rank};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::{build, ring, uniform_vectors};

/// `--part-mb` for parts of `len` parameters.
fn part_mb(len: usize) -> AlgorithmOptions {
    AlgorithmOptions {
        part_mb: Some(len as f64 * 4.0 / 1e6),
        ..Default::default()
    }
}

fn whole() -> AlgorithmOptions {
    AlgorithmOptions {
        part_mb: Some(0.0),
        ..Default::default()
    }
}

/// n D-PSGD peers on the ring of n built by the registry with `options`.
fn peers(x0: &[Vec<f32>], lr: f32, options: &AlgorithmOptions) -> Vec<Box<dyn Gossip>> {
    let topo = ring(x0.len());
    (0..x0.len())
        .map(|i| build("dpsgd", &topo, i, x0[i].clone(), lr, options).unwrap())
        .collect()
}

/// The peers of a run and the frames in flight between them, delivered in a random order.
struct Run {
    peers: Vec<Box<dyn Gossip>>,
    in_flight: Vec<(Rank, Rank, Vec<u8>)>,
    /// Rounds each peer has mixed.
    mixed: Vec<Vec<u64>>,
    /// Frames of a round later than the receiver's mixing round, sent before it mixed.
    ahead_frames: usize,
    /// `None`: frames are delivered in the order they were sent.
    rng: Option<StdRng>,
    now: Instant,
}

impl Run {
    fn new(peers: Vec<Box<dyn Gossip>>, seed: Option<u64>) -> Self {
        let n = peers.len();
        Run {
            peers,
            in_flight: Vec::new(),
            mixed: vec![Vec::new(); n],
            ahead_frames: 0,
            rng: seed.map(StdRng::seed_from_u64),
            now: Instant::now(),
        }
    }

    fn collect(&mut self, i: Rank) {
        while let Some(t) = self.peers[i].poll_transmit() {
            let (h, _) = FrameHeader::parse(&t.frame, u32::MAX).unwrap();
            if h.round > self.peers[i].round() {
                self.ahead_frames += 1;
            }
            self.in_flight.push((i, t.to, t.frame.to_vec()));
        }
        while let Some(ev) = self.peers[i].poll_event() {
            match ev {
                GossipEvent::Mixed { round } => self.mixed[i].push(round),
                other => panic!("peer {i}: {other:?}"),
            }
        }
    }

    /// One round with the exchange overlapping the gradient, as `murmur peer` runs it:
    /// every peer begins from its parameters with no gradient; frames move in a random
    /// order; with `stream`, each peer is handed its gradient `grads[i]` after a random
    /// number of deliveries (the next round follows); once every peer has mixed, each
    /// applies its gradient.
    fn round(&mut self, grads: &[Vec<f32>], stream: bool) {
        let n = self.peers.len();
        let round = self.peers[0].round();
        for i in 0..n {
            let x = self.peers[i].params().to_vec();
            self.peers[i].begin_round(self.now, &x, None);
            self.collect(i);
        }
        let mut handed = vec![!stream; n];
        let mut when: Vec<usize> = (0..n).map(|i| (i * 7 + 3 * round as usize) % 40).collect();
        while (0..n).any(|i| !self.mixed[i].contains(&round)) {
            for i in 0..n {
                if !handed[i] && when[i] == 0 {
                    handed[i] = true;
                    self.peers[i].stream_next(self.now, &grads[i]);
                    self.collect(i);
                }
                when[i] = when[i].saturating_sub(1);
            }
            assert!(!self.in_flight.is_empty(), "round {round} stalled");
            let k = match &mut self.rng {
                Some(rng) => rng.random_range(0..self.in_flight.len()),
                None => 0,
            };
            let (from, to, frame) = self.in_flight.remove(k);
            if let Err(e) = self.peers[to].handle_message(self.now, from, &frame) {
                panic!("peer {to} refused a frame from peer {from}: {e}");
            }
            self.collect(to);
        }
        for i in 0..n {
            self.peers[i].apply_gradient(&grads[i]);
            assert_eq!(self.peers[i].round(), round + 1);
        }
    }
}

#[test]
fn d_psgd_in_parts_gives_whole_d_psgd_and_sends_ahead() {
    let (n, d, rounds) = (5, 1003, 12);
    let x0 = uniform_vectors(n, d, 1.0, 7);
    let lr = 0.05;
    // In send order and without going ahead, every coordinate adds its neighbours in the
    // same order as whole messages: the same bits. In any order, the same sums up to the
    // order of their terms.
    for (stream, shuffle) in [(false, false), (false, true), (true, false), (true, true)] {
        let seed = |s: u64| shuffle.then_some(s);
        let mut whole_run = Run::new(peers(&x0, lr, &whole()), seed(1));
        let mut parts_run = Run::new(peers(&x0, lr, &part_mb(100)), seed(2));
        for r in 0..rounds {
            let grads = uniform_vectors(n, d, 1.0, 100 + r);
            whole_run.round(&grads, false);
            parts_run.round(&grads, stream);
            for i in 0..n {
                let (a, b) = (whole_run.peers[i].params(), parts_run.peers[i].params());
                let same = if stream || shuffle {
                    a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-5)
                } else {
                    a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())
                };
                assert!(
                    same,
                    "peer {i}, round {r}, stream {stream}, shuffle {shuffle}: parts differ \
                     from the whole"
                );
            }
        }
        let stats = parts_run.peers[0].stats();
        // 11 parts, 2 neighbours; frames of the next round in flight are counted too.
        assert!(stats.frames_sent >= 11 * 2 * rounds, "{stats:?}");
        if stream {
            assert!(
                parts_run.ahead_frames > 0,
                "no part of a next round left before its round had mixed"
            );
        } else {
            assert_eq!(parts_run.ahead_frames, 0);
        }
    }
}

#[test]
fn a_small_model_or_part_mb_0_sends_whole_messages_and_a_large_one_parts() {
    let kinds = |options: &AlgorithmOptions, d: usize| -> Vec<FrameKind> {
        let x0 = uniform_vectors(3, d, 1.0, 3);
        let mut p = peers(&x0, 0.1, options);
        p[0].begin_round(Instant::now(), &x0[0], None);
        std::iter::from_fn(|| p[0].poll_transmit())
            .map(|t| FrameHeader::parse(&t.frame, u32::MAX).unwrap().0.kind)
            .collect()
    };
    // Fewer than two parts: whole messages.
    assert_eq!(kinds(&part_mb(100), 150), [FrameKind::Gossip; 2]);
    assert_eq!(kinds(&whole(), 1000), [FrameKind::Gossip; 2]);
    // 4 parts (the last of 50) to each of 2 neighbours.
    assert_eq!(kinds(&part_mb(100), 350), [FrameKind::GossipPart; 8]);
}

#[test]
fn frames_of_another_cut_or_whole_messages_are_refused_and_change_nothing() {
    let x0 = uniform_vectors(3, 300, 1.0, 5);
    // Peer 1 cuts into parts of 100 (3 parts), peer 0 into parts of 150 (2 parts).
    let mut mine = peers(&x0, 0.1, &part_mb(100));
    let mut other = peers(&x0, 0.1, &part_mb(150));
    let mut whole_peers = peers(&x0, 0.1, &whole());
    let now = Instant::now();
    mine[1].begin_round(now, &x0[1], None);
    other[0].begin_round(now, &x0[0], None);
    whole_peers[0].begin_round(now, &x0[0], None);
    let before = mine[1].params().to_vec();
    let frame = other[0].poll_transmit().unwrap();
    assert_eq!(frame.to, 1);
    match mine[1].handle_message(now, 0, &frame.frame) {
        Err(GossipError::WrongPart {
            got_parts: 2,
            parts: 3,
            ..
        }) => {}
        r => panic!("a part of a 2-part cut was taken by a 3-part peer: {r:?}"),
    }
    let frame = whole_peers[0].poll_transmit().unwrap();
    assert!(matches!(
        mine[1].handle_message(now, 0, &frame.frame),
        Err(GossipError::WrongKind(FrameKind::Gossip))
    ));
    assert_eq!(mine[1].params(), before.as_slice());
    assert_eq!(mine[1].round(), 0);
    assert!(mine[1].poll_event().is_none());
}

#[test]
fn a_peer_that_leaves_mid_round_is_stood_in_for_in_the_parts_still_missing() {
    let (n, d) = (4, 400);
    let x0 = uniform_vectors(n, d, 1.0, 9);
    let topo = ring(n);
    let mut run = Run::new(peers(&x0, 0.0, &part_mb(100)), Some(3));
    let now = run.now;
    for i in 0..n {
        let x = run.peers[i].params().to_vec();
        run.peers[i].begin_round(now, &x, None);
        run.collect(i);
    }
    // Peer 0 receives two of peer 3's four parts, then peer 3 is gone.
    let mut taken = 0;
    run.in_flight.retain(|(from, to, frame)| {
        if *from == 3 && *to == 0 && taken < 2 {
            taken += 1;
            run.peers[0].handle_message(now, 3, frame).unwrap();
            return false;
        }
        *from != 3
    });
    run.collect(0);
    let w = topo.w.without_peers(&[3]).unwrap().w;
    for i in 0..3 {
        run.peers[i].peer_left(3, &w).unwrap();
        run.collect(i);
    }
    while let Some((from, to, frame)) = run.in_flight.pop() {
        if to != 3 {
            run.peers[to].handle_message(now, from, &frame).unwrap();
            run.collect(to);
        }
    }
    for i in 0..3 {
        assert_eq!(run.mixed[i], [0], "peer {i}");
    }
    // Peer 0's first two parts mixed peer 3's x, the other two stood in with its own.
    let (w03, w00) = (topo.w.get(0, 3) as f32, topo.w.get(0, 0) as f32);
    let (w01, x) = (topo.w.get(0, 1) as f32, run.peers[0].params());
    for k in [0, 150, 250, 399] {
        let other = if k < 200 { x0[3][k] } else { x0[0][k] };
        let want = w00 * x0[0][k] + w01 * x0[1][k] + w03 * other;
        assert!((x[k] - want).abs() < 1e-5, "x[{k}] = {}, want {want}", x[k]);
    }
}
