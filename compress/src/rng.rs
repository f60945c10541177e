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
//! The stochastic-rounding operators (QSGD, TernGrad, natural compression) use the same
//! generator seeded once per message from the caller's RNG, because one dynamic call per
//! coordinate would cost more than the quantisation itself.

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
