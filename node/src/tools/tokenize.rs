//! `murmur tokenize TEXT OUT.bin`: a text as GPT-2 tokens in a token file
//! ([`crate::train::data::tokens`]), the way modded-nanogpt prepares its shards: the
//! end-of-text token 50256, then the text's byte-pair encoding (r50k_base, GPT-2's 50,257
//! tokens; Radford et al. 2019), special tokens not recognised in the text.

use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::train::data::tokens;

/// `murmur tokenize`'s arguments.
#[derive(Debug, clap::Args)]
pub struct TokenizeArgs {
    /// The text (UTF-8; gzipped or not).
    pub text: PathBuf,
    /// The token file to write.
    pub out: PathBuf,
}

/// Tokenizes `args.text` into `args.out` and prints the counts.
///
/// # Errors
/// The text cannot be read or is not UTF-8 (the byte offset is named), has more tokens than
/// the format's i32 count holds, or the file cannot be written.
pub fn run(args: &TokenizeArgs) -> anyhow::Result<()> {
    let bytes = crate::train::data::text::corpus(Some(&args.text))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 at byte {} (GPT-2's encoding reads text)",
            args.text.display(),
            e.valid_up_to()
        )
    })?;
    let ids = encode(text)?;
    if ids.len() > i32::MAX as usize {
        bail!("{} tokens do not fit a token file's i32 count", ids.len());
    }
    std::fs::write(&args.out, tokens::write(&ids))
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!(
        "{}: {} bytes → {} GPT-2 tokens ({:.3} bytes per token) in {}",
        args.text.display(),
        bytes.len(),
        ids.len(),
        bytes.len() as f64 / ids.len().max(1) as f64,
        args.out.display()
    );
    Ok(())
}

/// The end-of-text token, then `text`'s GPT-2 tokens.
///
/// # Errors
/// The encoding's tables cannot be built (a defect of the crate).
pub fn encode(text: &str) -> anyhow::Result<Vec<u16>> {
    let mut ids = vec![tokens::END_OF_TEXT];
    ids.extend(tokens::gpt2_encode(text)?);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_starts_with_the_end_of_text_token() {
        assert_eq!(
            encode("Hello world").unwrap(),
            [tokens::END_OF_TEXT, 15496, 995]
        );
    }
}
