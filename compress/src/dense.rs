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

/// Cast to IEEE-754 binary16 (see the module docs for rounding and saturation).
///
/// Payload: `d` binary16 values as little-endian `u16` (2·d bytes).
#[derive(Debug, Clone, Default)]
pub struct Fp16 {
    scratch: Vec<f16>,
}

/// Cast to bfloat16 (see the module docs for rounding and saturation).
///
/// Payload: `d` bfloat16 values as little-endian `u16` (2·d bytes).
#[derive(Debug, Clone, Default)]
pub struct Bf16 {
    scratch: Vec<bf16>,
}

/// Conversion chunk: large enough for the vectorised conversion, small enough for L1.
const CHUNK: usize = 4096;

impl Compressor for Fp16 {
    fn id(&self) -> OperatorId {
        OperatorId::Fp16
    }

    fn compress(&mut self, x: &[f32], _rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        assert_dim(x.len());
        let start = begin_message(OperatorId::Fp16, x.len(), 2 * x.len(), out);
        self.scratch.resize(CHUNK, f16::ZERO);
        for chunk in x.chunks(CHUNK) {
            let h = &mut self.scratch[..chunk.len()];
            h.convert_from_f32_slice(chunk);
            for (v, &f) in h.iter_mut().zip(chunk) {
                if v.is_infinite() && f.is_finite() {
                    *v = if f > 0.0 { f16::MAX } else { f16::MIN };
                }
            }
            put_u16s(h.reinterpret_cast(), out);
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

impl Compressor for Bf16 {
    fn id(&self) -> OperatorId {
        OperatorId::Bf16
    }

    fn compress(&mut self, x: &[f32], _rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        assert_dim(x.len());
        let start = begin_message(OperatorId::Bf16, x.len(), 2 * x.len(), out);
        self.scratch.resize(CHUNK, bf16::ZERO);
        for chunk in x.chunks(CHUNK) {
            let h = &mut self.scratch[..chunk.len()];
            h.convert_from_f32_slice(chunk);
            for (v, &f) in h.iter_mut().zip(chunk) {
                if v.is_infinite() && f.is_finite() {
                    *v = if f > 0.0 { bf16::MAX } else { bf16::MIN };
                }
            }
            put_u16s(h.reinterpret_cast(), out);
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

/// Slice widening from raw 16-bit patterns, for [`add_half`].
trait Half {
    fn widen(bits: &[u16], out: &mut [f32]);
}

impl Half for f16 {
    fn widen(bits: &[u16], out: &mut [f32]) {
        bits.reinterpret_cast::<f16>().convert_to_f32_slice(out);
    }
}

impl Half for bf16 {
    fn widen(bits: &[u16], out: &mut [f32]) {
        bits.reinterpret_cast::<bf16>().convert_to_f32_slice(out);
    }
}
