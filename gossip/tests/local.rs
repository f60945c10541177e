//! Local SGD wrapper tests: local steps send nothing, communication rounds run the inner
//! algorithm on the locally updated parameters.

use murmur_gossip::sim::Sim;
use murmur_gossip::{DPsgd, DPsgdConfig, Gossip, GossipEvent, LocalSgd};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::ring_mh;

fn start(n: usize, d: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect()
}

fn local_peers(n: usize, d: usize, h: u64, lr: f32, seed: u64) -> Sim {
    let w = ring_mh(n);
    let peers = start(n, d, seed)
        .into_iter()
        .enumerate()
        .map(|(i, x0)| {
            let inner = DPsgd::new(DPsgdConfig::from_matrix(&w, i, 0.0, d), x0);
            Box::new(LocalSgd::new(Box::new(inner), h, lr)) as Box<dyn Gossip>
        })
        .collect();
    Sim::new(peers)
}

/// Gradients g_i = x_i − b_i of f_i(x) = ½‖x − b_i‖² at each peer's parameters.
fn quadratic_grads(sim: &Sim, b: &[Vec<f32>]) -> Vec<Vec<f32>> {
    (0..sim.n())
        .map(|i| {
            sim.peer(i)
                .params()
                .iter()
                .zip(&b[i])
                .map(|(x, bi)| x - bi)
                .collect()
        })
        .collect()
}

#[test]
fn only_every_hth_round_sends_frames() {
    let (n, d, h) = (6, 50, 4);
    let mut sim = local_peers(n, d, h, 0.1, 1);
    for t in 0..12u64 {
        sim.run_round(None).unwrap();
        let comm_rounds = (t + 1) / h;
        let frames = sim.peer(0).stats().frames_sent;
        assert_eq!(frames, 2 * comm_rounds, "after round {t}");
        assert_eq!(sim.peer(0).round(), t + 1);
    }
}

#[test]
fn local_steps_are_plain_sgd_and_the_hth_step_mixes() {
    let (n, d, h, lr) = (5, 20, 3, 0.1f32);
    let b = start(n, d, 9);
    let mut sim = local_peers(n, d, h, lr, 2);
    let w = ring_mh(n);
    for t in 0..9u64 {
        let before: Vec<Vec<f32>> = (0..n).map(|i| sim.peer(i).params().to_vec()).collect();
        let g = quadratic_grads(&sim, &b);
        sim.run_round(Some(&g)).unwrap();
        // y_i = x_i − η g_i, then Σ_j W_ij y_j on communication rounds.
        let y: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                before[i]
                    .iter()
                    .zip(&g[i])
                    .map(|(x, g)| x - lr * g)
                    .collect()
            })
            .collect();
        for i in 0..n {
            let expect: Vec<f32> = if (t + 1) % h == 0 {
                (0..d)
                    .map(|k| (0..n).map(|j| w.get(i, j) as f32 * y[j][k]).sum())
                    .collect()
            } else {
                y[i].clone()
            };
            let err = expect
                .iter()
                .zip(sim.peer(i).params())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(err < 1e-5, "round {t} peer {i}: error {err}");
        }
    }
}

#[test]
fn local_sgd_gossip_reaches_the_minimiser_of_the_average_loss() {
    let (n, d) = (8, 10);
    let b = start(n, d, 4);
    let mean_b: Vec<f32> = (0..d)
        .map(|k| b.iter().map(|bi| bi[k]).sum::<f32>() / n as f32)
        .collect();
    let mut drift = Vec::new();
    for h in [1, 4] {
        let mut sim = local_peers(n, d, h, 0.05, 3);
        for _ in 0..2_000 {
            let g = quadratic_grads(&sim, &b);
            sim.run_round(Some(&g)).unwrap();
        }
        // The gradients are linear with one Hessian, so x̄ follows exact gradient descent
        // on the average loss whatever H is.
        let err = sim
            .average()
            .iter()
            .zip(&mean_b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-3, "H = {h}: x̄ is {err} from the minimiser");
        drift.push(sim.consensus_distance());
    }
    // More local steps on different b_i: the peers drift further apart between mixings.
    assert!(
        drift[1] > 2.0 * drift[0] && drift[0] > 0.0,
        "Ξ² with H = 1: {}, H = 4: {}",
        drift[0],
        drift[1]
    );
}

#[test]
fn rounds_and_events_count_sgd_steps() {
    let w = ring_mh(3);
    let inner = DPsgd::new(DPsgdConfig::from_matrix(&w, 0, 0.0, 4), vec![1.0; 4]);
    let mut p = LocalSgd::new(Box::new(inner), 2, 0.5);
    let now = std::time::Instant::now();
    p.begin_round(now, &[1.0; 4], Some(&[2.0; 4]));
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(p.params(), &[0.0; 4]);
    assert!(p.poll_transmit().is_none(), "a local step sends nothing");
    p.begin_round(now, &[0.0; 4], None);
    assert_eq!(p.poll_event(), None, "round 1 waits for the neighbours");
    assert_eq!(p.round(), 1);
    assert_eq!(p.out_peers(), vec![1, 2]);
    assert_eq!(p.in_peers(), vec![1, 2]);
}
