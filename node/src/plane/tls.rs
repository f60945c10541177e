//! The data plane's TLS 1.3, bound to the peers' libp2p identities, and the admission of
//! identities to the run.
//!
//! The data plane's certificates carry each peer's libp2p identity
//! ([`crate::control::auth`]: its Ed25519 key pair), as in the libp2p TLS handshake (libp2p
//! specs, `tls/tls.md`: a self-signed certificate whose extension holds the host public key
//! and its signature over the certificate key; made and checked with `libp2p-tls`).
//! Authentication is mutual:
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
use std::sync::{Arc, RwLock};

use anyhow::anyhow;
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
    use super::*;

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
