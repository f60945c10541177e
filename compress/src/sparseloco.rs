//! SparseLoCo's pseudo-gradient compression (Sarfi, Thérien, Lidin & Belilovsky 2025,
//! "SparseLoCo: Communication-efficient LLM training", arXiv 2508.15706 §3): top-k chosen
//! per chunk and 2-bit values. The vector `x: [d]` is cut into chunks of `C` coordinates
//! (the last may be shorter); in each chunk of length `c` the `min(k, c)` largest
//! magnitudes are kept (`k = ⌈ratio·C⌉`), each as its index in the chunk (`u16`) and a
//! 2-bit code: a sign bit and a magnitude bit choosing between the chunk's two levels, the
//! mean |v| of the kept values below their median and of those at or above it (a one-bit
//! Lloyd quantizer of the magnitudes). Biased (`E[C(x)] ≠ x`): used with error feedback,
//! as the paper does (murmur's DiLoCo keeps the residual itself).
//!
//! Per chunk `8 + 2k + ⌈k/4⌉` bytes: with `C = 4096` and a ratio of 1/64 (k = 64), 152
//! bytes for 16,384 bytes of `f32` (108×). The paper's chunks are 2-D 64×64 tiles of each
//! weight matrix; here they are runs of the flat vector (a ring all-reduce's chunks do not
//! follow the tensors), and its index coding is tighter (≈ 12 bits an index).
//!
//! Payload: `u32 C`, `u32 k`, then per chunk `f32 low`, `f32 high`, `u16` indices
//! (strictly increasing, below the chunk's length), and the codes packed four to a byte
//! (bit 0 of each pair the sign, bit 1 the level), the last byte zero-padded.

use crate::select::top_k_exact;
use crate::wire::{begin_message, finish_message, OperatorId, Reader, HEADER_LEN};
use crate::{assert_dim, k_for_ratio, Compressor, DecodeError};
use rand::Rng;

/// The largest chunk: indices in a chunk are `u16`.
pub const MAX_CHUNK: usize = 1 << 16;

/// The default chunk, as the paper's 64×64 tiles.
pub const DEFAULT_CHUNK: usize = 4096;

/// The default error-feedback decay β of the paper (Sarfi et al. 2025, §4: β = 0.95),
/// applied by whoever keeps the residual (`murmur_gossip`'s DiLoCo), not by the operator.
pub const DEFAULT_DECAY: f32 = 0.95;

const NAME: &str = "sparseloco";

/// Chunked top-k with 2-bit values (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct SparseLoco {
    ratio: f64,
    chunk: usize,
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
            idx: Vec::new(),
            mags: Vec::new(),
        }
    }

    /// k, the coordinates kept of a whole chunk.
    pub fn k(&self) -> usize {
        k_for_ratio(self.ratio, self.chunk)
    }
}

/// The payload length for `d` coordinates in chunks of `chunk` keeping `k` of each, in
/// closed form (a header may declare any d: no loop over its chunks before the length
/// matches); saturates instead of overflowing.
fn payload_len(d: usize, chunk: usize, k: usize) -> usize {
    let per_chunk = |kc: usize| 8 + 2 * kc + kc.div_ceil(4);
    let (full, rest) = (d / chunk, d % chunk);
    let last = if rest > 0 { per_chunk(k.min(rest)) } else { 0 };
    full.saturating_mul(per_chunk(k.min(chunk)))
        .saturating_add(8 + last)
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
            payload_len(d, self.chunk, k),
            out,
        );
        out.extend_from_slice(&(self.chunk as u32).to_le_bytes());
        out.extend_from_slice(&(k as u32).to_le_bytes());
        let mut mags = std::mem::take(&mut self.mags);
        for part in x.chunks(self.chunk) {
            self.idx.clear();
            top_k_exact(part, k, 0, &mut self.idx);
            mags.clear();
            mags.extend(self.idx.iter().map(|&i| part[i as usize].abs()));
            mags.sort_unstable_by(f32::total_cmp);
            let kc = mags.len();
            let split = kc / 2;
            let median = mags[split];
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
            for &i in &self.idx {
                out.extend_from_slice(&(i as u16).to_le_bytes());
            }
            let mut byte = 0u8;
            for (n, &i) in self.idx.iter().enumerate() {
                let v = part[i as usize];
                let code = u8::from(v.is_sign_negative()) | (u8::from(v.abs() >= median) << 1);
                byte |= code << (2 * (n % 4));
                if n % 4 == 3 {
                    out.push(byte);
                    byte = 0;
                }
            }
            if !kc.is_multiple_of(4) {
                out.push(byte);
            }
        }
        self.mags = mags;
        finish_message(start, out)
    }

    fn encoded_len(&self, d: usize) -> Option<usize> {
        Some(HEADER_LEN + payload_len(d, self.chunk, self.k()))
    }

    fn max_encoded_len(&self, d: usize) -> usize {
        HEADER_LEN + payload_len(d, self.chunk, self.k())
    }

    fn unbiased(&self) -> bool {
        false
    }
}

/// Checks a whole payload for `d` coordinates; returns the number of values it carries.
pub(crate) fn validate(payload: &[u8], d: usize) -> Result<usize, DecodeError> {
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
    let expected = payload_len(d, chunk, k);
    if payload.len() != expected {
        return Err(DecodeError::PayloadLength {
            operator: NAME,
            declared: payload.len(),
            expected,
        });
    }
    let mut nnz = 0;
    let mut start = 0;
    let mut bucket = 0;
    while start < d {
        let len = chunk.min(d - start);
        let kc = k.min(len);
        for _ in 0..2 {
            let level = f32::from_le_bytes(r.take(4)?.try_into().unwrap_or_default());
            if !level.is_finite() || level < 0.0 {
                return Err(DecodeError::NonFiniteScale { bucket });
            }
        }
        let mut last: Option<u16> = None;
        for n in 0..kc {
            let i = r.u16()?;
            if i as usize >= len {
                return Err(DecodeError::IndexOutOfRange {
                    index: (start + i as usize) as u64,
                    dim: d,
                });
            }
            if last.is_some_and(|l| i <= l) {
                return Err(DecodeError::IndicesNotIncreasing { position: nnz + n });
            }
            last = Some(i);
        }
        let codes = r.take(kc.div_ceil(4))?;
        if !kc.is_multiple_of(4) && codes[kc / 4] >> (2 * (kc % 4)) != 0 {
            return Err(DecodeError::BadParameter {
                operator: NAME,
                name: "padding",
                value: u64::from(codes[kc / 4]),
            });
        }
        nnz += kc;
        start += chunk;
        bucket += 1;
    }
    Ok(nnz)
}

/// Adds `scale · C(x)` of a validated payload into `acc: [d]`.
pub(crate) fn add(payload: &[u8], scale: f32, acc: &mut [f32]) {
    let d = acc.len();
    let rd = |b: &[u8], at: usize| [b[at], b[at + 1], b[at + 2], b[at + 3]];
    let chunk = u32::from_le_bytes(rd(payload, 0)) as usize;
    let k = u32::from_le_bytes(rd(payload, 4)) as usize;
    let mut pos = 8;
    let mut start = 0;
    while start < d {
        let kc = k.min(chunk.min(d - start));
        let low = f32::from_le_bytes(rd(payload, pos));
        let high = f32::from_le_bytes(rd(payload, pos + 4));
        pos += 8;
        let indices = &payload[pos..pos + 2 * kc];
        let codes = &payload[pos + 2 * kc..pos + 2 * kc + kc.div_ceil(4)];
        for n in 0..kc {
            let i = u16::from_le_bytes([indices[2 * n], indices[2 * n + 1]]) as usize;
            let code = (codes[n / 4] >> (2 * (n % 4))) & 3;
            let level = if code & 2 != 0 { high } else { low };
            let v = if code & 1 != 0 { -level } else { level };
            acc[start + i] += scale * v;
        }
        pos += 2 * kc + kc.div_ceil(4);
        start += chunk;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_into, validate as validate_message, Compressor};

    fn encode(c: &mut SparseLoco, x: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
        let n = c.compress(x, &mut rng, &mut out);
        assert_eq!(Some(n), c.encoded_len(x.len()));
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
        // chunk 0, k above the chunk, a level NaN, an index beyond its chunk, indices not
        // increasing, padding bits set.
        assert!(matches!(
            refused(&|m| m[p..p + 4].copy_from_slice(&0u32.to_le_bytes())),
            DecodeError::BadParameter { name: "chunk", .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 4..p + 8].copy_from_slice(&9u32.to_le_bytes())),
            DecodeError::BadParameter { name: "k", .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 8..p + 12].copy_from_slice(&f32::NAN.to_le_bytes())),
            DecodeError::NonFiniteScale { bucket: 0 }
        ));
        assert!(matches!(
            refused(&|m| m[p + 16..p + 18].copy_from_slice(&8u16.to_le_bytes())),
            DecodeError::IndexOutOfRange { .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 18..p + 20].copy_from_slice(&0u16.to_le_bytes())),
            DecodeError::IndicesNotIncreasing { .. }
        ));
        assert!(matches!(
            refused(&|m| m[p + 20] |= 0x80),
            DecodeError::BadParameter {
                name: "padding",
                ..
            }
        ));
        let mut y = vec![0.0; 19];
        assert!(decode_into(&good, &mut y).is_err(), "another d");
    }
}
