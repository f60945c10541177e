//! The compressor spec's text form: parsing, canonical display, serde, errors and build.

use murmur_compress::{CompressorSpec, DgcConfig, OperatorId, SpecError};
use proptest::prelude::*;
use serde::de::value::{Error as ValueError, StrDeserializer};
use serde::de::IntoDeserializer;
use serde::Deserialize;

fn parse(s: &str) -> CompressorSpec {
    s.parse()
        .unwrap_or_else(|e| panic!("'{s}' should parse: {e}"))
}

fn error(s: &str) -> String {
    match s.parse::<CompressorSpec>() {
        Ok(spec) => panic!("'{s}' should be refused, parsed as {spec:?}"),
        Err(e) => e.to_string(),
    }
}

/// Every example of the grammar, with its canonical form.
const EXAMPLES: [(&str, &str); 30] = [
    ("identity", "identity"),
    ("topk", "topk:0.01"),
    ("topk:0.01", "topk:0.01"),
    ("topk:0.01,layerwise", "topk:0.01,layerwise"),
    ("approx-topk:0.05,layerwise", "approx-topk:0.05,layerwise"),
    ("approx-topk:0.01", "approx-topk:0.01"),
    ("approx-topk", "approx-topk:0.01"),
    ("randk:0.01", "randk:0.01"),
    ("randk:0.01,unscaled", "randk:0.01,unscaled"),
    ("qsgd", "qsgd:15,bucket=512"),
    ("qsgd:4,bucket=128", "qsgd:4,bucket=128"),
    ("int8", "int8,bucket=128"),
    ("int8,bucket=512", "int8,bucket=512"),
    ("ef+int8", "ef+int8,bucket=128"),
    ("sign", "sign"),
    ("sign,bucket=512", "sign,bucket=512"),
    ("terngrad", "terngrad"),
    ("terngrad,bucket=64", "terngrad,bucket=64"),
    ("natural", "natural"),
    ("fp16", "fp16"),
    ("bf16", "bf16"),
    ("sparseloco", "sparseloco:0.015625,chunk=4096,decay=0.95"),
    (
        "sparseloco:0.02,chunk=1024",
        "sparseloco:0.02,chunk=1024,decay=0.95",
    ),
    (
        "sparseloco:0.03,decay=0",
        "sparseloco:0.03,chunk=4096,decay=0",
    ),
    (
        "sparseloco:0.1,layerwise",
        "sparseloco:0.1,chunk=4096,decay=0.95,layerwise",
    ),
    ("ef+topk:0.01", "ef+topk:0.01"),
    ("ef+sign", "ef+sign"),
    ("dgc", "dgc:0.001,momentum=0.9,warmup=4"),
    (
        "dgc:0.001,momentum=0.9,warmup=4,exact",
        "dgc:0.001,momentum=0.9,warmup=4,exact",
    ),
    (" topk:1e-3 ", "topk:0.001"),
];

#[test]
fn examples_round_trip_through_the_canonical_form() {
    for (text, canonical) in EXAMPLES {
        let spec = parse(text);
        assert_eq!(spec.to_string(), canonical, "display of '{text}'");
        assert_eq!(parse(canonical), spec, "parse of '{canonical}'");
        assert_eq!(String::from(spec.clone()), canonical);
        assert_eq!(CompressorSpec::try_from(canonical.to_owned()), Ok(spec));
    }
}

#[test]
fn examples_parse_to_the_documented_values() {
    assert_eq!(parse("identity"), CompressorSpec::Identity);
    assert_eq!(
        parse("topk"),
        CompressorSpec::TopK {
            ratio: 0.01,
            layerwise: false
        }
    );
    assert_eq!(
        parse("topk:0.05,layerwise"),
        CompressorSpec::TopK {
            ratio: 0.05,
            layerwise: true
        }
    );
    assert_eq!(
        parse("randk:0.01"),
        CompressorSpec::RandK {
            ratio: 0.01,
            scaled: true
        }
    );
    assert_eq!(
        parse("randk:0.01,unscaled"),
        CompressorSpec::RandK {
            ratio: 0.01,
            scaled: false
        }
    );
    assert_eq!(
        parse("qsgd"),
        CompressorSpec::Qsgd {
            levels: 15,
            bucket: 512
        }
    );
    assert_eq!(
        parse("qsgd:4,bucket=128"),
        CompressorSpec::Qsgd {
            levels: 4,
            bucket: 128
        }
    );
    assert_eq!(
        parse("qsgd:65535"),
        CompressorSpec::Qsgd {
            levels: 65535,
            bucket: 512
        }
    );
    assert_eq!(parse("sign"), CompressorSpec::Sign { bucket: None });
    assert_eq!(
        parse("sign,bucket=512"),
        CompressorSpec::Sign { bucket: Some(512) }
    );
    assert_eq!(parse("terngrad"), CompressorSpec::TernGrad { bucket: None });
    assert_eq!(
        parse("ef+sign"),
        CompressorSpec::ErrorFeedback(Box::new(CompressorSpec::Sign { bucket: None }))
    );
    assert_eq!(parse("dgc"), CompressorSpec::Dgc(DgcConfig::default()));
    assert_eq!(
        parse("dgc:0.01,warmup=0,momentum=0.5,exact"),
        CompressorSpec::Dgc(DgcConfig {
            ratio: 0.01,
            momentum: 0.5,
            warmup_epochs: 0,
            approximate: false
        })
    );
}

#[test]
fn serde_reads_and_writes_the_text_form() {
    let de: StrDeserializer<ValueError> = "ef+qsgd:255".into_deserializer();
    let spec = CompressorSpec::deserialize(de).unwrap();
    assert_eq!(
        spec,
        CompressorSpec::ErrorFeedback(Box::new(CompressorSpec::Qsgd {
            levels: 255,
            bucket: 512
        }))
    );
    // `into = "String"`: serialising writes the canonical form.
    assert_eq!(String::from(spec), "ef+qsgd:255,bucket=512");
    let de: StrDeserializer<ValueError> = "topc".into_deserializer();
    let e = CompressorSpec::deserialize(de).unwrap_err().to_string();
    assert!(e.contains("unknown compressor 'topc'"), "{e}");
}

#[test]
fn bad_specs_are_refused_with_a_clear_message() {
    let cases: &[(&str, &[&str])] = &[
        (
            "",
            &["empty compressor spec", "identity, topk, approx-topk"],
        ),
        ("   ", &["empty compressor spec"]),
        (
            "sparseloco:0.02,chunk=0",
            &["sparseloco", "chunk", "an integer from 1 to 65536"],
        ),
        (
            "sparseloco,chunk=70000",
            &["sparseloco", "chunk", "an integer from 1 to 65536"],
        ),
        (
            "sparseloco,decay=1.5",
            &["sparseloco", "decay", "a number in [0, 1]"],
        ),
        (
            "sparseloco,decay=NaN",
            &["sparseloco", "decay", "a number in [0, 1]"],
        ),
        (
            "topc",
            &[
                "unknown compressor 'topc'",
                "expected one of identity, topk, approx-topk, randk, qsgd, int8, sign, \
                 terngrad, natural, fp16, bf16, dgc",
                "ef+",
            ],
        ),
        ("ef", &["unknown compressor 'ef'"]),
        ("ef+", &["empty compressor spec"]),
        ("TopK:0.01", &["unknown compressor 'TopK'"]),
        (
            "topk:0",
            &["invalid ratio '0' for topk: expected a number in (0, 1]"],
        ),
        ("topk:1.5", &["invalid ratio '1.5' for topk", "(0, 1]"]),
        ("topk:-0.1", &["invalid ratio '-0.1' for topk"]),
        ("topk:abc", &["invalid ratio 'abc' for topk"]),
        ("topk:NaN", &["invalid ratio 'NaN' for topk"]),
        ("topk:inf", &["invalid ratio 'inf' for topk"]),
        ("topk:", &["invalid ratio '' for topk"]),
        ("approx-topk:2", &["invalid ratio '2' for approx-topk"]),
        ("randk:0", &["invalid ratio '0' for randk"]),
        ("dgc:1.01", &["invalid ratio '1.01' for dgc"]),
        (
            "qsgd:0",
            &["invalid levels '0' for qsgd: expected an integer from 1 to 65535"],
        ),
        ("qsgd:65536", &["invalid levels '65536' for qsgd"]),
        ("qsgd:70000", &["invalid levels '70000' for qsgd"]),
        ("qsgd:4.5", &["invalid levels '4.5' for qsgd"]),
        (
            "qsgd:4,bucket=0",
            &["invalid bucket '0' for qsgd", "from 1 to 4294967295"],
        ),
        ("sign,bucket=0", &["invalid bucket '0' for sign"]),
        ("terngrad,bucket=-3", &["invalid bucket '-3' for terngrad"]),
        (
            "sign,bucket=4294967296",
            &["invalid bucket '4294967296' for sign"],
        ),
        (
            "topk:0.01,foo=1",
            &[
                "unknown key 'foo' for topk",
                "valid keys: layerwise",
                "usage: topk[:RATIO][,layerwise]",
            ],
        ),
        (
            "topk,ratio=0.01",
            &["unknown key 'ratio' for topk", "topk[:RATIO]"],
        ),
        (
            "identity,bucket=4",
            &["unknown key 'bucket' for identity", "valid keys: none"],
        ),
        (
            "randk:0.1,scaled",
            &["unknown key 'scaled' for randk", "valid keys: unscaled"],
        ),
        (
            "sign,levels=3",
            &["unknown key 'levels' for sign", "valid keys: bucket"],
        ),
        (
            "dgc,nesterov",
            &[
                "unknown key 'nesterov' for dgc",
                "valid keys: momentum, warmup, exact",
            ],
        ),
        (
            "qsgd:4,bucket=128,bucket=64",
            &["duplicate key 'bucket' for qsgd"],
        ),
        (
            "topk:0.01,layerwise,layerwise",
            &["duplicate key 'layerwise' for topk"],
        ),
        (
            "dgc,momentum=0.9,momentum=0.5",
            &["duplicate key 'momentum' for dgc"],
        ),
        ("topk:0.01,", &["empty parameter in 'topk:0.01,'"]),
        ("qsgd:4,,bucket=1", &["empty parameter"]),
        (
            "identity:3",
            &["identity takes no positional parameter, got 'identity:3'"],
        ),
        (
            "sign:512",
            &[
                "sign takes no positional parameter",
                "usage: sign[,bucket=N]",
            ],
        ),
        (
            "topk:0.01,layerwise=true",
            &["'layerwise' is a flag of topk and takes no value, got 'layerwise=true'"],
        ),
        ("dgc,exact=1", &["'exact' is a flag of dgc"]),
        (
            "sign,bucket",
            &["key 'bucket' of sign needs a value, as in bucket=…"],
        ),
        ("dgc,momentum", &["key 'momentum' of dgc needs a value"]),
        (
            "dgc,momentum=1",
            &["invalid momentum '1' for dgc: expected a number in [0, 1)"],
        ),
        ("dgc,momentum=-0.5", &["invalid momentum '-0.5' for dgc"]),
        (
            "dgc,warmup=-1",
            &["invalid warmup '-1' for dgc: expected a non-negative integer"],
        ),
        (
            "ef+ef+topk:0.01",
            &["error feedback cannot be nested, got 'ef+ef+topk:0.01'"],
        ),
        (
            "ef+dgc",
            &["ef+dgc is not allowed", "dgc already accumulates"],
        ),
        ("ef+dgc:0.01,exact", &["ef+dgc is not allowed"]),
        ("ef+topc", &["unknown compressor 'topc'"]),
    ];
    for (text, needles) in cases {
        let message = error(text);
        for needle in *needles {
            assert!(
                message.contains(needle),
                "'{text}': message {message:?} should contain {needle:?}"
            );
        }
    }
}

#[test]
fn errors_are_typed() {
    assert_eq!(
        "topc".parse::<CompressorSpec>(),
        Err(SpecError::UnknownCompressor {
            name: "topc".into()
        })
    );
    assert_eq!(
        "ef+dgc".parse::<CompressorSpec>(),
        Err(SpecError::ErrorFeedbackOnDgc)
    );
    assert!(matches!(
        "qsgd:4,bucket=1,bucket=2".parse::<CompressorSpec>(),
        Err(SpecError::DuplicateKey { operator: "qsgd", ref key }) if key == "bucket"
    ));
}

#[test]
fn build_gives_the_right_operator() {
    let layers = [3usize, 5, 2];
    let cases = [
        ("identity", OperatorId::Identity),
        ("topk:0.1", OperatorId::TopK),
        ("topk:0.1,layerwise", OperatorId::TopK),
        ("approx-topk:0.1", OperatorId::ApproxTopK),
        ("randk:0.1", OperatorId::RandK),
        ("randk:0.1,unscaled", OperatorId::RandK),
        ("fp16", OperatorId::Fp16),
        ("bf16", OperatorId::Bf16),
        ("sparseloco:0.02", OperatorId::SparseLoco),
        ("ef+topk:0.01", OperatorId::TopK),
        ("ef+randk:0.5,unscaled", OperatorId::RandK),
        ("ef+fp16", OperatorId::Fp16),
        ("ef+identity", OperatorId::Identity),
        ("dgc", OperatorId::ApproxTopK),
        ("dgc:0.01,exact", OperatorId::TopK),
    ];
    for (text, id) in cases {
        let spec = parse(text);
        let op = spec.build(Some(&layers)).unwrap();
        assert_eq!(op.id(), id, "{text}");
        assert_eq!(op.unbiased(), spec.unbiased(), "{text}");
    }
    // Layer-wise top-k selects per tensor: ⌈0.1·3⌉ + ⌈0.1·5⌉ + ⌈0.1·2⌉ = 3 of d = 10.
    let op = parse("topk:0.1,layerwise").build(Some(&layers)).unwrap();
    assert_eq!(op.max_encoded_len(10), 12 + 8 + 3 * 8);
    // The quantisers build (their behaviour is tested in their own module).
    for text in [
        "qsgd",
        "qsgd:4,bucket=128",
        "sign",
        "sign,bucket=512",
        "terngrad",
        "terngrad,bucket=7",
        "natural",
        "ef+sign",
        "ef+qsgd:255",
    ] {
        assert!(parse(text).build(None).is_ok(), "{text}");
    }
}

#[test]
fn layerwise_top_k_needs_the_layers() {
    for text in [
        "topk:0.01,layerwise",
        "ef+topk:0.01,layerwise",
        "approx-topk:0.1,layerwise",
        "sparseloco:0.1,layerwise",
    ] {
        let e = parse(text).build(None).err().expect("refused");
        assert_eq!(e, SpecError::LayersRequired);
        assert!(e.to_string().contains("needs the model's tensor lengths"));
    }
    // Layers are ignored by the other operators.
    assert!(parse("topk:0.01").build(None).is_ok());
}

#[test]
fn specs_made_in_code_are_checked_before_building() {
    let bad = [
        CompressorSpec::TopK {
            ratio: 2.0,
            layerwise: false,
        },
        CompressorSpec::RandK {
            ratio: 0.0,
            scaled: true,
        },
        CompressorSpec::Qsgd {
            levels: 0,
            bucket: 4,
        },
        CompressorSpec::Qsgd {
            levels: 4,
            bucket: 0,
        },
        CompressorSpec::Sign { bucket: Some(0) },
        CompressorSpec::Dgc(DgcConfig {
            momentum: 1.5,
            ..DgcConfig::default()
        }),
        CompressorSpec::ErrorFeedback(Box::new(CompressorSpec::ErrorFeedback(Box::new(
            CompressorSpec::Identity,
        )))),
        CompressorSpec::ErrorFeedback(Box::new(CompressorSpec::Dgc(DgcConfig::default()))),
        CompressorSpec::ErrorFeedback(Box::new(CompressorSpec::ApproxTopK {
            ratio: f64::NAN,
            layerwise: false,
        })),
    ];
    for spec in bad {
        assert!(spec.validate().is_err(), "{spec:?}");
        assert!(spec.build(None).is_err(), "{spec:?}");
    }
}

#[test]
fn names_and_bias() {
    let cases = [
        ("identity", "identity", true),
        ("topk", "topk", false),
        ("approx-topk", "approx-topk", false),
        ("randk", "randk", true),
        ("randk:0.1,unscaled", "randk", false),
        ("qsgd", "qsgd", true),
        ("sign", "sign", false),
        ("terngrad", "terngrad", true),
        ("natural", "natural", true),
        ("fp16", "fp16", false),
        ("bf16", "bf16", false),
        ("sparseloco", "sparseloco", false),
        ("ef+identity", "ef", false),
        ("dgc", "dgc", false),
    ];
    for (text, name, unbiased) in cases {
        let spec = parse(text);
        assert_eq!(spec.name(), name, "{text}");
        assert_eq!(spec.unbiased(), unbiased, "{text}");
    }
}

/// Ratios in (0, 1], including the ends of the range and numbers with long expansions.
fn ratio() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(1.0),
        Just(f64::MIN_POSITIVE),
        Just(1e-300),
        1e-9f64..=1.0,
        (1u32..=1_000_000).prop_map(|n| n as f64 / 1_000_000.0),
    ]
}

fn bucket() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=4096, Just(u32::MAX as usize)]
}

/// Every spec but error feedback.
fn plain_spec() -> impl Strategy<Value = CompressorSpec> {
    prop_oneof![
        Just(CompressorSpec::Identity),
        (ratio(), any::<bool>())
            .prop_map(|(ratio, layerwise)| CompressorSpec::TopK { ratio, layerwise }),
        (ratio(), any::<bool>())
            .prop_map(|(ratio, layerwise)| CompressorSpec::ApproxTopK { ratio, layerwise }),
        (ratio(), any::<bool>())
            .prop_map(|(ratio, scaled)| CompressorSpec::RandK { ratio, scaled }),
        (1u16..=u16::MAX, bucket())
            .prop_map(|(levels, bucket)| CompressorSpec::Qsgd { levels, bucket }),
        proptest::option::of(bucket()).prop_map(|bucket| CompressorSpec::Sign { bucket }),
        proptest::option::of(bucket()).prop_map(|bucket| CompressorSpec::TernGrad { bucket }),
        Just(CompressorSpec::Natural),
        Just(CompressorSpec::Fp16),
        Just(CompressorSpec::Bf16),
        (
            ratio(),
            1usize..=65536,
            prop_oneof![Just(0.0f32), Just(1.0f32), 0f32..=1.0]
        )
            .prop_map(|(ratio, chunk, decay)| CompressorSpec::SparseLoco {
                ratio,
                chunk,
                decay,
                layerwise: chunk % 2 == 0,
            }),
        (
            ratio(),
            prop_oneof![Just(0.0f32), 0f32..1.0],
            any::<usize>(),
            any::<bool>()
        )
            .prop_map(|(ratio, momentum, warmup_epochs, approximate)| {
                CompressorSpec::Dgc(DgcConfig {
                    ratio,
                    momentum,
                    warmup_epochs,
                    approximate,
                })
            }),
    ]
}

/// Whether `ef+` accepts the operator: not DGC, and a contraction (see the next test).
fn ef_accepts(spec: &CompressorSpec) -> bool {
    match spec {
        CompressorSpec::Dgc(_) | CompressorSpec::TernGrad { .. } => false,
        CompressorSpec::RandK { ratio, scaled } => !*scaled || *ratio > 0.5,
        CompressorSpec::Qsgd { levels, bucket } => {
            let (b, s) = (*bucket as f64, *levels as f64);
            (b / (s * s)).min(b.sqrt() / s) < 1.0
        }
        _ => true,
    }
}

fn spec() -> impl Strategy<Value = CompressorSpec> {
    (plain_spec(), any::<bool>()).prop_map(|(spec, ef)| {
        if ef && ef_accepts(&spec) {
            CompressorSpec::ErrorFeedback(Box::new(spec))
        } else {
            spec
        }
    })
}

#[test]
fn error_feedback_refuses_operators_that_are_not_contractions() {
    for (text, hint) in [
        ("ef+randk:0.01", "unscaled"),
        ("ef+terngrad", "sign"),
        ("ef+qsgd", "more levels"),
    ] {
        let e = text.parse::<CompressorSpec>().unwrap_err();
        assert!(
            matches!(e, SpecError::ErrorFeedbackNeedsContraction { .. }),
            "{text}: {e}"
        );
        assert!(e.to_string().contains(hint), "{text}: {e}");
    }
    // The same rule for specs made in code.
    let scaled = CompressorSpec::ErrorFeedback(Box::new(CompressorSpec::RandK {
        ratio: 0.01,
        scaled: true,
    }));
    assert!(scaled.build(None).is_err());
    for ok in [
        "ef+randk:0.01,unscaled",
        "ef+qsgd:255",
        "ef+sign",
        "ef+topk:0.01",
        "ef+natural",
    ] {
        assert!(ok.parse::<CompressorSpec>().is_ok(), "{ok}");
    }
}

proptest! {
    #[test]
    fn display_then_parse_gives_the_spec_back(spec in spec()) {
        prop_assert_eq!(spec.validate(), Ok(()));
        let text = spec.to_string();
        let back: CompressorSpec = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(&back, &spec);
        prop_assert_eq!(back.to_string(), text.clone());
        let de: StrDeserializer<ValueError> = text.as_str().into_deserializer();
        prop_assert_eq!(CompressorSpec::deserialize(de).unwrap(), spec);
    }

    /// Any text either parses to a spec whose canonical form parses back to it, or is
    /// refused with an error; it never panics.
    #[test]
    fn arbitrary_text_parses_or_is_refused(text in "(ef\\+){0,2}[a-z16-]{0,12}(:[0-9.e-]{0,6})?(,[a-z]{0,9}(=[0-9.]{0,5})?){0,3}") {
        if let Ok(spec) = text.parse::<CompressorSpec>() {
            prop_assert_eq!(parse(&spec.to_string()), spec);
        }
    }
}
