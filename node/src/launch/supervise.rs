//! The launcher's supervision of the peer processes: starting them, watching them (paused,
//! continued, exited), restarting the failed ones and deciding when the run must stop.

use super::*;

/// What the launcher does when a peer process exits: the restart policy, apart from the
/// processes and the printing (pure; unit-tested below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RestartPolicy {
    /// `--restart-failed`: how many times one peer may be restarted.
    pub restart_failed: u32,
    /// The run's epochs: a peer that fails in the last one is not restarted.
    pub epochs: usize,
    /// Whether the run's algorithm trains on without a peer.
    pub survives_departure: bool,
}

/// The launcher's verdict on a peer process that exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exit {
    /// It exited with success: the run ended for it.
    Finished,
    /// It failed, will not be restarted, and the algorithm cannot go on without it.
    StopRun,
    /// It failed and will not be restarted; the others train on without it (peer 0
    /// included: the lowest live peer keeps the record, a member admits).
    GoOn,
    /// It failed after the record already held the run's last epoch (every peer's reports
    /// of every epoch are in): nothing is lost and nothing is restarted, whatever its rank
    /// or the algorithm; the run ends when the others have exited.
    AfterRecord,
    /// Restart it with `--resume` at once; its `attempt`-th restart.
    Restart {
        /// 1 for the first restart.
        attempt: u32,
    },
}

impl RestartPolicy {
    /// The verdict on a peer process exiting (`success`: exit status 0) at `epoch`, after
    /// `restarts_done` restarts of that peer; the same for every rank, peer 0 included.
    pub(super) fn on_exit(&self, success: bool, epoch: usize, restarts_done: u32) -> Exit {
        if success {
            return Exit::Finished;
        }
        if epoch >= self.epochs {
            return Exit::AfterRecord;
        }
        let restart = restarts_done < self.restart_failed;
        match (restart, self.survives_departure) {
            (true, _) => Exit::Restart {
                attempt: restarts_done + 1,
            },
            (false, true) => Exit::GoOn,
            (false, false) => Exit::StopRun,
        }
    }
}

/// How long peers get to exit after SIGTERM before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// One peer process under supervision.
struct Proc {
    rank: usize,
    /// Its incarnation number (`MURMUR_INCARNATION`, set at its start).
    incarnation: crate::plane::Incarnation,
    child: Child,
    /// Its standard input: the launcher's notices of other peers' exits.
    notices: Option<std::process::ChildStdin>,
    /// Whether it was seen stopped (SIGSTOP) and not yet seen running again.
    stopped: bool,
}

impl Proc {
    /// Writes `line` (an exit notice) to the process's standard input; best effort: a
    /// process that exited is not written to again.
    fn notify(&mut self, line: &str) {
        if let Some(stdin) = self.notices.as_mut() {
            use std::io::Write;
            if stdin.write_all(line.as_bytes()).is_err() {
                self.notices = None;
            }
        }
    }
}

/// Every peer process of the run; stops them all when dropped.
struct Peers {
    procs: Vec<Proc>,
    /// The latest process of each rank seen to exit, as rank → (incarnation, how).
    exits: std::collections::BTreeMap<usize, (crate::plane::Incarnation, String)>,
}

impl Peers {
    /// Tells every peer process but `rank`'s that `rank`'s process of incarnation
    /// `incarnation` exited (`how`), so that they stop waiting for it at once. Best effort:
    /// a peer that exited meanwhile is skipped.
    fn tell_exit(&mut self, rank: usize, incarnation: crate::plane::Incarnation, how: &str) {
        let line = crate::peer::supervisor::exit_notice(rank, incarnation, how);
        self.exits.insert(rank, (incarnation, how.to_string()));
        for p in self.procs.iter_mut().filter(|p| p.rank != rank) {
            p.notify(&line);
        }
    }

    /// Adds a newly started process, first telling it of the latest process of each other
    /// rank that exited: a restarted peer may hold their old addresses (a directory taken
    /// just before they came back), and a link to a process known to have exited fails at
    /// once instead of waiting out the handshake's timeout (10 s, during which the others
    /// could finish the run). A notice about a process older than the one it knows of is
    /// ignored by the peer.
    fn add(&mut self, mut proc: Proc) {
        for (&rank, (incarnation, how)) in &self.exits {
            if rank != proc.rank {
                proc.notify(&crate::peer::supervisor::exit_notice(
                    rank,
                    *incarnation,
                    how,
                ));
            }
        }
        self.procs.push(proc);
    }

    /// Sends `signal` to every peer, waits up to [`STOP_GRACE`] for them to exit, then
    /// kills the rest.
    fn stop_all(&mut self, signal: i32) {
        for p in &self.procs {
            signals::send(&p.child, signal);
            // A stopped process acts on SIGTERM only once it continues.
            signals::send(&p.child, libc::SIGCONT);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline
            && self
                .procs
                .iter_mut()
                .any(|p| matches!(p.child.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        self.procs.clear();
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.stop_all(libc::SIGTERM);
    }
}

/// What the launcher saw of the peer processes: failures and restarts.
#[derive(Default)]
pub(super) struct Record {
    /// `rank:how@epoch` per failure.
    pub(super) failures: Vec<String>,
    /// `rank@epoch` per restart.
    pub(super) restarts: Vec<String>,
    /// Restarts so far by rank.
    restarts_of: BTreeMap<usize, u32>,
}

/// Starts peer processes of this binary on the run's config file.
pub(super) struct Spawner {
    pub(super) exe: PathBuf,
    pub(super) run_config: PathBuf,
    pub(super) run_dir: PathBuf,
    /// Compute threads per peer (`RAYON_NUM_THREADS` for the flex backend and
    /// `OMP_NUM_THREADS` for libtorch's, unless the environment sets it).
    pub(super) threads_per_peer: usize,
}

impl Spawner {
    /// Starts peer `rank` with the extra options `extra`; its stdout and stderr are
    /// appended to `<run>/logs/peer-<rank>.log` (a restarted peer's log follows its
    /// earlier process's).
    fn spawn(&self, rank: usize, extra: Vec<String>) -> anyhow::Result<Proc> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path(&self.run_dir, rank))?;
        let log2 = log.try_clone()?;
        // Larger than any earlier process of this rank: microseconds since the epoch.
        let incarnation = crate::plane::incarnation_now();
        let mut cmd = Command::new(&self.exe);
        cmd.arg("peer")
            .arg(format!("--config={}", self.run_config.display()))
            .arg(format!("--rank={rank}"))
            .arg(format!("--out={}", self.run_dir.display()))
            .arg(format!(
                "--address-file={}",
                address_path(&self.run_dir, rank).display()
            ))
            .args(extra)
            .env("RAYON_NUM_THREADS", self.threads_per_peer.to_string())
            .env("MURMUR_INCARNATION", incarnation.to_string())
            .env(crate::peer::supervisor::SUPERVISED, "1")
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(log2);
        // libtorch's OpenMP pool takes every core in each process otherwise: 8 peers on
        // 2 cores took 47.9 s without it, 8.2-11.2 s with it (launch --epochs 4 --device
        // libtorch; flex 8.0 s).
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", self.threads_per_peer.to_string());
        }
        signals::die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start peer {rank}"))?;
        Ok(Proc {
            rank,
            incarnation,
            notices: child.stdin.take(),
            child,
            stopped: false,
        })
    }
}

/// How many members' addresses a restarted peer is given besides peer 0's: each is dialled
/// and asked, and one answer is enough.
const ENTRY_MEMBERS: usize = 4;

/// The supervisor of one launch: the processes, what it has shown, and the restarts due.
pub(super) struct Supervisor<'a> {
    args: &'a RunArgs,
    launch: &'a LaunchArgs,
    spawner: Spawner,
    peers: Peers,
    record: Record,
    /// peer 0's libp2p address, once it has published it.
    bootstrap: String,
    /// Ranks of an elastic run still to join, in order.
    to_join: Vec<usize>,
    /// Epoch rows and membership events printed so far.
    shown: usize,
    events_shown: usize,
    /// Restarts due: ranks whose process failed and is to be started again.
    pending: Vec<usize>,
}

/// How a supervised run ended.
pub(super) enum Ended {
    /// Every peer exited (peer 0 successfully).
    Completed,
    /// The launcher stopped the run: why.
    Stopped(String),
    /// A signal asked the launcher to stop.
    Interrupted(i32),
}

impl<'a> Supervisor<'a> {
    /// Starts peer 0 and, once it has published its address, the run's initial peers.
    ///
    /// # Errors
    /// A peer cannot be started; peer 0 fails or publishes no address within 30 s;
    /// [`Interrupted`] by a signal meanwhile.
    pub(super) fn start(
        args: &'a RunArgs,
        launch: &'a LaunchArgs,
        spawner: Spawner,
        initial: usize,
    ) -> anyhow::Result<Supervisor<'a>> {
        let mut peers = Peers {
            procs: Vec::new(),
            exits: Default::default(),
        };
        let run_dir = spawner.run_dir.clone();
        let addr_file = crate::peer::bootstrap_file(&run_dir);
        let mut first = vec![format!("--bootstrap-file={}", addr_file.display())];
        if initial < args.peers {
            first.push(format!("--initial-peers={initial}"));
        }
        peers.add(spawner.spawn(0, first)?);
        let t0 = Instant::now();
        let bootstrap = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                break a.trim().to_string();
            }
            if let Some(signal) = signals::received() {
                peers.stop_all(signal);
                return Err(Interrupted { signal }.into());
            }
            if let Some(p) = peers.procs.first_mut() {
                if let Ok(Some(status)) = p.child.try_wait() {
                    bail!(
                        "peer 0 failed before the run started ({}). End of {}:\n{}",
                        how(status),
                        log_path(&run_dir, 0).display(),
                        log_tail(&run_dir, 0, 8)
                    );
                }
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!(
                    "peer 0 did not publish its address within 30 s; see {}",
                    log_path(&run_dir, 0).display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        for rank in 1..initial {
            peers
                .procs
                .push(spawner.spawn(rank, vec![format!("--bootstrap={bootstrap}")])?);
        }
        Ok(Supervisor {
            args,
            launch,
            spawner,
            peers,
            record: Record::default(),
            bootstrap,
            to_join: (initial..args.peers).collect(),
            shown: 0,
            events_shown: 0,
            pending: Vec::new(),
        })
    }

    /// Watches the run until every peer has exited, the run must stop, or a signal comes;
    /// prints the epoch rows and membership events (through `print`) as they appear.
    ///
    /// # Errors
    /// A peer cannot be (re)started.
    pub(super) fn watch(
        &mut self,
        bar: &indicatif::ProgressBar,
        print: &dyn Fn(String),
    ) -> anyhow::Result<Ended> {
        loop {
            let rows: Vec<EpochRow> = read_lines(&self.epochs_file());
            for row in rows.iter().skip(self.shown) {
                print(report::format_row(row));
                bar.set_position(row.epoch as u64);
                bar.set_message(format!("x̄ acc {:.2}%", 100.0 * row.avg_model_test_accuracy));
            }
            self.shown = self.shown.max(rows.len());
            let events: Vec<MembershipEvent> = read_lines(&self.membership_file());
            for e in events.iter().skip(self.events_shown) {
                print(membership_line(e));
            }
            self.events_shown = self.events_shown.max(events.len());
            let epoch = rows.last().map_or(0, |r| r.epoch);

            if let Some(signal) = signals::received() {
                return Ok(Ended::Interrupted(signal));
            }
            self.join_due(&rows, print)?;
            let stop = self.check_processes(epoch, print);
            self.restart_due(print)?;
            if let Some(why) = stop {
                return Ok(Ended::Stopped(why));
            }
            if self.peers.procs.is_empty() {
                return Ok(Ended::Completed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An elastic run: starts every rank still to join once its epoch is due, all at once.
    /// The run takes them in one at a time, neighbours of its members first (see the
    /// guide, elastic runs), so that no two neighbours join half-way together.
    fn join_due(&mut self, rows: &[EpochRow], print: &dyn Fn(String)) -> anyhow::Result<()> {
        let due =
            !self.bootstrap.is_empty() && rows.iter().any(|r| r.epoch >= self.launch.join_at_epoch);
        if !due {
            return Ok(());
        }
        for rank in std::mem::take(&mut self.to_join) {
            // Peer 0 and some members: a member admits it if peer 0 is away meanwhile.
            let mut extra = vec![format!("--bootstrap={}", self.bootstrap)];
            extra.extend(
                self.members(rank)
                    .iter()
                    .map(|a| format!("--bootstrap={a}")),
            );
            extra.push("--join-running".into());
            self.peers.add(self.spawner.spawn(rank, extra)?);
            print(format!("rank {rank} joins the running run"));
        }
        Ok(())
    }

    /// Reports paused, continued and exited processes; records failures and queues the
    /// restarts allowed. Returns why the run must stop, if it must.
    fn check_processes(&mut self, epoch: usize, print: &dyn Fn(String)) -> Option<String> {
        let (args, launch) = (self.args, self.launch);
        let mut exited = Vec::new();
        self.peers.procs.retain_mut(|p| match p.child.try_wait() {
            Ok(None) => {
                let stopped = signals::is_stopped(&p.child);
                if stopped != p.stopped {
                    p.stopped = stopped;
                    print(if stopped {
                        // QUIC links alone cannot tell a stopped process from a dead one.
                        let wait = match args.net.transport {
                            crate::plane::TransportChoice::Quic => format!(
                                "--peer-timeout-secs {} s (QUIC links cannot tell it from a \
                                 dead one)",
                                args.timeouts().peer.as_secs()
                            ),
                            _ => format!(
                                "--paused-timeout-secs {} s",
                                args.timeouts().paused().as_secs()
                            ),
                        };
                        format!(
                            "peer {} is stopped (SIGSTOP or a debugger) at epoch {epoch}; its \
                             neighbours wait for it up to {wait}, then go on without it",
                            p.rank,
                        )
                    } else {
                        format!("peer {} continues", p.rank)
                    });
                }
                true
            }
            Ok(Some(status)) => {
                exited.push((p.rank, p.incarnation, Some(status)));
                false
            }
            Err(_) => {
                exited.push((p.rank, p.incarnation, None));
                false
            }
        });
        // A peer killed by a signal first: the survivors of a killed neighbour may exit
        // with an error in the same poll, and the stated cause should be the kill.
        exited.sort_by_key(|(_, _, status)| {
            use std::os::unix::process::ExitStatusExt;
            status.map_or(1, |s| u8::from(s.signal().is_none()))
        });
        let mut stop = None;
        for (rank, incarnation, status) in exited {
            let success = status.is_some_and(|s| s.success());
            if !success {
                let how = status.map_or_else(|| "lost".to_string(), how);
                self.peers.tell_exit(rank, incarnation, &how);
            }
            let done = self.record.restarts_of.get(&rank).copied().unwrap_or(0);
            let policy = RestartPolicy {
                restart_failed: launch.restart_failed,
                epochs: args.train.epochs,
                survives_departure: args.survives_departure(),
            };
            let verdict = policy.on_exit(success, epoch, done);
            if verdict == Exit::Finished {
                continue;
            }
            let how = status.map_or_else(|| "lost".to_string(), how);
            self.record.failures.push(format!("{rank}:{how}@{epoch}"));
            let cause = last_error(&self.spawner.run_dir, rank)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            match verdict {
                Exit::Finished => {}
                Exit::StopRun => {
                    stop.get_or_insert(format!(
                        "peer {rank} failed ({how}) at epoch {epoch}{cause}, and {} cannot go \
                         on without a peer ({} can)",
                        args.algorithm_name(),
                        murmur_gossip::AlgorithmSpec::names_where(|a| a
                            .capabilities()
                            .survives_departure())
                    ));
                }
                Exit::AfterRecord => print(format!(
                    "peer {rank} failed ({how}) after the run's last epoch was recorded{cause}; \
                     the record is complete"
                )),
                Exit::GoOn => print(format!(
                    "peer {rank} failed ({how}) at epoch {epoch}{cause}; the others go on \
                     without it"
                )),
                Exit::Restart { attempt } => {
                    print(format!(
                        "peer {rank} failed ({how}) at epoch {epoch}{cause}; restarting it \
                         with --resume ({attempt} of {})",
                        launch.restart_failed
                    ));
                    self.record.restarts_of.insert(rank, attempt);
                    self.record.restarts.push(format!("{rank}@{epoch}"));
                    self.pending.push(rank);
                }
            }
        }
        stop
    }

    /// Starts the queued restarts, at once: the new process's hello tells its neighbours
    /// that the old one has left, and its incarnation number (a larger one than the old
    /// process's, [`crate::plane::Incarnation`]) keeps the departure notices about the old
    /// process from closing the new one's connections. A restarted peer is given every
    /// live member's libp2p address (and peer 0's, once it has published it): any member
    /// takes it back, so it does not wait for peer 0. Peer 0 comes back with
    /// `--rejoin-running` (it serves as the bootstrap again at a new address, after taking
    /// the directory as it stands from a member).
    fn restart_due(&mut self, print: &dyn Fn(String)) -> anyhow::Result<()> {
        let addr_file = crate::peer::bootstrap_file(&self.spawner.run_dir);
        for &rank in &self.pending {
            let _ = std::fs::remove_file(address_path(&self.spawner.run_dir, rank));
        }
        if self.pending.contains(&0) {
            self.pending.retain(|&r| r != 0);
            let _ = std::fs::remove_file(&addr_file);
            self.bootstrap.clear();
            let mut extra = vec![
                format!("--bootstrap-file={}", addr_file.display()),
                "--resume".into(),
                "--rejoin-running".into(),
            ];
            extra.extend(
                self.members(0)
                    .into_iter()
                    .map(|a| format!("--bootstrap={a}")),
            );
            self.peers.add(self.spawner.spawn(0, extra)?);
            print("peer 0 restarted with --resume --rejoin-running".into());
        }
        if self.bootstrap.is_empty() {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                self.bootstrap = a.trim().to_string();
            }
        }
        for rank in std::mem::take(&mut self.pending) {
            let mut entries = self.members(rank);
            if !self.bootstrap.is_empty() {
                entries.insert(0, self.bootstrap.clone());
            }
            if entries.is_empty() {
                // Nobody to come back through yet (peer 0 restarting alone): next time.
                self.pending.push(rank);
                continue;
            }
            let mut extra: Vec<String> =
                entries.iter().map(|a| format!("--bootstrap={a}")).collect();
            extra.push("--resume".into());
            self.peers.add(self.spawner.spawn(rank, extra)?);
            print(format!("peer {rank} restarted with --resume"));
        }
        Ok(())
    }

    /// The libp2p multiaddrs that up to [`ENTRY_MEMBERS`] live peers other than 0 and
    /// `except` have published (`<run>/addrs/peer-<rank>.addr`), through which a restarted
    /// peer comes back.
    fn members(&self, except: usize) -> Vec<String> {
        self.peers
            .procs
            .iter()
            .filter(|p| p.rank != 0 && p.rank != except)
            .filter_map(|p| {
                std::fs::read_to_string(address_path(&self.spawner.run_dir, p.rank)).ok()
            })
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .take(ENTRY_MEMBERS)
            .collect()
    }

    /// Stops every peer (with `signal`, then SIGKILL after the grace period).
    pub(super) fn stop_all(&mut self, signal: i32) {
        self.peers.stop_all(signal);
    }

    /// Writes `summary.json` of a run ended early, with `outcome`.
    pub(super) fn save_partial(
        &self,
        topo: &murmur_topology::Topology,
        dim: usize,
        outcome: String,
    ) -> anyhow::Result<Vec<EpochRow>> {
        let rows: Vec<EpochRow> = read_lines(&self.epochs_file());
        save_partial(
            self.args,
            topo,
            dim,
            &self.spawner.run_dir,
            &rows,
            &self.record,
            outcome,
        )?;
        Ok(rows)
    }

    /// After a completed run: prints what was not shown yet, adds the failures and
    /// restarts to peer 0's summary and returns it. If peer 0 died after the last epoch's
    /// row but before it wrote the summary, the summary is written from that row (the
    /// averaged model x̄ it would have written is then missing, said on stderr).
    pub(super) fn conclude(
        &self,
        topo: &murmur_topology::Topology,
        dim: usize,
    ) -> anyhow::Result<Summary> {
        let run_dir = &self.spawner.run_dir;
        if !run_dir.join("summary.json").exists() {
            self.save_partial(topo, dim, crate::report::COMPLETED.to_string())?;
            if !run_dir.join("model.safetensors").exists() {
                eprintln!(
                    "warning: peer 0 died after the last epoch was recorded and before it \
                     wrote model.safetensors: the run folder has no model (every peer's last \
                     checkpoint is in checkpoints/ if --checkpoint-every was given)"
                );
            }
        }
        let rows: Vec<EpochRow> = read_lines(&self.epochs_file());
        for row in rows.iter().skip(self.shown) {
            println!("{}", report::format_row(row));
        }
        let events: Vec<MembershipEvent> = read_lines(&self.membership_file());
        for e in events.iter().skip(self.events_shown) {
            println!("{}", membership_line(e));
        }
        let mut summary: Summary = serde_json::from_slice(
            &std::fs::read(run_dir.join("summary.json")).context("peer 0 wrote no summary.json")?,
        )?;
        if !self.record.failures.is_empty() {
            summary.peer_failures = self.record.failures.join(" ");
            summary.restarts = self.record.restarts.join(" ");
            report::save_summary(run_dir, &summary)?;
        }
        Ok(summary)
    }

    fn epochs_file(&self) -> PathBuf {
        self.spawner.run_dir.join("epochs.jsonl")
    }

    fn membership_file(&self) -> PathBuf {
        self.spawner.run_dir.join("membership.jsonl")
    }
}

#[cfg(test)]
mod tests {
    use super::{Exit, RestartPolicy};

    #[test]
    fn the_restart_policy_restarts_up_to_its_limit_whatever_the_rank() {
        let p = RestartPolicy {
            restart_failed: 2,
            epochs: 10,
            survives_departure: true,
        };
        assert_eq!(p.on_exit(true, 4, 0), Exit::Finished);
        assert_eq!(p.on_exit(true, 10, 0), Exit::Finished);
        assert_eq!(p.on_exit(false, 4, 0), Exit::Restart { attempt: 1 });
        assert_eq!(p.on_exit(false, 4, 1), Exit::Restart { attempt: 2 });
        assert_eq!(p.on_exit(false, 4, 2), Exit::GoOn, "the limit is reached");
        assert_eq!(
            p.on_exit(false, 10, 0),
            Exit::AfterRecord,
            "after the last epoch's row"
        );
        let fixed = RestartPolicy {
            survives_departure: false,
            restart_failed: 0,
            ..p
        };
        assert_eq!(fixed.on_exit(false, 4, 0), Exit::StopRun);
        assert_eq!(fixed.on_exit(false, 10, 0), Exit::AfterRecord);
        let restarting = RestartPolicy {
            restart_failed: 1,
            ..fixed
        };
        assert_eq!(
            restarting.on_exit(false, 4, 0),
            Exit::Restart { attempt: 1 }
        );
    }
}
