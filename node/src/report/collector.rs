//! The record's collector: the epoch reports of every peer, aggregated into the run's rows,
//! consensus distance and summary. Peer 0 keeps the record; while it is away the lowest live
//! rank stands in for it ([`Collector::stand_in`]) and hands the record back when peer 0's
//! new process links to it ([`Collector::take_up`], [`Collector::rejoined`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use murmur_gossip::{consensus_distance, Rank};
use serde::{Deserialize, Serialize};

use crate::config::RunArgs;
use crate::report::{self, EpochRow, MembershipEvent, PeerEpoch, Summary};
use crate::train::data::{text, tokens, Dataset};
use crate::train::model::{self, Net};

use crate::report::copy::{RecordCopy, RecordLine};
use crate::report::frames::*;

/// Samples per batch when a model is evaluated on a data set (a memory bound, not a
/// hyperparameter).
pub(crate) const EVAL_BATCH: usize = 500;

/// Each peer's squared distance to the mean of the reporting peers at the end of an epoch (a
/// line of `distances.jsonl`, written by peer 0): the per-peer terms of Ξ².
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeerDistances {
    pub(crate) epoch: usize,
    /// ‖x_i − x̄‖² by rank; `null` for a peer that did not report (it had left).
    pub(crate) distances: Vec<Option<f64>>,
}

/// ‖x_i − x̄‖² for each present slot, x̄ the mean of the present ones.
pub(crate) fn peer_distances(slots: &[Option<Reported>]) -> Vec<Option<f64>> {
    let (_, mean) = consensus_distance(slots.iter().flatten().map(|(_, x)| x.as_slice()));
    slots
        .iter()
        .map(|s| {
            s.as_ref().map(|(_, x)| {
                x.iter()
                    .zip(&mean)
                    .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                    .sum()
            })
        })
        .collect()
}

/// A peer's report for an epoch and its parameters x: [d].
pub(crate) type Reported = (PeerEpoch, Vec<f32>);

/// The record keeper's aggregation of the per-epoch reports into [`EpochRow`]s.
pub(crate) struct Collector {
    pub(crate) n: usize,
    pub(crate) d: usize,
    pub(crate) dir: PathBuf,
    pub(crate) kind: model::ModelKind,
    pub(crate) test: Arc<Dataset>,
    /// Reports by epoch, one slot per peer.
    pub(crate) pending: BTreeMap<usize, Vec<Option<Reported>>>,
    /// Peers that left, with the epoch from which their reports are awaited again
    /// (`usize::MAX` until they rejoin): an epoch is complete without the others.
    pub(crate) absent: BTreeMap<Rank, usize>,
    /// The membership events, in order.
    pub(crate) history: Vec<MembershipEvent>,
    /// Rounds per epoch, to place a rejoin round in its epoch.
    pub(crate) rounds_per_epoch: u64,
    pub(crate) rows: Vec<EpochRow>,
    /// A whole run resumed: the running totals the new rows add on ([`continue_totals`]),
    /// so that the record and the summary cover the whole run. When the checkpoints carry
    /// the peers' totals (their reports count on from them) only the wall time is left to
    /// add: peer 0's at the checkpoint, every other field 0. From older checkpoints, the
    /// last row the earlier process(es) recorded: the rounds between that row and the
    /// checkpoint are then not counted.
    pub(crate) carried: Option<EpochRow>,
    /// When peer 0 started training.
    pub(crate) started: Instant,
    /// A restarted peer 0 or a stand-in took up the record ([`Collector::take_up`],
    /// [`Collector::stand_in`]): reports of recorded epochs (sent again by the peers) are
    /// ignored.
    pub(crate) taken_up: bool,
    /// A restarted peer 0 until [`Collector::rejoined`]: nothing is written (a stand-in may
    /// still be writing the record); membership events wait here, reports in `pending`.
    deferred: Option<Vec<(MembershipEvent, Option<u64>)>>,
    /// The network's averaged model of the latest recorded epoch (x̄ and the mean BatchNorm
    /// statistics): the model the run exports ([`write_model`]).
    pub(crate) mean: Option<MeanModel>,
    /// The run folder's `record.lock`, locked (`flock`) while this collector may write the
    /// record ([`Collector::lock_record`]); the kernel releases it when the process dies.
    lock: Option<std::fs::File>,
    /// The lines written to the record since the shell last took them
    /// ([`Collector::take_lines`]), for every peer's copy of it ([`crate::report::copy`]).
    written: Vec<RecordLine>,
}

/// The file whose lock ([`Collector::lock_record`]) the record's writer holds.
const RECORD_LOCK: &str = "record.lock";

/// How long a restarted peer 0 waits for the lock of the record when it takes the record
/// back (every stand-in let it go before it welcomed the new process: normally at once).
const REJOIN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Collector {
    /// The collector of a run of `n` peers writing to `dir`, evaluating x̄ (`d` parameters
    /// of model `kind`) on `test`.
    pub(crate) fn new(
        n: usize,
        dir: PathBuf,
        rounds_per_epoch: u64,
        test: Arc<Dataset>,
        d: usize,
        kind: model::ModelKind,
    ) -> Collector {
        Collector {
            n,
            d,
            dir,
            kind,
            test,
            pending: BTreeMap::new(),
            absent: BTreeMap::new(),
            history: Vec::new(),
            rounds_per_epoch,
            rows: Vec::new(),
            carried: None,
            started: Instant::now(),
            taken_up: false,
            deferred: None,
            mean: None,
            lock: None,
            written: Vec::new(),
        }
    }

    /// Takes the lock of the run folder's record (`record.lock`, an exclusive `flock`),
    /// waiting up to `wait` for the process holding it: the keeper before this one stops
    /// writing once it hears that this one keeps the record (a stand-in hands it back, an
    /// old stand-in hears of a lower rank back), and a dead holder's lock is released by
    /// the kernel. So no two processes write the record at once, whatever order the
    /// membership news reaches them in. Returns whether it holds the lock; a file system
    /// without locks (said once) or a holder that stays (a paused keeper, warned) is no
    /// reason to keep no record.
    pub(crate) fn lock_record(&mut self, wait: std::time::Duration) -> bool {
        if self.lock.is_some() {
            return true;
        }
        let path = self.dir.join(RECORD_LOCK);
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(
                    "cannot open {}: {e}; the record is written unlocked",
                    path.display()
                );
                return false;
            }
        };
        let until = Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    self.lock = Some(file);
                    return true;
                }
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    tracing::warn!(
                        "another process still holds {} after {:.1} s: this peer writes the \
                         record anyway",
                        path.display(),
                        wait.as_secs_f64()
                    );
                    return false;
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    tracing::warn!(
                        "cannot lock {}: {e}; the record is written unlocked",
                        path.display()
                    );
                    return false;
                }
            }
        }
    }

    /// Peer 0 restarted in a run under way (`--rejoin-running`): takes up the record its
    /// previous processes (or a stand-in) wrote in the run folder — the rows of
    /// `epochs.jsonl` and the events of `membership.jsonl` (the peers recorded as departed
    /// stay so) — before any report reaches it. Reports of recorded epochs (the peers send
    /// their latest again) are ignored from then on, and the epochs are complete without
    /// peer 0's own reports until [`Collector::rejoined`]. Until then nothing is written: a
    /// stand-in keeps the record until this process's link reaches it, and
    /// [`Collector::rejoined`] reads the record again. The wall time goes on from the last
    /// row's, plus the time since `epochs.jsonl` was last written (the gap while no peer 0
    /// ran counts).
    ///
    /// # Errors
    /// A line of the record does not parse.
    pub(crate) fn take_up(&mut self) -> anyhow::Result<()> {
        self.read_record()?;
        self.deferred = Some(Vec::new());
        Ok(())
    }

    /// The lowest live rank while peer 0 is away (not restarted, or not yet linked to this
    /// peer): takes up the record as it stands in the run folder, as a restarted peer 0
    /// does ([`Collector::take_up`]), and records the departures it knows of that the
    /// record lacks (`departed`, by rank: peer 0's among them). A run folder that is not
    /// shared with peer 0's host lacks the lines peer 0 wrote: they come from this peer's
    /// `copy` of the record first ([`RecordCopy::fill`]).
    ///
    /// # Errors
    /// The record does not parse or cannot be written.
    pub(crate) fn stand_in(
        &mut self,
        departed: &BTreeMap<Rank, MembershipEvent>,
        lock_wait: std::time::Duration,
        copy: &RecordCopy,
    ) -> anyhow::Result<()> {
        self.lock_record(lock_wait);
        self.fill_from(copy)?;
        self.read_record()?;
        for (&r, e) in departed {
            if self.counted_in(r) {
                self.membership(e.clone(), None)?;
            }
        }
        Ok(())
    }

    /// Completes the run folder's record from `copy` ([`RecordCopy::fill`]), saying so
    /// when it lacked lines.
    fn fill_from(&self, copy: &RecordCopy) -> anyhow::Result<()> {
        let filled = copy.fill(&self.dir)?;
        if filled.epochs + filled.events > 0 {
            tracing::info!(
                epochs = filled.epochs,
                events = filled.events,
                "the run folder ({}) lacked lines of the record another peer kept: written \
                 from this peer's copy of it",
                self.dir.display()
            );
        }
        Ok(())
    }

    /// The lines written to the record since the last call, for every peer's copy.
    pub(crate) fn take_lines(&mut self) -> Vec<RecordLine> {
        std::mem::take(&mut self.written)
    }

    /// Appends `event` to `membership.jsonl` and to the history.
    fn append_event(&mut self, event: MembershipEvent) -> anyhow::Result<()> {
        report::append_json_line(&self.dir.join("membership.jsonl"), &event)?;
        self.written.push(RecordLine::Event {
            index: self.history.len(),
            event: event.clone(),
        });
        self.history.push(event);
        Ok(())
    }

    /// Reads the record of the run folder ([`Collector::take_up`]); reports already
    /// pending for epochs it holds are dropped.
    fn read_record(&mut self) -> anyhow::Result<()> {
        let rows_path = self.dir.join("epochs.jsonl");
        let rows: Vec<EpochRow> = report::read_json_lines(&rows_path)?;
        let since_written = std::fs::metadata(&rows_path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map_or(0.0, |d| d.as_secs_f64());
        let wall = rows.last().map_or(0.0, |r| r.wall_seconds) + since_written;
        self.carried = Some(EpochRow {
            wall_seconds: wall,
            ..EpochRow::default()
        });
        self.started = Instant::now();
        self.rows = rows;
        let recorded = self.rows.last().map(|r| r.epoch);
        self.pending.retain(|&e, _| recorded.is_none_or(|r| e > r));
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&self.dir.join("membership.jsonl"))?;
        self.absent.clear();
        self.history.clear();
        for e in events {
            let from = match e.event.as_str() {
                "left" | "empty" => usize::MAX,
                _ => (e.round / self.rounds_per_epoch.max(1)) as usize + 1,
            };
            self.absent.insert(e.peer, from);
            self.history.push(e);
        }
        // Peer 0 reports again from the epoch of its rejoin round.
        self.absent.insert(0, usize::MAX);
        self.taken_up = true;
        Ok(())
    }

    /// A restarted peer 0 that took up the record ([`Collector::take_up`]) mixes again from
    /// round `at`: records its departure and return, and what it learned while rejoining
    /// that the record lacks — the departures (`departed`, by rank) and the peers that came
    /// back while it was away (`back`: peer → round it mixes from; their reports are
    /// awaited from that round's epoch on, so the epochs their old process never reported
    /// are complete without them); its own reports are awaited from the epoch of `at` on.
    /// With `collects_only` (it came back too late to train again, `at` past the run's
    /// last round) only its departure is recorded, and its reports are awaited no more.
    ///
    /// # Errors
    /// The record cannot be written.
    pub(crate) fn rejoined(
        &mut self,
        at: u64,
        (departed, back): (&BTreeMap<Rank, MembershipEvent>, &BTreeMap<Rank, u64>),
        collects_only: bool,
        copy: &RecordCopy,
    ) -> anyhow::Result<()> {
        // Every peer that stood in for it has handed the record back (it answered this
        // process's hello, with its copy of the record): read it as it is now, completed
        // with what a stand-in wrote in a folder of its own, then what waited.
        if let Some(deferred) = self.deferred.take() {
            self.lock_record(REJOIN_LOCK_WAIT);
            self.fill_from(copy)?;
            self.read_record()?;
            for (event, back_at) in deferred {
                self.membership(event, back_at)?;
            }
        }
        let at_epoch = (at / self.rounds_per_epoch.max(1)) as usize + 1;
        let wall = self.started.elapsed().as_secs_f64()
            + self.carried.as_ref().map_or(0.0, |c| c.wall_seconds);
        let recorded = self.rows.last().map_or(0, |r| r.epoch);
        // Collecting only, it left during the epoch after the last one recorded.
        let (left_round, left_epoch) = match collects_only {
            false => (at, at_epoch),
            true => (recorded as u64 * self.rounds_per_epoch, recorded + 1),
        };
        let left = MembershipEvent {
            event: "left".into(),
            peer: 0,
            round: left_round,
            epoch: left_epoch,
            wall_seconds: wall,
            noticed_by: 0,
            reason: match collects_only {
                false => {
                    format!("its process died; a new one took up the record after epoch {recorded}")
                }
                true => format!(
                    "its process died; a new one took up the record after epoch {recorded}, \
                     too late to train again: it only collects the others' reports"
                ),
            },
        };
        for (&r, e) in departed {
            if self.absent.get(&r) != Some(&usize::MAX) {
                self.membership(e.clone(), None)?;
            }
        }
        for (&r, &round) in back {
            let newer_known = self.history.iter().any(|e| e.peer == r && e.round >= round);
            if r == 0 || departed.contains_key(&r) || newer_known {
                continue;
            }
            let epoch = (round / self.rounds_per_epoch.max(1)) as usize + 1;
            // An empty rank taken while peer 0 was away (a member admitted the new peer).
            let new = self.last_event(r).is_some_and(|e| e.event == "empty");
            let mut event = MembershipEvent::back(r, round, new, (epoch, wall));
            event.reason = match new {
                false => format!("came back while peer 0 was away; mixes again from round {round}"),
                true => format!(
                    "a new peer, admitted by a member while peer 0 was away; mixes from round {round}"
                ),
            };
            self.membership(event, Some(round))?;
        }
        if collects_only {
            // Its own reports are awaited no more.
            return self.membership(left, None);
        }
        // A stand-in recorded its departure already.
        if self.last_event(0).is_none_or(|e| e.event != "left") {
            self.append_event(left)?;
        }
        let back = MembershipEvent::back(0, at, false, (at_epoch, wall));
        self.membership(back, Some(at))
    }

    /// Whether a report of peer `r` waits in an epoch not yet recorded (its row needs other
    /// peers' reports still): lost if this process died now.
    pub(crate) fn holds_report_of(&self, r: Rank) -> bool {
        self.pending
            .values()
            .any(|slots| slots.get(r).is_some_and(Option::is_some))
    }

    /// Peers whose report for the oldest incomplete epoch has not arrived.
    pub(crate) fn missing_reporters(&self) -> Vec<Rank> {
        match self.pending.iter().next() {
            Some((&e, slots)) => (0..self.n)
                .filter(|&r| slots[r].is_none() && self.awaits(r, e))
                .collect(),
            None => (0..self.n).collect(),
        }
    }

    pub(crate) fn add_frame(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let (report, x) = decode_report(payload, self.d)?;
        if report.peer != from {
            bail!(
                "report claims peer {} but came from peer {from}",
                report.peer
            );
        }
        self.add(report, x)
    }

    pub(crate) fn add(&mut self, report: PeerEpoch, x: Vec<f32>) -> anyhow::Result<()> {
        let epoch = report.epoch;
        if report.peer >= self.n {
            bail!("report from unknown peer {}", report.peer);
        }
        // An epoch before the last recorded one is still open only if it is pending (it
        // waited for a peer that came back while peer 0 was away, and a later epoch was
        // recorded first).
        let closed = self.rows.last().is_some_and(|r| r.epoch >= epoch)
            && !self.pending.contains_key(&epoch);
        if self.taken_up && closed {
            // A peer sends its latest reports again to a restarted peer 0.
            return Ok(());
        }
        if closed {
            bail!(
                "report of peer {} for epoch {epoch}, which is already recorded",
                report.peer
            );
        }
        let slots = self
            .pending
            .entry(epoch)
            .or_insert_with(|| vec![None; self.n]);
        let p = report.peer;
        slots[p] = Some((report, x));
        self.record_complete()
    }

    /// A whole run resumed at `first_epoch`: keeps the rows of the epochs before it from
    /// `epochs.jsonl` (the later ones are recorded again) and rewrites `epochs.jsonl` and
    /// `epochs.csv` with them. The later rows' totals go on from the resume:
    /// `peer0_wall_seconds` is peer 0's training time at the checkpoint resumed from, when
    /// the checkpoints carry the peers' totals (the peers' reports then count on from their
    /// checkpoint, and only the wall time is the collector's to continue); without it (an
    /// older checkpoint) the last kept row's totals are added to the new reports, which
    /// leaves out the rounds of the resumed epoch before the checkpoint.
    pub(crate) fn keep_rows_before(
        &mut self,
        first_epoch: usize,
        peer0_wall_seconds: Option<f64>,
    ) -> anyhow::Result<()> {
        let path = self.dir.join("epochs.jsonl");
        let mut rows: Vec<EpochRow> = report::read_json_lines(&path)?;
        rows.retain(|r| r.epoch < first_epoch);
        self.carried = match peer0_wall_seconds {
            Some(wall_seconds) => Some(EpochRow {
                wall_seconds,
                ..EpochRow::default()
            }),
            None => rows.last().cloned(),
        };
        self.rows = rows;
        self.write_rows()?;
        // Every peer's copy of the record gets what the run before wrote.
        let distances: Vec<PeerDistances> =
            report::read_json_lines(&self.dir.join("distances.jsonl")).unwrap_or_default();
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&self.dir.join("membership.jsonl")).unwrap_or_default();
        for row in &self.rows {
            let distances = distances.iter().find(|d| d.epoch == row.epoch).cloned();
            self.written.push(RecordLine::Epoch {
                row: row.clone(),
                distances,
            });
        }
        for (index, event) in events.into_iter().enumerate() {
            self.written.push(RecordLine::Event { index, event });
        }
        Ok(())
    }

    /// Whether epoch `epoch` waits for peer `r`'s report.
    pub(crate) fn awaits(&self, r: Rank, epoch: usize) -> bool {
        self.absent.get(&r).is_none_or(|&from| epoch >= from)
    }

    /// Records a departure (`back_at: None`) or a rejoin from round `back_at` in
    /// `membership.jsonl`. After a departure the epochs that waited only for the peer's
    /// reports are complete; after a rejoin its reports are awaited from the epoch of
    /// that round on.
    pub(crate) fn membership(
        &mut self,
        mut event: MembershipEvent,
        back_at: Option<u64>,
    ) -> anyhow::Result<()> {
        if let Some(deferred) = self.deferred.as_mut() {
            deferred.push((event, back_at));
            return Ok(());
        }
        // A restarted peer 0 or a stand-in learns again what its record holds (an elastic
        // run's empty ranks, a departure a stand-in recorded as it noticed it): recorded
        // once. A peer that left has no process left to leave again until it is back.
        let mut known = self.taken_up
            && (self.history.iter().any(|e| {
                (e.event.as_str(), e.peer, e.round)
                    == (event.event.as_str(), event.peer, event.round)
            }) || event.event == "left"
                && self
                    .last_event(event.peer)
                    .is_some_and(|e| e.event == "left"));
        if self.taken_up && event.event == "left" && event.round == 0 && !known {
            // Told before this restarted peer 0 mixed again (its supervisor's notice of an
            // exit, replayed to the new process): recorded once, if the record does not
            // hold that departure yet, after the last epoch recorded (its round is not
            // known here), not at round 0.
            let since_back = (self.history.iter())
                .rposition(|e| e.peer == event.peer && e.event != "left")
                .map_or(0, |i| i + 1);
            known = self.history[since_back..]
                .iter()
                .any(|e| e.peer == event.peer && e.event == "left");
            let recorded = self.rows.last().map_or(0, |r| r.epoch);
            event.round = recorded as u64 * self.rounds_per_epoch;
            event.epoch = recorded + 1;
        }
        if !known && event.event == "rejoined" && self.counted_in(event.peer) {
            // A rejoin means its old process left, even where no departure reached this
            // collector (its old process died with peer 0's, and the new peer 0 first heard
            // of its new process): the departure is recorded before the rejoin, so that
            // every rejoin in the record follows a departure.
            let left = MembershipEvent {
                event: "left".into(),
                reason: "its process exited, unseen by peer 0 (recorded with its rejoin)".into(),
                noticed_by: 0,
                ..event.clone()
            };
            self.append_event(left)?;
        }
        let from = match back_at {
            None => usize::MAX,
            Some(at) => (at / self.rounds_per_epoch.max(1)) as usize + 1,
        };
        self.absent.insert(event.peer, from);
        if !known {
            self.append_event(event)?;
        }
        self.record_complete()
    }

    /// Whether the record counts peer `r` in the run: its last event is a (re)join, or it
    /// has none (an initial peer); not after a departure, nor for an empty rank.
    fn counted_in(&self, r: Rank) -> bool {
        self.last_event(r)
            .is_none_or(|e| e.event == "joined" || e.event == "rejoined")
    }

    /// The record's latest membership event about peer `r`, if any.
    fn last_event(&self, r: Rank) -> Option<&MembershipEvent> {
        self.history.iter().rev().find(|e| e.peer == r)
    }

    /// Aggregates, prints and writes every pending epoch that has the reports of all peers
    /// still in the run, oldest first. An epoch complete after a later one (it waited for
    /// the reports a peer kept while peer 0 was away) takes its place in the record: the
    /// files are rewritten in epoch order, and the exported x̄ stays the newest epoch's.
    pub(crate) fn record_complete(&mut self) -> anyhow::Result<()> {
        if self.deferred.is_some() {
            return Ok(());
        }
        let complete: Vec<usize> = self
            .pending
            .iter()
            .filter(|(&e, slots)| {
                slots
                    .iter()
                    .enumerate()
                    .all(|(r, s)| s.is_some() || !self.awaits(r, e))
            })
            .map(|(&e, _)| e)
            .collect();
        for epoch in complete {
            let slots = self.pending.remove(&epoch).unwrap_or_default();
            let distances = PeerDistances {
                epoch,
                distances: peer_distances(&slots),
            };
            report::append_json_line(&self.dir.join("distances.jsonl"), &distances)?;
            let all: Vec<Reported> = slots.into_iter().flatten().collect();
            let (row, mean) = self.aggregate(epoch, all)?;
            println!("{}", report::format_row(&row));
            self.written.push(RecordLine::Epoch {
                row: row.clone(),
                distances: Some(distances),
            });
            if self.rows.last().is_none_or(|r| r.epoch < epoch) {
                // The newest epoch: its x̄ is the model the run exports.
                self.mean = Some(mean);
                report::append_json_line(&self.dir.join("epochs.jsonl"), &row)?;
                self.rows.push(row);
                report::write_atomic(
                    &self.dir.join("epochs.csv"),
                    report::to_csv(&self.rows)?.as_bytes(),
                )?;
            } else {
                // Complete after a later epoch (it waited for the reports a peer kept while
                // peer 0 was away): the record stays in epoch order.
                let at = self.rows.partition_point(|r| r.epoch < epoch);
                self.rows.insert(at, row);
                self.write_rows()?;
            }
        }
        Ok(())
    }

    /// Rewrites `epochs.jsonl` and `epochs.csv` with `rows`.
    fn write_rows(&self) -> anyhow::Result<()> {
        report::write_epoch_rows(&self.dir, &self.rows)
    }

    /// The row of `epoch` from `all` its reports (totals continued after a resume), and the
    /// averaged model.
    pub(crate) fn aggregate(
        &self,
        epoch: usize,
        all: Vec<Reported>,
    ) -> anyhow::Result<(EpochRow, MeanModel)> {
        let (row, mean) = epoch_row(
            epoch,
            &all,
            &self.test,
            self.kind,
            self.started.elapsed().as_secs_f64(),
        )?;
        let row = match &self.carried {
            Some(before) => continue_totals(before, row),
            None => row,
        };
        Ok((row, mean))
    }
}

/// `row` of a resumed run with the running totals of `before` (the last row recorded before
/// the resume) added: bytes sent, compute / communicate / wait seconds, refused and skipped
/// frames and wall time continue instead of starting again from 0.
pub(crate) fn continue_totals(before: &EpochRow, mut row: EpochRow) -> EpochRow {
    row.bytes_sent_per_peer += before.bytes_sent_per_peer;
    row.compute_seconds += before.compute_seconds;
    row.communicate_seconds += before.communicate_seconds;
    row.wait_seconds += before.wait_seconds;
    row.refused_frames += before.refused_frames;
    row.skipped += before.skipped;
    row.wall_seconds += before.wall_seconds;
    row
}

/// The network's averaged model: x̄ (`[d]`) and the mean of the peers' BatchNorm running
/// statistics (`[s]`, empty for a model without BatchNorm).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MeanModel {
    /// x̄ = (1/n) Σ x_i.
    pub(crate) x: Vec<f32>,
    /// (1/n) Σ s_i over the peers' running means and variances: what PyTorch's gossip
    /// implementations average with the state dict. Empty when a report has none.
    pub(crate) running_state: Vec<f32>,
}

/// The element-wise mean of the peers' running statistics, or empty when one peer reported
/// none or they differ in length.
fn mean_running_state(all: &[Reported]) -> Vec<f32> {
    let Some(len) = all.first().map(|(r, _)| r.running_state.len()) else {
        return Vec::new();
    };
    if len == 0 || all.iter().any(|(r, _)| r.running_state.len() != len) {
        return Vec::new();
    }
    consensus_distance(all.iter().map(|(r, _)| r.running_state.as_slice())).1
}

/// The network's row for `epoch` from every peer's report and parameters: accuracy
/// spread, consensus distance Ξ², accuracy of the averaged model on `test`, and the
/// per-peer means; and the averaged model itself (x̄ with the peers' mean BatchNorm
/// statistics, the model that is evaluated and exported). `wall_seconds` is the run's
/// clock (real or simulated).
pub(crate) fn epoch_row(
    epoch: usize,
    all: &[Reported],
    test: &Dataset,
    kind: model::ModelKind,
    wall_seconds: f64,
) -> anyhow::Result<(EpochRow, MeanModel)> {
    let n = all.len() as f64;
    let (xi2, avg) = consensus_distance(all.iter().map(|(_, x)| x.as_slice()));
    let running_state = mean_running_state(all);
    let device = Default::default();
    let mut eval = model::unflatten(Net::<burn::backend::Flex>::new(kind, &device), &avg)?;
    if !running_state.is_empty() {
        eval = model::unflatten_running_state(eval, &running_state)?;
    }
    let (avg_acc, avg_loss) =
        model::evaluate(&eval, &test.values(), &test.labels, EVAL_BATCH, &device)?;
    let tokens = matches!(eval.input(), model::Input::Tokens { .. });
    let acc =
        |f: fn(f64, f64) -> f64, init: f64| all.iter().map(|(r, _)| r.test_accuracy).fold(init, f);
    let mean = |g: fn(&PeerEpoch) -> f64| all.iter().map(|(r, _)| g(r)).sum::<f64>() / n;
    let row = EpochRow {
        epoch,
        phase: all
            .first()
            .map(|(r, _)| r.phase.clone())
            .unwrap_or_default(),
        rounds: all.iter().map(|(r, _)| r.rounds).max().unwrap_or(0),
        mean_test_accuracy: mean(|r| r.test_accuracy),
        min_test_accuracy: acc(f64::min, f64::INFINITY),
        max_test_accuracy: acc(f64::max, f64::NEG_INFINITY),
        avg_model_test_accuracy: avg_acc,
        mean_test_loss: mean(|r| r.test_loss),
        avg_model_test_loss: avg_loss,
        mean_test_bits_per_byte: test
            .bytes_per_token
            .filter(|_| tokens)
            .map(|b| mean(|r| r.test_loss) / std::f64::consts::LN_2 / b),
        mean_test_bits_per_token: tokens.then(|| mean(|r| r.test_loss) / std::f64::consts::LN_2),
        consensus_distance: xi2,
        mean_train_loss: mean(|r| r.train_loss),
        bytes_sent_per_peer: mean(|r| r.totals.bytes_sent as f64),
        compute_seconds: mean(|r| r.totals.compute_seconds),
        communicate_seconds: mean(|r| r.totals.communicate_seconds),
        wait_seconds: mean(|r| r.totals.wait_seconds),
        refused_frames: all.iter().map(|(r, _)| r.totals.refused_frames).sum(),
        wall_seconds,
        peers: all.len(),
        skipped: all.iter().map(|(r, _)| r.totals.skipped).sum(),
    };
    Ok((
        row,
        MeanModel {
            x: avg,
            running_state,
        },
    ))
}

/// A peer's numbers at the end of an epoch: test accuracy and loss of `eval` on `test`, and
/// the training loss — `batch_loss_mean` (the mean of the epoch's mini-batch losses), or,
/// at epoch 0 where nothing was trained, the loss of `eval` on its own `shard` (for the
/// language model on the shard's first [`text::VALIDATION_SEQUENCES`] sequences: a shard
/// of the text holds thousands).
pub(crate) fn evaluate_epoch<B: burn::tensor::backend::Backend>(
    eval: &Net<B>,
    test: &Dataset,
    shard: &Dataset,
    batch_loss_mean: Option<f64>,
    device: &B::Device,
) -> anyhow::Result<(f64, f64, f64)> {
    let (accuracy, test_loss) =
        model::evaluate(eval, &test.values(), &test.labels, EVAL_BATCH, device)?;
    let train_loss = match batch_loss_mean {
        Some(l) => l,
        None if matches!(eval.input(), model::Input::Tokens { .. }) => {
            let first: Vec<usize> = (0..shard.len().min(text::VALIDATION_SEQUENCES)).collect();
            let some = shard.subset(&first);
            model::evaluate(eval, &some.values(), &some.labels, EVAL_BATCH, device)?.1
        }
        None => evaluate_in_chunks(eval, shard, device)?.1,
    };
    Ok((accuracy, test_loss, train_loss))
}

/// Samples converted at a time by [`evaluate_in_chunks`].
const EVAL_CHUNK: usize = 4 * EVAL_BATCH;

/// [`model::evaluate`] of `eval` on `data`, converting a set held as bytes
/// ([`Values::Bytes`](crate::train::data::Values)) [`EVAL_CHUNK`] samples at a time instead
/// of whole (a 25,000-image CIFAR-10 shard is 307 MB of f32): accuracy and mean loss over
/// the samples, weighted by the samples of each chunk.
fn evaluate_in_chunks<B: burn::tensor::backend::Backend>(
    eval: &Net<B>,
    data: &Dataset,
    device: &B::Device,
) -> anyhow::Result<(f64, f64)> {
    if let crate::train::data::Values::F32(values) = &data.values {
        return model::evaluate(eval, values, &data.labels, EVAL_BATCH, device);
    }
    let n = data.len();
    let (mut accuracy, mut loss) = (0.0, 0.0);
    let mut chunk = Vec::new();
    for start in (0..n).step_by(EVAL_CHUNK) {
        let end = (start + EVAL_CHUNK).min(n);
        chunk.clear();
        for i in start..end {
            data.append_image(i, &mut chunk);
        }
        let (a, l) = model::evaluate(eval, &chunk, &data.labels[start..end], EVAL_BATCH, device)?;
        accuracy += a * (end - start) as f64;
        loss += l * (end - start) as f64;
    }
    let n = n.max(1) as f64;
    Ok((accuracy / n, loss / n))
}

/// Writes a model — `net` (its architecture and any state beyond its parameters, such as
/// BatchNorm statistics) with the parameters `x: [d]` — to the file `path` (the run's
/// `<run>/model.safetensors`, a peer's `<run>/peers/model-<rank>.safetensors`; SafeTensors,
/// f32), through Burn's own store, in PyTorch's conventions: a tensor per
/// parameter named by the model's field path (`fc1.weight`), linear weights as
/// [out, in] (`nn.Linear`'s layout), normalization scales and shifts as `weight`/`bias`.
///
/// # Errors
/// `x` does not fit `net`, or the file cannot be written.
pub(crate) fn write_model<B: burn::tensor::backend::Backend>(
    net: Net<B>,
    x: &[f32],
    path: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, SafetensorsStore};
    let path = path.to_owned();
    let model = model::unflatten(net, x)?;
    let mut store = SafetensorsStore::from_file(path.clone())
        .with_to_adapter(BurnToPyTorchAdapter)
        .skip_enum_variants(true)
        .overwrite(true)
        .metadata("producer", "murmur")
        .metadata("murmur_version", env!("CARGO_PKG_VERSION"));
    model
        .save_into(&mut store)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// The prompt of the end-of-run text sample.
pub(crate) const SAMPLE_PROMPT: &str = "And God said";

/// The language model: writes `--sample` bytes (GPT-2 tokens, for a model of GPT-2's
/// vocabulary) generated by `net` after [`SAMPLE_PROMPT`] to `<dir>/sample.txt` and returns
/// them (lossy UTF-8); `None` for the other models, another vocabulary or `--sample 0`.
///
/// # Errors
/// The generation fails, or the file cannot be written.
pub(crate) fn write_sample<B: burn::tensor::backend::Backend>(
    net: &Net<B>,
    args: &RunArgs,
    dir: &std::path::Path,
    device: &B::Device,
) -> anyhow::Result<Option<String>> {
    let vocab = match net.input() {
        model::Input::Tokens { vocab, .. } if args.train.sample > 0 => vocab,
        _ => return Ok(None),
    };
    // Bytes, or GPT-2's tokens (a token file); another vocabulary has no known decoding.
    let gpt2 = vocab == tokens::GPT2_VOCAB;
    let prompt: Vec<u32> = match vocab {
        256 => SAMPLE_PROMPT.bytes().map(u32::from).collect(),
        _ if gpt2 => tokens::gpt2_encode(SAMPLE_PROMPT)?
            .into_iter()
            .map(u32::from)
            .collect(),
        _ => return Ok(None),
    };
    let ids = model::sample_text(
        net,
        &prompt,
        args.train.sample,
        0.8,
        args.train.seed,
        device,
    )?;
    let generated = if gpt2 {
        tokens::gpt2_decode(&ids)
    } else {
        String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<u8>>()).into_owned()
    };
    let text = format!("{SAMPLE_PROMPT}{generated}");
    report::write_atomic(&dir.join("sample.txt"), text.as_bytes())?;
    Ok(Some(text))
}

/// The run summary from the last epoch row.
pub(crate) fn summary(
    args: &RunArgs,
    topo: &murmur_topology::Topology,
    d: usize,
    last: &EpochRow,
) -> Summary {
    Summary {
        algorithm: args.algorithm_name(),
        compressor: args.compressor_label(),
        topology: args.topology_label(topo),
        peers: args.peers,
        model: args.train.model.to_string(),
        dim: d,
        epochs: args.train.epochs,
        rounds: last.rounds,
        partition: args.train.partition.to_string(),
        seed: args.train.seed,
        lambda2_abs: topo.w.second_eigenvalue_modulus(),
        spectral_gap: topo.w.spectral_gap(),
        final_mean_test_accuracy: last.mean_test_accuracy,
        final_min_test_accuracy: last.min_test_accuracy,
        final_max_test_accuracy: last.max_test_accuracy,
        final_avg_model_test_accuracy: last.avg_model_test_accuracy,
        final_consensus_distance: last.consensus_distance,
        final_mean_test_loss: last.mean_test_loss,
        final_avg_model_test_loss: last.avg_model_test_loss,
        final_mean_test_bits_per_byte: last.mean_test_bits_per_byte,
        final_mean_test_bits_per_token: last.mean_test_bits_per_token,
        bytes_sent_per_peer: last.bytes_sent_per_peer,
        wall_seconds: last.wall_seconds,
        seconds_per_round: last.wall_seconds / (last.rounds.max(1) as f64),
        samples_per_second: (args.peers * args.train.batch_size) as f64 * last.rounds as f64
            / last.wall_seconds.max(f64::MIN_POSITIVE),
        departures: String::new(),
        rejoins: String::new(),
        joins: String::new(),
        outcome: report::COMPLETED.to_string(),
        peer_failures: String::new(),
        restarts: String::new(),
    }
}

/// Writes `summary.json` and `summary.csv` into `dir` and prints the summary line.
pub(crate) fn write_summary(dir: &Path, summary: &Summary) -> anyhow::Result<()> {
    report::save_summary(dir, summary)?;
    println!("{}", report::summary_line(summary));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::frames::tests::report;

    #[test]
    fn a_resumed_run_continues_the_running_totals_of_its_record() {
        let before = EpochRow {
            epoch: 3,
            rounds: 30,
            bytes_sent_per_peer: 300.0,
            compute_seconds: 3.0,
            communicate_seconds: 6.0,
            wait_seconds: 2.0,
            refused_frames: 1,
            skipped: 4,
            wall_seconds: 9.0,
            mean_test_accuracy: 0.5,
            ..EpochRow::default()
        };
        let after = EpochRow {
            epoch: 4,
            rounds: 40,
            bytes_sent_per_peer: 100.0,
            compute_seconds: 1.0,
            communicate_seconds: 2.0,
            wait_seconds: 0.5,
            refused_frames: 2,
            skipped: 1,
            wall_seconds: 3.5,
            mean_test_accuracy: 0.75,
            ..EpochRow::default()
        };
        let row = continue_totals(&before, after);
        assert_eq!(
            (row.epoch, row.rounds),
            (4, 40),
            "counters, not totals, stay"
        );
        assert_eq!(row.mean_test_accuracy, 0.75, "a measurement is not summed");
        assert_eq!(row.bytes_sent_per_peer, 400.0);
        assert_eq!(
            (
                row.compute_seconds,
                row.communicate_seconds,
                row.wait_seconds
            ),
            (4.0, 8.0, 2.5)
        );
        assert_eq!((row.refused_frames, row.skipped), (3, 5));
        assert_eq!(row.wall_seconds, 12.5);
    }

    /// The exported model holds exactly the parameters it was given, under Burn's names,
    /// and loads back into the same architecture.
    #[test]
    fn the_exported_model_loads_back_with_the_same_parameters() {
        type B = burn::backend::Flex;
        let device = Default::default();
        let net = Net::<B>::new(model::ModelKind::MLP, &device);
        let x: Vec<f32> = (0..203_530).map(|i| (i % 97) as f32 * 0.01 - 0.5).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = write_model(net, &x, &dir.path().join("model.safetensors")).unwrap();
        // --init-from reads it back bit for bit.
        let fresh = Net::<B>::new(model::ModelKind::MLP, &device);
        let fresh = model::load_safetensors(fresh, &path).unwrap();
        let mut back = Vec::new();
        model::flatten(&fresh, &mut back);
        assert_eq!(back, x);
        // Into another architecture it does not fit: refused, naming the file.
        let cnn = Net::<B>::new(model::ModelKind::CNN, &device);
        let err = format!("{:#}", model::load_safetensors(cnn, &path).unwrap_err());
        assert!(err.contains("--init-from"), "{err}");
        // Parameters that do not fit the model are refused.
        let short = Net::<B>::new(model::ModelKind::MLP, &device);
        assert!(write_model(short, &x[..10], &dir.path().join("model.safetensors")).is_err());
        // Every model round-trips, BatchNorm (ResNet-20) and LayerNorm (transformer) included.
        for kind in [
            model::ModelKind::CNN,
            model::ModelKind::RESNET20,
            model::ModelKind::Transformer(model::TransformerConfig::default()),
        ] {
            let net = Net::<B>::new(kind, &device);
            let mut x = Vec::new();
            model::flatten(&net, &mut x);
            let x: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, v)| v + (i % 7) as f32)
                .collect();
            let path = write_model(net, &x, &dir.path().join("model.safetensors")).unwrap();
            let fresh = model::load_safetensors(Net::<B>::new(kind, &device), &path).unwrap();
            let mut back = Vec::new();
            model::flatten(&fresh, &mut back);
            assert!(back == x, "{kind}");
        }
    }

    #[test]
    fn a_set_held_as_bytes_is_evaluated_in_chunks_as_it_is_whole() {
        use crate::train::data::Values;
        type B = burn::backend::Flex;
        let device = Default::default();
        // 2,345 images of 2×3×3 bytes: more than one chunk, the last one partial.
        let kind: model::ModelKind = "mlp:hidden=8,input=2x3x3,classes=3".parse().unwrap();
        let net = Net::<B>::new(kind, &device);
        let n = 2 * EVAL_CHUNK + 345;
        let data = Dataset {
            values: Values::Bytes {
                bytes: (0..n * 18).map(|i| (i * 37 % 251) as u8).collect(),
                mean: vec![0.4, 0.5],
                std: vec![0.2, 0.3],
            },
            labels: (0..n).map(|i| (i % 3) as u8).collect(),
            channels: 2,
            rows: 3,
            cols: 3,
            classes: 3,
            augment: None,
            bytes_per_token: None,
        };
        let (a, l) = evaluate_in_chunks(&net, &data, &device).unwrap();
        let (whole_a, whole_l) =
            model::evaluate(&net, &data.values(), &data.labels, EVAL_BATCH, &device).unwrap();
        assert!((a - whole_a).abs() < 1e-12, "{a} against {whole_a}");
        assert!(
            (l - whole_l).abs() < 1e-6 * whole_l.abs().max(1.0),
            "{l} against {whole_l}"
        );
        assert!(a > 0.0 && l > 0.0);
    }

    #[test]
    fn the_averaged_model_carries_the_peers_mean_batchnorm_statistics() {
        type B = burn::backend::Flex;
        let device = Default::default();
        let kind = model::ModelKind::RESNET20;
        let net = Net::<B>::new(kind, &device);
        let (mut x, mut s) = (Vec::new(), Vec::new());
        model::flatten(&net, &mut x);
        model::flatten_running_state(&net, &mut s);
        let peer = |shift: f32| {
            let mut r = report();
            r.running_state = s.iter().map(|v| v + shift).collect();
            (r, x.clone())
        };
        let test = Dataset::synthetic(net.input(), 8, 3);
        let (row, mean) = epoch_row(1, &[peer(0.5), peer(1.5)], &test, kind, 0.0).unwrap();
        let want: Vec<f32> = s.iter().map(|v| v + 1.0).collect();
        assert_eq!(mean.running_state, want);
        // The x̄ column evaluates exactly that model.
        let eval =
            model::unflatten_running_state(model::unflatten(net, &mean.x).unwrap(), &want).unwrap();
        let (acc, loss) =
            model::evaluate(&eval, &test.values(), &test.labels, EVAL_BATCH, &device).unwrap();
        assert_eq!(
            (row.avg_model_test_accuracy, row.avg_model_test_loss),
            (acc, loss)
        );
        // A peer without statistics (or of another length): none are averaged.
        let mut odd = peer(0.0);
        odd.0.running_state.pop();
        let (_, mean) = epoch_row(1, &[peer(0.5), odd], &test, kind, 0.0).unwrap();
        assert!(mean.running_state.is_empty());
    }

    /// A collector of `n` peers (10 rounds per epoch) writing into `dir`, for a tiny MLP
    /// (its d returned too) evaluated on 8 synthetic samples.
    fn tiny_collector(n: usize, dir: &Path) -> (Collector, usize) {
        let kind: model::ModelKind = "mlp:hidden=4,input=1x2x2,classes=2".parse().unwrap();
        let net = Net::<burn::backend::Flex>::new(kind, &Default::default());
        let d = net.dim();
        let test = Arc::new(Dataset::synthetic(net.input(), 8, 3));
        (Collector::new(n, dir.to_path_buf(), 10, test, d, kind), d)
    }

    /// The reports of peers `peers` for every epoch of `epochs`, x = 0.5 each.
    fn add_all(
        c: &mut Collector,
        epochs: std::ops::RangeInclusive<usize>,
        peers: std::ops::Range<Rank>,
    ) {
        for epoch in epochs {
            for peer in peers.clone() {
                add(c, peer, epoch, 0.5).unwrap();
            }
        }
    }

    /// Peer 0's departure at round 25 (epoch 3), noticed by peer 1.
    fn peer_0_left_at_round_25() -> MembershipEvent {
        MembershipEvent {
            event: "left".into(),
            peer: 0,
            round: 25,
            epoch: 3,
            wall_seconds: 1.0,
            noticed_by: 1,
            reason: "timed out".into(),
        }
    }

    /// Peer `peer`'s report of epoch `epoch` with x = `value` (`[d]`).
    fn add(c: &mut Collector, peer: Rank, epoch: usize, value: f32) -> anyhow::Result<()> {
        let mut r = report();
        (r.peer, r.epoch, r.rounds) = (peer, epoch, 10 * epoch as u64);
        r.running_state.clear();
        let d = c.d;
        c.add(r, vec![value; d])
    }

    #[test]
    fn an_epoch_complete_after_a_later_one_takes_its_place_in_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, d) = tiny_collector(2, dir.path());
        // Epoch 2 waits for peer 1's report (kept while peer 0 was away, say) while epoch
        // 3 is recorded; the late report completes it.
        add(&mut c, 0, 2, 0.0).unwrap();
        add(&mut c, 0, 3, 1.0).unwrap();
        add(&mut c, 1, 3, 1.0).unwrap();
        add(&mut c, 1, 2, 0.0).unwrap();
        let epochs = |rows: &[EpochRow]| rows.iter().map(|r| r.epoch).collect::<Vec<_>>();
        assert_eq!(epochs(&c.rows), [2, 3]);
        let jsonl: Vec<EpochRow> =
            report::read_json_lines(&dir.path().join("epochs.jsonl")).unwrap();
        assert_eq!(epochs(&jsonl), [2, 3], "the file in epoch order too");
        let csv = std::fs::read_to_string(dir.path().join("epochs.csv")).unwrap();
        let first_column: Vec<&str> = csv.lines().skip(1).map(|l| &l[..1]).collect();
        assert_eq!(first_column, ["2", "3"]);
        // The exported model stays the newest epoch's x̄.
        assert_eq!(c.mean.as_ref().unwrap().x, vec![1.0; d]);
        // A report of a recorded epoch is still refused.
        assert!(add(&mut c, 1, 2, 0.0).is_err());
    }

    #[test]
    fn a_departure_told_to_a_restarted_peer_0_before_it_mixed_is_placed_after_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = tiny_collector(3, dir.path());
        add_all(&mut c, 0..=3, 0..3);
        let left = |peer, round, epoch| MembershipEvent {
            event: "left".into(),
            peer,
            round,
            epoch,
            wall_seconds: 0.0,
            noticed_by: 0,
            reason: "its process exited (SIGKILL), as the launcher saw".into(),
        };
        // Peer 0's old process recorded peer 2's departure, not peer 1's; then it died too.
        c.membership(left(2, 33, 4), None).unwrap();
        let (mut c, _) = tiny_collector(3, dir.path());
        c.take_up().unwrap();
        // Its new process is told of both exits before it mixes again (its round is 0).
        c.membership(left(1, 0, 0), None).unwrap();
        c.membership(left(2, 0, 0), None).unwrap();
        let read = || -> Vec<MembershipEvent> {
            report::read_json_lines(&dir.path().join("membership.jsonl")).unwrap()
        };
        // Nothing is written before it rejoined (a stand-in may still keep the record).
        assert_eq!(read().len(), 1, "{:?}", read());
        c.rejoined(
            50,
            (&BTreeMap::new(), &BTreeMap::new()),
            false,
            &RecordCopy::default(),
        )
        .unwrap();
        let events = read();
        let placed: Vec<_> = events.iter().map(|e| (e.peer, e.round, e.epoch)).collect();
        assert_eq!(
            placed,
            [(2, 33, 4), (1, 30, 4), (0, 50, 6), (0, 50, 6)],
            "{events:?}"
        );
        assert!(!c.awaits(1, 4) && !c.awaits(2, 4));
    }

    /// One writer of a run folder's record at a time: a second collector does not get the
    /// record's lock while the first holds it, and gets it once the first is gone (a
    /// keeper that stood down, or died: the kernel drops a dead process's lock).
    #[test]
    fn the_record_has_one_writer_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (mut first, _) = tiny_collector(3, dir.path());
        let (mut second, _) = tiny_collector(3, dir.path());
        assert!(first.lock_record(std::time::Duration::ZERO));
        let t0 = Instant::now();
        assert!(!second.lock_record(std::time::Duration::from_millis(100)));
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(100),
            "it waited"
        );
        drop(first);
        assert!(second.lock_record(std::time::Duration::ZERO));
        assert!(
            second.lock_record(std::time::Duration::ZERO),
            "held already"
        );
    }

    /// The lowest live rank stands in for a departed peer 0: it continues the record peer
    /// 0 wrote (recording peer 0's departure, ignoring reports of recorded epochs sent
    /// again), and hands it back to peer 0's new process, which takes it up where the
    /// stand-in left it: every epoch once, one departure of peer 0.
    #[test]
    fn a_stand_in_continues_the_record_and_hands_it_back_to_a_restarted_peer_0() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = tiny_collector(3, dir.path());
        add_all(&mut c, 0..=1, 0..3);
        add(&mut c, 1, 2, 0.5).unwrap();
        // Peer 0 dies during epoch 2; peer 1 stands in.
        drop(c);
        let left0 = peer_0_left_at_round_25();
        let (mut stand_in, _) = tiny_collector(3, dir.path());
        stand_in
            .stand_in(
                &BTreeMap::from([(0, left0.clone())]),
                std::time::Duration::ZERO,
                &RecordCopy::default(),
            )
            .unwrap();
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&dir.path().join("membership.jsonl")).unwrap();
        assert_eq!(
            events.len(),
            1,
            "peer 0's departure, recorded by its stand-in"
        );
        assert_eq!((events[0].peer, events[0].noticed_by), (0, 1));
        // The peers send their kept reports again: epoch 1's are ignored, epoch 2 is
        // complete without peer 0's.
        for peer in 1..3 {
            add(&mut stand_in, peer, 1, 0.5).unwrap();
            add(&mut stand_in, peer, 2, 0.5).unwrap();
        }
        // Peer 0's new process takes up the record while the stand-in still records.
        let (mut back, _) = tiny_collector(3, dir.path());
        back.take_up().unwrap();
        for peer in 1..3 {
            add(&mut stand_in, peer, 3, 0.5).unwrap();
            // Sent to the new peer 0 too, once linked to it.
            add(&mut back, peer, 3, 0.5).unwrap();
        }
        let last = |c: &Collector| c.rows.last().map(|r| r.epoch);
        assert_eq!(
            last(&back),
            Some(2),
            "it records nothing before it rejoined"
        );
        assert_eq!(last(&stand_in), Some(3));
        drop(stand_in);
        back.membership(left0, None).unwrap();
        back.rejoined(
            45,
            (&BTreeMap::new(), &BTreeMap::new()),
            false,
            &RecordCopy::default(),
        )
        .unwrap();
        add_all(&mut back, 4..=5, 0..3);
        let rows: Vec<EpochRow> =
            report::read_json_lines(&dir.path().join("epochs.jsonl")).unwrap();
        let epochs: Vec<usize> = rows.iter().map(|r| r.epoch).collect();
        assert_eq!(epochs, [0, 1, 2, 3, 4, 5]);
        let peers: Vec<usize> = rows.iter().map(|r| r.peers).collect();
        assert_eq!(peers, [3, 3, 2, 2, 3, 3]);
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&dir.path().join("membership.jsonl")).unwrap();
        let placed: Vec<_> = (events.iter())
            .map(|e| (e.event.as_str(), e.peer, e.round))
            .collect();
        assert_eq!(placed, [("left", 0, 25), ("rejoined", 0, 45)], "{events:?}");
    }

    /// The same with no run folder shared between the hosts of peer 0 and of its stand-in
    /// (peer 1): the stand-in continues the record from its copy of the lines peer 0
    /// flooded, and peer 0's new process continues it, in its own folder, from the copy
    /// in the stand-in's welcome. Each folder ends with every epoch once.
    #[test]
    fn a_stand_in_on_another_host_continues_the_record_from_its_copy() {
        let (host0, host1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut copy1 = RecordCopy::default();
        let (mut c, _) = tiny_collector(3, host0.path());
        add_all(&mut c, 0..=1, 0..3);
        add(&mut c, 1, 2, 0.5).unwrap();
        copy1.merge(c.take_lines(), Instant::now());
        let accuracy_1 = c.rows[1].mean_test_accuracy;
        drop(c);
        let left0 = peer_0_left_at_round_25();
        let (mut stand_in, _) = tiny_collector(3, host1.path());
        stand_in
            .stand_in(
                &BTreeMap::from([(0, left0.clone())]),
                std::time::Duration::ZERO,
                &copy1,
            )
            .unwrap();
        assert_eq!(stand_in.rows.len(), 2, "epochs 0 and 1 from the copy");
        assert_eq!(stand_in.rows[1].mean_test_accuracy, accuracy_1);
        for peer in 1..3 {
            add(&mut stand_in, peer, 1, 0.5).unwrap();
            add(&mut stand_in, peer, 2, 0.5).unwrap();
            add(&mut stand_in, peer, 3, 0.5).unwrap();
        }
        // Its copy is what it welcomes peer 0's new process with.
        copy1.merge(stand_in.take_lines(), Instant::now());
        drop(stand_in);
        let (mut back, _) = tiny_collector(3, host0.path());
        back.take_up().unwrap();
        back.membership(left0, None).unwrap();
        back.rejoined(45, (&BTreeMap::new(), &BTreeMap::new()), false, &copy1)
            .unwrap();
        add_all(&mut back, 4..=5, 0..3);
        for (host, last) in [(&host1, 3), (&host0, 5)] {
            let rows: Vec<EpochRow> =
                report::read_json_lines(&host.path().join("epochs.jsonl")).unwrap();
            let epochs: Vec<usize> = rows.iter().map(|r| r.epoch).collect();
            assert_eq!(epochs, (0..=last).collect::<Vec<_>>());
            let distances: Vec<PeerDistances> =
                report::read_json_lines(&host.path().join("distances.jsonl")).unwrap();
            assert_eq!(distances.len(), last + 1);
            let csv = std::fs::read_to_string(host.path().join("epochs.csv")).unwrap();
            assert_eq!(csv.lines().count(), last + 2);
        }
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&host0.path().join("membership.jsonl")).unwrap();
        let placed: Vec<_> = (events.iter())
            .map(|e| (e.event.as_str(), e.peer, e.round))
            .collect();
        assert_eq!(placed, [("left", 0, 25), ("rejoined", 0, 45)], "{events:?}");
    }

    /// A rejoin of a peer whose departure never reached the collector (its old process died
    /// with peer 0's) is recorded after a departure at the same round, once; a rejoin
    /// after a recorded departure is not given a second one.
    #[test]
    fn a_rejoin_without_a_recorded_departure_is_recorded_after_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = tiny_collector(3, dir.path());
        add_all(&mut c, 0..=0, 0..3);
        c.membership(MembershipEvent::back(1, 20, false, (3, 1.0)), Some(20))
            .unwrap();
        let left = MembershipEvent {
            event: "left".into(),
            peer: 2,
            round: 25,
            epoch: 3,
            wall_seconds: 1.5,
            noticed_by: 1,
            reason: "connection from peer 2: timed out".into(),
        };
        c.membership(left, None).unwrap();
        c.membership(MembershipEvent::back(2, 30, false, (4, 2.0)), Some(30))
            .unwrap();
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&dir.path().join("membership.jsonl")).unwrap();
        let placed: Vec<_> = (events.iter())
            .map(|e| (e.event.as_str(), e.peer, e.round))
            .collect();
        assert_eq!(
            placed,
            [
                ("left", 1, 20),
                ("rejoined", 1, 20),
                ("left", 2, 25),
                ("rejoined", 2, 30)
            ],
            "{events:?}"
        );
        assert!(events[0].reason.contains("unseen by peer 0"), "{events:?}");
        // Its reports are awaited again from the epoch of its rejoin round on.
        assert!(!c.awaits(1, 2) && c.awaits(1, 3));
    }

    /// A restarted peer 0 records a peer that took an empty rank while it was away (a
    /// member admitted it) as a join, and one that came back as a rejoin.
    #[test]
    fn a_restarted_peer_0_records_a_peer_admitted_while_it_was_away_as_a_join() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = tiny_collector(4, dir.path());
        let empty = MembershipEvent {
            event: "empty".into(),
            peer: 3,
            round: 0,
            epoch: 0,
            wall_seconds: 0.0,
            noticed_by: 0,
            reason: "not taken yet: the run started with --initial-peers".into(),
        };
        c.membership(empty, None).unwrap();
        add_all(&mut c, 0..=0, 0..3);
        let (mut c, _) = tiny_collector(4, dir.path());
        c.take_up().unwrap();
        let back = BTreeMap::from([(3, 40), (2, 40)]);
        let left2 = MembershipEvent {
            event: "left".into(),
            peer: 2,
            round: 30,
            epoch: 4,
            wall_seconds: 1.0,
            noticed_by: 1,
            reason: "timed out".into(),
        };
        c.membership(left2, None).unwrap();
        c.rejoined(50, (&BTreeMap::new(), &back), false, &RecordCopy::default())
            .unwrap();
        let events: Vec<MembershipEvent> =
            report::read_json_lines(&dir.path().join("membership.jsonl")).unwrap();
        let of = |p: Rank| -> Vec<&str> {
            (events.iter().filter(|e| e.peer == p))
                .map(|e| e.event.as_str())
                .collect()
        };
        assert_eq!(of(3), ["empty", "joined"], "{events:?}");
        assert_eq!(of(2), ["left", "rejoined"], "{events:?}");
        assert_eq!(of(0), ["left", "rejoined"], "{events:?}");
    }

    #[test]
    fn each_peer_distance_is_measured_from_the_mean_of_those_present() {
        let present = |x: Vec<f32>| Some((report(), x));
        let d = peer_distances(&[present(vec![0.0, 0.0]), None, present(vec![2.0, 4.0])]);
        // Mean (1, 2): each present peer is 1 + 4 = 5 away; the absent one has none.
        assert_eq!(d, vec![Some(5.0), None, Some(5.0)]);
    }
}
