//! `consensus`: average consensus Ξ²(t)/Ξ²(0) (Ξ² = (1/n)Σ‖x_i − x̄‖²) vs rounds and bits
//! on the wire, in the simulator (`murmur simulate --consensus`).
//!
//! * Exact gossip x ← Wx on ring, torus, exponential and complete graphs at n = 16 and 64,
//!   from two starts: uniform random vectors (every mode of W excited), whose expected
//!   decay is (1/(n−1)) Σ_{k≥2} |λ_k|^(2t) for a normal W, and the slowest mode of W, for
//!   which the worst-case bound |λ₂|^(2t) (Boyd et al. 2006) is exact.
//! * CHOCO-Gossip (Koloskova, Stich, Jaggi 2019, Algorithm 1) with top-1%, random-1%
//!   (unscaled, a δ = k/d contraction as in the paper), QSGD with 127 levels (8 bits per
//!   coordinate with the sign) and scaled sign, d = 2000 as in the paper's consensus
//!   experiments; γ tuned per setting over a grid (the paper tunes γ too): the γ that
//!   reaches Ξ²/Ξ²(0) ≤ 10⁻³ in the fewest rounds (else the lowest final error) is plotted
//!   and its curve is in consensus.csv; every γ's final error is in gamma_grid.csv.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Serialize;

use murmur_topology::TopologySpec;

use crate::runner::{Ctx, Job};
use crate::table::{markdown, write_checked_csv, Table};
use murmur::report::chart::{Chart, Series, SeriesLabelPosition, Stroke};

/// The consensus error the tables and the choice of γ measure to.
const TARGET: f64 = 1e-3;

const TOPOLOGIES: [&str; 4] = ["ring", "torus", "exponential", "complete"];
/// (run config in experiments/runs/consensus/, label) of the CHOCO-Gossip runs.
const COMPRESSORS: [(&str, &str); 4] = [
    ("choco-topk", "top-1%"),
    ("choco-randk", "random-1%"),
    ("choco-qsgd", "QSGD 8-bit"),
    ("choco-sign", "sign"),
];

/// A run config of experiments/runs/consensus/: its path, rounds, d and compressor.
struct Config {
    path: String,
    rounds: u64,
    compressor: String,
}

impl Config {
    fn read(ctx: &Ctx, stem: &str) -> anyhow::Result<Config> {
        let path = ctx.file(&format!("runs/consensus/{stem}.toml"))?;
        let v: toml::Table = std::fs::read_to_string(&path)?
            .parse()
            .with_context(|| format!("parsing {path}"))?;
        let rounds = v
            .get("rounds")
            .and_then(toml::Value::as_integer)
            .and_then(|r| u64::try_from(r).ok())
            .with_context(|| format!("{path}: no `rounds`"))?;
        let compressor = v
            .get("compressor")
            .and_then(toml::Value::as_str)
            .unwrap_or("none")
            .to_string();
        Ok(Config {
            path,
            rounds,
            compressor,
        })
    }
}

/// One point of one curve.
#[derive(Debug, Serialize)]
struct Row {
    /// `exact` or `choco`.
    kind: String,
    topology: String,
    n: usize,
    /// `uniform` or `slowest-mode`.
    init: String,
    compressor: String,
    gamma: f64,
    round: u64,
    relative: f64,
    bits_per_peer: f64,
    /// |λ₂|^(2t).
    bound: f64,
    /// (1/(n−1)) Σ_{k≥2} |λ_k|^(2t).
    spectral_mean: f64,
}

/// One CHOCO run of the γ grid.
#[derive(Debug, Serialize)]
struct GridRow {
    topology: String,
    n: usize,
    compressor: String,
    gamma: f64,
    /// 0 when the run failed or its error became non-finite.
    converged_run: u8,
    /// Ξ²/Ξ²(0) at the last round (NaN for a failed run).
    final_relative: f64,
    /// 1 for the γ drawn.
    selected: u8,
}

/// A run's points: (round, Ξ²/Ξ²(0), bits sent per peer).
type Curve = Vec<(u64, f64, f64)>;

/// The curve of setting `i`, if its run succeeded.
fn curve_of(curves: &[(usize, Curve)], i: usize) -> Option<&Curve> {
    curves.iter().find(|c| c.0 == i).map(|c| &c.1)
}

struct Setting {
    kind: &'static str,
    topology: &'static str,
    n: usize,
    init: &'static str,
    /// The run config's stem (`exact`, `choco-topk`, …).
    config: &'static str,
    compressor: String,
    gamma: f64,
    id: String,
}

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("consensus")?;
    let runs = dir.join("runs");
    let mut configs = BTreeMap::new();
    for stem in std::iter::once("exact").chain(COMPRESSORS.iter().map(|c| c.0)) {
        configs.insert(stem, Config::read(ctx, stem)?);
    }
    // --quick shortens the configs' runs on the command line (which wins).
    let quick = |exact: bool| -> Vec<String> {
        match (ctx.quick, exact) {
            (false, _) => Vec::new(),
            (true, true) => vec!["--rounds=50".into(), "--dim=200".into()],
            (true, false) => vec!["--rounds=60".into(), "--dim=1000".into()],
        }
    };
    let exact_rounds = if ctx.quick {
        50
    } else {
        configs["exact"].rounds
    };
    let choco_rounds = if ctx.quick {
        60
    } else {
        configs["choco-topk"].rounds
    };
    let gammas: &[f64] = if ctx.quick {
        &[0.05, 0.5]
    } else {
        &[0.01, 0.03, 0.1, 0.3, 1.0]
    };
    let mut settings = Vec::new();
    for n in [16usize, 64] {
        for topology in TOPOLOGIES {
            for init in ["uniform", "slowest-mode"] {
                settings.push(Setting {
                    kind: "exact",
                    topology,
                    n,
                    init,
                    config: "exact",
                    compressor: configs["exact"].compressor.clone(),
                    gamma: 1.0,
                    id: format!("exact-{topology}-n{n}-{init}"),
                });
            }
            for (config, _) in COMPRESSORS {
                for &gamma in gammas {
                    settings.push(Setting {
                        kind: "choco",
                        topology,
                        n,
                        init: "uniform",
                        config,
                        compressor: configs[config].compressor.clone(),
                        gamma,
                        id: format!("{config}-{topology}-n{n}-g{gamma}"),
                    });
                }
            }
        }
    }
    let jobs: Vec<Job> = settings
        .iter()
        .map(|s| {
            let exact = s.kind == "exact";
            let mut a = vec![
                "simulate".to_string(),
                "--config".into(),
                configs[s.config].path.clone(),
                format!("--peers={}", s.n),
                format!("--topology={}", s.topology),
                format!("--consensus-init={}", s.init),
                "--seed=1".into(),
            ];
            if !exact {
                a.push(format!("--gamma={}", s.gamma));
            }
            a.extend(quick(exact));
            Job::in_run(&runs, &s.id, a, Some("consensus.csv"))
        })
        .collect();
    let results = ctx.run_all("consensus", &jobs);

    // Spectra for the theory lines.
    let mut spectra: BTreeMap<(&str, usize), Vec<f64>> = BTreeMap::new();
    for n in [16usize, 64] {
        for t in TOPOLOGIES {
            let topo = TopologySpec::named(t)?.build(Some(n))?;
            let m = topo
                .w
                .eigenvalue_moduli()
                .context("eigenvalues did not converge")?;
            spectra.insert((t, n), m);
        }
    }
    let theory = |t: &str, n: usize, round: u64| -> (f64, f64) {
        let m = &spectra[&(t, n)];
        let e = 2 * round as i32;
        let bound = m[1].powi(e);
        let mean = m[1..].iter().map(|l| l.powi(e)).sum::<f64>() / (n - 1) as f64;
        (bound, mean)
    };

    // Curves; failed CHOCO runs (a γ too large for the compressor) are reported, not drawn.
    let mut curves: Vec<(usize, Curve)> = Vec::new();
    let mut failed = Vec::new();
    for (i, (s, r)) in settings.iter().zip(&results).enumerate() {
        match r {
            Ok(_) => {
                let t = Table::read(&runs.join(&s.id).join("consensus.csv"))?;
                let (rounds, rel, bytes) = (
                    t.f64s("round")?,
                    t.f64s("relative")?,
                    t.f64s("bytes_sent_per_peer")?,
                );
                let pts: Vec<(u64, f64, f64)> = (0..rounds.len())
                    .map(|k| (rounds[k] as u64, rel[k], 8.0 * bytes[k]))
                    .collect();
                if pts.iter().all(|p| p.1.is_finite()) {
                    curves.push((i, pts));
                } else {
                    failed.push(format!("{} (non-finite error)", s.id));
                }
            }
            Err(e) if s.kind == "choco" => failed.push(format!(
                "{}: {}",
                s.id,
                e.to_string().lines().last().unwrap_or("")
            )),
            Err(e) => return Err(anyhow::anyhow!("{e:#}")),
        }
    }
    // Best γ per (topology, n, compressor): the fewest rounds to Ξ²/Ξ²(0) ≤ 10⁻³, and
    // among the γ that never get there the lowest final error. `best` keeps the run and
    // its final error.
    let rank = |pts: &Curve| -> (u64, f64) {
        let last = pts.last().map_or(f64::INFINITY, |p| p.1);
        let first = pts.iter().find(|p| p.1 <= TARGET).map_or(u64::MAX, |p| p.0);
        (first, last)
    };
    let mut best: BTreeMap<(&str, usize, &str), (usize, f64)> = BTreeMap::new();
    let mut best_rank: BTreeMap<(&str, usize, &str), (u64, f64)> = BTreeMap::new();
    for (i, pts) in &curves {
        let s = &settings[*i];
        if s.kind != "choco" {
            continue;
        }
        let key = (s.topology, s.n, s.config);
        let r = rank(pts);
        let better = best_rank
            .get(&key)
            .is_none_or(|b| r.0 < b.0 || (r.0 == b.0 && r.1 < b.1));
        if better {
            best_rank.insert(key, r);
            best.insert(key, (*i, r.1));
        }
    }
    let selected = |i: usize| {
        let s = &settings[i];
        s.kind == "exact"
            || best
                .get(&(s.topology, s.n, s.config))
                .is_some_and(|b| b.0 == i)
    };
    // Every γ's final error; the curves of the selected ones (every round up to 100, then
    // every 10th: the CSV stays small enough to commit).
    let grid: Vec<GridRow> = settings
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind == "choco")
        .map(|(i, s)| GridRow {
            topology: s.topology.into(),
            n: s.n,
            compressor: s.compressor.clone(),
            gamma: s.gamma,
            converged_run: u8::from(curve_of(&curves, i).is_some()),
            final_relative: curve_of(&curves, i)
                .and_then(|c| c.last())
                .map_or(f64::NAN, |p| p.1),
            selected: u8::from(selected(i)),
        })
        .collect();
    let grid_csv = dir.join("gamma_grid.csv");
    write_checked_csv(
        &grid_csv,
        &grid,
        &["n", "gamma", "converged_run", "selected"],
        &["topology", "compressor", "final_relative"],
    )?;
    let mut rows = Vec::new();
    for (i, pts) in &curves {
        let s = &settings[*i];
        if !selected(*i) {
            continue;
        }
        for &(round, relative, bits) in pts.iter().filter(|p| p.0 <= 100 || p.0 % 10 == 0) {
            let (bound, spectral_mean) = theory(s.topology, s.n, round);
            rows.push(Row {
                kind: s.kind.into(),
                topology: s.topology.into(),
                n: s.n,
                init: s.init.into(),
                compressor: s.compressor.clone(),
                gamma: s.gamma,
                round,
                relative,
                bits_per_peer: bits,
                bound,
                spectral_mean,
            });
        }
    }
    let csv = dir.join("consensus.csv");
    write_checked_csv(
        &csv,
        &rows,
        &[
            "n",
            "gamma",
            "round",
            "relative",
            "bits_per_peer",
            "bound",
            "spectral_mean",
        ],
        &["kind", "topology", "init", "compressor"],
    )?;

    // Plots.
    let curve = |i: usize| curve_of(&curves, i);
    let find = |kind: &str, t: &str, n: usize, init: &str, comp: &str| {
        settings.iter().position(|s| {
            s.kind == kind && s.topology == t && s.n == n && s.init == init && s.compressor == comp
        })
    };
    let mut summary = String::new();
    let mut exact_table = Vec::new();
    let mut choco_table = Vec::new();
    for n in [16usize, 64] {
        let mut overview = Chart::new(format!("Exact gossip, n = {n}"), "round t", "Ξ²(t) / Ξ²(0)");
        overview.log_y = true;
        overview.legend = SeriesLabelPosition::LowerLeft;
        for (ci, t) in TOPOLOGIES.iter().enumerate() {
            let mut by_round = Chart::new(
                format!("Consensus on {t}, n = {n}"),
                "round t",
                "Ξ²(t) / Ξ²(0)",
            );
            by_round.log_y = true;
            by_round.legend = SeriesLabelPosition::LowerLeft;
            let mut by_bits = Chart::new(
                format!("Consensus on {t}, n = {n}"),
                "bits sent per peer",
                "Ξ²(t) / Ξ²(0)",
            );
            by_bits.log_y = true;
            by_bits.log_x = true;
            by_bits.legend = SeriesLabelPosition::LowerLeft;
            let l2 = spectra[&(*t, n)][1];
            let mut ratios = Vec::new();
            for init in ["uniform", "slowest-mode"] {
                let Some(pts) = find("exact", t, n, init, "none").and_then(curve) else {
                    continue;
                };
                let label = format!(
                    "exact gossip, {} start",
                    if init == "uniform" {
                        "random"
                    } else {
                        "slowest-mode"
                    }
                );
                // The two starts differ in colour and in stroke, so that the legend tells
                // them apart (8: a colour no CHOCO series and no bound takes).
                let (stroke, colour) = if init == "uniform" {
                    (Stroke::Solid, 0)
                } else {
                    (Stroke::Points, 8)
                };
                let rp: Vec<(f64, f64)> = pts.iter().map(|p| (p.0 as f64, p.1)).collect();
                let bp: Vec<(f64, f64)> = pts.iter().map(|p| (p.2, p.1)).collect();
                overview
                    .series
                    .push(Series::line(format!("{t} {label}"), ci, rp.clone()).stroke(stroke));
                by_round
                    .series
                    .push(Series::line(label.clone(), colour, rp).stroke(stroke));
                by_bits
                    .series
                    .push(Series::line(label, colour, bp).stroke(stroke));
                // Largest factor between measured and predicted over t ≤ 50.
                let worst = |f: &dyn Fn(u64) -> f64| {
                    pts.iter()
                        // Above f32's floor: Ξ² of vectors stored in f32 stops near 1e-14.
                        .filter(|p| p.0 >= 1 && p.0 <= 50 && f(p.0) >= 1e-10)
                        .map(|p| {
                            let r = p.1 / f(p.0);
                            r.max(1.0 / r)
                        })
                        .fold(1.0f64, f64::max)
                };
                ratios.push((worst(&|r| theory(t, n, r).0), worst(&|r| theory(t, n, r).1)));
            }
            let bound: Vec<(f64, f64)> = (0..=exact_rounds)
                .map(|r| (r as f64, theory(t, n, r).0))
                .collect();
            overview.series.push(
                Series::line(format!("{t} |λ₂|^2t"), ci, bound.clone()).stroke(Stroke::Dashed),
            );
            by_round
                .series
                .push(Series::line("|λ₂|^2t", 7, bound).stroke(Stroke::Dashed));
            for (k, (c, label)) in COMPRESSORS.iter().enumerate() {
                let Some(&(i, last)) = best.get(&(*t, n, *c)) else {
                    continue;
                };
                let Some(pts) = curve(i) else { continue };
                let g = settings[i].gamma;
                let name = format!("CHOCO {label} (γ = {g})");
                by_round.series.push(Series::line(
                    name.clone(),
                    k + 1,
                    pts.iter().map(|p| (p.0 as f64, p.1)).collect(),
                ));
                by_bits.series.push(Series::line(
                    name,
                    k + 1,
                    pts.iter().map(|p| (p.2, p.1)).collect(),
                ));
                let to = pts.iter().find(|p| p.1 <= TARGET);
                choco_table.push(vec![
                    t.to_string(),
                    n.to_string(),
                    label.to_string(),
                    format!("{g}"),
                    format!("{last:.2e}"),
                    to.map_or("—".into(), |p| p.0.to_string()),
                    to.map_or("—".into(), |p| format!("{:.3e}", p.2)),
                ]);
            }
            if l2 > 1e-9 {
                let exact_to = find("exact", t, n, "uniform", "none")
                    .and_then(curve)
                    .and_then(|p| p.iter().find(|q| q.1 <= TARGET).copied());
                exact_table.push(vec![
                    t.to_string(),
                    n.to_string(),
                    format!("{l2:.4}"),
                    ratios
                        .first()
                        .map_or("—".into(), |r| format!("{:.2} / {:.2}", r.0, r.1)),
                    ratios.get(1).map_or("—".into(), |r| format!("{:.3}", r.0)),
                    exact_to.map_or(format!("> {exact_rounds}"), |p| p.0.to_string()),
                    exact_to.map_or("—".into(), |p| format!("{:.3e}", p.2)),
                ]);
                // From the slowest mode the measured curve is the bound (module doc).
                if let Some(r) = ratios.get(1) {
                    anyhow::ensure!(
                        r.0 <= 2.0,
                        "exact gossip on {t}, n = {n}, slowest-mode start: {:.3}× off |λ₂|^2t",
                        r.0
                    );
                }
            } else {
                exact_table.push(vec![
                    t.to_string(),
                    n.to_string(),
                    "0 (W = J/n)".into(),
                    "—".into(),
                    "—".into(),
                    "1".into(),
                    "—".into(),
                ]);
            }
            by_round.save(&dir.join(format!("{t}_n{n}_vs_round")))?;
            by_bits.save(&dir.join(format!("{t}_n{n}_vs_bits")))?;
        }
        overview.save(&dir.join(format!("exact_gossip_n{n}")))?;
    }
    summary += "Exact gossip (`relative` ≤ 10⁻³: first round and bits per peer; factor: the largest of measured/predicted and its inverse over rounds 1–50 where the prediction is ≥ 10⁻¹⁰, above f32's floor)\n\n";
    summary += &markdown(
        &[
            "topology",
            "n",
            "|λ₂|",
            "random start: factor vs |λ₂|^2t / vs spectral mean",
            "slowest-mode start: factor vs |λ₂|^2t",
            "rounds to 10⁻³",
            "bits/peer to 10⁻³",
        ],
        &exact_table,
    );
    summary += "\nCHOCO-Gossip, best γ of the grid (random start)\n\n";
    summary += &markdown(
        &[
            "topology",
            "n",
            "compressor",
            "γ",
            &format!("Ξ²/Ξ²(0) after {choco_rounds} rounds"),
            "rounds to 10⁻³",
            "bits/peer to 10⁻³",
        ],
        &choco_table,
    );
    if !failed.is_empty() {
        summary += &format!(
            "\nRuns that failed or diverged (not drawn): {}\n",
            failed.join("; ")
        );
    }
    std::fs::write(dir.join("summary.md"), summary)?;
    Ok(())
}
