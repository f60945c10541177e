//! The murmur peer: Burn training, the QUIC data plane, libp2p discovery, the launcher and
//! metrics: the workspace's I/O (sockets, clocks, files, processes, Burn) is here and in
//! the experiment drivers of `murmur-experiments`, which run this crate's binary. The
//! algorithms and the round they run live in `murmur-gossip`, the compressors in
//! `murmur-compress` and the graph maths in `murmur-topology`, none of which does I/O.
//!
//! The crate is arranged by wing:
//! - [`config`]: the command line and run configs, parsed and checked once;
//! - [`train`]: models, data, the local optimizer;
//! - [`control`]: discovery, admission, identities, membership (libp2p, the control plane);
//! - [`plane`]: the data plane that carries the parameters (QUIC, shared memory) and its
//!   identity-bound TLS;
//! - [`peer`]: one peer's run: a sans-I/O core (the algorithm of `murmur-gossip`, membership,
//!   goodbyes) and the shell that moves its frames over the planes;
//! - [`report`]: epoch rows, the collector on peer 0, summaries;
//! - [`launch`]: n peers on one machine, supervised;
//! - [`tools`]: the simulator and the benchmarks.
#![warn(missing_docs)]

pub mod config;
pub mod control;
pub mod launch;
pub mod peer;
pub mod plane;
pub mod report;
pub mod tools;
pub mod train;
