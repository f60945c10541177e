//! An image folder: PNG and JPEG files sorted into one subfolder per class, the layout of
//! torchvision's `ImageFolder` and of most image data sets as downloaded.
//!
//! ```text
//! DIR/train/<class>/<any name>.png|.jpg|.jpeg
//! DIR/test/<class>/…          (or DIR/val/<class>/…)
//! ```
//!
//! The classes are the subfolders of `train/` in name order (class 0 first, as
//! `ImageFolder` numbers them); a class folder of `test/` must be one of them. Files of
//! other extensions are skipped, as `ImageFolder` skips them.
//!
//! Every image becomes `channels × height × width` values in `[0, 1]` (the byte / 255,
//! torchvision's `ToTensor`), channel-major then row-major. The size is the model's when it
//! is given (`--model cnn:input=3x64x64`: every image is converted to that many channels —
//! grey to RGB by repeating, RGB to grey by luma — and resized with a triangle filter);
//! otherwise that of the first training image, with 1 channel if it is grey and 3 if not,
//! and every image must have that height and width. No augmentation.

use std::path::{Path, PathBuf};

use image::imageops::FilterType;
use image::DynamicImage;

use super::{DataError, Dataset, RunData};
use crate::train::model::ImageInput;

/// The training set's folder in `DIR`.
pub const TRAIN: &str = "train";
/// The test set's folder names in `DIR`, the first that exists is taken.
pub const TEST: [&str; 2] = ["test", "val"];
/// File extensions read (compared without case).
pub const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// Whether `dir` looks like an image folder: it has a `train/` folder.
pub fn is_image_folder(dir: &Path) -> bool {
    dir.join(TRAIN).is_dir()
}

/// The training and test sets of the image folder `dir`: its classes; the channels, height
/// and width of `size` when it is given (every image is converted and resized to them),
/// else the first training image's size and colour.
///
/// # Errors
/// [`DataError::BadRecord`] naming the folder or file: no `test/` or `val/` folder, fewer
/// than 2 or more than 256 classes, a model of other than 1 or 3 channels, a class without images, a test class that is not a
/// training class, a file that does not decode, an image of another size than the first
/// when no size is given; [`DataError::Io`] for a folder that cannot be listed.
pub fn load_dir(dir: &Path, size: Option<ImageInput>) -> Result<RunData, DataError> {
    let bad = |file: &Path, reason: String| DataError::BadRecord {
        file: file.display().to_string(),
        reason,
    };
    let train_dir = dir.join(TRAIN);
    let Some(test_dir) = TEST.iter().map(|t| dir.join(t)).find(|d| d.is_dir()) else {
        return Err(bad(
            dir,
            format!("an image folder with {TRAIN}/ needs a test/ (or val/) folder beside it"),
        ));
    };
    let classes = subfolders(&train_dir)?;
    if !(2..=ImageInput::MAX_CLASSES).contains(&classes.len()) {
        return Err(bad(
            &train_dir,
            format!(
                "{} class folders; an image folder needs 2 to {} (one subfolder per class)",
                classes.len(),
                ImageInput::MAX_CLASSES
            ),
        ));
    }
    let mut train_files = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let files = images_in(&train_dir.join(class))?;
        if files.is_empty() {
            return Err(bad(
                &train_dir.join(class),
                "holds no .png, .jpg or .jpeg file".into(),
            ));
        }
        train_files.extend(files.into_iter().map(|f| (f, label as u8)));
    }
    let mut test_files = Vec::new();
    for class in subfolders(&test_dir)? {
        let Some(label) = classes.iter().position(|c| *c == class) else {
            return Err(bad(
                &test_dir.join(&class),
                format!(
                    "class {class:?} is not among the training classes ({})",
                    classes.join(", ")
                ),
            ));
        };
        let files = images_in(&test_dir.join(&class))?;
        test_files.extend(files.into_iter().map(|f| (f, label as u8)));
    }
    if test_files.is_empty() {
        return Err(bad(&test_dir, "holds no image in a class folder".into()));
    }
    let size = match size {
        Some(s) if s.channels != 1 && s.channels != 3 => {
            return Err(bad(
                dir,
                format!(
                    "a model of {} channels; an image folder's images are grey (1) or RGB (3)",
                    s.channels
                ),
            ))
        }
        Some(s) => Resize::To(ImageInput {
            classes: classes.len(),
            ..s
        }),
        None => {
            let first = decode(&train_files[0].0)?;
            let channels = if first.color().has_color() { 3 } else { 1 };
            Resize::Exactly(ImageInput {
                channels,
                height: first.height() as usize,
                width: first.width() as usize,
                classes: classes.len(),
            })
        }
    };
    Ok(RunData {
        train: read(&train_files, size)?,
        test: read(&test_files, size)?,
    })
}

/// How images are brought to the model's size.
#[derive(Debug, Clone, Copy)]
enum Resize {
    /// Converted and resized to this size.
    To(ImageInput),
    /// Converted to its channels; an image of another height or width is an error.
    Exactly(ImageInput),
}

/// The images `files` (path, label) as a data set of the given size.
fn read(files: &[(PathBuf, u8)], size: Resize) -> Result<Dataset, DataError> {
    let (Resize::To(s) | Resize::Exactly(s)) = size;
    let (h, w) = (s.height, s.width);
    let mut images = Vec::with_capacity(files.len() * s.features());
    let mut labels = Vec::with_capacity(files.len());
    for (path, label) in files {
        let mut img = decode(path)?;
        if (img.height() as usize, img.width() as usize) != (h, w) {
            if let Resize::Exactly(_) = size {
                return Err(DataError::BadRecord {
                    file: path.display().to_string(),
                    reason: format!(
                        "{}×{} pixels, but the first training image is {h}×{w}: give the \
                         size every image is resized to with the model, e.g. --model \
                         cnn:input={}x{h}x{w}",
                        img.height(),
                        img.width(),
                        s.channels
                    ),
                });
            }
            img = img.resize_exact(w as u32, h as u32, FilterType::Triangle);
        }
        if s.channels == 1 {
            images.extend_from_slice(&img.to_luma8().into_raw());
        } else {
            let rgb = img.to_rgb8().into_raw();
            for c in 0..3 {
                images.extend(rgb.iter().skip(c).step_by(3));
            }
        }
        labels.push(*label);
    }
    Ok(Dataset {
        values: super::Values::unit_bytes(images, s.channels),
        labels,
        channels: s.channels,
        rows: h,
        cols: w,
        classes: s.classes,
        augment: None,
        bytes_per_token: None,
    })
}

/// One image file, decoded.
fn decode(path: &Path) -> Result<DynamicImage, DataError> {
    image::open(path).map_err(|e| DataError::BadRecord {
        file: path.display().to_string(),
        reason: format!("not a readable PNG or JPEG image: {e}"),
    })
}

/// The names of the subfolders of `dir`, sorted.
fn subfolders(dir: &Path) -> Result<Vec<String>, DataError> {
    let mut names: Vec<String> = entries(dir)?
        .into_iter()
        .filter(|p| p.is_dir())
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// The PNG and JPEG files in `dir`, sorted by name.
fn images_in(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut files: Vec<PathBuf> = entries(dir)?
        .into_iter()
        .filter(|p| p.is_file())
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| EXTENSIONS.iter().any(|e| x.eq_ignore_ascii_case(e)))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The paths in `dir`.
fn entries(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let io = |cause| DataError::Io {
        path: dir.to_owned(),
        cause,
    };
    std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()).map_err(io))
        .collect()
}
