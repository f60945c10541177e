//! The memory check before a launch: n peer processes against the memory available.

use anyhow::bail;

/// A rough estimate of one peer process's resident memory, in bytes, for a model of `dim`
/// parameters and a data set of `data_bytes` (as f32): 40 MB for the runtime (Burn, the
/// tokio and rayon threads, QUIC and libp2p), twice the data set (each peer holds all of
/// it while it cuts its shard) and 16 vectors of d f32 (the model, its gradient, momentum,
/// the inference copy, the algorithm's buffers and messages in flight).
pub fn estimated_peer_bytes(dim: usize, data_bytes: usize) -> u64 {
    const RUNTIME: u64 = 40 << 20;
    RUNTIME + 2 * data_bytes as u64 + 16 * 4 * dim as u64
}

/// Refuses `peers` processes of `per_peer` bytes each when they exceed the memory
/// available (`MemAvailable` of /proc/meminfo; no check where that cannot be read).
pub(super) fn check_memory(peers: usize, per_peer: u64) -> anyhow::Result<()> {
    let Some(available) = available_memory() else {
        return Ok(());
    };
    let need = per_peer.saturating_mul(peers as u64);
    if need > available {
        let fits = available / per_peer.max(1);
        bail!(
            "--peers {peers}: {peers} processes of about {:.0} MB each need about {:.1} GB, but \
             this machine has {:.1} GB available (about {fits} such peers fit). For many peers \
             on one machine use `murmur simulate` (n virtual peers in one process); \
             --ignore-memory-check starts anyway",
            per_peer as f64 / 1e6,
            need as f64 / 1e9,
            available as f64 / 1e9,
        );
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
