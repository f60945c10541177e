//! The algorithm registry: every algorithm the peers can run, by name.
//!
//! Each algorithm describes itself in its own module with an [`Algorithm`] implementation —
//! its name, what it needs (a mixing matrix W, local steps, a compressor), which of the
//! shared [`AlgorithmOptions`] it takes, whether a run survives the loss of a peer, and how
//! to build one peer's state machine. [`ALGORITHMS`] lists them; an [`AlgorithmSpec`] is a
//! name parsed against that list, as `murmur_compress::CompressorSpec` and
//! `murmur_topology::TopologySpec` are for compressors and topologies.
//!
//! Adding an algorithm: its module with the state machine and one `impl Algorithm`, plus
//! one line in [`ALGORITHMS`] (and, for a new protocol option, a field of
//! [`AlgorithmOptions`] and a [`ProtocolOption`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use murmur_compress::{Compressor, CompressorSpec};
use murmur_topology::{PushSchedule, Topology};
use thiserror::Error;

use crate::diloco::{OuterConfig, OuterOptimizer};
use crate::{Gossip, PsMode, Rank};

/// Every algorithm, in the order `--help` lists them. The first is the default.
pub const ALGORITHMS: &[&dyn Algorithm] = &[
    &crate::dpsgd::DPSGD,
    &crate::choco::CHOCO,
    &crate::choco_auto::CHOCO_AUTO,
    &crate::sgp::SGP,
    &crate::local::LOCAL_SGD,
    &crate::local_auto::LOCAL_AUTO,
    &crate::local::LOCAL_AVG,
    &crate::diloco::DILOCO,
    &crate::diloco::DILOCO_GOSSIP,
    &crate::local_auto::DILOCO_AUTO,
    &crate::streaming::STREAMING_DILOCO,
    &crate::allreduce::ALLREDUCE,
    &crate::ps::PS,
];

/// One algorithm as the registry knows it. Implemented once per algorithm, in its module.
pub trait Algorithm: Sync {
    /// The name on the command line and in results, e.g. `dpsgd`.
    fn name(&self) -> &'static str;

    /// One line for `--help`: what it does and its source (paper, year).
    fn about(&self) -> &'static str;

    /// Whether it mixes on the topology's graph. The centralized baselines (all-reduce,
    /// parameter server) have a fixed pattern and ignore `--topology`.
    fn uses_topology(&self) -> bool {
        true
    }

    /// Whether it takes a time-varying push schedule (SGP); the others need a static W.
    fn takes_push_schedule(&self) -> bool {
        false
    }

    /// Whether it takes H local steps per communication round (`local_steps`).
    fn has_local_steps(&self) -> bool {
        false
    }

    /// H when `local_steps` is not given: 4 for an algorithm with local steps, 1 for the
    /// others (DiLoCo takes more).
    fn default_local_steps(&self) -> u64 {
        if self.has_local_steps() {
            4
        } else {
            1
        }
    }

    /// τ when `--tau` is not given: 0 (SGP: synchronous; Streaming DiLoCo takes 1).
    fn default_tau(&self) -> u64 {
        0
    }

    /// Whether its messages go through the compressor (the baselines send raw `f32`).
    fn compresses(&self) -> bool {
        self.uses_topology()
    }

    /// The compressor when none is given.
    fn default_compressor(&self) -> CompressorSpec {
        CompressorSpec::Identity
    }

    /// Refuses a compressor that this algorithm cannot use, naming why (checked by
    /// [`AlgorithmOptions::validate`] and by `build`). The default accepts every one.
    ///
    /// # Errors
    /// [`BuildError::Options`].
    fn check_compressor(&self, spec: &CompressorSpec) -> Result<(), BuildError> {
        let _ = spec;
        Ok(())
    }

    /// Whether its gossip messages are increments of a public copy that receivers sum
    /// (CHOCO-SGD's q), rather than the model itself: what [`crate::Byzantine`] needs to
    /// know to attack it.
    fn sends_increments(&self) -> bool {
        false
    }

    /// Whether it needs a symmetric W (an undirected graph), checked before any peer starts.
    fn needs_symmetric_w(&self) -> bool {
        false
    }

    /// Whether it chooses each link's compressor itself (from measured bandwidth), so that
    /// no one compressor describes a run ([`crate::ChocoAuto`]).
    fn chooses_compressor_per_link(&self) -> bool {
        false
    }

    /// Whether its compressor compresses DiLoCo pseudo-gradients applied by an outer
    /// optimizer (`diloco`, `streaming-diloco`), where a biased operator needs a small
    /// outer learning rate.
    fn compresses_pseudo_gradients(&self) -> bool {
        false
    }

    /// Whether it mixes the neighbours' compressed *parameters* (not differences), so that a
    /// compressor other than a cast biases the models (D-PSGD and its local-step variant).
    fn mixes_compressed_parameters(&self) -> bool {
        false
    }

    /// The protocol options it takes, in [`ProtocolOption`] order.
    fn options(&self) -> &'static [ProtocolOption] {
        &[]
    }

    /// Whether it supports the skip straggler policy (mixing a round without a late
    /// neighbour's frame).
    fn skips_stragglers(&self) -> bool {
        false
    }

    /// Whether the other peers train on when a peer leaves (re-weighting W or pushing around
    /// the gap); otherwise a lost peer ends the run.
    fn survives_departure(&self) -> bool {
        false
    }

    /// What `--resume` can do: one restarted peer rejoins the running run, only the whole run
    /// resumes from its checkpoints, or neither. `skip_policy`: whether the run uses the skip
    /// straggler policy.
    fn resumable(&self, skip_policy: bool) -> Resumable {
        let _ = skip_policy;
        Resumable::No
    }

    /// The communication pattern when it ignores the topology (e.g. `ring all-reduce`).
    fn fixed_pattern(&self) -> Option<&'static str> {
        None
    }

    /// Peer `ctx.rank`'s state machine.
    ///
    /// # Errors
    /// [`BuildError`] if the options or the topology do not suit the algorithm, or the
    /// compressor cannot be built for the model.
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError>;
}

/// What `--resume` can do for an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumable {
    /// One restarted peer rejoins a running run, or the whole run resumes.
    Rejoin,
    /// Only the whole run resumes from its checkpoints.
    WholeRun,
    /// Neither.
    No,
}

/// A protocol option: an algorithm's parameter that every peer of a run must share (it
/// changes the protocol or the update), with its command-line flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProtocolOption {
    /// CHOCO-SGD's consensus step size γ (`--gamma`).
    Gamma,
    /// Local steps per communication round H (`--local-steps`).
    LocalSteps,
    /// The overlap τ in rounds (`--tau`): SGP's bound on the age of in-peers' messages,
    /// Streaming DiLoCo's delay between a fragment's sync and its application.
    Tau,
    /// The parameter server's synchronisation (`--ps-mode`).
    PsMode,
    /// DiLoCo's outer optimizer, `nesterov` or `sgd` (`--outer-optimizer`).
    OuterOptimizer,
    /// DiLoCo's outer learning rate η_out (`--outer-lr`).
    OuterLr,
    /// DiLoCo's outer momentum μ (`--outer-momentum`).
    OuterMomentum,
    /// Streaming DiLoCo's fragments P (`--fragments`).
    Fragments,
    /// Streaming DiLoCo's merge factor α (`--merge-alpha`).
    MergeAlpha,
    /// Byzantine-robust mixing (`--robust`).
    Robust,
}

impl ProtocolOption {
    /// Every option, in the order the fingerprint prints them.
    pub const ALL: [ProtocolOption; 10] = [
        Self::Gamma,
        Self::LocalSteps,
        Self::Tau,
        Self::PsMode,
        Self::OuterOptimizer,
        Self::OuterLr,
        Self::OuterMomentum,
        Self::Fragments,
        Self::MergeAlpha,
        Self::Robust,
    ];

    /// The command-line flag, e.g. `--gamma`.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Gamma => "--gamma",
            Self::LocalSteps => "--local-steps",
            Self::Tau => "--tau",
            Self::PsMode => "--ps-mode",
            Self::OuterOptimizer => "--outer-optimizer",
            Self::OuterLr => "--outer-lr",
            Self::OuterMomentum => "--outer-momentum",
            Self::Fragments => "--fragments",
            Self::MergeAlpha => "--merge-alpha",
            Self::Robust => "--robust",
        }
    }

    /// The key in a run's protocol fingerprint (`gamma=0.1`).
    pub fn key(self) -> &'static str {
        match self {
            Self::Gamma => "gamma",
            Self::LocalSteps => "local_steps",
            Self::Tau => "tau",
            Self::PsMode => "ps_mode",
            Self::OuterOptimizer => "outer_optimizer",
            Self::OuterLr => "outer_lr",
            Self::OuterMomentum => "outer_momentum",
            Self::Fragments => "fragments",
            Self::MergeAlpha => "merge_alpha",
            Self::Robust => "robust",
        }
    }

    /// What the option is, for error messages.
    pub fn what(self) -> &'static str {
        match self {
            Self::Gamma => "CHOCO-SGD's consensus step size",
            Self::LocalSteps => "the local steps per communication round",
            Self::Tau => "the overlap in rounds (SGP's bound, Streaming DiLoCo's delay)",
            Self::PsMode => "the parameter server's synchronisation",
            Self::OuterOptimizer => "DiLoCo's outer optimizer",
            Self::OuterLr => "DiLoCo's outer learning rate",
            Self::OuterMomentum => "DiLoCo's outer momentum",
            Self::Fragments => "Streaming DiLoCo's fragments",
            Self::MergeAlpha => "Streaming DiLoCo's merge factor",
            Self::Robust => "Byzantine-robust mixing (ClippedGossip)",
        }
    }
}

/// The protocol options as given (`None`: the algorithm's default).
#[derive(Debug, Clone, PartialEq)]
pub struct AlgorithmOptions {
    /// The compressor of the messages; `None`: [`Algorithm::default_compressor`].
    pub compressor: Option<CompressorSpec>,
    /// CHOCO-SGD's consensus step size γ ∈ (0, 1]; `None`: [`AlgorithmOptions::gamma`].
    pub gamma: Option<f32>,
    /// Local steps per communication round H ≥ 1; `None`: the algorithm's
    /// [`Algorithm::default_local_steps`] (4; DiLoCo 50).
    pub local_steps: Option<u64>,
    /// The overlap τ in rounds (SGP's bound, Streaming DiLoCo's delay); `None`: the
    /// algorithm's [`Algorithm::default_tau`] (SGP 0: synchronous; Streaming DiLoCo 1).
    pub tau: Option<u64>,
    /// The parameter server's synchronisation.
    pub ps_mode: PsMode,
    /// DiLoCo's outer optimizer; `None`: Nesterov (the paper's).
    pub outer_optimizer: Option<OuterOptimizer>,
    /// DiLoCo's outer learning rate η_out > 0; `None`: the optimizer's default (Nesterov
    /// 0.7, SGD 1).
    pub outer_lr: Option<f32>,
    /// DiLoCo's outer momentum μ ∈ [0, 1); `None`: the optimizer's default (Nesterov 0.9,
    /// SGD 0).
    pub outer_momentum: Option<f32>,
    /// Streaming DiLoCo's fragments P, 1 ≤ P ≤ H; `None`: 4.
    pub fragments: Option<u64>,
    /// Streaming DiLoCo's merge factor α ∈ [0, 1] (the share of the local fragment kept
    /// when a synchronised one is applied); `None`: 0.5.
    pub merge_alpha: Option<f32>,
    /// Byzantine-robust mixing (ClippedGossip); `None`: plain gossip.
    pub robust: Option<crate::robust::ClipRule>,
}

impl Default for AlgorithmOptions {
    fn default() -> Self {
        Self {
            compressor: None,
            gamma: None,
            local_steps: None,
            tau: None,
            ps_mode: PsMode::Bsp,
            outer_optimizer: None,
            outer_lr: None,
            outer_momentum: None,
            fragments: None,
            merge_alpha: None,
            robust: None,
        }
    }
}

impl AlgorithmOptions {
    /// Whether the option was given (for the PS mode: differs from `bsp`).
    pub fn is_set(&self, o: ProtocolOption) -> bool {
        match o {
            ProtocolOption::Gamma => self.gamma.is_some(),
            ProtocolOption::LocalSteps => self.local_steps.is_some(),
            ProtocolOption::Tau => self.tau.is_some(),
            ProtocolOption::PsMode => self.ps_mode != PsMode::Bsp,
            ProtocolOption::OuterOptimizer => self.outer_optimizer.is_some(),
            ProtocolOption::OuterLr => self.outer_lr.is_some(),
            ProtocolOption::OuterMomentum => self.outer_momentum.is_some(),
            ProtocolOption::Fragments => self.fragments.is_some(),
            ProtocolOption::MergeAlpha => self.merge_alpha.is_some(),
            ProtocolOption::Robust => self.robust.is_some(),
        }
    }

    /// The compressor for `algorithm`: the one given, else its default.
    pub fn compressor(&self, algorithm: &dyn Algorithm) -> CompressorSpec {
        self.compressor
            .clone()
            .unwrap_or_else(|| algorithm.default_compressor())
    }

    /// γ: the one given, else 0.5 for the identity and the casts and 0.1 for the other
    /// compressors of `algorithm` (measured on the embedded MNIST).
    pub fn gamma(&self, algorithm: &dyn Algorithm) -> f32 {
        self.gamma.unwrap_or(match self.compressor(algorithm) {
            CompressorSpec::Identity | CompressorSpec::Fp16 | CompressorSpec::Bf16 => 0.5,
            _ => 0.1,
        })
    }

    /// H: the one given, else the algorithm's [`Algorithm::default_local_steps`] (4 for an
    /// algorithm with local steps, 50 for DiLoCo, 1 for the others).
    pub fn local_steps(&self, algorithm: &dyn Algorithm) -> u64 {
        self.local_steps
            .unwrap_or_else(|| algorithm.default_local_steps())
    }

    /// τ: the one given, else the algorithm's [`Algorithm::default_tau`].
    pub fn tau(&self, algorithm: &dyn Algorithm) -> u64 {
        self.tau.unwrap_or_else(|| algorithm.default_tau())
    }

    /// DiLoCo's outer step: the optimizer given (else Nesterov), with the η_out and μ given
    /// (else the optimizer's defaults). Not checked here: see [`OuterConfig::check`].
    pub fn outer(&self) -> OuterConfig {
        let optimizer = self.outer_optimizer.unwrap_or_default();
        OuterConfig {
            optimizer,
            lr: self.outer_lr.unwrap_or(optimizer.default_lr()),
            momentum: self.outer_momentum.unwrap_or(optimizer.default_momentum()),
        }
    }

    /// The value of `o` for `algorithm` as the fingerprint prints it.
    pub fn value(&self, o: ProtocolOption, algorithm: &dyn Algorithm) -> String {
        match o {
            ProtocolOption::Gamma => self.gamma(algorithm).to_string(),
            ProtocolOption::LocalSteps => self.local_steps(algorithm).to_string(),
            ProtocolOption::Tau => self.tau(algorithm).to_string(),
            ProtocolOption::PsMode => ps_mode_name(self.ps_mode),
            ProtocolOption::OuterOptimizer => self.outer().optimizer.to_string(),
            ProtocolOption::OuterLr => self.outer().lr.to_string(),
            ProtocolOption::OuterMomentum => self.outer().momentum.to_string(),
            ProtocolOption::Fragments => self
                .fragments
                .unwrap_or(crate::streaming::DEFAULT_FRAGMENTS)
                .to_string(),
            ProtocolOption::MergeAlpha => self
                .merge_alpha
                .unwrap_or(crate::streaming::DEFAULT_MERGE_ALPHA)
                .to_string(),
            ProtocolOption::Robust => self
                .robust
                .map_or_else(|| "none".to_string(), |r| r.to_string()),
        }
    }

    /// Checks the values and refuses an option that none of `algorithms` takes.
    ///
    /// # Errors
    /// [`BuildError::Options`] naming the flag and what is wrong.
    pub fn validate(&self, algorithms: &[AlgorithmSpec]) -> Result<(), BuildError> {
        for o in ProtocolOption::ALL {
            if self.is_set(o) && !algorithms.iter().any(|a| a.options().contains(&o)) {
                return Err(BuildError::Options(format!(
                    "{} is {}; it needs --algorithm {}",
                    o.flag(),
                    o.what(),
                    AlgorithmSpec::names_where(|a| a.options().contains(&o)).replace(", ", " or ")
                )));
            }
        }
        if let Some(g) = self.gamma {
            if !(g > 0.0 && g <= 1.0) {
                return Err(BuildError::Options(format!(
                    "--gamma must be in (0, 1], got {g}"
                )));
            }
        }
        if self.local_steps == Some(0) {
            return Err(BuildError::Options(
                "--local-steps must be at least 1".into(),
            ));
        }
        if let Some(lr) = self.outer_lr {
            crate::diloco::check_outer_lr(lr)?;
        }
        if let Some(mu) = self.outer_momentum {
            crate::diloco::check_outer_momentum(mu)?;
        }
        if self.fragments == Some(0) {
            return Err(BuildError::Options("--fragments must be at least 1".into()));
        }
        if let Some(alpha) = self.merge_alpha {
            crate::streaming::check_merge_alpha(alpha)?;
        }
        if let Some(c) = &self.compressor {
            if !algorithms.iter().any(|a| a.compresses()) && *c != CompressorSpec::Identity {
                let run: Vec<String> = algorithms.iter().map(|a| a.to_string()).collect();
                return Err(BuildError::Options(format!(
                    "--compressor {c}: {} sends raw f32 (an uncompressed baseline); \
                     compression applies to {}",
                    run.join(", "),
                    AlgorithmSpec::names_where(|a| a.compresses())
                )));
            }
            for a in algorithms.iter().filter(|a| a.compresses()) {
                a.check_compressor(c)?;
            }
        }
        Ok(())
    }

    /// The options that `algorithms` take, as `key=value` pairs joined by spaces (e.g.
    /// `gamma=0.1 local_steps=4`): the part of a run's fingerprint that peers must share.
    pub fn protocol_fingerprint(&self, algorithms: &[AlgorithmSpec]) -> String {
        let mut out = Vec::new();
        for o in ProtocolOption::ALL {
            if let Some(a) = algorithms.iter().find(|a| a.options().contains(&o)) {
                out.push(format!("{}={}", o.key(), self.value(o, &**a)));
            }
        }
        out.join(" ")
    }
}

/// `bsp`, `asp` or `ssp:S`.
pub fn ps_mode_name(mode: PsMode) -> String {
    match mode {
        PsMode::Bsp => "bsp".into(),
        PsMode::Asp => "asp".into(),
        PsMode::Ssp { staleness } => format!("ssp:{staleness}"),
    }
}

/// Parses `bsp`, `asp` or `ssp:S` (S: the allowed staleness in rounds).
///
/// # Errors
/// A message naming the expected forms.
pub fn parse_ps_mode(s: &str) -> Result<PsMode, String> {
    Ok(match s {
        "bsp" => PsMode::Bsp,
        "asp" => PsMode::Asp,
        other => match other.strip_prefix("ssp:").map(str::parse) {
            Some(Ok(staleness)) => PsMode::Ssp { staleness },
            _ => {
                return Err(format!(
                    "unknown parameter-server mode {other:?}: expected bsp, asp or ssp:S \
                     (S = allowed staleness in rounds)"
                ))
            }
        },
    })
}

/// Everything one peer's state machine is built from.
pub struct BuildContext<'a> {
    /// This peer's rank.
    pub rank: Rank,
    /// The run's topology (W: n×n; for SGP possibly a time-varying schedule).
    pub topology: &'a Topology,
    /// Learning rate η.
    pub lr: f32,
    /// Starting parameters `x⁰: [d]`.
    pub x0: Vec<f32>,
    /// The model's tensor sizes, summing to d (for layer-wise compressors).
    pub tensor_lengths: &'a [usize],
    /// The largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
    /// How long a round may wait for its neighbours.
    pub round_timeout: Duration,
    /// Seed of this peer's randomness (random compressors, tie-breaks).
    pub seed: u64,
    /// Under the skip straggler policy, how long a round waits for a neighbour's frame
    /// (with `auto_deadline`, the longest it waits).
    pub skip_after: Option<Duration>,
    /// Under the skip policy, per-neighbour deadlines from observed arrival times
    /// ([`crate::AutoDeadline`]; D-PSGD, CHOCO-SGD and the algorithms built on D-PSGD).
    pub auto_deadline: Option<crate::AutoDeadline>,
    /// The protocol options.
    pub options: &'a AlgorithmOptions,
    /// Whether the driver reads [`Gossip::params`] only between rounds, so that an
    /// algorithm may accumulate a round's mix in its parameters and keep one `[d]` vector
    /// less ([`crate::DPsgdConfig::in_place`]): true for the simulator, false for a network
    /// peer.
    pub in_place: bool,
}

impl BuildContext<'_> {
    /// n, the number of peers.
    pub fn peers(&self) -> usize {
        self.topology.w.n()
    }

    /// d, the parameter count.
    pub fn dim(&self) -> usize {
        self.x0.len()
    }

    /// The compressor of `algorithm`, built for the model's tensors.
    ///
    /// # Errors
    /// [`BuildError::Compressor`].
    pub fn compressor(&self, algorithm: &dyn Algorithm) -> Result<Box<dyn Compressor>, BuildError> {
        Ok(self
            .options
            .compressor(algorithm)
            .build(Some(self.tensor_lengths))?)
    }

    /// SGP's push schedule: the topology's time-varying schedule if it has one, else the
    /// static graph of W.
    ///
    /// # Errors
    /// [`BuildError::Topology`] if W's graph cannot be a push schedule.
    pub fn push_schedule(&self) -> Result<PushSchedule, BuildError> {
        self.topology.push_schedule().map_err(|e| {
            BuildError::Topology(format!("topology {} for SGP: {e}", self.topology.name))
        })
    }
}

/// Why a state machine could not be built, or options were refused.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The protocol options do not suit the run's algorithms.
    #[error("{0}")]
    Options(String),
    /// The topology does not suit the algorithm.
    #[error("{0}")]
    Topology(String),
    /// The compressor cannot be built for this model.
    #[error("--compressor: {0}")]
    Compressor(#[from] murmur_compress::SpecError),
}

/// An algorithm of the registry, by name: parses, prints, compares by name; dereferences to
/// its [`Algorithm`] description.
#[derive(Clone, Copy)]
pub struct AlgorithmSpec(&'static dyn Algorithm);

impl AlgorithmSpec {
    /// Every algorithm of the registry.
    pub fn all() -> impl Iterator<Item = AlgorithmSpec> {
        ALGORITHMS.iter().map(|a| AlgorithmSpec(*a))
    }

    /// The names of the algorithms for which `pred` holds, joined by `, ` (for messages
    /// that say which algorithms can do something).
    pub fn names_where(pred: impl Fn(&dyn Algorithm) -> bool) -> String {
        let names: Vec<&str> = ALGORITHMS
            .iter()
            .filter(|a| pred(**a))
            .map(|a| a.name())
            .collect();
        names.join(", ")
    }

    /// The algorithm named `name`, if any.
    pub fn named(name: &str) -> Option<Self> {
        Self::all().find(|a| a.name() == name)
    }
}

/// The default algorithm: the first of [`ALGORITHMS`] (D-PSGD).
impl Default for AlgorithmSpec {
    fn default() -> Self {
        AlgorithmSpec(ALGORITHMS[0])
    }
}

impl std::ops::Deref for AlgorithmSpec {
    type Target = dyn Algorithm;
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl PartialEq for AlgorithmSpec {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for AlgorithmSpec {}

impl fmt::Debug for AlgorithmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlgorithmSpec({})", self.name())
    }
}

impl fmt::Display for AlgorithmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AlgorithmSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::named(s).ok_or_else(|| {
            let names: Vec<&str> = ALGORITHMS.iter().map(|a| a.name()).collect();
            format!(
                "unknown algorithm {s:?}: expected one of {}",
                names.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_parses_from_its_printed_name_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for a in AlgorithmSpec::all() {
            assert_eq!(a.to_string().parse::<AlgorithmSpec>().unwrap(), a);
            assert!(names.insert(a.name()), "{} listed twice", a.name());
            assert!(!a.about().is_empty());
            // A line break in the source without `\` puts its indentation into --help.
            assert!(!a.about().contains("  "), "{}: {:?}", a.name(), a.about());
        }
        assert_eq!(names.len(), 13);
        let err = "gossip".parse::<AlgorithmSpec>().unwrap_err();
        assert!(err.contains("dpsgd, choco, choco-auto, sgp"), "{err}");
        assert_eq!(AlgorithmSpec::default().name(), "dpsgd");
    }

    #[test]
    fn an_option_no_algorithm_of_the_run_takes_is_refused() {
        let dpsgd: AlgorithmSpec = "dpsgd".parse().unwrap();
        let choco: AlgorithmSpec = "choco".parse().unwrap();
        let o = AlgorithmOptions {
            gamma: Some(0.3),
            ..Default::default()
        };
        let err = o.validate(&[dpsgd]).unwrap_err().to_string();
        assert!(err.contains("--gamma") && err.contains("choco"), "{err}");
        assert!(o.validate(&[choco]).is_ok());
        assert!(o.validate(&[dpsgd, choco]).is_ok(), "a phase uses it");
        let o = AlgorithmOptions {
            gamma: Some(1.5),
            ..Default::default()
        };
        assert!(o
            .validate(&[choco])
            .unwrap_err()
            .to_string()
            .contains("(0, 1]"));
        let o = AlgorithmOptions {
            compressor: Some("topk:0.1".parse().unwrap()),
            ..Default::default()
        };
        let allreduce: AlgorithmSpec = "allreduce".parse().unwrap();
        let err = o.validate(&[allreduce]).unwrap_err().to_string();
        assert!(err.contains("raw f32"), "{err}");
        let o = AlgorithmOptions {
            local_steps: Some(0),
            ..Default::default()
        };
        let local: AlgorithmSpec = "local-sgd".parse().unwrap();
        assert!(o.validate(&[local]).is_err());
    }

    #[test]
    fn the_fingerprint_names_the_options_of_the_runs_algorithms_with_their_defaults() {
        let spec = |s: &str| s.parse::<AlgorithmSpec>().unwrap();
        let o = AlgorithmOptions::default();
        assert_eq!(o.protocol_fingerprint(&[spec("dpsgd")]), "robust=none");
        assert_eq!(
            o.protocol_fingerprint(&[spec("choco")]),
            "gamma=0.1 robust=none"
        );
        assert_eq!(
            o.protocol_fingerprint(&[spec("local-sgd")]),
            "local_steps=4 robust=none"
        );
        assert_eq!(
            o.protocol_fingerprint(&[spec("allreduce"), spec("sgp"), spec("ps")]),
            "tau=0 ps_mode=bsp"
        );
        let o = AlgorithmOptions {
            compressor: Some(CompressorSpec::Fp16),
            ps_mode: PsMode::Ssp { staleness: 3 },
            ..Default::default()
        };
        assert_eq!(
            o.protocol_fingerprint(&[spec("choco"), spec("ps")]),
            "gamma=0.5 ps_mode=ssp:3 robust=none"
        );
    }

    #[test]
    fn parameter_server_modes_round_trip() {
        for m in ["bsp", "asp", "ssp:4"] {
            assert_eq!(ps_mode_name(parse_ps_mode(m).unwrap()), m);
        }
        assert!(parse_ps_mode("ssp:x").unwrap_err().contains("ssp:S"));
    }
}
