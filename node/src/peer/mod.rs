//! `murmur peer`: one peer of a run — data shard, Burn model, gossip state machine, QUIC
//! data plane and libp2p discovery, driven by one training loop.
//!
//! The training loop runs on the calling thread; the network runs on a small tokio runtime
//! beside it and talks to the loop through one bounded channel of [`NetEvent`]s (and one
//! bounded queue per destination the other way). The gossip state machine is sans-I/O:
//! this module is its driver.

mod address;
pub mod algo;
pub mod checkpoint;
mod core;
mod driver;
mod links;
mod plan;
mod run;
pub(crate) mod supervisor;

use crate::report::collector::{evaluate_epoch, summary, write_summary, Collector};
use crate::report::frames::*;
use driver::Driver;
use plan::{plan, Start};
use run::run_on;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burn::tensor::backend::AutodiffBackend;
use bytes::Bytes;
use clap::Args;
use murmur_gossip::{Rank, Resumable};
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn};

use crate::config::{DeviceSpec, Init, RunArgs};
use crate::control::auth;
use crate::control::discovery::{
    discover, Admitting, Discovered, Fingerprint, Gate, Listen, PeerInfo, Role,
};
use crate::plane::relay::Relay;
use crate::plane::tls::Admitted;
use crate::plane::{DataPlane, Links, NetEvent};
use crate::report::{self, EpochRow, PeerEpoch};
use crate::train::data::{partition, RunData};
use crate::train::model::{self, Net};
use checkpoint::{Checkpoint, CheckpointMeta};

/// Arguments that differ from peer to peer.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "This peer")]
pub struct PeerArgs {
    /// This peer's rank in 0..peers. Rank 0 is the bootstrap and keeps the run's record (the
    /// lowest live rank does while it is away).
    /// Without it, a peer with `--bootstrap` gets the lowest rank not taken yet from the
    /// bootstrap (with `--join-running`: the lowest empty rank), and one without is rank 0.
    /// Its identity key is then kept as `<out>/identity/peer-<rank>.key`, so that it can be
    /// restarted with `--rank <rank> --resume`.
    #[arg(long)]
    pub rank: Option<Rank>,
    /// The bootstrap's libp2p multiaddr (required for ranks other than 0, unless `--mdns`
    /// finds it), e.g. /ip4/10.0.0.1/udp/4001/quic-v1, or any member's. Repeat it for
    /// several addresses (peer 0 on several networks, candidate hosts, members): each is
    /// dialled, each that answers is asked, and the peer fails only if none can be reached.
    /// A restarted peer (`--resume`) is taken back by any member, so it comes back while
    /// peer 0 is away; a new peer is pointed at peer 0 (found through the run's DHT).
    #[arg(long)]
    pub bootstrap: Vec<libp2p::Multiaddr>,
    /// On a LAN: peer 0 (`--rank 0 --mdns`) answers mDNS queries with its listen address;
    /// any other peer with `--mdns` and no `--bootstrap` finds it that way and asks every
    /// libp2p node it discovers to let it join, until one takes it. Peer 0 must then listen
    /// on an address of the LAN, e.g. `--listen /ip4/0.0.0.0/udp/4001/quic-v1`.
    #[arg(long)]
    pub mdns: bool,
    /// libp2p listen address of this peer: for rank 0 the bootstrap's; for any other peer
    /// the address at which it serves the run's Kademlia DHT, through which a later peer
    /// may enter the run (`--bootstrap` with this peer's address). On a cluster listen on
    /// the host's network, e.g. /ip4/0.0.0.0/udp/4001/quic-v1.
    #[arg(long, default_value = "/ip4/127.0.0.1/udp/0/quic-v1")]
    pub listen: libp2p::Multiaddr,
    /// Rank 0 writes its dialable multiaddr to this file once it listens.
    #[arg(long)]
    pub bootstrap_file: Option<PathBuf>,
    /// This peer (any rank) writes its dialable libp2p multiaddr to this file once it
    /// listens: a later peer may name it with `--bootstrap` to enter the run through this
    /// peer (the bootstrap is then found in the DHT).
    #[arg(long, value_name = "FILE")]
    pub address_file: Option<PathBuf>,
    /// Address of the data plane (port 0: any free port). `0.0.0.0:PORT` binds every
    /// interface and publishes the address of the one that reaches the bootstrap (peer 0:
    /// its `--listen` address, else the default route's).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub data_addr: SocketAddr,
    /// Run folder: metrics are written here.
    #[arg(long)]
    pub out: PathBuf,
    /// This peer's identity key file (libp2p Ed25519 key pair; made if missing). Default:
    /// `<out>/identity/peer-<rank>.key`, so a peer restarted with the same run folder keeps
    /// its identity.
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// Come back after a crash (same options, same run folder; D-PSGD, SGP, CHOCO-SGD). A
    /// restarted peer rejoins the run under way: the bootstrap admits it again, its neighbours send their
    /// round, it fetches their parameters and optimizer state (momentum) in parts, from
    /// several of them at once, and starts from them, mixing again from a round agreed with
    /// them.
    /// With peer 0 also started with `--resume`, the whole run resumes: every peer (all
    /// with `--resume`) continues from its checkpoint of the latest round all of them hold.
    #[arg(long)]
    pub resume: bool,
    /// Peer 0 of an elastic run: start training once M peers (peer 0 included) have
    /// joined; the other ranks take their place later with `--join-running` (D-PSGD, SGP,
    /// CHOCO-SGD).
    /// Until then the peers mix without them (Metropolis–Hastings on the graph of the
    /// present peers; push-sum simply does not push to them). Default: all `--peers`.
    #[arg(long, value_name = "M")]
    pub initial_peers: Option<usize>,
    /// A new peer taking its (empty) rank in a run under way (started with
    /// `--initial-peers`): the bootstrap admits its identity (allow-list permitting), its
    /// neighbours send their round, it fetches their parameters in parts, from several of
    /// them at once, and mixes from a round agreed with them, as a restarted peer does.
    #[arg(long, conflicts_with = "resume")]
    pub join_running: bool,
    /// Peer 0, with `--resume`, restarted while the other peers train on (D-PSGD, SGP,
    /// CHOCO-SGD): it takes the directory its previous process saved in the run folder
    /// (`directory.json`), serves as the bootstrap again (writing its new address to
    /// `--bootstrap-file`), rejoins like any restarted peer and goes on writing the run's
    /// record from the epochs it holds; the peers send it again the reports it missed.
    /// With `--bootstrap` (members' multiaddrs) it first takes the directory from a member
    /// as it stands now (peers that came back while it was away are at new addresses),
    /// falling back on the saved one after 5 s. `murmur launch --restart-failed` and
    /// `murmur.sbatch` pass it. Without it, peer 0 with `--resume` resumes the whole run.
    #[arg(long, requires = "resume")]
    pub rejoin_running: bool,
}

/// Rounds between the highest round a rejoining peer hears of and the round it mixes
/// again from: time for every neighbour to learn the round before it begins it.
pub const REJOIN_MARGIN_ROUNDS: u64 = 20;

/// Runs one peer to the end of training. Dispatches on the device.
///
/// A peer that was paused for longer than the peer timeout (and so declared departed by
/// the others) fails with [`crate::control::pause::Departed`] once it continues, peer 0 as
/// any other: the others went on without it (a stand-in keeps the record), and it comes back
/// as a restarted peer (`--resume`, and `--rejoin-running` for peer 0).
pub fn run(args: &RunArgs, peer: &PeerArgs) -> anyhow::Result<()> {
    args.validate()?;
    check_device(args.train.device)?;
    let watch = crate::control::pause::PauseWatch::global();
    let timeout = Duration::from_secs(args.net.peer_timeout_secs);
    let _ = STARTED.set(std::time::SystemTime::now());
    let trained = train(args, peer);
    if let Err(e) = &trained {
        if peer.rejoin_running && run_completed_within(&peer.out, COMPLETED_RECORD_WAIT) {
            // Restarted too late: the others finished, and the record's keeper (a stand-in
            // for this peer 0, or peer 0) completed the record meanwhile.
            warn!(
                "the run ended while this restarted process came back ({e:#}): its record is \
                 complete (summary.json), nothing is left to rejoin"
            );
            println!("the run ended while this process came back; its record is complete");
            return Ok(());
        }
    }
    trained.map_err(|e| watch.explain(e, timeout))
}

/// When this process started [`run`].
static STARTED: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

/// How long a restarted process that failed to come back looks for the summary of a run
/// that ended meanwhile (the record's keeper writes it last, after its goodbyes when it took
/// the record up while finishing).
const COMPLETED_RECORD_WAIT: Duration = Duration::from_secs(5);

/// Whether the run folder `out` holds the summary of a completed run, written since this
/// process started (by the record's keeper, at the run's end): a restarted peer that finds
/// it has nothing left to rejoin.
pub(crate) fn run_completed(out: &Path) -> bool {
    let path = out.join("summary.json");
    let since = STARTED.get().copied().unwrap_or(std::time::UNIX_EPOCH);
    let written = std::fs::metadata(&path).and_then(|m| m.modified());
    let completed = || {
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|s| s["outcome"] == crate::report::COMPLETED)
    };
    written.is_ok_and(|t| t >= since) && completed()
}

/// [`run_completed`], looked for up to `wait`.
fn run_completed_within(out: &Path, wait: Duration) -> bool {
    let until = Instant::now() + wait;
    loop {
        if run_completed(out) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`run`] on the device the run asks for.
fn train(args: &RunArgs, peer: &PeerArgs) -> anyhow::Result<()> {
    struct Train<'a>(&'a RunArgs, &'a PeerArgs);
    impl OnBackend for Train<'_> {
        type Output = anyhow::Result<()>;
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
            run_on::<B>(self.0, self.1, device)
        }
    }
    on_backend(args.train.device, Train(args, peer))
}

/// Work generic over the training backend, for [`on_backend`].
pub trait OnBackend {
    /// What the work returns.
    type Output;
    /// Does the work on backend `B`, on `device`.
    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output;
}

/// Runs `work` on the Burn backend and device of `device`: the one place that maps a
/// [`DeviceSpec`] to a backend (peers and `murmur bench`). `device` must have passed
/// [`check_device`]; a device whose feature is not built is unreachable here.
pub fn on_backend<W: OnBackend>(device: DeviceSpec, work: W) -> W::Output {
    match device {
        DeviceSpec::Cpu => {
            work.run::<burn::backend::Autodiff<burn::backend::Flex>>(Default::default())
        }
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(i) => work.run::<burn::backend::Autodiff<burn::backend::Cuda>>(
            burn::backend::cuda::CudaDevice::new(i),
        ),
        #[cfg(feature = "libtorch")]
        DeviceSpec::LibTorch => work.run::<burn::backend::Autodiff<burn::backend::LibTorch>>(
            burn::backend::libtorch::LibTorchDevice::Cpu,
        ),
        #[allow(unreachable_patterns)]
        other => unreachable!("check_device refuses {other}: its feature is not built"),
    }
}

/// Checks that `device` can be used by this build on this machine: a clear error instead of
/// burn-cuda's panic when the feature is off, the CUDA driver library is missing, or the
/// device index does not exist.
pub fn check_device(device: DeviceSpec) -> anyhow::Result<()> {
    match device {
        DeviceSpec::Cpu => Ok(()),
        #[cfg(feature = "libtorch")]
        DeviceSpec::LibTorch => Ok(()),
        #[cfg(not(feature = "libtorch"))]
        DeviceSpec::LibTorch => bail!(
            "--device libtorch needs a murmur built with `--features libtorch` against a \
             libtorch (LIBTORCH_USE_PYTORCH=1 with PyTorch 2.9 in the active Python, or \
             LIBTORCH=<dir>; docs/src/models.md)"
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => bail!("--device cuda needs a murmur built with `--features cuda`"),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(index) => {
            // SAFETY: this only dlopens the driver library (running its initialisers), which
            // burn-cuda does on first use anyway; no symbol is called through the handle here.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                bail!("--device cuda: no CUDA driver library (libcuda.so) found; is the NVIDIA driver installed?");
            }
            cudarc::driver::result::init()
                .map_err(|e| anyhow!("--device cuda: CUDA driver init failed: {e:?}"))?;
            let count = cudarc::driver::result::device::get_count()
                .map_err(|e| anyhow!("--device cuda: cannot count CUDA devices: {e:?}"))?;
            if index >= count.max(0) as usize {
                bail!("--device cuda:{index}: this machine has {count} CUDA device(s)");
            }
            // burn-cuda compiles its kernels at run time with NVRTC, against the CUDA headers.
            // SAFETY: as above, a dlopen only.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                bail!("--device cuda: no NVRTC library (libnvrtc.so) found: burn-cuda compiles its kernels with it; install the CUDA toolkit or put its lib64 folder on LD_LIBRARY_PATH");
            }
            // The toolkit is looked up as cubecl-cuda's compiler will: $CUDA_PATH,
            // /usr/local/cuda, /opt/cuda, or /usr when /usr/bin/nvcc exists.
            let Some(toolkit) = cubecl_cuda::install::cuda_path() else {
                bail!("--device cuda: no CUDA toolkit found ($CUDA_PATH, /usr/local/cuda, /opt/cuda, /usr/bin/nvcc): burn-cuda compiles its kernels against its headers; set CUDA_PATH");
            };
            let headers = toolkit.join("include");
            if !headers.join("cuda.h").exists() {
                bail!("--device cuda: no cuda.h in {}: burn-cuda compiles its kernels against the CUDA headers; set CUDA_PATH to the CUDA toolkit", headers.display());
            }
            Ok(())
        }
    }
}

/// The rounds of peer 0's checkpoints (`rounds`) that a whole run can resume from without a
/// hole in its record: a round R in an epoch whose predecessors' rows are all in
/// `<run>/epochs.jsonl` (R / `rpe` ≤ the last recorded epoch E), or the last round of
/// epoch E + 1, whose row the resumed run records again. All of `rounds`, with a warning,
/// if none qualifies.
/// Where peer 0 saves the run's directory while the run is under way (for a restarted
/// peer 0, `--rejoin-running`).
pub(crate) fn directory_file(run_dir: &Path) -> PathBuf {
    run_dir.join("directory.json")
}

fn resumable_rounds(rounds: &[u64], run_dir: &Path, rpe: u64) -> Vec<u64> {
    let recorded = std::fs::read_to_string(run_dir.join("epochs.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<EpochRow>(l).ok())
        .map(|r| r.epoch as u64)
        .max();
    let ok = |r: u64| {
        recorded.is_some_and(|e| r / rpe <= e || r.is_multiple_of(rpe) && r / rpe == e + 1)
    };
    let good: Vec<u64> = rounds.iter().copied().filter(|&r| ok(r)).collect();
    if good.is_empty() && !rounds.is_empty() {
        warn!(
            ?rounds,
            ?recorded,
            "no checkpoint fits the recorded epochs: the record will lack the rows of the epochs in between"
        );
        return rounds.to_vec();
    }
    good
}

/// Path of the run folder's bootstrap address file.
pub fn bootstrap_file(run_dir: &Path) -> PathBuf {
    run_dir.join("bootstrap.addr")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_run_resumes_from_a_round_that_leaves_no_hole_in_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let rows: String = (0..=2)
            .map(|epoch| {
                serde_json::to_string(&EpochRow {
                    epoch,
                    ..EpochRow::default()
                })
                .unwrap()
                    + "\n"
            })
            .collect();
        std::fs::write(dir.path().join("epochs.jsonl"), rows).unwrap();
        // Epochs 0..=2 recorded, 10 rounds each. Round 35 would skip epoch 3's row; round
        // 30 ends epoch 3, whose row the resumed run records again; 25 is inside epoch 3.
        assert_eq!(resumable_rounds(&[35, 30], dir.path(), 10), vec![30]);
        assert_eq!(resumable_rounds(&[30, 25], dir.path(), 10), vec![30, 25]);
        assert_eq!(
            resumable_rounds(&[45, 40], dir.path(), 10),
            vec![45, 40],
            "none fits: all"
        );
        std::fs::remove_file(dir.path().join("epochs.jsonl")).unwrap();
        assert_eq!(resumable_rounds(&[5], dir.path(), 10), vec![5]);
    }
}
