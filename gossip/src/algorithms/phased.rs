//! Phase schedules: one algorithm for the first rounds, another afterwards — e.g.
//! all-reduce for the first epochs and then gossip, or the reverse ("post-local SGD",
//! Lin, Stich, Patel & Jaggi 2020, "Don't use large mini-batches, use local SGD", §3).
//!
//! [`Phased`] owns the phases' state machines, built up front, and hands each round to the
//! phase it belongs to. Every phase counts its own rounds from 0 and takes the parameters
//! x the driver passes to [`Gossip::begin_round`], so a phase starts from where the
//! previous one ended (a CHOCO phase starts with x̂ = 0, a push-sum phase with w = 1).
//!
//! A faster neighbour may already be in the next phase while this peer finishes the
//! current one. A frame that the current phase refuses because of its kind, its round
//! window, its sender (the next phase may use another graph) or its size (an all-reduce
//! phase takes chunks of x, a gossip phase sends the whole x) is therefore kept (at most [`Phased::MAX_HELD`] frames) and offered to the next
//! phase when it begins; what that phase refuses then is dropped and counted in
//! [`Phased::dropped_frames`]. Other refusals are returned at once.

use std::collections::VecDeque;
use std::time::Instant;

use crate::mixing::outer_round::OuterRound;
use crate::{Gossip, GossipError, GossipEvent, GossipStats, LinkChoice, Rank, Transmit};

/// One phase: a state machine and how many rounds it runs (`None`: until the end).
pub struct Phase {
    /// The phase's name, for metrics (e.g. `allreduce`).
    pub name: String,
    /// Its state machine, starting at its round 0.
    pub gossip: Box<dyn Gossip>,
    /// Rounds of this phase; `None` for the last phase.
    pub rounds: Option<u64>,
}

/// A sequence of algorithms run one after the other (see the [module docs](self)).
pub struct Phased {
    phases: Vec<Phase>,
    /// Index of the current phase.
    current: usize,
    /// x_i, the round t over all phases and the events; `waiting` while the current phase
    /// has a round in progress.
    outer: OuterRound,
    /// First round of the current phase.
    phase_start: u64,
    /// Frames refused by the current phase that may belong to the next: (from, frame).
    held: VecDeque<(Rank, Vec<u8>)>,
    dropped: u64,
    /// Counters of the phases that ended.
    past: GossipStats,
}

impl Phased {
    /// Frames kept for the next phase, at most.
    pub const MAX_HELD: usize = 1024;

    /// Runs `phases` in order.
    ///
    /// # Panics
    /// If `phases` is empty, a phase but the last has `rounds: None` or `Some(0)`, or the
    /// phases' dimensions d differ (configuration bugs of the caller).
    pub fn new(phases: Vec<Phase>) -> Self {
        assert!(!phases.is_empty(), "a phase schedule needs a phase");
        let d = phases[0].gossip.params().len();
        for (i, p) in phases.iter().enumerate() {
            assert_eq!(p.gossip.params().len(), d, "phase {i} has another d");
            if i + 1 < phases.len() {
                assert!(
                    p.rounds.is_some_and(|r| r > 0),
                    "phase {i} must run at least one round"
                );
            }
        }
        Phased {
            outer: OuterRound::new(phases[0].gossip.params().to_vec()),
            phases,
            current: 0,
            phase_start: 0,
            held: VecDeque::new(),
            dropped: 0,
            past: GossipStats::default(),
        }
    }

    /// Name of the phase that runs round [`Gossip::round`].
    pub fn phase_name(&self) -> &str {
        &self.phases[self.current].name
    }

    /// Frames held for a next phase that refused them.
    pub fn dropped_frames(&self) -> u64 {
        self.dropped
    }

    /// The phase that runs the next round to begin (the current one while mixing).
    fn next_phase(&self) -> usize {
        match self.phases[self.current].rounds {
            Some(r)
                if !self.outer.waiting
                    && self.outer.round >= self.phase_start + r
                    && self.current + 1 < self.phases.len() =>
            {
                self.current + 1
            }
            _ => self.current,
        }
    }

    fn cur(&mut self) -> &mut dyn Gossip {
        self.phases[self.current].gossip.as_mut()
    }

    /// Moves to the next phase if the current one has run its rounds, and offers it the
    /// held frames.
    fn advance_if_due(&mut self, now: Instant) {
        if self.next_phase() == self.current {
            return;
        }
        self.past += self.phases[self.current].gossip.stats();
        self.current += 1;
        self.phase_start = self.outer.round;
        for (from, frame) in std::mem::take(&mut self.held) {
            if self.cur().handle_message(now, from, &frame).is_err() {
                self.dropped += 1;
            }
        }
    }

    /// Moves the current phase's events into the outer queue.
    fn pump(&mut self) {
        self.outer.pump(self.phases[self.current].gossip.as_mut());
    }
}

impl Gossip for Phased {
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        self.outer.assert_idle();
        self.advance_if_due(now);
        self.outer.waiting = true;
        self.cur().begin_round(now, x, grad);
        self.pump();
    }

    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let r = self.cur().handle_message(now, from, frame);
        self.pump();
        match r {
            Err(
                GossipError::WrongKind(_)
                | GossipError::RoundOutOfWindow { .. }
                | GossipError::NotANeighbour(_)
                | GossipError::Frame(crate::frame::FrameError::TooLarge { .. }),
            ) if self.current + 1 < self.phases.len() && self.held.len() < Self::MAX_HELD => {
                self.held.push_back((from, frame.to_vec()));
                Ok(())
            }
            r => r,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.cur().handle_timeout(now);
        self.pump();
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.cur().poll_transmit()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.phases[self.current].gossip.poll_timeout()
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.pump();
        self.outer.poll_event()
    }

    fn params(&self) -> &[f32] {
        &self.outer.x
    }

    fn round(&self) -> u64 {
        self.outer.round
    }

    fn stats(&self) -> GossipStats {
        let mut total = self.past;
        total += self.phases[self.current].gossip.stats();
        total
    }

    fn set_epoch(&mut self, epoch: usize) {
        for p in &mut self.phases {
            p.gossip.set_epoch(epoch);
        }
    }

    fn out_peers(&self) -> Vec<Rank> {
        let me = usize::MAX; // no rank is usize::MAX; the phases already leave themselves out
        crate::peer_set(me, self.phases.iter().flat_map(|p| p.gossip.out_peers()))
    }

    fn in_peers(&self) -> Vec<Rank> {
        crate::peer_set(
            usize::MAX,
            self.phases.iter().flat_map(|p| p.gossip.in_peers()),
        )
    }

    /// The answer of the phase that runs the next round (the driver asks before each
    /// round).
    fn overlaps_gradient(&self) -> bool {
        self.phases[self.next_phase()].gossip.overlaps_gradient()
    }

    /// Every phase gets the sample: a link's rate belongs to the link, whichever phase's
    /// frame measured it, so a later phase that chooses per link (`choco-auto`,
    /// `local-auto`) starts with what the earlier phases saw. A phase ignores links that are
    /// not its own.
    fn observe_link(&mut self, from: Rank, bytes: usize, secs: f64) {
        for p in &mut self.phases {
            p.gossip.observe_link(from, bytes, secs);
        }
    }

    /// The current phase's choices.
    fn link_choices(&self) -> Vec<LinkChoice> {
        self.phases[self.current].gossip.link_choices()
    }

    fn communicates_in_background(&self) -> bool {
        self.phases[self.current]
            .gossip
            .communicates_in_background()
    }

    fn apply_gradient(&mut self, grad: &[f32]) {
        self.cur().apply_gradient(grad);
        self.outer
            .x
            .copy_from_slice(self.phases[self.current].gossip.params());
    }
}
