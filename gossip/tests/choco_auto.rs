//! CHOCO-SGD with per-link compressors (`choco-auto`): the choice follows the measured
//! bandwidth, and mixing keeps the network average and reaches consensus whatever each link
//! sends.

use murmur_gossip::sim::Sim;
use murmur_gossip::{ChocoAuto, ChocoAutoConfig, Gossip, Ladder};

mod common;
use common::ring_mh;

/// 8-ring peers with x0 = `xs`; every link measured at `fast` bytes/s except 3 ↔ 4 at
/// `slow` (one sample per link, as the transport would give after round 0); γ = 0.1, the
/// default (with top-k on a link, γ = 0.3 stalls at Ξ²/Ξ²(0) ≈ 3·10⁻⁵ on this ring).
fn ring_with_one_slow_link(xs: &[Vec<f32>], fast: f64, slow: f64) -> Vec<Box<dyn Gossip>> {
    let w = ring_mh(xs.len());
    (0..xs.len())
        .map(|i| {
            let cfg = ChocoAutoConfig::from_matrix(&w, i, 0.0, 0.1).unwrap();
            let mut p = ChocoAuto::new(cfg, xs[i].clone());
            for (j, _) in w.in_weights(i) {
                let rate = if (i, j) == (3, 4) || (i, j) == (4, 3) {
                    slow
                } else {
                    fast
                };
                // A 1 MB frame timed at the link's rate.
                p.observe_link(j, 1 << 20, (1 << 20) as f64 / rate);
            }
            Box::new(p) as Box<dyn Gossip>
        })
        .collect()
}

#[test]
fn a_slow_link_gets_a_smaller_message_and_mixing_keeps_the_average() {
    let (n, d) = (8, 20_000);
    let xs = common::uniform_vectors(n, d, 1.0, 7);
    let mut sim = Sim::new(ring_with_one_slow_link(&xs, 100e6, 10e6));
    let xi0 = sim.consensus_distance();
    let avg0 = sim.average();
    let mut max_dev = 0.0f32;
    for _ in 0..600 {
        sim.run_round(None).unwrap();
        let dev = sim
            .average()
            .iter()
            .zip(&avg0)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        max_dev = max_dev.max(dev);
    }
    let xi = sim.consensus_distance();
    println!("Ξ²: {xi0:.3e} → {xi:.3e} in 600 rounds, average moved ≤ {max_dev:.2e}");
    assert!(xi < 1e-9 * xi0, "no consensus: Ξ²/Ξ²(0) = {:e}", xi / xi0);
    assert!(max_dev < 1e-5, "the average moved by {max_dev}");

    // The budget is the fast links' dense time: the slow link (10× slower) carries a
    // message of at most 1.25 (the slack) tenths of a dense one; every other link stays
    // dense.
    let ladder = Ladder::new(d);
    for i in 0..n {
        for link in sim.peer(i).link_choices() {
            let slow = (i, link.peer) == (3, 4) || (i, link.peer) == (4, 3);
            println!("{i} → {}: {}", link.peer, link.compressor);
            let rung = (0..ladder.len())
                .find(|&k| ladder.spec(k).to_string() == link.compressor)
                .expect("a rung of the ladder");
            if slow {
                assert!(
                    ladder.bytes(rung) * 8 <= ladder.bytes(0),
                    "slow link {i} → {}: {} ({} bytes)",
                    link.peer,
                    link.compressor,
                    ladder.bytes(rung)
                );
                assert!(link.compressor.starts_with("topk"), "{}", link.compressor);
            } else {
                assert_eq!(link.compressor, "identity", "{i} → {}", link.peer);
            }
            assert_eq!(link.rounds_by_compressor.len(), 1, "{link:?}");
        }
    }
}

#[test]
fn an_unmeasured_link_sends_dense_and_small_frames_give_no_sample() {
    let w = ring_mh(4);
    let cfg = ChocoAutoConfig::from_matrix(&w, 0, 0.0, 0.3).unwrap();
    let mut p = ChocoAuto::new(cfg, vec![1.0; 50_000]);
    assert_eq!(p.budget_secs(), None);
    // Under 16 KiB, or no time: ignored.
    p.observe_link(1, 1000, 0.5);
    p.observe_link(1, 1 << 20, 0.0);
    p.observe_link(2, 1 << 20, f64::NAN);
    assert_eq!(p.budget_secs(), None);
    assert!(p.links().iter().all(|l| l.bytes_per_sec.is_none()));
    // The median: a slow and a fast outlier around 1 MB/s leave it at 1 MB/s.
    p.observe_link(1, 1 << 20, 1.048_576);
    p.observe_link(1, 1 << 20, 10.0);
    p.observe_link(1, 1 << 20, 0.01);
    let rate = p.links()[0].bytes_per_sec.unwrap();
    assert!((rate - 1e6).abs() < 1.0, "{rate}");
    // Dense message on the only measured link: 200 kB at 1 MB/s.
    let t = p.budget_secs().unwrap();
    assert!((t - 0.2).abs() < 0.01, "{t}");
}

#[test]
fn a_directed_graph_is_refused() {
    let g = murmur_topology::Graph::exponential(8).unwrap();
    let w = murmur_topology::MixingMatrix::max_degree(&g).unwrap();
    let err = ChocoAutoConfig::from_matrix(&w, 0, 0.1, 0.1).unwrap_err();
    assert!(err.contains("symmetric"), "{err}");
}
