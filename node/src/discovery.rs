//! The control plane: peer identity and discovery with libp2p.
//!
//! Every peer has a libp2p identity (Ed25519 key, `PeerId`). Peer 0 is the bootstrap: it
//! listens on a libp2p QUIC address and every other peer dials it with one multiaddr. Each
//! peer sends a [`JoinRequest`] carrying its rank, its run fingerprint (peers, topology,
//! model, d — so a mis-configured peer is refused with a message saying what differs), its
//! QUIC data-plane address; the bootstrap records the `PeerId` libp2p authenticated, which
//! the data plane's certificates must then prove ([`crate::auth`]). When all n ranks have
//! joined (or the `--initial-peers` of an elastic run), the bootstrap answers every request
//! with the directory: an entry per rank, empty for the ranks that have not joined. The
//! swarm then keeps running in the background for liveness (ping, identify), and the
//! bootstrap goes on answering peers that join the running run: restarted peers
//! (`--resume`; their entry gets the new address, the identity must stay the same) and new
//! peers taking an empty rank (`--join-running`; allow-list permitting), whose entry it
//! passes to the data plane as [`crate::net::NetEvent::Joined`] so that every peer admits
//! the new identity. Both get the directory at once.
//!
//! Every peer also listens on libp2p (`--listen`) and takes part in the run's Kademlia DHT
//! (protocol `/murmur/kad/1`, kept apart from public DHTs; every node a server, routing
//! table fed by identify). Peer 0 publishes a [`BootstrapRecord`] there under
//! [`BOOTSTRAP_KEY`]: its PeerId and listen addresses, signed with its key. So a peer can
//! enter the run through any member: a node that is not the bootstrap answers a join
//! request with [`JoinResponse::NotBootstrap`] naming peer 0's PeerId, and the joining peer
//! looks the record up through it (Maymounkov & Mazières 2002, `FIND_VALUE`), takes only a
//! record signed by that PeerId, dials the bootstrap at the addresses found and asks it as
//! usual. Run options, admission and the run key are checked by the bootstrap exactly as for
//! a direct join. Nodes store only that record under that key (`serve_dht`).
//!
//! On a LAN the bootstrap can also be found without its address: with `--mdns` peer 0
//! answers mDNS queries (libp2p-mdns, `_p2p._udp.local`) with its listen addresses, and a
//! peer started with `--mdns` and no `--bootstrap` asks every listening libp2p node it
//! discovers to let it join, until one takes it (nodes of other runs refuse it; members it
//! finds point it at the DHT, as above).
//!
//! Protocol: libp2p request-response, JSON codec, protocol id `/murmur/join/1`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;
use libp2p::identity::Keypair;
use libp2p::kad;
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::ConnectionId;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, ping, Multiaddr, PeerId, StreamProtocol, Swarm};
use murmur_gossip::Rank;

use crate::auth::RunKey;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

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

/// The DHT key of peer 0's [`BootstrapRecord`].
pub const BOOTSTRAP_KEY: &[u8] = b"/murmur/bootstrap/1";

/// Kademlia protocol id of a run's DHT.
pub const KAD_PROTOCOL: &str = "/murmur/kad/1";

/// Between two DHT lookups of the bootstrap record that found nothing (the routing table of
/// a node that just connected may still be filling).
const LOOKUP_RETRY: Duration = Duration::from_secs(1);

/// Peer 0's record in the DHT, under [`BOOTSTRAP_KEY`]: where to ask to join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapRecord {
    /// Peer 0's PeerId, as text.
    pub peer_id: String,
    /// Its libp2p listen addresses (multiaddrs, as text).
    pub addrs: Vec<String>,
    /// Ed25519 signature (64 bytes) by `peer_id`'s key over `murmur bootstrap record
    /// v1\n<peer_id>\n` followed by each address and a `\n`: a node relaying the record
    /// cannot change the addresses of peer 0's identity.
    pub signature: Vec<u8>,
}

impl BootstrapRecord {
    /// What peer 0 signs: a domain tag, its PeerId, and each address on its own line.
    fn message(peer_id: &str, addrs: &[String]) -> Vec<u8> {
        let mut m = format!("murmur bootstrap record v1\n{peer_id}\n").into_bytes();
        for a in addrs {
            m.extend_from_slice(a.as_bytes());
            m.push(b'\n');
        }
        m
    }

    /// The record of the node with identity `key`, listening on `addrs`.
    ///
    /// # Errors
    /// The key cannot sign (not an Ed25519/ECDSA/RSA key pair).
    pub fn signed(key: &Keypair, addrs: &[Multiaddr]) -> anyhow::Result<Self> {
        let peer_id = key.public().to_peer_id().to_string();
        let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        let signature = key
            .sign(&Self::message(&peer_id, &addrs))
            .map_err(|e| anyhow!("signing the bootstrap record: {e}"))?;
        Ok(BootstrapRecord {
            peer_id,
            addrs,
            signature,
        })
    }

    /// The bootstrap's PeerId and addresses, if the record parses and `peer_id`'s key signed
    /// it; `None` otherwise (a forged, altered or malformed record).
    pub fn verify(&self) -> Option<(PeerId, Vec<Multiaddr>)> {
        let id: PeerId = self.peer_id.parse().ok()?;
        let key = crate::auth::public_key(&id)?;
        if !key.verify(&Self::message(&self.peer_id, &self.addrs), &self.signature) {
            return None;
        }
        let addrs = self
            .addrs
            .iter()
            .map(|a| a.parse())
            .collect::<Result<Vec<Multiaddr>, _>>()
            .ok()?;
        Some((id, addrs))
    }
}

/// A peer's entry in the directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Rank in 0..n.
    pub rank: Rank,
    /// libp2p identity, as text.
    pub peer_id: String,
    /// QUIC data-plane address; its connections prove `peer_id` ([`crate::auth`]).
    pub data_addr: SocketAddr,
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
}

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
    fn refusal(
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
    fn answer(&self, local: &PeerId, joiner: &PeerId) -> Option<String> {
        self.key.as_ref().map(|k| k.tag("answer", local, joiner))
    }
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
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    join: request_response::json::Behaviour<JoinRequest, JoinResponse>,
    ping: ping::Behaviour,
    identify: identify::Behaviour,
    /// With `--mdns` only.
    mdns: Toggle<libp2p::mdns::tokio::Behaviour>,
    /// The run's DHT.
    kad: kad::Behaviour<kad::store::MemoryStore>,
}

/// Where this peer's libp2p node listens, and where it publishes its address.
#[derive(Debug, Clone)]
pub struct Listen {
    /// Listen address, e.g. `/ip4/127.0.0.1/udp/0/quic-v1` (port 0: any free port).
    pub addr: Multiaddr,
    /// Where to write the full dialable multiaddr (with `/p2p/<PeerId>`) once it listens:
    /// peer 0's, for launchers and scripts; any other peer's, for a later peer that enters
    /// the run through it (`--bootstrap`).
    pub files: Vec<PathBuf>,
}

/// How this peer takes part in discovery.
#[derive(Debug)]
pub enum Role {
    /// Peer 0: answer join requests and publish its [`BootstrapRecord`] in the DHT.
    Bootstrap {
        /// How many peers (peer 0 included) start the run; the other ranks join it later
        /// with `--join-running`. n for a run that starts complete.
        initial: usize,
        /// Where peers that take an empty rank of the running run are announced.
        joined: tokio::sync::mpsc::Sender<crate::net::NetEvent>,
        /// Peer 0's training loop sends here the rank of each new peer once it mixes with
        /// the run (peer 0 has reached the new peer's first round) or has left. New peers
        /// are admitted one at a time: the next waits for that news (or for the join
        /// timeout), so that it learns the one before as a member, not as an empty rank.
        settled: tokio::sync::mpsc::UnboundedReceiver<Rank>,
        /// Resume the whole run from checkpoints: the rounds of peer 0's own checkpoints.
        resume: Option<Vec<u64>>,
    },
    /// Any other peer: dial `bootstrap`.
    Join {
        /// The bootstrap's multiaddrs (peer 0 on several interfaces, or candidate hosts;
        /// each is tried and the first that answers is asked), or any member's (the
        /// bootstrap is then looked up in the DHT through it); none: find it with mDNS.
        bootstrap: Vec<Multiaddr>,
        /// Rejoin a run under way (a restarted peer), or resume a whole run, instead of
        /// joining at the start.
        rejoin: bool,
        /// The rounds of this peer's checkpoints.
        checkpoint_rounds: Vec<u64>,
        /// No `--rank`: the bootstrap assigns one ([`JoinRequest::any_rank`]).
        any_rank: bool,
    },
}

fn build_swarm(key: Keypair, timeout: Duration, mdns: bool) -> anyhow::Result<Swarm<Behaviour>> {
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_quic()
        .with_behaviour(|key| {
            let mdns = if mdns {
                let config = libp2p::mdns::Config {
                    // A joining peer asks again every few seconds until the bootstrap listens.
                    query_interval: Duration::from_secs(5),
                    ..Default::default()
                };
                Some(libp2p::mdns::tokio::Behaviour::new(
                    config,
                    key.public().to_peer_id(),
                )?)
            } else {
                None
            };
            Ok(Behaviour {
                join: request_response::json::Behaviour::new(
                    [(StreamProtocol::new("/murmur/join/1"), ProtocolSupport::Full)],
                    request_response::Config::default().with_request_timeout(timeout),
                ),
                ping: ping::Behaviour::new(ping::Config::new()),
                identify: identify::Behaviour::new(identify::Config::new(
                    "/murmur/1.0.0".into(),
                    key.public(),
                )),
                mdns: Toggle::from(mdns),
                kad: {
                    let id = key.public().to_peer_id();
                    let mut config = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
                    // A run may last days; peer 0 republishes its record (kad's default
                    // interval) while it lives.
                    config.set_record_ttl(None);
                    config.set_query_timeout(Duration::from_secs(10));
                    // The routing table is fed by identify and by the lookups that follow
                    // each insertion; a timed refresh would only warn while it is empty.
                    config.set_periodic_bootstrap_interval(None);
                    // Records others store here are checked first ([`serve_dht`]).
                    config.set_record_filtering(kad::StoreInserts::FilterBoth);
                    kad::Behaviour::with_config(id, kad::store::MemoryStore::new(id), config)
                },
            })
        })
        .map_err(|e| {
            anyhow!("building the libp2p behaviour (mDNS needs a multicast-capable interface): {e}")
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(24 * 3600)))
        .build();
    // Every peer serves the DHT: a node without confirmed external addresses would stay a
    // client, and a run on one machine or a private network has none.
    swarm.behaviour_mut().kad.set_mode(Some(kad::Mode::Server));
    Ok(swarm)
}

/// This node's part in the run's DHT, for every control-plane `event`: identify feeds
/// Kademlia's routing table (a node that speaks the run's DHT protocol is routable at the
/// listen addresses it reports), and a record another node asks to store here is kept only
/// if it is the [`BootstrapRecord`] of `bootstrap` (the run's peer 0 as this node knows it;
/// `None`, a peer still joining: nothing is kept), signed by it — so no node can overwrite
/// the genuine record with its own, and nothing else is stored.
fn serve_dht(
    swarm: &mut Swarm<Behaviour>,
    event: &SwarmEvent<BehaviourEvent>,
    bootstrap: Option<PeerId>,
) {
    match event {
        SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
            peer_id,
            info,
            ..
        })) if info.protocols.iter().any(|p| p.as_ref() == KAD_PROTOCOL) => {
            for addr in &info.listen_addrs {
                swarm.behaviour_mut().kad.add_address(peer_id, addr.clone());
            }
        }
        SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::InboundRequest {
            request:
                kad::InboundRequest::PutRecord {
                    source,
                    record: Some(record),
                    ..
                },
        })) => {
            let genuine = record.key.as_ref() == BOOTSTRAP_KEY
                && bootstrap.is_some_and(|b| verified_record(&record.value) == Some(b));
            if genuine {
                let kept = kad::store::RecordStore::put(
                    swarm.behaviour_mut().kad.store_mut(),
                    record.clone(),
                );
                if let Err(e) = kept {
                    debug!(%source, "cannot keep the bootstrap record: {e}");
                }
            } else {
                debug!(%source, "refused to store a DHT record that is not the run bootstrap's");
            }
        }
        _ => {}
    }
}

/// The PeerId that signed the [`BootstrapRecord`] in `value`, if it parses and verifies.
fn verified_record(value: &[u8]) -> Option<PeerId> {
    let record: BootstrapRecord = serde_json::from_slice(value).ok()?;
    record.verify().map(|(id, _)| id)
}

/// Writes `address` (a new listen address of this node, completed with its PeerId) to
/// each of `files`; returns the full address.
///
/// # Errors
/// The file cannot be written.
fn publish_address(
    local: PeerId,
    address: Multiaddr,
    files: &[PathBuf],
) -> anyhow::Result<Multiaddr> {
    let full = address
        .with_p2p(local)
        .map_err(|a| anyhow!("bad listen address {a}"))?;
    for path in files {
        crate::metrics::write_atomic(path, full.to_string().as_bytes())
            .with_context(|| format!("publishing this peer's address to {}", path.display()))?;
    }
    Ok(full)
}

/// Stores peer 0's signed record (PeerId, `addrs`) locally and offers it to the nodes of the
/// DHT closest to [`BOOTSTRAP_KEY`] (none yet at the start: then only the local store holds
/// it, and lookups reach it through the members' routing tables).
fn publish_record(swarm: &mut Swarm<Behaviour>, key: &Keypair, addrs: &[Multiaddr]) {
    let record = BootstrapRecord::signed(key, addrs).and_then(|r| Ok(serde_json::to_vec(&r)?));
    let stored = record.and_then(|value| {
        let record = kad::Record::new(kad::RecordKey::new(&BOOTSTRAP_KEY), value);
        swarm
            .behaviour_mut()
            .kad
            .put_record(record, kad::Quorum::One)
            .map_err(|e| anyhow!("{e}"))
    });
    if let Err(e) = stored {
        warn!("cannot publish the bootstrap record in the DHT: {e:#}");
    }
}

/// Runs discovery with the identity `key`, listening on `listen`, and returns the directory
/// (n entries, indexed by rank). `me` is this peer's entry except for `peer_id`, which is
/// filled in here. The bootstrap admits only the peers `gate` lets in; a joining peer takes
/// a directory only from a bootstrap that proves the run key, if there is one.
///
/// # Errors
/// This node cannot listen, the bootstrap cannot be reached (nor found in the DHT), a peer
/// was refused, or not all n peers joined within `timeout`.
#[allow(clippy::too_many_arguments)]
pub async fn discover(
    role: Role,
    listen: Listen,
    mut me: PeerInfo,
    fingerprint: Fingerprint,
    timeout: Duration,
    key: Keypair,
    gate: Gate,
    mdns: bool,
) -> anyhow::Result<Discovered> {
    let mut swarm = build_swarm(key.clone(), timeout, mdns)?;
    me.peer_id = swarm.local_peer_id().to_string();
    swarm
        .listen_on(listen.addr.clone())
        .with_context(|| format!("cannot listen on {} (--listen)", listen.addr))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let (directory, late) = match role {
        Role::Bootstrap {
            initial,
            joined,
            settled,
            resume,
        } => {
            let directory = tokio::time::timeout_at(
                deadline,
                serve(
                    &mut swarm,
                    me,
                    fingerprint.clone(),
                    (&key, &listen.files),
                    &gate,
                    resume,
                    initial,
                ),
            )
            .await
            .map_err(|_| anyhow!("not all peers joined within {timeout:?}"))??;
            // Offer the record again, now that the initial peers are in the routing table.
            let addrs: Vec<Multiaddr> = swarm.listeners().cloned().collect();
            publish_record(&mut swarm, &key, &addrs);
            (directory, Some((joined, settled)))
        }
        Role::Join {
            bootstrap,
            rejoin,
            checkpoint_rounds,
            any_rank,
        } => {
            let request = JoinRequest {
                info: me,
                fingerprint: fingerprint.clone(),
                rejoin,
                checkpoint_rounds,
                any_rank,
                proof: None,
            };
            let refusals = std::sync::Mutex::new(Vec::new());
            let directory = tokio::time::timeout_at(deadline, join(&mut swarm, bootstrap.clone(), request, &gate, &listen.files, &refusals))
                .await
                .map_err(|_| {
                    let refused = refusals.lock().map(|r| r.join("; ")).unwrap_or_default();
                    match bootstrap.as_slice() {
                        [] if refused.is_empty() => anyhow!("--mdns: found no bootstrap on the local network within {timeout:?} (is peer 0 running with --mdns, listening on an address of this LAN, e.g. --listen /ip4/0.0.0.0/udp/4001/quic-v1?)"),
                        [] => anyhow!("--mdns: no bootstrap on the local network took this peer within {timeout:?}; refused by: {refused}"),
                        b if refused.is_empty() => anyhow!("no directory from the bootstrap {} within {timeout:?} (is peer 0 running and reachable? a new peer waits for the one joining before it)", list(b)),
                        b => anyhow!("no directory from the bootstrap {} within {timeout:?}: {refused} (is peer 0 running, and reachable at the addresses it publishes, its --listen?)", list(b)),
                    }
                })??;
            (directory, None)
        }
    };
    // Keep the control plane alive for liveness; the bootstrap answers late joins.
    let dir = directory.directory.clone();
    let boot: Option<PeerId> = dir
        .first()
        .and_then(|p| p.as_ref())
        .and_then(|p| p.peer_id.parse().ok());
    tokio::spawn(async move {
        match late {
            Some((joined, settled)) => {
                let mut late = LateJoins {
                    dir,
                    fingerprint,
                    gate,
                    joined,
                    pending: None,
                    waiting: std::collections::VecDeque::new(),
                    limit: timeout,
                };
                late.run(swarm, settled).await
            }
            None => loop {
                let event = swarm.select_next_some().await;
                match as_member(&mut swarm, event, boot, &listen.files) {
                    Ok(Some(other)) => log_event(other),
                    Ok(None) => {}
                    Err(e) => warn!("{e:#}"),
                }
            },
        }
    });
    Ok(directory)
}

/// What a node that is not the bootstrap does with a control-plane `event`, besides its own
/// business: it serves the DHT ([`serve_dht`]), answers a join request with
/// [`JoinResponse::NotBootstrap`] naming `bootstrap` (the run's peer 0 as it knows it; `None`
/// while it is joining itself), and writes a new listen address to `files`. Returns the
/// event if it was none of those.
///
/// # Errors
/// A listen address cannot be written.
fn as_member(
    swarm: &mut Swarm<Behaviour>,
    event: SwarmEvent<BehaviourEvent>,
    bootstrap: Option<PeerId>,
    files: &[PathBuf],
) -> anyhow::Result<Option<SwarmEvent<BehaviourEvent>>> {
    serve_dht(swarm, &event, bootstrap);
    match event {
        SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
            peer,
            message: request_response::Message::Request { channel, .. },
            ..
        })) => {
            debug!(%peer, ?bootstrap, "a join request to a node that is not the bootstrap");
            let answer = JoinResponse::NotBootstrap {
                bootstrap: bootstrap.map(|b| b.to_string()),
            };
            let _ = swarm.behaviour_mut().join.send_response(channel, answer);
            Ok(None)
        }
        SwarmEvent::NewListenAddr { address, .. } => {
            let full = publish_address(*swarm.local_peer_id(), address, files)?;
            debug!(%full, "listening");
            Ok(None)
        }
        other => Ok(Some(other)),
    }
}

/// Logs a control-plane event nobody acts on.
fn log_event(event: SwarmEvent<BehaviourEvent>) {
    match event {
        SwarmEvent::ConnectionClosed { peer_id, cause, .. } => {
            debug!(%peer_id, ?cause, "control-plane connection closed")
        }
        other => debug!(?other, "control plane"),
    }
}

/// A join request waiting for an answer.
type Waiting = (
    PeerId,
    JoinRequest,
    request_response::ResponseChannel<JoinResponse>,
);

/// The bootstrap's side of the running run: restarted peers are answered at once, new
/// peers (taking an empty rank) one at a time.
struct LateJoins {
    /// The directory as the bootstrap knows it.
    dir: Directory,
    fingerprint: Fingerprint,
    gate: Gate,
    /// Where new peers are announced to peer 0's data plane.
    joined: tokio::sync::mpsc::Sender<crate::net::NetEvent>,
    /// The new peer being taken in, and since when.
    pending: Option<(Rank, tokio::time::Instant)>,
    /// New peers waiting for it, in order of arrival.
    waiting: std::collections::VecDeque<Waiting>,
    /// How long a new peer may take to settle before the next is let in anyway.
    limit: Duration,
}

impl LateJoins {
    async fn run(
        &mut self,
        mut swarm: Swarm<Behaviour>,
        mut settled: tokio::sync::mpsc::UnboundedReceiver<Rank>,
    ) {
        let local = *swarm.local_peer_id();
        loop {
            let until = self.pending.map(|(_, since)| since + self.limit);
            tokio::select! {
                event = swarm.select_next_some() => { serve_dht(&mut swarm, &event, Some(local)); match event {
                    SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
                        peer,
                        message: request_response::Message::Request { request, channel, .. },
                        ..
                    })) => {
                        if self.pending.is_some() && takes_empty_rank(&self.dir, &request) {
                            info!(%peer, "a new peer waits until the one joining before it mixes with the run");
                            self.waiting.push_back((peer, request, channel));
                        } else {
                            self.answer(&mut swarm, (peer, request, channel)).await;
                        }
                    }
                    other => log_event(other),
                }},
                Some(rank) = settled.recv() => {
                    if self.pending.is_some_and(|(p, _)| p == rank) {
                        debug!(rank, "the new peer settled");
                        self.pending = None;
                    }
                }
                _ = tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)), if until.is_some() => {
                    if let Some((rank, _)) = self.pending.take() {
                        warn!(rank, "the new peer {rank} did not reach its first round within {:?}; admitting the next", self.limit);
                    }
                }
            }
            while self.pending.is_none() {
                let Some(next) = self.waiting.pop_front() else {
                    break;
                };
                self.answer(&mut swarm, next).await;
            }
        }
    }

    /// Answers one late join; a new peer admitted becomes the pending one and is announced.
    async fn answer(&mut self, swarm: &mut Swarm<Behaviour>, (peer, request, channel): Waiting) {
        let local = *swarm.local_peer_id();
        let (answer, new) = admit_rejoin(
            &mut self.dir,
            &self.fingerprint,
            &self.gate,
            local,
            peer,
            request,
        );
        let _ = swarm.behaviour_mut().join.send_response(channel, answer);
        let Some(info) = new else {
            return;
        };
        self.pending = Some((info.rank, tokio::time::Instant::now()));
        match info.data_addr_and_id() {
            Ok((data_addr, peer_id)) => {
                let ev = crate::net::NetEvent::Joined {
                    rank: info.rank,
                    peer_id,
                    data_addr,
                };
                let _ = self.joined.send(ev).await;
            }
            Err(e) => warn!("{e:#}"),
        }
    }
}

/// Whether `request` would take an empty rank of the running run (a new peer, not a
/// restarted one).
fn takes_empty_rank(dir: &Directory, request: &JoinRequest) -> bool {
    request.any_rank || dir.get(request.info.rank).is_some_and(Option::is_none)
}

/// Multiaddrs for a message: `a`, or `a, b`.
fn list(addrs: &[Multiaddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lowest rank other than 0 that nobody has taken in `dir`.
fn free_rank(dir: &[Option<PeerInfo>]) -> Option<Rank> {
    (1..dir.len()).find(|&r| dir[r].is_none())
}

/// The latest round that every peer holds a checkpoint of (`rounds`: each peer's checkpoint
/// rounds), if any.
fn common_round(rounds: &[Vec<u64>]) -> Option<u64> {
    let (first, rest) = rounds.split_first()?;
    first
        .iter()
        .copied()
        .filter(|r| rest.iter().all(|rs| rs.contains(r)))
        .max()
}

/// The bootstrap's answer to a join request once the run is under way: a restarted peer
/// (`rejoin`) with the run's fingerprint and a rank other than 0 replaces its directory
/// entry, a new peer (on the allow-list, if there is one) takes an empty rank, and either
/// gets the directory; anything else is refused with the reason. Returns the new peer's
/// entry too, for the data plane to admit.
fn admit_rejoin(
    dir: &mut [Option<PeerInfo>],
    fingerprint: &Fingerprint,
    gate: &Gate,
    local: PeerId,
    peer: PeerId,
    mut request: JoinRequest,
) -> (JoinResponse, Option<PeerInfo>) {
    if request.any_rank {
        match free_rank(dir) {
            Some(r) => request.info.rank = r,
            None => {
                let why =
                    "every rank of the run is taken: there is no empty rank to join".to_string();
                warn!(%peer, "refused a late join: {why}");
                return (JoinResponse::Refused(why), None);
            }
        }
    }
    let r = request.info.rank;
    let current = dir.get(r).cloned().flatten();
    let refusal = if request.fingerprint != *fingerprint {
        Some(format!(
            "run options differ: {}",
            request
                .fingerprint
                .differences(fingerprint, &format!("peer {r}"), "peer 0")
        ))
    } else if r == 0 || r >= dir.len() {
        Some(format!(
            "rank {r} cannot rejoin (ranks 1..{} can)",
            dir.len()
        ))
    } else if !request.rejoin {
        Some("the run is already under way; a restarted peer rejoins it with --resume, a new peer takes an empty rank with --join-running".into())
    } else if let Some(why) =
        gate.refusal(&local, &peer, request.proof.as_deref(), current.is_none())
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
        warn!(%peer, "refused a late join: {why}");
        return (JoinResponse::Refused(why), None);
    }
    let mut info = request.info;
    info.peer_id = peer.to_string();
    let new = current.is_none().then(|| info.clone());
    if new.is_some() {
        info!(rank = r, %peer, "a new peer takes rank {r} of the running run");
    } else {
        info!(rank = r, %peer, "peer rejoins the run");
    }
    dir[r] = Some(info);
    let answer = JoinResponse::Directory {
        directory: dir.to_vec(),
        proof: gate.answer(&local, &peer),
    };
    (answer, new)
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
}

async fn serve(
    swarm: &mut Swarm<Behaviour>,
    me: PeerInfo,
    fingerprint: Fingerprint,
    (key, addr_files): (&Keypair, &[PathBuf]),
    gate: &Gate,
    resume: Option<Vec<u64>>,
    initial: usize,
) -> anyhow::Result<Discovered> {
    let n = fingerprint.peers;
    let mut slots: Vec<Option<PeerInfo>> = vec![None; n];
    let mut waiting = Vec::new();
    let r0 = me.rank;
    slots[r0] = Some(me);
    // Resuming a whole run: each peer's checkpoint rounds, by rank.
    let mut rounds: Vec<Vec<u64>> = vec![Vec::new(); n];
    if let Some(own) = &resume {
        rounds[r0] = own.clone();
    }
    // Peers can only join once we listen; with n = 1 the address must still be published.
    let mut listening = false;
    loop {
        let present = slots.iter().filter(|s| s.is_some()).count();
        if listening && present >= initial {
            let joined: Vec<Vec<u64>> = rounds
                .iter()
                .zip(&slots)
                .filter(|(_, s)| s.is_some())
                .map(|(r, _)| r.clone())
                .collect();
            let dir = slots;
            let resume_round = match &resume {
                None => None,
                Some(_) => match common_round(&joined) {
                    Some(r) => Some(r),
                    None => {
                        let why = format!(
                            "the peers hold no checkpoint of a common round to resume from: {}",
                            rounds
                                .iter()
                                .enumerate()
                                .map(|(r, rs)| format!("peer {r} has {rs:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                        for (_, channel) in waiting {
                            let _ = swarm
                                .behaviour_mut()
                                .join
                                .send_response(channel, JoinResponse::Refused(why.clone()));
                        }
                        bail!("{why}");
                    }
                },
            };
            let local = *swarm.local_peer_id();
            for (peer, channel) in waiting {
                let proof = gate.answer(&local, &peer);
                let answer = match resume_round {
                    None => JoinResponse::Directory {
                        directory: dir.clone(),
                        proof,
                    },
                    Some(round) => JoinResponse::Resume {
                        directory: dir.clone(),
                        round,
                        proof,
                    },
                };
                let _ = swarm.behaviour_mut().join.send_response(channel, answer);
            }
            // Let the responses go out before the caller moves on.
            let flush = async {
                let mut pending = present - 1;
                while pending > 0 {
                    if let SwarmEvent::Behaviour(BehaviourEvent::Join(
                        request_response::Event::ResponseSent { .. }
                        | request_response::Event::InboundFailure { .. },
                    )) = swarm.select_next_some().await
                    {
                        pending -= 1;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(10), flush).await;
            if present < n {
                info!(
                    peers = present,
                    of = n,
                    "the initial peers joined; the other ranks may join the running run"
                );
            } else {
                info!(peers = n, "all peers joined");
            }
            return Ok(Discovered {
                rank: r0,
                directory: dir,
                resume_round,
            });
        }
        let event = swarm.select_next_some().await;
        let local = *swarm.local_peer_id();
        serve_dht(swarm, &event, Some(local));
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                let full = publish_address(local, address, addr_files)?;
                info!(%full, "bootstrap listening");
                listening = true;
                let addrs: Vec<Multiaddr> = swarm.listeners().cloned().collect();
                publish_record(swarm, key, &addrs);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
                peer,
                message:
                    request_response::Message::Request {
                        request, channel, ..
                    },
                ..
            })) => {
                let mut request = request;
                if request.any_rank {
                    // Past n: refused below as out of range.
                    request.info.rank = free_rank(&slots).unwrap_or(n);
                }
                let r = request.info.rank;
                let local = *swarm.local_peer_id();
                let refusal = if let Some(why) =
                    gate.refusal(&local, &peer, request.proof.as_deref(), true)
                {
                    Some(why)
                } else if request.rejoin && resume.is_none() {
                    Some("the run has not started yet (not every peer has joined); start this peer without --resume".to_string())
                } else if !request.rejoin && resume.is_some() {
                    Some("the run resumes from its checkpoints (peer 0 has --resume); start this peer with --resume".to_string())
                } else if request.fingerprint != fingerprint {
                    Some(format!(
                        "run options differ: {}",
                        request.fingerprint.differences(
                            &fingerprint,
                            &format!("peer {r}"),
                            "peer 0"
                        )
                    ))
                } else if r >= n && request.any_rank {
                    Some(format!("all {n} ranks have joined"))
                } else if r >= n {
                    Some(format!("rank {r} out of range for {n} peers"))
                } else if slots[r].is_some() {
                    Some(format!("rank {r} has already joined"))
                } else {
                    None
                };
                match refusal {
                    Some(why) => {
                        warn!(%peer, "refused a join: {why}");
                        let _ = swarm
                            .behaviour_mut()
                            .join
                            .send_response(channel, JoinResponse::Refused(why));
                    }
                    None => {
                        rounds[r] = request.checkpoint_rounds;
                        let mut info = request.info;
                        info.peer_id = peer.to_string();
                        info!(rank = r, %peer, "peer joined");
                        slots[r] = Some(info);
                        waiting.push((peer, channel));
                    }
                }
            }
            SwarmEvent::ListenerError { error, .. } => {
                bail!("the bootstrap's libp2p listener failed: {error}")
            }
            SwarmEvent::ListenerClosed {
                reason: Err(error), ..
            } => bail!("the bootstrap's libp2p listener closed: {error}"),
            other => debug!(?other, "bootstrap"),
        }
    }
}

/// Sends `request` (with this peer's run-key tag for `peer`) to `peer`, once.
fn ask(
    swarm: &mut Swarm<Behaviour>,
    asked: &mut HashSet<PeerId>,
    peer: PeerId,
    request: &JoinRequest,
    gate: &Gate,
) {
    if asked.insert(peer) {
        let me = *swarm.local_peer_id();
        let mut request = request.clone();
        request.proof = gate.key.as_ref().map(|k| k.tag("join", &me, &peer));
        swarm.behaviour_mut().join.send_request(&peer, request);
    }
}

/// Dials `peer` at `addrs` on a connection of its own (whatever connection the DHT or mDNS
/// already holds), to ask it once established; the connection goes into `dials`.
fn dial_candidate(
    swarm: &mut Swarm<Behaviour>,
    dials: &mut HashSet<ConnectionId>,
    peer: PeerId,
    addrs: Vec<Multiaddr>,
) -> Result<(), libp2p::swarm::DialError> {
    let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
        .addresses(addrs)
        .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
        .build();
    let id = opts.connection_id();
    swarm.dial(opts)?;
    dials.insert(id);
    Ok(())
}

async fn join(
    swarm: &mut Swarm<Behaviour>,
    bootstrap: Vec<Multiaddr>,
    request: JoinRequest,
    gate: &Gate,
    addr_files: &[PathBuf],
    refusals: &std::sync::Mutex<Vec<String>>,
) -> anyhow::Result<Discovered> {
    let me_id = *swarm.local_peer_id();
    let refused = |why: String| refusals.lock().unwrap_or_else(|e| e.into_inner()).push(why);
    // No address: find the bootstrap with mDNS. Else every address is dialled; this peer
    // fails once all of them failed.
    let mdns = bootstrap.is_empty();
    // The connections dialled to ask for a join: to the --bootstrap addresses (also in
    // `given`), to the nodes mDNS found, to the bootstrap the DHT named.
    let mut dials: HashSet<ConnectionId> = HashSet::new();
    let mut given: HashSet<ConnectionId> = HashSet::new();
    let mut unreachable = Vec::new();
    for b in &bootstrap {
        let opts = libp2p::swarm::dial_opts::DialOpts::from(b.clone());
        let id = opts.connection_id();
        match swarm.dial(opts) {
            Ok(()) => {
                dials.insert(id);
                given.insert(id);
            }
            Err(e) => unreachable.push(format!("cannot dial {b}: {e}")),
        }
    }
    let all_failed = |unreachable: &[String]| {
        anyhow!(
            "cannot reach the bootstrap {}: {}",
            list(&bootstrap),
            unreachable.join("; ")
        )
    };
    if !mdns && unreachable.len() == bootstrap.len() {
        return Err(all_failed(&unreachable));
    }
    let me = request.info.peer_id.clone();
    let n = request.fingerprint.peers;
    // The nodes found (by mDNS or in the DHT) and those asked; the bootstraps that the
    // nodes asked named (only their DHT records are taken).
    let mut found: HashSet<PeerId> = HashSet::new();
    let mut vouched: HashSet<PeerId> = HashSet::new();
    let mut asked: HashSet<PeerId> = HashSet::new();
    // The DHT lookup of the bootstrap record, started when a node says it is not the
    // bootstrap; repeated after `LOOKUP_RETRY` while a bootstrap named is not found.
    let mut looking = false;
    let mut retry: Option<tokio::time::Instant> = None;
    loop {
        let event = tokio::select! {
            event = swarm.select_next_some() => event,
            _ = tokio::time::sleep_until(retry.unwrap_or_else(tokio::time::Instant::now)), if retry.is_some() => {
                retry = None;
                swarm.behaviour_mut().kad.get_record(kad::RecordKey::new(&BOOTSTRAP_KEY));
                continue;
            }
        };
        // Until it has joined, this peer knows no bootstrap to name.
        let Some(event) = as_member(swarm, event, None, addr_files)? else {
            continue;
        };
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(list)))
                if mdns =>
            {
                let mut by_peer: std::collections::BTreeMap<PeerId, Vec<Multiaddr>> =
                    Default::default();
                for (peer, addr) in list {
                    by_peer.entry(peer).or_default().push(addr);
                }
                for (peer, addrs) in by_peer {
                    if peer == me_id || !found.insert(peer) {
                        continue;
                    }
                    info!(%peer, ?addrs, "mDNS found a libp2p node; asking it to join");
                    if let Err(e) = dial_candidate(swarm, &mut dials, peer, addrs) {
                        refused(format!("{peer}: cannot dial: {e}"));
                    }
                }
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                ..
            } if dials.contains(&connection_id) => {
                let addr = endpoint.get_remote_address().clone();
                swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                ask(swarm, &mut asked, peer_id, &request, gate);
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id,
                error,
            } if dials.contains(&connection_id) => {
                if given.contains(&connection_id) {
                    unreachable.push(error.to_string());
                    if unreachable.len() == bootstrap.len() {
                        return Err(all_failed(&unreachable));
                    }
                } else {
                    let peer = peer_id.map(|p| p.to_string()).unwrap_or_default();
                    warn!(%peer, "cannot dial a node found: {error}");
                    refused(format!("{peer}: cannot dial: {error}"));
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetRecord(result),
                step,
                ..
            })) => match result {
                Ok(kad::GetRecordOk::FoundRecord(kad::PeerRecord { record, peer })) => {
                    let verified = serde_json::from_slice::<BootstrapRecord>(&record.value)
                        .ok()
                        .and_then(|r| r.verify());
                    let Some((boot, addrs)) = verified else {
                        warn!(from = ?peer, "a bootstrap record in the DHT that its signer did not sign; ignored");
                        continue;
                    };
                    if !vouched.contains(&boot) {
                        warn!(from = ?peer, record = %boot, "a bootstrap record in the DHT for a bootstrap that no node asked named; ignored");
                        continue;
                    }
                    if !found.insert(boot) {
                        continue;
                    }
                    info!(bootstrap = %boot, ?addrs, "found the run's bootstrap in the DHT; asking it to join");
                    if let Err(e) = dial_candidate(swarm, &mut dials, boot, addrs) {
                        refused(format!(
                            "the bootstrap {boot} found in the DHT: cannot dial: {e}"
                        ));
                    }
                }
                Ok(kad::GetRecordOk::FinishedWithNoAdditionalRecord { .. }) | Err(_)
                    if step.last && !vouched.is_subset(&found) =>
                {
                    debug!(?result, "no bootstrap record in the DHT yet");
                    retry = Some(tokio::time::Instant::now() + LOOKUP_RETRY);
                }
                other => debug!(?other, "DHT lookup"),
            },
            SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
                peer,
                message: request_response::Message::Response { response, .. },
                ..
            })) => {
                let (dir, resume_round, proof) = match response {
                    JoinResponse::Directory { directory, proof } => (directory, None, proof),
                    JoinResponse::Resume {
                        directory,
                        round,
                        proof,
                    } => (directory, Some(round), proof),
                    JoinResponse::NotBootstrap { bootstrap } => {
                        let Some(boot) = bootstrap.and_then(|b| b.parse::<PeerId>().ok()) else {
                            info!(%peer, "not a bootstrap, and not yet a member of a run");
                            refused(format!(
                                "{peer} is neither a bootstrap nor a member of a run"
                            ));
                            continue;
                        };
                        info!(%peer, bootstrap = %boot, "a member of the run, not its bootstrap; looking the bootstrap up in the run's DHT through it");
                        refused(format!("{peer} is a member, not the bootstrap, and the DHT lookup of the bootstrap {boot} through it found none that answered"));
                        vouched.insert(boot);
                        if !looking {
                            looking = true;
                            swarm
                                .behaviour_mut()
                                .kad
                                .get_record(kad::RecordKey::new(&BOOTSTRAP_KEY));
                        }
                        continue;
                    }
                    JoinResponse::Refused(why) if mdns => {
                        warn!(%peer, "refused by a node found with mDNS: {why}");
                        refused(format!("{peer}: {why}"));
                        continue;
                    }
                    JoinResponse::Refused(why) => {
                        bail!("the bootstrap refused this peer: {why}")
                    }
                };
                if let Some(key) = &gate.key {
                    if !key.verify(proof.as_deref(), "answer", &peer, &me_id) {
                        let why = format!("{peer} did not prove the run key (--run-key)");
                        if mdns {
                            warn!("{why}; not its directory");
                            refused(why);
                            continue;
                        }
                        bail!("the bootstrap {why}: is this the run's bootstrap, and does it have the same key?");
                    }
                }
                let misplaced = dir
                    .iter()
                    .enumerate()
                    .any(|(i, p)| p.as_ref().is_some_and(|p| p.rank != i));
                if dir.len() != n || misplaced {
                    bail!(
                        "the bootstrap sent a malformed directory ({} entries for {n} peers)",
                        dir.len()
                    );
                }
                let Some(rank) = dir
                    .iter()
                    .position(|p| p.as_ref().is_some_and(|p| p.peer_id == me))
                else {
                    bail!("the bootstrap's directory has no entry for this peer ({me})");
                };
                if mdns {
                    info!(bootstrap = %peer, "joined the run of the bootstrap found with mDNS");
                }
                return Ok(Discovered {
                    rank,
                    directory: dir,
                    resume_round,
                });
            }
            SwarmEvent::Behaviour(BehaviourEvent::Join(
                request_response::Event::OutboundFailure { peer, error, .. },
            )) => {
                if mdns {
                    // Not a murmur bootstrap (or gone): try the others.
                    debug!(%peer, "join request failed: {error}");
                    refused(format!("{peer}: {error}"));
                    continue;
                }
                bail!("join request to the bootstrap failed: {error}")
            }
            other => debug!(?other, "join"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(peers: usize) -> Fingerprint {
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

    fn info(rank: Rank, id: PeerId) -> PeerInfo {
        PeerInfo {
            rank,
            peer_id: id.to_string(),
            data_addr: "127.0.0.1:1".parse().unwrap(),
        }
    }

    fn request(rank: Rank, id: PeerId, any_rank: bool) -> JoinRequest {
        JoinRequest {
            info: info(rank, id),
            fingerprint: fingerprint(4),
            rejoin: true,
            checkpoint_rounds: Vec::new(),
            any_rank,
            proof: None,
        }
    }

    #[test]
    fn the_bootstrap_record_verifies_only_as_its_signer_made_it() {
        let peer0 = Keypair::generate_ed25519();
        let addrs: Vec<Multiaddr> = vec![
            "/ip4/10.0.0.1/udp/4001/quic-v1".parse().unwrap(),
            "/ip4/127.0.0.1/udp/4001/quic-v1".parse().unwrap(),
        ];
        let record = BootstrapRecord::signed(&peer0, &addrs).unwrap();
        let bytes = serde_json::to_vec(&record).unwrap();
        let back: BootstrapRecord = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            back.verify(),
            Some((peer0.public().to_peer_id(), addrs.clone()))
        );
        // A relaying node points peer 0's identity at another address.
        let mut moved = record.clone();
        moved.addrs[0] = "/ip4/10.6.6.6/udp/4001/quic-v1".into();
        assert_eq!(moved.verify(), None);
        // Or drops one of its addresses.
        let mut fewer = record.clone();
        fewer.addrs.pop();
        assert_eq!(fewer.verify(), None);
        // Or signs peer 0's PeerId and its own address with its own key.
        let member = Keypair::generate_ed25519();
        let mut forged = BootstrapRecord::signed(&member, &addrs[..1]).unwrap();
        forged.peer_id = record.peer_id.clone();
        assert_eq!(forged.verify(), None);
        // Malformed: no signature, a PeerId that is not one, an address that is not one.
        let mut unsigned = record.clone();
        unsigned.signature.clear();
        assert_eq!(unsigned.verify(), None);
        let mut bad_id = record.clone();
        bad_id.peer_id = "not-a-peer-id".into();
        assert_eq!(bad_id.verify(), None);
        let bad_addr = BootstrapRecord {
            addrs: vec!["not a multiaddr".into()],
            ..record.clone()
        };
        let resigned = BootstrapRecord {
            signature: peer0
                .sign(&BootstrapRecord::message(&record.peer_id, &bad_addr.addrs))
                .unwrap(),
            ..bad_addr
        };
        assert_eq!(resigned.verify(), None, "signed, but not an address");
    }

    /// Polls `member` (serving the DHT for `boot`) and `sender` until `sender`'s put is
    /// answered, then `member` a little longer (its store is written when it handles the
    /// request, which may come after the answer reaches `sender`).
    async fn put_to(
        member: &mut Swarm<Behaviour>,
        sender: &mut Swarm<Behaviour>,
        boot: PeerId,
        record: kad::Record,
    ) {
        let to = *member.local_peer_id();
        sender
            .behaviour_mut()
            .kad
            .put_record_to(record, std::iter::once(to), kad::Quorum::One);
        let answered = async {
            loop {
                tokio::select! {
                    e = member.select_next_some() => serve_dht(member, &e, Some(boot)),
                    e = sender.select_next_some() => if let SwarmEvent::Behaviour(BehaviourEvent::Kad(
                        kad::Event::OutboundQueryProgressed { result: kad::QueryResult::PutRecord(_), .. },
                    )) = e {
                        break;
                    },
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), answered)
            .await
            .expect("the put was answered");
        let settle = async {
            loop {
                let e = member.select_next_some().await;
                serve_dht(member, &e, Some(boot));
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(300), settle).await;
    }

    fn stored(member: &mut Swarm<Behaviour>) -> Option<PeerId> {
        let key = kad::RecordKey::new(&BOOTSTRAP_KEY);
        let record = kad::store::RecordStore::get(member.behaviour_mut().kad.store_mut(), &key)?;
        verified_record(&record.value)
    }

    #[tokio::test]
    async fn a_member_stores_only_the_record_its_bootstrap_signed() {
        let peer0 = Keypair::generate_ed25519();
        let boot = peer0.public().to_peer_id();
        let other = Keypair::generate_ed25519();
        let timeout = Duration::from_secs(10);
        let mut member = build_swarm(Keypair::generate_ed25519(), timeout, false).unwrap();
        member
            .listen_on("/ip4/127.0.0.1/udp/0/quic-v1".parse().unwrap())
            .unwrap();
        let addr = loop {
            if let SwarmEvent::NewListenAddr { address, .. } = member.select_next_some().await {
                break address;
            }
        };
        // Any node of the network may send puts: here one that is not peer 0.
        let mut sender = build_swarm(other.clone(), timeout, false).unwrap();
        let member_id = *member.local_peer_id();
        sender
            .behaviour_mut()
            .kad
            .add_address(&member_id, addr.clone());
        let record = |r: BootstrapRecord| {
            kad::Record::new(
                kad::RecordKey::new(&BOOTSTRAP_KEY),
                serde_json::to_vec(&r).unwrap(),
            )
        };
        let genuine = record(BootstrapRecord::signed(&peer0, std::slice::from_ref(&addr)).unwrap());
        // Validly signed, but by another identity claiming to be the bootstrap.
        let impostor =
            record(BootstrapRecord::signed(&other, std::slice::from_ref(&addr)).unwrap());
        put_to(&mut member, &mut sender, boot, impostor.clone()).await;
        assert_eq!(stored(&mut member), None, "an impostor's record is refused");
        put_to(&mut member, &mut sender, boot, genuine).await;
        assert_eq!(stored(&mut member), Some(boot), "peer 0's record is kept");
        put_to(&mut member, &mut sender, boot, impostor).await;
        assert_eq!(
            stored(&mut member),
            Some(boot),
            "and cannot be overwritten by another"
        );
        // Nothing else is stored either.
        let key = kad::RecordKey::new(&b"/something/else");
        let junk = kad::Record::new(key.clone(), b"data".to_vec());
        put_to(&mut member, &mut sender, boot, junk).await;
        let kept = kad::store::RecordStore::get(member.behaviour_mut().kad.store_mut(), &key);
        assert!(kept.is_none());
    }

    #[test]
    fn a_peer_without_a_rank_takes_the_lowest_empty_one_until_none_is_left() {
        let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        // Ranks 1 and 3 are empty.
        let mut dir = vec![Some(info(0, ids[0])), None, Some(info(2, ids[2])), None];
        let fp = fingerprint(4);
        let local = ids[0];
        let restarted = request(2, ids[2], false);
        assert!(
            !takes_empty_rank(&dir, &restarted),
            "a restart takes no empty rank"
        );
        let new = request(0, ids[1], true);
        assert!(takes_empty_rank(&dir, &new));
        let (answer, admitted) = admit_rejoin(&mut dir, &fp, &Gate::default(), local, ids[1], new);
        assert!(matches!(answer, JoinResponse::Directory { .. }));
        assert_eq!(admitted.map(|i| i.rank), Some(1));
        let (_, admitted) = admit_rejoin(
            &mut dir,
            &fp,
            &Gate::default(),
            local,
            ids[3],
            request(0, ids[3], true),
        );
        assert_eq!(admitted.map(|i| i.rank), Some(3));
        assert_eq!(free_rank(&dir), None);
        let late = PeerId::random();
        let (answer, admitted) = admit_rejoin(
            &mut dir,
            &fp,
            &Gate::default(),
            local,
            late,
            request(0, late, true),
        );
        assert!(admitted.is_none());
        match answer {
            JoinResponse::Refused(why) => assert!(why.contains("no empty rank"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // The restarted peer keeps its rank and is no new peer.
        let (answer, admitted) =
            admit_rejoin(&mut dir, &fp, &Gate::default(), local, ids[2], restarted);
        assert!(matches!(answer, JoinResponse::Directory { .. }) && admitted.is_none());
    }
}
