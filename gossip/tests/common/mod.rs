//! Helpers shared by the gossip integration tests.
#![allow(dead_code)] // each test file uses a subset

use murmur_gossip::frame::{FrameHeader, FrameKind};
use murmur_gossip::Rank;
use murmur_topology::{Graph, MixingMatrix};

/// Metropolis–Hastings weights on the ring of n peers.
pub fn ring_mh(n: usize) -> MixingMatrix {
    MixingMatrix::metropolis_hastings(&Graph::ring(n).unwrap()).unwrap()
}

/// A gossip frame from `sender` for `round` whose header declares model dimension `dim`,
/// carrying `payload` as is.
pub fn raw_frame(sender: Rank, round: u64, dim: u32, payload: &[u8]) -> Vec<u8> {
    kind_frame(FrameKind::Gossip, sender, round, dim, payload)
}

// ---- Multi-hop drivers (ring all-reduce, parameter server) ---------------------------
//
// `Sim::run_round` delivers each frame that `begin_round` produced once and does not poll
// `poll_transmit` after `handle_message`, so it cannot drive algorithms whose frames cause
// further frames. `Net` delivers until the network is quiet.

use std::time::Instant;

use murmur_gossip::{Gossip, GossipEvent};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// n state machines of one type and the frames in flight between them.
pub struct Net<G: Gossip> {
    /// Peer i has rank i.
    pub peers: Vec<G>,
    /// (from, to, frame), in send order.
    pub in_flight: Vec<(Rank, Rank, Vec<u8>)>,
    /// Events polled so far, per peer, in order.
    pub events: Vec<Vec<GossipEvent>>,
    /// Every accepted delivery: (from, to, frame, the receiver's `round()` before it).
    pub log: Vec<(Rank, Rank, Vec<u8>, u64)>,
    /// `None`: deliver in send order; `Some`: pick a random frame in flight each time.
    rng: Option<StdRng>,
    now: Instant,
}

impl<G: Gossip> Net<G> {
    /// Delivers frames in the order they were sent.
    pub fn fifo(peers: Vec<G>) -> Self {
        Self::with_rng(peers, None)
    }

    /// Delivers a frame chosen uniformly among those in flight, with `seed`: any order,
    /// later steps and rounds before earlier ones included.
    pub fn shuffled(peers: Vec<G>, seed: u64) -> Self {
        Self::with_rng(peers, Some(StdRng::seed_from_u64(seed)))
    }

    fn with_rng(peers: Vec<G>, rng: Option<StdRng>) -> Self {
        let n = peers.len();
        Net {
            peers,
            in_flight: Vec::new(),
            events: vec![Vec::new(); n],
            log: Vec::new(),
            rng,
            now: Instant::now(),
        }
    }

    /// Moves peer i's transmits into flight and its events into `events[i]`; returns the
    /// rounds it completed.
    fn collect(&mut self, i: Rank) -> Vec<u64> {
        while let Some(t) = self.peers[i].poll_transmit() {
            self.in_flight.push((i, t.to, t.frame.to_vec()));
        }
        let mut mixed = Vec::new();
        while let Some(ev) = self.peers[i].poll_event() {
            if let GossipEvent::Mixed { round } = ev {
                mixed.push(round);
            }
            self.events[i].push(ev);
        }
        mixed
    }

    /// Peer i begins its next round from `x: [d]`; returns the rounds it completed at once.
    pub fn begin(&mut self, i: Rank, x: &[f32], grad: Option<&[f32]>) -> Vec<u64> {
        self.peers[i].begin_round(self.now, x, grad);
        self.collect(i)
    }

    /// Delivers one frame (panics if a peer refuses it); returns the receiver and the
    /// rounds it completed, or `None` if nothing is in flight.
    pub fn deliver_one(&mut self) -> Option<(Rank, Vec<u64>)> {
        if self.in_flight.is_empty() {
            return None;
        }
        let k = match &mut self.rng {
            Some(rng) => rng.random_range(0..self.in_flight.len()),
            None => 0,
        };
        let (from, to, frame) = self.in_flight.remove(k);
        let before = self.peers[to].round();
        if let Err(e) = self.peers[to].handle_message(self.now, from, &frame) {
            panic!("peer {to} refused a frame from peer {from}: {e}");
        }
        self.log.push((from, to, frame, before));
        Some((to, self.collect(to)))
    }

    /// Delivers until nothing is in flight.
    pub fn deliver_all(&mut self) {
        while self.deliver_one().is_some() {}
    }

    /// One lock-step round: every peer begins from its own parameters with `grads[i]`
    /// (if given), then frames are delivered until quiet; panics unless every peer
    /// completed the round.
    pub fn round(&mut self, grads: Option<&[Vec<f32>]>) {
        let round = self.peers[0].round();
        for i in 0..self.peers.len() {
            let x = self.peers[i].params().to_vec();
            self.begin(i, &x, grads.map(|g| g[i].as_slice()));
        }
        self.deliver_all();
        for (i, ev) in self.events.iter().enumerate() {
            assert!(
                ev.contains(&GossipEvent::Mixed { round }),
                "peer {i} did not complete round {round}: {ev:?}"
            );
        }
    }

    /// Every peer's parameters.
    pub fn params(&self) -> Vec<Vec<f32>> {
        self.peers.iter().map(|p| p.params().to_vec()).collect()
    }
}

/// n vectors of `d` values drawn uniformly from [−scale, scale) with `seed`.
pub fn uniform_vectors(n: usize, d: usize, scale: f32, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-scale..scale)).collect())
        .collect()
}

/// The coordinate-wise mean of `xs: n × [d]`, computed in f64.
pub fn serial_mean(xs: &[Vec<f32>]) -> Vec<f64> {
    let d = xs.first().map_or(0, Vec::len);
    let mut m = vec![0.0f64; d];
    for x in xs {
        for (a, v) in m.iter_mut().zip(x) {
            *a += *v as f64;
        }
    }
    m.iter_mut().for_each(|a| *a /= xs.len() as f64);
    m
}

/// max_k |a_k − b_k|.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A frame of `kind` from `sender` for `round` with model dimension `dim`, carrying
/// `payload` as is.
pub fn kind_frame(kind: FrameKind, sender: Rank, round: u64, dim: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader {
        kind,
        sender,
        round,
        dim,
        payload_len: payload.len() as u32,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(payload);
    f
}

/// `values` as f32 LE bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One round among the peers in `alive` (no gradient): each begins from its own
/// parameters, and its frames are delivered to the live destinations (frames to dead
/// peers are lost, as to a crashed process). Returns which peers produced `Mixed`.
pub fn round_among<G: Gossip + 'static>(peers: &mut [G], alive: &[bool]) -> Vec<bool> {
    round_among_by(peers, alive, |p| p as &mut dyn Gossip)
}

/// [`round_among`] for peers held in any way (`Box<dyn Gossip>`), `get` giving each's
/// state machine.
pub fn round_among_by<T>(
    peers: &mut [T],
    alive: &[bool],
    get: impl Fn(&mut T) -> &mut dyn Gossip,
) -> Vec<bool> {
    let now = Instant::now();
    let mut in_flight = Vec::new();
    for (i, p) in peers.iter_mut().enumerate().filter(|(i, _)| alive[*i]) {
        let p = get(p);
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while let Some(t) = p.poll_transmit() {
            in_flight.push((i, t.to, t.frame.to_vec()));
        }
    }
    for (from, to, frame) in in_flight {
        if alive[to] {
            get(&mut peers[to])
                .handle_message(now, from, &frame)
                .unwrap();
        }
    }
    peers.iter_mut().map(|p| drain_mixed(get(p))).collect()
}

/// Drains `p`'s events; whether one was `Mixed`.
pub fn drain_mixed<G: Gossip + ?Sized>(p: &mut G) -> bool {
    let mut mixed = false;
    while let Some(ev) = p.poll_event() {
        mixed |= matches!(ev, GossipEvent::Mixed { .. });
    }
    mixed
}

// ---- Lock-step driver with a straggler under the skip policy ----------------------------

/// A frame held back: (the round it is delivered in, from, to, frame).
pub type Delayed = (u64, Rank, Rank, Vec<u8>);

/// Round `t` of a lock-step run under the skip policy: every peer begins round t with its
/// own parameters; the frames of `straggler.0` are delivered `straggler.1` rounds late, the
/// others' in round t; the frames due by round t are handed over; then every peer's skip
/// deadline (`now + skip`) fires. Panics if a frame is refused or a peer did not complete
/// round t.
pub fn skip_round<G: Gossip>(
    peers: &mut [G],
    queue: &mut Vec<Delayed>,
    t: u64,
    (now, skip): (Instant, std::time::Duration),
    (straggler, late): (Rank, u64),
) {
    for (i, p) in peers.iter_mut().enumerate() {
        let x = p.params().to_vec();
        p.begin_round(now, &x, None);
        while let Some(tr) = p.poll_transmit() {
            let at = if i == straggler { t + late } else { t };
            queue.push((at, i, tr.to, tr.frame.to_vec()));
        }
    }
    let (due, rest): (Vec<_>, Vec<_>) = queue.drain(..).partition(|f| f.0 <= t);
    *queue = rest;
    for (_, from, to, frame) in due {
        peers[to]
            .handle_message(now, from, &frame)
            .unwrap_or_else(|e| panic!("round {t}: peer {to} refused peer {from}: {e}"));
    }
    for (i, p) in peers.iter_mut().enumerate() {
        p.handle_timeout(now + skip);
        let mut mixed = false;
        while let Some(ev) = p.poll_event() {
            mixed |= ev == GossipEvent::Mixed { round: t };
        }
        assert!(
            mixed,
            "peer {i} did not complete round {t} after the skip deadline"
        );
    }
}

// ---- Peers built by the registry ------------------------------------------------------

use murmur_gossip::{AlgorithmOptions, AlgorithmSpec, BuildContext, BuildError};
use murmur_topology::{Topology, TopologySpec};

/// The topology `name` (e.g. `ring`, `torus`) on n peers.
pub fn topology(name: &str, n: usize) -> Topology {
    TopologySpec::named(name).unwrap().build(Some(n)).unwrap()
}

/// The ring of n peers.
pub fn ring(n: usize) -> Topology {
    topology("ring", n)
}

/// Peer `rank` of `algorithm` on `topology` as the registry builds it, with seed = rank,
/// a 60 s round timeout and the straggler policy `skip_after`.
pub fn build_with_skip(
    algorithm: &str,
    topology: &Topology,
    rank: usize,
    x0: Vec<f32>,
    lr: f32,
    options: &AlgorithmOptions,
    skip_after: Option<std::time::Duration>,
) -> Result<Box<dyn Gossip>, BuildError> {
    let d = x0.len();
    build_for_tensors(algorithm, topology, rank, x0, lr, options, skip_after, &[d])
}

/// [`build_with_skip`] for a model of the tensors `tensor_lengths` (summing to x0's d).
#[allow(clippy::too_many_arguments)]
pub fn build_for_tensors(
    algorithm: &str,
    topology: &Topology,
    rank: usize,
    x0: Vec<f32>,
    lr: f32,
    options: &AlgorithmOptions,
    skip_after: Option<std::time::Duration>,
    tensor_lengths: &[usize],
) -> Result<Box<dyn Gossip>, BuildError> {
    let spec: AlgorithmSpec = algorithm.parse().unwrap();
    let d = x0.len();
    spec.build(BuildContext {
        rank,
        topology,
        lr,
        x0,
        tensor_lengths,
        max_payload_bytes: u32::try_from(16 * d + 1024).unwrap(),
        round_timeout: std::time::Duration::from_secs(60),
        seed: rank as u64,
        skip_after,
        auto_deadline: None,
        options,
        in_place: false,
        shared_start: true,
    })
}

/// [`build_with_skip`] without the skip policy.
pub fn build(
    algorithm: &str,
    topology: &Topology,
    rank: usize,
    x0: Vec<f32>,
    lr: f32,
    options: &AlgorithmOptions,
) -> Result<Box<dyn Gossip>, BuildError> {
    build_with_skip(algorithm, topology, rank, x0, lr, options, None)
}

/// n peers of `algorithm` on the ring of n, peer i starting from `x0[i]`.
pub fn network(
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

/// Each peer's (x, round, algorithm state), as its checkpoint holds them.
pub type Saved = Vec<(Vec<f32>, u64, murmur_gossip::AlgorithmState)>;

/// What each peer of `sim` would checkpoint now.
pub fn snapshot(sim: &murmur_gossip::sim::Sim) -> Saved {
    (0..sim.n())
        .map(|i| {
            let p = sim.peer(i);
            (p.params().to_vec(), p.round(), p.state())
        })
        .collect()
}

/// The peers of `algorithm` on the ring rebuilt from `saved`, as a resumed run builds them:
/// each from its x, moved to its round, and given its state back when `restore`.
pub fn rebuild(
    algorithm: &str,
    saved: &Saved,
    lr: f32,
    options: &AlgorithmOptions,
    restore: bool,
) -> murmur_gossip::sim::Sim {
    let topo = ring(saved.len());
    let peers = saved
        .iter()
        .enumerate()
        .map(|(i, (x, round, state))| {
            let mut p = build(algorithm, &topo, i, x.clone(), lr, options).unwrap();
            p.start_at_round(*round).unwrap();
            if restore {
                p.restore_state(state).unwrap();
            }
            p
        })
        .collect();
    murmur_gossip::sim::Sim::new(peers)
}
