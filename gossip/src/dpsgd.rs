//! D-PSGD: decentralized parallel SGD (Lian et al. 2017, "Can decentralized algorithms
//! outperform centralized algorithms? A case study for decentralized parallel stochastic
//! gradient descent", Algorithm 1).
//!
//! Every round t, peer i sends its parameters x_i^t to its out-neighbours, computes a
//! stochastic gradient g_i = ∇F_i(x_i^t; ξ_i^t) at the same point, and sets
//!
//! ```text
//! x_i^{t+1} = Σ_j W_ij x_j^t − η g_i
//! ```
//!
//! with W doubly stochastic (n×n, W_ij ≠ 0 only for j = i or j → i an edge). The gradient
//! and the exchange do not depend on each other, so a driver may overlap them. With a zero
//! gradient this is exact gossip averaging, which contracts the consensus distance by
//! |λ₂(W)|² per round in the worst case.
//!
//! Messages are `compress` messages of x_i^t, identity-compressed by default; a lossy
//! operator here gives "D-PSGD with compressed models", which does not converge to
//! consensus in general (use CHOCO-SGD for that).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use murmur_compress::{Compressor, Identity};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use crate::{Gossip, GossipError, GossipEvent, GossipStats, Rank, Transmit};

/// Configuration of one D-PSGD peer.
#[derive(Debug, Clone)]
pub struct DPsgdConfig {
    /// This peer's rank i.
    pub rank: Rank,
    /// W_ii.
    pub self_weight: f64,
    /// (j, W_ij) for every in-neighbour j ≠ i with W_ij ≠ 0.
    pub in_weights: Vec<(Rank, f64)>,
    /// Peers j ≠ i with W_ji ≠ 0: who receives x_i.
    pub out_neighbors: Vec<Rank>,
    /// Learning rate η applied to the gradient passed to `begin_round`.
    pub lr: f32,
    /// How long a round may wait for its messages before [`GossipEvent::RoundTimedOut`].
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
    /// Seed of the RNG handed to randomised compressors.
    pub seed: u64,
    /// How many rounds an in-neighbour can be ahead of this peer (≥ 1). In-neighbour j
    /// cannot finish round t + L before hearing, through the graph, of our round t, so its
    /// lead is at most the length L of the shortest path from this peer to j: 1 on an
    /// undirected graph, more on a directed one (e.g. the exponential graph). Frames up to
    /// this many rounds ahead are buffered; later ones are refused.
    pub max_lead_rounds: u64,
}

impl DPsgdConfig {
    /// The configuration of peer `rank` for mixing matrix `w` (n×n), with η = `lr`, a 60 s
    /// round timeout, a payload limit of 16 bytes per parameter plus 1 KiB for `d`
    /// parameters, and `max_lead_rounds` from the graph distances of W's support.
    pub fn from_matrix(w: &murmur_topology::MixingMatrix, rank: Rank, lr: f32, d: usize) -> Self {
        DPsgdConfig {
            rank,
            self_weight: w.self_weight(rank),
            in_weights: w.in_weights(rank),
            out_neighbors: w.out_neighbors(rank),
            lr,
            round_timeout: Duration::from_secs(60),
            max_payload_bytes: u32::try_from(16 * d + 1024).unwrap_or(u32::MAX),
            seed: rank as u64,
            max_lead_rounds: max_lead(w, rank),
        }
    }
}

/// Largest graph distance from `rank` to one of its in-neighbours along the direction in
/// which frames travel (j → i when W_ij ≠ 0); n if some in-neighbour is unreachable.
fn max_lead(w: &murmur_topology::MixingMatrix, rank: Rank) -> u64 {
    let n = w.n();
    let mut dist = vec![usize::MAX; n];
    let mut queue = VecDeque::from([rank]);
    dist[rank] = 0;
    while let Some(a) = queue.pop_front() {
        for b in w.out_neighbors(a) {
            if dist[b] == usize::MAX {
                dist[b] = dist[a] + 1;
                queue.push_back(b);
            }
        }
    }
    w.in_weights(rank)
        .iter()
        .map(|&(j, _)| if dist[j] == usize::MAX { n } else { dist[j] })
        .max()
        .unwrap_or(1) as u64
}

/// One peer of D-PSGD as a sans-I/O state machine (see the [module docs](self)).
pub struct DPsgd {
    cfg: DPsgdConfig,
    compressor: Box<dyn Compressor>,
    rng: StdRng,
    /// x_i: [d], the parameters after the last completed round.
    x: Vec<f32>,
    /// Σ_j W_ij x_j − η g accumulated for the mixing round.
    acc: Vec<f32>,
    /// Next round to begin, or the round that is mixing.
    round: u64,
    mixing: bool,
    deadline: Option<Instant>,
    /// In-neighbours (index into `cfg.in_weights`) still missing for the mixing round.
    missing: Vec<bool>,
    missing_count: usize,
    /// Validated frames for rounds not yet begun, by (round, neighbour index).
    early: BTreeMap<(u64, usize), Vec<u8>>,
    /// The encoded message of this round (frame header + compressed x), sent to each out-neighbour.
    outgoing: Vec<u8>,
    next_out: usize,
    events: VecDeque<GossipEvent>,
    stats: GossipStats,
}

impl DPsgd {
    /// A peer starting from parameters `x0: [d]`, sending identity-compressed messages.
    pub fn new(cfg: DPsgdConfig, x0: Vec<f32>) -> Self {
        Self::with_compressor(cfg, x0, Box::new(Identity))
    }

    /// A peer starting from `x0: [d]` that compresses its messages with `compressor`.
    pub fn with_compressor(
        cfg: DPsgdConfig,
        x0: Vec<f32>,
        compressor: Box<dyn Compressor>,
    ) -> Self {
        let d = x0.len();
        let k = cfg.in_weights.len();
        let next_out = cfg.out_neighbors.len();
        DPsgd {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            compressor,
            x: x0,
            acc: vec![0.0; d],
            round: 0,
            mixing: false,
            deadline: None,
            missing: vec![false; k],
            missing_count: 0,
            early: BTreeMap::new(),
            outgoing: Vec::new(),
            next_out,
            events: VecDeque::new(),
            stats: GossipStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DPsgdConfig {
        &self.cfg
    }

    fn neighbour_index(&self, from: Rank) -> Option<usize> {
        self.cfg.in_weights.iter().position(|(j, _)| *j == from)
    }

    /// Adds W_ij · x_j from a validated payload. Returns an error if the payload is bad.
    fn absorb(&mut self, idx: usize, payload: &[u8]) -> Result<(), GossipError> {
        let (from, w) = self.cfg.in_weights[idx];
        murmur_compress::decode_add(payload, w as f32, &mut self.acc)
            .map_err(|source| GossipError::Payload { from, source })?;
        self.missing[idx] = false;
        self.missing_count -= 1;
        Ok(())
    }

    fn finish_if_complete(&mut self) {
        if self.mixing && self.missing_count == 0 {
            std::mem::swap(&mut self.x, &mut self.acc);
            self.mixing = false;
            self.deadline = None;
            self.events
                .push_back(GossipEvent::Mixed { round: self.round });
            self.round += 1;
        }
    }
}

impl Gossip for DPsgd {
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
        assert_eq!(x.len(), self.x.len(), "x must have length d");
        let d = x.len();
        self.x.copy_from_slice(x);
        // acc = W_ii x_i − η g_i; neighbours' W_ij x_j are added as they arrive.
        let wii = self.cfg.self_weight as f32;
        match grad {
            Some(g) => {
                assert_eq!(g.len(), d, "grad must have length d");
                let lr = self.cfg.lr;
                for ((a, xi), gi) in self.acc.iter_mut().zip(x).zip(g) {
                    *a = wii * xi - lr * gi;
                }
            }
            None => {
                for (a, xi) in self.acc.iter_mut().zip(x) {
                    *a = wii * xi;
                }
            }
        }
        // Encode x once; every out-neighbour gets the same bytes.
        self.outgoing.clear();
        self.outgoing.resize(FRAME_HEADER_LEN, 0);
        let payload_len = self
            .compressor
            .compress(x, &mut self.rng, &mut self.outgoing);
        let header = FrameHeader {
            kind: FrameKind::Gossip,
            sender: self.cfg.rank,
            round: self.round,
            dim: d as u32,
            payload_len: payload_len as u32,
        };
        self.outgoing[..FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
        self.next_out = 0;

        self.mixing = true;
        self.deadline = Some(now + self.cfg.round_timeout);
        self.missing.iter_mut().for_each(|m| *m = true);
        self.missing_count = self.missing.len();
        // Frames that arrived early for this round were validated then; absorb them now.
        let later = self.early.split_off(&(self.round + 1, 0));
        for ((_, idx), frame) in std::mem::replace(&mut self.early, later) {
            // Payload validity was checked on arrival, so this cannot fail; keep the error
            // path anyway rather than trusting that invariant with a panic.
            if let Err(e) = self.absorb(idx, &frame[FRAME_HEADER_LEN..]) {
                debug_assert!(false, "early frame failed late: {e}");
            }
        }
        self.finish_if_complete();
    }

    fn handle_message(
        &mut self,
        _now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let (h, payload) = FrameHeader::parse(frame, self.cfg.max_payload_bytes)?;
        if h.kind != FrameKind::Gossip {
            return Err(GossipError::WrongKind(h.kind));
        }
        if h.sender != from {
            return Err(GossipError::SenderMismatch {
                from,
                claimed: h.sender,
            });
        }
        let idx = self
            .neighbour_index(from)
            .ok_or(GossipError::NotANeighbour(from))?;
        let d = self.x.len();
        if h.dim as usize != d {
            return Err(GossipError::DimensionMismatch {
                from,
                expected: d,
                got: h.dim as usize,
            });
        }
        // A neighbour can be up to `max_lead_rounds` ahead of the round we mix (one less
        // while we are idle between rounds); see `DPsgdConfig::max_lead_rounds`.
        let lo = self.round;
        let hi = self.round + self.cfg.max_lead_rounds.max(1) - u64::from(!self.mixing);
        if h.round < lo || h.round > hi {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo,
                hi,
            });
        }
        let current = self.mixing && h.round == self.round;
        if current {
            if !self.missing[idx] {
                return Err(GossipError::Duplicate {
                    from,
                    round: h.round,
                });
            }
            self.absorb(idx, payload)?;
        } else {
            if self.early.contains_key(&(h.round, idx)) {
                return Err(GossipError::Duplicate {
                    from,
                    round: h.round,
                });
            }
            // Validate now so that a bad frame is refused on arrival, not when absorbed.
            murmur_compress::validate(payload, d)
                .map_err(|source| GossipError::Payload { from, source })?;
            self.early.insert((h.round, idx), frame.to_vec());
        }
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame.len() as u64;
        self.finish_if_complete();
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some(deadline) = self.deadline {
            if self.mixing && now >= deadline {
                let missing = self
                    .cfg
                    .in_weights
                    .iter()
                    .zip(&self.missing)
                    .filter(|(_, m)| **m)
                    .map(|((j, _), _)| *j)
                    .collect();
                self.events.push_back(GossipEvent::RoundTimedOut {
                    round: self.round,
                    missing,
                });
                // Report once per deadline; the driver decides what to do.
                self.deadline = None;
            }
        }
    }

    fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        let to = *self.cfg.out_neighbors.get(self.next_out)?;
        self.next_out += 1;
        buf.clear();
        buf.extend_from_slice(&self.outgoing);
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += buf.len() as u64;
        Some(Transmit { to })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.events.pop_front()
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    fn round(&self) -> u64 {
        self.round
    }

    fn stats(&self) -> GossipStats {
        self.stats
    }
}
