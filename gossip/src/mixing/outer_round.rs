//! Round bookkeeping shared by the algorithms that drive other algorithms
//! ([`crate::LocalSgd`], [`crate::Phased`]): the outer round counter, the parameters the
//! driver reads, and the events, with the inner algorithm's events renumbered to outer
//! rounds.

use std::collections::VecDeque;

use crate::{Gossip, GossipEvent};

/// The outer state of a wrapping algorithm.
pub(crate) struct OuterRound {
    /// x_i: `[d]`, the parameters after the last completed outer round.
    pub x: Vec<f32>,
    /// The outer round that is mixing, or the next one when idle.
    pub round: u64,
    /// Whether the inner algorithm is mixing the outer round `round`.
    pub waiting: bool,
    events: VecDeque<GossipEvent>,
}

impl OuterRound {
    /// Starts at outer round 0 from `x0: [d]`.
    pub fn new(x0: Vec<f32>) -> Self {
        OuterRound {
            x: x0,
            round: 0,
            waiting: false,
            events: VecDeque::new(),
        }
    }

    /// Panics if an outer round is still mixing (a driver bug).
    pub fn assert_idle(&self) {
        assert!(
            !self.waiting,
            "begin_round while round {} is still mixing",
            self.round
        );
    }

    /// Completes the outer round at once (no inner round: e.g. a local SGD step).
    pub fn complete(&mut self) {
        self.events
            .push_back(GossipEvent::Mixed { round: self.round });
        self.round += 1;
    }

    /// Moves `inner`'s events into the outer queue: the inner round's `Mixed` completes the
    /// outer round with `inner`'s parameters; timeouts are renumbered to the outer round.
    pub fn pump(&mut self, inner: &mut dyn Gossip) {
        while let Some(ev) = inner.poll_event() {
            match ev {
                GossipEvent::Mixed { .. } if self.waiting => {
                    self.x.copy_from_slice(inner.params());
                    self.waiting = false;
                    self.complete();
                }
                GossipEvent::RoundTimedOut { missing, .. } => {
                    self.events.push_back(GossipEvent::RoundTimedOut {
                        round: self.round,
                        missing,
                    });
                }
                other => self.events.push_back(other),
            }
        }
    }

    /// Queues an outer event.
    pub fn push(&mut self, ev: GossipEvent) {
        self.events.push_back(ev);
    }

    /// The next outer event.
    pub fn poll_event(&mut self) -> Option<GossipEvent> {
        self.events.pop_front()
    }
}
