//! Asking for a relayed link ([`crate::plane::relay`]) over the control plane: the messages
//! (`/murmur/relay/1`, JSON request-response), who relays, who may ask, and the handle a
//! peer's data plane asks through ([`RelayClient`]).
//!
//! **Every reachable member relays**, not only peer 0: a member whose directory entry says
//! every peer can dial it ([`PeerInfo::reachable`]: not behind a NAT) runs a relay on its
//! data-plane address, unless `--no-relay`. The two ends of a link ask the same members in
//! the same order ([`candidates`], from the directory both hold): the link's own ends first
//! where they are reachable (a reachable end that must dial a peer behind a symmetric NAT
//! relays its own link, and no third process carries it), then the other reachable members,
//! starting at a place that depends on the link, so that relayed links spread over the
//! members and one relay's loss takes only the links through it. A member that refuses or
//! does not answer (gone, or `--no-relay`) is passed over for the next ([`Asking`]).
//!
//! Either end of a link i → j may ask for its allocation, and only they: the relay checks
//! that the libp2p identity asking is the directory's i or j ([`may_ask`]), so the token
//! reaches nobody else.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use libp2p::PeerId;
use murmur_gossip::Rank;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::messages::{Directory, PeerInfo};
use crate::plane::relay::{Allocation, Relay};

/// The longest a peer that relays waits for the links through it to end, after its own
/// run is done.
pub const LINGER_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Protocol id of relay requests.
pub const RELAY_PROTOCOL: &str = "/murmur/relay/1";

/// A peer asks a member to relay the link `from` → `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayRequest {
    /// The sender (the dialer).
    pub from: Rank,
    /// The receiver (the listener).
    pub to: Rank,
}

/// The member's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RelayResponse {
    /// The link's relay port and token.
    Allocated(Allocation),
    /// No relay; the text says why.
    Refused(String),
}

/// Whether `asker` may have the allocation of `request`: it is the directory's peer at one
/// end, the ends differ, and both are ranks of the run. `Err` says why not.
pub fn may_ask(dir: &Directory, asker: &PeerId, request: &RelayRequest) -> Result<(), String> {
    let RelayRequest { from, to } = *request;
    if from == to || from >= dir.len() || to >= dir.len() {
        return Err(format!(
            "no link {from} -> {to} in a run of {} peers",
            dir.len()
        ));
    }
    let is = |r: Rank| {
        dir[r]
            .as_ref()
            .is_some_and(|p| p.peer_id == asker.to_string())
    };
    if is(from) || is(to) {
        Ok(())
    } else {
        Err(format!("{asker} is neither peer {from} nor peer {to}"))
    }
}

/// A member's answer to `request` from `asker`, with its relay (`None`: `--no-relay`, or
/// the member is behind a NAT).
pub fn answer(
    relay: Option<&Relay>,
    dir: &Directory,
    asker: &PeerId,
    request: &RelayRequest,
) -> RelayResponse {
    let Some(relay) = relay else {
        return RelayResponse::Refused(
            "this peer does not relay (--no-relay, or it is behind a NAT)".into(),
        );
    };
    if let Err(why) = may_ask(dir, asker, request) {
        return RelayResponse::Refused(why);
    }
    match relay.allocate(request.from, request.to) {
        Ok(a) => RelayResponse::Allocated(a),
        Err(e) => RelayResponse::Refused(format!("{e:#}")),
    }
}

/// The members that may relay the link `from` → `to`, in the order its ends ask them: the
/// ranks of `dir` that are [`PeerInfo::reachable`], `from` then `to` first where they are among them, then the others
/// from the one at `(from + to) mod their count` on, round the circle. Both ends of the
/// link, and of the link the other way, compute the same order from the same directory.
pub fn candidates(dir: &Directory, from: Rank, to: Rank) -> Vec<Rank> {
    let reachable = |r: Rank| {
        dir.get(r)
            .and_then(Option::as_ref)
            .is_some_and(PeerInfo::reachable)
    };
    let mut ends: Vec<Rank> = [from, to].into_iter().filter(|&r| reachable(r)).collect();
    ends.dedup();
    let others: Vec<Rank> = (0..dir.len())
        .filter(|&r| r != from && r != to && reachable(r))
        .collect();
    if !others.is_empty() {
        let start = (from + to) % others.len();
        ends.extend(others[start..].iter().chain(&others[..start]));
    }
    ends
}

/// Where the answer to a relay request goes: the relaying member's rank and the link's
/// allocation, or why no member relays it.
pub type Answer = tokio::sync::oneshot::Sender<Result<(Rank, Allocation), String>>;

/// A request on its way to the discovery task, and where its answer goes.
pub type Pending = (RelayRequest, Answer);

/// A relay request being asked of the members in turn ([`candidates`]): the ones not yet
/// asked and why each one asked so far did not relay.
pub struct Asking {
    /// The link.
    pub request: RelayRequest,
    /// The members still to ask, in order.
    rest: VecDeque<Rank>,
    /// One line per member that refused or did not answer.
    refusals: Vec<String>,
    answer: Answer,
}

impl Asking {
    /// `request`, to be asked of the members of `dir` in the order [`candidates`] gives;
    /// its answer goes to `answer`.
    pub fn new(dir: &Directory, request: RelayRequest, answer: Answer) -> Self {
        Asking {
            request,
            rest: candidates(dir, request.from, request.to).into(),
            refusals: Vec::new(),
            answer,
        }
    }

    /// The next member to ask, with its rank and identity (from `dir`): the request
    /// comes back with them. This peer (`me`) among the candidates allocates on its own
    /// relay (`own`; `None`: it relays for nobody) at once; members without a known
    /// identity are passed over. `None`: the answer was sent — this peer's allocation, or,
    /// no candidate left, why none relays.
    pub fn next(
        mut self,
        dir: &Directory,
        me: Rank,
        own: Option<&Relay>,
    ) -> Option<(Self, Rank, PeerId)> {
        while let Some(r) = self.rest.pop_front() {
            if r == me {
                let RelayRequest { from, to } = self.request;
                match own.map(|relay| relay.allocate(from, to)) {
                    Some(Ok(a)) => {
                        let _ = self.answer.send(Ok((me, a)));
                        return None;
                    }
                    Some(Err(e)) => self.refusals.push(format!("peer {r} (this peer): {e:#}")),
                    None => self
                        .refusals
                        .push(format!("peer {r} (this peer) does not relay")),
                }
                continue;
            }
            match dir[r]
                .as_ref()
                .and_then(|p| p.peer_id.parse::<PeerId>().ok())
            {
                Some(id) => return Some((self, r, id)),
                None => self.refusals.push(format!("peer {r}: no identity known")),
            }
        }
        let why = match self.refusals.is_empty() {
            true => "no member of the run is reachable (every one is behind a NAT)".to_string(),
            false => self.refusals.join("; "),
        };
        let _ = self.answer.send(Err(why));
        None
    }

    /// `relay` answered with `response`: the allocation goes to whoever asked, and `None`
    /// is returned; a refusal is noted and the request comes back, to ask the next member.
    pub fn answered(mut self, relay: Rank, response: RelayResponse) -> Option<Self> {
        match response {
            RelayResponse::Allocated(a) => {
                let _ = self.answer.send(Ok((relay, a)));
                None
            }
            RelayResponse::Refused(why) => {
                self.refusals.push(format!("peer {relay}: {why}"));
                Some(self)
            }
        }
    }
}

/// How this peer gets relayed links.
#[derive(Clone)]
pub enum RelayClient {
    /// It does not (`--no-relay`).
    Off,
    /// Peer 0: its own relay (it is reachable, so it is the first candidate for each of
    /// its links).
    Local(Arc<Relay>),
    /// Any other peer: asks the members in turn, through its control plane; `own` is its
    /// relay for others' links, if it is reachable.
    Remote {
        /// Where its requests go (the discovery task, which asks the members).
        requests: mpsc::Sender<Pending>,
        /// Its own relay (`None`: behind a NAT).
        own: Option<Arc<Relay>>,
    },
}

impl RelayClient {
    /// The rank of the member that relays the link `from` → `to` (this peer is one end)
    /// and the link's allocation there.
    ///
    /// # Errors
    /// Relaying is off here (`--no-relay`), every member refused or could not be reached
    /// (the error names each and why), or the control plane is gone.
    pub async fn allocate(&self, from: Rank, to: Rank) -> anyhow::Result<(Rank, Allocation)> {
        match self {
            RelayClient::Off => bail!("relaying is off (--no-relay)"),
            RelayClient::Local(relay) => Ok((0, relay.allocate(from, to)?)),
            RelayClient::Remote { requests, .. } => {
                let (answer, rx) = oneshot::channel();
                requests
                    .send((RelayRequest { from, to }, answer))
                    .await
                    .map_err(|_| anyhow!("the control plane has stopped"))?;
                rx.await
                    .map_err(|_| anyhow!("the control plane dropped the relay request"))?
                    .map_err(|why| anyhow!("no member relays it: {why}"))
            }
        }
    }

    /// Whether relayed links can be had.
    pub fn is_on(&self) -> bool {
        !matches!(self, RelayClient::Off)
    }

    /// Before the process of peer `me` ends: waits until the links it relays for others
    /// are done ([`Relay::linger`]: no datagram for a second more than the longest
    /// keep-alive interval of a link, [`crate::plane::keep_alive_interval`], so
    /// 3 s; at most [`LINGER_LIMIT`]).
    pub async fn linger(&self, me: Rank) {
        let own = match self {
            RelayClient::Local(relay)
            | RelayClient::Remote {
                own: Some(relay), ..
            } => relay,
            RelayClient::Off | RelayClient::Remote { own: None, .. } => return,
        };
        let longest = crate::plane::keep_alive_interval(std::time::Duration::MAX);
        let quiet = longest + std::time::Duration::from_secs(1);
        own.linger(me, quiet, LINGER_LIMIT).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::discovery::PeerInfo;

    fn dir(ids: &[PeerId]) -> Directory {
        ids.iter()
            .enumerate()
            .map(|(rank, id)| {
                Some(PeerInfo {
                    rank,
                    peer_id: id.to_string(),
                    data_addr: "10.0.0.1:5000".parse().unwrap(),
                    nat_published: None,
                    incarnation: 0,
                    control: Vec::new(),
                })
            })
            .collect()
    }

    #[test]
    fn the_ends_ask_the_reachable_members_in_the_same_order_the_reachable_ends_first() {
        let ids: Vec<PeerId> = (0..6).map(|_| PeerId::random()).collect();
        let mut d = dir(&ids);
        // 1, 2 and 4 behind NATs; 5 has not said where it is.
        for r in [1, 2, 4] {
            let p = d[r].as_mut().unwrap();
            p.nat_published = Some("192.168.1.2:5000".parse().unwrap());
        }
        d[5].as_mut().unwrap().data_addr = "0.0.0.0:5000".parse().unwrap();
        // Reachable: 0 and 3. Both ends behind NATs: the others, from (1 + 2) mod 2 on.
        assert_eq!(candidates(&d, 1, 2), vec![3, 0]);
        assert_eq!(
            candidates(&d, 2, 1),
            vec![3, 0],
            "the same for the link back"
        );
        assert_eq!(candidates(&d, 1, 4), vec![3, 0], "(1 + 4) mod 2 = 1");
        assert_eq!(candidates(&d, 2, 4), vec![0, 3]);
        // A reachable end relays its own link first.
        assert_eq!(candidates(&d, 3, 2), vec![3, 0]);
        assert_eq!(candidates(&d, 2, 0), vec![0, 3]);
        // Nobody reachable: no candidate.
        for p in d.iter_mut().flatten() {
            p.nat_published = Some("192.168.1.2:5000".parse().unwrap());
        }
        assert!(candidates(&d, 1, 2).is_empty());
    }

    #[test]
    fn a_request_passes_over_members_that_refuse_and_says_why_when_none_relays() {
        let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        let mut d = dir(&ids);
        for r in [1, 2] {
            d[r].as_mut().unwrap().nat_published = Some("192.168.1.2:5000".parse().unwrap());
        }
        let link = RelayRequest { from: 1, to: 2 };
        let (answer, mut rx) = oneshot::channel();
        let asking = Asking::new(&d, link, answer);
        // Peer 1 asks 3 first, then 0.
        let Some((asking, 3, id)) = asking.next(&d, 1, None) else {
            panic!("3 is asked first")
        };
        assert_eq!(id, ids[3]);
        let asking = asking
            .answered(
                3,
                RelayResponse::Refused("the request did not reach it".into()),
            )
            .expect("a refusal passes the request on");
        let Some((asking, 0, _)) = asking.next(&d, 1, None) else {
            panic!("then 0")
        };
        let lo = "127.0.0.1".parse().unwrap();
        let allocation = Relay::new(lo, lo);
        let a = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async { allocation.allocate(1, 2) })
            .unwrap();
        assert!(asking
            .answered(0, RelayResponse::Allocated(a.clone()))
            .is_none());
        assert_eq!(rx.try_recv().unwrap(), Ok((0, a)));

        // Every member refuses: the answer names each and why.
        let (answer, mut rx) = oneshot::channel();
        let mut asking = Asking::new(&d, link, answer);
        while let Some((a, r, _)) = asking.next(&d, 1, None) {
            assert_ne!(r, 1, "peer 1 is behind a NAT: not a candidate");
            asking = a
                .answered(r, RelayResponse::Refused(format!("no, says {r}")))
                .unwrap();
        }
        let why = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(why, "peer 3: no, says 3; peer 0: no, says 0");
    }

    #[test]
    fn a_reachable_end_uses_its_own_relay() {
        let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        let mut d = dir(&ids);
        d[2].as_mut().unwrap().nat_published = Some("192.168.1.2:5000".parse().unwrap());
        let lo = "127.0.0.1".parse().unwrap();
        let own = Relay::new(lo, lo);
        let (answer, mut rx) = oneshot::channel();
        let asking = Asking::new(&d, RelayRequest { from: 3, to: 2 }, answer);
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            assert!(asking.next(&d, 3, Some(&own)).is_none(), "answered at once");
        });
        let (by, a) = rx.try_recv().unwrap().unwrap();
        assert_eq!(by, 3, "peer 3's own relay");
        assert_eq!(a.addr.ip(), lo);
        let (answer, _rx) = oneshot::channel();
        let asking = Asking::new(&d, RelayRequest { from: 3, to: 2 }, answer);
        // The others, 0 and 1, from (3 + 2) mod 2 on.
        let Some((_, 1, _)) = asking.next(&d, 3, None) else {
            panic!("without a relay of its own, peer 3 asks the next member")
        };
    }

    #[test]
    fn only_the_two_ends_of_a_link_of_the_run_may_ask_for_it() {
        let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
        let d = dir(&ids);
        let link = RelayRequest { from: 1, to: 2 };
        assert_eq!(may_ask(&d, &ids[1], &link), Ok(()));
        assert_eq!(may_ask(&d, &ids[2], &link), Ok(()));
        let other = may_ask(&d, &ids[0], &link).unwrap_err();
        assert!(other.contains("neither peer 1 nor peer 2"), "{other}");
        assert!(may_ask(&d, &PeerId::random(), &link).is_err());
        for bad in [
            RelayRequest { from: 1, to: 1 },
            RelayRequest { from: 1, to: 3 },
        ] {
            let why = may_ask(&d, &ids[1], &bad).unwrap_err();
            assert!(why.contains("no link"), "{why}");
        }
    }

    #[test]
    fn a_bootstrap_without_a_relay_or_a_stranger_asking_gets_a_refusal_with_the_reason() {
        let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
        let d = dir(&ids);
        let link = RelayRequest { from: 1, to: 2 };
        let lo = "127.0.0.1".parse().unwrap();
        let relay = Relay::new(lo, lo);
        for (relay, asker, says) in [
            (None, ids[1], "--no-relay"),
            (Some(&*relay), PeerId::random(), "neither peer 1 nor peer 2"),
        ] {
            match answer(relay, &d, &asker, &link) {
                RelayResponse::Refused(why) => assert!(why.contains(says), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
