//! The algorithm registry: every algorithm the peers can run, by name ([`ALGORITHMS`],
//! [`AlgorithmSpec`]), and the one check of a run's setup against its algorithms
//! ([`check_run`]).
//!
//! Each algorithm declares itself in its own file under [`crate::algorithms`] with one
//! [`Algorithm`] implementation (see [`crate::algorithm`]): its name and source, one
//! [`Capabilities`] value, its own checks in [`Algorithm::check`], and how to build one
//! peer's state machine. An [`AlgorithmSpec`] is a name parsed against [`ALGORITHMS`], as
//! `murmur_compress::CompressorSpec` and `murmur_topology::TopologySpec` are for
//! compressors and topologies. The registry knows the algorithms only through these rows;
//! what a run must satisfy for its algorithms (the options, the straggler policy, the
//! topology) is checked in one place, [`check_run`], which the node calls before any peer
//! starts and every `build` calls again.

use std::fmt;
use std::str::FromStr;

use murmur_compress::CompressorSpec;
use murmur_topology::Topology;

pub use crate::algorithm::*;
use crate::BuildError;

/// Every algorithm, in the order `--help` lists them. The first is the default.
pub const ALGORITHMS: &[&dyn Algorithm] = &[
    &crate::algorithms::dpsgd::DPSGD,
    &crate::algorithms::choco::CHOCO,
    &crate::algorithms::choco_auto::CHOCO_AUTO,
    &crate::algorithms::sgp::SGP,
    &crate::algorithms::gradient_tracking::GRADIENT_TRACKING,
    &crate::algorithms::d2::D2_ALGORITHM,
    &crate::algorithms::local_sgd::LOCAL_SGD,
    &crate::algorithms::local_auto::LOCAL_AUTO,
    &crate::algorithms::local_avg::LOCAL_AVG,
    &crate::algorithms::diloco::DILOCO,
    &crate::algorithms::diloco_gossip::DILOCO_GOSSIP,
    &crate::algorithms::diloco_auto::DILOCO_AUTO,
    &crate::algorithms::streaming_diloco::STREAMING_DILOCO,
    &crate::algorithms::allreduce::ALLREDUCE,
    &crate::algorithms::ps::PS,
];

impl AlgorithmOptions {
    /// Checks the options alone for a run of `algorithms` ([`check_run`] without a
    /// topology, under the wait straggler policy).
    ///
    /// # Errors
    /// [`BuildError::Options`] naming the flag and what is wrong.
    pub fn validate(&self, algorithms: &[AlgorithmSpec]) -> Result<(), BuildError> {
        check_run(algorithms, &RunSetup::options(self))
    }

    /// The options that `algorithms` take, as `key=value` pairs joined by spaces (e.g.
    /// `gamma=0.1 local_steps=4`): the part of a run's fingerprint that peers must share.
    pub fn protocol_fingerprint(&self, algorithms: &[AlgorithmSpec]) -> String {
        let mut out = Vec::new();
        for o in ProtocolOption::ALL {
            if let Some(a) = algorithms.iter().find(|a| a.capabilities().takes(o)) {
                out.push(format!("{}={}", o.key, self.value(o, &**a)));
            }
        }
        out.join(" ")
    }
}

/// Checks a run of `algorithms` (one, or a phase schedule's) against `run`: every
/// option given is taken by one of them and has a valid value; `--compressor` applies to
/// them; the skip straggler policy is supported (by a single algorithm); the topology, if
/// loaded, is one they mix on (a push schedule only for SGP, an undirected graph where W
/// must be symmetric); and each algorithm's own [`Algorithm::check`].
///
/// # Errors
/// [`BuildError::Options`] or [`BuildError::Topology`], one line naming the flag.
pub fn check_run(algorithms: &[AlgorithmSpec], run: &RunSetup<'_>) -> Result<(), BuildError> {
    let o = run.options;
    for opt in ProtocolOption::ALL {
        if o.is_set(opt) && !algorithms.iter().any(|a| a.capabilities().takes(opt)) {
            return Err(BuildError::Options(format!(
                "{} is {}; it needs --algorithm {}",
                opt.flag,
                opt.what,
                AlgorithmSpec::names_where(|a| a.capabilities().takes(opt)).replace(", ", " or ")
            )));
        }
        (opt.check)(o).map_err(|e| BuildError::Options(format!("{} {e}", opt.flag)))?;
    }
    if let Some(c) = &o.compressor {
        // Refused here only where nothing of the run compresses; an algorithm that chooses
        // its own compressor (choco-auto) refuses it in its own check, saying why.
        let raw = |a: &AlgorithmSpec| a.capabilities().compresses == Compresses::Nothing;
        if algorithms.iter().all(raw) && *c != CompressorSpec::Identity {
            let run: Vec<String> = algorithms.iter().map(|a| a.to_string()).collect();
            return Err(BuildError::Options(format!(
                "--compressor {c}: {} sends raw f32 (no compressor applies); compression \
                 applies to {}",
                run.join(", "),
                AlgorithmSpec::names_where(|a| a.capabilities().compresses.takes_compressor())
            )));
        }
    }
    if run.skip_policy {
        let skips = |a: &AlgorithmSpec| a.capabilities().skips_stragglers;
        if algorithms.len() != 1 || !algorithms.iter().all(skips) {
            let run: Vec<String> = algorithms.iter().map(|a| a.to_string()).collect();
            return Err(BuildError::Options(format!(
                "--straggler-policy skip works with {}, not {}",
                AlgorithmSpec::names_where(|a| a.capabilities().skips_stragglers),
                run.join(" then ")
            )));
        }
    }
    if let Some(topo) = run.topology {
        check_topology(algorithms, topo)?;
    }
    for a in algorithms {
        a.check(run)?;
    }
    Ok(())
}

/// A time-varying schedule only for SGP; an undirected graph where W must be symmetric.
fn check_topology(algorithms: &[AlgorithmSpec], topo: &Topology) -> Result<(), BuildError> {
    let needs = |a: &AlgorithmSpec| match a.capabilities().pattern {
        Pattern::Graph(n) => Some(n),
        Pattern::Fixed(_) => None,
    };
    if topo.schedule.is_some() {
        let static_users: Vec<String> = algorithms
            .iter()
            .filter(|a| matches!(needs(a), Some(GraphNeeds::Static | GraphNeeds::Symmetric)))
            .map(|a| a.to_string())
            .collect();
        if !static_users.is_empty() {
            return Err(BuildError::Topology(format!(
                "--topology {} is a time-varying push schedule for --algorithm sgp; {} \
                 need a mixing matrix W (try exponential)",
                topo.name,
                static_users.join(", ")
            )));
        }
    }
    if let Some(a) = algorithms
        .iter()
        .find(|a| needs(a) == Some(GraphNeeds::Symmetric))
    {
        if !topo.w.graph().is_symmetric() {
            return Err(BuildError::Topology(format!(
                "--topology {}: {a} needs an undirected graph (a symmetric W: every link \
                 carries messages both ways), and this one is directed",
                topo.name
            )));
        }
    }
    Ok(())
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
    use crate::PsMode;

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
        assert_eq!(names.len(), ALGORITHMS.len());
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
        assert_eq!(
            o.protocol_fingerprint(&[spec("dpsgd")]),
            "robust=none part_mb=4"
        );
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
    fn a_compressor_is_refused_where_it_would_be_ignored() {
        let o = AlgorithmOptions {
            compressor: Some("topk:0.1".parse().unwrap()),
            ..Default::default()
        };
        for name in ["local-auto", "diloco-auto", "local-avg", "allreduce", "ps"] {
            let a: AlgorithmSpec = name.parse().unwrap();
            let err = o.validate(&[a]).unwrap_err().to_string();
            assert!(err.contains("--compressor topk:0.1"), "{name}: {err}");
        }
        let err = o
            .validate(&["choco-auto".parse().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("chooses each link's compressor"), "{err}");
        assert!(o.validate(&["dpsgd".parse().unwrap()]).is_ok());
    }

    #[test]
    fn capabilities_say_what_resume_can_do_under_each_straggler_policy() {
        let caps = |s: &str| s.parse::<AlgorithmSpec>().unwrap().capabilities().clone();
        assert_eq!(caps("choco").resumable(false), Resumable::Rejoin);
        assert_eq!(caps("choco").resumable(true), Resumable::WholeRun);
        assert_eq!(caps("dpsgd").resumable(true), Resumable::Rejoin);
        assert_eq!(caps("diloco").resumable(false), Resumable::WholeRun);
        assert_eq!(caps("diloco-gossip").resumable(true), Resumable::Rejoin);
        assert_eq!(caps("local-auto").resumable(false), Resumable::No);
        // Every option an algorithm lists is a row of the table.
        for a in AlgorithmSpec::all() {
            for o in a.capabilities().options {
                assert!(ProtocolOption::ALL.contains(o), "{a}: {o:?}");
            }
            assert_eq!(
                a.capabilities().has_local_steps(),
                a.capabilities().takes(&ProtocolOption::LOCAL_STEPS),
                "{a}: H is a default exactly when --local-steps is taken"
            );
        }
    }

    #[test]
    fn the_skip_policy_and_a_topology_are_checked_from_the_capabilities() {
        let o = AlgorithmOptions::default();
        let skip = RunSetup {
            skip_policy: true,
            ..RunSetup::options(&o)
        };
        let spec = |s: &str| s.parse::<AlgorithmSpec>().unwrap();
        assert!(check_run(&[spec("dpsgd")], &skip).is_ok());
        let err = check_run(&[spec("allreduce")], &skip)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--straggler-policy skip works with dpsgd"),
            "{err}"
        );
        // --robust does not combine with skipping (D-PSGD's rounds and CHOCO-SGD's),
        // refused before any peer is built.
        let robust = AlgorithmOptions {
            robust: Some("clip".parse().unwrap()),
            ..Default::default()
        };
        for name in ["dpsgd", "local-sgd", "diloco-gossip", "choco"] {
            let run = RunSetup {
                skip_policy: true,
                ..RunSetup::options(&robust)
            };
            let err = check_run(&[spec(name)], &run).unwrap_err().to_string();
            assert!(err.contains("--robust"), "{name}: {err}");
        }
        let err = check_run(&[spec("dpsgd"), spec("choco")], &skip)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not dpsgd then choco"), "{err}");
        let schedule = murmur_topology::TopologySpec::parse(&format!(
            "schedule = \"{}\"",
            murmur_topology::ONE_PEER_EXPONENTIAL
        ))
        .unwrap()
        .build(Some(8))
        .unwrap();
        let on = RunSetup {
            topology: Some(&schedule),
            ..RunSetup::options(&o)
        };
        assert!(check_run(&[spec("sgp")], &on).is_ok());
        assert!(
            check_run(&[spec("allreduce")], &on).is_ok(),
            "a fixed pattern"
        );
        let err = check_run(&[spec("dpsgd")], &on).unwrap_err().to_string();
        assert!(err.contains("time-varying push schedule"), "{err}");
    }

    #[test]
    fn parameter_server_modes_round_trip() {
        for m in ["bsp", "asp", "ssp:4"] {
            assert_eq!(ps_mode_name(parse_ps_mode(m).unwrap()), m);
        }
        assert!(parse_ps_mode("ssp:x").unwrap_err().contains("ssp:S"));
    }
}
