//! How a peer enters the run, decided from its options alone (pure: no I/O).

use super::*;
use crate::config::AlgorithmSpec;

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
    // A restarted peer 0 (`--rejoin-running`) may name members with --bootstrap: it takes
    // the directory from them, then serves as the bootstrap.
    let peer0_again = peer.rank == Some(0) && peer.rejoin_running;
    let joins = !peer.bootstrap.is_empty() && !peer0_again || peer.mdns && peer.rank != Some(0);
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
    if rank == 0 && !peer.bootstrap.is_empty() && !peer0_again {
        bail!(
            "peer 0 is the bootstrap: it takes --listen, not --bootstrap (a restarted peer 0, \
             with --rejoin-running, may name members with --bootstrap to take the directory from)"
        );
    }
    if assigned && peer.resume {
        bail!(
            "--resume needs --rank: the rank this peer had (its log and membership.jsonl say it)"
        );
    }
    let resumable = args.resumable();
    if peer.resume
        && resumable == Resumable::WholeRun
        && args.gossip.straggler_policy == crate::config::StragglerPolicy::Skip
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
            AlgorithmSpec::names_where(|a| a.capabilities().resumable(false) != Resumable::No),
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
            AlgorithmSpec::names_where(|a| a.capabilities().resumable(false) == Resumable::Rejoin),
            args.algorithm_name()
        );
    }
    if peer.join_running && rank == 0 {
        bail!("--join-running: peer 0 starts the run; it cannot join it");
    }
    if peer.rejoin_running && (joins || rank != 0) {
        bail!(
            "--rejoin-running is peer 0's (any other restarted peer rejoins with --resume alone)"
        );
    }
    if peer.rejoin_running && resumable != Resumable::Rejoin {
        bail!(
            "--rejoin-running: {} cannot take peer 0 back into a running run ({} can)",
            args.algorithm_name(),
            AlgorithmSpec::names_where(|a| a.capabilities().resumable(false) == Resumable::Rejoin)
        );
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
