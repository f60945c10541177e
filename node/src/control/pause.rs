//! Telling that this process was paused (SIGSTOP, a debugger, a suspended VM or a frozen
//! container) for longer than its neighbours wait, and the error a peer leaves with then.
//!
//! While a peer is paused its neighbours hear nothing; after `--peer-timeout-secs` they
//! declare it departed and train on without it. When it continues, every connection it
//! had times out or was given up on the other side, which looks, from inside, exactly like
//! every other peer leaving — the wrong diagnosis ("peer 0 left the run") that a paused
//! peer used to give. [`PauseWatch`] notices the pause itself: a thread that wakes every
//! [`TICK`] and records the longest gap between two wake-ups (a paused process's threads
//! all stop, and the monotonic clock goes on). A peer that fails right after such a gap
//! leaves with [`Departed`], which `murmur peer` reports with exit status
//! [`DEPARTED_EXIT_CODE`]: a supervisor (`murmur launch --restart-failed`, the Slurm and
//! ssh scripts) restarts it with `--resume`, and it rejoins like a restarted peer.
//!
//! What makes it fail: its first link lost within [`CUT_OFF_WINDOW`] of the end of a pause
//! of at least the peer timeout ([`PauseWatch::cut_off`]) — the others closing its links.
//! Without that, a peer whose every neighbour had closed its links took them all for
//! departed and trained on alone to the end, its reports lost.
//!
//! A process the run left behind without a pause of its own (a partition, a relay that
//! died, a process too starved to answer) learns it from the close code of the links the
//! others give up on it, and leaves with [`CutOff`], reported the same way
//! ([`left_behind`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the watch thread wakes up.
pub const TICK: Duration = Duration::from_millis(250);

/// How long after this process continued from a long pause a lost link is taken for the
/// others having closed this peer's links ([`PauseWatch::cut_off`]).
pub const CUT_OFF_WINDOW: Duration = Duration::from_secs(3);

/// The exit status of a peer that left the run but may rejoin it with `--resume`
/// (`EX_TEMPFAIL` of sysexits.h): it was declared departed by the others.
pub const DEPARTED_EXIT_CODE: u8 = 75;

/// This peer was declared departed by the run (it was paused or cut off for longer than
/// the peer timeout) and has left it; restarting it with `--resume` takes it back.
#[derive(Debug, thiserror::Error)]
#[error(
    "this peer was paused for {paused:.1} s (SIGSTOP, a debugger or a suspended machine), \
     longer than its neighbours wait for it (--peer-timeout-secs {timeout_secs}, or \
     --paused-timeout-secs where they can tell it is paused: over TCP and on one host), so \
     the other peers went on without it and it has left the run; restart it with --resume \
     to rejoin (--resume --rejoin-running for peer 0; murmur launch --restart-failed and \
     murmur.sbatch do). What failed on its return: {cause}"
)]
pub struct Departed {
    /// Seconds the process was paused.
    pub paused: f64,
    /// The peer timeout in force, in seconds.
    pub timeout_secs: u64,
    /// The error the peer met when it continued.
    pub cause: String,
}

/// The run took this live process for departed: peer `by` closed a link with it as such
/// (`plane::CUT_OFF`: its silence outlasted the timeouts, a partition, a relay that died,
/// or a departure notice about it from elsewhere) and the others go on without it. Like
/// [`Departed`], `murmur peer` reports it with [`DEPARTED_EXIT_CODE`], and a supervisor
/// restarts it with `--resume`.
#[derive(Debug, thiserror::Error)]
#[error(
    "peer {by} closed its link with this peer as with a departed one: the run took this peer \
     for departed (its links silent for longer than the others wait: a network partition, a \
     relay that died, a process too starved to answer) and goes on without it, so it has left \
     the run; restart it with --resume to rejoin (--resume --rejoin-running for peer 0; \
     murmur launch --restart-failed and murmur.sbatch do)"
)]
pub struct CutOff {
    /// The peer that closed the link.
    pub by: murmur_gossip::Rank,
}

/// Whether `error` is one of the ways a peer leaves a run that went on without it
/// ([`Departed`], [`CutOff`]): `murmur peer` exits with [`DEPARTED_EXIT_CODE`], and a
/// supervisor restarts it with `--resume`.
pub fn left_behind(error: &anyhow::Error) -> bool {
    error.downcast_ref::<Departed>().is_some() || error.downcast_ref::<CutOff>().is_some()
}

/// The pause detector: a background thread that records the longest gap between its
/// wake-ups (milliseconds), and the time of its last wake-up.
#[derive(Clone)]
pub struct PauseWatch {
    start: Instant,
    /// Milliseconds since `start` of the last wake-up.
    last_tick_ms: Arc<AtomicU64>,
    /// Longest gap between two wake-ups so far, in milliseconds.
    longest_gap_ms: Arc<AtomicU64>,
    /// The last gap of over two ticks: when it ended (milliseconds since `start`) and how
    /// long it was, packed as `end << 32 | gap` (0: none).
    last_gap: Arc<AtomicU64>,
}

/// Whether a link lost at `now_ms` (milliseconds since the watch started) means that the
/// others took this peer for departed: this process was paused for at least `timeout`
/// either just now (`last_tick_ms`: the watch thread has not woken since it continued) or
/// in a pause that ended (`last_gap`: its end and length) less than [`CUT_OFF_WINDOW`]
/// before. Returns the pause.
fn cut_off_at(
    now_ms: u64,
    last_tick_ms: u64,
    last_gap: (u64, u64),
    timeout: Duration,
) -> Option<Duration> {
    let ongoing = now_ms.saturating_sub(last_tick_ms);
    let (end, gap) = last_gap;
    let recent = if gap > 0 && now_ms.saturating_sub(end) < CUT_OFF_WINDOW.as_millis() as u64 {
        gap
    } else {
        0
    };
    let paused = Duration::from_millis(ongoing.max(recent));
    (paused >= timeout).then_some(paused)
}

impl PauseWatch {
    /// The process's watch, its thread started on the first call (it runs until the
    /// process exits).
    pub fn global() -> &'static PauseWatch {
        static WATCH: std::sync::OnceLock<PauseWatch> = std::sync::OnceLock::new();
        WATCH.get_or_init(PauseWatch::start)
    }

    /// Starts a watch thread (it runs until the process exits).
    fn start() -> PauseWatch {
        let watch = PauseWatch {
            start: Instant::now(),
            last_tick_ms: Arc::new(AtomicU64::new(0)),
            longest_gap_ms: Arc::new(AtomicU64::new(0)),
            last_gap: Arc::new(AtomicU64::new(0)),
        };
        let w = watch.clone();
        let spawned = std::thread::Builder::new()
            .name("pause-watch".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                w.tick();
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the pause watch thread: {e}");
        }
        watch
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn tick(&self) {
        let now = self.now_ms();
        let last = self.last_tick_ms.swap(now, Ordering::Relaxed);
        let gap = now.saturating_sub(last);
        self.longest_gap_ms.fetch_max(gap, Ordering::Relaxed);
        if gap > 2 * TICK.as_millis() as u64 {
            self.last_gap
                .store(now << 32 | gap.min(u32::MAX as u64), Ordering::Relaxed);
        }
    }

    /// Whether a link lost now means that the others took this peer for departed and
    /// closed its links: this process was paused for at least `timeout` (the peer timeout),
    /// a pause that ended less than [`CUT_OFF_WINDOW`] ago or that the watch thread has not
    /// woken from yet. Returns the pause.
    pub fn cut_off(&self, timeout: Duration) -> Option<Duration> {
        let packed = self.last_gap.load(Ordering::Relaxed);
        cut_off_at(
            self.now_ms(),
            self.last_tick_ms.load(Ordering::Relaxed),
            (packed >> 32, packed & u32::MAX as u64),
            timeout,
        )
    }

    /// The longest time this process was paused so far, in seconds: the longest gap
    /// between two wake-ups of the watch thread, or the time since its last wake-up if it
    /// has not woken since (it may not have run yet after the process continued). Up to
    /// [`TICK`] (plus scheduling delay) even when nothing paused the process.
    pub fn longest_pause(&self) -> Duration {
        let since_last = self
            .now_ms()
            .saturating_sub(self.last_tick_ms.load(Ordering::Relaxed));
        Duration::from_millis(self.longest_gap_ms.load(Ordering::Relaxed).max(since_last))
    }

    /// `error`, turned into [`Departed`] if this process was paused for at least the peer
    /// timeout (`timeout`): the others then surely declared it departed, and `error` is
    /// what that did to it.
    pub fn explain(&self, error: anyhow::Error, timeout: Duration) -> anyhow::Error {
        let paused = self.longest_pause();
        if paused >= timeout {
            Departed {
                paused: paused.as_secs_f64(),
                timeout_secs: timeout.as_secs(),
                cause: format!("{error:#}"),
            }
            .into()
        } else {
            error
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_lost_just_after_a_long_pause_means_this_peer_was_cut_off() {
        let t = Duration::from_secs(5);
        let secs = |s: u64| Some(Duration::from_secs(s));
        // Continued 0.5 s ago from an 8 s pause.
        assert_eq!(cut_off_at(20_000, 19_900, (19_500, 8_000), t), secs(8));
        // The watch thread has not woken since the process continued: 8 s since it last did.
        assert_eq!(cut_off_at(20_000, 12_000, (0, 0), t), secs(8));
        // A pause shorter than the peer timeout: nobody took this peer for departed.
        assert_eq!(cut_off_at(20_000, 19_900, (19_500, 3_000), t), None);
        // Long ago: a link lost now is a neighbour's doing.
        assert_eq!(cut_off_at(30_000, 29_900, (19_500, 8_000), t), None);
        assert_eq!(cut_off_at(30_000, 29_900, (0, 0), t), None);
    }

    #[test]
    fn a_gap_between_ticks_is_a_pause() {
        let w = PauseWatch {
            start: Instant::now(),
            last_tick_ms: Arc::new(AtomicU64::new(0)),
            longest_gap_ms: Arc::new(AtomicU64::new(0)),
            last_gap: Arc::new(AtomicU64::new(0)),
        };
        std::thread::sleep(Duration::from_millis(30));
        w.tick();
        assert!(w.longest_pause() >= Duration::from_millis(30));
        assert!(w.longest_pause() < Duration::from_secs(5));
        let e = w.explain(
            anyhow::anyhow!("sending to peer 0 failed"),
            Duration::from_secs(15),
        );
        assert!(e.downcast_ref::<Departed>().is_none(), "30 ms is no pause");
        // The watch thread not having run since the process continued counts too.
        w.last_tick_ms.store(0, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        let e = w.explain(anyhow::anyhow!("timed out"), Duration::from_millis(10));
        let d = e
            .downcast_ref::<Departed>()
            .expect("a pause longer than the timeout");
        assert!(d.paused >= 0.04, "{}", d.paused);
        assert!(e.to_string().contains("--resume"), "{e}");
        assert!(e.to_string().contains("timed out"), "{e}");
    }
}
