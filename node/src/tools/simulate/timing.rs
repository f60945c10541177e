//! `murmur simulate --timing-only`: a training run's schedule with random gradients.

use super::*;
use crate::report::TimingRow;

/// `--timing-only`: the schedule of a training run with random gradients (module doc).
pub(super) fn run(setup: &Setup<'_>) -> anyhow::Result<()> {
    let Setup {
        args,
        sim,
        topo,
        net_model,
        dir,
    } = *setup;
    let n = args.peers;
    let compute_secs = fixed_compute_secs(sim)?
        .ok_or_else(|| anyhow!("--timing-only needs --compute-ms (there is no model to time)"))?;
    let train = RunData::load(
        args.train.model,
        args.train.data.as_deref(),
        args.train.seed,
    )?
    .train;
    let args = &args.fitted_to(&train);
    let rounds_per_epoch = match args.train.rounds_per_epoch {
        Some(r) => r,
        None => rounds_per_epoch(args, train.len()),
    };
    drop(train);
    let device: Dev = Default::default();
    let net = Net::<B>::new(args.train.model, &device);
    let lengths = model::tensor_lengths(&net);
    let mut x0 = Vec::new();
    model::flatten(&net, &mut x0);
    let d = x0.len();
    let mut peers: Vec<Box<dyn Gossip>> = Vec::with_capacity(n);
    for rank in 0..n {
        peers.push(algo::build(
            Host::Simulator,
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
    let mut rng = StdRng::seed_from_u64(args.train.seed);
    let noise: Vec<f32> = (0..2 * d)
        .map(|_| rng.random_range(-1e-2f32..1e-2))
        .collect();
    let bar = progress::bar(args.train.epochs as u64, "epoch");
    let mut rows = Vec::with_capacity(args.train.epochs + 1);
    for epoch in 0..=args.train.epochs {
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
    Ok(())
}
