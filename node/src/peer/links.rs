//! Opening a peer's links at the start of a run: the direct path first (all at once, so that
//! both ends of a link through NATs dial each other together: hole punching), then, for a
//! link whose direct path did not open and that crosses a NAT, the relayed fallback through
//! a reachable member ([`crate::plane::relay`], chosen as
//! [`crate::control::discovery::relaying`] says). Each link says which path it took.

use std::collections::BTreeMap;
use std::time::Duration;

use libp2p::PeerId;
use murmur_gossip::Rank;
use tracing::{info, warn};

use crate::control::discovery::{PeerInfo, RelayClient};
use crate::plane::striping::TcpStreams;
use crate::plane::{DataPlane, Incarnation, LinkKind, Links};

/// How long a peer behind a NAT waits for a neighbour's direct connection before it also
/// registers as the listener of that link's relayed path (the sender asks for the relay
/// only after its own direct dial timed out, 10 s).
const LISTEN_FOR_DIRECT: Duration = Duration::from_secs(3);
/// How long a listener keeps registering at a relay port before giving up on that link.
const LISTEN_LIMIT: Duration = Duration::from_secs(120);

/// A destination: its rank, its directory entry, its identity.
pub type Target<'a> = (Rank, &'a PeerInfo, PeerId);

/// Opens the links from this peer (`me`, its directory entry) to `targets`. Behind a NAT,
/// it also takes the relayed path for each of `incoming` (the peers that send to it) whose
/// direct connection has not come within 3 s. `Ok` holds the links and, with
/// `tolerate_unreachable` (a rejoining peer: some destinations may have left), the
/// destinations that could not be reached and why.
///
/// # Errors
/// A destination cannot be reached, directly or relayed (unless `tolerate_unreachable`);
/// the error says whether a NAT is in the way and what to do.
pub async fn open(
    plane: &DataPlane,
    relay: &RelayClient,
    (rank, me): (Rank, Option<&PeerInfo>),
    targets: &[Target<'_>],
    incoming: &[Rank],
    tolerate_unreachable: bool,
) -> anyhow::Result<(Links, BTreeMap<Rank, anyhow::Error>)> {
    let me_behind_nat = me.and_then(|m| m.nat_published);
    if let (Some(published), Some(me)) = (me_behind_nat, me) {
        info!(
            %published,
            public = %me.data_addr,
            "this peer is behind a NAT: the bootstrap saw it at another address, which its \
             neighbours dial"
        );
    }
    let listening = async {
        if me_behind_nat.is_some() && relay.is_on() {
            listen_relayed(plane, relay, rank, incoming).await;
        }
    };
    // All at once: behind NATs both ends of a link must dial each other at the same time
    // (hole punching), and no link may wait for another to be set up first.
    let direct = futures::future::join_all(
        targets
            .iter()
            .map(|&(to, info, id)| plane.connect((to, info.incarnation), info.data_addr, id)),
    );
    let (direct, ()) = tokio::join!(direct, listening);
    let mut links = Links::new();
    let mut failed = Vec::new();
    for (&(to, info, id), result) in targets.iter().zip(direct) {
        match result {
            Ok(link) => {
                if let Some(published) = info.nat_published {
                    info!(
                        to,
                        addr = %info.data_addr,
                        %published,
                        "link to peer {to}: direct QUIC through its NAT (hole-punched)"
                    );
                }
                links.insert(to, link);
            }
            Err(e) => failed.push((to, info, id, e)),
        }
    }
    // The fallback: relayed, for the links that cross a NAT.
    let relayed = futures::future::join_all(failed.into_iter().map(|(to, info, id, e)| {
        let nat = match (info.nat_published, me_behind_nat) {
            (Some(p), _) => Nat::Behind(format!("peer {to} is behind a NAT (it published {p})")),
            (None, Some(p)) => Nat::Behind(format!("this peer is behind a NAT (it published {p})")),
            (None, None) => Nat::NotInTheWay,
        };
        let to_inc = (to, info.incarnation);
        async move { (to, fallback(plane, relay, rank, (to_inc, id), nat, e).await) }
    }))
    .await;
    let mut unreachable = BTreeMap::new();
    for (to, result) in relayed {
        match result {
            Ok(link) => {
                links.insert(to, link);
            }
            Err(e) if tolerate_unreachable => {
                unreachable.insert(to, e);
            }
            Err(e) => return Err(e),
        }
    }
    let count = |kinds: &[LinkKind]| links.values().filter(|l| kinds.contains(&l.kind)).count();
    let shared = count(&[LinkKind::SharedMemory]);
    let tcp = count(&[LinkKind::Tcp, LinkKind::TcpPlaintext]);
    let plaintext = count(&[LinkKind::TcpPlaintext]);
    let through_relay: Vec<Rank> = links
        .values()
        .filter(|l| l.relayed.is_some())
        .map(|l| l.to())
        .collect();
    let streams = match plane.tcp_streams {
        _ if tcp == 0 => String::new(),
        TcpStreams::Fixed(n) if n > 1 => format!("; {n} connections each"),
        TcpStreams::Fixed(_) => String::new(),
        TcpStreams::Auto => format!(
            "; {} connections each, large frames over as many as pay (auto)",
            TcpStreams::Auto.connections()
        ),
    };
    info!(
        relayed = ?through_relay,
        "links: {shared} through shared memory, {tcp} over TCP ({plaintext} of them in \
         clear{streams}), {} over QUIC ({} of them relayed)",
        links.len() - shared - tcp,
        through_relay.len()
    );
    Ok((links, unreachable))
}

/// Whether a NAT lies on a link's direct path, as far as this peer knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nat {
    /// One end is behind a NAT: the text says which (for the log and the error).
    Behind(String),
    /// Neither end is: a direct path that did not open is not a NAT's doing (no relay).
    NotInTheWay,
    /// Not known (a restarted peer's new address comes without its NAT status): relay if
    /// relaying is on.
    Unknown,
}

/// The one link-opening rule, for the start of a run ([`open`]) and for a restarted peer
/// (`Driver::link_to`): the direct path first; if it did not open, the relayed path
/// through a member when a NAT is (or may be) in the way and relaying is on. `to`: the
/// destination's rank and the incarnation of its process at `addr`.
///
/// # Errors
/// The direct path's error, with why no relay was tried or why the relayed path failed.
pub async fn connect(
    plane: &DataPlane,
    relay: &RelayClient,
    rank: Rank,
    (to, addr, id): ((Rank, Incarnation), std::net::SocketAddr, PeerId),
    nat: Nat,
) -> anyhow::Result<crate::plane::Link> {
    match plane.connect(to, addr, id).await {
        Ok(link) => Ok(link),
        // A process that exited is not reached by any path.
        Err(e) if plane.exits().is_dead(to) => Err(e),
        Err(e) => fallback(plane, relay, rank, (to, id), nat, e).await,
    }
}

/// The relayed fallback of a link whose direct path failed with `direct` (see [`connect`]).
async fn fallback(
    plane: &DataPlane,
    relay: &RelayClient,
    rank: Rank,
    ((to, incarnation), id): ((Rank, Incarnation), PeerId),
    nat: Nat,
    direct: anyhow::Error,
) -> anyhow::Result<crate::plane::Link> {
    let who = match nat {
        Nat::NotInTheWay => return Err(direct),
        Nat::Unknown if !relay.is_on() => return Err(direct),
        Nat::Unknown => "a NAT may be in the way".to_string(),
        Nat::Behind(who) if !relay.is_on() => {
            return Err(direct.context(format!(
                "{who}, and the direct path through it did not open: a NAT that changes \
                 the port for every destination (a symmetric NAT) or that answers \
                 unsolicited packets defeats hole punching, and relaying is off \
                 (--no-relay); give that peer a reachable address (or forward its data \
                 port), or let the members relay"
            )))
        }
        Nat::Behind(who) => who,
    };
    let attempt = async {
        let (by, allocation) = relay.allocate(rank, to).await?;
        let link = plane
            .connect_relayed((to, incarnation), &allocation, id)
            .await
            .map_err(|e| e.context(format!("through peer {by}")))?;
        anyhow::Ok((by, link))
    };
    match attempt.await {
        Ok((by, link)) => {
            warn!(
                to,
                relay = ?link.relayed,
                by,
                "link to peer {to}: RELAYED through peer {by} ({who}, and the direct path did \
                 not open: {direct:#}); slow by design, every byte crosses peer {by}"
            );
            Ok(link)
        }
        Err(relay_err) => Err(direct.context(format!(
            "{who}, the direct path did not open (a symmetric NAT, or one that answers \
             unsolicited packets, defeats hole punching), and neither did a relayed path: \
             {relay_err:#}"
        ))),
    }
}

/// Behind a NAT: for each peer of `incoming` whose direct connection has not come within
/// [`LISTEN_FOR_DIRECT`], asks for the relayed link from it to `rank` and registers there
/// as its listener (in the background, until a connection from it is up). Returns as soon
/// as every peer of `incoming` has connected, else once every such request was answered.
async fn listen_relayed(plane: &DataPlane, relay: &RelayClient, rank: Rank, incoming: &[Rank]) {
    let until = tokio::time::Instant::now() + LISTEN_FOR_DIRECT;
    while tokio::time::Instant::now() < until {
        if incoming
            .iter()
            .all(|&from| from == rank || plane.has_inbound(from))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let asks = incoming
        .iter()
        .filter(|&&from| from != rank && !plane.has_inbound(from))
        .map(|&from| async move {
            let registered = async {
                let (by, allocation) = relay.allocate(from, rank).await?;
                plane.expect_relayed(from, &allocation, LISTEN_LIMIT)?;
                anyhow::Ok((by, allocation.addr))
            };
            match registered.await {
                Ok((by, at)) => info!(
                    from,
                    relay = %at,
                    by,
                    "no direct connection from peer {from} yet: listening on the relayed path \
                     through peer {by} too"
                ),
                Err(e) => warn!(
                    from,
                    "cannot listen on a relayed path from peer {from}: {e:#}"
                ),
            }
        });
    futures::future::join_all(asks).await;
}
