//! Metrics every run writes: per-peer JSON lines, per-epoch rows aggregated by peer 0
//! (`epochs.jsonl`), and the run summary (`summary.json`, `summary.csv`).
//!
//! Field names are a stable interface read by experiment scripts.

pub mod chart;
pub(crate) mod collector;
pub(crate) mod copy;
pub(crate) mod frames;
pub mod plots;
pub(crate) mod progress;

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// One peer's numbers for one epoch (a line of `peers/peer-<rank>.jsonl`, and the JSON part
/// of a report frame to peer 0).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerEpoch {
    /// Rank.
    pub peer: usize,
    /// Epoch; 0 is the starting point before any training round.
    pub epoch: usize,
    /// The algorithm that trained this epoch (the phase, with `--phases`).
    pub phase: String,
    /// Rounds completed so far.
    pub rounds: u64,
    /// Mean training loss over the epoch's mini-batches.
    pub train_loss: f64,
    /// Accuracy of this peer's model on the test split, fraction in [0, 1].
    pub test_accuracy: f64,
    /// Mean cross-entropy on the test split.
    pub test_loss: f64,
    /// What this peer has sent, spent and refused so far (flattened: its fields are this
    /// line's `bytes_sent`, `compute_seconds`, …).
    #[serde(flatten)]
    pub totals: PeerTotals,
    /// The BatchNorm running statistics of this peer's model (`[s]`,
    /// `model::flatten_running_state`; empty for a model without BatchNorm): in the report
    /// frame only, for the collector's x̄, which carries their mean. Not in the JSON lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running_state: Vec<f32>,
}

/// A peer's running totals as its [`PeerEpoch`] reports them: kept in its checkpoints, so
/// that a peer resumed from one (the whole run, or a restarted peer rejoining) goes on
/// counting from the checkpoint's round instead of from 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerTotals {
    /// Gossip bytes sent so far (whole frames: 24-byte header + compressed message).
    pub bytes_sent: u64,
    /// Gossip bytes received so far.
    pub bytes_received: u64,
    /// Seconds spent in forward/backward so far.
    pub compute_seconds: f64,
    /// Seconds from sending a round's messages to having mixed, so far.
    pub communicate_seconds: f64,
    /// Seconds blocked waiting for a round to mix after the gradient was ready, so far: the
    /// communication that computation did not hide (equal to `communicate_seconds` when
    /// the algorithm cannot overlap).
    pub wait_seconds: f64,
    /// Seconds since this peer started training.
    pub wall_seconds: f64,
    /// Frames this peer refused so far (malformed, wrong sender, out of window, …).
    pub refused_frames: u64,
    /// Neighbour contributions this peer dropped under the straggler policy so far.
    #[serde(default)]
    pub skipped: u64,
}

impl std::ops::Add for PeerTotals {
    type Output = PeerTotals;

    /// The sum of two sets of totals, field by field.
    fn add(self, o: PeerTotals) -> PeerTotals {
        PeerTotals {
            bytes_sent: self.bytes_sent + o.bytes_sent,
            bytes_received: self.bytes_received + o.bytes_received,
            compute_seconds: self.compute_seconds + o.compute_seconds,
            communicate_seconds: self.communicate_seconds + o.communicate_seconds,
            wait_seconds: self.wait_seconds + o.wait_seconds,
            wall_seconds: self.wall_seconds + o.wall_seconds,
            refused_frames: self.refused_frames + o.refused_frames,
            skipped: self.skipped + o.skipped,
        }
    }
}

/// One printed row: the network's state at the end of an epoch (a line of `epochs.jsonl`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EpochRow {
    /// Epoch; 0 is the starting point before any training round.
    pub epoch: usize,
    /// The algorithm that trained this epoch (the phase, with `--phases`).
    pub phase: String,
    /// Rounds completed.
    pub rounds: u64,
    /// Mean over peers of the test accuracy (fraction).
    pub mean_test_accuracy: f64,
    /// Lowest peer test accuracy.
    pub min_test_accuracy: f64,
    /// Highest peer test accuracy.
    pub max_test_accuracy: f64,
    /// Test accuracy of the averaged model x̄ = (1/n) Σ x_i.
    pub avg_model_test_accuracy: f64,
    /// Mean over peers of the test loss (cross-entropy, nats; for the language model nats
    /// per byte of the held-out text).
    #[serde(default)]
    pub mean_test_loss: f64,
    /// Test loss of x̄ (nats).
    #[serde(default)]
    pub avg_model_test_loss: f64,
    /// The language model only: `mean_test_loss` in bits per byte (nats / ln 2 / bytes per
    /// token); absent for a token file, whose bytes per token are not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_test_bits_per_byte: Option<f64>,
    /// The language model only: `mean_test_loss` in bits per token (nats / ln 2; for a
    /// byte-level text the same as bits per byte).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_test_bits_per_token: Option<f64>,
    /// Consensus distance Ξ² = (1/n) Σ ‖x_i − x̄‖².
    pub consensus_distance: f64,
    /// Mean over peers of the epoch's training loss.
    pub mean_train_loss: f64,
    /// Mean over peers of the gossip bytes sent so far.
    pub bytes_sent_per_peer: f64,
    /// Mean over peers of the compute seconds so far.
    pub compute_seconds: f64,
    /// Mean over peers of the communicate seconds so far.
    pub communicate_seconds: f64,
    /// Mean over peers of the wait seconds (communication not hidden) so far.
    pub wait_seconds: f64,
    /// Frames refused by all peers together so far.
    pub refused_frames: u64,
    /// Peer 0's seconds since training started.
    pub wall_seconds: f64,
    /// Peers whose reports make up this row: n, fewer after departures.
    pub peers: usize,
    /// Neighbour contributions dropped by the straggler policy so far, all peers together
    /// (each skipped edge of a round counts at both ends).
    pub skipped: u64,
}

/// One row of `consensus.csv` (`murmur simulate --consensus`): the network after a round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsensusRow {
    /// Rounds completed; 0 is the random start.
    pub round: u64,
    /// Ξ²(t) = (1/n) Σ ‖x_i − x̄‖².
    pub consensus_distance: f64,
    /// Ξ²(t) / Ξ²(0).
    pub relative: f64,
    /// Mean over peers of the bytes sent up to this round.
    pub bytes_sent_per_peer: f64,
    /// Simulated time when the last peer finished this round, seconds.
    pub seconds: f64,
}

/// One row of `timing.csv` (`murmur simulate --timing-only`): the simulated schedule at
/// the end of an epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimingRow {
    /// The epoch.
    pub epoch: usize,
    /// Rounds completed by every peer.
    pub rounds: u64,
    /// Simulated time when the last peer finished the epoch, seconds.
    pub wall_seconds: f64,
    /// Mean over peers of the bytes sent so far.
    pub bytes_sent_per_peer: f64,
    /// Mean over peers of the simulated compute time so far, seconds.
    pub compute_seconds: f64,
    /// Mean over peers of the simulated communication time so far, seconds.
    pub communicate_seconds: f64,
    /// Mean over peers of the simulated waiting time so far, seconds.
    pub wait_seconds: f64,
}

/// A peer that left or rejoined the run, as peer 0 recorded it (a line of
/// `membership.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MembershipEvent {
    /// `left` or `rejoined`.
    pub event: String,
    /// The peer that left or rejoined.
    pub peer: usize,
    /// `left`: peer 0's round when it learned of it; `rejoined`: the round from which the
    /// peer mixes again.
    pub round: u64,
    /// Peer 0's epoch when it learned of it (1-based while training).
    pub epoch: usize,
    /// Peer 0's seconds since training started, then.
    pub wall_seconds: f64,
    /// The peer that noticed the departure (a neighbour whose connection was lost), or the
    /// peer that rejoined.
    pub noticed_by: usize,
    /// What was noticed.
    pub reason: String,
}

impl MembershipEvent {
    /// The record (event `joined` if `new`, else `rejoined`) of peer `back` mixing from
    /// round `at`, at peer 0's `epoch` and `wall_seconds`.
    pub fn back(back: usize, at: u64, new: bool, (epoch, wall_seconds): (usize, f64)) -> Self {
        MembershipEvent {
            event: if new { "joined" } else { "rejoined" }.into(),
            peer: back,
            round: at,
            epoch,
            wall_seconds,
            noticed_by: back,
            reason: if new {
                format!("a new peer; mixes from round {at}")
            } else {
                format!("restarted; mixes again from round {at}")
            },
        }
    }
}

/// The run summary (`summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Algorithm name, e.g. `dpsgd`.
    pub algorithm: String,
    /// Compressor of the gossip messages, canonical text form (e.g. `identity`, `bf16`).
    pub compressor: String,
    /// Topology name.
    pub topology: String,
    /// Number of peers n.
    pub peers: usize,
    /// Model name.
    pub model: String,
    /// Parameters d.
    pub dim: usize,
    /// Epochs run.
    pub epochs: usize,
    /// Rounds run.
    pub rounds: u64,
    /// Data partition, e.g. `iid` or `dirichlet:0.1`.
    pub partition: String,
    /// Seed.
    pub seed: u64,
    /// |λ₂(W)|.
    pub lambda2_abs: f64,
    /// 1 − |λ₂(W)|.
    pub spectral_gap: f64,
    /// Final mean test accuracy over peers (fraction).
    pub final_mean_test_accuracy: f64,
    /// Final lowest peer test accuracy (fraction).
    pub final_min_test_accuracy: f64,
    /// Final highest peer test accuracy (fraction).
    pub final_max_test_accuracy: f64,
    /// Final accuracy of the averaged model x̄ (fraction).
    pub final_avg_model_test_accuracy: f64,
    /// Final consensus distance Ξ².
    pub final_consensus_distance: f64,
    /// The last epoch's mean test loss over peers (nats; per byte for the language model):
    /// the one field by which runs of any model compare.
    #[serde(default)]
    pub final_mean_test_loss: f64,
    /// The last epoch's test loss of x̄ (nats).
    #[serde(default)]
    pub final_avg_model_test_loss: f64,
    /// The language model only: `final_mean_test_loss` in bits per byte (absent for a
    /// token file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_mean_test_bits_per_byte: Option<f64>,
    /// The language model only: `final_mean_test_loss` in bits per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_mean_test_bits_per_token: Option<f64>,
    /// Mean over peers of gossip bytes sent over the run.
    pub bytes_sent_per_peer: f64,
    /// Training wall time in seconds (peer 0's clock; simulated time for `murmur simulate`).
    pub wall_seconds: f64,
    /// `wall_seconds` per round.
    pub seconds_per_round: f64,
    /// Training samples processed per second by the whole network: n · batch · rounds /
    /// `wall_seconds`.
    pub samples_per_second: f64,
    /// Peers that left the run, as `rank@round` (peer 0's round when it learned of it),
    /// space-separated; empty if none. Details in `membership.jsonl`.
    pub departures: String,
    /// Peers that rejoined the run, as `rank@round` (the round from which they mixed
    /// again), space-separated; empty if none.
    pub rejoins: String,
    /// New peers that took an empty rank of an elastic run (`--initial-peers`), as
    /// `rank@round` (the round from which they mixed), space-separated; empty if none.
    #[serde(default)]
    pub joins: String,
    /// How the run ended: `completed`, or — written by `murmur launch` when it ended the
    /// run early — `stopped: <why>` or `interrupted by SIGINT/SIGTERM`; the numbers are
    /// then those of the last epoch recorded.
    #[serde(default = "completed")]
    pub outcome: String,
    /// Peer processes that failed under `murmur launch` (exited with an error, were killed,
    /// or left after a pause), as `rank:how@epoch` with `how` an exit status (`exit-1`;
    /// `exit-75`: declared departed, may rejoin) or a signal (`SIGKILL`) and the last epoch
    /// recorded before, space-separated; empty if none.
    #[serde(default)]
    pub peer_failures: String,
    /// Peers that `murmur launch --restart-failed` restarted with `--resume`, as
    /// `rank@epoch`, space-separated; empty if none (their return is in `rejoins`).
    #[serde(default)]
    pub restarts: String,
}

impl Summary {
    /// Fills `departures`, `rejoins` and `joins` from peer 0's membership events (in the
    /// order recorded) as `rank@round` lists.
    pub fn set_membership(&mut self, events: &[MembershipEvent]) {
        let list = |kind: &str| {
            events
                .iter()
                .filter(|e| e.event == kind)
                .map(|e| format!("{}@{}", e.peer, e.round))
                .collect::<Vec<_>>()
                .join(" ")
        };
        self.departures = list("left");
        self.rejoins = list("rejoined");
        self.joins = list("joined");
    }
}

/// [`Summary::outcome`] of a run that ran to its end.
pub const COMPLETED: &str = "completed";

fn completed() -> String {
    COMPLETED.to_string()
}

/// Writes `summary.json` and `summary.csv` into the run folder `dir` (each replaced at once).
pub fn save_summary(dir: &Path, summary: &Summary) -> anyhow::Result<()> {
    write_atomic(
        &dir.join("summary.json"),
        &serde_json::to_vec_pretty(summary)?,
    )?;
    write_atomic(&dir.join("summary.csv"), to_csv(&[summary])?.as_bytes())
}

/// The values of the JSON lines of `path`, in order (none if the file does not exist).
///
/// # Errors
/// The file cannot be read, or a line is not a `T` (the error names the file).
pub fn read_json_lines<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.with_context(|| format!("reading {}", path.display()))?,
    };
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("reading {}", path.display())))
        .collect()
}

/// Writes `values` to `path` as JSON lines, atomically ([`write_atomic`]).
///
/// # Errors
/// A value does not serialize, or the file cannot be written.
pub fn write_json_lines<T: Serialize>(path: &Path, values: &[T]) -> anyhow::Result<()> {
    let mut out = Vec::new();
    for v in values {
        out.extend(serde_json::to_vec(v)?);
        out.push(b'\n');
    }
    write_atomic(path, &out)
}

/// Rewrites the record's `epochs.jsonl` and `epochs.csv` in run folder `dir` with `rows`.
///
/// # Errors
/// A file cannot be written.
pub(crate) fn write_epoch_rows(dir: &Path, rows: &[EpochRow]) -> anyhow::Result<()> {
    write_json_lines(&dir.join("epochs.jsonl"), rows)?;
    write_atomic(&dir.join("epochs.csv"), to_csv(rows)?.as_bytes())
}

/// Appends one JSON line to `path`, creating it if needed.
pub fn append_json_line<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    f.write_all(&line)
        .with_context(|| format!("writing {}", path.display()))
}

/// A peer resumed into epoch `first_epoch` (the whole run, or a restarted peer rejoining)
/// records that epoch and the later ones again: keeps only the lines of its
/// `peers/peer-<rank>.jsonl` at `path` of the epochs before, so that each epoch is there
/// once. A line that is not a JSON object with an `epoch` (one torn by a kill) goes too. No
/// file: nothing to do.
///
/// # Errors
/// The file cannot be read or written.
pub fn keep_peer_epochs_before(path: &Path, first_epoch: usize) -> anyhow::Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut kept = String::new();
    for line in text.lines() {
        let epoch = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("epoch").and_then(serde_json::Value::as_u64));
        if epoch.is_some_and(|e| e < first_epoch as u64) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    write_atomic(path, kept.as_bytes())
}

/// Writes `contents` to `path` atomically (temporary file, then rename).
pub fn write_atomic(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// The table header printed above [`format_row`] lines.
pub fn table_header() -> String {
    format!(
        "{:>5} {:>6} {:>8} {:>8} {:>8} {:>8} {:>10} {:>8} {:>11} {:>7} {:>7} {:>8}",
        "epoch",
        "rounds",
        "acc mean",
        "acc min",
        "acc max",
        "acc x̄",
        "Ξ²",
        "loss",
        "MB sent/peer",
        "comp s",
        "wait s",
        "wall s"
    )
}

/// One table line for an epoch row.
pub fn format_row(r: &EpochRow) -> String {
    format!(
        "{:>5} {:>6} {:>7.2}% {:>7.2}% {:>7.2}% {:>7.2}% {:>10.3e} {:>8.4} {:>12.1} {:>7.1} {:>7.1} {:>8.1}",
        r.epoch,
        r.rounds,
        100.0 * r.mean_test_accuracy,
        100.0 * r.min_test_accuracy,
        100.0 * r.max_test_accuracy,
        100.0 * r.avg_model_test_accuracy,
        r.consensus_distance,
        r.mean_train_loss,
        r.bytes_sent_per_peer / 1e6,
        r.compute_seconds,
        r.wait_seconds,
        r.wall_seconds
    )
}

/// The one-line summary printed at the end of a run.
pub fn summary_line(s: &Summary) -> String {
    format!(
        "{} with {} on {} ({}, {}): {} in {:.1} s, mean accuracy {:.2}% (min {:.2}%, x̄ {:.2}%), Ξ² {:.3e}, {:.1} MB sent per peer",
        s.algorithm,
        s.compressor,
        s.topology,
        crate::config::count(s.peers, "peer"),
        s.model,
        crate::config::count(s.epochs, "epoch"),
        s.wall_seconds,
        100.0 * s.final_mean_test_accuracy,
        100.0 * s.final_min_test_accuracy,
        100.0 * s.final_avg_model_test_accuracy,
        s.final_consensus_distance,
        s.bytes_sent_per_peer / 1e6
    ) + &match (s.final_mean_test_bits_per_byte, s.final_mean_test_bits_per_token) {
        (Some(bpb), _) => format!(
            "; validation loss {:.4} nats = {bpb:.3} bits per byte",
            s.final_mean_test_loss
        ),
        (None, Some(bpt)) => format!(
            "; validation loss {:.4} nats = {bpt:.3} bits per token",
            s.final_mean_test_loss
        ),
        (None, None) => String::new(),
    } + &if s.departures.is_empty() {
        String::new()
    } else {
        format!("; peers that left (rank@round): {}", s.departures)
    } + &if s.rejoins.is_empty() {
        String::new()
    } else {
        format!("; rejoined: {}", s.rejoins)
    } + &if s.joins.is_empty() {
        String::new()
    } else {
        format!("; joined: {}", s.joins)
    }
}

/// CSV of serialisable rows: a header line with the field names in declaration order, then
/// one line per row. Strings are quoted when they contain a comma, a quote or a newline.
/// Used for `epochs.csv` ([`EpochRow`]s) and `summary.csv` (one [`Summary`]).
pub fn to_csv<T: Serialize>(rows: &[T]) -> anyhow::Result<String> {
    let field = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) if s.contains([',', '"', '\n']) => {
            format!("\"{}\"", s.replace('"', "\"\""))
        }
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let serde_json::Value::Object(obj) = serde_json::to_value(row)? else {
            anyhow::bail!("a CSV row must serialise to a JSON object");
        };
        if i == 0 {
            out.push_str(&obj.keys().cloned().collect::<Vec<_>>().join(","));
            out.push('\n');
        }
        out.push_str(&obj.values().map(field).collect::<Vec<_>>().join(","));
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Row {
        b: u32,
        a: f64,
        name: String,
    }

    /// A record read back (a resumed or continued run rewrites its earlier rows from it)
    /// holds the very numbers written: serde_json's default float parser can be one ulp
    /// off (2.346530390919237e-14 came back as 2.3465303909192372e-14, and a whole-run
    /// resume's kept epoch row then differed from the first run's), so the workspace
    /// enables its `float_roundtrip`.
    #[test]
    fn numbers_read_back_from_a_json_line_file_are_the_numbers_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        let values = [
            2.346530390919237e-14,
            2.3465303909192372e-14,
            0.1 + 0.2,
            1.0 / 3.0,
            5e-324,
            f64::MAX,
        ];
        for v in values {
            append_json_line(&path, &v).unwrap();
        }
        let back: Vec<f64> = read_json_lines(&path).unwrap();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
    }

    #[test]
    fn a_resumed_peer_log_keeps_the_epochs_before_and_drops_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("peer-1.jsonl");
        std::fs::write(
            &log,
            "{\"epoch\":0,\"a\":1}\n{\"epoch\":1}\n{\"epoch\":2}\n{\"epoch\":1}\n{\"epo",
        )
        .unwrap();
        keep_peer_epochs_before(&log, 2).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "{\"epoch\":0,\"a\":1}\n{\"epoch\":1}\n{\"epoch\":1}\n"
        );
        // No log yet (a peer that never reported): nothing to do, no file made.
        let none = dir.path().join("peer-2.jsonl");
        keep_peer_epochs_before(&none, 2).unwrap();
        assert!(!none.exists());
    }

    #[test]
    fn csv_keeps_field_order_and_quotes_strings() {
        let rows = [
            Row {
                b: 1,
                a: 0.5,
                name: "ring".into(),
            },
            Row {
                b: 2,
                a: 1e-3,
                name: "a,\"b\"".into(),
            },
        ];
        assert_eq!(
            to_csv(&rows).unwrap(),
            "b,a,name\n1,0.5,ring\n2,0.001,\"a,\"\"b\"\"\"\n"
        );
        assert_eq!(to_csv::<Row>(&[]).unwrap(), "");
    }
}
