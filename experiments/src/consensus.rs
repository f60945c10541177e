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
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use murmur_topology::TopologySpec;

use crate::chart::{Chart, Series, SeriesLabelPosition, Stroke};
use crate::runner::{Ctx, Job};
use crate::table::{markdown, write_checked_csv, Table};

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

/// One run: exact gossip or CHOCO-Gossip at one γ, on one topology and n, from one start.
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

/// The run configs of experiments/runs/consensus/, by stem: `exact` and each compressor's.
type Configs = BTreeMap<&'static str, Config>;

/// The best γ per (topology, n, compressor config): the setting's index and its final error.
type Best = BTreeMap<(&'static str, usize, &'static str), (usize, f64)>;

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("consensus")?;
    let runs = dir.join("runs");
    let configs = read_configs(ctx)?;
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
    let settings = settings(&configs, gammas(ctx.quick));
    let jobs = jobs(ctx, &configs, &settings, &runs);
    let results = ctx.run_all("consensus", &jobs);

    let spectra = Spectra::compute()?;
    let (curves, failed) = read_curves(&settings, &results, &runs)?;
    let best = best_gammas(&settings, &curves);
    let outcome = Outcome {
        settings: &settings,
        curves,
        best,
        spectra,
    };
    outcome.write_gamma_grid(&dir)?;
    outcome.write_curves(&dir)?;

    let mut report = Report {
        outcome: &outcome,
        dir: &dir,
        exact_rounds,
        exact_table: Vec::new(),
        choco_table: Vec::new(),
    };
    report.draw()?;
    report.write_summary(choco_rounds, &failed)
}

/// Reads the run config of exact gossip and of each CHOCO compressor.
fn read_configs(ctx: &Ctx) -> anyhow::Result<Configs> {
    let mut configs = BTreeMap::new();
    for stem in std::iter::once("exact").chain(COMPRESSORS.iter().map(|c| c.0)) {
        configs.insert(stem, Config::read(ctx, stem)?);
    }
    Ok(configs)
}

/// The grid of CHOCO-Gossip step sizes γ.
fn gammas(quick: bool) -> &'static [f64] {
    if quick {
        &[0.05, 0.5]
    } else {
        &[0.01, 0.03, 0.1, 0.3, 1.0]
    }
}

/// Every setting: per n and topology, exact gossip from both starts, then each compressor
/// at each γ of the grid.
fn settings(configs: &Configs, gammas: &[f64]) -> Vec<Setting> {
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
    settings
}

/// `--quick` shortens the configs' runs on the command line (which wins).
fn quick_args(quick: bool, exact: bool) -> Vec<String> {
    match (quick, exact) {
        (false, _) => Vec::new(),
        (true, true) => vec!["--rounds=50".into(), "--dim=200".into()],
        (true, false) => vec!["--rounds=60".into(), "--dim=1000".into()],
    }
}

/// The `murmur simulate` job of each setting, writing `<runs>/<id>/consensus.csv`.
fn jobs(ctx: &Ctx, configs: &Configs, settings: &[Setting], runs: &Path) -> Vec<Job> {
    settings
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
            a.extend(quick_args(ctx.quick, exact));
            Job::in_run(runs, &s.id, a, Some("consensus.csv"))
        })
        .collect()
}

/// The moduli |λ_k| of each topology's mixing matrix W at n = 16 and 64, for the theory
/// lines.
struct Spectra(BTreeMap<(&'static str, usize), Vec<f64>>);

impl Spectra {
    /// The eigenvalue moduli of W for every topology and n.
    fn compute() -> anyhow::Result<Spectra> {
        let mut spectra = BTreeMap::new();
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
        Ok(Spectra(spectra))
    }

    /// |λ₂(W)| of topology `t` at n peers.
    fn lambda2(&self, t: &'static str, n: usize) -> f64 {
        self.0[&(t, n)][1]
    }

    /// (|λ₂|^(2t), (1/(n−1)) Σ_{k≥2} |λ_k|^(2t)) of topology `t` at n peers and `round` t.
    fn theory(&self, t: &'static str, n: usize, round: u64) -> (f64, f64) {
        let m = &self.0[&(t, n)];
        let e = 2 * round as i32;
        let bound = m[1].powi(e);
        let mean = m[1..].iter().map(|l| l.powi(e)).sum::<f64>() / (n - 1) as f64;
        (bound, mean)
    }
}

/// The curves read back, each with its setting's index, and the ids of the failed runs.
type Curves = (Vec<(usize, Curve)>, Vec<String>);

/// The curve of each run that succeeded; failed CHOCO runs (a γ too large for the
/// compressor) are listed, not drawn; a failed exact run is the error.
fn read_curves(
    settings: &[Setting],
    results: &[anyhow::Result<String>],
    runs: &Path,
) -> anyhow::Result<Curves> {
    let mut curves: Vec<(usize, Curve)> = Vec::new();
    let mut failed = Vec::new();
    for (i, (s, r)) in settings.iter().zip(results).enumerate() {
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
    Ok((curves, failed))
}

/// A curve's rank for the choice of γ: (first round with Ξ²/Ξ²(0) ≤ 10⁻³, final error).
fn rank(pts: &Curve) -> (u64, f64) {
    let last = pts.last().map_or(f64::INFINITY, |p| p.1);
    let first = pts.iter().find(|p| p.1 <= TARGET).map_or(u64::MAX, |p| p.0);
    (first, last)
}

/// Best γ per (topology, n, compressor): the fewest rounds to Ξ²/Ξ²(0) ≤ 10⁻³, and among
/// the γ that never get there the lowest final error.
fn best_gammas(settings: &[Setting], curves: &[(usize, Curve)]) -> Best {
    let mut best = Best::new();
    let mut best_rank: BTreeMap<(&str, usize, &str), (u64, f64)> = BTreeMap::new();
    for (i, pts) in curves {
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
    best
}

/// The runs' results: the settings, the curves of those that succeeded, the best γ and
/// the spectra of W.
struct Outcome<'a> {
    settings: &'a [Setting],
    curves: Vec<(usize, Curve)>,
    best: Best,
    spectra: Spectra,
}

impl Outcome<'_> {
    /// The curve of setting `i`, if its run succeeded.
    fn curve(&self, i: usize) -> Option<&Curve> {
        curve_of(&self.curves, i)
    }

    /// Whether setting `i` is drawn: every exact run, and the best γ of each CHOCO setting.
    fn selected(&self, i: usize) -> bool {
        let s = &self.settings[i];
        s.kind == "exact"
            || self
                .best
                .get(&(s.topology, s.n, s.config))
                .is_some_and(|b| b.0 == i)
    }

    /// The index of the setting with these fields.
    fn find(&self, kind: &str, t: &str, n: usize, init: &str, comp: &str) -> Option<usize> {
        self.settings.iter().position(|s| {
            s.kind == kind && s.topology == t && s.n == n && s.init == init && s.compressor == comp
        })
    }

    /// Writes gamma_grid.csv: every γ's final error.
    fn write_gamma_grid(&self, dir: &Path) -> anyhow::Result<()> {
        let grid: Vec<GridRow> = self
            .settings
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == "choco")
            .map(|(i, s)| GridRow {
                topology: s.topology.into(),
                n: s.n,
                compressor: s.compressor.clone(),
                gamma: s.gamma,
                converged_run: u8::from(self.curve(i).is_some()),
                final_relative: self
                    .curve(i)
                    .and_then(|c| c.last())
                    .map_or(f64::NAN, |p| p.1),
                selected: u8::from(self.selected(i)),
            })
            .collect();
        let grid_csv = dir.join("gamma_grid.csv");
        write_checked_csv(
            &grid_csv,
            &grid,
            &["n", "gamma", "converged_run", "selected"],
            &["topology", "compressor", "final_relative"],
        )
    }

    /// Writes consensus.csv: the curves of the selected settings (every round up to 100,
    /// then every 10th: the CSV stays small enough to commit) with the theory lines.
    fn write_curves(&self, dir: &Path) -> anyhow::Result<()> {
        let mut rows = Vec::new();
        for (i, pts) in &self.curves {
            let s = &self.settings[*i];
            if !self.selected(*i) {
                continue;
            }
            for &(round, relative, bits) in pts.iter().filter(|p| p.0 <= 100 || p.0 % 10 == 0) {
                let (bound, spectral_mean) = self.spectra.theory(s.topology, s.n, round);
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
        )
    }
}

/// The two charts of one topology and n: Ξ²(t)/Ξ²(0) against rounds and against bits.
struct TopologyCharts {
    by_round: Chart,
    by_bits: Chart,
}

impl TopologyCharts {
    /// Empty charts for topology `t` at n peers.
    fn new(t: &str, n: usize) -> TopologyCharts {
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
        TopologyCharts { by_round, by_bits }
    }
}

/// The largest factor between a measured curve and the prediction `f` over t ≤ 50, either
/// way.
fn worst_ratio(pts: &Curve, f: &dyn Fn(u64) -> f64) -> f64 {
    pts.iter()
        // Above f32's floor: Ξ² of vectors stored in f32 stops near 1e-14.
        .filter(|p| p.0 >= 1 && p.0 <= 50 && f(p.0) >= 1e-10)
        .map(|p| {
            let r = p.1 / f(p.0);
            r.max(1.0 / r)
        })
        .fold(1.0f64, f64::max)
}

/// The plots and the two tables of summary.md, drawn topology by topology.
struct Report<'a> {
    outcome: &'a Outcome<'a>,
    dir: &'a Path,
    /// Rounds of the exact gossip runs (the length of the bound's line).
    exact_rounds: u64,
    exact_table: Vec<Vec<String>>,
    choco_table: Vec<Vec<String>>,
}

impl Report<'_> {
    /// Draws every chart and fills both tables: per n, the overview of exact gossip and
    /// each topology's charts.
    fn draw(&mut self) -> anyhow::Result<()> {
        for n in [16usize, 64] {
            let mut overview =
                Chart::new(format!("Exact gossip, n = {n}"), "round t", "Ξ²(t) / Ξ²(0)");
            overview.log_y = true;
            overview.legend = SeriesLabelPosition::LowerLeft;
            for (ci, t) in TOPOLOGIES.iter().enumerate() {
                self.draw_topology(t, n, ci, &mut overview)?;
            }
            overview.save(&self.dir.join(format!("exact_gossip_n{n}")))?;
        }
        Ok(())
    }

    /// Topology `t` at n peers (colour `ci` in the overview): its two charts, its rows of
    /// both tables, and the check that the slowest mode decays as |λ₂|^2t.
    fn draw_topology(
        &mut self,
        t: &'static str,
        n: usize,
        ci: usize,
        overview: &mut Chart,
    ) -> anyhow::Result<()> {
        let mut charts = TopologyCharts::new(t, n);
        let ratios = self.draw_exact(t, n, ci, overview, &mut charts);
        self.draw_bound(t, n, ci, overview, &mut charts);
        self.draw_choco(t, n, &mut charts);
        self.exact_row(t, n, &ratios)?;
        charts
            .by_round
            .save(&self.dir.join(format!("{t}_n{n}_vs_round")))?;
        charts
            .by_bits
            .save(&self.dir.join(format!("{t}_n{n}_vs_bits")))?;
        Ok(())
    }

    /// Exact gossip's curves from both starts; returns, per start drawn, the largest
    /// factor off |λ₂|^2t and off the spectral mean.
    fn draw_exact(
        &self,
        t: &'static str,
        n: usize,
        ci: usize,
        overview: &mut Chart,
        charts: &mut TopologyCharts,
    ) -> Vec<(f64, f64)> {
        let spectra = &self.outcome.spectra;
        let mut ratios = Vec::new();
        for init in ["uniform", "slowest-mode"] {
            let Some(pts) = self
                .outcome
                .find("exact", t, n, init, "none")
                .and_then(|i| self.outcome.curve(i))
            else {
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
            charts
                .by_round
                .series
                .push(Series::line(label.clone(), colour, rp).stroke(stroke));
            charts
                .by_bits
                .series
                .push(Series::line(label, colour, bp).stroke(stroke));
            ratios.push((
                worst_ratio(pts, &|r| spectra.theory(t, n, r).0),
                worst_ratio(pts, &|r| spectra.theory(t, n, r).1),
            ));
        }
        ratios
    }

    /// The bound |λ₂|^2t, in the overview and against rounds.
    fn draw_bound(
        &self,
        t: &'static str,
        n: usize,
        ci: usize,
        overview: &mut Chart,
        charts: &mut TopologyCharts,
    ) {
        let bound: Vec<(f64, f64)> = (0..=self.exact_rounds)
            .map(|r| (r as f64, self.outcome.spectra.theory(t, n, r).0))
            .collect();
        overview
            .series
            .push(Series::line(format!("{t} |λ₂|^2t"), ci, bound.clone()).stroke(Stroke::Dashed));
        charts
            .by_round
            .series
            .push(Series::line("|λ₂|^2t", 7, bound).stroke(Stroke::Dashed));
    }

    /// Each compressor's curve at its best γ, and its row of the CHOCO table.
    fn draw_choco(&mut self, t: &'static str, n: usize, charts: &mut TopologyCharts) {
        for (k, (c, label)) in COMPRESSORS.iter().enumerate() {
            let Some(&(i, last)) = self.outcome.best.get(&(t, n, *c)) else {
                continue;
            };
            let Some(pts) = self.outcome.curve(i) else {
                continue;
            };
            let g = self.outcome.settings[i].gamma;
            let name = format!("CHOCO {label} (γ = {g})");
            charts.by_round.series.push(Series::line(
                name.clone(),
                k + 1,
                pts.iter().map(|p| (p.0 as f64, p.1)).collect(),
            ));
            charts.by_bits.series.push(Series::line(
                name,
                k + 1,
                pts.iter().map(|p| (p.2, p.1)).collect(),
            ));
            let to = pts.iter().find(|p| p.1 <= TARGET);
            self.choco_table.push(vec![
                t.to_string(),
                n.to_string(),
                label.to_string(),
                format!("{g}"),
                format!("{last:.2e}"),
                to.map_or("—".into(), |p| p.0.to_string()),
                to.map_or("—".into(), |p| format!("{:.3e}", p.2)),
            ]);
        }
    }

    /// The row of the exact gossip table; from the slowest mode the measured curve must
    /// be the bound (module doc) within a factor 2.
    fn exact_row(
        &mut self,
        t: &'static str,
        n: usize,
        ratios: &[(f64, f64)],
    ) -> anyhow::Result<()> {
        let l2 = self.outcome.spectra.lambda2(t, n);
        let exact_rounds = self.exact_rounds;
        if l2 > 1e-9 {
            let exact_to = self
                .outcome
                .find("exact", t, n, "uniform", "none")
                .and_then(|i| self.outcome.curve(i))
                .and_then(|p| p.iter().find(|q| q.1 <= TARGET).copied());
            self.exact_table.push(vec![
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
            self.exact_table.push(vec![
                t.to_string(),
                n.to_string(),
                "0 (W = J/n)".into(),
                "—".into(),
                "—".into(),
                "1".into(),
                "—".into(),
            ]);
        }
        Ok(())
    }

    /// Writes summary.md: both tables and the runs that failed.
    fn write_summary(&self, choco_rounds: u64, failed: &[String]) -> anyhow::Result<()> {
        let mut summary = String::new();
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
            &self.exact_table,
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
            &self.choco_table,
        );
        if !failed.is_empty() {
            summary += &format!(
                "\nRuns that failed or diverged (not drawn): {}\n",
                failed.join("; ")
            );
        }
        std::fs::write(self.dir.join("summary.md"), summary)?;
        Ok(())
    }
}
