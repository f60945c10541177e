//! `murmur netbench`: the data plane's throughput and one-way delay between two endpoints
//! on this machine (loopback QUIC, TLS 1.3 AES-GCM, mutual authentication with the peers'
//! identities, the peers' transport settings), with or without the link emulation of
//! `--link-bandwidth` / `--link-latency` — the measurement behind the emulation's documented
//! accuracy. With `--compare-bare` it also moves the same frames over a bare quinn
//! connection (quinn's default transport settings and crypto, a self-signed server
//! certificate, no client authentication, one unidirectional stream per frame) in the same
//! run, alternating the two, and reports both throughputs and their ratio.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use indicatif::ProgressBar;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::{LinkLatency, LinkRate};
use crate::control::auth::Admitted;
use crate::plane::{DataPlane, LinkEmulation, NetEvent};
use crate::report::progress;
use libp2p::identity::Keypair;

/// Idle timeout of the benchmark's connections (nothing is silent for long here).
const PEER_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of `murmur netbench`.
#[derive(Debug, Clone, Args)]
pub struct NetBenchArgs {
    /// Megabytes (10⁶ bytes) to move in the throughput test.
    #[arg(long, default_value_t = 100)]
    pub megabytes: usize,
    /// Bytes per frame (default: one MLP message, 4·203,530 + 36).
    #[arg(long, default_value_t = 814_156)]
    pub frame_bytes: usize,
    /// Emulated link rate, e.g. `1Gbit` (default: unlimited).
    #[arg(long)]
    pub link_bandwidth: Option<LinkRate>,
    /// Emulated one-way delay, e.g. `2ms` (default: none).
    #[arg(long)]
    pub link_latency: Option<LinkLatency>,
    /// Small frames sent one at a time to measure the one-way delay.
    #[arg(long, default_value_t = 20)]
    pub pings: usize,
    /// Also move the same frames over a bare quinn connection and report the ratio.
    #[arg(long)]
    pub compare_bare: bool,
    /// With `--compare-bare`: measurements of each transport, alternating; medians reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `murmur netbench` measured.
#[derive(Debug, Serialize)]
pub struct NetBenchReport {
    /// Frames moved in the throughput test.
    pub frames: usize,
    /// Bytes per frame (header included).
    pub frame_bytes: usize,
    /// Seconds from the first send to the last frame received (with `--compare-bare`: of
    /// the median measurement).
    pub seconds: f64,
    /// Measured throughput, bytes per second.
    pub bytes_per_second: f64,
    /// The emulated rate, bytes per second (none: unlimited).
    pub set_bytes_per_second: Option<f64>,
    /// Measured / set rate.
    pub rate_ratio: Option<f64>,
    /// Median one-way delay of a 64-byte frame, seconds (send to delivery, same clock).
    pub delay_seconds: f64,
    /// The emulated delay, seconds.
    pub set_delay_seconds: f64,
    /// `--compare-bare`: the same frames over a bare quinn connection, bytes per second
    /// (median of the repeats; `bytes_per_second` is then the median of ours).
    pub bare_bytes_per_second: Option<f64>,
    /// `bytes_per_second / bare_bytes_per_second`.
    pub ratio_to_bare: Option<f64>,
}

/// Runs the benchmark and prints its report.
pub fn run(args: &NetBenchArgs) -> anyhow::Result<()> {
    if args.frame_bytes < FRAME_HEADER_LEN || args.frame_bytes > 256 << 20 {
        bail!(
            "--frame-bytes must be between {FRAME_HEADER_LEN} and {} bytes",
            256 << 20
        );
    }
    if args.megabytes == 0 {
        bail!("--megabytes must be at least 1");
    }
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let emulation = LinkEmulation {
        rate_bytes_per_sec: args.link_bandwidth.map(|r| r.0),
        latency: args.link_latency.map(|l| l.0).unwrap_or_default(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Every measurement moves the same bytes: one, or with --compare-bare `repeat` of ours
    // and `repeat` of bare quinn.
    let runs = if args.compare_bare {
        2 * args.repeat
    } else {
        1
    };
    let frames = frame_count(args);
    let bar = progress::bytes_bar((runs * frames * args.frame_bytes) as u64, "netbench");
    let mut report = rt.block_on(measure(args, emulation, &bar))?;
    if args.compare_bare {
        let (mut ours, mut bare) = (vec![report.bytes_per_second], Vec::new());
        for i in 0..args.repeat {
            let bytes = (report.frames * report.frame_bytes) as f64;
            bare.push(
                bytes / rt.block_on(bare_quinn(report.frames, report.frame_bytes, bar.clone()))?,
            );
            if i + 1 < args.repeat {
                ours.push(
                    rt.block_on(measure(args, emulation, &bar))?
                        .bytes_per_second,
                );
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        report.bytes_per_second = median(&mut ours);
        report.seconds = (report.frames * report.frame_bytes) as f64 / report.bytes_per_second;
        let b = median(&mut bare);
        report.bare_bytes_per_second = Some(b);
        report.ratio_to_bare = Some(report.bytes_per_second / b);
    }
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let mb = |b: f64| b / 1e6;
        println!(
            "throughput: {} frames of {} bytes in {:.3} s = {:.1} MB/s ({:.3} Gbit/s){}",
            report.frames,
            report.frame_bytes,
            report.seconds,
            mb(report.bytes_per_second),
            report.bytes_per_second * 8.0 / 1e9,
            match (report.set_bytes_per_second, report.rate_ratio) {
                (Some(set), Some(r)) => format!("; set {:.1} MB/s, measured/set = {r:.3}", mb(set)),
                _ => String::new(),
            }
        );
        println!(
            "one-way delay of a 64-byte frame: {:.3} ms median (set {:.3} ms)",
            report.delay_seconds * 1e3,
            report.set_delay_seconds * 1e3
        );
        if let (Some(b), Some(r)) = (report.bare_bytes_per_second, report.ratio_to_bare) {
            println!(
                "bare quinn, same frames: {:.1} MB/s; murmur (authenticated) / bare = {r:.3} (medians of {})",
                mb(b),
                args.repeat
            );
        }
    }
    Ok(())
}

/// Seconds to move `frames` frames of `frame_bytes` bytes over a bare quinn connection on
/// loopback: quinn's defaults (transport settings, rustls with ring), a self-signed server
/// certificate trusted by the client, no client authentication, one unidirectional stream
/// per frame, timed from the first write until the receiver has read every frame; `bar`
/// counts the bytes read.
async fn bare_quinn(frames: usize, frame_bytes: usize, bar: ProgressBar) -> anyhow::Result<f64> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
    let server_config = quinn::ServerConfig::with_single_cert(vec![der.clone()], key.into())?;
    let server = quinn::Endpoint::server(server_config, "127.0.0.1:0".parse()?)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der)?;
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    client.set_default_client_config(quinn::ClientConfig::with_root_certificates(
        std::sync::Arc::new(roots),
    )?);
    let addr = server.local_addr()?;
    // The server accepts (and so completes the handshake) on its own task.
    let receive = tokio::spawn(async move {
        let conn = server
            .accept()
            .await
            .context("bare quinn: no connection")?
            .await?;
        for _ in 0..frames {
            let mut s = conn.accept_uni().await?;
            let data = s.read_to_end(frame_bytes).await?;
            if data.len() != frame_bytes {
                bail!("bare quinn: a frame of {} bytes arrived", data.len());
            }
            bar.inc(frame_bytes as u64);
        }
        conn.close(0u32.into(), b"done");
        anyhow::Ok(())
    });
    let conn = client.connect(addr, "localhost")?.await?;
    let payload = Bytes::from(vec![0xA5u8; frame_bytes]);
    let t = Instant::now();
    for _ in 0..frames {
        let mut s = conn.open_uni().await?;
        s.write_all(&payload).await?;
        s.finish()?;
    }
    receive.await??;
    let seconds = t.elapsed().as_secs_f64();
    conn.close(0u32.into(), b"done");
    Ok(seconds)
}

/// A frame of `len` bytes (header included) from peer 0.
fn frame(len: usize, round: u64) -> Bytes {
    let mut f = Vec::with_capacity(len);
    FrameHeader {
        kind: FrameKind::Gossip,
        sender: 0,
        round,
        dim: 0,
        payload_len: (len - FRAME_HEADER_LEN) as u32,
    }
    .emit(&mut f);
    f.resize(len, 0xA5);
    Bytes::from(f)
}

/// Waits for the next frame delivered to the receiver.
async fn next_frame(events: &mut mpsc::Receiver<NetEvent>) -> anyhow::Result<()> {
    loop {
        match tokio::time::timeout(Duration::from_secs(60), events.recv()).await {
            Err(_) => bail!("no frame arrived within 60 s"),
            Ok(None) => bail!("the receiving endpoint stopped"),
            Ok(Some(NetEvent::Frame { .. })) => return Ok(()),
            Ok(Some(NetEvent::Lost { reason, .. } | NetEvent::Refused { reason, .. })) => {
                bail!("{reason}")
            }
            Ok(Some(_)) => {}
        }
    }
}

/// Frames of `--frame-bytes` that carry `--megabytes`.
fn frame_count(args: &NetBenchArgs) -> usize {
    (args.megabytes * 1_000_000).div_ceil(args.frame_bytes)
}

/// One measurement of our data plane (delay, then throughput); `bar` counts the bytes
/// delivered.
async fn measure(
    args: &NetBenchArgs,
    emulation: LinkEmulation,
    bar: &ProgressBar,
) -> anyhow::Result<NetBenchReport> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let limit = u32::try_from(args.frame_bytes).unwrap_or(u32::MAX);
    let (sender_key, receiver_key) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let admitted = Admitted::default();
    admitted.admit_all([(sender_key.public().to_peer_id(), 0)]);
    let (mut sender, _sender_events) = DataPlane::bind(
        0,
        any,
        limit,
        PEER_TIMEOUT,
        &sender_key,
        Admitted::default(),
    )?;
    let (receiver, mut events) =
        DataPlane::bind(1, any, limit, PEER_TIMEOUT, &receiver_key, admitted)?;
    sender.emulation = emulation;
    let link = sender
        .connect(1, receiver.local_addr, receiver_key.public().to_peer_id())
        .await
        .context("connecting the two endpoints")?;

    // One-way delay: one small frame at a time.
    let mut delays = Vec::with_capacity(args.pings);
    for i in 0..args.pings.max(1) {
        let t = Instant::now();
        link.send(frame(64, i as u64)).await?;
        next_frame(&mut events).await?;
        delays.push(t.elapsed().as_secs_f64());
    }
    delays.sort_by(f64::total_cmp);
    let delay_seconds = delays[delays.len() / 2];

    // Throughput: the frames back to back, timed until the last one is delivered.
    let frames = frame_count(args);
    let payload = frame(args.frame_bytes, 0);
    let t = Instant::now();
    let send = async {
        for _ in 0..frames {
            link.send(payload.clone()).await?;
        }
        anyhow::Ok(())
    };
    let receive = async {
        for _ in 0..frames {
            next_frame(&mut events).await?;
            bar.inc(args.frame_bytes as u64);
        }
        anyhow::Ok(())
    };
    let (s, r) = tokio::join!(send, receive);
    s?;
    r?;
    let seconds = t.elapsed().as_secs_f64();
    let bytes_per_second = (frames * args.frame_bytes) as f64 / seconds;
    drop(link);
    Ok(NetBenchReport {
        frames,
        frame_bytes: args.frame_bytes,
        seconds,
        bytes_per_second,
        set_bytes_per_second: emulation.rate_bytes_per_sec,
        rate_ratio: emulation.rate_bytes_per_sec.map(|r| bytes_per_second / r),
        delay_seconds,
        set_delay_seconds: emulation.latency.as_secs_f64(),
        bare_bytes_per_second: None,
        ratio_to_bare: None,
    })
}
