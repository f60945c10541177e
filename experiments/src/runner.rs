//! Running `murmur` commands: one at a time or several at once, with progress.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

/// What every driver needs: the binary, the output folder, the mode.
#[derive(Debug)]
pub struct Ctx {
    /// The `murmur` binary.
    pub murmur: PathBuf,
    /// The results folder (one subfolder per experiment).
    pub out: PathBuf,
    /// `--quick`.
    pub quick: bool,
    /// Simulator runs at once.
    pub jobs: usize,
    /// `--reuse`: keep the runs whose output exists.
    pub reuse: bool,
    /// The repository's experiments/ folder (run configs, topology files).
    pub experiments: PathBuf,
}

/// One `murmur` invocation: its arguments and a label for progress and errors.
#[derive(Debug, Clone)]
pub struct Job {
    /// Shown in progress lines and errors.
    pub label: String,
    /// Arguments after `murmur`.
    pub args: Vec<String>,
    /// The job's run folder, removed before the job runs (murmur refuses to overwrite a
    /// finished run).
    pub folder: Option<PathBuf>,
    /// The file the job writes last; with `--reuse` a job whose file exists is skipped.
    pub output: Option<PathBuf>,
}

impl Job {
    /// A job from anything string-like.
    pub fn new<S: AsRef<str>>(label: impl Into<String>, args: impl IntoIterator<Item = S>) -> Self {
        Job {
            label: label.into(),
            args: args.into_iter().map(|a| a.as_ref().to_string()).collect(),
            folder: None,
            output: None,
        }
    }

    /// A `murmur simulate`/`launch` job writing the run folder `<runs>/<id>` (cleared before
    /// it runs): `args` plus `--out` and `--run-id`, labelled `id`. With `reuse`, the file in
    /// that folder whose presence lets `--reuse` skip the job.
    pub fn in_run(runs: &Path, id: &str, mut args: Vec<String>, reuse: Option<&str>) -> Self {
        args.push(format!("--out={}", runs.display()));
        args.push(format!("--run-id={id}"));
        let folder = runs.join(id);
        Job {
            label: id.to_string(),
            args,
            output: reuse.map(|f| folder.join(f)),
            folder: Some(folder),
        }
    }
}

impl Ctx {
    /// Checks the experiments folder (run configs are read from it) and makes `out`.
    ///
    /// # Errors
    /// No experiments/ folder next to the working directory or the binary's repository;
    /// `out` cannot be created.
    pub fn new(
        murmur: PathBuf,
        out: PathBuf,
        quick: bool,
        jobs: usize,
        reuse: bool,
    ) -> anyhow::Result<Ctx> {
        let experiments = [
            PathBuf::from("experiments"),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ]
        .into_iter()
        .find(|p| p.join("runs").is_dir())
        .ok_or_else(|| {
            anyhow!("run murmur-experiments from the repository root (it reads experiments/runs/)")
        })?;
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        Ok(Ctx {
            murmur,
            out,
            quick,
            jobs,
            reuse,
            experiments,
        })
    }

    /// `<out>/<name>/`, created.
    pub fn dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let d = self.out.join(name);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    }

    /// A file of experiments/ (e.g. `runs/convergence/dpsgd.toml`), which must exist.
    pub fn file(&self, rel: &str) -> anyhow::Result<String> {
        let p = self.experiments.join(rel);
        if !p.is_file() {
            bail!("missing {}", p.display());
        }
        Ok(p.display().to_string())
    }

    /// Runs one `murmur` command and returns its stdout.
    ///
    /// # Errors
    /// The command cannot start or exits non-zero (its stderr's last lines in the error).
    pub fn murmur(&self, job: &Job) -> anyhow::Result<String> {
        if self.reuse && job.output.as_ref().is_some_and(|f| f.is_file()) {
            return Ok(String::new());
        }
        if let Some(dir) = job.folder.as_ref().filter(|d| d.exists()) {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        let out = Command::new(&self.murmur)
            .args(&job.args)
            .env("NO_COLOR", "1")
            .output()
            .with_context(|| format!("starting {}", self.murmur.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(8).collect();
            bail!(
                "{}: `murmur {}` failed ({}):\n{}",
                job.label,
                job.args.join(" "),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `jobs` with up to [`Ctx::jobs`] at once, showing progress under `title`;
    /// returns each job's result in order (failures do not stop the others).
    pub fn run_all(&self, title: &str, jobs: &[Job]) -> Vec<anyhow::Result<String>> {
        let progress = Progress::new(title, jobs.len());
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<anyhow::Result<String>>>> =
            Mutex::new((0..jobs.len()).map(|_| None).collect());
        std::thread::scope(|s| {
            for _ in 0..self.jobs.min(jobs.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = jobs.get(i) else { break };
                    let t = Instant::now();
                    let r = self.murmur(job);
                    progress.done(&job.label, t.elapsed().as_secs_f64(), r.is_ok());
                    if let Ok(mut v) = results.lock() {
                        v[i] = Some(r);
                    }
                });
            }
        });
        progress.finish();
        results
            .into_inner()
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("job did not run"))))
            .collect()
    }

    /// As [`Ctx::run_all`], but the first failure is the error.
    pub fn run_all_ok(&self, title: &str, jobs: &[Job]) -> anyhow::Result<Vec<String>> {
        self.run_all(title, jobs).into_iter().collect()
    }
}

/// Progress over a known number of jobs: a bar on a terminal, a line per job otherwise.
pub struct Progress {
    bar: ProgressBar,
    title: String,
    total: usize,
    done: AtomicUsize,
    started: Instant,
}

impl Progress {
    /// Progress of `total` jobs under `title`.
    pub fn new(title: &str, total: usize) -> Progress {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} {pos}/{len} [{bar:30}] {elapsed_precise}, ~{eta} left {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(title.to_string());
        Progress {
            bar,
            title: title.to_string(),
            total,
            done: AtomicUsize::new(0),
            started: Instant::now(),
        }
    }

    /// One job finished after `secs`.
    pub fn done(&self, label: &str, secs: f64, ok: bool) {
        let k = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        let status = if ok { "" } else { " FAILED" };
        if self.bar.is_hidden() {
            // The time left at the mean pace of the jobs so far (they run `jobs` at once).
            let so_far = self.started.elapsed().as_secs_f64() / 60.0;
            let left = so_far / k as f64 * self.total.saturating_sub(k) as f64;
            eprintln!(
                "[{} {k}/{}] {label} {secs:.1} s{status} ({so_far:.1} min so far, ~{left:.1} min left)",
                self.title, self.total,
            );
        } else {
            self.bar.inc(1);
            self.bar.set_message(format!("{label}{status}"));
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The JSON object a `murmur … --json` command printed, or a file holds.
///
/// # Errors
/// Not JSON.
pub fn parse_json(text: &[u8]) -> anyhow::Result<serde_json::Value> {
    serde_json::from_slice(text.trim_ascii()).context("parsing murmur's JSON")
}

/// The number `key` of a JSON object.
///
/// # Errors
/// No such key, or not a number.
pub fn json_f64(v: &serde_json::Value, key: &str) -> anyhow::Result<f64> {
    v[key]
        .as_f64()
        .ok_or_else(|| anyhow!("no number {key:?} in {v}"))
}
