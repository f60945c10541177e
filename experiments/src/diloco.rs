//! `diloco`: the DiLoCo family against data-parallel training on the language model.
//! 8 simulated peers train the byte-level transformer on the embedded King James Bible
//! (AdamW, cosine schedule) with every-step all-reduce (data-parallel), D-PSGD on a ring,
//! local SGD with model averaging every H = 50 steps, DiLoCo (Douillard et al. 2023) with
//! H ∈ {10, 50, 200}, DiLoCo with 8-bit (`int8`, and `qsgd:127` for comparison) and
//! top-10% pseudo-gradients, SparseLoCo (Sarfi et al. 2025: top 1/64 and 3% of each chunk of
//! 4096 at H = 50, and 30% at H = 100, at 2 bits with Rice-coded positions, all-gathered,
//! decayed error feedback, outer SGD), decentralized DiLoCo on a ring (NoLoCo's form), and
//! Streaming DiLoCo (Douillard et al. 2025: 4 fragments synced at staggered steps, each
//! applied one step later, merged with α = 0.5) raw, with int8 and with SparseLoCo's 30%
//! at H = 100: validation loss in bits per byte
//! against the epoch, the bytes sent per peer, and simulated wall time at 100 Mb/s and
//! 1 Gb/s, with the share of the communication hidden behind compute at 100 Mb/s
//! (1 − wait / communicate).
//!
//! Every run sees the same tokens in the same order per peer (same seed, same shards) and
//! the same compute time per step, measured once with `murmur bench` and passed as
//! `--compute-ms`. The training runs simulate 100 Mb/s links (1 ms latency); the 1 Gb/s
//! times come from `murmur simulate --timing-only` of the same configuration (the schedule
//! does not depend on the values). Loss is of the averaged model x̄ = (1/n) Σ x_i, which
//! for all-reduce and DiLoCo is every peer's model.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::chart::{Chart, Series, SeriesLabelPosition, Stroke};
use crate::runner::{json_f64, parse_json, Ctx, Job};
use crate::table::{markdown, write_checked_csv, Table};

/// (id, label, the run's own arguments), in plot order.
const RUNS: [(&str, &str, &[&str]); 16] = [
    (
        "allreduce",
        "all-reduce (every step)",
        &["--algorithm=allreduce"],
    ),
    (
        "dpsgd",
        "D-PSGD ring",
        &["--algorithm=dpsgd", "--topology=ring"],
    ),
    (
        "local-avg-h50",
        "local-avg H=50",
        &["--algorithm=local-avg", "--local-steps=50"],
    ),
    (
        "diloco-h10",
        "DiLoCo H=10",
        &["--algorithm=diloco", "--local-steps=10"],
    ),
    (
        "diloco-h50",
        "DiLoCo H=50",
        &["--algorithm=diloco", "--local-steps=50"],
    ),
    (
        "diloco-h200",
        "DiLoCo H=200",
        &["--algorithm=diloco", "--local-steps=200"],
    ),
    (
        "diloco-h50-int8",
        "DiLoCo H=50 int8",
        &[
            "--algorithm=diloco",
            "--local-steps=50",
            "--compressor=int8",
        ],
    ),
    (
        "diloco-h50-qsgd8",
        "DiLoCo H=50 qsgd:127 (8 bits)",
        &[
            "--algorithm=diloco",
            "--local-steps=50",
            "--compressor=qsgd:127,bucket=128",
        ],
    ),
    (
        "diloco-h50-topk",
        "DiLoCo H=50 top-10% (η_out 0.3)",
        &[
            "--algorithm=diloco",
            "--local-steps=50",
            "--compressor=topk:0.1",
            "--outer-lr=0.3",
        ],
    ),
    (
        "diloco-h50-sparseloco",
        "SparseLoCo H=50 (1/64 of 4096, 2 bits)",
        &[
            "--algorithm=diloco",
            "--local-steps=50",
            "--compressor=sparseloco",
        ],
    ),
    (
        "diloco-h50-sparseloco3",
        "SparseLoCo H=50 (3% of 4096, 2 bits)",
        &[
            "--algorithm=diloco",
            "--local-steps=50",
            "--compressor=sparseloco:0.03",
        ],
    ),
    (
        "diloco-h100-sparseloco30",
        "SparseLoCo H=100 (30% of 4096, 2 bits)",
        &[
            "--algorithm=diloco",
            "--local-steps=100",
            "--compressor=sparseloco:0.3",
        ],
    ),
    (
        "diloco-gossip-h50",
        "DiLoCo-gossip H=50 ring",
        &[
            "--algorithm=diloco-gossip",
            "--local-steps=50",
            "--topology=ring",
        ],
    ),
    (
        "streaming-h50",
        "Streaming DiLoCo H=50 P=4 τ=1",
        &[
            "--algorithm=streaming-diloco",
            "--local-steps=50",
            "--fragments=4",
            "--tau=1",
        ],
    ),
    (
        "streaming-h100-sparseloco30",
        "Streaming SparseLoCo H=100 P=4 τ=1 (30%)",
        &[
            "--algorithm=streaming-diloco",
            "--local-steps=100",
            "--fragments=4",
            "--tau=1",
            "--compressor=sparseloco:0.3",
        ],
    ),
    (
        "streaming-h50-int8",
        "Streaming DiLoCo H=50 P=4 τ=1 int8",
        &[
            "--algorithm=streaming-diloco",
            "--local-steps=50",
            "--fragments=4",
            "--tau=1",
            "--compressor=int8",
        ],
    ),
];

/// What every run shares: the model, the optimizer and its schedule, the peers.
const COMMON: [&str; 7] = [
    "--peers=8",
    "--optimizer=adamw",
    "--lr=0.002",
    "--lr-schedule=cosine",
    "--warmup-rounds=20",
    "--seed=1",
    "--sample=0",
];

/// The full runs: the default transformer, 2 epochs.
const FULL: [&str; 2] = ["--model=transformer", "--epochs=2"];

/// The quick runs: a tiny transformer, 2 epochs of 8 rounds, H scaled down with them.
const QUICK: [&str; 3] = [
    "--model=transformer:layers=1,d_model=32,heads=2,context=16,d_ff=64",
    "--epochs=2",
    "--rounds-per-epoch=8",
];

/// One epoch of one run.
#[derive(Debug, Clone, Serialize)]
struct Row {
    run: String,
    epoch: u64,
    rounds: f64,
    avg_model_bits_per_byte: f64,
    mean_bits_per_byte: f64,
    bytes_sent_per_peer: f64,
    seconds_100mbps: f64,
    seconds_1gbps: f64,
    /// 1 − wait / communicate at 100 Mb/s (mean over peers, whole run so far).
    hidden_100mbps: f64,
}

/// The run's own arguments, with H divided by 25 (at least 1) in quick mode and the
/// fragments with it (at most H; τ = 1 needs H/P ≥ 1).
fn own_args(ctx: &Ctx, args: &[&str]) -> Vec<String> {
    let quick_h = |a: &str| -> Option<u64> {
        let h: u64 = a.strip_prefix("--local-steps=")?.parse().ok()?;
        Some((h / 25).max(1))
    };
    let h = args.iter().find_map(|a| quick_h(a));
    args.iter()
        .map(|a| {
            if !ctx.quick {
                return a.to_string();
            }
            if let Some(h) = quick_h(a) {
                return format!("--local-steps={h}");
            }
            match (a.strip_prefix("--fragments="), h) {
                (Some(p), Some(h)) => {
                    let p: u64 = p.parse().expect("a number in the table above");
                    format!("--fragments={}", p.min(h))
                }
                _ => a.to_string(),
            }
        })
        .collect()
}

/// Compute time of one training step of the run's model at batch 32, in ms, measured here.
fn measure_compute_ms(ctx: &Ctx, model: &str) -> anyhow::Result<f64> {
    let out = ctx.murmur(&Job::new(
        "bench transformer",
        [
            "bench",
            model,
            "--batch-size=32",
            "--steps=10",
            "--warmup=2",
            "--json",
        ],
    ))?;
    Ok(json_f64(&parse_json(out.as_bytes())?, "forward_backward_seconds")? * 1e3)
}

/// A column of [`Row`] to plot against.
type Field = fn(&Row) -> f64;

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("diloco")?;
    let runs = dir.join("runs");
    let size: &[&str] = if ctx.quick { &QUICK } else { &FULL };
    let compute_ms = compute_ms(ctx, &dir, size[0])?;
    ctx.run_all_ok("diloco", &jobs(ctx, &runs, size, compute_ms))?;
    let rows = read_rows(&runs)?;
    write_csv(&dir, &rows)?;
    plot(&dir, &rows)?;
    write_summary(&dir, &rows, size, compute_ms)
}

/// The compute time per step of `model`: measured here, or with `--reuse` the kept runs'
/// (so that they are timed on the same clock); saved in compute_ms.txt.
fn compute_ms(ctx: &Ctx, dir: &Path, model: &str) -> anyhow::Result<f64> {
    let saved = dir.join("compute_ms.txt");
    let compute_ms = match std::fs::read_to_string(&saved) {
        Ok(text) if ctx.reuse => text.trim().parse().context("compute_ms.txt")?,
        _ => {
            let ms = measure_compute_ms(ctx, model)?;
            std::fs::write(&saved, format!("{ms}\n"))?;
            ms
        }
    };
    eprintln!("[diloco] compute time per step (measured here): {compute_ms:.3} ms");
    Ok(compute_ms)
}

/// Per run: the training job at 100 Mb/s, then the 1 Gb/s timing-only job.
fn jobs(ctx: &Ctx, runs: &Path, size: &[&str], compute_ms: f64) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (id, _, own) in RUNS {
        let base = || {
            let mut a: Vec<String> = vec!["simulate".into()];
            a.extend(COMMON.iter().chain(size).map(|s| s.to_string()));
            a.extend(own_args(ctx, own));
            a.push(format!("--compute-ms={compute_ms}"));
            a
        };
        let mut train = base();
        train.extend(["--bandwidth-gbps=0.1".into(), "--latency-us=1000".into()]);
        jobs.push(Job::in_run(runs, id, train, Some("summary.json")));
        let mut timing = base();
        timing.extend([
            "--timing-only".into(),
            "--bandwidth-gbps=1".into(),
            "--latency-us=1000".into(),
        ]);
        jobs.push(Job::in_run(
            runs,
            &format!("{id}-timing-1gbps"),
            timing,
            Some("timing.csv"),
        ));
    }
    jobs
}

/// Every epoch of every run, with its time at 1 Gb/s.
fn read_rows(runs: &Path) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (id, _, _) in RUNS {
        let t = Table::read(&runs.join(id).join("epochs.csv"))?;
        let col = |c: &str| t.f64s(c);
        let (epochs, rounds, avg_loss, mean_bpb, bytes, wall) = (
            col("epoch")?,
            col("rounds")?,
            col("avg_model_test_loss")?,
            col("mean_test_bits_per_byte")?,
            col("bytes_sent_per_peer")?,
            col("wall_seconds")?,
        );
        let (communicate, wait) = (col("communicate_seconds")?, col("wait_seconds")?);
        let t1 = Table::read(&runs.join(format!("{id}-timing-1gbps")).join("timing.csv"))?
            .f64s("wall_seconds")?;
        anyhow::ensure!(
            t1.len() == epochs.len(),
            "{id}: {} epochs but {} timed at 1 Gb/s",
            epochs.len(),
            t1.len()
        );
        for k in 0..epochs.len() {
            rows.push(Row {
                run: id.to_string(),
                epoch: epochs[k] as u64,
                rounds: rounds[k],
                avg_model_bits_per_byte: avg_loss[k] / std::f64::consts::LN_2,
                mean_bits_per_byte: mean_bpb[k],
                bytes_sent_per_peer: bytes[k],
                seconds_100mbps: wall[k],
                seconds_1gbps: t1[k],
                hidden_100mbps: if communicate[k] > 0.0 {
                    1.0 - wait[k] / communicate[k]
                } else {
                    0.0
                },
            });
        }
    }
    Ok(rows)
}

/// Writes diloco.csv.
fn write_csv(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    write_checked_csv(
        &dir.join("diloco.csv"),
        rows,
        &[
            "epoch",
            "rounds",
            "avg_model_bits_per_byte",
            "mean_bits_per_byte",
            "bytes_sent_per_peer",
            "seconds_100mbps",
            "seconds_1gbps",
            "hidden_100mbps",
        ],
        &["run"],
    )
}

/// The averaged model's validation loss of every run against `x`.
fn chart(rows: &[Row], title: &str, x_label: &str, log_x: bool, x: Field) -> Chart {
    let mut c = Chart::new(
        format!("{title} — 8 peers, transformer on the KJV Bible"),
        x_label,
        "validation bits per byte (averaged model)",
    );
    c.log_x = log_x;
    c.legend = SeriesLabelPosition::UpperRight;
    for (i, (id, label, _)) in RUNS.iter().enumerate() {
        // Epoch 0 sent nothing and took no time: drawn only against epochs.
        let pts = rows
            .iter()
            .filter(|r| r.run == *id && (!log_x || x(r) > 0.0))
            .map(|r| (x(r), r.avg_model_bits_per_byte))
            .collect();
        // The palette has ten colours: the streaming runs, which reuse the first two,
        // are dashed.
        let stroke = if id.starts_with("streaming") {
            Stroke::Dashed
        } else {
            Stroke::Solid
        };
        c.series.push(Series::line(*label, i, pts).stroke(stroke));
    }
    c
}

/// Draws the loss against epochs, bytes sent and simulated time at 100 Mb/s and 1 Gb/s.
fn plot(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    for (c, name) in [
        (
            chart(rows, "Loss vs epoch", "epoch", false, |r| r.epoch as f64),
            "loss_vs_epoch",
        ),
        (
            chart(rows, "Loss vs bytes", "MB sent per peer", true, |r| {
                r.bytes_sent_per_peer / 1e6
            }),
            "loss_vs_bytes",
        ),
        (
            chart(
                rows,
                "Loss vs simulated time at 100 Mb/s",
                "simulated seconds (100 Mb/s, 1 ms)",
                true,
                |r| r.seconds_100mbps,
            ),
            "loss_vs_time_100mbps",
        ),
        (
            chart(
                rows,
                "Loss vs simulated time at 1 Gb/s",
                "simulated seconds (1 Gb/s, 1 ms)",
                true,
                |r| r.seconds_1gbps,
            ),
            "loss_vs_time_1gbps",
        ),
    ] {
        c.save(&dir.join(name))?;
    }
    Ok(())
}

/// One run's row of the table: its last epoch against all-reduce's (`base`).
fn table_row(label: &str, r: &Row, base: &Row) -> Vec<String> {
    vec![
        label.to_string(),
        format!("{:.3}", r.avg_model_bits_per_byte),
        format!(
            "{:+.1}%",
            100.0 * (r.avg_model_bits_per_byte / base.avg_model_bits_per_byte - 1.0)
        ),
        format!("{:.3}", r.mean_bits_per_byte),
        format!("{:.2}", r.bytes_sent_per_peer / 1e6),
        if r.bytes_sent_per_peer > 0.0 {
            format!("{:.0}×", base.bytes_sent_per_peer / r.bytes_sent_per_peer)
        } else {
            "—".into()
        },
        format!("{:.1}", r.seconds_100mbps),
        format!("{:.1}", r.seconds_1gbps),
        format!("{:.0}%", 100.0 * r.hidden_100mbps),
    ]
}

/// Writes summary.md: the last epoch of each run, against all-reduce's.
fn write_summary(dir: &Path, rows: &[Row], size: &[&str], compute_ms: f64) -> anyhow::Result<()> {
    let last = |id: &str| rows.iter().rfind(|r| r.run == id);
    let base = last("allreduce").context("the all-reduce run has no epochs")?;
    let mut table = Vec::new();
    for (id, label, _) in RUNS {
        let r = last(id).with_context(|| format!("the {id} run has no epochs"))?;
        table.push(table_row(label, r, base));
    }
    let summary = format!(
        "8 peers, {} for {} epochs ({} rounds), AdamW lr 0.002 with 20 warm-up rounds and a cosine schedule, \
         seed 1; compute time per step {compute_ms:.1} ms (measured here with `murmur bench`). Loss: validation \
         bits per byte after the last epoch; \"vs all-reduce\": relative to every-step all-reduce; \
         \"fewer bytes\": all-reduce's bytes per peer over this run's; \"hidden\": the share of the \
         communication time behind compute at 100 Mb/s, 1 − wait / communicate.\n\n{}",
        size[0].trim_start_matches("--model="),
        size[1].trim_start_matches("--epochs="),
        base.rounds,
        markdown(
            &[
                "run",
                "bits/byte x̄",
                "vs all-reduce",
                "bits/byte peers",
                "MB sent/peer",
                "fewer bytes",
                "s @100 Mb/s",
                "s @1 Gb/s",
                "hidden @100 Mb/s",
            ],
            &table,
        )
    );
    std::fs::write(dir.join("summary.md"), summary)?;
    Ok(())
}
