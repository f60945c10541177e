//! Run configs and topologies read from files, and small text helpers.

use std::path::PathBuf;

use anyhow::{bail, Context};
use murmur_topology::{Topology, TopologySpec, ONE_PEER_EXPONENTIAL};

/// `n` and `noun`, plural unless n = 1: "1 peer", "8 peers".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A topology from a name or a TOML file; `nodes` is the peer count the caller wants.
pub fn load_topology(name_or_path: &str, nodes: Option<usize>) -> anyhow::Result<Topology> {
    let path = std::path::Path::new(name_or_path);
    let spec = if path.extension().is_some_and(|e| e == "toml") || path.is_file() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read topology file {}", path.display()))?;
        TopologySpec::parse(&text).with_context(|| format!("topology file {}", path.display()))?
    } else if name_or_path == ONE_PEER_EXPONENTIAL {
        TopologySpec::parse(&format!("schedule = \"{ONE_PEER_EXPONENTIAL}\""))?
    } else {
        TopologySpec::named(name_or_path)?
    };
    spec.build(nodes)
        .with_context(|| format!("topology {name_or_path}"))
}

/// Expands `--config FILE` (or `--config=FILE`) in a command line into the run options of a
/// TOML run config, inserted right after the subcommand so that options given on the
/// command line after them win (the parser must allow an option to override itself).
///
/// The file is a flat table whose keys are the long option names, with `-` or `_`:
///
/// ```toml
/// algorithm = "choco"
/// compressor = "topk:0.01"
/// peers = 16
/// topology = "experiments/topologies/torus16.toml"
/// no_overlap = true            # a flag: true sets it, false leaves it out
/// straggler = ["3:2", "5:4"]   # a repeatable option (murmur simulate)
/// ```
///
/// # Errors
/// A second `--config`, an unreadable file, a TOML syntax error (with its line), or a value
/// that is a table or a date.
pub fn expand_config_args(
    args: Vec<std::ffi::OsString>,
) -> anyhow::Result<Vec<std::ffi::OsString>> {
    let mut out = Vec::with_capacity(args.len());
    let mut path: Option<PathBuf> = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let file = match a.to_str() {
            Some("--config") => Some(
                it.next()
                    .map(PathBuf::from)
                    .context("--config needs a file name")?,
            ),
            Some(s) if s.starts_with("--config=") => Some(PathBuf::from(&s["--config=".len()..])),
            _ => None,
        };
        match file {
            Some(f) if path.is_some() => bail!(
                "--config {} given after --config {}: one run config at a time",
                f.display(),
                path.as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            Some(f) => path = Some(f),
            None => out.push(a),
        }
    }
    let Some(path) = path else {
        return Ok(out);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read run config {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("run config {}", path.display()))?;
    let mut from_file = Vec::new();
    for (key, value) in &table {
        let flag = format!("--{}", key.replace('_', "-"));
        let scalar = |v: &toml::Value| -> anyhow::Result<String> {
            Ok(match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => bail!(
                    "run config {}: `{key}` must be a string, a number, true/false or a list \
                     of those, not {}",
                    path.display(),
                    other.type_str()
                ),
            })
        };
        match value {
            toml::Value::Boolean(true) => from_file.push(flag.into()),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for v in items {
                    from_file.push(format!("{flag}={}", scalar(v)?).into());
                }
            }
            v => from_file.push(format!("{flag}={}", scalar(v)?).into()),
        }
    }
    // After the program name and the subcommand.
    let at = out.len().min(2);
    out.splice(at..at, from_file);
    Ok(out)
}
