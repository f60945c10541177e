//! Selection of the largest-magnitude coordinates, for the top-k family.
//!
//! Exact selection is a two-level radix select on the magnitude bits: for finite `f32`,
//! `bits & 0x7fff_ffff` orders like `|x|`, so a histogram of the high 15 bits finds the
//! bucket holding the k-th largest magnitude, a histogram of the low 16 bits inside that
//! bucket finds its exact key, and a last pass collects the indices. Three linear passes,
//! no sort, indices come out increasing (what the sparse wire format wants). NaN keys sort
//! above infinity, so a diverged vector sends its NaNs and the receiver refuses them.
//!
//! The approximate threshold (DGC, Lin et al. 2018, §3 "we sample 0.1%–1% of the
//! gradients") estimates the k-th largest magnitude from a random sample, so selection is
//! one pass; the achieved k varies around k.

use crate::rng::SplitMix64;

/// Sort key of `|v|`: the bits without the sign.
#[inline(always)]
fn key(v: f32) -> u32 {
    v.to_bits() & 0x7fff_ffff
}

/// Appends to `idx` the indices of the `k` coordinates of `x` with the largest `|x_i|`, in
/// increasing index order; ties at the k-th magnitude go to the lowest indices, so exactly
/// `min(k, d)` indices are appended. `O(d)` time, 384 KiB of histograms.
///
/// Indices are offset by `base` (for layer-wise selection inside a longer vector).
pub fn top_k_exact(x: &[f32], k: usize, base: u32, idx: &mut Vec<u32>) {
    let d = x.len();
    if k == 0 {
        return;
    }
    if k >= d {
        idx.extend((0..d as u32).map(|i| base + i));
        return;
    }
    if d < RADIX_MIN_LEN {
        // Short tensors (layer-wise selection, biases): a selection on (key, index) pairs
        // costs O(d) and no 384 KiB of histograms.
        let start = idx.len();
        idx.extend((0..d as u32).map(|i| base + i));
        shrink_tail_to_top_k(x, base, idx, start, k);
        return;
    }
    let (threshold, mut ties) = kth_largest_key(x, k);
    idx.reserve(k);
    for (i, &v) in x.iter().enumerate() {
        let kv = key(v);
        if kv > threshold {
            idx.push(base + i as u32);
        } else if kv == threshold && ties > 0 {
            idx.push(base + i as u32);
            ties -= 1;
        }
    }
}

/// Below this length, [`top_k_exact`] selects on (key, index) pairs instead of histograms.
const RADIX_MIN_LEN: usize = 1 << 15;

/// The key of the k-th largest magnitude (1 ≤ k < d) and how many coordinates with exactly
/// that key belong to the top k.
fn kth_largest_key(x: &[f32], k: usize) -> (u32, usize) {
    let mut hi = vec![0u32; 1 << 15];
    for &v in x {
        hi[(key(v) >> 16) as usize] += 1;
    }
    let (bucket, above) = descend(&hi, k);
    let mut lo = vec![0u32; 1 << 16];
    for &v in x {
        let kv = key(v);
        if kv >> 16 == bucket as u32 {
            lo[(kv & 0xffff) as usize] += 1;
        }
    }
    let (low, above_in_bucket) = descend(&lo, k - above);
    let threshold = ((bucket as u32) << 16) | low as u32;
    (threshold, k - above - above_in_bucket)
}

/// Walks a histogram from the top: the bin where the running count reaches `k`, and the
/// count strictly above that bin.
fn descend(hist: &[u32], k: usize) -> (usize, usize) {
    let mut above = 0usize;
    for (bin, &c) in hist.iter().enumerate().rev() {
        if above + c as usize >= k {
            return (bin, above);
        }
        above += c as usize;
    }
    (0, above)
}

/// An estimate of the k-th largest `|x_i|` from a random sample with about `hits` sampled
/// coordinates above it (at least 1,024 samples, at most `d`; with `hits` = 256 the achieved
/// k has a relative spread of about 1/√256 ≈ 6%). `0 < k ≤ d`. Returns the magnitude key
/// (`bits & 0x7fff_ffff`) to compare against.
pub fn top_k_threshold(x: &[f32], k: usize, hits: usize, rng: &mut SplitMix64) -> u32 {
    let d = x.len();
    if k == 0 || d == 0 {
        return u32::MAX;
    }
    let m = (hits.max(1) as u128 * d as u128)
        .div_ceil(k as u128)
        .clamp(1024.min(d) as u128, d as u128) as usize;
    let mut sample: Vec<u32> = if m == d {
        x.iter().map(|&v| key(v)).collect()
    } else {
        (0..m)
            .map(|_| key(x[rng.below(d as u64) as usize]))
            .collect()
    };
    // The rank of the threshold within the sample, scaled from k within d.
    let r = ((k as u128 * m as u128).div_ceil(d as u128) as usize).clamp(1, m);
    let (_, kth, _) = sample.select_nth_unstable_by(r - 1, |a, b| b.cmp(a));
    *kth
}

/// Appends the indices `base + i` with `|x_i| ≥` the magnitude of `threshold_key`, in
/// increasing order.
pub(crate) fn select_at_least(x: &[f32], threshold_key: u32, base: u32, idx: &mut Vec<u32>) {
    for (i, &v) in x.iter().enumerate() {
        if key(v) >= threshold_key {
            idx.push(base + i as u32);
        }
    }
}

/// Keeps the `k` entries of `idx` (indices into `x`, increasing) with the largest `|x_i|`,
/// ties to lower indices, preserving increasing order.
pub(crate) fn shrink_to_top_k(x: &[f32], idx: &mut Vec<u32>, k: usize) {
    shrink_tail_to_top_k(x, 0, idx, 0, k);
}

/// [`shrink_to_top_k`] on `idx[start..]`, whose entries are `base +` an index into `x`.
fn shrink_tail_to_top_k(x: &[f32], base: u32, idx: &mut Vec<u32>, start: usize, k: usize) {
    let tail = &idx[start..];
    if tail.len() <= k {
        return;
    }
    if k == 0 {
        idx.truncate(start);
        return;
    }
    let mut keyed: Vec<(u32, u32)> = tail
        .iter()
        .map(|&i| (key(x[(i - base) as usize]), i))
        .collect();
    keyed.select_nth_unstable_by(k - 1, |a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.truncate(k);
    idx.truncate(start);
    idx.extend(keyed.iter().map(|&(_, i)| i));
    idx[start..].sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: sort by (|x| descending, index ascending), take k, sort indices.
    fn reference(x: &[f32], k: usize) -> Vec<u32> {
        let mut order: Vec<u32> = (0..x.len() as u32).collect();
        order.sort_by(|&a, &b| {
            x[b as usize]
                .abs()
                .total_cmp(&x[a as usize].abs())
                .then(a.cmp(&b))
        });
        order.truncate(k);
        order.sort_unstable();
        order
    }

    proptest! {
        #[test]
        fn exact_top_k_matches_sorting(
            x in proptest::collection::vec(prop_oneof![-1e6f32..1e6, Just(0.0f32), Just(-0.0f32), Just(1.5f32), Just(-1.5f32)], 0..400),
            frac in 0.0f64..=1.0,
        ) {
            let k = (frac * x.len() as f64) as usize;
            let mut idx = Vec::new();
            top_k_exact(&x, k, 0, &mut idx);
            prop_assert_eq!(idx, reference(&x, k));
        }

        #[test]
        fn shrink_matches_sorting(x in proptest::collection::vec(-10f32..10.0, 1..300), k in 1usize..50) {
            let mut idx: Vec<u32> = (0..x.len() as u32).collect();
            shrink_to_top_k(&x, &mut idx, k);
            prop_assert_eq!(idx, reference(&x, k.min(x.len())));
        }
    }

    #[test]
    fn radix_path_matches_sorting_on_long_vectors() {
        let mut rng = SplitMix64::new(11);
        let x: Vec<f32> = (0..3 * RADIX_MIN_LEN)
            .map(|i| match i % 5 {
                0 => 0.0,
                1 => 1.25,
                _ => rng.unit_pair().0 - 0.5,
            })
            .collect();
        for k in [
            1,
            100,
            RADIX_MIN_LEN,
            2 * RADIX_MIN_LEN,
            3 * RADIX_MIN_LEN - 1,
        ] {
            let mut idx = Vec::new();
            top_k_exact(&x, k, 0, &mut idx);
            assert_eq!(idx, reference(&x, k), "k = {k}");
        }
    }

    #[test]
    fn ties_in_the_low_bits_are_resolved_exactly() {
        // Values that share the high 16 key bits, so the second histogram decides.
        let x: Vec<f32> = (0..2 * RADIX_MIN_LEN as u32)
            .map(|i| f32::from_bits(0x3f80_0000 + (i % 37)))
            .collect();
        for k in [1, 27, 500, RADIX_MIN_LEN + 1] {
            let mut idx = Vec::new();
            top_k_exact(&x, k, 7, &mut idx);
            let expected: Vec<u32> = reference(&x, k).iter().map(|i| i + 7).collect();
            assert_eq!(idx, expected);
        }
    }

    #[test]
    fn sampled_threshold_gives_about_k() {
        let mut rng = SplitMix64::new(3);
        let x: Vec<f32> = (0..200_000)
            .map(|_| rng.unit_pair().0 * 2.0 - 1.0)
            .collect();
        let k = 2_000;
        let t = top_k_threshold(&x, k, 256, &mut SplitMix64::new(9));
        let mut idx = Vec::new();
        select_at_least(&x, t, 0, &mut idx);
        // 256 sampled hits: the achieved k is within ±30% with overwhelming probability.
        assert!(
            (1_400..2_600).contains(&idx.len()),
            "achieved {}",
            idx.len()
        );
    }
}
