//! The round protocol ([`murmur_gossip::round::Round`]) is shared by the network simulator
//! and `murmur peer`: the same seeded round sequence driven through `NetSim` and through a
//! peer-style shell (the calls of the node's training loop, `node/src/peer/run.rs`: start,
//! send, compute, computed, send, wait for `Mixed`, finish) ends with the same parameters,
//! bit for bit.

mod common;

use std::collections::VecDeque;
use std::time::Instant;

use murmur_gossip::round::Round;
use murmur_gossip::{
    AlgorithmOptions, Compute, Gossip, GossipEvent, NetSim, NetworkModel, Rank, Transmit,
};

const N: usize = 4;
const D: usize = 37;
const ROUNDS: u64 = 24;
const LR: f32 = 0.05;

/// Peer i's stochastic gradient at x in round t: a quadratic pull towards its own target
/// b_i, plus a deterministic "noise" of round and rank.
fn gradient(rank: Rank, round: u64, x: &[f32]) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(k, &v)| {
            let b = (rank as f32 + 1.0) * ((k % 5) as f32 - 2.0);
            let noise = (((round as usize * 31 + rank * 7 + k) % 11) as f32 - 5.0) * 0.01;
            v - b + noise
        })
        .collect()
}

fn peers(algorithm: &str, options: &AlgorithmOptions) -> Vec<Box<dyn Gossip>> {
    let x0 = common::uniform_vectors(N, D, 1.0, 5);
    common::network(algorithm, &x0, LR, options)
}

/// Drives `peers` the way `murmur peer` does, every peer in turn, frames delivered in the
/// order of their senders (as the ideal network of `NetSim` orders frames of one instant).
fn peer_shell(mut peers: Vec<Box<dyn Gossip>>, overlap: bool) -> Vec<Vec<f32>> {
    let now = Instant::now();
    let mut queue: VecDeque<(Rank, Transmit)> = VecDeque::new();
    let send = |p: &mut dyn Gossip, from: Rank, q: &mut VecDeque<(Rank, Transmit)>| {
        while let Some(t) = p.poll_transmit() {
            q.push_back((from, t));
        }
    };
    for r in 0..ROUNDS {
        let mut rounds = Vec::new();
        let mut grads = Vec::new();
        for (rank, p) in peers.iter_mut().enumerate() {
            let x = p.params().to_vec();
            let protocol = Round::start(&mut **p, now, &x, overlap);
            send(&mut **p, rank, &mut queue);
            grads.push(gradient(rank, protocol.number(), &x));
            rounds.push((protocol, x));
        }
        for (rank, p) in peers.iter_mut().enumerate() {
            let (protocol, x) = &mut rounds[rank];
            // Frames leave if the exchange begins now, or if parts of the next round go
            // ahead of this one (streamed messages).
            protocol.computed(&mut **p, now, x, Some(&grads[rank]), r + 1 < ROUNDS);
            send(&mut **p, rank, &mut queue);
        }
        let mut mixed = vec![false; N];
        while !mixed.iter().all(|&m| m) {
            for (rank, p) in peers.iter_mut().enumerate() {
                while let Some(ev) = p.poll_event() {
                    match ev {
                        GossipEvent::Mixed { .. } => mixed[rank] = true,
                        other => panic!("peer {rank}: {other:?}"),
                    }
                }
            }
            let mut batch: Vec<(Rank, Transmit)> = queue.drain(..).collect();
            batch.sort_by_key(|(from, t)| (t.to, *from));
            if batch.is_empty() && !mixed.iter().all(|&m| m) {
                panic!("stalled: {mixed:?}");
            }
            for (from, t) in batch {
                let p = &mut peers[t.to];
                p.handle_message(now, from, &t.frame).unwrap();
                send(&mut **p, t.to, &mut queue);
            }
        }
        for (rank, p) in peers.iter_mut().enumerate() {
            let (protocol, _) = rounds[rank].clone();
            protocol.finish(&mut **p, Some(&grads[rank]));
        }
    }
    peers.iter().map(|p| p.params().to_vec()).collect()
}

fn netsim(peers: Vec<Box<dyn Gossip>>, overlap: bool) -> Vec<Vec<f32>> {
    let mut sim = NetSim::new(peers, NetworkModel::ideal()).unwrap();
    sim.set_overlap(overlap);
    sim.run_rounds(ROUNDS, |rank, round, x| Compute {
        grad: Some(gradient(rank, round, x)),
        seconds: 0.01,
    })
    .unwrap();
    (0..N)
        .map(|i| sim.peer(i).unwrap().params().to_vec())
        .collect()
}

fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits()))
}

#[test]
fn dpsgd_rounds_through_the_simulator_and_the_peer_shell_agree_bit_for_bit() {
    let o = AlgorithmOptions::default();
    for overlap in [true, false] {
        let a = netsim(peers("dpsgd", &o), overlap);
        let b = peer_shell(peers("dpsgd", &o), overlap);
        assert!(same_bits(&a, &b), "overlap {overlap}");
        // Not a vacuous comparison: the peers moved, and apart from each other.
        let start = common::uniform_vectors(N, D, 1.0, 5);
        assert!(!same_bits(&a, &start));
        assert!(!same_bits(&a[..1], &a[1..2]));
    }
    // The overlap changes the result (x_t is sent, not x_t − η g): the flag reaches both.
    let with = netsim(peers("dpsgd", &o), true);
    let without = peer_shell(peers("dpsgd", &o), false);
    assert!(!same_bits(&with, &without));
}

#[test]
fn streaming_diloco_rounds_through_the_simulator_and_the_peer_shell_agree_bit_for_bit() {
    let o = AlgorithmOptions {
        local_steps: Some(4),
        fragments: Some(2),
        ..Default::default()
    };
    let a = netsim(peers("streaming-diloco", &o), true);
    let b = peer_shell(peers("streaming-diloco", &o), true);
    assert!(same_bits(&a, &b));
    let start = common::uniform_vectors(N, D, 1.0, 5);
    assert!(!same_bits(&a, &start));
}
