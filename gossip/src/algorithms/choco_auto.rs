//! CHOCO-SGD with a compressor chosen per link from the link's measured bandwidth
//! (`--algorithm choco-auto`): a slow link carries a smaller message, so that it does not
//! set the pace of the whole graph.
//!
//! # The algorithm
//!
//! CHOCO-SGD ([`crate::Choco`], Koloskova, Stich & Jaggi 2019, Algorithm 2) sends one
//! message q_i = Q(x_i − x̂_i) to every neighbour, so every link carries the same bytes and
//! a synchronous round lasts as long as the slowest link takes to move them. Here every
//! *link* keeps its own public copy: for each neighbour j, peer i keeps x̂_{i→j} (what j
//! knows of x_i) and x̂_{j→i} (what it knows of x_j), and round t (g_i the gradient):
//!
//! ```text
//! x_i^(t+½)        = x_i^(t) − η g_i
//! q_{i→j}          = Q_ij(x_i^(t+½) − x̂_{i→j})              sent to j only
//! x̂_{i→j}         += q_{i→j}      (and on j: x̂_{i→j} += q_{i→j})
//! x_i^(t+1)        = x_i^(t+½) + Σ_j γ_ij w_ij (x̂_{j→i} − x̂_{i→j})
//! ```
//!
//! with Q_ij the compressor of link i → j this round, chosen by i ([below](#choosing-q_ij)),
//! and γ_ij the edge's consensus step: [`ChocoAutoConfig::dense_gamma`] (0.5) when both
//! directions of the edge carried an exact or cast message this round (identity, fp16,
//! bf16), else [`ChocoAutoConfig::gamma`] (0.1) — the steps `--algorithm choco` takes by
//! default for those compressors. Each end knows both operators of the round (its own, and
//! the one named in the message it received), so both take the same γ_ij, and mixing with
//! γ_ij w_ij symmetric keeps the average. A dense link thus mixes as fast as plain gossip
//! while a compressed one stays stable (before per-edge steps, one γ = 0.3 on every edge
//! of an 8-ring with one top-k link stalled at Ξ²/Ξ²(0) ≈ 3·10⁻⁵ in this module's test).
//! With one operator on every link the copies x̂_{i→j} of all j coincide and this is
//! Algorithm 2; with a different one per link each edge runs its own CHOCO estimate.
//! Mixing keeps the network average exactly for a symmetric W (so this needs an undirected
//! graph): Σ_i Σ_j w_ij x̂_{j→i} = Σ_j Σ_i w_ji x̂_{j→i} is the second sum renamed. Memory:
//! (2 + 2·degree)·d floats (x_i, the scratch difference, two copies per neighbour).
//! Receivers need not know Q_ij: a `murmur_compress` message names its operator.
//!
//! # Choosing Q_ij
//!
//! Each link's bandwidth B_j (bytes/s) is measured by the transport and the receivers'
//! reports ([`crate::mixing::link_meter`]: the median of the last 16 frames of at least 16 KiB,
//! first to last byte; each direction judged by its receiver, reported every 4 rounds).
//!
//! Every round has the communication budget
//!
//! ```text
//! T = max(fastest link's time for a dense message, κ · C)
//! ```
//!
//! with C the median compute time of the last rounds (from a round's end to the next
//! `begin_round`) and κ = [`ChocoAutoConfig::compute_share`]. Q_ij is the least
//! compressing operator of the ladder (identity, fp16, int8, top-k from 25% down to
//! 0.1%) whose largest message fits (1 + [`SLACK`]) · T · B_j (links measured within 25% of
//! the fastest one stay dense: equal links differ by a few percent); a link whose receiver
//! has not reported it yet sends dense (the receiver times those frames and reports every 4
//! rounds; the estimate of the other direction is not taken for it). On equal links everything stays dense; a link k times
//! slower than the fastest one gets a message about k times smaller.
//!
//! Not supported: the skip straggler policy, a returning peer and resuming from a
//! checkpoint (refused with an error); departures re-weight as for CHOCO-SGD.

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern,
    ProtocolOption, Resume, RunSetup,
};
use crate::BuildError;
use murmur_compress::CompressorSpec;
use std::time::{Duration, Instant};

use murmur_compress::{Compressor, OperatorId};
use murmur_topology::MixingMatrix;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::mixing::exchange::{max_lead, Exchange, ExchangeParams};
use crate::mixing::link_meter::{LinkMeter, MeterConfig};
use crate::{Gossip, GossipError, GossipEvent, LinkChoice, MembershipError, Rank};

/// Configuration of one [`ChocoAuto`] peer.
#[derive(Debug, Clone)]
pub struct ChocoAutoConfig {
    /// This peer's rank i.
    pub rank: Rank,
    /// w_ii.
    pub self_weight: f64,
    /// (j, w_ij) for every neighbour j ≠ i (W symmetric: the same peers receive x_i).
    pub in_weights: Vec<(Rank, f64)>,
    /// Learning rate η.
    pub lr: f32,
    /// Consensus step size γ ∈ (0, 1] of an edge that carried a compressed message in
    /// either direction this round.
    pub gamma: f32,
    /// Consensus step size of an edge whose messages were both exact or casts (identity,
    /// fp16, bf16) this round.
    pub dense_gamma: f32,
    /// How long a round may wait for its messages.
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
    /// Seed of the RNG handed to the compressors.
    pub seed: u64,
    /// How many rounds a neighbour can be ahead (1 on an undirected graph).
    pub max_lead_rounds: u64,
    /// κ: the share of the compute time a round's communication may take (default 0.25).
    pub compute_share: f64,
    /// How the links are measured and reported ([`crate::mixing::link_meter`]).
    pub meter: MeterConfig,
}

impl ChocoAutoConfig {
    /// Peer `rank` of symmetric `w` (n×n) with the defaults.
    ///
    /// # Errors
    /// A message if `w` is not symmetric.
    pub fn from_matrix(w: &MixingMatrix, rank: Rank, lr: f32, gamma: f32) -> Result<Self, String> {
        crate::mixing::check_symmetric(w)?;
        Ok(ChocoAutoConfig {
            rank,
            self_weight: w.get(rank, rank),
            in_weights: w.in_weights(rank),
            lr,
            gamma,
            dense_gamma: 0.5,
            round_timeout: Duration::from_secs(60),
            max_payload_bytes: u32::MAX,
            seed: rank as u64,
            max_lead_rounds: max_lead(w, rank),
            compute_share: 0.25,
            meter: MeterConfig::default(),
        })
    }
}

/// The operators a link can be given, from the least to the most compressing, each with
/// the largest message it writes for d coordinates.
pub struct Ladder {
    rungs: Vec<(CompressorSpec, Box<dyn Compressor>, usize)>,
}

/// How much a link's message may exceed T · B_j: 25%.
pub const SLACK: f64 = 0.25;

/// Top-k ratios of the ladder below int8.
const TOPK_RATIOS: [f64; 8] = [0.25, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001];

impl Ladder {
    /// identity, fp16, int8 and top-k at [`TOPK_RATIOS`], for d coordinates.
    ///
    /// # Panics
    /// If d = 0.
    pub fn new(d: usize) -> Self {
        assert!(d > 0, "d must be positive");
        let mut specs = vec![
            CompressorSpec::Identity,
            CompressorSpec::Fp16,
            CompressorSpec::Int8 { bucket: 128 },
        ];
        specs.extend(TOPK_RATIOS.iter().map(|&ratio| CompressorSpec::TopK {
            ratio,
            layerwise: false,
        }));
        let mut rungs: Vec<(CompressorSpec, Box<dyn Compressor>, usize)> = Vec::new();
        for spec in specs {
            let c = spec.build(None).expect("the ladder's specs are valid");
            let bytes = c.max_encoded_len(d);
            // A rung must be smaller than the one before it (top-k of a tiny d is not).
            if rungs.last().is_none_or(|r| bytes < r.2) {
                rungs.push((spec, c, bytes));
            }
        }
        Ladder { rungs }
    }

    /// The least compressing rung whose message fits `budget` bytes, else the last.
    pub fn fit(&self, budget: f64) -> usize {
        self.rungs
            .iter()
            .position(|r| r.2 as f64 <= budget)
            .unwrap_or(self.rungs.len() - 1)
    }

    /// The operator of rung `k`.
    pub fn spec(&self, k: usize) -> &CompressorSpec {
        &self.rungs[k].0
    }

    /// The largest message of rung `k`, in bytes.
    pub fn bytes(&self, k: usize) -> usize {
        self.rungs[k].2
    }

    /// How many rungs.
    pub fn len(&self) -> usize {
        self.rungs.len()
    }

    /// Never: there is always the identity.
    pub fn is_empty(&self) -> bool {
        self.rungs.is_empty()
    }
}

/// Whether an operator is exact or a cast (the steps of `--algorithm choco` differ there).
fn is_dense(spec: &CompressorSpec) -> bool {
    matches!(
        spec,
        CompressorSpec::Identity | CompressorSpec::Fp16 | CompressorSpec::Bf16
    )
}

/// [`is_dense`] for an operator named by a message.
fn is_dense_id(id: OperatorId) -> bool {
    matches!(
        id,
        OperatorId::Identity | OperatorId::Fp16 | OperatorId::Bf16
    )
}

/// One peer of CHOCO-SGD with per-link compressors, a sans-I/O state machine; see the
/// [module docs](self). While a round mixes, [`Gossip::params`] returns x^(t+½); after
/// [`GossipEvent::Mixed`], x^(t+1).
pub struct ChocoAuto {
    cfg: ChocoAutoConfig,
    ex: Exchange,
    rng: StdRng,
    ladder: Ladder,
    x: Vec<f32>,
    diff: Vec<f32>,
    /// x̂_{i→j} per neighbour (index into `cfg.in_weights`).
    own: Vec<Vec<f32>>,
    /// x̂_{j→i} per neighbour.
    copies: Vec<Vec<f32>>,
    /// Each link's bandwidth, the compute time, the link-rate reports.
    meter: LinkMeter,
    /// Per neighbour: the operator of its message of the mixing round (`None` before one
    /// came, or when the round stood in for it).
    incoming: Vec<Option<OperatorId>>,
    /// Per neighbour: this round's rung, and rounds sent per rung.
    choice: Vec<usize>,
    used: Vec<Vec<u64>>,
    reweighting: crate::mixing::reweight::Reweighting,
}

impl ChocoAuto {
    /// Peer from `cfg` with x_i^(0) = `x0` (`[d]`, d > 0); the copies start at 0.
    pub fn new(cfg: ChocoAutoConfig, x0: Vec<f32>) -> Self {
        let d = x0.len();
        let k = cfg.in_weights.len();
        let neighbours: Vec<Rank> = cfg.in_weights.iter().map(|&(j, _)| j).collect();
        let ex = Exchange::new(ExchangeParams {
            rank: cfg.rank,
            in_neighbors: neighbours.clone(),
            out_neighbors: neighbours.clone(),
            d,
            round_timeout: cfg.round_timeout,
            max_payload_bytes: cfg.max_payload_bytes,
            max_lead_rounds: cfg.max_lead_rounds,
            skip_after: None,
            auto_deadline: None,
            skip_mode: crate::mixing::exchange::SkipMode::Late,
            part: None,
        });
        let ladder = Ladder::new(d);
        ChocoAuto {
            rng: StdRng::seed_from_u64(cfg.seed),
            ex,
            x: x0,
            diff: vec![0.0; d],
            own: vec![vec![0.0; d]; k],
            copies: vec![vec![0.0; d]; k],
            meter: LinkMeter::new(cfg.rank, neighbours, cfg.meter),
            choice: vec![0; k],
            incoming: vec![None; k],
            used: vec![vec![0; ladder.len()]; k],
            ladder,
            reweighting: Default::default(),
            cfg,
        }
    }

    /// The links: measured bandwidth and chosen operators, in neighbour order.
    pub fn links(&self) -> Vec<LinkChoice> {
        self.cfg
            .in_weights
            .iter()
            .enumerate()
            .map(|(k, &(peer, _))| LinkChoice {
                peer,
                bytes_per_sec: self.meter.rate_to(k),
                what: "compressor",
                choice: self.ladder.spec(self.choice[k]).to_string(),
                rounds_by_choice: self.used[k]
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(r, &n)| (self.ladder.spec(r).to_string(), n))
                    .collect(),
            })
            .collect()
    }

    /// This round's communication budget T in seconds ([module docs](self#choosing-q_ij));
    /// `None` before any link was measured.
    pub fn budget_secs(&self) -> Option<f64> {
        let fastest = self.meter.fastest()?;
        let dense = self.ladder.bytes(0) as f64 / fastest;
        let share = self.meter.compute_secs().unwrap_or(0.0) * self.cfg.compute_share;
        Some(dense.max(share))
    }

    /// Chooses every link's rung for this round.
    fn choose(&mut self) {
        let budget = self.budget_secs();
        for k in 0..self.choice.len() {
            self.choice[k] = match (budget, self.meter.rate_to(k)) {
                (Some(t), Some(b)) => self.ladder.fit((1.0 + SLACK) * t * b),
                _ => 0,
            };
            self.used[k][self.choice[k]] += 1;
        }
    }

    fn absorb(&mut self, idx: usize, payload: &[u8]) -> Result<(), GossipError> {
        let from = self.cfg.in_weights[idx].0;
        murmur_compress::decode_add(payload, 1.0, &mut self.copies[idx])
            .map_err(|cause| GossipError::Payload { from, cause })?;
        // Decoded, so the first byte names a known operator.
        self.incoming[idx] = payload.first().and_then(|&b| OperatorId::from_u8(b));
        Ok(())
    }

    /// Mixes if every message of the round is in; `now` (if known) starts the next
    /// compute-time sample.
    fn finish_if_complete(&mut self, now: Option<Instant>) {
        if !self.ex.is_complete() {
            return;
        }
        // x^(t+1) = x^(t+½) + Σ_j γ_ij w_ij (x̂_{j→i} − x̂_{i→j}), summed in f64.
        let steps: Vec<f64> = (0..self.cfg.in_weights.len())
            .map(|k| {
                let dense = is_dense(self.ladder.spec(self.choice[k]))
                    && self.incoming[k].is_some_and(is_dense_id);
                let g = if dense {
                    self.cfg.dense_gamma
                } else {
                    self.cfg.gamma
                };
                f64::from(g) * self.cfg.in_weights[k].1
            })
            .collect();
        for (c, x) in self.x.iter_mut().enumerate() {
            let mut mix = 0.0f64;
            for ((step, theirs), mine) in steps.iter().zip(&self.copies).zip(&self.own) {
                mix += step * (f64::from(theirs[c]) - f64::from(mine[c]));
            }
            *x = (f64::from(*x) + mix) as f32;
        }
        self.ex.finish();
        self.incoming.fill(None);
        self.meter.round_mixed(now);
    }
}

impl Gossip for ChocoAuto {
    /// Starts round t from `x` = x_i^(t) and the gradient g_i (none: gossip only). A
    /// non-finite x^(t+½) − x̂_{i→j} reports [`GossipEvent::Diverged`] and the round never
    /// completes.
    ///
    /// # Panics
    /// If `x` or `grad` does not have length d, or the previous round is still mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.ex.assert_idle();
        let d = self.x.len();
        assert_eq!(x.len(), d, "x must have length d");
        self.meter.round_begins(now, self.ex.round(), d);
        self.reweighting.apply(
            self.ex.round(),
            &mut self.cfg.self_weight,
            &mut self.cfg.in_weights,
        );
        // x^(t+½) = x − η g
        crate::mixing::local_step(&mut self.x, x, grad, self.cfg.lr);
        self.choose();
        let mut bad = None;
        let (ladder, choice, own, diff, xh, rng) = (
            &mut self.ladder,
            &self.choice,
            &mut self.own,
            &mut self.diff,
            &self.x,
            &mut self.rng,
        );
        let begun = self.ex.begin_per_link(now, |k, out| {
            for ((q, a), b) in diff.iter_mut().zip(xh).zip(&own[k]) {
                *q = a - b;
            }
            let len = ladder.rungs[choice[k]].1.compress(diff, rng, out);
            // x̂_{i→j} += q_{i→j}, decoded from the bytes j gets.
            if let Err(e) = murmur_compress::decode_add(&out[out.len() - len..], 1.0, &mut own[k]) {
                bad.get_or_insert(e);
            }
            len
        });
        if let Some(e) = bad {
            let round = self.ex.round();
            self.ex
                .push_event(crate::mixing::choco_diverged(self.cfg.rank, round, e));
            return;
        }
        for (idx, payload) in begun.early {
            match self.absorb(idx, &payload) {
                Ok(()) => self.ex.absorbed_early(idx),
                Err(e) => debug_assert!(false, "early frame failed late: {e}"),
            }
        }
        self.finish_if_complete(Some(now));
    }

    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let max = self.cfg.max_payload_bytes;
        if LinkMeter::is_report(frame, max) {
            return self.meter.on_report(from, frame, max);
        }
        match self.ex.check(now, from, frame)? {
            crate::mixing::exchange::Arrival::Current { idx, payload } => {
                self.absorb(idx, payload)?;
                self.ex.accept(now, idx, frame.len());
            }
            crate::mixing::exchange::Arrival::Buffered => {}
            // No skip policy: the exchange never asks for one.
            crate::mixing::exchange::Arrival::Skip(_) => {}
        }
        self.finish_if_complete(Some(now));
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        // Without the skip policy the exchange only reports the round timeout.
        let _ = self.ex.handle_timeout(now);
        self.finish_if_complete(Some(now));
    }

    fn poll_transmit(&mut self) -> Option<crate::Transmit> {
        self.ex.poll_transmit().or_else(|| self.meter.poll_report())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.ex.poll_timeout()
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.ex.poll_event()
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    fn round(&self) -> u64 {
        self.ex.round()
    }

    /// The exchange's counters, the link-rate reports included.
    fn stats(&self) -> crate::GossipStats {
        let mut s = self.ex.stats();
        let (frames, bytes) = self.meter.sent();
        s.frames_sent += frames;
        s.bytes_sent += bytes;
        s
    }

    fn out_peers(&self) -> Vec<Rank> {
        self.ex.out_peers()
    }

    fn in_peers(&self) -> Vec<Rank> {
        self.ex.in_peers()
    }

    /// A bandwidth sample of the link from `from` ([`LinkMeter::observe`]).
    fn observe_link(&mut self, from: Rank, bytes: usize, secs: f64) {
        self.meter.observe(from, bytes, secs);
    }

    fn link_choices(&self) -> Vec<LinkChoice> {
        self.links()
    }

    /// Re-weights with `w` (the survivors' W') from the next round on, as CHOCO-SGD.
    fn peer_left(&mut self, gone: Rank, w: &MixingMatrix) -> Result<(), MembershipError> {
        let (wii, wij) =
            crate::mixing::reweight::weights_without(self.cfg.rank, &self.cfg.in_weights, w, gone)?;
        if let Some(idx) = self.ex.leave(gone) {
            self.ex.stood_in(idx);
            self.finish_if_complete(None);
        }
        let from = self.ex.round() + u64::from(!self.ex.is_idle());
        self.reweighting.schedule(from, wii, wij);
        Ok(())
    }
}

/// CHOCO-SGD with per-link compressors in the [`crate::registry`].
pub struct ChocoAutoAlgorithm;

/// The registry's entry.
pub const CHOCO_AUTO: ChocoAutoAlgorithm = ChocoAutoAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Symmetric),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::PerLink,
    // Not used to compress (each link's is chosen): it sets the default γ of a compressing
    // CHOCO (0.1).
    default_compressor: CompressorSpec::TopK {
        ratio: 0.01,
        layerwise: false,
    },
    options: &[ProtocolOption::GAMMA],
    skips_stragglers: false,
    departures: Departures::TrainOn,
    resume: Resume::No,
};

impl Algorithm for ChocoAutoAlgorithm {
    fn name(&self) -> &'static str {
        "choco-auto"
    }
    fn about(&self) -> &'static str {
        "CHOCO-SGD with a compressor per link, chosen each round from the link's measured \
         bandwidth so that a slow link sends a smaller message (--gamma: every edge's step; \
         default 0.5 on dense edges, 0.1 on compressed ones)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// Refuses `--compressor`: each link's is chosen from its measured bandwidth.
    fn check(&self, run: &RunSetup<'_>) -> Result<(), BuildError> {
        match &run.options.compressor {
            Some(spec) => Err(BuildError::Options(format!(
                "--compressor {spec}: choco-auto chooses each link's compressor from its \
                 measured bandwidth (identity, fp16, int8, top-k 25% to 0.1%); leave \
                 --compressor out, or use --algorithm choco for one compressor on every link"
            ))),
            None => Ok(()),
        }
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        // --gamma sets every edge's step; by default 0.1 for compressed edges, 0.5 for dense.
        let gamma = ctx.options.gamma(self);
        let mut cfg = ChocoAutoConfig::from_matrix(&ctx.topology.w, ctx.rank, ctx.lr, gamma)
            .map_err(|e| BuildError::Options(format!("choco-auto: {e}")))?;
        if let Some(g) = ctx.options.gamma {
            cfg.dense_gamma = g;
        }
        cfg.round_timeout = ctx.round_timeout;
        cfg.max_payload_bytes = ctx.max_payload_bytes;
        cfg.seed = ctx.seed;
        Ok(Box::new(ChocoAuto::new(cfg, ctx.x0)))
    }
}
