//! The core's smallest decisions, as pure values and functions (no state machine, no
//! clock), unit-tested on their own; [`super::PeerCore`] asks them.
//!
//! - [`Goodbyes`]: who owes whom the counted goodbye that ends a run without losing frames,
//!   hence whether a lost connection matters and when a peer may exit;
//! - [`route`]: what a received frame is for (the algorithm, the metrics collector, the
//!   membership protocol, nothing), and which frames count as refused.

use std::collections::HashSet;

use murmur_gossip::{FrameKind, Rank};

/// The goodbye bookkeeping of one peer's links. A sender's goodbye carries its frame count;
/// a run ends for this peer once every peer that sends to it said goodbye and every link it
/// sends on was closed by its receiver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Goodbyes {
    /// Peers that owe us a goodbye: in-neighbours, and everyone for peer 0 (the reports).
    expected_in: HashSet<Rank>,
    /// Those that said it.
    finished_in: HashSet<Rank>,
    /// Peers we have a link to: out-neighbours, and peer 0 for the reports.
    destinations: HashSet<Rank>,
    /// Destinations whose receiver closed our link after our goodbye.
    links_done: HashSet<Rank>,
}

impl Goodbyes {
    /// The bookkeeping of a peer that sends to `destinations` and hears from `expected_in`.
    pub(crate) fn new(
        destinations: impl IntoIterator<Item = Rank>,
        expected_in: impl IntoIterator<Item = Rank>,
    ) -> Self {
        Self {
            destinations: destinations.into_iter().collect(),
            expected_in: expected_in.into_iter().collect(),
            ..Self::default()
        }
    }

    /// `from` said goodbye (every frame it sent us has been read).
    pub(crate) fn finished(&mut self, from: Rank) {
        self.finished_in.insert(from);
    }

    /// Whether `from` said goodbye (its frames all read).
    pub(crate) fn heard_from(&self, from: Rank) -> bool {
        self.finished_in.contains(&from)
    }

    /// The receiver `to` closed our link after our goodbye.
    pub(crate) fn link_done(&mut self, to: Rank) {
        self.links_done.insert(to);
    }

    /// A new link to `to` (a restarted peer): it is a destination again, owed a goodbye.
    pub(crate) fn linked(&mut self, to: Rank) {
        self.destinations.insert(to);
        self.links_done.remove(&to);
    }

    /// `peer` (back, or newly admitted) sends to us: it owes us a goodbye again.
    pub(crate) fn expect(&mut self, peer: Rank) {
        self.expected_in.insert(peer);
        self.finished_in.remove(&peer);
    }

    /// `peer`, which welcomed this restarted process, owes a goodbye on the link it opened
    /// to it — one that may have come already (a peer that finished at once says it before
    /// this process has planned its rejoin), so unlike [`Goodbyes::expect`] a goodbye
    /// already heard stands.
    pub(crate) fn owed_by(&mut self, peer: Rank) {
        self.expected_in.insert(peer);
    }

    /// `gone` left: nothing more is owed either way.
    pub(crate) fn forget(&mut self, gone: Rank) {
        self.destinations.remove(&gone);
        self.expected_in.remove(&gone);
    }

    /// `gone` will not send to us (an empty rank of an elastic run, a peer gone before our
    /// rejoin).
    pub(crate) fn not_expected(&mut self, gone: Rank) {
        self.expected_in.remove(&gone);
    }

    /// Whether losing the connection to `peer` means it left: only while something is
    /// still owed on its links, either way. A peer that said goodbye, and whose link we
    /// finished, may close its connections harmlessly.
    pub(crate) fn loss_matters(&self, peer: Rank) -> bool {
        let owes_us = self.expected_in.contains(&peer) && !self.finished_in.contains(&peer);
        let we_owe = self.destinations.contains(&peer) && !self.links_done.contains(&peer);
        owes_us || we_owe
    }

    /// Whether the run is over for this peer's links (every goodbye in, every link done).
    pub(crate) fn settled(&self) -> bool {
        self.destinations.is_subset(&self.links_done)
            && self.expected_in.is_subset(&self.finished_in)
    }

    /// What is still owed: the peers whose goodbye is missing, and the destinations that did
    /// not close our link, each ascending.
    pub(crate) fn outstanding(&self) -> (Vec<Rank>, Vec<Rank>) {
        let mut missing: Vec<Rank> = self
            .expected_in
            .difference(&self.finished_in)
            .copied()
            .collect();
        let mut unacknowledged: Vec<Rank> = self
            .destinations
            .difference(&self.links_done)
            .copied()
            .collect();
        missing.sort_unstable();
        unacknowledged.sort_unstable();
        (missing, unacknowledged)
    }
}

/// Where a received data-plane frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A membership handshake (hello, welcome, admit): the membership protocol.
    Membership,
    /// A frame of a peer that has left the run: dropped, not counted.
    Departed,
    /// The algorithm's state machine.
    Algorithm,
    /// An epoch report, to the collector of the record's keeper.
    Report,
    /// A departure notice.
    Leave,
    /// Lines of the run's record, for this peer's copy of it (passed on when new), from any
    /// peer: a line is the keeper's, whoever forwards it.
    Record,
    /// Nothing here takes it: dropped and counted as refused (an unexpected kind).
    Refuse,
}

/// Where a frame of kind `kind` from a peer goes; `departed`: whether that peer has left the
/// run. A report goes to the shell on any peer: the record's keeper can change, and a peer
/// may be sent reports just before it learns that it keeps the record now.
pub(crate) fn route(kind: FrameKind, departed: bool) -> Route {
    if kind.is_membership_handshake() {
        return Route::Membership;
    }
    if kind == FrameKind::Record {
        return Route::Record;
    }
    if departed {
        return Route::Departed;
    }
    match kind {
        k if k.is_algorithm() => Route::Algorithm,
        FrameKind::Report => Route::Report,
        FrameKind::Leave => Route::Leave,
        _ => Route::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_matters_only_while_a_goodbye_is_owed() {
        // Peer 1 sends to 2 and hears from 0.
        let mut g = Goodbyes::new([2], [0]);
        assert!(g.loss_matters(0) && g.loss_matters(2) && !g.loss_matters(3));
        assert!(!g.settled());
        g.finished(0);
        assert!(!g.loss_matters(0), "0 said goodbye");
        g.link_done(2);
        assert!(!g.loss_matters(2), "2 read everything we sent");
        assert!(g.settled());
        // 2 restarts: a new link, a goodbye owed again both ways.
        g.linked(2);
        g.expect(2);
        assert!(g.loss_matters(2));
        assert_eq!(g.outstanding(), (vec![2], vec![2]));
        g.forget(2);
        assert!(!g.loss_matters(2) && g.settled());
        g.expect(4);
        g.not_expected(4);
        assert!(g.settled());
    }

    #[test]
    fn a_goodbye_heard_before_a_restarted_process_plans_its_rejoin_still_counts() {
        // A restarted peer 0 that only collects: the others welcome it, send their reports
        // and say goodbye at once, some before it has read their welcomes.
        let mut g = Goodbyes::new([], []);
        g.finished(3);
        g.owed_by(3);
        g.owed_by(5);
        assert_eq!(g.outstanding(), (vec![5], vec![]));
        g.finished(5);
        assert!(g.settled(), "3's early goodbye counts");
        // `expect` is for a peer that comes back: its earlier goodbye is not its last.
        g.expect(3);
        assert_eq!(g.outstanding(), (vec![3], vec![]));
    }

    #[test]
    fn frames_go_where_their_kind_says_and_the_rest_is_refused() {
        assert_eq!(route(FrameKind::Gossip, false), Route::Algorithm);
        assert_eq!(route(FrameKind::Gossip, true), Route::Departed);
        assert_eq!(route(FrameKind::Report, false), Route::Report);
        assert_eq!(route(FrameKind::Report, true), Route::Departed);
        assert_eq!(route(FrameKind::Leave, false), Route::Leave);
        assert_eq!(route(FrameKind::Leave, true), Route::Departed);
        assert_eq!(route(FrameKind::Hello, true), Route::Membership);
        assert_eq!(route(FrameKind::Record, true), Route::Record);
        assert_eq!(route(FrameKind::Bye, false), Route::Refuse);
    }
}
