//! CIFAR-10 in its standard binary format (Krizhevsky 2009, "Learning Multiple Layers of
//! Features from Tiny Images"; <https://www.cs.toronto.edu/~kriz/cifar.html>, the
//! "binary version" `cifar-10-binary.tar.gz`), for ResNet-20: the field's benchmark
//! (D-PSGD, CHOCO-SGD and DeepSqueeze report ResNet-20 on CIFAR-10).
//!
//! The folder `cifar-10-batches-bin/` holds `data_batch_1.bin` … `data_batch_5.bin`
//! (10,000 training images each) and `test_batch.bin` (10,000). Each file is a sequence of
//! 3,073-byte records: one label byte (class `0..=9`), then 3,072 pixel bytes — the 1,024
//! red values of the 32×32 image row-major, then the green, then the blue.
//!
//! Preprocessing is the one every CIFAR-10 ResNet script uses (torchvision's
//! `ToTensor` + `Normalize(MEAN, STD)`): pixel / 255, then per channel `(v − MEAN[c]) /
//! STD[c]`, with the training set's channel statistics ([`MEAN`], [`STD`]). Training
//! batches are augmented ([`CropFlip`]): a random 32×32 crop of the image padded by 4
//! black pixels on each side, and a horizontal flip with probability ½; test images are
//! not. The padding is black before normalisation, as torchvision's `RandomCrop(32,
//! padding=4)` pads the raw image.

use std::path::{Path, PathBuf};

use rand::RngExt;

use super::{DataError, Dataset, RunData};

/// Bytes of one record: a label byte and 3 × 32 × 32 pixel bytes.
pub const RECORD_BYTES: usize = 1 + CHANNELS * SIDE * SIDE;
/// Colour channels (red, green, blue, in that order in a record).
pub const CHANNELS: usize = 3;
/// Image side, pixels.
pub const SIDE: usize = 32;
/// Classes (airplane, automobile, bird, cat, deer, dog, frog, horse, ship, truck).
pub const CLASSES: usize = 10;
/// The five training files, in the order their images are concatenated.
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// The test file.
pub const TEST_FILE: &str = "test_batch.bin";
/// The folder name of the extracted archive, looked for inside `--data DIR` too.
pub const FOLDER: &str = "cifar-10-batches-bin";
/// Per-channel mean of the training set's pixels in `[0, 1]` (red, green, blue).
pub const MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// Per-channel standard deviation of the training set's pixels in `[0, 1]`.
pub const STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
/// Black pixels added on each side before the random crop.
pub const CROP_PADDING: usize = 4;

/// Training-time augmentation of images stored channel-major (`[channels, rows, cols]`):
/// a random crop of the original size from the image padded by `padding` pixels of value
/// `fill[c]` on every side, then a horizontal flip with probability ½ (He et al. 2016,
/// §4.2, for CIFAR).
#[derive(Debug, Clone, PartialEq)]
pub struct CropFlip {
    /// Pixels of padding on each side.
    pub padding: usize,
    /// The padding's value per channel, in the stored (normalised) units: `fill: [channels]`.
    pub fill: Vec<f32>,
}

impl CropFlip {
    /// The CIFAR-10 augmentation: padding 4 with black pixels, normalised.
    pub fn cifar10() -> CropFlip {
        CropFlip {
            padding: CROP_PADDING,
            fill: (0..CHANNELS).map(|c| -MEAN[c] / STD[c]).collect(),
        }
    }

    /// Appends `image` (`[channels, rows, cols]`, `channels == fill.len()`) cropped and
    /// maybe flipped to `out`, drawing the offsets and the flip from `rng`.
    pub fn apply(
        &self,
        image: &[f32],
        (rows, cols): (usize, usize),
        rng: &mut impl rand::Rng,
        out: &mut Vec<f32>,
    ) {
        let p = self.padding as i64;
        let dy = rng.random_range(-p..=p) as isize;
        let dx = rng.random_range(-p..=p) as isize;
        let flip = rng.random_bool(0.5);
        for (c, &fill) in self.fill.iter().enumerate() {
            let plane = &image[c * rows * cols..(c + 1) * rows * cols];
            for r in 0..rows {
                let sr = r as isize + dy;
                for col in 0..cols {
                    // The flip mirrors the crop, as flipping the cropped image does.
                    let col = if flip { cols - 1 - col } else { col };
                    let sc = col as isize + dx;
                    let inside =
                        (0..rows as isize).contains(&sr) && (0..cols as isize).contains(&sc);
                    out.push(if inside {
                        plane[sr as usize * cols + sc as usize]
                    } else {
                        fill
                    });
                }
            }
        }
    }
}

/// The folder that holds the CIFAR-10 files: `dir` itself or `dir/cifar-10-batches-bin`,
/// whichever has [`TEST_FILE`] or the first training file; `None` if neither does.
pub fn find(dir: &Path) -> Option<PathBuf> {
    [dir.to_owned(), dir.join(FOLDER)]
        .into_iter()
        .find(|d| d.join(TEST_FILE).is_file() || d.join(TRAIN_FILES[0]).is_file())
}

/// The CIFAR-10 training set (the five batches in order) and test set in the folder `dir`
/// (see [`find`]), normalised, the training set augmented ([`CropFlip::cifar10`]).
///
/// # Errors
/// [`DataError::CifarMissing`] if a file is absent, [`DataError::Io`] if one cannot be
/// read, [`DataError::BadRecord`] for a file that is not whole records or has a label
/// beyond 9.
pub fn load_dir(dir: &Path) -> Result<RunData, DataError> {
    let folder = find(dir).unwrap_or_else(|| dir.to_owned());
    let read = |name: &str| -> Result<Dataset, DataError> {
        let path = folder.join(name);
        if !path.is_file() {
            return Err(DataError::CifarMissing {
                file: name.to_owned(),
                dir: folder.clone(),
            });
        }
        let bytes = std::fs::read(&path).map_err(|cause| DataError::Io {
            path: path.clone(),
            cause,
        })?;
        parse(&path.display().to_string(), &bytes)
    };
    let mut train = read(TRAIN_FILES[0])?;
    for name in &TRAIN_FILES[1..] {
        train.extend(&read(name)?);
    }
    train.augment = Some(CropFlip::cifar10());
    Ok(RunData {
        train,
        test: read(TEST_FILE)?,
    })
}

/// The images of one CIFAR-10 binary file's contents, held as bytes and normalised when
/// taken (no augmentation); `name` is for the errors.
///
/// # Errors
/// [`DataError::BadRecord`] if the length is not a positive multiple of
/// [`RECORD_BYTES`] (a truncated or foreign file) or a label is beyond 9.
pub fn parse(name: &str, bytes: &[u8]) -> Result<Dataset, DataError> {
    let bad = |reason: String| DataError::BadRecord {
        file: name.to_owned(),
        reason,
    };
    if bytes.is_empty() {
        return Err(bad("the file is empty".into()));
    }
    if !bytes.len().is_multiple_of(RECORD_BYTES) {
        return Err(bad(format!(
            "{} bytes is not a whole number of {RECORD_BYTES}-byte records: record {} is truncated \
             to {} bytes (is this the binary version, cifar-10-binary.tar.gz?)",
            bytes.len(),
            bytes.len() / RECORD_BYTES,
            bytes.len() % RECORD_BYTES
        )));
    }
    let n = bytes.len() / RECORD_BYTES;
    let mut pixels = Vec::with_capacity(n * (RECORD_BYTES - 1));
    let mut labels = Vec::with_capacity(n);
    for (i, record) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
        let label = record[0];
        if label as usize >= CLASSES {
            return Err(bad(format!(
                "record {i} has label {label}; CIFAR-10's classes are 0..=9"
            )));
        }
        labels.push(label);
        pixels.extend_from_slice(&record[1..]);
    }
    Ok(Dataset {
        // Held as bytes, normalised when a sample is taken ([`Dataset::image`]).
        values: super::Values::Bytes {
            bytes: pixels,
            mean: MEAN.to_vec(),
            std: STD.to_vec(),
        },
        labels,
        channels: CHANNELS,
        rows: SIDE,
        cols: SIDE,
        classes: CLASSES,
        augment: None,
        bytes_per_token: None,
    })
}
