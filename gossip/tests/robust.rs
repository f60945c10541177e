//! Byzantine-robust gossip: D-PSGD and CHOCO-SGD with ClippedGossip (`--robust`), against attacking peers
//! ([`murmur_gossip::Byzantine`]).

use std::time::Duration;

use murmur_gossip::sim::Sim;
use murmur_gossip::{AlgorithmOptions, AlgorithmSpec, Attack, Byzantine, ClipRule, Gossip};
use murmur_topology::Topology;

mod common;
use common::{build_with_skip, max_abs_diff, topology, uniform_vectors};

/// D-PSGD peers on `topo` from `x0`, with `robust`, and `attackers` wrapped.
fn peers(
    topo: &Topology,
    x0: &[Vec<f32>],
    robust: Option<ClipRule>,
    attackers: &[(usize, Attack)],
) -> Vec<Box<dyn Gossip>> {
    peers_of("dpsgd", topo, x0, robust, attackers)
}

/// Peers of `algorithm` (H = 2 for those with local steps; CHOCO with the identity, whose
/// attackers set their public copy: [`Byzantine::with_increments`]).
fn peers_of(
    algorithm: &str,
    topo: &Topology,
    x0: &[Vec<f32>],
    robust: Option<ClipRule>,
    attackers: &[(usize, Attack)],
) -> Vec<Box<dyn Gossip>> {
    let spec: AlgorithmSpec = algorithm.parse().unwrap();
    let opts = AlgorithmOptions {
        robust,
        local_steps: spec.capabilities().has_local_steps().then_some(2),
        outer_optimizer: (algorithm == "diloco-gossip")
            .then_some(murmur_gossip::OuterOptimizer::Sgd),
        compressor: (algorithm == "choco").then_some(murmur_compress::CompressorSpec::Identity),
        ..Default::default()
    };
    (0..x0.len())
        .map(|i| {
            let p = build_with_skip(algorithm, topo, i, x0[i].clone(), 0.1, &opts, None).unwrap();
            match attackers.iter().find(|(r, _)| *r == i) {
                Some((_, a)) => Box::new(Byzantine::new(p, *a, 99).with_increments(
                    spec.capabilities().compresses == murmur_gossip::Compresses::Increments,
                )) as Box<dyn Gossip>,
                None => p,
            }
        })
        .collect()
}

/// The mean of the honest peers' parameters and their largest distance from `centre`.
fn honest_spread(sim: &Sim, honest: &[usize], centre: &[f32]) -> f64 {
    honest
        .iter()
        .map(|&i| murmur_gossip::mixing::robust::distance(sim.peer(i).params(), centre))
        .fold(0.0, f64::max)
}

fn mean_of(xs: &[Vec<f32>], who: &[usize]) -> Vec<f32> {
    let d = xs[0].len();
    (0..d)
        .map(|k| who.iter().map(|&i| xs[i][k]).sum::<f32>() / who.len() as f32)
        .collect()
}

#[test]
fn a_radius_no_neighbour_reaches_is_plain_gossip() {
    let (n, d) = (9, 30);
    let topo = topology("torus", n);
    let x0 = uniform_vectors(n, d, 1.0, 3);
    let mut plain = Sim::new(peers(&topo, &x0, None, &[]));
    let mut wide = Sim::new(peers(&topo, &x0, Some(ClipRule::Fixed(1e6)), &[]));
    for t in 0..20 {
        let g = uniform_vectors(n, d, 1.0, 100 + t);
        plain.run_round(Some(&g)).unwrap();
        wide.run_round(Some(&g)).unwrap();
    }
    for i in 0..n {
        let e = max_abs_diff(plain.peer(i).params(), wide.peer(i).params());
        assert!(e < 1e-5, "peer {i}: {e}");
    }
}

#[test]
fn clipping_keeps_honest_peers_near_their_average_when_plain_gossip_is_dragged_away() {
    let (n, d) = (9, 20);
    let topo = topology("torus", n);
    let x0 = uniform_vectors(n, d, 1.0, 5);
    let honest: Vec<usize> = (0..n).filter(|&i| i != 4).collect();
    let centre = mean_of(&x0, &honest);
    for attack in [
        Attack::Constant { c: 100.0 },
        Attack::SignFlip,
        Attack::Noise { sigma: 10.0 },
    ] {
        let mut plain = Sim::new(peers(&topo, &x0, None, &[(4, attack)]));
        let mut clip = Sim::new(peers(
            &topo,
            &x0,
            Some(ClipRule::Adaptive { byzantine: 1 }),
            &[(4, attack)],
        ));
        plain.run_rounds(60).unwrap();
        clip.run_rounds(60).unwrap();
        let (p, c) = (
            honest_spread(&plain, &honest, &centre),
            honest_spread(&clip, &honest, &centre),
        );
        println!("{attack}: plain {p:.3}, clipped {c:.3} from the honest start average");
        // The honest start vectors lie within √d ≈ 4.5 of their average.
        assert!(c < 3.0, "{attack}: clipped gossip drifted {c}");
        assert!(p > 2.0 * c, "{attack}: plain {p} vs clipped {c}");
    }
}

#[test]
fn a_byzantine_peer_sends_the_attack_and_keeps_the_schedule() {
    let (n, d) = (3, 4);
    let topo = topology("ring", n);
    let x0 = uniform_vectors(n, d, 1.0, 8);
    let mut honest = Sim::new(peers(&topo, &x0, None, &[]));
    let mut flipped = Sim::new(peers(&topo, &x0, None, &[(2, Attack::SignFlip)]));
    honest.run_round(None).unwrap();
    flipped.run_round(None).unwrap();
    // Peer 0 mixes with weight W_02 = 1/3 (ring of 3 under Metropolis–Hastings): the
    // attack moves it by 1/3 · (−x_2 − x_2).
    let (h0, f0) = (honest.peer(0).params(), flipped.peer(0).params());
    for ((h, f), x2) in h0.iter().zip(f0).zip(&x0[2]) {
        assert!((f - (h - 2.0 / 3.0 * x2)).abs() < 1e-6);
    }
    // The attacker itself mixes honestly.
    assert_eq!(flipped.peer(2).params(), honest.peer(2).params());
    let mut constant = Sim::new(peers(&topo, &x0, None, &[(1, Attack::Constant { c: 7.0 })]));
    constant.run_round(None).unwrap();
    let c0 = constant.peer(0).params();
    for ((h, c), x1) in h0.iter().zip(c0).zip(&x0[1]) {
        assert!((c - (h + (7.0 - x1) / 3.0)).abs() < 1e-5);
    }
}

#[test]
fn attacks_and_rules_parse_and_bad_ones_are_refused() {
    for s in ["signflip", "noise:2", "alie:1.5", "constant:-3"] {
        assert_eq!(s.parse::<Attack>().unwrap().to_string(), s);
    }
    for bad in ["flip", "noise:0", "alie:-1", "constant:x", "signflip:2", ""] {
        assert!(bad.parse::<Attack>().is_err(), "{bad}");
    }
    let spec: murmur_gossip::ByzantineSpec = "3:alie".parse().unwrap();
    assert_eq!(spec.to_string(), "3:alie:1");
    assert!("x:alie".parse::<murmur_gossip::ByzantineSpec>().is_err());
    assert!("3".parse::<murmur_gossip::ByzantineSpec>().is_err());

    // --robust is for the algorithms that mix models or copies: SGP and the skip policy
    // refuse it.
    let opts = AlgorithmOptions {
        robust: Some(ClipRule::Adaptive { byzantine: 1 }),
        ..Default::default()
    };
    let e = opts
        .validate(&["sgp".parse().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--robust") && e.contains("dpsgd"), "{e}");
    let topo = topology("ring", 4);
    let e = match build_with_skip(
        "dpsgd",
        &topo,
        0,
        vec![0.0; 3],
        0.1,
        &opts,
        Some(Duration::from_secs(1)),
    ) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("--robust with skip was accepted"),
    };
    assert!(e.contains("--straggler-policy skip"), "{e}");
}

#[test]
fn local_sgd_and_decentralized_diloco_clip_their_model_mixing_too() {
    let (n, d) = (9, 20);
    let topo = topology("torus", n);
    let x0 = uniform_vectors(n, d, 1.0, 6);
    let honest: Vec<usize> = (0..n).filter(|&i| i != 4).collect();
    let centre = mean_of(&x0, &honest);
    let attack = [(4, Attack::Constant { c: 100.0 })];
    for algorithm in ["local-sgd", "diloco-gossip"] {
        let mut plain = Sim::new(peers_of(algorithm, &topo, &x0, None, &attack));
        let rule = Some(ClipRule::Adaptive { byzantine: 1 });
        let mut clip = Sim::new(peers_of(algorithm, &topo, &x0, rule, &attack));
        plain.run_rounds(60).unwrap();
        clip.run_rounds(60).unwrap();
        let (p, c) = (
            honest_spread(&plain, &honest, &centre),
            honest_spread(&clip, &honest, &centre),
        );
        println!("{algorithm}: plain {p:.3}, clipped {c:.3}");
        assert!(
            c < 3.0 && p > 10.0 * c,
            "{algorithm}: plain {p}, clipped {c}"
        );
    }
}

#[test]
fn choco_clips_the_public_copies_it_mixes() {
    let (n, d) = (9, 20);
    let topo = topology("torus", n);
    let x0 = uniform_vectors(n, d, 1.0, 7);
    let honest: Vec<usize> = (0..n).filter(|&i| i != 4).collect();
    let centre = mean_of(&x0, &honest);
    for attack in [Attack::Constant { c: 100.0 }, Attack::SignFlip] {
        let att = [(4, attack)];
        let mut plain = Sim::new(peers_of("choco", &topo, &x0, None, &att));
        let rule = Some(ClipRule::Adaptive { byzantine: 1 });
        let mut clip = Sim::new(peers_of("choco", &topo, &x0, rule, &att));
        plain.run_rounds(60).unwrap();
        clip.run_rounds(60).unwrap();
        let (p, c) = (
            honest_spread(&plain, &honest, &centre),
            honest_spread(&clip, &honest, &centre),
        );
        println!("choco, {attack}: plain {p:.3}, clipped {c:.3}");
        assert!(c < 3.0 && p > 2.0 * c, "{attack}: plain {p}, clipped {c}");
    }
    // Without attackers a radius nobody reaches is plain CHOCO.
    let mut plain = Sim::new(peers_of("choco", &topo, &x0, None, &[]));
    let mut wide = Sim::new(peers_of(
        "choco",
        &topo,
        &x0,
        Some(ClipRule::Fixed(1e6)),
        &[],
    ));
    plain.run_rounds(20).unwrap();
    wide.run_rounds(20).unwrap();
    for i in 0..n {
        assert_eq!(plain.peer(i).params(), wide.peer(i).params(), "peer {i}");
    }
}

#[test]
fn a_byzantine_choco_peer_sets_its_public_copy_to_the_attack() {
    // Ring of 3, identity CHOCO, γ = 0.5: after round 0 peer 0's copy of peer 2 is the
    // attacker's constant 7 instead of x_2, so x_0 moves by γ W_02 (7 − x_2) more.
    let (n, d) = (3, 4);
    let topo = topology("ring", n);
    let x0 = uniform_vectors(n, d, 1.0, 9);
    let att = [(2, Attack::Constant { c: 7.0 })];
    let mut honest = Sim::new(peers_of("choco", &topo, &x0, None, &[]));
    let mut attacked = Sim::new(peers_of("choco", &topo, &x0, None, &att));
    honest.run_round(None).unwrap();
    attacked.run_round(None).unwrap();
    let (h0, a0) = (honest.peer(0).params(), attacked.peer(0).params());
    for ((h, a), x2) in h0.iter().zip(a0).zip(&x0[2]) {
        let want = h + 0.5 / 3.0 * (7.0 - x2);
        assert!((a - want).abs() < 1e-5, "{a} vs {want}");
    }
    // The copy stays at 7 (q = 7 − x̂_b, not 7 again): a second round adds γ W_02
    // (7 − x̂_0) once more, no more.
    honest.run_round(None).unwrap();
    attacked.run_round(None).unwrap();
    let e = max_abs_diff(honest.peer(0).params(), attacked.peer(0).params());
    assert!(e > 0.5 && e < 10.0, "{e}");
}
