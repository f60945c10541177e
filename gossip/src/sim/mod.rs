//! A deterministic in-process driver for n [`Gossip`] state machines: the test harness
//! of the algorithms (quinn-proto's `Pair`, for n peers).
//!
//! Rounds are synchronous and every frame is delivered, in the order it was sent, before
//! the round ends (including frames that handling a frame causes, as in ring all-reduce);
//! the clock advances by a fixed step per round. Latency, bandwidth, drops and stragglers
//! are modelled by [`netsim::NetSim`], which drives the same state machines on a
//! simulated network to predict wall-clock time; [`byzantine`] wraps a peer's state machine
//! as an attacker for robustness experiments.

pub mod byzantine;
pub mod netsim;

use std::time::{Duration, Instant};

use murmur_topology::MixingMatrix;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use murmur_compress::Compressor;

use crate::{
    consensus_distance, Bytes, Choco, ChocoConfig, DPsgd, DPsgdConfig, Gossip, GossipError,
    GossipEvent, Rank,
};

/// n vectors of `d` values drawn uniformly from [−1, 1) with `seed`, peer 0's first.
fn uniform_start(n: usize, d: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect()
}

/// Why a simulated round failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A peer refused a frame.
    #[error("peer {to} refused a frame from peer {from}: {cause}")]
    Refused {
        /// Sender.
        from: Rank,
        /// Receiver.
        to: Rank,
        /// Why.
        cause: GossipError,
    },
    /// A peer did not complete the round although every frame was delivered.
    #[error("peer {0} did not complete round {1}")]
    Stuck(Rank, u64),
    /// A peer reported [`GossipEvent::Diverged`].
    #[error("peer {0} diverged in round {1}: {2}")]
    Diverged(Rank, u64, String),
}

/// n peers driven in lock-step on a simulated clock.
pub struct Sim {
    peers: Vec<Box<dyn Gossip>>,
    now: Instant,
    step: Duration,
}

impl Sim {
    /// Drives the given peers; peer i of the vector has rank i.
    pub fn new(peers: Vec<Box<dyn Gossip>>) -> Self {
        Sim {
            peers,
            now: Instant::now(),
            step: Duration::from_millis(1),
        }
    }

    /// Pure D-PSGD gossip (zero gradient) on mixing matrix `w` (n×n), every peer starting
    /// from its own vector of `d` values drawn uniformly from [−1, 1) with `seed`.
    pub fn dpsgd_consensus(w: &MixingMatrix, d: usize, seed: u64) -> Self {
        let peers = uniform_start(w.n(), d, seed)
            .into_iter()
            .enumerate()
            .map(|(i, x0)| {
                Box::new(DPsgd::new(DPsgdConfig::from_matrix(w, i, 0.0, d), x0)) as Box<dyn Gossip>
            })
            .collect();
        Sim::new(peers)
    }

    /// CHOCO-Gossip (CHOCO-SGD with zero gradient) on mixing matrix `w` (n×n) with
    /// consensus step size `gamma`, peer i compressing with `compressor(i)` (seeded with
    /// its rank). Every peer starts from the same vector as in
    /// [`Sim::dpsgd_consensus`] with the same `d` and `seed`, and x̂ = 0.
    pub fn choco_consensus(
        w: &MixingMatrix,
        d: usize,
        mut compressor: impl FnMut(Rank) -> Box<dyn Compressor>,
        gamma: f32,
        seed: u64,
    ) -> Self {
        let peers = uniform_start(w.n(), d, seed)
            .into_iter()
            .enumerate()
            .map(|(i, x0)| {
                let cfg = ChocoConfig::from_matrix(w, i, 0.0, gamma, d);
                Box::new(Choco::new(cfg, x0, compressor(i))) as Box<dyn Gossip>
            })
            .collect();
        Sim::new(peers)
    }

    /// Number of peers n.
    pub fn n(&self) -> usize {
        self.peers.len()
    }

    /// Peer i's state machine.
    pub fn peer(&self, i: Rank) -> &dyn Gossip {
        self.peers[i].as_ref()
    }

    /// Runs one round. `grads`, if given, holds one gradient `[d]` per peer.
    pub fn run_round(&mut self, grads: Option<&[Vec<f32>]>) -> Result<(), SimError> {
        let round = self.peers.first().map_or(0, |p| p.round());
        let mut in_flight: Vec<(Rank, Rank, Bytes)> = Vec::new();
        for (i, p) in self.peers.iter_mut().enumerate() {
            let x = p.params().to_vec();
            p.begin_round(self.now, &x, grads.map(|g| g[i].as_slice()));
            while let Some(t) = p.poll_transmit() {
                in_flight.push((i, t.to, t.frame));
            }
        }
        // Deliver until the network is quiet: a handled frame may cause more (all-reduce
        // steps, a parameter server's answers).
        while !in_flight.is_empty() {
            let mut caused = Vec::new();
            for (from, to, frame) in in_flight {
                let p = &mut self.peers[to];
                p.handle_message(self.now, from, &frame)
                    .map_err(|source| SimError::Refused {
                        from,
                        to,
                        cause: source,
                    })?;
                while let Some(t) = p.poll_transmit() {
                    caused.push((to, t.to, t.frame));
                }
            }
            in_flight = caused;
        }
        for (i, p) in self.peers.iter_mut().enumerate() {
            let mut mixed = false;
            while let Some(ev) = p.poll_event() {
                if let GossipEvent::Diverged { round, reason } = ev {
                    return Err(SimError::Diverged(i, round, reason));
                }
                mixed |= matches!(ev, GossipEvent::Mixed { round: r } if r == round);
            }
            if !mixed {
                return Err(SimError::Stuck(i, round));
            }
        }
        self.now += self.step;
        Ok(())
    }

    /// Runs `rounds` rounds with zero gradient.
    pub fn run_rounds(&mut self, rounds: usize) -> Result<(), SimError> {
        for _ in 0..rounds {
            self.run_round(None)?;
        }
        Ok(())
    }

    /// Consensus distance Ξ² = (1/n) Σ‖x_i − x̄‖² over the peers' current parameters.
    pub fn consensus_distance(&self) -> f64 {
        consensus_distance(self.peers.iter().map(|p| p.params())).0
    }

    /// The network average `x̄: [d]`.
    pub fn average(&self) -> Vec<f32> {
        consensus_distance(self.peers.iter().map(|p| p.params())).1
    }
}
