//! The control plane: peer identity and discovery with libp2p.
//!
//! Every peer has a libp2p identity (Ed25519 key, `PeerId`). Peer 0 is the bootstrap: it
//! listens on a libp2p QUIC address and every other peer dials it with one multiaddr. Each
//! peer sends a [`JoinRequest`] carrying its rank, its run fingerprint (peers, topology,
//! model, d — so a mis-configured peer is refused with a message saying what differs), its
//! QUIC data-plane address; the bootstrap records the `PeerId` libp2p authenticated, which
//! the data plane's certificates must then prove ([`crate::plane::tls`]). When all n ranks have
//! joined (or the `--initial-peers` of an elastic run), the bootstrap answers every request
//! with the directory: an entry per rank, empty for the ranks that have not joined. The
//! swarm then keeps running in the background for liveness (ping, identify), and the
//! bootstrap goes on answering peers that join the running run: restarted peers
//! (`--resume`; their entry gets the new address, the identity must stay the same) and new
//! peers taking an empty rank (`--join-running`; allow-list permitting), whose entry it
//! passes to the data plane as [`crate::plane::NetEvent::Joined`] so that every peer admits
//! the new identity. Both get the directory at once. While peer 0 is away, any member
//! answers them too: a restarted peer at once, and new peers while that member is the
//! lowest rank it counts in the run ([`Admitting`]: it admits them one at a time as the
//! bootstrap does, and its training loop signs the admission with its own key).
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
//!
//! The module's parts: `policy.rs` holds the decisions as pure functions (who is admitted,
//! which rank, what a node answers, what a joining peer makes of an answer), `messages.rs`
//! the join protocol's messages, `record.rs` the DHT record, `join.rs` a joining peer's
//! loop; this file holds the swarm, the DHT plumbing and the bootstrap's loops, which only
//! move messages and log.

mod join;
mod messages;
pub mod nat;
mod policy;
mod record;
mod relaying;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;
use libp2p::identity::Keypair;
use libp2p::kad;
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, ping, Multiaddr, PeerId, StreamProtocol, Swarm};
use murmur_gossip::frame::FRAME_VERSION;
use murmur_gossip::Rank;
use tracing::{debug, info, warn};

pub use messages::{Directory, Discovered, Fingerprint, JoinRequest, JoinResponse, PeerInfo};
pub use policy::Gate;
pub use record::{BootstrapRecord, BOOTSTRAP_KEY};
pub use relaying::RelayClient;

use join::join;
use policy::Late;
use record::verified_record;
use relaying::{Pending, RelayRequest, RelayResponse, RELAY_PROTOCOL};

use crate::plane::relay::Relay;

/// Kademlia protocol id of a run's DHT.
pub const KAD_PROTOCOL: &str = "/murmur/kad/1";

/// Between two DHT lookups of the bootstrap record that found nothing (the routing table of
/// a node that just connected may still be filling).
const LOOKUP_RETRY: Duration = Duration::from_secs(1);

/// How long a restarted peer 0 asks members for the current directory before it serves the
/// one it saved.
const MEMBER_FETCH: Duration = Duration::from_secs(5);

/// What the data plane learns of the run's peers for the directory this node serves: each
/// is a peer's process (its incarnation) at its data-plane address, from a rejoin notice
/// ([`policy::relocate`]). Every member keeps its directory current this way, so that a
/// restarted peer can take it from any of them; peer 0 also saves it (`directory.json`).
pub type Relocations = tokio::sync::mpsc::UnboundedReceiver<PeerInfo>;

#[derive(NetworkBehaviour)]
struct Behaviour {
    join: request_response::json::Behaviour<JoinRequest, JoinResponse>,
    /// Relayed links ([`relaying`]).
    relay: request_response::json::Behaviour<RelayRequest, RelayResponse>,
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
        /// Where new peers taking an empty rank of the running run are announced, and
        /// when they settle.
        admitting: Admitting,
        /// Resume the whole run from checkpoints: the rounds of peer 0's own checkpoints.
        resume: Option<Vec<u64>>,
        /// Peer 0 restarted while the others train on (`--rejoin-running`): the directory
        /// its previous process saved, served again at once (no one joins first).
        running: Option<Directory>,
        /// Where the bootstrap saves the directory whenever it changes (the run folder's
        /// `directory.json`), for a restarted peer 0 to take up.
        directory_file: Option<PathBuf>,
        /// The relay it offers the run's peers (`None`: `--no-relay`).
        relay: Option<std::sync::Arc<Relay>>,
        /// A restarted peer 0 (`running`): members' multiaddrs (its `--bootstrap`) to fetch
        /// the directory from as it stands now — peers that came back while it was away
        /// are at new addresses its saved file lacks. None given, or none answering in
        /// [`MEMBER_FETCH`]: the saved directory is served.
        members: Vec<Multiaddr>,
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
        /// Relaying on (not `--no-relay`): the IP its data plane is bound to. The peer asks
        /// the members for relayed links when the direct path fails, and, if the directory
        /// says it is not behind a NAT, relays links of others on that IP itself
        /// ([`relaying`]).
        relay: Option<std::net::IpAddr>,
        /// Once a member: the new peers it admits while every lower rank is away.
        admitting: Admitting,
    },
}

/// What a peer needs to admit new peers (taking an empty rank) to the running run: peer 0's
/// bootstrap admits them, and so does any other member while it is the lowest rank it
/// counts in the run (every lower rank, peer 0 included, away). The admission itself is
/// its training loop's: it signs it with its key and floods it
/// ([`crate::control::membership::Membership::admit`]), and every peer checks the
/// signature.
#[derive(Debug)]
pub struct Admitting {
    /// Where a new peer is announced to this peer's training loop (as
    /// [`crate::plane::NetEvent::Joined`]).
    pub joined: tokio::sync::mpsc::Sender<crate::plane::NetEvent>,
    /// The training loop sends here the rank of each new peer once it mixes with the run
    /// (this peer has reached the new peer's first round). New peers are admitted one at a
    /// time: the next waits for that news (or for the join timeout), so that it learns the
    /// one before as a member, not as an empty rank.
    pub settled: tokio::sync::mpsc::UnboundedReceiver<Rank>,
    /// The lowest rank the training loop counts in the run (not departed, not empty), kept
    /// current by it: a member other than peer 0 admits new peers only while that is its
    /// own rank.
    pub lowest_live: tokio::sync::watch::Receiver<Rank>,
    /// Each rank's neighbours in the run's communication graph (in and out), `n` lists:
    /// new peers are let in neighbours first, so that none trains apart while another
    /// waiting one would join the run ([`NewPeers::next`]). Empty: in order of arrival.
    pub neighbours: Vec<Vec<Rank>>,
}

/// What a peer serves once it is in the run: peer 0's bootstrap (late joins, the relay, the
/// saved directory), or a member (restarted peers, new peers while it is the lowest live
/// rank, and relayed links while it is reachable).
enum Serving {
    Bootstrap {
        admitting: Admitting,
        relay: Option<std::sync::Arc<Relay>>,
        directory_file: Option<PathBuf>,
    },
    Member {
        admitting: Admitting,
        /// Its relay for others' links, when it is reachable ([`relaying`]).
        relay: Option<std::sync::Arc<Relay>>,
    },
}

/// The libp2p node of identity `key`: join requests (answered within `timeout`), ping,
/// identify, the run's DHT (this node a server), and mDNS if `mdns`.
///
/// # Errors
/// mDNS cannot start (no multicast-capable interface).
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
                relay: request_response::json::Behaviour::new(
                    [(StreamProtocol::new(RELAY_PROTOCOL), ProtocolSupport::Full)],
                    request_response::Config::default()
                        .with_request_timeout(Duration::from_secs(10)),
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
        crate::report::write_atomic(path, full.to_string().as_bytes())
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
/// (n entries, indexed by rank) and how this peer gets relayed links from then on. `me` is this peer's entry except for `peer_id`, which is
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
    mut relocations: Relocations,
) -> anyhow::Result<(Discovered, RelayClient)> {
    let mut swarm = build_swarm(key.clone(), timeout, mdns)?;
    me.peer_id = swarm.local_peer_id().to_string();
    swarm
        .listen_on(listen.addr.clone())
        .with_context(|| format!("cannot listen on {} (--listen)", listen.addr))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let (directory, serving, use_relay) = match role {
        Role::Bootstrap {
            initial,
            admitting,
            resume,
            mut running,
            directory_file,
            relay,
            members,
        } => {
            if let Some(saved) = running.as_mut().filter(|_| !members.is_empty()) {
                let fetch = JoinRequest {
                    info: me.clone(),
                    fingerprint: fingerprint.clone(),
                    rejoin: true,
                    checkpoint_rounds: Vec::new(),
                    any_rank: false,
                    proof: None,
                    wire: FRAME_VERSION,
                };
                let none = std::sync::Mutex::new(Vec::new());
                let asked = join(
                    &mut swarm,
                    members.clone(),
                    fetch,
                    &gate,
                    &listen.files,
                    &none,
                );
                match tokio::time::timeout(MEMBER_FETCH, asked).await {
                    Ok(Ok(found)) => {
                        info!("took the run's directory as it stands from a member");
                        *saved = found.directory;
                    }
                    Ok(Err(e)) => warn!("no directory from the members {}: {e:#}; serving the saved one", list(&members)),
                    Err(_) => warn!("no directory from the members {} within {MEMBER_FETCH:?}; serving the saved one", list(&members)),
                }
            }
            let directory = tokio::time::timeout_at(
                deadline,
                serve(
                    &mut swarm,
                    me,
                    fingerprint.clone(),
                    (&key, &listen.files),
                    &gate,
                    (resume, running),
                    initial,
                ),
            )
            .await
            .map_err(|_| anyhow!("not all peers joined within {timeout:?}"))??;
            save_directory(directory_file.as_deref(), &directory.directory);
            // Offer the record again, now that the initial peers are in the routing table.
            let addrs: Vec<Multiaddr> = swarm.listeners().cloned().collect();
            publish_record(&mut swarm, &key, &addrs);
            let serving = Serving::Bootstrap {
                admitting,
                relay,
                directory_file,
            };
            (directory, serving, true)
        }
        Role::Join {
            bootstrap,
            rejoin,
            checkpoint_rounds,
            any_rank,
            relay,
            admitting,
        } => {
            let request = JoinRequest {
                info: me,
                fingerprint: fingerprint.clone(),
                rejoin,
                checkpoint_rounds,
                any_rank,
                proof: None,
                wire: FRAME_VERSION,
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
            // A member the others can reach relays their links too.
            let own = relay.and_then(|bind| {
                let entry = directory.directory.get(directory.rank)?.as_ref()?;
                entry
                    .reachable()
                    .then(|| Relay::new(bind, entry.data_addr.ip()))
            });
            let serving = Serving::Member {
                admitting,
                relay: own,
            };
            (directory, serving, relay.is_some())
        }
    };
    // Keep the control plane alive for liveness; the bootstrap answers late joins, every
    // member restarted peers.
    let dir = directory.directory.clone();
    let boot: Option<PeerId> = dir
        .first()
        .and_then(|p| p.as_ref())
        .and_then(|p| p.peer_id.parse().ok());
    let (requests, mut asked) = tokio::sync::mpsc::channel::<Pending>(16);
    let client = match &serving {
        Serving::Bootstrap { relay, .. } => {
            relay.clone().map_or(RelayClient::Off, RelayClient::Local)
        }
        Serving::Member { relay, .. } if use_relay => RelayClient::Remote {
            requests,
            own: relay.clone(),
        },
        Serving::Member { .. } => RelayClient::Off,
    };
    tokio::spawn(async move {
        match serving {
            Serving::Bootstrap {
                admitting,
                relay,
                directory_file,
            } => {
                let mut late = LateJoins {
                    dir,
                    fingerprint,
                    gate,
                    new_peers: NewPeers::new(admitting, timeout),
                    observed: Default::default(),
                    relay,
                    directory_file,
                };
                late.run(swarm, relocations).await
            }
            Serving::Member { admitting, relay } => {
                let mut member = Member {
                    rank: directory.rank,
                    bootstrap: boot,
                    dir,
                    fingerprint,
                    gate,
                    observed: Default::default(),
                    new_peers: NewPeers::new(admitting, timeout),
                    relay,
                };
                // Relay requests sent to members, by id: the member asked and the request.
                let mut sent = std::collections::HashMap::new();
                loop {
                    let until = member.new_peers.deadline();
                    tokio::select! {
                        Some(info) = relocations.recv() => {
                            policy::relocate(&mut member.dir, info);
                        }
                        Some(rank) = member.new_peers.settled.recv() => member.new_peers.settle(rank),
                        _ = tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)), if until.is_some() => {
                            member.new_peers.give_up_waiting();
                        }
                        Some((request, answer)) = asked.recv() => {
                            let asking = relaying::Asking::new(&member.dir, request, answer);
                            ask_to_relay(&mut swarm, &member, asking, &mut sent);
                        }
                        event = swarm.select_next_some() => {
                            match as_member(&mut swarm, event, Some(&mut member), &listen.files) {
                                Ok(Some(SwarmEvent::Behaviour(BehaviourEvent::Relay(e)))) => {
                                    relay_as_member(&mut swarm, e, &member, &mut sent)
                                }
                                Ok(Some(other)) => log_event(other),
                                Ok(None) => {}
                                Err(e) => warn!("{e:#}"),
                            }
                        }
                    }
                    member.admit_waiting(&mut swarm).await;
                }
            }
        }
    });
    Ok((directory, client))
}

/// Relay requests a member has sent, by id: the member asked and the request (asked of the
/// next member if this one does not relay it).
type SentRelayRequests =
    std::collections::HashMap<request_response::OutboundRequestId, (Rank, relaying::Asking)>;

/// Asks the next member that may relay `asking`'s link ([`relaying::Asking::next`], which
/// allocates on this member's own relay at once when it is the one): a request, kept in
/// `sent` until it is answered.
fn ask_to_relay(
    swarm: &mut Swarm<Behaviour>,
    member: &Member,
    asking: relaying::Asking,
    sent: &mut SentRelayRequests,
) {
    let own = member.relay.as_deref();
    let Some((asking, relay, id)) = asking.next(&member.dir, member.rank, own) else {
        return;
    };
    // Its control-plane addresses from the directory: this member may hold no connection
    // to it.
    let addrs = member.dir[relay].iter().flat_map(|p| &p.control);
    for addr in addrs.filter_map(|a| a.parse::<Multiaddr>().ok()) {
        swarm.add_peer_address(id, addr);
    }
    let request_id = swarm
        .behaviour_mut()
        .relay
        .send_request(&id, asking.request);
    sent.insert(request_id, (relay, asking));
}

/// A relay event at a member that is not the bootstrap: an answer to one of its requests
/// goes to whoever asked, or, a refusal or a failure, on to the next member that may relay
/// the link (`sent`); a request from another peer is answered with this member's relay
/// (refused if it has none: `--no-relay`, or behind a NAT).
fn relay_as_member(
    swarm: &mut Swarm<Behaviour>,
    event: request_response::Event<RelayRequest, RelayResponse>,
    member: &Member,
    sent: &mut SentRelayRequests,
) {
    match event {
        request_response::Event::Message {
            message:
                request_response::Message::Response {
                    request_id,
                    response,
                },
            ..
        } => {
            if let Some((relay, asking)) = sent.remove(&request_id) {
                if let Some(next) = asking.answered(relay, response) {
                    ask_to_relay(swarm, member, next, sent);
                }
            }
        }
        request_response::Event::OutboundFailure {
            request_id, error, ..
        } => {
            if let Some((relay, asking)) = sent.remove(&request_id) {
                let why = format!("the request did not reach it: {error}");
                if let Some(next) = asking.answered(relay, RelayResponse::Refused(why)) {
                    ask_to_relay(swarm, member, next, sent);
                }
            }
        }
        request_response::Event::Message {
            peer,
            message:
                request_response::Message::Request {
                    request, channel, ..
                },
            ..
        } => {
            let answer = relaying::answer(member.relay.as_deref(), &member.dir, &peer, &request);
            if let RelayResponse::Refused(why) = &answer {
                warn!(%peer, from = request.from, to = request.to, "refused to relay: {why}");
            }
            let _ = swarm.behaviour_mut().relay.send_response(channel, answer);
        }
        other => debug!(?other, "relay protocol"),
    }
}

/// A member of the run that is not its bootstrap, as discovery sees it: what it needs to
/// take a restarted peer back ([`policy::member_answer`]).
struct Member {
    /// This peer's rank.
    rank: Rank,
    /// The run's peer 0 as this peer knows it (from the directory).
    bootstrap: Option<PeerId>,
    /// The directory, kept current by the data plane's [`Relocations`].
    dir: Directory,
    fingerprint: Fingerprint,
    gate: Gate,
    /// Where each peer's control-plane connection comes from ([`nat`]).
    observed: std::collections::HashMap<PeerId, std::net::IpAddr>,
    /// The new peers this member admits while every lower rank is away.
    new_peers: NewPeers,
    /// Its relay for the links of others (`None`: `--no-relay`, or it is behind a NAT).
    relay: Option<std::sync::Arc<Relay>>,
}

impl Member {
    /// Whether this member admits new peers now: every lower rank is away, as its training
    /// loop counts them.
    fn admits(&self) -> bool {
        *self.new_peers.lowest_live.borrow() == self.rank
    }

    /// Answers the new peers waiting for this member, one at a time ([`NewPeers`]), while it
    /// admits; once it no longer does (a lower rank came back), the rest are pointed at the
    /// bootstrap as any member points them.
    async fn admit_waiting(&mut self, swarm: &mut Swarm<Behaviour>) {
        if !self.admits() {
            for (_, (peer, _, channel)) in self.new_peers.waiting.drain(..) {
                debug!(%peer, "a lower rank is back: the new peer is pointed at the bootstrap");
                let answer = policy::not_bootstrap(self.bootstrap);
                let _ = swarm.behaviour_mut().join.send_response(channel, answer);
            }
            return;
        }
        while let Some(next) = self.new_peers.next(&self.dir, tokio::time::Instant::now()) {
            let (dir, fingerprint, gate) = (&mut self.dir, &self.fingerprint, &self.gate);
            let late = answer_late(swarm, (dir, fingerprint, gate), next, 1);
            if let Late::Joined(info) = &late {
                let r = info.rank;
                info!(rank = r, "admitted a new peer to rank {r}: every lower rank is away, so this member admits");
            }
            self.new_peers.announce(late).await;
        }
    }
}

/// What a node that is not the bootstrap does with a control-plane `event`, besides its own
/// business: it serves the DHT ([`serve_dht`]) for its bootstrap, answers a join request —
/// a member (`member`) as [`policy::member_answer`] decides, a node still joining (`None`:
/// it knows no bootstrap yet) with [`JoinResponse::NotBootstrap`] naming none — and writes a
/// new listen address to `files`. Returns the event if it was none of those.
///
/// # Errors
/// A listen address cannot be written.
fn as_member(
    swarm: &mut Swarm<Behaviour>,
    event: SwarmEvent<BehaviourEvent>,
    member: Option<&mut Member>,
    files: &[PathBuf],
) -> anyhow::Result<Option<SwarmEvent<BehaviourEvent>>> {
    serve_dht(swarm, &event, member.as_ref().and_then(|m| m.bootstrap));
    match event {
        SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
            peer,
            message:
                request_response::Message::Request {
                    mut request,
                    channel,
                    ..
                },
            ..
        })) => {
            let Some(m) = member else {
                debug!(%peer, "a join request to a node still joining");
                let answer = policy::not_bootstrap(None);
                let _ = swarm.behaviour_mut().join.send_response(channel, answer);
                return Ok(None);
            };
            seen_through_nat(&mut request, m.observed.get(&peer).copied());
            if m.admits() && request.rejoin && policy::takes_empty_rank(&m.dir, &request) {
                info!(%peer, "a new peer asks this member, which admits while every lower rank is away");
                m.new_peers.wait(&m.dir, (peer, request, channel));
                return Ok(None);
            }
            let local = *swarm.local_peer_id();
            let ids = (&local, &peer);
            let (answer, late) = policy::member_answer(
                &mut m.dir,
                &m.fingerprint,
                &m.gate,
                ids,
                request,
                (m.rank, m.bootstrap),
            );
            match late {
                None => debug!(%peer, "a new peer asked a member: pointed at the bootstrap"),
                Some(policy::Late::Rejoined(rank)) => {
                    info!(rank, %peer, "peer {rank} rejoins the run through this member")
                }
                Some(policy::Late::Refused(why)) => warn!(%peer, "refused a rejoin: {why}"),
                Some(policy::Late::Joined(_)) => {}
            }
            let _ = swarm.behaviour_mut().join.send_response(channel, answer);
            Ok(None)
        }
        // A member notes where its callers come from (a joining peer dials for itself).
        SwarmEvent::ConnectionEstablished {
            peer_id, endpoint, ..
        } if member.is_some() => {
            if let Some(m) = member {
                note_observed(&mut m.observed, peer_id, &endpoint);
            }
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
    /// The new peers it admits, one at a time.
    new_peers: NewPeers,
    /// Where each peer's control-plane connection comes from ([`nat`]).
    observed: std::collections::HashMap<PeerId, std::net::IpAddr>,
    /// The relay for links whose direct path fails (`None`: `--no-relay`).
    relay: Option<std::sync::Arc<Relay>>,
    /// Where the directory is saved whenever it changes.
    directory_file: Option<PathBuf>,
}

/// Saves the bootstrap's directory `dir` to `file` (atomically; a failure is logged: the
/// run goes on, only a restart of peer 0 would miss it).
fn save_directory(file: Option<&std::path::Path>, dir: &Directory) {
    let Some(file) = file else { return };
    let saved = serde_json::to_vec(dir)
        .map_err(anyhow::Error::from)
        .and_then(|json| crate::report::write_atomic(file, &json));
    if let Err(e) = saved {
        warn!(file = %file.display(), "cannot save the directory: {e:#}");
    }
}

/// The directory a previous process of peer 0 saved to `file` ([`Role::Bootstrap`]'s
/// `directory_file`), for a run of `n` peers.
///
/// # Errors
/// The file cannot be read or is not a directory of `n` entries.
pub fn load_directory(file: &std::path::Path, n: usize) -> anyhow::Result<Directory> {
    let text = std::fs::read(file).with_context(|| {
        format!(
            "--rejoin-running: cannot read the directory {} that peer 0 saves while the run \
             is under way",
            file.display()
        )
    })?;
    let dir: Directory = serde_json::from_slice(&text)
        .with_context(|| format!("--rejoin-running: {} is not a directory", file.display()))?;
    anyhow::ensure!(
        dir.len() == n,
        "--rejoin-running: {} has {} entries for a run of {n} peers",
        file.display(),
        dir.len()
    );
    Ok(dir)
}

impl LateJoins {
    /// Answers the join requests reaching `swarm` (and serves the DHT) for as long as the
    /// run lives.
    async fn run(&mut self, mut swarm: Swarm<Behaviour>, mut relocations: Relocations) {
        let local = *swarm.local_peer_id();
        loop {
            let until = self.new_peers.deadline();
            tokio::select! {
                event = swarm.select_next_some() => { serve_dht(&mut swarm, &event, Some(local)); match event {
                    SwarmEvent::ConnectionEstablished { peer_id, endpoint, .. } => {
                        note_observed(&mut self.observed, peer_id, &endpoint)
                    }
                    SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
                        peer,
                        message: request_response::Message::Request { mut request, channel, .. },
                        ..
                    })) => {
                        seen_through_nat(&mut request, self.observed.get(&peer).copied());
                        if policy::takes_empty_rank(&self.dir, &request) {
                            self.new_peers.wait(&self.dir, (peer, request, channel));
                        } else {
                            self.answer(&mut swarm, (peer, request, channel)).await;
                        }
                    }
                    SwarmEvent::Behaviour(BehaviourEvent::Relay(request_response::Event::Message {
                        peer,
                        message: request_response::Message::Request { request, channel, .. },
                        ..
                    })) => {
                        let answer = relaying::answer(self.relay.as_deref(), &self.dir, &peer, &request);
                        if let RelayResponse::Refused(why) = &answer {
                            warn!(%peer, from = request.from, to = request.to, "refused to relay: {why}");
                        }
                        let _ = swarm.behaviour_mut().relay.send_response(channel, answer);
                    }
                    other => log_event(other),
                }},
                Some(info) = relocations.recv() => {
                    if policy::relocate(&mut self.dir, info) {
                        save_directory(self.directory_file.as_deref(), &self.dir);
                    }
                }
                Some(rank) = self.new_peers.settled.recv() => self.new_peers.settle(rank),
                _ = tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)), if until.is_some() => {
                    self.new_peers.give_up_waiting();
                }
            }
            while let Some(next) = self.new_peers.next(&self.dir, tokio::time::Instant::now()) {
                self.answer(&mut swarm, next).await;
            }
        }
    }

    /// Answers one late join as [`policy::admit_rejoin`] decides; a new peer admitted
    /// becomes the pending one and is announced to the training loop.
    async fn answer(&mut self, swarm: &mut Swarm<Behaviour>, waiting: Waiting) {
        let (dir, fingerprint, gate) = (&mut self.dir, &self.fingerprint, &self.gate);
        let late = answer_late(swarm, (dir, fingerprint, gate), waiting, 1);
        if !matches!(late, Late::Refused(_)) {
            save_directory(self.directory_file.as_deref(), &self.dir);
        }
        self.new_peers.announce(late).await;
    }
}

/// Answers one late join (`waiting`) as [`policy::admit_rejoin`] decides (`first`: the
/// lowest rank that may rejoin through this node), updating `dir`; returns the decision.
fn answer_late(
    swarm: &mut Swarm<Behaviour>,
    (dir, fingerprint, gate): (&mut Directory, &Fingerprint, &Gate),
    (peer, request, channel): Waiting,
    first: Rank,
) -> Late {
    let local = *swarm.local_peer_id();
    let ids = (&local, &peer);
    let late = policy::admit_rejoin(dir, fingerprint, gate, ids, request, first);
    match &late {
        Late::Refused(why) => warn!(%peer, "refused a late join: {why}"),
        Late::Rejoined(rank) => info!(rank, %peer, "peer rejoins the run"),
        Late::Joined(info) => {
            let r = info.rank;
            info!(rank = r, %peer, "a new peer takes rank {r} of the running run");
        }
    }
    let answer = policy::late_answer(dir, &late, gate, ids);
    let _ = swarm.behaviour_mut().join.send_response(channel, answer);
    late
}

/// The new peers (taking an empty rank) that one peer admits to the running run, one at a
/// time: the next waits until the one before mixes with the run (or for the join timeout).
#[derive(Debug)]
struct NewPeers {
    /// Where they are announced, and when they settle.
    joined: tokio::sync::mpsc::Sender<crate::plane::NetEvent>,
    settled: tokio::sync::mpsc::UnboundedReceiver<Rank>,
    lowest_live: tokio::sync::watch::Receiver<Rank>,
    /// The new peer being taken in, and since when.
    pending: Option<(Rank, tokio::time::Instant)>,
    /// New peers waiting to be let in, in order of arrival, each with when it came.
    waiting: std::collections::VecDeque<(tokio::time::Instant, Waiting)>,
    /// How long a new peer may take to settle before the next is let in anyway.
    limit: Duration,
    /// Each rank's neighbours ([`Admitting::neighbours`]).
    neighbours: Vec<Vec<Rank>>,
}

impl NewPeers {
    fn new(a: Admitting, limit: Duration) -> Self {
        NewPeers {
            joined: a.joined,
            settled: a.settled,
            lowest_live: a.lowest_live,
            pending: None,
            waiting: std::collections::VecDeque::new(),
            limit,
            neighbours: a.neighbours,
        }
    }

    /// When to look again: the pending new peer is given up waiting for at its limit; with
    /// none pending, the first new peer still waiting is let in at its [`policy::GATHER`] time.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        match self.pending {
            Some((_, since)) => Some(since + self.limit),
            None => self
                .waiting
                .front()
                .map(|(since, _)| *since + policy::GATHER),
        }
    }

    /// Queues new peer `w` to be let in ([`NewPeers::next`]).
    fn wait(&mut self, dir: &Directory, w: Waiting) {
        let (peer, rank) = (w.0, w.1.info.rank);
        if !policy::next_to_the_run(&self.neighbours, dir, &w.1) {
            info!(%peer, rank, "a new peer none of whose neighbours is in the run yet: it waits up to {:?} for those that have one", policy::GATHER);
        } else if self.pending.is_some() {
            info!(%peer, "a new peer waits until the one joining before it mixes with the run");
        }
        self.waiting.push_back((tokio::time::Instant::now(), w));
    }

    /// The waiting new peer to let in at `now`, if one may be (none is pending;
    /// [`policy::pick_next`]).
    fn next(&mut self, dir: &Directory, now: tokio::time::Instant) -> Option<Waiting> {
        if self.pending.is_some() {
            return None;
        }
        let waiting = self.waiting.iter().map(|(since, w)| (*since, &w.1));
        let at = policy::pick_next(waiting, dir, &self.neighbours, now)?;
        self.waiting.remove(at).map(|(_, w)| w)
    }

    /// New peer `rank` mixes with the run: the next may be let in.
    fn settle(&mut self, rank: Rank) {
        if self.pending.is_some_and(|(p, _)| p == rank) {
            debug!(rank, "the new peer settled");
            self.pending = None;
        }
    }

    /// The pending new peer did not settle within the limit: the next is let in anyway.
    fn give_up_waiting(&mut self) {
        if let Some((rank, _)) = self.pending.take() {
            warn!(
                rank,
                "the new peer {rank} did not reach its first round within {:?}; admitting the next",
                self.limit
            );
        }
    }

    /// After `late`: a new peer admitted becomes the pending one and is announced to the
    /// training loop (which signs and floods its admission).
    async fn announce(&mut self, late: Late) {
        let Late::Joined(info) = late else {
            return;
        };
        self.pending = Some((info.rank, tokio::time::Instant::now()));
        match info.data_addr_and_id() {
            Ok((data_addr, peer_id)) => {
                let ev = crate::plane::NetEvent::Joined {
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

/// Remembers the IP a peer's inbound connection comes from ([`nat`]).
fn note_observed(
    observed: &mut std::collections::HashMap<PeerId, std::net::IpAddr>,
    peer: PeerId,
    endpoint: &libp2p::core::ConnectedPoint,
) {
    if let libp2p::core::ConnectedPoint::Listener { send_back_addr, .. } = endpoint {
        if let Some(ip) = nat::ip_of(send_back_addr) {
            observed.insert(peer, ip);
        }
    }
}

/// Publishes a joining peer at the address the bootstrap sees it at, if that is not the
/// one it published ([`nat::use_observed`]), and says so.
fn seen_through_nat(request: &mut JoinRequest, observed: Option<std::net::IpAddr>) {
    let published = request.info.data_addr;
    if nat::use_observed(&mut request.info, observed) {
        info!(
            rank = request.info.rank,
            %published,
            public = %request.info.data_addr,
            "a peer behind a NAT: its neighbours dial the address the bootstrap sees it at \
             (a direct path by simultaneous open)"
        );
    }
}

/// Multiaddrs for a message: `a`, or `a, b`.
fn list(addrs: &[Multiaddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Peer 0 before the run starts: admits join requests as [`policy::admit_initial`] decides
/// until the initial set is complete (`initial` of the n ranks, peer 0's entry `me`
/// included) and the bootstrap listens, then answers every admitted peer at once. Each
/// listen address is written to `addr_files`, and the record signed with `key` published in
/// the DHT. `resume`: peer 0's own checkpoint rounds, for a whole run resuming from them;
/// `running`: a restarted peer 0's saved directory, served at once once it listens.
///
/// # Errors
/// The libp2p listener fails or closes, a listen address cannot be written, or (resuming)
/// the peers hold no checkpoint of a common round (each waiting peer is refused so too).
async fn serve(
    swarm: &mut Swarm<Behaviour>,
    me: PeerInfo,
    fingerprint: Fingerprint,
    (key, addr_files): (&Keypair, &[PathBuf]),
    gate: &Gate,
    (resume, running): (Option<Vec<u64>>, Option<Directory>),
    initial: usize,
) -> anyhow::Result<Discovered> {
    let n = fingerprint.peers;
    let rejoining = running.is_some();
    let mut slots: Vec<Option<PeerInfo>> = running.unwrap_or_else(|| vec![None; n]);
    let mut waiting = Vec::new();
    let r0 = me.rank;
    slots[r0] = Some(me);
    // Resuming a whole run: each peer's checkpoint rounds, by rank.
    let mut rounds: Vec<Vec<u64>> = vec![Vec::new(); n];
    if let Some(own) = &resume {
        rounds[r0] = own.clone();
    }
    // Peers can only join once we listen; with n = 1 the address must still be published.
    // A restarted peer 0 that took the directory from a member listens already (its
    // address was published meanwhile).
    let mut listening = swarm.listeners().next().is_some();
    if listening {
        let addrs: Vec<Multiaddr> = swarm.listeners().cloned().collect();
        publish_record(swarm, key, &addrs);
    }
    // Where each peer's control-plane connection comes from (a NAT's address, maybe).
    let mut observed = std::collections::HashMap::new();
    loop {
        if listening && rejoining {
            // Peer 0 restarted in a run under way: the others are members already.
            info!("the bootstrap serves the running run again");
            return Ok(Discovered {
                rank: r0,
                directory: slots,
                resume_round: None,
                answered_by: None,
            });
        }
        if listening && policy::initial_complete(&slots, initial) {
            let resume_round = match policy::resume_round(resume.is_some(), &rounds, &slots) {
                Ok(round) => round,
                Err(why) => {
                    for (_, channel) in waiting {
                        let _ = swarm
                            .behaviour_mut()
                            .join
                            .send_response(channel, JoinResponse::Refused(why.clone()));
                    }
                    bail!("{why}");
                }
            };
            answer_initial(swarm, waiting, &slots, resume_round, gate).await;
            let present = slots.iter().filter(|s| s.is_some()).count();
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
                directory: slots,
                resume_round,
                answered_by: None,
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
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => note_observed(&mut observed, peer_id, &endpoint),
            SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
                peer,
                message:
                    request_response::Message::Request {
                        mut request,
                        channel,
                        ..
                    },
                ..
            })) => {
                seen_through_nat(&mut request, observed.get(&peer).copied());
                let ids = (&local, &peer);
                let resuming = resume.is_some();
                match policy::admit_initial(&slots, &fingerprint, gate, ids, &request, resuming) {
                    Err(why) => {
                        warn!(%peer, "refused a join: {why}");
                        let _ = swarm
                            .behaviour_mut()
                            .join
                            .send_response(channel, JoinResponse::Refused(why));
                    }
                    Ok(info) => {
                        let r = info.rank;
                        rounds[r] = request.checkpoint_rounds;
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

/// Sends each `waiting` peer the directory `dir` ([`policy::initial_answer`]: with the
/// round to resume from, if any, and the bootstrap's run-key tag), then lets the responses
/// go out (at most 10 s) before the caller moves on.
async fn answer_initial(
    swarm: &mut Swarm<Behaviour>,
    waiting: Vec<(PeerId, request_response::ResponseChannel<JoinResponse>)>,
    dir: &[Option<PeerInfo>],
    resume_round: Option<u64>,
    gate: &Gate,
) {
    let local = *swarm.local_peer_id();
    let mut pending = waiting.len();
    for (peer, channel) in waiting {
        let answer = policy::initial_answer(dir, resume_round, gate.answer(&local, &peer));
        let _ = swarm.behaviour_mut().join.send_response(channel, answer);
    }
    let flush = async {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
