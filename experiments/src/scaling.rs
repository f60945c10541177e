//! `scaling`: time per round and samples/s vs number of peers, in the simulator (2…64
//! peers, 1 and 10 Gb/s, `murmur simulate --timing-only` with the compute time measured
//! here) and as real processes on this machine (`murmur launch`, 2…8 peers); and the C2C
//! ratio (communication time / computation time, Shi, Tang, Chu et al.'s survey) of each
//! model from `murmur bench`.

use std::path::Path;

use anyhow::anyhow;
use serde::Serialize;

use crate::chart::{Chart, Series, SeriesLabelPosition, Stroke};
use crate::runner::{json_f64, parse_json, Ctx, Job};
use crate::table::{markdown, write_checked_csv, Table};

/// (label, murmur arguments) of the simulated algorithms.
const SIM_ALGORITHMS: [(&str, &[&str]); 4] = [
    ("D-PSGD ring", &["--algorithm=dpsgd", "--topology=ring"]),
    (
        "CHOCO top-1% ring",
        &[
            "--algorithm=choco",
            "--compressor=topk:0.01",
            "--topology=ring",
        ],
    ),
    ("all-reduce", &["--algorithm=allreduce"]),
    ("PS (BSP)", &["--algorithm=ps"]),
];
const REAL_ALGORITHMS: [(&str, &[&str]); 2] = [
    ("D-PSGD ring", &["--algorithm=dpsgd", "--topology=ring"]),
    ("all-reduce", &["--algorithm=allreduce"]),
];
const BATCH: usize = 32;
const SIM_ROUNDS: u64 = 20;

#[derive(Debug, Serialize)]
struct SimRow {
    algorithm: String,
    gbps: f64,
    n: usize,
    rounds: f64,
    seconds_per_round: f64,
    samples_per_second: f64,
    bytes_per_peer_per_round: f64,
    /// Mean over peers of the share of the round spent computing.
    compute_share: f64,
}

#[derive(Debug, Serialize)]
struct RealRow {
    algorithm: String,
    n: usize,
    rounds: f64,
    seconds_per_round: f64,
    samples_per_second: f64,
}

#[derive(Debug, Serialize)]
struct C2cRow {
    model: String,
    batch_size: u64,
    dim: u64,
    message_bytes: u64,
    forward_backward_seconds: f64,
    step_seconds: f64,
    c2c_1gbps: f64,
    c2c_10gbps: f64,
}

/// Runs the experiment.
pub fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let dir = ctx.dir("scaling")?;
    let runs = dir.join("runs");

    // C2C per model (also gives the MLP's compute time for the simulator).
    let c2c = bench_c2c(ctx)?;
    write_c2c_csv(&dir, &c2c)?;
    let mlp_ms = 1e3
        * c2c
            .iter()
            .find(|r| r.model == "mlp")
            .map(|r| r.forward_backward_seconds)
            .ok_or_else(|| anyhow!("no MLP benchmark"))?;

    // Simulated scaling.
    let ns: &[usize] = if ctx.quick {
        &[2, 4, 8]
    } else {
        &[2, 4, 8, 16, 32, 64]
    };
    let sim = simulate(ctx, &runs, ns, mlp_ms)?;
    write_sim_csv(&dir, &sim)?;

    // Real processes, one run at a time (they share this machine's cores).
    let real_ns: &[usize] = if ctx.quick { &[2, 4] } else { &[2, 4, 6, 8] };
    let real_rounds: u64 = if ctx.quick { 8 } else { 40 };
    let real = launch_real(ctx, &runs, real_ns, real_rounds)?;
    write_real_csv(&dir, &real)?;

    let results = Results {
        c2c,
        sim,
        real,
        mlp_ms,
        ns,
        real_ns,
        real_rounds,
    };
    results.plot_sim(&dir)?;
    results.plot_real(&dir)?;
    results.plot_c2c(&dir)?;
    std::fs::write(dir.join("summary.md"), results.summary())?;
    Ok(())
}

/// Benchmarks each model with `murmur bench`, one at a time: its C2C ratio.
fn bench_c2c(ctx: &Ctx) -> anyhow::Result<Vec<C2cRow>> {
    let models: &[(&str, &str)] = if ctx.quick {
        &[("mlp", "--steps=5"), ("cnn", "--steps=3")]
    } else {
        &[
            ("mlp", "--steps=30"),
            ("cnn", "--steps=10"),
            ("resnet20", "--steps=3"),
            ("transformer", "--steps=3"),
        ]
    };
    let jobs: Vec<Job> = models
        .iter()
        .map(|(m, steps)| {
            Job::new(
                format!("bench {m}"),
                [
                    "bench".to_string(),
                    format!("--model={m}"),
                    format!("--batch-size={BATCH}"),
                    steps.to_string(),
                    "--warmup=1".into(),
                    "--json".into(),
                ],
            )
        })
        .collect();
    // One at a time: the benchmark times compute on this machine.
    let mut c2c = Vec::new();
    for job in &jobs {
        let v =
            parse_json(ctx.run_all_ok("scaling: C2C", std::slice::from_ref(job))?[0].as_bytes())?;
        c2c.push(C2cRow {
            model: v["model"].as_str().unwrap_or("?").to_string(),
            batch_size: json_f64(&v, "batch_size")? as u64,
            dim: json_f64(&v, "dim")? as u64,
            message_bytes: json_f64(&v, "message_bytes")? as u64,
            forward_backward_seconds: json_f64(&v, "forward_backward_seconds")?,
            step_seconds: json_f64(&v, "step_seconds")?,
            c2c_1gbps: json_f64(&v, "c2c_1gbps")?,
            c2c_10gbps: json_f64(&v, "c2c_10gbps")?,
        });
    }
    Ok(c2c)
}

/// Writes c2c.csv.
fn write_c2c_csv(dir: &Path, c2c: &[C2cRow]) -> anyhow::Result<()> {
    let c2c_csv = dir.join("c2c.csv");
    write_checked_csv(
        &c2c_csv,
        c2c,
        &[
            "batch_size",
            "dim",
            "message_bytes",
            "forward_backward_seconds",
            "step_seconds",
            "c2c_1gbps",
            "c2c_10gbps",
        ],
        &["model"],
    )
}

/// Simulates every algorithm at 1 and 10 Gb/s for each number of peers in `ns`, with the
/// MLP's measured compute time; one row per run.
fn simulate(ctx: &Ctx, runs: &Path, ns: &[usize], mlp_ms: f64) -> anyhow::Result<Vec<SimRow>> {
    let mut keys = Vec::new();
    let mut jobs = Vec::new();
    for (label, a) in SIM_ALGORITHMS {
        for gbps in [1.0f64, 10.0] {
            for &n in ns {
                let id = format!(
                    "sim-{}-{gbps}g-n{n}",
                    label.replace([' ', '%', '(', ')'], "").to_lowercase()
                );
                let mut args = vec![
                    "simulate".to_string(),
                    "--timing-only".into(),
                    format!("--peers={n}"),
                    format!("--bandwidth-gbps={gbps}"),
                    format!("--compute-ms={mlp_ms}"),
                    format!("--batch-size={BATCH}"),
                    "--epochs=1".into(),
                    format!("--rounds-per-epoch={SIM_ROUNDS}"),
                ];
                args.extend(a.iter().map(|s| s.to_string()));
                // Not reusable: the compute time is measured again on every run.
                jobs.push(Job::in_run(runs, &id, args, None));
                keys.push((label, gbps, n, id));
            }
        }
    }
    ctx.run_all_ok("scaling: simulator", &jobs)?;
    let mut sim = Vec::new();
    for (label, gbps, n, id) in &keys {
        let t = Table::read(&runs.join(id).join("timing.csv"))?;
        let last = t.rows.len() - 1;
        let get = |c: &str| t.f64s(c).map(|v| v[last]);
        let (rounds, wall, bytes, compute) = (
            get("rounds")?,
            get("wall_seconds")?,
            get("bytes_sent_per_peer")?,
            get("compute_seconds")?,
        );
        let spr = wall / rounds;
        sim.push(SimRow {
            algorithm: label.to_string(),
            gbps: *gbps,
            n: *n,
            rounds,
            seconds_per_round: spr,
            samples_per_second: (*n * BATCH) as f64 / spr,
            bytes_per_peer_per_round: bytes / rounds,
            compute_share: compute / wall,
        });
    }
    Ok(sim)
}

/// Writes scaling_sim.csv.
fn write_sim_csv(dir: &Path, sim: &[SimRow]) -> anyhow::Result<()> {
    let sim_csv = dir.join("scaling_sim.csv");
    write_checked_csv(
        &sim_csv,
        sim,
        &[
            "gbps",
            "n",
            "rounds",
            "seconds_per_round",
            "samples_per_second",
            "bytes_per_peer_per_round",
            "compute_share",
        ],
        &["algorithm"],
    )
}

/// Launches real peer processes on this machine (`murmur launch`), one run at a time, for
/// each algorithm and number of peers in `real_ns`.
fn launch_real(
    ctx: &Ctx,
    runs: &Path,
    real_ns: &[usize],
    real_rounds: u64,
) -> anyhow::Result<Vec<RealRow>> {
    let mut real = Vec::new();
    for (label, a) in REAL_ALGORITHMS {
        for &n in real_ns {
            let id = format!("real-{}-n{n}", label.replace(' ', "").to_lowercase());
            let mut args = vec![
                "launch".to_string(),
                format!("--peers={n}"),
                "--epochs=1".into(),
                format!("--rounds-per-epoch={real_rounds}"),
                format!("--batch-size={BATCH}"),
            ];
            args.extend(a.iter().map(|s| s.to_string()));
            ctx.run_all_ok(
                "scaling: real peers",
                &[Job::in_run(runs, &id, args, Some("summary.json"))],
            )?;
            let v = parse_json(&std::fs::read(runs.join(&id).join("summary.json"))?)?;
            real.push(RealRow {
                algorithm: label.to_string(),
                n,
                rounds: json_f64(&v, "rounds")?,
                seconds_per_round: json_f64(&v, "seconds_per_round")?,
                samples_per_second: json_f64(&v, "samples_per_second")?,
            });
        }
    }
    Ok(real)
}

/// Writes scaling_real.csv.
fn write_real_csv(dir: &Path, real: &[RealRow]) -> anyhow::Result<()> {
    let real_csv = dir.join("scaling_real.csv");
    write_checked_csv(
        &real_csv,
        real,
        &["n", "rounds", "seconds_per_round", "samples_per_second"],
        &["algorithm"],
    )
}

/// The three parts' results, for the plots and summary.md.
struct Results {
    c2c: Vec<C2cRow>,
    sim: Vec<SimRow>,
    real: Vec<RealRow>,
    /// The MLP's compute time per step (ms) the simulator used.
    mlp_ms: f64,
    /// Peers of the simulated runs.
    ns: &'static [usize],
    /// Peers of the real runs.
    real_ns: &'static [usize],
    /// Rounds of each real run.
    real_rounds: u64,
}

impl Results {
    /// Draws the simulated time per round and throughput against peers.
    fn plot_sim(&self, dir: &Path) -> anyhow::Result<()> {
        let mut time = Chart::new(
            "Simulated time per round vs peers (MLP, batch 32)",
            "peers n",
            "seconds per round",
        );
        let mut thr = Chart::new(
            "Simulated throughput vs peers (MLP, batch 32)",
            "peers n",
            "samples per second",
        );
        for c in [&mut time, &mut thr] {
            c.log_x = true;
            c.log_y = true;
            c.y_floor = 1e-9;
            c.legend = SeriesLabelPosition::UpperLeft;
        }
        for (i, (label, _)) in SIM_ALGORITHMS.iter().enumerate() {
            for gbps in [1.0, 10.0] {
                let rs: Vec<&SimRow> = self
                    .sim
                    .iter()
                    .filter(|r| r.algorithm == *label && r.gbps == gbps)
                    .collect();
                let stroke = if gbps == 1.0 {
                    Stroke::Solid
                } else {
                    Stroke::Dashed
                };
                let name = format!("{label}, {gbps} Gb/s");
                time.series.push(
                    Series::line(
                        name.clone(),
                        i,
                        rs.iter()
                            .map(|r| (r.n as f64, r.seconds_per_round))
                            .collect(),
                    )
                    .stroke(stroke),
                );
                thr.series.push(
                    Series::line(
                        name,
                        i,
                        rs.iter()
                            .map(|r| (r.n as f64, r.samples_per_second))
                            .collect(),
                    )
                    .stroke(stroke),
                );
            }
        }
        time.save(&dir.join("sim_time_per_round_vs_n"))?;
        thr.save(&dir.join("sim_samples_per_second_vs_n"))?;
        Ok(())
    }

    /// Draws the real processes' time per round and throughput against peers.
    fn plot_real(&self, dir: &Path) -> anyhow::Result<()> {
        let mut rtime = Chart::new(
            "Real processes on this machine: time per round vs peers",
            "peers n",
            "seconds per round",
        );
        let mut rthr = Chart::new(
            "Real processes on this machine: samples/s vs peers",
            "peers n",
            "samples per second",
        );
        rtime.legend = SeriesLabelPosition::UpperLeft;
        rthr.legend = SeriesLabelPosition::LowerRight;
        for (i, (label, _)) in REAL_ALGORITHMS.iter().enumerate() {
            let rs: Vec<&RealRow> = self.real.iter().filter(|r| r.algorithm == *label).collect();
            rtime.series.push(Series::line(
                *label,
                i,
                rs.iter()
                    .map(|r| (r.n as f64, r.seconds_per_round))
                    .collect(),
            ));
            rthr.series.push(Series::line(
                *label,
                i,
                rs.iter()
                    .map(|r| (r.n as f64, r.samples_per_second))
                    .collect(),
            ));
        }
        rtime.save(&dir.join("real_time_per_round_vs_n"))?;
        rthr.save(&dir.join("real_samples_per_second_vs_n"))?;
        Ok(())
    }

    /// Draws each model's C2C ratio against its parameter count d, at 1 and 10 Gb/s.
    fn plot_c2c(&self, dir: &Path) -> anyhow::Result<()> {
        let mut cc = Chart::new(
            "C2C ratio per model (2 messages of d f32 per step, batch 32)",
            "parameters d",
            "communication / computation",
        );
        cc.log_x = true;
        cc.log_y = true;
        cc.y_floor = 1e-6;
        for (k, gbps) in [(0, "1 Gb/s"), (1, "10 Gb/s")] {
            let pts = self
                .c2c
                .iter()
                .map(|r| {
                    (
                        r.dim as f64,
                        if k == 0 { r.c2c_1gbps } else { r.c2c_10gbps },
                    )
                })
                .collect();
            cc.series
                .push(Series::line(gbps, k, pts).stroke(Stroke::Points));
        }
        cc.save(&dir.join("c2c_per_model"))?;
        Ok(())
    }

    /// summary.md: the C2C, simulator and real-process tables.
    fn summary(&self) -> String {
        let mut s =
            String::from("C2C ratio per model (`murmur bench`, batch 32, this machine's CPU)\n\n");
        s += &self.c2c_table();
        s += &format!(
            "\nSimulator, MLP, compute {:.3} ms per step, {SIM_ROUNDS} rounds: seconds per round (samples/s)\n\n",
            self.mlp_ms
        );
        s += &self.sim_table();
        s += &format!(
            "\nReal processes (`murmur launch`, {} rounds, this machine): seconds per round (samples/s)\n\n",
            self.real_rounds
        );
        s += &self.real_table();
        s
    }

    /// The C2C table: a row per model.
    fn c2c_table(&self) -> String {
        markdown(
            &[
                "model",
                "d",
                "message bytes",
                "forward+backward (ms)",
                "step (ms)",
                "C2C @1 Gb/s",
                "C2C @10 Gb/s",
            ],
            &self
                .c2c
                .iter()
                .map(|r| {
                    vec![
                        r.model.clone(),
                        r.dim.to_string(),
                        r.message_bytes.to_string(),
                        format!("{:.2}", 1e3 * r.forward_backward_seconds),
                        format!("{:.2}", 1e3 * r.step_seconds),
                        format!("{:.3}", r.c2c_1gbps),
                        format!("{:.4}", r.c2c_10gbps),
                    ]
                })
                .collect::<Vec<_>>(),
        )
    }

    /// The simulator table: a row per (algorithm, link), a column per n.
    fn sim_table(&self) -> String {
        let mut header = vec!["algorithm".to_string(), "link".to_string()];
        header.extend(self.ns.iter().map(|n| format!("n = {n}")));
        let mut table = Vec::new();
        for (label, _) in SIM_ALGORITHMS {
            for gbps in [1.0, 10.0] {
                let mut row = vec![label.to_string(), format!("{gbps} Gb/s")];
                for &n in self.ns {
                    let r = self
                        .sim
                        .iter()
                        .find(|r| r.algorithm == label && r.gbps == gbps && r.n == n);
                    row.push(r.map_or("—".into(), |r| {
                        format!("{:.4} ({:.0})", r.seconds_per_round, r.samples_per_second)
                    }));
                }
                table.push(row);
            }
        }
        markdown(
            &header.iter().map(String::as_str).collect::<Vec<_>>(),
            &table,
        )
    }

    /// The real-process table: a row per algorithm, a column per n.
    fn real_table(&self) -> String {
        let mut header = vec!["algorithm".to_string()];
        header.extend(self.real_ns.iter().map(|n| format!("n = {n}")));
        let table: Vec<Vec<String>> = REAL_ALGORITHMS
            .iter()
            .map(|(label, _)| {
                let mut row = vec![label.to_string()];
                for &n in self.real_ns {
                    let r = self.real.iter().find(|r| r.algorithm == *label && r.n == n);
                    row.push(r.map_or("—".into(), |r| {
                        format!("{:.4} ({:.0})", r.seconds_per_round, r.samples_per_second)
                    }));
                }
                row
            })
            .collect();
        markdown(
            &header.iter().map(String::as_str).collect::<Vec<_>>(),
            &table,
        )
    }
}
