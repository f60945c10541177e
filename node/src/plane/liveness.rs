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
//!
//! **A paused peer is told apart from a dead one** where the link also has a TCP connection
//! ([`super::tcp`]): a process that dies has its sockets closed by its kernel (noticed at
//! once), while a paused or hung one (SIGSTOP, a debugger, a scheduler's suspend) keeps
//! them, and its kernel still acknowledges what reaches them. The TCP connections carry
//! keep-alive probes every second while idle, so the kernel knows within seconds whether
//! the far host answers ([`Host`]). A peer silent for the peer timeout whose host still
//! answers is waited for up to the paused timeout (`--paused-timeout-secs`) before it is
//! reported lost, with one warning; a vanished host stops answering and is reported at the
//! peer timeout, or sooner where the data sent to it goes unacknowledged (or the connection
//! breaks): then once the peer has also been silent on QUIC for two keep-alive intervals
//! ([`Timeouts::host_gone`], 2 s by default; [`verdict`]). On one host a shared-memory link's ends know each
//! other's process ([`super::process`]): a stopped one is waited for the same way, and one
//! that exited is reported at once, at the next look. On QUIC alone (through NATs, relayed)
//! nothing tells the two apart, and the peer timeout decides.

use std::sync::Arc;
use std::time::Duration;

use murmur_gossip::Rank;
use quinn::{Connection, VarInt};
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::process::{ProcessId, ProcessState};
use super::receive::Receiving;
use super::{closed_here, Incarnation, NetEvent, CUT_OFF};

/// The shortest QUIC idle timeout: how long a handshake may stay silent (a peer timeout
/// above it is the idle timeout).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// The keep-alive interval for a peer timeout: a fifth of it, at most 2 s.
pub fn keep_alive_interval(peer_timeout: Duration) -> Duration {
    (peer_timeout / 5).min(Duration::from_secs(2))
}

/// How long a silent peer is waited for ([`report_when_silent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Silence after which a peer is lost (`--peer-timeout-secs`), unless the link says it
    /// is not dead ([`Host::Answers`]).
    pub peer: Duration,
    /// Silence after which a peer whose host still answers (a paused or hung process) is
    /// lost (`--paused-timeout-secs`); taken as at least `peer`.
    pub paused: Duration,
}

impl From<Duration> for Timeouts {
    /// `peer` for both: no longer wait for a paused peer.
    fn from(peer: Duration) -> Self {
        Timeouts { peer, paused: peer }
    }
}

impl Timeouts {
    /// The paused timeout, at least the peer timeout.
    pub fn paused(&self) -> Duration {
        self.paused.max(self.peer)
    }

    /// QUIC's idle timeout: longer than any silence waited for (a second more than the
    /// paused timeout, whose looks come at most every 500 ms), and at least
    /// [`HANDSHAKE_TIMEOUT`], since it also bounds the handshake.
    pub fn idle(&self) -> Duration {
        (self.paused() + Duration::from_secs(1)).max(HANDSHAKE_TIMEOUT)
    }

    /// The silence after which a peer whose host is gone from the link's TCP connection
    /// ([`Host::Gone`]) is lost: two keep-alive intervals (2 s at the default
    /// peer timeout of 5 s), at most the peer timeout. Two signals agree by then: no
    /// datagram came on the QUIC connection although the far end sends a keep-alive every
    /// interval, and the far kernel, which acknowledges TCP data whatever its processes do
    /// (a paused or starved one included), has left retransmitted data unacknowledged for
    /// a second, or the connection broke — its host is gone or cut off, not slow.
    pub fn host_gone(&self) -> Duration {
        (2 * keep_alive_interval(self.peer)).min(self.peer)
    }
}

/// What tells of a link's far process besides its QUIC datagrams, once the link's transport
/// is set up: its TCP connection (between hosts), or, on this host, the process itself.
#[derive(Debug)]
pub enum Far {
    /// The link's TCP connection ([`super::tcp::host_of`]).
    Tcp(std::net::TcpStream),
    /// The far process, on this host (a shared-memory link, [`super::local_link`]).
    Process(ProcessId),
}

/// A link's [`Far`], filled when its transport is set up; empty for a link on QUIC alone.
pub type LinkProbe = Arc<std::sync::OnceLock<Far>>;

/// What a link's far end says of its host: [`Host::Unknown`] on QUIC alone; on TCP, the
/// kernel's view of the connection; on this host, the process: alive or stopped answers,
/// exited does not.
pub fn host(probe: &LinkProbe) -> Host {
    match probe.get() {
        None => Host::Unknown,
        Some(Far::Tcp(tcp)) => super::tcp::host_of(tcp),
        Some(Far::Process(p)) => match p.state() {
            ProcessState::Alive | ProcessState::Stopped => Host::Answers,
            ProcessState::Gone => Host::Silent,
        },
    }
}

/// What the far end of a link says of its host: through its TCP connection (the kernel's
/// view) or, on this host, its process ([`host`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// Nothing but QUIC on the link, or the kernel does not say.
    Unknown,
    /// The TCP connection is established and its host acknowledges what it is sent (data,
    /// zero-window probes, keep-alive probes), or the process on this host is running or
    /// stopped: alive or paused, not dead.
    Answers,
    /// Its host left a probe unanswered for a second (or its process on this host exited):
    /// not answering, but the evidence is weak alone (see [`Host::Gone`]).
    Silent,
    /// The TCP connection broke, or data sent on it went unacknowledged, retransmitted,
    /// for a second: the far host is gone or cut off.
    Gone,
}

/// What a silence means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not long enough to say anything: look again.
    Waiting,
    /// The peer's host still answers: paused or hung; wait up to the paused timeout.
    Paused,
    /// The peer is lost.
    Lost,
}

/// The verdict on a peer silent for `silent` whose host is in state `host`: lost from
/// [`Timeouts::host_gone`] on if its host is gone; else nothing before the peer
/// timeout; then [`Verdict::Paused`] while its host answers and the silence is shorter
/// than the paused timeout, else [`Verdict::Lost`].
pub fn verdict(silent: Duration, t: Timeouts, host: Host) -> Verdict {
    match host {
        Host::Gone if silent >= t.host_gone() => Verdict::Lost,
        _ if silent < t.peer => Verdict::Waiting,
        Host::Answers if silent < t.paused() => Verdict::Paused,
        _ => Verdict::Lost,
    }
}

/// The silence clock of one connection: fed the connection's count of received datagrams at
/// each look ([`Silence::look`]), it says when the peer has been silent for the timeout.
#[derive(Debug)]
pub struct Silence {
    timeout: Duration,
    /// The shortest silence [`Silence::look`] reports (at most `timeout`).
    report_from: Duration,
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
            report_from: timeout,
            last_look: now,
            last_heard: now,
            datagrams,
        }
    }

    /// The same clock, reporting silences from `from` on (at most the timeout) instead of
    /// from the timeout; what counts as this process's own pause stays half the timeout.
    pub fn reporting_from(mut self, from: Duration) -> Silence {
        self.report_from = from.min(self.timeout);
        self
    }

    /// How often to look: a tenth of the timeout, between 50 and 500 ms.
    pub fn interval(&self) -> Duration {
        (self.timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
    }

    /// A look at `now`, the connection having received `datagrams` so far. `Some(silence)`
    /// once nothing arrived for the timeout (or from [`Silence::reporting_from`]) while
    /// this process ran. A gap since the last
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
        (silent >= self.report_from).then_some(silent)
    }
}

/// Why [`silent`] gave a connection up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Silent for this long, its host saying this ([`verdict`]).
    Silent(Duration, Host),
    /// Its process, on this host, exited (noticed at once).
    Exited(ProcessId),
}

/// Resolves once `conn`'s peer (`peer`, on the link in `direction`) is lost: its process on
/// this host exited, or by [`verdict`]: silent for the peer timeout ([`Silence`]) and its
/// host not answering on the link (`probe`), or silent for the paused timeout; never, if
/// the connection closes first. A silence that the host's answers extend is logged once
/// when it passes the peer timeout, and again if the peer speaks.
pub async fn silent(
    conn: &Connection,
    t: Timeouts,
    probe: &LinkProbe,
    (peer, direction): (Rank, &str),
) -> Option<Loss> {
    let mut clock = Silence::new(Instant::now(), t.peer, conn.stats().udp_rx.datagrams)
        .reporting_from(t.host_gone());
    let mut ticks = tokio::time::interval(clock.interval());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // While the host answers for a silent peer: when its silence began.
    let mut silent_from: Option<Instant> = None;
    // In this silence, the far kernel answered a new connection ([`kernel_answers`]).
    let mut kernel_answered = false;
    loop {
        tokio::select! {
            _ = conn.closed() => {
                let s = conn.stats();
                debug!(
                    peer,
                    "QUIC connection {direction} peer {peer} closed: path MTU {} bytes, {} \
                     packets sent, {} lost, {} congestion events",
                    s.path.current_mtu,
                    s.path.sent_packets,
                    s.path.lost_packets,
                    s.path.congestion_events
                );
                return None;
            }
            now = ticks.tick() => {
                // One look at the far end a tick: a process of this host that is gone is
                // lost at once, whatever the silence.
                let raw = host(probe);
                if let (Host::Silent, Some(Far::Process(p))) = (raw, probe.get()) {
                    return Some(Loss::Exited(*p));
                }
                let Some(s) = clock.look(now, conn.stats().udp_rx.datagrams) else {
                    kernel_answered = false;
                    if let Some(from) = silent_from.take() {
                        info!(
                            peer,
                            "peer {peer} speaks again on the connection {direction} it, after {:.1} s \
                             of silence while its host answered",
                            (now - from).as_secs_f64()
                        );
                    }
                    continue;
                };
                // What the TCP connection says is confirmed by a new connection where it
                // decides (once a silence: a kernel that answered is alive).
                if asks_kernel(raw, s, t) {
                    if let (false, Some(Far::Tcp(tcp))) = (kernel_answered, probe.get()) {
                        kernel_answered = kernel_answers(tcp).await;
                    }
                }
                let host = confirmed(raw, (s, t), kernel_answered);
                match verdict(s, t, host) {
                    Verdict::Waiting => {}
                    Verdict::Lost => return Some(Loss::Silent(s, host)),
                    Verdict::Paused => {
                        if silent_from.is_none() {
                            silent_from = Some(now - s);
                            let why = match probe.get() {
                                Some(Far::Process(_)) => {
                                    "its process on this host is stopped or hung, not gone"
                                }
                                _ => "its host still answers on the TCP link: its process is \
                                      paused or hung, not dead",
                            };
                            warn!(
                                peer,
                                "peer {peer} has been silent for {:.1} s on the connection \
                                 {direction} it, but {why}; waiting up to {} s \
                                 (--paused-timeout-secs) before taking it for departed",
                                s.as_secs_f64(),
                                t.paused().as_secs()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Whether the far kernel's answer to a new TCP connection ([`kernel_answers`]) is needed
/// to judge a link whose connection says `raw`, silent for `silent`: a host taken for gone
/// before the peer timeout (it must also leave a new connection unanswered), and, at the
/// peer timeout, a host that left a probe unanswered on a connection still established
/// (under load a paused peer's kernel can answer a probe late).
pub fn asks_kernel(raw: Host, silent: Duration, t: Timeouts) -> bool {
    match raw {
        Host::Gone => silent < t.peer,
        Host::Silent => silent >= t.peer,
        Host::Unknown | Host::Answers => false,
    }
}

/// The host's state once the far kernel answered a new connection (`kernel_answered`) or
/// not: a host taken for gone before the peer timeout is only silent if its kernel
/// answers; a host silent on a connection still established whose kernel answers is alive,
/// and its process holds the connection open, so it is paused or hung, not dead (a dead
/// process's kernel resets the connection, which then says [`Host::Gone`]). Anything else
/// stays as the connection says.
pub fn confirmed(raw: Host, (silent, t): (Duration, Timeouts), kernel_answered: bool) -> Host {
    match raw {
        Host::Gone if kernel_answered && silent < t.peer => Host::Silent,
        Host::Silent if kernel_answered && silent >= t.peer => Host::Answers,
        other => other,
    }
}

/// How long [`report_when_silent`] waits for a lost link's reading threads to read what
/// the peer wrote before it went (a ring's reader is woken by the close, TCP streams are
/// shut by it: they end as soon as they have read what is there).
const READ_OUT_WAIT: Duration = Duration::from_millis(500);

/// How long [`kernel_answers`] waits for the far kernel.
const KERNEL_ANSWER_WAIT: Duration = Duration::from_millis(500);

/// Whether the kernel at the far end of `tcp` answers a new TCP connection to the address
/// `tcp` is connected to within [`KERNEL_ANSWER_WAIT`]: with a SYN-ACK (a listener: the
/// connection is closed before its first byte, which the far data plane takes for this
/// check) or a reset (no listener on that port, as for the far end's own port of an
/// accepted link). A kernel answers whatever its processes do, a paused or starved one
/// included; a host that is gone or cut off does not.
async fn kernel_answers(tcp: &std::net::TcpStream) -> bool {
    match tcp.peer_addr() {
        Ok(addr) => kernel_answers_at(addr).await,
        Err(_) => false,
    }
}

/// Whether the kernel at `addr`'s host answers a TCP connection to it ([`kernel_answers`]).
async fn kernel_answers_at(addr: std::net::SocketAddr) -> bool {
    match tokio::time::timeout(KERNEL_ANSWER_WAIT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Err(_) => false,
    }
}

/// Reports `conn` (a connection to peer `peer`'s process of `incarnation`, or from it when
/// `receiving` holds what it delivered) lost as soon as [`silent`] says so (`probe`: the
/// link's TCP connection, once it has one), and closes it; nothing if it closes first, if
/// this side closed it, or if the sender's goodbye was received in full.
pub async fn report_when_silent(
    conn: Connection,
    t: Timeouts,
    events: mpsc::Sender<NetEvent>,
    (peer, incarnation): (Rank, Incarnation),
    (receiving, probe): (Option<Arc<Mutex<Receiving>>>, LinkProbe),
) {
    let direction = if receiving.is_some() { "from" } else { "to" };
    let Some(loss) = silent(&conn, t, &probe, (peer, direction)).await else {
        return;
    };
    let complete = match &receiving {
        Some(r) => r.lock().await.complete(),
        None => false,
    };
    if complete || closed_here(&conn) {
        return;
    }
    let reason = match loss {
        Loss::Exited(p) => {
            conn.close(VarInt::from_u32(CUT_OFF), b"exited");
            format!(
                "connection {direction} peer {peer}: its process (pid {}) on this host has exited",
                p.pid
            )
        }
        Loss::Silent(silence, host) => {
            conn.close(VarInt::from_u32(CUT_OFF), b"silent");
            let host = match host {
                Host::Unknown => "",
                Host::Answers => {
                    ", though not dead: paused or hung for longer than --paused-timeout-secs"
                }
                Host::Silent => ", its host no longer answering on the TCP link",
                Host::Gone => ", its host gone from the TCP link (its data unacknowledged, or the connection broken)",
            };
            format!(
                "connection {direction} peer {peer}: timed out (silent for {:.1} s{host})",
                silence.as_secs_f64()
            )
        }
    };
    // The close stops the link's reading threads once they have read what is there: what
    // the peer wrote before it went is delivered before its loss is reported (a flooded
    // line of the record, a last model), and a goodbye among it ends the link cleanly.
    if let Some(r) = &receiving {
        let read_out = r.lock().await.read_out();
        if tokio::time::timeout(READ_OUT_WAIT, read_out).await.is_err() {
            debug!(
                peer,
                "the link from peer {peer} was still being read after {READ_OUT_WAIT:?}"
            );
        }
        if r.lock().await.complete() {
            return;
        }
    }
    let _ = events
        .send(NetEvent::Lost {
            peer,
            incarnation,
            reason,
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    /// The far kernel's answer to a new connection decides only where the TCP connection's
    /// own view is weak: a host taken for gone early is silent if its kernel answers; a
    /// host silent at the peer timeout on an established connection is paused if its
    /// kernel answers (waited for, not lost); a broken connection stays gone at the peer
    /// timeout (a dead process on a live host: its kernel answers, yet it is lost).
    #[test]
    fn the_far_kernel_s_answer_tells_a_late_probe_of_a_paused_peer_from_a_dead_one() {
        let t = Timeouts {
            peer: T,
            paused: Duration::from_secs(30),
        };
        let early = ms(2_500);
        assert!(asks_kernel(Host::Gone, early, t) && !asks_kernel(Host::Gone, T, t));
        assert!(asks_kernel(Host::Silent, T, t) && !asks_kernel(Host::Silent, early, t));
        assert!(!asks_kernel(Host::Answers, T, t) && !asks_kernel(Host::Unknown, T, t));
        let judged = |raw, s, answered| verdict(s, t, confirmed(raw, (s, t), answered));
        assert_eq!(judged(Host::Gone, early, true), Verdict::Waiting);
        assert_eq!(judged(Host::Gone, early, false), Verdict::Lost);
        assert_eq!(
            judged(Host::Silent, T, true),
            Verdict::Paused,
            "a late probe"
        );
        assert_eq!(judged(Host::Silent, T, false), Verdict::Lost);
        assert_eq!(
            judged(Host::Gone, T, true),
            Verdict::Lost,
            "a broken connection"
        );
        assert_eq!(
            judged(Host::Silent, ms(31_000), true),
            Verdict::Lost,
            "paused too long"
        );
    }

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
    fn a_clock_reporting_early_reports_from_then_and_still_knows_its_own_pauses() {
        let t0 = Instant::now();
        let mut c = Silence::new(t0, T, 0).reporting_from(ms(2_000));
        assert_eq!(c.look(t0 + ms(1_500), 0), None);
        assert_eq!(c.look(t0 + ms(2_000), 0), Some(ms(2_000)));
        assert_eq!(c.look(t0 + ms(3_000), 0), Some(ms(3_000)));
        // A datagram starts the silence again.
        assert_eq!(c.look(t0 + ms(3_500), 1), None);
        // A gap of 2 s is under half the peer timeout: not this process's pause.
        assert_eq!(c.look(t0 + ms(5_500), 1), Some(ms(2_000)));
        // One of 3 s is: the silence starts again.
        assert_eq!(c.look(t0 + ms(8_500), 1), None);
        // Never later than the timeout.
        let c = Silence::new(t0, T, 0).reporting_from(Duration::from_secs(9));
        assert_eq!(c.report_from, T);
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
    fn a_silent_peer_whose_host_answers_is_waited_for_up_to_the_paused_timeout() {
        let t = Timeouts {
            peer: T,
            paused: Duration::from_secs(30),
        };
        let at = |s: u64| Duration::from_secs(s);
        // Paused (the host's kernel answers): waited for, up to the paused timeout.
        assert_eq!(verdict(at(5), t, Host::Answers), Verdict::Paused);
        assert_eq!(verdict(at(29), t, Host::Answers), Verdict::Paused);
        assert_eq!(verdict(at(30), t, Host::Answers), Verdict::Lost);
        // No TCP link to ask: lost at the peer timeout, nothing said before.
        assert_eq!(verdict(at(4), t, Host::Unknown), Verdict::Waiting);
        assert_eq!(verdict(at(5), t, Host::Unknown), Verdict::Lost);
        assert_eq!(verdict(at(4), t, Host::Answers), Verdict::Waiting);
        // A host gone: lost after two keep-alive intervals (2 s); one that only left a
        // probe unanswered, at the peer timeout.
        assert_eq!(t.host_gone(), at(2));
        assert_eq!(verdict(ms(1_999), t, Host::Gone), Verdict::Waiting);
        assert_eq!(verdict(at(2), t, Host::Gone), Verdict::Lost);
        assert_eq!(verdict(at(2), t, Host::Silent), Verdict::Waiting);
        assert_eq!(verdict(at(5), t, Host::Silent), Verdict::Lost);
        // Never later than the peer timeout, and 4 s (two of 2 s) for long ones.
        assert_eq!(Timeouts::from(ms(1_000)).host_gone(), ms(400));
        assert_eq!(Timeouts::from(Duration::from_secs(60)).host_gone(), at(4));
        // A paused timeout below the peer timeout is the peer timeout; from a bare peer
        // timeout, no wait at all.
        let short = Timeouts {
            peer: T,
            paused: at(1),
        };
        assert_eq!(short.paused(), T);
        assert_eq!(verdict(T, short, Host::Answers), Verdict::Lost);
        assert_eq!(verdict(T, T.into(), Host::Answers), Verdict::Lost);
    }

    /// A kernel answers a connection to a listener, and to a port without one (a reset is
    /// an answer too). That a host which vanished does not answer needs a host to vanish:
    /// `.ci/net-test` (e).
    #[tokio::test]
    async fn a_kernel_answers_a_connection_to_a_listener_and_to_a_closed_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(kernel_answers_at(listener.local_addr().unwrap()).await);
        let closed = listener.local_addr().unwrap();
        drop(listener);
        assert!(kernel_answers_at(closed).await, "a reset is an answer");
    }

    #[test]
    fn quic_idles_out_only_after_the_longest_silence_waited_for() {
        let t = Timeouts {
            peer: T,
            paused: Duration::from_secs(30),
        };
        assert_eq!(t.idle(), Duration::from_secs(31));
        assert_eq!(Timeouts::from(T).idle(), HANDSHAKE_TIMEOUT);
        assert_eq!(
            Timeouts::from(Duration::from_secs(120)).idle(),
            Duration::from_secs(121)
        );
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
