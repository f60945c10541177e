//! The data plane: bulk parameter frames between peers, on our own transports.
//!
//! Every link (one per destination peer) is a QUIC connection (quinn, [`quic`]); between
//! peers on one host its frames travel through a shared-memory ring instead ([`shm`],
//! set up over the connection by [`local_link`]) unless `--transport quic` is given. The
//! transports meet at one seam, [`send::FrameTransport`]: the sending half of a link
//! ([`send`]: queue, emulation, goodbye) and the receiving half ([`receive`]: checks,
//! counting, delivery) are the same for both. Every frame starts with the 24-byte
//! [`FrameHeader`]; the receiver checks the header (magic, version, kind, declared length ≤
//! limit) before it allocates for the payload, on both transports. Received frames and
//! connection losses reach the training loop through one bounded channel of [`NetEvent`]s.
//!
//! Connections are mutually authenticated with the peers' libp2p identities
//! ([`tls`]): a client accepts only the `PeerId` it dials, a server only `PeerId`s
//! admitted to the run, and each incoming connection is bound to its peer's rank from the
//! start — a frame on it (or on the ring it offered) that claims another sender is refused.
//! Connections that fail authentication are refused and reported ([`NetEvent::Refused`]).
//! A link whose direct path does not open (NATs) can go through a reachable member's
//! [`relay`], which forwards its datagrams: still one end-to-end QUIC connection,
//! authenticated the same way.
//! The QUIC connection is also every link's liveness, whichever transport carries the
//! frames: a peer whose connection brings nothing for the peer timeout is reported lost
//! ([`liveness`]; the handshake has its own, longer bound).
//!
//! Shutdown without losing frames: after its last frame a sender sends a `Bye` frame whose
//! payload is the number of frames it sent before on that link. The receiver closes the
//! connection (application code 0) once it has read that many frames, and the sender
//! counts its link as finished when it sees that close.

mod liveness;
mod local_link;
pub(crate) mod process;
mod quic;
mod receive;
pub mod relay;
pub mod send;
pub mod shm;
pub mod striping;
pub mod tcp;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use libp2p::identity::Keypair;
use libp2p::PeerId;
use murmur_gossip::frame::FrameHeader;
use murmur_gossip::Rank;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, TransportConfig, VarInt};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info};

use quic::{accept_loop, crypto_provider, transport_config, QuicFrames};
use send::send_loop;

pub use liveness::{keep_alive_interval, Host, Timeouts};
pub use tcp::Wire;
use tcp::{TcpFrames, TcpSide};
use tls::Admitted;

/// UDP socket buffer size requested from the OS (measured: ~1 GB/s on loopback with 4 MiB).
pub const UDP_BUFFER_BYTES: usize = 4 << 20;
/// Frames queued per destination before `send` waits. The frames are the state machine's
/// own reference-counted buffers, so a queued frame costs no copy; the queue must hold a
/// round's frames and the next's, or the training loop waits on a busy link instead of
/// mixing what arrives: D-PSGD streamed in parts ([`murmur_gossip::mixing::streaming`])
/// queues up to two rounds of parts per link (25 parts a round for a 100 MB model at the
/// default 4 MB), and measured 1.3× slower with 8 here than with whole messages.
const SEND_QUEUE: usize = 1024;
/// Events queued towards the training loop before the network waits (QUIC flow control
/// then slows the senders down).
const EVENT_QUEUE: usize = 256;
/// Server name in the pinned certificates (TCP links).
const SERVER_NAME: &str = "murmur-peer";

/// A peer process's incarnation number: which process of a rank this is. Every process
/// picks one at start, larger than any earlier process of its rank picked (microseconds
/// since the Unix epoch, [`Incarnation::now`], unless its supervisor sets
/// `MURMUR_INCARNATION`), and states it in its directory entry, its hello, its rejoin notice
/// and every data-plane connection it opens (the TLS server name of the QUIC handshake,
/// `p<incarnation>.murmur`, which the client's handshake signature covers); the process it
/// dials answers which incarnation it is (the first stream, [`quic::ask_incarnation`]), and
/// the link carries that one, not the directory's. A departure
/// notice names the incarnations it is about ([`crate::control::membership`]), so a notice
/// about a rank's old process never closes its new process's connections. 0: unknown.
pub type Incarnation = u64;

/// [`Incarnation`] of this process: `MURMUR_INCARNATION` if a supervisor set it, else the
/// microseconds since the Unix epoch (monotonic across a rank's restarts as long as the
/// hosts' clocks do not step back by more than the time between them).
pub fn incarnation_now() -> Incarnation {
    std::env::var("MURMUR_INCARNATION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_micros() as u64)
        })
}

/// The TLS server name a client of incarnation `i` dials with.
fn incarnation_name(i: Incarnation) -> String {
    format!("p{i}.murmur")
}

/// The incarnation in a server name made by [`incarnation_name`].
fn parse_incarnation_name(name: &str) -> Option<Incarnation> {
    name.strip_prefix('p')?
        .strip_suffix(".murmur")?
        .parse()
        .ok()
}

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
        /// Seconds from the frame's first byte (its header read) to its last on a QUIC
        /// stream: the link's transfer time of the frame, what per-link choices measure
        /// bandwidth from ([`murmur_gossip::Gossip::observe_link`]). `None` on a
        /// shared-memory ring.
        transfer: Option<std::time::Duration>,
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
        /// The incarnation of the peer's process at the other end of that connection.
        incarnation: Incarnation,
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
    /// `peer`'s process of incarnation `incarnation` exited, as its supervisor saw
    /// ([`Exits`]; sent by the supervisor's listener, not by the data plane).
    Exited {
        /// The peer.
        peer: Rank,
        /// The incarnation of the process that exited.
        incarnation: Incarnation,
        /// What happened.
        reason: String,
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
    quic_config: Arc<TransportConfig>,
    /// Silences after which a connection's peer is reported lost ([`liveness`]).
    timeouts: liveness::Timeouts,
    rank: Rank,
    /// This process's incarnation, stated on every connection it opens.
    incarnation: Incarnation,
    /// Applied to the links opened by [`DataPlane::connect`] from then on.
    pub emulation: LinkEmulation,
    /// The transports of the links opened by [`DataPlane::connect`] from then on.
    pub transport: TransportChoice,
    /// How the TCP links this plane opens are protected ([`DataPlane::set_wire`]).
    wire: Wire,
    /// TCP connections of each TCP link this plane opens (`--tcp-streams`, 1 to
    /// [`tcp::MAX_STREAMS`], or `auto`): a frame of at least [`tcp::STRIPE_FROM`] bytes is
    /// cut across them (under `auto`, as many as the sender finds pay).
    pub tcp_streams: striping::TcpStreams,
    /// The TCP listener and its pending offers ([`tcp`]).
    tcp: Arc<TcpSide>,
    inbound: Inbound,
    /// Processes known to have exited: a link being opened to one is given up.
    exits: Arc<Exits>,
    /// The endpoint's UDP socket, shared with quinn: relay registrations leave from it, so
    /// that they open the same NAT mapping as the link's QUIC packets ([`relay`]).
    raw: Arc<std::net::UdpSocket>,
    /// The acknowledgements of incoming links' goodbyes ([`DataPlane::hold_acknowledgements`]).
    acks: receive::HeldAcks,
}

/// The peer processes known to have exited (from a supervisor's notices), by rank: the
/// newest such incarnation of each. [`DataPlane::connect`] gives up a link to such a
/// process at once, even one it is already opening, instead of waiting for the
/// handshake's or the peer timeout.
#[derive(Debug, Default)]
pub struct Exits {
    dead: std::sync::Mutex<HashMap<Rank, Incarnation>>,
    changed: tokio::sync::Notify,
}

impl Exits {
    /// Rank `rank`'s process of incarnation `incarnation` (and every older one) exited.
    pub fn mark(&self, rank: Rank, incarnation: Incarnation) {
        let mut dead = self.dead.lock().unwrap_or_else(|e| e.into_inner());
        let i = dead.entry(rank).or_insert(0);
        *i = (*i).max(incarnation);
        drop(dead);
        self.changed.notify_waiters();
    }

    /// Whether `rank`'s process of `incarnation` is known to have exited.
    pub fn is_dead(&self, (rank, incarnation): (Rank, Incarnation)) -> bool {
        let dead = self.dead.lock().unwrap_or_else(|e| e.into_inner());
        dead.get(&rank).is_some_and(|&i| incarnation <= i)
    }

    /// Resolves once `rank`'s process of `incarnation` is known to have exited.
    async fn exited(&self, who: (Rank, Incarnation)) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_dead(who) {
                return;
            }
            changed.await;
        }
    }
}

impl DataPlane {
    /// The processes known to have exited, shared with whoever learns of exits (the
    /// supervisor's listener).
    pub fn exits(&self) -> Arc<Exits> {
        self.exits.clone()
    }

    /// How long its connections' peers are waited for ([`liveness`]).
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// A sender into this data plane's event stream (for the control plane's news).
    pub fn event_sender(&self) -> mpsc::Sender<NetEvent> {
        self.events.clone()
    }

    /// Sets the rank this plane's frames are sent as: for a peer that learns its rank from
    /// the bootstrap after binding. Links opened before keep the old one.
    pub fn set_rank(&mut self, rank: Rank) {
        self.rank = rank;
    }

    /// This process's incarnation ([`incarnation_now`] when bound).
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Sets how TCP links are protected, both ways: the links this plane opens ask for
    /// `wire`, and incoming plaintext links are accepted only with [`Wire::Plaintext`] (a
    /// link is plaintext only when both ends say so).
    pub fn set_wire(&mut self, wire: Wire) {
        self.wire = wire;
        self.tcp.plaintext_ok.store(
            wire == Wire::Plaintext,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Says that this peer is behind a NAT: TCP offers to it are refused at once (the
    /// sender's dial could not reach its port), so its incoming links stay on QUIC.
    pub fn set_behind_nat(&self, behind: bool) {
        self.tcp
            .behind_nat
            .store(behind, std::sync::atomic::Ordering::Relaxed);
    }

    /// The port of the TCP listener (on the data plane's address).
    pub fn tcp_port(&self) -> u16 {
        self.tcp.port()
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

/// Which transports links may use (`--transport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportChoice {
    /// Shared memory to peers on this host (when both ends can map the ring), TCP to peers
    /// on other hosts that the link reached directly (when the receiver's TCP port answers
    /// within 3 s and it is not behind a NAT), QUIC otherwise (relayed links, NATs); each
    /// fallback is logged.
    #[default]
    Auto,
    /// QUIC on every link.
    Quic,
    /// TCP on every direct link, this host's included; a link whose TCP connection cannot
    /// be set up fails (relayed links stay QUIC).
    Tcp,
}

/// The transport a link's frames use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// QUIC streams.
    Quic,
    /// A shared-memory ring (same host).
    SharedMemory,
    /// A TCP stream, TLS 1.3 inside it.
    Tcp,
    /// A TCP stream in clear (both ends asked, `--wire plaintext`).
    TcpPlaintext,
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkKind::Quic => "QUIC",
            LinkKind::SharedMemory => "shared memory",
            LinkKind::Tcp => "TCP (TLS)",
            LinkKind::TcpPlaintext => "TCP (plaintext)",
        })
    }
}

/// A link to one destination peer.
pub struct Link {
    to: Rank,
    /// The incarnation of the process at `to` that this link was opened to.
    incarnation: Incarnation,
    tx: mpsc::Sender<Bytes>,
    conn: Connection,
    /// The transport its frames use.
    pub kind: LinkKind,
    /// The relay port its datagrams go through, if the direct path did not open
    /// ([`relay`]).
    pub relayed: Option<SocketAddr>,
}

/// Incoming connections by the peer they are bound to, oldest first, each with the
/// incarnation of the process that opened it.
type Inbound = Arc<std::sync::Mutex<HashMap<Rank, Vec<(Incarnation, Connection)>>>>;

/// Whether `inbound` holds a connection from peer `from`.
fn has_inbound(inbound: &Inbound, from: Rank) -> bool {
    let inbound = inbound.lock().unwrap_or_else(|e| e.into_inner());
    inbound.get(&from).is_some_and(|c| !c.is_empty())
}

/// Application close code of a connection this side gave up (its peer is not admitted, an
/// older process, or broke its ring).
const ABANDONED: u32 = 2;

/// Application close code of a connection this side gave up because it took the process at
/// the far end for departed (its silence or exit, a departure notice, a newer process of its
/// rank): a far process that still lives learns from it that the run goes on without it
/// ([`DataPlane::cut_off_by`]), and tells it from a neighbour that died.
const CUT_OFF: u32 = 3;

/// Whether the far end of `conn` closed it with [`CUT_OFF`].
fn closed_as_cut_off(conn: &Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == VarInt::from_u32(CUT_OFF)
    )
}

impl DataPlane {
    /// Binds peer `rank`'s QUIC endpoint at `addr` (port 0: any free port) with a certificate
    /// of its identity `key`; incoming connections are accepted from `admitted` peers only
    /// (filled in once the directory is known). Frames whose declared payload exceeds
    /// `max_payload_bytes` are refused before allocation; an established connection silent
    /// for the peer timeout of `timeouts` (a [`liveness::Timeouts`], or the peer timeout
    /// alone) is reported as [`NetEvent::Lost`], or for the paused timeout if its host still
    /// answers on the link's TCP connection (a handshake may take up to
    /// [`liveness::HANDSHAKE_TIMEOUT`] or the peer timeout, whichever is longer). Returns the
    /// receiver of all [`NetEvent`]s.
    ///
    /// Must be called inside a tokio runtime.
    pub fn bind(
        rank: Rank,
        addr: SocketAddr,
        max_payload_bytes: u32,
        timeouts: impl Into<liveness::Timeouts>,
        key: &Keypair,
        admitted: Admitted,
    ) -> anyhow::Result<(DataPlane, mpsc::Receiver<NetEvent>)> {
        let timeouts = timeouts.into();
        let quic_config = Arc::new(transport_config(timeouts));
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(
            tls::server_config(key, crypto_provider())?,
        )?));
        server.transport_config(quic_config.clone());

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
        let raw = Arc::new(socket.try_clone()?);
        let endpoint = Endpoint::new(
            quic::endpoint_config(),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )?;
        let local_addr = endpoint.local_addr()?;
        let (events, rx) = mpsc::channel(EVENT_QUEUE);
        let pool = receive::BufferPool::default();
        let tcp = TcpSide::bind(
            local_addr.ip(),
            local_addr.port(),
            key,
            crypto_provider(),
            events.clone(),
            pool.clone(),
        )?;
        let inbound = Inbound::default();
        let acks = receive::HeldAcks::default();
        let incarnation = incarnation_now();
        let serving = quic::Serving {
            events: events.clone(),
            max_payload_bytes,
            timeouts,
            inbound: inbound.clone(),
            tcp: tcp.clone(),
            pool,
            acks: acks.clone(),
            incarnation,
        };
        tokio::spawn(accept_loop(endpoint.clone(), admitted, serving));
        Ok((
            DataPlane {
                endpoint,
                local_addr,
                key: key.clone(),
                events,
                quic_config,
                timeouts,
                rank,
                incarnation,
                emulation: LinkEmulation::default(),
                transport: TransportChoice::default(),
                wire: Wire::default(),
                tcp_streams: striping::TcpStreams::default(),
                tcp,
                inbound,
                exits: Arc::default(),
                raw,
                acks,
            },
            rx,
        ))
    }

    /// Connects to peer `to` at `addr`, which must prove the identity `peer_id`, and starts
    /// its sender task. A peer on this host gets a shared-memory ring (with
    /// [`TransportChoice::Auto`]); if it cannot map it, the link stays on QUIC and the
    /// reason is logged. `incarnation`: that of the process at `addr` as known here (its
    /// losses are reported with it).
    pub async fn connect(
        &self,
        (to, incarnation): (Rank, Incarnation),
        addr: SocketAddr,
        peer_id: PeerId,
    ) -> anyhow::Result<Link> {
        self.connect_via((to, incarnation), addr, peer_id, false)
            .await
    }

    /// Connects to peer `to` (identity `peer_id`) through the relay port of `allocation`
    /// ([`relay`]): registers there as the dialer (every 250 ms until the connection is up)
    /// and dials the port. The link is QUIC, end to end; peer `to` must register as the
    /// listener ([`DataPlane::expect_relayed`]).
    ///
    /// # Errors
    /// A malformed token, or the connection does not open within 10 s.
    pub async fn connect_relayed(
        &self,
        to: (Rank, Incarnation),
        allocation: &relay::Allocation,
        peer_id: PeerId,
    ) -> anyhow::Result<Link> {
        allocation.token_bytes()?;
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = up.clone();
        tokio::spawn(relay::keep_registered(
            self.raw.clone(),
            allocation.clone(),
            relay::Role::Dialer,
            Duration::from_millis(250),
            Duration::from_secs(15),
            move || done.load(std::sync::atomic::Ordering::Relaxed),
        ));
        let link = self.connect_via(to, allocation.addr, peer_id, true).await;
        up.store(true, std::sync::atomic::Ordering::Relaxed);
        link.with_context(|| format!("through the relay at {}", allocation.addr))
    }

    /// Registers as the listener of the relayed link from peer `from` ([`relay`]): every
    /// second, until a connection from `from` (relayed or direct) is up, for at most
    /// `limit`. Returns at once; the registrations run as a task.
    ///
    /// # Errors
    /// A malformed token.
    pub fn expect_relayed(
        &self,
        from: Rank,
        allocation: &relay::Allocation,
        limit: Duration,
    ) -> anyhow::Result<()> {
        allocation.token_bytes()?;
        let inbound = self.inbound.clone();
        tokio::spawn(relay::keep_registered(
            self.raw.clone(),
            allocation.clone(),
            relay::Role::Listener,
            Duration::from_secs(1),
            limit,
            move || has_inbound(&inbound, from),
        ));
        Ok(())
    }

    /// Whether a connection from peer `from` has been accepted.
    pub fn has_inbound(&self, from: Rank) -> bool {
        has_inbound(&self.inbound, from)
    }

    /// [`DataPlane::connect`], through a relay port at `addr` if `relayed` (always QUIC);
    /// given up as soon as the destination process is known to have exited ([`Exits`]).
    async fn connect_via(
        &self,
        (to, incarnation): (Rank, Incarnation),
        addr: SocketAddr,
        peer_id: PeerId,
        relayed: bool,
    ) -> anyhow::Result<Link> {
        tokio::select! {
            link = self.open_link((to, incarnation), addr, peer_id, relayed) => link,
            () = self.exits.exited((to, incarnation)) => Err(anyhow!(
                "peer {to}'s process (incarnation {incarnation}) at {addr} exited while its \
                 link was being opened"
            )),
        }
    }

    /// [`DataPlane::connect_via`] without the watch on exits.
    async fn open_link(
        &self,
        (to, incarnation): (Rank, Incarnation),
        addr: SocketAddr,
        peer_id: PeerId,
        relayed: bool,
    ) -> anyhow::Result<Link> {
        let tls = tls::client_config(&self.key, peer_id, crypto_provider())?;
        let mut client = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
        client.transport_config(self.quic_config.clone());
        let conn = tokio::time::timeout(
            Duration::from_secs(10),
            self.endpoint
                .connect_with(client, addr, &incarnation_name(self.incarnation))?,
        )
        .await
        .map_err(|_| anyhow!("timed out connecting to peer {to} at {addr}"))?
        .with_context(|| format!("connecting to peer {to} at {addr}"))?;
        let incarnation = reached_incarnation(&conn, (to, incarnation), addr).await?;
        let probe = liveness::LinkProbe::default();
        tokio::spawn(liveness::report_when_silent(
            conn.clone(),
            self.timeouts,
            self.events.clone(),
            (to, incarnation),
            (None, probe.clone()),
        ));
        let (tx, rx) = mpsc::channel(SEND_QUEUE);
        let (me, events, emulation) = (self.rank, self.events.clone(), self.emulation);
        let to_inc = (to, incarnation);
        let kind = match self
            .other_transport((to, addr, peer_id), &conn, relayed, &probe)
            .await?
        {
            Other::Ring(ring) => {
                tokio::spawn(send_loop(
                    me,
                    to_inc,
                    conn.clone(),
                    ring,
                    rx,
                    events,
                    emulation,
                ));
                LinkKind::SharedMemory
            }
            Other::Tcp(tcp) => {
                tokio::spawn(send_loop(
                    me,
                    to_inc,
                    conn.clone(),
                    tcp,
                    rx,
                    events,
                    emulation,
                ));
                match self.wire {
                    Wire::Encrypted => LinkKind::Tcp,
                    Wire::Plaintext => LinkKind::TcpPlaintext,
                }
            }
            Other::None => {
                let quic = QuicFrames::new(conn.clone());
                tokio::spawn(send_loop(
                    me,
                    to_inc,
                    conn.clone(),
                    quic,
                    rx,
                    events,
                    emulation,
                ));
                LinkKind::Quic
            }
        };
        let relayed = relayed.then_some(addr);
        Ok(Link {
            to,
            incarnation,
            tx,
            conn,
            kind,
            relayed,
        })
    }

    /// The transport other than QUIC that the link to `to` (at `addr`, identity
    /// `peer_id`, over `conn`) takes by [`TransportChoice`]: a ring to this host, TCP to a
    /// direct destination (its connection put in `probe`, for [`liveness`]), none (QUIC)
    /// for a relayed one or when the choice's attempt failed (logged) under
    /// [`TransportChoice::Auto`].
    ///
    /// # Errors
    /// Under [`TransportChoice::Tcp`], the TCP link could not be set up.
    async fn other_transport(
        &self,
        (to, addr, peer_id): (Rank, SocketAddr, PeerId),
        conn: &Connection,
        relayed: bool,
        probe: &liveness::LinkProbe,
    ) -> anyhow::Result<Other> {
        let here = local_link::same_host(addr);
        let tcp = || {
            tcp::offer(
                conn,
                addr.ip(),
                self.wire,
                self.tcp_streams,
                &self.key,
                peer_id,
                crypto_provider(),
                probe,
            )
        };
        Ok(match self.transport {
            _ if relayed => Other::None,
            TransportChoice::Quic => Other::None,
            TransportChoice::Tcp => {
                Other::Tcp(tcp().await.with_context(|| {
                    format!("a TCP link to peer {to} at {addr} (--transport tcp)")
                })?)
            }
            TransportChoice::Auto if here => match local_link::offer(conn, probe).await {
                Ok(ring) => Other::Ring(ring),
                Err(e) => {
                    info!(
                        to,
                        "the link to peer {to} stays on QUIC: shared memory failed: {e:#}"
                    );
                    Other::None
                }
            },
            TransportChoice::Auto => match tcp().await {
                Ok(t) => Other::Tcp(t),
                Err(e) => {
                    info!(to, "the link to peer {to} stays on QUIC: TCP failed: {e:#}");
                    Other::None
                }
            },
        })
    }

    /// Closes the incoming connections from `peer`'s processes of incarnations below
    /// `before` (they left the run) without reporting them lost, with [`CUT_OFF`]; a newer
    /// process's connections stay open.
    pub fn forget(&self, peer: Rank, before: Incarnation) {
        let mut inbound = self.inbound.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conns) = inbound.get_mut(&peer) {
            conns.retain(|(i, c)| {
                if *i < before {
                    c.close(VarInt::from_u32(CUT_OFF), b"peer left");
                }
                *i >= before
            });
        }
    }

    /// Whether peer `peer` closed an incoming connection of its with [`CUT_OFF`]: it took
    /// this process for departed and goes on without it.
    pub fn cut_off_by(&self, peer: Rank) -> bool {
        let inbound = self.inbound.lock().unwrap_or_else(|e| e.into_inner());
        inbound
            .get(&peer)
            .is_some_and(|conns| conns.iter().any(|(_, c)| closed_as_cut_off(c)))
    }

    /// From now on, an incoming link whose goodbye counted every frame is reported
    /// ([`NetEvent::Finished`]) but not closed — its sender waits — until
    /// [`DataPlane::release_acknowledgements`] says this peer is done with its frames: the
    /// record's keeper acknowledges a peer's goodbye only once that peer's reports
    /// are in the written record. A sender that then sees this process die keeps its reports
    /// for its restarted process instead of having exited with them.
    pub fn hold_acknowledgements(&self) {
        self.acks.hold();
    }

    /// Stops [`DataPlane::hold_acknowledgements`]: every held goodbye is acknowledged now,
    /// later ones at once.
    pub fn stop_holding_acknowledgements(&self) {
        self.acks.stop_holding();
    }

    /// Closes the held incoming links (goodbye acknowledged) of the senders `done` says
    /// this peer is done with; the rest stay held. Cheap when none is held.
    pub fn release_acknowledgements(&self, done: impl FnMut(Rank) -> bool) {
        self.acks.release(done);
    }

    /// Closes the endpoint and waits (at most `grace`) for the close to reach the peers.
    pub async fn shutdown(&self, grace: Duration) {
        self.endpoint.close(VarInt::from_u32(0), b"done");
        let _ = tokio::time::timeout(grace, self.endpoint.wait_idle()).await;
    }
}

impl Link {
    /// The destination's rank.
    pub fn to(&self) -> Rank {
        self.to
    }

    /// The incarnation of the destination's process this link was opened to.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Gives the link up (its peer left the run): the connection is closed at once, with
    /// [`CUT_OFF`], no goodbye and no [`NetEvent::Lost`].
    pub fn abandon(self) {
        self.conn.close(VarInt::from_u32(CUT_OFF), b"peer left");
    }

    /// Whether the destination closed this link with [`CUT_OFF`]: it took this process
    /// for departed.
    pub fn cut_off(&self) -> bool {
        closed_as_cut_off(&self.conn)
    }

    /// Queues one frame; waits while the link's queue is full.
    pub async fn send(&self, frame: Bytes) -> anyhow::Result<()> {
        self.tx
            .send(frame)
            .await
            .map_err(|_| anyhow!("the link to peer {} is closed", self.to))
    }
}

/// The incarnation of peer `to`'s process that `conn` (dialled at `addr`) reached, as that
/// process answers ([`quic::ask_incarnation`]): the link's incarnation from then on.
/// `known`: the newest incarnation of `to` known here (0: none).
///
/// # Errors
/// No answer, or a process older than `known` (a process that has been replaced: the
/// connection is closed).
async fn reached_incarnation(
    conn: &Connection,
    (to, known): (Rank, Incarnation),
    addr: SocketAddr,
) -> anyhow::Result<Incarnation> {
    let reached = quic::ask_incarnation(conn)
        .await
        .with_context(|| format!("connecting to peer {to} at {addr}"))?;
    if reached < known {
        conn.close(VarInt::from_u32(ABANDONED), b"an older process");
        bail!(
            "peer {to} at {addr} is its process of incarnation {reached}, older than the one \
             known here ({known})"
        );
    }
    if reached != known {
        debug!(
            to,
            reached, known, "the link to peer {to} reached a newer process than the one known"
        );
    }
    Ok(reached)
}

/// A link's transport besides its QUIC connection.
enum Other {
    Ring(local_link::ShmFrames),
    Tcp(TcpFrames),
    None,
}

/// Whether this side closed `conn` (it gave the link up, or the endpoint shut down): its
/// errors are then expected and not reported.
fn closed_here(conn: &Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(quinn::ConnectionError::LocallyClosed)
    )
}

/// Outgoing links by destination rank.
pub type Links = HashMap<Rank, Link>;

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_gossip::frame::{FrameKind, FRAME_HEADER_LEN};

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

    /// A sender (peer 0, identity `a`, QUIC only) and a receiver (peer 1, identity `b`, which
    /// admits `a` as peer 0), on 127.0.0.1 with a 5 s peer timeout: (sender, its events,
    /// receiver, its events).
    pub(super) fn quic_pair(
        a: &Keypair,
        b: &Keypair,
    ) -> (
        DataPlane,
        mpsc::Receiver<NetEvent>,
        DataPlane,
        mpsc::Receiver<NetEvent>,
    ) {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let timeout = Duration::from_secs(5);
        let admitted = Admitted::default();
        admitted.admit_all([(a.public().to_peer_id(), 0)]);
        let (mut sender, sender_events) =
            DataPlane::bind(0, any, 1 << 20, timeout, a, Admitted::default()).unwrap();
        sender.transport = TransportChoice::Quic;
        let (receiver, events) = DataPlane::bind(1, any, 1 << 20, timeout, b, admitted).unwrap();
        (sender, sender_events, receiver, events)
    }

    /// The next event within 10 s.
    async fn next(events: &mut mpsc::Receiver<NetEvent>) -> NetEvent {
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an event within 10 s")
            .expect("the data plane is running")
    }

    /// A frame of `len` payload bytes of one value, from `sender`.
    fn sized(sender: Rank, len: usize, fill: u8) -> Bytes {
        let mut f = Vec::new();
        FrameHeader {
            kind: FrameKind::Gossip,
            sender,
            round: len as u64,
            dim: 1,
            payload_len: len as u32,
        }
        .emit(&mut f);
        f.resize(f.len() + len, fill);
        Bytes::from(f)
    }

    /// On every transport (shared memory, QUIC, TCP with TLS, TCP in clear, each TCP one
    /// also over several connections): frames arrive whole, one over the limit and one with
    /// a lying header are refused (counted) and the frames after them still arrive, and the
    /// goodbye finishes both ends. The frames of 1 MiB and more are cut across a striped
    /// link's connections, the refused 7 MiB one too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_transports_deliver_refuse_and_finish_alike() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for (choice, wire, kind, streams) in [
            (
                TransportChoice::Auto,
                Wire::Encrypted,
                LinkKind::SharedMemory,
                "1",
            ),
            (TransportChoice::Quic, Wire::Encrypted, LinkKind::Quic, "1"),
            (TransportChoice::Tcp, Wire::Encrypted, LinkKind::Tcp, "1"),
            (
                TransportChoice::Tcp,
                Wire::Plaintext,
                LinkKind::TcpPlaintext,
                "1",
            ),
            (TransportChoice::Tcp, Wire::Encrypted, LinkKind::Tcp, "3"),
            (
                TransportChoice::Tcp,
                Wire::Plaintext,
                LinkKind::TcpPlaintext,
                "2",
            ),
            (TransportChoice::Tcp, Wire::Encrypted, LinkKind::Tcp, "auto"),
        ] {
            let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
            let admitted = Admitted::default();
            admitted.admit_all([(a.public().to_peer_id(), 0)]);
            let timeout = Duration::from_secs(5);
            let limit = 3 << 20;
            let (mut sender, mut sender_events) =
                DataPlane::bind(0, any, limit, timeout, &a, Admitted::default()).unwrap();
            sender.transport = choice;
            sender.set_wire(wire);
            sender.tcp_streams = streams.parse().unwrap();
            let (mut receiver, mut events) =
                DataPlane::bind(1, any, limit, timeout, &b, admitted).unwrap();
            receiver.set_wire(wire);
            let link = sender
                .connect((1, 1), receiver.local_addr, b.public().to_peer_id())
                .await
                .unwrap();
            assert_eq!(link.kind, kind);
            let kind = format!("{kind} ({streams} connections)");
            let sizes = [0usize, 5, 1 << 20, 3 << 20, 7 << 20, 100];
            for &n in &sizes {
                link.send(sized(0, n, (n % 251) as u8)).await.unwrap();
            }
            // A header that declares fewer bytes than the frame has.
            let mut lying = sized(0, 10, 0).to_vec();
            lying.extend_from_slice(&[1; 10]);
            link.send(Bytes::from(lying)).await.unwrap();
            drop(link);
            let (mut got, mut refused, mut finished) = (Vec::new(), 0, false);
            while !finished {
                match next(&mut events).await {
                    NetEvent::Frame {
                        from: 0,
                        header,
                        bytes,
                        ..
                    } => {
                        let n = header.payload_len as usize;
                        assert_eq!(bytes.len(), FRAME_HEADER_LEN + n);
                        let fill = (n % 251) as u8;
                        assert!(
                            bytes[FRAME_HEADER_LEN..].iter().all(|&b| b == fill),
                            "{kind}"
                        );
                        got.push(n);
                    }
                    NetEvent::Refused { peer: Some(0), .. } => refused += 1,
                    NetEvent::Finished { from: 0 } => finished = true,
                    other => panic!("{kind}: unexpected {other:?}"),
                }
            }
            got.sort();
            assert_eq!(got, [0, 5, 100, 1 << 20, 3 << 20], "{kind}");
            assert_eq!(refused, 2, "{kind}: the 7 MiB frame and the lying one");
            match next(&mut sender_events).await {
                NetEvent::LinkDone { to: 1 } => {}
                other => panic!("{kind}: expected the link done, got {other:?}"),
            }
        }
    }

    /// The sending planes of [`linked_from_two_processes`], kept alive with their events.
    type Senders = Vec<(DataPlane, mpsc::Receiver<NetEvent>)>;

    /// A receiver (rank 1) and a link to it from each of two processes of rank 0 with the
    /// same identity, incarnations 5 and 9 (an old process and its restart), each link
    /// having delivered one frame: the receiver, its events, the two links (oldest first)
    /// and the senders' planes.
    async fn linked_from_two_processes() -> (DataPlane, mpsc::Receiver<NetEvent>, Vec<Link>, Senders)
    {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let timeout = Duration::from_secs(5);
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let admitted = Admitted::default();
        admitted.admit_all([(a.public().to_peer_id(), 0)]);
        let (receiver, mut events) =
            DataPlane::bind(1, any, 1 << 20, timeout, &b, admitted).unwrap();
        let b_id = b.public().to_peer_id();
        let mut links = Vec::new();
        let mut planes = Vec::new();
        for incarnation in [5, 9] {
            let (mut sender, e) =
                DataPlane::bind(0, any, 1 << 20, timeout, &a, Admitted::default()).unwrap();
            sender.transport = TransportChoice::Quic;
            sender.incarnation = incarnation;
            let link = sender
                .connect((1, 1), receiver.local_addr, b_id)
                .await
                .unwrap();
            link.send(frame(0)).await.unwrap();
            assert!(matches!(
                next(&mut events).await,
                NetEvent::Frame { from: 0, .. }
            ));
            links.push(link);
            planes.push((sender, e));
        }
        (receiver, events, links, planes)
    }

    /// A process that the other end takes for departed learns it from the close, not only
    /// that the link ended: the destination forgetting the sender's process (a departure)
    /// makes the sender's link say cut off, and the sender giving its link up makes the
    /// destination's connection from it say so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_link_given_up_on_a_departed_process_says_so_at_its_other_end() {
        let (receiver, _events, mut links, _planes) = linked_from_two_processes().await;
        assert!(links.iter().all(|l| !l.cut_off()));
        assert!(!receiver.cut_off_by(0));
        // The destination takes the process of incarnation 5 for departed.
        receiver.forget(0, 6);
        let old = &links[0];
        tokio::time::timeout(Duration::from_secs(5), old.conn.closed())
            .await
            .expect("the forgotten process's link closes");
        assert!(old.cut_off());
        assert!(!links[1].cut_off());
        // The process of incarnation 9 gives its link up as to a departed peer.
        let new = links.pop().unwrap();
        new.abandon();
        let t0 = std::time::Instant::now();
        while !receiver.cut_off_by(0) {
            assert!(t0.elapsed() < Duration::from_secs(5), "no cut-off seen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every connection states the incarnation of the process that opened it, and
    /// forgetting a peer's processes below an incarnation closes their connections only:
    /// the restarted process's connection (same identity, same rank) keeps delivering.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forgetting_an_old_process_leaves_the_new_one_s_connection_open() {
        let (receiver, mut events, links, _planes) = linked_from_two_processes().await;
        let incarnations = |inbound: &Inbound| -> Vec<Incarnation> {
            let inbound = inbound.lock().unwrap();
            inbound[&0].iter().map(|(i, _)| *i).collect()
        };
        assert_eq!(incarnations(&receiver.inbound), [5, 9]);
        receiver.forget(0, 9);
        assert_eq!(incarnations(&receiver.inbound), [9]);
        // The new process's link still delivers, and the old one's close is not a loss.
        links[1].send(frame(0)).await.unwrap();
        assert!(matches!(
            next(&mut events).await,
            NetEvent::Frame { from: 0, .. }
        ));
        assert!(
            tokio::time::timeout(Duration::from_millis(300), events.recv())
                .await
                .is_err(),
            "nothing else: no loss reported for the forgotten connection"
        );
    }

    /// A link carries the incarnation of the process it reached, as that process answers,
    /// not the one the dialler knew (its directory predates the peer's restart in place, at
    /// the same address); a process older than the newest one known is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_link_carries_the_incarnation_of_the_process_it_reached() {
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let (sender, _e, receiver, mut events) = quic_pair(&a, &b);
        let (b_id, now) = (b.public().to_peer_id(), receiver.incarnation());
        let mut links = Vec::new();
        for known in [0, 1, now] {
            let link = sender
                .connect((1, known), receiver.local_addr, b_id)
                .await
                .unwrap();
            assert_eq!(link.incarnation(), now, "dialled knowing {known}");
            link.send(frame(0)).await.unwrap();
            assert!(matches!(
                next(&mut events).await,
                NetEvent::Frame { from: 0, .. }
            ));
            links.push(link);
        }
        let e = sender
            .connect((1, now + 1), receiver.local_addr, b_id)
            .await
            .err()
            .expect("a process older than the one known is refused");
        assert!(
            format!("{e:#}").contains("older than the one known"),
            "{e:#}"
        );
    }

    /// Path-MTU discovery takes a QUIC link past Ethernet's 1,452-byte packets where the
    /// path carries larger ones (loopback's MTU is 65,536): up to [`quic::MAX_UDP_PAYLOAD`],
    /// which both ends announce.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quic_link_grows_its_packets_where_the_path_carries_them() {
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let (sender, _e, receiver, mut events) = quic_pair(&a, &b);
        let link = sender
            .connect((1, 0), receiver.local_addr, b.public().to_peer_id())
            .await
            .unwrap();
        assert_eq!(link.kind, LinkKind::Quic);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mtu = loop {
            link.send(sized(0, 1 << 20, 7)).await.unwrap();
            assert!(matches!(
                next(&mut events).await,
                NetEvent::Frame { from: 0, .. }
            ));
            let mtu = link.conn.stats().path.current_mtu;
            if mtu == quic::MAX_UDP_PAYLOAD || std::time::Instant::now() > deadline {
                break mtu;
            }
        };
        assert_eq!(mtu, quic::MAX_UDP_PAYLOAD, "the path MTU discovery reached");
    }

    /// A plaintext link needs both ends to ask for it: a plaintext sender to an encrypted
    /// receiver is refused (and `--transport tcp` fails the link with the reason), an
    /// encrypted sender to a plaintext-ready receiver gets TLS.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plaintext_link_only_when_both_ends_ask_for_it() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let timeout = Duration::from_secs(5);
        for (sender_wire, receiver_wire, expect) in [
            (Wire::Plaintext, Wire::Encrypted, None),
            (Wire::Encrypted, Wire::Plaintext, Some(LinkKind::Tcp)),
            (
                Wire::Plaintext,
                Wire::Plaintext,
                Some(LinkKind::TcpPlaintext),
            ),
        ] {
            let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
            let admitted = Admitted::default();
            admitted.admit_all([(a.public().to_peer_id(), 0)]);
            let (mut sender, _e) =
                DataPlane::bind(0, any, 1 << 20, timeout, &a, Admitted::default()).unwrap();
            sender.transport = TransportChoice::Tcp;
            sender.set_wire(sender_wire);
            let (mut receiver, _events) =
                DataPlane::bind(1, any, 1 << 20, timeout, &b, admitted).unwrap();
            receiver.set_wire(receiver_wire);
            let link = sender
                .connect((1, 1), receiver.local_addr, b.public().to_peer_id())
                .await;
            match (link, expect) {
                (Ok(link), Some(kind)) => assert_eq!(link.kind, kind),
                (Err(e), None) => {
                    let e = format!("{e:#}");
                    assert!(
                        e.contains("plaintext") && e.contains("--transport tcp"),
                        "{e}"
                    )
                }
                (Ok(link), None) => panic!("a {} link", link.kind),
                (Err(e), Some(_)) => panic!("{e:#}"),
            }
        }
    }

    /// Through the relay: the listener's connection comes from the relay port, frames
    /// arrive whole, the goodbye finishes both ends, and the identities are still checked
    /// end to end (dialling the relay expecting another identity fails).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relayed_link_delivers_finishes_and_authenticates_like_a_direct_one() {
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let any = SocketAddr::new(lo, 0);
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let admitted = Admitted::default();
        admitted.admit_all([(a.public().to_peer_id(), 0)]);
        let timeout = Duration::from_secs(5);
        let (sender, mut sender_events) =
            DataPlane::bind(0, any, 2 << 20, timeout, &a, Admitted::default()).unwrap();
        let (receiver, mut events) =
            DataPlane::bind(1, any, 2 << 20, timeout, &b, admitted).unwrap();
        let relay = relay::Relay::new(lo, lo);
        let allocation = relay.allocate(0, 1).unwrap();
        receiver
            .expect_relayed(0, &allocation, Duration::from_secs(30))
            .unwrap();
        let stranger = Keypair::generate_ed25519().public().to_peer_id();
        assert!(sender
            .connect_relayed((1, 1), &allocation, stranger)
            .await
            .is_err());
        let link = sender
            .connect_relayed((1, 1), &allocation, b.public().to_peer_id())
            .await
            .unwrap();
        assert_eq!(link.relayed, Some(allocation.addr));
        assert_eq!(
            link.kind,
            LinkKind::Quic,
            "a relayed link is never shared memory"
        );
        for n in [5usize, 1 << 20] {
            link.send(sized(0, n, 3)).await.unwrap();
        }
        drop(link);
        let mut got = Vec::new();
        loop {
            match next(&mut events).await {
                NetEvent::Frame {
                    from: 0,
                    header,
                    bytes,
                    ..
                } => {
                    assert!(bytes[FRAME_HEADER_LEN..].iter().all(|&b| b == 3));
                    got.push(header.payload_len as usize);
                }
                NetEvent::Finished { from: 0 } => break,
                // The connection that expected another identity.
                NetEvent::Refused { peer: None, .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(got, [5, 1 << 20]);
        let remotes: Vec<SocketAddr> = receiver.inbound.lock().unwrap()[&0]
            .iter()
            .map(|(_, c)| c.remote_address())
            .collect();
        assert_eq!(
            remotes,
            [allocation.addr],
            "the connection came through the relay"
        );
        match next(&mut sender_events).await {
            NetEvent::LinkDone { to: 1 } => {}
            other => panic!("expected the link done, got {other:?}"),
        }
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
        if let Ok(link) = outsider.connect((1, 1), server.local_addr, server_id).await {
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
        assert!(client
            .connect((1, 1), server.local_addr, wrong)
            .await
            .is_err());

        // The member's connection is bound to its rank: its frames arrive from 5, and one
        // that claims to come from peer 6 is refused.
        let link = client
            .connect((1, 1), server.local_addr, server_id)
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

    /// A UDP path that can be cut: datagrams between a client and `server` pass while
    /// `open` is set and are dropped while it is not (a host that vanished, a cable pulled).
    /// Returns the address the client dials.
    async fn cuttable_path(
        server: SocketAddr,
        open: Arc<std::sync::atomic::AtomicBool>,
    ) -> SocketAddr {
        use std::sync::atomic::Ordering::Relaxed;
        let front = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let back = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        back.connect(server).await.unwrap();
        let addr = front.local_addr().unwrap();
        let client = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
        let (f, b, c, o) = (front.clone(), back.clone(), client.clone(), open.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = f.recv_from(&mut buf).await {
                *c.lock().unwrap() = Some(from);
                if o.load(Relaxed) {
                    let _ = b.send(&buf[..n]).await;
                }
            }
        });
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = back.recv(&mut buf).await {
                let to = *client.lock().unwrap();
                if let (true, Some(to)) = (open.load(Relaxed), to) {
                    let _ = front.send_to(&buf[..n], to).await;
                }
            }
        });
        addr
    }

    /// The handshake is not bound by the peer timeout (a path that drops everything for
    /// 2.5 s, then opens, still connects with a 1 s peer timeout), and once established a
    /// peer that goes silent is reported lost after the peer timeout, at both ends — not after
    /// QUIC's idle timeout (15 s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_handshake_connects_and_a_silent_peer_is_lost_after_the_peer_timeout() {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (a, b) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let admitted = Admitted::default();
        admitted.admit_all([(a.public().to_peer_id(), 0)]);
        let timeout = Duration::from_secs(1);
        let (mut sender, mut sender_events) =
            DataPlane::bind(0, any, 1 << 20, timeout, &a, Admitted::default()).unwrap();
        sender.transport = TransportChoice::Quic;
        let (receiver, mut events) =
            DataPlane::bind(1, any, 1 << 20, timeout, &b, admitted).unwrap();
        let open = Arc::new(AtomicBool::new(false));
        let path = cuttable_path(receiver.local_addr, open.clone()).await;
        let opener = open.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            opener.store(true, Relaxed);
        });
        let started = std::time::Instant::now();
        let link = sender
            .connect((1, 1), path, b.public().to_peer_id())
            .await
            .expect("a handshake slower than the peer timeout still connects");
        assert!(started.elapsed() >= Duration::from_millis(2_500));
        link.send(frame(0)).await.unwrap();
        match next(&mut events).await {
            NetEvent::Frame { from: 0, .. } => {}
            other => panic!("expected the frame, got {other:?}"),
        }
        // Both ends stay up while keep-alives flow, for three peer timeouts.
        tokio::time::sleep(3 * timeout).await;
        assert!(sender_events.try_recv().is_err());
        assert!(events.try_recv().is_err());
        // The path is cut: each end reports the other lost after about the peer timeout.
        open.store(false, Relaxed);
        let cut = std::time::Instant::now();
        for (end, rx, peer) in [
            ("sender", &mut sender_events, 1),
            ("receiver", &mut events, 0),
        ] {
            match next(rx).await {
                NetEvent::Lost {
                    peer: p, reason, ..
                } => {
                    assert_eq!(p, peer, "{end}");
                    assert!(reason.contains("timed out"), "{end}: {reason}");
                }
                other => panic!("{end}: expected a loss, got {other:?}"),
            }
        }
        // The silence counts from the last datagram, which may precede the cut by a look.
        let noticed = cut.elapsed();
        assert!(
            noticed >= timeout - Duration::from_millis(200) && noticed < Duration::from_secs(4),
            "noticed {noticed:?} after the cut"
        );
        drop(link);
    }
}
