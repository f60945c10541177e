//! `convergence`: 16 simulated peers train the MLP on the embedded MNIST with IID and
//! non-IID (Dirichlet α = 0.1) shards, for every algorithm of `experiments/runs/convergence/`,
//! over several seeds: test accuracy and training loss vs epoch, vs bytes sent per peer and
//! vs simulated wall time at 1 Gb/s and 10 Gb/s.
//!
//! Every run uses one compute time per step, measured once with `murmur bench` and passed
//! as `--compute-ms`, so the algorithms are timed on the same clock. The training runs
//! simulate 1 Gb/s links (50 µs latency); the 10 Gb/s times come from `murmur simulate
//! --timing-only` of the same configuration (the same schedule; exact for fixed-size
//! frames, within 1% for top-k's varint-coded indices).
//!
//! Accuracy is reported two ways: of the averaged model x̄ = (1/n)Σx_i (what Lian et al.
//! 2017 and Koloskova et al. 2019 plot) and the mean over peers of each local model's.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::chart::{Chart, Series, SeriesLabelPosition};
use crate::runner::{json_f64, parse_json, Ctx, Job};
use crate::table::{markdown, mean_sd, write_checked_csv, Table};

/// (config file stem, label), in plot order.
const ALGORITHMS: [(&str, &str); 11] = [
    ("dpsgd", "D-PSGD"),
    ("gradient-tracking", "gradient tracking"),
    ("gradient-tracking-topk", "gradient tracking top-1%"),
    ("d2", "D²"),
    ("sgp", "SGP"),
    ("choco-topk", "CHOCO top-1%"),
    ("choco-sign", "CHOCO sign"),
    ("local-sgd-h4", "local-SGD H=4"),
    ("local-sgd-h16", "local-SGD H=16"),
    ("allreduce", "all-reduce"),
    ("ps", "PS (BSP)"),
];
/// (murmur's --partition, label).
const PARTITIONS: [(&str, &str); 2] = [
    ("iid", "IID"),
    ("dirichlet:0.1", "non-IID (Dirichlet α = 0.1)"),
];
/// The accuracy the summary reports time and bytes to.
const TARGET: f64 = 0.90;

/// One epoch of one run.
#[derive(Debug, Clone, Serialize)]
struct Row {
    partition: String,
    algorithm: String,
    seed: u64,
    epoch: u64,
    rounds: f64,
    avg_model_test_accuracy: f64,
    mean_test_accuracy: f64,
    min_test_accuracy: f64,
    mean_train_loss: f64,
    bytes_sent_per_peer: f64,
    seconds_1gbps: f64,
    seconds_10gbps: f64,
}

/// Compute time of one MLP forward/backward step at batch 32, in ms, measured here.
fn measure_compute_ms(ctx: &Ctx) -> anyhow::Result<f64> {
    let out = ctx.murmur(&Job::new(
        "bench mlp",
        [
            "bench",
            "--model=mlp",
            "--batch-size=32",
            "--steps=30",
            "--warmup=5",
            "--json",
        ],
    ))?;
    Ok(json_f64(&parse_json(out.as_bytes())?, "forward_backward_seconds")? * 1e3)
}

/// One training run: (partition, algorithm, seed, run id).
type Key = (&'static str, &'static str, u64, String);

/// A column of [`Row`] to aggregate or plot against.
type Field = fn(&Row) -> f64;

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("convergence")?;
    let runs = dir.join("runs");
    let seeds: &[u64] = if ctx.quick { &[1] } else { &[1, 2, 3] };
    let quick_args: &[&str] = if ctx.quick {
        &["--epochs=2", "--rounds-per-epoch=4"]
    } else {
        &[]
    };
    let compute_ms = compute_ms(ctx, &dir)?;
    let setup = Setup {
        ctx,
        runs: &runs,
        seeds,
        quick_args,
        compute_ms,
    };
    let (jobs, keys) = setup.jobs()?;
    ctx.run_all_ok("convergence", &jobs)?;

    let rows = read_rows(&runs, &keys)?;
    write_csv(&dir, &rows)?;
    let mut summary = format!(
        "Compute time per step (MLP, batch 32, measured on this machine with `murmur bench`): {compute_ms:.3} ms. \
         Seeds: {seeds:?}. Accuracy: x̄ = test accuracy of the averaged model; peers = mean of the peers' own models. \
         Mean ± standard deviation over seeds; \"to 90%\": the first epoch at which x̄ reaches 90%, averaged over the seeds that reach it.\n\n"
    );
    for (part, plabel) in PARTITIONS {
        let plots = PartitionPlots {
            dir: &dir,
            rows: &rows,
            part,
            plabel,
            quick: ctx.quick,
        };
        plots.draw()?;
        let table = partition_table(&rows, part, seeds);
        summary += &format!("### {plabel}\n\n");
        summary += &markdown(
            &[
                "algorithm",
                "final acc x̄ (%)",
                "final acc peers (%)",
                "MB sent/peer (all epochs)",
                "epochs to 90%",
                "MB/peer to 90%",
                "s to 90% @1 Gb/s",
                "s to 90% @10 Gb/s",
            ],
            &table,
        );
        summary += "\n";
    }
    std::fs::write(dir.join("summary.md"), summary)?;
    Ok(())
}

/// The compute time per step: measured here, or with `--reuse` the kept runs' (so that
/// they are timed on the same clock); saved in compute_ms.txt.
fn compute_ms(ctx: &Ctx, dir: &Path) -> anyhow::Result<f64> {
    let saved = dir.join("compute_ms.txt");
    let compute_ms = match std::fs::read_to_string(&saved) {
        Ok(text) if ctx.reuse => text.trim().parse().context("compute_ms.txt")?,
        _ => {
            let ms = measure_compute_ms(ctx)?;
            std::fs::write(&saved, format!("{ms}\n"))?;
            ms
        }
    };
    eprintln!(
        "[convergence] compute time per step (MLP, batch 32, measured here): {compute_ms:.3} ms"
    );
    Ok(compute_ms)
}

/// What every run shares: the run folder, the seeds, the `--quick` arguments and the
/// compute time per step.
struct Setup<'a> {
    ctx: &'a Ctx,
    runs: &'a Path,
    seeds: &'a [u64],
    quick_args: &'a [&'a str],
    compute_ms: f64,
}

impl Setup<'_> {
    /// The training run of every (partition, algorithm, seed), then the 10 Gb/s schedule
    /// of each algorithm; with the keys of the training runs.
    fn jobs(&self) -> anyhow::Result<(Vec<Job>, Vec<Key>)> {
        let (ctx, compute_ms) = (self.ctx, self.compute_ms);
        let mut jobs = Vec::new();
        let mut keys = Vec::new();
        for (part, _) in PARTITIONS {
            for (algo, _) in ALGORITHMS {
                for &seed in self.seeds {
                    let id = format!("{algo}-{}-s{seed}", part.replace(':', ""));
                    let mut a = vec![
                        "simulate".to_string(),
                        "--config".into(),
                        ctx.file(&format!("runs/convergence/{algo}.toml"))?,
                        format!("--partition={part}"),
                        format!("--seed={seed}"),
                        "--bandwidth-gbps=1".into(),
                        format!("--compute-ms={compute_ms}"),
                    ];
                    a.extend(self.quick_args.iter().map(|s| s.to_string()));
                    jobs.push(Job::in_run(self.runs, &id, a, Some("summary.json")));
                    keys.push((part, algo, seed, id));
                }
            }
        }
        // The 10 Gb/s schedule of each algorithm (it does not depend on the data or seed).
        for (algo, _) in ALGORITHMS {
            let id = format!("{algo}-timing-10gbps");
            let mut a = vec![
                "simulate".to_string(),
                "--config".into(),
                ctx.file(&format!("runs/convergence/{algo}.toml"))?,
                "--timing-only".into(),
                "--bandwidth-gbps=10".into(),
                format!("--compute-ms={compute_ms}"),
            ];
            a.extend(self.quick_args.iter().map(|s| s.to_string()));
            jobs.push(Job::in_run(self.runs, &id, a, Some("timing.csv")));
        }
        Ok((jobs, keys))
    }
}

/// The simulated wall time at the end of each epoch at 10 Gb/s, per algorithm.
fn read_timing10(runs: &Path) -> anyhow::Result<BTreeMap<&'static str, Vec<f64>>> {
    let mut timing10: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (algo, _) in ALGORITHMS {
        let t = Table::read(
            &runs
                .join(format!("{algo}-timing-10gbps"))
                .join("timing.csv"),
        )?;
        timing10.insert(algo, t.f64s("wall_seconds")?);
    }
    Ok(timing10)
}

/// Every epoch of every training run, with its time at 10 Gb/s.
fn read_rows(runs: &Path, keys: &[Key]) -> anyhow::Result<Vec<Row>> {
    let timing10 = read_timing10(runs)?;
    let mut rows = Vec::new();
    for (part, algo, seed, id) in keys {
        let t = Table::read(&runs.join(id).join("epochs.csv"))?;
        let epochs = t.f64s("epoch")?;
        let cols = |c: &str| t.f64s(c);
        let (rounds, xbar, mean, min, loss, bytes, wall) = (
            cols("rounds")?,
            cols("avg_model_test_accuracy")?,
            cols("mean_test_accuracy")?,
            cols("min_test_accuracy")?,
            cols("mean_train_loss")?,
            cols("bytes_sent_per_peer")?,
            cols("wall_seconds")?,
        );
        let t10 = &timing10[algo];
        anyhow::ensure!(
            t10.len() == epochs.len(),
            "{id}: {} epochs but {} timed at 10 Gb/s",
            epochs.len(),
            t10.len()
        );
        for k in 0..epochs.len() {
            rows.push(Row {
                partition: part.to_string(),
                algorithm: algo.to_string(),
                seed: *seed,
                epoch: epochs[k] as u64,
                rounds: rounds[k],
                avg_model_test_accuracy: xbar[k],
                mean_test_accuracy: mean[k],
                min_test_accuracy: min[k],
                mean_train_loss: loss[k],
                bytes_sent_per_peer: bytes[k],
                seconds_1gbps: wall[k],
                seconds_10gbps: t10[k],
            });
        }
    }
    Ok(rows)
}

/// Writes convergence.csv.
fn write_csv(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let csv = dir.join("convergence.csv");
    write_checked_csv(
        &csv,
        rows,
        &[
            "seed",
            "epoch",
            "rounds",
            "avg_model_test_accuracy",
            "mean_test_accuracy",
            "min_test_accuracy",
            "mean_train_loss",
            "bytes_sent_per_peer",
            "seconds_1gbps",
            "seconds_10gbps",
        ],
        &["partition", "algorithm"],
    )
}

/// Mean and spread over seeds of `f`, per epoch of (partition, algorithm): (mean epoch,
/// mean, lowest, highest).
fn agg(rows: &[Row], part: &str, algo: &str, f: Field) -> Vec<(f64, f64, f64, f64)> {
    let mut by_epoch: BTreeMap<u64, Vec<&Row>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.partition == part && r.algorithm == algo)
    {
        by_epoch.entry(r.epoch).or_default().push(r);
    }
    by_epoch
        .values()
        .map(|rs| {
            let v: Vec<f64> = rs.iter().map(|r| f(r)).collect();
            let x = rs.iter().map(|r| r.epoch as f64).sum::<f64>() / rs.len() as f64;
            let (m, _) = mean_sd(&v);
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &y| {
                    (a.min(y), b.max(y))
                });
            (x, m, lo, hi)
        })
        .collect()
}

/// The mean over seeds of `f`, per epoch of (partition, algorithm).
fn xs(rows: &[Row], part: &str, algo: &str, f: Field) -> Vec<f64> {
    agg(rows, part, algo, f).iter().map(|p| p.1).collect()
}

/// The plots of one partition.
struct PartitionPlots<'a> {
    dir: &'a Path,
    rows: &'a [Row],
    /// murmur's --partition.
    part: &'a str,
    /// Its label.
    plabel: &'a str,
    quick: bool,
}

impl PartitionPlots<'_> {
    /// Draws the accuracy charts, the peers' own accuracy and the training loss.
    fn draw(&self) -> anyhow::Result<()> {
        let slug = if self.part == "iid" { "iid" } else { "noniid" };
        let charts = [
            (
                self.acc_chart("Accuracy vs epoch", "epoch", false, |r| r.epoch as f64),
                "accuracy_vs_epoch",
            ),
            (
                self.acc_chart("Accuracy vs bytes", "MB sent per peer", true, |r| {
                    r.bytes_sent_per_peer / 1e6
                }),
                "accuracy_vs_bytes",
            ),
            (
                self.acc_chart(
                    "Accuracy vs simulated time at 1 Gb/s",
                    "simulated seconds (1 Gb/s, 50 µs)",
                    true,
                    |r| r.seconds_1gbps,
                ),
                "accuracy_vs_time_1gbps",
            ),
            (
                self.acc_chart(
                    "Accuracy vs simulated time at 10 Gb/s",
                    "simulated seconds (10 Gb/s, 50 µs)",
                    true,
                    |r| r.seconds_10gbps,
                ),
                "accuracy_vs_time_10gbps",
            ),
        ];
        for (c, name) in charts {
            c.save(&self.dir.join(format!("{slug}_{name}")))?;
        }
        self.draw_local_and_loss(slug)
    }

    /// The averaged model's accuracy of every algorithm against `x` (mean over seeds, the
    /// seeds' range as a band).
    fn acc_chart(&self, title: &str, x_label: &str, log_x: bool, x: Field) -> Chart {
        let (rows, part) = (self.rows, self.part);
        let mut c = Chart::new(
            format!("{title} — {}, 16 peers, MLP", self.plabel),
            x_label,
            "test accuracy of the averaged model",
        );
        c.log_x = log_x;
        c.legend = SeriesLabelPosition::LowerRight;
        c.y_range = Some(if self.quick { (0.0, 1.0) } else { (0.5, 1.0) });
        for (i, (algo, label)) in ALGORITHMS.iter().enumerate() {
            let acc = agg(rows, part, algo, |r| r.avg_model_test_accuracy);
            let xv = xs(rows, part, algo, x);
            let pts = xv.iter().zip(&acc).map(|(&x, a)| (x, a.1)).collect();
            let band = xv.iter().zip(&acc).map(|(&x, a)| (x, a.2, a.3)).collect();
            c.series.push(Series::line(*label, i, pts).band(band));
        }
        c
    }

    /// The mean accuracy of the peers' own models and the training loss, against epochs.
    fn draw_local_and_loss(&self, slug: &str) -> anyhow::Result<()> {
        let plabel = self.plabel;
        let mut local = Chart::new(
            format!("Mean accuracy of the peers' own models — {plabel}"),
            "epoch",
            "mean test accuracy over peers",
        );
        local.legend = SeriesLabelPosition::LowerRight;
        local.y_range = Some(if self.quick { (0.0, 1.0) } else { (0.5, 1.0) });
        let mut loss = Chart::new(
            format!("Training loss — {plabel}"),
            "epoch",
            "mean training loss",
        );
        loss.log_y = true;
        loss.y_floor = 1e-4;
        for (i, (algo, label)) in ALGORITHMS.iter().enumerate() {
            for (chart, f) in [
                (&mut local, (|r: &Row| r.mean_test_accuracy) as Field),
                (&mut loss, |r: &Row| r.mean_train_loss),
            ] {
                // Epoch 0's loss is of the initial model before any step: drawn too.
                let a = agg(self.rows, self.part, algo, f);
                chart.series.push(
                    Series::line(*label, i, a.iter().map(|p| (p.0, p.1)).collect())
                        .band(a.iter().map(|p| (p.0, p.2, p.3)).collect()),
                );
            }
        }
        local.save(&self.dir.join(format!("{slug}_peer_accuracy_vs_epoch")))?;
        loss.save(&self.dir.join(format!("{slug}_loss_vs_epoch")))?;
        Ok(())
    }
}

/// The summary table of one partition: a row per algorithm.
fn partition_table(rows: &[Row], part: &str, seeds: &[u64]) -> Vec<Vec<String>> {
    ALGORITHMS
        .iter()
        .map(|&(algo, label)| algorithm_row(rows, part, algo, label, seeds))
        .collect()
}

/// One algorithm's row: final accuracy (x̄ and peers, mean ± sd over seeds), bytes sent,
/// and the epochs, bytes and simulated seconds to 90%.
fn algorithm_row(rows: &[Row], part: &str, algo: &str, label: &str, seeds: &[u64]) -> Vec<String> {
    let mut finals = (Vec::new(), Vec::new());
    let mut reached = Vec::new();
    let mut last_bytes = 0.0;
    for &seed in seeds {
        let rs: Vec<&Row> = rows
            .iter()
            .filter(|r| r.partition == part && r.algorithm == algo && r.seed == seed)
            .collect();
        let Some(last) = rs.last() else { continue };
        finals.0.push(last.avg_model_test_accuracy);
        finals.1.push(last.mean_test_accuracy);
        last_bytes = last.bytes_sent_per_peer;
        if let Some(r) = rs.iter().find(|r| r.avg_model_test_accuracy >= TARGET) {
            reached.push((
                r.epoch as f64,
                r.bytes_sent_per_peer,
                r.seconds_1gbps,
                r.seconds_10gbps,
            ));
        }
    }
    let (xm, xs_) = mean_sd(&finals.0);
    let (pm, ps_) = mean_sd(&finals.1);
    let to = |f: fn(&(f64, f64, f64, f64)) -> f64, fmt: &dyn Fn(f64) -> String| -> String {
        if reached.is_empty() {
            "not reached".into()
        } else {
            let m = reached.iter().map(f).sum::<f64>() / reached.len() as f64;
            let suffix = if reached.len() < seeds.len() {
                format!(" ({}/{} seeds)", reached.len(), seeds.len())
            } else {
                String::new()
            };
            format!("{}{suffix}", fmt(m))
        }
    };
    vec![
        label.to_string(),
        format!("{:.2} ± {:.2}", 100.0 * xm, 100.0 * xs_),
        format!("{:.2} ± {:.2}", 100.0 * pm, 100.0 * ps_),
        format!("{:.1}", last_bytes / 1e6),
        to(|r| r.0, &|v| format!("{v:.1}")),
        to(|r| r.1, &|v| format!("{:.1}", v / 1e6)),
        to(|r| r.2, &|v| format!("{v:.3}")),
        to(|r| r.3, &|v| format!("{v:.3}")),
    ]
}
