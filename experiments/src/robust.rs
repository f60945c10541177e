//! `robust`: Byzantine-robust gossip on MNIST. 16 simulated D-PSGD peers on a ring, a 4×4
//! torus and the exponential graph, with 0–3 Byzantine peers (`murmur simulate --byzantine`:
//! sign flip, "a little is enough" with z = 1, Gaussian noise σ = 1), mixing plainly or with
//! ClippedGossip's adaptive radius (`--robust clip`: all but the farthest neighbour trusted;
//! `--robust clip:auto:2`: all but the two farthest; He, Karimireddy & Jaggi 2022). Reported:
//! the honest peers' mean and lowest test accuracy and their consensus distance Ξ² after the
//! last epoch.

use std::path::Path;

use serde::Serialize;

use crate::chart::{Chart, Series, SeriesLabelPosition, Stroke};
use crate::runner::{Ctx, Job};
use crate::table::{markdown, write_checked_csv, Table};

const TOPOLOGIES: [&str; 3] = ["ring", "torus", "exponential"];
const ATTACKS: [&str; 3] = ["signflip", "alie", "noise"];
/// The Byzantine ranks for 1, 2 and 3 attackers: spread over the 16 peers.
const RANKS: [&[usize]; 3] = [&[3], &[3, 11], &[3, 8, 13]];
const RULES: [(&str, &str); 3] = [
    ("plain", ""),
    ("clip", "--robust=clip"),
    ("clip2", "--robust=clip:auto:2"),
];

#[derive(Debug, Clone, Serialize)]
struct Row {
    topology: String,
    attack: String,
    attackers: usize,
    rule: String,
    mean_accuracy: f64,
    min_accuracy: f64,
    avg_model_accuracy: f64,
    consensus_distance: f64,
}

/// One run of the experiment.
struct Plan {
    id: String,
    topology: &'static str,
    attack: &'static str,
    attackers: usize,
    rule: &'static str,
    /// The run's own arguments.
    args: Vec<String>,
}

/// The attacks of each topology and rule, as (attack, attackers): none, then 1–3 attackers
/// of each attack.
fn attacks() -> Vec<(&'static str, usize)> {
    std::iter::once(("none", 0))
        .chain(ATTACKS.iter().flat_map(|a| (1..=3).map(move |k| (*a, k))))
        .collect()
}

/// Every run: per topology and rule, no attacker, then 1–3 attackers of each attack.
fn runs() -> Vec<Plan> {
    let mut out = Vec::new();
    for topology in TOPOLOGIES {
        for (rule, flag) in RULES {
            for (attack, attackers) in attacks() {
                let mut args = vec![format!("--topology={topology}")];
                if !flag.is_empty() {
                    args.push(flag.to_string());
                }
                if attackers > 0 {
                    for r in RANKS[attackers - 1] {
                        args.push(format!("--byzantine={r}:{attack}"));
                    }
                }
                out.push(Plan {
                    id: format!("{topology}-{rule}-{attack}-{attackers}"),
                    topology,
                    attack,
                    attackers,
                    rule,
                    args,
                });
            }
        }
    }
    out
}

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("robust")?;
    let runs_dir = dir.join("runs");
    let size: &[&str] = if ctx.quick {
        &["--epochs=1", "--rounds-per-epoch=8"]
    } else {
        &["--epochs=10"]
    };
    let plan = runs();
    ctx.run_all_ok("robust", &jobs(&plan, &runs_dir, size))?;
    let rows = read_rows(&plan, &runs_dir)?;
    write_csv(&dir, &rows)?;
    plot(&dir, &rows)?;
    write_summary(&dir, &rows, size)
}

/// The `murmur simulate` job of each run.
fn jobs(plan: &[Plan], runs_dir: &Path, size: &[&str]) -> Vec<Job> {
    plan.iter()
        .map(|p| {
            let mut a: Vec<String> = ["simulate", "--peers=16", "--seed=1", "--compute-ms=2"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            a.extend(size.iter().map(|s| s.to_string()));
            a.extend(p.args.iter().cloned());
            Job::in_run(runs_dir, &p.id, a, Some("summary.json"))
        })
        .collect()
}

/// The last epoch of each run.
fn read_rows(plan: &[Plan], runs_dir: &Path) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for p in plan {
        let id = &p.id;
        let t = Table::read(&runs_dir.join(id).join("epochs.csv"))?;
        let last = |c: &str| -> anyhow::Result<f64> {
            t.f64s(c)?
                .last()
                .copied()
                .ok_or_else(|| anyhow::anyhow!("{id}: no epochs"))
        };
        rows.push(Row {
            topology: p.topology.to_string(),
            attack: p.attack.to_string(),
            attackers: p.attackers,
            rule: p.rule.to_string(),
            mean_accuracy: last("mean_test_accuracy")?,
            min_accuracy: last("min_test_accuracy")?,
            avg_model_accuracy: last("avg_model_test_accuracy")?,
            consensus_distance: last("consensus_distance")?,
        });
    }
    Ok(rows)
}

/// Writes robust.csv.
fn write_csv(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    write_checked_csv(
        &dir.join("robust.csv"),
        rows,
        &[
            "attackers",
            "mean_accuracy",
            "min_accuracy",
            "avg_model_accuracy",
            "consensus_distance",
        ],
        &["topology", "attack", "rule"],
    )
}

/// The row of (topology, attack, attackers, rule); with no attacker, whatever the attack.
fn find<'a>(rows: &'a [Row], topo: &str, attack: &str, k: usize, rule: &str) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.topology == topo && r.rule == rule && r.attackers == k && (k == 0 || r.attack == attack)
    })
}

/// One chart per attack: honest mean accuracy against the number of attackers, a colour
/// per topology: solid plain, dashed `clip`, points `clip:auto:2`.
fn plot(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    for attack in ATTACKS {
        let mut c = Chart::new(
            format!("Honest peers under {attack} — 16 peers, MNIST, D-PSGD"),
            "Byzantine peers",
            "honest peers' mean test accuracy",
        );
        c.x_integer = true;
        c.y_range = Some((0.0, 1.0));
        c.legend = SeriesLabelPosition::LowerLeft;
        for (i, topo) in TOPOLOGIES.iter().enumerate() {
            for (rule, stroke) in [
                ("plain", Stroke::Solid),
                ("clip", Stroke::Dashed),
                ("clip2", Stroke::Points),
            ] {
                let pts = (0..=3)
                    .filter_map(|k| find(rows, topo, attack, k, rule))
                    .map(|r| (r.attackers as f64, r.mean_accuracy))
                    .collect();
                let label = if rule == "clip2" { "clip:auto:2" } else { rule };
                c.series
                    .push(Series::line(format!("{topo} {label}"), i, pts).stroke(stroke));
            }
        }
        c.save(&dir.join(format!("accuracy_{attack}")))?;
    }
    Ok(())
}

/// The summary table: per topology and attack, each rule's honest accuracy (lowest) and Ξ².
fn table(rows: &[Row]) -> Vec<Vec<String>> {
    let pct = |v: f64| format!("{:.1}%", 100.0 * v);
    let mut table = Vec::new();
    for topo in TOPOLOGIES {
        for (attack, k) in attacks() {
            let (Some(p), Some(c), Some(c2)) = (
                find(rows, topo, attack, k, "plain"),
                find(rows, topo, attack, k, "clip"),
                find(rows, topo, attack, k, "clip2"),
            ) else {
                continue;
            };
            table.push(vec![
                topo.to_string(),
                if k == 0 {
                    "—".into()
                } else {
                    attack.to_string()
                },
                k.to_string(),
                format!("{} ({})", pct(p.mean_accuracy), pct(p.min_accuracy)),
                format!("{} ({})", pct(c.mean_accuracy), pct(c.min_accuracy)),
                format!("{} ({})", pct(c2.mean_accuracy), pct(c2.min_accuracy)),
                format!("{:.2e}", p.consensus_distance),
                format!("{:.2e}", c.consensus_distance),
                format!("{:.2e}", c2.consensus_distance),
            ]);
        }
    }
    table
}

/// Writes summary.md.
fn write_summary(dir: &Path, rows: &[Row], size: &[&str]) -> anyhow::Result<()> {
    let summary = format!(
        "16 peers, D-PSGD, MNIST MLP, {}, seed 1; Byzantine ranks 3 / 3, 11 / 3, 8, 13. \
         Accuracy: the honest peers' mean (lowest) test accuracy after the last epoch; Ξ²: \
         their consensus distance.\n\n{}",
        size.join(" "),
        markdown(
            &[
                "topology",
                "attack",
                "Byzantine",
                "plain acc (min)",
                "clip acc (min)",
                "clip:auto:2 acc (min)",
                "plain Ξ²",
                "clip Ξ²",
                "clip:auto:2 Ξ²",
            ],
            &table(rows),
        )
    );
    std::fs::write(dir.join("summary.md"), summary)?;
    Ok(())
}
