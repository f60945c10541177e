//! The key files a run names (`--allow-peers FILE`, `--run-key FILE`), read and checked as
//! run options are, before any peer starts; what they are for is in
//! [`crate::control::auth`], which uses them.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{anyhow, Context};
use libp2p::PeerId;

/// Reads an allow-list: one `PeerId` per line (as `murmur identity` prints them); blank
/// lines and lines starting with `#` are skipped.
///
/// # Errors
/// The file cannot be read, a line is not a `PeerId` (named with its line number), or it
/// lists nobody.
pub fn read_allow_list(path: &Path) -> anyhow::Result<HashSet<PeerId>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the allow-list {}", path.display()))?;
    let mut peers = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let peer: PeerId = line.parse().map_err(|e| {
            anyhow!(
                "{} line {}: {line:?} is not a PeerId: {e}",
                path.display(),
                i + 1
            )
        })?;
        peers.insert(peer);
    }
    if peers.is_empty() {
        anyhow::bail!("the allow-list {} lists no PeerId", path.display());
    }
    Ok(peers)
}

/// Shortest run key accepted, in bytes.
pub const RUN_KEY_MIN_BYTES: usize = 16;

/// The secret bytes of the run key in `path`, as they are (e.g. `head -c 32 /dev/urandom >
/// run.key`).
///
/// # Errors
/// The file cannot be read or holds fewer than [`RUN_KEY_MIN_BYTES`] bytes.
pub fn read_run_key(path: &Path) -> anyhow::Result<Vec<u8>> {
    let secret =
        std::fs::read(path).with_context(|| format!("reading the run key {}", path.display()))?;
    if secret.len() < RUN_KEY_MIN_BYTES {
        anyhow::bail!(
            "the run key {} has {} bytes; it needs at least {RUN_KEY_MIN_BYTES} (e.g. head -c 32 /dev/urandom > {})",
            path.display(),
            secret.len(),
            path.display()
        );
    }
    Ok(secret)
}
