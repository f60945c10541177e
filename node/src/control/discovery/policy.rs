//! Discovery's policy, as pure functions of the bootstrap's state and a request: who is
//! admitted or refused and why, which rank a peer gets, what peer 0 and the other members
//! answer, and what a joining peer makes of an answer. No swarm, no async, no I/O (and no
//! logging: the loops in [`super`] log the decisions); the run key's tags are HMACs
//! computed in memory.

use std::collections::HashSet;

use libp2p::PeerId;
use murmur_gossip::frame::FRAME_VERSION;
use murmur_gossip::Rank;

use super::{Directory, Discovered, Fingerprint, JoinRequest, JoinResponse, PeerInfo};
use crate::control::auth::RunKey;

/// Who may join besides the run options: the bootstrap's checks, and what a joining peer
/// asks of the bootstrap.
#[derive(Debug, Default)]
pub struct Gate {
    /// Only these identities may join (`--allow-peers`; checked by peer 0).
    pub allow: Option<HashSet<PeerId>>,
    /// The run key (`--run-key`): a joining peer and the bootstrap prove it to each other.
    pub key: Option<RunKey>,
}

impl Gate {
    /// Why bootstrap `local` refuses `peer` with the tag `proof`, if it does; a `new` peer
    /// (not a restarted one, whose identity was admitted before) must be on the allow-list.
    pub(super) fn refusal(
        &self,
        local: &PeerId,
        peer: &PeerId,
        proof: Option<&str>,
        new: bool,
    ) -> Option<String> {
        if new && self.allow.as_ref().is_some_and(|a| !a.contains(peer)) {
            return Some(format!(
                "peer {peer} is not on the run's allow-list (--allow-peers)"
            ));
        }
        if let Some(key) = &self.key {
            if !key.verify(proof, "join", peer, local) {
                return Some(format!(
                    "peer {peer} did not prove the run key (--run-key): it lacks the key or holds another run's"
                ));
            }
        }
        None
    }

    /// The bootstrap `local`'s tag for `joiner`, with a run key.
    pub(super) fn answer(&self, local: &PeerId, joiner: &PeerId) -> Option<String> {
        self.key.as_ref().map(|k| k.tag("answer", local, joiner))
    }
}

/// The lowest rank other than 0 that nobody has taken in `dir`.
pub(super) fn free_rank(dir: &[Option<PeerInfo>]) -> Option<Rank> {
    (1..dir.len()).find(|&r| dir[r].is_none())
}

/// Whether `request` would take an empty rank of the running run (a new peer, not a
/// restarted one).
pub(super) fn takes_empty_rank(dir: &[Option<PeerInfo>], request: &JoinRequest) -> bool {
    request.any_rank || dir.get(request.info.rank).is_some_and(Option::is_none)
}

/// The latest round that every peer holds a checkpoint of (`rounds`: each peer's checkpoint
/// rounds), if any.
pub(super) fn common_round(rounds: &[Vec<u64>]) -> Option<u64> {
    let (first, rest) = rounds.split_first()?;
    first
        .iter()
        .copied()
        .filter(|r| rest.iter().all(|rs| rs.contains(r)))
        .max()
}

/// The refusal of a peer of rank `rank` whose build speaks another frame protocol
/// (`theirs`) than this one's, if it does.
fn wire_differs(theirs: u8, rank: Rank) -> Option<String> {
    (theirs != FRAME_VERSION).then(|| {
        format!(
            "peer {rank} speaks frame protocol version {theirs}, this peer version {FRAME_VERSION} \
             (murmur {}): every peer of a run must run the same murmur release",
            env!("CARGO_PKG_VERSION")
        )
    })
}

/// The refusal of a peer of rank `rank` whose run options `theirs` differ from peer 0's
/// `ours`: `run options differ: ` and each field that differs.
fn options_differ(theirs: &Fingerprint, ours: &Fingerprint, rank: Rank) -> String {
    format!(
        "run options differ: {}",
        theirs.differences(ours, &format!("peer {rank}"), "peer 0")
    )
}

/// The bootstrap `local`'s decision on `request` from `peer` before the run starts, with
/// `slots` the entries taken so far (n of them, by rank) and `resuming` whether peer 0
/// resumes the whole run from its checkpoints: the peer's entry (the rank it asked for, or
/// the lowest free one for [`JoinRequest::any_rank`]; its `peer_id` the identity libp2p
/// authenticated), or why it is refused.
///
/// # Errors
/// The refusal's text: not let in by `gate`, `--resume` on one side only, run options that
/// differ (each field named), every rank taken, a rank out of range or already joined.
pub(super) fn admit_initial(
    slots: &[Option<PeerInfo>],
    fingerprint: &Fingerprint,
    gate: &Gate,
    (local, peer): (&PeerId, &PeerId),
    request: &JoinRequest,
    resuming: bool,
) -> Result<PeerInfo, String> {
    let n = fingerprint.peers;
    // Past n: refused below as out of range.
    let r = if request.any_rank {
        free_rank(slots).unwrap_or(n)
    } else {
        request.info.rank
    };
    if let Some(why) = gate.refusal(local, peer, request.proof.as_deref(), true) {
        return Err(why);
    }
    if let Some(why) = wire_differs(request.wire, r) {
        return Err(why);
    }
    if request.rejoin && !resuming {
        return Err("the run has not started yet (not every peer has joined); start this peer without --resume".into());
    }
    if !request.rejoin && resuming {
        return Err("the run resumes from its checkpoints (peer 0 has --resume); start this peer with --resume".into());
    }
    if request.fingerprint != *fingerprint {
        return Err(options_differ(&request.fingerprint, fingerprint, r));
    }
    if r >= n && request.any_rank {
        return Err(format!("all {n} ranks have joined"));
    }
    if r >= n {
        return Err(format!("rank {r} out of range for {n} peers"));
    }
    if slots.get(r).is_some_and(Option::is_some) {
        return Err(format!("rank {r} has already joined"));
    }
    let mut info = request.info.clone();
    info.rank = r;
    info.peer_id = peer.to_string();
    Ok(info)
}

/// Whether the initial set is complete: at least `initial` of the ranks in `slots` are
/// taken (peer 0's included).
pub(super) fn initial_complete(slots: &[Option<PeerInfo>], initial: usize) -> bool {
    slots.iter().filter(|s| s.is_some()).count() >= initial
}

/// The refusal when the peers of a whole-run resume hold no checkpoint of a common round:
/// each rank's checkpoint rounds (`rounds`, by rank).
pub(super) fn no_common_round(rounds: &[Vec<u64>]) -> String {
    format!(
        "the peers hold no checkpoint of a common round to resume from: {}",
        rounds
            .iter()
            .enumerate()
            .map(|(r, rs)| format!("peer {r} has {rs:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The round the initial peers continue from: `None` unless `resuming`; else the latest
/// round that every rank taken in `slots` holds a checkpoint of (`rounds`, by rank).
///
/// # Errors
/// Resuming, and no round is common to them all: [`no_common_round`]'s text, which every
/// waiting peer is refused with.
pub(super) fn resume_round(
    resuming: bool,
    rounds: &[Vec<u64>],
    slots: &[Option<PeerInfo>],
) -> Result<Option<u64>, String> {
    if !resuming {
        return Ok(None);
    }
    let joined: Vec<Vec<u64>> = rounds
        .iter()
        .zip(slots)
        .filter(|(_, s)| s.is_some())
        .map(|(r, _)| r.clone())
        .collect();
    common_round(&joined)
        .map(Some)
        .ok_or_else(|| no_common_round(rounds))
}

/// What peer 0 answers each initial peer once the initial set is complete: the directory,
/// with the round to continue from for a whole-run resume, and its run-key tag `proof`.
pub(super) fn initial_answer(
    dir: &[Option<PeerInfo>],
    resume_round: Option<u64>,
    proof: Option<String>,
) -> JoinResponse {
    match resume_round {
        None => JoinResponse::Directory {
            directory: dir.to_vec(),
            proof,
        },
        Some(round) => JoinResponse::Resume {
            directory: dir.to_vec(),
            round,
            proof,
        },
    }
}

/// The bootstrap's decision on a join request once the run is under way.
#[derive(Debug, Clone)]
pub(super) enum Late {
    /// Refused; the text says why.
    Refused(String),
    /// A restarted peer took its rank back (with its new data-plane address).
    Rejoined(Rank),
    /// A new peer took an empty rank: its entry, for the data plane to admit.
    Joined(PeerInfo),
}

/// The decision of the node `local` on `request` from `peer` once the run is under way: a
/// restarted peer (`rejoin`) with the run's fingerprint and a rank of at least `first` (1 at
/// the bootstrap, which is peer 0; 0 at any other member, through which a restarted peer 0
/// fetches the directory) replaces its entry of `dir` (keeping its identity), a new peer (on
/// the allow-list, if there is one) takes an empty rank (the lowest for
/// [`JoinRequest::any_rank`]); anything else is refused with the reason, and `dir` is left
/// as it was.
pub(super) fn admit_rejoin(
    dir: &mut [Option<PeerInfo>],
    fingerprint: &Fingerprint,
    gate: &Gate,
    (local, peer): (&PeerId, &PeerId),
    mut request: JoinRequest,
    first: Rank,
) -> Late {
    if request.any_rank {
        match free_rank(dir) {
            Some(r) => request.info.rank = r,
            None => {
                return Late::Refused(
                    "every rank of the run is taken: there is no empty rank to join".into(),
                )
            }
        }
    }
    let r = request.info.rank;
    let current = dir.get(r).cloned().flatten();
    let refusal = if let Some(why) = wire_differs(request.wire, r) {
        Some(why)
    } else if request.fingerprint != *fingerprint {
        Some(options_differ(&request.fingerprint, fingerprint, r))
    } else if r < first || r >= dir.len() {
        Some(format!(
            "rank {r} cannot rejoin through this node (ranks {first}..{} can)",
            dir.len()
        ))
    } else if !request.rejoin {
        Some("the run is already under way; a restarted peer rejoins it with --resume, a new peer takes an empty rank with --join-running".into())
    } else if let Some(why) = gate.refusal(local, peer, request.proof.as_deref(), current.is_none())
    {
        Some(why)
    } else {
        current
            .as_ref()
            .filter(|old| old.peer_id != peer.to_string())
            .map(|old| format!(
                "rank {r} is peer {}, not {peer}: a restarted peer keeps its identity (its key file, --identity)",
                old.peer_id
            ))
    };
    if let Some(why) = refusal {
        return Late::Refused(why);
    }
    let mut info = request.info;
    info.peer_id = peer.to_string();
    dir[r] = Some(info.clone());
    if current.is_none() {
        Late::Joined(info)
    } else {
        Late::Rejoined(r)
    }
}

/// What the bootstrap `local` answers `peer` after [`admit_rejoin`] decided `late`: the
/// directory `dir` (as updated) with its run-key tag, or the refusal.
pub(super) fn late_answer(
    dir: &[Option<PeerInfo>],
    late: &Late,
    gate: &Gate,
    (local, peer): (&PeerId, &PeerId),
) -> JoinResponse {
    match late {
        Late::Refused(why) => JoinResponse::Refused(why.clone()),
        Late::Rejoined(_) | Late::Joined(_) => JoinResponse::Directory {
            directory: dir.to_vec(),
            proof: gate.answer(local, peer),
        },
    }
}

/// What a node that is not the bootstrap answers a join request it does not serve: look
/// the bootstrap up in the DHT, the bootstrap being peer 0 as this node knows it (`None`
/// while it is joining itself).
pub(super) fn not_bootstrap(bootstrap: Option<PeerId>) -> JoinResponse {
    JoinResponse::NotBootstrap {
        bootstrap: bootstrap.map(|b| b.to_string()),
    }
}

/// What the member `local` of rank `me` (not the bootstrap; `bootstrap`: peer 0 as it knows
/// it) answers `request` from `peer` once the run is under way, with `dir` its directory,
/// and what it decided (`None`: not its to decide).
///
/// A restarted peer (`rejoin`, its rank taken in `dir`), peer 0 included, gets the
/// directory from any member: [`admit_rejoin`]'s checks are the bootstrap's (the run's
/// fingerprint; the identity libp2p authenticated must be the one `dir` holds for that rank,
/// so only the holder of that rank's key can take it back; the run key's tag), and every
/// member holds what they need. So a peer comes back while peer 0 is away. A new peer
/// (an empty rank, or any rank) is pointed at the bootstrap, as is a whole run resuming (it
/// has no members yet), unless this member admits new peers itself because every lower
/// rank is away (decided before this is asked: [`super::Admitting`]).
pub(super) fn member_answer(
    dir: &mut [Option<PeerInfo>],
    fingerprint: &Fingerprint,
    gate: &Gate,
    (local, peer): (&PeerId, &PeerId),
    request: JoinRequest,
    (me, bootstrap): (Rank, Option<PeerId>),
) -> (JoinResponse, Option<Late>) {
    let r = request.info.rank;
    if !request.rejoin || takes_empty_rank(dir, &request) {
        return (not_bootstrap(bootstrap), None);
    }
    let late = if r == me {
        Late::Refused(format!(
            "rank {r} is the member asked ({local}), which is alive: a second process of one \
             rank cannot rejoin"
        ))
    } else {
        admit_rejoin(dir, fingerprint, gate, (local, peer), request, 0)
    };
    let answer = late_answer(dir, &late, gate, (local, peer));
    (answer, Some(late))
}

/// Applies what the data plane learnt, `info`: the process of incarnation
/// `info.incarnation` of rank `info.rank` is at `info.data_addr` (a restarted or new peer's
/// rejoin notice), to the directory `dir` that this node serves. Returns whether `dir`
/// changed. Ignored: a rank out of range, an older incarnation than the entry's, or an
/// identity other than the entry's (the entry keeps its identity, as in [`admit_rejoin`]).
pub(super) fn relocate(dir: &mut [Option<PeerInfo>], info: PeerInfo) -> bool {
    let Some(slot) = dir.get_mut(info.rank) else {
        return false;
    };
    match slot {
        Some(e) if e.peer_id != info.peer_id || e.incarnation > info.incarnation => false,
        Some(e) if e.data_addr == info.data_addr && e.incarnation == info.incarnation => false,
        Some(e) => {
            if e.data_addr != info.data_addr {
                e.nat_published = info.nat_published;
            }
            e.data_addr = info.data_addr;
            e.incarnation = info.incarnation;
            true
        }
        None => {
            *slot = Some(info);
            true
        }
    }
}

/// This peer's rank in a directory `dir` a bootstrap sent, for a run of `n` peers, `me`
/// being this peer's PeerId.
///
/// # Errors
/// The directory has not n entries, or an entry sits at another rank's index (malformed),
/// or none is `me`'s.
pub(super) fn my_rank(dir: &[Option<PeerInfo>], n: usize, me: &PeerId) -> Result<Rank, String> {
    let misplaced = dir
        .iter()
        .enumerate()
        .any(|(i, p)| p.as_ref().is_some_and(|p| p.rank != i));
    if dir.len() != n || misplaced {
        return Err(format!(
            "the bootstrap sent a malformed directory ({} entries for {n} peers)",
            dir.len()
        ));
    }
    let me = me.to_string();
    dir.iter()
        .position(|p| p.as_ref().is_some_and(|p| p.peer_id == me))
        .ok_or_else(|| format!("the bootstrap's directory has no entry for this peer ({me})"))
}

/// What a joining peer makes of an answer to its join request.
#[derive(Debug)]
pub(super) enum Reading {
    /// It joined: its rank, the directory, the round to resume from.
    Joined(Discovered),
    /// The node asked is a member of the run, not its bootstrap, and names it: look its
    /// record up in the DHT, taking only one signed by this PeerId.
    Member(PeerId),
    /// The node asked is neither a bootstrap nor a member of a run.
    Stranger,
    /// Found with mDNS, the node refused this peer (its text): ask the others.
    Refused(String),
    /// Found with mDNS, the node did not prove the run key (the text says so): ask the
    /// others, never take its directory.
    Unproven(String),
    /// This peer cannot join: the error's text.
    Failed(String),
}

/// What the peer `me`, joining a run of `n` peers, makes of `response` from `peer`; `mdns`:
/// `peer` was found with mDNS, so a refusal only passes it over. With a run key in `gate`,
/// only a directory that carries `peer`'s tag for `me` is taken.
pub(super) fn read_answer(
    response: JoinResponse,
    (me, peer): (&PeerId, &PeerId),
    n: usize,
    gate: &Gate,
    mdns: bool,
) -> Reading {
    let (directory, resume_round, proof) = match response {
        JoinResponse::Directory { directory, proof } => (directory, None, proof),
        JoinResponse::Resume {
            directory,
            round,
            proof,
        } => (directory, Some(round), proof),
        JoinResponse::NotBootstrap { bootstrap } => {
            return match bootstrap.and_then(|b| b.parse::<PeerId>().ok()) {
                Some(boot) => Reading::Member(boot),
                None => Reading::Stranger,
            }
        }
        JoinResponse::Refused(why) if mdns => return Reading::Refused(why),
        JoinResponse::Refused(why) => {
            return Reading::Failed(format!("the bootstrap refused this peer: {why}"))
        }
    };
    if let Some(key) = &gate.key {
        if !key.verify(proof.as_deref(), "answer", peer, me) {
            let why = format!("{peer} did not prove the run key (--run-key)");
            if mdns {
                return Reading::Unproven(why);
            }
            return Reading::Failed(format!(
                "the bootstrap {why}: is this the run's bootstrap, and does it have the same key?"
            ));
        }
    }
    let answerer = peer.to_string();
    let answered_by = (directory.iter())
        .position(|p| p.as_ref().is_some_and(|p| p.peer_id == answerer))
        .filter(|&r| r > 0);
    match my_rank(&directory, n, me) {
        Ok(rank) => Reading::Joined(Discovered {
            rank,
            directory,
            resume_round,
            answered_by,
        }),
        Err(why) => Reading::Failed(why),
    }
}

/// How long a new peer none of whose neighbours is in the run yet waits for the others that
/// came before it is let in anyway: let in first, it would train apart from the run (with a
/// round of its own) until a neighbour joined, and the next new peers next to it would then
/// wait for the run to catch up with that round.
pub(super) const GATHER: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the new peer of `request` would have a neighbour in the run (`dir`), each
/// rank's neighbours being `neighbours`: true for one that takes whatever empty rank is
/// lowest, or whose neighbours are not known.
pub(super) fn next_to_the_run(
    neighbours: &[Vec<Rank>],
    dir: &Directory,
    request: &JoinRequest,
) -> bool {
    request.any_rank
        || neighbours
            .get(request.info.rank)
            .is_none_or(|ns| ns.iter().any(|&j| dir.get(j).is_some_and(Option::is_some)))
}

/// Which of the `waiting` new peers (when each came, its request; in order of arrival) to
/// let in at `now`, by its index: the first to have come with a neighbour in the run
/// ([`next_to_the_run`]); else, once the first still waiting has waited [`GATHER`], the one
/// of the lowest rank; else none yet.
pub(super) fn pick_next<'a>(
    waiting: impl Iterator<Item = (tokio::time::Instant, &'a JoinRequest)> + Clone,
    dir: &Directory,
    neighbours: &[Vec<Rank>],
    now: tokio::time::Instant,
) -> Option<usize> {
    if let Some(at) = waiting
        .clone()
        .position(|(_, r)| next_to_the_run(neighbours, dir, r))
    {
        return Some(at);
    }
    let (first, _) = waiting.clone().next()?;
    (now >= first + GATHER)
        .then(|| waiting.enumerate().min_by_key(|(_, (_, r))| r.info.rank))
        .flatten()
        .map(|(at, _)| at)
}

#[cfg(test)]
mod tests;
