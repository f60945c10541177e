//! `topology`: spectral gap 1 − |λ₂(W)| and per-peer degree vs n for every topology
//! family, with W as murmur builds it (Metropolis–Hastings for the undirected families,
//! uniform weights on the directed exponential graph). The trade-off of the surveys
//! (Tang, Shi, Chu et al.; Ying et al. 2021 for the exponential graph): a larger gap
//! means fewer rounds to consensus, a larger degree means more bytes per round.

use std::path::Path;

use serde::Serialize;

use murmur_topology::{Topology, TopologySpec};

use crate::chart::{Chart, Series, SeriesLabelPosition};
use crate::runner::Ctx;
use crate::table::{markdown, write_checked_csv};

/// The families, in plot order.
const FAMILIES: [&str; 7] = [
    "ring",
    "torus",
    "exponential",
    "hypercube",
    "erdos-renyi",
    "star",
    "complete",
];

/// One (family, n).
#[derive(Debug, Serialize)]
struct Row {
    family: String,
    n: usize,
    mean_degree: f64,
    max_degree: usize,
    edges: usize,
    lambda2_abs: f64,
    spectral_gap: f64,
    /// Rounds of exact gossip for Ξ² to fall by 10⁶: ⌈ln(10⁶) / (−2 ln|λ₂|)⌉.
    rounds_to_1e6: f64,
    /// `rounds_to_1e6 × mean_degree`: messages a peer sends for that.
    messages_to_1e6: f64,
}

/// Builds `family` for n peers, as the topology files do (erdős–rényi: p = 2 ln n / n, the
/// first seed in 0..100 whose graph is connected).
fn build(family: &str, n: usize) -> Option<Topology> {
    if family == "erdos-renyi" {
        let p = (2.0 * (n as f64).ln() / n as f64).min(1.0);
        return (0..100).find_map(|seed| {
            TopologySpec::parse(&format!(
                "topology = \"erdos-renyi\"\nnodes = {n}\np = {p}\nseed = {seed}\n"
            ))
            .ok()?
            .build(None)
            .ok()
        });
    }
    if family == "hypercube" && !n.is_power_of_two() {
        return None;
    }
    TopologySpec::named(family).ok()?.build(Some(n)).ok()
}

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("topology")?;
    let ns: Vec<usize> = if ctx.quick {
        vec![4, 8, 16, 32]
    } else {
        vec![4, 8, 16, 32, 64, 128, 256]
    };
    let rows = measure(&ns);
    write_csv(&dir, &rows)?;
    plot(&dir, &rows)?;
    write_summary(&dir, &rows)
}

/// The row of one (family, n): degrees, |λ₂(W)|, spectral gap and the cost of 10⁶.
fn row(family: &str, n: usize, t: &Topology) -> Row {
    let r = t.inspect();
    let rounds = if r.lambda2_abs > 0.0 {
        (1e6f64.ln() / (-2.0 * r.lambda2_abs.ln())).ceil()
    } else {
        1.0
    };
    Row {
        family: family.to_string(),
        n,
        mean_degree: r.mean_degree,
        max_degree: r.max_degree,
        edges: r.edges,
        lambda2_abs: r.lambda2_abs,
        spectral_gap: r.spectral_gap,
        rounds_to_1e6: rounds,
        messages_to_1e6: rounds * r.mean_degree,
    }
}

/// Builds every family at every n of `ns` and measures its mixing matrix W.
fn measure(ns: &[usize]) -> Vec<Row> {
    let mut rows = Vec::new();
    for family in FAMILIES {
        for &n in ns {
            let Some(t) = build(family, n) else { continue };
            rows.push(row(family, n, &t));
        }
        eprintln!("[topology] {family}: {} sizes", ns.len());
    }
    rows
}

/// Writes spectral_gap.csv.
fn write_csv(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let csv = dir.join("spectral_gap.csv");
    write_checked_csv(
        &csv,
        rows,
        &[
            "n",
            "mean_degree",
            "max_degree",
            "lambda2_abs",
            "spectral_gap",
            "rounds_to_1e6",
            "messages_to_1e6",
        ],
        &["family"],
    )
}

/// One series per family of `f(row)` against n.
fn family_series(rows: &[Row], f: &dyn Fn(&Row) -> f64) -> Vec<Series> {
    FAMILIES
        .iter()
        .enumerate()
        .map(|(i, fam)| {
            let pts = rows
                .iter()
                .filter(|r| r.family == *fam)
                .map(|r| (r.n as f64, f(r)))
                .collect();
            Series::line(*fam, i, pts)
        })
        .collect()
}

/// Draws spectral gap, degree and messages to 10⁶ against n.
fn plot(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut gap = Chart::new(
        "Spectral gap 1 − |λ₂(W)| vs peers",
        "peers n",
        "spectral gap",
    );
    gap.log_x = true;
    gap.log_y = true;
    gap.y_floor = 1e-6;
    gap.series = family_series(rows, &|r| r.spectral_gap);
    gap.legend = SeriesLabelPosition::LowerLeft;
    gap.save(&dir.join("spectral_gap_vs_n"))?;
    let mut deg = Chart::new(
        "Per-peer degree vs peers (messages per round)",
        "peers n",
        "mean degree",
    );
    deg.log_x = true;
    deg.log_y = true;
    deg.y_floor = 0.5;
    deg.series = family_series(rows, &|r| r.mean_degree);
    deg.legend = SeriesLabelPosition::UpperLeft;
    deg.save(&dir.join("degree_vs_n"))?;
    let mut cost = Chart::new(
        "Messages per peer for exact gossip to cut Ξ² by 10⁶ (rounds × degree)",
        "peers n",
        "messages per peer",
    );
    cost.log_x = true;
    cost.log_y = true;
    cost.y_floor = 0.5;
    cost.series = family_series(rows, &|r| r.messages_to_1e6);
    cost.legend = SeriesLabelPosition::UpperLeft;
    cost.save(&dir.join("messages_vs_n"))?;
    Ok(())
}

/// Writes summary.md: the table at n = 16 and 64.
fn write_summary(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let table: Vec<Vec<String>> = rows
        .iter()
        .filter(|r| r.n == 16 || r.n == 64)
        .map(|r| {
            vec![
                r.family.clone(),
                r.n.to_string(),
                format!("{:.2}", r.mean_degree),
                r.max_degree.to_string(),
                format!("{:.4}", r.lambda2_abs),
                format!("{:.4}", r.spectral_gap),
                format!("{:.0}", r.rounds_to_1e6),
                format!("{:.0}", r.messages_to_1e6),
            ]
        })
        .collect();
    std::fs::write(
        dir.join("summary.md"),
        markdown(
            &[
                "family",
                "n",
                "mean degree",
                "max degree",
                "|λ₂|",
                "spectral gap",
                "rounds to 10⁻⁶",
                "messages to 10⁻⁶",
            ],
            &table,
        ),
    )?;
    Ok(())
}
