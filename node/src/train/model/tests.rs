use super::*;
use crate::train::data::Dataset;

type B = burn::backend::Autodiff<burn::backend::Flex>;

fn batch(n: usize) -> (Vec<f32>, Vec<u8>) {
    let mnist = crate::train::data::Mnist::embedded().unwrap();
    let mut values = Vec::new();
    for i in 0..n {
        mnist.train.append_image(i, &mut values);
    }
    (values, mnist.train.labels[..n].to_vec())
}

/// All of `data` as one batch for `net`.
fn batch_of(net: &Net<B>, data: &Dataset) -> Batch<B> {
    let values = data.values().into_owned();
    batch_tensors::<B>(net.input(), values, &data.labels, &Default::default()).unwrap()
}

fn loss_at(net: Net<B>, x: &[f32], samples: &[f32], labels: &[u8]) -> (Net<B>, f32) {
    let net = unflatten(net, x).unwrap();
    let b = batch_tensors::<B>(net.input(), samples.to_vec(), labels, &Default::default()).unwrap();
    let v = net
        .loss(b)
        .unwrap()
        .into_data()
        .iter::<f32>()
        .next()
        .unwrap();
    (net, v)
}

/// ResNet with one block per stage and width 4 (it keeps both projection shortcuts).
fn small_resnet() -> Net<B> {
    let config = ResNetConfig {
        blocks_per_stage: 1,
        width: 4,
        ..ResNetConfig::default()
    };
    Net::ResNet(config.init(&Default::default()).unwrap())
}

fn small_transformer_config() -> TransformerConfig {
    TransformerConfig {
        vocab: 16,
        context: 8,
        d_model: 16,
        heads: 2,
        layers: 2,
        d_ff: 32,
    }
}

fn small_transformer() -> Net<B> {
    Net::Transformer(
        small_transformer_config()
            .init(&Default::default())
            .unwrap(),
    )
}

/// BatchNorm's running statistics only (what the flat vector leaves out).
fn running_state<BB: Backend, M: Module<BB>>(model: &M) -> Vec<f32> {
    let mut s = Vec::new();
    flatten_running_state(model, &mut s);
    s
}

#[test]
fn flatten_unflatten_round_trip_and_length_check() {
    let models = [
        ModelKind::MLP,
        ModelKind::CNN,
        ModelKind::RESNET20,
        ModelKind::transformer(),
    ]
    .map(|kind| (kind.to_string(), Net::<B>::new(kind, &Default::default())));
    let small = [
        ("small resnet".to_string(), small_resnet()),
        ("small transformer".to_string(), small_transformer()),
    ];
    for (name, net) in models.into_iter().chain(small) {
        let mut x = Vec::new();
        flatten(&net, &mut x);
        assert_eq!(x.len(), net.dim(), "{name}");
        let y: Vec<f32> = (0..x.len()).map(|i| i as f32 * 1e-6).collect();
        let net = unflatten(net, &y).unwrap();
        let mut z = Vec::new();
        flatten(&net, &mut z);
        assert_eq!(
            y, z,
            "{name}: unflatten then flatten must give the same vector"
        );
        assert!(
            unflatten(net, &y[1..]).is_err(),
            "a short vector is refused"
        );
    }
    assert_eq!(
        Net::<B>::new(ModelKind::MLP, &Default::default()).dim(),
        784 * 256 + 256 + 256 * 10 + 10
    );
}

/// d of the new models, worked out by hand, equals the number of tensors Burn trains
/// (those that require a gradient): BatchNorm's running statistics are not counted.
#[test]
fn resnet20_and_transformer_have_the_documented_d() {
    // ResNet-20: stem conv + BN; stage 1: 3 blocks of two 16→16 convs + 2 BNs; stages 2
    // and 3: a first block with a stride-2 conv, a conv and a projection (conv1×1 + BN),
    // then two plain blocks; the linear layer.
    let bn = |c: usize| 2 * c;
    let block = |i: usize, o: usize| 9 * i * o + bn(o) + 9 * o * o + bn(o);
    let resnet20 = 3 * 16 * 9
        + bn(16)
        + 3 * block(16, 16)
        + block(16, 32)
        + 16 * 32
        + bn(32)
        + 2 * block(32, 32)
        + block(32, 64)
        + 32 * 64
        + bn(64)
        + 2 * block(64, 64)
        + 64 * 10
        + 10;
    assert_eq!(resnet20, 272_474);
    // Transformer: token and position embeddings; per layer LN, 4 attention projections
    // with bias, LN, MLP 128→512→128; final LN; head 128→256 with bias.
    let (v, t, m, f) = (256, 64, 128, 512);
    let layer = 2 * m + 4 * (m * m + m) + 2 * m + (m * f + f) + (f * m + m);
    let transformer = v * m + t * m + 2 * layer + 2 * m + (m * v + v);
    assert_eq!(transformer, 470_784);

    struct Trainable(usize);
    impl ModuleVisitor<B> for Trainable {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.val().is_require_grad() {
                self.0 += param.val().shape().num_elements();
            }
        }
    }
    for (kind, d) in [
        (ModelKind::RESNET20, resnet20),
        (ModelKind::transformer(), transformer),
    ] {
        let net = Net::<B>::new(kind, &Default::default());
        assert_eq!(net.dim(), d, "{kind}");
        let mut trainable = Trainable(0);
        net.visit(&mut trainable);
        assert_eq!(trainable.0, d, "{kind}: the tensors Burn trains");
    }
    let resnet = Net::<B>::new(ModelKind::RESNET20, &Default::default());
    assert_eq!(
        running_state(&resnet).len(),
        2 * (16 + 6 * 16 + 32 + 6 * 32 + 64 + 6 * 64),
        "a running mean and variance per BatchNorm channel, left out of x"
    );
    assert_eq!(tensor_lengths(&resnet).len(), 65);
}

#[test]
fn tensor_lengths_are_the_layers_in_flatten_order() {
    let mlp = Net::<B>::new(ModelKind::MLP, &Default::default());
    assert_eq!(tensor_lengths(&mlp), vec![784 * 256, 256, 256 * 10, 10]);
    for kind in [
        ModelKind::CNN,
        ModelKind::RESNET20,
        ModelKind::transformer(),
    ] {
        let net = Net::<B>::new(kind, &Default::default());
        assert_eq!(tensor_lengths(&net).iter().sum::<usize>(), net.dim());
    }
    let resnet = Net::<B>::new(ModelKind::RESNET20, &Default::default());
    let lengths = tensor_lengths(&resnet);
    assert_eq!(
        &lengths[..3],
        &[3 * 16 * 9, 16, 16],
        "stem conv, BN γ, BN β"
    );
    assert_eq!(
        &lengths[lengths.len() - 2..],
        &[64 * 10, 10],
        "linear layer"
    );
}

/// Checks, for every parameter tensor, that the flattened gradient at the tensor's
/// largest-|g| coordinate matches a central finite difference of the loss there: the
/// flattened gradient is in parameter order. Returns the largest |g| seen.
fn check_gradient_order(mut net: Net<B>, samples: &[f32], labels: &[u8]) -> f32 {
    let mut x = Vec::new();
    flatten(&net, &mut x);
    let b = batch_tensors::<B>(net.input(), samples.to_vec(), labels, &Default::default()).unwrap();
    let mut grad = Vec::new();
    loss_and_grad(&net, b, &mut grad).unwrap();
    assert_eq!(grad.len(), x.len());
    let mut start = 0;
    for (t, len) in tensor_lengths(&net).into_iter().enumerate() {
        let k = (start..start + len)
            .max_by(|&a, &b| grad[a].abs().total_cmp(&grad[b].abs()))
            .unwrap();
        start += len;
        let eps = 1e-3f32;
        let mut xp = x.clone();
        xp[k] += eps;
        let (n1, lp) = loss_at(net, &xp, samples, labels);
        xp[k] -= 2.0 * eps;
        let (n2, lm) = loss_at(n1, &xp, samples, labels);
        net = n2;
        let numeric = (lp - lm) / (2.0 * eps);
        assert!(
            (numeric - grad[k]).abs() <= 0.1 * grad[k].abs() + 2e-3,
            "tensor {t}, coordinate {k}: autodiff {} vs finite difference {numeric}",
            grad[k]
        );
    }
    grad.iter().fold(0.0, |m, g| m.max(g.abs()))
}

/// The flattened gradient is in the same order as the flattened parameters: check
/// grad[k] against a central finite difference of the loss in x[k].
#[test]
fn gradient_order_matches_parameter_order() {
    let (images, labels) = batch(16);
    let mut net = Net::<B>::new(ModelKind::MLP, &Default::default());
    let mut x = Vec::new();
    flatten(&net, &mut x);
    let b = batch_tensors::<B>(net.input(), images.clone(), &labels, &Default::default()).unwrap();
    let mut grad = Vec::new();
    loss_and_grad(&net, b, &mut grad).unwrap();
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

/// As above for a ResNet (convolutions without bias, BatchNorm in training mode,
/// projection shortcuts) on synthetic images, every tensor. 16 images: with 4, BatchNorm's
/// batch statistics made the loss so curved in one projection weight that the finite
/// difference was 12% off at ε = 10⁻³ (and matched at 10⁻⁴).
#[test]
fn resnet_gradient_order_matches_parameter_order() {
    B::seed(&Default::default(), 3);
    let net = small_resnet();
    let data = Dataset::synthetic(net.input(), 16, 5);
    let g = check_gradient_order(net, &data.values(), &data.labels);
    assert!(g > 1e-2, "the test needs real gradients, largest {g}");
}

/// As above for a transformer (embeddings, attention, LayerNorm, head) on synthetic
/// tokens, every tensor.
#[test]
fn transformer_gradient_order_matches_parameter_order() {
    B::seed(&Default::default(), 3);
    let net = small_transformer();
    let data = Dataset::synthetic(net.input(), 4, 5);
    let g = check_gradient_order(net, &data.values(), &data.labels);
    assert!(g > 1e-2, "the test needs real gradients, largest {g}");
}

/// Heavy-ball SGD on one fixed synthetic batch, as the training loop does it on the flat
/// vector: returns the first and the last loss.
fn fit(mut net: Net<B>, data: &Dataset, steps: usize, lr: f32) -> (f32, f32) {
    let mut x = Vec::new();
    flatten(&net, &mut x);
    let mut v = vec![0.0f32; x.len()];
    let (mut grad, mut losses) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let b = batch_of(&net, &data);
        losses.push(loss_and_grad(&net, b, &mut grad).unwrap());
        for ((xi, vi), g) in x.iter_mut().zip(&mut v).zip(&grad) {
            *vi = 0.9 * *vi + g;
            *xi -= lr * *vi;
        }
        net = unflatten(net, &x).unwrap();
    }
    (losses[0], *losses.last().unwrap())
}

#[test]
fn resnet20_fits_a_fixed_synthetic_batch() {
    B::seed(&Default::default(), 1);
    let net = Net::<B>::new(ModelKind::RESNET20, &Default::default());
    let data = Dataset::synthetic(net.input(), 8, 1);
    let (first, last) = fit(net, &data, 12, 0.05);
    assert!(
        (first - 10f32.ln()).abs() < 0.5,
        "starts near ln 10: {first}"
    );
    assert!(last < 0.5 * first, "loss {first} → {last}");
}

#[test]
fn transformer_fits_a_fixed_synthetic_batch() {
    B::seed(&Default::default(), 1);
    let net = Net::<B>::new(ModelKind::transformer(), &Default::default());
    let data = Dataset::synthetic(net.input(), 4, 1);
    let (first, last) = fit(net, &data, 12, 0.1);
    assert!(
        (first - 256f32.ln()).abs() < 0.5,
        "starts near ln 256: {first}"
    );
    assert!(last < first - 0.5, "loss {first} → {last}");
}

/// The running statistics follow the training batches, stay out of x, and survive
/// unflatten (each peer keeps its own).
///
/// Burn records a training step's new statistics per thread and folds them in at the
/// next forward pass or when the inference copy is made, which is where they are read.
#[test]
fn batchnorm_running_statistics_are_state_not_parameters() {
    let net = small_resnet();
    let before = running_state(&inference_copy(&net));
    assert!(
        before.iter().all(|&v| v == 0.0 || v == 1.0),
        "mean 0, variance 1"
    );
    let mut x = Vec::new();
    flatten(&net, &mut x);
    let data = Dataset::synthetic(net.input(), 4, 2);
    let b = batch_of(&net, &data);
    let mut grad = Vec::new();
    loss_and_grad(&net, b, &mut grad).unwrap();
    let after = running_state(&inference_copy(&net));
    assert_ne!(before, after, "a training step updates them");
    let net = unflatten(net, &x).unwrap();
    let eval = inference_copy(&net);
    assert_eq!(running_state(&eval), after, "unflatten leaves them alone");
    let mut y = Vec::new();
    flatten(&eval, &mut y);
    assert_eq!(x, y, "and the parameters are what was written");
    // What a checkpoint keeps of them goes back into a fresh model, parameters untouched.
    let fresh = small_resnet();
    let mut x0 = Vec::new();
    flatten(&fresh, &mut x0);
    let fresh = unflatten_running_state(fresh, &after).unwrap();
    assert_eq!(running_state(&inference_copy(&fresh)), after);
    let mut x1 = Vec::new();
    flatten(&fresh, &mut x1);
    assert_eq!(x0, x1);
    assert!(unflatten_running_state(small_resnet(), &after[1..]).is_err());
    // A model without BatchNorm has none.
    let mlp = Net::<B>::new(ModelKind::MLP, &Default::default());
    assert!(running_state(&mlp).is_empty());
    assert!(unflatten_running_state(mlp, &[]).is_ok());
}

/// Changing token t changes no logit at a position before t.
#[test]
fn the_transformer_is_causal() {
    let net = small_transformer();
    let data = Dataset::synthetic(net.input(), 1, 4);
    let logits = |samples: Vec<f32>| {
        let b =
            batch_tensors::<B>(net.input(), samples, &data.labels, &Default::default()).unwrap();
        let (l, _) = net.forward(b).unwrap();
        l.into_data().iter::<f32>().collect::<Vec<_>>()
    };
    let base = logits(data.values().into_owned());
    let (t, vocab) = (5, 16);
    let mut changed = data.values().into_owned();
    changed[t] = (changed[t] + 1.0) % vocab as f32;
    let other = logits(changed);
    assert_eq!(
        base[..t * vocab],
        other[..t * vocab],
        "positions before {t}"
    );
    assert_ne!(
        base[t * vocab..],
        other[t * vocab..],
        "position {t} and after"
    );
}

/// With all weights zero and head bias 1 for token 3, every position's logits are
/// (0,0,0,1,0,…): the model predicts 3 everywhere, so the accuracy is the share of 3s
/// among the targets and the loss is ln(e + V − 1) − [target = 3].
#[test]
fn evaluate_counts_next_token_predictions() {
    let device = Default::default();
    let net =
        Net::<burn::backend::Flex>::Transformer(small_transformer_config().init(&device).unwrap());
    let mut x = vec![0.0f32; net.dim()];
    let vocab = 16;
    let head_bias = x.len() - vocab;
    x[head_bias + 3] = 1.0;
    let net = unflatten(net, &x).unwrap();
    let data = Dataset::synthetic(net.input(), 20, 9);
    let (acc, loss) = evaluate(&net, &data.values(), &data.labels, 7, &device).unwrap();
    let targets: Vec<f32> = data
        .values()
        .chunks(9)
        .flat_map(|s| s[1..].to_vec())
        .collect();
    let threes = targets.iter().filter(|&&t| t == 3.0).count() as f64;
    let n = targets.len() as f64;
    assert!(threes > 0.0 && threes < n);
    assert!((acc - threes / n).abs() < 1e-12, "accuracy {acc}");
    let z = (std::f64::consts::E + (vocab - 1) as f64).ln();
    let expected = (threes * (z - 1.0) + (n - threes) * z) / n;
    assert!(
        (loss - expected).abs() < 1e-5,
        "loss {loss}, expected {expected}"
    );
}

#[test]
fn bad_batches_are_errors() {
    let device = Default::default();
    let mnist = ModelKind::MLP.input();
    let tokens = Input::Tokens {
        context: 4,
        vocab: 16,
    };
    let bad = [
        batch_tensors::<B>(mnist, vec![0.0; 783], &[1], &device),
        batch_tensors::<B>(mnist, vec![0.0; 784], &[10], &device),
        batch_tensors::<B>(tokens, vec![1.0, 2.0, 3.0, 4.0, 16.0], &[0], &device),
        batch_tensors::<B>(tokens, vec![1.0, 2.0, 3.5, 4.0, 5.0], &[0], &device),
        batch_tensors::<B>(tokens, vec![1.0, -1.0, 3.0, 4.0, 5.0], &[0], &device),
    ];
    for (i, b) in bad.into_iter().enumerate() {
        assert!(b.is_err(), "case {i} was accepted");
    }
    let mnist_batch = batch_tensors::<B>(mnist, vec![0.0; 784], &[1], &device).unwrap();
    let resnet = Net::<B>::new(ModelKind::RESNET20, &device);
    let err = resnet.forward(mnist_batch.clone()).unwrap_err().to_string();
    assert!(err.contains("3×32×32"), "{err}");
    assert!(small_transformer().forward(mnist_batch).is_err());
    let token_batch =
        batch_tensors::<B>(tokens, vec![1.0, 2.0, 3.0, 4.0, 5.0], &[0], &device).unwrap();
    assert!(
        small_transformer().forward(token_batch.clone()).is_err(),
        "context 4 ≠ 8"
    );
    assert!(resnet.forward(token_batch).is_err());
    assert!(TransformerConfig {
        heads: 3,
        ..TransformerConfig::default()
    }
    .init::<B>(&device)
    .is_err());
    assert!(ResNetConfig {
        width: 0,
        ..ResNetConfig::default()
    }
    .init::<B>(&device)
    .is_err());
}

/// With all weights zero and output bias 1 for class 3, every logit vector is
/// (0,0,0,1,0,…): the model predicts 3 for every image, so the accuracy is the share
/// of 3s, and the loss is ln(e + 9) − 1 on a 3 and ln(e + 9) on any other digit.
#[test]
fn evaluate_counts_correct_predictions() {
    let (images, labels) = batch(50);
    let device = Default::default();
    let net = Net::<burn::backend::Flex>::new(ModelKind::MLP, &device);
    let mut x = vec![0.0f32; net.dim()];
    let classes_start = x.len() - CLASSES;
    x[classes_start + 3] = 1.0;
    let net = unflatten(net, &x).unwrap();
    let (acc, loss) = evaluate(&net, &images, &labels, 7, &device).unwrap();
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

#[test]
fn model_names_and_transformer_sizes_parse_and_print_back() {
    for name in ["mlp", "cnn", "resnet20", "transformer"] {
        let kind: ModelKind = name.parse().unwrap();
        assert_eq!(kind.to_string(), name);
    }
    assert_eq!(
        "transformer".parse::<ModelKind>().unwrap(),
        ModelKind::transformer()
    );
    let kind: ModelKind = "transformer:context=32,layers=3,d_ff=256".parse().unwrap();
    let ModelKind::Transformer(c) = kind else {
        panic!("{kind:?}")
    };
    assert_eq!((c.context, c.layers, c.d_ff), (32, 3, 256));
    assert_eq!(
        (c.d_model, c.heads),
        (128, 4),
        "the others keep their defaults"
    );
    // The MLP's width: `mlp` is the default 256; another prints back with its width, and d =
    // 795·hidden + 10.
    assert_eq!("mlp".parse::<ModelKind>().unwrap(), ModelKind::MLP);
    let wide: ModelKind = "mlp:hidden=300".parse().unwrap();
    assert_eq!(
        wide,
        ModelKind::Mlp {
            hidden: 300,
            input: None
        }
    );
    assert_eq!(wide.to_string(), "mlp:hidden=300");
    assert_eq!(ModelKind::MLP.to_string(), "mlp");
    // The image models' input: written only where it differs from the family's default, and
    // parsed back to itself; the CNN's linear layer follows the image size.
    let cifar_cnn: ModelKind = "cnn:input=3x32x32".parse().unwrap();
    assert_eq!(
        cifar_cnn,
        ModelKind::Cnn {
            input: Some(ImageInput::CIFAR10)
        }
    );
    assert_eq!(ModelKind::RESNET20.to_string(), "resnet20");
    for (text, d) in [
        (
            "cnn:input=3x32x32",
            16 * 3 * 9 + 16 + 32 * 16 * 9 + 32 + 32 * 8 * 8 * 10 + 10,
        ),
        ("cnn", 20_490),
        (
            "mlp:hidden=300,input=3x32x32,classes=100",
            (3072 + 1) * 300 + 301 * 100,
        ),
        ("resnet20:input=1x28x28", 272_474 - 2 * 16 * 9),
    ] {
        let kind: ModelKind = text.parse().unwrap();
        assert_eq!(kind.to_string(), text);
        assert_eq!(Net::<B>::new(kind, &Default::default()).dim(), d, "{text}");
        assert_eq!(
            Net::<B>::new(kind, &Default::default()).input(),
            kind.input()
        );
    }
    assert_eq!(ModelKind::MLP.given_images(), None);
    // Given equal to the default, it is kept (an image folder is resized to it).
    let given: ModelKind = "resnet20:input=3x32x32".parse().unwrap();
    assert_eq!(given.given_images(), Some(ImageInput::CIFAR10));
    assert_eq!(given.to_string(), "resnet20:input=3x32x32");
    assert_eq!(
        Net::<B>::new(wide, &Default::default()).dim(),
        795 * 300 + 10
    );
    // Printed in a fixed order, only the sizes that differ; it parses back to itself.
    assert_eq!(kind.to_string(), "transformer:layers=3,context=32,d_ff=256");
    assert_eq!(kind.to_string().parse::<ModelKind>().unwrap(), kind);
    assert_eq!(
        kind.input(),
        Input::Tokens {
            context: 32,
            vocab: 256
        }
    );
    let net = Net::<B>::new(kind, &Default::default());
    let mut x = Vec::new();
    flatten(&net, &mut x);
    // 3 blocks of d_model 128 and d_ff 256, 32 positions.
    let (v, t, m, f) = (256, 32, 128, 256);
    let block = 2 * 2 * m + 4 * (m * m + m) + (m * f + f) + (f * m + m);
    assert_eq!(x.len(), v * m + t * m + 3 * block + 2 * m + (m * v + v));
    for (bad, says) in [
        ("gpt", "unknown model"),
        (
            "mlp:layers=2",
            "unknown mlp size \"layers\": one of hidden, input, classes",
        ),
        ("mlp:hidden=0", "at least 1 hidden unit"),
        ("mlp:hidden=wide", "not a whole number"),
        (
            "cnn:hidden=2",
            "unknown cnn size \"hidden\": one of input, classes",
        ),
        ("cnn:input=3x32", "not CxHxW"),
        ("cnn:input=0x32x32", "not CxHxW"),
        ("cnn:input=1x3x3", "at least 4×4"),
        ("resnet20:classes=1", "2 to 256 classes"),
        ("mlp:classes=257", "2 to 256 classes"),
        ("transformer:depth=2", "unknown transformer size"),
        ("transformer:layers=two", "not a whole number"),
        ("transformer:layers", "not KEY=VALUE"),
        ("transformer:layers=2,layers=3", "twice"),
        ("transformer:layers=0", "≥ 1"),
        ("transformer:heads=3", "do not divide"),
    ] {
        let err = bad.parse::<ModelKind>().unwrap_err();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

/// ResNet's BatchNorm (`resnet::batch_norm`, shaped for the flex backend's fast broadcasts)
/// computes what Burn's `BatchNorm::forward` computes: the output, the gradients of x, γ
/// and β, the running statistics it leaves, and the output in inference.
#[test]
fn resnet_batch_norm_matches_burn_s_batchnorm() {
    use burn::module::{AutodiffModule, Param};
    use burn::nn::BatchNormConfig;
    use burn::tensor::Distribution;
    let device = Default::default();
    // A fresh module each time: clones of a module share its running statistics.
    let make = || {
        let mut bn = BatchNormConfig::new(3).init::<B>(&device);
        bn.gamma = Param::from_tensor(Tensor::from_floats([0.5, -1.5, 2.0], &device));
        bn.beta = Param::from_tensor(Tensor::from_floats([0.1, 0.0, -0.3], &device));
        bn
    };
    let x = Tensor::<B, 4>::random([4, 3, 5, 6], Distribution::Normal(1.0, 2.0), &device);
    // A weighted sum, so that every output element gets its own gradient.
    let w = Tensor::<B, 4>::random([4, 3, 5, 6], Distribution::Normal(0.0, 1.0), &device);
    let close = |a: Vec<f32>, b: Vec<f32>, what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-4 * (1.0 + q.abs()),
                "{what}[{i}]: {p} vs {q}"
            );
        }
    };
    let values = |t: Tensor<B, 4>| t.into_data().to_vec::<f32>().unwrap();
    let run = |ours: bool| {
        let bn = make();
        let x = x.clone().require_grad();
        let y = if ours {
            resnet::batch_norm(&bn, x.clone())
        } else {
            bn.forward(x.clone())
        };
        let grads = (y.clone() * w.clone()).sum().backward();
        let grad = |t: Tensor<<B as burn::tensor::backend::AutodiffBackend>::InnerBackend, 1>| {
            t.into_data().to_vec::<f32>().unwrap()
        };
        (
            values(y),
            x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
            grad(bn.gamma.grad(&grads).unwrap()),
            grad(bn.beta.grad(&grads).unwrap()),
            bn,
        )
    };
    let (y_ours, dx_ours, dg_ours, db_ours, bn_ours) = run(true);
    let (y_burn, dx_burn, dg_burn, db_burn, bn_burn) = run(false);
    close(y_ours, y_burn, "y");
    close(dx_ours, dx_burn, "dL/dx");
    close(dg_ours, dg_burn, "dL/dγ");
    close(db_ours, db_burn, "dL/dβ");
    // Read through the inference copy, where Burn folds in a step's statistics.
    let stats = |bn: &burn::nn::BatchNorm<B>| running_state(&bn.valid());
    close(stats(&bn_ours), stats(&bn_burn), "running statistics");
    assert_ne!(
        stats(&bn_ours),
        stats(&make()),
        "the running statistics moved"
    );
    // Inference: the running statistics.
    let (valid, x) = (bn_ours.valid(), x.inner());
    let ours = resnet::batch_norm(&valid, x.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let burn = valid.forward(x).into_data().to_vec::<f32>().unwrap();
    close(ours, burn, "inference");
}
