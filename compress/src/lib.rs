//! Compression operators on `f32` vectors and their exact wire format.
//!
//! A compression operator `C: ℝ^d → ℝ^d` (the "communication compression" dimension of
//! the surveys by Tang, Shi, Chu et al. 2020/2023 and Shi, Tang, Chu et al.) turns a
//! parameter, gradient or difference vector `x: [d]` into a message whose bytes travel
//! between peers. Every algorithm (CHOCO-SGD, D-PSGD/SGP on compressed differences,
//! all-reduce and parameter server on compressed gradients) uses them through one trait,
//! [`Compressor`], and one receive path, [`decode_add`].
//!
//! | operator | type | unbiased | bound | bits per coordinate |
//! |---|---|---|---|---|
//! | [`Identity`] | none | yes | exact | 32 |
//! | [`TopK`] (exact, whole or layer-wise) | sparsifier | no | δ = k/d: ‖x−C(x)‖² ≤ (1−k/d)‖x‖² | 32(+16/32/varint index) per kept |
//! | [`ApproxTopK`] (sampled threshold) | sparsifier | no | top-k of its achieved k | as top-k |
//! | [`RandK`] unscaled / scaled | sparsifier | no / yes | δ = k/d / variance (d/k − 1)‖x‖² | 32 per kept, 64-bit seed |
//! | [`Qsgd`] (s levels, buckets) | quantiser | yes | variance ≤ min(b/s², √b/s)‖x‖² | 1 + ⌈log₂(s+1)⌉ |
//! | [`Int8`] (127 levels, absmax per bucket; QSGD's wire format) | quantiser | yes | variance ≤ b/(4·127²)‖x‖² | 8 |
//! | [`Sign`] (‖x‖₁/d · sign x) | quantiser | no | δ = ‖x‖₁²/(d‖x‖₂²) | 1 |
//! | [`TernGrad`] | quantiser | yes | variance ≤ ‖x‖∞‖x‖₁ − ‖x‖² per bucket | 2 |
//! | [`Natural`] | quantiser | yes | variance ≤ ‖x‖²/8 | 9 |
//! | [`Fp16`], [`Bf16`] | cast | no | relative error 2⁻¹¹, 2⁻⁸ | 16 |
//! | [`SparseLoco`] (top-k per chunk of C, 2-bit values, Rice-coded positions) | sparsifier + quantiser | no | top-k of each chunk, magnitudes at 2 levels | ≈ 3.5 + log₂(C/k) per kept (at most 3 + ⌈log₂ C⌉) + 80 per chunk |
//!
//! [`ErrorFeedback`] turns any of them into an error-feedback operator (residual memory,
//! 1-bit SGD / EF-SGD), and [`Dgc`] adds deep gradient compression's momentum correction,
//! momentum-factor masking and sparsity warm-up on top of top-k. [`CompressorSpec`] parses
//! the text form used by configs and `--compressor` (`topk:0.01`, `ef+sign`, …).
//!
//! # Wire format (version 1)
//!
//! Every message is self-describing: a receiver decodes any message without being told
//! the sender's operator. All integers and floats are little-endian; `f32` is IEEE-754
//! binary32. Offsets are in bytes.
//!
//! ```text
//! offset size field
//!      0    1 operator     u8   (see OperatorId: identity 0, topk 1, approx-topk 2, randk 3,
//!                                qsgd 4, sign 5, terngrad 6, natural 7, fp16 8, bf16 9)
//!      1    1 version      u8   (WIRE_VERSION = 1)
//!      2    2 flags        u16  reserved, must be 0
//!      4    4 dim          u32  d, the length of the decoded vector
//!      8    4 payload_len  u32  bytes that follow the header
//!     12    … payload      the operator's parameters, then its data, as below
//! ```
//!
//! Bit-packed fields are LSB-first: code `i` of width `w` occupies bits `[i·w, (i+1)·w)` of
//! the stream, bit `j` of the stream being bit `j mod 8` of byte `⌊j/8⌋`; the last byte is
//! padded with zero bits, which readers ignore. `nb = ⌈d/bucket⌉` is the number of buckets
//! (bucket `b` covers coordinates `[b·bucket, min((b+1)·bucket, d))`).
//!
//! **identity** — `4d` bytes: the `d` values as `f32`.
//!
//! **topk, approx-topk** — a sparse vector:
//!
//! ```text
//!      0    4 k        u32  number of kept coordinates, k ≤ d
//!      4    1 coding   u8   index coding: 0 = u16 absolute (only when d ≤ 65536),
//!                           1 = u32 absolute, 2 = LEB128 varint deltas
//!      5    3 reserved      must be 0
//!      8    … indices       k indices, strictly increasing, each < d:
//!                             coding 0: k × u16; coding 1: k × u32;
//!                             coding 2: i₀, then i_m − i_{m−1} − 1 for m ≥ 1, each as an
//!                             minimal unsigned LEB128 varint of at most 5 bytes and 32 bits
//!      …   4k values   f32  the kept values, in index order
//! ```
//!
//! **randk** — indices travel as a seed; the receiver regenerates them with SplitMix64 and
//! Floyd's algorithm (see [`rng`]):
//!
//! ```text
//!      0    4 k        u32  k ≤ d
//!      4    4 reserved      must be 0
//!      8    8 seed     u64
//!     16   4k values   f32  the values at the k selected indices, in increasing index order
//! ```
//!
//! **qsgd** — `s` levels, stochastic rounding per bucket:
//!
//! ```text
//!      0    2 s        u16  number of levels, s ≥ 1
//!      2    1 width    u8   level bits w = bit length of s (⌈log₂(s+1)⌉)
//!      3    1 reserved      must be 0
//!      4    4 bucket   u32  bucket size ≥ 1
//!      8  4nb norms    f32  ‖x_b‖₂ per bucket, finite, ≥ 0
//!      …    … codes         d codes of 1 + w bits: bit 0 = sign (1 = negative),
//!                           bits 1..=w = level l ≤ s;  value = ±norm_b · l / s
//! ```
//!
//! **int8** is written as a qsgd message with s = 127 (w = 7: one byte per code) whose
//! "norm" field holds max_i |x_i| over the bucket; decoders read it as qsgd.
//!
//! **sign** — scaled sign, one bit per coordinate:
//!
//! ```text
//!      0    4 bucket   u32  bucket size ≥ 1 (d for one scale over the whole vector)
//!      4  4nb scales   f32  ‖x_b‖₁ / |b| per bucket, finite, ≥ 0
//!      …  ⌈d/8⌉ signs       d bits, 1 = negative;  value = ±scale_b
//! ```
//!
//! **terngrad** — ternary levels:
//!
//! ```text
//!      0    4 bucket   u32  bucket size ≥ 1
//!      4  4nb scales   f32  max_i |x_i| over the bucket, finite, ≥ 0
//!      …  ⌈d/4⌉ codes       d codes of 2 bits: 0 → 0, 1 → +scale_b, 2 → −scale_b (3 invalid)
//! ```
//!
//! **natural** — powers of two:
//!
//! ```text
//!      0    d exponents u8  e = 0 → 0; 1 ≤ e ≤ 254 → 2^(e−127); 255 invalid
//!      d  ⌈d/8⌉ signs       d bits, 1 = negative
//! ```
//!
//! **fp16**, **bf16** — `2d` bytes: `d` IEEE-754 binary16 / bfloat16 values as `u16`.
//!
//! # Decoding untrusted bytes
//!
//! [`decode_add`], [`decode_into`] and [`validate`] never panic. They check the whole
//! message — header, `d` against the receiver's buffer, parameters, payload length, every
//! index, scale and value — before the output is touched, so a refused message leaves it
//! unchanged. Each defect has its own [`DecodeError`] variant. They allocate nothing,
//! except random-k's regenerated index set (`⌈d/64⌉` words, where `d` has already been
//! checked against the caller's buffer).
//!
//! This crate performs no I/O. Randomised operators take the caller's RNG, so a run is
//! replayed from its seed.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use rand::Rng;

mod dense;
mod ef;
mod quant;
pub mod rng;
mod select;
mod sparse;
mod sparseloco;
mod spec;
mod wire;

pub use dense::{Bf16, Cast, Fp16, Half, Identity};
pub use ef::{Dgc, DgcConfig, ErrorFeedback};
pub use quant::{Int8, Natural, Qsgd, Sign, TernGrad};
pub use select::{top_k_exact, top_k_threshold};
pub use sparse::{ApproxTopK, IndexCoding, RandK, TopK};
pub use sparseloco::SparseLoco;
pub use spec::{CompressorSpec, SpecError};
pub use wire::{packed_len, DecodeError, Header, OperatorId, HEADER_LEN, WIRE_VERSION};

/// A compression operator `C` with its encoder.
///
/// Implementations may keep state between calls (error-feedback residuals, DGC momentum);
/// randomness comes only from the `rng` argument, so a run replays from its seed.
pub trait Compressor: Send {
    /// The wire id of the messages this operator writes.
    fn id(&self) -> OperatorId;

    /// Encodes `C(x)` for `x: [d]` (`d < 2³²`) as one complete message (header and payload),
    /// appended to `out`. Returns the number of bytes appended: the exact bytes on the wire,
    /// equal to [`Compressor::encoded_len`] whenever that is `Some`.
    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize;

    /// Exact message size in bytes for a vector of length `d`, when it does not depend on
    /// the values; `None` for operators whose size varies with the data (approximate top-k,
    /// varint index coding).
    fn encoded_len(&self, d: usize) -> Option<usize>;

    /// An upper bound on the message size in bytes for a vector of length `d`.
    fn max_encoded_len(&self, d: usize) -> usize;

    /// Whether `E[C(x)] = x` (over the operator's randomness).
    fn unbiased(&self) -> bool;

    /// Tells the operator the current epoch (0-based), for schedules such as DGC's warm-up.
    /// The default does nothing.
    fn set_epoch(&mut self, _epoch: usize) {}

    /// The state this operator carries from call to call, as named vectors `[d]`, for a
    /// checkpoint: error feedback's residual `e`, DGC's `u` and `v`. Empty for stateless
    /// operators (the default) and before the first call.
    fn state(&self) -> Vec<(&'static str, Vec<f32>)> {
        Vec::new()
    }

    /// Restores what [`Compressor::state`] returned for vectors of length `d`, so that the
    /// next call continues as the saved operator would have. An empty `state` leaves the
    /// operator as it is.
    ///
    /// # Errors
    /// [`StateError`] if the names are not this operator's, a vector's length is not `d`,
    /// or a value is not finite; the operator is unchanged then.
    fn restore_state(&mut self, d: usize, state: &[(String, Vec<f32>)]) -> Result<(), StateError> {
        let _ = d;
        match state.first() {
            None => Ok(()),
            Some((name, _)) => Err(StateError(format!(
                "{:?} keeps no state, but the saved state has {name:?}",
                self.id()
            ))),
        }
    }
}

/// A saved compressor or algorithm state that does not fit the operator or algorithm it is
/// restored into.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot restore the saved state: {0}")]
pub struct StateError(pub String);

/// Checks a saved state of named vectors: exactly the names `want`, in that order, each of
/// length `d` and finite.
///
/// # Errors
/// [`StateError`] naming what differs.
pub fn check_state(
    state: &[(String, Vec<f32>)],
    want: &[&str],
    d: usize,
) -> Result<(), StateError> {
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    if names != want {
        return Err(StateError(format!("expected {want:?}, got {names:?}")));
    }
    for (name, v) in state {
        if v.len() != d {
            return Err(StateError(format!(
                "{name:?} has {} values, expected d = {d}",
                v.len()
            )));
        }
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(StateError(format!(
                "{name:?}[{i}] = {} is not finite",
                v[i]
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::k_for_ratio;

    #[test]
    fn k_for_ratio_is_the_ceiling_without_rounding_noise() {
        assert_eq!(k_for_ratio(0.07, 100), 7);
        assert_eq!(k_for_ratio(0.01, 25_600_000), 256_000);
        assert_eq!(k_for_ratio(0.011, 100), 2);
        assert_eq!(k_for_ratio(1e-9, 10), 1);
        assert_eq!(k_for_ratio(1.0, 10), 10);
        assert_eq!(k_for_ratio(0.5, 0), 0);
        for d in [100usize, 1000, 10_000] {
            for i in 1..=1000 {
                let exact = (i * d).div_ceil(1000); // ⌈(i/1000)·d⌉ in integers
                assert_eq!(
                    k_for_ratio(i as f64 / 1000.0, d),
                    exact.max(1),
                    "{i}/1000 of {d}"
                );
            }
        }
    }
}

impl<C: Compressor + ?Sized> Compressor for Box<C> {
    fn id(&self) -> OperatorId {
        (**self).id()
    }
    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        (**self).compress(x, rng, out)
    }
    fn encoded_len(&self, d: usize) -> Option<usize> {
        (**self).encoded_len(d)
    }
    fn max_encoded_len(&self, d: usize) -> usize {
        (**self).max_encoded_len(d)
    }
    fn unbiased(&self) -> bool {
        (**self).unbiased()
    }
    fn set_epoch(&mut self, epoch: usize) {
        (**self).set_epoch(epoch)
    }
    fn state(&self) -> Vec<(&'static str, Vec<f32>)> {
        (**self).state()
    }
    fn restore_state(&mut self, d: usize, state: &[(String, Vec<f32>)]) -> Result<(), StateError> {
        (**self).restore_state(d, state)
    }
}

/// What a valid message holds, from [`validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageInfo {
    /// The parsed header.
    pub header: Header,
    /// Number of coordinates the message carries explicitly: `k` for the sparsifiers
    /// (the achieved k of approximate top-k), `d` for the dense operators.
    pub nnz: usize,
}

/// Decodes `msg` and adds `scale · C(x)` into `acc: [d]`, where `d = acc.len()`.
///
/// This is the receive path of gossip averaging (`acc += W_ij · x_j`). The message is fully
/// validated before `acc` is touched: on `Err`, `acc` is unchanged. Never panics.
pub fn decode_add(msg: &[u8], scale: f32, acc: &mut [f32]) -> Result<(), DecodeError> {
    let (info, payload) = checked(msg, acc.len())?;
    add_payload(info.header.operator, payload, scale, acc);
    Ok(())
}

/// Decodes `msg` into `out: [d]` (overwriting it), where `d = out.len()`.
///
/// Same validation as [`decode_add`]; on `Err`, `out` is unchanged.
pub fn decode_into(msg: &[u8], out: &mut [f32]) -> Result<(), DecodeError> {
    let (info, payload) = checked(msg, out.len())?;
    out.fill(0.0);
    add_payload(info.header.operator, payload, 1.0, out);
    Ok(())
}

/// Validates `msg` for a receiver of dimension `expected_dim` exactly as [`decode_add`] does,
/// without decoding. `Ok` means `decode_add`/`decode_into` of the same bytes will succeed.
pub fn validate(msg: &[u8], expected_dim: usize) -> Result<MessageInfo, DecodeError> {
    checked(msg, expected_dim).map(|(info, _)| info)
}

/// Parses the header, checks the dimension, and has the operator check its whole payload,
/// so that decoding afterwards cannot fail half-way.
fn checked(msg: &[u8], expected_dim: usize) -> Result<(MessageInfo, &[u8]), DecodeError> {
    let (header, payload) = Header::parse(msg)?;
    if header.dim != expected_dim {
        return Err(DecodeError::DimensionMismatch {
            expected: expected_dim,
            got: header.dim,
        });
    }
    let d = header.dim;
    let nnz = match header.operator {
        OperatorId::Identity | OperatorId::Fp16 | OperatorId::Bf16 => {
            dense::validate(header.operator, payload, d)?
        }
        OperatorId::TopK | OperatorId::ApproxTopK | OperatorId::RandK => {
            sparse::validate(header.operator, payload, d)?
        }
        OperatorId::SparseLoco => sparseloco::validate(payload, d)?,
        OperatorId::Qsgd | OperatorId::Sign | OperatorId::TernGrad | OperatorId::Natural => {
            quant::validate(header.operator, payload, d)?
        }
    };
    Ok((MessageInfo { header, nnz }, payload))
}

/// Adds `scale · C(x)` of an already validated payload into `acc`.
fn add_payload(op: OperatorId, payload: &[u8], scale: f32, acc: &mut [f32]) {
    match op {
        OperatorId::Identity | OperatorId::Fp16 | OperatorId::Bf16 => {
            dense::add(op, payload, scale, acc)
        }
        OperatorId::TopK | OperatorId::ApproxTopK | OperatorId::RandK => {
            sparse::add(op, payload, scale, acc)
        }
        OperatorId::SparseLoco => sparseloco::add(payload, scale, acc),
        OperatorId::Qsgd | OperatorId::Sign | OperatorId::TernGrad | OperatorId::Natural => {
            quant::add(op, payload, scale, acc)
        }
    }
}

/// Number of coordinates kept by a ratio `0 < ratio ≤ 1` of `d`: `⌈ratio·d⌉`, at least 1
/// when `d ≥ 1`, at most `d`.
pub fn k_for_ratio(ratio: f64, d: usize) -> usize {
    if d == 0 {
        return 0;
    }
    let r = ratio * d as f64;
    // ratio·d within rounding of an integer is that integer (0.07 · 100 = 7.000000000000001
    // keeps 7, not 8).
    let k = if (r - r.round()).abs() <= 4.0 * f64::EPSILON * r.abs().max(1.0) {
        r.round()
    } else {
        r.ceil()
    };
    (k as usize).clamp(1, d)
}
/// Panics with a clear message if `d` cannot be expressed in the header (`d ≥ 2³²`).
/// Encoders call it first: such a vector is a caller bug, not untrusted input.
pub(crate) fn assert_dim(d: usize) {
    assert!(
        u32::try_from(d).is_ok(),
        "murmur-compress: vectors of d ≥ 2^32 coordinates cannot be encoded (d = {d})"
    );
}
