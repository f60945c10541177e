//! `murmur`: decentralized (gossip) deep-learning training, one process per peer.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use murmur::config::{load_topology, RunArgs};
use murmur::launch::LaunchArgs;
use murmur::peer::PeerArgs;
use murmur::tools::bench::BenchArgs;
use murmur::tools::simulate::SimArgs;

#[derive(Parser)]
#[command(
    name = "murmur",
    version,
    about = "Peer-to-peer decentralized (gossip) deep-learning training",
    // A run config (`--config FILE`) is expanded into options placed before the command
    // line's, which then override them.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start n peers on this machine (one process each, QUIC on 127.0.0.1) and follow the run.
    Launch {
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        launch: LaunchArgs,
    },
    /// Run one peer: what each host of a cluster runs.
    Peer {
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        peer: PeerArgs,
    },
    /// Run n virtual peers in this process on a simulated network and clock
    /// (deterministic for a seed): training (default) or average consensus.
    Simulate {
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        sim: SimArgs,
    },
    /// Measure one peer's local work for a model and batch size: samples/s of the training
    /// step, the flatten + mix + unflatten time of a round, the message size and the
    /// communication-to-computation ratio at 1, 10 and 100 Gb/s (synthetic data).
    Bench(BenchArgs),
    /// Measure the data plane between two endpoints on this machine (throughput and
    /// one-way delay), with or without link emulation.
    Netbench {
        #[command(flatten)]
        args: murmur::tools::netbench::NetBenchArgs,
    },
    /// Draw the charts of one or several run folders (accuracy or bits per byte, loss,
    /// consensus distance, bytes, time), several runs on shared axes.
    Plot(murmur::tools::plot::PlotArgs),
    /// Tokenize a text with GPT-2's byte-pair encoding into a token file (llm.c /
    /// modded-nanogpt .bin) for `--model transformer:vocab=50257 --data FILE.bin`.
    Tokenize(murmur::tools::tokenize::TokenizeArgs),
    /// Print the PeerId of a peer's key file, making the key pair if the file does not
    /// exist (`<run>/identity/peer-<rank>.key` is where a peer looks by default): the lines
    /// of an allow-list (`--allow-peers`).
    Identity {
        /// The key file.
        file: std::path::PathBuf,
    },
    /// Topology tools.
    Topology {
        #[command(subcommand)]
        command: TopologyCmd,
    },
}

#[derive(Subcommand)]
enum TopologyCmd {
    /// Print n, degrees, stochasticity checks, |λ₂(W)| and the spectral gap of a topology.
    Inspect {
        /// A topology name (ring, torus, complete, star, hypercube, exponential, erdos-renyi)
        /// or the path of a TOML topology file.
        topology: String,
        /// Number of peers (required for a name; must match the file if it fixes a count).
        #[arg(long)]
        nodes: Option<usize>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a topology's graph as a graph text that decentralizepy or NetworkX read, and
    /// that murmur reads back as a topology file.
    Export {
        /// A topology name or file, as for `inspect`.
        topology: String,
        /// Number of peers (required for a name; must match the file if it fixes a count).
        #[arg(long)]
        nodes: Option<usize>,
        /// edges: decentralizepy's .edges (the peer count, then every edge in both
        /// directions); adjacency: its adjacency list (the peer count, then line i lists peer
        /// i's neighbours); edgelist: each edge once, `i j` (NetworkX's read_edgelist).
        #[arg(long, default_value = "edges")]
        format: murmur_topology::GraphFormat,
        /// Write to this file instead of standard output.
        #[arg(long, short)]
        out: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let given: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let args = match murmur::config::expand_config_args(given.clone()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(msg) = unknown_config_key(&e, &given) {
                eprintln!("error: {msg}");
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MURMUR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Cmd::Launch { run, launch } => murmur::launch::run(&run, &launch).map(|_| ()),
        Cmd::Peer { run, peer } => murmur::peer::run(&run, &peer),
        Cmd::Simulate { run, sim } => murmur::tools::simulate::run(&run, &sim),
        Cmd::Netbench { args } => murmur::tools::netbench::run(&args),
        Cmd::Bench(bench) => murmur::tools::bench::run(&bench),
        Cmd::Plot(plot) => murmur::tools::plot::run(&plot),
        Cmd::Tokenize(args) => murmur::tools::tokenize::run(&args),
        Cmd::Identity { file } => {
            murmur::control::auth::load_or_create_identity(&file).map(|key| {
                println!("{}", key.public().to_peer_id());
            })
        }
        Cmd::Topology {
            command:
                TopologyCmd::Inspect {
                    topology,
                    nodes,
                    json,
                },
        } => inspect(&topology, nodes, json),
        Cmd::Topology {
            command:
                TopologyCmd::Export {
                    topology,
                    nodes,
                    format,
                    out,
                },
        } => export(&topology, nodes, format, out.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if murmur::control::pause::left_behind(&e) {
                ExitCode::from(murmur::control::pause::DEPARTED_EXIT_CODE)
            } else if let Some(s) = e.downcast_ref::<murmur::launch::Interrupted>() {
                ExitCode::from(s.exit_code())
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The message for an unknown option that came from a run config (`--config FILE`) rather
/// than the command line: clap alone would name the option but not the file.
fn unknown_config_key(e: &clap::Error, given: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split('=').next().unwrap_or(arg);
    let given: Vec<&str> = given.iter().filter_map(|a| a.to_str()).collect();
    if given.iter().any(|a| a.split('=').next() == Some(flag)) {
        return None;
    }
    let file = given
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--config") {
            Some("") => given.get(i + 1).copied(),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        })?;
    let sub = given.get(1).copied().unwrap_or("launch");
    Some(format!(
        "run config {file}: unknown key `{}` (the keys are the long options of `murmur {sub}`, \
         with - or _; see `murmur {sub} --help`)",
        flag.trim_start_matches("--")
    ))
}

fn export(
    topology: &str,
    nodes: Option<usize>,
    format: murmur_topology::GraphFormat,
    out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let topo = load_topology(topology, nodes)?;
    anyhow::ensure!(
        topo.schedule.is_none() && topo.graph.is_symmetric(),
        "{}: only an undirected, static graph can be written as a graph text",
        topo.name
    );
    let text = murmur_topology::TopologySpec::write_graph(&topo.graph, format);
    match out {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

fn inspect(topology: &str, nodes: Option<usize>, json: bool) -> anyhow::Result<()> {
    let topo = load_topology(topology, nodes)?;
    let report = topo.inspect();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(())
}
