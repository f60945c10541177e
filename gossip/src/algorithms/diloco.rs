//! DiLoCo: H inner steps, then one outer step on the averaged pseudo-gradient (Douillard,
//! Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam & Shen 2023, "DiLoCo:
//! Distributed Low-Communication Training of Language Models", Algorithm 1), around a
//! communicating algorithm: exact averaging by ring all-reduce (`diloco`, the paper's form)
//! or gossip on the topology's W (`diloco-gossip`, the decentralized form of NoLoCo,
//! Kolehmainen et al. 2025, "NoLoCo: No-all-reduce Low Communication Training Method for
//! Large Models").
//!
//! Peer i keeps its parameters x_i: `[d]` and an anchor a_i: `[d]` (the parameters at the
//! last outer step; a_i = x⁰ at the start). Every call of [`Gossip::begin_round`] is one
//! inner step with the direction u_i: `[d]` of the node's inner optimizer (SGD, AdamW):
//!
//! ```text
//! x_i ← x_i − η u_i                                  every round t (inner step; no frame
//!                                                     unless (t + 1) mod H = 0)
//! if (t + 1) mod H = 0 (outer step):
//!     m_i  = inner.mix(x)_i                          [d]  all-reduce: (1/n) Σ_j x_j;
//!                                                         gossip:     Σ_j W_ij x_j
//!     Δ̄_i  = a_i − m_i                               [d]  the averaged pseudo-gradient
//!     a_i ← a_i − η_out · OuterOpt(Δ̄_i)              [d]  Nesterov (μ = 0.9, η_out = 0.7)
//!                                                         or SGD (heavy ball, μ = 0, η_out = 1)
//!     x_i ← a_i
//! ```
//!
//! where t counts this wrapper's rounds from 0 and `inner.mix` is one round of the inner
//! algorithm begun with `grad = None`. The inner algorithm counts only outer steps, so its
//! frames carry round ⌊t / H⌋; [`Gossip::round`] and [`GossipEvent`]s count inner steps t.
//! Bytes per inner step fall by a factor H against the inner algorithm run every step.
//!
//! **Why the models are mixed, not Δ.** With the all-reduce and a shared start x⁰ every
//! peer holds the same anchor a, and Δ̄_i = a − (1/n) Σ_j x_j = (1/n) Σ_j (a − x_j) is the
//! paper's mean pseudo-gradient, bit for bit the same on every peer (the ring's sums are,
//! so the anchors stay identical). Mixing the models instead of Δ also pulls anchors that
//! differ (`--init independent`) together. In the gossip form the anchors differ by
//! construction, and mixing Δ alone, a_i ← a_i − Σ_j W_ij Δ_j, has no consensus term: on
//! quadratics f_i = ½‖x − b_i‖² its fixed point is a_i = b_i, every peer at its own
//! optimum. Mixing the models gives Δ̄_i = Σ_j W_ij Δ_j + (a_i − Σ_j W_ij a_j), which is
//! NoLoCo's outer step with the consensus weight equal to the pseudo-gradient's (γ = β);
//! with doubly stochastic W the average of the anchors follows the all-reduce form's,
//! and SGD with η_out = 1 is local-SGD gossip ([`crate::LocalSgd`]) exactly.
//!
//! **Compression.** The gossip form's messages go through D-PSGD's compressor (unchanged),
//! so they carry compressed models x_j, like local-SGD gossip: a cast (fp16, bf16) is
//! harmless, a sparsifier biases the models. Compressing the pseudo-gradient in the gossip
//! form, with error feedback, would need the neighbours' anchors on the receiving side
//! (CHOCO-style copies) and is not built. Streaming DiLoCo (fragments of the model
//! synchronised at staggered times, overlapped with the inner steps) is
//! [`crate::algorithms::streaming_diloco`]. The all-reduce form compresses the pseudo-gradients, below.
//! [`Gossip::stats`] counts the inner algorithm's frames: the bytes actually sent.
//!
//! # Compressed pseudo-gradients
//!
//! `diloco` with a compressor other than the identity all-reduces the pseudo-gradients
//! Δ_i = a − x_i: `[d]` instead of the models, through the compressed rounds of ring
//! all-reduce ([`AllReduce::compressed`]; the int8 ring all-reduce of pseudo-gradients of
//! the INTELLECT-1 technical report, Prime Intellect 2024, on DiLoCo, Douillard et al.
//! 2023). "int8" here is `int8` ([`murmur_compress::Int8`]: 1 sign bit and 7 level bits
//! per value, and one `f32` scale per 128 values, the bucket's largest magnitude);
//! `qsgd:127,bucket=128` is the same size with the bucket's norm as the scale, a coarser
//! step. Any stateless operator works. With the identity, `diloco` is exactly the
//! uncompressed form above.
//!
//! ```text
//! outer step 1 (raw):   m = (1/n) Σ_j x_j           [d]  ring all-reduce of the models, f32
//!                       a ← m, x_i ← m                   the anchors align; no optimizer step
//! outer step k ≥ 2:     Δ_i = a − x_i               [d]
//!                       Δ̄ = (1/n) C-ring(Σ_j Δ_j)   [d]  compressed ring all-reduce with
//!                                                         error feedback, decoded
//!                       a ← a − η_out · OuterOpt(Δ̄), x_i ← a
//! ```
//!
//! *Why a raw first step.* The Δ form needs the same anchor a on every peer: Δ̄ is only the
//! mean pseudo-gradient of one anchor, and mixing Δ alone never pulls anchors that differ
//! together. Peers may start apart (`--init independent`), and even from a shared start an
//! outer step from differing anchors would keep them apart, so the first outer step
//! averages the models uncompressed and restarts every peer from that average: a ← m on
//! every peer, bit for bit (the ring's sums are), with the outer optimizer's velocity
//! still 0. That is local SGD's averaging step; from a shared start it differs from the
//! uncompressed form's first step (a − η_out·OuterOpt(a − m)) unless the outer step is SGD
//! with η_out = 1. It costs one raw all-reduce: 2(n − 1) frames of 28 + 4⌈d/n⌉ bytes or
//! so per peer, once. From then on the anchors stay identical: every peer applies the same
//! decoded Δ̄ with the same optimizer state.
//!
//! *The ring.* Reduce-scatter: at each hop the sender compresses its partial sum of the
//! chunk plus its residual on that chunk, keeps the new residual (value − decoded), the
//! receiver decodes and adds its own Δ chunk. All-gather: the owner of a complete sum
//! compresses it (plus its residual) once; every peer, the owner included, uses the
//! decoded value and forwards the same bytes, so every peer ends with the bitwise-same Δ̄.
//! The frames are [`crate::FrameKind::Reduce`] frames, header round = the outer step's
//! ring round, dim = d, whose payload is
//!
//! ```text
//! offset  size  field
//!      0     4  step   u32 LE, 0 ≤ step < 2(n − 1)
//!      4     …  chunk  a murmur_compress message of dimension len (the chunk's length,
//!                      ⌊d/n⌋ or ⌊d/n⌋ + 1); nothing for an empty chunk (d < n)
//! ```
//!
//! A frame whose message does not decode for that length, whose step or round is out of
//! range, whose header dim is not d, or whose values are not finite is refused with a
//! [`GossipError`] and changes nothing (see [`crate::algorithms::allreduce`]).
//!
//! *The residual* e_i: `[d]` (`diloco.residual`, zero at the start) is one vector per peer:
//! in every compressed outer step peer i compresses each coordinate exactly once, the
//! chunks other than (i + 1) mod n as reduce-scatter partial sums and its own chunk
//! (i + 1) mod n as the complete sum in the all-gather, so each coordinate's residual
//! always belongs to the same position of the schedule. Nothing is dropped: over the
//! compressed outer steps, n Σ_t Δ̄_t + Σ_i e_i = Σ_t Σ_j Δ_j,t (in exact arithmetic;
//! test `the_residual_carries_what_the_compressed_ring_did_not_send`). Error feedback is
//! applied whatever the operator, so the operators that `ef+` refuses (scaled random-k,
//! TernGrad, QSGD with ω ≥ 1) are refused, and so are those with state of their own
//! (`ef+…`, DGC) and layer-wise top-k (the ring's chunks do not follow the tensors;
//! `sparseloco,layerwise` is taken, its messages being all-gathered whole).
//! The operator's randomness is seeded per outer step from the peer's seed and the outer
//! step's number, so a resumed run replays it.
//!
//! *Bytes* per peer per compressed outer step: 2(n − 1) frames of 24 + 4 + |C(len)| bytes,
//! about 2(n − 1)/n · |C(d)|, against 2(n − 1) · (28 + 4 len) raw. With `qsgd:127` (one byte
//! per value, a norm per 128): 0.278 of the raw bytes for n = 4, d = 2000 (test
//! `int8_pseudo_gradients_reach_the_uncompressed_loss_with_under_0_3_of_the_bytes`).
//!
//! *Accuracy.* With heterogeneous peers the Δ_j do not vanish at the optimum (only their
//! sum does), so the compressed partial sums keep a noise floor: on the quadratics of the
//! int8 test (n = 4, d = 2000, H = 5, Nesterov), f − f* after 30 outer steps is 1.5·10⁻³
//! with `int8` and 2.8·10⁻² with `qsgd:127,bucket=128`, against 6.5·10⁻⁶ uncompressed, from
//! f(x⁰) − f* = 424 (floors of 4·10⁻⁶ and 7·10⁻⁵ of the start gap). A biased operator needs a smaller η_out: top-k 10% with outer SGD η_out = 0.3
//! gets ‖a − b̄‖ from 12.9 to 1.19 (1.19 against 5.0 without the residual), and top-k 5%
//! with η_out = 1 diverges.
//!
//! # SparseLoCo
//!
//! `diloco --compressor sparseloco[:R][,chunk=C][,decay=β]` is SparseLoCo (Sarfi, Thérien,
//! Lidin & Belilovsky 2025, "Communication Efficient LLM Pre-training with SparseLoCo",
//! Algorithm 1): each peer compresses its own pseudo-gradient with a decayed error
//! feedback and the peers all-gather the messages ([`AllReduce::gathered`]), so the mean
//! keeps the union of the n sparse supports (a compressed ring would re-sparsify every
//! partial sum, keeping k of each chunk of the whole sum):
//!
//! ```text
//! outer step k:  Δ_i = a − x_i                          [d]
//!                p_i = Δ_i + β e_i,  q_i = C(p_i),  e_i ← p_i − C(p_i)
//!                Δ̄ = (1/n) Σ_r C(q_r)  (rank order)    [d]  bitwise the same on every peer
//!                a ← a − η_out · OuterOpt(Δ̄),  x_i ← a
//! ```
//!
//! The paper drops the outer momentum: the decayed residual plays its part, so with
//! SparseLoCo the outer step defaults to SGD with η_out = 1 and μ = 0
//! ([`crate::AlgorithmOptions::outer`]); β = 0.95 by default. When every peer starts from
//! the same x⁰ (`BuildContext::shared_start`) the anchors are identical from the start and
//! every outer step is compressed, as in the paper; otherwise the first one aligns the
//! anchors raw, as above. Bytes per peer per outer step: (n − 1) frames of
//! 24 + 4 + |C(d)|. The residual, its state and resume are the compressed form's.
//!
//! **State.** [`Gossip::state`] holds the anchor (`diloco.anchor`), the outer optimizer's
//! velocity (`diloco.outer_velocity`), in the compressed form the residual
//! (`diloco.residual`) and the scalar `diloco.aligned` (1 once the raw first outer step
//! has aligned the anchors: a run resumed before it aligns them first, one resumed after
//! it goes on compressing), and the inner algorithm's state (its compressor's
//! error-feedback residual, if any), so a run resumed from its checkpoints continues
//! exactly. The compressed form's operators keep no state of their own (see above), so
//! there is none to save for them. A state of the wrong form (lengths, names, a missing or
//! bad `diloco.aligned`, a compressed state into an uncompressed run or the reverse) is
//! refused with a [`StateError`] and changes nothing. The anchor is taken from the x of
//! the first [`Gossip::begin_round`] (not from x⁰ at construction), so a DiLoCo phase of a
//! phase schedule starts from where the previous phase ended.

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, Pattern, ProtocolOption, Resume,
    RunSetup,
};
use crate::mixing::pseudo_gradient::{
    check_pseudo_gradient_compressor, outer_step_seed, outer_update, DILOCO_LOCAL_STEPS,
};
use crate::optimizer::OuterConfig;
use crate::BuildError;
use murmur_compress::CompressorSpec;
use std::collections::VecDeque;
use std::time::Instant;

use crate::algorithms::allreduce::AllReduce;
use crate::mixing::outer_round::OuterRound;
use crate::optimizer::Optimizer;
use crate::{
    AlgorithmState, Gossip, GossipError, GossipEvent, GossipStats, MembershipError, Rank,
    StateError, Transmit,
};

/// Names of DiLoCo's own vectors and scalars in [`AlgorithmState`].
const ANCHOR: &str = "diloco.anchor";
const VELOCITY: &str = "diloco.outer_velocity";
const RESIDUAL: &str = "diloco.residual";
const ALIGNED: &str = "diloco.aligned";

/// What the outer steps mix.
enum Mixer {
    /// The models x_i, by any algorithm that mixes its parameters when begun with
    /// `grad = None` (`diloco` uncompressed, `diloco-gossip`).
    Models(Box<dyn Gossip>),
    /// The pseudo-gradients Δ_i = a − x_i, by a compressed ring all-reduce, once the
    /// anchors are aligned (see the [module docs](self#compressed-pseudo-gradients)).
    PseudoGradients {
        ring: Box<AllReduce>,
        /// Whether the anchors are identical on every peer (after the first outer step).
        aligned: bool,
        /// The run's seed for this peer, from which each outer step's compressor seed is
        /// drawn.
        seed: u64,
    },
}

impl Mixer {
    fn gossip(&self) -> &dyn Gossip {
        match self {
            Mixer::Models(g) => g.as_ref(),
            Mixer::PseudoGradients { ring, .. } => ring.as_ref(),
        }
    }

    fn gossip_mut(&mut self) -> &mut dyn Gossip {
        match self {
            Mixer::Models(g) => g.as_mut(),
            Mixer::PseudoGradients { ring, .. } => ring.as_mut(),
        }
    }
}

/// What the outer step that is mixing does when its round completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OuterKind {
    /// `outer.x` holds m = mix(x): Δ̄ = a − m, then the outer optimizer.
    Models,
    /// `outer.x` holds the exact mean of the models: a ← m (the anchors align).
    Align,
    /// `outer.x` holds the decoded mean pseudo-gradient Δ̄: the outer optimizer.
    PseudoGradient,
}

/// DiLoCo around `inner` (see the [module docs](self)).
pub struct DiLoCo {
    mixer: Mixer,
    /// What the mixing outer step does when it completes.
    kind: OuterKind,
    /// Inner steps per outer step H ≥ 1.
    h: u64,
    /// Learning rate η of the inner steps.
    lr: f32,
    outer_cfg: OuterConfig,
    outer_opt: Box<dyn Optimizer>,
    /// a_i: `[d]`, the parameters after the last outer step.
    anchor: Vec<f32>,
    /// Whether `anchor` holds a value (taken at the first round, or restored).
    anchored: bool,
    /// Δ̄_i: `[d]`, scratch of the outer step.
    delta: Vec<f32>,
    /// x_i, the round t (one per inner step) and the events; `waiting` while an outer step's
    /// mixing runs in `inner`.
    outer: OuterRound,
    /// [`GossipEvent::Diverged`], after the relayed events.
    diverged: VecDeque<GossipEvent>,
}

impl DiLoCo {
    /// Wraps `inner` (whose parameters are the starting point x⁰: `[d]`; it must mix its
    /// parameters when begun with `grad = None`) with `h` inner steps of learning rate `lr`
    /// per outer step `outer`.
    ///
    /// # Errors
    /// [`BuildError::Options`] if `h` is 0 or `outer` does not pass [`OuterConfig::check`].
    pub fn new(
        inner: Box<dyn Gossip>,
        h: u64,
        lr: f32,
        outer: OuterConfig,
    ) -> Result<Self, BuildError> {
        if h == 0 {
            return Err(BuildError::Options(format!(
                "{} must be at least 1 (DiLoCo's inner steps per outer step)",
                ProtocolOption::LOCAL_STEPS.flag
            )));
        }
        Self::with_mixer(Mixer::Models(inner), h, lr, outer)
    }

    fn with_mixer(mixer: Mixer, h: u64, lr: f32, outer: OuterConfig) -> Result<Self, BuildError> {
        if h == 0 {
            return Err(BuildError::Options(format!(
                "{} must be at least 1 (DiLoCo's inner steps per outer step)",
                ProtocolOption::LOCAL_STEPS.flag
            )));
        }
        outer.check()?;
        let x0 = mixer.gossip().params().to_vec();
        let d = x0.len();
        Ok(DiLoCo {
            outer_opt: outer.optimizer(d),
            outer_cfg: outer,
            anchor: x0.clone(),
            anchored: false,
            delta: vec![0.0; d],
            outer: OuterRound::new(x0),
            diverged: VecDeque::new(),
            mixer,
            kind: OuterKind::Models,
            h,
            lr,
        })
    }

    /// DiLoCo whose outer steps all-reduce compressed pseudo-gradients through `ring` (an
    /// [`AllReduce::compressed`] ring whose parameters are x⁰: `[d]`; see the
    /// [module docs](self#compressed-pseudo-gradients)). The first outer step averages the
    /// models uncompressed, which aligns the anchors. `seed` draws the compressor's seed of
    /// each outer step (from the outer step's number, so a resumed run replays it).
    ///
    /// # Errors
    /// As [`DiLoCo::new`].
    ///
    /// # Panics
    /// If `ring` has no compressor.
    pub fn compressed(
        ring: AllReduce,
        h: u64,
        lr: f32,
        outer: OuterConfig,
        seed: u64,
    ) -> Result<Self, BuildError> {
        assert!(
            ring.residual().is_some(),
            "DiLoCo::compressed needs an AllReduce::compressed ring"
        );
        Self::pseudo_gradients(ring, h, lr, outer, seed, false)
    }

    /// SparseLoCo (Sarfi et al. 2025, Algorithm 1): DiLoCo whose outer steps all-gather
    /// each peer's compressed pseudo-gradient C(Δ_i + β e_i) through `ring` (an
    /// [`AllReduce::gathered`] ring whose parameters are x⁰: `[d]`; see the
    /// [module docs](self#sparseloco)). With `aligned` (every peer starts from the same
    /// x⁰, so the anchors are identical from the start) every outer step is compressed,
    /// as in the paper; otherwise the first one averages the models raw, as
    /// [`DiLoCo::compressed`].
    ///
    /// # Errors
    /// As [`DiLoCo::new`].
    ///
    /// # Panics
    /// If `ring` is not gathered.
    pub fn gathered(
        ring: AllReduce,
        h: u64,
        lr: f32,
        outer: OuterConfig,
        seed: u64,
        aligned: bool,
    ) -> Result<Self, BuildError> {
        assert!(
            ring.gathers_round(ring.round()),
            "DiLoCo::gathered needs an AllReduce::gathered ring"
        );
        Self::pseudo_gradients(ring, h, lr, outer, seed, aligned)
    }

    /// The compressed form around `ring`: its next round is compressed if the anchors are
    /// `aligned` already, else it is the raw alignment.
    fn pseudo_gradients(
        mut ring: AllReduce,
        h: u64,
        lr: f32,
        outer: OuterConfig,
        seed: u64,
        aligned: bool,
    ) -> Result<Self, BuildError> {
        let next = ring.round();
        ring.set_compressed_from(if aligned { next } else { next + 1 });
        let mixer = Mixer::PseudoGradients {
            ring: Box::new(ring),
            aligned,
            seed,
        };
        Self::with_mixer(mixer, h, lr, outer)
    }

    /// Whether the outer steps all-reduce compressed pseudo-gradients.
    pub fn compresses(&self) -> bool {
        matches!(self.mixer, Mixer::PseudoGradients { .. })
    }

    /// Whether the anchors are known to be identical on every peer: the compressed form
    /// after its first outer step (or restored so). `false` for the uncompressed forms.
    pub fn aligned(&self) -> bool {
        matches!(self.mixer, Mixer::PseudoGradients { aligned: true, .. })
    }

    /// The error-feedback residual e_i: `[d]` of the compressed form (`None` otherwise).
    pub fn residual(&self) -> Option<&[f32]> {
        match &self.mixer {
            Mixer::PseudoGradients { ring, .. } => ring.residual(),
            Mixer::Models(_) => None,
        }
    }

    /// Inner steps per outer step H.
    pub fn local_steps(&self) -> u64 {
        self.h
    }

    /// The outer step's configuration.
    pub fn outer_config(&self) -> OuterConfig {
        self.outer_cfg
    }

    /// The anchor a_i: `[d]`, the parameters after the last outer step.
    pub fn anchor(&self) -> &[f32] {
        &self.anchor
    }

    /// Whether round t ends with an outer step: (t + 1) mod H = 0.
    pub fn communicates(&self, t: u64) -> bool {
        (t + 1).is_multiple_of(self.h)
    }

    /// Moves the inner algorithm's events out; when its mixing round completes, takes the
    /// outer step before anyone can read the parameters.
    fn pump(&mut self) {
        let waiting = self.outer.waiting;
        self.outer.pump(self.mixer.gossip_mut());
        if waiting && !self.outer.waiting {
            self.outer_step();
        }
    }

    /// `outer.x` holds m_i = mix(x)_i (Δ̄ = a − m) or Δ̄ itself; a ← a − η_out · OuterOpt(Δ̄),
    /// x ← a. The alignment step instead sets a ← m.
    fn outer_step(&mut self) {
        match self.kind {
            OuterKind::Models => {
                for ((dl, a), m) in self.delta.iter_mut().zip(&self.anchor).zip(&self.outer.x) {
                    *dl = a - m;
                }
            }
            OuterKind::PseudoGradient => self.delta.copy_from_slice(&self.outer.x),
            OuterKind::Align => {
                self.anchor.copy_from_slice(&self.outer.x);
                if let Mixer::PseudoGradients { aligned, .. } = &mut self.mixer {
                    *aligned = true;
                }
                return;
            }
        }
        outer_update(
            &mut *self.outer_opt,
            self.outer_cfg.lr,
            &mut self.anchor,
            &self.delta,
        );
        self.outer.x.copy_from_slice(&self.anchor);
    }
}

impl Gossip for DiLoCo {
    /// One inner step from `x: [d]` with the direction `grad: [d]` (none: a step of zero
    /// direction); every H-th ends with the outer step.
    ///
    /// If the model to mix at an outer step has a non-finite coordinate (the run has
    /// diverged; its frames would be refused), [`GossipEvent::Diverged`] is reported and the
    /// round never completes.
    ///
    /// # Panics
    /// If `x` or `grad` is not `[d]`, or the previous round is still mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.outer.assert_idle();
        assert_eq!(x.len(), self.outer.x.len(), "x must have length d");
        if !self.anchored {
            self.anchor.copy_from_slice(x);
            self.anchored = true;
        }
        // y = x − η g
        crate::mixing::local_step(&mut self.outer.x, x, grad, self.lr);
        if self.communicates(self.outer.round) {
            self.outer.waiting = true;
            if let Some((k, v)) = crate::mixing::not_finite(&self.outer.x) {
                self.diverged.push_back(GossipEvent::Diverged {
                    round: self.outer.round,
                    reason: format!(
                        "DiLoCo's model to average has x[{k}] = {v} after the inner steps"
                    ),
                });
                return;
            }
            match &mut self.mixer {
                Mixer::Models(inner) => {
                    self.kind = OuterKind::Models;
                    inner.begin_round(now, &self.outer.x, None);
                }
                Mixer::PseudoGradients {
                    ring,
                    aligned: false,
                    ..
                } => {
                    debug_assert!(!ring.compresses_round(ring.round()));
                    self.kind = OuterKind::Align;
                    ring.begin_round(now, &self.outer.x, None);
                }
                Mixer::PseudoGradients {
                    ring,
                    aligned: true,
                    seed,
                } => {
                    debug_assert!(ring.compresses_round(ring.round()));
                    for ((dl, a), x) in self.delta.iter_mut().zip(&self.anchor).zip(&self.outer.x) {
                        *dl = a - x;
                    }
                    if let Some(k) = self.delta.iter().position(|v| !v.is_finite()) {
                        self.diverged.push_back(GossipEvent::Diverged {
                            round: self.outer.round,
                            reason: format!(
                                "DiLoCo's pseudo-gradient has Δ[{k}] = {}",
                                self.delta[k]
                            ),
                        });
                        return;
                    }
                    let outer_step = self.outer.round / self.h;
                    ring.seed_compressor(outer_step_seed(*seed, outer_step));
                    self.kind = OuterKind::PseudoGradient;
                    ring.begin_round(now, &self.delta, None);
                }
            }
            self.pump();
        } else {
            self.outer.complete();
        }
    }

    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let r = self.mixer.gossip_mut().handle_message(now, from, frame);
        self.pump();
        r
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.mixer.gossip_mut().handle_timeout(now);
        self.pump();
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.mixer.gossip_mut().poll_transmit()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.mixer.gossip().poll_timeout()
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.pump();
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

    /// The inner algorithm's counters: the frames of the outer steps, as sent.
    fn stats(&self) -> GossipStats {
        self.mixer.gossip().stats()
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.mixer.gossip_mut().set_epoch(epoch);
    }

    fn out_peers(&self) -> Vec<Rank> {
        self.mixer.gossip().out_peers()
    }

    fn in_peers(&self) -> Vec<Rank> {
        self.mixer.gossip().in_peers()
    }

    fn reweights(&self) -> bool {
        self.mixer.gossip().reweights()
    }

    fn observe_link(&mut self, from: Rank, bytes: usize, secs: f64) {
        self.mixer.gossip_mut().observe_link(from, bytes, secs);
    }

    fn link_choices(&self) -> Vec<crate::LinkChoice> {
        self.mixer.gossip().link_choices()
    }

    /// Passed to the inner algorithm (gossip re-weights W; all-reduce cannot lose a peer).
    fn peer_left(
        &mut self,
        gone: Rank,
        w: &murmur_topology::MixingMatrix,
    ) -> Result<(), MembershipError> {
        let r = self.mixer.gossip_mut().peer_left(gone, w);
        self.pump();
        r
    }

    /// Passed to the inner algorithm at its outer step ⌊`at` / H⌋ (gossip takes `back` in
    /// there, as D-PSGD does; all-reduce cannot: [`MembershipError::Unsupported`]). The
    /// returning peer starts from its donors' x, anchor and outer velocity (see
    /// [`Gossip::start_at_round`]).
    fn peer_rejoined(
        &mut self,
        back: Rank,
        w: &murmur_topology::MixingMatrix,
        at: u64,
    ) -> Result<(), MembershipError> {
        let r = self.mixer.gossip_mut().peer_rejoined(back, w, at / self.h);
        self.pump();
        r
    }

    /// The anchor `[d]` (x where none is set yet), then the outer optimizer's velocity: a
    /// returning peer of the gossip form takes its neighbours' and so steps as they do at its
    /// first outer step (the all-reduce forms take no peer back: nobody asks for it there).
    fn catch_up_state(&self) -> Vec<f32> {
        let anchor = if self.anchored {
            &self.anchor
        } else {
            &self.outer.x
        };
        let mut s = anchor.clone();
        s.extend(self.outer_opt.state());
        s
    }

    /// Sets the anchor and the outer velocity from a donor's [`Gossip::catch_up_state`]; the
    /// outer optimizer checks the velocity's length before anything changes.
    fn take_catch_up_state(&mut self, state: &[f32]) -> Result<(), StateError> {
        let d = self.anchor.len();
        if state.len() < d {
            return Err(StateError(format!(
                "DiLoCo's catch-up state is its anchor ({d} values) and outer velocity, got {} \
                 values",
                state.len()
            )));
        }
        let (anchor, velocity) = state.split_at(d);
        self.outer_opt
            .restore(velocity.to_vec())
            .map_err(|e| StateError(format!("DiLoCo's outer velocity: {e}")))?;
        self.anchor.copy_from_slice(anchor);
        self.anchored = true;
        Ok(())
    }

    /// The next outer step's inner step: the first t ≥ `earliest` with (t + 1) a multiple
    /// of H.
    fn rejoin_round(&self, earliest: u64) -> u64 {
        (earliest + 1).div_ceil(self.h) * self.h - 1
    }

    /// The inner algorithm's frames carry its outer step ⌊round / H⌋.
    fn frame_round(&self, round: u64) -> u64 {
        round / self.h
    }

    /// Moves to inner step `round`; the inner algorithm to its outer step ⌊round / H⌋. An
    /// inner algorithm that cannot start mid-run (ring all-reduce) counts its outer steps
    /// from 0 again: every peer of a resumed run does the same, so their frames agree (a
    /// single peer of the all-reduce form cannot rejoin a running run:
    /// [`crate::Resumable::WholeRun`]). A single peer of the gossip form can
    /// ([`Gossip::peer_rejoined`]): built afresh, it takes its donors' anchor and outer
    /// velocity ([`Gossip::take_catch_up_state`]) and their x, fetched by the driver.
    ///
    /// # Panics
    /// If a round is mixing (a driver bug).
    fn start_at_round(&mut self, round: u64) -> Result<(), MembershipError> {
        self.outer.assert_idle();
        match self.mixer.gossip_mut().start_at_round(round / self.h) {
            Ok(()) | Err(MembershipError::Unsupported { .. }) => {}
            Err(e) => return Err(e),
        }
        self.outer.round = round;
        Ok(())
    }

    /// The anchor, the outer optimizer's velocity, then (compressed form) the residual
    /// `diloco.residual` and the scalar `diloco.aligned` (1: the anchors are aligned), then
    /// the inner algorithm's state.
    fn state(&self) -> AlgorithmState {
        let mut s = self.mixer.gossip().state();
        let anchor = if self.anchored {
            &self.anchor
        } else {
            &self.outer.x
        };
        s.vectors.insert(0, (ANCHOR.into(), anchor.clone()));
        s.vectors
            .insert(1, (VELOCITY.into(), self.outer_opt.state()));
        if let Mixer::PseudoGradients { ring, aligned, .. } = &self.mixer {
            let e = ring.residual().expect("a compressed ring").to_vec();
            s.vectors.insert(2, (RESIDUAL.into(), e));
            s.scalars
                .insert(0, (ALIGNED.into(), if *aligned { 1.0 } else { 0.0 }));
        }
        s
    }

    /// Restores what [`Gossip::state`] saved. The compressed form needs the residual and
    /// `diloco.aligned` (0 or 1); the uncompressed forms refuse them.
    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        if state.is_empty() {
            return Ok(());
        }
        let d = self.anchor.len();
        let (own, rest): (Vec<_>, Vec<_>) = state
            .vectors
            .iter()
            .cloned()
            .partition(|(n, _)| n.starts_with("diloco."));
        let (own_scalars, rest_scalars): (Vec<_>, Vec<_>) = state
            .scalars
            .iter()
            .cloned()
            .partition(|(n, _)| n.starts_with("diloco."));
        let compressed = self.compresses();
        let want: &[&str] = if compressed {
            &[ANCHOR, VELOCITY, RESIDUAL]
        } else {
            &[ANCHOR, VELOCITY]
        };
        murmur_compress::check_state(&own, want, d)?;
        let aligned = match (compressed, own_scalars.as_slice()) {
            (false, []) => false,
            (true, [(name, v)]) if name == ALIGNED && (*v == 0.0 || *v == 1.0) => *v == 1.0,
            (true, _) => {
                return Err(StateError(format!(
                    "compressed DiLoCo expects the scalar {ALIGNED:?} = 0 or 1, got {own_scalars:?}"
                )))
            }
            (false, _) => {
                return Err(StateError(format!(
                    "uncompressed DiLoCo keeps no scalars of its own, got {own_scalars:?}"
                )))
            }
        };
        // Check the velocity's length against the optimizer before the inner state moves.
        let mut opt = self.outer_cfg.optimizer(d);
        opt.restore(own[1].1.clone())
            .map_err(|e| StateError(e.to_string()))?;
        self.mixer.gossip_mut().restore_state(&AlgorithmState {
            scalars: rest_scalars,
            vectors: rest,
        })?;
        if let Mixer::PseudoGradients {
            ring, aligned: a, ..
        } = &mut self.mixer
        {
            ring.set_residual(&own[2].1);
            *a = aligned;
            // The ring's next round is the alignment unless the anchors are aligned.
            let next = ring.round();
            ring.set_compressed_from(if aligned { next } else { next + 1 });
        }
        self.outer_opt = opt;
        self.anchor.clone_from(&own[0].1);
        self.anchored = true;
        Ok(())
    }
}

/// DiLoCo with exact averaging (ring all-reduce) in the [`crate::registry`].
pub struct DiLoCoAlgorithm;

/// The registry's entry for DiLoCo (all-reduce).
pub const DILOCO: DiLoCoAlgorithm = DiLoCoAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Fixed("ring all-reduce"),
    local_steps: Some(DILOCO_LOCAL_STEPS),
    default_tau: 0,
    compresses: Compresses::PseudoGradients,
    default_compressor: CompressorSpec::Identity,
    options: &[
        ProtocolOption::LOCAL_STEPS,
        ProtocolOption::OUTER_OPTIMIZER,
        ProtocolOption::OUTER_LR,
        ProtocolOption::OUTER_MOMENTUM,
    ],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::WholeRun,
};

impl Algorithm for DiLoCoAlgorithm {
    fn name(&self) -> &'static str {
        "diloco"
    }
    fn about(&self) -> &'static str {
        "DiLoCo (Douillard et al. 2023): H inner steps (--local-steps, default 50), then an \
         outer Nesterov step (--outer-optimizer, --outer-lr, --outer-momentum) on the \
         pseudo-gradient averaged by ring all-reduce; with --compressor (e.g. int8, \
         8 bits a value) the pseudo-gradients go through a compressed ring with error \
         feedback (INTELLECT-1, Prime Intellect 2024)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// Refuses a compressor that a pseudo-gradient ring cannot use
    /// ([`check_pseudo_gradient_compressor`]).
    fn check(&self, run: &RunSetup<'_>) -> Result<(), BuildError> {
        run.options
            .compressor
            .as_ref()
            .map_or(Ok(()), check_pseudo_gradient_compressor)
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let (h, lr, outer) = (ctx.options.local_steps(self), ctx.lr, ctx.options.outer());
        let spec = ctx.options.compressor(self);
        if spec == CompressorSpec::Identity {
            // All-reduce begun without a gradient averages the parameters exactly.
            let inner = crate::AllReduce::from_context(ctx, 0.0);
            return Ok(Box::new(DiLoCo::new(Box::new(inner), h, lr, outer)?));
        }
        check_pseudo_gradient_compressor(&spec)?;
        let (seed, aligned) = (ctx.seed, ctx.shared_start);
        if let CompressorSpec::SparseLoco { decay, .. } = spec {
            // Each peer's message is of the whole vector: its chunks may follow the tensors.
            let compressor = spec.build(Some(ctx.tensor_lengths))?;
            let ring = crate::AllReduce::gathered_from_context(ctx, compressor, decay);
            return Ok(Box::new(DiLoCo::gathered(
                ring, h, lr, outer, seed, aligned,
            )?));
        }
        // Not layer-wise (refused above): the ring's chunks do not follow the tensors.
        let compressor = spec.build(None)?;
        let ring = crate::AllReduce::compressed_from_context(ctx, compressor);
        Ok(Box::new(DiLoCo::compressed(ring, h, lr, outer, seed)?))
    }
}
