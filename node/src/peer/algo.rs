//! Builds one peer's algorithm state machine from the run's options through the algorithm
//! registry (`murmur_gossip::registry`): the same code for `murmur peer` (driven by the
//! network) and `murmur simulate` (driven by the simulator). A phase schedule builds one
//! state machine per phase.

use std::time::Duration;

use murmur_gossip::{BuildContext, Gossip, Phase, Phased, Rank};
use murmur_topology::Topology;

use crate::config::{Init, RunArgs, StragglerDeadline, StragglerPolicy};

/// Who drives the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// `murmur peer`: it may read the parameters while a round mixes (to welcome a
    /// restarted neighbour), so every algorithm keeps them intact.
    Network,
    /// `murmur simulate`: it reads the parameters only between rounds, so D-PSGD may mix
    /// in place and keep one `[d]` vector less per virtual peer (`BuildContext::in_place`).
    Simulator,
}

/// Peer `rank`'s state machine for the run `args` on `topo`, starting from `x0: [d]`,
/// driven by `host`. `tensor_lengths` are the model's tensor sizes (for layer-wise
/// compressors; they sum to d), `max_payload` the largest frame payload accepted, in
/// bytes, and `rounds_per_epoch` converts the epochs of a phase schedule into rounds.
///
/// # Errors
/// If the compressor cannot be built for this model, or the topology does not suit the
/// algorithm (the registry's `BuildError`).
#[allow(clippy::too_many_arguments)]
pub fn build(
    host: Host,
    args: &RunArgs,
    topo: &Topology,
    rank: Rank,
    x0: Vec<f32>,
    tensor_lengths: &[usize],
    max_payload: u32,
    rounds_per_epoch: u64,
) -> anyhow::Result<Box<dyn Gossip>> {
    // Every peer starts from the same x⁰ (drawn from the run's seed, or read from one
    // file). A phase starts from where the previous one left the peers, so not there.
    let shared_start = args.train.init == Init::Same || args.train.init_from.is_some();
    build_phase(
        host,
        args,
        topo,
        rank,
        x0,
        tensor_lengths,
        max_payload,
        rounds_per_epoch,
        shared_start,
    )
}

/// [`build`], where `shared_start` says whether every peer starts this state machine from
/// the same x (`BuildContext::shared_start`).
#[allow(clippy::too_many_arguments)]
fn build_phase(
    host: Host,
    args: &RunArgs,
    topo: &Topology,
    rank: Rank,
    x0: Vec<f32>,
    tensor_lengths: &[usize],
    max_payload: u32,
    rounds_per_epoch: u64,
    shared_start: bool,
) -> anyhow::Result<Box<dyn Gossip>> {
    if let Some(schedule) = &args.gossip.phases {
        let mut phases = Vec::new();
        for (algorithm, epochs) in &schedule.0 {
            let gossip = build_phase(
                host,
                &args.for_phase(*algorithm),
                topo,
                rank,
                x0.clone(),
                tensor_lengths,
                max_payload,
                rounds_per_epoch,
                false,
            )?;
            phases.push(Phase {
                name: algorithm.to_string(),
                gossip,
                rounds: epochs.map(|e| e as u64 * rounds_per_epoch),
            });
        }
        return Ok(Box::new(Phased::new(phases)));
    }
    let (skip_after, auto_deadline) = match (
        args.gossip.straggler_policy,
        args.gossip.straggler_deadline_ms,
    ) {
        (StragglerPolicy::Skip, Some(StragglerDeadline::Ms(ms))) => {
            (Some(Duration::from_millis(ms)), None)
        }
        (StragglerPolicy::Skip, Some(StragglerDeadline::Auto)) => {
            let ceiling = StragglerDeadline::AUTO_CEILING
                .min(Duration::from_secs(args.net.round_timeout_secs) / 2);
            (
                Some(ceiling),
                Some(murmur_gossip::AutoDeadline::with_ceiling(ceiling)),
            )
        }
        _ => (None, None),
    };
    let options = args.algorithm_options();
    let ctx = BuildContext {
        rank,
        topology: topo,
        lr: args.train.lr,
        x0,
        tensor_lengths,
        max_payload_bytes: max_payload,
        round_timeout: Duration::from_secs(args.net.round_timeout_secs),
        seed: args.train.seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        skip_after,
        auto_deadline,
        options: &options,
        in_place: host == Host::Simulator,
        shared_start,
    };
    Ok(args.gossip.algorithm.build(ctx)?)
}
