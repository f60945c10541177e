//! `diloco-auto`: decentralized DiLoCo with a communication period per link: DiLoCo's
//! inner and outer steps ([`crate::DiLoCo`], Douillard et al. 2023) around the per-link
//! exchanges of `local-auto` ([`crate::algorithms::local_auto::AsyncLinks`]), so that each
//! outer step mixes the models that have arrived and a slow link's models reach later outer
//! steps instead of delaying them. The algorithm and its deadline rule are in
//! [`crate::algorithms::local_auto`]'s docs.

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern,
    ProtocolOption, Resume,
};
use crate::algorithms::local_auto::AsyncLinks;
use crate::mixing::pseudo_gradient::DILOCO_LOCAL_STEPS;
use crate::BuildError;
use crate::Gossip;
use murmur_compress::CompressorSpec;

/// Decentralized DiLoCo with per-link periods in the [`crate::registry`]: DiLoCo's inner
/// and outer steps ([`crate::DiLoCo`]) around [`AsyncLinks`], so that each outer step mixes
/// the models that have arrived and a slow link's models arrive outer steps later.
pub struct DiLoCoAutoAlgorithm;

/// The registry's entry.
pub const DILOCO_AUTO: DiLoCoAutoAlgorithm = DiLoCoAutoAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Symmetric),
    local_steps: Some(DILOCO_LOCAL_STEPS),
    default_tau: 0,
    compresses: Compresses::Nothing,
    default_compressor: CompressorSpec::Identity,
    options: &[
        ProtocolOption::LOCAL_STEPS,
        ProtocolOption::OUTER_OPTIMIZER,
        ProtocolOption::OUTER_LR,
        ProtocolOption::OUTER_MOMENTUM,
    ],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::No,
};

impl Algorithm for DiLoCoAutoAlgorithm {
    fn name(&self) -> &'static str {
        "diloco-auto"
    }
    fn about(&self) -> &'static str {
        "Decentralized DiLoCo with a period per link: H inner steps, then the models that have \
         arrived from each neighbour are mixed (a slow link's later, no outer step waits for \
         it), then the outer step on each peer's own anchor"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let (h, lr, outer) = (ctx.options.local_steps(self), ctx.lr, ctx.options.outer());
        let (w, rank, limit) = (&ctx.topology.w, ctx.rank, ctx.max_payload_bytes);
        let inner = AsyncLinks::new(w, rank, ctx.x0, limit, ctx.round_timeout)
            .map_err(|e| BuildError::Options(format!("diloco-auto: {e}")))?;
        Ok(Box::new(crate::DiLoCo::new(Box::new(inner), h, lr, outer)?))
    }
}
