//! The receiving half of a link, the same for every transport: a frame read from a peer's
//! connection (over QUIC streams or its shared-memory ring) is checked against the rank the
//! connection is bound to, counted, delivered or refused, and the goodbye's count closes the
//! connection once every frame has arrived. A QUIC frame comes with its transfer time
//! (first to last byte), a ring's without.

use bytes::Bytes;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::Rank;
use quinn::{Connection, VarInt};
use tokio::sync::mpsc;
use tracing::warn;

use super::NetEvent;

/// Per-connection receive state: who the sender is and how many frames arrived.
#[derive(Debug)]
pub(super) struct Receiving {
    /// The rank the connection's certificate proves.
    pub peer: Rank,
    /// Frames read, refused ones included (not the goodbye).
    pub received: u64,
    /// Frames the goodbye announced.
    pub expected: Option<u64>,
}

impl Receiving {
    pub fn new(peer: Rank) -> Self {
        Receiving {
            peer,
            received: 0,
            expected: None,
        }
    }

    /// Whether the goodbye came and every frame it counted has been read.
    pub fn complete(&self) -> bool {
        self.expected.is_some_and(|n| self.received >= n)
    }
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
        conn.close(VarInt::from_u32(0), b"done");
    }
    true
}
