//! `local-avg`: local SGD with model averaging (Stich 2019, "Local SGD converges fast and
//! communicates little"; Lin et al. 2020, "Don't use large mini-batches, use local SGD"):
//! H local steps ([`crate::LocalSgd`]), then exact global averaging of the parameters by
//! ring all-reduce ([`crate::AllReduce`] begun without a gradient).

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, Pattern, ProtocolOption, Resume,
};
use crate::BuildError;
use crate::Gossip;
use murmur_compress::CompressorSpec;

/// Local SGD / model averaging in the [`crate::registry`]: H local steps, then exact
/// averaging by ring all-reduce.
pub struct LocalAvgAlgorithm;

/// The registry's entry for local SGD with model averaging.
pub const LOCAL_AVG: LocalAvgAlgorithm = LocalAvgAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Fixed("ring all-reduce"),
    local_steps: Some(4),
    default_tau: 0,
    compresses: Compresses::Nothing,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::LOCAL_STEPS],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::No,
};

impl Algorithm for LocalAvgAlgorithm {
    fn name(&self) -> &'static str {
        "local-avg"
    }
    fn about(&self) -> &'static str {
        "Local SGD / model averaging (Stich 2019): H local steps, then exact global averaging \
         of the parameters by ring all-reduce"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        let (h, lr) = (ctx.options.local_steps(self), ctx.lr);
        // All-reduce begun without a gradient averages the parameters exactly.
        let inner = crate::AllReduce::from_context(ctx, 0.0);
        Ok(Box::new(crate::LocalSgd::new(Box::new(inner), h, lr)))
    }
}
