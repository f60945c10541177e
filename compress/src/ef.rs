//! Error feedback and deep gradient compression: encoder-side memory around an operator.
//!
//! - [`ErrorFeedback`] keeps what a compressor did not send and adds it to the next input
//!   (1-bit SGD, Seide, Fu, Droppo, Li & Yu 2014, "1-bit stochastic gradient descent and its
//!   application to data-parallel distributed training of speech DNNs"; memory for
//!   sparsifiers, Stich, Cordonnier & Jaggi 2018, "Sparsified SGD with memory"; EF-SGD,
//!   Karimireddy, Rebjock, Stich & Jaggi 2019, "Error feedback fixes SignSGD and other
//!   gradient compression schemes"). With residual `e` (zero at the first call):
//!
//!   ```text
//!   p = x + e            the input plus what earlier messages left out
//!   c = C(p)             the message: the inner operator's encoding of p
//!   e ← p − c            c is decoded from the very bytes sent, so e is exact
//!   ```
//!
//!   Nothing is lost: after T calls, `Σ_t c_t + e_T = Σ_t x_t` (up to `f32` rounding).
//!   The analyses assume a δ-contraction, ‖x − C(x)‖² ≤ (1 − δ)‖x‖² (top-k, unscaled
//!   random-k, sign, the casts; "EF fixes SignSGD"). Around an unbiased operator with
//!   variance factor ω ≥ 1 (scaled random-k: ω = d/k − 1) the residual grows like ω^t;
//!   [`crate::CompressorSpec`] refuses those combinations.
//! - [`Dgc`] is deep gradient compression (Lin, Han, Mao, Wang & Dally 2018, "Deep gradient
//!   compression: reducing the communication bandwidth for distributed training", §3):
//!   top-k with local gradient accumulation, momentum correction, momentum-factor masking
//!   and a sparsity warm-up.
//!
//! Both are encoder-side state: their messages are those of the operator they use
//! ([`crate::OperatorId::TopK`] or [`crate::OperatorId::ApproxTopK`] for DGC), and the
//! receiver decodes them with [`crate::decode_add`] like any other.

use std::fmt;

use rand::Rng;

use crate::rng::SplitMix64;
use crate::select::{select_at_least, shrink_to_top_k, top_k_exact, top_k_threshold};
use crate::sparse::emit_sparse;
use crate::{
    assert_dim, decode_into, k_for_ratio, Compressor, IndexCoding, OperatorId, HEADER_LEN,
};

/// Panics with a clear message when a stateful operator is called with another `d` than
/// the one its state was built for.
fn check_dim(operator: &str, dim: &mut Option<usize>, d: usize) -> bool {
    match *dim {
        Some(expected) => {
            assert_eq!(
                expected, d,
                "{operator}: called with d = {d}, but its state holds d = {expected} \
                 (one operator per vector; call reset() to start over with another d)"
            );
            false
        }
        None => {
            *dim = Some(d);
            true
        }
    }
}

/// Sets an operator's buffers `bufs` (in the order of `names`) and its dimension `dim` from
/// a saved state of vectors of length `d`. Returns whether it did; an empty state changes
/// nothing (`false`).
///
/// # Errors
/// [`crate::StateError`] from [`crate::check_state`]; nothing changed then.
fn restore_buffers<const K: usize>(
    dim: &mut Option<usize>,
    d: usize,
    state: &[(String, Vec<f32>)],
    names: &[&str; K],
    bufs: [&mut Vec<f32>; K],
) -> Result<bool, crate::StateError> {
    if state.is_empty() {
        return Ok(false);
    }
    crate::check_state(state, names, d)?;
    *dim = Some(d);
    for (buf, (_, saved)) in bufs.into_iter().zip(state) {
        buf.clone_from(saved);
    }
    Ok(true)
}

/// Error feedback around any operator (see the module docs): the residual `e: [d]` of what
/// earlier messages did not carry is added to the next input before compressing.
///
/// The messages are the inner operator's (same [`Compressor::id`], same size); the wrapper
/// is biased whatever the inner operator is ([`Compressor::unbiased`] is `false`). After
/// `T` calls with `x_1, …, x_T: [d]`, the decoded messages and the residual add up to
/// `Σ_t x_t` (up to `f32` rounding).
///
/// The residual is sized at the first call (`d` of that `x`) and every later call must
/// use the same `d`. In the steady state no buffer is allocated here (the inner operator
/// may allocate; random-k's decode regenerates its index set).
pub struct ErrorFeedback {
    inner: Box<dyn Compressor>,
    /// `d` of the residual, fixed at the first call after construction or `reset`.
    dim: Option<usize>,
    /// `e: [d]`; holds `p = x + e` while a message is encoded.
    residual: Vec<f32>,
    /// `c: [d]`, the decoded message.
    decoded: Vec<f32>,
}

impl ErrorFeedback {
    /// Error feedback around `inner`, with a zero residual.
    pub fn new(inner: Box<dyn Compressor>) -> Self {
        Self {
            inner,
            dim: None,
            residual: Vec::new(),
            decoded: Vec::new(),
        }
    }

    /// The residual `e: [d]` left by the last call: what was not transmitted yet. Empty
    /// before the first call.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// The wrapped operator.
    pub fn inner(&self) -> &dyn Compressor {
        &*self.inner
    }

    /// Forgets the residual and its dimension: the next call starts from `e = 0` and may
    /// use any `d`. Keeps the buffers' capacity.
    pub fn reset(&mut self) {
        self.dim = None;
        self.residual.clear();
        self.decoded.clear();
    }
}

impl fmt::Debug for ErrorFeedback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorFeedback")
            .field("inner", &self.inner.id())
            .field("dim", &self.dim)
            .finish_non_exhaustive()
    }
}

impl Compressor for ErrorFeedback {
    /// The inner operator's id: the message is the inner operator's.
    fn id(&self) -> OperatorId {
        self.inner.id()
    }

    /// Compresses `p = x + e` for `x: [d]` with the inner operator, appends that message to
    /// `out`, decodes it back into `c: [d]` and keeps `e ← p − c`.
    ///
    /// If the message does not decode (a non-finite value in `x + e`, which a receiver
    /// refuses too), nothing counts as transmitted and the residual keeps all of `p`;
    /// [`ErrorFeedback::reset`] clears a residual poisoned this way.
    ///
    /// # Panics
    /// If `d` differs from the `d` of the first call since construction or the last
    /// [`ErrorFeedback::reset`] (a caller bug: one operator per vector), or if `d ≥ 2³²`.
    fn compress(&mut self, x: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let d = x.len();
        assert_dim(d);
        if check_dim("error feedback", &mut self.dim, d) {
            self.residual.clear();
            self.residual.resize(d, 0.0);
            self.decoded.clear();
            self.decoded.resize(d, 0.0);
        }
        // residual ← p = x + e
        for (e, &xi) in self.residual.iter_mut().zip(x) {
            *e += xi;
        }
        let start = out.len();
        let n = self.inner.compress(&self.residual, rng, out);
        if decode_into(&out[start..start + n], &mut self.decoded).is_ok() {
            // residual ← p − c
            for (e, &c) in self.residual.iter_mut().zip(&self.decoded) {
                *e -= c;
            }
        }
        n
    }

    /// The inner operator's.
    fn encoded_len(&self, d: usize) -> Option<usize> {
        self.inner.encoded_len(d)
    }

    /// The inner operator's.
    fn max_encoded_len(&self, d: usize) -> usize {
        self.inner.max_encoded_len(d)
    }

    /// Always `false`: `C(x + e)` is not an unbiased estimate of `x`.
    fn unbiased(&self) -> bool {
        false
    }

    /// Passed on to the inner operator.
    fn set_epoch(&mut self, epoch: usize) {
        self.inner.set_epoch(epoch)
    }

    /// `[("residual", e)]` after the first call; empty before it.
    fn state(&self) -> Vec<(&'static str, Vec<f32>)> {
        match self.dim {
            Some(_) => vec![("residual", self.residual.clone())],
            None => Vec::new(),
        }
    }

    /// Sets the residual `e` (and d) from `[("residual", e)]`.
    fn restore_state(
        &mut self,
        d: usize,
        state: &[(String, Vec<f32>)],
    ) -> Result<(), crate::StateError> {
        if restore_buffers(&mut self.dim, d, state, &["residual"], [&mut self.residual])? {
            self.decoded.clear();
            self.decoded.resize(d, 0.0);
        }
        Ok(())
    }
}

/// Settings of [`Dgc`] (Lin et al. 2018). The defaults are the paper's: ratio 0.001
/// (99.9% sparsity), momentum 0.9, 4 warm-up epochs, sampled threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DgcConfig {
    /// Final density `k/d`, `0 < ratio ≤ 1` (the paper's 0.1%: 0.001).
    pub ratio: f64,
    /// Momentum factor `m`, `0 ≤ m < 1`, of the momentum correction `u ← m·u + g`.
    pub momentum: f32,
    /// Number of warm-up epochs of exponentially increasing sparsity (see
    /// [`DgcConfig::density`]); 0 for none.
    pub warmup_epochs: usize,
    /// `true`: the top-k threshold is estimated from a sample (one selection pass, the
    /// achieved k varies around k and is at most 2k; messages are
    /// [`OperatorId::ApproxTopK`]); `false`: exact top-k ([`OperatorId::TopK`]).
    pub approximate: bool,
}

impl Default for DgcConfig {
    fn default() -> Self {
        Self {
            ratio: 0.001,
            momentum: 0.9,
            warmup_epochs: 4,
            approximate: true,
        }
    }
}

impl DgcConfig {
    /// The density `k/d` in `epoch` (0-based): `max(ratio, 0.25^(epoch+1))` during the
    /// `warmup_epochs` first epochs, `ratio` after. With the defaults: 0.25, 0.0625,
    /// 0.015625, 0.00390625 (sparsity 75%, 93.75%, 98.4%, 99.6%), then 0.001 (99.9%), as
    /// in the paper's warm-up.
    pub fn density(&self, epoch: usize) -> f64 {
        if epoch < self.warmup_epochs {
            // 0.25^(epoch+1) underflows to 0 long before the clamp matters.
            let n = epoch.min(1 << 16) as i32 + 1;
            self.ratio.max(0.25f64.powi(n))
        } else {
            self.ratio
        }
    }
}

/// Sampled coordinates expected above the approximate threshold (as [`crate::ApproxTopK`]).
const SAMPLE_HITS: usize = 256;
/// Bytes of the sparse parameters (k, coding, reserved) in the wire format.
const SPARSE_PARAMS: usize = 8;

/// Deep gradient compression (Lin et al. 2018), on a gradient `g: [d]` per call:
///
/// ```text
/// u ← m·u + g              momentum correction (u: [d], the local velocity)
/// v ← v + u                local accumulation  (v: [d])
/// S = top-k(|v|)           k = ⌈density·d⌉, exact or with a sampled threshold
/// send v_S                 a sparse top-k message
/// u_S ← 0, v_S ← 0         momentum-factor masking
/// ```
///
/// The density follows the warm-up schedule of [`DgcConfig::density`], set through
/// [`Compressor::set_epoch`] (epoch 0 until the first call). Nothing is lost: the sent
/// values plus `v` add up to the sum of the momentum-corrected `u_t` (up to `f32` rounding).
///
/// # Calling contract
/// The caller passes the **raw** gradient `g` (no momentum, no weight decay folded in by a
/// momentum optimiser): DGC applies the momentum itself, before sparsification. The
/// receivers apply the decoded (averaged) messages as a plain SGD step, `x ← x − lr·Σ`,
/// and must not apply momentum again: the messages already carry it.
///
/// Not included: the paper's local gradient clipping, which belongs to the optimiser.
#[derive(Debug, Clone)]
pub struct Dgc {
    cfg: DgcConfig,
    density: f64,
    dim: Option<usize>,
    /// `u: [d]`, the momentum-corrected velocity.
    u: Vec<f32>,
    /// `v: [d]`, the accumulated velocity not yet sent.
    v: Vec<f32>,
    idx: Vec<u32>,
    last_k: usize,
}

impl Dgc {
    /// DGC with `cfg`, at epoch 0 (density `cfg.density(0)`), with `u = v = 0`.
    ///
    /// # Panics
    /// If `cfg.ratio` is not in `(0, 1]` or `cfg.momentum` is not in `[0, 1)`.
    pub fn new(cfg: DgcConfig) -> Self {
        assert!(
            cfg.ratio > 0.0 && cfg.ratio <= 1.0,
            "DGC ratio must be in (0, 1], got {}",
            cfg.ratio
        );
        assert!(
            (0.0..1.0).contains(&cfg.momentum),
            "DGC momentum must be in [0, 1), got {}",
            cfg.momentum
        );
        Self {
            cfg,
            density: cfg.density(0),
            dim: None,
            u: Vec::new(),
            v: Vec::new(),
            idx: Vec::new(),
            last_k: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &DgcConfig {
        &self.cfg
    }

    /// The current density `k/d` (of the warm-up schedule at the last
    /// [`Compressor::set_epoch`]).
    pub fn density(&self) -> f64 {
        self.density
    }

    /// The number of coordinates the last message carried (0 before the first call).
    pub fn last_k(&self) -> usize {
        self.last_k
    }

    /// The velocity `u: [d]` after the last call (zero at the sent indices). Empty before
    /// the first call.
    pub fn u(&self) -> &[f32] {
        &self.u
    }

    /// The accumulation `v: [d]` after the last call: what has not been sent yet (zero at
    /// the sent indices). Empty before the first call.
    pub fn v(&self) -> &[f32] {
        &self.v
    }

    /// Forgets `u`, `v` and their dimension (the epoch and density stay). Keeps the
    /// buffers' capacity.
    pub fn reset(&mut self) {
        self.dim = None;
        self.u.clear();
        self.v.clear();
        self.last_k = 0;
    }

    /// The wire id of the messages: approximate or exact top-k.
    fn operator(&self) -> OperatorId {
        if self.cfg.approximate {
            OperatorId::ApproxTopK
        } else {
            OperatorId::TopK
        }
    }

    /// The most coordinates a message keeps at the current density.
    fn max_k(&self, d: usize) -> usize {
        let k = k_for_ratio(self.density, d);
        if self.cfg.approximate {
            (2 * k).min(d)
        } else {
            k
        }
    }
}

impl Compressor for Dgc {
    /// [`OperatorId::ApproxTopK`] when `approximate`, else [`OperatorId::TopK`].
    fn id(&self) -> OperatorId {
        self.operator()
    }

    /// One DGC step on the raw gradient `g: [d]` (see the type docs); appends the sparse
    /// message of `v` at the selected indices.
    ///
    /// # Panics
    /// If `d` differs from the `d` of the first call since construction or the last
    /// [`Dgc::reset`] (a caller bug: one operator per vector), or if `d ≥ 2³²`.
    fn compress(&mut self, g: &[f32], rng: &mut dyn Rng, out: &mut Vec<u8>) -> usize {
        let d = g.len();
        assert_dim(d);
        if check_dim("DGC", &mut self.dim, d) {
            self.u.clear();
            self.u.resize(d, 0.0);
            self.v.clear();
            self.v.resize(d, 0.0);
        }
        let m = self.cfg.momentum;
        for ((u, v), &gi) in self.u.iter_mut().zip(self.v.iter_mut()).zip(g) {
            *u = m * *u + gi;
            *v += *u;
        }
        let k = k_for_ratio(self.density, d);
        let mut idx = std::mem::take(&mut self.idx);
        idx.clear();
        if self.cfg.approximate {
            if k > 0 {
                let mut sampler = SplitMix64::new(rng.next_u64());
                let t = top_k_threshold(&self.v, k, SAMPLE_HITS, &mut sampler);
                select_at_least(&self.v, t, 0, &mut idx);
                shrink_to_top_k(&self.v, &mut idx, 2 * k);
            }
        } else {
            top_k_exact(&self.v, k, 0, &mut idx);
        }
        let n = emit_sparse(self.operator(), &self.v, &idx, IndexCoding::Auto, out);
        for &i in &idx {
            self.u[i as usize] = 0.0;
            self.v[i as usize] = 0.0;
        }
        self.last_k = idx.len();
        self.idx = idx;
        n
    }

    /// `None`: the index coding (and, when approximate, k) depends on the data.
    fn encoded_len(&self, _d: usize) -> Option<usize> {
        None
    }

    /// An upper bound at the current density (the warm-up lowers it epoch by epoch; call
    /// after [`Compressor::set_epoch`]): `k` indices of at most 4 bytes and `k` values,
    /// with `k` at most `2⌈density·d⌉` when approximate.
    fn max_encoded_len(&self, d: usize) -> usize {
        HEADER_LEN + SPARSE_PARAMS + 8 * self.max_k(d)
    }

    /// `false`: top-k of the accumulation is biased.
    fn unbiased(&self) -> bool {
        false
    }

    /// Sets the density to [`DgcConfig::density`]`(epoch)`.
    fn set_epoch(&mut self, epoch: usize) {
        self.density = self.cfg.density(epoch);
    }

    /// `[("u", u), ("v", v)]` after the first call; empty before it.
    fn state(&self) -> Vec<(&'static str, Vec<f32>)> {
        match self.dim {
            Some(_) => vec![("u", self.u.clone()), ("v", self.v.clone())],
            None => Vec::new(),
        }
    }

    /// Sets `u`, `v` (and d) from `[("u", u), ("v", v)]`; the epoch stays as set.
    fn restore_state(
        &mut self,
        d: usize,
        state: &[(String, Vec<f32>)],
    ) -> Result<(), crate::StateError> {
        restore_buffers(
            &mut self.dim,
            d,
            state,
            &["u", "v"],
            [&mut self.u, &mut self.v],
        )?;
        Ok(())
    }
}
