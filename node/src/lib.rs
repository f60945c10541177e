//! The murmur peer: Burn training, the QUIC data plane, libp2p discovery, the launcher and
//! metrics. This is the only crate of the workspace that does I/O; the algorithms live in
//! `murmur-gossip`, the compressors in `murmur-compress` and the graph maths in
//! `murmur-topology`.
#![warn(missing_docs)]

pub mod algo;
pub mod auth;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod discovery;
pub mod launch;
pub mod metrics;
pub mod model;
pub mod net;
pub mod netbench;
pub mod pause;
pub mod peer;
pub mod simulate;
