//! Communication graphs between peers.
//!
//! A [`Graph`] is a directed graph on `n` peers without self loops, stored as sorted,
//! de-duplicated out- and in-adjacency lists. Undirected generators insert both directions,
//! so an undirected edge `{i, j}` counts as two directed edges.
//!
//! The static exponential graph follows Assran et al. 2019, *Stochastic Gradient Push for
//! Distributed Deep Learning* (SGP), and Ying et al. 2021, *Exponential Graph is Provably
//! Efficient for Decentralized Deep Training*: peer `i` sends to `(i + 2^k) mod n` for
//! `k = 0..=floor(log2(n-1))`.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::{TopologyError, MAX_NODES};

/// A peer's index, `0..n`.
pub type Rank = usize;

/// Directed graph on `n` peers, no self loops; undirected generators insert both directions.
///
/// Edge `i -> j` means peer `i` sends to peer `j`. Adjacency lists are sorted and free of
/// duplicates. All constructors reject `n == 0` ([`TopologyError::Empty`]) and
/// `n > MAX_NODES` ([`TopologyError::TooManyNodes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    out_adj: Vec<Vec<Rank>>,
    in_adj: Vec<Vec<Rank>>,
}

fn check_n(n: usize) -> Result<(), TopologyError> {
    if n == 0 {
        Err(TopologyError::Empty)
    } else if n > MAX_NODES {
        Err(TopologyError::TooManyNodes { n, max: MAX_NODES })
    } else {
        Ok(())
    }
}

impl Graph {
    /// Builds a graph from directed edges that are known to be in range and loop-free.
    pub(crate) fn from_directed_unchecked(
        n: usize,
        edges: impl IntoIterator<Item = (Rank, Rank)>,
    ) -> Graph {
        let mut out_adj = vec![Vec::new(); n];
        let mut in_adj = vec![Vec::new(); n];
        for (a, b) in edges {
            debug_assert!(a < n && b < n && a != b);
            out_adj[a].push(b);
            in_adj[b].push(a);
        }
        for list in out_adj.iter_mut().chain(in_adj.iter_mut()) {
            list.sort_unstable();
            list.dedup();
        }
        Graph { out_adj, in_adj }
    }

    /// Builds an undirected graph (both directions) from edges known to be valid.
    pub(crate) fn undirected_unchecked(
        n: usize,
        edges: impl IntoIterator<Item = (Rank, Rank)>,
    ) -> Graph {
        Graph::from_directed_unchecked(n, edges.into_iter().flat_map(|(a, b)| [(a, b), (b, a)]))
    }

    /// Undirected ring (cycle) `i — (i+1) mod n`.
    ///
    /// `n == 1` has no edges, `n == 2` a single undirected edge; otherwise every degree is 2.
    /// Errors: [`TopologyError::Empty`], [`TopologyError::TooManyNodes`].
    pub fn ring(n: usize) -> Result<Graph, TopologyError> {
        check_n(n)?;
        Ok(Graph::undirected_unchecked(
            n,
            (0..n).map(|i| (i, (i + 1) % n)).filter(|(a, b)| a != b),
        ))
    }

    /// Undirected 2-D torus: a `rows × cols` grid with wraparound, peer `r * cols + c`.
    ///
    /// Each peer connects to its up/down/left/right neighbours; duplicate edges (when
    /// `rows == 2` or `cols == 2`) are merged and self loops (when a dimension is 1) dropped,
    /// so degrees are 4 only when `rows, cols >= 3`. `torus(1, n)` is `ring(n)`.
    /// Errors: [`TopologyError::InvalidTorus`] for a zero dimension,
    /// [`TopologyError::TooManyNodes`].
    pub fn torus(rows: usize, cols: usize) -> Result<Graph, TopologyError> {
        if rows == 0 || cols == 0 {
            return Err(TopologyError::InvalidTorus {
                rows,
                cols,
                reason: "both dimensions must be >= 1".into(),
            });
        }
        let n = rows.checked_mul(cols).ok_or(TopologyError::TooManyNodes {
            n: usize::MAX,
            max: MAX_NODES,
        })?;
        check_n(n)?;
        let idx = |r: usize, c: usize| r * cols + c;
        let mut edges = Vec::with_capacity(2 * n);
        for r in 0..rows {
            for c in 0..cols {
                edges.push((idx(r, c), idx((r + 1) % rows, c)));
                edges.push((idx(r, c), idx(r, (c + 1) % cols)));
            }
        }
        Ok(Graph::undirected_unchecked(
            n,
            edges.into_iter().filter(|(a, b)| a != b),
        ))
    }

    /// Complete graph: every peer connected to every other (degree `n - 1`).
    ///
    /// Errors: [`TopologyError::Empty`], [`TopologyError::TooManyNodes`].
    pub fn complete(n: usize) -> Result<Graph, TopologyError> {
        check_n(n)?;
        Ok(Graph::from_directed_unchecked(
            n,
            (0..n).flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j))),
        ))
    }

    /// Undirected star with hub 0: hub degree `n - 1`, leaf degree 1.
    ///
    /// Errors: [`TopologyError::Empty`], [`TopologyError::TooManyNodes`].
    pub fn star(n: usize) -> Result<Graph, TopologyError> {
        check_n(n)?;
        Ok(Graph::undirected_unchecked(n, (1..n).map(|i| (0, i))))
    }

    /// Undirected hypercube on `n = 2^d` peers: `i — i XOR 2^b` for `b < d` (degree `d`).
    ///
    /// Errors: [`TopologyError::NotPowerOfTwo`] naming `n`, [`TopologyError::Empty`],
    /// [`TopologyError::TooManyNodes`].
    pub fn hypercube(n: usize) -> Result<Graph, TopologyError> {
        check_n(n)?;
        if !n.is_power_of_two() {
            return Err(TopologyError::NotPowerOfTwo { n });
        }
        let d = n.trailing_zeros();
        Ok(Graph::from_directed_unchecked(
            n,
            (0..n).flat_map(|i| (0..d).map(move |b| (i, i ^ (1 << b)))),
        ))
    }

    /// Static exponential graph (DIRECTED): `i -> (i + 2^k) mod n` for
    /// `k = 0..=floor(log2(n-1))`, duplicates removed (Assran et al. 2019; Ying et al. 2021).
    ///
    /// Every peer has out-degree = in-degree = `floor(log2(n-1)) + 1` (for `n >= 2`; `n == 1`
    /// has no edges). It is not symmetric for `n > 2`; use max-degree weights, which are
    /// doubly stochastic because the graph is balanced.
    /// Errors: [`TopologyError::Empty`], [`TopologyError::TooManyNodes`].
    pub fn exponential(n: usize) -> Result<Graph, TopologyError> {
        check_n(n)?;
        let mut offsets = Vec::new();
        if n >= 2 {
            let kmax = (n - 1).ilog2();
            offsets.extend((0..=kmax).map(|k| 1usize << k));
        }
        Ok(Graph::from_directed_unchecked(
            n,
            (0..n)
                .flat_map(|i| offsets.iter().map(move |&o| (i, (i + o) % n)))
                .filter(|(a, b)| a != b),
        ))
    }

    /// Undirected Erdős–Rényi graph `G(n, p)`: each pair `i < j` (in lexicographic order) is
    /// joined with probability `p`, drawn from `StdRng::seed_from_u64(seed)`; deterministic
    /// per `(n, p, seed)` for a given `rand` version.
    ///
    /// Errors: [`TopologyError::InvalidProbability`] unless `0 <= p <= 1`;
    /// [`TopologyError::Disconnected`] naming the seed if the sample is not connected;
    /// [`TopologyError::Empty`], [`TopologyError::TooManyNodes`].
    pub fn erdos_renyi(n: usize, p: f64, seed: u64) -> Result<Graph, TopologyError> {
        check_n(n)?;
        if !(0.0..=1.0).contains(&p) {
            return Err(TopologyError::InvalidProbability { p });
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut edges = Vec::new();
        for i in 0..n {
            for j in (i + 1)..n {
                if rng.random_bool(p) {
                    edges.push((i, j));
                }
            }
        }
        let g = Graph::undirected_unchecked(n, edges);
        match g.first_unconnected() {
            None => Ok(g),
            Some(peer) => Err(TopologyError::Disconnected { n, p, seed, peer }),
        }
    }

    /// Graph from an explicit edge list. With `directed == false` every `(a, b)` inserts
    /// `a -> b` and `b -> a`; with `directed == true` only `a -> b` (a sends to b).
    /// Duplicate edges are merged.
    ///
    /// Errors: [`TopologyError::Empty`] for `n == 0`, [`TopologyError::TooManyNodes`],
    /// [`TopologyError::EdgeOutOfRange`] naming the 0-based edge number and the bad index,
    /// [`TopologyError::SelfLoop`] naming the edge number and node.
    pub fn from_edges(
        n: usize,
        edges: &[(usize, usize)],
        directed: bool,
    ) -> Result<Graph, TopologyError> {
        check_n(n)?;
        for (e, &(a, b)) in edges.iter().enumerate() {
            for v in [a, b] {
                if v >= n {
                    return Err(TopologyError::EdgeOutOfRange {
                        edge: e,
                        value: v,
                        n,
                    });
                }
            }
            if a == b {
                return Err(TopologyError::SelfLoop { edge: e, node: a });
            }
        }
        Ok(if directed {
            Graph::from_directed_unchecked(n, edges.iter().copied())
        } else {
            Graph::undirected_unchecked(n, edges.iter().copied())
        })
    }

    /// Number of peers `n`.
    pub fn n(&self) -> usize {
        self.out_adj.len()
    }

    /// Peers that `i` sends to (targets of edges `i -> j`), sorted. Panics if `i >= n`.
    pub fn out_neighbors(&self, i: Rank) -> &[Rank] {
        &self.out_adj[i]
    }

    /// Peers that `i` receives from (sources of edges `j -> i`), sorted. Panics if `i >= n`.
    pub fn in_neighbors(&self, i: Rank) -> &[Rank] {
        &self.in_adj[i]
    }

    /// Peers `i` sends to or receives from (either end of an edge with `i`), sorted, each
    /// once. Panics if `i >= n`.
    pub fn neighbors(&self, i: Rank) -> Vec<Rank> {
        let mut ns = [self.in_neighbors(i), self.out_neighbors(i)].concat();
        ns.sort_unstable();
        ns.dedup();
        ns
    }

    /// Out-degree of peer `i`. Panics if `i >= n`.
    pub fn out_degree(&self, i: Rank) -> usize {
        self.out_adj[i].len()
    }

    /// In-degree of peer `i`. Panics if `i >= n`.
    pub fn in_degree(&self, i: Rank) -> usize {
        self.in_adj[i].len()
    }

    /// Number of directed edges (an undirected edge counts twice).
    pub fn edge_count(&self) -> usize {
        self.out_adj.iter().map(Vec::len).sum()
    }

    /// `true` if there is a directed edge `i -> j`. Returns `false` for out-of-range indices.
    pub fn has_edge(&self, i: Rank, j: Rank) -> bool {
        self.out_adj
            .get(i)
            .is_some_and(|l| l.binary_search(&j).is_ok())
    }

    /// `true` if every edge `i -> j` has its reverse `j -> i` (the graph is undirected).
    pub fn is_symmetric(&self) -> bool {
        self.first_asymmetric_edge().is_none()
    }

    /// First edge `i -> j` (in `(i, j)` order) without a reverse, if any.
    pub(crate) fn first_asymmetric_edge(&self) -> Option<(Rank, Rank)> {
        (0..self.n()).find_map(|i| {
            self.out_adj[i]
                .iter()
                .find(|&&j| !self.has_edge(j, i))
                .map(|&j| (i, j))
        })
    }

    /// `true` if the graph is strongly connected (for undirected graphs: connected).
    /// A single peer is connected.
    pub fn is_connected(&self) -> bool {
        self.first_unconnected().is_none()
    }

    /// Whether the graph without the peers in `gone` (and their edges) is strongly connected
    /// (for undirected graphs: connected): push-sum survivors still reach one value.
    /// `true` when at most one peer is left; ranks ≥ n in `gone` are ignored.
    pub fn strongly_connected_without(&self, gone: &[Rank]) -> bool {
        let n = self.n();
        let alive: Vec<bool> = (0..n).map(|i| !gone.contains(&i)).collect();
        let Some(start) = alive.iter().position(|&a| a) else {
            return true;
        };
        let keep = |adj: &[Vec<Rank>]| -> Vec<Vec<Rank>> {
            adj.iter()
                .enumerate()
                .map(|(i, out)| {
                    if alive[i] {
                        out.iter().copied().filter(|&j| alive[j]).collect()
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        };
        let (fwd, bwd) = (
            reach_from(&keep(&self.out_adj), start),
            reach_from(&keep(&self.in_adj), start),
        );
        (0..n).all(|i| !alive[i] || fwd[i] && bwd[i])
    }

    /// Smallest peer that is not mutually reachable with peer 0, if any.
    pub(crate) fn first_unconnected(&self) -> Option<Rank> {
        let fwd = reach(&self.out_adj);
        let bwd = reach(&self.in_adj);
        (0..self.n()).find(|&i| !(fwd[i] && bwd[i]))
    }
}

/// Peers reachable from peer 0 following `adj`.
fn reach(adj: &[Vec<Rank>]) -> Vec<bool> {
    reach_from(adj, 0)
}

/// Peers reachable from `start` following `adj` (none for an empty graph).
fn reach_from(adj: &[Vec<Rank>], start: Rank) -> Vec<bool> {
    let mut seen = vec![false; adj.len()];
    if adj.is_empty() {
        return seen;
    }
    let mut stack = vec![start];
    seen[start] = true;
    while let Some(v) = stack.pop() {
        for &w in &adj[v] {
            if !seen[w] {
                seen[w] = true;
                stack.push(w);
            }
        }
    }
    seen
}
