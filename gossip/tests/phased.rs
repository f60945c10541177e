//! Phase schedule tests: the switch happens at the configured round, frames of the next
//! phase that arrive early are kept, and the counters add up over the phases.

use std::time::Instant;

use murmur_gossip::sim::Sim;
use murmur_gossip::{DPsgd, DPsgdConfig, Gossip, GossipEvent, Phase, Phased};
use murmur_topology::{Graph, MixingMatrix};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::ring_mh;

fn complete(n: usize) -> MixingMatrix {
    MixingMatrix::metropolis_hastings(&Graph::complete(n).unwrap()).unwrap()
}

/// `first` (named `names.0`) for `rounds` rounds, then `second` (`names.1`).
fn two_phases(
    names: (&str, &str),
    first: Box<dyn Gossip>,
    rounds: u64,
    second: Box<dyn Gossip>,
) -> Phased {
    Phased::new(vec![
        Phase {
            name: names.0.into(),
            gossip: first,
            rounds: Some(rounds),
        },
        Phase {
            name: names.1.into(),
            gossip: second,
            rounds: None,
        },
    ])
}

/// Peer i: D-PSGD with η = 0 on `w`, from `x0`.
fn dpsgd(w: &MixingMatrix, i: usize, x0: &[f32]) -> Box<dyn Gossip> {
    Box::new(DPsgd::new(
        DPsgdConfig::from_matrix(w, i, 0.0, x0.len()),
        x0.to_vec(),
    ))
}

/// Peer i: D-PSGD on `first` for `rounds` rounds, then D-PSGD on `second`.
fn phased(
    first: &MixingMatrix,
    second: &MixingMatrix,
    rounds: u64,
    i: usize,
    x0: &[f32],
) -> Phased {
    two_phases(
        ("ring", "complete"),
        dpsgd(first, i, x0),
        rounds,
        dpsgd(second, i, x0),
    )
}

fn start(n: usize, d: usize) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(5);
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect()
}

#[test]
fn the_second_phase_starts_at_its_round() {
    let (n, d) = (8, 30);
    let (ring, full) = (ring_mh(n), complete(n));
    let xs = start(n, d);
    let peers = (0..n)
        .map(|i| Box::new(phased(&ring, &full, 3, i, &xs[i])) as Box<dyn Gossip>)
        .collect();
    let mut sim = Sim::new(peers);
    let mut ring_only = Sim::new((0..n).map(|i| dpsgd(&ring, i, &xs[i])).collect());
    let avg = sim.average();
    for _ in 0..3 {
        sim.run_round(None).unwrap();
        ring_only.run_round(None).unwrap();
        // Phase 1 is exactly ring gossip.
        assert_eq!(sim.consensus_distance(), ring_only.consensus_distance());
    }
    assert!(sim.consensus_distance() > 1e-2);
    // Round 3 is the first of the complete graph with uniform weights: exact average.
    sim.run_round(None).unwrap();
    assert!(
        sim.consensus_distance() < 1e-10,
        "Ξ² = {}",
        sim.consensus_distance()
    );
    for (a, b) in sim.average().iter().zip(&avg) {
        assert!((a - b).abs() < 1e-5);
    }
    // Ring frames: 2 per round for 3 rounds; complete: 7 per round.
    assert_eq!(sim.peer(0).stats().frames_sent, 3 * 2 + 7);
    assert_eq!(sim.peer(0).round(), 4);
    assert_eq!(sim.peer(0).out_peers(), (1..n).collect::<Vec<_>>());
}

#[test]
fn frames_of_the_next_phase_that_arrive_early_are_kept() {
    let (n, d) = (4, 5);
    let (ring, full) = (ring_mh(n), complete(n));
    let xs = start(n, d);
    let mut peers: Vec<Phased> = (0..n).map(|i| phased(&ring, &full, 1, i, &xs[i])).collect();
    let now = Instant::now();
    // Round 0 (ring) for everyone.
    let mut frames = Vec::new();
    for (i, p) in peers.iter_mut().enumerate() {
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while let Some(t) = p.poll_transmit() {
            frames.push((i, t.to, t.frame.to_vec()));
        }
    }
    for (from, to, f) in frames.drain(..) {
        peers[to].handle_message(now, from, &f).unwrap();
    }
    for p in &mut peers {
        assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    }
    // Peers 1..n begin round 1 (complete graph) before peer 0 does: peer 0, still idle in
    // the ring phase, gets a frame from peer 2, which is not its ring neighbour.
    for (i, p) in peers.iter_mut().enumerate().skip(1) {
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while let Some(t) = p.poll_transmit() {
            frames.push((i, t.to, t.frame.to_vec()));
        }
    }
    for (from, to, f) in frames.drain(..) {
        peers[to].handle_message(now, from, &f).unwrap();
    }
    let x = peers[0].params().to_vec();
    peers[0].begin_round(now, &x, None);
    while let Some(t) = peers[0].poll_transmit() {
        frames.push((0, t.to, t.frame.to_vec()));
    }
    for (from, to, f) in frames.drain(..) {
        peers[to].handle_message(now, from, &f).unwrap();
    }
    let xs: Vec<&[f32]> = peers
        .iter_mut()
        .map(|p| {
            assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
            p.params()
        })
        .collect();
    let (xi2, _) = murmur_gossip::consensus_distance(xs.iter().copied());
    assert!(
        xi2 < 1e-10,
        "the complete-graph round must average exactly, Ξ² = {xi2}"
    );
    assert_eq!(peers[0].dropped_frames(), 0);
}

#[test]
fn a_link_measured_in_an_earlier_phase_reaches_a_later_per_link_phase() {
    use murmur_gossip::{ChocoAuto, ChocoAutoConfig};
    let (n, d) = (4, 64);
    let ring = ring_mh(n);
    let xs = start(n, d);
    let mut peers: Vec<Phased> = (0..n)
        .map(|i| {
            let choco = ChocoAuto::new(
                ChocoAutoConfig::from_matrix(&ring, i, 0.0, 0.5).unwrap(),
                xs[i].clone(),
            );
            two_phases(
                ("dpsgd", "choco-auto"),
                dpsgd(&ring, i, &xs[i]),
                2,
                Box::new(choco),
            )
        })
        .collect();
    // During the D-PSGD phase, peer 0 times a 4 MiB frame from peer 1: 100 MB/s.
    peers[0].observe_link(1, 4 << 20, (4 << 20) as f64 / 1e8);
    assert!(peers[0].link_choices().is_empty(), "D-PSGD chooses nothing");
    let mut sim = Sim::new(
        peers
            .into_iter()
            .map(|p| Box::new(p) as Box<dyn Gossip>)
            .collect(),
    );
    sim.run_rounds(3).unwrap();
    // In the CHOCO phase peer 0 reports what it measured; peer 1 now knows its link to 0.
    let to_0 = sim
        .peer(1)
        .link_choices()
        .into_iter()
        .find(|c| c.peer == 0)
        .expect("peer 1's link to peer 0");
    let rate = to_0
        .bytes_per_sec
        .expect("the rate peer 0 measured in phase 1");
    assert!((rate - 1e8).abs() < 1.0, "{rate}");
    let to_2 = sim.peer(1).link_choices().into_iter().find(|c| c.peer == 2);
    assert_eq!(to_2.and_then(|c| c.bytes_per_sec), None, "never measured");
}

/// All-reduce for one round, then D-PSGD on a ring: a neighbour already in the D-PSGD phase
/// sends its whole x, larger than any all-reduce chunk this peer accepts; the frame is
/// kept for the D-PSGD phase, not refused as too large (that stalled the phase switch of
/// `launch --phases allreduce:1,dpsgd` about one run in ten: the frame was dropped and
/// the round waited for it until its timeout).
#[test]
fn a_frame_of_the_next_phase_too_large_for_this_one_is_kept() {
    use murmur_gossip::{AllReduce, AllReduceConfig};
    let (n, d) = (4, 16);
    let ring = ring_mh(n);
    let xs = start(n, d);
    let mut peers: Vec<Phased> = (0..n)
        .map(|i| {
            let allreduce = AllReduce::new(AllReduceConfig::new(i, n, 0.0, d), xs[i].clone());
            two_phases(
                ("allreduce", "dpsgd"),
                Box::new(allreduce),
                1,
                dpsgd(&ring, i, &xs[i]),
            )
        })
        .collect();
    let now = Instant::now();
    // The all-reduce round, to the end, for every peer but 0's own switch.
    let mut queue = Vec::new();
    for (i, p) in peers.iter_mut().enumerate() {
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while let Some(t) = p.poll_transmit() {
            queue.push((i, t.to, t.frame.to_vec()));
        }
    }
    while let Some((from, to, f)) = queue.pop() {
        peers[to].handle_message(now, from, &f).unwrap();
        while let Some(t) = peers[to].poll_transmit() {
            queue.push((to, t.to, t.frame.to_vec()));
        }
    }
    for p in &mut peers {
        assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    }
    // Peer 1 begins the D-PSGD round; peer 0 is still idle after the all-reduce.
    let x = peers[1].params().to_vec();
    peers[1].begin_round(now, &x, None);
    let mut to_0 = None;
    while let Some(t) = peers[1].poll_transmit() {
        if t.to == 0 {
            to_0 = Some(t.frame.to_vec());
        }
    }
    let to_0 = to_0.expect("peer 1 sends to its ring neighbour 0");
    peers[0]
        .handle_message(now, 1, &to_0)
        .expect("kept for the D-PSGD phase");
    // Peer 0 switches: the kept frame counts in its D-PSGD round.
    let x = peers[0].params().to_vec();
    peers[0].begin_round(now, &x, None);
    assert_eq!(peers[0].dropped_frames(), 0);
    let x3 = peers[3].params().to_vec();
    peers[3].begin_round(now, &x3, None);
    while let Some(t) = peers[3].poll_transmit() {
        if t.to == 0 {
            peers[0].handle_message(now, 3, &t.frame).unwrap();
        }
    }
    assert_eq!(peers[0].poll_event(), Some(GossipEvent::Mixed { round: 1 }));
}
