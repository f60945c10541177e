//! The text form of a compression operator, used in run configs and on the command line
//! (`--compressor topk:0.01`).
//!
//! # Grammar
//!
//! ```text
//! spec      = ["ef+"] operator
//! operator  = name [":" positional] ("," key ["=" value])*
//! ```
//!
//! | operator | positional (default) | keys (default) |
//! |---|---|---|
//! | `identity` | — | — |
//! | `topk` | ratio (0.01) | `layerwise` (flag: per tensor) |
//! | `approx-topk` | ratio (0.01) | `layerwise` (flag: per tensor) |
//! | `randk` | ratio (0.01) | `unscaled` (flag; scaled by d/k by default) |
//! | `qsgd` | levels, 1–65535 (15) | `bucket=N` (512) |
//! | `int8` | — | `bucket=N` (128) |
//! | `sign` | — | `bucket=N` (none: one scale for the whole vector) |
//! | `terngrad` | — | `bucket=N` (none: one scale for the whole vector) |
//! | `natural`, `fp16`, `bf16` | — | — |
//! | `sparseloco` | ratio (1/64) | `chunk=C` (4096), `decay=B` (0.95: the error-feedback decay of the pseudo-gradient aggregation), `layerwise` (chunks per tensor) |
//! | `dgc` | ratio (0.001) | `momentum=M` (0.9), `warmup=EPOCHS` (4), `exact` (flag; sampled threshold by default) |
//!
//! A ratio is in `(0, 1]`, a bucket size at least 1 (and below 2³²), a DGC momentum in
//! `[0, 1)`. `ef+` wraps an operator in [`crate::ErrorFeedback`], once; not `dgc` (which
//! keeps its own accumulation), and not the unbiased operators whose variance factor can
//! reach 1 (scaled random-k, TernGrad, QSGD with min(b/s², √b/s) ≥ 1, int8 with
//! b/(4·127²) ≥ 1), around which the
//! residual grows without bound. Examples: `identity`, `topk:0.01,layerwise`,
//! `randk:0.05,unscaled`, `qsgd:4,bucket=128`, `sign,bucket=512`, `ef+sign`,
//! `dgc:0.001,momentum=0.9,warmup=4,exact`.
//!
//! [`CompressorSpec`]'s `Display` writes the canonical form, every default written out
//! (`qsgd` → `qsgd:15,bucket=512`), and parsing it gives back the same spec. Serde reads
//! and writes that string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{
    ApproxTopK, Bf16, Compressor, Dgc, DgcConfig, ErrorFeedback, Fp16, Identity, Int8, Natural,
    Qsgd, RandK, Sign, SparseLoco, TernGrad, TopK,
};

/// Default ratio of `topk`, `approx-topk` and `randk`.
const DEFAULT_RATIO: f64 = 0.01;
/// Default number of QSGD levels.
const DEFAULT_QSGD_LEVELS: u16 = 15;
/// Default QSGD bucket size.
const DEFAULT_QSGD_BUCKET: usize = 512;
/// Default int8 bucket size.
const DEFAULT_INT8_BUCKET: usize = 128;

/// The operator names, as listed in error messages.
const OPERATORS: &str =
    "identity, topk, approx-topk, randk, qsgd, int8, sign, terngrad, natural, fp16, bf16, dgc, \
     sparseloco \
     (optionally prefixed ef+ for error feedback, e.g. ef+topk:0.01)";

/// A compression operator as written in configs and on the command line (see the module
/// docs for the grammar). Parse with [`str::parse`], write with `Display`, make the operator
/// with [`CompressorSpec::build`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CompressorSpec {
    /// `identity`: no compression ([`Identity`]).
    Identity,
    /// `topk:RATIO[,layerwise]`: exact top-k ([`TopK`]), `k = ⌈ratio·d⌉` over the whole
    /// vector or per tensor.
    TopK {
        /// Kept fraction, `0 < ratio ≤ 1`.
        ratio: f64,
        /// Select per tensor (needs the tensor lengths at [`CompressorSpec::build`]).
        layerwise: bool,
    },
    /// `approx-topk:RATIO[,layerwise]`: top-k with a sampled threshold ([`ApproxTopK`]),
    /// over the whole vector or per tensor.
    ApproxTopK {
        /// Target kept fraction, `0 < ratio ≤ 1`.
        ratio: f64,
        /// Select per tensor (needs the tensor lengths at [`CompressorSpec::build`]).
        layerwise: bool,
    },
    /// `randk:RATIO[,unscaled]`: random-k ([`RandK`]).
    RandK {
        /// Kept fraction, `0 < ratio ≤ 1`.
        ratio: f64,
        /// Scale the kept values by d/k (unbiased); `unscaled` in the text form clears it.
        scaled: bool,
    },
    /// `qsgd:LEVELS,bucket=N`: QSGD ([`Qsgd`]).
    Qsgd {
        /// Number of levels `s`, 1 to 65535.
        levels: u16,
        /// Bucket size, at least 1.
        bucket: usize,
    },
    /// `int8[,bucket=N]`: 8-bit absmax quantisation ([`Int8`]), bucket 128 by default.
    Int8 {
        /// Bucket size, at least 1.
        bucket: usize,
    },
    /// `sign[,bucket=N]`: scaled sign ([`Sign`]).
    Sign {
        /// Bucket size; `None` for one scale over the whole vector.
        bucket: Option<usize>,
    },
    /// `terngrad[,bucket=N]`: TernGrad ([`TernGrad`]).
    TernGrad {
        /// Bucket size; `None` for one scale over the whole vector.
        bucket: Option<usize>,
    },
    /// `natural`: natural compression ([`Natural`]).
    Natural,
    /// `fp16`: cast to binary16 ([`Fp16`]).
    Fp16,
    /// `bf16`: cast to bfloat16 ([`Bf16`]).
    Bf16,
    /// `sparseloco[:RATIO][,chunk=C][,decay=B][,layerwise]`: SparseLoCo's top-k per chunk of C
    /// coordinates with 2-bit values ([`SparseLoco`]); ratio 1/64, C = 4096 and β = 0.95 by
    /// default.
    SparseLoco {
        /// Share of each chunk kept, in (0, 1].
        ratio: f64,
        /// Coordinates per chunk, 1..=65536.
        chunk: usize,
        /// β ∈ [0, 1], the decay of the error-feedback residual that the pseudo-gradient
        /// aggregation applies before each compression, e ← β e + Δ (Sarfi et al. 2025,
        /// Algorithm 1; `murmur_gossip`'s DiLoCo). The operator itself does not use it.
        decay: f32,
        /// Chunks per tensor (`,layerwise`): each of the model's tensors cut into chunks of
        /// its own ([`SparseLoco::layerwise`]); needs the tensor lengths.
        layerwise: bool,
    },
    /// `ef+OPERATOR`: error feedback ([`ErrorFeedback`]) around an operator that is neither
    /// error feedback nor DGC.
    ErrorFeedback(Box<CompressorSpec>),
    /// `dgc:RATIO,momentum=M,warmup=EPOCHS[,exact]`: deep gradient compression ([`Dgc`]).
    Dgc(DgcConfig),
}

/// Why a compressor spec was refused. Every message names what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Nothing to parse.
    #[error("empty compressor spec; expected one of {OPERATORS}")]
    Empty,
    /// The operator name is not known.
    #[error("unknown compressor '{name}'; expected one of {OPERATORS}")]
    UnknownCompressor {
        /// The name given.
        name: String,
    },
    /// A positional parameter (`name:…`) for an operator that takes none.
    #[error("{operator} takes no positional parameter, got '{operator}:{value}' (usage: {usage})")]
    UnexpectedPositional {
        /// The operator.
        operator: &'static str,
        /// The positional text given.
        value: String,
        /// The operator's grammar.
        usage: &'static str,
    },
    /// A key the operator does not have.
    #[error("unknown key '{key}' for {operator}; valid keys: {valid} (usage: {usage})")]
    UnknownKey {
        /// The operator.
        operator: &'static str,
        /// The key given.
        key: String,
        /// The operator's keys.
        valid: &'static str,
        /// The operator's grammar.
        usage: &'static str,
    },
    /// The same key twice.
    #[error("duplicate key '{key}' for {operator}")]
    DuplicateKey {
        /// The operator.
        operator: &'static str,
        /// The repeated key.
        key: String,
    },
    /// An empty `,,` or trailing `,` in the parameter list.
    #[error("empty parameter in '{spec}' (a stray comma?)")]
    EmptyParameter {
        /// The operator's text.
        spec: String,
    },
    /// A flag given a value (`layerwise=true`).
    #[error(
        "'{key}' is a flag of {operator} and takes no value, got '{key}={value}' (usage: {usage})"
    )]
    FlagWithValue {
        /// The operator.
        operator: &'static str,
        /// The flag.
        key: &'static str,
        /// The value given.
        value: String,
        /// The operator's grammar.
        usage: &'static str,
    },
    /// A key without its value (`bucket` instead of `bucket=512`).
    #[error("key '{key}' of {operator} needs a value, as in {key}=… (usage: {usage})")]
    MissingValue {
        /// The operator.
        operator: &'static str,
        /// The key.
        key: &'static str,
        /// The operator's grammar.
        usage: &'static str,
    },
    /// A parameter that does not parse or is out of range.
    #[error("invalid {parameter} '{value}' for {operator}: expected {expected}")]
    InvalidValue {
        /// The operator.
        operator: &'static str,
        /// The parameter (`ratio`, `levels`, `bucket`, …).
        parameter: &'static str,
        /// The value given.
        value: String,
        /// What it must be, e.g. "a number in (0, 1]".
        expected: &'static str,
    },
    /// `ef+ef+…`.
    #[error("error feedback cannot be nested, got '{spec}' (write ef+ once)")]
    NestedErrorFeedback {
        /// The spec given.
        spec: String,
    },
    /// `ef+dgc`.
    #[error(
        "ef+dgc is not allowed: dgc already accumulates what it does not send (its own error \
         feedback); write dgc"
    )]
    ErrorFeedbackOnDgc,
    /// `ef+` around an unbiased operator whose variance factor ω is 1 or more: the residual
    /// update e ← p − C(p) multiplies E‖e‖² by ω each step, so it grows without bound.
    #[error(
        "ef+{inner} is not allowed: error feedback needs a contraction (‖x − C(x)‖² < ‖x‖²), \
         and {inner} is unbiased with a variance factor ω = {omega} ≥ 1, so the residual \
         would grow without bound; {hint}"
    )]
    ErrorFeedbackNeedsContraction {
        /// The inner operator's canonical text.
        inner: String,
        /// Its variance factor ω (E‖C(x) − x‖² ≤ ω‖x‖²), or a bound.
        omega: String,
        /// What to use instead.
        hint: &'static str,
    },
    /// Layer-wise top-k built without the tensor lengths.
    #[error("layer-wise top-k needs the model's tensor lengths, but none were given")]
    LayersRequired,
}

/// Expected-value texts of [`SpecError::InvalidValue`].
const EXPECT_RATIO: &str = "a number in (0, 1]";
const EXPECT_LEVELS: &str = "an integer from 1 to 65535";
const EXPECT_BUCKET: &str = "an integer from 1 to 4294967295";
const EXPECT_MOMENTUM: &str = "a number in [0, 1)";
const EXPECT_WARMUP: &str = "a non-negative integer (epochs)";
const EXPECT_CHUNK: &str = "an integer from 1 to 65536";
const EXPECT_DECAY: &str = "a number in [0, 1]";

/// One operator of the grammar: its name, usage line and valid keys.
struct Grammar {
    name: &'static str,
    usage: &'static str,
    keys: &'static str,
}

/// The grammar of each operator name (the order of [`OPERATORS`]).
const GRAMMARS: [Grammar; 13] = [
    Grammar {
        name: "identity",
        usage: "identity",
        keys: "none",
    },
    Grammar {
        name: "topk",
        usage: "topk[:RATIO][,layerwise]",
        keys: "layerwise",
    },
    Grammar {
        name: "approx-topk",
        usage: "approx-topk[:RATIO][,layerwise]",
        keys: "layerwise",
    },
    Grammar {
        name: "randk",
        usage: "randk[:RATIO][,unscaled]",
        keys: "unscaled",
    },
    Grammar {
        name: "qsgd",
        usage: "qsgd[:LEVELS][,bucket=N]",
        keys: "bucket",
    },
    Grammar {
        name: "int8",
        usage: "int8[,bucket=N]",
        keys: "bucket",
    },
    Grammar {
        name: "sign",
        usage: "sign[,bucket=N]",
        keys: "bucket",
    },
    Grammar {
        name: "terngrad",
        usage: "terngrad[,bucket=N]",
        keys: "bucket",
    },
    Grammar {
        name: "natural",
        usage: "natural",
        keys: "none",
    },
    Grammar {
        name: "fp16",
        usage: "fp16",
        keys: "none",
    },
    Grammar {
        name: "bf16",
        usage: "bf16",
        keys: "none",
    },
    Grammar {
        name: "sparseloco",
        usage: "sparseloco[:RATIO][,chunk=C][,decay=B][,layerwise]",
        keys: "chunk, decay, layerwise",
    },
    Grammar {
        name: "dgc",
        usage: "dgc[:RATIO][,momentum=M][,warmup=EPOCHS][,exact]",
        keys: "momentum, warmup, exact",
    },
];

/// The positional parameter and keys of one operator's text, consumed as they are read.
struct Params<'a> {
    grammar: &'static Grammar,
    positional: Option<&'a str>,
    /// `(key, value)` pairs not read yet.
    keys: Vec<(&'a str, Option<&'a str>)>,
}

impl<'a> Params<'a> {
    /// Splits `name[:positional][,key[=value]]*`.
    fn parse(s: &'a str) -> Result<Self, SpecError> {
        let mut items = s.split(',');
        let head = items.next().unwrap_or("");
        let (name, positional) = match head.split_once(':') {
            Some((name, p)) => (name, Some(p)),
            None => (head, None),
        };
        if name.is_empty() && positional.is_none() && !s.contains(',') {
            return Err(SpecError::Empty);
        }
        let grammar = GRAMMARS.iter().find(|g| g.name == name).ok_or_else(|| {
            SpecError::UnknownCompressor {
                name: name.to_owned(),
            }
        })?;
        let mut keys: Vec<(&str, Option<&str>)> = Vec::new();
        for item in items {
            if item.is_empty() {
                return Err(SpecError::EmptyParameter { spec: s.to_owned() });
            }
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            if keys.iter().any(|&(k, _)| k == key) {
                return Err(SpecError::DuplicateKey {
                    operator: grammar.name,
                    key: key.to_owned(),
                });
            }
            keys.push((key, value));
        }
        Ok(Self {
            grammar,
            positional,
            keys,
        })
    }

    /// Takes the positional parameter, if any.
    fn positional(&mut self) -> Option<&'a str> {
        self.positional.take()
    }

    /// Takes the value of `key=value`, if present.
    fn value(&mut self, key: &'static str) -> Result<Option<&'a str>, SpecError> {
        match self.take(key) {
            None => Ok(None),
            Some(Some(v)) => Ok(Some(v)),
            Some(None) => Err(SpecError::MissingValue {
                operator: self.grammar.name,
                key,
                usage: self.grammar.usage,
            }),
        }
    }

    /// Takes the flag `key`: whether it is present.
    fn flag(&mut self, key: &'static str) -> Result<bool, SpecError> {
        match self.take(key) {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(v)) => Err(SpecError::FlagWithValue {
                operator: self.grammar.name,
                key,
                value: v.to_owned(),
                usage: self.grammar.usage,
            }),
        }
    }

    fn take(&mut self, key: &str) -> Option<Option<&'a str>> {
        let at = self.keys.iter().position(|&(k, _)| k == key)?;
        Some(self.keys.remove(at).1)
    }

    /// Refuses whatever was not read: a positional or keys the operator does not have.
    fn finish(self) -> Result<(), SpecError> {
        let g = self.grammar;
        if let Some(p) = self.positional {
            return Err(SpecError::UnexpectedPositional {
                operator: g.name,
                value: p.to_owned(),
                usage: g.usage,
            });
        }
        match self.keys.first() {
            Some(&(key, _)) => Err(SpecError::UnknownKey {
                operator: g.name,
                key: key.to_owned(),
                valid: g.keys,
                usage: g.usage,
            }),
            None => Ok(()),
        }
    }

    fn invalid(&self, parameter: &'static str, value: &str, expected: &'static str) -> SpecError {
        SpecError::InvalidValue {
            operator: self.grammar.name,
            parameter,
            value: value.to_owned(),
            expected,
        }
    }

    /// A ratio in (0, 1] from the positional, or `default`.
    fn ratio(&mut self, default: f64) -> Result<f64, SpecError> {
        match self.positional() {
            None => Ok(default),
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|r| valid_ratio(*r))
                .ok_or_else(|| self.invalid("ratio", text, EXPECT_RATIO)),
        }
    }

    /// A bucket size in `1..2³²` from `bucket=N`, if present.
    fn bucket(&mut self) -> Result<Option<usize>, SpecError> {
        match self.value("bucket")? {
            None => Ok(None),
            Some(text) => text
                .parse::<u64>()
                .ok()
                .filter(|&b| valid_bucket(b))
                .map(|b| Some(b as usize))
                .ok_or_else(|| self.invalid("bucket", text, EXPECT_BUCKET)),
        }
    }
}

fn valid_ratio(r: f64) -> bool {
    r > 0.0 && r <= 1.0
}

fn valid_bucket(b: u64) -> bool {
    (1..=u32::MAX as u64).contains(&b)
}

fn valid_momentum(m: f32) -> bool {
    (0.0..1.0).contains(&m)
}

impl CompressorSpec {
    /// The operator's name, the first word of its text form: `"identity"`, `"topk"`,
    /// `"approx-topk"`, `"randk"`, `"qsgd"`, `"sign"`, `"terngrad"`, `"natural"`, `"fp16"`,
    /// `"bf16"`, `"dgc"`, and `"ef"` for error feedback (whatever it wraps).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::TopK { .. } => "topk",
            Self::ApproxTopK { .. } => "approx-topk",
            Self::RandK { .. } => "randk",
            Self::Qsgd { .. } => "qsgd",
            Self::Int8 { .. } => "int8",
            Self::Sign { .. } => "sign",
            Self::TernGrad { .. } => "terngrad",
            Self::Natural => "natural",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
            Self::SparseLoco { .. } => "sparseloco",
            Self::ErrorFeedback(_) => "ef",
            Self::Dgc(_) => "dgc",
        }
    }

    /// Whether the operator it builds is unbiased (`E[C(x)] = x`): identity, scaled
    /// random-k, QSGD, int8, TernGrad and natural compression. Error feedback and DGC are
    /// not.
    pub fn unbiased(&self) -> bool {
        match self {
            Self::Identity
            | Self::Qsgd { .. }
            | Self::Int8 { .. }
            | Self::TernGrad { .. }
            | Self::Natural => true,
            Self::RandK { scaled, .. } => *scaled,
            Self::TopK { .. }
            | Self::ApproxTopK { .. }
            | Self::Sign { .. }
            | Self::Fp16
            | Self::Bf16
            | Self::SparseLoco { .. }
            | Self::ErrorFeedback(_)
            | Self::Dgc(_) => false,
        }
    }

    /// Checks the rules that parsing enforces, for a spec built in code: ratios in
    /// `(0, 1]`, levels and buckets at least 1 (buckets below 2³²), DGC momentum in
    /// `[0, 1)`, error feedback neither nested nor around DGC.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |operator, parameter, value: String, expected| {
            Err(SpecError::InvalidValue {
                operator,
                parameter,
                value,
                expected,
            })
        };
        let name = self.name();
        match self {
            Self::TopK { ratio, .. }
            | Self::ApproxTopK { ratio, .. }
            | Self::RandK { ratio, .. }
            | Self::SparseLoco { ratio, .. }
                if !valid_ratio(*ratio) =>
            {
                invalid(name, "ratio", ratio.to_string(), EXPECT_RATIO)
            }
            Self::Qsgd { levels: 0, .. } => invalid(name, "levels", "0".into(), EXPECT_LEVELS),
            Self::SparseLoco { chunk, .. }
                if !(1..=crate::sparseloco::MAX_CHUNK).contains(chunk) =>
            {
                invalid(name, "chunk", chunk.to_string(), EXPECT_CHUNK)
            }
            Self::SparseLoco { decay, .. } if !(0.0..=1.0).contains(decay) => {
                invalid(name, "decay", decay.to_string(), EXPECT_DECAY)
            }
            Self::Qsgd { bucket, .. }
            | Self::Int8 { bucket }
            | Self::Sign {
                bucket: Some(bucket),
            }
            | Self::TernGrad {
                bucket: Some(bucket),
            } if !valid_bucket(*bucket as u64) => {
                invalid(name, "bucket", bucket.to_string(), EXPECT_BUCKET)
            }
            Self::Dgc(cfg) if !valid_ratio(cfg.ratio) => {
                invalid(name, "ratio", cfg.ratio.to_string(), EXPECT_RATIO)
            }
            Self::Dgc(cfg) if !valid_momentum(cfg.momentum) => {
                invalid(name, "momentum", cfg.momentum.to_string(), EXPECT_MOMENTUM)
            }
            Self::ErrorFeedback(inner) => match **inner {
                Self::ErrorFeedback(_) => Err(SpecError::NestedErrorFeedback {
                    spec: self.to_string(),
                }),
                Self::Dgc(_) => Err(SpecError::ErrorFeedbackOnDgc),
                _ => {
                    inner.validate()?;
                    inner.check_contraction()
                }
            },
            _ => Ok(()),
        }
    }

    /// Refuses, for `ef+`, the unbiased operators whose variance factor ω can reach 1:
    /// scaled random-k (ω = d/k − 1), QSGD with min(b/s², √b/s) ≥ 1, and TernGrad (ω up to
    /// d − 1 for one bucket). Error feedback assumes a δ-contraction (Stich et al. 2018;
    /// Karimireddy et al. 2019).
    fn check_contraction(&self) -> Result<(), SpecError> {
        let refuse = |omega: String, hint| {
            Err(SpecError::ErrorFeedbackNeedsContraction {
                inner: self.to_string(),
                omega,
                hint,
            })
        };
        match self {
            Self::RandK {
                ratio,
                scaled: true,
            } if *ratio <= 0.5 => refuse(
                format!("d/k − 1 ≈ {}", 1.0 / ratio - 1.0),
                "use the unscaled random-k (`,unscaled`), a contraction with δ = k/d",
            ),
            Self::Qsgd { levels, bucket } => {
                let (b, s) = (*bucket as f64, *levels as f64);
                let omega = (b / (s * s)).min(b.sqrt() / s);
                if omega >= 1.0 {
                    refuse(
                        format!("min(b/s², √b/s) = {omega:.3}"),
                        "use more levels or smaller buckets (ω < 1), e.g. qsgd:255",
                    )
                } else {
                    Ok(())
                }
            }
            Self::Int8 { bucket } => {
                let omega = Int8::new(*bucket).variance_factor(usize::MAX);
                if omega >= 1.0 {
                    refuse(
                        format!("b/(4·127²) = {omega:.3}"),
                        "use buckets below 64516 (ω < 1), e.g. int8,bucket=128",
                    )
                } else {
                    Ok(())
                }
            }
            Self::TernGrad { .. } => refuse(
                "‖x‖∞‖x‖₁/‖x‖² − 1, up to d − 1".into(),
                "use sign (ef+sign is EF-signSGD) or top-k",
            ),
            _ => Ok(()),
        }
    }

    /// Makes the operator. `layers` are the model's tensor lengths in parameter order
    /// (summing to `d`); only layer-wise top-k uses them, and requires them. The spec is
    /// checked first ([`CompressorSpec::validate`]), so a bad spec built in code is an
    /// `Err`, not a panic.
    pub fn build(&self, layers: Option<&[usize]>) -> Result<Box<dyn Compressor>, SpecError> {
        self.validate()?;
        Ok(match self {
            Self::Identity => Box::new(Identity),
            Self::TopK {
                ratio,
                layerwise: false,
            } => Box::new(TopK::new(*ratio)),
            Self::TopK {
                ratio,
                layerwise: true,
            } => {
                let layers = layers.ok_or(SpecError::LayersRequired)?;
                Box::new(TopK::layerwise(*ratio, layers.to_vec()))
            }
            Self::ApproxTopK {
                ratio,
                layerwise: false,
            } => Box::new(ApproxTopK::new(*ratio)),
            Self::ApproxTopK {
                ratio,
                layerwise: true,
            } => {
                let layers = layers.ok_or(SpecError::LayersRequired)?;
                Box::new(ApproxTopK::layerwise(*ratio, layers.to_vec()))
            }
            Self::RandK { ratio, scaled } => Box::new(RandK::new(*ratio, *scaled)),
            Self::Qsgd { levels, bucket } => Box::new(Qsgd::new(*levels, *bucket)),
            Self::Int8 { bucket } => Box::new(Int8::new(*bucket)),
            Self::Sign { bucket } => Box::new(Sign::new(*bucket)),
            Self::TernGrad { bucket } => Box::new(TernGrad::new(*bucket)),
            Self::Natural => Box::new(Natural::new()),
            Self::Fp16 => Box::new(Fp16::default()),
            Self::Bf16 => Box::new(Bf16::default()),
            Self::SparseLoco {
                ratio,
                chunk,
                layerwise: false,
                ..
            } => Box::new(SparseLoco::new(*ratio, *chunk)),
            Self::SparseLoco {
                ratio,
                chunk,
                layerwise: true,
                ..
            } => {
                let layers = layers.ok_or(SpecError::LayersRequired)?;
                Box::new(SparseLoco::layerwise(*ratio, *chunk, layers.to_vec()))
            }
            Self::ErrorFeedback(inner) => Box::new(ErrorFeedback::new(inner.build(layers)?)),
            Self::Dgc(cfg) => Box::new(Dgc::new(*cfg)),
        })
    }

    /// Parses one operator without the `ef+` prefix.
    fn parse_operator(s: &str) -> Result<Self, SpecError> {
        let mut p = Params::parse(s)?;
        let spec = match p.grammar.name {
            "identity" => Self::Identity,
            "topk" => Self::TopK {
                ratio: p.ratio(DEFAULT_RATIO)?,
                layerwise: p.flag("layerwise")?,
            },
            "approx-topk" => Self::ApproxTopK {
                ratio: p.ratio(DEFAULT_RATIO)?,
                layerwise: p.flag("layerwise")?,
            },
            "randk" => Self::RandK {
                ratio: p.ratio(DEFAULT_RATIO)?,
                scaled: !p.flag("unscaled")?,
            },
            "qsgd" => {
                let levels = match p.positional() {
                    None => DEFAULT_QSGD_LEVELS,
                    Some(text) => text
                        .parse::<u64>()
                        .ok()
                        .filter(|l| (1..=u16::MAX as u64).contains(l))
                        .map(|l| l as u16)
                        .ok_or_else(|| p.invalid("levels", text, EXPECT_LEVELS))?,
                };
                Self::Qsgd {
                    levels,
                    bucket: p.bucket()?.unwrap_or(DEFAULT_QSGD_BUCKET),
                }
            }
            "int8" => Self::Int8 {
                bucket: p.bucket()?.unwrap_or(DEFAULT_INT8_BUCKET),
            },
            "sign" => Self::Sign {
                bucket: p.bucket()?,
            },
            "terngrad" => Self::TernGrad {
                bucket: p.bucket()?,
            },
            "natural" => Self::Natural,
            "fp16" => Self::Fp16,
            "bf16" => Self::Bf16,
            "sparseloco" => Self::SparseLoco {
                ratio: p.ratio(1.0 / 64.0)?,
                chunk: match p.value("chunk")? {
                    None => crate::sparseloco::DEFAULT_CHUNK,
                    Some(text) => text
                        .parse::<usize>()
                        .ok()
                        .filter(|c| (1..=crate::sparseloco::MAX_CHUNK).contains(c))
                        .ok_or_else(|| p.invalid("chunk", text, EXPECT_CHUNK))?,
                },
                decay: match p.value("decay")? {
                    None => crate::sparseloco::DEFAULT_DECAY,
                    Some(text) => text
                        .parse::<f32>()
                        .ok()
                        .filter(|b| (0.0..=1.0).contains(b))
                        .ok_or_else(|| p.invalid("decay", text, EXPECT_DECAY))?,
                },
                layerwise: p.flag("layerwise")?,
            },
            _ => {
                let default = DgcConfig::default();
                let ratio = p.ratio(default.ratio)?;
                let momentum = match p.value("momentum")? {
                    None => default.momentum,
                    Some(text) => text
                        .parse::<f32>()
                        .ok()
                        .filter(|&m| valid_momentum(m))
                        .ok_or_else(|| p.invalid("momentum", text, EXPECT_MOMENTUM))?,
                };
                let warmup_epochs = match p.value("warmup")? {
                    None => default.warmup_epochs,
                    Some(text) => text
                        .parse::<usize>()
                        .map_err(|_| p.invalid("warmup", text, EXPECT_WARMUP))?,
                };
                Self::Dgc(DgcConfig {
                    ratio,
                    momentum,
                    warmup_epochs,
                    approximate: !p.flag("exact")?,
                })
            }
        };
        p.finish()?;
        Ok(spec)
    }
}

impl FromStr for CompressorSpec {
    type Err = SpecError;

    /// Parses the text form (see the module docs); surrounding whitespace is ignored.
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let s = s.trim();
        match s.strip_prefix("ef+") {
            None => Self::parse_operator(s),
            Some(rest) if rest.starts_with("ef+") => {
                Err(SpecError::NestedErrorFeedback { spec: s.to_owned() })
            }
            Some(rest) => match Self::parse_operator(rest)? {
                Self::Dgc(_) => Err(SpecError::ErrorFeedbackOnDgc),
                inner => {
                    inner.check_contraction()?;
                    Ok(Self::ErrorFeedback(Box::new(inner)))
                }
            },
        }
    }
}

impl fmt::Display for CompressorSpec {
    /// The canonical text form, defaults written out: `topk:0.01`, `randk:0.01,unscaled`,
    /// `qsgd:15,bucket=512`, `sign`, `ef+sign,bucket=512`,
    /// `dgc:0.001,momentum=0.9,warmup=4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        match self {
            Self::Identity | Self::Natural | Self::Fp16 | Self::Bf16 => f.write_str(name),
            Self::TopK { ratio, layerwise } | Self::ApproxTopK { ratio, layerwise } => {
                write!(f, "{name}:{ratio}")?;
                if *layerwise {
                    f.write_str(",layerwise")?;
                }
                Ok(())
            }
            Self::RandK { ratio, scaled } => {
                write!(f, "{name}:{ratio}")?;
                if !*scaled {
                    f.write_str(",unscaled")?;
                }
                Ok(())
            }
            Self::Qsgd { levels, bucket } => write!(f, "{name}:{levels},bucket={bucket}"),
            Self::Int8 { bucket } => write!(f, "{name},bucket={bucket}"),
            Self::Sign { bucket } | Self::TernGrad { bucket } => {
                f.write_str(name)?;
                if let Some(b) = bucket {
                    write!(f, ",bucket={b}")?;
                }
                Ok(())
            }
            Self::SparseLoco {
                ratio,
                chunk,
                decay,
                layerwise,
            } => {
                write!(f, "{name}:{ratio},chunk={chunk},decay={decay}")?;
                if *layerwise {
                    f.write_str(",layerwise")?;
                }
                Ok(())
            }
            Self::ErrorFeedback(inner) => write!(f, "ef+{inner}"),
            Self::Dgc(cfg) => {
                write!(
                    f,
                    "{name}:{},momentum={},warmup={}",
                    cfg.ratio, cfg.momentum, cfg.warmup_epochs
                )?;
                if !cfg.approximate {
                    f.write_str(",exact")?;
                }
                Ok(())
            }
        }
    }
}

impl TryFrom<String> for CompressorSpec {
    type Error = SpecError;

    fn try_from(s: String) -> Result<Self, SpecError> {
        s.parse()
    }
}

impl From<CompressorSpec> for String {
    fn from(spec: CompressorSpec) -> String {
        spec.to_string()
    }
}
