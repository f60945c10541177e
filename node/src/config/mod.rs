//! Command-line configuration shared by `murmur launch` and `murmur peer`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use murmur_compress::CompressorSpec;
use murmur_topology::Topology;
use serde::Serialize;

/// The time-varying one-peer exponential schedule's name for `--topology`.
pub use murmur_topology::ONE_PEER_EXPONENTIAL;

use crate::plane::striping::TcpStreams;
use crate::plane::{TransportChoice, Wire};
use crate::train::data::Partition;
use crate::train::inner_optimizer::{
    AdamWConfig, Optimizer, OptimizerKind, Schedule, ScheduleKind,
};
use crate::train::model::ModelKind;

mod file;
pub mod keys;
mod values;

pub use file::{count, expand_config_args, load_topology};
use values::algorithm_parser;
pub use values::{
    DeviceSpec, Init, LinkLatency, LinkRate, PhaseSchedule, StragglerDeadline, StragglerPolicy,
};

pub use murmur_gossip::AlgorithmSpec;
use murmur_gossip::{AlgorithmOptions, Compresses, Pattern, PsMode, Resumable};

/// The run: what every peer of it must agree on, by concern (training, gossip, network)
/// and the run-wide options. Serialized (`RunArgs::to_toml`) it is a flat run config whose
/// keys are the long option names, which `--config` reads back: `launch` hands its peers
/// the run this way.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Run")]
pub struct RunArgs {
    /// Number of peers n.
    #[arg(long, default_value_t = 8)]
    pub peers: usize,
    /// Every peer writes a checkpoint (parameters, momentum, round, membership) to
    /// `<run>/checkpoints/peer-<rank>.ckpt` after every this many rounds, atomically;
    /// 0: never. A restarted peer takes it up with `murmur peer --resume`.
    #[arg(long, default_value_t = 0, value_name = "ROUNDS")]
    pub checkpoint_every: u64,
    /// Fault injection for tests: peer RANK sleeps MS milliseconds before each round's
    /// gradient (a straggler), given as `RANK:MS`.
    #[arg(long, value_name = "RANK:MS", value_parser = parse_slow_peer)]
    #[serde(
        serialize_with = "slow_peer_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub slow_peer: Option<(usize, u64)>,
    /// Fault injection for tests: peer RANK also sends five malformed frames to every
    /// destination each round (garbage bytes, a truncated frame, an oversized declared
    /// length, NaN parameters, a round far out of the window). Every receiver must refuse
    /// them, count them (`refused_frames`) and keep training.
    #[arg(long, value_name = "RANK")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inject_bad_frames: Option<usize>,
    /// A TOML run config whose keys are these options' long names (e.g.
    /// `experiments/runs/choco-topk.toml`); options on the command line override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Training: model, data, optimizer, schedule.
    #[command(flatten)]
    #[serde(flatten)]
    pub train: TrainArgs,
    /// Gossip: algorithm, topology, compression, stragglers.
    #[command(flatten)]
    #[serde(flatten)]
    pub gossip: GossipArgs,
    /// Network: timeouts, admission, link emulation.
    #[command(flatten)]
    #[serde(flatten)]
    pub net: NetArgs,
}

/// Training: the model, its data and their split, the local optimizer, the schedule.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Training")]
pub struct TrainArgs {
    /// Model to train: the image models mlp, cnn and resnet20 on the images of --data DIR
    /// (MNIST's IDX files, CIFAR-10's binary files, or an image folder: train/ and test/,
    /// one subfolder of PNG or JPEG files per class), sized for them; without --data, mlp
    /// and cnn on the embedded MNIST digits, resnet20 on synthetic 3×32×32 images. The
    /// images an image model takes: input=CxHxW (an image folder is resized to it), e.g.
    /// resnet20:input=3x32x32. The MLP's hidden width: mlp:hidden=N (default 256; d =
    /// 795·N + 10 on MNIST, so mlp:hidden=31447 sends 100 MB messages). transformer
    /// (language model) on the King James Bible or --data FILE (bytes, or the tokens of a
    /// token file), with sizes transformer:layers=N,d_model=N,heads=N,context=N,d_ff=N,vocab=N
    /// (any of them; defaults 2, 128, 4, 64, 512, 256).
    #[arg(long, default_value_t = ModelKind::MLP)]
    #[serde(serialize_with = "as_text")]
    pub model: ModelKind,
    /// Epochs: passes over the training set by the network as a whole.
    #[arg(long, default_value_t = 20)]
    pub epochs: usize,
    /// Mini-batch size per peer per round.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Learning rate η.
    #[arg(long, default_value_t = 0.05)]
    #[serde(serialize_with = "f32_short")]
    pub lr: f32,
    /// Heavy-ball momentum μ of each peer's local update (0 for plain D-PSGD).
    #[arg(long, default_value_t = 0.9)]
    #[serde(serialize_with = "f32_short")]
    pub momentum: f32,
    /// Local optimizer: sgd (heavy-ball momentum `--momentum`) or adamw (`--weight-decay`,
    /// `--adam-beta2`; take a smaller `--lr`, around 1e-3).
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    #[serde(serialize_with = "as_text")]
    pub optimizer: OptimizerKind,
    /// AdamW's decoupled weight decay λ.
    #[arg(long, default_value_t = 0.01)]
    #[serde(serialize_with = "f32_short")]
    pub weight_decay: f32,
    /// AdamW's second-moment decay β₂ (language models often take 0.95).
    #[arg(long, default_value_t = 0.999)]
    #[serde(serialize_with = "f32_short")]
    pub adam_beta2: f32,
    /// Learning-rate schedule over the run's rounds: constant, or cosine decay to η/10.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Constant)]
    #[serde(serialize_with = "as_text")]
    pub lr_schedule: ScheduleKind,
    /// Rounds of linear learning-rate warm-up from η/W to η (0: none).
    #[arg(long, default_value_t = 0, value_name = "W")]
    pub warmup_rounds: u64,
    /// The language model: bytes of text peer 0's final model writes after the prompt
    /// "And God said" (temperature 0.8) into `<run>/sample.txt`, printed at the end; 0: none.
    #[arg(long, default_value_t = 300, value_name = "BYTES")]
    pub sample: usize,
    /// Every peer also writes its own final model (its parameters x_i and BatchNorm
    /// statistics) to `<run>/peers/model-<rank>.safetensors`, beside the averaged model
    /// x̄ that peer 0 writes to `<run>/model.safetensors`.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub save_peer_models: bool,
    /// How the training set is split across peers: `iid` or `dirichlet:ALPHA`.
    #[arg(long, default_value = "iid")]
    #[serde(serialize_with = "as_text")]
    pub partition: Partition,
    /// Seed of the data split, the model initialisation and the mini-batch order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Starting parameters: the same x⁰ on every peer, or one per peer.
    #[arg(long, value_enum, default_value_t = Init::Same)]
    #[serde(serialize_with = "as_text")]
    pub init: Init,
    /// Every peer starts from the model in this SafeTensors file (overrides `--init`): a
    /// run's `model.safetensors`, or any file with the tensors of `--model` in PyTorch's
    /// conventions, names and shapes (a tensor missing or of another shape is refused; one
    /// the model has not is ignored with a warning).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// mlp and cnn: a directory with standard IDX MNIST files (gzipped or not); default: the
    /// 8,000/2,000 real digits embedded in the binary. transformer: any byte file (gzipped
    /// or not), 90% to train, 10% held out; default: the King James Bible embedded in the
    /// binary; or a token file (llm.c / modded-nanogpt .bin, u16 GPT-2 tokens; `murmur
    /// tokenize` makes one) with --model transformer:vocab=50257, or a folder of token files
    /// (train/val .bin: nanoGPT's header-less train.bin and val.bin, llm.c's or
    /// modded-nanogpt's shards). resnet20: a directory
    /// with CIFAR-10's binary files (data_batch_1.bin …
    /// data_batch_5.bin, test_batch.bin, or their folder cifar-10-batches-bin); default:
    /// synthetic images.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`), or libtorch
    /// (the CPU through PyTorch's C++ library; a build with `--features libtorch`).
    #[arg(long, default_value = "cpu")]
    #[serde(serialize_with = "as_text")]
    pub device: DeviceSpec,
    /// Rounds per epoch; default: ⌈train samples / (peers · batch)⌉.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds_per_epoch: Option<u64>,
}

/// Gossip: the algorithm, its graph and protocol options, the message compression, the
/// straggler policy.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Gossip")]
pub struct GossipArgs {
    /// Topology: a name (ring, torus, complete, star, hypercube, exponential,
    /// erdos-renyi:p=P[,seed=S], and for sgp the time-varying one-peer-exponential) with
    /// optional `:key=value,...` options (rows, cols, p, seed, weights; e.g.
    /// `torus:rows=2,cols=4`, `ring:weights=max-degree`) or the path of a TOML topology
    /// file. Ignored by allreduce, ps and local-avg.
    #[arg(long, default_value = "ring")]
    pub topology: String,
    /// Decentralized algorithm.
    #[arg(long, default_value = "dpsgd", value_parser = algorithm_parser())]
    #[serde(serialize_with = "as_text")]
    pub algorithm: AlgorithmSpec,
    /// Phase schedule instead of one algorithm: `ALGO:EPOCHS,...,ALGO`, e.g.
    /// `allreduce:2,dpsgd` (all-reduce for the first 2 epochs, then D-PSGD) or
    /// `dpsgd:10,allreduce`. Overrides --algorithm.
    #[arg(long)]
    #[serde(
        serialize_with = "opt_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub phases: Option<PhaseSchedule>,
    /// Compression of the gossip messages:
    /// `identity` (none), `fp16`, `bf16`, `qsgd[:S][,bucket=B]`, `int8[,bucket=B]`, `natural`, `terngrad`,
    /// `sign`, `topk:RATIO[,layerwise]`, `approx-topk:RATIO`, `randk:RATIO[,unscaled]`,
    /// `ef+SPEC`, `dgc:RATIO`, `sparseloco[:RATIO][,chunk=C][,decay=B][,layerwise]` (DiLoCo's
    /// pseudo-gradients, SparseLoCo). Default: `identity` for dpsgd (which mixes the neighbours'
    /// compressed parameters, so use a cast there), `topk:0.01` for choco.
    #[arg(long)]
    #[serde(
        serialize_with = "opt_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub compressor: Option<CompressorSpec>,
    /// CHOCO-SGD's consensus step size γ in (0, 1]; default: 0.5 for the identity and the
    /// casts, else 0.1 (measured on the embedded MNIST; see the guide, Compression).
    #[arg(long)]
    #[serde(
        serialize_with = "opt_f32_short",
        skip_serializing_if = "Option::is_none"
    )]
    pub gamma: Option<f32>,
    /// Local steps per communication round H (local-sgd, local-avg: default 4; diloco,
    /// diloco-gossip: inner steps per outer step, default 50).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_steps: Option<u64>,
    /// DiLoCo's outer optimizer, applied to the averaged pseudo-gradient every H steps:
    /// nesterov (the paper's: --outer-lr 0.7, --outer-momentum 0.9) or sgd (defaults 1 and
    /// 0: plain model averaging).
    #[arg(long, value_name = "nesterov|sgd")]
    #[serde(
        serialize_with = "opt_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub outer_optimizer: Option<murmur_gossip::OuterOptimizer>,
    /// DiLoCo's outer learning rate η_out (default 0.7 for nesterov, 1 for sgd).
    #[arg(long)]
    #[serde(
        serialize_with = "opt_f32_short",
        skip_serializing_if = "Option::is_none"
    )]
    pub outer_lr: Option<f32>,
    /// DiLoCo's outer momentum μ in [0, 1) (default 0.9 for nesterov, 0 for sgd).
    #[arg(long)]
    #[serde(
        serialize_with = "opt_f32_short",
        skip_serializing_if = "Option::is_none"
    )]
    pub outer_momentum: Option<f32>,
    /// Byzantine-robust mixing for dpsgd, choco, local-sgd and diloco-gossip (ClippedGossip, He,
    /// Karimireddy & Jaggi 2022):
    /// each neighbour's difference x_j − x_i is clipped to a radius before mixing: `clip`
    /// (adaptive: the second-largest neighbour distance of the round), `clip:auto:B` (all
    /// but the B farthest) or `clip:TAU` (fixed).
    #[arg(long, value_name = "clip|clip:auto:B|clip:TAU")]
    #[serde(
        serialize_with = "opt_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub robust: Option<murmur_gossip::ClipRule>,
    /// The overlap τ in rounds. SGP: a round may complete with in-peers' messages up to τ
    /// rounds old (default 0: synchronous SGP; ≥ 1: OSGP). streaming-diloco: a fragment's
    /// outer step is applied τ inner steps after its sync began, so its all-reduce runs
    /// behind those steps (default 1; at most local-steps / fragments).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tau: Option<u64>,
    /// Streaming DiLoCo's fragments P: the model is synchronised in P parts at staggered
    /// inner steps (default 4; 1 ≤ P ≤ local-steps).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragments: Option<u64>,
    /// Streaming DiLoCo's merge factor α in [0, 1]: a synchronised fragment becomes
    /// α·local + (1 − α)·global (default 0.5; 0 replaces the local fragment).
    #[arg(long)]
    #[serde(
        serialize_with = "opt_f32_short",
        skip_serializing_if = "Option::is_none"
    )]
    pub merge_alpha: Option<f32>,
    /// D-PSGD: a model of at least two parts is exchanged in parts of this many MB, each
    /// mixed as it arrives and sent on for the next round as soon as it has mixed (default
    /// 4, or 0 under --transport quic; 0 sends whole messages). With the identity
    /// compressor, without the skip straggler policy or --robust.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part_mb: Option<f64>,
    /// The parameter server's synchronisation: bsp, ssp:S (at most S rounds ahead of the
    /// slowest worker) or asp.
    #[arg(long, default_value = "bsp", value_parser = murmur_gossip::registry::parse_ps_mode)]
    #[serde(serialize_with = "ps_mode_text")]
    pub ps_mode: PsMode,
    /// Do not overlap communication with computation: begin each round only after the
    /// gradient is computed (for D-PSGD-like algorithms, which overlap by default).
    #[arg(long)]
    pub no_overlap: bool,
    /// Straggler policy: `wait` for every neighbour (up to the round timeout) or `skip` one
    /// whose frame is later than `--straggler-deadline-ms` for that round.
    #[arg(long, default_value_t = StragglerPolicy::Wait)]
    #[serde(serialize_with = "as_text")]
    pub straggler_policy: StragglerPolicy,
    /// With `--straggler-policy skip`: milliseconds a round waits for a neighbour's frame,
    /// or `auto`: per neighbour, twice the 95th percentile of its last 32 arrival delays
    /// (between 5 ms and 10 s, or half of --round-timeout-secs; 10 s until it has 4), so a
    /// slow but steady link is waited for and a neighbour that stalls is skipped (dpsgd,
    /// local-sgd, choco, diloco-gossip).
    #[arg(long, value_name = "MS|auto")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub straggler_deadline_ms: Option<StragglerDeadline>,
}

/// `--paused-timeout-secs` when not given, unless the round timeout is shorter.
pub const DEFAULT_PAUSED_TIMEOUT_SECS: u64 = 30;

/// Network: timeouts, admission (allow-list, run key) and link emulation.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Network")]
pub struct NetArgs {
    /// Seconds a round may wait for its neighbours before the peer gives up.
    #[arg(long, default_value_t = 60)]
    pub round_timeout_secs: u64,
    /// Seconds of silence after which a data-plane connection counts as lost: how soon a
    /// peer whose host vanished, or whose death no supervisor reports, is noticed. Liveness
    /// is any datagram on the link's QUIC connection; keep-alives go out every fifth of the
    /// timeout (at most every 2 s), sent and answered by the data plane's own threads, so a
    /// peer that computes slowly keeps its links; a paused one (SIGSTOP) or a vanished host
    /// does not. Its neighbours then re-weight and train on without it (D-PSGD, SGP,
    /// CHOCO-SGD, local-SGD gossip) or stop with an error (the other algorithms). Slow rounds
    /// are --round-timeout-secs'. Handshakes have their own bound (15 s, or this if longer).
    /// Raise it when many more peers than cores share a machine: 96 peers on 2 cores went
    /// silent for up to 3.8 s while starting, so 3 s took live peers for departed.
    #[arg(long, default_value_t = 5)]
    pub peer_timeout_secs: u64,
    /// Seconds a silent peer is waited for when its link says it is paused, not dead: on a
    /// link with a TCP connection (between hosts, `--transport tcp`) the kernel tells a
    /// paused or hung process (SIGSTOP, a debugger, a scheduler's suspend), whose host still
    /// acknowledges TCP, from a vanished host, which does not (and from a dead process, whose
    /// kernel closes its sockets at once); on one host, a shared-memory link sees the other
    /// process stopped, running or gone. Such a peer is a straggler, not a departure: its
    /// neighbours warn and wait (or skip it, with `--straggler-policy skip`) up to this long
    /// before it is taken for departed. Default 30, or less to stay below
    /// --round-timeout-secs (a round that waits longer fails); at least --peer-timeout-secs.
    /// Links on QUIC alone (NATs, relays) cannot tell, and use --peer-timeout-secs.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_timeout_secs: Option<u64>,
    /// Only these peers may join (and so reach the data plane): a file of `PeerId`s, one per
    /// line, as `murmur identity KEYFILE` prints them. Checked by peer 0 at join. Default:
    /// any peer with the run's options.
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_peers: Option<PathBuf>,
    /// A secret shared by the run's peers (a file of at least 16 bytes, e.g. `head -c 32
    /// /dev/urandom > run.key`): a joining peer and the bootstrap prove to each other that
    /// they hold it (HMAC over both identities); peers without it are refused. For runs
    /// whose identities are not known in advance (no `--rank`, `--mdns`).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_key: Option<PathBuf>,
    /// Emulated link rate of every outgoing data-plane link, e.g. `1Gbit` or `100Mbit`
    /// (a pacer in the transport; it can only slow links down). Default: unlimited.
    #[arg(long)]
    #[serde(
        serialize_with = "opt_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub link_bandwidth: Option<LinkRate>,
    /// Emulated one-way delay of every data-plane frame, e.g. `2ms`. Default: none.
    #[arg(long)]
    #[serde(
        serialize_with = "opt_as_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub link_latency: Option<LinkLatency>,
    /// Seconds to wait for all peers to join.
    #[arg(long, default_value_t = 60)]
    pub join_timeout_secs: u64,
    /// Transport of the data-plane links: `auto` sends to peers on this host through shared
    /// memory (a ring in /dev/shm; QUIC if it cannot be mapped), to other hosts it reaches
    /// directly over TCP (QUIC if the TCP port does not answer or the peer is behind a NAT)
    /// and over QUIC through relays; `quic` uses QUIC everywhere; `tcp` TCP on every direct
    /// link, this host's included.
    #[arg(long, value_enum, default_value_t = TransportChoice::Auto)]
    pub transport: TransportChoice,
    /// Protection of the TCP links: `encrypted` (TLS 1.3 with the peers' identities) or
    /// `plaintext`, for a fabric whose every host is trusted (as gloo and NCCL run): the
    /// link is still set up and bound to its peer through the authenticated QUIC
    /// connection, but its frames travel in clear, so anyone on the path can read or alter
    /// them. A link is plaintext only when both ends give `plaintext`.
    #[arg(long, value_enum, default_value_t = Wire::Encrypted)]
    pub wire: Wire,
    /// TCP connections per TCP link (1 to 16, or auto), each with its own thread on both
    /// ends (and its own TLS session): a frame of 1 MiB or more is cut into this many
    /// slices sent side by side. For links one TCP stream cannot fill (a cloud's cap per
    /// flow, a long fat pipe) or one core cannot encrypt (TLS beyond about 2 GB/s a core);
    /// on a link one stream fills, more only cost threads. `auto`: 4 connections a link,
    /// and the sender stripes each large frame over 1, 2 or 4 of them, trying more while
    /// they move at least 1.2× as many bytes a second (measured until the far end has
    /// acknowledged each frame) and fewer when they move nearly as many.
    #[arg(long, default_value = "1")]
    pub tcp_streams: TcpStreams,
    /// No relayed links: this peer relays for nobody, and if its direct path to a neighbour
    /// does not open (a symmetric NAT) it fails instead of asking a member to relay. By
    /// default every member that is not behind a NAT relays, and a link that hole punching
    /// cannot open is relayed through one of them (its reachable end first, peer 0 among
    /// them; every datagram crosses the relay: slow by design), and each peer says which of
    /// its links are relayed and through whom.
    #[arg(long)]
    pub no_relay: bool,
}

/// Parses `RANK:MS` of `--slow-peer`.
fn parse_slow_peer(s: &str) -> Result<(usize, u64), String> {
    let (rank, ms) = s
        .split_once(':')
        .ok_or_else(|| format!("expected RANK:MS, got {s:?}"))?;
    let rank = rank.parse().map_err(|_| format!("bad rank {rank:?}"))?;
    let ms = ms.parse().map_err(|_| format!("bad milliseconds {ms:?}"))?;
    Ok((rank, ms))
}

/// Writes a value as its command-line text (its `Display`, which its parser reads back).
fn as_text<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// [`as_text`] for an option that is given.
fn opt_as_text<T: std::fmt::Display, S: serde::Serializer>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// An f32 as the shortest decimal that reads back to it (`0.1`, not `0.10000000149011612`,
/// which is what widening it to TOML's f64 would write).
fn f32_short<S: serde::Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(v.to_string().parse().unwrap_or(f64::from(*v)))
}

/// [`f32_short`] for an option that is given.
fn opt_f32_short<S: serde::Serializer>(v: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => f32_short(v, s),
        None => s.serialize_none(),
    }
}

/// `--ps-mode` as `bsp`, `asp` or `ssp:S`.
fn ps_mode_text<S: serde::Serializer>(m: &PsMode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&murmur_gossip::registry::ps_mode_name(*m))
}

/// `--slow-peer` as `RANK:MS`.
fn slow_peer_text<S: serde::Serializer>(v: &Option<(usize, u64)>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some((rank, ms)) => s.collect_str(&format_args!("{rank}:{ms}")),
        None => s.serialize_none(),
    }
}

impl RunArgs {
    /// A peer's inner optimizer for `d` parameters, as `--optimizer` says.
    pub fn optimizer(&self, d: usize) -> Box<dyn Optimizer> {
        let t = &self.train;
        let adamw = AdamWConfig {
            beta2: t.adam_beta2,
            weight_decay: t.weight_decay,
            ..AdamWConfig::default()
        };
        crate::train::inner_optimizer::build(t.optimizer, t.momentum, adamw, d)
    }

    /// The learning-rate schedule over the run's `epochs · rounds_per_epoch` rounds.
    pub fn schedule(&self, rounds_per_epoch: u64) -> Schedule {
        Schedule {
            kind: self.train.lr_schedule,
            warmup: self.train.warmup_rounds,
            total: rounds_per_epoch * self.train.epochs as u64,
        }
    }

    /// The run as a run config (TOML whose keys are the options' long names, as
    /// `--config` reads): every option with its value, those not given left out, so that a
    /// peer started with it runs exactly this run. `--config` itself is not written.
    ///
    /// # Errors
    /// If a value cannot be written as TOML (none of today's can't).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        toml::to_string(self).context("writing the run config")
    }

    /// This run with its model sized for the images of `train`, the run's training set as
    /// [`RunData::load`](crate::train::data::RunData::load) read it
    /// ([`ModelKind::fitted`]): the model every peer builds, and the one a run config
    /// records.
    pub fn fitted_to(&self, train: &crate::train::data::Dataset) -> RunArgs {
        let mut fitted = self.clone();
        fitted.train.model = self.train.model.fitted(train);
        fitted
    }

    /// Checks values that clap cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.peers == 0 {
            bail!("--peers must be at least 1");
        }
        if let Some(path) = &self.train.init_from {
            std::fs::metadata(path).with_context(|| format!("--init-from {}", path.display()))?;
        }
        if self.train.epochs == 0 {
            bail!("--epochs must be at least 1");
        }
        if self.train.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if !(self.train.lr.is_finite() && self.train.lr > 0.0) {
            bail!("--lr must be a positive number, got {}", self.train.lr);
        }
        if !(0.0..1.0).contains(&self.train.momentum) {
            bail!("--momentum must be in [0, 1), got {}", self.train.momentum);
        }
        if !(self.train.weight_decay.is_finite() && self.train.weight_decay >= 0.0) {
            bail!(
                "--weight-decay must be ≥ 0, got {}",
                self.train.weight_decay
            );
        }
        if !(self.train.adam_beta2 > 0.0 && self.train.adam_beta2 < 1.0) {
            bail!(
                "--adam-beta2 must be in (0, 1), got {}",
                self.train.adam_beta2
            );
        }
        if let Some(r) = self.inject_bad_frames.filter(|&r| r >= self.peers) {
            bail!(
                "--inject-bad-frames {r}: there is no peer {r} among {}",
                self.peers
            );
        }
        if let Some(p) = &self.gossip.phases {
            let before_last: usize = p.0.iter().filter_map(|(_, e)| *e).sum();
            if before_last >= self.train.epochs {
                bail!(
                    "--phases {p}: the phases before the last take {before_last} of the \
                     {} epochs, so the last never runs",
                    self.train.epochs
                );
            }
        }
        if let Some(path) = &self.net.allow_peers {
            keys::read_allow_list(path)?;
        }
        if let Some(path) = &self.net.run_key {
            keys::read_run_key(path)?;
        }
        match (
            self.gossip.straggler_policy,
            self.gossip.straggler_deadline_ms,
        ) {
            (StragglerPolicy::Skip, None | Some(StragglerDeadline::Ms(0))) => {
                bail!("--straggler-policy skip needs --straggler-deadline-ms (at least 1)")
            }
            (StragglerPolicy::Wait, Some(_)) => {
                bail!("--straggler-deadline-ms applies to --straggler-policy skip")
            }
            _ => {}
        }
        // Everything the algorithms ask of the run, in one place (the registry); the
        // topology once more when it is loaded (`RunArgs::topology`).
        murmur_gossip::registry::check_run(
            &self.algorithms(),
            &self.run_setup(&self.algorithm_options(), None),
        )?;
        if self.gossip.topology == ONE_PEER_EXPONENTIAL {
            self.topology()?;
        }
        if let Some((r, _)) = self.slow_peer.filter(|&(r, _)| r >= self.peers) {
            bail!("--slow-peer {r}: there is no peer {r} among {}", self.peers);
        }
        if self.net.peer_timeout_secs == 0 {
            bail!("--peer-timeout-secs must be at least 1");
        }
        if self.net.round_timeout_secs <= self.net.peer_timeout_secs {
            bail!(
                "--round-timeout-secs ({}) must exceed --peer-timeout-secs ({}): a round must \
                 wait long enough to notice a neighbour that left",
                self.net.round_timeout_secs,
                self.net.peer_timeout_secs
            );
        }
        if let Some(paused) = self.net.paused_timeout_secs {
            if self.net.round_timeout_secs <= paused {
                bail!(
                    "--round-timeout-secs ({}) must exceed --paused-timeout-secs ({paused}): a \
                     round that waits for a paused neighbour longer than that fails",
                    self.net.round_timeout_secs
                );
            }
        }
        if self.train.rounds_per_epoch == Some(0) {
            bail!("--rounds-per-epoch must be at least 1");
        }
        if matches!(
            self.train.model.input(),
            crate::train::model::Input::Tokens { .. }
        ) && self.train.partition != Partition::Iid
        {
            bail!(
                "--partition {}: a Dirichlet split is over class labels, and the token \
                 sequences of --model {} have none (use iid)",
                self.train.partition,
                self.train.model
            );
        }
        Ok(())
    }

    /// The protocol options as given (`--compressor`, `--gamma`, `--local-steps`, `--tau`,
    /// `--ps-mode`), for the registry.
    pub fn algorithm_options(&self) -> AlgorithmOptions {
        AlgorithmOptions {
            compressor: self.gossip.compressor.clone(),
            gamma: self.gossip.gamma,
            local_steps: self.gossip.local_steps,
            tau: self.gossip.tau,
            ps_mode: self.gossip.ps_mode,
            outer_optimizer: self.gossip.outer_optimizer,
            outer_lr: self.gossip.outer_lr,
            outer_momentum: self.gossip.outer_momentum,
            fragments: self.gossip.fragments,
            merge_alpha: self.gossip.merge_alpha,
            robust: self.gossip.robust,
            part_mb: self.gossip.part_mb.or(self.default_part_mb()),
        }
    }

    /// `--part-mb` when not given: whole messages (0) under `--transport quic`, where a
    /// message in parts measured no faster (QUIC's packets take a core per peer on the
    /// 2-core development machine, and the parts' own work competes with them: a 100 MB
    /// model's round at 1 Gbit/s took 1.19–1.34 s in parts against 1.20–1.27 s whole); the
    /// algorithm's default otherwise.
    fn default_part_mb(&self) -> Option<f64> {
        let takes = self
            .gossip
            .algorithm
            .capabilities()
            .takes(&murmur_gossip::ProtocolOption::PART_MB);
        (takes && self.net.transport == TransportChoice::Quic).then_some(0.0)
    }

    /// H: `--local-steps`, else 4 (1 for algorithms without local steps).
    pub fn local_steps(&self) -> u64 {
        self.algorithm_options()
            .local_steps(&*self.gossip.algorithm)
    }

    /// The algorithm options that peers must share (they change the protocol or the
    /// update), as `name=value` pairs: γ for CHOCO, H for local SGD, τ for SGP, the
    /// parameter server's mode.
    pub fn protocol_options(&self) -> String {
        self.algorithm_options()
            .protocol_fingerprint(&self.algorithms())
    }

    /// What `--resume` can do for the run: a phase schedule resumes neither way.
    pub fn resumable(&self) -> Resumable {
        match self.algorithms().as_slice() {
            [a] => a
                .capabilities()
                .resumable(self.gossip.straggler_policy == StragglerPolicy::Skip),
            _ => Resumable::No,
        }
    }

    /// Whether the other peers train on when a peer leaves (no phase schedule, and an
    /// algorithm that re-weights W or pushes around the gap).
    pub fn survives_departure(&self) -> bool {
        matches!(self.algorithms().as_slice(), [a] if a.capabilities().survives_departure())
    }

    /// The run's setup as the registry's checks see it ([`murmur_gossip::registry::check_run`]).
    fn run_setup<'a>(
        &self,
        options: &'a AlgorithmOptions,
        topology: Option<&'a Topology>,
    ) -> murmur_gossip::registry::RunSetup<'a> {
        murmur_gossip::registry::RunSetup {
            options,
            topology,
            skip_policy: self.gossip.straggler_policy == StragglerPolicy::Skip,
            auto_deadline: matches!(
                self.gossip.straggler_deadline_ms,
                Some(StragglerDeadline::Auto)
            ),
        }
    }

    /// How long a silent peer is waited for: the peer timeout, and the paused timeout
    /// (`--paused-timeout-secs`, by default 30 s or one second less than the round timeout;
    /// [`crate::plane::Timeouts::paused`] keeps it at least the peer timeout) for a peer
    /// whose link says it is paused, not dead.
    pub fn timeouts(&self) -> crate::plane::Timeouts {
        let net = &self.net;
        let paused = net.paused_timeout_secs.unwrap_or_else(|| {
            DEFAULT_PAUSED_TIMEOUT_SECS.min(net.round_timeout_secs.saturating_sub(1))
        });
        crate::plane::Timeouts {
            peer: std::time::Duration::from_secs(net.peer_timeout_secs),
            paused: std::time::Duration::from_secs(paused),
        }
    }

    /// The link emulation of `--link-bandwidth` and `--link-latency`.
    pub fn link_emulation(&self) -> crate::plane::LinkEmulation {
        crate::plane::LinkEmulation {
            rate_bytes_per_sec: self.net.link_bandwidth.map(|r| r.0),
            latency: self.net.link_latency.map(|l| l.0).unwrap_or_default(),
        }
    }

    /// The algorithms of the run: the phases of `--phases`, else `--algorithm`.
    pub fn algorithms(&self) -> Vec<AlgorithmSpec> {
        match &self.gossip.phases {
            Some(p) => p.0.iter().map(|(a, _)| *a).collect(),
            None => vec![self.gossip.algorithm],
        }
    }

    /// The run's algorithm as text: the phase schedule, or the algorithm's name.
    pub fn algorithm_name(&self) -> String {
        match &self.gossip.phases {
            Some(p) => p.to_string(),
            None => self.gossip.algorithm.to_string(),
        }
    }

    /// The algorithm that trains epoch `epoch` (1-based; epoch 0 trains nothing and is
    /// reported under the first phase).
    pub fn algorithm_at(&self, epoch: usize) -> AlgorithmSpec {
        let Some(p) = &self.gossip.phases else {
            return self.gossip.algorithm;
        };
        let mut end = 0;
        for (a, e) in &p.0 {
            match e {
                Some(e) => {
                    end += e;
                    if epoch <= end {
                        return *a;
                    }
                }
                None => return *a,
            }
        }
        self.gossip.algorithm
    }

    /// The run for one phase's algorithm: these options with `algorithm` and no phases.
    pub fn for_phase(&self, algorithm: AlgorithmSpec) -> RunArgs {
        let mut run = self.clone();
        run.gossip.algorithm = algorithm;
        run.gossip.phases = None;
        run
    }

    /// The compressor: `--compressor`, else the algorithm's default.
    pub fn compressor(&self) -> CompressorSpec {
        self.algorithm_options().compressor(&*self.gossip.algorithm)
    }

    /// The compressor as runs print and record it: [`RunArgs::compressor`], or `auto (per
    /// link)` for an algorithm that chooses each link's compressor (choco-auto).
    pub fn compressor_label(&self) -> String {
        if self.gossip.algorithm.capabilities().compresses == Compresses::PerLink {
            "auto (per link)".to_string()
        } else {
            self.compressor().to_string()
        }
    }

    /// Warnings about options that run but are unlikely to be what the user wants.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.train.optimizer == OptimizerKind::Adamw && self.train.lr > 0.01 {
            w.push(format!(
                "--optimizer adamw with --lr {}: AdamW's steps are about η per coordinate, so it \
                 usually takes η around 1e-3",
                self.train.lr
            ));
        }
        let casts = matches!(
            self.compressor(),
            CompressorSpec::Identity | CompressorSpec::Fp16 | CompressorSpec::Bf16
        );
        let compresses = self.gossip.algorithm.capabilities().compresses;
        if compresses == Compresses::Parameters && !casts {
            w.push(format!(
                "{} mixes the neighbours' compressed parameters directly, so the error of \
                 `{}` enters the models every round it communicates (sparsifiers and sign pull \
                 them towards 0); compressed gossip of parameters is what CHOCO-SGD's \
                 compressed differences are for",
                self.algorithm_name(),
                self.compressor()
            ));
        }
        let outer = self.algorithm_options().outer();
        // The SparseLoCo form of diloco and streaming-diloco takes the paper's η_out = 1 by
        // design (its decayed residual replaces the outer momentum; both all-gather,
        // gossip/src/algorithms/diloco.rs, streaming_diloco.rs).
        let sparseloco = matches!(
            self.algorithm_name().as_str(),
            "diloco" | "streaming-diloco"
        ) && matches!(self.compressor(), CompressorSpec::SparseLoco { .. });
        if compresses == Compresses::PseudoGradients && !casts && !sparseloco && outer.lr > 0.5 {
            let biased = self.compressor().build(None).is_ok_and(|c| !c.unbiased());
            if biased {
                w.push(format!(
                    "{} with the biased compressor `{}` and --outer-lr {}: a biased \
                     pseudo-gradient with a large outer step can diverge (top-10% at \
                     --outer-lr 1 did on quadratics, gossip/src/algorithms/diloco.rs); try --outer-lr 0.3",
                    self.algorithm_name(),
                    self.compressor(),
                    outer.lr
                ));
            }
        }
        w
    }

    /// Builds the topology for `self.peers` peers from a name or a file. For the
    /// `one-peer-exponential` schedule (by name or `schedule = ...` file) this is the static
    /// exponential graph, the union of the schedule's rounds, carrying the schedule (see
    /// [`Topology::push_schedule`]).
    ///
    /// # Errors
    /// As [`load_topology`]; a schedule for an algorithm that needs a static W; a directed
    /// graph for an algorithm that needs a symmetric W.
    pub fn topology(&self) -> anyhow::Result<Topology> {
        let topo = load_topology(&self.gossip.topology, Some(self.peers))?;
        let options = self.algorithm_options();
        murmur_gossip::registry::check_run(
            &self.algorithms(),
            &self.run_setup(&options, Some(&topo)),
        )?;
        Ok(topo)
    }

    /// The communication pattern as text: the topology's name, the time-varying schedule,
    /// or the centralized baselines' fixed pattern (which ignores `--topology`).
    pub fn topology_label(&self, topo: &Topology) -> String {
        let algs = self.algorithms();
        let pattern = |a: &AlgorithmSpec| match a.capabilities().pattern {
            Pattern::Fixed(p) => p.to_string(),
            Pattern::Graph(_) => topo.name.clone(),
        };
        let mut labels: Vec<String> = algs.iter().map(pattern).collect();
        labels.dedup();
        labels.join(" then ")
    }
}

#[cfg(test)]
mod tests;
