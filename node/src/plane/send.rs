//! The sending half of a link, the same for every transport: a queue of frames, the link
//! emulation's pacer and delay, and the goodbye that counts the frames.
//!
//! A transport is anything that implements [`FrameTransport`]: it writes one whole frame to
//! one peer. Two exist — QUIC ([`super::quic::QuicFrames`], one unidirectional stream per
//! frame) and shared memory ([`super::local_link::ShmFrames`], a ring in `/dev/shm`). RDMA
//! is the third this seam is shaped for: a registered memory region per link that the
//! writer fills with one-sided writes and a completion the receiver polls, with the QUIC
//! connection kept, as for shared memory, for authentication, liveness and the close.

use std::future::Future;

use bytes::Bytes;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::Rank;
use quinn::{Connection, VarInt};
use tokio::sync::mpsc;
use tracing::debug;

use super::{closed_here, Incarnation, LinkEmulation, NetEvent};

/// How one link's frames travel to its peer.
pub trait FrameTransport: Clone + Send + Sync + 'static {
    /// Writes one whole frame (header and payload). Frames written one after the other
    /// arrive in that order on shared memory; on QUIC each is its own stream. Errors: the
    /// link is broken.
    fn write(&self, frame: Bytes) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Sends the frames queued on `rx` to `to` over `transport` until the training loop drops
/// its handle, then the goodbye (`Bye` with the number of frames sent), and reports the link
/// done when the receiver closes `conn` (the link's QUIC connection, for every transport).
pub(super) async fn send_loop<T: FrameTransport>(
    me: Rank,
    (to, incarnation): (Rank, Incarnation),
    conn: Connection,
    transport: T,
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
            transport.write(frame).await
        } else {
            // tokio's timers tick in milliseconds: sleep only when there is a wait.
            let now = tokio::time::Instant::now();
            let start = link_free.max(now);
            if start > now {
                tokio::time::sleep_until(start).await;
            }
            link_free = start + emulation.occupancy(frame.len());
            let (transport, latency) = (transport.clone(), emulation.latency);
            in_flight.spawn(async move {
                if !latency.is_zero() {
                    // tokio's timer rounds up to its next 1 ms tick (measured +1.3 ms at
                    // 2 ms); a blocking-pool thread's sleep is accurate to ~0.1 ms.
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(latency)).await;
                }
                transport.write(frame).await
            });
            // Collect what has finished; report the first failure.
            let mut r = Ok(());
            while let Some(done) = in_flight.try_join_next() {
                r = r.and(done.map_err(anyhow::Error::from).and_then(|w| w));
            }
            r
        };
        if let Err(e) = result {
            return send_failed(&events, (to, incarnation), &conn, e).await;
        }
        sent += 1;
    }
    // Every frame is written before the goodbye that counts them.
    while let Some(done) = in_flight.join_next().await {
        if let Err(e) = done.map_err(anyhow::Error::from).and_then(|w| w) {
            return send_failed(&events, (to, incarnation), &conn, e).await;
        }
    }
    // A link given up here says no goodbye: `Link::abandon` closes the connection before it
    // drops the handle. A counted goodbye would tell a peer that was only paused, and taken
    // for departed meanwhile, that this neighbour finished the run: it would wait out its
    // round timeout on its return instead of learning from the closed link at once that the
    // run went on without it (the goodbye could still reach it through a shared-memory
    // ring, which outlives the connection's close).
    if closed_here(&conn) {
        debug!(to, incarnation, "link given up: no goodbye");
        return;
    }
    // The training loop dropped its handle: say goodbye, then wait for the receiver to
    // close the connection once it has read everything.
    let mut bye = Vec::with_capacity(FRAME_HEADER_LEN + 8);
    FrameHeader {
        kind: FrameKind::Bye,
        sender: me,
        round: 0,
        dim: 0,
        payload_len: 8,
    }
    .emit(&mut bye);
    bye.extend_from_slice(&sent.to_le_bytes());
    if let Err(e) = transport.write(Bytes::from(bye)).await {
        return send_failed(
            &events,
            (to, incarnation),
            &conn,
            e.context("saying goodbye"),
        )
        .await;
    }
    debug!(to, incarnation, frames = sent, "goodbye sent");
    let reason = conn.closed().await;
    debug!(to, incarnation, %reason, "the link's connection closed after the goodbye");
    let event = match reason {
        quinn::ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(0) => {
            NetEvent::LinkDone { to }
        }
        // After our goodbye, a stateless reset means the receiver's endpoint no longer knows
        // the connection: it closed it once it had read every frame, and its close was lost
        // (seen on a saturated shaped link, whose queue drops packets) — the link is done. A
        // receiver that died instead is noticed by its silence (the peer timeout), not a reset.
        quinn::ConnectionError::Reset => NetEvent::LinkDone { to },
        _ if closed_here(&conn) => return,
        other => NetEvent::Lost {
            peer: to,
            incarnation,
            reason: format!("connection to peer {to}: {other}"),
        },
    };
    let _ = events.send(event).await;
}

/// Reports a failed write on the link to `to` as [`NetEvent::Lost`], unless this side
/// closed the connection.
async fn send_failed(
    events: &mpsc::Sender<NetEvent>,
    (to, incarnation): (Rank, Incarnation),
    conn: &Connection,
    e: anyhow::Error,
) {
    if closed_here(conn) {
        return;
    }
    let _ = events
        .send(NetEvent::Lost {
            peer: to,
            incarnation,
            reason: format!("sending to peer {to} failed: {e}"),
        })
        .await;
}
