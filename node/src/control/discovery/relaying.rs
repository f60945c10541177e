//! Asking the bootstrap for a relayed link ([`crate::plane::relay`]) over the control plane:
//! the messages (`/murmur/relay/1`, JSON request-response), who may ask, and the handle a
//! peer's data plane asks through ([`RelayClient`]).
//!
//! Either end of a link i → j may ask for its allocation, and only they: the bootstrap
//! checks that the libp2p identity asking is the directory's i or j ([`may_ask`]), so the
//! token reaches nobody else.

use std::sync::Arc;

use anyhow::{anyhow, bail};
use libp2p::PeerId;
use murmur_gossip::Rank;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::messages::Directory;
use crate::plane::relay::{Allocation, Relay};

/// Protocol id of relay requests.
pub const RELAY_PROTOCOL: &str = "/murmur/relay/1";

/// A peer asks the bootstrap to relay the link `from` → `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayRequest {
    /// The sender (the dialer).
    pub from: Rank,
    /// The receiver (the listener).
    pub to: Rank,
}

/// The bootstrap's answer.
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

/// The bootstrap's answer to `request` from `asker`, with its relay (`None`: `--no-relay`).
pub fn answer(
    relay: Option<&Relay>,
    dir: &Directory,
    asker: &PeerId,
    request: &RelayRequest,
) -> RelayResponse {
    let Some(relay) = relay else {
        return RelayResponse::Refused("the bootstrap does not relay (--no-relay)".into());
    };
    if let Err(why) = may_ask(dir, asker, request) {
        return RelayResponse::Refused(why);
    }
    match relay.allocate(request.from, request.to) {
        Ok(a) => RelayResponse::Allocated(a),
        Err(e) => RelayResponse::Refused(format!("{e:#}")),
    }
}

/// A request on its way to the bootstrap, and where its answer goes.
pub type Pending = (RelayRequest, oneshot::Sender<RelayResponse>);

/// How this peer gets relayed links.
#[derive(Clone)]
pub enum RelayClient {
    /// It does not (`--no-relay`).
    Off,
    /// Peer 0: its own relay.
    Local(Arc<Relay>),
    /// Any other peer: asks the bootstrap through its control plane.
    Remote(mpsc::Sender<Pending>),
}

impl RelayClient {
    /// The allocation of the link `from` → `to` (this peer is one end).
    ///
    /// # Errors
    /// No relay (`--no-relay` here or at the bootstrap), the bootstrap refused, or the control
    /// plane is gone.
    pub async fn allocate(&self, from: Rank, to: Rank) -> anyhow::Result<Allocation> {
        let response = match self {
            RelayClient::Off => bail!("relaying is off (--no-relay)"),
            RelayClient::Local(relay) => return relay.allocate(from, to),
            RelayClient::Remote(tx) => {
                let (answer, rx) = oneshot::channel();
                tx.send((RelayRequest { from, to }, answer))
                    .await
                    .map_err(|_| anyhow!("the control plane has stopped"))?;
                rx.await
                    .map_err(|_| anyhow!("the bootstrap did not answer the relay request"))?
            }
        };
        match response {
            RelayResponse::Allocated(a) => Ok(a),
            RelayResponse::Refused(why) => bail!("the bootstrap refused to relay: {why}"),
        }
    }

    /// Whether relayed links can be had.
    pub fn is_on(&self) -> bool {
        !matches!(self, RelayClient::Off)
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
                })
            })
            .collect()
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
