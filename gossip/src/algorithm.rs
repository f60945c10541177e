//! What an algorithm is, as the registry and the node see it: the [`Algorithm`] trait each
//! algorithm implements in its own file under [`crate::algorithms`], its [`Capabilities`]
//! (one value, every field written out), the protocol options as rows of one table
//! ([`ProtocolOption::ALL`]) with the values a run gives them ([`AlgorithmOptions`]), the
//! run's setup its checks see ([`RunSetup`]) and what one peer's state machine is built from
//! ([`BuildContext`]). The list of algorithms and the checks of a whole run are in
//! [`crate::registry`], which imports the algorithms; the algorithms import only this
//! module, so there is no circle between them.
//!
//! A new protocol option is a field of [`AlgorithmOptions`] and a row here (an associated
//! constant of [`ProtocolOption`] and its place in [`ProtocolOption::ALL`]).

use std::fmt;
use std::time::Duration;

use murmur_compress::{Compressor, CompressorSpec};
use murmur_topology::{PushSchedule, Topology};

use crate::optimizer::{check_outer_lr, check_outer_momentum, OuterConfig, OuterOptimizer};
use crate::{BuildError, Gossip, PsMode, Rank};

/// One algorithm as the registry knows it. Implemented once per algorithm, in its file.
///
/// Nothing here has a silent default but [`Algorithm::check`] (no checks of its own):
/// what an algorithm can do is one [`Capabilities`] value whose every field it writes.
pub trait Algorithm: Sync {
    /// The name on the command line and in results, e.g. `dpsgd`.
    fn name(&self) -> &'static str;

    /// One line for `--help`: what it does and its source (paper, year).
    fn about(&self) -> &'static str;

    /// What it needs and what it can do.
    fn capabilities(&self) -> &'static Capabilities;

    /// Its own checks of a run's setup, beyond what [`crate::registry::check_run`] derives from its
    /// [`Capabilities`] (e.g. which compressors it can use). Called by [`crate::registry::check_run`], so by
    /// the node before any peer starts, and by `build`.
    ///
    /// # Errors
    /// [`BuildError`] naming the flag and what is wrong.
    fn check(&self, run: &RunSetup<'_>) -> Result<(), BuildError> {
        let _ = run;
        Ok(())
    }

    /// Peer `ctx.rank`'s state machine.
    ///
    /// # Errors
    /// [`BuildError`] if the options or the topology do not suit the algorithm, or the
    /// compressor cannot be built for the model.
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError>;
}

/// What an algorithm needs and can do: one value per algorithm, every field written out.
#[derive(Debug, Clone, PartialEq)]
pub struct Capabilities {
    /// Whom it talks to: the topology's W, or a fixed pattern that ignores `--topology`.
    pub pattern: Pattern,
    /// H when `--local-steps` is not given, if it takes local steps (`None`: one step per
    /// communication round, and `--local-steps` is not among its options).
    pub local_steps: Option<u64>,
    /// τ in rounds when `--tau` is not given (read only if it takes [`ProtocolOption::TAU`]).
    pub default_tau: u64,
    /// What its messages carry through the compressor.
    pub compresses: Compresses,
    /// The compressor when `--compressor` is not given.
    pub default_compressor: CompressorSpec,
    /// The protocol options it takes, rows of [`ProtocolOption::ALL`].
    pub options: &'static [ProtocolOption],
    /// Whether it supports the skip straggler policy (mixing a round without a late
    /// neighbour's frame).
    pub skips_stragglers: bool,
    /// What the others do when a peer leaves.
    pub departures: Departures,
    /// What `--resume` can do.
    pub resume: Resume,
}

/// Whom an algorithm talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// It mixes on the topology's graph (W: n×n).
    Graph(GraphNeeds),
    /// A fixed communication pattern that ignores `--topology` (e.g. `ring all-reduce`).
    Fixed(&'static str),
}

/// The graphs an algorithm that mixes on W can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphNeeds {
    /// Any static W, directed or not (D-PSGD, CHOCO-SGD).
    Static,
    /// A symmetric W (an undirected graph): it mixes pairwise.
    Symmetric,
    /// A static W or a time-varying push schedule (`one-peer-exponential`), directed or not
    /// (SGP).
    PushSchedule,
}

/// What an algorithm's messages carry through the compressor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compresses {
    /// Nothing: it sends raw `f32`, and `--compressor` other than the identity is refused.
    Nothing,
    /// The neighbours' parameters, mixed as they arrive (D-PSGD and its local-step kin):
    /// a compressor other than a cast biases the models (the node warns).
    Parameters,
    /// Increments q of a public copy that the receivers sum (CHOCO-SGD's x̂).
    Increments,
    /// Push-sum shares (SGP).
    Shares,
    /// Pseudo-gradients applied by an outer optimizer (DiLoCo over all-reduce): a biased
    /// operator needs a small outer learning rate (the node warns).
    PseudoGradients,
    /// Each link's messages, with a compressor it chooses per link from measured bandwidth:
    /// no one compressor describes the run, and `--compressor` is refused.
    PerLink,
}

impl Compresses {
    /// Whether `--compressor` applies (the algorithm compresses with the one given).
    pub fn takes_compressor(self) -> bool {
        !matches!(self, Self::Nothing | Self::PerLink)
    }
}

/// What the other peers do when a peer leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departures {
    /// They train on (re-weighting W, or pushing around the gap).
    TrainOn,
    /// The run ends.
    EndRun,
}

/// What `--resume` can do for an algorithm, whatever the straggler policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// One restarted peer rejoins a running run, or the whole run resumes.
    Rejoin,
    /// One restarted peer rejoins, but not under the skip straggler policy (then only the
    /// whole run resumes): CHOCO-SGD, whose returning peer's full copy could not be told
    /// from a late message.
    RejoinWithoutSkip,
    /// Only the whole run resumes from its checkpoints.
    WholeRun,
    /// Neither.
    No,
}

impl Capabilities {
    /// Whether it mixes on the topology's W.
    pub fn uses_topology(&self) -> bool {
        matches!(self.pattern, Pattern::Graph(_))
    }

    /// Whether it takes H local steps per communication round.
    pub fn has_local_steps(&self) -> bool {
        self.local_steps.is_some()
    }

    /// Whether the other peers train on when a peer leaves.
    pub fn survives_departure(&self) -> bool {
        self.departures == Departures::TrainOn
    }

    /// What `--resume` can do; `skip_policy`: whether the run uses the skip straggler
    /// policy.
    pub fn resumable(&self, skip_policy: bool) -> Resumable {
        match (self.resume, skip_policy) {
            (Resume::Rejoin, _) | (Resume::RejoinWithoutSkip, false) => Resumable::Rejoin,
            (Resume::RejoinWithoutSkip, true) | (Resume::WholeRun, _) => Resumable::WholeRun,
            (Resume::No, _) => Resumable::No,
        }
    }

    /// Whether it takes `option`.
    pub fn takes(&self, option: &ProtocolOption) -> bool {
        self.options.contains(option)
    }
}

/// What `--resume` can do for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumable {
    /// One restarted peer rejoins a running run, or the whole run resumes.
    Rejoin,
    /// Only the whole run resumes from its checkpoints.
    WholeRun,
    /// Neither.
    No,
}

/// One protocol option: an algorithm's parameter that every peer of a run must share (it
/// changes the protocol or the update), as a row of [`ProtocolOption::ALL`].
///
/// A new option: a field of [`AlgorithmOptions`], a row here (an associated constant and
/// its place in `ALL`), the algorithms that take it list it in their [`Capabilities`].
#[derive(Clone, Copy)]
pub struct ProtocolOption {
    /// The command-line flag, e.g. `--gamma`.
    pub flag: &'static str,
    /// The key in a run's protocol fingerprint (`gamma=0.1`).
    pub key: &'static str,
    /// What the option is, for error messages.
    pub what: &'static str,
    /// Whether the option was given (for the PS mode: differs from `bsp`).
    pub given: fn(&AlgorithmOptions) -> bool,
    /// Its value for an algorithm, as the fingerprint prints it (the default if not given).
    pub value: fn(&AlgorithmOptions, &dyn Algorithm) -> String,
    /// Checks the value given; `Err` ends "… must be …" after the flag.
    pub check: fn(&AlgorithmOptions) -> Result<(), String>,
}

fn no_check(_: &AlgorithmOptions) -> Result<(), String> {
    Ok(())
}

impl ProtocolOption {
    /// CHOCO-SGD's consensus step size γ ∈ (0, 1] (`--gamma`).
    pub const GAMMA: Self = Self {
        flag: "--gamma",
        key: "gamma",
        what: "CHOCO-SGD's consensus step size",
        given: |o| o.gamma.is_some(),
        value: |o, a| o.gamma(a).to_string(),
        check: |o| match o.gamma {
            Some(g) if !(g > 0.0 && g <= 1.0) => Err(format!("must be in (0, 1], got {g}")),
            _ => Ok(()),
        },
    };
    /// Local steps per communication round H ≥ 1 (`--local-steps`).
    pub const LOCAL_STEPS: Self = Self {
        flag: "--local-steps",
        key: "local_steps",
        what: "the local steps per communication round",
        given: |o| o.local_steps.is_some(),
        value: |o, a| o.local_steps(a).to_string(),
        check: |o| match o.local_steps {
            Some(0) => Err("must be at least 1".into()),
            _ => Ok(()),
        },
    };
    /// The overlap τ in rounds (`--tau`): SGP's bound on the age of in-peers' messages,
    /// Streaming DiLoCo's delay between a fragment's sync and its application.
    pub const TAU: Self = Self {
        flag: "--tau",
        key: "tau",
        what: "the overlap in rounds (SGP's bound, Streaming DiLoCo's delay)",
        given: |o| o.tau.is_some(),
        value: |o, a| o.tau(a).to_string(),
        check: no_check,
    };
    /// The parameter server's synchronisation (`--ps-mode`).
    pub const PS_MODE: Self = Self {
        flag: "--ps-mode",
        key: "ps_mode",
        what: "the parameter server's synchronisation",
        given: |o| o.ps_mode != PsMode::Bsp,
        value: |o, _| ps_mode_name(o.ps_mode),
        check: no_check,
    };
    /// DiLoCo's outer optimizer, `nesterov` or `sgd` (`--outer-optimizer`).
    pub const OUTER_OPTIMIZER: Self = Self {
        flag: "--outer-optimizer",
        key: "outer_optimizer",
        what: "DiLoCo's outer optimizer",
        given: |o| o.outer_optimizer.is_some(),
        value: |o, _| o.outer().optimizer.to_string(),
        check: no_check,
    };
    /// DiLoCo's outer learning rate η_out > 0 (`--outer-lr`).
    pub const OUTER_LR: Self = Self {
        flag: "--outer-lr",
        key: "outer_lr",
        what: "DiLoCo's outer learning rate",
        given: |o| o.outer_lr.is_some(),
        value: |o, _| o.outer().lr.to_string(),
        check: |o| o.outer_lr.map_or(Ok(()), check_outer_lr),
    };
    /// DiLoCo's outer momentum μ ∈ [0, 1) (`--outer-momentum`).
    pub const OUTER_MOMENTUM: Self = Self {
        flag: "--outer-momentum",
        key: "outer_momentum",
        what: "DiLoCo's outer momentum",
        given: |o| o.outer_momentum.is_some(),
        value: |o, _| o.outer().momentum.to_string(),
        check: |o| o.outer_momentum.map_or(Ok(()), check_outer_momentum),
    };
    /// Streaming DiLoCo's fragments P ≥ 1 (`--fragments`).
    pub const FRAGMENTS: Self = Self {
        flag: "--fragments",
        key: "fragments",
        what: "Streaming DiLoCo's fragments",
        given: |o| o.fragments.is_some(),
        value: |o, _| o.fragments().to_string(),
        check: |o| match o.fragments {
            Some(0) => Err("must be at least 1".into()),
            _ => Ok(()),
        },
    };
    /// Streaming DiLoCo's merge factor α ∈ [0, 1] (`--merge-alpha`).
    pub const MERGE_ALPHA: Self = Self {
        flag: "--merge-alpha",
        key: "merge_alpha",
        what: "Streaming DiLoCo's merge factor",
        given: |o| o.merge_alpha.is_some(),
        value: |o, _| o.merge_alpha().to_string(),
        check: |o| match o.merge_alpha {
            Some(a) if !(0.0..=1.0).contains(&a) => Err(format!("must be in [0, 1], got {a}")),
            _ => Ok(()),
        },
    };
    /// The size of a part of D-PSGD's streamed message in MB, 0 for whole messages
    /// (`--part-mb`; [`crate::mixing::streaming`]).
    pub const PART_MB: Self = Self {
        flag: "--part-mb",
        key: "part_mb",
        what: "the size of a streamed message's parts in MB",
        given: |o| o.part_mb.is_some(),
        value: |o, _| o.part_mb().to_string(),
        check: |o| match o.part_mb {
            Some(mb) if !(mb >= 0.0 && mb.is_finite()) => {
                Err(format!("must be a size in MB, 0 or more, got {mb}"))
            }
            _ => Ok(()),
        },
    };
    /// Byzantine-robust mixing (`--robust`).
    pub const ROBUST: Self = Self {
        flag: "--robust",
        key: "robust",
        what: "Byzantine-robust mixing (ClippedGossip)",
        given: |o| o.robust.is_some(),
        value: |o, _| {
            o.robust
                .map_or_else(|| "none".to_string(), |r| r.to_string())
        },
        check: no_check,
    };

    /// Every option, in the order the fingerprint prints them.
    pub const ALL: &'static [ProtocolOption] = &[
        Self::GAMMA,
        Self::LOCAL_STEPS,
        Self::TAU,
        Self::PS_MODE,
        Self::OUTER_OPTIMIZER,
        Self::OUTER_LR,
        Self::OUTER_MOMENTUM,
        Self::FRAGMENTS,
        Self::MERGE_ALPHA,
        Self::ROBUST,
        Self::PART_MB,
    ];
}

/// Two rows are the same option when their keys are.
impl PartialEq for ProtocolOption {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for ProtocolOption {}

impl fmt::Debug for ProtocolOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag)
    }
}

/// Streaming DiLoCo's fragments P when `--fragments` is not given.
pub const DEFAULT_FRAGMENTS: u64 = 4;
/// Streaming DiLoCo's merge factor α when `--merge-alpha` is not given.
pub const DEFAULT_MERGE_ALPHA: f32 = 0.5;

/// The protocol options as given (`None`: the algorithm's default).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlgorithmOptions {
    /// The compressor of the messages; `None`: [`Capabilities::default_compressor`].
    pub compressor: Option<CompressorSpec>,
    /// CHOCO-SGD's consensus step size γ ∈ (0, 1]; `None`: [`AlgorithmOptions::gamma`].
    pub gamma: Option<f32>,
    /// Local steps per communication round H ≥ 1; `None`: the algorithm's
    /// [`Capabilities::local_steps`] (4; DiLoCo 50).
    pub local_steps: Option<u64>,
    /// The overlap τ in rounds (SGP's bound, Streaming DiLoCo's delay); `None`: the
    /// algorithm's [`Capabilities::default_tau`] (SGP 0: synchronous; Streaming DiLoCo 1).
    pub tau: Option<u64>,
    /// The parameter server's synchronisation.
    pub ps_mode: PsMode,
    /// DiLoCo's outer optimizer; `None`: Nesterov (the paper's).
    pub outer_optimizer: Option<crate::OuterOptimizer>,
    /// DiLoCo's outer learning rate η_out > 0; `None`: the optimizer's default (Nesterov
    /// 0.7, SGD 1).
    pub outer_lr: Option<f32>,
    /// DiLoCo's outer momentum μ ∈ [0, 1); `None`: the optimizer's default (Nesterov 0.9,
    /// SGD 0).
    pub outer_momentum: Option<f32>,
    /// Streaming DiLoCo's fragments P, 1 ≤ P ≤ H; `None`: [`DEFAULT_FRAGMENTS`].
    pub fragments: Option<u64>,
    /// Streaming DiLoCo's merge factor α ∈ [0, 1] (the share of the local fragment kept
    /// when a synchronised one is applied); `None`: [`DEFAULT_MERGE_ALPHA`].
    pub merge_alpha: Option<f32>,
    /// Byzantine-robust mixing (ClippedGossip); `None`: plain gossip.
    pub robust: Option<crate::mixing::robust::ClipRule>,
    /// D-PSGD's streamed parts in MB, 0 for whole messages; `None`:
    /// [`crate::mixing::streaming::DEFAULT_PART_MB`].
    pub part_mb: Option<f64>,
}

impl AlgorithmOptions {
    /// Whether the option was given (for the PS mode: differs from `bsp`).
    pub fn is_set(&self, o: &ProtocolOption) -> bool {
        (o.given)(self)
    }

    /// The compressor for `algorithm`: the one given, else its default.
    pub fn compressor(&self, algorithm: &dyn Algorithm) -> CompressorSpec {
        self.compressor
            .clone()
            .unwrap_or_else(|| algorithm.capabilities().default_compressor.clone())
    }

    /// γ: the one given, else 0.5 for the identity and the casts and 0.1 for the other
    /// compressors of `algorithm` (measured on the embedded MNIST).
    pub fn gamma(&self, algorithm: &dyn Algorithm) -> f32 {
        self.gamma.unwrap_or(match self.compressor(algorithm) {
            CompressorSpec::Identity | CompressorSpec::Fp16 | CompressorSpec::Bf16 => 0.5,
            _ => 0.1,
        })
    }

    /// H: the one given, else the algorithm's [`Capabilities::local_steps`] (4 for most
    /// algorithms with local steps, 50 for DiLoCo), 1 for those without.
    pub fn local_steps(&self, algorithm: &dyn Algorithm) -> u64 {
        self.local_steps
            .or(algorithm.capabilities().local_steps)
            .unwrap_or(1)
    }

    /// τ: the one given, else the algorithm's [`Capabilities::default_tau`].
    pub fn tau(&self, algorithm: &dyn Algorithm) -> u64 {
        self.tau.unwrap_or(algorithm.capabilities().default_tau)
    }

    /// Streaming DiLoCo's fragments P: the one given, else [`DEFAULT_FRAGMENTS`].
    pub fn fragments(&self) -> u64 {
        self.fragments.unwrap_or(DEFAULT_FRAGMENTS)
    }

    /// Streaming DiLoCo's merge factor α: the one given, else [`DEFAULT_MERGE_ALPHA`].
    pub fn merge_alpha(&self) -> f32 {
        self.merge_alpha.unwrap_or(DEFAULT_MERGE_ALPHA)
    }

    /// D-PSGD's streamed parts in MB: `--part-mb`, else
    /// [`crate::mixing::streaming::DEFAULT_PART_MB`].
    pub fn part_mb(&self) -> f64 {
        self.part_mb
            .unwrap_or(crate::mixing::streaming::DEFAULT_PART_MB)
    }

    /// DiLoCo's outer step: the optimizer given (else Nesterov; SGD with `--compressor
    /// sparseloco`), with the η_out and μ given (else the optimizer's defaults). Not checked here: see [`OuterConfig::check`].
    pub fn outer(&self) -> OuterConfig {
        // SparseLoCo drops the outer momentum: its decayed error feedback stands in for it
        // (Sarfi et al. 2025, §3), so its default outer step is plain SGD with η_out = 1.
        let sparseloco = matches!(self.compressor, Some(CompressorSpec::SparseLoco { .. }));
        let optimizer = self.outer_optimizer.unwrap_or(if sparseloco {
            OuterOptimizer::Sgd
        } else {
            OuterOptimizer::default()
        });
        OuterConfig {
            optimizer,
            lr: self.outer_lr.unwrap_or(optimizer.default_lr()),
            momentum: self.outer_momentum.unwrap_or(optimizer.default_momentum()),
        }
    }

    /// The value of `o` for `algorithm` as the fingerprint prints it.
    pub fn value(&self, o: &ProtocolOption, algorithm: &dyn Algorithm) -> String {
        (o.value)(self, algorithm)
    }
}

/// A run's setup as the algorithms' checks see it.
#[derive(Clone, Copy)]
pub struct RunSetup<'a> {
    /// The protocol options.
    pub options: &'a AlgorithmOptions,
    /// The run's topology, once it is loaded (`None`: not checked yet).
    pub topology: Option<&'a Topology>,
    /// Whether the run uses the skip straggler policy.
    pub skip_policy: bool,
    /// Whether the skip policy's deadlines are per neighbour from observed arrival times
    /// (`--straggler-deadline-ms auto`).
    pub auto_deadline: bool,
}

impl<'a> RunSetup<'a> {
    /// The options alone: no topology, the wait straggler policy.
    pub fn options(options: &'a AlgorithmOptions) -> Self {
        Self {
            options,
            topology: None,
            skip_policy: false,
            auto_deadline: false,
        }
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
    /// Whether every peer starts from the same x⁰ bit for bit (`--init same`, or one
    /// `--init-from` file, outside a phase schedule): DiLoCo's SparseLoCo form then
    /// compresses its first outer step too, since the anchors are already identical.
    pub shared_start: bool,
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

impl<'a> BuildContext<'a> {
    /// The run's setup as [`Algorithm::check`] sees it.
    pub fn setup(&self) -> RunSetup<'a> {
        RunSetup {
            options: self.options,
            topology: Some(self.topology),
            skip_policy: self.skip_after.is_some(),
            auto_deadline: self.auto_deadline.is_some(),
        }
    }
}
