//! Gradient tracking and D² against D-PSGD on their papers' check: a strongly convex
//! quadratic whose minima differ from peer to peer (non-IID data in its simplest form).
//! f_i(x) = ½‖x − b_i‖², so ∇f_i(x) = x − b_i and the optimum of Σ_i f_i is x* = mean(b).
//! With a constant step, D-PSGD's peers stall at a distance ∝ η·ζ/(1 − λ) from x* (ζ: the
//! spread of the b_i); gradient tracking (Pu & Nedić 2020, Thm 1 with exact gradients) and
//! D² (Tang et al. 2018, Thm 1) converge linearly to x* itself.

mod common;

use common::{build, ring};
use murmur_gossip::registry::{check_run, AlgorithmSpec, RunSetup};
use murmur_gossip::sim::Sim;
use murmur_gossip::{AlgorithmOptions, Gossip, MembershipError};

const N: usize = 8;
const D: usize = 4;
const LR: f32 = 0.1;

/// The peers' minima b_i: `N × [D]`, spread over ±10 (heterogeneous on purpose).
fn minima() -> Vec<Vec<f32>> {
    common::uniform_vectors(N, D, 10.0, 7)
}

/// x* = mean(b): `[D]`.
fn optimum(b: &[Vec<f32>]) -> Vec<f32> {
    common::serial_mean(b)
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

/// The peers of `algorithm` on the ring of N, all from x = 0.
fn peers(algorithm: &str) -> Vec<Box<dyn Gossip>> {
    let topo = ring(N);
    let options = AlgorithmOptions::default();
    (0..N)
        .map(|i| build(algorithm, &topo, i, vec![0.0; D], LR, &options).unwrap())
        .collect()
}

/// Runs `rounds` rounds with exact gradients x_i − b_i; returns max_i ‖x_i − x*‖∞.
fn run(sim: &mut Sim, b: &[Vec<f32>], rounds: usize) -> f32 {
    for _ in 0..rounds {
        let grads: Vec<Vec<f32>> = (0..N)
            .map(|i| {
                let x = sim.peer(i).params();
                x.iter().zip(&b[i]).map(|(x, b)| x - b).collect()
            })
            .collect();
        sim.run_round(Some(&grads)).unwrap();
    }
    let star = optimum(b);
    (0..N)
        .map(|i| common::max_abs_diff(sim.peer(i).params(), &star))
        .fold(0.0, f32::max)
}

#[test]
fn dpsgd_stalls_at_a_bias_floor_where_tracking_and_d2_reach_the_optimum() {
    let b = minima();
    let mut dpsgd = Sim::new(peers("dpsgd"));
    let early = run(&mut dpsgd, &b, 300);
    let late_dpsgd = run(&mut dpsgd, &b, 300);
    eprintln!("dpsgd: {early} after 300 rounds, {late_dpsgd} after 600");
    assert!(
        late_dpsgd > 0.1 && late_dpsgd > 0.9 * early,
        "D-PSGD should stall at its bias floor: {early} after 300 rounds, {late_dpsgd} after 600"
    );
    for algorithm in ["gradient-tracking", "d2"] {
        let mut sim = Sim::new(peers(algorithm));
        let early = run(&mut sim, &b, 300);
        let late = run(&mut sim, &b, 300);
        eprintln!("{algorithm}: {early} after 300 rounds, {late} after 600");
        // Gradient tracking to f32's precision; D² within its round-off drift (d2.rs).
        let tolerance = if algorithm == "d2" { 2e-3 } else { 1e-5 };
        assert!(
            late < tolerance && late < 1e-3 * late_dpsgd,
            "{algorithm} should converge to x*: {early} from it after 300 rounds, {late} after 600 (D-PSGD: {late_dpsgd})"
        );
    }
}

#[test]
fn tracking_sends_twice_dpsgd_s_bytes_and_d2_the_same() {
    let b = minima();
    let bytes = |algorithm: &str| {
        let mut sim = Sim::new(peers(algorithm));
        run(&mut sim, &b, 10);
        sim.peer(0).stats().bytes_sent
    };
    let (dpsgd, gt, d2) = (bytes("dpsgd"), bytes("gradient-tracking"), bytes("d2"));
    assert_eq!(d2, dpsgd);
    // 2d values in one frame: d more f32 per frame (10 rounds, 2 out-neighbours), one header.
    assert_eq!(gt - dpsgd, 10 * 2 * 4 * D as u64);
}

#[test]
fn a_whole_run_resumes_from_the_checkpointed_state_bit_for_bit() {
    let b = minima();
    for algorithm in ["gradient-tracking", "d2"] {
        let mut straight = Sim::new(peers(algorithm));
        run(&mut straight, &b, 40);
        let mut first = Sim::new(peers(algorithm));
        run(&mut first, &b, 25);
        // The checkpoint: x, the round and the algorithm's state, as `murmur peer` saves them.
        let saved: Vec<_> = (0..N)
            .map(|i| (first.peer(i).params().to_vec(), first.peer(i).state()))
            .collect();
        let topo = ring(N);
        let resumed: Vec<Box<dyn Gossip>> = saved
            .into_iter()
            .enumerate()
            .map(|(i, (x, state))| {
                let options = AlgorithmOptions::default();
                let mut p = build(algorithm, &topo, i, x, LR, &options).unwrap();
                p.start_at_round(25).unwrap();
                p.restore_state(&state).unwrap();
                p
            })
            .collect();
        let mut resumed = Sim::new(resumed);
        run(&mut resumed, &b, 15);
        for i in 0..N {
            assert_eq!(
                resumed.peer(i).params(),
                straight.peer(i).params(),
                "{algorithm}, peer {i}"
            );
        }
        // A state of another algorithm is refused.
        let mut p = build(algorithm, &topo, 0, vec![0.0; D], LR, &Default::default()).unwrap();
        let other = if algorithm == "d2" {
            "gradient-tracking"
        } else {
            "d2"
        };
        let mut q = Sim::new(peers(other));
        run(&mut q, &b, 1);
        assert!(p.restore_state(&q.peer(0).state()).is_err());
    }
}

#[test]
fn departures_end_the_run_and_d2_refuses_compressors_before_it_starts() {
    let topo = ring(N);
    for algorithm in ["gradient-tracking", "d2"] {
        let mut p = build(algorithm, &topo, 0, vec![0.0; D], LR, &Default::default()).unwrap();
        let w = topo.w.without_peers(&[1]).unwrap().w;
        assert!(matches!(
            p.peer_left(1, &w),
            Err(MembershipError::Unsupported { .. })
        ));
    }
    let takes = |a: &str| {
        let spec: AlgorithmSpec = a.parse().unwrap();
        spec.capabilities().compresses.takes_compressor()
    };
    assert!(!takes("d2"));
    assert!(takes("gradient-tracking"), "compressed as BEER");
    // D² mixes on (I + W)/2, which needs a symmetric W: a directed graph is refused.
    let directed = common::topology("exponential", N);
    assert!(!directed.w.graph().is_symmetric());
    let options = AlgorithmOptions::default();
    let run = RunSetup {
        options: &options,
        topology: Some(&directed),
        skip_policy: false,
        auto_deadline: false,
    };
    let err = check_run(&["d2".parse().unwrap()], &run).unwrap_err();
    assert!(err.to_string().contains("exponential"), "{err}");
    assert!(check_run(&["gradient-tracking".parse().unwrap()], &run).is_ok());
}

/// The peers of `algorithm` on the ring of N from x = 0, `[d]`, with `compressor` and γ.
fn compressed_peers(
    algorithm: &str,
    d: usize,
    compressor: &str,
    gamma: f32,
) -> Vec<Box<dyn Gossip>> {
    compressed_peers_from(algorithm, vec![vec![0.0; d]; N], compressor, gamma)
}

/// The peers of `algorithm` on the ring of N, peer i from `x0[i]`, with `compressor` and γ.
fn compressed_peers_from(
    algorithm: &str,
    x0: Vec<Vec<f32>>,
    compressor: &str,
    gamma: f32,
) -> Vec<Box<dyn Gossip>> {
    let topo = ring(N);
    let options = AlgorithmOptions {
        compressor: Some(compressor.parse().unwrap()),
        gamma: Some(gamma),
        ..Default::default()
    };
    x0.into_iter()
        .enumerate()
        .map(|(i, x)| build(algorithm, &topo, i, x, LR, &options).unwrap())
        .collect()
}

#[test]
fn compressed_tracking_reaches_the_optimum_where_choco_sgd_with_the_same_operator_stalls() {
    // BEER's claim (Zhao et al. 2022) on the non-IID quadratic: top-k 20% of the stacked
    // [x − ηy; y], CHOCO's copies on both halves, against CHOCO-SGD with the same top-k.
    let d = 20;
    let b = common::uniform_vectors(N, d, 10.0, 8);
    let (compressor, gamma) = ("topk:0.2", 0.4);
    let mut choco = Sim::new(compressed_peers("choco", d, compressor, gamma));
    let early_choco = run(&mut choco, &b, 1000);
    let late_choco = run(&mut choco, &b, 1000);
    let mut gt = Sim::new(compressed_peers("gradient-tracking", d, compressor, gamma));
    let early = run(&mut gt, &b, 1000);
    let late = run(&mut gt, &b, 1000);
    eprintln!(
        "choco: {early_choco} after 1000 rounds, {late_choco} after 2000; \
         compressed tracking: {early} and {late}"
    );
    assert!(
        late_choco > 0.1 && late_choco > 0.9 * early_choco,
        "CHOCO-SGD stalls at its bias floor: {early_choco}, then {late_choco}"
    );
    assert!(
        late < 1e-3 && late < 1e-3 * late_choco,
        "compressed tracking converges to x*: {early}, then {late} (CHOCO-SGD {late_choco})"
    );
    // Compressed bytes: top-k of 2d values per frame, under the uncompressed tracker's.
    let mut exact = Sim::new(peers_d("gradient-tracking", d));
    run(&mut exact, &b, 10);
    let mut gt = Sim::new(compressed_peers("gradient-tracking", d, compressor, gamma));
    run(&mut gt, &b, 10);
    let (c, e) = (
        gt.peer(0).stats().bytes_sent,
        exact.peer(0).stats().bytes_sent,
    );
    assert!(c < e, "compressed {c} bytes against {e}");
    // Its state (z and CHOCO's copies) resumes bit for bit.
    let saved: Vec<_> = (0..N)
        .map(|i| (gt.peer(i).params().to_vec(), gt.peer(i).state()))
        .collect();
    let mut straight = Sim::new(compressed_peers("gradient-tracking", d, compressor, gamma));
    run(&mut straight, &b, 15);
    let x0 = saved.iter().map(|s| s.0.clone()).collect();
    let mut resumed = compressed_peers_from("gradient-tracking", x0, compressor, gamma);
    for (i, p) in resumed.iter_mut().enumerate() {
        p.start_at_round(10).unwrap();
        p.restore_state(&saved[i].1).unwrap();
    }
    let mut resumed = Sim::new(resumed);
    run(&mut resumed, &b, 5);
    for i in 0..N {
        assert_eq!(
            resumed.peer(i).params(),
            straight.peer(i).params(),
            "peer {i}"
        );
    }
}

/// The peers of `algorithm` on the ring of N from x = 0, `[d]`, default options.
fn peers_d(algorithm: &str, d: usize) -> Vec<Box<dyn Gossip>> {
    let topo = ring(N);
    (0..N)
        .map(|i| {
            build(
                algorithm,
                &topo,
                i,
                vec![0.0; d],
                LR,
                &AlgorithmOptions::default(),
            )
            .unwrap()
        })
        .collect()
}
