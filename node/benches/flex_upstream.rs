//! A minimal reproduction, for Burn's maintainers, of where Burn 0.21's `flex` CPU backend
//! spends ResNet-20's training step: per-channel broadcasts against `[B, C, H, W]` (the
//! shape of BatchNorm's operands) and the 3×3 convolution's backward pass. It uses Burn
//! alone (nothing of murmur), so that it can be pasted into an upstream issue; the report
//! and the PyTorch side of the same measurement are in `experiments/bench/burn-upstream.md`
//! and `experiments/bench/flex_upstream.py`.
//!
//! ```sh
//! cargo bench -p murmur --bench flex_upstream            # RAYON_NUM_THREADS=2 on 2 cores
//! ```
//!
//! Each case prints the median of its timed runs, in milliseconds.

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::nn::conv::Conv2dConfig;
use burn::nn::{BatchNormConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::Distribution;

type B = Flex;
type A = Autodiff<Flex>;

/// Batch, channels, height, width: the first stage of ResNet-20 at batch 32.
const SHAPE: [usize; 4] = [32, 16, 32, 32];
/// Timed runs per case (after 2 untimed ones).
const RUNS: usize = 15;

/// The median wall time of `f` over [`RUNS`] runs, in milliseconds.
fn median_ms(mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

fn main() {
    let device = Default::default();
    let [b, c, h, w] = SHAPE;
    let x = Tensor::<B, 4>::random(SHAPE, Distribution::Default, &device);
    let s = Tensor::<B, 1>::random([c], Distribution::Default, &device);
    println!("Burn 0.21 flex, x: {SHAPE:?} f32; median of {RUNS} runs");

    // 1. x * s with s: [1, C, 1, 1] (BatchNorm's γ, or 1/σ), broadcast over B, H and W.
    let s4 = s.clone().reshape([1, c, 1, 1]);
    let broadcast = median_ms(|| {
        let _ = (x.clone() * s4.clone()).into_data();
    });
    // The same product with s materialised as [B, C, 1] against x viewed as [B, C, H·W]:
    // one scalar per contiguous row.
    let s3 = s.clone().reshape([1, c, 1]).repeat_dim(0, b);
    let rows = median_ms(|| {
        let _ = (x.clone().reshape([b, c, h * w]) * s3.clone()).into_data();
    });
    println!(
        "1. x * s[1,C,1,1]: {broadcast:.2} ms; as x[B,C,HW] * s[B,C,1]: {rows:.2} ms ({:.1}x)",
        broadcast / rows
    );

    // 2. BatchNorm2d (burn::nn), training mode: forward + backward of sum(bn(x)).
    let bn = BatchNormConfig::new(c).init::<A>(&device);
    let xa = Tensor::<A, 4>::random(SHAPE, Distribution::Default, &device).require_grad();
    let bn_ms = median_ms(|| {
        let y = bn.forward(xa.clone());
        let grads = y.sum().backward();
        let _ = xa.grad(&grads).map(|g| g.into_data());
    });
    println!("2. BatchNorm2d({c}) forward + backward: {bn_ms:.2} ms");

    // 3. Conv2d 3×3, C → C, padding 1, no bias: forward + backward (input and weight
    //    gradients) of sum(conv(x)).
    let conv = Conv2dConfig::new([c, c], [3, 3])
        .with_padding(PaddingConfig2d::Same)
        .with_bias(false)
        .init::<A>(&device);
    let forward_ms = median_ms(|| {
        let _ = conv.forward(xa.clone().detach()).into_data();
    });
    let conv_ms = median_ms(|| {
        let y = conv.forward(xa.clone());
        let grads = y.sum().backward();
        let _ = xa.grad(&grads).map(|g| g.into_data());
        let _ = conv.weight.grad(&grads).map(|g| g.into_data());
    });
    println!(
        "3. Conv2d({c}->{c}, 3x3, padding 1) forward: {forward_ms:.2} ms; forward + backward: \
         {conv_ms:.2} ms"
    );
}
