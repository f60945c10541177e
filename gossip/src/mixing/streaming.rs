//! A large model's D-PSGD message streamed in parts.
//!
//! D-PSGD mixes every coordinate on its own, x_i^{t+1}[k] = Σ_j W_ij x_j^t[k] − η g_i[k]
//! (Lian et al. 2017, Algorithm 1), so a peer may cut x: [d] into P contiguous parts and
//! run P exchanges side by side, one per part, each part a frame of its own
//! ([`crate::frame::FrameKind::GossipPart`]). The result is that of one exchange of the
//! whole x: the same operations on every coordinate (bit for bit when the neighbours' parts
//! arrive in the order of their whole messages; otherwise the sums' terms are added in
//! another order). What it changes is when the work is done:
//!
//! * a part is mixed as soon as it has come from every in-neighbour, while the next part
//!   is still on the wire, instead of after the whole message;
//! * once the driver hands over the round's gradient before the round has mixed
//!   ([`Gossip::stream_next`]: the next round follows at once), a part that has mixed takes
//!   its step x ← mix − η g and its frame of the next round leaves at once, queued on the
//!   link behind this round's later parts. The link then carries the next round while this
//!   one is still arriving, and a round is no longer the serial sum "receive everything,
//!   mix, step, encode, send" (on a 100 MB model at 1 Gbit/s that sum was 1.26× the link
//!   time; see the guide's transport page).
//!
//! A part is at most one round ahead of the round the driver sees ([`Gossip::round`]):
//! it goes ahead only with the gradient of the round in progress. [`Gossip::params`] is x
//! after the last round the driver saw mixed (parts ahead have already taken their step).
//!
//! Used by `dpsgd` for messages of the identity compressor of at least two parts
//! (`--part-mb`, default [`DEFAULT_PART_MB`] MB), without the skip straggler policy, robust
//! mixing or mixing in place (the simulator mixes in place, so it exchanges whole
//! messages). Memory: the whole x once more than D-PSGD (the parts' own x and the x
//! assembled here).

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use murmur_topology::MixingMatrix;

use crate::algorithms::dpsgd::{DPsgd, DPsgdConfig};
use crate::frame::{FrameHeader, FrameKind};
use crate::mixing::exchange::{Part, PART_PREFIX_LEN};
use crate::{
    AlgorithmState, Gossip, GossipError, GossipEvent, GossipStats, MembershipError, Rank,
    StateError, Transmit,
};

/// Megabytes (10⁶ bytes) of a part when `--part-mb` is not given: 1,000,000 parameters
/// of 4 bytes. Small enough that the last part's mix and step, the only ones left once the
/// message has arrived, take a few milliseconds; large enough that a part's header and
/// bookkeeping are nothing beside its bytes.
pub const DEFAULT_PART_MB: f64 = 4.0;

/// Parameters in a part of `part_mb` MB (4 bytes each), at least 1; `None` for 0 (whole
/// messages).
pub fn part_len(part_mb: f64) -> Option<usize> {
    (part_mb > 0.0).then(|| ((part_mb * 1e6 / 4.0) as usize).max(1))
}

/// The part length (parameters) at which the run of `ctx` streams D-PSGD's messages of
/// `compressor`, or `None` for whole messages: the identity compressor, no skip straggler
/// policy, no robust mixing, not mixing in place, and x of at least two parts of
/// `--part-mb`.
pub(crate) fn streams(
    ctx: &crate::algorithm::BuildContext<'_>,
    compressor: &dyn murmur_compress::Compressor,
) -> Option<usize> {
    let len = part_len(ctx.options.part_mb())?;
    (compressor.id() == murmur_compress::OperatorId::Identity
        && ctx.skip_after.is_none()
        && ctx.options.robust.is_none()
        && !ctx.in_place
        && ctx.dim() >= 2 * len)
        .then_some(len)
}

/// One D-PSGD peer whose x is exchanged in parts of `part_len` parameters (see the
/// [module docs](self)).
pub struct StreamedDPsgd {
    /// One D-PSGD exchange per part, over that part's slice of x.
    parts: Vec<DPsgd>,
    /// Where each part lies in x.
    ranges: Vec<Range<usize>>,
    /// x_i: [d], assembled from the parts as each mixes.
    x: Vec<f32>,
    /// The round the driver sees: mixing, or the next to begin.
    round: u64,
    mixing: bool,
    /// Per part: it has mixed `round` (its result is in `x`).
    settled: Vec<bool>,
    /// Per part: it has taken this round's step and begun the next round.
    ahead: Vec<bool>,
    /// Per part: whether it takes its step once it has mixed, with its slice of
    /// `grad` ([`Gossip::stream_next`] came before it had mixed).
    waiting: Vec<bool>,
    /// The gradient handed over by [`Gossip::stream_next`] (`[d]`; only the slices of the
    /// parts still mixing then are copied; kept from round to round).
    grad: Vec<f32>,
    events: VecDeque<GossipEvent>,
    /// The last round whose [`GossipEvent::RoundTimedOut`] was passed on (once a round, not
    /// once a part).
    timed_out: Option<u64>,
    /// The part whose frames [`Gossip::poll_transmit`] takes next.
    next_tx: usize,
    /// The time of the last call that gave one (for a part that goes ahead in
    /// [`Gossip::peer_left`], which is given none).
    now: Option<Instant>,
}

impl StreamedDPsgd {
    /// A peer starting from `x0: [d]` with the configuration `cfg` of the whole x, cut into
    /// parts of `part_len` parameters (the last one shorter).
    ///
    /// # Panics
    /// If `part_len` is 0, or `cfg` asks for the skip straggler policy, robust mixing or
    /// mixing in place (the caller checks: [`streams`]).
    pub fn new(cfg: DPsgdConfig, x0: Vec<f32>, part_len: usize) -> Self {
        assert!(part_len > 0, "a part holds at least one parameter");
        assert!(
            cfg.skip_after.is_none() && cfg.robust.is_none() && !cfg.in_place,
            "streamed D-PSGD mixes without skipping, clipping or mixing in place"
        );
        let d = x0.len();
        let ranges: Vec<Range<usize>> = (0..d.div_ceil(part_len).max(1))
            .map(|s| s * part_len..((s + 1) * part_len).min(d))
            .collect();
        let count = ranges.len() as u32;
        let parts: Vec<DPsgd> = ranges
            .iter()
            .enumerate()
            .map(|(s, r)| {
                let mut c = cfg.clone();
                c.part = Some(Part {
                    index: s as u32,
                    count,
                });
                // The part's own bound (as `DPsgdConfig::from_matrix` sets it for d), within
                // the whole message's.
                c.max_payload_bytes = u32::try_from(16 * r.len() + 1024 + PART_PREFIX_LEN)
                    .unwrap_or(u32::MAX)
                    .min(cfg.max_payload_bytes);
                c.seed = cfg.seed.wrapping_add(s as u64);
                DPsgd::new(c, x0[r.clone()].to_vec())
            })
            .collect();
        let p = parts.len();
        StreamedDPsgd {
            parts,
            ranges,
            x: x0,
            round: 0,
            mixing: false,
            settled: vec![false; p],
            ahead: vec![false; p],
            waiting: vec![false; p],
            grad: Vec::new(),
            events: VecDeque::new(),
            timed_out: None,
            next_tx: 0,
            now: None,
        }
    }

    /// Part `s` takes the step x ← mix − η `g` (`g: [d]`, the gradient; the part reads its
    /// slice), its result goes into x, and its next round begins at `now`.
    fn step_ahead(&mut self, s: usize, now: Instant, g: &[f32]) {
        let (part, r) = (&mut self.parts[s], self.ranges[s].clone());
        part.apply_gradient(&g[r.clone()]);
        self.x[r].copy_from_slice(part.params());
        part.begin_from_params(now, None);
        self.ahead[s] = true;
    }

    /// Passes on the parts' events, settles the parts that have mixed the round the driver
    /// sees, and ends that round once every part has.
    fn settle(&mut self, now: Instant) {
        self.now = Some(now);
        for part in &mut self.parts {
            while let Some(ev) = part.poll_event() {
                match ev {
                    GossipEvent::Mixed { .. } => {}
                    GossipEvent::RoundTimedOut { round, missing } => {
                        if self.timed_out != Some(round) {
                            self.timed_out = Some(round);
                            self.events
                                .push_back(GossipEvent::RoundTimedOut { round, missing });
                        }
                    }
                    other => self.events.push_back(other),
                }
            }
        }
        if !self.mixing {
            return;
        }
        for s in 0..self.parts.len() {
            if self.settled[s] || self.parts[s].round() <= self.round {
                continue;
            }
            self.settled[s] = true;
            if std::mem::take(&mut self.waiting[s]) {
                // Lent out for the call (step_ahead borrows all of self), then put back.
                let g = std::mem::take(&mut self.grad);
                self.step_ahead(s, now, &g);
                self.grad = g;
            } else {
                self.x[self.ranges[s].clone()].copy_from_slice(self.parts[s].params());
            }
        }
        if self.settled.iter().all(|&s| s) {
            self.mixing = false;
            self.events
                .push_back(GossipEvent::Mixed { round: self.round });
            self.round += 1;
        }
    }
}

/// The part index of a [`FrameKind::GossipPart`] frame (`None` if it is not one or too
/// short).
fn part_of(frame: &[u8]) -> Option<usize> {
    let (h, payload) = FrameHeader::parse(frame, u32::MAX).ok()?;
    (h.kind == FrameKind::GossipPart)
        .then(|| Part::of_payload(payload))?
        .map(|p| p.index as usize)
}

impl Gossip for StreamedDPsgd {
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
        assert_eq!(x.len(), self.x.len(), "x must have length d");
        if let Some(g) = grad {
            assert_eq!(g.len(), x.len(), "grad must have length d");
        }
        for s in 0..self.parts.len() {
            // A part ahead began this round from its own result, which is x's.
            if !self.ahead[s] {
                let r = self.ranges[s].clone();
                self.x[r.clone()].copy_from_slice(&x[r.clone()]);
                self.parts[s].begin_round(now, &x[r.clone()], grad.map(|g| &g[r]));
            }
        }
        self.mixing = true;
        self.settled.fill(false);
        self.ahead.fill(false);
        self.waiting.fill(false);
        self.next_tx = 0;
        self.settle(now);
    }

    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        // A frame that is no part of ours goes to part 0, which refuses it with the reason.
        let s = part_of(frame)
            .filter(|&s| s < self.parts.len())
            .unwrap_or(0);
        let result = self.parts[s].handle_message(now, from, frame);
        self.settle(now);
        result
    }

    fn handle_timeout(&mut self, now: Instant) {
        for part in &mut self.parts {
            part.handle_timeout(now);
        }
        self.settle(now);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let p = self.parts.len();
        for _ in 0..p {
            if let Some(t) = self.parts[self.next_tx].poll_transmit() {
                return Some(t);
            }
            self.next_tx = (self.next_tx + 1) % p;
        }
        None
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.parts.iter().filter_map(|p| p.poll_timeout()).min()
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.events.pop_front()
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    fn round(&self) -> u64 {
        self.round
    }

    fn stats(&self) -> GossipStats {
        let mut total = GossipStats::default();
        for part in &self.parts {
            total += part.stats();
        }
        total
    }

    fn set_epoch(&mut self, epoch: usize) {
        for part in &mut self.parts {
            part.set_epoch(epoch);
        }
    }

    fn out_peers(&self) -> Vec<Rank> {
        self.parts[0].out_peers()
    }

    fn in_peers(&self) -> Vec<Rank> {
        self.parts[0].in_peers()
    }

    fn peer_left(&mut self, gone: Rank, w: &MixingMatrix) -> Result<(), MembershipError> {
        // Every part has the same neighbours and checks `w` alike: the first refuses before
        // any part has changed, or none does.
        for part in &mut self.parts {
            part.peer_left(gone, w)?;
        }
        if let Some(now) = self.now {
            self.settle(now);
        }
        Ok(())
    }

    fn peer_rejoined(
        &mut self,
        back: Rank,
        w: &MixingMatrix,
        at: u64,
    ) -> Result<(), MembershipError> {
        // A part ahead may already mix round `at`: then no part takes `back` there.
        if self
            .parts
            .iter()
            .any(|p| p.round() > at || p.round() == at && p.is_mixing())
        {
            return Err(MembershipError::TooLate {
                at,
                round: self.round,
            });
        }
        for part in &mut self.parts {
            part.peer_rejoined(back, w, at)?;
        }
        Ok(())
    }

    fn start_at_round(&mut self, round: u64) -> Result<(), MembershipError> {
        assert!(!self.mixing, "start_at_round after a round has begun");
        for part in &mut self.parts {
            part.start_at_round(round)?;
        }
        self.round = round;
        Ok(())
    }

    /// The identity compressor keeps no state: nothing beyond x and the round.
    fn state(&self) -> AlgorithmState {
        AlgorithmState::default()
    }

    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        if state.is_empty() {
            Ok(())
        } else {
            Err(StateError(
                "D-PSGD streamed in parts keeps no state beyond x and the round".into(),
            ))
        }
    }

    fn overlaps_gradient(&self) -> bool {
        true
    }

    fn apply_gradient(&mut self, grad: &[f32]) {
        assert!(
            !self.mixing,
            "apply_gradient while round {} mixes",
            self.round
        );
        assert_eq!(grad.len(), self.x.len(), "grad must have length d");
        for s in 0..self.parts.len() {
            if !self.ahead[s] {
                let r = self.ranges[s].clone();
                self.parts[s].apply_gradient(&grad[r.clone()]);
                self.x[r].copy_from_slice(self.parts[s].params());
            }
        }
    }

    fn stream_next(&mut self, now: Instant, grad: &[f32]) {
        assert_eq!(grad.len(), self.x.len(), "grad must have length d");
        if !self.mixing {
            // The round has mixed already: the driver applies the gradient as usual.
            return;
        }
        self.grad.resize(grad.len(), 0.0);
        for s in 0..self.parts.len() {
            if self.ahead[s] {
                continue;
            }
            if self.settled[s] {
                self.step_ahead(s, now, grad);
            } else {
                let r = self.ranges[s].clone();
                self.grad[r.clone()].copy_from_slice(&grad[r]);
                self.waiting[s] = true;
            }
        }
        self.settle(now);
    }
}
