//! How many TCP connections a link stripes its large frames over: a fixed number, or
//! chosen by the sender as it goes (`--tcp-streams auto`, [`StreamChooser`]).
//!
//! A link under `auto` opens [`AUTO_STREAMS`] connections and starts by sending each
//! frame of [`super::tcp::STRIPE_FROM`] bytes or more over one of them. It measures what
//! each frame moved a second (its bytes over the time from its first write until the
//! kernel's send queues had emptied, i.e. the far end had acknowledged all of it), and
//! tries twice as many connections on the next frame while that pays: it keeps k
//! connections when they moved at least [`GAIN`] times what k/2 did, and otherwise goes
//! back. Every [`PROBE_EVERY`] frames it tries its neighbours again (a link's share can
//! change), and it goes down to k/2 when that moves nearly as much ([`KEEP_DOWN`]): fewer
//! connections cost fewer threads and take a fairer share of a link others use. This is
//! the choice NCCL leaves to its user (`NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_NTHREADS`) and
//! gloo does not offer; the sender says in each frame's length prefix how many connections
//! carry it, so the receiver needs no choice of its own.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// Connections a link under `--tcp-streams auto` opens (and stripes over at most).
pub const AUTO_STREAMS: u8 = 4;

/// The least a larger number of connections must move, as a multiple of the current one's
/// rate, to be kept.
pub const GAIN: f64 = 1.2;

/// The least a smaller number must move, as a fraction of the current one's rate, to go
/// down to it.
pub const KEEP_DOWN: f64 = 0.9;

/// Frames between two tries of the neighbours of the current number.
pub const PROBE_EVERY: u32 = 16;

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
    /// The number the next frame tries instead, if any.
    trying: Option<usize>,
    /// The latest rate measured with k connections (bytes a second), index k.
    rates: Vec<Option<f64>>,
    /// Frames measured at `current` since it last tried another number.
    since_try: u32,
    /// Whether the next periodic try goes down (they alternate).
    down_next: bool,
}

impl StreamChooser {
    /// A chooser over `max` connections (at least 1), starting with one.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        StreamChooser {
            max,
            current: 1,
            trying: None,
            rates: vec![None; max + 1],
            since_try: 0,
            down_next: false,
        }
    }

    /// How many connections carry the next large frame (1 to `max`).
    pub fn next(&self) -> usize {
        self.trying.unwrap_or(self.current)
    }

    /// The number it keeps (not counting a try under way).
    pub fn current(&self) -> usize {
        self.current
    }

    /// A large frame sent over `used` connections moved `rate` bytes a second (`None`: not
    /// measured, e.g. another frame came before the queues emptied; nothing changes, and a
    /// try goes on to the next frame). Returns the number it keeps now, if that changed.
    pub fn observe(&mut self, used: usize, rate: Option<f64>) -> Option<usize> {
        let before = self.current;
        // An unmeasured frame changes nothing (a try waits for a measured one).
        let r = rate.filter(|r| r.is_finite() && *r > 0.0)?;
        *self.rates.get_mut(used)? = Some(r);
        if self.trying == Some(used) {
            self.trying = None;
            self.since_try = 0;
            if let (Some(tried), Some(kept)) = (self.rates[used], self.rates[self.current]) {
                let better = match used > self.current {
                    true => tried >= GAIN * kept,
                    false => tried >= KEEP_DOWN * kept,
                };
                if better {
                    self.current = used;
                }
                // Up again at once while doubling pays (not down from the top).
                let up = (self.current * 2).min(self.max);
                if self.current > before && up > self.current {
                    self.trying = Some(up);
                }
            }
        } else if used == self.current {
            self.since_try += 1;
            let up = (self.current * 2).min(self.max);
            if up > self.current && self.rates[up].is_none() {
                self.try_other(true);
            } else if self.since_try >= PROBE_EVERY {
                let down_first = self.down_next;
                self.down_next = !self.down_next;
                self.try_other(!down_first);
            }
        }
        (self.current != before).then_some(self.current)
    }

    /// The next frame tries twice the current number (`up`) or half of it, or the other
    /// one where that one does not exist.
    fn try_other(&mut self, up: bool) {
        let (twice, half) = ((self.current * 2).min(self.max), self.current / 2);
        let order = match up {
            true => [twice, half],
            false => [half, twice],
        };
        self.trying = order.into_iter().find(|&k| k >= 1 && k != self.current);
        if self.trying.is_some() {
            self.since_try = 0;
        }
    }
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

    /// A link whose rate with k connections is `rate(k)`: the numbers the chooser keeps
    /// over `frames` frames.
    fn run(max: usize, frames: usize, rate: impl Fn(usize) -> f64) -> Vec<usize> {
        let mut c = StreamChooser::new(max);
        (0..frames)
            .map(|_| {
                let k = c.next();
                c.observe(k, Some(rate(k)));
                c.current()
            })
            .collect()
    }

    #[test]
    fn under_a_cap_per_flow_it_climbs_to_as_many_connections_as_pay() {
        // Each flow held to 100, the link 400: 4 connections fill it.
        let kept = run(4, 40, |k| 100.0 * k as f64);
        assert_eq!(kept[..3], [1, 2, 4], "{kept:?}");
        assert!(kept[3..].iter().all(|&k| k == 4), "{kept:?}");
        // A link 250 wide: 2 connections move 200, 4 move 250 (1.25×): it keeps 4.
        let kept = run(4, 40, |k| (100.0 * k as f64).min(250.0));
        assert_eq!(*kept.last().unwrap(), 4, "{kept:?}");
        // A link 150 wide: 2 move 150 (1.5×), 4 no more: it keeps 2.
        let kept = run(4, 40, |k| (100.0 * k as f64).min(150.0));
        assert_eq!(kept[1..], vec![2; 39][..], "{kept:?}");
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
            c.observe(k, Some(400.0));
        }
        // It tries 2 once at the start and then every few dozen frames, not every frame.
        let tries = tried.iter().filter(|&&k| k == 2).count();
        assert!((2..=5).contains(&tries), "{tried:?}");
    }

    #[test]
    fn when_the_cap_goes_it_comes_down_and_an_unmeasured_frame_changes_nothing() {
        let mut c = StreamChooser::new(4);
        for _ in 0..10 {
            let k = c.next();
            c.observe(k, Some(100.0 * k as f64));
        }
        assert_eq!(c.current(), 4);
        // The cap lifted: one connection fills the link. Down by halves, a try every
        // PROBE_EVERY frames or so.
        let mut kept = Vec::new();
        for _ in 0..3 * PROBE_EVERY as usize {
            let k = c.next();
            c.observe(k, Some(400.0));
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
            one.observe(1, Some(5.0));
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
