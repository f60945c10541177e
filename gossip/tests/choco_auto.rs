//! CHOCO-SGD with per-link compressors (`choco-auto`): the choice follows the measured
//! bandwidth, and mixing keeps the network average and reaches consensus whatever each link
//! sends.

use murmur_gossip::sim::Sim;
use murmur_gossip::{ChocoAuto, ChocoAutoConfig, Gossip, Ladder};

mod common;
use common::ring_mh;

/// 8-ring peers with x0 = `xs`; every link measured at `fast` bytes/s except 3 ↔ 4 at
/// `slow` (one sample per link, as the transport would give after round 0); the default
/// steps: 0.1 on the compressed edge, 0.5 on the dense ones. (Before per-edge steps, one
/// γ = 0.3 on every edge stalled this test at Ξ²/Ξ²(0) ≈ 3·10⁻⁵.)
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
            println!("{i} → {}: {}", link.peer, link.choice);
            let rung = (0..ladder.len())
                .find(|&k| ladder.spec(k).to_string() == link.choice)
                .expect("a rung of the ladder");
            if slow {
                assert!(
                    ladder.bytes(rung) * 8 <= ladder.bytes(0),
                    "slow link {i} → {}: {} ({} bytes)",
                    link.peer,
                    link.choice,
                    ladder.bytes(rung)
                );
                assert!(link.choice.starts_with("topk"), "{}", link.choice);
                // Round 0, before the neighbour's first report, went dense: a direction is
                // judged by its receiver, not by the other direction's estimate.
                assert_eq!(link.rounds_by_choice.len(), 2, "{link:?}");
                assert!(
                    link.rounds_by_choice.contains(&("identity".to_string(), 1)),
                    "{link:?}"
                );
            } else {
                assert_eq!(link.choice, "identity", "{i} → {}", link.peer);
                assert_eq!(link.rounds_by_choice.len(), 1, "{link:?}");
            }
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
    // Samples of the direction 1 → 0 set the budget's scale (a dense message, 200 kB, at
    // 1 MB/s) but do not judge 0 → 1: still unmeasured, so still dense (on an asymmetric
    // link the other direction may be the slow one).
    p.observe_link(1, 1 << 20, 1.048_576);
    let t = p.budget_secs().unwrap();
    assert!((t - 0.2).abs() < 0.01, "{t}");
    assert!(p.links().iter().all(|l| l.bytes_per_sec.is_none()));
    // Peer 1's report of 0 → 1 (1 MB/s) measures it.
    let mut report = Vec::new();
    murmur_gossip::FrameHeader {
        kind: murmur_gossip::FrameKind::LinkRate,
        sender: 1,
        round: 0,
        dim: 50_000,
        payload_len: 8,
    }
    .emit(&mut report);
    report.extend_from_slice(&1e6f64.to_le_bytes());
    p.handle_message(std::time::Instant::now(), 1, &report)
        .unwrap();
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

#[test]
fn an_asymmetric_link_is_judged_by_the_direction_it_sends_on() {
    // 3 → 4 is slow, 4 → 3 fast: peer 4 measures the slow direction (frames from 3) and
    // tells peer 3, which compresses; peer 3 measures a fast link from 4 and tells peer 4,
    // which stays dense.
    let (n, d) = (8, 20_000);
    let w = ring_mh(n);
    let xs = common::uniform_vectors(n, d, 1.0, 11);
    let peers: Vec<Box<dyn Gossip>> = (0..n)
        .map(|i| {
            let cfg = ChocoAutoConfig::from_matrix(&w, i, 0.0, 0.1).unwrap();
            let mut p = ChocoAuto::new(cfg, xs[i].clone());
            for (j, _) in w.in_weights(i) {
                // What peer i measures of the link j → i.
                let rate = if (j, i) == (3, 4) { 10e6 } else { 100e6 };
                p.observe_link(j, 1 << 20, (1 << 20) as f64 / rate);
            }
            Box::new(p) as Box<dyn Gossip>
        })
        .collect();
    let mut sim = Sim::new(peers);
    // Round 0 sends the reports; from round 1 on the choice uses them.
    for _ in 0..3 {
        sim.run_round(None).unwrap();
    }
    let link = |i: usize, j: usize| {
        sim.peer(i)
            .link_choices()
            .into_iter()
            .find(|l| l.peer == j)
            .unwrap()
    };
    let (slow, back) = (link(3, 4), link(4, 3));
    println!("3 → 4: {slow:?}\n4 → 3: {back:?}");
    assert!(slow.choice.starts_with("topk"), "{slow:?}");
    assert!((slow.bytes_per_sec.unwrap() - 10e6).abs() < 1.0, "{slow:?}");
    assert_eq!(back.choice, "identity", "{back:?}");
    assert!(
        (back.bytes_per_sec.unwrap() - 100e6).abs() < 1.0,
        "{back:?}"
    );
}

#[test]
fn a_bad_link_rate_report_is_refused_and_changes_nothing() {
    let w = ring_mh(4);
    let cfg = ChocoAutoConfig::from_matrix(&w, 0, 0.0, 0.1).unwrap();
    let mut p = ChocoAuto::new(cfg, vec![0.0; 100]);
    let report = |sender: u32, payload: &[u8]| {
        let mut f = Vec::new();
        murmur_gossip::FrameHeader {
            kind: murmur_gossip::FrameKind::LinkRate,
            sender: sender as usize,
            round: 0,
            dim: 100,
            payload_len: payload.len() as u32,
        }
        .emit(&mut f);
        f.extend_from_slice(payload);
        f
    };
    let now = std::time::Instant::now();
    for (from, payload) in [
        (1, f64::NAN.to_le_bytes().to_vec()),
        (1, (-5.0f64).to_le_bytes().to_vec()),
        (1, vec![0u8; 4]),
        (2, 1e6f64.to_le_bytes().to_vec()), // not a neighbour of 0 on the 4-ring
    ] {
        assert!(
            p.handle_message(now, from, &report(from as u32, &payload))
                .is_err(),
            "{from}: {payload:?}"
        );
    }
    assert!(p.links().iter().all(|l| l.bytes_per_sec.is_none()));
    p.handle_message(now, 1, &report(1, &2e6f64.to_le_bytes()))
        .unwrap();
    let l1 = p.links().into_iter().find(|l| l.peer == 1).unwrap();
    assert_eq!(l1.bytes_per_sec, Some(2e6));
}

/// 8-ring on the simulated network: NICs at 1 Gb/s, the path 3 ↔ 4 at 100 Mb/s (10×
/// slower), 10 ms of compute a round, 40 rounds of gossip with random gradients; returns the
/// mean round time in seconds.
fn simulated_round_secs(peers: Vec<Box<dyn Gossip>>, slow: bool) -> f64 {
    use murmur_gossip::{Compute, NetSim, NetworkModel};
    let mut model = NetworkModel::gbps(1.0);
    if slow {
        model = model
            .with_link_bandwidth(3, 4, 12.5e6)
            .with_link_bandwidth(4, 3, 12.5e6);
    }
    let mut net = NetSim::new(peers, model).unwrap();
    let d = net.d();
    let report = net
        .run_rounds(40, |rank, round, _| Compute {
            grad: Some(common::uniform_vectors(1, d, 0.01, rank as u64 * 1000 + round)[0].clone()),
            seconds: 0.010,
        })
        .unwrap();
    report.mean_round_secs()
}

#[test]
fn on_the_simulated_network_a_slow_link_costs_choco_auto_little_and_choco_much() {
    let (n, d) = (8, 200_000);
    let w = ring_mh(n);
    let xs = common::uniform_vectors(n, d, 1.0, 3);
    let auto = |_: ()| -> Vec<Box<dyn Gossip>> {
        (0..n)
            .map(|i| {
                let cfg = ChocoAutoConfig::from_matrix(&w, i, 0.01, 0.1).unwrap();
                Box::new(ChocoAuto::new(cfg, xs[i].clone())) as Box<dyn Gossip>
            })
            .collect()
    };
    let dense = |_: ()| -> Vec<Box<dyn Gossip>> {
        (0..n)
            .map(|i| {
                let cfg = murmur_gossip::ChocoConfig::from_matrix(&w, i, 0.01, 0.1, d);
                Box::new(murmur_gossip::Choco::new(
                    cfg,
                    xs[i].clone(),
                    Box::new(murmur_compress::Identity),
                )) as Box<dyn Gossip>
            })
            .collect()
    };
    let fast = simulated_round_secs(auto(()), false);
    let adaptive = simulated_round_secs(auto(()), true);
    let uniform = simulated_round_secs(dense(()), true);
    println!(
        "mean round: all fast {:.2} ms, slow link: choco-auto {:.2} ms ({:.2}×), choco identity {:.2} ms ({:.2}×)",
        fast * 1e3,
        adaptive * 1e3,
        adaptive / fast,
        uniform * 1e3,
        uniform / fast
    );
    assert!(adaptive < 1.5 * fast, "choco-auto {adaptive} vs {fast}");
    assert!(uniform > 3.0 * fast, "uniform identity {uniform} vs {fast}");
}
