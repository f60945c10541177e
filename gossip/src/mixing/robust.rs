//! Byzantine-robust mixing by self-centred clipping: ClippedGossip (He, Karimireddy &
//! Jaggi 2022, "Byzantine-robust decentralized learning via ClippedGossip", Algorithm 1).
//!
//! Plain gossip mixes x_i ← Σ_j W_ij x_j, so one neighbour that sends an arbitrary vector
//! moves x_i arbitrarily far. ClippedGossip mixes the neighbours' *differences from x_i*,
//! each clipped to a radius τ_i:
//!
//! ```text
//! x_i ← x_i + Σ_{j ≠ i} W_ij · clip(x_j − x_i, τ_i),    clip(v, τ) = v · min(1, τ / ‖v‖₂)
//! ```
//!
//! With no difference longer than τ_i this is plain gossip exactly (Σ_j W_ij = 1). A
//! Byzantine neighbour moves x_i by at most W_ij τ_i per round, whatever it sends.
//!
//! **The radius.** Fixed (`--robust clip:TAU`), or adaptive (`--robust clip`): each round,
//! τ_i is the (b + 1)-th largest of the distances ‖x_j − x_i‖ of the neighbours heard
//! this round, with b = 1 (so the farthest neighbour is clipped to the distance of the
//! next one, and with one neighbour nothing is clipped); `clip:auto:B` trusts all but the B
//! farthest. This is the rule of the paper's public implementation (the paper's analysis
//! sets τ_i from the honest neighbours' expected distances, which a peer cannot observe).
//!
//! **When it fails.** The paper's guarantee needs the Byzantine weight around every honest
//! peer, δ_i = Σ_{j Byzantine} W_ij, to be small against the spectral gap γ of the honest
//! subgraph (δ_max = O(γ²)); on a ring a Byzantine neighbour holds a third of a peer's
//! weight and cuts the ring, so clipping bounds the damage but cannot restore consensus
//! across the cut.
//!
//! Pure logic: [`ClipRule`] parses and picks τ; [`clipped_mix`] mixes. [`crate::DPsgd`]
//! applies it with [`crate::DPsgdConfig::robust`].

use std::fmt;
use std::str::FromStr;

/// How τ_i is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClipRule {
    /// A fixed radius τ > 0 (parameter-space distance, L2).
    Fixed(f32),
    /// The (b + 1)-th largest neighbour distance of the round (b = the neighbours allowed
    /// to be Byzantine, default 1).
    Adaptive {
        /// b ≥ 1.
        byzantine: usize,
    },
}

impl ClipRule {
    /// τ_i for a round whose neighbours are at `distances` (any order): the fixed radius,
    /// or the (b + 1)-th largest distance (the smallest one when there are at most b).
    /// `None`: nothing to clip (no neighbour).
    pub fn radius(&self, distances: &[f64]) -> Option<f64> {
        match *self {
            ClipRule::Fixed(tau) => Some(f64::from(tau)),
            ClipRule::Adaptive { byzantine } => {
                if distances.is_empty() {
                    return None;
                }
                let mut d = distances.to_vec();
                d.sort_by(|a, b| b.total_cmp(a));
                Some(d[byzantine.min(d.len() - 1)])
            }
        }
    }
}

impl ClipRule {
    /// Each neighbour's clipping scale min(1, τ/‖v_j‖) for neighbours at `distances` (0 for
    /// one that is not finite: infinitely far), with τ from [`ClipRule::radius`] over the
    /// finite distances. A neighbour is clipped when its scale is below 1.
    pub fn scales(&self, distances: &[f64]) -> Vec<f64> {
        let finite: Vec<f64> = distances
            .iter()
            .copied()
            .filter(|d| d.is_finite())
            .collect();
        let tau = self.radius(&finite).unwrap_or(0.0);
        distances
            .iter()
            .map(|&d| {
                if !d.is_finite() {
                    0.0
                } else if d > tau {
                    tau / d
                } else {
                    1.0
                }
            })
            .collect()
    }
}

impl fmt::Display for ClipRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClipRule::Fixed(tau) => write!(f, "clip:{tau}"),
            ClipRule::Adaptive { byzantine: 1 } => f.write_str("clip"),
            ClipRule::Adaptive { byzantine } => write!(f, "clip:auto:{byzantine}"),
        }
    }
}

impl FromStr for ClipRule {
    type Err = String;

    /// `clip` (adaptive, b = 1), `clip:auto:B` (adaptive, B ≥ 1) or `clip:TAU` (τ > 0).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown robust rule {s:?}: expected clip (adaptive radius), clip:auto:B (trust \
                 all but the B farthest neighbours, B ≥ 1) or clip:TAU (a fixed radius τ > 0)"
            )
        };
        let Some(rest) = s.strip_prefix("clip") else {
            return Err(bad());
        };
        if rest.is_empty() {
            return Ok(ClipRule::Adaptive { byzantine: 1 });
        }
        let rest = rest.strip_prefix(':').ok_or_else(bad)?;
        if let Some(b) = rest.strip_prefix("auto:") {
            return match b.parse::<usize>() {
                Ok(b) if b >= 1 => Ok(ClipRule::Adaptive { byzantine: b }),
                _ => Err(bad()),
            };
        }
        match rest.parse::<f32>() {
            Ok(tau) if tau.is_finite() && tau > 0.0 => Ok(ClipRule::Fixed(tau)),
            _ => Err(bad()),
        }
    }
}

/// Adds Σ_j w_j · (x + clip(x_j − x, τ)) to `acc: [d]`, over the neighbours
/// `(w_j, x_j: [d])`, with τ from `rule` over their distances to `x: [d]`; returns how
/// many were clipped. A neighbour with a value that is not finite counts as infinitely far:
/// it contributes w_j · x, none of its own values.
pub fn clipped_mix(
    rule: ClipRule,
    x: &[f32],
    neighbours: &[(f32, &[f32])],
    acc: &mut [f32],
) -> usize {
    let distances: Vec<f64> = neighbours.iter().map(|(_, xj)| distance(x, xj)).collect();
    let scales = rule.scales(&distances);
    for ((w, xj), &scale) in neighbours.iter().zip(&scales) {
        let scale = scale as f32;
        let (a, b) = (w * (1.0 - scale), w * scale);
        if b == 0.0 {
            // None of x_j (it may not be finite): w_j · x.
            for (o, xi) in acc.iter_mut().zip(x) {
                *o += a * xi;
            }
        } else {
            for ((o, xi), xj) in acc.iter_mut().zip(x).zip(xj.iter()) {
                *o += a * xi + b * xj;
            }
        }
    }
    scales.iter().filter(|&&s| s < 1.0).count()
}

/// ‖a − b‖₂ in `f64` (infinite if any difference is not finite).
pub fn distance(a: &[f32], b: &[f32]) -> f64 {
    let s: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            let d = f64::from(*y) - f64::from(*x);
            d * d
        })
        .sum();
    if s.is_finite() {
        s.sqrt()
    } else {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_print_back() {
        for s in ["clip", "clip:auto:2", "clip:0.5"] {
            let r: ClipRule = s.parse().unwrap();
            assert_eq!(r.to_string(), s);
        }
        assert_eq!(
            "clip:auto:1".parse::<ClipRule>().unwrap().to_string(),
            "clip"
        );
        for bad in [
            "",
            "clap",
            "clip:",
            "clip:0",
            "clip:-1",
            "clip:nan",
            "clip:auto:0",
            "clip:auto:x",
            "clipper",
        ] {
            let e = bad.parse::<ClipRule>().unwrap_err();
            assert!(e.contains("clip:TAU"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_adaptive_radius_is_the_second_largest_distance() {
        let r = ClipRule::Adaptive { byzantine: 1 };
        assert_eq!(r.radius(&[1.0, 5.0, 3.0]), Some(3.0));
        assert_eq!(r.radius(&[2.0]), Some(2.0));
        assert_eq!(r.radius(&[]), None);
        let r2 = ClipRule::Adaptive { byzantine: 2 };
        assert_eq!(r2.radius(&[1.0, 5.0, 3.0, 4.0]), Some(3.0));
        assert_eq!(ClipRule::Fixed(0.5).radius(&[9.0]), Some(0.5_f32 as f64));
    }

    #[test]
    fn without_clipping_it_is_plain_gossip_and_an_outlier_moves_x_by_at_most_w_tau() {
        let x = [0.0f32, 0.0];
        let a = [1.0f32, 0.0];
        let b = [0.0f32, 2.0];
        let evil = [1e6f32, -1e6];
        // Nothing beyond τ: Σ w_j x_j + (Σ w_j) ... each term w_j x_j exactly.
        let mut acc = vec![0.0f32; 2];
        let n = clipped_mix(ClipRule::Fixed(10.0), &x, &[(0.5, &a), (0.5, &b)], &mut acc);
        assert_eq!(n, 0);
        assert_eq!(acc, vec![0.5, 1.0]);
        // The outlier is clipped to the second-largest distance (2): it moves x by w · 2.
        let mut acc = vec![0.0f32; 2];
        let n = clipped_mix(
            ClipRule::Adaptive { byzantine: 1 },
            &x,
            &[(0.25, &a), (0.25, &b), (0.25, &evil)],
            &mut acc,
        );
        assert_eq!(n, 1);
        let evil_part = [acc[0] - 0.25, acc[1] - 0.5];
        let moved = (evil_part[0].powi(2) + evil_part[1].powi(2)).sqrt();
        assert!((moved - 0.25 * 2.0).abs() < 1e-5, "{moved}");
        // A neighbour with NaN contributes w · x (nothing of its own).
        let mut acc = vec![0.0f32; 2];
        let nan = [f32::NAN, 1.0];
        assert_eq!(
            clipped_mix(ClipRule::Fixed(1.0), &x, &[(0.5, &nan)], &mut acc),
            1
        );
        assert_eq!(acc, vec![0.0, 0.0]);
    }
}
