//! Mixing matrices W and their spectral properties.
//!
//! Convention: one gossip step is `x_i ← Σ_j W_ij x_j`, so `W_ij ≠ 0` for `i ≠ j` means peer
//! `j` sends to peer `i`. Decentralised SGD needs W doubly stochastic (rows and columns sum to
//! 1, so the average is preserved) with a (strongly) connected support graph.
//!
//! Weight rules:
//! * Metropolis–Hastings weights `W_ij = 1/(1 + max(d_i, d_j))` on undirected graphs
//!   (Xiao & Boyd 2004, *Fast linear iterations for distributed averaging*; Boyd, Ghosh,
//!   Prabhakar & Shah 2006, *Randomized gossip algorithms*): symmetric, doubly stochastic
//!   and positive on the diagonal, using only local degree information.
//! * Max-degree ("uniform") weights `W_ij = 1/(d_max + 1)` (Xiao & Boyd 2004), which are
//!   doubly stochastic on balanced directed graphs such as the static exponential graph
//!   (Assran et al. 2019, SGP; Ying et al. 2021).
//!
//! The spectral gap `1 - |λ₂(W)|` controls how fast gossip averages and enters the
//! convergence rates of D-PSGD (Lian et al. 2017, *Can decentralized algorithms outperform
//! centralized algorithms?*) and of decentralised SGD with compressed communication
//! (Koloskova, Stich & Jaggi 2019, *Decentralized stochastic optimization and gossip
//! algorithms with compressed communication*).

use nalgebra::linalg::{Schur, SymmetricEigen};
use nalgebra::DMatrix;

use crate::{Graph, Rank, TopologyError, DEFAULT_TOLERANCE, MAX_NODES};

/// W: n×n, f64. Convention: x_i ← Σ_j W_ij x_j, so W_ij ≠ 0 (i≠j) means j sends to i.
///
/// Every `MixingMatrix` is square, `n >= 1`, with finite non-negative entries. Stochasticity
/// is *not* guaranteed by construction via [`MixingMatrix::from_dense`]; check it with
/// [`MixingMatrix::validate_doubly_stochastic`] or [`MixingMatrix::checks`].
#[derive(Debug, Clone, PartialEq)]
pub struct MixingMatrix {
    w: DMatrix<f64>,
}

/// The mixing matrix of the peers that remain after some have left the run
/// (see [`MixingMatrix::without_peers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Surviving {
    /// W': n×n. Metropolis–Hastings weights on the surviving graph; a departed peer's row
    /// and column are those of the identity (it keeps its value and nobody mixes it).
    pub w: MixingMatrix,
    /// Connected components of the surviving graph, each sorted, ordered by their smallest
    /// rank; departed peers are in none. One component: the survivors still reach consensus.
    pub components: Vec<Vec<Rank>>,
}

impl Surviving {
    /// Whether the survivors still form one connected graph.
    pub fn is_connected(&self) -> bool {
        self.components.len() <= 1
    }
}

/// Results of the structural checks on W (see [`MixingMatrix::checks`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Checks {
    /// Every row sums to 1 within the tolerance.
    pub row_stochastic: bool,
    /// Every column sums to 1 within the tolerance.
    pub column_stochastic: bool,
    /// Both row and column stochastic.
    pub doubly_stochastic: bool,
    /// `|W_ij - W_ji| <= tol` for all `i, j`.
    pub symmetric: bool,
    /// No entry below `-tol`.
    pub nonnegative: bool,
    /// The support graph (edge `j -> i` when `W_ij ≠ 0`) is strongly connected.
    pub connected: bool,
}

impl MixingMatrix {
    /// Metropolis–Hastings weights (Xiao & Boyd 2004): for an undirected graph with degrees
    /// `d_i`, `W_ij = 1/(1 + max(d_i, d_j))` on edges, `W_ii = 1 - Σ_{j≠i} W_ij`, 0 elsewhere.
    ///
    /// The result is symmetric and doubly stochastic with `W_ii >= 1/(1 + d_i) > 0`.
    /// Errors: [`TopologyError::NotSymmetric`] naming an edge without its reverse.
    pub fn metropolis_hastings(g: &Graph) -> Result<MixingMatrix, TopologyError> {
        if let Some((from, to)) = g.first_asymmetric_edge() {
            return Err(TopologyError::NotSymmetric {
                rule: "metropolis-hastings weights",
                from,
                to,
            });
        }
        let n = g.n();
        let mut w = DMatrix::<f64>::zeros(n, n);
        for i in 0..n {
            let di = g.out_degree(i);
            let mut off = 0.0;
            for &j in g.in_neighbors(i) {
                let wij = 1.0 / (1.0 + di.max(g.out_degree(j)) as f64);
                w[(i, j)] = wij;
                off += wij;
            }
            w[(i, i)] = 1.0 - off;
        }
        Ok(MixingMatrix { w })
    }

    /// Max-degree ("uniform") weights: with `d_max` the largest in- or out-degree,
    /// `W_ij = 1/(d_max + 1)` for `j` in `g.in_neighbors(i)` and
    /// `W_ii = 1 - in_deg_i/(d_max + 1)`.
    ///
    /// Rows always sum to 1 and all entries are non-negative; columns sum to 1 exactly when
    /// every peer's in-degree equals its out-degree (undirected graphs, the exponential
    /// graph), in which case W is doubly stochastic. A graph without edges gives `W = I`.
    /// Never fails for a valid [`Graph`]; the `Result` is kept for API symmetry.
    pub fn max_degree(g: &Graph) -> Result<MixingMatrix, TopologyError> {
        let n = g.n();
        let d_max = (0..n)
            .map(|i| g.in_degree(i).max(g.out_degree(i)))
            .max()
            .unwrap_or(0);
        let weight = 1.0 / (d_max as f64 + 1.0);
        let mut w = DMatrix::<f64>::zeros(n, n);
        for i in 0..n {
            for &j in g.in_neighbors(i) {
                w[(i, j)] = weight;
            }
            w[(i, i)] = 1.0 - g.in_degree(i) as f64 * weight;
        }
        Ok(MixingMatrix { w })
    }

    /// W from dense rows: `rows[i][j] = W_ij`, n×n.
    ///
    /// Checks shape and entries only — NOT stochasticity or connectivity.
    /// Errors: [`TopologyError::Empty`] (no rows), [`TopologyError::TooManyNodes`],
    /// [`TopologyError::NotSquare`] naming the row and its length,
    /// [`TopologyError::NonFinite`] / [`TopologyError::Negative`] naming row, column, value.
    pub fn from_dense(rows: Vec<Vec<f64>>) -> Result<MixingMatrix, TopologyError> {
        let n = rows.len();
        if n == 0 {
            return Err(TopologyError::Empty);
        }
        if n > MAX_NODES {
            return Err(TopologyError::TooManyNodes { n, max: MAX_NODES });
        }
        if let Some((row, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != n) {
            return Err(TopologyError::NotSquare {
                row,
                len: r.len(),
                n,
            });
        }
        Self::from_matrix(DMatrix::from_fn(n, n, |i, j| rows[i][j]))
    }

    /// W from an n×n nalgebra matrix, with the same checks as [`MixingMatrix::from_dense`].
    pub fn from_matrix(w: DMatrix<f64>) -> Result<MixingMatrix, TopologyError> {
        let n = w.nrows();
        if n == 0 {
            return Err(TopologyError::Empty);
        }
        if n > MAX_NODES {
            return Err(TopologyError::TooManyNodes { n, max: MAX_NODES });
        }
        if w.ncols() != n {
            return Err(TopologyError::NotSquare {
                row: 0,
                len: w.ncols(),
                n,
            });
        }
        for i in 0..n {
            for j in 0..n {
                let value = w[(i, j)];
                if !value.is_finite() {
                    return Err(TopologyError::NonFinite {
                        row: i,
                        col: j,
                        value,
                    });
                }
                if value < 0.0 {
                    return Err(TopologyError::Negative {
                        row: i,
                        col: j,
                        value,
                    });
                }
            }
        }
        Ok(MixingMatrix { w })
    }

    /// Number of peers `n` (W is n×n).
    pub fn n(&self) -> usize {
        self.w.nrows()
    }

    /// `W_ij`: the weight peer `i` gives to peer `j`'s value. Panics if `i` or `j >= n`.
    pub fn get(&self, i: Rank, j: Rank) -> f64 {
        self.w[(i, j)]
    }

    /// The n×n matrix.
    pub fn matrix(&self) -> &DMatrix<f64> {
        &self.w
    }

    /// `W_ii`, the weight peer `i` keeps on its own value. Panics if `i >= n`.
    pub fn self_weight(&self, i: Rank) -> f64 {
        self.w[(i, i)]
    }

    /// `(j, W_ij)` for `j ≠ i` with `W_ij ≠ 0`, sorted by `j`: whom peer `i` receives from
    /// and with which weight. Panics if `i >= n`.
    pub fn in_weights(&self, i: Rank) -> Vec<(Rank, f64)> {
        (0..self.n())
            .filter(|&j| j != i && self.w[(i, j)] != 0.0)
            .map(|j| (j, self.w[(i, j)]))
            .collect()
    }

    /// `j ≠ i` with `W_ji ≠ 0`, sorted: whom peer `i` sends to. Panics if `i >= n`.
    pub fn out_neighbors(&self, i: Rank) -> Vec<Rank> {
        (0..self.n())
            .filter(|&j| j != i && self.w[(j, i)] != 0.0)
            .collect()
    }

    /// Support graph of W: edge `j -> i` whenever `W_ij ≠ 0` and `i ≠ j`.
    pub fn graph(&self) -> Graph {
        let n = self.n();
        Graph::from_directed_unchecked(
            n,
            (0..n)
                .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (j, i)))
                .filter(|&(j, i)| self.w[(i, j)] != 0.0),
        )
    }

    /// Row/column sums, symmetry and sign checks with absolute tolerance `tol`, plus strong
    /// connectivity of the support graph.
    pub fn checks(&self, tol: f64) -> Checks {
        let n = self.n();
        let row_stochastic = (0..n).all(|i| (self.w.row(i).sum() - 1.0).abs() <= tol);
        let column_stochastic = (0..n).all(|j| (self.w.column(j).sum() - 1.0).abs() <= tol);
        let symmetric =
            (0..n).all(|i| (0..i).all(|j| (self.w[(i, j)] - self.w[(j, i)]).abs() <= tol));
        let nonnegative = self.w.iter().all(|&v| v >= -tol);
        Checks {
            row_stochastic,
            column_stochastic,
            doubly_stochastic: row_stochastic && column_stochastic,
            symmetric,
            nonnegative,
            connected: self.graph().is_connected(),
        }
    }

    /// `Ok(())` if W is doubly stochastic within absolute tolerance `tol`, non-negative and
    /// has a strongly connected support graph.
    ///
    /// Errors, first failure in this order: [`TopologyError::RowSum`] (`row`, `sum`),
    /// [`TopologyError::ColumnSum`] (`col`, `sum`), [`TopologyError::Negative`] (`row`, `col`,
    /// `value`, entries below `-tol`), [`TopologyError::NotConnected`] (a peer not mutually
    /// reachable with peer 0).
    pub fn validate_doubly_stochastic(&self, tol: f64) -> Result<(), TopologyError> {
        let n = self.n();
        for row in 0..n {
            let sum = self.w.row(row).sum();
            if (sum - 1.0).abs() > tol || sum.is_nan() {
                return Err(TopologyError::RowSum { row, sum, tol });
            }
        }
        for col in 0..n {
            let sum = self.w.column(col).sum();
            if (sum - 1.0).abs() > tol || sum.is_nan() {
                return Err(TopologyError::ColumnSum { col, sum, tol });
            }
        }
        for row in 0..n {
            for col in 0..n {
                let value = self.w[(row, col)];
                if value < -tol {
                    return Err(TopologyError::Negative { row, col, value });
                }
            }
        }
        match self.graph().first_unconnected() {
            Some(peer) => Err(TopologyError::NotConnected { peer }),
            None => Ok(()),
        }
    }

    /// All n eigenvalue moduli `|λ|`, sorted in decreasing order, or `None` if the
    /// eigen-solver did not converge.
    ///
    /// Uses a symmetric eigen-decomposition when W is symmetric (within
    /// [`DEFAULT_TOLERANCE`]) and the real Schur form (complex eigenvalues) otherwise.
    pub fn eigenvalue_moduli(&self) -> Option<Vec<f64>> {
        let n = self.n();
        let max_iter = 1000 * n.max(10);
        let mut moduli: Vec<f64> = if self.checks_symmetric(DEFAULT_TOLERANCE) {
            let sym = (&self.w + self.w.transpose()) * 0.5;
            SymmetricEigen::try_new(sym, f64::EPSILON, max_iter)?
                .eigenvalues
                .iter()
                .map(|v| v.abs())
                .collect()
        } else {
            Schur::try_new(self.w.clone(), f64::EPSILON, max_iter)?
                .complex_eigenvalues()
                .iter()
                .map(|c| c.norm())
                .collect()
        };
        moduli.sort_by(|a, b| b.total_cmp(a));
        Some(moduli)
    }

    /// The slowest consensus mode: a unit vector `u: [n]` with `Σ u_i = 0` that maximises
    /// `‖W u‖`, i.e. the top eigenvector of `P WᵀW P` with `P = I − 11ᵀ/n`, or `None` if
    /// the eigen-solver did not converge or `n < 2`.
    ///
    /// For a normal W (symmetric, or circulant like the exponential graph) `u` lies in the
    /// eigenspace of `|λ₂|`, so exact gossip started from `x_i = u_i` has
    /// `Ξ²(t)/Ξ²(0) = ‖Wᵗu‖² = |λ₂|^(2t)` exactly: the initial condition for which the
    /// worst-case bound of Boyd et al. (2006, "Randomized gossip algorithms") is tight.
    pub fn slowest_mode(&self) -> Option<Vec<f64>> {
        let n = self.n();
        if n < 2 {
            return None;
        }
        let p = DMatrix::<f64>::identity(n, n) - DMatrix::<f64>::from_element(n, n, 1.0 / n as f64);
        let m = &p * self.w.transpose() * &self.w * &p;
        let m = (&m + m.transpose()) * 0.5;
        let eig = SymmetricEigen::try_new(m, f64::EPSILON, 1000 * n.max(10))?;
        let top = eig.eigenvalues.iamax();
        let u: Vec<f64> = eig.eigenvectors.column(top).iter().copied().collect();
        let norm = u.iter().map(|v| v * v).sum::<f64>().sqrt();
        (norm > 0.0).then(|| u.iter().map(|v| v / norm).collect())
    }

    fn checks_symmetric(&self, tol: f64) -> bool {
        let n = self.n();
        (0..n).all(|i| (0..i).all(|j| (self.w[(i, j)] - self.w[(j, i)]).abs() <= tol))
    }

    /// `|λ₂|`: the second largest eigenvalue modulus of W (the largest is `|λ₁| = 1` for a
    /// stochastic W). Returns 0 for `n == 1`, and 1 when the support graph is disconnected or
    /// periodic (e.g. an even ring with zero self weights). Returns NaN if the eigen-solver
    /// fails to converge (not expected for stochastic matrices).
    pub fn second_eigenvalue_modulus(&self) -> f64 {
        if self.n() == 1 {
            return 0.0;
        }
        match self.eigenvalue_moduli() {
            Some(m) => m[1],
            None => f64::NAN,
        }
    }

    /// Spectral gap `1 - |λ₂|` (Lian et al. 2017; Koloskova et al. 2019): in `(0, 1]` for a
    /// doubly stochastic W with connected, aperiodic support; 1 means exact averaging in one
    /// step (`W = J/n`).
    pub fn spectral_gap(&self) -> f64 {
        1.0 - self.second_eigenvalue_modulus()
    }

    /// The mixing matrix after the peers in `gone` left: Metropolis–Hastings weights
    /// (Xiao & Boyd 2004) on W's support graph without them, which every survivor can
    /// compute from the topology and the list of departed peers alone. The result is
    /// symmetric and doubly stochastic over the survivors (departed peers keep an identity
    /// row), so the survivors' average is preserved. Duplicates in `gone` are ignored.
    ///
    /// W' keeps the n×n shape so that ranks do not change. For an MH-weighted W the edge
    /// weights between two survivors change only where one of them lost a neighbour (a
    /// ring's survivors two hops away keep 1/3).
    ///
    /// Errors: [`TopologyError::RankOutOfRange`] for a rank ≥ n;
    /// [`TopologyError::NotSymmetric`] if W's support is directed (the exponential graph):
    /// Metropolis–Hastings needs an undirected graph.
    pub fn without_peers(&self, gone: &[Rank]) -> Result<Surviving, TopologyError> {
        let n = self.n();
        if let Some(&rank) = gone.iter().find(|&&r| r >= n) {
            return Err(TopologyError::RankOutOfRange { rank, n });
        }
        let mut alive = vec![true; n];
        for &r in gone {
            alive[r] = false;
        }
        let support = self.graph();
        if let Some((from, to)) = support.first_asymmetric_edge() {
            return Err(TopologyError::NotSymmetric {
                rule: "re-weighting after a departure (metropolis-hastings weights)",
                from,
                to,
            });
        }
        let edges: Vec<(Rank, Rank)> = (0..n)
            .filter(|&i| alive[i])
            .flat_map(|i| support.out_neighbors(i).iter().map(move |&j| (i, j)))
            .filter(|&(i, j)| alive[j] && i < j)
            .collect();
        let surviving = Graph::undirected_unchecked(n, edges);
        let w = Self::metropolis_hastings(&surviving)?;
        // Components of the survivors (departed peers are isolated vertices, left out).
        let mut component = vec![usize::MAX; n];
        let mut components: Vec<Vec<Rank>> = Vec::new();
        for start in (0..n).filter(|&i| alive[i]) {
            if component[start] != usize::MAX {
                continue;
            }
            let c = components.len();
            let mut members = vec![start];
            component[start] = c;
            let mut k = 0;
            while k < members.len() {
                for &j in surviving.out_neighbors(members[k]) {
                    if component[j] == usize::MAX {
                        component[j] = c;
                        members.push(j);
                    }
                }
                k += 1;
            }
            members.sort_unstable();
            components.push(members);
        }
        Ok(Surviving { w, components })
    }
}
