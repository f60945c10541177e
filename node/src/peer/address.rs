//! The data-plane address a peer publishes to the others: the one it bound, or — bound to
//! every interface (`--data-addr 0.0.0.0:PORT`) — the address of the interface this host
//! uses to reach the bootstrap (or, on peer 0, its `--listen` address, else the interface
//! of the default route). Another peer cannot dial `0.0.0.0`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use anyhow::bail;
use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

/// The address to publish for a data plane bound at `bound`, given the peer's `--bootstrap`
/// and `--listen` addresses. Errors: bound to every interface and no address of this host
/// could be found (no route to any bootstrap, nor a default route).
pub fn published(
    bound: SocketAddr,
    bootstrap: &[Multiaddr],
    listen: &Multiaddr,
) -> anyhow::Result<SocketAddr> {
    if !bound.ip().is_unspecified() {
        return Ok(bound);
    }
    let towards_bootstrap = bootstrap.iter().filter_map(ip_of);
    let listened = ip_of(listen).filter(|ip| !ip.is_unspecified());
    // TEST-NET addresses: only the route is looked up, nothing is sent.
    let default_route = [
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    ];
    for target in towards_bootstrap.chain(listened).chain(default_route) {
        if let Some(ip) = source_towards(target, bound.is_ipv4()) {
            return Ok(SocketAddr::new(ip, bound.port()));
        }
    }
    bail!(
        "--data-addr {bound} binds every interface, but the other peers need one address to \
         dial and none was found (no route to a --bootstrap address or a default route): give \
         --data-addr this host's address, e.g. 10.0.0.2:{}",
        bound.port()
    )
}

/// The IP of a multiaddr's first `/ip4` or `/ip6` component.
fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })
}

/// The source address this host would use to send to `target` (a route lookup: a UDP
/// socket is connected, nothing is sent), of the family asked for.
fn source_towards(target: IpAddr, v4: bool) -> Option<IpAddr> {
    if target.is_ipv4() != v4 {
        return None;
    }
    if target.is_loopback() {
        return Some(target);
    }
    let any: IpAddr = if v4 {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
    socket.connect(SocketAddr::new(target, 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_address_is_published_as_it_is() {
        let bound: SocketAddr = "10.1.2.3:5001".parse().unwrap();
        let listen: Multiaddr = "/ip4/0.0.0.0/udp/4001/quic-v1".parse().unwrap();
        assert_eq!(published(bound, &[], &listen).unwrap(), bound);
    }

    #[test]
    fn every_interface_publishes_the_route_to_the_bootstrap() {
        let bound: SocketAddr = "0.0.0.0:5001".parse().unwrap();
        let boot: Multiaddr = "/ip4/127.0.0.1/udp/4001/quic-v1".parse().unwrap();
        let listen: Multiaddr = "/ip4/0.0.0.0/udp/0/quic-v1".parse().unwrap();
        assert_eq!(
            published(bound, &[boot], &listen).unwrap(),
            "127.0.0.1:5001".parse::<SocketAddr>().unwrap()
        );
        // Peer 0: its own listen address.
        let listen: Multiaddr = "/ip4/127.0.0.1/udp/4001/quic-v1".parse().unwrap();
        assert_eq!(
            published(bound, &[], &listen).unwrap(),
            "127.0.0.1:5001".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn whatever_is_published_is_never_unspecified() {
        let bound: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let listen: Multiaddr = "/ip4/0.0.0.0/udp/0/quic-v1".parse().unwrap();
        // With a default route: its interface; without one: an error that names the fix.
        match published(bound, &[], &listen) {
            Ok(a) => assert!(!a.ip().is_unspecified(), "{a}"),
            Err(e) => assert!(e.to_string().contains("give --data-addr"), "{e}"),
        }
    }
}
