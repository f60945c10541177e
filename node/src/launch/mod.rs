//! `murmur launch`: starts n peers on this machine as n OS processes of this binary,
//! talking over QUIC on 127.0.0.1, and supervises them (as torchrun's elastic agent does).
//!
//! Peer 0 starts first and writes its libp2p address to `<run>/bootstrap.addr`; the others
//! get it as `--bootstrap`. Each peer's stdout and stderr go to `<run>/logs/peer-<rank>.log`.
//! The launcher prints the record keeper's per-epoch rows (from `<run>/epochs.jsonl`) and its
//! membership events (`membership.jsonl`: departures, rejoins) as they appear, with a
//! progress bar, and watches every process:
//!
//! - A peer (peer 0 included) that exits with an error, is killed, or leaves after a pause
//!   (exit status [`crate::control::pause::DEPARTED_EXIT_CODE`]) is reported under the table and in
//!   `summary.json` (`peer_failures`). The others train on without it wherever the
//!   algorithm tolerates a departure (D-PSGD, SGP, CHOCO-SGD, local-SGD gossip). With
//!   `--restart-failed N` it is started again with `--resume` (at most N times) and
//!   rejoins the run (D-PSGD, SGP, CHOCO-SGD, `diloco-gossip`; `restarts` in
//!   `summary.json`).
//! - A stopped peer (SIGSTOP, a debugger) is reported while it is stopped.
//! - Peer 0 fails like any other peer: the lowest live peer keeps the run's record in the
//!   same run folder while it is away (for good, or until its restart links to it). The
//!   run ends early when the algorithm cannot go on without a departed peer (all-reduce,
//!   the parameter server, local SGD with model averaging, phase schedules: their peers
//!   stop with an error, peer 0 among them). The launcher then stops every peer, writes
//!   `summary.json` from the epochs recorded with `outcome` = `stopped: <why>`, and fails
//!   with one line that says why.
//! - SIGINT and SIGTERM are passed on to every peer; peers still running 5 s later are
//!   killed; the launcher exits with 130 or 143. If the launcher itself dies, its peers get
//!   SIGTERM from the kernel (`PR_SET_PDEATHSIG`), so none outlives it.
//! - Before anything starts, a peer count whose estimated memory does not fit the
//!   machine's available memory is refused ([`estimated_peer_bytes`]).

mod memory;
mod signals;
mod supervise;

use memory::check_memory;
pub use memory::estimated_peer_bytes;
use supervise::{Ended, Record, Spawner, Supervisor};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;

use crate::config::RunArgs;
use crate::report::{self, progress, EpochRow, MembershipEvent, Summary};

/// Arguments of `murmur launch` besides the run's.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Launch")]
pub struct LaunchArgs {
    /// Parent folder of run folders; the run goes to `<out>/<run-id>`.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Name of the run folder (default: time, algorithm, topology and n).
    #[arg(long)]
    pub run_id: Option<String>,
    /// An elastic run: start with ranks 0..M only; the other ranks join the running run
    /// (`murmur peer --join-running`) once epoch `--join-at-epoch` is recorded, all started
    /// at once; the run takes them in one at a time, neighbours of its members first
    /// (D-PSGD, SGP, CHOCO-SGD, `diloco-gossip`).
    #[arg(long, value_name = "M")]
    pub initial_peers: Option<usize>,
    /// With `--initial-peers`: the epoch after which the other ranks join.
    #[arg(
        long,
        value_name = "E",
        default_value_t = 1,
        requires = "initial_peers"
    )]
    pub join_at_epoch: usize,
    /// Restart a peer (peer 0 included) that fails — exits with an error, is killed, or
    /// leaves after a pause — with `--resume`, at most N times per peer (N = 3 when the
    /// option has no value); it rejoins the running run from its latest checkpoint (with
    /// `--checkpoint-every`) and its neighbours' parameters. D-PSGD, SGP, CHOCO-SGD (without
    /// `--straggler-policy skip`) and `diloco-gossip` (from its next outer step). Without it
    /// a failed peer stays out and the others train on without it.
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        default_value_t = 0,
        default_missing_value = "3"
    )]
    pub restart_failed: u32,
    /// Start even if the peers' estimated memory exceeds the memory available.
    #[arg(long)]
    pub ignore_memory_check: bool,
}

/// `murmur launch` was interrupted by a signal (SIGINT or SIGTERM), which it passed on to
/// every peer; its exit status is 128 + the signal number (130, 143).
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {}: every peer was stopped", signal_name(*.signal))]
pub struct Interrupted {
    /// The signal number.
    pub signal: i32,
}

impl Interrupted {
    /// The conventional exit status: 128 + the signal number.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

/// Runs the whole launch; returns the run summary.
///
/// # Errors
/// Bad options or a peer count that does not fit in memory (before anything starts); a
/// peer that cannot be started; peer 0 failing before the run started, or the run
/// stopping without a departed peer (after `summary.json` is written); [`Interrupted`] on SIGINT or SIGTERM.
pub fn run(args: &RunArgs, launch: &LaunchArgs) -> anyhow::Result<Summary> {
    let Checked {
        topo,
        dim,
        initial,
        args,
    } = check(args, launch)?;
    let args = &args;
    let run_dir = run_folder(args, launch, "")?;
    // The peers read the run from one file: the options exactly as parsed here (the model
    // with its input sizes when the data set them).
    let run_config = run_dir.join("run.toml");
    std::fs::write(&run_config, args.to_toml()?)
        .with_context(|| format!("cannot write {}", run_config.display()))?;
    for stale in ["epochs.jsonl", "bootstrap.addr", "membership.jsonl"] {
        let _ = std::fs::remove_file(run_dir.join(stale));
    }
    let _ = std::fs::remove_dir_all(run_dir.join("addrs"));
    std::fs::create_dir_all(run_dir.join("addrs"))
        .with_context(|| format!("cannot create {}", run_dir.join("addrs").display()))?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let spawner = Spawner {
        exe: std::env::current_exe().context("cannot find the murmur executable")?,
        run_config,
        run_dir: run_dir.clone(),
        // With more peers than cores, one compute thread per peer avoids oversubscription.
        threads_per_peer: (cores / args.peers).max(1),
    };
    announce(args, &topo, &run_dir);
    signals::install();
    let mut supervisor = Supervisor::start(args, launch, spawner, initial)?;

    let bar = progress::bar(args.train.epochs as u64, "epoch");
    bar.enable_steady_tick(Duration::from_millis(200));
    let print = |line: String| progress::print(&bar, line);
    print(report::table_header());
    match supervisor.watch(&bar, &print)? {
        Ended::Completed => {}
        Ended::Interrupted(signal) => {
            bar.abandon();
            supervisor.stop_all(signal);
            let why = format!("interrupted by {}", signal_name(signal));
            supervisor.save_partial(&topo, dim, why)?;
            report::plots::after_run(&run_dir);
            return Err(Interrupted { signal }.into());
        }
        Ended::Stopped(why) => {
            bar.abandon();
            supervisor.stop_all(libc::SIGTERM);
            let rows = supervisor.save_partial(&topo, dim, format!("stopped: {why}"))?;
            report::plots::after_run(&run_dir);
            bail!(
                "the run stopped: {why}. Every peer was stopped; summary.json covers the {} \
                 recorded; logs in {}",
                crate::config::count(rows.len(), "epoch row"),
                run_dir.join("logs").display()
            );
        }
    }
    bar.finish_and_clear();
    let summary = supervisor.conclude(&topo, dim)?;
    println!("{}", report::summary_line(&summary));
    if !summary.peer_failures.is_empty() {
        println!(
            "failed peer processes (rank:how@epoch): {}; restarted (rank@epoch): {}",
            summary.peer_failures,
            or_none(&summary.restarts)
        );
    }
    if let Ok(text) = std::fs::read_to_string(run_dir.join("sample.txt")) {
        println!("sample from peer 0's model (sample.txt):\n{text}");
    }
    report::plots::after_run(&run_dir);
    println!("run folder: {}", run_dir.display());
    Ok(summary)
}

/// What [`check`] found: the topology, the model's dimension d and the initial peer count.
struct Checked {
    topo: murmur_topology::Topology,
    dim: usize,
    initial: usize,
    /// The run with its model sized for the data ([`RunArgs::fitted_to`]).
    args: RunArgs,
}

/// Fails fast, before any process starts or any file is written, on bad options, a bad
/// topology, peer count or data file, or a run that does not fit in memory.
fn check(args: &RunArgs, launch: &LaunchArgs) -> anyhow::Result<Checked> {
    args.validate()?;
    for w in args.warnings() {
        eprintln!("murmur: warning: {w}");
    }
    crate::peer::check_device(args.train.device)?;
    let topo = args.topology()?;
    if launch.restart_failed > 0 && args.resumable() != murmur_gossip::Resumable::Rejoin {
        bail!(
            "--restart-failed: a restarted peer rejoins {} runs (without --straggler-policy \
             skip), not {}",
            murmur_gossip::AlgorithmSpec::names_where(
                |a| a.capabilities().resumable(false) == murmur_gossip::Resumable::Rejoin
            ),
            args.algorithm_name()
        );
    }
    let initial = launch.initial_peers.unwrap_or(args.peers);
    if initial == 0 || initial > args.peers {
        bail!(
            "--initial-peers {initial} must be in 1..={} (--peers)",
            args.peers
        );
    }
    // The peers re-weight W around an elastic run's empty ranks as around departed ones
    // (`surviving`: Metropolis–Hastings, which needs an undirected graph); push-sum
    // (SGP) only pushes around them. Checked here, before any peer starts.
    if initial < args.peers {
        let push_sum = murmur_gossip::Pattern::Graph(murmur_gossip::GraphNeeds::PushSchedule);
        let reweights = (args.algorithms().iter()).any(|a| a.capabilities().pattern != push_sum);
        let empty: Vec<murmur_gossip::Rank> = (initial..args.peers).collect();
        if let Err(e) = crate::control::membership::surviving(&topo.w, reweights, &empty) {
            bail!(
                "--initial-peers: {} on {} cannot leave ranks {initial}..{} empty: {e} \
                 (choose an undirected --topology, or sgp)",
                args.algorithm_name(),
                args.topology_label(&topo),
                args.peers
            );
        }
    }
    if initial < args.peers && !(1..args.train.epochs).contains(&launch.join_at_epoch) {
        bail!(
            "--join-at-epoch {} must be in 1..{} (--epochs): the new peers need rounds left to join",
            launch.join_at_epoch,
            args.train.epochs
        );
    }
    // Loaded once here so that a bad --data fails before any peer starts, and to size the
    // model for its images.
    let data = crate::train::data::RunData::load(
        args.train.model,
        args.train.data.as_deref(),
        args.train.seed,
    )?;
    let fitted = args.fitted_to(&data.train);
    let dim = crate::train::model::Net::<burn::backend::Flex>::new(
        fitted.train.model,
        &Default::default(),
    )
    .dim();
    let data_bytes = data.train.value_bytes() + data.test.value_bytes();
    drop(data);
    if !launch.ignore_memory_check {
        check_memory(args.peers, estimated_peer_bytes(dim, data_bytes))?;
    }
    Ok(Checked {
        topo,
        dim,
        initial,
        args: fitted,
    })
}

/// The run's first line: peers, algorithm, compressor, graph, model, device, epochs, folder.
fn announce(args: &RunArgs, topo: &murmur_topology::Topology, run_dir: &Path) {
    let pattern = if args
        .algorithms()
        .iter()
        .any(|a| a.capabilities().uses_topology())
    {
        format!(
            "{}; |λ₂| = {:.4}, spectral gap {:.4}",
            args.topology_label(topo),
            topo.w.second_eigenvalue_modulus(),
            topo.w.spectral_gap()
        )
    } else {
        args.topology_label(topo)
    };
    eprintln!(
        "murmur: {}, {} with {} ({pattern}), {} on {}, {}; run folder {}",
        crate::config::count(args.peers, "peer"),
        args.algorithm_name(),
        args.compressor_label(),
        args.train.model.with_data(args.train.data.as_deref()),
        args.train.device,
        crate::config::count(args.train.epochs, "epoch"),
        run_dir.display()
    );
}

fn or_none(s: &str) -> &str {
    if s.is_empty() {
        "none"
    } else {
        s
    }
}

/// Writes `summary.json` of a run the launcher ended early, from its last recorded row
/// (none if no epoch was recorded).
fn save_partial(
    args: &RunArgs,
    topo: &murmur_topology::Topology,
    dim: usize,
    run_dir: &Path,
    rows: &[EpochRow],
    record: &Record,
    outcome: String,
) -> anyhow::Result<()> {
    let Some(last) = rows.last() else {
        return Ok(());
    };
    let mut s = crate::report::collector::summary(args, topo, dim, last);
    s.epochs = last.epoch;
    s.set_membership(&read_lines(&run_dir.join("membership.jsonl")));
    s.outcome = outcome;
    s.peer_failures = record.failures.join(" ");
    s.restarts = record.restarts.join(" ");
    report::save_summary(run_dir, &s)
}

/// A membership event as a line under the table.
fn membership_line(e: &MembershipEvent) -> String {
    match e.event.as_str() {
        "left" => format!(
            "peer {} left the run at round {} (epoch {}): {}",
            e.peer, e.round, e.epoch, e.reason
        ),
        "rejoined" => format!(
            "peer {} rejoined the run, mixing from round {}",
            e.peer, e.round
        ),
        "joined" => format!(
            "peer {} joined the run, mixing from round {}",
            e.peer, e.round
        ),
        other => format!("peer {}: {other} at round {}", e.peer, e.round),
    }
}

/// An exit status as `exit-N` or the signal's name (`SIGKILL`).
fn how(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit-{c}"),
        (None, Some(s)) => signal_name(s),
        (None, None) => status.to_string(),
    }
}

/// `SIGTERM` for 15, etc.
fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        other => format!("signal {other}"),
    }
}

fn log_path(run_dir: &Path, rank: usize) -> PathBuf {
    run_dir.join("logs").join(format!("peer-{rank}.log"))
}

/// `<run>/addrs/peer-<rank>.addr`: where peer `rank` publishes its libp2p multiaddr
/// (`--address-file`), through which a restarted peer comes back while peer 0 is away.
fn address_path(run_dir: &Path, rank: usize) -> PathBuf {
    run_dir.join("addrs").join(format!("peer-{rank}.addr"))
}

/// The last `n` lines of peer `rank`'s log.
fn log_tail(run_dir: &Path, rank: usize, n: usize) -> String {
    std::fs::read_to_string(log_path(run_dir, rank))
        .map(|t| {
            let lines: Vec<&str> = t.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        })
        .unwrap_or_default()
}

/// The last `error: …` line of peer `rank`'s log (what `murmur peer` printed as it failed),
/// without the prefix.
fn last_error(run_dir: &Path, rank: usize) -> Option<String> {
    let log = std::fs::read_to_string(log_path(run_dir, rank)).ok()?;
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("error: "))
        .map(str::to_string)
}

/// The JSON lines of `path` that parse (a line being written is skipped).
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates the run folder `<out>/<run-id>` (with `logs/`) for `args` and returns it. The
/// default run id is the UTC time, `tag`, algorithm, topology and n; a folder that already
/// holds a finished run is refused.
pub(crate) fn run_folder(
    args: &RunArgs,
    launch: &LaunchArgs,
    tag: &str,
) -> anyhow::Result<PathBuf> {
    let run_id = launch.run_id.clone().unwrap_or_else(|| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let topo_name: String = args
            .gossip
            .topology
            .rsplit('/')
            .next()
            .unwrap_or("topology")
            .trim_end_matches(".toml")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!(
            "{}-{tag}{}-{}-n{}",
            utc_stamp(secs),
            args.algorithm_name().replace([',', ':'], "_"),
            topo_name,
            args.peers
        )
    });
    let mut run_dir = launch.out.join(&run_id);
    if launch.run_id.is_none() {
        // Two runs started in the same second get distinct folders.
        let mut k = 2;
        while run_dir.exists() {
            run_dir = launch.out.join(format!("{run_id}-{k}"));
            k += 1;
        }
    }
    if run_dir.join("summary.json").exists() {
        bail!(
            "run folder {} already holds a finished run; choose another --run-id",
            run_dir.display()
        );
    }
    std::fs::create_dir_all(run_dir.join("logs"))
        .with_context(|| format!("cannot create the run folder {}", run_dir.display()))?;
    Ok(run_dir)
}

/// `YYYYMMDD-HHMMSS` in UTC for a Unix time in seconds.
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamp_matches_known_dates() {
        assert_eq!(super::utc_stamp(0), "19700101-000000");
        // 2026-11-21 12:34:56 UTC
        assert_eq!(super::utc_stamp(1_795_264_496), "20261121-123456");
        // 2000-02-29 (leap day)
        assert_eq!(super::utc_stamp(951_782_400), "20000229-000000");
    }

    #[test]
    fn exit_statuses_read_as_codes_or_signal_names() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(how(ExitStatus::from_raw(0)), "exit-0");
        assert_eq!(how(ExitStatus::from_raw(75 << 8)), "exit-75");
        assert_eq!(how(ExitStatus::from_raw(libc::SIGKILL)), "SIGKILL");
        assert_eq!(
            Interrupted {
                signal: libc::SIGTERM
            }
            .exit_code(),
            143
        );
        assert_eq!(
            Interrupted {
                signal: libc::SIGINT
            }
            .exit_code(),
            130
        );
    }
}
