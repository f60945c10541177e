//! Streaming DiLoCo: DiLoCo whose outer step synchronises one fragment of the model at a
//! time, at staggered inner steps, and applies it τ inner steps later, so that the
//! communication runs behind the next inner steps (Douillard, Donchev, Rush, Kale, Charles,
//! Garrett, Teston, Lacey, McIlroy, Shen, Ramé, Szlam, Ranzato & Barham 2025, "Streaming
//! DiLoCo with overlapping communication: Towards a Distributed Free Lunch", Algorithm 2).
//! The outer step itself is DiLoCo's ([`crate::algorithms::diloco`]): the averaged pseudo-gradient of
//! H inner steps through an outer optimizer (Nesterov, or SGD), here per fragment.
//!
//! The model x_i: `[d]` is cut into P fragments, the contiguous ranges
//! [`chunk_range`]`(p, P, d)` (⌊d/P⌋ or ⌊d/P⌋ + 1 values each; the paper takes strided
//! groups of layers, which this flat view does not see). Fragment p is synchronised every H
//! inner steps, offset by ⌊(p + 1)·H / P⌋ steps, so that the P fragments' synchronisations
//! are spread over the H steps instead of all landing on one:
//!
//! ```text
//! every round t: x_i ← x_i − η u_i                         (inner step; u_i: the node's
//!                                                            inner optimizer, SGD or AdamW)
//! sync s = k·P + p  (fragment p, its k-th outer step) begins in round
//!     t_s = k·H + ⌊(p + 1)·H / P⌋ − 1,  after that round's inner step:
//!     Δ_i,p = a_i,p − x_i,p                                  [len_p] the pseudo-gradient
//!     ring all-reduce of the fragment (models, or compressed Δ, below), in the background
//! and is applied in round t_s + τ, after that round's inner step:
//!     Δ̄_p  = (1/n) Σ_j Δ_j,p
//!     a_i,p ← a_i,p − η_out · OuterOpt_p(Δ̄_p)               (the fragment's own optimizer)
//!     x_i,p ← α · x_i,p + (1 − α) · a_i,p                   (merge; x_i,p has τ more
//!                                                            inner steps than the Δ sent)
//! ```
//!
//! τ (`--tau`, default 1) is the overlap: the fragment's all-reduce has the compute of τ
//! inner steps to finish in before a round waits for it. α (`--merge-alpha`, default 0.5)
//! keeps part of the τ local steps that the synchronised fragment has not seen (the
//! paper's mixing factor; α = 0 replaces the fragment by the new global one). With P = 1,
//! τ = 0 and α = 0 this is DiLoCo exactly (`diloco`, test
//! `one_fragment_without_overlap_is_diloco_bit_for_bit`). Constraints: 1 ≤ P ≤ min(H, d)
//! (one synchronisation per round at most) and τ ≤ ⌊H/P⌋ (a fragment is applied before
//! the next one begins, so one all-reduce runs at a time).
//!
//! **Bytes** per outer step are DiLoCo's (each fragment once per H steps), but a round
//! carries at most 1/P of the model: the peak bandwidth falls by P, and with τ ≥ 1 the
//! time of the transfer hides behind compute. [`GossipStats::background_nanos`] counts the
//! time the fragments' all-reduces ran while rounds went on (by the `now` of the calls), so
//! a driver adds it to the rounds' own communication time.
//!
//! **The ring.** One [`AllReduce`] of dimension m = ⌈d/P⌉ carries the syncs in order: its
//! round r is sync `base + r` (a fragment shorter than m is padded with zeros, which every
//! peer sends and which average to zero). Without a compressor it averages the fragment's
//! models, Δ̄_p = a_p − (1/n) Σ_j x_j,p, as `diloco` does. With one (`int8`, `topk:…`, any
//! operator `diloco` takes) it all-reduces the compressed pseudo-gradients with error
//! feedback, as `diloco` does, with one residual per fragment (swapped into the ring for
//! its sync); each fragment's first sync averages the models raw and sets the anchor to
//! that average on every peer (the alignment of [`crate::algorithms::diloco`]'s compressed form), so the
//! first P syncs are raw and all later ones compressed. The compressor is seeded per sync
//! from the peer's seed and the sync's number.
//!
//! **SparseLoCo** (`--compressor sparseloco…`; Sarfi et al. 2025) is aggregated as its paper
//! does and as `diloco` does it: the ring is an [`AllReduce::gathered`] one, so each peer
//! compresses its own C(Δ_i,p + β e_i,p) of the fragment and the peers all-gather the n
//! messages (n − 1 frames a sync, the mean keeping the union of their supports), with the
//! fragment's residual decayed by β. From a shared start (`--init same`, `--init-from`)
//! every sync is compressed, each fragment's first included
//! ([`StreamingDiLoCo::compressed_from_start`]): the anchors are identical already. Its
//! chunks are runs of the fragment (`,layerwise` is refused: the fragments are ranges of
//! the flat vector).
//!
//! **State.** [`Gossip::state`] holds `streaming.anchor` `[d]`, `streaming.outer_velocity`
//! `[d]` (the fragments' optimizer states, concatenated), in the compressed form
//! `streaming.residual` `[d]` (the fragments' residuals; padding always has a zero residual),
//! and the sync in flight: `streaming.in_flight` `[d]` (the values this peer gave that sync's
//! all-reduce, at its fragment's range; zeros when none) with the scalar
//! `streaming.in_flight_sync` (its number, −1 when none). A checkpoint taken while a sync
//! is in the air (τ ≥ 1) therefore resumes by running that sync's all-reduce again from the
//! same values, residual and seed; every peer of the run does the same, and the resumed
//! run continues bit for bit (test `a_run_resumed_mid_sync_continues_bit_for_bit`). Only the
//! whole run resumes ([`crate::Resumable::WholeRun`]).
//!
//! **Drivers.** [`crate::NetSim`] delivers the ring's frames as they arrive (a
//! communication thread); a network peer learns from
//! [`Gossip::communicates_in_background`] to serve frames while it computes a gradient.
//!
//! **Not built:** the paper's 4-bit floating-point pseudo-gradients (`int8` is the nearest
//! operator here), strided layer fragments, streaming over gossip (decentralized DiLoCo).

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, Pattern, ProtocolOption, Resume,
    RunSetup,
};
use crate::mixing::pseudo_gradient::{
    check_streaming_compressor, outer_step_seed, outer_update, DILOCO_LOCAL_STEPS,
};
use crate::optimizer::OuterConfig;
use crate::BuildError;
use murmur_compress::CompressorSpec;
use std::collections::VecDeque;
use std::time::Instant;

use crate::algorithms::allreduce::{chunk_range, AllReduce};
use crate::mixing::outer_round::OuterRound;
use crate::optimizer::Optimizer;
use crate::{
    AlgorithmState, Gossip, GossipError, GossipEvent, GossipStats, MembershipError, Rank,
    StateError, Transmit,
};

/// Names of the state's vectors and scalars.
const ANCHOR: &str = "streaming.anchor";
const VELOCITY: &str = "streaming.outer_velocity";
const RESIDUAL: &str = "streaming.residual";
const IN_FLIGHT: &str = "streaming.in_flight";
const IN_FLIGHT_SYNC: &str = "streaming.in_flight_sync";

/// The schedule of the fragments' syncs: P fragments, H inner steps per outer step, overlap
/// τ (pure arithmetic on round numbers; see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Fragments P, 1 ≤ P ≤ H.
    pub fragments: u64,
    /// Inner steps per outer step H ≥ 1.
    pub h: u64,
    /// Rounds between a sync's start and its application, 0 ≤ τ ≤ ⌊H/P⌋.
    pub tau: u64,
}

impl Schedule {
    /// Checks 1 ≤ P ≤ H and τ ≤ ⌊H/P⌋.
    ///
    /// # Errors
    /// [`BuildError::Options`] naming the flag.
    pub fn new(fragments: u64, h: u64, tau: u64) -> Result<Self, BuildError> {
        if h == 0 {
            return Err(BuildError::Options(format!(
                "{} must be at least 1 (the inner steps per outer step)",
                ProtocolOption::LOCAL_STEPS.flag
            )));
        }
        if fragments == 0 || fragments > h {
            return Err(BuildError::Options(format!(
                "{} must be in 1..={h} (at most one fragment syncs per inner step, and \
                 {} is {h}), got {fragments}",
                ProtocolOption::FRAGMENTS.flag,
                ProtocolOption::LOCAL_STEPS.flag
            )));
        }
        let gap = h / fragments;
        if tau > gap {
            return Err(BuildError::Options(format!(
                "{} must be at most H/P = {h}/{fragments} = {gap} for streaming-diloco \
                 (a fragment is applied before the next one syncs), got {tau}",
                ProtocolOption::TAU.flag
            )));
        }
        Ok(Self { fragments, h, tau })
    }

    /// The fragment of sync `s`: s mod P.
    pub fn fragment(&self, s: u64) -> usize {
        (s % self.fragments) as usize
    }

    /// The offset of fragment p in each outer step: ⌊(p + 1)·H / P⌋ (in 1..=H).
    fn offset(&self, p: u64) -> u64 {
        (p + 1) * self.h / self.fragments
    }

    /// The round in which sync `s` begins: k·H + ⌊(p + 1)·H / P⌋ − 1 (s = k·P + p).
    pub fn sync_round(&self, s: u64) -> u64 {
        let (k, p) = (s / self.fragments, s % self.fragments);
        k * self.h + self.offset(p) - 1
    }

    /// The round that applies sync `s`: its round plus τ.
    pub fn apply_round(&self, s: u64) -> u64 {
        self.sync_round(s) + self.tau
    }

    /// The sync that begins in round `t`, if any.
    pub fn sync_at(&self, t: u64) -> Option<u64> {
        let (q, r) = ((t + 1) / self.h, (t + 1) % self.h);
        if r == 0 {
            return Some(q * self.fragments - 1);
        }
        (0..self.fragments - 1)
            .find(|&p| self.offset(p) == r)
            .map(|p| q * self.fragments + p)
    }

    /// How many syncs begin before round `t`.
    pub fn syncs_before(&self, t: u64) -> u64 {
        let (q, r) = (t / self.h, t % self.h);
        q * self.fragments + (0..self.fragments).filter(|&p| self.offset(p) <= r).count() as u64
    }
}

/// The sync whose all-reduce is running or done but not yet applied.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Its number s.
    sync: u64,
    /// The round that applies it: t_s + τ.
    apply_round: u64,
    /// When its all-reduce began.
    began: Instant,
    /// When its all-reduce completed.
    done: Option<Instant>,
    /// When a round began to wait for it.
    waited_from: Option<Instant>,
}

impl Pending {
    /// Sync `s` of `schedule`, its all-reduce begun at `now`.
    fn new(schedule: &Schedule, s: u64, now: Instant) -> Self {
        Self {
            sync: s,
            apply_round: schedule.apply_round(s),
            began: now,
            done: None,
            waited_from: None,
        }
    }
}

/// Streaming DiLoCo (see the [module docs](self)).
pub struct StreamingDiLoCo {
    ring: AllReduce,
    schedule: Schedule,
    /// Whether the syncs after the first P all-reduce compressed pseudo-gradients.
    compressed: bool,
    /// The sync number of the ring's round 0.
    base: u64,
    /// The run's seed for this peer (the compressor's seed of each sync derives from it).
    seed: u64,
    /// Inner learning rate η.
    lr: f32,
    /// α ∈ [0, 1].
    alpha: f32,
    outer_cfg: OuterConfig,
    /// One outer optimizer per fragment, of its length.
    opts: Vec<Box<dyn Optimizer>>,
    /// a_i: `[d]`.
    anchor: Vec<f32>,
    anchored: bool,
    /// The fragments' residuals, `[len_p]` each (compressed form only).
    residuals: Vec<Vec<f32>>,
    /// The first compressed sync: P (each fragment's first sync averages the models and
    /// aligns the anchors), or 0 from a shared start ([`StreamingDiLoCo::compressed_from_start`]).
    first_compressed: u64,
    /// `[m]`: the values given to the ring for the pending sync (padded with zeros).
    sent: Vec<f32>,
    /// `[m]` scratch of the outer step.
    delta: Vec<f32>,
    pending: Option<Pending>,
    /// A sync in flight at the checkpoint this state was restored from: its all-reduce
    /// begins again (from `sent`) with the next round.
    restart: Option<u64>,
    /// Whether the current round has begun its sync.
    started: bool,
    /// x_i, round t and the events.
    outer: OuterRound,
    diverged: VecDeque<GossipEvent>,
    /// Whether the run has diverged (the round never completes).
    stuck: bool,
    background_nanos: u64,
}

impl StreamingDiLoCo {
    /// Streaming DiLoCo on `ring` (an [`AllReduce`] of dimension m = ⌈d/P⌉ that averages;
    /// built with a compressor for the compressed form) from `x0: [d]`, with inner learning
    /// rate `lr`, merge factor `alpha` ∈ [0, 1], the outer step `outer` and `seed` for the
    /// compressor's seeds.
    ///
    /// # Errors
    /// [`BuildError::Options`] if P > d, α is outside [0, 1], the outer step does not pass
    /// [`OuterConfig::check`], or the ring's dimension is not ⌈d/P⌉.
    pub fn new(
        mut ring: AllReduce,
        schedule: Schedule,
        x0: Vec<f32>,
        lr: f32,
        alpha: f32,
        outer: OuterConfig,
        seed: u64,
    ) -> Result<Self, BuildError> {
        outer.check()?;
        check_merge_alpha(alpha)?;
        let d = x0.len();
        let p = schedule.fragments as usize;
        if p > d {
            return Err(BuildError::Options(format!(
                "{} = {p} is more than the model's {d} parameters",
                ProtocolOption::FRAGMENTS.flag
            )));
        }
        let m = d.div_ceil(p);
        if ring.params().len() != m {
            return Err(BuildError::Options(format!(
                "the fragments' all-reduce has dimension {}, expected ⌈{d}/{p}⌉ = {m}",
                ring.params().len()
            )));
        }
        let compressed = ring.residual().is_some();
        ring.set_compressed_from(schedule.fragments);
        let opts = (0..p)
            .map(|f| outer.optimizer(chunk_range(f, p, d).len()))
            .collect();
        let residuals = if compressed {
            (0..p)
                .map(|f| vec![0.0; chunk_range(f, p, d).len()])
                .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            ring,
            schedule,
            compressed,
            base: 0,
            seed,
            lr,
            alpha,
            outer_cfg: outer,
            opts,
            anchor: x0.clone(),
            anchored: false,
            residuals,
            first_compressed: schedule.fragments,
            sent: vec![0.0; m],
            delta: vec![0.0; m],
            pending: None,
            restart: None,
            started: false,
            outer: OuterRound::new(x0),
            diverged: VecDeque::new(),
            stuck: false,
            background_nanos: 0,
        })
    }

    /// The schedule of the syncs.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// The anchor a_i: `[d]`.
    pub fn anchor(&self) -> &[f32] {
        &self.anchor
    }

    /// Whether the syncs after each fragment's first all-reduce compressed pseudo-gradients.
    pub fn compresses(&self) -> bool {
        self.compressed
    }

    fn d(&self) -> usize {
        self.anchor.len()
    }

    /// Compresses every sync, each fragment's first included, for peers that all start from
    /// the same x⁰ bit for bit: their anchors need no aligning average (as `diloco`'s
    /// SparseLoCo form from a shared start). No effect on the uncompressed form; call it
    /// before the first round.
    pub fn compressed_from_start(mut self) -> Self {
        if self.compressed {
            self.first_compressed = 0;
            self.ring.set_compressed_from(self.base);
        }
        self
    }

    fn range(&self, p: usize) -> std::ops::Range<usize> {
        chunk_range(p, self.schedule.fragments as usize, self.d())
    }

    /// Whether sync `s` averages the models (uncompressed form, or a fragment's first sync
    /// in the compressed form, which aligns the anchors).
    fn mixes_models(&self, s: u64) -> bool {
        !self.compressed || s < self.first_compressed
    }

    /// Begins sync `s` from the parameters after this round's inner step; false if they are
    /// not finite (reported; the round never completes).
    fn start(&mut self, s: u64, now: Instant) -> bool {
        let p = self.schedule.fragment(s);
        let r = self.range(p);
        let len = r.len();
        self.sent.fill(0.0);
        let x = &self.outer.x[r.clone()];
        if self.mixes_models(s) {
            self.sent[..len].copy_from_slice(x);
        } else {
            for ((o, a), x) in self.sent.iter_mut().zip(&self.anchor[r.clone()]).zip(x) {
                *o = a - x;
            }
        }
        if let Some(k) = self.sent[..len].iter().position(|v| !v.is_finite()) {
            self.stuck = true;
            self.diverged.push_back(GossipEvent::Diverged {
                round: self.outer.round,
                reason: format!(
                    "Streaming DiLoCo's fragment {p} to synchronise has x[{}] = {} after the \
                     inner steps",
                    r.start + k,
                    self.outer.x[r.start + k]
                ),
            });
            return false;
        }
        self.pending = Some(Pending::new(&self.schedule, s, now));
        self.begin_ring(now);
        true
    }

    /// Hands the pending sync's values to the ring (with its fragment's residual and seed).
    fn begin_ring(&mut self, now: Instant) {
        let s = self.pending.expect("a pending sync").sync;
        debug_assert_eq!(self.ring.round(), s - self.base);
        debug_assert_eq!(
            self.ring.compresses_round(self.ring.round()),
            !self.mixes_models(s)
        );
        if self.compressed {
            // The fragment's residual, padded to m in the outer step's scratch (free until
            // the sync is applied).
            let p = self.schedule.fragment(s);
            let len = self.residuals[p].len();
            self.delta[..len].copy_from_slice(&self.residuals[p]);
            self.delta[len..].fill(0.0);
            self.ring.set_residual(&self.delta);
            self.ring.seed_compressor(outer_step_seed(self.seed, s));
        }
        self.ring.begin_round(now, &self.sent, None);
        self.pump_ring(now);
    }

    /// Moves the ring's events: its `Mixed` completes the pending sync (its result stays in
    /// the ring until [`StreamingDiLoCo::apply`]).
    fn pump_ring(&mut self, now: Instant) {
        while let Some(ev) = self.ring.poll_event() {
            match ev {
                GossipEvent::Mixed { .. } => {
                    let pending = self.pending.as_mut().expect("a sync was running");
                    pending.done = Some(now);
                    let ran = now.saturating_duration_since(pending.began);
                    let waited = pending.waited_from.map_or(std::time::Duration::ZERO, |w| {
                        now.saturating_duration_since(w)
                    });
                    self.background_nanos +=
                        u64::try_from(ran.saturating_sub(waited).as_nanos()).unwrap_or(u64::MAX);
                }
                GossipEvent::RoundTimedOut { missing, .. } => {
                    self.outer.push(GossipEvent::RoundTimedOut {
                        round: self.outer.round,
                        missing,
                    });
                }
                GossipEvent::Diverged { reason, .. } => {
                    self.stuck = true;
                    self.diverged.push_back(GossipEvent::Diverged {
                        round: self.outer.round,
                        reason,
                    });
                }
            }
        }
    }

    /// Applies the completed pending sync to the anchor and the parameters.
    fn apply(&mut self) {
        let s = self.pending.take().expect("a pending sync").sync;
        let p = self.schedule.fragment(s);
        let r = self.range(p);
        let len = r.len();
        if self.compressed && !self.mixes_models(s) {
            // The fragment's residual moves on only now: until the sync is applied, a
            // checkpoint holds the residual it began with, so a resumed run can run it again.
            let e = self.ring.residual().expect("a compressed ring");
            self.residuals[p].copy_from_slice(&e[..len]);
        }
        let out = &self.ring.params()[..len];
        let anchor = &mut self.anchor[r.clone()];
        if self.compressed && s < self.first_compressed {
            // The fragment's first sync in the compressed form: the anchors align on the
            // exact mean.
            anchor.copy_from_slice(out);
        } else {
            let delta = &mut self.delta[..len];
            if self.compressed {
                delta.copy_from_slice(out);
            } else {
                for ((dl, a), m) in delta.iter_mut().zip(anchor.iter()).zip(out) {
                    *dl = a - m;
                }
            }
            outer_update(&mut *self.opts[p], self.outer_cfg.lr, anchor, delta);
        }
        let alpha = self.alpha;
        for (x, a) in self.outer.x[r].iter_mut().zip(anchor.iter()) {
            *x = alpha * *x + (1.0 - alpha) * a;
        }
    }

    /// Takes the round as far as it goes: applies the sync due (or waits for it), begins
    /// the sync due, completes the round.
    fn advance(&mut self, now: Instant) {
        loop {
            if self.stuck {
                return;
            }
            let t = self.outer.round;
            if let Some(p) = self.pending.as_mut() {
                if p.apply_round == t {
                    if p.done.is_none() {
                        if !self.outer.waiting {
                            self.outer.waiting = true;
                            p.waited_from = Some(now);
                        }
                        return;
                    }
                    self.apply();
                }
            }
            if !self.started {
                if let Some(s) = self.schedule.sync_at(t) {
                    self.started = true;
                    if !self.start(s, now) {
                        return;
                    }
                    continue;
                }
            }
            self.outer.waiting = false;
            self.started = false;
            self.outer.complete();
            return;
        }
    }

    /// After the ring had a chance to move: its events, then the round if it waits.
    fn pump(&mut self, now: Instant) {
        self.pump_ring(now);
        if self.outer.waiting {
            self.advance(now);
        }
    }
}

/// Refuses a merge factor α outside [0, 1].
pub(crate) fn check_merge_alpha(alpha: f32) -> Result<(), BuildError> {
    if (0.0..=1.0).contains(&alpha) {
        Ok(())
    } else {
        Err(BuildError::Options(format!(
            "{} must be in [0, 1], got {alpha}",
            ProtocolOption::MERGE_ALPHA.flag
        )))
    }
}

impl Gossip for StreamingDiLoCo {
    /// One inner step from `x: [d]` with the direction `grad: [d]` (none: zero); the round
    /// then applies the sync due τ rounds after it began (waiting for its all-reduce if it
    /// has not finished) and begins the sync due in this round.
    ///
    /// # Panics
    /// If `x` or `grad` is not `[d]`, or the previous round is still waiting.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.outer.assert_idle();
        assert_eq!(x.len(), self.d(), "x must have length d");
        if !self.anchored {
            self.anchor.copy_from_slice(x);
            self.anchored = true;
        }
        if let Some(s) = self.restart.take() {
            self.pending = Some(Pending::new(&self.schedule, s, now));
            self.begin_ring(now);
        }
        // y = x − η g
        crate::mixing::local_step(&mut self.outer.x, x, grad, self.lr);
        self.advance(now);
    }

    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let r = self.ring.handle_message(now, from, frame);
        self.pump(now);
        r
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.ring.handle_timeout(now);
        self.pump(now);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.ring.poll_transmit()
    }

    /// With τ ≥ 1 a fragment's all-reduce runs between rounds.
    fn communicates_in_background(&self) -> bool {
        self.schedule.tau > 0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.ring.poll_timeout()
    }

    /// Every call that can move the ring pumps its events, so there is nothing to pump here.
    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.outer
            .poll_event()
            .or_else(|| self.diverged.pop_front())
    }

    fn params(&self) -> &[f32] {
        &self.outer.x
    }

    fn round(&self) -> u64 {
        self.outer.round
    }

    /// The ring's counters (the bytes actually sent), and the time the syncs ran behind
    /// the rounds.
    fn stats(&self) -> GossipStats {
        GossipStats {
            background_nanos: self.background_nanos,
            ..self.ring.stats()
        }
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.ring.set_epoch(epoch);
    }

    fn out_peers(&self) -> Vec<Rank> {
        self.ring.out_peers()
    }

    fn in_peers(&self) -> Vec<Rank> {
        self.ring.in_peers()
    }

    /// Moves to round `round`: the ring counts from 0 again, as sync
    /// [`Schedule::syncs_before`]`(round)` (every peer of a resumed run does the same).
    ///
    /// # Panics
    /// If a round is waiting (a driver bug).
    fn start_at_round(&mut self, round: u64) -> Result<(), MembershipError> {
        self.outer.assert_idle();
        if self.ring.round() != 0 || self.pending.is_some() || self.restart.is_some() {
            return Err(MembershipError::Unsupported {
                algorithm: "streaming-diloco",
                why: "a single peer cannot rejoin a running ring all-reduce; the whole run \
                      resumes from its checkpoints",
            });
        }
        self.outer.round = round;
        self.set_base(self.schedule.syncs_before(round));
        Ok(())
    }

    /// The anchor, the fragments' outer velocities, (compressed form) the residuals, the sync
    /// in flight and its number.
    fn state(&self) -> AlgorithmState {
        let d = self.d();
        let anchor = if self.anchored {
            self.anchor.clone()
        } else {
            self.outer.x.clone()
        };
        let velocity: Vec<f32> = self.opts.iter().flat_map(|o| o.state()).collect();
        let mut vectors = vec![(ANCHOR.into(), anchor), (VELOCITY.into(), velocity)];
        if self.compressed {
            let e: Vec<f32> = self.residuals.iter().flatten().copied().collect();
            vectors.push((RESIDUAL.into(), e));
        }
        let mut in_flight = vec![0.0; d];
        let sync = match self.pending.map(|p| p.sync).or(self.restart) {
            Some(s) => {
                let r = self.range(self.schedule.fragment(s));
                let len = r.len();
                in_flight[r].copy_from_slice(&self.sent[..len]);
                s as f64
            }
            None => -1.0,
        };
        vectors.push((IN_FLIGHT.into(), in_flight));
        AlgorithmState {
            scalars: vec![(IN_FLIGHT_SYNC.into(), sync)],
            vectors,
        }
    }

    /// Restores what [`Gossip::state`] saved, after [`Gossip::start_at_round`]; a sync in
    /// flight is run again at the next round.
    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        if state.is_empty() {
            return Ok(());
        }
        let d = self.d();
        let want: &[&str] = if self.compressed {
            &[ANCHOR, VELOCITY, RESIDUAL, IN_FLIGHT]
        } else {
            &[ANCHOR, VELOCITY, IN_FLIGHT]
        };
        murmur_compress::check_state(&state.vectors, want, d)?;
        let sync = match state.scalars.as_slice() {
            [(name, v)] if name == IN_FLIGHT_SYNC && v.fract() == 0.0 && *v >= -1.0 => *v,
            other => {
                return Err(StateError(format!(
                    "Streaming DiLoCo expects the scalar {IN_FLIGHT_SYNC:?} (−1 or a sync \
                     number), got {other:?}"
                )))
            }
        };
        let round = self.outer.round;
        // The sync that round `round` waits for: the last one begun, if not yet applied.
        let expected = self
            .schedule
            .syncs_before(round)
            .checked_sub(1)
            .filter(|&s| self.schedule.apply_round(s) >= round);
        let pending = (sync >= 0.0).then_some(sync as u64);
        if pending != expected {
            return Err(StateError(format!(
                "the checkpoint's sync in flight is {pending:?}, but at round {round} it \
                 must be {expected:?}"
            )));
        }
        let p = self.schedule.fragments as usize;
        let mut opts: Vec<Box<dyn Optimizer>> = Vec::with_capacity(p);
        let velocity = &state.vectors[1].1;
        for f in 0..p {
            let mut o = self.outer_cfg.optimizer(self.range(f).len());
            o.restore(velocity[self.range(f)].to_vec())
                .map_err(|e| StateError(e.to_string()))?;
            opts.push(o);
        }
        self.opts = opts;
        self.anchor.clone_from(&state.vectors[0].1);
        self.anchored = true;
        if self.compressed {
            let e = &state.vectors[2].1;
            for f in 0..p {
                let r = self.range(f);
                self.residuals[f].copy_from_slice(&e[r]);
            }
        }
        self.pending = None;
        self.restart = pending;
        if let Some(s) = pending {
            let r = self.range(self.schedule.fragment(s));
            let len = r.len();
            self.sent.fill(0.0);
            self.sent[..len].copy_from_slice(&state.vectors[want.len() - 1].1[r]);
            self.set_base(s);
        } else {
            self.set_base(self.schedule.syncs_before(round));
        }
        Ok(())
    }
}

impl StreamingDiLoCo {
    /// The ring's round 0 is sync `base`: the first P syncs of the run are raw in the
    /// compressed form.
    fn set_base(&mut self, base: u64) {
        self.base = base;
        self.ring
            .set_compressed_from(self.first_compressed.saturating_sub(base));
    }
}

/// Streaming DiLoCo in the [`crate::registry`].
pub struct StreamingDiLoCoAlgorithm;

/// The registry's entry for Streaming DiLoCo.
pub const STREAMING_DILOCO: StreamingDiLoCoAlgorithm = StreamingDiLoCoAlgorithm;

/// The overlap τ when `--tau` is not given.
pub const DEFAULT_TAU: u64 = 1;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Fixed("ring all-reduce"),
    local_steps: Some(DILOCO_LOCAL_STEPS),
    default_tau: DEFAULT_TAU,
    compresses: Compresses::PseudoGradients,
    default_compressor: CompressorSpec::Identity,
    options: &[
        ProtocolOption::LOCAL_STEPS,
        ProtocolOption::TAU,
        ProtocolOption::OUTER_OPTIMIZER,
        ProtocolOption::OUTER_LR,
        ProtocolOption::OUTER_MOMENTUM,
        ProtocolOption::FRAGMENTS,
        ProtocolOption::MERGE_ALPHA,
    ],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::WholeRun,
};

impl Algorithm for StreamingDiLoCoAlgorithm {
    fn name(&self) -> &'static str {
        "streaming-diloco"
    }
    fn about(&self) -> &'static str {
        "Streaming DiLoCo (Douillard et al. 2025): DiLoCo whose P fragments (--fragments, \
         default 4) sync at staggered inner steps by ring all-reduce and are applied --tau \
         steps later (default 1), merged with the local fragment (--merge-alpha, default \
         0.5), so communication hides behind compute; --compressor int8 compresses the \
         pseudo-gradients, --compressor sparseloco all-gathers them as SparseLoCo does"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// Refuses a compressor that a pseudo-gradient ring cannot use
    /// ([`check_streaming_compressor`]).
    fn check(&self, run: &RunSetup<'_>) -> Result<(), BuildError> {
        run.options
            .compressor
            .as_ref()
            .map_or(Ok(()), check_streaming_compressor)
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let o = ctx.options;
        let schedule = Schedule::new(o.fragments(), o.local_steps(self), o.tau(self))?;
        let alpha = o.merge_alpha();
        // P > d is refused by `StreamingDiLoCo::new`.
        let (d, p) = (ctx.dim(), schedule.fragments as usize);
        let m = d.div_ceil(p);
        let spec = o.compressor(self);
        check_streaming_compressor(&spec)?;
        let (x0, lr, seed, outer) = (ctx.x0.clone(), ctx.lr, ctx.seed, o.outer());
        let mut cfg = crate::AllReduceConfig::new(ctx.rank, ctx.peers(), 0.0, m);
        cfg.round_timeout = ctx.round_timeout;
        let zeros = vec![0.0; m];
        let gathered = matches!(spec, CompressorSpec::SparseLoco { .. });
        let ring = match spec {
            CompressorSpec::Identity => AllReduce::new(cfg, zeros),
            // SparseLoCo as its paper aggregates: each peer's own compressed pseudo-gradient
            // of the fragment, all-gathered, with the decayed residual.
            CompressorSpec::SparseLoco { decay, .. } => {
                AllReduce::gathered(cfg, zeros, spec.build(None)?, decay)
            }
            _ => AllReduce::compressed(cfg, zeros, spec.build(None)?),
        };
        let peer = StreamingDiLoCo::new(ring, schedule, x0, lr, alpha, outer, seed)?;
        Ok(Box::new(if gathered && ctx.shared_start {
            peer.compressed_from_start()
        } else {
            peer
        }))
    }
}
