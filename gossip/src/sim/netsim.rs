//! A deterministic discrete-event network simulator: drives n [`Gossip`] peers of any
//! algorithm on a simulated clock with latency, bandwidth, loss and stragglers, so that the
//! wall-clock time of a training run on 1 Gb/s or 10 Gb/s links can be predicted on one
//! machine. [`crate::sim::Sim`] is the lock-step harness of the algorithms; this is its
//! timed counterpart.
//!
//! # Network model
//!
//! Frames are the exact bytes of [`Gossip::poll_transmit`]; their length drives the timing.
//! Every link follows the α–β (Hockney) cost model used for the communication analysis in
//! the surveys of Tang, Shi, Chu et al. (2020/2023) and in Shi, Wang & Chu (2018, "A DAG
//! model of synchronous stochastic gradient descent in distributed deep learning"): a frame
//! of `m` bytes from i to j takes `m / B_i` seconds of serialization on i's NIC plus the
//! one-way latency `L_ij` of the link ([`NetworkModel`]):
//!
//! - **Egress.** A peer's NIC sends one frame at a time, first in first out, at its
//!   bandwidth `B_i` (bytes/s): frames handed out together go out back to back. The last
//!   byte of a frame reaches the receiver `L_ij` after it left.
//! - **Ingress** (off by default, [`NetworkModel::with_ingress`]). The receiver's NIC also
//!   drains at its bandwidth `B_j`: frames whose first bytes arrive while it is busy queue
//!   behind each other (fluid cut-through: an uncontended frame is not delayed). This is
//!   what makes an incast (many senders, one receiver) slow.
//! - **Slower paths** ([`NetworkModel::link_bandwidth_bytes_per_sec`], off by default).
//!   A path i → j slower than i's NIC (a wide-area hop): the frame leaves the NIC at `B_i`
//!   and takes `m / B_ij` on the path, which carries one frame at a time; frames to other
//!   peers are not held up. The receiver is told each frame's time on its path
//!   ([`Gossip::observe_link`]), as the data plane measures first to last byte.
//! - **Loss.** Each transmission attempt is lost with probability `p`, independently. The
//!   transport is reliable (QUIC): the sender notices the loss `rto_latency_factor × L_ij`
//!   after the attempt finished serializing (3 × the one-way latency by default, about 1.5
//!   round trips, the order of QUIC's probe timeout, RFC 9002 §6.2) and queues the frame
//!   again on its NIC. Drops cost time and NIC capacity, never data.
//! - **Stragglers.** A peer's compute time of a round is multiplied by its slowdown factor
//!   (fixed per peer and/or drawn per round with some probability).
//!
//! Not modelled: congestion inside the network (links are independent), flow control,
//! reordering of frames on one link beyond what loss causes, CPU time of the algorithms.
//!
//! # Rounds
//!
//! [`NetSim::run_rounds`] runs every peer through more rounds, event-driven and not in
//! lock-step: a peer starts its next round as soon as its previous one ended, and frames
//! for a round a peer has not begun are buffered by the state machine itself. A round of
//! peer i that starts at time t:
//!
//! - asks the caller's compute callback for the gradient at the current parameters; the
//!   callback returns it with its simulated compute time `C` (seconds), which the model
//!   multiplies by the peer's straggler factor;
//! - if the algorithm [overlaps](Gossip::overlaps_gradient) (D-PSGD), begins the round at
//!   t without the gradient, so the frames move while the gradient is computed, and applies
//!   the gradient with [`Gossip::apply_gradient`] at `max(Mixed, t + C)`;
//! - otherwise (CHOCO), begins the round at `t + C` with the gradient and ends at `Mixed`.
//!
//! Per peer and round a [`PeerRound`] records the times; with consensus tracking on (the
//! default) the consensus distance Ξ²(t) is recorded once all n peers have finished round t
//! ([`ConsensusPoint`]). It is accumulated as peers finish, not from snapshots: Ξ² is
//! invariant to a shift c, Ξ² = (1/n) Σ_i ‖x_i − c‖² − ‖(1/n) Σ_i (x_i − c)‖², and with c
//! the parameters of the first peer to finish round t (a vector of the consensus' own
//! scale, so the difference does not cancel) a round in progress costs `c: [d]` in `f32`
//! and `Σ_i (x_i − c): [d]` in `f64` (12·d bytes), whatever n.
//!
//! # Determinism
//!
//! Simulated time is `f64` seconds from the start of the simulation; the `Instant`s handed
//! to the state machines are a fixed base plus that time. Events are processed in the order
//! (time, round, kind, ranks, insertion sequence), so simultaneous events are processed in
//! an order that does not depend on how they were scheduled; losses and random stragglers
//! are drawn from a hash of the model's seed and the frame or (peer, round). The same peers,
//! model and compute callback give bitwise the same results. On an ideal network with zero
//! compute, every round's frames are delivered in the same order as in the lock-step
//! [`crate::sim::Sim`], so both give bitwise the same parameters.
//!
//! # Cost
//!
//! Per round, O(frames · log events) for the event queue plus one copy of every frame and
//! of each peer's parameters (`[d]`, the compute callback's input), plus the algorithms'
//! own cost; consensus tracking adds one more copy of `[d]` per peer and one O(n d) pass per
//! round.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::round::Round;
use crate::{consensus_distance, Bytes, Gossip, GossipError, GossipEvent, GossipStats, Rank};

/// The network and the machines: latency, bandwidth, loss and stragglers (see the
/// [module docs](self)). Build it with [`NetworkModel::ideal`] or [`NetworkModel::gbps`]
/// and the `with_*` methods; [`NetSim::new`] checks it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NetworkModel {
    /// One-way latency of every link, in seconds (≥ 0).
    pub latency_secs: f64,
    /// One-way latency of the link (from, to), in seconds, where it differs from
    /// `latency_secs`.
    pub link_latency_secs: BTreeMap<(Rank, Rank), f64>,
    /// NIC bandwidth of every peer, in bytes per second (> 0; `f64::INFINITY`: no
    /// serialization delay).
    pub bandwidth_bytes_per_sec: f64,
    /// NIC bandwidth of a peer, in bytes per second, where it differs from
    /// `bandwidth_bytes_per_sec`.
    pub peer_bandwidth_bytes_per_sec: BTreeMap<Rank, f64>,
    /// The rate of the path `from → to`, in bytes per second, where it is slower than the
    /// sender's NIC (a slow wide-area hop): a frame on it leaves the NIC at the NIC's rate
    /// and then takes `m / B_path` on the path, which carries one frame at a time; frames
    /// to other peers are not held up.
    pub link_bandwidth_bytes_per_sec: BTreeMap<(Rank, Rank), f64>,
    /// Whether receiving NICs are a bottleneck too (frames queue at the receiver's
    /// bandwidth). Off by default: only egress serializes.
    pub ingress: bool,
    /// Probability that one transmission attempt of a frame is lost, in [0, 1).
    pub drop_probability: f64,
    /// A lost attempt is sent again this many one-way latencies after it finished
    /// serializing (≥ 0; 3 by default).
    pub rto_latency_factor: f64,
    /// (peer, factor ≥ 1 typically, > 0): the peer's compute time is multiplied by the
    /// factor every round. Several entries for one peer multiply.
    pub stragglers: Vec<(Rank, f64)>,
    /// (probability in [0, 1], factor > 0): in each round, each peer is independently a
    /// straggler with this probability, and then its compute time is multiplied by the
    /// factor (on top of `stragglers`).
    pub random_stragglers: Option<(f64, f64)>,
    /// Seed of the loss and random-straggler draws.
    pub seed: u64,
}

impl Default for NetworkModel {
    fn default() -> Self {
        NetworkModel::ideal()
    }
}

/// Default one-way latency of [`NetworkModel::gbps`]: 50 µs, a switched data-centre LAN.
pub const DEFAULT_LATENCY_SECS: f64 = 50e-6;

impl NetworkModel {
    /// Zero latency, infinite bandwidth, no loss, no stragglers, seed 0: frames arrive the
    /// instant they are sent and only compute time passes.
    pub fn ideal() -> Self {
        NetworkModel {
            latency_secs: 0.0,
            link_latency_secs: BTreeMap::new(),
            bandwidth_bytes_per_sec: f64::INFINITY,
            peer_bandwidth_bytes_per_sec: BTreeMap::new(),
            link_bandwidth_bytes_per_sec: BTreeMap::new(),
            ingress: false,
            drop_probability: 0.0,
            rto_latency_factor: 3.0,
            stragglers: Vec::new(),
            random_stragglers: None,
            seed: 0,
        }
    }

    /// Every NIC at `gbit_per_sec` Gb/s (10⁹ bits/s, so `gbps(1.0)` is 125,000,000 bytes/s)
    /// and every link at [`DEFAULT_LATENCY_SECS`] (50 µs); otherwise as
    /// [`NetworkModel::ideal`].
    pub fn gbps(gbit_per_sec: f64) -> Self {
        NetworkModel {
            latency_secs: DEFAULT_LATENCY_SECS,
            bandwidth_bytes_per_sec: gbit_per_sec * 1e9 / 8.0,
            ..NetworkModel::ideal()
        }
    }

    /// Sets the one-way latency of every link, in seconds.
    pub fn with_latency(mut self, secs: f64) -> Self {
        self.latency_secs = secs;
        self
    }

    /// Sets the one-way latency of the link `from → to`, in seconds.
    pub fn with_link_latency(mut self, from: Rank, to: Rank, secs: f64) -> Self {
        self.link_latency_secs.insert((from, to), secs);
        self
    }

    /// Sets the NIC bandwidth of every peer, in bytes per second.
    pub fn with_bandwidth(mut self, bytes_per_sec: f64) -> Self {
        self.bandwidth_bytes_per_sec = bytes_per_sec;
        self
    }

    /// Sets the NIC bandwidth of peer `rank`, in bytes per second.
    pub fn with_peer_bandwidth(mut self, rank: Rank, bytes_per_sec: f64) -> Self {
        self.peer_bandwidth_bytes_per_sec
            .insert(rank, bytes_per_sec);
        self
    }

    /// Sets the rate of the path `from → to`, in bytes per second (see
    /// [`NetworkModel::link_bandwidth_bytes_per_sec`]).
    pub fn with_link_bandwidth(mut self, from: Rank, to: Rank, bytes_per_sec: f64) -> Self {
        self.link_bandwidth_bytes_per_sec
            .insert((from, to), bytes_per_sec);
        self
    }

    /// Makes receiving NICs serialize too (see the [module docs](self)).
    pub fn with_ingress(mut self, on: bool) -> Self {
        self.ingress = on;
        self
    }

    /// Loses each transmission attempt with probability `p` (retransmitted; see the
    /// [module docs](self)).
    pub fn with_drop(mut self, p: f64) -> Self {
        self.drop_probability = p;
        self
    }

    /// Multiplies peer `rank`'s compute time by `factor` in every round.
    pub fn with_straggler(mut self, rank: Rank, factor: f64) -> Self {
        self.stragglers.push((rank, factor));
        self
    }

    /// Makes each peer, in each round, a straggler with probability `probability`, whose
    /// compute time is then multiplied by `factor`.
    pub fn with_random_stragglers(mut self, probability: f64, factor: f64) -> Self {
        self.random_stragglers = Some((probability, factor));
        self
    }

    /// Sets the seed of the loss and random-straggler draws.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// One-way latency of the link `from → to`, in seconds.
    pub fn latency(&self, from: Rank, to: Rank) -> f64 {
        self.link_latency_secs
            .get(&(from, to))
            .copied()
            .unwrap_or(self.latency_secs)
    }

    /// NIC bandwidth of peer `rank`, in bytes per second.
    pub fn bandwidth(&self, rank: Rank) -> f64 {
        self.peer_bandwidth_bytes_per_sec
            .get(&rank)
            .copied()
            .unwrap_or(self.bandwidth_bytes_per_sec)
    }

    /// The factor by which peer `rank`'s compute time is multiplied in round `round`.
    pub fn compute_factor(&self, rank: Rank, round: u64) -> f64 {
        let mut f: f64 = self
            .stragglers
            .iter()
            .filter(|&&(r, _)| r == rank)
            .map(|&(_, f)| f)
            .product();
        if let Some((p, factor)) = self.random_stragglers {
            if unit(self.seed, STREAM_STRAGGLER, rank as u64, round) < p {
                f *= factor;
            }
        }
        f
    }

    /// Checks every value for a simulation of `n` peers; `Err` names the first bad one.
    pub fn validate(&self, n: usize) -> Result<(), NetSimError> {
        let bad = |what: String| Err(NetSimError::InvalidModel(what));
        let latency_ok = |s: f64| s.is_finite() && s >= 0.0;
        let bandwidth_ok = |b: f64| b > 0.0 && !b.is_nan();
        if !latency_ok(self.latency_secs) {
            return bad(format!(
                "latency {} s, expected finite ≥ 0",
                self.latency_secs
            ));
        }
        for (&(from, to), &s) in &self.link_latency_secs {
            if from >= n || to >= n || !latency_ok(s) {
                return bad(format!(
                    "link {from} → {to} latency {s} s, expected ranks < {n} and finite ≥ 0"
                ));
            }
        }
        if !bandwidth_ok(self.bandwidth_bytes_per_sec) {
            return bad(format!(
                "bandwidth {} bytes/s, expected > 0",
                self.bandwidth_bytes_per_sec
            ));
        }
        for (&rank, &b) in &self.peer_bandwidth_bytes_per_sec {
            if rank >= n || !bandwidth_ok(b) {
                return bad(format!(
                    "peer {rank} bandwidth {b} bytes/s, expected rank < {n} and > 0"
                ));
            }
        }
        for (&(from, to), &b) in &self.link_bandwidth_bytes_per_sec {
            if from >= n || to >= n || from == to || !bandwidth_ok(b) {
                return bad(format!(
                    "link {from} → {to} bandwidth {b} bytes/s, expected two ranks < {n} and > 0"
                ));
            }
        }
        if !(0.0..1.0).contains(&self.drop_probability) {
            return bad(format!(
                "drop probability {}, expected in [0, 1)",
                self.drop_probability
            ));
        }
        if !latency_ok(self.rto_latency_factor) {
            return bad(format!(
                "retransmission timeout factor {}, expected finite ≥ 0",
                self.rto_latency_factor
            ));
        }
        let factor_ok = |f: f64| f.is_finite() && f > 0.0;
        for &(rank, f) in &self.stragglers {
            if rank >= n || !factor_ok(f) {
                return bad(format!(
                    "straggler {rank} factor {f}, expected rank < {n} and finite > 0"
                ));
            }
        }
        if let Some((p, f)) = self.random_stragglers {
            if !(0.0..=1.0).contains(&p) || !factor_ok(f) {
                return bad(format!(
                    "random stragglers (probability {p}, factor {f}), expected p in [0, 1] \
                     and a finite factor > 0"
                ));
            }
        }
        Ok(())
    }
}

/// What the compute callback of [`NetSim::run_rounds`] returns for one peer and round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Compute {
    /// The stochastic gradient `[d]` at the parameters the callback was given; `None` for
    /// pure gossip.
    pub grad: Option<Vec<f32>>,
    /// Simulated forward + backward time of this peer, in seconds (finite, ≥ 0), before the
    /// straggler factor.
    pub seconds: f64,
}

/// One round of one peer. Times are seconds of simulated time since the simulation
/// started; bytes are whole frames as counted by [`Gossip::stats`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerRound {
    /// The algorithm's round number (0-based).
    pub round: u64,
    /// When the round started (the previous round ended or the run began).
    pub start_secs: f64,
    /// When the round ended: `Mixed`, and for an overlapping algorithm also the gradient,
    /// both done.
    pub end_secs: f64,
    /// Simulated compute time, straggler factor included.
    pub compute_secs: f64,
    /// From `begin_round` to `Mixed`.
    pub communicate_secs: f64,
    /// From the end of compute to the end of the round: the communication not hidden
    /// behind computation.
    pub wait_secs: f64,
    /// Bytes the algorithm sent since the previous round ended (retransmissions excluded).
    pub bytes_sent: u64,
    /// Bytes the algorithm accepted since the previous round ended (a frame for a later
    /// round counts when it arrives).
    pub bytes_received: u64,
    /// Transmission attempts of this peer's frames lost since the previous round ended.
    pub frames_dropped: u64,
}

impl PeerRound {
    /// `end_secs − start_secs`.
    pub fn duration_secs(&self) -> f64 {
        self.end_secs - self.start_secs
    }
}

/// Sums of [`PeerRound`]s of one peer. Seconds of simulated time, bytes of whole frames.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Rounds summed.
    pub rounds: u64,
    /// Sum of round durations.
    pub elapsed_secs: f64,
    /// Sum of compute times.
    pub compute_secs: f64,
    /// Sum of communication times (`begin_round` → `Mixed`).
    pub communicate_secs: f64,
    /// Sum of wait times (communication not hidden).
    pub wait_secs: f64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Lost transmission attempts.
    pub frames_dropped: u64,
}

impl Totals {
    /// Totals of `rounds`.
    pub fn of(rounds: &[PeerRound]) -> Self {
        rounds.iter().fold(Totals::default(), |mut t, r| {
            t.rounds += 1;
            t.elapsed_secs += r.duration_secs();
            t.compute_secs += r.compute_secs;
            t.communicate_secs += r.communicate_secs;
            t.wait_secs += r.wait_secs;
            t.bytes_sent += r.bytes_sent;
            t.bytes_received += r.bytes_received;
            t.frames_dropped += r.frames_dropped;
            t
        })
    }

    /// Mean round duration in seconds (0 for no rounds).
    pub fn mean_round_secs(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.elapsed_secs / self.rounds as f64
        }
    }
}

/// What one [`NetSim::run_rounds`] call did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Rounds every peer ran.
    pub rounds: u64,
    /// Earliest start of a round of this call, in simulated seconds.
    pub start_secs: f64,
    /// Latest end of a round of this call, in simulated seconds.
    pub end_secs: f64,
    /// Per peer (index = rank), the totals of this call's rounds.
    pub peers: Vec<Totals>,
}

impl RunReport {
    /// `end_secs − start_secs`: the simulated wall time of the call.
    pub fn wall_secs(&self) -> f64 {
        self.end_secs - self.start_secs
    }

    /// Wall time per round (0 for no rounds).
    pub fn mean_round_secs(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.wall_secs() / self.rounds as f64
        }
    }
}

/// The exact consensus distance after round `round`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConsensusPoint {
    /// The round (0-based) after which it was measured.
    pub round: u64,
    /// Ξ² = (1/n) Σ_i ‖x_i − x̄‖² over the peers' parameters at the end of their round
    /// `round` ([`crate::consensus_distance`]).
    pub xi2: f64,
    /// When the last peer finished that round, in simulated seconds.
    pub at_secs: f64,
}

/// Why a simulation failed. After an error other than `InvalidModel` / `InvalidPeers` the
/// simulator is in the middle of a round: read what you need and drop it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NetSimError {
    /// A [`NetworkModel`] value is out of range.
    #[error("invalid network model: {0}")]
    InvalidModel(String),
    /// The peers cannot be simulated together (none, different d, a neighbour out of
    /// range).
    #[error("invalid peers: {0}")]
    InvalidPeers(String),
    /// A peer refused a frame.
    #[error("at {at_secs} s peer {to} refused a frame from peer {from}: {cause}")]
    Refused {
        /// Sender.
        from: Rank,
        /// Receiver.
        to: Rank,
        /// Simulated time, in seconds.
        at_secs: f64,
        /// Why.
        cause: GossipError,
    },
    /// A peer addressed a frame to itself or to a rank ≥ n.
    #[error("peer {from} sent a frame to {to}, which is not another peer of this simulation")]
    BadDestination {
        /// Sender.
        from: Rank,
        /// The destination it named.
        to: Rank,
    },
    /// A peer reported [`GossipEvent::RoundTimedOut`].
    #[error("at {at_secs} s peer {rank} timed out in round {round} waiting for {missing:?}")]
    RoundTimedOut {
        /// The peer.
        rank: Rank,
        /// Its round.
        round: u64,
        /// Peers whose frames are missing.
        missing: Vec<Rank>,
        /// Simulated time, in seconds.
        at_secs: f64,
    },
    /// A peer reported [`GossipEvent::Diverged`].
    #[error("at {at_secs} s peer {rank} diverged in round {round}: {reason}")]
    Diverged {
        /// The peer.
        rank: Rank,
        /// Its round.
        round: u64,
        /// What was not finite.
        reason: String,
        /// Simulated time, in seconds.
        at_secs: f64,
    },
    /// Nothing is left to happen while a peer still waits: the algorithm deadlocked.
    #[error("peer {rank} cannot finish round {round}: no event is pending (deadlock)")]
    Stalled {
        /// The first peer (lowest rank) still in a round.
        rank: Rank,
        /// Its round.
        round: u64,
    },
    /// A peer reported `Mixed` for a round it is not running.
    #[error("peer {rank} reported Mixed for round {round}, which it is not running")]
    UnexpectedMixed {
        /// The peer.
        rank: Rank,
        /// The round it named.
        round: u64,
    },
    /// The compute callback returned something unusable, or the parameters diverged.
    #[error("peer {rank} round {round}: {reason}")]
    InvalidCompute {
        /// The peer.
        rank: Rank,
        /// Its round.
        round: u64,
        /// What was wrong.
        reason: String,
    },
    /// The simulated time no longer fits in an `Instant`.
    #[error("simulated time {0} s does not fit in an Instant")]
    ClockOverflow(f64),
}

/// n peers on a simulated network (see the [module docs](self)).
pub struct NetSim {
    peers: Vec<Box<dyn Gossip>>,
    model: NetworkModel,
    d: usize,
    base: Instant,
    queue: BinaryHeap<Reverse<Event>>,
    seq: u64,
    next_frame_id: u64,
    state: Vec<PeerState>,
    /// When each slower path ([`NetworkModel::link_bandwidth_bytes_per_sec`]) is free.
    link_free: BTreeMap<(Rank, Rank), f64>,
    history: Vec<Vec<PeerRound>>,
    track_consensus: bool,
    /// Whether algorithms that can overlap communication with computation do.
    overlap: bool,
    pending: BTreeMap<u64, Pending>,
    consensus: Vec<ConsensusPoint>,
    /// Peers still running rounds in the current call.
    unfinished: usize,
}

/// Per-peer driver state.
struct PeerState {
    /// Rounds to have completed when the current call ends.
    target: u64,
    /// Rounds completed.
    done: u64,
    /// End of the last round (simulated seconds): when the next one starts.
    ready_at: f64,
    active: Option<Active>,
    /// Deadline of the pending timer event, if one is queued.
    timer: Option<Instant>,
    /// NIC free again at (egress), and its receive side (ingress), in simulated seconds.
    egress_free: f64,
    ingress_free: f64,
    /// Counters at the end of the last round.
    stats_mark: GossipStats,
    dropped: u64,
    dropped_mark: u64,
}

/// The round a peer is running.
struct Active {
    round: u64,
    start: f64,
    compute_secs: f64,
    compute_end: f64,
    /// The round's protocol, shared with `murmur peer` ([`crate::round::Round`]).
    protocol: Round,
    /// The parameters the round started from, kept until `begin_round` (no overlap).
    x: Option<Vec<f32>>,
    grad: Option<Vec<f32>>,
    compute_done: bool,
    comm_start: Option<f64>,
    mixed_at: Option<f64>,
}

/// Ξ² of round t, accumulated until every peer has finished it (see the module docs).
struct Pending {
    /// The shift c: the parameters of the first peer to finish the round, `[d]`.
    shift: Vec<f32>,
    /// Σ_i (x_i − c) over the peers that finished, `[d]`.
    sum: Vec<f64>,
    /// Σ_i ‖x_i − c‖² over the peers that finished.
    squares: f64,
    /// Which peers finished.
    seen: Vec<bool>,
    count: usize,
    end: f64,
}

impl Pending {
    fn new(n: usize, shift: &[f32], end: f64) -> Self {
        Pending {
            shift: shift.to_vec(),
            sum: vec![0.0; shift.len()],
            squares: 0.0,
            seen: vec![false; n],
            count: 0,
            end,
        }
    }

    /// Adds peer `rank`'s parameters `x: [d]` (once per peer; a repeat is ignored).
    fn add(&mut self, rank: Rank, x: &[f32], end: f64) {
        if std::mem::replace(&mut self.seen[rank], true) {
            return;
        }
        self.count += 1;
        self.end = self.end.max(end);
        let mut squares = 0.0;
        for ((s, &v), &c) in self.sum.iter_mut().zip(x).zip(&self.shift) {
            let dev = v as f64 - c as f64;
            *s += dev;
            squares += dev * dev;
        }
        self.squares += squares;
    }

    /// Ξ² = (1/n) Σ ‖x_i − c‖² − ‖(1/n) Σ (x_i − c)‖² over the `count` peers added.
    fn xi2(&self) -> f64 {
        let n = self.count.max(1) as f64;
        let mean_sq: f64 = self.sum.iter().map(|s| (s / n) * (s / n)).sum();
        (self.squares / n - mean_sq).max(0.0)
    }
}

struct Event {
    at: f64,
    round: u64,
    kind_order: u8,
    a: Rank,
    b: Rank,
    seq: u64,
    kind: EventKind,
}

enum EventKind {
    /// Peer `a` starts its next round.
    Start,
    /// Peer `a` finished computing.
    ComputeDone,
    /// Peer `a` queues frame `id` to `b` again (attempt `attempt`).
    Retransmit { frame: Bytes, id: u64, attempt: u32 },
    /// The first byte of a frame from `a` reaches `b`'s NIC (ingress modelled); its last
    /// byte would arrive at `tail` without contention.
    Arrive {
        frame: Bytes,
        tail: f64,
        transfer: f64,
    },
    /// A frame from `a` is handed to `b`; it took `transfer` seconds on its path, first to
    /// last byte (what [`Gossip::observe_link`] is told).
    Deliver { frame: Bytes, transfer: f64 },
    /// Peer `a`'s timer for `deadline`.
    Timeout { deadline: Instant },
}

impl EventKind {
    fn order(&self) -> u8 {
        match self {
            EventKind::Start => 0,
            EventKind::ComputeDone => 1,
            EventKind::Retransmit { .. } => 2,
            EventKind::Arrive { .. } => 3,
            EventKind::Deliver { .. } => 4,
            EventKind::Timeout { .. } => 5,
        }
    }
}

impl Event {
    fn key(&self) -> (u64, u8, Rank, Rank, u64) {
        (self.round, self.kind_order, self.a, self.b, self.seq)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at
            .total_cmp(&other.at)
            .then_with(|| self.key().cmp(&other.key()))
    }
}

const STREAM_STRAGGLER: u64 = 0x5354_5241_4747_4c45;
const STREAM_DROP: u64 = 0x4452_4f50_4452_4f50;

/// SplitMix64 finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw in [0, 1) determined by its arguments.
fn unit(seed: u64, stream: u64, a: u64, b: u64) -> f64 {
    let h = mix(mix(mix(seed ^ stream) ^ a) ^ b);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl NetSim {
    /// Simulates `peers` (peer i of the vector has rank i) on `model`.
    ///
    /// # Errors
    /// [`NetSimError::InvalidModel`] for a model value out of range,
    /// [`NetSimError::InvalidPeers`] for no peers, peers of different d, or an
    /// [out-peer](Gossip::out_peers) / [in-peer](Gossip::in_peers) outside `0..n`.
    pub fn new(peers: Vec<Box<dyn Gossip>>, model: NetworkModel) -> Result<Self, NetSimError> {
        let n = peers.len();
        if n == 0 {
            return Err(NetSimError::InvalidPeers("no peers".into()));
        }
        model.validate(n)?;
        let d = peers[0].params().len();
        for (i, p) in peers.iter().enumerate() {
            if p.params().len() != d {
                return Err(NetSimError::InvalidPeers(format!(
                    "peer {i} has d = {}, peer 0 has d = {d}",
                    p.params().len()
                )));
            }
            if let Some(&j) = p.out_peers().iter().chain(&p.in_peers()).find(|&&j| j >= n) {
                return Err(NetSimError::InvalidPeers(format!(
                    "peer {i} names peer {j} as a neighbour, but there are {n} peers"
                )));
            }
        }
        let state = peers
            .iter()
            .map(|p| PeerState {
                target: 0,
                done: 0,
                ready_at: 0.0,
                active: None,
                timer: None,
                egress_free: 0.0,
                ingress_free: 0.0,
                stats_mark: p.stats(),
                dropped: 0,
                dropped_mark: 0,
            })
            .collect();
        Ok(NetSim {
            history: vec![Vec::new(); n],
            peers,
            model,
            d,
            base: Instant::now(),
            queue: BinaryHeap::new(),
            seq: 0,
            next_frame_id: 0,
            state,
            link_free: BTreeMap::new(),
            track_consensus: true,
            overlap: true,
            pending: BTreeMap::new(),
            consensus: Vec::new(),
            unfinished: 0,
        })
    }

    /// Number of peers n.
    pub fn n(&self) -> usize {
        self.peers.len()
    }

    /// Model dimension d.
    pub fn d(&self) -> usize {
        self.d
    }

    /// The network model.
    pub fn model(&self) -> &NetworkModel {
        &self.model
    }

    /// Peer `rank`'s state machine, `None` for `rank ≥ n`.
    pub fn peer(&self, rank: Rank) -> Option<&dyn Gossip> {
        self.peers.get(rank).map(|p| p.as_ref())
    }

    /// Whether algorithms that can overlap communication with computation
    /// ([`Gossip::overlaps_gradient`]) do; on by default. Off, every round begins after its
    /// compute, as for CHOCO (`--no-overlap`).
    pub fn set_overlap(&mut self, on: bool) {
        self.overlap = on;
    }

    /// Tells every peer the current epoch ([`Gossip::set_epoch`]: compressor schedules).
    pub fn set_epoch(&mut self, epoch: usize) {
        for p in &mut self.peers {
            p.set_epoch(epoch);
        }
    }

    /// Records Ξ² after every round ([`NetSim::consensus`]); on by default. Costs 12·d bytes
    /// per round that some but not all peers have finished (see the module docs).
    pub fn set_track_consensus(&mut self, on: bool) {
        self.track_consensus = on;
        if !on {
            self.pending.clear();
        }
    }

    /// Simulated time in seconds: the end of the latest round of any peer.
    pub fn now_secs(&self) -> f64 {
        self.state.iter().map(|s| s.ready_at).fold(0.0, f64::max)
    }

    /// Peer `rank`'s rounds, oldest first (empty for `rank ≥ n`).
    pub fn history(&self, rank: Rank) -> &[PeerRound] {
        self.history.get(rank).map_or(&[], Vec::as_slice)
    }

    /// Totals over all of peer `rank`'s rounds.
    ///
    /// `communicate_secs` adds the time the peer's communication ran behind its rounds
    /// ([`GossipStats::background_nanos`], Streaming DiLoCo's fragment syncs) to the
    /// rounds' own (`begin_round` → `Mixed`), so that `1 − wait / communicate` is the share
    /// of the communication hidden behind compute.
    pub fn totals(&self, rank: Rank) -> Totals {
        let mut t = Totals::of(self.history(rank));
        if let Some(p) = self.peers.get(rank) {
            t.communicate_secs += p.stats().background_nanos as f64 * 1e-9;
        }
        t
    }

    /// Ξ² after each round that every peer has finished, oldest first.
    pub fn consensus(&self) -> &[ConsensusPoint] {
        &self.consensus
    }

    /// Ξ² over the peers' current parameters.
    pub fn consensus_distance(&self) -> f64 {
        consensus_distance(self.peers.iter().map(|p| p.params())).0
    }

    /// The network average `x̄: [d]` of the current parameters.
    pub fn average(&self) -> Vec<f32> {
        consensus_distance(self.peers.iter().map(|p| p.params())).1
    }

    /// Pure gossip: `rounds` more rounds with no gradient and zero compute time.
    ///
    /// # Errors
    /// As [`NetSim::run_rounds`].
    pub fn run_consensus(&mut self, rounds: u64) -> Result<RunReport, NetSimError> {
        self.run_rounds(rounds, |_, _, _| Compute::default())
    }

    /// Runs every peer through `rounds` more rounds, each starting when its previous one
    /// ended (see the [module docs](self)). `compute(rank, round, x)` is called when peer
    /// `rank` starts round `round` from parameters `x: [d]`, in simulated-time order; it
    /// returns the gradient at `x` and the compute time.
    ///
    /// # Errors
    /// [`NetSimError::Refused`], [`NetSimError::BadDestination`],
    /// [`NetSimError::RoundTimedOut`], [`NetSimError::Stalled`],
    /// [`NetSimError::UnexpectedMixed`] from the algorithms;
    /// [`NetSimError::InvalidCompute`] for a gradient that is not `[d]` or not finite, a
    /// compute time that is negative or not finite, or non-finite parameters;
    /// [`NetSimError::ClockOverflow`].
    pub fn run_rounds(
        &mut self,
        rounds: u64,
        mut compute: impl FnMut(Rank, u64, &[f32]) -> Compute,
    ) -> Result<RunReport, NetSimError> {
        let n = self.n();
        let first: Vec<usize> = self.history.iter().map(Vec::len).collect();
        if rounds > 0 {
            for rank in 0..n {
                let s = &mut self.state[rank];
                s.target = s.done + rounds;
                let at = s.ready_at;
                let round = self.peers[rank].round();
                self.push(at, round, rank, rank, EventKind::Start);
            }
            self.unfinished = n;
        }
        while self.unfinished > 0 {
            let Some(Reverse(ev)) = self.queue.pop() else {
                let rank = (0..n)
                    .find(|&i| self.state[i].active.is_some())
                    .unwrap_or(0);
                let round = self.state[rank]
                    .active
                    .as_ref()
                    .map_or_else(|| self.peers[rank].round(), |a| a.round);
                return Err(NetSimError::Stalled { rank, round });
            };
            self.process(ev, &mut compute)?;
        }
        // Every peer is idle: the remaining timers are stale.
        self.queue
            .retain(|Reverse(e)| !matches!(e.kind, EventKind::Timeout { .. }));
        for s in &mut self.state {
            s.timer = None;
        }
        let runs: Vec<&[PeerRound]> = self
            .history
            .iter()
            .zip(first)
            .map(|(h, f)| &h[f..])
            .collect();
        let start_secs = runs
            .iter()
            .flat_map(|r| r.first())
            .map(|r| r.start_secs)
            .fold(f64::INFINITY, f64::min);
        let end_secs = runs
            .iter()
            .flat_map(|r| r.last())
            .map(|r| r.end_secs)
            .fold(f64::NEG_INFINITY, f64::max);
        let (start_secs, end_secs) = if rounds == 0 {
            (self.now_secs(), self.now_secs())
        } else {
            (start_secs, end_secs)
        };
        Ok(RunReport {
            rounds,
            start_secs,
            end_secs,
            peers: runs.into_iter().map(Totals::of).collect(),
        })
    }

    fn push(&mut self, at: f64, round: u64, a: Rank, b: Rank, kind: EventKind) {
        self.seq += 1;
        self.queue.push(Reverse(Event {
            at,
            round,
            kind_order: kind.order(),
            a,
            b,
            seq: self.seq,
            kind,
        }));
    }

    fn instant(&self, secs: f64) -> Result<Instant, NetSimError> {
        Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| self.base.checked_add(d))
            .ok_or(NetSimError::ClockOverflow(secs))
    }

    /// The round peer `rank` is running, or the next one.
    fn current_round(&self, rank: Rank) -> u64 {
        self.state[rank]
            .active
            .as_ref()
            .map_or_else(|| self.peers[rank].round(), |a| a.round)
    }

    fn process(
        &mut self,
        ev: Event,
        compute: &mut dyn FnMut(Rank, u64, &[f32]) -> Compute,
    ) -> Result<(), NetSimError> {
        let t = ev.at;
        match ev.kind {
            EventKind::Start => self.start_round(ev.a, t, compute),
            EventKind::ComputeDone => self.compute_done(ev.a, t),
            EventKind::Retransmit { frame, id, attempt } => {
                self.send(ev.a, ev.b, frame, t, ev.round, id, attempt);
                Ok(())
            }
            EventKind::Arrive {
                frame,
                tail,
                transfer,
            } => {
                let (from, to) = (ev.a, ev.b);
                let bw = self.model.bandwidth(to);
                let s = &mut self.state[to];
                let done = tail.max(t.max(s.ingress_free) + frame.len() as f64 / bw);
                s.ingress_free = done;
                let transfer = transfer.max(done - t);
                let kind = EventKind::Deliver { frame, transfer };
                self.push(done, ev.round, from, to, kind);
                Ok(())
            }
            EventKind::Deliver { frame, transfer } => {
                let (from, to) = (ev.a, ev.b);
                let now = self.instant(t)?;
                self.peers[to].observe_link(from, frame.len(), transfer);
                match self.peers[to].handle_message(now, from, &frame) {
                    // The straggler policy dropped that round's edge: the frame is late.
                    Ok(()) | Err(GossipError::Skipped { .. }) => {}
                    Err(source) => {
                        return Err(NetSimError::Refused {
                            from,
                            to,
                            at_secs: t,
                            cause: source,
                        })
                    }
                }
                self.after_input(to, t)
            }
            EventKind::Timeout { deadline } => {
                let rank = ev.a;
                if self.state[rank].timer != Some(deadline) {
                    return Ok(()); // superseded by an earlier timer
                }
                self.state[rank].timer = None;
                match self.peers[rank].poll_timeout() {
                    Some(d) if d <= deadline => {
                        self.peers[rank].handle_timeout(deadline);
                        self.after_input(rank, t)
                    }
                    Some(d) => {
                        self.arm_timer(rank, d, t);
                        Ok(())
                    }
                    None => Ok(()),
                }
            }
        }
    }

    fn start_round(
        &mut self,
        rank: Rank,
        t: f64,
        compute: &mut dyn FnMut(Rank, u64, &[f32]) -> Compute,
    ) -> Result<(), NetSimError> {
        let round = self.peers[rank].round();
        let x = self.peers[rank].params().to_vec();
        let invalid = |reason: String| NetSimError::InvalidCompute {
            rank,
            round,
            reason,
        };
        if x.iter().any(|v| !v.is_finite()) {
            return Err(invalid("the parameters are not finite (diverged)".into()));
        }
        let Compute { grad, seconds } = compute(rank, round, &x);
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(invalid(format!(
                "compute time {seconds} s, expected finite ≥ 0"
            )));
        }
        if let Some(g) = &grad {
            if g.len() != self.d {
                return Err(invalid(format!(
                    "gradient of length {}, expected d = {}",
                    g.len(),
                    self.d
                )));
            }
            if g.iter().any(|v| !v.is_finite()) {
                return Err(invalid("the gradient is not finite".into()));
            }
        }
        let compute_secs = seconds * self.model.compute_factor(rank, round);
        let compute_end = t + compute_secs;
        let now = self.instant(t)?;
        let protocol = Round::start(&mut *self.peers[rank], now, &x, self.overlap);
        let overlap = protocol.overlaps();
        self.state[rank].active = Some(Active {
            round,
            start: t,
            compute_secs,
            compute_end,
            protocol,
            x: (!overlap).then_some(x),
            grad,
            compute_done: false,
            comm_start: overlap.then_some(t),
            mixed_at: None,
        });
        self.push(compute_end, round, rank, rank, EventKind::ComputeDone);
        if overlap {
            self.after_input(rank, t)?;
        }
        Ok(())
    }

    fn compute_done(&mut self, rank: Rank, t: f64) -> Result<(), NetSimError> {
        let now = self.instant(t)?;
        let Some(a) = self.state[rank].active.as_mut() else {
            return Ok(());
        };
        a.compute_done = true;
        let x = a.x.take().unwrap_or_default();
        // The simulator's peers mix in place (`BuildContext::in_place`), so none streams its
        // message in parts: no next round is announced.
        if !a
            .protocol
            .computed(&mut *self.peers[rank], now, &x, a.grad.as_deref(), false)
        {
            // The exchange began with the round (overlap); it may have mixed already.
            if a.mixed_at.is_some() {
                self.finish_round(rank, t)?;
            }
            return Ok(());
        }
        a.comm_start = Some(t);
        self.after_input(rank, t)
    }

    /// Drains what the state machine wants after an input, in the trait's order.
    fn after_input(&mut self, rank: Rank, t: f64) -> Result<(), NetSimError> {
        let n = self.n();
        let round = self.current_round(rank);
        while let Some(tx) = self.peers[rank].poll_transmit() {
            if tx.to >= n || tx.to == rank {
                return Err(NetSimError::BadDestination {
                    from: rank,
                    to: tx.to,
                });
            }
            let id = self.next_frame_id;
            self.next_frame_id += 1;
            self.send(rank, tx.to, tx.frame, t, round, id, 0);
        }
        if let Some(deadline) = self.peers[rank].poll_timeout() {
            self.arm_timer(rank, deadline, t);
        }
        while let Some(ev) = self.peers[rank].poll_event() {
            match ev {
                GossipEvent::Mixed { round } => self.on_mixed(rank, round, t)?,
                GossipEvent::RoundTimedOut { round, missing } => {
                    return Err(NetSimError::RoundTimedOut {
                        rank,
                        round,
                        missing,
                        at_secs: t,
                    })
                }
                GossipEvent::Diverged { round, reason } => {
                    return Err(NetSimError::Diverged {
                        rank,
                        round,
                        reason,
                        at_secs: t,
                    })
                }
            }
        }
        Ok(())
    }

    /// Queues a frame on `from`'s NIC at time `t` and schedules its arrival, or, if this
    /// attempt is lost, its retransmission.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        from: Rank,
        to: Rank,
        frame: Bytes,
        t: f64,
        round: u64,
        id: u64,
        attempt: u32,
    ) {
        let serialization = frame.len() as f64 / self.model.bandwidth(from);
        let latency = self.model.latency(from, to);
        let s = &mut self.state[from];
        let start = t.max(s.egress_free);
        let mut end = start + serialization;
        s.egress_free = end;
        // A slower path: one frame at a time on it, after the NIC has started the frame.
        let mut transfer = serialization;
        if let Some(&b) = self.model.link_bandwidth_bytes_per_sec.get(&(from, to)) {
            let free = self.link_free.entry((from, to)).or_insert(0.0);
            let on_path = frame.len() as f64 / b;
            if on_path > serialization {
                let path_start = start.max(*free);
                end = end.max(path_start + on_path);
                *free = end;
                transfer = on_path;
            }
        }
        let p = self.model.drop_probability;
        if p > 0.0 && unit(self.model.seed, STREAM_DROP, id, u64::from(attempt)) < p {
            s.dropped += 1;
            let again = end + self.model.rto_latency_factor * latency;
            let kind = EventKind::Retransmit {
                frame,
                id,
                attempt: attempt.saturating_add(1),
            };
            self.push(again, round, from, to, kind);
        } else if self.model.ingress {
            let kind = EventKind::Arrive {
                frame,
                tail: end + latency,
                transfer,
            };
            self.push(start + latency, round, from, to, kind);
        } else {
            let kind = EventKind::Deliver { frame, transfer };
            self.push(end + latency, round, from, to, kind);
        }
    }

    /// Makes sure a timer event fires no later than `deadline`.
    fn arm_timer(&mut self, rank: Rank, deadline: Instant, t: f64) {
        if matches!(self.state[rank].timer, Some(p) if p <= deadline) {
            return; // the pending timer fires first and re-arms
        }
        self.state[rank].timer = Some(deadline);
        let at = deadline
            .saturating_duration_since(self.base)
            .as_secs_f64()
            .max(t);
        let round = self.current_round(rank);
        self.push(at, round, rank, rank, EventKind::Timeout { deadline });
    }

    fn on_mixed(&mut self, rank: Rank, round: u64, t: f64) -> Result<(), NetSimError> {
        let a = match self.state[rank].active.as_mut() {
            Some(a) if a.round == round && a.mixed_at.is_none() => a,
            _ => return Err(NetSimError::UnexpectedMixed { rank, round }),
        };
        a.mixed_at = Some(t);
        if a.compute_done {
            self.finish_round(rank, t)?;
        }
        Ok(())
    }

    fn finish_round(&mut self, rank: Rank, t: f64) -> Result<(), NetSimError> {
        let Some(a) = self.state[rank].active.take() else {
            return Ok(());
        };
        a.protocol.finish(&mut *self.peers[rank], a.grad.as_deref());
        let stats = self.peers[rank].stats();
        let s = &mut self.state[rank];
        let mixed = a.mixed_at.unwrap_or(t);
        self.history[rank].push(PeerRound {
            round: a.round,
            start_secs: a.start,
            end_secs: t,
            compute_secs: a.compute_secs,
            communicate_secs: mixed - a.comm_start.unwrap_or(mixed),
            wait_secs: (t - a.compute_end).max(0.0),
            bytes_sent: stats.bytes_sent.saturating_sub(s.stats_mark.bytes_sent),
            bytes_received: stats
                .bytes_received
                .saturating_sub(s.stats_mark.bytes_received),
            frames_dropped: s.dropped - s.dropped_mark,
        });
        s.stats_mark = stats;
        s.dropped_mark = s.dropped;
        s.done += 1;
        s.ready_at = t;
        if s.done < s.target {
            let next = self.peers[rank].round();
            self.push(t, next, rank, rank, EventKind::Start);
        } else {
            self.unfinished -= 1;
        }
        if self.track_consensus {
            self.add_to_consensus(rank, a.round, t);
        }
        Ok(())
    }

    /// Adds peer `rank`'s parameters after `round` to that round's Ξ²; records Ξ² once all
    /// n have finished it.
    fn add_to_consensus(&mut self, rank: Rank, round: u64, t: f64) {
        let n = self.n();
        let x = self.peers[rank].params();
        let p = self
            .pending
            .entry(round)
            .or_insert_with(|| Pending::new(n, x, t));
        p.add(rank, x, t);
        if p.count == n {
            if let Some(p) = self.pending.remove(&round) {
                self.consensus.push(ConsensusPoint {
                    round,
                    xi2: p.xi2(),
                    at_secs: p.end,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running form agrees with the two-pass formula, also far from the origin, where
    /// (1/n) Σ ‖x_i‖² − ‖x̄‖² without the shift would lose every digit in f64.
    #[test]
    fn the_running_consensus_distance_matches_the_two_pass_one_far_from_zero() {
        let (n, d) = (16, 1000);
        for offset in [0.0f32, 1e4] {
            let xs: Vec<Vec<f32>> = (0..n)
                .map(|i| {
                    (0..d)
                        .map(|k| offset + 1e-3 * (unit(7, 1, i as u64, k as u64) as f32 - 0.5))
                        .collect()
                })
                .collect();
            let (expected, _) = consensus_distance(xs.iter().map(Vec::as_slice));
            // Peers finish in another order than their ranks; the first one is the shift.
            let mut p = Pending::new(n, &xs[5], 0.0);
            for i in (0..n).rev() {
                p.add(i, &xs[i], i as f64);
            }
            p.add(3, &xs[0], 99.0); // a repeat is ignored
            assert_eq!(p.count, n);
            assert_eq!(p.end, (n - 1) as f64);
            let got = p.xi2();
            assert!(
                (got - expected).abs() <= 1e-9 * expected,
                "offset {offset}: running Ξ² = {got:e}, two-pass Ξ² = {expected:e}"
            );
        }
    }
}
