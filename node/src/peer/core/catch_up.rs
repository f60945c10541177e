//! A (re)joining peer's catch-up: its parameters x (`[d]`) fetched in parts from several
//! donors at once, as a pure state machine (no socket, no clock of its own).
//!
//! x is cut into contiguous parts of at most [`PART_FLOATS`] values, and at least one per
//! donor, so that every donor sends about d / k of it (k donors) instead of all of it. Each
//! donor has at most [`PARTS_IN_FLIGHT`] parts asked of it at a time (64 MiB: the memory a
//! catch-up costs a donor is bounded, whatever d), and the next part goes to the donor with
//! the fewest parts in flight, so a faster donor sends more. A donor answers between its
//! own training steps; so many parts in flight keep its link busy through a step (with 2 in
//! flight, 8 MiB, a 100 MB model's catch-up from 2 donors at 1 Gbit/s took 0.73 s instead
//! of 0.45; its link-rate bound is 0.40 s). A part not answered within the part time-out
//! is asked of another donor (the first answer counts, a later one is counted as duplicate
//! bytes); a donor that leaves has its parts asked of the others at once. Hivemind's state
//! download from one peer at a time (its issues #169, #504) and torchft's whole-checkpoint
//! recovery are what this avoids: with two donors or more no donor sends the whole model,
//! and no donor's loss or slowness stops the catch-up.
//!
//! Each part is one donor's x of that slice at the round it answered: the joiner starts
//! from a patchwork of its neighbours' parameters, which its first mixing rounds average.
//!
//! The frames: `Fetch` (joiner to donor: a JSON [`Part`], no parameters) and `StatePart`
//! (donor to joiner: the JSON [`Part`] and its `len` values), both with
//! `report::frames::encode_with_params`.

use std::time::{Duration, Instant};

use murmur_gossip::Rank;
use serde::{Deserialize, Serialize};

/// The largest part, in f32 values (4 MiB).
pub(crate) const PART_FLOATS: usize = 1 << 20;

/// The fewest donors a catch-up asks when the run has them: a peer with fewer present
/// in-neighbours (an elastic run's empty ranks beside it, neighbours gone) also fetches from
/// the nearest other present peers, so that no single donor serves a whole x.
pub(crate) const MIN_DONORS: usize = 2;

/// Parts asked of one donor at a time (with [`PART_FLOATS`]: 64 MiB).
pub(crate) const PARTS_IN_FLIGHT: usize = 16;

/// A slice of x: values `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Part {
    /// First index.
    pub(crate) start: u64,
    /// Number of values.
    pub(crate) len: u64,
}

impl Part {
    /// The index range, if it lies within a vector of `d` values and is at most
    /// [`PART_FLOATS`] long (a donor refuses any other request).
    pub(crate) fn within(self, d: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(self.start).ok()?;
        let len = usize::try_from(self.len).ok()?;
        let end = start.checked_add(len)?;
        (len <= PART_FLOATS && end <= d).then_some(start..end)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not asked of anyone now (`avoid`: the donor that last failed to answer it).
    Waiting { avoid: Option<Rank> },
    /// Asked of `donor` at `since`.
    Asked { donor: Rank, since: Instant },
    /// In x.
    Done,
}

/// What one donor has done so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DonorStats {
    pub(crate) rank: Rank,
    /// Parts it sent that were taken.
    pub(crate) parts: usize,
    /// Bytes of parameters it sent that were taken (4 per value).
    pub(crate) bytes: u64,
    /// Parts asked of it that it did not answer within the part time-out.
    pub(crate) timeouts: usize,
    /// It left during the catch-up.
    pub(crate) gone: bool,
}

/// What a finished catch-up did, for its log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    /// Per donor, in the order given.
    pub(crate) donors: Vec<DonorStats>,
    /// Bytes of parts that came after another donor's answer for the same part.
    pub(crate) duplicate_bytes: u64,
    /// From the first request to the last part, seconds.
    pub(crate) seconds: f64,
}

/// Why a received part was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PartError {
    /// From a peer that is no donor of this catch-up.
    #[error("a part from peer {0}, which is no donor")]
    NotADonor(Rank),
    /// A slice that is none of the parts.
    #[error("a part {start}..{end} that was never asked for")]
    NotAsked { start: u64, end: u64 },
    /// Its values are not as many as it says.
    #[error("a part of {said} values that carries {got}")]
    WrongLength { said: u64, got: usize },
}

/// The catch-up of x (`[d]`) from `donors`.
#[derive(Debug)]
pub(crate) struct CatchUp {
    x: Vec<f32>,
    /// Each part and its state, in order of `start`.
    parts: Vec<(Part, State)>,
    donors: Vec<DonorStats>,
    /// Parts asked of each donor now (as `donors`).
    in_flight: Vec<usize>,
    timeout: Duration,
    /// Parts asked of one donor at a time.
    per_donor: usize,
    started: Instant,
    finished: Option<Instant>,
    duplicate_bytes: u64,
}

impl CatchUp {
    /// A catch-up of `d` values from `donors` (distinct ranks, at least one), a part taken
    /// from another donor after `timeout` without an answer; nothing asked yet (see
    /// [`CatchUp::poll`]).
    pub(crate) fn new(d: usize, donors: &[Rank], timeout: Duration, now: Instant) -> Self {
        Self::with_limits(d, donors, timeout, now, (PART_FLOATS, PARTS_IN_FLIGHT))
    }

    /// [`CatchUp::new`] with parts of at most `part_floats` values, `per_donor` of them
    /// asked of one donor at a time.
    fn with_limits(
        d: usize,
        donors: &[Rank],
        timeout: Duration,
        now: Instant,
        (part_floats, per_donor): (usize, usize),
    ) -> Self {
        let k = donors.len().max(1);
        let part_len = d.div_ceil(k).clamp(1, part_floats);
        let parts = (0..d)
            .step_by(part_len)
            .map(|start| {
                let len = part_len.min(d - start);
                let part = Part {
                    start: start as u64,
                    len: len as u64,
                };
                (part, State::Waiting { avoid: None })
            })
            .collect();
        let donors = donors
            .iter()
            .map(|&rank| DonorStats {
                rank,
                parts: 0,
                bytes: 0,
                timeouts: 0,
                gone: false,
            })
            .collect::<Vec<_>>();
        Self {
            x: vec![0.0; d],
            parts,
            in_flight: vec![0; donors.len()],
            donors,
            timeout,
            per_donor,
            started: now,
            finished: (d == 0).then_some(now),
            duplicate_bytes: 0,
        }
    }

    /// What to ask now, as (donor, part): the parts whose donor did not answer within the
    /// time-out are taken back, then every part not asked of anyone goes to a live donor
    /// with a free slot (fewest parts in flight first, not the one that failed it unless
    /// it is the only one left).
    pub(crate) fn poll(&mut self, now: Instant) -> Vec<(Rank, Part)> {
        for i in 0..self.parts.len() {
            if let State::Asked { donor, since } = self.parts[i].1 {
                if now.saturating_duration_since(since) >= self.timeout {
                    let d = self.donor_index(donor).expect("asked of a donor");
                    self.in_flight[d] -= 1;
                    self.donors[d].timeouts += 1;
                    self.parts[i].1 = State::Waiting { avoid: Some(donor) };
                }
            }
        }
        let mut asks = Vec::new();
        for i in 0..self.parts.len() {
            let State::Waiting { avoid } = self.parts[i].1 else {
                continue;
            };
            let free = |d: &usize| !self.donors[*d].gone && self.in_flight[*d] < self.per_donor;
            let pick = (0..self.donors.len())
                .filter(free)
                .filter(|&d| Some(self.donors[d].rank) != avoid)
                .min_by_key(|&d| self.in_flight[d]);
            // The donor that failed it, only if no other donor is left at all.
            let others_left = (0..self.donors.len())
                .any(|d| !self.donors[d].gone && Some(self.donors[d].rank) != avoid);
            let pick = pick.or_else(|| {
                (!others_left)
                    .then(|| (0..self.donors.len()).find(free))
                    .flatten()
            });
            let Some(d) = pick else {
                continue;
            };
            self.in_flight[d] += 1;
            let donor = self.donors[d].rank;
            self.parts[i].1 = State::Asked { donor, since: now };
            asks.push((donor, self.parts[i].0));
        }
        asks
    }

    /// Takes the `values` of `part` from `from` into x. A part that another donor has
    /// answered already is counted as duplicate bytes and dropped.
    ///
    /// # Errors
    /// `from` no donor, a part never asked for, or a length other than the part's.
    pub(crate) fn on_part(
        &mut self,
        now: Instant,
        from: Rank,
        part: Part,
        values: &[f32],
    ) -> Result<(), PartError> {
        let d = self.donor_index(from).ok_or(PartError::NotADonor(from))?;
        let i = (self.parts.iter())
            .position(|(p, _)| *p == part)
            .ok_or(PartError::NotAsked {
                start: part.start,
                end: part.start.saturating_add(part.len),
            })?;
        if values.len() as u64 != part.len {
            return Err(PartError::WrongLength {
                said: part.len,
                got: values.len(),
            });
        }
        let bytes = 4 * part.len;
        match self.parts[i].1 {
            State::Done => {
                self.duplicate_bytes += bytes;
                // The donor asked last may be this one, after another answered first.
                return Ok(());
            }
            State::Asked { donor, .. } => {
                let a = self.donor_index(donor).expect("asked of a donor");
                self.in_flight[a] -= 1;
            }
            State::Waiting { .. } => {}
        }
        let start = part.start as usize;
        self.x[start..start + values.len()].copy_from_slice(values);
        self.parts[i].1 = State::Done;
        self.donors[d].parts += 1;
        self.donors[d].bytes += bytes;
        if self.finished.is_none() && self.done() {
            self.finished = Some(now);
        }
        Ok(())
    }

    /// Donor `rank` left: the parts asked of it are asked of the others at the next
    /// [`CatchUp::poll`].
    pub(crate) fn donor_gone(&mut self, rank: Rank) {
        let Some(d) = self.donor_index(rank) else {
            return;
        };
        self.donors[d].gone = true;
        self.in_flight[d] = 0;
        for (_, s) in &mut self.parts {
            if matches!(*s, State::Asked { donor, .. } if donor == rank) {
                *s = State::Waiting { avoid: Some(rank) };
            }
        }
    }

    /// The donors not known to have left, in the order given.
    pub(crate) fn live_donors(&self) -> impl Iterator<Item = Rank> + '_ {
        self.donors.iter().filter(|s| !s.gone).map(|s| s.rank)
    }

    /// Whether every part is in x.
    pub(crate) fn done(&self) -> bool {
        self.parts.iter().all(|(_, s)| *s == State::Done)
    }

    /// Whether it cannot finish: parts are missing and every donor has left.
    pub(crate) fn stranded(&self) -> bool {
        !self.done() && self.donors.iter().all(|s| s.gone)
    }

    /// When the earliest part asked times out, if any is asked.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (self.parts.iter())
            .filter_map(|(_, s)| match s {
                State::Asked { since, .. } => Some(*since + self.timeout),
                _ => None,
            })
            .min()
    }

    /// x (`[d]`) and what the catch-up did; only meaningful once [`CatchUp::done`].
    pub(crate) fn finish(self) -> (Vec<f32>, Summary) {
        let end = self.finished.unwrap_or(self.started);
        let summary = Summary {
            donors: self.donors,
            duplicate_bytes: self.duplicate_bytes,
            seconds: end.saturating_duration_since(self.started).as_secs_f64(),
        };
        (self.x, summary)
    }

    fn donor_index(&self, rank: Rank) -> Option<usize> {
        self.donors.iter().position(|s| s.rank == rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(2);

    /// The donors' x: donor r holds r + 1 everywhere, so each value of the result names
    /// the donor it came from.
    fn answer(c: &mut CatchUp, now: Instant, (donor, part): (Rank, Part)) {
        let values = vec![donor as f32 + 1.0; part.len as usize];
        c.on_part(now, donor, part, &values).unwrap();
    }

    #[test]
    fn every_donor_sends_about_its_share_and_x_is_whole() {
        let now = Instant::now();
        let d = 10;
        let mut c = CatchUp::new(d, &[3, 5, 7], T, now);
        let asks = c.poll(now);
        assert_eq!(
            asks.len(),
            3,
            "one part per donor (d / k rounded up = 4): {asks:?}"
        );
        let donors: Vec<Rank> = asks.iter().map(|a| a.0).collect();
        assert_eq!(donors, [3, 5, 7]);
        assert!(c.poll(now).is_empty(), "nothing more to ask");
        for a in asks {
            answer(&mut c, now, a);
        }
        assert!(c.done() && c.deadline().is_none());
        let (x, s) = c.finish();
        assert_eq!(x, [4., 4., 4., 4., 6., 6., 6., 6., 8., 8.]);
        let bytes: Vec<u64> = s.donors.iter().map(|d| d.bytes).collect();
        assert_eq!(bytes, [16, 16, 8], "no donor sends the whole of x");
        assert_eq!(s.duplicate_bytes, 0);
    }

    #[test]
    fn a_large_x_is_cut_into_bounded_parts_and_a_donor_holds_few_at_a_time() {
        let now = Instant::now();
        // Parts of at most 10 values, 2 asked of a donor at a time.
        let (part, per_donor) = (10, 2);
        let d = 5 * part + 3;
        let mut c = CatchUp::with_limits(d, &[1, 2], T, now, (part, per_donor));
        let asks = c.poll(now);
        assert_eq!(asks.len(), 2 * per_donor, "{asks:?}");
        assert!(asks.iter().all(|(_, p)| p.len as usize <= part));
        // Donor 1 answers at once and is asked the next parts; donor 2 answers none until
        // the end, and is asked no more while its slots are full.
        let (mut pending, mut slow) = (asks, Vec::new());
        while !pending.is_empty() {
            for a in pending.drain(..) {
                match a.0 {
                    1 => answer(&mut c, now, a),
                    _ => slow.push(a),
                }
            }
            pending = c.poll(now);
        }
        assert_eq!(slow.len(), per_donor);
        for a in slow {
            answer(&mut c, now, a);
        }
        assert!(c.done());
        let (x, s) = c.finish();
        assert_eq!(x.len(), d);
        assert!(x.iter().all(|&v| v == 2.0 || v == 3.0));
        assert!(s.donors[0].parts > s.donors[1].parts, "{s:?}");
        assert_eq!(s.donors[1].parts, per_donor);
        let total: u64 = s.donors.iter().map(|d| d.bytes).sum();
        assert_eq!(total, 4 * d as u64);
    }

    #[test]
    fn a_silent_donor_s_part_is_asked_of_another_after_the_time_out() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(8, &[1, 2], T, t0);
        let asks = c.poll(t0);
        answer(&mut c, t0, asks[0]);
        assert_eq!(c.deadline(), Some(t0 + T));
        assert!(c.poll(t0 + T / 2).is_empty(), "not yet");
        let retry = c.poll(t0 + T);
        assert_eq!(
            retry,
            [(1, asks[1].1)],
            "donor 2 failed it: donor 1 is asked"
        );
        answer(&mut c, t0 + T, retry[0]);
        assert!(c.done());
        // Donor 2 answers late: counted, not taken.
        answer(&mut c, t0 + T, asks[1]);
        let (x, s) = c.finish();
        assert_eq!(x, [2.0; 8]);
        assert_eq!(s.duplicate_bytes, 16);
        assert_eq!((s.donors[1].timeouts, s.donors[1].parts), (1, 0));
        assert_eq!(s.seconds, T.as_secs_f64());
    }

    #[test]
    fn a_donor_that_leaves_has_its_parts_asked_of_the_others_at_once() {
        let now = Instant::now();
        let mut c = CatchUp::new(9, &[1, 2, 3], T, now);
        let asks = c.poll(now);
        c.donor_gone(2);
        let again = c.poll(now);
        assert_eq!(again.len(), 1);
        assert_ne!(again[0].0, 2);
        assert_eq!(again[0].1, asks[1].1);
        for a in [asks[0], asks[2], again[0]] {
            answer(&mut c, now, a);
        }
        assert!(c.done());
        assert_eq!(c.live_donors().collect::<Vec<_>>(), [1, 3]);
        // Every donor gone before the end: stranded.
        let mut c = CatchUp::new(4, &[1], T, now);
        c.poll(now);
        c.donor_gone(1);
        assert!(c.stranded() && c.poll(now).is_empty());
    }

    #[test]
    fn the_only_donor_left_is_asked_again_after_its_time_out() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(4, &[1], T, t0);
        let asks = c.poll(t0);
        assert_eq!(c.poll(t0 + T), asks, "no other donor: the same one again");
    }

    #[test]
    fn parts_nobody_asked_for_or_of_the_wrong_length_are_refused() {
        let now = Instant::now();
        let mut c = CatchUp::new(4, &[1], T, now);
        let (_, p) = c.poll(now)[0];
        assert_eq!(
            c.on_part(now, 9, p, &[0.0; 4]),
            Err(PartError::NotADonor(9))
        );
        let other = Part { start: 1, len: 3 };
        assert!(matches!(
            c.on_part(now, 1, other, &[0.0; 3]),
            Err(PartError::NotAsked { start: 1, end: 4 })
        ));
        assert!(matches!(
            c.on_part(now, 1, p, &[0.0; 2]),
            Err(PartError::WrongLength { said: 4, got: 2 })
        ));
        assert!(!c.done());
    }

    #[test]
    fn a_donor_serves_only_slices_within_its_x_and_within_the_bound() {
        assert_eq!(Part { start: 2, len: 3 }.within(5), Some(2..5));
        assert_eq!(Part { start: 2, len: 4 }.within(5), None);
        assert_eq!(
            Part {
                start: u64::MAX,
                len: 2
            }
            .within(5),
            None
        );
        let big = Part {
            start: 0,
            len: PART_FLOATS as u64 + 1,
        };
        assert_eq!(big.within(usize::MAX), None);
    }
}
