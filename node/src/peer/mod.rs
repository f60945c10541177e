//! `murmur peer`: one peer of a run — data shard, Burn model, gossip state machine, QUIC
//! data plane and libp2p discovery, driven by one training loop.
//!
//! The training loop runs on the calling thread; the network runs on a small tokio runtime
//! beside it and talks to the loop through one bounded channel of [`NetEvent`]s (and one
//! bounded queue per destination the other way). The gossip state machine is sans-I/O:
//! this module is its driver.

pub mod algo;
pub mod checkpoint;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burn::tensor::backend::AutodiffBackend;
use bytes::Bytes;
use clap::Args;
use murmur_compress::Compressor;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::{consensus_distance, Gossip, GossipEvent, Rank, Resumable};
use murmur_topology::MixingMatrix;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn};

use crate::control::auth::{self, Admitted};
use checkpoint::{Checkpoint, CheckpointMeta};
use crate::config::{DeviceSpec, Init, RunArgs};
use crate::train::data::{partition, Batches, Dataset, RunData};
use crate::control::discovery::{discover, Discovered, Fingerprint, Gate, Listen, PeerInfo, Role};
use crate::report::{self, EpochRow, MembershipEvent, PeerEpoch, Summary};
use crate::train::model::{self, Net};
use crate::plane::{DataPlane, Links, NetEvent};

/// Samples per batch when a model is evaluated on a data set (a memory bound, not a
/// hyperparameter).
pub(crate) const EVAL_BATCH: usize = 500;

/// Arguments that differ from peer to peer.
#[derive(Debug, Clone, Args)]
pub struct PeerArgs {
    /// This peer's rank in 0..peers. Rank 0 is the bootstrap and collects the metrics.
    /// Without it, a peer with `--bootstrap` gets the lowest rank not taken yet from the
    /// bootstrap (with `--join-running`: the lowest empty rank), and one without is rank 0.
    /// Its identity key is then kept as `<out>/identity/peer-<rank>.key`, so that it can be
    /// restarted with `--rank <rank> --resume`.
    #[arg(long)]
    pub rank: Option<Rank>,
    /// The bootstrap's libp2p multiaddr (required for ranks other than 0, unless `--mdns`
    /// finds it), e.g. /ip4/10.0.0.1/udp/4001/quic-v1. Repeat it for several addresses
    /// (peer 0 on several networks, or candidate hosts): each is dialled, the first that
    /// answers is asked, and the peer fails only if none can be reached.
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
    /// Address of the QUIC data plane (port 0: any free port).
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
    /// round and parameters, it starts from their mean with the momentum of its last
    /// checkpoint (`--checkpoint-every`) and mixes again from a round agreed with them.
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
    /// neighbours send their round and parameters, it starts from their mean and mixes from
    /// a round agreed with them, as a restarted peer does.
    #[arg(long, conflicts_with = "resume")]
    pub join_running: bool,
}

/// Rounds between the highest round a rejoining peer hears of and the round it mixes
/// again from: time for every neighbour to learn the round before it begins it.
pub const REJOIN_MARGIN_ROUNDS: u64 = 20;

/// Runs one peer to the end of training. Dispatches on the device.
///
/// A peer that was paused for longer than the peer timeout (and so declared departed by
/// the others) fails with [`crate::control::pause::Departed`] once it continues; peer 0 cannot be
/// taken back, so its error only says that it was paused.
pub fn run(args: &RunArgs, peer: &PeerArgs) -> anyhow::Result<()> {
    args.validate()?;
    check_device(args.device)?;
    let watch = crate::control::pause::PauseWatch::start();
    let timeout = Duration::from_secs(args.peer_timeout_secs);
    train(args, peer).map_err(|e| match peer.rank {
        Some(0) if watch.longest_pause() >= timeout => e.context(format!(
            "peer 0 was paused for {:.1} s (longer than --peer-timeout-secs {}): the others \
             stopped without the bootstrap",
            watch.longest_pause().as_secs_f64(),
            args.peer_timeout_secs
        )),
        Some(0) => e,
        _ => watch.explain(e, timeout),
    })
}

/// [`run`] on the device the run asks for.
fn train(args: &RunArgs, peer: &PeerArgs) -> anyhow::Result<()> {
    match args.device {
        DeviceSpec::Cpu => {
            run_on::<burn::backend::Autodiff<burn::backend::Flex>>(args, peer, Default::default())
        }
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(i) => run_on::<burn::backend::Autodiff<burn::backend::Cuda>>(
            args,
            peer,
            burn::backend::cuda::CudaDevice::new(i),
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => unreachable!("check_device refuses CUDA without the feature"),
    }
}

/// Checks that `device` can be used by this build on this machine: a clear error instead of
/// burn-cuda's panic when the feature is off, the CUDA driver library is missing, or the
/// device index does not exist.
pub fn check_device(device: DeviceSpec) -> anyhow::Result<()> {
    match device {
        DeviceSpec::Cpu => Ok(()),
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
            Ok(())
        }
    }
}

/// Everything the training loop owns besides the model.
struct Driver {
    rank: Rank,
    rt: tokio::runtime::Runtime,
    events: mpsc::Receiver<NetEvent>,
    links: Links,
    gossip: Box<dyn Gossip>,
    /// Peers that still owe us a goodbye: in-neighbours, and everyone for rank 0.
    expected_in: HashSet<Rank>,
    finished_in: HashSet<Rank>,
    /// Peers we have a link to: out-neighbours, and peer 0 for the reports.
    destinations: HashSet<Rank>,
    /// Destinations whose receiver closed our link after our goodbye.
    links_done: HashSet<Rank>,
    refused_frames: u64,
    /// Rank 0 only.
    collector: Option<Collector>,
    send_buf: Vec<u8>,
    /// The run's mixing matrix W (n×n), re-weighted without the departed peers.
    w: MixingMatrix,
    /// Algorithm name, for messages.
    algorithm: String,
    /// Peers that left the run (and have not rejoined), as this peer learned of them.
    departed: BTreeMap<Rank, MembershipEvent>,
    /// Rejoins this peer has taken part in, as (peer, round): each is handled once.
    rejoined: Vec<(Rank, u64)>,
    /// The epoch being trained (0 before training).
    epoch: usize,
    /// When training started.
    started: Instant,
    /// Our QUIC endpoint: links to restarted peers are opened during the run.
    plane: DataPlane,
    /// Each rank's identity (`None`: an empty rank of an elastic run).
    peer_ids: Vec<Option<libp2p::PeerId>>,
    /// The identities the data plane accepts, each as its rank.
    admitted: Admitted,
    /// A rejoining peer only: the answers to its hellos, by sender.
    welcomes: BTreeMap<Rank, (Welcome, Vec<f32>)>,
    /// A rejoining peer only: the round it mixes again from, and the in-neighbours whose
    /// frame for that round has arrived.
    first_frames: Option<(u64, HashSet<Rank>)>,
    /// Peer 0 only: its key, to sign the admission of a new peer ([`Driver::on_admit`]).
    admit_signer: Option<libp2p::identity::Keypair>,
    /// Peer 0 only: where its bootstrap learns that a new peer mixes with the run, and the
    /// new peers not there yet, as (rank, first round).
    settle: Option<tokio::sync::mpsc::UnboundedSender<Rank>>,
    settling: Vec<(Rank, u64)>,
}

/// A peer's answer to a restarted peer's hello (the JSON part of a `Welcome` frame; the
/// sender's parameters x follow).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Welcome {
    /// The sender's round (the next to begin, or the one mixing).
    round: u64,
    /// Peers the sender knows to have left, the hello's sender excluded.
    departed: Vec<Rank>,
}

fn run_on<B: AutodiffBackend>(
    args: &RunArgs,
    peer: &PeerArgs,
    device: B::Device,
) -> anyhow::Result<()> {
    let n = args.peers;
    // Without --rank, a joining peer learns its rank from the bootstrap; until then it
    // goes by a placeholder that nothing keeps.
    // A peer joins through a bootstrap it is given or finds with mDNS; peer 0 is one.
    let joins = !peer.bootstrap.is_empty() || peer.mdns && peer.rank != Some(0);
    let assigned = peer.rank.is_none() && joins;
    let mut rank = peer.rank.unwrap_or(if assigned { 1 } else { 0 });
    let span = info_span!("peer", peer = tracing::field::Empty);
    if !assigned {
        span.record("peer", rank);
    }
    let _span = span.enter();
    if assigned && n == 1 {
        bail!("a run of one peer has only rank 0: start it without --bootstrap or --mdns");
    }
    if rank >= n {
        bail!(
            "--rank {rank} is out of range for --peers {n} ({})",
            match n {
                1 => "the only rank is 0".to_string(),
                _ => format!("ranks are 0 to {}", n - 1),
            }
        );
    }
    if rank != 0 && !joins {
        bail!("peer {rank} needs --bootstrap <multiaddr of peer 0> (or --mdns on a LAN)");
    }
    if rank == 0 && !peer.bootstrap.is_empty() {
        bail!("peer 0 is the bootstrap: it takes --listen, not --bootstrap");
    }
    if assigned && peer.resume {
        bail!(
            "--resume needs --rank: the rank this peer had (its log and membership.jsonl say it)"
        );
    }
    let resumable = args.resumable();
    if peer.resume
        && resumable == Resumable::WholeRun
        && args.straggler_policy == crate::config::StragglerPolicy::Skip
    {
        bail!(
            "--resume: a CHOCO-SGD run under --straggler-policy skip cannot resume from its \
             checkpoints (the messages still late when they were written are not in them, \
             so the copies x̂ would disagree for good)"
        );
    }
    if peer.resume && resumable == Resumable::No {
        bail!(
            "--resume works for D-PSGD, SGP and CHOCO-SGD runs, not {}",
            args.algorithm_name()
        );
    }
    let initial = peer.initial_peers.unwrap_or(n);
    if peer.initial_peers.is_some() && joins {
        bail!("--initial-peers is peer 0's option (the bootstrap decides when the run starts)");
    }
    if initial == 0 || initial > n {
        bail!("--initial-peers {initial} must be in 1..={n} (--peers)");
    }
    let elastic = initial < n || peer.join_running;
    if elastic && resumable != Resumable::Rejoin {
        bail!(
            "an elastic run (--initial-peers, --join-running) needs an algorithm that takes a peer in mid-run: D-PSGD, SGP or CHOCO-SGD (without --straggler-policy skip), not {}",
            args.algorithm_name()
        );
    }
    if peer.join_running && rank == 0 {
        bail!("--join-running: peer 0 starts the run; it cannot join it");
    }
    let topo = args.topology()?;
    std::fs::create_dir_all(peer.out.join("peers"))
        .with_context(|| format!("cannot create the run folder {}", peer.out.display()))?;

    // Data: the same seeded split on every peer; this peer keeps its shard (once its rank
    // is known).
    let data = RunData::load(args.model, args.data.as_deref(), args.seed)?;
    let shards = partition(&data.train.labels, n, args.partition, args.seed)?;
    let rounds_per_epoch = args
        .rounds_per_epoch
        .unwrap_or_else(|| (data.train.len() as u64).div_ceil((n * args.batch_size) as u64));

    // Model: with `--init same` every peer draws the same x⁰ from the same seed.
    let init = |rank: Rank| {
        B::seed(
            &device,
            match args.init {
                Init::Same => args.seed,
                Init::Independent => args.seed.wrapping_add(rank as u64),
            },
        );
        let net = Net::<B>::new(args.model, &device);
        let mut x = Vec::new();
        model::flatten(&net, &mut x);
        (net, x)
    };
    let (mut net, mut x) = init(rank);
    let input = net.input();
    let d = x.len();
    // Whether the model keeps state beyond its parameters (BatchNorm statistics).
    let has_running_state = {
        let mut s = Vec::new();
        model::flatten_running_state(&net, &mut s);
        !s.is_empty()
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // Payload limit: the model as f32 plus generous room for headers and the report JSON.
    let max_payload = u32::try_from(8 * d + (1 << 20)).unwrap_or(u32::MAX);
    let peer_timeout = Duration::from_secs(args.peer_timeout_secs);
    // A peer without --rank makes a new identity and keeps it once it knows its rank.
    let key = match (&peer.identity, assigned) {
        (Some(file), _) => auth::load_or_create_identity(file)?,
        (None, true) => libp2p::identity::Keypair::generate_ed25519(),
        (None, false) => auth::load_or_create_identity(&auth::key_path(&peer.out, rank))?,
    };
    let admitted = Admitted::default();
    let (mut plane, events) = rt.block_on(async {
        DataPlane::bind(
            rank,
            peer.data_addr,
            max_payload,
            peer_timeout,
            &key,
            admitted.clone(),
        )
    })?;
    plane.emulation = args.link_emulation();
    let fingerprint = Fingerprint {
        peers: n,
        topology: args.topology_label(&topo),
        model: args.model.to_string(),
        dim: d,
        algorithm: args.algorithm_name(),
        compressor: args.compressor().to_string(),
        epochs: args.epochs,
        rounds_per_epoch,
        seed: args.seed,
        partition: args.partition.to_string(),
        protocol: args.protocol_options(),
    };
    let mut me = PeerInfo {
        rank,
        peer_id: String::new(),
        data_addr: plane.local_addr,
    };
    // With --resume: this peer's checkpoints (the latest and the one before).
    let mut checkpoint_path = checkpoint::path(&peer.out, rank);
    let mut checkpoints = if peer.resume {
        Checkpoint::load_all(&checkpoint_path, &fingerprint, d)?
    } else {
        Vec::new()
    };
    let checkpoint_rounds: Vec<u64> = checkpoints.iter().map(|c| c.meta.round).collect();
    if peer.resume && checkpoints.is_empty() {
        warn!(path = %checkpoint_path.display(), "no checkpoint");
    }
    if peer.mdns
        && !joins
        && peer.listen.iter().any(|p| {
            matches!(p, libp2p::multiaddr::Protocol::Ip4(a) if a.is_loopback())
                || matches!(p, libp2p::multiaddr::Protocol::Ip6(a) if a.is_loopback())
        })
    {
        warn!(listen = %peer.listen, "--mdns with a loopback --listen address: only peers on this machine can reach the bootstrap (listen on the LAN, e.g. /ip4/0.0.0.0/udp/4001/quic-v1)");
    }
    // Peer 0 tells its bootstrap when a new peer mixes with the run (or left).
    let (settle, settled) = tokio::sync::mpsc::unbounded_channel();
    let role = match joins {
        false => Role::Bootstrap {
            initial,
            joined: plane.event_sender(),
            settled,
            resume: peer
                .resume
                .then(|| resumable_rounds(&checkpoint_rounds, &peer.out, rounds_per_epoch)),
        },
        true => Role::Join {
            bootstrap: peer.bootstrap.clone(),
            rejoin: peer.resume || peer.join_running,
            checkpoint_rounds,
            any_rank: assigned,
        },
    };
    let join_timeout = Duration::from_secs(args.join_timeout_secs);
    let gate = Gate {
        allow: match (&args.allow_peers, rank) {
            (Some(path), 0) => Some(auth::read_allow_list(path)?),
            _ => None,
        },
        key: args
            .run_key
            .as_deref()
            .map(auth::RunKey::read)
            .transpose()?,
    };
    let Discovered {
        rank: given,
        directory,
        resume_round,
    } = rt.block_on(discover(
        role,
        Listen {
            addr: peer.listen.clone(),
            files: [
                peer.bootstrap_file.clone().filter(|_| !joins),
                peer.address_file.clone(),
            ]
            .into_iter()
            .flatten()
            .collect(),
        },
        me.clone(),
        fingerprint.clone(),
        join_timeout,
        key.clone(),
        gate,
        peer.mdns,
    ))?;
    if assigned {
        rank = given;
        span.record("peer", rank);
        me.rank = rank;
        plane.set_rank(rank);
        checkpoint_path = checkpoint::path(&peer.out, rank);
        let key_file = auth::key_path(&peer.out, rank);
        if peer.identity.is_none() {
            auth::save_identity(&key_file, &key)?;
        }
        info!(rank, "the bootstrap gave this peer rank {rank}");
        if args.init == Init::Independent {
            (net, x) = init(rank);
        }
    } else if given != rank {
        bail!("the bootstrap's directory has this peer as rank {given}, not {rank}");
    }
    let shard = data.train.subset(&shards[rank]);
    info!(d, shard = shard.len(), rounds_per_epoch, topology = %topo.name, "peer starting");
    // The data plane accepts the run's peers only, each as its rank.
    let mut peer_ids: Vec<Option<libp2p::PeerId>> = Vec::with_capacity(n);
    for p in &directory {
        peer_ids.push(match p {
            Some(p) => Some(p.data_addr_and_id()?.1),
            None => None,
        });
    }
    admitted.admit_all(
        peer_ids
            .iter()
            .enumerate()
            .filter_map(|(r, id)| id.map(|id| (id, r))),
    );
    let empty: Vec<Rank> = (0..n).filter(|&r| directory[r].is_none()).collect();
    admitted.set_open(!empty.is_empty());

    let gossip = algo::build(
        args,
        &topo,
        rank,
        x.clone(),
        &model::tensor_lengths(&net),
        max_payload,
        rounds_per_epoch,
    )?;

    // Links: to every peer the algorithm sends to, and to rank 0 for the metrics reports.
    let mut destinations: Vec<Rank> = gossip.out_peers();
    if rank != 0 && !destinations.contains(&0) {
        destinations.push(0);
    }
    let mut links = Links::new();
    // A rejoining peer may find some destinations gone; the run's answer says which.
    let mut unreachable = BTreeMap::new();
    for &to in &destinations {
        let (Some(info), Some(id)) = (&directory[to], peer_ids[to]) else {
            continue; // an empty rank of an elastic run
        };
        match rt.block_on(plane.connect(to, info.data_addr, id)) {
            Ok(link) => {
                links.insert(to, link);
            }
            Err(e) if peer.resume || peer.join_running => {
                unreachable.insert(to, e);
            }
            Err(e) => return Err(e),
        }
    }
    let destinations: HashSet<Rank> = links.keys().copied().collect();
    let mut expected_in: HashSet<Rank> = gossip.in_peers().into_iter().collect();
    if rank == 0 {
        expected_in.extend(1..n);
    }

    let collector = (rank == 0).then(|| Collector {
        n,
        dir: peer.out.clone(),
        pending: BTreeMap::new(),
        absent: BTreeMap::new(),
        history: Vec::new(),
        rounds_per_epoch,
        rows: Vec::new(),
        carried: None,
        test: data.test.clone(),
        d,
        kind: args.model,
        started: Instant::now(),
    });
    let mut drv = Driver {
        rank,
        rt,
        events,
        links,
        gossip,
        expected_in,
        finished_in: HashSet::new(),
        destinations,
        links_done: HashSet::new(),
        refused_frames: 0,
        collector,
        send_buf: Vec::new(),
        w: topo.w.clone(),
        algorithm: args.algorithm_name(),
        departed: BTreeMap::new(),
        rejoined: Vec::new(),
        epoch: 0,
        started: Instant::now(),
        plane,
        peer_ids,
        admitted,
        welcomes: BTreeMap::new(),
        first_frames: None,
        settle: (rank == 0).then_some(settle),
        admit_signer: (rank == 0).then(|| key.clone()),
        settling: Vec::new(),
    };
    // Every peer mixes without the empty ranks of an elastic run (a peer joining the run
    // under way learns the other departed peers from its neighbours' welcomes), and knows
    // them as empty, so that it admits a new peer taking one.
    drv.start_without(&empty)?;
    if rank == 0 {
        println!("{}", report::table_header());
    }

    let mut velocity = vec![0.0f32; d];
    let mut first_round = 0;
    if let Some(round) = resume_round {
        // The whole run resumes: every peer continues from its checkpoint of that round.
        let at = checkpoints
            .iter()
            .position(|c| c.meta.round == round)
            .ok_or_else(|| anyhow!("--resume: no checkpoint of round {round}"))?;
        let c = checkpoints.swap_remove(at);
        info!(
            round,
            "resuming the run from the checkpoint of round {round}"
        );
        x = c.x;
        velocity = c.velocity;
        net = model::unflatten(net, &x)?;
        net = restore_running_state(net, &c.model_state)?;
        drv.gossip.start_at_round(round)?;
        drv.gossip.restore_state(&c.state).with_context(|| {
            format!(
                "--resume: the checkpoint of round {round} does not fit {}",
                args.algorithm_name()
            )
        })?;
        first_round = round;
    } else if peer.resume || peer.join_running {
        if resumable != Resumable::Rejoin {
            bail!(
                "--resume: {} cannot take one restarted peer back into a running run; restart \
                 the whole run with --resume, peer 0 included, to continue from the checkpoints",
                args.algorithm_name()
            );
        }
        // A restarted peer agrees on a round with its neighbours and starts from their mean,
        // with the momentum of its latest checkpoint.
        let (at, mean) = drv.rejoin(
            &me,
            unreachable,
            rounds_per_epoch * args.epochs as u64,
            join_timeout,
        )?;
        x = mean;
        net = model::unflatten(net, &x)?;
        if let Some(c) = checkpoints.into_iter().max_by_key(|c| c.meta.round) {
            info!(round = c.meta.round, "loaded the checkpoint");
            velocity = c.velocity;
            net = restore_running_state(net, &c.model_state)?;
        }
        first_round = at;
    }
    // A whole run resumed at an epoch's last round records that epoch's row again (its
    // reports may not all have reached peer 0 before the run stopped).
    let first_epoch = match first_round {
        0 => 0,
        r if resume_round.is_some() && r.is_multiple_of(rounds_per_epoch) => {
            (r / rounds_per_epoch) as usize
        }
        r => (r / rounds_per_epoch) as usize + 1,
    };
    if let (Some(c), true) = (drv.collector.as_mut(), first_epoch > 0) {
        c.keep_rows_before(first_epoch)?;
    }

    // Training.
    let start = Instant::now();
    drv.started = start;
    let mut batches = Batches::new(
        shard.len(),
        args.seed
            .wrapping_add(1 + rank as u64)
            .wrapping_add(first_round.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    );
    let mut batch_images = Vec::with_capacity(args.batch_size * input.features());
    let mut grad = Vec::with_capacity(d);
    let mut batch_labels = Vec::with_capacity(args.batch_size);
    let (mut compute_s, mut communicate_s, mut wait_s) = (0.0f64, 0.0f64, 0.0f64);
    let peer_log = peer.out.join("peers").join(format!("peer-{rank}.jsonl"));
    let mut last_report = None;
    // Epoch 0 trains nothing: it records the starting point (x⁰, Ξ²(0)). A peer that
    // rejoined starts within the epoch of its first round.
    for epoch in first_epoch..=args.epochs {
        let mut loss_sum = 0.0f64;
        // Epoch e trains rounds (e − 1)·R ..< e·R, those not done before a resume.
        let rounds = match epoch as u64 {
            0 => 0,
            e => (e * rounds_per_epoch).saturating_sub(first_round.max((e - 1) * rounds_per_epoch)),
        };
        drv.epoch = epoch;
        // Compressor schedules (DGC's warm-up) count training epochs from 0.
        drv.gossip.set_epoch(epoch.saturating_sub(1));
        for _ in 0..rounds {
            batches.next_batch(
                &shard,
                args.batch_size,
                &mut batch_images,
                &mut batch_labels,
            );
            // D-PSGD-like algorithms send x_t before its gradient is known: overlap the two.
            let overlap = !args.no_overlap && drv.gossip.overlaps_gradient();
            let t0 = Instant::now();
            if overlap {
                // Frames with x_t leave while the gradient at x_t is computed.
                drv.gossip.begin_round(Instant::now(), &x, None);
                drv.transmit()?;
            }
            if let Some((_, ms)) = args.slow_peer.filter(|&(r, _)| r == rank) {
                std::thread::sleep(Duration::from_millis(ms));
            }
            let batch = model::batch_tensors::<B>(
                input,
                std::mem::take(&mut batch_images),
                &batch_labels,
                &device,
            )?;
            let loss = model::loss_and_grad(&net, batch, &mut grad)?;
            if !loss.is_finite() {
                bail!("training diverged at epoch {epoch}: loss is {loss} (try a smaller --lr)");
            }
            loss_sum += loss as f64;
            // Heavy-ball direction v ← μ v + g; D-PSGD then applies x ← Σ W x − η v.
            for (v, g) in velocity.iter_mut().zip(&grad) {
                *v = args.momentum * *v + g;
            }
            let t1 = Instant::now();
            compute_s += (t1 - t0).as_secs_f64();

            if overlap {
                drv.wait_mixed()?;
                drv.gossip.apply_gradient(&velocity);
                communicate_s += t0.elapsed().as_secs_f64();
            } else {
                drv.gossip.begin_round(Instant::now(), &x, Some(&velocity));
                drv.transmit()?;
                drv.wait_mixed()?;
                communicate_s += t1.elapsed().as_secs_f64();
            }
            wait_s += t1.elapsed().as_secs_f64();
            x.copy_from_slice(drv.gossip.params());
            net = model::unflatten(net, &x)?;
            let round = drv.gossip.round();
            if args.checkpoint_every > 0 && round.is_multiple_of(args.checkpoint_every) {
                Checkpoint {
                    meta: CheckpointMeta {
                        rank,
                        round,
                        fingerprint: fingerprint.clone(),
                        departed: drv.departed.keys().copied().collect(),
                    },
                    x: x.clone(),
                    velocity: velocity.clone(),
                    state: drv.gossip.state(),
                    model_state: {
                        // Burn folds a step's statistics in when the inference copy is made;
                        // a model without BatchNorm needs no copy.
                        let mut s = Vec::new();
                        if has_running_state {
                            model::flatten_running_state(&model::inference_copy(&net), &mut s);
                        }
                        s
                    },
                }
                .save(&checkpoint_path)?;
            }
            if args.inject_bad_frames == Some(rank) {
                drv.inject_bad_frames(drv.gossip.round(), d)?;
            }
            // Serve what arrived meanwhile (a parameter server answers its workers here).
            drv.serve_ready()?;
            drv.settle_joins();
        }
        let (test_accuracy, test_loss, train_loss) = evaluate_epoch(
            &model::inference_copy(&net),
            &data.test,
            &shard,
            (rounds > 0).then(|| loss_sum / rounds as f64),
            &device,
        )?;
        let stats = drv.gossip.stats();
        let report = PeerEpoch {
            peer: rank,
            epoch,
            phase: args.algorithm_at(epoch).to_string(),
            rounds: drv.gossip.round(),
            train_loss,
            test_accuracy,
            test_loss,
            bytes_sent: stats.bytes_sent,
            bytes_received: stats.bytes_received,
            compute_seconds: compute_s,
            communicate_seconds: communicate_s,
            wait_seconds: wait_s,
            refused_frames: drv.refused_frames,
            skipped: stats.skipped,
            wall_seconds: start.elapsed().as_secs_f64(),
        };
        info!(epoch, epochs = args.epochs, test_accuracy, "epoch done");
        report::append_json_line(&peer_log, &report)?;
        drv.report(report.clone(), &x)?;
        last_report = Some(report);
    }

    // Rank 0 waits (at most one round timeout) for every peer's final report.
    let reports_deadline = Instant::now() + Duration::from_secs(args.round_timeout_secs);
    while let Some(c) = drv
        .collector
        .as_ref()
        .filter(|c| c.rows.last().is_none_or(|r| r.epoch < args.epochs))
    {
        if Instant::now() >= reports_deadline {
            bail!(
                "peers {:?} sent no report for the last epochs within {} s",
                c.missing_reporters(),
                args.round_timeout_secs
            );
        }
        drv.next_event(reports_deadline)?;
        // A parameter server still answers workers that are finishing their last rounds.
        drv.transmit()?;
    }
    drv.finish()?;

    if let Some(c) = &drv.collector {
        let last = c
            .rows
            .last()
            .ok_or_else(|| anyhow!("no epoch was recorded"))?;
        let mut s = summary(args, &topo, d, last);
        s.set_membership(&c.history);
        write_summary(&peer.out, &s)?;
    }
    if let Some(r) = last_report {
        info!(
            accuracy = r.test_accuracy,
            refused_frames = drv.refused_frames,
            "peer finished"
        );
    }
    Ok(())
}

/// Puts a checkpoint's BatchNorm running statistics (`[s]`; none saved before checkpoint
/// version 3: the model keeps its own) back into `net`.
///
/// # Errors
/// They do not fit the model.
fn restore_running_state<B: AutodiffBackend>(net: Net<B>, s: &[f32]) -> anyhow::Result<Net<B>> {
    if s.is_empty() {
        return Ok(net);
    }
    model::unflatten_running_state(net, s)
        .context("--resume: the checkpoint's BatchNorm statistics do not fit the model")
}

impl Driver {
    /// Peer 0: tells the bootstrap of each new peer whose first round this peer has
    /// reached, so that it lets the next new peer in.
    fn settle_joins(&mut self) {
        let round = self.gossip.round();
        let Some(tx) = &self.settle else {
            return;
        };
        self.settling.retain(|&(rank, at)| {
            let done = round >= at;
            if done {
                let _ = tx.send(rank);
            }
            !done
        });
    }

    /// Sends every frame the state machine has queued.
    fn transmit(&mut self) -> anyhow::Result<()> {
        while let Some(t) = self.gossip.poll_transmit(&mut self.send_buf) {
            let link = self
                .links
                .get(&t.to)
                .ok_or_else(|| anyhow!("no link to out-neighbour {}", t.to))?;
            // Hand the buffer over instead of copying it; the next poll_transmit refills a new one.
            let frame = Bytes::from(std::mem::take(&mut self.send_buf));
            if let Err(e) = self.rt.block_on(link.send(frame)) {
                // The link's task ended: its connection was lost.
                let round = self.gossip.round();
                self.on_departure(t.to, format!("{e:#}"), self.rank, round)?;
            }
        }
        Ok(())
    }

    /// `--inject-bad-frames`: sends five malformed frames to every destination (see
    /// [`RunArgs::inject_bad_frames`]) for a model of `d` parameters at round `round`.
    fn inject_bad_frames(&mut self, round: u64, d: usize) -> anyhow::Result<()> {
        let header = |payload_len: u32, round: u64| {
            let mut f = Vec::new();
            FrameHeader {
                kind: FrameKind::Gossip,
                sender: self.rank,
                round,
                dim: d as u32,
                payload_len,
            }
            .emit(&mut f);
            f
        };
        let identity = |value: f32| {
            let mut out = Vec::new();
            let mut rng = StdRng::seed_from_u64(0);
            murmur_compress::Identity.compress(&vec![value; d], &mut rng, &mut out);
            out
        };
        let garbage = vec![0xFFu8; 64];
        let mut truncated = header(1000, round);
        truncated.extend_from_slice(&[0u8; 10]);
        let mut oversized = header(u32::MAX, round);
        oversized.extend_from_slice(&[0u8; 8]);
        let nan_msg = identity(f32::NAN);
        let mut nan = header(nan_msg.len() as u32, round);
        nan.extend_from_slice(&nan_msg);
        let ok_msg = identity(0.0);
        let mut late = header(ok_msg.len() as u32, round + 1000);
        late.extend_from_slice(&ok_msg);
        let frames = [garbage, truncated, oversized, nan, late].map(Bytes::from);
        for link in self.links.values() {
            for f in &frames {
                self.rt.block_on(link.send(f.clone()))?;
            }
        }
        Ok(())
    }

    /// Feeds network events to the state machine until the round has mixed.
    fn wait_mixed(&mut self) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            // Handling a frame may queue frames (all-reduce steps, server replies).
            self.transmit()?;
            while let Some(ev) = self.gossip.poll_event() {
                match ev {
                    GossipEvent::Mixed { .. } => return Ok(()),
                    GossipEvent::RoundTimedOut { round, missing } => bail!(
                        "round {round} timed out after {:.0} s waiting for peers {missing:?}",
                        start.elapsed().as_secs_f64()
                    ),
                    GossipEvent::Diverged { round, reason } => {
                        bail!("training diverged in round {round}: {reason} (try a smaller --lr or --gamma)")
                    }
                    other => debug!(?other, "gossip event"),
                }
            }
            let deadline = self
                .gossip
                .poll_timeout()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
            if !self.next_event(deadline)? {
                self.gossip.handle_timeout(Instant::now());
            }
        }
    }

    /// Handles the network events that are already queued, without blocking, and sends
    /// what they caused. Events of the state machine are left for [`Driver::wait_mixed`].
    fn serve_ready(&mut self) -> anyhow::Result<()> {
        while let Ok(ev) = self.events.try_recv() {
            self.handle_net_event(ev)?;
            self.transmit()?;
        }
        Ok(())
    }

    /// Waits for one network event until `deadline` and handles it. Returns `false` if
    /// the deadline passed first.
    fn next_event(&mut self, deadline: Instant) -> anyhow::Result<bool> {
        let ev = self.rt.block_on(async {
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), self.events.recv())
                .await
        });
        let ev = match ev {
            Err(_) => return Ok(false),
            Ok(None) => bail!("the data plane stopped"),
            Ok(Some(ev)) => ev,
        };
        self.handle_net_event(ev)?;
        Ok(true)
    }

    /// Peer `gone` left the run (`reason`, noticed by peer `noticed_by`): re-weights W
    /// without the departed peers (Metropolis–Hastings on the surviving graph), tells the
    /// algorithm, stops sending to and waiting for `gone`, and passes the news on to every
    /// peer this one has a link to, so that every survivor uses the same W'. Known
    /// departures are ignored.
    ///
    /// # Errors
    /// `gone` is peer 0 (the metrics collector), W' cannot be formed (a directed topology)
    /// or the algorithm cannot continue without a peer.
    fn on_departure(
        &mut self,
        gone: Rank,
        reason: String,
        noticed_by: Rank,
        noticed_round: u64,
    ) -> anyhow::Result<()> {
        self.departure(gone, reason, noticed_by, noticed_round, false)
    }

    /// [`Driver::on_departure`]; with `hello`, the departure is noticed through the hello of
    /// the peer's new process, whose connection (the newest from it) stays open.
    fn departure(
        &mut self,
        gone: Rank,
        reason: String,
        noticed_by: Rank,
        noticed_round: u64,
        hello: bool,
    ) -> anyhow::Result<()> {
        // A notice older than the peer's latest return is about its previous process.
        let back_at = self
            .rejoined
            .iter()
            .filter(|(r, _)| *r == gone)
            .map(|(_, at)| *at)
            .max();
        if gone == self.rank
            || self.departed.contains_key(&gone)
            || back_at.is_some_and(|at| noticed_round < at)
        {
            return Ok(());
        }
        let round = self.gossip.round();
        if gone == 0 {
            bail!("peer 0 (the bootstrap, which collects the metrics) left the run during round {round}: {reason}");
        }
        warn!(
            gone,
            round, noticed_by, "peer {gone} left the run: {reason}"
        );
        let record = MembershipEvent {
            event: "left".into(),
            peer: gone,
            round,
            epoch: self.epoch,
            wall_seconds: self.started.elapsed().as_secs_f64(),
            noticed_by,
            reason: reason.clone(),
        };
        self.departed.insert(gone, record.clone());
        let all_gone: Vec<Rank> = self.departed.keys().copied().collect();
        let (surviving, components) = self.surviving(&all_gone).map_err(|e| {
            anyhow!("peer {gone} left the run during round {round} ({reason}) and the survivors cannot re-weight: {e}")
        })?;
        if let Some(split) = components {
            warn!(
                "the surviving graph is DISCONNECTED after peer {gone} left ({split}): each \
                 part trains on by itself and the peers will not reach consensus"
            );
        }
        self.gossip
            .peer_left(gone, &surviving)
            .map_err(|e| {
                anyhow!(
                    "peer {gone} left the run during round {round} ({reason}); {} cannot go on without it: {e}",
                    self.algorithm
                )
            })?;
        self.drop_links(gone, hello);
        self.broadcast(&encode_leave(self.rank, noticed_round, gone, &reason), &[]);
        if let Some(c) = self.collector.as_mut() {
            c.membership(record, None)?;
        }
        Ok(())
    }

    /// The mixing matrix for the survivors once the peers in `gone` have left, and, if the
    /// surviving graph is not (strongly) connected, a description of its parts. Algorithms that re-weight get
    /// Metropolis–Hastings on the surviving graph; push-sum keeps W (it only stops pushing
    /// to the departed), and its parts are told by strong connectivity of W's support.
    ///
    /// # Errors
    /// A re-weighting algorithm on a directed topology.
    fn surviving(
        &self,
        gone: &[Rank],
    ) -> Result<(MixingMatrix, Option<String>), murmur_topology::TopologyError> {
        if self.gossip.reweights() {
            let s = self.w.without_peers(gone)?;
            let split = (!s.is_connected()).then(|| format!("components {:?}", s.components));
            Ok((s.w, split))
        } else {
            let split = (!self.w.graph().strongly_connected_without(gone)).then(|| {
                let alive: Vec<Rank> = (0..self.w.n()).filter(|r| !gone.contains(r)).collect();
                format!("the survivors {alive:?} are not strongly connected: push-sum shares cannot reach every one of them")
            });
            Ok((self.w.clone(), split))
        }
    }

    /// Closes the link to `gone` and its connections to us (all, or all but the newest with
    /// `keep_newest`), and stops expecting anything of it.
    fn drop_links(&mut self, gone: Rank, keep_newest: bool) {
        if let Some(link) = self.links.remove(&gone) {
            link.abandon();
        }
        self.plane.forget(gone, keep_newest);
        self.destinations.remove(&gone);
        self.expected_in.remove(&gone);
    }

    /// Sends `frame` on every link except those to `skip` (best effort: a failing link is
    /// reported by the data plane on its own).
    fn broadcast(&self, frame: &[u8], skip: &[Rank]) {
        let frame = Bytes::copy_from_slice(frame);
        for (&to, link) in self.links.iter().filter(|(to, _)| !skip.contains(to)) {
            if let Err(e) = self.rt.block_on(link.send(frame.clone())) {
                debug!(to, "could not send a membership notice: {e:#}");
            }
        }
    }

    /// A restarted peer `from` says hello with its new data-plane address: if it was still
    /// counted as a member it has left (its old process is gone); open a link to it and
    /// answer with this peer's round, the departed peers and x.
    fn on_hello(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let info: PeerInfo = match serde_json::from_slice(payload) {
            Ok(i @ PeerInfo { rank, .. }) if rank == from => i,
            _ => {
                self.refused_frames += 1;
                warn!(from, "dropped a malformed hello");
                return Ok(());
            }
        };
        // The old process's connections are closed; the hello came on the newest one.
        if self.departed.contains_key(&from) {
            self.plane.forget(from, true);
        } else {
            let round = self.gossip.round();
            let reason = "it restarted: a new process said hello".to_string();
            self.departure(from, reason, self.rank, round, true)?;
        }
        if !self.link_to(from, info.data_addr) {
            return Ok(());
        }
        let welcome = Welcome {
            round: self.gossip.round(),
            departed: self
                .departed
                .keys()
                .copied()
                .filter(|&r| r != from)
                .collect(),
        };
        let frame = encode_with_params(
            FrameKind::Welcome,
            self.rank,
            welcome.round,
            &welcome,
            self.gossip.params(),
        )?;
        info!(from, round = welcome.round, "welcomed a restarted peer");
        self.send_to(from, frame)
    }

    /// The ranks of an elastic run that nobody has taken yet (`empty`) are out of the run
    /// from the start: the algorithm mixes without them, nothing is sent to or awaited from
    /// them, and peer 0 records them in `membership.jsonl` (event `empty`). They come in
    /// later through [`Driver::on_admit`] and a rejoin.
    ///
    /// # Errors
    /// The algorithm cannot go on without a peer, or W cannot be re-weighted.
    fn start_without(&mut self, empty: &[Rank]) -> anyhow::Result<()> {
        if empty.is_empty() {
            return Ok(());
        }
        let (w, split) = self.surviving(empty)?;
        if let Some(split) = split {
            warn!("the graph of the initial peers is DISCONNECTED ({split}): the parts train apart until the empty ranks join");
        }
        for &g in empty {
            self.gossip
                .peer_left(g, &w)
                .map_err(|e| anyhow!("{} cannot start without peer {g}: {e}", self.algorithm))?;
            self.expected_in.remove(&g);
            let record = MembershipEvent {
                event: "empty".into(),
                peer: g,
                round: 0,
                epoch: 0,
                wall_seconds: 0.0,
                noticed_by: self.rank,
                reason: "not taken yet: the run started with --initial-peers".into(),
            };
            self.departed.insert(g, record.clone());
            if let Some(c) = self.collector.as_mut() {
                c.membership(record, None)?;
            }
        }
        info!(empty = ?empty, "elastic run: starting without the empty ranks");
        Ok(())
    }

    /// A new peer with identity `id` took the empty rank `rank` (told by peer `from`; by
    /// peer 0's bootstrap when `from` is this peer, which then signs the notice): admit its
    /// identity to the data plane and pass the notice on once. Refused (counted) for a rank
    /// that is not empty here, or without peer 0's signature (`signature`, Ed25519 over
    /// [`admit_message`]): a member cannot admit an identity on its own.
    fn on_admit(
        &mut self,
        rank: Rank,
        id: libp2p::PeerId,
        signature: Vec<u8>,
        from: Rank,
    ) -> anyhow::Result<()> {
        if self.peer_ids.get(rank).copied().flatten() == Some(id) {
            return Ok(());
        }
        let signature = match &self.admit_signer {
            Some(key) if from == self.rank => key
                .sign(&admit_message(rank, &id))
                .map_err(|e| anyhow!("signing an admission: {e}"))?,
            _ => signature,
        };
        let signed = self.peer_ids[0]
            .as_ref()
            .and_then(auth::public_key)
            .is_some_and(|k| k.verify(&admit_message(rank, &id), &signature));
        if !signed {
            self.refused_frames += 1;
            warn!(
                from,
                rank, "dropped an admission for rank {rank} that peer 0 did not sign"
            );
            return Ok(());
        }
        let empty = self.departed.get(&rank).is_some_and(|e| e.event == "empty");
        if !empty || rank == self.rank {
            self.refused_frames += 1;
            warn!(
                from,
                rank, "dropped an admission for rank {rank}, which is not an empty rank here"
            );
            return Ok(());
        }
        info!(rank, %id, "a new peer takes rank {rank}");
        self.peer_ids[rank] = Some(id);
        self.admitted.admit_all([(id, rank)]);
        self.broadcast(&encode_admit(self.rank, rank, id, &signature), &[from]);
        Ok(())
    }

    /// Opens a link to the restarted peer `to` at its new data-plane address `addr` (its
    /// PeerId is checked) and counts it as a destination again. `false` (logged) if the
    /// connection failed.
    fn link_to(&mut self, to: Rank, addr: SocketAddr) -> bool {
        let Some(id) = self.peer_ids[to] else {
            warn!(
                to,
                "cannot connect to peer {to}: its identity is not known here"
            );
            return false;
        };
        match self.rt.block_on(self.plane.connect(to, addr, id)) {
            Ok(link) => {
                self.links.insert(to, link);
                self.destinations.insert(to);
                self.links_done.remove(&to);
                true
            }
            Err(e) => {
                warn!(to, "cannot connect to the restarted peer: {e:#}");
                false
            }
        }
    }

    /// Sends one frame on the link to `to`.
    fn send_to(&self, to: Rank, frame: Vec<u8>) -> anyhow::Result<()> {
        let link = self
            .links
            .get(&to)
            .ok_or_else(|| anyhow!("no link to peer {to}"))?;
        self.rt.block_on(link.send(Bytes::from(frame)))
    }

    /// Peer `back` mixes again from round `at` (told by `from`): re-weight with it, admit
    /// it if it is a neighbour (opening a link to its new address `addr` if this peer sends
    /// to it and its hello did not come here: a directed graph), and pass the news on.
    /// Handled once per (peer, round).
    fn on_rejoin(
        &mut self,
        back: Rank,
        at: u64,
        addr: SocketAddr,
        from: Rank,
    ) -> anyhow::Result<()> {
        if back == self.rank || self.rejoined.contains(&(back, at)) {
            return Ok(());
        }
        self.rejoined.push((back, at));
        let still_gone: Vec<Rank> = self
            .departed
            .keys()
            .copied()
            .filter(|&r| r != back)
            .collect();
        let (w, _) = self.surviving(&still_gone)?;
        if let Err(e) = self.gossip.peer_rejoined(back, &w, at) {
            warn!(
                back,
                at, "peer {back} asked to mix again from round {at} and was not admitted: {e}"
            );
            return Ok(());
        }
        info!(back, at, "peer {back} rejoins the run from round {at}");
        let new = self
            .departed
            .remove(&back)
            .is_some_and(|e| e.event == "empty");
        if new && self.settle.is_some() {
            self.settling.push((back, at));
        }
        if new && !self.departed.values().any(|e| e.event == "empty") {
            // Every rank is taken: a stranger is refused at once again.
            self.admitted.set_open(false);
        }
        if self.gossip.out_peers().contains(&back) && !self.links.contains_key(&back) {
            self.link_to(back, addr);
        }
        if self.gossip.in_peers().contains(&back) || self.rank == 0 {
            self.expected_in.insert(back);
            self.finished_in.remove(&back);
        }
        self.broadcast(&encode_rejoin(self.rank, back, at, addr), &[back, from]);
        if let Some(c) = self.collector.as_mut() {
            let record = MembershipEvent {
                event: if new { "joined" } else { "rejoined" }.into(),
                peer: back,
                round: at,
                epoch: self.epoch,
                wall_seconds: self.started.elapsed().as_secs_f64(),
                noticed_by: back,
                reason: if new {
                    format!("a new peer; mixes from round {at}")
                } else {
                    format!("restarted; mixes again from round {at}")
                },
            };
            c.membership(record, Some(at))?;
        }
        Ok(())
    }

    /// A restarted peer's way back into the run: hello to every peer it has a link to
    /// (`me`: its new directory entry), their welcomes (round, departed peers, x), then the
    /// round it mixes again from — the highest round heard plus [`REJOIN_MARGIN_ROUNDS`],
    /// so that every neighbour learns it before beginning it — announced to all, and a wait
    /// until every in-neighbour has sent its frame for that round. Destinations it could not
    /// connect to (`unreachable`) must be among the departed peers of the welcomes.
    /// Returns that round and the mean x of the in-neighbours that answered.
    ///
    /// # Errors
    /// No welcome within `timeout`, a peer unreachable that the run still counts, the run
    /// ending before the agreed round (`total_rounds`), or no in-neighbour answering.
    fn rejoin(
        &mut self,
        me: &PeerInfo,
        unreachable: BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        timeout: Duration,
    ) -> anyhow::Result<(u64, Vec<f32>)> {
        let hello = encode_hello(self.rank, me)?;
        for &to in self.links.keys() {
            self.send_to(to, hello.clone())?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let waiting: Vec<Rank> = self
                .links
                .keys()
                .copied()
                .filter(|r| !self.welcomes.contains_key(r))
                .collect();
            if waiting.is_empty() {
                break;
            }
            if !self.next_event(deadline)? {
                bail!("--resume: no answer from peers {waiting:?} within {timeout:?}");
            }
        }
        let departed: BTreeSet<Rank> = self
            .welcomes
            .values()
            .flat_map(|(w, _)| w.departed.iter().copied())
            .filter(|&r| r != self.rank)
            .collect();
        if let Some((r, e)) = unreachable.iter().find(|(r, _)| !departed.contains(r)) {
            bail!("--resume: cannot reach peer {r}, which the run still counts as a member: {e:#}");
        }
        let at = self
            .welcomes
            .values()
            .map(|(w, _)| w.round)
            .max()
            .unwrap_or(0)
            + REJOIN_MARGIN_ROUNDS;
        if at >= total_rounds {
            bail!(
                "--resume: the run ends at round {total_rounds}, too soon to rejoin at round {at}"
            );
        }
        // This peer's view of the membership: the departed peers are forgotten.
        let (survivors, _) = self.surviving(&departed.iter().copied().collect::<Vec<_>>())?;
        for &g in &departed {
            self.gossip.peer_left(g, &survivors)?;
            self.drop_links(g, false);
            // An empty rank stays known as empty (a new peer may still take it).
            self.departed.entry(g).or_insert(MembershipEvent {
                event: "left".into(),
                peer: g,
                round: at,
                epoch: 0,
                wall_seconds: 0.0,
                noticed_by: self.rank,
                reason: "gone when this peer rejoined".into(),
            });
        }
        self.gossip.start_at_round(at)?;
        // Every peer that welcomed us opened a link to us and says goodbye on it at the end.
        let welcomed: Vec<Rank> = self
            .welcomes
            .keys()
            .copied()
            .filter(|r| !departed.contains(r))
            .collect();
        self.expected_in.extend(welcomed);
        let in_peers: Vec<Rank> = self
            .gossip
            .in_peers()
            .into_iter()
            .filter(|r| !departed.contains(r))
            .collect();
        let xs: Vec<&[f32]> = in_peers
            .iter()
            .filter_map(|r| self.welcomes.get(r).map(|(_, x)| x.as_slice()))
            .collect();
        if xs.is_empty() {
            bail!("--resume: none of the in-neighbours {in_peers:?} answered");
        }
        let (_, mean) = consensus_distance(xs.iter().copied());
        self.rejoined.push((self.rank, at));
        self.first_frames = Some((at, HashSet::new()));
        self.broadcast(&encode_rejoin(self.rank, self.rank, at, me.data_addr), &[]);
        info!(at, neighbours = ?in_peers, "rejoining: mixing again from round {at}");
        // Begin only when every in-neighbour of that round is at it: its frame for it is here.
        let in_peers = self.gossip.in_peers_at(at);
        loop {
            let arrived = self
                .first_frames
                .as_ref()
                .map(|(_, f)| f.clone())
                .unwrap_or_default();
            if in_peers.iter().all(|r| {
                // Not waited for: a departed peer, or one that (re)joins after this round.
                arrived.contains(r)
                    || self.departed.contains_key(r)
                    || self.rejoined.iter().any(|&(p, a)| p == *r && a > at)
            }) {
                break;
            }
            let deadline = Instant::now() + timeout;
            if !self.next_event(deadline)? {
                bail!("--resume: in-neighbours {in_peers:?} did not reach round {at} within {timeout:?}");
            }
        }
        self.first_frames = None;
        Ok((at, mean))
    }

    /// Handles a `Hello`, `Welcome` or `Rejoin` frame from `from`.
    fn on_membership_frame(
        &mut self,
        from: Rank,
        header: FrameHeader,
        frame: &[u8],
    ) -> anyhow::Result<()> {
        let payload = &frame[FRAME_HEADER_LEN..];
        match header.kind {
            FrameKind::Hello => self.on_hello(from, payload),
            FrameKind::Welcome if self.first_frames.is_none() => {
                match decode_with_params::<Welcome>(payload, self.gossip.params().len()) {
                    Ok(w) => {
                        self.welcomes.insert(from, w);
                    }
                    Err(e) => {
                        self.refused_frames += 1;
                        warn!(from, "dropped a malformed welcome: {e:#}");
                    }
                }
                Ok(())
            }
            FrameKind::Admit => match decode_admit(payload) {
                Some((rank, id, signature)) if rank < self.w.n() => {
                    self.on_admit(rank, id, signature, from)
                }
                _ => {
                    self.refused_frames += 1;
                    warn!(from, "dropped a malformed admission notice");
                    Ok(())
                }
            },
            FrameKind::Rejoin => match decode_rejoin(payload) {
                Some((back, at, addr)) if back < self.w.n() => self.on_rejoin(back, at, addr, from),
                _ => {
                    self.refused_frames += 1;
                    warn!(from, "dropped a malformed rejoin notice");
                    Ok(())
                }
            },
            other => {
                self.refused_frames += 1;
                warn!(from, ?other, "dropped an unexpected frame");
                Ok(())
            }
        }
    }

    /// Handles one network event.
    fn handle_net_event(&mut self, ev: NetEvent) -> anyhow::Result<()> {
        match ev {
            NetEvent::Frame {
                from,
                header,
                bytes,
            } if matches!(
                header.kind,
                FrameKind::Hello | FrameKind::Welcome | FrameKind::Rejoin | FrameKind::Admit
            ) =>
            {
                self.on_membership_frame(from, header, &bytes)?;
            }
            NetEvent::Joined {
                rank,
                peer_id,
                data_addr: _,
            } => self.on_admit(rank, peer_id, Vec::new(), self.rank)?,
            NetEvent::Frame { from, .. } if self.departed.contains_key(&from) => {
                debug!(from, "dropped a frame of a peer that has left");
            }
            NetEvent::Frame {
                from,
                header,
                bytes,
            } => match header.kind {
                FrameKind::Gossip
                | FrameKind::PushSum
                | FrameKind::Reduce
                | FrameKind::Push
                | FrameKind::Pull
                | FrameKind::Skip => {
                    if let Some((at, arrived)) = self.first_frames.as_mut() {
                        if header.round == *at {
                            arrived.insert(from);
                        }
                    }
                    match self.gossip.handle_message(Instant::now(), from, &bytes) {
                        Ok(()) => {}
                        // A straggler's frame of a round both ends mixed without: late, not bad.
                        Err(murmur_gossip::GossipError::Skipped { round, .. }) => {
                            debug!(from, round, "dropped the frame of a skipped round")
                        }
                        Err(e) => {
                            self.refused_frames += 1;
                            warn!(from, "dropped an algorithm frame: {e}");
                        }
                    }
                }
                FrameKind::Report => match self.collector.as_mut() {
                    Some(c) => {
                        if let Err(e) = c.add_frame(from, &bytes[FRAME_HEADER_LEN..]) {
                            self.refused_frames += 1;
                            warn!(from, "dropped a report: {e:#}");
                        }
                    }
                    None => {
                        self.refused_frames += 1;
                        warn!(from, "dropped a report sent to a peer other than 0");
                    }
                },
                FrameKind::Leave => match decode_leave(&bytes[FRAME_HEADER_LEN..]) {
                    Some((gone, reason)) if gone < self.w.n() => {
                        self.on_departure(gone, reason, from, header.round)?;
                    }
                    _ => {
                        self.refused_frames += 1;
                        warn!(from, "dropped a malformed departure notice");
                    }
                },
                other => {
                    self.refused_frames += 1;
                    warn!(from, ?other, "dropped an unexpected frame");
                }
            },
            NetEvent::Finished { from } => {
                self.finished_in.insert(from);
            }
            NetEvent::LinkDone { to } => {
                self.links_done.insert(to);
            }
            NetEvent::Lost { peer, reason } if self.departed.contains_key(&peer) => {
                // The new process of a peer that was restarting is gone as well.
                debug!(
                    peer,
                    "lost the connection to a departed peer's new process: {reason}"
                );
                self.drop_links(peer, false);
            }
            NetEvent::Lost { peer, reason } => {
                // Harmless once nothing more is owed either way on that peer's links.
                let owes_us = self.expected_in.contains(&peer) && !self.finished_in.contains(&peer);
                let we_owe = self.destinations.contains(&peer) && !self.links_done.contains(&peer);
                if owes_us || we_owe {
                    let round = self.gossip.round();
                    self.on_departure(peer, reason, self.rank, round)?;
                }
            }
            NetEvent::Refused { peer, reason } => {
                self.refused_frames += 1;
                // The data plane logged it when it refused it.
                debug!(?peer, "refused a frame: {reason}");
            }
        }
        Ok(())
    }

    /// Sends this epoch's report (metrics and x) to rank 0, or records it on rank 0.
    fn report(&mut self, report: PeerEpoch, x: &[f32]) -> anyhow::Result<()> {
        if let Some(c) = self.collector.as_mut() {
            return c.add(report, x.to_vec());
        }
        let frame = encode_report(self.rank, &report, x)?;
        let link = self
            .links
            .get(&0)
            .ok_or_else(|| anyhow!("no link to peer 0"))?;
        self.rt.block_on(link.send(Bytes::from(frame)))
    }

    /// Says goodbye on every link and waits until every expected peer said goodbye to us
    /// and every link was closed by its receiver.
    fn finish(&mut self) -> anyhow::Result<()> {
        self.links.clear(); // each sender task now sends its goodbye
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self.destinations.is_subset(&self.links_done)
            && self.expected_in.is_subset(&self.finished_in))
        {
            if !self.next_event(deadline)? {
                let missing: Vec<_> = self.expected_in.difference(&self.finished_in).collect();
                let unacknowledged: Vec<_> =
                    self.destinations.difference(&self.links_done).collect();
                warn!(
                    ?missing,
                    ?unacknowledged,
                    "shutdown timed out; exiting anyway"
                );
                break;
            }
        }
        self.rt
            .block_on(self.plane.shutdown(Duration::from_secs(2)));
        Ok(())
    }
}

/// A departure notice: the 24-byte frame header (kind `Leave`, round = the round at which the
/// departure was first noticed, kept as the notice is passed on), then
/// `gone: u64 LE | reason (UTF-8)`.
fn encode_leave(sender: Rank, round: u64, gone: Rank, reason: &str) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + 8 + reason.len());
    FrameHeader {
        kind: FrameKind::Leave,
        sender,
        round,
        dim: 0,
        payload_len: (8 + reason.len()) as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(gone as u64).to_le_bytes());
    frame.extend_from_slice(reason.as_bytes());
    frame
}

/// Inverse of [`encode_leave`] for the payload: (gone, reason); `None` if malformed.
fn decode_leave(payload: &[u8]) -> Option<(Rank, String)> {
    let gone = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let reason = std::str::from_utf8(&payload[8..]).ok()?;
    Some((usize::try_from(gone).ok()?, reason.to_string()))
}

/// A hello: the 24-byte frame header (kind `Hello`), then the JSON of the sender's new
/// directory entry.
fn encode_hello(sender: Rank, me: &PeerInfo) -> anyhow::Result<Vec<u8>> {
    let json = serde_json::to_vec(me)?;
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + json.len());
    FrameHeader {
        kind: FrameKind::Hello,
        sender,
        round: 0,
        dim: 0,
        payload_len: json.len() as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&json);
    Ok(frame)
}

/// An admission notice: the 24-byte frame header (kind `Admit`), then `rank: u64 LE |
/// peer_id: UTF-8` (a new peer with that libp2p identity took that empty rank).
fn encode_admit(sender: Rank, rank: Rank, id: libp2p::PeerId, signature: &[u8]) -> Vec<u8> {
    let id = id.to_bytes();
    let len = 8 + 2 + id.len() + signature.len();
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + len);
    FrameHeader {
        kind: FrameKind::Admit,
        sender,
        round: 0,
        dim: 0,
        payload_len: len as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(rank as u64).to_le_bytes());
    frame.extend_from_slice(&(id.len() as u16).to_le_bytes());
    frame.extend_from_slice(&id);
    frame.extend_from_slice(signature);
    frame
}

/// Inverse of [`encode_admit`] for the payload `rank: u64 | id_len: u16 | PeerId bytes |
/// peer 0's signature`: (rank, identity, signature); `None` if malformed.
fn decode_admit(payload: &[u8]) -> Option<(Rank, libp2p::PeerId, Vec<u8>)> {
    if payload.len() < 10 || payload.len() > 10 + 128 + 128 {
        return None;
    }
    let rank = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let id_len = u16::from_le_bytes(payload[8..10].try_into().ok()?) as usize;
    let id = libp2p::PeerId::from_bytes(payload.get(10..10 + id_len)?).ok()?;
    let signature = payload[10 + id_len..].to_vec();
    Some((usize::try_from(rank).ok()?, id, signature))
}

/// What peer 0 signs to admit identity `id` to rank `rank`.
fn admit_message(rank: Rank, id: &libp2p::PeerId) -> Vec<u8> {
    let mut m = b"murmur admit v1\n".to_vec();
    m.extend_from_slice(&(rank as u64).to_le_bytes());
    m.extend_from_slice(&id.to_bytes());
    m
}

/// The rounds of peer 0's checkpoints (`rounds`) that a whole run can resume from without a
/// hole in its record: a round R in an epoch whose predecessors' rows are all in
/// `<run>/epochs.jsonl` (R / `rpe` ≤ the last recorded epoch E), or the last round of
/// epoch E + 1, whose row the resumed run records again. All of `rounds`, with a warning,
/// if none qualifies.
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

/// A rejoin notice: the 24-byte frame header (kind `Rejoin`), then `back: u64 LE | at: u64
/// LE | addr: UTF-8` (peer `back` mixes again from round `at`; its new data-plane address
/// `addr`, e.g. `127.0.0.1:5001`, for peers that push to it but were not told by a hello).
fn encode_rejoin(sender: Rank, back: Rank, at: u64, addr: SocketAddr) -> Vec<u8> {
    let addr = addr.to_string();
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + 16 + addr.len());
    FrameHeader {
        kind: FrameKind::Rejoin,
        sender,
        round: at,
        dim: 0,
        payload_len: (16 + addr.len()) as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(back as u64).to_le_bytes());
    frame.extend_from_slice(&at.to_le_bytes());
    frame.extend_from_slice(addr.as_bytes());
    frame
}

/// Inverse of [`encode_rejoin`] for the payload: (back, at, addr); `None` if malformed.
fn decode_rejoin(payload: &[u8]) -> Option<(Rank, u64, SocketAddr)> {
    if payload.len() < 16 || payload.len() > 16 + 64 {
        return None;
    }
    let back = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let at = u64::from_le_bytes(payload[8..16].try_into().ok()?);
    let addr = std::str::from_utf8(&payload[16..]).ok()?.parse().ok()?;
    Some((usize::try_from(back).ok()?, at, addr))
}

/// A report frame (kind `Report`, round = epoch): see [`encode_with_params`].
fn encode_report(sender: Rank, report: &PeerEpoch, x: &[f32]) -> anyhow::Result<Vec<u8>> {
    encode_with_params(FrameKind::Report, sender, report.epoch as u64, report, x)
}

/// A frame of `kind` carrying a JSON value and parameters: the 24-byte frame header, then
/// the payload `json_len: u32 LE | JSON of value | a murmur_compress identity message of
/// x: [d]` (reports, welcomes).
fn encode_with_params<T: Serialize>(
    kind: FrameKind,
    sender: Rank,
    round: u64,
    value: &T,
    x: &[f32],
) -> anyhow::Result<Vec<u8>> {
    let json = serde_json::to_vec(value)?;
    let mut payload = Vec::with_capacity(4 + json.len() + 16 + 4 * x.len());
    payload.extend_from_slice(&(json.len() as u32).to_le_bytes());
    payload.extend_from_slice(&json);
    // Identity draws no randomness; the RNG only satisfies the trait.
    let mut rng = StdRng::seed_from_u64(0);
    murmur_compress::Identity.compress(x, &mut rng, &mut payload);
    let mut frame = FrameHeader {
        kind,
        sender,
        round,
        dim: x.len() as u32,
        payload_len: payload.len() as u32,
    }
    .to_bytes()
    .to_vec();
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Inverse of [`encode_report`] for the payload (see [`decode_with_params`]).
fn decode_report(payload: &[u8], d: usize) -> anyhow::Result<(PeerEpoch, Vec<f32>)> {
    decode_with_params(payload, d)
}

/// Inverse of [`encode_with_params`] for the payload; refuses truncation, bad JSON, a
/// parameter vector of another length than `d` and non-finite values.
fn decode_with_params<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    d: usize,
) -> anyhow::Result<(T, Vec<f32>)> {
    let json_len = payload
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| anyhow!("report truncated"))?;
    let json = payload
        .get(4..4 + json_len)
        .ok_or_else(|| anyhow!("report truncated"))?;
    let value: T = serde_json::from_slice(json).context("JSON part")?;
    let mut x = vec![0.0f32; d];
    murmur_compress::decode_into(&payload[4 + json_len..], &mut x).context("parameters")?;
    Ok((value, x))
}

/// Each peer's squared distance to the mean of the reporting peers at the end of an epoch (a
/// line of `distances.jsonl`, written by peer 0): the per-peer terms of Ξ².
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PeerDistances {
    epoch: usize,
    /// ‖x_i − x̄‖² by rank; `null` for a peer that did not report (it had left).
    distances: Vec<Option<f64>>,
}

/// ‖x_i − x̄‖² for each present slot, x̄ the mean of the present ones.
fn peer_distances(slots: &[Option<Reported>]) -> Vec<Option<f64>> {
    let (_, mean) = consensus_distance(slots.iter().flatten().map(|(_, x)| x.as_slice()));
    slots
        .iter()
        .map(|s| {
            s.as_ref().map(|(_, x)| {
                x.iter()
                    .zip(&mean)
                    .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                    .sum()
            })
        })
        .collect()
}

/// A peer's report for an epoch and its parameters x: [d].
pub(crate) type Reported = (PeerEpoch, Vec<f32>);

/// Rank 0's aggregation of the per-epoch reports into [`EpochRow`]s.
struct Collector {
    n: usize,
    d: usize,
    dir: PathBuf,
    kind: model::ModelKind,
    test: Dataset,
    /// Reports by epoch, one slot per peer.
    pending: BTreeMap<usize, Vec<Option<Reported>>>,
    /// Peers that left, with the epoch from which their reports are awaited again
    /// (`usize::MAX` until they rejoin): an epoch is complete without the others.
    absent: BTreeMap<Rank, usize>,
    /// The membership events, in order.
    history: Vec<MembershipEvent>,
    /// Rounds per epoch, to place a rejoin round in its epoch.
    rounds_per_epoch: u64,
    rows: Vec<EpochRow>,
    /// A whole run resumed: the last row the earlier process(es) recorded, whose running
    /// totals (bytes, seconds, refused and skipped frames, wall time) the new rows continue
    /// from, so that the record and the summary cover the whole run. The rounds between
    /// that row and the checkpoint resumed from are not counted twice, nor at all.
    carried: Option<EpochRow>,
    /// When peer 0 started training.
    started: Instant,
}

impl Collector {
    /// Peers whose report for the oldest incomplete epoch has not arrived.
    fn missing_reporters(&self) -> Vec<Rank> {
        match self.pending.iter().next() {
            Some((&e, slots)) => (0..self.n)
                .filter(|&r| slots[r].is_none() && self.awaits(r, e))
                .collect(),
            None => (0..self.n).collect(),
        }
    }

    fn add_frame(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let (report, x) = decode_report(payload, self.d)?;
        if report.peer != from {
            bail!(
                "report claims peer {} but came from peer {from}",
                report.peer
            );
        }
        self.add(report, x)
    }

    fn add(&mut self, report: PeerEpoch, x: Vec<f32>) -> anyhow::Result<()> {
        let epoch = report.epoch;
        if report.peer >= self.n {
            bail!("report from unknown peer {}", report.peer);
        }
        if self.rows.last().is_some_and(|r| r.epoch >= epoch) {
            bail!(
                "report of peer {} for epoch {epoch}, which is already recorded",
                report.peer
            );
        }
        let slots = self
            .pending
            .entry(epoch)
            .or_insert_with(|| vec![None; self.n]);
        let p = report.peer;
        slots[p] = Some((report, x));
        self.record_complete()
    }

    /// A whole run resumed at `first_epoch`: keeps the rows of the epochs before it from
    /// `epochs.jsonl` (the later ones are recorded again) and rewrites `epochs.jsonl` and
    /// `epochs.csv` with them.
    fn keep_rows_before(&mut self, first_epoch: usize) -> anyhow::Result<()> {
        let path = self.dir.join("epochs.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut rows = Vec::new();
        for line in text.lines() {
            let row: EpochRow = serde_json::from_str(line)
                .with_context(|| format!("reading {}", path.display()))?;
            if row.epoch < first_epoch {
                rows.push(row);
            }
        }
        let mut jsonl = Vec::new();
        for r in &rows {
            jsonl.extend(serde_json::to_vec(r)?);
            jsonl.push(b'\n');
        }
        report::write_atomic(&path, &jsonl)?;
        report::write_atomic(
            &self.dir.join("epochs.csv"),
            report::to_csv(&rows)?.as_bytes(),
        )?;
        self.carried = rows.last().cloned();
        self.rows = rows;
        Ok(())
    }

    /// Whether epoch `epoch` waits for peer `r`'s report.
    fn awaits(&self, r: Rank, epoch: usize) -> bool {
        self.absent.get(&r).is_none_or(|&from| epoch >= from)
    }

    /// Records a departure (`back_at: None`) or a rejoin from round `back_at` in
    /// `membership.jsonl`. After a departure the epochs that waited only for the peer's
    /// reports are complete; after a rejoin its reports are awaited from the epoch of
    /// that round on.
    fn membership(&mut self, event: MembershipEvent, back_at: Option<u64>) -> anyhow::Result<()> {
        report::append_json_line(&self.dir.join("membership.jsonl"), &event)?;
        let from = match back_at {
            None => usize::MAX,
            Some(at) => (at / self.rounds_per_epoch.max(1)) as usize + 1,
        };
        self.absent.insert(event.peer, from);
        self.history.push(event);
        self.record_complete()
    }

    /// Aggregates, prints and writes every pending epoch that has the reports of all peers
    /// still in the run, oldest first.
    fn record_complete(&mut self) -> anyhow::Result<()> {
        let complete: Vec<usize> = self
            .pending
            .iter()
            .filter(|(&e, slots)| {
                slots
                    .iter()
                    .enumerate()
                    .all(|(r, s)| s.is_some() || !self.awaits(r, e))
            })
            .map(|(&e, _)| e)
            .collect();
        for epoch in complete {
            let slots = self.pending.remove(&epoch).unwrap_or_default();
            report::append_json_line(
                &self.dir.join("distances.jsonl"),
                &PeerDistances {
                    epoch,
                    distances: peer_distances(&slots),
                },
            )?;
            let row = self.aggregate(epoch, slots.into_iter().flatten().collect())?;
            println!("{}", report::format_row(&row));
            report::append_json_line(&self.dir.join("epochs.jsonl"), &row)?;
            self.rows.push(row);
            report::write_atomic(
                &self.dir.join("epochs.csv"),
                report::to_csv(&self.rows)?.as_bytes(),
            )?;
        }
        Ok(())
    }

    fn aggregate(&self, epoch: usize, all: Vec<Reported>) -> anyhow::Result<EpochRow> {
        let row = epoch_row(
            epoch,
            &all,
            &self.test,
            self.kind,
            self.started.elapsed().as_secs_f64(),
        )?;
        Ok(match &self.carried {
            Some(before) => continue_totals(before, row),
            None => row,
        })
    }
}

/// `row` of a resumed run with the running totals of `before` (the last row recorded before
/// the resume) added: bytes sent, compute / communicate / wait seconds, refused and skipped
/// frames and wall time continue instead of starting again from 0.
fn continue_totals(before: &EpochRow, mut row: EpochRow) -> EpochRow {
    row.bytes_sent_per_peer += before.bytes_sent_per_peer;
    row.compute_seconds += before.compute_seconds;
    row.communicate_seconds += before.communicate_seconds;
    row.wait_seconds += before.wait_seconds;
    row.refused_frames += before.refused_frames;
    row.skipped += before.skipped;
    row.wall_seconds += before.wall_seconds;
    row
}

/// The network's row for `epoch` from every peer's report and parameters: accuracy
/// spread, consensus distance Ξ², accuracy of the averaged model x̄ on `test`, and the
/// per-peer means. `wall_seconds` is the run's clock (real or simulated).
pub(crate) fn epoch_row(
    epoch: usize,
    all: &[Reported],
    test: &Dataset,
    kind: model::ModelKind,
    wall_seconds: f64,
) -> anyhow::Result<EpochRow> {
    let n = all.len() as f64;
    let (xi2, avg) = consensus_distance(all.iter().map(|(_, x)| x.as_slice()));
    let device = Default::default();
    // A fresh model: for resnet20 its BatchNorm running statistics are the initial ones
    // (mean 0, variance 1), since they are not parameters and nobody mixes them.
    let eval = model::unflatten(Net::<burn::backend::Flex>::new(kind, &device), &avg)?;
    let (avg_acc, _) = model::evaluate(&eval, &test.images, &test.labels, EVAL_BATCH, &device)?;
    let acc =
        |f: fn(f64, f64) -> f64, init: f64| all.iter().map(|(r, _)| r.test_accuracy).fold(init, f);
    let mean = |g: fn(&PeerEpoch) -> f64| all.iter().map(|(r, _)| g(r)).sum::<f64>() / n;
    Ok(EpochRow {
        epoch,
        phase: all
            .first()
            .map(|(r, _)| r.phase.clone())
            .unwrap_or_default(),
        rounds: all.iter().map(|(r, _)| r.rounds).max().unwrap_or(0),
        mean_test_accuracy: mean(|r| r.test_accuracy),
        min_test_accuracy: acc(f64::min, f64::INFINITY),
        max_test_accuracy: acc(f64::max, f64::NEG_INFINITY),
        avg_model_test_accuracy: avg_acc,
        consensus_distance: xi2,
        mean_train_loss: mean(|r| r.train_loss),
        bytes_sent_per_peer: mean(|r| r.bytes_sent as f64),
        compute_seconds: mean(|r| r.compute_seconds),
        communicate_seconds: mean(|r| r.communicate_seconds),
        wait_seconds: mean(|r| r.wait_seconds),
        refused_frames: all.iter().map(|(r, _)| r.refused_frames).sum(),
        wall_seconds,
        peers: all.len(),
        skipped: all.iter().map(|(r, _)| r.skipped).sum(),
    })
}

/// A peer's numbers at the end of an epoch: test accuracy and loss of `eval` on `test`, and
/// the training loss — `batch_loss_mean` (the mean of the epoch's mini-batch losses), or,
/// at epoch 0 where nothing was trained, the loss of `eval` on its own `shard`.
pub(crate) fn evaluate_epoch<B: burn::tensor::backend::Backend>(
    eval: &Net<B>,
    test: &Dataset,
    shard: &Dataset,
    batch_loss_mean: Option<f64>,
    device: &B::Device,
) -> anyhow::Result<(f64, f64, f64)> {
    let (accuracy, test_loss) =
        model::evaluate(eval, &test.images, &test.labels, EVAL_BATCH, device)?;
    let train_loss = match batch_loss_mean {
        Some(l) => l,
        None => model::evaluate(eval, &shard.images, &shard.labels, EVAL_BATCH, device)?.1,
    };
    Ok((accuracy, test_loss, train_loss))
}

/// The run summary from the last epoch row.
pub(crate) fn summary(
    args: &RunArgs,
    topo: &murmur_topology::Topology,
    d: usize,
    last: &EpochRow,
) -> Summary {
    Summary {
        algorithm: args.algorithm_name(),
        compressor: args.compressor().to_string(),
        topology: args.topology_label(topo),
        peers: args.peers,
        model: args.model.to_string(),
        dim: d,
        epochs: args.epochs,
        rounds: last.rounds,
        partition: args.partition.to_string(),
        seed: args.seed,
        lambda2_abs: topo.w.second_eigenvalue_modulus(),
        spectral_gap: topo.w.spectral_gap(),
        final_mean_test_accuracy: last.mean_test_accuracy,
        final_min_test_accuracy: last.min_test_accuracy,
        final_max_test_accuracy: last.max_test_accuracy,
        final_avg_model_test_accuracy: last.avg_model_test_accuracy,
        final_consensus_distance: last.consensus_distance,
        bytes_sent_per_peer: last.bytes_sent_per_peer,
        wall_seconds: last.wall_seconds,
        seconds_per_round: last.wall_seconds / (last.rounds.max(1) as f64),
        samples_per_second: (args.peers * args.batch_size) as f64 * last.rounds as f64
            / last.wall_seconds.max(f64::MIN_POSITIVE),
        departures: String::new(),
        rejoins: String::new(),
        joins: String::new(),
        outcome: report::COMPLETED.to_string(),
        peer_failures: String::new(),
        restarts: String::new(),
    }
}

/// Writes `summary.json` and `summary.csv` into `dir` and prints the summary line.
pub(crate) fn write_summary(dir: &Path, summary: &Summary) -> anyhow::Result<()> {
    report::save_summary(dir, summary)?;
    println!("{}", report::summary_line(summary));
    println!("run folder: {}", dir.display());
    Ok(())
}

/// Path of the run folder's bootstrap address file.
pub fn bootstrap_file(run_dir: &Path) -> PathBuf {
    run_dir.join("bootstrap.addr")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_run_continues_the_running_totals_of_its_record() {
        let before = EpochRow {
            epoch: 3,
            rounds: 30,
            bytes_sent_per_peer: 300.0,
            compute_seconds: 3.0,
            communicate_seconds: 6.0,
            wait_seconds: 2.0,
            refused_frames: 1,
            skipped: 4,
            wall_seconds: 9.0,
            mean_test_accuracy: 0.5,
            ..EpochRow::default()
        };
        let after = EpochRow {
            epoch: 4,
            rounds: 40,
            bytes_sent_per_peer: 100.0,
            compute_seconds: 1.0,
            communicate_seconds: 2.0,
            wait_seconds: 0.5,
            refused_frames: 2,
            skipped: 1,
            wall_seconds: 3.5,
            mean_test_accuracy: 0.75,
            ..EpochRow::default()
        };
        let row = continue_totals(&before, after);
        assert_eq!(
            (row.epoch, row.rounds),
            (4, 40),
            "counters, not totals, stay"
        );
        assert_eq!(row.mean_test_accuracy, 0.75, "a measurement is not summed");
        assert_eq!(row.bytes_sent_per_peer, 400.0);
        assert_eq!(
            (
                row.compute_seconds,
                row.communicate_seconds,
                row.wait_seconds
            ),
            (4.0, 8.0, 2.5)
        );
        assert_eq!((row.refused_frames, row.skipped), (3, 5));
        assert_eq!(row.wall_seconds, 12.5);
    }

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

    fn report() -> PeerEpoch {
        PeerEpoch {
            peer: 3,
            epoch: 2,
            phase: "dpsgd".into(),
            rounds: 64,
            train_loss: 0.5,
            test_accuracy: 0.9,
            test_loss: 0.3,
            bytes_sent: 1000,
            bytes_received: 999,
            compute_seconds: 1.5,
            communicate_seconds: 2.5,
            wait_seconds: 0.5,
            refused_frames: 0,
            skipped: 0,
            wall_seconds: 4.0,
        }
    }

    #[test]
    fn report_frames_round_trip() {
        let x = [1.0f32, -2.5, 3.25];
        let frame = encode_report(3, &report(), &x).unwrap();
        let (h, payload) = FrameHeader::parse(&frame, 1 << 20).unwrap();
        assert_eq!(
            (h.kind, h.sender, h.round, h.dim),
            (FrameKind::Report, 3, 2, 3)
        );
        let (r, y) = decode_report(payload, 3).unwrap();
        assert_eq!((r.peer, r.epoch, r.bytes_sent), (3, 2, 1000));
        assert_eq!(y, x);
    }

    #[test]
    fn an_admission_holds_only_with_peer_0s_signature() {
        let peer0 = libp2p::identity::Keypair::generate_ed25519();
        let member = libp2p::identity::Keypair::generate_ed25519();
        let new = libp2p::PeerId::random();
        let key0 =
            auth::public_key(&peer0.public().to_peer_id()).expect("Ed25519 PeerIds inline the key");
        let signature = peer0.sign(&admit_message(3, &new)).unwrap();
        let frame = encode_admit(2, 3, new, &signature);
        let h = FrameHeader::parse(&frame, 1 << 20).unwrap().0;
        assert_eq!((h.kind, h.sender), (FrameKind::Admit, 2));
        let (rank, id, sig) = decode_admit(&frame[FRAME_HEADER_LEN..]).unwrap();
        assert_eq!((rank, id), (3, new));
        assert!(key0.verify(&admit_message(rank, &id), &sig));
        // A member's own signature, another rank, or no signature: refused.
        let forged = member.sign(&admit_message(3, &new)).unwrap();
        assert!(!key0.verify(&admit_message(3, &new), &forged));
        assert!(!key0.verify(&admit_message(4, &new), &sig));
        assert!(!key0.verify(&admit_message(3, &new), &[]));
        // Malformed payloads.
        let payload = &frame[FRAME_HEADER_LEN..];
        assert!(decode_admit(&payload[..9]).is_none());
        let mut long_id = payload.to_vec();
        long_id[8..10].copy_from_slice(&500u16.to_le_bytes());
        assert!(decode_admit(&long_id).is_none());
        assert!(decode_admit(&[0u8; 300]).is_none());
    }

    #[test]
    fn membership_notices_round_trip_and_malformed_ones_are_refused() {
        let leave = encode_leave(2, 57, 5, "connection from peer 5: timed out");
        let (h, payload) = FrameHeader::parse(&leave, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender, h.round), (FrameKind::Leave, 2, 57));
        assert_eq!(
            decode_leave(payload),
            Some((5, "connection from peer 5: timed out".to_string()))
        );
        assert_eq!(decode_leave(&payload[..7]), None, "truncated rank");
        assert_eq!(
            decode_leave(&[5, 0, 0, 0, 0, 0, 0, 0, 0xff]),
            None,
            "not UTF-8"
        );

        let addr: SocketAddr = "127.0.0.1:5001".parse().unwrap();
        let rejoin = encode_rejoin(1, 3, 193, addr);
        let (h, payload) = FrameHeader::parse(&rejoin, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender, h.round), (FrameKind::Rejoin, 1, 193));
        assert_eq!(decode_rejoin(payload), Some((3, 193, addr)));
        assert_eq!(decode_rejoin(&payload[..15]), None);
        assert_eq!(decode_rejoin(&payload[..20]), None, "a cut address");

        let me = PeerInfo {
            rank: 3,
            peer_id: "12D3KooW".into(),
            data_addr: "127.0.0.1:5001".parse().unwrap(),
        };
        let hello = encode_hello(3, &me).unwrap();
        let (h, payload) = FrameHeader::parse(&hello, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender), (FrameKind::Hello, 3));
        let back: PeerInfo = serde_json::from_slice(payload).unwrap();
        assert_eq!((back.rank, back.data_addr), (3, me.data_addr));

        let welcome = Welcome {
            round: 150,
            departed: vec![6],
        };
        let frame = encode_with_params(FrameKind::Welcome, 2, 150, &welcome, &[0.5, -1.0]).unwrap();
        let (w, x): (Welcome, Vec<f32>) =
            decode_with_params(&frame[FRAME_HEADER_LEN..], 2).unwrap();
        assert_eq!((w.round, w.departed, x), (150, vec![6], vec![0.5, -1.0]));
        assert!(decode_with_params::<Welcome>(&frame[FRAME_HEADER_LEN..], 3).is_err());
    }

    #[test]
    fn each_peer_distance_is_measured_from_the_mean_of_those_present() {
        let present = |x: Vec<f32>| Some((report(), x));
        let d = peer_distances(&[present(vec![0.0, 0.0]), None, present(vec![2.0, 4.0])]);
        // Mean (1, 2): each present peer is 1 + 4 = 5 away; the absent one has none.
        assert_eq!(d, vec![Some(5.0), None, Some(5.0)]);
    }

    #[test]
    fn bad_report_payloads_are_refused() {
        let frame = encode_report(3, &report(), &[1.0, 2.0]).unwrap();
        let payload = &frame[FRAME_HEADER_LEN..];
        assert!(decode_report(payload, 3).is_err(), "another d");
        assert!(
            decode_report(&payload[..payload.len() - 1], 2).is_err(),
            "truncated x"
        );
        assert!(decode_report(&payload[..10], 2).is_err(), "truncated JSON");
        assert!(
            decode_report(&[0xff, 0xff, 0xff, 0xff], 2).is_err(),
            "JSON length past the end"
        );
        let nan = encode_report(3, &report(), &[1.0, f32::NAN]).unwrap();
        assert!(
            decode_report(&nan[FRAME_HEADER_LEN..], 2).is_err(),
            "non-finite x"
        );
    }
}
