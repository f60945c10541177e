//! `murmur simulate`: n virtual peers of any algorithm in one process, on a simulated
//! network and clock ([`murmur_gossip::NetSim`]), deterministic for a seed.
//!
//! Two modes:
//! * **training** (default): every peer trains its own Burn model on its shard (of MNIST,
//!   or of the synthetic data of resnet20 and transformer), the same state machines as
//!   `murmur peer` mix the parameters, and the run writes the same files as a networked run
//!   (`epochs.jsonl`, `epochs.csv`, `peers/peer-<r>.jsonl`, `summary.json`, `summary.csv`),
//!   with `wall_seconds` in simulated time. The virtual peers take turns with one Burn model
//!   whose parameters are swapped in and out, so module state that is not a parameter —
//!   resnet20's BatchNorm running statistics — is shared by all of them, unlike a networked
//!   run where every peer keeps its own;
//! * **consensus** (`--consensus`): no gradients, x_i drawn uniformly from [−1, 1)^d, and
//!   the exact consensus distance Ξ²(t) after every round in `consensus.csv`;
//! * **timing** (`--timing-only`, needs `--compute-ms`): the training run's schedule — the
//!   same rounds, frames and byte counts — with seeded random gradients in place of Burn,
//!   so the simulated time per epoch (`timing.csv`) costs seconds instead of minutes. For
//!   the synchronous algorithms (everything but `--tau`, `ps --ps-mode asp` and SSP's
//!   waiting) the schedule does not depend on the values, so with fixed-size messages
//!   (raw f32, random-k, sign, TernGrad) these times equal the training run's
//!   `wall_seconds`; top-k's varint-coded index gaps make its frame sizes, and so its
//!   times, depend slightly on which coordinates are kept (within 1% in the test). The
//!   experiment drivers use it to price one training run at other bandwidths.
//!
//! The compute time of a forward/backward step is `--compute-ms`, or measured on this
//! machine before the run (the median of a few steps of peer 0's model) and printed, so
//! that a run can be repeated with the same simulated times.

mod consensus;
mod timing;
mod train;

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use murmur_gossip::{Compute, Gossip, NetSim, NetworkModel, Rank};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::config::{DeviceSpec, Init, RunArgs};
use crate::launch::{run_folder, LaunchArgs};
use crate::peer::algo::{self, Host};
use crate::report::collector::{
    epoch_row, evaluate_epoch, summary, write_sample, write_summary, Reported,
};
use crate::report::{self, progress, PeerEpoch, PeerTotals};
use crate::train::data::{partition, Batches, Dataset, RunData};
use crate::train::learner::Learner;
use crate::train::model::{self, Net};

type B = burn::backend::Autodiff<burn::backend::Flex>;
type Dev = <B as burn::tensor::backend::BackendTypes>::Device;

/// A slow peer: `RANK:FACTOR` multiplies its compute time by FACTOR ≥ 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Straggler {
    /// The peer.
    pub rank: Rank,
    /// Compute slowdown factor.
    pub factor: f64,
}

/// Splits `A:B` and parses both halves; `what` and `example` name the option in errors.
fn parse_pair<A: std::str::FromStr, F: std::str::FromStr>(
    s: &str,
    what: &str,
    example: &str,
) -> Result<(A, F), String> {
    let (a, f) = s
        .split_once(':')
        .ok_or_else(|| format!("{what} {s:?}: expected {example}"))?;
    let a = a
        .parse()
        .map_err(|_| format!("{what} {s:?}: {a:?} is not valid (expected {example})"))?;
    let f = f
        .parse()
        .map_err(|_| format!("{what} {s:?}: {f:?} is not a number (expected {example})"))?;
    Ok((a, f))
}

impl std::str::FromStr for Straggler {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (rank, factor): (Rank, f64) = parse_pair(s, "straggler", "RANK:FACTOR, e.g. 3:2.5")?;
        if !(factor.is_finite() && factor >= 1.0) {
            return Err(format!("straggler {s:?}: the factor must be ≥ 1"));
        }
        Ok(Straggler { rank, factor })
    }
}

/// A slow link: `A-B:FACTOR`, the path between peers A and B (both directions) at the NIC
/// bandwidth divided by FACTOR > 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowLink {
    /// One end.
    pub a: Rank,
    /// The other end.
    pub b: Rank,
    /// How many times slower than the NICs.
    pub factor: f64,
}

impl std::str::FromStr for SlowLink {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let example = "A-B:FACTOR, e.g. 3-4:10";
        let (ends, factor): (String, f64) = parse_pair(s, "slow link", example)?;
        let (a, b) = ends
            .split_once('-')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| format!("slow link {s:?}: expected {example}"))?;
        if a == b {
            return Err(format!("slow link {s:?}: the two ends must differ"));
        }
        if !(factor.is_finite() && factor > 1.0) {
            return Err(format!("slow link {s:?}: the factor must be > 1"));
        }
        Ok(SlowLink { a, b, factor })
    }
}

/// Random stragglers: `P:FACTOR`, each peer's round is FACTOR× slower with probability P.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomStragglers {
    /// Probability per peer and round, in [0, 1].
    pub probability: f64,
    /// Compute slowdown factor ≥ 1.
    pub factor: f64,
}

impl std::str::FromStr for RandomStragglers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (probability, factor): (f64, f64) =
            parse_pair(s, "random stragglers", "P:FACTOR, e.g. 0.05:4")?;
        if !((0.0..=1.0).contains(&probability) && factor.is_finite() && factor >= 1.0) {
            return Err(format!(
                "random stragglers {s:?}: need 0 ≤ P ≤ 1 and FACTOR ≥ 1"
            ));
        }
        Ok(RandomStragglers {
            probability,
            factor,
        })
    }
}

/// Starting vectors of `murmur simulate --consensus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConsensusInit {
    /// x_i uniform in [−1, 1)^d, independent across peers and coordinates.
    Uniform,
    /// x_i = √n·u_i·ξ: every coordinate a random multiple ξ_c ∈ [−1, 1) of the slowest mode
    /// u of W (`MixingMatrix::slowest_mode` of the topology crate).
    SlowestMode,
}

/// Options of `murmur simulate` besides the run's.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Simulator")]
pub struct SimArgs {
    /// NIC bandwidth of every peer in Gb/s (e.g. 1 or 10); absent: an ideal network with
    /// no latency and unlimited bandwidth.
    #[arg(long)]
    pub bandwidth_gbps: Option<f64>,
    /// One-way latency of every link in microseconds (default: 50 with --bandwidth-gbps,
    /// else 0).
    #[arg(long)]
    pub latency_us: Option<f64>,
    /// Probability that a frame's transmission is lost; the transport resends it, so a
    /// loss costs time, not data.
    #[arg(long, default_value_t = 0.0)]
    pub drop: f64,
    /// A slow peer, RANK:FACTOR (its compute time × FACTOR); repeat for several.
    #[arg(long = "straggler")]
    pub stragglers: Vec<Straggler>,
    /// Random stragglers, P:FACTOR: each peer's round is FACTOR× slower with probability P.
    #[arg(long)]
    pub random_stragglers: Option<RandomStragglers>,
    /// A slow link, A-B:FACTOR: the path between peers A and B (both ways) runs FACTOR
    /// times slower than the NICs (needs --bandwidth-gbps); repeat for several. choco-auto
    /// measures it and compresses that link.
    #[arg(long = "slow-link", value_name = "A-B:FACTOR")]
    pub slow_links: Vec<SlowLink>,
    /// A Byzantine peer for robustness experiments, RANK:ATTACK: its gossip messages carry
    /// signflip (−x), noise[:SIGMA] (x + N(0, σ²), σ = 1), alie[:Z] (mean − z·std of the
    /// models it heard, z = 1) or constant[:C]; repeat for several. Accuracy, loss and Ξ²
    /// are then reported over the honest peers only. Training runs only.
    #[arg(long = "byzantine", value_name = "RANK:ATTACK")]
    pub byzantine: Vec<murmur_gossip::ByzantineSpec>,
    /// Simulated compute time of one forward/backward step in milliseconds; default:
    /// measured on this machine before the run (printed, so a run can be repeated).
    #[arg(long)]
    pub compute_ms: Option<f64>,
    /// Average consensus instead of training: x_i uniform in [−1, 1)^d, no gradients,
    /// Ξ²(t) after every round written to consensus.csv.
    #[arg(long, conflicts_with = "timing_only")]
    pub consensus: bool,
    /// The training run's schedule and simulated times only (timing.csv): random
    /// gradients instead of a model, exact for the synchronous algorithms; needs
    /// --compute-ms.
    #[arg(long, requires = "compute_ms")]
    pub timing_only: bool,
    /// Starting vectors of the consensus mode: `uniform` (x_i uniform in [−1, 1)^d, every
    /// mode of W excited) or `slowest-mode` (x_i = u_i·ξ with u the slowest mode of W
    /// and ξ uniform in [−1, 1)^d: exact gossip then decays exactly as |λ₂|^(2t)).
    #[arg(long, value_enum, default_value = "uniform")]
    pub consensus_init: ConsensusInit,
    /// Rounds of the consensus mode.
    #[arg(long, default_value_t = 100)]
    pub rounds: u64,
    /// d of the consensus mode (default: the model's number of parameters).
    #[arg(long)]
    pub dim: Option<usize>,
    /// Where the run folder goes.
    #[command(flatten)]
    pub folder: LaunchArgs,
}

impl SimArgs {
    /// The network model these options describe, seeded with `seed`.
    pub fn network_model(&self, n: usize, seed: u64) -> anyhow::Result<NetworkModel> {
        let mut m = match self.bandwidth_gbps {
            Some(g) => {
                if !(g.is_finite() && g > 0.0) {
                    bail!("--bandwidth-gbps must be a positive number, got {g}");
                }
                NetworkModel::gbps(g)
            }
            None => NetworkModel::ideal(),
        };
        if let Some(us) = self.latency_us {
            if !(us.is_finite() && us >= 0.0) {
                bail!("--latency-us must be ≥ 0, got {us}");
            }
            m = m.with_latency(us * 1e-6);
        }
        if !(0.0..1.0).contains(&self.drop) {
            bail!("--drop must be in [0, 1), got {}", self.drop);
        }
        m = m.with_drop(self.drop).with_seed(seed);
        for s in &self.stragglers {
            if s.rank >= n {
                bail!(
                    "--straggler {}:{}: no peer {} among {n}",
                    s.rank,
                    s.factor,
                    s.rank
                );
            }
            m = m.with_straggler(s.rank, s.factor);
        }
        if let Some(r) = self.random_stragglers {
            m = m.with_random_stragglers(r.probability, r.factor);
        }
        for l in &self.slow_links {
            let Some(g) = self.bandwidth_gbps else {
                bail!(
                    "--slow-link {}-{}: give the NICs' bandwidth with --bandwidth-gbps",
                    l.a,
                    l.b
                );
            };
            if l.a >= n || l.b >= n {
                bail!("--slow-link {}-{}: no such peer among {n}", l.a, l.b);
            }
            let rate = g * 1e9 / 8.0 / l.factor;
            m = m
                .with_link_bandwidth(l.a, l.b, rate)
                .with_link_bandwidth(l.b, l.a, rate);
        }
        m.validate(n).map_err(|e| anyhow!("network model: {e}"))?;
        Ok(m)
    }

    /// The network in words, for the header line.
    fn describe(&self, m: &NetworkModel) -> String {
        let mut s = match self.bandwidth_gbps {
            Some(g) => format!("{g} Gb/s, {:.0} µs latency", m.latency_secs * 1e6),
            None => "ideal network".to_string(),
        };
        if self.drop > 0.0 {
            s += &format!(", {}% loss", 100.0 * self.drop);
        }
        for st in &self.stragglers {
            s += &format!(", peer {} ×{}", st.rank, st.factor);
        }
        if let Some(r) = self.random_stragglers {
            s += &format!(", random stragglers p={} ×{}", r.probability, r.factor);
        }
        for l in &self.slow_links {
            s += &format!(", link {}-{} ×{} slower", l.a, l.b, l.factor);
        }
        s
    }
}

/// Runs `murmur simulate`.
pub fn run(args: &RunArgs, sim: &SimArgs) -> anyhow::Result<()> {
    args.validate()?;
    if args.net.link_bandwidth.is_some() || args.net.link_latency.is_some() {
        bail!(
            "murmur simulate models the network itself: use --bandwidth-gbps and --latency-us \
             instead of --link-bandwidth and --link-latency"
        );
    }
    if args.inject_bad_frames.is_some() {
        bail!("--inject-bad-frames tests the data plane of `murmur launch`/`peer`; the simulator has none");
    }
    if args.train.device != DeviceSpec::Cpu {
        bail!("murmur simulate trains every virtual peer on the CPU; leave out --device");
    }
    for w in args.warnings() {
        eprintln!("murmur: warning: {w}");
    }
    let topo = args.topology()?;
    let net_model = sim.network_model(args.peers, args.train.seed)?;
    check_byzantine(args, sim)?;
    let dir = run_folder(args, &sim.folder, "sim-")?;
    let setup = Setup {
        args,
        sim,
        topo: &topo,
        net_model: &net_model,
        dir: &dir,
    };
    if sim.consensus {
        consensus::run(&setup)?;
    } else if sim.timing_only {
        timing::run(&setup)?;
    } else {
        train::run(&setup)?;
    }
    report::plots::after_run(&dir);
    println!("run folder: {}", dir.display());
    Ok(())
}

/// Whether the run is gradient tracking (`gossip/src/algorithms/gradient_tracking.rs`).
fn is_gradient_tracking(args: &RunArgs) -> bool {
    use murmur_gossip::Algorithm;
    args.gossip.algorithm.name()
        == murmur_gossip::algorithms::gradient_tracking::GRADIENT_TRACKING.name()
}

/// Whether the run is gradient tracking without a compressor: its messages are the plain
/// stacked vectors, not CHOCO's increments.
pub(super) fn is_plain_gradient_tracking(args: &RunArgs) -> bool {
    is_gradient_tracking(args) && args.compressor() == murmur_compress::CompressorSpec::Identity
}

/// Refuses `--byzantine` outside training runs, for a rank that is not there, twice for a
/// rank, for every peer, or with compressed gradient tracking (whose CHOCO messages carry
/// the stacked 2d values, which the attacks do not forge).
fn check_byzantine(args: &RunArgs, sim: &SimArgs) -> anyhow::Result<()> {
    if sim.byzantine.is_empty() {
        return Ok(());
    }
    if sim.consensus || sim.timing_only {
        bail!("--byzantine attacks a training run; leave out --consensus and --timing-only");
    }
    if is_gradient_tracking(args) && !is_plain_gradient_tracking(args) {
        bail!(
            "--byzantine with compressed gradient tracking: its messages carry x and the \
             tracker stacked (2d values), which the attacks do not forge; leave out --compressor"
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for b in &sim.byzantine {
        if b.rank >= args.peers {
            bail!("--byzantine {b}: no peer {} among {}", b.rank, args.peers);
        }
        if !seen.insert(b.rank) {
            bail!("--byzantine names peer {} twice", b.rank);
        }
    }
    if seen.len() == args.peers {
        bail!("--byzantine makes every peer Byzantine; leave at least one honest peer");
    }
    Ok(())
}

/// What every mode of the simulator runs with: the options, the topology, the network
/// model and the run folder.
struct Setup<'a> {
    args: &'a RunArgs,
    sim: &'a SimArgs,
    topo: &'a murmur_topology::Topology,
    net_model: &'a NetworkModel,
    dir: &'a Path,
}

/// Largest frame payload accepted for d parameters: as `murmur peer`.
fn max_payload(d: usize) -> u32 {
    u32::try_from(8 * d + (1 << 20)).unwrap_or(u32::MAX)
}

/// `--compute-ms` in seconds, if given.
///
/// # Errors
/// A negative or non-finite value.
fn fixed_compute_secs(sim: &SimArgs) -> anyhow::Result<Option<f64>> {
    match sim.compute_ms {
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some(ms * 1e-3)),
        Some(ms) => bail!("--compute-ms must be ≥ 0, got {ms}"),
        None => Ok(None),
    }
}

/// The simulator of a training or timing run: no per-round Ξ², overlap as `args` says.
fn training_netsim(
    args: &RunArgs,
    peers: Vec<Box<dyn Gossip>>,
    net_model: &NetworkModel,
) -> anyhow::Result<NetSim> {
    let mut sim_net = NetSim::new(peers, net_model.clone())?;
    sim_net.set_track_consensus(false);
    sim_net.set_overlap(!args.gossip.no_overlap);
    Ok(sim_net)
}

/// The header line of a training (`what` = "") or timing run.
#[allow(clippy::too_many_arguments)]
fn print_header(
    what: &str,
    args: &RunArgs,
    sim: &SimArgs,
    topo: &murmur_topology::Topology,
    net_model: &NetworkModel,
    d: usize,
    rounds_per_epoch: u64,
    compute_secs: f64,
    dir: &Path,
) {
    eprintln!(
        "murmur simulate: {what}{}, {} with {} ({}), {} d = {d}, {} of {rounds_per_epoch} rounds; {}; compute {:.3} ms per step{}; run folder {}",
        crate::config::count(args.peers, "peer"),
        args.algorithm_name(),
        args.compressor_label(),
        args.topology_label(topo),
        args.train.model.with_data(args.train.data.as_deref()),
        crate::config::count(args.train.epochs, "epoch"),
        sim.describe(net_model),
        compute_secs * 1e3,
        if sim.compute_ms.is_none() { " (measured here; pass --compute-ms to repeat)" } else { "" },
        dir.display()
    );
}

/// Rounds per epoch: `--rounds-per-epoch`, else one pass over `train_len` samples.
fn rounds_per_epoch(args: &RunArgs, train_len: usize) -> u64 {
    args.train
        .rounds_per_epoch
        .unwrap_or_else(|| (train_len as u64).div_ceil((args.peers * args.train.batch_size) as u64))
}
