//! Checkpointed algorithm state: a network rebuilt from every peer's parameters, round and
//! [`Gossip::state`] continues bit for bit as the network it was saved from.

use murmur_compress::{Compressor, ErrorFeedback, TopK};
use murmur_gossip::sim::Sim;
use murmur_gossip::{
    AlgorithmState, Choco, ChocoConfig, DPsgd, DPsgdConfig, Gossip, Sgp, SgpConfig,
};
use murmur_topology::PushSchedule;

mod common;
use common::{ring_mh, uniform_vectors};

const N: usize = 5;
const D: usize = 24;

fn ef_topk() -> Box<dyn Compressor> {
    Box::new(ErrorFeedback::new(Box::new(TopK::new(0.25))))
}

/// Builds peer i of one algorithm from its parameters `x: [d]`.
type Make = fn(usize, Vec<f32>) -> Box<dyn Gossip>;

fn dpsgd(i: usize, x: Vec<f32>) -> Box<dyn Gossip> {
    let cfg = DPsgdConfig::from_matrix(&ring_mh(N), i, 0.0, D);
    Box::new(DPsgd::with_compressor(cfg, x, ef_topk()))
}

fn choco(i: usize, x: Vec<f32>) -> Box<dyn Gossip> {
    let cfg = ChocoConfig::from_matrix(&ring_mh(N), i, 0.0, 0.4, D);
    Box::new(Choco::new(cfg, x, ef_topk()))
}

fn sgp(i: usize, x: Vec<f32>) -> Box<dyn Gossip> {
    let schedule = PushSchedule::one_peer_exponential(N).unwrap();
    Box::new(Sgp::with_compressor(
        SgpConfig::new(schedule, i, 0.0, D),
        x,
        ef_topk(),
    ))
}

#[test]
fn a_network_restored_from_its_state_continues_bit_for_bit() {
    for (name, make) in [("dpsgd", dpsgd as Make), ("choco", choco), ("sgp", sgp)] {
        let xs = uniform_vectors(N, D, 3.0, 11);
        let mut original = Sim::new((0..N).map(|i| make(i, xs[i].clone())).collect());
        for _ in 0..7 {
            original.run_round(None).unwrap();
        }
        let saved: Vec<(Vec<f32>, u64, AlgorithmState)> = (0..N)
            .map(|i| {
                let p = original.peer(i);
                (p.params().to_vec(), p.round(), p.state())
            })
            .collect();
        assert!(
            saved.iter().all(|(_, _, s)| !s.is_empty()),
            "{name}: the error-feedback residual at least"
        );
        let restored: Vec<Box<dyn Gossip>> = saved
            .iter()
            .enumerate()
            .map(|(i, (x, round, state))| {
                let mut p = make(i, x.clone());
                p.start_at_round(*round).unwrap();
                p.restore_state(state).unwrap();
                p
            })
            .collect();
        let mut restored = Sim::new(restored);
        // A fresh network (no state restored) diverges from the original: the state matters.
        let mut forgetful = Sim::new(
            saved
                .iter()
                .enumerate()
                .map(|(i, (x, round, _))| {
                    let mut p = make(i, x.clone());
                    p.start_at_round(*round).unwrap();
                    p
                })
                .collect(),
        );
        for _ in 0..6 {
            original.run_round(None).unwrap();
            restored.run_round(None).unwrap();
            forgetful.run_round(None).unwrap();
        }
        for i in 0..N {
            assert_eq!(
                original.peer(i).params(),
                restored.peer(i).params(),
                "{name}: peer {i}"
            );
            assert_eq!(original.peer(i).state(), restored.peer(i).state());
        }
        assert!(
            (0..N).any(|i| original.peer(i).params() != forgetful.peer(i).params()),
            "{name}: restoring changed nothing"
        );
    }
}

#[test]
fn a_state_of_another_algorithm_or_size_is_refused_and_changes_nothing() {
    let xs = uniform_vectors(N, D, 3.0, 11);
    let mut sim = Sim::new((0..N).map(|i| choco(i, xs[i].clone())).collect());
    sim.run_round(None).unwrap();
    let choco_state = sim.peer(2).state();
    let mut s = Sim::new((0..N).map(|i| sgp(i, xs[i].clone())).collect());
    s.run_round(None).unwrap();
    let sgp_state = s.peer(2).state();

    let mut p = sgp(2, xs[2].clone());
    let before = p.state();
    assert!(p.restore_state(&choco_state).is_err());
    // Another d.
    let mut short = sgp_state.clone();
    short.vectors[0].1.pop();
    assert!(p.restore_state(&short).is_err());
    // A push-sum weight out of range, a NaN.
    let mut heavy = sgp_state.clone();
    heavy.scalars[0].1 = 1e9;
    assert!(p.restore_state(&heavy).is_err());
    let mut nan = sgp_state.clone();
    nan.vectors[0].1[0] = f32::NAN;
    assert!(p.restore_state(&nan).is_err());
    assert_eq!(p.state(), before, "unchanged after refusals");
    // CHOCO refuses SGP's state; D-PSGD refuses CHOCO's copies.
    let mut c = choco(2, xs[2].clone());
    assert!(c.restore_state(&sgp_state).is_err());
    let mut d = dpsgd(2, xs[2].clone());
    assert!(d.restore_state(&choco_state).is_err());
    assert!(p.restore_state(&sgp_state).is_ok());
}
