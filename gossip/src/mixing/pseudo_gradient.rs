//! DiLoCo's outer step, shared by `diloco`, `diloco-gossip`, `diloco-auto` and
//! `streaming-diloco` (Douillard et al. 2023, Algorithm 1; Douillard et al. 2025): the
//! default number of inner steps, the outer update on an anchor, the per-step compressor
//! seed, and which compressors a pseudo-gradient ring can use.

use murmur_compress::CompressorSpec;

use crate::optimizer::Optimizer;
use crate::BuildError;

/// H, the inner steps per outer step, when `--local-steps` is not given (the DiLoCo
/// family; the paper's experiments use 500 on LLMs, 50 suits the embedded models).
pub const DILOCO_LOCAL_STEPS: u64 = 50;

/// The outer step a ← a − η_out · OuterOpt(Δ̄) on `anchor: [k]` with the averaged
/// pseudo-gradient `delta: [k]` (all of the model for DiLoCo, one fragment for
/// [`crate::algorithms::streaming_diloco`]).
pub fn outer_update(opt: &mut dyn Optimizer, eta: f32, anchor: &mut [f32], delta: &[f32]) {
    let u = opt.step(anchor, delta);
    for (a, u) in anchor.iter_mut().zip(u) {
        *a -= eta * u;
    }
}

/// The compressor seed of outer step `k` for a peer of seed `seed`.
pub fn outer_step_seed(seed: u64, k: u64) -> u64 {
    seed ^ k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// As [`check_pseudo_gradient_compressor`], for `diloco`'s SparseLoCo form, which
/// all-gathers each peer's message of the whole vector: its chunks may follow the tensors
/// (`sparseloco,layerwise`).
///
/// # Errors
/// [`BuildError::Options`] naming the compressor and why.
pub fn check_diloco_compressor(spec: &CompressorSpec) -> Result<(), BuildError> {
    match spec {
        CompressorSpec::SparseLoco {
            layerwise: true,
            ratio,
            chunk,
            decay,
        } => check_pseudo_gradient_compressor(&CompressorSpec::SparseLoco {
            ratio: *ratio,
            chunk: *chunk,
            decay: *decay,
            layerwise: false,
        }),
        other => check_pseudo_gradient_compressor(other),
    }
}

/// Refuses a compressor that the compressed ring of `diloco` cannot use: one with state
/// of its own (`ef+`: the ring keeps its own residual; DGC), a layer-wise one (the ring's
/// chunks do not follow the tensors), and one around which error feedback diverges (what
/// `ef+` refuses: scaled random-k, TernGrad, QSGD with ω ≥ 1).
///
/// # Errors
/// [`BuildError::Options`] naming the compressor and why.
pub fn check_pseudo_gradient_compressor(spec: &CompressorSpec) -> Result<(), BuildError> {
    check_ring_compressor(spec, "diloco")
}

/// As [`check_pseudo_gradient_compressor`], for `streaming-diloco`'s ring of fragments
/// (its refusals name that algorithm).
///
/// # Errors
/// [`BuildError::Options`] naming the compressor and why.
pub fn check_streaming_compressor(spec: &CompressorSpec) -> Result<(), BuildError> {
    check_ring_compressor(spec, "streaming-diloco")
}

/// The refusals of [`check_pseudo_gradient_compressor`], naming `algorithm`.
fn check_ring_compressor(spec: &CompressorSpec, algorithm: &str) -> Result<(), BuildError> {
    let refuse = |why: String| {
        Err(BuildError::Options(format!(
            "--compressor {spec} for {algorithm}: {why}"
        )))
    };
    match spec {
        CompressorSpec::Identity => Ok(()),
        CompressorSpec::ErrorFeedback(inner) => refuse(format!(
            "diloco keeps its own error-feedback residual for the pseudo-gradient; \
             give the operator without ef+ (--compressor {inner})"
        )),
        CompressorSpec::Dgc(_) => refuse(
            "DGC keeps momentum state of its own; diloco needs a stateless operator \
             (e.g. topk, int8)"
                .into(),
        ),
        CompressorSpec::TopK {
            layerwise: true, ..
        }
        | CompressorSpec::ApproxTopK {
            layerwise: true, ..
        }
        | CompressorSpec::SparseLoco {
            layerwise: true, ..
        } => refuse("the ring's chunks do not follow the model's tensors; drop ,layerwise".into()),
        other => {
            // Error feedback is applied to it, so it must suit ef+.
            CompressorSpec::ErrorFeedback(Box::new(other.clone()))
                .validate()
                .or_else(|e| refuse(format!("it is applied with error feedback, and {e}")))
        }
    }
}
