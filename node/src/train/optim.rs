//! The local optimizer: turns a peer's stochastic gradient into the update direction u that
//! its algorithm applies, x ← mix(x) − η u (D-PSGD, CHOCO-SGD, SGP, local SGD) or that the
//! all-reduce and the parameter server average.
//!
//! One component for `murmur peer`, `murmur simulate` and `murmur bench`, shaped as
//! burn-optim's momentum (a config plus a transform of the gradient with a state), so that
//! further optimizers (AdamW as the inner optimizer, Nesterov as DiLoCo's outer one) are one
//! more implementation of [`Optimizer`]. Its state travels in checkpoints.

use anyhow::bail;

/// A local optimizer over flat parameter vectors of length d.
pub trait Optimizer: Send {
    /// Takes the gradient `g: [d]` of this step and returns the direction `u: [d]` the
    /// algorithm applies with the learning rate.
    fn step(&mut self, grad: &[f32]) -> &[f32];

    /// The direction of the last step, `[d]` (zeros before the first).
    fn direction(&self) -> &[f32];

    /// The state to checkpoint, `[s]` (for heavy-ball momentum s = d: the velocity).
    fn state(&self) -> Vec<f32>;

    /// Restores a state written by [`Optimizer::state`].
    ///
    /// # Errors
    /// If its length does not fit this optimizer and model.
    fn restore(&mut self, state: Vec<f32>) -> anyhow::Result<()>;
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
    fn step(&mut self, grad: &[f32]) -> &[f32] {
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

    fn restore(&mut self, state: Vec<f32>) -> anyhow::Result<()> {
        if state.len() != self.velocity.len() {
            bail!(
                "the checkpoint's momentum has {} values, the model {}",
                state.len(),
                self.velocity.len()
            );
        }
        self.velocity = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_ball_accumulates_the_gradients_geometrically() {
        let mut o = HeavyBall::new(0.5, 2);
        assert_eq!(o.direction(), &[0.0, 0.0]);
        assert_eq!(o.step(&[1.0, -2.0]), &[1.0, -2.0]);
        assert_eq!(o.step(&[1.0, 0.0]), &[1.5, -1.0]);
        assert_eq!(o.step(&[0.0, 0.0]), &[0.75, -0.5]);
        let mut sgd = HeavyBall::new(0.0, 1);
        sgd.step(&[3.0]);
        assert_eq!(sgd.step(&[-1.0]), &[-1.0], "μ = 0 is plain SGD");
    }

    #[test]
    fn the_state_round_trips_and_a_wrong_length_is_refused() {
        let mut o = HeavyBall::new(0.9, 3);
        o.step(&[1.0, 2.0, 3.0]);
        let mut p = HeavyBall::new(0.9, 3);
        p.restore(o.state()).unwrap();
        assert_eq!(p.step(&[0.0; 3]), o.step(&[0.0; 3]));
        let err = p.restore(vec![0.0; 2]).unwrap_err().to_string();
        assert!(err.contains("2 values") && err.contains("3"), "{err}");
    }
}
