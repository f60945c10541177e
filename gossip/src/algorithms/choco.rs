//! CHOCO-SGD and CHOCO-Gossip: decentralized SGD and average consensus with compressed
//! communication (Koloskova, Stich & Jaggi 2019, "Decentralized stochastic optimization and
//! gossip algorithms with compressed communication", ICML, Algorithm 2; Algorithm 1 is the
//! gradient-free CHOCO-Gossip).
//!
//! Notation of the paper: n peers, W the doubly stochastic n×n mixing matrix (w_ij ≠ 0 only
//! for j = i or j → i an edge), η the learning rate, γ the consensus step size, Q a
//! compression operator with quality ω ∈ (0, 1]: E_Q‖Q(x) − x‖² ≤ (1 − ω)‖x‖² (the paper's
//! Assumption 1).
//!
//! Every peer i keeps its parameters x_i, a public copy x̂_i that every neighbour can
//! reconstruct from the messages it received (x̂_i^(0) = 0), and, round t (with g_i the
//! gradient passed to [`Gossip::begin_round`], none for CHOCO-Gossip):
//!
//! ```text
//! x_i^(t+½)  = x_i^(t) − η g_i
//! q_i^(t)    = Q(x_i^(t+½) − x̂_i^(t))                       sent to every out-neighbour
//! x̂_j^(t+1) = x̂_j^(t) + q_j^(t)                             for j = i and each in-neighbour
//! x_i^(t+1)  = x_i^(t+½) + γ Σ_j w_ij (x̂_j^(t+1) − x̂_i^(t+1))
//! ```
//!
//! Only the differences x − x̂ travel, and they shrink as the peers agree, so a biased
//! operator such as top-k still reaches exact consensus (unlike compressing x itself in
//! [`crate::DPsgd`]). Mixing preserves the network average x̄ exactly in exact arithmetic:
//! Σ_i Σ_j w_ij (x̂_j − x̂_i) = 0 because W's columns sum to 1.
//!
//! # Copies, not the memory-efficient form
//!
//! Algorithm 2 keeps a copy x̂_j of every neighbour; the paper's appendix describes a
//! memory-efficient variant that keeps only s_i = Σ_j w_ij x̂_j, advanced by the same
//! increments (s_i += w_ij q_j per message), for 4d floats whatever the degree. murmur
//! keeps the copies: (3 + in-degree)·d floats (x_i, x̂_i, the compressor's scratch input
//! x^(t+½) − x̂_i, one x̂_j per in-neighbour). Three reasons:
//!
//! * **Rounding.** In `f32` the incremental s_i collects the rounding of every increment
//!   into an offset e_i = s_i − Σ_j w_ij x̂_j that never decays; after consensus Σ_i e_i ≠ 0
//!   acts as a constant force and the network average walks away linearly. Measured with
//!   the memory-efficient form (commit 98a1d5f, the set-up of the test
//!   `choco_gossip_keeps_the_average_after_consensus`: 6-ring, top-k 25%, γ = 0.3,
//!   d = 40, no gradient): the mean of coordinate 0 moved by 1.4·10⁻⁶ per round,
//!   2.1·10⁻³ over 1,600 rounds. Here the mix is formed every round from the copies as
//!   γ Σ_j w_ij (x̂_j − x̂_i), summed in `f64`, so the rounding is per round, not
//!   accumulated (test `choco_gossip_keeps_the_average_after_consensus`).
//! * **Departures.** When a neighbour leaves, the survivors re-weight
//!   ([`Gossip::peer_left`]: Metropolis–Hastings on the surviving graph, as for
//!   [`crate::DPsgd`]); the new weights apply to the copies directly.
//! * **Checkpoints** save x̂_i and the copies ([`Choco::copies`]).
//!
//! The peer applies its own q_i to x̂_i by decoding the exact bytes it sends, so its x̂_i is
//! the one its neighbours see.
//!
//! # Departures
//!
//! A round waiting for a departed neighbour's q_g completes without it (x̂_g is not
//! advanced: q_g = 0); from the next round the new weights apply and the departed peer's
//! copy is no longer used. With the symmetric W' of
//! every survivor the network average over the survivors is kept, as before.
//!
//! # A peer returns: the copies are sent in full once
//!
//! A restarted (or new) peer r holds no copies, and its neighbours' copy of it belongs to
//! its previous process. When r comes back at round a ([`Gossip::peer_rejoined`] on every
//! peer, [`Gossip::start_at_round`] on r), r and each of its in-neighbours j send, in round
//! a, their public copy x̂^(a+1) = x̂^(a) + q^(a) *in full* (the identity operator) instead
//! of q^(a), to every out-neighbour; a receiver replaces its copy with it instead of adding.
//! Every peer knows who sends in full in round a from W and the rejoin, so no flag travels.
//! A receiver whose copy was right gets bit for bit what adding q would have given (the
//! sender formed x̂ + q the same way); r's copies and its neighbours' copy of r agree from
//! round a + 1, whatever r's own x̂_r was. One dense message per edge of r's in-neighbours,
//! once. Not under the skip policy (a late message of round a could not be told apart).
//!
//! # Stragglers: the skip policy
//!
//! With [`ChocoConfig::skip_after`] = Δ, round t waits Δ for the in-neighbours' q_j^(t)
//! and then mixes with the copies it has: a late q_j leaves x̂_j one message behind. The
//! message is not dropped (the copies held by j's neighbours and j's own x̂_j would part for
//! good): when q_j^(t) comes, k rounds later, x̂_j += q_j^(t) and, to make up for the k
//! mixes that used the stale copy, x_i += γ w_ij k q_j^(t). Each of those mixes added
//! γ w_ij (x̂_j − q_j − x̂_i) instead of γ w_ij (x̂_j − x̂_i), so after the make-up the sum
//! Σ_i x_i is what it would have been without the delay, and the network average is kept
//! (test `choco_skipping_a_straggler_keeps_the_average`). No notice goes back. A message
//! may be late by at most [`crate::SKIP_STALENESS`] rounds: round t waits (up to the round
//! timeout) for the late messages of rounds ≤ t − 8, so the in-neighbours' lead bound
//! grows by 8 rounds. The make-up uses the weight w_ij of the round it arrives in (they
//! differ only if a departure re-weighted W in between). Late messages are not part of a
//! checkpoint, so a run under the skip policy cannot resume from one.
//!
//! # Byzantine neighbours: clipping
//!
//! A Byzantine neighbour b controls its public copy x̂_b completely (every q_b is added to
//! it), so plain CHOCO moves x_i by γ w_ib (x̂_b − x̂_i), unbounded. With
//! [`ChocoConfig::robust`] (`--robust`), each term is clipped as in ClippedGossip ([`crate::mixing::robust`],
//! He, Karimireddy & Jaggi 2022), centred on the peer's own public copy:
//!
//! ```text
//! x_i^(t+1) = x_i^(t+½) + γ Σ_j w_ij clip(x̂_j − x̂_i, τ_i)
//! ```
//!
//! with τ_i fixed or the (b + 1)-th largest of the distances ‖x̂_j − x̂_i‖ of the round. When
//! nothing is clipped this is CHOCO exactly; a Byzantine neighbour moves x_i by at most
//! γ w_ib τ_i a round. Clipping makes the mix asymmetric, so the network average is no
//! longer kept exactly while it clips (it is what bounds the attacker's pull). Not under
//! the skip policy (a late message's make-up would bypass the clip).
//!
//! # Choosing γ
//!
//! The paper's Theorem 2 proves linear convergence of CHOCO-Gossip for
//! γ* = δ²ω / (16δ + δ² + 4β² + 2δβ² − 8δω), with δ = 1 − |λ₂(W)| the spectral gap and
//! β = ‖I − W‖₂ ([`theorem2_gamma`], [`suggested_gamma`]). This is a worst-case bound and
//! very conservative: on a 9-ring with top-k 1% it gives γ ≈ 2.5·10⁻⁵, while γ = 0.04
//! converges in about a thousand rounds. The paper's experiments tune γ by grid search;
//! do the same and use γ* as a floor that is safe by proof.

use crate::algorithm::{
    Algorithm, Capabilities, Compresses, Departures, GraphNeeds, Pattern, ProtocolOption, Resume,
};
use murmur_compress::CompressorSpec;
use std::time::{Duration, Instant};

use murmur_compress::Compressor;
use murmur_topology::MixingMatrix;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::mixing::exchange::{max_lead, Exchange, ExchangeParams};
use crate::{AlgorithmState, Gossip, GossipError, MembershipError, Rank, StateError};

/// Configuration of one CHOCO peer.
#[derive(Debug, Clone)]
pub struct ChocoConfig {
    /// This peer's rank i.
    pub rank: Rank,
    /// w_ii.
    pub self_weight: f64,
    /// (j, w_ij) for every in-neighbour j ≠ i with w_ij ≠ 0.
    pub in_weights: Vec<(Rank, f64)>,
    /// Peers j ≠ i with w_ji ≠ 0: who receives q_i.
    pub out_neighbors: Vec<Rank>,
    /// Learning rate η applied to the gradient passed to `begin_round`.
    pub lr: f32,
    /// Consensus step size γ, in (0, 1]; see the [module docs](self) on choosing it.
    pub gamma: f32,
    /// How long a round may wait for its messages before [`crate::GossipEvent::RoundTimedOut`].
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
    /// Seed of the RNG handed to the compressor.
    pub seed: u64,
    /// How many rounds an in-neighbour can be ahead of this peer (≥ 1); frames up to this
    /// many rounds ahead are buffered, later ones refused. See
    /// [`crate::DPsgdConfig::max_lead_rounds`].
    pub max_lead_rounds: u64,
    /// Straggler policy "skip": how long a round waits for the in-neighbours' messages
    /// before it mixes with the stale copies of the late ones (`None`: wait, up to
    /// `round_timeout`); see the [module docs](self#stragglers-the-skip-policy).
    pub skip_after: Option<Duration>,
    /// With the skip policy: per-neighbour deadlines from observed arrival times, with
    /// `skip_after` as the longest ([`crate::AutoDeadline`]); `None`: `skip_after`
    /// for every neighbour.
    pub auto_deadline: Option<crate::mixing::exchange::AutoDeadline>,
    /// Byzantine-robust mixing: each neighbour's term x̂_j − x̂_i clipped to a radius
    /// ([`crate::mixing::robust`], ClippedGossip on the public copies; see the [module
    /// docs](self#byzantine-neighbours-clipping)); `None`: plain CHOCO.
    pub robust: Option<crate::mixing::robust::ClipRule>,
}

impl ChocoConfig {
    /// The configuration of peer `rank` for mixing matrix `w` (n×n), with η = `lr`,
    /// γ = `gamma`, a 60 s round timeout, a payload limit of 16 bytes per parameter plus
    /// 1 KiB for `d` parameters, compressor seed `rank`, and `max_lead_rounds` from the graph
    /// distances of W's support (as [`crate::DPsgdConfig::from_matrix`]).
    pub fn from_matrix(w: &MixingMatrix, rank: Rank, lr: f32, gamma: f32, d: usize) -> Self {
        ChocoConfig {
            rank,
            self_weight: w.self_weight(rank),
            in_weights: w.in_weights(rank),
            out_neighbors: w.out_neighbors(rank),
            lr,
            gamma,
            round_timeout: Duration::from_secs(60),
            max_payload_bytes: u32::try_from(16 * d + 1024).unwrap_or(u32::MAX),
            seed: rank as u64,
            max_lead_rounds: max_lead(w, rank),
            skip_after: None,
            auto_deadline: None,
            robust: None,
        }
    }
}

/// γ* of Koloskova et al. 2019, Theorem 2: δ²ω / (16δ + δ² + 4β² + 2δβ² − 8δω), for spectral
/// gap `delta` = δ = 1 − |λ₂(W)|, `beta` = β = ‖I − W‖₂ and compression quality `omega` = ω
/// (E‖Q(x) − x‖² ≤ (1 − ω)‖x‖²; ω = k/d for top-k and unscaled random-k, 1 for the
/// identity). With it CHOCO-Gossip provably contracts by (1 − δ²ω/82) per round; it is
/// conservative (see the [module docs](self)).
///
/// # Panics
/// If `omega` is not in (0, 1], `delta` not in [0, 1], or `beta` negative or not finite.
pub fn theorem2_gamma(delta: f64, beta: f64, omega: f64) -> f64 {
    assert!(
        omega > 0.0 && omega <= 1.0,
        "compression quality ω must be in (0, 1], got {omega}"
    );
    assert!(
        (0.0..=1.0).contains(&delta),
        "spectral gap δ must be in [0, 1], got {delta}"
    );
    assert!(
        beta.is_finite() && beta >= 0.0,
        "β = ‖I − W‖₂ must be finite and ≥ 0, got {beta}"
    );
    let b2 = beta * beta;
    // The denominator is ≥ 8δ + δ² + 4β² > 0 for δ > 0 because ω ≤ 1.
    let den = 16.0 * delta + delta * delta + 4.0 * b2 + 2.0 * delta * b2 - 8.0 * delta * omega;
    if den <= 0.0 {
        return 0.0;
    }
    delta * delta * omega / den
}

/// [`theorem2_gamma`] for mixing matrix `w` and compression quality `omega` (k/d for top-k).
///
/// δ is [`MixingMatrix::spectral_gap`]; β = ‖I − W‖₂ is replaced by the upper bound
/// √(‖I − W‖₁ ‖I − W‖∞) (= 2(1 − min_i w_ii) for a doubly stochastic W; 4/3 against the
/// exact 1.29 on a Metropolis–Hastings 9-ring). γ* decreases in β, so the bound keeps the
/// result on the safe side. Returns 0 when W has no spectral gap (disconnected or periodic
/// support), where no γ makes CHOCO converge.
///
/// # Panics
/// If `omega` is not in (0, 1].
pub fn suggested_gamma(w: &MixingMatrix, omega: f64) -> f64 {
    let delta = w.spectral_gap();
    if delta.is_nan() || delta <= 0.0 {
        return 0.0;
    }
    let n = w.n();
    let entry = |i: Rank, j: Rank| (f64::from(u8::from(i == j)) - w.get(i, j)).abs();
    let norm_inf = (0..n)
        .map(|i| (0..n).map(|j| entry(i, j)).sum::<f64>())
        .fold(0.0, f64::max);
    let norm_1 = (0..n)
        .map(|j| (0..n).map(|i| entry(i, j)).sum::<f64>())
        .fold(0.0, f64::max);
    theorem2_gamma(delta.min(1.0), (norm_1 * norm_inf).sqrt(), omega)
}

/// One peer of CHOCO-SGD (CHOCO-Gossip when no gradient is given) as a sans-I/O state
/// machine; see the [module docs](self).
///
/// Frames are [`crate::FrameKind::Gossip`] frames carrying q_i as a `murmur_compress`
/// message, the same format as [`crate::DPsgd`], with the same checks: a refused frame
/// leaves the state unchanged. While a round mixes, [`Gossip::params`] returns x^(t+½);
/// after [`crate::GossipEvent::Mixed`], x^(t+1).
pub struct Choco {
    cfg: ChocoConfig,
    compressor: Box<dyn Compressor>,
    rng: StdRng,
    /// x_i (`[d]`); x^(t+½) while mixing.
    x: Vec<f32>,
    /// x̂_i (`[d]`), this peer's public copy.
    x_hat: Vec<f32>,
    /// Scratch: x^(t+½) − x̂_i, the compressor's input.
    diff: Vec<f32>,
    /// x̂_j (`[d]`) of every in-neighbour, in the order of `cfg.in_weights`.
    copies: Vec<Vec<f32>>,
    /// Changes of weights after departures.
    reweighting: crate::mixing::reweight::Reweighting,
    /// Rounds, frames, deadlines, events and counters.
    ex: Exchange,
    /// Skip policy: make-up for late messages that came between rounds, added to x when
    /// the next round begins (the driver hands x back then): `[d]`.
    pending: Option<Vec<f32>>,
    /// Rounds in which peers send their public copy in full (a peer returns, see the
    /// [module docs](self#a-peer-returns-the-copies-are-sent-in-full-once)): round → senders.
    resync: std::collections::BTreeMap<u64, std::collections::BTreeSet<Rank>>,
    /// Per in-neighbour, the scale of its term this round (1 unclipped), with
    /// [`ChocoConfig::robust`]; and how many terms were clipped over the run.
    scales: Vec<f64>,
    clipped: u64,
}

impl Choco {
    /// A peer starting from parameters `x0: [d]` with x̂_i = s_i = 0, compressing its
    /// messages with `compressor` (identity for uncompressed CHOCO; any operator works, the
    /// theory covers those with a quality ω > 0).
    pub fn new(cfg: ChocoConfig, x0: Vec<f32>, compressor: Box<dyn Compressor>) -> Self {
        let d = x0.len();
        let cfg_in_degree = cfg.in_weights.len();
        let ex = Exchange::new(ExchangeParams {
            rank: cfg.rank,
            in_neighbors: cfg.in_weights.iter().map(|&(j, _)| j).collect(),
            out_neighbors: cfg.out_neighbors.clone(),
            d,
            round_timeout: cfg.round_timeout,
            max_payload_bytes: cfg.max_payload_bytes,
            // A late message lets its sender's neighbours run SKIP_STALENESS rounds further.
            max_lead_rounds: cfg.max_lead_rounds
                + if cfg.skip_after.is_some() {
                    crate::SKIP_STALENESS
                } else {
                    0
                },
            // Dropping a frame would leave the neighbours' copies x̂ out of step: late ones
            // are absorbed when they come.
            skip_after: cfg.skip_after,
            auto_deadline: cfg.auto_deadline,
            skip_mode: crate::mixing::exchange::SkipMode::Late,
            part: None,
        });
        Choco {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            compressor,
            x: x0,
            x_hat: vec![0.0; d],
            diff: vec![0.0; d],
            copies: vec![vec![0.0; d]; cfg_in_degree],
            reweighting: Default::default(),
            ex,
            pending: None,
            resync: Default::default(),
            scales: vec![1.0; cfg_in_degree],
            clipped: 0,
        }
    }

    /// Neighbour terms the robust rule clipped so far (0 without one).
    pub fn clipped(&self) -> u64 {
        self.clipped
    }

    /// With [`ChocoConfig::robust`]: each in-neighbour's scale min(1, τ/‖x̂_j − x̂_i‖) for
    /// this round's mix (0 for a copy that is not finite). Without: all 1.
    fn clip_scales(&mut self) {
        let Some(rule) = self.cfg.robust else {
            return;
        };
        let distances: Vec<f64> = self
            .copies
            .iter()
            .map(|c| crate::mixing::robust::distance(&self.x_hat, c))
            .collect();
        self.scales = rule.scales(&distances);
        self.clipped += self.scales.iter().filter(|&&s| s < 1.0).count() as u64;
    }

    /// A peer cannot return under the skip policy: a late message of the round in which
    /// copies go in full could not be told from one.
    fn refuse_under_skip(&self) -> Result<(), MembershipError> {
        match self.cfg.skip_after {
            Some(_) => Err(MembershipError::Unsupported {
                algorithm: "CHOCO-SGD",
                why: "under the skip policy a late message could not be told from a copy sent in full",
            }),
            None => Ok(()),
        }
    }

    /// Whether `peer` sends its public copy in full in round `round`.
    fn sends_in_full(&self, round: u64, peer: Rank) -> bool {
        self.resync.get(&round).is_some_and(|s| s.contains(&peer))
    }

    /// The configuration.
    pub fn config(&self) -> &ChocoConfig {
        &self.cfg
    }

    /// x̂_i (`[d]`), this peer's public copy (what its neighbours have accumulated of it).
    pub fn x_hat(&self) -> &[f32] {
        &self.x_hat
    }

    /// s_i = Σ_j w_ij x̂_j (`[d]`, j = i included) over the messages absorbed so far,
    /// summed in `f64`.
    pub fn s(&self) -> Vec<f32> {
        let wii = self.cfg.self_weight;
        (0..self.x.len())
            .map(|k| {
                let mut acc = wii * f64::from(self.x_hat[k]);
                for ((_, w), c) in self.cfg.in_weights.iter().zip(&self.copies) {
                    acc += w * f64::from(c[k]);
                }
                acc as f32
            })
            .collect()
    }

    /// x̂_j of in-neighbour j, `[d]`, in the order of [`ChocoConfig::in_weights`].
    pub fn copies(&self) -> &[Vec<f32>] {
        &self.copies
    }

    /// x̂_j += q_j from the payload of in-neighbour `idx` of the mixing round, or x̂_j = the
    /// payload when j sends its copy in full in that round. On `Err` nothing changed.
    fn absorb(&mut self, idx: usize, payload: &[u8]) -> Result<(), GossipError> {
        let from = self.cfg.in_weights[idx].0;
        let in_full = self.sends_in_full(self.ex.round(), from);
        let copy = &mut self.copies[idx];
        if in_full {
            murmur_compress::decode_into(payload, copy)
        } else {
            murmur_compress::decode_add(payload, 1.0, copy)
        }
        .map_err(|source| GossipError::Payload {
            from,
            cause: source,
        })
    }

    /// The skip policy (see the [module docs](self#stragglers-the-skip-policy)): a round
    /// that stops waiting mixes the stale copy (nothing to do); a late message is absorbed
    /// into its copy, and x_i makes up for the mixes that went without it. On `Err`
    /// nothing changed.
    fn skip(&mut self, action: crate::mixing::exchange::SkipAction) -> Result<(), GossipError> {
        use crate::mixing::exchange::SkipAction;
        match action {
            SkipAction::Late {
                idx,
                stale_mixes,
                payload,
            } => {
                let (from, w) = self.cfg.in_weights[idx];
                // Validated on arrival, so neither can fail half-way.
                murmur_compress::decode_add(&payload, 1.0, &mut self.copies[idx]).map_err(
                    |source| GossipError::Payload {
                        from,
                        cause: source,
                    },
                )?;
                let make_up = (f64::from(self.cfg.gamma) * w * stale_mixes as f64) as f32;
                if make_up != 0.0 {
                    // Into x^(t+½) of the mixing round, or into x when the next one begins.
                    let d = self.x.len();
                    let target = if self.ex.is_idle() {
                        self.pending.get_or_insert_with(|| vec![0.0; d])
                    } else {
                        &mut self.x
                    };
                    murmur_compress::decode_add(&payload, make_up, target).map_err(|source| {
                        GossipError::Payload {
                            from,
                            cause: source,
                        }
                    })?;
                }
                Ok(())
            }
            // CHOCO's exchange never drops a frame (SkipMode::Late): nothing to stand in for
            // or correct.
            SkipAction::Nothing | SkipAction::StandIn(_) | SkipAction::Correct { .. } => Ok(()),
        }
    }

    fn finish_if_complete(&mut self) {
        if self.ex.is_complete() {
            // x^(t+1) = x^(t+½) + γ Σ_j w_ij s_j (x̂_j − x̂_i), summed in f64 from the
            // copies; s_j = 1 unless the robust rule clips.
            self.clip_scales();
            let gamma = f64::from(self.cfg.gamma);
            for (k, (x, h)) in self.x.iter_mut().zip(&self.x_hat).enumerate() {
                let h = f64::from(*h);
                let mut mix = 0.0f64;
                for (((_, w), c), s) in self
                    .cfg
                    .in_weights
                    .iter()
                    .zip(&self.copies)
                    .zip(&self.scales)
                {
                    if *s > 0.0 {
                        mix += w * s * (f64::from(c[k]) - h);
                    }
                }
                *x = (f64::from(*x) + gamma * mix) as f32;
            }
            self.ex.finish();
        }
    }
}

impl Gossip for Choco {
    /// Starts round t from `x` = x_i^(t) and the gradient g_i (none: CHOCO-Gossip).
    ///
    /// If x^(t+½) − x̂_i has a non-finite coordinate (the run has diverged; the message
    /// would be refused by every neighbour), [`crate::GossipEvent::Diverged`] is reported and the
    /// round never completes.
    ///
    /// # Panics
    /// If `x` or `grad` does not have length d, or the previous round is still mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.ex.assert_idle();
        let d = self.x.len();
        assert_eq!(x.len(), d, "x must have length d");
        self.reweighting.apply(
            self.ex.round(),
            &mut self.cfg.self_weight,
            &mut self.cfg.in_weights,
        );
        // x^(t+½) = x − η g
        crate::mixing::local_step(&mut self.x, x, grad, self.cfg.lr);
        if let Some(make_up) = self.pending.take() {
            for (xi, m) in self.x.iter_mut().zip(make_up) {
                *xi += m;
            }
        }
        for ((q, xh), h) in self.diff.iter_mut().zip(&self.x).zip(&self.x_hat) {
            *q = xh - h;
        }
        // q_i = Q(x^(t+½) − x̂_i), one message for every out-neighbour.
        let round = self.ex.round();
        self.resync.retain(|&r, _| r >= round);
        let in_full = self.sends_in_full(round, self.cfg.rank);
        let (compressor, rng, diff) = (&mut self.compressor, &mut self.rng, &self.diff);
        let (own, early) = if in_full {
            // A peer returns: x̂_i += q_i, and x̂_i goes out in full.
            let mut q = Vec::new();
            compressor.compress(diff, rng, &mut q);
            let own = murmur_compress::decode_add(&q, 1.0, &mut self.x_hat);
            let (x_hat, rng) = (&self.x_hat, &mut self.rng);
            let begun = self.ex.begin(now, |out| {
                murmur_compress::Identity.compress(x_hat, rng, out)
            });
            (own, begun.early)
        } else {
            let early = self
                .ex
                .begin(now, |out| compressor.compress(diff, rng, out))
                .early;
            // x̂_i += q_i, decoded from the bytes the neighbours get.
            let own = murmur_compress::decode_add(self.ex.message(), 1.0, &mut self.x_hat);
            (own, early)
        };
        if let Err(e) = own {
            let round = self.ex.round();
            self.ex
                .push_event(crate::mixing::choco_diverged(self.cfg.rank, round, e));
            return;
        }
        // Frames that arrived early for this round were validated then; absorb them now.
        for (idx, payload) in early {
            match self.absorb(idx, &payload) {
                Ok(()) => self.ex.absorbed_early(idx),
                // Validated on arrival, so this cannot happen.
                Err(e) => debug_assert!(false, "early frame failed late: {e}"),
            }
        }
        self.finish_if_complete();
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    /// Re-weights with `w` (n×n, the survivors' W') from the next round on; the mixing
    /// round completes without `gone`'s q (see the [module docs](self#departures)).
    fn peer_left(&mut self, gone: Rank, w: &MixingMatrix) -> Result<(), MembershipError> {
        let (wii, wij) =
            crate::mixing::reweight::weights_without(self.cfg.rank, &self.cfg.in_weights, w, gone)?;
        if let Some(idx) = self.ex.leave(gone) {
            self.ex.stood_in(idx);
            self.finish_if_complete();
        }
        let from = self.ex.round() + u64::from(!self.ex.is_idle());
        self.reweighting.schedule(from, wii, wij);
        Ok(())
    }

    /// Takes `back` in again from round `at` with `w` (n×n, W with `back`): from then on the
    /// weights of `w`; in round `at`, `back` and its in-neighbours send their public copies
    /// in full (see the [module docs](self#a-peer-returns-the-copies-are-sent-in-full-once)).
    ///
    /// # Errors
    /// [`MembershipError::Unsupported`] under the skip policy; [`MembershipError::BadMatrix`];
    /// [`MembershipError::TooLate`] if round `at` has begun and this peer sends or receives
    /// a copy in full in it.
    fn peer_rejoined(
        &mut self,
        back: Rank,
        w: &MixingMatrix,
        at: u64,
    ) -> Result<(), MembershipError> {
        self.refuse_under_skip()?;
        let senders: std::collections::BTreeSet<Rank> = std::iter::once(back)
            .chain(w.in_weights(back).into_iter().map(|(j, _)| j))
            .collect();
        let me = self.cfg.rank;
        let involved = senders.contains(&me)
            || self
                .cfg
                .in_weights
                .iter()
                .any(|&(j, _)| senders.contains(&j))
            || self.cfg.out_neighbors.contains(&back);
        self.reweighting.take_back(
            &mut self.ex,
            (me, &self.cfg.in_weights),
            w,
            (back, at),
            involved,
        )?;
        self.resync.entry(at).or_default().extend(senders);
        Ok(())
    }

    /// Starts at round `round`: a returning peer (its in-neighbours and it send their copies
    /// in full in that round, see the
    /// [module docs](self#a-peer-returns-the-copies-are-sent-in-full-once)) — unless the
    /// state is restored from a checkpoint next ([`Gossip::restore_state`], a whole run
    /// resuming: the copies agree already).
    fn start_at_round(&mut self, round: u64) -> Result<(), MembershipError> {
        self.refuse_under_skip()?;
        self.ex.start_at(round);
        let senders =
            std::iter::once(self.cfg.rank).chain(self.cfg.in_weights.iter().map(|&(j, _)| j));
        self.resync.entry(round).or_default().extend(senders);
        Ok(())
    }

    /// x̂_i as `x_hat`, the copies as `x_hat_in.<j>` (in-neighbour j), and the compressor's
    /// state.
    fn state(&self) -> AlgorithmState {
        let mut vectors = vec![("x_hat".to_string(), self.x_hat.clone())];
        for ((j, _), c) in self.cfg.in_weights.iter().zip(&self.copies) {
            vectors.push((format!("x_hat_in.{j}"), c.clone()));
        }
        AlgorithmState {
            scalars: Vec::new(),
            vectors,
        }
        .with_compressor(&*self.compressor)
    }

    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        let mut names = vec!["x_hat".to_string()];
        names.extend(
            self.cfg
                .in_weights
                .iter()
                .map(|(j, _)| format!("x_hat_in.{j}")),
        );
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let d = self.x.len();
        let (_, mut vectors) = state.restore_into(&[], &names, d, &mut *self.compressor)?;
        self.copies = vectors.split_off(1);
        self.x_hat = vectors.pop().expect("x_hat was checked");
        // The copies agree with the neighbours' (a whole run resumes): nothing to resend.
        self.resync.clear();
        Ok(())
    }

    crate::mixing::exchange::exchange_driven_gossip!();
}

/// CHOCO-SGD in the [`crate::registry`].
pub struct ChocoAlgorithm;

/// The registry's entry for CHOCO-SGD.
pub const CHOCO: ChocoAlgorithm = ChocoAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Static),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Increments,
    default_compressor: CompressorSpec::TopK {
        ratio: 0.01,
        layerwise: false,
    },
    options: &[ProtocolOption::GAMMA, ProtocolOption::ROBUST],
    skips_stragglers: true,
    departures: Departures::TrainOn,
    resume: Resume::RejoinWithoutSkip,
};

impl Algorithm for ChocoAlgorithm {
    fn name(&self) -> &'static str {
        "choco"
    }
    fn about(&self) -> &'static str {
        "CHOCO-SGD (Koloskova, Stich & Jaggi 2019): gossip of compressed differences \
         Q(x_i − x̂_i), consensus step size γ (--gamma)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// Refuses `--robust` with the skip straggler policy.
    fn check(&self, run: &crate::algorithm::RunSetup<'_>) -> Result<(), crate::BuildError> {
        if run.options.robust.is_some() && run.skip_policy {
            return Err(crate::BuildError::Options(
                "--robust clips the neighbours' copies when a round mixes; it does not combine \
                 with --straggler-policy skip (a late message's make-up would bypass the clip)"
                    .into(),
            ));
        }
        Ok(())
    }
    fn build(&self, ctx: crate::BuildContext<'_>) -> Result<Box<dyn Gossip>, crate::BuildError> {
        self.check(&ctx.setup())?;
        let (gamma, compressor) = (ctx.options.gamma(self), ctx.compressor(self)?);
        let mut cfg = ChocoConfig::from_matrix(&ctx.topology.w, ctx.rank, ctx.lr, gamma, ctx.dim());
        cfg.round_timeout = ctx.round_timeout;
        cfg.max_payload_bytes = ctx.max_payload_bytes;
        cfg.seed = ctx.seed;
        cfg.skip_after = ctx.skip_after;
        cfg.auto_deadline = ctx.auto_deadline;
        cfg.robust = ctx.options.robust;
        Ok(Box::new(Choco::new(cfg, ctx.x0, compressor)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_topology::Graph;

    #[test]
    fn theorem2_gamma_on_the_ring_of_nine() {
        let w = MixingMatrix::metropolis_hastings(&Graph::ring(9).unwrap()).unwrap();
        let c = |k: f64| (2.0 * std::f64::consts::PI * k / 9.0).cos();
        let delta = 1.0 - (1.0 + 2.0 * c(1.0)) / 3.0;
        let beta = 1.0 - (1.0 + 2.0 * c(4.0)) / 3.0; // |1 − λ_min|
        let omega = 20.0 / 2000.0; // top-k 1% of d = 2000
        let exact = theorem2_gamma(delta, beta, omega);
        let by_hand = delta * delta * omega
            / (16.0 * delta + delta * delta + 4.0 * beta * beta + 2.0 * delta * beta * beta
                - 8.0 * delta * omega);
        assert!((exact - by_hand).abs() < 1e-15);
        assert!(exact > 2.0e-5 && exact < 3.0e-5, "γ* = {exact}");
        // The matrix version bounds β by 4/3 > 1.293, so it is a little smaller.
        let suggested = suggested_gamma(&w, omega);
        assert!(suggested <= exact && suggested > 0.9 * exact, "{suggested}");
        // Identity compression on the complete graph with uniform weights: δ = β = 1, ω = 1.
        assert!((theorem2_gamma(1.0, 1.0, 1.0) - 1.0 / 15.0).abs() < 1e-15);
    }
}
