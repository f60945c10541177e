//! Parameter-server state machine tests (BSP, SSP, ASP).

use std::time::{Duration, Instant};

use murmur_gossip::frame::FrameKind;
use murmur_gossip::{
    AllReduce, AllReduceConfig, Gossip, GossipError, GossipEvent, GossipStats, ParameterServer,
    PsConfig, PsMode, Rank,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;
use common::{f32_bytes, kind_frame, max_abs_diff, serial_mean, uniform_vectors, Net};

fn ps(n: usize, lr: f32, mode: PsMode, x0: &[f32]) -> Vec<ParameterServer> {
    (0..n)
        .map(|i| ParameterServer::new(PsConfig::new(i, n, lr, mode, x0.len()), x0.to_vec()))
        .collect()
}

/// ∇f_i(x) = x − b_i for f_i(x) = ½‖x − b_i‖², evaluated at every peer's own parameters.
fn quadratic_grads<G: Gossip>(net: &Net<G>, b: &[Vec<f32>]) -> Vec<Vec<f32>> {
    net.peers
        .iter()
        .zip(b)
        .map(|(p, b)| p.params().iter().zip(b).map(|(x, b)| x - b).collect())
        .collect()
}

#[test]
fn bsp_follows_the_allreduce_trajectory_on_a_quadratic() {
    let (d, lr, rounds) = (13, 0.3, 25);
    for n in [2, 3, 5, 8] {
        let b = uniform_vectors(n, d, 2.0, n as u64);
        let x0 = uniform_vectors(1, d, 5.0, 100 + n as u64).remove(0);
        let x_star: Vec<f32> = serial_mean(&b).iter().map(|v| *v as f32).collect();
        let mut server = Net::fifo(ps(n, lr, PsMode::Bsp, &x0));
        let mut ring = Net::fifo(
            (0..n)
                .map(|i| AllReduce::new(AllReduceConfig::new(i, n, lr, d), x0.clone()))
                .collect(),
        );
        for t in 0..rounds {
            let g_ps = quadratic_grads(&server, &b);
            let g_ring = quadratic_grads(&ring, &b);
            server.round(Some(&g_ps));
            ring.round(Some(&g_ring));
            for i in 0..n {
                let diff = max_abs_diff(server.peers[i].params(), ring.peers[i].params());
                assert!(diff <= 1e-5, "n = {n}, round {t}, peer {i}: diff {diff:e}");
                assert_eq!(server.peers[i].params(), server.peers[0].params());
            }
        }
        // Both converge to x* = mean(b) at rate (1 − η) per round.
        let err0 = max_abs_diff(&x0, &x_star);
        let err = max_abs_diff(server.peers[0].params(), &x_star);
        assert!(
            err <= 1.1 * (1.0 - lr).powi(rounds) * err0 + 1e-5,
            "n = {n}: error {err} from {err0}"
        );
    }
}

#[test]
fn ssp_with_zero_staleness_applies_the_same_steps_as_bsp() {
    let (n, d, lr) = (5, 6, 0.4);
    let b = uniform_vectors(n, d, 1.0, 3);
    let x0 = vec![2.0; d];
    let mut bsp = Net::fifo(ps(n, lr, PsMode::Bsp, &x0));
    let mut ssp = Net::fifo(ps(n, lr, PsMode::Ssp { staleness: 0 }, &x0));
    for t in 0..20 {
        let g = quadratic_grads(&bsp, &b);
        bsp.round(Some(&g));
        let g = quadratic_grads(&ssp, &b);
        ssp.round(Some(&g));
        for i in 0..n {
            let diff = max_abs_diff(bsp.peers[i].params(), ssp.peers[i].params());
            assert!(diff <= 1e-5, "round {t}, peer {i}: diff {diff:e}");
        }
    }
}

#[test]
fn bsp_step_and_wire_format_by_hand() {
    // n = 2, x0 = (1, 2), η = 0.5, g_0 = (2, 0), g_1 = (0, 4): x = (1, 2) − 0.5·(1, 2).
    let now = Instant::now();
    let mut s = ParameterServer::new(PsConfig::new(0, 2, 0.5, PsMode::Bsp, 2), vec![1.0, 2.0]);
    let mut w = ParameterServer::new(PsConfig::new(1, 2, 0.5, PsMode::Bsp, 2), vec![1.0, 2.0]);
    let mut buf: Vec<u8>;
    w.begin_round(now, &[1.0, 2.0], Some(&[0.0, 4.0]));
    let t = w.poll_transmit().expect("a frame");
    assert_eq!(t.to, 0);
    buf = t.frame.to_vec();
    assert_eq!(
        buf,
        kind_frame(FrameKind::Push, 1, 0, 2, &f32_bytes(&[0.0, 4.0]))
    );
    assert_eq!(w.poll_transmit(), None);
    s.handle_message(now, 1, &buf).unwrap();
    assert_eq!(s.poll_transmit(), None, "BSP waits for rank 0's gradient");
    assert_eq!(s.clocks(), Some(&[0, 1][..]));
    s.begin_round(now, &[1.0, 2.0], Some(&[2.0, 0.0]));
    assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(s.params(), &[0.5, 1.0]);
    assert_eq!(s.server_params(), Some(&[0.5, 1.0][..]));
    let t = s.poll_transmit().expect("a frame");
    assert_eq!(t.to, 1);
    buf = t.frame.to_vec();
    assert_eq!(
        buf,
        kind_frame(FrameKind::Pull, 0, 0, 2, &f32_bytes(&[0.5, 1.0]))
    );
    w.handle_message(now, 0, &buf).unwrap();
    assert_eq!(w.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(w.params(), &[0.5, 1.0]);
    // No gradient: an empty push, read as a zero gradient; x stays.
    w.begin_round(now, &[0.5, 1.0], None);
    let t = w.poll_transmit().expect("a frame");
    assert_eq!(t.to, 0);
    buf = t.frame.to_vec();
    assert_eq!(buf, kind_frame(FrameKind::Push, 1, 1, 2, &[]));
    s.handle_message(now, 1, &buf).unwrap();
    s.begin_round(now, &[0.5, 1.0], None);
    assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: 1 }));
    assert_eq!(s.params(), &[0.5, 1.0]);
    assert_eq!(s.stats().frames_sent, 1);
    assert_eq!(s.stats().frames_received, 2);
}

#[test]
fn ssp_holds_the_answer_until_the_slowest_catches_up() {
    // n = 2, staleness 1, η = 0.5: every push moves x by (η/n)·g = 0.25·g.
    let now = Instant::now();
    let mode = PsMode::Ssp { staleness: 1 };
    let mut s = ParameterServer::new(PsConfig::new(0, 2, 0.5, mode, 1), vec![0.0]);
    let push = |round: u64, g: f32| kind_frame(FrameKind::Push, 1, round, 1, &f32_bytes(&[g]));
    let mut buf: Vec<u8>;
    // Worker 1 pushes round 0 while rank 0 has not begun: 1 round ahead is allowed.
    s.handle_message(now, 1, &push(0, 2.0)).unwrap();
    let t = s.poll_transmit().expect("a frame");
    assert_eq!(t.to, 1);
    buf = t.frame.to_vec();
    assert_eq!(
        buf,
        kind_frame(FrameKind::Pull, 0, 0, 1, &f32_bytes(&[-0.5]))
    );
    // Round 1 would put it 2 ahead: applied at once, answer held.
    s.handle_message(now, 1, &push(1, 2.0)).unwrap();
    assert_eq!(s.server_params(), Some(&[-1.0][..]));
    assert_eq!(s.poll_transmit(), None);
    // Rank 0 pushes round 0: both may proceed, with the x of this moment.
    s.begin_round(now, &[0.0], Some(&[4.0]));
    assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(s.params(), &[-2.0]);
    let t = s.poll_transmit().expect("a frame");
    assert_eq!(t.to, 1);
    buf = t.frame.to_vec();
    assert_eq!(
        buf,
        kind_frame(FrameKind::Pull, 0, 1, 1, &f32_bytes(&[-2.0]))
    );
    // Rank 0's own worker obeys the rule too. Rounds 1 and 2 keep it at most 1 round
    // ahead of worker 1's 2 pushes; round 3 would be 2 ahead: held until worker 1 pushes.
    for t in 1..=2 {
        s.begin_round(now, &[-2.0], Some(&[0.0]));
        assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: t }));
    }
    s.begin_round(now, &[-2.0], Some(&[0.0]));
    assert_eq!(s.poll_event(), None);
    assert_eq!(s.poll_transmit(), None);
    s.handle_message(now, 1, &push(2, 0.0)).unwrap();
    assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: 3 }));
    let t = s.poll_transmit().expect("a frame");
    assert_eq!(t.to, 1);
    buf = t.frame.to_vec();
    assert_eq!(
        buf,
        kind_frame(FrameKind::Pull, 0, 2, 1, &f32_bytes(&[-2.0]))
    );
}

/// Result of [`run_with_slow_worker`].
struct SlowRun {
    /// max over time and i of (rounds completed by i) − (rounds the server has from the
    /// slowest worker).
    completed_lead: i64,
    /// max over time of (rounds begun by the fastest) − (rounds begun by the slowest).
    begun_lead: u64,
    /// Rounds the slow worker had begun when every other worker had finished.
    slow_when_others_done: u64,
    /// Server parameters at the end.
    x: Vec<f32>,
}

/// n peers on the quadratic; worker `slow` begins a round only every `period` ticks,
/// the others as soon as they can; frames are delivered in send order. Every peer runs
/// `rounds` rounds. Checks SSP's invariant after every action.
fn run_with_slow_worker(n: usize, mode: PsMode, slow: Rank, period: u64, rounds: u64) -> SlowRun {
    let d = 3;
    let b = uniform_vectors(n, d, 1.0, 17);
    let mut net = Net::fifo(ps(n, 0.2, mode, &[0.0; 3]));
    let (mut mixing, mut begun, mut completed) = (vec![false; n], vec![0u64; n], vec![0u64; n]);
    let mut run = SlowRun {
        completed_lead: i64::MIN,
        begun_lead: 0,
        slow_when_others_done: u64::MAX,
        x: Vec::new(),
    };
    let s = mode.staleness();
    let mut check = |net: &Net<ParameterServer>, completed: &[u64], begun: &[u64]| {
        let c_min = *net.peers[0].clocks().unwrap().iter().min().unwrap();
        for (i, &c) in completed.iter().enumerate() {
            assert!(
                c <= c_min.saturating_add(s),
                "{mode:?}: peer {i} completed {c} rounds, slowest pushed {c_min}"
            );
            run.completed_lead = run.completed_lead.max(c as i64 - c_min as i64);
        }
        let lead = begun.iter().max().unwrap() - begun.iter().min().unwrap();
        run.begun_lead = run.begun_lead.max(lead);
        let others_done = (0..n).all(|i| i == slow || completed[i] == rounds);
        if others_done && run.slow_when_others_done == u64::MAX {
            run.slow_when_others_done = begun[slow];
        }
    };
    for tick in 0.. {
        assert!(tick < 100_000, "{mode:?}: no progress");
        for i in 0..n {
            if mixing[i] || begun[i] == rounds || (i == slow && tick % period != 0) {
                continue;
            }
            let x = net.peers[i].params().to_vec();
            let g: Vec<f32> = x.iter().zip(&b[i]).map(|(x, b)| x - b).collect();
            mixing[i] = true;
            begun[i] += 1;
            let done = net.begin(i, &x, Some(&g));
            completed[i] += done.len() as u64;
            mixing[i] &= done.is_empty();
            check(&net, &completed, &begun);
        }
        while let Some((to, done)) = net.deliver_one() {
            completed[to] += done.len() as u64;
            mixing[to] &= done.is_empty();
            check(&net, &completed, &begun);
        }
        if completed.iter().all(|&c| c == rounds) {
            break;
        }
    }
    run.x = net.peers[0].server_params().unwrap().to_vec();
    run
}

#[test]
fn ssp_keeps_every_worker_within_staleness_of_the_slowest() {
    for slow in [0, 2] {
        for staleness in [0, 1, 3] {
            let mode = PsMode::Ssp { staleness };
            let r = run_with_slow_worker(4, mode, slow, 5, 30);
            // The bound holds (checked after every action) and is reached: the fast
            // workers do run ahead as far as allowed, and no further.
            assert_eq!(
                r.completed_lead, staleness as i64,
                "slow {slow}, staleness {staleness}"
            );
            assert_eq!(
                r.begun_lead,
                staleness + 1,
                "slow {slow}, staleness {staleness}"
            );
            assert!(
                r.slow_when_others_done >= 30 - staleness,
                "slow {slow}, staleness {staleness}: {}",
                r.slow_when_others_done
            );
        }
    }
}

#[test]
fn bsp_keeps_workers_in_lock_step_with_a_slow_worker() {
    let r = run_with_slow_worker(4, PsMode::Bsp, 3, 4, 12);
    assert_eq!(r.completed_lead, 0);
    assert_eq!(r.begun_lead, 1);
}

#[test]
fn asp_never_holds_a_fast_worker_back() {
    let r = run_with_slow_worker(4, PsMode::Asp, 1, 10, 40);
    assert!(
        r.slow_when_others_done <= 40 / 10 + 1,
        "the others finished 40 rounds while the slow one began {}",
        r.slow_when_others_done
    );
    assert!(r.completed_lead >= 35);
}

#[test]
fn asp_converges_on_the_quadratic() {
    // Workers of equal speed: worker i may begin round r at tick 4r or later (rank 0,
    // whose answer is local, would otherwise push far more often and pull x towards its
    // own b_0: ASP weights workers by their push rate). Every tick a random number of
    // the frames in flight, chosen at random, is delivered, so pushes and answers lag by
    // a random number of ticks and the gradients are stale.
    let (n, d, lr, rounds) = (4, 8, 0.2, 300);
    let b = uniform_vectors(n, d, 1.0, 23);
    let x_star: Vec<f32> = serial_mean(&b).iter().map(|v| *v as f32).collect();
    let x0 = vec![10.0; d];
    let mut net = Net::shuffled(ps(n, lr, PsMode::Asp, &x0), 5);
    let mut rng = StdRng::seed_from_u64(9);
    let mut mixing = vec![false; n];
    let mut errors = Vec::new();
    for tick in 0u64.. {
        if (0..n).all(|i| !mixing[i] && net.peers[i].round() == rounds) {
            break;
        }
        for i in 0..n {
            let r = net.peers[i].round();
            if mixing[i] || r == rounds || tick < 4 * r {
                continue;
            }
            let x = net.peers[i].params().to_vec();
            let g: Vec<f32> = x.iter().zip(&b[i]).map(|(x, b)| x - b).collect();
            mixing[i] = net.begin(i, &x, Some(&g)).is_empty();
        }
        let k = rng.random_range(0..=net.in_flight.len());
        for _ in 0..k {
            let (to, done) = net.deliver_one().unwrap();
            mixing[to] &= done.is_empty();
        }
        errors.push(max_abs_diff(net.peers[0].server_params().unwrap(), &x_star));
    }
    let err0 = max_abs_diff(&x0, &x_star);
    // Per push x moves by (η/n)·(x_stale − b_i), at most 0.05·2 = 0.1 per coordinate once
    // x is near x* (the b_i lie in [−1, 1)): the error contracts geometrically, then
    // fluctuates around x* by the last few pushes' worth.
    let tail = &errors[errors.len() / 2..];
    let worst_tail = tail.iter().copied().fold(0.0, f32::max);
    let mean_tail = tail.iter().sum::<f32>() / tail.len() as f32;
    eprintln!(
        "ASP: {} ticks, error {err0} → {}; second half: mean {mean_tail}, worst {worst_tail}",
        errors.len(),
        errors.last().unwrap()
    );
    assert!(
        mean_tail <= 0.1,
        "mean error over the second half {mean_tail}"
    );
    assert!(
        worst_tail <= 0.25,
        "worst error over the second half {worst_tail}"
    );
    assert!(err0 >= 40.0 * worst_tail);
    for p in &net.peers {
        assert!(max_abs_diff(p.params(), &x_star) <= 0.25);
    }
}

#[test]
fn asp_with_a_common_minimiser_converges_exactly() {
    // All f_i share x* = b: no fluctuation, the error contracts to rounding level.
    let (n, d) = (3, 5);
    let b = vec![vec![1.5, -2.0, 0.25, 3.0, -0.5]; n];
    let mut net = Net::shuffled(ps(n, 0.5, PsMode::Asp, &[0.0; 5]), 1);
    for _ in 0..60 {
        let g = quadratic_grads(&net, &b);
        net.round(Some(&g));
    }
    for p in &net.peers {
        assert!(max_abs_diff(p.params(), &b[0]) <= 1e-5, "{:?}", p.params());
    }
    assert_eq!(
        net.peers.iter().map(|p| p.params().len()).sum::<usize>(),
        n * d
    );
}

#[test]
fn a_single_peer_is_its_own_server() {
    for mode in [PsMode::Bsp, PsMode::Ssp { staleness: 2 }, PsMode::Asp] {
        let mut p = ParameterServer::new(PsConfig::new(0, 1, 0.5, mode, 2), vec![1.0, 1.0]);
        p.begin_round(Instant::now(), &[1.0, 1.0], Some(&[2.0, -2.0]));
        assert_eq!(p.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
        assert_eq!(p.params(), &[0.0, 2.0], "{mode:?}");
        assert_eq!(p.poll_transmit(), None);
        assert!(p.out_peers().is_empty() && p.in_peers().is_empty());
    }
}

#[test]
fn roles_and_links() {
    let peers = ps(4, 0.1, PsMode::Bsp, &[0.0]);
    assert!(peers[0].is_server() && !peers[2].is_server());
    assert_eq!(peers[0].out_peers(), vec![1, 2, 3]);
    assert_eq!(peers[0].in_peers(), vec![1, 2, 3]);
    assert_eq!(peers[2].out_peers(), vec![0]);
    assert_eq!(peers[2].in_peers(), vec![0]);
    assert_eq!(peers[2].server_params(), None);
    assert_eq!(PsMode::Asp.staleness(), u64::MAX);
    assert_eq!(PsMode::Bsp.staleness(), 0);
}

/// Everything a refused frame must leave as it was.
type Snapshot = (
    Vec<f32>,
    Option<Vec<f32>>,
    Option<Vec<u64>>,
    GossipStats,
    u64,
    Option<Instant>,
);

fn snapshot(p: &ParameterServer) -> Snapshot {
    (
        p.params().to_vec(),
        p.server_params().map(<[f32]>::to_vec),
        p.clocks().map(<[u64]>::to_vec),
        p.stats(),
        p.round(),
        p.poll_timeout(),
    )
}

/// (what, transport sender, frame, the error expected).
type Case<'a> = (&'a str, Rank, Vec<u8>, fn(&GossipError) -> bool);

/// Offers each frame; every one must be refused with the matching error and change nothing.
fn assert_all_refused(p: &mut ParameterServer, cases: Vec<Case>) {
    let now = Instant::now();
    let before = snapshot(p);
    for (what, from, frame, expected) in cases {
        let err = p.handle_message(now, from, &frame).unwrap_err();
        assert!(expected(&err), "{what}: unexpected {err:?}");
        assert_eq!(snapshot(p), before, "{what} changed the state");
        assert_eq!(p.poll_event(), None, "{what}");
        assert_eq!(p.poll_transmit(), None, "{what}");
    }
}

#[test]
fn the_server_refuses_bad_pushes_without_changing_anything() {
    let now = Instant::now();
    let d = 4;
    let mut cfg = PsConfig::new(0, 3, 0.5, PsMode::Bsp, d);
    cfg.max_payload_bytes = 64; // room for an oversized but parsable payload
    let mut s = ParameterServer::new(cfg, vec![1.0; d]);
    let push = |from: Rank, round: u64, g: &[f32]| {
        kind_frame(FrameKind::Push, from, round, d as u32, &f32_bytes(g))
    };
    let g = [1.0, 2.0, 3.0, 4.0];
    let is_payload = |e: &GossipError| matches!(e, GossipError::Payload { from: 1, .. });
    assert_all_refused(
        &mut s,
        vec![
            (
                "pull kind",
                1,
                kind_frame(FrameKind::Pull, 1, 0, 4, &f32_bytes(&g)),
                |e| *e == GossipError::WrongKind(FrameKind::Pull),
            ),
            (
                "reduce kind",
                1,
                kind_frame(FrameKind::Reduce, 1, 0, 4, &f32_bytes(&g)),
                |e| matches!(e, GossipError::WrongKind(FrameKind::Reduce)),
            ),
            ("unknown peer", 3, push(3, 0, &g), |e| {
                *e == GossipError::NotANeighbour(3)
            }),
            ("itself", 0, push(0, 0, &g), |e| {
                *e == GossipError::NotANeighbour(0)
            }),
            ("sender mismatch", 1, push(2, 0, &g), |e| {
                matches!(
                    e,
                    GossipError::SenderMismatch {
                        from: 1,
                        claimed: 2
                    }
                )
            }),
            ("round ahead", 1, push(1, 1, &g), |e| {
                matches!(
                    e,
                    GossipError::RoundOutOfWindow {
                        round: 1,
                        lo: 0,
                        hi: 0,
                        ..
                    }
                )
            }),
            ("truncated", 1, push(1, 0, &g[..3]), is_payload),
            ("oversized", 1, push(1, 0, &[0.0; 5]), is_payload),
            ("over the limit", 1, push(1, 0, &[0.0; 17]), |e| {
                matches!(e, GossipError::Frame(_))
            }),
            ("NaN", 1, push(1, 0, &[1.0, f32::NAN, 0.0, 0.0]), is_payload),
            (
                "infinity",
                1,
                push(1, 0, &[0.0, 0.0, 0.0, f32::NEG_INFINITY]),
                is_payload,
            ),
            (
                "dimension",
                1,
                kind_frame(FrameKind::Push, 1, 0, 5, &f32_bytes(&[0.0; 5])),
                |e| {
                    matches!(
                        e,
                        GossipError::DimensionMismatch {
                            expected: 4,
                            got: 5,
                            ..
                        }
                    )
                },
            ),
        ],
    );
    s.handle_message(now, 1, &push(1, 0, &g)).unwrap();
    assert_all_refused(
        &mut s,
        vec![
            ("duplicate", 1, push(1, 0, &g), |e| {
                *e == GossipError::Duplicate { from: 1, round: 0 }
            }),
            ("next round while waiting", 1, push(1, 1, &g), |e| {
                matches!(
                    e,
                    GossipError::RoundOutOfWindow {
                        round: 1,
                        lo: 2,
                        hi: 1,
                        ..
                    }
                )
            }),
        ],
    );
    // The refusals did not leak into the update: x = 1 − 0.5·mean(g_0, g_1, g_2).
    s.handle_message(now, 2, &push(2, 0, &[0.0; 4])).unwrap();
    s.begin_round(now, &[1.0; 4], Some(&[2.0, 1.0, 0.0, -1.0]));
    assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(s.params(), &[0.5, 0.5, 0.5, 0.5]);
}

#[test]
fn a_worker_refuses_bad_pulls_without_changing_anything() {
    let now = Instant::now();
    let d = 2;
    let mut w = ParameterServer::new(PsConfig::new(1, 3, 0.5, PsMode::Asp, d), vec![0.0; d]);
    let pull = |from: Rank, round: u64, x: &[f32]| {
        kind_frame(FrameKind::Pull, from, round, d as u32, &f32_bytes(x))
    };
    assert_all_refused(
        &mut w,
        vec![("pull while idle", 0, pull(0, 0, &[1.0, 1.0]), |e| {
            matches!(
                e,
                GossipError::RoundOutOfWindow {
                    round: 0,
                    lo: 1,
                    hi: 0,
                    ..
                }
            )
        })],
    );
    w.begin_round(now, &[0.0; 2], Some(&[1.0, 1.0]));
    while w.poll_transmit().is_some() {}
    let is_payload = |e: &GossipError| matches!(e, GossipError::Payload { from: 0, .. });
    assert_all_refused(
        &mut w,
        vec![
            (
                "push kind",
                0,
                kind_frame(FrameKind::Push, 0, 0, 2, &f32_bytes(&[1.0, 1.0])),
                |e| *e == GossipError::WrongKind(FrameKind::Push),
            ),
            ("another worker", 2, pull(2, 0, &[1.0, 1.0]), |e| {
                *e == GossipError::NotANeighbour(2)
            }),
            ("round ahead", 0, pull(0, 1, &[1.0, 1.0]), |e| {
                matches!(
                    e,
                    GossipError::RoundOutOfWindow {
                        round: 1,
                        lo: 0,
                        hi: 0,
                        ..
                    }
                )
            }),
            ("truncated", 0, pull(0, 0, &[1.0]), |e| {
                matches!(e, GossipError::Payload { from: 0, .. })
            }),
            ("empty", 0, pull(0, 0, &[]), is_payload),
            ("over the limit", 0, pull(0, 0, &[1.0; 3]), |e| {
                matches!(e, GossipError::Frame(_))
            }),
            ("NaN", 0, pull(0, 0, &[f32::NAN, 1.0]), is_payload),
        ],
    );
    w.handle_message(now, 0, &pull(0, 0, &[3.0, -3.0])).unwrap();
    assert_eq!(w.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    assert_eq!(w.params(), &[3.0, -3.0]);
    assert_all_refused(
        &mut w,
        vec![("duplicate", 0, pull(0, 0, &[3.0, -3.0]), |e| {
            *e == GossipError::Duplicate { from: 0, round: 0 }
        })],
    );
}

#[test]
fn timeouts_name_who_holds_the_round_back() {
    let t0 = Instant::now();
    let timeout = Duration::from_secs(2);
    let with_timeout = |rank, mode| {
        let mut cfg = PsConfig::new(rank, 4, 0.1, mode, 1);
        cfg.round_timeout = timeout;
        ParameterServer::new(cfg, vec![0.0])
    };
    let mut w = with_timeout(2, PsMode::Bsp);
    w.begin_round(t0, &[0.0], None);
    w.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(w.poll_event(), None);
    w.handle_timeout(t0 + timeout);
    assert_eq!(
        w.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 0,
            missing: vec![0]
        })
    );
    w.handle_timeout(t0 + 2 * timeout);
    assert_eq!(w.poll_event(), None);

    // BSP server: every worker that has not pushed round 0.
    let mut s = with_timeout(0, PsMode::Bsp);
    s.handle_message(t0, 2, &kind_frame(FrameKind::Push, 2, 0, 1, &[]))
        .unwrap();
    s.begin_round(t0, &[0.0], None);
    s.handle_timeout(t0 + timeout);
    assert_eq!(
        s.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 0,
            missing: vec![1, 3]
        })
    );
    // SSP with staleness 1: round 1 of rank 0 waits only for workers with no push at all.
    let mut s = with_timeout(0, PsMode::Ssp { staleness: 1 });
    s.handle_message(t0, 2, &kind_frame(FrameKind::Push, 2, 0, 1, &[]))
        .unwrap();
    s.begin_round(t0, &[0.0], None);
    assert_eq!(s.poll_event(), Some(GossipEvent::Mixed { round: 0 }));
    s.begin_round(t0, &[0.0], None);
    s.handle_timeout(t0 + timeout);
    assert_eq!(
        s.poll_event(),
        Some(GossipEvent::RoundTimedOut {
            round: 1,
            missing: vec![1, 3]
        })
    );
}
