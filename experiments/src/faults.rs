//! Fault tolerance with real processes: 8 peers on loopback, ring, D-PSGD. One peer is
//! killed with SIGKILL at round R; its neighbours notice the silence (`--peer-timeout-secs`),
//! every survivor re-weights (Metropolis–Hastings on the surviving graph) and trains on.
//! Once the survivors have trained a while without it, the peer is restarted with
//! `murmur peer --resume`: it rejoins from its checkpoint and its neighbours' parameters.
//!
//! Bars (full run): the 7 survivors finish with ≥ 90% test accuracy each; the restarted
//! peer reports again, and its consensus distance returns to its pre-crash level: its
//! distance to the peers' mean, ‖x_i − x̄‖², relative to the other peers' mean distance at
//! the end is at most 1.5× that ratio at the last epoch before the kill. (The ratio, not
//! the raw distance: D-PSGD's Ξ² sits at a level set by the step size and the gradient
//! noise, which changes over training for every peer alike.) The quick run checks the same
//! sequence of events with a lower accuracy bar (80%).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::Value;

use crate::chart::{Chart, Series, SeriesLabelPosition, Stroke};
use crate::runner::{json_f64, parse_json, Ctx};
use crate::table::{markdown, write_checked_csv};

/// Peers, the killed one, and the seconds of silence after which a peer counts as gone.
const PEERS: usize = 8;
const VICTIM: usize = 3;
const PEER_TIMEOUT_SECS: u64 = 3;

/// The run's shape: full or `--quick`.
struct Plan {
    epochs: usize,
    rounds_per_epoch: u64,
    /// Kill when the victim's checkpoint has reached this round.
    kill_round: u64,
    checkpoint_every: u64,
    /// Accuracy every survivor must reach.
    accuracy_bar: f64,
}

/// One epoch of the run as peer 0 recorded it.
#[derive(Debug, Serialize)]
struct EpochLine {
    epoch: usize,
    peers: usize,
    mean_test_accuracy: f64,
    min_test_accuracy: f64,
    avg_model_test_accuracy: f64,
    consensus_distance: f64,
}

/// ‖x_i − x̄‖² of one peer at the end of one epoch.
#[derive(Debug, Serialize)]
struct DistanceLine {
    epoch: usize,
    peer: usize,
    distance: f64,
}

/// Peer processes, killed if the driver stops early.
struct Peers {
    children: Vec<(usize, Child)>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Peers {
    fn spawn(&mut self, ctx: &Ctx, rank: usize, args: &[String], log: &Path) -> anyhow::Result<()> {
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(&ctx.murmur)
            .arg("peer")
            .arg(format!("--rank={rank}"))
            .args(args)
            // Eight processes share the machine's cores.
            .env("RAYON_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting peer {rank}"))?;
        self.children.push((rank, child));
        Ok(())
    }
}

/// Polls `ready` every 50 ms until it gives a value; fails after `limit` with `what`.
fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = ready()? {
            return Ok(v);
        }
        if t0.elapsed() > limit {
            bail!("faults: {what} did not happen within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The JSON lines of `path` (none if it does not exist yet).
fn json_lines(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .map(|l| parse_json(l.as_bytes()))
        .collect::<anyhow::Result<_>>()
        .with_context(|| format!("parsing {}", path.display()))
}

/// The round of a murmur checkpoint (`MURMURCK | version | json_len | JSON …`), if the file
/// exists.
fn checkpoint_round(path: &Path) -> anyhow::Result<Option<u64>> {
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(None);
    };
    let len = bytes
        .get(12..16)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .context("truncated checkpoint")?;
    let meta = parse_json(bytes.get(16..16 + len).context("truncated checkpoint")?)?;
    Ok(Some(json_f64(&meta, "round")? as u64))
}

impl Plan {
    /// The full run's shape, or the `--quick` one.
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                epochs: 6,
                rounds_per_epoch: 20,
                kill_round: 30,
                checkpoint_every: 5,
                accuracy_bar: 0.80,
            }
        } else {
            Plan {
                epochs: 10,
                rounds_per_epoch: 40,
                kill_round: 100,
                checkpoint_every: 10,
                accuracy_bar: 0.90,
            }
        }
    }
}

/// When things happened during the run, as the driver saw them.
struct Events {
    /// The round of the victim's checkpoint when it was killed.
    saved_round: u64,
    /// Seconds from the kill until peer 0 recorded the departure.
    noticed_secs: f64,
    /// Seconds from the kill until the victim was restarted.
    restarted_secs: f64,
    /// Seconds of the whole run.
    wall: f64,
}

/// Runs the fault experiment (see the [module docs](self)).
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let plan = Plan::new(ctx.quick);
    let dir = ctx.dir("faults")?;
    let mut run = KillAndResume::prepare(ctx, &plan, dir.join("runs").join("kill-and-resume"))?;
    let events = run.events()?;
    report(&dir, &run.folder, &plan, &events)
}

/// The kill-and-resume run: its folders, the peers' arguments and their processes.
struct KillAndResume<'a> {
    ctx: &'a Ctx,
    plan: &'a Plan,
    /// The run folder.
    folder: PathBuf,
    /// The peers' logs.
    logs: PathBuf,
    /// Every peer's arguments, without the bootstrap.
    args: Vec<String>,
    /// How long each awaited event may take.
    limit: Duration,
    peers: Peers,
}

impl<'a> KillAndResume<'a> {
    /// Clears the run folder, makes its logs/ folder and the peers' arguments.
    fn prepare(ctx: &'a Ctx, plan: &'a Plan, folder: PathBuf) -> anyhow::Result<Self> {
        if folder.exists() {
            std::fs::remove_dir_all(&folder)
                .with_context(|| format!("clearing {}", folder.display()))?;
        }
        let logs = folder.join("logs");
        std::fs::create_dir_all(&logs)?;
        let args: Vec<String> = vec![
            format!("--peers={PEERS}"),
            "--topology=ring".into(),
            "--algorithm=dpsgd".into(),
            format!("--epochs={}", plan.epochs),
            format!("--rounds-per-epoch={}", plan.rounds_per_epoch),
            format!("--checkpoint-every={}", plan.checkpoint_every),
            format!("--peer-timeout-secs={PEER_TIMEOUT_SECS}"),
            "--round-timeout-secs=120".into(),
            format!("--out={}", folder.display()),
        ];
        Ok(KillAndResume {
            ctx,
            plan,
            folder,
            logs,
            args,
            limit: Duration::from_secs(if ctx.quick { 300 } else { 1800 }),
            peers: Peers {
                children: Vec::new(),
            },
        })
    }

    /// Starts the peers, kills the victim, restarts it with --resume once the survivors
    /// have trained on without it, and waits for every peer to finish.
    fn events(&mut self) -> anyhow::Result<Events> {
        let plan = self.plan;
        eprintln!(
            "faults: {PEERS} peers, ring, D-PSGD, {} epochs of {} rounds; peer {VICTIM} is killed at round {} and restarted with --resume",
            plan.epochs, plan.rounds_per_epoch, plan.kill_round
        );
        let started = Instant::now();
        let joined = self.start_peers()?;
        let saved_round = self.kill_victim()?;
        let killed_at = Instant::now();
        let rows_before_kill = json_lines(&self.folder.join("epochs.jsonl"))?.len();
        eprintln!(
            "faults: killed peer {VICTIM} (SIGKILL) after its checkpoint of round {saved_round}"
        );

        self.await_departure()?;
        let noticed_secs = killed_at.elapsed().as_secs_f64();
        eprintln!("faults: peer 0 recorded the departure {noticed_secs:.1} s after the kill");

        self.restart_victim(&joined, rows_before_kill)?;
        let restarted_secs = killed_at.elapsed().as_secs_f64();
        eprintln!(
            "faults: restarted peer {VICTIM} with --resume {restarted_secs:.1} s after the kill"
        );

        self.wait_all()?;
        let wall = started.elapsed().as_secs_f64();
        Ok(Events {
            saved_round,
            noticed_secs,
            restarted_secs,
            wall,
        })
    }

    /// Starts peer 0, waits for its address, starts the others with it; returns the
    /// arguments of a peer that joins (with `--bootstrap`).
    fn start_peers(&mut self) -> anyhow::Result<Vec<String>> {
        let boot_file = self.folder.join("bootstrap.addr");
        let mut boot_args = self.args.clone();
        boot_args.push(format!("--bootstrap-file={}", boot_file.display()));
        self.peers
            .spawn(self.ctx, 0, &boot_args, &self.logs.join("peer-0.log"))?;
        let boot = wait_for(
            "peer 0 publishing its address",
            Duration::from_secs(60),
            || {
                Ok(std::fs::read_to_string(&boot_file)
                    .ok()
                    .map(|s| s.trim().to_string()))
            },
        )?;
        let mut joined = self.args.clone();
        joined.push(format!("--bootstrap={boot}"));
        for rank in 1..PEERS {
            self.peers.spawn(
                self.ctx,
                rank,
                &joined,
                &self.logs.join(format!("peer-{rank}.log")),
            )?;
        }
        Ok(joined)
    }

    /// Kills the victim (SIGKILL) once its checkpoint has reached the kill round; returns
    /// the checkpoint's round.
    fn kill_victim(&mut self) -> anyhow::Result<u64> {
        let ckpt = self
            .folder
            .join("checkpoints")
            .join(format!("peer-{VICTIM}.ckpt"));
        let kill_round = self.plan.kill_round;
        let saved_round = wait_for(
            "the victim's checkpoint reaching the kill round",
            self.limit,
            || Ok(checkpoint_round(&ckpt)?.filter(|&r| r >= kill_round)),
        )?;
        let at = self
            .peers
            .children
            .iter()
            .position(|(r, _)| *r == VICTIM)
            .context("victim process")?;
        let (_, mut victim) = self.peers.children.remove(at);
        victim.kill().context("killing the victim")?; // SIGKILL
        victim.wait()?;
        Ok(saved_round)
    }

    /// Waits until the survivors notice the victim's departure and record it.
    fn await_departure(&self) -> anyhow::Result<()> {
        let membership = self.folder.join("membership.jsonl");
        wait_for("the departure being recorded", self.limit, || {
            Ok(json_lines(&membership)?
                .iter()
                .any(|e| e["event"] == "left")
                .then_some(()))
        })
    }

    /// Lets the survivors train a full epoch without the victim (beyond the
    /// `rows_before_kill` epochs recorded at the kill), then restarts it with --resume.
    fn restart_victim(&mut self, joined: &[String], rows_before_kill: usize) -> anyhow::Result<()> {
        let epochs_without = rows_before_kill + 1;
        let epochs = self.folder.join("epochs.jsonl");
        wait_for("an epoch without the victim", self.limit, || {
            Ok((json_lines(&epochs)?.len() > epochs_without).then_some(()))
        })?;
        let mut again = joined.to_vec();
        again.push("--resume".into());
        self.peers.spawn(
            self.ctx,
            VICTIM,
            &again,
            &self.logs.join(format!("peer-{VICTIM}-restarted.log")),
        )
    }

    /// Waits for every peer to finish; a peer still running after the limit, or one that
    /// failed, is the error.
    fn wait_all(&mut self) -> anyhow::Result<()> {
        let limit = self.limit;
        for (rank, child) in &mut self.peers.children {
            let t0 = Instant::now();
            let status = loop {
                if let Some(s) = child.try_wait()? {
                    break s;
                }
                if t0.elapsed() > limit {
                    bail!("faults: peer {rank} still running after {limit:?}");
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            if !status.success() {
                bail!(
                    "faults: peer {rank} failed ({status}); see {}",
                    self.logs.display()
                );
            }
        }
        Ok(())
    }
}

/// Reads epochs.jsonl of the run folder: one line per epoch as peer 0 recorded it.
fn read_epochs(run: &Path) -> anyhow::Result<Vec<EpochLine>> {
    let rows = json_lines(&run.join("epochs.jsonl"))?;
    rows.iter()
        .map(|r| {
            Ok(EpochLine {
                epoch: json_f64(r, "epoch")? as usize,
                peers: json_f64(r, "peers")? as usize,
                mean_test_accuracy: json_f64(r, "mean_test_accuracy")?,
                min_test_accuracy: json_f64(r, "min_test_accuracy")?,
                avg_model_test_accuracy: json_f64(r, "avg_model_test_accuracy")?,
                consensus_distance: json_f64(r, "consensus_distance")?,
            })
        })
        .collect::<anyhow::Result<_>>()
}

/// Writes epochs.csv.
fn write_epochs_csv(dir: &Path, epochs: &[EpochLine]) -> anyhow::Result<()> {
    write_checked_csv(
        &dir.join("epochs.csv"),
        epochs,
        &[
            "epoch",
            "peers",
            "mean_test_accuracy",
            "min_test_accuracy",
            "avg_model_test_accuracy",
            "consensus_distance",
        ],
        &[],
    )
}

/// Reads distances.jsonl of the run folder: each peer's ‖x_i − x̄‖² per epoch.
fn read_distances(run: &Path) -> anyhow::Result<Vec<DistanceLine>> {
    let mut distances = Vec::new();
    for line in json_lines(&run.join("distances.jsonl"))? {
        let epoch = json_f64(&line, "epoch")? as usize;
        let list = line["distances"].as_array().context("distances.jsonl")?;
        for (peer, d) in list.iter().enumerate() {
            if let Some(distance) = d.as_f64() {
                distances.push(DistanceLine {
                    epoch,
                    peer,
                    distance,
                });
            }
        }
    }
    Ok(distances)
}

/// Peer 0's rounds when the victim left and when it mixed again, from membership.jsonl.
fn victim_rounds(membership: &[Value]) -> anyhow::Result<(u64, u64)> {
    let event_round = |kind: &str| {
        membership
            .iter()
            .find(|e| e["event"] == kind && e["peer"] == VICTIM)
            .and_then(|e| e["round"].as_u64())
    };
    let (Some(left_round), Some(back_round)) = (event_round("left"), event_round("rejoined"))
    else {
        bail!("faults: membership.jsonl lacks the departure or the rejoin of peer {VICTIM}");
    };
    Ok((left_round, back_round))
}

/// Each peer's final test accuracy, from its own log.
fn final_accuracies(run: &Path) -> anyhow::Result<Vec<(usize, f64)>> {
    let mut finals = Vec::new();
    for rank in 0..PEERS {
        let lines = json_lines(&run.join("peers").join(format!("peer-{rank}.jsonl")))?;
        let last = lines.last().context("a peer wrote no epoch")?;
        finals.push((rank, json_f64(last, "test_accuracy")?));
    }
    Ok(finals)
}

/// The victim's consensus distance against the other peers' mean distance, at the last
/// epoch before the kill and at the end.
struct Spread {
    /// The last epoch recorded with the victim before the kill.
    before_epoch: usize,
    last_epoch: usize,
    victim_before: f64,
    victim_end: f64,
    others_before: f64,
    others_end: f64,
    ratio_before: f64,
    ratio_end: f64,
}

impl Spread {
    /// The distances at `before_epoch` and `last_epoch`; the victim's must be recorded.
    fn new(
        distances: &[DistanceLine],
        before_epoch: usize,
        last_epoch: usize,
    ) -> anyhow::Result<Spread> {
        let distance_of = |epoch: usize, peer: usize| {
            distances
                .iter()
                .find(|d| d.epoch == epoch && d.peer == peer)
                .map(|d| d.distance)
        };
        let victim_before =
            distance_of(before_epoch, VICTIM).context("victim's distance before the kill")?;
        let victim_end = distance_of(last_epoch, VICTIM).context("victim's distance at the end")?;
        let others_mean = |epoch: usize| {
            let ds: Vec<f64> = (0..PEERS)
                .filter(|&p| p != VICTIM)
                .filter_map(|p| distance_of(epoch, p))
                .collect();
            ds.iter().sum::<f64>() / ds.len().max(1) as f64
        };
        let (others_before, others_end) = (others_mean(before_epoch), others_mean(last_epoch));
        Ok(Spread {
            before_epoch,
            last_epoch,
            victim_before,
            victim_end,
            others_before,
            others_end,
            ratio_before: victim_before / others_before,
            ratio_end: victim_end / others_end,
        })
    }
}

/// Whether each bar of the experiment was met.
struct Bars {
    /// Every survivor reached the accuracy bar.
    survivors_ok: bool,
    /// The victim's distance ratio at the end is at most 1.5× the one before the kill.
    back_ok: bool,
    /// Every peer reports in every epoch from the rejoin on.
    reports_again: bool,
}

/// Reads the run folder, writes the CSV files, plots and summary.md, and checks the bars.
fn report(dir: &Path, run: &Path, plan: &Plan, events: &Events) -> anyhow::Result<()> {
    let epochs = read_epochs(run)?;
    write_epochs_csv(dir, &epochs)?;
    let distances = read_distances(run)?;
    write_checked_csv(
        &dir.join("distances.csv"),
        &distances,
        &["epoch", "peer", "distance"],
        &[],
    )?;
    let membership = json_lines(&run.join("membership.jsonl"))?;
    let summary = parse_json(&std::fs::read(run.join("summary.json"))?)?;
    let (left_round, back_round) = victim_rounds(&membership)?;
    let left_epoch = (left_round / plan.rounds_per_epoch) as usize + 1;
    let back_epoch = (back_round / plan.rounds_per_epoch) as usize + 1;
    let finals = final_accuracies(run)?;
    // The last epoch recorded with the victim before the kill, and the run's last.
    let spread = Spread::new(&distances, left_epoch - 1, plan.epochs)?;
    let report = Report {
        dir,
        plan,
        events,
        epochs,
        distances,
        finals,
        summary,
        left_round,
        back_round,
        left_epoch,
        back_epoch,
        spread,
    };
    report.plot_accuracy()?;
    report.plot_distance()?;
    let bars = report.bars();
    let s = report.summary_md(&bars);
    std::fs::write(dir.join("summary.md"), &s)?;
    eprintln!("{s}");
    if !(bars.survivors_ok && bars.back_ok && bars.reports_again) {
        bail!(
            "faults: a bar was not met (see {})",
            dir.join("summary.md").display()
        );
    }
    Ok(())
}

/// What the plots and summary.md show: the run's records and what the driver saw.
struct Report<'a> {
    dir: &'a Path,
    plan: &'a Plan,
    events: &'a Events,
    epochs: Vec<EpochLine>,
    distances: Vec<DistanceLine>,
    /// (peer, final test accuracy).
    finals: Vec<(usize, f64)>,
    /// The run's summary.json.
    summary: Value,
    /// Peer 0's round when it learned of the departure.
    left_round: u64,
    /// The round from which the victim mixes again.
    back_round: u64,
    left_epoch: usize,
    back_epoch: usize,
    spread: Spread,
}

impl Report<'_> {
    /// Dashed vertical lines at the kill and the rejoin, from `lo` to `hi`.
    fn mark(&self, chart: &mut Chart, lo: f64, hi: f64) {
        for (label, epoch, color) in [
            ("kill", self.left_epoch as f64 - 0.5, 6),
            ("rejoin", self.back_epoch as f64 - 0.5, 7),
        ] {
            chart.series.push(
                Series::line(label, color, vec![(epoch, lo), (epoch, hi)]).stroke(Stroke::Dashed),
            );
        }
    }

    /// Draws the peers' mean, lowest and averaged-model accuracy against epochs.
    fn plot_accuracy(&self) -> anyhow::Result<()> {
        let mut acc = Chart::new(
            format!("{PEERS} peers, ring, D-PSGD: peer {VICTIM} killed and restarted"),
            "epoch",
            "test accuracy",
        );
        acc.y_range = Some((0.0, 1.0));
        acc.legend = SeriesLabelPosition::LowerRight;
        let pts =
            |f: fn(&EpochLine) -> f64| self.epochs.iter().map(|e| (e.epoch as f64, f(e))).collect();
        acc.series.push(Series::line(
            "mean over peers",
            0,
            pts(|e| e.mean_test_accuracy),
        ));
        acc.series
            .push(Series::line("lowest peer", 1, pts(|e| e.min_test_accuracy)));
        acc.series.push(Series::line(
            "averaged model",
            2,
            pts(|e| e.avg_model_test_accuracy),
        ));
        self.mark(&mut acc, 0.0, 1.0);
        acc.save(&self.dir.join("accuracy_vs_epoch"))?;
        Ok(())
    }

    /// Draws the victim's distance to the peers' mean against the other peers' mean
    /// distance.
    fn plot_distance(&self) -> anyhow::Result<()> {
        let mut dist = Chart::new(
            format!("Squared distance to the peers' mean: peer {VICTIM} vs the others"),
            "epoch",
            "‖x_i − mean‖²",
        );
        let victim_pts: Vec<(f64, f64)> = self
            .distances
            .iter()
            .filter(|d| d.peer == VICTIM)
            .map(|d| (d.epoch as f64, d.distance))
            .collect();
        let mut others: Vec<(f64, f64)> = Vec::new();
        for e in &self.epochs {
            let ds: Vec<f64> = self
                .distances
                .iter()
                .filter(|d| d.epoch == e.epoch && d.peer != VICTIM)
                .map(|d| d.distance)
                .collect();
            if !ds.is_empty() {
                others.push((e.epoch as f64, ds.iter().sum::<f64>() / ds.len() as f64));
            }
        }
        let hi = victim_pts
            .iter()
            .chain(&others)
            .fold(0.0f64, |hi, p| hi.max(p.1));
        dist.y_range = Some((0.0, 1.1 * hi));
        dist.series
            .push(Series::line(format!("peer {VICTIM}"), 0, victim_pts).stroke(Stroke::Points));
        dist.series
            .push(Series::line("mean of the other peers", 1, others));
        self.mark(&mut dist, 0.0, 1.1 * hi);
        dist.save(&self.dir.join("distance_vs_epoch"))?;
        Ok(())
    }

    /// Checks the bars.
    fn bars(&self) -> Bars {
        let survivors_ok = self
            .finals
            .iter()
            .filter(|(r, _)| *r != VICTIM)
            .all(|(_, a)| *a >= self.plan.accuracy_bar);
        let back_ok = self.spread.ratio_end <= 1.5 * self.spread.ratio_before;
        let reports_again = self
            .epochs
            .iter()
            .filter(|e| e.epoch >= self.back_epoch)
            .all(|e| e.peers == PEERS);
        Bars {
            survivors_ok,
            back_ok,
            reports_again,
        }
    }

    /// summary.md: the events, each peer's final accuracy, the distances and the bars.
    fn summary_md(&self, bars: &Bars) -> String {
        let (plan, wall) = (self.plan, self.events.wall);
        let mut s = format!(
            "# Fault tolerance: kill -9 and --resume ({PEERS} peers, ring, D-PSGD, MNIST MLP)\n\n\
             {} epochs of {} rounds; checkpoints every {} rounds; peer timeout {PEER_TIMEOUT_SECS} s. \
             Wall time {wall:.0} s.\n\n",
            plan.epochs, plan.rounds_per_epoch, plan.checkpoint_every
        );
        s += &self.events_table();
        s += "\nFinal test accuracy of each peer\n\n";
        s += &self.accuracy_table();
        s += &self.distance_text();
        s += &self.bars_table(bars);
        s += "\nPlots: accuracy_vs_epoch.png, distance_vs_epoch.png; per-epoch numbers in epochs.csv, distances.csv; the run folder (logs, membership.jsonl) in runs/kill-and-resume/.\n";
        s
    }

    /// The table of events: kill, departure, restart, rejoin.
    fn events_table(&self) -> String {
        let ev = self.events;
        let (noticed_secs, restarted_secs) = (ev.noticed_secs, ev.restarted_secs);
        markdown(
            &["event", "value"],
            &[
                vec![
                    format!("peer {VICTIM} killed (SIGKILL) after its checkpoint of round"),
                    ev.saved_round.to_string(),
                ],
                vec![
                    "departure recorded by peer 0 (s after the kill)".into(),
                    format!("{noticed_secs:.1}"),
                ],
                vec![
                    "peer 0's round when it learned of it".into(),
                    self.left_round.to_string(),
                ],
                vec![
                    "restarted with --resume (s after the kill)".into(),
                    format!("{restarted_secs:.1}"),
                ],
                vec!["mixes again from round".into(), self.back_round.to_string()],
                vec![
                    "summary: departures / rejoins".into(),
                    format!(
                        "{} / {}",
                        self.summary["departures"].as_str().unwrap_or(""),
                        self.summary["rejoins"].as_str().unwrap_or("")
                    ),
                ],
            ],
        )
    }

    /// The table of each peer's final test accuracy.
    fn accuracy_table(&self) -> String {
        markdown(
            &["peer", "accuracy"],
            &self
                .finals
                .iter()
                .map(|(r, a)| {
                    vec![
                        if *r == VICTIM {
                            format!("{r} (restarted)")
                        } else {
                            r.to_string()
                        },
                        format!("{:.2}%", 100.0 * a),
                    ]
                })
                .collect::<Vec<_>>(),
        )
    }

    /// The paragraph on the victim's distance to the peers' mean and the network's Ξ².
    fn distance_text(&self) -> String {
        let Spread {
            before_epoch,
            last_epoch,
            victim_before,
            victim_end,
            others_before,
            others_end,
            ratio_before,
            ratio_end,
        } = self.spread;
        format!(
            "\nDistance to the peers' mean ‖x_{VICTIM} − x̄‖²: {victim_before:.3e} at epoch {before_epoch} (before the kill; \
             the other peers' mean {others_before:.3e}, ratio {ratio_before:.2}), {victim_end:.3e} at epoch {last_epoch} \
             (the end; the others' mean {others_end:.3e}, ratio {ratio_end:.2}). Network Ξ²: {:.3e} before the kill, \
             {:.3e} at the last epoch without peer {VICTIM}, {:.3e} at the end.\n\n",
            self.epochs[before_epoch].consensus_distance,
            self.epochs[self.back_epoch - 1].consensus_distance,
            self.epochs[last_epoch].consensus_distance,
        )
    }

    /// The table of the bars and whether each was met.
    fn bars_table(&self, bars: &Bars) -> String {
        let verdict = |ok: bool| if ok { "yes" } else { "NO" };
        let back_epoch = self.back_epoch;
        markdown(
            &["bar", "met"],
            &[
                vec![
                    format!("every survivor ≥ {:.0}%", 100.0 * self.plan.accuracy_bar),
                    verdict(bars.survivors_ok).into(),
                ],
                vec![
                    format!("peer {VICTIM} reports again from epoch {back_epoch}"),
                    verdict(bars.reports_again).into(),
                ],
                vec![
                    format!(
                        "peer {VICTIM}'s distance relative to the others' at the end ≤ 1.5× that ratio before the kill"
                    ),
                    verdict(bars.back_ok).into(),
                ],
            ],
        )
    }
}
