//! How many TCP connections a link stripes its large frames over: a fixed number, or
//! chosen by the sender as it goes (`--tcp-streams auto`, [`StreamChooser`]).
//!
//! A link under `auto` opens [`AUTO_STREAMS`] connections and starts by sending each
//! frame of [`super::tcp::STRIPE_FROM`] bytes or more over one of them. It times each such
//! frame (from its first write until the kernel's send queues had emptied, i.e. the far
//! end had acknowledged all of it), and sums the frames sent over one number of
//! connections into measurements of [`SAMPLE_BYTES`]. A number is judged by its latest
//! [`SAMPLES`] measurements. It tries twice as many connections while that pays: it keeps
//! k connections when the slower of their measurements moved at least [`GAIN`] times the
//! faster of k/2's, and otherwise goes back. Every [`PROBE_EVERY`] measurements it tries a
//! neighbour number again (a link's share can change; a try that does not pay doubles the
//! interval, up to [`PROBE_EVERY_MOST`]), and it goes down to k/2 when the slower of k/2's
//! measurements moves nearly as much as the faster of k's ([`KEEP_DOWN`]; a receiver busy
//! computing, and so reading late, makes some measurements low): fewer connections cost
//! fewer threads and take a fairer share of a link others use. This is
//! the choice NCCL leaves to its user (`NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_NTHREADS`) and
//! gloo does not offer; the sender says in each frame's length prefix how many connections
//! carry it, so the receiver needs no choice of its own.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// Connections a link under `--tcp-streams auto` opens (and stripes over at most).
pub const AUTO_STREAMS: u8 = 4;

/// The least a larger number of connections must move (its slower measurement), as a
/// multiple of the current number's faster one, to be kept.
pub const GAIN: f64 = 1.2;

/// The least a smaller number must move (its slower measurement), as a fraction of the
/// current number's faster one, to go down to it.
pub const KEEP_DOWN: f64 = 0.9;

/// Measurements ([`SAMPLE_BYTES`] each) between two tries of the neighbours of the current
/// number, at first: each try that does not pay doubles it, up to [`PROBE_EVERY_MOST`], and
/// a change brings it back. 16 measurements: 128 MiB sent.
pub const PROBE_EVERY: u32 = 16;

/// The most measurements between two tries (2 GiB sent).
pub const PROBE_EVERY_MOST: u32 = 256;

/// `--tcp-streams`: a fixed number of connections a TCP link (1 to
/// [`super::tcp::MAX_STREAMS`]), or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpStreams {
    /// This many connections, every large frame over all of them.
    Fixed(u8),
    /// [`AUTO_STREAMS`] connections, each large frame over as many as the sender chooses
    /// ([`StreamChooser`]).
    Auto,
}

impl Default for TcpStreams {
    fn default() -> Self {
        TcpStreams::Fixed(1)
    }
}

impl TcpStreams {
    /// The connections a link opens.
    pub fn connections(self) -> u8 {
        match self {
            TcpStreams::Fixed(n) => n,
            TcpStreams::Auto => AUTO_STREAMS,
        }
    }
}

impl FromStr for TcpStreams {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let max = super::tcp::MAX_STREAMS;
        match s {
            "auto" => Ok(TcpStreams::Auto),
            n => match n.parse::<u8>() {
                Ok(n) if (1..=max).contains(&n) => Ok(TcpStreams::Fixed(n)),
                _ => Err(format!(
                    "{s:?}: a number of connections from 1 to {max}, or auto"
                )),
            },
        }
    }
}

impl fmt::Display for TcpStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpStreams::Fixed(n) => write!(f, "{n}"),
            TcpStreams::Auto => f.write_str("auto"),
        }
    }
}

impl Serialize for TcpStreams {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TcpStreams::Fixed(n) => s.serialize_u8(*n),
            TcpStreams::Auto => s.serialize_str("auto"),
        }
    }
}

/// The sender's choice of how many of a link's `max` connections carry its next large
/// frame (pure: it is told what each frame moved, and reads no clock).
#[derive(Debug, Clone)]
pub struct StreamChooser {
    max: usize,
    /// The number it keeps.
    current: usize,
    /// The number the next frames try instead, if any, and how many measurements of the
    /// try are still to come.
    trying: Option<(usize, usize)>,
    /// The latest [`SAMPLES`] rates measured with k connections (bytes a second), index k,
    /// newest last.
    rates: Vec<Vec<f64>>,
    /// Measurements at `current` since it last tried another number.
    since_try: u32,
    /// Whether the next periodic try goes down (they alternate).
    down_next: bool,
    /// The frames measured since the last measurement: over how many connections, their
    /// bytes and seconds.
    summed: (usize, u64, f64),
    /// Measurements between two periodic tries now ([`PROBE_EVERY`] to
    /// [`PROBE_EVERY_MOST`]).
    probe_every: u32,
}

/// Measurements a number of connections is judged by: a try lasts this many, and the
/// current number's latest this many are its record. A larger number is kept only if its
/// slower one beats the current number's faster one by [`GAIN`]: one odd measurement (on a
/// 4-host ring at 1 Gbit/s, one link once measured 602 MB/s over 2 connections) does not
/// move it.
pub const SAMPLES: usize = 2;

/// The bytes one measurement spans: the frames sent over one number of connections are
/// summed until they moved this many, so that one lucky or unlucky frame (a host busy with
/// compute while it went, a message's first part into empty buffers) does not move the
/// choice. 8 MiB: two parts of a large model's message, one 9.5 MB message in three.
pub const SAMPLE_BYTES: u64 = 8 << 20;

impl StreamChooser {
    /// A chooser over `max` connections (at least 1), starting with one.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        StreamChooser {
            max,
            current: 1,
            trying: None,
            rates: vec![Vec::new(); max + 1],
            since_try: 0,
            down_next: false,
            summed: (0, 0, 0.0),
            probe_every: PROBE_EVERY,
        }
    }

    /// How many connections carry the next large frame (1 to `max`).
    pub fn next(&self) -> usize {
        self.trying.map_or(self.current, |(k, _)| k)
    }

    /// The number it keeps (not counting a try under way).
    pub fn current(&self) -> usize {
        self.current
    }

    /// The latest rate measured over `k` connections (bytes a second).
    pub fn rate(&self, k: usize) -> Option<f64> {
        self.rates.get(k)?.last().copied()
    }

    /// A large frame sent over `used` connections moved `moved` = (bytes, seconds) (`None`:
    /// not measured, e.g. another frame came before half of it was acknowledged; nothing
    /// changes, and a try goes on to the next frame). Frames over one number are summed
    /// into one measurement of [`SAMPLE_BYTES`]. Returns the number it keeps now, if that
    /// changed.
    pub fn observe(&mut self, used: usize, moved: Option<(u64, f64)>) -> Option<usize> {
        let before = self.current;
        // An unmeasured frame changes nothing (a try waits for a measured one).
        let (bytes, seconds) = moved.filter(|&(b, s)| b > 0 && s.is_finite() && s > 0.0)?;
        if self.summed.0 != used {
            self.summed = (used, 0, 0.0);
        }
        self.summed.1 += bytes;
        self.summed.2 += seconds;
        if self.summed.1 < SAMPLE_BYTES {
            return None;
        }
        let r = self.summed.1 as f64 / self.summed.2;
        self.summed = (used, 0, 0.0);
        let record = self.rates.get_mut(used)?;
        if record.len() == SAMPLES {
            record.remove(0);
        }
        record.push(r);
        match self.trying {
            Some((k, left)) if k == used && left > 1 => self.trying = Some((k, left - 1)),
            Some((k, _)) if k == used => {
                self.trying = None;
                self.since_try = 0;
                let (tried, kept) = (&self.rates[used], &self.rates[self.current]);
                let better = match used > self.current {
                    true => least(tried) >= GAIN * most(kept),
                    false => least(tried) >= KEEP_DOWN * most(kept),
                };
                if better {
                    self.current = used;
                    self.probe_every = PROBE_EVERY;
                } else {
                    self.probe_every = (self.probe_every * 2).min(PROBE_EVERY_MOST);
                }
                // Up again at once while doubling pays (not down from the top).
                if self.current > before && self.twice() > self.current {
                    self.trying = Some((self.twice(), SAMPLES));
                }
            }
            _ if used == self.current && self.rates[used].len() == SAMPLES => {
                self.since_try += 1;
                let up = self.twice();
                if up > self.current && self.rates[up].is_empty() {
                    self.try_other(true);
                } else if self.since_try >= self.probe_every {
                    let down_first = self.down_next;
                    self.down_next = !self.down_next;
                    self.try_other(!down_first);
                }
            }
            _ => {}
        }
        (self.current != before).then_some(self.current)
    }

    /// Twice the current number, at most `max`.
    fn twice(&self) -> usize {
        (self.current * 2).min(self.max)
    }

    /// The next frames try twice the current number (`up`) or half of it, or the other one
    /// where that one does not exist.
    fn try_other(&mut self, up: bool) {
        let half = self.current / 2;
        let order = match up {
            true => [self.twice(), half],
            false => [half, self.twice()],
        };
        self.trying = (order.into_iter())
            .find(|&k| k >= 1 && k != self.current)
            .map(|k| (k, SAMPLES));
        if self.trying.is_some() {
            self.since_try = 0;
        }
    }
}

/// The slowest of `rates` (infinite for none).
fn least(rates: &[f64]) -> f64 {
    rates.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The fastest of `rates` (0 for none).
fn most(rates: &[f64]) -> f64 {
    rates.iter().copied().fold(0.0, f64::max)
}

/// The length prefix of a frame of `len` bytes carried by `streams` connections: the
/// length in the low 56 bits, the number of connections in the top byte (u64 LE on the
/// wire).
pub fn prefix(len: u64, streams: usize) -> u64 {
    len & LEN_MASK | (streams as u64) << 56
}

/// The inverse of [`prefix`]: the frame's length and its number of connections.
pub fn split_prefix(prefix: u64) -> (u64, usize) {
    (prefix & LEN_MASK, (prefix >> 56) as usize)
}

const LEN_MASK: u64 = (1 << 56) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of [`SAMPLE_BYTES`] (one measurement) moved at `rate` bytes a second.
    fn frame(rate: f64) -> Option<(u64, f64)> {
        Some((SAMPLE_BYTES, SAMPLE_BYTES as f64 / rate))
    }

    /// A link whose rate with k connections is `rate(k)`: the numbers the chooser keeps
    /// over `frames` frames (one measurement each).
    fn run(max: usize, frames: usize, rate: impl Fn(usize) -> f64) -> Vec<usize> {
        let mut c = StreamChooser::new(max);
        (0..frames)
            .map(|_| {
                let k = c.next();
                c.observe(k, frame(rate(k)));
                c.current()
            })
            .collect()
    }

    #[test]
    fn under_a_cap_per_flow_it_climbs_to_as_many_connections_as_pay() {
        // Each flow held to 100, the link 400: 4 connections fill it.
        let kept = run(4, 40, |k| 100.0 * k as f64);
        // Two measurements at 1 (its record), two tries at 2, two at 4.
        assert_eq!(kept[..6], [1, 1, 1, 2, 2, 4], "{kept:?}");
        assert!(kept[6..].iter().all(|&k| k == 4), "{kept:?}");
        // A link 250 wide: 2 connections move 200, 4 move 250 (1.25×): it keeps 4.
        let kept = run(4, 40, |k| (100.0 * k as f64).min(250.0));
        assert_eq!(*kept.last().unwrap(), 4, "{kept:?}");
        // A link 150 wide: 2 move 150 (1.5×), 4 no more: it keeps 2.
        let kept = run(4, 40, |k| (100.0 * k as f64).min(150.0));
        assert!(kept[3..].iter().all(|&k| k == 2), "{kept:?}");
    }

    #[test]
    fn on_a_link_one_connection_fills_it_stays_at_one() {
        let kept = run(4, 64, |k| 400.0 + k as f64);
        assert!(kept.iter().all(|&k| k == 1), "{kept:?}");
        let mut c = StreamChooser::new(4);
        let mut tried = Vec::new();
        for _ in 0..64 {
            let k = c.next();
            tried.push(k);
            c.observe(k, frame(400.0));
        }
        // It tries 2 (two measurements a try) once at the start and once 32 frames later:
        // a try that does not pay doubles the wait (16, then 32, then 64).
        let tries: Vec<usize> = (0..tried.len()).filter(|&i| tried[i] == 2).collect();
        assert_eq!(tries, [2, 3, 36, 37], "{tried:?}");
    }

    /// Frames of a quarter of a measurement are summed four to one: one slow frame in four
    /// over 2 connections (a receiver busy computing while it went) counts in its sum, so 2
    /// is not kept, where two fast frames in a row would have passed for two measurements;
    /// and frames over different numbers are not summed together.
    #[test]
    fn one_odd_frame_does_not_move_it() {
        let mut c = StreamChooser::new(4);
        let quarter = SAMPLE_BYTES / 4;
        let over_two = std::cell::Cell::new(0);
        let rate = |k: usize| match k {
            1 => 100.0,
            _ => {
                over_two.set(over_two.get() + 1);
                if over_two.get() % 4 == 3 {
                    20.0
                } else {
                    130.0
                }
            }
        };
        let mut tried = Vec::new();
        for _ in 0..400 {
            let k = c.next();
            tried.push(k);
            c.observe(k, Some((quarter, quarter as f64 / rate(k))));
        }
        assert_eq!(c.current(), 1, "{tried:?}");
        assert!(tried.contains(&2), "it did try 2");
        // Three quarters over 1 and one over 2 make no measurement of either.
        let mut c = StreamChooser::new(4);
        for _ in 0..3 {
            c.observe(1, Some((quarter, 0.001)));
        }
        c.observe(2, Some((quarter, 0.001)));
        assert_eq!((c.rate(1), c.rate(2)), (None, None));
    }

    #[test]
    fn when_the_cap_goes_it_comes_down_and_an_unmeasured_frame_changes_nothing() {
        let mut c = StreamChooser::new(4);
        for _ in 0..10 {
            let k = c.next();
            c.observe(k, frame(100.0 * k as f64));
        }
        assert_eq!(c.current(), 4);
        // The cap lifted: one connection fills the link. Down by halves, a try every
        // PROBE_EVERY frames or so.
        let mut kept = Vec::new();
        for _ in 0..6 * PROBE_EVERY as usize {
            let k = c.next();
            c.observe(k, frame(400.0));
            if kept.last() != Some(&c.current()) {
                kept.push(c.current());
            }
        }
        assert_eq!(kept, [4, 2, 1]);
        let mut c = StreamChooser::new(4);
        let k = c.next();
        assert_eq!(c.observe(k, None), None);
        assert_eq!(c.next(), 1, "nothing known: no try yet");
        // One connection only: nothing to choose.
        let mut one = StreamChooser::new(1);
        for _ in 0..40 {
            assert_eq!(one.next(), 1);
            one.observe(1, frame(5.0));
        }
    }

    #[test]
    fn the_prefix_carries_the_length_and_the_connections() {
        for (len, k) in [(0, 1), (100_000_036, 4), ((1 << 56) - 1, 16)] {
            assert_eq!(split_prefix(prefix(len, k)), (len, k));
        }
        assert_eq!(prefix(5, 1), 5 | 1 << 56);
        assert_eq!("auto".parse(), Ok(TcpStreams::Auto));
        assert_eq!("3".parse(), Ok(TcpStreams::Fixed(3)));
        assert!("0".parse::<TcpStreams>().is_err());
        assert!("17".parse::<TcpStreams>().is_err());
        assert_eq!(TcpStreams::Auto.to_string(), "auto");
        assert_eq!(TcpStreams::Auto.connections(), AUTO_STREAMS);
    }
}
