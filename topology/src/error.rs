//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong when building graphs, mixing matrices or topology files.
///
/// Messages name the violated rule together with the offending row/column/edge and value,
/// e.g. `row 3 sums to 0.97, expected 1 ± 1e-9`. Indices are 0-based peer ranks.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// A graph or matrix with zero peers was requested (`n == 0`).
    #[error("a topology needs at least 1 peer, got n = 0")]
    Empty,

    /// More peers than [`crate::MAX_NODES`] were requested.
    #[error("n = {n} peers exceeds the supported maximum of {max}")]
    TooManyNodes {
        /// The requested peer count.
        n: usize,
        /// The limit, [`crate::MAX_NODES`].
        max: usize,
    },

    /// Hypercube with a node count that is not a power of two.
    #[error("hypercube needs a power-of-two number of peers, got n = {n}")]
    NotPowerOfTwo {
        /// The requested peer count.
        n: usize,
    },

    /// Torus with a zero dimension, or dimensions that do not match the node count.
    #[error("invalid torus shape rows = {rows}, cols = {cols}: {reason}")]
    InvalidTorus {
        /// Requested row count.
        rows: usize,
        /// Requested column count.
        cols: usize,
        /// Which rule was broken.
        reason: String,
    },

    /// Erdős–Rényi edge probability outside `[0, 1]` (or NaN).
    #[error("erdos-renyi edge probability must lie in [0, 1], got p = {p}")]
    InvalidProbability {
        /// The offending probability.
        p: f64,
    },

    /// The sampled Erdős–Rényi graph is not connected.
    #[error("erdos-renyi graph G(n = {n}, p = {p}) with seed {seed} is not connected (peer {peer} unreachable from peer 0); raise p or pick another seed")]
    Disconnected {
        /// Peer count.
        n: usize,
        /// Edge probability.
        p: f64,
        /// RNG seed that produced the graph.
        seed: u64,
        /// A peer not reachable from peer 0.
        peer: usize,
    },

    /// An edge endpoint is `>= n`.
    #[error("edge {edge}: node index {value} is out of range for n = {n} (valid: 0..{n})")]
    EdgeOutOfRange {
        /// 0-based position of the edge in the edge list.
        edge: usize,
        /// The offending endpoint.
        value: usize,
        /// Peer count.
        n: usize,
    },

    /// An edge `(i, i)`; self weights come from the mixing rule, not from the edge list.
    #[error("edge {edge} is a self loop on node {node}; self loops are not allowed (self weights come from the mixing rule)")]
    SelfLoop {
        /// 0-based position of the edge in the edge list.
        edge: usize,
        /// The node.
        node: usize,
    },

    /// A rule that needs an undirected graph got a directed edge without its reverse.
    #[error("{rule} needs an undirected graph, but edge {from} -> {to} has no reverse edge {to} -> {from}")]
    NotSymmetric {
        /// The rule that needs symmetry (e.g. `metropolis-hastings weights`).
        rule: &'static str,
        /// Source of the unmatched edge.
        from: usize,
        /// Target of the unmatched edge.
        to: usize,
    },

    /// A dense matrix row whose length differs from the number of rows.
    #[error("matrix must be square: row {row} has {len} entries, expected {n}")]
    NotSquare {
        /// 0-based row index.
        row: usize,
        /// Its length.
        len: usize,
        /// Number of rows.
        n: usize,
    },

    /// A NaN or infinite matrix entry.
    #[error("entry W[{row}][{col}] = {value} is not finite")]
    NonFinite {
        /// Row index `i`.
        row: usize,
        /// Column index `j`.
        col: usize,
        /// The value.
        value: f64,
    },

    /// A negative matrix entry.
    #[error("entry W[{row}][{col}] = {value} is negative; mixing weights must be >= 0")]
    Negative {
        /// Row index `i`.
        row: usize,
        /// Column index `j`.
        col: usize,
        /// The value.
        value: f64,
    },

    /// A row of W that does not sum to 1 (W is not row stochastic).
    #[error("row {row} sums to {sum}, expected 1 ± {tol:e}")]
    RowSum {
        /// Row index `i`.
        row: usize,
        /// `Σ_j W_ij`.
        sum: f64,
        /// Tolerance used.
        tol: f64,
    },

    /// A column of W that does not sum to 1 (W is not column stochastic).
    #[error("column {col} sums to {sum}, expected 1 ± {tol:e}")]
    ColumnSum {
        /// Column index `j`.
        col: usize,
        /// `Σ_i W_ij`.
        sum: f64,
        /// Tolerance used.
        tol: f64,
    },

    /// The (support) graph is not (strongly) connected, so consensus cannot be reached.
    #[error("graph is not strongly connected: peer {peer} and peer 0 cannot reach each other")]
    NotConnected {
        /// A peer that is not mutually reachable with peer 0.
        peer: usize,
    },

    /// A topology-file syntax or type error; `message` is toml's text including line and column.
    #[error("invalid topology file: {message}")]
    Toml {
        /// toml's error message (contains `line N, column M`).
        message: String,
    },

    /// A well-formed topology file (or `NAME:key=value` options) whose keys do not make
    /// sense together.
    #[error("invalid topology: {message}")]
    Spec {
        /// What is wrong.
        message: String,
    },

    /// An unknown `topology = "..."` name.
    #[error("unknown topology {name:?}; valid names: {valid}")]
    UnknownTopology {
        /// The name given.
        name: String,
        /// Comma-separated list of valid names.
        valid: String,
    },

    /// An unknown `weights = "..."` rule.
    #[error("unknown weights {name:?}; valid rules: {valid}")]
    UnknownWeights {
        /// The rule given.
        name: String,
        /// Comma-separated list of valid rules.
        valid: String,
    },

    /// Neither the topology file nor the caller fixed the number of peers.
    #[error("no peer count: set `nodes` in the topology file or give the peer count (--peers; --nodes for `murmur topology inspect`)")]
    MissingNodeCount,

    /// The topology file fixes a peer count that differs from the caller's.
    #[error("topology file is for {file} peers but {requested} peers were requested")]
    NodeCountMismatch {
        /// Peer count fixed by the file.
        file: usize,
        /// Peer count requested by the caller.
        requested: usize,
    },

    /// A peer rank is not in 0..n.
    #[error("peer {rank} is out of range for n = {n} peers (valid: 0..{n})")]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// Number of peers.
        n: usize,
    },
}
