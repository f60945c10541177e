//! QUIC, the data plane's network transport (quinn): the endpoint's settings, frames as
//! unidirectional streams, and the server side — authenticated connections bound to their
//! peer's rank, each frame read with its header checked before the payload is allocated.
//!
//! Every link has a QUIC connection, also when its frames travel through shared memory
//! ([`super::local_link`]) or TCP ([`super::tcp`]): the connection proves the peers'
//! identities, answers which process it reached (the incarnation query, the first
//! bidirectional stream), carries the offer of the other transport (the next one), notices a
//! silent peer ([`super::liveness`]) and
//! carries the close that ends the link.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use bytes::Bytes;
use libp2p::PeerId;
use murmur_gossip::frame::{FrameHeader, FRAME_HEADER_LEN};
use murmur_gossip::Rank;
use quinn::{Connection, Endpoint, TransportConfig, VarInt};
use tokio::sync::mpsc;
use tracing::warn;

use super::receive::{deliver, BufferPool, HeldAcks, Receiving};
use super::send::FrameTransport;
use super::tcp::TcpSide;
use super::tls::{self, Admitted};
use super::{closed_here, liveness, local_link, Inbound, Incarnation, NetEvent, ABANDONED};

/// How long an incoming connection waits for the directory before it is refused.
const ADMISSION_WAIT: Duration = Duration::from_secs(120);

/// Transport settings of every data-plane connection for the `timeouts`: keep-alives
/// every fifth of the peer timeout (at most every 2 s); QUIC's idle timeout, which also
/// bounds the handshake, is [`liveness::Timeouts::idle`] (the timeouts of an established
/// connection are [`liveness`]'s).
pub(super) fn transport_config(timeouts: liveness::Timeouts) -> TransportConfig {
    let (peer_timeout, idle_timeout) = (timeouts.peer, timeouts.idle());
    let mut t = TransportConfig::default();
    // Windows large enough that a multi-MB parameter frame is not flow-control bound.
    t.stream_receive_window(VarInt::from_u32(64 << 20));
    t.receive_window(VarInt::from_u32(256 << 20));
    t.send_window(256 << 20);
    t.max_concurrent_uni_streams(VarInt::from_u32(1024));
    // The incarnation query, then the offer of the other transport (shared memory, TCP).
    t.max_concurrent_bidi_streams(VarInt::from_u32(3));
    t.keep_alive_interval(Some(liveness::keep_alive_interval(peer_timeout)));
    t.max_idle_timeout(Some(
        VarInt::from_u64(idle_timeout.as_millis() as u64)
            .unwrap_or(VarInt::MAX)
            .into(),
    ));
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t
}

/// The largest UDP payload (bytes) a QUIC packet grows to where the path carries it:
/// quinn's path-MTU discovery probes from 1,200 bytes up to this, so a 1,500-byte Ethernet
/// path stays at quinn's 1,452, while loopback and jumbo-frame fabrics (MTU 9,000) carry
/// packets of 6,500 bytes: a 100 MB frame in about 15,000 packets instead of 69,000, each
/// with its own encryption, header and acknowledgement. Not higher: quinn hands the kernel
/// up to 10 packets in one `sendmsg` (UDP segmentation offload), and the kernel refuses a
/// batch over one UDP datagram's 65,507 bytes (`EMSGSIZE`), which quinn then takes for a
/// loss — at 8,952 bytes a 100 MB message moved at half the rate of 1,452-byte packets.
pub(super) const MAX_UDP_PAYLOAD: u16 = 6_500;

/// Endpoint settings of every data-plane endpoint: the `max_udp_payload_size` it
/// announces is [`MAX_UDP_PAYLOAD`] (quinn's default, 1,472, would cap the peer's path-MTU
/// discovery whatever its own bound).
pub(super) fn endpoint_config() -> quinn::EndpointConfig {
    let mut e = quinn::EndpointConfig::default();
    e.max_udp_payload_size(MAX_UDP_PAYLOAD)
        .expect("6,500 bytes is within QUIC's limits (1,200 to 65,527)");
    e
}

/// AES-GCM first (it has hardware support here and measured faster than ChaCha20).
pub(super) fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| match s.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        _ => 2,
    });
    Arc::new(p)
}

/// Frames as QUIC streams: one unidirectional stream per frame, sent in the order they
/// were written.
#[derive(Clone)]
pub struct QuicFrames {
    conn: Connection,
    /// Frames written so far: each stream's priority is below its predecessor's.
    written: Arc<std::sync::atomic::AtomicU32>,
}

impl QuicFrames {
    /// Frames over `conn`.
    pub fn new(conn: Connection) -> Self {
        Self {
            conn,
            written: Arc::default(),
        }
    }
}

impl FrameTransport for QuicFrames {
    async fn write(&self, frame: Bytes) -> anyhow::Result<()> {
        let mut s = self.conn.open_uni().await?;
        // quinn sends the streams of one priority round-robin: frames queued together
        // would all arrive at the end, together, and a receiver that mixes a message in
        // parts as they come (D-PSGD streamed in parts) could not begin before the last.
        // A falling priority sends them one after the other, as TCP does.
        let n = self
            .written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.set_priority(i32::MAX - (n & 0x7fff_ffff) as i32)?;
        s.write_chunk(frame).await?;
        s.finish()?;
        Ok(())
    }
}

/// What every incoming connection of one data plane is served with.
#[derive(Clone)]
pub(super) struct Serving {
    pub events: mpsc::Sender<NetEvent>,
    pub max_payload_bytes: u32,
    /// Silences after which a connection's peer is reported lost ([`liveness`]).
    pub timeouts: liveness::Timeouts,
    pub inbound: Inbound,
    pub tcp: Arc<TcpSide>,
    pub pool: BufferPool,
    /// The goodbyes' acknowledgements, held or not ([`HeldAcks`]).
    pub acks: HeldAcks,
    /// This process's incarnation, told to every process that dials it
    /// ([`answer_incarnation`]).
    pub incarnation: Incarnation,
}

/// Tag of a data-plane connection's first bidirectional stream: the dialling process asks
/// which incarnation the process it reached is ([`ask_incarnation`]).
const INCARNATION_TAG: &[u8; 4] = b"INC1";

/// Asks the process at the other end of `conn` (just dialled) which incarnation it is. Its
/// answer, not the directory's, is the link's: a directory read before a peer restarted in
/// place (the same address, as `murmur.sbatch` restarts it) names the old process, and a
/// link labelled with it would be dropped as the old process's once the new one says hello.
/// The answer comes over the handshake's authenticated connection, from the identity the
/// certificate proved.
///
/// # Errors
/// No answer within [`liveness::HANDSHAKE_TIMEOUT`], the connection closed, or an answer
/// that is not one (an older murmur).
pub(super) async fn ask_incarnation(conn: &Connection) -> anyhow::Result<Incarnation> {
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(INCARNATION_TAG).await?;
        send.finish()?;
        let answer = recv.read_to_end(64).await?;
        let bytes = <[u8; 8]>::try_from(answer.as_slice()).map_err(|_| {
            anyhow!(
                "an answer of {} bytes to the incarnation query, not 8 (every peer of a run \
                 must run the same murmur)",
                answer.len()
            )
        })?;
        anyhow::Ok(Incarnation::from_le_bytes(bytes))
    };
    within_handshake_timeout("an answer to the incarnation query", exchange).await
}

/// `exchange`, given up after [`liveness::HANDSHAKE_TIMEOUT`] with "no `what` within …".
async fn within_handshake_timeout<T>(
    what: &str,
    exchange: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let limit = liveness::HANDSHAKE_TIMEOUT;
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| anyhow!("no {what} within {limit:?}"))?
}

/// Answers the incarnation query that opens every incoming connection
/// ([`ask_incarnation`]) with `mine`. It is answered before the dialler's admission is
/// known: a process that restarted and is still reading the directory tells which process
/// it is at once (an incarnation is no secret; the dialler's identity is proven already).
///
/// # Errors
/// No query within [`liveness::HANDSHAKE_TIMEOUT`], or a first stream that is not one.
async fn answer_incarnation(conn: &Connection, mine: Incarnation) -> anyhow::Result<()> {
    let exchange = async {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let query = recv.read_to_end(64).await?;
        anyhow::ensure!(
            query == INCARNATION_TAG,
            "its first stream is not the incarnation query (an older murmur? every peer of a \
             run must run the same version)"
        );
        send.write_all(&mine.to_le_bytes()).await?;
        send.finish()?;
        anyhow::Ok(())
    };
    within_handshake_timeout("incarnation query", exchange).await
}

/// Accepts the endpoint's incoming connections: authenticated, admitted, bound to a rank.
pub(super) async fn accept_loop(endpoint: Endpoint, admitted: Admitted, serving: Serving) {
    while let Some(incoming) = endpoint.accept().await {
        let (admitted, serving) = (admitted.clone(), serving.clone());
        tokio::spawn(async move {
            let events = &serving.events;
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => return refuse_connection(events, remote, e.to_string()).await,
            };
            if let Err(e) = answer_incarnation(&conn, serving.incarnation).await {
                conn.close(VarInt::from_u32(ABANDONED), b"no incarnation query");
                return refuse_connection(events, remote, format!("{e:#}")).await;
            }
            // The handshake checked the certificate; bind the connection to its rank.
            let peer = conn
                .peer_identity()
                .and_then(|id| {
                    id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                        .ok()
                })
                .and_then(|certs| tls::peer_id_of(&certs).ok());
            let bound = match peer {
                Some(p) => admitted
                    .rank_when_known(&p, ADMISSION_WAIT)
                    .await
                    .map(|rank| (rank, p)),
                None => None,
            };
            // The incarnation of the process that dialled, in the server name it signed.
            let incarnation = conn
                .handshake_data()
                .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
                .and_then(|d| d.server_name)
                .and_then(|name| super::parse_incarnation_name(&name));
            match (bound, incarnation) {
                (Some(who), Some(inc)) => serve_connection(conn, who, inc, serving).await,
                (Some((rank, _)), None) => {
                    conn.close(VarInt::from_u32(ABANDONED), b"no incarnation");
                    let why = format!(
                        "peer {rank} stated no incarnation (an older murmur? every peer of a run \
                         must run the same version)"
                    );
                    refuse_connection(events, remote, why).await;
                }
                (None, _) => {
                    conn.close(VarInt::from_u32(ABANDONED), b"not admitted");
                    let who = peer.map_or("no identity".to_string(), |p| format!("peer {p}"));
                    let why = format!("{who} is not admitted to this run");
                    refuse_connection(events, remote, why).await;
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

/// Reads the frames of peer `rank`'s connection (`peer`: the identity its certificate
/// proved; `incarnation`: that of the process that opened it): one per unidirectional stream, or, once the peer has offered another transport
/// on a bidirectional stream (its shared-memory ring, [`local_link`], or a TCP connection,
/// [`super::tcp`]), from that transport.
async fn serve_connection(
    conn: Connection,
    (rank, peer): (Rank, PeerId),
    incarnation: super::Incarnation,
    serving: Serving,
) {
    let Serving {
        events,
        max_payload_bytes,
        timeouts,
        inbound,
        tcp,
        pool,
        acks,
        incarnation: _,
    } = serving;
    inbound
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(rank)
        .or_default()
        .push((incarnation, conn.clone()));
    let state = Arc::new(tokio::sync::Mutex::new(Receiving::new(
        rank,
        incarnation,
        acks,
    )));
    let probe = liveness::LinkProbe::default();
    tokio::spawn(liveness::report_when_silent(
        conn.clone(),
        timeouts,
        events.clone(),
        (rank, incarnation),
        (Some(state.clone()), probe.clone()),
    ));
    let mut offers = 0;
    loop {
        let mut stream = tokio::select! {
            uni = conn.accept_uni() => match uni {
                Ok(s) => s,
                Err(e) => {
                    let st = state.lock().await;
                    if !(st.complete() || closed_here(&conn)) {
                        let _ = events
                            .send(NetEvent::Lost {
                                peer: rank,
                                incarnation,
                                reason: format!("connection from peer {rank}: {e}"),
                            })
                            .await;
                    }
                    return;
                }
            },
            bi = conn.accept_bi() => {
                if let Ok((send, mut recv)) = bi {
                    offers += 1;
                    let first = offers == 1;
                    let (conn, events, state) = (conn.clone(), events.clone(), state.clone());
                    let (tcp, pool, probe) = (tcp.clone(), pool.clone(), probe.clone());
                    tokio::spawn(async move {
                        let Ok(msg) = recv.read_to_end(256).await else { return };
                        if msg.starts_with(super::tcp::OFFER_TAG) {
                            super::tcp::answer_offer(
                                &tcp, &msg, (conn, peer), send, events, (state, probe),
                                max_payload_bytes, first,
                            )
                            .await
                        } else {
                            local_link::answer_offer(
                                conn, &msg, send, events, (state, probe), max_payload_bytes,
                                first, pool,
                            )
                            .await
                        }
                    });
                }
                continue;
            }
        };
        let events = events.clone();
        let state = state.clone();
        let conn = conn.clone();
        let pool = pool.clone();
        tokio::spawn(async move {
            let frame = async {
                let mut head = [0u8; FRAME_HEADER_LEN];
                stream
                    .read_exact(&mut head)
                    .await
                    .map_err(|e| anyhow!("reading a frame header: {e}"))?;
                let first_byte = std::time::Instant::now();
                let header = FrameHeader::parse_prefix(&head, max_payload_bytes)?;
                let n = FRAME_HEADER_LEN + header.payload_len as usize;
                let mut buf = pool.take(n);
                buf[..FRAME_HEADER_LEN].copy_from_slice(&head);
                stream
                    .read_exact(&mut buf[FRAME_HEADER_LEN..])
                    .await
                    .map_err(|e| anyhow!("reading a {}-byte payload: {e}", header.payload_len))?;
                let transfer = first_byte.elapsed();
                // A stream is one frame: bytes after the declared payload make it a bad one.
                let mut more = [0u8; 1];
                if let Ok(Some(_)) = stream.read(&mut more).await {
                    anyhow::bail!("a frame longer than the {} bytes it declares", buf.len());
                }
                anyhow::Ok((header, pool.freeze(buf), Some(transfer)))
            }
            .await;
            let mut st = state.lock().await;
            deliver(frame, &mut st, &events, &conn).await;
        });
    }
}
