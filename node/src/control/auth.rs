//! Peer identity and the run key.
//!
//! Every peer has one libp2p identity (an Ed25519 key pair; its `PeerId` is the hash of the
//! public key), kept in a key file so that a restarted peer comes back as the same peer.
//! The control plane (libp2p) runs on it, and the bootstrap's directory records each rank's
//! `PeerId` as libp2p authenticated it; the data plane's TLS certificates carry the same
//! identity ([`crate::plane::tls`]). A run may also have a shared run key ([`RunKey`]), whose
//! tags a peer must show to be let in.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use libp2p::identity::Keypair;
use libp2p::PeerId;
use murmur_gossip::Rank;

/// `<run>/identity/peer-<rank>.key`: where a peer keeps its key pair by default.
pub fn key_path(run_dir: &Path, rank: Rank) -> PathBuf {
    run_dir.join("identity").join(format!("peer-{rank}.key"))
}

/// Loads the key pair at `path`, or makes a new Ed25519 one and writes it there (libp2p's
/// protobuf encoding; the file is readable by its owner only on Unix).
///
/// # Errors
/// The file exists but is not a key pair, or cannot be read or written.
pub fn load_or_create_identity(path: &Path) -> anyhow::Result<Keypair> {
    match std::fs::read(path) {
        Ok(bytes) => Keypair::from_protobuf_encoding(&bytes)
            .map_err(|e| anyhow!("{} is not a libp2p key pair: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Keypair::generate_ed25519();
            save_identity(path, &key)?;
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes `key` to `path` atomically (temp file + rename; libp2p's protobuf encoding,
/// readable by its owner only on Unix), replacing any key there.
///
/// # Errors
/// The file cannot be written.
pub fn save_identity(path: &Path, key: &Keypair) -> anyhow::Result<()> {
    let bytes = key
        .to_protobuf_encoding()
        .map_err(|e| anyhow!("encoding the key pair: {e}"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("key.tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

pub use crate::config::keys::{read_allow_list, RUN_KEY_MIN_BYTES};

/// A run key (`--run-key FILE`): a secret every peer of the run holds. A joining peer
/// proves it to the bootstrap and the bootstrap proves it back, each with an HMAC-SHA256
/// tag over both libp2p identities (so a tag is good for one pair of identities and one
/// direction only, and the key itself never travels). It admits peers whose identities
/// are not known in advance (ranks given at join, `--mdns`), where an allow-list cannot be
/// written, and keeps a node that answers mDNS but lacks the key from handing out a
/// directory.
pub struct RunKey(ring::hmac::Key);

impl std::fmt::Debug for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunKey(..)")
    }
}

impl RunKey {
    /// The key in `path`: its bytes as they are (e.g. `head -c 32 /dev/urandom > run.key`).
    ///
    /// # Errors
    /// The file cannot be read or holds fewer than [`RUN_KEY_MIN_BYTES`] bytes.
    pub fn read(path: &Path) -> anyhow::Result<RunKey> {
        let secret = crate::config::keys::read_run_key(path)?;
        Ok(RunKey(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            &secret,
        )))
    }

    fn message(direction: &str, from: &PeerId, to: &PeerId) -> Vec<u8> {
        let mut m = format!("murmur run key v1 {direction}\n").into_bytes();
        m.extend_from_slice(&from.to_bytes());
        m.push(b'\n');
        m.extend_from_slice(&to.to_bytes());
        m
    }

    /// The tag peer `from` sends to peer `to` in `direction` (`join` or `answer`), as hex
    /// (64 characters).
    pub fn tag(&self, direction: &str, from: &PeerId, to: &PeerId) -> String {
        ring::hmac::sign(&self.0, &Self::message(direction, from, to))
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `tag` (hex) is the tag of `from` to `to` in `direction`; compared in
    /// constant time.
    pub fn verify(&self, tag: Option<&str>, direction: &str, from: &PeerId, to: &PeerId) -> bool {
        let Some(tag) = tag.filter(|t| t.len() == 64 && t.is_ascii()) else {
            return false;
        };
        let bytes: Option<Vec<u8>> = (0..32)
            .map(|i| u8::from_str_radix(&tag[2 * i..2 * i + 2], 16).ok())
            .collect();
        bytes.is_some_and(|b| {
            ring::hmac::verify(&self.0, &Self::message(direction, from, to), &b).is_ok()
        })
    }
}

/// The public key inside `id` (Ed25519 PeerIds inline it: identity multihash); `None` for a
/// PeerId that only hashes its key. Used to check what peer 0 signed (admissions, its DHT
/// record) against its PeerId alone.
pub fn public_key(id: &PeerId) -> Option<libp2p::identity::PublicKey> {
    let hash: &libp2p::multihash::Multihash<64> = id.as_ref();
    (hash.code() == 0)
        .then(|| libp2p::identity::PublicKey::try_decode_protobuf(hash.digest()).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_run_key_tag_is_good_for_one_key_one_pair_and_one_direction() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let key = super::RunKey::read(&write("a", &[7u8; 32])).unwrap();
        let other = super::RunKey::read(&write("b", &[8u8; 32])).unwrap();
        let err = super::RunKey::read(&write("c", &[7u8; 15])).unwrap_err();
        assert!(format!("{err:#}").contains("at least 16"), "{err:#}");
        let (a, b) = (libp2p::PeerId::random(), libp2p::PeerId::random());
        let tag = key.tag("join", &a, &b);
        assert_eq!(tag.len(), 64);
        assert!(key.verify(Some(&tag), "join", &a, &b));
        assert!(!other.verify(Some(&tag), "join", &a, &b), "another key");
        assert!(
            !key.verify(Some(&tag), "join", &b, &a),
            "the other way round"
        );
        assert!(
            !key.verify(Some(&tag), "answer", &a, &b),
            "the other direction"
        );
        assert!(!key.verify(None, "join", &a, &b));
        assert!(!key.verify(Some("zz"), "join", &a, &b));
        let mut forged = tag.clone().into_bytes();
        forged[0] = if forged[0] == b'0' { b'1' } else { b'0' };
        assert!(!key.verify(Some(std::str::from_utf8(&forged).unwrap()), "join", &a, &b));
        assert!(
            !key.verify(Some(&"é".repeat(32)), "join", &a, &b),
            "non-ASCII refused, no panic"
        );
    }

    use super::*;

    #[test]
    fn identities_persist_and_damaged_key_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_path(dir.path(), 2);
        let a = load_or_create_identity(&path).unwrap();
        let b = load_or_create_identity(&path).unwrap();
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
        std::fs::write(&path, b"not a key").unwrap();
        let err = load_or_create_identity(&path).unwrap_err().to_string();
        assert!(err.contains("is not a libp2p key pair"), "{err}");
    }

    #[test]
    fn allow_lists_are_read_with_comments_and_bad_lines_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allow.txt");
        let (a, b) = (
            Keypair::generate_ed25519().public().to_peer_id(),
            Keypair::generate_ed25519().public().to_peer_id(),
        );
        std::fs::write(&path, format!("# the run's peers\n{a}\n\n  {b}  \n")).unwrap();
        let list = read_allow_list(&path).unwrap();
        assert!(list.contains(&a) && list.contains(&b) && list.len() == 2);
        std::fs::write(&path, format!("{a}\nnot-a-peer\n")).unwrap();
        let err = format!("{:#}", read_allow_list(&path).unwrap_err());
        assert!(
            err.contains("line 2") && err.contains("not-a-peer"),
            "{err}"
        );
        std::fs::write(&path, "# nobody\n").unwrap();
        assert!(read_allow_list(&path).is_err());
    }
}
