use super::*;
use clap::Parser;
use murmur_topology::PushSchedule;

/// The options of `murmur simulate`, a superset of `launch`'s.
#[derive(Parser)]
#[command(args_override_self = true)]
struct Run {
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    _sim: crate::tools::simulate::SimArgs,
}

fn parse(args: &[&str]) -> anyhow::Result<RunArgs> {
    let args = expand_config_args(args.iter().map(Into::into).collect())?;
    // `Run` has no subcommand: drop the one the expansion skipped over.
    let args: Vec<_> = args
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, a)| a)
        .collect();
    let run = Run::try_parse_from(args)?.run;
    run.validate()?;
    Ok(run)
}

#[test]
fn the_run_written_as_a_config_reads_back_as_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let runs: [&[&str]; 7] = [
        &["murmur", "launch"],
        &[
            "murmur",
            "launch",
            "--peers=6",
            "--algorithm=choco",
            "--compressor=ef+topk:0.05",
            "--gamma=0.3",
            "--link-bandwidth=100Mbit",
            "--link-latency=2ms",
            "--straggler-policy=skip",
            "--straggler-deadline-ms=40",
            "--slow-peer=2:5",
            "--no-overlap",
            "--data=/tmp/mnist",
            "--lr=0.013",
            "--seed=7",
            "--partition=dirichlet:0.5",
            "--init=independent",
            "--rounds-per-epoch=9",
        ],
        &[
            "murmur",
            "launch",
            "--phases=allreduce:2,local-sgd",
            "--local-steps=3",
            "--topology=torus:rows=2,cols=4",
            "--model=cnn",
        ],
        &[
            "murmur",
            "launch",
            "--model=transformer:context=32,layers=3",
            "--optimizer=adamw",
        ],
        &[
            "murmur",
            "launch",
            "--straggler-policy=skip",
            "--straggler-deadline-ms=auto",
        ],
        // --robust does not combine with skipping (refused before any peer starts).
        &["murmur", "launch", "--robust=clip:auto:2"],
        &[
            "murmur",
            "launch",
            "--algorithm=streaming-diloco",
            "--local-steps=8",
            "--fragments=2",
            "--tau=3",
            "--merge-alpha=0.25",
            "--compressor=int8",
        ],
    ];
    for argv in runs {
        let run = parse(argv).unwrap();
        let file = dir.path().join("run.toml");
        let text = run.to_toml().unwrap();
        if argv.contains(&"--lr=0.013") {
            assert!(text.contains("\nlr = 0.013\n"), "f32 written short: {text}");
        }
        std::fs::write(&file, text).unwrap();
        let back = parse(&["murmur", "launch", "--config", file.to_str().unwrap()]).unwrap();
        let back = RunArgs {
            config: None,
            ..back
        };
        assert_eq!(format!("{back:?}"), format!("{run:?}"), "{argv:?}");
    }
}

#[test]
fn a_run_config_sets_options_and_the_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("run.toml");
    std::fs::write(
        &f,
        "algorithm = \"choco\"\ncompressor = \"bf16\"\npeers = 6\nlr = 0.02\nno_overlap = true\n\
         local-steps = 2\nphases = \"allreduce:1,local-sgd\"\n",
    )
    .unwrap();
    let f = f.to_str().unwrap();
    let run = parse(&["murmur", "launch", "--config", f, "--peers", "4"]).unwrap();
    assert_eq!(run.peers, 4, "the command line overrides the file");
    assert_eq!(run.train.lr, 0.02);
    assert!(run.gossip.no_overlap);
    assert_eq!(run.local_steps(), 2);
    assert_eq!(run.algorithm_name(), "allreduce:1,local-sgd");
    assert_eq!(run.compressor().to_string(), "bf16");
    // Without --config nothing changes.
    let plain = parse(&["murmur", "launch", "--peers=3"]).unwrap();
    assert_eq!(plain.peers, 3);
}

#[test]
fn bad_run_configs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cases = [
        (write("syntax.toml", "peers = \n"), "run config"),
        (
            write("table.toml", "[net]\npeers = 3\n"),
            "must be a string",
        ),
        (write("unknown.toml", "pears = 3\n"), "--pears"),
        (write("value.toml", "peers = \"many\"\n"), "many"),
    ];
    for (file, expect) in &cases {
        let err = match parse(&["murmur", "launch", "--config", file]) {
            Ok(_) => panic!("{file} was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(expect), "{file}: {err}");
    }
    // What the algorithms ask of a run is checked before any peer starts (the registry's
    // check_run): --robust with skipping, a compressor where none applies.
    for (argv, expect) in [
        (
            &[
                "murmur",
                "launch",
                "--straggler-policy=skip",
                "--straggler-deadline-ms=5",
                "--robust=clip",
            ][..],
            "--robust",
        ),
        (
            &[
                "murmur",
                "launch",
                "--algorithm=local-auto",
                "--compressor=topk:0.1",
            ][..],
            "sends raw f32",
        ),
        (
            &["murmur", "launch", "--part-mb=2", "--compressor=int8"][..],
            "--part-mb streams messages of the identity compressor",
        ),
        (
            &["murmur", "launch", "--part-mb=-1"][..],
            "must be a size in MB",
        ),
        (
            &["murmur", "launch", "--algorithm=choco", "--part-mb=2"][..],
            "--part-mb",
        ),
    ] {
        let err = format!("{:#}", parse(argv).unwrap_err());
        assert!(err.contains(expect), "{argv:?}: {err}");
    }
    let missing = parse(&["murmur", "launch", "--config", "/nonexistent/run.toml"]);
    assert!(format!("{:#}", missing.unwrap_err()).contains("cannot read run config"));
    let f = write("ok.toml", "peers = 3\n");
    let twice = parse(&["murmur", "launch", "--config", &f, "--config", &f]);
    assert!(format!("{:#}", twice.unwrap_err()).contains("one run config at a time"));
}

#[test]
fn the_one_peer_exponential_schedule_comes_by_name_or_by_file() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../experiments/topologies/one-peer-exponential16.toml");
    let file = file.to_str().unwrap();
    let want = PushSchedule::one_peer_exponential(16).unwrap();
    for topology in [ONE_PEER_EXPONENTIAL, file] {
        let run = parse(&[
            "murmur",
            "launch",
            "--algorithm=sgp",
            "--peers=16",
            "--topology",
            topology,
        ])
        .unwrap();
        let topo = run.topology().unwrap();
        assert_eq!(topo.push_schedule().unwrap(), want, "{topology}");
        // A static algorithm needs one W: refused by name and by file.
        let bad = parse(&[
            "murmur",
            "launch",
            "--algorithm=dpsgd",
            "--peers=16",
            "--topology",
            topology,
        ]);
        let err = bad.and_then(|r| r.topology().map(|_| ())).unwrap_err();
        assert!(
            format!("{err:#}").contains("time-varying"),
            "{topology}: {err:#}"
        );
    }
    // A static graph stays static for SGP.
    let run = parse(&[
        "murmur",
        "launch",
        "--algorithm=sgp",
        "--peers=8",
        "--topology=ring",
    ])
    .unwrap();
    let topo = run.topology().unwrap();
    assert_eq!(
        topo.push_schedule().unwrap(),
        PushSchedule::fixed(topo.w.graph()).unwrap()
    );
}

#[test]
fn the_shipped_run_configs_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/runs");
    let mut n = 0;
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .chain(std::fs::read_dir(dir.join("convergence")).unwrap())
        .chain(std::fs::read_dir(dir.join("consensus")).unwrap());
    for entry in files {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let p = path.to_str().unwrap();
            let run = parse(&["murmur", "launch", "--config", p])
                .unwrap_or_else(|e| panic!("{p}: {e:#}"));
            run.topology().unwrap_or_else(|e| panic!("{p}: {e:#}"));
            n += 1;
        }
    }
    assert!(
        n >= 24,
        "expected the run configs of experiments/runs, runs/convergence and runs/consensus, found {n}"
    );
}

#[test]
fn token_models_refuse_label_splits() {
    let parse_line = |line: &str| parse(&line.split(' ').collect::<Vec<_>>());
    let run = parse_line("murmur launch --model resnet20").unwrap();
    assert_eq!(run.train.model, ModelKind::RESNET20);
    parse_line("murmur launch --model resnet20 --partition dirichlet:0.5").unwrap();
    parse_line("murmur launch --model transformer").unwrap();
    let err = format!(
        "{:#}",
        parse_line("murmur launch --model transformer --partition dirichlet").unwrap_err()
    );
    assert!(err.contains("class labels"), "{err}");
    // resnet20 takes --data (CIFAR-10); what the folder holds is checked when it is read.
    parse_line("murmur launch --model resnet20 --data /cifar").unwrap();
}

#[test]
fn a_biased_pseudo_gradient_with_a_large_outer_step_is_warned_about() {
    let warned_for = |algorithm: &str, extra: &[&str]| -> bool {
        let mut a = vec!["murmur", "simulate", "--algorithm", algorithm];
        a.extend_from_slice(extra);
        parse(&a)
            .unwrap()
            .warnings()
            .iter()
            .any(|w| w.contains("biased compressor"))
    };
    let warned = |extra: &[&str]| warned_for("diloco", extra);
    assert!(warned(&["--compressor", "topk:0.1"]));
    assert!(warned(&["--compressor", "sign"]));
    assert!(!warned(&["--compressor", "topk:0.1", "--outer-lr", "0.3"]));
    assert!(
        !warned(&["--compressor", "qsgd:127,bucket=128"]),
        "QSGD is unbiased"
    );
    assert!(!warned(&["--compressor", "bf16"]), "a cast");
    assert!(!warned(&[]));
    // SparseLoCo's paper takes η_out = 1 with its decayed residual, in both DiLoCo forms.
    assert!(!warned(&["--compressor", "sparseloco:0.3"]));
    let streaming = |c: &str| warned_for("streaming-diloco", &["--compressor", c]);
    assert!(!streaming("sparseloco:0.3"));
    assert!(streaming("topk:0.1"));
    // Every warning is one sentence without a run of spaces from a broken line.
    let adamw = parse(&["murmur", "simulate", "--optimizer", "adamw", "--lr", "0.1"]).unwrap();
    let w = adamw.warnings();
    assert_eq!(w.len(), 1);
    assert!(!w[0].contains("  "), "{}", w[0]);
}

#[test]
fn a_paused_peer_is_waited_for_30_s_or_less_than_a_round_and_never_less_than_the_peer_timeout() {
    let secs = |a: &[&str]| {
        let t = parse(&[&["murmur", "launch"], a].concat())
            .unwrap()
            .timeouts();
        (t.peer.as_secs(), t.paused().as_secs())
    };
    assert_eq!(secs(&[]), (5, 30));
    // Not given: one second less than a shorter round timeout.
    assert_eq!(secs(&["--round-timeout-secs=20"]), (5, 19));
    // Never less than the peer timeout.
    assert_eq!(
        secs(&["--peer-timeout-secs=120", "--round-timeout-secs=300"]),
        (120, 120)
    );
    assert_eq!(secs(&["--paused-timeout-secs=45"]), (5, 45));
    assert_eq!(secs(&["--paused-timeout-secs=2"]), (5, 5));
    // Given: it must stay below the round timeout, or a waiting round fails first.
    let e = parse(&["murmur", "launch", "--paused-timeout-secs=60"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("--round-timeout-secs (60) must exceed --paused-timeout-secs (60)"),
        "{e}"
    );
}
