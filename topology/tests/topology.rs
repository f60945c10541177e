//! Tests for murmur-topology against hand-worked numbers and closed-form spectra.

use std::f64::consts::PI;

use murmur_topology::*;

const TOL: f64 = 1e-9;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn assert_close(a: f64, b: f64, tol: f64) {
    assert!(close(a, b, tol), "{a} vs {b} (tol {tol})");
}

/// max over k≠0 of |(1 + 2cos(2πk/n))/3|: |λ₂| of the Metropolis–Hastings ring.
fn ring_lambda2(n: usize) -> f64 {
    (1..n)
        .map(|k| ((1.0 + 2.0 * (2.0 * PI * k as f64 / n as f64).cos()) / 3.0).abs())
        .fold(0.0, f64::max)
}

// ---------- graphs ----------

#[test]
fn ring_small_cases() {
    let g1 = Graph::ring(1).unwrap();
    assert_eq!(g1.n(), 1);
    assert_eq!(g1.edge_count(), 0);
    assert!(g1.is_connected());
    let g2 = Graph::ring(2).unwrap();
    assert_eq!(g2.out_neighbors(0), &[1]);
    assert_eq!(g2.out_neighbors(1), &[0]);
    assert_eq!(g2.edge_count(), 2);
    let g5 = Graph::ring(5).unwrap();
    assert_eq!(g5.out_neighbors(0), &[1, 4]);
    assert_eq!(g5.in_neighbors(3), &[2, 4]);
    assert!(g5.is_symmetric() && g5.is_connected());
    assert_eq!(Graph::ring(0), Err(TopologyError::Empty));
}

#[test]
fn torus_degrees_and_dedup() {
    let g = Graph::torus(3, 4).unwrap();
    assert_eq!(g.n(), 12);
    for i in 0..12 {
        assert_eq!(g.out_degree(i), 4, "peer {i}");
    }
    // peer (1, 2) = 6: up 2, down 10, left 5, right 7
    assert_eq!(g.out_neighbors(6), &[2, 5, 7, 10]);
    assert!(g.is_symmetric() && g.is_connected());
    // rows = 2: up and down coincide -> degree 3
    let g = Graph::torus(2, 3).unwrap();
    assert!((0..6).all(|i| g.out_degree(i) == 3));
    // 2x2 torus is a 4-cycle
    let g = Graph::torus(2, 2).unwrap();
    assert!((0..4).all(|i| g.out_degree(i) == 2));
    // 1 x n torus is the ring
    assert_eq!(Graph::torus(1, 6).unwrap(), Graph::ring(6).unwrap());
    assert!(matches!(
        Graph::torus(0, 3),
        Err(TopologyError::InvalidTorus {
            rows: 0,
            cols: 3,
            ..
        })
    ));
}

#[test]
fn complete_star_hypercube_degrees() {
    let g = Graph::complete(6).unwrap();
    assert!((0..6).all(|i| g.out_degree(i) == 5 && g.in_degree(i) == 5));
    assert_eq!(g.edge_count(), 30);

    let s = Graph::star(7).unwrap();
    assert_eq!(s.out_degree(0), 6);
    assert!((1..7).all(|i| s.out_neighbors(i) == [0]));
    assert!(s.is_symmetric() && s.is_connected());

    for d in 0..7u32 {
        let n = 1usize << d;
        let h = Graph::hypercube(n).unwrap();
        assert!((0..n).all(|i| h.out_degree(i) == d as usize), "n = {n}");
        assert!(h.is_symmetric() && h.is_connected());
    }
    assert_eq!(Graph::hypercube(8).unwrap().out_neighbors(5), &[1, 4, 7]);
    let err = Graph::hypercube(12).unwrap_err();
    assert_eq!(err, TopologyError::NotPowerOfTwo { n: 12 });
    assert!(err.to_string().contains("12"), "{err}");
}

#[test]
fn exponential_degrees_and_direction() {
    for n in 2..=40usize {
        let g = Graph::exponential(n).unwrap();
        let expect = (n - 1).ilog2() as usize + 1;
        for i in 0..n {
            assert_eq!(g.out_degree(i), expect, "n = {n}, peer {i}");
            assert_eq!(g.in_degree(i), expect, "n = {n}, peer {i}");
        }
        assert!(g.is_connected());
        let w = MixingMatrix::max_degree(&g).unwrap();
        w.validate_doubly_stochastic(TOL).unwrap();
    }
    let g = Graph::exponential(8).unwrap();
    assert_eq!(g.out_neighbors(0), &[1, 2, 4]);
    assert_eq!(g.in_neighbors(0), &[4, 6, 7]);
    assert!(!g.is_symmetric());
    assert_eq!(Graph::exponential(1).unwrap().edge_count(), 0);
    // n = 3: offsets 1, 2 -> complete graph, symmetric
    assert_eq!(Graph::exponential(3).unwrap(), Graph::complete(3).unwrap());
}

#[test]
fn erdos_renyi_deterministic_and_errors() {
    let a = Graph::erdos_renyi(20, 0.3, 42).unwrap();
    let b = Graph::erdos_renyi(20, 0.3, 42).unwrap();
    assert_eq!(a, b);
    assert!(a.is_symmetric() && a.is_connected());
    let others: Vec<Graph> = (43..48)
        .filter_map(|s| Graph::erdos_renyi(20, 0.3, s).ok())
        .collect();
    assert!(
        others.iter().any(|g| *g != a),
        "different seeds should give different graphs"
    );
    assert_eq!(
        Graph::erdos_renyi(6, 1.0, 1).unwrap(),
        Graph::complete(6).unwrap()
    );

    let err = Graph::erdos_renyi(10, 0.0, 1234).unwrap_err();
    assert!(
        matches!(
            err,
            TopologyError::Disconnected {
                n: 10,
                seed: 1234,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("seed 1234"), "{err}");
    let err = Graph::erdos_renyi(10, 1e-6, 9).unwrap_err();
    assert!(matches!(err, TopologyError::Disconnected { seed: 9, .. }));

    assert!(matches!(
        Graph::erdos_renyi(5, 1.5, 0),
        Err(TopologyError::InvalidProbability { .. })
    ));
    assert!(matches!(
        Graph::erdos_renyi(5, f64::NAN, 0),
        Err(TopologyError::InvalidProbability { .. })
    ));
    assert!(Graph::erdos_renyi(1, 0.0, 0).unwrap().is_connected());
}

#[test]
fn from_edges_rules() {
    let g = Graph::from_edges(4, &[(0, 1), (1, 2), (1, 2), (2, 3)], false).unwrap();
    assert_eq!(g.edge_count(), 6);
    assert_eq!(g.out_neighbors(1), &[0, 2]);
    assert!(g.is_symmetric() && g.is_connected());

    let d = Graph::from_edges(3, &[(0, 1), (1, 2), (2, 0)], true).unwrap();
    assert_eq!(d.out_neighbors(0), &[1]);
    assert_eq!(d.in_neighbors(0), &[2]);
    assert!(!d.is_symmetric());
    assert!(d.is_connected(), "directed 3-cycle is strongly connected");
    let path = Graph::from_edges(3, &[(0, 1), (1, 2)], true).unwrap();
    assert!(
        !path.is_connected(),
        "directed path is not strongly connected"
    );

    let err = Graph::from_edges(4, &[(0, 1), (2, 9)], false).unwrap_err();
    assert_eq!(
        err,
        TopologyError::EdgeOutOfRange {
            edge: 1,
            value: 9,
            n: 4
        }
    );
    assert!(
        err.to_string().contains("edge 1") && err.to_string().contains('9'),
        "{err}"
    );
    let err = Graph::from_edges(4, &[(0, 1), (1, 2), (3, 3)], false).unwrap_err();
    assert_eq!(err, TopologyError::SelfLoop { edge: 2, node: 3 });
    assert_eq!(Graph::from_edges(0, &[], false), Err(TopologyError::Empty));
    assert!(!Graph::from_edges(4, &[(0, 1), (2, 3)], false)
        .unwrap()
        .is_connected());
}

// ---------- mixing matrices ----------

#[test]
fn ring_mh_weights_and_closed_form_spectrum() {
    let w = MixingMatrix::metropolis_hastings(&Graph::ring(8).unwrap()).unwrap();
    assert_close(w.get(0, 1), 1.0 / 3.0, 1e-15);
    assert_close(w.get(0, 7), 1.0 / 3.0, 1e-15);
    assert_close(w.self_weight(0), 1.0 / 3.0, 1e-15);
    assert_eq!(w.get(0, 4), 0.0);
    assert!(w.checks(TOL).symmetric && w.checks(TOL).doubly_stochastic);
    // hand-worked: n = 8, k = 1 -> (1 + √2)/3
    assert_close(
        w.second_eigenvalue_modulus(),
        (1.0 + 2f64.sqrt()) / 3.0,
        1e-9,
    );

    for n in [3usize, 4, 5, 7, 8, 9, 10, 11, 12, 13, 16] {
        let w = MixingMatrix::metropolis_hastings(&Graph::ring(n).unwrap()).unwrap();
        let l2 = w.second_eigenvalue_modulus();
        assert_close(l2, ring_lambda2(n), 1e-9);
        assert_close(w.spectral_gap(), 1.0 - ring_lambda2(n), 1e-9);
    }
    // n = 3 is the complete graph: λ₂ = 0; n = 4: |λ₂| = 1/3
    assert_close(ring_lambda2(3), 0.0, 1e-12);
    assert_close(ring_lambda2(4), 1.0 / 3.0, 1e-12);
}

#[test]
fn complete_mh_is_uniform_averaging() {
    for n in [1usize, 2, 5, 10] {
        let w = MixingMatrix::metropolis_hastings(&Graph::complete(n).unwrap()).unwrap();
        for i in 0..n {
            for j in 0..n {
                assert_close(w.get(i, j), 1.0 / n as f64, 1e-15);
            }
        }
        assert_close(w.second_eigenvalue_modulus(), 0.0, 1e-9);
        assert_close(w.spectral_gap(), 1.0, 1e-9);
    }
}

#[test]
fn star_and_hypercube_mh_spectra() {
    // star: W_0j = 1/n, W_jj = 1 - 1/n, W_00 = 1/n; eigenvalues 1, 1 - 1/n (×(n-2)), 0
    let n = 6;
    let w = MixingMatrix::metropolis_hastings(&Graph::star(n).unwrap()).unwrap();
    assert_close(w.get(0, 3), 1.0 / 6.0, 1e-15);
    assert_close(w.self_weight(0), 1.0 / 6.0, 1e-15);
    assert_close(w.self_weight(3), 5.0 / 6.0, 1e-15);
    assert_close(w.second_eigenvalue_modulus(), 5.0 / 6.0, 1e-9);

    // hypercube with d = log2 n: eigenvalues (1 + d - 2m)/(d + 1) -> |λ₂| = (d-1)/(d+1)
    for d in 1..=6u32 {
        let w = MixingMatrix::metropolis_hastings(&Graph::hypercube(1 << d).unwrap()).unwrap();
        let d = d as f64;
        assert_close(w.second_eigenvalue_modulus(), (d - 1.0) / (d + 1.0), 1e-9);
    }
}

#[test]
fn torus_mh_spectrum_closed_form() {
    let (r, c) = (4usize, 5usize);
    let w = MixingMatrix::metropolis_hastings(&Graph::torus(r, c).unwrap()).unwrap();
    assert_close(w.get(0, 1), 0.2, 1e-15);
    let mut expect: f64 = 0.0;
    for a in 0..r {
        for b in 0..c {
            if (a, b) != (0, 0) {
                let l = (1.0
                    + 2.0 * (2.0 * PI * a as f64 / r as f64).cos()
                    + 2.0 * (2.0 * PI * b as f64 / c as f64).cos())
                    / 5.0;
                expect = expect.max(l.abs());
            }
        }
    }
    assert_close(w.second_eigenvalue_modulus(), expect, 1e-9);
}

#[test]
fn mh_degree_dependent_weights_on_path() {
    // path 0-1-2: d = (1, 2, 1): W_01 = W_12 = 1/3, W_00 = W_22 = 2/3, W_11 = 1/3
    let g = Graph::from_edges(3, &[(0, 1), (1, 2)], false).unwrap();
    let w = MixingMatrix::metropolis_hastings(&g).unwrap();
    assert_close(w.get(0, 1), 1.0 / 3.0, 1e-15);
    assert_close(w.self_weight(0), 2.0 / 3.0, 1e-15);
    assert_close(w.self_weight(1), 1.0 / 3.0, 1e-15);
    assert_eq!(w.get(0, 2), 0.0);
    // eigenvalues of this W: 1, 2/3, 0
    assert_close(w.second_eigenvalue_modulus(), 2.0 / 3.0, 1e-9);
}

#[test]
fn mh_rejects_directed_graph() {
    let err = MixingMatrix::metropolis_hastings(&Graph::exponential(8).unwrap()).unwrap_err();
    assert!(
        matches!(err, TopologyError::NotSymmetric { from: 0, to: 1, .. }),
        "{err:?}"
    );
}

#[test]
fn exponential_max_degree_weights_and_circulant_spectrum() {
    let n = 8;
    let w = MixingMatrix::max_degree(&Graph::exponential(n).unwrap()).unwrap();
    assert_eq!(w.in_weights(0), vec![(4, 0.25), (6, 0.25), (7, 0.25)]);
    assert_eq!(w.out_neighbors(0), vec![1, 2, 4]);
    assert_close(w.self_weight(0), 0.25, 1e-15);
    let c = w.checks(TOL);
    assert!(c.doubly_stochastic && !c.symmetric && c.connected && c.nonnegative);
    assert_eq!(w.graph(), Graph::exponential(n).unwrap());
    // circulant: |λ_l| = |1 + Σ_k e^{2πi l 2^k / n}| / (d + 1)
    for n in [5usize, 8, 12, 16] {
        let g = Graph::exponential(n).unwrap();
        let w = MixingMatrix::max_degree(&g).unwrap();
        let offs: Vec<usize> = g.out_neighbors(0).to_vec();
        let d1 = offs.len() as f64 + 1.0;
        let expect = (1..n)
            .map(|l| {
                let (mut re, mut im) = (1.0, 0.0);
                for &o in &offs {
                    let th = 2.0 * PI * (l * o) as f64 / n as f64;
                    re += th.cos();
                    im += th.sin();
                }
                (re * re + im * im).sqrt() / d1
            })
            .fold(0.0, f64::max);
        assert_close(w.second_eigenvalue_modulus(), expect, 1e-8);
    }
}

#[test]
fn max_degree_on_irregular_undirected_graph() {
    // star with 4 peers: d_max = 3 -> W_0j = W_j0 = 1/4, W_00 = 1/4, W_jj = 3/4
    let w = MixingMatrix::max_degree(&Graph::star(4).unwrap()).unwrap();
    assert_close(w.get(0, 2), 0.25, 1e-15);
    assert_close(w.self_weight(0), 0.25, 1e-15);
    assert_close(w.self_weight(2), 0.75, 1e-15);
    w.validate_doubly_stochastic(TOL).unwrap();
    // unbalanced directed graph: rows sum to 1 but columns don't
    let g = Graph::from_edges(3, &[(0, 1), (0, 2), (1, 0), (2, 1)], true).unwrap();
    let w = MixingMatrix::max_degree(&g).unwrap();
    let c = w.checks(TOL);
    assert!(c.row_stochastic && !c.column_stochastic && !c.doubly_stochastic);
    assert!(matches!(
        w.validate_doubly_stochastic(TOL),
        Err(TopologyError::ColumnSum { col: 0, .. })
    ));
}

#[test]
fn dense_validation_errors() {
    let w = MixingMatrix::from_dense(vec![
        vec![0.5, 0.5, 0.0],
        vec![0.3, 0.5, 0.0],
        vec![0.2, 0.0, 1.0],
    ])
    .unwrap();
    let err = w.validate_doubly_stochastic(1e-9).unwrap_err();
    assert!(
        matches!(err, TopologyError::RowSum { row: 1, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("row 1 sums to 0.8"), "{msg}");
    assert!(msg.contains("expected 1 ± 1e-9"), "{msg}");

    let w = MixingMatrix::from_dense(vec![vec![0.5, 0.5], vec![0.0, 1.0]]).unwrap();
    let err = w.validate_doubly_stochastic(1e-9).unwrap_err();
    assert!(
        matches!(err, TopologyError::ColumnSum { col: 0, sum, .. } if close(sum, 0.5, 1e-15)),
        "{err:?}"
    );
    assert!(err.to_string().contains("column 0 sums to 0.5"), "{err}");

    let err = MixingMatrix::from_dense(vec![vec![1.1, -0.1], vec![-0.1, 1.1]]).unwrap_err();
    assert_eq!(
        err,
        TopologyError::Negative {
            row: 0,
            col: 1,
            value: -0.1
        }
    );
    assert!(err.to_string().contains("W[0][1] = -0.1"), "{err}");

    let err = MixingMatrix::from_dense(vec![vec![0.5, 0.5], vec![0.5]]).unwrap_err();
    assert_eq!(
        err,
        TopologyError::NotSquare {
            row: 1,
            len: 1,
            n: 2
        }
    );
    assert!(matches!(
        MixingMatrix::from_dense(vec![vec![f64::NAN]]),
        Err(TopologyError::NonFinite { row: 0, col: 0, .. })
    ));
    assert_eq!(MixingMatrix::from_dense(vec![]), Err(TopologyError::Empty));

    let half = 0.5;
    let block = MixingMatrix::from_dense(vec![
        vec![half, half, 0.0, 0.0],
        vec![half, half, 0.0, 0.0],
        vec![0.0, 0.0, half, half],
        vec![0.0, 0.0, half, half],
    ])
    .unwrap();
    let err = block.validate_doubly_stochastic(1e-9).unwrap_err();
    assert_eq!(err, TopologyError::NotConnected { peer: 2 });
    assert!(!block.checks(1e-9).connected && block.checks(1e-9).doubly_stochastic);
    // two eigenvalues equal to 1 -> |λ₂| = 1, gap 0
    assert_close(block.second_eigenvalue_modulus(), 1.0, 1e-9);
    assert_close(block.spectral_gap(), 0.0, 1e-9);
}

#[test]
fn dense_accessors_and_support_graph() {
    let w = MixingMatrix::from_dense(vec![
        vec![0.5, 0.5, 0.0],
        vec![0.0, 0.5, 0.5],
        vec![0.5, 0.0, 0.5],
    ])
    .unwrap();
    assert_eq!(w.n(), 3);
    assert_eq!(w.in_weights(0), vec![(1, 0.5)]);
    // peer 0 receives from 1, so 1 sends to 0; peer 0 sends to 2 (W_20 ≠ 0)
    assert_eq!(w.out_neighbors(0), vec![2]);
    let g = w.graph();
    assert_eq!(g.out_neighbors(1), &[0]);
    assert_eq!(g.in_neighbors(0), &[1]);
    w.validate_doubly_stochastic(1e-12).unwrap();
    // directed 3-cycle with self weight 1/2: eigenvalues (1 + ω^k)/2 -> |λ₂| = |1 + e^{2πi/3}|/2 = 1/2
    assert_close(w.second_eigenvalue_modulus(), 0.5, 1e-9);
    assert_eq!(
        MixingMatrix::from_dense(vec![vec![1.0]])
            .unwrap()
            .second_eigenvalue_modulus(),
        0.0
    );
}

#[test]
fn periodic_ring_has_unit_lambda2() {
    // even ring with zero self weights is periodic: eigenvalue -1
    let n = 4;
    let rows = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if (i + 1) % n == j || (j + 1) % n == i {
                        0.5
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    let w = MixingMatrix::from_dense(rows).unwrap();
    w.validate_doubly_stochastic(TOL).unwrap();
    assert_close(w.second_eigenvalue_modulus(), 1.0, 1e-9);
}

// ---------- topology files ----------

#[test]
fn toml_named_forms_build() {
    let t = TopologySpec::parse("topology = \"ring\"")
        .unwrap()
        .build(Some(8))
        .unwrap();
    assert_eq!(t.graph, Graph::ring(8).unwrap());
    assert_close(t.w.get(0, 1), 1.0 / 3.0, 1e-15);
    assert!(t.name.contains("ring"));

    let spec = TopologySpec::parse("name = \"grid\"\ntopology = \"torus\"\nnodes = 12\n").unwrap();
    let t = spec.build(None).unwrap();
    assert_eq!(t.name, "grid");
    assert_eq!(t.graph, Graph::torus(3, 4).unwrap());
    let t = TopologySpec::parse("topology = \"torus\"\nrows = 2\ncols = 8")
        .unwrap()
        .build(Some(16))
        .unwrap();
    assert_eq!(t.graph, Graph::torus(2, 8).unwrap());

    let t = TopologySpec::parse("topology = \"exponential\"\nnodes = 16")
        .unwrap()
        .build(None)
        .unwrap();
    assert_eq!(
        t.w.get(1, 0),
        1.0 / 5.0,
        "max-degree is the default for exponential"
    );

    let t = TopologySpec::parse("topology = \"hypercube\"\nweights = \"max-degree\"")
        .unwrap()
        .build(Some(8))
        .unwrap();
    assert_close(t.w.self_weight(0), 0.25, 1e-15);

    let text = "topology = \"erdos-renyi\"\nnodes = 12\np = 0.5\nseed = 3\n";
    let t = TopologySpec::parse(text).unwrap().build(None).unwrap();
    assert_eq!(t.graph, Graph::erdos_renyi(12, 0.5, 3).unwrap());

    for kind in ["ring", "torus", "complete", "star", "exponential"] {
        let t = TopologySpec::named(kind).unwrap().build(Some(9)).unwrap();
        assert_eq!(t.w.n(), 9);
        assert!(t.w.checks(TOL).doubly_stochastic, "{kind}");
    }
}

#[test]
fn toml_edges_and_dense_forms_build() {
    let text = "nodes = 4\nedges = [[0, 1], [1, 2], [2, 3], [3, 0]]\n";
    let t = TopologySpec::parse(text).unwrap().build(None).unwrap();
    assert_eq!(t.graph, Graph::ring(4).unwrap());
    assert_close(t.w.second_eigenvalue_modulus(), 1.0 / 3.0, 1e-9);

    let text = "edges = [[0, 1], [1, 2], [2, 0]]\ndirected = true\n";
    let t = TopologySpec::parse(text).unwrap().build(Some(3)).unwrap();
    assert_eq!(t.w.in_weights(1), vec![(0, 0.5)]);

    let text = "matrix = [[0.5, 0.5], [0.5, 0.5]]\nname = \"pair\"";
    let t = TopologySpec::parse(text).unwrap().build(None).unwrap();
    assert_eq!(t.name, "pair");
    assert_eq!(t.graph, Graph::ring(2).unwrap());
    assert_close(t.w.spectral_gap(), 1.0, 1e-12);
}

#[test]
fn toml_build_validation_errors() {
    // dense, bad row
    let err = TopologySpec::parse("matrix = [[0.5, 0.5], [0.25, 0.5]]")
        .unwrap()
        .build(None)
        .unwrap_err();
    assert!(err.to_string().contains("row 1 sums to 0.75"), "{err}");
    // dense, disconnected
    let text = "matrix = [[1.0, 0.0], [0.0, 1.0]]";
    assert_eq!(
        TopologySpec::parse(text).unwrap().build(None).unwrap_err(),
        TopologyError::NotConnected { peer: 1 }
    );
    // edges, disconnected
    let err = TopologySpec::parse("nodes = 4\nedges = [[0, 1], [2, 3]]")
        .unwrap()
        .build(None)
        .unwrap_err();
    assert_eq!(err, TopologyError::NotConnected { peer: 2 });
    // edges out of range
    let err = TopologySpec::parse("nodes = 3\nedges = [[0, 1], [1, 5]]")
        .unwrap()
        .build(None)
        .unwrap_err();
    assert_eq!(
        err,
        TopologyError::EdgeOutOfRange {
            edge: 1,
            value: 5,
            n: 3
        }
    );
    // MH on a directed graph
    let err = TopologySpec::parse("topology = \"exponential\"\nweights = \"metropolis-hastings\"")
        .unwrap()
        .build(Some(8))
        .unwrap_err();
    assert!(matches!(err, TopologyError::NotSymmetric { .. }), "{err:?}");
    // unbalanced directed edges with max-degree: not column stochastic
    let err = TopologySpec::parse("edges = [[0, 1], [1, 2], [2, 0], [0, 2]]\ndirected = true")
        .unwrap()
        .build(Some(3))
        .unwrap_err();
    assert!(matches!(err, TopologyError::ColumnSum { .. }), "{err:?}");
    // hypercube on 6
    let err = TopologySpec::named("hypercube")
        .unwrap()
        .build(Some(6))
        .unwrap_err();
    assert_eq!(err, TopologyError::NotPowerOfTwo { n: 6 });
    // torus rows must divide
    let err = TopologySpec::parse("topology = \"torus\"\nrows = 5")
        .unwrap()
        .build(Some(12))
        .unwrap_err();
    assert!(
        matches!(err, TopologyError::InvalidTorus { rows: 5, .. }),
        "{err:?}"
    );
    // erdos-renyi disconnected names the seed
    let err = TopologySpec::parse("topology = \"erdos-renyi\"\np = 0.0\nseed = 77")
        .unwrap()
        .build(Some(5))
        .unwrap_err();
    assert!(err.to_string().contains("seed 77"), "{err}");
}

#[test]
fn toml_parse_errors() {
    let err = TopologySpec::parse("topology = \"ring\"\nnodes = = 4\n").unwrap_err();
    assert!(matches!(err, TopologyError::Toml { .. }));
    assert!(err.to_string().contains("line 2"), "{err}");

    let err = TopologySpec::parse("topology = \"ring\"\nnodez = 4\n").unwrap_err();
    assert!(matches!(err, TopologyError::Toml { .. }), "{err:?}");
    assert!(err.to_string().contains("nodez"), "{err}");

    let err = TopologySpec::parse("topology = \"moebius\"").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TopologyError::UnknownTopology { .. }));
    for name in [
        "ring",
        "torus",
        "complete",
        "star",
        "hypercube",
        "exponential",
        "erdos-renyi",
    ] {
        assert!(msg.contains(name), "{msg}");
    }
    assert!(matches!(
        TopologySpec::named("moebius"),
        Err(TopologyError::UnknownTopology { .. })
    ));

    let err = TopologySpec::parse("topology = \"ring\"\nweights = \"uniformish\"").unwrap_err();
    assert!(err.to_string().contains("max-degree"), "{err}");

    // exactly one form
    assert!(matches!(
        TopologySpec::parse("nodes = 4"),
        Err(TopologyError::Spec { .. })
    ));
    assert!(matches!(
        TopologySpec::parse("topology = \"ring\"\nmatrix = [[1.0]]"),
        Err(TopologyError::Spec { .. })
    ));
    // keys that do not apply
    let err = TopologySpec::parse("topology = \"ring\"\np = 0.5").unwrap_err();
    assert!(err.to_string().contains("`p`"), "{err}");
    assert!(TopologySpec::parse("matrix = [[1.0]]\nweights = \"max-degree\"").is_err());
    assert!(
        TopologySpec::parse("topology = \"erdos-renyi\"\nnodes = 4").is_err(),
        "p is required"
    );
    assert!(TopologySpec::parse("topology = \"torus\"\nrows = 3\ncols = 3\nnodes = 8").is_err());
    // negative node index is a toml type error with position
    let err = TopologySpec::parse("nodes = 3\nedges = [[0, -1]]").unwrap_err();
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn toml_node_counts() {
    let spec = TopologySpec::parse("topology = \"ring\"\nnodes = 8").unwrap();
    assert_eq!(spec.build(Some(8)).unwrap().w.n(), 8);
    let err = spec.build(Some(6)).unwrap_err();
    assert_eq!(
        err,
        TopologyError::NodeCountMismatch {
            file: 8,
            requested: 6
        }
    );
    assert!(
        err.to_string().contains('8') && err.to_string().contains('6'),
        "{err}"
    );

    let dense = TopologySpec::parse("matrix = [[0.5, 0.5], [0.5, 0.5]]").unwrap();
    assert_eq!(
        dense.build(Some(3)).unwrap_err(),
        TopologyError::NodeCountMismatch {
            file: 2,
            requested: 3
        }
    );
    let torus = TopologySpec::parse("topology = \"torus\"\nrows = 3\ncols = 3").unwrap();
    assert_eq!(
        torus.build(Some(10)).unwrap_err(),
        TopologyError::NodeCountMismatch {
            file: 9,
            requested: 10
        }
    );

    assert_eq!(
        TopologySpec::named("ring")
            .unwrap()
            .build(None)
            .unwrap_err(),
        TopologyError::MissingNodeCount
    );
    assert_eq!(
        TopologySpec::parse("topology = \"ring\"\nnodes = 0")
            .unwrap()
            .build(None)
            .unwrap_err(),
        TopologyError::Empty
    );
    assert!(matches!(
        TopologySpec::named("complete")
            .unwrap()
            .build(Some(1_000_000)),
        Err(TopologyError::TooManyNodes { .. })
    ));
    let one = TopologySpec::named("ring").unwrap().build(Some(1)).unwrap();
    assert_eq!(one.w.get(0, 0), 1.0);
    assert_eq!(one.w.second_eigenvalue_modulus(), 0.0);
}

#[test]
fn inspect_report() {
    let t = TopologySpec::named("ring").unwrap().build(Some(8)).unwrap();
    let r = t.inspect();
    assert_eq!(r.n, 8);
    assert_eq!(r.edges, 16);
    assert_eq!((r.min_degree, r.max_degree), (2, 2));
    assert_close(r.mean_degree, 2.0, 1e-15);
    assert!(
        r.row_stochastic
            && r.column_stochastic
            && r.doubly_stochastic
            && r.symmetric
            && r.connected
    );
    assert_close(r.lambda2_abs, (1.0 + 2f64.sqrt()) / 3.0, 1e-9);
    assert_close(r.spectral_gap, 1.0 - (1.0 + 2f64.sqrt()) / 3.0, 1e-9);

    let json = serde_json::to_value(&r).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for k in [
        "name",
        "n",
        "edges",
        "min_degree",
        "max_degree",
        "mean_degree",
        "row_stochastic",
        "column_stochastic",
        "doubly_stochastic",
        "symmetric",
        "connected",
        "lambda2_abs",
        "spectral_gap",
        "schedule",
    ] {
        assert!(keys.contains(&k), "missing {k} in {json}");
    }
    assert_eq!(keys.len(), 14);
    assert!(json["schedule"].is_null());
    let text = r.to_string();
    assert!(
        text.contains("ring") && text.contains("spectral gap") && text.lines().count() >= 8,
        "{text}"
    );

    let s = TopologySpec::named("star")
        .unwrap()
        .build(Some(5))
        .unwrap()
        .inspect();
    assert_eq!((s.min_degree, s.max_degree, s.edges), (1, 4, 8));
    let e = TopologySpec::named("exponential")
        .unwrap()
        .build(Some(8))
        .unwrap()
        .inspect();
    assert!(!e.symmetric && e.doubly_stochastic && e.connected);
    assert_eq!((e.min_degree, e.max_degree), (3, 3));

    let checks = serde_json::to_value(t.w.checks(TOL)).unwrap();
    assert_eq!(checks["doubly_stochastic"], serde_json::Value::Bool(true));
}

#[test]
fn the_slowest_mode_decays_exactly_at_the_second_eigenvalue() {
    for spec in ["ring", "torus", "exponential", "hypercube", "star"] {
        let t = TopologySpec::named(spec).unwrap().build(Some(16)).unwrap();
        let u = t.w.slowest_mode().unwrap();
        assert_close(u.iter().sum::<f64>(), 0.0, TOL);
        assert_close(u.iter().map(|v| v * v).sum::<f64>(), 1.0, TOL);
        let l2 = t.w.second_eigenvalue_modulus();
        let mut x = nalgebra::DVector::from_vec(u);
        for step in 1..=30 {
            x = t.w.matrix() * x;
            assert_close(x.norm_squared(), l2.powi(2 * step), 1e-9);
        }
    }
    // A random vector decays faster than the bound once the other modes die out.
    let t = TopologySpec::named("ring")
        .unwrap()
        .build(Some(16))
        .unwrap();
    let mut x = nalgebra::DVector::from_fn(16, |i, _| ((i * 7 + 3) % 11) as f64);
    x.add_scalar_mut(-x.mean());
    let x0 = x.norm_squared();
    for _ in 0..50 {
        x = t.w.matrix() * x;
    }
    assert!(x.norm_squared() / x0 < 0.9 * t.w.second_eigenvalue_modulus().powi(100));
    assert!(MixingMatrix::from_dense(vec![vec![1.0]])
        .unwrap()
        .slowest_mode()
        .is_none());
}

#[test]
fn a_schedule_file_builds_the_union_graph_and_carries_the_schedule() {
    let spec = TopologySpec::parse("schedule = \"one-peer-exponential\"\nnodes = 16\n").unwrap();
    let t = spec.build(None).unwrap();
    assert_eq!(
        t.schedule,
        Some(PushSchedule::one_peer_exponential(16).unwrap())
    );
    // The union of the rounds is the static exponential graph with its uniform weights.
    let exp = TopologySpec::named("exponential")
        .unwrap()
        .build(Some(16))
        .unwrap();
    assert_eq!(t.graph, exp.graph);
    assert_eq!(t.w, exp.w);
    let report = t.inspect();
    assert_eq!(
        report.schedule.as_deref(),
        Some("one-peer-exponential, period 4")
    );
    assert!(report
        .to_string()
        .contains("schedule           one-peer-exponential"));
    assert_eq!(exp.schedule, None);
    assert_eq!(exp.inspect().schedule, None);
    // Unknown schedules, extra keys and two forms at once are refused.
    for bad in [
        "schedule = \"two-peer\"\nnodes = 4",
        "schedule = \"one-peer-exponential\"\nnodes = 4\nweights = \"max-degree\"",
        "schedule = \"one-peer-exponential\"\ntopology = \"ring\"\nnodes = 4",
    ] {
        assert!(TopologySpec::parse(bad).is_err(), "{bad}");
    }
}

// ---------- departures ----------

#[test]
fn ring_without_one_peer_is_a_path_with_metropolis_weights() {
    let w = MixingMatrix::metropolis_hastings(&Graph::ring(8).unwrap()).unwrap();
    let s = w.without_peers(&[3]).unwrap();
    assert!(s.is_connected());
    assert_eq!(s.components, vec![vec![0, 1, 2, 4, 5, 6, 7]]);
    // Peer 3 keeps an identity row and column.
    assert_close(s.w.get(3, 3), 1.0, TOL);
    assert!((0..8)
        .filter(|&j| j != 3)
        .all(|j| s.w.get(3, j) == 0.0 && s.w.get(j, 3) == 0.0));
    // Its former neighbours have degree 1: the edge to a degree-2 peer keeps 1/(1 + 2).
    assert_close(s.w.get(2, 1), 1.0 / 3.0, TOL);
    assert_close(s.w.get(2, 2), 2.0 / 3.0, TOL);
    assert_close(s.w.get(4, 5), 1.0 / 3.0, TOL);
    // Survivors two hops away keep their weights.
    assert_close(s.w.get(6, 7), 1.0 / 3.0, TOL);
    assert_close(s.w.get(6, 6), 1.0 / 3.0, TOL);
    let c = s.w.checks(TOL);
    assert!(c.doubly_stochastic && c.symmetric && c.nonnegative);
    // Duplicates are ignored; nobody gone gives back the MH matrix of the full graph.
    assert_eq!(w.without_peers(&[3, 3]).unwrap(), s);
    assert_eq!(w.without_peers(&[]).unwrap().w, w);
}

#[test]
fn departures_that_split_the_graph_are_reported_as_components() {
    let w = MixingMatrix::metropolis_hastings(&Graph::ring(8).unwrap()).unwrap();
    let s = w.without_peers(&[1, 5]).unwrap();
    assert!(!s.is_connected());
    assert_eq!(s.components, vec![vec![0, 6, 7], vec![2, 3, 4]]);
    assert!(s.w.checks(TOL).doubly_stochastic);
    // A complete graph stays connected whoever leaves.
    let k = MixingMatrix::metropolis_hastings(&Graph::complete(5).unwrap()).unwrap();
    let s = k.without_peers(&[0, 2]).unwrap();
    assert_eq!(s.components, vec![vec![1, 3, 4]]);
    assert_close(s.w.get(1, 3), 1.0 / 3.0, TOL);
}

#[test]
fn departures_are_refused_on_directed_graphs_and_for_unknown_ranks() {
    let w = MixingMatrix::max_degree(&Graph::exponential(8).unwrap()).unwrap();
    assert!(matches!(
        w.without_peers(&[1]),
        Err(TopologyError::NotSymmetric { .. })
    ));
    let r = MixingMatrix::metropolis_hastings(&Graph::ring(4).unwrap()).unwrap();
    assert_eq!(
        r.without_peers(&[4]),
        Err(TopologyError::RankOutOfRange { rank: 4, n: 4 })
    );
}

#[test]
fn strong_connectivity_without_departed_peers() {
    // Directed ring 0 → 1 → … → 5 → 0: losing any peer breaks the cycle.
    let cycle = Graph::from_edges(
        6,
        &(0..6).map(|i| (i, (i + 1) % 6)).collect::<Vec<_>>(),
        true,
    )
    .unwrap();
    assert!(cycle.strongly_connected_without(&[]));
    assert!(!cycle.strongly_connected_without(&[3]));
    // The exponential graph on 8 (i → i+1, i+2, i+4) survives one departure, and two.
    let e = Graph::exponential(8).unwrap();
    assert!(e.strongly_connected_without(&[3]));
    assert!(e.strongly_connected_without(&[0, 5]));
    // Undirected path 0 – 1 – 2: the middle peer's departure splits it, an end's does not.
    let path = Graph::from_edges(3, &[(0, 1), (1, 2)], false).unwrap();
    assert!(!path.strongly_connected_without(&[1]));
    assert!(path.strongly_connected_without(&[0]));
    // Nobody or one peer left: nothing to connect.
    assert!(path.strongly_connected_without(&[0, 1, 2]));
    assert!(path.strongly_connected_without(&[0, 1]));
}

/// The command line's `NAME:key=value,...` form: the same keys and checks as a file.
#[test]
fn named_topology_options_on_the_command_line() {
    let er = TopologySpec::named("erdos-renyi:p=0.5,seed=7")
        .unwrap()
        .build(Some(10))
        .unwrap();
    let file = TopologySpec::parse("topology = \"erdos-renyi\"\np = 0.5\nseed = 7")
        .unwrap()
        .build(Some(10))
        .unwrap();
    assert_eq!(er.name, file.name);
    assert_eq!(er.w, file.w);
    // Another seed draws another graph (the option is not ignored).
    let other = TopologySpec::named("erdos-renyi:p=0.5,seed=8")
        .unwrap()
        .build(Some(10))
        .unwrap();
    assert_ne!(er.w, other.w);

    let torus = TopologySpec::named("torus:rows=2,cols=4")
        .unwrap()
        .build(Some(8))
        .unwrap();
    assert!(
        torus.name.contains("2x4") || torus.name.contains("2×4"),
        "{}",
        torus.name
    );
    // With unequal degrees the two weight rules differ (on a ring or a star they agree).
    let md = TopologySpec::named("erdos-renyi:p=0.5,seed=7,weights=max-degree")
        .unwrap()
        .build(Some(10))
        .unwrap();
    assert_ne!(md.w, er.w);

    for (bad, needle) in [
        ("erdos-renyi", "erdos-renyi:p=0.3"),
        ("erdos-renyi:p", "not key=value"),
        ("erdos-renyi:p=often", "must be a number"),
        ("erdos-renyi:p=inf", "finite"),
        ("erdos-renyi:p=0.3,q=1", "unknown option `q`"),
        ("ring:p=0.3", "`p` is not valid"),
        ("torus:rows=-2", "non-negative integer"),
        ("ring:weights=uniformish", "max-degree"),
    ] {
        let err = TopologySpec::named(bad)
            .and_then(|s| s.build(Some(8)))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{bad}: {err}");
    }
    assert!(matches!(
        TopologySpec::named("erdos-renyi:p=1.5").and_then(|s| s.build(Some(8))),
        Err(TopologyError::InvalidProbability { .. })
    ));
}

/// decentralizepy's `.edges` files (n, then `i j` per line, both directions) and plain edge
/// lists (`u v`, `#` comments) load as undirected graphs; bad lists get one clear line.
#[test]
fn edge_list_files_of_the_field_s_tools_load() {
    // A 4-ring in decentralizepy's form, both directions listed.
    let decentralizepy = "4\n0 1\n1 0\n1 2\n2 1\n2 3\n3 2\n3 0\n0 3\n";
    let plain = "# a ring\n0 1\n1 2\n\n2 3  # last but one\n3 0\n";
    let ring = TopologySpec::named("ring").unwrap().build(Some(4)).unwrap();
    for text in [decentralizepy, plain] {
        let t = TopologySpec::parse(text).unwrap().build(None).unwrap();
        assert_eq!(t.w.n(), 4);
        assert!(t.w.graph().is_symmetric());
        for i in 0..4 {
            for j in 0..4 {
                assert!(
                    (t.w.get(i, j) - ring.w.get(i, j)).abs() < 1e-12,
                    "{text}: W[{i}][{j}]"
                );
            }
        }
    }
    // The peer count of the first line may exceed the ranks listed: they are unconnected.
    let err = TopologySpec::parse("5\n0 1\n1 2\n2 3\n3 0\n")
        .unwrap()
        .build(None)
        .unwrap_err();
    assert!(
        matches!(
            err,
            murmur_topology::TopologyError::NotConnected { peer: 4 }
        ),
        "{err}"
    );
    for (text, says) in [
        (
            "3\n0 1\n1 5\n",
            "rank 5 is listed but the first line says 3 peers",
        ),
        ("0 1\n1 1\n", "line 2: the edge 1 1 joins a peer to itself"),
        ("0 1 2\n", "line 1: expected two ranks"),
        ("7\n", "edge list without an edge"),
    ] {
        let err = TopologySpec::parse(text).unwrap_err().to_string();
        assert!(err.contains(says), "{text:?}: {err}");
    }
    // TOML is still TOML, with toml's own errors.
    let err = TopologySpec::parse("topology = ").unwrap_err().to_string();
    assert!(err.contains("invalid topology file"), "{err}");
}

/// decentralizepy's adjacency list (n, then line i lists peer i's neighbours) and NetworkX's
/// `write_edgelist` lines with their data dictionary load as the same graph as the edge
/// list; every graph `topology export` writes loads back to the same W in every format.
#[test]
fn adjacency_lists_and_exported_graph_texts_load_back_to_the_same_graph() {
    let ring = TopologySpec::named("ring").unwrap().build(Some(4)).unwrap();
    // Line i lists i's neighbours; four lines of two ranks, yet not an edge list.
    let adjacency = "4\n1 3\n0 2\n1 3\n0 2\n";
    let networkx = "0 1 {}\n1 2 {}\n2 3 {'weight': 1}\n3 0 {}\n";
    for text in [adjacency, networkx] {
        let t = TopologySpec::parse(text).unwrap().build(None).unwrap();
        assert_eq!(t.graph, ring.graph, "{text}");
    }
    for (name, n) in [
        ("torus", 16),
        ("hypercube", 8),
        ("complete", 6),
        ("star", 5),
    ] {
        let t = TopologySpec::named(name).unwrap().build(Some(n)).unwrap();
        for format in ["edges", "adjacency", "edgelist"] {
            let text = TopologySpec::write_graph(&t.graph, format.parse().unwrap());
            let back = TopologySpec::parse(&text).unwrap().build(None).unwrap();
            assert_eq!(back.graph, t.graph, "{name} as {format}");
            assert_eq!(back.w, t.w, "{name} as {format}");
        }
    }
    assert!("dot"
        .parse::<GraphFormat>()
        .unwrap_err()
        .contains("edgelist"));
    // Neither TOML nor a graph text: the error names the forms.
    let err = TopologySpec::parse("hello world\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("neither TOML") && err.contains("adjacency list"),
        "{err}"
    );
}

#[test]
fn neighbors_are_both_ends_of_a_peer_s_edges_each_once() {
    // 0 -> 1, 2 -> 0, 0 <-> 3 (both directions), 1 -> 2.
    let g = Graph::from_edges(4, &[(0, 1), (2, 0), (0, 3), (3, 0), (1, 2)], true).unwrap();
    assert_eq!(g.neighbors(0), vec![1, 2, 3]);
    assert_eq!(g.neighbors(1), vec![0, 2]);
    assert_eq!(g.neighbors(3), vec![0]);
    assert_eq!(Graph::ring(5).unwrap().neighbors(0), vec![1, 4]);
}
