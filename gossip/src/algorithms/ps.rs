//! Parameter server: the centralized baseline with a synchronous (BSP), stale-synchronous
//! (SSP) or asynchronous (ASP) server (Li et al. 2014, "Scaling distributed machine
//! learning with the parameter server", OSDI; Ho et al. 2013, "More effective distributed
//! ML via a stale synchronous parallel parameter server", NeurIPS).
//!
//! # Roles
//!
//! Peer 0 is the server and also a worker; peers 1 … n − 1 are workers. One type,
//! [`ParameterServer`], plays either role, chosen by the rank. Every round t, worker i
//! (rank 0 included) pushes its gradient `g_i: [d]` to the server and waits for the server's
//! parameters `x: [d]`, which become its [`Gossip::params`]. Rank 0's worker side hands its
//! push to its server side directly, without a frame. The `x` passed to
//! [`Gossip::begin_round`] is not sent: the server's copy, initialised from rank 0's `x0`,
//! is authoritative.
//!
//! # Server update
//!
//! - [`PsMode::Bsp`] (bulk-synchronous, Li et al. 2014): the server waits for all n
//!   gradients of round t, sets `x ← x − η · mean(g)` and sends x to every worker. This is
//!   synchronous data-parallel SGD, the same trajectory as [`crate::AllReduce`] for the
//!   same gradients up to f32 rounding: the server sums in arrival order (`f32`, one
//!   `[d]` accumulator), the ring in ring order.
//! - [`PsMode::Ssp`] (stale-synchronous, Ho et al. 2013): the server applies each gradient
//!   on arrival, `x ← x − (η/n) · g_i` (computed as `x − (η / n as f32) · g`), so that n
//!   pushes move x about as far as one BSP step. It answers worker i's push for round t
//!   with the current x only when `t + 1 − c_min ≤ staleness`, where c_min is the number
//!   of rounds the slowest worker has pushed; otherwise the answer is held (not
//!   computed) until the slowest catches up and is then sent with the x of that moment.
//!   So the parameters a worker reads for round t + 1 contain every worker's gradients of
//!   rounds ≤ t − staleness: a worker begins round t + 1 only after every worker began
//!   round t − staleness, and the rounds peers are in differ by at most staleness + 1. `staleness = 0` applies the same n
//!   gradients per round as BSP (in arrival order, one at a time).
//! - [`PsMode::Asp`] (asynchronous): SSP with unbounded staleness; every push is answered
//!   at once.
//!
//! Rank 0's worker side obeys the same rule: its round completes only when its own push
//! may be answered.
//!
//! A round begun without a gradient (`grad = None`) pushes an empty payload, read as a
//! zero gradient: the worker's clock advances, x does not move. Such a round is a pure
//! pull of the server's parameters.
//!
//! # Wire format
//!
//! Frames of kind [`FrameKind::Push`] (worker → server) and [`FrameKind::Pull`] (server →
//! worker), header round = the worker's round t, dim = d. Payloads are raw values:
//!
//! ```text
//! Push: g  d f32 LE (4·d bytes), or empty for "no gradient"
//! Pull: x  d f32 LE (4·d bytes)
//! ```
//!
//! raw rather than `murmur_compress` messages: the parameter server is the uncompressed
//! baseline. A frame is refused (and changes nothing) unless its kind fits the receiver's
//! role (workers accept only Pull from peer 0, the server only Push from peers 1 … n − 1),
//! its length is exact, every value is finite and its round is the one expected: the
//! server accepts from worker j only round `c_j` (the next it has not pushed) and nothing
//! while j waits for an answer; a worker accepts only its mixing round. An earlier round
//! is a [`GossipError::Duplicate`]; a later one, or any frame while nothing is expected,
//! is [`GossipError::RoundOutOfWindow`] (an empty window `lo > hi` when nothing is).
//! Payload defects are [`GossipError::Payload`] with [`DecodeError::PayloadLength`] or
//! [`DecodeError::NonFinite`] (`index`: the coordinate in `[d]`).
//!
//! # Driving the server
//!
//! The server is served only when its driver feeds frames to
//! [`Gossip::handle_message`]. A node whose training loop feeds frames only while it waits
//! for its own round (and drains events between rounds) serves the other workers' pushes
//! late, by up to rank 0's compute time per round; this lengthens the workers' waits
//! under SSP/ASP but does not change what is computed. A dedicated server would feed
//! frames continuously.

use crate::algorithm::{
    Algorithm, Capabilities, Compresses, Departures, Pattern, ProtocolOption, Resume,
};
use murmur_compress::CompressorSpec;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use murmur_compress::DecodeError;

use crate::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use crate::{Bytes, Gossip, GossipError, GossipEvent, GossipStats, Rank, Transmit};

/// Name of the payload format in [`DecodeError`]s.
const PAYLOAD: &str = "parameter server vector (raw f32)";

/// How the server synchronises its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PsMode {
    /// Bulk-synchronous: one update with the mean of all n gradients per round.
    #[default]
    Bsp,
    /// Stale-synchronous: per-gradient updates; a worker may be at most `staleness`
    /// rounds (of pushes) ahead of the slowest when it is answered.
    Ssp {
        /// Allowed lead in rounds.
        staleness: u64,
    },
    /// Asynchronous: per-gradient updates, every push answered at once (SSP with
    /// unbounded staleness).
    Asp,
}

impl PsMode {
    /// The staleness bound the answer rule uses: 0 for BSP, `u64::MAX` (unbounded) for ASP.
    pub fn staleness(&self) -> u64 {
        match *self {
            PsMode::Bsp => 0,
            PsMode::Ssp { staleness } => staleness,
            PsMode::Asp => u64::MAX,
        }
    }
}

/// Configuration of one parameter-server peer.
#[derive(Debug, Clone)]
pub struct PsConfig {
    /// This peer's rank, `0 ≤ rank < n`; rank 0 is the server.
    pub rank: Rank,
    /// Number of peers n ≥ 1 (workers, the server's own worker side included).
    pub n: usize,
    /// Learning rate η.
    pub lr: f32,
    /// Synchronisation of the server.
    pub mode: PsMode,
    /// How long a worker's round may wait for its parameters before
    /// [`GossipEvent::RoundTimedOut`].
    pub round_timeout: Duration,
    /// Largest frame payload accepted, in bytes.
    pub max_payload_bytes: u32,
}

impl PsConfig {
    /// Peer `rank` of `n` in `mode` with η = `lr` for a model of `d` parameters, a 60 s
    /// round timeout and a payload limit of exactly 4·d bytes.
    pub fn new(rank: Rank, n: usize, lr: f32, mode: PsMode, d: usize) -> Self {
        PsConfig {
            rank,
            n,
            lr,
            mode,
            round_timeout: Duration::from_secs(60),
            max_payload_bytes: u32::try_from(4 * d).unwrap_or(u32::MAX),
        }
    }
}

/// The server side of rank 0.
struct Server {
    /// The server's parameters x: [d].
    x: Vec<f32>,
    /// Per worker (rank 0 included): rounds pushed so far, c_j.
    clock: Vec<u64>,
    /// Per worker: the round whose answer it waits for.
    waiting: Vec<Option<u64>>,
    /// BSP: Σ g of the round being collected, in arrival order.
    sum: Vec<f32>,
}

/// One peer of the parameter-server algorithm as a sans-I/O state machine; rank 0 is
/// the server (see the [module docs](self)).
pub struct ParameterServer {
    cfg: PsConfig,
    /// This worker's parameters x: [d], the server's as of the last answer.
    x: Vec<f32>,
    /// Next round to begin, or the round that is mixing.
    round: u64,
    mixing: bool,
    deadline: Option<Instant>,
    /// Rank 0 only.
    server: Option<Server>,
    /// Frames to send, oldest first; the server's broadcasts share one buffer.
    outgoing: VecDeque<(Rank, Bytes)>,
    events: VecDeque<GossipEvent>,
    stats: GossipStats,
}

impl ParameterServer {
    /// Peer `cfg.rank` starting from parameters `x0: [d]`; on rank 0 these are also the
    /// server's initial parameters.
    ///
    /// # Panics
    /// If `n == 0`, `rank ≥ n` or `d` does not fit the frame header's `u32` (configuration
    /// bugs).
    pub fn new(cfg: PsConfig, x0: Vec<f32>) -> Self {
        assert!(cfg.n >= 1, "a parameter server needs at least one peer");
        assert!(cfg.rank < cfg.n, "rank {} of n = {}", cfg.rank, cfg.n);
        assert!(u32::try_from(4 * x0.len()).is_ok(), "4·d must fit in u32");
        let d = x0.len();
        let server = (cfg.rank == 0).then(|| Server {
            x: x0.clone(),
            clock: vec![0; cfg.n],
            waiting: vec![None; cfg.n],
            sum: vec![0.0; d],
        });
        ParameterServer {
            cfg,
            x: x0,
            round: 0,
            mixing: false,
            deadline: None,
            server,
            outgoing: VecDeque::new(),
            events: VecDeque::new(),
            stats: GossipStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PsConfig {
        &self.cfg
    }

    /// Whether this peer is the server (rank 0).
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    /// The server's current parameters `[d]` (rank 0 only).
    pub fn server_params(&self) -> Option<&[f32]> {
        self.server.as_ref().map(|s| s.x.as_slice())
    }

    /// Per worker (index = rank, 0 included), the number of rounds whose push the server
    /// has received (rank 0 only).
    pub fn clocks(&self) -> Option<&[u64]> {
        self.server.as_ref().map(|s| s.clock.as_slice())
    }

    fn encode(kind: FrameKind, sender: Rank, round: u64, d: usize, v: Option<&[f32]>) -> Vec<u8> {
        let payload_len = v.map_or(0, |v| 4 * v.len());
        let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload_len);
        FrameHeader {
            kind,
            sender,
            round,
            dim: d as u32,
            payload_len: payload_len as u32,
        }
        .emit(&mut frame);
        for x in v.unwrap_or(&[]) {
            frame.extend_from_slice(&x.to_le_bytes());
        }
        frame
    }

    /// Applies worker `j`'s push for round `t` (already validated) on the server and
    /// answers every worker that may now proceed.
    fn server_push(&mut self, j: Rank, t: u64, grad: Option<&[f32]>) {
        let n = self.cfg.n;
        let lr = self.cfg.lr;
        let mode = self.cfg.mode;
        let s = self.server.as_mut().expect("rank 0 is the server");
        s.clock[j] = t + 1;
        s.waiting[j] = Some(t);
        match mode {
            PsMode::Bsp => {
                if let Some(g) = grad {
                    for (a, v) in s.sum.iter_mut().zip(g) {
                        *a += v;
                    }
                }
                if s.clock.iter().all(|&c| c > t) {
                    let n = n as f32;
                    for (x, a) in s.x.iter_mut().zip(&mut s.sum) {
                        *x -= lr * (*a / n);
                        *a = 0.0;
                    }
                }
            }
            PsMode::Ssp { .. } | PsMode::Asp => {
                if let Some(g) = grad {
                    let step = lr / n as f32;
                    for (x, v) in s.x.iter_mut().zip(g) {
                        *x -= step * v;
                    }
                }
            }
        }
        self.release();
    }

    /// Whether an answer to a push for round `t` may be sent now.
    fn may_answer(staleness: u64, clock: &[u64], t: u64) -> bool {
        let c_min = clock.iter().copied().min().unwrap_or(0);
        t < c_min.saturating_add(staleness)
    }

    /// Answers, in ascending rank, every waiting worker the staleness rule lets proceed.
    fn release(&mut self) {
        let staleness = self.cfg.mode.staleness();
        let d = self.x.len();
        let s = self.server.as_mut().expect("rank 0 is the server");
        // One encoded frame per distinct round answered in this batch.
        let mut frames: Vec<(u64, Bytes)> = Vec::new();
        let mut own = false;
        for j in 0..self.cfg.n {
            let Some(t) = s.waiting[j] else { continue };
            if !Self::may_answer(staleness, &s.clock, t) {
                continue;
            }
            s.waiting[j] = None;
            if j == 0 {
                own = true;
                continue;
            }
            let frame = match frames.iter().find(|(r, _)| *r == t) {
                Some((_, f)) => f.clone(),
                None => {
                    let f = Bytes::from(Self::encode(FrameKind::Pull, 0, t, d, Some(&s.x)));
                    frames.push((t, f.clone()));
                    f
                }
            };
            self.outgoing.push_back((j, frame));
        }
        if own {
            self.x.copy_from_slice(&s.x);
            self.finish();
        }
    }

    fn finish(&mut self) {
        self.mixing = false;
        self.deadline = None;
        self.events
            .push_back(GossipEvent::Mixed { round: self.round });
        self.round += 1;
    }

    /// Reads a raw f32 vector payload of exactly `4·d` bytes (or nothing, if `empty_ok`)
    /// and checks that every value is finite. `Ok(None)` for an empty payload.
    fn read_vector(
        &self,
        from: Rank,
        payload: &[u8],
        empty_ok: bool,
    ) -> Result<Option<Vec<f32>>, GossipError> {
        let bad = |source| GossipError::Payload {
            from,
            cause: source,
        };
        let expected = 4 * self.x.len();
        if empty_ok && payload.is_empty() {
            return Ok(None);
        }
        if payload.len() != expected {
            return Err(bad(DecodeError::PayloadLength {
                operator: PAYLOAD,
                declared: payload.len(),
                expected,
            }));
        }
        let v: Vec<f32> = payload
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(index) = v.iter().position(|x| !x.is_finite()) {
            return Err(bad(DecodeError::NonFinite { index }));
        }
        Ok(Some(v))
    }
}

impl Gossip for ParameterServer {
    /// Pushes `grad: [d]` (`None`: no gradient, read as zero) for this round and waits for
    /// the server's parameters. `x` is only checked for its length (see the module docs).
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        assert!(
            !self.mixing,
            "begin_round while round {} is still mixing",
            self.round
        );
        let d = self.x.len();
        assert_eq!(x.len(), d, "x must have length d");
        if let Some(g) = grad {
            assert_eq!(g.len(), d, "grad must have length d");
        }
        self.mixing = true;
        self.deadline = Some(now + self.cfg.round_timeout);
        if self.is_server() {
            self.server_push(0, self.round, grad);
        } else {
            let f = Self::encode(FrameKind::Push, self.cfg.rank, self.round, d, grad);
            self.outgoing.push_back((0, f.into()));
        }
    }

    fn handle_message(
        &mut self,
        _now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        let expected_kind = if self.is_server() {
            FrameKind::Push
        } else {
            FrameKind::Pull
        };
        let (h, payload) =
            crate::parse_frame(frame, self.cfg.max_payload_bytes, expected_kind, from)?;
        let neighbour = match &self.server {
            Some(_) => from != 0 && from < self.cfg.n,
            None => from == 0,
        };
        if !neighbour {
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
        // The one round accepted from this sender, if any.
        let (next, open) = match &self.server {
            Some(s) => (s.clock[from], s.waiting[from].is_none()),
            None => (self.round, self.mixing),
        };
        if h.round < next {
            return Err(GossipError::Duplicate {
                from,
                round: h.round,
            });
        }
        if h.round > next || !open {
            let (lo, hi) = if open { (next, next) } else { (next + 1, next) };
            return Err(GossipError::RoundOutOfWindow {
                from,
                round: h.round,
                lo,
                hi,
            });
        }
        let v = self.read_vector(from, payload, self.is_server())?;
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame.len() as u64;
        if self.is_server() {
            self.server_push(from, h.round, v.as_deref());
        } else if let Some(v) = v {
            self.x = v;
            self.finish();
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        if !(self.mixing && self.deadline.is_some_and(|t| now >= t)) {
            return;
        }
        let missing = match &self.server {
            // The workers whose pushes hold rank 0's own answer back.
            Some(s) => {
                let need = (self.round + 1).saturating_sub(self.cfg.mode.staleness());
                (0..self.cfg.n).filter(|&j| s.clock[j] < need).collect()
            }
            None => vec![0],
        };
        self.events.push_back(GossipEvent::RoundTimedOut {
            round: self.round,
            missing,
        });
        // Report once per deadline; the driver decides what to do.
        self.deadline = None;
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let (to, frame) = self.outgoing.pop_front()?;
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += frame.len() as u64;
        Some(Transmit { to, frame })
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

    /// Server: every other peer; worker: `[0]`.
    fn out_peers(&self) -> Vec<Rank> {
        if self.is_server() {
            crate::peer_set(0, 0..self.cfg.n)
        } else {
            vec![0]
        }
    }

    /// Server: every other peer; worker: `[0]`.
    fn in_peers(&self) -> Vec<Rank> {
        self.out_peers()
    }
}

/// The parameter server in the [`crate::registry`].
pub struct PsAlgorithm;

/// The registry's entry for the parameter server.
pub const PS: PsAlgorithm = PsAlgorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Fixed("parameter server on peer 0"),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Nothing,
    default_compressor: CompressorSpec::Identity,
    options: &[ProtocolOption::PS_MODE],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::No,
};

impl Algorithm for PsAlgorithm {
    fn name(&self) -> &'static str {
        "ps"
    }
    fn about(&self) -> &'static str {
        "Parameter server on peer 0 (also a worker): workers push gradients, the server \
         updates and answers with the parameters; --ps-mode bsp, ssp:S or asp"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: crate::BuildContext<'_>) -> Result<Box<dyn Gossip>, crate::BuildError> {
        let mut cfg = PsConfig::new(
            ctx.rank,
            ctx.peers(),
            ctx.lr,
            ctx.options.ps_mode,
            ctx.dim(),
        );
        cfg.round_timeout = ctx.round_timeout;
        Ok(Box::new(ParameterServer::new(cfg, ctx.x0)))
    }
}
