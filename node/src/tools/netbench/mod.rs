//! `murmur netbench`: the data plane's throughput and one-way delay between two endpoints
//! on this machine (loopback QUIC, TLS 1.3 AES-GCM, mutual authentication with the peers'
//! identities, the peers' transport settings), with or without the link emulation of
//! `--link-bandwidth` / `--link-latency` — the measurement behind the emulation's documented
//! accuracy. With `--compare-bare` it also moves the same frames over a bare quinn
//! connection (quinn's default transport settings and crypto, a self-signed server
//! certificate, no client authentication, one unidirectional stream per frame); with
//! `--baselines` over raw TCP, over TLS 1.3 on TCP and through memcpy ([`baselines`]). The
//! transports are measured in the same run, alternating, `--repeat` times each; the report
//! gives each one's median and murmur's ratio to it.

pub mod baselines;

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
use crate::plane::striping::TcpStreams;
use crate::plane::tls::Admitted;
use crate::plane::{DataPlane, LinkEmulation, LinkKind, NetEvent, TransportChoice, Wire};
use crate::report::progress;
use libp2p::identity::Keypair;

/// Idle timeout of the benchmark's connections (nothing is silent for long here).
const PEER_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of `murmur netbench`.
#[derive(Debug, Clone, Args)]
pub struct NetBenchArgs {
    /// Which of murmur's links to measure (with `--baselines`, the others too): `quic`,
    /// `tcp` (TLS 1.3 inside), `tcp-plaintext` (`--wire plaintext` on both ends) or
    /// `shared-memory`.
    #[arg(long, value_enum, default_value_t = MurmurLink::Quic)]
    pub link: MurmurLink,
    /// TCP connections of murmur's TCP links (1 to 16, or auto; `murmur peer
    /// --tcp-streams`): frames of 1 MiB or more are cut across them.
    #[arg(long, default_value = "1")]
    pub tcp_streams: TcpStreams,
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
    /// Also move the same frames over raw TCP, over TLS 1.3 on TCP (rustls, AES-128-GCM) and
    /// through memcpy, two threads each (memcpy: one), and print a table of rates and
    /// ratios; not with the emulation flags.
    #[arg(long)]
    pub baselines: bool,
    /// With `--compare-bare` or `--baselines`: measurements of each transport, alternating;
    /// medians reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One of murmur's links (`murmur netbench --link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MurmurLink {
    /// QUIC (`--transport quic`).
    Quic,
    /// TCP, TLS 1.3 inside (`--transport tcp`).
    Tcp,
    /// TCP in clear (`--transport tcp --wire plaintext`).
    TcpPlaintext,
    /// The shared-memory ring (`--transport auto`, same host).
    SharedMemory,
}

impl MurmurLink {
    /// Its row in the report.
    fn transport(self) -> Transport {
        match self {
            MurmurLink::Quic => Transport::Murmur,
            MurmurLink::Tcp => Transport::MurmurTcp,
            MurmurLink::TcpPlaintext => Transport::MurmurTcpPlain,
            MurmurLink::SharedMemory => Transport::Shm,
        }
    }
}

/// A way of moving the benchmark's frames whose throughput `murmur netbench` measures.
/// Each measurement moves the same frames (same count, same size); a new transport is one
/// more variant, with its name and its measurement in `Bench::measure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// murmur's data plane on QUIC (`--transport quic`): authenticated, one stream per
    /// frame, the emulation flags applied.
    Murmur,
    /// murmur's data plane between two endpoints of this host: the shared-memory ring
    /// (`--baselines`).
    #[serde(rename = "murmur_shm")]
    Shm,
    /// murmur's data plane over TCP with TLS 1.3 inside (`--transport tcp`, `--baselines`).
    #[serde(rename = "murmur_tcp")]
    MurmurTcp,
    /// murmur's data plane over TCP in clear (`--transport tcp --wire plaintext`,
    /// `--baselines`).
    #[serde(rename = "murmur_tcp_plaintext")]
    MurmurTcpPlain,
    /// A bare quinn connection (`--compare-bare`).
    #[serde(rename = "bare_quinn")]
    Bare,
    /// TLS 1.3 with AES-128-GCM over loopback TCP, rustls, two threads (`--baselines`).
    #[serde(rename = "tls_tcp")]
    Tls,
    /// Raw TCP on loopback, two threads (`--baselines`).
    Tcp,
    /// Each frame copied into one reused buffer in one thread (`--baselines`).
    Memcpy,
}

impl Transport {
    /// The transport's name in the text report.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Murmur => "murmur QUIC (authenticated)",
            Transport::Shm => "murmur shared memory",
            Transport::MurmurTcp => "murmur TCP (TLS, authenticated)",
            Transport::MurmurTcpPlain => "murmur TCP (plaintext, authenticated)",
            Transport::Bare => "bare quinn",
            Transport::Tls => "TLS 1.3 over TCP (AES-128-GCM)",
            Transport::Tcp => "TCP",
            Transport::Memcpy => "memcpy",
        }
    }

    /// The transports `args` asks for, in the order of each round: the measured murmur link
    /// (`--link`) first, then with `--baselines` murmur's other links.
    fn selected(args: &NetBenchArgs) -> Vec<Transport> {
        let main = args.link.transport();
        let mut t = vec![main];
        if args.baselines {
            t.extend(
                [
                    Transport::Murmur,
                    Transport::MurmurTcp,
                    Transport::MurmurTcpPlain,
                    Transport::Shm,
                ]
                .into_iter()
                .filter(|&o| o != main),
            );
        }
        if args.compare_bare {
            t.push(Transport::Bare);
        }
        if args.baselines {
            t.extend([Transport::Tls, Transport::Tcp, Transport::Memcpy]);
        }
        t
    }
}

/// One transport's median throughput and CPU cost.
#[derive(Debug, Clone, Serialize)]
pub struct TransportRate {
    /// Which transport (`murmur`, `murmur_shm`, `murmur_tcp`, `murmur_tcp_plaintext`,
    /// `bare_quinn`, `tls_tcp`, `tcp`, `memcpy`).
    pub transport: Transport,
    /// Median throughput of its measurements, bytes per second.
    pub bytes_per_second: f64,
    /// Median CPU time (user + system, of this process: both ends and every thread) per
    /// 10⁹ bytes moved, seconds; the measurement's setup (keys, handshakes, the pings)
    /// included, and the warm-up frames of murmur's links counted with the bytes moved.
    pub cpu_seconds_per_gb: f64,
    /// murmur's (QUIC) median throughput / this one's (1 for murmur itself).
    pub murmur_over_this: f64,
    /// With `--baselines`: murmur's shared-memory median throughput / this one's.
    pub shm_over_this: Option<f64>,
}

/// What `murmur netbench` measured.
#[derive(Debug, Serialize)]
pub struct NetBenchReport {
    /// Frames moved in the throughput test.
    pub frames: usize,
    /// Bytes per frame (header included).
    pub frame_bytes: usize,
    /// Seconds from the first send to the last frame received (with `--compare-bare` or
    /// `--baselines`: of the median measurement).
    pub seconds: f64,
    /// Measured throughput, bytes per second.
    pub bytes_per_second: f64,
    /// The emulated rate, bytes per second (none: unlimited).
    pub set_bytes_per_second: Option<f64>,
    /// Measured / set rate.
    pub rate_ratio: Option<f64>,
    /// Median one-way delay of a 64-byte frame, seconds (send to delivery, same clock; of
    /// the first measurement).
    pub delay_seconds: f64,
    /// The emulated delay, seconds.
    pub set_delay_seconds: f64,
    /// With `--baselines`: median one-way delay of a 64-byte frame through shared memory,
    /// seconds (of the first measurement).
    pub shm_delay_seconds: Option<f64>,
    /// `--compare-bare`: the same frames over a bare quinn connection, bytes per second
    /// (median of the repeats; `bytes_per_second` is then the median of ours).
    pub bare_bytes_per_second: Option<f64>,
    /// `bytes_per_second / bare_bytes_per_second`.
    pub ratio_to_bare: Option<f64>,
    /// Every transport measured (murmur first; then bare quinn with `--compare-bare`; TLS
    /// over TCP, TCP and memcpy with `--baselines`): median throughputs and murmur's ratio
    /// to each.
    pub transports: Vec<TransportRate>,
    /// Measurements of each transport (the medians are over these).
    pub measurements: usize,
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
    if args.baselines && (args.link_bandwidth.is_some() || args.link_latency.is_some()) {
        bail!(
            "--baselines measures unemulated loopback transports: leave out --link-bandwidth \
             and --link-latency (murmur alone is measured with them)"
        );
    }
    let emulation = LinkEmulation {
        rate_bytes_per_sec: args.link_bandwidth.map(|r| r.0),
        latency: args.link_latency.map(|l| l.0).unwrap_or_default(),
    };
    let transports = Transport::selected(args);
    // Every measurement moves the same bytes: one of ours, or with other transports
    // `repeat` rounds of each.
    let measurements = if transports.len() > 1 { args.repeat } else { 1 };
    let frames = frame_count(args);
    let total = (transports.len() * measurements)
        .saturating_mul(frames)
        .saturating_mul(args.frame_bytes);
    let bar = progress::bytes_bar(total as u64, "netbench");
    let mut bench = Bench {
        args,
        emulation,
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
        bar: bar.clone(),
        frames,
        baseline_frame: None,
        murmur_frame: None,
        murmur: None,
        shm_delay: None,
    };
    let mut rates: Vec<(Transport, Vec<Measured>)> =
        transports.iter().map(|&t| (t, Vec::new())).collect();
    for _ in 0..measurements {
        for (transport, r) in &mut rates {
            r.push(bench.measure(*transport)?);
        }
    }
    bar.finish_and_clear();
    let mut report = bench.murmur.take().context("murmur was not measured")?;
    report.shm_delay_seconds = bench.shm_delay;
    report.set_medians(rates, measurements)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

/// The median of `v` (the upper one of an even count); `v` is sorted. `v` is not empty.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One measurement: (bytes per second, CPU-seconds per 10⁹ bytes).
type Measured = (f64, f64);

/// CPU seconds (user + system) this process has used so far, all threads.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

impl NetBenchReport {
    /// Replaces the first measurement's throughput by the medians of `rates` (bytes per
    /// second, murmur's among them) and fills in the other transports and the ratios.
    fn set_medians(
        &mut self,
        rates: Vec<(Transport, Vec<Measured>)>,
        measurements: usize,
    ) -> anyhow::Result<()> {
        let medians: Vec<(Transport, f64, f64)> = rates
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(t, v)| {
                let (mut rate, mut cpu): (Vec<f64>, Vec<f64>) = v.into_iter().unzip();
                (t, median(&mut rate), median(&mut cpu))
            })
            .collect();
        let of = |want: Transport| medians.iter().find(|m| m.0 == want).map(|m| m.1);
        // The measured link (`--link`) is the first row.
        let ours = medians.first().context("murmur was not measured")?.1;
        let shm = of(Transport::Shm);
        self.bytes_per_second = ours;
        self.seconds = (self.frames * self.frame_bytes) as f64 / ours;
        self.rate_ratio = self.set_bytes_per_second.map(|set| ours / set);
        self.bare_bytes_per_second = of(Transport::Bare);
        self.ratio_to_bare = self.bare_bytes_per_second.map(|b| ours / b);
        self.transports = medians
            .iter()
            .map(
                |&(transport, bytes_per_second, cpu_seconds_per_gb)| TransportRate {
                    transport,
                    bytes_per_second,
                    cpu_seconds_per_gb,
                    murmur_over_this: ours / bytes_per_second,
                    shm_over_this: shm.map(|s| s / bytes_per_second),
                },
            )
            .collect();
        self.measurements = measurements;
        Ok(())
    }
}

/// The text report: throughput and delay, then (several transports) the table.
fn print_text(report: &NetBenchReport) {
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
        "one-way delay of a 64-byte frame: {:.3} ms median (set {:.3} ms){}",
        report.delay_seconds * 1e3,
        report.set_delay_seconds * 1e3,
        match report.shm_delay_seconds {
            Some(d) => format!("; shared memory {:.3} ms", d * 1e3),
            None => String::new(),
        }
    );
    if report.transports.len() > 1 {
        let width = report
            .transports
            .iter()
            .map(|t| t.transport.name().len())
            .max()
            .unwrap_or(0);
        println!(
            "same frames, medians of {} alternating measurements:",
            report.measurements
        );
        let shm = report.shm_delay_seconds.is_some();
        println!(
            "{:<width$}  {:>10}  {:>10}  {:>11}{}",
            "transport",
            "MB/s",
            "CPU s/GB",
            "ours / this",
            if shm { "   shm / this" } else { "" }
        );
        for t in &report.transports {
            println!(
                "{:<width$}  {:>10.1}  {:>10.2}  {:>11.3}{}",
                t.transport.name(),
                mb(t.bytes_per_second),
                t.cpu_seconds_per_gb,
                t.murmur_over_this,
                t.shm_over_this
                    .map(|r| format!("  {r:>11.3}"))
                    .unwrap_or_default()
            );
        }
    }
}

/// What one run needs to measure any transport once, and murmur's first measurement.
struct Bench<'a> {
    args: &'a NetBenchArgs,
    emulation: LinkEmulation,
    rt: tokio::runtime::Runtime,
    bar: ProgressBar,
    /// Frames per measurement.
    frames: usize,
    /// The frame the baselines move (made on first use).
    baseline_frame: Option<Vec<u8>>,
    /// The frame murmur's links move (made on first use).
    murmur_frame: Option<Bytes>,
    /// murmur's first measurement: the report's delay and settings.
    murmur: Option<NetBenchReport>,
    /// The first shared-memory measurement's one-way delay, seconds.
    shm_delay: Option<f64>,
}

impl Bench<'_> {
    /// One measurement of `transport`: bytes per second, the frames' bytes over the seconds
    /// from the first send to the last frame delivered (after the warm-up frames of
    /// murmur's links), and the CPU-seconds per 10⁹ bytes (this process's, the setup and
    /// the warm-up included). The bar counts the bytes delivered.
    fn measure(&mut self, transport: Transport) -> anyhow::Result<Measured> {
        let (frames, frame_bytes) = (self.frames, self.args.frame_bytes);
        let bar = self.bar.clone();
        let count = move |f: &[u8]| {
            bar.inc(f.len() as u64);
            anyhow::Ok(())
        };
        let cpu = cpu_seconds();
        // The seconds, and the frames moved besides the timed ones (murmur's links' warm-up).
        let warm = WARM_UP_FRAMES;
        let (seconds, untimed) = match transport {
            Transport::Murmur => (self.murmur_link(transport, LinkKind::Quic)?, warm),
            Transport::Shm => (self.murmur_link(transport, LinkKind::SharedMemory)?, warm),
            Transport::MurmurTcp => (self.murmur_link(transport, LinkKind::Tcp)?, warm),
            Transport::MurmurTcpPlain => {
                (self.murmur_link(transport, LinkKind::TcpPlaintext)?, warm)
            }
            Transport::Bare => {
                let bar = self.bar.clone();
                (self.rt.block_on(bare_quinn(frames, frame_bytes, bar))?, 0)
            }
            Transport::Tls => (baselines::tls(self.baseline_frame()?, frames, count)?, 0),
            Transport::Tcp => (baselines::tcp(self.baseline_frame()?, frames, count)?, 0),
            Transport::Memcpy => (baselines::memcpy(self.baseline_frame()?, frames, count)?, 0),
        };
        let bytes = (frames * frame_bytes) as f64;
        // The CPU is the whole measurement's, so it is spread over every byte moved in it.
        let cpu_bytes = ((frames + untimed) * frame_bytes) as f64;
        Ok((bytes / seconds, (cpu_seconds() - cpu) * 1e9 / cpu_bytes))
    }

    /// Seconds of one measurement of murmur's link of `kind` (the row `transport`). The
    /// measured link (`--link`) has the emulation and gives the report its delay; the others
    /// are measured as they are.
    fn murmur_link(&mut self, transport: Transport, kind: LinkKind) -> anyhow::Result<f64> {
        let main = transport == self.args.link.transport();
        let emulation = if main {
            self.emulation
        } else {
            LinkEmulation::default()
        };
        // The frame is made once, outside the measurements, as the baselines' is.
        let payload = self
            .murmur_frame
            .get_or_insert_with(|| frame(self.args.frame_bytes, 0))
            .clone();
        let r = self
            .rt
            .block_on(measure(self.args, emulation, kind, payload, &self.bar))?;
        if transport == Transport::Shm {
            self.shm_delay.get_or_insert(r.delay_seconds);
        }
        let seconds = r.seconds;
        if main {
            self.murmur.get_or_insert(r);
        }
        Ok(seconds)
    }

    /// The frame of `--frame-bytes` bytes the baselines move.
    fn baseline_frame(&mut self) -> anyhow::Result<&[u8]> {
        let f = match self.baseline_frame.take() {
            Some(f) => f,
            None => baselines::frame(self.args.frame_bytes)?,
        };
        Ok(self.baseline_frame.insert(f))
    }
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

/// Frames of the measured size sent before each of murmur's links is timed.
const WARM_UP_FRAMES: usize = 2;

/// Frames of `--frame-bytes` that carry `--megabytes`.
fn frame_count(args: &NetBenchArgs) -> usize {
    args.megabytes
        .saturating_mul(1_000_000)
        .div_ceil(args.frame_bytes)
}

/// One measurement of our data plane over a link of `kind` (delay, then throughput, moving
/// `payload`, a frame of `--frame-bytes`, `frame_count` times); `bar` counts the bytes
/// delivered. Errors: the link could not be of that kind.
async fn measure(
    args: &NetBenchArgs,
    emulation: LinkEmulation,
    kind: LinkKind,
    payload: Bytes,
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
    let (mut receiver, mut events) =
        DataPlane::bind(1, any, limit, PEER_TIMEOUT, &receiver_key, admitted)?;
    if kind == LinkKind::TcpPlaintext {
        sender.set_wire(Wire::Plaintext);
        receiver.set_wire(Wire::Plaintext);
    }
    sender.emulation = emulation;
    sender.tcp_streams = args.tcp_streams;
    sender.transport = match kind {
        LinkKind::Quic => TransportChoice::Quic,
        LinkKind::SharedMemory => TransportChoice::Auto,
        LinkKind::Tcp | LinkKind::TcpPlaintext => TransportChoice::Tcp,
    };
    let link = sender
        .connect(
            (1, receiver.incarnation()),
            receiver.local_addr,
            receiver_key.public().to_peer_id(),
        )
        .await
        .context("connecting the two endpoints")?;
    if link.kind != kind {
        bail!(
            "the link is {}, not {kind} (see the log for why)",
            link.kind
        );
    }

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

    // Two frames of the measured size first, untimed: the receive pool then holds the
    // buffers a running peer's reader reuses round after round (a frame is read into one
    // while the one before is handed over), as gloo's anchor sends one message first and
    // the baselines read into a buffer mapped before their clock starts.
    for _ in 0..WARM_UP_FRAMES {
        link.send(payload.clone()).await?;
        next_frame(&mut events).await?;
    }

    // Throughput: the frames back to back, timed until the last one is delivered.
    let frames = frame_count(args);
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
        shm_delay_seconds: None,
        bare_bytes_per_second: None,
        ratio_to_bare: None,
        transports: Vec::new(),
        measurements: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> NetBenchArgs {
        NetBenchArgs {
            tcp_streams: TcpStreams::default(),
            megabytes: 1,
            frame_bytes: 100_000,
            link_bandwidth: None,
            link_latency: None,
            pings: 1,
            link: MurmurLink::Quic,
            compare_bare: false,
            baselines: true,
            repeat: 1,
            json: true,
        }
    }

    #[test]
    fn baselines_with_link_emulation_are_refused() {
        let mut a = args();
        a.link_latency = Some(LinkLatency(Duration::from_millis(1)));
        let e = run(&a).expect_err("--baselines --link-latency");
        assert!(e.to_string().contains("--baselines"), "{e}");
        let mut a = args();
        a.link_bandwidth = Some(LinkRate(1e8));
        assert!(run(&a).is_err());
    }

    #[test]
    fn every_selected_transport_is_one_row_with_the_measured_links_ratio_to_it() {
        let mut a = args();
        a.compare_bare = true;
        a.link = MurmurLink::TcpPlaintext;
        let transports = Transport::selected(&a);
        assert_eq!(
            transports,
            [
                Transport::MurmurTcpPlain,
                Transport::Murmur,
                Transport::MurmurTcp,
                Transport::Shm,
                Transport::Bare,
                Transport::Tls,
                Transport::Tcp,
                Transport::Memcpy
            ]
        );
        a.link = MurmurLink::Quic;
        a.baselines = false;
        a.compare_bare = false;
        assert_eq!(Transport::selected(&a), [Transport::Murmur]);
        // Rates worked out by hand: medians 300, 150, 200, 3000, 400, 600, 1200, 12000
        // (bytes per second); CPU-seconds per GB the medians of each row's second values.
        let rates = transports
            .iter()
            .zip([
                vec![(300.0, 1.0), (100.0, 3.0), (900.0, 2.0)],
                vec![(150.0, 5.0); 3],
                vec![(200.0, 2.5); 3],
                vec![(3000.0, 1.5), (2400.0, 1.0), (3600.0, 2.0)],
                vec![(400.0, 4.0), (500.0, 4.0), (1.0, 4.0)],
                vec![(600.0, 2.0); 3],
                vec![(1200.0, 0.5), (1100.0, 0.7), (1300.0, 0.6)],
                vec![(12_000.0, 0.2), (11_000.0, 0.2), (13_000.0, 0.2)],
            ])
            .map(|(&t, v)| (t, v))
            .collect();
        let mut report = NetBenchReport {
            frames: 10,
            frame_bytes: 30,
            seconds: 0.0,
            bytes_per_second: 0.0,
            set_bytes_per_second: None,
            rate_ratio: None,
            delay_seconds: 0.0,
            set_delay_seconds: 0.0,
            shm_delay_seconds: None,
            bare_bytes_per_second: None,
            ratio_to_bare: None,
            transports: Vec::new(),
            measurements: 1,
        };
        report.set_medians(rates, 3).unwrap();
        assert_eq!(report.bytes_per_second, 300.0);
        assert_eq!(report.seconds, 1.0);
        assert_eq!(report.bare_bytes_per_second, Some(400.0));
        assert_eq!(report.ratio_to_bare, Some(0.75));
        let rows: Vec<(Transport, f64, f64, f64)> = report
            .transports
            .iter()
            .map(|r| {
                (
                    r.transport,
                    r.bytes_per_second,
                    r.murmur_over_this,
                    r.cpu_seconds_per_gb,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (Transport::MurmurTcpPlain, 300.0, 1.0, 2.0),
                (Transport::Murmur, 150.0, 2.0, 5.0),
                (Transport::MurmurTcp, 200.0, 1.5, 2.5),
                (Transport::Shm, 3000.0, 0.1, 1.5),
                (Transport::Bare, 400.0, 0.75, 4.0),
                (Transport::Tls, 600.0, 0.5, 2.0),
                (Transport::Tcp, 1200.0, 0.25, 0.6),
                (Transport::Memcpy, 12_000.0, 0.025, 0.2)
            ]
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["transports"][0]["transport"], "murmur_tcp_plaintext");
        assert_eq!(json["transports"][5]["transport"], "tls_tcp");
        assert_eq!(json["transports"][3]["transport"], "murmur_shm");
        assert_eq!(json["transports"][6]["cpu_seconds_per_gb"], 0.6);
        let memcpy = report.transports.last().unwrap();
        assert_eq!(memcpy.shm_over_this, Some(0.25));
        assert_eq!(json["measurements"], 3);
    }

    #[test]
    fn this_process_cpu_time_grows_with_work() {
        let before = cpu_seconds();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let used = cpu_seconds() - before;
        assert!(
            used > 0.01 && used < 10.0,
            "{used} CPU-seconds for 50 ms of spinning"
        );
    }
}
