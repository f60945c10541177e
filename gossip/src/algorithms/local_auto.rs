//! Local-SGD gossip (`--algorithm local-auto`) and decentralized DiLoCo (`--algorithm
//! diloco-auto`) with a communication period per link, set by the link itself: each link
//! exchanges the two ends' models as fast as it can carry them, and no round waits for a
//! slow link.
//!
//! # The algorithm
//!
//! Local-SGD gossip ([`crate::LocalSgd`] around [`crate::DPsgd`]) mixes with every neighbour
//! every H steps and waits for all of them, so one slow link sets the pace of the graph. Here
//! every edge (i, j) runs its own exchange of *snapshots*: at a communication round where
//! the edge is idle, each end sends its model θ_i^(k) = y_i (the k-th snapshot of that
//! edge; y_i after the H local steps) and keeps a copy, and the round that completes after
//! the other end's k-th snapshot θ_j^(k) has arrived mixes it; the edge is then idle again:
//!
//! ```text
//! x_i ← y_i + Σ_{j: θ_j^(k) arrived} w_ij (θ_j^(k) − θ_i^(k))
//! ```
//!
//! A round waits (at most until its deadline, below) for the snapshots of the *fast* links
//! it sent on: those arrive within the round, so a fast edge sends and mixes θ = y every
//! round, exactly as local-SGD gossip. A slow link's snapshot is not waited for: the rounds
//! go on without it and the round after it arrived mixes it, p rounds after it was sent if
//! the link took p rounds to carry it. So each link's period is its own transfer time in
//! rounds, and the slow link does not set the pace of the others. Both ends mix the same
//! pair (θ_i^(k), θ_j^(k)) with the same weight w_ij = w_ji (W symmetric, an undirected
//! graph), so the two corrections cancel and the network average is kept exactly, whenever
//! each end mixes; the ends need not agree on which links are fast. The late mixing of a slow
//! link is the delayed-message gossip of asynchronous decentralized SGD (Lian et al. 2018,
//! "Asynchronous decentralized parallel stochastic gradient descent"; Assran et al. 2019's
//! overlap SGP), with a per-edge delay that the link's bandwidth decides.
//!
//! **Which links are fast, and the deadline.** Each link's bandwidth is measured as for
//! [`crate::ChocoAuto`] ([`crate::mixing::link_meter`]: each direction by its receiver, reported to
//! the sender every 4 rounds), and a link is as fast as its slower direction — an exchange
//! needs both. A link is slow when it takes more than [`SLOW_FACTOR`] (3) times the fastest
//! link's time to carry a model; the others are fast, and so is a link not measured yet (round 0 waits for
//! every link, and measures it). A round waits for its fast links' snapshots until they are
//! in, or until its deadline: [`DEADLINE_FACTOR`] (4) times the longer of its awaited links'
//! transfer times added up (their models share the NICs) and the median compute time of a
//! round — so a neighbour a little slower to compute is waited for, and a stalled one is
//! not (its snapshot is mixed when it comes). Before any link was measured a round waits up to the round timeout.
//!
//! **DiLoCo.** `--algorithm diloco-auto` puts the same per-link mixing under decentralized
//! DiLoCo ([`crate::DiLoCo`], as `diloco-gossip`): H inner steps, then the models that have
//! arrived are mixed this way, and the outer step is taken on each peer's own anchor; a slow
//! link's models reach the outer steps later instead of delaying them.
//!
//! Each edge has one exchange in flight (an end sends snapshot k + 1 only after it mixed
//! k), so a link never queues more than one model per direction, and an end receives
//! snapshot k or k + 1 of a neighbour only. Messages are the models in f32
//! (`murmur_compress`'s identity encoding), the header's round field carrying k. Memory: a
//! snapshot and up to two received models per neighbour, (1 + 3·degree)·d floats at most.
//!
//! Not supported: the skip straggler policy (nothing waits), departures, resuming from a
//! checkpoint (refused with an error); a directed graph (no symmetric pair to cancel).

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern,
    ProtocolOption, Resume,
};
use crate::BuildError;
use murmur_compress::CompressorSpec;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use murmur_compress::Compressor;
use murmur_topology::MixingMatrix;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::mixing::link_meter::{LinkMeter, MeterConfig};
use crate::{Gossip, GossipError, GossipEvent, GossipStats, LinkChoice, Rank, Transmit};

/// A link is slow (not waited for) when it takes more than this many times the fastest
/// link's time to carry a model: 3, so that measurement noise between equal links (a few
/// tens of percent on a busy host) never makes one of them slow.
pub const SLOW_FACTOR: f64 = 3.0;
/// A round's deadline: this many times the longer of its awaited links' transfer times
/// added up and the median compute time of a round.
pub const DEADLINE_FACTOR: f64 = 4.0;

/// One edge's exchange of snapshots.
#[derive(Debug, Clone, Default)]
struct Edge {
    /// Snapshots sent (the next one's index) and mixed; one in flight when they differ.
    sent: u64,
    mixed: u64,
    /// θ_i^(k) of the snapshot in flight.
    mine: Vec<f32>,
    /// The neighbour's snapshots received and not yet mixed, by index (k or k + 1).
    theirs: BTreeMap<u64, Vec<f32>>,
    /// The communication round the snapshot in flight was sent at.
    sent_at: u64,
    /// The period of the last exchange (rounds from sending to mixing, both counted: 1 for
    /// an exchange within one round), and how many exchanges had each period.
    last_period: Option<u64>,
    periods: BTreeMap<u64, u64>,
}

/// One peer of local-SGD gossip's mixing with per-link periods: a sans-I/O state machine
/// whose rounds are communication rounds ([`crate::LocalSgd`] takes the local steps). See
/// the [module docs](self).
pub struct AsyncLinks {
    rank: Rank,
    /// The longest a round waits (before any link was measured).
    round_timeout: Duration,
    /// y_i of the round that is mixing.
    y: Vec<f32>,
    /// While a round mixes: the edges it waits for, and until when.
    awaited: Vec<bool>,
    deadline: Option<Instant>,
    mixing: bool,
    /// (j, w_ij) for every neighbour j ≠ i.
    weights: Vec<(Rank, f64)>,
    max_payload_bytes: u32,
    x: Vec<f32>,
    edges: Vec<Edge>,
    identity: Box<dyn Compressor>,
    rng: StdRng,
    round: u64,
    outgoing: std::collections::VecDeque<Transmit>,
    events: std::collections::VecDeque<GossipEvent>,
    stats: GossipStats,
    meter: LinkMeter,
}

impl AsyncLinks {
    /// Peer `rank` of symmetric `w` (n×n) from `x0: [d]` (d > 0).
    ///
    /// # Errors
    /// A message if `w` is not symmetric.
    pub fn new(
        w: &MixingMatrix,
        rank: Rank,
        x0: Vec<f32>,
        max_payload_bytes: u32,
        round_timeout: Duration,
    ) -> Result<Self, String> {
        crate::mixing::check_symmetric(w)?;
        let weights = w.in_weights(rank);
        let neighbours: Vec<Rank> = weights.iter().map(|&(j, _)| j).collect();
        let meter = MeterConfig::default();
        Ok(AsyncLinks {
            rank,
            round_timeout,
            y: x0.clone(),
            awaited: vec![false; weights.len()],
            deadline: None,
            mixing: false,
            edges: vec![Edge::default(); weights.len()],
            meter: LinkMeter::new(rank, neighbours, meter),
            weights,
            max_payload_bytes,
            x: x0,
            identity: CompressorSpec::Identity
                .build(None)
                .expect("the identity operator builds"),
            rng: StdRng::seed_from_u64(rank as u64),
            round: 0,
            outgoing: Default::default(),
            events: Default::default(),
            stats: GossipStats::default(),
        })
    }

    /// The links: measured bandwidth and the rounds each exchange took, in neighbour order.
    pub fn links(&self) -> Vec<LinkChoice> {
        self.weights
            .iter()
            .zip(&self.edges)
            .enumerate()
            .map(|(k, (&(peer, _), e))| LinkChoice {
                peer,
                bytes_per_sec: self.meter.rate_either_way(k),
                what: "period",
                choice: e.last_period.map_or("-".to_string(), |p| p.to_string()),
                rounds_by_choice: e.periods.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
            })
            .collect()
    }

    /// Sends y_i on every idle edge.
    fn start_exchanges(&mut self) {
        let d = self.x.len();
        for (k, e) in self.edges.iter_mut().enumerate() {
            if e.sent != e.mixed {
                continue;
            }
            e.mine.clear();
            e.mine.extend_from_slice(&self.y);
            let mut frame = vec![0u8; crate::FRAME_HEADER_LEN];
            let len = self.identity.compress(&self.y, &mut self.rng, &mut frame);
            let header = crate::FrameHeader {
                kind: crate::FrameKind::Gossip,
                sender: self.rank,
                round: e.sent,
                dim: d as u32,
                payload_len: len as u32,
            };
            frame[..crate::FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
            self.stats.frames_sent += 1;
            self.stats.bytes_sent += frame.len() as u64;
            self.outgoing.push_back(Transmit {
                to: self.weights[k].0,
                frame: crate::Bytes::from(frame),
            });
            e.sent_at = self.round;
            e.sent += 1;
        }
    }

    /// Whether neighbour `k`'s snapshot of the exchange in flight is in.
    fn arrived(&self, k: usize) -> bool {
        let e = &self.edges[k];
        e.sent > e.mixed && e.theirs.contains_key(&e.mixed)
    }

    /// Which edges in flight this round waits for (the fast and the unmeasured links), and
    /// its deadline ([module docs](self#which-links-are-fast-and-the-deadline)).
    fn plan_wait(&mut self, now: Instant) {
        let model_bytes = (4 * self.x.len()) as f64;
        let fastest = self.meter.fastest().map(|f| model_bytes / f);
        let mut awaited_secs: f64 = 0.0;
        for (k, e) in self.edges.iter().enumerate() {
            let transfer = self.meter.rate_either_way(k).map(|r| model_bytes / r);
            let fast = match (fastest, transfer) {
                (Some(f), Some(t)) => t <= SLOW_FACTOR * f,
                _ => true,
            };
            self.awaited[k] = fast && e.sent > e.mixed;
            if self.awaited[k] {
                // The awaited models share this peer's and its neighbours' NICs: budget
                // their transfers one after another.
                awaited_secs += transfer.unwrap_or(0.0);
            }
        }
        let wait = match fastest {
            Some(_) => {
                let compute = self.meter.compute_secs().unwrap_or(0.0);
                Duration::from_secs_f64(DEADLINE_FACTOR * awaited_secs.max(compute))
            }
            None => self.round_timeout,
        };
        self.deadline = Some(now + wait);
    }

    /// Completes the round if every awaited snapshot is in, or `force` (the deadline).
    fn finish_if_complete(&mut self, now: Instant, force: bool) {
        if !self.mixing {
            return;
        }
        if !force && (0..self.edges.len()).any(|k| self.awaited[k] && !self.arrived(k)) {
            return;
        }
        self.x.copy_from_slice(&self.y);
        self.mix_arrived();
        self.mixing = false;
        self.deadline = None;
        self.events
            .push_back(GossipEvent::Mixed { round: self.round });
        self.round += 1;
        self.meter.round_mixed(Some(now));
    }

    /// Mixes every edge whose neighbour's snapshot of the exchange in flight has arrived:
    /// x_i += w_ij (θ_j^(k) − θ_i^(k)), summed in f64 per coordinate.
    fn mix_arrived(&mut self) {
        let round = self.round;
        let mut pairs: Vec<(f64, &[f32], &[f32])> = Vec::new();
        for (e, &(_, w)) in self.edges.iter().zip(&self.weights) {
            if e.sent > e.mixed {
                if let Some(theirs) = e.theirs.get(&e.mixed) {
                    pairs.push((w, theirs, &e.mine));
                }
            }
        }
        if !pairs.is_empty() {
            for (c, x) in self.x.iter_mut().enumerate() {
                let mut delta = 0.0f64;
                for (w, theirs, mine) in &pairs {
                    delta += w * (f64::from(theirs[c]) - f64::from(mine[c]));
                }
                *x = (f64::from(*x) + delta) as f32;
            }
        }
        for e in &mut self.edges {
            if e.sent > e.mixed && e.theirs.remove(&e.mixed).is_some() {
                e.mixed += 1;
                // Sent and mixed in the same round: every round, period 1.
                let period = round - e.sent_at + 1;
                e.last_period = Some(period);
                *e.periods.entry(period).or_default() += 1;
            }
        }
    }
}

impl Gossip for AsyncLinks {
    /// Communication round t from `x: [d]` = y_i (the model after the local steps; `grad`
    /// is ignored: the wrapper took the steps): sends y_i on the idle edges, and completes
    /// once the fast links' snapshots are in (or at the deadline), mixing every snapshot
    /// that arrived.
    ///
    /// # Panics
    /// If `x` is not `[d]`, or the previous round is still mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], _grad: Option<&[f32]>) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
        assert_eq!(x.len(), self.x.len(), "x must have length d");
        self.meter.round_begins(now, self.round, x.len());
        self.y.copy_from_slice(x);
        self.start_exchanges();
        self.mixing = true;
        self.plan_wait(now);
        self.finish_if_complete(now, false);
    }

    /// Keeps neighbour `from`'s snapshot until the next round mixes it.
    ///
    /// # Errors
    /// A malformed frame, a sender that is not a neighbour, a snapshot index other than
    /// the exchange in flight or the next one, a duplicate, or a payload that is not a
    /// `[d]` model; nothing changes then.
    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        if LinkMeter::is_report(frame, self.max_payload_bytes) {
            return self.meter.on_report(from, frame, self.max_payload_bytes);
        }
        let (h, payload) = crate::parse_frame(
            frame,
            self.max_payload_bytes,
            crate::FrameKind::Gossip,
            from,
        )?;
        let k = self
            .weights
            .iter()
            .position(|&(j, _)| j == from)
            .ok_or(GossipError::NotANeighbour(from))?;
        let d = self.x.len();
        if h.dim as usize != d {
            return Err(GossipError::DimensionMismatch {
                from,
                expected: d,
                got: h.dim as usize,
            });
        }
        let e = &mut self.edges[k];
        let (lo, hi) = (e.mixed, e.mixed + 1);
        if h.round < lo || h.round > hi {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo,
                hi,
            });
        }
        if e.theirs.contains_key(&h.round) {
            return Err(GossipError::Duplicate {
                from,
                round: h.round,
            });
        }
        let mut theirs = vec![0.0f32; d];
        murmur_compress::decode_into(payload, &mut theirs)
            .map_err(|cause| GossipError::Payload { from, cause })?;
        e.theirs.insert(h.round, theirs);
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame.len() as u64;
        self.finish_if_complete(now, false);
        Ok(())
    }

    /// At the deadline the round mixes what arrived and goes on without the rest.
    fn handle_timeout(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) {
            self.finish_if_complete(now, true);
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outgoing
            .pop_front()
            .or_else(|| self.meter.poll_report())
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

    /// Snapshots and link-rate reports.
    fn stats(&self) -> GossipStats {
        let mut s = self.stats;
        let (frames, bytes) = self.meter.sent();
        s.frames_sent += frames;
        s.bytes_sent += bytes;
        s
    }

    fn out_peers(&self) -> Vec<Rank> {
        crate::peer_set(self.rank, self.weights.iter().map(|&(j, _)| j))
    }

    fn in_peers(&self) -> Vec<Rank> {
        self.out_peers()
    }

    /// A bandwidth sample of the link from `from` ([`LinkMeter::observe`]), for the log.
    fn observe_link(&mut self, from: Rank, bytes: usize, secs: f64) {
        self.meter.observe(from, bytes, secs);
    }

    fn link_choices(&self) -> Vec<LinkChoice> {
        self.links()
    }
}

/// Local-SGD gossip with per-link periods in the [`crate::registry`].
pub struct LocalAutoAlgorithm;

/// The registry's entry.
pub const LOCAL_AUTO: LocalAutoAlgorithm = LocalAutoAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Symmetric),
    local_steps: Some(4),
    default_tau: 0,
    compresses: Compresses::Nothing,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::LOCAL_STEPS],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::No,
};

impl Algorithm for LocalAutoAlgorithm {
    fn name(&self) -> &'static str {
        "local-auto"
    }
    fn about(&self) -> &'static str {
        "Local-SGD gossip with a period per link: H local steps (--local-steps), then each \
         edge mixes the neighbours' models that have arrived and sends on the edges that are \
         free, so a slow link mixes less often and no round waits for it"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let (h, lr) = (ctx.options.local_steps(self), ctx.lr);
        let (w, rank, limit) = (&ctx.topology.w, ctx.rank, ctx.max_payload_bytes);
        let inner = AsyncLinks::new(w, rank, ctx.x0, limit, ctx.round_timeout)
            .map_err(|e| BuildError::Options(format!("local-auto: {e}")))?;
        Ok(Box::new(crate::LocalSgd::new(Box::new(inner), h, lr)))
    }
}
