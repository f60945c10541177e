//! Re-weighting W after a peer leaves or returns, shared by D-PSGD and CHOCO-SGD: each
//! surviving peer moves the weight of a departed in-neighbour onto itself (the rule that
//! keeps W doubly stochastic on the remaining graph) and takes the original weights back
//! from the round the peer returns.

use murmur_topology::MixingMatrix;

use crate::{MembershipError, Rank};

/// A peer's changes of weights after departures and returns: (first round, W_ii, W_ij in
/// the order of its `in_weights`), by first round. Shared by [`crate::DPsgd`]
/// and [`crate::Choco`].
#[derive(Debug, Default)]
pub(crate) struct Reweighting(Vec<(u64, f64, Vec<f64>)>);

impl Reweighting {
    /// The part of [`crate::Gossip::peer_rejoined`] that D-PSGD and CHOCO share: peer `me` =
    /// (rank, in-weights) takes `back` in again from round `at` with `w` (n×n). If
    /// `involved` (it exchanges frames with `back`, or must act in round `at`), round `at`
    /// must not have begun in `ex`; the new weights apply from `at`, or from this peer's
    /// next round if it is already past `at`.
    ///
    /// # Errors
    /// [`MembershipError::BadMatrix`] ([`new_weights`]); [`MembershipError::TooLate`].
    pub(crate) fn take_back(
        &mut self,
        ex: &mut crate::mixing::exchange::Exchange,
        (me, in_weights): (Rank, &[(Rank, f64)]),
        w: &MixingMatrix,
        (back, at): (Rank, u64),
        involved: bool,
    ) -> Result<(), MembershipError> {
        let (wii, wij) = new_weights(me, in_weights, w)?;
        let round = ex.round();
        if involved && !ex.rejoin(back, at) {
            return Err(MembershipError::TooLate { at, round });
        }
        let from = at.max(round + u64::from(!ex.is_idle()));
        self.schedule(from, wii, wij);
        Ok(())
    }

    /// Uses (W_ii, W_ij) from round `from` on.
    pub(crate) fn schedule(&mut self, from: u64, wii: f64, wij: Vec<f64>) {
        let at = self.0.partition_point(|c| c.0 <= from);
        self.0.insert(at, (from, wii, wij));
    }

    /// Applies the changes due by round `round` to `self_weight` and `in_weights`.
    pub(crate) fn apply(
        &mut self,
        round: u64,
        self_weight: &mut f64,
        in_weights: &mut [(Rank, f64)],
    ) {
        let due = self.0.partition_point(|c| c.0 <= round);
        for (_, wii, wij) in self.0.drain(..due) {
            *self_weight = wii;
            for ((_, w), new) in in_weights.iter_mut().zip(wij) {
                *w = new;
            }
        }
    }
}

/// [`new_weights`] for a `w` formed after peer `gone` left, which must give it no weight.
pub(crate) fn weights_without(
    me: Rank,
    in_weights: &[(Rank, f64)],
    w: &MixingMatrix,
    gone: Rank,
) -> Result<(f64, Vec<f64>), MembershipError> {
    let weights = new_weights(me, in_weights, w)?;
    if w.get(me, gone) != 0.0 {
        return Err(MembershipError::BadMatrix(format!(
            "W[{me}][{gone}] = {} but peer {gone} has left",
            w.get(me, gone)
        )));
    }
    Ok(weights)
}

/// Peer `me`'s weights in `w`: (W_ii, W_ij for each j of `in_weights`, in that order).
/// Refuses a `w` of the wrong size or one that weighs a peer `me` has no link from.
pub(crate) fn new_weights(
    me: Rank,
    in_weights: &[(Rank, f64)],
    w: &MixingMatrix,
) -> Result<(f64, Vec<f64>), MembershipError> {
    let n = w.n();
    if me >= n || in_weights.iter().any(|&(j, _)| j >= n) {
        return Err(MembershipError::BadMatrix(format!(
            "it is {n}×{n}, too small for peer {me} and its neighbours"
        )));
    }
    if let Some((j, _)) = w
        .in_weights(me)
        .into_iter()
        .find(|&(j, _)| !in_weights.iter().any(|&(k, _)| k == j))
    {
        return Err(MembershipError::BadMatrix(format!(
            "it gives peer {me} a weight on peer {j}, which is not an in-neighbour"
        )));
    }
    Ok((
        w.self_weight(me),
        in_weights.iter().map(|&(j, _)| w.get(me, j)).collect(),
    ))
}
