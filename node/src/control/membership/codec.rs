//! The membership notices on the data plane and their wire format: leave, hello, admit
//! and rejoin frames (a 24-byte frame header, then the payload described on each encoder),
//! and the message a member signs to admit a new peer. A welcome is a frame with parameters
//! (`report::frames::encode_with_params`) carrying a [`super::Welcome`].

use std::net::SocketAddr;

use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::Rank;

use crate::control::discovery::PeerInfo;
use crate::plane::Incarnation;

/// A departure notice: the 24-byte frame header (kind `Leave`, round = the round at which the
/// departure was first noticed, kept as the notice is passed on), then
/// `gone: u64 LE | before: u64 LE | reason (UTF-8)`: the processes of `gone` with
/// incarnations below `before` left.
pub fn encode_leave(
    sender: Rank,
    round: u64,
    (gone, before): (Rank, Incarnation),
    reason: &str,
) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + 16 + reason.len());
    FrameHeader {
        kind: FrameKind::Leave,
        sender,
        round,
        dim: 0,
        payload_len: (16 + reason.len()) as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(gone as u64).to_le_bytes());
    frame.extend_from_slice(&before.to_le_bytes());
    frame.extend_from_slice(reason.as_bytes());
    frame
}

/// Inverse of [`encode_leave`] for the payload: (gone, before, reason); `None` if malformed.
pub fn decode_leave(payload: &[u8]) -> Option<(Rank, Incarnation, String)> {
    let gone = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let before = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    let reason = std::str::from_utf8(&payload[16..]).ok()?;
    Some((usize::try_from(gone).ok()?, before, reason.to_string()))
}

/// A hello: the 24-byte frame header (kind `Hello`), then the JSON of the sender's new
/// directory entry.
///
/// # Errors
/// The entry cannot be serialized.
pub fn encode_hello(sender: Rank, me: &PeerInfo) -> anyhow::Result<Vec<u8>> {
    let json = serde_json::to_vec(me)?;
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + json.len());
    FrameHeader {
        kind: FrameKind::Hello,
        sender,
        round: 0,
        dim: 0,
        payload_len: json.len() as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&json);
    Ok(frame)
}

/// Inverse of [`encode_hello`] for the payload of a hello from peer `from`: its directory
/// entry; `None` if malformed or about another rank than `from`.
pub fn decode_hello(payload: &[u8], from: Rank) -> Option<PeerInfo> {
    match serde_json::from_slice(payload) {
        Ok(i @ PeerInfo { rank, .. }) if rank == from => Some(i),
        _ => None,
    }
}

/// An admission notice: the 24-byte frame header (kind `Admit`), then `rank: u64 LE |
/// signer: u64 LE | id_len: u16 LE | PeerId bytes | the signer's signature` (a new peer
/// with that libp2p identity took that empty rank, admitted by the member of rank `signer`,
/// whose Ed25519 signature over [`admit_message`] it carries).
pub fn encode_admit(sender: Rank, rank: Rank, id: libp2p::PeerId, signed: &Signed) -> Vec<u8> {
    let id = id.to_bytes();
    let len = 8 + 8 + 2 + id.len() + signed.signature.len();
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + len);
    FrameHeader {
        kind: FrameKind::Admit,
        sender,
        round: 0,
        dim: 0,
        payload_len: len as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(rank as u64).to_le_bytes());
    frame.extend_from_slice(&(signed.signer as u64).to_le_bytes());
    frame.extend_from_slice(&(id.len() as u16).to_le_bytes());
    frame.extend_from_slice(&id);
    frame.extend_from_slice(&signed.signature);
    frame
}

/// Who admitted a new peer, and its proof: the member of rank `signer` and its Ed25519
/// signature over [`admit_message`] (64 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The rank of the member that admitted the new peer.
    pub signer: Rank,
    /// Its signature over [`admit_message`].
    pub signature: Vec<u8>,
}

/// Inverse of [`encode_admit`] for the payload `rank: u64 | signer: u64 | id_len: u16 |
/// PeerId bytes | signature`: (rank, identity, signer and signature); `None` if malformed
/// (also a payload over 274 bytes).
pub fn decode_admit(payload: &[u8]) -> Option<(Rank, libp2p::PeerId, Signed)> {
    if payload.len() < 18 || payload.len() > 18 + 128 + 128 {
        return None;
    }
    let rank = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let signer = u64::from_le_bytes(payload[8..16].try_into().ok()?);
    let id_len = u16::from_le_bytes(payload[16..18].try_into().ok()?) as usize;
    let id = libp2p::PeerId::from_bytes(payload.get(18..18 + id_len)?).ok()?;
    let signed = Signed {
        signer: usize::try_from(signer).ok()?,
        signature: payload[18 + id_len..].to_vec(),
    };
    Some((usize::try_from(rank).ok()?, id, signed))
}

/// What the member of rank `signer` signs to admit identity `id` to rank `rank`.
pub fn admit_message(rank: Rank, signer: Rank, id: &libp2p::PeerId) -> Vec<u8> {
    let mut m = b"murmur admit v2\n".to_vec();
    m.extend_from_slice(&(rank as u64).to_le_bytes());
    m.extend_from_slice(&(signer as u64).to_le_bytes());
    m.extend_from_slice(&id.to_bytes());
    m
}

/// A rejoin notice: the 24-byte frame header (kind `Rejoin`), then `back: u64 LE |
/// incarnation: u64 LE | at: u64 LE | addr: UTF-8` (peer `back`'s process of that
/// incarnation mixes again from round `at`; its new data-plane address `addr`, e.g.
/// `127.0.0.1:5001`, for peers that push to it but were not told by a hello).
pub fn encode_rejoin(
    sender: Rank,
    (back, incarnation): (Rank, Incarnation),
    at: u64,
    addr: SocketAddr,
) -> Vec<u8> {
    let addr = addr.to_string();
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + 24 + addr.len());
    FrameHeader {
        kind: FrameKind::Rejoin,
        sender,
        round: at,
        dim: 0,
        payload_len: (24 + addr.len()) as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(back as u64).to_le_bytes());
    frame.extend_from_slice(&incarnation.to_le_bytes());
    frame.extend_from_slice(&at.to_le_bytes());
    frame.extend_from_slice(addr.as_bytes());
    frame
}

/// Inverse of [`encode_rejoin`] for the payload: (back, incarnation, at, addr); `None` if
/// malformed (also a payload over 88 bytes).
pub fn decode_rejoin(payload: &[u8]) -> Option<(Rank, Incarnation, u64, SocketAddr)> {
    if payload.len() < 24 || payload.len() > 24 + 64 {
        return None;
    }
    let back = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let incarnation = u64::from_le_bytes(payload[8..16].try_into().ok()?);
    let at = u64::from_le_bytes(payload[16..24].try_into().ok()?);
    let addr = std::str::from_utf8(&payload[24..]).ok()?.parse().ok()?;
    Some((usize::try_from(back).ok()?, incarnation, at, addr))
}

#[cfg(test)]
mod tests {
    use super::super::Welcome;
    use super::*;
    use crate::control::auth;
    use crate::report::frames::{decode_with_params, encode_with_params};

    #[test]
    fn an_admission_holds_only_with_its_signer_s_signature() {
        let signer = libp2p::identity::Keypair::generate_ed25519();
        let other = libp2p::identity::Keypair::generate_ed25519();
        let new = libp2p::PeerId::random();
        let key = auth::public_key(&signer.public().to_peer_id())
            .expect("Ed25519 PeerIds inline the key");
        let signed = Signed {
            signer: 1,
            signature: signer.sign(&admit_message(3, 1, &new)).unwrap(),
        };
        let frame = encode_admit(2, 3, new, &signed);
        let h = FrameHeader::parse(&frame, 1 << 20).unwrap().0;
        assert_eq!((h.kind, h.sender), (FrameKind::Admit, 2));
        let (rank, id, got) = decode_admit(&frame[FRAME_HEADER_LEN..]).unwrap();
        assert_eq!((rank, id, &got), (3, new, &signed));
        let sig = &got.signature;
        assert!(key.verify(&admit_message(rank, got.signer, &id), sig));
        // Another key's signature, another rank or signer, or no signature: refused.
        let forged = other.sign(&admit_message(3, 1, &new)).unwrap();
        assert!(!key.verify(&admit_message(3, 1, &new), &forged));
        assert!(!key.verify(&admit_message(4, 1, &new), sig));
        assert!(!key.verify(&admit_message(3, 0, &new), sig));
        assert!(!key.verify(&admit_message(3, 1, &new), &[]));
        // Malformed payloads.
        let payload = &frame[FRAME_HEADER_LEN..];
        assert!(decode_admit(&payload[..17]).is_none());
        let mut long_id = payload.to_vec();
        long_id[16..18].copy_from_slice(&500u16.to_le_bytes());
        assert!(decode_admit(&long_id).is_none());
        assert!(decode_admit(&[0u8; 300]).is_none());
    }

    #[test]
    fn membership_notices_round_trip_and_malformed_ones_are_refused() {
        let leave = encode_leave(2, 57, (5, 1234), "connection from peer 5: timed out");
        let (h, payload) = FrameHeader::parse(&leave, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender, h.round), (FrameKind::Leave, 2, 57));
        assert_eq!(
            decode_leave(payload),
            Some((5, 1234, "connection from peer 5: timed out".to_string()))
        );
        assert_eq!(decode_leave(&payload[..7]), None, "truncated rank");
        assert_eq!(decode_leave(&payload[..15]), None, "truncated incarnation");
        let mut bad = payload[..16].to_vec();
        bad.push(0xff);
        assert_eq!(decode_leave(&bad), None, "not UTF-8");

        let addr: SocketAddr = "127.0.0.1:5001".parse().unwrap();
        let rejoin = encode_rejoin(1, (3, 77), 193, addr);
        let (h, payload) = FrameHeader::parse(&rejoin, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender, h.round), (FrameKind::Rejoin, 1, 193));
        assert_eq!(decode_rejoin(payload), Some((3, 77, 193, addr)));
        assert_eq!(decode_rejoin(&payload[..23]), None);
        assert_eq!(decode_rejoin(&payload[..28]), None, "a cut address");

        let me = PeerInfo {
            rank: 3,
            peer_id: "12D3KooW".into(),
            data_addr: "127.0.0.1:5001".parse().unwrap(),
            nat_published: None,
            incarnation: 42,
            control: Vec::new(),
        };
        let hello = encode_hello(3, &me).unwrap();
        let (h, payload) = FrameHeader::parse(&hello, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender), (FrameKind::Hello, 3));
        let back = decode_hello(payload, 3).unwrap();
        assert_eq!(
            (back.rank, back.data_addr, back.incarnation),
            (3, me.data_addr, 42)
        );
        assert!(
            decode_hello(payload, 4).is_none(),
            "a hello about another rank"
        );
        assert!(decode_hello(&payload[..5], 3).is_none(), "cut JSON");

        let welcome = Welcome {
            round: 150,
            departed: vec![6],
            rejoined: vec![(3, 120)],
            locations: vec![(3, 77, "127.0.0.1:4000".parse().unwrap())],
            record: Vec::new(),
        };
        let frame = encode_with_params(FrameKind::Welcome, 2, 150, &welcome, &[0.5, -1.0]).unwrap();
        let (w, x): (Welcome, Vec<f32>) =
            decode_with_params(&frame[FRAME_HEADER_LEN..], 2).unwrap();
        assert_eq!((w.round, w.departed, x), (150, vec![6], vec![0.5, -1.0]));
        assert_eq!(w.rejoined, vec![(3, 120)]);
        assert_eq!(
            w.locations, welcome.locations,
            "the address survives the JSON"
        );
        assert!(decode_with_params::<Welcome>(&frame[FRAME_HEADER_LEN..], 3).is_err());
    }
}
