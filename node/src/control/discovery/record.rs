//! Peer 0's signed record in the run's DHT ([`BootstrapRecord`], under [`BOOTSTRAP_KEY`]):
//! its PeerId and listen addresses, so that a peer entering the run through any member can
//! find and dial it. Pure: signing, verifying, parsing; no swarm.

use anyhow::anyhow;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};

/// The DHT key of peer 0's [`BootstrapRecord`].
pub const BOOTSTRAP_KEY: &[u8] = b"/murmur/bootstrap/1";

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
        let key = crate::control::auth::public_key(&id)?;
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

/// The bootstrap's PeerId and addresses in the [`BootstrapRecord`] in `value` (JSON), if it
/// parses and its signer signed it ([`BootstrapRecord::verify`]).
pub(super) fn read_record(value: &[u8]) -> Option<(PeerId, Vec<Multiaddr>)> {
    let record: BootstrapRecord = serde_json::from_slice(value).ok()?;
    record.verify()
}

/// The PeerId that signed the [`BootstrapRecord`] in `value`, if it parses and verifies.
pub(super) fn verified_record(value: &[u8]) -> Option<PeerId> {
    read_record(value).map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn only_a_record_that_parses_and_verifies_names_its_signer() {
        let peer0 = Keypair::generate_ed25519();
        let addrs: Vec<Multiaddr> = vec!["/ip4/10.0.0.1/udp/4001/quic-v1".parse().unwrap()];
        let record = BootstrapRecord::signed(&peer0, &addrs).unwrap();
        let bytes = serde_json::to_vec(&record).unwrap();
        assert_eq!(verified_record(&bytes), Some(peer0.public().to_peer_id()));
        assert_eq!(
            read_record(&bytes),
            Some((peer0.public().to_peer_id(), addrs))
        );
        assert_eq!(verified_record(b"not json"), None);
        let mut altered = record;
        altered.addrs.push("/ip4/10.6.6.6/udp/4001/quic-v1".into());
        assert_eq!(
            verified_record(&serde_json::to_vec(&altered).unwrap()),
            None
        );
    }
}
