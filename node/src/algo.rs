//! Builds one peer's algorithm state machine from the run's options: the same code for
//! `murmur peer` (driven by the network) and `murmur simulate` (driven by the simulator).

use std::time::Duration;

use anyhow::{bail, Context};
use murmur_gossip::{
    AllReduce, AllReduceConfig, Choco, ChocoConfig, DPsgd, DPsgdConfig, Gossip, LocalSgd,
    ParameterServer, Phase, Phased, PsConfig, Rank, Sgp, SgpConfig,
};
use murmur_topology::Topology;

use crate::config::{Algorithm, RunArgs, StragglerPolicy};

/// Peer `rank`'s state machine for the run `args` on `topo`, starting from `x0: [d]`.
/// `tensor_lengths` are the model's tensor sizes (for layer-wise compressors; they sum to
/// d), `max_payload` the largest frame payload accepted, in bytes, and `rounds_per_epoch`
/// converts the epochs of a phase schedule into rounds.
///
/// # Errors
/// If the compressor cannot be built for this model.
pub fn build(
    args: &RunArgs,
    topo: &Topology,
    rank: Rank,
    x0: Vec<f32>,
    tensor_lengths: &[usize],
    max_payload: u32,
    rounds_per_epoch: u64,
) -> anyhow::Result<Box<dyn Gossip>> {
    if let Some(schedule) = &args.phases {
        let mut phases = Vec::new();
        for (algorithm, epochs) in &schedule.0 {
            let gossip = build(
                &args.for_phase(*algorithm),
                topo,
                rank,
                x0.clone(),
                tensor_lengths,
                max_payload,
                rounds_per_epoch,
            )?;
            phases.push(Phase {
                name: algorithm.to_string(),
                gossip,
                rounds: epochs.map(|e| e as u64 * rounds_per_epoch),
            });
        }
        return Ok(Box::new(Phased::new(phases)));
    }
    let d = x0.len();
    let compressor = args
        .compressor()
        .build(Some(tensor_lengths))
        .context("--compressor")?;
    let round_timeout = Duration::from_secs(args.round_timeout_secs);
    let seed = args.seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let skip_after = match (args.straggler_policy, args.straggler_deadline_ms) {
        (StragglerPolicy::Skip, Some(ms)) => {
            // D-PSGD's skip notice goes back along the edge it drops; SGP and CHOCO send none.
            if matches!(args.algorithm, Algorithm::Dpsgd | Algorithm::LocalSgd)
                && !topo.w.graph().is_symmetric()
            {
                bail!(
                    "--straggler-policy skip needs an undirected topology; {} is directed",
                    topo.name
                );
            }
            Some(Duration::from_millis(ms))
        }
        _ => None,
    };
    let dpsgd = |lr: f32, compressor| {
        let mut cfg = DPsgdConfig::from_matrix(&topo.w, rank, lr, d);
        cfg.round_timeout = round_timeout;
        cfg.max_payload_bytes = max_payload;
        cfg.seed = seed;
        cfg.skip_after = skip_after;
        DPsgd::with_compressor(cfg, x0.clone(), compressor)
    };
    let allreduce = |lr: f32| {
        let mut cfg = AllReduceConfig::new(rank, args.peers, lr, d);
        cfg.round_timeout = round_timeout;
        AllReduce::new(cfg, x0.clone())
    };
    Ok(match args.algorithm {
        Algorithm::Dpsgd => Box::new(dpsgd(args.lr, compressor)),
        Algorithm::Choco => {
            let mut cfg = ChocoConfig::from_matrix(&topo.w, rank, args.lr, args.gamma(), d);
            cfg.round_timeout = round_timeout;
            cfg.max_payload_bytes = max_payload;
            cfg.seed = seed;
            cfg.skip_after = skip_after;
            Box::new(Choco::new(cfg, x0, compressor))
        }
        Algorithm::Sgp => {
            let schedule = args.push_schedule(topo)?;
            let mut cfg = SgpConfig::new(schedule, rank, args.lr, d)
                .with_tau(args.tau.unwrap_or(0))
                .with_skip(skip_after);
            cfg.round_timeout = round_timeout;
            cfg.max_payload_bytes = max_payload;
            cfg.seed = seed;
            Box::new(Sgp::with_compressor(cfg, x0, compressor))
        }
        Algorithm::LocalSgd => {
            // The inner gossip only mixes (η = 0); the wrapper takes the local steps.
            let inner = dpsgd(0.0, compressor);
            Box::new(LocalSgd::new(Box::new(inner), args.local_steps(), args.lr))
        }
        Algorithm::LocalAvg => {
            // All-reduce begun without a gradient averages the parameters exactly.
            let inner = allreduce(0.0);
            Box::new(LocalSgd::new(Box::new(inner), args.local_steps(), args.lr))
        }
        Algorithm::Allreduce => Box::new(allreduce(args.lr)),
        Algorithm::Ps => {
            let mut cfg = PsConfig::new(rank, args.peers, args.lr, args.ps_mode.0, d);
            cfg.round_timeout = round_timeout;
            Box::new(ParameterServer::new(cfg, x0))
        }
    })
}
