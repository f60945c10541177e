//! A (re)joining peer's catch-up: its parameters x (`[d]`), its inner optimizer's state
//! (heavy ball's velocity `[d]`, AdamW's moments and step `[2d + 1]`; none for SGD without
//! momentum) and the algorithm's state that neighbours hold alike (`Gossip::catch_up_state`:
//! DiLoCo's anchor and outer velocity; none for the others) fetched in parts from several
//! donors at once, as a pure state machine (no socket, no clock of its own).
//!
//! Each vector ([`Vector`]) is cut into contiguous parts of at most [`PART_FLOATS`] values,
//! and at least one per donor, so that every donor sends about 1 / k of it (k donors)
//! instead of all of it. Each
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
//! Each part of x is one donor's x of that slice at the round it answered: the joiner
//! starts from a patchwork of its neighbours' parameters, which its first mixing rounds
//! average. A part of the optimizer's state comes from the donor's state as it was at the
//! start of one of its recent rounds (a copy it keeps while peers catch up from it), so the
//! joiner's first steps have the momentum (or Adam's moments and bias correction) of peers
//! at about its own x, not the zero state of a fresh optimizer nor the stale one of its
//! checkpoint. Hivemind's `load_state_from_peers` likewise takes the optimizer's state with
//! the parameters.
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

/// Which vector of a peer's state a part is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Vector {
    /// The parameters x: `[d]`.
    #[default]
    X,
    /// The inner optimizer's state (`Optimizer::state`): `[d]` for heavy ball, `[2d + 1]`
    /// for AdamW.
    Optimizer,
    /// The algorithm's state that neighbours hold alike (`Gossip::catch_up_state`): DiLoCo's
    /// anchor and outer velocity.
    Algorithm,
}

impl std::fmt::Display for Vector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Vector::X => "x",
            Vector::Optimizer => "the optimizer's state",
            Vector::Algorithm => "the algorithm's state",
        })
    }
}

/// The vectors of a catch-up in words, for its log lines: "x", "x and the optimizer's
/// state", "x, the optimizer's state and the algorithm's state".
pub(crate) fn listed(vectors: &[(Vector, usize)]) -> String {
    let names: Vec<String> = vectors.iter().map(|(v, _)| v.to_string()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// A slice of one vector: values `start..start + len` of `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Part {
    /// The vector.
    #[serde(default)]
    pub(crate) of: Vector,
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
    /// The vectors fetched, with their lengths, in the order asked.
    pub(crate) vectors: Vec<(Vector, usize)>,
}

/// Why a received part was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PartError {
    /// From a peer that is no donor of this catch-up.
    #[error("a part from peer {0}, which is no donor")]
    NotADonor(Rank),
    /// A slice that is none of the parts.
    #[error("a part {start}..{end} of {of} that was never asked for")]
    NotAsked { of: Vector, start: u64, end: u64 },
    /// Its values are not as many as it says.
    #[error("a part of {said} values that carries {got}")]
    WrongLength { said: u64, got: usize },
}

/// The vectors a catch-up fetched, in the order asked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fetched(Vec<(Vector, Vec<f32>)>);

impl Fetched {
    /// Vector `of`, if it was fetched.
    pub(crate) fn take(&mut self, of: Vector) -> Option<Vec<f32>> {
        let i = self.0.iter().position(|(v, _)| *v == of)?;
        Some(self.0.swap_remove(i).1)
    }
}

/// The catch-up of some vectors (x: `[d]`, the optimizer's state) from `donors`.
#[derive(Debug)]
pub(crate) struct CatchUp {
    /// Each vector being filled.
    vectors: Vec<(Vector, Vec<f32>)>,
    /// Each part and its state, by vector in order, then in order of `start`.
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
    /// A catch-up of `vectors` (each with its length; distinct) from `donors` (distinct
    /// ranks, at least one), a part taken from another donor after `timeout` without an
    /// answer; nothing asked yet (see [`CatchUp::poll`]).
    pub(crate) fn new(
        vectors: &[(Vector, usize)],
        donors: &[Rank],
        timeout: Duration,
        now: Instant,
    ) -> Self {
        Self::with_limits(
            vectors,
            donors,
            timeout,
            now,
            (PART_FLOATS, PARTS_IN_FLIGHT),
        )
    }

    /// [`CatchUp::new`] with parts of at most `part_floats` values, `per_donor` of them
    /// asked of one donor at a time.
    fn with_limits(
        vectors: &[(Vector, usize)],
        donors: &[Rank],
        timeout: Duration,
        now: Instant,
        (part_floats, per_donor): (usize, usize),
    ) -> Self {
        let k = donors.len().max(1);
        let mut parts = Vec::new();
        for &(of, d) in vectors {
            let part_len = d.div_ceil(k).clamp(1, part_floats);
            parts.extend((0..d).step_by(part_len).map(|start| {
                let len = part_len.min(d - start);
                let part = Part {
                    of,
                    start: start as u64,
                    len: len as u64,
                };
                (part, State::Waiting { avoid: None })
            }));
        }
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
        let empty = parts.is_empty();
        Self {
            vectors: (vectors.iter()).map(|&(v, d)| (v, vec![0.0; d])).collect(),
            parts,
            in_flight: vec![0; donors.len()],
            donors,
            timeout,
            per_donor,
            started: now,
            finished: empty.then_some(now),
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

    /// Takes the `values` of `part` from `from` into its vector. A part that another donor has
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
                of: part.of,
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
        let into = (self.vectors.iter_mut())
            .find(|(v, _)| *v == part.of)
            .map(|(_, x)| x)
            .expect("a part of a vector asked for");
        into[start..start + values.len()].copy_from_slice(values);
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

    /// Whether every part is in its vector.
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

    /// The vectors and what the catch-up did; only meaningful once [`CatchUp::done`].
    pub(crate) fn finish(self) -> (Fetched, Summary) {
        let end = self.finished.unwrap_or(self.started);
        let summary = Summary {
            donors: self.donors,
            duplicate_bytes: self.duplicate_bytes,
            seconds: end.saturating_duration_since(self.started).as_secs_f64(),
            vectors: self.vectors.iter().map(|(v, x)| (*v, x.len())).collect(),
        };
        (Fetched(self.vectors), summary)
    }

    fn donor_index(&self, rank: Rank) -> Option<usize> {
        self.donors.iter().position(|s| s.rank == rank)
    }
}

/// How long a donor keeps its copy of a state ([`StateCopy`]) after the last request for a
/// part of it (seconds of wall time; a request after that makes a new copy).
pub(crate) const COPY_KEPT: Duration = Duration::from_secs(10);

/// Requests for parts of the optimizer's state one peer keeps waiting for a copy of it; more
/// are refused.
const WAITING_PER_PEER: usize = PARTS_IN_FLIGHT;

/// A donor's side of the catch-ups of a state it keeps a copy of (`[s]`; one more vector's
/// memory while peers catch up from it, dropped once idle for [`COPY_KEPT`]). The
/// optimizer's state lives with the training step, outside the core, and changes every
/// step: its copy is made between two of the donor's rounds, and a request that comes
/// before it waits for it, so a part is answered at most one round late. The algorithm's
/// state (`Gossip::catch_up_state`) is the core's: its copy is made at the first request.
#[derive(Debug, Default)]
pub(crate) struct StateCopy {
    /// The copy and when a part of it was last asked for.
    copy: Option<(Vec<f32>, Instant)>,
    /// The requests (from, part) that wait for a copy.
    waiting: Vec<(Rank, Part)>,
}

/// What a donor does with a request for a part of its optimizer's state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer<'a> {
    /// These values.
    Values(&'a [f32]),
    /// Nothing yet: it waits for the copy ([`StateCopy::wanted`]).
    Waits,
    /// Refused: a slice beyond the state or above the part bound, or too many waiting.
    Refused,
}

impl StateCopy {
    /// A request from `from` for `part` (of the vector this copy is of) at `now`.
    pub(crate) fn ask(&mut self, now: Instant, from: Rank, part: Part) -> Answer<'_> {
        if part.within(usize::MAX).is_none() {
            return Answer::Refused;
        }
        match &mut self.copy {
            Some((state, asked)) => {
                *asked = now;
                match part.within(state.len()) {
                    Some(range) => Answer::Values(&state[range]),
                    None => Answer::Refused,
                }
            }
            None => {
                let theirs = self.waiting.iter().filter(|(r, _)| *r == from).count();
                if theirs >= WAITING_PER_PEER {
                    return Answer::Refused;
                }
                self.waiting.push((from, part));
                Answer::Waits
            }
        }
    }

    /// Whether requests wait for a copy of the state.
    pub(crate) fn wanted(&self) -> bool {
        self.copy.is_none() && !self.waiting.is_empty()
    }

    /// Takes the copy `state` (`[s]`) made now; returns the waiting requests, each with its
    /// values or `None` (refused: beyond the state).
    pub(crate) fn take(
        &mut self,
        now: Instant,
        state: Vec<f32>,
    ) -> Vec<(Rank, Part, Option<&[f32]>)> {
        let state = &self.copy.insert((state, now)).0;
        (self.waiting.drain(..))
            .map(|(from, part)| (from, part, part.within(state.len()).map(|r| &state[r])))
            .collect()
    }

    /// Drops the copy if no part of it was asked for in the last [`COPY_KEPT`].
    pub(crate) fn release_idle(&mut self, now: Instant) {
        if (self.copy.as_ref())
            .is_some_and(|(_, asked)| now.saturating_duration_since(*asked) >= COPY_KEPT)
        {
            self.copy = None;
        }
    }

    /// Whether it holds a copy now.
    pub(crate) fn holds(&self) -> bool {
        self.copy.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(2);

    /// x alone, `[d]`.
    fn x_of(d: usize) -> [(Vector, usize); 1] {
        [(Vector::X, d)]
    }

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
        let mut c = CatchUp::new(&x_of(d), &[3, 5, 7], T, now);
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
        let (mut fetched, s) = c.finish();
        let x = fetched.take(Vector::X).unwrap();
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
        let mut c = CatchUp::with_limits(&x_of(d), &[1, 2], T, now, (part, per_donor));
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
        let (mut fetched, s) = c.finish();
        let x = fetched.take(Vector::X).unwrap();
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
        let mut c = CatchUp::new(&x_of(8), &[1, 2], T, t0);
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
        let (mut fetched, s) = c.finish();
        let x = fetched.take(Vector::X).unwrap();
        assert_eq!(x, [2.0; 8]);
        assert_eq!(s.duplicate_bytes, 16);
        assert_eq!((s.donors[1].timeouts, s.donors[1].parts), (1, 0));
        assert_eq!(s.seconds, T.as_secs_f64());
    }

    #[test]
    fn a_donor_that_leaves_has_its_parts_asked_of_the_others_at_once() {
        let now = Instant::now();
        let mut c = CatchUp::new(&x_of(9), &[1, 2, 3], T, now);
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
        let mut c = CatchUp::new(&x_of(4), &[1], T, now);
        c.poll(now);
        c.donor_gone(1);
        assert!(c.stranded() && c.poll(now).is_empty());
    }

    #[test]
    fn the_only_donor_left_is_asked_again_after_its_time_out() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(&x_of(4), &[1], T, t0);
        let asks = c.poll(t0);
        assert_eq!(c.poll(t0 + T), asks, "no other donor: the same one again");
    }

    #[test]
    fn parts_nobody_asked_for_or_of_the_wrong_length_are_refused() {
        let now = Instant::now();
        let mut c = CatchUp::new(&x_of(4), &[1], T, now);
        let (_, p) = c.poll(now)[0];
        assert_eq!(
            c.on_part(now, 9, p, &[0.0; 4]),
            Err(PartError::NotADonor(9))
        );
        let other = Part {
            of: Vector::X,
            start: 1,
            len: 3,
        };
        assert!(matches!(
            c.on_part(now, 1, other, &[0.0; 3]),
            Err(PartError::NotAsked {
                start: 1,
                end: 4,
                ..
            })
        ));
        let of_the_optimizer = Part {
            of: Vector::Optimizer,
            ..p
        };
        assert!(
            matches!(
                c.on_part(now, 1, of_the_optimizer, &[0.0; 4]),
                Err(PartError::NotAsked {
                    of: Vector::Optimizer,
                    ..
                })
            ),
            "the same slice of another vector is not the part asked"
        );
        assert!(matches!(
            c.on_part(now, 1, p, &[0.0; 2]),
            Err(PartError::WrongLength { said: 4, got: 2 })
        ));
        assert!(!c.done());
    }

    #[test]
    fn a_donor_serves_only_slices_within_its_x_and_within_the_bound() {
        let part = |start, len| Part {
            of: Vector::X,
            start,
            len,
        };
        assert_eq!(part(2, 3).within(5), Some(2..5));
        assert_eq!(part(2, 4).within(5), None);
        assert_eq!(part(u64::MAX, 2).within(5), None);
        let big = part(0, PART_FLOATS as u64 + 1);
        assert_eq!(big.within(usize::MAX), None);
    }

    #[test]
    fn x_and_the_optimizer_s_state_are_each_shared_among_the_donors() {
        let now = Instant::now();
        // Heavy ball: a velocity as long as x; AdamW's state would be 2d + 1.
        let (d, s) = (6, 13);
        let vectors = [(Vector::X, d), (Vector::Optimizer, s)];
        let mut c = CatchUp::new(&vectors, &[1, 2], T, now);
        let asks = c.poll(now);
        let of = |v: Vector| asks.iter().filter(move |(_, p)| p.of == v);
        assert_eq!(of(Vector::X).count(), 2, "{asks:?}");
        assert_eq!(of(Vector::Optimizer).count(), 2, "{asks:?}");
        for v in [Vector::X, Vector::Optimizer] {
            let donors: Vec<Rank> = of(v).map(|a| a.0).collect();
            assert_eq!(donors, [1, 2], "each donor sends half of {v}");
        }
        for &(donor, part) in &asks {
            // Donor r's x holds r + 1, its optimizer state 10 (r + 1).
            let k = if part.of == Vector::X { 1.0 } else { 10.0 };
            let values = vec![k * (donor as f32 + 1.0); part.len as usize];
            c.on_part(now, donor, part, &values).unwrap();
        }
        assert!(c.done());
        let (mut fetched, summary) = c.finish();
        assert_eq!(fetched.take(Vector::X).unwrap(), [2., 2., 2., 3., 3., 3.]);
        let state = fetched.take(Vector::Optimizer).unwrap();
        assert_eq!(state.len(), s);
        assert_eq!(&state[..7], &[20.0; 7]);
        assert_eq!(&state[7..], &[30.0; 6]);
        let bytes: Vec<u64> = summary.donors.iter().map(|d| d.bytes).collect();
        assert_eq!(bytes, [4 * (3 + 7), 4 * (3 + 6)]);
        // Nothing to fetch: done at once.
        let c = CatchUp::new(&[(Vector::X, 0)], &[1], T, now);
        assert!(c.done());
    }

    #[test]
    fn a_donor_answers_parts_of_its_optimizer_state_from_a_copy_made_between_rounds() {
        let t0 = Instant::now();
        let part = |start, len| Part {
            of: Vector::Optimizer,
            start,
            len,
        };
        let mut d = StateCopy::default();
        assert!(!d.wanted());
        // Before any copy: requests wait, a peer's beyond the bound are refused.
        assert_eq!(d.ask(t0, 3, part(0, 2)), Answer::Waits);
        assert_eq!(d.ask(t0, 3, part(4, 9)), Answer::Waits);
        for i in 0..WAITING_PER_PEER {
            assert_eq!(d.ask(t0, 5, part(i as u64, 1)), Answer::Waits);
        }
        assert_eq!(
            d.ask(t0, 5, part(0, 1)),
            Answer::Refused,
            "too many waiting"
        );
        assert_eq!(
            d.ask(t0, 3, part(0, PART_FLOATS as u64 + 1)),
            Answer::Refused
        );
        assert!(d.wanted() && !d.holds());
        let state: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let answers = d.take(t0, state);
        assert_eq!(answers.len(), WAITING_PER_PEER + 2);
        assert_eq!(answers[0], (3, part(0, 2), Some(&[0.0, 1.0][..])));
        assert_eq!(answers[1], (3, part(4, 9), None), "beyond the state");
        assert!(!d.wanted() && d.holds());
        // From the copy at once, until it is idle for COPY_KEPT.
        let t1 = t0 + COPY_KEPT / 2;
        assert_eq!(d.ask(t1, 3, part(4, 2)), Answer::Values(&[4.0, 5.0]));
        assert_eq!(d.ask(t1, 3, part(5, 2)), Answer::Refused);
        d.release_idle(t1 + COPY_KEPT / 2);
        assert!(d.holds(), "asked {:?} ago", COPY_KEPT / 2);
        d.release_idle(t1 + COPY_KEPT);
        assert!(!d.holds());
        assert_eq!(d.ask(t1 + COPY_KEPT, 3, part(0, 1)), Answer::Waits);
    }
}
