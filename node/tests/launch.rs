//! `murmur launch` as a supervisor, tested as a user meets it: the real launcher with real
//! peer processes on 127.0.0.1, and real signals — kill -9 of a peer, SIGSTOP/SIGCONT of a
//! peer, SIGTERM to the launcher.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A `murmur launch` process with its run folder; killed when the test ends.
struct Launch {
    dir: tempfile::TempDir,
    child: Child,
}

impl Drop for Launch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its peers die with it (PR_SET_PDEATHSIG); any left are this test's.
        for pid in peers_of(&self.run()) {
            signal(pid, libc::SIGKILL);
        }
    }
}

/// Options that keep a run short and notice a silent peer within seconds.
const SHORT: &[&str] = &[
    "--peers=4",
    "--rounds-per-epoch=16",
    "--peer-timeout-secs=5",
    "--round-timeout-secs=20",
];

impl Launch {
    /// Starts `murmur launch` with `args` (and [`SHORT`]) into a fresh folder.
    fn start(args: &[&str]) -> Launch {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_murmur"))
            .arg("launch")
            .args(SHORT)
            .args(args)
            .arg(format!("--out={}", dir.path().display()))
            .arg("--run-id=run")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Launch { dir, child }
    }

    fn run(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Waits (polling every 5 ms, at most 30 s) until peer `rank`'s log contains `text`.
    fn wait_for_log(&self, rank: usize, text: &str) {
        let t0 = Instant::now();
        while !std::fs::read_to_string(self.run().join(format!("logs/peer-{rank}.log")))
            .is_ok_and(|log| log.contains(text))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "peer {rank} never logged {text:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until epoch `epoch` is recorded.
    fn wait_for_epoch(&mut self, epoch: u64) {
        let t0 = Instant::now();
        loop {
            let last = std::fs::read_to_string(self.run().join("epochs.jsonl"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter_map(|r| r["epoch"].as_u64())
                .max();
            if last.is_some_and(|e| e >= epoch) {
                return;
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!(
                    "launch ended ({s}) before epoch {epoch}: {}",
                    self.output().1
                );
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "no epoch {epoch}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid of peer `rank`'s current process.
    fn peer(&self, rank: usize) -> i32 {
        let flag = format!("--rank={rank}");
        let t0 = Instant::now();
        loop {
            if let Some(pid) = peers_of(&self.run())
                .into_iter()
                .find(|&pid| cmdline(pid).contains(&flag))
            {
                return pid;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no peer {rank}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the launcher to exit; its status, stdout and stderr.
    /// Kills peer `rank` with SIGKILL once epoch 2 is recorded, and expects the launcher to
    /// complete the run `within` that long: returns its stdout and the summary.
    fn kill_and_finish(&mut self, rank: usize, within: Duration) -> (String, Value) {
        self.wait_for_epoch(2);
        signal(self.peer(rank), libc::SIGKILL);
        let (status, out, err) = self.finish(within);
        assert!(status.success(), "{out}\n{err}");
        let s = self.summary();
        assert_eq!(text(&s["outcome"]), "completed");
        (out, s)
    }

    fn finish(&mut self, within: Duration) -> (ExitStatus, String, String) {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < within,
                "launch still running after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let (out, err) = self.output();
        (status, out, err)
    }

    /// What the launcher printed (read once it has exited).
    fn output(&mut self) -> (String, String) {
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(s) = self.child.stdout.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(s) = self.child.stderr.as_mut() {
            let _ = s.read_to_string(&mut err);
        }
        (out, err)
    }

    fn summary(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.run().join("summary.json")).unwrap()).unwrap()
    }

    /// Asserts that `epochs.jsonl` has the rows of epochs 0..=`last`, each once, in order.
    fn assert_every_epoch_once(&self, last: u64) {
        let rows = std::fs::read_to_string(self.run().join("epochs.jsonl")).unwrap();
        let epochs: Vec<u64> = rows
            .lines()
            .map(|r| {
                serde_json::from_str::<Value>(r).unwrap()["epoch"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(epochs, (0..=last).collect::<Vec<u64>>(), "{rows}");
    }

    fn log(&self, rank: usize) -> String {
        std::fs::read_to_string(self.run().join(format!("logs/peer-{rank}.log"))).unwrap()
    }
}

/// The command line of process `pid`.
fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The live `murmur peer` processes writing into `run`.
fn peers_of(run: &Path) -> Vec<i32> {
    let out = format!("--out={}", run.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let c = cmdline(pid);
            c.get(1).is_some_and(|a| a == "peer") && c.contains(&out) && !is_zombie(pid)
        })
        .collect()
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid read from /proc just before.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Stops process `pid` (SIGSTOP) for `pause`, then lets it continue.
fn stop_for(pid: i32, pause: Duration) {
    signal(pid, libc::SIGSTOP);
    std::thread::sleep(pause);
    signal(pid, libc::SIGCONT);
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

#[test]
fn a_killed_peer_is_restarted_and_rejoins_under_restart_failed() {
    let mut l = Launch::start(&["--epochs=8", "--checkpoint-every=16", "--restart-failed"]);
    let (out, s) = l.kill_and_finish(2, Duration::from_secs(240));
    assert!(
        out.contains("peer 2 failed (SIGKILL)") && out.contains("restarting it with --resume"),
        "{out}"
    );
    assert!(text(&s["peer_failures"]).starts_with("2:SIGKILL@"), "{s}");
    assert!(text(&s["restarts"]).starts_with("2@"), "{s}");
    assert!(text(&s["rejoins"]).starts_with("2@"), "{s}");
    // The restarted process logged after the first one, in the same file.
    let log = l.log(2);
    assert!(log.contains("loaded the checkpoint"), "{log}");
    assert!(s["final_min_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    assert_eq!(s["epochs"].as_u64(), Some(8));
}

/// Decentralized DiLoCo (`diloco-gossip`, H = 4): a killed peer is restarted and one
/// process rejoins the running run (it used to need the whole run resumed) at an outer
/// step, round ≡ H − 1 (mod H), whose frames its neighbours send, having fetched x, its
/// optimizer's state and DiLoCo's anchor and outer velocity from its donors.
#[test]
fn a_killed_diloco_gossip_peer_rejoins_at_an_outer_step() {
    let mut l = Launch::start(&[
        "--epochs=8",
        "--checkpoint-every=16",
        "--restart-failed",
        "--algorithm=diloco-gossip",
        "--local-steps=4",
    ]);
    let (out, s) = l.kill_and_finish(2, Duration::from_secs(240));
    assert!(out.contains("restarting it with --resume"), "{out}");
    let rejoins = text(&s["rejoins"]);
    let round: u64 = rejoins
        .strip_prefix("2@")
        .and_then(|r| {
            let digits: String = r.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no rejoin of peer 2: {s}"));
    assert_eq!(
        (round + 1) % 4,
        0,
        "rejoined at round {round}, not an outer step"
    );
    let log = l.log(2);
    assert!(
        log.contains("caught up: x, the optimizer's state and the algorithm's state fetched"),
        "{log}"
    );
    assert!(s["final_min_test_accuracy"].as_f64().unwrap() > 0.75, "{s}");
    assert_eq!(s["epochs"].as_u64(), Some(8));
}

/// Peer 0 killed and not restarted: the lowest live peer (1) takes up the record in the
/// same run folder, records peer 0's departure, and completes every epoch with the others'
/// reports; the run exits with success and the model leaves it. Before, the launcher
/// stopped the run ("peer 0 (the bootstrap, which collects the metrics) failed").
#[test]
fn a_killed_peer_0_that_does_not_come_back_leaves_the_record_to_the_lowest_live_peer() {
    let mut l = Launch::start(&["--epochs=8"]);
    let (out, s) = l.kill_and_finish(0, Duration::from_secs(60));
    assert!(out.contains("peer 0 failed (SIGKILL)"), "{out}");
    assert!(text(&s["departures"]).starts_with("0@"), "{s}");
    assert_eq!(text(&s["peer_failures"]), "0:SIGKILL@2", "{s}");
    assert!(s["final_mean_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    l.assert_every_epoch_once(8);
    let rows = std::fs::read_to_string(l.run().join("epochs.jsonl")).unwrap();
    let last: Value = serde_json::from_str(rows.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["peers"], 3,
        "the last epoch counts the 3 survivors: {last}"
    );
    assert!(l.run().join("model.safetensors").exists());
    let membership = std::fs::read_to_string(l.run().join("membership.jsonl")).unwrap();
    let events: Vec<Value> = (membership.lines())
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{membership}");
    assert_eq!(
        (&events[0]["event"], &events[0]["peer"]),
        (&"left".into(), &0.into())
    );
    assert!(
        l.log(1).contains("keeps the run's record"),
        "peer 1 stood in: {}",
        l.log(1)
    );
}

/// Peer 0 killed, then peer 1 killed the moment it stands in for it (it logged that it keeps
/// the record): peer 2 stands in next, both restarted processes come back, and the record
/// has every epoch once with both departures and both rejoins.
#[test]
fn a_stand_in_killed_while_it_keeps_the_record_hands_it_on() {
    let mut l = Launch::start(&["--epochs=10", "--checkpoint-every=16", "--restart-failed"]);
    l.wait_for_epoch(3);
    signal(l.peer(0), libc::SIGKILL);
    // Peer 1 stands in.
    l.wait_for_log(1, "keeps the run's record (");
    signal(l.peer(1), libc::SIGKILL);
    let (status, out, err) = l.finish(Duration::from_secs(120));
    assert!(status.success(), "{out}\n{err}");
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed", "{s}");
    l.assert_every_epoch_once(10);
    let (departures, rejoins) = (text(&s["departures"]), text(&s["rejoins"]));
    for rank in ["0@", "1@"] {
        assert!(
            departures.split_whitespace().any(|d| d.starts_with(rank)),
            "{s}"
        );
        assert!(
            rejoins.split_whitespace().any(|d| d.starts_with(rank)),
            "{s}"
        );
    }
    assert!(s["final_mean_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    for rank in 0..4 {
        assert!(
            !l.log(rank).contains("timed out"),
            "peer {rank}: {}",
            l.log(rank)
        );
    }
}

#[test]
fn a_killed_peer_0_is_restarted_and_the_record_goes_on_without_a_gap() {
    let mut l = Launch::start(&["--epochs=8", "--checkpoint-every=16", "--restart-failed"]);
    let (out, s) = l.kill_and_finish(0, Duration::from_secs(240));
    assert!(
        out.contains("peer 0 failed (SIGKILL)")
            && out.contains("peer 0 restarted with --resume --rejoin-running"),
        "{out}"
    );
    assert!(text(&s["peer_failures"]).starts_with("0:SIGKILL@"), "{s}");
    assert!(text(&s["rejoins"]).starts_with("0@"), "{s}");
    assert_eq!(s["epochs"].as_u64(), Some(8));
    assert!(s["final_min_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    // Every epoch once in the record, though two processes of peer 0 wrote it.
    l.assert_every_epoch_once(8);
    // The new process took the directory as it stands from a member (the launcher gives
    // it the members' addresses), then served as the bootstrap again.
    let log = l.log(0);
    assert!(
        log.contains("took the run's directory as it stands from a member")
            && log.contains("the bootstrap serves the running run again"),
        "{log}"
    );
}

/// Peers 0 and 1 of the 4-peer ring killed in the same instant (one host of two peers
/// lost): both come back, each through a member, and the ring mixes again without waiting
/// out a round timeout. Before, the two new processes disagreed whether the other was back
/// (one mixed with a neighbour it had no link to, or each waited for the other's first
/// frame): 4 of 6 runs stopped or lost a peer for good.
#[test]
fn peers_0_and_1_killed_together_both_come_back() {
    let mut l = Launch::start(&["--epochs=8", "--checkpoint-every=16", "--restart-failed"]);
    l.wait_for_epoch(2);
    let (p0, p1) = (l.peer(0), l.peer(1));
    signal(p0, libc::SIGKILL);
    signal(p1, libc::SIGKILL);
    let (status, out, err) = l.finish(Duration::from_secs(240));
    assert!(status.success(), "{out}\n{err}");
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed", "{s}");
    // Nobody failed but the two killed: no round timed out, no restart ran out.
    let failures = text(&s["peer_failures"]);
    let mut failed: Vec<&str> = failures.split_whitespace().collect();
    failed.sort_unstable();
    assert!(
        failed.len() == 2
            && failed[0].starts_with("0:SIGKILL@")
            && failed[1].starts_with("1:SIGKILL@"),
        "{s}\n{out}"
    );
    let rejoins = text(&s["rejoins"]);
    assert!(
        rejoins.split_whitespace().any(|r| r.starts_with("0@"))
            && rejoins.split_whitespace().any(|r| r.starts_with("1@")),
        "{s}"
    );
    for rank in 0..4 {
        let log = l.log(rank);
        assert!(!log.contains("timed out"), "peer {rank}: {log}");
    }
    // Every epoch once, in order (an epoch that waited for the reports a peer kept while
    // peer 0 was away can complete after a later one: it takes its place in the record).
    l.assert_every_epoch_once(8);
    assert!(s["final_min_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
}

/// Peer 0 killed in the run's last epoch comes back too late to train again. Peer 1 stands
/// in and completes the record with the reports the others kept; if the restarted peer 0
/// links to the peers before they finish it takes the record back and only collects; if it
/// comes back once the run has ended, it finds the record complete and exits with success.
/// Either way the record has every epoch once and the model leaves the run. Before, the run
/// stopped with an error (the others had finished, or the rejoin was too late).
#[test]
fn peer_0_killed_in_the_last_epoch_still_completes_the_record() {
    let mut l = Launch::start(&["--epochs=8", "--checkpoint-every=16", "--restart-failed"]);
    l.wait_for_epoch(7);
    signal(l.peer(0), libc::SIGKILL);
    let t0 = Instant::now();
    let (status, out, err) = l.finish(Duration::from_secs(120));
    assert!(status.success(), "{out}\n{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "no timeout was waited out: {out}"
    );
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed", "{s}");
    assert_eq!(text(&s["peer_failures"]), "0:SIGKILL@7", "{s}");
    assert!(s["final_mean_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
    l.assert_every_epoch_once(8);
    assert!(l.run().join("model.safetensors").exists());
    // Every goodbye was heard, those said to the new process before it planned its rejoin
    // and those on links opened to it while finishing included: nobody waited out the
    // shutdown's deadline, and the membership record holds peer 0's departure only (before,
    // finishing peers closed their links to it unacknowledged after 30 s, recorded as
    // departures after the summary).
    for rank in 0..4 {
        let log = l.log(rank);
        assert!(!log.contains("shutdown timed out"), "peer {rank}: {log}");
    }
    let membership = std::fs::read_to_string(l.run().join("membership.jsonl")).unwrap();
    let left: Vec<&str> = membership
        .lines()
        .filter(|r| r.contains(r#""event":"left""#))
        .collect();
    assert_eq!(left.len(), 1, "{membership}");
    assert!(left[0].contains(r#""peer":0"#), "{membership}");
}

/// Peer 0 killed after every other peer has finished its last epoch and sent its last
/// report, but before peer 0 (a straggler here) recorded that epoch: peer 0 acknowledges a
/// peer's goodbye only once its reports are in the written record, so the others are still
/// there, keep their reports for the restarted peer 0 and send them to it. Before, peer 0
/// acknowledged the goodbyes at once, the others exited, their last reports died with peer
/// 0, and its restarts could not reach them: the run stopped after 3 × about 30 s.
#[test]
fn peer_0_killed_before_recording_the_epoch_the_others_finished_still_completes_it() {
    let mut l = Launch::start(&[
        "--epochs=2",
        "--rounds-per-epoch=8",
        "--checkpoint-every=8",
        "--restart-failed",
        "--slow-peer=0:400",
    ]);
    let t0 = Instant::now();
    let finished = |r: usize| {
        std::fs::read_to_string(l.run().join(format!("logs/peer-{r}.log")))
            .is_ok_and(|log| log.contains("epoch done epoch=2 "))
    };
    while !(1..4).all(finished) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the others did not finish"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    let recorded = std::fs::read_to_string(l.run().join("epochs.jsonl")).unwrap();
    assert!(
        !recorded.contains(r#""epoch":2,"#),
        "peer 0, 400 ms a round behind, recorded the last epoch already: {recorded}"
    );
    signal(l.peer(0), libc::SIGKILL);
    let (status, out, err) = l.finish(Duration::from_secs(120));
    assert!(status.success(), "{out}\n{err}");
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed", "{s}");
    assert!(text(&s["peer_failures"]).starts_with("0:SIGKILL@1"), "{s}");
    l.assert_every_epoch_once(2);
    let last = std::fs::read_to_string(l.run().join("epochs.jsonl")).unwrap();
    let last = last.lines().last().unwrap();
    assert!(
        last.contains(r#""peers":3"#),
        "the others' last reports: {last}"
    );
}

/// A restarted peer 0 killed again while the others open their links to it: the links
/// being opened to the dead process are given up at once (the launcher's notice), and the
/// rejoin notice about it that still spreads is ignored, so nobody waits out a timeout.
/// Before, peers blocked on connects to the dead process until they timed out (10 s each,
/// then the relay's), and the run stood still for about 40 s.
#[test]
fn a_restarted_peer_killed_again_at_once_stalls_nobody() {
    // Eight peers: five of them link to peer 0 only to send it their reports.
    let mut l = Launch::start(&[
        "--peers=8",
        "--rounds-per-epoch=32",
        "--epochs=8",
        "--checkpoint-every=16",
        "--restart-failed",
        "--peer-timeout-secs=120",
        "--round-timeout-secs=300",
    ]);
    l.wait_for_epoch(3);
    let first = l.peer(0);
    signal(first, libc::SIGKILL);
    let t0 = Instant::now();
    let second = loop {
        let pid = l.peer(0);
        if pid != first && !is_zombie(pid) {
            break pid;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "peer 0 not restarted"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // As soon as its rejoin notice reached peer 2 (which links to it to report): while the
    // peers open their links to it.
    l.wait_for_log(2, "peer 0 rejoins the run from round");
    signal(second, libc::SIGKILL);
    let (status, out, err) = l.finish(Duration::from_secs(90));
    assert!(status.success(), "{out}\n{err}");
    // Nobody tried to reach the dead process until a connect timed out.
    for rank in 1..8 {
        let log = l.log(rank);
        assert!(!log.contains("did not open"), "peer {rank}: {log}");
    }
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed", "{s}");
    assert!(text(&s["peer_failures"]).starts_with("0:SIGKILL@"), "{s}");
    l.assert_every_epoch_once(8);
}

#[test]
fn the_launcher_tells_the_others_at_once_that_a_peer_died() {
    // A peer timeout far longer than the run, and links on QUIC alone: only the launcher's
    // notice can explain the departure being recorded. (Over shared memory the link sees the
    // process exit by itself within half a second, and the two race: CI saw that one win.)
    let mut l = Launch::start(&[
        "--epochs=8",
        "--transport=quic",
        "--peer-timeout-secs=120",
        "--round-timeout-secs=300",
    ]);
    // Its neighbours would wait 120 s for it without the notice.
    let (out, s) = l.kill_and_finish(3, Duration::from_secs(60));
    assert!(
        out.contains("peer 3 left the run at round")
            && out.contains("its process exited (SIGKILL), as the launcher saw"),
        "{out}"
    );
    assert!(text(&s["departures"]).starts_with("3@"), "{s}");
    assert!(s["final_mean_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
}

#[test]
fn a_paused_peer_is_waited_for_and_the_run_finishes_without_a_departure() {
    // Stopped longer than the peer timeout (5 s), less than the paused timeout (30 s): its
    // neighbours see its process stopped, not gone, and wait for it.
    let mut l = Launch::start(&["--epochs=4"]);
    l.wait_for_epoch(1);
    stop_for(l.peer(1), Duration::from_secs(7));
    let (status, out, err) = l.finish(Duration::from_secs(120));
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("peer 1 is stopped"), "{out}");
    assert!(!out.contains("peer 1 left the run"), "{out}");
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed");
    assert_eq!(text(&s["departures"]), "", "{s}");
    assert_eq!(text(&s["peer_failures"]), "", "{s}");
}

/// Epochs of a run in which a peer is paused past the timeout ([`paused_past_the_timeout`]).
const PAUSED_RUN_EPOCHS: usize = 40;

/// A run of [`PAUSED_RUN_EPOCHS`] with `extra` and the paused timeout at the peer timeout
/// (5 s), in which peer `rank` is stopped for 10 s after epoch 1: its neighbours take it for
/// departed at 5 s and train on, and it continues while they still do (peer 3 sleeps 30 ms
/// a round and the others keep its pace, so the run lasts at least 40 × 16 × 30 ms = 19 s
/// on any machine, well past the pause). Checks that the run succeeds, that the peer's
/// departure is reported, and that the peer leaves with exit status 75 on its return, at an
/// epoch before the end: before, the links given up on it said a counted goodbye into its
/// shared-memory rings, it took its neighbours for finished and waited out
/// --round-timeout-secs for their frames, after the others had ended. Returns the launch.
fn paused_past_the_timeout(rank: usize, extra: &[&str]) -> Launch {
    let epochs = format!("--epochs={PAUSED_RUN_EPOCHS}");
    let mut args = vec![
        epochs.as_str(),
        "--paused-timeout-secs=5",
        "--slow-peer=3:30",
    ];
    args.extend_from_slice(extra);
    let mut l = Launch::start(&args);
    l.wait_for_epoch(1);
    stop_for(l.peer(rank), Duration::from_secs(10));
    let (status, out, err) = l.finish(Duration::from_secs(240));
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains(&format!("peer {rank} is stopped")), "{out}");
    assert!(
        out.contains(&format!("peer {rank} left the run at round")),
        "{out}"
    );
    let left_at: usize = out
        .split(&format!("peer {rank} failed (exit-75) at epoch "))
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| {
            panic!("peer {rank} did not leave with exit 75 while the others trained: {out}")
        });
    assert!(
        left_at < PAUSED_RUN_EPOCHS,
        "peer {rank} left at epoch {left_at}, once the others had ended, not on its return: {out}"
    );
    l
}

/// No --restart-failed: the paused peer leaves for good, with an accurate message, and the
/// others finish.
#[test]
fn a_paused_peer_leaves_with_an_accurate_message_and_the_run_finishes() {
    let l = paused_past_the_timeout(1, &[]);
    let log = l.log(1);
    assert!(log.contains("this peer was paused for"), "{log}");
    assert!(
        !log.contains("error: peer 0 (the bootstrap"),
        "the old, wrong diagnosis: {log}"
    );
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed");
    assert!(text(&s["departures"]).starts_with("1@"), "{s}");
    assert!(text(&s["peer_failures"]).starts_with("1:exit-75@"), "{s}");
    assert_eq!(text(&s["restarts"]), "");
    assert!(s["final_mean_test_accuracy"].as_f64().unwrap() > 0.8, "{s}");
}

/// Peer 0 paused past the timeout (the lowest live peer keeps the record meanwhile) leaves
/// on its return like any peer, and `--restart-failed` brings it back with `--resume
/// --rejoin-running`; every epoch is recorded once. Before, it failed with exit status 1
/// once the run had ended, and a manual run's record held an epoch twice (the stand-in's
/// row and its own).
#[test]
fn a_paused_peer_0_leaves_on_its_return_and_rejoins_under_restart_failed() {
    let l = paused_past_the_timeout(0, &["--restart-failed", "--checkpoint-every=16"]);
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "completed", "{s}");
    assert!(text(&s["restarts"]).starts_with("0@"), "{s}");
    assert!(text(&s["rejoins"]).starts_with("0@"), "{s}");
    l.assert_every_epoch_once(PAUSED_RUN_EPOCHS as u64);
}

#[test]
fn sigterm_to_launch_reaches_every_peer() {
    let mut l = Launch::start(&["--epochs=200"]);
    l.wait_for_epoch(1);
    assert_eq!(peers_of(&l.run()).len(), 4);
    signal(l.child.id() as i32, libc::SIGTERM);
    let t0 = Instant::now();
    let (status, _, err) = l.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(err.contains("interrupted by SIGTERM"), "{err}");
    // Every peer is gone by the time the launcher exits, well before the run would end.
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(peers_of(&l.run()), Vec::<i32>::new());
    let s = l.summary();
    assert_eq!(text(&s["outcome"]), "interrupted by SIGTERM");
    assert!(s["epochs"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn peers_die_with_a_killed_launcher() {
    let mut l = Launch::start(&["--epochs=200"]);
    l.wait_for_epoch(1);
    assert_eq!(peers_of(&l.run()).len(), 4);
    l.child.kill().unwrap();
    l.child.wait().unwrap();
    let t0 = Instant::now();
    while !peers_of(&l.run()).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "peers outlived the launcher: {:?}",
            peers_of(&l.run())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_peer_stops_an_allreduce_run_at_once_with_a_summary() {
    // A peer timeout far longer than the check below: the survivors would notice only
    // after it; the launcher stops the run when it sees the process die.
    let mut l = Launch::start(&[
        "--epochs=200",
        "--algorithm=allreduce",
        "--peer-timeout-secs=30",
        "--round-timeout-secs=60",
    ]);
    l.wait_for_epoch(1);
    signal(l.peer(3), libc::SIGKILL);
    let t0 = Instant::now();
    let (status, out, err) = l.finish(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    // At once: not after the peer timeout of the others.
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert!(
        err.contains("the run stopped: peer 3 failed (SIGKILL)")
            && err.contains("allreduce cannot go on without a peer"),
        "{err}"
    );
    let s = l.summary();
    assert!(
        text(&s["outcome"]).starts_with("stopped: peer 3 failed"),
        "{s}"
    );
    assert!(peers_of(&l.run()).is_empty());
}

/// Runs `murmur launch ARGS` into a fresh folder, which it must refuse; its stderr and the
/// folder.
fn launch_refused(args: &[&str]) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .arg("launch")
        .args(args)
        .arg(format!("--out={}", dir.path().display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    (String::from_utf8_lossy(&out.stderr).into_owned(), dir)
}

#[test]
fn a_peer_count_that_cannot_fit_in_memory_is_refused_before_anything_starts() {
    let (err, dir) = launch_refused(&["--peers=4000"]);
    assert!(
        err.contains("GB available") && err.contains("murmur simulate"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no run folder"
    );
}

#[test]
fn restart_failed_is_refused_for_an_algorithm_that_cannot_take_a_peer_back() {
    let (err, _dir) = launch_refused(&["--algorithm=allreduce", "--restart-failed=2"]);
    assert!(
        err.contains("--restart-failed") && err.contains("allreduce"),
        "{err}"
    );
}
