//! Time-varying directed communication schedules for push-sum and Stochastic Gradient Push.
//!
//! See [`PushSchedule`].

use nalgebra::DMatrix;

use crate::{Graph, Rank, TopologyError, MAX_NODES};

/// A time-varying directed communication schedule with column-stochastic push weights.
///
/// Push-sum (Kempe, Dobra & Gehrke 2003, *Gossip-based computation of aggregate
/// information*) and SGP (Assran, Loizou, Ballas & Rabbat 2019, *Stochastic Gradient Push
/// for Distributed Deep Learning*) only need, in every round t, a **column-stochastic**
/// n×n matrix P(t): peer i keeps the share `p_ii(t)` of its numerator and push-sum weight and
/// pushes the share `p_ji(t)` to each of its out-peers j of that round. Columns sum to 1, so
/// the network's total mass is conserved; rows need not, so the graph may be directed and
/// unbalanced (no doubly stochastic W is needed).
///
/// A [`PushSchedule`] gives, for round t and peer i, the out-peers (whom i pushes to) and
/// in-peers (who push to i) of that round, the push weight, and the union of all rounds'
/// peers (the links a driver opens before the first round). Weights are uniform over the
/// sender and its out-peers: `p_ji(t) = p_ii(t) = 1 / (|out_t(i)| + 1)`.
///
/// * [`PushSchedule::Static`]: the same directed [`Graph`] every round.
/// * [`PushSchedule::OnePeerExponential`]: the time-varying one-peer exponential graph of
///   Assran et al. 2019 (the time-varying directed exponential graph of its experiments):
///   with `m = ⌈log2 n⌉`, peer i sends only to `(i + 2^(t mod m)) mod n` in round t and receives
///   only from `(i − 2^(t mod m)) mod n`, with weights ½/½. For `n = 2^m` the product of m
///   consecutive matrices is exactly the averaging matrix `(1/n)·11ᵀ`, so push-sum reaches
///   the exact average after m rounds. For other n (`2^(m−1) < n < 2^m`) every offset
///   `2^k`, `k < m`, is still in `1..n`, so each round's matrix is ½(I + a permutation) and the
///   schedule stays strongly connected over any m consecutive rounds; the average is then
///   reached geometrically rather than exactly. `n = 1` has no peers.
///
/// Rounds `t` are 0-based `u64`. Edge `i -> j` in round t means peer i pushes a share to
/// peer j in that round. Methods taking a peer `i` panic if `i >= n` (a caller bug, like
/// [`Graph::out_neighbors`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushSchedule {
    /// The same directed graph every round (period 1). Push-sum reaches the average only if
    /// the graph is strongly connected; [`PushSchedule::fixed`] checks that.
    Static(Graph),
    /// The one-peer exponential graph on `n` peers: in round t peer i pushes to
    /// `(i + 2^(t mod ⌈log2 n⌉)) mod n` (period `⌈log2 n⌉`). Build it with
    /// [`PushSchedule::one_peer_exponential`], which checks `1 <= n <= MAX_NODES`.
    OnePeerExponential {
        /// Number of peers n.
        n: usize,
    },
}

/// `⌈log2 n⌉` for `n >= 1`, 0 for `n <= 1`.
fn ceil_log2(n: usize) -> u32 {
    if n <= 1 {
        0
    } else {
        (n - 1).ilog2() + 1
    }
}

impl PushSchedule {
    /// The one-peer exponential schedule on `n` peers (Assran et al. 2019).
    ///
    /// Errors: [`TopologyError::Empty`] for `n == 0`, [`TopologyError::TooManyNodes`].
    pub fn one_peer_exponential(n: usize) -> Result<Self, TopologyError> {
        if n == 0 {
            return Err(TopologyError::Empty);
        }
        if n > MAX_NODES {
            return Err(TopologyError::TooManyNodes { n, max: MAX_NODES });
        }
        Ok(PushSchedule::OnePeerExponential { n })
    }

    /// The static schedule on `graph`, which must be strongly connected (otherwise some
    /// peers never hear of others and push-sum cannot reach the average).
    ///
    /// Errors: [`TopologyError::NotConnected`] naming a peer not mutually reachable with 0.
    pub fn fixed(graph: Graph) -> Result<Self, TopologyError> {
        match graph.first_unconnected() {
            None => Ok(PushSchedule::Static(graph)),
            Some(peer) => Err(TopologyError::NotConnected { peer }),
        }
    }

    /// Number of peers n.
    pub fn n(&self) -> usize {
        match self {
            PushSchedule::Static(g) => g.n(),
            PushSchedule::OnePeerExponential { n } => *n,
        }
    }

    /// Number of rounds after which the schedule repeats: 1 for a static graph, `⌈log2 n⌉`
    /// for the one-peer exponential graph (1 when `n == 1`).
    pub fn period(&self) -> u64 {
        match self {
            PushSchedule::Static(_) => 1,
            PushSchedule::OnePeerExponential { n } => u64::from(ceil_log2(*n).max(1)),
        }
    }

    /// The one-peer offset `2^(t mod ⌈log2 n⌉)` of round t, `None` when `n <= 1`.
    fn offset(n: usize, round: u64) -> Option<usize> {
        let m = ceil_log2(n);
        (m > 0).then(|| 1usize << (round % u64::from(m)))
    }

    /// Peers that i pushes to in round `round`, ascending, without i.
    ///
    /// # Panics
    /// If `i >= n`.
    pub fn out_peers(&self, round: u64, i: Rank) -> Vec<Rank> {
        match self {
            PushSchedule::Static(g) => g.out_neighbors(i).to_vec(),
            PushSchedule::OnePeerExponential { n } => {
                assert!(i < *n, "peer {i} out of range for n = {n}");
                Self::offset(*n, round)
                    .map(|o| vec![(i + o) % n])
                    .unwrap_or_default()
            }
        }
    }

    /// Peers that push to i in round `round`, ascending, without i.
    ///
    /// # Panics
    /// If `i >= n`.
    pub fn in_peers(&self, round: u64, i: Rank) -> Vec<Rank> {
        match self {
            PushSchedule::Static(g) => g.in_neighbors(i).to_vec(),
            PushSchedule::OnePeerExponential { n } => {
                assert!(i < *n, "peer {i} out of range for n = {n}");
                Self::offset(*n, round)
                    .map(|o| vec![(i + n - o) % n])
                    .unwrap_or_default()
            }
        }
    }

    /// Whether `from` pushes to `to` in round `round`. `false` for out-of-range peers and
    /// for `from == to`.
    pub fn has_edge(&self, round: u64, from: Rank, to: Rank) -> bool {
        match self {
            PushSchedule::Static(g) => g.has_edge(from, to),
            PushSchedule::OnePeerExponential { n } => {
                from < *n
                    && to < *n
                    && Self::offset(*n, round).is_some_and(|o| (from + o) % n == to)
            }
        }
    }

    /// The push weight of peer i in round `round`: `1 / (|out_t(i)| + 1)`, both the share
    /// `p_ii` that i keeps and the share `p_ji` it pushes to each out-peer j (½ on the
    /// one-peer schedule, 1 for a peer without out-peers).
    ///
    /// # Panics
    /// If `i >= n`.
    pub fn push_weight(&self, round: u64, i: Rank) -> f64 {
        let out = match self {
            PushSchedule::Static(g) => g.out_degree(i),
            PushSchedule::OnePeerExponential { .. } => self.out_peers(round, i).len(),
        };
        1.0 / (out as f64 + 1.0)
    }

    /// Every peer i pushes to in some round, ascending, without i: the links a driver opens.
    /// For the one-peer schedule this is the out-neighbourhood of [`Graph::exponential`].
    ///
    /// # Panics
    /// If `i >= n`.
    pub fn all_out_peers(&self, i: Rank) -> Vec<Rank> {
        self.union_over_period(|t| self.out_peers(t, i))
    }

    /// Every peer that pushes to i in some round, ascending, without i.
    ///
    /// # Panics
    /// If `i >= n`.
    pub fn all_in_peers(&self, i: Rank) -> Vec<Rank> {
        self.union_over_period(|t| self.in_peers(t, i))
    }

    fn union_over_period(&self, peers: impl Fn(u64) -> Vec<Rank>) -> Vec<Rank> {
        let mut all: Vec<Rank> = (0..self.period()).flat_map(peers).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The push matrix P(t): n×n with `P[(j, i)] = p_ji(t)` (the share of peer i's mass
    /// that ends at peer j), so one push-sum step is `x ← P(t)·x` on the stacked numerators
    /// and `w ← P(t)·w` on the weights. Column stochastic by construction; O(n²) memory, for
    /// analysis and tests.
    pub fn matrix(&self, round: u64) -> DMatrix<f64> {
        let n = self.n();
        let mut p = DMatrix::zeros(n, n);
        for i in 0..n {
            let share = self.push_weight(round, i);
            p[(i, i)] = share;
            for j in self.out_peers(round, i) {
                p[(j, i)] = share;
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peer_exponential_on_16_cycles_through_offsets_1_2_4_8() {
        let s = PushSchedule::one_peer_exponential(16).unwrap();
        assert_eq!(s.period(), 4);
        for (t, o) in [(0, 1), (1, 2), (2, 4), (3, 8), (4, 1), (7, 8)] {
            assert_eq!(s.out_peers(t, 3), vec![3 + o], "round {t}");
            assert_eq!(s.in_peers(t, 3), vec![(3 + 16 - o) % 16], "round {t}");
            assert!(s.has_edge(t, 3, 3 + o));
            assert_eq!(s.push_weight(t, 3), 0.5);
        }
        assert_eq!(s.out_peers(3, 15), vec![7]);
        assert_eq!(s.all_out_peers(0), vec![1, 2, 4, 8]);
        assert_eq!(s.all_in_peers(0), vec![8, 12, 14, 15]);
        // The union over a period is the static exponential graph.
        let g = Graph::exponential(16).unwrap();
        for i in 0..16 {
            assert_eq!(s.all_out_peers(i), g.out_neighbors(i));
            assert_eq!(s.all_in_peers(i), g.in_neighbors(i));
        }
    }

    #[test]
    fn one_peer_exponential_product_over_a_period_is_exact_averaging_for_powers_of_two() {
        for n in [2usize, 4, 8, 16, 32] {
            let s = PushSchedule::one_peer_exponential(n).unwrap();
            let mut prod = DMatrix::<f64>::identity(n, n);
            for t in 0..s.period() {
                prod = s.matrix(t) * prod;
            }
            for v in prod.iter() {
                assert!((v - 1.0 / n as f64).abs() < 1e-12, "n = {n}: entry {v}");
            }
            // One round short of the period is not averaging yet.
            if n > 2 {
                let mut short = DMatrix::<f64>::identity(n, n);
                for t in 0..s.period() - 1 {
                    short = s.matrix(t) * short;
                }
                assert!(short.iter().any(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn one_peer_exponential_for_n_12_has_period_4_and_distinct_offsets() {
        let s = PushSchedule::one_peer_exponential(12).unwrap();
        assert_eq!(s.period(), 4);
        assert_eq!(s.out_peers(3, 5), vec![1]); // 5 + 8 = 13 ≡ 1
        assert_eq!(s.in_peers(3, 1), vec![5]);
        assert_eq!(s.all_out_peers(0), vec![1, 2, 4, 8]);
        // Every round is ½(I + a permutation): rows and columns sum to 1.
        for t in 0..4 {
            let p = s.matrix(t);
            for k in 0..12 {
                assert!((p.column(k).sum() - 1.0).abs() < 1e-15);
                assert!((p.row(k).sum() - 1.0).abs() < 1e-15);
            }
        }
        // Strongly connected over one period (the subset sums of {1, 2, 4, 8} cover every
        // residue mod 12): the product is entrywise positive, but not exact averaging.
        let mut prod = DMatrix::<f64>::identity(12, 12);
        for t in 0..4 {
            prod = s.matrix(t) * prod;
        }
        assert!(prod.iter().all(|&v| v > 0.0));
        assert!(prod.iter().any(|&v| (v - 1.0 / 12.0).abs() > 1e-3));
    }

    #[test]
    fn tiny_schedules() {
        let s = PushSchedule::one_peer_exponential(1).unwrap();
        assert_eq!(s.period(), 1);
        assert!(s.out_peers(0, 0).is_empty() && s.in_peers(5, 0).is_empty());
        assert_eq!(s.push_weight(0, 0), 1.0);
        assert_eq!(s.matrix(0)[(0, 0)], 1.0);
        let s = PushSchedule::one_peer_exponential(2).unwrap();
        assert_eq!(s.period(), 1);
        assert_eq!(s.out_peers(9, 1), vec![0]);
        assert_eq!(
            PushSchedule::one_peer_exponential(0),
            Err(TopologyError::Empty)
        );
        assert!(matches!(
            PushSchedule::one_peer_exponential(MAX_NODES + 1),
            Err(TopologyError::TooManyNodes { .. })
        ));
        assert!(!s.has_edge(0, 0, 7) && !s.has_edge(0, 5, 0));
    }

    #[test]
    fn static_schedule_is_column_stochastic_but_not_row_stochastic_when_unbalanced() {
        // Directed ring 0→1→2→3→0 plus a chord 0→2: peer 0 pushes a third to 1 and 2.
        let g = Graph::from_edges(4, &[(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)], true).unwrap();
        let s = PushSchedule::fixed(g).unwrap();
        assert_eq!(s.period(), 1);
        assert_eq!(s.out_peers(7, 0), vec![1, 2]);
        assert_eq!(s.in_peers(7, 2), vec![0, 1]);
        assert_eq!(s.push_weight(0, 0), 1.0 / 3.0);
        assert_eq!(s.push_weight(0, 1), 0.5);
        let p = s.matrix(0);
        assert_eq!(p[(2, 0)], 1.0 / 3.0);
        assert_eq!(p[(0, 3)], 0.5);
        for k in 0..4 {
            assert!((p.column(k).sum() - 1.0).abs() < 1e-15, "column {k}");
        }
        // Row 2 receives ⅓ from 0, ½ from 1 and keeps ½: 4/3.
        assert!((p.row(2).sum() - 4.0 / 3.0).abs() < 1e-15);
        assert_eq!(s.all_out_peers(0), vec![1, 2]);
        assert_eq!(s.all_in_peers(0), vec![3]);
    }

    #[test]
    fn fixed_refuses_a_graph_that_is_not_strongly_connected() {
        let g = Graph::from_edges(3, &[(0, 1), (1, 2)], true).unwrap();
        assert_eq!(
            PushSchedule::fixed(g),
            Err(TopologyError::NotConnected { peer: 1 })
        );
    }
}
