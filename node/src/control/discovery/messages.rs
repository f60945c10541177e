//! The join protocol's messages: what a peer sends the bootstrap ([`JoinRequest`]), what it
//! answers ([`JoinResponse`]), a peer's directory entry ([`PeerInfo`]), the run options the
//! peers must agree on ([`Fingerprint`]) and what discovery returns ([`Discovered`]). Sent
//! as JSON over libp2p request-response (`/murmur/join/1`).

use std::net::SocketAddr;

use anyhow::anyhow;
use libp2p::PeerId;
use murmur_gossip::Rank;
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::BootstrapRecord;
#[cfg(doc)]
use crate::control::auth::RunKey;

/// What a run's peers must agree on; compared field by field at join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Number of peers n.
    pub peers: usize,
    /// Topology name.
    pub topology: String,
    /// Model name.
    pub model: String,
    /// Parameters d.
    pub dim: usize,
    /// Algorithm name.
    pub algorithm: String,
    /// Compressor, in its canonical text form: every receiver decodes any operator, but
    /// peers that compress differently run a different experiment.
    pub compressor: String,
    /// Epochs and rounds per epoch: peers that stop at different rounds would strand
    /// their neighbours.
    pub epochs: usize,
    /// Rounds per epoch.
    pub rounds_per_epoch: u64,
    /// Seed and partition: together they decide which shard is whose; a mismatch would
    /// silently overlap shards.
    pub seed: u64,
    /// Partition, as text (`iid`, `dirichlet:0.1`).
    pub partition: String,
    /// The algorithm's own options that change the protocol (local steps H, SGP's τ, the
    /// parameter server's mode, CHOCO's γ), as `name=value` pairs; empty if none.
    pub protocol: String,
}

impl Fingerprint {
    /// A run of `peers` peers (ring, MLP with d = 10, one epoch of one round), for tests.
    #[cfg(test)]
    pub(crate) fn example(peers: usize) -> Self {
        Fingerprint {
            peers,
            topology: "ring".into(),
            model: "mlp".into(),
            dim: 10,
            algorithm: "dpsgd".into(),
            compressor: "none".into(),
            epochs: 1,
            rounds_per_epoch: 1,
            seed: 0,
            partition: "iid".into(),
            protocol: String::new(),
        }
    }

    /// `field: <this> has X, <that> has Y` for each field that differs, comma-separated.
    pub fn differences(&self, other: &Fingerprint, this: &str, that: &str) -> String {
        let (a, b) = (serde_json::to_value(self), serde_json::to_value(other));
        let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) else {
            return format!("{self:?} vs {other:?}");
        };
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(*v))
            .map(|(k, v)| {
                format!(
                    "{k}: {this} has {v}, {that} has {}",
                    b.get(k).unwrap_or(&serde_json::Value::Null)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A peer's entry in the directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Rank in 0..n.
    pub rank: Rank,
    /// libp2p identity, as text.
    pub peer_id: String,
    /// QUIC data-plane address; its connections prove `peer_id` ([`crate::plane::tls`]).
    pub data_addr: SocketAddr,
    /// Set by the bootstrap when it saw the peer come from another address than the one
    /// it published (a NAT, [`super::nat`]): the published address, `data_addr` being the
    /// observed IP with the published port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat_published: Option<SocketAddr>,
    /// The incarnation of the peer's process ([`crate::plane::Incarnation`]): a restarted
    /// process states a larger one. 0: unknown.
    #[serde(default)]
    pub incarnation: crate::plane::Incarnation,
    /// The peer's control-plane (libp2p) listen addresses, multiaddrs as text, as it gave
    /// them when it joined: where another member dials it to ask it to relay a link
    /// ([`super::relaying`]). Empty from a build before this field, or for peer 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub control: Vec<String>,
}

/// Sent by each peer to the bootstrap.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The joining peer.
    pub info: PeerInfo,
    /// Its view of the run.
    pub fingerprint: Fingerprint,
    /// A restarted peer rejoining a run that is under way, or resuming a whole run.
    #[serde(default)]
    pub rejoin: bool,
    /// The rounds of the checkpoints it holds (for a whole run resuming from them).
    #[serde(default)]
    pub checkpoint_rounds: Vec<u64>,
    /// The peer was started without `--rank`: the bootstrap gives it the lowest rank not
    /// taken (at the start), or the lowest empty rank (joining a running elastic run), and
    /// `info.rank` is ignored.
    #[serde(default)]
    pub any_rank: bool,
    /// With a run key: the joining peer's tag ([`RunKey::tag`], direction `join`, from it to
    /// the bootstrap), hex.
    #[serde(default)]
    pub proof: Option<String>,
    /// The frame protocol its build speaks ([`murmur_gossip::frame::FRAME_VERSION`]; 0 from
    /// a build before this field): a peer of another protocol is refused at the door, with
    /// both versions named, instead of having its frames refused one by one.
    #[serde(default)]
    pub wire: u8,
}

/// The run's peers, indexed by rank: `None` for a rank nobody has taken yet (an elastic
/// run started with fewer peers, `--initial-peers`).
pub type Directory = Vec<Option<PeerInfo>>;

/// The bootstrap's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum JoinResponse {
    /// The directory (n entries), and with a run key the bootstrap's tag ([`RunKey::tag`],
    /// direction `answer`, from the bootstrap to the joining peer), hex.
    Directory {
        /// The directory.
        directory: Directory,
        /// The bootstrap's tag.
        #[serde(default)]
        proof: Option<String>,
    },
    /// The join was refused; the text says why.
    Refused(String),
    /// A whole run resumes from its checkpoints: the directory, and the round every peer
    /// holds a checkpoint of (the latest such), from which all continue.
    Resume {
        /// The directory (n entries).
        directory: Directory,
        /// The round to continue from.
        round: u64,
        /// The bootstrap's tag, as for [`JoinResponse::Directory`].
        #[serde(default)]
        proof: Option<String>,
    },
    /// The node asked is not the run's bootstrap (a member, or a peer still joining): look
    /// the bootstrap up in the DHT through it ([`BootstrapRecord`]).
    NotBootstrap {
        /// The bootstrap's PeerId as this node knows it (a member; `None` from a peer still
        /// joining). The joining peer accepts only a DHT record signed by this identity: as
        /// much trust as in the node whose address it was given, none in the DHT's other
        /// nodes.
        bootstrap: Option<String>,
    },
}

/// What discovery found.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// This peer's rank: its own, or the one the bootstrap gave it ([`JoinRequest::any_rank`]).
    pub rank: Rank,
    /// The directory (n entries, `None` for ranks not taken yet).
    pub directory: Directory,
    /// For a whole run resuming from checkpoints: the round all peers continue from.
    pub resume_round: Option<u64>,
    /// The rank of the member that answered, when it was not peer 0 (a member admits a new
    /// peer only while it counts every lower rank gone; it takes a restarted one back
    /// whatever the lower ranks are doing).
    pub answered_by: Option<Rank>,
}

impl PeerInfo {
    /// The data-plane address and the parsed PeerId.
    ///
    /// # Errors
    /// A malformed PeerId.
    pub fn data_addr_and_id(&self) -> anyhow::Result<(SocketAddr, PeerId)> {
        let id = self.peer_id.parse().map_err(|e| {
            anyhow!(
                "peer {} has a malformed PeerId {:?}: {e}",
                self.rank,
                self.peer_id
            )
        })?;
        Ok((self.data_addr, id))
    }

    /// Whether every peer can dial it: not behind a NAT ([`PeerInfo::nat_published`]
    /// empty) and at a data address that names a host (not `0.0.0.0`). Such a member
    /// relays the links of others ([`super::relaying`]) and may stand in as the record's
    /// keeper.
    pub fn reachable(&self) -> bool {
        self.nat_published.is_none() && !self.data_addr.ip().is_unspecified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_differences_name_each_field_that_differs_and_both_values() {
        let a = Fingerprint::example(4);
        assert_eq!(a.differences(&a, "peer 1", "peer 0"), "");
        let b = Fingerprint {
            model: "cnn".into(),
            seed: 9,
            ..a.clone()
        };
        let text = a.differences(&b, "peer 1", "peer 0");
        assert!(
            text.contains("model: peer 1 has \"mlp\", peer 0 has \"cnn\""),
            "{text}"
        );
        assert!(text.contains("seed: peer 1 has 0, peer 0 has 9"), "{text}");
        assert!(!text.contains("topology"), "{text}");
    }
}
