//! `murmur simulate` (training): n virtual peers train real models on one simulated network.

use super::*;

pub(super) fn run(setup: &Setup<'_>) -> anyhow::Result<()> {
    let Setup {
        args,
        sim,
        topo,
        net_model,
        dir,
    } = *setup;
    let n = args.peers;
    let device: Dev = Default::default();
    let data = RunData::load(
        args.train.model,
        args.train.data.as_deref(),
        args.train.seed,
    )?;
    let args = &args.fitted_to(&data.train);
    let rounds_per_epoch = rounds_per_epoch(args, data.train.len());

    let (peers, mut states, d) = virtual_peers(args, topo, &data, &device, rounds_per_epoch)?;
    // Byzantine peers (`--byzantine`): their messages are attacks; the reports leave them out.
    let byzantine: Vec<usize> = sim.byzantine.iter().map(|b| b.rank).collect();
    let peers: Vec<Box<dyn Gossip>> = peers
        .into_iter()
        .enumerate()
        .map(
            |(rank, p)| match sim.byzantine.iter().find(|b| b.rank == rank) {
                Some(b) => Box::new(
                    murmur_gossip::Byzantine::new(
                        p,
                        b.attack,
                        args.train.seed.wrapping_add(7919 * (rank as u64 + 1)),
                    )
                    .with_increments(sends_increments(args)),
                ) as Box<dyn Gossip>,
                None => p,
            },
        )
        .collect();
    let mut net = Some(Net::<B>::new(args.train.model, &device));
    let compute_secs = match fixed_compute_secs(sim)? {
        Some(secs) => secs,
        None => measure_step(
            net.take().ok_or_else(|| anyhow!("no model"))?,
            &states[0].shard,
            args.train.batch_size,
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
    if !byzantine.is_empty() {
        let list: Vec<String> = sim.byzantine.iter().map(|b| b.to_string()).collect();
        println!(
            "Byzantine peers: {}; accuracy, loss and Ξ² are over the {} honest peers",
            list.join(", "),
            n - byzantine.len()
        );
    }
    std::fs::create_dir_all(dir.join("peers"))?;
    for stale in ["epochs.jsonl", "epochs.csv"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    let bar = progress::bar(args.train.epochs as u64 * rounds_per_epoch, "round");
    let print = |line: String| progress::print(&bar, line);
    print(report::table_header());
    let mut rows = Vec::new();
    let started = Instant::now();
    for epoch in 0..=args.train.epochs {
        if epoch > 0 {
            sim_net.set_epoch(epoch - 1);
            let mut failure: Option<anyhow::Error> = None;
            let mut calls = 0u64;
            let result = sim_net.run_rounds(rounds_per_epoch, |rank, round, x| {
                calls += 1;
                if calls.is_multiple_of(n as u64) {
                    bar.inc(1);
                }
                let grad = match step(&mut net, &mut states[rank], x, &device) {
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
        let reports = evaluate_peers(
            &sim_net,
            &mut states,
            &mut net,
            &data.test,
            epoch,
            args,
            dir,
        )?;
        let reports: Vec<Reported> = reports
            .into_iter()
            .filter(|(r, _)| !byzantine.contains(&r.peer))
            .collect();
        let (row, _) = epoch_row(
            epoch,
            &reports,
            &data.test,
            args.train.model,
            sim_net.now_secs(),
        )?;
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
    write_summary(dir, &summary(args, topo, d, last))?;
    // The language model: a text sample from peer 0's final model.
    let x0 = sim_net
        .peer(0)
        .ok_or_else(|| anyhow!("no peer 0"))?
        .params()
        .to_vec();
    let net0 = model::unflatten(net.take().ok_or_else(|| anyhow!("no model"))?, &x0)?;
    if let Some(text) = write_sample(&model::inference_copy(&net0), args, dir, &device)? {
        println!("sample from peer 0's model:\n{text}");
    }
    Ok(())
}

/// Each virtual peer's state machine, each one's learner, and d.
type VirtualPeers = (Vec<Box<dyn Gossip>>, Vec<Learner>, usize);

/// The n virtual peers: each one's state machine (x⁰ as `murmur peer` draws it: from the
/// seed, or seed + rank with `--init independent`) and learner; and d.
fn virtual_peers(
    args: &RunArgs,
    topo: &murmur_topology::Topology,
    data: &RunData,
    device: &Dev,
    rounds_per_epoch: u64,
) -> anyhow::Result<VirtualPeers> {
    let n = args.peers;
    let shards = partition(&data.train.labels, n, args.train.partition, args.train.seed)?;
    let mut x0s = Vec::with_capacity(n);
    let mut lengths = Vec::new();
    for rank in 0..n {
        if rank == 0 || args.train.init == Init::Independent {
            let seed = match args.train.init {
                Init::Same => args.train.seed,
                Init::Independent => args.train.seed.wrapping_add(rank as u64),
            };
            <B as burn::tensor::backend::Backend>::seed(device, seed);
            let mut net = Net::<B>::new(args.train.model, device);
            if let Some(path) = &args.train.init_from {
                net = model::load_safetensors(net, path)?;
            }
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
    let mut learners = Vec::with_capacity(n);
    for (rank, x0) in x0s.into_iter().enumerate() {
        peers.push(algo::build(
            Host::Simulator,
            args,
            topo,
            rank,
            x0,
            &lengths,
            max_payload(d),
            rounds_per_epoch,
        )?);
        learners.push(Learner::new(
            data.train.subset(&shards[rank]),
            args.train.batch_size,
            args.train.seed.wrapping_add(1 + rank as u64),
            args.optimizer(d),
            args.schedule(rounds_per_epoch),
            0,
        ));
    }
    Ok((peers, learners, d))
}

/// Every virtual peer's model after `epoch` on the test split: its report (also appended to
/// `peers/peer-<rank>.jsonl`) and its parameters.
fn evaluate_peers(
    sim_net: &NetSim,
    states: &mut [Learner],
    net: &mut Option<Net<B>>,
    test: &Dataset,
    epoch: usize,
    args: &RunArgs,
    dir: &Path,
) -> anyhow::Result<Vec<Reported>> {
    let device: Dev = Default::default();
    let mut reports: Vec<Reported> = Vec::with_capacity(states.len());
    for (rank, st) in states.iter_mut().enumerate() {
        let gossip = sim_net
            .peer(rank)
            .ok_or_else(|| anyhow!("no peer {rank}"))?;
        let x = gossip.params().to_vec();
        let model_r = model::unflatten(net.take().ok_or_else(|| anyhow!("no model"))?, &x)?;
        let batch_loss = st.take_mean_loss();
        let eval = model::inference_copy(&model_r);
        let (test_accuracy, test_loss, train_loss) =
            evaluate_epoch(&eval, test, &st.shard, batch_loss, &device)?;
        *net = Some(model_r);
        let totals = sim_net.totals(rank);
        let stats = gossip.stats();
        let mut report = PeerEpoch {
            peer: rank,
            epoch,
            phase: args.algorithm_at(epoch).to_string(),
            rounds: gossip.round(),
            train_loss,
            test_accuracy,
            test_loss,
            totals: PeerTotals {
                bytes_sent: stats.bytes_sent,
                bytes_received: stats.bytes_received,
                compute_seconds: totals.compute_secs,
                communicate_seconds: totals.communicate_secs,
                wait_seconds: totals.wait_secs,
                refused_frames: 0,
                skipped: stats.skipped,
                wall_seconds: sim_net.now_secs(),
            },
            running_state: Vec::new(),
        };
        report::append_json_line(
            &dir.join("peers").join(format!("peer-{rank}.jsonl")),
            &report,
        )?;
        // The virtual peers share one model, hence its BatchNorm statistics (the inference
        // copy holds the latest); as in a peer's, they are in the report, not the JSON line.
        model::flatten_running_state(&eval, &mut report.running_state);
        reports.push((report, x));
    }
    Ok(reports)
}

/// One step of a virtual peer at parameters `x: [d]` (its learner's next mini-batch, loss
/// and gradient); returns the optimizer's direction (heavy ball: v ← μ v + g).
fn step(
    net: &mut Option<Net<B>>,
    learner: &mut Learner,
    x: &[f32],
    device: &Dev,
) -> anyhow::Result<Vec<f32>> {
    let m = model::unflatten(net.take().ok_or_else(|| anyhow!("no model"))?, x)?;
    // The model goes back into `net` before an error is returned.
    let stepped = learner.step(&m, x, device);
    *net = Some(m);
    stepped?;
    Ok(learner.direction().to_vec())
}

/// Median wall time of a forward/backward step of `net` on a batch of `st`'s shard, in
/// seconds (one warm-up step, then five timed).
fn measure_step(
    net: Net<B>,
    shard: &Dataset,
    batch: usize,
    device: &Dev,
) -> anyhow::Result<(f64, Net<B>)> {
    let mut batches = Batches::new(shard.len(), 0);
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    let mut grad = Vec::new();
    let mut times = Vec::new();
    let input = net.input();
    for i in 0..6 {
        batches.next_batch(shard, batch, &mut images, &mut labels);
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

/// Whether the run's messages are increments of a public copy (what a Byzantine peer must
/// forge): CHOCO-SGD's always, gradient tracking's only when compressed (CHOCO-mixed).
fn sends_increments(args: &crate::config::RunArgs) -> bool {
    args.gossip.algorithm.capabilities().compresses == murmur_gossip::Compresses::Increments
        && !crate::tools::simulate::is_plain_gradient_tracking(args)
}
