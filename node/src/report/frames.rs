//! The node's frames on the data plane besides the algorithms' and the membership notices
//! (those are in [`crate::control::membership::codec`]): the epoch reports to peer 0, and
//! frames carrying a JSON value and parameters (reports, welcomes).

use anyhow::{anyhow, Context};
use murmur_compress::Compressor;
use murmur_gossip::frame::{FrameHeader, FrameKind};
use murmur_gossip::Rank;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;

use super::PeerEpoch;

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
    decode_with_params_sized(payload, |_| d)
}

/// [`decode_with_params`] where the JSON part says how many parameters follow (`d` of the
/// decoded value; a welcome without x: 0).
pub(crate) fn decode_with_params_sized<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    d: impl FnOnce(&T) -> usize,
) -> anyhow::Result<(T, Vec<f32>)> {
    let json_len = payload
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| anyhow!("report truncated"))?;
    let json = payload
        .get(4..4 + json_len)
        .ok_or_else(|| anyhow!("report truncated"))?;
    let value: T = serde_json::from_slice(json).context("JSON part")?;
    let mut x = vec![0.0f32; d(&value)];
    murmur_compress::decode_into(&payload[4 + json_len..], &mut x).context("parameters")?;
    Ok((value, x))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::PeerTotals;
    use murmur_gossip::frame::FRAME_HEADER_LEN;

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
            totals: PeerTotals {
                bytes_sent: 1000,
                bytes_received: 999,
                compute_seconds: 1.5,
                communicate_seconds: 2.5,
                wait_seconds: 0.5,
                refused_frames: 0,
                skipped: 0,
                wall_seconds: 4.0,
            },
            running_state: vec![0.25, 1.5],
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
        assert_eq!((r.peer, r.epoch, r.totals.bytes_sent), (3, 2, 1000));
        assert_eq!(y, x);
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
