//! Ring all-reduce: the synchronous data-parallel baseline (Patarasuk & Yuan 2009,
//! "Bandwidth optimal all-reduce algorithms for clusters of workstations"; the
//! reduce-scatter + all-gather ring of Baidu's `allreduce` and Horovod).
//!
//! # Algorithm
//!
//! Peer i of n sends only to its successor (i + 1) mod n and receives only from its
//! predecessor (i − 1) mod n. The vector `v: [d]` being reduced is cut into n contiguous
//! chunks of near-equal length ([`chunk_range`]: the first d mod n chunks hold ⌊d/n⌋ + 1
//! values, the rest ⌊d/n⌋; d need not be divisible by n and chunks may be empty when
//! d < n). A round has 2(n − 1) steps, each one frame per peer carrying one chunk:
//!
//! - reduce-scatter, steps s = 0 … n − 2: peer i sends chunk (i − s) mod n and adds the
//!   chunk (i − s − 1) mod n it receives into its own copy; afterwards peer i holds the
//!   complete sum of chunk (i + 1) mod n;
//! - all-gather, steps s = n − 1 … 2n − 3, k = s − (n − 1): peer i sends chunk
//!   (i + 1 − k) mod n and overwrites chunk (i − k) mod n with the one it receives.
//!
//! Every step's frame carries what the previous step received, so a peer sends step s + 1
//! as soon as step s arrived. Each peer sends and receives 2(n − 1)/n · d values per round,
//! independent of n in the limit: the bandwidth-optimal schedule.
//!
//! What is reduced depends on the round:
//!
//! - `begin_round(now, x, Some(g))`: the gradients; then `x ← x − η · mean(g)`
//!   (synchronous data-parallel SGD: every peer that starts from the same x holds the
//!   same x after every round);
//! - `begin_round(now, x, None)`: the parameters themselves; then `x ← mean(x)` (exact
//!   model averaging, the synchronisation step of local SGD).
//!
//! # Summation order
//!
//! Sums are `f32`. Chunk c is summed along the ring starting at peer c:
//! `((v_c + v_{c+1}) + v_{c+2}) + … + v_{c−1}` (indices mod n), the complete sum lands on
//! peer (c − 1) mod n and is copied bit for bit to every other peer by the all-gather; the
//! mean is that sum divided by n (`sum / n as f32`). The order is fixed by the ring, not by
//! arrival times, so every peer ends a round with bitwise-identical sums and the result
//! does not depend on how frames were delayed or reordered. It differs from a serial
//! left-to-right sum by the usual f32 rounding (at most about (n − 1)·ε·Σ|v_i| per value).
//!
//! # Wire format
//!
//! Frames of kind [`FrameKind::Reduce`], header round = the round, dim = d. The payload is
//!
//! ```text
//! offset  size      field
//!      0     4      step   u32 LE, 0 ≤ step < 2(n − 1)
//!      4  4·len     chunk  len f32 LE, the chunk that step carries (len = its length)
//! ```
//!
//! raw values rather than a `murmur_compress` message: the receiver knows the chunk's
//! length from the step, and the ring is the uncompressed baseline. A frame is refused
//! unless its step is in range, its length is exactly 4 + 4·len and every value is finite;
//! these defects are reported as [`GossipError::Payload`] with [`DecodeError::Truncated`]
//! (no step), [`DecodeError::BadParameter`] (`name: "step"`), [`DecodeError::PayloadLength`]
//! or [`DecodeError::NonFinite`] (`index`: the coordinate in `[d]`).
//!
//! # Compressed rounds
//!
//! An all-reduce built with [`AllReduce::compressed`] sends the rounds from
//! [`AllReduce::set_compressed_from`] on (round 0 unless set) through a
//! [`murmur_compress::Compressor`] C, with an error-feedback residual e_i: `[d]` (zero at
//! the start); earlier rounds are raw as above. The schedule and the summation order are
//! the same; only what a frame carries changes (used by [`crate::DiLoCo`] for its
//! pseudo-gradients, after the INTELLECT-1 int8 ring all-reduce):
//!
//! - reduce-scatter, step s: peer i sends q = C(p) with p = its partial sum of the chunk +
//!   e_i on that chunk, and keeps e_i ← p − C(p) (C(p) decoded from the very bytes sent);
//!   the receiver decodes q and adds its own values, as in a raw round;
//! - all-gather, first step (s = n − 1): the owner of a complete sum S_c compresses
//!   p = S_c + e_i once, keeps e_i ← p − C(p) and replaces S_c by C(p) itself; every
//!   later all-gather step forwards the bytes it received unchanged. Every peer, the owner
//!   included, so ends with the decoded C(p): the sums stay bitwise identical across peers.
//!
//! Peer i compresses each coordinate exactly once per round: the chunks other than
//! (i + 1) mod n as partial sums in the reduce-scatter (chunk (i − s) mod n at step s), its
//! own chunk (i + 1) mod n as the complete sum in the all-gather. So one residual `[d]`
//! holds both, and each coordinate's residual always belongs to the same position of the
//! schedule. Over rounds t = 1…T nothing is lost: Σ_t S_c^t (decoded) = Σ_t Σ_j v_j^t +
//! Σ_i (e_i^0 − e_i^T) on every chunk (in exact arithmetic).
//!
//! The payload of a compressed frame is
//!
//! ```text
//! offset  size      field
//!      0     4      step   u32 LE, 0 ≤ step < 2(n − 1)
//!      4     …      chunk  a murmur_compress message of dimension len (the chunk's
//!                          length); nothing when len = 0
//! ```
//!
//! Besides the checks of raw frames, the message must decode for dimension len
//! ([`murmur_compress::decode_into`]: every defect of its header, parameters and values is
//! a [`GossipError::Payload`] with the decoder's error) and decode to finite values
//! ([`DecodeError::NonFinite`]); a non-empty message for an empty chunk is a
//! [`DecodeError::PayloadLength`]. The compressor must keep no state of its own and accept
//! any length (it sees chunks of ⌊d/n⌋ and ⌊d/n⌋ + 1 values): not `ef+` (the residual is
//! here), DGC or a layer-wise operator. Its randomness comes from a generator the caller
//! seeds ([`AllReduce::seed_compressor`]). Bytes per peer per round: 2(n − 1) frames of
//! 24 + 4 + |C(chunk)| bytes, against 24 + 4 + 4·len raw; with 8 bits per value (QSGD
//! with 127 levels) about a quarter. If the peer's own message does not decode (its
//! values are not finite: the run diverged), [`GossipEvent::Diverged`] is reported and
//! the round never completes.
//!
//! # Gathered rounds
//!
//! A ring built with [`AllReduce::gathered`] runs its compressed rounds as an all-gather of
//! each peer's own compressed vector instead (SparseLoCo's aggregation, Sarfi, Thérien,
//! Lidin & Belilovsky 2025, "Communication Efficient LLM Pre-training with SparseLoCo",
//! Algorithm 1): no partial sum is ever compressed again, so the mean of n sparse vectors
//! keeps the union of their supports. With the decay β ∈ [0, 1] of the error feedback:
//!
//! ```text
//! step 0:        p = v_i + β e_i,  q_i = C(p),  e_i ← p − C(p)   (C(p) decoded from q_i)
//!                send q_i to the successor
//! step s ≥ 1:    forward the message received at step s − 1 (peer (i − s) mod n's q)
//! after n − 1:   mean = (1/n) (((0 + C(q_0)) + C(q_1)) + … + C(q_{n−1}))   [d]
//! ```
//!
//! n − 1 steps, each frame one whole message (dim d): per peer per round (n − 1) frames of
//! 24 + 4 + |C(d)| bytes, n/2 times the compressed ring's 2(n − 1)/n · |C(d)|, for a mean
//! that is exact in the decoded messages. Every peer decodes the same n messages and adds
//! them in rank order, so every peer ends the round with a bitwise-identical mean. Over
//! rounds t = 1…T with β = 1 nothing is lost: n Σ_t mean_t + Σ_i e_i^T = Σ_t Σ_j v_j^t
//! (exact arithmetic). The payload is the step (`u32` LE) and the message of dimension d;
//! it is checked as a compressed chunk's, with len = d.
//!
//! # Early frames
//!
//! The predecessor may be ahead: a later step of this round, or (once it completed this
//! round) a step of the next. Such frames are validated on arrival and buffered; the
//! window is the mixing round and the next one (only the next round to begin while idle),
//! which bounds the buffer by 4(n − 1) chunks, about 4·d values. Anything else is refused.
//! A peer cannot legitimately be further ahead: finishing a round needs every peer's
//! frames of that round.

use crate::algorithm::{Algorithm, Capabilities, Compresses, Departures, Pattern, Resume};
use murmur_compress::CompressorSpec;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use murmur_compress::{Compressor, DecodeError};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use crate::{Bytes, Gossip, GossipError, GossipEvent, GossipStats, Rank, Transmit};

/// Name of the payload format in [`DecodeError`]s.
const PAYLOAD: &str = "ring all-reduce chunk (raw f32)";
/// Name of the compressed payload format in [`DecodeError`]s.
const COMPRESSED_PAYLOAD: &str = "ring all-reduce chunk (compressed)";

/// Configuration of one ring all-reduce peer.
#[derive(Debug, Clone)]
pub struct AllReduceConfig {
    /// This peer's rank i, `0 ≤ i < n`.
    pub rank: Rank,
    /// Number of peers n ≥ 1 on the ring.
    pub n: usize,
    /// Learning rate η applied to the mean gradient.
    pub lr: f32,
    /// How long a round may wait for its frames before [`GossipEvent::RoundTimedOut`].
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
}

impl AllReduceConfig {
    /// Peer `rank` of `n` with η = `lr` for a model of `d` parameters, a 60 s round
    /// timeout and a payload limit of exactly the largest step: 4 + 4·⌈d/n⌉ bytes.
    pub fn new(rank: Rank, n: usize, lr: f32, d: usize) -> Self {
        let largest = 4 + 4 * d.div_ceil(n.max(1));
        AllReduceConfig {
            rank,
            n,
            lr,
            round_timeout: Duration::from_secs(60),
            max_payload_bytes: u32::try_from(largest).unwrap_or(u32::MAX),
        }
    }
}

/// The index range of chunk `c` (`0 ≤ c < n`) when `[d]` is cut into n contiguous chunks:
/// the first d mod n chunks have ⌊d/n⌋ + 1 values, the others ⌊d/n⌋ (possibly 0).
///
/// # Panics
/// If `n == 0` or `c ≥ n`.
pub fn chunk_range(c: usize, n: usize, d: usize) -> Range<usize> {
    assert!(c < n, "chunk {c} of {n}");
    let (base, rem) = (d / n, d % n);
    let start = c * base + c.min(rem);
    start..start + base + usize::from(c < rem)
}

/// One peer of ring all-reduce as a sans-I/O state machine (see the [module docs](self)).
pub struct AllReduce {
    cfg: AllReduceConfig,
    /// x_i (`[d]`): the parameters given to `begin_round`, then the result of the round.
    x: Vec<f32>,
    /// The vector being reduced (`[d]`): g or x, summed chunk by chunk.
    acc: Vec<f32>,
    /// Whether the mixing round reduces a gradient (else the parameters).
    grad_mode: bool,
    /// Next round to begin, or the round that is mixing.
    round: u64,
    mixing: bool,
    /// Next step to receive in the mixing round.
    next_step: u32,
    deadline: Option<Instant>,
    /// Validated chunks that arrived before their turn, by (round, step).
    early: BTreeMap<(u64, u32), Chunk>,
    /// Encoded frames for the successor, oldest first.
    outgoing: VecDeque<Vec<u8>>,
    events: VecDeque<GossipEvent>,
    stats: GossipStats,
    /// The compressed rounds' operator and residual (see the [module docs](self#compressed-rounds)).
    codec: Option<Box<Codec>>,
    /// The mixing round stopped: this peer's own message did not decode.
    halted: bool,
}

/// A validated incoming chunk: its values, and for a compressed round the message itself
/// (forwarded unchanged by the all-gather).
struct Chunk {
    values: Vec<f32>,
    msg: Vec<u8>,
}

/// What a gathered ring keeps besides the codec.
struct Gather {
    /// β ∈ [0, 1], the residual's decay.
    decay: f32,
    /// q_r of the mixing round, by origin rank r (empty until it arrived).
    msgs: Vec<Vec<u8>>,
}

/// What a compressed ring keeps.
struct Codec {
    compressor: Box<dyn Compressor>,
    /// e_i: `[d]`, the error-feedback residual.
    residual: Vec<f32>,
    rng: StdRng,
    /// The first compressed round.
    from_round: u64,
    /// The all-gather message received last, sent on unchanged at the next step (the
    /// reduced form; the gathered form forwards from `gather.msgs`).
    forward: Vec<u8>,
    /// The gathered form (see the [module docs](self#gathered-rounds)): β and the messages
    /// of the mixing round by their origin's rank.
    gather: Option<Gather>,
    /// Scratch of one chunk: p = v + e, then C(p) decoded.
    p: Vec<f32>,
    decoded: Vec<f32>,
}

impl AllReduce {
    /// Peer `cfg.rank` starting from parameters `x0: [d]`.
    ///
    /// # Panics
    /// If `n == 0`, `rank ≥ n`, `d` does not fit the frame header's `u32`, or 2(n − 1)
    /// steps do not fit the payload's `u32` (configuration bugs).
    pub fn new(cfg: AllReduceConfig, x0: Vec<f32>) -> Self {
        assert!(cfg.n >= 1, "a ring needs at least one peer");
        assert!(cfg.rank < cfg.n, "rank {} of n = {}", cfg.rank, cfg.n);
        assert!(u32::try_from(x0.len()).is_ok(), "d must fit in u32");
        assert!(
            u32::try_from(2 * (cfg.n - 1)).is_ok(),
            "2(n − 1) steps must fit in u32"
        );
        let d = x0.len();
        AllReduce {
            cfg,
            x: x0,
            acc: vec![0.0; d],
            grad_mode: false,
            round: 0,
            mixing: false,
            next_step: 0,
            deadline: None,
            early: BTreeMap::new(),
            outgoing: VecDeque::new(),
            events: VecDeque::new(),
            stats: GossipStats::default(),
            codec: None,
            halted: false,
        }
    }

    /// Peer `cfg.rank` starting from `x0: [d]` whose rounds are compressed by `compressor`
    /// from round 0 on (see the [module docs](self#compressed-rounds)), with a zero
    /// residual and the compressor's generator seeded with 0. The payload limit is raised
    /// to the largest compressed step if that is larger: 4 + C's bound for ⌈d/n⌉ values.
    ///
    /// # Panics
    /// As [`AllReduce::new`].
    pub fn compressed(
        mut cfg: AllReduceConfig,
        x0: Vec<f32>,
        compressor: Box<dyn Compressor>,
    ) -> Self {
        let d = x0.len();
        let largest = 4 + compressor.max_encoded_len(d.div_ceil(cfg.n.max(1)));
        cfg.max_payload_bytes = cfg
            .max_payload_bytes
            .max(u32::try_from(largest).unwrap_or(u32::MAX));
        let mut ar = Self::new(cfg, x0);
        ar.codec = Some(Box::new(Codec {
            compressor,
            residual: vec![0.0; d],
            rng: StdRng::seed_from_u64(0),
            from_round: 0,
            forward: Vec::new(),
            gather: None,
            p: Vec::new(),
            decoded: Vec::new(),
        }));
        ar
    }

    /// Peer `cfg.rank` starting from `x0: [d]` whose compressed rounds (from round 0 on, as
    /// [`AllReduce::compressed`]) all-gather each peer's own C(v + β e) instead of reducing
    /// chunks (see the [module docs](self#gathered-rounds)). The payload limit is raised to
    /// 4 + C's bound for d values.
    ///
    /// # Panics
    /// As [`AllReduce::new`], or if `decay` is not in [0, 1].
    pub fn gathered(
        mut cfg: AllReduceConfig,
        x0: Vec<f32>,
        compressor: Box<dyn Compressor>,
        decay: f32,
    ) -> Self {
        assert!((0.0..=1.0).contains(&decay), "decay β must be in [0, 1]");
        let largest = 4 + compressor.max_encoded_len(x0.len());
        cfg.max_payload_bytes = cfg
            .max_payload_bytes
            .max(u32::try_from(largest).unwrap_or(u32::MAX));
        let n = cfg.n;
        let mut ar = Self::compressed(cfg, x0, compressor);
        if let Some(c) = &mut ar.codec {
            c.gather = Some(Gather {
                decay,
                msgs: vec![Vec::new(); n],
            });
        }
        ar
    }

    /// Whether round `round` is a gathered one.
    pub fn gathers_round(&self, round: u64) -> bool {
        self.compresses_round(round) && self.codec.as_ref().is_some_and(|c| c.gather.is_some())
    }

    /// Compresses the rounds from `round` on; the earlier ones are raw. Every peer of the
    /// ring must agree (a frame is parsed by its round). No effect without a compressor.
    pub fn set_compressed_from(&mut self, round: u64) {
        if let Some(c) = &mut self.codec {
            c.from_round = round;
        }
    }

    /// Whether round `round` is compressed.
    pub fn compresses_round(&self, round: u64) -> bool {
        self.codec.as_ref().is_some_and(|c| round >= c.from_round)
    }

    /// Seeds the compressor's generator for the rounds that follow (random operators:
    /// QSGD, random-k…). A caller that seeds each round from the run's seed and a round
    /// number that survives a resume replays the run exactly.
    pub fn seed_compressor(&mut self, seed: u64) {
        if let Some(c) = &mut self.codec {
            c.rng = StdRng::seed_from_u64(seed);
        }
    }

    /// The error-feedback residual e_i: `[d]` (`None` without a compressor).
    pub fn residual(&self) -> Option<&[f32]> {
        self.codec.as_ref().map(|c| c.residual.as_slice())
    }

    /// Replaces the residual by `e: [d]` (restoring a checkpoint). No effect without a
    /// compressor.
    ///
    /// # Panics
    /// If `e` is not `[d]`, or a round is mixing.
    pub fn set_residual(&mut self, e: &[f32]) {
        assert!(
            !self.mixing,
            "set_residual while round {} is mixing",
            self.round
        );
        if let Some(c) = &mut self.codec {
            assert_eq!(e.len(), c.residual.len(), "the residual must have length d");
            c.residual.copy_from_slice(e);
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AllReduceConfig {
        &self.cfg
    }

    /// Steps of round `round`: n − 1 if it is gathered, else 2(n − 1).
    fn steps(&self, round: u64) -> u32 {
        let n1 = self.cfg.n as u32 - 1;
        if self.gathers_round(round) {
            n1
        } else {
            2 * n1
        }
    }

    fn next_peer(&self) -> Rank {
        (self.cfg.rank + 1) % self.cfg.n
    }

    fn prev_peer(&self) -> Rank {
        (self.cfg.rank + self.cfg.n - 1) % self.cfg.n
    }

    /// The chunk peer `rank` sends at step `s`.
    fn send_chunk(&self, rank: Rank, s: u32) -> usize {
        let (n, s) = (self.cfg.n, s as usize);
        if s < n - 1 {
            (rank + n - s) % n
        } else {
            (rank + 1 + n - (s - (n - 1))) % n
        }
    }

    /// The range of `[d]` peer `rank` sends at step `s` of round `round`: its chunk, or all
    /// of `[d]` in a gathered round.
    fn send_range(&self, rank: Rank, round: u64, s: u32) -> Range<usize> {
        if self.gathers_round(round) {
            return 0..self.x.len();
        }
        chunk_range(self.send_chunk(rank, s), self.cfg.n, self.x.len())
    }

    /// The range of `[d]` this peer receives at step `s` of round `round`: what the
    /// predecessor sends.
    fn recv_range(&self, round: u64, s: u32) -> Range<usize> {
        self.send_range(self.prev_peer(), round, s)
    }

    /// Queues the frame of step `s` of the mixing round.
    fn queue_step(&mut self, s: u32) {
        if self.halted {
            return;
        }
        let range = self.send_range(self.cfg.rank, self.round, s);
        let mut payload = Vec::with_capacity(4 + 4 * range.len());
        payload.extend_from_slice(&s.to_le_bytes());
        if self.compresses_round(self.round) {
            if let Err(reason) = self.compress_step(s, range, &mut payload) {
                self.halted = true;
                self.deadline = None;
                self.events.push_back(GossipEvent::Diverged {
                    round: self.round,
                    reason,
                });
                return;
            }
        } else {
            for v in &self.acc[range] {
                payload.extend_from_slice(&v.to_le_bytes());
            }
        }
        let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
        FrameHeader {
            kind: FrameKind::Reduce,
            sender: self.cfg.rank,
            round: self.round,
            dim: self.x.len() as u32,
            payload_len: payload.len() as u32,
        }
        .emit(&mut frame);
        frame.extend_from_slice(&payload);
        self.outgoing.push_back(frame);
    }

    /// Appends the compressed chunk `range` of step `s` to `out`: C(acc + e) with
    /// e ← acc + e − C(…) at the reduce-scatter steps and the all-gather's first (whose
    /// complete sum becomes C(…)), the received message at the later all-gather steps.
    /// `Err` if this peer's own message does not decode (its values are not finite).
    fn compress_step(
        &mut self,
        s: u32,
        range: Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let n1 = self.cfg.n as u32 - 1;
        let rank = self.cfg.rank;
        let codec = self.codec.as_mut().expect("a compressed round has a codec");
        if range.is_empty() {
            return Ok(());
        }
        // The gathered form forwards from step 1 on what it received at step s − 1: peer
        // (i − s) mod n's message; the reduced form in the all-gather's later steps.
        if let Some(g) = codec.gather.as_ref().filter(|_| s >= 1) {
            let n = self.cfg.n;
            out.extend_from_slice(&g.msgs[(rank + n - s as usize % n) % n]);
            return Ok(());
        }
        if s > n1 {
            out.extend_from_slice(&codec.forward);
            return Ok(());
        }
        let Codec {
            compressor,
            residual,
            rng,
            p,
            decoded,
            gather,
            ..
        } = &mut **codec;
        let decay = gather.as_ref().map_or(1.0, |g| g.decay);
        p.clear();
        p.extend(
            self.acc[range.clone()]
                .iter()
                .zip(&residual[range.clone()])
                .map(|(v, e)| v + decay * e),
        );
        if let Some(k) = p.iter().position(|v| !v.is_finite()) {
            return Err(format!(
                "peer {}: the value to compress at step {s} has [{}] = {} (sum + residual)",
                self.cfg.rank,
                range.start + k,
                p[k]
            ));
        }
        let at = out.len();
        compressor.compress(p, rng, out);
        decoded.resize(range.len(), 0.0);
        murmur_compress::decode_into(&out[at..], decoded).map_err(|e| {
            format!(
                "peer {}: its own compressed chunk of step {s} does not decode ({e})",
                self.cfg.rank
            )
        })?;
        for ((e, p), c) in residual[range.clone()]
            .iter_mut()
            .zip(p.iter())
            .zip(decoded.iter())
        {
            *e = p - c;
        }
        if let Some(g) = gather {
            // This peer's q_i, summed with the others' at the end of the round.
            g.msgs[rank].clear();
            g.msgs[rank].extend_from_slice(&out[at..]);
        } else if s == n1 {
            // The owner uses the decoded sum, like every other peer.
            self.acc[range].copy_from_slice(decoded);
        }
        Ok(())
    }

    /// Absorbs the chunk of step `self.next_step`, queues the next step's frame and
    /// finishes the round after the last step.
    fn absorb(&mut self, chunk: Chunk) {
        if self.halted {
            // Diverged: the round never completes.
            return;
        }
        let s = self.next_step;
        let range = self.recv_range(self.round, s);
        let gathers = self.gathers_round(self.round);
        let dst = &mut self.acc[range];
        if gathers {
            // Peer (i − 1 − s) mod n's message: kept for the sum, forwarded next step.
            let n = self.cfg.n;
            let origin = (self.cfg.rank + 2 * n - 1 - s as usize) % n;
            if let Some(g) = self.codec.as_mut().and_then(|c| c.gather.as_mut()) {
                g.msgs[origin] = chunk.msg;
            }
        } else if (s as usize) < self.cfg.n - 1 {
            for (a, v) in dst.iter_mut().zip(&chunk.values) {
                *a += v;
            }
        } else {
            dst.copy_from_slice(&chunk.values);
            if let Some(c) = &mut self.codec {
                c.forward = chunk.msg;
            }
        }
        self.next_step = s + 1;
        if self.next_step < self.steps(self.round) {
            self.queue_step(self.next_step);
        } else {
            self.finish();
        }
    }

    /// Absorbs buffered chunks of the mixing round for as long as the next one is there.
    fn absorb_buffered(&mut self) {
        while self.mixing {
            match self.early.remove(&(self.round, self.next_step)) {
                Some(chunk) => self.absorb(chunk),
                None => break,
            }
        }
    }

    /// Turns the complete sums into the round's result and emits `Mixed`.
    fn finish(&mut self) {
        if self.gathers_round(self.round) {
            self.sum_gathered();
        }
        let n = self.cfg.n as f32;
        if self.grad_mode {
            let lr = self.cfg.lr;
            for (x, s) in self.x.iter_mut().zip(&self.acc) {
                *x -= lr * (s / n);
            }
        } else {
            for (x, s) in self.x.iter_mut().zip(&self.acc) {
                *x = s / n;
            }
        }
        self.mixing = false;
        self.deadline = None;
        self.events
            .push_back(GossipEvent::Mixed { round: self.round });
        self.round += 1;
        self.next_step = 0;
    }

    /// A gathered round's sum: acc = ((0 + C(q_0)) + C(q_1)) + … + C(q_{n−1}), in rank
    /// order on every peer. Each message was validated on arrival (or is this peer's own,
    /// which decoded), so decoding cannot fail.
    fn sum_gathered(&mut self) {
        let Some(g) = self.codec.as_mut().and_then(|c| c.gather.as_mut()) else {
            return;
        };
        if self.cfg.n == 1 {
            // A lone peer sends nothing: its mean is its own vector, as in a raw round.
            return;
        }
        self.acc.fill(0.0);
        if self.acc.is_empty() {
            return;
        }
        for q in &g.msgs {
            murmur_compress::decode_add(q, 1.0, &mut self.acc)
                .expect("a gathered message was validated on arrival");
        }
    }

    /// Parses and checks an incoming frame without changing anything; returns its round,
    /// step and chunk.
    fn check(&self, from: Rank, frame: &[u8]) -> Result<(u64, u32, Chunk), GossipError> {
        let (h, payload) =
            crate::parse_frame(frame, self.cfg.max_payload_bytes, FrameKind::Reduce, from)?;
        if self.cfg.n == 1 || from != self.prev_peer() {
            return Err(GossipError::NotANeighbour(from));
        }
        let d = self.x.len();
        if h.dim as usize != d {
            return Err(GossipError::DimensionMismatch {
                from,
                expected: d,
                got: h.dim as usize,
            });
        }
        let (lo, hi) = (self.round, self.round + u64::from(self.mixing));
        if h.round < lo || h.round > hi {
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo,
                hi,
            });
        }
        let bad = |source| GossipError::Payload {
            from,
            cause: source,
        };
        let step_bytes: [u8; 4] = payload.get(..4).and_then(|b| b.try_into().ok()).ok_or(bad(
            DecodeError::Truncated {
                needed: 4,
                got: payload.len(),
            },
        ))?;
        let step = u32::from_le_bytes(step_bytes);
        if step >= self.steps(h.round) {
            return Err(bad(DecodeError::BadParameter {
                operator: PAYLOAD,
                name: "step",
                value: step.into(),
            }));
        }
        let consumed = self.mixing && h.round == self.round && step < self.next_step;
        if consumed || self.early.contains_key(&(h.round, step)) {
            return Err(GossipError::Duplicate {
                from,
                round: h.round,
            });
        }
        let range = self.recv_range(h.round, step);
        if self.compresses_round(h.round) {
            let msg = &payload[4..];
            let mut values = vec![0.0f32; range.len()];
            if range.is_empty() {
                if !msg.is_empty() {
                    return Err(bad(DecodeError::PayloadLength {
                        operator: COMPRESSED_PAYLOAD,
                        declared: payload.len(),
                        expected: 4,
                    }));
                }
            } else {
                murmur_compress::decode_into(msg, &mut values).map_err(bad)?;
            }
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(bad(DecodeError::NonFinite {
                    index: range.start + i,
                }));
            }
            if self.gathers_round(h.round) {
                // Summed from the message at the end of the round.
                values = Vec::new();
            }
            return Ok((
                h.round,
                step,
                Chunk {
                    values,
                    msg: msg.to_vec(),
                },
            ));
        }
        let expected = 4 + 4 * range.len();
        if payload.len() != expected {
            return Err(bad(DecodeError::PayloadLength {
                operator: PAYLOAD,
                declared: payload.len(),
                expected,
            }));
        }
        let values: Vec<f32> = payload[4..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(bad(DecodeError::NonFinite {
                index: range.start + i,
            }));
        }
        Ok((
            h.round,
            step,
            Chunk {
                values,
                msg: Vec::new(),
            },
        ))
    }
}

impl Gossip for AllReduce {
    /// Starts reducing `grad: [d]` (then x ← x − η·mean(g)) or, with `grad = None`, `x: [d]`
    /// itself (then x ← mean(x)). Sends step 0 and absorbs frames that arrived early. With
    /// n = 1 the round completes at once.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
        assert_eq!(x.len(), self.x.len(), "x must have length d");
        self.x.copy_from_slice(x);
        match grad {
            Some(g) => {
                assert_eq!(g.len(), x.len(), "grad must have length d");
                self.acc.copy_from_slice(g);
            }
            None => self.acc.copy_from_slice(x),
        }
        self.grad_mode = grad.is_some();
        self.mixing = true;
        self.halted = false;
        self.next_step = 0;
        if self.steps(self.round) == 0 {
            self.finish();
            return;
        }
        self.deadline = Some(now + self.cfg.round_timeout);
        self.queue_step(0);
        // Frames of the previous round cannot be buffered, so all of `early` is for this
        // round or the next.
        self.absorb_buffered();
    }

    fn handle_message(
        &mut self,
        _now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let (round, step, chunk) = self.check(from, frame)?;
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame.len() as u64;
        if self.mixing && round == self.round && step == self.next_step {
            self.absorb(chunk);
            self.absorb_buffered();
        } else {
            self.early.insert((round, step), chunk);
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.mixing && self.deadline.is_some_and(|t| now >= t) {
            self.events.push_back(GossipEvent::RoundTimedOut {
                round: self.round,
                missing: vec![self.prev_peer()],
            });
            // Report once per deadline; the driver decides what to do.
            self.deadline = None;
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let frame = self.outgoing.pop_front()?;
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += frame.len() as u64;
        Some(Transmit {
            to: self.next_peer(),
            frame: Bytes::from(frame),
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
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
        self.stats
    }

    /// `[(i + 1) mod n]`, empty for n = 1.
    fn out_peers(&self) -> Vec<Rank> {
        crate::peer_set(self.cfg.rank, [self.next_peer()])
    }

    /// `[(i − 1) mod n]`, empty for n = 1.
    fn in_peers(&self) -> Vec<Rank> {
        crate::peer_set(self.cfg.rank, [self.prev_peer()])
    }
}

/// Ring all-reduce in the [`crate::registry`]: synchronous data-parallel SGD.
pub struct AllReduceAlgorithm;

/// The registry's entry for all-reduce.
pub const ALLREDUCE: AllReduceAlgorithm = AllReduceAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Fixed("ring all-reduce"),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Nothing,
    default_compressor: CompressorSpec::Identity,
    options: &[],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::No,
};

impl Algorithm for AllReduceAlgorithm {
    fn name(&self) -> &'static str {
        "allreduce"
    }
    fn about(&self) -> &'static str {
        "Synchronous data-parallel SGD: ring all-reduce of the gradients every round, so all \
         peers hold the same model (the centralized baseline)"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: crate::BuildContext<'_>) -> Result<Box<dyn Gossip>, crate::BuildError> {
        let lr = ctx.lr;
        Ok(Box::new(AllReduce::from_context(ctx, lr)))
    }
}

impl AllReduce {
    /// An all-reduce peer for `ctx` with step size `lr` (0: exact averaging of the parameters).
    pub fn from_context(ctx: crate::BuildContext<'_>, lr: f32) -> AllReduce {
        let mut cfg = AllReduceConfig::new(ctx.rank, ctx.peers(), lr, ctx.dim());
        cfg.round_timeout = ctx.round_timeout;
        AllReduce::new(cfg, ctx.x0)
    }

    /// An all-reduce peer for `ctx` that averages (η = 0) and compresses its rounds with
    /// `compressor` (see the [module docs](self#compressed-rounds)).
    pub fn compressed_from_context(
        ctx: crate::BuildContext<'_>,
        compressor: Box<dyn Compressor>,
    ) -> AllReduce {
        let mut cfg = AllReduceConfig::new(ctx.rank, ctx.peers(), 0.0, ctx.dim());
        cfg.round_timeout = ctx.round_timeout;
        AllReduce::compressed(cfg, ctx.x0, compressor)
    }

    /// An all-reduce peer for `ctx` that averages (η = 0) and all-gathers its compressed
    /// rounds with `compressor` and the residual's decay `decay`
    /// (see the [module docs](self#gathered-rounds)).
    pub fn gathered_from_context(
        ctx: crate::BuildContext<'_>,
        compressor: Box<dyn Compressor>,
        decay: f32,
    ) -> AllReduce {
        let mut cfg = AllReduceConfig::new(ctx.rank, ctx.peers(), 0.0, ctx.dim());
        cfg.round_timeout = ctx.round_timeout;
        AllReduce::gathered(cfg, ctx.x0, compressor, decay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_vector() {
        for n in 1usize..=9 {
            for d in [0, 1, n - 1, n, n + 1, 37, 1000] {
                let mut next = 0;
                for c in 0..n {
                    let r = chunk_range(c, n, d);
                    assert_eq!(r.start, next);
                    assert!(r.len() == d / n || r.len() == d / n + 1);
                    next = r.end;
                }
                assert_eq!(next, d, "n = {n}, d = {d}");
            }
        }
        assert_eq!(chunk_range(0, 3, 7), 0..3);
        assert_eq!(chunk_range(1, 3, 7), 3..5);
        assert_eq!(chunk_range(2, 3, 7), 5..7);
    }
}
