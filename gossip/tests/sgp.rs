//! SGP / push-sum state machine tests: exact averaging on the one-peer exponential graph,
//! directed and unbalanced graphs, overlap (τ ≥ 1) with late frames, SGP on a quadratic,
//! refusals, and the overlapped gradient.

use std::time::{Duration, Instant};

use murmur_compress::Compressor;
use murmur_gossip::algorithms::sgp::{max_lead, PUSH_SUM_PREFIX_LEN, SKIP_STALENESS};
use murmur_gossip::frame::{FrameHeader, FrameKind};
use murmur_gossip::sim::Sim;
use murmur_gossip::{Gossip, GossipError, GossipEvent, GossipStats, Rank, Sgp, SgpConfig};
use murmur_topology::{Graph, PushSchedule};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::{drain_mixed, kind_frame, round_among, serial_mean, skip_round, uniform_vectors};

/// One SGP peer per start vector, all on `schedule` with learning rate `lr` and overlap `tau`.
fn peers(schedule: &PushSchedule, xs: &[Vec<f32>], lr: f32, tau: u64) -> Vec<Sgp> {
    xs.iter()
        .enumerate()
        .map(|(i, x0)| {
            let cfg = SgpConfig::new(schedule.clone(), i, lr, x0.len()).with_tau(tau);
            Sgp::new(cfg, x0.clone())
        })
        .collect()
}

fn boxed(peers: Vec<Sgp>) -> Vec<Box<dyn Gossip>> {
    peers
        .into_iter()
        .map(|p| Box::new(p) as Box<dyn Gossip>)
        .collect()
}

/// max_i,k |z_i[k] − target[k]| over the parameter vectors `zs`.
fn max_err<'a>(zs: impl IntoIterator<Item = &'a [f32]>, target: &[f64]) -> f64 {
    zs.into_iter()
        .flat_map(|z| z.iter().zip(target).map(|(v, t)| (f64::from(*v) - t).abs()))
        .fold(0.0, f64::max)
}

/// max_k |a[k] − b[k]|.
fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn sim_err(sim: &Sim, target: &[f64]) -> f64 {
    max_err((0..sim.n()).map(|i| sim.peer(i).params()), target)
}

/// Directed ring 0 → 1 → … → n−1 → 0 plus chords 0 → n/3 and 0 → 2n/3: strongly connected,
/// unbalanced (peer 0 has out-degree 3, the others 1), so no doubly stochastic W on it.
fn chorded_ring(n: usize) -> PushSchedule {
    let mut edges: Vec<(usize, usize)> = (0..n).map(|i| (i, (i + 1) % n)).collect();
    edges.extend([(0, n / 3), (0, 2 * n / 3)]);
    PushSchedule::fixed(Graph::from_edges(n, &edges, true).unwrap()).unwrap()
}

/// The payload of a push-sum frame: p, weight, identity message of `x`.
fn share_payload(p: f64, weight: f64, x: &[f32]) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&p.to_le_bytes());
    payload.extend_from_slice(&weight.to_le_bytes());
    let mut rng = StdRng::seed_from_u64(0);
    murmur_compress::Identity.compress(x, &mut rng, &mut payload);
    payload
}

fn push_frame(sender: Rank, round: u64, p: f64, weight: f64, x: &[f32]) -> Vec<u8> {
    kind_frame(
        FrameKind::PushSum,
        sender,
        round,
        x.len() as u32,
        &share_payload(p, weight, x),
    )
}

/// A lock-step driver over [`Sgp`] peers whose frames are delivered late: each frame sent
/// in round t arrives in round t + δ, δ uniform in 0..=`max_delay`, due frames in random
/// order (all from `seed`). Keeps the peers' concrete type to read numerators and weights.
/// A per-peer gradient oracle: `grad_of(i, z_i)`.
type GradOf<'a> = &'a dyn Fn(Rank, &[f32]) -> Vec<f32>;

struct Net {
    peers: Vec<Sgp>,
    now: Instant,
    /// (delivery round, from, to, frame).
    queue: Vec<(u64, Rank, Rank, Vec<u8>)>,
    rng: StdRng,
    max_delay: u64,
    t: u64,
    delayed_frames: usize,
}

impl Net {
    fn new(peers: Vec<Sgp>, max_delay: u64, seed: u64) -> Self {
        Net {
            peers,
            now: Instant::now(),
            queue: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            max_delay,
            t: 0,
            delayed_frames: 0,
        }
    }

    /// Round t without gradients.
    fn step(&mut self) {
        self.run(None);
    }

    /// Round t with gradient `grad_of(i, z_i)` for peer i.
    fn step_with(&mut self, grad_of: GradOf) {
        self.run(Some(grad_of));
    }

    /// Round t: every peer begins it, frames due now are delivered, and every peer must
    /// have completed round t.
    fn run(&mut self, grad_of: Option<GradOf>) {
        let t = self.t;
        for (i, p) in self.peers.iter_mut().enumerate() {
            assert_eq!(p.round(), t);
            let z = p.params().to_vec();
            let g = grad_of.map(|f| f(i, &z));
            p.begin_round(self.now, &z, g.as_deref());
            while let Some(tr) = p.poll_transmit() {
                let delay = self.rng.random_range(0..=self.max_delay);
                self.delayed_frames += usize::from(delay > 0);
                self.queue.push((t + delay, i, tr.to, tr.frame.to_vec()));
            }
        }
        let (mut due, rest): (Vec<_>, Vec<_>) = self.queue.drain(..).partition(|f| f.0 == t);
        self.queue = rest;
        for k in (1..due.len()).rev() {
            let j = self.rng.random_range(0..=k);
            due.swap(k, j);
        }
        for (_, from, to, frame) in due {
            self.peers[to]
                .handle_message(self.now, from, &frame)
                .unwrap_or_else(|e| panic!("round {t}: peer {to} refused peer {from}: {e}"));
        }
        for (i, p) in self.peers.iter_mut().enumerate() {
            let mut mixed = false;
            while let Some(ev) = p.poll_event() {
                mixed |= ev == GossipEvent::Mixed { round: t };
            }
            assert!(mixed, "peer {i} did not complete round {t}");
        }
        self.now += Duration::from_millis(1);
        self.t += 1;
    }

    /// Σ_i (x_i, w_i) held by the peers (buffered shares included) plus the shares in
    /// flight, in `f64`.
    fn total_mass(&self) -> (Vec<f64>, f64) {
        let d = self.peers[0].numerator().len();
        let mut x = vec![0.0f64; d];
        let mut w = 0.0;
        for p in &self.peers {
            let (px, pw) = p.held_mass();
            x.iter_mut().zip(&px).for_each(|(a, b)| *a += b);
            w += pw;
        }
        let mut scratch = vec![0.0f32; d];
        for (_, _, _, frame) in &self.queue {
            let (_, payload) = FrameHeader::parse(frame, u32::MAX).unwrap();
            let p = f64::from_le_bytes(payload[..8].try_into().unwrap());
            let weight = f64::from_le_bytes(payload[8..16].try_into().unwrap());
            scratch.fill(0.0);
            murmur_compress::decode_add(&payload[PUSH_SUM_PREFIX_LEN..], p as f32, &mut scratch)
                .unwrap();
            x.iter_mut()
                .zip(&scratch)
                .for_each(|(a, b)| *a += f64::from(*b));
            w += p * weight;
        }
        (x, w)
    }

    fn err(&self, target: &[f64]) -> f64 {
        max_err(self.peers.iter().map(|p| p.params()), target)
    }
}

// (a) ----------------------------------------------------------------------------------

#[test]
fn push_sum_on_one_peer_exponential_16_is_exact_after_4_rounds_and_not_before() {
    let (n, d) = (16, 100);
    let xs = uniform_vectors(n, d, 1.0, 11);
    let mean = serial_mean(&xs);
    let schedule = PushSchedule::one_peer_exponential(n).unwrap();
    let mut sim = Sim::new(boxed(peers(&schedule, &xs, 0.0, 0)));
    let e0 = sim_err(&sim, &mean);
    assert!(e0 > 0.5, "random start: max error {e0}");
    sim.run_rounds(3).unwrap();
    let e3 = sim_err(&sim, &mean);
    // After 3 rounds every z_i is the mean of 8 start vectors only.
    assert!(
        e3 > 0.1,
        "after 3 rounds the error must still be large, got {e3}"
    );
    sim.run_rounds(1).unwrap();
    let e4 = sim_err(&sim, &mean);
    assert!(e4 < 1e-6, "after log2(16) = 4 rounds: max |z_i − x̄| = {e4}");
    // One frame per peer per round: 4 frames of 24 + 16 + 12 + 4d bytes each.
    let s = sim.peer(5).stats();
    assert_eq!(s.frames_sent, 4);
    assert_eq!(s.frames_received, 4);
    assert_eq!(s.bytes_sent, 4 * (24 + 16 + 12 + 4 * d as u64));
    assert_eq!(sim.peer(5).out_peers(), vec![6, 7, 9, 13]);
    assert_eq!(sim.peer(5).in_peers(), vec![1, 3, 4, 13]);
}

// (b) ----------------------------------------------------------------------------------

#[test]
fn push_sum_on_one_peer_exponential_12_converges_geometrically() {
    let (n, d) = (12, 100);
    let xs = uniform_vectors(n, d, 1.0, 12);
    let mean = serial_mean(&xs);
    let schedule = PushSchedule::one_peer_exponential(n).unwrap();
    let mut sim = Sim::new(boxed(peers(&schedule, &xs, 0.0, 0)));
    let mut errs = vec![sim_err(&sim, &mean)];
    for _ in 0..10 {
        sim.run_rounds(4).unwrap(); // one period
        errs.push(sim_err(&sim, &mean));
    }
    // Not exact after one period (n is not a power of 2) …
    assert!(errs[1] > 1e-3, "after 4 rounds: {}", errs[1]);
    // … but every period contracts the error by a constant factor well below 1.
    for k in 1..6 {
        assert!(
            errs[k + 1] < 0.5 * errs[k],
            "period {k}: error {} → {}",
            errs[k],
            errs[k + 1]
        );
    }
    assert!(errs[10] < 1e-6, "after 40 rounds: {}", errs[10]);
}

#[test]
fn push_sum_on_an_unbalanced_directed_graph_reaches_the_average_through_the_weights() {
    let (n, d) = (12, 50);
    let xs = uniform_vectors(n, d, 1.0, 13);
    let mean = serial_mean(&xs);
    let schedule = chorded_ring(n);
    assert!(
        (schedule.matrix(0).row(4).sum() - 1.0).abs() > 0.1,
        "not row stochastic"
    );
    let mut net = Net::new(peers(&schedule, &xs, 0.0, 0), 0, 0);
    let e0 = net.err(&mean);
    let mut errs = vec![e0];
    for _ in 0..15 {
        for _ in 0..10 {
            net.step();
        }
        errs.push(net.err(&mean));
    }
    // Geometric: every 10 rounds at least halve the error (≈ 2.3–3.3× seen) until f32
    // rounding (~1e-7) is near.
    for k in 0..13 {
        assert!(errs[k + 1] < errs[k] / 2.0, "errors per 10 rounds {errs:?}");
    }
    assert!(
        errs[15] < 1e-6,
        "after 150 rounds: {} (start {e0})",
        errs[15]
    );
    // The weights are far from 1 and the raw numerators are biased: only z = x/w averages.
    let ws: Vec<f64> = net.peers.iter().map(Sgp::weight).collect();
    let (wmin, wmax) = ws
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &w| (a.min(w), b.max(w)));
    assert!(wmax / wmin > 1.5, "weights {ws:?}");
    assert!((ws.iter().sum::<f64>() - n as f64).abs() < 1e-9);
    let raw = max_err(net.peers.iter().map(Sgp::numerator), &mean);
    assert!(
        raw > 0.05,
        "numerators alone should be biased, max error {raw}"
    );
}

// (c) ----------------------------------------------------------------------------------

fn overlap_conserves_mass_and_averages(tau: u64, seed: u64) {
    let (n, d) = (12, 40);
    let xs = uniform_vectors(n, d, 1.0, seed);
    let mean = serial_mean(&xs);
    let total0: Vec<f64> = mean.iter().map(|m| m * n as f64).collect();
    let schedule = PushSchedule::one_peer_exponential(n).unwrap();
    let ps = peers(&schedule, &xs, 0.0, tau);
    assert!(!ps[0].overlaps_gradient());
    let mut net = Net::new(ps, tau, seed);
    for t in 0..120 {
        net.step();
        let (x, w) = net.total_mass();
        assert!(
            (w - n as f64).abs() < 1e-9,
            "tau {tau} round {t}: Σw + in flight = {w}"
        );
        let drift = max_diff(&x, &total0);
        assert!(
            drift < 1e-4,
            "tau {tau} round {t}: Σx + in flight drifted by {drift}"
        );
    }
    assert!(
        net.delayed_frames > 100,
        "the driver must really delay frames"
    );
    let ws: Vec<f64> = net.peers.iter().map(Sgp::weight).collect();
    assert!(
        ws.iter().any(|w| (w - 1.0).abs() > 1e-3),
        "late shares must unbalance the weights: {ws:?}"
    );
    let e = net.err(&mean);
    assert!(e < 1e-5, "tau {tau}: max |z_i − x̄| = {e} after 120 rounds");
}

#[test]
fn overlap_tau1_with_late_frames_conserves_mass_and_reaches_the_average() {
    overlap_conserves_mass_and_averages(1, 21);
}

#[test]
fn overlap_tau2_with_late_frames_conserves_mass_and_reaches_the_average() {
    overlap_conserves_mass_and_averages(2, 22);
}

#[test]
fn overlap_rounds_before_tau_complete_at_once_and_late_frames_are_absorbed() {
    let schedule = PushSchedule::one_peer_exponential(2).unwrap();
    let cfg = |i| SgpConfig::new(schedule.clone(), i, 0.0, 1).with_tau(1);
    let now = Instant::now();
    let mut a = Sgp::new(cfg(0), vec![0.0]);
    let mut b = Sgp::new(cfg(1), vec![4.0]);
    a.begin_round(now, &[0.0], None);
    assert_eq!(a.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    let t = a.poll_transmit().unwrap();
    assert_eq!(t.to, 1);
    let fa0 = t.frame.to_vec();
    b.begin_round(now, &[4.0], None);
    assert_eq!(b.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    let fb0 = b.poll_transmit().unwrap().frame.to_vec();
    // a is idle: b's round-0 share is buffered, params do not move until round 1 begins.
    a.handle_message(now, 1, &fb0).unwrap();
    assert_eq!(a.params(), &[0.0]);
    assert_eq!(a.held_mass(), (vec![2.0], 1.0));
    a.begin_round(now, &[0.0], None);
    // Round 1 waits for round 0's share, which was buffered: complete at once.
    assert_eq!(a.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    // (x, w) = (0, 1) → ½ kept in round 0 → ¼ kept in round 1: (0, ¼); plus ½·(4, 1) from
    // b's round-0 share: (2, ¾), z = 8/3.
    assert_eq!(a.numerator(), &[2.0]);
    assert_eq!(a.weight(), 0.75);
    assert!((a.params()[0] - 8.0 / 3.0).abs() < 1e-6);
    // b begins round 1 without a's round-0 share: it must wait for it.
    b.begin_round(now, &[4.0], None);
    assert_eq!(b.poll_event(), None);
    b.handle_message(now, 0, &fa0).unwrap();
    assert_eq!(b.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    // (4, 1) → (2, ½) → (1, ¼), plus ½·(0, 1): (1, ¾), z = 4/3.
    assert_eq!(b.numerator(), &[1.0]);
    assert_eq!(b.weight(), 0.75);
    assert!((b.params()[0] - 4.0 / 3.0).abs() < 1e-6);
}

// (d) ----------------------------------------------------------------------------------

#[test]
fn sgp_on_quadratics_converges_to_the_mean_of_the_targets() {
    // f_i(x) = ½‖x − b_i‖², ∇f_i(z) = z − b_i; the minimiser of Σ f_i is mean(b_i).
    let (n, d) = (16, 20);
    let bs = uniform_vectors(n, d, 1.0, 31);
    let b_mean = serial_mean(&bs);
    let xs = uniform_vectors(n, d, 1.0, 32);
    let schedule = PushSchedule::one_peer_exponential(n).unwrap();
    let lr = 0.05;
    let mut sim = Sim::new(boxed(peers(&schedule, &xs, lr, 0)));
    let e0 = sim_err(&sim, &b_mean);
    for _ in 0..300 {
        let grads: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                let z = sim.peer(i).params();
                z.iter().zip(&bs[i]).map(|(z, b)| z - b).collect()
            })
            .collect();
        sim.run_round(Some(&grads)).unwrap();
    }
    let zs: Vec<Vec<f32>> = (0..n).map(|i| sim.peer(i).params().to_vec()).collect();
    // The network average reaches mean(b) (w ≡ 1 on this schedule) …
    let avg_err = max_diff(&serial_mean(&zs), &b_mean);
    assert!(avg_err < 1e-5, "average of z off by {avg_err}");
    // … and every peer is within O(γ) of it (constant step size: no exact consensus).
    let e = sim_err(&sim, &b_mean);
    assert!(
        e < 0.1 * e0 && e < 0.15,
        "max |z_i − mean b| = {e} (start {e0})"
    );
}

#[test]
fn sgp_on_quadratics_over_an_unbalanced_graph_converges_near_the_mean_of_the_targets() {
    let (n, d) = (12, 20);
    let bs = uniform_vectors(n, d, 1.0, 41);
    let b_mean = serial_mean(&bs);
    let xs = uniform_vectors(n, d, 1.0, 42);
    let schedule = chorded_ring(n);
    let mut net = Net::new(peers(&schedule, &xs, 0.01, 0), 0, 0);
    let e0 = net.err(&b_mean);
    let grad =
        |i: Rank, z: &[f32]| -> Vec<f32> { z.iter().zip(&bs[i]).map(|(z, b)| z - b).collect() };
    for _ in 0..1500 {
        net.step_with(&grad);
    }
    let e = net.err(&b_mean);
    assert!(
        e < 0.1 * e0 && e < 0.1,
        "max |z_i − mean b| = {e} (start {e0})"
    );
}

// (e) ----------------------------------------------------------------------------------

/// Everything observable about a peer.
#[derive(Debug, PartialEq)]
struct Snapshot {
    z: Vec<f32>,
    x: Vec<f32>,
    weight: f64,
    held: (Vec<f64>, f64),
    stats: GossipStats,
    round: u64,
}

fn snapshot(p: &Sgp) -> Snapshot {
    Snapshot {
        z: p.params().to_vec(),
        x: p.numerator().to_vec(),
        weight: p.weight(),
        held: p.held_mass(),
        stats: p.stats(),
        round: p.round(),
    }
}

#[test]
fn bad_frames_are_refused_and_change_nothing() {
    // n = 4, one-peer: offsets 1 (even rounds), 2 (odd rounds). Peer 1 receives from 0 in
    // even rounds and from 3 in odd rounds; peer 2 never sends to it.
    let schedule = PushSchedule::one_peer_exponential(4).unwrap();
    let now = Instant::now();
    let cfg = SgpConfig::new(schedule.clone(), 1, 0.0, 2);
    let lead = cfg.max_lead_rounds;
    assert_eq!(lead, max_lead(&schedule, 1, 0));
    let mut p = Sgp::new(cfg, vec![1.0, 1.0]);
    assert_eq!(p.in_peers(), vec![0, 3]);
    assert_eq!(p.out_peers(), vec![2, 3]);
    p.begin_round(now, &[1.0, 1.0], None);
    assert_eq!(p.poll_transmit().unwrap().to, 2);
    let good = push_frame(0, 0, 0.5, 1.0, &[3.0, 3.0]);

    let check = |p: &mut Sgp, from: Rank, frame: &[u8], expect: &dyn Fn(&GossipError) -> bool| {
        let before = snapshot(p);
        let err = p
            .handle_message(now, from, frame)
            .expect_err("must be refused");
        assert!(expect(&err), "unexpected error {err:?}");
        assert_eq!(
            snapshot(p),
            before,
            "refused frame ({err}) changed the state"
        );
        assert_eq!(p.poll_event(), None);
    };

    let mut wrong_kind = good.clone();
    wrong_kind[3] = FrameKind::Gossip as u8;
    check(&mut p, 0, &wrong_kind, &|e| {
        *e == GossipError::WrongKind(FrameKind::Gossip)
    });
    check(&mut p, 2, &good, &|e| {
        matches!(
            e,
            GossipError::SenderMismatch {
                from: 2,
                claimed: 0
            }
        )
    });
    check(&mut p, 2, &push_frame(2, 0, 0.5, 1.0, &[3.0, 3.0]), &|e| {
        *e == GossipError::NotANeighbour(2)
    });
    // Peer 3 is an in-peer of odd rounds only.
    check(&mut p, 3, &push_frame(3, 0, 0.5, 1.0, &[3.0, 3.0]), &|e| {
        *e == GossipError::NotANeighbour(3)
    });
    for bad_p in [f64::NAN, 0.0, -0.5, 1.5, f64::INFINITY] {
        check(
            &mut p,
            0,
            &push_frame(0, 0, bad_p, 1.0, &[3.0, 3.0]),
            &|e| {
                matches!(
                    e,
                    GossipError::BadWeight {
                        from: 0,
                        field: "p",
                        ..
                    }
                )
            },
        );
    }
    for bad_w in [f64::NAN, 0.0, -1.0, f64::INFINITY, 5.0] {
        check(
            &mut p,
            0,
            &push_frame(0, 0, 0.5, bad_w, &[3.0, 3.0]),
            &|e| {
                matches!(
                    e,
                    GossipError::BadWeight {
                        from: 0,
                        field: "weight",
                        ..
                    }
                )
            },
        );
    }
    // Truncated: the frame itself, the 16-byte prefix, the message after it.
    check(&mut p, 0, &good[..good.len() - 3], &|e| {
        matches!(e, GossipError::Frame(_))
    });
    let payload = share_payload(0.5, 1.0, &[3.0, 3.0]);
    check(
        &mut p,
        0,
        &kind_frame(FrameKind::PushSum, 0, 0, 2, &payload[..10]),
        &|e| {
            matches!(
                e,
                GossipError::Payload {
                    from: 0,
                    cause: murmur_compress::DecodeError::Truncated {
                        needed: 16,
                        got: 10
                    }
                }
            )
        },
    );
    check(
        &mut p,
        0,
        &kind_frame(FrameKind::PushSum, 0, 0, 2, &payload[..payload.len() - 4]),
        &|e| matches!(e, GossipError::Payload { from: 0, .. }),
    );
    // Dimension: in the header, and inside the message.
    check(
        &mut p,
        0,
        &push_frame(0, 0, 0.5, 1.0, &[3.0, 3.0, 3.0]),
        &|e| {
            matches!(
                e,
                GossipError::DimensionMismatch {
                    from: 0,
                    expected: 2,
                    got: 3
                }
            )
        },
    );
    let three = share_payload(0.5, 1.0, &[3.0, 3.0, 3.0]);
    check(
        &mut p,
        0,
        &kind_frame(FrameKind::PushSum, 0, 0, 2, &three),
        &|e| matches!(e, GossipError::Payload { from: 0, .. }),
    );
    // Non-finite values in the message.
    check(
        &mut p,
        0,
        &push_frame(0, 0, 0.5, 1.0, &[f32::NAN, 3.0]),
        &|e| matches!(e, GossipError::Payload { from: 0, .. }),
    );
    // Too far ahead.
    let hi = lead;
    check(
        &mut p,
        0,
        &push_frame(0, hi + 1, 0.5, 1.0, &[3.0, 3.0]),
        &|e| matches!(e, GossipError::RoundOutOfWindow { from: 0, lo: 0, hi: h, .. } if *h == hi),
    );

    // A frame for a later round is buffered; its duplicate is refused.
    let ahead = push_frame(3, 1, 0.5, 1.0, &[5.0, 5.0]);
    p.handle_message(now, 3, &ahead).unwrap();
    assert_eq!(p.poll_event(), None);
    assert_eq!(
        p.params(),
        &[1.0, 1.0],
        "a buffered share is not absorbed yet"
    );
    check(&mut p, 3, &ahead, &|e| {
        *e == GossipError::Duplicate { from: 3, round: 1 }
    });

    // The round's frame completes it: kept ½·(1, 1) + ½·(3, 3) = (2, 2), w = 1.
    p.handle_message(now, 0, &good).unwrap();
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(p.params(), &[2.0, 2.0]);
    assert_eq!(p.stats().frames_received, 2);
    assert_eq!(p.stats().bytes_received, (ahead.len() + good.len()) as u64);
    // Round 0 is now below the window.
    check(&mut p, 0, &good, &|e| {
        matches!(
            e,
            GossipError::RoundOutOfWindow {
                from: 0,
                round: 0,
                lo: 1,
                ..
            }
        )
    });
}

#[test]
fn overlap_refuses_a_duplicate_of_an_absorbed_share() {
    let schedule = PushSchedule::one_peer_exponential(2).unwrap();
    let now = Instant::now();
    let mut p = Sgp::new(SgpConfig::new(schedule, 0, 0.0, 1).with_tau(2), vec![0.0]);
    p.begin_round(now, &[0.0], None);
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    p.begin_round(now, &[0.0], None);
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    p.begin_round(now, &[0.0], None); // round 2 waits for round 0
    let f0 = push_frame(1, 0, 0.5, 1.0, &[8.0]);
    let f1 = push_frame(1, 1, 0.5, 1.0, &[8.0]);
    p.handle_message(now, 1, &f1).unwrap(); // round 1 ≤ 2: absorbed at once
    assert_eq!(p.poll_event(), None);
    assert_eq!(
        p.handle_message(now, 1, &f1),
        Err(GossipError::Duplicate { from: 1, round: 1 })
    );
    p.handle_message(now, 1, &f0).unwrap();
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 2 }));
    // Mass: x = ⅛·0 (three halvings) + ½·8 + ½·8 = 8, w = ⅛ + ½ + ½.
    assert_eq!(p.numerator(), &[8.0]);
    assert_eq!(p.weight(), 1.125);
    assert_eq!(
        p.handle_message(now, 1, &f0),
        Err(GossipError::RoundOutOfWindow {
            from: 1,
            round: 0,
            lo: 1,
            hi: 3 + max_lead(&PushSchedule::one_peer_exponential(2).unwrap(), 0, 2) - 1
        })
    );
}

#[test]
fn a_missing_in_peer_times_the_round_out_once() {
    let schedule = PushSchedule::one_peer_exponential(8).unwrap();
    let t0 = Instant::now();
    let mut cfg = SgpConfig::new(schedule, 0, 0.0, 1);
    cfg.round_timeout = Duration::from_secs(5);
    let mut p = Sgp::new(cfg, vec![0.0]);
    p.begin_round(t0, &[0.0], None);
    assert_eq!(p.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    p.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(p.poll_event(), None);
    p.handle_timeout(t0 + Duration::from_secs(5));
    assert_eq!(
        p.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 0,
            missing: vec![7]
        })
    );
    assert_eq!(p.poll_timeout(), None);
    p.handle_timeout(t0 + Duration::from_secs(9));
    assert_eq!(p.poll_event(), None);
}

#[test]
fn max_lead_bounds_how_far_ahead_an_in_peer_runs() {
    // Directed ring of 5: the in-peer 4 of peer 0 is 4 hops downstream.
    let ring = PushSchedule::fixed(
        Graph::from_edges(5, &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)], true).unwrap(),
    )
    .unwrap();
    assert_eq!(max_lead(&ring, 0, 0), 4);
    // Each hop lets the next peer run τ more rounds ahead.
    assert_eq!(max_lead(&ring, 0, 1), 8);
    // One-peer, n = 16: peer 15 can have sent round t + 4 while peer 0 mixes round t
    // (path 0 →(+2) 2 →(+4) 6 →(+8) 14 →(+1) 15 in rounds t+1..t+4).
    let one = PushSchedule::one_peer_exponential(16).unwrap();
    assert!(max_lead(&one, 0, 0) >= 4);
    // Undirected (symmetric) graph: the lead is 1.
    let ring2 = PushSchedule::fixed(Graph::ring(6).unwrap()).unwrap();
    assert_eq!(max_lead(&ring2, 3, 0), 1);
}

// (f) ----------------------------------------------------------------------------------

/// One round on `schedule` from `xs`, either with the gradients in `begin_round` (adapt then
/// combine) or overlapped: `grad = None`, then `apply_gradient` after `Mixed` (combine then
/// adapt). Returns the peers.
fn one_round(schedule: &PushSchedule, xs: &[Vec<f32>], gs: &[Vec<f32>], overlap: bool) -> Vec<Sgp> {
    let mut net = Net::new(peers(schedule, xs, 0.1, 0), 0, 0);
    if overlap {
        assert!(net.peers[0].overlaps_gradient());
        net.step();
        for (p, g) in net.peers.iter_mut().zip(gs) {
            p.apply_gradient(g);
        }
    } else {
        net.step_with(&|i, _| gs[i].clone());
    }
    net.peers
}

#[test]
fn overlapped_gradient_is_combine_then_adapt_and_matches_begin_round_on_a_regular_graph() {
    let (n, d, lr) = (8, 30, 0.1);
    let xs = uniform_vectors(n, d, 1.0, 51);
    // Unbalanced graph, different gradients: check both forms against the formulas.
    let schedule = chorded_ring(n);
    let gs = uniform_vectors(n, d, 1.0, 52);
    let p = schedule.matrix(0);
    let w_new: Vec<f64> = (0..n).map(|i| p.row(i).sum()).collect();
    let atc = one_round(&schedule, &xs, &gs, false);
    let cta = one_round(&schedule, &xs, &gs, true);
    for i in 0..n {
        assert!((atc[i].weight() - w_new[i]).abs() < 1e-12);
        assert!((cta[i].weight() - w_new[i]).abs() < 1e-12);
        for k in 0..d {
            // Adapt then combine: x_i = Σ_j p_ij (x_j − γ g_j).
            let x_atc: f64 = (0..n)
                .map(|j| p[(i, j)] * (f64::from(xs[j][k]) - lr * f64::from(gs[j][k])))
                .sum();
            // Combine then adapt: x_i = Σ_j p_ij x_j − γ g_i.
            let x_cta: f64 = (0..n).map(|j| p[(i, j)] * f64::from(xs[j][k])).sum::<f64>()
                - lr * f64::from(gs[i][k]);
            assert!((f64::from(atc[i].params()[k]) - x_atc / w_new[i]).abs() < 1e-6);
            assert!((f64::from(cta[i].params()[k]) - x_cta / w_new[i]).abs() < 1e-6);
        }
    }
    // Both conserve the same total mass Σ x − γ Σ g.
    let sum = |ps: &[Sgp]| -> Vec<f64> {
        (0..d)
            .map(|k| ps.iter().map(|p| f64::from(p.numerator()[k])).sum())
            .collect()
    };
    let (sa, sc) = (sum(&atc), sum(&cta));
    for k in 0..d {
        assert!((sa[k] - sc[k]).abs() < 1e-5);
    }

    // On a regular directed graph (P doubly stochastic, w ≡ 1) with a gradient common to
    // all peers the two are the same update: z agrees to 1e-6, round after round.
    let ring = PushSchedule::fixed(
        Graph::from_edges(
            n,
            &(0..n).map(|i| (i, (i + 1) % n)).collect::<Vec<_>>(),
            true,
        )
        .unwrap(),
    )
    .unwrap();
    let mut a = Net::new(peers(&ring, &xs, 0.1, 0), 0, 0);
    let mut b = Net::new(peers(&ring, &xs, 0.1, 0), 0, 0);
    let mut rng = StdRng::seed_from_u64(53);
    for _ in 0..10 {
        let g: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        a.step_with(&|_, _| g.clone());
        b.step();
        for p in &mut b.peers {
            p.apply_gradient(&g);
        }
        for (pa, pb) in a.peers.iter().zip(&b.peers) {
            for (za, zb) in pa.params().iter().zip(pb.params()) {
                assert!((za - zb).abs() < 1e-6, "{za} vs {zb}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "OSGP")]
fn apply_gradient_panics_for_osgp() {
    let schedule = PushSchedule::one_peer_exponential(2).unwrap();
    let mut p = Sgp::new(SgpConfig::new(schedule, 0, 0.1, 1).with_tau(1), vec![0.0]);
    p.apply_gradient(&[1.0]);
}

#[test]
fn a_driver_that_changes_z_moves_the_numerator_by_w_times_the_change() {
    let schedule = chorded_ring(6);
    let now = Instant::now();
    let mut p = Sgp::new(SgpConfig::new(schedule, 0, 0.0, 1), vec![2.0]);
    p.begin_round(now, &[2.0], None);
    // Peer 0 pushes to 1, 2, 4: keeps ¼. Its in-peer is 5.
    assert!((p.weight() - 0.25).abs() < 1e-15);
    p.handle_message(now, 5, &push_frame(5, 0, 0.5, 1.0, &[6.0]))
        .unwrap();
    assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    // x = ½ + 3 = 3.5, w = ¼ + ½ = ¾, z = 14/3.
    assert!((p.weight() - 0.75).abs() < 1e-15);
    assert!((p.params()[0] - 14.0 / 3.0).abs() < 1e-6);
    // The driver moves z to 2: x becomes w·z = 1.5 before the split.
    p.begin_round(now, &[2.0], None);
    assert!((p.numerator()[0] - 0.375).abs() < 1e-7);
}

/// (Σ x_i, Σ w_i) over the live peers, in f64.
fn live_mass(peers: &[Sgp], alive: &[bool]) -> (Vec<f64>, f64) {
    let d = peers[0].params().len();
    let mut x = vec![0.0; d];
    let mut w = 0.0;
    for (p, _) in peers.iter().zip(alive).filter(|(_, &a)| a) {
        let (px, pw) = p.held_mass();
        for (a, v) in x.iter_mut().zip(px) {
            *a += v;
        }
        w += pw;
    }
    (x, w)
}

#[test]
fn push_sum_survivors_of_a_departure_stop_pushing_to_it_and_agree() {
    let n = 8;
    let schedule = PushSchedule::one_peer_exponential(n).unwrap();
    let xs = uniform_vectors(n, 3, 10.0, 7);
    let mut ps = peers(&schedule, &xs, 0.0, 0);
    let w = common::ring_mh(n); // not used by push-sum
    assert!(!ps[0].reweights());
    let mut alive = vec![true; n];
    for _ in 0..2 {
        assert!(round_among(&mut ps, &alive).iter().all(|&m| m));
    }
    // Peer 3 dies before round 2 (offset 4: 7 → 3 → 7). Peer 7 waits for its frame; peer
    // 7's own push to 3 is lost.
    alive[3] = false;
    let mixed_now = round_among(&mut ps, &alive);
    assert!(!mixed_now[7] && mixed_now[0] && mixed_now[6]);
    for i in (0..n).filter(|&i| alive[i]) {
        ps[i].peer_left(3, &w).unwrap();
    }
    assert!(drain_mixed(&mut ps[7]), "peer 7 stops waiting for peer 3");
    assert_eq!(
        ps[7].handle_message(Instant::now(), 3, &push_frame(3, 3, 0.5, 1.0, &[0.0; 3])),
        Err(GossipError::Departed(3))
    );
    // From now on no mass leaves the survivors: Σx and Σw are kept, and every z_i reaches
    // Σx / Σw. No survivor waits for peer 3 (every round completes).
    let (x_sum, w_sum) = live_mass(&ps, &alive);
    assert!(w_sum < n as f64 && w_sum > 6.0, "Σw = {w_sum}");
    for _ in 0..60 {
        let m = round_among(&mut ps, &alive);
        assert!((0..n).all(|i| m[i] == alive[i]), "{m:?}");
    }
    let (x_end, w_end) = live_mass(&ps, &alive);
    assert!((w_end - w_sum).abs() < 1e-9, "{w_end} vs {w_sum}");
    assert!(max_diff(&x_end, &x_sum) < 1e-3, "{x_end:?} vs {x_sum:?}");
    let target: Vec<f64> = x_sum.iter().map(|v| v / w_sum).collect();
    let live = (0..n).filter(|&i| alive[i]).map(|i| ps[i].params());
    assert!(max_err(live, &target) < 1e-4);

    // Peer 3 returns at the next round with push-sum weight 1, from its in-peers' mean.
    let at = ps[0].round();
    let start: Vec<f32> = target.iter().map(|&v| v as f32).collect();
    let mut back = Sgp::new(SgpConfig::new(schedule.clone(), 3, 0.0, 3), start);
    back.start_at_round(at).unwrap();
    assert_eq!(
        ps[7].peer_rejoined(3, &w, at - 1),
        Err(murmur_gossip::MembershipError::TooLate {
            at: at - 1,
            round: at
        })
    );
    for i in (0..n).filter(|&i| alive[i]) {
        ps[i].peer_rejoined(3, &w, at).unwrap();
    }
    ps[3] = back;
    alive[3] = true;
    let (x_all, w_all) = live_mass(&ps, &alive);
    for _ in 0..60 {
        assert!(round_among(&mut ps, &alive).iter().all(|&m| m));
    }
    let target: Vec<f64> = x_all.iter().map(|v| v / w_all).collect();
    assert!(max_err(ps.iter().map(|p| p.params()), &target) < 1e-4);
}

#[test]
fn a_push_not_yet_handed_out_to_a_departed_peer_is_taken_back() {
    let schedule = PushSchedule::one_peer_exponential(4).unwrap();
    let x0 = vec![1.0f32, -2.0, 3.5];
    let mut p = Sgp::new(SgpConfig::new(schedule, 0, 0.0, 3), x0.clone());
    p.begin_round(Instant::now(), &x0, None);
    // Round 0: peer 0 keeps ½ and pushes ½ to peer 1, which leaves before the frame goes.
    assert_eq!(p.weight(), 0.5);
    p.peer_left(1, &common::ring_mh(4)).unwrap();
    assert_eq!(p.poll_transmit(), None);
    assert_eq!(p.weight(), 1.0);
    assert_eq!(p.numerator(), x0.as_slice());
    // Peer 0 still waits for its in-peer of round 0 (peer 3).
    assert!(!drain_mixed(&mut p));
    // Peer 3 leaves too: round 0 completes without its share. With peer 2 gone as well,
    // peer 0, alone, keeps all its mass every round and never pushes or waits.
    let w = common::ring_mh(4);
    p.peer_left(3, &w).unwrap();
    assert!(drain_mixed(&mut p));
    p.peer_left(2, &w).unwrap();
    for round in 1..6 {
        let z = p.params().to_vec();
        p.begin_round(Instant::now(), &z, None);
        assert_eq!(p.poll_transmit(), None, "round {round}");
        assert!(drain_mixed(&mut p), "round {round}");
        assert_eq!(p.weight(), 1.0);
    }
    assert_eq!(p.params(), x0.as_slice());
}

#[test]
fn a_departure_lets_the_survivors_run_further_ahead() {
    let one = PushSchedule::one_peer_exponential(6).unwrap();
    let full = max_lead(&one, 2, 0);
    let without = murmur_gossip::algorithms::sgp::max_lead_without(&one, 2, 0, &[3]);
    eprintln!("one-peer exponential of 6, peer 2: lead {full}, without peer 3: {without}");
    assert!(without > full, "{without} vs {full}");
    assert_eq!(
        murmur_gossip::algorithms::sgp::max_lead_without(&one, 2, 0, &[]),
        full
    );
}

// Straggler policy "skip" ------------------------------------------------------------------

/// n peers on the one-peer exponential graph with the skip policy (Δ = 5 ms, γ = 0); the
/// frames of `straggler` arrive `delay` rounds late. Every round completes on time (the
/// late shares are skipped), the mass is kept exactly in every round, and once the
/// straggler catches up every z_i reaches the average.
fn skipping_a_straggler_keeps_the_mass(n: usize, straggler: Rank, delay: u64) -> u64 {
    let d = 24;
    let xs = uniform_vectors(n, d, 1.0, 5);
    let mean = serial_mean(&xs);
    let total0: Vec<f64> = mean.iter().map(|m| m * n as f64).collect();
    let schedule = PushSchedule::one_peer_exponential(n).unwrap();
    let skip = Duration::from_millis(5);
    let ps: Vec<Sgp> = xs
        .iter()
        .enumerate()
        .map(|(i, x0)| {
            let cfg = SgpConfig::new(schedule.clone(), i, 0.0, d).with_skip(Some(skip));
            Sgp::new(cfg, x0.clone())
        })
        .collect();
    let mut net = Net::new(ps, 0, 1);
    let rounds = 60;
    for t in 0..rounds + delay + 20 {
        // The straggler's frames are late for the first `rounds` rounds only.
        let late = if t < rounds { delay } else { 0 };
        let clock = (net.now, skip);
        skip_round(&mut net.peers, &mut net.queue, t, clock, (straggler, late));
        let (x, w) = net.total_mass();
        assert!(
            (w - n as f64).abs() < 1e-9,
            "round {t}: Σw + in flight = {w}"
        );
        let drift = max_diff(&x, &total0);
        assert!(drift < 1e-4, "round {t}: Σx + in flight drifted by {drift}");
        net.now += Duration::from_millis(10);
        net.t += 1;
    }
    assert!(net.queue.is_empty());
    let e = net.err(&mean);
    assert!(e < 1e-5, "max |z_i − x̄| = {e} once the straggler caught up");
    net.peers.iter().map(|p| p.stats().skipped).sum()
}

#[test]
fn skipping_a_straggler_keeps_the_mass_and_every_peer_reaches_the_average() {
    let skipped = skipping_a_straggler_keeps_the_mass(8, 3, 3);
    // Peer 3 pushes to one peer a round; each of its 60 late shares is skipped once.
    assert_eq!(skipped, 60);
    // As late as the staleness bound allows, on a graph where n is not a power of 2.
    let skipped = skipping_a_straggler_keeps_the_mass(6, 0, SKIP_STALENESS);
    assert_eq!(skipped, 60);
}

#[test]
fn a_share_later_than_the_staleness_bound_is_waited_for() {
    // Directed ring 0 → 1 → 2 → 0: peer 1's only in-peer is 0, whose frames do not come.
    let g = Graph::from_edges(3, &[(0, 1), (1, 2), (2, 0)], true).unwrap();
    let schedule = PushSchedule::fixed(g).unwrap();
    let skip = Duration::from_millis(5);
    let mut cfg = SgpConfig::new(schedule, 1, 0.0, 2).with_skip(Some(skip));
    cfg.round_timeout = Duration::from_secs(5);
    let mut p = Sgp::new(cfg, vec![0.0, 0.0]);
    let mut now = Instant::now();
    let begin = |p: &mut Sgp, now: Instant| {
        let z = p.params().to_vec();
        p.begin_round(now, &z, None);
        while p.poll_transmit().is_some() {}
    };
    for k in 0..SKIP_STALENESS {
        begin(&mut p, now);
        assert_eq!(p.poll_timeout(), Some(now + skip));
        p.handle_timeout(now + skip);
        assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: k }));
        now += Duration::from_millis(10);
    }
    // Round 8: the share of round 0 is now 8 rounds late and is waited for.
    begin(&mut p, now);
    p.handle_timeout(now + skip);
    assert_eq!(
        p.poll_event(),
        None,
        "round 8 must wait for the share of round 0"
    );
    p.handle_timeout(now + Duration::from_secs(5));
    assert_eq!(
        p.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: SKIP_STALENESS,
            missing: vec![0]
        })
    );
    // The late share of round 0 comes: absorbed, and the round completes.
    let late = push_frame(0, 0, 0.5, 1.0, &[2.0, 2.0]);
    p.handle_message(now, 0, &late).unwrap();
    assert_eq!(
        p.poll_event(),
        Some(GossipEvent::Mixed {
            round: SKIP_STALENESS
        })
    );
    assert!(
        p.handle_message(now, 0, &late).is_err(),
        "a late share counts once"
    );
    // Peer 1 kept 1/2 of its weight each of 9 rounds and got 1/2 of peer 0's weight 1.
    let expected = 0.5f64.powi(9) + 0.5;
    assert!((p.weight() - expected).abs() < 1e-12, "w = {}", p.weight());
    assert_eq!(p.stats().skipped, SKIP_STALENESS + 1);
}
