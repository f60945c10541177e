//! Round bookkeeping shared by the synchronous algorithms ([`crate::DPsgd`], [`crate::Choco`]):
//! each round a peer sends one frame to every out-neighbour and waits for one frame from
//! every in-neighbour.
//!
//! [`Exchange`] owns everything that does not depend on what the payload means: the
//! outgoing frame and its fan-out, header checks (kind, sender, neighbourhood, dimension,
//! round window), duplicates, frames that arrive for a later round (validated on arrival,
//! buffered, handed back when that round begins), the round deadline, the straggler
//! policy's bookkeeping ([`SkipMode`]: frames dropped by both ends with a notice for
//! D-PSGD, late frames absorbed when they come for CHOCO), events and traffic counters. The
//! algorithm owns the arithmetic: it absorbs the payloads that [`Exchange`] hands it and
//! decides what completing a round means.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use murmur_topology::MixingMatrix;

use bytes::Bytes;

use crate::frame::{reuse, FrameHeader, FrameKind, FRAME_HEADER_LEN};
use crate::{GossipError, GossipEvent, GossipStats, Rank, Transmit};

/// The [`crate::Gossip`] methods that every exchange-driven algorithm implements the same
/// way: frames go through [`Exchange::check`], the algorithm's `absorb(idx, payload)` mixes
/// an accepted payload, `skip(action)` carries out the straggler policy ([`SkipAction`]),
/// `finish_if_complete()` ends the round; transmit, timeouts, events,
/// the round, the counters and the neighbour sets are the exchange's, and the epoch goes to
/// `compressor`.
/// Expanded inside `impl Gossip for …` of a type with fields `ex` and `compressor`.
macro_rules! exchange_driven_gossip {
    () => {
        fn handle_message(
            &mut self,
            now: std::time::Instant,
            from: $crate::Rank,
            frame: &[u8],
        ) -> Result<(), $crate::GossipError> {
            match self.ex.check(now, from, frame)? {
                $crate::mixing::exchange::Arrival::Current { idx, payload } => {
                    self.absorb(idx, payload)?;
                    self.ex.keep(idx, payload);
                    self.ex.accept(now, idx, frame.len());
                }
                $crate::mixing::exchange::Arrival::Buffered => {}
                $crate::mixing::exchange::Arrival::Skip(action) => self.skip(action)?,
            }
            self.finish_if_complete();
            Ok(())
        }

        fn handle_timeout(&mut self, now: std::time::Instant) {
            for idx in self.ex.handle_timeout(now) {
                self.skip($crate::mixing::exchange::SkipAction::StandIn(idx))
                    .expect("standing in cannot fail");
            }
            self.finish_if_complete();
        }

        fn poll_transmit(&mut self) -> Option<$crate::Transmit> {
            self.ex.poll_transmit()
        }

        fn poll_timeout(&self) -> Option<std::time::Instant> {
            self.ex.poll_timeout()
        }

        fn poll_event(&mut self) -> Option<$crate::GossipEvent> {
            self.ex.poll_event()
        }

        fn round(&self) -> u64 {
            self.ex.round()
        }

        fn stats(&self) -> $crate::GossipStats {
            self.ex.stats()
        }

        fn set_epoch(&mut self, epoch: usize) {
            self.compressor.set_epoch(epoch);
        }

        fn out_peers(&self) -> Vec<$crate::Rank> {
            self.ex.out_peers()
        }

        fn in_peers(&self) -> Vec<$crate::Rank> {
            self.ex.in_peers()
        }
    };
}
pub(crate) use exchange_driven_gossip;

/// Largest graph distance from `rank` to one of its in-neighbours along the direction in
/// which frames travel (j → i when W_ij ≠ 0); n if some in-neighbour is unreachable.
pub(crate) fn max_lead(w: &MixingMatrix, rank: Rank) -> u64 {
    let n = w.n();
    let mut dist = vec![usize::MAX; n];
    let mut queue = VecDeque::from([rank]);
    dist[rank] = 0;
    while let Some(a) = queue.pop_front() {
        for b in w.out_neighbors(a) {
            if dist[b] == usize::MAX {
                dist[b] = dist[a] + 1;
                queue.push_back(b);
            }
        }
    }
    w.in_weights(rank)
        .iter()
        .map(|&(j, _)| if dist[j] == usize::MAX { n } else { dist[j] })
        .max()
        .unwrap_or(1) as u64
}

/// `accept_from` / `send_from` of a peer that left: never.
const LEFT: u64 = u64::MAX;

/// Static parameters of an [`Exchange`].
pub(crate) struct ExchangeParams {
    /// This peer's rank.
    pub rank: Rank,
    /// In-neighbours j ≠ i, in the order the algorithm indexes them.
    pub in_neighbors: Vec<Rank>,
    /// Out-neighbours j ≠ i: who receives this peer's frame.
    pub out_neighbors: Vec<Rank>,
    /// Model dimension d.
    pub d: usize,
    /// How long a round may wait for its frames.
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
    /// How many rounds an in-neighbour may be ahead (treated as at least 1).
    pub max_lead_rounds: u64,
    /// Straggler policy "skip": how long a round waits for a neighbour before mixing without
    /// it (`None`: wait, up to `round_timeout`). With [`SkipMode::Drop`] it needs an
    /// undirected graph (the notice goes back to the skipped neighbour).
    pub skip_after: Option<Duration>,
    /// With the skip policy: per-neighbour deadlines from that neighbour's observed arrival
    /// times instead of `skip_after` for all (which is then the ceiling).
    pub auto_deadline: Option<AutoDeadline>,
    /// What becomes of a frame a round did not wait for.
    pub skip_mode: SkipMode,
    /// The part of a streamed message this exchange carries ([`crate::mixing::streaming`]):
    /// its frames are [`FrameKind::GossipPart`] with this index and count, `d` is the
    /// part's length. `None`: whole messages, [`FrameKind::Gossip`].
    pub part: Option<Part>,
}

/// Which part of a message cut into `count` contiguous parts an [`Exchange`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    /// 0-based index.
    pub index: u32,
    /// Number of parts.
    pub count: u32,
}

/// Bytes of the part prefix of a [`FrameKind::GossipPart`] payload: index, count (u32 LE).
pub(crate) const PART_PREFIX_LEN: usize = 8;

impl Part {
    /// The part a [`FrameKind::GossipPart`] payload names in its prefix (`None` if it is
    /// shorter than the prefix).
    pub(crate) fn of_payload(payload: &[u8]) -> Option<Part> {
        let word = |i: usize| {
            let b = payload.get(i..i + 4)?;
            Some(u32::from_le_bytes(b.try_into().ok()?))
        };
        Some(Part {
            index: word(0)?,
            count: word(4)?,
        })
    }
}

/// Adaptive straggler deadlines (`--straggler-deadline-ms auto`): each in-neighbour j gets,
/// every round, the deadline
///
/// ```text
/// D_j = clamp(factor · q-quantile of j's last `window` arrival delays, floor, ceiling)
/// ```
///
/// where an arrival delay is the time from this peer's start of a round to j's frame of
/// that round (0 for a frame that came before the round began; a frame that came after
/// its round was mixed without it is measured too, so a neighbour that became slower for
/// good is waited for again). Until j has `warmup` delays its deadline is the ceiling. A
/// slow but steady link is thus waited for (its quantile is high), and a neighbour that
/// stalls far beyond its own history is skipped — the per-neighbour deadline asked for in
/// Hivemind #676; the quantile rule is the usual one for timeouts (as TCP's RTO is a
/// high percentile of the RTT distribution, RFC 6298 in spirit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoDeadline {
    /// The quantile q of the delays, in (0, 1].
    pub quantile: f64,
    /// The multiple of that quantile, ≥ 1.
    pub factor: f64,
    /// The shortest deadline.
    pub floor: Duration,
    /// The longest deadline (a neighbour later than this is skipped whatever its history).
    pub ceiling: Duration,
    /// Delays remembered per neighbour.
    pub window: usize,
    /// Delays needed before the quantile is used.
    pub warmup: usize,
}

impl AutoDeadline {
    /// q = 0.5 (the median: robust to the stalls it is meant to skip, as long as they are
    /// fewer than half of the recent rounds), factor 3, floor 5 ms, the last 32 delays,
    /// from the 4th on; `ceiling` the longest wait.
    pub fn with_ceiling(ceiling: Duration) -> Self {
        Self {
            quantile: 0.5,
            factor: 3.0,
            floor: Duration::from_millis(5),
            ceiling,
            window: 32,
            warmup: 4,
        }
    }

    /// The deadline after a round's start for a neighbour with these recent `delays`
    /// (seconds, oldest first).
    pub fn deadline(&self, delays: &VecDeque<f64>) -> Duration {
        if delays.len() < self.warmup.max(1) {
            return self.ceiling;
        }
        let mut d: Vec<f64> = delays.iter().copied().collect();
        d.sort_by(f64::total_cmp);
        let k = ((self.quantile * d.len() as f64).ceil() as usize).clamp(1, d.len()) - 1;
        let secs = self.factor * d[k];
        Duration::from_secs_f64(secs.clamp(self.floor.as_secs_f64(), self.ceiling.as_secs_f64()))
    }
}

/// What the skip policy does with a frame that missed its round's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SkipMode {
    /// Both ends drop it: a notice goes back to the sender, which drops this peer's frame
    /// of that round too ([`crate::DPsgd`]).
    Drop,
    /// It is late, not dropped: accepted for up to [`crate::SKIP_STALENESS`] rounds after
    /// its round and handed to the algorithm as [`SkipAction::Late`]; a round waits for the
    /// late frames that many rounds old. No notice ([`crate::Choco`]).
    Late,
}

/// Rounds of history kept for late straggler notices (own x, neighbours' payloads).
pub(crate) const SKIP_HISTORY: u64 = 8;
/// Rounds for which the skipped (round, neighbour) pairs are remembered (a few bytes each):
/// a notice about an older round that this peer had skipped itself needs nothing.
const SKIPPED_MEMORY: u64 = 4096;
/// How far ahead a straggler notice may be (a slow peer's neighbours run ahead of it).
const SKIP_AHEAD: u64 = 1 << 20;

/// What a straggler notice asks of the algorithm.
pub(crate) enum SkipAction {
    /// Nothing (the pair already dropped each other, or the round has not begun here and
    /// the frame will be dropped then).
    Nothing,
    /// The mixing round still waits for neighbour `idx`: stand in for it now.
    StandIn(usize),
    /// Neighbour `idx`'s frame of `round` was already mixed in: take it out again, adding
    /// w (x_self(round) − x_idx(round)); `payload` is that frame's message.
    Correct {
        /// Neighbour index.
        idx: usize,
        /// The round.
        round: u64,
        /// Its message of that round.
        payload: Vec<u8>,
    },
    /// [`SkipMode::Late`]: neighbour `idx`'s frame of `round`, which rounds `round` ..
    /// `stale_mixes` later completed without, has come (validated); the algorithm absorbs
    /// it now and makes up for the `stale_mixes` mixes that went without it.
    Late {
        /// Neighbour index.
        idx: usize,
        /// Mixes completed without it (the current round − its round).
        stale_mixes: u64,
        /// Its message.
        payload: Vec<u8>,
    },
}

/// Where an accepted frame goes.
pub(crate) enum Arrival<'f> {
    /// A frame for the round that is mixing: the algorithm must absorb `payload` (a
    /// `murmur_compress` message, not yet validated) and then call [`Exchange::accept`].
    Current {
        /// Index of the sender in `in_neighbors`.
        idx: usize,
        /// The frame's payload.
        payload: &'f [u8],
    },
    /// A frame for a later round: validated, buffered and counted; nothing else to do.
    Buffered,
    /// A straggler notice.
    Skip(SkipAction),
}

/// The per-round frame exchange of one peer (see the [module docs](self)).
pub(crate) struct Exchange {
    p: ExchangeParams,
    /// Next round to begin, or the round that is mixing.
    round: u64,
    mixing: bool,
    deadline: Option<Instant>,
    /// In-neighbours (index into `in_neighbors`) still missing for the mixing round.
    missing: Vec<bool>,
    /// Per in-neighbour (index into `in_neighbors`): the first round whose frame is waited
    /// for and accepted; earlier ones are refused. 0 normally, [`LEFT`] after the peer left,
    /// the round of its return once a rejoin is scheduled.
    accept_from: Vec<u64>,
    /// Per out-neighbour (index into `out_neighbors`): the first round it is sent a frame.
    send_from: Vec<u64>,
    missing_count: usize,
    /// Validated payloads for rounds not yet begun, by (round, neighbour index).
    early: BTreeMap<(u64, usize), Vec<u8>>,
    /// Buffers of early payloads already absorbed ([`Exchange::recycle`]), for the next
    /// ones: a large model's parts arrive early every round, and a fresh buffer costs its
    /// page faults each time.
    spare: Vec<Vec<u8>>,
    /// This round's frame (header + message), shared by every out-neighbour.
    outgoing: Bytes,
    /// With [`Exchange::begin_per_link`]: this round's frame for each out-neighbour (index
    /// into `out_neighbors`) instead of `outgoing`; empty otherwise.
    per_link: Vec<Bytes>,
    next_out: usize,
    events: VecDeque<GossipEvent>,
    stats: GossipStats,
    /// With the skip policy: when the mixing round stops waiting.
    skip_deadline: Option<Instant>,
    /// (round, neighbour index) pairs mixed without each other: that neighbour's frame of
    /// that round is dropped (the last `SKIPPED_MEMORY` rounds, and rounds not begun yet).
    skipped: BTreeSet<(u64, usize)>,
    /// With the skip policy: the neighbours' messages of the last [`SKIP_HISTORY`] rounds.
    kept: BTreeMap<(u64, usize), Vec<u8>>,
    /// Straggler notices to send: (destination, frame).
    notices: VecDeque<(Rank, Vec<u8>)>,
    /// [`SkipMode::Late`]: (round, neighbour index) frames a round completed without that
    /// have not come yet.
    late: BTreeSet<(u64, usize)>,
    /// With [`ExchangeParams::auto_deadline`]: when the recent rounds began (round, time),
    /// each neighbour's recent arrival delays (seconds), and its deadline this round.
    began: VecDeque<(u64, Instant)>,
    delays: Vec<VecDeque<f64>>,
    own_deadline: Vec<Option<Instant>>,
}

/// What [`Exchange::begin`] hands the algorithm.
pub(crate) struct Begun {
    /// Validated payloads that arrived early for this round: (neighbour index, payload).
    pub early: Vec<(usize, Vec<u8>)>,
    /// Neighbours this round mixes without (their straggler notice came first): stand in.
    pub stand_in: Vec<usize>,
}

impl Exchange {
    pub(crate) fn new(p: ExchangeParams) -> Self {
        let k = p.in_neighbors.len();
        let next_out = p.out_neighbors.len();
        Exchange {
            p,
            round: 0,
            mixing: false,
            deadline: None,
            missing: vec![false; k],
            accept_from: vec![0; k],
            send_from: vec![0; next_out],
            missing_count: 0,
            early: BTreeMap::new(),
            spare: Vec::new(),
            outgoing: Bytes::new(),
            per_link: Vec::new(),
            next_out,
            events: VecDeque::new(),
            stats: GossipStats::default(),
            skip_deadline: None,
            skipped: BTreeSet::new(),
            kept: BTreeMap::new(),
            notices: VecDeque::new(),
            late: BTreeSet::new(),
            began: VecDeque::new(),
            delays: vec![VecDeque::new(); k],
            own_deadline: vec![None; k],
        }
    }

    /// Records that neighbour `idx`'s frame of round `round` arrived at `now` (adaptive
    /// deadlines only).
    fn record_arrival(&mut self, now: Instant, round: u64, idx: usize) {
        let Some(auto) = self.p.auto_deadline else {
            return;
        };
        let Some(&(_, at)) = self.began.iter().find(|(r, _)| *r == round) else {
            return;
        };
        self.push_delay(auto, idx, now.saturating_duration_since(at).as_secs_f64());
    }

    /// Remembers one arrival delay (seconds) of in-neighbour `idx`, the last `window` only.
    fn push_delay(&mut self, auto: AutoDeadline, idx: usize, secs: f64) {
        let delays = &mut self.delays[idx];
        delays.push_back(secs);
        while delays.len() > auto.window.max(1) {
            delays.pop_front();
        }
    }

    /// Panics if a round is mixing (a driver bug: `begin_round` before `Mixed`).
    pub(crate) fn assert_idle(&self) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
    }

    /// Starts the next round. `encode` appends this round's `murmur_compress` message to
    /// the buffer it is given and returns its length; every out-neighbour gets the same
    /// frame. Returns the payloads that arrived early for this round, already validated (the
    /// caller absorbs each and calls [`Exchange::absorbed_early`]), and the neighbours to
    /// stand in for (already marked received).
    pub(crate) fn begin(
        &mut self,
        now: Instant,
        encode: impl FnOnce(&mut Vec<u8>) -> usize,
    ) -> Begun {
        self.assert_idle();
        let buf = reuse(std::mem::take(&mut self.outgoing));
        self.outgoing = self.frame(buf, encode);
        self.per_link.clear();
        self.start(now)
    }

    /// [`Exchange::begin`] with one message per out-neighbour: `encode(k, out)` appends the
    /// message for out-neighbour `out_neighbors[k]` and returns its length.
    pub(crate) fn begin_per_link(
        &mut self,
        now: Instant,
        mut encode: impl FnMut(usize, &mut Vec<u8>) -> usize,
    ) -> Begun {
        self.assert_idle();
        let mut old = std::mem::take(&mut self.per_link).into_iter();
        self.per_link = (0..self.p.out_neighbors.len())
            .map(|k| {
                let buf = old.next().map(reuse).unwrap_or_default();
                self.frame(buf, |out| encode(k, out))
            })
            .collect();
        self.outgoing = Bytes::new();
        self.start(now)
    }

    /// A gossip frame of this round: header, the part prefix of a part, then the message
    /// `encode` appends to `out`.
    fn frame(&self, mut out: Vec<u8>, encode: impl FnOnce(&mut Vec<u8>) -> usize) -> Bytes {
        out.clear();
        out.resize(FRAME_HEADER_LEN, 0);
        let kind = match self.p.part {
            Some(part) => {
                out.extend_from_slice(&part.index.to_le_bytes());
                out.extend_from_slice(&part.count.to_le_bytes());
                FrameKind::GossipPart
            }
            None => FrameKind::Gossip,
        };
        let payload_len = out.len() - FRAME_HEADER_LEN + encode(&mut out);
        debug_assert_eq!(payload_len, out.len() - FRAME_HEADER_LEN);
        let header = FrameHeader {
            kind,
            sender: self.p.rank,
            round: self.round,
            dim: self.p.d as u32,
            payload_len: payload_len as u32,
        };
        out[..FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
        Bytes::from(out)
    }

    /// The bookkeeping of a round that begins at `now`, its frames made.
    fn start(&mut self, now: Instant) -> Begun {
        self.next_out = 0;

        self.mixing = true;
        self.deadline = Some(now + self.p.round_timeout);
        for (m, &from) in self.missing.iter_mut().zip(&self.accept_from) {
            *m = self.round >= from;
        }
        let round = self.round;
        let stand_in: Vec<usize> = (0..self.missing.len())
            .filter(|&idx| self.missing[idx] && self.skipped.contains(&(round, idx)))
            .collect();
        for &idx in &stand_in {
            self.missing[idx] = false;
        }
        self.missing_count = self.missing.iter().filter(|&&m| m).count();
        self.skip_deadline = self.p.skip_after.map(|d| now + d);
        if let Some(auto) = self.p.auto_deadline {
            self.began.push_back((round, now));
            while self.began.len() as u64 > SKIP_HISTORY.max(8) {
                self.began.pop_front();
            }
            // Frames that came before the round began: no delay.
            let early: Vec<usize> = self
                .early
                .range((round, 0)..(round + 1, 0))
                .map(|(&(_, idx), _)| idx)
                .collect();
            for idx in early {
                self.push_delay(auto, idx, 0.0);
            }
            for idx in 0..self.missing.len() {
                self.own_deadline[idx] = (self.missing[idx]
                    && !self.early.contains_key(&(round, idx)))
                .then(|| now + auto.deadline(&self.delays[idx]));
            }
            self.skip_deadline = self.own_deadline.iter().flatten().min().copied();
        }
        let keep_from = round.saturating_sub(SKIP_HISTORY);
        self.kept.retain(|&(r, _), _| r >= keep_from);
        let remember_from = round.saturating_sub(SKIPPED_MEMORY);
        self.skipped.retain(|&(r, _)| r >= remember_from);
        let later = self.early.split_off(&(round + 1, 0));
        let early = std::mem::replace(&mut self.early, later)
            .into_iter()
            .map(|((_, idx), payload)| (idx, payload))
            .collect();
        Begun { early, stand_in }
    }

    /// This round's outgoing message (the frame without its header and part prefix).
    pub(crate) fn message(&self) -> &[u8] {
        let prefix = if self.p.part.is_some() {
            PART_PREFIX_LEN
        } else {
            0
        };
        &self.outgoing[(FRAME_HEADER_LEN + prefix).min(self.outgoing.len())..]
    }

    /// The `murmur_compress` message of `payload`, a [`FrameKind::GossipPart`] payload
    /// checked to be this exchange's part, or a whole message's payload.
    fn part_message<'f>(&self, from: Rank, payload: &'f [u8]) -> Result<&'f [u8], GossipError> {
        let Some(part) = self.p.part else {
            return Ok(payload);
        };
        match Part::of_payload(payload) {
            Some(got) if got == part => Ok(&payload[PART_PREFIX_LEN..]),
            got => Err(GossipError::WrongPart {
                from,
                part: part.index,
                parts: part.count,
                got_part: got.map_or(u32::MAX, |g| g.index),
                got_parts: got.map_or(0, |g| g.count),
            }),
        }
    }

    /// Checks an incoming frame's header against this peer's neighbourhood, dimension and
    /// round window. A frame for a later round is validated in full, buffered and counted
    /// here; a frame for the mixing round is returned for the caller to absorb. On `Err`
    /// nothing changed.
    pub(crate) fn check<'f>(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &'f [u8],
    ) -> Result<Arrival<'f>, GossipError> {
        if self.p.skip_after.is_some()
            && self.p.skip_mode == SkipMode::Drop
            && FrameHeader::parse(frame, self.p.max_payload_bytes)?.0.kind == FrameKind::Skip
        {
            let (h, _) =
                crate::parse_frame(frame, self.p.max_payload_bytes, FrameKind::Skip, from)?;
            return self.on_skip_notice(from, h.round).map(Arrival::Skip);
        }
        let kind = if self.p.part.is_some() {
            FrameKind::GossipPart
        } else {
            FrameKind::Gossip
        };
        let (h, payload) = crate::parse_frame(frame, self.p.max_payload_bytes, kind, from)?;
        let payload = self.part_message(from, payload)?;
        let idx = self
            .p
            .in_neighbors
            .iter()
            .position(|&j| j == from)
            .ok_or(GossipError::NotANeighbour(from))?;
        let d = self.p.d;
        if h.dim as usize != d {
            return Err(GossipError::DimensionMismatch {
                from,
                expected: d,
                got: h.dim as usize,
            });
        }
        // A neighbour can be up to `max_lead_rounds` ahead of the round we mix (one less
        // while we are idle between rounds); see `DPsgdConfig::max_lead_rounds`.
        if h.round < self.accept_from[idx] {
            return Err(GossipError::Departed(from));
        }
        if self.late.contains(&(h.round, idx)) {
            murmur_compress::validate(payload, d).map_err(|source| GossipError::Payload {
                from,
                cause: source,
            })?;
            self.record_arrival(now, h.round, idx);
            self.late.remove(&(h.round, idx));
            self.count_received(frame.len());
            return Ok(Arrival::Skip(SkipAction::Late {
                idx,
                stale_mixes: self.round - h.round,
                payload: payload.to_vec(),
            }));
        }
        if self.skipped.contains(&(h.round, idx)) {
            // Late: how late still tells the adaptive deadline about this neighbour.
            self.record_arrival(now, h.round, idx);
            return Err(GossipError::Skipped {
                from,
                round: h.round,
            });
        }
        let lo = self.round;
        let hi = self.round + self.p.max_lead_rounds.max(1) - u64::from(!self.mixing);
        // Under the skip policy a round outside the window is one the pair mixes without
        // each other: a past round completed without this frame (only a skip does that),
        // or a round of a neighbour that runs ahead of this slow peer (it skips us there).
        if self.p.skip_after.is_some()
            && self.p.skip_mode == SkipMode::Drop
            && (h.round < lo || h.round > hi)
        {
            return Err(GossipError::Skipped {
                from,
                round: h.round,
            });
        }
        if h.round < lo || h.round > hi {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo,
                hi,
            });
        }
        if self.mixing && h.round == self.round {
            if !self.missing[idx] {
                return Err(GossipError::Duplicate {
                    from,
                    round: h.round,
                });
            }
            return Ok(Arrival::Current { idx, payload });
        }
        if self.early.contains_key(&(h.round, idx)) {
            return Err(GossipError::Duplicate {
                from,
                round: h.round,
            });
        }
        // Validate now so that a bad frame is refused on arrival, not when absorbed.
        murmur_compress::validate(payload, d).map_err(|source| GossipError::Payload {
            from,
            cause: source,
        })?;
        let mut copy = self.spare.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(payload);
        self.early.insert((h.round, idx), copy);
        self.count_received(frame.len());
        Ok(Arrival::Buffered)
    }

    /// Records that the mixing round's frame (of `frame_len` bytes) from in-neighbour `idx`
    /// was absorbed.
    pub(crate) fn accept(&mut self, now: Instant, idx: usize, frame_len: usize) {
        self.record_arrival(now, self.round, idx);
        self.absorbed_early(idx);
        self.count_received(frame_len);
    }

    /// Records that the missing contribution of departed in-neighbour `idx` was stood in
    /// for (nothing was received).
    pub(crate) fn stood_in(&mut self, idx: usize) {
        self.absorbed_early(idx);
    }

    /// With the skip policy, keeps neighbour `idx`'s message of the mixing round (absorbed
    /// now or early) for a straggler notice that may come later.
    pub(crate) fn keep(&mut self, idx: usize, payload: &[u8]) {
        if self.p.skip_after.is_some() {
            self.kept.insert((self.round, idx), payload.to_vec());
        }
    }

    /// A straggler notice from `from`: it mixed `round` without our frame, so we drop its
    /// frame of that round as well (see [`SkipAction`]).
    fn on_skip_notice(&mut self, from: Rank, round: u64) -> Result<SkipAction, GossipError> {
        let idx = self
            .p
            .in_neighbors
            .iter()
            .position(|&j| j == from)
            .ok_or(GossipError::NotANeighbour(from))?;
        if round < self.accept_from[idx] {
            return Err(GossipError::Departed(from));
        }
        if round > self.round + SKIP_AHEAD {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round,
                lo: self.round.saturating_sub(SKIPPED_MEMORY),
                hi: self.round + SKIP_AHEAD,
            });
        }
        if !self.skipped.insert((round, idx)) {
            return Ok(SkipAction::Nothing); // we had dropped it already
        }
        self.stats.skipped += 1;
        if round > self.round || round == self.round && !self.mixing {
            // Not begun here: its frame (buffered or still coming) will be dropped.
            if self.early.remove(&(round, idx)).is_some() {
                self.stats.frames_received -= 1;
            }
            return Ok(SkipAction::Nothing);
        }
        if round == self.round && self.missing[idx] {
            self.missing[idx] = false;
            self.missing_count -= 1;
            return Ok(SkipAction::StandIn(idx));
        }
        match self.kept.get(&(round, idx)) {
            Some(payload) => Ok(SkipAction::Correct {
                idx,
                round,
                payload: payload.clone(),
            }),
            None => Err(GossipError::SkipTooOld { from, round }),
        }
    }

    /// Takes back the buffer of an early payload handed out by [`Exchange::begin`] once it
    /// is absorbed, for the next early payload (at most as many as neighbours are kept).
    pub(crate) fn recycle(&mut self, payload: Vec<u8>) {
        if self.spare.len() < self.p.in_neighbors.len() {
            self.spare.push(payload);
        }
    }

    /// Records that an early payload handed out by [`Exchange::begin`] was absorbed.
    pub(crate) fn absorbed_early(&mut self, idx: usize) {
        if std::mem::replace(&mut self.missing[idx], false) {
            self.missing_count -= 1;
        }
    }

    fn count_received(&mut self, frame_len: usize) {
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame_len as u64;
    }

    /// Whether the mixing round has every in-neighbour's frame.
    pub(crate) fn is_complete(&self) -> bool {
        self.mixing && self.missing_count == 0 && self.stale_late().is_empty()
    }

    /// [`SkipMode::Late`]: the neighbours (indices) whose late frame is
    /// [`crate::SKIP_STALENESS`] rounds old or more, which the mixing round waits for.
    fn stale_late(&self) -> Vec<usize> {
        let Some(bound) = self.round.checked_sub(crate::SKIP_STALENESS) else {
            return Vec::new();
        };
        self.late
            .range(..=(bound, usize::MAX))
            .map(|&(_, idx)| idx)
            .collect()
    }

    /// Ends the mixing round: emits [`GossipEvent::Mixed`] and moves to the next round.
    pub(crate) fn finish(&mut self) {
        debug_assert!(self.is_complete());
        self.mixing = false;
        self.deadline = None;
        self.events
            .push_back(GossipEvent::Mixed { round: self.round });
        self.round += 1;
    }

    /// Tells the exchange the time. Returns the in-neighbours (indices) that the straggler
    /// policy drops from the mixing round now (its skip deadline passed): the caller stands
    /// in for each; their notices are queued.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Vec<usize> {
        let mut dropped = Vec::new();
        if let Some(at) = self.skip_deadline.filter(|&at| self.mixing && now >= at) {
            let _ = at;
            self.skip_deadline = None;
            let round = self.round;
            let auto = self.p.auto_deadline.is_some();
            for idx in 0..self.missing.len() {
                if !self.missing[idx] {
                    continue;
                }
                // Adaptive: only the neighbours whose own deadline has passed.
                if auto && self.own_deadline[idx].is_some_and(|d| now < d) {
                    continue;
                }
                self.missing[idx] = false;
                self.missing_count -= 1;
                self.stats.skipped += 1;
                if self.p.skip_mode == SkipMode::Late {
                    // The algorithm mixes its stale copy; the frame is absorbed when it comes.
                    self.late.insert((round, idx));
                    continue;
                }
                self.skipped.insert((round, idx));
                let to = self.p.in_neighbors[idx];
                let mut notice = Vec::with_capacity(FRAME_HEADER_LEN);
                FrameHeader {
                    kind: FrameKind::Skip,
                    sender: self.p.rank,
                    round,
                    dim: self.p.d as u32,
                    payload_len: 0,
                }
                .emit(&mut notice);
                self.notices.push_back((to, notice));
                dropped.push(idx);
            }
            if auto {
                // The next neighbour deadline still ahead.
                self.skip_deadline = (0..self.missing.len())
                    .filter(|&idx| self.missing[idx])
                    .filter_map(|idx| self.own_deadline[idx])
                    .min();
            }
        }
        if let Some(deadline) = self.deadline {
            if self.mixing && now >= deadline {
                let stale = self.stale_late();
                let mut missing: Vec<Rank> = self
                    .p
                    .in_neighbors
                    .iter()
                    .enumerate()
                    .filter(|&(idx, _)| self.missing[idx] || stale.contains(&idx))
                    .map(|(_, j)| *j)
                    .collect();
                missing.sort_unstable();
                self.events.push_back(GossipEvent::RoundTimedOut {
                    round: self.round,
                    missing,
                });
                // Report once per deadline; the driver decides what to do.
                self.deadline = None;
            }
        }
        dropped
    }

    /// Records that peer `gone` left the run: it is no longer waited for, sent to, or
    /// accepted from, and its buffered frames are dropped. Returns its index in
    /// `in_neighbors` if the mixing round was still waiting for its frame (the caller then
    /// stands in for the missing contribution and calls [`Exchange::stood_in`]).
    pub(crate) fn leave(&mut self, gone: Rank) -> Option<usize> {
        if let Some(o) = self.p.out_neighbors.iter().position(|&j| j == gone) {
            self.send_from[o] = LEFT;
        }
        let idx = self.p.in_neighbors.iter().position(|&j| j == gone)?;
        self.accept_from[idx] = LEFT;
        self.early.retain(|&(_, i), _| i != idx);
        self.late.retain(|&(_, i)| i != idx);
        (self.mixing && self.missing[idx]).then_some(idx)
    }

    /// Schedules the return of peer `back` (which left): from round `at` on it is sent this
    /// peer's frames and its frames are waited for and accepted (frames for `at` may arrive
    /// before `at` begins, as any neighbour's). Returns `false` if that round has already
    /// begun (or passed), so `back` cannot be admitted there.
    pub(crate) fn rejoin(&mut self, back: Rank, at: u64) -> bool {
        if at < self.round || at == self.round && self.mixing {
            return false;
        }
        if let Some(o) = self.p.out_neighbors.iter().position(|&j| j == back) {
            self.send_from[o] = at;
        }
        if let Some(idx) = self.p.in_neighbors.iter().position(|&j| j == back) {
            self.accept_from[idx] = at;
        }
        true
    }

    /// Moves an idle exchange that has not begun any round to round `round` (a peer that
    /// rejoins a run at that round).
    pub(crate) fn start_at(&mut self, round: u64) {
        self.assert_idle();
        self.round = round;
        self.early.clear();
        self.late.clear();
    }

    /// Whether the mixing round is between rounds (no round mixing).
    pub(crate) fn is_idle(&self) -> bool {
        !self.mixing
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some((to, notice)) = self.notices.pop_front() {
            self.stats.frames_sent += 1;
            self.stats.bytes_sent += notice.len() as u64;
            return Some(Transmit {
                to,
                frame: Bytes::from(notice),
            });
        }
        while self
            .send_from
            .get(self.next_out)
            .is_some_and(|&from| self.round < from)
        {
            self.next_out += 1;
        }
        let to = *self.p.out_neighbors.get(self.next_out)?;
        let frame = match self.per_link.get(self.next_out) {
            Some(f) => f.clone(),
            None => self.outgoing.clone(),
        };
        self.next_out += 1;
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += frame.len() as u64;
        Some(Transmit { to, frame })
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match (self.deadline, self.skip_deadline.filter(|_| self.mixing)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn poll_event(&mut self) -> Option<GossipEvent> {
        self.events.pop_front()
    }

    /// Queues an event of the algorithm's own (e.g. [`GossipEvent::Diverged`]).
    pub(crate) fn push_event(&mut self, ev: GossipEvent) {
        self.events.push_back(ev);
    }

    pub(crate) fn round(&self) -> u64 {
        self.round
    }

    /// The out-neighbours, as [`crate::Gossip::out_peers`].
    pub(crate) fn out_peers(&self) -> Vec<Rank> {
        crate::peer_set(self.p.rank, self.p.out_neighbors.iter().copied())
    }

    /// The in-neighbours, as [`crate::Gossip::in_peers`].
    pub(crate) fn in_peers(&self) -> Vec<Rank> {
        crate::peer_set(self.p.rank, self.p.in_neighbors.iter().copied())
    }

    pub(crate) fn stats(&self) -> GossipStats {
        self.stats
    }
}
