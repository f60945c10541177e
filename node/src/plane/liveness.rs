//! Liveness of a link, apart from its handshake: a peer is alive while datagrams arrive on
//! the link's QUIC connection (its frames, acknowledgements, or the keep-alives both ends
//! send every fifth of the peer timeout, at most every 2 s, whatever their training loops
//! are doing). A connection that brings nothing for `--peer-timeout-secs` while this process
//! ran is reported lost.
//!
//! QUIC's own idle timeout also bounds the handshake, before any keep-alive can flow; many
//! peers starting on few cores handshake slowly (96 processes on 2 cores took over 5 s to
//! connect to peer 0). So the idle timeout is set to at least [`HANDSHAKE_TIMEOUT`], and the
//! peer timeout is enforced here, on established connections only, by a task per connection
//! that reads the connection's received-datagram count ([`Silence`] is its pure part).
//!
//! A silence is counted only while this process runs: if this process itself was not
//! scheduled (paused, starved) for more than half the timeout between two looks, the peer's
//! datagrams may be waiting unread in the socket, and its silence starts again from zero.

use std::sync::Arc;
use std::time::Duration;

use murmur_gossip::Rank;
use quinn::{Connection, VarInt};
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::receive::Receiving;
use super::{closed_here, Incarnation, NetEvent, ABANDONED};

/// The shortest QUIC idle timeout: how long a handshake may stay silent (a peer timeout
/// above it is the idle timeout).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// The keep-alive interval for a peer timeout: a fifth of it, at most 2 s.
pub fn keep_alive_interval(peer_timeout: Duration) -> Duration {
    (peer_timeout / 5).min(Duration::from_secs(2))
}

/// The silence clock of one connection: fed the connection's count of received datagrams at
/// each look ([`Silence::look`]), it says when the peer has been silent for the timeout.
#[derive(Debug)]
pub struct Silence {
    timeout: Duration,
    /// When this clock last looked.
    last_look: Instant,
    /// When the count last changed (or the clock was last reset).
    last_heard: Instant,
    /// The count at the last look.
    datagrams: u64,
}

impl Silence {
    /// A clock started at `now`, the connection having received `datagrams` so far.
    pub fn new(now: Instant, timeout: Duration, datagrams: u64) -> Silence {
        Silence {
            timeout,
            last_look: now,
            last_heard: now,
            datagrams,
        }
    }

    /// How often to look: a tenth of the timeout, between 50 and 500 ms.
    pub fn interval(&self) -> Duration {
        (self.timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
    }

    /// A look at `now`, the connection having received `datagrams` so far. `Some(silence)`
    /// once nothing arrived for the timeout while this process ran. A gap since the last
    /// look of more than half the timeout is this process's own pause: the silence starts
    /// again from `now`.
    pub fn look(&mut self, now: Instant, datagrams: u64) -> Option<Duration> {
        let gap = now.saturating_duration_since(self.last_look);
        self.last_look = now;
        if datagrams != self.datagrams || gap > self.timeout / 2 {
            self.datagrams = datagrams;
            self.last_heard = now;
            return None;
        }
        let silent = now.saturating_duration_since(self.last_heard);
        (silent >= self.timeout).then_some(silent)
    }
}

/// Resolves with the silence once `conn`'s peer has been silent for `timeout`
/// ([`Silence`]); never, if the connection closes first.
pub async fn silent(conn: &Connection, timeout: Duration) -> Option<Duration> {
    let mut clock = Silence::new(Instant::now(), timeout, conn.stats().udp_rx.datagrams);
    let mut ticks = tokio::time::interval(clock.interval());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = conn.closed() => return None,
            now = ticks.tick() => {
                if let Some(s) = clock.look(now, conn.stats().udp_rx.datagrams) {
                    return Some(s);
                }
            }
        }
    }
}

/// Reports `conn` (a connection to peer `peer`'s process of `incarnation`, or from it when
/// `receiving` holds what it delivered) lost as soon as it has been silent for `timeout`,
/// and closes it; nothing if it closes first, if this side closed it, or if the sender's
/// goodbye was received in full.
pub async fn report_when_silent(
    conn: Connection,
    timeout: Duration,
    events: mpsc::Sender<NetEvent>,
    (peer, incarnation): (Rank, Incarnation),
    receiving: Option<Arc<Mutex<Receiving>>>,
) {
    let Some(silence) = silent(&conn, timeout).await else {
        return;
    };
    let complete = match &receiving {
        Some(r) => r.lock().await.complete(),
        None => false,
    };
    if complete || closed_here(&conn) {
        return;
    }
    conn.close(VarInt::from_u32(ABANDONED), b"silent");
    let direction = if receiving.is_some() { "from" } else { "to" };
    let _ = events
        .send(NetEvent::Lost {
            peer,
            incarnation,
            reason: format!(
                "connection {direction} peer {peer}: timed out (silent for {:.1} s)",
                silence.as_secs_f64()
            ),
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Looks every 500 ms from `from` with the count unchanged (`datagrams`): nothing for
    /// nine looks, then the silence of the whole timeout at the tenth.
    fn silent_at_the_tenth_look(c: &mut Silence, from: Instant, datagrams: u64) {
        let mut at = from;
        for look in 1..10 {
            at += ms(500);
            assert_eq!(c.look(at, datagrams), None, "look {look}");
        }
        assert_eq!(c.look(at + ms(500), datagrams), Some(T));
    }

    #[test]
    fn a_peer_silent_for_the_timeout_is_reported_and_not_before() {
        let t0 = Instant::now();
        let mut c = Silence::new(t0, T, 7);
        silent_at_the_tenth_look(&mut c, t0, 7);
    }

    #[test]
    fn any_datagram_restarts_the_silence() {
        let t0 = Instant::now();
        let mut c = Silence::new(t0, T, 0);
        let mut at = t0;
        for i in 1..=40u64 {
            at += ms(500);
            // One datagram every 4.5 s: never silent for 5 s.
            let count = i / 9;
            assert_eq!(c.look(at, count), None, "look {i}");
        }
    }

    #[test]
    fn this_process_paused_is_not_the_peer_silent() {
        let t0 = Instant::now();
        let mut c = Silence::new(t0, T, 3);
        // This process did not run for 20 s: its next look resets the clock.
        let back = t0 + Duration::from_secs(20);
        assert_eq!(c.look(back, 3), None);
        // The peer stays silent: reported a whole timeout after the pause, not before.
        silent_at_the_tenth_look(&mut c, back, 3);
    }

    #[test]
    fn slow_looks_within_half_the_timeout_still_count_silence() {
        let t0 = Instant::now();
        let mut c = Silence::new(t0, T, 0);
        assert_eq!(c.look(t0 + ms(2_400), 0), None);
        assert_eq!(c.look(t0 + ms(4_800), 0), None);
        assert_eq!(c.look(t0 + ms(7_200), 0), Some(ms(7_200)));
    }

    #[test]
    fn intervals_follow_the_timeout_within_bounds() {
        let t0 = Instant::now();
        assert_eq!(Silence::new(t0, T, 0).interval(), ms(500));
        assert_eq!(Silence::new(t0, ms(200), 0).interval(), ms(50));
        assert_eq!(
            Silence::new(t0, Duration::from_secs(120), 0).interval(),
            ms(500)
        );
        assert_eq!(keep_alive_interval(T), ms(1_000));
        assert_eq!(keep_alive_interval(Duration::from_secs(120)), ms(2_000));
    }
}
