//! The models a peer trains, and the flat parameter vector the algorithms mix.
//!
//! Four networks ([`ModelKind`]): an MLP and a small CNN for MNIST digits, ResNet-20 for
//! 32×32 colour images ([`resnet`], He et al. 2016) and a small GPT-style language model
//! ([`transformer`], Radford et al. 2019). Each takes one kind of sample ([`Input`]); a
//! mini-batch of samples in host memory (the rows of a [`Dataset`](crate::train::data::Dataset))
//! becomes a [`Batch`] of tensors with [`batch_tensors`], and every model turns a batch into
//! rows of logits and their targets ([`Net::forward`]), so that one cross-entropy loss,
//! gradient path and evaluation serve them all.
//!
//! Parameters are flattened into one `Vec<f32>` (`x: [d]`) in the fixed order in which
//! Burn's [`ModuleVisitor`] walks the module (declaration order of the fields), and written
//! back with a [`ModuleMapper`] in the same order. Gradients are flattened in that same
//! order from [`GradientsParams`], so `x[k]` and `grad[k]` always refer to the same scalar.
//! Module state that is not a parameter — the running mean and variance of BatchNorm — is
//! left out of x (and so never mixed): Burn visits it like a parameter, and the visitors
//! here skip it by its field names.

pub mod resnet;
pub mod transformer;

use anyhow::{bail, ensure};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

pub use resnet::{ResNet, ResNetConfig};
pub use transformer::{TransformerConfig, TransformerLm};

/// Which network to train. On the command line and in run configs a name — `mlp`, `cnn`,
/// `resnet20`, `transformer` — optionally followed by sizes after a colon:
/// - the image models (`mlp`, `cnn`, `resnet20`): the images they take, `input=CxHxW`
///   (channels × height × width; an image folder's images are resized to it) and
///   `classes=N` (of synthetic images; real data bring their classes); unset, those of the
///   data (`--data`: MNIST 1×28×28, CIFAR-10 3×32×32, an image folder's first image;
///   [`ModelKind::fitted`]) or the family's default ([`ImageInput::MNIST`] for `mlp` and
///   `cnn`, [`ImageInput::CIFAR10`] for `resnet20`); and the MLP's hidden width, `hidden=N`;
/// - the transformer: `layers=N,d_model=N,heads=N,context=N,d_ff=N,vocab=N` (any subset;
///   the others keep their defaults, [`TransformerConfig::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// `input`-`hidden`-`classes` multilayer perceptron with ReLU: d = (features + 1)·hidden
    /// + (hidden + 1)·classes (203,530 for 784-256-10 on MNIST). A wide one
    /// (`mlp:hidden=31447`: d = 25.0 M, 100 MB messages, ResNet-50's size) measures the wire
    /// with a model of a chosen d that stays cheap to compute.
    Mlp {
        /// Width of the hidden layer.
        hidden: usize,
        /// The images it takes, when given (`input=`, `classes=`); `None`: the data's.
        input: Option<ImageInput>,
    },
    /// Two 3×3 conv layers (16 and 32 channels, padding 1) each followed by ReLU and 2×2
    /// max-pooling, then a linear layer to the classes: d = 20,490 on MNIST, 25,578 on
    /// CIFAR-10.
    Cnn {
        /// The images it takes (height and width at least 4), when given; `None`: the
        /// data's.
        input: Option<ImageInput>,
    },
    /// ResNet-20 (He et al. 2016; d = 272,474 for 3 channels and 10 classes): on CIFAR-10
    /// (`--data DIR`), any other images, or synthetic ones.
    Resnet20 {
        /// The images it takes, when given; `None`: the data's.
        input: Option<ImageInput>,
    },
    /// Decoder-only transformer language model with these sizes: over bytes (vocabulary
    /// 256) on the King James Bible or --data FILE, or over the tokens of a token file
    /// (`transformer:vocab=50257 --data FILE.bin`, `data::tokens`).
    Transformer(TransformerConfig),
}

/// The images an image model takes: `channels × height × width` values per image
/// (channel-major, then row-major) and the number of classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInput {
    /// Colour channels (1 for grey, 3 for RGB).
    pub channels: usize,
    /// Rows of pixels.
    pub height: usize,
    /// Columns of pixels.
    pub width: usize,
    /// Classes, labels `0..classes` (at most 256: labels are bytes).
    pub classes: usize,
}

impl ImageInput {
    /// MNIST digits: 1×28×28, 10 classes (the default of `mlp` and `cnn`).
    pub const MNIST: ImageInput = ImageInput {
        channels: 1,
        height: 28,
        width: 28,
        classes: CLASSES,
    };
    /// CIFAR-10: 3×32×32, 10 classes (the default of `resnet20`).
    pub const CIFAR10: ImageInput = ImageInput {
        channels: 3,
        height: 32,
        width: 32,
        classes: CLASSES,
    };
    /// Most classes: labels are stored as bytes.
    pub const MAX_CLASSES: usize = 256;

    /// Values per image, channels · height · width.
    pub fn features(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// The [`Input`] of images of this kind.
    pub fn input(self) -> Input {
        Input::Images {
            channels: self.channels,
            height: self.height,
            width: self.width,
            classes: self.classes,
        }
    }

    /// Parses `CxHxW` (e.g. `3x32x32`; `×` is accepted for `x`).
    ///
    /// # Errors
    /// Not three whole numbers, or one of them 0.
    fn parse_shape(s: &str) -> Result<(usize, usize, usize), String> {
        let dims: Vec<&str> = s.split(['x', '×']).collect();
        let dims: Option<Vec<usize>> = dims.iter().map(|d| d.trim().parse().ok()).collect();
        match dims.as_deref() {
            Some(&[c, h, w]) if c > 0 && h > 0 && w > 0 => Ok((c, h, w)),
            _ => Err(format!(
                "input={s}: not CxHxW, three whole numbers ≥ 1 (channels, height, width; e.g. \
                 3x32x32)"
            )),
        }
    }
}

impl std::fmt::Display for ImageInput {
    /// `C×H×W images, N classes`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.input().fmt(f)
    }
}

/// The MLP's default hidden width (`mlp`: 784-256-10).
pub const MLP_HIDDEN: usize = 256;

/// The sizes `transformer:…` may set, in the order [`ModelKind`]'s `Display` writes them.
const TRANSFORMER_KEYS: [&str; 6] = ["layers", "d_model", "heads", "context", "d_ff", "vocab"];

impl std::fmt::Display for ModelKind {
    /// The name; then, after a colon, the sizes that differ from the family's defaults or
    /// were given (`mlp:hidden=512`, `cnn:input=3x32x32`, `transformer:context=128`): the
    /// text parses back to the same model.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sizes: Vec<String> = Vec::new();
        if let ModelKind::Mlp { hidden, .. } = self {
            if *hidden != MLP_HIDDEN {
                sizes.push(format!("hidden={hidden}"));
            }
        }
        if let Some(i) = self.given_images() {
            sizes.push(format!("input={}x{}x{}", i.channels, i.height, i.width));
            if i.classes != CLASSES {
                sizes.push(format!("classes={}", i.classes));
            }
        }
        if let ModelKind::Transformer(c) = self {
            let d = TransformerConfig::default();
            let pairs = [
                (c.layers, d.layers),
                (c.d_model, d.d_model),
                (c.heads, d.heads),
                (c.context, d.context),
                (c.d_ff, d.d_ff),
                (c.vocab, d.vocab),
            ];
            for (key, (v, default)) in TRANSFORMER_KEYS.iter().zip(pairs) {
                if v != default {
                    sizes.push(format!("{key}={v}"));
                }
            }
        }
        f.write_str(self.name())?;
        if !sizes.is_empty() {
            write!(f, ":{}", sizes.join(","))?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ModelKind {
    type Err = String;

    /// Parses a name, `mlp`, `cnn`, `resnet20` or `transformer`, optionally followed by
    /// `:KEY=VALUE,…`: for the image models `input=CxHxW` and `classes=N` (and `hidden=N`
    /// for the MLP), for the transformer `layers`, `d_model`, `heads`, `context`, `d_ff`,
    /// `vocab`.
    ///
    /// # Errors
    /// An unknown name or key, a size that is not a whole number, a key given twice, or a
    /// model that cannot be built (a size of 0, fewer than 2 or more than 256 classes, a CNN
    /// input under 4×4, heads that do not divide d_model).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, sizes) = match s.split_once(':') {
            Some((name, sizes)) => (name, Some(sizes)),
            None => (s, None),
        };
        let mut kind = match name {
            "mlp" => ModelKind::MLP,
            "cnn" => ModelKind::CNN,
            "resnet20" => ModelKind::RESNET20,
            "transformer" => ModelKind::transformer(),
            other => {
                return Err(format!(
                    "unknown model {other:?}: one of mlp, cnn, resnet20, transformer \
                     (mlp:hidden=N for the MLP's width; input=CxHxW,classes=N for an image \
                     model's images; transformer:layers=N,d_model=N,heads=N,context=N,d_ff=N,\
                     vocab=N for the transformer's sizes)"
                ))
            }
        };
        let Some(sizes) = sizes else {
            return Ok(kind);
        };
        // The images given start from the family's (`input=` alone keeps 10 classes).
        let default = kind.default_images().unwrap_or(ImageInput::MNIST);
        let mut seen = Vec::new();
        for pair in sizes.split(',') {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not KEY=VALUE (in {s:?})"))?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(format!("{key} is given twice (in {s:?})"));
            }
            seen.push(key);
            let number = || -> Result<usize, String> {
                value
                    .parse()
                    .map_err(|_| format!("{key}={value}: not a whole number (in {s:?})"))
            };
            match (&mut kind, key) {
                (ModelKind::Mlp { hidden, .. }, "hidden") => *hidden = number()?,
                (ModelKind::Transformer(c), _) => match key {
                    "layers" => c.layers = number()?,
                    "d_model" => c.d_model = number()?,
                    "heads" => c.heads = number()?,
                    "context" => c.context = number()?,
                    "d_ff" => c.d_ff = number()?,
                    "vocab" => c.vocab = number()?,
                    other => {
                        return Err(format!(
                            "unknown transformer size {other:?}: one of {}",
                            TRANSFORMER_KEYS.join(", ")
                        ))
                    }
                },
                (
                    ModelKind::Mlp { input, .. }
                    | ModelKind::Cnn { input }
                    | ModelKind::Resnet20 { input },
                    "input",
                ) => {
                    let i = input.get_or_insert(default);
                    (i.channels, i.height, i.width) = ImageInput::parse_shape(value)?;
                }
                (
                    ModelKind::Mlp { input, .. }
                    | ModelKind::Cnn { input }
                    | ModelKind::Resnet20 { input },
                    "classes",
                ) => input.get_or_insert(default).classes = number()?,
                (_, other) => {
                    let keys = if name == "mlp" {
                        "hidden, input, classes"
                    } else {
                        "input, classes"
                    };
                    return Err(format!("unknown {name} size {other:?}: one of {keys}"));
                }
            }
        }
        kind.check()?;
        Ok(kind)
    }
}

impl Serialize for ModelKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ModelKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl ModelKind {
    /// The 784-256-10 MLP (`mlp`) on MNIST, the default model.
    pub const MLP: ModelKind = ModelKind::Mlp {
        hidden: MLP_HIDDEN,
        input: None,
    };
    /// The CNN (`cnn`) on MNIST.
    pub const CNN: ModelKind = ModelKind::Cnn { input: None };
    /// ResNet-20 (`resnet20`) on CIFAR-10.
    pub const RESNET20: ModelKind = ModelKind::Resnet20 { input: None };

    /// The transformer with its default sizes ([`TransformerConfig::default`]).
    pub fn transformer() -> Self {
        ModelKind::Transformer(TransformerConfig::default())
    }

    /// The family's name: `mlp`, `cnn`, `resnet20`, `transformer`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp { .. } => "mlp",
            ModelKind::Cnn { .. } => "cnn",
            ModelKind::Resnet20 { .. } => "resnet20",
            ModelKind::Transformer(_) => "transformer",
        }
    }

    /// The images an image model takes (given, or the family's default); `None` for the
    /// language model.
    pub fn images(self) -> Option<ImageInput> {
        self.given_images().or(self.default_images())
    }

    /// The images given with `input=` or `classes=` (or set by [`ModelKind::fitted`]).
    pub fn given_images(self) -> Option<ImageInput> {
        match self {
            ModelKind::Mlp { input, .. }
            | ModelKind::Cnn { input }
            | ModelKind::Resnet20 { input } => input,
            ModelKind::Transformer(_) => None,
        }
    }

    /// The images the family takes unless told otherwise: MNIST's for `mlp` and `cnn`,
    /// CIFAR-10's for `resnet20`; `None` for the language model.
    pub fn default_images(self) -> Option<ImageInput> {
        match self {
            ModelKind::Mlp { .. } | ModelKind::Cnn { .. } => Some(ImageInput::MNIST),
            ModelKind::Resnet20 { .. } => Some(ImageInput::CIFAR10),
            ModelKind::Transformer(_) => None,
        }
    }

    /// This model taking `input` (an image model; the language model is returned as it is).
    pub fn with_images(self, input: ImageInput) -> ModelKind {
        let input = Some(input);
        match self {
            ModelKind::Mlp { hidden, .. } => ModelKind::Mlp { hidden, input },
            ModelKind::Cnn { .. } => ModelKind::Cnn { input },
            ModelKind::Resnet20 { .. } => ModelKind::Resnet20 { input },
            t @ ModelKind::Transformer(_) => t,
        }
    }

    /// This model sized for the images of `data` (the run's training set, as
    /// [`RunData::load`](crate::train::data::RunData::load) read it for this model): their
    /// channels, height, width and classes, unless they are the family's default and none
    /// were given (`mlp` on MNIST stays `mlp`). The language model is returned as it is.
    pub fn fitted(self, data: &crate::train::data::Dataset) -> ModelKind {
        let images = ImageInput {
            channels: data.channels,
            height: data.rows,
            width: data.cols,
            classes: data.classes,
        };
        match (self.given_images(), self.default_images()) {
            (_, None) => self,
            (None, Some(default)) if default == images => self,
            _ => self.with_images(images),
        }
    }

    /// Checks that the model can be built.
    ///
    /// # Errors
    /// A size of 0, fewer than 2 or more than 256 classes, a CNN input under 4×4 (its two
    /// poolings halve it twice), or a transformer [`TransformerConfig::check`] refuses.
    pub fn check(self) -> Result<(), String> {
        if let ModelKind::Mlp { hidden: 0, .. } = self {
            return Err("an MLP needs at least 1 hidden unit".into());
        }
        if let Some(i) = self.images() {
            if !(2..=ImageInput::MAX_CLASSES).contains(&i.classes) {
                return Err(format!(
                    "classes={}: an image model needs 2 to {} classes",
                    i.classes,
                    ImageInput::MAX_CLASSES
                ));
            }
            if i.channels == 0 || i.height == 0 || i.width == 0 {
                return Err(format!("{}: images of size 0", self.name()));
            }
            if matches!(self, ModelKind::Cnn { .. }) && (i.height < 4 || i.width < 4) {
                return Err(format!(
                    "input={}x{}x{}: the CNN pools twice by 2 and needs images of at least \
                     4×4",
                    i.channels, i.height, i.width
                ));
            }
        }
        if let ModelKind::Transformer(c) = self {
            c.check().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The samples the model of this kind takes.
    pub fn input(self) -> Input {
        match self {
            ModelKind::Transformer(c) => Input::Tokens {
                context: c.context,
                vocab: c.vocab,
            },
            image => image.images().unwrap_or(ImageInput::MNIST).input(),
        }
    }

    /// The name, followed by what it trains on (` on MNIST`, ` on CIFAR-10`, ` on DIR`,
    /// ` (synthetic data)`, ` on text`) when `data` (`--data`) is or is not given: for the
    /// header lines of runs.
    pub fn with_data(self, data: Option<&std::path::Path>) -> String {
        match (self, data) {
            (ModelKind::Transformer(_), _) => format!("{self} on text"),
            (ModelKind::Resnet20 { .. }, None) => format!("{self} (synthetic data)"),
            (_, None) => self.to_string(),
            (_, Some(dir)) if crate::train::data::cifar::find(dir).is_some() => {
                format!("{self} on CIFAR-10")
            }
            (_, Some(dir)) => format!("{self} on {}", dir.display()),
        }
    }
}

/// What one sample is, in host memory a row of `features()` f32 values (plus a label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// An image of `channels × height × width` values in [0, 1] (channel-major, then
    /// row-major) and its class in `0..classes`.
    Images {
        /// Colour channels (1 for grey digits, 3 for RGB).
        channels: usize,
        /// Rows of pixels.
        height: usize,
        /// Columns of pixels.
        width: usize,
        /// Number of classes.
        classes: usize,
    },
    /// A sequence of `context + 1` token ids in `0..vocab` (stored as exact f32 integers;
    /// the label is unused): the model reads tokens `0..context` and is trained to predict
    /// tokens `1..=context`, the next token at every position.
    Tokens {
        /// Positions the model reads, T.
        context: usize,
        /// Tokens in the vocabulary.
        vocab: usize,
    },
}

impl Input {
    /// f32 values per sample: channels · height · width, or context + 1.
    pub fn features(&self) -> usize {
        match *self {
            Input::Images {
                channels,
                height,
                width,
                ..
            } => channels * height * width,
            Input::Tokens { context, .. } => context + 1,
        }
    }
}

impl std::fmt::Display for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Input::Images {
                channels,
                height,
                width,
                classes,
            } => write!(f, "{channels}×{height}×{width} images, {classes} classes"),
            Input::Tokens { context, vocab } => {
                write!(f, "sequences of {context} + 1 tokens, vocabulary {vocab}")
            }
        }
    }
}

/// features-hidden-classes MLP with ReLU.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Relu,
    /// Channels, height and width of the images (fc1 takes their product).
    shape: [usize; 3],
}

/// Small CNN: conv3×3(C→16) → ReLU → pool 2×2 → conv3×3(16→32) → ReLU → pool 2×2 →
/// linear(32 · ⌊H/4⌋ · ⌊W/4⌋ → classes).
#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    fc: Linear<B>,
    act: Relu,
    /// Channels, height and width of the images.
    shape: [usize; 3],
}

/// A model of any kind.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per peer, never moved in a hot loop
pub enum Net<B: Backend> {
    /// See [`Mlp`].
    Mlp(Mlp<B>),
    /// See [`Cnn`].
    Cnn(Cnn<B>),
    /// See [`ResNet`].
    ResNet(ResNet<B>),
    /// See [`TransformerLm`].
    Transformer(TransformerLm<B>),
}

/// Classes of MNIST and CIFAR-10 (and the default of the synthetic images).
pub const CLASSES: usize = 10;

/// A mini-batch as tensors, as [`batch_tensors`] builds it. [`Net::forward`] checks the
/// shapes; the values are checked by [`batch_tensors`] only (a hand-built batch with a label or
/// token id out of range makes Burn panic).
#[derive(Debug, Clone)]
pub enum Batch<B: Backend> {
    /// Images and their classes.
    Images {
        /// `[batch, features]`: each image flattened as in [`Input::Images`].
        images: Tensor<B, 2>,
        /// `[batch]`, classes.
        labels: Tensor<B, 1, Int>,
    },
    /// Token sequences and the next token at every position.
    Tokens {
        /// `[batch, context]`: tokens 0..context of each sequence.
        tokens: Tensor<B, 2, Int>,
        /// `[batch, context]`: tokens 1..=context of each sequence.
        targets: Tensor<B, 2, Int>,
    },
}

impl<B: Backend> Batch<B> {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        match self {
            Batch::Images { labels, .. } => labels.dims()[0],
            Batch::Tokens { tokens, .. } => tokens.dims()[0],
        }
    }

    /// Whether the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<B: Backend> Net<B> {
    /// A freshly initialised model of `kind` (the default configuration of its family).
    /// Burn's initialisers draw from the backend RNG, which the caller seeds (`B::seed`) so
    /// that every peer starts from the same x⁰.
    pub fn new(kind: ModelKind, device: &B::Device) -> Self {
        let input = kind.images().unwrap_or(ImageInput::MNIST);
        match kind {
            ModelKind::Mlp { hidden, .. } => Net::Mlp(Mlp {
                fc1: LinearConfig::new(input.features(), hidden).init(device),
                fc2: LinearConfig::new(hidden, input.classes).init(device),
                act: Relu::new(),
                shape: [input.channels, input.height, input.width],
            }),
            ModelKind::Cnn { .. } => Net::Cnn(Cnn {
                conv1: Conv2dConfig::new([input.channels, 16], [3, 3])
                    .with_padding(PaddingConfig2d::Same)
                    .init(device),
                conv2: Conv2dConfig::new([16, 32], [3, 3])
                    .with_padding(PaddingConfig2d::Same)
                    .init(device),
                pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
                fc: LinearConfig::new(32 * (input.height / 4) * (input.width / 4), input.classes)
                    .init(device),
                act: Relu::new(),
                shape: [input.channels, input.height, input.width],
            }),
            ModelKind::Resnet20 { .. } => Net::ResNet(
                ResNetConfig {
                    in_channels: input.channels,
                    rows: input.height,
                    cols: input.width,
                    classes: input.classes,
                    ..ResNetConfig::default()
                }
                .build(device),
            ),
            ModelKind::Transformer(c) => Net::Transformer(c.build(device)),
        }
    }

    /// The samples this model takes.
    pub fn input(&self) -> Input {
        let images = |[channels, height, width]: [usize; 3], classes| Input::Images {
            channels,
            height,
            width,
            classes,
        };
        match self {
            Net::Mlp(m) => images(m.shape, m.fc2.weight.dims()[1]),
            Net::Cnn(m) => images(m.shape, m.fc.weight.dims()[1]),
            Net::ResNet(m) => images(m.shape(), m.classes()),
            Net::Transformer(m) => Input::Tokens {
                context: m.context(),
                vocab: m.vocab(),
            },
        }
    }

    /// Logits and their targets, one row per prediction: one per image, or one per position
    /// of every sequence.
    ///
    /// # Shapes
    /// - images: `[batch, features]` → logits `[batch, classes]`, targets `[batch]`
    /// - tokens: `[batch, context]` → logits `[batch · context, vocab]`, targets
    ///   `[batch · context]`
    ///
    /// # Errors
    /// If the batch is not of this model's [`Input`].
    pub fn forward(&self, batch: Batch<B>) -> anyhow::Result<(Tensor<B, 2>, Tensor<B, 1, Int>)> {
        let input = self.input();
        match (self, batch) {
            (Net::Transformer(m), Batch::Tokens { tokens, targets }) => {
                let [b, t] = tokens.dims();
                ensure!(
                    Input::Tokens {
                        context: t,
                        vocab: m.vocab()
                    } == input
                        && targets.dims() == [b, t],
                    "a batch of [{b}, {t}] tokens and {:?} targets for a model that takes {input}",
                    targets.dims()
                );
                let logits = m.forward(tokens).reshape([b * t, m.vocab()]);
                Ok((logits, targets.reshape([b * t])))
            }
            (Net::Transformer(_), Batch::Images { .. }) => {
                bail!("a batch of images for a model that takes {input}")
            }
            (_, Batch::Tokens { .. }) => bail!("a batch of tokens for a model that takes {input}"),
            (net, Batch::Images { images, labels }) => {
                let [b, f] = images.dims();
                ensure!(
                    f == input.features() && labels.dims() == [b],
                    "a batch of {b} images of {f} values and {:?} labels for a model that takes {input} ({} values each)",
                    labels.dims(),
                    input.features()
                );
                let logits = match net {
                    Net::Mlp(m) => m.fc2.forward(m.act.forward(m.fc1.forward(images))),
                    Net::Cnn(m) => {
                        let [c, h, w] = m.shape;
                        let x = images.reshape([b, c, h, w]);
                        let x = m.pool.forward(m.act.forward(m.conv1.forward(x)));
                        let x = m.pool.forward(m.act.forward(m.conv2.forward(x)));
                        m.fc.forward(x.reshape([b, 32 * (h / 4) * (w / 4)]))
                    }
                    Net::ResNet(m) => {
                        let [c, h, w] = m.shape();
                        m.forward(images.reshape([b, c, h, w]))
                    }
                    Net::Transformer(_) => unreachable!("matched above"),
                };
                Ok((logits, labels))
            }
        }
    }

    /// The mean cross-entropy of the batch's predictions (over images, or over every position
    /// of every sequence), a tensor of one value.
    ///
    /// # Errors
    /// If the batch is not of this model's [`Input`].
    pub fn loss(&self, batch: Batch<B>) -> anyhow::Result<Tensor<B, 1>> {
        let (logits, targets) = self.forward(batch)?;
        let device = logits.device();
        Ok(CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets))
    }

    /// Number of scalar parameters d: the length of [`flatten`]'s vector (BatchNorm running
    /// statistics are not parameters).
    pub fn dim(&self) -> usize {
        tensor_lengths(self).iter().sum()
    }
}

/// Builds the batch tensors of `b = labels.len()` samples for a model that takes `input`.
///
/// # Shapes
/// - `samples`: `[b · input.features()]` row-major (a [`Dataset`](crate::train::data::Dataset)'s
///   layout); `labels`: `[b]` (classes of images; ignored for token sequences)
///
/// # Errors
/// If the lengths disagree, a label is not a class, or a token is not an integer in
/// `0..vocab`.
pub fn batch_tensors<B: Backend>(
    input: Input,
    samples: Vec<f32>,
    labels: &[u8],
    device: &B::Device,
) -> anyhow::Result<Batch<B>> {
    let b = labels.len();
    let f = input.features();
    ensure!(
        samples.len() == b * f,
        "a batch of {b} samples needs {} values ({f} per sample for {input}), got {}",
        b * f,
        samples.len()
    );
    match input {
        Input::Images { classes, .. } => {
            if let Some(l) = labels.iter().find(|&&l| l as usize >= classes) {
                bail!("label {l} is not a class 0..{classes}");
            }
            let images = Tensor::<B, 2>::from_data(TensorData::new(samples, [b, f]), device);
            let labels = Tensor::<B, 1, Int>::from_data(
                TensorData::new(labels.iter().map(|&l| l as i64).collect::<Vec<_>>(), [b]),
                device,
            );
            Ok(Batch::Images { images, labels })
        }
        Input::Tokens { context, vocab } => {
            let mut tokens = Vec::with_capacity(b * context);
            let mut targets = Vec::with_capacity(b * context);
            for seq in samples.chunks_exact(f) {
                let ids = seq.iter().map(|&v| {
                    if v.fract() == 0.0 && v >= 0.0 && (v as usize) < vocab {
                        Ok(v as i64)
                    } else {
                        Err(anyhow::anyhow!("token {v} is not an id in 0..{vocab}"))
                    }
                });
                let ids = ids.collect::<anyhow::Result<Vec<i64>>>()?;
                tokens.extend_from_slice(&ids[..context]);
                targets.extend_from_slice(&ids[1..]);
            }
            Ok(Batch::Tokens {
                tokens: Tensor::from_data(TensorData::new(tokens, [b, context]), device),
                targets: Tensor::from_data(TensorData::new(targets, [b, context]), device),
            })
        }
    }
}

/// Tokens generated by the language model `net` after `prompt` (token ids: bytes for a
/// byte-level model): `n` ids, each drawn from softmax(logits / `temperature`) at the last
/// position of the (at most `context`) ids before it, with an RNG seeded by `seed`;
/// `temperature` 0 takes the most likely id.
///
/// # Errors
/// If `net` is not a language model.
pub fn sample_text<B: Backend>(
    net: &Net<B>,
    prompt: &[u32],
    n: usize,
    temperature: f32,
    seed: u64,
    device: &B::Device,
) -> anyhow::Result<Vec<u32>> {
    use rand::{RngExt, SeedableRng};
    let Net::Transformer(m) = net else {
        bail!("only the language model (--model transformer) generates text");
    };
    let context = match net.input() {
        Input::Tokens { context, .. } => context,
        other => bail!("a model that takes {other} generates no text"),
    };
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= m.vocab()) {
        bail!(
            "prompt token {id} is beyond the vocabulary of {}",
            m.vocab()
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut text = prompt.to_vec();
    for _ in 0..n {
        let window = &text[text.len().saturating_sub(context)..];
        if window.is_empty() {
            text.push(u32::from(b'\n'));
            continue;
        }
        let ids: Vec<i64> = window.iter().map(|&b| i64::from(b)).collect();
        let t = ids.len();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, t]), device);
        let logits: Vec<f32> = m
            .forward(tokens)
            .narrow(1, t - 1, 1)
            .reshape([m.vocab()])
            .into_data()
            .iter::<f32>()
            .collect();
        let next = if temperature <= 0.0 {
            (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap_or(0)
        } else {
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f64> = logits
                .iter()
                .map(|&l| f64::from((l - top) / temperature).exp())
                .collect();
            let mut r = rng.random::<f64>() * weights.iter().sum::<f64>();
            let mut pick = weights.len() - 1;
            for (i, w) in weights.iter().enumerate() {
                if r < *w {
                    pick = i;
                    break;
                }
                r -= w;
            }
            pick
        };
        text.push(next as u32);
    }
    Ok(text.split_off(prompt.len()))
}

/// Logits computed at once by [`evaluate`] (2^22 f32, 16 MiB).
pub const MAX_EVAL_LOGITS: usize = 1 << 22;

/// One forward/backward pass: returns the mean cross-entropy loss of the batch and writes
/// the gradient flattened in parameter order to `grad_out`, `grad: [d]`.
///
/// # Errors
/// If the batch is not of this model's [`Input`].
pub fn loss_and_grad<B: AutodiffBackend>(
    model: &Net<B>,
    batch: Batch<B>,
    grad_out: &mut Vec<f32>,
) -> anyhow::Result<f32> {
    let loss = model.loss(batch)?;
    let loss_value = loss
        .clone()
        .into_data()
        .iter::<f32>()
        .next()
        .unwrap_or(f32::NAN);
    let grads = GradientsParams::from_grads(loss.backward(), model);
    grad_out.clear();
    let mut flattener = GradFlattener {
        grads: &grads,
        parts: Vec::new(),
        state: StateFilter::default(),
    };
    model.visit(&mut flattener);
    read_concatenated(flattener.parts, grad_out);
    Ok(loss_value)
}

/// Accuracy (fraction in [0, 1] of correct predictions: of images, or of next tokens over
/// every position) and mean cross-entropy over a data set of the model's [`Input`],
/// evaluated in batches of `batch` samples, fewer where their logits would exceed
/// [`MAX_EVAL_LOGITS`] (on the non-autodiff backend, where BatchNorm uses its running
/// statistics).
///
/// # Shapes
/// - `samples`: `[n · features]`; `labels`: `[n]`
///
/// # Errors
/// If the data are not of the model's [`Input`] (see [`batch_tensors`]).
pub fn evaluate<B: Backend>(
    model: &Net<B>,
    samples: &[f32],
    labels: &[u8],
    batch: usize,
    device: &B::Device,
) -> anyhow::Result<(f64, f64)> {
    let n = labels.len();
    if n == 0 {
        return Ok((0.0, 0.0));
    }
    let input = model.input();
    let f = input.features();
    ensure!(
        samples.len() == n * f,
        "{n} samples of {input} need {} values, got {}",
        n * f,
        samples.len()
    );
    // At most MAX_EVAL_LOGITS logits at once: a language model over GPT-2's 50,257 tokens
    // has 3.2 M per sequence of 64 (the 256 validation sequences at once: 3.3 GB, and the
    // loss makes copies).
    let per_sample = match input {
        Input::Tokens { context, vocab } => context * vocab,
        Input::Images { classes, .. } => classes,
    };
    let batch = batch.min(MAX_EVAL_LOGITS / per_sample.max(1)).max(1);
    let (mut correct, mut rows) = (0usize, 0usize);
    let mut loss_sum = 0.0f64;
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    for start in (0..n).step_by(batch) {
        let end = (start + batch).min(n);
        let b = batch_tensors::<B>(
            input,
            samples[start * f..end * f].to_vec(),
            &labels[start..end],
            device,
        )?;
        let (logits, targets) = model.forward(b)?;
        let count = targets.dims()[0];
        let l = loss_fn.forward(logits.clone(), targets.clone());
        loss_sum += l.into_data().iter::<f32>().next().unwrap_or(f32::NAN) as f64 * count as f64;
        let hits = logits.argmax(1).reshape([count]).equal(targets).int().sum();
        correct += hits.into_data().iter::<i64>().next().unwrap_or(0) as usize;
        rows += count;
    }
    Ok((correct as f64 / rows as f64, loss_sum / rows as f64))
}

/// Flattens the parameters of `model` into `out` (cleared first): `x: [d]`.
pub fn flatten<B: Backend, M: Module<B>>(model: &M, out: &mut Vec<f32>) {
    flatten_selected(model, out, StateFilter::default());
}

/// The tensors `state` selects, flattened into `out` (cleared first).
fn flatten_selected<B: Backend, M: Module<B>>(model: &M, out: &mut Vec<f32>, state: StateFilter) {
    out.clear();
    let mut flattener = ParamFlattener {
        parts: Vec::new(),
        state,
    };
    model.visit(&mut flattener);
    read_concatenated(flattener.parts, out);
}

/// Writes `x` into the tensors `state` selects; `what` names them in the error.
fn unflatten_selected<B: Backend, M: Module<B>>(
    model: M,
    x: &[f32],
    state: StateFilter,
    what: &str,
) -> anyhow::Result<M> {
    let mut mapper = ParamWriter {
        x,
        flat: None,
        pos: 0,
        short: false,
        state,
    };
    let model = model.map(&mut mapper);
    if mapper.short || mapper.pos != x.len() {
        bail!(
            "{what} vector has {} values, the model has {}",
            x.len(),
            mapper.pos
        );
    }
    Ok(model)
}

/// The number of values of each parameter tensor, in the order of [`flatten`] (they sum
/// to d): the tensor boundaries for layer-wise compression.
pub fn tensor_lengths<B: Backend, M: Module<B>>(model: &M) -> Vec<usize> {
    struct Lengths(Vec<usize>, StateFilter);
    impl<B: Backend> ModuleVisitor<B> for Lengths {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.1.enter(name, container_type);
        }
        fn exit_module(&mut self, name: &str, container_type: &str) {
            self.1.exit(name, container_type);
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !self.1.skip() {
                self.0.push(param.lazy_shape().num_elements());
            }
        }
    }
    let mut lengths = Lengths(Vec::new(), StateFilter::default());
    model.visit(&mut lengths);
    lengths.0
}

/// Writes `x: [d]` back into `model` in the order of [`flatten`].
///
/// # Errors
/// If `x.len()` differs from the model's d (the model is then unusable and dropped).
pub fn unflatten<B: Backend, M: Module<B>>(model: M, x: &[f32]) -> anyhow::Result<M> {
    unflatten_selected(model, x, StateFilter::default(), "parameter")
}

/// Flattens the module state of `model` that is not a parameter — the running mean and
/// variance of every BatchNorm, in the module's visiting order — into `out` (cleared
/// first): `[s]`, empty for a model without BatchNorm. Not mixed, but saved in checkpoints.
pub fn flatten_running_state<B: Backend, M: Module<B>>(model: &M, out: &mut Vec<f32>) {
    flatten_selected(model, out, StateFilter::running());
}

/// Writes `s: [s]` back into the running state of `model`, in the order of
/// [`flatten_running_state`].
///
/// # Errors
/// If `s.len()` differs from the model's (the model is then unusable and dropped).
pub fn unflatten_running_state<B: Backend, M: Module<B>>(model: M, s: &[f32]) -> anyhow::Result<M> {
    unflatten_selected(model, s, StateFilter::running(), "running-state")
}

/// `net` with every tensor read from the SafeTensors file `path` (`--init-from`; e.g. a
/// run's `model.safetensors`), through burn-store, in PyTorch's conventions (names by
/// field path, linear weights [out, in]; see `report::collector::write_model`).
///
/// # Errors
/// The file cannot be read, or its tensors do not match the model's: one missing, or one
/// of another shape (tensors the model has not are ignored, with a warning).
pub fn load_safetensors<B: Backend>(
    mut net: Net<B>,
    path: &std::path::Path,
) -> anyhow::Result<Net<B>> {
    use burn_store::{ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
    let mut store = SafetensorsStore::from_file(path.to_path_buf())
        .with_from_adapter(PyTorchToBurnAdapter)
        .skip_enum_variants(true);
    let result = net
        .load_from(&mut store)
        .map_err(|e| anyhow::anyhow!("--init-from {}: {e}", path.display()))?;
    if !(result.errors.is_empty() && result.missing.is_empty()) {
        let missing: Vec<&str> = result.missing.iter().map(|(p, _)| p.as_str()).collect();
        anyhow::bail!(
            "--init-from {}: does not fit the model (missing {missing:?}, errors {:?})",
            path.display(),
            result.errors
        );
    }
    // burn-store lists a normalization layer's PyTorch-named `weight`/`bias` as unused
    // even when it applied them as Burn's `gamma`/`beta`: only other names are extra.
    let extra: Vec<&String> = (result.unused.iter())
        .filter(|u| !(u.ends_with(".weight") || u.ends_with(".bias")))
        .collect();
    if !extra.is_empty() {
        tracing::warn!(file = %path.display(), ?extra, "--init-from: tensors the model does not have were ignored");
    }
    Ok(net)
}

/// The non-autodiff copy of a model, for evaluation.
pub fn inference_copy<B: AutodiffBackend>(model: &Net<B>) -> Net<B::InnerBackend> {
    model.valid()
}

/// Whether a module field holds state that is not a parameter: Burn's `BatchNorm` keeps its
/// running statistics in `RunningState` fields, which its visitors and mappers see exactly
/// like parameters. They are recognised by the field names Burn 0.21 gives them.
fn is_running_state(name: &str, container_type: &str) -> bool {
    container_type == "Struct:BatchNorm" && matches!(name, "running_mean" | "running_var")
}

/// Tracks, for a visitor or mapper, whether the walk is inside module state that is not a
/// parameter (see [`is_running_state`]).
#[derive(Debug, Default)]
struct StateFilter {
    depth: usize,
    /// Select the running state instead of the parameters.
    running: bool,
}

impl StateFilter {
    fn enter(&mut self, name: &str, container_type: &str) {
        if is_running_state(name, container_type) {
            self.depth += 1;
        }
    }

    fn exit(&mut self, name: &str, container_type: &str) {
        if is_running_state(name, container_type) {
            self.depth = self.depth.saturating_sub(1);
        }
    }

    /// Whether the tensor visited now is not selected: not a parameter (or, selecting the
    /// running state, not running state).
    fn skip(&self) -> bool {
        (self.depth > 0) != self.running
    }

    /// A filter that selects the running state instead of the parameters.
    fn running() -> Self {
        StateFilter {
            depth: 0,
            running: true,
        }
    }
}

/// Appends a tensor's values as f32: a copy of the slice when they are f32 already, else
/// value by value (Burn's element iterator is boxed, so the copy is many times faster).
fn extend_f32(out: &mut Vec<f32>, data: &TensorData) {
    match data.as_slice::<f32>() {
        Ok(values) => out.extend_from_slice(values),
        Err(_) => out.extend(data.iter::<f32>()),
    }
}

/// Appends `parts` to `out` in order, concatenated on their device first: one
/// device→host copy however many tensors (on a GPU each copy is a synchronisation, and
/// ResNet-20 has 65 parameter tensors).
fn read_concatenated<B: Backend>(parts: Vec<Tensor<B, 1>>, out: &mut Vec<f32>) {
    let flat = match parts.len() {
        0 => return,
        1 => parts.into_iter().next().expect("one part"),
        _ => Tensor::cat(parts, 0),
    };
    extend_f32(out, &flat.into_data());
}

/// Collects the selected tensors, each as a vector `[numel]`, for [`read_concatenated`].
struct ParamFlattener<B: Backend> {
    parts: Vec<Tensor<B, 1>>,
    state: StateFilter,
}

impl<B: Backend> ModuleVisitor<B> for ParamFlattener<B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.state.enter(name, container_type);
    }

    fn exit_module(&mut self, name: &str, container_type: &str) {
        self.state.exit(name, container_type);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.state.skip() {
            let value = param.val();
            let numel = value.shape().num_elements();
            self.parts.push(value.reshape([numel]));
        }
    }
}

/// Collects each parameter's gradient as a vector `[numel]` (zeros for a parameter the
/// loss does not depend on), on the inner backend, for [`read_concatenated`].
struct GradFlattener<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    parts: Vec<Tensor<B::InnerBackend, 1>>,
    state: StateFilter,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradFlattener<'_, B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.state.enter(name, container_type);
    }

    fn exit_module(&mut self, name: &str, container_type: &str) {
        self.state.exit(name, container_type);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.state.skip() {
            return;
        }
        let part = match self.grads.get::<B::InnerBackend, D>(param.id) {
            Some(g) => {
                let numel = g.shape().num_elements();
                g.reshape([numel])
            }
            // A parameter the loss does not depend on has a zero gradient.
            None => {
                let value = param.val();
                Tensor::zeros([value.shape().num_elements()], &value.device())
            }
        };
        self.parts.push(part);
    }
}

/// Writes `x` into the selected tensors in visiting order. `x` goes to the device once, as
/// one vector, and each tensor is a slice of it (one host→device copy, not one a tensor).
struct ParamWriter<'a, B: Backend> {
    x: &'a [f32],
    /// `x` on the device, made at the first selected tensor.
    flat: Option<Tensor<B, 1>>,
    pos: usize,
    short: bool,
    state: StateFilter,
}

impl<B: Backend> ModuleMapper<B> for ParamWriter<'_, B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.state.enter(name, container_type);
    }

    fn exit_module(&mut self, name: &str, container_type: &str) {
        self.state.exit(name, container_type);
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.state.skip() {
            return param;
        }
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
        let x = self.x;
        let flat = self.flat.get_or_insert_with(|| {
            Tensor::from_data(TensorData::new(x.to_vec(), [x.len()]), &tensor.device())
        });
        let new = flat
            .clone()
            .slice(self.pos..end)
            .reshape(shape)
            .set_require_grad(require_grad);
        self.pos = end;
        Param::from_mapped_value(id, new, mapper)
    }
}

#[cfg(test)]
mod tests;
