//! The split of a training set across peers: IID, or label-skewed by Dirichlet(α) (Hsu et
//! al. 2019, "Measuring the effects of non-identical data distribution").

use super::*;

/// How the training set is split across n peers.
///
/// Text form (see [`FromStr`] and [`fmt::Display`]): `iid`, `dirichlet`
/// (alpha 0.5) or `dirichlet:<alpha>`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Partition {
    /// Seeded shuffle, then equal contiguous shares (sizes differ by at most 1).
    Iid,
    /// Label skew after Hsu et al. 2019: each class is split across peers in
    /// proportions drawn from `Dir(alpha·1_n)`. Small alpha (0.1) gives each
    /// peer few classes; large alpha (1000) is close to IID.
    Dirichlet {
        /// Concentration, finite and > 0 (dimensionless).
        alpha: f64,
    },
}

/// Alpha used by the bare `dirichlet` spelling.
pub const DEFAULT_DIRICHLET_ALPHA: f64 = 0.5;

impl FromStr for Partition {
    type Err = DataError;

    /// Parses `iid`, `dirichlet` (alpha [`DEFAULT_DIRICHLET_ALPHA`]) or
    /// `dirichlet:<alpha>` with `alpha` a finite number > 0; case and
    /// surrounding spaces are ignored.
    fn from_str(s: &str) -> Result<Partition, DataError> {
        let bad = |reason: String| DataError::BadPartitionSpec {
            spec: s.to_owned(),
            reason,
        };
        let t = s.trim().to_ascii_lowercase();
        let (kind, arg) = match t.split_once(':') {
            Some((k, a)) => (k.trim(), Some(a.trim())),
            None => (t.as_str(), None),
        };
        match (kind, arg) {
            ("iid", None) => Ok(Partition::Iid),
            ("iid", Some(_)) => Err(bad("iid takes no parameter".into())),
            ("dirichlet", None) => Ok(Partition::Dirichlet {
                alpha: DEFAULT_DIRICHLET_ALPHA,
            }),
            ("dirichlet", Some(a)) => {
                let alpha: f64 = a
                    .parse()
                    .map_err(|_| bad(format!("alpha {a:?} is not a number")))?;
                if !(alpha.is_finite() && alpha > 0.0) {
                    return Err(bad(format!("alpha {alpha} must be finite and > 0")));
                }
                Ok(Partition::Dirichlet { alpha })
            }
            _ => Err(bad(format!("unknown kind {kind:?}"))),
        }
    }
}

impl fmt::Display for Partition {
    /// `iid` or `dirichlet:<alpha>`, parseable by [`Partition::from_str`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::Iid => f.write_str("iid"),
            Partition::Dirichlet { alpha } => write!(f, "dirichlet:{alpha}"),
        }
    }
}

/// Splits sample indices `0..labels.len()` across `n_peers` peers.
///
/// Returns one index list per peer, each sorted ascending; the lists are
/// disjoint, their union is `0..labels.len()`, and every list is non-empty.
/// The result depends only on the arguments (the RNG is
/// `Xoshiro256PlusPlus::seed_from_u64(seed)`; a different `rand`/`rand_distr`
/// version may change the draw).
///
/// - [`Partition::Iid`]: shuffle all indices, then give peer `k` the `k`-th
///   contiguous share; the first `len % n_peers` peers get one extra, so sizes
///   differ by at most 1.
/// - [`Partition::Dirichlet`]: for every label value present, in increasing
///   order, shuffle that class's indices, draw proportions `p ~ Dir(alpha·1_n)`
///   and cut the class at the rounded cumulative proportions
///   (`round(len_c · Σ_{j≤k} p_j)`), peer `k` taking the `k`-th piece (Hsu, Qi
///   and Brown 2019, "Measuring the effects of non-identical data distribution
///   for federated visual classification"). A peer can end up empty; then the
///   whole draw is repeated, up to [`DIRICHLET_MAX_DRAWS`] times. If every draw
///   leaves some peer empty, the draw with the fewest empty peers is kept and
///   repaired: each empty peer, in order, receives one sample (the last index
///   of the currently largest share, lowest peer on ties). This always succeeds
///   because `n_peers <= labels.len()`.
///
/// Errors if `n_peers == 0`, `n_peers > labels.len()`, or alpha is not a
/// finite normal number > 0.
pub fn partition(
    labels: &[u8],
    n_peers: usize,
    how: Partition,
    seed: u64,
) -> Result<Vec<Vec<usize>>, DataError> {
    let n = labels.len();
    let fail = |reason: String| DataError::Partition {
        n_samples: n,
        n_peers,
        reason,
    };
    if n_peers == 0 {
        return Err(fail("need at least one peer".into()));
    }
    if n_peers > n {
        return Err(fail("every peer needs at least one sample".into()));
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut shards = match how {
        Partition::Iid => {
            let mut all: Vec<usize> = (0..n).collect();
            all.shuffle(&mut rng);
            let (base, extra) = (n / n_peers, n % n_peers);
            let mut shards = Vec::with_capacity(n_peers);
            let mut start = 0;
            for k in 0..n_peers {
                let end = start + base + usize::from(k < extra);
                shards.push(all[start..end].to_vec());
                start = end;
            }
            shards
        }
        Partition::Dirichlet { alpha } => {
            if !(alpha.is_finite() && alpha.is_normal() && alpha > 0.0) {
                return Err(fail(format!(
                    "Dirichlet alpha {alpha} must be finite and > 0"
                )));
            }
            if n_peers == 1 {
                vec![(0..n).collect()]
            } else {
                dirichlet_split(labels, n_peers, alpha, &mut rng).map_err(fail)?
            }
        }
    };
    for shard in &mut shards {
        shard.sort_unstable();
    }
    Ok(shards)
}

/// The Dirichlet split of [`partition`] for `n_peers >= 2`, `n_peers <= labels.len()`.
fn dirichlet_split(
    labels: &[u8],
    n_peers: usize,
    alpha: f64,
    rng: &mut Xoshiro256PlusPlus,
) -> Result<Vec<Vec<usize>>, String> {
    let dir =
        Dirichlet::new(&vec![alpha; n_peers]).map_err(|e| format!("Dirichlet({alpha}): {e}"))?;
    let mut classes: Vec<Vec<usize>> = vec![Vec::new(); 256];
    for (i, &l) in labels.iter().enumerate() {
        classes[usize::from(l)].push(i);
    }
    classes.retain(|c| !c.is_empty());

    let mut best: Option<(usize, Vec<Vec<usize>>)> = None;
    for _ in 0..DIRICHLET_MAX_DRAWS {
        let mut shards: Vec<Vec<usize>> = vec![Vec::new(); n_peers];
        for class in &classes {
            let mut idx = class.clone();
            idx.shuffle(rng);
            // Proportions on the simplex; a non-finite draw (possible only in
            // extreme underflow) gives the whole class to one random peer.
            let mut p: Vec<f64> = dir.sample(rng);
            if p.iter().any(|v| !v.is_finite()) {
                let k = rng.random_range(0..n_peers);
                p = vec![0.0; n_peers];
                p[k] = 1.0;
            }
            let len = idx.len();
            let (mut start, mut cum) = (0usize, 0.0f64);
            for (k, shard) in shards.iter_mut().enumerate() {
                cum += p[k];
                let end = if k + 1 == n_peers {
                    len
                } else {
                    ((cum * len as f64).round() as usize).clamp(start, len)
                };
                shard.extend_from_slice(&idx[start..end]);
                start = end;
            }
        }
        let empty = shards.iter().filter(|s| s.is_empty()).count();
        if empty == 0 {
            return Ok(shards);
        }
        if best.as_ref().is_none_or(|(e, _)| empty < *e) {
            best = Some((empty, shards));
        }
    }
    let Some((_, mut shards)) = best else {
        return Err("no Dirichlet draw was made".into());
    };
    for k in 0..n_peers {
        if shards[k].is_empty() {
            // Largest share, lowest index on ties; it holds >= 2 samples since
            // n_peers <= n and peer k holds none.
            let donor = (0..n_peers)
                .max_by(|&a, &b| shards[a].len().cmp(&shards[b].len()).then(b.cmp(&a)))
                .unwrap_or(0);
            if let Some(i) = shards[donor].pop() {
                shards[k].push(i);
            }
        }
    }
    if shards.iter().any(|s| s.is_empty()) {
        return Err("could not give every peer a sample".into());
    }
    Ok(shards)
}
