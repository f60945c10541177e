//! The pieces of mixing that several algorithms share, so that each is written once:
//!
//! * [`local_step`]: y = x − η g, the local SGD step of local SGD, DiLoCo's inner steps,
//!   Streaming DiLoCo and CHOCO-SGD's half step x^(t+½);
//! * [`check_symmetric`]: W (n×n) symmetric, for the algorithms that mix pairwise;
//! * [`choco_diverged`]: CHOCO-SGD's divergence event, for `choco` and `choco-auto`;
//! * [`not_finite`]: the first coordinate of a vector that is not finite, for the
//!   divergence checks that end a run with [`crate::GossipEvent::Diverged`];
//! * `exchange`: the W-weighted exchange of one round (who sends, who is awaited,
//!   early and late frames, the straggler policy) under D-PSGD, CHOCO-SGD and their kin;
//! * `reweight`: W re-weighted around departed peers;
//! * [`robust`]: Byzantine-robust mixing by clipping (ClippedGossip);
//! * [`link_meter`]: per-link bandwidth measurement for the per-link algorithms;
//! * [`pseudo_gradient`]: DiLoCo's outer step and the compressors its pseudo-gradients take;
//! * [`forward`]: the `Gossip` methods a wrapping algorithm passes on, written once;
//! * [`streaming`]: D-PSGD's message of a large model streamed in parts, each mixed as it
//!   arrives and sent on for the next round as soon as it has mixed;
//! * `outer_round`: the outer-round bookkeeping of algorithms that wrap another
//!   (local SGD, DiLoCo, phase schedules).

pub(crate) mod exchange;
pub mod forward;
pub mod link_meter;
pub(crate) mod outer_round;
pub mod pseudo_gradient;
pub(crate) mod reweight;
pub mod robust;
pub mod streaming;

use murmur_topology::MixingMatrix;

use crate::{GossipEvent, Rank};

/// The local step y = x − η g into `out: [d]`; `x` itself when `grad` is `None` (a step of
/// zero gradient). `x`, `grad`: `[d]`; `lr`: η.
///
/// # Panics
/// If `grad` or `out` does not have the length of `x`.
pub fn local_step(out: &mut [f32], x: &[f32], grad: Option<&[f32]>, lr: f32) {
    assert_eq!(out.len(), x.len(), "x must have length d");
    match grad {
        Some(g) => {
            assert_eq!(g.len(), x.len(), "grad must have length d");
            for ((y, xi), gi) in out.iter_mut().zip(x).zip(g) {
                *y = xi - lr * gi;
            }
        }
        None => out.copy_from_slice(x),
    }
}

/// `Ok` if `w` (n×n) is symmetric within 1e-12 (an undirected graph), else a message naming
/// the first pair that differs: the per-link algorithms mix pairwise and keep the average
/// only then.
///
/// # Errors
/// The first `(i, j)` with w_ij ≠ w_ji, with both values.
pub fn check_symmetric(w: &MixingMatrix) -> Result<(), String> {
    let n = w.n();
    for i in 0..n {
        for j in 0..i {
            if (w.get(i, j) - w.get(j, i)).abs() > 1e-12 {
                return Err(format!(
                    "W must be symmetric (an undirected graph): w[{i}][{j}] = {} but \
                     w[{j}][{i}] = {}",
                    w.get(i, j),
                    w.get(j, i)
                ));
            }
        }
    }
    Ok(())
}

/// CHOCO-SGD's divergence event: peer `rank`'s x − x̂ is no longer finite, so its message of
/// round `round` does not decode (`cause`) and the run must stop ([`crate::Choco`],
/// [`crate::ChocoAuto`]).
pub fn choco_diverged(rank: Rank, round: u64, cause: impl std::fmt::Display) -> GossipEvent {
    GossipEvent::Diverged {
        round,
        reason: format!(
            "peer {rank}: x − x̂ is not finite, its CHOCO message does not decode ({cause})"
        ),
    }
}

/// The first coordinate of `x: [d]` that is not finite, with its value.
pub fn not_finite(x: &[f32]) -> Option<(usize, f32)> {
    x.iter().position(|v| !v.is_finite()).map(|k| (k, x[k]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_step_is_x_minus_lr_g_and_x_without_a_gradient() {
        let mut y = [0.0; 3];
        local_step(&mut y, &[1.0, 2.0, 3.0], Some(&[1.0, -2.0, 0.5]), 0.5);
        assert_eq!(y, [0.5, 3.0, 2.75]);
        local_step(&mut y, &[1.0, 2.0, 3.0], None, 0.5);
        assert_eq!(y, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn a_directed_w_is_named_by_its_first_asymmetric_pair() {
        let ring = murmur_topology::Graph::ring(4).unwrap();
        let w = MixingMatrix::metropolis_hastings(&ring).unwrap();
        assert!(check_symmetric(&w).is_ok());
        let directed = MixingMatrix::from_dense(vec![
            vec![0.5, 0.5, 0.0],
            vec![0.0, 0.5, 0.5],
            vec![0.5, 0.0, 0.5],
        ])
        .unwrap();
        let err = check_symmetric(&directed).unwrap_err();
        assert!(err.contains("w[1][0] = 0 but w[0][1] = 0.5"), "{err}");
        assert_eq!(
            not_finite(&[1.0, f32::NAN, f32::INFINITY]).map(|p| p.0),
            Some(1)
        );
        assert_eq!(not_finite(&[1.0]), None);
    }
}
