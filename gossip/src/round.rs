//! One training round of one peer, as every driver runs it: `murmur peer` (the node's
//! training loop, over the real network) and the network simulator ([`crate::NetSim`],
//! behind `murmur simulate`) call the same [`Round`], so that a simulator result is a
//! result about the shipped round, and the two cannot drift apart.
//!
//! A round, in the order a driver calls it:
//!
//! ```text
//! Round::start(x)       the exchange begins now from x (grad = None) if the algorithm
//!                       overlaps it with the gradient (D-PSGD: its frames carry x_t, Lian
//!                       et al. 2017 §3) and the driver allows it; drain poll_transmit
//! (compute g at x)      frames move meanwhile; an algorithm that communicates in the
//!                       background (Streaming DiLoCo) is handed the frames that arrive
//! Round::computed(x, g) without overlap, the exchange begins now from x with g; drain
//!                       (with overlap, g goes to Gossip::stream_next if the next round
//!                       follows at once: parts of it may leave before this one mixes)
//! (until Mixed)         the driver feeds frames and timeouts to the state machine
//! Round::finish(g)      with overlap, x ← mixed x − η g (Gossip::apply_gradient)
//! ```
//!
//! The driver owns the clock and the bytes; [`Round`] owns the decisions.

use std::time::Instant;

use crate::Gossip;

/// The round in progress on one peer: whether its exchange overlaps the gradient, and where
/// it stands. Built by [`Round::start`]; consumed by [`Round::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    round: u64,
    overlap: bool,
    begun: bool,
}

impl Round {
    /// Starts the round on `gossip` from the local parameters `x: [d]` at `now`. With
    /// `allow_overlap` (`murmur peer` without `--no-overlap`; the simulator's default) and
    /// an algorithm whose frames do not depend on the gradient
    /// ([`Gossip::overlaps_gradient`]), the exchange begins at once with `grad = None`: the
    /// driver then drains [`Gossip::poll_transmit`] before it computes the gradient.
    pub fn start(gossip: &mut dyn Gossip, now: Instant, x: &[f32], allow_overlap: bool) -> Self {
        let overlap = allow_overlap && gossip.overlaps_gradient();
        let round = gossip.round();
        if overlap {
            gossip.begin_round(now, x, None);
        }
        Self {
            round,
            overlap,
            begun: overlap,
        }
    }

    /// The round's number (the algorithm's [`Gossip::round`] when it started).
    pub fn number(&self) -> u64 {
        self.round
    }

    /// Whether the exchange overlaps the gradient's computation (begun in
    /// [`Round::start`], the gradient applied in [`Round::finish`]).
    pub fn overlaps(&self) -> bool {
        self.overlap
    }

    /// The local direction `grad: [d]` at `x: [d]` is computed (`None`: a step of zero
    /// gradient). Without overlap, the exchange begins now, and `true` says so: the driver
    /// drains [`Gossip::poll_transmit`]. With overlap it began in [`Round::start`]: `false`;
    /// if `next_follows` (the driver begins the next round from this one's result, with
    /// nothing changed in between: no checkpoint, no end of the run), the gradient is handed
    /// over now ([`Gossip::stream_next`]) so that an algorithm streaming its message in parts
    /// may send parts of the next round before this one has mixed; the driver drains
    /// [`Gossip::poll_transmit`] as frames arrive, as always.
    pub fn computed(
        &mut self,
        gossip: &mut dyn Gossip,
        now: Instant,
        x: &[f32],
        grad: Option<&[f32]>,
        next_follows: bool,
    ) -> bool {
        if self.begun {
            if let Some(g) = grad.filter(|_| self.overlap && next_follows) {
                gossip.stream_next(now, g);
            }
            return false;
        }
        self.begun = true;
        gossip.begin_round(now, x, grad);
        true
    }

    /// The round has mixed ([`crate::GossipEvent::Mixed`]) and its gradient is computed:
    /// with overlap, the gradient `grad: [d]` is applied to the mixed parameters now
    /// ([`Gossip::apply_gradient`]). [`Gossip::params`] then holds the round's result.
    ///
    /// # Panics
    /// If [`Round::computed`] was not called (a driver bug).
    pub fn finish(self, gossip: &mut dyn Gossip, grad: Option<&[f32]>) {
        assert!(self.begun, "Round::finish before Round::computed");
        if self.overlap {
            if let Some(g) = grad {
                gossip.apply_gradient(g);
            }
        }
    }
}
