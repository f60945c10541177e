//! The relayed fallback for links that hole punching cannot open (a symmetric NAT, a NAT
//! that answers unsolicited packets): a reachable member forwards the link's UDP datagrams
//! (which one: [`crate::control::discovery::relaying`]).
//!
//! The relay is a datagram forwarder, as a TURN server is (RFC 8656), not a frame
//! forwarder: the link stays one end-to-end QUIC connection, so its TLS (each end proves
//! its libp2p identity, [`super::tls`]), congestion control, counted goodbye and
//! liveness are the same as on a direct link, and the relay reads nothing of it. Each
//! relayed link i → j gets its own UDP port P on the relaying member ([`Relay::allocate`], asked
//! for over the control plane by either end, which must be i or j) and a random token.
//! Both ends send a registration datagram ([`registration`]: magic, role, token) from
//! their data-plane socket to P: that opens each end's NAT towards P (an outbound packet;
//! a symmetric NAT maps it to some port, which the relay learns from the packet), and tells
//! the relay where each end is. From then on the relay sends every datagram from one end
//! to the other, from P ([`Pair::route`]); the dialer's QUIC connects to P as if it were
//! the listener. Datagrams from any other address are dropped.
//!
//! It is slow by design: every byte of the link crosses the relaying member's link twice,
//! and its uplink is shared by all the links it relays. murmur uses it only after the
//! direct path failed, and says so for each link. A relaying member that has finished its
//! own run stays until the links through it have ended ([`Relay::linger`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use murmur_gossip::Rank;
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;
use tracing::{debug, info};

/// First bytes of a registration datagram.
const MAGIC: &[u8; 14] = b"murmur-relay/1";
/// Length of a relayed link's token, bytes.
pub const TOKEN_LEN: usize = 16;
/// Length of a registration datagram: magic, role, token.
pub const REGISTRATION_LEN: usize = MAGIC.len() + 1 + TOKEN_LEN;
/// The largest datagram forwarded (QUIC's packets are at most a path MTU, 1500 here; the
/// rest is room).
const MAX_DATAGRAM: usize = 65_536;

/// Which end of a relayed link a registration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// The sender i, which dials (the QUIC client).
    Dialer = 0,
    /// The receiver j, which accepts (the QUIC server).
    Listener = 1,
}

/// A relayed link as its ends know it: where to send and the token that admits them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The relay's port for this link (the bootstrap's data-plane IP).
    pub addr: SocketAddr,
    /// The link's token, hex ([`TOKEN_LEN`] bytes).
    pub token: String,
}

impl Allocation {
    /// The token's bytes.
    ///
    /// # Errors
    /// Not [`TOKEN_LEN`] bytes of hex.
    pub fn token_bytes(&self) -> anyhow::Result<[u8; TOKEN_LEN]> {
        let bytes = hex_decode(&self.token)
            .filter(|b| b.len() == TOKEN_LEN)
            .ok_or_else(|| {
                anyhow!(
                    "a relay token is {TOKEN_LEN} bytes of hex, got {:?}",
                    self.token
                )
            })?;
        let mut t = [0; TOKEN_LEN];
        t.copy_from_slice(&bytes);
        Ok(t)
    }
}

/// The registration datagram an end of a relayed link sends to the relay's port.
pub fn registration(role: Role, token: &[u8; TOKEN_LEN]) -> [u8; REGISTRATION_LEN] {
    let mut d = [0; REGISTRATION_LEN];
    d[..MAGIC.len()].copy_from_slice(MAGIC);
    d[MAGIC.len()] = role as u8;
    d[MAGIC.len() + 1..].copy_from_slice(token);
    d
}

/// Where a datagram goes ([`Pair::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Send it on to this address.
    Forward(SocketAddr),
    /// A registration: the end is now known at its source address.
    Registered(Role),
    /// Nowhere: a stranger, a bad token, or the other end not registered yet (QUIC
    /// retransmits).
    Drop,
}

/// One relayed link's state: the token and where each end was last heard registering.
/// Pure: the relay's task feeds it datagrams and does what it says.
#[derive(Debug, Clone)]
pub struct Pair {
    token: [u8; TOKEN_LEN],
    /// The dialer's and the listener's addresses (as their NATs map them).
    ends: [Option<SocketAddr>; 2],
}

impl Pair {
    /// A link admitting registrations with `token`; no end known yet.
    pub fn new(token: [u8; TOKEN_LEN]) -> Self {
        Pair {
            token,
            ends: [None, None],
        }
    }

    /// What to do with `datagram` from `src`: a registration with the right token records
    /// its end at `src` (the latest wins: a NAT that re-mapped, a restarted peer); a
    /// datagram from one known end goes to the other.
    pub fn route(&mut self, src: SocketAddr, datagram: &[u8]) -> Route {
        if datagram.len() == REGISTRATION_LEN && datagram.starts_with(MAGIC) {
            let role = match datagram[MAGIC.len()] {
                0 => Role::Dialer,
                1 => Role::Listener,
                _ => return Route::Drop,
            };
            if datagram[MAGIC.len() + 1..] != self.token {
                return Route::Drop;
            }
            self.ends[role as usize] = Some(src);
            return Route::Registered(role);
        }
        match self.ends {
            [Some(d), Some(l)] if src == d => Route::Forward(l),
            [Some(d), Some(l)] if src == l => Route::Forward(d),
            _ => Route::Drop,
        }
    }
}

/// A member's relay: one UDP port per relayed link, kept for the process's life.
#[derive(Debug)]
pub struct Relay {
    /// Where its sockets bind (the data plane's bound IP).
    bind: IpAddr,
    /// What the peers dial (the member's published data-plane IP).
    public: IpAddr,
    /// Each relayed link's allocation, and the milliseconds from `born` to the last
    /// datagram its port received.
    links: Mutex<HashMap<(Rank, Rank), (Allocation, Arc<AtomicU64>)>>,
    /// When it was made.
    born: Instant,
}

impl Relay {
    /// A relay binding its ports on `bind`, dialled at `public`.
    pub fn new(bind: IpAddr, public: IpAddr) -> Arc<Self> {
        Arc::new(Relay {
            bind,
            public,
            links: Mutex::new(HashMap::new()),
            born: Instant::now(),
        })
    }

    /// Waits, before the process of peer `me` ends, until the links it relays for others
    /// (neither end `me`) are done: it returns once no datagram has reached their ports for
    /// `quiet` (longer than the links' keep-alive interval, so an open link is never quiet
    /// that long), after `limit` at most, or at once if it relays no link of others. The
    /// ends of a relayed link may still be finishing (their last reports, the record, the
    /// goodbye) after this peer is done.
    pub async fn linger(&self, me: Rank, quiet: Duration, limit: Duration) {
        let others: Vec<Arc<AtomicU64>> = {
            let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
            links
                .iter()
                .filter(|((from, to), _)| *from != me && *to != me)
                .map(|(_, (_, last))| last.clone())
                .collect()
        };
        if others.is_empty() {
            return;
        }
        info!(
            links = others.len(),
            "waiting for the links this peer relays for others to end (at most {limit:?})"
        );
        let until = tokio::time::Instant::now() + limit;
        loop {
            let last = others.iter().map(|l| l.load(Ordering::Relaxed)).max();
            let last = Duration::from_millis(last.unwrap_or(0));
            let silent = self.born.elapsed().saturating_sub(last);
            if silent >= quiet || tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The allocation of the relayed link `from` → `to`: the same for both ends, made (a
    /// port bound, its forwarding task started) by the first that asks. Must be called
    /// inside a tokio runtime. The caller checks that the asking peer is `from` or `to`.
    ///
    /// # Errors
    /// No UDP port can be bound, or no randomness.
    pub fn allocate(&self, from: Rank, to: Rank) -> anyhow::Result<Allocation> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((a, _)) = links.get(&(from, to)) {
            return Ok(a.clone());
        }
        let mut token = [0u8; TOKEN_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut token)
            .map_err(|_| anyhow!("no randomness for a relay token"))?;
        let socket = std::net::UdpSocket::bind(SocketAddr::new(self.bind, 0))
            .with_context(|| format!("binding a relay port on {}", self.bind))?;
        socket.set_nonblocking(true)?;
        let port = socket.local_addr()?.port();
        let socket = UdpSocket::from_std(socket)?;
        let allocation = Allocation {
            addr: SocketAddr::new(self.public, port),
            token: hex_encode(&token),
        };
        info!(from, to, relay = %allocation.addr, "relaying the link {from} -> {to}");
        let last = Arc::new(AtomicU64::new(self.born.elapsed().as_millis() as u64));
        tokio::spawn(forward(
            socket,
            Pair::new(token),
            (from, to),
            (self.born, last.clone()),
        ));
        links.insert((from, to), (allocation.clone(), last));
        Ok(allocation)
    }
}

/// Moves one relayed link's datagrams for as long as the process lives; notes when each
/// came in `heard` (the relay's birth, and the milliseconds since it of the latest).
async fn forward(
    socket: UdpSocket,
    mut pair: Pair,
    (from, to): (Rank, Rank),
    (born, last): (Instant, Arc<AtomicU64>),
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, src) = match socket.recv_from(&mut buf).await {
            Ok(got) => {
                last.store(born.elapsed().as_millis() as u64, Ordering::Relaxed);
                got
            }
            Err(e) => {
                // ICMP errors (an end's port closed) surface here; the next datagram may
                // still come.
                debug!(from, to, "relay receive: {e}");
                continue;
            }
        };
        match pair.route(src, &buf[..n]) {
            Route::Forward(dst) => {
                if let Err(e) = socket.send_to(&buf[..n], dst).await {
                    debug!(from, to, %dst, "relay send: {e}");
                }
            }
            Route::Registered(role) => debug!(from, to, ?role, %src, "relay registration"),
            Route::Drop => {}
        }
    }
}

/// Sends `role`'s registration for `allocation` from `socket` (the data plane's) every
/// `every`, until `done` says the link is up or `limit` has passed. Runs as a task.
pub(super) async fn keep_registered(
    socket: Arc<std::net::UdpSocket>,
    allocation: Allocation,
    role: Role,
    every: Duration,
    limit: Duration,
    done: impl Fn() -> bool + Send + 'static,
) {
    let Ok(token) = allocation.token_bytes() else {
        return;
    };
    let datagram = registration(role, &token);
    let until = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < until && !done() {
        // Best effort: a lost registration is sent again.
        if let Err(e) = socket.send_to(&datagram, allocation.addr) {
            debug!(relay = %allocation.addr, "sending a relay registration: {e}");
        }
        tokio::time::sleep(every).await;
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn datagrams_flow_only_between_the_two_registered_ends() {
        let token = [7u8; TOKEN_LEN];
        let mut pair = Pair::new(token);
        let (d, l, stranger) = (
            addr("10.0.0.1:5000"),
            addr("10.0.0.2:6000"),
            addr("10.0.0.9:1"),
        );
        // Nothing is forwarded before both ends registered.
        assert_eq!(pair.route(d, b"quic"), Route::Drop);
        let reg_d = registration(Role::Dialer, &token);
        assert_eq!(pair.route(d, &reg_d), Route::Registered(Role::Dialer));
        assert_eq!(pair.route(d, b"quic"), Route::Drop);
        let reg_l = registration(Role::Listener, &token);
        assert_eq!(pair.route(l, &reg_l), Route::Registered(Role::Listener));
        assert_eq!(pair.route(d, b"quic"), Route::Forward(l));
        assert_eq!(pair.route(l, b"quic"), Route::Forward(d));
        assert_eq!(pair.route(stranger, b"quic"), Route::Drop);
        // A wrong token or role registers nothing; the ends stay where they were.
        let bad = registration(Role::Listener, &[8u8; TOKEN_LEN]);
        assert_eq!(pair.route(stranger, &bad), Route::Drop);
        let mut odd_role = reg_l;
        odd_role[MAGIC.len()] = 9;
        assert_eq!(pair.route(stranger, &odd_role), Route::Drop);
        assert_eq!(pair.route(d, b"quic"), Route::Forward(l));
        // A re-mapped end registers again and is found at its new address.
        let moved = addr("10.0.0.2:6001");
        assert_eq!(pair.route(moved, &reg_l), Route::Registered(Role::Listener));
        assert_eq!(pair.route(d, b"quic"), Route::Forward(moved));
        assert_eq!(pair.route(l, b"quic"), Route::Drop);
    }

    #[test]
    fn tokens_round_trip_through_hex_and_bad_ones_are_refused() {
        let a = Allocation {
            addr: addr("10.0.0.1:7000"),
            token: hex_encode(&[0xab; TOKEN_LEN]),
        };
        assert_eq!(a.token_bytes().unwrap(), [0xab; TOKEN_LEN]);
        for bad in ["", "abc", "zz", &"ab".repeat(TOKEN_LEN + 1)] {
            let a = Allocation {
                token: bad.to_string(),
                ..a.clone()
            };
            assert!(a.token_bytes().is_err(), "{bad:?}");
        }
    }

    /// A relay lingers while datagrams reach the ports of others' links, and not for its
    /// own links nor once they are quiet.
    #[tokio::test]
    async fn a_relay_lingers_until_the_links_of_others_are_quiet() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let (quiet, limit) = (Duration::from_millis(400), Duration::from_secs(10));
        let relay = Relay::new(lo, lo);
        let t = tokio::time::Instant::now();
        relay.linger(0, quiet, limit).await;
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "it relays nothing"
        );
        let own = relay.allocate(0, 2).unwrap();
        let others = relay.allocate(1, 2).unwrap();
        let end = std::net::UdpSocket::bind((lo, 0)).unwrap();
        // Datagrams reach the link 1 -> 2's port every 100 ms for 1.5 s.
        let sending = std::thread::spawn(move || {
            for _ in 0..15 {
                end.send_to(b"quic", others.addr).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let t = tokio::time::Instant::now();
        relay.linger(2, quiet, limit).await;
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "peer 2 ends both links"
        );
        relay.linger(0, quiet, limit).await;
        let waited = t.elapsed();
        sending.join().unwrap();
        assert!(
            waited >= Duration::from_millis(1_500) && waited < Duration::from_secs(9),
            "waited {waited:?}: until 1 -> 2 was quiet for {quiet:?}, not for 0 -> 2 ({})",
            own.addr
        );
        let t = tokio::time::Instant::now();
        relay.linger(0, quiet, Duration::from_millis(300)).await;
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "quiet already, or the limit"
        );
    }

    #[tokio::test]
    async fn both_ends_of_a_link_get_the_same_allocation_and_other_links_their_own() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let relay = Relay::new(lo, lo);
        let a = relay.allocate(1, 2).unwrap();
        assert_eq!(relay.allocate(1, 2).unwrap(), a);
        let b = relay.allocate(2, 1).unwrap();
        assert_ne!(a.addr, b.addr);
        assert_ne!(a.token, b.token);
    }
}
