//! Local-SGD gossip with a period per link (`local-auto`): on equal links it is local-SGD
//! gossip (up to rounding); a slow link mixes less often without slowing the rounds; mixing keeps
//! the network average whatever the timing; bad snapshots are refused.

use murmur_gossip::algorithms::local_auto::AsyncLinks;
use murmur_gossip::registry::AlgorithmOptions;
use murmur_gossip::{Compute, Gossip, NetSim, NetworkModel};

mod common;
use common::{build, raw_frame, ring, ring_mh};

/// n peers of `algorithm` on the n-ring (H = `h`, η = 0.01) from `xs`.
fn peers(algorithm: &str, xs: &[Vec<f32>], h: u64) -> Vec<Box<dyn Gossip>> {
    let topo = ring(xs.len());
    let options = AlgorithmOptions {
        local_steps: Some(h),
        ..Default::default()
    };
    (0..xs.len())
        .map(|i| build(algorithm, &topo, i, xs[i].clone(), 0.01, &options).unwrap())
        .collect()
}

/// Runs `rounds` steps on the simulated network (1 Gb/s NICs; with `slow`, the path 3 ↔ 4
/// at 100 Mb/s), 10 ms of compute a step, with seeded gradients (none: `grads` false).
/// Returns the network and the mean step time in seconds.
fn run(peers: Vec<Box<dyn Gossip>>, slow: bool, rounds: u64, grads: bool) -> (NetSim, f64) {
    let mut model = NetworkModel::gbps(1.0);
    if slow {
        model = model
            .with_link_bandwidth(3, 4, 12.5e6)
            .with_link_bandwidth(4, 3, 12.5e6);
    }
    let mut net = NetSim::new(peers, model).unwrap();
    let d = net.d();
    let report = net
        .run_rounds(rounds, |rank, round, _| Compute {
            grad: grads.then(|| {
                common::uniform_vectors(1, d, 0.01, rank as u64 * 1000 + round)[0].clone()
            }),
            seconds: 0.010,
        })
        .unwrap();
    (net, report.mean_round_secs())
}

fn params(net: &NetSim) -> Vec<Vec<f32>> {
    (0..net.n())
        .map(|i| net.peer(i).unwrap().params().to_vec())
        .collect()
}

#[test]
fn on_equal_links_it_is_local_sgd_gossip_up_to_rounding() {
    let (n, d) = (8, 50_000);
    let xs = common::uniform_vectors(n, d, 1.0, 5);
    let (sgd, t_sgd) = run(peers("local-sgd", &xs, 2), false, 40, true);
    let (auto, t_auto) = run(peers("local-auto", &xs, 2), false, 40, true);
    let (a, b) = (params(&sgd), params(&auto));
    let diff = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    // D-PSGD sums Σ_j w_ij y_j, local-auto y_i + Σ_j w_ij (y_j − y_i): the same mix, rounded
    // differently.
    assert!(diff < 1e-5, "the models differ by up to {diff}");
    assert_eq!(
        t_sgd, t_auto,
        "the same rounds take the same simulated time"
    );
}

#[test]
fn on_equal_links_diloco_auto_is_diloco_gossip_up_to_rounding() {
    let (n, d) = (8, 100_000);
    let xs = common::uniform_vectors(n, d, 1.0, 6);
    let (gossip, t_gossip) = run(peers("diloco-gossip", &xs, 2), false, 40, true);
    let (auto, t_auto) = run(peers("diloco-auto", &xs, 2), false, 40, true);
    let diff = params(&gossip)
        .iter()
        .flatten()
        .zip(params(&auto).iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "the models differ by up to {diff}");
    assert_eq!(t_gossip, t_auto);
    // With the slow link, its outer steps do not wait for it.
    let (_, slow_auto) = run(peers("diloco-auto", &xs, 2), true, 40, true);
    let (_, slow_gossip) = run(peers("diloco-gossip", &xs, 2), true, 40, true);
    println!(
        "mean step: all fast {:.2} ms; slow link: diloco-auto {:.2} ms, diloco-gossip {:.2} ms",
        t_auto * 1e3,
        slow_auto * 1e3,
        slow_gossip * 1e3
    );
    assert!(slow_auto < 1.2 * t_auto, "{slow_auto} vs {t_auto}");
    assert!(slow_gossip > 1.5 * t_auto, "{slow_gossip} vs {t_auto}");
}

#[test]
fn a_slow_link_mixes_less_often_and_does_not_slow_the_rounds() {
    let (n, d) = (8, 200_000);
    let xs = common::uniform_vectors(n, d, 1.0, 3);
    let (_, fast) = run(peers("local-auto", &xs, 1), false, 60, true);
    let (net, auto) = run(peers("local-auto", &xs, 1), true, 60, true);
    let (_, sgd) = run(peers("local-sgd", &xs, 1), true, 60, true);
    println!(
        "mean step: all fast {:.2} ms; slow link: local-auto {:.2} ms ({:.2}×), local-sgd \
         {:.2} ms ({:.2}×)",
        fast * 1e3,
        auto * 1e3,
        auto / fast,
        sgd * 1e3,
        sgd / fast
    );
    assert!(auto < 1.2 * fast, "local-auto {auto} vs {fast}");
    assert!(sgd > 3.0 * fast, "local-sgd {sgd} vs {fast}");
    // The slow link's exchanges take several rounds each, the others' one.
    let links = net.peer(3).unwrap().link_choices();
    println!("{links:?}");
    let period = |peer: usize| {
        let l = links.iter().find(|l| l.peer == peer).unwrap();
        assert_eq!(l.what, "period");
        l.rounds_by_choice
            .iter()
            .map(|(p, k)| p.parse::<u64>().unwrap() * k)
            .sum::<u64>() as f64
            / l.rounds_by_choice.iter().map(|(_, k)| k).sum::<u64>() as f64
    };
    assert!(period(4) >= 3.0, "the slow link 3-4: {links:?}");
    assert!(
        period(2) < 1.0 + 1e-9,
        "the fast link 3-2 mixes every round: {links:?}"
    );
}

#[test]
fn mixing_keeps_the_average_and_reaches_consensus_with_a_slow_link() {
    let (n, d) = (8, 10_000);
    let xs = common::uniform_vectors(n, d, 1.0, 9);
    let avg0: Vec<f64> = (0..d)
        .map(|c| xs.iter().map(|x| f64::from(x[c])).sum::<f64>() / n as f64)
        .collect();
    let xi = |ps: &[Vec<f32>]| {
        ps.iter()
            .map(|x| {
                x.iter()
                    .zip(&avg0)
                    .map(|(a, m)| (f64::from(*a) - m).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / n as f64
    };
    // No gradients: pure gossip, whose average must not move.
    let (net, _) = run(peers("local-auto", &xs, 1), true, 400, false);
    let ps = params(&net);
    let moved = (0..d)
        .map(|c| (ps.iter().map(|x| f64::from(x[c])).sum::<f64>() / n as f64 - avg0[c]).abs())
        .fold(0.0, f64::max);
    let (xi0, xi_end) = (xi(&xs), xi(&ps));
    println!("Ξ²: {xi0:.3e} → {xi_end:.3e}; the average moved ≤ {moved:.2e}");
    // Snapshots still in flight when the run stops are mixed by one end only: the average
    // is exact up to them and f32 rounding.
    assert!(moved < 1e-4, "the average moved by {moved}");
    assert!(
        xi_end < 1e-6 * xi0,
        "no consensus: Ξ²/Ξ²(0) = {:e}",
        xi_end / xi0
    );
}

#[test]
fn bad_snapshots_are_refused_and_change_nothing() {
    let w = ring_mh(4);
    let d = 16;
    let mut p = AsyncLinks::new(
        &w,
        0,
        vec![0.0; d],
        1 << 20,
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    let now = std::time::Instant::now();
    let model = |round: u64, dim: u32, sender: usize, values: usize| {
        let mut payload = Vec::new();
        let x = vec![1.0f32; values];
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
        murmur_compress::Identity.compress(&x, &mut rng, &mut payload);
        raw_frame(sender, round, dim, &payload)
    };
    use murmur_compress::Compressor;
    for (why, from, frame) in [
        ("not a neighbour", 2, model(0, d as u32, 2, d)),
        (
            "index 2: only 0 and 1 are in the window",
            1,
            model(2, d as u32, 1, d),
        ),
        ("another d", 1, model(0, 8, 1, 8)),
        ("a model of the wrong length", 1, model(0, d as u32, 1, 8)),
        ("claims another sender", 1, model(0, d as u32, 3, d)),
    ] {
        assert!(p.handle_message(now, from, &frame).is_err(), "{why}");
    }
    p.handle_message(now, 1, &model(0, d as u32, 1, d)).unwrap();
    let again = p.handle_message(now, 1, &model(0, d as u32, 1, d));
    assert!(again.is_err(), "a duplicate");
    // Round 0 waits for every link (nothing measured): with 1's snapshot already in, it
    // still waits for 3's; once it comes, x_0 mixes both (w = 1/3 each, from 0 and 1).
    p.begin_round(now, &vec![0.0; d], None);
    assert!(p.poll_event().is_none());
    p.handle_message(now, 3, &model(0, d as u32, 3, d)).unwrap();
    assert!(p.poll_event().is_some());
    for &v in p.params() {
        assert!((v - 2.0 / 3.0).abs() < 1e-6, "{v}");
    }
}

#[test]
fn a_directed_graph_is_refused() {
    let g = murmur_topology::Graph::exponential(8).unwrap();
    let w = murmur_topology::MixingMatrix::max_degree(&g).unwrap();
    let err = AsyncLinks::new(
        &w,
        0,
        vec![0.0; 4],
        1 << 20,
        std::time::Duration::from_secs(1),
    )
    .err()
    .unwrap();
    assert!(err.contains("symmetric"), "{err}");
}
