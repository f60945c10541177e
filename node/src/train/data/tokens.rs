//! Token files in the format of llm.c and modded-nanogpt (the `.bin` shards of FineWeb and
//! TinyShakespeare that modern GPT-2-style runs train on): a header of 256 little-endian
//! i32 — [`MAGIC`] (20240520), [`VERSION`] (1), the token count n, the rest 0 — then n
//! little-endian u16 token ids (GPT-2's 50,257-token vocabulary fits in 16 bits).
//!
//! `murmur tokenize TEXT OUT.bin` writes such a file with GPT-2's byte-pair encoding
//! ([`write`]); `--model transformer:vocab=50257 --data OUT.bin` trains on it, a token file
//! being told from a byte-level text by its magic.
//!
//! A folder of token files is read too ([`read_dir`]): the training files and the
//! validation files told apart by their names (`train`/`val` in them, as nanoGPT's
//! `train.bin`/`val.bin`, llm.c's `tiny_shakespeare_train.bin`/`…_val.bin` and
//! modded-nanogpt's `fineweb_train_000001.bin`/`fineweb_val_000000.bin`), each either with
//! the header above or nanoGPT's header-less form (`prepare.py`: the u16 ids alone).

use super::DataError;

/// First i32 of the header.
pub const MAGIC: i32 = 20_240_520;
/// Second i32 of the header: the version with u16 tokens.
pub const VERSION: i32 = 1;
/// Bytes of the header: 256 × i32.
pub const HEADER_BYTES: usize = 256 * 4;

fn header_i32(bytes: &[u8], i: usize) -> i32 {
    i32::from_le_bytes([
        bytes[4 * i],
        bytes[4 * i + 1],
        bytes[4 * i + 2],
        bytes[4 * i + 3],
    ])
}

/// Whether `bytes` start with a token file's header (its magic).
pub fn is_token_file(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && header_i32(bytes, 0) == MAGIC
}

/// The token ids of a token file's contents; `name` is for the errors.
///
/// # Errors
/// [`DataError::BadRecord`] for a wrong magic or version, a header shorter than 1,024
/// bytes, or a length other than the header's count of tokens (truncated, or trailing
/// bytes).
pub fn parse(name: &str, bytes: &[u8]) -> Result<Vec<u16>, DataError> {
    let bad = |reason: String| DataError::BadRecord {
        file: name.to_owned(),
        reason,
    };
    if bytes.len() < HEADER_BYTES {
        return Err(bad(format!(
            "{} bytes is shorter than a token file's {HEADER_BYTES}-byte header",
            bytes.len()
        )));
    }
    let magic = header_i32(bytes, 0);
    if magic != MAGIC {
        return Err(bad(format!(
            "magic {magic}, expected {MAGIC} (a token file of llm.c / modded-nanogpt)"
        )));
    }
    let version = header_i32(bytes, 1);
    if version != VERSION {
        return Err(bad(format!(
            "version {version}; only version {VERSION} (u16 tokens) is read"
        )));
    }
    let count = header_i32(bytes, 2);
    let body = &bytes[HEADER_BYTES..];
    if count < 0 || body.len() != 2 * count as usize {
        return Err(bad(format!(
            "the header says {count} tokens ({} bytes after the header) but {} bytes follow it \
             ({})",
            2 * count.max(0) as usize,
            body.len(),
            if body.len() < 2 * count.max(0) as usize {
                "truncated"
            } else {
                "trailing bytes"
            }
        )));
    }
    Ok(body
        .chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
        .collect())
}

/// The token ids of `bytes`, a file named `name`: with the llm.c header ([`parse`]), or
/// without one as nanoGPT's `prepare.py` writes them (little-endian u16 ids alone).
///
/// # Errors
/// As [`parse`] for a file with the magic; [`DataError::BadRecord`] for a header-less file
/// of odd length.
pub fn parse_any(name: &str, bytes: &[u8]) -> Result<Vec<u16>, DataError> {
    if is_token_file(bytes) {
        return parse(name, bytes);
    }
    if !bytes.len().is_multiple_of(2) {
        return Err(DataError::BadRecord {
            file: name.to_owned(),
            reason: format!(
                "{} bytes: neither a token file with the llm.c header (magic {MAGIC}) nor \
                 nanoGPT's header-less u16 ids (an even length)",
                bytes.len()
            ),
        });
    }
    Ok(bytes
        .chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
        .collect())
}

/// The training and validation token ids of the folder `dir`: its `.bin` files whose names
/// contain `train`, concatenated in name order, and those whose names contain `val`
/// (see the [module docs](self)).
///
/// # Errors
/// [`DataError::Io`] if the folder or a file cannot be read; [`DataError::BadRecord`] for a
/// malformed file ([`parse_any`]) or a folder without both kinds of file.
pub fn read_dir(dir: &std::path::Path) -> Result<(Vec<u16>, Vec<u16>), DataError> {
    let io = |path: &std::path::Path, cause| DataError::Io {
        path: path.to_owned(),
        cause,
    };
    let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin") && p.is_file())
        .collect();
    names.sort();
    let (mut train, mut val) = (Vec::new(), Vec::new());
    let (mut n_train, mut n_val) = (0, 0);
    for path in &names {
        let stem = path
            .file_name()
            .map(|s| s.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let into = if stem.contains("train") {
            n_train += 1;
            &mut train
        } else if stem.contains("val") {
            n_val += 1;
            &mut val
        } else {
            continue;
        };
        let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
        into.extend(parse_any(&path.display().to_string(), &bytes)?);
    }
    if n_train == 0 || n_val == 0 {
        return Err(DataError::BadRecord {
            file: dir.display().to_string(),
            reason: format!(
                "a folder of token files needs training and validation .bin files (names with \
                 `train` and `val`, as nanoGPT's train.bin and val.bin); found {n_train} \
                 training and {n_val} validation files"
            ),
        });
    }
    Ok((train, val))
}

/// Refuses `ids` with one beyond a model of `vocab` tokens.
///
/// # Errors
/// [`DataError::BadRecord`] naming the first such id, its position and the `--model` that
/// takes the file.
pub fn check_vocab(name: &str, ids: &[u16], vocab: usize) -> Result<(), DataError> {
    let Some((i, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| usize::from(id) >= vocab)
    else {
        return Ok(());
    };
    let largest = ids.iter().copied().max().unwrap_or(id);
    Err(DataError::BadRecord {
        file: name.to_owned(),
        reason: format!(
            "token {i} is id {id}, beyond the model's vocabulary of {vocab}; the largest id is \
             {largest}: use --model transformer:vocab={} (GPT-2's tokens: vocab=50257)",
            usize::from(largest) + 1
        ),
    })
}

/// Tokens in GPT-2's vocabulary (r50k_base: 50,000 merges, 256 bytes, end-of-text).
pub const GPT2_VOCAB: usize = 50_257;
/// GPT-2's end-of-text token, which starts every document of a token file.
pub const END_OF_TEXT: u16 = 50_256;

/// `text` in GPT-2's byte-pair encoding (Radford et al. 2019; tiktoken's r50k_base, whose
/// ranks ship in the tiktoken-rs crate), special tokens not recognised in the text.
///
/// # Errors
/// The encoding's tables cannot be built (a defect of the crate).
pub fn gpt2_encode(text: &str) -> Result<Vec<u16>, DataError> {
    let bad = |reason: String| DataError::BadRecord {
        file: "GPT-2 encoding".into(),
        reason,
    };
    let bpe = tiktoken_rs::r50k_base_singleton();
    bpe.encode_ordinary(text)
        .into_iter()
        .map(|id| u16::try_from(id).map_err(|_| bad(format!("token id {id} beyond 16 bits"))))
        .collect()
}

/// GPT-2 tokens back to text (lossy UTF-8; ids beyond the vocabulary are dropped).
pub fn gpt2_decode(ids: &[u32]) -> String {
    let bpe = tiktoken_rs::r50k_base_singleton();
    let known: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|&id| (id as usize) < GPT2_VOCAB)
        .collect();
    String::from_utf8_lossy(&bpe.decode_bytes(&known).unwrap_or_default()).into_owned()
}

/// Mean bytes of text per predicted token of `rows` (sequences of GPT-2 token ids, each
/// row's first id only read, the others predicted): Σ bytes of the predicted tokens / their
/// count, each token's bytes those GPT-2's encoding decodes it to (0 for the end-of-text
/// token, which stands for no text). What turns a validation loss per token into bits per
/// byte, exactly for the validation set, whatever text the tokens came from. `None`
/// without a predicted token.
pub fn gpt2_bytes_per_token(rows: &super::Dataset) -> Option<f64> {
    let bpe = tiktoken_rs::r50k_base_singleton();
    let mut len = vec![None; GPT2_VOCAB];
    let cols = rows.features();
    let (mut bytes, mut count) = (0u64, 0u64);
    for r in 0..rows.len() {
        for &id in &rows.image(r)[1.min(cols)..] {
            let id = id as usize;
            let n = *len.get_mut(id)?.get_or_insert_with(|| {
                if id == usize::from(END_OF_TEXT) {
                    return 0;
                }
                bpe.decode_bytes(&[id as u32]).map_or(0, |b| b.len()) as u64
            });
            bytes += n;
            count += 1;
        }
    }
    (count > 0).then(|| bytes as f64 / count as f64)
}

/// A token file of `ids` (the inverse of [`parse`]).
pub fn write(ids: &[u16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + 2 * ids.len());
    let mut header = [0i32; 256];
    header[0] = MAGIC;
    header[1] = VERSION;
    // A count beyond i32 cannot be written in this format; tokenize refuses it first.
    header[2] = i32::try_from(ids.len()).unwrap_or(i32::MAX);
    for v in header {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for &id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_round_trip_and_bad_ones_get_one_line_each() {
        let ids: Vec<u16> = vec![50_256, 0, 15_496, 11, 995];
        let file = write(&ids);
        assert_eq!(file.len(), 1024 + 10);
        assert!(is_token_file(&file) && !is_token_file(b"In the beginning"));
        assert_eq!(parse("t.bin", &file).unwrap(), ids);
        let err = |bytes: &[u8]| parse("t.bin", bytes).unwrap_err().to_string();
        assert!(err(&file[..file.len() - 3]).contains("truncated"));
        let mut longer = file.clone();
        longer.push(0);
        assert!(err(&longer).contains("trailing bytes"));
        let mut wrong = file.clone();
        wrong[0] ^= 1;
        assert!(err(&wrong).contains("magic"));
        let mut v2 = file.clone();
        v2[4] = 2;
        assert!(err(&v2).contains("version 2"));
        assert!(err(&file[..100]).contains("header"));
        // A vocabulary too small for the file names the option that fits it.
        check_vocab("t.bin", &ids, 50_257).unwrap();
        let e = check_vocab("t.bin", &ids, 256).unwrap_err().to_string();
        assert!(
            e.contains("token 0 is id 50256") && e.contains("vocab=50257"),
            "{e}"
        );
    }

    #[test]
    fn gpt2_tokens_of_a_known_text_and_back() {
        // "Hello world" is [15496, 995] in GPT-2's encoding.
        assert_eq!(gpt2_encode("Hello world").unwrap(), [15496, 995]);
        assert_eq!(
            gpt2_decode(&[15496, 995, 50_256]),
            "Hello world<|endoftext|>"
        );
    }
}
