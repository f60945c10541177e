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

/// A frame of `kind` from `sender` for `round` whose header declares model dimension `dim`,
/// carrying `payload` as is.
pub fn raw_frame_of_kind(
    kind: FrameKind,
    sender: Rank,
    round: u64,
    dim: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = FrameHeader {
        kind,
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

/// n vectors of `d` values drawn uniformly from [−1, 1) with `seed`, peer 0's first.
pub fn uniform_vectors(n: usize, d: usize, seed: u64) -> Vec<Vec<f32>> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect()
}

/// The coordinate-wise mean `[d]` of `xs: n × [d]`, in `f64`.
pub fn mean_f64(xs: &[Vec<f32>]) -> Vec<f64> {
    let mut m = vec![0.0f64; xs.first().map_or(0, Vec::len)];
    for x in xs {
        for (a, v) in m.iter_mut().zip(x) {
            *a += f64::from(*v);
        }
    }
    m.iter_mut().for_each(|a| *a /= xs.len() as f64);
    m
}
