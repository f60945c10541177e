//! `murmur launch`: starts n peers on this machine as n OS processes of this binary,
//! talking over QUIC on 127.0.0.1, and follows the run.
//!
//! Peer 0 starts first and writes its libp2p address to `<run>/bootstrap.addr`; the others
//! get it as `--bootstrap`. Each peer's stdout and stderr go to `<run>/logs/peer-<rank>.log`.
//! The launcher prints peer 0's per-epoch rows (from `<run>/epochs.jsonl`) as they appear,
//! with a progress bar. If any peer exits with an error, the launcher stops the others,
//! shows the end of that peer's log and exits with an error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::RunArgs;
use crate::metrics::{self, EpochRow, Summary};

/// Arguments of `murmur launch` besides the run's.
#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// Parent folder of run folders; the run goes to `<out>/<run-id>`.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Name of the run folder (default: time, algorithm, topology and n).
    #[arg(long)]
    pub run_id: Option<String>,
    /// An elastic run: start with ranks 0..M only; the other ranks join the running run
    /// (`murmur peer --join-running`) once epoch `--join-at-epoch` is recorded, one at a
    /// time: the next once the one before reports (D-PSGD, SGP, CHOCO-SGD).
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
}

struct Peers {
    children: Vec<(usize, Child)>,
}

impl Peers {
    fn kill_all(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
        }
        for (_, c) in &mut self.children {
            let _ = c.wait();
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Runs the whole launch; returns the run summary.
pub fn run(args: &RunArgs, launch: &LaunchArgs) -> anyhow::Result<Summary> {
    args.validate()?;
    for w in args.warnings() {
        eprintln!("murmur: warning: {w}");
    }
    crate::peer::check_device(args.device)?;
    // Fail fast, before any process starts, on a bad topology or peer count.
    let topo = args.topology()?;
    let run_dir = run_folder(args, launch, "")?;
    for stale in ["epochs.jsonl", "bootstrap.addr"] {
        let _ = std::fs::remove_file(run_dir.join(stale));
    }
    let exe = std::env::current_exe().context("cannot find the murmur executable")?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // With more peers than cores, one compute thread per peer avoids oversubscription.
    let threads_per_peer = (cores / args.peers).max(1);

    let pattern = if args.algorithms().iter().any(|a| a.uses_topology()) {
        format!(
            "{}; |λ₂| = {:.4}, spectral gap {:.4}",
            args.topology_label(&topo),
            topo.w.second_eigenvalue_modulus(),
            topo.w.spectral_gap()
        )
    } else {
        args.topology_label(&topo)
    };
    eprintln!(
        "murmur: {} peers, {} with {} ({pattern}), {} on {}, {} epochs; run folder {}",
        args.peers,
        args.algorithm_name(),
        args.compressor(),
        args.model.with_data(),
        args.device,
        args.epochs,
        run_dir.display()
    );
    let spawn = |rank: usize, extra: Vec<String>| -> anyhow::Result<Child> {
        let log = std::fs::File::create(run_dir.join("logs").join(format!("peer-{rank}.log")))?;
        let log2 = log.try_clone()?;
        Command::new(&exe)
            .arg("peer")
            .args(args.to_args())
            .arg(format!("--rank={rank}"))
            .arg(format!("--out={}", run_dir.display()))
            .args(extra)
            .env("RAYON_NUM_THREADS", threads_per_peer.to_string())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .with_context(|| format!("cannot start peer {rank}"))
    };

    let initial = launch.initial_peers.unwrap_or(args.peers);
    if initial == 0 || initial > args.peers {
        bail!(
            "--initial-peers {initial} must be in 1..={} (--peers)",
            args.peers
        );
    }
    if initial < args.peers && !(1..args.epochs).contains(&launch.join_at_epoch) {
        bail!(
            "--join-at-epoch {} must be in 1..{} (--epochs): the new peers need rounds left to join",
            launch.join_at_epoch,
            args.epochs
        );
    }
    let mut peers = Peers {
        children: Vec::new(),
    };
    let addr_file = crate::peer::bootstrap_file(&run_dir);
    let mut first = vec![format!("--bootstrap-file={}", addr_file.display())];
    if initial < args.peers {
        first.push(format!("--initial-peers={initial}"));
    }
    peers.children.push((0, spawn(0, first)?));
    let t0 = Instant::now();
    let bootstrap = loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            break a.trim().to_string();
        }
        check_children(&mut peers, &run_dir)?;
        if t0.elapsed() > Duration::from_secs(30) {
            bail!(
                "peer 0 did not publish its address within 30 s; see {}",
                run_dir.join("logs/peer-0.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for rank in 1..initial {
        peers
            .children
            .push((rank, spawn(rank, vec![format!("--bootstrap={bootstrap}")])?));
    }
    let mut to_join: Vec<usize> = (initial..args.peers).collect();

    let bar = ProgressBar::new(args.epochs as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} epoch {pos}/{len} [{bar:30}] {elapsed_precise} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    // indicatif hides the bar when stderr is not a terminal; the table must show anyway.
    let print = |bar: &ProgressBar, line: String| {
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
    };
    print(&bar, metrics::table_header());
    let epochs_file = run_dir.join("epochs.jsonl");
    let mut shown = 0usize;
    loop {
        let rows = read_rows(&epochs_file);
        for row in rows.iter().skip(shown) {
            print(&bar, metrics::format_row(row));
            bar.set_position(row.epoch as u64);
            bar.set_message(format!("x̄ acc {:.2}%", 100.0 * row.avg_model_test_accuracy));
        }
        shown = shown.max(rows.len());
        // One joiner at a time: two neighbours joining at once would each take the other's
        // hello for a restart (see the README, elastic runs).
        let reporting = rows.last().map_or(0, |r| r.peers);
        let due = rows.iter().any(|r| r.epoch >= launch.join_at_epoch);
        if let Some(&rank) = to_join.first().filter(|&&r| due && reporting >= r) {
            to_join.remove(0);
            let extra = vec![format!("--bootstrap={bootstrap}"), "--join-running".into()];
            peers.children.push((rank, spawn(rank, extra)?));
            print(&bar, format!("rank {rank} joins the running run"));
        }
        if let Err(e) = check_children(&mut peers, &run_dir) {
            bar.abandon();
            return Err(e);
        }
        if peers.children.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
    for row in read_rows(&epochs_file).iter().skip(shown) {
        println!("{}", metrics::format_row(row));
    }
    let summary: Summary = serde_json::from_slice(
        &std::fs::read(run_dir.join("summary.json")).context("peer 0 wrote no summary.json")?,
    )?;
    println!("{}", metrics::summary_line(&summary));
    println!("run folder: {}", run_dir.display());
    Ok(summary)
}

/// Removes peers that exited successfully; on a failure, stops the rest and explains.
fn check_children(peers: &mut Peers, run_dir: &Path) -> anyhow::Result<()> {
    let mut failed = None;
    peers
        .children
        .retain_mut(|(rank, child)| match child.try_wait() {
            Ok(Some(status)) if status.success() => false,
            Ok(Some(status)) => {
                failed.get_or_insert((*rank, status.to_string()));
                false
            }
            Ok(None) => true,
            Err(e) => {
                failed.get_or_insert((*rank, e.to_string()));
                false
            }
        });
    if let Some((rank, status)) = failed {
        peers.kill_all();
        peers.children.clear();
        let log = run_dir.join("logs").join(format!("peer-{rank}.log"));
        let tail = std::fs::read_to_string(&log)
            .map(|t| {
                let lines: Vec<&str> = t.lines().collect();
                lines[lines.len().saturating_sub(8)..].join("\n")
            })
            .unwrap_or_default();
        return Err(anyhow!(
            "peer {rank} failed ({status}); the other peers were stopped. End of {}:\n{tail}",
            log.display()
        ));
    }
    Ok(())
}

fn read_rows(path: &Path) -> Vec<EpochRow> {
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
    #[test]
    fn utc_stamp_matches_known_dates() {
        assert_eq!(super::utc_stamp(0), "19700101-000000");
        // 2026-11-21 12:34:56 UTC
        assert_eq!(super::utc_stamp(1_795_264_496), "20261121-123456");
        // 2000-02-29 (leap day)
        assert_eq!(super::utc_stamp(951_782_400), "20000229-000000");
    }
}
