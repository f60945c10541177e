//! Measuring a peer's links, for the algorithms that choose per link ([`crate::ChocoAuto`]'s
//! compressor, [`crate::algorithms::local_auto`]'s period): each link's bandwidth in both directions
//! and the compute time between rounds.
//!
//! The transport times each incoming frame from its first to its last byte
//! ([`crate::Gossip::observe_link`]); frames shorter than `min_sample_bytes` give no sample
//! (their time is mostly the receiver's scheduling). The estimate of the direction j → i is
//! the median of the last `window` samples: a receiver busy computing reads a frame late, so
//! the first bytes may already wait in its buffers (too fast) or the last ones wait for it
//! (too slow), and the median ignores both tails. Every `report_every` rounds the receiver
//! tells j its estimate in a [`crate::FrameKind::LinkRate`] frame (8 bytes, f64 LE), so j
//! judges the direction it sends on by a measurement of that direction — an asymmetric link
//! (a home uplink slower than its downlink) is seen as it is. Until a report comes, a peer
//! has no estimate of its own direction ([`LinkMeter::rate_to`] is `None`: the link is
//! treated as unmeasured, and ChocoAuto sends it dense, which its receiver can time; the
//! other direction's estimate only sets the scale of the round's budget,
//! [`LinkMeter::fastest`]). It does not take the other direction's estimate for it: on an asymmetric link that
//! estimate is the slow one, and a fast direction judged by it would be compressed from the
//! first round into frames too small to time over TCP (the receiver times TCP frames of
//! 256 KiB or more only), so that no report would ever correct it.

use std::collections::VecDeque;
use std::time::Instant;

use crate::{GossipError, Rank, Transmit};

/// The last `window` values, for a median.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recent(VecDeque<f64>);

impl Recent {
    fn push(&mut self, v: f64, window: usize) {
        self.0.push_back(v);
        while self.0.len() > window.max(1) {
            self.0.pop_front();
        }
    }

    /// The median (the upper one of an even count); `None` while empty.
    pub(crate) fn median(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.0.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

/// How a [`LinkMeter`] samples and reports.
#[derive(Debug, Clone, Copy)]
pub struct MeterConfig {
    /// Frames shorter than this (bytes) give no bandwidth sample (default 16 KiB).
    pub min_sample_bytes: usize,
    /// How many recent samples the estimates (medians) keep (default 16).
    pub window: usize,
    /// Every how many rounds each neighbour is told the bandwidth measured on its link to
    /// this peer (default 4; 0: never).
    pub report_every: u64,
}

impl Default for MeterConfig {
    fn default() -> Self {
        MeterConfig {
            min_sample_bytes: 16 << 10,
            window: 16,
            report_every: 4,
        }
    }
}

/// One peer's measurements of its links to `neighbours` (undirected: each sends to and
/// receives from this peer), indexed like them.
#[derive(Debug, Clone)]
pub(crate) struct LinkMeter {
    rank: Rank,
    neighbours: Vec<Rank>,
    cfg: MeterConfig,
    /// Per neighbour j: recent samples of j → i (bytes/s), and what j last reported of i → j.
    rates: Vec<Recent>,
    reported: Vec<Option<f64>>,
    /// Reports waiting to be sent, and (frames, bytes) of those sent.
    reports: VecDeque<Transmit>,
    sent: (u64, u64),
    /// Recent compute times (seconds: a round's end to the next begin) and the last end.
    compute: Recent,
    mixed_at: Option<Instant>,
}

impl LinkMeter {
    /// Peer `rank`'s meter for its links to `neighbours`.
    pub(crate) fn new(rank: Rank, neighbours: Vec<Rank>, cfg: MeterConfig) -> Self {
        let k = neighbours.len();
        LinkMeter {
            rank,
            neighbours,
            cfg,
            rates: vec![Recent::default(); k],
            reported: vec![None; k],
            reports: VecDeque::new(),
            sent: (0, 0),
            compute: Recent::default(),
            mixed_at: None,
        }
    }

    /// The index of neighbour `peer`.
    fn index(&self, peer: Rank) -> Option<usize> {
        self.neighbours.iter().position(|&j| j == peer)
    }

    /// A sample of the link from `from`: `bytes` in `secs` (ignored: a short frame, a
    /// non-positive time, a peer that is not a neighbour).
    pub(crate) fn observe(&mut self, from: Rank, bytes: usize, secs: f64) {
        if bytes < self.cfg.min_sample_bytes || secs.is_nan() || secs <= 0.0 {
            return;
        }
        if let Some(k) = self.index(from) {
            self.rates[k].push(bytes as f64 / secs, self.cfg.window);
        }
    }

    /// The bandwidth of the direction this peer → neighbour `k` (bytes/s): what `k`
    /// reported of it; `None` before its first report.
    pub(crate) fn rate_to(&self, k: usize) -> Option<f64> {
        self.reported[k]
    }

    /// The bandwidth of the slower direction of the link with neighbour `k` (bytes/s): the
    /// smaller of what it reported of this peer → it and what this peer measured of it →
    /// this peer; whichever is known; `None` before either.
    pub(crate) fn rate_either_way(&self, k: usize) -> Option<f64> {
        match (self.reported[k], self.rates[k].median()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The fastest link's bandwidth (bytes/s), for the round's budget: per link the
    /// reported rate of this peer's direction, else the estimate of the other direction;
    /// `None` before any link was measured.
    pub(crate) fn fastest(&self) -> Option<f64> {
        (0..self.rates.len())
            .filter_map(|k| self.reported[k].or_else(|| self.rates[k].median()))
            .reduce(f64::max)
    }

    /// The median compute time between rounds, seconds; `None` before one was timed.
    pub(crate) fn compute_secs(&self) -> Option<f64> {
        self.compute.median()
    }

    /// A round `round` (of `dim`-long messages) begins at `now`: the compute time since the
    /// last round mixed is sampled, and reports are queued if it is a reporting round.
    pub(crate) fn round_begins(&mut self, now: Instant, round: u64, dim: usize) {
        if let Some(at) = self.mixed_at.take() {
            let secs = now.saturating_duration_since(at).as_secs_f64();
            self.compute.push(secs, self.cfg.window);
        }
        if self.cfg.report_every > 0 && round.is_multiple_of(self.cfg.report_every) {
            self.queue_reports(round, dim);
        }
    }

    /// The round mixed at `now` (if known): the next compute-time sample starts.
    pub(crate) fn round_mixed(&mut self, now: Option<Instant>) {
        self.mixed_at = now;
    }

    /// Queues, for every neighbour whose link to this peer was measured, a
    /// [`crate::FrameKind::LinkRate`] frame with the estimate.
    fn queue_reports(&mut self, round: u64, dim: usize) {
        for (&to, rate) in self.neighbours.iter().zip(&self.rates) {
            let Some(r) = rate.median() else { continue };
            let mut frame = Vec::with_capacity(crate::FRAME_HEADER_LEN + 8);
            crate::FrameHeader {
                kind: crate::FrameKind::LinkRate,
                sender: self.rank,
                round,
                dim: dim as u32,
                payload_len: 8,
            }
            .emit(&mut frame);
            frame.extend_from_slice(&r.to_le_bytes());
            self.reports.push_back(Transmit {
                to,
                frame: crate::Bytes::from(frame),
            });
        }
    }

    /// Whether `frame` is a link-rate report (to be given to [`LinkMeter::on_report`]).
    pub(crate) fn is_report(frame: &[u8], max_payload_bytes: u32) -> bool {
        matches!(crate::FrameHeader::parse(frame, max_payload_bytes),
                 Ok((h, _)) if h.kind == crate::FrameKind::LinkRate)
    }

    /// Takes neighbour `from`'s report of the link to it.
    ///
    /// # Errors
    /// A malformed frame, a sender that is not a neighbour, or a rate that is not a
    /// positive finite number ([`GossipError::BadLinkRate`]); nothing changes then.
    pub(crate) fn on_report(
        &mut self,
        from: Rank,
        frame: &[u8],
        max_payload_bytes: u32,
    ) -> Result<(), GossipError> {
        let (_, payload) =
            crate::parse_frame(frame, max_payload_bytes, crate::FrameKind::LinkRate, from)?;
        let k = self.index(from).ok_or(GossipError::NotANeighbour(from))?;
        let bad = |what: String| GossipError::BadLinkRate { from, what };
        let bytes: [u8; 8] = payload
            .try_into()
            .map_err(|_| bad(format!("{} payload bytes, expected 8", payload.len())))?;
        let rate = f64::from_le_bytes(bytes);
        if !(rate.is_finite() && rate > 0.0) {
            return Err(bad(format!(
                "{rate} bytes/s is not a positive finite number"
            )));
        }
        self.reported[k] = Some(rate);
        Ok(())
    }

    /// The next report to send, counted as sent.
    pub(crate) fn poll_report(&mut self) -> Option<Transmit> {
        let t = self.reports.pop_front()?;
        self.sent.0 += 1;
        self.sent.1 += t.frame.len() as u64;
        Some(t)
    }

    /// (frames, bytes) of the reports sent.
    pub(crate) fn sent(&self) -> (u64, u64) {
        self.sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_median_and_a_direction_waits_for_its_report() {
        let mut m = LinkMeter::new(0, vec![1, 2], MeterConfig::default());
        // A slow and a fast outlier around 1 MB/s leave the estimate of 1 → 0 at 1 MB/s.
        for secs in [1.048_576, 10.0, 0.01] {
            m.observe(1, 1 << 20, secs);
        }
        assert!((m.rates[0].median().unwrap() - 1e6).abs() < 1.0);
        // Short or untimed frames and strangers give no sample.
        m.observe(2, 1000, 0.5);
        m.observe(2, 1 << 20, 0.0);
        m.observe(7, 1 << 20, 1.0);
        assert_eq!(m.rates[1].median(), None);
        // 0 → 1 is not judged by 1 → 0: unmeasured until peer 1 reports it; the slower
        // direction of the link is known from either.
        assert_eq!(m.rate_to(0), None);
        assert!(
            (m.fastest().unwrap() - 1e6).abs() < 1.0,
            "the budget's scale"
        );
        assert!((m.rate_either_way(0).unwrap() - 1e6).abs() < 1.0);
        m.reported[0] = Some(5e7);
        assert_eq!(m.rate_to(0), Some(5e7));
        assert_eq!(m.fastest(), Some(5e7));
        assert!((m.rate_either_way(0).unwrap() - 1e6).abs() < 1.0);
    }
}
