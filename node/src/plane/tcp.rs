//! Links between hosts over kernel TCP, set up over the link's authenticated QUIC
//! connection — what gloo, NCCL and MPI use inside a cluster: large writes into the kernel,
//! no per-packet work in user space.
//!
//! The sender of a link offers TCP on a bidirectional QUIC stream: `TCP1` and the wire it
//! asks for (one byte: 0 encrypted, 1 plaintext). The receiver answers `NO` and why (it
//! refuses a plaintext link unless it was told to accept one, [`Wire`]; it refuses when it
//! is behind a NAT, where a TCP dial could not reach it), or `OK`, its TCP port (u16 LE) and
//! a one-time token of 32 random bytes. The sender then dials that port at the address it
//! reached the receiver's QUIC endpoint at and writes the wire byte in clear; then, on an
//! encrypted link, a TLS 1.3 handshake in which both ends prove their libp2p identities
//! exactly as on QUIC ([`super::tls`]: the client checks the server's `PeerId`, the server
//! requires a client certificate, which must carry the `PeerId` of the QUIC connection
//! that made the offer); then the token. The receiver binds the TCP connection to the offer
//! the token names (once, within [`OFFER_LIFE`]) and answers `OK` on it; any other token,
//! identity or wire is refused ([`super::NetEvent::Refused`]) and the TCP connection
//! closed. A plaintext link is therefore authenticated by the token that travelled inside
//! the QUIC connection's TLS 1.3; what it gives up is the confidentiality and integrity of
//! the frames after it (someone on the path can read them, alter them or take the stream
//! over), as gloo and NCCL do on a trusted fabric.
//!
//! **Several connections a link** (`--tcp-streams N`, [`MAX_STREAMS`] at most): the offer
//! then carries N (one more byte), the receiver answers with one token as before, and the
//! sender opens N TCP connections, each set up as above (its own TLS handshake proving the
//! same identity) and followed by its index (one byte) after the token; the link starts once
//! all N are bound. A frame of at least [`STRIPE_FROM`] bytes is cut into N contiguous
//! slices ([`stripes`]), written and read side by side, one thread per connection and side;
//! its length prefix travels on connection 0 and says over how many connections the frame
//! comes ([`striping::prefix`]: all of them, or as many as the sender chooses under
//! `--tcp-streams auto`), and smaller frames go whole on connection 0.
//! This is what NCCL's several sockets per peer do: it pays where one TCP stream cannot
//! fill the link (a cloud's per-flow cap, a long fat pipe) or one core cannot encrypt it.
//!
//! From then on every frame of the link, the goodbye included, goes over the TCP stream,
//! each preceded by its length (u64 LE, the top byte the number of connections): a frame
//! over the receiver's limit is read past and refused, one whose header lies about its
//! length refused, and the frames after them
//! still arrive — the checks, refusals and counting of [`super::receive::deliver`], as on
//! the other transports. One thread per side does the blocking I/O (writes of at most
//! [`WRITE_CHUNK`] bytes; a read straight into the frame's buffer). A frame's transfer time (what the
//! per-link choices measure bandwidth from) is taken from the kernel's receive timestamps
//! of its first and last bytes ([`Stamped`]), not from when the reading thread got to them:
//! on a busy host that thread often finds a frame already whole in the kernel's buffers.
//! Where the kernel gives no timestamps, only the bytes that arrived while the frame was
//! read count ([`transfer_time`]). The QUIC connection stays, as for
//! shared memory: it carries liveness and the close; when it closes, both ends shut the
//! TCP socket down.
//!
//! **A dead sender is noticed at once.** When a process dies, even by `kill -9`, its
//! kernel closes its TCP sockets (FIN, or RST with unread data), while its QUIC connection
//! just goes silent until the peer timeout (`--peer-timeout-secs`). So a TCP stream that
//! ends before the goodbye's count is complete, while the link's QUIC connection is still
//! open, is reported as [`super::NetEvent::Lost`] right away ([`read_frames`]). A paused
//! process (SIGSTOP) keeps its sockets, so it is not taken for dead; nor is a whole host
//! that vanishes (no FIN is sent). Both go silent on QUIC, and the TCP connection tells
//! them apart ([`host`]): each end sends keep-alive probes every second while the link is
//! idle, so the kernel learns within seconds whether the far host still acknowledges; a
//! paused process's kernel does, a vanished host does not ([`super::liveness`] waits longer
//! for the first).

use std::collections::HashMap;
use std::io::{IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use libp2p::identity::Keypair;
use libp2p::PeerId;
use murmur_gossip::frame::FRAME_HEADER_LEN;
use quinn::{Connection, SendStream};
use ring::rand::SecureRandom;
use rustls::{ClientConnection, ServerConnection, StreamOwned};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::liveness::{Far, Host, LinkProbe};
use super::receive::{check, deliver, BufferPool, Receiving};
use super::send::FrameTransport;
use super::striping::{self, StreamChooser, TcpStreams};
use super::{tls, NetEvent};

/// The offer's first bytes on the QUIC stream.
pub(super) const OFFER_TAG: &[u8; 4] = b"TCP1";
/// Bytes of the one-time token.
const TOKEN_LEN: usize = 32;
/// How long the sender waits for the answer to its offer, and for the TCP connection's
/// handshake, token and acknowledgement.
const OFFER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the sender tries to open the TCP connection: a receiver whose TCP port cannot
/// be reached (a firewall) costs the link this long before it stays on QUIC.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an offer's token stays valid.
pub const OFFER_LIFE: Duration = Duration::from_secs(30);
/// How long a TCP connection to the listener may take to present its token.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most TCP connections one link may have (`--tcp-streams`).
pub const MAX_STREAMS: u8 = 16;

/// Bytes from which a frame is cut across a link's connections (1 MiB): below it a frame
/// goes whole on connection 0, as the per-frame cost of the other connections' threads
/// would outweigh what they move side by side.
pub const STRIPE_FROM: usize = 1 << 20;

/// Where a frame of `len` bytes travels on a link of `streams` connections: the range of
/// the frame connection i carries is the i-th item, the ranges contiguous, in order and
/// covering `0..len`. One range (connection 0) when `streams` is 1 or the frame is under
/// [`STRIPE_FROM`]; else `streams` slices of `len / streams` bytes, the remainder spread
/// over the first ones. Both ends compute it from the length prefix alone.
pub fn stripes(len: usize, streams: usize) -> Vec<Range<usize>> {
    if streams <= 1 || len < STRIPE_FROM {
        return vec![0..len];
    }
    let (each, extra) = (len / streams, len % streams);
    let mut start = 0;
    (0..streams)
        .map(|i| {
            let end = start + each + usize::from(i < extra);
            let r = start..end;
            start = end;
            r
        })
        .collect()
}

/// How a TCP link's frames are protected (`--wire`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wire {
    /// TLS 1.3 (AES-128-GCM first) over the TCP stream, both ends proving their identities.
    #[default]
    Encrypted,
    /// Frames in clear after an authenticated setup: for fabrics whose every host is
    /// trusted, as gloo and NCCL run. A link is plaintext only if both ends say so.
    Plaintext,
}

impl Wire {
    fn byte(self) -> u8 {
        match self {
            Wire::Encrypted => 0,
            Wire::Plaintext => 1,
        }
    }

    fn from_byte(b: u8) -> anyhow::Result<Wire> {
        match b {
            0 => Ok(Wire::Encrypted),
            1 => Ok(Wire::Plaintext),
            other => bail!("an unknown wire {other}"),
        }
    }
}

/// Keep-alive probes on an idle TCP link: the first after 1 s without traffic, then every
/// 1 s; the kernel ends the connection after this many unanswered ones.
const KEEPALIVE_PROBES: u32 = 5;

/// How long the far host may leave what it was sent (data, a zero-window or keep-alive
/// probe) unacknowledged before [`host`] says it no longer answers. Longer than a
/// retransmission's round trip on a live link, shorter than the peer timeout.
const UNANSWERED_FOR: Duration = Duration::from_secs(1);

/// Turns on `tcp`'s keep-alive probes ([`KEEPALIVE_PROBES`]), so that an idle link learns
/// whether its far host still answers.
fn keep_alive(tcp: &TcpStream) -> std::io::Result<()> {
    let probes = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(1))
        .with_interval(Duration::from_secs(1))
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&probes)
}

/// What the kernel knows of a TCP connection's far host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TcpView {
    /// The connection is established (not closed by a FIN, a reset or the kernel's own
    /// timeout).
    established: bool,
    /// Something sent is unacknowledged and was sent again: a retransmission, a
    /// zero-window probe or a keep-alive probe.
    unanswered: bool,
    /// Data is in flight unacknowledged and was retransmitted: not a probe. A paused
    /// process's kernel acknowledges all data that reaches its window (and the sender sends
    /// none beyond it), so this lasting is a host gone or cut off. A probe is weaker
    /// evidence: the far kernel answers the probes of a zero window or of an idle link at
    /// a limited rate (`tcp_invalid_ratelimit`, 500 ms), and a paused peer's probes were
    /// seen unanswered for 1.1 s.
    data_unanswered: bool,
    /// Since the last acknowledgement came.
    since_ack: Duration,
}

impl TcpView {
    /// The far host answers: established, and nothing sent again waits for an answer for
    /// longer than [`UNANSWERED_FOR`]; gone: the connection broke, or retransmitted data
    /// waits that long; else silent (a probe waits).
    fn host(&self) -> Host {
        let waited = self.since_ack >= UNANSWERED_FOR;
        if !self.established || (self.data_unanswered && waited) {
            Host::Gone
        } else if self.unanswered && waited {
            Host::Silent
        } else {
            Host::Answers
        }
    }
}

/// The kernel's view of `tcp` (`TCP_INFO`); `None` where it does not say.
#[cfg(target_os = "linux")]
fn tcp_view(tcp: &TcpStream) -> Option<TcpView> {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain data; an all-zero one is valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: TCP_INFO writes at most `len` bytes to `info`, and sets `len`.
    let r = unsafe {
        libc::getsockopt(
            tcp.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then(|| TcpView {
        // TCP_ESTABLISHED of the kernel's tcp_states.h.
        established: info.tcpi_state == 1,
        unanswered: info.tcpi_retransmits > 0 || info.tcpi_probes > 0,
        data_unanswered: info.tcpi_retransmits > 0 && info.tcpi_unacked > 0,
        since_ack: Duration::from_millis(info.tcpi_last_ack_recv.into()),
    })
}

#[cfg(not(target_os = "linux"))]
fn tcp_view(_tcp: &TcpStream) -> Option<TcpView> {
    None
}

/// What the kernel says of the far host of a link's TCP connection `tcp`
/// ([`Host::Unknown`] where it does not say).
pub fn host_of(tcp: &TcpStream) -> Host {
    tcp_view(tcp).map_or(Host::Unknown, |v| v.host())
}

/// An offer answered, waiting for its TCP connection.
struct Pending {
    /// The identity of the QUIC connection that made the offer.
    peer: PeerId,
    wire: Wire,
    conn: Connection,
    state: Arc<tokio::sync::Mutex<Receiving>>,
    events: mpsc::Sender<NetEvent>,
    max_payload_bytes: u32,
    pool: BufferPool,
    made: Instant,
    /// The link's [`LinkProbe`], filled once the connection is bound.
    probe: LinkProbe,
    /// The link's connections, by index, as they are bound (`--tcp-streams` of the sender:
    /// the length is their number).
    arrived: Vec<Option<Arrived>>,
}

/// One bound TCP connection of a link, on the receiving side.
struct Arrived {
    /// Its frames' bytes (in clear, or out of TLS).
    reader: Box<dyn Read + Send>,
    /// A handle of the socket (for the shutdown and the kernel's view).
    socket: TcpStream,
    /// The kernel's receive timestamp of its latest read ([`Stamped`]).
    stamp: Arc<AtomicU64>,
}

/// The receiving side of the TCP links of one data plane: its listener and the offers
/// whose connection has not come yet.
pub(super) struct TcpSide {
    /// The listener's port (on the data plane's address).
    port: u16,
    pending: Mutex<HashMap<[u8; TOKEN_LEN], Pending>>,
    server_tls: Arc<rustls::ServerConfig>,
    /// Plaintext links are accepted.
    pub plaintext_ok: std::sync::atomic::AtomicBool,
    /// This peer is behind a NAT: TCP offers are refused (a dial could not reach it).
    pub behind_nat: std::sync::atomic::AtomicBool,
    /// Where refused connections are reported.
    events: mpsc::Sender<NetEvent>,
    /// The data plane's receive buffers.
    pool: BufferPool,
}

impl TcpSide {
    /// Binds the TCP listener at `ip` (the data plane's address; the port the same as the
    /// QUIC port when it is free, else any) and accepts its connections on the runtime.
    pub fn bind(
        ip: IpAddr,
        quic_port: u16,
        key: &Keypair,
        provider: Arc<rustls::crypto::CryptoProvider>,
        events: mpsc::Sender<NetEvent>,
        pool: BufferPool,
    ) -> anyhow::Result<Arc<TcpSide>> {
        let listener = std::net::TcpListener::bind((ip, quic_port))
            .or_else(|_| std::net::TcpListener::bind((ip, 0)))
            .with_context(|| format!("cannot bind a TCP port on {ip}"))?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut server_tls = tls::server_config(key, provider)?;
        server_tls.send_tls13_tickets = 0;
        let side = Arc::new(TcpSide {
            port,
            pending: Mutex::new(HashMap::new()),
            server_tls: Arc::new(server_tls),
            plaintext_ok: false.into(),
            behind_nat: false.into(),
            events,
            pool,
        });
        tokio::spawn(accept_loop(listener, side.clone()));
        Ok(side)
    }

    /// The listener's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The number of connections of the offer `token` names, if it is still valid.
    fn streams_of(&self, token: &[u8; TOKEN_LEN]) -> Option<usize> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|_, p| p.made.elapsed() < OFFER_LIFE);
        pending.get(token).map(|p| p.arrived.len())
    }
}

/// A frame for a link's writing thread, and where to say how its write went.
type ToWrite = (Bytes, tokio::sync::oneshot::Sender<std::io::Result<()>>);

/// Frames over a TCP stream (in clear or inside TLS), each preceded by its length, written
/// in order by the link's own writing thread. A thread of its own, not a task of tokio's
/// blocking pool per frame: one 100 MB message in clear moved at 0.69–0.79× PyTorch gloo's
/// `send`/`recv` with the pool, 1.03–1.13× with the thread (`experiments/wire/run.sh`, the
/// same runs; 2-core machine, 2026-11-29).
#[derive(Clone)]
pub struct TcpFrames(std::sync::mpsc::Sender<ToWrite>);

impl TcpFrames {
    /// Starts the writing thread of a link whose connections are `writers` (one or more,
    /// with a handle of each socket; named after `peer`); it ends when the last clone of
    /// the returned handle is dropped. A frame of several slices ([`stripes`]) is written
    /// side by side, connection 0's slice by this thread and each other's by a thread of
    /// the frame's own. Every large frame goes over all connections, or with `auto` over
    /// as many as a [`StreamChooser`] says: each such frame is then timed until the
    /// kernel's send queues have emptied (the far end acknowledged all of it), polling
    /// every [`DRAIN_POLL`] while no other frame waits.
    fn spawn(
        mut writers: Vec<Box<dyn Write + Send>>,
        sockets: Vec<TcpStream>,
        peer: SocketAddr,
        auto: bool,
    ) -> anyhow::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<ToWrite>();
        let mut chooser = auto.then(|| StreamChooser::new(writers.len()));
        std::thread::Builder::new()
            .name(format!("tcp-to-{peer}"))
            .spawn(move || {
                // A frame that came while the one before was timed.
                let mut next: Option<ToWrite> = None;
                while let Some((frame, done)) = next.take().or_else(|| rx.recv().ok()) {
                    let c = match chooser.as_mut() {
                        Some(c) if frame.len() >= STRIPE_FROM => c,
                        // A fixed number: all connections (`stripes` leaves a small frame
                        // whole); under auto, a small frame on one.
                        other => {
                            let streams = if other.is_some() { 1 } else { writers.len() };
                            let written = write_striped(&mut writers, &sockets, &frame, streams);
                            let _ = done.send(written);
                            continue;
                        }
                    };
                    let streams = c.next();
                    // What the frames before it left queued goes out ahead of it.
                    let sent = &sockets[..streams];
                    let ahead: u64 = sent.iter().filter_map(unsent_bytes).sum();
                    let start = Instant::now();
                    let written = write_striped(&mut writers, &sockets, &frame, streams);
                    let ok = written.is_ok();
                    let _ = done.send(written);
                    if ok {
                        let len = (frame.len() as u64, ahead);
                        let (moved, queued) = drain_rate(sent, len, c.rate(streams), start, &rx);
                        next = queued;
                        observe(c, streams, moved, (peer, writers.len()));
                    }
                }
            })?;
        Ok(TcpFrames(tx))
    }
}

/// Tells `chooser` what a frame over `streams` connections moved, and logs a change of the
/// number it keeps on the link to `peer` (of `connections`).
fn observe(
    chooser: &mut StreamChooser,
    streams: usize,
    moved: Option<(u64, f64)>,
    (peer, connections): (SocketAddr, usize),
) {
    let before = chooser.current();
    if let Some(now) = chooser.observe(streams, moved) {
        let mb = |k| chooser.rate(k).unwrap_or(0.0) / 1e6;
        info!(
            %peer,
            "the TCP link to {peer} stripes large frames over {now} of its {connections} \
             connections from now on ({now} moved {:.0} MB/s, {before} {:.0})",
            mb(now),
            mb(before)
        );
    }
}

/// How often a link under `--tcp-streams auto` looks whether its send queues have emptied:
/// a quarter of the time the bytes still queued take at the latest rate measured, within
/// these bounds (each look is a system call per connection and a wake-up).
const DRAIN_POLL: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(10));

/// The longest a frame is timed before it counts as not measured (a far end that stopped
/// reading).
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// The bytes and seconds a frame of `len` bytes, written from `start` with `ahead` bytes of
/// earlier frames still queued, moved over `sockets` in (`expect`: the latest rate
/// measured over them, bytes a second, which paces the looks): waits until their send queues are
/// empty (`None`: the kernel does not say, or the queues did not empty within
/// [`DRAIN_LIMIT`]). A frame that comes on `rx` meanwhile (frames back to back: the link is
/// busy) ends the wait and is returned: the rate is then that of the bytes acknowledged
/// since `start`, if at least half a frame's worth (a write the kernel's buffers took
/// whole says nothing of the link).
fn drain_rate(
    sockets: &[TcpStream],
    (len, ahead): (u64, u64),
    expect: Option<f64>,
    start: Instant,
    rx: &std::sync::mpsc::Receiver<ToWrite>,
) -> (Option<(u64, f64)>, Option<ToWrite>) {
    let unsent = || -> Option<u64> { sockets.iter().map(unsent_bytes).sum() };
    let rate = |acked: u64| (2 * acked >= len).then(|| (acked, start.elapsed().as_secs_f64()));
    let all = len + ahead;
    loop {
        let Some(queued) = unsent() else {
            return (None, None);
        };
        if queued == 0 {
            return (rate(all), None);
        }
        if start.elapsed() > DRAIN_LIMIT {
            return (None, None);
        }
        let wait = expect.map_or(DRAIN_POLL.0, |r| {
            Duration::from_secs_f64(queued as f64 / r / 4.0)
        });
        match rx.recv_timeout(wait.clamp(DRAIN_POLL.0, DRAIN_POLL.1)) {
            Ok(next) => {
                let acked = unsent().map(|q| all.saturating_sub(q));
                return (acked.and_then(rate), Some(next));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return (None, None),
        }
    }
}

/// Writes `frame` over the first `streams` of the link's connections `writers` (their
/// sockets `sockets`) as [`stripes`] cuts it, its length prefix (which says over how many,
/// [`striping::prefix`]) on connection 0, each connection then flushed.
fn write_striped(
    writers: &mut [Box<dyn Write + Send>],
    sockets: &[TcpStream],
    frame: &[u8],
    streams: usize,
) -> std::io::Result<()> {
    let ranges = stripes(frame.len(), streams.clamp(1, writers.len()));
    let prefix = striping::prefix(frame.len() as u64, ranges.len());
    let jobs = writers
        .iter_mut()
        .zip(ranges)
        .enumerate()
        .map(|(i, (w, r))| {
            let part = &frame[r];
            move || {
                write_prefixed(&mut **w, (i == 0).then_some(prefix), part).and_then(|()| w.flush())
            }
        });
    side_by_side(sockets, jobs)
}

/// Runs `jobs` (one a connection of a link, in order) side by side: the first on this
/// thread, each other on a scoped thread of its own (none for a frame that is not cut).
/// Returns the first error (a panicking thread counts as one). A job that fails shuts every
/// socket of the link (`sockets`) down, so that no other job waits on a link that is gone.
fn side_by_side<J>(sockets: &[TcpStream], jobs: impl IntoIterator<Item = J>) -> std::io::Result<()>
where
    J: FnOnce() -> std::io::Result<()> + Send,
{
    let shut_all = |e: std::io::Error| {
        for s in sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
        e
    };
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Ok(());
    };
    std::thread::scope(|scope| {
        let others: Vec<_> = jobs
            .map(|job| scope.spawn(move || job().map_err(shut_all)))
            .collect();
        let mut result = first().map_err(shut_all);
        for t in others {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a thread of the link panicked")));
            result = result.and(r);
        }
        result
    })
}

impl FrameTransport for TcpFrames {
    async fn write(&self, frame: Bytes) -> anyhow::Result<()> {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.0
            .send((frame, done))
            .map_err(|_| anyhow!("the link's writing thread has stopped"))?;
        wait.await
            .map_err(|_| anyhow!("the link's writing thread has stopped"))?
            .map_err(anyhow::Error::from)
    }
}

/// The most bytes of a frame handed to the kernel in one write (2 MiB). One write of a
/// whole 100 MB frame holds the socket's lock until the kernel has taken all of it, so the
/// acknowledgements that arrive meanwhile wait in its backlog and the window opens late:
/// on loopback, writes of 1–4 MiB (as iperf3's 1 MiB writes, or gloo's non-blocking ones,
/// which return when the send buffer is full) moved 1.2–1.4× as many bytes a second at
/// 0.8× the CPU of whole-frame writes; 2 MiB measured best of them (see the guide,
/// transport).
pub const WRITE_CHUNK: usize = 2 << 20;

/// Writes `bytes` (a frame or a slice of one) preceded by `prefix` (u64 LE) if any, at most
/// [`WRITE_CHUNK`] bytes of it a system call.
fn write_prefixed(w: &mut dyn Write, prefix: Option<u64>, bytes: &[u8]) -> std::io::Result<()> {
    let len_bytes = prefix.map(u64::to_le_bytes);
    let len: &[u8] = len_bytes.as_ref().map_or(&[], |l| l.as_slice());
    let mut done = 0;
    let total = len.len() + bytes.len();
    while done < total {
        let n = if done < len.len() {
            let first = &bytes[..bytes.len().min(WRITE_CHUNK)];
            w.write_vectored(&[IoSlice::new(&len[done..]), IoSlice::new(first)])?
        } else {
            let from = done - len.len();
            w.write(&bytes[from..bytes.len().min(from + WRITE_CHUNK)])?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n;
    }
    Ok(())
}

/// Shuts `socket` down once `conn` closes: the blocking reads and writes of its link end.
fn shut_when_closed(conn: &Connection, socket: Option<TcpStream>) {
    let conn = conn.clone();
    tokio::spawn(async move {
        conn.closed().await;
        if let Some(socket) = socket {
            let _ = socket.shutdown(Shutdown::Both);
        }
    });
}

/// A TCP socket whose reads record the kernel's receive timestamp (`SO_TIMESTAMPNS`) of
/// the last bytes each read returned, so that a frame is timed by when its bytes arrived,
/// not by when the reading thread was scheduled. Writes go to the socket unchanged.
struct Stamped {
    socket: TcpStream,
    /// Nanoseconds since the Unix epoch of the latest read's last bytes (0: none yet, or
    /// the kernel gave no timestamp).
    stamp: Arc<AtomicU64>,
}

impl Stamped {
    /// Asks the kernel to timestamp what `socket` receives. Without timestamps (an old
    /// kernel) the stamp stays 0 and frames are timed by the reading thread instead.
    fn new(socket: TcpStream) -> Self {
        use std::os::fd::AsRawFd;
        let on: libc::c_int = 1;
        // SAFETY: SO_TIMESTAMPNS takes an int flag, passed by pointer with its size.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Stamped {
            socket,
            stamp: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Read for Stamped {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for one SCM_TIMESTAMPNS message (a header and a timespec), u64-aligned.
        let mut control = [0u64; 8];
        // SAFETY: an all-zero msghdr is valid (no name, no buffers); the pointers set below
        // outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = loop {
            // SAFETY: msg points to one iovec over `buf` and to `control`, both live.
            let r = unsafe { libc::recvmsg(self.socket.as_raw_fd(), &mut msg, 0) };
            if r >= 0 {
                break r as usize;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        // SAFETY: the CMSG_* walk stays within msg_controllen bytes of `control`, which the
        // kernel filled; the timestamp is read unaligned.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                    let ns = (ts.tv_sec as u64)
                        .saturating_mul(1_000_000_000)
                        .saturating_add(ts.tv_nsec as u64);
                    self.stamp.store(ns, Ordering::Relaxed);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(n)
    }
}

impl Write for Stamped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.socket.write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.socket.write_vectored(bufs)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.socket.flush()
    }
}

/// A frame's transfer time from the kernel's receive timestamps (ns since the epoch) of
/// its first bytes (`first`, taken with its length prefix) and its last (`last`): `None`
/// without timestamps, for a frame under [`MIN_ARRIVING`] bytes (a shaper's burst), or when
/// they do not increase.
fn stamped_time(n: u64, first: u64, last: u64) -> Option<Duration> {
    (first > 0 && last > first && n >= MIN_ARRIVING).then(|| Duration::from_nanos(last - first))
}

/// Bytes waiting in `socket`'s receive buffer (`FIONREAD`); `None` if the kernel does not
/// say.
fn waiting_bytes(socket: &TcpStream) -> Option<u64> {
    queue_bytes(socket, libc::FIONREAD)
}

/// Bytes `socket` has not had acknowledged yet, sent or not (`TIOCOUTQ`); `None` if the
/// kernel does not say.
fn unsent_bytes(socket: &TcpStream) -> Option<u64> {
    queue_bytes(socket, libc::TIOCOUTQ)
}

/// The byte count the kernel gives for one of `socket`'s queues (`request`: `FIONREAD` or
/// `TIOCOUTQ`).
fn queue_bytes(socket: &TcpStream, request: libc::Ioctl) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one int through the pointer they are given.
    let r = unsafe { libc::ioctl(socket.as_raw_fd(), request, &mut n) };
    (r == 0 && n >= 0).then_some(n as u64)
}

/// Bytes of a frame that must arrive while it is read for its transfer time to count. Large,
/// because TCP does not pace: a shaper that let a link idle (a token bucket, tc's htb) passes
/// its first tens of KB at the wire's full speed, so a small frame after a pause measures the
/// burst, not the link (QUIC paces its packets and is measured from 16 KiB up).
const MIN_ARRIVING: u64 = 256 << 10;

/// A frame's transfer time at the link's rate, from reading `n` bytes in `elapsed` of
/// which `waiting` were already in the kernel's buffers when the reading began: the kernel
/// acknowledges TCP data whether or not the reader is scheduled, so a reader that comes late
/// finds much of the frame there, and timing it from its first byte read would make the
/// link look as fast as a memory copy. The bytes that arrived while it read, `n − waiting`,
/// arrived at the link's rate: the time is scaled to all `n` at that rate. `None` when too
/// few bytes arrived during the read to say.
fn transfer_time(n: u64, waiting: u64, elapsed: Duration) -> Option<Duration> {
    let arriving = n.saturating_sub(waiting);
    (arriving >= MIN_ARRIVING).then(|| elapsed.mul_f64(n as f64 / arriving as f64))
}

/// The offer of a TCP link of `streams` connections under `wire`: the tag, the wire byte,
/// and the number of connections when it is more than one (so that a one-connection offer
/// reads as it always has).
fn offer_message(wire: Wire, streams: u8) -> Vec<u8> {
    let mut m = [OFFER_TAG.as_slice(), &[wire.byte()]].concat();
    if streams > 1 {
        m.push(streams);
    }
    m
}

/// Parses an offer ([`offer_message`]): its wire and number of connections.
fn parse_offer(msg: &[u8]) -> anyhow::Result<(Wire, u8)> {
    match msg.strip_prefix(OFFER_TAG.as_slice()) {
        Some([w]) => Ok((Wire::from_byte(*w)?, 1)),
        Some([w, n]) if (1..=MAX_STREAMS).contains(n) => Ok((Wire::from_byte(*w)?, *n)),
        Some([_, n]) => bail!("a TCP offer of {n} connections (1 to {MAX_STREAMS})"),
        _ => bail!("a malformed TCP offer"),
    }
}

/// Offers TCP to the receiver at the other end of `conn` (dialled at `ip`), whose identity
/// is `remote`, over `choice`'s connections (1 to [`MAX_STREAMS`]); returns the link's
/// transport once every TCP connection is bound to the link, and puts connection 0 in
/// `probe`. `key` is our identity.
///
/// # Errors
/// The receiver refused (its reason), its TCP port could not be reached within 3 s, a TLS
/// handshake failed (the wrong identity), or no answer within 10 s.
#[allow(clippy::too_many_arguments)]
pub async fn offer(
    conn: &Connection,
    ip: IpAddr,
    wire: Wire,
    choice: TcpStreams,
    key: &Keypair,
    remote: PeerId,
    provider: Arc<rustls::crypto::CryptoProvider>,
    probe: &LinkProbe,
) -> anyhow::Result<TcpFrames> {
    let streams = choice.connections().clamp(1, MAX_STREAMS);
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&offer_message(wire, streams)).await?;
        send.finish()?;
        let answer = recv.read_to_end(1024).await?;
        let (port, token) = parse_answer(&answer)?;
        let addr = SocketAddr::new(ip, port);
        let config = Arc::new({
            let mut c = tls::client_config(key, remote, provider)?;
            c.resumption = rustls::client::Resumption::disabled();
            c
        });
        let dials = (0..streams).map(|i| {
            let config = config.clone();
            async move {
                let tcp =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
                        .await
                        .map_err(|_| {
                            anyhow!("its TCP port {addr} did not answer within {CONNECT_TIMEOUT:?}")
                        })?
                        .with_context(|| format!("dialling its TCP port {addr}"))?
                        .into_std()?;
                tcp.set_nonblocking(false)?;
                let index = (streams > 1).then_some(i);
                tokio::task::spawn_blocking(move || dial(tcp, wire, &token, index, config)).await?
            }
        });
        futures::future::try_join_all(dials).await
    };
    tokio::time::timeout(OFFER_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("no TCP link within {OFFER_TIMEOUT:?}"))?
        .and_then(|bound| {
            let peer = bound[0].0.peer_addr()?;
            let _ = probe.set(Far::Tcp(bound[0].0.try_clone()?));
            let (mut writers, mut sockets) = (Vec::new(), Vec::new());
            for (socket, writer) in bound {
                shut_when_closed(conn, Some(socket.try_clone()?));
                sockets.push(socket);
                writers.push(writer);
            }
            TcpFrames::spawn(writers, sockets, peer, choice == TcpStreams::Auto)
        })
}

/// Parses the receiver's answer: its TCP port and the token, or its refusal.
fn parse_answer(answer: &[u8]) -> anyhow::Result<(u16, [u8; TOKEN_LEN])> {
    match answer.split_first_chunk::<2>() {
        Some((b"OK", rest)) => {
            let (port, token) = rest
                .split_first_chunk::<2>()
                .ok_or_else(|| anyhow!("a truncated answer"))?;
            let token: [u8; TOKEN_LEN] = token
                .try_into()
                .map_err(|_| anyhow!("an answer with a token of {} bytes", token.len()))?;
            Ok((u16::from_le_bytes(*port), token))
        }
        Some((b"NO", why)) => bail!("refused: {}", String::from_utf8_lossy(why)),
        _ => bail!("an answer that is not one"),
    }
}

/// The dialling side's setup on a fresh TCP connection (blocking): the wire byte, the TLS
/// handshake on an encrypted link, the token, the connection's `index` on a link of
/// several, the receiver's `OK`. Returns a handle of the socket (for the shutdown) and the
/// writer of the link's frames.
fn dial(
    tcp: TcpStream,
    wire: Wire,
    token: &[u8; TOKEN_LEN],
    index: Option<u8>,
    config: Arc<rustls::ClientConfig>,
) -> anyhow::Result<(TcpStream, Box<dyn Write + Send>)> {
    tcp.set_nodelay(true)?;
    keep_alive(&tcp)?;
    tcp.set_read_timeout(Some(OFFER_TIMEOUT))?;
    tcp.set_write_timeout(Some(OFFER_TIMEOUT))?;
    let socket = tcp.try_clone()?;
    let mut tcp = tcp;
    tcp.write_all(&[wire.byte()])?;
    let mut stream: Box<dyn ReadWrite> = match wire {
        Wire::Plaintext => Box::new(tcp),
        Wire::Encrypted => {
            let name = rustls::pki_types::ServerName::try_from(super::SERVER_NAME)?;
            let mut s = StreamOwned::new(ClientConnection::new(config, name)?, tcp);
            while s.conn.is_handshaking() {
                s.conn
                    .complete_io(&mut s.sock)
                    .context("the TLS handshake")?;
            }
            Box::new(s)
        }
    };
    stream.write_all(token)?;
    if let Some(i) = index {
        stream.write_all(&[i])?;
    }
    stream.flush()?;
    let mut ok = [0u8; 2];
    stream
        .read_exact(&mut ok)
        .context("the receiver closed the TCP connection instead of binding it")?;
    anyhow::ensure!(&ok == b"OK", "the receiver did not bind the TCP connection");
    // From here on the QUIC connection's close ends the link, not a timeout.
    socket.set_read_timeout(None)?;
    socket.set_write_timeout(None)?;
    Ok((socket, stream.into_writer()))
}

/// A stream both ways (TCP in clear, or TLS over it).
trait ReadWrite: Read + Write + Send {
    fn into_writer(self: Box<Self>) -> Box<dyn Write + Send>;
    fn into_reader(self: Box<Self>) -> Box<dyn Read + Send>;
}

impl<T: Read + Write + Send + 'static> ReadWrite for T {
    fn into_writer(self: Box<Self>) -> Box<dyn Write + Send> {
        self
    }
    fn into_reader(self: Box<Self>) -> Box<dyn Read + Send> {
        self
    }
}

/// Answers a TCP offer (`msg`, read from (`send`, `recv`)'s stream) of the peer of `conn`,
/// whose identity is `peer` and whose frames `state` counts; the TCP connection goes into
/// `probe` once bound. Only the `first` offer of a connection is taken (one transport per
/// link).
#[allow(clippy::too_many_arguments)]
pub(super) async fn answer_offer(
    side: &TcpSide,
    msg: &[u8],
    (conn, peer): (Connection, PeerId),
    mut send: SendStream,
    events: mpsc::Sender<NetEvent>,
    (state, probe): (Arc<tokio::sync::Mutex<Receiving>>, LinkProbe),
    max_payload_bytes: u32,
    first: bool,
) {
    let rank = state.lock().await.peer;
    let answer = (|| {
        anyhow::ensure!(first, "this link has a transport already");
        let (wire, streams) = parse_offer(msg)?;
        use std::sync::atomic::Ordering::Relaxed;
        anyhow::ensure!(
            !side.behind_nat.load(Relaxed),
            "this peer is behind a NAT: a TCP dial cannot reach it"
        );
        anyhow::ensure!(
            wire == Wire::Encrypted || side.plaintext_ok.load(Relaxed),
            "a plaintext link needs --wire plaintext on both ends, and this peer's links \
             are encrypted"
        );
        let mut token = [0u8; TOKEN_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut token)
            .map_err(|_| anyhow!("no random token"))?;
        side.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                token,
                Pending {
                    peer,
                    wire,
                    conn: conn.clone(),
                    state: state.clone(),
                    events: events.clone(),
                    max_payload_bytes,
                    pool: side.pool.clone(),
                    made: Instant::now(),
                    probe: probe.clone(),
                    arrived: (0..streams).map(|_| None).collect(),
                },
            );
        let mut ok = b"OK".to_vec();
        ok.extend_from_slice(&side.port.to_le_bytes());
        ok.extend_from_slice(&token);
        anyhow::Ok(ok)
    })();
    let answer = answer.unwrap_or_else(|e| {
        debug!(rank, "refused peer {rank}'s TCP offer: {e:#}");
        [b"NO".as_slice(), format!("{e:#}").as_bytes()].concat()
    });
    let _ = send.write_all(&answer).await;
    let _ = send.finish();
}

/// Accepts the listener's TCP connections; each sets up and then reads on a thread of its
/// own.
async fn accept_loop(listener: tokio::net::TcpListener, side: Arc<TcpSide>) {
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!("the data plane's TCP listener failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (side, rt) = (side.clone(), tokio::runtime::Handle::current());
        let spawned = std::thread::Builder::new()
            .name(format!("tcp-from-{remote}"))
            .spawn(move || {
                let tcp = tcp.into_std().and_then(|t| {
                    t.set_nonblocking(false)?;
                    Ok(t)
                });
                // A connection closed before its first byte is another peer's check that
                // this host answers ([`super::liveness::kernel_answers`]): not a refusal.
                if let Ok(t) = &tcp {
                    let _ = t.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
                    if matches!(t.peek(&mut [0u8; 1]), Ok(0)) {
                        debug!(%remote, "a TCP connection closed before its first byte: a check that this host answers");
                        return;
                    }
                }
                match tcp
                    .map_err(anyhow::Error::from)
                    .and_then(|t| bind(&side, t))
                {
                    // One connection of several bound: it waits in the offer for the others.
                    Ok(None) => {}
                    Ok(Some((streams, p))) => {
                        if let Ok(s) = streams[0].socket.try_clone() {
                            let _ = p.probe.set(Far::Tcp(s));
                        }
                        {
                            let _in_runtime = rt.enter();
                            for a in &streams {
                                shut_when_closed(&p.conn, a.socket.try_clone().ok());
                            }
                        }
                        read_frames(streams, p, rt)
                    }
                    Err(e) => {
                        warn!(%remote, "refused a data-plane TCP connection: {e:#}");
                        let _ = side.events.blocking_send(NetEvent::Refused {
                            peer: None,
                            reason: format!("TCP connection from {remote} refused: {e:#}"),
                        });
                    }
                }
            });
        if let Err(e) = spawned {
            warn!(%remote, "no thread for a TCP connection: {e}");
        }
    }
}

/// The accepting side's setup (blocking): the wire byte, the TLS handshake on an encrypted
/// link, the token, the connection's index on a link of several, then `OK`. Returns the
/// link's connections and the offer they are bound to once the last of them is bound,
/// `None` for one that waits for the others. A connection that fails a check (an identity,
/// a wire or an index that does not match the offer) withdraws the offer: its token is
/// good for nothing after.
fn bind(side: &TcpSide, tcp: TcpStream) -> anyhow::Result<Option<(Vec<Arrived>, Pending)>> {
    let setup = || {
        tcp.set_nodelay(true)?;
        keep_alive(&tcp)?;
        tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let socket = tcp.try_clone()?;
        let mut tcp = Stamped::new(tcp);
        let stamp = tcp.stamp.clone();
        let mut wire = [0u8; 1];
        tcp.read_exact(&mut wire)?;
        let wire = Wire::from_byte(wire[0])?;
        let (mut stream, identity): (Box<dyn ReadWrite>, Option<PeerId>) = match wire {
            Wire::Plaintext => (Box::new(tcp), None),
            Wire::Encrypted => {
                let mut s = StreamOwned::new(ServerConnection::new(side.server_tls.clone())?, tcp);
                while s.conn.is_handshaking() {
                    s.conn
                        .complete_io(&mut s.sock)
                        .context("the TLS handshake")?;
                }
                let id = s
                    .conn
                    .peer_certificates()
                    .ok_or_else(|| anyhow!("no client certificate"))
                    .and_then(|c| Ok(tls::peer_id_of(c)?))?;
                (Box::new(s), Some(id))
            }
        };
        let mut token = [0u8; TOKEN_LEN];
        stream.read_exact(&mut token).context("reading the token")?;
        anyhow::Ok((socket, stamp, wire, stream, identity, token))
    };
    let (socket, stamp, wire, mut stream, identity, token) = setup()?;
    let no_offer = || anyhow!("a token that names no offer (or an expired one)");
    let streams = side.streams_of(&token).ok_or_else(no_offer)?;
    let index = if streams > 1 {
        let mut i = [0u8; 1];
        stream
            .read_exact(&mut i)
            .context("reading the connection's index")?;
        usize::from(i[0])
    } else {
        0
    };
    let lock = || side.pending.lock().unwrap_or_else(|e| e.into_inner());
    // The offer's checks under the lock; a failure withdraws the offer.
    {
        let mut pending = lock();
        let p = pending.get(&token).ok_or_else(no_offer)?;
        let checked = if wire != p.wire {
            Err(anyhow!("a {wire:?} connection for a {:?} offer", p.wire))
        } else if identity.is_some_and(|id| id != p.peer) {
            Err(anyhow!(
                "the identity {} for an offer of peer {}",
                identity.expect("checked"),
                p.peer
            ))
        } else if !p.arrived.get(index).is_some_and(Option::is_none) {
            Err(anyhow!(
                "connection {index} of a link of {} connections, or that connection twice",
                p.arrived.len()
            ))
        } else {
            Ok(())
        };
        if let Err(e) = checked {
            pending.remove(&token);
            return Err(e);
        }
    }
    // The answer outside it: the runtime's `answer_offer` takes the lock too, and a write
    // may wait on the far end.
    stream.write_all(b"OK")?;
    stream.flush()?;
    socket.set_read_timeout(None)?;
    socket.set_write_timeout(None)?;
    let mut pending = lock();
    let p = pending.get_mut(&token).ok_or_else(no_offer)?;
    let Some(slot @ None) = p.arrived.get_mut(index) else {
        // Bound by another connection meanwhile: only a sender that misbehaves does that.
        pending.remove(&token);
        bail!("connection {index} of a link twice");
    };
    *slot = Some(Arrived {
        reader: stream.into_reader(),
        socket,
        stamp,
    });
    if p.arrived.iter().any(Option::is_none) {
        return Ok(None);
    }
    let mut p = pending.remove(&token).ok_or_else(no_offer)?;
    let streams = std::mem::take(&mut p.arrived)
        .into_iter()
        .flatten()
        .collect();
    Ok(Some((streams, p)))
}

/// Reads the slices `ranges` of one frame ([`stripes`]) from the link's connections
/// `readers` (their sockets `sockets`) side by side ([`side_by_side`]), connection i's into
/// `buf[ranges[i]]`, or past them with `buf` `None`.
fn read_striped(
    readers: &mut [Box<dyn Read + Send>],
    sockets: &[TcpStream],
    ranges: &[Range<usize>],
    buf: Option<&mut [u8]>,
) -> std::io::Result<()> {
    /// Reads `len` bytes of `r` into `into`, or past them.
    fn read_part(r: &mut dyn Read, len: usize, into: Option<&mut [u8]>) -> std::io::Result<()> {
        match into {
            Some(b) => r.read_exact(b),
            None => match std::io::copy(&mut r.take(len as u64), &mut std::io::sink())? {
                m if m == len as u64 => Ok(()),
                _ => Err(std::io::ErrorKind::UnexpectedEof.into()),
            },
        }
    }
    let mut rest = buf;
    let jobs = readers.iter_mut().zip(ranges).map(|(r, range)| {
        let len = range.len();
        let into = rest.take().map(|b| {
            let (part, after) = b.split_at_mut(len);
            rest = Some(after);
            part
        });
        move || read_part(&mut **r, len, into)
    });
    side_by_side(sockets, jobs)
}

/// The reading thread of one TCP link (its connections `streams`, in order): frames to
/// [`deliver`] until the link stops (a stream ends or the goodbye's count is complete).
fn read_frames(streams: Vec<Arrived>, p: Pending, rt: tokio::runtime::Handle) {
    let Pending {
        conn,
        state,
        events,
        max_payload_bytes,
        pool,
        ..
    } = p;
    let _reading = rt.block_on(state.lock()).reading();
    let limit = FRAME_HEADER_LEN as u64 + max_payload_bytes as u64;
    let ended = |why: String| ended_early(&rt, &conn, &state, &events, why);
    let count = streams.len();
    let (mut readers, mut sockets, mut stamps) = (Vec::new(), Vec::new(), Vec::new());
    for a in streams {
        readers.push(a.reader);
        sockets.push(a.socket);
        stamps.push(a.stamp);
    }
    loop {
        let mut len = [0u8; 8];
        if let Err(e) = readers[0].read_exact(&mut len) {
            return ended(e.to_string());
        }
        let first_byte = Instant::now();
        let first_stamp = stamps[0].load(Ordering::Relaxed);
        // Without the kernel's timestamps, the bytes already waiting (one more system call a
        // frame). On an encrypted link this counts ciphertext, and misses what TLS has
        // buffered already (at most a record or two): close enough for a rate.
        let waiting = (first_stamp == 0).then(|| waiting_bytes(&sockets[0]).unwrap_or(0));
        let (n, over) = striping::split_prefix(u64::from_le_bytes(len));
        if over == 0 || over > count {
            return ended(format!(
                "a frame said to come over {over} connections of a link of {count}"
            ));
        }
        // A length no buffer could hold is read past on connection 0 alone (its slices
        // could not be computed); a link of several then loses step and breaks on its next
        // frame, as it should with a sender that lies.
        let ranges = match usize::try_from(n) {
            Ok(n) => stripes(n, over),
            Err(_) => vec![0..usize::MAX],
        };
        let frame = if n > limit {
            // Read past it: the frames after it still arrive.
            match read_striped(&mut readers, &sockets, &ranges, None) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return ended(format!("the stream ended within a {n}-byte frame"))
                }
                Err(e) => return ended(e.to_string()),
            }
            Err(anyhow!(
                "a {n}-byte frame exceeds the limit of {limit} bytes"
            ))
        } else {
            let mut buf = pool.take(n as usize);
            // One read for all that is left of the frame (a slice of it per connection),
            // into a buffer not zeroed first (`read_to_end` zeroed each 100 MB buffer: 12% of
            // a link's samples).
            match read_striped(&mut readers, &sockets, &ranges, Some(&mut buf)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return ended(format!("the stream ended within a {n}-byte frame"))
                }
                Err(e) => return ended(e.to_string()),
            }
            let last_stamp = stamps[..ranges.len()]
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .max()
                .unwrap_or(0);
            check(&buf, max_payload_bytes).map(|header| {
                let transfer = match waiting {
                    None => stamped_time(n, first_stamp, last_stamp),
                    Some(waiting) => transfer_time(n, waiting, first_byte.elapsed()),
                };
                (header, pool.freeze(buf), transfer)
            })
        };
        let done = rt.block_on(async {
            let mut st = state.lock().await;
            !deliver(frame, &mut st, &events, &conn).await || st.complete()
        });
        if done {
            return;
        }
    }
}

/// How long a TCP link that ended before its goodbye waits for its QUIC connection's close
/// ([`ended_early`]): the far end's close travels with its TCP streams' end, a few
/// round-trips at most; a dead process sends none, and its loss is reported that much later.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A TCP link's stream ended or broke (`why`) before the goodbye's count was complete. If
/// the link's QUIC connection is still open, the sender's process died (its kernel closed
/// the socket; its QUIC connection would only go silent) or the connection was cut:
/// reported as [`NetEvent::Lost`] now instead of after the peer timeout. If the QUIC
/// connection closed first, the link ended with it and QUIC's own report stands.
fn ended_early(
    rt: &tokio::runtime::Handle,
    conn: &Connection,
    state: &tokio::sync::Mutex<Receiving>,
    events: &mpsc::Sender<NetEvent>,
    why: String,
) {
    // The far end closes the link's QUIC connection before it shuts the TCP streams: its
    // close, if it comes, says why (a process that took this one for departed closes with
    // its own code), so it is waited for a little before the end is taken for a death.
    // (The timer is made inside the runtime: block_on enters it.)
    let _ = rt.block_on(async { tokio::time::timeout(CLOSE_WAIT, conn.closed()).await });
    if conn.close_reason().is_some() {
        return;
    }
    let (peer, incarnation, complete) = {
        let st = rt.block_on(state.lock());
        (st.peer, st.incarnation, st.complete())
    };
    if complete {
        return;
    }
    debug!(
        peer,
        "TCP link from peer {peer} ended before its goodbye: {why}"
    );
    let _ = events.blocking_send(NetEvent::Lost {
        peer,
        incarnation,
        reason: format!(
            "TCP link from peer {peer} ended before its goodbye ({why}): its process exited \
             or the connection was cut"
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plane::quic::crypto_provider;

    #[test]
    fn a_host_answers_while_nothing_it_was_sent_waits_long_for_an_answer() {
        let view = |established, unanswered, data_unanswered, ms| TcpView {
            established,
            unanswered,
            data_unanswered,
            since_ack: Duration::from_millis(ms),
        };
        // A paused process: zero-window probes answered, long gaps between answers.
        assert_eq!(view(true, false, false, 8_000).host(), Host::Answers);
        // A live link retransmitting once: the answer comes soon.
        assert_eq!(view(true, true, true, 300).host(), Host::Answers);
        // A probe unanswered for a second: silent (a paused peer's can be, rate-limited).
        assert_eq!(view(true, true, false, 1_000).host(), Host::Silent);
        // A vanished host: retransmitted data unanswered for a second and more.
        assert_eq!(view(true, true, true, 1_000).host(), Host::Gone);
        // Closed by a FIN, a reset or the kernel's keep-alive timeout.
        assert_eq!(view(false, false, false, 0).host(), Host::Gone);
    }

    /// The kernel's view of real loopback connections: a far end that never reads (a
    /// paused process: its kernel acknowledges until the window is full, then answers the
    /// probes) still answers after several seconds; one that closed does not.
    #[test]
    fn the_kernel_says_a_far_end_that_stopped_reading_answers_and_a_closed_one_does_not() {
        use crate::plane::liveness::host;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let probe = LinkProbe::default();
        assert_eq!(host(&probe), Host::Unknown);
        let tcp = TcpStream::connect(addr).unwrap();
        keep_alive(&tcp).unwrap();
        let (far, _) = listener.accept().unwrap();
        probe.set(Far::Tcp(tcp.try_clone().unwrap())).unwrap();
        assert_eq!(host(&probe), Host::Answers);
        // Fill the far end's window: writes stop once it is full.
        tcp.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut tcp_w = &tcp;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            let _ = tcp_w.write(&chunk);
            std::thread::sleep(Duration::from_millis(20));
        }
        let view = tcp_view(&tcp).unwrap();
        assert!(view.established, "{view:?}");
        assert_eq!(host(&probe), Host::Answers, "{view:?}");
        drop(far);
        let t0 = Instant::now();
        while host(&probe) == Host::Answers {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{:?}",
                tcp_view(&tcp)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(host(&probe), Host::Gone);
    }

    /// The next refusal reported within 10 s.
    async fn refusal(events: &mut mpsc::Receiver<NetEvent>) -> String {
        loop {
            let e = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("an event within 10 s")
                .expect("the data plane is running");
            if let NetEvent::Refused { peer: None, reason } = e {
                return reason;
            }
        }
    }

    /// Two data planes linked over QUIC (`a`'s sends to `b`'s), a third identity
    /// (`stranger`), and `b`'s TCP listener: what the offer tests dial.
    struct Offers {
        a: Keypair,
        stranger: Keypair,
        b_id: PeerId,
        sender: crate::plane::DataPlane,
        _sender_events: mpsc::Receiver<NetEvent>,
        receiver: crate::plane::DataPlane,
        tcp_addr: SocketAddr,
    }

    impl Offers {
        /// The fixture and the receiver's events.
        fn new() -> (Offers, mpsc::Receiver<NetEvent>) {
            let (a, b, stranger) = (
                Keypair::generate_ed25519(),
                Keypair::generate_ed25519(),
                Keypair::generate_ed25519(),
            );
            let (sender, _sender_events, receiver, events) = crate::plane::tests::quic_pair(&a, &b);
            let tcp_addr = SocketAddr::new(receiver.local_addr.ip(), receiver.tcp_port());
            let t = Offers {
                a,
                stranger,
                b_id: b.public().to_peer_id(),
                sender,
                _sender_events,
                receiver,
                tcp_addr,
            };
            (t, events)
        }

        /// A new link (one offer per connection: each ask on its own); dropping it says
        /// goodbye and closes its connection.
        async fn link(&self) -> crate::plane::Link {
            let to = (self.receiver.local_addr, self.b_id);
            self.sender.connect((1, 1), to.0, to.1).await.unwrap()
        }

        /// A TCP connection to the listener under `key` presenting `token` (and `index`, on
        /// a link of several) on a link of `wire`: whether it was bound.
        fn dial(
            &self,
            key: &Keypair,
            token: [u8; TOKEN_LEN],
            wire: Wire,
            index: Option<u8>,
        ) -> tokio::task::JoinHandle<anyhow::Result<()>> {
            let config = Arc::new(tls::client_config(key, self.b_id, crypto_provider()).unwrap());
            let addr = self.tcp_addr;
            tokio::task::spawn_blocking(move || {
                dial(TcpStream::connect(addr)?, wire, &token, index, config).map(|_| ())
            })
        }
    }

    /// Asks for a TCP link of `streams` connections on `conn`: the receiver's answer.
    async fn ask(
        conn: &Connection,
        wire: Wire,
        streams: u8,
    ) -> anyhow::Result<(u16, [u8; TOKEN_LEN])> {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&offer_message(wire, streams)).await?;
        send.finish()?;
        parse_answer(&recv.read_to_end(1024).await?)
    }

    /// A TCP connection to the listener is bound to a link only by a token the receiver
    /// gave that link's authenticated QUIC connection, and on an encrypted link only under
    /// that connection's identity: a made-up token, a real token under another identity,
    /// a token used twice and a plaintext offer to an encrypted receiver are all refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tcp_connections_without_an_offer_or_under_another_identity_are_refused() {
        let (t, mut events) = Offers::new();
        let (a, stranger) = (&t.a, &t.stranger);
        let dial_as = |key: &Keypair, token, wire| t.dial(key, token, wire, None);

        // A made-up token, in clear and under TLS with a member's identity.
        for wire in [Wire::Plaintext, Wire::Encrypted] {
            assert!(dial_as(a, [9; TOKEN_LEN], wire).await.unwrap().is_err());
            let why = refusal(&mut events).await;
            assert!(why.contains("names no offer"), "{why}");
        }

        // A real offer's token, presented under another identity.
        let (port, token) = ask(&t.link().await.conn, Wire::Encrypted, 1).await.unwrap();
        assert_eq!(port, t.receiver.tcp_port());
        assert!(dial_as(stranger, token, Wire::Encrypted)
            .await
            .unwrap()
            .is_err());
        let why = refusal(&mut events).await;
        assert!(why.contains("identity"), "{why}");
        // Used once: the rightful owner cannot use it after.
        assert!(dial_as(a, token, Wire::Encrypted).await.unwrap().is_err());
        assert!(refusal(&mut events).await.contains("names no offer"));

        // A connection in clear for an encrypted offer.
        let (_, token) = ask(&t.link().await.conn, Wire::Encrypted, 1).await.unwrap();
        assert!(dial_as(a, token, Wire::Plaintext).await.unwrap().is_err());
        assert!(refusal(&mut events).await.contains("Plaintext connection"));

        // Plaintext asked of an encrypted receiver.
        let c = t.link().await;
        let e = ask(&c.conn, Wire::Plaintext, 1).await.unwrap_err();
        assert!(e.to_string().contains("plaintext"), "{e}");
        // And a second offer on one connection.
        let e = ask(&c.conn, Wire::Encrypted, 1).await.unwrap_err();
        assert!(e.to_string().contains("a transport already"), "{e}");
    }

    /// On a link of several connections, each must carry the offer's token, under the
    /// offer's identity, with an index the offer has room for, once: a stranger's
    /// connection, an index out of range and an index used twice are refused, and each
    /// refusal withdraws the offer (the connections already bound with it are dropped, and
    /// its token binds nothing after).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_connection_of_a_striped_link_is_checked() {
        let (t, mut events) = Offers::new();
        let (a, stranger) = (&t.a, &t.stranger);
        let dial_as =
            |key: &Keypair, token, index| t.dial(key, token, Wire::Encrypted, Some(index));

        // Connection 0 bound; a stranger's connection 1 withdraws the offer.
        let (_, token) = ask(&t.link().await.conn, Wire::Encrypted, 3).await.unwrap();
        dial_as(a, token, 0).await.unwrap().unwrap();
        assert!(dial_as(stranger, token, 1).await.unwrap().is_err());
        assert!(refusal(&mut events).await.contains("identity"));
        assert!(dial_as(a, token, 2).await.unwrap().is_err());
        assert!(refusal(&mut events).await.contains("names no offer"));

        // An index out of range, and one used twice.
        let (_, token) = ask(&t.link().await.conn, Wire::Encrypted, 2).await.unwrap();
        assert!(dial_as(a, token, 2).await.unwrap().is_err());
        assert!(refusal(&mut events)
            .await
            .contains("connection 2 of a link of 2"));
        let (_, token) = ask(&t.link().await.conn, Wire::Encrypted, 2).await.unwrap();
        dial_as(a, token, 1).await.unwrap().unwrap();
        assert!(dial_as(a, token, 1).await.unwrap().is_err());
        assert!(refusal(&mut events).await.contains("that connection twice"));

        // An offer of more connections than a link may have.
        let e = ask(&t.link().await.conn, Wire::Encrypted, MAX_STREAMS + 1)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("connections (1 to 16)"), "{e}");
    }

    #[test]
    fn a_frame_is_cut_into_contiguous_slices_from_one_mib_on() {
        // Under STRIPE_FROM, or one connection: whole, on connection 0.
        assert_eq!(stripes(STRIPE_FROM - 1, 4), vec![0..STRIPE_FROM - 1]);
        assert_eq!(stripes(100 << 20, 1), vec![0..100 << 20]);
        assert_eq!(stripes(0, 3), vec![0..0]);
        for (len, n) in [(STRIPE_FROM, 2), (100_000_036, 3), ((7 << 20) + 5, 16)] {
            let r = stripes(len, n);
            assert_eq!(r.len(), n);
            assert_eq!(r[0].start, 0);
            assert_eq!(r[n - 1].end, len);
            assert!(r.windows(2).all(|w| w[0].end == w[1].start), "{r:?}");
            let (min, max) = (
                r.iter().map(|x| x.len()).min().unwrap(),
                r.iter().map(|x| x.len()).max().unwrap(),
            );
            assert!(max - min <= 1, "{r:?}");
        }
    }

    #[test]
    fn offers_parse_and_bad_ones_are_refused() {
        for (wire, n) in [
            (Wire::Encrypted, 1),
            (Wire::Plaintext, 1),
            (Wire::Encrypted, 4),
        ] {
            assert_eq!(parse_offer(&offer_message(wire, n)).unwrap(), (wire, n));
        }
        // One connection reads as the offers before striping did: the tag and the wire.
        assert_eq!(offer_message(Wire::Plaintext, 1), b"TCP1\x01");
        assert!(parse_offer(b"TCP1\x00\x00").is_err());
        assert!(parse_offer(b"TCP1\x00\x11").is_err());
        assert!(parse_offer(b"TCP1").is_err());
        assert!(parse_offer(b"TCP1\x00\x02\x00").is_err());
    }

    /// A frame written across several connections reads back whole, and one read past
    /// leaves the next frame's bytes where they were, over real loopback sockets.
    #[test]
    fn a_frame_cut_across_connections_reads_back_whole() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut writers, mut sockets) = (Vec::new(), Vec::new());
        let (mut readers, mut far) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (r, _) = l.accept().unwrap();
            sockets.push(w.try_clone().unwrap());
            writers.push(Box::new(w) as Box<dyn Write + Send>);
            far.push(r.try_clone().unwrap());
            readers.push(Box::new(r) as Box<dyn Read + Send>);
        }
        let first: Vec<u8> = (0..(3 << 20) + 7).map(|i| (i % 251) as u8).collect();
        let second: Vec<u8> = (0..STRIPE_FROM + 1).map(|i| (i % 13) as u8).collect();
        // Over 3, 2 and 1 of the 3 connections, as a sender under `auto` may choose: the
        // prefix says which.
        let writer = std::thread::spawn(move || {
            for (f, k) in [(&first, 3), (&second, 2), (&first, 1)] {
                write_striped(&mut writers, &sockets, f, k).unwrap();
            }
            first
        });
        let mut len = [0u8; 8];
        // The first frame read past, the second read, the third read.
        readers[0].read_exact(&mut len).unwrap();
        let (n, k) = striping::split_prefix(u64::from_le_bytes(len));
        assert_eq!(k, 3);
        read_striped(&mut readers, &far, &stripes(n as usize, k), None).unwrap();
        let mut got = Vec::new();
        for want in [2, 1] {
            readers[0].read_exact(&mut len).unwrap();
            let (n, k) = striping::split_prefix(u64::from_le_bytes(len));
            assert_eq!(k, want);
            let mut buf = vec![0u8; n as usize];
            read_striped(&mut readers, &far, &stripes(n as usize, k), Some(&mut buf)).unwrap();
            got.push(buf);
        }
        let first = writer.join().unwrap();
        assert_eq!(got[0].len(), STRIPE_FROM + 1);
        assert!(got[0].iter().enumerate().all(|(i, &b)| b == (i % 13) as u8));
        assert_eq!(got[1], first);
    }

    #[test]
    fn a_frame_found_waiting_is_timed_by_the_bytes_that_arrived_while_it_was_read() {
        let ms = Duration::from_millis;
        // Nothing waiting: the time as measured.
        assert_eq!(transfer_time(1 << 20, 0, ms(10)), Some(ms(10)));
        // Three quarters waiting: the last quarter took 10 ms, so the frame takes 40 ms.
        assert_eq!(transfer_time(1 << 20, 3 << 18, ms(10)), Some(ms(40)));
        // All of it (or all but a few bytes) waiting: no sample.
        assert_eq!(transfer_time(1 << 20, 1 << 20, ms(1)), None);
        assert_eq!(transfer_time(1 << 20, (1 << 20) - 100, ms(1)), None);
        assert_eq!(
            transfer_time(1000, 0, ms(1)),
            None,
            "a small frame says nothing"
        );
    }

    #[test]
    fn reads_record_when_the_kernel_received_the_bytes_not_when_they_were_read() {
        let now_ns = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        };
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut b = Stamped::new(b);
        // The kernel turns receive timestamps on for the whole system when a first socket
        // asks, and may do so a moment later (a deferred static key): the bytes that
        // arrive before carry none. Wait for stamps to flow.
        let t = Instant::now();
        let mut one = [0u8; 1];
        while b.stamp.load(Ordering::Relaxed) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the kernel gives no timestamps"
            );
            a.write_all(&[1]).unwrap();
            b.read_exact(&mut one).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = now_ns();
        a.write_all(&[7; 1000]).unwrap();
        // Read well after the bytes arrived: the stamp is their arrival, not this read.
        std::thread::sleep(Duration::from_millis(50));
        let read_at = now_ns();
        let mut buf = [0u8; 1000];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [7; 1000]);
        let stamp = b.stamp.load(Ordering::Relaxed);
        assert!(
            stamp >= before && stamp + 40_000_000 < read_at,
            "stamp {stamp}, written after {before}, read at {read_at}"
        );
        // Writes pass through.
        b.write_all(b"ok").unwrap();
        let mut ok = [0u8; 2];
        a.read_exact(&mut ok).unwrap();
        assert_eq!(&ok, b"ok");
    }

    #[test]
    fn a_frame_is_timed_by_the_stamps_of_its_first_and_last_bytes() {
        let ms = |m: u64| m * 1_000_000;
        assert_eq!(
            stamped_time(1 << 20, ms(100), ms(140)),
            Some(Duration::from_millis(40))
        );
        // No stamps, stamps that do not increase, or a frame too short to say: none.
        assert_eq!(stamped_time(1 << 20, 0, ms(140)), None);
        assert_eq!(stamped_time(1 << 20, ms(140), ms(140)), None);
        assert_eq!(stamped_time(1 << 20, ms(150), ms(140)), None);
        assert_eq!(stamped_time(1000, ms(100), ms(140)), None);
    }

    #[test]
    fn the_kernel_says_how_many_bytes_wait_in_a_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        assert_eq!(waiting_bytes(&b), Some(0));
        a.write_all(&[1; 5000]).unwrap();
        let t = Instant::now();
        while waiting_bytes(&b) != Some(5000) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(waiting_bytes(&b), Some(5000));
    }

    #[test]
    fn answers_parse_and_bad_ones_are_refused() {
        let mut ok = b"OK".to_vec();
        ok.extend_from_slice(&4242u16.to_le_bytes());
        ok.extend_from_slice(&[7; TOKEN_LEN]);
        assert_eq!(parse_answer(&ok).unwrap(), (4242, [7; TOKEN_LEN]));
        assert!(parse_answer(&ok[..ok.len() - 1]).is_err());
        let e = parse_answer(b"NOplaintext refused").unwrap_err();
        assert!(e.to_string().contains("plaintext refused"), "{e}");
        assert!(parse_answer(b"??").is_err());
        assert!(Wire::from_byte(2).is_err());
    }

    #[test]
    fn a_frame_is_its_length_then_its_bytes_whatever_the_writer_takes_at_once() {
        /// A writer that takes at most 3 bytes a call.
        struct Trickle(Vec<u8>);
        impl Write for Trickle {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let n = b.len().min(3);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let frame: Vec<u8> = (0..20).collect();
        let mut w = Trickle(Vec::new());
        write_prefixed(&mut w, Some(frame.len() as u64), &frame).unwrap();
        assert_eq!(&w.0[..8], &20u64.to_le_bytes());
        assert_eq!(&w.0[8..], frame.as_slice());
        let mut v = Vec::new();
        write_prefixed(&mut v, Some(frame.len() as u64), &frame).unwrap();
        assert_eq!(v, w.0);
    }
}
