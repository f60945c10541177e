//! A peer's membership protocol as a sans-I/O state machine: departures (a leave notice, a
//! lost connection, a restarted peer's hello), the empty ranks of an elastic run, the
//! admission of a new peer, and rejoins (another peer's, and this peer's own way back).
//!
//! [`Membership`] decides; it sends nothing, opens and closes no connection, reads no clock
//! (the time of an event comes in as [`Now`]) and logs nothing. Its answers say what the
//! peer's core (`peer::core`, which turns them into actions for its shell) must do:
//! re-weight and tell the algorithm, drop or open links, flood a notice ([`Flood`]), record a [`MembershipEvent`], or count a refused
//! frame ([`Refusal`]). The notices' wire format is in [`codec`] (re-exported here).

pub mod codec;

pub use codec::*;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::SocketAddr;

use murmur_gossip::Rank;
use murmur_topology::{MixingMatrix, TopologyError};
use serde::{Deserialize, Serialize};

use crate::control::auth;
use crate::plane::Incarnation;
use crate::report::MembershipEvent;

/// A peer's answer to a restarted peer's hello (the JSON part of a `Welcome` frame, which
/// carries no parameters: the restarted peer fetches x and its optimizer's state in parts from the donors
/// [`RejoinPlan::donors`] chooses).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    /// The sender's round (the next to begin, or the one mixing).
    pub round: u64,
    /// Peers the sender knows to have left, the hello's sender excluded.
    pub departed: Vec<Rank>,
    /// The rejoins the sender knows of, as (peer, round it mixes from), the hello's sender
    /// excluded: a restarted peer 0 learns from them which peers came back while it was
    /// away, and from which epoch their reports come again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejoined: Vec<(Rank, u64)>,
    /// Where the processes of the peers in `rejoined` listen, as (peer, incarnation,
    /// data-plane address), from their rejoin notices: a restarted peer opens its links to
    /// them there (its directory may predate their rejoin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<(Rank, Incarnation, SocketAddr)>,
    /// The sender's copy of the run's record ([`crate::report::copy`]): a restarted peer 0
    /// completes its run folder from it (a stand-in may have kept the record in a folder
    /// of its own), and any peer keeps it in case it keeps the record one day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) record: Vec<crate::report::copy::RecordLine>,
}

/// When an event is handled, as the driver reads it (the state machine reads no clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Now {
    /// The algorithm's round (the next to begin, or the one mixing).
    pub round: u64,
    /// The epoch being trained (0 before training).
    pub epoch: usize,
    /// Seconds since training started.
    pub wall_seconds: f64,
}

/// A frame to send on every link of the peer except those to the ranks in `except`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flood {
    /// The whole frame: the 24-byte header, then the payload.
    pub frame: Vec<u8>,
    /// Ranks not sent to (the notice's sender, the peer it is about).
    pub except: Vec<Rank>,
}

/// Why a membership frame was dropped; the driver counts it as a refused frame. Its
/// `Display` is the logged line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A leave notice that does not decode, or about a rank outside the run.
    MalformedLeave,
    /// A hello that does not decode, or whose entry is not the sender's rank.
    MalformedHello,
    /// An admission notice that does not decode, or for a rank outside the run.
    MalformedAdmit,
    /// A rejoin notice that does not decode, or about a rank outside the run.
    MalformedRejoin,
    /// An admission to `rank` without a valid signature of the member it names as its
    /// signer.
    Unsigned {
        /// The rank the admission is for.
        rank: Rank,
    },
    /// An admission to `rank`, which is not an empty rank here (or is this peer's).
    NotEmpty {
        /// The rank the admission is for.
        rank: Rank,
    },
    /// An admission to `rank`, which another member gave to another new peer already (two
    /// members that each took themselves for the lowest live one admitted at once).
    Conflict {
        /// The rank the admission is for.
        rank: Rank,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::MalformedLeave => write!(f, "dropped a malformed departure notice"),
            Refusal::MalformedHello => write!(f, "dropped a malformed hello"),
            Refusal::MalformedAdmit => write!(f, "dropped a malformed admission notice"),
            Refusal::MalformedRejoin => write!(f, "dropped a malformed rejoin notice"),
            Refusal::Unsigned { rank } => write!(
                f,
                "dropped an admission for rank {rank} that no member of the run signed"
            ),
            Refusal::Conflict { rank } => write!(
                f,
                "dropped an admission for rank {rank}, which another member gave to another \
                 new peer already (the first admission heard of holds here)"
            ),
            Refusal::NotEmpty { rank } => write!(
                f,
                "dropped an admission for rank {rank}, which is not an empty rank here"
            ),
        }
    }
}

/// What the state machine answers to a frame or an event: act on it, nothing to do (a
/// notice already known), or drop it as refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<T> {
    /// Act on it.
    Accept(T),
    /// Already known or about this peer: nothing to do.
    Ignore,
    /// Dropped; counted as a refused frame.
    Refuse(Refusal),
}

/// A membership step that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// Peer 0 could not sign an admission (the key's error).
    #[error("signing an admission: {0}")]
    Signing(String),
}

/// Why a restarted peer cannot rejoin with the welcomes it got.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejoinError {
    /// A destination it could not connect to is still a member for every peer that
    /// welcomed it (the driver appends the connection's error).
    #[error("cannot reach peer {0}, which the run still counts as a member")]
    Unreachable(Rank),
    /// The agreed round `at` is not before the run's last round `total_rounds`.
    #[error("the run ends at round {total_rounds}, too soon for this peer to mix from round {at}")]
    TooLate {
        /// The run's number of rounds.
        total_rounds: u64,
        /// The round it would mix again from.
        at: u64,
    },
}

/// A departure to carry out: re-weight without `all_gone`, tell the algorithm that `gone`
/// left, drop its links to processes of incarnations below `before`, flood the notice and
/// record it.
#[derive(Debug, Clone)]
pub struct Departure {
    /// The peer that left.
    pub gone: Rank,
    /// What was noticed.
    pub reason: String,
    /// The peer that noticed it.
    pub noticed_by: Rank,
    /// This peer's round when it learned of it.
    pub round: u64,
    /// Its line of `membership.jsonl` (event `left`), recorded by peer 0.
    pub record: MembershipEvent,
    /// Every peer departed now, `gone` included: the algorithm mixes without them.
    pub all_gone: Vec<Rank>,
    /// The departed processes are those of `gone` with incarnations below this: a newer
    /// process's links (one that said hello, or restarts while the notice travels) stay
    /// open.
    pub before: Incarnation,
    /// The leave notice passed on to every link.
    pub flood: Flood,
}

/// An accepted hello of a restarted peer.
#[derive(Debug, Clone)]
pub struct Hello {
    /// The restarted peer.
    pub from: Rank,
    /// Its new data-plane address, to open a link to.
    pub addr: SocketAddr,
    /// What its restart means for the membership.
    pub restart: Restart,
}

/// What a hello means for a peer's old process.
#[derive(Debug, Clone)]
pub enum Restart {
    /// It was known to have left: only the connections of processes older than the new
    /// one (incarnations below `before`) are closed.
    KnownDeparted {
        /// The new process's incarnation.
        before: Incarnation,
    },
    /// It was counted as a member: its old process has left.
    Departed(Box<Departure>),
    /// Nothing changes (a departure notice about an older process, or about this peer).
    Unchanged,
}

/// An accepted admission: identity `id` takes the empty rank `rank`.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// The empty rank taken.
    pub rank: Rank,
    /// The new peer's identity, admitted to the data plane as `rank`.
    pub id: libp2p::PeerId,
    /// The admission notice (with peer 0's signature) passed on once.
    pub flood: Flood,
}

/// A rejoin notice seen for the first time: peer `back` asks to mix again from round `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejoinNotice {
    /// The returning (or new) peer.
    pub back: Rank,
    /// The incarnation of its process.
    pub incarnation: Incarnation,
    /// The round it mixes from.
    pub at: u64,
    /// Its data-plane address.
    pub addr: SocketAddr,
    /// The peer that told this one.
    pub from: Rank,
    /// The peers still departed: the algorithm mixes without them.
    pub still_gone: Vec<Rank>,
}

/// A rejoin the algorithm accepted (see [`Membership::readmit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readmitted {
    /// `back` took an empty rank (a new peer), rather than coming back.
    pub new: bool,
    /// Every rank is now taken: the data plane refuses strangers at once again.
    pub all_taken: bool,
    /// The rejoin notice passed on (not to `back`, nor to the notice's sender).
    pub flood: Flood,
}

/// A restarted peer's plan to rejoin, from the welcomes to its hellos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejoinPlan {
    /// The round it mixes again from: the highest welcome round plus the margin; for a
    /// peer 0 that only collects, the run's number of rounds (a round nobody reaches).
    pub at: u64,
    /// Peer 0 came back too late to mix again: it only collects the record (it trains no
    /// more, waits for no frame, and nobody mixes with it again).
    pub collects_only: bool,
    /// The peers some welcome named as departed (this peer excluded).
    pub departed: BTreeSet<Rank>,
    /// The peers that welcomed it and are not departed: each says goodbye to it at the end.
    pub welcomed: Vec<Rank>,
    /// The latest rejoin of each other peer that some welcome told of, as peer → round it
    /// mixes from; the peers in `departed` excluded.
    pub rejoined: BTreeMap<Rank, u64>,
    /// Where the newest process of each peer in `rejoined` listens, as peer → (incarnation,
    /// data-plane address), when a welcome told it ([`Welcome::locations`]).
    pub locations: BTreeMap<Rank, (Incarnation, SocketAddr)>,
}

impl RejoinPlan {
    /// The peers a restarted peer fetches its parameters x from ([`crate::peer`]'s
    /// catch-up, in parts, several at once): its present in-neighbours `in_peers` (of W) that
    /// welcomed it, so that its start is its neighbours' state and peer 0, to which every
    /// joiner says hello, does not serve every joiner; if none of them did (an elastic
    /// run's holes around its rank), every peer that welcomed it (peer 0 at least). A peer
    /// in `restarting` (its new process said hello here too: it is rejoining itself, its x
    /// not yet caught up) donates only if no other can. Ascending; empty only without
    /// welcomes.
    pub fn donors(&self, in_peers: &[Rank], restarting: &BTreeSet<Rank>) -> Vec<Rank> {
        let present: Vec<Rank> = (self.welcomed.iter().copied())
            .filter(|r| in_peers.contains(r))
            .collect();
        let pool = if present.is_empty() {
            self.welcomed.clone()
        } else {
            present
        };
        let settled: Vec<Rank> = (pool.iter().copied())
            .filter(|r| !restarting.contains(r))
            .collect();
        let mut donors = if settled.is_empty() { pool } else { settled };
        donors.sort_unstable();
        donors
    }
}

/// Keeps in `locations` the location of `rank`'s newest process: `(incarnation, addr)`
/// unless a newer incarnation is held.
fn keep_newest(
    locations: &mut BTreeMap<Rank, (Incarnation, SocketAddr)>,
    rank: Rank,
    (incarnation, addr): (Incarnation, SocketAddr),
) {
    if locations.get(&rank).is_none_or(|&(i, _)| i <= incarnation) {
        locations.insert(rank, (incarnation, addr));
    }
}

/// The mixing matrix for the survivors once the peers in `gone` have left, and, if the
/// surviving graph is not (strongly) connected, a description of its parts. Algorithms
/// that re-weight (`reweights`) get Metropolis–Hastings on the surviving graph; push-sum
/// keeps W (it only stops pushing to the departed), and its parts are told by strong
/// connectivity of W's support.
///
/// # Errors
/// A re-weighting algorithm on a directed topology.
pub fn surviving(
    w: &MixingMatrix,
    reweights: bool,
    gone: &[Rank],
) -> Result<(MixingMatrix, Option<String>), TopologyError> {
    if reweights {
        let s = w.without_peers(gone)?;
        let split = (!s.is_connected()).then(|| format!("components {:?}", s.components));
        Ok((s.w, split))
    } else {
        let split = (!w.graph().strongly_connected_without(gone)).then(|| {
            let alive: Vec<Rank> = (0..w.n()).filter(|r| !gone.contains(r)).collect();
            format!("the survivors {alive:?} are not strongly connected: push-sum shares cannot reach every one of them")
        });
        Ok((w.clone(), split))
    }
}

/// The membership state machine of peer `me` in a run of `n` ranks, over the state its
/// driver keeps: the departed peers with their records, the rejoins taken part in, and the
/// newest incarnation known of each rank.
#[derive(Debug)]
pub struct Membership {
    me: Rank,
    n: usize,
    /// The newest incarnation known of each rank (0: unknown), from the directory, hellos
    /// and rejoin notices: a notice about an older process is not about the member.
    incarnations: Vec<Incarnation>,
    /// The newest incarnation of each rank whose process is known to have exited (0: none),
    /// from the supervisor's notices: a rejoin notice about such a process is stale.
    exited: Vec<Incarnation>,
    /// The peers that left (and have not rejoined) with their records (event `left` or
    /// `empty`).
    departed: BTreeMap<Rank, MembershipEvent>,
    /// The rejoins handled, as (peer, round it mixes from).
    rejoined: Vec<(Rank, u64)>,
    /// This peer restarted: the latest rejoin of each other peer that its welcomes told of
    /// (the peers departed then excluded), as peer → round it mixes from.
    rejoins_heard: BTreeMap<Rank, u64>,
    /// Where each peer's newest rejoined process listens, as peer → (incarnation,
    /// data-plane address), from rejoin notices; passed on in welcomes.
    locations: BTreeMap<Rank, (Incarnation, SocketAddr)>,
}

impl Membership {
    /// Peer `me` of `n` ranks, knowing of no departure yet.
    pub fn new(me: Rank, n: usize) -> Self {
        Membership {
            me,
            n,
            incarnations: vec![0; n],
            exited: vec![0; n],
            departed: BTreeMap::new(),
            rejoined: Vec::new(),
            rejoins_heard: BTreeMap::new(),
            locations: BTreeMap::new(),
        }
    }

    /// This restarted peer's welcomes told of `plan`'s rejoins ([`RejoinPlan::rejoined`]).
    pub fn heard_of_rejoins(&mut self, plan: &RejoinPlan) {
        self.rejoins_heard = plan.rejoined.clone();
    }

    /// The rejoins this restarted peer heard of in its welcomes, as peer → round it mixes
    /// from ([`Membership::heard_of_rejoins`]).
    pub fn rejoins_heard(&self) -> &BTreeMap<Rank, u64> {
        &self.rejoins_heard
    }

    /// Rank `rank`'s process has incarnation `incarnation` (from the directory, a hello,
    /// a rejoin notice): kept if it is the newest known.
    pub fn learn_incarnation(&mut self, rank: Rank, incarnation: Incarnation) {
        if let Some(i) = self.incarnations.get_mut(rank) {
            *i = (*i).max(incarnation);
        }
    }

    /// Rank `rank`'s process of incarnation `incarnation` exited (its supervisor saw it):
    /// a later rejoin notice about it, or an older process of the rank, is ignored.
    pub fn exited(&mut self, rank: Rank, incarnation: Incarnation) {
        if let Some(i) = self.exited.get_mut(rank) {
            *i = (*i).max(incarnation);
        }
    }

    /// The newest incarnation of `rank` whose process is known to have exited (0: none).
    pub fn exited_incarnation(&self, rank: Rank) -> Incarnation {
        self.exited.get(rank).copied().unwrap_or(0)
    }

    /// The newest incarnation known of `rank` (0: unknown).
    pub fn incarnation(&self, rank: Rank) -> Incarnation {
        self.incarnations.get(rank).copied().unwrap_or(0)
    }

    /// The peers that left (and have not rejoined), with their records.
    pub fn departed(&self) -> &BTreeMap<Rank, MembershipEvent> {
        &self.departed
    }

    /// The lowest rank this peer counts in the run: not departed, not an empty rank (this
    /// peer's own at most).
    pub fn lowest_live(&self) -> Rank {
        (0..self.me)
            .find(|r| !self.departed.contains_key(r))
            .unwrap_or(self.me)
    }

    /// The rejoins this peer has taken part in, as (peer, round it mixes from).
    pub fn rejoined(&self) -> &[(Rank, u64)] {
        &self.rejoined
    }

    /// Whether `peer` has left (or is an empty rank) as far as this peer knows.
    pub fn has_left(&self, peer: Rank) -> bool {
        self.departed.contains_key(&peer)
    }

    /// The processes of peer `gone` with incarnations below `before` left (`reason`,
    /// noticed by `noticed_by` at its round `noticed_round`): recorded once. `None` for a
    /// known departure, one about this peer, or one about processes older than the newest
    /// known of `gone` (a notice about its previous process, which must not touch the new
    /// one). Peer 0 leaves like any other peer: whether the run can go on without it is
    /// the algorithm's to say (the parameter server cannot), and its record waits for its
    /// restart (`--rejoin-running`).
    pub fn depart(
        &mut self,
        (gone, before): (Rank, Incarnation),
        reason: String,
        noticed_by: Rank,
        noticed_round: u64,
        now: Now,
    ) -> Option<Departure> {
        if gone == self.me || self.departed.contains_key(&gone) || before <= self.incarnation(gone)
        {
            return None;
        }
        let record = MembershipEvent {
            event: "left".into(),
            peer: gone,
            round: now.round,
            epoch: now.epoch,
            wall_seconds: now.wall_seconds,
            noticed_by,
            reason: reason.clone(),
        };
        self.departed.insert(gone, record.clone());
        Some(Departure {
            gone,
            noticed_by,
            round: now.round,
            record,
            all_gone: self.departed.keys().copied().collect(),
            before,
            flood: Flood {
                frame: encode_leave(self.me, noticed_round, (gone, before), &reason),
                except: Vec::new(),
            },
            reason,
        })
    }

    /// A leave notice (`payload` of a `Leave` frame of round `noticed_round`) from `from`.
    ///
    pub fn on_leave(
        &mut self,
        from: Rank,
        noticed_round: u64,
        payload: &[u8],
        now: Now,
    ) -> Verdict<Departure> {
        match decode_leave(payload) {
            Some((gone, before, reason)) if gone < self.n => self
                .depart((gone, before), reason, from, noticed_round, now)
                .map_or(Verdict::Ignore, Verdict::Accept),
            _ => Verdict::Refuse(Refusal::MalformedLeave),
        }
    }

    /// A hello (`payload` of a `Hello` frame) from the new process of peer `from`: if it
    /// was still counted as a member, its old process has left. A hello from a process
    /// older than one known already is ignored.
    pub fn on_hello(&mut self, from: Rank, payload: &[u8], now: Now) -> Verdict<Hello> {
        let Some(info) = decode_hello(payload, from) else {
            return Verdict::Refuse(Refusal::MalformedHello);
        };
        let new = info.incarnation;
        if new < self.incarnation(from) {
            return Verdict::Ignore;
        }
        let restart = if self.departed.contains_key(&from) {
            Restart::KnownDeparted { before: new }
        } else {
            let reason = "it restarted: a new process said hello".to_string();
            match self.depart((from, new), reason, self.me, now.round, now) {
                Some(d) => Restart::Departed(Box::new(d)),
                None => Restart::Unchanged,
            }
        };
        self.learn_incarnation(from, new);
        Verdict::Accept(Hello {
            from,
            addr: info.data_addr,
            restart,
        })
    }

    /// This peer's answer to the hello of `to` at round `round`.
    pub fn welcome(&self, to: Rank, round: u64) -> Welcome {
        Welcome {
            round,
            departed: self.departed.keys().copied().filter(|&r| r != to).collect(),
            rejoined: self
                .rejoined
                .iter()
                .copied()
                .filter(|&(r, _)| r != to)
                .collect(),
            locations: (self.locations.iter())
                .filter(|(&r, _)| r != to)
                .map(|(&r, &(incarnation, addr))| (r, incarnation, addr))
                .collect(),
            record: Vec::new(),
        }
    }

    /// The ranks of an elastic run that nobody has taken yet (`empty`) are out of the run
    /// from the start: recorded as departed with event `empty` (round 0). Returns their
    /// records, in the order of `empty`.
    pub fn start_empty(&mut self, empty: &[Rank]) -> Vec<MembershipEvent> {
        empty
            .iter()
            .map(|&g| {
                let record = MembershipEvent {
                    event: "empty".into(),
                    peer: g,
                    round: 0,
                    epoch: 0,
                    wall_seconds: 0.0,
                    noticed_by: self.me,
                    reason: "not taken yet: the run started with --initial-peers".into(),
                };
                self.departed.insert(g, record.clone());
                record
            })
            .collect()
    }

    /// An admission notice (`payload` of an `Admit` frame) from `from`; see
    /// [`Membership::admit`].
    ///
    /// # Errors
    /// As [`Membership::admit`].
    pub fn on_admit(
        &self,
        from: Rank,
        payload: &[u8],
        peer_ids: &[Option<libp2p::PeerId>],
        key: Option<&libp2p::identity::Keypair>,
    ) -> Result<Verdict<Admission>, MembershipError> {
        match decode_admit(payload) {
            Some((rank, id, signed)) if rank < self.n => {
                self.admit(rank, id, Some(signed), from, peer_ids, key)
            }
            _ => Ok(Verdict::Refuse(Refusal::MalformedAdmit)),
        }
    }

    /// A new peer with identity `id` took the empty rank `rank`, admitted by the member
    /// `signed.signer` (told by peer `from`), or by this peer itself when `signed` is `None`
    /// (its own discovery admitted it: it signs with `key` as the signer). `peer_ids`: each
    /// rank's identity as known here.
    ///
    /// Any member may admit (the one that takes itself for the lowest live rank does:
    /// [`crate::control::discovery`]), and every peer checks the admission itself: the
    /// signature must be the Ed25519 signature over [`admit_message`] of the identity the
    /// directory holds for `signed.signer`, a member other than the admitted rank. So a
    /// forged admission is refused: an outsider holds no member's key, and a member cannot
    /// sign in another's name (the signer's rank is in the signed message); the data plane
    /// already refuses frames from identities not admitted.
    ///
    /// Ignored if `rank` already has that identity; refused without such a signature, for a
    /// rank that is not empty here, or for one already given to another identity (two
    /// members admitted at once: the first admission heard of holds).
    ///
    /// # Errors
    /// [`MembershipError::Signing`]: this peer's key cannot sign.
    pub fn admit(
        &self,
        rank: Rank,
        id: libp2p::PeerId,
        signed: Option<Signed>,
        from: Rank,
        peer_ids: &[Option<libp2p::PeerId>],
        key: Option<&libp2p::identity::Keypair>,
    ) -> Result<Verdict<Admission>, MembershipError> {
        let known = peer_ids.get(rank).copied().flatten();
        if known == Some(id) {
            return Ok(Verdict::Ignore);
        }
        let signed = match (signed, key) {
            (Some(signed), _) => signed,
            (None, Some(key)) => Signed {
                signer: self.me,
                signature: key
                    .sign(&admit_message(rank, self.me, &id))
                    .map_err(|e| MembershipError::Signing(e.to_string()))?,
            },
            (None, None) => return Ok(Verdict::Refuse(Refusal::Unsigned { rank })),
        };
        let valid = (signed.signer != rank)
            .then(|| peer_ids.get(signed.signer).copied().flatten())
            .flatten()
            .as_ref()
            .and_then(auth::public_key)
            .is_some_and(|k| k.verify(&admit_message(rank, signed.signer, &id), &signed.signature));
        if !valid {
            return Ok(Verdict::Refuse(Refusal::Unsigned { rank }));
        }
        let empty = self.departed.get(&rank).is_some_and(|e| e.event == "empty");
        if !empty || rank == self.me {
            return Ok(Verdict::Refuse(Refusal::NotEmpty { rank }));
        }
        if known.is_some() {
            return Ok(Verdict::Refuse(Refusal::Conflict { rank }));
        }
        Ok(Verdict::Accept(Admission {
            rank,
            id,
            flood: Flood {
                frame: encode_admit(self.me, rank, id, &signed),
                except: vec![from],
            },
        }))
    }

    /// A rejoin notice (`payload` of a `Rejoin` frame) from `from`; see
    /// [`Membership::rejoin_notice`].
    pub fn on_rejoin(&mut self, from: Rank, payload: &[u8]) -> Verdict<RejoinNotice> {
        match decode_rejoin(payload) {
            Some((back, incarnation, at, addr)) if back < self.n => self
                .rejoin_notice((back, incarnation), at, addr, from)
                .map_or(Verdict::Ignore, Verdict::Accept),
            _ => Verdict::Refuse(Refusal::MalformedRejoin),
        }
    }

    /// Peer `back`'s process of incarnation `incarnation` mixes again from round `at` at
    /// address `addr` (told by `from`): handled once per (peer, round), never about this
    /// peer, and not about a process known to have exited ([`Membership::exited`]: a notice
    /// that spread while that process died, e.g. a restarted peer killed again). The
    /// algorithm is then asked to take it back; if it does, [`Membership::readmit`].
    pub fn rejoin_notice(
        &mut self,
        (back, incarnation): (Rank, Incarnation),
        at: u64,
        addr: SocketAddr,
        from: Rank,
    ) -> Option<RejoinNotice> {
        let dead = self.exited.get(back).is_some_and(|&i| incarnation <= i);
        if back == self.me || dead || self.rejoined.contains(&(back, at)) {
            return None;
        }
        self.rejoined.push((back, at));
        self.learn_incarnation(back, incarnation);
        keep_newest(&mut self.locations, back, (incarnation, addr));
        let still_gone = self
            .departed
            .keys()
            .copied()
            .filter(|&r| r != back)
            .collect();
        Some(RejoinNotice {
            back,
            incarnation,
            at,
            addr,
            from,
            still_gone,
        })
    }

    /// The algorithm took `notice.back` back: it is a member again (a new one if its rank
    /// was empty), and the notice is passed on.
    pub fn readmit(&mut self, notice: &RejoinNotice) -> Readmitted {
        let new = self
            .departed
            .remove(&notice.back)
            .is_some_and(|e| e.event == "empty");
        let all_taken = new && !self.departed.values().any(|e| e.event == "empty");
        Readmitted {
            new,
            all_taken,
            flood: Flood {
                frame: encode_rejoin(
                    self.me,
                    (notice.back, notice.incarnation),
                    notice.at,
                    notice.addr,
                ),
                except: vec![notice.back, notice.from],
            },
        }
    }

    /// The record (event `joined` if `new`, else `rejoined`) of peer `back` mixing from
    /// round `at`, at `now`.
    pub fn rejoin_record(back: Rank, at: u64, new: bool, now: Now) -> MembershipEvent {
        MembershipEvent::back(back, at, new, (now.epoch, now.wall_seconds))
    }

    /// This restarted peer's plan from the `welcomes` to its hellos (by sender): the peers departed for any of them, the round it mixes again
    /// from (the highest welcome round plus `margin` rounds, 0 without welcomes, moved on
    /// by `align` to a round that exchanges frames: `Gossip::rejoin_round`), and who
    /// welcomed it. `unreachable`: the destinations it could not connect to, ascending. Peer
    /// 0 with `at` not before `total_rounds` still takes up the record: its plan
    /// [`RejoinPlan::collects_only`], at `total_rounds`.
    ///
    /// # Errors
    /// An unreachable destination that no welcome names as departed; `at` not before
    /// `total_rounds` (a peer other than 0).
    pub fn plan_rejoin(
        &self,
        welcomes: &BTreeMap<Rank, Welcome>,
        unreachable: impl IntoIterator<Item = Rank>,
        total_rounds: u64,
        margin: u64,
        align: impl Fn(u64) -> u64,
    ) -> Result<RejoinPlan, RejoinError> {
        // A peer whose rejoin this peer heard while rejoining (both restarted at once) is
        // back, whatever welcomes sent before that said.
        let back_since = |r: Rank| self.rejoined.iter().any(|&(p, _)| p == r);
        let departed: BTreeSet<Rank> = welcomes
            .values()
            .flat_map(|w| w.departed.iter().copied())
            .filter(|&r| r != self.me && !back_since(r))
            .collect();
        // A destination is also allowed to be unreachable if this peer itself knows its
        // process left (the supervisor saw it exit, or a new process of it said hello):
        // restarted at the same time as this one, it comes back through its own rejoin.
        let counted =
            |r: &Rank| !departed.contains(r) && !self.departed.contains_key(r) && !back_since(*r);
        if let Some(r) = unreachable.into_iter().find(counted) {
            return Err(RejoinError::Unreachable(r));
        }
        let at = align(welcomes.values().map(|w| w.round).max().unwrap_or(0) + margin);
        let collects_only = at >= total_rounds;
        if collects_only && self.me != 0 {
            return Err(RejoinError::TooLate { total_rounds, at });
        }
        let welcomed = welcomes
            .keys()
            .copied()
            .filter(|r| !departed.contains(r))
            .collect();
        let mut rejoined = BTreeMap::new();
        for &(r, round) in welcomes.values().flat_map(|w| &w.rejoined) {
            if r != self.me && !departed.contains(&r) {
                let latest = rejoined.entry(r).or_insert(round);
                *latest = (*latest).max(round);
            }
        }
        let mut locations = BTreeMap::new();
        for &(r, incarnation, addr) in welcomes.values().flat_map(|w| &w.locations) {
            if rejoined.contains_key(&r) {
                keep_newest(&mut locations, r, (incarnation, addr));
            }
        }
        Ok(RejoinPlan {
            at: at.min(total_rounds),
            collects_only,
            departed,
            welcomed,
            rejoined,
            locations,
        })
    }

    /// Peer `gone` had left when this peer rejoined at round `at`: recorded as departed
    /// (event `left`), unless already known (an empty rank stays empty, for a new peer may
    /// still take it).
    pub fn gone_before_rejoin(&mut self, gone: Rank, at: u64) {
        self.departed.entry(gone).or_insert(MembershipEvent {
            event: "left".into(),
            peer: gone,
            round: at,
            epoch: 0,
            wall_seconds: 0.0,
            noticed_by: self.me,
            reason: "gone when this peer rejoined".into(),
        });
    }

    /// This peer's process of incarnation `incarnation` mixes again from round `at` at its
    /// data-plane address `addr`: the rejoin notice to send to every link.
    pub fn rejoining(&mut self, incarnation: Incarnation, at: u64, addr: SocketAddr) -> Flood {
        self.rejoined.push((self.me, at));
        self.learn_incarnation(self.me, incarnation);
        Flood {
            frame: encode_rejoin(self.me, (self.me, incarnation), at, addr),
            except: Vec::new(),
        }
    }

    /// Whether this rejoining peer may begin round `at`: every in-neighbour of that round
    /// (`in_peers`) has sent its frame for it (`arrived`), has departed, or (re)joins at it
    /// or after it. A neighbour restarted at the same time as this peer and mixing again from
    /// the same round waits likewise before sending its frame of that round: waiting for it
    /// here would deadlock both (its frame comes in the round itself).
    pub fn ready_to_mix(&self, at: u64, in_peers: &[Rank], arrived: &HashSet<Rank>) -> bool {
        in_peers.iter().all(|r| {
            arrived.contains(r)
                || self.departed.contains_key(r)
                || self.rejoined.iter().any(|&(p, a)| p == *r && a >= at)
        })
    }
}

#[cfg(test)]
mod tests;
