//! D² / exact diffusion (H. Tang, Lian, Yan, Zhang & Liu 2018, "D²: Decentralized training
//! over decentralized data", ICML, Algorithm 1; Yuan, Ying, Zhao & Sayed 2019, "Exact
//! diffusion for distributed optimization and learning", IEEE TSP 67, which is the same
//! recursion). Each peer corrects its step with the previous round's, which removes the
//! bias D-PSGD's peers carry on non-IID data:
//!
//! ```text
//! t = 0:  x_i^1     = Σ_j W̄_ij (x_j^0 − η g_j^0)
//! t ≥ 1:  x_i^{t+1} = Σ_j W̄_ij (2 x_j^t − x_j^{t−1} − η g_j^t + η g_j^{t−1})
//! ```
//!
//! It is computed in exact diffusion's form (adapt, correct, combine), which keeps one
//! vector ψ_i instead of x_i^{t−1} and g_i^{t−1}:
//!
//! ```text
//! ψ_i^{t+1} = x_i^t − η g_i^t;   x_i^{t+½} = ψ_i^{t+1} + x_i^t − ψ_i^t  (ψ_i^0 = x_i^0);
//! x_i^{t+1} = Σ_j W̄_ij x_j^{t+½}
//! ```
//!
//! D² needs λ_min(W) > −1/3; the ring's Metropolis–Hastings W (⅓ each) has λ_min = −1/3 for
//! an even n. It therefore mixes with exact diffusion's W̄ = (I + W)/2 (Yuan et al. 2019
//! §III), whose eigenvalues (1 + λ)/2 lie in [0, 1] for any symmetric doubly stochastic W,
//! at the cost of a smaller spectral gap (half of W's). A fixed point has Σ_i g_i = 0 and
//! every x_i equal: with exact gradients D² converges to the exact optimum of Σ_i f_i
//! (`tests/tracking.rs`), where D-PSGD stalls at a bias floor ∝ ζ². In f32 the recursion's
//! conserved network mean (Σ_i (x_i − ψ_i) = 0) drifts by round-off, and the fixed point
//! with it by that drift / η: on the test's quadratic (8 peers, η = 0.1, minima over ±10)
//! the peers come within 4·10⁻⁴ of x* in 300 rounds and then drift away slowly (8·10⁻⁴
//! after 600; a float32 numpy run of the same recursion, done by hand, drifts alike and a
//! float64 one does not); gradient tracking stays
//! at 2·10⁻⁶. Far below SGD's noise in training, but not exact.
//!
//! One round sends x_i^{t+½} (d values: D-PSGD's bytes) to each out-neighbour, mixed by an
//! inner [`crate::DPsgd`] that only mixes; not compressed, not overlapped with the gradient
//! (it enters the message). W̄ must be symmetric (an undirected graph). The recursion carries
//! every peer's previous step: a departure ends the run; the whole run resumes from
//! checkpoints (ψ_i is saved).

use std::time::Instant;

use murmur_compress::CompressorSpec;
use murmur_topology::MixingMatrix;

use crate::algorithm::{
    Algorithm, BuildContext, Capabilities, Compresses, Departures, GraphNeeds, Pattern, Resume,
};
use crate::{AlgorithmState, BuildError, DPsgd, Gossip, GossipEvent, StateError};

/// One peer of D² / exact diffusion (see the [module docs](self)).
pub struct D2 {
    /// Mixes x_i^{t+½} on W̄ = (I + W)/2.
    inner: DPsgd,
    /// η.
    lr: f32,
    /// x_i^t: `[d]`, after the last mixed round.
    x: Vec<f32>,
    /// ψ_i^t = x_i^{t−1} − η g_i^{t−1} (of the round that is mixing: ψ_i^{t+1}): `[d]`.
    psi: Vec<f32>,
    /// Whether a round has begun since the start (round 0 takes the plain step).
    stepped: bool,
    /// Scratch for x_i^{t+½}: `[d]`.
    half: Vec<f32>,
}

/// W̄ = (I + W)/2 of `w` (n×n).
///
/// # Errors
/// A matrix that does not fit (cannot happen for a mixing matrix: W̄ is doubly stochastic
/// when W is).
pub fn lazy(w: &MixingMatrix) -> Result<MixingMatrix, BuildError> {
    let n = w.n();
    let rows = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| 0.5 * w.get(i, j) + if i == j { 0.5 } else { 0.0 })
                .collect()
        })
        .collect();
    MixingMatrix::from_dense(rows).map_err(|e| BuildError::Topology(format!("(I + W)/2: {e}")))
}

impl D2 {
    /// Peer `ctx.rank` from x⁰ = `ctx.x0` with step η = `ctx.lr`, mixing on (I + W)/2.
    ///
    /// # Errors
    /// W̄ cannot be formed.
    pub fn from_context(ctx: &BuildContext<'_>) -> Result<Self, BuildError> {
        let d = ctx.x0.len();
        let w = lazy(&ctx.topology.w)?;
        Ok(D2 {
            inner: DPsgd::mixer(ctx, &w, ctx.x0.clone()),
            lr: ctx.lr,
            x: ctx.x0.clone(),
            psi: vec![0.0; d],
            stepped: false,
            half: vec![0.0; d],
        })
    }
}

impl Gossip for D2 {
    /// Sends x^{t+½} (see the [module docs](self)) from `x: [d]` and `grad: [d]` (`None`: a
    /// zero direction).
    ///
    /// # Panics
    /// If `x` or `grad` is not `[d]`, or a round is mixing.
    fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) {
        let d = self.x.len();
        assert_eq!(x.len(), d, "x must have length d");
        if let Some(g) = grad {
            assert_eq!(g.len(), d, "grad must have length d");
        }
        // ψ^{t+1} = x^t − η g^t; x^{t+½} = ψ^{t+1} + x^t − ψ^t (= ψ^1 at t = 0).
        for i in 0..d {
            let psi = x[i] - self.lr * grad.map_or(0.0, |g| g[i]);
            self.half[i] = if self.stepped {
                psi + (x[i] - self.psi[i])
            } else {
                psi
            };
            self.psi[i] = psi;
        }
        self.stepped = true;
        self.inner.begin_round(now, &self.half, None);
    }

    /// The inner mixer's events; its `Mixed` first takes the mix as x_i^{t+1}.
    fn poll_event(&mut self) -> Option<GossipEvent> {
        let ev = self.inner.poll_event()?;
        if matches!(ev, GossipEvent::Mixed { .. }) {
            self.x.copy_from_slice(self.inner.params());
        }
        Some(ev)
    }

    fn params(&self) -> &[f32] {
        &self.x
    }

    /// ψ_i and whether a round was taken (`stepped`, 0 or 1).
    fn state(&self) -> AlgorithmState {
        AlgorithmState {
            scalars: vec![("stepped".into(), f64::from(u8::from(self.stepped)))],
            vectors: vec![("psi".into(), self.psi.clone())],
        }
    }

    fn restore_state(&mut self, state: &AlgorithmState) -> Result<(), StateError> {
        let d = self.x.len();
        let (s, mut v) =
            state.restore_into(&["stepped"], &["psi"], d, &mut murmur_compress::Identity)?;
        if s[0] != 0.0 && s[0] != 1.0 {
            return Err(StateError(format!("\"stepped\" = {} is not 0 or 1", s[0])));
        }
        self.stepped = s[0] == 1.0;
        self.psi = v.pop().unwrap_or_default();
        Ok(())
    }

    crate::forward_gossip!(inner: handle_message, handle_timeout, start_at_round, poll_transmit, poll_timeout, round, stats, out_peers, in_peers);
}

/// D² / exact diffusion in the [`crate::registry`].
pub struct D2Algorithm;

/// The registry's entry for D².
pub const D2_ALGORITHM: D2Algorithm = D2Algorithm;

static CAPABILITIES: Capabilities = Capabilities {
    pattern: Pattern::Graph(GraphNeeds::Symmetric),
    local_steps: None,
    default_tau: 0,
    compresses: Compresses::Nothing,
    default_compressor: CompressorSpec::Identity,
    options: &[],
    skips_stragglers: false,
    departures: Departures::EndRun,
    resume: Resume::WholeRun,
};

impl Algorithm for D2Algorithm {
    fn name(&self) -> &'static str {
        "d2"
    }
    fn about(&self) -> &'static str {
        "D² / exact diffusion (Tang et al. 2018; Yuan et al. 2019): corrects each step with \
         the previous one, on (I + W)/2, for non-IID data; D-PSGD's bytes"
    }
    fn capabilities(&self) -> &'static Capabilities {
        &CAPABILITIES
    }
    fn build(&self, ctx: BuildContext<'_>) -> Result<Box<dyn Gossip>, BuildError> {
        Ok(Box::new(D2::from_context(&ctx)?))
    }
}
