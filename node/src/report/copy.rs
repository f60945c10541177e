//! Every peer's copy of the run's record, so that the record outlives its keeper on any host.
//!
//! The record's keeper (peer 0, or the lowest live rank standing in for it) writes the run
//! folder's `epochs.jsonl`, `distances.jsonl` and `membership.jsonl`. Each line it writes
//! it also floods on the data plane (a `Record` frame on every link; a peer passes on only
//! the lines that were new to it), and every peer keeps them in a [`RecordCopy`]: a few
//! hundred bytes an epoch. A peer that stands in for a departed keeper, or a restarted
//! peer 0 taking the record back, first completes its own run folder from its copy
//! ([`RecordCopy::fill`]) and then continues the record from there. So a run folder that
//! is not shared with the dead keeper's host (peers on several hosts without a shared file
//! system) gets the whole record, every epoch once, not a record that starts at the
//! stand-in's first epoch. A restarted or new peer takes the copy of each peer that
//! welcomes it ([`crate::control::membership::Welcome::record`]).
//!
//! Lines are keyed (an epoch row by its epoch, a membership event by its line number in
//! `membership.jsonl`) and the first copy of a key wins, so a flood ends: a line is passed
//! on once per peer. The files in the folder win over the copy for the keys they hold (a
//! shared folder holds everything the keeper wrote, the copy at most that).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Instant, SystemTime};

use anyhow::Context;
use murmur_gossip::frame::FrameKind;
use murmur_gossip::Rank;
use serde::{Deserialize, Serialize};

use super::collector::PeerDistances;
use super::frames::{decode_with_params_sized, encode_with_params};
use super::{EpochRow, MembershipEvent};

/// One line of the record, as the keeper wrote it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum RecordLine {
    /// An epoch's line of `epochs.jsonl` and its line of `distances.jsonl` (none for rows
    /// of a record from before the copy's time, whose distances were not found).
    Epoch {
        row: EpochRow,
        distances: Option<PeerDistances>,
    },
    /// Line `index` (from 0) of `membership.jsonl`.
    Event {
        index: usize,
        event: MembershipEvent,
    },
}

/// A peer's copy of the run's record: the lines it was sent, by key.
#[derive(Debug, Default)]
pub(crate) struct RecordCopy {
    /// Epoch rows with their distances, by epoch.
    epochs: BTreeMap<usize, (EpochRow, Option<PeerDistances>)>,
    /// Membership events by their line in `membership.jsonl`.
    events: BTreeMap<usize, MembershipEvent>,
    /// When the latest epoch's row came in: a folder completed from the copy dates its
    /// `epochs.jsonl` then, so that the new keeper's wall time counts the time since that
    /// row as the gap it is ([`RecordCopy::fill`]).
    newest: Option<(usize, Instant)>,
}

/// What [`RecordCopy::fill`] added to a run folder.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Filled {
    /// Epoch rows the folder lacked.
    pub(crate) epochs: usize,
    /// Membership events the folder lacked.
    pub(crate) events: usize,
}

impl RecordCopy {
    /// Takes `lines`, which came in at `now`, into the copy; returns those it did not hold
    /// (to pass on). A key held already keeps its line.
    pub(crate) fn merge(&mut self, lines: Vec<RecordLine>, now: Instant) -> Vec<RecordLine> {
        let mut new = Vec::new();
        for line in lines {
            let fresh = match &line {
                RecordLine::Epoch { row, distances } => {
                    let fresh = !self.epochs.contains_key(&row.epoch);
                    if fresh {
                        self.epochs
                            .insert(row.epoch, (row.clone(), distances.clone()));
                        if self.newest.is_none_or(|(e, _)| row.epoch > e) {
                            self.newest = Some((row.epoch, now));
                        }
                    }
                    fresh
                }
                RecordLine::Event { index, event } => {
                    let fresh = !self.events.contains_key(index);
                    if fresh {
                        self.events.insert(*index, event.clone());
                    }
                    fresh
                }
            };
            if fresh {
                new.push(line);
            }
        }
        new
    }

    /// Every line of the copy: epochs in order, then events in order.
    pub(crate) fn lines(&self) -> Vec<RecordLine> {
        let epochs = self
            .epochs
            .values()
            .map(|(row, distances)| RecordLine::Epoch {
                row: row.clone(),
                distances: distances.clone(),
            });
        let events = (self.events.iter()).map(|(&index, event)| RecordLine::Event {
            index,
            event: event.clone(),
        });
        epochs.chain(events).collect()
    }

    /// Completes the record in run folder `dir` from the copy: the epoch rows (and their
    /// distances) the folder lacks are added in epoch order (`epochs.jsonl`, `epochs.csv`
    /// and `distances.jsonl` are rewritten), and the membership events after the folder's
    /// last are appended, as far as the copy holds them without a gap. The folder's own
    /// lines stay as they are. `epochs.jsonl` keeps the time it was last written: the
    /// folder's own, or when the copy's row came in if that is now the last one (the new
    /// keeper's wall time goes on from the last row's plus the time since). Called by a
    /// new keeper before it reads the record.
    ///
    /// # Errors
    /// A file of the record cannot be read or written.
    pub(crate) fn fill(&self, dir: &Path) -> anyhow::Result<Filled> {
        let mut filled = Filled::default();
        let rows_path = dir.join("epochs.jsonl");
        let mut rows: Vec<EpochRow> = super::read_json_lines(&rows_path)?;
        let written = std::fs::metadata(&rows_path)
            .and_then(|m| m.modified())
            .ok();
        let held: BTreeSet<usize> = rows.iter().map(|r| r.epoch).collect();
        let folder_last = held.last().copied();
        let missing: Vec<&(EpochRow, Option<PeerDistances>)> = (self.epochs.iter())
            .filter(|(e, _)| !held.contains(e))
            .map(|(_, line)| line)
            .collect();
        if !missing.is_empty() {
            filled.epochs = missing.len();
            let distances_path = dir.join("distances.jsonl");
            let mut distances: Vec<PeerDistances> = super::read_json_lines(&distances_path)?;
            for (row, d) in missing {
                rows.push(row.clone());
                if let Some(d) = d
                    .as_ref()
                    .filter(|d| !distances.iter().any(|o| o.epoch == d.epoch))
                {
                    distances.push(d.clone());
                }
            }
            rows.sort_by_key(|r| r.epoch);
            distances.sort_by_key(|d| d.epoch);
            super::write_epoch_rows(dir, &rows)?;
            let dated = match self.newest {
                Some((e, at)) if folder_last.is_none_or(|f| e > f) => {
                    SystemTime::now().checked_sub(at.elapsed())
                }
                _ => written,
            };
            if let Some(t) = dated {
                std::fs::File::options()
                    .write(true)
                    .open(&rows_path)
                    .and_then(|f| f.set_modified(t))
                    .with_context(|| format!("dating {}", rows_path.display()))?;
            }
            super::write_json_lines(&distances_path, &distances)?;
        }
        let events_path = dir.join("membership.jsonl");
        let held = super::read_json_lines::<MembershipEvent>(&events_path)?.len();
        for index in held.. {
            let Some(event) = self.events.get(&index) else {
                break;
            };
            super::append_json_line(&events_path, event)?;
            filled.events += 1;
        }
        Ok(filled)
    }
}

/// A `Record` frame from `sender` carrying `lines`: a JSON frame without parameters, as a
/// welcome is ([`encode_with_params`]); the header's round is the latest epoch among them
/// (0 if none).
///
/// # Errors
/// The lines do not serialize (not expected).
pub(crate) fn encode(sender: Rank, lines: &[RecordLine]) -> anyhow::Result<Vec<u8>> {
    let round = (lines.iter())
        .filter_map(|l| match l {
            RecordLine::Epoch { row, .. } => Some(row.epoch as u64),
            RecordLine::Event { .. } => None,
        })
        .max()
        .unwrap_or(0);
    encode_with_params(FrameKind::Record, sender, round, &lines, &[])
}

/// The lines of a `Record` frame's payload.
///
/// # Errors
/// The payload is not a JSON frame of record lines without parameters.
pub(crate) fn decode(payload: &[u8]) -> anyhow::Result<Vec<RecordLine>> {
    let (lines, _) = decode_with_params_sized(payload, |_| 0)
        .context("a record frame that is not a list of record lines")?;
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_gossip::frame::FrameHeader;
    use std::time::Duration;

    fn row(epoch: usize, accuracy: f64) -> RecordLine {
        RecordLine::Epoch {
            row: EpochRow {
                epoch,
                mean_test_accuracy: accuracy,
                ..EpochRow::default()
            },
            distances: Some(PeerDistances {
                epoch,
                distances: vec![Some(0.5), None],
            }),
        }
    }

    fn event(index: usize, peer: Rank) -> RecordLine {
        RecordLine::Event {
            index,
            event: MembershipEvent {
                event: "left".into(),
                peer,
                round: 10 * index as u64,
                epoch: index,
                wall_seconds: 1.0,
                noticed_by: 1,
                reason: "killed".into(),
            },
        }
    }

    fn filled(epochs: usize, events: usize) -> Filled {
        Filled { epochs, events }
    }

    fn epochs(lines: &[RecordLine]) -> Vec<usize> {
        lines
            .iter()
            .filter_map(|l| match l {
                RecordLine::Epoch { row, .. } => Some(row.epoch),
                RecordLine::Event { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_line_is_new_once_and_the_first_copy_of_a_key_stays() {
        let mut copy = RecordCopy::default();
        let new = copy.merge(vec![row(0, 0.1), row(1, 0.5), event(0, 3)], Instant::now());
        assert_eq!(new.len(), 3);
        // The same lines flooded back by a neighbour: nothing to pass on.
        assert!(copy
            .merge(vec![row(1, 0.5), event(0, 3)], Instant::now())
            .is_empty());
        // Another line under a held key does not replace it, and is not passed on.
        assert!(copy.merge(vec![row(1, 0.9)], Instant::now()).is_empty());
        let new = copy.merge(vec![row(2, 0.7), event(2, 1)], Instant::now());
        assert_eq!(epochs(&new), [2]);
        assert_eq!(new.len(), 2);
        let all = copy.lines();
        assert_eq!(epochs(&all), [0, 1, 2]);
        match &all[1] {
            RecordLine::Epoch { row, .. } => assert_eq!(row.mean_test_accuracy, 0.5),
            other => panic!("{other:?}"),
        }
        // The frame carries the lines as they are.
        let frame = encode(4, &all).unwrap();
        let (header, payload) = FrameHeader::parse(&frame, u32::MAX).unwrap();
        assert_eq!(
            (header.kind, header.sender, header.round),
            (FrameKind::Record, 4, 2)
        );
        let back = decode(payload).unwrap();
        assert_eq!(epochs(&back), [0, 1, 2]);
        assert!(decode(b"{\"epoch\": 3}").is_err());
    }

    #[test]
    fn an_empty_folder_gets_the_whole_record_and_a_fuller_one_keeps_its_own() {
        let mut copy = RecordCopy::default();
        // Epoch 2's row came in 30 s ago.
        let then = Instant::now().checked_sub(Duration::from_secs(30)).unwrap();
        let lines = vec![
            row(0, 0.1),
            row(1, 0.5),
            row(2, 0.7),
            event(0, 0),
            event(1, 2),
        ];
        copy.merge(lines, then);
        // A folder on another host: nothing recorded there.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(copy.fill(dir.path()).unwrap(), filled(3, 2));
        let rows: Vec<EpochRow> =
            super::super::read_json_lines(&dir.path().join("epochs.jsonl")).unwrap();
        assert_eq!(rows.iter().map(|r| r.epoch).collect::<Vec<_>>(), [0, 1, 2]);
        let age = |dir: &Path| {
            let m = std::fs::metadata(dir.join("epochs.jsonl")).unwrap();
            m.modified().unwrap().elapsed().unwrap().as_secs_f64()
        };
        assert!(
            (29.0..40.0).contains(&age(dir.path())),
            "{}",
            age(dir.path())
        );
        let csv = std::fs::read_to_string(dir.path().join("epochs.csv")).unwrap();
        assert_eq!(csv.lines().count(), 4, "header and 3 rows: {csv}");
        let d: Vec<PeerDistances> =
            super::super::read_json_lines(&dir.path().join("distances.jsonl")).unwrap();
        assert_eq!(d.iter().map(|d| d.epoch).collect::<Vec<_>>(), [0, 1, 2]);
        let e: Vec<MembershipEvent> =
            super::super::read_json_lines(&dir.path().join("membership.jsonl")).unwrap();
        assert_eq!(e.iter().map(|e| e.peer).collect::<Vec<_>>(), [0, 2]);
        // Done again: nothing more.
        assert_eq!(copy.fill(dir.path()).unwrap(), Filled::default());

        // A folder that holds more than the copy (shared with the keeper, which wrote
        // epoch 3 and an event just before it died): its lines stay, nothing is added.
        let mut later = RecordCopy::default();
        later.merge(vec![row(3, 0.8), event(2, 1)], Instant::now());
        assert_eq!(copy.fill(dir.path()).unwrap(), Filled::default());
        assert_eq!(later.fill(dir.path()).unwrap(), filled(1, 1));
        let rows: Vec<EpochRow> =
            super::super::read_json_lines(&dir.path().join("epochs.jsonl")).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.epoch).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(rows[1].mean_test_accuracy, 0.5);

        // A copy with a gap in the events appends only up to it.
        let mut gap = RecordCopy::default();
        gap.merge(vec![event(3, 1), event(5, 2)], Instant::now());
        assert_eq!(gap.fill(dir.path()).unwrap(), filled(0, 1));
        let e: Vec<MembershipEvent> =
            super::super::read_json_lines(&dir.path().join("membership.jsonl")).unwrap();
        assert_eq!(e.len(), 4);
    }
}
