//! A joining peer's side of discovery: it dials the bootstrap (or every node mDNS finds),
//! asks each node once (a member again while the bootstrap it named cannot be dialled),
//! follows a member to the bootstrap through the DHT, and takes the directory of the first
//! bootstrap (or admitting member) that admits it. What it makes of each answer is
//! [`policy::read_answer`]'s decision; this file only moves messages and logs.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use futures::StreamExt;
use libp2p::kad;
use libp2p::request_response;
use libp2p::swarm::{ConnectionId, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm};
use tracing::{debug, info, warn};

use super::policy::{self, Gate, Reading};
use super::record::read_record;
use super::{
    as_member, list, Behaviour, BehaviourEvent, Discovered, JoinRequest, JoinResponse,
    BOOTSTRAP_KEY, LOOKUP_RETRY,
};

/// Sends `request` (with this peer's run-key tag for `peer`, and its control-plane listen
/// addresses, [`super::PeerInfo::control`]) to `peer`, once.
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
        request.info.control = swarm.listeners().map(ToString::to_string).collect();
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

/// A joining peer's search for a bootstrap that takes it.
struct Joining<'a> {
    /// The request asked of every node (with this peer's run-key tag for each).
    request: JoinRequest,
    /// The run key, which the bootstrap's answer must prove.
    gate: &'a Gate,
    /// The `--bootstrap` addresses; none: find the bootstrap with mDNS.
    bootstrap: Vec<Multiaddr>,
    /// No address given: every libp2p node found with mDNS is asked, and a refusal only
    /// passes it over. Else every address is dialled; this peer fails once all failed.
    mdns: bool,
    /// The connections dialled to ask for a join: to the `--bootstrap` addresses (also in
    /// `given`), to the nodes mDNS found, to the bootstrap the DHT named.
    dials: HashSet<ConnectionId>,
    /// The connections dialled to the `--bootstrap` addresses.
    given: HashSet<ConnectionId>,
    /// Why each `--bootstrap` address failed.
    unreachable: Vec<String>,
    /// The nodes found (by mDNS or in the DHT).
    found: HashSet<PeerId>,
    /// The bootstraps that the nodes asked named (only their DHT records are taken).
    vouched: HashSet<PeerId>,
    /// The nodes asked.
    asked: HashSet<PeerId>,
    /// The members that answered by naming their bootstrap: asked again when it cannot be
    /// dialled (a member admits once it counts every lower rank gone, which it may not yet
    /// when it first answers).
    pointed: HashSet<PeerId>,
    /// When to ask [`Self::pointed`] again: [`LOOKUP_RETRY`] after a dial of a bootstrap
    /// they named failed.
    reask: Option<tokio::time::Instant>,
    /// The DHT lookup of the bootstrap record has started (when a node says it is not the
    /// bootstrap).
    looking: bool,
    /// When to look again: after [`LOOKUP_RETRY`], while a bootstrap named is not found.
    retry: Option<tokio::time::Instant>,
    /// Why the nodes asked did not take this peer, for the error if none does.
    refusals: &'a std::sync::Mutex<Vec<String>>,
}

impl Joining<'_> {
    /// Notes why a node did not take this peer.
    fn refused(&self, why: String) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if !refusals.contains(&why) {
            refusals.push(why);
        }
    }

    /// The error once every `--bootstrap` address failed.
    fn all_failed(&self) -> anyhow::Error {
        anyhow!(
            "cannot reach the bootstrap {}: {}",
            list(&self.bootstrap),
            self.unreachable.join("; ")
        )
    }

    /// Dials every `--bootstrap` address.
    ///
    /// # Errors
    /// Addresses were given and none can be dialled.
    fn dial_given(&mut self, swarm: &mut Swarm<Behaviour>) -> anyhow::Result<()> {
        for b in &self.bootstrap {
            let opts = libp2p::swarm::dial_opts::DialOpts::from(b.clone());
            let id = opts.connection_id();
            match swarm.dial(opts) {
                Ok(()) => {
                    self.dials.insert(id);
                    self.given.insert(id);
                }
                Err(e) => self.unreachable.push(format!("cannot dial {b}: {e}")),
            }
        }
        if !self.mdns && self.unreachable.len() == self.bootstrap.len() {
            return Err(self.all_failed());
        }
        Ok(())
    }

    /// Dials each new libp2p node mDNS found (`list`: PeerId and address pairs), to ask it.
    fn found_by_mdns(&mut self, swarm: &mut Swarm<Behaviour>, list: Vec<(PeerId, Multiaddr)>) {
        let me = *swarm.local_peer_id();
        let mut by_peer: std::collections::BTreeMap<PeerId, Vec<Multiaddr>> = Default::default();
        for (peer, addr) in list {
            by_peer.entry(peer).or_default().push(addr);
        }
        for (peer, addrs) in by_peer {
            if peer == me || !self.found.insert(peer) {
                continue;
            }
            info!(%peer, ?addrs, "mDNS found a libp2p node; asking it to join");
            if let Err(e) = dial_candidate(swarm, &mut self.dials, peer, addrs) {
                self.refused(format!("{peer}: cannot dial: {e}"));
            }
        }
    }

    /// A dial of this search (`connection`) failed.
    ///
    /// # Errors
    /// It was the last `--bootstrap` address left.
    fn dial_failed(
        &mut self,
        connection: ConnectionId,
        peer: Option<PeerId>,
        error: &libp2p::swarm::DialError,
    ) -> anyhow::Result<()> {
        if self.given.contains(&connection) {
            self.unreachable.push(error.to_string());
            if self.unreachable.len() == self.bootstrap.len() {
                return Err(self.all_failed());
            }
        } else {
            if let Some(boot) = peer.filter(|p| self.vouched.contains(p)) {
                // A bootstrap that members named but that is gone (or not yet counted
                // gone by them): ask those members again, and look it up anew then.
                info!(bootstrap = %boot, "the bootstrap that a member named cannot be dialled; asking the member again in {LOOKUP_RETRY:?}");
                self.found.remove(&boot);
                self.reask = Some(tokio::time::Instant::now() + LOOKUP_RETRY);
            }
            let peer = peer.map(|p| p.to_string()).unwrap_or_default();
            warn!(%peer, "cannot dial a node found: {error}");
            self.refused(format!("{peer}: cannot dial: {error}"));
        }
        Ok(())
    }

    /// A step of the DHT lookup of the bootstrap record (`last`: the lookup's last): dials
    /// a bootstrap a node asked named, found at the addresses its signed record gives; looks
    /// again later if none was found.
    fn on_lookup(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        result: kad::GetRecordResult,
        last: bool,
    ) {
        match result {
            Ok(kad::GetRecordOk::FoundRecord(kad::PeerRecord { record, peer })) => {
                let Some((boot, addrs)) = read_record(&record.value) else {
                    warn!(from = ?peer, "a bootstrap record in the DHT that its signer did not sign; ignored");
                    return;
                };
                if !self.vouched.contains(&boot) {
                    warn!(from = ?peer, record = %boot, "a bootstrap record in the DHT for a bootstrap that no node asked named; ignored");
                    return;
                }
                if !self.found.insert(boot) {
                    return;
                }
                info!(bootstrap = %boot, ?addrs, "found the run's bootstrap in the DHT; asking it to join");
                if let Err(e) = dial_candidate(swarm, &mut self.dials, boot, addrs) {
                    self.refused(format!(
                        "the bootstrap {boot} found in the DHT: cannot dial: {e}"
                    ));
                }
            }
            Ok(kad::GetRecordOk::FinishedWithNoAdditionalRecord { .. }) | Err(_)
                if last && !self.vouched.is_subset(&self.found) =>
            {
                debug!(?result, "no bootstrap record in the DHT yet");
                self.retry = Some(tokio::time::Instant::now() + LOOKUP_RETRY);
            }
            other => debug!(?other, "DHT lookup"),
        }
    }

    /// `peer`'s answer to the join request, as [`policy::read_answer`] reads it: the
    /// directory if it took this peer; else the search goes on (through the DHT, for a
    /// member naming its bootstrap).
    ///
    /// # Errors
    /// This peer cannot join: the bootstrap refused it, did not prove the run key, or sent
    /// a malformed directory.
    fn on_answer(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        peer: PeerId,
        response: JoinResponse,
    ) -> anyhow::Result<Option<Discovered>> {
        let me = *swarm.local_peer_id();
        let n = self.request.fingerprint.peers;
        match policy::read_answer(response, (&me, &peer), n, self.gate, self.mdns) {
            Reading::Joined(found) => {
                if self.mdns {
                    info!(bootstrap = %peer, "joined the run of the bootstrap found with mDNS");
                }
                return Ok(Some(found));
            }
            Reading::Member(boot) => {
                info!(%peer, bootstrap = %boot, "a member of the run, not its bootstrap; looking the bootstrap up in the run's DHT through it");
                self.refused(format!("{peer} is a member, not the bootstrap, and the DHT lookup of the bootstrap {boot} through it found none that answered"));
                self.vouched.insert(boot);
                self.pointed.insert(peer);
                if !self.looking {
                    self.looking = true;
                    swarm
                        .behaviour_mut()
                        .kad
                        .get_record(kad::RecordKey::new(&BOOTSTRAP_KEY));
                } else if !self.found.contains(&boot) && self.retry.is_none() {
                    // Asked again after its bootstrap could not be dialled: look anew.
                    self.retry = Some(tokio::time::Instant::now());
                }
            }
            Reading::Stranger => {
                info!(%peer, "not a bootstrap, and not yet a member of a run");
                self.refused(format!(
                    "{peer} is neither a bootstrap nor a member of a run"
                ));
            }
            Reading::Refused(why) => {
                warn!(%peer, "refused by a node found with mDNS: {why}");
                self.refused(format!("{peer}: {why}"));
            }
            Reading::Unproven(why) => {
                warn!("{why}; not its directory");
                self.refused(why);
            }
            Reading::Failed(why) => bail!("{why}"),
        }
        Ok(None)
    }
}

/// A joining peer: asks the bootstrap at the `bootstrap` addresses (or every node mDNS
/// finds, with none) to let it in with `request`, following members to the bootstrap
/// through the DHT, until a bootstrap answers with the directory. New listen addresses go to
/// `addr_files`; why nodes did not take it goes to `refusals`.
///
/// # Errors
/// No `--bootstrap` address can be reached, a listen address cannot be written, the
/// bootstrap refused this peer or its answer is not to be taken ([`Joining::on_answer`]),
/// or the request to a given bootstrap failed.
pub(super) async fn join(
    swarm: &mut Swarm<Behaviour>,
    bootstrap: Vec<Multiaddr>,
    request: JoinRequest,
    gate: &Gate,
    addr_files: &[PathBuf],
    refusals: &std::sync::Mutex<Vec<String>>,
) -> anyhow::Result<Discovered> {
    let mut j = Joining {
        request,
        gate,
        mdns: bootstrap.is_empty(),
        bootstrap,
        dials: HashSet::new(),
        given: HashSet::new(),
        unreachable: Vec::new(),
        found: HashSet::new(),
        vouched: HashSet::new(),
        asked: HashSet::new(),
        pointed: HashSet::new(),
        reask: None,
        looking: false,
        retry: None,
        refusals,
    };
    j.dial_given(swarm)?;
    loop {
        let event = tokio::select! {
            event = swarm.select_next_some() => event,
            _ = tokio::time::sleep_until(j.retry.unwrap_or_else(tokio::time::Instant::now)), if j.retry.is_some() => {
                j.retry = None;
                swarm.behaviour_mut().kad.get_record(kad::RecordKey::new(&BOOTSTRAP_KEY));
                continue;
            }
            _ = tokio::time::sleep_until(j.reask.unwrap_or_else(tokio::time::Instant::now)), if j.reask.is_some() => {
                j.reask = None;
                for member in std::mem::take(&mut j.pointed) {
                    j.asked.remove(&member);
                    ask(swarm, &mut j.asked, member, &j.request, gate);
                }
                continue;
            }
        };
        // Until it has joined, this peer knows no bootstrap to name.
        let Some(event) = as_member(swarm, event, None, addr_files)? else {
            continue;
        };
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(list)))
                if j.mdns =>
            {
                j.found_by_mdns(swarm, list)
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                ..
            } if j.dials.contains(&connection_id) => {
                let addr = endpoint.get_remote_address().clone();
                swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                ask(swarm, &mut j.asked, peer_id, &j.request, gate);
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id,
                error,
            } if j.dials.contains(&connection_id) => {
                j.dial_failed(connection_id, peer_id, &error)?
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetRecord(result),
                step,
                ..
            })) => j.on_lookup(swarm, result, step.last),
            SwarmEvent::Behaviour(BehaviourEvent::Join(request_response::Event::Message {
                peer,
                message: request_response::Message::Response { response, .. },
                ..
            })) => {
                if let Some(found) = j.on_answer(swarm, peer, response)? {
                    return Ok(found);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Join(
                request_response::Event::OutboundFailure { peer, error, .. },
            )) => {
                if j.mdns {
                    // Not a murmur bootstrap (or gone): try the others.
                    debug!(%peer, "join request failed: {error}");
                    j.refused(format!("{peer}: {error}"));
                    continue;
                }
                bail!(
                    "join request to the bootstrap failed: {error} (if its connection was lost \
                     before it answered, the run may have ended or peer 0 may be gone)"
                )
            }
            other => debug!(?other, "join"),
        }
    }
}
