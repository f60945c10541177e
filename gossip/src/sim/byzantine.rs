//! A Byzantine peer for tests and experiments: wraps an honest peer's state machine and
//! replaces the model in every gossip message it sends by an attack, so that the honest
//! peers' robustness ([`crate::mixing::robust`]) can be measured. It is never part of a real run.
//!
//! The wrapped peer runs the algorithm as usual (it receives, mixes and trains, so its
//! frames keep the run's schedule); only the values of its outgoing [`FrameKind::Gossip`]
//! frames change, re-encoded as raw `f32` (identity messages, which every receiver
//! decodes). Attacks on the message x_b it would have sent:
//!
//! | attack | sends | source |
//! |---|---|---|
//! | `signflip` | −x_b | "bit flipping", as in He, Karimireddy & Jaggi 2022 |
//! | `noise[:σ]` | x_b + N(0, σ²) per coordinate (σ = 1) | Gaussian attack |
//! | `alie[:z]` | μ − z·s per coordinate (z = 1), μ and s the mean and standard deviation of the neighbours' models it received in the previous round | "a little is enough", Baruch, Baruch & Goldberg 2019 |
//! | `constant[:c]` | c in every coordinate (c = 1) | |
//!
//! **Increments** ([`Byzantine::with_increments`], for CHOCO-SGD, whose messages are
//! increments q of a public copy x̂ that every receiver sums): the attack sets the copy
//! instead — the peer sends q = A − x̂_b, so that every neighbour's x̂_b becomes the attack
//! vector A of that round (computed from its x^(t+½) as above), and ALIE takes μ and s over
//! the copies x̂_j it has summed.
//!
//! ALIE here sees only its own in-neighbours, one round late (the paper's attacker is
//! omniscient: it knows every honest model of the round); before it has heard a round it
//! sends its own x_b.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use murmur_compress::{Compressor, Identity};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use crate::{Bytes, Gossip, GossipError, MembershipError, Rank, Transmit};

/// What a Byzantine peer sends (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attack {
    /// −x_b.
    SignFlip,
    /// x_b + N(0, σ²) per coordinate.
    Noise {
        /// σ > 0.
        sigma: f32,
    },
    /// "A little is enough": μ − z·s of the neighbours' models, per coordinate.
    Alie {
        /// z > 0.
        z: f32,
    },
    /// c in every coordinate.
    Constant {
        /// c (finite).
        c: f32,
    },
}

impl fmt::Display for Attack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attack::SignFlip => f.write_str("signflip"),
            Attack::Noise { sigma } => write!(f, "noise:{sigma}"),
            Attack::Alie { z } => write!(f, "alie:{z}"),
            Attack::Constant { c } => write!(f, "constant:{c}"),
        }
    }
}

impl FromStr for Attack {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown attack {s:?}: expected signflip, noise[:SIGMA], alie[:Z] or \
                 constant[:C] (SIGMA, Z > 0)"
            )
        };
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |default: f32, positive: bool| -> Result<f32, String> {
            match arg {
                None => Ok(default),
                Some(a) => match a.parse::<f32>() {
                    Ok(v) if v.is_finite() && (!positive || v > 0.0) => Ok(v),
                    _ => Err(bad()),
                },
            }
        };
        match name {
            "signflip" if arg.is_none() => Ok(Attack::SignFlip),
            "noise" => Ok(Attack::Noise {
                sigma: num(1.0, true)?,
            }),
            "alie" => Ok(Attack::Alie { z: num(1.0, true)? }),
            "constant" => Ok(Attack::Constant {
                c: num(1.0, false)?,
            }),
            _ => Err(bad()),
        }
    }
}

/// `RANK:ATTACK`, e.g. `3:signflip`: the peer of that rank attacks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ByzantineSpec {
    /// The attacking peer.
    pub rank: Rank,
    /// Its attack.
    pub attack: Attack,
}

impl fmt::Display for ByzantineSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.rank, self.attack)
    }
}

impl FromStr for ByzantineSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (rank, attack) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected RANK:ATTACK, e.g. 3:signflip"))?;
        Ok(ByzantineSpec {
            rank: rank
                .parse()
                .map_err(|_| format!("{s:?}: {rank:?} is not a rank"))?,
            attack: attack.parse()?,
        })
    }
}

/// A peer that attacks (see the [module docs](self)).
pub struct Byzantine {
    inner: Box<dyn Gossip>,
    attack: Attack,
    rng: StdRng,
    /// The latest model received from each in-neighbour, with its round (ALIE).
    heard: BTreeMap<Rank, (u64, Vec<f32>)>,
    /// `[d]` scratch.
    x: Vec<f32>,
    /// With increments: the copy x̂_b every receiver holds, and this round's attack frame
    /// (the same for every out-neighbour).
    increments: bool,
    sent: Vec<f32>,
    frame_of_round: Option<(u64, Bytes)>,
}

impl Byzantine {
    /// `inner` (any algorithm whose messages are [`FrameKind::Gossip`] frames of the model)
    /// attacking with `attack`; `seed` draws the noise.
    pub fn new(inner: Box<dyn Gossip>, attack: Attack, seed: u64) -> Self {
        let d = inner.params().len();
        Self {
            inner,
            attack,
            rng: StdRng::seed_from_u64(seed),
            heard: BTreeMap::new(),
            x: vec![0.0; d],
            increments: false,
            sent: Vec::new(),
            frame_of_round: None,
        }
    }

    /// Treats messages as increments of a public copy (CHOCO-SGD) when `on` (see the
    /// [module docs](self)).
    pub fn with_increments(mut self, on: bool) -> Self {
        self.increments = on;
        self.sent = if on {
            vec![0.0; self.x.len()]
        } else {
            Vec::new()
        };
        self
    }

    /// The attacked frame for `frame` (a gossip frame of this peer), or `frame` itself.
    fn corrupt(&mut self, frame: Bytes) -> Bytes {
        let Ok((h, payload)) = FrameHeader::parse(&frame, u32::MAX) else {
            return frame;
        };
        if h.kind != FrameKind::Gossip {
            return frame;
        }
        if self.increments {
            if let Some((round, f)) = &self.frame_of_round {
                if *round == h.round {
                    return f.clone();
                }
            }
            // The model it would have sent: its x^(t+½).
            self.x.copy_from_slice(self.inner.params());
        } else if murmur_compress::decode_into(payload, &mut self.x).is_err() {
            return frame;
        }
        match self.attack {
            Attack::SignFlip => self.x.iter_mut().for_each(|v| *v = -*v),
            Attack::Noise { sigma } => {
                let normal = Normal::new(0.0f32, sigma).expect("σ > 0, checked when parsed");
                for v in &mut self.x {
                    *v += normal.sample(&mut self.rng);
                }
            }
            Attack::Constant { c } => self.x.fill(c),
            Attack::Alie { z } => {
                let last = h.round.checked_sub(1);
                let models: Vec<&Vec<f32>> = self
                    .heard
                    .values()
                    .filter(|(r, _)| Some(*r) == last)
                    .map(|(_, x)| x)
                    .collect();
                if !models.is_empty() {
                    let k = models.len() as f64;
                    for (i, v) in self.x.iter_mut().enumerate() {
                        let mean = models.iter().map(|m| f64::from(m[i])).sum::<f64>() / k;
                        let var = models
                            .iter()
                            .map(|m| (f64::from(m[i]) - mean).powi(2))
                            .sum::<f64>()
                            / k;
                        *v = (mean - f64::from(z) * var.sqrt()) as f32;
                    }
                }
            }
        }
        if self.increments {
            // q = A − x̂_b: every receiver's copy becomes A.
            for (a, s) in self.x.iter_mut().zip(&mut self.sent) {
                let q = *a - *s;
                *s = *a;
                *a = q;
            }
        }
        // The header's place first, then the message, then the header with its length.
        let mut out = vec![0u8; FRAME_HEADER_LEN];
        let payload_len = Identity.compress(&self.x, &mut self.rng, &mut out);
        let header = FrameHeader {
            payload_len: u32::try_from(payload_len).expect("a model frame fits in u32"),
            ..h
        };
        out[..FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
        let out = Bytes::from(out);
        if self.increments {
            self.frame_of_round = Some((h.round, out.clone()));
        }
        out
    }
}

impl Gossip for Byzantine {
    /// Passed on; a gossip frame's model is also kept for ALIE.
    fn handle_message(
        &mut self,
        now: Instant,
        from: Rank,
        frame: &[u8],
    ) -> Result<(), GossipError> {
        self.inner.handle_message(now, from, frame)?;
        if matches!(self.attack, Attack::Alie { .. }) {
            if let Ok((h, payload)) = FrameHeader::parse(frame, u32::MAX) {
                if h.kind == FrameKind::Gossip {
                    let d = self.x.len();
                    // No round until a model decodes (the inner peer accepted it, so it does).
                    let (round, x) = self.heard.entry(from).or_insert((u64::MAX, vec![0.0; d]));
                    let decoded = if self.increments {
                        murmur_compress::decode_add(payload, 1.0, x)
                    } else {
                        murmur_compress::decode_into(payload, x)
                    };
                    if decoded.is_ok() {
                        *round = h.round;
                    }
                }
            }
        }
        Ok(())
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = self.inner.poll_transmit()?;
        Some(Transmit {
            to: t.to,
            frame: self.corrupt(t.frame),
        })
    }

    fn peer_left(
        &mut self,
        gone: Rank,
        w: &murmur_topology::MixingMatrix,
    ) -> Result<(), MembershipError> {
        self.inner.peer_left(gone, w)
    }

    fn peer_rejoined(
        &mut self,
        back: Rank,
        w: &murmur_topology::MixingMatrix,
        at: u64,
    ) -> Result<(), MembershipError> {
        self.inner.peer_rejoined(back, w, at)
    }

    fn apply_gradient(&mut self, grad: &[f32]) {
        self.inner.apply_gradient(grad);
    }

    crate::forward_gossip!(inner: begin_round, handle_timeout, poll_timeout, poll_event, params, round, stats, set_epoch, out_peers, in_peers, reweights, in_peers_at, catch_up_state, take_catch_up_state, rejoin_round, frame_round, start_at_round, state, restore_state, overlaps_gradient, communicates_in_background);
}
