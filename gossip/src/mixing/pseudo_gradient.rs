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

/// Refuses a compressor that `diloco`'s pseudo-gradient aggregation cannot use: one with
/// state of its own (`ef+`: the aggregation keeps its own residual; DGC), a layer-wise top-k
/// (the compressed ring's chunks do not follow the tensors), and one around which error
/// feedback diverges (what `ef+` refuses: scaled random-k, TernGrad, QSGD with ω ≥ 1).
/// `sparseloco,layerwise` is taken: SparseLoCo's messages are all-gathered whole, so their
/// chunks may follow the tensors.
///
/// # Errors
/// [`BuildError::Options`] naming the compressor and why.
pub fn check_pseudo_gradient_compressor(spec: &CompressorSpec) -> Result<(), BuildError> {
    check_ring_compressor(spec, "diloco", true)
}

/// As [`check_pseudo_gradient_compressor`], for `streaming-diloco`'s ring of fragments (its
/// refusals name that algorithm), which refuses `sparseloco,layerwise` too: a fragment is a
/// range of the flat vector, not a run of whole tensors.
///
/// # Errors
/// [`BuildError::Options`] naming the compressor and why.
pub fn check_streaming_compressor(spec: &CompressorSpec) -> Result<(), BuildError> {
    check_ring_compressor(spec, "streaming-diloco", false)
}

/// The refusals of [`check_pseudo_gradient_compressor`], naming `algorithm`;
/// `whole_vector`: whether SparseLoCo's messages are of the whole vector (a layer-wise one
/// then fits).
fn check_ring_compressor(
    spec: &CompressorSpec,
    algorithm: &str,
    whole_vector: bool,
) -> Result<(), BuildError> {
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
        } => refuse("the ring's chunks do not follow the model's tensors; drop ,layerwise".into()),
        CompressorSpec::SparseLoco {
            layerwise: true, ..
        } if !whole_vector => refuse(
            "the fragments are ranges of the flat vector, not the model's tensors; drop ,layerwise"
                .into(),
        ),
        other => {
            // Error feedback is applied to it, so it must suit ef+.
            CompressorSpec::ErrorFeedback(Box::new(other.clone()))
                .validate()
                .or_else(|e| refuse(format!("it is applied with error feedback, and {e}")))
        }
    }
}
