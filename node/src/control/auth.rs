//! Peer identity and the authentication of the data plane.
//!
//! Every peer has one libp2p identity (an Ed25519 key pair; its `PeerId` is the hash of the
//! public key), kept in a key file so that a restarted peer comes back as the same peer.
//! The control plane (libp2p) runs on it, and the bootstrap's directory records each rank's
//! `PeerId` as libp2p authenticated it. The data plane's TLS 1.3 certificates carry the
//! same identity, as in the libp2p TLS handshake (libp2p specs, `tls/tls.md`: a self-signed
//! certificate whose extension holds the host public key and its signature over the
//! certificate key; made and checked with `libp2p-tls`). Authentication is mutual:
//!
//! - a client checks that the server's certificate carries the `PeerId` the directory
//!   lists for the rank it dials;
//! - a server requires a client certificate and accepts it only if its `PeerId` is
//!   admitted to the run (in the directory: [`Admitted`]); the connection is then bound to
//!   that peer's rank, and a frame that claims another sender is refused.
//!
//! Cipher suites: AES-128-GCM first (hardware support here; it measured faster than
//! ChaCha20-Poly1305, which `libp2p-tls`'s own configurations prefer).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::{anyhow, Context};
use libp2p::identity::Keypair;
use libp2p::tls::certificate;
use libp2p::PeerId;
use murmur_gossip::Rank;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// The peers admitted to the run, by `PeerId`, with their ranks: filled from the directory
/// once discovery is done ([`Admitted::admit_all`]). Shared by the data plane's accept
/// path, which waits for it: a peer that got the directory first may dial one that is still
/// reading it.
#[derive(Debug, Clone)]
pub struct Admitted(Arc<AdmittedInner>);

#[derive(Debug)]
struct AdmittedInner {
    ranks: RwLock<HashMap<PeerId, Rank>>,
    ready: tokio::sync::watch::Sender<bool>,
    /// Whether ranks are still empty (an elastic run), so that a peer not admitted yet
    /// may be admitted later.
    open: std::sync::atomic::AtomicBool,
}

impl Default for Admitted {
    fn default() -> Self {
        Admitted(Arc::new(AdmittedInner {
            ranks: RwLock::new(HashMap::new()),
            ready: tokio::sync::watch::channel(false).0,
            open: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

impl Admitted {
    /// Admits each `(peer, rank)` (replacing what a peer was) and marks the set known.
    pub fn admit_all(&self, peers: impl IntoIterator<Item = (PeerId, Rank)>) {
        self.0
            .ranks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(peers);
        self.0.ready.send_replace(true);
    }

    /// Marks whether some ranks are still empty (an elastic run): then a connection from an
    /// identity not admitted yet waits [`LATE_ADMISSION_WAIT`] for its admission instead of
    /// being refused at once.
    pub fn set_open(&self, open: bool) {
        self.0
            .open
            .store(open, std::sync::atomic::Ordering::Relaxed);
    }

    /// The rank of `peer`, if it is admitted (`None` also while the set is not known).
    pub fn rank(&self, peer: &PeerId) -> Option<Rank> {
        self.0
            .ranks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(peer)
            .copied()
    }

    /// [`Admitted::rank`] once the set is known, waiting for it at most `wait`. While some
    /// ranks are empty ([`Admitted::set_open`]), a peer not in the set then is waited for
    /// [`LATE_ADMISSION_WAIT`] more (within `wait`): a new peer of an elastic run may dial
    /// before peer 0's notice admitting it arrives.
    pub async fn rank_when_known(&self, peer: &PeerId, wait: std::time::Duration) -> Option<Rank> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut ready = self.0.ready.subscribe();
        tokio::time::timeout_at(deadline, ready.wait_for(|known| *known))
            .await
            .ok()?
            .ok()?;
        let late = deadline.min(tokio::time::Instant::now() + LATE_ADMISSION_WAIT);
        loop {
            if let Some(rank) = self.rank(peer) {
                return Some(rank);
            }
            if !self.0.open.load(std::sync::atomic::Ordering::Relaxed) {
                return None;
            }
            tokio::time::timeout_at(late, ready.changed())
                .await
                .ok()?
                .ok()?;
        }
    }
}

/// How long a connection from an identity that is not (yet) admitted waits for its
/// admission once the directory is known, before it is refused.
pub const LATE_ADMISSION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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

/// A certificate carrying `key`'s identity and the certificate's own private key.
fn identity_certificate(
    key: &Keypair,
) -> anyhow::Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
    certificate::generate(key).map_err(|e| anyhow!("making the identity certificate: {e}"))
}

/// Always presents the same identity certificate. (rustls's `with_single_cert` would check
/// the certificate with webpki, which refuses the libp2p extension: it is marked critical.)
#[derive(Debug)]
struct FixedCert(Arc<CertifiedKey>);

impl FixedCert {
    fn new(key: &Keypair, provider: &rustls::crypto::CryptoProvider) -> anyhow::Result<Self> {
        let (cert, private) = identity_certificate(key)?;
        let signing = provider.key_provider.load_private_key(private)?;
        Ok(FixedCert(Arc::new(CertifiedKey::new(vec![cert], signing))))
    }
}

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl ResolvesClientCert for FixedCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _schemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The TLS configuration of a data-plane server: our identity certificate, and a valid
/// identity certificate required of every client (whether its `PeerId` is admitted is
/// checked once the handshake is done, [`Admitted::rank_when_known`]).
pub fn server_config(
    key: &Keypair,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> anyhow::Result<rustls::ServerConfig> {
    let cert = Arc::new(FixedCert::new(key, &provider)?);
    Ok(rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(IdentityVerifier { expected: None }))
        .with_cert_resolver(cert))
}

/// The TLS configuration of a data-plane client dialling the peer `remote`: our identity
/// certificate as the client certificate, the server's accepted only if it carries `remote`.
pub fn client_config(
    key: &Keypair,
    remote: PeerId,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> anyhow::Result<rustls::ClientConfig> {
    let cert = Arc::new(FixedCert::new(key, &provider)?);
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(IdentityVerifier {
            expected: Some(remote),
        }))
        .with_client_cert_resolver(cert))
}

/// The `PeerId` in a peer's identity certificate.
///
/// # Errors
/// Not exactly one certificate, or one without a valid libp2p extension.
pub fn peer_id_of(certs: &[CertificateDer<'_>]) -> Result<PeerId, rustls::Error> {
    match certs {
        [cert] => Ok(certificate::parse(cert)?.peer_id()),
        _ => Err(rustls::Error::General(format!(
            "expected one identity certificate, got {}",
            certs.len()
        ))),
    }
}

/// Checks identity certificates: the libp2p extension and its signature, and on the client
/// side that the `PeerId` is the one dialled.
#[derive(Debug)]
struct IdentityVerifier {
    expected: Option<PeerId>,
}

impl IdentityVerifier {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        if !intermediates.is_empty() {
            return Err(rustls::Error::General(
                "an identity certificate comes alone, without a chain".into(),
            ));
        }
        let peer = peer_id_of(std::slice::from_ref(end_entity))?;
        if let Some(expected) = self.expected.filter(|e| *e != peer) {
            return Err(rustls::Error::General(format!(
                "the server is {peer}, not the peer {expected} that was dialled"
            )));
        }
        Ok(())
    }

    fn signature(
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        certificate::parse(cert)?.verify_signature(dss.scheme, message, dss.signature())?;
        Ok(HandshakeSignatureValid::assertion())
    }

    /// QUIC runs TLS 1.3 only; a TLS 1.2 signature is never checked.
    fn tls12_refused() -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls13RequiredForQuic,
        ))
    }

    /// The schemes identity certificates are signed with (libp2p-tls makes ECDSA P-256 ones).
    fn schemes() -> Vec<SignatureScheme> {
        vec![
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::ECDSA_NISTP384_SHA384,
            SignatureScheme::ED25519,
        ]
    }
}

impl ServerCertVerifier for IdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Self::tls12_refused()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Self::signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::schemes()
    }
}

impl ClientCertVerifier for IdentityVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Self::tls12_refused()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Self::signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::schemes()
    }
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

    #[test]
    fn identity_certificates_carry_the_peer_id() {
        let key = Keypair::generate_ed25519();
        let (cert, _) = identity_certificate(&key).unwrap();
        assert_eq!(
            peer_id_of(std::slice::from_ref(&cert)).unwrap(),
            key.public().to_peer_id()
        );
        assert!(peer_id_of(&[]).is_err());
        assert!(peer_id_of(&[cert.clone(), cert]).is_err());
        // A certificate without the libp2p extension carries no identity.
        let plain = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        assert!(peer_id_of(&[plain.cert.der().clone()]).is_err());
    }
}
