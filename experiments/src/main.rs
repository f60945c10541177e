//! `murmur-experiments`: the experiment drivers of murmur (experiments/README.md).
//!
//! Each driver runs the `murmur` binary (the simulator, `murmur launch`, `murmur bench`) or
//! the topology library, gathers the runs into one CSV per experiment, draws the plots
//! (PNG and SVG, [`crate::chart`]) and checks what it wrote ([`table::write_checked_csv`], [`crate::chart::Chart::save`]): every plot
//! file present, every CSV with its expected columns and finite values.

// The charts of the run folders, the same file as `murmur`'s (one look for every plot),
// compiled here on its own so that drawing a line needs neither Burn nor libp2p.
// (`allow`: some of its items are for murmur's own plots only.)
#[path = "../../node/src/report/chart.rs"]
#[allow(dead_code)]
mod chart;
mod consensus;
mod convergence;
mod diloco;
mod faults;
mod robust;
mod runner;
mod scaling;
mod table;
mod topology;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::runner::Ctx;

#[derive(Debug, Parser)]
#[command(
    name = "murmur-experiments",
    version,
    about = "Experiment drivers of murmur: consensus, convergence, scaling, topology, faults and DiLoCo, with CSV files and plots",
    after_help = "Results go to <OUT>/<experiment>/ (CSV, PNG, SVG, and summary.md with the tables). \
                  `experiments/run_all` builds the binaries and runs `all`."
)]
struct Cli {
    #[command(subcommand)]
    experiment: Experiment,
    /// Output folder (default: experiments/results, or target/experiments-quick with
    /// --quick so that a quick run never overwrites the report's files).
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    /// A small version of every run (minutes instead of the better part of an hour), for CI
    /// and for trying things out; its numbers are not the report's.
    #[arg(long, global = true)]
    quick: bool,
    /// The murmur binary (default: next to this one).
    #[arg(long, global = true)]
    murmur: Option<PathBuf>,
    /// Keep the runs whose output files exist (after an interrupted run, or to redraw the
    /// plots); the report's numbers come from a run without it.
    #[arg(long, global = true)]
    reuse: bool,
    /// Simulator runs at once (each one mostly uses one core).
    #[arg(long, global = true, default_value_t = 2)]
    jobs: usize,
}

#[derive(Debug, Subcommand)]
enum Experiment {
    /// Spectral gap and degree vs n for every topology family.
    Topology,
    /// Average consensus: Ξ²(t)/Ξ²(0) vs rounds and bits, exact gossip and CHOCO-Gossip.
    Consensus,
    /// Training on MNIST, 16 peers, IID and non-IID, every algorithm, several seeds.
    Convergence,
    /// Time per round and samples/s vs peers (simulated and real), C2C ratio per model.
    Scaling,
    /// Real processes: a peer killed with SIGKILL, the survivors training on, the peer
    /// restarted with --resume and rejoining.
    Faults,
    /// The language model, 8 peers: DiLoCo (H = 10, 50, 200; int8 and top-k
    /// pseudo-gradients; gossip; streaming) against all-reduce, D-PSGD and local-avg: loss
    /// vs bytes and vs simulated time at 100 Mb/s and 1 Gb/s.
    Diloco,
    /// Byzantine-robust gossip, 16 peers on MNIST: ring, torus and exponential graph with
    /// 0–3 attackers (sign flip, ALIE, noise), plain gossip against ClippedGossip.
    Robust,
    /// All of the above, in that order.
    All,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    crate::chart::init_fonts()?;
    let murmur = match cli.murmur {
        Some(p) => p,
        None => std::env::current_exe()
            .context("locating this binary")?
            .with_file_name(format!("murmur{}", std::env::consts::EXE_SUFFIX)),
    };
    anyhow::ensure!(
        murmur.is_file(),
        "no murmur binary at {} (build it with `cargo build --release -p murmur`, or pass --murmur)",
        murmur.display()
    );
    anyhow::ensure!(cli.jobs >= 1, "--jobs must be at least 1");
    let out = cli.out.unwrap_or_else(|| {
        PathBuf::from(if cli.quick {
            "target/experiments-quick"
        } else {
            "experiments/results"
        })
    });
    let ctx = Ctx::new(murmur, out, cli.quick, cli.jobs, cli.reuse)?;
    let started = Instant::now();
    let which: &[Experiment] = match cli.experiment {
        Experiment::All => &[
            Experiment::Topology,
            Experiment::Consensus,
            Experiment::Convergence,
            Experiment::Scaling,
            Experiment::Faults,
            Experiment::Diloco,
            Experiment::Robust,
        ],
        ref one => std::slice::from_ref(one),
    };
    for (i, e) in which.iter().enumerate() {
        if which.len() > 1 {
            eprintln!(
                "murmur-experiments: experiment {}/{} ({e:?}), {:.1} min so far",
                i + 1,
                which.len(),
                started.elapsed().as_secs_f64() / 60.0
            );
        }
        let t = Instant::now();
        match e {
            Experiment::Topology => topology::run(&ctx)?,
            Experiment::Consensus => consensus::run(&ctx)?,
            Experiment::Convergence => convergence::run(&ctx)?,
            Experiment::Scaling => scaling::run(&ctx)?,
            Experiment::Faults => faults::run(&ctx)?,
            Experiment::Diloco => diloco::run(&ctx)?,
            Experiment::Robust => robust::run(&ctx)?,
            Experiment::All => unreachable!("expanded above"),
        }
        eprintln!(
            "murmur-experiments: {e:?} done in {:.1} min",
            t.elapsed().as_secs_f64() / 60.0
        );
    }
    eprintln!(
        "murmur-experiments: finished in {:.1} min; results in {}",
        started.elapsed().as_secs_f64() / 60.0,
        ctx.out.display()
    );
    Ok(())
}
