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
//!
//! Memory: x_i, the mix Σ_j W_ij x_j being accumulated, and the outgoing message, each
//! `[d]` (the message smaller when compressed). With [`DPsgdConfig::in_place`] and the
//! identity compressor the mix is accumulated in x_i itself, and x_i^t, where a round
//! still needs it (a neighbour stood in for, or gone), is read back from the outgoing
//! message, which holds it exactly: two vectors instead of three.

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern,
    ProtocolOption, Resume, RunSetup,
};
use crate::BuildError;
use murmur_compress::CompressorSpec;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use murmur_compress::{Compressor, Identity, OperatorId};
use rand::rngs::StdRng;
use rand::SeedableRng;

use murmur_topology::MixingMatrix;

use crate::mixing::exchange::{max_lead, Exchange, ExchangeParams, Part, SkipAction, SKIP_HISTORY};
use crate::mixing::reweight::{weights_without, Reweighting};
use crate::mixing::robust::ClipRule;
use crate::{AlgorithmState, Gossip, GossipError, MembershipError, Rank, StateError};

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
    /// How long a round may wait for its messages before [`crate::GossipEvent::RoundTimedOut`].
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
    /// Straggler policy: `None` waits for every neighbour (up to `round_timeout`);
    /// `Some(deadline)` mixes a round without the neighbours whose frame has not arrived
    /// `deadline` after the round began ("skip"). Both ends of a skipped edge drop it for
    /// that round — the peer that skips sends a notice, the straggler drops the skipper's
    /// frame of that round (or, if it already mixed it, adds W_ij (x_i − x_j) of that
    /// round afterwards) — so every round's effective W stays doubly stochastic (W with
    /// the edge's weight moved onto both diagonals) and the network average is kept
    /// exactly. Needs a symmetric W.
    pub skip_after: Option<Duration>,
    /// With the skip policy: per-neighbour deadlines from observed arrival times, with
    /// `skip_after` as the longest ([`crate::AutoDeadline`]); `None`: `skip_after`
    /// for every neighbour.
    pub auto_deadline: Option<crate::mixing::exchange::AutoDeadline>,
    /// Accumulate the mix in x_i itself when the compressor is the identity (see the
    /// [module docs](self)): one `[d]` vector less, but while a round is mixing
    /// [`Gossip::params`] is the partial mix, not x_i^t. For drivers that read the
    /// parameters only between rounds (the simulator); a network peer may hand them to a
    /// restarted neighbour mid-round, so it leaves this off.
    pub in_place: bool,
    /// Byzantine-robust mixing: clip each neighbour's difference x_j − x_i to a radius
    /// ([`crate::mixing::robust`], ClippedGossip); `None`: plain gossip. The neighbours' models of
    /// a round are held (k vectors `[d]`, k the in-degree) until the round mixes, and the
    /// mix is not in place. Not with the skip straggler policy.
    pub robust: Option<ClipRule>,
    /// The part of a streamed message this peer mixes ([`crate::mixing::streaming`]):
    /// x is then that part's slice and its frames are parts. `None`: the whole x.
    pub(crate) part: Option<Part>,
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
            skip_after: None,
            auto_deadline: None,
            in_place: false,
            robust: None,
            part: None,
        }
    }
}

/// One peer of D-PSGD as a sans-I/O state machine (see the [module docs](self)).
pub struct DPsgd {
    cfg: DPsgdConfig,
    compressor: Box<dyn Compressor>,
    rng: StdRng,
    /// x_i (`[d]`), the parameters after the last completed round.
    x: Vec<f32>,
    /// Σ_j W_ij x_j − η g accumulated for the mixing round; empty when mixing in place.
    acc: Vec<f32>,
    /// Whether the mix accumulates in `x` ([`DPsgdConfig::in_place`] with the identity).
    in_place: bool,
    /// Rounds, frames, deadlines, events and counters.
    ex: Exchange,
    /// Changes of weights after departures and returns.
    reweighting: Reweighting,
    /// With the skip policy: this peer's x of the last rounds, (round, x: [d]).
    history: VecDeque<(u64, Vec<f32>)>,
    /// A correction learned between rounds, added to x when the next round begins.
    pending: Option<Vec<f32>>,
    /// With [`DPsgdConfig::robust`]: each in-neighbour's decoded x_j of the mixing round
    /// (`[d]`) and whether it has arrived.
    held: Vec<(Vec<f32>, bool)>,
    /// Neighbour contributions clipped by the robust rule, over the run.
    clipped: u64,
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
        let ex = Exchange::new(ExchangeParams {
            rank: cfg.rank,
            in_neighbors: cfg.in_weights.iter().map(|&(j, _)| j).collect(),
            out_neighbors: cfg.out_neighbors.clone(),
            d,
            round_timeout: cfg.round_timeout,
            max_payload_bytes: cfg.max_payload_bytes,
            max_lead_rounds: cfg.max_lead_rounds,
            skip_after: cfg.skip_after,
            auto_deadline: cfg.auto_deadline,
            skip_mode: crate::mixing::exchange::SkipMode::Drop,
            part: cfg.part,
        });
        let in_place =
            cfg.in_place && cfg.robust.is_none() && compressor.id() == OperatorId::Identity;
        let held = if cfg.robust.is_some() {
            cfg.in_weights
                .iter()
                .map(|_| (vec![0.0; d], false))
                .collect()
        } else {
            Vec::new()
        };
        DPsgd {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            compressor,
            x: x0,
            acc: if in_place { Vec::new() } else { vec![0.0; d] },
            in_place,
            ex,
            reweighting: Reweighting::default(),
            history: VecDeque::new(),
            pending: None,
            held,
            clipped: 0,
        }
    }

    /// Neighbour contributions the robust rule clipped so far (0 without one).
    pub fn clipped(&self) -> u64 {
        self.clipped
    }

    /// The configuration.
    pub fn config(&self) -> &DPsgdConfig {
        &self.cfg
    }

    /// Whether a round is mixing (begun, not yet [`crate::GossipEvent::Mixed`]).
    pub fn is_mixing(&self) -> bool {
        !self.ex.is_idle()
    }

    /// Carries out the straggler policy (see [`DPsgdConfig::skip_after`]).
    fn skip(&mut self, action: SkipAction) -> Result<(), GossipError> {
        match action {
            SkipAction::Nothing => Ok(()),
            SkipAction::StandIn(idx) => {
                // The round mixes this peer's own x_i in place of W_ij x_j.
                self.add_own(self.cfg.in_weights[idx].1 as f32);
                Ok(())
            }
            SkipAction::Correct {
                idx,
                round,
                payload,
            } => {
                let (from, w) = self.cfg.in_weights[idx];
                let own = self
                    .history
                    .iter()
                    .find(|(r, _)| *r == round)
                    .map(|(_, x)| x.clone())
                    .ok_or(GossipError::SkipTooOld { from, round })?;
                // Add w (x_i(round) − x_j(round)): to the round that is mixing, or to x at
                // the next round's beginning.
                let target: &mut Vec<f32> = if self.ex.is_idle() {
                    self.pending.get_or_insert_with(|| vec![0.0; own.len()])
                } else if self.in_place {
                    &mut self.x
                } else {
                    &mut self.acc
                };
                let w = w as f32;
                for (t, xi) in target.iter_mut().zip(&own) {
                    *t += w * xi;
                }
                murmur_compress::decode_add(&payload, -w, target).map_err(|source| {
                    GossipError::Payload {
                        from,
                        cause: source,
                    }
                })
            }
            // D-PSGD's exchange drops skipped frames (SkipMode::Drop): none is ever late.
            SkipAction::Late { idx, .. } => Err(GossipError::Skipped {
                from: self.cfg.in_weights[idx].0,
                round: self.ex.round(),
            }),
        }
    }

    /// The mix of the round in progress: `acc`, or `x` when mixing in place.
    fn mix(&mut self) -> &mut [f32] {
        if self.in_place {
            &mut self.x
        } else {
            &mut self.acc
        }
    }

    /// Adds `w · x_i^t` (this peer's parameters the round began from) to the mix.
    fn add_own(&mut self, w: f32) {
        if self.in_place {
            // The outgoing identity message is x_i^t, bit for bit.
            let own = self.ex.message();
            murmur_compress::decode_add(own, w, &mut self.x)
                .expect("this peer's own identity message decodes");
        } else {
            for (a, xi) in self.acc.iter_mut().zip(&self.x) {
                *a += w * xi;
            }
        }
    }

    /// Adds W_ij · x_j from the payload of in-neighbour `idx` (robust: holds x_j for the
    /// clipped mix). On `Err` nothing changed.
    fn absorb(&mut self, idx: usize, payload: &[u8]) -> Result<(), GossipError> {
        let (from, w) = self.cfg.in_weights[idx];
        let err = |source| GossipError::Payload {
            from,
            cause: source,
        };
        if self.cfg.robust.is_some() {
            let (buf, heard) = &mut self.held[idx];
            murmur_compress::decode_into(payload, buf).map_err(err)?;
            *heard = true;
            return Ok(());
        }
        murmur_compress::decode_add(payload, w as f32, self.mix()).map_err(err)
    }

    fn finish_if_complete(&mut self) {
        if self.ex.is_complete() {
            if let Some(rule) = self.cfg.robust {
                let neighbours: Vec<(f32, &[f32])> = self
                    .held
                    .iter()
                    .zip(&self.cfg.in_weights)
                    .filter(|((_, heard), _)| *heard)
                    .map(|((x, _), &(_, w))| (w as f32, x.as_slice()))
                    .collect();
                self.clipped +=
                    crate::mixing::robust::clipped_mix(rule, &self.x, &neighbours, &mut self.acc)
                        as u64;
                for (_, heard) in &mut self.held {
                    *heard = false;
                }
            }
            if !self.in_place {
                std::mem::swap(&mut self.x, &mut self.acc);
            }
            self.ex.finish();
        }
    }

    /// Begins the next round from the parameters this peer holds (`x` of
    /// [`Gossip::begin_round`], already copied in; or, streaming, the part's own result).
    pub(crate) fn begin_from_params(&mut self, now: Instant, grad: Option<&[f32]>) {
        self.ex.assert_idle();
        let round = self.ex.round();
        self.reweighting
            .apply(round, &mut self.cfg.self_weight, &mut self.cfg.in_weights);
        let d = self.x.len();
        if let Some(delta) = self.pending.take() {
            for (xi, di) in self.x.iter_mut().zip(delta) {
                *xi += di;
            }
        }
        if self.cfg.skip_after.is_some() {
            self.history.push_back((round, self.x.clone()));
            if self.history.len() as u64 > SKIP_HISTORY {
                self.history.pop_front();
            }
        }
        if let Some(g) = grad {
            assert_eq!(g.len(), d, "grad must have length d");
        }
        // Encode x once; every out-neighbour gets the same bytes.
        let (compressor, rng, x) = (&mut self.compressor, &mut self.rng, &self.x);
        let begun = self.ex.begin(now, |out| compressor.compress(x, rng, out));
        // mix = W_ii x_i − η g_i; neighbours' W_ij x_j are added as they arrive.
        let (wii, lr) = (self.cfg.self_weight as f32, self.cfg.lr);
        let (mix, x): (&mut [f32], &[f32]) = if self.in_place {
            (&mut self.x, &[])
        } else {
            (&mut self.acc, &self.x)
        };
        match (grad, self.in_place) {
            (Some(g), true) => mix
                .iter_mut()
                .zip(g)
                .for_each(|(a, gi)| *a = wii * *a - lr * gi),
            (None, true) => mix.iter_mut().for_each(|a| *a *= wii),
            (Some(g), false) => {
                for ((a, xi), gi) in mix.iter_mut().zip(x).zip(g) {
                    *a = wii * xi - lr * gi;
                }
            }
            (None, false) => {
                for (a, xi) in mix.iter_mut().zip(x) {
                    *a = wii * xi;
                }
            }
        }
        for idx in begun.stand_in {
            let _ = self.skip(SkipAction::StandIn(idx));
        }
        // Frames that arrived early for this round were validated then; absorb them now.
        for (idx, payload) in begun.early {
            match self.absorb(idx, &payload) {
                Ok(()) => {
                    self.ex.keep(idx, &payload);
                    self.ex.absorbed_early(idx);
                }
                // Validated on arrival, so this cannot happen; keep the error path anyway
                // rather than trusting that invariant with a panic.
                Err(e) => debug_assert!(false, "early frame failed late: {e}"),
            }
            self.ex.recycle(payload);
        }
        self.finish_if_complete();
    }
}

impl Gossip for DPsgd {
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.ex.assert_idle();
        assert_eq!(x.len(), self.x.len(), "x must have length d");
        self.x.copy_from_slice(x);
        self.begin_from_params(now, grad);
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    /// x_i^{t+1} = Σ_j W_ij x_j^t − η g_i: the frames carry x_i^t only.
    fn overlaps_gradient(&self) -> bool {
        true
    }

    fn apply_gradient(&mut self, grad: &[f32]) {
        self.ex.assert_idle();
        assert_eq!(grad.len(), self.x.len(), "grad must have length d");
        let lr = self.cfg.lr;
        for (x, g) in self.x.iter_mut().zip(grad) {
            *x -= lr * g;
        }
    }

    fn peer_left(&mut self, gone: Rank, w: &MixingMatrix) -> Result<(), MembershipError> {
        let (wii, wij) = weights_without(self.cfg.rank, &self.cfg.in_weights, w, gone)?;
        if let Some(idx) = self.ex.leave(gone) {
            // The round mixes this peer's own x_i in place of the missing W_ij x_j.
            self.add_own(self.cfg.in_weights[idx].1 as f32);
            self.ex.stood_in(idx);
            self.finish_if_complete();
        }
        let from = self.ex.round() + u64::from(!self.ex.is_idle());
        self.reweighting.schedule(from, wii, wij);
        Ok(())
    }

    fn peer_rejoined(
        &mut self,
        back: Rank,
        w: &MixingMatrix,
        at: u64,
    ) -> Result<(), MembershipError> {
        let neighbour = self.cfg.in_weights.iter().any(|&(j, _)| j == back)
            || self.cfg.out_neighbors.contains(&back);
        let me = (self.cfg.rank, self.cfg.in_weights.as_slice());
        self.reweighting
            .take_back(&mut self.ex, me, w, (back, at), neighbour)
    }

    fn start_at_round(&mut self, round: u64) -> Result<(), MembershipError> {
        self.ex.start_at(round);
        Ok(())
    }

    /// The compressor's state (error feedback's residual), if any.
    fn state(&self) -> AlgorithmState {
        AlgorithmState::default().with_compressor(&*self.compressor)
    }

    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        let d = self.x.len();
        state.restore_into(&[], &[], d, &mut *self.compressor)?;
        Ok(())
    }

    crate::mixing::exchange::exchange_driven_gossip!();
}

/// D-PSGD in the [`crate::registry`].
pub struct DPsgdAlgorithm;

/// The registry's entry for D-PSGD.
pub const DPSGD: DPsgdAlgorithm = DPsgdAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Static),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Parameters,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::ROBUST, ProtocolOption::PART_MB],
    skips_stragglers: true,
    departures: Departures::TrainOn,
    resume: Resume::Rejoin,
};

impl Algorithm for DPsgdAlgorithm {
    fn name(&self) -> &'static str {
        "dpsgd"
    }
    fn about(&self) -> &'static str {
        "D-PSGD (Lian et al. 2017): x_i ← Σ_j W_ij x_j − η ∇F_i(x_i)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn check(&self, run: &RunSetup<'_>) -> Result<(), BuildError> {
        DPsgd::check_setup(run)
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let (compressor, lr) = (ctx.compressor(self)?, ctx.lr);
        if let Some(part_len) = crate::mixing::streaming::streams(&ctx, &*compressor) {
            let cfg = DPsgd::config_from(&ctx, lr)?;
            return Ok(Box::new(crate::mixing::streaming::StreamedDPsgd::new(
                cfg, ctx.x0, part_len,
            )));
        }
        Ok(Box::new(DPsgd::from_context(ctx, lr, compressor)?))
    }
}

impl DPsgd {
    /// What a run must satisfy for D-PSGD's rounds (`dpsgd`, and the D-PSGD mixing inside
    /// `local-sgd` and `diloco-gossip`): `--part-mb` given needs messages it can stream
    /// (identity, no skipping, no clipping); the skip straggler policy needs an undirected graph
    /// (D-PSGD's skip notice goes back along the edge it drops), and `--robust` does not
    /// combine with it (a dropped edge's correction would bypass the clip). Each of those
    /// algorithms' [`Algorithm::check`] is this, so `launch` refuses before any peer starts.
    ///
    /// # Errors
    /// [`BuildError::Topology`] or [`BuildError::Options`], naming the flag.
    pub fn check_setup(run: &RunSetup<'_>) -> Result<(), BuildError> {
        let parts = run.options.part_mb.is_some_and(|mb| mb > 0.0);
        let identity = run
            .options
            .compressor
            .as_ref()
            .is_none_or(|c| *c == CompressorSpec::Identity);
        if parts && (!identity || run.skip_policy || run.options.robust.is_some()) {
            return Err(BuildError::Options(
                "--part-mb streams messages of the identity compressor, without \
                 --straggler-policy skip or --robust (each part is mixed on its own)"
                    .into(),
            ));
        }
        if !run.skip_policy {
            return Ok(());
        }
        if let Some(topo) = run.topology.filter(|t| !t.w.graph().is_symmetric()) {
            return Err(BuildError::Topology(format!(
                "--straggler-policy skip needs an undirected topology; {} is directed",
                topo.name
            )));
        }
        if run.options.robust.is_some() {
            return Err(BuildError::Options(
                "--robust clips the neighbours a round has heard; it does not combine with \
                 --straggler-policy skip (a dropped edge's correction would bypass the clip)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A D-PSGD peer for `ctx` with step size `lr` (0: mixing only, as inside local SGD).
    ///
    /// # Errors
    /// As [`DPsgd::check_setup`].
    pub fn from_context(
        ctx: BuildContext<'_>,
        lr: f32,
        compressor: Box<dyn Compressor>,
    ) -> Result<DPsgd, BuildError> {
        let cfg = Self::config_from(&ctx, lr)?;
        Ok(DPsgd::with_compressor(cfg, ctx.x0, compressor))
    }

    /// The configuration of a D-PSGD peer for `ctx` with step size `lr`.
    ///
    /// # Errors
    /// As [`DPsgd::check_setup`].
    fn config_from(ctx: &BuildContext<'_>, lr: f32) -> Result<DPsgdConfig, BuildError> {
        Self::check_setup(&ctx.setup())?;
        let mut cfg = DPsgdConfig::from_matrix(&ctx.topology.w, ctx.rank, lr, ctx.dim());
        cfg.round_timeout = ctx.round_timeout;
        cfg.max_payload_bytes = ctx.max_payload_bytes;
        cfg.seed = ctx.seed;
        cfg.skip_after = ctx.skip_after;
        cfg.auto_deadline = ctx.auto_deadline;
        cfg.in_place = ctx.in_place;
        cfg.robust = ctx.options.robust;
        Ok(cfg)
    }

    /// Exact mixing only (η = 0, no compression, no straggler skipping, no clipping) of a
    /// vector `v0: [len]` on the mixing matrix `w` (n×n; the run's W, or a matrix derived
    /// from it with the same support), with the timeouts, payload limit and seed of `ctx`:
    /// the inner mixer of algorithms that gossip more than x_i (gradient tracking mixes the
    /// stacked `[x_i; y_i]`, `len` = 2d) or mix through another matrix (D²'s (I + W)/2).
    pub(crate) fn mixer(
        ctx: &BuildContext<'_>,
        w: &murmur_topology::MixingMatrix,
        v0: Vec<f32>,
    ) -> DPsgd {
        let mut cfg = DPsgdConfig::from_matrix(w, ctx.rank, 0.0, v0.len());
        cfg.round_timeout = ctx.round_timeout;
        cfg.max_payload_bytes = ctx.max_payload_bytes.max(cfg.max_payload_bytes);
        cfg.seed = ctx.seed;
        DPsgd::new(cfg, v0)
    }
}
