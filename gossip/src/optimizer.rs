//! Optimizers over flat parameter vectors: each turns a gradient (or, for an outer
//! optimizer, a pseudo-gradient) into the direction u that its caller applies with a
//! learning rate, x ← x − η u.
//!
//! One component for every place murmur updates parameters, shaped as burn-optim's (a
//! config plus a transform of the gradient with a state): a peer's **inner** optimizer
//! ([`HeavyBall`], [`AdamW`]), whose direction the algorithms apply
//! (x ← mix(x) − η u for D-PSGD, CHOCO-SGD, SGP, local SGD), and DiLoCo's **outer**
//! optimizer ([`Nesterov`], or [`HeavyBall`] with μ = 0 for plain averaging), applied to the
//! averaged pseudo-gradient Δ = x_before − x_after of H inner steps. State travels in
//! checkpoints ([`Optimizer::state`], [`Optimizer::restore`]).

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::BuildError;

/// A checkpointed optimizer state that does not fit.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the checkpoint's {what} has {got} values, this optimizer and model need {expected}")]
pub struct StateError {
    /// What the state is (`momentum`, `AdamW moments`).
    pub what: &'static str,
    /// The length this optimizer needs.
    pub expected: usize,
    /// The length given.
    pub got: usize,
}

/// An optimizer over flat parameter vectors of length d.
pub trait Optimizer: Send {
    /// Takes the parameters `x: [d]` and the (pseudo-)gradient `g: [d]` of this step and
    /// returns the direction `u: [d]` to apply with the learning rate, x ← x − η u.
    fn step(&mut self, x: &[f32], grad: &[f32]) -> &[f32];

    /// The direction of the last step, `[d]` (zeros before the first).
    fn direction(&self) -> &[f32];

    /// The state to checkpoint, `[s]` (heavy ball: s = d, the velocity; AdamW: s = 2d + 1).
    fn state(&self) -> Vec<f32>;

    /// Restores a state written by [`Optimizer::state`].
    ///
    /// # Errors
    /// [`StateError`] if its length does not fit this optimizer and model.
    fn restore(&mut self, state: Vec<f32>) -> Result<(), StateError>;

    /// Whether [`Optimizer::state`] carries anything from one step to the next (false for
    /// heavy ball with μ = 0, whose "velocity" is only the last gradient): a restarted or
    /// new peer fetches the state from its donors only if it does.
    fn keeps_state(&self) -> bool {
        true
    }
}

/// Heavy-ball momentum (Polyak 1964), as in D-PSGD with momentum: v ← μ v + g, u = v.
/// μ = 0 is plain SGD (u = g).
#[derive(Debug, Clone)]
pub struct HeavyBall {
    momentum: f32,
    velocity: Vec<f32>,
}

impl HeavyBall {
    /// Momentum `momentum` (μ ∈ [0, 1)) for `d` parameters, from a zero velocity.
    pub fn new(momentum: f32, d: usize) -> Self {
        Self {
            momentum,
            velocity: vec![0.0; d],
        }
    }
}

impl Optimizer for HeavyBall {
    fn step(&mut self, _x: &[f32], grad: &[f32]) -> &[f32] {
        debug_assert_eq!(grad.len(), self.velocity.len());
        let mu = self.momentum;
        for (v, g) in self.velocity.iter_mut().zip(grad) {
            *v = mu * *v + g;
        }
        &self.velocity
    }

    fn direction(&self) -> &[f32] {
        &self.velocity
    }

    fn state(&self) -> Vec<f32> {
        self.velocity.clone()
    }

    fn restore(&mut self, state: Vec<f32>) -> Result<(), StateError> {
        check_len("momentum", self.velocity.len(), state.len())?;
        self.velocity = state;
        Ok(())
    }

    fn keeps_state(&self) -> bool {
        self.momentum != 0.0
    }
}

/// Nesterov momentum (Sutskever et al. 2013, in the form of PyTorch's `SGD(nesterov=True)`):
/// v ← μ v + g, u = g + μ v. DiLoCo's outer optimizer (Douillard et al. 2023, "DiLoCo:
/// Distributed Low-Communication Training of Language Models", Algorithm 1: outer lr 0.7,
/// μ = 0.9), applied to the averaged pseudo-gradient.
#[derive(Debug, Clone)]
pub struct Nesterov {
    /// The velocity v ← μ v + g is heavy ball's; only the direction differs.
    ball: HeavyBall,
    direction: Vec<f32>,
}

impl Nesterov {
    /// Momentum `momentum` (μ ∈ [0, 1)) for `d` parameters, from a zero velocity.
    pub fn new(momentum: f32, d: usize) -> Self {
        Self {
            ball: HeavyBall::new(momentum, d),
            direction: vec![0.0; d],
        }
    }
}

impl Optimizer for Nesterov {
    fn step(&mut self, x: &[f32], grad: &[f32]) -> &[f32] {
        let mu = self.ball.momentum;
        let v = self.ball.step(x, grad);
        for ((u, g), v) in self.direction.iter_mut().zip(grad).zip(v) {
            *u = g + mu * v;
        }
        &self.direction
    }

    fn direction(&self) -> &[f32] {
        &self.direction
    }

    fn state(&self) -> Vec<f32> {
        self.ball.state()
    }

    fn restore(&mut self, state: Vec<f32>) -> Result<(), StateError> {
        self.ball.restore(state)
    }

    fn keeps_state(&self) -> bool {
        self.ball.keeps_state()
    }
}

/// The hyperparameters of [`AdamW`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// β₁, the first moment's decay (0.9).
    pub beta1: f32,
    /// β₂, the second moment's decay (0.999; language models often take 0.95).
    pub beta2: f32,
    /// ε added to √v̂ (1e-8).
    pub epsilon: f32,
    /// Decoupled weight decay λ (0.01): u gains λ x, so x ← x − η (… + λ x).
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2):
/// m ← β₁ m + (1 − β₁) g, v ← β₂ v + (1 − β₂) g², m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ),
/// u = m̂ / (√v̂ + ε) + λ x. With the caller's x ← x − η u the weight decay is decoupled from
/// the adaptive step and scaled by the same (scheduled) η, as in the paper's η_t.
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    m: Vec<f32>,
    v: Vec<f32>,
    direction: Vec<f32>,
    /// Steps taken, t.
    t: u64,
}

impl AdamW {
    /// AdamW with `config` for `d` parameters, from zero moments.
    pub fn new(config: AdamWConfig, d: usize) -> Self {
        Self {
            config,
            m: vec![0.0; d],
            v: vec![0.0; d],
            direction: vec![0.0; d],
            t: 0,
        }
    }
}

impl Optimizer for AdamW {
    fn step(&mut self, x: &[f32], grad: &[f32]) -> &[f32] {
        debug_assert_eq!(grad.len(), self.m.len());
        debug_assert_eq!(x.len(), self.m.len());
        let AdamWConfig {
            beta1,
            beta2,
            epsilon,
            weight_decay,
        } = self.config;
        self.t += 1;
        let t = self.t.min(i32::MAX as u64) as i32;
        let c1 = 1.0 / (1.0 - beta1.powi(t));
        let c2 = 1.0 / (1.0 - beta2.powi(t));
        for i in 0..grad.len() {
            let g = grad[i];
            let m = beta1 * self.m[i] + (1.0 - beta1) * g;
            let v = beta2 * self.v[i] + (1.0 - beta2) * g * g;
            self.m[i] = m;
            self.v[i] = v;
            self.direction[i] = (m * c1) / ((v * c2).sqrt() + epsilon) + weight_decay * x[i];
        }
        &self.direction
    }

    fn direction(&self) -> &[f32] {
        &self.direction
    }

    /// `[2d + 1]`: m, v, then t (exact as f32 up to 2²⁴ steps).
    fn state(&self) -> Vec<f32> {
        let mut s = Vec::with_capacity(2 * self.m.len() + 1);
        s.extend_from_slice(&self.m);
        s.extend_from_slice(&self.v);
        s.push(self.t as f32);
        s
    }

    fn restore(&mut self, mut state: Vec<f32>) -> Result<(), StateError> {
        let d = self.m.len();
        check_len("AdamW moments", 2 * d + 1, state.len())?;
        let t = state.pop().unwrap_or(0.0);
        self.t = if t.is_finite() && t >= 0.0 {
            t as u64
        } else {
            0
        };
        self.v = state.split_off(d);
        self.m = state;
        Ok(())
    }
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), StateError> {
    if expected == got {
        Ok(())
    } else {
        Err(StateError {
            what,
            expected,
            got,
        })
    }
}

/// The outer optimizer of DiLoCo, applied to the averaged pseudo-gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OuterOptimizer {
    /// Nesterov momentum ([`Nesterov`]), the paper's (η_out = 0.7, μ = 0.9).
    #[default]
    Nesterov,
    /// SGD with heavy-ball momentum ([`HeavyBall`]); μ = 0 and η_out = 1 (its defaults) is
    /// plain model averaging, i.e. local SGD.
    Sgd,
}

impl OuterOptimizer {
    /// The default outer learning rate η_out: 0.7 for Nesterov (the paper's), 1 for SGD
    /// (plain averaging).
    pub fn default_lr(self) -> f32 {
        match self {
            Self::Nesterov => 0.7,
            Self::Sgd => 1.0,
        }
    }

    /// The default outer momentum μ: 0.9 for Nesterov (the paper's), 0 for SGD.
    pub fn default_momentum(self) -> f32 {
        match self {
            Self::Nesterov => 0.9,
            Self::Sgd => 0.0,
        }
    }
}

impl fmt::Display for OuterOptimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nesterov => "nesterov",
            Self::Sgd => "sgd",
        })
    }
}

impl FromStr for OuterOptimizer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nesterov" => Ok(Self::Nesterov),
            "sgd" => Ok(Self::Sgd),
            other => Err(format!(
                "unknown outer optimizer {other:?}: expected nesterov or sgd"
            )),
        }
    }
}

/// DiLoCo's outer step: optimizer, learning rate η_out and momentum μ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OuterConfig {
    /// The outer optimizer.
    pub optimizer: OuterOptimizer,
    /// η_out > 0.
    pub lr: f32,
    /// μ ∈ [0, 1).
    pub momentum: f32,
}

impl OuterConfig {
    /// The paper's outer step: Nesterov, η_out = 0.7, μ = 0.9.
    pub fn paper() -> Self {
        Self::defaults(OuterOptimizer::Nesterov)
    }

    /// Plain model averaging: SGD, η_out = 1, μ = 0 (DiLoCo is then local SGD).
    pub fn averaging() -> Self {
        Self::defaults(OuterOptimizer::Sgd)
    }

    /// `optimizer` with its default η_out and μ.
    pub fn defaults(optimizer: OuterOptimizer) -> Self {
        Self {
            optimizer,
            lr: optimizer.default_lr(),
            momentum: optimizer.default_momentum(),
        }
    }

    /// Checks η_out > 0 (finite) and μ ∈ [0, 1).
    ///
    /// # Errors
    /// [`BuildError::Options`] naming the flag (`--outer-lr`, `--outer-momentum`).
    pub fn check(&self) -> Result<(), BuildError> {
        check_outer_lr(self.lr).map_err(|e| BuildError::Options(format!("--outer-lr {e}")))?;
        check_outer_momentum(self.momentum)
            .map_err(|e| BuildError::Options(format!("--outer-momentum {e}")))
    }

    /// The outer optimizer for `d` parameters, from a zero state.
    pub(crate) fn optimizer(&self, d: usize) -> Box<dyn Optimizer> {
        match self.optimizer {
            OuterOptimizer::Nesterov => Box::new(Nesterov::new(self.momentum, d)),
            OuterOptimizer::Sgd => Box::new(HeavyBall::new(self.momentum, d)),
        }
    }
}

/// Refuses an outer learning rate that is not a finite number > 0.
///
/// # Errors
/// "must be a finite number > 0, got …", to follow the flag.
pub fn check_outer_lr(lr: f32) -> Result<(), String> {
    if lr.is_finite() && lr > 0.0 {
        Ok(())
    } else {
        Err(format!("must be a finite number > 0, got {lr}"))
    }
}

/// Refuses an outer momentum outside [0, 1).
///
/// # Errors
/// "must be in [0, 1), got …", to follow the flag.
pub fn check_outer_momentum(mu: f32) -> Result<(), String> {
    if (0.0..1.0).contains(&mu) {
        Ok(())
    } else {
        Err(format!("must be in [0, 1), got {mu}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_ball_accumulates_the_gradients_geometrically() {
        let x = [0.0; 2];
        let mut o = HeavyBall::new(0.5, 2);
        assert_eq!(o.direction(), &[0.0, 0.0]);
        assert_eq!(o.step(&x, &[1.0, -2.0]), &[1.0, -2.0]);
        assert_eq!(o.step(&x, &[1.0, 0.0]), &[1.5, -1.0]);
        assert_eq!(o.step(&x, &[0.0, 0.0]), &[0.75, -0.5]);
        let mut sgd = HeavyBall::new(0.0, 1);
        sgd.step(&[0.0], &[3.0]);
        assert_eq!(sgd.step(&[0.0], &[-1.0]), &[-1.0], "μ = 0 is plain SGD");
    }

    #[test]
    fn nesterov_looks_ahead_by_one_momentum_step() {
        let mut o = Nesterov::new(0.5, 1);
        // v = 1, u = 1 + 0.5·1; then v = 0.5 + 1 = 1.5, u = 1 + 0.75.
        assert_eq!(o.step(&[0.0], &[1.0]), &[1.5]);
        assert_eq!(o.step(&[0.0], &[1.0]), &[1.75]);
        let mut plain = Nesterov::new(0.0, 1);
        assert_eq!(plain.step(&[0.0], &[2.0]), &[2.0], "μ = 0 is the gradient");
    }

    #[test]
    fn adamw_first_step_is_the_sign_plus_the_decay() {
        // After one step m̂ = g and v̂ = g², so u = g/(|g| + ε) + λ x ≈ sign(g) + λ x.
        let mut o = AdamW::new(AdamWConfig::default(), 3);
        let u = o.step(&[1.0, -2.0, 0.0], &[0.5, -4.0, 0.0]).to_vec();
        assert!((u[0] - (1.0 + 0.01)).abs() < 1e-6, "{u:?}");
        assert!((u[1] - (-1.0 - 0.02)).abs() < 1e-6, "{u:?}");
        assert_eq!(u[2], 0.0, "no gradient, no parameter: no step");
    }

    #[test]
    fn adamw_matches_a_hand_computed_second_step() {
        let c = AdamWConfig {
            beta1: 0.5,
            beta2: 0.5,
            epsilon: 0.0,
            weight_decay: 0.0,
        };
        let mut o = AdamW::new(c, 1);
        o.step(&[0.0], &[2.0]);
        // m₁ = 0.5·2 = 1, v₁ = 0.5·4 = 2; with g₂ = 0: m₂ = 0.5, v₂ = 1.
        // m̂ = 0.5 / 0.75, v̂ = 1 / 0.75, u = (2/3) / √(4/3) = 0.57735.
        let u = o.step(&[0.0], &[0.0])[0];
        assert!((u - 0.577_350_3).abs() < 1e-6, "{u}");
    }

    #[test]
    fn only_an_optimizer_with_memory_keeps_a_state_worth_fetching() {
        assert!(!HeavyBall::new(0.0, 3).keeps_state(), "plain SGD");
        assert!(HeavyBall::new(0.9, 3).keeps_state());
        assert!(Nesterov::new(0.9, 3).keeps_state());
        assert!(AdamW::new(AdamWConfig::default(), 3).keeps_state());
    }

    #[test]
    fn states_round_trip_and_a_wrong_length_is_refused() {
        let x = [0.1, 0.2, 0.3];
        let g = [1.0, 2.0, 3.0];
        let mut opts: Vec<(Box<dyn Optimizer>, Box<dyn Optimizer>)> = vec![
            (
                Box::new(HeavyBall::new(0.9, 3)),
                Box::new(HeavyBall::new(0.9, 3)),
            ),
            (
                Box::new(Nesterov::new(0.9, 3)),
                Box::new(Nesterov::new(0.9, 3)),
            ),
            (
                Box::new(AdamW::new(AdamWConfig::default(), 3)),
                Box::new(AdamW::new(AdamWConfig::default(), 3)),
            ),
        ];
        for (o, p) in &mut opts {
            o.step(&x, &g);
            o.step(&x, &g);
            p.restore(o.state()).unwrap();
            assert_eq!(p.step(&x, &[0.5; 3]), o.step(&x, &[0.5; 3]));
            let err = p.restore(vec![0.0; 2]).unwrap_err();
            assert_eq!(err.got, 2);
            assert!(err.to_string().contains("2 values"), "{err}");
        }
    }
}
