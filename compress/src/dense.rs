//! Dense operators: identity and the 16-bit casts.
//!
//! - [`Identity`]: `C(x) = x`, unbiased, 32 bits per coordinate.
//! - [`Fp16`]: IEEE-754 binary16 (1 sign, 5 exponent, 10 mantissa bits), round to nearest
//!   even; relative error ≤ 2⁻¹¹ for |x| in the normal range [2⁻¹⁴, 65504]. Values beyond
//!   ±65504 saturate to ±65504 instead of becoming infinite (a finite model stays finite);
//!   |x| ≤ 2⁻²⁵ rounds to zero. Biased (deterministic rounding). The survey's
//!   "low-precision" baseline (Micikevicius et al. 2018, mixed-precision training).
//! - [`Bf16`]: bfloat16 (the upper 16 bits of an `f32`), round to nearest even; same range
//!   as `f32`, relative error ≤ 2⁻⁸. Biased. Values that would round up to infinity
//!   saturate to the largest finite bfloat16.
//!
//! Conversions use the `half` crate's slice conversions, which use the F16C instructions
//! when the CPU has them.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use rand::Rng;

use crate::wire::{begin_message, finish_message, first_non_finite, put_f32s};
use crate::{assert_dim, Compressor, DecodeError, OperatorId, HEADER_LEN};

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
        assert_dim(x.len());
        let start = begin_message(OperatorId::Identity, x.len(), 4 * x.len(), out);
        put_f32s(x, out);
        finish_message(start, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(HEADER_LEN + 4 * d)
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        HEADER_LEN + 4 * d
    }

    fn unbiased(&self) -> bool {
        true
    }
}

/// A cast to a 16-bit float format `H` (see the module docs for rounding and saturation):
/// [`Fp16`] or [`Bf16`].
///
/// Payload: `d` values of `H` as little-endian `u16` (2·d bytes).
#[derive(Debug, Clone, Default)]
pub struct Cast<H> {
    scratch: Vec<H>,
}

/// Cast to IEEE-754 binary16.
pub type Fp16 = Cast<f16>;

/// Cast to bfloat16.
pub type Bf16 = Cast<bf16>;

/// Conversion chunk: large enough for the vectorised conversion, small enough for L1.
const CHUNK: usize = 4096;

impl<H: Half> Compressor for Cast<H> {
    fn id(&self) -> OperatorId {
        H::ID
    }

    fn compress(&mut self, x: &[f32], _rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        assert_dim(x.len());
        let start = begin_message(H::ID, x.len(), 2 * x.len(), out);
        self.scratch.resize(CHUNK, H::default());
        for chunk in x.chunks(CHUNK) {
            let h = &mut self.scratch[..chunk.len()];
            H::narrow(chunk, h);
            put_u16s(H::bits(h), out);
        }
        finish_message(start, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(HEADER_LEN + 2 * d)
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        HEADER_LEN + 2 * d
    }

    fn unbiased(&self) -> bool {
        false
    }
}

/// Appends 16-bit patterns as little-endian bytes.
fn put_u16s(bits: &[u16], out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + 2 * bits.len(), 0);
    for (o, b) in out[at..].chunks_exact_mut(2).zip(bits) {
        o.copy_from_slice(&b.to_le_bytes());
    }
}

/// Checks a dense payload; returns the number of coordinates (d).
pub(crate) fn validate(op: OperatorId, payload: &[u8], d: usize) -> Result<usize, DecodeError> {
    let width = if op == OperatorId::Identity { 4 } else { 2 };
    let expected = width * d;
    if payload.len() != expected {
        return Err(DecodeError::PayloadLength {
            operator: op.name(),
            declared: payload.len(),
            expected,
        });
    }
    let bad = match op {
        OperatorId::Identity => first_non_finite(payload),
        OperatorId::Fp16 => payload
            .chunks_exact(2)
            .position(|c| !f16::from_bits(u16::from_le_bytes([c[0], c[1]])).is_finite()),
        _ => payload
            .chunks_exact(2)
            .position(|c| !bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).is_finite()),
    };
    match bad {
        Some(index) => Err(DecodeError::NonFinite { index }),
        None => Ok(d),
    }
}

/// `acc += scale · C(x)` for a validated dense payload.
pub(crate) fn add(op: OperatorId, payload: &[u8], scale: f32, acc: &mut [f32]) {
    match op {
        OperatorId::Identity => {
            for (a, c) in acc.iter_mut().zip(payload.chunks_exact(4)) {
                *a += scale * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        OperatorId::Fp16 => add_half::<f16>(payload, scale, acc),
        _ => add_half::<bf16>(payload, scale, acc),
    }
}

/// The 16-bit formats' shared receive path: widen a chunk at a time, then accumulate.
fn add_half<H: Half>(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let mut bits = [0u16; CHUNK];
    let mut wide = [0f32; CHUNK];
    for (a, p) in acc.chunks_mut(CHUNK).zip(payload.chunks(2 * CHUNK)) {
        let n = a.len();
        for (b, c) in bits[..n].iter_mut().zip(p.chunks_exact(2)) {
            *b = u16::from_le_bytes([c[0], c[1]]);
        }
        H::widen(&bits[..n], &mut wide[..n]);
        for (x, &w) in a.iter_mut().zip(&wide[..n]) {
            *x += scale * w;
        }
    }
}

/// The two 16-bit formats: wire id, saturating narrowing from `f32`, widening.
pub trait Half: Copy + Default + Send + std::fmt::Debug + 'static {
    /// The operator id of the cast to this format.
    const ID: OperatorId;
    /// `out[i] = x[i]` rounded to nearest even, finite values beyond the range saturating
    /// to the largest finite value of the sign.
    fn narrow(x: &[f32], out: &mut [Self]);
    /// The raw 16-bit patterns.
    fn bits(h: &[Self]) -> &[u16];
    /// `out[i]` = the value of the pattern `bits[i]`.
    fn widen(bits: &[u16], out: &mut [f32]);
}

macro_rules! half_format {
    ($t:ty, $id:expr) => {
        impl Half for $t {
            const ID: OperatorId = $id;
            fn narrow(x: &[f32], out: &mut [Self]) {
                out.convert_from_f32_slice(x);
                for (v, &f) in out.iter_mut().zip(x) {
                    if v.is_infinite() && f.is_finite() {
                        *v = if f > 0.0 { <$t>::MAX } else { <$t>::MIN };
                    }
                }
            }
            fn bits(h: &[Self]) -> &[u16] {
                h.reinterpret_cast()
            }
            fn widen(bits: &[u16], out: &mut [f32]) {
                bits.reinterpret_cast::<$t>().convert_to_f32_slice(out);
            }
        }
    };
}

half_format!(f16, OperatorId::Fp16);
half_format!(bf16, OperatorId::Bf16);
