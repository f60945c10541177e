//! ResNet for small images (32×32 colour images by default): the CIFAR-10 variant of He, Zhang, Ren & Sun 2016, "Deep
//! residual learning for image recognition" (CVPR 2016, section 4.2), with 6n + 2 weighted
//! layers; n = 3 is ResNet-20.
//!
//! Layout: conv3×3(3→16, stride 1, padding 1, no bias) + BatchNorm + ReLU; three stages of n
//! [`BasicBlock`]s with widths 16, 32 and 64, the first block of stages 2 and 3 with stride 2
//! and a projection shortcut conv1×1(stride 2, no bias) + BatchNorm (the paper's option B;
//! the other shortcuts are identities); global average pooling; Linear(64 → 10) with bias.
//! Burn's default initialisers (PyTorch's: Kaiming-uniform with gain 1/√3 for the convolutions
//! and the linear layer, γ = 1 and β = 0 for BatchNorm).
//!
//! # Parameters and BatchNorm statistics
//!
//! ResNet-20 has d = 272,474 trainable parameters: the convolution and linear weights, the
//! linear bias, and every BatchNorm's γ and β. Each BatchNorm also keeps a running mean and
//! variance of its inputs (momentum 0.1), which Burn stores as module state: they are *not*
//! parameters, are not in the flat vector x, and are never mixed — every peer keeps the
//! statistics of its own mini-batches and uses them when it evaluates its model (training
//! steps normalise with the statistics of the batch itself). See
//! [`flatten`](super::flatten).

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::prelude::*;

/// Shape of a ResNet for CIFAR: 6 · `blocks_per_stage` + 2 weighted layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNetConfig {
    /// n: BasicBlocks per stage (3 for ResNet-20, 5 for ResNet-32, 9 for ResNet-56).
    pub blocks_per_stage: usize,
    /// Channels of the first stage (16); the second and third stages have 2× and 4× as many.
    pub width: usize,
    /// Channels of the input images (3).
    pub in_channels: usize,
    /// Rows of the input images (32); any size works, the pooling is global.
    pub rows: usize,
    /// Columns of the input images (32).
    pub cols: usize,
    /// Output classes (10).
    pub classes: usize,
}

impl Default for ResNetConfig {
    /// ResNet-20 for CIFAR-10: n = 3, width 16, 3 input channels, 10 classes.
    fn default() -> Self {
        ResNetConfig {
            blocks_per_stage: 3,
            width: 16,
            in_channels: 3,
            rows: 32,
            cols: 32,
            classes: 10,
        }
    }
}

impl ResNetConfig {
    /// A freshly initialised network (weights from the backend RNG, which the caller seeds).
    ///
    /// # Errors
    /// If a size is 0.
    pub fn init<B: Backend>(&self, device: &B::Device) -> anyhow::Result<ResNet<B>> {
        if [
            self.blocks_per_stage,
            self.width,
            self.in_channels,
            self.rows,
            self.cols,
        ]
        .contains(&0)
        {
            anyhow::bail!(
                "ResNet: blocks per stage, width, input channels, rows and columns must be ≥ 1, \
                 got {self:?}"
            );
        }
        if self.classes < 2 {
            anyhow::bail!("ResNet: need at least 2 classes, got {}", self.classes);
        }
        Ok(self.build(device))
    }

    /// [`ResNetConfig::init`] for a configuration known to be valid.
    pub(super) fn build<B: Backend>(&self, device: &B::Device) -> ResNet<B> {
        let w = self.width;
        let mut blocks = Vec::with_capacity(3 * self.blocks_per_stage);
        let mut in_ch = w;
        for (stage, out_ch) in [w, 2 * w, 4 * w].into_iter().enumerate() {
            for i in 0..self.blocks_per_stage {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                blocks.push(BasicBlock::new(in_ch, out_ch, stride, device));
                in_ch = out_ch;
            }
        }
        ResNet {
            conv: conv3x3(self.in_channels, w, 1, device),
            bn: BatchNormConfig::new(w).init(device),
            blocks,
            fc: LinearConfig::new(4 * w, self.classes).init(device),
            relu: Relu::new(),
            in_channels: self.in_channels,
            rows: self.rows,
            cols: self.cols,
            classes: self.classes,
        }
    }
}

/// A ResNet for CIFAR (see the [module documentation](self)); [`ResNetConfig::default`]
/// gives ResNet-20.
#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    conv: Conv2d<B>,
    bn: BatchNorm<B>,
    blocks: Vec<BasicBlock<B>>,
    fc: Linear<B>,
    relu: Relu,
    in_channels: usize,
    rows: usize,
    cols: usize,
    classes: usize,
}

impl<B: Backend> ResNet<B> {
    /// Channels of the input images.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// Channels, rows and columns of the input images.
    pub fn shape(&self) -> [usize; 3] {
        [self.in_channels, self.rows, self.cols]
    }

    /// Output classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Class logits.
    ///
    /// # Shapes
    /// - `images`: `[batch, in_channels, height, width]` (32×32 for CIFAR; any size works,
    ///   the pooling is global)
    /// - output: `[batch, classes]`
    ///
    /// # Panics
    /// If `images` does not have `in_channels` channels (Burn's convolution checks it).
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self
            .relu
            .forward(batch_norm(&self.bn, self.conv.forward(images)));
        for block in &self.blocks {
            x = block.forward(x);
        }
        let [b, c, h, w] = x.dims();
        // Global average pooling: [b, c, h, w] → [b, c].
        let pooled = x.reshape([b, c, h * w]).mean_dim(2).reshape([b, c]);
        self.fc.forward(pooled)
    }
}

/// conv3×3 → BN → ReLU → conv3×3 → BN, plus the shortcut, then ReLU (He et al. 2016, fig. 2).
#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    conv1: Conv2d<B>,
    bn1: BatchNorm<B>,
    conv2: Conv2d<B>,
    bn2: BatchNorm<B>,
    /// A projection where the block changes the width or the resolution; else the identity.
    shortcut: Option<Projection<B>>,
    relu: Relu,
}

impl<B: Backend> BasicBlock<B> {
    fn new(in_ch: usize, out_ch: usize, stride: usize, device: &B::Device) -> Self {
        let shortcut = (stride != 1 || in_ch != out_ch).then(|| Projection {
            conv: Conv2dConfig::new([in_ch, out_ch], [1, 1])
                .with_stride([stride, stride])
                .with_bias(false)
                .init(device),
            bn: BatchNormConfig::new(out_ch).init(device),
        });
        BasicBlock {
            conv1: conv3x3(in_ch, out_ch, stride, device),
            bn1: BatchNormConfig::new(out_ch).init(device),
            conv2: conv3x3(out_ch, out_ch, 1, device),
            bn2: BatchNormConfig::new(out_ch).init(device),
            shortcut,
            relu: Relu::new(),
        }
    }

    /// # Shapes
    /// - `x`: `[batch, in_ch, h, w]`
    /// - output: `[batch, out_ch, h / stride, w / stride]`
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let shortcut = match &self.shortcut {
            Some(p) => batch_norm(&p.bn, p.conv.forward(x.clone())),
            None => x.clone(),
        };
        let y = self
            .relu
            .forward(batch_norm(&self.bn1, self.conv1.forward(x)));
        let y = batch_norm(&self.bn2, self.conv2.forward(y));
        self.relu.forward(y + shortcut)
    }
}

/// Projection shortcut: conv1×1 (no bias) + BatchNorm.
#[derive(Module, Debug)]
pub struct Projection<B: Backend> {
    conv: Conv2d<B>,
    bn: BatchNorm<B>,
}

/// `bn` applied to `x: [b, c, h, w]`, as Burn's `BatchNorm::forward` computes it — in
/// training (an autodiff backend) with the batch's mean and biased variance per channel,
/// updating the running statistics with the momentum; in inference with the running
/// statistics — but with every per-channel operand materialised as `[b, c, 1]` against `x`
/// viewed as `[b, c, h·w]`. Burn's own broadcasts a `[1, c, 1, 1]` operand, which the flex
/// backend has no vectorised path for (its broadcast kernels take a shared last-dimension
/// row or one scalar per row of contiguous outer dimensions): it walks such operations
/// element by element, which was two thirds of a ResNet-20 training step on the CPU.
pub(super) fn batch_norm<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, c, h, w] = x.dims();
    let x = x.reshape([b, c, h * w]);
    // [c] → [b, c, 1], contiguous: one scalar per row of x.
    let per_row = |t: Tensor<B, 1>| t.reshape([1, c, 1]).repeat_dim(0, b);
    let (centered, var) = if B::ad_enabled(&x.device()) {
        let mean = x.clone().mean_dim(2).mean_dim(0); // [1, c, 1]
        let centered = x.sub(mean.clone().repeat_dim(0, b));
        let var = centered.clone().square().mean_dim(2).mean_dim(0); // [1, c, 1]
        let m = bn.momentum;
        let update = |running: Tensor<B, 1>, batch: Tensor<B, 3>| {
            running
                .mul_scalar(1.0 - m)
                .add(batch.detach().mul_scalar(m).reshape([c]))
                .detach()
        };
        bn.running_mean
            .update(update(bn.running_mean.value_sync(), mean));
        bn.running_var
            .update(update(bn.running_var.value_sync(), var.clone()));
        (centered, var)
    } else {
        let centered = x.sub(per_row(bn.running_mean.value()));
        (centered, bn.running_var.value().reshape([1, c, 1]))
    };
    // γ / √(σ² + ε) per channel, then one multiply and one add over x.
    let scale = bn
        .gamma
        .val()
        .reshape([1, c, 1])
        .div(var.add_scalar(bn.epsilon).sqrt());
    centered
        .mul(scale.repeat_dim(0, b))
        .add(per_row(bn.beta.val()))
        .reshape([b, c, h, w])
}

/// 3×3 convolution with padding 1 and no bias (the BatchNorm after it has a β).
fn conv3x3<B: Backend>(
    in_ch: usize,
    out_ch: usize,
    stride: usize,
    device: &B::Device,
) -> Conv2d<B> {
    Conv2dConfig::new([in_ch, out_ch], [3, 3])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .with_bias(false)
        .init(device)
}
