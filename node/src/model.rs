//! The models a peer trains, and the flat parameter vector the algorithms mix.
//!
//! Parameters are flattened into one `Vec<f32>` (`x: [d]`) in the fixed order in which
//! Burn's [`ModuleVisitor`] walks the module (declaration order of the fields), and written
//! back with a [`ModuleMapper`] in the same order. Gradients are flattened in that same
//! order from [`GradientsParams`], so `x[k]` and `grad[k]` always refer to the same scalar.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

/// Which network to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// 784-256-10 multilayer perceptron with ReLU (d = 203,530).
    Mlp,
    /// Two 3×3 conv layers (16 and 32 channels) with max-pooling, then a linear layer
    /// to 10 classes (d = 20,490).
    Cnn,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
        })
    }
}

/// 784-256-10 MLP.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Relu,
}

/// Small CNN for 28×28 grey images.
#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    fc: Linear<B>,
    act: Relu,
}

/// A model of either kind.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per peer, never moved in a hot loop
pub enum Net<B: Backend> {
    /// See [`Mlp`].
    Mlp(Mlp<B>),
    /// See [`Cnn`].
    Cnn(Cnn<B>),
}

/// Pixels per image (28×28).
pub const INPUTS: usize = 784;
/// Classes (digits).
pub const CLASSES: usize = 10;

impl<B: Backend> Net<B> {
    /// A freshly initialised model. Burn's initialisers draw from the backend RNG, which the
    /// caller seeds (`B::seed`) so that every peer starts from the same x⁰.
    pub fn new(kind: ModelKind, device: &B::Device) -> Self {
        match kind {
            ModelKind::Mlp => Net::Mlp(Mlp {
                fc1: LinearConfig::new(INPUTS, 256).init(device),
                fc2: LinearConfig::new(256, CLASSES).init(device),
                act: Relu::new(),
            }),
            ModelKind::Cnn => Net::Cnn(Cnn {
                conv1: Conv2dConfig::new([1, 16], [3, 3])
                    .with_padding(PaddingConfig2d::Same)
                    .init(device),
                conv2: Conv2dConfig::new([16, 32], [3, 3])
                    .with_padding(PaddingConfig2d::Same)
                    .init(device),
                pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
                fc: LinearConfig::new(32 * 7 * 7, CLASSES).init(device),
                act: Relu::new(),
            }),
        }
    }

    /// Logits for a batch.
    ///
    /// # Shapes
    /// - `images`: `[batch, 784]`, values in [0, 1]
    /// - output: `[batch, 10]`
    pub fn forward(&self, images: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Net::Mlp(m) => m.fc2.forward(m.act.forward(m.fc1.forward(images))),
            Net::Cnn(m) => {
                let [b, _] = images.dims();
                let x = images.reshape([b, 1, 28, 28]);
                let x = m.pool.forward(m.act.forward(m.conv1.forward(x)));
                let x = m.pool.forward(m.act.forward(m.conv2.forward(x)));
                m.fc.forward(x.reshape([b, 32 * 7 * 7]))
            }
        }
    }

    /// Number of scalar parameters d.
    pub fn dim(&self) -> usize {
        self.num_params()
    }
}

/// Builds the batch tensors.
///
/// # Shapes
/// - `images`: `[batch · 784]` row-major; `labels`: `[batch]`
pub fn batch_tensors<B: Backend>(
    images: Vec<f32>,
    labels: &[u8],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let b = labels.len();
    let x = Tensor::<B, 2>::from_data(TensorData::new(images, [b, INPUTS]), device);
    let y = Tensor::<B, 1, Int>::from_data(
        TensorData::new(labels.iter().map(|&l| l as i64).collect::<Vec<_>>(), [b]),
        device,
    );
    (x, y)
}

/// One forward/backward pass: returns the mean cross-entropy loss of the batch and the
/// gradient flattened in parameter order, `grad: [d]`.
pub fn loss_and_grad<B: AutodiffBackend>(
    model: &Net<B>,
    images: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
    grad_out: &mut Vec<f32>,
) -> f32 {
    let device = images.device();
    let logits = model.forward(images);
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, labels);
    let loss_value = loss
        .clone()
        .into_data()
        .iter::<f32>()
        .next()
        .unwrap_or(f32::NAN);
    let grads = GradientsParams::from_grads(loss.backward(), model);
    grad_out.clear();
    model.visit(&mut GradFlattener {
        grads: &grads,
        out: grad_out,
    });
    loss_value
}

/// Classification accuracy (fraction in [0, 1]) and mean loss over a data set, evaluated in
/// batches of `batch` on the non-autodiff backend.
pub fn evaluate<B: Backend>(
    model: &Net<B>,
    images: &[f32],
    labels: &[u8],
    batch: usize,
    device: &B::Device,
) -> (f64, f64) {
    let n = labels.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mut correct = 0usize;
    let mut loss_sum = 0.0f64;
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    for start in (0..n).step_by(batch.max(1)) {
        let end = (start + batch).min(n);
        let (x, y) = batch_tensors::<B>(
            images[start * INPUTS..end * INPUTS].to_vec(),
            &labels[start..end],
            device,
        );
        let logits = model.forward(x);
        let l = loss_fn.forward(logits.clone(), y);
        loss_sum +=
            l.into_data().iter::<f32>().next().unwrap_or(f32::NAN) as f64 * (end - start) as f64;
        let pred = logits.argmax(1).into_data();
        correct += pred
            .iter::<i64>()
            .zip(&labels[start..end])
            .filter(|(p, l)| *p == **l as i64)
            .count();
    }
    (correct as f64 / n as f64, loss_sum / n as f64)
}

/// Flattens the parameters of `model` into `out` (cleared first): `x: [d]`.
pub fn flatten<B: Backend, M: Module<B>>(model: &M, out: &mut Vec<f32>) {
    out.clear();
    model.visit(&mut ParamFlattener { out });
}

/// The number of values of each parameter tensor, in the order of [`flatten`] (they sum
/// to d): the tensor boundaries for layer-wise compression.
pub fn tensor_lengths<B: Backend, M: Module<B>>(model: &M) -> Vec<usize> {
    struct Lengths(Vec<usize>);
    impl<B: Backend> ModuleVisitor<B> for Lengths {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.lazy_shape().num_elements());
        }
    }
    let mut lengths = Lengths(Vec::new());
    model.visit(&mut lengths);
    lengths.0
}

/// Writes `x: [d]` back into `model` in the order of [`flatten`].
///
/// # Errors
/// If `x.len()` differs from the model's d (the model is then unusable and dropped).
pub fn unflatten<B: Backend, M: Module<B>>(model: M, x: &[f32]) -> anyhow::Result<M> {
    let mut mapper = ParamWriter {
        x,
        pos: 0,
        short: false,
    };
    let model = model.map(&mut mapper);
    if mapper.short || mapper.pos != x.len() {
        anyhow::bail!(
            "parameter vector has {} values, the model has {}",
            x.len(),
            mapper.pos
        );
    }
    Ok(model)
}

/// The non-autodiff copy of a model, for evaluation.
pub fn inference_copy<B: AutodiffBackend>(model: &Net<B>) -> Net<B::InnerBackend> {
    model.valid()
}

struct ParamFlattener<'a> {
    out: &'a mut Vec<f32>,
}

impl<B: Backend> ModuleVisitor<B> for ParamFlattener<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out.extend(param.val().into_data().iter::<f32>());
    }
}

struct GradFlattener<'a> {
    grads: &'a GradientsParams,
    out: &'a mut Vec<f32>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradFlattener<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        match self.grads.get::<B::InnerBackend, D>(param.id) {
            Some(g) => self.out.extend(g.into_data().iter::<f32>()),
            // A parameter the loss does not depend on has a zero gradient.
            None => {
                let numel = param.val().shape().num_elements();
                self.out.extend(std::iter::repeat_n(0.0, numel));
            }
        }
    }
}

struct ParamWriter<'a> {
    x: &'a [f32],
    pos: usize,
    short: bool,
}

impl<B: Backend> ModuleMapper<B> for ParamWriter<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let numel = shape.num_elements();
        let end = self.pos + numel;
        if end > self.x.len() {
            self.short = true;
            self.pos = end;
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let require_grad = tensor.is_require_grad();
        let device = tensor.device();
        let values = self.x[self.pos..end].to_vec();
        self.pos = end;
        let new = Tensor::<B, D>::from_data(TensorData::new(values, shape), &device)
            .set_require_grad(require_grad);
        Param::from_mapped_value(id, new, mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type B = burn::backend::Autodiff<burn::backend::Flex>;

    fn batch(n: usize) -> (Vec<f32>, Vec<u8>) {
        let mnist = crate::data::Mnist::embedded().unwrap();
        (
            mnist.train.images[..n * INPUTS].to_vec(),
            mnist.train.labels[..n].to_vec(),
        )
    }

    fn loss_at(net: Net<B>, x: &[f32], images: &[f32], labels: &[u8]) -> (Net<B>, f32) {
        let net = unflatten(net, x).unwrap();
        let (xb, yb) = batch_tensors::<B>(images.to_vec(), labels, &Default::default());
        let loss = CrossEntropyLossConfig::new()
            .init(&Default::default())
            .forward(net.forward(xb), yb);
        let v = loss.into_data().iter::<f32>().next().unwrap();
        (net, v)
    }

    #[test]
    fn flatten_unflatten_round_trip_and_length_check() {
        for kind in [ModelKind::Mlp, ModelKind::Cnn] {
            let net = Net::<B>::new(kind, &Default::default());
            let mut x = Vec::new();
            flatten(&net, &mut x);
            assert_eq!(x.len(), net.dim());
            let y: Vec<f32> = (0..x.len()).map(|i| i as f32 * 1e-6).collect();
            let net = unflatten(net, &y).unwrap();
            let mut z = Vec::new();
            flatten(&net, &mut z);
            assert_eq!(
                y, z,
                "{kind}: unflatten then flatten must give the same vector"
            );
            assert!(
                unflatten(net, &y[1..]).is_err(),
                "a short vector is refused"
            );
        }
        assert_eq!(
            Net::<B>::new(ModelKind::Mlp, &Default::default()).dim(),
            784 * 256 + 256 + 256 * 10 + 10
        );
    }

    #[test]
    fn tensor_lengths_are_the_layers_in_flatten_order() {
        let mlp = Net::<B>::new(ModelKind::Mlp, &Default::default());
        assert_eq!(tensor_lengths(&mlp), vec![784 * 256, 256, 256 * 10, 10]);
        let cnn = Net::<B>::new(ModelKind::Cnn, &Default::default());
        assert_eq!(tensor_lengths(&cnn).iter().sum::<usize>(), cnn.dim());
    }

    /// The flattened gradient is in the same order as the flattened parameters: check
    /// grad[k] against a central finite difference of the loss in x[k].
    #[test]
    fn gradient_order_matches_parameter_order() {
        let (images, labels) = batch(16);
        let mut net = Net::<B>::new(ModelKind::Mlp, &Default::default());
        let mut x = Vec::new();
        flatten(&net, &mut x);
        let (xb, yb) = batch_tensors::<B>(images.clone(), &labels, &Default::default());
        let mut grad = Vec::new();
        loss_and_grad(&net, xb, yb, &mut grad);
        assert_eq!(grad.len(), x.len());
        let fc1 = 784 * 256 + 256;
        let k_w = (0..784 * 256)
            .max_by(|&a, &b| grad[a].abs().total_cmp(&grad[b].abs()))
            .unwrap();
        let k_b = x.len() - 3; // a bias of the output layer
        for k in [k_w, fc1 + 5, k_b] {
            let eps = 1e-2f32;
            let mut xp = x.clone();
            xp[k] += eps;
            let (n1, lp) = loss_at(net, &xp, &images, &labels);
            xp[k] -= 2.0 * eps;
            let (n2, lm) = loss_at(n1, &xp, &images, &labels);
            net = n2;
            let numeric = (lp - lm) / (2.0 * eps);
            assert!(
                (numeric - grad[k]).abs() <= 0.1 * grad[k].abs() + 2e-3,
                "coordinate {k}: autodiff {} vs finite difference {numeric}",
                grad[k]
            );
        }
        assert!(
            grad[k_w].abs() > 1e-3,
            "the test needs a coordinate with a real gradient"
        );
    }

    /// With all weights zero and output bias 1 for class 3, every logit vector is
    /// (0,0,0,1,0,…): the model predicts 3 for every image, so the accuracy is the share
    /// of 3s, and the loss is ln(e + 9) − 1 on a 3 and ln(e + 9) on any other digit.
    #[test]
    fn evaluate_counts_correct_predictions() {
        let (images, labels) = batch(50);
        let device = Default::default();
        let net = Net::<burn::backend::Flex>::new(ModelKind::Mlp, &device);
        let mut x = vec![0.0f32; net.dim()];
        let classes_start = x.len() - CLASSES;
        x[classes_start + 3] = 1.0;
        let net = unflatten(net, &x).unwrap();
        let (acc, loss) = evaluate(&net, &images, &labels, 7, &device);
        let threes = labels.iter().filter(|&&l| l == 3).count() as f64;
        assert!(
            threes > 0.0 && threes < 50.0,
            "the batch needs 3s and other digits"
        );
        assert!((acc - threes / 50.0).abs() < 1e-12, "accuracy {acc}");
        let z = (std::f64::consts::E + 9.0).ln();
        let expected = (threes * (z - 1.0) + (50.0 - threes) * z) / 50.0;
        assert!(
            (loss - expected).abs() < 1e-5,
            "loss {loss}, expected {expected}"
        );
    }
}
