//! The pseudo-random stream that is part of the wire format.
//!
//! Random-k sends a 64-bit seed instead of its indices, so sender and receiver must draw
//! the same indices from it on every build and platform. That rules out `rand`'s
//! `StdRng`, whose algorithm may change between releases. The stream here is SplitMix64
//! (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators"; the
//! seeding generator of xoshiro), fixed by this crate's wire version:
//!
//! ```text
//! state += 0x9E3779B97F4A7C15
//! z = state
//! z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//! z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//! next = z ^ (z >> 31)
//! ```
//!
//! A bounded draw `below(n)` is `(next · n) >> 64` (Lemire's multiply-shift without the
//! rejection step: the bias is below n/2⁶⁴, under 2⁻³² for any n < 2³²).
//!
//! The stochastic-rounding operators (QSGD, TernGrad, natural compression) need one uniform
//! per coordinate, which at 25.6M coordinates costs more than the quantisation itself with
//! a 64-bit generator. They use [`Dither`]: eight interleaved 32-bit xorshift128 lanes
//! (shifts and xors only, so the lanes run in SIMD registers on any x86-64), seeded from
//! SplitMix64 with a seed drawn once per message from the caller's RNG.

/// SplitMix64: 64 bits of state, one multiply-xorshift mix per draw.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    #[inline(always)]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw from `0..n` (`n ≥ 1`) by multiply-shift.
    #[inline(always)]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Two independent uniforms in `[0, 1)` with 24 bits each, from one draw.
    #[inline(always)]
    pub fn unit_pair(&mut self) -> (f32, f32) {
        let r = self.next_u64();
        const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
        (
            ((r >> 40) as u32) as f32 * SCALE,
            (((r >> 8) as u32) & 0x00ff_ffff) as f32 * SCALE,
        )
    }
}

/// Eight interleaved xorshift128 generators (Marsaglia 2003, "Xorshift RNGs", §4: the
/// 128-bit `xor128` with shifts 11, 8, 19) for the uniforms of stochastic rounding.
///
/// Seeding: eight SplitMix64 draws from `seed`; draw `2w + h` (w < 4, h < 2) sets state
/// word `w` of lanes `4h .. 4h+4`, lane `4h + m` taking `((draw >> 16m) as u32)` rotated
/// left by `8m`. A lane whose four words are all 0 gets word 3 = 1.
/// Step `t` returns the new word 3 of every lane: output `8t + l` is lane `l`'s.
/// Coordinate `i` of a message uses output `i` (lane `i mod 8` of step `⌊i/8⌋`), as the
/// 24-bit uniform `(output >> 8) · 2⁻²⁴`. Not for anything but dithering: xorshift
/// fails linear-complexity tests, which stochastic rounding cannot notice.
#[derive(Debug, Clone)]
pub struct Dither {
    s: [[u32; 8]; 4],
}

impl Dither {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut g = SplitMix64::new(seed);
        let mut s = [[0u32; 8]; 4];
        for word in s.iter_mut() {
            for h in 0..2 {
                let draw = g.next_u64();
                for m in 0..4 {
                    word[4 * h + m] = ((draw >> (16 * m)) as u32).rotate_left(8 * m as u32);
                }
            }
        }
        for l in 0..8 {
            if s.iter().all(|word| word[l] == 0) {
                s[3][l] = 1;
            }
        }
        Self { s }
    }

    /// Fills `out` with consecutive outputs (the first is output 8t of the current step t;
    /// a length not divisible by 8 discards the rest of the last step).
    #[inline]
    pub fn fill(&mut self, out: &mut [u32]) {
        let [mut a, mut b, mut c, mut d] = self.s;
        let mut step = |o: &mut [u32]| {
            let mut n = [0u32; 8];
            for l in 0..8 {
                let t = a[l] ^ (a[l] << 11);
                a[l] = b[l];
                b[l] = c[l];
                c[l] = d[l];
                d[l] = d[l] ^ (d[l] >> 19) ^ (t ^ (t >> 8));
                n[l] = d[l];
            }
            let k = o.len();
            o.copy_from_slice(&n[..k]);
        };
        let (groups, rest) = out.as_chunks_mut::<8>();
        for g in groups {
            step(g);
        }
        if !rest.is_empty() {
            step(rest);
        }
        self.s = [a, b, c, d];
    }
}

/// The `k` distinct indices of `0..d` that random-k with `seed` selects, as a bitset of
/// `d` bits (`⌈d/64⌉` words; bit `i` of word `i/64` is index `i`).
///
/// Floyd's algorithm (Bentley & Floyd 1987, "Programming pearls: a sample of brilliance"):
/// for `j` in `d−k .. d`, draw `t = below(j+1)`; take `t` unless already taken, else `j`.
/// Every k-subset is equally likely; `k` draws, no rejection. Requires `k ≤ d`.
pub fn randk_bitset(seed: u64, k: usize, d: usize) -> Vec<u64> {
    let mut bits = Vec::new();
    randk_bitset_into(seed, k, d, &mut bits);
    bits
}

/// [`randk_bitset`] into a reused buffer (cleared and resized to `⌈d/64⌉` words).
pub fn randk_bitset_into(seed: u64, k: usize, d: usize, bits: &mut Vec<u64>) {
    assert!(k <= d, "random-k: k = {k} > d = {d}");
    bits.clear();
    bits.resize(d.div_ceil(64), 0);
    let mut rng = SplitMix64::new(seed);
    for j in (d - k)..d {
        let t = rng.below(j as u64 + 1) as usize;
        let (w, b) = (t / 64, 1u64 << (t % 64));
        if bits[w] & b == 0 {
            bits[w] |= b;
        } else {
            bits[j / 64] |= 1u64 << (j % 64);
        }
    }
}

/// Calls `f(rank, index)` for the set indices of `bits` in increasing order, `rank` counting
/// from 0.
#[inline]
pub(crate) fn for_each_set(bits: &[u64], mut f: impl FnMut(usize, usize)) {
    let mut rank = 0;
    for (w, &word) in bits.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            let b = word.trailing_zeros() as usize;
            f(rank, w * 64 + b);
            rank += 1;
            word &= word - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_values() {
        // First outputs for seed 1234567 of the reference C implementation (Vigna's
        // splitmix64.c), as listed in many ports' test suites.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        assert_eq!(r.next_u64(), 9817491932198370423);
    }

    #[test]
    fn dither_is_the_documented_xorshift128_and_uniform() {
        // Lane 0, first output, from the seeding rule and one xor128 step by hand.
        let mut g = SplitMix64::new(5);
        let words: Vec<u32> = (0..4)
            .map(|_| {
                let draw = g.next_u64();
                g.next_u64(); // the draw of lanes 4..8
                draw as u32
            })
            .collect();
        let t = words[0] ^ (words[0] << 11);
        let expected = words[3] ^ (words[3] >> 19) ^ (t ^ (t >> 8));
        let mut out = [0u32; 13];
        Dither::new(5).fill(&mut out);
        assert_eq!(out[0], expected);
        // Filling in pieces of 8 gives the same stream as one fill.
        let mut a = [0u32; 64];
        Dither::new(9).fill(&mut a);
        let mut dz = Dither::new(9);
        let mut b = [0u32; 64];
        for piece in b.chunks_mut(16) {
            dz.fill(piece);
        }
        assert_eq!(a, b);
        // Mean and spread of the 24-bit uniforms: 80,000 draws, mean ½ ± 5·0.29/√80000.
        let mut u = vec![0u32; 80_000];
        Dither::new(1).fill(&mut u);
        let v: Vec<f64> = u
            .iter()
            .map(|&x| (x >> 8) as f64 / (1u32 << 24) as f64)
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.0052, "mean {mean}");
        for lane in 0..8 {
            let m = v.iter().skip(lane).step_by(8).sum::<f64>() / 10_000.0;
            assert!((m - 0.5).abs() < 0.015, "lane {lane} mean {m}");
        }
    }

    #[test]
    fn randk_bitset_has_k_distinct_indices_and_is_reproducible() {
        for (k, d) in [(0, 0), (0, 5), (5, 5), (3, 10), (100, 1000), (1, 1)] {
            let a = randk_bitset(42, k, d);
            let ones: u32 = a.iter().map(|w| w.count_ones()).sum();
            assert_eq!(ones as usize, k);
            assert_eq!(a, randk_bitset(42, k, d));
            let mut max = None;
            for_each_set(&a, |_, i| max = Some(i));
            assert!(max.is_none_or(|m| m < d));
        }
    }

    #[test]
    fn randk_is_uniform_over_coordinates() {
        // Each coordinate is chosen with probability k/d: 4000 draws of k = 2 of d = 8
        // give 1000 per coordinate in expectation (sd ≈ 27).
        let mut counts = [0u32; 8];
        for seed in 0..4000u64 {
            for_each_set(&randk_bitset(seed, 2, 8), |_, i| counts[i] += 1);
        }
        for c in counts {
            assert!((880..1120).contains(&c), "{counts:?}");
        }
    }
}
