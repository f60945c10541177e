//! Topology files (TOML) and built topologies.
//!
//! A topology file has one of three forms. Every form accepts an optional
//! `name = "..."` used for display; unknown keys are an error.
//!
//! **Named** — a generator from [`crate::Graph`] plus a weight rule:
//!
//! ```toml
//! topology = "torus"          # ring | torus | complete | star | hypercube | exponential | erdos-renyi
//! nodes = 16                  # optional: may come from the caller (--peers)
//! rows = 4                    # torus only, optional (default: most-square factorisation)
//! cols = 4                    # torus only, optional
//! weights = "metropolis-hastings"  # or "max-degree"
//! ```
//!
//! ```toml
//! topology = "erdos-renyi"
//! nodes = 12
//! p = 0.4                     # required for erdos-renyi
//! seed = 7                    # optional, default 0
//! ```
//!
//! `weights` defaults to `"metropolis-hastings"` for undirected generators and to
//! `"max-degree"` for `"exponential"` (which is directed).
//!
//! **Edges** — an explicit edge list:
//!
//! ```toml
//! nodes = 4                   # optional if the caller gives the count
//! edges = [[0, 1], [1, 2], [2, 3], [3, 0]]
//! directed = false            # default; true means [a, b] is "a sends to b" only
//! weights = "metropolis-hastings"  # default; "max-degree" is the default when directed
//! ```
//!
//! **Dense** — the mixing matrix itself, `matrix[i][j] = W_ij`:
//!
//! ```toml
//! matrix = [[0.5, 0.5], [0.5, 0.5]]
//! ```
//!
//! **Schedule** — a time-varying push schedule for SGP ([`crate::PushSchedule`]):
//!
//! ```toml
//! schedule = "one-peer-exponential"   # round t: peer i pushes to i + 2^(t mod log2 n)
//! nodes = 16                          # optional if the caller gives the count
//! ```
//!
//! Its [`Topology`] is the static union of the schedule's rounds (the exponential graph
//! with uniform weights) and carries the schedule in [`Topology::schedule`].
//!
//! [`TopologySpec::build`] validates the result: W must be doubly stochastic within
//! [`crate::DEFAULT_TOLERANCE`] and its graph (strongly) connected.

use std::fmt;

use serde::Deserialize;

use crate::{Graph, MixingMatrix, PushSchedule, TopologyError, DEFAULT_TOLERANCE};

/// A named graph generator (`topology = "..."` in a topology file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NamedKind {
    /// [`Graph::ring`], `"ring"`.
    Ring,
    /// [`Graph::torus`], `"torus"`.
    Torus,
    /// [`Graph::complete`], `"complete"`.
    Complete,
    /// [`Graph::star`], `"star"`.
    Star,
    /// [`Graph::hypercube`], `"hypercube"`.
    Hypercube,
    /// [`Graph::exponential`], `"exponential"` (directed).
    Exponential,
    /// [`Graph::erdos_renyi`], `"erdos-renyi"`.
    ErdosRenyi,
}

impl NamedKind {
    /// All generators, in documentation order.
    pub const ALL: [NamedKind; 7] = [
        NamedKind::Ring,
        NamedKind::Torus,
        NamedKind::Complete,
        NamedKind::Star,
        NamedKind::Hypercube,
        NamedKind::Exponential,
        NamedKind::ErdosRenyi,
    ];

    /// The file/CLI name, e.g. `"erdos-renyi"`.
    pub fn as_str(self) -> &'static str {
        match self {
            NamedKind::Ring => "ring",
            NamedKind::Torus => "torus",
            NamedKind::Complete => "complete",
            NamedKind::Star => "star",
            NamedKind::Hypercube => "hypercube",
            NamedKind::Exponential => "exponential",
            NamedKind::ErdosRenyi => "erdos-renyi",
        }
    }

    /// Parses a name (exact, lower case). Errors: [`TopologyError::UnknownTopology`] listing
    /// the valid names.
    pub fn parse(name: &str) -> Result<NamedKind, TopologyError> {
        NamedKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| TopologyError::UnknownTopology {
                name: name.to_string(),
                valid: NamedKind::ALL.map(NamedKind::as_str).join(", "),
            })
    }

    /// `true` for generators that produce directed graphs (only `exponential`).
    pub fn is_directed(self) -> bool {
        matches!(self, NamedKind::Exponential)
    }
}

impl fmt::Display for NamedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How W is derived from a graph (`weights = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightRule {
    /// [`MixingMatrix::metropolis_hastings`], `"metropolis-hastings"` (undirected graphs).
    MetropolisHastings,
    /// [`MixingMatrix::max_degree`], `"max-degree"`.
    MaxDegree,
}

impl WeightRule {
    /// The file name of the rule.
    pub fn as_str(self) -> &'static str {
        match self {
            WeightRule::MetropolisHastings => "metropolis-hastings",
            WeightRule::MaxDegree => "max-degree",
        }
    }

    /// Parses a rule name. Errors: [`TopologyError::UnknownWeights`] listing valid rules.
    pub fn parse(name: &str) -> Result<WeightRule, TopologyError> {
        [WeightRule::MetropolisHastings, WeightRule::MaxDegree]
            .into_iter()
            .find(|r| r.as_str() == name)
            .ok_or_else(|| TopologyError::UnknownWeights {
                name: name.to_string(),
                valid: "metropolis-hastings, max-degree".to_string(),
            })
    }

    /// Applies the rule to `g`, producing W (n×n).
    pub fn apply(self, g: &Graph) -> Result<MixingMatrix, TopologyError> {
        match self {
            WeightRule::MetropolisHastings => MixingMatrix::metropolis_hastings(g),
            WeightRule::MaxDegree => MixingMatrix::max_degree(g),
        }
    }
}

impl fmt::Display for WeightRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of the three file forms a [`TopologySpec`] is.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SpecSource {
    /// `topology = "..."`.
    Named {
        /// The generator.
        kind: NamedKind,
        /// Torus rows (torus only).
        rows: Option<usize>,
        /// Torus columns (torus only).
        cols: Option<usize>,
        /// Edge probability (erdos-renyi only, required there).
        p: Option<f64>,
        /// RNG seed (erdos-renyi only; default 0).
        seed: Option<u64>,
    },
    /// `edges = [[a, b], ...]`.
    Edges {
        /// Edges `(a, b)`.
        edges: Vec<(usize, usize)>,
        /// `true`: `(a, b)` means only `a -> b`.
        directed: bool,
    },
    /// `matrix = [[...], ...]`, rows of W.
    Dense {
        /// `matrix[i][j] = W_ij`.
        matrix: Vec<Vec<f64>>,
    },
    /// `schedule = "one-peer-exponential"`: the time-varying one-peer exponential graph
    /// (Assran et al. 2019), the only schedule so far.
    OnePeerExponential,
}

/// The name of the time-varying one-peer exponential graph (Assran et al. 2019), in files
/// (`schedule = "..."`) and for `--topology`: in round t peer i sends only to
/// i + 2^(t mod ⌈log2 n⌉). For SGP/push-sum.
pub const ONE_PEER_EXPONENTIAL: &str = "one-peer-exponential";

/// A parsed topology file (TOML); see the module documentation for the three forms.
///
/// Fields are public so callers can adjust a spec (e.g. set `nodes`) before
/// [`TopologySpec::build`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TopologySpec {
    /// Display name (`name = "..."`).
    pub name: Option<String>,
    /// Peer count fixed by the file (`nodes = N`), if any.
    pub nodes: Option<usize>,
    /// Weight rule; `None` means the form's default. Always `None` for the dense form.
    pub weights: Option<WeightRule>,
    /// The graph/matrix description.
    pub source: SpecSource,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: Option<String>,
    topology: Option<String>,
    nodes: Option<usize>,
    rows: Option<usize>,
    cols: Option<usize>,
    p: Option<f64>,
    seed: Option<u64>,
    weights: Option<String>,
    edges: Option<Vec<(usize, usize)>>,
    directed: Option<bool>,
    matrix: Option<Vec<Vec<f64>>>,
    schedule: Option<String>,
}

fn spec_err(message: impl Into<String>) -> TopologyError {
    TopologyError::Spec {
        message: message.into(),
    }
}

/// The graph-text forms [`TopologySpec::write_graph`] writes (`murmur topology export
/// --format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphFormat {
    /// decentralizepy's `.edges`: n, then every edge in both directions, `i j` per line.
    Edges,
    /// decentralizepy's adjacency list: n, then line i lists peer i's neighbours.
    Adjacency,
    /// A plain edge list, each undirected edge once (`i j`, i < j), as NetworkX's
    /// `write_edgelist(G, path, data=False)` writes and `read_edgelist(path, nodetype=int)`
    /// reads.
    EdgeList,
}

impl std::str::FromStr for GraphFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "edges" => Ok(GraphFormat::Edges),
            "adjacency" => Ok(GraphFormat::Adjacency),
            "edgelist" => Ok(GraphFormat::EdgeList),
            _ => Err(format!(
                "unknown graph format {s:?} (edges: decentralizepy's .edges; adjacency: its \
                 adjacency list; edgelist: one `i j` per edge, NetworkX's)"
            )),
        }
    }
}

/// Whether the lines after a first line `n` are decentralizepy's adjacency list: exactly n
/// lines, none listing its own rank, and not all pairs listed in both directions.
fn is_adjacency_list(n: usize, rows: &[(usize, Vec<usize>)]) -> bool {
    if rows.len() != n || rows.iter().enumerate().any(|(i, (_, r))| r.contains(&i)) {
        return false;
    }
    let pairs: std::collections::HashSet<(usize, usize)> = rows
        .iter()
        .filter_map(|(_, r)| match r[..] {
            [a, b] => Some((a, b)),
            _ => None,
        })
        .collect();
    let all_pairs = pairs.len() == rows.len();
    !(all_pairs && pairs.iter().all(|&(a, b)| pairs.contains(&(b, a))))
}

/// The spec of an undirected graph read from a graph text (`what` names the form in the
/// errors): n is `declared` or the largest rank + 1.
fn edges_spec(
    declared: Option<usize>,
    mut edges: Vec<(usize, usize)>,
    what: &str,
) -> Result<TopologySpec, TopologyError> {
    if edges.is_empty() {
        return Err(spec_err(format!("{what} without an edge")));
    }
    edges.sort_unstable();
    edges.dedup();
    let largest = edges.iter().map(|&(_, b)| b).max().unwrap_or(0);
    let n = declared.unwrap_or(largest + 1);
    if largest >= n {
        return Err(spec_err(format!(
            "{what}: rank {largest} is listed but the first line says {n} peers"
        )));
    }
    Ok(TopologySpec {
        name: None,
        nodes: Some(n),
        weights: None,
        source: SpecSource::Edges {
            edges,
            directed: false,
        },
    })
}

/// Errors if any of the `(key, present)` pairs is present, naming the key and context.
fn forbid(keys: &[(&str, bool)], context: &str) -> Result<(), TopologyError> {
    match keys.iter().find(|(_, present)| *present) {
        Some((key, _)) => Err(spec_err(format!("key `{key}` is not valid for {context}"))),
        None => Ok(()),
    }
}

impl TopologySpec {
    /// Parses a topology file from TOML text (no I/O).
    ///
    /// Errors: [`TopologyError::Toml`] for syntax/type errors and unknown keys (toml's message,
    /// with line and column); [`TopologyError::Spec`] when not exactly one of `topology`,
    /// `edges`, `matrix` is given or a key does not apply to the form;
    /// [`TopologyError::UnknownTopology`]; [`TopologyError::UnknownWeights`].
    ///
    /// A text that is an edge list instead — decentralizepy's `.edges` files (the peer count
    /// on the first line, then one `i j` edge per line, both directions listed) or a plain
    /// edge list (`u v` per line, `#` comments, as NetworkX's `write_edgelist(G, path,
    /// data=False)` writes) — is read as an undirected graph on ranks 0..n
    /// ([`TopologySpec::parse_edge_list`]); it is told from TOML by its content.
    pub fn parse(text: &str) -> Result<TopologySpec, TopologyError> {
        if let Some(edges) = Self::parse_edge_list(text) {
            return edges;
        }
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            let assigns = text
                .lines()
                .map(|l| l.split('#').next().unwrap_or(""))
                .any(|l| l.contains('=') || l.trim_start().starts_with('['));
            TopologyError::Toml {
                message: if assigns {
                    e.to_string()
                } else {
                    "neither TOML (murmur's topology file: `topology = \"ring\"`, `edges = \
                     [[0, 1], …]` or `matrix = […]`) nor a graph text (an edge list: `i j` \
                     per line, optionally after a first line with the peer count, as \
                     decentralizepy's .edges and NetworkX's write_edgelist; or \
                     decentralizepy's adjacency list: the peer count, then line i lists peer \
                     i's neighbours); `#` starts a comment"
                        .to_string()
                },
            }
        })?;
        let forms = [
            raw.topology.is_some(),
            raw.edges.is_some(),
            raw.matrix.is_some(),
            raw.schedule.is_some(),
        ];
        if forms.iter().filter(|&&f| f).count() != 1 {
            return Err(spec_err(
                "exactly one of `topology`, `edges`, `matrix` or `schedule` must be given",
            ));
        }
        let weights = raw.weights.as_deref().map(WeightRule::parse).transpose()?;
        // The keys that describe a generated graph, refused by the forms that have none.
        let graph_options = [
            ("rows", raw.rows.is_some()),
            ("cols", raw.cols.is_some()),
            ("p", raw.p.is_some()),
            ("seed", raw.seed.is_some()),
            ("directed", raw.directed.is_some()),
            ("weights", weights.is_some()),
        ];
        let source = if let Some(t) = raw.topology {
            let kind = NamedKind::parse(&t)?;
            forbid(&[("directed", raw.directed.is_some())], "named topologies")?;
            if kind != NamedKind::Torus {
                forbid(
                    &[("rows", raw.rows.is_some()), ("cols", raw.cols.is_some())],
                    &format!("topology \"{kind}\""),
                )?;
            }
            if kind != NamedKind::ErdosRenyi {
                forbid(
                    &[("p", raw.p.is_some()), ("seed", raw.seed.is_some())],
                    &format!("topology \"{kind}\""),
                )?;
            } else if raw.p.is_none() {
                return Err(spec_err(
                    "topology \"erdos-renyi\" needs the edge probability `p` (`p = 0.3` in a \
                     file; `erdos-renyi:p=0.3` on the command line)",
                ));
            }
            if let (Some(r), Some(c), Some(n)) = (raw.rows, raw.cols, raw.nodes) {
                if r.checked_mul(c) != Some(n) {
                    return Err(TopologyError::InvalidTorus {
                        rows: r,
                        cols: c,
                        reason: format!("rows × cols must equal nodes = {n}"),
                    });
                }
            }
            SpecSource::Named {
                kind,
                rows: raw.rows,
                cols: raw.cols,
                p: raw.p,
                seed: raw.seed,
            }
        } else if let Some(edges) = raw.edges {
            let ctx = "an edge-list topology";
            forbid(
                &[("rows", raw.rows.is_some()), ("cols", raw.cols.is_some())],
                ctx,
            )?;
            forbid(&[("p", raw.p.is_some()), ("seed", raw.seed.is_some())], ctx)?;
            SpecSource::Edges {
                edges,
                directed: raw.directed.unwrap_or(false),
            }
        } else if let Some(name) = raw.schedule {
            if name != ONE_PEER_EXPONENTIAL {
                return Err(spec_err(format!(
                    "unknown schedule {name:?} (the one schedule is \"{ONE_PEER_EXPONENTIAL}\")"
                )));
            }
            forbid(&graph_options, "a schedule")?;
            SpecSource::OnePeerExponential
        } else {
            forbid(&graph_options, "a dense-matrix topology")?;
            SpecSource::Dense {
                matrix: raw.matrix.unwrap_or_default(),
            }
        };
        Ok(TopologySpec {
            name: raw.name,
            nodes: raw.nodes,
            weights,
            source,
        })
    }

    /// An undirected graph from a graph text, if `text` is one: every line that is not
    /// blank or a `#` comment holds whitespace-separated non-negative integers (after them,
    /// a `{…}` data dictionary as NetworkX's `write_edgelist` appends is ignored). Three
    /// forms, told apart by their content:
    /// - an **edge list**, two ranks per line (`i j`, 0-based), an edge listed in both
    ///   directions counting once; the first line may hold one number, the peer count n
    ///   (decentralizepy's `.edges` files), else n is the largest rank + 1 (a plain edge
    ///   list, NetworkX's `write_edgelist(G, path, data=False)`);
    /// - decentralizepy's **adjacency list** (`graph.adj`): n on the first line, then
    ///   exactly n lines, line i listing peer i's neighbours. Taken when the lines after the
    ///   first are n, none lists its own line's rank, and they are not all pairs listed in
    ///   both directions (which is an edge list); an edge list of n pairs that list no rank
    ///   on its own line is read as an adjacency list too, so write the peer count only
    ///   when the edges are listed in both directions, as decentralizepy does.
    ///
    /// `None` if the text is none of these (then it is TOML); `Some(Err)` for a peer count
    /// below a listed rank, an edge of one rank, or no edge at all.
    pub fn parse_edge_list(text: &str) -> Option<Result<TopologySpec, TopologyError>> {
        let mut rows: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("");
            let line = line.split('{').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let numbers: Option<Vec<usize>> =
                line.split_whitespace().map(|t| t.parse().ok()).collect();
            rows.push((i + 1, numbers?));
        }
        let (declared, edge_rows) = match rows.split_first() {
            Some(((_, first), rest)) if first.len() == 1 => (Some(first[0]), rest),
            _ => (None, &rows[..]),
        };
        if let Some(n) = declared.filter(|&n| is_adjacency_list(n, edge_rows)) {
            let edges = edge_rows
                .iter()
                .enumerate()
                .flat_map(|(i, (_, nbrs))| nbrs.iter().map(move |&j| (i.min(j), i.max(j))));
            return Some(edges_spec(Some(n), edges.collect(), "adjacency list"));
        }
        let mut edges = Vec::new();
        for (line, numbers) in edge_rows {
            match numbers[..] {
                [a, b] if a != b => edges.push((a.min(b), a.max(b))),
                [a, b] => {
                    return Some(Err(spec_err(format!(
                        "edge list, line {line}: the edge {a} {b} joins a peer to itself"
                    ))))
                }
                _ => {
                    return Some(Err(spec_err(format!(
                        "edge list, line {line}: expected two ranks `i j`, found {} numbers",
                        numbers.len()
                    ))))
                }
            }
        }
        if edges.is_empty() && rows.is_empty() {
            return None;
        }
        Some(edges_spec(declared, edges, "edge list"))
    }

    /// `graph` (undirected: every edge in both directions) as a graph text in `format`, what
    /// `murmur topology export` writes; [`TopologySpec::parse_edge_list`] reads each form
    /// back to the same graph.
    pub fn write_graph(graph: &Graph, format: GraphFormat) -> String {
        let n = graph.n();
        let mut out = String::new();
        match format {
            GraphFormat::Edges => {
                out.push_str(&format!("{n}\n"));
                for i in 0..n {
                    for &j in graph.out_neighbors(i) {
                        out.push_str(&format!("{i} {j}\n"));
                    }
                }
            }
            GraphFormat::Adjacency => {
                out.push_str(&format!("{n}\n"));
                for i in 0..n {
                    let line: Vec<String> = graph
                        .out_neighbors(i)
                        .iter()
                        .map(|j| j.to_string())
                        .collect();
                    out.push_str(&line.join(" "));
                    out.push('\n');
                }
            }
            GraphFormat::EdgeList => {
                for i in 0..n {
                    for &j in graph.out_neighbors(i).iter().filter(|&&j| j > i) {
                        out.push_str(&format!("{i} {j}\n"));
                    }
                }
            }
        }
        out
    }

    /// A named topology as the command line gives it: `NAME` or `NAME:key=value,...` with
    /// the keys of a topology file's named form — `rows`, `cols` (torus), `p`, `seed`
    /// (erdos-renyi) and `weights` — e.g. `erdos-renyi:p=0.3,seed=7`, `torus:rows=2,cols=4`,
    /// `ring:weights=max-degree`. The peer count comes from the caller. Checked exactly as
    /// the same keys in a file ([`TopologySpec::parse`]): erdos-renyi without `p` is refused.
    ///
    /// Errors: [`TopologyError::UnknownTopology`] listing the valid names;
    /// [`TopologyError::Spec`] for an option that is not `key=value`, an unknown key, a value
    /// of the wrong type, or a key that does not apply to the topology.
    pub fn named(text: &str) -> Result<TopologySpec, TopologyError> {
        let (kind, options) = match text.split_once(':') {
            Some((k, o)) => (k.trim(), Some(o)),
            None => (text.trim(), None),
        };
        let kind = NamedKind::parse(kind)?;
        // The options become the keys of a topology file, so one set of checks serves both.
        let mut toml_text = format!("topology = \"{kind}\"\n");
        for option in options.into_iter().flat_map(|o| o.split(',')) {
            let (key, value) = option.split_once('=').ok_or_else(|| {
                spec_err(format!(
                    "topology {text:?}: option {option:?} is not key=value (e.g. {kind}:p=0.3)"
                ))
            })?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |what: &str| {
                spec_err(format!(
                    "topology {text:?}: `{key}` must be {what}, got {value:?}"
                ))
            };
            let literal = match key {
                "rows" | "cols" | "seed" => value
                    .parse::<u64>()
                    .map_err(|_| bad("a non-negative integer"))?
                    .to_string(),
                "p" => {
                    let p = value.parse::<f64>().map_err(|_| bad("a number"))?;
                    if !p.is_finite() {
                        return Err(bad("a finite number"));
                    }
                    format!("{p:?}")
                }
                "weights" => format!("\"{}\"", WeightRule::parse(value)?),
                _ => {
                    return Err(spec_err(format!(
                        "topology {text:?}: unknown option `{key}` (options: rows, cols, p, \
                         seed, weights)"
                    )))
                }
            };
            toml_text.push_str(&format!("{key} = {literal}\n"));
        }
        TopologySpec::parse(&toml_text)
    }

    /// The peer count the spec itself fixes: `nodes`, else torus `rows × cols`, else the
    /// dense matrix size.
    pub fn file_nodes(&self) -> Option<usize> {
        self.nodes.or(match &self.source {
            SpecSource::Named {
                rows: Some(r),
                cols: Some(c),
                ..
            } => r.checked_mul(*c),
            SpecSource::Dense { matrix } => Some(matrix.len()),
            _ => None,
        })
    }

    /// Builds the topology for n peers. `nodes`: the caller's peer count (CLI --peers);
    /// if the file also fixes a count and they differ -> Err(NodeCountMismatch{file, requested}).
    /// If neither gives a count -> Err(MissingNodeCount).
    ///
    /// The result is validated: W (n×n) doubly stochastic within [`DEFAULT_TOLERANCE`] and
    /// the graph (strongly) connected. Errors: any generator error (e.g.
    /// [`TopologyError::NotPowerOfTwo`], [`TopologyError::Disconnected`]),
    /// [`TopologyError::NotSymmetric`] for Metropolis–Hastings on a directed graph,
    /// [`TopologyError::RowSum`] / [`TopologyError::ColumnSum`] / [`TopologyError::Negative`]
    /// / [`TopologyError::NotConnected`], [`TopologyError::Spec`] for missing options.
    pub fn build(&self, nodes: Option<usize>) -> Result<Topology, TopologyError> {
        let n = match (self.file_nodes(), nodes) {
            (Some(file), Some(requested)) if file != requested => {
                return Err(TopologyError::NodeCountMismatch { file, requested })
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => return Err(TopologyError::MissingNodeCount),
        };
        let (default_name, graph, w) = match &self.source {
            SpecSource::Named {
                kind,
                rows,
                cols,
                p,
                seed,
            } => {
                let (graph, label) = match kind {
                    NamedKind::Ring => (Graph::ring(n)?, format!("ring(n={n})")),
                    NamedKind::Complete => (Graph::complete(n)?, format!("complete(n={n})")),
                    NamedKind::Star => (Graph::star(n)?, format!("star(n={n})")),
                    NamedKind::Hypercube => (Graph::hypercube(n)?, format!("hypercube(n={n})")),
                    NamedKind::Exponential => {
                        (Graph::exponential(n)?, format!("exponential(n={n})"))
                    }
                    NamedKind::Torus => {
                        let (r, c) = torus_shape(n, *rows, *cols)?;
                        (Graph::torus(r, c)?, format!("torus({r}x{c})"))
                    }
                    NamedKind::ErdosRenyi => {
                        let p = p.ok_or_else(|| {
                            spec_err("topology \"erdos-renyi\" needs the edge probability `p`")
                        })?;
                        let seed = seed.unwrap_or(0);
                        (
                            Graph::erdos_renyi(n, p, seed)?,
                            format!("erdos-renyi(n={n}, p={p}, seed={seed})"),
                        )
                    }
                };
                let rule = self.weights.unwrap_or(if kind.is_directed() {
                    WeightRule::MaxDegree
                } else {
                    WeightRule::MetropolisHastings
                });
                if let Some(peer) = graph.first_unconnected() {
                    return Err(TopologyError::NotConnected { peer });
                }
                let w = rule.apply(&graph)?;
                (format!("{label}/{rule}"), graph, w)
            }
            SpecSource::Edges { edges, directed } => {
                let graph = Graph::from_edges(n, edges, *directed)?;
                let rule = self.weights.unwrap_or(if *directed {
                    WeightRule::MaxDegree
                } else {
                    WeightRule::MetropolisHastings
                });
                if let Some(peer) = graph.first_unconnected() {
                    return Err(TopologyError::NotConnected { peer });
                }
                let w = rule.apply(&graph)?;
                (
                    format!("edges(n={n}, {} edges)/{rule}", edges.len()),
                    graph,
                    w,
                )
            }
            SpecSource::Dense { matrix } => {
                let w = MixingMatrix::from_dense(matrix.clone())?;
                (format!("dense(n={n})"), w.graph(), w)
            }
            SpecSource::OnePeerExponential => {
                let graph = Graph::exponential(n)?;
                let w = WeightRule::MaxDegree.apply(&graph)?;
                (format!("{ONE_PEER_EXPONENTIAL}(n={n})"), graph, w)
            }
        };
        w.validate_doubly_stochastic(DEFAULT_TOLERANCE)?;
        let schedule = match self.source {
            SpecSource::OnePeerExponential => Some(PushSchedule::one_peer_exponential(n)?),
            _ => None,
        };
        Ok(Topology {
            name: self.name.clone().unwrap_or(default_name),
            graph,
            w,
            schedule,
        })
    }
}

/// Torus dimensions for `n` peers: given ones must multiply to `n`; a missing one is derived;
/// with neither, the most-square factorisation `rows <= cols`.
fn torus_shape(
    n: usize,
    rows: Option<usize>,
    cols: Option<usize>,
) -> Result<(usize, usize), TopologyError> {
    let bad = |rows: usize, cols: usize, reason: String| TopologyError::InvalidTorus {
        rows,
        cols,
        reason,
    };
    match (rows, cols) {
        (Some(0), _) | (_, Some(0)) => Err(bad(
            rows.unwrap_or(0),
            cols.unwrap_or(0),
            "both dimensions must be >= 1".into(),
        )),
        (Some(r), Some(c)) if r.checked_mul(c) == Some(n) => Ok((r, c)),
        (Some(r), Some(c)) => Err(bad(r, c, format!("rows × cols must equal nodes = {n}"))),
        (Some(r), None) if n.is_multiple_of(r) => Ok((r, n / r)),
        (Some(r), None) => Err(bad(r, 0, format!("rows = {r} does not divide nodes = {n}"))),
        (None, Some(c)) if n.is_multiple_of(c) => Ok((n / c, c)),
        (None, Some(c)) => Err(bad(0, c, format!("cols = {c} does not divide nodes = {n}"))),
        (None, None) => {
            let r = (1..=n)
                .take_while(|r| r * r <= n)
                .filter(|&r| n.is_multiple_of(r))
                .last()
                .unwrap_or(1);
            Ok((r, n / r))
        }
    }
}

/// A validated topology: peer graph and doubly stochastic mixing matrix W (n×n) on it.
///
/// `graph` is the communication graph (for the dense form: the support graph of W).
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Display name (the file's `name`, or a generated one such as `ring(n=8)/metropolis-hastings`).
    pub name: String,
    /// Communication graph; edge `j -> i` iff `W_ij ≠ 0` for `i ≠ j`.
    pub graph: Graph,
    /// Mixing matrix W, n×n.
    pub w: MixingMatrix,
    /// The time-varying push schedule of a `schedule = ...` file (then `graph` and `w` are
    /// the union of its rounds); `None` for a static topology.
    pub schedule: Option<PushSchedule>,
}

/// What `murmur topology inspect` prints; serde field names are a stable interface.
///
/// Degrees are out-degrees of `graph` (peers a peer sends to); for undirected and balanced
/// graphs they equal in-degrees.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InspectReport {
    /// Topology name.
    pub name: String,
    /// Peer count.
    pub n: usize,
    /// Directed edge count (an undirected edge counts twice).
    pub edges: usize,
    /// Smallest out-degree.
    pub min_degree: usize,
    /// Largest out-degree.
    pub max_degree: usize,
    /// Mean out-degree, `edges / n`.
    pub mean_degree: f64,
    /// Rows of W sum to 1 (within [`DEFAULT_TOLERANCE`]).
    pub row_stochastic: bool,
    /// Columns of W sum to 1.
    pub column_stochastic: bool,
    /// Both.
    pub doubly_stochastic: bool,
    /// W is symmetric.
    pub symmetric: bool,
    /// Support graph strongly connected.
    pub connected: bool,
    /// `|λ₂(W)|`, second largest eigenvalue modulus.
    pub lambda2_abs: f64,
    /// `1 - |λ₂(W)|`.
    pub spectral_gap: f64,
    /// The time-varying schedule, if any (then the other fields describe the union of its
    /// rounds): its name and period in rounds, e.g. `one-peer-exponential, period 4`.
    pub schedule: Option<String>,
}

impl Topology {
    /// The push schedule of push-sum (SGP): the time-varying schedule if the topology has
    /// one, else the static graph of W.
    ///
    /// Errors: [`TopologyError::NotConnected`] if W's graph is not strongly connected.
    pub fn push_schedule(&self) -> Result<PushSchedule, TopologyError> {
        match &self.schedule {
            Some(s) => Ok(s.clone()),
            None => PushSchedule::fixed(self.w.graph()),
        }
    }

    /// Computes the [`InspectReport`] (O(n³) for the eigenvalues).
    pub fn inspect(&self) -> InspectReport {
        let n = self.graph.n();
        let degrees: Vec<usize> = (0..n).map(|i| self.graph.out_degree(i)).collect();
        let edges = self.graph.edge_count();
        let checks = self.w.checks(DEFAULT_TOLERANCE);
        let lambda2_abs = self.w.second_eigenvalue_modulus();
        InspectReport {
            name: self.name.clone(),
            n,
            edges,
            min_degree: degrees.iter().copied().min().unwrap_or(0),
            max_degree: degrees.iter().copied().max().unwrap_or(0),
            mean_degree: if n == 0 { 0.0 } else { edges as f64 / n as f64 },
            row_stochastic: checks.row_stochastic,
            column_stochastic: checks.column_stochastic,
            doubly_stochastic: checks.doubly_stochastic,
            symmetric: checks.symmetric,
            connected: checks.connected,
            lambda2_abs,
            spectral_gap: 1.0 - lambda2_abs,
            schedule: self
                .schedule
                .as_ref()
                .map(|s| format!("{ONE_PEER_EXPONENTIAL}, period {}", s.period())),
        }
    }
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yn = |b: bool| if b { "yes" } else { "no" };
        writeln!(f, "topology           {}", self.name)?;
        writeln!(f, "peers              {}", self.n)?;
        writeln!(f, "directed edges     {}", self.edges)?;
        writeln!(
            f,
            "degree             min {}, max {}, mean {:.3}",
            self.min_degree, self.max_degree, self.mean_degree
        )?;
        writeln!(f, "row stochastic     {}", yn(self.row_stochastic))?;
        writeln!(f, "column stochastic  {}", yn(self.column_stochastic))?;
        writeln!(f, "doubly stochastic  {}", yn(self.doubly_stochastic))?;
        writeln!(f, "symmetric          {}", yn(self.symmetric))?;
        writeln!(f, "connected          {}", yn(self.connected))?;
        writeln!(f, "|lambda_2|         {:.6}", self.lambda2_abs)?;
        write!(f, "spectral gap       {:.6}", self.spectral_gap)?;
        if let Some(s) = &self.schedule {
            write!(f, " (of the union of the rounds)\nschedule           {s}")?;
        }
        Ok(())
    }
}
