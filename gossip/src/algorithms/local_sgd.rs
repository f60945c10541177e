//! Local SGD: H local steps between communication rounds, around any communicating
//! algorithm.
//!
//! * **Local-SGD gossip** (the decentralized local SGD analysed by Koloskova et al. 2020,
//!   "A unified theory of decentralized SGD with changing topology and local updates";
//!   Wang & Joshi 2021, "Cooperative SGD"): the inner algorithm is gossip, e.g.
//!   [`crate::DPsgd`] on W. H = 1 is D-PSGD in its "adapt then combine" form.
//! * **Local SGD / model averaging** (Stich 2019, "Local SGD converges fast and communicates
//!   little"; Lin et al. 2020, "Don't use large mini-batches, use local SGD"): the inner
//!   algorithm is exact global averaging, e.g. [`crate::AllReduce`] with no gradient.
//!
//! Every call of [`Gossip::begin_round`] is one SGD step of peer i:
//!
//! ```text
//! y_i = x_i − η g_i
//! x_i ← y_i                         if (t + 1) mod H ≠ 0   (local step: no frame, done at once)
//! x_i ← inner.mix(y_i)              if (t + 1) mod H = 0   (communication round)
//! ```
//!
//! where t counts this wrapper's rounds from 0 and `inner.mix` is one round of the inner
//! algorithm begun with `grad = None` (for D-PSGD: Σ_j W_ij y_j; for all-reduce: the mean
//! of y). The inner algorithm counts only communication rounds, so its frames carry round
//! ⌊t / H⌋; [`Gossip::round`] and [`GossipEvent`]s use t. Bytes per SGD step fall by a
//! factor H.

use crate::algorithm::{
    Algorithm, Capabilities, Compresses, Departures, GraphNeeds, Pattern, ProtocolOption, Resume,
};
use murmur_compress::CompressorSpec;
use std::time::Instant;

use crate::mixing::outer_round::OuterRound;
use crate::{Gossip, GossipError, GossipEvent, Rank};

/// Local SGD with `h` local steps per communication round around `inner`
/// (see the [module docs](self)).
pub struct LocalSgd {
    inner: Box<dyn Gossip>,
    /// Local steps per communication round H ≥ 1.
    h: u64,
    /// Learning rate η of the local steps.
    lr: f32,
    /// x_i, the round t (one per SGD step) and the events; `waiting` while a
    /// communication round is mixing in `inner`.
    outer: OuterRound,
}

impl LocalSgd {
    /// Wraps `inner` (whose parameters are the starting point x⁰: `[d]`) with `h` local steps
    /// of learning rate `lr` per communication round.
    ///
    /// # Panics
    /// If `h` is 0.
    pub fn new(inner: Box<dyn Gossip>, h: u64, lr: f32) -> Self {
        assert!(h >= 1, "local SGD needs H ≥ 1 local steps per round");
        LocalSgd {
            outer: OuterRound::new(inner.params().to_vec()),
            inner,
            h,
            lr,
        }
    }

    /// Local steps per communication round H.
    pub fn local_steps(&self) -> u64 {
        self.h
    }

    /// Whether round t communicates: (t + 1) mod H = 0.
    pub fn communicates(&self, t: u64) -> bool {
        (t + 1).is_multiple_of(self.h)
    }
}

impl Gossip for LocalSgd {
    /// One SGD step from `x: [d]` with `grad: [d]` (none: a step of zero gradient).
    ///
    /// # Panics
    /// If `x` or `grad` is not `[d]`, or the previous round is still mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.outer.assert_idle();
        // y = x − η g
        crate::mixing::local_step(&mut self.outer.x, x, grad, self.lr);
        if self.communicates(self.outer.round) {
            self.outer.waiting = true;
            self.inner.begin_round(now, &self.outer.x, None);
            self.outer.pump(self.inner.as_mut());
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
        let r = self.inner.handle_message(now, from, frame);
        self.outer.pump(self.inner.as_mut());
        r
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.inner.handle_timeout(now);
        self.outer.pump(self.inner.as_mut());
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.outer.pump(self.inner.as_mut());
        self.outer.poll_event()
    }

    fn params(&self) -> &[f32] {
        &self.outer.x
    }

    fn round(&self) -> u64 {
        self.outer.round
    }

    fn peer_left(
        &mut self,
        gone: Rank,
        w: &murmur_topology::MixingMatrix,
    ) -> Result<(), crate::MembershipError> {
        let r = self.inner.peer_left(gone, w);
        self.outer.pump(self.inner.as_mut());
        r
    }

    fn link_choices(&self) -> Vec<crate::LinkChoice> {
        self.inner.link_choices()
    }

    crate::forward_gossip!(inner: poll_transmit, poll_timeout, stats, set_epoch, reweights, out_peers, in_peers, observe_link);
}

/// Local-SGD gossip in the [`crate::registry`]: H local steps, then one D-PSGD mixing round.
pub struct LocalSgdAlgorithm;

/// The registry's entry for local-SGD gossip.
pub const LOCAL_SGD: LocalSgdAlgorithm = LocalSgdAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Static),
    local_steps: Some(4),
    default_tau: 0,
    compresses: Compresses::Parameters,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::LOCAL_STEPS, ProtocolOption::ROBUST],
    skips_stragglers: true,
    departures: Departures::TrainOn,
    resume: Resume::No,
};

impl Algorithm for LocalSgdAlgorithm {
    fn name(&self) -> &'static str {
        "local-sgd"
    }
    fn about(&self) -> &'static str {
        "Local-SGD gossip (Koloskova et al. 2020): H local SGD steps (--local-steps), then \
         one D-PSGD mixing round on W (H = 1 is D-PSGD)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// D-PSGD's rounds mix the models: [`crate::DPsgd::check_setup`].
    fn check(&self, run: &crate::algorithm::RunSetup<'_>) -> Result<(), crate::BuildError> {
        crate::DPsgd::check_setup(run)
    }
    fn build(&self, ctx: crate::BuildContext<'_>) -> Result<Box<dyn Gossip>, crate::BuildError> {
        let (h, lr, compressor) = (ctx.options.local_steps(self), ctx.lr, ctx.compressor(self)?);
        // The inner gossip only mixes (η = 0); the wrapper takes the local steps.
        let inner = crate::DPsgd::from_context(ctx, 0.0, compressor)?;
        Ok(Box::new(LocalSgd::new(Box::new(inner), h, lr)))
    }
}
