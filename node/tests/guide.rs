//! The user guide (`docs/`) and the README checked against the binary they describe.
//!
//! - `the_cli_reference_is_the_binarys_help`: `docs/src/reference/cli.md` below its marker
//!   line is exactly what `murmur … --help` prints, for every command and subcommand that
//!   `murmur --help` lists (found by parsing it, so a new command is not left out).
//!   `MURMUR_BLESS=1 cargo test --release -p murmur --test guide` rewrites it instead.
//! - `help_does_not_depend_on_the_terminal`: the help is the same for any `COLUMNS` (clap
//!   wraps to the terminal only with its `wrap_help` feature, which murmur does not use).
//! - `the_guides_commands_run`: every fenced code block marked `console,test` in
//!   `docs/src/**/*.md` and `README.md` is run, in a fresh temporary folder (never in the
//!   repository), with the built binary (the conventions are in `docs/README.md`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The line after which `cli.md` is generated.
const MARKER: &str =
    "<!-- generated below: MURMUR_BLESS=1 cargo test --release -p murmur --test guide -->";

/// How long one command of a `console,test` block may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("node/ is in the repository")
        .to_path_buf()
}

/// `murmur` with an environment that makes its output independent of the caller's
/// terminal and settings.
fn murmur() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_murmur"));
    c.env_remove("CLICOLOR_FORCE")
        .env_remove("MURMUR_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    c
}

/// `murmur ARGS --help`: its stdout, each line without trailing blanks, ending in one
/// newline.
fn help(args: &[&str]) -> String {
    let out = murmur()
        .args(args)
        .arg("--help")
        .output()
        .expect("running murmur");
    assert!(
        out.status.success(),
        "murmur {} --help: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines.join("\n") + "\n"
}

/// The subcommands a help text lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path, depth first in `--help` order: `[]`, `["launch"]`, …,
/// `["topology"]`, `["topology", "inspect"]`.
fn command_paths(prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let args: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let text = help(&args);
    out.push(prefix.clone());
    for sub in subcommands(&text) {
        let mut p = prefix.clone();
        p.push(sub);
        command_paths(p, out);
    }
}

/// The generated part of `cli.md`: one section per command with its `--help`.
fn generated_reference() -> String {
    let mut paths = Vec::new();
    command_paths(Vec::new(), &mut paths);
    assert!(
        paths.len() >= 8,
        "expected murmur and its subcommands, found {paths:?}"
    );
    let mut text = String::from("\n");
    for p in &paths {
        let args: Vec<&str> = p.iter().map(String::as_str).collect();
        let name = if p.is_empty() {
            "murmur".to_string()
        } else {
            format!("murmur {}", p.join(" "))
        };
        write!(
            text,
            "\n## `{name}`\n\n```text\n$ {name} --help\n{}```\n",
            help(&args)
        )
        .unwrap();
    }
    text
}

/// The first line where `a` and `b` differ, with a few lines around it.
fn first_difference(want: &str, have: &str) -> String {
    let (w, h): (Vec<&str>, Vec<&str>) = (want.lines().collect(), have.lines().collect());
    let i = (0..w.len().max(h.len()))
        .find(|&i| w.get(i) != h.get(i))
        .unwrap_or(0);
    let show = |lines: &[&str]| {
        (i.saturating_sub(2)..(i + 3).min(lines.len()))
            .map(|k| format!("  {:>5} | {}", k + 1, lines[k]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "first difference at line {} of the generated part:\n--help prints:\n{}\nthe page has:\n{}",
        i + 1,
        show(&w),
        show(&h)
    )
}

#[test]
fn the_cli_reference_is_the_binarys_help() {
    let path = repo().join("docs/src/reference/cli.md");
    let page = std::fs::read_to_string(&path).expect("reading docs/src/reference/cli.md");
    let Some(at) = page.find(MARKER) else {
        panic!("{} has no marker line {MARKER}", path.display());
    };
    let head = &page[..at + MARKER.len()];
    let want = generated_reference();
    let have = &page[at + MARKER.len()..];
    if std::env::var_os("MURMUR_BLESS").is_some_and(|v| v != "0") {
        std::fs::write(&path, format!("{head}{want}")).expect("writing cli.md");
        return;
    }
    assert!(
        have == want,
        "docs/src/reference/cli.md is not what `murmur … --help` prints; \
         rewrite it with `MURMUR_BLESS=1 cargo test --release -p murmur --test guide` \
         and commit it.\n{}",
        first_difference(&want, have)
    );
}

#[test]
fn help_does_not_depend_on_the_terminal() {
    let with = |columns: &str| {
        murmur()
            .args(["launch", "--help"])
            .env("COLUMNS", columns)
            .env("LINES", "20")
            .output()
            .expect("running murmur")
            .stdout
    };
    assert_eq!(
        with("40"),
        with("250"),
        "`murmur launch --help` depends on COLUMNS"
    );
}

/// A fenced block marked `console,test`: its commands and what each must print.
#[derive(Debug)]
struct Block {
    /// `file:line` of the block's opening fence.
    at: String,
    steps: Vec<Step>,
}

#[derive(Debug)]
struct Step {
    /// `file:line` of the command.
    at: String,
    /// The command as written after `$ `.
    command: String,
    /// Lines shown under the command: each must be printed (stdout or stderr).
    expect: Vec<String>,
}

/// Whether a fence's info string marks a block to run: `console,test` (mdBook and
/// GitHub take the first word as the language and ignore the rest).
fn is_test_fence(info: &str) -> bool {
    let mut words = info.split(',').map(str::trim);
    words.next() == Some("console") && words.any(|w| w == "test")
}

/// The `console,test` blocks of a Markdown file.
fn blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path
        .strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string();
    let mut found = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let body: Vec<(usize, &str)> = lines
            .by_ref()
            .take_while(|(_, l)| l.trim_start() != "```")
            .map(|(k, l)| (k, l.get(indent..).unwrap_or(l.trim_start())))
            .collect();
        if !is_test_fence(info) {
            continue;
        }
        let mut steps: Vec<Step> = Vec::new();
        for (k, l) in body {
            if let Some(cmd) = l.strip_prefix("$ ") {
                steps.push(Step {
                    at: format!("{name}:{}", k + 1),
                    command: cmd.trim().to_string(),
                    expect: Vec::new(),
                });
            } else if let Some(step) = steps.last_mut() {
                if !l.trim().is_empty() {
                    step.expect.push(l.trim_end().to_string());
                }
            } else {
                panic!(
                    "{name}:{}: a console,test block must start with a `$ ` command",
                    k + 1
                );
            }
        }
        assert!(
            !steps.is_empty(),
            "{name}:{}: an empty console,test block",
            i + 1
        );
        found.push(Block {
            at: format!("{name}:{}", i + 1),
            steps,
        });
    }
    found
}

/// The Markdown files of the guide, and the README.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![repo().join("README.md")];
    walk(&repo().join("docs/src"), &mut files);
    files
}

/// The command to give bash: the documented ways of naming the binary become `murmur`,
/// which is the built binary on the block's `PATH`.
fn shell_command(command: &str) -> String {
    for prefix in [
        "cargo run --release -- ",
        "./target/release/murmur ",
        "target/release/murmur ",
    ] {
        if let Some(rest) = command.strip_prefix(prefix) {
            return format!("murmur {rest}");
        }
    }
    command.to_string()
}

/// Whether `output` has a line that `want` describes: the same line, or, for a `want`
/// that ends in `...`, a line that starts with the text before it.
fn printed(output: &str, want: &str) -> bool {
    match want.strip_suffix("...") {
        Some(prefix) => output.lines().any(|l| l.trim_end().starts_with(prefix)),
        None => output.lines().any(|l| l.trim_end() == want),
    }
}

/// Copies `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// A fresh folder for one block: `bin/murmur` (the built binary) and copies of the parts
/// of `experiments/` that the guide's commands read (run configs, topology files, the
/// cluster scripts), so that nothing is written into the repository.
fn sandbox() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_murmur"), bin.join("murmur")).unwrap();
    for sub in ["runs", "topologies", "cluster"] {
        copy_tree(
            &repo().join("experiments").join(sub),
            &dir.path().join("experiments").join(sub),
        );
    }
    dir
}

/// Runs one command with bash in `dir`; returns its exit status and output (stdout, then
/// stderr), or an error if it ran out of time (its whole process group is killed then).
fn run_step(dir: &Path, command: &str) -> Result<(std::process::ExitStatus, String), String> {
    use std::os::unix::process::CommandExt;
    let path = format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (out_path, err_path) = (dir.join(".stdout"), dir.join(".stderr"));
    let mut child = Command::new("bash")
        .args(["-c", command])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("MURMUR_LOG")
        .env_remove("CLICOLOR_FORCE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0)
        .spawn()
        .expect("running bash");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > COMMAND_TIMEOUT {
            // SAFETY: kill(2) on the process group this test started; no memory is involved.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
            return Err(format!("timed out after {COMMAND_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default()
        + &std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(out_path);
    let _ = std::fs::remove_file(err_path);
    Ok((status, output))
}

/// Runs a block's commands in order, in one fresh folder; the failures, described.
fn run_block(block: &Block) -> Vec<String> {
    let dir = sandbox();
    let mut failures = Vec::new();
    for step in &block.steps {
        let t0 = Instant::now();
        let (status, output) = match run_step(dir.path(), &shell_command(&step.command)) {
            Ok(r) => r,
            Err(why) => {
                failures.push(format!("{}: `{}` {why}", step.at, step.command));
                break;
            }
        };
        eprintln!(
            "{}: `{}`: {status} in {:.1} s",
            step.at,
            step.command,
            t0.elapsed().as_secs_f64()
        );
        // A block shows `error: …` under a command that must fail.
        let must_fail = step.expect.iter().any(|l| l.starts_with("error:"));
        let mut problems = Vec::new();
        if status.success() == must_fail {
            problems.push(if must_fail {
                "succeeded, but the guide shows it failing".to_string()
            } else {
                format!("failed ({status})")
            });
        }
        for want in step.expect.iter().filter(|l| l.trim() != "...") {
            if !printed(&output, want) {
                problems.push(format!("did not print `{want}`"));
            }
        }
        if !problems.is_empty() {
            let tail: Vec<&str> = output.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            failures.push(format!(
                "{}: `{}` {}; its output ended with:\n{}",
                step.at,
                step.command,
                problems.join("; "),
                tail.join("\n")
            ));
            break;
        }
    }
    failures
}

#[test]
fn the_guides_commands_run() {
    let blocks: Vec<Block> = markdown_files().iter().flat_map(|f| blocks(f)).collect();
    assert!(
        blocks.len() >= 10,
        "expected the guide's console,test blocks, found {}: {:?}",
        blocks.len(),
        blocks.iter().map(|b| &b.at).collect::<Vec<_>>()
    );
    let failures: Vec<String> = blocks.iter().flat_map(run_block).collect();
    assert!(
        failures.is_empty(),
        "{} of the guide's commands failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_block_parser_reads_commands_and_their_output() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("page.md");
    std::fs::write(
        &file,
        "text\n```console,test\n$ murmur topology inspect ring --nodes 4\npeers              4\n...\n\
         $ echo 'error: it fails' >&2; false\nerror: it fails\n```\n```console\n$ not run\n```\n  ```console,test\n  $ echo indented\n  indented\n  ```\n",
    )
    .unwrap();
    let found = blocks(&file);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].steps.len(), 2);
    assert_eq!(found[0].steps[0].expect, ["peers              4", "..."]);
    assert_eq!(
        found[0].steps[1].command,
        "echo 'error: it fails' >&2; false"
    );
    assert_eq!(found[1].steps[0].expect, ["indented"]);
    assert!(printed("a\nerror: x: y\n", "error: x: ..."));
    assert!(!printed("a\n", "b"));
    assert_eq!(
        shell_command("cargo run --release -- launch --epochs 1"),
        "murmur launch --epochs 1"
    );
    assert!(run_block(&found[0]).is_empty());
}
