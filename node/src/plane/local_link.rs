//! Links between peers on one host through shared memory ([`super::shm`]), set up over the
//! link's authenticated QUIC connection.
//!
//! The sender of a link whose destination address is one of this host's (loopback, or an
//! address of one of its interfaces: a peer in another network namespace is another host)
//! creates a ring and offers its name on a bidirectional QUIC stream: `SHM1`, the ring's
//! capacity (u64 LE), the name's length (u8), the name and its process ([`ProcessId`]: pid
//! u32 LE, start time u64 LE). The receiver maps it (checks in [`shm::Reader::open`]) and
//! answers `OK` and its own process, or `NO` and why; on `NO`, a timeout or any error the
//! link stays on QUIC and the reason is logged. From then on every frame of the link, the
//! goodbye included, goes through the ring, read by one thread per incoming ring and handed
//! to [`super::receive::deliver`] as a QUIC frame would be; both ends stop when the
//! connection closes.
//!
//! Each end keeps the other's process as the link's [`LinkProbe`]: a process that exits
//! (even by `kill -9`, with no supervisor to say so) is noticed at the next look of
//! [`super::liveness`], at most 0.5 s later, instead of after the peer timeout; a stopped
//! one (SIGSTOP) is waited for up to the paused timeout. A pid that now names another
//! process (its start time differs) counts as exited; one this process cannot see when the
//! link is set up (another pid namespace) is not watched.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use murmur_gossip::frame::FRAME_HEADER_LEN;
use quinn::{Connection, SendStream, VarInt};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::liveness::{Far, LinkProbe};
use super::process::{self, ProcessId, ProcessState};
use super::receive::{check, deliver, BufferPool, Receiving};
use super::send::FrameTransport;
use super::shm::{self, Incoming, LinkBroken};
use super::{NetEvent, ABANDONED};

/// How long the sender waits for the answer to its offer.
const OFFER_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const OFFER_TAG: &[u8; 4] = b"SHM1";

/// Whether `addr` is this host's: loopback, or an address a socket here can bind (one of
/// this network namespace's interfaces).
pub fn same_host(addr: SocketAddr) -> bool {
    addr.ip().is_loopback() || UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).is_ok()
}

/// Frames through a shared-memory ring; writes are serialised. A frame that fits in the
/// ring's free space is copied in at once; one that has to wait for the reader is written
/// on tokio's blocking pool.
#[derive(Clone)]
pub struct ShmFrames(Arc<Mutex<shm::Writer>>);

impl FrameTransport for ShmFrames {
    async fn write(&self, frame: Bytes) -> anyhow::Result<()> {
        {
            let mut w = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if w.fits_now(frame.len()) {
                return w.write_frame(&frame).map_err(anyhow::Error::from);
            }
        }
        let writer = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
            w.write_frame(&frame)
        })
        .await?
        .map_err(anyhow::Error::from)
    }
}

/// Sets `stop` and wakes one end of a ring (`wake`) once `conn` closes: a blocked wait
/// gives up at once, and a reader first reads what the ring still holds
/// ([`super::liveness::report_when_silent`] waits for that before it reports the peer lost).
fn stop_on_close(conn: &Connection, stop: Arc<AtomicBool>, wake: shm::Wake) {
    let conn = conn.clone();
    tokio::spawn(async move {
        conn.closed().await;
        stop.store(true, Ordering::Release);
        wake.wake();
    });
}

/// This process's wire form for an offer or an answer: its [`ProcessId`], or zeros where
/// `/proc` does not say (the other end then learns nothing of it).
fn this_process() -> [u8; process::WIRE_LEN] {
    ProcessId::this().map_or([0; process::WIRE_LEN], ProcessId::to_bytes)
}

/// The process `bytes` name, unless they are the zeros of an unknown one.
fn named(bytes: &[u8]) -> Option<ProcessId> {
    ProcessId::from_bytes(bytes).filter(|p| p.pid != 0)
}

/// Keeps the other end's process `far` as the link's probe if this process can see it. It
/// has just spoken, so it is alive: not finding it means another pid namespace (a container
/// that shares the host's network and shared memory but not its pids), where its pid says
/// nothing, and the link keeps to the peer timeout.
fn watch(probe: &LinkProbe, far: Option<ProcessId>) {
    match far {
        Some(p) if p.state() != ProcessState::Gone => {
            let _ = probe.set(Far::Process(p));
        }
        Some(p) => debug!(
            pid = p.pid,
            "the other end's process is not visible from here"
        ),
        None => {}
    }
}

/// Offers a new ring to the receiver at the other end of `conn`; returns the link's
/// transport once the receiver has mapped it, and puts the receiver's process in `probe`.
/// Errors: no ring could be made, the receiver refused (its reason), no answer within
/// [`OFFER_TIMEOUT`].
pub async fn offer(conn: &Connection, probe: &LinkProbe) -> anyhow::Result<ShmFrames> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut writer = shm::Writer::create(Path::new(shm::SHM_DIR), shm::RING_BYTES, stop.clone())?;
    stop_on_close(conn, stop, writer.wake());
    let name = writer.name();
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        let mut msg = Vec::with_capacity(13 + name.len() + process::WIRE_LEN);
        msg.extend_from_slice(OFFER_TAG);
        msg.extend_from_slice(&writer.capacity().to_le_bytes());
        msg.push(name.len() as u8);
        msg.extend_from_slice(name.as_bytes());
        msg.extend_from_slice(&this_process());
        send.write_all(&msg).await?;
        send.finish()?;
        let answer = recv.read_to_end(1024).await?;
        match answer.split_first_chunk::<2>() {
            Some((b"OK", far)) => {
                watch(probe, named(far));
                Ok(())
            }
            Some((b"NO", why)) => bail!("refused: {}", String::from_utf8_lossy(why)),
            _ => bail!("an answer that is not one"),
        }
    };
    let answered = tokio::time::timeout(OFFER_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("no answer within {OFFER_TIMEOUT:?}"))
        .and_then(|r| r);
    writer.unlink();
    answered?;
    Ok(ShmFrames(Arc::new(Mutex::new(writer))))
}

/// Parses an offer: (capacity, name, the offering process if known).
fn parse_offer(msg: &[u8]) -> anyhow::Result<(u64, String, Option<ProcessId>)> {
    let rest = msg
        .strip_prefix(OFFER_TAG)
        .ok_or_else(|| anyhow!("not an offer"))?;
    let (cap, rest) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| anyhow!("a truncated offer"))?;
    let (&len, name) = rest
        .split_first()
        .ok_or_else(|| anyhow!("a truncated offer"))?;
    anyhow::ensure!(
        name.len() == len as usize + process::WIRE_LEN,
        "an offer of the wrong length"
    );
    let (name, far) = name.split_at(len as usize);
    let name = std::str::from_utf8(name).context("a ring name that is not text")?;
    Ok((u64::from_le_bytes(*cap), name.to_string(), named(far)))
}

/// Answers the ring offered (`msg`, read from `send`'s stream) by the peer of `conn`
/// (bound to `state.peer`) and, once mapped, reads the ring's frames on a thread of its own until
/// the connection closes or the goodbye's count is complete; the offering process goes into
/// `probe`. Only the `first` offer of a connection is taken (one transport per link).
/// Frames are read into `pool`'s buffers.
#[allow(clippy::too_many_arguments)]
pub(super) async fn answer_offer(
    conn: Connection,
    msg: &[u8],
    mut send: SendStream,
    events: mpsc::Sender<NetEvent>,
    (state, probe): (Arc<tokio::sync::Mutex<Receiving>>, LinkProbe),
    max_payload_bytes: u32,
    first: bool,
    pool: BufferPool,
) {
    let peer = state.lock().await.peer;
    let opened = async {
        anyhow::ensure!(first, "this link has a transport already");
        let (capacity, name, far) = parse_offer(msg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let reader = shm::Reader::open(Path::new(shm::SHM_DIR), &name, capacity, stop.clone())?;
        stop_on_close(&conn, stop, reader.wake());
        watch(&probe, far);
        anyhow::Ok(reader)
    }
    .await;
    let answer = match &opened {
        Ok(_) => [b"OK".as_slice(), &this_process()].concat(),
        Err(e) => {
            warn!(peer, "refused peer {peer}'s shared-memory ring: {e:#}");
            [b"NO".as_slice(), format!("{e:#}").as_bytes()].concat()
        }
    };
    let _ = send.write_all(&answer).await;
    let _ = send.finish();
    let Ok(reader) = opened else { return };
    debug!(peer, "frames from peer {peer} come through shared memory");
    let handle = tokio::runtime::Handle::current();
    let reading = state.lock().await.reading();
    let spawned = std::thread::Builder::new()
        .name(format!("shm-from-{peer}"))
        .spawn(move || {
            let _reading = reading;
            read_ring(
                reader,
                conn,
                events,
                state,
                (max_payload_bytes, pool),
                handle,
            )
        });
    if let Err(e) = spawned {
        warn!(peer, "no thread for peer {peer}'s ring: {e}");
    }
}

/// The reading thread of one ring: frames to [`deliver`] until the link stops.
fn read_ring(
    mut reader: shm::Reader,
    conn: Connection,
    events: mpsc::Sender<NetEvent>,
    state: Arc<tokio::sync::Mutex<Receiving>>,
    (max_payload_bytes, pool): (u32, BufferPool),
    rt: tokio::runtime::Handle,
) {
    let limit = FRAME_HEADER_LEN + max_payload_bytes as usize;
    loop {
        let frame = match reader.read_frame_into(limit, |n| pool.take(n)) {
            Ok(Incoming::Frame(buf)) => {
                check(&buf, max_payload_bytes).map(|h| (h, pool.freeze(buf), None))
            }
            Ok(Incoming::TooLong(n)) => Err(anyhow!(
                "a {n}-byte frame exceeds the limit of {limit} bytes"
            )),
            Err(LinkBroken::Stopped) => return,
            Err(LinkBroken::Corrupt(why)) => {
                let (peer, incarnation) = {
                    let st = rt.block_on(state.lock());
                    (st.peer, st.incarnation)
                };
                conn.close(VarInt::from_u32(ABANDONED), b"corrupt ring");
                let _ = events.blocking_send(NetEvent::Lost {
                    peer,
                    incarnation,
                    reason: format!("peer {peer}'s shared-memory ring: {why}"),
                });
                return;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_parse_and_bad_ones_are_refused() {
        let mut msg = b"SHM1".to_vec();
        msg.extend_from_slice(&(4u64 << 20).to_le_bytes());
        msg.push(5);
        msg.extend_from_slice(b"ring1");
        let me = ProcessId { pid: 42, start: 7 };
        msg.extend_from_slice(&me.to_bytes());
        assert_eq!(
            parse_offer(&msg).unwrap(),
            (4 << 20, "ring1".to_string(), Some(me))
        );
        // An offerer that does not know its process sends zeros.
        let unknown = [
            &msg[..msg.len() - process::WIRE_LEN],
            &[0; process::WIRE_LEN],
        ]
        .concat();
        assert_eq!(parse_offer(&unknown).unwrap().2, None);
        assert!(parse_offer(&msg[..msg.len() - 1]).is_err());
        assert!(parse_offer(b"SHM2").is_err());
        assert!(parse_offer(&msg[..6]).is_err());
    }

    #[test]
    fn only_a_process_this_one_can_see_is_watched() {
        let probe = LinkProbe::default();
        // A pid of another namespace: nothing here has this start time.
        let me = ProcessId::this().unwrap();
        watch(
            &probe,
            Some(ProcessId {
                start: me.start + 1,
                ..me
            }),
        );
        assert!(probe.get().is_none());
        watch(&probe, None);
        assert!(probe.get().is_none());
        watch(&probe, Some(me));
        assert!(matches!(probe.get(), Some(Far::Process(p)) if *p == me));
    }

    #[test]
    fn loopback_and_own_addresses_are_this_host() {
        assert!(same_host("127.0.0.1:9".parse().unwrap()));
        assert!(same_host("[::1]:9".parse().unwrap()));
        // TEST-NET-3 is nobody's address.
        assert!(!same_host("203.0.113.7:9".parse().unwrap()));
    }
}
