//! Byte-level text for the language model: the King James Bible embedded in the binary, or
//! any byte file (`--data FILE`), cut into sequences of context + 1 bytes.
//!
//! The embedded text (`node/data/kjv/kjv.txt.gz`, 4,298,239 bytes, 1.27 MB gzipped) is the
//! King James Version as printed by Debian's `bible-kjv` 4.38 from the data of the package
//! `bible-kjv-text` (the 1611 translation; its copyright has expired; the package's own
//! terms allow unrestricted use): one verse per line, with book and chapter headings. See
//! `experiments/data/README.md` for the commands that regenerate it.
//!
//! Split: the first 90% of the bytes train, the last 10% are held out. Training sequences
//! start every `context` bytes (each predicts its own context bytes, the last of which is
//! the next sequence's first input). The validation set is [`VALIDATION_SEQUENCES`]
//! sequences spread evenly over the held-out part (an epoch's evaluation on every peer must
//! stay cheap); the loss on it is in nats per byte (bits per byte = nats / ln 2).

use std::io::Read;
use std::path::Path;

use super::{DataError, Dataset, RunData, GZIP_MAGIC};

static EMBEDDED_KJV: &[u8] = include_bytes!("../../../data/kjv/kjv.txt.gz");

/// Sequences of the validation set.
pub const VALIDATION_SEQUENCES: usize = 256;

/// The fraction of the bytes that trains (the rest is held out).
pub const TRAIN_FRACTION: f64 = 0.9;

/// The text: the embedded King James Bible, or the bytes of `file` (gunzipped if it is
/// gzip).
///
/// # Errors
/// [`DataError::Io`] if the file cannot be read, [`DataError::Gzip`] for a damaged gzip
/// stream.
pub fn corpus(file: Option<&Path>) -> Result<Vec<u8>, DataError> {
    let (name, bytes) = match file {
        Some(path) => (
            path.display().to_string(),
            std::fs::read(path).map_err(|cause| DataError::Io {
                path: path.to_owned(),
                cause,
            })?,
        ),
        None => ("kjv.txt.gz".to_string(), EMBEDDED_KJV.to_vec()),
    };
    if bytes.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::with_capacity(bytes.len() * 4);
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(|cause| DataError::Gzip { file: name, cause })?;
        return Ok(out);
    }
    Ok(bytes)
}

/// The training and validation sequences of `text` (bytes, or the token ids of a token file,
/// [`super::tokens`]) for a model that reads `context` of them: rows of context + 1 ids
/// (exact integers in f32), labels 0; `bytes_per_token` as [`Dataset::bytes_per_token`].
///
/// # Errors
/// [`DataError::TextTooShort`] if either part cannot hold one sequence.
pub fn split<T: Copy + Into<f32>>(
    text: &[T],
    context: usize,
    bytes_per_token: Option<f64>,
) -> Result<RunData, DataError> {
    let cut = (text.len() as f64 * TRAIN_FRACTION) as usize;
    let (train, held_out) = text.split_at(cut);
    let len = context + 1;
    if train.len() < len || held_out.len() < len {
        return Err(DataError::TextTooShort {
            bytes: text.len(),
            needed: (len as f64 / (1.0 - TRAIN_FRACTION)).ceil() as usize,
        });
    }
    Ok(pair(train, held_out, context, bytes_per_token))
}

/// The training sequences of `train` and the validation sequences of `held_out` (each at
/// least context + 1 long), as [`split`] makes them of its two parts.
pub fn pair<T: Copy + Into<f32>>(
    train: &[T],
    held_out: &[T],
    context: usize,
    bytes_per_token: Option<f64>,
) -> RunData {
    let len = context + 1;
    let starts: Vec<usize> = (0..=train.len() - len).step_by(context).collect();
    let last = held_out.len() - len;
    let n = VALIDATION_SEQUENCES.min(last / context + 1);
    // Evenly spread from the held-out part's start to its end.
    let valid: Vec<usize> = match n {
        1 => vec![0],
        n => (0..n).map(|i| i * last / (n - 1)).collect(),
    };
    RunData {
        train: sequences(train, &starts, len, bytes_per_token),
        test: sequences(held_out, &valid, len, bytes_per_token),
    }
}

fn sequences<T: Copy + Into<f32>>(
    ids: &[T],
    starts: &[usize],
    len: usize,
    bytes_per_token: Option<f64>,
) -> Dataset {
    let mut images = Vec::with_capacity(starts.len() * len);
    for &s in starts {
        images.extend(ids[s..s + len].iter().map(|&b| b.into()));
    }
    Dataset {
        values: super::Values::F32(images),
        labels: vec![0; starts.len()],
        channels: 1,
        rows: 1,
        cols: len,
        classes: 0,
        augment: None,
        bytes_per_token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_bible_is_there_and_splits_ninety_ten() {
        let text = corpus(None).unwrap();
        assert_eq!(text.len(), 4_298_239);
        assert!(String::from_utf8_lossy(&text[..200]).contains("In the beginning God created"));
        let data = split(&text, 128, Some(1.0)).unwrap();
        assert_eq!(data.train.features(), 129);
        assert_eq!(data.train.len(), (3_868_415 - 129) / 128 + 1);
        assert_eq!(data.test.len(), VALIDATION_SEQUENCES);
        // A sequence is the text's bytes.
        let first: Vec<u8> = data.train.values()[..129]
            .iter()
            .map(|&v| v as u8)
            .collect();
        assert_eq!(first, text[..129]);
        // The validation sequences lie in the held-out part, the last one at its end.
        let last: Vec<u8> = data
            .test
            .image(VALIDATION_SEQUENCES - 1)
            .iter()
            .map(|&v| v as u8)
            .collect();
        assert_eq!(last, text[text.len() - 129..]);
    }

    #[test]
    fn a_text_too_short_is_refused_and_a_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.txt");
        std::fs::write(&f, b"abc").unwrap();
        let err = split(&corpus(Some(&f)).unwrap(), 128, Some(1.0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 tokens") && err.contains("1291"), "{err}");
        let long: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&f, &long).unwrap();
        let data = split(&corpus(Some(&f)).unwrap(), 16, Some(1.0)).unwrap();
        assert_eq!(data.train.len(), (18_000 - 17) / 16 + 1);
        assert!(data.test.len() <= VALIDATION_SEQUENCES);
        let missing = corpus(Some(&dir.path().join("nope")))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("nope"), "{missing}");
    }
}
