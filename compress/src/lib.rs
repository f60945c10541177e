//! Compression operators on `f32` vectors and their exact wire format.
//!
//! A compression operator `C: ℝ^d → ℝ^d` (the survey's "communication compression"
//! dimension: Tang, Shi, Chu et al. 2020/2023) turns a parameter or gradient vector
//! `x: [d]` into a message whose byte form travels between peers. Every operator of
//! this crate shares one self-describing message layout, so a receiver decodes any
//! message without being configured for the sender's operator:
//!
//! ```text
//! offset size field
//!      0    1 operator     u8   (see [`OperatorId`])
//!      1    1 version      u8   ([`WIRE_VERSION`])
//!      2    2 flags        u16  little-endian, reserved, must be 0
//!      4    4 dim          u32  little-endian, d: the length of the decoded vector
//!      8    4 payload_len  u32  little-endian, bytes that follow the header
//!     12    … payload      operator-specific, described on each operator
//! ```
//!
//! Decoding ([`decode_add`], [`decode_into`]) never panics on untrusted bytes and never
//! allocates: the caller supplies the output buffer of the dimension it expects, and a
//! message whose declared `dim` differs is refused before any payload is read.
//!
//! This crate performs no I/O. Randomised operators take an explicit RNG argument so a
//! run can be replayed from its seed.
//!
//! Operators here: [`Identity`] (no compression, 4 bytes per coordinate). The sparsifiers,
//! quantisers and error feedback of the survey follow the same trait.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use rand::Rng;
use thiserror::Error;

/// Version of the message layout written by this crate.
pub const WIRE_VERSION: u8 = 1;

/// Size of the common message header in bytes.
pub const HEADER_LEN: usize = 12;

/// Operator identifiers as they appear in byte 0 of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum OperatorId {
    /// [`Identity`]: `d` little-endian `f32` values.
    Identity = 0,
}

impl OperatorId {
    /// Maps the wire byte to an operator; `None` for an unknown byte.
    pub fn from_u8(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(Self::Identity),
            _ => None,
        }
    }

    /// The operator's name as used in configs and logs (`"identity"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Identity => "identity",
        }
    }
}

/// Why a message could not be decoded. Each defect has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header or the declared payload need.
    #[error("message truncated: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes required.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// Bytes after the declared payload.
    #[error("message has {extra} bytes after its declared payload")]
    TrailingBytes {
        /// Number of unexpected bytes.
        extra: usize,
    },
    /// The version byte is not one this crate reads.
    #[error("unknown wire version {0} (this build reads version {WIRE_VERSION})")]
    UnknownVersion(u8),
    /// The operator byte names no known operator.
    #[error("unknown compression operator id {0}")]
    UnknownOperator(u8),
    /// Reserved flag bits were set.
    #[error("reserved flags {0:#06x} set")]
    ReservedFlags(u16),
    /// The message is for a vector of another length than the receiver's.
    #[error("dimension mismatch: message has d = {got}, expected d = {expected}")]
    DimensionMismatch {
        /// The receiver's d.
        expected: usize,
        /// The message's d.
        got: usize,
    },
    /// The payload length does not match what the operator needs for `dim`.
    #[error(
        "payload length {declared} bytes does not match the {expected} bytes that {operator} needs"
    )]
    PayloadLength {
        /// Operator named by the header.
        operator: &'static str,
        /// Declared payload length.
        declared: usize,
        /// Length the operator requires.
        expected: usize,
    },
    /// A decoded value is NaN or infinite.
    #[error("non-finite value at coordinate {index}")]
    NonFinite {
        /// The first offending coordinate.
        index: usize,
    },
}

/// The parsed common header of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Operator that produced the payload.
    pub operator: OperatorId,
    /// Length `d` of the decoded vector.
    pub dim: usize,
    /// Bytes of payload after the header.
    pub payload_len: usize,
}

impl Header {
    /// Writes the 12-byte header at the end of `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.operator as u8);
        out.push(WIRE_VERSION);
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.dim as u32).to_le_bytes());
        out.extend_from_slice(&(self.payload_len as u32).to_le_bytes());
    }

    /// Parses the header and returns it with exactly the declared payload.
    ///
    /// Never panics. Errors: [`DecodeError::Truncated`], [`DecodeError::UnknownVersion`],
    /// [`DecodeError::UnknownOperator`], [`DecodeError::ReservedFlags`],
    /// [`DecodeError::TrailingBytes`].
    pub fn parse(msg: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
        if msg.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN,
                got: msg.len(),
            });
        }
        if msg[1] != WIRE_VERSION {
            return Err(DecodeError::UnknownVersion(msg[1]));
        }
        let operator = OperatorId::from_u8(msg[0]).ok_or(DecodeError::UnknownOperator(msg[0]))?;
        let flags = u16::from_le_bytes([msg[2], msg[3]]);
        if flags != 0 {
            return Err(DecodeError::ReservedFlags(flags));
        }
        let dim = u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]) as usize;
        let payload_len = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]) as usize;
        let rest = &msg[HEADER_LEN..];
        if rest.len() < payload_len {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN + payload_len,
                got: msg.len(),
            });
        }
        if rest.len() > payload_len {
            return Err(DecodeError::TrailingBytes {
                extra: rest.len() - payload_len,
            });
        }
        Ok((
            Header {
                operator,
                dim,
                payload_len,
            },
            rest,
        ))
    }
}

/// A compression operator `C` with its encoder.
///
/// Implementations may keep state between calls (error-feedback residuals, DGC momentum);
/// randomness comes only from the `rng` argument.
pub trait Compressor: Send {
    /// The operator's wire id.
    fn id(&self) -> OperatorId;

    /// Encodes `C(x)` for `x: [d]` as one complete message (header and payload), appended
    /// to `out`. Returns the number of bytes appended, which equals
    /// [`Compressor::encoded_len`] whenever that is `Some`.
    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize;

    /// Exact message size in bytes for a vector of length `d`, when it does not depend on
    /// the values (`None` for operators whose size varies with the data).
    fn encoded_len(&self, d: usize) -> Option<usize>;
}

/// The identity operator: `C(x) = x`, unbiased, no compression.
///
/// Payload: `d` values, each a little-endian IEEE-754 `f32` (4·d bytes).
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl Compressor for Identity {
    fn id(&self) -> OperatorId {
        OperatorId::Identity
    }

    fn compress(&mut self, x: &[f32], _rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        let payload_len = 4 * x.len();
        out.reserve(HEADER_LEN + payload_len);
        Header {
            operator: OperatorId::Identity,
            dim: x.len(),
            payload_len,
        }
        .emit(out);
        for v in x {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.len() - start
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(HEADER_LEN + 4 * d)
    }
}

/// Decodes `msg` and adds `scale · C(x)` into `acc: [d]`, where `d = acc.len()`.
///
/// This is the receive path of gossip averaging (`acc += W_ij · x_j`). The message is fully
/// validated before `acc` is touched: on `Err`, `acc` is unchanged. Never panics and never
/// allocates.
pub fn decode_add(msg: &[u8], scale: f32, acc: &mut [f32]) -> Result<(), DecodeError> {
    let (header, payload) = checked(msg, acc.len())?;
    match header.operator {
        OperatorId::Identity => {
            for (a, chunk) in acc.iter_mut().zip(payload.chunks_exact(4)) {
                *a += scale * f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            }
        }
    }
    Ok(())
}

/// Decodes `msg` into `out: [d]` (overwriting it), where `d = out.len()`.
///
/// Same validation as [`decode_add`]; on `Err`, `out` is unchanged.
pub fn decode_into(msg: &[u8], out: &mut [f32]) -> Result<(), DecodeError> {
    let (header, payload) = checked(msg, out.len())?;
    match header.operator {
        OperatorId::Identity => {
            for (o, chunk) in out.iter_mut().zip(payload.chunks_exact(4)) {
                *o = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            }
        }
    }
    Ok(())
}

/// Validates `msg` for a receiver of dimension `expected_dim` exactly as [`decode_add`] does,
/// without decoding: header, dimension, payload length and finiteness of every value.
/// `Ok` means `decode_add`/`decode_into` of the same bytes will succeed.
pub fn validate(msg: &[u8], expected_dim: usize) -> Result<Header, DecodeError> {
    checked(msg, expected_dim).map(|(h, _)| h)
}

/// Parses the header, checks the dimension and payload length, and checks that every
/// value is finite, so that decoding afterwards cannot fail half-way.
fn checked(msg: &[u8], expected_dim: usize) -> Result<(Header, &[u8]), DecodeError> {
    let (header, payload) = Header::parse(msg)?;
    if header.dim != expected_dim {
        return Err(DecodeError::DimensionMismatch {
            expected: expected_dim,
            got: header.dim,
        });
    }
    match header.operator {
        OperatorId::Identity => {
            let expected = 4 * expected_dim;
            if payload.len() != expected {
                return Err(DecodeError::PayloadLength {
                    operator: header.operator.name(),
                    declared: payload.len(),
                    expected,
                });
            }
            if let Some(index) = payload
                .chunks_exact(4)
                .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
            {
                return Err(DecodeError::NonFinite { index });
            }
        }
    }
    Ok((header, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    fn encode(x: &[f32]) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut out = Vec::new();
        let n = Identity.compress(x, &mut rng, &mut out);
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn header_layout_is_byte_exact() {
        let msg = encode(&[1.0, -2.0]);
        assert_eq!(
            &msg[..HEADER_LEN],
            &[0, WIRE_VERSION, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0]
        );
        assert_eq!(&msg[HEADER_LEN..HEADER_LEN + 4], &1.0f32.to_le_bytes());
        assert_eq!(msg.len(), Identity.encoded_len(2).unwrap());
    }

    #[test]
    fn decode_add_scales_and_accumulates() {
        let msg = encode(&[1.0, 2.0, 3.0]);
        let mut acc = [10.0, 10.0, 10.0];
        decode_add(&msg, 0.5, &mut acc).unwrap();
        assert_eq!(acc, [10.5, 11.0, 11.5]);
    }

    #[test]
    fn each_defect_has_its_error() {
        let good = encode(&[1.0, 2.0]);
        let mut out = [0.0; 2];
        assert_eq!(
            decode_into(&good[..5], &mut out),
            Err(DecodeError::Truncated { needed: 12, got: 5 })
        );
        assert_eq!(
            decode_into(&good[..good.len() - 1], &mut out),
            Err(DecodeError::Truncated {
                needed: 20,
                got: 19
            })
        );
        let mut bad = good.clone();
        bad[1] = 9;
        assert_eq!(
            decode_into(&bad, &mut out),
            Err(DecodeError::UnknownVersion(9))
        );
        let mut bad = good.clone();
        bad[0] = 200;
        assert_eq!(
            decode_into(&bad, &mut out),
            Err(DecodeError::UnknownOperator(200))
        );
        let mut bad = good.clone();
        bad[2] = 1;
        assert_eq!(
            decode_into(&bad, &mut out),
            Err(DecodeError::ReservedFlags(1))
        );
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(
            decode_into(&bad, &mut out),
            Err(DecodeError::TrailingBytes { extra: 1 })
        );
        let mut three = [0.0; 3];
        assert_eq!(
            decode_into(&good, &mut three),
            Err(DecodeError::DimensionMismatch {
                expected: 3,
                got: 2
            })
        );
        let nan = encode(&[1.0, f32::NAN]);
        let mut acc = [7.0, 7.0];
        assert_eq!(
            decode_add(&nan, 1.0, &mut acc),
            Err(DecodeError::NonFinite { index: 1 })
        );
        assert_eq!(
            acc,
            [7.0, 7.0],
            "a refused message must leave acc unchanged"
        );
        // Header says d = 2 but carries 3 values' worth of payload.
        let mut bad = good[..HEADER_LEN].to_vec();
        bad[8] = 12;
        bad.extend_from_slice(&[0u8; 12]);
        assert!(matches!(
            decode_into(&bad, &mut out),
            Err(DecodeError::PayloadLength {
                declared: 12,
                expected: 8,
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn identity_round_trip_is_exact(x in proptest::collection::vec(-1e30f32..1e30, 0..300)) {
            let msg = encode(&x);
            prop_assert_eq!(msg.len(), Identity.encoded_len(x.len()).unwrap());
            let mut out = vec![0.0; x.len()];
            decode_into(&msg, &mut out).unwrap();
            prop_assert_eq!(out, x);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), d in 0usize..8) {
            let mut out = vec![0.0; d];
            let _ = decode_into(&bytes, &mut out);
            let _ = decode_add(&bytes, 1.0, &mut out);
        }
    }
}
