//! The pictures of a run folder: what `launch` and `simulate` write into `<run>/plots/` at
//! the end of a run, and what `murmur plot RUN…` draws for one or several run folders on
//! shared axes. Drawn with [`super::chart`], the experiment drivers' plotting code.
//!
//! A run folder holds one of three records, and each has its charts (PNG and SVG):
//!
//! | record | charts |
//! |---|---|
//! | `epochs.jsonl` (training: `launch`, `peer`, `simulate`) | `accuracy` (language model: `bits_per_byte`), the same against MB sent (`…_vs_bytes`) and against seconds (`…_vs_time`), `loss`, `consensus` (Ξ² per epoch), `time` (compute, communicate and wait per epoch) |
//! | `consensus.csv` (`simulate --consensus`) | `consensus` (Ξ²(t)/Ξ²(0) per round), `consensus_vs_bits` |
//! | `timing.csv` (`simulate --timing-only`) | `time` |

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

use super::chart::{self, Chart, Series, SeriesLabelPosition, Stroke};
use super::{ConsensusRow, EpochRow, TimingRow};

/// What a run folder recorded.
#[derive(Debug, Clone)]
pub enum Record {
    /// A training run: `epochs.jsonl`, one row per epoch from epoch 0.
    Training(Vec<EpochRow>),
    /// `simulate --consensus`: `consensus.csv`, one row per round from round 0.
    Consensus(Vec<ConsensusRow>),
    /// `simulate --timing-only`: `timing.csv`, one row per epoch.
    Timing(Vec<TimingRow>),
}

impl Record {
    fn kind(&self) -> &'static str {
        match self {
            Record::Training(_) => "a training run (epochs.jsonl)",
            Record::Consensus(_) => "a consensus run (consensus.csv)",
            Record::Timing(_) => "a timing run (timing.csv)",
        }
    }
}

/// One run folder, read.
#[derive(Debug, Clone)]
pub struct Run {
    /// The name its series carry when several runs share a chart.
    pub label: String,
    /// Its record.
    pub record: Record,
}

/// Reads the run folder `dir`: `epochs.jsonl`, else `consensus.csv`, else `timing.csv`.
///
/// # Errors
/// None of the three files, a file that does not parse, or one without a row.
pub fn load(dir: &Path) -> anyhow::Result<Run> {
    let label = dir
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
    let epochs = dir.join("epochs.jsonl");
    let consensus = dir.join("consensus.csv");
    let timing = dir.join("timing.csv");
    let record = if epochs.is_file() {
        let text = std::fs::read_to_string(&epochs)
            .with_context(|| format!("reading {}", epochs.display()))?;
        let rows = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .with_context(|| format!("{} line {}", epochs.display(), i + 1))
            })
            .collect::<anyhow::Result<Vec<EpochRow>>>()?;
        Record::Training(rows)
    } else if consensus.is_file() {
        Record::Consensus(read_csv(&consensus)?)
    } else if timing.is_file() {
        Record::Timing(read_csv(&timing)?)
    } else if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    } else {
        bail!(
            "{} is not a run folder: it has no epochs.jsonl, consensus.csv or timing.csv",
            dir.display()
        );
    };
    let empty = match &record {
        Record::Training(r) => r.is_empty(),
        Record::Consensus(r) => r.is_empty(),
        Record::Timing(r) => r.is_empty(),
    };
    if empty {
        bail!("{} has no row yet: {}", dir.display(), record.kind());
    }
    Ok(Run { label, record })
}

fn read_csv<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    reader
        .deserialize()
        .enumerate()
        .map(|(i, r)| r.with_context(|| format!("{} row {}", path.display(), i + 1)))
        .collect()
}

/// Draws `runs` into the folder `out` (made if missing), several runs on shared axes with
/// one colour per run; returns the files written (PNG and SVG of each chart).
///
/// # Errors
/// No run; runs of different records (a training run and a consensus run share no axis);
/// no font for the text ([`chart::init_fonts`]); a file that cannot be written.
pub fn draw(runs: &[Run], out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let first = runs.first().ok_or_else(|| anyhow!("no run to draw"))?;
    if let Some(other) = runs
        .iter()
        .find(|r| std::mem::discriminant(&r.record) != std::mem::discriminant(&first.record))
    {
        bail!(
            "{} is {} and {} is {}: they share no axis",
            first.label,
            first.record.kind(),
            other.label,
            other.record.kind()
        );
    }
    chart::init_fonts()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let labels = labels(runs);
    // Every run has the first run's record (checked above), so each list has them all.
    let charts = match &first.record {
        Record::Training(_) => {
            let rows: Vec<&[EpochRow]> = runs
                .iter()
                .filter_map(|r| match &r.record {
                    Record::Training(rows) => Some(rows.as_slice()),
                    _ => None,
                })
                .collect();
            training_charts(&labels, &rows)
        }
        Record::Consensus(_) => {
            let rows: Vec<&[ConsensusRow]> = runs
                .iter()
                .filter_map(|r| match &r.record {
                    Record::Consensus(rows) => Some(rows.as_slice()),
                    _ => None,
                })
                .collect();
            consensus_charts(&labels, &rows)
        }
        Record::Timing(_) => {
            let times: Vec<Vec<EpochTime>> = runs
                .iter()
                .filter_map(|r| match &r.record {
                    Record::Timing(rows) => Some(per_epoch(rows.iter().map(|t| {
                        (
                            t.epoch,
                            t.compute_seconds,
                            t.communicate_seconds,
                            t.wait_seconds,
                        )
                    }))),
                    _ => None,
                })
                .collect();
            vec![("time", time_chart(&labels, &times))]
        }
    };
    let mut written = Vec::new();
    for (stem, c) in charts {
        written.extend(c.save(&out.join(stem))?);
    }
    Ok(written)
}

/// Draws the run folder `dir` into `dir/plots/`; returns the files written.
///
/// # Errors
/// As [`load`] and [`draw`].
pub fn draw_run(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    draw(&[load(dir)?], &dir.join("plots"))
}

/// The end of a run (`launch`, `simulate`): draws `dir/plots/` and says where, or says on
/// standard error why there are no plots (no font, say) without failing the run.
pub(crate) fn after_run(dir: &Path) {
    match draw_run(dir) {
        Ok(files) => println!(
            "plots: {} ({} charts, PNG and SVG)",
            dir.join("plots").display(),
            files.len() / 2
        ),
        Err(e) => eprintln!("murmur: no plots for {}: {e:#}", dir.display()),
    }
}

/// Each run's legend name: its folder's name, or its whole path where two names collide.
fn labels(runs: &[Run]) -> Vec<String> {
    runs.iter()
        .enumerate()
        .map(|(i, r)| {
            let clash = runs
                .iter()
                .enumerate()
                .any(|(j, o)| j != i && o.label == r.label);
            if clash {
                format!("{} ({})", r.label, i + 1)
            } else {
                r.label.clone()
            }
        })
        .collect()
}

/// `name` alone for one run, `run: name` for several.
fn series_name(labels: &[String], run: usize, name: &str) -> String {
    if labels.len() == 1 {
        name.to_string()
    } else {
        format!("{}: {name}", labels[run])
    }
}

/// The colour of a series: by role for one run, by run for several.
fn colour(labels: &[String], run: usize, role: usize) -> usize {
    if labels.len() == 1 {
        role
    } else {
        run
    }
}

/// A number of an epoch row.
type Metric = fn(&EpochRow) -> f64;

/// The charts of training runs.
fn training_charts(labels: &[String], runs: &[&[EpochRow]]) -> Vec<(&'static str, Chart)> {
    let lm = runs
        .iter()
        .all(|rows| rows.iter().any(|r| r.mean_test_bits_per_byte.is_some()));
    // The quality of a model: accuracy (%) for the classifiers, bits per byte for the
    // language model (lower is better).
    let (stem, what, peers_q, avg_q): (&str, &str, Metric, Metric) = if lm {
        (
            "bits_per_byte",
            "test loss (bits per byte)",
            |r| r.mean_test_loss / std::f64::consts::LN_2,
            |r| r.avg_model_test_loss / std::f64::consts::LN_2,
        )
    } else {
        (
            "accuracy",
            "test accuracy (%)",
            |r| 100.0 * r.mean_test_accuracy,
            |r| 100.0 * r.avg_model_test_accuracy,
        )
    };
    let legend = if lm {
        SeriesLabelPosition::UpperRight
    } else {
        SeriesLabelPosition::LowerRight
    };
    let quality = |x_label: &str, x: fn(&EpochRow) -> f64, title: &str| {
        let mut c = Chart::new(title, x_label, what);
        c.legend = legend.clone();
        c.x_integer = x_label == "epoch";
        for (i, rows) in runs.iter().enumerate() {
            let mut peers = Series::line(
                series_name(labels, i, "peers' models (mean)"),
                colour(labels, i, 0),
                rows.iter().map(|r| (x(r), peers_q(r))).collect(),
            );
            if runs.len() == 1 && !lm {
                peers = peers.band(
                    rows.iter()
                        .map(|r| {
                            (
                                x(r),
                                100.0 * r.min_test_accuracy,
                                100.0 * r.max_test_accuracy,
                            )
                        })
                        .collect(),
                );
            }
            c.series.push(peers);
            c.series.push(
                Series::line(
                    series_name(labels, i, "averaged model"),
                    colour(labels, i, 1),
                    rows.iter().map(|r| (x(r), avg_q(r))).collect(),
                )
                .stroke(Stroke::Dashed),
            );
        }
        c
    };
    let title = if runs.len() == 1 && !lm {
        "Test accuracy (band: lowest to highest peer)".to_string()
    } else {
        what[..1].to_uppercase() + &what[1..]
    };
    let by_epoch = quality("epoch", |r| r.epoch as f64, &title);
    let by_bytes = quality(
        "MB sent per peer",
        |r| r.bytes_sent_per_peer / 1e6,
        &format!("{title}, against bytes sent"),
    );
    let by_time = quality(
        "seconds since training started (peer 0)",
        |r| r.wall_seconds,
        &format!("{title}, against time"),
    );

    let mut loss = Chart::new("Loss", "epoch", "cross-entropy (nats)");
    loss.x_integer = true;
    for (i, rows) in runs.iter().enumerate() {
        loss.series.push(Series::line(
            series_name(labels, i, "test, peers' models (mean)"),
            colour(labels, i, 0),
            rows.iter()
                .map(|r| (r.epoch as f64, r.mean_test_loss))
                .collect(),
        ));
        loss.series.push(
            Series::line(
                series_name(labels, i, "test, averaged model"),
                colour(labels, i, 1),
                rows.iter()
                    .map(|r| (r.epoch as f64, r.avg_model_test_loss))
                    .collect(),
            )
            .stroke(Stroke::Dashed),
        );
        // Epoch 0 has no training loss (no step was taken).
        loss.series.push(
            Series::line(
                series_name(labels, i, "training (mean over peers)"),
                colour(labels, i, 2),
                rows.iter()
                    .filter(|r| r.epoch > 0)
                    .map(|r| (r.epoch as f64, r.mean_train_loss))
                    .collect(),
            )
            .stroke(Stroke::Points),
        );
    }

    let mut consensus = Chart::new(
        "Consensus distance Ξ² = (1/n) Σ ‖x_i − mean x‖²",
        "epoch",
        "Ξ²",
    );
    consensus.x_integer = true;
    consensus.log_y = runs
        .iter()
        .any(|rows| rows.iter().any(|r| r.consensus_distance > 0.0));
    for (i, rows) in runs.iter().enumerate() {
        consensus.series.push(Series::line(
            series_name(labels, i, "Ξ²"),
            colour(labels, i, 0),
            rows.iter()
                .map(|r| (r.epoch as f64, r.consensus_distance))
                .collect(),
        ));
    }

    let times: Vec<Vec<EpochTime>> = runs
        .iter()
        .map(|rows| {
            per_epoch(rows.iter().map(|r| {
                (
                    r.epoch,
                    r.compute_seconds,
                    r.communicate_seconds,
                    r.wait_seconds,
                )
            }))
        })
        .collect();
    let (vs_bytes, vs_time) = if lm {
        ("bits_per_byte_vs_bytes", "bits_per_byte_vs_time")
    } else {
        ("accuracy_vs_bytes", "accuracy_vs_time")
    };
    vec![
        (stem, by_epoch),
        (vs_bytes, by_bytes),
        (vs_time, by_time),
        ("loss", loss),
        ("consensus", consensus),
        ("time", time_chart(labels, &times)),
    ]
}

/// One epoch's seconds, means over the peers: (epoch, compute, communicate, wait).
type EpochTime = (usize, f64, f64, f64);

/// Per-epoch seconds from the cumulative ones of `rows` (epoch, compute, communicate,
/// wait so far); epoch 0 (no training yet) is left out, and a count that went back (a
/// resumed run) counts from 0 again.
fn per_epoch(rows: impl Iterator<Item = EpochTime>) -> Vec<EpochTime> {
    let mut prev = (0.0, 0.0, 0.0);
    let mut out = Vec::new();
    for (epoch, c, m, w) in rows {
        let d = |now: f64, before: f64| if now >= before { now - before } else { now };
        if epoch > 0 {
            out.push((epoch, d(c, prev.0), d(m, prev.1), d(w, prev.2)));
        }
        prev = (c, m, w);
    }
    out
}

/// Where the time went, per epoch: compute, communicate and wait (the communication that
/// compute did not hide). For several runs: compute and wait of each, in its colour.
fn time_chart(labels: &[String], runs: &[Vec<EpochTime>]) -> Chart {
    let title = if let [one] = runs {
        let (c, w) = one.iter().fold((0.0, 0.0), |(c, w), e| (c + e.1, w + e.3));
        let share = if c + w > 0.0 {
            100.0 * w / (c + w)
        } else {
            0.0
        };
        format!(
            "Where the time went: compute {c:.1} s, wait {w:.1} s per peer ({share:.0}% waiting)"
        )
    } else {
        "Where the time went: compute (solid) and wait (dashed) per peer".to_string()
    };
    let mut c = Chart::new(title, "epoch", "seconds per epoch (mean over peers)");
    c.x_integer = true;
    // From 0, with room above the curves for the legend.
    let top = runs
        .iter()
        .flatten()
        .map(|e| e.1.max(e.2).max(e.3))
        .fold(0.0, f64::max);
    c.y_range = Some((0.0, if top > 0.0 { 1.3 * top } else { 1.0 }));
    for (i, epochs) in runs.iter().enumerate() {
        let pts = |f: fn(&EpochTime) -> f64| epochs.iter().map(|e| (e.0 as f64, f(e))).collect();
        c.series.push(Series::line(
            series_name(labels, i, "compute"),
            colour(labels, i, 0),
            pts(|e| e.1),
        ));
        if runs.len() == 1 {
            c.series.push(
                Series::line("communicate (partly hidden)", 1, pts(|e| e.2)).stroke(Stroke::Points),
            );
        }
        c.series.push(
            Series::line(
                series_name(labels, i, "wait"),
                colour(labels, i, 3),
                pts(|e| e.3),
            )
            .stroke(Stroke::Dashed),
        );
    }
    c
}

/// The charts of consensus runs: Ξ²(t)/Ξ²(0) against rounds and against bits sent.
fn consensus_charts(labels: &[String], runs: &[&[ConsensusRow]]) -> Vec<(&'static str, Chart)> {
    let chart = |x_label: &str, x: fn(&ConsensusRow) -> f64| {
        let mut c = Chart::new("Average consensus", x_label, "Ξ²(t) / Ξ²(0)");
        c.log_y = runs
            .iter()
            .any(|rows| rows.iter().any(|r| r.relative > 0.0));
        c.legend = SeriesLabelPosition::UpperRight;
        for (i, rows) in runs.iter().enumerate() {
            c.series.push(Series::line(
                series_name(labels, i, "Ξ²(t) / Ξ²(0)"),
                colour(labels, i, 0),
                rows.iter().map(|r| (x(r), r.relative)).collect(),
            ));
        }
        c
    };
    vec![
        ("consensus", chart("round t", |r| r.round as f64)),
        (
            "consensus_vs_bits",
            chart("bits sent per peer", |r| 8.0 * r.bytes_sent_per_peer),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: usize, acc: f64, xi: f64, secs: f64) -> EpochRow {
        EpochRow {
            epoch,
            phase: "dpsgd".into(),
            rounds: 10 * epoch as u64,
            mean_test_accuracy: acc,
            min_test_accuracy: acc - 0.05,
            max_test_accuracy: acc + 0.05,
            avg_model_test_accuracy: acc + 0.01,
            mean_test_loss: 2.0 - acc,
            avg_model_test_loss: 1.9 - acc,
            consensus_distance: xi,
            mean_train_loss: 2.1 - acc,
            bytes_sent_per_peer: 1e6 * epoch as f64,
            compute_seconds: secs,
            communicate_seconds: 2.0 * secs,
            wait_seconds: 1.5 * secs,
            wall_seconds: 2.5 * secs,
            peers: 4,
            ..Default::default()
        }
    }

    #[test]
    fn per_epoch_seconds_are_the_differences_of_the_cumulative_ones() {
        let rows = [(0, 0.0, 0.0, 0.0), (1, 2.0, 3.0, 1.0), (2, 5.0, 4.0, 1.5)];
        let out = per_epoch(rows.into_iter());
        assert_eq!(out, vec![(1, 2.0, 3.0, 1.0), (2, 3.0, 1.0, 0.5)]);
        // A count that went back (a resumed run) counts from 0 again, never negative.
        let out = per_epoch([(1, 4.0, 4.0, 4.0), (2, 1.0, 1.0, 1.0)].into_iter());
        assert_eq!(out[1], (2, 1.0, 1.0, 1.0));
    }

    #[test]
    fn two_runs_with_one_name_are_told_apart() {
        let run = |label: &str| Run {
            label: label.into(),
            record: Record::Timing(Vec::new()),
        };
        let l = labels(&[run("a"), run("b"), run("a")]);
        assert_eq!(l, vec!["a (1)", "b", "a (3)"]);
    }

    #[test]
    fn a_training_run_folder_gets_its_charts_and_mixed_records_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("ring");
        std::fs::create_dir_all(&run).unwrap();
        let mut jsonl = String::new();
        for (e, acc, xi) in [(0, 0.1, 0.0), (1, 0.8, 0.3), (2, 0.9, 0.1)] {
            jsonl += &serde_json::to_string(&row(e, acc, xi, e as f64)).unwrap();
            jsonl.push('\n');
        }
        std::fs::write(run.join("epochs.jsonl"), jsonl).unwrap();
        let files = draw_run(&run).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into())
            .collect();
        for stem in [
            "accuracy",
            "accuracy_vs_bytes",
            "accuracy_vs_time",
            "loss",
            "consensus",
            "time",
        ] {
            assert!(names.contains(&format!("{stem}.png")), "{names:?}");
            assert!(names.contains(&format!("{stem}.svg")), "{names:?}");
        }
        let svg = std::fs::read_to_string(run.join("plots/time.svg")).unwrap();
        // compute 3 s and wait 4.5 s over epochs 1 and 2: 60% waiting.
        assert!(svg.contains("60% waiting"), "title of time.svg");

        let other = dir.path().join("consensus");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(
            other.join("consensus.csv"),
            "round,consensus_distance,relative,bytes_sent_per_peer,seconds\n\
             0,2.0,1.0,0.0,0.0\n1,1.0,0.5,100.0,0.1\n",
        )
        .unwrap();
        let both = [load(&run).unwrap(), load(&other).unwrap()];
        let err = draw(&both, &dir.path().join("both")).unwrap_err();
        assert!(err.to_string().contains("share no axis"), "{err}");
        let files = draw(&both[1..], &dir.path().join("c")).unwrap();
        assert_eq!(files.len(), 4);

        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let err = load(&empty).unwrap_err();
        assert!(err.to_string().contains("not a run folder"), "{err}");
    }
}
