//! The node's frames on the data plane besides the algorithms': membership notices
//! (leave, hello, welcome, admit, rejoin) and the epoch reports to peer 0.

use super::*;

/// A departure notice: the 24-byte frame header (kind `Leave`, round = the round at which the
/// departure was first noticed, kept as the notice is passed on), then
/// `gone: u64 LE | reason (UTF-8)`.
pub(crate) fn encode_leave(sender: Rank, round: u64, gone: Rank, reason: &str) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + 8 + reason.len());
    FrameHeader {
        kind: FrameKind::Leave,
        sender,
        round,
        dim: 0,
        payload_len: (8 + reason.len()) as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(gone as u64).to_le_bytes());
    frame.extend_from_slice(reason.as_bytes());
    frame
}

/// Inverse of [`encode_leave`] for the payload: (gone, reason); `None` if malformed.
pub(crate) fn decode_leave(payload: &[u8]) -> Option<(Rank, String)> {
    let gone = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let reason = std::str::from_utf8(&payload[8..]).ok()?;
    Some((usize::try_from(gone).ok()?, reason.to_string()))
}

/// A hello: the 24-byte frame header (kind `Hello`), then the JSON of the sender's new
/// directory entry.
pub(crate) fn encode_hello(sender: Rank, me: &PeerInfo) -> anyhow::Result<Vec<u8>> {
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

/// An admission notice: the 24-byte frame header (kind `Admit`), then `rank: u64 LE |
/// peer_id: UTF-8` (a new peer with that libp2p identity took that empty rank).
pub(crate) fn encode_admit(
    sender: Rank,
    rank: Rank,
    id: libp2p::PeerId,
    signature: &[u8],
) -> Vec<u8> {
    let id = id.to_bytes();
    let len = 8 + 2 + id.len() + signature.len();
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
    frame.extend_from_slice(&(id.len() as u16).to_le_bytes());
    frame.extend_from_slice(&id);
    frame.extend_from_slice(signature);
    frame
}

/// Inverse of [`encode_admit`] for the payload `rank: u64 | id_len: u16 | PeerId bytes |
/// peer 0's signature`: (rank, identity, signature); `None` if malformed.
pub(crate) fn decode_admit(payload: &[u8]) -> Option<(Rank, libp2p::PeerId, Vec<u8>)> {
    if payload.len() < 10 || payload.len() > 10 + 128 + 128 {
        return None;
    }
    let rank = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let id_len = u16::from_le_bytes(payload[8..10].try_into().ok()?) as usize;
    let id = libp2p::PeerId::from_bytes(payload.get(10..10 + id_len)?).ok()?;
    let signature = payload[10 + id_len..].to_vec();
    Some((usize::try_from(rank).ok()?, id, signature))
}

/// What peer 0 signs to admit identity `id` to rank `rank`.
pub(crate) fn admit_message(rank: Rank, id: &libp2p::PeerId) -> Vec<u8> {
    let mut m = b"murmur admit v1\n".to_vec();
    m.extend_from_slice(&(rank as u64).to_le_bytes());
    m.extend_from_slice(&id.to_bytes());
    m
}

/// A rejoin notice: the 24-byte frame header (kind `Rejoin`), then `back: u64 LE | at: u64
/// LE | addr: UTF-8` (peer `back` mixes again from round `at`; its new data-plane address
/// `addr`, e.g. `127.0.0.1:5001`, for peers that push to it but were not told by a hello).
pub(crate) fn encode_rejoin(sender: Rank, back: Rank, at: u64, addr: SocketAddr) -> Vec<u8> {
    let addr = addr.to_string();
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + 16 + addr.len());
    FrameHeader {
        kind: FrameKind::Rejoin,
        sender,
        round: at,
        dim: 0,
        payload_len: (16 + addr.len()) as u32,
    }
    .emit(&mut frame);
    frame.extend_from_slice(&(back as u64).to_le_bytes());
    frame.extend_from_slice(&at.to_le_bytes());
    frame.extend_from_slice(addr.as_bytes());
    frame
}

/// Inverse of [`encode_rejoin`] for the payload: (back, at, addr); `None` if malformed.
pub(crate) fn decode_rejoin(payload: &[u8]) -> Option<(Rank, u64, SocketAddr)> {
    if payload.len() < 16 || payload.len() > 16 + 64 {
        return None;
    }
    let back = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let at = u64::from_le_bytes(payload[8..16].try_into().ok()?);
    let addr = std::str::from_utf8(&payload[16..]).ok()?.parse().ok()?;
    Some((usize::try_from(back).ok()?, at, addr))
}

/// A report frame (kind `Report`, round = epoch): see [`encode_with_params`].
pub(crate) fn encode_report(
    sender: Rank,
    report: &PeerEpoch,
    x: &[f32],
) -> anyhow::Result<Vec<u8>> {
    encode_with_params(FrameKind::Report, sender, report.epoch as u64, report, x)
}

/// A frame of `kind` carrying a JSON value and parameters: the 24-byte frame header, then
/// the payload `json_len: u32 LE | JSON of value | a murmur_compress identity message of
/// x: [d]` (reports, welcomes).
pub(crate) fn encode_with_params<T: Serialize>(
    kind: FrameKind,
    sender: Rank,
    round: u64,
    value: &T,
    x: &[f32],
) -> anyhow::Result<Vec<u8>> {
    let json = serde_json::to_vec(value)?;
    let mut payload = Vec::with_capacity(4 + json.len() + 16 + 4 * x.len());
    payload.extend_from_slice(&(json.len() as u32).to_le_bytes());
    payload.extend_from_slice(&json);
    // Identity draws no randomness; the RNG only satisfies the trait.
    let mut rng = StdRng::seed_from_u64(0);
    murmur_compress::Identity.compress(x, &mut rng, &mut payload);
    let mut frame = FrameHeader {
        kind,
        sender,
        round,
        dim: x.len() as u32,
        payload_len: payload.len() as u32,
    }
    .to_bytes()
    .to_vec();
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Inverse of [`encode_report`] for the payload (see [`decode_with_params`]).
pub(crate) fn decode_report(payload: &[u8], d: usize) -> anyhow::Result<(PeerEpoch, Vec<f32>)> {
    decode_with_params(payload, d)
}

/// Inverse of [`encode_with_params`] for the payload; refuses truncation, bad JSON, a
/// parameter vector of another length than `d` and non-finite values.
pub(crate) fn decode_with_params<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    d: usize,
) -> anyhow::Result<(T, Vec<f32>)> {
    let json_len = payload
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| anyhow!("report truncated"))?;
    let json = payload
        .get(4..4 + json_len)
        .ok_or_else(|| anyhow!("report truncated"))?;
    let value: T = serde_json::from_slice(json).context("JSON part")?;
    let mut x = vec![0.0f32; d];
    murmur_compress::decode_into(&payload[4 + json_len..], &mut x).context("parameters")?;
    Ok((value, x))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A report with every field set, for the codec and collector tests.
    pub(crate) fn report() -> PeerEpoch {
        PeerEpoch {
            peer: 3,
            epoch: 2,
            phase: "dpsgd".into(),
            rounds: 64,
            train_loss: 0.5,
            test_accuracy: 0.9,
            test_loss: 0.3,
            bytes_sent: 1000,
            bytes_received: 999,
            compute_seconds: 1.5,
            communicate_seconds: 2.5,
            wait_seconds: 0.5,
            refused_frames: 0,
            skipped: 0,
            wall_seconds: 4.0,
        }
    }

    #[test]
    fn report_frames_round_trip() {
        let x = [1.0f32, -2.5, 3.25];
        let frame = encode_report(3, &report(), &x).unwrap();
        let (h, payload) = FrameHeader::parse(&frame, 1 << 20).unwrap();
        assert_eq!(
            (h.kind, h.sender, h.round, h.dim),
            (FrameKind::Report, 3, 2, 3)
        );
        let (r, y) = decode_report(payload, 3).unwrap();
        assert_eq!((r.peer, r.epoch, r.bytes_sent), (3, 2, 1000));
        assert_eq!(y, x);
    }

    #[test]
    fn an_admission_holds_only_with_peer_0s_signature() {
        let peer0 = libp2p::identity::Keypair::generate_ed25519();
        let member = libp2p::identity::Keypair::generate_ed25519();
        let new = libp2p::PeerId::random();
        let key0 =
            auth::public_key(&peer0.public().to_peer_id()).expect("Ed25519 PeerIds inline the key");
        let signature = peer0.sign(&admit_message(3, &new)).unwrap();
        let frame = encode_admit(2, 3, new, &signature);
        let h = FrameHeader::parse(&frame, 1 << 20).unwrap().0;
        assert_eq!((h.kind, h.sender), (FrameKind::Admit, 2));
        let (rank, id, sig) = decode_admit(&frame[FRAME_HEADER_LEN..]).unwrap();
        assert_eq!((rank, id), (3, new));
        assert!(key0.verify(&admit_message(rank, &id), &sig));
        // A member's own signature, another rank, or no signature: refused.
        let forged = member.sign(&admit_message(3, &new)).unwrap();
        assert!(!key0.verify(&admit_message(3, &new), &forged));
        assert!(!key0.verify(&admit_message(4, &new), &sig));
        assert!(!key0.verify(&admit_message(3, &new), &[]));
        // Malformed payloads.
        let payload = &frame[FRAME_HEADER_LEN..];
        assert!(decode_admit(&payload[..9]).is_none());
        let mut long_id = payload.to_vec();
        long_id[8..10].copy_from_slice(&500u16.to_le_bytes());
        assert!(decode_admit(&long_id).is_none());
        assert!(decode_admit(&[0u8; 300]).is_none());
    }

    #[test]
    fn membership_notices_round_trip_and_malformed_ones_are_refused() {
        let leave = encode_leave(2, 57, 5, "connection from peer 5: timed out");
        let (h, payload) = FrameHeader::parse(&leave, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender, h.round), (FrameKind::Leave, 2, 57));
        assert_eq!(
            decode_leave(payload),
            Some((5, "connection from peer 5: timed out".to_string()))
        );
        assert_eq!(decode_leave(&payload[..7]), None, "truncated rank");
        assert_eq!(
            decode_leave(&[5, 0, 0, 0, 0, 0, 0, 0, 0xff]),
            None,
            "not UTF-8"
        );

        let addr: SocketAddr = "127.0.0.1:5001".parse().unwrap();
        let rejoin = encode_rejoin(1, 3, 193, addr);
        let (h, payload) = FrameHeader::parse(&rejoin, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender, h.round), (FrameKind::Rejoin, 1, 193));
        assert_eq!(decode_rejoin(payload), Some((3, 193, addr)));
        assert_eq!(decode_rejoin(&payload[..15]), None);
        assert_eq!(decode_rejoin(&payload[..20]), None, "a cut address");

        let me = PeerInfo {
            rank: 3,
            peer_id: "12D3KooW".into(),
            data_addr: "127.0.0.1:5001".parse().unwrap(),
        };
        let hello = encode_hello(3, &me).unwrap();
        let (h, payload) = FrameHeader::parse(&hello, 1 << 20).unwrap();
        assert_eq!((h.kind, h.sender), (FrameKind::Hello, 3));
        let back: PeerInfo = serde_json::from_slice(payload).unwrap();
        assert_eq!((back.rank, back.data_addr), (3, me.data_addr));

        let welcome = Welcome {
            round: 150,
            departed: vec![6],
        };
        let frame = encode_with_params(FrameKind::Welcome, 2, 150, &welcome, &[0.5, -1.0]).unwrap();
        let (w, x): (Welcome, Vec<f32>) =
            decode_with_params(&frame[FRAME_HEADER_LEN..], 2).unwrap();
        assert_eq!((w.round, w.departed, x), (150, vec![6], vec![0.5, -1.0]));
        assert!(decode_with_params::<Welcome>(&frame[FRAME_HEADER_LEN..], 3).is_err());
    }

    #[test]
    fn bad_report_payloads_are_refused() {
        let frame = encode_report(3, &report(), &[1.0, 2.0]).unwrap();
        let payload = &frame[FRAME_HEADER_LEN..];
        assert!(decode_report(payload, 3).is_err(), "another d");
        assert!(
            decode_report(&payload[..payload.len() - 1], 2).is_err(),
            "truncated x"
        );
        assert!(decode_report(&payload[..10], 2).is_err(), "truncated JSON");
        assert!(
            decode_report(&[0xff, 0xff, 0xff, 0xff], 2).is_err(),
            "JSON length past the end"
        );
        let nan = encode_report(3, &report(), &[1.0, f32::NAN]).unwrap();
        assert!(
            decode_report(&nan[FRAME_HEADER_LEN..], 2).is_err(),
            "non-finite x"
        );
    }
}
