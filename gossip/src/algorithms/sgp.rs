//! SGP: Stochastic Gradient Push, decentralized SGD on directed and time-varying graphs by
//! push-sum averaging (Assran, Loizou, Ballas & Rabbat 2019, "Stochastic Gradient Push for
//! Distributed Deep Learning", ICML, Algorithm 1, and its overlap variant OSGP), built on the
//! push-sum protocol of Kempe, Dobra & Gehrke 2003 ("Gossip-based computation of aggregate
//! information", FOCS).
//!
//! # The update
//!
//! Notation of Assran et al.: n peers; in round (iteration) k a column-stochastic n×n matrix
//! P^(k) (p_ji^(k) ≠ 0 only for j = i or i → j an edge of round k; Σ_j p_ji^(k) = 1 for
//! every i), given by a [`PushSchedule`]. Every peer i holds a numerator x_i (`[d]`) and a
//! scalar push-sum weight w_i (w_i^(0) = 1), and exposes the de-biased parameters
//! z_i = x_i / w_i ([`Gossip::params`]). Round k, with γ = [`SgpConfig::lr`] and g_i the
//! stochastic gradient evaluated at z_i^(k) (passed to [`Gossip::begin_round`]):
//!
//! ```text
//! x_i^(k+½) = x_i^(k) − γ g_i                                   (gradient on the numerator)
//! x_i^(k+1) = Σ_j p_ij^(k) x_j^(k+½)                            (push: keep p_ii, send p_ji)
//! w_i^(k+1) = Σ_j p_ij^(k) w_j^(k)
//! z_i^(k+1) = x_i^(k+1) / w_i^(k+1)
//! ```
//!
//! Because P^(k) is only column stochastic, the plain numerators x_i are biased towards
//! peers with many in-edges; the weights w_i carry exactly that bias, so z_i is de-biased.
//! Mass is conserved: Σ_i x_i and Σ_i w_i = n (plus the shares in flight) are invariant
//! under the push (x_i in `f32` and w_i in `f64`, up to rounding), so with γ = 0 every z_i converges to the average of the x_i^(0) (exactly after
//! ⌈log2 n⌉ rounds on the one-peer exponential schedule when n is a power of two;
//! geometrically on any B-strongly-connected schedule). No doubly stochastic W, no
//! symmetric links and no replies are needed: a peer never waits for the peers it sends to.
//!
//! The driver hands back z at the next [`Gossip::begin_round`]; the numerator is recovered as
//! x_i = w_i·z_i (bit-exactly: when z is what [`Gossip::params`] returned, x_i is kept as
//! is, so a driver that does not touch the parameters does not perturb the mass).
//!
//! # Gradient placement
//!
//! With a gradient in `begin_round` the frames carry x_i^(k+½), as above ("adapt then
//! combine", SGP's Algorithm 1). With [`SgpConfig::tau`] = 0 the peer also
//! [overlaps](Gossip::overlaps_gradient): begin the round with `grad = None`, compute the
//! gradient while the frames move, and hand it to [`Gossip::apply_gradient`] after
//! [`GossipEvent::Mixed`], which sets x_i ← x_i − γ g_i on the mixed numerator ("combine then
//! adapt", the form of D-PSGD: x^(k+1) = P^(k) x^(k) − γ g). Both conserve the same total
//! mass Σ_i x_i − γ Σ_i g_i; the individual z_i differ unless P^(k) is also row stochastic
//! and the gradients agree.
//!
//! # Overlap: τ (OSGP)
//!
//! [`SgpConfig::tau`] = τ bounds how stale an in-peer's share may be when a round ends.
//! * τ = 0 (synchronous SGP): round k completes ([`GossipEvent::Mixed`]) once the round-k
//!   frames of all in-peers of round k are absorbed.
//! * τ ≥ 1 (OSGP): round k completes once every in-peer's frames up to round k − τ are
//!   absorbed (rounds k < τ complete at once). Frames of any round ≤ k that arrive while
//!   round k is mixing are absorbed as they come. Push-sum stays exact because it never
//!   matters *when* a share is added: Σ_i x_i + in-flight shares is invariant, and the
//!   weights that travel with the shares de-bias the result.
//!
//! Frames that arrive while no round is mixing, or for a round after the mixing one, are
//! validated in full, buffered and absorbed when their round (or a later one) begins, so
//! [`Gossip::params`] never changes between [`GossipEvent::Mixed`] and the next
//! `begin_round` (the driver computes its gradient at that z and hands it back).
//!
//! # Stragglers: the skip policy
//!
//! With [`SgpConfig::skip_after`] = Δ, round k waits Δ for the shares of its awaited round
//! k − τ and then completes without those that have not arrived; they are *late*, not
//! dropped: a late share is absorbed whenever it comes, in a later round. Push-sum stays
//! exact for the same reason as OSGP — Σ_i x_i + in-flight shares is invariant whenever a
//! share is added, so each P^(k) stays column stochastic on the graph with delayed edges
//! (Assran et al. 2019 analyse SGP with bounded delays) — and no notice goes back to the
//! straggler, so directed and time-varying graphs can skip as well. The delay is bounded:
//! round k waits (up to the round timeout) for every late share of rounds
//! ≤ k − τ − [`SKIP_STALENESS`], so a peer runs at most τ + 8 rounds ahead of an in-peer
//! and the in-peers' lead bound [`max_lead`] is taken with τ + 8. A late share counts once
//! in [`GossipStats::skipped`] when its round gives up waiting for it.
//!
//! # Accepted rounds
//!
//! With r = [`Gossip::round`] (the mixing round, or the next round when idle),
//! L = [`SgpConfig::max_lead_rounds`] and S = τ (τ + [`SKIP_STALENESS`] under the skip
//! policy), a frame for round s is accepted iff `r − S ≤ s ≤ r + L` while mixing
//! (`r + L − 1` when idle; the lower end saturates at 0), and for s < r − τ only if it is a
//! late share.
//! Refused with [`GossipError::RoundOutOfWindow`]: rounds below `r − τ` (every frame of those
//! rounds was already absorbed, so such a frame is a replay or forged) and rounds above the
//! lead an honest in-peer can have (see [`max_lead`]). A sender that is an in-peer of some
//! round but not of the frame's round is refused with [`GossipError::NotANeighbour`]; a
//! second frame for the same (sender, round) with [`GossipError::Duplicate`].
//!
//! # Wire format
//!
//! One [`FrameKind::PushSum`] frame per out-peer j of round k, the same bytes for each:
//! the 24-byte [frame header](crate::frame) (round = the sender's round k, dim = d), then
//! the payload:
//!
//! ```text
//! offset size field
//!      0    8 p       f64 LE, mixing weight p_ji ∈ (0, 1]: the share of the sender's mass
//!                     that the receiver adds
//!      8    8 weight  f64 LE, the sender's push-sum weight w_i ∈ (0, n] before the split
//!     16    … message a murmur_compress message of x_i: [d] before the split (header,
//!                     then the operator's payload; identity = 12 + 4d bytes)
//! ```
//!
//! Receiver j adds x_j += p·decode(message) ([`murmur_compress::decode_add`] with scale p)
//! and w_j += p·weight. Everything is checked before the state changes: the frame header,
//! kind, sender, round window and round's in-peers, duplicates, the 16-byte prefix (present,
//! p finite in (0, 1], weight finite in (0, n]; [`GossipError::BadWeight`]) and the whole
//! message ([`murmur_compress::validate`]).
//!
//! A lossy compressor gives "SGP with compressed models": the receiver adds p·C(x_i) while
//! the sender keeps p_ii·x_i, so mass is only conserved in expectation for an unbiased
//! operator, and not at all for a biased one.
//!
//! # Departures and returns
//!
//! Push-sum needs no re-weighting when a peer leaves (Assran et al. 2019 §3: only column
//! stochasticity matters): after [`Gossip::peer_left`] this peer stops pushing to the
//! departed peer — from the next round its share stays here, so this peer keeps
//! 1 − p·|out-peers still there| of its mass and every push still carries the schedule's
//! p — and stops waiting for its frames. A frame of the mixing round not yet handed to the
//! transport is taken back (its share kept). The mass the departed peer held, and shares
//! already pushed to it, leave the network with it; x_i and w_i lose in proportion, so the
//! survivors' z_i still reach a common value (a weighted average of the survivors' mass),
//! provided the schedule stays strongly connected without it
//! ([`murmur_topology::Graph::strongly_connected_without`] on its union graph). A returning
//! peer ([`Gossip::peer_rejoined`]) is pushed to and waited for again from the round it
//! mixes from; it starts with push-sum weight 1 ([`Gossip::start_at_round`]).
//!
//! # Cost
//!
//! Per round: one compression of x_i, |out_k(i)| frames of 24 + 16 + message bytes
//! (identity: 52 + 4d bytes each, one frame per round on the one-peer schedule), one
//! [`murmur_compress::decode_add`] per received frame, O(d) for the split and for z.
//! Memory: x_i and z_i (2d `f32`), the outgoing frame, and at most (S + L) × in-degree
//! buffered payloads.

use crate::algorithm::{
    Algorithm, Capabilities, Compresses, Departures, GraphNeeds, Pattern, ProtocolOption, Resume,
};
use murmur_compress::CompressorSpec;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use murmur_compress::{Compressor, DecodeError, Identity};
use murmur_topology::PushSchedule;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::frame::{reuse, FrameHeader, FrameKind, FRAME_HEADER_LEN};
use crate::{Bytes, Gossip, GossipError, GossipEvent, GossipStats, Rank, Transmit};

/// Bytes of a [`FrameKind::PushSum`] payload in front of the compressed message: the mixing
/// weight p and the push-sum weight, both `f64` LE.
pub const PUSH_SUM_PREFIX_LEN: usize = 16;

/// Configuration of one SGP peer.
#[derive(Debug, Clone)]
pub struct SgpConfig {
    /// This peer's rank i, `< schedule.n()`.
    pub rank: Rank,
    /// Who pushes to whom in every round, and the push weights (the same for every peer).
    pub schedule: PushSchedule,
    /// Learning rate γ (η elsewhere in murmur) applied to the gradient on the numerator.
    pub lr: f32,
    /// How long a round may wait for its frames before [`GossipEvent::RoundTimedOut`].
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
    /// Seed of the RNG handed to randomised compressors.
    pub seed: u64,
    /// Overlap bound τ in rounds: round k completes once the in-peers' frames up to round
    /// k − τ are absorbed (0 = synchronous SGP). See the [module docs](self).
    pub tau: u64,
    /// How many rounds past this peer's an in-peer's frame may be (≥ 1); frames further
    /// ahead are refused. [`SgpConfig::new`] and [`SgpConfig::with_tau`] set it to
    /// [`max_lead`], the most an honest in-peer can be ahead.
    pub max_lead_rounds: u64,
    /// Straggler policy "skip": how long a round waits for the in-peers' shares before it
    /// completes without the late ones (`None`: wait, up to `round_timeout`). Set with
    /// [`SgpConfig::with_skip`]; see the [module docs](self#stragglers-the-skip-policy).
    pub skip_after: Option<Duration>,
}

pub use crate::SKIP_STALENESS;

impl SgpConfig {
    /// The synchronous (τ = 0) configuration of peer `rank` on `schedule` with γ = `lr`, a
    /// 60 s round timeout, a payload limit of 16 bytes per parameter plus 1 KiB for `d`
    /// parameters, seed = rank, and `max_lead_rounds` = [`max_lead`].
    ///
    /// # Panics
    /// If `rank >= schedule.n()`.
    pub fn new(schedule: PushSchedule, rank: Rank, lr: f32, d: usize) -> Self {
        assert!(
            rank < schedule.n(),
            "rank {rank} out of range for n = {}",
            schedule.n()
        );
        let max_lead_rounds = max_lead(&schedule, rank, 0);
        SgpConfig {
            rank,
            schedule,
            lr,
            round_timeout: Duration::from_secs(60),
            max_payload_bytes: u32::try_from(16 * d + 1024).unwrap_or(u32::MAX),
            seed: rank as u64,
            tau: 0,
            max_lead_rounds,
            skip_after: None,
        }
    }

    /// The same configuration with overlap bound `tau` (OSGP for τ ≥ 1), and
    /// `max_lead_rounds` recomputed for it.
    pub fn with_tau(mut self, tau: u64) -> Self {
        self.tau = tau;
        self.max_lead_rounds = max_lead(&self.schedule, self.rank, self.slack());
        self
    }

    /// The same configuration with the straggler policy `skip_after` (`Some`: skip after
    /// that long), and `max_lead_rounds` recomputed for it: a peer may then run up to
    /// τ + [`SKIP_STALENESS`] rounds ahead of an in-peer instead of τ.
    pub fn with_skip(mut self, skip_after: Option<Duration>) -> Self {
        self.skip_after = skip_after;
        self.max_lead_rounds = max_lead(&self.schedule, self.rank, self.slack());
        self
    }

    /// How many rounds old a share may be when a round completes: τ, plus
    /// [`SKIP_STALENESS`] under the skip policy.
    fn slack(&self) -> u64 {
        self.tau
            + if self.skip_after.is_some() {
                SKIP_STALENESS
            } else {
                0
            }
    }
}

/// The most rounds an honest in-peer j of `rank` can be ahead, in rounds: the largest
/// `s − k` over the in-peers j (of any round) and the phases of the schedule, where k is the
/// round `rank` is mixing and s a round j may already have sent.
///
/// Peer v cannot begin round k' + 1 + τ before every in-peer u of round k' has begun round
/// k' (it needs u's round-k' frame), so a time-respecting path from `rank` starting in round
/// k + 1 bounds how far each peer can run while `rank` is still in round k; this is the
/// earliest-arrival search along such paths (Dijkstra, O(period² · E · log n) for E edges
/// per round). Peers that `rank` cannot reach are not held back by it; for those the bound
/// falls back to n · period · (1 + τ) rounds. At least 1.
///
/// # Panics
/// If `rank >= schedule.n()`.
pub fn max_lead(schedule: &PushSchedule, rank: Rank, tau: u64) -> u64 {
    max_lead_without(schedule, rank, tau, &[])
}

/// [`max_lead`] once the peers in `gone` have left: they hold nobody back any more, so the
/// survivors' time-respecting paths are longer and an in-peer can run further ahead (on
/// the one-peer exponential graph of 6, peer 2's bound is 3 rounds, 4 without peer 3; a
/// frame 3 rounds ahead was refused in a run before this was accounted for, and the round
/// it belonged to never completed). Departed in-peers are left out.
///
/// # Panics
/// If `rank >= schedule.n()`.
pub fn max_lead_without(schedule: &PushSchedule, rank: Rank, tau: u64, gone: &[Rank]) -> u64 {
    let n = schedule.n();
    assert!(rank < n, "rank {rank} out of range for n = {n}");
    let period = schedule.period();
    let in_peers = schedule.all_in_peers(rank);
    let fallback = (n as u64).saturating_mul(period).saturating_mul(1 + tau);
    let mut lead = 1u64;
    for k in 0..period {
        // blocked[v]: the first round v cannot begin while `rank` has not begun k + 1.
        let mut blocked = vec![u64::MAX; n];
        let mut heap = BinaryHeap::from([Reverse((k + 1, rank))]);
        blocked[rank] = k + 1;
        while let Some(Reverse((b, u))) = heap.pop() {
            if b > blocked[u] {
                continue;
            }
            for s in b..b + period {
                for v in schedule.out_peers(s, u) {
                    if gone.contains(&v) {
                        continue;
                    }
                    let cand = s + 1 + tau;
                    if cand < blocked[v] {
                        blocked[v] = cand;
                        heap.push(Reverse((cand, v)));
                    }
                }
            }
        }
        for &j in in_peers.iter().filter(|j| !gone.contains(j)) {
            // j's frames can be for rounds up to blocked[j] − 1.
            let l = match blocked[j] {
                u64::MAX => fallback,
                b => b - 1 - k,
            };
            lead = lead.max(l);
        }
    }
    lead
}

/// A validated frame held for a later round: the share's mixing weight p, the sender's
/// push-sum weight and its `murmur_compress` message.
struct Share {
    p: f64,
    weight: f64,
    message: Vec<u8>,
}

/// One peer of SGP as a sans-I/O state machine (see the [module docs](self)).
pub struct Sgp {
    cfg: SgpConfig,
    compressor: Box<dyn Compressor>,
    rng: StdRng,
    /// Numerator x_i: [d].
    x: Vec<f32>,
    /// Push-sum weight w_i.
    weight: f64,
    /// De-biased parameters z_i = x_i / w_i: [d], refreshed when a round begins (after the
    /// gradient) and when it completes.
    z: Vec<f32>,
    /// Every peer that pushes to this one in some round (sorted).
    in_all: Vec<Rank>,
    /// The mixing round, or the next round to begin when idle.
    round: u64,
    mixing: bool,
    deadline: Option<Instant>,
    /// (round, sender) of the frames absorbed for rounds not yet below the window.
    absorbed: BTreeSet<(u64, Rank)>,
    /// Validated shares waiting for their round (or a later one) to begin.
    early: BTreeMap<(u64, Rank), Share>,
    /// This round's frame (header + payload), the same for every out-peer.
    outgoing: Bytes,
    /// This round's out-peers and the next one to hand a frame to.
    out_now: Vec<Rank>,
    next_out: usize,
    events: VecDeque<GossipEvent>,
    stats: GossipStats,
    /// Peers that left: peer → the first round it mixes in again (`u64::MAX` while gone).
    absent: BTreeMap<Rank, u64>,
    /// The mixing round's push weight p and the fraction of the round's mass kept here.
    share: (f64, f64),
    /// The first round this state machine mixed (0, or where a returning peer started):
    /// frames of earlier rounds are neither awaited nor accepted.
    start_round: u64,
    /// Skip policy: when the mixing round stops waiting for the awaited round's shares.
    skip_deadline: Option<Instant>,
    /// Skip policy: (round, in-peer) shares a round completed without, not absorbed yet.
    late: BTreeSet<(u64, Rank)>,
}

impl Sgp {
    /// A peer starting from `x0: [d]` with push-sum weight 1, sending identity-compressed
    /// numerators.
    ///
    /// # Panics
    /// If `cfg.rank >= cfg.schedule.n()`.
    pub fn new(cfg: SgpConfig, x0: Vec<f32>) -> Self {
        Self::with_compressor(cfg, x0, Box::new(Identity))
    }

    /// A peer starting from `x0: [d]` with push-sum weight 1 that compresses its numerators
    /// with `compressor` (see the [module docs](self) on lossy operators).
    ///
    /// # Panics
    /// If `cfg.rank >= cfg.schedule.n()`.
    pub fn with_compressor(cfg: SgpConfig, x0: Vec<f32>, compressor: Box<dyn Compressor>) -> Self {
        let n = cfg.schedule.n();
        assert!(cfg.rank < n, "rank {} out of range for n = {n}", cfg.rank);
        Sgp {
            rng: StdRng::seed_from_u64(cfg.seed),
            in_all: cfg.schedule.all_in_peers(cfg.rank),
            compressor,
            z: x0.clone(),
            x: x0,
            weight: 1.0,
            round: 0,
            mixing: false,
            deadline: None,
            absorbed: BTreeSet::new(),
            early: BTreeMap::new(),
            outgoing: Bytes::new(),
            out_now: Vec::new(),
            next_out: 0,
            events: VecDeque::new(),
            stats: GossipStats::default(),
            absent: BTreeMap::new(),
            share: (1.0, 1.0),
            start_round: 0,
            skip_deadline: None,
            late: BTreeSet::new(),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SgpConfig {
        &self.cfg
    }

    /// The numerator x_i, `[d]`.
    pub fn numerator(&self) -> &[f32] {
        &self.x
    }

    /// The push-sum weight w_i (1 at the start; Σ_i w_i = n network-wide, in-flight included).
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// The mass this peer holds, in `f64`: its numerator x_i (`[d]`) and weight w_i plus the
    /// shares p·x_j and p·w_j it has buffered but not absorbed yet. Summed over all peers
    /// and the frames in flight, this is invariant (for the identity compressor, up to
    /// `f32` rounding). Costs O(d) per buffered share; for tests and diagnostics.
    pub fn held_mass(&self) -> (Vec<f64>, f64) {
        let mut x: Vec<f64> = self.x.iter().map(|&v| f64::from(v)).collect();
        let mut w = self.weight;
        let mut scratch = vec![0.0f32; x.len()];
        for share in self.early.values() {
            scratch.fill(0.0);
            // Validated on arrival; a failure leaves scratch at zero.
            let _ = murmur_compress::decode_add(&share.message, share.p as f32, &mut scratch);
            for (a, s) in x.iter_mut().zip(&scratch) {
                *a += f64::from(*s);
            }
            w += share.p * share.weight;
        }
        (x, w)
    }

    fn d(&self) -> usize {
        self.x.len()
    }

    /// z_i = x_i / w_i, divided in `f64`.
    fn refresh_z(&mut self) {
        let w = self.weight;
        for (z, x) in self.z.iter_mut().zip(&self.x) {
            *z = (f64::from(*x) / w) as f32;
        }
    }

    /// Whether `peer` is out of the run in round `round` (it left and is not back yet).
    fn is_absent(&self, peer: Rank, round: u64) -> bool {
        self.absent.get(&peer).is_some_and(|&back| round < back)
    }

    /// Lowest and highest round accepted now (see the module docs; below round − τ, only
    /// late shares are accepted).
    fn window(&self) -> (u64, u64) {
        let lo = self
            .round
            .saturating_sub(self.cfg.slack())
            .max(self.start_round);
        let hi = self
            .round
            .saturating_add(self.cfg.max_lead_rounds.max(1))
            .saturating_sub(u64::from(!self.mixing));
        (lo, hi)
    }

    /// The round whose in-peers' frames the mixing round waits for, if any.
    fn awaited_round(&self) -> Option<u64> {
        self.round
            .checked_sub(self.cfg.tau)
            .filter(|&s| s >= self.start_round)
    }

    /// The in-peers the mixing round waits for, ascending: those of the awaited round whose
    /// share has not been absorbed (and was not given up as late), and under the skip
    /// policy those of a late share [`SKIP_STALENESS`] rounds older than the awaited round.
    fn missing(&self) -> Vec<Rank> {
        let Some(s) = self.awaited_round() else {
            return Vec::new();
        };
        let mut missing: Vec<Rank> = self
            .cfg
            .schedule
            .in_peers(s, self.cfg.rank)
            .into_iter()
            .filter(|&j| {
                !self.absorbed.contains(&(s, j))
                    && !self.is_absent(j, s)
                    && !self.late.contains(&(s, j))
            })
            .collect();
        if let Some(stale) = s.checked_sub(SKIP_STALENESS) {
            missing.extend(self.late.range(..=(stale, Rank::MAX)).map(|&(_, j)| j));
            missing.sort_unstable();
            missing.dedup();
        }
        missing
    }

    /// Adds p·x_j and p·w_j. The message was validated, so this cannot fail half-way; on
    /// `Err` nothing changed.
    fn absorb(&mut self, round: u64, from: Rank, share: &Share) -> Result<(), GossipError> {
        murmur_compress::decode_add(&share.message, share.p as f32, &mut self.x).map_err(
            |source| GossipError::Payload {
                from,
                cause: source,
            },
        )?;
        self.weight += share.p * share.weight;
        self.absorbed.insert((round, from));
        self.late.remove(&(round, from));
        Ok(())
    }

    fn finish_if_complete(&mut self) {
        if !self.mixing || !self.missing().is_empty() {
            return;
        }
        self.mixing = false;
        self.deadline = None;
        self.skip_deadline = None;
        self.refresh_z();
        self.events
            .push_back(GossipEvent::Mixed { round: self.round });
        self.round += 1;
        // Frames of rounds below the new window's low end can no longer be accepted.
        let lo = self.round.saturating_sub(self.cfg.slack());
        self.absorbed = self.absorbed.split_off(&(lo, 0));
    }

    /// Parses and checks the payload prefix; returns the share with its message validated
    /// against d.
    fn parse_share(&self, from: Rank, payload: &[u8]) -> Result<Share, GossipError> {
        let (prefix, message) = match payload.split_first_chunk::<PUSH_SUM_PREFIX_LEN>() {
            Some(split) => split,
            None => {
                return Err(GossipError::Payload {
                    from,
                    cause: DecodeError::Truncated {
                        needed: PUSH_SUM_PREFIX_LEN,
                        got: payload.len(),
                    },
                })
            }
        };
        let (p_bytes, w_bytes) = prefix.split_at(8);
        let p = f64::from_le_bytes(p_bytes.try_into().expect("8 bytes"));
        let weight = f64::from_le_bytes(w_bytes.try_into().expect("8 bytes"));
        if !(p > 0.0 && p <= 1.0) {
            return Err(GossipError::BadWeight {
                from,
                field: "p",
                value: p,
                lo: 0.0,
                hi: 1.0,
            });
        }
        // Σ_i w_i = n network-wide, so an honest share's weight is at most n.
        let n = self.cfg.schedule.n() as f64;
        if !(weight > 0.0 && weight <= n * (1.0 + 1e-6)) {
            return Err(GossipError::BadWeight {
                from,
                field: "weight",
                value: weight,
                lo: 0.0,
                hi: n,
            });
        }
        murmur_compress::validate(message, self.d()).map_err(|source| GossipError::Payload {
            from,
            cause: source,
        })?;
        Ok(Share {
            p,
            weight,
            message: message.to_vec(),
        })
    }
}

impl Gossip for Sgp {
    /// `x` is z_i, what [`Gossip::params`] returned (x0 on round 0): the numerator becomes
    /// w_i·z_i, is kept bit-exact when `x` is unchanged, then takes the gradient step.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
        let d = self.d();
        assert_eq!(x.len(), d, "x must have length d");
        let unchanged = x
            .iter()
            .zip(&self.z)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !unchanged {
            let w = self.weight;
            for (xi, zi) in self.x.iter_mut().zip(x) {
                *xi = (f64::from(*zi) * w) as f32;
            }
        }
        if let Some(g) = grad {
            assert_eq!(g.len(), d, "grad must have length d");
            let lr = self.cfg.lr;
            for (xi, gi) in self.x.iter_mut().zip(g) {
                *xi -= lr * gi;
            }
        }
        self.refresh_z();

        let t = self.round;
        let rank = self.cfg.rank;
        let p = self.cfg.schedule.push_weight(t, rank);
        let scheduled = self.cfg.schedule.out_peers(t, rank);
        let pushes = scheduled.len();
        self.out_now = scheduled
            .into_iter()
            .filter(|&j| !self.is_absent(j, t))
            .collect();
        // Keep p_ii = p, plus the share of every out-peer that has left.
        let keep = if self.out_now.len() == pushes {
            p
        } else {
            1.0 - p * self.out_now.len() as f64
        };
        self.share = (p, keep);
        self.next_out = 0;
        let mut out = reuse(std::mem::take(&mut self.outgoing));
        if !self.out_now.is_empty() {
            out.resize(FRAME_HEADER_LEN, 0);
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&self.weight.to_le_bytes());
            let len = self.compressor.compress(&self.x, &mut self.rng, &mut out);
            let header = FrameHeader {
                kind: FrameKind::PushSum,
                sender: rank,
                round: t,
                dim: d as u32,
                payload_len: (PUSH_SUM_PREFIX_LEN + len) as u32,
            };
            out[..FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
        }
        self.outgoing = Bytes::from(out);
        // Keep p_ii of the mass; each out-peer adds p_ji = p of what was encoded.
        let keep32 = keep as f32;
        self.x.iter_mut().for_each(|v| *v *= keep32);
        self.weight *= keep;

        self.mixing = true;
        self.deadline = Some(now + self.cfg.round_timeout);
        self.skip_deadline = self.cfg.skip_after.map(|after| now + after);
        // Shares buffered for this round or earlier ones: absorb them now, oldest first.
        let later = self.early.split_off(&(t + 1, 0));
        for ((s, from), share) in std::mem::replace(&mut self.early, later) {
            if let Err(e) = self.absorb(s, from, &share) {
                // Validated on arrival, so this cannot happen; keep the error path rather
                // than trusting that invariant with a panic.
                debug_assert!(false, "buffered share failed late: {e}");
            }
        }
        self.finish_if_complete();
    }

    fn handle_message(
        &mut self,
        _now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let (h, payload) =
            crate::parse_frame(frame, self.cfg.max_payload_bytes, FrameKind::PushSum, from)?;
        if self.in_all.binary_search(&from).is_err() {
            return Err(GossipError::NotANeighbour(from));
        }
        if self.is_absent(from, h.round) {
            return Err(GossipError::Departed(from));
        }
        let d = self.d();
        if h.dim as usize != d {
            return Err(GossipError::DimensionMismatch {
                from,
                expected: d,
                got: h.dim as usize,
            });
        }
        let (lo, hi) = self.window();
        if h.round < lo || h.round > hi {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo,
                hi,
            });
        }
        if !self.cfg.schedule.has_edge(h.round, from, self.cfg.rank) {
            return Err(GossipError::NotANeighbour(from));
        }
        let key = (h.round, from);
        if self.absorbed.contains(&key) || self.early.contains_key(&key) {
            return Err(GossipError::Duplicate {
                from,
                round: h.round,
            });
        }
        // Below round − τ only a share a round completed without (skip policy) is owed.
        if h.round < self.round.saturating_sub(self.cfg.tau) && !self.late.contains(&key) {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo: self.round.saturating_sub(self.cfg.tau),
                hi,
            });
        }
        let share = self.parse_share(from, payload)?;
        if self.mixing && h.round <= self.round {
            self.absorb(h.round, from, &share)?;
        } else {
            self.early.insert(key, share);
        }
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame.len() as u64;
        self.finish_if_complete();
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let (Some(at), true) = (self.skip_deadline, self.mixing) {
            if now >= at {
                // Complete without the awaited round's late shares; they are absorbed when
                // they come.
                self.skip_deadline = None;
                if let Some(s) = self.awaited_round() {
                    for j in self.cfg.schedule.in_peers(s, self.cfg.rank) {
                        if !self.absorbed.contains(&(s, j))
                            && !self.is_absent(j, s)
                            && self.late.insert((s, j))
                        {
                            self.stats.skipped += 1;
                        }
                    }
                }
                self.finish_if_complete();
            }
        }
        if let Some(deadline) = self.deadline {
            if self.mixing && now >= deadline {
                self.events.push_back(GossipEvent::RoundTimedOut {
                    round: self.round,
                    missing: self.missing(),
                });
                // Report once per deadline; the driver decides what to do.
                self.deadline = None;
            }
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let to = *self.out_now.get(self.next_out)?;
        self.next_out += 1;
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += self.outgoing.len() as u64;
        Some(Transmit {
            to,
            frame: self.outgoing.clone(),
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match (self.deadline, self.skip_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn poll_event(&mut self) -> Option<GossipEvent> {
        self.events.pop_front()
    }

    /// z_i = x_i / w_i, `[d]`. While a round is mixing, the z at which it began (after its
    /// gradient step); refreshed when it completes.
    fn params(&self) -> &[f32] {
        &self.z
    }

    fn round(&self) -> u64 {
        self.round
    }

    fn stats(&self) -> GossipStats {
        self.stats
    }

    fn set_epoch(&mut self, epoch: usize) {
        self.compressor.set_epoch(epoch);
    }

    /// Every out-peer of every round of the schedule.
    fn out_peers(&self) -> Vec<Rank> {
        crate::peer_set(
            self.cfg.rank,
            self.cfg.schedule.all_out_peers(self.cfg.rank),
        )
    }

    /// Every in-peer of every round of the schedule.
    fn in_peers(&self) -> Vec<Rank> {
        crate::peer_set(self.cfg.rank, self.in_all.iter().copied())
    }

    /// `true` for τ = 0: frames carry the numerator before the gradient, which
    /// [`Gossip::apply_gradient`] then subtracts ("combine then adapt"). OSGP (τ ≥ 1) already
    /// hides communication behind computation and takes its gradient in `begin_round`.
    fn overlaps_gradient(&self) -> bool {
        self.cfg.tau == 0
    }

    /// The in-peers of round `round` of the schedule.
    fn in_peers_at(&self, round: u64) -> Vec<Rank> {
        crate::peer_set(
            self.cfg.rank,
            self.cfg.schedule.in_peers(round, self.cfg.rank),
        )
    }

    /// Push-sum does not re-weight: `w` is not used (see the [module docs](self)).
    fn reweights(&self) -> bool {
        false
    }

    /// Stops pushing to `gone` and waiting for it (see the [module docs](self)); `w` is not
    /// used. Never fails.
    fn peer_left(
        &mut self,
        gone: Rank,
        _w: &murmur_topology::MixingMatrix,
    ) -> Result<(), crate::MembershipError> {
        self.absent.insert(gone, u64::MAX);
        // Its late shares will not come.
        self.late.retain(|&(_, j)| j != gone);
        // The survivors can now run further ahead of this peer; never shrink the window.
        let gone_now: Vec<Rank> = self
            .absent
            .iter()
            .filter(|(_, &back)| back == u64::MAX)
            .map(|(&r, _)| r)
            .collect();
        let lead = max_lead_without(
            &self.cfg.schedule,
            self.cfg.rank,
            self.cfg.slack(),
            &gone_now,
        );
        self.cfg.max_lead_rounds = self.cfg.max_lead_rounds.max(lead);
        if self.mixing {
            if let Some(pos) = self.out_now[self.next_out..]
                .iter()
                .position(|&j| j == gone)
            {
                // Not handed out yet: keep its share p instead.
                self.out_now.remove(self.next_out + pos);
                let (p, keep) = self.share;
                let factor = (keep + p) / keep;
                let f32_factor = factor as f32;
                self.x.iter_mut().for_each(|v| *v *= f32_factor);
                self.weight *= factor;
                self.share = (p, keep + p);
            }
        }
        self.finish_if_complete();
        Ok(())
    }

    /// `back` is pushed to and waited for again from round `at`; `w` is not used.
    ///
    /// # Errors
    /// [`crate::MembershipError::TooLate`] if `back` is a neighbour and round `at` has begun.
    fn peer_rejoined(
        &mut self,
        back: Rank,
        _w: &murmur_topology::MixingMatrix,
        at: u64,
    ) -> Result<(), crate::MembershipError> {
        let neighbour = self.in_all.contains(&back) || self.out_peers().contains(&back);
        if neighbour && (at < self.round || at == self.round && self.mixing) {
            return Err(crate::MembershipError::TooLate {
                at,
                round: self.round,
            });
        }
        self.absent.insert(back, at);
        Ok(())
    }

    /// The push-sum weight w_i as `push_sum_weight`, the numerator x_i as `numerator`, and
    /// the compressor's state. Shares buffered for later rounds are not part of it (they
    /// were in flight).
    fn state(&self) -> crate::AlgorithmState {
        crate::AlgorithmState {
            scalars: vec![("push_sum_weight".into(), self.weight)],
            vectors: vec![("numerator".into(), self.x.clone())],
        }
        .with_compressor(&*self.compressor)
    }

    /// Sets w_i and x_i (and z_i = x_i / w_i, so a driver that hands back z keeps x_i
    /// bit-exactly).
    ///
    /// # Errors
    /// As [`Gossip::restore_state`], and a push-sum weight outside (0, n].
    fn restore_state(&mut self, state: &crate::AlgorithmState) -> Result<(), crate::StateError> {
        let n = self.cfg.schedule.n() as f64;
        if let Some((_, w)) = state.scalars.first() {
            if !(*w > 0.0 && *w <= n * (1.0 + 1e-6)) {
                return Err(crate::StateError(format!(
                    "push-sum weight {w} is outside (0, {n}]"
                )));
            }
        }
        let d = self.d();
        let (scalars, mut vectors) = state.restore_into(
            &["push_sum_weight"],
            &["numerator"],
            d,
            &mut *self.compressor,
        )?;
        self.weight = scalars[0];
        self.x = vectors.pop().expect("numerator was checked");
        self.refresh_z();
        Ok(())
    }

    /// Starts at round `round` with the parameters given at construction and push-sum
    /// weight 1; frames of earlier rounds are neither awaited nor accepted.
    fn start_at_round(&mut self, round: u64) -> Result<(), crate::MembershipError> {
        assert!(
            !self.mixing,
            "start_at_round while round {} is mixing",
            self.round
        );
        self.round = round;
        self.start_round = round;
        self.early.clear();
        self.absorbed.clear();
        self.late.clear();
        Ok(())
    }

    /// x_i ← x_i − γ·grad on the mixed numerator (`grad: [d]`), then z_i = x_i / w_i.
    ///
    /// # Panics
    /// If τ ≥ 1, a round is mixing, or `grad` is not `[d]` (driver bugs).
    fn apply_gradient(&mut self, grad: &[f32]) {
        assert!(
            self.overlaps_gradient(),
            "OSGP (tau >= 1) takes its gradient in begin_round"
        );
        assert!(
            !self.mixing,
            "apply_gradient while round {} is still mixing",
            self.round
        );
        assert_eq!(grad.len(), self.d(), "grad must have length d");
        let lr = self.cfg.lr;
        for (x, g) in self.x.iter_mut().zip(grad) {
            *x -= lr * g;
        }
        self.refresh_z();
    }
}

/// SGP in the [`crate::registry`].
pub struct SgpAlgorithm;

/// The registry's entry for SGP.
pub const SGP: SgpAlgorithm = SgpAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::PushSchedule),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Shares,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::TAU],
    skips_stragglers: true,
    departures: Departures::TrainOn,
    resume: Resume::Rejoin,
};

impl Algorithm for SgpAlgorithm {
    fn name(&self) -> &'static str {
        "sgp"
    }
    fn about(&self) -> &'static str {
        "SGP (Assran et al. 2019): push-sum gossip with column-stochastic weights on a \
         directed or time-varying graph (--topology one-peer-exponential), overlap bound --tau"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    /// Refuses `--straggler-deadline-ms auto`.
    fn check(&self, run: &crate::algorithm::RunSetup<'_>) -> Result<(), crate::BuildError> {
        if run.auto_deadline {
            return Err(crate::BuildError::Options(
                "--straggler-deadline-ms auto is not built for sgp (its rounds wait for \
                 push-sum shares, not per-neighbour frames); give a number of milliseconds"
                    .into(),
            ));
        }
        Ok(())
    }
    fn build(&self, ctx: crate::BuildContext<'_>) -> Result<Box<dyn Gossip>, crate::BuildError> {
        self.check(&ctx.setup())?;
        let mut cfg = SgpConfig::new(ctx.push_schedule()?, ctx.rank, ctx.lr, ctx.dim())
            .with_tau(ctx.options.tau(self))
            .with_skip(ctx.skip_after);
        cfg.round_timeout = ctx.round_timeout;
        cfg.max_payload_bytes = ctx.max_payload_bytes;
        cfg.seed = ctx.seed;
        let compressor = ctx.compressor(self)?;
        Ok(Box::new(Sgp::with_compressor(cfg, ctx.x0, compressor)))
    }
}
