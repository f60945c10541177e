//! SparseLoCo's pseudo-gradient compression (Sarfi, Thérien, Lidin & Belilovsky 2025,
//! "SparseLoCo: Communication-efficient LLM training", arXiv 2508.15706 §3): top-k chosen
//! per chunk and 2-bit values. The vector `x: [d]` is cut into chunks of `C` coordinates
//! (the last may be shorter); in each chunk of length `c` the `min(k, c)` largest
//! magnitudes are kept (`k = ⌈ratio·C⌉`) but for exact zeros, which are not sent (a 2-bit
//! code has no zero). Each kept value travels as its position in the chunk and a 2-bit
//! code: a sign bit and a magnitude bit choosing between the chunk's two levels, the mean
//! |v| of the kept values below their median and of those at or above it (a one-bit Lloyd
//! quantizer of the magnitudes). Biased (`E[C(x)] ≠ x`): used with error feedback, as the
//! paper does (murmur's DiLoCo keeps the residual itself).
//!
//! **Positions** are sent as the gaps between them, Golomb–Rice coded (Golomb 1966; Rice
//! 1979; the position coding of Sattler et al. 2019, "Sparse binary compression"): gap
//! `g` as `g >> b` one-bits, a zero bit, then the `b` low bits of `g`, with the `b` that
//! makes the chunk's code shortest. Kept positions at density `p = k/C` then take about
//! `log₂(1/p) + 1.5` bits each — 7.5 at 1/64, 3.2 at 30% (7.6 and 3.0 measured on the
//! RESULTS §6 runs) — against the 16 of a
//! `u16` and the paper's ≈ 12 (a position in a 64×64 tile), and never more than
//! `1 + ⌈log₂ C⌉` (13 bits for `C = 4096`). The coding is lossless: the decoded vector
//! is the same as with fixed-width positions, only shorter.
//!
//! With `C = 4096` and a ratio of 1/64 (k = 64) a chunk takes about 90 bytes for 16,384
//! bytes of `f32` (≈ 180×). The paper's chunks are 2-D 64×64 tiles of each weight matrix;
//! here they are runs of the flat vector (a ring all-reduce's chunks do not follow the
//! tensors), or runs of each tensor (below).
//!
//! **Chunks per tensor.** [`SparseLoco::layerwise`] (`sparseloco,layerwise`) cuts each
//! tensor of the model into chunks of its own, so that no chunk mixes, say, a LayerNorm's
//! gains with the weights of the matrix after it: the paper's tiles are per weight matrix.
//! The message then carries the tensors' lengths, and decodes without being told them.
//!
//! **Payload:** `u32 C`, `u32 k`, `u32 T` (the number of tensors; 0 for the flat vector,
//! one tensor of d), `T` tensor lengths as minimal LEB128 varints summing to d, then per
//! chunk (tensor by tensor, each cut into chunks of `C` from its first coordinate, the last
//! shorter) of length `c`: `f32 low`, `f32 high`, the number kept `kc ≤ min(k, c)` as a
//! minimal LEB128 varint, `u8 b` (the Rice parameter, at most 16), then one bit stream
//! (LSB-first, as every packed field of the crate) of the `kc` kept values in position
//! order, each its gap's code (the first gap is the first position, each later one the
//! position minus the one before it minus 1; every position below `c`) followed by its
//! 2-bit code (bit 0 the sign, bit 1 the level), zero-padded to a whole byte. The message's
//! size depends on where the kept values lie: [`Compressor::max_encoded_len`] bounds it.

use crate::select::top_k_exact;
use crate::wire::{
    begin_message, finish_message, get_varint, put_varint, BitWriter, OperatorId, Reader,
    HEADER_LEN,
};
use crate::{assert_dim, k_for_ratio, Compressor, DecodeError};
use rand::Rng;

/// The largest chunk: positions in a chunk fit 16 bits.
pub const MAX_CHUNK: usize = 1 << 16;

/// The default chunk, as the paper's 64×64 tiles.
pub const DEFAULT_CHUNK: usize = 4096;

/// The default error-feedback decay β of the paper (Sarfi et al. 2025, §4: β = 0.95),
/// applied by whoever keeps the residual (`murmur_gossip`'s DiLoCo), not by the operator.
pub const DEFAULT_DECAY: f32 = 0.95;

/// The largest Rice parameter: a gap is below [`MAX_CHUNK`] = 2¹⁶.
const MAX_RICE: u32 = 16;

/// The fewest bytes of a chunk: the two levels, a one-byte count and the Rice parameter
/// (a chunk with nothing kept has no stream).
const CHUNK_PREFIX: usize = 10;

const NAME: &str = "sparseloco";

/// Chunked top-k with 2-bit values (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct SparseLoco {
    ratio: f64,
    chunk: usize,
    /// The tensors' lengths, summing to d, whose chunks start at each tensor's first
    /// coordinate; empty for chunks of the flat vector.
    layers: Vec<usize>,
    /// Scratch, kept between calls: the kept indices and magnitudes of a chunk.
    idx: Vec<u32>,
    mags: Vec<f32>,
}

impl SparseLoco {
    /// Keeps `⌈ratio·chunk⌉` coordinates of every `chunk` (at most [`MAX_CHUNK`]).
    ///
    /// # Panics
    /// If `ratio` is not in (0, 1] or `chunk` is 0 or above [`MAX_CHUNK`] (the spec checks
    /// both first).
    pub fn new(ratio: f64, chunk: usize) -> Self {
        assert!(
            ratio > 0.0 && ratio <= 1.0,
            "sparseloco: ratio must be in (0, 1]"
        );
        assert!(
            (1..=MAX_CHUNK).contains(&chunk),
            "sparseloco: chunk in 1..=65536"
        );
        SparseLoco {
            ratio,
            chunk,
            layers: Vec::new(),
            idx: Vec::new(),
            mags: Vec::new(),
        }
    }

    /// As [`SparseLoco::new`], with chunks that follow the tensors: each tensor of
    /// `layers` (their lengths in parameter order, summing to the d it is given) is cut
    /// into chunks of its own, the paper's per-tensor tiles in one dimension. An empty
    /// `layers` is the flat vector.
    ///
    /// # Panics
    /// As [`SparseLoco::new`]; [`Compressor::compress`] panics if the lengths do not sum
    /// to `x.len()` (a caller's bug, as for layer-wise top-k).
    pub fn layerwise(ratio: f64, chunk: usize, layers: Vec<usize>) -> Self {
        let mut c = Self::new(ratio, chunk);
        c.layers = layers;
        c
    }

    /// k, the coordinates kept of a whole chunk.
    pub fn k(&self) -> usize {
        k_for_ratio(self.ratio, self.chunk)
    }
}

/// Bits of `b` that a position below `len` needs: `⌈log₂ len⌉` (0 for `len = 1`).
fn position_bits(len: usize) -> u32 {
    usize::BITS - len.saturating_sub(1).leading_zeros()
}

/// The most bytes a chunk of length `len` keeping `kc` values takes: its prefix and a bit
/// stream whose gaps are coded with `b = ⌈log₂ len⌉` (each gap below `2^b`: no one-bits),
/// which the encoder's shortest choice never exceeds.
fn max_chunk_len(len: usize, kc: usize) -> usize {
    9 + crate::wire::varint_len(kc as u32) + (kc * (3 + position_bits(len) as usize)).div_ceil(8)
}

/// The largest chunks' part of a payload for a tensor of `len` coordinates in chunks of
/// `chunk` keeping `k` of each; saturates instead of overflowing.
fn max_tensor_len(len: usize, chunk: usize, k: usize) -> usize {
    let (full, rest) = (len / chunk, len % chunk);
    let last = if rest > 0 {
        max_chunk_len(rest, k.min(rest))
    } else {
        0
    };
    full.saturating_mul(max_chunk_len(chunk, k.min(chunk)))
        .saturating_add(last)
}

/// The bytes before the chunks: `C`, `k`, the tensor count and each tensor's length.
fn layout_len(layers: &[usize]) -> usize {
    12 + layers
        .iter()
        .map(|&l| crate::wire::varint_len(l as u32))
        .sum::<usize>()
}

/// The Rice parameter that codes `gaps` in the fewest bits (the smallest such), with the
/// bits it takes: `Σ (g >> b) + (1 + b)·|gaps|`.
fn rice_parameter(gaps: impl Iterator<Item = u32> + Clone) -> u32 {
    let cost = |b: u32| -> u64 {
        gaps.clone()
            .map(|g| u64::from(g >> b) + 1 + u64::from(b))
            .sum()
    };
    let mut best = (0, cost(0));
    for b in 1..=MAX_RICE {
        let c = cost(b);
        if c >= best.1 {
            // The cost is convex in b: once it rises it keeps rising.
            break;
        }
        best = (b, c);
    }
    best.0
}

/// Appends gap `g` Rice-coded with parameter `b`.
fn put_rice(w: &mut BitWriter<'_>, g: u32, b: u32) {
    let mut q = g >> b;
    while q >= 31 {
        w.put(u32::MAX >> 1, 31);
        q -= 31;
    }
    // q one-bits and the terminating zero.
    w.put((1u32 << q) - 1, q + 1);
    if b > 0 {
        w.put(g & ((1u32 << b) - 1), b);
    }
}

impl Compressor for SparseLoco {
    fn id(&self) -> OperatorId {
        OperatorId::SparseLoco
    }

    fn compress(&mut self, x: &[f32], _rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let d = x.len();
        assert_dim(d);
        let k = self.k();
        let start = begin_message(
            OperatorId::SparseLoco,
            d,
            self.max_encoded_len(d) - HEADER_LEN,
            out,
        );
        out.extend_from_slice(&(self.chunk as u32).to_le_bytes());
        out.extend_from_slice(&(k as u32).to_le_bytes());
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        for &l in &self.layers {
            put_varint(l as u32, out);
        }
        let flat = [d];
        let layers = if self.layers.is_empty() {
            &flat[..]
        } else {
            assert_eq!(
                self.layers.iter().sum::<usize>(),
                d,
                "sparseloco: the tensors' lengths must sum to d"
            );
            &self.layers[..]
        };
        let mut mags = std::mem::take(&mut self.mags);
        let mut at = 0;
        let parts = layers.iter().flat_map(|&l| {
            let tensor = &x[at..at + l];
            at += l;
            tensor.chunks(self.chunk)
        });
        for part in parts {
            self.idx.clear();
            top_k_exact(part, k, 0, &mut self.idx);
            self.idx.retain(|&i| part[i as usize] != 0.0);
            mags.clear();
            mags.extend(self.idx.iter().map(|&i| part[i as usize].abs()));
            mags.sort_unstable_by(f32::total_cmp);
            let kc = mags.len();
            let split = kc / 2;
            let median = mags.get(split).copied().unwrap_or(0.0);
            let mean = |m: &[f32]| {
                if m.is_empty() {
                    0.0
                } else {
                    (m.iter().map(|&v| f64::from(v)).sum::<f64>() / m.len() as f64) as f32
                }
            };
            let (low, high) = (mean(&mags[..split]), mean(&mags[split..]));
            let low = if split == 0 { high } else { low };
            out.extend_from_slice(&low.to_le_bytes());
            out.extend_from_slice(&high.to_le_bytes());
            put_varint(kc as u32, out);
            let idx = &self.idx;
            let gaps = (0..kc).map(|n| {
                if n == 0 {
                    idx[0]
                } else {
                    idx[n] - idx[n - 1] - 1
                }
            });
            let b = rice_parameter(gaps.clone());
            out.push(b as u8);
            let mut w = BitWriter::new(out);
            for (g, &i) in gaps.zip(idx) {
                put_rice(&mut w, g, b);
                let v = part[i as usize];
                let code = u32::from(v.is_sign_negative()) | (u32::from(v.abs() >= median) << 1);
                w.put(code, 2);
            }
            w.finish();
        }
        self.mags = mags;
        finish_message(start, out)
    }

    fn encoded_len(&self, _d: usize) -> Option<usize> {
        // The positions' code depends on where the kept values lie.
        None
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        let (chunk, k) = (self.chunk, self.k());
        let chunks = if self.layers.is_empty() {
            max_tensor_len(d, chunk, k)
        } else {
            self.layers.iter().fold(0, |n: usize, &l| {
                n.saturating_add(max_tensor_len(l, chunk, k))
            })
        };
        HEADER_LEN + layout_len(&self.layers).saturating_add(chunks)
    }

    fn unbiased(&self) -> bool {
        false
    }
}

/// A bit stream read LSB-first, as [`BitWriter`] writes it, that knows where it ends.
struct Bits<'a> {
    bytes: &'a [u8],
    /// The next bit's position.
    pos: usize,
}

impl<'a> Bits<'a> {
    fn left(&self) -> usize {
        8 * self.bytes.len() - self.pos
    }

    /// The next (up to) 57 bits at the low end, zeros past the end.
    fn window(&self) -> u64 {
        let at = self.pos / 8;
        let mut w = [0u8; 8];
        let end = (at + 8).min(self.bytes.len());
        w[..end - at].copy_from_slice(&self.bytes[at..end]);
        u64::from_le_bytes(w) >> (self.pos % 8)
    }

    /// The next `width` bits (at most 32); `None` past the end.
    fn get(&mut self, width: u32) -> Option<u32> {
        if width as usize > self.left() {
            return None;
        }
        let v = (self.window() & ((1u64 << width) - 1)) as u32;
        self.pos += width as usize;
        Some(v)
    }

    /// A run of one-bits and its terminating zero: the run's length, or `None` if it
    /// exceeds `limit` or the stream ends first.
    fn unary(&mut self, limit: u32) -> Option<u32> {
        let mut q = 0u32;
        loop {
            let avail = self.left().min(57);
            if avail == 0 {
                return None;
            }
            let ones = (self.window().trailing_ones() as usize).min(avail);
            q = q.saturating_add(ones as u32);
            if q > limit {
                return None;
            }
            if ones < avail {
                self.pos += ones + 1;
                return Some(q);
            }
            self.pos += ones;
        }
    }
}

/// Walks a payload for `d` coordinates, checking every field, and calls `each(i, v)` for
/// every decoded coordinate `i` and value `v`; returns the number of values it carries.
fn walk(payload: &[u8], d: usize, mut each: impl FnMut(usize, f32)) -> Result<usize, DecodeError> {
    let mut r = Reader::new(payload);
    let chunk = r.u32()? as usize;
    if !(1..=MAX_CHUNK).contains(&chunk) {
        return Err(DecodeError::BadParameter {
            operator: NAME,
            name: "chunk",
            value: chunk as u64,
        });
    }
    let k = r.u32()? as usize;
    if !(1..=chunk).contains(&k) {
        return Err(DecodeError::BadParameter {
            operator: NAME,
            name: "k",
            value: k as u64,
        });
    }
    // The tensors: T lengths summing to d (T = 0: the flat vector, one tensor of d).
    let tensors = r.u32()? as usize;
    if tensors > r.remaining() {
        // Each length takes at least a byte.
        return Err(DecodeError::PayloadLength {
            operator: NAME,
            declared: payload.len(),
            expected: 12usize.saturating_add(tensors),
        });
    }
    let lengths_at = r.offset();
    let mut at = lengths_at;
    let (mut sum, mut chunks) = (0usize, 0usize);
    for _ in 0..tensors {
        let l = get_varint(payload, &mut at, HEADER_LEN)? as usize;
        sum = sum.saturating_add(l);
        chunks = chunks.saturating_add(l.div_ceil(chunk));
    }
    r.take(at - lengths_at)?;
    if tensors == 0 {
        (sum, chunks) = (d, d.div_ceil(chunk));
    }
    if sum != d {
        return Err(DecodeError::BadParameter {
            operator: NAME,
            name: "tensor lengths",
            value: sum as u64,
        });
    }
    // Every chunk takes at least its prefix: a header that declares a d of more chunks
    // than the payload could hold is refused before any loop over them.
    let least = chunks.saturating_mul(CHUNK_PREFIX);
    if r.remaining() < least {
        return Err(DecodeError::PayloadLength {
            operator: NAME,
            declared: payload.len(),
            expected: least.saturating_add(r.offset()),
        });
    }
    let too_long = |at: usize| DecodeError::PayloadLength {
        operator: NAME,
        declared: payload.len(),
        expected: at,
    };
    // Each chunk's first coordinate and length, tensor by tensor (lengths read above).
    let mut at = lengths_at;
    let tensor_lens = (0..tensors.max(1)).map(|_| {
        if tensors == 0 {
            d
        } else {
            get_varint(payload, &mut at, HEADER_LEN).unwrap_or(0) as usize
        }
    });
    let mut first = 0;
    let spans = tensor_lens.flat_map(|l| {
        let begin = first;
        first += l;
        (begin..begin + l)
            .step_by(chunk)
            .map(move |s| (s, chunk.min(begin + l - s)))
    });
    let mut nnz = 0;
    for (bucket, (start, len)) in spans.enumerate() {
        let kc = k.min(len);
        let mut level = || -> Result<f32, DecodeError> {
            let v = f32::from_le_bytes(r.take(4)?.try_into().unwrap_or_default());
            if !v.is_finite() || v < 0.0 {
                return Err(DecodeError::NonFiniteScale { bucket });
            }
            Ok(v)
        };
        let (low, high) = (level()?, level()?);
        let (mut at, base) = (r.offset(), HEADER_LEN);
        let kept = get_varint(payload, &mut at, base)? as usize;
        r.take(at - r.offset())?;
        if kept > kc {
            return Err(DecodeError::BadParameter {
                operator: NAME,
                name: "kept",
                value: kept as u64,
            });
        }
        let kc = kept;
        let b = u32::from(r.u8()?);
        if b > MAX_RICE {
            return Err(DecodeError::BadParameter {
                operator: NAME,
                name: "rice",
                value: u64::from(b),
            });
        }
        // The chunk's stream lies in what is left of the payload; its end is found by
        // reading it.
        let rest = &payload[r.offset()..];
        let mut bits = Bits {
            bytes: rest,
            pos: 0,
        };
        let truncated = || DecodeError::Truncated {
            needed: HEADER_LEN + payload.len() + 1,
            got: HEADER_LEN + payload.len(),
        };
        let mut next = 0usize;
        for _ in 0..kc {
            let q = bits.unary((len >> b) as u32).ok_or_else(|| {
                if bits.left() == 0 {
                    truncated()
                } else {
                    DecodeError::IndexOutOfRange {
                        index: (start + len) as u64,
                        dim: d,
                    }
                }
            })?;
            let g = ((q as usize) << b) | bits.get(b).ok_or_else(truncated)? as usize;
            let i = next + g;
            if i >= len {
                return Err(DecodeError::IndexOutOfRange {
                    index: (start + i) as u64,
                    dim: d,
                });
            }
            let code = bits.get(2).ok_or_else(truncated)?;
            let level = if code & 2 != 0 { high } else { low };
            each(start + i, if code & 1 != 0 { -level } else { level });
            next = i + 1;
        }
        let used = bits.pos.div_ceil(8);
        if bits.pos % 8 != 0 && rest[used - 1] >> (bits.pos % 8) != 0 {
            return Err(DecodeError::BadParameter {
                operator: NAME,
                name: "padding",
                value: u64::from(rest[used - 1]),
            });
        }
        r.take(used)?;
        nnz += kc;
    }
    if r.remaining() > 0 {
        return Err(too_long(r.offset()));
    }
    Ok(nnz)
}

/// Checks a whole payload for `d` coordinates; returns the number of values it carries.
pub(crate) fn validate(payload: &[u8], d: usize) -> Result<usize, DecodeError> {
    walk(payload, d, |_, _| {})
}

/// Adds `scale · C(x)` of a validated payload into `acc: [d]`.
pub(crate) fn add(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let d = acc.len();
    // Validated before: the walk cannot fail half-way.
    let _ = walk(payload, d, |i, v| acc[i] += scale * v);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_into, validate as validate_message, Compressor};

    fn encode(c: &mut SparseLoco, x: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
        let n = c.compress(x, &mut rng, &mut out);
        assert_eq!(n, out.len());
        assert!(n <= c.max_encoded_len(x.len()), "{n} bytes over the bound");
        out
    }

    #[test]
    fn keeps_the_largest_of_each_chunk_at_two_levels_with_their_signs() {
        // Two chunks of 8 (k = 2 each) and a last chunk of 3 (k = 2).
        let x = [
            0.1, -5.0, 0.2, 0.0, 1.0, 0.0, 0.0, 0.3, //
            0.0, 0.0, 2.0, 0.0, 0.0, 0.0, -4.0, 0.0, //
            0.5, -0.25, 0.0,
        ];
        let mut c = SparseLoco::new(0.25, 8);
        let msg = encode(&mut c, &x);
        let mut y = vec![9.0; x.len()];
        decode_into(&msg, &mut y).unwrap();
        let mut want = vec![0.0; x.len()];
        // Chunk 0: -5 and 1 kept; levels 1 (below the median) and 5.
        want[1] = -5.0;
        want[4] = 1.0;
        want[10] = 2.0;
        want[14] = -4.0;
        want[16] = 0.5;
        want[17] = -0.25;
        assert_eq!(y, want);
        assert_eq!(validate_message(&msg, x.len()).unwrap().nnz, 6);
    }

    #[test]
    fn chunks_per_tensor_are_each_tensor_compressed_on_its_own() {
        // Tensors of 3, 0, 10 and 5 in chunks of 4: the layer-wise message decodes to the
        // flat operator's result on each tensor alone, side by side.
        let layers = vec![3, 0, 10, 5];
        let x: Vec<f32> = (0..18).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let mut c = SparseLoco::layerwise(0.5, 4, layers.clone());
        let msg = encode(&mut c, &x);
        let mut y = vec![9.0; 18];
        decode_into(&msg, &mut y).unwrap();
        let mut want = Vec::new();
        let mut at = 0;
        for l in layers {
            let part = &x[at..at + l];
            let m = encode(&mut SparseLoco::new(0.5, 4), part);
            let mut yp = vec![0.0; l];
            decode_into(&m, &mut yp).unwrap();
            want.extend(yp);
            at += l;
        }
        assert_eq!(y, want);
        // No layout is the flat vector: other chunks, another result.
        let mut flat = vec![0.0; 18];
        decode_into(&encode(&mut SparseLoco::new(0.5, 4), &x), &mut flat).unwrap();
        assert_ne!(flat, want);

        // Lengths that do not sum to d, and a tensor count beyond the payload.
        let p = HEADER_LEN;
        let mut bad = msg.clone();
        assert_eq!(bad[p + 12], 3);
        bad[p + 12] = 4;
        assert!(matches!(
            decode_into(&bad, &mut y).unwrap_err(),
            DecodeError::BadParameter {
                name: "tensor lengths",
                ..
            }
        ));
        let mut bad = msg.clone();
        bad[p + 8..p + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_into(&bad, &mut y).unwrap_err(),
            DecodeError::PayloadLength { .. }
        ));
    }

    #[test]
    #[should_panic(expected = "must sum to d")]
    fn tensors_that_are_not_the_vector_are_a_caller_s_bug() {
        encode(&mut SparseLoco::layerwise(0.5, 4, vec![3, 4]), &[1.0; 8]);
    }

    #[test]
    fn exact_zeros_are_not_sent() {
        // k = 3 of a chunk with one non-zero value: only it travels (a kept zero would have
        // come back as a level), and an all-zero chunk sends its prefix alone.
        let x = [0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let mut c = SparseLoco::new(0.75, 4);
        let msg = encode(&mut c, &x);
        let mut y = vec![1.0; 8];
        decode_into(&msg, &mut y).unwrap();
        assert_eq!(y, x);
        assert_eq!(validate_message(&msg, 8).unwrap().nnz, 1);
        assert_eq!(
            msg.len(),
            HEADER_LEN + 12 + (CHUNK_PREFIX + 1) + CHUNK_PREFIX
        );
    }

    #[test]
    fn levels_are_the_means_of_the_two_halves() {
        let x = [4.0, -3.0, 2.0, -1.0];
        let mut c = SparseLoco::new(1.0, 4);
        let msg = encode(&mut c, &x);
        let mut y = vec![0.0; 4];
        decode_into(&msg, &mut y).unwrap();
        assert_eq!(y, [3.5, -3.5, 1.5, -1.5]);
    }

    #[test]
    fn compresses_a_pseudo_gradient_over_a_hundred_fold() {
        let x: Vec<f32> = (0..100_000)
            .map(|i| ((i * 7919) % 1000) as f32 - 500.0)
            .collect();
        let mut c = SparseLoco::new(1.0 / 64.0, DEFAULT_CHUNK);
        let n = encode(&mut c, &x).len();
        assert!(4 * x.len() / n > 100, "{n} bytes");
    }

    #[test]
    fn positions_take_about_log2_of_the_gap_plus_one_and_a_half_bits() {
        // Random positions at 1/64 of 4096 (mean gap 64): ≈ 7.5 bits a position, 2 for the
        // code, against the 16 + 2 of fixed u16 positions.
        let x: Vec<f32> = (0..40 * 4096u64)
            .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32) - 8.0e6)
            .collect();
        let mut c = SparseLoco::new(1.0 / 64.0, DEFAULT_CHUNK);
        let msg = encode(&mut c, &x);
        let per_chunk = (msg.len() - HEADER_LEN - 12) as f64 / 40.0;
        let bits_per_value = (per_chunk - CHUNK_PREFIX as f64) * 8.0 / 64.0;
        assert!(
            (8.5..10.5).contains(&bits_per_value),
            "{bits_per_value} bits a kept value"
        );
        // The bound holds for the worst placement: every kept value at the chunk's end.
        let mut worst = vec![0.0f32; 4096];
        worst[4096 - 64..].fill(1.0);
        let mut c = SparseLoco::new(1.0 / 64.0, DEFAULT_CHUNK);
        let msg = encode(&mut c, &worst);
        let mut y = vec![0.0; 4096];
        decode_into(&msg, &mut y).unwrap();
        assert_eq!(y, worst);
    }

    #[test]
    fn a_gap_longer_than_31_one_bits_round_trips() {
        // One kept value of a chunk of 65536, anywhere up to its end (gap 65535); then a gap
        // of 100 at b = 0, whose 100 one-bits span several words.
        for at in [0usize, 1, 31, 32, 63, 64, 4095, 65535] {
            let mut x = vec![0.0f32; 65536];
            x[at] = -3.0;
            let mut c = SparseLoco::new(1.0 / 65536.0, 65536);
            let msg = encode(&mut c, &x);
            let mut y = vec![1.0; x.len()];
            decode_into(&msg, &mut y).unwrap();
            assert_eq!(y, x, "kept at {at}");
        }
        let mut w = Vec::new();
        let mut bw = BitWriter::new(&mut w);
        put_rice(&mut bw, 100, 0);
        bw.finish();
        let mut bits = Bits { bytes: &w, pos: 0 };
        assert_eq!(bits.unary(1000), Some(100));
        assert_eq!(bits.pos, 101);
        let mut bits = Bits { bytes: &w, pos: 0 };
        assert_eq!(bits.unary(99), None, "over the limit");
        let mut bits = Bits {
            bytes: &w[..12],
            pos: 0,
        };
        assert_eq!(bits.unary(1000), None, "no terminating zero");
    }

    #[test]
    fn the_rice_parameter_is_the_shortest() {
        let cost = |g: &[u32], b: u32| -> u32 { g.iter().map(|&g| (g >> b) + 1 + b).sum() };
        for gaps in [
            vec![0u32; 10],
            vec![63; 64],
            vec![1000, 3, 3, 3],
            vec![65535],
            (0..500).map(|i| (i * 37) % 200).collect(),
        ] {
            let b = rice_parameter(gaps.iter().copied());
            for other in 0..=MAX_RICE {
                assert!(
                    cost(&gaps, b) <= cost(&gaps, other),
                    "{gaps:?}: {b} vs {other}"
                );
            }
        }
    }

    #[test]
    fn damaged_messages_are_refused() {
        let x: Vec<f32> = (0..20).map(|i| i as f32 - 10.0).collect();
        let mut c = SparseLoco::new(0.25, 8);
        let good = encode(&mut c, &x);
        let p = HEADER_LEN;
        let refused = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut m = good.clone();
            edit(&mut m);
            let mut y = vec![0.0; 20];
            decode_into(&m, &mut y).unwrap_err()
        };
        // chunk 0, k above the chunk, a level NaN, more kept than k, a Rice parameter above
        // 16, a position beyond its chunk.
        assert!(matches!(
            refused(&|m| m[p..p + 4].copy_from_slice(&0u32.to_le_bytes())),
            DecodeError::BadParameter { name: "chunk", .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 4..p + 8].copy_from_slice(&9u32.to_le_bytes())),
            DecodeError::BadParameter { name: "k", .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 12..p + 16].copy_from_slice(&f32::NAN.to_le_bytes())),
            DecodeError::NonFiniteScale { bucket: 0 }
        ));
        assert!(matches!(
            refused(&|m| m[p + 20] = 3),
            DecodeError::BadParameter { name: "kept", .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 21] = 17),
            DecodeError::BadParameter { name: "rice", .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 22..p + 24].fill(0xff)),
            DecodeError::IndexOutOfRange { .. }
        ));
        // A byte more, declared in the header: past the last chunk.
        assert!(matches!(
            refused(&|m| {
                m.push(0);
                let n = (m.len() - HEADER_LEN) as u32;
                m[8..12].copy_from_slice(&n.to_le_bytes());
            }),
            DecodeError::PayloadLength { .. }
        ));
        // A byte less: the last chunk's stream ends too soon.
        assert!(refused(&|m| {
            m.pop();
            let n = (m.len() - HEADER_LEN) as u32;
            m[8..12].copy_from_slice(&n.to_le_bytes());
        })
        .to_string()
        .contains("truncated"));
        // A header declaring far more chunks than the payload holds.
        let mut y = vec![0.0; 1 << 20];
        let mut big = good.clone();
        big[4..8].copy_from_slice(&(1u32 << 20).to_le_bytes());
        assert!(matches!(
            decode_into(&big, &mut y).unwrap_err(),
            DecodeError::PayloadLength { .. }
        ));
        let mut y = vec![0.0; 19];
        assert!(decode_into(&good, &mut y).is_err(), "another d");
        // Padding bits set: one kept value of 4 (a 1-bit gap code and a 2-bit code, then
        // five bits of padding).
        let mut c = SparseLoco::new(0.25, 4);
        let mut m = encode(&mut c, &[1.0, 0.0, 0.0, 0.0]);
        let last = m.len() - 1;
        m[last] |= 0x80;
        assert!(matches!(
            decode_into(&m, &mut [0.0; 4]).unwrap_err(),
            DecodeError::BadParameter {
                name: "padding",
                ..
            }
        ));
    }
}
