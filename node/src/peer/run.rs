//! One peer's run, in phases: join (data plane, discovery, identity), wire (the algorithm,
//! the links, the driver), enter (start, resume or rejoin), train (the rounds and the epoch
//! reports), finish (the last reports, the summary).

use super::core::catch_up::Vector;
use super::*;
use crate::report::PeerTotals;
use crate::train::inner_optimizer::Optimizer;
use crate::train::learner::Learner;
use murmur_gossip::round::Round;

pub(super) fn run_on<B: AutodiffBackend>(
    args: &RunArgs,
    peer: &PeerArgs,
    device: B::Device,
) -> anyhow::Result<()> {
    let start = plan(args, peer)?;
    let span = info_span!("peer", peer = tracing::field::Empty);
    if !start.assigned {
        span.record("peer", start.rank);
    }
    let _span = span.enter();
    let topo = args.topology()?;
    std::fs::create_dir_all(peer.out.join("peers"))
        .with_context(|| format!("cannot create the run folder {}", peer.out.display()))?;

    // Data: the same seeded split on every peer; this peer keeps its shard (once its rank
    // is known).
    let data = RunData::load(
        args.train.model,
        args.train.data.as_deref(),
        args.train.seed,
    )?;
    // The model sized for the data's images (`--model cnn --data <CIFAR-10>`: 3×32×32).
    let args = &args.fitted_to(&data.train);
    let shards = partition(
        &data.train.labels,
        start.n,
        args.train.partition,
        args.train.seed,
    )?;
    let rounds_per_epoch = args.train.rounds_per_epoch.unwrap_or_else(|| {
        (data.train.len() as u64).div_ceil((start.n * args.train.batch_size) as u64)
    });
    let (mut net, mut x) = init_model::<B>(args, &device, start.rank)?;
    let fingerprint = fingerprint(args, &topo, x.len(), rounds_per_epoch);
    let joined = join(args, peer, &start, (&fingerprint, &topo), x.len())?;
    let rank = joined.me.rank;
    span.record("peer", rank);
    if rank != start.rank && args.train.init == Init::Independent {
        (net, x) = init_model::<B>(args, &device, rank)?;
    }
    // Keep only this peer's shard of the training set (a CIFAR-10 training set is 154 MB of
    // bytes, a token file 4 bytes a token): the whole set is dropped here.
    let RunData { train, test } = data;
    // Shared with the collector, which peer 0 has and another peer makes when it stands in.
    let test = std::sync::Arc::new(test);
    let shard = train.subset(&shards[rank]);
    drop(train);
    info!(d = x.len(), shard = shard.len(), rounds_per_epoch, topology = %topo.name, "peer starting");

    let (mut drv, unreachable) = wire(
        args,
        peer,
        (rank, joined.parts),
        &topo,
        (&net, &x),
        &test,
        rounds_per_epoch,
    )?;
    let mut optimizer = args.optimizer(x.len());
    let (first_round, carried) = enter(
        args,
        peer,
        &start,
        &mut drv,
        &joined.me,
        unreachable,
        joined.resume_round,
        joined.checkpoints,
        rounds_per_epoch,
        (&mut net, &mut x, optimizer.as_mut()),
    )?;
    // A whole run resumed at an epoch's last round records that epoch's row again (its
    // reports may not all have reached peer 0 before the run stopped).
    let first_epoch = match first_round {
        0 => 0,
        r if joined.resume_round.is_some() && r.is_multiple_of(rounds_per_epoch) => {
            (r / rounds_per_epoch) as usize
        }
        r => (r / rounds_per_epoch) as usize + 1,
    };
    let peer_log = peer.out.join("peers").join(format!("peer-{rank}.jsonl"));
    if peer.rejoin_running {
        // A restarted peer 0 takes up the record where its previous process left it.
        if let Some(c) = drv.collector.as_mut() {
            let departed = drv.core.membership.departed().clone();
            let back = drv.core.membership.rejoins_heard().clone();
            let collects_only = first_round >= rounds_per_epoch * args.train.epochs as u64;
            c.rejoined(
                first_round,
                (&departed, &back),
                collects_only,
                &drv.core.record_copy,
            )?;
        }
        drv.share_record()?;
        report::keep_peer_epochs_before(&peer_log, first_epoch)?;
    } else if first_epoch > 0 {
        if let Some(c) = drv.collector.as_mut() {
            c.keep_rows_before(first_epoch, carried.map(|t| t.wall_seconds))?;
        }
        drv.share_record()?;
        report::keep_peer_epochs_before(&peer_log, first_epoch)?;
    }

    // The mini-batch order of a resumed peer differs from the one before its stop.
    let seed = args
        .train
        .seed
        .wrapping_add(1 + rank as u64)
        .wrapping_add(first_round.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut training = Training {
        args,
        rank,
        learner: Learner::new(
            shard,
            args.train.batch_size,
            seed,
            optimizer,
            args.schedule(rounds_per_epoch),
            first_round,
        ),
        has_running_state: {
            let mut s = Vec::new();
            model::flatten_running_state(&net, &mut s);
            !s.is_empty()
        },
        net,
        x,
        drv,
        device,
        test: &test,
        fingerprint,
        checkpoint_path: checkpoint::path(&peer.out, rank),
        peer_log,
        rounds_per_epoch,
        first_round,
        carried: carried.unwrap_or_default(),
        times: Times::default(),
        started: Instant::now(),
        next: None,
    };
    training.drv.core.started = training.started;
    if rank == 0 {
        println!("{}", report::table_header());
    }
    // Epoch 0 trains nothing: it records the starting point (x⁰, Ξ²(0)). A peer that
    // rejoined starts within the epoch of its first round.
    let mut last_report = None;
    for epoch in first_epoch..=args.train.epochs {
        last_report = Some(training.epoch(epoch)?);
    }
    training.finish(&topo, &peer.out)?;
    // Links of others through this peer's relay may still be finishing.
    let drv = &training.drv;
    drv.rt.block_on(drv.relay.linger(rank));
    if let Some(r) = last_report {
        info!(
            accuracy = r.test_accuracy,
            refused_frames = training.drv.core.refused_frames,
            "peer finished"
        );
    }
    Ok(())
}

/// A peer's model and its flat parameters `x: [d]`: with `--init same` every peer draws the
/// same x⁰ from the seed, with `--init independent` from seed + rank; with `--init-from`
/// every peer reads it from that file.
///
/// # Errors
/// `--init-from`'s file cannot be read or does not fit the model.
fn init_model<B: AutodiffBackend>(
    args: &RunArgs,
    device: &B::Device,
    rank: Rank,
) -> anyhow::Result<(Net<B>, Vec<f32>)> {
    B::seed(
        device,
        match args.train.init {
            Init::Same => args.train.seed,
            Init::Independent => args.train.seed.wrapping_add(rank as u64),
        },
    );
    let mut net = Net::<B>::new(args.train.model, device);
    if let Some(path) = &args.train.init_from {
        net = model::load_safetensors(net, path)?;
    }
    let mut x = Vec::new();
    model::flatten(&net, &mut x);
    Ok((net, x))
}

/// What every peer of the run must agree on (checked by the bootstrap, kept in checkpoints).
fn fingerprint(
    args: &RunArgs,
    topo: &murmur_topology::Topology,
    d: usize,
    rounds_per_epoch: u64,
) -> Fingerprint {
    Fingerprint {
        peers: args.peers,
        topology: args.topology_label(topo),
        model: args.train.model.to_string(),
        dim: d,
        algorithm: args.algorithm_name(),
        compressor: args.compressor_label(),
        epochs: args.train.epochs,
        rounds_per_epoch,
        seed: args.train.seed,
        partition: args.train.partition.to_string(),
        protocol: args.protocol_options(),
    }
}

/// A peer that has joined the run: who it is, what it found, and the network it holds.
struct Joined {
    /// This peer as the run knows it (its rank is final).
    me: PeerInfo,
    /// For a whole run resuming from checkpoints: the round all peers continue from.
    resume_round: Option<u64>,
    /// With `--resume`: this peer's checkpoints (the latest and the one before).
    checkpoints: Vec<Checkpoint>,
    parts: Parts,
}

/// The network a joined peer holds, handed to [`wire`].
struct Parts {
    rt: tokio::runtime::Runtime,
    plane: DataPlane,
    events: mpsc::Receiver<NetEvent>,
    key: libp2p::identity::Keypair,
    admitted: Admitted,
    directory: crate::control::discovery::Directory,
    max_payload: u32,
    /// How this peer gets relayed links.
    relay: crate::control::discovery::RelayClient,
    /// Where its discovery learns that a new peer mixes with the run.
    settle: tokio::sync::mpsc::UnboundedSender<Rank>,
    /// Where its discovery learns the lowest rank it counts in the run.
    lowest_live: tokio::sync::watch::Sender<Rank>,
    /// Where discovery learns where peers that came back are.
    relocated: tokio::sync::mpsc::UnboundedSender<PeerInfo>,
    /// A new peer admitted by member m other than peer 0: m, which counted every lower
    /// rank gone (their directory entries name dead processes): those are not dialled but
    /// taken as unreachable, and the welcomes say they left.
    admitted_by: Option<Rank>,
}

/// Binds the data plane, loads the identity and the checkpoints, and joins the run through
/// discovery (peer 0: starts it). A peer without `--rank` learns its rank here.
fn join(
    args: &RunArgs,
    peer: &PeerArgs,
    start: &Start,
    (fingerprint, topo): (&Fingerprint, &murmur_topology::Topology),
    d: usize,
) -> anyhow::Result<Joined> {
    let Start {
        joins,
        assigned,
        rank,
        initial,
        ..
    } = *start;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // Payload limit: the model as f32 plus generous room for headers and the report JSON.
    let max_payload = u32::try_from(8 * d + (1 << 20)).unwrap_or(u32::MAX);
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
            args.timeouts(),
            &key,
            admitted.clone(),
        )
    })?;
    // Under `murmur launch`: the launcher's notices of exited peer processes.
    super::supervisor::listen(plane.event_sender(), plane.exits(), args.peers);
    plane.emulation = args.link_emulation();
    plane.transport = args.net.transport;
    plane.set_wire(args.net.wire);
    plane.tcp_streams = args.net.tcp_streams;
    let mut me = PeerInfo {
        rank,
        peer_id: String::new(),
        data_addr: address::published(plane.local_addr, &peer.bootstrap, &peer.listen)?,
        nat_published: None,
        incarnation: plane.incarnation(),
        control: Vec::new(),
    };
    let checkpoints = if peer.resume {
        let path = checkpoint::path(&peer.out, rank);
        let all = Checkpoint::load_all(&path, fingerprint, d)?;
        if all.is_empty() {
            warn!(path = %path.display(), "no checkpoint");
        }
        all
    } else {
        Vec::new()
    };
    let checkpoint_rounds: Vec<u64> = checkpoints.iter().map(|c| c.meta.round).collect();
    if peer.mdns
        && !joins
        && peer.listen.iter().any(|p| {
            matches!(p, libp2p::multiaddr::Protocol::Ip4(a) if a.is_loopback())
                || matches!(p, libp2p::multiaddr::Protocol::Ip6(a) if a.is_loopback())
        })
    {
        warn!(listen = %peer.listen, "--mdns with a loopback --listen address: only peers on this machine can reach the bootstrap (listen on the LAN, e.g. /ip4/0.0.0.0/udp/4001/quic-v1)");
    }
    // Every peer tells its discovery when a new peer mixes with the run and which is the
    // lowest rank it counts in the run (for the new peers it admits), and where peers that
    // came back are (for the directory it serves).
    let (settle, settled) = tokio::sync::mpsc::unbounded_channel();
    let (lowest_live, lowest_live_rx) = tokio::sync::watch::channel(0);
    let (relocated, relocations) = tokio::sync::mpsc::unbounded_channel();
    let admitting = Admitting {
        joined: plane.event_sender(),
        settled,
        lowest_live: lowest_live_rx,
        neighbours: (0..args.peers).map(|r| topo.graph.neighbors(r)).collect(),
    };
    let role = match joins {
        false => Role::Bootstrap {
            initial,
            admitting,
            resume: (peer.resume && !peer.rejoin_running).then(|| {
                resumable_rounds(&checkpoint_rounds, &peer.out, fingerprint.rounds_per_epoch)
            }),
            running: peer
                .rejoin_running
                .then(|| {
                    crate::control::discovery::load_directory(
                        &directory_file(&peer.out),
                        args.peers,
                    )
                })
                .transpose()?,
            directory_file: Some(directory_file(&peer.out)),
            // Peer 0 relays the links that hole punching cannot open.
            relay: (!args.net.no_relay)
                .then(|| Relay::new(plane.local_addr.ip(), me.data_addr.ip())),
            members: peer.bootstrap.clone(),
        },
        true => Role::Join {
            bootstrap: peer.bootstrap.clone(),
            rejoin: peer.resume || peer.join_running,
            checkpoint_rounds,
            any_rank: assigned,
            relay: (!args.net.no_relay).then(|| plane.local_addr.ip()),
            admitting,
        },
    };
    let gate = Gate {
        // Every member admits new peers while the ranks below it are away.
        allow: (args.net.allow_peers.as_ref())
            .map(|path| auth::read_allow_list(path))
            .transpose()?,
        key: args
            .net
            .run_key
            .as_deref()
            .map(auth::RunKey::read)
            .transpose()?,
    };
    let listen = Listen {
        addr: peer.listen.clone(),
        files: [
            peer.bootstrap_file.clone().filter(|_| !joins),
            peer.address_file.clone(),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    let (
        Discovered {
            rank: given,
            directory,
            resume_round,
            answered_by,
        },
        relay,
    ) = rt.block_on(discover(
        role,
        listen,
        me.clone(),
        fingerprint.clone(),
        Duration::from_secs(args.net.join_timeout_secs),
        key.clone(),
        gate,
        peer.mdns,
        relocations,
    ))?;
    if assigned {
        me.rank = given;
        plane.set_rank(given);
        if peer.identity.is_none() {
            auth::save_identity(&auth::key_path(&peer.out, given), &key)?;
        }
        info!(rank = given, "the bootstrap gave this peer rank {given}");
    } else if given != rank {
        bail!("the bootstrap's directory has this peer as rank {given}, not {rank}");
    }
    // This peer as the others see it: behind a NAT, at the address the bootstrap saw (which
    // a restarted peer's hello must give its neighbours, not its own interface's).
    if let Some(entry) = directory.get(given).and_then(Option::as_ref) {
        me.data_addr = entry.data_addr;
        me.nat_published = entry.nat_published;
        plane.set_behind_nat(me.nat_published.is_some());
    }
    Ok(Joined {
        me,
        resume_round,
        checkpoints,
        parts: Parts {
            rt,
            plane,
            events,
            key,
            admitted,
            directory,
            max_payload,
            relay,
            settle,
            lowest_live,
            relocated,
            // A member that answers a new peer admitted it (a restarted one it only takes
            // back).
            admitted_by: answered_by.filter(|_| peer.join_running && !peer.resume),
        },
    })
}

/// Builds the algorithm's state machine, opens the links (to every peer it sends to, and to
/// peer 0 for the metrics reports) and the driver around them. Returns the driver and, for
/// a rejoining peer, the destinations it could not reach (the run's answer says which left).
#[allow(clippy::too_many_arguments)]
fn wire<B: AutodiffBackend>(
    args: &RunArgs,
    peer: &PeerArgs,
    (rank, parts): (Rank, Parts),
    topo: &murmur_topology::Topology,
    (net, x): (&Net<B>, &[f32]),
    test: &std::sync::Arc<crate::train::data::Dataset>,
    rounds_per_epoch: u64,
) -> anyhow::Result<(Driver, BTreeMap<Rank, anyhow::Error>)> {
    let Parts {
        rt,
        plane,
        events,
        key,
        admitted,
        directory,
        max_payload,
        relay,
        settle,
        lowest_live,
        relocated,
        admitted_by,
    } = parts;
    let away = |to: Rank| admitted_by.is_some_and(|m| to < m);
    let n = args.peers;
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
        algo::Host::Network,
        args,
        topo,
        rank,
        x.to_vec(),
        &model::tensor_lengths(net),
        max_payload,
        rounds_per_epoch,
    )?;
    let mut destinations: Vec<Rank> = gossip.out_peers();
    if rank != 0 && !destinations.contains(&0) {
        destinations.push(0);
    }
    // A restarted peer 0 links to every peer: its hello and rejoin notice reach each one
    // directly, also peers that are finishing the run and relay nothing more, which then
    // link back to it and send it the reports they kept.
    if rank == 0 && peer.rejoin_running {
        destinations = (1..n).collect();
    }
    // A rejoining peer may find some destinations gone; the run's answer says which.
    // Empty ranks of an elastic run have no entry.
    let targets: Vec<(Rank, &PeerInfo, libp2p::PeerId)> = destinations
        .iter()
        .filter(|&&to| !away(to))
        .filter_map(|&to| Some((to, directory[to].as_ref()?, peer_ids[to]?)))
        .collect();
    let mut expected_in: HashSet<Rank> = gossip.in_peers().into_iter().collect();
    if rank == 0 {
        expected_in.extend(1..n);
    }
    let incoming: Vec<Rank> = expected_in.iter().copied().collect();
    let (links, mut unreachable) = rt.block_on(links::open(
        &plane,
        &relay,
        (rank, directory[rank].as_ref()),
        &targets,
        &incoming,
        peer.resume || peer.join_running,
    ))?;
    // Taken as unreachable without a dial (which would wait out the handshake time-out of a
    // dead process); the welcomes then say that they left.
    for &to in destinations.iter().filter(|&&to| away(to)) {
        if let (Some(member), Some(_)) = (admitted_by, &directory[to]) {
            info!(
                to,
                "not dialling peer {to}: peer {member}, which admitted this peer, counts it gone"
            );
            let why = anyhow!("peer {member}, which admitted this peer, counted it gone");
            unreachable.insert(to, why);
        }
    }
    let setup = super::core::CoreSetup {
        rank,
        w: topo.w.clone(),
        algorithm: args.algorithm_name(),
        peer_ids,
        linked: links.keys().copied().collect(),
        expected_in: expected_in.into_iter().collect(),
        admit_signer: Some(key),
        incarnations: (0..n)
            .map(|r| match &directory[r] {
                _ if r == rank => plane.incarnation(),
                Some(p) => p.incarnation,
                None => 0,
            })
            .collect(),
        addrs: directory
            .iter()
            .map(|p| p.as_ref().map(|p| p.data_addr))
            .collect(),
        behind_nat: (directory.iter().flatten())
            .filter(|p| !p.reachable())
            .map(|p| p.rank)
            .collect(),
    };
    if rank == 0 {
        // Peer 0 acknowledges a peer's goodbye once its reports are recorded.
        plane.hold_acknowledgements();
    }
    let record = super::driver::RecordSetup {
        n,
        dir: peer.out.clone(),
        rounds_per_epoch,
        test: test.clone(),
        d: x.len(),
        kind: args.train.model,
    };
    let mut drv = Driver {
        rt,
        events,
        links,
        core: super::core::PeerCore::new(gossip, setup, Instant::now()),
        collector: (rank == 0).then(|| record.collector()),
        record_to: 0,
        record,
        early_reports: Default::default(),
        plane,
        relay,
        admitted,
        settle,
        lowest_live,
        relocated,
        kept_reports: Default::default(),
    };
    // A restarted peer 0 takes up the run's record before any report reaches it (and its
    // lock once it has rejoined); a starting one holds the record's lock from the start.
    if let Some(c) = drv.collector.as_mut() {
        match peer.rejoin_running {
            true => c.take_up()?,
            false => {
                c.lock_record(Duration::ZERO);
            }
        }
    }
    // Every peer mixes without the empty ranks of an elastic run (a peer joining the run
    // under way learns the other departed peers from its neighbours' welcomes), and knows
    // them as empty, so that it admits a new peer taking one.
    let actions = drv.core.start_without(&empty)?;
    drv.execute(actions)?;
    Ok((drv, unreachable))
}

/// Where this peer's training starts: round 0; with the whole run resuming, its checkpoint
/// of the agreed round; or, restarted or new in a run under way, its neighbours' x and
/// optimizer state (fetched in parts from several of them at once; the state only if the
/// optimizer keeps one) at a round agreed with them.
/// Sets the model, x and the optimizer's state; returns the first round and the totals
/// this peer had reported at its checkpoint (to count on from), if it resumed from one.
#[allow(clippy::too_many_arguments)]
fn enter<B: AutodiffBackend>(
    args: &RunArgs,
    peer: &PeerArgs,
    start: &Start,
    drv: &mut Driver,
    me: &PeerInfo,
    unreachable: BTreeMap<Rank, anyhow::Error>,
    resume_round: Option<u64>,
    mut checkpoints: Vec<Checkpoint>,
    rounds_per_epoch: u64,
    (net, x, optimizer): (&mut Net<B>, &mut Vec<f32>, &mut dyn Optimizer),
) -> anyhow::Result<(u64, Option<PeerTotals>)> {
    let restore = |net: &mut Net<B>, x: &[f32], model_state: &[f32]| -> anyhow::Result<()> {
        let m = model::unflatten(net.clone(), x)?;
        *net = restore_running_state(m, model_state)?;
        Ok(())
    };
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
        *x = c.x;
        optimizer.restore(c.velocity)?;
        restore(net, x, &c.model_state)?;
        drv.core.gossip.start_at_round(round)?;
        drv.core.gossip.restore_state(&c.state).with_context(|| {
            format!(
                "--resume: the checkpoint of round {round} does not fit {}",
                args.algorithm_name()
            )
        })?;
        return Ok((round, c.meta.totals));
    }
    if !(peer.resume || peer.join_running) {
        return Ok((0, None));
    }
    if start.resumable != Resumable::Rejoin {
        bail!(
            "--resume: {} cannot take one restarted peer back into a running run; restart \
             the whole run with --resume, peer 0 included, to continue from the checkpoints",
            args.algorithm_name()
        );
    }
    // A restarted peer agrees on a round with its neighbours and starts from their x and
    // optimizer state (fetched in parts from several of them): its own checkpoint's state
    // belongs to an older x, a new peer's is zero (Adam's bias correction would start over).
    let timeouts = (
        Duration::from_secs(args.net.join_timeout_secs),
        Duration::from_secs(args.net.peer_timeout_secs),
    );
    let optimizer_len = match optimizer.keeps_state() {
        true => optimizer.state().len(),
        false => 0,
    };
    let (at, fetched) = drv
        .rejoin(
            me,
            unreachable,
            rounds_per_epoch * args.train.epochs as u64,
            optimizer_len,
            timeouts,
            &|| super::run_completed(&peer.out),
        )
        .with_context(|| match peer.join_running {
            true => "--join-running: joining the run under way",
            false => "--resume: rejoining the run under way",
        })?;
    let mut fetched_state = None;
    if let Some(mut fetched) = fetched {
        *x = fetched.take(Vector::X).expect("x is always fetched");
        fetched_state = fetched.take(Vector::Optimizer);
    }
    let mut model_state = Vec::new();
    let mut totals = None;
    if let Some(c) = checkpoints.into_iter().max_by_key(|c| c.meta.round) {
        info!(round = c.meta.round, "loaded the checkpoint");
        if fetched_state.is_none() {
            optimizer.restore(c.velocity)?;
        }
        model_state = c.model_state;
        totals = c.meta.totals;
    }
    if let Some(state) = fetched_state {
        optimizer
            .restore(state)
            .context("the optimizer's state fetched from the donors")?;
    }
    restore(net, x, &model_state)?;
    Ok((at, totals))
}

/// Seconds of a peer's rounds so far: computing the step, in the round until mixed, and
/// waiting for neighbours after the step.
#[derive(Debug, Default, Clone, Copy)]
struct Times {
    compute: f64,
    communicate: f64,
    wait: f64,
}

/// A peer in training: its model, parameters, learner and driver.
struct Training<'a, B: AutodiffBackend> {
    args: &'a RunArgs,
    rank: Rank,
    net: Net<B>,
    /// This peer's parameters `x: [d]`.
    x: Vec<f32>,
    learner: Learner,
    drv: Driver,
    device: B::Device,
    test: &'a crate::train::data::Dataset,
    fingerprint: Fingerprint,
    /// Whether the model keeps state beyond its parameters (BatchNorm statistics).
    has_running_state: bool,
    checkpoint_path: PathBuf,
    peer_log: PathBuf,
    rounds_per_epoch: u64,
    /// The first round this process trains (0, or after a resume or rejoin).
    first_round: u64,
    /// What this peer had reported at the checkpoint it resumed from (zeros without one):
    /// its reports and checkpoints count on from these.
    carried: PeerTotals,
    times: Times,
    started: Instant,
    /// The next round, already begun at the end of the last one (its frames sent before the
    /// model is rebuilt from x), with the moment it began; see [`Training::round`].
    next: Option<(Round, Instant)>,
}

impl<B: AutodiffBackend> Training<'_, B> {
    /// Trains epoch `epoch` (epoch e trains rounds (e − 1)·R ..< e·R, those not done
    /// before a resume; epoch 0 none), evaluates, logs and reports it.
    fn epoch(&mut self, epoch: usize) -> anyhow::Result<PeerEpoch> {
        let r = self.rounds_per_epoch;
        let rounds = match epoch as u64 {
            0 => 0,
            e => (e * r).saturating_sub(self.first_round.max((e - 1) * r)),
        };
        self.drv.core.epoch = epoch;
        // Compressor schedules (DGC's warm-up) count training epochs from 0.
        self.drv.core.gossip.set_epoch(epoch.saturating_sub(1));
        for k in 0..rounds {
            self.round(k + 1 < rounds)
                .with_context(|| format!("epoch {epoch}"))?;
        }
        let batch_loss = self.learner.take_mean_loss();
        // The inference copy holds the latest BatchNorm statistics (Burn folds them in there).
        let eval = model::inference_copy(&self.net);
        let (test_accuracy, test_loss, train_loss) = evaluate_epoch(
            &eval,
            self.test,
            &self.learner.shard,
            batch_loss,
            &self.device,
        )?;
        let mut report = PeerEpoch {
            peer: self.rank,
            epoch,
            phase: self.args.algorithm_at(epoch).to_string(),
            rounds: self.drv.core.gossip.round(),
            train_loss,
            test_accuracy,
            test_loss,
            totals: self.totals(),
            running_state: Vec::new(),
        };
        info!(
            epoch,
            epochs = self.args.train.epochs,
            test_accuracy,
            "epoch done"
        );
        // Algorithms that choose per link (choco-auto, local-auto): what each link measured and
        // chose.
        for l in self.drv.core.gossip.link_choices() {
            let bandwidth = l
                .bytes_per_sec
                .map_or("unmeasured".to_string(), |b| format!("{:.2} MB/s", b / 1e6));
            let sent: Vec<String> = l
                .rounds_by_choice
                .iter()
                .map(|(c, k)| format!("{c}×{k}"))
                .collect();
            info!(
                "link to={} bandwidth={bandwidth} {}={} sent={}",
                l.peer,
                l.what,
                l.choice,
                sent.join(" ")
            );
        }
        // The JSON line leaves the BatchNorm statistics out; the report frame carries them.
        report::append_json_line(&self.peer_log, &report)?;
        model::flatten_running_state(&eval, &mut report.running_state);
        self.drv.report(report.clone(), &self.x)?;
        Ok(report)
    }

    /// This peer's running totals: this process's counters on top of those carried over
    /// from the checkpoint it resumed from.
    fn totals(&self) -> PeerTotals {
        let stats = self.drv.core.gossip.stats();
        let this_process = PeerTotals {
            bytes_sent: stats.bytes_sent,
            bytes_received: stats.bytes_received,
            compute_seconds: self.times.compute,
            communicate_seconds: self.times.communicate,
            wait_seconds: self.times.wait,
            wall_seconds: self.started.elapsed().as_secs_f64(),
            refused_frames: self.drv.core.refused_frames,
            skipped: stats.skipped,
        };
        this_process + self.carried
    }

    /// One round: the local step, the algorithm's exchange, the mixed parameters back into
    /// the model; then a checkpoint if one is due, and what arrived meanwhile is served.
    ///
    /// With `more` (another round of this epoch follows) and no checkpoint due, an algorithm
    /// whose frames carry x_t only (D-PSGD) begins the next round's exchange as soon as x
    /// is mixed, before the model is rebuilt from x: the frames then leave one rebuild
    /// earlier (on a 100 MB model ~0.15 s of the 2-core machine), and the time between the
    /// last frame received and the next sent is the mixing alone.
    fn round(&mut self, more: bool) -> anyhow::Result<()> {
        let args = self.args;
        // The round's protocol is the simulator's too (murmur_gossip::round): D-PSGD-like
        // algorithms send x_t before its gradient is known, overlapping the two.
        let t0 = Instant::now();
        debug!(round = self.drv.core.gossip.round(), "round begins");
        let (mut protocol, began) = match self.next.take() {
            Some(begun) => begun,
            None => (self.begin_round()?, t0),
        };
        if let Some((_, ms)) = args.slow_peer.filter(|&(r, _)| r == self.rank) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        // The optimizer's direction (heavy ball: v ← μ v + g); D-PSGD then applies
        // x ← Σ W x − η v.
        if self.drv.core.gossip.communicates_in_background() {
            // Streaming DiLoCo's fragment syncs run between rounds: serve their frames
            // while the gradient is computed on another thread.
            let (learner, net, x, device, drv) = (
                &mut self.learner,
                &self.net,
                &self.x,
                &self.device,
                &mut self.drv,
            );
            std::thread::scope(|s| -> anyhow::Result<()> {
                let step = s.spawn(|| learner.step(net, x, device));
                while !step.is_finished() {
                    drv.next_event(Instant::now() + Duration::from_millis(2))?;
                    drv.transmit()?;
                }
                step.join()
                    .map_err(|_| anyhow!("the training step panicked"))?
                    .map(|_| ())
            })?;
        } else {
            self.learner.step(&self.net, &self.x, &self.device)?;
        }
        let t1 = Instant::now();
        self.times.compute += (t1 - t0).as_secs_f64();
        let direction = Some(self.learner.direction());
        // The next round begins from this one's result at once (below) unless a checkpoint
        // or the epoch's end comes between: then parts of it may leave while this one mixes.
        // Whether the round after this one, when it is round `next`, begins at once.
        let follows = |next: u64| {
            more && !(args.checkpoint_every > 0 && next.is_multiple_of(args.checkpoint_every))
                && args.inject_bad_frames.is_none()
        };
        let next_follows = follows(protocol.number() + 1);
        let began_now = protocol.computed(
            &mut *self.drv.core.gossip,
            t1,
            &self.x,
            direction,
            next_follows,
        );
        if began_now {
            self.drv.transmit()?;
        }
        self.drv.wait_mixed()?;
        protocol.finish(&mut *self.drv.core.gossip, direction);
        let comm_start = if began_now { t1 } else { began };
        self.times.communicate += comm_start.elapsed().as_secs_f64();
        self.times.wait += t1.elapsed().as_secs_f64();
        self.x.copy_from_slice(self.drv.core.gossip.params());
        let round = self.drv.core.gossip.round();
        let checkpoint = args.checkpoint_every > 0 && round.is_multiple_of(args.checkpoint_every);
        if follows(round) {
            // Round::start begins nothing for an algorithm that does not overlap: that round
            // is then started as usual, at the top of the next call.
            let at = Instant::now();
            let next = self.begin_round()?;
            if next.overlaps() {
                self.next = Some((next, at));
            }
        }
        self.net = model::unflatten(self.net.clone(), &self.x)?;
        if checkpoint {
            self.checkpoint(round)?;
        }
        if args.inject_bad_frames == Some(self.rank) {
            self.drv.inject_bad_frames(round, self.x.len())?;
        }
        // Serve what arrived meanwhile (a parameter server answers its workers here), and the
        // requests of a catching-up peer for the optimizer's state as it is between rounds.
        self.drv.serve_ready()?;
        let (drv, learner) = (&mut self.drv, &self.learner);
        drv.serve_optimizer_state(&|| learner.optimizer_state())?;
        self.drv.settle_joins();
        Ok(())
    }

    /// Starts a round from x ([`Round::start`]); an algorithm that overlaps the exchange with
    /// the gradient sends its frames now.
    fn begin_round(&mut self) -> anyhow::Result<Round> {
        let timeout = Duration::from_secs(self.args.net.round_timeout_secs);
        let (drv, learner) = (&mut self.drv, &self.learner);
        drv.hold_for_rejoins(timeout, &|| learner.optimizer_state())?;
        let protocol = Round::start(
            &mut *self.drv.core.gossip,
            Instant::now(),
            &self.x,
            !self.args.gossip.no_overlap,
        );
        if protocol.overlaps() {
            // Frames with x_t leave while the gradient at x_t is computed.
            self.drv.transmit()?;
        }
        Ok(protocol)
    }

    /// Writes this peer's checkpoint of `round` (x, the optimizer's and the algorithm's
    /// state, BatchNorm statistics).
    fn checkpoint(&mut self, round: u64) -> anyhow::Result<()> {
        let mut model_state = Vec::new();
        if self.has_running_state {
            // Burn folds a step's statistics in when the inference copy is made; a model
            // without BatchNorm needs no copy.
            model::flatten_running_state(&model::inference_copy(&self.net), &mut model_state);
        }
        Checkpoint {
            meta: CheckpointMeta {
                rank: self.rank,
                round,
                fingerprint: self.fingerprint.clone(),
                departed: self
                    .drv
                    .core
                    .membership
                    .departed()
                    .keys()
                    .copied()
                    .collect(),
                totals: Some(self.totals()),
            },
            x: self.x.clone(),
            velocity: self.learner.optimizer_state(),
            state: self.drv.core.gossip.state(),
            model_state,
        }
        .save(&self.checkpoint_path)
    }

    /// Peer 0 waits (at most one round timeout) for every peer's final report and writes
    /// the summary; every peer says goodbye to its links.
    fn finish(&mut self, topo: &murmur_topology::Topology, out: &Path) -> anyhow::Result<()> {
        let args = self.args;
        let drv = &mut self.drv;
        let deadline = Instant::now() + Duration::from_secs(args.net.round_timeout_secs);
        while let Some(c) = drv
            .collector
            .as_ref()
            .filter(|c| c.rows.last().is_none_or(|r| r.epoch < args.train.epochs))
        {
            if Instant::now() >= deadline {
                bail!(
                    "peers {:?} sent no report for the last epochs within {} s",
                    c.missing_reporters(),
                    args.net.round_timeout_secs
                );
            }
            drv.next_event(deadline)?;
            // A parameter server still answers workers that are finishing their last rounds.
            drv.transmit()?;
        }
        // The record and the model before the goodbyes: a peer 0 that dies while saying
        // goodbye costs the run nothing.
        let wrote = self.write_record(topo, out)?;
        // A departed peer 0 is waited for as long as it takes to notice a silent peer, but
        // not longer than a supervisor's restart needs (a long timeout set for stragglers
        // must not hold every peer at the end of a run whose peer 0 is gone for good).
        let collector_wait = Duration::from_secs(args.net.peer_timeout_secs.min(10));
        let record_wait = Duration::from_secs(args.net.round_timeout_secs);
        (self.drv).finish(collector_wait, (args.train.epochs, record_wait))?;
        // This peer took up the record while it finished (it stands in for a peer 0 that
        // died after this peer's last epoch): it writes the summary and the model now.
        if !wrote {
            self.write_record(topo, out)?;
        }
        if args.train.save_peer_models {
            let path = out
                .join("peers")
                .join(format!("model-{}.safetensors", self.rank));
            crate::report::collector::write_model(
                model::inference_copy(&self.net),
                &self.x,
                &path,
            )?;
            info!(path = %path.display(), "wrote this peer's model");
        }
        Ok(())
    }

    /// The record's keeper only (`false` elsewhere): writes `summary.json`, `sample.txt`
    /// where the data set has one, and the network's mean model x̄ (`model.safetensors`).
    ///
    /// # Errors
    /// No epoch was recorded, or a file cannot be written.
    fn write_record(
        &mut self,
        topo: &murmur_topology::Topology,
        out: &Path,
    ) -> anyhow::Result<bool> {
        let args = self.args;
        let drv = &mut self.drv;
        if let Some(c) = &drv.collector {
            let last = c
                .rows
                .last()
                .ok_or_else(|| anyhow!("no epoch was recorded"))?;
            let mut s = summary(args, topo, self.x.len(), last);
            s.set_membership(&c.history);
            let eval = model::inference_copy(&self.net);
            crate::report::collector::write_sample(&eval, args, out, &self.device)?;
            write_summary(out, &s)?;
            // The trained model leaves the run: x̄ of the last epoch with the peers' mean
            // BatchNorm statistics, the model the x̄ column evaluated (after the summary,
            // which a failure here must not cost).
            let (x_bar, eval) = match &c.mean {
                Some(m) if !m.running_state.is_empty() => (
                    m.x.as_slice(),
                    model::unflatten_running_state(eval, &m.running_state)?,
                ),
                Some(m) => (m.x.as_slice(), eval),
                None => (self.x.as_slice(), eval),
            };
            let path =
                crate::report::collector::write_model(eval, x_bar, &out.join("model.safetensors"))?;
            info!(path = %path.display(), "wrote the network's mean model x̄");
            println!("run folder: {}", out.display());
            return Ok(true);
        }
        Ok(false)
    }
}

/// Puts a checkpoint's BatchNorm running statistics (`[s]`; none saved before checkpoint
/// version 3: the model keeps its own) back into `net`.
///
/// # Errors
/// They do not fit the model.
pub(super) fn restore_running_state<B: AutodiffBackend>(
    net: Net<B>,
    s: &[f32],
) -> anyhow::Result<Net<B>> {
    if s.is_empty() {
        return Ok(net);
    }
    model::unflatten_running_state(net, s)
        .context("--resume: the checkpoint's BatchNorm statistics do not fit the model")
}
