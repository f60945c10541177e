//! The receiving half of a link, the same for every transport: a frame read from a peer's
//! connection (over QUIC streams or its shared-memory ring) is checked against the rank the
//! connection is bound to, counted, delivered or refused, and the goodbye's count closes the
//! connection once every frame has arrived. A QUIC frame comes with its transfer time
//! (first to last byte), a ring's without.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::Rank;
use quinn::{Connection, VarInt};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::NetEvent;

/// Most buffers a [`BufferPool`] keeps: enough for the parts of a streamed message that
/// wait in the event queue while a gradient is computed (25 a round for a 100 MB model in
/// 4 MB parts).
const POOL_BUFFERS: usize = 64;
/// Most bytes a [`BufferPool`] keeps: four whole 100 MB messages.
const POOL_BYTES: usize = 400 << 20;

/// Receive buffers handed back when the training loop drops the frame read into them, so
/// that a frame is read into memory already mapped: a fresh 100 MB buffer costs about as
/// much CPU in page faults as its bytes cost to receive (`murmur netbench`'s memcpy row).
/// One pool per data plane, shared by its links; it keeps the largest buffers, at most
/// [`POOL_BUFFERS`] of them and [`POOL_BYTES`] in all (one buffer over that, if it alone is
/// larger).
#[derive(Clone, Default)]
pub(super) struct BufferPool(Arc<Mutex<Vec<Vec<u8>>>>);

impl BufferPool {
    /// A buffer of length `n` whose bytes are unspecified (an earlier frame's, or zero),
    /// for a reader to overwrite: the smallest pooled one whose capacity is big enough,
    /// else a new one. Only bytes never written before are zeroed (a new buffer's come from
    /// the allocator already zero, mapped lazily), so a frame read into a pooled buffer
    /// costs no pass over its memory but the read.
    pub fn take(&self, n: usize) -> Vec<u8> {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let fit = (0..pool.len())
            .filter(|&i| pool[i].capacity() >= n)
            .min_by_key(|&i| pool[i].capacity());
        match fit {
            Some(i) => {
                let mut b = pool.swap_remove(i);
                drop(pool);
                // A pooled buffer keeps the length it was last read to: all of it written.
                b.resize(n, 0);
                b
            }
            None => vec![0; n],
        }
    }

    /// `buf` as a frame's bytes; its memory comes back to the pool when they are dropped.
    pub fn freeze(&self, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Recycled {
            buf,
            pool: Arc::downgrade(&self.0),
        })
    }
}

/// A pooled buffer lent out as [`Bytes`].
struct Recycled {
    buf: Vec<u8>,
    pool: Weak<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.push(std::mem::take(&mut self.buf));
            // Keep the larger buffers: they are the costly ones to map again.
            while pool.len() > 1
                && (pool.len() > POOL_BUFFERS
                    || pool.iter().map(Vec::capacity).sum::<usize>() > POOL_BYTES)
            {
                let smallest = (0..pool.len())
                    .min_by_key(|&i| pool[i].capacity())
                    .expect("not empty");
                pool.swap_remove(smallest);
            }
        }
    }
}

/// Goodbyes whose acknowledgement — the close of the sender's connection, which lets the
/// sender exit — waits until this peer has done with the frames read before them: peer 0,
/// the record's collector, holds them until the sender's reports are in a written row of
/// the record, so that a peer does not exit while its last reports exist only in peer 0's
/// memory (were peer 0 to die then, the reports would die with it; with the acknowledgement
/// held, the sender keeps them for peer 0's restarted process). Off until
/// [`super::DataPlane::hold_acknowledgements`].
#[derive(Clone, Debug, Default)]
pub(super) struct HeldAcks(Arc<Mutex<Held>>);

#[derive(Debug, Default)]
struct Held {
    on: bool,
    conns: Vec<(Rank, Connection)>,
}

impl HeldAcks {
    /// Holds the acknowledgements of goodbyes from now on.
    pub fn hold(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).on = true;
    }

    /// Holds no more: acknowledges every held goodbye, and those to come at once (a stand-in
    /// for the record's keeper that hands the record back).
    pub fn stop_holding(&self) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.on = false;
        for (_, conn) in held.conns.drain(..) {
            conn.close(VarInt::from_u32(0), b"done");
        }
    }

    /// Acknowledges `from`'s goodbye on `conn` now, or keeps it for [`HeldAcks::release`].
    fn acknowledge(&self, from: Rank, conn: &Connection) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if held.on {
            held.conns.push((from, conn.clone()));
        } else {
            conn.close(VarInt::from_u32(0), b"done");
        }
    }

    /// Acknowledges the held goodbyes of the senders `done` says this peer is done with;
    /// the others stay held. `done` is not asked when none is held.
    pub fn release(&self, mut done: impl FnMut(Rank) -> bool) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.conns.retain(|(from, conn)| {
            if done(*from) {
                conn.close(VarInt::from_u32(0), b"done");
                false
            } else {
                true
            }
        });
    }
}

/// Per-connection receive state: who the sender is and how many frames arrived.
#[derive(Debug)]
pub(super) struct Receiving {
    /// The rank the connection's certificate proves.
    pub peer: Rank,
    /// The incarnation of the process that opened the connection.
    pub incarnation: super::Incarnation,
    /// Frames read, refused ones included (not the goodbye).
    pub received: u64,
    /// Frames the goodbye announced.
    pub expected: Option<u64>,
    /// Where the goodbye's acknowledgement goes once every frame is read.
    pub acks: HeldAcks,
    /// Each thread that reads this connection's frames from another transport (a
    /// shared-memory ring, TCP streams) holds a receiver of it ([`Receiving::reading`])
    /// until it ends: the liveness watch waits for them all ([`Receiving::read_out`])
    /// before it reports the peer lost, so that every frame a dead peer had written whole
    /// reaches the training loop before its loss does.
    readers: tokio::sync::watch::Sender<()>,
}

impl Receiving {
    pub fn new(peer: Rank, incarnation: super::Incarnation, acks: HeldAcks) -> Self {
        Receiving {
            peer,
            incarnation,
            acks,
            received: 0,
            expected: None,
            readers: tokio::sync::watch::Sender::new(()),
        }
    }

    /// For a thread that reads this connection's frames: held until it reads no more.
    pub fn reading(&self) -> tokio::sync::watch::Receiver<()> {
        self.readers.subscribe()
    }

    /// Resolves once every thread that was reading this connection's frames has ended
    /// (at once if none is).
    pub fn read_out(&self) -> impl std::future::Future<Output = ()> + use<> {
        let readers = self.readers.clone();
        async move { readers.closed().await }
    }

    /// Whether the goodbye came and every frame it counted has been read.
    pub fn complete(&self) -> bool {
        self.expected.is_some_and(|n| self.received >= n)
    }
}

/// The header of a frame read whole (from a ring or a TCP stream), checked as on QUIC, and
/// its length against the header's.
pub(super) fn check(buf: &[u8], max_payload_bytes: u32) -> anyhow::Result<FrameHeader> {
    let header = FrameHeader::parse_prefix(buf, max_payload_bytes)?;
    let declared = FRAME_HEADER_LEN + header.payload_len as usize;
    anyhow::ensure!(
        declared == buf.len(),
        "a frame longer than the {declared} bytes it declares"
    );
    Ok(header)
}

/// Takes one frame read on `conn` (or why it could not be read) into the connection's
/// state: a frame of the bound sender is delivered, any other refused (and counted, so that
/// a refused frame cannot hold the shutdown up), the goodbye records the count; when the
/// count is complete the peer is reported finished and `conn` closed (code 0). Returns
/// false when the training loop is gone.
pub(super) async fn deliver(
    frame: anyhow::Result<(FrameHeader, Bytes, Option<std::time::Duration>)>,
    st: &mut Receiving,
    events: &mpsc::Sender<NetEvent>,
    conn: &Connection,
) -> bool {
    // (reason, whether the stream was a counted frame)
    let refused: Option<(String, bool)> = match frame {
        Err(e) => Some((format!("{e:#}"), true)),
        Ok((header, _, _)) if header.sender != st.peer => Some((
            format!(
                "frame claims sender {} on peer {}'s connection",
                header.sender, st.peer
            ),
            true,
        )),
        Ok((header, bytes, _)) if header.kind == FrameKind::Bye => {
            let count = bytes
                .get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes);
            match count {
                Some(n) => {
                    debug!(
                        peer = st.peer,
                        incarnation = st.incarnation,
                        frames = n,
                        read = st.received,
                        "goodbye received"
                    );
                    st.expected = Some(n);
                    None
                }
                None => Some(("malformed goodbye".to_string(), false)),
            }
        }
        Ok((header, bytes, transfer)) => {
            st.received += 1;
            let from = header.sender;
            let delivered = events
                .send(NetEvent::Frame {
                    from,
                    header,
                    bytes,
                    transfer,
                })
                .await;
            if delivered.is_err() {
                return false;
            }
            None
        }
    };
    if let Some((reason, counted)) = refused {
        warn!(peer = st.peer, "refused frame: {reason}");
        if counted {
            st.received += 1;
        }
        let _ = events
            .send(NetEvent::Refused {
                peer: Some(st.peer),
                reason,
            })
            .await;
    }
    if st.complete() {
        let _ = events.send(NetEvent::Finished { from: st.peer }).await;
        st.acks.acknowledge(st.peer, conn);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A lost link's read-out ([`Receiving::read_out`], which the liveness watch awaits
    /// before it reports the loss) waits for every reading thread and for nothing else.
    #[tokio::test]
    async fn the_read_out_waits_for_every_reader_of_the_connection() {
        let st = Receiving::new(3, 1, HeldAcks::default());
        // No reader (a connection on QUIC alone): nothing to wait for.
        tokio::time::timeout(Duration::from_millis(100), st.read_out())
            .await
            .expect("no reader: read out at once");
        let (ring, tcp) = (st.reading(), st.reading());
        let read_out = tokio::spawn(st.read_out());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!read_out.is_finished(), "two readers still read");
        drop(ring);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!read_out.is_finished(), "one reader still reads");
        drop(tcp);
        tokio::time::timeout(Duration::from_secs(5), read_out)
            .await
            .expect("every reader ended: read out")
            .unwrap();
    }

    #[test]
    fn a_dropped_frame_lends_its_buffer_to_the_next_one_that_fits() {
        let pool = BufferPool::default();
        let mut b = pool.take(1000);
        assert_eq!(b, vec![0; 1000], "a new buffer is zero");
        b.fill(7);
        let ptr = b.as_ptr();
        let frame = pool.freeze(b);
        assert_eq!(&frame[..], &[7; 1000][..]);
        // Still lent: a new buffer.
        let other = pool.take(10);
        assert_ne!(other.as_ptr(), ptr);
        let copy = frame.clone();
        drop(frame);
        let other = pool.take(10);
        assert_ne!(other.as_ptr(), ptr, "a clone still holds it");
        drop(copy);
        let again = pool.take(500);
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.len() == 500 && again.capacity() >= 1000);
        assert_eq!(again, vec![7; 500], "a pooled buffer is not zeroed again");
        // Grown within its capacity: only the bytes past its last length are zeroed.
        drop(pool.freeze(again));
        let grown = pool.take(800);
        assert_eq!(grown.as_ptr(), ptr);
        assert_eq!(&grown[..500], &[7; 500][..]);
        assert_eq!(&grown[500..], &[0; 300][..]);
        let again = grown;
        // Too small for a bigger frame: not taken.
        drop(pool.freeze(again));
        let bigger = pool.take(2000);
        assert_ne!(bigger.as_ptr(), ptr);
        // At most POOL_BUFFERS kept, the largest.
        let frames: Vec<Bytes> = (1..=POOL_BUFFERS + 2)
            .map(|k| pool.freeze(pool.take(k * 100)))
            .collect();
        drop(frames);
        {
            let kept = pool.0.lock().unwrap();
            assert_eq!(kept.len(), POOL_BUFFERS);
            assert!(
                kept.iter().all(|b| b.capacity() >= 300),
                "the largest are kept"
            );
        }
        // At most POOL_BYTES kept, the largest (capacities of a fresh vec![0; n] are n).
        let big = POOL_BYTES / 3;
        let frames: Vec<Bytes> = (0..4).map(|_| pool.freeze(pool.take(big))).collect();
        drop(frames);
        let kept = pool.0.lock().unwrap();
        let total: usize = kept.iter().map(Vec::capacity).sum();
        assert!(total <= POOL_BYTES, "{total} bytes kept");
        assert_eq!(kept.iter().filter(|b| b.capacity() >= big).count(), 3);
    }
}
