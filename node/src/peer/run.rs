//! The training loop of one peer: wiring, start or resume, the rounds, the epoch reports.

use super::*;
use crate::config::AlgorithmSpec;
use crate::train::optim::{HeavyBall, Optimizer};

pub(super) fn run_on<B: AutodiffBackend>(
    args: &RunArgs,
    peer: &PeerArgs,
    device: B::Device,
) -> anyhow::Result<()> {
    let Start {
        n,
        joins,
        assigned,
        mut rank,
        resumable,
        initial,
    } = plan(args, peer)?;
    let span = info_span!("peer", peer = tracing::field::Empty);
    if !assigned {
        span.record("peer", rank);
    }
    let _span = span.enter();
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

    let mut optimizer = HeavyBall::new(args.momentum, d);
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
        optimizer.restore(c.velocity)?;
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
            optimizer.restore(c.velocity)?;
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
            // The optimizer's direction (heavy ball: v ← μ v + g); D-PSGD then applies
            // x ← Σ W x − η v.
            optimizer.step(&grad);
            let t1 = Instant::now();
            compute_s += (t1 - t0).as_secs_f64();

            if overlap {
                drv.wait_mixed()?;
                drv.gossip.apply_gradient(optimizer.direction());
                communicate_s += t0.elapsed().as_secs_f64();
            } else {
                drv.gossip
                    .begin_round(Instant::now(), &x, Some(optimizer.direction()));
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
                    velocity: optimizer.state(),
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

/// How this peer enters the run, decided from the options alone (no I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Start {
    /// n, the run's peer count.
    pub n: usize,
    /// Whether it joins through a bootstrap (given, or found with mDNS); peer 0 does not.
    pub joins: bool,
    /// Whether the bootstrap assigns its rank (no `--rank`).
    pub assigned: bool,
    /// Its rank (a placeholder 1 until an assigned rank is known).
    pub rank: Rank,
    /// What `--resume` can do for the run's algorithm.
    pub resumable: Resumable,
    /// The peers the run starts with (`--initial-peers`, else n).
    pub initial: usize,
}

/// Checks the options of `murmur peer` against each other and decides how the peer enters.
///
/// # Errors
/// One message per contradiction: a rank out of range, a rank ≥ 1 without a bootstrap,
/// `--resume` without `--rank` or for an algorithm that cannot resume, an elastic run of an
/// algorithm that cannot take a peer in, `--join-running` on peer 0.
pub(super) fn plan(args: &RunArgs, peer: &PeerArgs) -> anyhow::Result<Start> {
    let n = args.peers;
    // Without --rank, a joining peer learns its rank from the bootstrap; until then it
    // goes by a placeholder that nothing keeps.
    // A peer joins through a bootstrap it is given or finds with mDNS; peer 0 is one.
    let joins = !peer.bootstrap.is_empty() || peer.mdns && peer.rank != Some(0);
    let assigned = peer.rank.is_none() && joins;
    let rank = peer.rank.unwrap_or(if assigned { 1 } else { 0 });
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
            "--resume works for {} runs, not {}",
            AlgorithmSpec::names_where(|a| a.resumable(false) != Resumable::No),
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
            "an elastic run (--initial-peers, --join-running) needs an algorithm that takes a \
             peer in mid-run: {} (without --straggler-policy skip), not {}",
            AlgorithmSpec::names_where(|a| a.resumable(false) == Resumable::Rejoin),
            args.algorithm_name()
        );
    }
    if peer.join_running && rank == 0 {
        bail!("--join-running: peer 0 starts the run; it cannot join it");
    }
    Ok(Start {
        n,
        joins,
        assigned,
        rank,
        resumable,
        initial,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        peer: PeerArgs,
    }

    fn plan_of(args: &[&str]) -> anyhow::Result<Start> {
        let cli = Cli::try_parse_from(
            ["peer", "--out", "unused"]
                .into_iter()
                .chain(args.iter().copied()),
        )?;
        plan(&cli.run, &cli.peer)
    }

    fn refusal(args: &[&str]) -> String {
        format!("{:#}", plan_of(args).unwrap_err())
    }

    #[test]
    fn peer_0_starts_the_run_and_the_others_join_it() {
        let p = plan_of(&["--peers", "4", "--rank", "0"]).unwrap();
        assert_eq!(
            (p.rank, p.joins, p.assigned, p.initial),
            (0, false, false, 4)
        );
        let p = plan_of(&[
            "--peers",
            "4",
            "--rank",
            "2",
            "--bootstrap",
            "/ip4/127.0.0.1/udp/1/quic-v1",
        ])
        .unwrap();
        assert_eq!((p.rank, p.joins, p.assigned), (2, true, false));
        let p = plan_of(&[
            "--peers",
            "4",
            "--bootstrap",
            "/ip4/127.0.0.1/udp/1/quic-v1",
        ])
        .unwrap();
        assert!(
            p.assigned && p.joins,
            "no --rank: the bootstrap assigns one"
        );
        let p = plan_of(&["--peers", "4", "--rank", "0", "--initial-peers", "2"]).unwrap();
        assert_eq!(p.initial, 2);
        assert_eq!(p.resumable, Resumable::Rejoin);
    }

    #[test]
    fn contradictory_options_are_refused_with_the_reason() {
        let boot = "/ip4/127.0.0.1/udp/1/quic-v1";
        assert!(refusal(&["--peers", "4", "--rank", "4"]).contains("ranks are 0 to 3"));
        assert!(refusal(&["--peers", "4", "--rank", "1"]).contains("needs --bootstrap"));
        assert!(
            refusal(&["--peers", "4", "--rank", "0", "--bootstrap", boot])
                .contains("peer 0 is the bootstrap")
        );
        assert!(refusal(&["--peers", "4", "--bootstrap", boot, "--resume"])
            .contains("--resume needs --rank"));
        assert!(refusal(&[
            "--peers",
            "4",
            "--rank",
            "0",
            "--algorithm",
            "allreduce",
            "--resume"
        ])
        .contains("not allreduce"));
        assert!(
            refusal(&["--peers", "4", "--rank", "0", "--initial-peers", "5"])
                .contains("must be in 1..=4")
        );
        assert!(refusal(&[
            "--peers",
            "4",
            "--rank",
            "0",
            "--initial-peers",
            "2",
            "--algorithm",
            "ps"
        ])
        .contains("elastic run"));
        assert!(refusal(&["--peers", "4", "--rank", "0", "--join-running"])
            .contains("peer 0 starts the run"));
        assert!(refusal(&["--peers", "1", "--bootstrap", boot]).contains("only rank 0"));
    }
}
