//! Per-peer checkpoints: the state a restarted peer needs to continue.
//!
//! With `--checkpoint-every K` every peer writes `<run>/checkpoints/peer-<rank>.ckpt` after
//! every K-th round: its parameters x (`[d]`, the model's parameter vector in the fixed
//! order that is also mixed), the model's state that is not a parameter (BatchNorm running
//! means and variances, `[s]`, s = 0 without BatchNorm; with x it rebuilds the model
//! exactly), its optimizer state (`[o]`: the heavy-ball velocity, o = d, or AdamW's moments
//! and step count, o = 2d + 1), its round, the peers it
//! knows to have left, what it had reported so far (bytes, seconds: [`PeerTotals`]), and the algorithm's own state ([`AlgorithmState`]: CHOCO's x̂_i and copies x̂_j, SGP's push-sum weight and
//! numerator, a compressor's error-feedback residual or DGC buffers). The file is written
//! to a temporary name, flushed to disk and renamed, so a kill at any moment leaves either
//! the previous checkpoint or the new one, never a torn file: a kill -9 loses only the
//! rounds since the last checkpoint.
//!
//! Format (little-endian): `b"MURMURCK" | version: u32 | json_len: u32 | JSON | x: d × f32 |
//! optimizer state: o × f32 | one d × f32 block per state vector | model state: s × f32`,
//! where the JSON holds the fields of [`CheckpointMeta`] plus `scalars` (the state's named
//! scalars), `vectors` (the state vectors' names, in the order of their blocks),
//! `model_state` (s) and `optimizer_state` (o). Version 1 files (before the algorithm state
//! was saved) are read with an empty state, versions 1 and 2 (before the model state) with
//! an empty model state, versions 1 to 3 (before o was written) with o = d.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use murmur_gossip::Rank;
use serde::{Deserialize, Serialize};

use murmur_gossip::AlgorithmState;

use crate::control::discovery::Fingerprint;
use crate::report::PeerTotals;

const MAGIC: &[u8; 8] = b"MURMURCK";
const VERSION: u32 = 4;

/// What a checkpoint says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// The peer's rank.
    pub rank: Rank,
    /// Rounds completed when it was written.
    pub round: u64,
    /// The run it belongs to: a checkpoint of another run is refused.
    pub fingerprint: Fingerprint,
    /// Peers this peer knew to have left, ascending.
    pub departed: Vec<Rank>,
    /// What this peer had reported so far at `round` (bytes, seconds, refused frames): a
    /// peer resumed from the checkpoint counts on from these. `None` in checkpoints written
    /// before it was saved (such a peer counts from 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<PeerTotals>,
}

/// One peer's saved state.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Rank, round, run and membership.
    pub meta: CheckpointMeta,
    /// Parameters x: `[d]`.
    pub x: Vec<f32>,
    /// The inner optimizer's state, `[o]` ([`crate::train::inner_optimizer::Optimizer::state`]:
    /// the heavy-ball velocity, o = d; AdamW's moments and step, o = 2d + 1).
    pub velocity: Vec<f32>,
    /// The algorithm's state beyond x and the round (vectors `[d]`).
    pub state: AlgorithmState,
    /// The model's state that is not a parameter: BatchNorm running statistics, `[s]`
    /// ([`crate::train::model::flatten_running_state`]); empty without BatchNorm.
    pub model_state: Vec<f32>,
}

/// The JSON part of the file: the metadata and the names of the state.
#[derive(Serialize, Deserialize)]
struct Header {
    #[serde(flatten)]
    meta: CheckpointMeta,
    #[serde(default)]
    scalars: Vec<(String, f64)>,
    #[serde(default)]
    vectors: Vec<String>,
    /// s, the length of the model state.
    #[serde(default)]
    model_state: usize,
    /// o, the length of the optimizer state (d before version 4: the heavy-ball velocity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    optimizer_state: Option<usize>,
}

/// The checkpoint before the one at `path`: `peer-<rank>.prev.ckpt`.
pub fn previous_path(path: &Path) -> PathBuf {
    path.with_extension("prev.ckpt")
}

/// `<run>/checkpoints/peer-<rank>.ckpt`.
pub fn path(run_dir: &Path, rank: Rank) -> PathBuf {
    run_dir
        .join("checkpoints")
        .join(format!("peer-{rank}.ckpt"))
}

impl Checkpoint {
    /// The file's bytes.
    pub fn to_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let d = self.x.len();
        if self.state.vectors.iter().any(|(_, v)| v.len() != d) {
            bail!("every state vector of a checkpoint must have d = {d} values");
        }
        if let Some((n, v)) = self.state.scalars.iter().find(|(_, v)| !v.is_finite()) {
            bail!("state scalar {n:?} = {v} is not finite (JSON cannot hold it)");
        }
        let json = serde_json::to_vec(&Header {
            meta: self.meta.clone(),
            scalars: self.state.scalars.clone(),
            vectors: self.state.vectors.iter().map(|(n, _)| n.clone()).collect(),
            model_state: self.model_state.len(),
            optimizer_state: Some(self.velocity.len()),
        })?;
        let blocks = 1 + self.state.vectors.len();
        let values = d * blocks + self.velocity.len() + self.model_state.len();
        let mut out = Vec::with_capacity(16 + json.len() + 4 * values);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        let state = self.state.vectors.iter().flat_map(|(_, v)| v);
        let values = self.x.iter().chain(&self.velocity).chain(state);
        for v in values.chain(&self.model_state) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(out)
    }

    /// Parses a checkpoint's bytes and checks it against the run: `fingerprint` and `d`
    /// must match and every value must be finite.
    ///
    /// # Errors
    /// Not a checkpoint, another version, truncated, another run or another d, non-finite
    /// values.
    pub fn from_bytes(bytes: &[u8], fingerprint: &Fingerprint, d: usize) -> anyhow::Result<Self> {
        if bytes.get(..8) != Some(MAGIC.as_slice()) {
            bail!("not a murmur checkpoint");
        }
        let word = |at: usize| {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let version = word(8).context("truncated header")?;
        if !(1..=VERSION).contains(&version) {
            bail!("checkpoint version {version}; this murmur reads versions 1 to {VERSION}");
        }
        let json_len = word(12).context("truncated header")? as usize;
        let json = bytes.get(16..16 + json_len).context("truncated metadata")?;
        let Header {
            meta,
            scalars,
            vectors: names,
            model_state: s,
            optimizer_state,
        } = serde_json::from_slice(json).context("checkpoint metadata")?;
        let o = optimizer_state.unwrap_or(d);
        if meta.fingerprint != *fingerprint {
            bail!(
                "it belongs to another run: {}",
                meta.fingerprint
                    .differences(fingerprint, "the checkpoint", "this run")
            );
        }
        let values = &bytes[16 + json_len..];
        let blocks = 1 + names.len();
        let expected = d
            .checked_mul(blocks)
            .and_then(|v| v.checked_add(o))
            .and_then(|v| v.checked_add(s))
            .and_then(|v| v.checked_mul(4));
        if Some(values.len()) != expected {
            bail!(
                "it holds {} bytes of values, expected {} for d = {d}, {blocks} vectors, {o} values of optimizer state and {s} of model state",
                values.len(),
                4 * (d * blocks).saturating_add(o).saturating_add(s)
            );
        }
        let floats: Vec<f32> = values
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(i) = floats.iter().position(|v| !v.is_finite()) {
            bail!("value {i} is not finite ({})", floats[i]);
        }
        let (x, rest) = floats.split_at(d);
        let (velocity, rest) = rest.split_at(o);
        let (vector_values, model_state) = rest.split_at(rest.len() - s);
        let mut blocks = vector_values.chunks_exact(d.max(1));
        let mut next = || blocks.next().map(<[f32]>::to_vec).unwrap_or_default();
        let (x, velocity) = (x.to_vec(), velocity.to_vec());
        let vectors = names.into_iter().map(|n| (n, next())).collect();
        Ok(Checkpoint {
            meta,
            x,
            velocity,
            state: AlgorithmState { scalars, vectors },
            model_state: model_state.to_vec(),
        })
    }

    /// Writes the checkpoint to `path` atomically and durably: a temporary file in the same
    /// folder, flushed to disk, then renamed to `path`; the checkpoint that was there is
    /// kept as [`previous_path`] (peers killed together may have saved different rounds
    /// last; a whole run resumes from a round all of them still hold).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = path.with_extension("ckpt.tmp");
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(&self.to_bytes()?)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        // The latest checkpoint stays at `path` at every instant (a kill between two
        // renames once left only the previous one): the previous file is a link to it (a
        // copy where links are not supported) put in place by a rename, then the new file
        // replaces `path` by a rename.
        if path.exists() {
            let prev = previous_path(path);
            let prev_tmp = prev.with_extension("ckpt.tmp");
            let _ = std::fs::remove_file(&prev_tmp);
            if std::fs::hard_link(path, &prev_tmp).is_err() {
                std::fs::copy(path, &prev_tmp).with_context(|| {
                    format!("copying {} to {}", path.display(), prev_tmp.display())
                })?;
            }
            std::fs::rename(&prev_tmp, &prev)
                .with_context(|| format!("renaming to {}", prev.display()))?;
        }
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
    }

    /// The checkpoints at `path` and [`previous_path`] that exist, each checked as
    /// [`Checkpoint::load`] does, latest first.
    pub fn load_all(path: &Path, fingerprint: &Fingerprint, d: usize) -> anyhow::Result<Vec<Self>> {
        let mut all = Vec::new();
        for p in [path.to_path_buf(), previous_path(path)] {
            all.extend(Self::load(&p, fingerprint, d)?);
        }
        all.sort_by_key(|c| std::cmp::Reverse(c.meta.round));
        Ok(all)
    }

    /// Reads and checks the checkpoint at `path` (see [`Checkpoint::from_bytes`]); `None`
    /// if there is no file.
    pub fn load(path: &Path, fingerprint: &Fingerprint, d: usize) -> anyhow::Result<Option<Self>> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Self::from_bytes(&bytes, fingerprint, d)
            .map(Some)
            .with_context(|| format!("checkpoint {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint() -> Fingerprint {
        Fingerprint {
            peers: 4,
            topology: "ring".into(),
            model: "mlp".into(),
            dim: 3,
            algorithm: "dpsgd".into(),
            compressor: "identity".into(),
            epochs: 2,
            rounds_per_epoch: 10,
            seed: 1,
            partition: "iid".into(),
            protocol: String::new(),
        }
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                rank: 2,
                round: 40,
                fingerprint: fingerprint(),
                departed: vec![3],
                totals: Some(PeerTotals {
                    bytes_sent: 1_628_240,
                    wall_seconds: 2.5,
                    refused_frames: 1,
                    ..PeerTotals::default()
                }),
            },
            x: vec![1.0, -2.0, 0.5],
            velocity: vec![0.25, 0.0, -1.0],
            state: AlgorithmState {
                scalars: vec![("push_sum_weight".into(), 0.75)],
                vectors: vec![
                    ("numerator".into(), vec![0.75, -1.5, 0.375]),
                    ("compressor.residual".into(), vec![0.0, 1e-3, -2.0]),
                ],
            },
            model_state: vec![0.5, 1.5, -0.25, 2.0, 0.0],
        }
    }

    #[test]
    fn an_adamw_state_of_2d_plus_1_values_round_trips() {
        let mut c = checkpoint();
        c.velocity = vec![0.1, 0.2, 0.3, 1.0, 2.0, 3.0, 7.0];
        let back = Checkpoint::from_bytes(&c.to_bytes().unwrap(), &fingerprint(), 3).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn checkpoints_round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), 2);
        assert_eq!(Checkpoint::load(&p, &fingerprint(), 3).unwrap(), None);
        checkpoint().save(&p).unwrap();
        assert_eq!(
            Checkpoint::load(&p, &fingerprint(), 3).unwrap(),
            Some(checkpoint())
        );
        // Saving again replaces it and leaves no temporary file behind.
        let mut later = checkpoint();
        later.meta.round = 50;
        later.save(&p).unwrap();
        assert_eq!(
            Checkpoint::load(&p, &fingerprint(), 3)
                .unwrap()
                .unwrap()
                .meta
                .round,
            50
        );
        let mut files: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files, vec!["peer-2.ckpt", "peer-2.prev.ckpt"]);
        // Both are there to resume from, latest first.
        let rounds: Vec<u64> = Checkpoint::load_all(&p, &fingerprint(), 3)
            .unwrap()
            .iter()
            .map(|c| c.meta.round)
            .collect();
        assert_eq!(rounds, vec![50, 40]);
    }

    #[test]
    fn damaged_or_foreign_checkpoints_are_refused() {
        let bytes = checkpoint().to_bytes().unwrap();
        let f = fingerprint();
        let err =
            |b: &[u8], d: usize| format!("{:#}", Checkpoint::from_bytes(b, &f, d).unwrap_err());
        assert!(err(&bytes[..bytes.len() - 1], 3).contains("bytes of values"));
        assert!(err(&bytes[..20], 3).contains("truncated metadata"));
        assert!(err(b"GARBAGE!xxxxxxxx", 3).contains("not a murmur checkpoint"));
        assert!(err(&bytes, 4).contains("d = 4"));
        let mut other = fingerprint();
        other.seed = 2;
        let foreign = Checkpoint {
            meta: CheckpointMeta {
                fingerprint: other,
                ..checkpoint().meta
            },
            ..checkpoint()
        };
        assert!(err(&foreign.to_bytes().unwrap(), 3).contains("another run"));
        let mut nan = checkpoint();
        nan.velocity[1] = f32::NAN;
        assert!(err(&nan.to_bytes().unwrap(), 3).contains("not finite"));
        let mut v5 = bytes.clone();
        v5[8] = 5;
        assert!(err(&v5, 3).contains("version 5"));
        let mut nan_model = checkpoint();
        nan_model.model_state[4] = f32::NAN;
        assert!(err(&nan_model.to_bytes().unwrap(), 3).contains("not finite"));
        let mut nan_state = checkpoint();
        nan_state.state.vectors[1].1[0] = f32::INFINITY;
        assert!(err(&nan_state.to_bytes().unwrap(), 3).contains("not finite"));
        nan_state = checkpoint();
        nan_state.state.scalars[0].1 = f64::NAN;
        assert!(nan_state.to_bytes().is_err());
        let mut ragged = checkpoint();
        ragged.state.vectors[0].1.pop();
        assert!(ragged.to_bytes().is_err());
        // Version-1 and 2 files (no algorithm state, no model state) are read with empty ones.
        let mut v1 = checkpoint();
        v1.state = AlgorithmState::default();
        v1.model_state.clear();
        let mut old = v1.to_bytes().unwrap();
        old[8] = 1;
        assert_eq!(Checkpoint::from_bytes(&old, &f, 3).unwrap(), v1);
        let mut v2 = checkpoint();
        v2.model_state.clear();
        let mut old = v2.to_bytes().unwrap();
        old[8] = 2;
        assert_eq!(Checkpoint::from_bytes(&old, &f, 3).unwrap(), v2);
    }
}
