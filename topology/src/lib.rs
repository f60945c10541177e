//! Communication topologies for murmur: peer graphs, doubly stochastic mixing matrices W,
//! their spectral gap, and topology files.
//!
//! Pure maths, no I/O: topology files are parsed from `&str`.
//!
//! * [`Graph`] — directed graphs on `n` peers: ring, torus, complete, star, hypercube, the
//!   static exponential graph (Assran et al. 2019, *Stochastic Gradient Push for Distributed
//!   Deep Learning*; Ying et al. 2021, *Exponential Graph is Provably Efficient for
//!   Decentralized Deep Training*), Erdős–Rényi, explicit edge lists.
//! * [`MixingMatrix`] — W (n×n) with the convention `x_i ← Σ_j W_ij x_j`; Metropolis–Hastings
//!   weights (Xiao & Boyd 2004, *Fast linear iterations for distributed averaging*; Boyd et
//!   al. 2006, *Randomized gossip algorithms*) and max-degree weights; validation; `|λ₂|` and
//!   the spectral gap `1 - |λ₂|`, which governs the convergence of decentralised SGD
//!   (Lian et al. 2017, D-PSGD; Koloskova et al. 2019).
//! * [`TopologySpec`] — topology files (TOML) in three forms (named, edges, dense), built into
//!   a validated [`Topology`] and summarised by [`InspectReport`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod graph;
mod mixing;
mod schedule;
mod spec;

pub use error::TopologyError;
pub use graph::{Graph, Rank};
pub use mixing::{Checks, MixingMatrix, Surviving};
pub use schedule::PushSchedule;
pub use spec::{
    GraphFormat, InspectReport, NamedKind, SpecSource, Topology, TopologySpec, WeightRule,
    ONE_PEER_EXPONENTIAL,
};

/// Default absolute tolerance for row/column sums and symmetry checks.
pub const DEFAULT_TOLERANCE: f64 = 1e-9;

/// Largest supported peer count (dense W is n×n and eigenvalues cost O(n³)).
pub const MAX_NODES: usize = 4096;
