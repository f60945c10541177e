//! Gradient tracking (DSGT: Pu & Nedić 2020, "Distributed stochastic gradient tracking
//! methods", Math. Programming 187; its deterministic form DIGing: Nedić, Olshevsky & Shi
//! 2017; analysed on deep networks by Koloskova, Lin & Stich 2021, "An improved analysis of
//! gradient tracking for decentralized machine learning"). Each peer i keeps, besides x_i,
//! a tracker y_i of the network's mean gradient and mixes both with W:
//!
//! ```text
//! y_i^t     = z_i^t + g_i^t                       (z_i^0 = 0, so y_i^0 = g_i^0)
//! x_i^{t+1} = Σ_j W_ij (x_j^t − η y_j^t)
//! z_i^{t+1} = Σ_j W_ij y_j^t − g_i^t              (so y^{t+1} = W y^t + g^{t+1} − g^t)
//! ```
//!
//! with g_i^t the local update direction at x_i^t (the gradient, or the momentum buffer: the
//! heavy-ball form the deep-learning papers train with). W doubly stochastic keeps
//! Σ_i y_i^t = Σ_i g_i^t every round, so each peer steps along an estimate of the *global*
//! gradient rather than its own: on non-IID data D-PSGD's peers are pulled toward their own
//! optima and stall at a bias floor ∝ the heterogeneity ζ², gradient tracking does not
//! (with exact gradients it converges linearly to the exact optimum; `tests/tracking.rs`).
//!
//! One round sends one frame per out-neighbour carrying the stacked `[x_i − η y_i; y_i]`
//! (2d values: twice D-PSGD's bytes), mixed by an inner [`crate::DPsgd`] that only mixes.
//! The round needs its gradient before it sends, so communication is not overlapped with
//! it. A departed peer takes its share of Σ y with it: the run ends (`Departures::EndRun`);
//! the whole run resumes from checkpoints (z_i and, compressed, the CHOCO copies are saved).
//!
//! # Compressed messages
//!
//! With `--compressor` other than the identity, the stacked vector s_i = `[x_i − η y_i; y_i]`
//! is mixed by CHOCO-Gossip ([`crate::Choco`] begun without a gradient, consensus step γ,
//! `--gamma`) instead: only compressed differences Q(s_i − ŝ_i) travel, and every peer
//! keeps public copies ŝ of itself and its in-neighbours, so a biased operator (top-k) still
//! mixes exactly in the limit. This is compressed gradient tracking in the form of BEER
//! (Zhao, Li, Richtárik & Chi 2022, "BEER: Fast O(1/T) Rate for Decentralized Nonconvex
//! Optimization with Communication Compression", Algorithm 1) and of C-GT (Liao, Li & Yang
//! 2022): both x and the tracker move by γ Σ_j w_ij (ŝ_j − ŝ_i) on compressed surrogates
//! kept with error feedback. Two differences from BEER, both from reusing CHOCO's round:
//! the mix uses the surrogates after this round's messages (BEER: before them), and x and
//! y travel in one message of 2d coordinates (a `,layerwise` top-k keeps k per tensor of
//! each half: the context's tensor lengths are given twice). The tracker's invariant holds
//! as uncompressed: CHOCO's mix keeps Σ_i s_i (W symmetric), so Σ_i y_i = Σ_i g_i every
//! round. On non-IID quadratics it converges to the exact optimum where CHOCO-SGD with the
//! same operator stalls at its bias floor (`tests/tracking.rs`). Bytes: one compressed
//! message of 2d coordinates per out-neighbour a round.

use std::time::Instant;

use murmur_compress::CompressorSpec;

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern,
    ProtocolOption, Resume,
};
use crate::{
    AlgorithmState, BuildError, Choco, ChocoConfig, DPsgd, Gossip, GossipEvent, StateError,
};

/// The name of z_i in [`AlgorithmState`].
const TRACKER_RESIDUAL: &str = "tracker_residual";

/// One peer of gradient tracking (see the [module docs](self)).
pub struct GradientTracking {
    /// Mixes the stacked `[x_i − η y_i; y_i]: [2d]` on W: a [`DPsgd`] that only mixes, or
    /// CHOCO-Gossip with compressed messages.
    inner: Box<dyn Gossip>,
    /// η.
    lr: f32,
    /// x_i: `[d]`, after the last mixed round.
    x: Vec<f32>,
    /// z_i = (W y)_i − g_i of the last round: `[d]` (zeros before the first).
    z: Vec<f32>,
    /// g_i of the round that is mixing: `[d]`.
    g: Vec<f32>,
    /// Whether a round is mixing.
    mixing: bool,
    /// Scratch for the stacked vector: `[2d]`.
    stacked: Vec<f32>,
}

impl GradientTracking {
    /// Peer `ctx.rank` from x⁰ = `ctx.x0` with step η = `ctx.lr`, mixing on the run's W
    /// exactly (uncompressed).
    pub fn from_context(ctx: &BuildContext<'_>) -> Self {
        let d = ctx.x0.len();
        let mut v0 = ctx.x0.clone();
        v0.resize(2 * d, 0.0);
        let inner = Box::new(DPsgd::mixer(ctx, &ctx.topology.w, v0));
        Self::with_mixer(ctx, inner)
    }

    /// Peer `ctx.rank` whose stacked vector is mixed by CHOCO-Gossip with consensus step γ =
    /// `gamma` and the run's compressor (see the [module docs](self#compressed-messages)).
    ///
    /// # Errors
    /// [`BuildError`] if the compressor cannot be built for the model's tensors (twice).
    pub fn compressed(ctx: &BuildContext<'_>, gamma: f32) -> Result<Self, BuildError> {
        let d = ctx.x0.len();
        let mut v0 = ctx.x0.clone();
        v0.resize(2 * d, 0.0);
        let lengths: Vec<usize> = ctx.tensor_lengths.repeat(2);
        let compressor = ctx
            .options
            .compressor(&GRADIENT_TRACKING)
            .build(Some(&lengths))?;
        let mut cfg = ChocoConfig::from_matrix(&ctx.topology.w, ctx.rank, 0.0, gamma, 2 * d);
        cfg.round_timeout = ctx.round_timeout;
        // from_matrix's limit is for the 2d values; the run's may be larger.
        cfg.max_payload_bytes = cfg.max_payload_bytes.max(ctx.max_payload_bytes);
        cfg.seed = ctx.seed;
        let inner = Box::new(Choco::new(cfg, v0, compressor));
        Ok(Self::with_mixer(ctx, inner))
    }

    fn with_mixer(ctx: &BuildContext<'_>, inner: Box<dyn Gossip>) -> Self {
        let d = ctx.x0.len();
        GradientTracking {
            inner,
            lr: ctx.lr,
            x: ctx.x0.clone(),
            z: vec![0.0; d],
            g: vec![0.0; d],
            mixing: false,
            stacked: vec![0.0; 2 * d],
        }
    }
}

impl Gossip for GradientTracking {
    /// Sends `[x − η y; y]` with y = z + `grad` (`grad: [d]`; `None` is a zero direction).
    ///
    /// # Panics
    /// If `x` or `grad` is not `[d]`, or a round is mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        let d = self.x.len();
        assert!(!self.mixing, "begin_round while a round is mixing");
        assert_eq!(x.len(), d, "x must have length d");
        match grad {
            Some(g) => {
                assert_eq!(g.len(), d, "grad must have length d");
                self.g.copy_from_slice(g);
            }
            None => self.g.fill(0.0),
        }
        let (top, bottom) = self.stacked.split_at_mut(d);
        for i in 0..d {
            let y = self.z[i] + self.g[i];
            top[i] = x[i] - self.lr * y;
            bottom[i] = y;
        }
        self.mixing = true;
        self.inner.begin_round(now, &self.stacked, None);
    }

    /// The inner mixer's events; its `Mixed` first splits the mix into x_i and z_i.
    fn poll_event(&mut self) -> Option<GossipEvent> {
        let ev = self.inner.poll_event()?;
        if matches!(ev, GossipEvent::Mixed { .. }) && self.mixing {
            let d = self.x.len();
            let mixed = self.inner.params();
            self.x.copy_from_slice(&mixed[..d]);
            for ((z, m), g) in self.z.iter_mut().zip(&mixed[d..]).zip(&self.g) {
                *z = m - g;
            }
            self.mixing = false;
        }
        Some(ev)
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    /// z_i, as `tracker_residual`, then the mixer's state (CHOCO's copies of `[2d]`, and
    /// its compressor's; nothing for the exact mixer).
    fn state(&self) -> AlgorithmState {
        let mut s = self.inner.state();
        s.vectors
            .insert(0, (TRACKER_RESIDUAL.into(), self.z.clone()));
        s
    }

    /// Restores z_i (`[d]`), then the mixer's state; a missing, misshapen or unknown vector
    /// is refused with a [`StateError`] and changes nothing.
    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        let d = self.x.len();
        let (own, rest): (Vec<_>, Vec<_>) = state
            .vectors
            .iter()
            .cloned()
            .partition(|(n, _)| n == TRACKER_RESIDUAL);
        murmur_compress::check_state(&own, &[TRACKER_RESIDUAL], d)?;
        self.inner.restore_state(&AlgorithmState {
            scalars: state.scalars.clone(),
            vectors: rest,
        })?;
        self.z.clone_from(&own[0].1);
        Ok(())
    }

    crate::forward_gossip!(inner: handle_message, handle_timeout, start_at_round, poll_transmit, poll_timeout, round, stats, out_peers, in_peers);
}

/// Gradient tracking in the [`crate::registry`].
pub struct GradientTrackingAlgorithm;

/// The registry's entry for gradient tracking.
pub const GRADIENT_TRACKING: GradientTrackingAlgorithm = GradientTrackingAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Static),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Increments,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::GAMMA],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::WholeRun,
};

impl Algorithm for GradientTrackingAlgorithm {
    fn name(&self) -> &'static str {
        "gradient-tracking"
    }
    fn about(&self) -> &'static str {
        "Gradient tracking (DSGT, Pu & Nedić 2020): mixes x and a tracker of the mean \
         gradient on W, for non-IID data; 2× D-PSGD's bytes; with --compressor, both \
         travel as CHOCO-compressed differences (BEER, Zhao et al. 2022; --gamma)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        if ctx.options.compressor(self) == CompressorSpec::Identity {
            return Ok(Box::new(GradientTracking::from_context(&ctx)));
        }
        let gamma = ctx.options.gamma(self);
        Ok(Box::new(GradientTracking::compressed(&ctx, gamma)?))
    }
}
