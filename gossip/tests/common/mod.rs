//! Helpers shared by the gossip integration tests.
#![allow(dead_code)] // each test file uses a subset

use murmur_gossip::frame::{FrameHeader, FrameKind};
use murmur_gossip::Rank;
use murmur_topology::{Graph, MixingMatrix};

/// Metropolis–Hastings weights on the ring of n peers.
pub fn ring_mh(n: usize) -> MixingMatrix {
    MixingMatrix::metropolis_hastings(&Graph::ring(n).unwrap()).unwrap()
}

/// A gossip frame from `sender` for `round` whose header declares model dimension `dim`,
/// carrying `payload` as is.
pub fn raw_frame(sender: Rank, round: u64, dim: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader {
        kind: FrameKind::Gossip,
        sender,
        round,
        dim,
        payload_len: payload.len() as u32,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(payload);
    f
}
