//! The typed values of the command line that are not plain numbers: phase schedules, link
//! rates and delays, the starting point, the straggler policy, the device.

use clap::ValueEnum;

use super::AlgorithmSpec;

/// `--algorithm`'s parser: the registry's names, each with its one-line description in
/// `--help`.
pub(super) fn algorithm_parser() -> impl clap::builder::TypedValueParser<Value = AlgorithmSpec> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        AlgorithmSpec::all().map(|a| PossibleValue::new(a.name()).help(a.about())),
    )
    .try_map(|name| name.parse::<AlgorithmSpec>())
}

/// A phase schedule: algorithms run one after the other, each for a number of epochs but
/// the last, e.g. `allreduce:2,dpsgd` (all-reduce for 2 epochs, then D-PSGD) or
/// `dpsgd:10,allreduce` (post-local SGD in reverse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseSchedule(pub Vec<(AlgorithmSpec, Option<usize>)>);

impl std::str::FromStr for PhaseSchedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let mut phases = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let (name, epochs) = match part.split_once(':') {
                Some((name, e)) => {
                    let e: usize = e
                        .parse()
                        .map_err(|_| format!("phase {part:?}: {e:?} is not a number of epochs"))?;
                    if e == 0 {
                        return Err(format!("phase {part:?} must run at least one epoch"));
                    }
                    (name, Some(e))
                }
                None if last => (*part, None),
                None => {
                    return Err(format!(
                        "phase {part:?} needs a length in epochs, e.g. {part}:2 (only the last \
                         phase runs to the end)"
                    ))
                }
            };
            if last && epochs.is_some() {
                return Err(format!(
                    "the last phase {part:?} runs to the end: write it without `:epochs`"
                ));
            }
            phases.push((name.parse::<AlgorithmSpec>()?, epochs));
        }
        if phases.len() < 2 {
            return Err(
                "a phase schedule needs at least two phases, e.g. allreduce:2,dpsgd".into(),
            );
        }
        Ok(PhaseSchedule(phases))
    }
}

impl std::fmt::Display for PhaseSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (a, e)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match e {
                Some(e) => write!(f, "{a}:{e}")?,
                None => write!(f, "{a}")?,
            }
        }
        Ok(())
    }
}

/// A link rate for `--link-bandwidth`: a number and a unit, `bit`, `Kbit`, `Mbit` or `Gbit`
/// per second (decimal prefixes), e.g. `1Gbit`, `100Mbit`. Stored in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkRate(pub f64);

impl std::str::FromStr for LinkRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| c.is_ascii_alphabetic())
            .ok_or_else(|| format!("link rate {s:?}: give a unit, e.g. 1Gbit or 100Mbit"))?;
        let (num, unit) = t.split_at(split);
        let v: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("link rate {s:?}: {num:?} is not a number"))?;
        let bits = match unit
            .to_ascii_lowercase()
            .trim_end_matches("/s")
            .trim_end_matches("ps")
        {
            "bit" | "b" => 1.0,
            "kbit" | "kb" => 1e3,
            "mbit" | "mb" => 1e6,
            "gbit" | "gb" => 1e9,
            _ => {
                return Err(format!(
                    "link rate {s:?}: unknown unit {unit:?} (bit, Kbit, Mbit or Gbit per second)"
                ))
            }
        };
        let bytes = v * bits / 8.0;
        if !(bytes.is_finite() && bytes > 0.0) {
            return Err(format!("link rate {s:?} must be positive"));
        }
        Ok(LinkRate(bytes))
    }
}

impl std::fmt::Display for LinkRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}Mbit", self.0 * 8.0 / 1e6)
    }
}

/// A one-way delay for `--link-latency`: a number and `s`, `ms` or `us`, e.g. `2ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkLatency(pub std::time::Duration);

impl std::str::FromStr for LinkLatency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
            (n, 1e-3)
        } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
            (n, 1e-6)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1.0)
        } else {
            return Err(format!(
                "link latency {s:?}: give a unit, e.g. 2ms, 500us or 0.1s"
            ));
        };
        let v: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("link latency {s:?}: {num:?} is not a number"))?;
        if !(v.is_finite() && (0.0..=60.0).contains(&(v * scale))) {
            return Err(format!("link latency {s:?} must be between 0 and 60 s"));
        }
        Ok(LinkLatency(std::time::Duration::from_secs_f64(v * scale)))
    }
}

impl std::fmt::Display for LinkLatency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}us", self.0.as_micros())
    }
}

/// How the peers' starting parameters x⁰ relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Init {
    /// Every peer starts from the same x⁰ (Ξ²(0) = 0), as in Lian et al. 2017.
    Same,
    /// Each peer draws its own x⁰ (seed + rank): a consensus experiment from Ξ²(0) > 0.
    Independent,
}

/// What a round does about a neighbour whose frame is late (`--straggler-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum StragglerPolicy {
    /// Wait for every neighbour, up to `--round-timeout-secs`.
    #[default]
    Wait,
    /// Mix without a neighbour whose frame has not arrived `--straggler-deadline-ms` after
    /// the round began (`auto`: a deadline per neighbour from its arrival times). D-PSGD and local-SGD (undirected topologies): both ends drop the
    /// edge for that round, so W stays doubly stochastic. SGP and CHOCO-SGD: the late
    /// message is absorbed when it comes (at most 8 rounds late), which keeps the
    /// push-sum mass and CHOCO's network average.
    Skip,
}

/// How long a round waits for a neighbour under `--straggler-policy skip`
/// (`--straggler-deadline-ms`): a fixed number of milliseconds, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StragglerDeadline {
    /// The same deadline for every neighbour, in milliseconds.
    Ms(u64),
    /// Per neighbour, from its observed arrival times (`murmur_gossip::AutoDeadline`:
    /// twice the 95th percentile of its last 32 delays, between 5 ms and
    /// [`StragglerDeadline::AUTO_CEILING`]).
    Auto,
}

impl StragglerDeadline {
    /// The longest an `auto` deadline waits (and what it waits before a neighbour has a
    /// history): 10 s, or half of `--round-timeout-secs` if that is shorter.
    pub const AUTO_CEILING: std::time::Duration = std::time::Duration::from_secs(10);
}

impl std::str::FromStr for StragglerDeadline {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(StragglerDeadline::Auto);
        }
        s.parse::<u64>().map(StragglerDeadline::Ms).map_err(|_| {
            format!("{s:?}: expected a number of milliseconds or auto (per-neighbour deadlines from arrival times)")
        })
    }
}

impl std::fmt::Display for StragglerDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StragglerDeadline::Ms(ms) => write!(f, "{ms}"),
            StragglerDeadline::Auto => f.write_str("auto"),
        }
    }
}

impl serde::Serialize for StragglerDeadline {
    /// A number of milliseconds, or the string `auto`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StragglerDeadline::Ms(ms) => s.serialize_u64(*ms),
            StragglerDeadline::Auto => s.serialize_str("auto"),
        }
    }
}

impl std::fmt::Display for StragglerPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StragglerPolicy::Wait => "wait",
            StragglerPolicy::Skip => "skip",
        })
    }
}

impl std::fmt::Display for Init {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Init::Same => "same",
            Init::Independent => "independent",
        })
    }
}

/// Where a peer trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The CPU (Burn `flex` backend).
    Cpu,
    /// CUDA device N (needs the `cuda` feature).
    Cuda(usize),
    /// The CPU through libtorch, PyTorch's C++ library (Burn `tch` backend; needs the
    /// `libtorch` feature and a libtorch at build and run time).
    LibTorch,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            "libtorch" => Ok(DeviceSpec::LibTorch),
            other => match other.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(i)) => Ok(DeviceSpec::Cuda(i)),
                _ => Err(format!(
                    "unknown device {other:?}: expected cpu, cuda, cuda:N or libtorch"
                )),
            },
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceSpec::LibTorch => f.write_str("libtorch"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_rates_and_latencies_parse_with_units() {
        let rate = |s: &str| s.parse::<LinkRate>().map(|r| r.0);
        assert_eq!(rate("1Gbit"), Ok(1.25e8));
        assert_eq!(rate("100Mbit"), Ok(1.25e7));
        assert_eq!(rate("10 gbit"), Ok(1.25e9));
        assert_eq!(rate("2.5Kbit/s"), Ok(312.5));
        for bad in ["1", "1GB/x", "-1Gbit", "0Mbit", "fastGbit"] {
            assert!(rate(bad).is_err(), "{bad}");
        }
        let lat = |s: &str| s.parse::<LinkLatency>().map(|l| l.0);
        assert_eq!(lat("2ms"), Ok(std::time::Duration::from_millis(2)));
        assert_eq!(lat("500us"), Ok(std::time::Duration::from_micros(500)));
        assert_eq!(lat("0.1s"), Ok(std::time::Duration::from_millis(100)));
        assert_eq!(lat("0s"), Ok(std::time::Duration::ZERO));
        for bad in ["2", "-1ms", "61s", "xms"] {
            assert!(lat(bad).is_err(), "{bad}");
        }
        // What a run config writes (the value's text) parses back to the same value.
        let r: LinkRate = "1Gbit".parse().unwrap();
        assert_eq!(r.to_string().parse::<LinkRate>().unwrap(), r);
        let l: LinkLatency = "2ms".parse().unwrap();
        assert_eq!(l.to_string().parse::<LinkLatency>().unwrap(), l);
    }

    #[test]
    fn devices_parse_and_print_back() {
        for (text, device, printed) in [
            ("cpu", DeviceSpec::Cpu, "cpu"),
            ("cuda", DeviceSpec::Cuda(0), "cuda:0"),
            ("cuda:3", DeviceSpec::Cuda(3), "cuda:3"),
            ("libtorch", DeviceSpec::LibTorch, "libtorch"),
        ] {
            assert_eq!(text.parse::<DeviceSpec>(), Ok(device), "{text}");
            assert_eq!(device.to_string(), printed);
            assert_eq!(printed.parse::<DeviceSpec>(), Ok(device), "{printed}");
        }
        for bad in ["gpu", "cuda:", "cuda:x", "libtorch:0", ""] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(
                e.contains("expected cpu, cuda, cuda:N or libtorch"),
                "{bad}: {e}"
            );
        }
    }
}
