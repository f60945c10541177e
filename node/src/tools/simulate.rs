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

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use murmur_gossip::{Compute, Gossip, NetSim, NetworkModel, Rank};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::config::{DeviceSpec, Init, RunArgs};
use crate::launch::{run_folder, LaunchArgs};
use crate::peer::algo;
use crate::report::collector::{epoch_row, evaluate_epoch, summary, write_summary, Reported};
use crate::report::{self, progress, PeerEpoch};
use crate::train::data::{partition, Batches, Dataset, RunData};
use crate::train::model::{self, Net};
use crate::train::optim::{HeavyBall, Optimizer};

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
    /// u of W ([`murmur_topology::MixingMatrix::slowest_mode`]).
    SlowestMode,
}

/// Options of `murmur simulate` besides the run's.
#[derive(Debug, Clone, Args)]
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
        s
    }
}

/// Runs `murmur simulate`.
pub fn run(args: &RunArgs, sim: &SimArgs) -> anyhow::Result<()> {
    args.validate()?;
    if args.link_bandwidth.is_some() || args.link_latency.is_some() {
        bail!(
            "murmur simulate models the network itself: use --bandwidth-gbps and --latency-us \
             instead of --link-bandwidth and --link-latency"
        );
    }
    if args.inject_bad_frames.is_some() {
        bail!("--inject-bad-frames tests the data plane of `murmur launch`/`peer`; the simulator has none");
    }
    if args.device != DeviceSpec::Cpu {
        bail!("murmur simulate trains every virtual peer on the CPU; leave out --device");
    }
    for w in args.warnings() {
        eprintln!("murmur: warning: {w}");
    }
    let topo = args.topology()?;
    let net_model = sim.network_model(args.peers, args.seed)?;
    let dir = run_folder(args, &sim.folder, "sim-")?;
    if sim.consensus {
        consensus(args, sim, &topo, &net_model, &dir)
    } else if sim.timing_only {
        timing(args, sim, &topo, &net_model, &dir)
    } else {
        train(args, sim, &topo, &net_model, &dir)
    }
}

/// Largest frame payload accepted for d parameters: as `murmur peer`.
fn max_payload(d: usize) -> u32 {
    u32::try_from(8 * d + (1 << 20)).unwrap_or(u32::MAX)
}

/// One row of `consensus.csv`.
#[derive(Debug, Serialize)]
struct ConsensusRow {
    round: u64,
    /// Ξ²(t) = (1/n) Σ‖x_i − x̄‖².
    consensus_distance: f64,
    /// Ξ²(t) / Ξ²(0).
    relative: f64,
    /// Mean over peers of the bytes sent up to this round.
    bytes_sent_per_peer: f64,
    /// Simulated time when the last peer finished this round, seconds.
    seconds: f64,
}

fn consensus(
    args: &RunArgs,
    sim: &SimArgs,
    topo: &murmur_topology::Topology,
    net_model: &NetworkModel,
    dir: &Path,
) -> anyhow::Result<()> {
    let n = args.peers;
    let d = match sim.dim {
        Some(0) => bail!("--dim must be at least 1"),
        Some(d) => d,
        None => {
            let device = Default::default();
            let mut x = Vec::new();
            model::flatten(&Net::<B>::new(args.model, &device), &mut x);
            x.len()
        }
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    let x0s: Vec<Vec<f32>> = match sim.consensus_init {
        ConsensusInit::Uniform => (0..n)
            .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect(),
        ConsensusInit::SlowestMode => {
            let u = topo.w.slowest_mode().ok_or_else(|| {
                anyhow!(
                    "W of {} has no slowest mode (n < 2 or the eigen-solver failed)",
                    topo.name
                )
            })?;
            let xi: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0f64..1.0)).collect();
            let scale = (n as f64).sqrt();
            u.iter()
                .map(|&ui| xi.iter().map(|&x| (scale * ui * x) as f32).collect())
                .collect()
        }
    };
    let mut peers: Vec<Box<dyn Gossip>> = Vec::with_capacity(n);
    for (rank, x0) in x0s.into_iter().enumerate() {
        peers.push(algo::build(args, topo, rank, x0, &[d], max_payload(d), 1)?);
    }
    let mut sim_net = NetSim::new(peers, net_model.clone())?;
    let xi0 = sim_net.consensus_distance();
    eprintln!(
        "murmur simulate: {n} peers, {} with {} on {}, consensus of d = {d} for {} rounds, {}; run folder {}",
        args.algorithm_name(),
        args.compressor(),
        args.topology_label(topo),
        sim.rounds,
        sim.describe(net_model),
        dir.display()
    );
    let bar = progress::bar(sim.rounds, "round");
    let chunk = (sim.rounds / 100).max(1);
    let mut done = 0;
    while done < sim.rounds {
        let r = chunk.min(sim.rounds - done);
        sim_net.run_consensus(r)?;
        done += r;
        bar.set_position(done);
        if let Some(p) = sim_net.consensus().last() {
            bar.set_message(format!("Ξ²/Ξ²(0) {:.3e}", p.xi2 / xi0));
        }
    }
    bar.finish_and_clear();
    let mut rows = vec![ConsensusRow {
        round: 0,
        consensus_distance: xi0,
        relative: 1.0,
        bytes_sent_per_peer: 0.0,
        seconds: 0.0,
    }];
    let mut sent = vec![0u64; n];
    for p in sim_net.consensus() {
        for (rank, s) in sent.iter_mut().enumerate() {
            if let Some(h) = sim_net.history(rank).get(p.round as usize) {
                *s += h.bytes_sent;
            }
        }
        rows.push(ConsensusRow {
            round: p.round + 1,
            consensus_distance: p.xi2,
            relative: if xi0 > 0.0 { p.xi2 / xi0 } else { 0.0 },
            bytes_sent_per_peer: sent.iter().sum::<u64>() as f64 / n as f64,
            seconds: p.at_secs,
        });
    }
    report::write_atomic(
        &dir.join("consensus.csv"),
        report::to_csv(&rows)?.as_bytes(),
    )?;
    let last = rows
        .last()
        .ok_or_else(|| anyhow!("no round was simulated"))?;
    println!(
        "{} on {} (n = {n}, d = {d}): Ξ²/Ξ²(0) = {:.3e} after {} rounds, {:.1} MB sent per peer, {:.4} s simulated",
        args.algorithm_name(),
        args.topology_label(topo),
        last.relative,
        last.round,
        last.bytes_sent_per_peer / 1e6,
        last.seconds
    );
    println!("run folder: {}", dir.display());
    Ok(())
}

/// One row of `timing.csv`: the simulated schedule at the end of an epoch.
#[derive(Debug, Serialize)]
struct TimingRow {
    epoch: usize,
    /// Rounds completed by every peer.
    rounds: u64,
    /// Simulated time when the last peer finished the epoch, seconds.
    wall_seconds: f64,
    /// Mean over peers of the bytes sent so far.
    bytes_sent_per_peer: f64,
    /// Mean over peers of the simulated compute, communication and waiting time so far,
    /// seconds.
    compute_seconds: f64,
    communicate_seconds: f64,
    wait_seconds: f64,
}

/// `--timing-only`: the schedule of a training run with random gradients (module doc).
fn timing(
    args: &RunArgs,
    sim: &SimArgs,
    topo: &murmur_topology::Topology,
    net_model: &NetworkModel,
    dir: &Path,
) -> anyhow::Result<()> {
    let n = args.peers;
    let compute_secs = fixed_compute_secs(sim)?
        .ok_or_else(|| anyhow!("--timing-only needs --compute-ms (there is no model to time)"))?;
    let rounds_per_epoch = match args.rounds_per_epoch {
        Some(r) => r,
        None => rounds_per_epoch(
            args,
            RunData::load(args.model, args.data.as_deref(), args.seed)?
                .train
                .len(),
        ),
    };
    let device: Dev = Default::default();
    let net = Net::<B>::new(args.model, &device);
    let lengths = model::tensor_lengths(&net);
    let mut x0 = Vec::new();
    model::flatten(&net, &mut x0);
    let d = x0.len();
    let mut peers: Vec<Box<dyn Gossip>> = Vec::with_capacity(n);
    for rank in 0..n {
        peers.push(algo::build(
            args,
            topo,
            rank,
            x0.clone(),
            &lengths,
            max_payload(d),
            rounds_per_epoch,
        )?);
    }
    let mut sim_net = training_netsim(args, peers, net_model)?;
    print_header(
        "timing only, ",
        args,
        sim,
        topo,
        net_model,
        d,
        rounds_per_epoch,
        compute_secs,
        dir,
    );
    // Gradients of the size of the parameters, so that compressors with value-dependent
    // output see vectors like a training run's: windows at random offsets of one seeded
    // noise buffer (drawing d fresh numbers per step would cost more than the mixing).
    let mut rng = StdRng::seed_from_u64(args.seed);
    let noise: Vec<f32> = (0..2 * d)
        .map(|_| rng.random_range(-1e-2f32..1e-2))
        .collect();
    let bar = progress::bar(args.epochs as u64, "epoch");
    let mut rows = Vec::with_capacity(args.epochs + 1);
    for epoch in 0..=args.epochs {
        if epoch > 0 {
            sim_net.set_epoch(epoch - 1);
            sim_net.run_rounds(rounds_per_epoch, |_, _, x| {
                let at = rng.random_range(0..=noise.len() - x.len());
                Compute {
                    grad: Some(noise[at..at + x.len()].to_vec()),
                    seconds: compute_secs,
                }
            })?;
            bar.inc(1);
        }
        let totals: Vec<_> = (0..n).map(|r| sim_net.totals(r)).collect();
        let mean = |f: &dyn Fn(&murmur_gossip::Totals) -> f64| {
            totals.iter().map(f).sum::<f64>() / n as f64
        };
        rows.push(TimingRow {
            epoch,
            rounds: (0..n)
                .filter_map(|r| sim_net.peer(r).map(|g| g.round()))
                .min()
                .unwrap_or(0),
            wall_seconds: sim_net.now_secs(),
            bytes_sent_per_peer: mean(&|t| t.bytes_sent as f64),
            compute_seconds: mean(&|t| t.compute_secs),
            communicate_seconds: mean(&|t| t.communicate_secs),
            wait_seconds: mean(&|t| t.wait_secs),
        });
    }
    bar.finish_and_clear();
    report::write_atomic(&dir.join("timing.csv"), report::to_csv(&rows)?.as_bytes())?;
    let last = rows
        .last()
        .ok_or_else(|| anyhow!("no epoch was simulated"))?;
    println!(
        "{} on {} (n = {n}, {}): {} epochs = {} rounds in {:.4} s simulated, {:.1} MB sent per peer",
        args.algorithm_name(),
        args.topology_label(topo),
        sim.describe(net_model),
        last.epoch,
        last.rounds,
        last.wall_seconds,
        last.bytes_sent_per_peer / 1e6
    );
    println!("run folder: {}", dir.display());
    Ok(())
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
    sim_net.set_overlap(!args.no_overlap);
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
        "murmur simulate: {what}{}, {} with {} ({}), {} d = {d}, {} epochs of {rounds_per_epoch} rounds; {}; compute {:.3} ms per step{}; run folder {}",
        crate::config::count(args.peers, "peer"),
        args.algorithm_name(),
        args.compressor(),
        args.topology_label(topo),
        args.model.with_data(),
        args.epochs,
        sim.describe(net_model),
        compute_secs * 1e3,
        if sim.compute_ms.is_none() { " (measured here; pass --compute-ms to repeat)" } else { "" },
        dir.display()
    );
}

/// Rounds per epoch: `--rounds-per-epoch`, else one pass over `train_len` samples.
fn rounds_per_epoch(args: &RunArgs, train_len: usize) -> u64 {
    args.rounds_per_epoch
        .unwrap_or_else(|| (train_len as u64).div_ceil((args.peers * args.batch_size) as u64))
}

/// One virtual peer's training state besides its state machine.
struct PeerState {
    shard: Dataset,
    batches: Batches,
    optimizer: HeavyBall,
    loss_sum: f64,
    steps: u64,
}

fn train(
    args: &RunArgs,
    sim: &SimArgs,
    topo: &murmur_topology::Topology,
    net_model: &NetworkModel,
    dir: &Path,
) -> anyhow::Result<()> {
    let n = args.peers;
    let device: Dev = Default::default();
    let data = RunData::load(args.model, args.data.as_deref(), args.seed)?;
    let shards = partition(&data.train.labels, n, args.partition, args.seed)?;
    let rounds_per_epoch = rounds_per_epoch(args, data.train.len());

    // Models: as `murmur peer`, x⁰ from the seed (or seed + rank with --init independent).
    let mut x0s = Vec::with_capacity(n);
    let mut lengths = Vec::new();
    for rank in 0..n {
        if rank == 0 || args.init == Init::Independent {
            let seed = match args.init {
                Init::Same => args.seed,
                Init::Independent => args.seed.wrapping_add(rank as u64),
            };
            <B as burn::tensor::backend::Backend>::seed(&device, seed);
            let net = Net::<B>::new(args.model, &device);
            let mut x = Vec::new();
            model::flatten(&net, &mut x);
            lengths = model::tensor_lengths(&net);
            x0s.push(x);
        } else {
            x0s.push(x0s[0].clone());
        }
    }
    let d = x0s[0].len();
    let mut peers: Vec<Box<dyn Gossip>> = Vec::with_capacity(n);
    let mut states = Vec::with_capacity(n);
    for (rank, x0) in x0s.into_iter().enumerate() {
        peers.push(algo::build(
            args,
            topo,
            rank,
            x0,
            &lengths,
            max_payload(d),
            rounds_per_epoch,
        )?);
        let shard = data.train.subset(&shards[rank]);
        states.push(PeerState {
            batches: Batches::new(shard.len(), args.seed.wrapping_add(1 + rank as u64)),
            shard,
            optimizer: HeavyBall::new(args.momentum, d),
            loss_sum: 0.0,
            steps: 0,
        });
    }
    let mut net = Some(Net::<B>::new(args.model, &device));
    let compute_secs = match fixed_compute_secs(sim)? {
        Some(secs) => secs,
        None => measure_step(
            net.take().ok_or_else(|| anyhow!("no model"))?,
            &states[0],
            args.batch_size,
            &device,
        )
        .map(|(secs, model)| {
            net = Some(model);
            secs
        })?,
    };
    let mut sim_net = training_netsim(args, peers, net_model)?;
    print_header(
        "",
        args,
        sim,
        topo,
        net_model,
        d,
        rounds_per_epoch,
        compute_secs,
        dir,
    );
    std::fs::create_dir_all(dir.join("peers"))?;
    for stale in ["epochs.jsonl", "epochs.csv"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    let bar = progress::bar(args.epochs as u64 * rounds_per_epoch, "round");
    let print = |line: String| progress::print(&bar, line);
    print(report::table_header());
    let mut rows = Vec::new();
    let started = Instant::now();
    for epoch in 0..=args.epochs {
        if epoch > 0 {
            sim_net.set_epoch(epoch - 1);
            let mut failure: Option<anyhow::Error> = None;
            let mut calls = 0u64;
            let result = sim_net.run_rounds(rounds_per_epoch, |rank, round, x| {
                calls += 1;
                if calls.is_multiple_of(n as u64) {
                    bar.inc(1);
                }
                let grad = match step(&mut net, &mut states[rank], x, args, &device) {
                    Ok(grad) => grad,
                    Err(e) => {
                        failure.get_or_insert(e.context(format!("peer {rank}, round {round}")));
                        // A non-finite gradient stops the simulator at once.
                        vec![f32::NAN; x.len()]
                    }
                };
                Compute {
                    grad: Some(grad),
                    seconds: compute_secs,
                }
            });
            if let Some(e) = failure {
                bar.abandon();
                return Err(e);
            }
            result?;
        }
        // Every peer's model on the test split.
        let mut reports: Vec<Reported> = Vec::with_capacity(n);
        for (rank, st) in states.iter_mut().enumerate() {
            let gossip = sim_net
                .peer(rank)
                .ok_or_else(|| anyhow!("no peer {rank}"))?;
            let x = gossip.params().to_vec();
            let model_r = model::unflatten(net.take().ok_or_else(|| anyhow!("no model"))?, &x)?;
            let (test_accuracy, test_loss, train_loss) = evaluate_epoch(
                &model::inference_copy(&model_r),
                &data.test,
                &st.shard,
                (epoch > 0).then(|| st.loss_sum / st.steps.max(1) as f64),
                &device,
            )?;
            net = Some(model_r);
            st.loss_sum = 0.0;
            st.steps = 0;
            let totals = sim_net.totals(rank);
            let stats = gossip.stats();
            let report = PeerEpoch {
                peer: rank,
                epoch,
                phase: args.algorithm_at(epoch).to_string(),
                rounds: gossip.round(),
                train_loss,
                test_accuracy,
                test_loss,
                bytes_sent: stats.bytes_sent,
                bytes_received: stats.bytes_received,
                compute_seconds: totals.compute_secs,
                communicate_seconds: totals.communicate_secs,
                wait_seconds: totals.wait_secs,
                refused_frames: 0,
                skipped: stats.skipped,
                wall_seconds: sim_net.now_secs(),
            };
            report::append_json_line(
                &dir.join("peers").join(format!("peer-{rank}.jsonl")),
                &report,
            )?;
            reports.push((report, x));
        }
        let row = epoch_row(epoch, &reports, &data.test, args.model, sim_net.now_secs())?;
        print(report::format_row(&row));
        bar.set_message(format!(
            "x̄ acc {:.2}%, {:.0} s real",
            100.0 * row.avg_model_test_accuracy,
            started.elapsed().as_secs_f64()
        ));
        report::append_json_line(&dir.join("epochs.jsonl"), &row)?;
        rows.push(row);
        report::write_atomic(&dir.join("epochs.csv"), report::to_csv(&rows)?.as_bytes())?;
    }
    bar.finish_and_clear();
    let last = rows
        .last()
        .ok_or_else(|| anyhow!("no epoch was recorded"))?;
    write_summary(dir, &summary(args, topo, d, last))
}

/// One SGD step of a virtual peer at parameters `x: [d]`: its next mini-batch, the loss
/// and gradient, and the optimizer's direction (heavy ball: v ← μ v + g), which is returned.
fn step(
    net: &mut Option<Net<B>>,
    st: &mut PeerState,
    x: &[f32],
    args: &RunArgs,
    device: &Dev,
) -> anyhow::Result<Vec<f32>> {
    let mut images = Vec::with_capacity(args.batch_size * st.shard.features());
    let mut labels = Vec::with_capacity(args.batch_size);
    st.batches
        .next_batch(&st.shard, args.batch_size, &mut images, &mut labels);
    let m = model::unflatten(net.take().ok_or_else(|| anyhow!("no model"))?, x)?;
    let input = m.input();
    let mut grad = Vec::with_capacity(x.len());
    // The model goes back into `net` before an error is returned.
    let loss = model::batch_tensors::<B>(input, images, &labels, device)
        .and_then(|batch| model::loss_and_grad(&m, batch, &mut grad));
    *net = Some(m);
    let loss = loss?;
    if !loss.is_finite() {
        bail!("training diverged: loss is {loss} (try a smaller --lr)");
    }
    st.loss_sum += loss as f64;
    st.steps += 1;
    Ok(st.optimizer.step(&grad).to_vec())
}

/// Median wall time of a forward/backward step of `net` on a batch of `st`'s shard, in
/// seconds (one warm-up step, then five timed).
fn measure_step(
    net: Net<B>,
    st: &PeerState,
    batch: usize,
    device: &Dev,
) -> anyhow::Result<(f64, Net<B>)> {
    let mut batches = Batches::new(st.shard.len(), 0);
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    let mut grad = Vec::new();
    let mut times = Vec::new();
    let input = net.input();
    for i in 0..6 {
        batches.next_batch(&st.shard, batch, &mut images, &mut labels);
        let t = Instant::now();
        let batch = model::batch_tensors::<B>(input, images.clone(), &labels, device)?;
        let loss = model::loss_and_grad(&net, batch, &mut grad)?;
        if !loss.is_finite() {
            bail!("the starting model gives a non-finite loss");
        }
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times
        .get(times.len() / 2)
        .copied()
        .context("no timed step")?;
    Ok((median, net))
}
