//! Decentralized training algorithms as sans-I/O state machines over flat `f32` buffers.
//!
//! Each algorithm is one peer's side of the protocol. It performs no I/O and reads no
//! clock: the local parameters, received frames and the current time come in through
//! [`Gossip::begin_round`], [`Gossip::handle_message`] and [`Gossip::handle_timeout`]; frames
//! to send, the next deadline and events go out through [`Gossip::poll_transmit`],
//! [`Gossip::poll_timeout`] and [`Gossip::poll_event`]. The same state machine is driven by
//! the real network in `murmur peer` and by the in-process [`sim::Sim`], so a result of the
//! simulator is a result about the shipped code (the quinn-proto / quinn split).
//! [`NetSim`] drives the same state machines, through the same [`round::Round`] as the
//! peer, on a simulated network (latency, bandwidth, loss, stragglers) to predict
//! wall-clock time.
//!
//! The crate is in rooms:
//! - [`algorithms`]: one file per algorithm, named by its `--algorithm` name: [`DPsgd`]
//!   (Lian et al. 2017), [`Choco`] (CHOCO-SGD and CHOCO-Gossip, Koloskova, Stich & Jaggi
//!   2019) and `choco-auto` ([`ChocoAuto`]), [`Sgp`] (Stochastic Gradient Push and its
//!   overlap variant OSGP, Assran et al. 2019; push-sum, Kempe et al. 2003), [`LocalSgd`]
//!   (`local-sgd`, `local-avg`, `local-auto`: H local steps around another algorithm),
//!   [`DiLoCo`] (`diloco`, `diloco-gossip`, `diloco-auto`: Douillard et al. 2023; NoLoCo,
//!   Kolehmainen et al. 2025), [`StreamingDiLoCo`] (Douillard et al. 2025), the
//!   centralized baselines [`AllReduce`] (ring all-reduce, Patarasuk & Yuan 2009) and
//!   [`ParameterServer`] (BSP, Li et al. 2014; SSP/ASP, Ho et al. 2013), and [`Phased`]
//!   (phase schedules);
//! - [`mixing`]: what several algorithms share (the local step, the W-weighted exchange,
//!   re-weighting around departed peers, robust clipping, link meters, outer rounds,
//!   DiLoCo's outer step);
//! - [`algorithm`]: what an algorithm declares (the [`Algorithm`] trait, its
//!   [`Capabilities`], the protocol options as table rows); [`registry`]: every algorithm by
//!   name and the one check of a run's setup ([`registry::check_run`]);
//! - [`round`]: the round protocol that `murmur peer` and the simulator both run;
//! - [`sim`]: the lock-step harness [`sim::Sim`], the network simulator [`NetSim`], and
//!   Byzantine attackers;
//! - [`frame`]: the data-plane frame header; [`optimizer`]: the inner and outer optimizers
//!   over flat vectors.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod algorithm;
pub mod algorithms;
pub mod frame;
pub mod mixing;
pub mod optimizer;
pub mod registry;
pub mod round;
pub mod sim;

use std::time::Instant;

pub use bytes::Bytes;

use murmur_topology::MixingMatrix;

pub use algorithm::{
    Algorithm, AlgorithmOptions, BuildContext, Capabilities, Compresses, Departures, GraphNeeds,
    Pattern, ProtocolOption, Resumable, Resume,
};
pub use algorithms::allreduce::{chunk_range, AllReduce, AllReduceConfig};
pub use algorithms::choco::{suggested_gamma, theorem2_gamma, Choco, ChocoConfig};
pub use algorithms::choco_auto::{ChocoAuto, ChocoAutoConfig, Ladder};
pub use algorithms::diloco::DiLoCo;
pub use algorithms::dpsgd::{DPsgd, DPsgdConfig};
pub use algorithms::local_sgd::LocalSgd;
pub use algorithms::phased::{Phase, Phased};
pub use algorithms::ps::{ParameterServer, PsConfig, PsMode};
pub use algorithms::sgp::{Sgp, SgpConfig};
pub use algorithms::streaming_diloco::{Schedule as StreamingSchedule, StreamingDiLoCo};
pub use frame::{FrameError, FrameHeader, FrameKind, FRAME_HEADER_LEN};
pub use mixing::exchange::AutoDeadline;
pub use mixing::robust::ClipRule;
pub use murmur_topology::Rank;
pub use optimizer::{OuterConfig, OuterOptimizer};
pub use registry::AlgorithmSpec;
pub use sim::byzantine::{Attack, Byzantine, ByzantineSpec};
pub use sim::netsim::{
    Compute, ConsensusPoint, NetSim, NetSimError, NetworkModel, PeerRound, RunReport, Totals,
};

/// Under the skip straggler policy of the algorithms that absorb a late message instead of
/// dropping it ([`Sgp`], [`Choco`]): the most rounds a message may be late. Round k waits
/// (up to the round timeout) for every message of rounds ≤ k − `SKIP_STALENESS` (k − τ −
/// `SKIP_STALENESS` for SGP), so a peer runs at most that many rounds further ahead of an
/// in-neighbour than without the policy, and buffers that many more rounds of frames.
pub const SKIP_STALENESS: u64 = 8;
use thiserror::Error;

/// Why a state machine could not be built, or options were refused.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The protocol options do not suit the run's algorithms.
    #[error("{0}")]
    Options(String),
    /// The topology does not suit the algorithm.
    #[error("{0}")]
    Topology(String),
    /// The compressor cannot be built for this model.
    #[error("--compressor: {0}")]
    Compressor(#[from] murmur_compress::SpecError),
}

/// A frame the state machine wants sent: its destination and its bytes, header included.
///
/// The bytes are shared, not copied: a message that goes to k out-neighbours is one
/// allocation handed out k times, and the state machine reuses it for its next message once
/// every clone is dropped (a driver that holds it longer costs one new allocation then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination peer.
    pub to: Rank,
    /// The frame.
    pub frame: Bytes,
}

/// Something the driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GossipEvent {
    /// Round `round` is complete; [`Gossip::params`] holds the new local parameters `x: [d]`.
    Mixed {
        /// The round that completed (0-based).
        round: u64,
    },
    /// The round's deadline passed before every expected message arrived.
    RoundTimedOut {
        /// The round that is stuck.
        round: u64,
        /// Peers whose message for that round is missing, ascending.
        missing: Vec<Rank>,
    },
    /// The peer's own state is no longer finite (the run has diverged, e.g. a step size
    /// too large): the round cannot be completed and the driver must stop the run.
    Diverged {
        /// The round that could not begin.
        round: u64,
        /// What was not finite.
        reason: String,
    },
}

/// Why an incoming frame was refused. The state machine is unchanged by a refused frame.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum GossipError {
    /// The frame's header is malformed.
    #[error("malformed frame: {0}")]
    Frame(#[from] FrameError),
    /// The frame is not a gossip frame.
    #[error("expected a gossip frame, got {0:?}")]
    WrongKind(FrameKind),
    /// The header names another sender than the connection it came on.
    #[error("frame claims sender {claimed} but arrived from peer {from}")]
    SenderMismatch {
        /// Transport-level sender.
        from: Rank,
        /// Sender field of the header.
        claimed: Rank,
    },
    /// The sender is not an in-neighbour of this peer.
    #[error("peer {0} is not an in-neighbour of this peer")]
    NotANeighbour(Rank),
    /// The frame's round is outside the window this peer accepts.
    #[error(
        "frame from peer {from} is for round {round}, outside the accepted window {lo}..={hi}"
    )]
    RoundOutOfWindow {
        /// Sender.
        from: Rank,
        /// The frame's round.
        round: u64,
        /// Lowest accepted round.
        lo: u64,
        /// Highest accepted round.
        hi: u64,
    },
    /// A part of a streamed message that is not the part this state machine mixes, or
    /// of a message cut into another number of parts ([`crate::mixing::streaming`]).
    #[error(
        "frame from peer {from} is part {got_part} of {got_parts}; expected part {part} of {parts}"
    )]
    WrongPart {
        /// Sender.
        from: Rank,
        /// The part expected.
        part: u32,
        /// The part count expected.
        parts: u32,
        /// The frame's part index (`u32::MAX` if the frame had no part prefix).
        got_part: u32,
        /// The frame's part count (0 if the frame had no part prefix).
        got_parts: u32,
    },
    /// A second message from the same peer for the same round.
    #[error("duplicate message from peer {from} for round {round}")]
    Duplicate {
        /// Sender.
        from: Rank,
        /// Round.
        round: u64,
    },
    /// A frame of a round in which the pair drops each other under the straggler policy:
    /// late (the round was mixed without it), or from a neighbour that runs ahead of this
    /// slow peer (it mixes those rounds without us). Not an error of the sender.
    #[error("frame from peer {from} for round {round}, which was mixed without it")]
    Skipped {
        /// Sender.
        from: Rank,
        /// The round.
        round: u64,
    },
    /// A straggler notice for a round whose values this peer no longer keeps.
    #[error("skip notice from peer {from} for round {round}, older than the rounds kept")]
    SkipTooOld {
        /// Sender.
        from: Rank,
        /// The round.
        round: u64,
    },
    /// The sender left the run; its frames are no longer mixed.
    #[error("peer {0} has left the run; its frames are no longer accepted")]
    Departed(Rank),
    /// The header's model dimension differs from this peer's.
    #[error("frame from peer {from} is for d = {got}, this model has d = {expected}")]
    DimensionMismatch {
        /// Sender.
        from: Rank,
        /// This peer's d.
        expected: usize,
        /// The frame's d.
        got: usize,
    },
    /// The compressed payload could not be decoded.
    // `cause` is in the message, so it is not also a `source` (an error chain would
    // print it twice).
    #[error("payload from peer {from}: {cause}")]
    Payload {
        /// Sender.
        from: Rank,
        /// What was wrong.
        cause: murmur_compress::DecodeError,
    },
    /// A link-rate report ([`FrameKind::LinkRate`]) whose payload is not one positive,
    /// finite `f64` (bytes per second).
    #[error("link-rate report from peer {from}: {what}")]
    BadLinkRate {
        /// Sender.
        from: Rank,
        /// What was wrong.
        what: String,
    },
    /// A push-sum share's mixing weight or push-sum weight is NaN or outside its range.
    #[error("push-sum share from peer {from}: {field} = {value} is outside ({lo}, {hi}]")]
    BadWeight {
        /// Sender.
        from: Rank,
        /// Which weight: `"p"` (the mixing weight) or `"weight"` (the push-sum weight).
        field: &'static str,
        /// The value found.
        value: f64,
        /// Exclusive lower bound.
        lo: f64,
        /// Inclusive upper bound.
        hi: f64,
    },
}

/// Why a change of membership could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// The algorithm cannot continue once a peer has left.
    #[error("{algorithm} cannot continue without a peer: {why}")]
    Unsupported {
        /// The algorithm's name.
        algorithm: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// The new mixing matrix does not fit this peer (another n, or it still gives the
    /// departed peer a weight).
    #[error("the new mixing matrix does not fit: {0}")]
    BadMatrix(String),
    /// A returning peer cannot be admitted at round `at`: this peer has already begun it.
    #[error("round {at} has already begun here (this peer is at round {round})")]
    TooLate {
        /// The round asked for.
        at: u64,
        /// This peer's round.
        round: u64,
    },
}

/// An algorithm's state beyond the parameters x and the round: what a checkpoint keeps so
/// that a resumed run continues where it stopped (CHOCO's copies x̂, SGP's push-sum weight
/// and numerator, a compressor's error-feedback residual). Vectors are `[d]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlgorithmState {
    /// Named scalars, e.g. `("push_sum_weight", w_i)`.
    pub scalars: Vec<(String, f64)>,
    /// Named vectors `[d]`, e.g. `("x_hat", x̂_i)`, `("compressor.residual", e)`.
    pub vectors: Vec<(String, Vec<f32>)>,
}

impl AlgorithmState {
    /// Whether there is nothing to save.
    pub fn is_empty(&self) -> bool {
        self.scalars.is_empty() && self.vectors.is_empty()
    }

    /// Adds the compressor's state under the prefix `compressor.`.
    pub(crate) fn with_compressor(mut self, c: &dyn murmur_compress::Compressor) -> Self {
        self.vectors.extend(
            c.state()
                .into_iter()
                .map(|(name, v)| (format!("{COMPRESSOR_PREFIX}{name}"), v)),
        );
        self
    }

    /// Checks the state against what an algorithm saves — exactly the scalars `scalars`
    /// and the vectors `vectors` (each `[d]`, finite), in that order, plus any compressor
    /// state — and restores the compressor part into `compressor`. Returns the scalars'
    /// and the vectors' values. Nothing changes on `Err`.
    pub(crate) fn restore_into(
        &self,
        scalars: &[&str],
        vectors: &[&str],
        d: usize,
        compressor: &mut dyn murmur_compress::Compressor,
    ) -> Result<(Vec<f64>, Vec<Vec<f32>>), StateError> {
        let names: Vec<&str> = self.scalars.iter().map(|(n, _)| n.as_str()).collect();
        if names != scalars {
            return Err(StateError(format!(
                "expected the scalars {scalars:?}, got {names:?}"
            )));
        }
        if let Some((n, v)) = self.scalars.iter().find(|(_, v)| !v.is_finite()) {
            return Err(StateError(format!("{n:?} = {v} is not finite")));
        }
        let (theirs, own): (Vec<_>, Vec<_>) = self
            .vectors
            .iter()
            .cloned()
            .partition(|(n, _)| n.starts_with(COMPRESSOR_PREFIX));
        murmur_compress::check_state(&own, vectors, d)?;
        let theirs: Vec<(String, Vec<f32>)> = theirs
            .into_iter()
            .map(|(n, v)| (n[COMPRESSOR_PREFIX.len()..].to_string(), v))
            .collect();
        compressor.restore_state(d, &theirs)?;
        Ok((
            self.scalars.iter().map(|(_, v)| *v).collect(),
            own.into_iter().map(|(_, v)| v).collect(),
        ))
    }
}

const COMPRESSOR_PREFIX: &str = "compressor.";

pub use murmur_compress::StateError;

/// Counters kept by every state machine. Units: bytes are whole frames (header included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GossipStats {
    /// Frames handed out by `poll_transmit`.
    pub frames_sent: u64,
    /// Bytes handed out by `poll_transmit`.
    pub bytes_sent: u64,
    /// Frames accepted by `handle_message`.
    pub frames_received: u64,
    /// Bytes of accepted frames.
    pub bytes_received: u64,
    /// Neighbour contributions this peer dropped under the straggler policy (its own
    /// deadline, or a neighbour's notice), one per (round, neighbour).
    pub skipped: u64,
    /// Nanoseconds (by the `now` of the calls) that communication ran behind the rounds
    /// rather than inside them: Streaming DiLoCo's fragment all-reduces, from their start to
    /// their end, less what a round waited for them. A driver adds it to the rounds' own
    /// communication time (begin to `Mixed`). 0 for algorithms whose rounds hold all their
    /// communication.
    pub background_nanos: u64,
}

/// Counters of two state machines together (the parts of one message, the phases of a run).
impl std::ops::AddAssign for GossipStats {
    fn add_assign(&mut self, o: GossipStats) {
        self.frames_sent += o.frames_sent;
        self.bytes_sent += o.bytes_sent;
        self.frames_received += o.frames_received;
        self.bytes_received += o.bytes_received;
        self.skipped += o.skipped;
        self.background_nanos += o.background_nanos;
    }
}

/// What one link of a peer measured and chose, for algorithms that choose per link
/// ([`ChocoAuto`]: the compressor; [`algorithms::local_auto::AsyncLinks`]: the period).
#[derive(Debug, Clone, PartialEq)]
pub struct LinkChoice {
    /// The neighbour j.
    pub peer: Rank,
    /// Estimated bandwidth of the link, bytes/s; `None` before the first sample.
    pub bytes_per_sec: Option<f64>,
    /// What is chosen per link: `compressor` or `period`.
    pub what: &'static str,
    /// The last round's choice for the link to j (`identity`, `topk:0.05`; `4`: every 4th
    /// communication round).
    pub choice: String,
    /// Rounds with each choice, in the order of the choices (those never made left out).
    pub rounds_by_choice: Vec<(String, u64)>,
}

/// One peer's side of a decentralized algorithm. Performs no I/O and reads no clock.
///
/// Calling contract: after [`Gossip::begin_round`] or any `handle_*`, drain
/// [`Gossip::poll_transmit`] until `None`, then read [`Gossip::poll_timeout`] and drain
/// [`Gossip::poll_event`]. A round begins only after the previous one produced
/// [`GossipEvent::Mixed`].
pub trait Gossip: Send {
    /// Starts the next round from the local parameters `x: [d]` and, where the algorithm
    /// uses it, the local stochastic gradient (or update direction) `grad: [d]` evaluated
    /// at `x`.
    ///
    /// # Panics
    /// If `x` or `grad` does not have length d, or the previous round is still mixing
    /// (both are driver bugs, not input errors).
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>);

    /// Feeds one frame received from peer `from` (the transport's authenticated sender).
    /// On `Err` the frame is dropped and the state is unchanged.
    fn handle_message(&mut self, now: Instant, from: Rank, frame: &[u8])
        -> Result<(), GossipError>;

    /// Tells the state machine the time; a call before the deadline is a no-op.
    fn handle_timeout(&mut self, now: Instant);

    /// The next frame to send, with its destination.
    #[must_use]
    fn poll_transmit(&mut self) -> Option<Transmit>;

    /// When [`Gossip::handle_timeout`] should next be called.
    #[must_use]
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next event, if any.
    #[must_use]
    fn poll_event(&mut self) -> Option<GossipEvent>;

    /// The current local parameters `x: [d]` (after [`GossipEvent::Mixed`], the new ones).
    fn params(&self) -> &[f32];

    /// The round that is mixing, or the next one to begin when idle.
    fn round(&self) -> u64;

    /// Traffic counters.
    fn stats(&self) -> GossipStats;

    /// Tells the algorithm the current epoch (0-based), passed on to its compressor for
    /// schedules such as DGC's sparsity warm-up. The default does nothing.
    fn set_epoch(&mut self, _epoch: usize) {}

    /// Every peer this peer may send a frame to during the run, ascending, without itself:
    /// the driver opens a link to each before the first round.
    fn out_peers(&self) -> Vec<Rank>;

    /// Every peer that may send this peer a frame during the run, ascending, without
    /// itself: the driver waits for each one's goodbye before it shuts down.
    fn in_peers(&self) -> Vec<Rank>;

    /// Whether [`Gossip::peer_left`] and [`Gossip::peer_rejoined`] use their mixing matrix:
    /// `true` (the default) for algorithms on a doubly stochastic W, which the survivors
    /// must re-weight ([`murmur_topology::MixingMatrix::without_peers`]); `false` for
    /// push-sum ([`Sgp`]), which only stops pushing to a departed peer, so a directed graph
    /// (where Metropolis–Hastings re-weighting is impossible) can lose a peer too.
    fn reweights(&self) -> bool {
        true
    }

    /// The peers that send this peer a frame for round `round`, ascending, without itself
    /// (a subset of [`Gossip::in_peers`]; the default is all of them). A returning peer
    /// waits for these frames of its first round before it begins it.
    fn in_peers_at(&self, round: u64) -> Vec<Rank> {
        let _ = round;
        self.in_peers()
    }

    /// Peer `gone` left the run (its process died or its links were lost). `w` (n×n) is the
    /// mixing matrix the survivors use from the next round on; every survivor must compute
    /// the same one from the same list of departed peers
    /// ([`murmur_topology::MixingMatrix::without_peers`]). The round that is mixing stops
    /// waiting for `gone`: a contribution of `gone` not yet received is replaced by this
    /// peer's own value (its weight folded onto the diagonal for that round, so the row
    /// still sums to 1), and no frame goes to `gone` any more. A peer that is not a
    /// neighbour changes only its weights. Frames from `gone` are refused from now on.
    ///
    /// # Errors
    /// [`MembershipError::Unsupported`] if the algorithm cannot continue without a peer
    /// (the default); [`MembershipError::BadMatrix`] if `w` does not fit.
    fn peer_left(&mut self, gone: Rank, w: &MixingMatrix) -> Result<(), MembershipError> {
        let _ = (gone, w);
        Err(MembershipError::Unsupported {
            algorithm: "this algorithm",
            why: "it has no re-weighting after a departure",
        })
    }

    /// Peer `back`, which left, returns from round `at` on: from then on this peer uses `w`
    /// (n×n; every peer must compute the same one from the same membership) and, if `back`
    /// is a neighbour, sends it frames and waits for its frames again (frames for `at` may
    /// arrive early, like any neighbour's). A peer that is not a neighbour changes only its
    /// weights, at `at` or, if it is already past `at`, from its next round.
    ///
    /// # Errors
    /// [`MembershipError::Unsupported`] (the default); [`MembershipError::BadMatrix`];
    /// [`MembershipError::TooLate`] if `back` is a neighbour and round `at` has already begun.
    fn peer_rejoined(
        &mut self,
        back: Rank,
        w: &MixingMatrix,
        at: u64,
    ) -> Result<(), MembershipError> {
        let _ = (back, w, at);
        Err(MembershipError::Unsupported {
            algorithm: "this algorithm",
            why: "it cannot take a peer back",
        })
    }

    /// What a restarted or joining peer takes from its donors beside x, fetched in parts as
    /// x is: state that its neighbours hold alike, not state of each peer's own. Empty (the
    /// default) for the algorithms whose state beyond x is their own (a compressor's error
    /// feedback) or rebuilt by protocol (CHOCO-SGD's copies of its neighbours). DiLoCo's
    /// gossip form: its anchor `[d]`, then its outer optimizer's velocity (`[d]` with
    /// Nesterov momentum, `[0]` for plain averaging).
    fn catch_up_state(&self) -> Vec<f32> {
        Vec::new()
    }

    /// Takes `state`, a donor's [`Gossip::catch_up_state`], before this peer's first round.
    ///
    /// # Errors
    /// A length other than this peer's own [`Gossip::catch_up_state`]'s; nothing changed.
    fn take_catch_up_state(&mut self, state: &[f32]) -> Result<(), StateError> {
        match state.len() {
            0 => Ok(()),
            n => Err(StateError(format!(
                "a catch-up state of {n} values for an algorithm that takes none"
            ))),
        }
    }

    /// The round `at` (at or after `earliest`, the driver's rounds) from which a restarted
    /// peer mixes again: the first that exchanges frames. `earliest` for the algorithms that
    /// exchange every round (the default); DiLoCo's next outer step, so that the returning
    /// peer waits for its neighbours' frames no longer than one inner step.
    fn rejoin_round(&self, earliest: u64) -> u64 {
        earliest
    }

    /// The round that frames exchanged in the driver's round `round` carry in their header:
    /// `round` itself (the default); ⌊round / H⌋ for DiLoCo, whose inner algorithm counts
    /// its outer steps. A rejoining peer waits for its in-neighbours' frames of
    /// `frame_round(at)`.
    fn frame_round(&self, round: u64) -> u64 {
        round
    }

    /// Moves a state machine that has not begun any round to round `round`: a restarted peer
    /// that rejoins a run mid-way (its neighbours admit it at that round with
    /// [`Gossip::peer_rejoined`]).
    ///
    /// # Errors
    /// [`MembershipError::Unsupported`] (the default).
    ///
    /// # Panics
    /// If a round has begun (a driver bug).
    fn start_at_round(&mut self, round: u64) -> Result<(), MembershipError> {
        let _ = round;
        Err(MembershipError::Unsupported {
            algorithm: "this algorithm",
            why: "it cannot start mid-run",
        })
    }

    /// The algorithm's state beyond x and the round, for a checkpoint (see
    /// [`AlgorithmState`]). Read between rounds. The default is the compressor-free empty
    /// state.
    fn state(&self) -> AlgorithmState {
        AlgorithmState::default()
    }

    /// Restores a state saved by [`Gossip::state`] of the same algorithm and d, after
    /// [`Gossip::start_at_round`] and before the first round; the parameters come in
    /// through [`Gossip::begin_round`] as usual. An empty state changes nothing.
    ///
    /// # Errors
    /// [`StateError`] if the state is not this algorithm's (names, lengths, values); the
    /// state machine is unchanged then.
    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        if state.is_empty() {
            Ok(())
        } else {
            Err(StateError(
                "this algorithm keeps no state beyond x and the round".into(),
            ))
        }
    }

    /// A bandwidth sample from the transport: a frame of `bytes` bytes from `from` took
    /// `secs` seconds from its first to its last byte. Algorithms that choose per link how
    /// much to send use it ([`ChocoAuto`]); the others ignore it (the default).
    fn observe_link(&mut self, from: Rank, bytes: usize, secs: f64) {
        let _ = (from, bytes, secs);
    }

    /// Per link, the measured bandwidth and what was chosen ([`ChocoAuto`]: the operator,
    /// [`algorithms::local_auto::AsyncLinks`]: the period); empty for algorithms that treat every link alike (the
    /// default).
    fn link_choices(&self) -> Vec<LinkChoice> {
        Vec::new()
    }

    /// Whether this state machine's messages keep moving between rounds (Streaming DiLoCo's
    /// fragment all-reduce runs behind the next inner steps): a driver should then hand it
    /// the frames that arrive while a gradient is computed, not only at round boundaries.
    fn communicates_in_background(&self) -> bool {
        false
    }

    /// Whether a round's outgoing frames do not depend on its gradient, so that the driver
    /// may begin the round with `grad = None`, compute the gradient while the frames move,
    /// and hand it over with [`Gossip::apply_gradient`] after [`GossipEvent::Mixed`]
    /// (communication hidden behind computation, Lian et al. 2017 §3). The default is
    /// `false`.
    fn overlaps_gradient(&self) -> bool {
        false
    }

    /// For an algorithm whose [`Gossip::overlaps_gradient`] is `true`, after the
    /// [`GossipEvent::Mixed`] of a round begun with `grad = None`: applies the local update
    /// `x_i ← x_i − η·grad` (`grad: [d]`) to the mixed parameters.
    ///
    /// # Panics
    /// If the algorithm does not overlap, a round is mixing, or `grad` is not `[d]` (driver
    /// bugs).
    fn apply_gradient(&mut self, _grad: &[f32]) {
        panic!("this algorithm takes its gradient in begin_round; it does not overlap");
    }

    /// For an algorithm whose [`Gossip::overlaps_gradient`] is `true`, while a round begun
    /// with `grad = None` is mixing: its gradient `grad: [d]` is known, and the driver will
    /// begin the next round from this round's result, x_i − η·grad, with nothing changed in
    /// between. An algorithm that mixes x in parts ([`mixing::streaming`]) then applies it
    /// to each part as that part has mixed and begins that part's next round at once, so a
    /// large model's next frames leave while the rest of this round still arrives.
    /// [`Gossip::apply_gradient`] still follows [`GossipEvent::Mixed`] and applies `grad`
    /// only where this did not. The default ignores it.
    ///
    /// # Panics
    /// If `grad` is not `[d]` (a driver bug).
    fn stream_next(&mut self, now: Instant, grad: &[f32]) {
        let _ = (now, grad);
    }
}

/// Parses `frame` received from peer `from` (the transport's sender) and checks what every
/// algorithm checks first: the header (magic, version, length ≤ `max_payload_bytes`), the
/// kind `expected`, and that the header's sender is `from`. Returns the header and the
/// payload.
///
/// # Errors
/// [`GossipError::Frame`], [`GossipError::WrongKind`], [`GossipError::SenderMismatch`].
pub(crate) fn parse_frame(
    frame: &[u8],
    max_payload_bytes: u32,
    expected: FrameKind,
    from: Rank,
) -> Result<(FrameHeader, &[u8]), GossipError> {
    let (h, payload) = FrameHeader::parse(frame, max_payload_bytes)?;
    if h.kind != expected {
        return Err(GossipError::WrongKind(h.kind));
    }
    if h.sender != from {
        return Err(GossipError::SenderMismatch {
            from,
            claimed: h.sender,
        });
    }
    Ok((h, payload))
}

/// Sorted, deduplicated ranks without `me`: the shape of [`Gossip::out_peers`] and
/// [`Gossip::in_peers`].
pub fn peer_set(me: Rank, ranks: impl IntoIterator<Item = Rank>) -> Vec<Rank> {
    let mut v: Vec<Rank> = ranks.into_iter().filter(|&r| r != me).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Consensus distance Ξ² = (1/n) Σ_i ‖x_i − x̄‖² of the vectors `xs: n × [d]`, and `x̄: [d]`.
///
/// Computed in `f64`. Returns `(0, [])` for no vectors.
///
/// # Panics
/// If the vectors have different lengths.
pub fn consensus_distance<'a>(xs: impl IntoIterator<Item = &'a [f32]> + Clone) -> (f64, Vec<f32>) {
    let mut n = 0usize;
    let mut mean: Vec<f64> = Vec::new();
    for x in xs.clone() {
        if n == 0 {
            mean = vec![0.0; x.len()];
        }
        assert_eq!(
            x.len(),
            mean.len(),
            "all parameter vectors must have length d"
        );
        for (m, v) in mean.iter_mut().zip(x) {
            *m += *v as f64;
        }
        n += 1;
    }
    if n == 0 {
        return (0.0, Vec::new());
    }
    for m in &mut mean {
        *m /= n as f64;
    }
    let mut total = 0.0;
    for x in xs {
        total += x
            .iter()
            .zip(&mean)
            .map(|(v, m)| (*v as f64 - m).powi(2))
            .sum::<f64>();
    }
    (
        total / n as f64,
        mean.into_iter().map(|m| m as f32).collect(),
    )
}
