//! `murmur simulate --consensus`: exact or compressed gossip from a random start, Ξ²(t) per round.

use super::*;
use crate::report::ConsensusRow;

pub(super) fn run(setup: &Setup<'_>) -> anyhow::Result<()> {
    let Setup {
        args,
        sim,
        topo,
        net_model,
        dir,
    } = *setup;
    let n = args.peers;
    let d = match sim.dim {
        Some(0) => bail!("--dim must be at least 1"),
        Some(d) => d,
        None => {
            let device = Default::default();
            let mut x = Vec::new();
            model::flatten(&Net::<B>::new(args.train.model, &device), &mut x);
            x.len()
        }
    };
    let mut rng = StdRng::seed_from_u64(args.train.seed);
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
        peers.push(algo::build(
            Host::Simulator,
            args,
            topo,
            rank,
            x0,
            &[d],
            max_payload(d),
            1,
        )?);
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
    Ok(())
}
