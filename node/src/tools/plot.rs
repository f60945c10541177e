//! `murmur plot RUN…`: the charts of one or several run folders, several on shared axes
//! (one colour per run), so that two runs compare in one command.

use std::path::PathBuf;

use clap::Args;

use crate::report::plots;

/// The options of `murmur plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run folders (of `launch`, `peer`, `simulate`): training runs, or consensus runs, or
    /// timing runs, not a mix.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Where the charts go [default: RUN/plots for one run, ./plots for several].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Draws the runs and prints the folder and the charts written.
///
/// # Errors
/// A folder that is not a run folder, runs of different kinds, no font for the text, a
/// file that cannot be written.
pub fn run(args: &PlotArgs) -> anyhow::Result<()> {
    let runs = args
        .runs
        .iter()
        .map(|dir| plots::load(dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out = match (&args.out, args.runs.as_slice()) {
        (Some(out), _) => out.clone(),
        (None, [one]) => one.join("plots"),
        (None, _) => PathBuf::from("plots"),
    };
    let files = plots::draw(&runs, &out)?;
    let mut stems: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    stems.dedup();
    println!(
        "plots: {} ({}; PNG and SVG)",
        out.display(),
        stems.join(", ")
    );
    Ok(())
}
