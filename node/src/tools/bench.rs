//! `murmur bench`: the throughput of one peer's local work for a model and batch size, and
//! the communication-to-computation ratio it implies.
//!
//! Measured on synthetic samples of the model's [`Input`](crate::train::model::Input)
//! ([`Dataset::synthetic`]; the values do not change the work), each phase as the median of
//! `--steps` repetitions after `--warmup` untimed ones, every timing ending with a device
//! synchronisation so that a GPU's queued kernels are counted:
//!
//! * **forward + backward**: the batch uploaded, the loss, and its backward pass;
//! * **training step**: what `murmur peer` does per round besides communicating — forward +
//!   backward, the gradient flattened to the host, the heavy-ball update v ← μv + g,
//!   x ← x − ηv on the flat vector (η = 0.01, μ = 0.9), and x written back into the model;
//! * **round**: the parameters flattened to the host, a D-PSGD mix of x with two neighbour
//!   vectors (x ← (x + x_l + x_r)/3, a ring's Metropolis–Hastings weights), and x written
//!   back (unflatten).
//!
//! From d it derives the bytes of one uncompressed gossip message (24-byte frame header,
//! 12-byte message header, 4·d bytes of f32: 4·d + 36) and the communication-to-computation
//! ratio of Shi, Tang, Chu et al.'s survey for a ring, where each peer sends 2 messages per
//! round: C2C = (2 · message bytes · 8 / link bit rate) / training-step time, for 1 and
//! 10 Gb/s links (serialisation only: no latency, no protocol overhead). C2C < 1 means the
//! link could hide behind the computation; C2C > 1 means the run is communication-bound.

use std::fmt;
use std::time::Instant;

use anyhow::{bail, Context};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use murmur_compress::Compressor;
use murmur_gossip::FRAME_HEADER_LEN;
use serde::Serialize;

use crate::config::DeviceSpec;
use crate::peer::{check_device, on_backend, OnBackend};
use crate::train::data::Dataset;
use crate::train::inner_optimizer::{HeavyBall, Schedule, ScheduleKind};
use crate::train::learner::Learner;
use crate::train::model::{self, ModelKind, Net};

/// Learning rate η of the benchmarked update.
const LR: f32 = 0.01;
/// Heavy-ball momentum μ of the benchmarked update.
const MOMENTUM: f32 = 0.9;
/// Link rates of the C2C ratios, in Gb/s.
const LINKS_GBPS: [f64; 3] = [1.0, 10.0, 100.0];

/// Options of `murmur bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Model to measure (as --model of a run: mlp, cnn, resnet20, transformer[:sizes]), or
    /// `all`: mlp, resnet20 and transformer one after the other, as pytorch_bench.py's `all`.
    #[arg(long, default_value_t = BenchModels::One(ModelKind::MLP))]
    pub model: BenchModels,
    /// Samples per training step.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Timed repetitions of each phase (the medians are reported).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Untimed repetitions before the timed ones (allocation, kernel compilation, autotuning).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`), or libtorch
    /// (the CPU through PyTorch's C++ library; a build with `--features libtorch`).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `murmur bench --model`: one model, or `all` of those `experiments/bench/pytorch_bench.py`
/// also measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchModels {
    /// One model.
    One(ModelKind),
    /// mlp, resnet20 and the transformer (default sizes), in that order.
    All,
}

impl BenchModels {
    /// The models measured, in order.
    pub fn kinds(self) -> Vec<ModelKind> {
        match self {
            BenchModels::One(kind) => vec![kind],
            BenchModels::All => vec![
                ModelKind::MLP,
                ModelKind::RESNET20,
                ModelKind::transformer(),
            ],
        }
    }
}

impl std::str::FromStr for BenchModels {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(BenchModels::All);
        }
        s.parse::<ModelKind>()
            .map(BenchModels::One)
            .map_err(|e| format!("{e} (or all)"))
    }
}

impl fmt::Display for BenchModels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchModels::One(kind) => kind.fmt(f),
            BenchModels::All => f.write_str("all"),
        }
    }
}

/// What `murmur bench` measured. Times are medians in seconds, rates in samples per second.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The model.
    pub model: String,
    /// The device, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// Samples per step.
    pub batch_size: usize,
    /// Timed repetitions per phase.
    pub steps: usize,
    /// Untimed repetitions before them.
    pub warmup: usize,
    /// Parameters d.
    pub dim: usize,
    /// Forward + backward, seconds.
    pub forward_backward_seconds: f64,
    /// batch_size / forward_backward_seconds.
    pub forward_backward_samples_per_second: f64,
    /// Training step (forward + backward, gradient to the host, SGD-momentum update of the
    /// flat vector, unflatten), seconds.
    pub step_seconds: f64,
    /// batch_size / step_seconds.
    pub step_samples_per_second: f64,
    /// Round: flatten + mix with 2 neighbours + unflatten, seconds (median of the sums).
    pub round_seconds: f64,
    /// Flatten part of the round, seconds.
    pub flatten_seconds: f64,
    /// Mix part of the round, seconds.
    pub mix_seconds: f64,
    /// Unflatten part of the round, seconds.
    pub unflatten_seconds: f64,
    /// Bytes of one uncompressed gossip frame to one neighbour: 4·d + 36.
    pub message_bytes: usize,
    /// Communication-to-computation ratio on 1 Gb/s links: 2 messages' serialisation time
    /// over step_seconds.
    pub c2c_1gbps: f64,
    /// The same on 10 Gb/s links.
    pub c2c_10gbps: f64,
    /// The same on 100 Gb/s links (a GPU cluster's fabric).
    pub c2c_100gbps: f64,
}

/// Runs `murmur bench` and prints the table (or one JSON line) of each model.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    for kind in args.model.kinds() {
        let report = measure(args, kind)?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", table(&report));
        }
    }
    Ok(())
}

/// Measures `model` as [`run`] prints it (`args.model` is not read). Dispatches on the
/// device.
///
/// # Errors
/// On a batch size or step count of 0, a device this build or machine cannot use
/// ([`check_device`]), or a non-finite loss.
pub fn measure(args: &BenchArgs, model: ModelKind) -> anyhow::Result<BenchReport> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    check_device(args.device)?;
    struct Measure<'a>(&'a BenchArgs, ModelKind);
    impl OnBackend for Measure<'_> {
        type Output = anyhow::Result<BenchReport>;
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
            measure_on::<B>(self.0, self.1, device)
        }
    }
    on_backend(args.device, Measure(args, model))
}

/// Bytes of one uncompressed gossip frame carrying d parameters: the frame header and an
/// identity message (its header and 4·d bytes of f32) — 4·d + 36.
pub fn message_bytes(d: usize) -> usize {
    FRAME_HEADER_LEN + murmur_compress::Identity.max_encoded_len(d)
}

/// Shi et al.'s communication-to-computation ratio of a peer that sends `messages` frames of
/// `bytes` bytes per step on a link of `gbps` Gb/s and computes for `compute_seconds` per
/// step.
pub fn c2c_ratio(messages: usize, bytes: usize, gbps: f64, compute_seconds: f64) -> f64 {
    (messages * bytes) as f64 * 8.0 / (gbps * 1e9) / compute_seconds
}

fn measure_on<B: AutodiffBackend>(
    args: &BenchArgs,
    model: ModelKind,
    device: B::Device,
) -> anyhow::Result<BenchReport> {
    B::seed(&device, 1);
    let mut net = Net::<B>::new(model, &device);
    let input = net.input();
    let data = Dataset::synthetic(input, args.batch_size, 1);
    let sync = |what: &str| {
        B::sync(&device).map_err(|e| anyhow::anyhow!("device synchronisation after {what}: {e:?}"))
    };
    let reps = args.warmup + args.steps;

    // Forward + backward alone.
    let mut fwd_bwd = Vec::with_capacity(args.steps);
    for i in 0..reps {
        let t = Instant::now();
        let batch =
            model::batch_tensors::<B>(input, data.values().into_owned(), &data.labels, &device)?;
        let grads = net.loss(batch)?.backward();
        sync("forward + backward")?;
        let secs = t.elapsed().as_secs_f64();
        drop(grads);
        if i >= args.warmup {
            fwd_bwd.push(secs);
        }
    }

    // The training step of `murmur peer` without the communication.
    let mut x = Vec::new();
    model::flatten(&net, &mut x);
    let d = x.len();
    // One mini-batch of the whole synthetic set per step, as a peer's learner takes them.
    let mut learner = Learner::new(
        data.clone(),
        args.batch_size,
        1,
        Box::new(HeavyBall::new(MOMENTUM, d)),
        Schedule {
            kind: ScheduleKind::Constant,
            warmup: 0,
            total: 0,
        },
        0,
    );
    let mut step = Vec::with_capacity(args.steps);
    for i in 0..reps {
        let t = Instant::now();
        learner
            .step(&net, &x, &device)
            .with_context(|| format!("step {i}"))?;
        for (xi, u) in x.iter_mut().zip(learner.direction()) {
            *xi -= LR * u;
        }
        net = model::unflatten(net, &x)?;
        sync("the training step")?;
        if i >= args.warmup {
            step.push(t.elapsed().as_secs_f64());
        }
    }

    // A D-PSGD round with two neighbours: flatten, mix, unflatten.
    let left: Vec<f32> = x.iter().map(|v| v * 0.999).collect();
    let right: Vec<f32> = x.iter().map(|v| v * 1.001).collect();
    let (mut flat, mut mix, mut unflat, mut round) = (vec![], vec![], vec![], vec![]);
    for i in 0..reps {
        let t0 = Instant::now();
        model::flatten(&net, &mut x);
        let t1 = Instant::now();
        for ((xi, l), r) in x.iter_mut().zip(&left).zip(&right) {
            *xi = (*xi + l + r) * (1.0 / 3.0);
        }
        let t2 = Instant::now();
        net = model::unflatten(net, &x)?;
        sync("unflatten")?;
        let t3 = Instant::now();
        if i >= args.warmup {
            flat.push((t1 - t0).as_secs_f64());
            mix.push((t2 - t1).as_secs_f64());
            unflat.push((t3 - t2).as_secs_f64());
            round.push((t3 - t0).as_secs_f64());
        }
    }

    let forward_backward_seconds = median(fwd_bwd)?;
    let step_seconds = median(step)?;
    let message_bytes = message_bytes(d);
    let b = args.batch_size as f64;
    Ok(BenchReport {
        model: model.to_string(),
        device: args.device.to_string(),
        batch_size: args.batch_size,
        steps: args.steps,
        warmup: args.warmup,
        dim: d,
        forward_backward_seconds,
        forward_backward_samples_per_second: b / forward_backward_seconds,
        step_seconds,
        step_samples_per_second: b / step_seconds,
        round_seconds: median(round)?,
        flatten_seconds: median(flat)?,
        mix_seconds: median(mix)?,
        unflatten_seconds: median(unflat)?,
        message_bytes,
        c2c_1gbps: c2c_ratio(2, message_bytes, LINKS_GBPS[0], step_seconds),
        c2c_10gbps: c2c_ratio(2, message_bytes, LINKS_GBPS[1], step_seconds),
        c2c_100gbps: c2c_ratio(2, message_bytes, LINKS_GBPS[2], step_seconds),
    })
}

/// The median of `times` (the mean of the two middle values for an even count).
fn median(mut times: Vec<f64>) -> anyhow::Result<f64> {
    times.sort_by(f64::total_cmp);
    let n = times.len();
    let mid = times.get(n / 2).copied().context("no timed repetition")?;
    Ok(if n.is_multiple_of(2) {
        (times[n / 2 - 1] + mid) / 2.0
    } else {
        mid
    })
}

/// `n` with a comma between groups of three digits.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The report as a readable table (milliseconds, samples per second, bytes).
pub fn table(r: &BenchReport) -> String {
    let ms = |s: f64| s * 1e3;
    format!(
        "murmur bench: {model} (d = {d}) on {device}, batch {b}; medians of {steps} repetitions after {warmup} warm-up\n\
         {:<48} {:>10.3} ms {:>10.1} samples/s\n\
         {:<48} {:>10.3} ms {:>10.1} samples/s\n\
         {:<48} {:>10.3} ms (flatten {:.3}, mix {:.3}, unflatten {:.3})\n\
         {:<48} {:>10} bytes (4·d + 36)\n\
         {:<48} {:>10.4} at 1 Gb/s, {:.4} at 10 Gb/s, {:.5} at 100 Gb/s\n",
        "forward + backward",
        ms(r.forward_backward_seconds),
        r.forward_backward_samples_per_second,
        "training step (+ grad to host, SGD, unflatten)",
        ms(r.step_seconds),
        r.step_samples_per_second,
        "round: flatten + mix (2 neighbours) + unflatten",
        ms(r.round_seconds),
        ms(r.flatten_seconds),
        ms(r.mix_seconds),
        ms(r.unflatten_seconds),
        "message per neighbour",
        grouped(r.message_bytes),
        "C2C ratio (2 messages / training step)",
        r.c2c_1gbps,
        r.c2c_10gbps,
        r.c2c_100gbps,
        model = r.model,
        d = grouped(r.dim),
        device = r.device,
        b = r.batch_size,
        steps = r.steps,
        warmup = r.warmup,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_bytes_and_c2c_by_hand() {
        assert_eq!(message_bytes(1000), 4036);
        assert_eq!(message_bytes(203_530), 4 * 203_530 + 36);
        // 2 · 4036 bytes = 64,576 bits: 64.576 µs at 1 Gb/s; against 1 ms of compute.
        assert!((c2c_ratio(2, 4036, 1.0, 1e-3) - 0.064_576).abs() < 1e-12);
        assert!((c2c_ratio(2, 4036, 10.0, 1e-3) - 0.006_457_6).abs() < 1e-12);
        assert_eq!(median(vec![3.0, 1.0, 2.0]).unwrap(), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]).unwrap(), 2.5);
        assert!(median(vec![]).is_err());
        assert_eq!(grouped(203_530), "203,530");
        assert_eq!(grouped(1_089_932), "1,089,932");
        assert_eq!(grouped(999), "999");
    }

    #[test]
    fn model_all_is_the_three_models_pytorch_bench_measures_and_one_model_parses_as_a_run_s() {
        let all: BenchModels = "all".parse().unwrap();
        assert_eq!(all.to_string(), "all");
        let names: Vec<String> = all.kinds().iter().map(|k| k.to_string()).collect();
        assert_eq!(names, ["mlp", "resnet20", "transformer"]);
        let one: BenchModels = "cnn".parse().unwrap();
        assert_eq!(one, BenchModels::One(ModelKind::CNN));
        assert_eq!(one.kinds(), vec![ModelKind::CNN]);
        let err = "resnet".parse::<BenchModels>().unwrap_err();
        assert!(err.ends_with("(or all)"), "{err}");
    }

    #[test]
    fn a_small_bench_reports_consistent_numbers() {
        let args = BenchArgs {
            model: BenchModels::One(ModelKind::CNN),
            batch_size: 4,
            steps: 3,
            warmup: 1,
            device: DeviceSpec::Cpu,
            json: true,
        };
        let r = measure(&args, ModelKind::CNN).unwrap();
        assert_eq!(r.dim, 20_490);
        assert_eq!(r.message_bytes, 4 * 20_490 + 36);
        for t in [
            r.forward_backward_seconds,
            r.step_seconds,
            r.round_seconds,
            r.flatten_seconds,
            r.mix_seconds,
            r.unflatten_seconds,
        ] {
            assert!(t.is_finite() && t > 0.0, "{r:?}");
        }
        assert!((r.step_samples_per_second * r.step_seconds - 4.0).abs() < 1e-9);
        assert!((r.c2c_1gbps / r.c2c_10gbps - 10.0).abs() < 1e-9);
        assert!((r.c2c_10gbps / r.c2c_100gbps - 10.0).abs() < 1e-9);
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(json["model"], "cnn");
        assert!(table(&r).contains("C2C ratio"));
        for bad in [
            BenchArgs {
                batch_size: 0,
                ..args.clone()
            },
            BenchArgs {
                steps: 0,
                ..args.clone()
            },
        ] {
            assert!(measure(&bad, ModelKind::CNN).is_err());
        }
    }
}
