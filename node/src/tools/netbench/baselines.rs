//! The baselines of `murmur netbench --baselines`: the same frames moved without murmur's
//! data plane, on plain threads (no tokio), so that its throughput has something to be
//! judged against.
//!
//! - [`tcp`]: raw TCP on loopback (`TCP_NODELAY`), a sending and a receiving thread;
//! - [`tls`]: TLS 1.3 over loopback TCP with rustls and ring, restricted to
//!   `TLS13_AES_128_GCM_SHA256` (the suite murmur's QUIC puts first), a self-signed
//!   certificate, `rustls::StreamOwned` on each side;
//! - [`memcpy`]: each frame copied into one reused buffer in one thread, the bandwidth a
//!   shared-memory transport would be judged against.
//!
//! The frames go back to back on one stream, framed as murmur frames them: the receiver
//! reads the 24-byte header, checks it and reads the payload into one buffer it reuses for
//! every frame — as a PyTorch user's `recv` into a preallocated tensor does, and iperf3.
//! These are the anchors murmur is judged against, so they are moved the way the tools a
//! user would pick instead move them (writes of 2 MiB, [`crate::plane::tcp::WRITE_CHUNK`],
//! as iperf3 writes 1 MiB and gloo's non-blocking writes return when the send buffer is
//! full; one thread per side; no allocation per message); `experiments/wire/` measures PyTorch gloo and iperf3 themselves. Every delivered frame is handed to a callback (the
//! benchmark counts its bytes; the tests compare them); the receivers themselves do not
//! look at the payload. Each function returns the seconds from the first byte written (the
//! TLS handshake done) until the receiver has handed over the last frame.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use rustls::pki_types::{PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection, StreamOwned};

/// How long a baseline's socket may block on one read or write before the measurement
/// fails (nothing is silent for long on loopback).
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// The one TLS 1.3 cipher suite of the TLS baseline.
const SUITE: rustls::CipherSuite = rustls::CipherSuite::TLS13_AES_128_GCM_SHA256;

/// A frame of `len` bytes (header included): murmur's 24-byte header, then pseudo-random
/// bytes (a fixed xorshift sequence), so that a byte out of place shows when compared.
/// `Err` if `len` is shorter than the header or its payload is over `u32::MAX` bytes.
pub fn frame(len: usize) -> anyhow::Result<Vec<u8>> {
    let payload_len = len
        .checked_sub(FRAME_HEADER_LEN)
        .and_then(|n| u32::try_from(n).ok())
        .with_context(|| {
            format!(
                "a frame of {len} bytes: needs {FRAME_HEADER_LEN} to {} bytes",
                FRAME_HEADER_LEN as u64 + u32::MAX as u64
            )
        })?;
    let mut f = Vec::with_capacity(len);
    FrameHeader {
        kind: FrameKind::Gossip,
        sender: 0,
        round: 0,
        dim: 0,
        payload_len,
    }
    .emit(&mut f);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = (len - f.len()).min(8);
        f.extend_from_slice(&x.to_le_bytes()[..n]);
    }
    Ok(f)
}

/// Seconds to move `frames` copies of `frame` (a frame of [`frame`]'s form, `frame.len()`
/// bytes) over raw TCP on loopback between two threads; `on_frame` gets each frame the
/// receiver read, in order.
pub fn tcp<F>(frame: &[u8], frames: usize, on_frame: F) -> anyhow::Result<f64>
where
    F: FnMut(&[u8]) -> anyhow::Result<()> + Send,
{
    over_loopback(frame, frames, on_frame, Ok, Ok).context("the TCP baseline")
}

/// Seconds to move `frames` copies of `frame` over TLS 1.3 (AES-128-GCM only) on loopback
/// TCP between two threads, timed after the handshake; `on_frame` gets each frame the
/// receiver decrypted, in order.
pub fn tls<F>(frame: &[u8], frames: usize, on_frame: F) -> anyhow::Result<f64>
where
    F: FnMut(&[u8]) -> anyhow::Result<()> + Send,
{
    let (server_config, client_config) = tls_configs()?;
    let accept = move |tcp: TcpStream| {
        let conn = ServerConnection::new(server_config).context("a TLS server connection")?;
        let mut s = StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn
                .complete_io(&mut s.sock)
                .context("TLS handshake (server)")?;
        }
        anyhow::Ok(s)
    };
    let connect = move |tcp: TcpStream| {
        let name = ServerName::try_from("localhost")?;
        let conn = ClientConnection::new(client_config, name).context("a TLS client connection")?;
        let mut s = StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn
                .complete_io(&mut s.sock)
                .context("TLS handshake (client)")?;
        }
        let suite = s.conn.negotiated_cipher_suite().map(|c| c.suite());
        if suite != Some(SUITE) {
            bail!("TLS negotiated {suite:?}, not {SUITE:?}");
        }
        anyhow::Ok(s)
    };
    over_loopback(frame, frames, on_frame, accept, connect).context("the TLS-over-TCP baseline")
}

/// Seconds to copy `frame` `frames` times into one buffer of its size (allocated and
/// mapped before the clock starts), in this thread; `on_frame` gets each copy.
pub fn memcpy<F>(frame: &[u8], frames: usize, mut on_frame: F) -> anyhow::Result<f64>
where
    F: FnMut(&[u8]) -> anyhow::Result<()>,
{
    let mut copy = frame.to_vec();
    let t = Instant::now();
    for _ in 0..frames {
        // black_box: the copy is made, whatever the callback does with it.
        copy.copy_from_slice(std::hint::black_box(frame));
        on_frame(std::hint::black_box(&copy)).context("the memcpy baseline")?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The TLS baseline's configurations: ring restricted to [`SUITE`] and TLS 1.3, a
/// self-signed certificate for `localhost` that the client trusts, no client
/// authentication, no session tickets.
fn tls_configs() -> anyhow::Result<(Arc<ServerConfig>, Arc<ClientConfig>)> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|s| s.suite() == SUITE);
    let provider = Arc::new(provider);
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .context("making a self-signed certificate")?;
    let der = cert.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("the TLS server configuration")?
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key.into())
        .context("the TLS server certificate")?;
    server.send_tls13_tickets = 0;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).context("trusting the TLS certificate")?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("the TLS client configuration")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((Arc::new(server), Arc::new(client)))
}

/// Moves `frames` copies of `frame` from a connecting to an accepting loopback TCP socket,
/// wrapped by `connect` and `accept` (both set up before the clock starts); the receiving
/// side runs on a thread of its own. Returns the seconds from the first write until the
/// receiver has handed over the last frame.
fn over_loopback<F, R, W>(
    frame: &[u8],
    frames: usize,
    on_frame: F,
    accept: impl FnOnce(TcpStream) -> anyhow::Result<R> + Send,
    connect: impl FnOnce(TcpStream) -> anyhow::Result<W>,
) -> anyhow::Result<f64>
where
    F: FnMut(&[u8]) -> anyhow::Result<()> + Send,
    R: Read,
    W: Write,
{
    let max_payload_bytes = frame
        .len()
        .checked_sub(FRAME_HEADER_LEN)
        .and_then(|n| u32::try_from(n).ok())
        .with_context(|| format!("a frame of {} bytes", frame.len()))?;
    // Both ends exist before either thread starts: a side that fails drops its socket,
    // which ends the other side's blocking call instead of leaving it waiting.
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("binding a loopback port")?;
    let client = TcpStream::connect(listener.local_addr()?).context("connecting on loopback")?;
    let (server, _) = listener.accept().context("accepting on loopback")?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
    }
    // The receive buffer is mapped before the clock starts (written once: an untouched
    // allocation would be mapped page by page inside the measurement).
    let mut buf = Vec::with_capacity(frame.len());
    buf.resize(frame.len(), 0u8);
    std::thread::scope(|scope| {
        let receiver = scope.spawn(move || {
            let mut r = accept(server)?;
            receive(&mut r, buf, frames, max_payload_bytes, on_frame)
        });
        // The writer lives until the receiver is done (closing it early could cut what is
        // still in flight short); on an error it is dropped here at once.
        let sent = (|| {
            let mut w = connect(client)?;
            let t = Instant::now();
            for i in 0..frames {
                // As iperf3 and gloo write: a part at a time (murmur's TCP link too).
                for part in frame.chunks(crate::plane::tcp::WRITE_CHUNK) {
                    w.write_all(part)
                        .with_context(|| format!("writing frame {i}"))?;
                }
            }
            w.flush().context("flushing the last frame")?;
            anyhow::Ok((t, w))
        })();
        let received = receiver
            .join()
            .map_err(|_| anyhow!("the receiving thread panicked"));
        let end = Instant::now();
        // The receiver's error first: the sender's is then mostly "broken pipe".
        received??;
        let (t, _w) = sent?;
        Ok(end.duration_since(t).as_secs_f64())
    })
}

/// Reads `frames` frames from `r` (header, then the payload, into `buf`, reused for every
/// frame) and hands each to `on_frame`.
fn receive<F>(
    r: &mut impl Read,
    mut buf: Vec<u8>,
    frames: usize,
    max_payload_bytes: u32,
    mut on_frame: F,
) -> anyhow::Result<()>
where
    F: FnMut(&[u8]) -> anyhow::Result<()>,
{
    for i in 0..frames {
        let mut head = [0u8; FRAME_HEADER_LEN];
        r.read_exact(&mut head)
            .with_context(|| format!("reading the header of frame {i}"))?;
        let header = FrameHeader::parse_prefix(&head, max_payload_bytes)
            .with_context(|| format!("the header of frame {i}"))?;
        buf.resize(FRAME_HEADER_LEN + header.payload_len as usize, 0);
        buf[..FRAME_HEADER_LEN].copy_from_slice(&head);
        r.read_exact(&mut buf[FRAME_HEADER_LEN..])
            .with_context(|| format!("reading the payload of frame {i}"))?;
        on_frame(&buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 frames of 100 kB (2 MB).
    const FRAMES: usize = 20;
    const FRAME_BYTES: usize = 100_000;

    /// Runs one baseline with a callback that compares every delivered frame with the one
    /// sent; returns the measured rate, bytes per second.
    fn checked(
        name: &str,
        baseline: impl FnOnce(
            &[u8],
            &mut (dyn FnMut(&[u8]) -> anyhow::Result<()> + Send),
        ) -> anyhow::Result<f64>,
    ) -> f64 {
        let sent = frame(FRAME_BYTES).unwrap();
        let mut delivered = 0usize;
        let mut compare = |got: &[u8]| {
            anyhow::ensure!(
                got == sent.as_slice(),
                "{name}: frame {delivered} differs from the one sent"
            );
            delivered += 1;
            Ok(())
        };
        let seconds = baseline(&sent, &mut compare).unwrap();
        assert_eq!(delivered, FRAMES, "{name}: frames delivered");
        let rate = (FRAMES * FRAME_BYTES) as f64 / seconds;
        assert!(
            rate.is_finite() && rate > 0.0,
            "{name}: {rate} bytes per second"
        );
        rate
    }

    #[test]
    fn every_baseline_delivers_every_frame_byte_exact_at_a_finite_rate() {
        checked("tcp", |f, cb| tcp(f, FRAMES, cb));
        checked("tls", |f, cb| tls(f, FRAMES, cb));
        checked("memcpy", |f, cb| memcpy(f, FRAMES, cb));
    }

    #[test]
    fn the_test_frame_is_a_murmur_frame_whose_payload_varies() {
        let f = frame(FRAME_BYTES).unwrap();
        assert_eq!(f.len(), FRAME_BYTES);
        let h = FrameHeader::parse_prefix(&f, u32::MAX).unwrap();
        assert_eq!(h.payload_len as usize, FRAME_BYTES - FRAME_HEADER_LEN);
        let payload = &f[FRAME_HEADER_LEN..];
        let distinct = payload
            .iter()
            .fold([false; 256], |mut seen, &b| {
                seen[b as usize] = true;
                seen
            })
            .iter()
            .filter(|&&s| s)
            .count();
        assert_eq!(distinct, 256, "every byte value occurs in 100 kB");
        assert!(frame(FRAME_HEADER_LEN - 1).is_err());
    }

    #[test]
    fn a_receiver_that_fails_fails_the_measurement_without_hanging() {
        let f = frame(FRAME_BYTES).unwrap();
        for (name, result) in [
            ("tcp", tcp(&f, 50, |_| bail!("refused"))),
            ("tls", tls(&f, 50, |_| bail!("refused"))),
        ] {
            let e = result.expect_err(name);
            assert!(format!("{e:#}").contains("refused"), "{name}: {e:#}");
        }
        // A frame whose header announces more than the frame holds: the header is refused.
        let short = &f[..FRAME_BYTES / 2];
        let e = tcp(short, 1, |_| Ok(())).expect_err("a truncated frame");
        assert!(format!("{e:#}").contains("header"), "{e:#}");
    }
}
