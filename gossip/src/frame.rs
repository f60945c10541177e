//! The data-plane frame: a fixed 24-byte header in front of every message between peers.
//!
//! ```text
//! offset size field
//!      0    2 magic        u16 LE, 0x4D55 ("MU")
//!      2    1 version      u8, FRAME_VERSION
//!      3    1 kind         u8, see FrameKind
//!      4    4 sender       u32 LE, rank of the sending peer
//!      8    8 round        u64 LE, gossip round (epoch for reports)
//!     16    4 dim          u32 LE, d: parameters of the model the frame is about (0 if none)
//!     20    4 payload_len  u32 LE, bytes that follow the header
//! ```
//!
//! [`FrameHeader::parse`] never panics and checks the declared length against the caller's
//! limit before anything is allocated for the payload.

use bytes::Bytes;
use murmur_topology::Rank;
use thiserror::Error;

/// `"MU"` in little-endian.
pub const FRAME_MAGIC: u16 = 0x554D;
/// Version of the frame protocol written by this crate: the header layout and what each
/// kind means. Raised when either changes, so that peers of builds that would misread each
/// other refuse each other's frames by name ([`FrameError::UnknownVersion`]). 2: a
/// `Welcome` carries no parameters; a rejoining peer fetches them in parts (`Fetch`,
/// `StatePart`). 3: a part names the vector it is of (x or the optimizer's state), so a
/// donor of version 2 would answer a request for optimizer state with x. 4: a part may be
/// of the algorithm's state (DiLoCo's anchor and outer velocity), which a donor of version 3
/// could not read. 5: the record's keeper floods the lines of the run's record (`Record`),
/// a kind a peer of version 4 would refuse.
pub const FRAME_VERSION: u8 = 5;
/// Length of [`FrameHeader`] on the wire, in bytes.
pub const FRAME_HEADER_LEN: usize = 24;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum FrameKind {
    /// A gossip message: a compressed parameter vector (payload: a `murmur_compress` message).
    Gossip = 1,
    /// A metrics report to the run's coordinator (payload defined by the node).
    Report = 2,
    /// The sender has finished; payload defined by the node.
    Bye = 3,
    /// A push-sum message of SGP: the push-sum weight share and a compressed parameter
    /// share (payload defined by [`crate::algorithms::sgp`]).
    PushSum = 4,
    /// One chunk of a ring all-reduce step (payload defined by [`crate::algorithms::allreduce`]).
    Reduce = 5,
    /// A parameter-server worker's gradient for the server (payload defined by [`crate::algorithms::ps`]).
    Push = 6,
    /// A parameter server's parameters for a worker (payload defined by [`crate::algorithms::ps`]).
    Pull = 7,
    /// A membership notice: a peer has left the run (payload defined by the node).
    Leave = 8,
    /// A restarted peer introduces itself to a peer of the run it rejoins (payload defined
    /// by the node).
    Hello = 9,
    /// The answer to `Hello`: the run's round, membership and parameters (payload defined
    /// by the node).
    Welcome = 10,
    /// A membership notice: a peer returns to the run at a given round (payload defined by
    /// the node).
    Rejoin = 11,
    /// A straggler notice: the sender mixed round `round` without the receiver's frame, so
    /// the receiver drops the sender's frame of that round too (no payload; see
    /// [`crate::DPsgd`]).
    Skip = 12,
    /// A membership notice: a new peer took an empty rank of the running run, with this
    /// identity (payload defined by the node).
    Admit = 13,
    /// What the sender measured of the link from the receiver to it: its bandwidth in
    /// bytes per second (payload: `f64` LE), so that the receiver chooses what to send on
    /// that link from a measurement of the direction it uses (see [`crate::ChocoAuto`]).
    LinkRate = 14,
    /// One part of a gossip message streamed in parts (a large model's x cut into
    /// contiguous slices, each mixed as it arrives; see [`crate::mixing::streaming`]).
    /// Payload: part index u32 LE, part count u32 LE, then the part's `murmur_compress`
    /// message; the header's `dim` is the part's length.
    GossipPart = 15,
    /// A (re)joining peer asks a donor for a slice of its parameters x (payload defined by
    /// the node).
    Fetch = 16,
    /// A donor's answer to `Fetch`: the slice of x asked for (payload defined by the node).
    StatePart = 17,
    /// Lines of the run's record (epoch rows, their consensus distances, membership
    /// events), flooded by the record's keeper so that any peer can continue the record in
    /// a run folder of its own (payload defined by the node).
    Record = 18,
}

impl FrameKind {
    /// Whether the algorithms' state machines handle this kind (their messages: `Gossip`,
    /// `PushSum`, `Reduce`, `Push`, `Pull`, `Skip`, `LinkRate`). The other kinds are the node's: metrics
    /// (`Report`), shutdown (`Bye`) and membership (`Leave`, `Hello`, `Welcome`, `Rejoin`,
    /// `Admit`, `Fetch`, `StatePart`). A new algorithm that needs a new message adds a kind here and returns true
    /// for it; the node's driver then hands its frames to the state machine unchanged.
    pub fn is_algorithm(self) -> bool {
        matches!(
            self,
            Self::Gossip
                | Self::GossipPart
                | Self::PushSum
                | Self::Reduce
                | Self::Push
                | Self::Pull
                | Self::Skip
                | Self::LinkRate
        )
    }

    /// Whether this kind belongs to the membership protocol (hello, welcome, rejoin, admit,
    /// and the rejoining peer's fetch of its parameters), which a peer handles even from a
    /// peer it believes departed.
    pub fn is_membership_handshake(self) -> bool {
        matches!(
            self,
            Self::Hello
                | Self::Welcome
                | Self::Rejoin
                | Self::Admit
                | Self::Fetch
                | Self::StatePart
        )
    }

    fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Gossip),
            2 => Some(Self::Report),
            3 => Some(Self::Bye),
            4 => Some(Self::PushSum),
            5 => Some(Self::Reduce),
            6 => Some(Self::Push),
            7 => Some(Self::Pull),
            8 => Some(Self::Leave),
            9 => Some(Self::Hello),
            10 => Some(Self::Welcome),
            11 => Some(Self::Rejoin),
            12 => Some(Self::Skip),
            13 => Some(Self::Admit),
            14 => Some(Self::LinkRate),
            15 => Some(Self::GossipPart),
            16 => Some(Self::Fetch),
            17 => Some(Self::StatePart),
            18 => Some(Self::Record),
            _ => None,
        }
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer than [`FRAME_HEADER_LEN`] bytes, or fewer than the declared payload.
    #[error("frame truncated: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes required.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The first two bytes are not [`FRAME_MAGIC`].
    #[error("bad frame magic {0:#06x}")]
    BadMagic(u16),
    /// A version this build does not read.
    #[error("unknown frame version {0} (this build reads version {FRAME_VERSION})")]
    UnknownVersion(u8),
    /// An unknown kind byte.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Declared payload above the receiver's limit.
    #[error("declared payload of {declared} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Declared payload length.
        declared: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// Bytes after the declared payload.
    #[error("{extra} bytes after the declared payload")]
    TrailingBytes {
        /// Number of extra bytes.
        extra: usize,
    },
}

/// The header of every data-plane frame (layout in the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the payload is.
    pub kind: FrameKind,
    /// Rank of the sender.
    pub sender: Rank,
    /// Round (gossip) or epoch (report) the frame belongs to.
    pub round: u64,
    /// Model dimension d the payload refers to.
    pub dim: u32,
    /// Payload length in bytes.
    pub payload_len: u32,
}

impl FrameHeader {
    /// Appends the 24 header bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    /// The 24 header bytes.
    pub fn to_bytes(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..2].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[2] = FRAME_VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&(self.sender as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.round.to_le_bytes());
        b[16..20].copy_from_slice(&self.dim.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Parses only the 24 header bytes (the payload may not have arrived yet) and checks
    /// `payload_len ≤ max_payload_bytes`. Never panics.
    pub fn parse_prefix(bytes: &[u8], max_payload_bytes: u32) -> Result<Self, FrameError> {
        let h: &[u8; FRAME_HEADER_LEN] = bytes
            .get(..FRAME_HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(FrameError::Truncated {
                needed: FRAME_HEADER_LEN,
                got: bytes.len(),
            })?;
        let magic = u16::from_le_bytes([h[0], h[1]]);
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if h[2] != FRAME_VERSION {
            return Err(FrameError::UnknownVersion(h[2]));
        }
        let kind = FrameKind::from_u8(h[3]).ok_or(FrameError::UnknownKind(h[3]))?;
        let sender = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as Rank;
        let mut round = [0u8; 8];
        round.copy_from_slice(&h[8..16]);
        let dim = u32::from_le_bytes([h[16], h[17], h[18], h[19]]);
        let payload_len = u32::from_le_bytes([h[20], h[21], h[22], h[23]]);
        if payload_len > max_payload_bytes {
            return Err(FrameError::TooLarge {
                declared: payload_len as u64,
                limit: max_payload_bytes as u64,
            });
        }
        Ok(FrameHeader {
            kind,
            sender,
            round: u64::from_le_bytes(round),
            dim,
            payload_len,
        })
    }

    /// Parses a whole frame and returns the header and exactly its payload.
    /// Never panics; `Err` names the first defect found.
    pub fn parse(bytes: &[u8], max_payload_bytes: u32) -> Result<(Self, &[u8]), FrameError> {
        let header = Self::parse_prefix(bytes, max_payload_bytes)?;
        let rest = &bytes[FRAME_HEADER_LEN..];
        let len = header.payload_len as usize;
        if rest.len() < len {
            return Err(FrameError::Truncated {
                needed: FRAME_HEADER_LEN + len,
                got: bytes.len(),
            });
        }
        if rest.len() > len {
            return Err(FrameError::TrailingBytes {
                extra: rest.len() - len,
            });
        }
        Ok((header, rest))
    }
}

/// The buffer of a frame that was handed out as [`Bytes`], emptied, for the next frame:
/// the same allocation when every clone of `frame` has been dropped, else a new one of the
/// same capacity.
pub(crate) fn reuse(frame: Bytes) -> Vec<u8> {
    let len = frame.len();
    match frame.try_into_mut() {
        Ok(mut m) => {
            m.clear(); // so that the conversion moves no bytes
            Vec::from(m)
        }
        Err(_) => Vec::with_capacity(len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_the_algorithms_or_the_nodes() {
        let kinds: Vec<FrameKind> = (0..=255).filter_map(FrameKind::from_u8).collect();
        assert_eq!(kinds.len(), 18);
        let algorithm: Vec<u8> = kinds
            .iter()
            .filter(|k| k.is_algorithm())
            .map(|&k| k as u8)
            .collect();
        assert_eq!(algorithm, [1, 4, 5, 6, 7, 12, 14, 15]);
        let handshake: Vec<u8> = kinds
            .iter()
            .filter(|k| k.is_membership_handshake())
            .map(|&k| k as u8)
            .collect();
        assert_eq!(handshake, [9, 10, 11, 13, 16, 17]);
    }

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        FrameHeader {
            kind: FrameKind::Gossip,
            sender: 3,
            round: 0x0102_0304_0506_0708,
            dim: 5,
            payload_len: 2,
        }
        .emit(&mut out);
        out.extend_from_slice(&[0xAA, 0xBB]);
        out
    }

    #[test]
    fn layout_is_byte_exact_and_round_trips() {
        let f = sample();
        assert_eq!(f.len(), FRAME_HEADER_LEN + 2);
        assert_eq!(
            &f[..8],
            &[0x4D, 0x55, FRAME_VERSION, 1, 3, 0, 0, 0],
            "magic, version, kind, sender"
        );
        assert_eq!(&f[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        let (h, payload) = FrameHeader::parse(&f, 16).unwrap();
        assert_eq!(h.sender, 3);
        assert_eq!(h.round, 0x0102_0304_0506_0708);
        assert_eq!(h.dim, 5);
        assert_eq!(payload, &[0xAA, 0xBB]);
    }

    #[test]
    fn defects_are_named() {
        let f = sample();
        assert!(matches!(
            FrameHeader::parse(&f[..10], 16),
            Err(FrameError::Truncated {
                needed: 24,
                got: 10
            })
        ));
        assert!(matches!(
            FrameHeader::parse(&f[..25], 16),
            Err(FrameError::Truncated {
                needed: 26,
                got: 25
            })
        ));
        let mut bad = f.clone();
        bad[0] = 0;
        assert!(matches!(
            FrameHeader::parse(&bad, 16),
            Err(FrameError::BadMagic(_))
        ));
        let mut bad = f.clone();
        bad[2] = 7;
        assert_eq!(
            FrameHeader::parse(&bad, 16),
            Err(FrameError::UnknownVersion(7))
        );
        let mut bad = f.clone();
        bad[3] = 99;
        assert_eq!(
            FrameHeader::parse(&bad, 16),
            Err(FrameError::UnknownKind(99))
        );
        assert_eq!(
            FrameHeader::parse(&f, 1),
            Err(FrameError::TooLarge {
                declared: 2,
                limit: 1
            })
        );
        let mut bad = f.clone();
        bad.push(0);
        assert_eq!(
            FrameHeader::parse(&bad, 16),
            Err(FrameError::TrailingBytes { extra: 1 })
        );
    }
}
