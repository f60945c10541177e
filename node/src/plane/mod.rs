//! The data plane: bulk parameter frames on our own QUIC endpoint (quinn).
//!
//! One connection per destination peer, one unidirectional stream per frame. Every frame
//! starts with the 24-byte [`FrameHeader`]; the receiver reads and checks the header
//! (magic, version, kind, declared length ≤ limit) before it allocates for the payload.
//! Received frames and connection losses reach the training loop through one bounded
//! channel of [`NetEvent`]s.
//!
//! Connections are mutually authenticated with the peers' libp2p identities
//! ([`crate::control::auth`]): a client accepts only the `PeerId` it dials, a server only `PeerId`s
//! admitted to the run, and each incoming connection is bound to its peer's rank from the
//! start — a frame on it that claims another sender is refused. Connections that fail
//! authentication are refused and reported ([`NetEvent::Refused`]).
//!
//! Shutdown without losing frames: after its last frame a sender sends a `Bye` frame whose
//! payload is the number of frames it sent before on that connection. The receiver closes
//! the connection (application code 0) once it has read that many frames, and the sender
//! counts its link as finished when it sees that close.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use bytes::Bytes;
use libp2p::identity::Keypair;
use libp2p::PeerId;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::Rank;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, TransportConfig, VarInt};
use tokio::sync::mpsc;
use tracing::warn;

use crate::control::auth::{self, Admitted};

/// UDP socket buffer size requested from the OS (measured: ~1 GB/s on loopback with 4 MiB).
pub const UDP_BUFFER_BYTES: usize = 4 << 20;
/// Frames queued per destination before `send` waits.
const SEND_QUEUE: usize = 8;
/// Events queued towards the training loop before the network waits (QUIC flow control
/// then slows the senders down).
const EVENT_QUEUE: usize = 256;
/// Server name in the pinned certificates.
const SERVER_NAME: &str = "murmur-peer";

/// Something the data plane reports to the training loop.
#[derive(Debug)]
pub enum NetEvent {
    /// A complete frame (header and payload) from peer `from`.
    Frame {
        /// Sender, bound to the connection by its first frame.
        from: Rank,
        /// Parsed header.
        header: FrameHeader,
        /// The whole frame.
        bytes: Bytes,
    },
    /// Peer `from` said goodbye and all its frames were delivered.
    Finished {
        /// The peer.
        from: Rank,
    },
    /// Our link to `to` was closed by the receiver after our `Bye`: everything arrived.
    LinkDone {
        /// The destination.
        to: Rank,
    },
    /// A connection to or from `peer` failed before the goodbye.
    Lost {
        /// The peer.
        peer: Rank,
        /// What happened.
        reason: String,
    },
    /// The bootstrap admitted a new peer into an empty rank of the running run (peer 0
    /// only; see [`crate::control::discovery`]).
    Joined {
        /// Its rank.
        rank: Rank,
        /// Its identity.
        peer_id: libp2p::PeerId,
        /// Its data-plane address.
        data_addr: SocketAddr,
    },
    /// A frame was refused (malformed, wrong sender…); the connection stays up.
    Refused {
        /// The sender if known.
        peer: Option<Rank>,
        /// What was wrong.
        reason: String,
    },
}

/// Our QUIC endpoint with our identity.
pub struct DataPlane {
    endpoint: Endpoint,
    /// Address peers dial.
    pub local_addr: SocketAddr,
    /// Our identity: client certificates are made from it.
    key: Keypair,
    events: mpsc::Sender<NetEvent>,
    transport: Arc<TransportConfig>,
    rank: Rank,
    /// Applied to the links opened by [`DataPlane::connect`] from then on.
    pub emulation: LinkEmulation,
    inbound: Inbound,
}

impl DataPlane {
    /// A sender into this data plane's event stream (for the control plane's news).
    pub fn event_sender(&self) -> mpsc::Sender<NetEvent> {
        self.events.clone()
    }

    /// Sets the rank this plane's frames are sent as: for a peer that learns its rank from
    /// the bootstrap after binding. Links opened before keep the old one.
    pub fn set_rank(&mut self, rank: Rank) {
        self.rank = rank;
    }
}

/// A slower network emulated inside the transport, per outgoing link (the kernel here has
/// no `netem`): frames leave at most at `rate` (a pacer: frame k may start only when the
/// frames before it would have finished at that rate, so a link's throughput is
/// min(rate, what the machine achieves)) and each one is written `latency` later (one-way
/// delay; frames overlap in flight). Off by default. It can only slow a link down. The
/// pacer's waits use tokio's 1 ms timer, but it schedules from where the link would be
/// free, not from when a wait ended, so the long-run rate is exact; the delay sleeps on a
/// blocking-pool thread, accurate to about 0.1 ms. `murmur netbench` measures both.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkEmulation {
    /// Link rate in bytes per second; `None`: unlimited.
    pub rate_bytes_per_sec: Option<f64>,
    /// One-way delay added to every frame.
    pub latency: Duration,
}

impl LinkEmulation {
    /// Whether the links are left as they are.
    pub fn is_off(&self) -> bool {
        self.rate_bytes_per_sec.is_none() && self.latency.is_zero()
    }

    /// Seconds frame of `bytes` bytes occupies the link at the emulated rate (0 without one).
    fn occupancy(&self, bytes: usize) -> Duration {
        match self.rate_bytes_per_sec {
            Some(r) => Duration::from_secs_f64(bytes as f64 / r),
            None => Duration::ZERO,
        }
    }
}

/// A link to one destination peer.
pub struct Link {
    to: Rank,
    tx: mpsc::Sender<Bytes>,
    conn: Connection,
}

/// Incoming connections by the peer they are bound to (by their first frame), oldest first.
type Inbound = Arc<std::sync::Mutex<HashMap<Rank, Vec<Connection>>>>;

/// Application close code of a connection this side gave up (its peer left the run, or it
/// is not admitted).
const ABANDONED: u32 = 2;
/// How long an incoming connection waits for the directory before it is refused.
const ADMISSION_WAIT: Duration = Duration::from_secs(120);

/// Transport settings of every data-plane connection; `idle_timeout` is how long a silent
/// connection lives (keep-alives every third of it, at most every 2 s).
fn transport_config(idle_timeout: Duration) -> TransportConfig {
    let mut t = TransportConfig::default();
    // Windows large enough that a multi-MB parameter frame is not flow-control bound.
    t.stream_receive_window(VarInt::from_u32(64 << 20));
    t.receive_window(VarInt::from_u32(256 << 20));
    t.send_window(256 << 20);
    t.max_concurrent_uni_streams(VarInt::from_u32(1024));
    t.max_concurrent_bidi_streams(VarInt::from_u32(0));
    t.keep_alive_interval(Some((idle_timeout / 3).min(Duration::from_secs(2))));
    t.max_idle_timeout(Some(
        VarInt::from_u64(idle_timeout.as_millis() as u64)
            .unwrap_or(VarInt::MAX)
            .into(),
    ));
    t
}

impl DataPlane {
    /// Binds peer `rank`'s QUIC endpoint at `addr` (port 0: any free port) with a certificate
    /// of its identity `key`; incoming connections are accepted from `admitted` peers only
    /// (filled in once the directory is known). Frames whose declared payload exceeds
    /// `max_payload_bytes` are refused before allocation; a connection silent for
    /// `peer_timeout` is reported as [`NetEvent::Lost`]. Returns the receiver of all
    /// [`NetEvent`]s.
    ///
    /// Must be called inside a tokio runtime.
    pub fn bind(
        rank: Rank,
        addr: SocketAddr,
        max_payload_bytes: u32,
        peer_timeout: Duration,
        key: &Keypair,
        admitted: Admitted,
    ) -> anyhow::Result<(DataPlane, mpsc::Receiver<NetEvent>)> {
        let transport = Arc::new(transport_config(peer_timeout));
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(
            auth::server_config(key, crypto_provider())?,
        )?));
        server.transport_config(transport.clone());

        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        // Best effort: the OS may cap the size (net.core.rmem_max); QUIC still works.
        let _ = socket.set_recv_buffer_size(UDP_BUFFER_BYTES);
        let _ = socket.set_send_buffer_size(UDP_BUFFER_BYTES);
        socket
            .bind(&addr.into())
            .with_context(|| format!("cannot bind the data-plane address {addr} (port in use?)"))?;
        let socket: std::net::UdpSocket = socket.into();
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )?;
        let local_addr = endpoint.local_addr()?;
        let (events, rx) = mpsc::channel(EVENT_QUEUE);
        let inbound = Inbound::default();
        tokio::spawn(accept_loop(
            endpoint.clone(),
            events.clone(),
            max_payload_bytes,
            inbound.clone(),
            admitted,
        ));
        Ok((
            DataPlane {
                endpoint,
                local_addr,
                key: key.clone(),
                events,
                transport,
                rank,
                emulation: LinkEmulation::default(),
                inbound,
            },
            rx,
        ))
    }

    /// Connects to peer `to` at `addr`, which must prove the identity `peer_id`, and starts
    /// its sender task.
    pub async fn connect(
        &self,
        to: Rank,
        addr: SocketAddr,
        peer_id: PeerId,
    ) -> anyhow::Result<Link> {
        let tls = auth::client_config(&self.key, peer_id, crypto_provider())?;
        let mut client = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
        client.transport_config(self.transport.clone());
        let conn = tokio::time::timeout(
            Duration::from_secs(10),
            self.endpoint.connect_with(client, addr, SERVER_NAME)?,
        )
        .await
        .map_err(|_| anyhow!("timed out connecting to peer {to} at {addr}"))?
        .with_context(|| format!("connecting to peer {to} at {addr}"))?;
        let (tx, rx) = mpsc::channel(SEND_QUEUE);
        tokio::spawn(send_loop(
            self.rank,
            to,
            conn.clone(),
            rx,
            self.events.clone(),
            self.emulation,
        ));
        Ok(Link { to, tx, conn })
    }

    /// Closes the incoming connections from `peer` (which left the run) without reporting
    /// them lost; with `keep_newest`, all but the most recent one (a restarted peer's new
    /// connection, over which it said hello).
    pub fn forget(&self, peer: Rank, keep_newest: bool) {
        let mut inbound = self.inbound.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conns) = inbound.get_mut(&peer) {
            let keep = if keep_newest { conns.pop() } else { None };
            for c in conns.drain(..) {
                c.close(VarInt::from_u32(ABANDONED), b"peer left");
            }
            conns.extend(keep);
        }
    }

    /// Closes the endpoint and waits (at most `grace`) for the close to reach the peers.
    pub async fn shutdown(&self, grace: Duration) {
        self.endpoint.close(VarInt::from_u32(0), b"done");
        let _ = tokio::time::timeout(grace, self.endpoint.wait_idle()).await;
    }
}

impl Link {
    /// Gives the link up (its peer left the run): the connection is closed at once, with
    /// no goodbye and no [`NetEvent::Lost`].
    pub fn abandon(self) {
        self.conn.close(VarInt::from_u32(ABANDONED), b"peer left");
    }

    /// Queues one frame; waits while the link's queue is full.
    pub async fn send(&self, frame: Bytes) -> anyhow::Result<()> {
        self.tx
            .send(frame)
            .await
            .map_err(|_| anyhow!("the link to peer {} is closed", self.to))
    }
}

/// Whether this side closed `conn` (it gave the link up, or the endpoint shut down): its
/// errors are then expected and not reported.
fn closed_here(conn: &Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(quinn::ConnectionError::LocallyClosed)
    )
}

/// Reports a failed write on the link to `to` as [`NetEvent::Lost`], unless this side
/// closed the connection.
async fn send_failed(
    events: &mpsc::Sender<NetEvent>,
    to: Rank,
    conn: &Connection,
    e: anyhow::Error,
) {
    if closed_here(conn) {
        return;
    }
    let _ = events
        .send(NetEvent::Lost {
            peer: to,
            reason: format!("sending to peer {to} failed: {e}"),
        })
        .await;
}

/// Writes one frame on its own unidirectional stream.
async fn write_frame(conn: &Connection, frame: &[u8]) -> anyhow::Result<()> {
    let mut s = conn.open_uni().await?;
    s.write_all(frame).await?;
    s.finish()?;
    Ok(())
}

/// AES-GCM first (it has hardware support here and measured faster than ChaCha20).
fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| match s.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        _ => 2,
    });
    Arc::new(p)
}

async fn send_loop(
    me: Rank,
    to: Rank,
    conn: Connection,
    mut rx: mpsc::Receiver<Bytes>,
    events: mpsc::Sender<NetEvent>,
    emulation: LinkEmulation,
) {
    let mut sent: u64 = 0;
    // With emulation: when the emulated link is free again, and the frames in flight.
    let mut link_free = tokio::time::Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    while let Some(frame) = rx.recv().await {
        let result = if emulation.is_off() {
            write_frame(&conn, &frame).await
        } else {
            // tokio's timers tick in milliseconds: sleep only when there is a wait.
            let now = tokio::time::Instant::now();
            let start = link_free.max(now);
            if start > now {
                tokio::time::sleep_until(start).await;
            }
            link_free = start + emulation.occupancy(frame.len());
            let (conn, latency) = (conn.clone(), emulation.latency);
            in_flight.spawn(async move {
                if !latency.is_zero() {
                    // tokio's timer rounds up to its next 1 ms tick (measured +1.3 ms at
                    // 2 ms); a blocking-pool thread's sleep is accurate to ~0.1 ms.
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(latency)).await;
                }
                write_frame(&conn, &frame).await
            });
            // Collect what has finished; report the first failure.
            let mut r = Ok(());
            while let Some(done) = in_flight.try_join_next() {
                r = r.and(done.map_err(anyhow::Error::from).and_then(|w| w));
            }
            r
        };
        if let Err(e) = result {
            return send_failed(&events, to, &conn, e).await;
        }
        sent += 1;
    }
    // Every frame is written before the goodbye that counts them.
    while let Some(done) = in_flight.join_next().await {
        if let Err(e) = done.map_err(anyhow::Error::from).and_then(|w| w) {
            return send_failed(&events, to, &conn, e).await;
        }
    }
    // The training loop dropped its handle: say goodbye, then wait for the receiver to
    // close the connection once it has read everything.
    let bye = async {
        let mut s = conn.open_uni().await?;
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
        FrameHeader {
            kind: FrameKind::Bye,
            sender: me,
            round: 0,
            dim: 0,
            payload_len: 8,
        }
        .emit(&mut f);
        f.extend_from_slice(&sent.to_le_bytes());
        s.write_all(&f).await?;
        s.finish()?;
        anyhow::Ok(())
    };
    if let Err(e) = bye.await {
        return send_failed(&events, to, &conn, e.context("saying goodbye")).await;
    }
    let reason = conn.closed().await;
    let event = match reason {
        quinn::ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(0) => {
            NetEvent::LinkDone { to }
        }
        _ if closed_here(&conn) => return,
        other => NetEvent::Lost {
            peer: to,
            reason: format!("connection to peer {to}: {other}"),
        },
    };
    let _ = events.send(event).await;
}

async fn accept_loop(
    endpoint: Endpoint,
    events: mpsc::Sender<NetEvent>,
    max_payload_bytes: u32,
    inbound: Inbound,
    admitted: Admitted,
) {
    while let Some(incoming) = endpoint.accept().await {
        let events = events.clone();
        let inbound = inbound.clone();
        let admitted = admitted.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => return refuse_connection(&events, remote, e.to_string()).await,
            };
            // The handshake checked the certificate; bind the connection to its rank.
            let peer = conn
                .peer_identity()
                .and_then(|id| {
                    id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                        .ok()
                })
                .and_then(|certs| auth::peer_id_of(&certs).ok());
            let rank = match peer {
                Some(p) => admitted.rank_when_known(&p, ADMISSION_WAIT).await,
                None => None,
            };
            match rank {
                Some(rank) => {
                    serve_connection(conn, rank, events, max_payload_bytes, inbound).await
                }
                None => {
                    conn.close(VarInt::from_u32(ABANDONED), b"not admitted");
                    let who = peer.map_or("no identity".to_string(), |p| format!("peer {p}"));
                    let why = format!("{who} is not admitted to this run");
                    refuse_connection(&events, remote, why).await;
                }
            }
        });
    }
}

/// Reports a refused incoming connection (failed authentication, or not admitted).
async fn refuse_connection(events: &mpsc::Sender<NetEvent>, remote: SocketAddr, why: String) {
    warn!(%remote, "refused a data-plane connection: {why}");
    let _ = events
        .send(NetEvent::Refused {
            peer: None,
            reason: format!("connection from {remote} refused: {why}"),
        })
        .await;
}

/// Per-connection receive state: who the sender is and how many frames arrived.
struct Receiving {
    peer: Option<Rank>,
    received: u64,
    expected: Option<u64>,
}

async fn serve_connection(
    conn: Connection,
    rank: Rank,
    events: mpsc::Sender<NetEvent>,
    max_payload_bytes: u32,
    inbound: Inbound,
) {
    inbound
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(rank)
        .or_default()
        .push(conn.clone());
    let state = Arc::new(tokio::sync::Mutex::new(Receiving {
        peer: Some(rank),
        received: 0,
        expected: None,
    }));
    loop {
        let mut stream = match conn.accept_uni().await {
            Ok(s) => s,
            Err(e) => {
                let st = state.lock().await;
                let done = st.expected.is_some_and(|n| st.received >= n) || closed_here(&conn);
                if let (Some(peer), false) = (st.peer, done) {
                    let _ = events
                        .send(NetEvent::Lost {
                            peer,
                            reason: format!("connection from peer {peer}: {e}"),
                        })
                        .await;
                }
                return;
            }
        };
        let events = events.clone();
        let state = state.clone();
        let conn = conn.clone();
        tokio::spawn(async move {
            let frame = async {
                let mut head = [0u8; FRAME_HEADER_LEN];
                stream
                    .read_exact(&mut head)
                    .await
                    .map_err(|e| anyhow!("reading a frame header: {e}"))?;
                let header = FrameHeader::parse_prefix(&head, max_payload_bytes)?;
                let mut buf = vec![0u8; FRAME_HEADER_LEN + header.payload_len as usize];
                buf[..FRAME_HEADER_LEN].copy_from_slice(&head);
                stream
                    .read_exact(&mut buf[FRAME_HEADER_LEN..])
                    .await
                    .map_err(|e| anyhow!("reading a {}-byte payload: {e}", header.payload_len))?;
                anyhow::Ok((header, Bytes::from(buf)))
            }
            .await;
            let mut st = state.lock().await;
            // Every stream but the goodbye counts towards the sender's announced frame count,
            // refused or not, so that a refused frame cannot hold the shutdown up. `refused`
            // is (reason, whether the stream was a counted frame).
            let refused: Option<(String, bool)> = match frame {
                Err(e) => Some((format!("{e:#}"), true)),
                Ok((header, bytes)) => match st.peer {
                    // The connection is bound to the rank its certificate proves.
                    Some(p) if p != header.sender => Some((
                        format!(
                            "frame claims sender {} on peer {p}'s connection",
                            header.sender
                        ),
                        true,
                    )),
                    _ => {
                        if header.kind == FrameKind::Bye {
                            let count = bytes
                                .get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + 8)
                                .and_then(|b| b.try_into().ok())
                                .map(u64::from_le_bytes);
                            match count {
                                Some(n) => {
                                    st.expected = Some(n);
                                    None
                                }
                                None => Some(("malformed goodbye".to_string(), false)),
                            }
                        } else {
                            st.received += 1;
                            let from = header.sender;
                            let delivered = events
                                .send(NetEvent::Frame {
                                    from,
                                    header,
                                    bytes,
                                })
                                .await;
                            if delivered.is_err() {
                                return; // the training loop is gone
                            }
                            None
                        }
                    }
                },
            };
            if let Some((reason, counted)) = refused {
                warn!(peer = ?st.peer, "refused frame: {reason}");
                if counted {
                    st.received += 1;
                }
                let _ = events
                    .send(NetEvent::Refused {
                        peer: st.peer,
                        reason,
                    })
                    .await;
            }
            if let (Some(from), true) = (st.peer, st.expected.is_some_and(|n| st.received >= n)) {
                let _ = events.send(NetEvent::Finished { from }).await;
                conn.close(VarInt::from_u32(0), b"done");
            }
        });
    }
}

/// Outgoing links by destination rank.
pub type Links = HashMap<Rank, Link>;

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(sender: Rank) -> Bytes {
        let mut f = Vec::new();
        FrameHeader {
            kind: FrameKind::Gossip,
            sender,
            round: 0,
            dim: 1,
            payload_len: 4,
        }
        .emit(&mut f);
        f.extend_from_slice(&[0; 4]);
        Bytes::from(f)
    }

    /// The next event within 10 s.
    async fn next(events: &mut mpsc::Receiver<NetEvent>) -> NetEvent {
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an event within 10 s")
            .expect("the data plane is running")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_admitted_identities_may_connect_and_each_only_as_itself() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let timeout = Duration::from_secs(5);
        let (server_key, member, stranger) = (
            Keypair::generate_ed25519(),
            Keypair::generate_ed25519(),
            Keypair::generate_ed25519(),
        );
        let admitted = Admitted::default();
        admitted.admit_all([(member.public().to_peer_id(), 5)]);
        let (server, mut events) =
            DataPlane::bind(1, any, 1 << 20, timeout, &server_key, admitted).unwrap();
        let server_id = server_key.public().to_peer_id();

        // A stranger's connection is refused and counted; nothing it sends arrives.
        let (outsider, _e) =
            DataPlane::bind(7, any, 1 << 20, timeout, &stranger, Admitted::default()).unwrap();
        if let Ok(link) = outsider.connect(1, server.local_addr, server_id).await {
            let _ = link.send(frame(7)).await;
        }
        match next(&mut events).await {
            NetEvent::Refused { peer: None, reason } => {
                assert!(reason.contains("refused"), "{reason}")
            }
            other => panic!("expected a refused connection, got {other:?}"),
        }

        // A member that dials an identity other than the server's gives up itself.
        let (client, _e) =
            DataPlane::bind(5, any, 1 << 20, timeout, &member, Admitted::default()).unwrap();
        let wrong = stranger.public().to_peer_id();
        assert!(client.connect(1, server.local_addr, wrong).await.is_err());

        // The member's connection is bound to its rank: its frames arrive from 5, and one
        // that claims to come from peer 6 is refused.
        let link = client
            .connect(1, server.local_addr, server_id)
            .await
            .unwrap();
        link.send(frame(5)).await.unwrap();
        link.send(frame(6)).await.unwrap();
        let (mut from_5, mut refused_6) = (false, false);
        while !(from_5 && refused_6) {
            match next(&mut events).await {
                NetEvent::Frame { from: 5, .. } => from_5 = true,
                NetEvent::Refused {
                    peer: Some(5),
                    reason,
                } if reason.contains("claims sender 6") => refused_6 = true,
                // The failed dial above may be reported by the server as well.
                NetEvent::Refused { peer: None, .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
