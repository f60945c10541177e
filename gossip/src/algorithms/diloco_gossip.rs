//! `diloco-gossip`: decentralized DiLoCo (NoLoCo, Kolehmainen et al. 2025, "NoLoCo:
//! No-all-reduce Low Communication Training Method for Large Models"): H inner steps, one
//! D-PSGD mixing round of the models on W, then the outer step on each peer's own anchor.
//! The state machine is [`crate::DiLoCo`] around [`crate::DPsgd`]; why the models are mixed
//! rather than the pseudo-gradients is in [`crate::algorithms::diloco`]'s docs.

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern,
    ProtocolOption, Resume,
};
use crate::mixing::pseudo_gradient::DILOCO_LOCAL_STEPS;
use crate::BuildError;
use crate::DiLoCo;
use crate::Gossip;
use murmur_compress::CompressorSpec;

/// Decentralized DiLoCo (gossip on W) in the [`crate::registry`].
pub struct DiLoCoGossipAlgorithm;

/// The registry's entry for decentralized DiLoCo.
pub const DILOCO_GOSSIP: DiLoCoGossipAlgorithm = DiLoCoGossipAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Static),
    local_steps: Some(DILOCO_LOCAL_STEPS),
    default_tau: 0,
    compresses: Compresses::Parameters,
    default_compressor: CompressorSpec::Identity,
    options: &[
        ProtocolOption::LOCAL_STEPS,
        ProtocolOption::OUTER_OPTIMIZER,
        ProtocolOption::OUTER_LR,
        ProtocolOption::OUTER_MOMENTUM,
        ProtocolOption::ROBUST,
    ],
    skips_stragglers: true,
    departures: Departures::TrainOn,
    resume: Resume::Rejoin,
};

impl Algorithm for DiLoCoGossipAlgorithm {
    fn name(&self) -> &'static str {
        "diloco-gossip"
    }
    fn about(&self) -> &'static str {
        "Decentralized DiLoCo (NoLoCo, Kolehmainen et al. 2025): H inner steps, one D-PSGD \
         mixing round of the models on W, then the outer step on each peer's own anchor"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// D-PSGD's rounds mix the models: [`crate::DPsgd::check_setup`].
    fn check(&self, run: &crate::algorithm::RunSetup<'_>) -> Result<(), crate::BuildError> {
        crate::DPsgd::check_setup(run)
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let (h, lr, outer) = (ctx.options.local_steps(self), ctx.lr, ctx.options.outer());
        let compressor = ctx.compressor(self)?;
        // The inner gossip only mixes (η = 0); the wrapper takes the inner and outer steps.
        let inner = crate::DPsgd::from_context(ctx, 0.0, compressor)?;
        Ok(Box::new(DiLoCo::new(Box::new(inner), h, lr, outer)?))
    }
}
