//! Peers behind a NAT: the bootstrap publishes the address it sees them at.
//!
//! A peer behind a NAT publishes the address of its own interface (e.g. 192.168.1.2:5001),
//! which no peer outside its network can dial. The bootstrap sees the peer's control-plane
//! connection come from the NAT's public address instead (what libp2p's identify calls the
//! observed address, and AutoNAT tests). When the two differ, the bootstrap puts the
//! observed IP with the published data port into the directory, and keeps the published
//! address beside it ([`PeerInfo::nat_published`]) so that every peer can say which of its
//! links cross a NAT.
//!
//! **Direct path: hole punching by simultaneous open.** The data plane is one UDP socket
//! per peer (QUIC). The two ends of an undirected edge dial each other at the same time
//! when the run starts: each end's first packet to the other's public address opens a
//! mapping in its own NAT (the NAT lets the answer in), and QUIC retransmits its handshake
//! until the other end's packets have opened the way back — the connection is direct, no
//! relay carries the data. This needs the NAT to keep the data socket's port for every
//! destination (endpoint-independent mapping, as Linux's MASQUERADE does when the port is
//! free) and to drop unsolicited packets rather than answer them, and both ends must dial
//! (a directed edge i → j has no packet from j to open i's NAT). The bootstrap must be on
//! the public side: its view is every peer's view. Where the direct path does not open, the
//! link is relayed through a reachable member ([`crate::plane::relay`], opened by
//! `crate::peer::links`). Not built: a bootstrap behind a NAT.

use std::net::{IpAddr, SocketAddr};

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

use super::messages::PeerInfo;

/// The IP address of `addr` (`/ip4/…` or `/ip6/…` first), if it has one.
pub fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })
}

/// Publishes the peer at the IP the bootstrap sees it at, `observed`, when that differs from
/// the IP it published (and neither is a loopback or unspecified address: peers on this
/// host, or a peer that left the choice to others). Returns whether it did.
pub fn use_observed(info: &mut PeerInfo, observed: Option<IpAddr>) -> bool {
    let Some(seen) = observed else {
        return false;
    };
    let own = info.data_addr.ip();
    let meaningless = |ip: IpAddr| ip.is_loopback() || ip.is_unspecified();
    if seen == own || meaningless(seen) || meaningless(own) {
        return false;
    }
    info.nat_published = Some(info.data_addr);
    info.data_addr = SocketAddr::new(seen, info.data_addr.port());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(addr: &str) -> PeerInfo {
        PeerInfo {
            rank: 1,
            peer_id: "x".into(),
            data_addr: addr.parse().unwrap(),
            nat_published: None,
            incarnation: 0,
            control: Vec::new(),
        }
    }

    #[test]
    fn a_peer_seen_from_another_address_is_published_there_with_its_port() {
        let mut i = info("192.168.1.2:5001");
        assert!(use_observed(&mut i, Some("10.80.0.11".parse().unwrap())));
        assert_eq!(i.data_addr, "10.80.0.11:5001".parse().unwrap());
        assert_eq!(i.nat_published, Some("192.168.1.2:5001".parse().unwrap()));
    }

    #[test]
    fn the_same_address_loopback_or_nothing_seen_leave_it() {
        for (addr, seen) in [
            ("10.0.0.2:5001", Some("10.0.0.2")),
            ("127.0.0.1:5001", Some("10.0.0.9")),
            ("10.0.0.2:5001", Some("127.0.0.1")),
            ("10.0.0.2:5001", None),
        ] {
            let mut i = info(addr);
            assert!(!use_observed(&mut i, seen.map(|s| s.parse().unwrap())));
            assert_eq!(i.data_addr, addr.parse().unwrap());
            assert_eq!(i.nat_published, None);
        }
    }

    #[test]
    fn the_ip_of_a_multiaddr() {
        let a: Multiaddr = "/ip4/10.80.0.11/udp/4001/quic-v1".parse().unwrap();
        assert_eq!(ip_of(&a), Some("10.80.0.11".parse().unwrap()));
        let b: Multiaddr = "/dns4/example.org/udp/4001".parse().unwrap();
        assert_eq!(ip_of(&b), None);
    }
}
