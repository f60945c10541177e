//! One peer's local learning step: the next mini-batch of its shard, the loss and gradient
//! of the model there, and the optimizer's update direction.
//!
//! The same component steps a `murmur peer`, every virtual peer of `murmur simulate` and
//! `murmur bench`; what the algorithm then does with the direction (mix, average, apply
//! after H steps) is the algorithm's business, not the learner's.

use anyhow::bail;
use burn::tensor::backend::AutodiffBackend;

use super::data::{Batches, Dataset};
use super::inner_optimizer::{Optimizer, Schedule};
use super::model::{self, Net};

/// A peer's shard, its mini-batch order, the optimizer and the running training loss.
pub struct Learner {
    /// The samples this peer trains on.
    pub shard: Dataset,
    batches: Batches,
    batch_size: usize,
    samples: Vec<f32>,
    labels: Vec<u8>,
    grad: Vec<f32>,
    optimizer: Box<dyn Optimizer>,
    schedule: Schedule,
    /// The next step's round t (the schedule's clock).
    t: u64,
    /// s_t · u when the schedule is not constant, `[d]`.
    scaled: Vec<f32>,
    loss_sum: f64,
    steps: u64,
}

impl Learner {
    /// A learner over `shard` taking mini-batches of `batch_size` samples in an order drawn
    /// from `seed`, turning gradients into directions with `optimizer` scaled by
    /// `schedule`, whose clock starts at round `first_round`.
    pub fn new(
        shard: Dataset,
        batch_size: usize,
        seed: u64,
        optimizer: Box<dyn Optimizer>,
        schedule: Schedule,
        first_round: u64,
    ) -> Learner {
        Learner {
            batches: Batches::new(shard.len(), seed),
            samples: Vec::with_capacity(batch_size * shard.features()),
            labels: Vec::with_capacity(batch_size),
            grad: Vec::new(),
            shard,
            batch_size,
            optimizer,
            schedule,
            t: first_round,
            scaled: Vec::new(),
            loss_sum: 0.0,
            steps: 0,
        }
    }

    /// One step of `net`, whose parameters are `x: [d]`: the loss and gradient on the next
    /// mini-batch, then the optimizer's direction `u: [d]` times the schedule's s_t (see
    /// [`Learner::direction`]). Returns the mini-batch loss (nats).
    ///
    /// # Errors
    /// The batch does not fit the model, or the loss is not finite (the message suggests a
    /// smaller `--lr`).
    pub fn step<B: AutodiffBackend>(
        &mut self,
        net: &Net<B>,
        x: &[f32],
        device: &B::Device,
    ) -> anyhow::Result<f32> {
        self.batches.next_batch(
            &self.shard,
            self.batch_size,
            &mut self.samples,
            &mut self.labels,
        );
        let batch = model::batch_tensors::<B>(
            net.input(),
            std::mem::take(&mut self.samples),
            &self.labels,
            device,
        )?;
        let loss = model::loss_and_grad(net, batch, &mut self.grad)?;
        if !loss.is_finite() {
            bail!("training diverged: loss is {loss} (try a smaller --lr)");
        }
        self.loss_sum += loss as f64;
        self.steps += 1;
        let u = self.optimizer.step(x, &self.grad);
        if !self.schedule.is_constant() {
            let s = self.schedule.factor(self.t) as f32;
            self.scaled.clear();
            self.scaled.extend(u.iter().map(|u| s * u));
        }
        self.t += 1;
        Ok(loss)
    }

    /// The direction `s_t · u: [d]` of the last step (zeros before the first), which the
    /// algorithm applies with the base learning rate η.
    pub fn direction(&self) -> &[f32] {
        if self.schedule.is_constant() || self.scaled.is_empty() {
            self.optimizer.direction()
        } else {
            &self.scaled
        }
    }

    /// The optimizer, for its checkpointed state.
    pub fn optimizer(&mut self) -> &mut dyn Optimizer {
        self.optimizer.as_mut()
    }

    /// The optimizer's state now (`Optimizer::state`), for a checkpoint or a catching-up peer.
    pub fn optimizer_state(&self) -> Vec<f32> {
        self.optimizer.state()
    }

    /// The mean mini-batch loss since the last call (nats), `None` without a step; resets
    /// the running sum.
    pub fn take_mean_loss(&mut self) -> Option<f64> {
        let mean = (self.steps > 0).then(|| self.loss_sum / self.steps as f64);
        (self.loss_sum, self.steps) = (0.0, 0);
        mean
    }
}
