//! The local (inner) optimizer of a peer: `--optimizer sgd|adamw` and the learning-rate
//! schedule (`--lr-schedule`, `--warmup-rounds`).
//!
//! The optimizers themselves are pure and live with the algorithms in
//! [`murmur_gossip::optimizer`] (DiLoCo's outer optimizer is one of them); this module picks and
//! builds the inner one from the command line.

use clap::ValueEnum;
pub use murmur_gossip::optimizer::{
    AdamW, AdamWConfig, HeavyBall, Nesterov, Optimizer, StateError,
};

/// `--optimizer`: the peer's local optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerKind {
    /// SGD with heavy-ball momentum `--momentum` (v ← μ v + g).
    Sgd,
    /// AdamW (Loshchilov & Hutter 2019) with `--weight-decay` and β = (0.9, `--adam-beta2`).
    Adamw,
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adamw => "adamw",
        })
    }
}

/// The inner optimizer for `d` parameters.
pub fn build(
    kind: OptimizerKind,
    momentum: f32,
    adamw: AdamWConfig,
    d: usize,
) -> Box<dyn Optimizer> {
    match kind {
        OptimizerKind::Sgd => Box::new(HeavyBall::new(momentum, d)),
        OptimizerKind::Adamw => Box::new(AdamW::new(adamw, d)),
    }
}

/// `--lr-schedule`: how η varies over the run's rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScheduleKind {
    /// η throughout (after the warm-up).
    Constant,
    /// Cosine decay from η to η/10 over the rounds after the warm-up (Loshchilov & Hutter
    /// 2017, SGDR, without restarts), as language models are trained.
    Cosine,
}

impl std::fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::Cosine => "cosine",
        })
    }
}

/// The learning-rate multiplier s_t ∈ (0, 1] of round t: η_t = s_t η.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The shape after the warm-up.
    pub kind: ScheduleKind,
    /// Rounds of linear warm-up from η/W to η (0: none).
    pub warmup: u64,
    /// The run's rounds T (the cosine reaches η/10 at t = T).
    pub total: u64,
}

impl Schedule {
    /// The final multiplier of the cosine schedule.
    pub const COSINE_FLOOR: f64 = 0.1;

    /// s_t for round `t` (counted from 0): (t + 1)/W during the warm-up, then 1 (constant)
    /// or floor + (1 − floor)·(1 + cos(π p))/2 with p = (t − W)/(T − W) (cosine).
    pub fn factor(&self, t: u64) -> f64 {
        if t < self.warmup {
            return (t + 1) as f64 / self.warmup as f64;
        }
        match self.kind {
            ScheduleKind::Constant => 1.0,
            ScheduleKind::Cosine => {
                let span = self.total.saturating_sub(self.warmup).max(1);
                let p = ((t - self.warmup) as f64 / span as f64).min(1.0);
                let floor = Self::COSINE_FLOOR;
                floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }
        }
    }

    /// Whether every round has s_t = 1 (no warm-up, constant).
    pub fn is_constant(&self) -> bool {
        self.warmup == 0 && self.kind == ScheduleKind::Constant
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_rises_linearly_then_cosine_falls_to_the_floor() {
        let s = Schedule {
            kind: ScheduleKind::Cosine,
            warmup: 4,
            total: 104,
        };
        assert_eq!(s.factor(0), 0.25);
        assert_eq!(s.factor(3), 1.0);
        assert!((s.factor(4) - 1.0).abs() < 1e-12);
        assert!(
            (s.factor(54) - 0.55).abs() < 1e-12,
            "halfway: (1 + floor)/2"
        );
        assert!((s.factor(104) - 0.1).abs() < 1e-12);
        assert!((s.factor(500) - 0.1).abs() < 1e-12, "stays at the floor");
        let c = Schedule {
            kind: ScheduleKind::Constant,
            warmup: 0,
            total: 10,
        };
        assert!(c.is_constant() && c.factor(7) == 1.0);
    }
}
