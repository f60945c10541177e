//! Quantisers: QSGD, scaled sign, TernGrad and natural compression.
//!
//! - [`Qsgd`] (Alistarh, Grubic, Li, Tomioka & Vojnović 2017, "QSGD: Communication-efficient
//!   SGD via gradient quantization and encoding"): per bucket of `b` coordinates, `s` levels
//!   and stochastic rounding of `|x_i|/‖x_b‖₂ · s` to a neighbouring integer. Unbiased;
//!   variance E‖C(x) − x‖² ≤ min(b/s², √b/s)·‖x‖² (their Lemma 3.1, applied per bucket).
//! - [`Int8`]: QSGD's code with 127 levels and the bucket's largest magnitude in place of
//!   its norm (absmax scaling, as in Dettmers, Lewis, Belkada & Zettlemoyer 2022,
//!   "LLM.int8()"), for 8-bit pseudo-gradients such as INTELLECT-1's (Prime Intellect
//!   2024). Unbiased; E‖C(x) − x‖² ≤ Σ_b |b|·(‖x_b‖∞/127)²/4 ≤
//!   b/(4·127²)·‖x‖². Its messages are QSGD messages.
//! - [`Sign`] (signSGD, Bernstein, Wang, Azizzadenesheli & Anandkumar 2018; the scaled sign of
//!   EF-signSGD, Karimireddy, Rebjock, Stich & Jaggi 2019, "Error feedback fixes SignSGD"):
//!   `C(x)_i = ‖x_b‖₁/|b| · sign(x_i)`. Biased, deterministic; a δ-contraction per bucket
//!   with δ = ‖x_b‖₁²/(|b|·‖x_b‖₂²): ‖x − C(x)‖² = ‖x‖² − Σ_b ‖x_b‖₁²/|b| ≤ (1 − δ)‖x‖².
//! - [`TernGrad`] (Wen, Xu, Yan, Wu, Wang, Chen & Li 2017, "TernGrad: Ternary gradients to
//!   reduce communication in distributed deep learning"): `C(x)_i = s_b · sign(x_i) · β_i`
//!   with `s_b = max_{i∈b} |x_i|` and `β_i ~ Bernoulli(|x_i|/s_b)`. Unbiased; variance
//!   Σ_b (‖x_b‖∞‖x_b‖₁ − ‖x_b‖²). The paper's gradient clipping (to 2.5 standard
//!   deviations) is a training-side choice, not part of the operator, and is not applied.
//! - [`Natural`] (Horváth, Ho, Horváth, Sahu, Canini & Richtárik 2019, "Natural compression
//!   for distributed deep learning"): each |x_i| ∈ [2^e, 2^(e+1)) becomes 2^e or 2^(e+1),
//!   up with probability (|x_i| − 2^e)/2^e. Unbiased; variance ≤ ‖x‖²/8 (ω = 1/8) for
//!   inputs in the normal `f32` range. Below 2⁻¹²⁶ (subnormals) it rounds to 0 or 2⁻¹²⁶
//!   with probability |x_i|/2⁻¹²⁶, still unbiased, with variance ≤ 2⁻¹²⁶·|x_i| (which can
//!   exceed x_i²/8, but is below 2⁻²⁵² in absolute terms). A value in [2¹²⁷, 2¹²⁸) that
//!   would round up to 2¹²⁸ (not an `f32`) saturates at 2¹²⁷: a downward bias that only
//!   the largest finite values see.
//!
//! The byte layouts are in the crate docs. Choices the layouts leave open:
//!
//! - **Signs.** A sign bit is 1 exactly when `x_i < 0`: zero, `−0.0` and NaN count as
//!   non-negative. [`Sign`] therefore maps 0 to `+scale_b`. QSGD writes the sign of `x_i`
//!   even when its level rounds to 0 (the decoder accepts either sign with level 0).
//! - **Buckets.** Coordinates are split into buckets of `bucket` consecutive coordinates,
//!   the last one possibly shorter. The bucket field is `min(bucket, 2³² − 1)` (any size
//!   ≥ d means one bucket); a whole-vector [`Sign`] or [`TernGrad`] writes `d` (1 when
//!   d = 0).
//! - **Sums.** ‖x_b‖₂² and ‖x_b‖₁ are summed in `f64` (squares of `f32` are exact there and
//!   cannot overflow) over eight interleaved lanes: element `j` of the bucket goes to lane
//!   `j mod 8`, and the lanes are combined as `((l₀+l₁)+(l₂+l₃))+((l₄+l₅)+(l₆+l₇))`. QSGD's
//!   norm is the `f64` square root rounded to `f32`; Sign's scale is the `f64` sum divided
//!   by |b| in `f64`, rounded to `f32`. This fixes every bit of the messages.
//! - **Formulas** (all `f32`): QSGD `r_i = |x_i| · (s / norm_b)` (or `(|x_i| / norm_b) · s`
//!   when `s / norm_b` overflows), `l_i = ⌊min(r_i + u_i, s)⌋` (stochastic rounding: up
//!   with probability `r_i − ⌊r_i⌋`), decoded as `±(norm_b · (l_i / s))` (never above the
//!   norm);
//!   TernGrad `β_i = [u_i < |x_i| / s_b]`, decoded as `s_b · t_i` with `t_i ∈ {0, 1, −1}`;
//!   natural: up exactly when `u_i < (|x_i| − 2^e)/2^e` (`|x_i|/2⁻¹²⁶` below 2⁻¹²⁶). A
//!   bucket of norm (scale) 0 encodes all codes 0, and so does a QSGD bucket whose norm is
//!   not finite (a message the receiver refuses).
//!
//! # Randomness
//!
//! A random operator (QSGD, TernGrad, natural; not Sign) draws exactly one `u64` seed per
//! message from the caller's RNG — also when d = 0 — and runs a [`Dither`] stream from
//! it. Coordinate `i` (counted over the whole vector, not per bucket) uses output `i` of
//! that stream as the 24-bit uniform `u_i = (output >> 8) · 2⁻²⁴` in [0, 1). A message is
//! thus a pure function of `x` and the seed, so runs replay. Because `u_i` has 24 bits, a
//! rounding probability `p` is realised as `⌈p·2²⁴⌉/2²⁴` (TernGrad, natural): a bias below
//! 2⁻²⁴ of one quantisation step. QSGD rounds `r_i + u_i` to `f32` first, which adds at most
//! half an ulp of `s` (2⁻²⁰ of a step for the default s = 15).
//!
//! # Non-finite input
//!
//! The encoders never panic. A NaN or infinite input gives a NaN or infinite norm/scale, which the decoder refuses with
//! [`DecodeError::NonFiniteScale`]; natural compression writes exponent 255 for a NaN or
//! infinite value, refused with [`DecodeError::BadCode`]. A diverged model is thus refused
//! by its receivers rather than spread. One finite input is refused too: a QSGD bucket
//! whose norm exceeds `f32::MAX` (coordinates near ±3.4e38) has an infinite norm; the
//! norm is sent once per bucket and cannot saturate without biasing every coordinate.
//!
//! # Decoding
//!
//! `validate` checks parameters, the exact payload length (computed without overflow from
//! the untrusted `d` and bucket size), every scale and every code; `add` then decodes a
//! block of [`CHUNK`] codes at a time into a stack buffer and accumulates bucket by bucket,
//! without checking again and without allocating.

use rand::Rng;

use crate::rng::Dither;
use crate::wire::{
    begin_message, check_scales, f32_at, finish_message, packed_len, BitReader, BitWriter, Reader,
};
use crate::{assert_dim, Compressor, DecodeError, OperatorId, HEADER_LEN};

/// Coordinates processed per block (uniforms, codes). A multiple of 64, so that blocks
/// start on byte boundaries of every packed stream.
const CHUNK: usize = 1024;
/// Bytes of QSGD's parameters (s, width, reserved, bucket).
const QSGD_PARAMS: usize = 8;
/// Bytes of Sign's and TernGrad's parameters (bucket).
const BUCKET_PARAMS: usize = 4;
/// 2⁻²⁴: the weight of one step of a 24-bit uniform.
const UNIT: f32 = 1.0 / (1u32 << 24) as f32;
/// 2²³: adding it to 0 ≤ r < 2²³ rounds r to an integer held in the mantissa bits.
const MAGIC: f32 = (1u32 << 23) as f32;

/// The bucket size as written on the wire: sizes beyond `u32` mean one bucket anyway.
fn wire_bucket(bucket: usize) -> usize {
    bucket.min(u32::MAX as usize)
}

/// Bit length of `s` (QSGD's level width `w`, ⌈log₂(s+1)⌉).
fn bit_length(s: u16) -> u32 {
    16 - s.leading_zeros()
}

/// A [`DecodeError::BadParameter`].
fn bad(op: OperatorId, name: &'static str, value: u64) -> DecodeError {
    DecodeError::BadParameter {
        operator: op.name(),
        name,
        value,
    }
}

// ---------------------------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------------------------

/// QSGD (Alistarh et al. 2017) with `s` levels and buckets of `b` coordinates: per bucket,
/// `C(x)_i = ±‖x_b‖₂ · l_i/s` where `l_i` rounds `|x_i|/‖x_b‖₂ · s` stochastically to one of
/// its two neighbouring integers. Unbiased; E‖C(x) − x‖² ≤ min(b/s², √b/s)·‖x‖²
/// ([`Qsgd::variance_factor`]).
///
/// Message for `x: [d]`: parameters (8 bytes), `⌈d/b⌉` norms (`f32`), then `d` codes of
/// `1 + w` bits, `w` the bit length of `s` (s = 1: 2 bits, s = 15: 5, s = 255: 9).
///
/// Randomness: one `u64` from the caller's RNG per message seeds a [`Dither`] stream;
/// coordinate `i` uses its output `i` (see the module docs), so a message is a pure
/// function of `x` and that seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qsgd {
    levels: u16,
    bucket: usize,
}

impl Qsgd {
    /// QSGD with `levels` = s ≥ 1 quantisation levels per sign and buckets of `bucket ≥ 1`
    /// coordinates (the paper's bucketed variant; `bucket ≥ d` is one bucket).
    ///
    /// # Panics
    /// If `levels == 0` or `bucket == 0`.
    pub fn new(levels: u16, bucket: usize) -> Self {
        assert!(levels >= 1, "QSGD needs at least one level (levels = 0)");
        assert!(
            bucket >= 1,
            "QSGD bucket size must be at least 1 (bucket = 0)"
        );
        Self { levels, bucket }
    }

    /// The number of levels `s`.
    pub fn levels(&self) -> u16 {
        self.levels
    }

    /// The bucket size `b` in coordinates.
    pub fn bucket(&self) -> usize {
        self.bucket
    }

    /// Bits per coordinate on the wire: `1 + w`, `w` the bit length of `s`.
    pub fn code_bits(&self) -> u32 {
        1 + bit_length(self.levels)
    }

    /// The variance factor `min(b/s², √b/s)` of the bound E‖C(x) − x‖² ≤ factor·‖x‖², for a
    /// vector of length `d` (the bucket size is capped at `d`).
    pub fn variance_factor(&self, d: usize) -> f64 {
        let b = self.bucket.min(d.max(1)) as f64;
        let s = self.levels as f64;
        (b / (s * s)).min(b.sqrt() / s)
    }

    fn len(&self, d: usize) -> usize {
        let nb = d.div_ceil(wire_bucket(self.bucket));
        HEADER_LEN + QSGD_PARAMS + 4 * nb + packed_len(d, self.code_bits())
    }

    /// Appends the QSGD message of `x` with `scale_of(x_b)` as each bucket's norm field:
    /// ‖x_b‖₂ for QSGD, max |x_i| for [`Int8`].
    fn encode(
        &self,
        x: &[f32],
        rng: &mut dyn Rng,
        scale_of: impl Fn(&[f32]) -> f32,
        out: &mut Vec<u8>,
    ) -> usize {
        let d = x.len();
        assert_dim(d);
        let seed = rng.next_u64();
        let s = self.levels;
        let w = bit_length(s);
        let bucket = wire_bucket(self.bucket);
        let start = begin_message(OperatorId::Qsgd, d, self.len(d) - HEADER_LEN, out);
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&[w as u8, 0]);
        out.extend_from_slice(&(bucket as u32).to_le_bytes());
        let codes = |xp: &[f32], u: &[u32], norm, c: &mut [u32]| qsgd_codes(xp, u, norm, s, c);
        bucketed_encode(x, bucket, seed, 1 + w, scale_of, codes, out);
        finish_message(start, out)
    }
}

impl Compressor for Qsgd {
    fn id(&self) -> OperatorId {
        OperatorId::Qsgd
    }

    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        self.encode(x, rng, |xb: &[f32]| sum_sq(xb).sqrt() as f32, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(self.len(d))
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        self.len(d)
    }

    fn unbiased(&self) -> bool {
        true
    }
}

/// 8-bit absmax quantisation ("int8"): per bucket of `b` coordinates, with the scale
/// `m_b = max_{i∈b} |x_i|`, `C(x)_i = ±m_b · l_i/127` where `l_i` rounds `127·|x_i|/m_b`
/// stochastically to one of its two neighbouring integers (0 to 127). Unbiased; every
/// coordinate's error is at most one step `m_b/127` and its variance at most a quarter
/// step squared, so E‖C(x) − x‖² ≤ Σ_b |b|·m_b²/(4·127²) ≤ b/(4·127²)·‖x‖²
/// ([`Int8::variance_factor`]; 0.0020·‖x‖² for b = 128). [`Qsgd`] with the same 8 bits
/// (`qsgd:127,bucket=128`) has the step ‖x_b‖₂/127 instead, √b times larger for a bucket of
/// equal magnitudes (its bound: 0.0079·‖x‖²); on Gaussian data its error is several times
/// int8's (test `int8_is_unbiased_and_finer_than_qsgd_with_the_same_bits`).
///
/// The message is a [`Qsgd`] message with s = 127 whose per-bucket "norm" is `m_b` (the
/// decoder reads a scale and levels, nothing else), so every receiver decodes it as QSGD
/// and [`Compressor::id`] is [`OperatorId::Qsgd`]: parameters (8 bytes), `⌈d/b⌉` scales
/// (`f32`), then `d` codes of 8 bits (a sign and a 7-bit level). Meant for DiLoCo's 8-bit
/// pseudo-gradients (`diloco --compressor int8`), as INTELLECT-1 (Prime Intellect 2024)
/// all-reduces them in 8 bits.
///
/// Randomness: as [`Qsgd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8 {
    bucket: usize,
}

impl Int8 {
    /// Levels per sign: 127, so that a sign and a level fill one byte.
    pub const LEVELS: u16 = 127;

    /// Int8 with buckets of `bucket ≥ 1` coordinates (`bucket ≥ d` is one bucket).
    ///
    /// # Panics
    /// If `bucket == 0`.
    pub fn new(bucket: usize) -> Self {
        assert!(
            bucket >= 1,
            "int8 bucket size must be at least 1 (bucket = 0)"
        );
        Self { bucket }
    }

    /// The bucket size `b` in coordinates.
    pub fn bucket(&self) -> usize {
        self.bucket
    }

    /// The variance factor `b/(4·127²)` of the bound E‖C(x) − x‖² ≤ factor·‖x‖², for a
    /// vector of length `d` (the bucket size is capped at `d`).
    pub fn variance_factor(&self, d: usize) -> f64 {
        let b = self.bucket.min(d.max(1)) as f64;
        let s = Self::LEVELS as f64;
        b / (4.0 * s * s)
    }

    fn as_qsgd(&self) -> Qsgd {
        Qsgd::new(Self::LEVELS, self.bucket)
    }
}

impl Compressor for Int8 {
    fn id(&self) -> OperatorId {
        OperatorId::Qsgd
    }

    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        self.as_qsgd().encode(x, rng, max_abs, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(self.as_qsgd().len(d))
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        self.as_qsgd().len(d)
    }

    fn unbiased(&self) -> bool {
        true
    }
}

/// Scaled sign (signSGD, Bernstein et al. 2018; EF-signSGD, Karimireddy et al. 2019):
/// `C(x)_i = ‖x_b‖₁/|b| · sign(x_i)` with `sign(0) = +1` (also for −0.0). Biased and
/// deterministic (it draws nothing from the RNG); per bucket a δ-contraction with
/// δ = ‖x_b‖₁²/(|b|‖x_b‖₂²): ‖x_b − C(x)_b‖² = (1 − δ)‖x_b‖².
///
/// Message for `x: [d]`: the bucket size (4 bytes), `⌈d/b⌉` scales (`f32`), then `d` sign
/// bits (`⌈d/8⌉` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sign {
    bucket: Option<usize>,
}

impl Sign {
    /// Scaled sign with one scale per `bucket` coordinates, or one scale for the whole
    /// vector with `None` (EF-signSGD's ‖x‖₁/d · sign(x)).
    ///
    /// # Panics
    /// If `bucket == Some(0)`.
    pub fn new(bucket: Option<usize>) -> Self {
        assert!(bucket != Some(0), "sign bucket size must be at least 1");
        Self { bucket }
    }

    /// The bucket size, `None` for one scale over the whole vector.
    pub fn bucket(&self) -> Option<usize> {
        self.bucket
    }

    fn len(&self, d: usize) -> usize {
        let nb = d.div_ceil(whole_or(self.bucket, d));
        HEADER_LEN + BUCKET_PARAMS + 4 * nb + d.div_ceil(8)
    }
}

/// The wire bucket of an optional bucket size: `None` is `d` (1 when `d = 0`).
fn whole_or(bucket: Option<usize>, d: usize) -> usize {
    wire_bucket(bucket.unwrap_or(d).max(1))
}

impl Compressor for Sign {
    fn id(&self) -> OperatorId {
        OperatorId::Sign
    }

    fn compress(&mut self, x: &[f32], _rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let d = x.len();
        assert_dim(d);
        let bucket = whole_or(self.bucket, d);
        let nb = d.div_ceil(bucket);
        let start = begin_message(OperatorId::Sign, d, self.len(d) - HEADER_LEN, out);
        out.extend_from_slice(&(bucket as u32).to_le_bytes());
        let at = out.len();
        out.resize(at + 4 * nb + d.div_ceil(8), 0);
        let (scales, signs) = out[at..].split_at_mut(4 * nb);
        // A block at a time, so that a bucket's data is still in cache for its signs.
        for (c, (xc, sc)) in x.chunks(CHUNK).zip(signs.chunks_mut(CHUNK / 8)).enumerate() {
            let lo = c * CHUNK;
            for_segments(lo, lo + xc.len(), bucket, |b, i, _| {
                if i == b * bucket {
                    let xb = &x[i..i.saturating_add(bucket).min(d)];
                    let scale = (sum_abs(xb) / xb.len() as f64) as f32;
                    scales[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
                }
            });
            pack_signs(xc, sc);
        }
        finish_message(start, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(self.len(d))
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        self.len(d)
    }

    fn unbiased(&self) -> bool {
        false
    }
}

/// TernGrad (Wen et al. 2017): `C(x)_i = s_b · sign(x_i) · β_i`, `s_b = max |x_i|` over
/// the bucket, `β_i ~ Bernoulli(|x_i|/s_b)`. Unbiased; variance
/// Σ_b (‖x_b‖∞‖x_b‖₁ − ‖x_b‖²). The paper's gradient clipping is not applied.
///
/// Message for `x: [d]`: the bucket size (4 bytes), `⌈d/b⌉` scales (`f32`), then `d`
/// 2-bit codes (`⌈d/4⌉` bytes).
///
/// Randomness: as [`Qsgd`] (one seed per message, `u_i` from output `i` of its [`Dither`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TernGrad {
    bucket: Option<usize>,
}

impl TernGrad {
    /// TernGrad with one scale per `bucket` coordinates, or one for the whole vector with
    /// `None` (the paper's layer-wise scale when `x` is one layer).
    ///
    /// # Panics
    /// If `bucket == Some(0)`.
    pub fn new(bucket: Option<usize>) -> Self {
        assert!(bucket != Some(0), "TernGrad bucket size must be at least 1");
        Self { bucket }
    }

    /// The bucket size, `None` for one scale over the whole vector.
    pub fn bucket(&self) -> Option<usize> {
        self.bucket
    }

    fn len(&self, d: usize) -> usize {
        let nb = d.div_ceil(whole_or(self.bucket, d));
        HEADER_LEN + BUCKET_PARAMS + 4 * nb + packed_len(d, 2)
    }
}

impl Compressor for TernGrad {
    fn id(&self) -> OperatorId {
        OperatorId::TernGrad
    }

    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let d = x.len();
        assert_dim(d);
        let seed = rng.next_u64();
        let bucket = whole_or(self.bucket, d);
        let start = begin_message(OperatorId::TernGrad, d, self.len(d) - HEADER_LEN, out);
        out.extend_from_slice(&(bucket as u32).to_le_bytes());
        bucketed_encode(x, bucket, seed, 2, max_abs, terngrad_codes, out);
        finish_message(start, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(self.len(d))
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        self.len(d)
    }

    fn unbiased(&self) -> bool {
        true
    }
}

/// Natural compression (Horváth et al. 2019): every |x_i| ∈ [2^e, 2^(e+1)) becomes 2^e or
/// 2^(e+1), up with probability (|x_i| − 2^e)/2^e; below 2⁻¹²⁶, 0 or 2⁻¹²⁶ with probability
/// |x_i|/2⁻¹²⁶. Unbiased; variance ≤ ‖x‖²/8 for inputs in the normal range. Values that
/// would round up to 2¹²⁸ saturate at 2¹²⁷ (a downward bias for |x_i| ≥ 2¹²⁷ only).
///
/// Message for `x: [d]`: `d` biased exponent bytes (0 for zero, `e + 127` for 2^e), then
/// `d` sign bits (`⌈d/8⌉` bytes): 9 bits per coordinate. A NaN or infinite input is
/// written as exponent 255, which receivers refuse ([`DecodeError::BadCode`]).
///
/// Randomness: as [`Qsgd`] (one seed per message, `u_i` from output `i` of its [`Dither`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Natural {
    _private: (),
}

impl Natural {
    /// Natural compression (it has no parameters; the same as `Natural::default()`).
    pub fn new() -> Self {
        Self::default()
    }
}

impl Compressor for Natural {
    fn id(&self) -> OperatorId {
        OperatorId::Natural
    }

    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let d = x.len();
        assert_dim(d);
        let seed = rng.next_u64();
        let start = begin_message(OperatorId::Natural, d, d + d.div_ceil(8), out);
        let at = out.len();
        out.resize(at + d + d.div_ceil(8), 0);
        let (exps, signs) = out[at..].split_at_mut(d);
        let mut rng = Dither::new(seed);
        let mut draws = [0u32; CHUNK];
        let blocks = x.chunks(CHUNK).zip(exps.chunks_mut(CHUNK));
        for ((xc, ec), sc) in blocks.zip(signs.chunks_mut(CHUNK / 8)) {
            rng.fill(&mut draws[..xc.len()]);
            for ((e, &v), &u) in ec.iter_mut().zip(xc).zip(&draws) {
                *e = natural_exponent(v, u);
            }
            pack_signs(xc, sc);
        }
        finish_message(start, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(HEADER_LEN + d + d.div_ceil(8))
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        HEADER_LEN + d + d.div_ceil(8)
    }

    fn unbiased(&self) -> bool {
        true
    }
}

// ---------------------------------------------------------------------------------------
// Encoders
// ---------------------------------------------------------------------------------------

/// Σ f(x_j) in `f64` over eight interleaved lanes (see the module docs): four independent
/// two-lane accumulators hide the latency of the additions.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut lanes = [0f64; 8];
    let (groups, rest) = x.as_chunks::<8>();
    for g in groups {
        for j in 0..8 {
            lanes[j] += f(g[j]);
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        lanes[j] += f(v);
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// Σ x_j² in `f64` (each square exact).
fn sum_sq(x: &[f32]) -> f64 {
    lane_sum(x, |v| v as f64 * v as f64)
}

/// Σ |x_j| in `f64`.
fn sum_abs(x: &[f32]) -> f64 {
    lane_sum(x, |v| v.abs() as f64)
}

/// max |x_j|, NaN if any `x_j` is NaN (the maximum of the magnitude bit patterns, whose
/// integer order is the float order, NaN above infinity).
fn max_abs(x: &[f32]) -> f32 {
    let m = x.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
    f32::from_bits(m)
}

/// Sign bits of `x` into `out` (`⌈len/8⌉` bytes): bit `i` is `x_i < 0`.
fn pack_signs(x: &[f32], out: &mut [u8]) {
    let (groups, rest) = x.as_chunks::<8>();
    for (g, o) in groups.iter().zip(out.iter_mut()) {
        let mut b = 0u8;
        for (k, &v) in g.iter().enumerate() {
            b |= ((v < 0.0) as u8) << k;
        }
        *o = b;
    }
    if !rest.is_empty() {
        let mut b = 0u8;
        for (k, &v) in rest.iter().enumerate() {
            b |= ((v < 0.0) as u8) << k;
        }
        out[groups.len()] = b;
    }
}

/// Calls `f(b, lo, hi)` for the pieces of coordinates `[lo, hi)` cut at bucket
/// boundaries, `b` the bucket index of each piece.
#[inline(always)]
fn for_segments(lo: usize, hi: usize, bucket: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut i = lo;
    while i < hi {
        let b = i / bucket;
        let j = (b * bucket).saturating_add(bucket).min(hi);
        f(b, i, j);
        i = j;
    }
}

/// The encoding loop shared by the stochastic bucketed quantisers (QSGD, TernGrad): after
/// the parameters already in `out`, one `f32` scale per bucket (`scale_of(x_b)`), then the
/// `width`-bit codes that `codes_of(piece, uniforms, scale, codes)` gives, a block of
/// [`CHUNK`] coordinates at a time with the [`Dither`] uniforms of `seed`.
fn bucketed_encode(
    x: &[f32],
    bucket: usize,
    seed: u64,
    width: u32,
    scale_of: impl Fn(&[f32]) -> f32,
    mut codes_of: impl FnMut(&[f32], &[u32], f32, &mut [u32]),
    out: &mut Vec<u8>,
) {
    let d = x.len();
    let scales_at = out.len();
    out.resize(scales_at + 4 * d.div_ceil(bucket), 0);
    let mut rng = Dither::new(seed);
    let mut draws = [0u32; CHUNK];
    let mut codes = [0u32; CHUNK];
    let mut scale = 0f32;
    for (c, xc) in x.chunks(CHUNK).enumerate() {
        let lo = c * CHUNK;
        let n = xc.len();
        rng.fill(&mut draws[..n]);
        for_segments(lo, lo + n, bucket, |b, i, j| {
            if i == b * bucket {
                scale = scale_of(&x[i..i.saturating_add(bucket).min(d)]);
                out[scales_at + 4 * b..scales_at + 4 * b + 4].copy_from_slice(&scale.to_le_bytes());
            }
            let (a, z) = (i - lo, j - lo);
            codes_of(&x[i..j], &draws[a..z], scale, &mut codes[a..z]);
        });
        emit_codes(width, &codes[..n], out);
    }
}

/// Appends the codes of one block to `out`: whole groups of 8 packed on the stack and
/// copied (no zero-filling of the output first), the last < 8 codes of the vector
/// through [`BitWriter`].
fn emit_codes(width: u32, codes: &[u32], out: &mut Vec<u8>) {
    let full = codes.len() / 8 * 8;
    let mut buf = [0u8; CHUNK / 8 * 17];
    let bytes = full / 8 * width as usize;
    pack(width, &codes[..full], &mut buf[..bytes]);
    out.extend_from_slice(&buf[..bytes]);
    if full < codes.len() {
        let mut w = BitWriter::new(out);
        for &code in &codes[full..] {
            w.put(code, width);
        }
        w.finish();
    }
}

/// QSGD codes `(l << 1) | sign` of one bucket piece (see the module docs).
#[inline]
fn qsgd_codes(x: &[f32], u: &[u32], norm: f32, s: u16, codes: &mut [u32]) {
    if !(norm > 0.0 && norm.is_finite()) {
        // Zero, or a non-finite bucket that the receiver refuses anyway.
        codes.fill(0);
        return;
    }
    let s_f = s as f32;
    let inv = s_f / norm;
    if inv.is_finite() {
        // One multiply per coordinate instead of a division (a division costs as much as
        // the rest of the loop); r may exceed s by an ulp, hence the `min`.
        qsgd_levels(x, u, s, codes, |a| a * inv);
    } else {
        // A norm so small that s/norm overflows: divide first.
        qsgd_levels(x, u, s, codes, |a| (a / norm) * s_f);
    }
}

/// The codes for `r_i = ratio(|x_i|)`, `0 ≤ r_i ≤ s(1 + 2⁻²³)`.
#[inline(always)]
fn qsgd_levels(x: &[f32], u: &[u32], s: u16, codes: &mut [u32], ratio: impl Fn(f32) -> f32) {
    let s_f = s as f32;
    for ((c, &v), &u) in codes.iter_mut().zip(x).zip(u) {
        // Stochastic rounding is ⌊r + u⌋: it is ⌊r⌋ + 1 exactly when u ≥ 1 − (r − ⌊r⌋),
        // which has probability r − ⌊r⌋. Clamped to s in floats (one `minps`), then the
        // floor without a float-to-int conversion (which does not vectorise on baseline
        // x86-64): y + 2²³ rounds y to the nearest integer n, held in the low mantissa
        // bits, and ⌊y⌋ = n − [n > y].
        let y = ratio(v.abs()) + (u >> 8) as i32 as f32 * UNIT;
        // (Not `f32::min`, whose NaN rule costs four more instructions; y is never NaN.)
        let y = if y < s_f { y } else { s_f };
        let t = y + MAGIC;
        let l = (t.to_bits() - MAGIC.to_bits()) - ((t - MAGIC) > y) as u32;
        *c = (l << 1) | (v < 0.0) as u32;
    }
}

/// TernGrad codes (0 → 0, 1 → +, 2 → −) of one bucket piece.
#[inline]
fn terngrad_codes(x: &[f32], u: &[u32], scale: f32, codes: &mut [u32]) {
    if scale == 0.0 {
        codes.fill(0);
        return;
    }
    for ((c, &v), &u) in codes.iter_mut().zip(x).zip(u) {
        let keep = (((u >> 8) as i32 as f32 * UNIT) < v.abs() / scale) as u32;
        *c = keep + (keep & (v < 0.0) as u32);
    }
}

/// The biased exponent natural compression writes for `v`, with uniform `u >> 8` (24 bits).
///
/// |v| = 2^(E−127)·(1 + m/2²³) (or m·2⁻¹⁴⁹ when E = 0), so the probability of rounding up,
/// (|v| − 2^e)/2^e, is m/2²³ in both cases, and for the 24-bit uniform U,
/// `U/2²⁴ < m/2²³ ⇔ U < 2m` (exact integers). Up from E is E + 1 (from 0: 2⁻¹²⁶), capped at
/// 254; non-finite values (E = 255) stay 255.
#[inline(always)]
fn natural_exponent(v: f32, u: u32) -> u8 {
    let bits = v.to_bits() & 0x7fff_ffff;
    let e = bits >> 23;
    let m = bits & 0x007f_ffff;
    let up = ((u >> 8) < 2 * m) as u32;
    if e == 255 {
        255
    } else {
        (e + up).min(254) as u8
    }
}

// ---------------------------------------------------------------------------------------
// Bit packing of whole groups of 8 codes (W bytes), monomorphised per width.
// ---------------------------------------------------------------------------------------

/// Packs `codes` (a multiple of 8) of `width` bits into `out` (`len/8 · width` bytes).
fn pack(width: u32, codes: &[u32], out: &mut [u8]) {
    macro_rules! go {
        ($($w:literal)*) => {
            match width {
                $($w => pack_w::<$w>(codes, out),)*
                _ => {}
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17)
}

/// Unpacks `codes.len()` codes (a multiple of 8) of `width` bits from `bytes`.
fn unpack(width: u32, bytes: &[u8], codes: &mut [u32]) {
    macro_rules! go {
        ($($w:literal)*) => {
            match width {
                $($w => unpack_w::<$w>(bytes, codes),)*
                _ => {}
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17)
}

#[inline(always)]
fn pack_w<const W: usize>(codes: &[u32], out: &mut [u8]) {
    let (groups, _) = codes.as_chunks::<8>();
    let (outs, _) = out.as_chunks_mut::<W>();
    for (g, o) in groups.iter().zip(outs) {
        // Bits 0..64 in `lo`, 64..128 in `hi`, 128..136 (W = 17 only) straight from code
        // 7; every shift is a constant once W is.
        let (mut lo, mut hi) = (0u64, 0u64);
        for (k, &c) in g.iter().enumerate() {
            let (at, c) = (k * W, c as u64);
            if at < 64 {
                lo |= c << at;
                if at + W > 64 {
                    hi |= c >> (64 - at);
                }
            } else if at < 128 {
                hi |= c << (at - 64);
            }
        }
        let (lo, hi) = (lo.to_le_bytes(), hi.to_le_bytes());
        if W <= 8 {
            o.copy_from_slice(&lo[..W]);
        } else {
            o[..8].copy_from_slice(&lo);
            let h = W.min(16);
            o[8..h].copy_from_slice(&hi[..h - 8]);
            if W > 16 {
                o[16] = (g[7] >> (128 - 7 * W)) as u8;
            }
        }
    }
}

#[inline(always)]
fn unpack_w<const W: usize>(bytes: &[u8], codes: &mut [u32]) {
    let mask = ((1u64 << W) - 1) as u32;
    let (groups, _) = codes.as_chunks_mut::<8>();
    let (ins, _) = bytes.as_chunks::<W>();
    for (g, i) in groups.iter_mut().zip(ins) {
        if W <= 8 {
            let mut b = [0u8; 8];
            b[..W].copy_from_slice(i);
            let acc = u64::from_le_bytes(b);
            for (k, c) in g.iter_mut().enumerate() {
                *c = (acc >> (k * W)) as u32 & mask;
            }
        } else {
            let mut b = [0u8; 16];
            let n = W.min(16);
            b[..n].copy_from_slice(&i[..n]);
            let acc = u128::from_le_bytes(b);
            for (k, c) in g.iter_mut().enumerate() {
                *c = (acc >> (k * W)) as u32 & mask;
            }
            if W > 16 {
                g[7] |= ((i[16] as u32) << (128 - 7 * W)) & mask;
            }
        }
    }
}

/// Unpacks the `codes.len()` codes of `width` bits that start at bit 0 of `bytes` (whole
/// groups fast, the last < 8 through [`BitReader`]).
fn unpack_any(width: u32, bytes: &[u8], codes: &mut [u32]) {
    let full = codes.len() / 8 * 8;
    let (head, tail) = codes.split_at_mut(full);
    let split = (full / 8 * width as usize).min(bytes.len());
    unpack(width, &bytes[..split], head);
    let mut r = BitReader::new(&bytes[split..]);
    for c in tail {
        *c = r.get(width);
    }
}

// ---------------------------------------------------------------------------------------
// Decoders
// ---------------------------------------------------------------------------------------

/// Checks a quantiser payload for dimension `d`; returns `d`.
pub(crate) fn validate(op: OperatorId, payload: &[u8], d: usize) -> Result<usize, DecodeError> {
    match op {
        OperatorId::Qsgd => validate_qsgd(payload, d),
        OperatorId::Sign | OperatorId::TernGrad => validate_bucketed(op, payload, d),
        OperatorId::Natural => validate_natural(payload, d),
        _ => Err(DecodeError::UnknownOperator(op as u8)),
    }
    .map(|()| d)
}

/// `Err(PayloadLength)` unless `payload` has exactly `expected` bytes (computed in `u64`,
/// so no untrusted size can overflow it).
fn check_len(op: OperatorId, payload: &[u8], expected: u64) -> Result<(), DecodeError> {
    if payload.len() as u64 != expected {
        return Err(DecodeError::PayloadLength {
            operator: op.name(),
            declared: payload.len(),
            expected: usize::try_from(expected).unwrap_or(usize::MAX),
        });
    }
    Ok(())
}

/// Bytes of `n` codes of `width` bits, in `u64`.
fn packed_len_u64(n: usize, width: u32) -> u64 {
    (n as u64).saturating_mul(width as u64).div_ceil(8)
}

/// Bytes of `⌈d/bucket⌉` scales, in `u64`.
fn scales_len_u64(d: usize, bucket: usize) -> u64 {
    (d.div_ceil(bucket) as u64).saturating_mul(4)
}

fn validate_qsgd(payload: &[u8], d: usize) -> Result<(), DecodeError> {
    let op = OperatorId::Qsgd;
    let mut r = Reader::new(payload);
    let s = r.u16()?;
    let w = r.u8()?;
    let reserved = r.u8()?;
    let bucket = r.u32()? as usize;
    if s == 0 {
        return Err(bad(op, "s", 0));
    }
    if w as u32 != bit_length(s) {
        return Err(bad(op, "width", w as u64));
    }
    if reserved != 0 {
        return Err(bad(op, "reserved", reserved as u64));
    }
    if bucket == 0 {
        return Err(bad(op, "bucket", 0));
    }
    let width = 1 + w as u32;
    let norms_len = scales_len_u64(d, bucket);
    let expected = (QSGD_PARAMS as u64)
        .saturating_add(norms_len)
        .saturating_add(packed_len_u64(d, width));
    check_len(op, payload, expected)?;
    let (norms, codes) = payload[QSGD_PARAMS..].split_at(norms_len as usize);
    check_scales(norms)?;
    if s as u32 != (1u32 << w) - 1 {
        // Levels s+1 ..= 2^w − 1 are representable but invalid.
        let mut buf = [0u32; CHUNK];
        for lo in (0..d).step_by(CHUNK) {
            let n = CHUNK.min(d - lo);
            let at = lo / 8 * width as usize;
            unpack_any(width, &codes[at..], &mut buf[..n]);
            // A vectorised maximum first; the position only matters for the error.
            let max = buf[..n].iter().fold(0, |m, &c| m.max(c));
            if max >> 1 > s as u32 {
                let k = buf[..n]
                    .iter()
                    .position(|&c| c >> 1 > s as u32)
                    .unwrap_or(0);
                return Err(DecodeError::BadCode {
                    operator: op.name(),
                    index: lo + k,
                });
            }
        }
    }
    Ok(())
}

fn validate_bucketed(op: OperatorId, payload: &[u8], d: usize) -> Result<(), DecodeError> {
    let mut r = Reader::new(payload);
    let bucket = r.u32()? as usize;
    if bucket == 0 {
        return Err(bad(op, "bucket", 0));
    }
    let width = if op == OperatorId::Sign { 1 } else { 2 };
    let scales_len = scales_len_u64(d, bucket);
    let expected = (BUCKET_PARAMS as u64)
        .saturating_add(scales_len)
        .saturating_add(packed_len_u64(d, width));
    check_len(op, payload, expected)?;
    let (scales, codes) = payload[BUCKET_PARAMS..].split_at(scales_len as usize);
    check_scales(scales)?;
    if op == OperatorId::TernGrad {
        if let Some(index) = first_ternary_3(codes, d) {
            return Err(DecodeError::BadCode {
                operator: op.name(),
                index,
            });
        }
    }
    Ok(())
}

/// The first of the `d` 2-bit codes in `codes` that is 3 (padding bits ignored).
fn first_ternary_3(codes: &[u8], d: usize) -> Option<usize> {
    // A byte holds codes 3 exactly where both bits of a pair are set.
    let threes = |b: u8| b & (b >> 1) & 0x55;
    let full = d / 4;
    let (words, _) = codes[..full].as_chunks::<8>();
    let mut start = 0;
    for w in words {
        let v = u64::from_le_bytes(*w);
        if v & (v >> 1) & 0x5555_5555_5555_5555 != 0 {
            break;
        }
        start += 8;
    }
    for (k, &b) in codes[start..].iter().enumerate() {
        let byte = start + k;
        let valid = if byte < full {
            0xff
        } else {
            (1u8 << (2 * (d - 4 * full))) - 1
        };
        let t = threes(b & valid);
        if t != 0 {
            return Some(4 * byte + t.trailing_zeros() as usize / 2);
        }
    }
    None
}

fn validate_natural(payload: &[u8], d: usize) -> Result<(), DecodeError> {
    let op = OperatorId::Natural;
    let expected = (d as u64).saturating_add(d.div_ceil(8) as u64);
    check_len(op, payload, expected)?;
    let exps = &payload[..d];
    // `contains` is a fast byte search; the position only matters for the error.
    if exps.contains(&255) {
        let index = exps.iter().position(|&e| e == 255).unwrap_or(0);
        return Err(DecodeError::BadCode {
            operator: op.name(),
            index,
        });
    }
    Ok(())
}

/// `acc += scale · C(x)` for a payload that [`validate`] accepted for `d = acc.len()`.
pub(crate) fn add(op: OperatorId, payload: &[u8], scale: f32, acc: &mut [f32]) {
    match op {
        OperatorId::Qsgd => add_qsgd(payload, scale, acc),
        OperatorId::Sign => add_sign(payload, scale, acc),
        OperatorId::TernGrad => add_terngrad(payload, scale, acc),
        OperatorId::Natural => add_natural(payload, scale, acc),
        _ => {}
    }
}

/// Splits a validated bucketed payload at `params` into (bucket, scales, codes).
fn bucketed_parts(payload: &[u8], params: usize, d: usize) -> (usize, &[u8], &[u8]) {
    let b = &payload[params - 4..params];
    let bucket = (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).max(1);
    let (scales, codes) = payload[params..].split_at(4 * d.div_ceil(bucket));
    (bucket, scales, codes)
}

fn add_qsgd(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let d = acc.len();
    let s = u16::from_le_bytes([payload[0], payload[1]]);
    let width = 1 + payload[2] as u32;
    let (bucket, norms, codes) = bucketed_parts(payload, QSGD_PARAMS, d);
    let s_f = s as f32;
    let mut buf = [0u32; CHUNK];
    for (c, ac) in acc.chunks_mut(CHUNK).enumerate() {
        let lo = c * CHUNK;
        let n = ac.len();
        unpack_any(width, &codes[lo / 8 * width as usize..], &mut buf[..n]);
        for_segments(lo, lo + n, bucket, |b, i, j| {
            let norm = f32_at(norms, b);
            let (a, z) = (i - lo, j - lo);
            for (y, &code) in ac[a..z].iter_mut().zip(&buf[a..z]) {
                let v = norm * ((code >> 1) as i32 as f32 / s_f);
                *y += scale * f32::from_bits(v.to_bits() ^ (code << 31));
            }
        });
    }
}

fn add_sign(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let d = acc.len();
    let (bucket, scales, signs) = bucketed_parts(payload, BUCKET_PARAMS, d);
    let mut buf = [0u32; CHUNK];
    for (c, ac) in acc.chunks_mut(CHUNK).enumerate() {
        let lo = c * CHUNK;
        let n = ac.len();
        unpack_sign_masks(&signs[lo / 8..], &mut buf[..n]);
        for_segments(lo, lo + n, bucket, |b, i, j| {
            // scale · (±s_b) = ±(scale · s_b) exactly.
            let p = (scale * f32_at(scales, b)).to_bits();
            let (a, z) = (i - lo, j - lo);
            for (y, &m) in ac[a..z].iter_mut().zip(&buf[a..z]) {
                *y += f32::from_bits(p ^ m);
            }
        });
    }
}

fn add_terngrad(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let d = acc.len();
    let (bucket, scales, codes) = bucketed_parts(payload, BUCKET_PARAMS, d);
    let mut buf = [0u32; CHUNK];
    for (c, ac) in acc.chunks_mut(CHUNK).enumerate() {
        let lo = c * CHUNK;
        let n = ac.len();
        unpack_any(2, &codes[lo / 4..], &mut buf[..n]);
        for_segments(lo, lo + n, bucket, |b, i, j| {
            let sb = f32_at(scales, b);
            // scale · (s_b · t) for t = 0, 1, −1.
            let zero = scale * (sb * 0.0);
            let plus = scale * sb;
            let minus = -plus;
            let (a, z) = (i - lo, j - lo);
            for (y, &code) in ac[a..z].iter_mut().zip(&buf[a..z]) {
                *y += match code {
                    1 => plus,
                    2 => minus,
                    _ => zero,
                };
            }
        });
    }
}

fn add_natural(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let d = acc.len();
    let (exps, signs) = payload.split_at(d);
    let mut buf = [0u32; CHUNK];
    for (c, (ac, ec)) in acc.chunks_mut(CHUNK).zip(exps.chunks(CHUNK)).enumerate() {
        let lo = c * CHUNK;
        let n = ac.len();
        unpack_sign_masks(&signs[lo / 8..], &mut buf[..n]);
        for ((y, &e), &m) in ac.iter_mut().zip(ec).zip(&buf[..n]) {
            *y += scale * f32::from_bits(((e as u32) << 23) | m);
        }
    }
}

/// Sign bits to masks: `masks[i] = 0x8000_0000` where bit `i` of `bits` is set, else 0.
#[inline]
fn unpack_sign_masks(bits: &[u8], masks: &mut [u32]) {
    let mask = |b: u8, k: usize| if b & (1 << k) != 0 { 0x8000_0000 } else { 0 };
    let (groups, rest) = masks.as_chunks_mut::<8>();
    for (m8, &b) in groups.iter_mut().zip(bits) {
        for (k, m) in m8.iter_mut().enumerate() {
            *m = mask(b, k);
        }
    }
    if let Some(&b) = bits.get(groups.len()) {
        for (k, m) in rest.iter_mut().enumerate() {
            *m = mask(b, k);
        }
    }
}
